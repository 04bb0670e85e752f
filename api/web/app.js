// gridtune's page: a form that asks POST /v1/recommend, the ranked answer as a table with a time and a
// memory bar per layout, the launch command, the rejection reasons and a scaling view (the best layout
// at several GPU counts). Plain JavaScript, no build step, nothing loaded from another origin; every
// value from the server is written with textContent or as an SVG attribute, never parsed as HTML.
"use strict";

const FIELDS = ["model", "seq_length", "model_json", "cluster", "gpu", "gpus", "global_batch_size",
  "stack", "dtype", "pins", "top_k"];
const SVG = "http://www.w3.org/2000/svg";
// where a step's time goes; the segments add up to the predicted step (overlapped comm is not in it)
const TIME_PARTS = [
  ["compute", "compute", (b) => b.compute_s],
  ["comm", "exposed tensor/data comm", (b) => Math.max(b.exposed_comm_s - b.pp_p2p_s, 0)],
  ["p2p", "pipeline p2p", (b) => b.pp_p2p_s],
  ["bubble", "pipeline bubble", (b) => b.pp_bubble_s],
  ["optimizer", "optimizer", (b) => b.optimizer_s || 0],
  ["host", "host wait", (b) => b.host_wait_s || 0],
];
const MEMORY_PARTS = [
  ["params", "parameters", "params_gib"], ["grads", "gradients", "grads_gib"],
  ["optim", "optimizer states", "optimizer_gib"], ["acts", "activations", "activations_gib"],
  ["buffers", "comm buffers", "comm_buffers_gib"], ["overhead", "overhead", "overhead_gib"],
];

const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

const fmt = {
  step: (s) => s.toFixed(3),
  int: (n) => Math.round(n).toLocaleString("en-US"),
  pct: (x) => (100 * x).toFixed(1) + "%",
  gib: (x) => x.toFixed(1),
};

// ------------------------------------------------------------------------------------------------
// The question: form <-> URL <-> request body
// ------------------------------------------------------------------------------------------------

function formValues() {
  const form = $("#question");
  const out = {};
  for (const name of FIELDS) {
    const value = (form.elements[name].value || "").trim();
    if (value !== "") out[name] = value;
  }
  if (out.top_k === "10") delete out.top_k;
  return out;
}

function fillForm(params) {
  const form = $("#question");
  for (const name of FIELDS) {
    if (!params.has(name)) continue;
    const input = form.elements[name];
    const value = params.get(name);
    if (input.tagName === "SELECT" && ![...input.options].some((o) => o.value === value)) {
      input.append(el("option", { value, text: value })); // let the server say what is wrong with it
    }
    input.value = value;
    if (name === "model_json") $("#model-json-box").open = true;
  }
}

class FieldError extends Error {
  constructor(field, message) { super(message); this.field = field; }
}

function intField(values, name, label) {
  if (values[name] === undefined) return undefined;
  const n = Number(values[name]);
  if (!Number.isInteger(n)) throw new FieldError(name, `${label} must be a whole number, got ${values[name]}`);
  return n;
}

function parseValue(key, text) {
  if (key === "placement") return text.split("/");
  if (/^-?\d+$/.test(text)) return Number(text);
  if (text === "true" || text === "false") return text === "true";
  return text;
}

// "tp=4,8 pp=4 recompute=none" -> {"tp": [4, 8], "pp": [4], "recompute": ["none"]}
function parsePins(text) {
  const search = {};
  for (const part of text.split(/[\s;]+/).filter(Boolean)) {
    const eq = part.indexOf("=");
    if (eq <= 0) throw new FieldError("pins", `pins: expected FIELD=V1,V2 (e.g. tp=4,8), got "${part}"`);
    const key = part.slice(0, eq);
    const values = part.slice(eq + 1).split(/[,|]/).filter(Boolean).map((v) => parseValue(key, v));
    if (!values.length) throw new FieldError("pins", `pins: ${key} has no value`);
    if (key === "max_micro_batch_size" || key === "time_budget_s") search[key] = values[0];
    else search[key] = values;
  }
  return search;
}

function requestBody(values, numGpus) {
  let model;
  if (values.model_json) {
    try {
      model = JSON.parse(values.model_json);
    } catch (err) {
      throw new FieldError("model_json", `not valid JSON: ${err.message}`);
    }
    if (typeof model !== "object" || model === null || Array.isArray(model)) {
      throw new FieldError("model_json", "the model must be a JSON object");
    }
  } else if (values.model) {
    model = { preset: values.model };
  } else {
    throw new FieldError("model", "give a model preset (or the model as JSON)");
  }
  const seq = intField(values, "seq_length", "sequence length");
  if (seq !== undefined) model = { ...model, seq_length: seq };
  const cluster = {};
  if (values.cluster) cluster.preset = values.cluster;
  if (values.gpu) cluster.gpu = values.gpu;
  if (!values.cluster && !values.gpu) throw new FieldError("cluster", "give a cluster preset or a GPU type");
  const gpus = numGpus !== undefined ? numGpus : intField(values, "gpus", "GPUs");
  if (gpus !== undefined) cluster.num_gpus = gpus;
  const gbs = intField(values, "global_batch_size", "global batch");
  if (gbs === undefined) throw new FieldError("global_batch_size", "give the global batch size");
  const training = { global_batch_size: gbs, dtype: values.dtype || "bf16" };
  if (values.stack) training.stack = values.stack;
  const body = { model, cluster, training };
  const topK = intField(values, "top_k", "top");
  if (topK !== undefined) body.top_k = topK;
  if (values.pins) body.search = parsePins(values.pins);
  return body;
}

// which form field a 422's location points at
function fieldOf(loc) {
  const path = loc.filter((p) => typeof p === "string" && p !== "body");
  const [head, second] = path;
  if (head === "model") {
    if (second === "seq_length") return "seq_length";
    return $("#question").elements.model_json.value.trim() ? "model_json" : "model";
  }
  if (head === "cluster") {
    if (second === "num_gpus") return "gpus";
    if (second === "gpu") return "gpu";
    return $("#question").elements.cluster.value.trim() ? "cluster" : "gpu";
  }
  if (head === "training") {
    if (["global_batch_size", "stack", "dtype"].includes(second)) return second;
    return "global_batch_size";
  }
  if (head === "search") return "pins";
  if (head === "top_k") return "top_k";
  return "body";
}

function clearErrors() {
  for (const node of document.querySelectorAll(".error")) node.textContent = "";
  for (const node of document.querySelectorAll(".invalid")) node.classList.remove("invalid");
}

function showError(field, message) {
  const slot = $(`.error[data-for="${field}"]`) || $('.error[data-for="body"]');
  slot.textContent = slot.textContent ? `${slot.textContent}; ${message}` : message;
  const input = $("#question").elements[field];
  if (input) input.classList.add("invalid");
}

// ------------------------------------------------------------------------------------------------
// Talking to the service
// ------------------------------------------------------------------------------------------------

async function recommend(body) {
  const response = await fetch("/v1/recommend", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = null;
  }
  return { status: response.status, data };
}

function errorItems(status, data) {
  if (data && Array.isArray(data.detail)) return data.detail.map((d) => [fieldOf(d.loc || []), d.msg]);
  const text = data && typeof data.detail === "string" ? data.detail : `the service answered ${status}`;
  return [["body", text]];
}

// ------------------------------------------------------------------------------------------------
// The answer
// ------------------------------------------------------------------------------------------------

function megatronWords(plan) {
  const parts = [`TP ${plan.G_intra_r}`, `PP ${plan.G_inter}`, `DP ${plan.G_data}`];
  if ((plan.G_cp || 1) > 1) parts.push(`CP ${plan.G_cp}`);
  if ((plan.G_ep || 1) > 1) parts.push(`EP ${plan.G_ep}`);
  if (plan.G_etp !== undefined && plan.G_etp !== null && plan.G_etp !== plan.G_intra_r) parts.push(`ETP ${plan.G_etp}`);
  if (plan.virtual_stages > 1) parts.push(`VPP ${plan.virtual_stages}`);
  parts.push(`MBS ${plan.micro_batch_size}`);
  if (plan.sequence_parallel) parts.push("SP");
  // AxoNN's extra tensor axes have no Megatron name
  if (plan.G_intra_c > 1) parts.push(`col ${plan.G_intra_c}`);
  if (plan.G_intra_d > 1) parts.push(`depth ${plan.G_intra_d}`);
  return parts.join(" · ");
}

function gridWords(plan) {
  let text = `${plan.G_data} x ${plan.G_inter} x ${plan.G_intra_d} x ${plan.G_intra_r} x ${plan.G_intra_c}`;
  if ((plan.G_cp || 1) > 1) text += `, G_cp ${plan.G_cp}`;
  if ((plan.G_ep || 1) > 1) text += `, G_ep ${plan.G_ep}`;
  return text;
}

function timeBar(breakdown, step, width, scale) {
  const box = svg("svg", { width, height: 18, class: "bar", role: "img" });
  const parts = [];
  let x = 0;
  for (const [cls, label, get] of TIME_PARTS) {
    const seconds = get(breakdown);
    if (!(seconds > 0)) continue;
    const w = seconds * scale;
    const rect = svg("rect", { x, y: 2, width: Math.max(w, 0.5), height: 14, class: `t-${cls}` });
    rect.append(svg("title", {}, `${label}: ${seconds.toFixed(3)} s`));
    box.append(rect);
    parts.push(`${label} ${seconds.toFixed(3)} s`);
    x += w;
  }
  box.setAttribute("aria-label", `step ${step.toFixed(3)} s: ${parts.join(", ")}`);
  const hidden = breakdown.hidden_comm_s || 0;
  box.append(svg("title", {}, `step ${step.toFixed(3)} s = ${parts.join(" + ")}` +
    (hidden > 0 ? ` (${hidden.toFixed(3)} s more communication runs behind compute)` : "")));
  return box;
}

function memoryBar(memory, width, scale) {
  const box = svg("svg", { width, height: 18, class: "bar", role: "img" });
  let x = 0;
  const parts = [];
  for (const [cls, label, key] of MEMORY_PARTS) {
    const gib = memory[key] || 0;
    if (!(gib > 0)) continue;
    const rect = svg("rect", { x, y: 2, width: Math.max(gib * scale, 0.5), height: 14, class: `m-${cls}` });
    rect.append(svg("title", {}, `${label}: ${gib.toFixed(2)} GiB`));
    box.append(rect);
    parts.push(`${label} ${gib.toFixed(1)}`);
    x += gib * scale;
  }
  const cap = memory.capacity_gib;
  if (cap) {
    const cx = cap * scale;
    box.append(svg("line", { x1: cx, x2: cx, y1: 0, y2: 18, class: "capacity" }));
  }
  box.setAttribute("aria-label", `${memory.per_gpu_gib.toFixed(1)} of ${cap} GiB: ${parts.join(", ")}`);
  return box;
}

function legend(target, parts, prefix, extra) {
  target.replaceChildren();
  for (const [cls, label] of parts) {
    const swatch = svg("svg", { width: 12, height: 12 });
    swatch.append(svg("rect", { width: 12, height: 12, class: `${prefix}-${cls}` }));
    target.append(el("span", { class: "key" }, swatch, ` ${label}`));
  }
  if (extra) target.append(el("span", { class: "key" }, extra));
}

function renderTable(data) {
  const body = $("#ranked tbody");
  body.replaceChildren();
  const cands = data.candidates;
  const maxStep = Math.max(...cands.map((c) => c.prediction.iteration_time_s));
  const maxMem = Math.max(...cands.map((c) => Math.max(c.prediction.memory.per_gpu_gib,
    c.prediction.memory.capacity_gib || 0)));
  const barWidth = 130;
  const timeLegend = el("div", { class: "legend" });
  legend(timeLegend, TIME_PARTS, "t", "time: the segments add up to the predicted step");
  const memLegend = el("div", { class: "legend" });
  legend(memLegend, MEMORY_PARTS, "m", "memory: the red line is the GPU's capacity");
  $("#time-legend").replaceChildren(timeLegend, memLegend);
  for (const c of cands) {
    const p = c.prediction;
    const plan = c.plan;
    const step = p.iteration_time_s;
    const merged = c.equivalent_placements && c.equivalent_placements.length
      ? ` (+${c.equivalent_placements.length} equivalent placements)` : "";
    const zero = [plan.zero_stage, ...(c.equivalent_zero_stages || [])].join(" = ");
    const sched = plan.G_inter > 1 ? plan.schedule.replace("interleaved-1f1b", "interleaved") : "-";
    const row = el("tr", { "data-rank": String(c.rank) },
      el("td", { text: String(c.rank) }),
      el("td", { class: "plan", text: megatronWords(plan) }),
      el("td", { class: "grid", text: gridWords(plan) + merged, title: (plan.placement || []).join("/") }),
      el("td", { text: sched }),
      el("td", { text: plan.recompute }),
      el("td", { class: "zero", text: zero,
        title: zero.includes("=") ? "these ZeRO stages predict the same time and memory" : "" }),
      el("td", { class: "num step", "data-value": String(step), text: fmt.step(step) }),
      el("td", { class: "num", text: fmt.int(p.tokens_per_s) }),
      el("td", { class: "num", text: fmt.pct(p.mfu) }),
      el("td", {}, timeBar(p.breakdown, step, barWidth, barWidth / maxStep)),
      el("td", { class: "mem" }, el("span", { class: p.memory.fits ? "gib" : "gib bad",
        text: `${fmt.gib(p.memory.per_gpu_gib)} / ${p.memory.capacity_gib} GiB ` }),
      memoryBar(p.memory, barWidth, (barWidth - 3) / maxMem)),
    );
    body.append(row);
  }
}

function renderSummary(data) {
  const best = data.best;
  const p = best.prediction;
  $("#summary").replaceChildren(
    el("strong", { text: megatronWords(best.plan) }),
    ` (grid ${gridWords(best.plan)}): ${fmt.step(p.iteration_time_s)} s per step, ` +
    `${fmt.int(p.tokens_per_s)} tokens/s, MFU ${fmt.pct(p.mfu)}, ` +
    `${fmt.gib(p.memory.per_gpu_gib)} of ${p.memory.capacity_gib} GiB per GPU. ` +
    `${fmt.int(data.num_valid)} valid of ${fmt.int(data.num_evaluated)} layouts checked in ` +
    `${(data.search_time_s || 0).toFixed(2)} s` +
    (data.num_proved_slower ? `; ${fmt.int(data.num_proved_slower)} more proved unable to win by lower bounds` : "") +
    (data.complete ? "." : `; PARTIAL: ${fmt.int(data.num_not_evaluated)} layouts not scored in the time budget.`),
  );
  $("#explanation").textContent = data.explanation || "";
}

async function copyText(text, button) {
  try {
    if (navigator.clipboard && window.isSecureContext) await navigator.clipboard.writeText(text);
    else throw new Error("no clipboard");
    button.textContent = "copied";
  } catch (err) {
    const area = el("textarea", { class: "offscreen" });
    area.value = text;
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    button.textContent = ok ? "copied" : "select and copy by hand";
  }
  setTimeout(() => { button.textContent = "copy"; }, 1500);
}

function renderLaunch(data) {
  const box = $("#launch");
  box.replaceChildren();
  const launch = data.launch || {};
  for (const [kind, item] of Object.entries(launch)) {
    const pre = el("pre", { class: "launch", "data-kind": kind, text: item.text });
    const button = el("button", { type: "button", class: "copy", "data-kind": kind, text: "copy" });
    button.addEventListener("click", () => copyText(item.text, button));
    const notes = el("ul", { class: "notes" });
    for (const n of item.notes || []) notes.append(el("li", { text: n }));
    box.append(el("div", { class: "launch-item" }, el("h3", { text: kind }, " ", button), pre, notes));
  }
  if (!Object.keys(launch).length) box.append(el("p", { text: "no launch command (no layout fits)" }));
}

function renderPruned(data) {
  const body = $("#pruned tbody");
  body.replaceChildren();
  const rows = Object.entries(data.pruned || {}).sort((a, b) => b[1] - a[1]);
  for (const [reason, count] of rows) {
    const examples = (data.pruned_examples || {})[reason] || [];
    body.append(el("tr", {}, el("td", { class: "num", text: fmt.int(count) }), el("td", { text: reason }),
      el("td", { class: "examples", text: [...new Set(examples)].slice(0, 3).join("; ") })));
  }
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: "3", text: "none" })));
}

// ------------------------------------------------------------------------------------------------
// Scaling: the best layout at GPU counts around the asked one, one search each
// ------------------------------------------------------------------------------------------------

function scalingCounts(gpus) {
  const counts = [gpus / 4, gpus / 2, gpus, gpus * 2, gpus * 4].filter((g) => Number.isInteger(g) && g >= 1);
  return [...new Set(counts)];
}

function drawScaling(points) {
  const ok = points.filter((p) => p.best);
  const box = $("#scaling");
  box.replaceChildren();
  if (!ok.length) {
    box.append(el("p", { text: "no GPU count has a layout that fits" }));
    return;
  }
  const W = 620, H = 260, L = 64, R = 40, T = 34, B = 40;
  const chart = svg("svg", { width: W, height: H, id: "scaling-chart", role: "img",
    "aria-label": "predicted tokens per second of the best layout per GPU count" });
  const xs = ok.map((p) => Math.log2(p.gpus));
  const ys = ok.map((p) => p.best.prediction.tokens_per_s);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), yMax = Math.max(...ys) * 1.1;
  const X = (v) => L + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * (W - L - R);
  const Y = (v) => T + (1 - v / yMax) * (H - T - B);
  chart.append(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  chart.append(svg("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    chart.append(svg("text", { x: L - 6, y: Y(v) + 4, class: "tick", "text-anchor": "end" },
      v >= 1e6 ? `${(v / 1e6).toFixed(1)}M` : `${Math.round(v / 1e3)}k`));
  }
  chart.append(svg("text", { x: 8, y: 14, class: "tick" }, "tokens/s (best layout)"));
  chart.append(svg("text", { x: (W + L) / 2, y: H - 6, class: "tick", "text-anchor": "middle" }, "GPUs"));
  const path = ok.map((p, i) => `${i ? "L" : "M"}${X(xs[i]).toFixed(1)},${Y(ys[i]).toFixed(1)}`).join(" ");
  chart.append(svg("path", { d: path, class: "line" }));
  ok.forEach((p, i) => {
    const dot = svg("circle", { cx: X(xs[i]), cy: Y(ys[i]), r: 4, class: "dot" });
    dot.append(svg("title", {}, `${p.gpus} GPUs: ${fmt.int(ys[i])} tokens/s, ${megatronWords(p.best.plan)}`));
    chart.append(dot);
    chart.append(svg("text", { x: X(xs[i]), y: H - B + 16, class: "tick", "text-anchor": "middle" },
      fmt.int(p.gpus)));
    chart.append(svg("text", { x: X(xs[i]), y: Y(ys[i]) - 8, class: "tick", "text-anchor": "middle" },
      `MFU ${fmt.pct(p.best.prediction.mfu)}`));
  });
  box.append(chart);
  const table = el("table", { id: "scaling-table" }, el("thead", {}, el("tr", {},
    ...["GPUs", "step (s)", "tokens/s", "tokens/s per GPU", "MFU", "GiB/GPU", "best layout"].map(
      (h) => el("th", { text: h })))));
  const tbody = el("tbody");
  for (const p of points) {
    if (!p.best) {
      tbody.append(el("tr", {}, el("td", { class: "num", text: fmt.int(p.gpus) }),
        el("td", { colspan: "6", text: p.error || "nothing fits" })));
      continue;
    }
    const pr = p.best.prediction;
    tbody.append(el("tr", {}, el("td", { class: "num", text: fmt.int(p.gpus) }),
      el("td", { class: "num", text: fmt.step(pr.iteration_time_s) }),
      el("td", { class: "num", text: fmt.int(pr.tokens_per_s) }),
      el("td", { class: "num", text: fmt.int(pr.tokens_per_s / p.gpus) }),
      el("td", { class: "num", text: fmt.pct(pr.mfu) }),
      el("td", { class: "num", text: fmt.gib(pr.memory.per_gpu_gib) }),
      el("td", { text: `${megatronWords(p.best.plan)} (grid ${gridWords(p.best.plan)})` })));
  }
  table.append(tbody);
  box.append(table);
}

async function runScaling(values, gpus, answer, token) {
  const status = $("#scaling-status");
  const counts = scalingCounts(gpus);
  const points = [];
  for (const g of counts) {
    if (token !== currentRun) return;
    status.textContent = `searching ${g} GPUs ...`;
    if (g === gpus) {
      points.push({ gpus: g, best: answer.best });
      continue;
    }
    const body = { ...requestBody(values, g), top_k: 1 };
    const { status: code, data } = await recommend(body);
    points.push({ gpus: g, best: code === 200 ? data.best : null,
      error: code === 200 ? null : errorItems(code, data).map((e) => e[1]).join("; ") });
  }
  if (token !== currentRun) return;
  status.textContent = `one search per GPU count (${counts.join(", ")}), same model, batch and stack`;
  drawScaling(points);
}

// ------------------------------------------------------------------------------------------------
// Wiring
// ------------------------------------------------------------------------------------------------

let currentRun = 0;

async function ask(event) {
  if (event) event.preventDefault();
  delete document.body.dataset.done;
  const token = ++currentRun;
  try {
    await answer(token);
  } finally {
    if (token === currentRun) document.body.dataset.done = "1";
  }
}

async function answer(token) {
  clearErrors();
  const values = formValues();
  history.replaceState(null, "", "/?" + new URLSearchParams(values).toString());
  let body;
  try {
    body = requestBody(values);
  } catch (err) {
    if (err instanceof FieldError) {
      showError(err.field, err.message);
      return;
    }
    throw err;
  }
  const status = $("#status");
  const button = $("#submit");
  status.textContent = "searching ...";
  button.disabled = true;
  let reply;
  try {
    reply = await recommend(body);
  } catch (err) {
    status.textContent = "";
    showError("body", `the service did not answer: ${err.message}`);
    return;
  } finally {
    button.disabled = false;
  }
  if (token !== currentRun) return;
  const { status: code, data } = reply;
  if (code !== 200) {
    status.textContent = "";
    for (const [field, msg] of errorItems(code, data)) showError(field, msg);
    $("#results").hidden = true;
    return;
  }
  $("#results").hidden = false;
  if (!data.best) {
    status.textContent = "no layout fits; the rejection reasons are below";
    $("#summary").textContent = "No layout fits this question.";
    $("#explanation").textContent = data.explanation || "";
    // pins that leave nothing: the service says which rule rejects each pinned value
    if (values.pins && data.explanation) showError("pins", data.explanation);
    $("#ranked tbody").replaceChildren();
    renderLaunch(data);
    renderPruned(data);
    $("#scaling").replaceChildren();
    $("#scaling-status").textContent = "";
    return;
  }
  status.textContent = "";
  renderSummary(data);
  renderTable(data);
  renderLaunch(data);
  renderPruned(data);
  $("#scaling").replaceChildren();
  const gpus = body.cluster.num_gpus;
  if (gpus) await runScaling(values, gpus, data, token);
  else $("#scaling-status").textContent = "give the GPU count to see the scaling view";
}

async function loadPresets() {
  const response = await fetch("/v1/presets");
  if (!response.ok) return;
  const data = await response.json();
  const fill = (id, names) => {
    const list = document.getElementById(id);
    list.replaceChildren(...names.map((n) => el("option", { value: n })));
  };
  fill("model-list", Object.keys(data.models || {}));
  fill("cluster-list", Object.keys(data.clusters || {}));
  fill("gpu-list", Object.keys(data.gpus || {}));
  const stack = $("#question").elements.stack;
  const present = new Set([...stack.options].map((o) => o.value));
  for (const name of Object.keys(data.stacks || {})) {
    if (!present.has(name)) stack.append(el("option", { value: name, text: name }));
  }
}

async function start() {
  $("#question").addEventListener("submit", ask);
  try {
    await loadPresets();
  } catch (err) {
    showError("body", `could not load the preset names: ${err.message}`);
  }
  const params = new URLSearchParams(location.search);
  fillForm(params);
  if (params.has("global_batch_size") && (params.has("model") || params.has("model_json"))) await ask();
  else document.body.dataset.done = "1";
}

document.addEventListener("DOMContentLoaded", start);
