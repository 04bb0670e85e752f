"""Expert parallelism (engine.moe): the GPT with MoE MLPs (experts split over G_ep, all-to-all
dispatch and combine, expert gradients over the expert-data group) trains exactly as one process
(loss and final parameters at 1e-5), alone and with row (G_etp = G_intra_r) or data, and pipelined;
the "ep"/"etp" groups carry the contract's bytes.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_moe.py -q
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from engine.launch import launch
from engine.models.gpt import GPTConfig
from tests.engine.harness import GLOBAL_BATCH, LR, STEPS, batches, isolated, make_optimizer

FIELDS = {"data": "G_data", "row": "G_intra_r", "inter": "G_inter", "ep": "G_ep", "etp": "G_etp"}
EXPERTS, TOPK = 4, 2


def moe_config(num_layers: int = 2, shared: bool = True) -> GPTConfig:
    """The test MoE GPT; `shared`: with a shared expert (16 wide) beside the routed ones."""
    return GPTConfig(num_layers=num_layers, hidden_size=32, num_attention_heads=8, seq_length=8,
                     vocab_size=60, num_moe_experts=EXPERTS, moe_router_topk=TOPK, moe_ffn_hidden_size=48,
                     moe_shared_expert_intermediate_size=16 if shared else None)


Reference = tuple[list[float], dict[str, torch.Tensor], float]


def _reference(num_layers: int, clip: float | None = None, shared: bool = True) -> Reference:
    from engine.models.gpt import GPT

    torch.set_num_threads(1)
    cfg = moe_config(num_layers, shared)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = make_optimizer(model.parameters())
    tokens, targets = batches(cfg)
    losses = []
    for s in range(STEPS):
        rows = slice(s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH)
        opt.zero_grad()
        loss = model(tokens[rows], targets[rows])
        loss.backward()
        if s == 0:
            norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(float(loss))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, norm


@functools.lru_cache(maxsize=4)
def reference(num_layers: int = 2, clip: float | None = None, shared: bool = True) -> Reference:
    return isolated(_reference, num_layers, clip, shared)


def _optimizer(model: torch.nn.Module, zero: int) -> torch.optim.Optimizer:
    import engine

    kwargs = {"lr": LR, "eps": 1e-5, "weight_decay": 0.01}
    if zero == 3:
        return engine.Zero3(model, torch.optim.AdamW, **kwargs)
    if zero:
        return engine.ZeroOptimizer(model, torch.optim.AdamW, stage=zero, **kwargs)
    return make_optimizer(model.parameters())


def _train(rank: int, world: int, degrees: dict[str, int], num_layers: int, zero: int = 0,
           clip: float | None = None, recompute: bool = False, shared: bool = True) -> dict[str, Any]:
    from torch.utils.data import TensorDataset

    import engine
    from engine.models.gpt import GPT

    grid = engine.init(**{FIELDS[a]: v for a, v in degrees.items()})
    cfg = moe_config(num_layers, shared)
    torch.manual_seed(0)
    model = engine.ParallelGPT.from_serial(GPT(cfg), grid, recompute=recompute)
    opt = _optimizer(model, zero)
    loader = engine.create_dataloader(TensorDataset(*batches(cfg)), GLOBAL_BATCH)
    local = GLOBAL_BATCH // grid.batch_shards
    pipe = None
    if grid.size("inter") > 1:
        pipe = engine.Pipeline(model, grid, schedule="1f1b", micro_batch_size=1, local_batch_size=local)
    rec = engine.CommRecorder(grid)
    losses = []
    for s, (tok, tgt) in enumerate(loader):
        opt.zero_grad()
        if s == STEPS - 1:
            rec.__enter__()
        loss = engine.forward_backward(model, tok, tgt, pipeline=pipe)
        engine.sync_gradients(model)
        if s == STEPS - 1:
            rec.__exit__(None, None, None)
        if s == 0:
            norm = float(engine.grad_norm(model))  # experts summed over ep and etp
        if clip is not None:  # the global norm: each expert shard counted once
            engine.clip_grad_norm_(model, clip)
        opt.step()
        losses.append(loss)
    state = engine.full_state_dict(model)
    from engine.grads import is_expert

    expert_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if is_expert(p))
    return {"coords": dict(grid.coords), "losses": losses, "state": state, "norm": norm,
            "expert_bytes": expert_bytes, "edp": grid.degrees.get("edp", 1),
            "table": rec.table(), "local": local, "mb": 1 if pipe is not None else local}


def _check(results: list[dict[str, Any]], degrees: dict[str, int], num_layers: int = 2,
           clip: float | None = None, shared: bool = True) -> None:
    ref_losses, ref_state, ref_norm = reference(num_layers, clip, shared)
    for r in results:
        assert r["norm"] == pytest.approx(ref_norm, rel=1e-5)
    last = [r for r in results
            if r["coords"]["inter"] == degrees.get("inter", 1) - 1 and r["coords"]["row"] == 0]
    assert [sum(r["losses"][s] for r in last) / len(last) for s in range(STEPS)] == \
        pytest.approx(ref_losses, rel=1e-5)
    state: dict[str, torch.Tensor] = {}
    for r in results:  # every stage's part; full_state_dict gathers the experts over ep and etp
        state.update(r["state"])
    assert set(state) == set(ref_state)
    for name, want in ref_state.items():
        assert (state[name] - want).abs().max().item() <= 1e-5, name


CASES = [{"data": 2, "ep": 2}, {"data": 4, "ep": 4}, {"data": 2, "row": 2, "ep": 2}, {"data": 4, "ep": 2}]


@pytest.mark.parametrize("degrees", CASES, ids=["ep2", "ep4", "ep2xr2", "ep2xd4"])
def test_expert_parallel_gpt_trains_as_one_process(degrees):
    world = 1
    for a, v in degrees.items():
        world *= v if a not in ("ep", "etp") else 1
    results = launch(_train, world, args=(degrees, 2), timeout_s=180)
    _check(results, degrees)
    cfg = moe_config()
    for r in results:
        table = {(axis, op): (calls, nbytes) for axis, op, calls, nbytes in r["table"]}
        # per MoE layer: dispatch + combine forward, their gradients backward, all-to-alls over ep
        if r["edp"] > 1:  # expert gradients: one all-reduce over edp of this rank's experts per step
            assert table[("edp", "all_reduce")][1] == r["expert_bytes"], r["table"]
        else:
            assert ("edp", "all_reduce") not in table, r["table"]
        calls, nbytes = table[("ep", "all_to_all")]
        assert calls == 4 * cfg.num_layers, r["table"]
        r["ep_bytes"] = nbytes
        if degrees.get("row", 1) > 1:  # G_etp = G_intra_r: forward and backward all-reduce of [T*k, h]
            T = r["local"] * cfg.seq_length
            expected_etp = cfg.num_layers * 2 * T * TOPK * cfg.hidden_size * 4
            row_calls, row_bytes = table[("etp", "all_reduce")]
            assert row_bytes == expected_etp and row_calls == 2 * cfg.num_layers, r["table"]
    # dispatch: exactly T*k*h per rank each way; combine: what the routing sent, so over the ep
    # group the total is the contract's 4 * T*k*h * e per layer and rank
    per_rank = 4 * cfg.num_layers * results[0]["local"] * cfg.seq_length * TOPK * cfg.hidden_size * 4
    assert sum(r["ep_bytes"] for r in results) == per_rank * len(results)


def test_pipelined_moe_trains_as_one_process():
    degrees = {"inter": 2, "data": 2, "ep": 2}
    results = launch(_train, 4, args=(degrees, 2), timeout_s=180)
    _check(results, degrees)


def test_moe_grid_errors_name_the_field():
    def body(rank: int, world: int) -> list[str]:
        import engine

        out = []
        for kwargs in ({"G_data": 4, "G_ep": 3}, {"G_data": 4, "G_ep": 2, "G_etp": 0}):
            try:
                engine.init(**kwargs)
            except engine.GridError as exc:
                out.append(str(exc))
        grid = engine.init(G_data=4, G_ep=4)
        try:
            engine.MoE(16, 32, num_experts=6, grid=grid)
        except engine.GridError as exc:
            out.append(str(exc))
        return out

    out = launch(body, 4, timeout_s=60)[0]
    assert "G_etp*G_ep = 1*3 = 3 does not divide" in out[0]
    assert "G_etp must be a positive integer, got 0" in out[1]
    assert "G_ep=4 does not divide num_moe_experts=6" in out[2]


def test_gridtune_train_example_moe(capsys):
    """`gridtune train --example moe` trains the built-in GPT with MoE MLPs, experts over G_ep=2."""
    import json

    from cli import main

    assert main(["train", "--example", "moe", "--nproc", "2", "--ep", "2", "--steps", "12", "--warmup", "2",
                 "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "16", "--global-batch-size", "8",
                 "--plan", "G_data=2", "--lr", "1e-2", "--no-store", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    losses = out["losses"]
    assert len(losses) == 12 and losses[0] > 4.5  # ~ln(256) at the start
    assert sum(losses[-3:]) / 3 < losses[0] - 0.5, losses


def _skewed(rank: int, world: int, layout: dict[str, int]) -> dict[str, float]:
    import engine
    from engine.models.gpt import MoEMLP

    grid = engine.init(**layout)
    torch.manual_seed(0)
    serial = MoEMLP(8, 16, 4, top_k=2)
    with torch.no_grad():  # positive inputs, experts 0 and 1 (ep rank 0) always chosen
        serial.router.weight.zero_()
        serial.router.weight[:2] = 1.0
    moe = engine.MoE.from_serial(serial, grid)
    out = {}
    seed = grid.coords["data"] * 10  # the row ranks of a data replica hold the same tokens
    for step in range(2):
        x = (torch.rand(3, 8, generator=torch.Generator().manual_seed(seed + step)) + 1).requires_grad_()
        moe.router.weight.grad = None
        serial.zero_grad()
        y = moe(x)
        y.square().sum().backward()
        xs = x.detach().clone().requires_grad_()
        ys = serial(xs)
        ys.square().sum().backward()
        out[f"y{step}"] = (y - ys).abs().max().item()
        out[f"dx{step}"] = (x.grad - xs.grad).abs().max().item()
        # the replicated router sees every token of the replica: its gradient is whole on each rank
        out[f"router{step}"] = (moe.router.weight.grad - serial.router.weight.grad).abs().max().item()
    return out


SKEWED = [{"G_data": 2, "G_ep": 2}, {"G_data": 4, "G_ep": 2, "G_etp": 2},
          {"G_data": 2, "G_intra_r": 2, "G_ep": 2, "G_etp": 1},
          {"G_data": 2, "G_intra_r": 2, "G_ep": 1, "G_etp": 4}]


@pytest.mark.parametrize("layout", SKEWED, ids=["ep2", "d4-etp2-ep2", "r2-etp1-ep2", "r2-etp4-ep1"])
def test_a_rank_that_receives_no_tokens_still_runs_every_all_to_all(layout):
    """Routing that sends every token to ep rank 0's experts: ep rank 1 computes nothing, yet it must
    run the combine's and the dispatch's backward all-to-all (else gloo pairs mismatched buffers:
    'Received data size doesn't match expected size'), and under folding its etp group gathers and
    reduce-scatters empty rows. Three tokens over two row ranks split unevenly (2 + 1): the row and
    etp gathers of uneven members. Output, input gradient and router gradient as one process."""
    world = layout["G_data"] * layout.get("G_intra_r", 1)
    for r in launch(_skewed, world, args=(layout,), timeout_s=60):
        assert max(r.values()) <= 1e-5, r


def test_local_experts_split_over_row_train_as_one_process():
    """G_ep = 1, G_etp = G_intra_r = 2: no expert groups; each expert's FFN split over the row group,
    expert gradients reduced over data like any replicated parameter."""
    degrees = {"data": 2, "row": 2, "ep": 1}
    _check(launch(_train, 4, args=(degrees, 2), timeout_s=180), degrees)


def _user_block(rank: int, world: int) -> float:
    import engine
    from engine.models.gpt import MoEMLP

    grid = engine.init(G_data=2, G_ep=2)
    torch.manual_seed(0)
    serial = torch.nn.Sequential(torch.nn.Linear(8, 8), MoEMLP(8, 16, 4, top_k=2, shared_ffn=8))
    torch.manual_seed(0)
    built = torch.nn.Sequential(torch.nn.Linear(8, 8), MoEMLP(8, 16, 4, top_k=2, shared_ffn=8))
    model = engine.wrap(engine.parallelize(built, grid))
    assert isinstance(model[1], engine.MoE)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(rank))
    return float((model(x) - serial(x)).abs().max())


def test_parallelize_turns_a_users_moe_block_into_engine_moe():
    """engine.parallelize finds MoE blocks (MoEMLP's layout) and splits their experts over ep."""
    for diff in launch(_user_block, 2, timeout_s=60):
        assert diff <= 1e-5


CLIP = 0.05  # below the first steps' gradient norms (about 5): every step is clipped
EP2D4, EP2R2 = {"data": 4, "ep": 2}, {"data": 2, "row": 2, "ep": 2}
ZERO_CASES = [(EP2D4, 1, None), (EP2D4, 2, None), (EP2D4, 3, None), (EP2R2, 1, None), (EP2D4, 0, CLIP),
              (EP2D4, 2, CLIP), (EP2D4, 3, CLIP), (EP2R2, 1, CLIP)]


@pytest.mark.parametrize(("degrees", "zero", "clip"), ZERO_CASES,
                         ids=["ep2xd4-zero1", "ep2xd4-zero2", "ep2xd4-zero3", "ep2xr2xd2-zero1",
                              "ep2xd4-clip",
                              "ep2xd4-zero2-clip", "ep2xd4-zero3-clip",
                              "ep2xr2xd2-zero1-clip"])
def test_moe_with_zero_trains_as_one_process(degrees, zero, clip):
    """ZeRO-1/2/3 shard the experts over the expert-data group (edp2 here; edp1 on r2: unsharded)
    and the dense parameters over data; the global norm counts each expert shard once, so clipping
    scales as in one process."""
    world = 1
    for a, v in degrees.items():
        world *= v if a not in ("ep", "etp") else 1
    _check(launch(_train, world, args=(degrees, 2, zero, clip), timeout_s=180), degrees, clip=clip)


def _expert_shards(rank: int, world: int, stage: int) -> dict[str, Any]:
    """How a ZeRO optimizer splits a MoE GPT on ep2 x data4: each expert shard's size against the
    rank's expert weights (sharded over the 2 expert-data ranks), the dense shard against the dense
    parameters (over the 4 data ranks)."""
    import engine
    from engine.grads import is_expert
    from engine.models.gpt import GPT

    grid = engine.init(G_data=4, G_ep=2)
    torch.manual_seed(0)
    model = engine.ParallelGPT.from_serial(GPT(moe_config()), grid)
    expert = sum(p.numel() for p in model.parameters() if is_expert(p))
    dense = sum(p.numel() for p in model.parameters() if not is_expert(p))
    opt = _optimizer(model, stage)  # (Zero3 empties the parameters)
    if stage == 3:
        mine_e = sum(u.segment for u in opt.units if u.expert)
        mine_d = sum(u.segment for u in opt.units if not u.expert)
    else:
        mine_e = sum(sp.segment for sp in opt.spaces if sp.expert)
        mine_d = sum(sp.segment for sp in opt.spaces if not sp.expert)
    return {"expert": expert, "dense": dense, "mine_e": mine_e, "mine_d": mine_d}


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_shards_experts_over_the_expert_data_group(stage):
    for r in launch(_expert_shards, 4, args=(stage,), timeout_s=120):
        assert r["expert"] / 2 <= r["mine_e"] < r["expert"] / 2 + 64, r  # padded to a multiple of 2 per unit
        assert r["dense"] / 4 <= r["mine_d"] < r["dense"] / 4 + 64, r


def _hybrid_refused(rank: int, world: int) -> str:
    import engine
    from engine.models.gpt import GPT

    grid = engine.init(G_data=4, G_ep=2)
    torch.manual_seed(0)
    model = engine.ParallelGPT.from_serial(GPT(moe_config()), grid)
    try:
        engine.Zero3(model, torch.optim.AdamW, hybrid_shard=2)
    except ValueError as exc:
        return str(exc)
    return ""


def test_zero3_hybrid_shard_with_experts_is_refused_before_any_collective():
    for message in launch(_hybrid_refused, 4, timeout_s=60):
        assert message.startswith("hybrid_shard=2:"), message


def _engine_train(rank: int, world: int, zero: int) -> list[float]:
    from torch.utils.data import TensorDataset

    import engine
    from perfmodels.specs import Plan

    cfg = moe_config()
    report = engine.train(cfg, TensorDataset(*batches(cfg, steps=4)), GLOBAL_BATCH, 4, warmup_steps=1,
                          plan=Plan(G_data=4, zero_stage=zero, micro_batch_size=2), G_ep=2, record=False,
                          progress=False)
    return list(report.losses) if report is not None else []


def test_engine_train_runs_moe_at_every_zero_stage():
    """engine.train(zero_stage=1/2/3) with MoE MLPs (ep2 x data4): the same losses as ZeRO-0."""
    runs = {zero: launch(_engine_train, 4, args=(zero,), timeout_s=180)[0] for zero in (0, 1, 2, 3)}
    assert len(runs[0]) == 4
    for zero in (1, 2, 3):
        assert runs[zero] == pytest.approx(runs[0], rel=1e-5), zero


FOLDED = [({"data": 2, "row": 2, "ep": 4, "etp": 1}, 0), ({"data": 4, "ep": 2, "etp": 2}, 0),
          ({"data": 2, "row": 2, "ep": 2, "etp": 1}, 1), ({"data": 2, "row": 2, "ep": 1, "etp": 4}, 0)]


@pytest.mark.parametrize(("degrees", "zero"), FOLDED,
                         ids=["r2-etp1-ep4", "d4-etp2-ep2", "r2-etp1-ep2-edp2-zero1", "r2-etp4-ep1"])
def test_etp_other_than_row_trains_as_one_process(degrees, zero):
    """MoE parallel folding (G_etp != G_intra_r): tokens split over row, gathered over etp; loss,
    final parameters and the first step's gradient norm at 1e-5 against one process."""
    world = 1
    for a, v in degrees.items():
        world *= v if a not in ("ep", "etp") else 1
    _check(launch(_train, world, args=(degrees, 2, zero), timeout_s=180), degrees)


def _folding_errors(rank: int, world: int) -> list[str]:
    import engine
    from engine.train import moe_limits
    from perfmodels.specs import Plan

    out = []
    try:
        engine.init(G_data=4, G_ep=2, G_etp=3)
    except engine.GridError as exc:
        out.append(str(exc))
    grid = engine.init(G_data=4, G_ep=1, G_etp=4)
    try:
        engine.MoE(16, 30, num_experts=4, grid=grid)
    except ValueError as exc:
        out.append(str(exc))
    out += moe_limits(Plan(G_data=2, G_intra_c=2, zero_stage=3), G_ep=2)
    return out


def test_folding_degrees_that_do_not_fit_are_refused_by_name():
    out = launch(_folding_errors, 4, timeout_s=60)[0]
    assert "G_etp*G_ep = 3*2 = 6 does not divide the ranks of one pipeline stage" in out[0]
    assert "G_etp=4 does not divide moe_ffn_hidden_size=30" in out[1]
    assert out[2:] == ["G_intra_c=2, G_intra_d=1: MoE layers need both 1"]  # zero_stage=3 is fine now
