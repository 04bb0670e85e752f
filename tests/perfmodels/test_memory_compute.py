"""Memory and FLOPs against hand-derived formulas.

Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198), eq. 1-2: per layer and micro-batch, 34 s b h + 5 a s^2 b bytes without
tensor parallelism; with tensor parallelism t, 10 s b h + 24 s b h / t + 5 a s^2 b / t; with sequence
parallelism everything divides by t. FLOPs: Narayanan et al. 2021 (arXiv 2104.04473), eq. 3.
"""

import numpy as np
import pytest

from perfmodels import presets
from perfmodels.compute import model_flops_per_token
from perfmodels.memory import activation_bytes_per_layer
from perfmodels.plans import from_plans
from perfmodels.specs import Plan, Training
from perfmodels.steptime import predict
from validation.metrics import megatron_flops

GPT = presets.model("gpt3-175b")
NO_FLASH = Training(global_batch_size=64, dtype="bf16", flash_attention=False)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_activation_bytes_per_layer(t):
    s, b, h, a = GPT.seq_length, 2, GPT.hidden_size, GPT.num_attention_heads
    arrays = from_plans([Plan(G_intra_r=t, micro_batch_size=b)])
    got = activation_bytes_per_layer(GPT, NO_FLASH, arrays)[0]
    assert got == pytest.approx(10 * s * b * h + 24 * s * b * h / t + 5 * a * s * s * b / t)


def test_sequence_parallel_and_selective_recompute_activation_bytes():
    s, b, h, a = GPT.seq_length, 1, GPT.hidden_size, GPT.num_attention_heads
    sp = from_plans([Plan(G_intra_r=8, micro_batch_size=b, sequence_parallel=True)])
    assert activation_bytes_per_layer(GPT, NO_FLASH, sp)[0] == pytest.approx(
        34 * s * b * h / 8 + 5 * a * s * s * b / 8
    )
    sel = from_plans([Plan(G_intra_r=8, micro_batch_size=b, sequence_parallel=True, recompute="selective")])
    assert activation_bytes_per_layer(GPT, NO_FLASH, sel)[0] == pytest.approx(34 * s * b * h / 8)


def _states(stack: str, plan: Plan, dtype: str = "bf16") -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter of gpt3-1.7b on 8 GPUs, one stage."""
    model = presets.model("gpt3-1.7b")
    mem = predict(
        model, presets.cluster("selene", 8), Training(global_batch_size=64, dtype=dtype, stack=stack), plan
    ).memory
    n = model.num_params / 2**30
    return mem.params_gib / n, mem.grads_gib / n, mem.optimizer_gib / n


DP8 = {"G_data": 8, "micro_batch_size": 1, "recompute": "full"}


@pytest.mark.parametrize(("stack", "zero", "expected"), [
    # Megatron (no distributed optimizer): bf16 weights 2, fp32 main_grad 4, fp32 master + Adam 12
    ("megatron-lm", 0, (2, 4, 12)),
    # Megatron-Core distributed optimizer: 6 + 12/d bytes per parameter (its docs' table)
    ("megatron-core", 1, (2, 4, 12 / 8)),
    # Apex DistributedFusedAdam ("ZeRO-2" in NeMo): full bf16 gradient buckets, 16-bit master
    # remainders + Adam moments sharded: 4 + 10/d
    ("megatron-core", 2, (2, 2, 10 / 8)),
    # DeepSpeed BF16 optimizer: bf16 weights and grads, fp32 gradient accumulators, master + Adam
    ("deepspeed", 0, (2, 2 + 4, 12)),
    ("deepspeed", 1, (2, 2 + 4, 12 / 8)),
    # DeepSpeed ZeRO-2 keeps only its gradient shard (16-bit and fp32)
    ("deepspeed", 2, (2, 6 / 8, 12 / 8)),
    # FSDP FULL_SHARD: fp32 flat parameter, fp32 gradient, Adam, all sharded (plus two gathered
    # 16-bit blocks, the unit computing and the one prefetched)
    ("fsdp", 3, (4 / 8, 4 / 8, 8 / 8)),
    # our engine: fp32 parameters under autocast, fp32 gradients, Adam moments
    ("gridtune", 0, (4, 4, 8)),
    ("gridtune", 1, (4, 4, 1)),
])
def test_model_state_bytes_per_stack(stack, zero, expected):
    """Hand-derived bytes per parameter of every stack's model states (documented in
    perfmodels.stacks); the 1% slack is the head/embedding rounding of the busiest stage."""
    got = _states(stack, Plan(**DP8, zero_stage=zero))
    weights, grads, opt = expected
    if stack == "fsdp":  # the two gathered blocks: 2 x params_per_layer x 2 bytes
        model = presets.model("gpt3-1.7b")
        weights += 2 * model.params_per_layer * 2 / model.num_params
    assert got == pytest.approx((weights, grads, opt), rel=0.01)


def test_fp16_megatron_keeps_16_bit_gradients_and_fp32_training_holds_16_bytes():
    assert _states("megatron-lm", Plan(**DP8), "fp16") == pytest.approx((2, 2, 12), rel=0.01)
    # DeepSpeed's FP16 optimizer keeps no fp32 gradient accumulators (its BF16 optimizer does)
    assert _states("deepspeed", Plan(**DP8), "fp16") == pytest.approx((2, 2, 12), rel=0.01)
    assert _states("megatron-core", Plan(**DP8), "fp32") == pytest.approx((4, 4, 8), rel=0.01)


def test_zero3_under_a_pipeline_holds_the_gathered_stage():
    """FSDP with pipelining gathers a stage's parameters once per step and keeps them: a full
    16-bit copy of the stage on top of the sharded fp32 states."""
    model = presets.model("gpt3-1.7b")
    cluster = presets.cluster("selene", 8)
    training = Training(global_batch_size=64, stack="torchtitan")
    piped = predict(
        model, cluster, training, Plan(G_data=4, G_inter=2, micro_batch_size=1, zero_stage=3)
    ).memory
    flat = predict(
        model, cluster, training, Plan(G_data=4, G_inter=2, micro_batch_size=1, zero_stage=1)
    ).memory
    # zero 1: 4 (fp32 params) ; zero 3: 4/4 sharded + 2 gathered
    assert piped.params_gib / flat.params_gib == pytest.approx((4 / 4 + 2) / 4)


def test_fp8_adds_the_cached_fp8_weights_of_the_linear_layers():
    model = presets.model("gpt3-1.7b")
    base = _states("megatron-core", Plan(**DP8, zero_stage=1))
    fp8 = _states("megatron-core", Plan(**DP8, zero_stage=1), "fp8")
    linear_share = model.num_layers * model.params_per_layer / model.num_params
    assert fp8[0] - base[0] == pytest.approx(2.0 * linear_share, rel=0.01)


def test_gpt3_does_not_fit_on_one_gpu_and_says_so():
    pred = predict(GPT, presets.cluster("selene", 1), Training(global_batch_size=1), Plan())
    assert not pred.memory.fits and pred.memory.per_gpu_gib > 2000


def test_flops_per_token_match_megatron_formula():
    B, s, L, h, V = 1536, GPT.seq_length, GPT.num_layers, GPT.hidden_size, GPT.vocab_size
    ours = 3 * model_flops_per_token(GPT) * B * s
    assert ours == pytest.approx(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)))
    assert ours == pytest.approx(
        megatron_flops(batch=B, seq=s, layers=L, hidden=h, vocab=V, recompute_full=False)
    )
    assert megatron_flops(batch=B, seq=s, layers=L, hidden=h, vocab=V, recompute_full=True) == pytest.approx(
        96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)))


def test_mfu_is_flops_over_time_and_peak():
    cluster = presets.cluster("selene", 64)
    training = Training(global_batch_size=512)
    pred = predict(GPT, cluster, training, Plan(G_data=1, G_inter=8, G_intra_r=8, recompute="full"))
    flops = 3 * model_flops_per_token(GPT) * 512 * GPT.seq_length
    assert pred.mfu == pytest.approx(flops / (pred.iteration_time_s * 64 * 312e12))
    assert np.isclose(pred.tokens_per_s * pred.iteration_time_s, 512 * GPT.seq_length)


def test_context_parallel_chunk_does_a_cp_th_of_the_attention():
    """A rank holding 1/cp of a sequence (seq_length = s/cp, attention_span = s) does 1/cp of the
    sample's attention FLOPs and 1/cp of its GEMM FLOPs; MFU accounting is the same per token."""
    import dataclasses

    from perfmodels.compute import model_flops_per_token, stage_compute
    from perfmodels.plans import from_plans
    from perfmodels.specs import Model, Plan, Training
    from perfmodels.traffic import stage_shape

    full = Model(
        name="m", num_layers=4, hidden_size=4096, num_attention_heads=32, seq_length=8192, vocab_size=32000
    )
    chunk = dataclasses.replace(full, seq_length=2048, attention_span=8192)
    assert model_flops_per_token(chunk) == model_flops_per_token(full)
    cluster, training = presets.cluster("eos", 8), Training(global_batch_size=8)
    arrays = from_plans([Plan(G_data=8)])
    st = stage_shape(4, arrays)
    a_full = stage_compute(full, cluster, training, arrays, st).attention_fwd_s[0]
    a_chunk = stage_compute(chunk, cluster, training, arrays, st).attention_fwd_s[0]
    overhead = 4 * 4e-6  # one kernel overhead per block
    assert (a_chunk - overhead) == pytest.approx((a_full - overhead) / 4, rel=1e-9)
    with pytest.raises(ValueError, match="attention_span"):
        Model(
            name="m",
            num_layers=4,
            hidden_size=4096,
            num_attention_heads=32,
            seq_length=8192,
            vocab_size=32000,
            attention_span=4096,
        )
