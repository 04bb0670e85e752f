"""engine.microbench: group planning (pure) and real sweeps on 2 and 4 forked gloo ranks (tiny sizes)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from engine.launch import launch
from engine.microbench import SweepConfig, group_level, model_gemm_shapes, plan_groups, run_profile
from perfmodels import fitting


def test_plan_groups_single_node_is_all_intra():
    specs = plan_groups(4, [0, 0, 0, 0])
    assert [(s.size, s.level, s.members_per_node) for s in specs] == [(2, "intra", 2), (4, "intra", 4)]
    assert specs[0].groups == ((0, 1), (2, 3))


def test_plan_groups_covers_cross_node_placements():
    nodes = [r // 8 for r in range(16)]  # 2 nodes of 8
    keys = {(s.size, s.level, s.members_per_node) for s in plan_groups(16, nodes)}
    assert {(2, "intra", 2), (2, "inter", 1), (8, "intra", 8), (8, "inter", 4), (16, "inter", 8)} <= keys
    spec = next(s for s in plan_groups(16, nodes, [2]) if s.level == "inter")
    assert spec.stride == 8 and spec.groups[0] == (0, 8)
    assert all(group_level(g, nodes) == ("inter", 1) for g in spec.groups)


def _tiny(**kw) -> SweepConfig:
    return replace(SweepConfig.make(quick=True, progress=False), min_bytes=4096, max_bytes=16384, trials=2,
                   warmup=1, target_trial_s=0.001, max_iters=4,
                   gemm_shapes=((32, 32, 32), (64, 32, 16), (16, 64, 64)),
                   copy_bytes=(1 << 20,), **kw)


def test_two_rank_sweep_rows():
    out = launch(run_profile, 2, args=(_tiny(),), timeout_s=60)
    assert out[0] is not None
    df = pd.DataFrame(out[0]["rows"])
    coll = df[df["op"].isin(fitting.OPS)]
    assert set(coll["op"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert set(coll["bytes"]) == {4096, 8192, 16384}
    assert len(coll) == 5 * 3 * 2  # ops x sizes x trials
    assert set(coll["group_size"]) == {2} and set(coll["level"]) == {"intra"}
    assert (df["seconds"] > 0).all()
    assert set(df[df["op"] == "gemm"]["m"]) == {32, 64, 16}
    copy = df[df["op"] == "copy"]
    assert set(copy["bytes"]) == {2 << 20} and len(copy) == 2
    prov = out[0]["provenance"]
    assert prov["backend"] == "gloo" and prov["world_size"] == 2 and prov["nccl_version"] == ""
    assert set(fitting.RAW_COLUMNS) <= set(df.columns)
    fits, _ = fitting.fit_collectives(df)
    assert len(fits) == 5 and (fits["busbw_GBps"] > 0).all()


def test_four_ranks_with_emulated_nodes_measure_both_levels():
    cfg = _tiny(ops=("all_reduce", "send_recv"), gpus_per_node=2)
    cfg = replace(cfg, gemm_shapes=(), copy_bytes=(), max_bytes=8192)
    res = launch(run_profile, 4, args=(cfg,), timeout_s=60)
    assert res[1] is None and res[2] is None
    df = pd.DataFrame(res[0]["rows"])
    columns = df[["op", "group_size", "level", "members_per_node"]]
    keys = set(map(tuple, columns.drop_duplicates().to_numpy()))
    assert keys == {("all_reduce", 2, "intra", 2), ("all_reduce", 2, "inter", 1),
                    ("all_reduce", 4, "inter", 2), ("send_recv", 2, "intra", 2), ("send_recv", 2, "inter", 1)}
    assert res[0]["provenance"]["emulated_nodes"] is True


def test_config_validation():
    with pytest.raises(ValueError, match="unknown collective"):
        SweepConfig.make(ops=["allreduce"])
    with pytest.raises(ValueError, match="max-bytes"):
        SweepConfig.make(max_bytes=100)
    assert SweepConfig.make(device="cuda:0").gemm_dtype == "bfloat16"


def test_model_gemm_shapes_follow_tensor_parallel_shards():
    from perfmodels import presets

    tiny = presets.model("tiny-gpt")  # h=64, ffn=256, seq=32
    shapes = set(model_gemm_shapes(tiny, splits=(1, 2)))
    assert {(32, 192, 64), (32, 96, 64), (32, 64, 32), (32, 128, 64), (32, 64, 256), (32, 64, 128)} <= shapes
    assert {(192, 64, 32), (96, 64, 32), (64, 128, 32)} <= shapes  # weight gradients
    assert all(m > 0 and n > 0 and k > 0 for m, n, k in shapes)
    llama = presets.model("llama3-8b")  # GQA + SwiGLU: fused QKV 4096+2*1024, fused up/gate 2*14336
    big = set(model_gemm_shapes(llama, tokens=8, splits=(1,)))
    assert (8, 4096 + 2 * 1024, 4096) in big and (8, 2 * 14336, 4096) in big
