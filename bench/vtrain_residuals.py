"""Could any re-weighting of the modelled step-time terms rank vTrain's multi-node groups right?

    PYTHONPATH=. .venv/bin/python bench/vtrain_residuals.py

A diagnostic, not the model: for every vTrain multi-node run (validation/data/vtrain_multi.csv) it
takes the model's prediction and its parts (compute, tensor-parallel and data-parallel communication,
pipeline bubble, and an additive host cost of 0.9 ms x 4 passes per layer per pipeline slot), then
refits the prediction as `predicted + sum(k_i x term_i)` by least squares on relative error over all
109 runs, for every combination of up to three terms. It prints, per combination, the fitted weights,
the MAPE and each ranking group's Spearman and the predicted rank of its measured best. Those weights
are fitted to the very rows they are scored on, so the table is an upper bound on what rescaling the
modelled physics could do: where no row reaches Spearman 0.8, the missing effect is not a mis-sized
term of the model. Prints the model as it is first.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmodels.plans import from_plans  # noqa: E402
from perfmodels.steptime import predict_many  # noqa: E402
from validation import loader  # noqa: E402
from validation.summary import rank_agreement  # noqa: E402

HOST_S_PER_LAYER_SLOT = 0.9e-3 * 4
"""An additive host cost per layer per pipeline slot: 0.9 ms per block forward (perfmodels.compute.
HOST_US_PER_BLOCK) x (forward, recompute, backward at twice the ops)."""
TERMS = ("host", "bubble", "tp", "dp", "compute")


def runs() -> pd.DataFrame:
    """One row per vTrain multi-node run: measured and predicted seconds and the predicted terms."""
    loaded = loader.load([loader.DATA_DIR / "vtrain_multi.csv"])
    rows = []
    for case in loaded.cases:
        plan, training = case.plans[0], case.trainings[0]
        got = predict_many(case.model, case.cluster, training, from_plans([plan]))
        parts = {k: float(v[0]) for k, v in got.parts.items()}
        slots = training.global_batch_size // plan.G_data // plan.micro_batch_size + plan.G_inter - 1
        rows.append({
            "group": case.model.name, "measured": case.measured_time_s,
            "predicted": float(got.iteration_time_s[0]),
            "host": slots * case.model.num_layers / plan.G_inter * HOST_S_PER_LAYER_SLOT,
            "bubble": parts["pp_bubble_s"], "tp": parts["tp_comm_s"], "dp": parts["dp_comm_s"],
            "compute": parts["compute_s"],
        })
    return pd.DataFrame(rows)


def ranking(d: pd.DataFrame, predicted: np.ndarray) -> dict[str, tuple[float, int]]:
    """Per group: (Spearman of predicted vs measured, predicted rank of the measured best)."""
    return {group: rank_agreement(x["measured"].to_numpy(), x["q"].to_numpy())
            for group, x in d.assign(q=predicted).groupby("group")}


def line(name: str, d: pd.DataFrame, predicted: np.ndarray) -> str:
    mape = float(np.mean(np.abs(predicted / d["measured"] - 1)))
    groups = "  ".join(f"{g.removeprefix('gpt-')} {r:+.3f} #{b}"
                       for g, (r, b) in ranking(d, predicted).items())
    return f"{name:<44} MAPE {100 * mape:4.1f}%  {groups}"


def main() -> int:
    d = runs()
    print(f"{len(d)} runs; per group: Spearman, predicted rank of the measured best (target >= 0.8, top 3)")
    print(line("model as it is", d, d["predicted"].to_numpy()))
    weight = 1.0 / d["measured"].to_numpy()
    residual = (d["measured"] - d["predicted"]).to_numpy()
    for k in (1, 2, 3):
        for combo in itertools.combinations(TERMS, k):
            x = d[list(combo)].to_numpy()
            coef, *_ = np.linalg.lstsq(x * weight[:, None], residual * weight, rcond=None)
            name = " + ".join(f"{c:+.2f} {t}" for c, t in zip(coef, combo))
            print(line(name, d, d["predicted"].to_numpy() + x @ coef))
    return 0


if __name__ == "__main__":
    sys.exit(main())
