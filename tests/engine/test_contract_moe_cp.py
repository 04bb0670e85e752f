"""The engine sends what the performance model says for context- and expert-parallel plans: the
communication recorder's bytes per group in a steady-state step of the engine's GPT (ring attention
over "cp"; MoE dispatch and combine over "ep", expert tensor parallelism over "etp", expert
gradients over "edp"; everything else as before) equal `perfmodels.predict(...).bytes_per_group`
for the same model, plan and the gridtune stack, on every rank (docs/architecture.md, the byte
contract of perfmodels.traffic and perfmodels.context). MoE layouts include MoE parallel folding
(G_etp != G_intra_r), whose row split, etp gather after the dispatch and row gather back are
counted by `perfmodels.experts` (`sequence_split`, `emulated_split`).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_contract_moe_cp.py -q
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from engine.launch import launch
from tests.engine import test_context, test_moe
from tests.engine.harness import GLOBAL_BATCH, config


def _recorded(table: list, column: int = 3) -> dict[str, float]:
    """Per group: the recorder's bytes (column 3) or calls (column 2) summed over its ops."""
    out: dict[str, float] = defaultdict(float)
    for row in table:
        out[row[0]] += float(row[column])
    return {k: v for k, v in out.items() if v}


def _predicted(spec, degrees: dict[str, int], micro_batch_size: int, calls: bool = False,
               recompute: str = "none") -> dict[str, float]:
    import perfmodels
    from perfmodels import presets
    from perfmodels.specs import Plan, Training

    fields = {"data": "G_data", "row": "G_intra_r", "cp": "G_cp", "ep": "G_ep", "etp": "G_etp",
              "inter": "G_inter"}
    world = 1
    for axis, value in degrees.items():
        if axis not in ("ep", "etp"):
            world *= value
    plan = Plan(**{fields[a]: v for a, v in degrees.items()}, micro_batch_size=micro_batch_size,
                recompute=recompute)
    training = Training(global_batch_size=GLOBAL_BATCH, dtype="fp32", stack="gridtune")
    pred = perfmodels.predict(spec, presets.cluster("local-cpu").with_gpus(world), training, plan)
    per_group = pred.calls_per_group if calls else pred.bytes_per_group
    return {k: float(v) for k, v in per_group.items() if v}


@pytest.mark.parametrize("degrees", [{"cp": 2, "row": 2}, {"cp": 2, "data": 2}], ids=["cp2xr2", "cp2xd2"])
def test_context_parallel_bytes_equal_the_model(degrees):
    world = 1
    for v in degrees.values():
        world *= v
    results = launch(test_context._train, world, args=(degrees, False), timeout_s=180)
    for r in results:
        want = _predicted(config(2).to_spec(), degrees, r["local_batch"])
        assert _recorded(r["table"]) == pytest.approx(want, rel=1e-12), (r["coords"], r["table"])


EP_CASES = [{"data": 4, "ep": 2}, {"data": 2, "row": 2, "ep": 2},
            {"data": 2, "row": 2, "ep": 4, "etp": 1}, {"data": 4, "ep": 2, "etp": 2},
            {"data": 2, "row": 2, "ep": 2, "etp": 1}, {"data": 2, "row": 2, "ep": 1, "etp": 4}]
ROUTED = ("ep", "etp")


@pytest.mark.parametrize("degrees", EP_CASES, ids=["ep2xd4", "ep2xr2", "r2-etp1-ep4", "d4-etp2-ep2",
                                                   "r2-etp1-ep2", "r2-etp4-ep1"])
def test_expert_parallel_bytes_equal_the_model(degrees):
    """Calls of every group on every rank; bytes of every group on every rank but "ep" and "etp",
    which are summed over the ranks: a rank's combine (and the dispatch's backward) moves the rows
    its experts received, and a folded etp group gathers the rows its members received, both
    routing-dependent; over the ranks they add up to the contract's T*k*h*e (x G_etp gathered) per
    rank and call, what the model counts. The folded layouts (the last four) are compared with the
    gridtune stack's plan (no sequence parallelism): their MoE layers split the tokens over row
    and gather the output back, which the model counts under "row"."""
    results = launch(test_moe._train, _world(degrees), args=(degrees, 2), timeout_s=180)
    _assert_expert_traffic(results, test_moe.moe_config(2).to_spec(), degrees)


def _world(degrees: dict[str, int]) -> int:
    """Ranks of an MoE grid: G_ep and G_etp re-divide a stage's ranks, they do not multiply them."""
    world = 1
    for axis, value in degrees.items():
        world *= value if axis not in ROUTED else 1
    return world


def _assert_expert_traffic(results: list, spec, degrees: dict[str, int], recompute: str = "none") -> None:
    """Every rank's recorded calls per group equal the model's, its bytes too except on "ep" and
    "etp", whose bytes are compared summed over the ranks (routing-dependent per rank)."""
    routed = dict.fromkeys(ROUTED, 0.0)
    for r in results:
        want = _predicted(spec, degrees, r["mb"], recompute=recompute)
        assert _recorded(r["table"], column=2) == pytest.approx(
            _predicted(spec, degrees, r["mb"], calls=True, recompute=recompute), rel=1e-12), (
            r["coords"], r["table"])
        got = _recorded(r["table"])
        for axis in ROUTED:
            routed[axis] += got.pop(axis, 0.0)
        assert got == pytest.approx({k: v for k, v in want.items() if k not in ROUTED}, rel=1e-12), (
            r["coords"], r["table"])
    for axis in ROUTED:
        assert routed[axis] == pytest.approx(want.get(axis, 0.0) * len(results), rel=1e-12), axis


RECOMPUTE_CASES = [({"data": 4, "ep": 2}, True), ({"data": 2, "row": 2, "ep": 2}, True),
                   ({"data": 2, "row": 2, "ep": 2, "etp": 1}, True),
                   ({"data": 2, "row": 2, "ep": 2, "etp": 1}, False)]


@pytest.mark.parametrize(("degrees", "shared"), RECOMPUTE_CASES,
                         ids=["ep2xd4", "ep2xr2", "r2-etp1-ep2", "r2-etp1-ep2-unshared"])
def test_full_recompute_moe_bytes_equal_the_model(degrees, shared):
    """Full recomputation of the MoE GPT (every block checkpointed, non-reentrant with torch's early
    stop): training stays exact against one process, and the recorder's calls and bytes per group
    equal the gridtune stack's model. The recomputation repeats the dispatch AND the combine: the
    gate weighting after the combine saves its output (`y * weights`) and the unpermute its index
    (`index_add`), so early stopping does not reach before it (perfmodels.experts). Per MoE layer and
    micro-batch that is 6 all-to-alls over "ep" (2 forward, 2 backward, 2 recomputed), the etp
    all-reduce of the combine side again where the etp group is the row group (ep2xr2). In the
    folded layout (the tokens split over row) the row gather back is repeated where the shared
    expert follows it and saves tensors, and not without one; the shared expert's own last
    all-reduce over row, the layer's last collective, is not repeated, and without a shared expert
    out_proj's all-reduce is (the router after it saves its input). Bytes of "ep" and "etp" summed
    over the ranks, as in the test above."""
    results = launch(test_moe._train, _world(degrees), args=(degrees, 2, 0, None, True, shared),
                     timeout_s=240)
    test_moe._check(results, degrees, shared=shared)
    _assert_expert_traffic(results, test_moe.moe_config(2, shared).to_spec(), degrees, recompute="full")
    for r in results:
        assert r["mb"] == r["local"]  # no pipeline: one micro-batch per step
        # 2 MoE layers x (2 fwd + 2 bwd + 2 recomputed)
        assert _recorded(r["table"], column=2)["ep"] == 6 * 2, r["table"]
