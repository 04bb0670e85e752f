"""Every named constant of the step-time and memory models is pinned by a hand-derived case here.

The expected values are written out as literals (never imported from the module under test), so
changing a constant without changing the physics it documents fails a test; `bench/mutation_check.py`
mutates each one and reports which tests catch it. Golden published rows live in test_golden.py.

Run: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/perfmodels/test_constants.py`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfmodels import Plan, Training, predict, presets, stacks
from perfmodels.compute import gemm_curve, gemm_time_s, stage_compute
from perfmodels.memory import GIB, activation_bytes_per_layer
from perfmodels.plans import from_plans
from perfmodels.traffic import stage_shape

H100 = presets.cluster("eos", 8)
A100 = presets.cluster("selene", 8)


def _compute(model, cluster, training, plan):
    arrays = from_plans([plan])
    return stage_compute(model, cluster, training, arrays, stage_shape(model.num_layers, arrays))


def test_gemm_curve_on_hopper_by_hand():
    """t = 2mnk / (R * shape) + 4 us with R = 989 x 0.62 TFLOP/s and shape = 1/(1 + 56/m + 56/n + 56/k)."""
    curve = gemm_curve(H100, Training(global_batch_size=1, dtype="bf16"))
    m, n, k = 2048.0, 9216.0, 12288.0
    shape = 1.0 / (1.0 + 56 / m + 56 / n + 56 / k)
    expected = 2 * m * n * k / (989e12 * 0.62 * shape) + 4e-6
    assert gemm_time_s(np.array([m]), np.array([n]), np.array([k]), curve)[0] == pytest.approx(
        expected, rel=1e-9
    )
    fp8 = gemm_curve(H100, Training(global_batch_size=1, dtype="fp8"))
    assert fp8.tflops_max == pytest.approx(1979 * 0.50)
    assert gemm_curve(A100, Training(global_batch_size=1)).tflops_max == pytest.approx(312 * 0.80)


def test_flash_backward_efficiency_on_hopper():
    """Backward does 2.5x the forward FLOPs at 0.40 of peak (forward: 0.45), as measured on an H100."""
    model = presets.model("gpt3-1.7b")
    training = Training(global_batch_size=1, stack="megatron-core", host_us_per_block=0.0)
    comp = _compute(model, presets.cluster("eos", 1), training, Plan(micro_batch_size=1))
    flops = 4.0 * model.seq_length ** 2 * model.hidden_size * 0.5
    fwd, bwd = flops / (989e12 * 0.45) + 4e-6, 2.5 * flops / (989e12 * 0.40) + 4e-6
    blocks = model.num_layers
    assert comp.attention_fwd_s[0] == pytest.approx(blocks * fwd, rel=1e-9)
    # bwd = 2 x GEMMs + attention backward + 2 x memory-bound per block; the head's backward is two
    # GEMMs and one pass over its logits
    head_mem = model.seq_length * model.vocab_size * 4.0 * 3.0 / (3350e9 * 0.8)
    expected_bwd = 2 * comp.gemm_fwd_s[0] + blocks * bwd + 2 * comp.memory_fwd_s[0] - head_mem
    assert comp.bwd_s[0] == pytest.approx(expected_bwd, rel=1e-6)


def test_host_default_is_900_us_per_block_forward_on_nvidia():
    model = presets.model("gpt2-small")
    training = Training(global_batch_size=8, stack="megatron-lm")  # host cost: the device default
    plan = Plan(G_intra_r=4, G_data=2, micro_batch_size=1)  # tiny shards: host-bound
    pred = predict(model, H100, training, plan)
    host_step = 4 * 3 * (model.num_layers + 1) * 900e-6  # 4 micro-batches x (fwd + 2 bwd) passes
    b = pred.breakdown
    assert b.host_wait_s > 0
    assert pred.iteration_time_s - b.optimizer_s - b.dp_comm_s == pytest.approx(host_step, rel=1e-6)


def test_an_exposed_host_fraction_adds_that_share_of_the_host_time():
    """host_exposed_fraction f adds f x (passes x blocks x host per block) where the floor does not
    bind; no preset sets it (the published data do not support it), so it is set here by hand."""
    assert all(s.host_exposed_fraction == 0.0 for s in stacks.STACK_PRESETS.values())
    model = presets.model("gpt3-1.7b")
    plan = Plan(G_data=8, micro_batch_size=4)  # big blocks: the GPU outruns no host, the floor is idle
    t = Training(global_batch_size=128, dtype="fp16", stack="megatron-deepspeed", host_exposed_fraction=0.5)
    with_host = predict(model, A100, t, plan).iteration_time_s
    floor_only = predict(
        model, A100, dataclasses.replace(t, host_exposed_fraction=0.0), plan
    ).iteration_time_s
    assert with_host - floor_only == pytest.approx(0.5 * 4 * 3 * (model.num_layers + 1) * 900e-6, rel=1e-6)


def test_overlapped_gradient_reduction_leaves_a_tenth_exposed():
    """A data-parallel all-reduce smaller than the backward window leaves 10% (the last bucket)."""
    model = presets.model("gpt2-small")
    training = Training(global_batch_size=512, stack="megatron-core", host_us_per_block=0.0)
    pred = predict(model, A100, training, Plan(G_data=8, micro_batch_size=8))
    b = pred.breakdown
    assert b.exposed_comm_s == pytest.approx(0.1 * b.dp_comm_s, rel=1e-9)


def test_prefetched_zero3_exposure_cover_and_first_gather():
    """Prefetched ZeRO-3 collectives: exposed = max(total - 0.8 x compute, total / m x 0.05)."""
    model = presets.model("gpt3-1.7b")
    training = Training(global_batch_size=64, stack="fsdp", host_us_per_block=0.0)
    # a long compute window: only the first gather's 5% share of one micro-batch is exposed
    pred = predict(model, A100, training, Plan(G_data=8, micro_batch_size=1, zero_stage=3))
    b = pred.breakdown
    m = 64 // 8
    assert b.exposed_comm_s == pytest.approx(b.dp_comm_s / m * 0.05, rel=1e-6)
    # a network so slow that compute cannot cover: total - 0.8 x compute
    slow = dataclasses.replace(A100, inter_node_bandwidth_GBps=0.05, intra_node_bandwidth_GBps=0.05)
    p2 = predict(model, slow, training, Plan(G_data=8, micro_batch_size=1, zero_stage=3)).breakdown
    assert p2.exposed_comm_s == pytest.approx(p2.dp_comm_s - 0.8 * p2.compute_s, rel=1e-6)


def test_fp8_casts_stream_three_bytes_per_linear_input_and_gradient():
    model = presets.model("gpt3-1.7b")
    t16 = Training(global_batch_size=1, dtype="bf16", stack="megatron-core")
    t8 = Training(global_batch_size=1, dtype="fp8", stack="megatron-core")
    plan = Plan(micro_batch_size=1)
    c16, c8 = _compute(model, H100, t16, plan), _compute(model, H100, t8, plan)
    h, f, T = model.hidden_size, model.ffn_hidden_size, model.seq_length
    inputs = T * (2 * h + h + f)
    rate = 3350e9 * 0.8
    assert c8.memory_fwd_s[0] - c16.memory_fwd_s[0] == pytest.approx(
        model.num_layers * inputs * 3.0 / rate, rel=1e-9
    )


def test_per_op_selective_recompute_repeats_half_the_matmuls_and_keeps_half_the_activations():
    model = presets.model("gpt3-1.7b")
    tt = Training(global_batch_size=1, stack="torchtitan")
    plan = Plan(micro_batch_size=1, recompute="selective")
    comp = _compute(model, A100, tt, plan)
    blocks = model.num_layers
    T, V, h = model.seq_length, model.vocab_size, model.hidden_size
    curve = gemm_curve(A100, tt)
    head_gemm = gemm_time_s(np.array([T]), np.array([V]), np.array([h]), curve)[0]
    head_mem = T * V * 12.0 / (2039e9 * 0.8)
    gemm_block = (comp.gemm_fwd_s[0] - head_gemm) / blocks
    mem_block = (comp.memory_fwd_s[0] - head_mem) / blocks
    assert comp.recompute_s[0] == pytest.approx(blocks * (mem_block + 0.5 * gemm_block), rel=1e-9)
    arrays = from_plans([plan])
    sel = activation_bytes_per_layer(model, tt, arrays)[0]
    full = activation_bytes_per_layer(model, tt, from_plans([dataclasses.replace(plan, recompute="none")]))[0]
    assert sel == pytest.approx(0.5 * full)


def test_adam_step_streams_thirty_bytes_per_parameter_fused_and_94_in_torch_foreach():
    """A fused Adam (Megatron, Apex) streams ~30 bytes per local parameter; PyTorch's foreach AdamW,
    which the engine uses, ~94 (measured on an H100 by scripts/gpu_check.sh)."""
    model = presets.model("gpt3-1.7b")
    local = model.num_layers * model.params_per_layer + model.vocab_size * model.hidden_size * 2
    for stack, per_param in (("megatron-core", 30.0), ("gridtune", 94.0)):
        comp = _compute(model, A100, Training(global_batch_size=1, stack=stack), Plan(micro_batch_size=1))
        assert comp.optimizer_s[0] == pytest.approx(local * per_param / (2039e9 * 0.8), rel=0.01)


def test_gridtune_host_and_layout_conversion_costs_grow_with_split_axes():
    """The engine's blocks cost the host 0.6 ms per forward on GPUs (2/3 of the 0.9 ms default), +20%
    with a row split, +60% col, +30% depth; each split axis adds the block's element-wise traffic once
    more. Measured on one H100 (scripts/gpu_check.sh)."""
    model = presets.model("gpt2-small")
    # the step below is host + optimizer + the whole data-parallel reduction: pinned to the reduction
    # after backward, since the engine now overlaps it (gridtune's overlap_grad_reduce=True hides part
    # of dp_comm behind the backward, which is not what this test measures)
    training = Training(global_batch_size=4, stack="gridtune", overlap_grad_reduce=False)
    h100 = presets.cluster("eos", 4)
    base = predict(model, h100, training, Plan(G_data=4, micro_batch_size=1))
    col = predict(model, h100, training, Plan(G_data=2, G_intra_c=2, micro_batch_size=1))
    host = 3 * (model.num_layers + 1) * 600e-6  # per micro-batch, host-bound
    assert base.iteration_time_s - base.breakdown.optimizer_s - base.breakdown.dp_comm_s == pytest.approx(
        1 * host, rel=1e-6)  # one micro-batch per data replica
    m_col = 2
    b = col.breakdown
    assert b.host_wait_s > 0  # host-bound: the step is the host time, 1.6x for the col split
    assert col.iteration_time_s - b.optimizer_s - b.dp_comm_s == pytest.approx(m_col * host * 1.6, rel=1e-6)
    arrays = from_plans([Plan(G_intra_c=2, G_intra_d=2, micro_batch_size=1)])
    plain = from_plans([Plan(micro_batch_size=1)])
    two = stage_compute(model, H100, training, arrays, stage_shape(model.num_layers, arrays))
    one = stage_compute(model, H100, training, plain, stage_shape(model.num_layers, plain))
    assert two.memory_fwd_s[0] > 2.0 * one.memory_fwd_s[0] / 2  # tripled traffic on half-size shards


@pytest.mark.parametrize(("stack", "context", "per_comm", "frag"), [
    ("megatron-core", 0.9, 0.15, 0.05), ("fsdp", 0.9, 0.15, 0.05), ("gridtune", 0.9, 0.15, 0.05)])
def test_memory_overheads_context_nccl_buffers_and_fragmentation(stack, context, per_comm, frag):
    """CUDA context + workspaces 0.9 GiB; 0.15 GiB of NCCL buffers per communicator (axis with peers);
    5% of the activations for allocator slack."""
    model = presets.model("gpt3-1.7b")
    mem = predict(model, A100, Training(global_batch_size=64, stack=stack),
                  Plan(G_data=4, G_intra_r=2, micro_batch_size=1)).memory
    assert mem.comm_buffers_gib == pytest.approx(2 * per_comm)
    assert mem.overhead_gib == pytest.approx(context + frag * mem.activations_gib)
    assert mem.per_gpu_gib * GIB > 0


def test_fp8_weight_cache_is_two_bytes_per_linear_parameter():
    assert stacks.preset("megatron-core").fp8_weight_cache_bytes == 2.0
    # FSDP stacks cast the gathered weights per use and cache nothing between micro-batches
    for name in ("torchtitan", "fsdp"):
        assert stacks.preset(name).fp8_weight_cache_bytes == 0.0


def test_unfused_attention_and_residual_element_passes_by_hand():
    """Memory-bound forward time of a block with unfused attention: (12 passes over the residual
    stream + the activation function + q/k/v bias) plus 4.5 passes over the scores, in 16-bit
    elements over HBM at 0.8 of its bandwidth, plus 8 kernel overheads of 4 us."""
    model = presets.model("gpt3-1.7b")
    training = Training(global_batch_size=1, dtype="fp16", stack="megatron-lm")
    comp = _compute(model, A100, training, Plan(micro_batch_size=1))
    s, h, f, a = model.seq_length, model.hidden_size, model.ffn_hidden_size, model.num_attention_heads
    elems = s * (12.0 * h + 2.0 * f + 2.0 * 3 * h) + 4.5 * a * s * s
    rate = 2039e9 * 0.8
    block = elems * 2 / rate + 8 * 4e-6
    head_mem = s * model.vocab_size * 12.0 / rate
    assert comp.memory_fwd_s[0] == pytest.approx(model.num_layers * block + head_mem, rel=1e-9)


def test_other_layers_run_at_three_tenths_of_the_gemm_rate():
    from perfmodels import LayerSpec, Model

    model = Model(layers=(LayerSpec(name="conv", kind="other", flops_per_sample=1e12),))
    comp = _compute(model, A100, Training(global_batch_size=1), Plan(micro_batch_size=2))
    assert comp.gemm_fwd_s[0] == pytest.approx(2 * 1e12 / (312e12 * 0.80 * 0.3), rel=1e-9)


def test_overlapped_tp_leaves_half_the_forward_and_what_backward_gemms_cannot_cover():
    from perfmodels import steptime
    from perfmodels.layout import group_geometry
    from perfmodels.traffic import comm_events

    model = presets.model("gpt3-1.7b")
    training = Training(
        global_batch_size=4, stack="megatron-core", overlap_tp_comm=True, host_us_per_block=0.0
    )
    plan = Plan(G_intra_r=8, micro_batch_size=1)
    arrays = from_plans([plan])
    geo = group_geometry(arrays.degrees(), arrays.placement, A100.gpus_per_node_used)
    secs = steptime._comm_seconds(A100, training, arrays, comm_events(model, training, arrays), geo)
    fwd = sum(v[0] for (axis, cat), v in secs.items() if cat == "tp_fwd_half")
    other = sum(v[0] for (axis, cat), v in secs.items() if cat == "tp_exposed")  # norm and loss statistics
    bwd = sum(v[0] for (axis, cat), v in secs.items() if cat == "tp_bwd")
    comp = _compute(model, A100, training, plan)
    m = 4
    expected = other + 0.5 * fwd + max(bwd - m * comp.wgrad_s[0], 0.0)
    assert predict(model, A100, training, plan).breakdown.exposed_comm_s == pytest.approx(expected, rel=1e-9)


def test_uncertainty_bands():
    """Preset constants: 15% (the p90 published error); the CPU preset: 100%; a profile of
    microbenchmarks keeps the preset band (it measured no training step); calibrated without a
    leave-one-out error: 8%."""
    from perfmodels.specs import Profile

    model, plan = presets.model("gpt3-1.7b"), Plan(G_data=8, micro_batch_size=1)
    training = Training(global_batch_size=8)
    assert predict(model, A100, training, plan).uncertainty_rel == 0.15
    cpu = presets.cluster("local-cpu", 8)
    assert predict(presets.model("tiny-gpt"), cpu, training, plan).uncertainty_rel == 1.0
    for source, band in (("profile", 0.15), ("calibrated", 0.08)):
        profiled = dataclasses.replace(A100, profile=Profile(profile_id="x", source=source))
        assert predict(model, profiled, training, plan).uncertainty_rel == band
    cpu_profiled = dataclasses.replace(cpu, profile=Profile(profile_id="y", source="profile"))
    assert predict(presets.model("tiny-gpt"), cpu_profiled, training, plan).uncertainty_rel == 1.0


def test_dropout_masks_and_dropped_scores_by_hand():
    """A block trained with dropout saves two 1-byte masks per token and hidden unit on its residual
    stream (2 s b h) and, with unfused attention, a mask and the dropped-out scores (3 a s^2 b);
    without dropout 8 s b h + 24-part inside, 2 a s^2 b of softmax output."""
    with_drop = presets.model("gpt3-1.7b")
    without = dataclasses.replace(with_drop, dropout=False)
    training = Training(global_batch_size=1, dtype="fp16", stack="megatron-lm")
    arrays = from_plans([Plan(micro_batch_size=1)])
    s, h, a = with_drop.seq_length, with_drop.hidden_size, with_drop.num_attention_heads
    d = activation_bytes_per_layer(with_drop, training, arrays)[0] - activation_bytes_per_layer(
        without, training, arrays)[0]
    assert d == pytest.approx(2.0 * s * h + 3.0 * a * s * s)
    # the whole unfused block by hand (Korthikanti: 34 s b h + 5 a s^2 b with dropout)
    full = activation_bytes_per_layer(with_drop, training, arrays)[0]
    assert full == pytest.approx(34.0 * s * h + 5.0 * a * s * s)
    none = activation_bytes_per_layer(without, training, arrays)[0]
    assert none == pytest.approx(32.0 * s * h + 2.0 * a * s * s)
    assert presets.model("llama3-8b").dropout is False and presets.model("gpt3-175b").dropout is True


def test_nemo_stack_holds_bf16_gradients_four_plus_twelve_over_d_bytes():
    """NeMo's recipes reduce gradients in bf16: distributed optimizer (ZeRO-1) = 2 + 2 + 12/d bytes per
    parameter in bf16 training, where Megatron-LM (fp32 main_grad) holds 2 + 4 + 12/d."""
    from perfmodels.memory import model_state_bytes

    arrays = from_plans([Plan(G_data=4, micro_batch_size=1, zero_stage=1)])
    local = np.array([1.0e9])
    for stack, expected in (("nemo", 2 + 2 + 12 / 4), ("megatron-core", 2 + 4 + 12 / 4)):
        st = model_state_bytes(Training(global_batch_size=8, stack=stack), local, arrays)
        assert (st.params + st.grads + st.optimizer)[0] == pytest.approx(expected * 1e9), stack


def test_torchtitan_eager_elementwise_traffic_and_loss_memory():
    """torchtitan's eager Llama block streams 2.8x a fused block's element-wise bytes (kernel overheads
    unchanged), and its eager cross entropy holds 12 bytes per logit (2 + 4 + 4 + 2) where Megatron's
    fused one holds 6."""
    model = presets.model("llama3-8b")
    plan = Plan(micro_batch_size=1)
    tt = Training(global_batch_size=8, stack="torchtitan")
    fused = Training(global_batch_size=8, stack=stacks.preset("torchtitan", elementwise_bytes_scale=1.0,
                                                              loss_bytes_per_logit=None))
    kernels = model.num_layers * 8 * 4e-6
    head = model.seq_length * model.vocab_size * 12.0 / (3350e9 * 0.8)
    m_tt = _compute(model, H100, tt, plan).memory_fwd_s[0] - kernels - head
    m_fused = _compute(model, H100, fused, plan).memory_fwd_s[0] - kernels - head
    assert m_tt / m_fused == pytest.approx(2.8, rel=1e-9)
    one = presets.cluster("eos", 1)
    act_tt = predict(model, one, tt, plan).memory.activations_gib
    act_fused = predict(model, one, fused, plan).memory.activations_gib
    assert (act_tt - act_fused) * GIB == pytest.approx(model.seq_length * 128256 * (12.0 - 6.0), rel=1e-6)


def test_h100_96gb_variant_is_the_power_capped_hbm2e_card():
    """The 96 GB HBM2e H100 at 500 W: 2.4 TB/s and the midpoint of the "between SXM and NVL" its users
    give: (989 + 835) / 2 = 912 bf16, twice that in fp8."""
    g = presets.gpu("H100-96GB")
    assert (g.memory_gib, g.hbm_bandwidth_GBps, g.peak_tflops_bf16, g.peak_tflops_fp8) == (
        96.0, 2400.0, (989.0 + 835.0) / 2, 989.0 + 835.0)


def test_torch_compile_fuses_block_elementwise_traffic_and_a_compiled_loss_holds_four_bytes():
    """Compiled blocks stream a fused block's element-wise bytes (torchtitan eager: 2.8x); a compiled
    cross entropy holds the 16-bit logits and their 16-bit gradient, 2 + 2 = 4 bytes per logit, where
    torchtitan's eager one holds 12: 8 x s x V bytes less on one GPU at micro-batch 1."""
    model = presets.model("llama3-8b")
    plan = Plan(micro_batch_size=1)
    eager = Training(global_batch_size=8, stack="torchtitan")
    blocks = Training(global_batch_size=8, stack="torchtitan", torch_compile="blocks")
    both = Training(global_batch_size=8, stack="torchtitan", torch_compile="blocks+loss")
    fused = Training(global_batch_size=8, stack=stacks.preset("torchtitan", elementwise_bytes_scale=1.0))
    assert _compute(model, H100, blocks, plan).memory_fwd_s[0] == pytest.approx(
        _compute(model, H100, fused, plan).memory_fwd_s[0], rel=1e-12)
    assert _compute(model, H100, eager, plan).memory_fwd_s[0] > 1.5 * _compute(
        model, H100, blocks, plan).memory_fwd_s[0]
    one = presets.cluster("eos", 1)
    act = {t.torch_compile: predict(model, one, t, plan).memory.activations_gib
           for t in (eager, blocks, both)}
    assert act[None] == pytest.approx(act["blocks"], rel=1e-12)
    assert (act[None] - act["blocks+loss"]) * GIB == pytest.approx(model.seq_length * 128256 * (12.0 - 4.0),
                                                                   rel=1e-6)


def test_loss_parallel_holds_sixteen_bytes_per_logit_of_each_vocabulary_shard():
    """torchtitan's loss_parallel (DTensor's decomposed fp32 log-softmax) peaks at 16 bytes per logit
    (saved log-softmax 4, zero-filled gradient 4, exp 4, their sum 4) on each rank's V/G_r shard;
    without tensor parallelism the eager 12 stays."""
    model = presets.model("llama3-8b")
    one, two = presets.cluster("eos", 1), presets.cluster("eos", 2)
    plan = Plan(G_intra_r=2, micro_batch_size=1, placement=("col", "row", "depth", "data", "inter"))
    tt = Training(global_batch_size=8, stack="torchtitan")
    plain = Training(global_batch_size=8,
                     stack=stacks.preset("torchtitan", loss_parallel_bytes_per_logit=None))
    diff = (predict(model, two, tt, plan).memory.activations_gib
            - predict(model, two, plain, plan).memory.activations_gib)
    assert diff * GIB == pytest.approx(model.seq_length * 128256 / 2 * (16.0 - 12.0), rel=1e-6)
    solo = Plan(micro_batch_size=1)
    assert predict(model, one, tt, solo).memory.activations_gib == pytest.approx(
        predict(model, one, plain, solo).memory.activations_gib, rel=1e-12)


def test_dtensor_sequence_parallel_saves_the_gathered_qkv_and_fc1_inputs():
    """With sequence parallelism over G_r = 4, Megatron keeps the 4 s b h bytes of the QKV and fc1
    inputs as sequence shards (/4) and all-gathers them again in backward; DTensor's ColwiseParallel
    (torchtitan) saves the gathered full-sequence inputs: 4 s b h (1 - 1/4) more bytes per layer."""
    model = presets.model("llama3-8b")
    arrays = from_plans([Plan(G_intra_r=4, micro_batch_size=2, sequence_parallel=True)])
    tt = Training(global_batch_size=8, stack="torchtitan")
    shard = Training(global_batch_size=8, stack=stacks.preset("torchtitan", sp_saves_gathered_inputs=False))
    s, b, h = model.seq_length, 2, model.hidden_size
    diff = activation_bytes_per_layer(model, tt, arrays) - activation_bytes_per_layer(model, shard, arrays)
    assert diff[0] == pytest.approx(4.0 * s * b * h * (1 - 1 / 4), rel=1e-9)
    no_sp = from_plans([Plan(G_intra_r=4, micro_batch_size=2)])
    assert activation_bytes_per_layer(model, tt, no_sp)[0] == pytest.approx(
        activation_bytes_per_layer(model, shard, no_sp)[0], rel=1e-12)


def test_pre_hopper_flash_kernels_reach_ampere_rates_times_the_sm_clock_speedup():
    """A fused attention kernel written for Ampere runs on an H100 at the A100's flash rates (0.45 and
    0.35 of 312 TFLOP/s) times 132/108 SMs x 1.98/1.41 GHz: 241 and 187 TFLOP/s, below the native
    0.45 / 0.40 of 989. On an A100 the ceiling is above its own rates, so nothing changes."""
    from perfmodels.compute import flash_rates

    old = Training(global_batch_size=8, stack="fsdp")
    native = Training(global_batch_size=8, stack=stacks.preset("fsdp", flash_kernel="native"))
    speedup = (132 / 108) * (1.98 / 1.41)
    fwd, bwd = flash_rates(H100, old, 989e12)
    assert (fwd, bwd) == pytest.approx((0.45 * 312e12 * speedup, 0.35 * 312e12 * speedup))
    assert flash_rates(H100, native, 989e12) == pytest.approx((0.45 * 989e12, 0.40 * 989e12))
    assert flash_rates(A100, old, 312e12) == pytest.approx((0.45 * 312e12, 0.35 * 312e12))
    assert stacks.preset("fsdp").flash_kernel == "pre-hopper"
    assert stacks.preset("torchtitan").flash_kernel == "native"


def test_training_flash_kernel_states_which_kernel_ran_and_costs_attention_by_hand():
    """`Training(flash_kernel=...)` overrides the stack's kernel (a torchtitan run of 2024-25 ran SDPA's
    FlashAttention-2 on Hopper). Llama 3 8B on one H100, b = 2, s = 8192: causal attention FLOPs per
    block forward 4 b s^2 d h / 2 (d h = 4096), forward at 241 instead of 445 TFLOP/s, backward 2.5x
    at 187 instead of 396. A bad value names the field."""
    model = presets.model("llama3-8b")
    plan = Plan(micro_batch_size=2)
    native = Training(global_batch_size=2, stack="torchtitan")
    fa2 = Training(global_batch_size=2, stack="torchtitan", flash_kernel="pre-hopper")
    assert (native.effective_stack.flash_kernel, fa2.effective_stack.flash_kernel) == ("native", "pre-hopper")
    speedup = (132 / 108) * (1.98 / 1.41)
    flops = 4 * 2 * 8192 * 8192 * 4096 / 2
    a, b = _compute(model, H100, native, plan), _compute(model, H100, fa2, plan)
    want_fwd = flops / (0.45 * 312e12 * speedup) - flops / (0.45 * 989e12)
    per_block = (b.attention_fwd_s[0] - a.attention_fwd_s[0]) / model.num_layers  # the stage's 32 blocks
    assert per_block == pytest.approx(want_fwd, rel=1e-9)
    want_bwd = 2.5 * flops * (1 / (0.35 * 312e12 * speedup) - 1 / (0.40 * 989e12))
    assert (b.bwd_s[0] - a.bwd_s[0]) / model.num_layers == pytest.approx(want_bwd, rel=1e-9)
    with pytest.raises(ValueError, match=r"flash_kernel.*'fa3'"):
        Training(global_batch_size=2, flash_kernel="fa3")  # type: ignore[arg-type]


def test_fp8_saved_inputs_are_one_byte_under_transformer_engine_and_16_bit_under_torchao():
    """Transformer Engine saves a linear layer's input for backward in FP8: the QKV and fc1 inputs
    (2 s b h) and the out-proj and fc2 inputs (s b (h + f)) shrink by a byte per element. torchtitan's
    torchao Float8Linear saves them in bf16, so its FP8 activations equal its bf16 ones."""
    model = presets.model("llama3-8b")
    arrays = from_plans([Plan(micro_batch_size=1)])
    s, h, f = model.seq_length, model.hidden_size, model.ffn_hidden_size

    def act(stack: str, dtype: str) -> float:
        training = Training(global_batch_size=8, dtype=dtype, stack=stack)
        return float(activation_bytes_per_layer(model, training, arrays)[0])

    saved = act("megatron-core", "bf16") - act("megatron-core", "fp8")
    assert saved == pytest.approx(2 * s * h + s * (h + f))
    assert act("torchtitan", "fp8") == act("torchtitan", "bf16")


def test_blackwell_fp8_gemms_keep_hoppers_fp8_to_bf16_share():
    """Blackwell's sustained FP8 share is its bf16 share (0.70) times the FP8/bf16 ratio measured on
    Hopper (0.50 / 0.62), about 0.565; GB200 is the same die at a higher power limit (2.5 / 5 PFLOP/s)."""
    for name in ("B200", "GB200"):
        g = presets.gpu(name)
        assert g.gemm_efficiency("bf16") == pytest.approx(0.70)
        assert g.gemm_efficiency("fp8") == pytest.approx(0.70 * 0.50 / 0.62)
    gb = presets.gpu("GB200")
    assert (gb.peak_tflops_bf16, gb.peak_tflops_fp8, gb.memory_gib) == (2500.0, 5000.0, 186.0)


@pytest.mark.parametrize(("gpus", "nbytes", "measured_us"), [
    (2, 67108864, 404.7), (4, 67108864, 543.8), (8, 67108864, 579.9), (8, 1073741824, 8193.0)])
def test_vtrain_cluster_all_reduce_is_its_measured_nccl_tests_table(gpus, nbytes, measured_us):
    """The vtrain-a100 preset costs an in-node all-reduce from the nccl-tests tables the vTrain
    repository publishes for that cluster (trace/a100/AR_GPU{n}_1M_1024M_LUT, out-of-place time):
    e.g. 8 GPUs, 64 MiB: 6 tree steps x 13.6 us + 2 x 7/8 x 64 MiB / 227.7 GB/s = 597 us against the
    measured 579.9 us. 5%: the worst residual of the alpha-beta line at these sizes (it is fitted on all
    1,024 sizes of each table, not on these points); 150 GB/s at efficiency 1, the preset's fallback,
    would cost more than 10% more on each."""
    from perfmodels.collectives import cost_s

    def one_call_s(cluster) -> float:  # one in-node all-reduce over all `gpus` members
        return float(cost_s(cluster, "all_reduce", np.array([float(nbytes)]), np.array([1.0]),
                            np.array([gpus]), np.array([True]), np.array([gpus]))[0])

    cluster = presets.cluster("vtrain-a100", 8)
    got = one_call_s(cluster)
    assert got * 1e6 == pytest.approx(measured_us, rel=0.05)
    assert one_call_s(dataclasses.replace(cluster, profile=None)) > 1.1 * got
