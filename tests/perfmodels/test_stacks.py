"""The training stack as an input: presets, overrides, and the physics each stack switches.

Run: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/perfmodels/test_stacks.py`.
"""

from __future__ import annotations

import dataclasses

import pytest

import tuner
from perfmodels import Plan, Training, predict, presets, stacks
from perfmodels.plans import from_plans
from perfmodels.traffic import comm_events


def test_every_preset_named_in_the_contract_exists_and_the_default_is_our_engine():
    for name in ("megatron-lm", "megatron-core", "megatron-deepspeed", "deepspeed", "fsdp", "torchtitan",
                 "gridtune"):
        assert stacks.preset(name).name == name
    assert Training(global_batch_size=8).effective_stack.name == "gridtune"


def test_overrides_one_by_one_and_errors_that_name_the_field():
    t = Training(global_batch_size=8, stack="megatron-core", overlap_grad_reduce=False)
    assert t.effective_stack.overlap_grad_reduce is False
    assert t.effective_stack.flash_attention is True  # everything else as the preset
    # replacing the stack keeps the explicit override and drops the old preset
    t2 = dataclasses.replace(t, stack="fsdp")
    assert t2.effective_stack.name == "fsdp" and t2.effective_stack.overlap_grad_reduce is False
    with pytest.raises(ValueError, match=r"training.stack must be one of .* got 'nemo-9'"):
        Training(global_batch_size=8, stack="nemo-9")
    with pytest.raises(ValueError, match="unknown stack option"):
        stacks.preset("fsdp", overlap_everything=True)
    with pytest.raises(ValueError, match=r"training\.flash_attention must be true, false or null, got 'yes'"):
        Training(global_batch_size=8, flash_attention="yes")  # type: ignore[arg-type]


def test_additive_host_cost_matches_a_hand_computation():
    """With host_exposed_fraction f, a micro-batch takes max(gpu + f * host, host), where host is
    (forward + 2 x backward [+ recompute]) passes x (blocks + head) x host_us_per_block."""
    model = presets.model("gpt3-1.7b")
    cluster = presets.cluster("selene", 8)
    plan = Plan(G_intra_r=8, micro_batch_size=1)  # small GEMMs at TP 8: host cost matters
    base = Training(global_batch_size=4, stack="megatron-core", host_us_per_block=300.0)
    floor = predict(model, cluster, dataclasses.replace(base, host_exposed_fraction=0.0), plan)
    added = predict(model, cluster, dataclasses.replace(base, host_exposed_fraction=1.0), plan)
    m, host_mb = 4, 3 * (model.num_layers + 1) * 300e-6
    gpu_mb = (floor.iteration_time_s - floor.breakdown.host_wait_s - floor.breakdown.optimizer_s
              - floor.breakdown.dp_comm_s) / m
    assert host_mb < gpu_mb  # the floor does not bind here, so only the additive part shows
    assert added.iteration_time_s - floor.iteration_time_s == pytest.approx(m * host_mb, rel=1e-6)


def test_fp8_runs_linears_in_fp8_and_attention_in_bf16():
    """FP8 speeds the linear GEMMs only: attention time is the bf16 one in both runs."""
    model, cluster = presets.model("llama3-70b"), presets.cluster("eos", 64)
    plan = Plan(G_intra_r=8, G_inter=8, micro_batch_size=1)
    bf16 = predict(model, cluster, Training(global_batch_size=64, dtype="bf16", stack="megatron-core"), plan)
    fp8 = predict(model, cluster, Training(global_batch_size=64, dtype="fp8", stack="megatron-core"), plan)
    assert fp8.breakdown.attention_s == pytest.approx(bf16.breakdown.attention_s)
    assert fp8.breakdown.gemm_s < 0.75 * bf16.breakdown.gemm_s
    fp8_attn = predict(model, cluster, Training(global_batch_size=64, dtype="fp8", attention_dtype="fp32",
                                                stack="megatron-core"), plan)
    assert fp8_attn.breakdown.attention_s > 5 * bf16.breakdown.attention_s  # fp32 peak is ~15x lower


def test_flash_backward_is_slower_per_flop_than_forward():
    """Causal flash attention: forward 2 x 2 b s^2 d a / 2 FLOPs at flash_fwd_efficiency, backward
    2.5 x that at flash_bwd_efficiency (H100 preset: 0.45 / 0.40 of the bf16 peak)."""
    model, cluster = presets.model("gpt3-1.7b"), presets.cluster("eos", 1)
    gpu = cluster.gpu
    training = Training(global_batch_size=1, stack="megatron-core", host_us_per_block=0.0)
    from perfmodels.compute import stage_compute
    from perfmodels.traffic import stage_shape

    arrays = from_plans([Plan(micro_batch_size=1)])
    comp = stage_compute(model, cluster, training, arrays, stage_shape(model.num_layers, arrays))
    flops = 4.0 * model.seq_length ** 2 * model.hidden_size * 0.5
    peak = gpu.peak_tflops("bf16") * 1e12
    fwd = flops / (peak * gpu.flash_fwd_efficiency)
    assert comp.attention_fwd_s[0] == pytest.approx(model.num_layers * (fwd + 4e-6), rel=1e-6)


def test_zero2_reduces_once_per_step_on_megatron_core_and_per_micro_batch_on_deepspeed():
    """GPT-3 175B on 128 H100s, TP4 PP8 interleaved: NeMo measured 8.9 s with its ZeRO-2 (Apex
    DistributedFusedAdam), which reduce-scatters once per step behind the last backward; DeepSpeed's
    ZeRO-2 reduce-scatters every micro-batch."""
    model, cluster = presets.model("gpt3-175b"), presets.cluster("eos", 128)
    plan = Plan(G_data=4, G_inter=8, G_intra_r=4, micro_batch_size=1, schedule="interleaved-1f1b",
                virtual_stages=12, zero_stage=2, sequence_parallel=True)
    mc = Training(global_batch_size=256, stack="megatron-core")
    ds = dataclasses.replace(mc, stack=stacks.preset("megatron-core", zero2_grad_reduce="per_microbatch"))
    m = 256 // 4
    calls = {t.effective_stack.zero2_grad_reduce: sum(
        float(ev.calls[0]) for ev in comm_events(model, t, from_plans([plan]))
        if ev.axis == "data" and ev.op == "reduce_scatter") for t in (mc, ds)}
    assert calls == {"per_step": 1.0, "per_microbatch": float(m)}
    z1 = predict(model, cluster, mc, dataclasses.replace(plan, zero_stage=1)).iteration_time_s
    z2 = predict(model, cluster, mc, plan).iteration_time_s
    assert z2 == pytest.approx(z1, rel=0.02)  # same traffic and overlap as the distributed optimizer


def test_fsdp_under_a_pipeline_gathers_once_per_step_per_stage():
    model = presets.model("gpt3-1.7b")
    plan = Plan(G_data=4, G_inter=2, micro_batch_size=1, zero_stage=3)
    training = Training(global_batch_size=64, stack="torchtitan")
    ev = [e for e in comm_events(model, training, from_plans([plan])) if e.tag == "zero3"]
    gathers = sum(float(e.calls[0]) for e in ev if e.op == "all_gather")
    units = model.num_layers // 2 + 1  # blocks of the busiest (last) stage + its head unit
    assert gathers == units  # forward only, once per step (m = 16 micro-batches)
    flat = dataclasses.replace(plan, G_inter=1, G_data=8)
    ev1 = [e for e in comm_events(model, training, from_plans([flat])) if e.tag == "zero3"]
    m1 = 64 // 8
    assert sum(float(e.calls[0]) for e in ev1 if e.op == "all_gather") == 2 * m1 * (model.num_layers + 2)


def test_uneven_virtual_stage_split_is_allowed_and_costs_the_busiest_stage():
    """126 layers over 8 stages x 8 virtual chunks (64 chunks) do not divide: the busiest stage holds
    ceil(126 / 64) = 2 blocks per chunk, 16 in all, like a stage of an even 128-layer split."""
    model = presets.model("llama3-405b")
    assert model.num_layers == 126
    cluster = presets.cluster("eos", 512)
    training = Training(global_batch_size=64, stack="megatron-core")
    plan = Plan(
        G_data=1,
        G_inter=8,
        G_intra_r=8,
        G_intra_c=1,
        micro_batch_size=1,
        schedule="interleaved-1f1b",
        virtual_stages=8,
    )
    cluster = cluster.with_gpus(64)
    pred = predict(model, cluster, training, plan)
    even = predict(dataclasses.replace(model, num_layers=128), cluster, training, plan)
    assert pred.breakdown.compute_s == pytest.approx(even.breakdown.compute_s, rel=1e-9)


def test_recommend_with_a_stack_ranks_only_what_that_stack_runs():
    model, cluster = presets.model("gpt3-1.7b"), presets.cluster("selene", 16)
    rec = tuner.recommend(model, cluster, Training(global_batch_size=64, stack="fsdp"), top_k=5)
    plans = [c.plan for c in rec.candidates]
    assert plans and all(p.G_intra_r == p.G_inter == 1 and p.zero_stage in (0, 2, 3) for p in plans)
    assert any("fsdp stack does not run" in reason for reason in rec.pruned)
    mg = tuner.recommend(model, cluster, Training(global_batch_size=64, stack="gridtune"), top_k=50)
    # the engine runs ZeRO-2 since issue 13 (engine.ZeroOptimizer(stage=2)); ZeRO-3 (engine.Zero3,
    # G_inter = G_intra_d = 1 only) is not offered to the gridtune stack's search yet
    assert all(c.plan.zero_stage in (0, 1, 2) and not c.plan.sequence_parallel for c in mg.candidates)


def test_gridtune_prefetches_depth_communication_as_its_engine_does():
    """engine.linear prefetches the depth all-gathers and runs the weight-grad reduce-scatters
    asynchronously (engine.prefetch_depth, tests/engine/test_depth_prefetch.py), so the gridtune
    preset says overlap_depth_comm=True. Hand-derived from steptime: the depth seconds D are exposed
    as max(D - PREFETCH_COVER * compute, D / m * FIRST_GATHER_SHARE) instead of D, with
    PREFETCH_COVER = 0.8 and FIRST_GATHER_SHARE = 0.05 (G_inter = 1: nothing else changes)."""
    assert stacks.preset("gridtune").overlap_depth_comm is True
    model = presets.model("gpt3-1.7b")
    cluster = presets.cluster("eos", 16)
    plan = Plan(G_data=2, G_intra_d=4, G_intra_r=2, micro_batch_size=1)
    on = predict(model, cluster, Training(global_batch_size=16), plan)
    off = predict(model, cluster, Training(global_batch_size=16, overlap_depth_comm=False), plan)
    m = 16 // (2 * 4)
    depth, compute = off.breakdown.tp_comm_depth_s, off.breakdown.compute_s
    assert depth > 0
    hidden = depth - max(depth - 0.8 * compute, depth / m * 0.05)
    assert off.breakdown.exposed_comm_s - on.breakdown.exposed_comm_s == pytest.approx(hidden, rel=1e-9)
