"""Pictures of a recommendation: where each top candidate's step time goes, and its memory."""

from __future__ import annotations

from pathlib import Path

from tuner.types import Recommendation

PARTS = (("compute_s", "compute"), ("tp_comm_s", "tensor-parallel comm"), ("dp_comm_s", "data-parallel comm"),
         ("pp_bubble_s", "pipeline bubble"), ("pp_p2p_s", "pipeline p2p"), ("optimizer_s", "optimizer"))


def plot_candidates(rec: Recommendation, path: str | Path, title: str = "") -> Path:
    """Stacked bars of the time breakdown (left) and memory per GPU (right) of the top candidates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rec.candidates:
        raise ValueError("nothing to plot: no valid candidate")
    labels = [f"#{c.rank} d{c.plan.G_data} p{c.plan.G_inter} z{c.plan.G_intra_d} r{c.plan.G_intra_r} "
              f"c{c.plan.G_intra_c} mb{c.plan.micro_batch_size}" for c in rec.candidates]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 0.45 * len(labels) + 2.2), sharey=True,
                                     gridspec_kw={"width_ratios": [3, 1]})
    y = list(range(len(labels)))[::-1]
    left = [0.0] * len(labels)
    for key, name in PARTS:
        values = [getattr(c.prediction.breakdown, key) for c in rec.candidates]
        ax_t.barh(y, values, left=left, label=name)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax_t.scatter([c.prediction.iteration_time_s for c in rec.candidates], y, color="black", marker="|", s=200,
                 label="predicted step (overlap credited)", zorder=3)
    ax_t.set_yticks(y, labels, fontsize=8)
    ax_t.set_xlabel("seconds per step (components; hidden communication overlaps compute)")
    ax_t.legend(fontsize=7, loc="lower right")
    mem = [c.prediction.memory.per_gpu_gib for c in rec.candidates]
    cap = rec.candidates[0].prediction.memory.capacity_gib
    ax_m.barh(y, mem, color="tab:gray")
    ax_m.axvline(cap, color="red", linestyle="--", label=f"{cap:g} GiB")
    ax_m.set_xlabel("GiB per GPU")
    ax_m.legend(fontsize=7)
    fig.suptitle(title or "top layouts")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
