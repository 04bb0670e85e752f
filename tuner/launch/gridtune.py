"""The gridtune engine: the torchrun line and the `engine.init(...)` call for a plan ranked for the
gridtune stack (every grid axis, the placement, ZeRO 0-2, the schedule and recomputation)."""

from __future__ import annotations

import json
import shlex
from typing import Any

from perfmodels.io import plan_to_dict
from perfmodels.specs import AXES, Cluster, Model, Plan, Training
from tuner.launch.common import Launch, layout_of, torchrun


def gridtune(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Launch:
    lay = layout_of(model, training, plan, uneven=False)
    cmd = torchrun(cluster, lay.world, ["train.py"])
    placement = "" if plan.order == AXES else f", placement={plan.order!r}"
    extra = "".join(f", {name}={getattr(plan, name)}" for name in ("G_cp", "G_ep")
                    if int(getattr(plan, name, 1) or 1) > 1)
    init = (f"engine.init(G_data={plan.G_data}, G_inter={plan.G_inter}, G_intra_d={plan.G_intra_d}, "
            f"G_intra_r={plan.G_intra_r}, G_intra_c={plan.G_intra_c}{extra}{placement})")
    plan_json = json.dumps(plan_to_dict(plan))
    dtype = f", dtype={training.dtype!r}" if training.dtype in ("fp32", "bf16", "fp16") else ""
    python = "\n".join([
        "import engine, perfmodels.io",
        f"plan = perfmodels.io.plan_from_dict({plan_json})",
        f"engine.train(model, dataset, global_batch_size={training.global_batch_size}, steps=..., "
        f"auto=False, "
        f"plan=plan{dtype})",
        f"# or by hand: {init}",
        f"#   loader = engine.create_dataloader(dataset, global_batch_size={training.global_batch_size})",
    ])
    text = " ".join(shlex.quote(c) if "$" not in c else c for c in cmd) + "\n\n# train.py\n" + python
    config: dict[str, Any] = {"init": init, "plan": plan_to_dict(plan),
                              "global_batch_size": training.global_batch_size}
    return Launch(kind="gridtune", stack=training.effective_stack.name, text=text, args=tuple(cmd),
                  config=config)
