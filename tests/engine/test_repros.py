"""Issue 12's repros, each on real forked gloo ranks: the engine now gives the single-process result
(1e-5, or bf16 rounding under autocast) or a clear ValueError naming the argument.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_repros.py -q
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from engine.launch import launch
from engine.models.gpt import GPT
from perfmodels.specs import Plan
from tests.engine.harness import GLOBAL_BATCH, LR, STEPS, batches, config, isolated, make_optimizer

# ---------------------------------------------------------------------------------------------
# 1. autocast on every axis, and an output dtype that does not depend on the grid
# ---------------------------------------------------------------------------------------------


def _autocast(rank: int, world: int) -> dict[str, Any]:
    import engine

    out: dict[str, Any] = {}
    grid = engine.init(G_intra_d=2, G_intra_r=2)
    torch.manual_seed(0)
    lin = engine.Linear(16, 16)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    x_local = x.chunk(2)[grid.coord("depth")]  # the batch is split over depth
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x_local)
        y.float().sum().backward()
    engine.sync_gradients(lin)
    out["linear"] = (y.dtype, y.detach().float(), engine.full_state_dict(lin), {
        n: p.grad.clone() for n, p in lin.named_parameters()}, dict(grid.coords))
    # ParallelGPT on depth2 x row2 under autocast
    torch.manual_seed(0)
    model = engine.ParallelGPT(config(), grid)
    tokens, targets = batches(config(), 1)
    local = GLOBAL_BATCH // grid.batch_shards
    sl = slice(grid.batch_shard_index * local, (grid.batch_shard_index + 1) * local)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(tokens[sl], targets[sl])
        loss.backward()
    out["gpt_loss"] = float(loss)
    # the output dtype of every Linear form is the autocast dtype on any grid (here col=4)
    dtypes = []
    for degrees in ({"G_intra_c": 4}, {"G_intra_r": 4}, {"G_intra_d": 4}, {"G_data": 4}):
        g = engine.init(**degrees)
        torch.manual_seed(0)
        for layer in (engine.Linear(16, 16, grid=g), engine.ShardedLinear(16, 16, grid=g),
                      engine.ShardedLinear(16, 16, transpose=True, grid=g)):
            split_axis = "row" if layer.transpose else "col"
            width = 16 if isinstance(layer, engine.Linear) else 16 // g.size(split_axis)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                dtypes.append(layer(torch.randn(2, width)).dtype)
    out["dtypes"] = dtypes
    return out


def _autocast_reference() -> tuple[torch.Tensor, torch.Tensor, float]:
    torch.manual_seed(0)
    dense = nn.Linear(16, 16)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = dense(x)
        y.float().sum().backward()
    torch.manual_seed(0)
    gpt = GPT(config())
    tokens, targets = batches(config(), 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss = float(gpt(tokens[:GLOBAL_BATCH], targets[:GLOBAL_BATCH]).detach())
    return y.detach(), dense.weight.detach(), ref_loss


def test_autocast_works_with_depth_and_dtype_does_not_depend_on_grid():
    results = launch(_autocast, world_size=4, timeout_s=60)
    y, dense_weight, ref_loss = isolated(_autocast_reference)
    for r in results:
        dtype, y_local, state, _grads, coords = r["linear"]
        assert dtype == y.dtype == torch.bfloat16
        ref = y.detach().float().chunk(2)[coords["depth"]]
        assert torch.allclose(y_local, ref, rtol=2e-2, atol=2e-2)
        assert torch.equal(state["weight"], dense_weight)
        assert r["dtypes"] == [torch.bfloat16] * 12
    mean = sum(r["gpt_loss"] for r in results if r["linear"][4]["row"] == 0) / 2
    assert mean == pytest.approx(ref_loss, rel=2e-2)


# ---------------------------------------------------------------------------------------------
# 2. clip_grad_norm_ under ZeRO-1 uses the global norm (and ZeroOptimizer is a torch Optimizer)
# ---------------------------------------------------------------------------------------------

CLIP = 0.05


def _reference_clipped() -> tuple[list[float], list[float], dict[str, torch.Tensor], list[float]]:
    cfg = config()
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = make_optimizer(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    tokens, targets = batches(cfg)
    losses, norms, lrs = [], [], []
    for s in range(STEPS):
        sl = slice(s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH)
        opt.zero_grad()
        loss = model(tokens[sl], targets[sl])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        lrs.append(opt.param_groups[0]["lr"])
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}, lrs


def _zero_clip(rank: int, world: int, degrees: dict[str, int]) -> dict[str, Any]:
    import engine

    grid = engine.init(**degrees)
    torch.manual_seed(0)
    model = engine.ParallelGPT(config(), grid)
    opt = engine.ZeroOptimizer(model, torch.optim.AdamW, lr=LR, eps=1e-5, weight_decay=0.01)
    assert isinstance(opt, torch.optim.Optimizer)
    defaults_only = engine.ZeroOptimizer(nn.Linear(4, 4), torch.optim.SGD)  # SGD's default lr is visible
    assert defaults_only.param_groups[0]["lr"] == torch.optim.SGD([torch.zeros(1)]).defaults["lr"]
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loader = engine.create_dataloader(TensorDataset(*batches(config())), GLOBAL_BATCH)
    losses, norms, lrs = [], [], []
    for tok, tgt in loader:
        opt.zero_grad()
        losses.append(engine.forward_backward(model, tok, tgt))
        norms.append(float(engine.step(model, opt, max_grad_norm=CLIP)))
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return {"losses": losses, "norms": norms, "lrs": lrs, "state": engine.full_state_dict(model),
            "coords": dict(grid.coords), "opt_state": list(opt.state_dict())}


@pytest.mark.parametrize("degrees", [{"G_data": 4}, {"G_data": 2, "G_intra_d": 2}],
                         ids=["data4", "data2-depth2"])
def test_zero1_clipping_uses_the_global_norm(degrees):
    ref_losses, ref_norms, ref_state, ref_lrs = isolated(_reference_clipped)
    assert ref_norms[0] > CLIP  # clipping is active
    results = launch(_zero_clip, world_size=4, args=(degrees,), timeout_s=60)
    for r in results:
        assert r["norms"] == pytest.approx(ref_norms, rel=1e-5)
        assert r["lrs"] == pytest.approx(ref_lrs)
        assert r["opt_state"] == ["inner", "param_groups", "zero"]
    losses = [sum(r["losses"][s] for r in results) / 4 for s in range(STEPS)]
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for name, ref in ref_state.items():
        assert (results[0]["state"][name] - ref).abs().max().item() <= 1e-5, name


# ---------------------------------------------------------------------------------------------
# 3. G_inter is not counted for a model without stages; such a model is refused / warned about
# ---------------------------------------------------------------------------------------------


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _inter_norm(rank: int, world: int) -> dict[str, Any]:
    import engine

    out: dict[str, Any] = {}
    engine.init(G_inter=2, G_intra_r=2)
    try:
        with engine.auto_parallelize():
            _mlp()
    except ValueError as exc:
        out["auto"] = str(exc)
    torch.manual_seed(0)
    net = _mlp()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.wrap(net)
    out["warning"] = " ".join(str(w.message) for w in caught)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    net(x).square().mean().backward()
    engine.sync_gradients(net)
    out["norm"] = float(engine.grad_norm(net))
    return out


def _true_norm() -> float:
    torch.manual_seed(0)
    net = _mlp()
    net(torch.randn(4, 8, generator=torch.Generator().manual_seed(2))).square().mean().backward()
    return float(torch.nn.utils.get_total_norm([p.grad for p in net.parameters()]))


def test_grad_norm_of_a_model_without_stages_does_not_count_g_inter():
    results = launch(_inter_norm, world_size=4, timeout_s=60)
    true = isolated(_true_norm)
    for r in results:
        assert r["norm"] == pytest.approx(true, rel=1e-5)
        assert "G_inter=2" in r["auto"] and "auto_parallelize" in r["auto"]
        assert "G_inter=2" in r["warning"]


# ---------------------------------------------------------------------------------------------
# 4. a pipeline stepped with the wrong batch: ValueError on every rank, before any collective
# ---------------------------------------------------------------------------------------------


def _pipe_batch(rank: int, world: int) -> dict[str, Any]:
    import engine

    grid = engine.init(G_inter=2)
    torch.manual_seed(0)
    model = engine.ParallelGPT(config(), grid)
    pipe = engine.Pipeline(model, grid, micro_batch_size=1, local_batch_size=4)
    tokens, targets = batches(config(), 1)
    rec = engine.CommRecorder(grid)
    out: dict[str, Any] = {}
    with rec:
        try:
            engine.forward_backward(model, tokens[:3], targets[:3], pipeline=pipe)
        except ValueError as exc:
            out["error"] = str(exc)
    out["calls"] = sum(rec.calls.values())
    out["loss"] = engine.forward_backward(model, tokens[:4], targets[:4], pipeline=pipe)  # still usable
    return out


def test_pipeline_with_the_wrong_batch_raises_on_every_rank():
    results = launch(_pipe_batch, world_size=2, timeout_s=60)
    for r in results:
        assert "tokens has shape (3, 8)" in r["error"] and "local_batch_size=4" in r["error"]
        assert r["calls"] == 0
    assert results[1]["loss"] is not None


# ---------------------------------------------------------------------------------------------
# 5. buffers survive full_state_dict, checkpoints and the consolidated export
# ---------------------------------------------------------------------------------------------


def _bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, 4))


def _buffers(rank: int, world: int, path: str) -> dict[str, Any]:
    import engine

    engine.init(G_intra_r=2)
    torch.manual_seed(0)
    with engine.auto_parallelize():
        net = _bn_net()
    net = engine.wrap(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        opt.zero_grad()
        net(x).square().mean().backward()
        engine.step(net, opt)
    full = engine.full_state_dict(net)
    engine.save_checkpoint(path, net, opt, step=2, consolidated=True)
    torch.manual_seed(5)
    with engine.auto_parallelize():
        fresh = _bn_net()
    engine.load_checkpoint(path, fresh)
    return {"full": full, "reloaded": engine.full_state_dict(fresh)}


def _bn_reference() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = _bn_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def test_buffers_are_kept_by_full_state_dict_and_checkpoints(tmp_path):
    results = launch(_buffers, world_size=2, args=(str(tmp_path),), timeout_s=60)
    ref = isolated(_bn_reference)
    consolidated = torch.load(tmp_path / "consolidated.pt")
    for r in results:
        for state in (r["full"], r["reloaded"], consolidated):
            assert set(state) == set(ref)
            for name, value in ref.items():
                assert torch.allclose(state[name].to(value.dtype), value, atol=1e-5), name
    assert ref["1.running_mean"].abs().sum() > 0
    assert sorted(os.listdir(tmp_path)) == ["consolidated.pt", "index.pt", "rank-00000.pt", "rank-00001.pt"]


# ---------------------------------------------------------------------------------------------
# 6 and 7: the data loader's arguments; grid.group of a size-1 axis
# ---------------------------------------------------------------------------------------------


def _loader_and_groups(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    import engine

    out: dict[str, Any] = {}
    grid = engine.init(1, 2)  # AxoNN's positional order: G_inter=1, G_data=2
    out["degrees"] = dict(grid.degrees)
    ds = TensorDataset(torch.arange(10).float())
    for key, call in (("mb0", lambda: engine.create_dataloader(ds, 4, 0)),
                      ("too_large", lambda: engine.create_dataloader(ds, 16)),
                      ("workers", lambda: engine.create_dataloader(ds, 4, 1, -1)),
                      ("gbs", lambda: engine.create_dataloader(ds, 0))):
        try:
            call()
        except ValueError as exc:
            out[key] = str(exc)
    loader = engine.create_dataloader(ds, 4, 2, 0)  # AxoNN's positional order: micro_batch_size, num_workers
    out["batches"] = [b[0].tolist() for b in loader]
    out["mb"] = loader.micro_batch_size
    depth = grid.group("depth")
    out["depth_ranks"] = dist.get_process_group_ranks(depth)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=depth)
    out["depth_sum"] = float(t)
    return out


def test_dataloader_arguments_and_size_one_groups():
    results = launch(_loader_and_groups, world_size=2, timeout_s=60)
    for rank, r in enumerate(results):
        assert r["degrees"] == {"data": 2, "inter": 1, "depth": 1, "row": 1, "col": 1, "cp": 1}
        assert r["mb0"] == "micro_batch_size must be a positive integer, got 0"
        assert r["too_large"].startswith("global_batch_size=16 is larger than the dataset (10 samples)")
        assert r["workers"] == "num_workers must be a non-negative integer, got -1"
        assert r["gbs"] == "global_batch_size must be a positive integer, got 0"
        assert r["mb"] == 2
        assert r["batches"] == [[float(rank), float(rank + 2)], [float(rank + 4), float(rank + 6)]]
        assert r["depth_ranks"] == [rank]
        assert r["depth_sum"] == rank + 1  # not the sum over the world


# ---------------------------------------------------------------------------------------------
# 8. engine.train runs zero_stage=1, 2, 3 (also pipelined) and recompute="full" (same losses as without)
# ---------------------------------------------------------------------------------------------


def _train_plan(rank: int, world: int, plan: Plan) -> Any:
    from engine.train import stdlib_text_dataset, train

    cfg = config()
    cfg = type(cfg)(num_layers=2, hidden_size=32, num_attention_heads=8, seq_length=8, vocab_size=256)
    return train(cfg, stdlib_text_dataset(cfg.seq_length, 50_000), 8, 4, plan=plan, warmup_steps=1,
                 progress=False, record=False, use_calibrated=False, max_grad_norm=0.5)


def test_train_runs_zero1_and_full_recompute():
    base = launch(_train_plan, 2, args=(Plan(G_data=2, micro_batch_size=2),), timeout_s=120)[0]
    both = launch(_train_plan, 2, args=(Plan(G_data=2, micro_batch_size=2, zero_stage=1, recompute="full"),),
                  timeout_s=120)[0]
    assert both.plan.zero_stage == 1 and both.plan.recompute == "full"
    assert both.losses == pytest.approx(base.losses, rel=1e-5)
    assert len(both.memory) == 2 and all(m.peak_rss_bytes > 0 for m in both.memory)
    for stage in (2, 3):
        zero_plan = Plan(G_data=2, micro_batch_size=2, zero_stage=stage, recompute="full")
        z = launch(_train_plan, 2, args=(zero_plan,), timeout_s=120)[0]
        assert z.plan.zero_stage == stage
        assert z.losses == pytest.approx(base.losses, rel=1e-5), stage
    # ZeRO-3 under a pipeline (each stage gathered once per step): the same losses
    piped = launch(_train_plan, 4, args=(Plan(G_data=2, G_inter=2, micro_batch_size=1, zero_stage=3),),
                   timeout_s=120)[0]
    assert piped.plan.zero_stage == 3 and piped.plan.G_inter == 2
    assert piped.losses == pytest.approx(base.losses, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# 9. resume restores the LR scheduler, the RNG state and the optimizer's param groups
# ---------------------------------------------------------------------------------------------

SAVE_AT = 2


def _resume(rank: int, world: int, path: str, mode: str) -> dict[str, Any]:
    import engine

    grid = engine.init(G_data=2)
    torch.manual_seed(0 if mode == "save" else 99)
    model = engine.ParallelGPT(config(), grid)
    opt = make_optimizer(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    # the loader's iterator draws its base seed from the RNG: start it before loading, as a resumed
    # job's RNG must continue from the saved state
    batches_it = iter(engine.create_dataloader(TensorDataset(*batches(config())), GLOBAL_BATCH))
    start = 0
    if mode == "resume":
        start = engine.load_checkpoint(path, model, opt, scheduler=sched)
    losses, lrs, wds, noise = {}, {}, {}, {}
    for step, (tok, tgt) in enumerate(batches_it):
        if step < start:
            continue
        lrs[step] = opt.param_groups[0]["lr"]
        wds[step] = opt.param_groups[0]["weight_decay"]
        noise[step] = float(torch.rand(()))  # the RNG stream (dropout, sampling) continues
        opt.zero_grad()
        losses[step] = engine.forward_backward(model, tok, tgt)
        engine.step(model, opt)
        sched.step()
        if mode == "save" and step + 1 == SAVE_AT:
            opt.param_groups[0]["weight_decay"] = 0.05  # changed by the user mid-run
            engine.save_checkpoint(path, model, opt, step=SAVE_AT, scheduler=sched)
    return {"losses": losses, "lrs": lrs, "wds": wds, "noise": noise, "state": engine.full_state_dict(model)}


def test_resume_restores_scheduler_rng_and_param_groups(tmp_path):
    path = str(tmp_path)
    saved = launch(_resume, world_size=2, args=(path, "save"), timeout_s=60)
    resumed = launch(_resume, world_size=2, args=(path, "resume"), timeout_s=60)
    for a, b in zip(saved, resumed):
        for step in range(SAVE_AT, STEPS):
            assert b["lrs"][step] == a["lrs"][step] == LR * 0.5 ** step
            assert b["wds"][step] == a["wds"][step] == 0.05
            assert b["noise"][step] == a["noise"][step]
            assert b["losses"][step] == pytest.approx(a["losses"][step], rel=1e-6)
        for name, value in a["state"].items():
            assert (b["state"][name] - value).abs().max().item() <= 1e-6, name


# ---------------------------------------------------------------------------------------------
# Issue 14 item 17: the progress bar shows the global loss, as the summary does
# ---------------------------------------------------------------------------------------------


def _progress_loss(rank: int, world: int) -> Any:
    import engine
    from engine.train import _global_loss

    engine.init(G_data=world)
    mine = None if rank == 2 else float(rank + 1)  # a rank without a loss (a non-last pipeline stage)
    return _global_loss(mine, torch.device("cpu"))


def test_the_progress_line_shows_the_mean_loss_over_ranks_not_rank_zeros():
    # ranks 0, 1, 3 hold losses 1, 2, 4: the summary's mean is 7/3, rank 0 alone would say 1
    results = launch(_progress_loss, world_size=4, timeout_s=60)
    assert all(r == pytest.approx(7.0 / 3.0) for r in results)
