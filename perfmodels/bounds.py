"""Lower bounds on the step time and memory of families of plans, so a search can prove what it skips.

A family is one grid (the six degrees and the expert degrees), one micro-batch size and one
placement; its plans are every choice of schedule, virtual stages, recomputation, ZeRO stage and
sequence parallelism. The bounds here are given per recomputation and sequence-parallel setting
(time) and per ZeRO stage (memory), so a search can also skip the parts of a family that cannot win.

Time. `perfmodels.steptime` composes a plan's step as

    step = m t_mb + bubble + p2p + exposed data-parallel sync + depth gradient sync + optimizer,
    t_mb = max(t_gpu + f host, host),  t_gpu = compute + exposed per-micro-batch comm + MoE sync wait

and every term is a sum of non-negative parts that grow with the stage's blocks. So for every plan
of the family with a given recomputation and sequence-parallel setting:

- compute >= the compute of the *relaxed* stage: num_layers / G_inter blocks (the busiest stage
  holds ceil(L / (S v)) v >= L / S of them, `traffic.stage_shape`) with the LM head;
- exposed comm >= the tensor-parallel collectives that never overlap (`steptime.TP_TAGS` outside the
  backward input-grad all-reduce, `TP_FWD_EXPOSED_SHARE` of the forward ones where the stack overlaps
  them, all of them where it does not), the depth collectives' first-gather share, and for a mixture
  of experts the expert tensor-parallel collectives and the all-to-alls (their first-gather share
  where the stack overlaps them under an interleaved schedule the family runs), all of the relaxed
  stage without recomputation (recomputation only repeats collectives); the MoE wait, the ring and
  the data-parallel parts >= 0;
- host >= the relaxed stage's blocks, three passes (four under full recomputation);
- bubble = (S - 1) / v t_mb (average / busiest compute) >= (S - 1) / v_max x the average stage's
  compute (t_mb >= the busiest stage's compute; v_max: the most virtual stages the family runs);
- optimizer >= the relaxed stage's optimizer step sharded at the family's largest ZeRO stage;
- p2p, data-parallel and depth gradient sync >= 0.

A coarser bound, `blocks_bound_s`, costs one compute evaluation per (grid, micro-batch size) and holds
for every placement and option: the blocks alone (num_layers / G_inter of them: below both the
busiest and the average stage) set a floor to t_mb and, times (S - 1) / v_max, to the bubble; the
host floor as above. The coarsest, `grid_bound_s`, holds for every micro-batch size of a grid too:
a micro-batch's compute C(b) grows with its size b while the compute per sample C(b) / b does not
(every GEMM, attention and element-wise term is a non-negative cost per row plus a non-negative cost
per kernel, and GEMM efficiency only improves with more rows), so the m C(b) = (samples per replica)
C(b) / b of any b is at least that of the largest b, the m host seconds too, and the bubble's C(b) at
least that of the smallest. A search refines the finer bounds only where the coarser leave room.

Memory. The first pipeline stage's total (never above the peak, `memory.peak_memory`) is weights +
gradients + optimizer state, which depend on the ZeRO stage and not on the other options, plus
activations, NCCL buffers and overhead, which depend on recomputation and sequence parallelism and
grow with the micro-batches in flight, fewest under plain 1F1B (`memory.in_flight_layers`: min(m,
G_inter) on the first stage, against m for GPipe and G_inter + (G_inter - 1) / v interleaved). Both
are taken on the relaxed stage.

Nothing here is approximated: each bound is the model's own formula with terms dropped or taken at
their smallest, and tests/perfmodels/test_bounds.py checks it against every plan of whole search
spaces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodels import collectives, context, experts
from perfmodels.compute import stage_compute
from perfmodels.constants import apply_constants
from perfmodels.layout import group_geometry
from perfmodels.memory import capacity_per_rank_gib, stage_memory, unit_parts
from perfmodels.plans import RECOMPUTE_CODE, SCHEDULE_CODE, PlanArrays
from perfmodels.specs import Cluster, Model, Training
from perfmodels.steptime import (
    FIRST_GATHER_SHARE,
    TP_FWD_EXPOSED_SHARE,
    _average_stage,
    _category,
    _host_seconds_per_microbatch,
    scatter_geometry,
)
from perfmodels.traffic import CommEvent, StageShape, comm_events

TP_CATEGORIES = ("tp_exposed", "tp_fwd_half", "tp_bwd")


@dataclass(frozen=True, kw_only=True)
class BoundParts:
    """The placement-free parts of the time bound, arrays over families (last axis), per
    recomputation (axis R: the `recomputes` given) and sequence-parallel setting (axis P)."""

    microbatches: np.ndarray
    compute_mb_s: np.ndarray
    """(R, P, n) seconds of a micro-batch's compute on the relaxed stage."""
    host_mb_s: np.ndarray
    """(R, n) host seconds to issue a micro-batch of the relaxed stage."""
    bubble_s: np.ndarray
    """(R, P, n) seconds of pipeline bubble at the least (most virtual stages)."""
    optimizer_s: np.ndarray
    degrees: dict[str, np.ndarray]
    comm: list[dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]]
    """Per sequence-parallel setting: (axis, op, category) -> (bytes x calls, calls) per step."""
    plans: PlanArrays
    """The families' representative plans (for the expert groups' geometry)."""
    max_virtual: np.ndarray

    def take(self, index: np.ndarray) -> BoundParts:
        return BoundParts(
            microbatches=self.microbatches[index], compute_mb_s=self.compute_mb_s[..., index],
            host_mb_s=self.host_mb_s[..., index], bubble_s=self.bubble_s[..., index],
            optimizer_s=self.optimizer_s[index],
            degrees={k: v[index] for k, v in self.degrees.items()},
            comm=[{k: (b[index], c[index]) for k, (b, c) in per.items()} for per in self.comm],
            plans=self.plans.take(index), max_virtual=self.max_virtual[index])


def with_options(arrays: PlanArrays, **columns: np.ndarray | int | bool) -> PlanArrays:
    """`arrays` with some option columns set (a family's representative row)."""
    return arrays.with_columns(**columns)


def _relaxed_stage(model: Model, arrays: PlanArrays) -> StageShape:
    """The busiest stage (`traffic.stage_shape`) with its blocks relaxed to num_layers / G_inter."""
    S = arrays.G_inter
    n = len(arrays)
    return StageShape(blocks=model.num_layers / S.astype(np.float64), has_embedding=S == 1,
                      has_head=np.ones(n, bool), is_first=S == 1, is_last=np.ones(n, bool))


def _corrections(cluster: Cluster):
    prof = cluster.profile
    return (lambda name: prof.correction(name)) if prof is not None else (lambda name: 1.0)


def _by_context_degree(arrays: PlanArrays, one):
    """Run `one(cp, index)` for each context-parallel degree of `arrays`; (index, result) pairs."""
    return [(idx, one(int(cp), idx)) for cp in np.unique(arrays.G_cp)
            for idx in [np.flatnonzero(arrays.G_cp == cp)]]


def blocks_bound_s(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                   max_virtual: np.ndarray, sequence_parallel: list[bool]) -> np.ndarray:
    """Seconds per step no plan of each (grid, micro-batch size) row of `arrays` can beat, under any
    placement, recomputation, ZeRO stage or schedule (see the module docstring), the smallest over
    the `sequence_parallel` settings."""
    return grid_bound_s(model, cluster, training, arrays, arrays, max_virtual, sequence_parallel)


def _all_to_all_floor_s(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                        max_virtual: np.ndarray) -> np.ndarray:
    """Exposed seconds per step of a mixture of experts' all-to-alls that no placement avoids: of the
    tokens a rank sends (`experts.add_events`, forward and backward, no recomputation), the share
    (p - q) / p that must leave the node, q <= min(G_ep, GPUs per node) peers sharing it, over the
    rank's NIC share (`collectives.all_to_all_s`), with the load imbalance; the first gather's share
    where the stack may overlap them (an interleaved schedule). 0 for a dense model and for the
    node-deduplicating "flex" dispatcher. m x tokens per micro-batch is the same for every
    micro-batch size, so this holds for a whole grid too."""
    n = len(arrays)
    if not model.is_moe or training.moe_token_dispatcher == "flex":
        return np.zeros(n)
    p = arrays.G_ep.astype(np.float64)
    q = np.minimum(p, float(cluster.gpus_per_node_used))
    S = arrays.G_inter.astype(np.float64)
    m = arrays.num_microbatches(training).astype(np.float64)
    moe_layers = model.num_layers / S * model.moe_fraction
    tokens = experts.tokens_per_rank(model, arrays)
    per_token = model.moe_router_topk * model.hidden_size * training.bytes_per_element
    volume = 4.0 * moe_layers * m * tokens * per_token
    nic = cluster.inter_node_bandwidth_GBps * cluster.link_efficiency_inter * 1e9
    seconds = experts.load_imbalance(training) * volume * (p - q) / p / nic
    overlapped = training.effective_stack.overlap_ep_comm & (np.asarray(max_virtual) > 1) & (S > 1)
    seconds = np.where(overlapped, seconds / np.maximum(m, 1.0) * FIRST_GATHER_SHARE, seconds)
    return seconds * _corrections(cluster)("tp_comm")


def grid_bound_s(model: Model, cluster: Cluster, training: Training, smallest: PlanArrays,
                 largest: PlanArrays, max_virtual: np.ndarray, sequence_parallel: list[bool]) -> np.ndarray:
    """Seconds per step no plan of each grid can beat, under any micro-batch size between the
    `smallest` and the `largest` rows' (the same grids), placement or option (module docstring).
    With `largest` the same object as `smallest`: the bound of that one micro-batch size."""
    cluster, training = apply_constants(cluster, training)
    out = np.zeros(len(smallest))
    for cp in np.unique(smallest.G_cp):
        idx = np.flatnonzero(smallest.G_cp == cp)
        model_v, training_v, low = context.view(model, training, smallest.take(idx), int(cp))
        high = low if largest is smallest else context.view(model, training, largest.take(idx), int(cp))[2]
        out[idx] = _grid_bound_one_cp(model_v, cluster, training_v, low, high, max_virtual[idx],
                                      sequence_parallel)
    return out


def _grid_bound_one_cp(model: Model, cluster: Cluster, training: Training, low: PlanArrays, high: PlanArrays,
                       max_virtual: np.ndarray, sequence_parallel: list[bool]) -> np.ndarray:
    n = len(low)
    S = low.G_inter.astype(np.float64)
    blocks_only = StageShape(blocks=model.num_layers / S, has_embedding=np.zeros(n, bool),
                             has_head=np.zeros(n, bool), is_first=S == 1, is_last=np.ones(n, bool))
    m_fewest = high.num_microbatches(training).astype(np.float64)
    host = _host_seconds_per_microbatch(model, cluster, training, with_options(
        low, recompute=RECOMPUTE_CODE["none"]), _relaxed_stage(model, low))
    c_compute = _corrections(cluster)("compute")
    fill = (S - 1.0) / np.maximum(max_virtual, 1).astype(np.float64)
    best = np.full(n, np.inf)
    def blocks_compute(arrays: PlanArrays, sp: bool) -> np.ndarray:
        rep = with_options(arrays, recompute=RECOMPUTE_CODE["none"], sequence_parallel=sp)
        comp = stage_compute(model, cluster, training, rep, blocks_only)
        return (comp.fwd_s + comp.bwd_s) * c_compute

    for sp in sequence_parallel:
        c_low = blocks_compute(low, sp)
        c_high = c_low if high is low else blocks_compute(high, sp)
        a2a = _all_to_all_floor_s(model, cluster, training, with_options(high, sequence_parallel=sp),
                                  max_virtual)
        best = np.minimum(best, np.maximum(m_fewest * c_high + a2a, m_fewest * host) + fill * c_low)
    return best


def bound_parts(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                max_virtual: np.ndarray, recomputes: list[int], sequence_parallel: list[bool]) -> BoundParts:
    """The placement-free parts of the time bound of each family in `arrays`: one row per family,
    holding its grid and micro-batch size with its largest ZeRO stage (the other option columns are
    ignored). `max_virtual`: the most virtual stages any schedule of the family runs (1 without
    interleaving)."""
    cluster, training = apply_constants(cluster, training)
    pieces = _by_context_degree(arrays, lambda cp, idx: _parts_one_cp(
        model, cluster, training, arrays.take(idx), max_virtual[idx], cp, recomputes, sequence_parallel))
    if len(pieces) == 1:
        return pieces[0][1]
    n = len(arrays)

    def scatter(get) -> np.ndarray:
        first = np.asarray(get(pieces[0][1]))
        out = np.zeros((*first.shape[:-1], n))
        for idx, p in pieces:
            out[..., idx] = get(p)
        return out

    def sums(j: int, key: tuple[str, str, str], which: int):
        return lambda p: p.comm[j][key][which] if key in p.comm[j] else np.zeros(len(p.microbatches))

    comm = []
    for j in range(len(sequence_parallel)):
        keys = list(dict.fromkeys(k for _, p in pieces for k in p.comm[j]))
        comm.append({k: (scatter(sums(j, k, 0)), scatter(sums(j, k, 1))) for k in keys})
    return BoundParts(
        microbatches=scatter(lambda p: p.microbatches), compute_mb_s=scatter(lambda p: p.compute_mb_s),
        host_mb_s=scatter(lambda p: p.host_mb_s), bubble_s=scatter(lambda p: p.bubble_s),
        optimizer_s=scatter(lambda p: p.optimizer_s), degrees=arrays.degrees(), comm=comm, plans=arrays,
        max_virtual=np.asarray(max_virtual))


def _parts_one_cp(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                  max_virtual: np.ndarray, cp: int, recomputes: list[int],
                  sequence_parallel: list[bool]) -> BoundParts:
    real = arrays
    model, training, arrays = context.view(model, training, arrays, cp)
    n = len(arrays)
    m = arrays.num_microbatches(training).astype(np.float64)
    relaxed = _relaxed_stage(model, arrays)
    average = _average_stage(model, arrays)
    c_compute = _corrections(cluster)("compute")
    S = arrays.G_inter.astype(np.float64)
    fill = (S - 1.0) / np.maximum(max_virtual, 1).astype(np.float64)
    compute = np.zeros((len(recomputes), len(sequence_parallel), n))
    bubble = np.zeros_like(compute)
    host = np.zeros((len(recomputes), n))
    optimizer = np.zeros(n)
    comm: list[dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]] = []
    none = RECOMPUTE_CODE["none"]
    for j, sp in enumerate(sequence_parallel):
        # forward and backward do not depend on recomputation, which only adds `recompute_s`: one
        # evaluation per recomputation that repeats something (and one for "none" alone)
        evaluated = {}
        for rc in [r for r in recomputes if r != none] or [none]:
            rep = with_options(arrays, recompute=rc, sequence_parallel=sp)
            evaluated[rc] = (stage_compute(model, cluster, training, rep, relaxed),
                             stage_compute(model, cluster, training, rep, average))
        for i, rc in enumerate(recomputes):
            comp, avg = evaluated.get(rc, next(iter(evaluated.values())))
            again, again_avg = (comp.recompute_s, avg.recompute_s) if rc != none else (0.0, 0.0)
            compute[i, j] = (comp.fwd_s + comp.bwd_s + again) * c_compute
            bubble[i, j] = fill * (avg.fwd_s + avg.bwd_s + again_avg) * c_compute
            optimizer = comp.optimizer_s * c_compute
            if j == 0:
                host[i] = _host_seconds_per_microbatch(model, cluster, training,
                                                       with_options(arrays, recompute=rc), relaxed)
        plain = with_options(arrays, recompute=RECOMPUTE_CODE["none"], sequence_parallel=sp)
        comm.append(_critical_comm(model, training, plain, relaxed))
    return BoundParts(microbatches=m, compute_mb_s=compute, host_mb_s=host, bubble_s=bubble,
                      optimizer_s=optimizer, degrees=real.degrees(), comm=comm, plans=real,
                      max_virtual=np.asarray(max_virtual))


def _critical_comm(model: Model, training: Training, arrays: PlanArrays, stage: StageShape
                   ) -> dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]:
    """(bytes x calls, calls) per (axis, op, category) of the collectives the bound counts: the
    categories and axes `steptime._comm_by_kind` puts on the critical path per micro-batch. A layer
    list's collectives are not counted (the bound stays below)."""
    comm: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = {}
    if model.layers:
        return comm
    overlap_tp = training.effective_stack.overlap_tp_comm
    for ev in comm_events(model, training, arrays, stage):
        if not np.any(ev.calls):
            continue
        cat = _category(ev, overlap_tp)
        if ev.axis in ("ep", "etp"):  # every expert collective is on the critical path (steptime)
            cat = ev.axis
        elif not ((cat in TP_CATEGORIES and ev.axis in ("row", "col")) or (cat == "depth" == ev.axis)):
            continue
        acc = comm.setdefault((ev.axis, ev.op, cat), (np.zeros(len(arrays)), np.zeros(len(arrays))))
        acc[0][...] += ev.payload_bytes * ev.calls
        acc[1][...] += ev.calls
    return comm


def lower_bound_s(model: Model, cluster: Cluster, training: Training, parts: BoundParts,
                  placement: tuple[str, ...]) -> np.ndarray:
    """(R, P, n) seconds per step that no plan of each family under `placement`, with the
    recomputation and sequence-parallel setting of that entry, can beat."""
    cluster, training = apply_constants(cluster, training)
    corr = _corrections(cluster)
    stack = training.effective_stack
    geo = group_geometry(parts.degrees, placement, cluster.gpus_per_node_used)
    m = parts.microbatches
    out = np.zeros_like(parts.compute_mb_s)
    for j, comm in enumerate(parts.comm):
        per_step = {cat: np.zeros(len(m)) for cat in (*TP_CATEGORIES, "depth")}
        for (axis, op, cat), (byte_calls, calls) in comm.items():
            if axis in ("ep", "etp"):  # `_expert_seconds`
                continue
            g = geo[axis]
            per_step[cat] = per_step[cat] + collectives.cost_s(
                cluster, op, byte_calls, calls, g["size"], g["intra"], g["members_per_node"])
        tp = per_step["tp_exposed"] + TP_FWD_EXPOSED_SHARE * per_step["tp_fwd_half"]
        if not stack.overlap_tp_comm:
            tp = tp + per_step["tp_bwd"]
        depth = per_step["depth"] * corr("dp_comm")
        if stack.overlap_depth_comm:
            depth = depth / np.maximum(m, 1.0) * FIRST_GATHER_SHARE
        experts_s = _expert_seconds(model, cluster, training, parts, comm, placement)
        exposed_mb = ((tp + experts_s) * corr("tp_comm") + depth) / m
        host = parts.host_mb_s  # (R, n)
        t_mb = np.maximum(parts.compute_mb_s[:, j] + exposed_mb + stack.host_exposed_fraction * host, host)
        out[:, j] = m * t_mb + parts.bubble_s[:, j] + parts.optimizer_s
    return out


def _expert_seconds(model: Model, cluster: Cluster, training: Training, parts: BoundParts,
                    comm: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]],
                    placement: tuple[str, ...]) -> np.ndarray:
    """Exposed seconds per step of the expert collectives (`steptime._predict_many`'s `ep_exposed`
    at its least): the expert tensor-parallel ones, and the all-to-alls, of which only the first
    gather's share where the stack overlaps them under an interleaved schedule the family may run."""
    n = len(parts.microbatches)
    if not model.is_moe or not any(axis in ("ep", "etp") for axis, _, _ in comm):
        return np.zeros(n)
    geo: dict[str, dict[str, np.ndarray]] = {}
    for cp in np.unique(parts.plans.G_cp):
        idx = np.flatnonzero(parts.plans.G_cp == cp)
        view = context.view(model, training, parts.plans.take(idx), int(cp))[2].one_placement(placement)
        scatter_geometry(geo, experts.expert_geometry(view, cluster.gpus_per_node_used, int(cp)), idx, n)
    secs: dict[tuple[str, str], np.ndarray] = {}
    events = []
    for (axis, op, _), (byte_calls, calls) in comm.items():
        if axis == "etp":
            g = geo["etp"]
            secs[("etp", op)] = secs.get(("etp", op), 0.0) + collectives.cost_s(
                cluster, op, byte_calls, calls, g["size"], g["intra"], g["members_per_node"])
        elif axis == "ep":
            events.append(CommEvent(axis="ep", op=op, phase="fwd", tag="a2a", calls=calls,
                                    payload_bytes=byte_calls / np.maximum(calls, 1.0)))
    a2a, etp, _ = experts.group_seconds(cluster, model, training, events, geo, secs, n)
    m = parts.microbatches
    overlapped = (training.effective_stack.overlap_ep_comm & (parts.max_virtual > 1)
                  & (parts.plans.G_inter > 1))
    return np.where(overlapped, a2a / np.maximum(m, 1.0) * FIRST_GATHER_SHARE, a2a) + etp


@dataclass(frozen=True, kw_only=True)
class MemoryBound:
    """GiB per GPU that no plan of each family goes below: `states_gib[z]` (weights, gradients,
    optimizer state) at the z-th ZeRO stage given, plus `rest_gib[i, j]` (activations, buffers,
    overhead) at the i-th recomputation and j-th sequence-parallel setting; and the capacity the
    search compares a plan's memory with."""

    states_gib: np.ndarray
    rest_gib: np.ndarray
    capacity_gib: float


def memory_bound(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                 zero_stages: list[int], recomputes: list[int], sequence_parallel: list[bool]) -> MemoryBound:
    """The memory bound of families given as one row each (grid and micro-batch size; the other
    option columns are ignored)."""
    cluster, training = apply_constants(cluster, training)

    def one(cp: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        model_v, training_v, part = context.view(model, training, arrays.take(idx), cp)
        return _memory_one_cp(model_v, cluster, training_v, part, zero_stages, recomputes, sequence_parallel)

    pieces = _by_context_degree(arrays, one)
    n = len(arrays)
    states = np.zeros((len(zero_stages), n))
    rest = np.zeros((len(recomputes), len(sequence_parallel), n))
    for idx, (s, r) in pieces:
        states[:, idx] = s
        rest[..., idx] = r
    return MemoryBound(states_gib=states, rest_gib=rest, capacity_gib=capacity_per_rank_gib(cluster))


def _memory_one_cp(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                   zero_stages: list[int], recomputes: list[int], sequence_parallel: list[bool]
                   ) -> tuple[np.ndarray, np.ndarray]:
    n = len(arrays)
    m = arrays.num_microbatches(training).astype(np.float64)
    S = arrays.G_inter
    first = StageShape(blocks=model.num_layers / S.astype(np.float64), has_embedding=np.ones(n, bool),
                       has_head=S == 1, is_first=np.ones(n, bool), is_last=S == 1)
    base = dict(schedule=SCHEDULE_CODE["1f1b"], virtual_stages=1, recompute=RECOMPUTE_CODE["none"],
                zero_stage=0, sequence_parallel=False)

    def memory(**options: int | bool):
        return stage_memory(model, cluster, training, with_options(arrays, **{**base, **options}), first, m,
                            position="first")

    states = np.zeros((len(zero_stages), n))
    units = unit_parts(model, training, with_options(arrays, **base), first)  # the same for every ZeRO stage
    for k, z in enumerate(zero_stages):
        rep = with_options(arrays, **{**base, "zero_stage": z})
        mem = stage_memory(model, cluster, training, rep, first, m, position="first", parts=units)
        states[k] = mem.params_gib + mem.grads_gib + mem.optimizer_gib
    rest = np.zeros((len(recomputes), len(sequence_parallel), n))
    for i, rc in enumerate(recomputes):
        for j, sp in enumerate(sequence_parallel):
            mem = memory(recompute=rc, sequence_parallel=sp)
            rest[i, j] = mem.total_gib - mem.params_gib - mem.grads_gib - mem.optimizer_gib
    return states, rest
