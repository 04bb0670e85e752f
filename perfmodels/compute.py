"""Compute time of one pipeline stage: GEMMs, attention, memory-bound kernels, optimizer step.

GEMM time follows a measured-shape efficiency curve:

    t = 2 m n k / (R * shape) + t0,   shape = 1 / (1 + H/m + H/n + H/k)

R is the asymptotic TFLOP/s of a large GEMM (peak x the family's best efficiency, or a profile's
`gemm_tflops_max`), H (`gemm_half_size`) how fast efficiency falls for small or skinny shards
(tensor parallelism shrinks n or k by the degree that splits them), t0 a per-kernel overhead.
Backward GEMMs (input grad and weight grad) cost twice the forward ones.

Element-wise work (norms, residual adds, dropout, activation functions, softmax over the s x s
scores when attention is not fused) streams through HBM: bytes / (HBM bandwidth x efficiency).
Attention itself: either unfused batched GEMMs over the score matrix (the 2021-22 Megatron
kernels), or a fused flash kernel (no s x s traffic; causal masking halves the work; backward
recomputes the scores, 2.5x forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfmodels.plans import RECOMPUTE_CODE, PlanArrays, equal_runs
from perfmodels.specs import Cluster, Model, Training
from perfmodels.structure import Linear, Unit
from perfmodels.traffic import StageShape, padded_vocab, units_on_stage

DEFAULT_GEMM_HALF_SIZE = {"nvidia": 56.0, "amd": 96.0, "cpu": 8.0}
KERNEL_OVERHEAD_US = {"nvidia": 4.0, "amd": 6.0, "cpu": 2.0}
FP8_CAST_BYTES_PER_ELEMENT = 3.0
"""FP8 training (Transformer Engine) quantizes every linear layer's input in forward and its output
gradient in backward: read 2 bytes (bf16), write 1 byte (fp8) per element, plus the transposed
copy backward needs; the weights' FP8 copies are cached between micro-batches."""
HOST_US_PER_BLOCK = {"nvidia": 900.0, "amd": 900.0, "cpu": 0.0}
"""Host (CPU) time to issue one transformer block's forward pass in eager PyTorch: about 30 ops at
~30 us each (dispatch, autograd recording, module hooks). Backward issues about twice as many, a
full recomputation repeats the forward. On a CPU "device" the host does the work itself, so its op
overheads are already in the compute time. Checked against vTrain's single-node Megatron-DeepSpeed
runs (8x A100, 350M-1.3B models), where small shards are host-bound by 3-7x."""
AMPERE_SM_CLOCK_SPEEDUP_ON_HOPPER = (132 / 108) * (1.98 / 1.41)
"""How much faster an Ampere-generation kernel (mma.sync, no wgmma/TMA) runs on an H100 SXM than on an
A100: the SM count (132 vs 108) times the boost clock (1.98 vs 1.41 GHz), about 1.72x."""
AMPERE_FLASH_TFLOPS = (0.45 * 312.0, 0.35 * 312.0)
"""Forward and backward TFLOP/s of fused attention on an A100 (the A100 preset's flash efficiencies of
its 312 TFLOP/s). Kernels written for Ampere (the 2023 Triton FlashAttention kernel MPT's
`attn_impl: triton` runs, FlashAttention-2 before its Hopper port) reach at most these rates times
`AMPERE_SM_CLOCK_SPEEDUP_ON_HOPPER` on newer GPUs: about 241 and 187 TFLOP/s, 0.24 and 0.19 of an
H100's bf16 peak, where Hopper-native kernels reach about 0.45 and 0.40."""
SCORE_PASSES = 4.5
"""Element passes over the s x span score matrix of unfused attention per forward: scale+mask+softmax
reads and writes it (2), dropout reads, writes and stores a one-byte mask (2.5 in 16-bit units)."""
RESIDUAL_PASSES = 12.0
"""Element passes over the residual stream per block forward: two norms (read, write), two residual
adds with dropout (read two, write one, a mask), the bias adds of the two output projections."""
ELEMENTWISE_KERNELS_PER_BLOCK = 8
"""Memory-bound kernel launches per block forward (norms, adds, activation, dropout), each paying the
per-kernel overhead."""
OTHER_LAYER_EFFICIENCY = 0.3
"""Fraction of the GEMM rate that layers other than Linear (convolutions, embeddings, norms given by
their FLOPs in a layer list) reach: a conservative mix of convolution and memory-bound kernels."""
PER_OP_SELECTIVE_GEMM_SHARE = 0.5
"""Share of a block's forward matmul time that torchtitan's per-op selective checkpointing repeats:
its policy saves the output of every second matmul and recomputes the others."""


@dataclass(frozen=True)
class GemmCurve:
    tflops_max: float
    half_size: float
    overhead_s: float


def gemm_curve(cluster: Cluster, training: Training, dtype: str | None = None) -> GemmCurve:
    """The GEMM efficiency curve for `dtype` (default: the linear layers' dtype, `training.dtype`).

    FP8 (Transformer Engine) runs the linear GEMMs at the FP8 peak times the family's FP8
    efficiency; the casts around them are memory-bound work (`FP8_CAST_BYTES_PER_ELEMENT`). A
    profile measures the training dtype's GEMMs and replaces the curve for it.
    """
    gpu = cluster.gpu
    prof = cluster.profile
    dtype = dtype or training.dtype
    tflops = gpu.peak_tflops(dtype) * gpu.gemm_efficiency(dtype)
    half = DEFAULT_GEMM_HALF_SIZE.get(gpu.vendor, 56.0)
    overhead = KERNEL_OVERHEAD_US.get(gpu.vendor, 4.0) * 1e-6
    if prof is not None and dtype == training.dtype:
        tflops = prof.gemm_tflops_max or tflops
        half = prof.gemm_half_size if prof.gemm_half_size is not None else half
        overhead = prof.gemm_overhead_us * 1e-6 if prof.gemm_overhead_us is not None else overhead
    return GemmCurve(tflops_max=float(tflops), half_size=float(half), overhead_s=float(overhead))


def gemm_time_s(m: np.ndarray, n: np.ndarray, k: np.ndarray, curve: GemmCurve) -> np.ndarray:
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    h = curve.half_size
    shape = 1.0 / (1.0 + h / m + h / n + h / k)
    return 2.0 * m * n * k / (curve.tflops_max * 1e12 * shape) + curve.overhead_s


def hbm_rate(cluster: Cluster) -> float:
    prof = cluster.profile
    bw = prof.hbm_bandwidth_GBps if prof is not None and prof.hbm_bandwidth_GBps else (
        cluster.gpu.hbm_bandwidth_GBps * cluster.gpu.memory_efficiency)
    return float(bw) * 1e9


@dataclass(frozen=True)
class StageCompute:
    """Per-micro-batch forward/backward seconds of one stage, and per-step extras (arrays)."""

    gemm_fwd_s: np.ndarray
    attention_fwd_s: np.ndarray
    memory_fwd_s: np.ndarray
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    recompute_s: np.ndarray
    optimizer_s: np.ndarray
    wgrad_s: np.ndarray
    head_fwd_s: np.ndarray
    experts_fwd_s: np.ndarray | float = 0.0
    """The routed experts' share of `fwd_s` (router, grouped GEMMs, permutation: what Megatron's
    combined 1F1B schedule runs as a MoE layer's "mlp" node, `perfmodels.experts.overlapped_exposed_s`)."""


def model_flops_per_token(model: Model) -> float:
    """Forward FLOPs per token as MFU counts them (dense, full s x s attention, no recompute): per
    sample for a layer list (`Model.tokens_per_sample` is 1), summed over the model's units."""
    total = 0.0
    for unit in model.units:
        if unit.attention and not _plain_dense(model):
            total = total + unit.count * _general_block_flops_per_token(model, unit)
            continue
        if unit.attention:
            per_block = block_flops_per_token(hidden=model.hidden_size, kv_hidden=model.kv_hidden_size,
                                              ffn=float(model.ffn_hidden_size), gated=model.gated_mlp,
                                              span=model.span)
            total = total + unit.count * per_block
            continue
        for layer in unit.layers:
            if isinstance(layer, Linear):
                flops = layer.flops_per_row * (layer.rows_per_sample / model.tokens_per_sample)
            else:
                flops = layer.flops_per_sample
            total = total + unit.count * flops
    return total


def _plain_dense(model: Model) -> bool:
    """A dense block with standard attention whose heads span the hidden size (the published-run
    FLOPs formula, `block_flops_per_token`, counts exactly these)."""
    return not (model.is_moe or model.multi_latent_attention or model.q_size != model.hidden_size)


def _general_block_flops_per_token(model: Model, unit: Unit) -> float:
    """Forward FLOPs per token of a block of any attention and MLP variant: its Linears (each
    weighted by the share of layers that hold it), the attention core (scores over query-key heads,
    values over value heads: 4 x span x heads x `Model.attention_core_dim`) and, in mixture-of-experts
    layers, the router and the top-k routed experts (`perfmodels.experts.expert_flops_per_token`)."""
    from perfmodels.experts import expert_flops_per_token

    linears = sum(lin.flops_per_row * lin.share for lin in unit.linears)
    core = 4.0 * model.span * model.num_attention_heads * model.attention_core_dim
    return linears + core + model.moe_fraction * expert_flops_per_token(model)


def block_flops_per_token(*, hidden: int, kv_hidden: int, ffn: float, gated: bool, span: int) -> float:
    """Forward FLOPs per token of one transformer block (2 per multiply-add): the q/k/v and output
    projections, the MLP (three matrices when gated), and scores plus values over `span` keys.

    The one copy of this count: MFU here and the Megatron-style FLOPs that published runs report
    (`validation.metrics.megatron_flops`) both use it. Integer inputs give an exact integer."""
    h = hidden
    return 2 * h * (h + 2 * kv_hidden) + 2 * h * h + (3 if gated else 2) * 2 * h * ffn + 4 * span * h


def flash_rates(cluster: Cluster, training: Training, peak_flops: float) -> tuple[float, float]:
    """FLOP/s of the fused attention kernel forward and backward: the GPU's flash efficiencies of its
    dtype peak, or, for a stack whose kernels predate Hopper (`Stack.flash_kernel == "pre-hopper"`),
    at most what those kernels reach there (`AMPERE_FLASH_TFLOPS` x `AMPERE_SM_CLOCK_SPEEDUP_ON_HOPPER`)."""
    gpu = cluster.gpu
    fwd, bwd = peak_flops * gpu.flash_fwd_efficiency, peak_flops * gpu.flash_bwd_efficiency
    if training.effective_stack.flash_kernel == "pre-hopper":
        cap_fwd, cap_bwd = (t * 1e12 * AMPERE_SM_CLOCK_SPEEDUP_ON_HOPPER for t in AMPERE_FLASH_TFLOPS)
        fwd, bwd = min(fwd, cap_fwd), min(bwd, cap_bwd)
    return fwd, bwd


def _attention(model: Model, cluster: Cluster, training: Training, b: np.ndarray,
               heads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | float]:
    """(forward, backward) seconds of one block's attention core over `heads` local heads, and the
    score-matrix elements that element-wise kernels touch (none when a fused kernel keeps them)."""
    s, d = model.seq_length, model.attention_core_dim
    attn_curve = gemm_curve(cluster, training, training.attention_compute_dtype)
    span = float(model.span)  # keys per query: the whole sequence under context parallelism
    if training.effective_stack.flash_attention:
        # causal: half of the s x span score matrix is computed; backward does 2.5x forward's FLOPs
        # (scores recomputed, dQ, dK, dV) at its own, lower efficiency
        attn_flops = 4.0 * b * s * span * d * heads * 0.5
        peak = cluster.gpu.peak_tflops(training.attention_compute_dtype) * 1e12
        fwd_rate, bwd_rate = flash_rates(cluster, training, peak)
        attn = attn_flops / fwd_rate + attn_curve.overhead_s
        attn_bwd = 2.5 * attn_flops / bwd_rate + attn_curve.overhead_s
        return attn, attn_bwd, 0.0
    bh = b * heads  # batched GEMMs over (micro-batch x local heads)
    attn = bh * (gemm_time_s(s, span, d, attn_curve) - attn_curve.overhead_s) * 2 + 2 * attn_curve.overhead_s
    # scale+mask+softmax (read, write) and dropout (read, write, mask byte) over the scores
    return attn, 2.0 * attn, SCORE_PASSES * bh * s * span


@dataclass(frozen=True)
class Rank:
    """What every unit's evaluation shares: the plans, the rates, a rank's tensor degrees (float)
    and micro-batch, the padded vocabulary."""

    arrays: PlanArrays
    cluster: Cluster
    training: Training
    curve: GemmCurve
    rate: float
    G_r: np.ndarray
    G_c: np.ndarray
    G_d: np.ndarray
    b: np.ndarray
    V: np.ndarray

    @classmethod
    def of(cls, model: Model, cluster: Cluster, training: Training, arrays: PlanArrays) -> Rank:
        return cls(arrays=arrays, cluster=cluster, training=training, curve=gemm_curve(cluster, training),
                   rate=hbm_rate(cluster),
                   G_r=arrays.G_intra_r.astype(np.float64), G_c=arrays.G_intra_c.astype(np.float64),
                   G_d=arrays.G_intra_d.astype(np.float64), b=arrays.micro_batch_size.astype(np.float64),
                   V=padded_vocab(model.vocab_size, arrays.G_intra_r, arrays.G_intra_d).astype(np.float64))


@dataclass(frozen=True)
class UnitCompute:
    """Per-micro-batch seconds of one copy of a unit on this rank (arrays over plans).

    Backward runs the GEMMs twice (input grad and weight grad; `gemm` is the weight-grad half),
    `attention_bwd` and `memory_bwd`; full recomputation repeats the forward of `recomputed` units
    but `skipped` (`early_stop_skipped_s`), selective recomputation `selective`."""

    gemm: np.ndarray
    attention: np.ndarray | float
    attention_bwd: np.ndarray | float
    memory: np.ndarray
    memory_bwd: np.ndarray
    selective: np.ndarray | float
    recomputed: bool
    skipped: np.ndarray | float = 0.0

    @property
    def fwd(self) -> np.ndarray:
        return self.gemm + self.attention + self.memory

    @property
    def bwd(self) -> np.ndarray:
        return 2.0 * self.gemm + self.attention_bwd + self.memory_bwd


def linear_gemm_s(lin: Linear, rows: np.ndarray, rank: Rank) -> np.ndarray:
    """Forward GEMM seconds of one Linear on this rank: its local shard (m = rows, n and k divided
    by the degrees that split them), or the whole matrix where it stays replicated."""
    if lin.split == "grid":
        n = rank.V if lin.vocab else lin.n
        out_split, in_split = (rank.G_c, rank.G_r) if lin.transposed else (rank.G_r, rank.G_c)
        return gemm_time_s(rows, n / out_split, lin.k / in_split, rank.curve)
    k, n = lin.k, lin.n
    replicated = gemm_time_s(rows, n, k, rank.curve)
    if lin.split == "plain":
        return replicated
    # auto_parallelize's Linear where its shapes divide (the row/col roles taken as untransposed here,
    # as this model always has; traffic swaps them for a transposed one)
    G_r, G_c, G_d = rank.arrays.G_intra_r, rank.arrays.G_intra_c, rank.arrays.G_intra_d
    return np.where(lin.divides(G_r, G_c, G_d), gemm_time_s(rows, n / G_r, k / G_c, rank.curve), replicated)


def early_stop_skipped_s(unit: Unit, rank: Rank) -> np.ndarray | float:
    """Forward seconds of one block that full recomputation does not repeat where it stops at the
    block's last saved tensor (`Stack.full_recompute_repeats_layer` False): the dense MLP's fc2 GEMM.

    PyTorch's non-reentrant checkpoint stops when the recomputation has saved as many tensors as the
    forward did, and an ATen linear (`addmm`/`mm`, under autocast, on FSDP's flat-parameter views
    and on DTensor shards alike) saves its inputs before it multiplies, so fc2's GEMM is never run
    again: checked with torch 2.13 (`torch.utils._python_dispatch` op logs of the backward of a
    checkpointed LayerNorm-Linear-GELU-Linear block under bf16 autocast, plain (tests/engine/
    test_recompute.py `test_non_reentrant_recomputation_stops_before_the_last_gemm`), and in
    one-off runs on two gloo ranks under FSDP1 with `checkpoint_wrapper` and under DTensor
    ColwiseParallel/RowwiseParallel: the last `addmm`/`mm`, and its all-reduce, are missing from
    the non-reentrant recomputation, present in the reentrant one and with early_stop=False).
    Not skipped: a Linear that is a custom autograd Function, whose tensors are packed only after its
    forward returns (even where it calls `save_for_backward` first), so it multiplies before the
    stop: FP8 linears (Transformer Engine's; torchao's Float8Linear, `matmul_with_hp_or_float8_args`;
    Composer's FP8 checkpoint is Transformer Engine's, which recomputes everything anyway) and the
    engine's depth-sharded Linear (G_intra_d > 1). The shared experts of MoE layers stay counted:
    torchtitan's `MoE.forward` runs them before the `scatter_add` that saves its index, so they are
    recomputed there (the engine runs them last and skips its fc2 GEMM: a small overcount for it)."""
    training = rank.training
    if (not unit.attention or training.effective_stack.full_recompute_repeats_layer
            or training.dtype == "fp8"):
        return 0.0
    skipped: np.ndarray | float = 0.0
    for lin in unit.linears:
        if lin.name == "fc2":
            skipped = skipped + linear_gemm_s(lin, rank.b * lin.rows_per_sample, rank) * lin.share
    return skipped * (rank.G_d == 1)


def _block_core(model: Model, rank: Rank, gemm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                       np.ndarray, np.ndarray]:
    """A transformer block's work besides its Linears: (attention fwd, attention bwd, memory-bound
    fwd, memory-bound bwd, what selective recomputation repeats) seconds, for one block."""
    training, cluster, arrays, rate, curve = rank.training, rank.cluster, rank.arrays, rank.rate, rank.curve
    e = training.bytes_per_element
    G_r, G_c, G_d, b = rank.G_r, rank.G_c, rank.G_d, rank.b
    s, h, f = model.seq_length, model.hidden_size, model.mean_dense_ffn
    a, kv, q = model.num_attention_heads, model.kv_hidden_size, model.q_size
    T = b * s
    f_up = (2.0 if model.gated_mlp else 1.0) * f
    resid_split = np.where(arrays.sequence_parallel, G_r, G_c)
    stack = training.effective_stack
    attn, attn_bwd, score_elems = _attention(model, cluster, training, b, a / G_r)
    # element-wise traffic per block (elements): norms and residual+dropout on the residual stream,
    # activation function on the FFN hidden, bias/reshape of q, k, v
    act_elems = (3.0 if model.gated_mlp else 2.0) * f
    elems = T * (RESIDUAL_PASSES * h / resid_split + act_elems / G_r + 2.0 * (q + 2 * kv) / G_r) + score_elems
    mem = (elems * e * stack.fused_elementwise_bytes_scale / rate
           + ELEMENTWISE_KERNELS_PER_BLOCK * curve.overhead_s)
    # layout conversions of stacks that split more than rows (the engine's col/depth axes)
    split_axes = (G_r > 1).astype(float) + (G_c > 1) + (G_d > 1)
    mem = mem * (1.0 + stack.split_axis_memory_passes * split_axes)
    mem_bwd = 2.0 * mem
    if training.dtype == "fp8":
        # quantize each linear's input (forward) and output gradient (backward, plus transposes)
        linear_inputs = T * ((h / G_c) * 2 + q / G_r + f / G_r)
        linear_grads = T * ((q + 2 * kv) / G_r + h / G_c + f_up / G_r + h / G_c)
        mem = mem + linear_inputs * FP8_CAST_BYTES_PER_ELEMENT / rate
        mem_bwd = mem_bwd + 2.0 * linear_grads * FP8_CAST_BYTES_PER_ELEMENT / rate
    if stack.selective_recompute == "per-op":
        # torchtitan's op-level policy keeps matmul and attention outputs (every other matmul's is
        # dropped) and recomputes the element-wise ops
        selective = mem + PER_OP_SELECTIVE_GEMM_SHARE * gemm
    else:  # Megatron: the attention core (scores, softmax, dropout; the fused kernel's forward)
        selective = attn + score_elems * e / rate
    return attn, attn_bwd, mem, mem_bwd, selective


def unit_compute(model: Model, unit: Unit, rank: Rank) -> UnitCompute:
    """One copy of `unit` on this rank, per micro-batch: its layers in order (Linears by the GEMM
    curve, other layers at `OTHER_LAYER_EFFICIENCY` of it), then what a transformer block adds
    (`_block_core`) or the loss's fp32 logits. Units without a fused element-wise model of their
    own (a layer list) pay each layer's activations through HBM."""
    e = rank.training.bytes_per_element
    b, rate = rank.b, rank.rate
    own_traffic = not (unit.attention or unit.loss)
    gemm: np.ndarray = np.zeros(len(rank.arrays))
    mem: np.ndarray = np.zeros(len(rank.arrays))
    for layer in unit.layers:
        if isinstance(layer, Linear):
            rows = b * layer.rows_per_sample
            gemm = gemm + linear_gemm_s(layer, rows, rank) * layer.share
            if own_traffic:
                mem = mem + rows * (layer.n + layer.k) * e / rate
        else:
            flops = b * layer.flops_per_sample
            gemm = gemm + flops / (rank.curve.tflops_max * 1e12 * OTHER_LAYER_EFFICIENCY)
            mem = mem + b * layer.activation_elements_per_sample * 2 * e / rate
    if unit.attention:
        attn, attn_bwd, core_mem, core_mem_bwd, selective = _block_core(model, rank, gemm)
        return UnitCompute(gemm=gemm, attention=attn, attention_bwd=attn_bwd, memory=mem + core_mem,
                           memory_bwd=2.0 * mem + core_mem_bwd, selective=selective, recomputed=True,
                           skipped=early_stop_skipped_s(unit, rank))
    if unit.loss:
        mem = mem + (b * model.seq_length) * rank.V / rank.G_r * 4.0 * 3.0 / rate  # fp32 logits: softmax + CE
        # the loss's backward passes over the logits once; the head is not recomputed
        return UnitCompute(gemm=gemm, attention=0.0, attention_bwd=0.0, memory=mem, memory_bwd=mem,
                           selective=0.0, recomputed=False)
    return UnitCompute(gemm=gemm, attention=0.0, attention_bwd=0.0, memory=mem, memory_bwd=2.0 * mem,
                       selective=0.0, recomputed=True)


def _optimizer_params(unit: Unit, count: np.ndarray | float, rank: Rank) -> np.ndarray | float:
    """Parameters of `count` copies of `unit` this rank steps: a transformer block's split over the
    3D tensor degrees (its norms with them), the embedding's tables split over col, every Linear's
    local shard (whole where it stays replicated), other layers whole."""
    G_r, G_c, G_d = rank.G_r, rank.G_c, rank.G_d
    if unit.attention:
        return count * (unit.params / (G_r * G_c * G_d))
    if not unit.layers:  # the embedding's tables, split over col along h
        return count * (unit.params / G_c)
    local: np.ndarray | float = 0.0
    for layer in unit.layers:
        if not isinstance(layer, Linear):
            local = local + layer.params
        elif layer.split == "grid":
            local = local + (rank.V if layer.vocab else layer.n) * layer.k / (G_r * G_c * G_d)
        else:
            n, k = layer.n, layer.k
            Gi_r, Gi_c, Gi_d = rank.arrays.G_intra_r, rank.arrays.G_intra_c, rank.arrays.G_intra_d
            local = local + np.where(layer.divides(Gi_r, Gi_c, Gi_d), n * k / (Gi_r * Gi_c * Gi_d), n * k)
    return local * count


DENSE_COLUMNS = ("G_intra_r", "G_intra_c", "G_intra_d", "micro_batch_size", "sequence_parallel")
"""The plan columns a unit's compute (`unit_compute`) reads: the tensor degrees, the micro-batch size
and sequence parallelism."""


def dense_runs(arrays: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each run of consecutive rows equal in `DENSE_COLUMNS`, each row's run). A
    search's rows come grouped (a mixture of experts' grids differ first in their expert degrees,
    a family's plans in their options), so the units' compute is evaluated once per run: no sort,
    and rows in any order still get their own values."""
    return equal_runs([getattr(arrays, name) for name in DENSE_COLUMNS])


def _spread(u: UnitCompute, run: np.ndarray) -> UnitCompute:
    """`u`, evaluated once per run (`dense_runs`), for every row."""
    def at(x: np.ndarray | float) -> np.ndarray | float:
        return x[run] if isinstance(x, np.ndarray) else x

    return UnitCompute(gemm=at(u.gemm), attention=at(u.attention), attention_bwd=at(u.attention_bwd),  # type: ignore[arg-type]
                       memory=at(u.memory), memory_bwd=at(u.memory_bwd), selective=at(u.selective),  # type: ignore[arg-type]
                       recomputed=u.recomputed, skipped=at(u.skipped))


def stage_compute(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                  st: StageShape) -> StageCompute:
    """Compute of the stage `st`: the sum over the model's units of (copies on the stage) x (one
    copy's seconds, `unit_compute`), and the optimizer step over the stage's local parameters (a
    memory-bound pass over weights, gradients and optimizer state; ZeRO-1 and up shard it over the
    data ranks)."""
    return stage_computes(model, cluster, training, arrays, [st])[0]


def stage_computes(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                   shapes: Sequence[StageShape]) -> list[StageCompute]:
    """`stage_compute` of the same plans on several stage shapes (the busiest and the average stage,
    a bound's relaxed stage and its blocks alone): each unit's compute, the part that costs, is
    evaluated once and only the copies per stage differ."""
    rank = Rank.of(model, cluster, training, arrays)
    first, run = dense_runs(arrays)
    dense = rank if len(first) * 2 > len(arrays) else Rank.of(model, cluster, training, arrays.take(first))
    full = arrays.recompute == RECOMPUTE_CODE["full"]
    selective = arrays.recompute == RECOMPUTE_CODE["selective"]
    units: list[tuple[Unit, UnitCompute | None]] = []
    for unit in model.units:
        if not (unit.layers or unit.attention):
            units.append((unit, None))
            continue
        u = unit_compute(model, unit, dense)
        units.append((unit, _spread(u, run) if dense is not rank else u))
    experts_part = None
    if model.is_moe:
        # the routed experts of the stage's MoE layers (perfmodels.experts): their optimizer state is
        # sharded over the expert-data ranks
        from perfmodels import experts

        e_gemm, e_mem = experts.layer_compute(model, training, arrays, rank.curve, rank.rate)
        edp = experts.expert_degrees(arrays)["edp"]
        experts_part = (e_gemm, e_mem, experts.local_expert_params(model, arrays),
                        np.where(arrays.zero_stage >= 1, edp, 1))
    stack = training.effective_stack
    step_bytes = stack.optimizer_step_bytes if training.optimizer != "sgd" else 12.0
    out = []
    for st in shapes:
        zero = np.zeros(len(arrays))
        gemm, attention, memory, fwd, bwd, recompute, head_fwd = (zero,) * 7
        local: np.ndarray | float = 0.0
        experts_fwd: np.ndarray | float = 0.0
        for unit, u in units:
            count = units_on_stage(unit, st, arrays)
            local = local + _optimizer_params(unit, count, rank)
            if u is None:
                continue
            u_fwd = u.fwd
            gemm = gemm + count * u.gemm
            if isinstance(u.attention, np.ndarray):
                attention = attention + count * u.attention
            memory = memory + count * u.memory
            fwd = fwd + count * u_fwd
            bwd = bwd + count * u.bwd
            if u.recomputed:
                repeated = np.where(full, u_fwd - u.skipped, np.where(selective, u.selective, 0.0))
                recompute = recompute + count * repeated
            if unit.loss:
                head_fwd = head_fwd + count * u_fwd
        local = local / np.where(arrays.zero_stage >= 1, arrays.G_data, 1)
        if experts_part is not None:
            e_gemm, e_mem, e_params, e_shards = experts_part
            moe_layers = np.asarray(st.blocks, dtype=np.float64) * model.moe_fraction
            e_fwd = e_gemm + e_mem
            experts_fwd = moe_layers * e_fwd
            gemm, memory = gemm + moe_layers * e_gemm, memory + moe_layers * e_mem
            fwd, bwd = fwd + moe_layers * e_fwd, bwd + moe_layers * 2.0 * e_fwd
            recompute = recompute + moe_layers * np.where(full, e_fwd, 0.0)  # selective: none (experts)
            local = local + moe_layers * e_params / e_shards
        out.append(StageCompute(
            gemm_fwd_s=gemm,
            attention_fwd_s=attention,
            memory_fwd_s=memory,
            fwd_s=fwd,
            bwd_s=bwd,
            recompute_s=recompute,
            optimizer_s=local * step_bytes / rank.rate,
            wgrad_s=gemm,  # the weight-grad half of the backward GEMMs (what async input-grad comm hides in)
            head_fwd_s=head_fwd,
            experts_fwd_s=experts_fwd,
        ))
    return out


def host_seconds_per_block(cluster: Cluster, training: Training) -> float:
    """Host time to issue one block's forward pass (the stack's or `Training`'s, else the default)."""
    stack = training.effective_stack
    us = stack.host_us_per_block
    if us is None:
        us = HOST_US_PER_BLOCK.get(cluster.gpu.vendor, 0.0) * stack.host_scale
    return float(us) * 1e-6
