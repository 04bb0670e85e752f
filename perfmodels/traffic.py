"""Every collective one rank issues in one optimizer step, as vectorized events.

This module is the byte contract between the model and the engine: for a plan, the engine's
communication recorder (engine.recorder.CommRecorder) counts, per group and per steady-state step,
exactly the calls and bytes that `calls_per_group` / `bytes_per_group` return. tests/engine/
test_traffic.py checks it on every rank of every 8-rank grid (all 35 factorizations over the five
axes, with GPipe / 1F1B / interleaved 1F1B and gradient accumulation), test_zero.py for ZeRO-1 and
test_auto.py for auto_parallelize'd layer lists. The time model turns the same events into seconds,
so what is counted is what is costed.

Conventions (those of the engine's recorder): the payload of a call is the logical size of the
full buffer (all-reduce: the tensor; all-gather: the gathered output; reduce-scatter: the input;
send/recv: the tensor). Groups of size one issue nothing. Counts are per rank, for the busiest
pipeline stage unless a stage index is given. e = bytes per element of the training dtype; norm
statistics and loss reductions are fp32 (STAT_BYTES). m = micro-batches per step per (data, depth)
replica; T = micro_batch_size * seq local tokens per micro-batch.

3D-parallel Linear(k -> n) (engine.linear; docs/architecture.md), per micro-batch; "normal" splits
input features over col and output over row, "transposed" swaps them:
  fwd  all-gather weight (depth)            n*k/(G_r*G_c) * e
  fwd  all-reduce partial output            normal: col, T*n/G_r ; transposed: row, T*n/G_c
  bwd  all-gather weight again (depth)      n*k/(G_r*G_c) * e      (the gathered weight is not kept)
  bwd  all-reduce input grad                normal: row, T*k/G_c ; transposed: col, T*k/G_r
  bwd  reduce-scatter weight grad (depth)   n*k/(G_r*G_c) * e
Full recomputation ("full": every block is checkpointed, engine.parallel_gpt recompute=True)
repeats each block's forward collectives during backward: its four Linears' depth all-gathers,
the output all-reduces of the first three, and its two norms' forward statistics. Whether the last
one, fc2's output all-reduce (the shared expert's fc2 in an MoE layer), is repeated too depends on
the stack (`Stack.full_recompute_repeats_layer`): reentrant checkpointing (Megatron's
CheckpointFunction, DeepSpeed's) reruns the whole block and repeats it; PyTorch's non-reentrant
checkpointing with early stopping (the engine: torch.utils.checkpoint, use_reentrant=False; FSDP
and torchtitan as published) stops as soon as backward has every saved tensor, and that all-reduce
only feeds the residual add, so it is not repeated (under sequence parallelism likewise the
reduce-scatter after fc2). The LM head and loss are not recomputed.
"selective" recomputation (attention internals only) repeats no communication.

Transformer (GPT-style: biases, LayerNorm, learned positions; engine.parallel_gpt), per stage:
  blocks   QKV normal (h -> h+2kv), out-proj transposed, fc1 normal, fc2 transposed (gated: 2f)
  norm     2 per block + the final norm on the last stage; the residual stream is split over col,
           so each norm all-reduces [T, 2] fp32 statistics (sum, sum of squares) over col in
           forward and [T, 2] (sum of g*gamma, of g*gamma*xhat) in backward (RMSNorm: [T, 1])
  head     last stage: a normal Linear h -> padded_vocab (a multiple of G_r*G_d), no bias
  loss     last stage: vocab-parallel cross entropy, three fp32 all-reduces of [T] over row in
           forward (max, sum of exponentials, target logit), none in backward
  p2p      [T, h/G_c] activations per send/recv over inter: v sends and v receives of activations
           in forward and as many of gradients in backward per micro-batch (one fewer of each on the
           first/last stage for interleaved schedules, none on the open end otherwise); static
           shapes, so step 0 has no extra metadata and every step is steady-state
  embedding first stage: word and position tables split over col along h (no communication)
Gradient sync once per step (engine.grads): parameters replicated over depth (biases, norms,
embeddings; everything but the depth-sharded weights) are all-reduced over depth (one call, their
bytes); then every local gradient over data: all-reduce (ZeRO 0; one call while the local
gradients fit one 25 MiB bucket), or for ZeRO-1 a reduce-scatter of the gradients and an
all-gather of the parameters, both of one flat vector zero-padded to a multiple of G_data
(engine.zero). ZeRO-2 reduce-scatters once per step where the stack accumulates into a full
gradient buffer (Megatron-Core), after every micro-batch's backward where it keeps only its shard
(DeepSpeed; `Stack.zero2_grad_reduce`; not in the engine). ZeRO-3 gathers each unit's parameters
(a block, or a parameter tensor: `Stack.zero3_gather`) in every micro-batch's forward and backward
and reduce-scatters its gradients after its backward; under a pipeline once per step per stage
(engine.Zero3: gathered before the schedule's first micro-batch, reduce-scattered after its last).
Megatron sequence parallelism (row-only TP) replaces the row all-reduces by all-gather +
reduce-scatter pairs (not in the engine).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from perfmodels.layout import partition_layers
from perfmodels.plans import RECOMPUTE_CODE, PlanArrays
from perfmodels.specs import Model, Training
from perfmodels.structure import Linear, Unit

STAT_BYTES = 4  # norm statistics and loss reductions travel in fp32
LAYER_LAST_LINEARS = ("fc2", "shared_fc2")
"""The Linears (`perfmodels.structure` names) whose output collective is a transformer layer's
last: full recomputation that stops early does not repeat it (`Stack.full_recompute_repeats_layer`;
the dense fc2's GEMM: `perfmodels.compute.early_stop_skipped_s`)."""


@dataclass(frozen=True)
class CommEvent:
    """One kind of collective call: `calls` times per step, each moving `payload_bytes`.

    `phase` is where it sits in the step (fwd, bwd, recompute, step); `tag` tells the time model
    what it may hide behind (see perfmodels.steptime).
    """

    axis: str
    op: str
    phase: str
    tag: str
    payload_bytes: np.ndarray
    calls: np.ndarray


@dataclass(frozen=True)
class StageShape:
    """What the rank's pipeline stage holds: blocks, embedding, head (arrays over plans)."""

    blocks: np.ndarray
    has_embedding: np.ndarray
    has_head: np.ndarray
    is_first: np.ndarray
    is_last: np.ndarray

    def per_plan(self, fn) -> StageShape:
        """This shape with `fn` applied to every per-plan array (scalars kept): its rows taken, tiled."""
        def each(x):
            return fn(np.asarray(x)) if np.ndim(x) else x

        return StageShape(blocks=each(self.blocks), has_embedding=each(self.has_embedding),
                          has_head=each(self.has_head), is_first=each(self.is_first),
                          is_last=each(self.is_last))


def busiest_blocks(num_layers: int, stages: np.ndarray, virtual: np.ndarray) -> np.ndarray:
    """Blocks on the busiest stage: ceil(L / (S v)) per chunk, v chunks (arrays broadcast)."""
    return -(-num_layers // (stages * virtual)) * virtual


def stage_shape(num_layers: int, arrays: PlanArrays, stage: int | str | StageShape = "busiest") -> StageShape:
    """The blocks, embedding and head of the `stage` of each plan: "busiest", a stage index, or a
    StageShape given whole (a relaxed stage, `perfmodels.bounds`)."""
    if isinstance(stage, StageShape):
        return stage
    S = arrays.G_inter
    v = arrays.virtual_stages
    n = len(arrays)
    if stage == "busiest":
        blocks = busiest_blocks(num_layers, S, v)
        one = S == 1
        return StageShape(blocks=blocks, has_embedding=one, has_head=np.ones(n, bool), is_first=one,
                          is_last=np.ones(n, bool))
    s = int(stage)
    blocks = np.zeros(n, dtype=np.int64)
    for i in range(n):
        Si, vi = int(S[i]), int(v[i])
        if not 0 <= s < Si:
            raise ValueError(f"stage={s} is outside G_inter={Si}")
        parts = partition_layers(num_layers, Si * vi)
        blocks[i] = sum(parts[c * Si + s][1] - parts[c * Si + s][0] for c in range(vi))
    first = np.full(n, s == 0)
    last = s == S - 1
    return StageShape(blocks=blocks, has_embedding=first, has_head=last, is_first=first, is_last=last)


def units_on_stage(unit: Unit, st: StageShape, arrays: PlanArrays) -> np.ndarray:
    """How many copies of `unit` the stage `st` holds: its blocks, the embedding on the first stage,
    the head on the last, or 1/G_inter of a unit spread evenly over the stages."""
    if unit.placement == "block":
        return np.asarray(st.blocks, dtype=np.float64)
    if unit.placement == "head":
        return st.has_head
    if unit.placement == "embedding":
        return st.has_embedding
    return 1.0 / arrays.G_inter


def padded_vocab(vocab_size: int, G_r: np.ndarray, G_d: np.ndarray) -> np.ndarray:
    """Vocabulary padded so the LM head's rows split evenly over row and its shards over depth."""
    m = G_r * G_d
    return -(-vocab_size // m) * m


class _Events:
    def __init__(self, arrays: PlanArrays) -> None:
        self.items: list[CommEvent] = []
        self.deg = arrays.degrees()
        self.n = len(arrays)

    def add(self, axis: str, op: str, phase: str, tag: str, payload: np.ndarray | float,
            calls: np.ndarray | float) -> None:
        shape = (self.n,)
        p = payload if isinstance(payload, np.ndarray) and payload.shape == shape else np.broadcast_to(
            np.asarray(payload, dtype=np.float64), shape)
        c = (calls if isinstance(calls, np.ndarray) and calls.shape == shape else np.broadcast_to(
            np.asarray(calls, dtype=np.float64), shape)) * (self.deg[axis] > 1)
        self.items.append(CommEvent(axis, op, phase, tag, np.asarray(p, dtype=np.float64), c))


def _sequence_parallel_events(ev: _Events, seq_calls: np.ndarray, full_rc: np.ndarray,
                              nbytes: np.ndarray, repeats_layer: bool = True) -> None:
    """Megatron sequence parallelism (row-only TP): each of a block's two forward and two backward
    all-reduces (and the recomputed ones) becomes an all-gather plus a reduce-scatter of `nbytes`.
    Recomputation that stops early (`repeats_layer` False, `Stack.full_recompute_repeats_layer`)
    skips the reduce-scatter after fc2, one of the block's two: half the reduce-scatter count."""
    for phase, calls in (
        ("fwd", 2 * seq_calls),
        ("bwd", 2 * seq_calls),
        ("recompute", 2 * seq_calls * full_rc),
    ):
        tag = "tp_" + ("fwd" if phase != "bwd" else "bwd")
        last = 1.0 if phase != "recompute" or repeats_layer else 0.5
        ev.add("row", "all_gather", phase, tag, nbytes, calls)
        ev.add("row", "reduce_scatter", phase, tag, nbytes, calls * last)


def _norm_events(ev: _Events, st: StageShape, m: np.ndarray, full_rc: np.ndarray, T: np.ndarray, *,
                 stats: int) -> np.ndarray:
    """Norms on the residual stream (features split over col) all-reduce their `stats` statistics
    per token over col; returns the number of norms on the stage (two per block, plus the final
    norm on the last stage)."""
    blocks = st.blocks.astype(np.float64)
    norms = 2 * blocks + st.has_head
    ev.add("col", "all_reduce", "fwd", "norm", T * stats * STAT_BYTES, norms * m)
    ev.add("col", "all_reduce", "bwd", "norm", T * stats * STAT_BYTES, norms * m)
    ev.add("col", "all_reduce", "recompute", "norm", T * stats * STAT_BYTES, 2 * blocks * m * full_rc)
    return norms


def _zero3_layer_units(arrays: PlanArrays, st: StageShape, norm_params: int, *, block_linears: np.ndarray,
                       emb: np.ndarray, vocab: np.ndarray, e: float,
                       hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """ZeRO-3 gather units of a transformer stage gathered whole layer by whole layer (blocks,
    embedding, final norm + head; engine.zero3, FSDP1), and their bytes: each one flat vector
    zero-padded to a multiple of G_data."""
    blocks = st.blocks.astype(np.float64)
    units = blocks + st.has_embedding + st.has_head
    G = arrays.G_data
    G_r, G_c, G_d = arrays.G_intra_r, arrays.G_intra_c, arrays.G_intra_d
    h, V = hidden, vocab

    def pad(x: np.ndarray) -> np.ndarray:
        return np.ceil(x / G) * G

    head_unit = norm_params * h / G_c + h * V / (G_r * G_c) / G_d
    unit_bytes = (blocks * pad(block_linears + 2 * norm_params * h / G_c) + st.has_embedding * pad(emb)
                  + st.has_head * pad(head_unit)) * e
    return units, unit_bytes


class _Stage:
    """The events of one rank's stage and the parameters it holds, as its layers add them."""

    def __init__(self, training: Training, arrays: PlanArrays) -> None:
        self.ev = _Events(arrays)
        self.arrays = arrays
        self.e = training.bytes_per_element
        self.m = arrays.num_microbatches(training)
        self.full_rc = arrays.recompute == RECOMPUTE_CODE["full"]
        self.local_params = np.zeros(len(arrays))  # parameters this rank holds (for the data-parallel sync)
        self.replicated = np.zeros(len(arrays))  # of those, replicated over depth (grads need depth AR)
        self.grad_flows = False  # does an input gradient reach the next layer? (layers in list order)

    def linear(self, lin: Linear, count: np.ndarray | float, n: np.ndarray | int | None = None,
               recomputed: bool = True, output_recomputed: bool = True) -> None:
        """`count` copies of a 3D-parallel Linear, per micro-batch (see the module docstring).

        A "grid" Linear (a transformer's) is always split and works on split activations; under
        Megatron sequence parallelism its row all-reduces are replaced (`_sequence_parallel_events`).
        An "auto" one (auto_parallelize) is split only where its shapes divide, else it holds
        replicated parameters and issues nothing; it takes and returns ordinary activations, so it
        also all-gathers its output over the input axis (fwd) and its input grad over the output axis
        (bwd: "convert"), and gets no input gradient where no earlier layer has parameters."""
        ev, arrays, e, m = self.ev, self.arrays, self.e, self.m
        G_r, G_c, G_d = arrays.G_intra_r, arrays.G_intra_c, arrays.G_intra_d
        k, n = lin.k, lin.n if n is None else n
        rows = arrays.micro_batch_size * lin.rows_per_sample
        out_split, in_split = (G_c, G_r) if lin.transposed else (G_r, G_c)
        out_axis, in_axis = ("row", "col") if lin.transposed else ("col", "row")
        grid = lin.split == "grid"
        copies = count * lin.share  # copies of the layer (a layer list's: one)
        count = copies
        if not grid:
            ok = lin.divides(out_split, in_split, G_d)
            count = ok * copies
        grad_in = count if grid else count * self.grad_flows
        sp = arrays.sequence_parallel if grid else np.zeros(len(arrays), bool)
        w_block = n * k / (G_r * G_c)
        if_sp = sp & (out_axis == "row")
        ev.add("depth", "all_gather", "fwd", "depth_ag", w_block * e, count * m)
        ev.add(out_axis, "all_reduce", "fwd", "tp_fwd", rows * n / out_split * e, count * m * ~if_sp)
        if not grid:
            ev.add(in_axis, "all_gather", "fwd", "convert", rows * n * e, count * m)
        ev.add("depth", "all_gather", "bwd", "depth_ag", w_block * e, count * m)
        ev.add(in_axis, "all_reduce", "bwd", "tp_bwd", rows * k / in_split * e,
               grad_in * m * ~(sp & (in_axis == "row")))
        if not grid:
            ev.add(out_axis, "all_gather", "bwd", "convert", rows * k * e, grad_in * m)
        ev.add("depth", "reduce_scatter", "bwd", "depth_rs", w_block * e, count * m)
        # recomputation repeats the forward communication
        rc = self.full_rc & recomputed
        ev.add("depth", "all_gather", "recompute", "depth_ag", w_block * e, count * m * rc)
        ev.add(out_axis, "all_reduce", "recompute", "tp_fwd", rows * n / out_split * e,
               count * m * (rc & output_recomputed) * ~if_sp)
        if grid:
            self.local_params = self.local_params + count * w_block / G_d
            if lin.bias:
                self.local_params = self.local_params + count * n / out_split
                self.replicated = self.replicated + count * n / out_split
        else:
            ev.add(in_axis, "all_gather", "recompute", "convert", rows * n * e, count * m * rc)
            b = n / out_split if lin.bias else 0.0
            whole = k * n + (n if lin.bias else 0)
            self.local_params = self.local_params + copies * np.where(ok, w_block / G_d + b, whole)
            self.replicated = self.replicated + copies * np.where(ok, b, whole)
        self.grad_flows = True

    def replicated_params(self, params: np.ndarray | float) -> None:
        """Parameters every depth rank holds whole (biases, norms, embeddings, plain layers)."""
        self.local_params = self.local_params + params
        self.replicated = self.replicated + params


def comm_events(
    model: Model, training: Training, arrays: PlanArrays, stage: int | str | StageShape = "busiest",
    with_experts: bool = True,
) -> list[CommEvent]:
    """All communication of one rank in one optimizer step (steady state): the Linears of the
    model's units (`_Stage.linear`), for a transformer also its norms, loss and pipeline transfers;
    then the gradient sync of every parameter the stage holds. Mixture-of-experts layers add their
    all-to-alls and expert gradients (`perfmodels.experts`); context parallelism (every plan of
    `arrays` with one G_cp) its ring over "cp" and the dp-cp gradient group under "data"
    (`perfmodels.context`). Not `with_experts`: without the routed experts' events
    (`expert_events`)."""
    from perfmodels import context

    cps = np.unique(arrays.G_cp)
    if len(cps) > 1:
        raise ValueError("comm_events takes plans of one G_cp; bytes_per_group splits mixed ones")
    cp = int(cps[0]) if len(cps) else 1
    if cp == 1:
        return _comm_events(model, training, arrays, stage, with_experts)
    model_v, training_v, arrays_v = context.view(model, training, arrays, cp)
    events = _comm_events(model_v, training_v, arrays_v, stage, with_experts)
    st = stage_shape(model.num_layers, arrays_v, stage)
    m = arrays_v.num_microbatches(training_v).astype(np.float64)
    full_rc = (arrays_v.recompute == RECOMPUTE_CODE["full"]).astype(np.float64)
    layers = st.blocks.astype(np.float64)
    return events + context.ring_events(model_v, training_v, arrays_v, cp, layers, m, full_rc)


def expert_events(model: Model, training: Training, arrays: PlanArrays,
                  stage: int | str | StageShape = "busiest") -> list[CommEvent]:
    """The routed experts' events alone (`experts.add_events`: the all-to-alls, the expert
    tensor-parallel collectives, the expert gradients over expert-data): what `comm_events` adds
    for a mixture of experts to the events of the layers' units (`comm_events(..., experts=False)`),
    which do not depend on the expert degrees. Plans of one context-parallel degree 1 (a view)."""
    from perfmodels import experts

    rank = _Stage(training, arrays)
    st = stage_shape(model.num_layers, arrays, stage)
    rank.ev.deg.update(experts.expert_degrees(arrays))
    experts.add_events(rank.ev, model, training, arrays, st.blocks.astype(np.float64) * model.moe_fraction,
                       rank.m, rank.full_rc)
    return rank.ev.items


def _comm_events(
    model: Model, training: Training, arrays: PlanArrays, stage: int | str | StageShape = "busiest",
    with_experts: bool = True,
) -> list[CommEvent]:
    """`comm_events` of plans of one context-parallel degree 1; without the routed experts' events
    (`expert_events`) where not `with_experts`."""
    rank = _Stage(training, arrays)
    if model.layers:
        return _layer_list_events(model, training, rank)
    st = stage_shape(model.num_layers, arrays, stage)
    e, m, ev = rank.e, rank.m, rank.ev
    G_r, G_c, G_d = arrays.G_intra_r, arrays.G_intra_c, arrays.G_intra_d
    T = arrays.micro_batch_size * model.seq_length
    h = model.hidden_size
    bias = not model.gated_mlp  # GPT-style blocks carry biases and LayerNorm; Llama-style neither (RMSNorm)
    norm_params = 2 if bias else 1
    block, head, _embedding = model.units
    blocks = st.blocks.astype(np.float64)

    repeats_layer = training.effective_stack.full_recompute_repeats_layer
    for lin in block.linears:
        # recomputation that stops once backward has what it saved does not repeat a layer's last
        # output all-reduce: fc2's in a dense layer, the shared expert's in an MoE layer (the
        # engine runs it after the routed experts), which feed only the residual add. Every other
        # one feeds an op that saves a tensor (in an MoE layer without shared experts out_proj's
        # feeds the router), and a reentrant stack repeats them all
        last = lin.name in LAYER_LAST_LINEARS
        rank.linear(lin, blocks, output_recomputed=repeats_layer or not last)
    block_linears = rank.local_params / np.maximum(blocks, 1.0)  # one block's Linear parameters (ZeRO-3)

    _sequence_parallel_events(ev, blocks * m * arrays.sequence_parallel, rank.full_rc, T * h * e,
                              repeats_layer)
    norms = _norm_events(ev, st, m, rank.full_rc, T, stats=2 if bias else 1)
    rank.replicated_params(norms * norm_params * h / G_c)

    # embedding (first stage): word (+ learned positions for GPT) tables split over col along h
    # (the position table has a row per position of the whole sample: `span`, which a context-parallel
    # view keeps at the full sequence while its `seq_length` is one rank's chunk)
    emb = st.has_embedding * (model.vocab_size + (model.span if bias else 0)) * h / G_c
    rank.replicated_params(emb)

    # LM head (last stage): a normal 3D Linear h -> padded vocab, then a cross entropy over the
    # row-split vocabulary (max, sum of exponentials, target logit: three fp32 all-reduces over row)
    V = padded_vocab(model.vocab_size, G_r, G_d)
    has_head = st.has_head.astype(np.float64)
    for lin in head.linears:  # full recomputation covers the blocks only
        rank.linear(lin, has_head, n=V if lin.vocab else None, recomputed=False)
    ev.add("row", "all_reduce", "fwd", "loss", T * STAT_BYTES, 3 * has_head * m)

    if training.effective_stack.zero3_gather == "layer":
        units, unit_bytes = _zero3_layer_units(arrays, st, norm_params, block_linears=block_linears, emb=emb,
                                               vocab=V, e=e, hidden=h)
    else:  # every parameter tensor: 4 weights (+4 biases) and 2 norms (weight, +bias) per block
        units, unit_bytes = blocks * (4 * (1 + bias) + 2 * norm_params) + st.has_embedding * (
            2 if bias else 1) + st.has_head * (1 + norm_params), None
    if model.is_moe:
        from perfmodels import experts

        if with_experts:
            ev.deg.update(experts.expert_degrees(arrays))
            experts.add_events(ev, model, training, arrays, blocks * model.moe_fraction, m, rank.full_rc)
        # the router's weight [E, h] is whole on every rank of the layer: reduced with the replicated
        # parameters (Megatron's TopKRouter is not split over tensor-parallel ranks)
        rank.replicated_params(blocks * model.moe_fraction * float(model.num_moe_experts) * h)
    _grad_sync_events(ev, arrays, training, rank.local_params, rank.replicated, m, units, unit_bytes)
    _p2p_events(ev, arrays, m, T * h / G_c * e, st)
    return ev.items


def _grad_sync_events(ev: _Events, arrays: PlanArrays, training: Training, local_params: np.ndarray,
                      replicated_over_depth: np.ndarray, m: np.ndarray, units: np.ndarray | float,
                      unit_bytes: np.ndarray | None = None) -> None:
    """`units`: ZeRO-3 gather units of the stage (blocks or parameter tensors, per
    `Stack.zero3_gather`); each is gathered and reduce-scattered by its own call. `unit_bytes`:
    the units' bytes summed, each padded to a multiple of G_data (None: the parameter bytes, and
    one padding of the whole vector for the reduce-scatter)."""
    e = training.bytes_per_element
    z = arrays.zero_stage
    # replicated parameters see different samples on each depth rank: summed once per step, or under
    # ZeRO-3 per unit right before its data reduce-scatter (every micro-batch; engine.zero3)
    u_rep = np.maximum(np.asarray(units, dtype=np.float64), 1.0)
    z3 = arrays.zero_stage == 3
    per_call = replicated_over_depth * e * np.where(z3, 1.0 / u_rep, 1.0)
    calls = np.where(z3, m * u_rep * np.where(arrays.G_inter > 1, 1.0 / m, 1.0), 1.0)
    ev.add("depth", "all_reduce", "step", "depth_grad", per_call, calls)
    grads = local_params * e
    # ZeRO shards one flat vector of all local parameters, zero-padded to a multiple of G_data
    G = arrays.G_data
    padded = np.ceil(local_params / G) * G * e
    ev.add("data", "all_reduce", "step", "dp_grad", grads, 1.0 * (z == 0))
    # ZeRO-1 reduce-scatters the accumulated gradients once per step. ZeRO-2 does too where the stack
    # still accumulates into a full buffer (Megatron-Core's distributed optimizer, Apex
    # DistributedFusedAdam); where it keeps only its shard (DeepSpeed, FSDP SHARD_GRAD_OP) it
    # reduce-scatters after every micro-batch's backward
    per_mb_zero2 = training.effective_stack.zero2_grad_reduce == "per_microbatch"
    z2_step = (z == 2) & (not per_mb_zero2)
    z2_mb = (z == 2) & per_mb_zero2
    ev.add(
        "data",
        "reduce_scatter",
        "step",
        "dp_grad",
        np.where(z >= 1, padded, grads),
        1.0 * ((z == 1) | z2_step),
    )
    ev.add("data", "reduce_scatter", "bwd", "dp_grad", padded, m * z2_mb)
    ev.add(
        "data", "all_gather", "step", "dp_param", np.where(z >= 1, padded, grads), 1.0 * ((z == 1) | (z == 2))
    )
    # ZeRO-3 holds neither full parameters nor full gradients: every micro-batch gathers each unit's
    # parameters for forward and again for backward (recomputation runs inside that backward
    # gather) and reduce-scatters each unit's gradients right after its backward. Under a pipeline
    # the stage keeps its gathered parameters and its unsharded gradients for the whole step (FSDP
    # with pipelining does not reshard after forward): one gather and one reduce-scatter per unit
    # per step
    u = np.maximum(np.asarray(units, dtype=np.float64), 1.0)
    piped = arrays.G_inter > 1
    zero3_calls = np.where(piped, 1.0, m) * u * (z == 3)
    gathered = grads if unit_bytes is None else unit_bytes
    scattered = padded if unit_bytes is None else unit_bytes
    ev.add("data", "all_gather", "fwd", "zero3", gathered / u, zero3_calls)
    ev.add("data", "all_gather", "bwd", "zero3", gathered / u, zero3_calls * ~piped)
    ev.add("data", "reduce_scatter", "bwd", "zero3", scattered / u, zero3_calls)


def _p2p_events(
    ev: _Events, arrays: PlanArrays, m: np.ndarray, act_bytes: np.ndarray, st: StageShape
) -> None:
    v = arrays.virtual_stages
    sends_fwd = np.where(st.is_last & (v == 1), 0, v) - (st.is_last & (v > 1))
    recvs_fwd = np.where(st.is_first & (v == 1), 0, v) - (st.is_first & (v > 1))
    for op, phase, calls in (("send", "fwd", sends_fwd), ("recv", "fwd", recvs_fwd),
                             ("send", "bwd", recvs_fwd), ("recv", "bwd", sends_fwd)):
        ev.add("inter", op, phase, "p2p", act_bytes, calls * m)


def _layer_list_events(model: Model, training: Training, rank: _Stage) -> list[CommEvent]:
    """Arbitrary networks under auto_parallelize: "auto" Linears (`_Stage.linear`), run in list
    order. The rank holds the whole list (the engine pipelines only transformers). Plain
    (non-parallel) layers and other layers hold replicated parameters: their gradients are
    all-reduced over depth and data like the biases."""
    (unit,) = model.units
    for layer in unit.layers:
        if isinstance(layer, Linear):
            rank.linear(layer, 1.0)
        else:
            rank.replicated_params(layer.params)
            rank.grad_flows = rank.grad_flows or layer.params > 0
    if training.effective_stack.zero3_gather == "layer":
        units: float = sum(1.0 for layer in unit.layers if isinstance(layer, Linear) or layer.params > 0)
    else:
        units = sum((2.0 if layer.bias else 1.0) if isinstance(layer, Linear) else float(layer.params > 0)
                    for layer in unit.layers)
    _grad_sync_events(rank.ev, rank.arrays, training, rank.local_params, rank.replicated, rank.m, units)
    return rank.ev.items


REPORTED_AXES = ("row", "col", "depth", "inter", "data")
"""The groups every per-group answer lists; "cp", "ep", "etp" and "edp" follow where they carry
traffic (`EXTRA_AXES`)."""
EXTRA_AXES = ("cp", "ep", "etp", "edp")


def _per_group(model: Model, training: Training, arrays: PlanArrays, stage: int | str,
               bytes_: bool) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(len(arrays)))
    for cp in np.unique(arrays.G_cp):
        idx = np.flatnonzero(arrays.G_cp == cp)
        part = arrays.take(idx)
        for item in comm_events(model, training, part, stage):
            add = item.payload_bytes * item.calls if bytes_ else item.calls
            out[item.axis] = out[item.axis].copy()
            out[item.axis][idx] += add
    used = [a for a in EXTRA_AXES if a in out and out[a].any()]
    return {axis: out[axis] for axis in (*REPORTED_AXES, *used)}


def bytes_per_group(model: Model, training: Training, arrays: PlanArrays, stage: int | str = "busiest",
                    ) -> dict[str, np.ndarray]:
    """Logical bytes per rank per optimizer step, per group (the engine recorder's units): the five
    grid axes, then "cp", "ep", "etp" and "edp" where any plan sends over them."""
    return _per_group(model, training, arrays, stage, True)


def calls_per_group(model: Model, training: Training, arrays: PlanArrays, stage: int | str = "busiest",
                    ) -> dict[str, np.ndarray]:
    return _per_group(model, training, arrays, stage, False)
