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
from perfmodels.published import megatron_flops
from perfmodels.specs import Plan, Training
from perfmodels.steptime import predict

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
    assert activation_bytes_per_layer(GPT, NO_FLASH, sp)[0] == pytest.approx(34 * s * b * h / 8 + 5 * a * s * s * b / 8)
    sel = from_plans([Plan(G_intra_r=8, micro_batch_size=b, sequence_parallel=True, recompute="selective")])
    assert activation_bytes_per_layer(GPT, NO_FLASH, sel)[0] == pytest.approx(34 * s * b * h / 8)


def test_model_state_bytes_and_zero_sharding():
    model = presets.model("gpt3-1.7b")
    cluster = presets.cluster("selene", 8)
    training = Training(global_batch_size=64, dtype="bf16")
    base = predict(model, cluster, training, Plan(G_data=8, micro_batch_size=1, recompute="full"))
    z1 = predict(model, cluster, training, Plan(G_data=8, micro_batch_size=1, recompute="full", zero_stage=1))
    # mixed precision Adam: 12 bytes of optimizer state per parameter, sharded 8 ways by ZeRO-1
    assert base.memory.optimizer_gib == pytest.approx(model.num_params * 12 / 2**30, rel=0.01)
    assert z1.memory.optimizer_gib == pytest.approx(base.memory.optimizer_gib / 8)
    assert z1.memory.params_gib == pytest.approx(base.memory.params_gib)
    assert base.memory.params_gib == pytest.approx(model.num_params * 2 / 2**30, rel=0.01)
    assert base.memory.grads_gib == pytest.approx(model.num_params * 4 / 2**30, rel=0.01)  # fp32 accumulation


def test_gpt3_does_not_fit_on_one_gpu_and_says_so():
    pred = predict(GPT, presets.cluster("selene", 1), Training(global_batch_size=1), Plan())
    assert not pred.memory.fits and pred.memory.per_gpu_gib > 2000


def test_flops_per_token_match_megatron_formula():
    B, s, L, h, V = 1536, GPT.seq_length, GPT.num_layers, GPT.hidden_size, GPT.vocab_size
    ours = 3 * model_flops_per_token(GPT) * B * s
    assert ours == pytest.approx(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)))
    assert ours == pytest.approx(megatron_flops(batch=B, seq=s, layers=L, hidden=h, vocab=V, recompute_full=False))
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
    full = Model(name="m", num_layers=4, hidden_size=4096, num_attention_heads=32, seq_length=8192, vocab_size=32000)
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
        Model(name="m", num_layers=4, hidden_size=4096, num_attention_heads=32, seq_length=8192, vocab_size=32000,
              attention_span=4096)
