"""Golden published runs, scored with their stated layout and stack (see validation/data/).

Each case says whether its row was used to set a constant (in-sample) or not (out-of-sample), and
why its tolerance is that wide. The whole-file figures come from `bench/validate_published.py`.

Run: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/perfmodels/test_golden.py`.
"""

from __future__ import annotations

import dataclasses

import pytest

from perfmodels import Model, Plan, Training, predict, presets

MEGATRON_ORDER = ("col", "row", "depth", "data", "inter")


def _gpt3_175b_nemo(dtype: str) -> float:
    model = dataclasses.replace(presets.model("gpt3-175b"), tied_embeddings=True)
    training = Training(global_batch_size=256, dtype=dtype, stack="megatron-core", overlap_tp_comm=True)
    plan = Plan(G_data=4, G_inter=8, G_intra_r=4, micro_batch_size=1, schedule="interleaved-1f1b",
                virtual_stages=12, zero_stage=2, sequence_parallel=True, placement=MEGATRON_ORDER)
    return predict(model, presets.cluster("eos", 128), training, plan).iteration_time_s


def test_nemo_gpt3_175b_on_128_h100_bf16():
    """dgxc-benchmarking 24.11 (published_modern.csv:2): 8.91 s. IN-SAMPLE: with the other H100
    Megatron-Core/NeMo rows it set `HOPPER_GEMM` (0.62). 10%: the p90 error of those rows."""
    assert _gpt3_175b_nemo("bf16") == pytest.approx(8.91, rel=0.10)


def test_nemo_gpt3_175b_on_128_h100_fp8():
    """The same recipe in FP8 (published_modern.csv:7): 5.92 s. IN-SAMPLE for `HOPPER_FP8_GEMM`
    (0.50). 15%: FP8 rows scatter more (Transformer Engine's scaling overheads vary by shape)."""
    assert _gpt3_175b_nemo("fp8") == pytest.approx(5.92, rel=0.15)


def test_torchtitan_llama3_8b_fsdp2_on_64_a100():
    """torchtitan docs/performance.md: 2,973 tokens/s/GPU at local batch 1, selective-op
    checkpointing, FSDP2 over 64 A100 80GB -> 64 x 8192 / (2973 x 64) = 2.755 s. OUT-OF-SAMPLE (no
    constant was set with torchtitan rows). 20%: the source does not state the network between
    nodes, which carries FSDP's gathers."""
    model = presets.model("llama3-8b")
    training = Training(global_batch_size=64, dtype="bf16", stack="torchtitan")
    plan = Plan(G_data=64, micro_batch_size=1, recompute="selective", zero_stage=3)
    got = predict(model, presets.cluster("selene", 64), training, plan).iteration_time_s
    assert got == pytest.approx(64 * 8192 / (2973 * 64), rel=0.20)


def test_vtrain_3_6b_pure_data_parallel():
    """vTrain ground truth (vtrain_multi.csv:2): 3.6B, 64 A100, dp 64, micro-batch 8: 3,566.5 ms.
    IN-SAMPLE: the A100 GEMM efficiency (0.80) was set on Selene/DGX-A100 Megatron rows that include
    this group. 12%: the group's p90 error."""
    model = Model(name="gpt-3.6b", num_layers=30, hidden_size=3072, num_attention_heads=32, seq_length=2048,
                  vocab_size=51200, tied_embeddings=True)
    training = Training(global_batch_size=512, dtype="fp16", stack="megatron-deepspeed")
    plan = Plan(G_data=64, micro_batch_size=8, recompute="full", placement=MEGATRON_ORDER)
    got = predict(model, presets.cluster("vtrain-a100", 64), training, plan)
    assert got.iteration_time_s == pytest.approx(3.5665, rel=0.12)
    assert got.memory.fits


def test_torchtitan_llama31_8b_on_8_h100_96gb_time_and_peak_memory():
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1 (published_torchtitan_h100.csv:2):
    FSDP on 8 H100 96 GB HBM2e at 500 W, local batch 2, selective AC, no compile: 5,762 tokens/s/GPU
    -> 16 x 8192 / (5762 x 8) = 2.843 s, and 82.4 GiB peak (allocator reserved). The run's attention
    kernel is stated as the row states it: SDPA's FlashAttention-2 (torch 1963fc8, December 2024; see
    `perfmodels.stacks.Stack.flash_kernel`). IN-SAMPLE for the choice of physics (the H100-96GB card
    at the midpoint of its users' "between SXM and NVL", eager element-wise traffic, eager
    cross-entropy memory; their constants are counted from the ops, not fitted). 10% on time: the
    card's power-capped peak is only bounded by that range (989 to 835, +-8.5% around the midpoint);
    10% on memory: the issue's target, and the reserved-vs-allocated slack of PyTorch's allocator."""
    model = presets.model("llama3-8b")
    training = Training(global_batch_size=16, dtype="bf16", stack="torchtitan", flash_kernel="pre-hopper")
    plan = Plan(G_data=8, micro_batch_size=2, recompute="selective", zero_stage=3)
    got = predict(model, presets.cluster("grand-teton", 8), training, plan)
    assert got.iteration_time_s == pytest.approx(16 * 8192 / (5762 * 8), rel=0.10)
    assert got.memory.per_gpu_gib == pytest.approx(82.4, rel=0.10)


def test_torchtitan_compiled_llama31_8b_on_32_h200_peak_memory():
    """torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md (published_torchtitan_compiled.csv:12):
    FSDP on 32 H200, local batch 2, selective AC, --training.compile (blocks and, at that commit, the
    loss) + Float8: 47.96 GiB. The same run with the loss eager would hold 8 more bytes per logit
    (2 x 8192 x 128256 x 8 = 15.7 GiB more). IN-SAMPLE for the compiled-loss bytes (4, counted from
    Inductor's fused cross entropy, not fitted). 10%: the issue's memory target."""
    model = presets.model("llama3-8b")
    plan = Plan(G_data=32, micro_batch_size=2, recompute="selective", zero_stage=3)
    cluster = presets.cluster("eos", 32)
    cluster = dataclasses.replace(cluster, gpu=presets.gpu("H200"))
    compiled = Training(global_batch_size=64, dtype="fp8", stack="torchtitan", torch_compile="blocks+loss")
    got = predict(model, cluster, compiled, plan).memory.per_gpu_gib
    assert got == pytest.approx(47.96, rel=0.10)
    eager_loss = Training(global_batch_size=64, dtype="fp8", stack="torchtitan", torch_compile="blocks")
    assert predict(model, cluster, eager_loss, plan).memory.per_gpu_gib > 47.96 * 1.25


def test_torchtitan_llama31_70b_tp8_fsdp32_peak_memory():
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 4 (published_torchtitan_compiled.csv:10):
    Llama 3.1 70B, FSDP 32 x TP 8 with sequence parallelism, local batch 16, full AC, compiled blocks,
    Float8: 71.9 GiB on H100 96 GB. The loss runs on vocabulary shards (loss_parallel: 16 bytes per
    logit) and the QKV / fc1 GEMMs save their all-gathered inputs; without those two it would be
    predicted at 55.8 GiB (-22%). IN-SAMPLE for both (counted from torch's source, not fitted). 10%:
    the issue's memory target."""
    model = presets.model("llama3-70b")
    training = Training(global_batch_size=512, dtype="fp8", stack="torchtitan", torch_compile="blocks")
    plan = Plan(G_data=32, G_intra_r=8, micro_batch_size=16, recompute="full", zero_stage=3,
                sequence_parallel=True, placement=MEGATRON_ORDER)
    got = predict(model, presets.cluster("grand-teton", 256), training, plan)
    assert got.memory.per_gpu_gib == pytest.approx(71.9, rel=0.10)
    assert got.memory.fits


def test_nemo_llama31_405b_on_1024_h100_fits_and_times():
    """NeMo 25.11 performance table (published_nemo_perf_summary.csv:13): Llama 3.1 405B, TP8 PP8 CP2
    VP8, FP8, 292 tokens/s/GPU -> 512 x 8192 / (292 x 1024) = 14.03 s. It ran, so it must fit in
    80 GiB: with fp32 gradient buffers (Megatron-LM's default) it would not. IN-SAMPLE for the `nemo`
    stack's bf16 gradients. 15%: the FP8 rows' scatter (see the 175B FP8 case)."""
    model = presets.model("llama3-405b")
    model = dataclasses.replace(model, seq_length=4096, attention_span=8192)  # CP2: each rank's half
    training = Training(global_batch_size=1024, dtype="fp8", stack="nemo", overlap_tp_comm=True)
    plan = Plan(G_data=16, G_inter=8, G_intra_r=8, micro_batch_size=1, schedule="interleaved-1f1b",
                virtual_stages=8, zero_stage=1, sequence_parallel=True, placement=MEGATRON_ORDER)
    got = predict(model, presets.cluster("eos", 1024), training, plan)
    assert got.memory.fits
    assert got.iteration_time_s == pytest.approx(512 * 8192 / (292 * 1024), rel=0.15)
    fp32_grads = Training(global_batch_size=1024, dtype="fp8", stack="megatron-core", overlap_tp_comm=True)
    assert not predict(model, presets.cluster("eos", 1024), fp32_grads, plan).memory.fits


def test_llmfoundry_mpt_1b_32k_on_8_h100():
    """LLM Foundry H100 table (published_llmfoundry_h100.csv:53): MPT-1B at sequence 32,768, 8 H100,
    FSDP, no AC: 12,025 tokens/s/GPU -> 32 x 32768 / (12025 x 8) = 10.90 s. Attention is most of the
    step, run by MPT's 2023 Triton flash kernel. IN-SAMPLE for the choice of the `pre-hopper` flash
    ceiling (its rate is derived from the A100's and the H100's SM count and clock, not fitted).
    15%: the p90 error of the LLM Foundry H100 rows."""
    model = Model(name="mpt-1b", num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=32768,
                  vocab_size=50368, tied_embeddings=True, dropout=False)
    training = Training(global_batch_size=32, dtype="bf16", stack="fsdp")
    plan = Plan(G_data=8, micro_batch_size=1, zero_stage=3)
    got = predict(model, presets.cluster("eos", 8), training, plan)
    assert got.iteration_time_s == pytest.approx(32 * 32768 / (12025 * 8), rel=0.15)
