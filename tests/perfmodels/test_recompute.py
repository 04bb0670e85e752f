"""What full recomputation repeats, by stack (`Stack.full_recompute_repeats_layer`), hand-derived.

A reentrant stack (Megatron-Core's CheckpointFunction, DeepSpeed's) reruns each block whole in
backward, so the recomputation repeats both of a block's row all-reduces (out_proj's and fc2's) and
all four GEMMs; PyTorch's non-reentrant checkpoint with early stopping (torchtitan and LLM Foundry as
published, the engine) stops at the block's last saved tensor, fc2's input, so neither fc2's GEMM nor
its all-reduce is repeated. Mixture-of-experts layers repeat both all-to-alls in either kind of
stack (the ops after the combine save tensors).

    PYTHONPATH=. .venv/bin/python -m pytest tests/perfmodels/test_recompute.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from perfmodels import presets, stacks
from perfmodels.compute import gemm_curve, gemm_time_s, stage_compute
from perfmodels.plans import from_plans
from perfmodels.specs import Model, Plan, Training
from perfmodels.traffic import comm_events, stage_shape

GPT = Model(name="gpt", num_layers=8, hidden_size=512, num_attention_heads=8, seq_length=256, vocab_size=1000)
MOE = Model(name="tiny-moe", num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
            vocab_size=256, gated_mlp=True, dropout=False, num_moe_experts=4, moe_router_topk=2,
            moe_ffn_hidden_size=32)
SHARED_MOE = Model(name="tiny-moe-shared", num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                   vocab_size=256, gated_mlp=True, dropout=False, num_moe_experts=4, moe_router_topk=2,
                   moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=32)
B, GB = 2, 8  # micro-batch size, global batch


def _recomputed(model: Model, training: Training, plan: Plan, axis: str, op: str) -> tuple[float, float]:
    """(calls, bytes) per step of the `op`s over `axis` in the recompute phase."""
    calls = nbytes = 0.0
    for ev in comm_events(model, training, from_plans([plan])):
        if ev.phase == "recompute" and ev.axis == axis and ev.op == op:
            calls += float(ev.calls[0])
            nbytes += float(ev.calls[0] * ev.payload_bytes[0])
    return calls, nbytes


def test_presets_say_which_stacks_rerun_the_whole_layer():
    """Megatron's and DeepSpeed's checkpoints (and OneFlow's checkpointing pass) are reentrant; LLM
    Foundry's FSDP, torchtitan (as its published runs ran it) and the engine stop early."""
    repeats = {name: s.full_recompute_repeats_layer for name, s in stacks.STACK_PRESETS.items()}
    assert repeats == {"megatron-lm": True, "megatron-core": True, "nemo": True, "megatron-deepspeed": True,
                       "deepspeed": True, "fsdp": False, "torchtitan": False, "oneflow": True,
                       "gridtune": False}
    # a current torchtitan (full AC with early_stop=False since 2025-08-29) says so on the Training
    assert Training(global_batch_size=8, stack="torchtitan",
                    full_recompute_repeats_layer=True).effective_stack.full_recompute_repeats_layer


ROW_CASES = [("megatron-core", 2), ("megatron-lm", 2), ("megatron-deepspeed", 2),
             ("torchtitan", 1), ("gridtune", 1)]


@pytest.mark.parametrize(("stack", "per_layer"), ROW_CASES)
def test_row_all_reduces_recomputed_per_layer_and_micro_batch(stack, per_layer):
    """G_intra_r = 4 without sequence parallelism: out_proj and fc2 (the transposed Linears) each
    all-reduce their [b*s, h] output over row in forward. A reentrant stack recomputes both, one that
    stops early only out_proj's: 8 layers x 2 micro-batches x per_layer calls of b*s*h*2 bytes."""
    plan = Plan(G_intra_r=4, G_data=2, micro_batch_size=B, recompute="full")
    training = Training(global_batch_size=GB, dtype="bf16", stack=stack)
    m = GB // (B * 2)
    calls, nbytes = _recomputed(GPT, training, plan, "row", "all_reduce")
    assert calls == GPT.num_layers * m * per_layer
    assert nbytes == calls * B * GPT.seq_length * GPT.hidden_size * 2
    # stating the other behaviour on the Training flips it
    other = Training(global_batch_size=GB, dtype="bf16", stack=stack,
                     full_recompute_repeats_layer=per_layer == 1)
    assert _recomputed(GPT, other, plan, "row", "all_reduce")[0] == GPT.num_layers * m * (3 - per_layer)
    # without recomputation nothing is repeated
    none = Plan(G_intra_r=4, G_data=2, micro_batch_size=B)
    assert _recomputed(GPT, training, none, "row", "all_reduce") == (0.0, 0.0)


def test_sequence_parallel_early_stop_skips_the_reduce_scatter_after_fc2():
    """Under sequence parallelism the block's row collectives are all-gathers (before QKV and fc1)
    and reduce-scatters (after out_proj and fc2): stopping early skips one of the two
    reduce-scatters and none of the all-gathers."""
    plan = Plan(G_intra_r=4, G_data=2, micro_batch_size=B, recompute="full", sequence_parallel=True)
    reentrant = Training(global_batch_size=GB, dtype="bf16", stack="megatron-core")
    early = Training(global_batch_size=GB, dtype="bf16", stack="torchtitan")
    for op, ratio in (("all_gather", 1.0), ("reduce_scatter", 0.5)):
        full_calls, full_bytes = _recomputed(GPT, reentrant, plan, "row", op)
        calls, nbytes = _recomputed(GPT, early, plan, "row", op)
        assert full_calls > 0 and calls == full_calls * ratio and nbytes == full_bytes * ratio, op


def test_early_stop_does_not_recompute_the_fc2_gemm():
    """recompute_s (per micro-batch) of a stack that stops early is the reentrant one's less fc2's
    forward GEMM in every block of the stage: [b*s, f/G_r] x [f/G_r, h] (fc2 is transposed: its
    input features are split over row), at the GEMM curve."""
    cluster = presets.cluster("eos").with_gpus(8)
    plan = Plan(G_intra_r=4, G_data=2, micro_batch_size=B, recompute="full")
    arrays = from_plans([plan])
    st = stage_shape(GPT.num_layers, arrays)
    early = Training(global_batch_size=GB, dtype="bf16", stack="torchtitan")
    whole = Training(global_batch_size=GB, dtype="bf16", stack="torchtitan",
                     full_recompute_repeats_layer=True)
    skipped = stage_compute(GPT, cluster, whole, arrays, st).recompute_s - stage_compute(
        GPT, cluster, early, arrays, st).recompute_s
    fc2 = gemm_time_s(np.array([B * GPT.seq_length], float), GPT.hidden_size,
                      GPT.mean_dense_ffn / 4, gemm_curve(cluster, early))
    assert skipped == pytest.approx(GPT.num_layers * fc2, rel=1e-12)
    # forward and backward are the same either way
    a, b = stage_compute(GPT, cluster, whole, arrays, st), stage_compute(GPT, cluster, early, arrays, st)
    assert (a.fwd_s, a.bwd_s) == (b.fwd_s, b.bwd_s)


@pytest.mark.parametrize(("dtype", "plan"), [
    ("fp8", Plan(G_intra_r=4, G_data=2, micro_batch_size=B, recompute="full")),
    ("bf16", Plan(G_intra_r=2, G_intra_d=2, G_data=2, micro_batch_size=B, recompute="full")),
])
def test_custom_autograd_linears_recompute_fc2_anyway(dtype, plan):
    """An FP8 linear (Transformer Engine, torchao) or the engine's depth-sharded Linear is a custom
    autograd Function: it multiplies before it saves, so fc2's GEMM runs before early stopping."""
    cluster = presets.cluster("eos").with_gpus(8)
    arrays = from_plans([plan])
    st = stage_shape(GPT.num_layers, arrays)
    early = Training(global_batch_size=GB, dtype=dtype, stack="gridtune")
    whole = Training(global_batch_size=GB, dtype=dtype, stack="gridtune", full_recompute_repeats_layer=True)
    assert stage_compute(GPT, cluster, early, arrays, st).recompute_s == pytest.approx(
        stage_compute(GPT, cluster, whole, arrays, st).recompute_s, rel=1e-15)


@pytest.mark.parametrize("stack", ["megatron-core", "torchtitan", "gridtune"])
def test_moe_recomputation_repeats_dispatch_and_combine(stack):
    """Per MoE layer and micro-batch: 2 all-to-alls forward, 2 backward, and 2 recomputed (dispatch
    and combine) in every stack, each of T*k*h*e bytes (T = b*s tokens: no row split here)."""
    plan = Plan(G_data=4, G_ep=4, G_etp=1, micro_batch_size=B, recompute="full")
    training = Training(global_batch_size=GB, dtype="bf16", stack=stack)
    m = GB // (B * 4)
    calls, nbytes = _recomputed(MOE, training, plan, "ep", "all_to_all")
    assert calls == 2 * MOE.num_layers * m
    assert nbytes == calls * B * MOE.seq_length * MOE.moe_router_topk * MOE.hidden_size * 2


def test_moe_recomputation_repeats_the_etp_gather_and_reduce_scatter():
    """Sequence parallelism with G_etp = G_intra_r = 2 (Megatron-Core): each etp member holds
    T = b*s/2 tokens; the recomputed layer all-gathers the received rows over etp after the dispatch
    and reduce-scatters them before the combine again, each [G_etp*T*k, h]."""
    plan = Plan(G_data=2, G_intra_r=2, G_ep=2, micro_batch_size=B, recompute="full", sequence_parallel=True)
    training = Training(global_batch_size=GB, dtype="bf16", stack="megatron-core")
    m = GB // (B * 2)
    gathered = 2 * (B * MOE.seq_length / 2) * MOE.moe_router_topk * MOE.hidden_size * 2
    for op in ("all_gather", "reduce_scatter"):
        n = MOE.num_layers * m
        assert _recomputed(MOE, training, plan, "etp", op) == (n, n * gathered)


def test_engine_moe_recomputation_of_row_collectives():
    """The gridtune stack (the engine) with the tokens split over row (G_intra_r = 2, G_etp = 1, no
    sequence parallelism): without a shared expert the row gather back after the combine is the
    layer's last collective and is not repeated, while out_proj's all-reduce is (the router after it
    saves tensors); with a shared expert, which engine.moe runs after the gather, the gather is
    repeated and the shared expert's fc2 all-reduce, now the last, is not. Per layer and
    micro-batch, b*s*h*e bytes each (tests/engine/test_contract_moe_cp.py checks the engine)."""
    plan = Plan(G_data=2, G_intra_r=2, G_ep=2, G_etp=1, micro_batch_size=B, recompute="full")
    training = Training(global_batch_size=GB, dtype="bf16", stack="gridtune")
    per_call = B * MOE.seq_length * MOE.hidden_size * 2
    n = MOE.num_layers * (GB // (B * 2))
    assert _recomputed(MOE, training, plan, "row", "all_reduce") == (n, n * per_call)  # out_proj
    assert _recomputed(MOE, training, plan, "row", "all_gather") == (0.0, 0.0)
    # with a shared expert: out_proj's all-reduce and the gather back; shared_fc2's all-reduce not
    assert _recomputed(SHARED_MOE, training, plan, "row", "all_reduce") == (n, n * per_call)
    assert _recomputed(SHARED_MOE, training, plan, "row", "all_gather") == (n, n * per_call)
    # a reentrant stack repeats everything: out_proj's and shared_fc2's all-reduces, and the gather
    whole = Training(global_batch_size=GB, dtype="bf16", stack="gridtune", full_recompute_repeats_layer=True)
    assert _recomputed(SHARED_MOE, whole, plan, "row", "all_reduce") == (2 * n, 2 * n * per_call)
    assert _recomputed(MOE, whole, plan, "row", "all_gather") == (n, n * per_call)
