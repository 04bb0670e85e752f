"""Memory per GPU of the busiest pipeline stage, in GiB, vectorized over plans.

Parts:
- model states: weights, gradients and optimizer state as the training stack holds them
  (`model_state_bytes`, `perfmodels.stacks`), sharded by the 3D tensor degrees
  G_intra_r*G_intra_c*G_intra_d and, per ZeRO stage, over G_data; plus the transient full
  (row, col) blocks that depth sharding gathers for the layer being computed and the one prefetched;
- activations (Korthikanti et al. 2022, bytes per layer per micro-batch at 16-bit):
  34 s b h + 5 a s^2 b without recomputation (with dropout; a model trained without it saves
  32 s b h + 2 a s^2 b: no masks, no dropped-out scores). Of the 34, 10 sit on the residual stream (split over
  G_intra_c here, replicated by Megatron's row-only tensor parallelism) and 24 inside attention/MLP
  (split over G_intra_r); the 5 a s^2 b of attention scores is split over G_intra_r and vanishes
  with flash attention or selective recomputation; full recomputation keeps only each layer's input
  (2 s b h) plus one layer's working set. 1F1B keeps min(m, G_inter) micro-batches in flight on the
  first stage (interleaved: times 1 + (G_inter-1)/(G_inter*v)), GPipe all m;
- the LM head's logits (16-bit + fp32 copy for the loss) on the last stage;
- explicit overheads, per stack: CUDA context and library workspaces, NCCL buffers per
  communicator, and allocator fragmentation (a fraction of activations).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodels.plans import RECOMPUTE_CODE, SCHEDULE_CODE, PlanArrays
from perfmodels.specs import Cluster, Model, Training
from perfmodels.structure import Linear, Unit
from perfmodels.traffic import StageShape, padded_vocab, units_on_stage

GIB = float(1 << 30)
RESIDUAL_BYTES_NO_DROPOUT = 8.0
"""Bytes per token per hidden unit a block saves on its residual stream without dropout
(Korthikanti et al. 2022, Sec. 4.1: two LayerNorm inputs 4, the QKV and fc1 inputs 4)."""
GEMM_INPUT_BYTES = 4.0
"""Of `RESIDUAL_BYTES_NO_DROPOUT`, the 16-bit inputs of the QKV and fc1 GEMMs (2 + 2): what
sequence parallelism all-gathers before those GEMMs."""
DROPOUT_MASK_BYTES = 2.0
"""Bytes per token per hidden unit of the two 1-byte dropout masks (after attention, after the MLP)."""
SCORE_BYTES_NO_DROPOUT = 2.0
"""Bytes per attention score unfused attention keeps without dropout (the 16-bit softmax output)."""
SCORE_DROPOUT_BYTES = 3.0
"""Bytes per score attention dropout adds: its 1-byte mask and the 16-bit dropped-out scores."""
PER_OP_SELECTIVE_KEEP = 0.5
"""Fraction of a block's activations that torchtitan's per-op selective checkpointing keeps (the
matmul and attention outputs of every second matmul; element-wise outputs are recomputed)."""


@dataclass(frozen=True)
class ModelStates:
    """Bytes per rank of weights, gradients and optimizer state (arrays over plans)."""

    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray


def weight_bytes_in_use(training: Training) -> float:
    """Bytes per element of the weights the GEMMs read once gathered (16-bit in mixed precision)."""
    return 4.0 if training.dtype in ("fp32", "tf32") else 2.0


def model_state_bytes(training: Training, local: np.ndarray, arrays: PlanArrays,
                      linear_local: np.ndarray | None = None) -> ModelStates:
    """Weights, gradients and optimizer state for `local` parameters per rank, as the stack holds
    them and as the ZeRO stage shards them over G_data (see `perfmodels.stacks` for the bytes):

    - ZeRO-1 shards the fp32 master and the Adam moments (Megatron's distributed optimizer:
      bf16 weights 2 + fp32 gradients 4 + 12/d);
    - ZeRO-2 also shards the gradients where the stack keeps only its shard (DeepSpeed, FSDP
      SHARD_GRAD_OP: reduce-scatter per micro-batch); Megatron-Core / Apex DistributedFusedAdam keep
      accumulating into the full buffer and reduce-scatter once per step;
    - ZeRO-3 shards the weights too. Combined with a pipeline (G_inter > 1) the stage's parameters are
      gathered once per step and stay gathered in the compute dtype until the step ends (FSDP with
      pipelining does not reshard after forward), so a full 16-bit copy is held.
    FP8 training adds the cached FP8 weight copies of Transformer Engine for the `linear_local`
    parameters (the linear layers' share of `local`; all of it when None).
    """
    stack = training.effective_stack
    z = arrays.zero_stage
    d = arrays.G_data.astype(np.float64)
    mixed = training.dtype not in ("fp32", "tf32")
    weight_b = stack.weight_bytes if mixed else 4.0
    z2 = z == 2
    master_b = stack.master_bytes if mixed else 0.0
    if mixed and stack.zero2_master_bytes is not None:
        master_b = np.where(z2, stack.zero2_master_bytes, master_b)
    grad_b = stack.grad_bytes(training.dtype)
    if mixed and stack.zero2_grad_bytes is not None:
        grad_b = np.where(z2, stack.zero2_grad_bytes, grad_b)
    fp32_grad_b = stack.fp32_grad_bytes_bf16 if training.dtype == "bf16" else 0.0
    opt_b = stack.optimizer_state_bytes if training.optimizer != "sgd" else 4.0  # SGD: momentum
    one = np.ones(len(arrays))
    shard_states = np.where(z >= 1, d, one)
    grads_sharded = (z == 3) | ((z == 2) & (stack.zero2_grad_reduce == "per_microbatch"))
    shard_grads = np.where(grads_sharded, d, one)
    shard_fp32_grads = np.where(z >= 2, d, one)
    shard_weights = np.where(z >= 3, d, one)
    params = local * weight_b / shard_weights
    pipelined_zero3 = (z == 3) & (arrays.G_inter > 1)
    params = params + np.where(pipelined_zero3, local * weight_bytes_in_use(training), 0.0)
    if training.dtype == "fp8":
        params = params + (local if linear_local is None else linear_local) * stack.fp8_weight_cache_bytes
    grads = local * grad_b / shard_grads + local * fp32_grad_b / shard_fp32_grads
    optimizer = local * (master_b + opt_b) / shard_states
    return ModelStates(params=params, grads=grads, optimizer=optimizer)


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
    s, h, q = model.seq_length, model.hidden_size, model.q_size
    f, kv, a = model.mean_dense_ffn, model.kv_hidden_size, model.num_attention_heads
    b = arrays.micro_batch_size.astype(np.float64)
    G_r, G_c = arrays.G_intra_r.astype(np.float64), arrays.G_intra_c.astype(np.float64)
    sp = arrays.sequence_parallel
    resid = np.where(sp, G_r, G_c)
    scale = training.bytes_per_element / 2.0
    f_up = (2.0 if model.gated_mlp else 1.0) * f
    # of the residual stream's 10 s b h, 2 are the two 1-byte dropout masks (after attention and
    # after the MLP), which a model trained without dropout never draws
    replicated = (RESIDUAL_BYTES_NO_DROPOUT + DROPOUT_MASK_BYTES * model.dropout) * s * b * h
    split = s * b * (2 * q + 2 * kv + 2 * kv + 2 * q + 2 * f_up + 2 * f)
    stack = training.effective_stack
    gemm_inputs = GEMM_INPUT_BYTES * s * b * h  # the QKV and fc1 inputs, part of `replicated`
    if training.dtype == "fp8" and stack.fp8_saves_fp8_inputs:
        # Transformer Engine saves each linear layer's input for backward in FP8 (1 byte), not bf16:
        # the QKV and fc1 inputs on the residual stream, the out-proj and fc2 inputs inside
        replicated = replicated - gemm_inputs / 2.0
        gemm_inputs = gemm_inputs / 2.0
        split = split - s * b * (q + f)
    if stack.sp_saves_gathered_inputs:
        # the QKV and fc1 GEMMs save the full-sequence input their all-gather produced: G_r times the
        # sequence shard Megatron keeps (it all-gathers again in backward)
        replicated = replicated - gemm_inputs + gemm_inputs * np.where(sp, G_r, 1.0)
    # unfused attention keeps the softmax output (2 bytes per score), and with dropout also its mask
    # (1) and the dropped-out scores that multiply V (2)
    per_score = SCORE_BYTES_NO_DROPOUT + SCORE_DROPOUT_BYTES * model.dropout
    scores = 0.0 if stack.flash_attention else per_score * a * s * float(model.span) * b
    selective = arrays.recompute == RECOMPUTE_CODE["selective"]
    if stack.selective_recompute == "per-op":
        # torchtitan's op-level policy drops the element-wise outputs and every second matmul's
        kept = np.where(selective, PER_OP_SELECTIVE_KEEP, 1.0)
        return scale * kept * (replicated / resid + split / G_r + scores / G_r)
    scores = np.where(selective, 0.0, scores)
    if model.multi_latent_attention and model.is_moe and stack.selective_recompute == "attention-core":
        # Megatron's MoE recipes also recompute MLA's up-projections ("mla_up_proj"): the queries,
        # keys and values they produce are not kept
        a_qk = model.num_attention_heads * (int(model.qk_head_dim) + int(model.qk_pos_emb_head_dim))
        a_kv = model.num_attention_heads * (int(model.qk_head_dim) + int(model.v_head_dim))
        up = s * b * 2.0 * (a_qk + a_kv)
        split = split - np.where(selective, up, 0.0)
    return scale * (replicated / resid + split / G_r + scores / G_r)


def peak_memory(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays, blocks: np.ndarray,
                m: np.ndarray) -> StageMemory:
    """Memory of the fuller of the first and the last pipeline stage, each holding `blocks` blocks.

    The first stage holds the embedding and the most micro-batches in flight (1F1B warms up
    G_inter of them there); the last holds the LM head, its logits and a single micro-batch (one
    chunk per virtual stage plus the interleaved warm-up). Taking the first stage's activations with
    the last stage's head would count both worst cases at once. Without a pipeline the two coincide.
    """
    one = arrays.G_inter == 1
    n = len(arrays)
    first = StageShape(blocks=blocks, has_embedding=np.ones(n, bool), has_head=one, is_first=np.ones(n, bool),
                       is_last=one)
    last = StageShape(blocks=blocks, has_embedding=one, has_head=np.ones(n, bool), is_first=one,
                      is_last=np.ones(n, bool))
    a = stage_memory(model, cluster, training, arrays, first, m, position="first")
    b = stage_memory(model, cluster, training, arrays, last, m, position="last")
    take_a = a.total_gib >= b.total_gib
    pick = {name: np.where(take_a, getattr(a, name), getattr(b, name))
            for name in ("params_gib", "grads_gib", "optimizer_gib", "activations_gib", "comm_buffers_gib",
                         "overhead_gib", "total_gib")}
    # a CPU rank shares its host's memory with the node's other ranks
    return StageMemory(**pick, capacity_gib=capacity_per_rank_gib(cluster))


def in_flight_layers(arrays: PlanArrays, m: np.ndarray, position: str) -> np.ndarray:
    """Micro-batches' worth of a stage's activations held at the peak, on the first or last stage
    (`in_flight`)."""
    return in_flight(arrays.G_inter, arrays.virtual_stages, arrays.schedule, m, position)


def in_flight(stages: np.ndarray, virtual: np.ndarray, schedule: np.ndarray | int, m: np.ndarray,
              position: str) -> np.ndarray:
    """Micro-batches' worth of a stage's activations held at the peak, on the first or last stage,
    of pipelines of `stages` stages running `schedule` (a code) with `virtual` chunks per stage.

    GPipe keeps all m. 1F1B keeps min(m, G_inter - r) on stage r. Interleaved 1F1B with v chunks
    runs (G_inter - r - 1) * 2 + (v - 1) * G_inter warm-up chunk forwards before its first backward,
    each 1/v of the stage, so stage r holds (that + 1) / v stages' worth (Megatron's schedule)."""
    S, v = np.asarray(stages, dtype=np.float64), np.asarray(virtual, dtype=np.float64)
    r = np.zeros(S.shape) if position == "first" else S - 1
    plain = np.minimum(m, S - r)
    interleaved = np.minimum(m, ((S - r - 1) * 2 + (v - 1) * S + 1) / v)
    out = np.where(schedule == SCHEDULE_CODE["gpipe"], m, plain)
    return np.where(schedule == SCHEDULE_CODE["interleaved-1f1b"], interleaved, out)


@dataclass(frozen=True)
class UnitMemory:
    """What one unit puts in a stage's memory (bytes or parameter counts, arrays over plans or 0):
    `local` parameters this rank holds of it (all its copies on the stage), of which
    `linear_local` have FP8 weight copies cached; `gathered` parameters depth sharding gathers for
    one block at a time; `zero3_unit` parameters in one ZeRO-3 gather unit; per micro-batch and per
    layer of the stage, `act_layer` activation bytes saved for backward and `layer_input` bytes of
    the input that full recomputation keeps; `logits` bytes of the loss's logits."""

    local: np.ndarray | float = 0.0
    linear_local: np.ndarray | float = 0.0
    gathered: np.ndarray | float = 0.0
    zero3_unit: np.ndarray | float = 0.0
    act_layer: np.ndarray | float = 0.0
    layer_input: np.ndarray | float = 0.0
    logits: np.ndarray | float = 0.0


def capacity_per_rank_gib(cluster: Cluster) -> float:
    """Memory one rank may use: a GPU's own memory; for CPU "devices" (vendor "cpu", ranks that are
    processes on one host) the host's memory shared by the ranks placed on one node."""
    if cluster.gpu.vendor == "cpu":
        return float(cluster.gpu.memory_gib) / cluster.gpus_per_node_used
    return float(cluster.gpu.memory_gib)


def unit_parts(model: Model, training: Training, arrays: PlanArrays, st: StageShape) -> list[UnitMemory]:
    """Each unit's memory on the stage `st` (`_unit_memory`), the part of `stage_memory` that does not
    depend on the ZeRO stage."""
    return [_unit_memory(model, training, arrays, unit, st) for unit in model.units]


def _is_zero(x: np.ndarray | float) -> bool:
    return isinstance(x, float) and x == 0.0


def _unit_memory(model: Model, training: Training, arrays: PlanArrays, unit: Unit,
                 st: StageShape) -> UnitMemory:
    """The memory of `unit`'s copies on the stage `st` (`units_on_stage`)."""
    G_r, G_c, G_d = (x.astype(np.float64) for x in (arrays.G_intra_r, arrays.G_intra_c, arrays.G_intra_d))
    e = training.bytes_per_element
    b = arrays.micro_batch_size.astype(np.float64)
    stack = training.effective_stack
    count = units_on_stage(unit, st, arrays)
    if unit.attention:  # a transformer block: its weights and norms split over the 3D tensor degrees
        per_block = unit.params / (G_r * G_c * G_d)
        local = count * per_block
        s, h = model.seq_length, model.hidden_size
        return UnitMemory(
            local=local, linear_local=local, zero3_unit=per_block,
            gathered=np.where(G_d > 1, 2.0 * unit.params / 4 / (G_r * G_c), 0.0),  # two Linear blocks
            act_layer=activation_bytes_per_layer(model, training, arrays),
            layer_input=2.0 * s * b * h / np.where(arrays.sequence_parallel, G_r, G_c) * (e / 2.0),
        )
    if unit.placement == "embedding":
        # Megatron-style stacks split the embedding's vocabulary over the tensor-parallel ranks; the
        # engine splits its hidden dimension over col
        emb_split = G_r * G_c if stack.vocab_parallel_embedding else G_c
        return UnitMemory(local=count * (model.vocab_size + model.seq_length) * model.hidden_size / emb_split)
    if unit.loss:  # the LM head: a tied one shares the word embedding's weights where both sit on one stage
        own = count * (1.0 - model.tied_embeddings * st.has_embedding)
        V = padded_vocab(model.vocab_size, arrays.G_intra_r, arrays.G_intra_d).astype(np.float64)
        local = sum(own * V * lin.k / (G_r * G_c * G_d) for lin in unit.linears)
        per_logit = stack.loss_bytes(e, G_r > 1)
        return UnitMemory(local=local, logits=count * model.seq_length * b * V / G_r * per_logit)
    # a layer list spread over the stages: parallel Linears split over the 3D tensor degrees (here
    # whether or not their shapes divide; compute and traffic ask `Linear.divides`), the rest whole;
    # its activations averaged over its layers (the stage holds `st.blocks` of them)
    held: np.ndarray | float = 0.0
    acts = 0.0
    for layer in unit.layers:
        if isinstance(layer, Linear):
            params = layer.k * layer.n + (layer.n if layer.bias else 0)
            held = held + params / np.where(layer.split == "auto", G_r * G_c * G_d, 1)
            acts = acts + layer.rows_per_sample * (layer.k + layer.n)
        else:
            held = held + layer.params
            acts = acts + layer.activation_elements_per_sample
    local = held * count
    layers = max(1, len(unit.layers))
    act_layer = b * acts * e / layers
    return UnitMemory(local=local, linear_local=local, zero3_unit=local / layers, act_layer=act_layer,
                      layer_input=act_layer / 2)


def _summed(parts: list[UnitMemory], name: str, n: int) -> np.ndarray:
    return sum((getattr(p, name) for p in parts if not _is_zero(getattr(p, name))), np.zeros(n))


def state_bytes(model: Model, training: Training, arrays: PlanArrays, st: StageShape,
                parts: list[UnitMemory], *, experts: bool = True) -> ModelStates:
    """The weights (with depth's gathered block and ZeRO-3's gather units), gradients and optimizer
    state of the stage `st` in bytes, routed experts included (unless not `experts`: then
    `expert_state_bytes` is the rest): the part of `stage_memory` that the ZeRO stage changes, on its
    own for bounds that try every ZeRO stage (`perfmodels.bounds`)."""
    n = len(arrays)
    local, linear_local = _summed(parts, "local", n), _summed(parts, "linear_local", n)
    states = model_state_bytes(training, local, arrays, linear_local)
    if model.is_moe and experts:
        e_states = expert_state_bytes(model, training, arrays, st.blocks)
        states = ModelStates(params=states.params + e_states.params, grads=states.grads + e_states.grads,
                             optimizer=states.optimizer + e_states.optimizer)
    mixed = training.dtype not in ("fp32", "tf32")
    stored_b = training.effective_stack.weight_bytes if mixed else 4.0
    # depth gathers the stored shards (the engine keeps fp32 parameters); ZeRO-3 without a pipeline
    # holds the unit being computed and the prefetched next one, gathered in the compute dtype
    # (per-tensor gathering holds two tensors: the largest, an MLP matrix, is a third of a block)
    unit_share = 1.0 if training.effective_stack.zero3_gather == "layer" else 1.0 / 3.0
    per_unit = _summed(parts, "zero3_unit", n)
    zero3_units = np.where((arrays.zero_stage == 3) & (arrays.G_inter == 1), 2.0 * per_unit * unit_share, 0.0)
    params = (states.params + _summed(parts, "gathered", n) * stored_b
              + zero3_units * weight_bytes_in_use(training))
    return ModelStates(params=params, grads=states.grads, optimizer=states.optimizer)


def stage_memory(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays, st: StageShape,
                 m: np.ndarray, position: str = "first",
                 parts: list[UnitMemory] | None = None) -> StageMemory:
    """The memory of the stage `st`. `parts`: its units' memory (`unit_parts`) when already known
    for plans that differ from `arrays` only in their ZeRO stage (which the units' shares ignore)."""
    if parts is None:
        parts = unit_parts(model, training, arrays, st)
    states = state_bytes(model, training, arrays, st, parts)
    params, grads, optimizer = states.params, states.grads, states.optimizer
    activations, comm, overhead, _ = rest_bytes(model, cluster, training, arrays, st, m, position, parts)
    total = params + grads + optimizer + activations + comm + overhead
    return StageMemory(
        params_gib=params / GIB, grads_gib=grads / GIB, optimizer_gib=optimizer / GIB,
        activations_gib=activations / GIB, comm_buffers_gib=comm / GIB, overhead_gib=overhead / GIB,
        total_gib=total / GIB, capacity_gib=float(cluster.gpu.memory_gib),
    )


def rest_bytes(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays, st: StageShape,
               m: np.ndarray, position: str, parts: list[UnitMemory], *, experts: bool = True
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(activations, NCCL buffers, overhead) bytes of the stage `st`: the part of `stage_memory` that
    the ZeRO stage does not change, on its own for bounds that try every ZeRO stage
    (`perfmodels.bounds`); and the bytes each micro-batch in flight adds to them (its activations
    and their fragmentation), so the bounds can price another schedule's count (`in_flight`). The
    routed experts are included unless not `experts` (then `expert_rest_bytes` is the rest)."""
    n = len(arrays)
    act_layer, layer_input, logits = (_summed(parts, name, n)
                                      for name in ("act_layer", "layer_input", "logits"))
    # one set of NCCL buffers per communicator this rank talks through (each axis with peers, and
    # the pipeline's point-to-point pairs)
    communicators = sum((d > 1).astype(np.float64) for d in arrays.degrees().values())
    if model.is_moe and experts:
        e_act, e_comms = expert_activations(model, training, arrays)
        act_layer, communicators = act_layer + e_act, communicators + e_comms
    return _rest_terms(cluster, training, arrays, st, m, position, act_layer, layer_input, logits,
                       communicators, with_context=True)


def expert_rest_bytes(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays, st: StageShape,
                      m: np.ndarray, position: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The routed experts' share of `rest_bytes` (which is linear in the per-layer activations and the
    communicator count): `rest_bytes(..., experts=False)` plus this is `rest_bytes` (to rounding), so
    bounds can evaluate the rest once for grids that differ only in their expert degrees."""
    e_act, e_comms = expert_activations(model, training, arrays)
    return _rest_terms(cluster, training, arrays, st, m, position, e_act, 0.0, 0.0, e_comms,
                       with_context=False)


def _rest_terms(cluster: Cluster, training: Training, arrays: PlanArrays, st: StageShape, m: np.ndarray,
                position: str, act_layer: np.ndarray, layer_input: np.ndarray | float,
                logits: np.ndarray | float, communicators: np.ndarray, *, with_context: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`rest_bytes` from the stage's per-layer activations (all of them, and the input that full
    recomputation keeps), its logits and its communicator count."""
    blocks = st.blocks.astype(np.float64)
    stack = training.effective_stack
    in_flight = in_flight_layers(arrays, m, position)
    full = arrays.recompute == RECOMPUTE_CODE["full"]
    per_mb = np.where(full, blocks * layer_input, blocks * act_layer)
    working = np.where(full, act_layer, 0.0)  # one layer recomputed at a time
    activations = per_mb * in_flight + working + logits
    on_gpu = cluster.gpu.vendor != "cpu"
    comm = stack.comm_buffer_gib * GIB * communicators * (cluster.backend != "gloo")
    overhead = stack.context_gib * GIB * on_gpu * with_context + stack.fragmentation * activations
    return activations, comm, overhead, per_mb * (1.0 + stack.fragmentation)


def expert_state_bytes(model: Model, training: Training, arrays: PlanArrays,
                       blocks: np.ndarray) -> ModelStates:
    """A stage's routed experts' (`perfmodels.experts`) weights, gradients and optimizer state, for
    `blocks` blocks: E / G_ep experts per MoE layer split over G_etp; ZeRO shards them over the
    expert-data ranks, as Megatron's distributed optimizer does."""
    return model_state_bytes(training, *expert_shards(model, arrays, blocks))


def expert_shards(model: Model, arrays: PlanArrays, blocks: np.ndarray) -> tuple[np.ndarray, PlanArrays]:
    """(routed-expert parameters a rank holds on a stage of `blocks` blocks, the plans with G_data the
    expert-data degree they are sharded over): what `model_state_bytes` takes for the experts, the
    same for every ZeRO stage."""
    from perfmodels import experts

    deg = experts.expert_degrees(arrays)
    per_layer = experts.local_expert_params(model, arrays)
    local = np.asarray(blocks, dtype=np.float64) * model.moe_fraction * per_layer
    return local, arrays.with_columns(G_data=deg["edp"])


def expert_activations(model: Model, training: Training, arrays: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """The routed experts' (k copies of each token) per-layer activations, averaged in by the share of
    MoE layers, and the experts' communicators."""
    from perfmodels import experts

    kept = experts.activation_bytes(model, training, arrays)  # selective recomputation keeps them too
    comms = sum((d > 1).astype(np.float64) for d in experts.expert_degrees(arrays).values())
    return model.moe_fraction * kept, comms
