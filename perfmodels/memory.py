"""Memory per GPU of the busiest pipeline stage, in GiB, vectorized over plans.

Parts:
- model states: weights (training dtype), gradients (fp32 accumulation buffers in mixed precision),
  Adam state (fp32 master copy + two moments = 12 bytes/param; 8 in pure fp32), sharded by the 3D
  tensor degrees G_intra_r*G_intra_c*G_intra_d and, per ZeRO stage, over G_data (1: optimizer,
  2: + gradients, 3: + weights); plus the transient full (row, col) blocks that depth sharding
  gathers for the layer being computed and the one prefetched;
- activations (Korthikanti et al. 2022, bytes per layer per micro-batch at 16-bit):
  34 s b h + 5 a s^2 b without recomputation. Of the 34, 10 sit on the residual stream (split over
  G_intra_c here, replicated by Megatron's row-only tensor parallelism) and 24 inside attention/MLP
  (split over G_intra_r); the 5 a s^2 b of attention scores is split over G_intra_r and vanishes
  with flash attention or selective recomputation; full recomputation keeps only each layer's input
  (2 s b h) plus one layer's working set. 1F1B keeps min(m, G_inter) micro-batches in flight on the
  first stage (interleaved: times 1 + (G_inter-1)/(G_inter*v)), GPipe all m;
- the LM head's logits (16-bit + fp32 copy for the loss) on the last stage;
- explicit overheads: CUDA context and library workspaces, collective buffers, and allocator
  fragmentation (a fraction of activations).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodels.plans import RECOMPUTE_CODE, SCHEDULE_CODE, PlanArrays
from perfmodels.specs import Cluster, Model, Training
from perfmodels.traffic import StageShape, padded_vocab

GIB = float(1 << 30)
CONTEXT_GIB = {"nvidia": 0.9, "amd": 1.0, "cpu": 0.0}
COMM_BUFFER_GIB = {"nccl": 0.6, "rccl": 0.6, "gloo": 0.0}
FRAGMENTATION = 0.08


@dataclass(frozen=True)
class StageMemory:
    params_gib: np.ndarray
    grads_gib: np.ndarray
    optimizer_gib: np.ndarray
    activations_gib: np.ndarray
    comm_buffers_gib: np.ndarray
    overhead_gib: np.ndarray
    total_gib: np.ndarray
    capacity_gib: float


def activation_bytes_per_layer(model: Model, training: Training, arrays: PlanArrays) -> np.ndarray:
    """Korthikanti's per-layer activation bytes for one micro-batch, mapped onto the 3D grid."""
    s, h = model.seq_length, model.hidden_size
    f, kv, a = float(model.ffn_hidden_size), model.kv_hidden_size, model.num_attention_heads
    b = arrays.micro_batch_size.astype(np.float64)
    G_r, G_c = arrays.G_intra_r.astype(np.float64), arrays.G_intra_c.astype(np.float64)
    sp = arrays.sequence_parallel
    resid = np.where(sp, G_r, G_c)
    scale = training.bytes_per_element / 2.0
    f_up = (2.0 if model.gated_mlp else 1.0) * f
    replicated = 10.0 * s * b * h
    split = s * b * (2 * h + 2 * kv + 2 * kv + 2 * h + 2 * f_up + 2 * f)
    scores = 0.0 if training.flash_attention else 5.0 * a * s * float(model.span) * b
    selective = arrays.recompute == RECOMPUTE_CODE["selective"]
    scores = np.where(selective, 0.0, scores)
    return scale * (replicated / resid + split / G_r + scores / G_r)


def stage_memory(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays, st: StageShape,
                 m: np.ndarray) -> StageMemory:
    G_r, G_c, G_d = (x.astype(np.float64) for x in (arrays.G_intra_r, arrays.G_intra_c, arrays.G_intra_d))
    G_data = arrays.G_data.astype(np.float64)
    S, v = arrays.G_inter.astype(np.float64), arrays.virtual_stages.astype(np.float64)
    z = arrays.zero_stage
    e = training.bytes_per_element
    mixed = training.dtype not in ("fp32", "tf32")
    blocks = st.blocks.astype(np.float64)

    if model.is_transformer:
        h = model.hidden_size
        V = padded_vocab(model.vocab_size, arrays.G_intra_r, arrays.G_intra_d).astype(np.float64)
        per_block = model.params_per_layer / (G_r * G_c * G_d)
        local = blocks * per_block + st.has_head * V * h / (G_r * G_c * G_d) + st.has_embedding * (
            model.vocab_size + model.seq_length) * h / G_c
        gathered = np.where(G_d > 1, 2.0 * model.params_per_layer / 4 / (G_r * G_c), 0.0)  # two Linear blocks
        act_layer = activation_bytes_per_layer(model, training, arrays)
        s, b = model.seq_length, arrays.micro_batch_size.astype(np.float64)
        layer_input = 2.0 * s * b * h / np.where(arrays.sequence_parallel, G_r, G_c) * (e / 2.0)
        logits = st.has_head * s * b * V / G_r * (e + 4.0)
    else:
        local = np.zeros(len(arrays))
        for layer in model.layers:
            local = local + layer.num_params / np.where(layer.parallel and layer.kind == "linear", G_r * G_c * G_d, 1)
        local = local / S
        gathered = np.zeros(len(arrays))
        b = arrays.micro_batch_size.astype(np.float64)
        acts = sum(
            (layer.rows_per_sample * (layer.in_features + layer.out_features) if layer.kind == "linear"
             else layer.activation_elements_per_sample) for layer in model.layers)
        act_layer = b * acts * e / max(1, len(model.layers))
        layer_input = act_layer / 2
        logits = np.zeros(len(arrays))

    weight_b = float(e)
    # bf16 accumulates gradients in fp32 buffers (Megatron's default); fp16 keeps them in fp16
    # (loss scaling) with the fp32 master copy in the optimizer state
    grad_b = 4.0 if training.dtype in ("bf16", "fp8") else float(e)
    opt_b = 12.0 if mixed else 8.0
    if training.optimizer == "sgd":
        opt_b = 4.0 if mixed else 0.0
    params = local * weight_b / np.where(z >= 3, G_data, 1.0) + gathered * weight_b
    grads = local * grad_b / np.where(z >= 2, G_data, 1.0)
    optimizer = local * opt_b / np.where(z >= 1, G_data, 1.0)

    sched = arrays.schedule
    in_flight = np.where(sched == SCHEDULE_CODE["gpipe"], m, np.minimum(m, S))
    in_flight = np.where(sched == SCHEDULE_CODE["interleaved-1f1b"], in_flight * (1.0 + (S - 1) / (S * v)), in_flight)
    full = arrays.recompute == RECOMPUTE_CODE["full"]
    per_mb = np.where(full, blocks * layer_input, blocks * act_layer)
    working = np.where(full, act_layer, 0.0)  # one layer recomputed at a time
    activations = per_mb * in_flight + working + logits

    comm = np.full(len(arrays), COMM_BUFFER_GIB.get(cluster.backend, 0.5) * GIB)
    comm = comm + 2 * 25e6 * 4 * (G_data > 1)  # two DP buckets of 25 M fp32 elements
    overhead = CONTEXT_GIB.get(cluster.gpu.vendor, 0.9) * GIB + FRAGMENTATION * activations
    total = params + grads + optimizer + activations + comm + overhead
    return StageMemory(
        params_gib=params / GIB, grads_gib=grads / GIB, optimizer_gib=optimizer / GIB,
        activations_gib=activations / GIB, comm_buffers_gib=comm / GIB, overhead_gib=overhead / GIB,
        total_gib=total / GIB, capacity_gib=float(cluster.gpu.memory_gib),
    )
