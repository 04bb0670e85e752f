"""Published training runs as model inputs: read the validation CSVs, map each row to specs.

Two formats (see ../shared/validation/README.md):
- vTrain's ground truth (Megatron-DeepSpeed on an A100 cluster: full recomputation, 1F1B, fp16,
  no gradient bucketing, i.e. the data-parallel all-reduce runs after backward);
- the tidy `published_dev.csv` format (one run per row, source, hardware and metric columns).

Each row becomes a `Case`: specs, the measured iteration time (converted from the source's
TFLOP/s with the source's own FLOP formula when that is what it published), and a ranking group
(same model, cluster, GPU count, batch and framework). Unknown layout fields are not guessed row
by row: where a source leaves them open (micro-batch, or how t*p splits), the case carries every
candidate plan and is scored with the one the model ranks best, which is what a tuned run does.
Rows without a batch size or a time metric are reported as unusable, with the reason.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from perfmodels import presets
from perfmodels.specs import Cluster, Model, Plan, Training

MEGATRON_ORDER = ("col", "row", "depth", "data", "inter")
"""Megatron-LM and DeepSpeed rank order: tensor innermost, then data, pipeline outermost."""


@dataclass(frozen=True, kw_only=True)
class Case:
    case_id: str
    group: str
    model: Model
    cluster: Cluster
    training: Training
    plans: tuple[Plan, ...]
    measured_time_s: float | None
    expect_oom: bool = False
    source: str = ""
    notes: str = ""


@dataclass(frozen=True, kw_only=True)
class Skipped:
    case_id: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Loaded:
    cases: list[Case] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def megatron_flops(*, batch: int, seq: int, layers: int, hidden: int, vocab: int, ffn: int | None = None,
                   recompute_full: bool, kv_hidden: int | None = None, gated: bool = False) -> float:
    """FLOPs per iteration as Megatron-LM reports them (Narayanan et al. 2021, eq. 3).

    72 B s L h^2 (1 + s/(6h) + V/(12 L h)) for forward+backward with ffn = 4h; full recomputation
    adds one forward of the transformer layers (96 B s L h^2 (1 + s/(6h) + V/(16 L h))). Grouped
    query attention shrinks the key/value projections to `kv_hidden`; a gated MLP has three matrices.
    """
    f = ffn or 4 * hidden
    kv = kv_hidden or hidden
    attn_proj = 2 * hidden * hidden + 2 * hidden * kv
    mlp = (3 if gated else 2) * hidden * f
    per_layer_fwd = 2 * batch * seq * (attn_proj + mlp) + 4 * batch * seq * seq * hidden
    head_fwd = 2 * batch * seq * hidden * vocab
    passes = 4 if recompute_full else 3
    return float(passes * layers * per_layer_fwd + 3 * head_fwd)


# --------------------------------------------------------------------------------------------
# vTrain ground truth
# --------------------------------------------------------------------------------------------


def _load_rows(path: Path, make_case: Callable[[str, dict[str, str]], Case]) -> Loaded:
    """One Case per CSV row; a row that cannot be used is skipped with the reason, never raised."""
    out = Loaded()
    with open(path, newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            cid = f"{path.name}:{i + 2}"
            try:
                out.cases.append(make_case(cid, row))
            except KeyError as exc:
                out.skipped.append(Skipped(case_id=cid, reason=f"column {exc} missing"))
            except (TypeError, ValueError) as exc:
                out.skipped.append(Skipped(case_id=cid, reason=str(exc)))
    return out


def load_vtrain(path: Path) -> Loaded:
    return _load_rows(path, _vtrain_case)


def _vtrain_case(cid: str, row: dict[str, str]) -> Case:
    gpus, h, L, gb = (int(row[k]) for k in ("# GPUs", "hidden size", "# layers", "global batch"))
    size = (row.get("Parameters (billion)") or "").strip()
    # the multi-node file names its models by size; the single-node one (ground_truth_single)
    # does not, so its groups are one shape and batch on one GPU count
    group = f"vtrain {size}B on {gpus} GPUs" if size else f"vtrain h{h} L{L} gb{gb} on {gpus} GPUs"
    model = Model(name=f"gpt-{size}b" if size else f"gpt-h{h}-L{L}", num_layers=L, hidden_size=h,
                  num_attention_heads=int(row["attention heads"]), seq_length=int(row["sequence length"]),
                  vocab_size=51200)
    cluster = presets.cluster("vtrain-a100", num_gpus=gpus)
    training = Training(global_batch_size=gb, dtype="fp16",
                        overlap_grad_reduce=False, flash_attention=False, p2p_scatter_gather=True)
    plan = Plan(G_data=int(row["data parallelism"]), G_inter=int(row["pipeline parallelism"]),
                G_intra_r=int(row["tensor parallelism"]), micro_batch_size=int(row["micro batch"]),
                schedule="1f1b", recompute="full", placement=MEGATRON_ORDER)
    return Case(case_id=cid, group=group, model=model, cluster=cluster, training=training, plans=(plan,),
                measured_time_s=float(row["iteration time (ms)"]) / 1000.0, source="vTrain")


# --------------------------------------------------------------------------------------------
# published_dev.csv format
# --------------------------------------------------------------------------------------------

_NVLINK_PER_DIRECTION = {"V100": 150.0, "A100": 300.0, "H100": 450.0, "H200": 450.0, "GH200": 450.0, "H20": 450.0,
                         "B200": 900.0, "MI250X": 100.0, "MI300X": 448.0, "MI210": 150.0, "L40S": 32.0}


def _gpu_preset(text: str) -> str:
    t = text.upper().replace(" ", "")
    if "H20" in t and not re.search(r"H200|H100", t):
        return "H20"
    for key, preset in (("GH200", "GH200"), ("L40S", "L40S"), ("MI210", "MI210"), ("H200", "H200"),
                        ("B200", "B200"), ("MI300", "MI300X"), ("MI250", "MI250X-GCD")):
        if key in t:
            return preset
    if "H100" in t or "H800" in t:  # H800: an H100 with NVLink cut to 400 GB/s
        return "H100-PCIe" if "PCIE" in t else "H100-SXM"
    if "A100" in t or "A800" in t:  # A800: an A100 with NVLink cut to 400 GB/s
        return "A100-40GB" if "40GB" in t or "40G" in t else "A100-80GB"
    if "V100" in t:
        return "V100-16GB" if "16GB" in t or "16G" in t else "V100-32GB"
    raise ValueError(f"gpu_type {text!r} is not a known GPU")


def _family(preset: str) -> str:
    for fam in ("GH200", "H200", "H100", "H20", "B200", "MI300X", "MI250X", "MI210", "L40S", "A100", "V100"):
        if preset.upper().startswith(fam):
            return fam
    return "A100"


_RATE = r"(\d+(?:\.\d+)?)\s*([GT])(b|B)(?:its?|ytes?)?(?:ps|/s)"


def _inter_per_gpu_GBps(text: str, gpus_per_node: int, family: str) -> float:
    """Network GB/s per GPU from e.g. '8x 200 Gb/s HDR InfiniBand per node', '4x 25 GB/s Slingshot'
    or '100 Gb/s'. Lower-case b is bits, upper-case B bytes; a count 'Nx' multiplies."""
    t = text or ""
    rate = re.search(_RATE, t)
    if not rate:
        # typical fabric of the era when the source does not say
        return {"V100": 12.5 / 8, "A100": 25.0, "H100": 50.0, "H200": 50.0, "B200": 50.0}.get(family, 25.0)
    value, scale, unit = float(rate.group(1)), rate.group(2), rate.group(3)
    many = re.search(r"(\d+)\s*[x\u00d7]", t[: rate.start()])
    count = int(many.group(1)) if many else 1
    gbytes = value * (1000.0 if scale == "T" else 1.0) / (8.0 if unit == "b" else 1.0)
    return count * gbytes / gpus_per_node


def _intra_per_gpu_GBps(text: str, family: str) -> float:
    """NVLink of the GPU's generation, unless the source says the GPUs only share PCIe."""
    t = (text or "").lower()
    if "pcie" in t and "nvlink" not in t and "nvswitch" not in t:
        return 64.0 if "gen5" in t or family in ("H100", "H200", "B200") else 32.0
    return _NVLINK_PER_DIRECTION.get(family, 300.0)


def _int(value: str) -> int | None:
    value = (value or "").strip()
    if not value:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


_LLAMA_STYLE = ("llama", "mistral", "qwen", "gemma", "deepseek", "internlm", "baichuan", "yi-")


def _block_style(row: dict[str, str], heads: int) -> tuple[bool, int]:
    """(gated MLP, query groups): the row's own columns when it has them, else the model family's
    convention (Llama-style blocks: SwiGLU; Llama 2 70B, Llama 3 and Mistral: 8 key/value groups)."""
    name = (row.get("model_name") or "").lower()
    gated_text = (row.get("gated_mlp") or "").strip().lower()
    gated = gated_text == "true" if gated_text in ("true", "false") else any(k in name for k in _LLAMA_STYLE)
    groups = _int(row.get("num_query_groups", "")) or _int(row.get("num_kv_heads", ""))
    if groups is None:
        eight = re.search(r"llama[\s-]*3|mistral|llama[\s-]*2[\s-]*70b", name)
        groups = 8 if eight and heads % 8 == 0 else heads
    return gated, groups


def _framework(source: str) -> str:
    s = source.lower()
    if "oneflow" in s and "oneflow-gpt" in s:
        return "oneflow"
    if "deepspeed" in s or "zero-3" in s:
        return "deepspeed"
    return "megatron"


def load_published(path: Path) -> Loaded:
    return _load_rows(path, _published_case)


def _published_case(cid: str, row: dict[str, str]) -> Case:
    metric = (row.get("metric_name") or "").strip()
    value_text = (row.get("metric_value") or "").strip()
    expect_oom = "oom" in metric.lower() or value_text.upper() == "OOM"
    L, h, a = _int(row["num_layers"]), _int(row["hidden_size"]), _int(row["num_heads"])
    s = _int(row["seq_len"])
    if not all((L, h, a, s)):
        raise ValueError("model dimensions missing")
    vocab = _int(row.get("vocab_size", "")) or 51200
    gated, groups = _block_style(row, a)
    ffn = _int(row.get("ffn_hidden_size", "")) or (-(-8 * h // 3 // 256) * 256 if gated else 4 * h)
    gb = _int(row.get("global_batch_size", ""))
    G = _int(row.get("num_gpus", ""))
    if not gb or not G:
        raise ValueError("global batch size or GPU count not stated")
    gpu_name = _gpu_preset(row.get("gpu_type", ""))
    family = _family(gpu_name)
    gpn = _int(row.get("gpus_per_node", "")) or (16 if "DGX-2" in row.get("gpu_type", "") else 8)
    gpn = min(gpn, max(G, 1)) if gpn > G else gpn
    intra = _intra_per_gpu_GBps(row.get("intra_node_interconnect", ""), family)
    if re.search(r"[AH]800", row.get("gpu_type", "").upper()):
        intra = min(intra, 200.0)  # export parts: 400 GB/s NVLink in all, 200 per direction
    inter = _inter_per_gpu_GBps(row.get("inter_node_interconnect", ""), gpn, family)
    cluster = Cluster(name=f"{family}-published", num_gpus=G, gpus_per_node=gpn, gpu=presets.gpu(gpu_name),
                      intra_node_bandwidth_GBps=intra, inter_node_bandwidth_GBps=inter,
                      backend="rccl" if family.startswith("MI") else "nccl")
    precision = (row.get("precision") or "").lower()
    if "fp8" in precision:
        dtype = "fp8"
    elif "bf16" in precision:
        dtype = "bf16"
    elif "fp16" in precision or family == "V100":
        dtype = "fp16"
    else:
        dtype = "bf16"
    source = row.get("source", "")
    year_match = re.search(r"(20\d\d)", source)
    year = int(year_match.group(1)) if year_match else 2021
    framework = _framework(source + " " + row.get("notes", ""))
    modern = year >= 2023 or "overlap" in (row.get("notes") or "").lower()
    # DeepSpeed ZeRO-3 before 2022 gathered (and reduce-scattered) every parameter tensor with its
    # own collective when its module ran; later releases coalesce per module and prefetch
    early_zero3 = framework == "deepspeed" and year < 2022
    # context parallelism: each of cp ranks holds a 1/cp chunk of every sequence and attends over the
    # whole of it. In the grid that is cp x more, cp x shorter samples, data-parallel over dp x cp
    # ranks (the gradient all-reduce of context parallelism spans exactly those); the key/value ring
    # exchange is taken as hidden behind attention, as Transformer Engine overlaps it
    cp = _int(row.get("cp", "")) or 1
    if cp > 1 and s % cp:
        raise ValueError(f"seq_len={s} does not split over cp={cp}")
    training = Training(global_batch_size=gb * cp, dtype=dtype,
                        overlap_grad_reduce=modern or framework == "deepspeed",
                        overlap_tp_comm="tp-comm-overlap" in (row.get("notes") or ""), flash_attention=modern,
                        p2p_scatter_gather=framework != "oneflow",
                        zero3_gather="tensor" if early_zero3 else "layer", overlap_param_gather=not early_zero3)
    model = Model(name=row.get("model_name") or "gpt", num_layers=L, hidden_size=h, num_attention_heads=a,
                  ffn_hidden_size=ffn, seq_length=s // cp, attention_span=s, vocab_size=vocab,
                  gated_mlp=gated, num_query_groups=groups)
    rc_text = (row.get("recompute") or "").strip().lower()
    if rc_text in ("none", "selective", "full"):
        recomputes: tuple[str, ...] = (rc_text,)
    elif modern:
        recomputes = ("none", "selective", "full")
    else:  # Megatron before 2022 checkpointed every layer (--checkpoint-activations in all its scripts)
        recomputes = ("full",)
    sp_text = (row.get("sequence_parallel") or "").strip().lower()
    sps = (sp_text == "true",) if sp_text in ("true", "false") else ((False, True) if modern else (False,))
    tp, pp, dp = _int(row.get("tp", "")), _int(row.get("pp", "")), _int(row.get("dp", ""))
    mb = _int(row.get("micro_batch_size", ""))
    # virtual stages: as stated; unstated means none before 2023, any a tuned run could use after
    vpp = _int(row.get("virtual_pp", "")) or (0 if modern else 1)
    zero_text = (row.get("notes", "") + source).lower()
    if framework == "deepspeed" and "zero-3" in zero_text:
        zeros: tuple[int, ...] = (3,)
    elif modern:
        zeros = (0, 1)  # Megatron-Core runs use the distributed optimizer unless told otherwise
    else:
        zeros = (0,)
    order = None if framework == "oneflow" else MEGATRON_ORDER
    plans = [
        p
        for rc in recomputes
        for sp in sps
        for z in zeros
        for p in _candidate_plans(G=G, tp=tp, pp=pp, dp=dp * cp if dp else None, mb=mb, vpp=vpp, gb=gb * cp,
                                  layers=L, heads=a,
                                  recompute=rc, sp=sp, zero=z, order=order)
    ]
    if not plans:
        raise ValueError("no layout consistent with the stated degrees")
    measured = None
    if not expect_oom:
        try:
            value = float(value_text)
        except ValueError:
            raise ValueError(f"metric_value {value_text!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"metric_value {value_text!r} is not a positive number")
        tokens = float(gb * s)
        m_low = metric.lower()

        def model_flops(recompute_full: bool) -> float:
            return megatron_flops(batch=gb, seq=s, layers=L, hidden=h, vocab=vocab, ffn=ffn,
                                  recompute_full=recompute_full, kv_hidden=model.kv_hidden_size, gated=gated)

        if metric == "iteration_time_s":
            measured = value
        elif m_low in ("iteration_time_ms", "step_time_ms"):
            measured = value / 1000.0
        elif m_low in ("tokens_per_s", "tokens_per_second", "throughput_tokens_per_s"):
            measured = tokens / value
        elif m_low in ("tokens_per_s_per_gpu", "tokens_per_second_per_gpu"):
            measured = tokens / (value * G)
        elif m_low in ("samples_per_s", "sequences_per_s", "throughput_samples_per_s"):
            measured = gb / value
        elif metric == "tflops_per_gpu":
            flops = model_flops(recompute_full=rc_text == "full" or "2104.04473" in source)
            measured = flops / (value * 1e12 * G)
        elif m_low in ("mfu", "mfu_percent"):  # "mfu" is a fraction, "mfu_percent" a percent
            fraction = value if m_low == "mfu" else value / 100.0
            measured = model_flops(recompute_full=False) / (fraction * cluster.gpu.peak_tflops(dtype) * 1e12 * G)
        else:
            raise ValueError(f"metric {metric!r} is not a time metric")
    group = f"{framework} {model.name.split(' (')[0]} L{L} h{h} on {G} {gpu_name} gb{gb}"
    return Case(case_id=cid, group=group, model=model, cluster=cluster, training=training, plans=tuple(plans),
                measured_time_s=measured, expect_oom=expect_oom, source=source, notes=row.get("notes", ""))


def _candidate_plans(*, G: int, tp: int | None, pp: int | None, dp: int | None, mb: int | None, vpp: int, gb: int,
                     layers: int, heads: int, recompute: str, sp: bool, zero: int,
                     order: tuple[str, ...] | None) -> list[Plan]:
    combos: list[tuple[int, int, int]] = []
    if tp and pp:
        combos = [(tp, pp, dp or G // (tp * pp))]
    elif dp and G % dp == 0:
        mp = G // dp
        combos = [(t, mp // t, dp) for t in _divisors(mp) if t <= 8 and heads % t == 0 and layers >= mp // t]
    elif tp or pp:
        t, p = tp or 1, pp or 1
        combos = [(t, p, G // (t * p))]
    else:  # nothing stated: every layout a tuned run could have used (tensor parallelism inside a node)
        combos = [(t, p, G // (t * p)) for t in (1, 2, 4, 8) if G % t == 0 and heads % t == 0
                  for p in _divisors(G // t) if p <= layers]
    plans: list[Plan] = []
    for t, p, d in combos:
        if t * p * d != G or gb % d:
            continue
        per_replica = gb // d
        mbs = [mb] if mb else [x for x in _divisors(per_replica) if x <= 16]
        for micro in mbs:
            if per_replica % micro:
                continue
            if sp and t == 1:
                continue
            if vpp:  # stated: used where Megatron allows it (micro-batches and layers divide evenly)
                vs = [vpp if p > 1 and vpp > 1 and (per_replica // micro) % p == 0 and layers % (p * vpp) == 0 else 1]
            else:  # not stated (modern runs): any interleaving a tuned run could have used
                vs = [1] + [v for v in (2, 3, 4, 6, 8) if p > 1 and (per_replica // micro) % p == 0 and layers >= p * v]
            for v in vs:
                plans.append(Plan(G_data=d, G_inter=p, G_intra_r=t, micro_batch_size=micro,
                                  schedule="interleaved-1f1b" if v > 1 else "1f1b", virtual_stages=v,
                                  recompute=recompute, sequence_parallel=sp, zero_stage=zero,  # type: ignore[arg-type]
                                  placement=order))
    return plans


def load(paths: Iterable[Path]) -> Loaded:
    """Load every CSV (vTrain or published_dev format, told apart by their headers)."""
    out = Loaded()
    for path in paths:
        with open(path, newline="") as fh:
            header = fh.readline()
        part = load_vtrain(path) if "iteration time (ms)" in header else load_published(path)
        out.cases.extend(part.cases)
        out.skipped.extend(part.skipped)
    return out
