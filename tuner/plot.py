"""Pictures: the top layouts of a recommendation, and a sweep over GPU counts or batch sizes.

`plot_candidates` draws three panels that share one row per layout:
1. predicted step time on an axis zoomed to the candidates' range (a 5% difference is visible), each
   bar labelled with its distance from #1;
2. where the step time goes (stacked components from 0; hidden communication overlaps compute);
3. memory per GPU by part (parameters, gradients, optimizer states, activations, buffers, overhead)
   against the GPU's capacity.
Row labels spell the whole plan ("data 32 x pipe 4 (1f1b v2) x depth 4 x tensor 2x1, mb 1,
recompute selective, ZeRO 1"), so no two rows read the same; legends sit below the panels.

`plot_sweep` draws predicted throughput and memory per GPU of the best layout at each point of a
sweep. Over GPU counts it adds ideal linear scaling from the smallest count (what perfect scaling
would give); over global batch sizes at a fixed GPU count there is no such reference, so it draws only
what was predicted (`sweep_lines` says which lines a sweep gets).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.types import Recommendation

PARTS = (("compute_s", "compute"), ("tp_comm_s", "tensor-parallel comm"), ("dp_comm_s", "data-parallel comm"),
         ("pp_bubble_s", "pipeline bubble"), ("pp_p2p_s", "pipeline p2p"), ("optimizer_s", "optimizer"))
MEMORY_PARTS = (
    ("params_gib", "parameters"),
    ("grads_gib", "gradients"),
    ("optimizer_gib", "optimizer states"),
    ("activations_gib", "activations"),
    ("comm_buffers_gib", "comm buffers"),
    ("overhead_gib", "overhead"),
)


def plan_text(plan: Any) -> str:
    """A plan in words, distinct for distinct plans (the same text for one plan in other placements)."""
    pipe = f"pipe {plan.G_inter}"
    if plan.G_inter > 1:
        pipe += f" ({plan.schedule}{f' v{plan.virtual_stages}' if plan.virtual_stages > 1 else ''})"
    sp = ", seq-par" if getattr(plan, "sequence_parallel", False) else ""
    return (
        f"data {plan.G_data} x {pipe} x depth {plan.G_intra_d} x tensor {plan.G_intra_r}x{plan.G_intra_c}, "
        f"mb {plan.micro_batch_size}, recompute {plan.recompute}, ZeRO {plan.zero_stage}{sp}"
    )


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_candidates(rec: Recommendation, path: str | Path, title: str = "") -> Path:
    """Step time (zoomed), time breakdown and memory breakdown of the top candidates; returns the path."""
    plt = _pyplot()
    if not rec.candidates:
        raise ValueError("nothing to plot: no valid candidate")
    cands = rec.candidates
    labels = [f"#{c.rank} {plan_text(c.plan)}"
              + "".join(f"={z}" for z in c.equivalent_zero_stages)
              + (f" (+{len(c.equivalent_placements)} placements)" if c.equivalent_placements else "")
              for c in cands]
    n = len(labels)
    fig, (ax_s, ax_t, ax_m) = plt.subplots(1, 3, figsize=(17, 0.42 * n + 3.2), sharey=True,
                                           gridspec_kw={"width_ratios": [1.2, 2, 1.4]})
    y = list(range(n))[::-1]
    steps = [c.prediction.iteration_time_s for c in cands]
    best = steps[0]
    lo, hi = min(steps), max(steps)
    pad = max((hi - lo) * 0.15, hi * 0.01)
    ax_s.barh(y, [s - (lo - pad) for s in steps], left=lo - pad, color="tab:blue")
    for yi, s in zip(y, steps, strict=True):
        ax_s.text(
            s, yi, f" {s:.3g} s" + (f" (+{(s / best - 1):.1%})" if s > best else ""), va="center", fontsize=7
        )
    ax_s.set_xlim(lo - pad, hi + 2.5 * pad)
    ax_s.set_xlabel("predicted step time (s); axis zoomed, not from 0")
    ax_s.set_yticks(y, labels, fontsize=7)
    left = [0.0] * n
    for key, name in PARTS:
        values = [getattr(c.prediction.breakdown, key) for c in cands]
        ax_t.barh(y, values, left=left, label=name)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax_t.scatter(
        steps, y, color="black", marker="|", s=200, label="predicted step (overlap credited)", zorder=3
    )
    ax_t.set_xlabel("seconds per step by component (from 0)")
    ax_t.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, frameon=False)
    left = [0.0] * n
    for key, name in MEMORY_PARTS:
        values = [getattr(c.prediction.memory, key) for c in cands]
        ax_m.barh(y, values, left=left, label=name)
        left = [a + b for a, b in zip(left, values, strict=True)]
    cap = cands[0].prediction.memory.capacity_gib
    ax_m.axvline(cap, color="red", linestyle="--", label=f"capacity {cap:g} GiB")
    ax_m.set_xlabel("GiB per GPU by part")
    ax_m.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    partial = "" if rec.complete else f" (PARTIAL search: {rec.num_not_evaluated:,} plans not evaluated)"
    fig.suptitle((title or "top layouts") + partial)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def sweep_lines(points: Sequence[dict[str, Any]], swept: str) -> dict[str, tuple[list[float], list[float]]]:
    """The throughput lines of a sweep's plot, by legend label: the prediction at each point that has
    a layout, and over GPU counts (`swept="gpus"`) ideal linear scaling from the smallest count. A
    batch-size sweep runs at one GPU count, where "linear scaling" has no meaning: no reference line."""
    ok = [p for p in points if p.get("tokens_per_s")]
    xs = [float(p["x"]) for p in ok]
    tps = [float(p["tokens_per_s"]) for p in ok]
    lines = {"predicted (best layout)": (xs, tps)}
    if swept == "gpus" and len(ok) > 1:
        lines["linear scaling from the smallest GPU count"] = (xs, [tps[0] * x / xs[0] for x in xs])
    return lines


def plot_sweep(points: Sequence[dict[str, Any]], path: str | Path, *, x_label: str, title: str = "",
               swept: str = "gpus") -> Path:
    """Throughput (tokens/s; over GPU counts with ideal linear scaling from the smallest) and memory
    per GPU of the best layout at each sweep point. `points`: dicts with "x", "tokens_per_s",
    "per_gpu_gib", "capacity_gib", "mfu" (None where nothing fits); `swept`: "gpus" or
    "global_batch_size"."""
    plt = _pyplot()
    ok = [p for p in points if p.get("tokens_per_s")]
    if not ok:
        raise ValueError("nothing to plot: no sweep point has a layout that fits")
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = [p["x"] for p in ok]
    tps = [p["tokens_per_s"] for p in ok]
    for label, (lx, ly) in sweep_lines(points, swept).items():
        style = {"linestyle": "--", "color": "gray"} if label.startswith("linear") else {"marker": "o"}
        ax_t.plot(lx, ly, label=label, **style)
    for x, t, p in zip(xs, tps, ok, strict=True):
        ax_t.annotate(f"MFU {p['mfu']:.0%}", (x, t), textcoords="offset points", xytext=(0, 6), fontsize=7,
                      ha="center")
    ax_t.set_xscale("log", base=2)
    ax_t.set_xticks(xs, [f"{x:,}" for x in xs])
    ax_t.set_xlabel(x_label)
    ax_t.set_ylabel("tokens per second")
    ax_t.legend(fontsize=8)
    ax_m.plot(
        xs, [p["per_gpu_gib"] for p in ok], "o-", color="tab:green", label="memory per GPU (best layout)"
    )
    ax_m.axhline(
        ok[0]["capacity_gib"], color="red", linestyle="--", label=f"capacity {ok[0]['capacity_gib']:g} GiB"
    )
    ax_m.set_xscale("log", base=2)
    ax_m.set_xticks(xs, [f"{x:,}" for x in xs])
    ax_m.set_xlabel(x_label)
    ax_m.set_ylabel("GiB per GPU")
    ax_m.set_ylim(0, 1.1 * max(ok[0]["capacity_gib"], *(p["per_gpu_gib"] for p in ok)))
    ax_m.legend(fontsize=8)
    fig.suptitle(title or "scaling")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
