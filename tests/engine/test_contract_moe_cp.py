"""The engine sends what the performance model says for context- and expert-parallel plans: the
communication recorder's bytes per group in a steady-state step of the engine's GPT (ring attention
over "cp"; MoE dispatch and combine over "ep", expert tensor parallelism over "etp", expert
gradients over "edp"; everything else as before) equal `perfmodels.predict(...).bytes_per_group`
for the same model, plan and the gridtune stack, on every rank (docs/architecture.md, the byte
contract of perfmodels.traffic and perfmodels.context).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_contract_moe_cp.py -q
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from engine.launch import launch
from tests.engine import test_context, test_moe
from tests.engine.harness import GLOBAL_BATCH, config


def _recorded(table: list) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for axis, _op, _calls, nbytes in table:
        out[axis] += float(nbytes)
    return {k: v for k, v in out.items() if v}


def _predicted(spec, degrees: dict[str, int], micro_batch_size: int) -> dict[str, float]:
    import perfmodels
    from perfmodels import presets
    from perfmodels.specs import Plan, Training

    fields = {"data": "G_data", "row": "G_intra_r", "cp": "G_cp", "ep": "G_ep", "inter": "G_inter"}
    world = 1
    for axis, value in degrees.items():
        if axis != "ep":
            world *= value
    plan = Plan(**{fields[a]: v for a, v in degrees.items()}, micro_batch_size=micro_batch_size)
    training = Training(global_batch_size=GLOBAL_BATCH, dtype="fp32", stack="gridtune")
    pred = perfmodels.predict(spec, presets.cluster("local-cpu").with_gpus(world), training, plan)
    return {k: float(v) for k, v in pred.bytes_per_group.items() if v}


@pytest.mark.parametrize("degrees", [{"cp": 2, "row": 2}, {"cp": 2, "data": 2}], ids=["cp2xr2", "cp2xd2"])
def test_context_parallel_bytes_equal_the_model(degrees):
    world = 1
    for v in degrees.values():
        world *= v
    results = launch(test_context._train, world, args=(degrees, False), timeout_s=180)
    for r in results:
        want = _predicted(config(2).to_spec(), degrees, r["local_batch"])
        assert _recorded(r["table"]) == pytest.approx(want, rel=1e-12), (r["coords"], r["table"])


EP_CASES = [{"data": 4, "ep": 2}, {"data": 2, "row": 2, "ep": 2}]


@pytest.mark.parametrize("degrees", EP_CASES, ids=["ep2xd4", "ep2xr2"])
def test_expert_parallel_bytes_equal_the_model(degrees):
    """Every group per rank, but "ep" summed over the ranks: a rank's combine (and the dispatch's
    backward) moves the rows its experts received, which depends on the routing; over the ep group
    they add up to the contract's T*k*h*e per rank and call, what the model counts."""
    world = degrees.get("data", 1) * degrees.get("row", 1)
    results = launch(test_moe._train, world, args=(degrees, 2), timeout_s=180)
    ep_total = 0.0
    for r in results:
        want = _predicted(test_moe.moe_config(2).to_spec(), degrees, r["mb"])
        got = _recorded(r["table"])
        ep_total += got.pop("ep")
        assert got == pytest.approx({k: v for k, v in want.items() if k != "ep"}, rel=1e-12), (
            r["coords"], r["table"])
    assert ep_total == pytest.approx(want["ep"] * len(results), rel=1e-12)
