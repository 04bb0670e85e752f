"""CPU offload choices of ZeRO (engine.zero.offload_mode): "optimizer" (the optimizer's shards,
their gradients and its state in host memory, DeepSpeed's offload_optimizer) and "params" (the
parameter shards too, ZeRO-3 only: DeepSpeed's offload_param, FSDP's CPUOffload(offload_params=True)).

On 2 data ranks each choice trains exactly as one process (1e-5); where the tensors live is checked
through the optimizers' bookkeeping (`placement()`, and under ZeRO-3 whether the gathers read a
device copy of the shard or the host shard itself): on a CPU-only machine the device is the CPU.
Bad values raise ValueError naming the argument and value before any process group exists.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_offload.py -q
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.engine.harness import assert_trains_as_one_process, run_grid

DATA2 = {"data": 2, "inter": 1, "depth": 1, "row": 1, "col": 1}
CPU = torch.device("cpu")
CASES = [(1, "optimizer"), (2, "optimizer"), (3, "optimizer"), (3, "params"), (3, None), (2, True)]


@pytest.mark.parametrize(("stage", "offload"), CASES, ids=[f"z{s}-{o}" for s, o in CASES])
def test_offload_choice_trains_as_one_process(stage, offload):
    results = run_grid(DATA2, {"zero_stage": stage, "offload": offload, "micro_batch_size": 2})
    assert_trains_as_one_process(results, DATA2)
    mode = {True: "params" if stage == 3 else "optimizer"}.get(offload, offload)
    for r in results:
        assert r["offload"] == mode
        where = r["placement"]
        if mode is not None:  # the optimizer's side is in host memory for both choices
            assert where["grad_shards"] == where["optimizer_state"] == CPU, where
        if stage == 3:
            # "optimizer": the gathers read a device copy of each shard, refreshed after every step
            # (training equal to one process proves the refresh); "params" or no offload: the
            # optimizer's own shard, in host memory only under "params"
            assert r["separate_local"] == [mode == "optimizer"] * len(r["separate_local"])
            assert where["optimizer_shards"] == (CPU if mode else where["gathered"])
            assert where["param_shards"] == (CPU if mode == "params" else where["gathered"])
        else:
            assert where["param_shards"] == (CPU if mode else where["params"])


@pytest.mark.parametrize("bad", ["gpu", "cpu", 1, 0, "Params"])
def test_bad_offload_values_raise_before_any_collective(bad):
    import torch.distributed as dist

    import engine
    from engine.train import train
    from perfmodels.specs import Plan

    assert not dist.is_initialized()
    net = nn.Linear(4, 4)
    for build in (lambda: engine.ZeroOptimizer(net, torch.optim.SGD, offload=bad, lr=0.1),
                  lambda: engine.Zero3(net, torch.optim.SGD, offload=bad, lr=0.1),
                  lambda: train(net, [], 2, 3, plan=Plan(zero_stage=3), offload=bad)):
        with pytest.raises(ValueError, match=rf"offload must be .* got {bad!r}"):
            build()
    assert not dist.is_initialized()


def test_params_offload_needs_zero3():
    import torch.distributed as dist

    import engine
    from engine.train import train
    from perfmodels.specs import Plan

    with pytest.raises(ValueError, match="offload='params' needs ZeRO-3"):
        engine.ZeroOptimizer(nn.Linear(4, 4), torch.optim.SGD, stage=2, offload="params", lr=0.1)
    with pytest.raises(ValueError, match="offload='params' needs ZeRO-3"):
        train(nn.Linear(4, 4), [], 2, 3, plan=Plan(zero_stage=2), offload="params")
    assert not dist.is_initialized()


def test_cli_train_offload_params_runs_zero3_and_refuses_zero2(capsys):
    import json

    from cli import main

    common = ["train", "--nproc", "2", "--steps", "3", "--warmup", "1", "--layers", "1", "--hidden", "16",
              "--heads", "2", "--seq", "8", "--global-batch-size", "4", "--no-store", "--json",
              "--offload", "params"]
    assert main([*common, "--plan", "G_data=2,zero_stage=3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["zero_stage"] == 3
    assert main([*common, "--plan", "G_data=2,zero_stage=2"]) != 0  # refused before forking
    assert "--offload params needs zero_stage=3 in --plan, got zero_stage=2" in capsys.readouterr().err
