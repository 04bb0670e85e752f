"""Lower bounds on the step time and memory of families of plans, so a search can prove what it skips.

A family is one grid (the six degrees and the expert degrees), one micro-batch size and one
placement; its plans are every choice of schedule, virtual stages, recomputation, ZeRO stage and
sequence parallelism. The bounds here are given per recomputation and sequence-parallel setting
(time; per schedule too, `lower_bound_s(..., schedules)`) and per ZeRO stage (memory), so a search
can also skip the parts of a family that cannot win.

Time. `perfmodels.steptime` composes a plan's step as

    step = m t_mb + bubble + p2p + exposed data-parallel sync + depth gradient sync + optimizer,
    t_mb = max(t_gpu + f host, host),  t_gpu = compute + exposed per-micro-batch comm + MoE sync wait

and every term is a sum of non-negative parts that grow with the stage's blocks. So for every plan
of the family with a given recomputation and sequence-parallel setting:

- compute >= the compute of the *relaxed* stage: num_layers / G_inter blocks (the busiest stage
  holds ceil(L / (S v)) v >= L / S of them, `traffic.stage_shape`) with the LM head. A stage's
  compute is a non-negative cost per block plus what the relaxed and the busiest stage hold alike,
  so (busiest blocks / relaxed blocks) x the relaxed compute is at least the busiest stage's: the
  most compute that prefetched collectives can hide behind;
- exposed comm >= the tensor-parallel collectives that never overlap (`steptime.TP_TAGS` outside the
  backward input-grad all-reduce, `TP_FWD_EXPOSED_SHARE` of the forward ones where the stack overlaps
  them, all of them where it does not), the depth collectives less `PREFETCH_COVER` of that most
  compute (never below the first gather's share), and for a mixture of experts the expert
  tensor-parallel collectives and the all-to-alls (where the stack overlaps them under an
  interleaved schedule, less all of that most compute), all of the relaxed stage with what
  recomputation repeats; the ring and the data-parallel parts >= 0;
- the MoE layers' wait for the host (`experts.sync_wait_s`: once per MoE layer forward, again under
  full recomputation) >= that of the relaxed stage's MoE layers, and it adds to t_mb as it does in
  the model;
- host >= the relaxed stage's blocks, three passes (four under full recomputation);
- bubble = (S - 1) / v t_mb (average / busiest compute) >= (S - 1) / v x the average stage's
  compute x max(1, the t_mb bound / the busiest stage's most compute), at v_max (the most virtual
  stages the family runs) for a whole family;
- p2p = 2 (v m + S - 1) sends of one micro-batch's activations on the pipeline's link (`pipeline`),
  at v = 1 for a whole family;
- optimizer >= the relaxed stage's optimizer step sharded at the family's largest ZeRO stage;
- data-parallel and depth gradient sync >= 0.

A coarser bound, `blocks_bound_s`, costs one compute evaluation per (grid, micro-batch size) and
recomputation, and holds for every placement, ZeRO stage and schedule: the relaxed stage's compute
with what the recomputation reruns, the all-to-alls' floor and the host's exposed share set a floor
to t_mb (the host floor as above), and the bubble is (S - 1) / v_max x the blocks alone (num_layers /
G_inter of them: below the average stage) x max(1, that floor / the busiest stage's most compute). A
search takes its least over the options that fit in memory, so recomputation that memory forces
counts. A mixture of experts' grids that differ only in their expert degrees hold the same units, so
these bounds evaluate the units once per run of such siblings and the routed experts per row
(`_entries_by_siblings`; the search orders pairs by parent to make the runs).
The coarsest, `grid_bound_s`, holds for every micro-batch size and option of a grid too:
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
are taken on the relaxed stage; `MemoryBound.in_flight_gib` is what each further micro-batch in flight
adds, so a schedule's own count on its busiest stage (`schedule_in_flight`) tightens the bound per
schedule. A mixture of experts' sibling rows share their units' memory (evaluated once per run) and
differ in their routed experts' (`memory.expert_state_bytes`, `memory.expert_rest_bytes`, per row).
The states alone (`states_bound`) hold for every micro-batch size, recomputation and schedule of a
grid: a mixture of experts' grid table drops the grids whose states exceed the memory at every ZeRO
stage the stack runs (`tuner.families.grid_table`).

Nothing here is approximated: each bound is the model's own formula with terms dropped or taken at
their smallest, and tests/tuner/test_bounded_search.py checks it against every plan of whole search
spaces (a sample of each batch), per schedule as well.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfmodels import collectives, context, experts
from perfmodels.compute import StageCompute, gemm_curve, hbm_rate, stage_computes
from perfmodels.constants import apply_constants
from perfmodels.layout import group_geometry_orders
from perfmodels.memory import (
    GIB,
    capacity_per_rank_gib,
    expert_rest_bytes,
    expert_shards,
    model_state_bytes,
    rest_bytes,
    state_bytes,
    unit_parts,
)
from perfmodels.memory import in_flight as memory_in_flight
from perfmodels.pipeline import p2p_transfers_on_critical_path
from perfmodels.plans import (
    RECOMPUTE_CODE,
    SCHEDULE_CODE,
    PlanArrays,
    context_degrees,
    distinct_rows,
    equal_runs,
)
from perfmodels.specs import SCALAR_PLAN_FIELDS, Cluster, Model, Training
from perfmodels.steptime import (
    FIRST_GATHER_SHARE,
    PREFETCH_COVER,
    TP_FWD_EXPOSED_SHARE,
    _average_stage,
    _category,
    _host_seconds_per_microbatch,
    scatter_geometry,
)
from perfmodels.traffic import CommEvent, StageShape, busiest_blocks, comm_events, expert_events

TP_CATEGORIES = ("tp_exposed", "tp_fwd_half", "tp_bwd")
P2P_KEY = ("inter", "send", "p2p")
"""`BoundParts.comm`'s entry for the pipeline: (bytes of one send, 1), not a sum over calls."""


@dataclass(frozen=True, kw_only=True)
class BoundParts:
    """The placement-free parts of the time bound, arrays over families (last axis), per
    recomputation (axis R: the `recomputes` given) and sequence-parallel setting (axis P)."""

    microbatches: np.ndarray
    compute_mb_s: np.ndarray
    """(R, P, n) seconds of a micro-batch's compute on the relaxed stage."""
    host_mb_s: np.ndarray
    """(R, n) host seconds to issue a micro-batch of the relaxed stage."""
    sync_mb_s: np.ndarray
    """(R, n) seconds a micro-batch's GPUs wait for the host in the relaxed stage's MoE layers
    (`experts.sync_wait_s`; none for a dense model)."""
    average_mb_s: np.ndarray
    """(R, P, n) seconds of a micro-batch's compute on the average stage (what the bubble idles)."""
    optimizer_s: np.ndarray
    degrees: dict[str, np.ndarray]
    comm: list[list[dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]]]
    """Per recomputation and sequence-parallel setting (comm[r][p]): (axis, op, category) ->
    (bytes x calls, calls) per step, the collectives recomputation repeats included."""
    plans: PlanArrays
    """The families' representative plans (for the expert groups' geometry)."""
    max_virtual: np.ndarray
    busiest_ratio: np.ndarray
    """At least the busiest stage's blocks over the relaxed stage's, for any virtual-stage count up to
    `max_virtual` (`busiest_block_ratio`): times `compute_mb_s`, at least a micro-batch's compute on
    the busiest stage, which bounds from above what prefetched collectives can hide behind."""

    def take(self, index: np.ndarray) -> BoundParts:
        return BoundParts(
            microbatches=self.microbatches[index], compute_mb_s=self.compute_mb_s[..., index],
            host_mb_s=self.host_mb_s[..., index], sync_mb_s=self.sync_mb_s[..., index],
            average_mb_s=self.average_mb_s[..., index],
            optimizer_s=self.optimizer_s[index],
            degrees={k: v[index] for k, v in self.degrees.items()},
            comm=[[{k: (b[index], c[index]) for k, (b, c) in per.items()} for per in by_rc]
                  for by_rc in self.comm],
            plans=self.plans.take(index), max_virtual=self.max_virtual[index],
            busiest_ratio=self.busiest_ratio[index])


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


def _rows(arrays: PlanArrays, idx: np.ndarray) -> PlanArrays:
    """`arrays.take(idx)` for `idx` from `np.flatnonzero`: the arrays themselves where idx is every
    row (one context-parallel degree, the common case: no copy of every column)."""
    return arrays if len(idx) == len(arrays) else arrays.take(idx)


def _by_context_degree(arrays: PlanArrays, one):
    """Run `one(cp, index)` for each context-parallel degree of `arrays`; (index, result) pairs."""
    return [(idx, one(int(cp), idx)) for cp in context_degrees(arrays)
            for idx in [np.flatnonzero(arrays.G_cp == cp)]]


def blocks_bound_s(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                   max_virtual: np.ndarray, recomputes: list[int], sequence_parallel: list[bool]
                   ) -> np.ndarray:
    """(R, P, n) seconds per step no plan of each (grid, micro-batch size) row of `arrays` with the
    r-th recomputation and p-th sequence-parallel setting can beat, under any placement, ZeRO stage or
    schedule (see the module docstring). A search takes the least over the options that fit in
    memory, so recomputation that memory forces on a pair counts in its bound."""
    cluster, training = apply_constants(cluster, training)
    out = np.zeros((len(recomputes), len(sequence_parallel), len(arrays)))
    for cp in context_degrees(arrays):
        idx = np.flatnonzero(arrays.G_cp == cp)
        model_v, training_v, view = context.view(model, training, _rows(arrays, idx), int(cp))
        out[..., idx] = _grid_bound_one_cp(model_v, cluster, training_v, view, view, max_virtual[idx],
                                           recomputes, sequence_parallel)
    return out


def _all_to_all_floor_s(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                        max_virtual: np.ndarray) -> np.ndarray:
    """Exposed seconds per step of a mixture of experts' all-to-alls that no placement avoids. Of the
    tokens a rank sends (`experts.add_events`, forward and backward, no recomputation), (q - 1) / p
    go to the q - 1 peers on its node over NVLink and (p - q) / p leave it over the rank's NIC share,
    the two at once (`collectives.all_to_all_s`), q <= min(G_ep, GPUs per node) the group's members
    per node, which the placement sets: the least over q of the slower of the two, where they meet
    or at the most q, plus the calls' latency at the faster link, with the load imbalance; the first
    gather's share where the stack may overlap them (an interleaved schedule). 0 for a dense model
    and for the node-deduplicating "flex" dispatcher. m x tokens per micro-batch is the same for
    every micro-batch size, so this holds for a whole grid too."""
    n = len(arrays)
    if not model.is_moe or training.moe_token_dispatcher == "flex":
        return np.zeros(n)
    share, latency = all_to_all_floor_terms(cluster, arrays.G_ep)
    return all_to_all_floor_from(model, cluster, training, arrays.G_ep, share, latency, arrays.G_inter,
                                 arrays.num_microbatches(training), experts.tokens_per_rank(model, arrays),
                                 max_virtual)


def all_to_all_floor_terms(cluster: Cluster, G_ep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the seconds per byte on the slower link of a rank's all-to-all, the seconds of latency per
    call and MoE layer-micro-batch) of `_all_to_all_floor_s` for each expert-parallel degree: what
    reads only G_ep and the cluster (a grid table works them out once per degree)."""
    p = np.asarray(G_ep).astype(np.float64)
    q_most = np.minimum(p, float(cluster.gpus_per_node_used))
    nvlink = cluster.intra_node_bandwidth_GBps * cluster.link_efficiency_intra * 1e9
    nic = cluster.inter_node_bandwidth_GBps * cluster.link_efficiency_inter * 1e9
    # (q - 1) / nvlink grows with q and (p - q) / nic falls: the slower of the two is least where
    # they meet, q* = (p / nic + 1 / nvlink) / (1 / nvlink + 1 / nic), or at the most q
    q = np.clip((p / nic + 1.0 / nvlink) / (1.0 / nvlink + 1.0 / nic), 1.0, q_most)
    share = np.maximum((q - 1.0) / nvlink, (p - q) / nic) / p
    alpha_us = min(cluster.intra_node_latency_us, cluster.inter_node_latency_us)
    return share, collectives.latency_steps("all_to_all", p) * alpha_us * 1e-6 * 4.0


def all_to_all_floor_from(model: Model, cluster: Cluster, training: Training, G_ep: np.ndarray,
                          share: np.ndarray, latency: np.ndarray, G_inter: np.ndarray,
                          microbatches: np.ndarray, tokens: np.ndarray, max_virtual: np.ndarray
                          ) -> np.ndarray:
    """`_all_to_all_floor_s` from its per-degree terms (`all_to_all_floor_terms`), the stages, the
    micro-batches and the tokens per rank (`experts.tokens_per_rank`) of each row."""
    S = G_inter.astype(np.float64)
    m = microbatches.astype(np.float64)
    moe_layers = model.num_layers / S * model.moe_fraction
    per_token = model.moe_router_topk * model.hidden_size * training.bytes_per_element
    volume = 4.0 * moe_layers * m * tokens * per_token
    seconds = experts.load_imbalance(training) * np.where(G_ep > 1, volume * share + latency * moe_layers * m,
                                                          0.0)
    overlapped = training.effective_stack.overlap_ep_comm & (np.asarray(max_virtual) > 1) & (S > 1)
    seconds = np.where(overlapped, seconds / np.maximum(m, 1.0) * FIRST_GATHER_SHARE, seconds)
    return seconds * _corrections(cluster)("tp_comm")


def grid_bound_s(model: Model, cluster: Cluster, training: Training, smallest: PlanArrays,
                 largest: PlanArrays, max_virtual: np.ndarray, sequence_parallel: list[bool]) -> np.ndarray:
    """Seconds per step no plan of each grid can beat, under any micro-batch size between the
    `smallest` and the `largest` rows' (the same grids), placement or option (module docstring)."""
    none = [RECOMPUTE_CODE["none"]]
    return grid_bounds_by_option(model, cluster, training, smallest, largest, max_virtual, none,
                                 sequence_parallel).min(axis=(0, 1))


def grid_bounds_by_option(model: Model, cluster: Cluster, training: Training, smallest: PlanArrays,
                          largest: PlanArrays, max_virtual: np.ndarray, recomputes: list[int],
                          sequence_parallel: list[bool]) -> np.ndarray:
    """(R, P, n): `grid_bound_s` of the plans with each recomputation and sequence-parallel setting
    (the least over them is `grid_bound_s`, at no recomputation)."""
    cluster, training = apply_constants(cluster, training)
    out = np.zeros((len(recomputes), len(sequence_parallel), len(smallest)))
    for cp in context_degrees(smallest):
        idx = np.flatnonzero(smallest.G_cp == cp)
        model_v, training_v, low = context.view(model, training, _rows(smallest, idx), int(cp))
        high = context.view(model, training, _rows(largest, idx), int(cp))[2]
        out[..., idx] = _grid_bound_one_cp(model_v, cluster, training_v, low, high, max_virtual[idx],
                                           recomputes, sequence_parallel)
    return out


def _grid_bound_one_cp(model: Model, cluster: Cluster, training: Training, low: PlanArrays, high: PlanArrays,
                       max_virtual: np.ndarray, recomputes: list[int], sequence_parallel: list[bool]
                       ) -> np.ndarray:
    """(R, P, n): the bound at each recomputation and sequence-parallel setting; with `high` the same
    object as `low`, the bound of that one micro-batch size. Recomputation adds its own compute (what
    it reruns) and host passes; "none" is the least of all."""
    n = len(low)
    S = low.G_inter.astype(np.float64)
    blocks_only = StageShape(blocks=model.num_layers / S, has_embedding=np.zeros(n, bool),
                             has_head=np.zeros(n, bool), is_first=S == 1, is_last=np.ones(n, bool))
    m_fewest = high.num_microbatches(training).astype(np.float64)
    c_compute = _corrections(cluster)("compute")
    fill = (S - 1.0) / np.maximum(max_virtual, 1).astype(np.float64)
    out = np.zeros((len(recomputes), len(sequence_parallel), n))

    none = RECOMPUTE_CODE["none"]
    relaxed = _relaxed_stage(model, low)
    # forward and backward do not depend on recomputation, which only adds `recompute_s`: one
    # evaluation per recomputation that repeats something (and one for "none" alone)
    evaluated: dict[tuple[int, bool, bool], list[tuple[np.ndarray, np.ndarray | float]]] = {}
    siblings = _expert_siblings(model, low, high)

    def first_of(rc: int) -> int:
        return next((r for r in recomputes if r != none), none) if rc == none else rc

    # every (recomputation, sequence-parallel) entry of `low` (and of `high`) in one stacked
    # evaluation: each call costs a fixed overhead that grows with the model
    combos = list(dict.fromkeys((first_of(rc), sp) for rc in recomputes for sp in sequence_parallel))
    entries = [(arrays, rc, sp) for arrays in ([low] if high is low else [low, high]) for rc, sp in combos]
    k = len(entries)
    if siblings is not None:
        per_entry = _entries_by_siblings(model, cluster, training, [low, high], entries,
                                         [blocks_only, relaxed], *siblings)
    else:
        stacked = _stacked([with_options(arrays, recompute=rc, sequence_parallel=sp)
                            for arrays, rc, sp in entries])
        results = [(c.fwd_s + c.bwd_s, c.recompute_s) for c in stage_computes(
            model, cluster, training, stacked, [_tiled(blocks_only, k), _tiled(relaxed, k)])]
        per_entry = [[tuple(_entry(x, e, n) for x in pair) for pair in results] for e in range(k)]
    for e, (arrays, rc, sp) in enumerate(entries):
        evaluated[(rc, sp, arrays is low)] = per_entry[e]

    def stage_seconds(arrays: PlanArrays, rc: int, sp: bool, head: bool) -> np.ndarray:
        """A micro-batch's compute on the relaxed stage (`head`) or of its blocks alone."""
        fwd_bwd, again = evaluated[(first_of(rc), sp, arrays is low)][int(head)]
        return (fwd_bwd + (again if rc != none else 0.0)) * c_compute

    host_share = training.effective_stack.host_exposed_fraction
    one_size = high is low
    ratio = busiest_block_ratio(model.num_layers, low.G_inter, np.asarray(max_virtual)) if one_size else None
    a2a = [_all_to_all_floor_s(model, cluster, training, with_options(high, sequence_parallel=sp),
                               max_virtual) for sp in sequence_parallel]
    for i, rc in enumerate(recomputes):
        with_rc = with_options(low, recompute=rc)
        host = _host_seconds_per_microbatch(model, cluster, training, with_rc, relaxed)
        # the MoE layers' wait for the host, per micro-batch whatever its size (`experts.sync_wait_s`)
        sync = experts.sync_wait_s(model, cluster, training, with_rc, relaxed.blocks)
        for j, sp in enumerate(sequence_parallel):
            # t_mb >= the busiest stage's compute >= the relaxed stage's (with the LM head); the
            # bubble idles the average stage, of which the blocks alone are a floor
            c_low = stage_seconds(low, rc, sp, head=False)
            c_high = stage_seconds(high, rc, sp, head=True)
            if high is not low:
                out[i, j] = np.maximum(m_fewest * (c_high + sync) + a2a[j], m_fewest * host) + fill * c_low
                continue
            # one micro-batch size: t_mb >= its compute, the all-to-alls' floor and the host's share,
            # and the bubble scales the average stage by t_mb over the busiest stage's most compute
            # (`lower_bound_s`)
            t_mb = np.maximum(c_high + a2a[j] / np.maximum(m_fewest, 1.0) + sync + host_share * host, host)
            busiest = c_high * ratio  # type: ignore[operator]
            out[i, j] = m_fewest * t_mb + fill * c_low * np.maximum(1.0, t_mb / np.maximum(busiest, 1e-30))
    return out


def _expert_siblings(model: Model, low: PlanArrays, high: PlanArrays) -> tuple[np.ndarray, np.ndarray] | None:
    """(first row of each run of rows that differ at most in their expert degrees, each row's run),
    for a mixture of experts where the runs are long enough to pay; else None."""
    if not model.is_moe:
        return None
    names = ("G_data", "G_inter", "G_intra_d", "G_intra_r", "G_intra_c", "G_cp", "micro_batch_size")
    sets = (low,) if high is low else (low, high)
    first, run = equal_runs([getattr(arrays, name) for arrays in sets for name in names])
    return (first, run) if len(first) * 2 <= len(low) else None


def _entries_by_siblings(model: Model, cluster: Cluster, training: Training, row_sets: list[PlanArrays],
                         entries: list[tuple[PlanArrays, int, bool]], shapes: list[StageShape],
                         first: np.ndarray, run: np.ndarray) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """For each (rows, recomputation, sequence parallelism) of `entries` (`rows` one of `row_sets`,
    the same grids at different micro-batch sizes) and each of `shapes` (blocks and LM head alike for
    siblings), the (forward + backward, recomputation) seconds per micro-batch of each row: the units
    once per run of siblings (grids that differ only in their expert degrees hold the same units),
    every entry's first rows in one evaluation; the routed experts once per distinct expert layout
    of all entries (`_routed_forward_s`), each row getting its own, added as
    `compute.stage_computes` adds them (moe_layers x the forward, twice it backward, the forward
    again under full recomputation). No entry's rows are stacked: a grid table has tens of
    thousands."""
    k, g = len(entries), len(first)
    full = RECOMPUTE_CODE["full"]
    reps = _stacked([with_options(rows.take(first), recompute=rc, sequence_parallel=sp)
                     for rows, rc, sp in entries])
    taken = [_tiled(st.per_plan(lambda x: x[first]), k) for st in shapes]
    comps = stage_computes(model, cluster, training, reps, taken)
    e_fwd = _routed_forward_s(model, cluster, training, row_sets, entries)
    moe_layers = [np.asarray(st.blocks, dtype=np.float64) * model.moe_fraction for st in shapes]
    out = []
    for e, (_, rc, _) in enumerate(entries):
        at = slice(e * g, (e + 1) * g)
        again = e_fwd[e] if rc == full else np.zeros(len(run))
        pairs = []
        for layers, comp in zip(moe_layers, comps):
            routed = np.asarray(comp.experts_fwd_s)[at]
            units = comp.fwd_s[at] + comp.bwd_s[at] - 3.0 * routed
            units_again = comp.recompute_s[at] - (routed if rc == full else 0.0)
            pairs.append((units[run] + layers * 3.0 * e_fwd[e], units_again[run] + layers * again))
        out.append(pairs)
    return out


def _routed_forward_s(model: Model, cluster: Cluster, training: Training, row_sets: list[PlanArrays],
                      entries: list[tuple[PlanArrays, int, bool]]) -> list[np.ndarray]:
    """One MoE layer's routed-expert forward seconds (`experts.layer_compute`, GEMM + memory-bound)
    of each entry's rows at its sequence-parallel setting, evaluated once per distinct expert layout
    over all entries (the layout columns `experts.LAYER_COLUMNS` of every row set)."""
    columns = {id(c): c for rows in row_sets for name in experts.LAYER_COLUMNS
               if name != "sequence_parallel" for c in [getattr(rows, name)]}
    some, which = distinct_rows(list(columns.values()))
    reps = _stacked([with_options(rows.take(some), sequence_parallel=sp) for rows, _, sp in entries])
    gemm, mem = experts.layer_compute(model, training, reps, gemm_curve(cluster, training), hbm_rate(cluster))
    fwd = (gemm + mem).reshape(len(entries), len(some))
    return [f[which] for f in fwd]


def bound_parts(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                max_virtual: np.ndarray, recomputes: list[int], sequence_parallel: list[bool]) -> BoundParts:
    """The placement-free parts of the time bound of each family in `arrays`: one row per family,
    holding its grid and micro-batch size with its largest ZeRO stage (the other option columns are
    ignored). `max_virtual`: the most virtual stages any schedule of the family runs (1 without
    interleaving)."""
    cluster, training = apply_constants(cluster, training)
    pieces = _by_context_degree(arrays, lambda cp, idx: _parts_one_cp(
        model, cluster, training, _rows(arrays, idx), max_virtual[idx], cp, recomputes, sequence_parallel))
    if len(pieces) == 1:
        return pieces[0][1]
    n = len(arrays)

    def scatter(get) -> np.ndarray:
        first = np.asarray(get(pieces[0][1]))
        out = np.zeros((*first.shape[:-1], n))
        for idx, p in pieces:
            out[..., idx] = get(p)
        return out

    def sums(i: int, j: int, key: tuple[str, str, str], which: int):
        return lambda p: p.comm[i][j][key][which] if key in p.comm[i][j] else np.zeros(len(p.microbatches))

    comm = [[{k: (scatter(sums(i, j, k, 0)), scatter(sums(i, j, k, 1)))
              for k in dict.fromkeys(k for _, p in pieces for k in p.comm[i][j])}
             for j in range(len(sequence_parallel))] for i in range(len(recomputes))]
    return BoundParts(
        microbatches=scatter(lambda p: p.microbatches), compute_mb_s=scatter(lambda p: p.compute_mb_s),
        host_mb_s=scatter(lambda p: p.host_mb_s), sync_mb_s=scatter(lambda p: p.sync_mb_s),
        average_mb_s=scatter(lambda p: p.average_mb_s),
        optimizer_s=scatter(lambda p: p.optimizer_s), degrees=arrays.degrees(), comm=comm, plans=arrays,
        max_virtual=np.asarray(max_virtual), busiest_ratio=scatter(lambda p: p.busiest_ratio))


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
    compute = np.zeros((len(recomputes), len(sequence_parallel), n))
    average_mb = np.zeros_like(compute)
    host = np.zeros((len(recomputes), n))
    sync = np.zeros((len(recomputes), n))
    optimizer = np.zeros(n)
    comm: list[list[dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]]] = [[] for _ in recomputes]
    none = RECOMPUTE_CODE["none"]
    # forward and backward do not depend on recomputation, which only adds `recompute_s`, nor the
    # events of the other phases on it (`traffic.comm_events`): one entry per recomputation that
    # repeats something ("none" alone where none does), per sequence-parallel setting, all of them
    # stacked into one evaluation (each call costs a fixed overhead that grows with the model)
    repeating = sorted(set(recomputes) - {none}, reverse=True) or [none]
    entries = [(sp, rc) for sp in sequence_parallel for rc in repeating]
    k = len(entries)
    stacked = _stacked([with_options(arrays, recompute=rc, sequence_parallel=sp) for sp, rc in entries])
    comps = stage_computes(model, cluster, training, stacked, [_tiled(relaxed, k), _tiled(average, k)])
    once, again = _critical_comm(model, training, stacked, _tiled(relaxed, k))

    def entry(x, e: int):
        return _entry(x, e, n)

    def sums(d: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]], e: int
             ) -> dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]:
        # the keys some row of this entry calls (another entry's rows may call others)
        return {key: (entry(b, e), entry(c, e)) for key, (b, c) in d.items() if np.any(entry(c, e))}

    for j, sp in enumerate(sequence_parallel):
        mine = [e for e, (x, _) in enumerate(entries) if x == sp]
        evaluated = {entries[e][1]: tuple(StageCompute(**{f: entry(getattr(c, f), e) for f in STAGE_FIELDS})
                                          for c in comps) for e in mine}
        for i, rc in enumerate(recomputes):
            comp, avg = evaluated.get(rc, next(iter(evaluated.values())))
            again_s, again_avg = (comp.recompute_s, avg.recompute_s) if rc != none else (0.0, 0.0)
            compute[i, j] = (comp.fwd_s + comp.bwd_s + again_s) * c_compute
            average_mb[i, j] = (avg.fwd_s + avg.bwd_s + again_avg) * c_compute
            optimizer = comp.optimizer_s * c_compute
            if j == 0:
                with_rc = with_options(arrays, recompute=rc)
                host[i] = _host_seconds_per_microbatch(model, cluster, training, with_rc, relaxed)
                sync[i] = experts.sync_wait_s(model, cluster, training, with_rc, relaxed.blocks)
        # what recomputation repeats counts too (a reentrant layer's collectives, an MoE layer's
        # combine all-to-all); "none" repeats nothing
        base = sums(once, mine[0])
        repeats: dict[int, dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]] = {none: {}}
        repeats.update({entries[e][1]: sums(again, e) for e in mine if entries[e][1] != none})
        for i, rc in enumerate(recomputes):
            comm[i].append(_merged(base, repeats[rc]) if repeats[rc] else base)
    return BoundParts(microbatches=m, compute_mb_s=compute, host_mb_s=host, sync_mb_s=sync,
                      average_mb_s=average_mb,
                      optimizer_s=optimizer, degrees=real.degrees(), comm=comm, plans=real,
                      max_virtual=np.asarray(max_virtual),
                      busiest_ratio=busiest_block_ratio(model.num_layers, S, np.asarray(max_virtual)))


def _stacked(parts: list[PlanArrays]) -> PlanArrays:
    """The rows of several PlanArrays (one placement, as the bounds' representatives have) one after
    the other."""
    if len(parts) == 1:
        return parts[0]
    columns = {f: np.concatenate([getattr(p, f) for p in parts]) for f in SCALAR_PLAN_FIELDS}
    return parts[0].with_columns(**columns)


def _tiled(st: StageShape, k: int) -> StageShape:
    """`st` for `k` stacked copies of its plans (`_stacked`)."""
    return st if k == 1 else st.per_plan(lambda x: np.tile(x, k))


def _entry(x, e: int, n: int):
    """The e-th of the stacked copies (`_stacked`) of an n-row result, scalars as they are."""
    return x[e * n:(e + 1) * n] if isinstance(x, np.ndarray) and x.ndim == 1 else x


def busiest_block_ratio(num_layers: int, stages: np.ndarray, max_virtual: np.ndarray) -> np.ndarray:
    """The most blocks the busiest stage holds, ceil(L / (S v)) v over every v <= `max_virtual`
    (`traffic.stage_shape`), over the relaxed stage's L / S. A stage's compute is a non-negative cost
    per block plus its head, embedding and spread units, which the relaxed and the busiest stage hold
    alike, so this ratio times the relaxed stage's compute is at least the busiest stage's."""
    S = np.asarray(stages, dtype=np.int64)
    v_max = np.maximum(np.asarray(max_virtual, dtype=np.int64), 1)
    most = np.zeros(S.shape, dtype=np.int64)
    for v in range(1, int(v_max.max(initial=1)) + 1):
        most = np.where(v <= v_max, np.maximum(most, busiest_blocks(num_layers, S, v)), most)
    return most / (num_layers / S.astype(np.float64))


STAGE_FIELDS = tuple(StageCompute.__dataclass_fields__)

_SIBLING_COLUMNS = tuple(f for f in SCALAR_PLAN_FIELDS if f not in ("G_ep", "G_etp"))
"""Every plan column but the expert degrees: rows equal in these hold the same layers' units."""


def _sibling_runs(model: Model, arrays: PlanArrays, siblings: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """(first row of each group of rows that differ only in their expert degrees, each row's group):
    a mixture of experts' rows, of one context-parallel degree 1 (a view), where the groups are
    large enough to pay; else None."""
    n = len(arrays)
    if not (siblings and model.is_moe and n > 1 and np.all(arrays.G_cp == 1)):
        return None
    order = np.lexsort([getattr(arrays, f) for f in reversed(_SIBLING_COLUMNS)])
    firsts, runs = equal_runs([getattr(arrays, f)[order] for f in _SIBLING_COLUMNS])
    if len(firsts) * 2 > n:
        return None
    run = np.empty(n, dtype=np.int64)
    run[order] = runs
    return order[firsts], run


Sums = dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]


def _critical_comm(model: Model, training: Training, arrays: PlanArrays, stage: StageShape,
                   with_base: bool = True, siblings: bool = True) -> tuple[Sums, Sums]:
    """(bytes x calls, calls) per (axis, op, category) of the collectives the bound counts: the
    categories and axes `steptime._comm_by_kind` puts on the critical path per micro-batch; those of
    the forward and backward (unless not `with_base`), and those recomputation repeats. A layer list's
    collectives are not counted (the bound stays below).

    A mixture of experts' units are summed once per group of rows that differ only in their expert
    degrees (`traffic.comm_events(..., with_experts=False)`: they do not read them) and the sums
    spread to every row, then the routed experts' events (`traffic.expert_events`) are added per row:
    each row sees the same additions in the same order as when its events are summed alone."""
    base: Sums = {}
    again: Sums = {}
    if model.layers:
        return base, again
    groups = _sibling_runs(model, arrays, siblings)
    if groups is None:
        events = comm_events(model, training, arrays, stage)
        _add_critical(events, base, again, len(arrays), training, with_base)
        return base, again
    first, run = groups
    reps = arrays.take(first)
    _add_critical(comm_events(model, training, reps, stage.per_plan(lambda x: x[first]), with_experts=False),
                  base, again, len(first), training, with_base)
    for sums in (base, again):
        for key, (byte_calls, calls) in sums.items():
            sums[key] = (byte_calls[run], calls[run])
    events = expert_events(model, training, arrays, stage)
    _add_critical(events, base, again, len(arrays), training, with_base)
    return base, again


def _add_critical(events: list[CommEvent], base: Sums, again: Sums, n: int, training: Training,
                  with_base: bool) -> None:
    """Add the critical-path collectives of `events` (arrays of `n`) to the sums (`_critical_comm`)."""
    overlap_tp = training.effective_stack.overlap_tp_comm
    for ev in events:
        repeat = ev.phase == "recompute"
        if not (repeat or with_base):
            continue
        if ev.tag == "p2p" and ev.op == "send":  # the payload of one pipeline send (`_p2p_seconds`)
            one = base.setdefault(P2P_KEY, (np.zeros(n), np.ones(n)))[0]
            one[...] = np.maximum(one, ev.payload_bytes)
            continue
        if not np.any(ev.calls):
            continue
        cat = _category(ev, overlap_tp)
        if ev.axis in ("ep", "etp"):  # every expert collective is on the critical path (steptime)
            cat = ev.axis
        elif not ((cat in TP_CATEGORIES and ev.axis in ("row", "col")) or (cat == "depth" == ev.axis)):
            continue
        acc = (again if repeat else base).setdefault((ev.axis, ev.op, cat), (np.zeros(n), np.zeros(n)))
        acc[0][...] += ev.payload_bytes * ev.calls
        acc[1][...] += ev.calls


def _merged(base: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]],
            again: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]
            ) -> dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]:
    """`base` with the sums of `again` added (new dicts, new arrays where both have a key)."""
    out = dict(base)
    for key, (b, c) in again.items():
        out[key] = (base[key][0] + b, base[key][1] + c) if key in base else (b, c)
    return out


@dataclass(frozen=True, kw_only=True)
class PricedComm:
    """The collectives of `BoundParts.comm` priced under one placement, arrays (R, P, n) per
    recomputation and sequence-parallel setting (`overlaps`: (n,)), scaled by the profile's
    corrections."""

    tp_s: np.ndarray
    """Tensor-parallel seconds per step that never overlap."""
    depth_s: np.ndarray
    """Depth-parallel gathers per step, before what compute may hide."""
    a2a_s: np.ndarray
    etp_s: np.ndarray
    p2p_call_s: np.ndarray
    overlaps: np.ndarray
    """Whether the stack may overlap the all-to-alls under an interleaved schedule of the family."""

    def take(self, index: np.ndarray) -> PricedComm:
        return PricedComm(tp_s=self.tp_s[..., index], depth_s=self.depth_s[..., index],
                          a2a_s=self.a2a_s[..., index], etp_s=self.etp_s[..., index],
                          p2p_call_s=self.p2p_call_s[..., index], overlaps=self.overlaps[index])


def price_comm(model: Model, cluster: Cluster, training: Training, parts: BoundParts,
               placement: tuple[str, ...] | tuple[list[tuple[str, ...]], np.ndarray]) -> PricedComm:
    """The families' bounded collectives (`BoundParts.comm`) in seconds under `placement`, or under
    placements (orders, index of each family's), every (recomputation, sequence-parallel) entry and
    every placement priced in one pass (the families repeated per entry)."""
    cluster, training = apply_constants(cluster, training)
    corr = _corrections(cluster)
    stack = training.effective_stack
    n = len(parts.microbatches)
    entries = [c for by_rc in parts.comm for c in by_rc]
    k = len(entries)

    def tiled(x: np.ndarray) -> np.ndarray:
        return np.tile(x, k)

    def tiled_geo(g: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
        return {axis: {f: tiled(np.asarray(v)) for f, v in d.items()} for axis, d in g.items()}

    # each family's geometry under its own placement (one placement: every family's)
    orders, which = placement if isinstance(placement[1], np.ndarray) else ([placement], np.zeros(n, int))
    plain = group_geometry_orders(parts.degrees, orders, which, cluster.gpus_per_node_used)
    geo = tiled_geo(plain)
    expert_geo = (tiled_geo(_expert_geometry(model, cluster, training, parts, orders, which))
                  if model.is_moe else None)
    comm: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = {}
    for key in dict.fromkeys(key for c in entries for key in c):
        zero = np.zeros(n)
        comm[key] = (np.concatenate([c[key][0] if key in c else zero for c in entries]),
                     np.concatenate([c[key][1] if key in c else zero for c in entries]))
    per_step = {cat: np.zeros(n * k) for cat in (*TP_CATEGORIES, "depth")}
    for (axis, op, cat), (byte_calls, calls) in comm.items():
        if axis in ("ep", "etp") or (axis, op, cat) == P2P_KEY:  # `_expert_seconds`, `_p2p_call_s`
            continue
        g = geo[axis]
        per_step[cat] = per_step[cat] + collectives.cost_s(
            cluster, op, byte_calls, calls, g["size"], g["intra"], g["members_per_node"])
    tp = per_step["tp_exposed"] + TP_FWD_EXPOSED_SHARE * per_step["tp_fwd_half"]
    if not stack.overlap_tp_comm:
        tp = tp + per_step["tp_bwd"]
    a2a, etp = _expert_seconds(model, cluster, training, comm, expert_geo, n * k)
    p2p = _p2p_call_s(cluster, training, comm, geo, tiled(parts.plans.G_intra_r))
    shape = (len(parts.comm), len(parts.comm[0]) if parts.comm else 0, n)
    overlaps = (stack.overlap_ep_comm & (parts.max_virtual > 1) & (parts.plans.G_inter > 1)
                & (expert_geo is not None))
    return PricedComm(tp_s=np.reshape(tp * corr("tp_comm"), shape),
                      depth_s=np.reshape(per_step["depth"] * corr("dp_comm"), shape),
                      a2a_s=np.reshape(a2a * corr("tp_comm"), shape),
                      etp_s=np.reshape(etp * corr("tp_comm"), shape),
                      p2p_call_s=np.reshape(p2p * corr("pp_p2p"), shape), overlaps=overlaps)


def lower_bound_s(model: Model, cluster: Cluster, training: Training, parts: BoundParts,
                  placement: tuple[str, ...] | PricedComm, schedules: list[tuple[int, int]] | None = None
                  ) -> np.ndarray:
    """(R, P, n) seconds per step that no plan of each family under `placement` (or with its
    collectives already priced under it, `price_comm`), with the recomputation and sequence-parallel
    setting of that entry, can beat, whatever its schedule (with at most the family's `max_virtual`
    stages). With `schedules` ((schedule code, virtual stages) pairs): (schedules, R, P, n), the
    bound of the plans that run each one."""
    priced = (placement if isinstance(placement, PricedComm)
              else price_comm(model, cluster, training, parts, placement))
    training = apply_constants(cluster, training)[1]
    stack = training.effective_stack
    m = parts.microbatches
    S = parts.plans.G_inter
    n = len(m)
    if schedules is None:  # any schedule up to the family's most virtual stages
        v = parts.max_virtual[None, :].astype(np.float64)
        interleaved = parts.max_virtual[None, :] > 1
        ratio = parts.busiest_ratio[None, :]
        one_f_one_b = np.full(n, SCHEDULE_CODE["1f1b"])
        transfers = p2p_transfers_on_critical_path(m, S, one_f_one_b, np.ones(n))[None, :]
    else:
        codes = np.asarray([c for c, _ in schedules])
        interleaved = (codes == SCHEDULE_CODE["interleaved-1f1b"])[:, None]  # (s, 1)
        v = np.where(interleaved, np.asarray([x for _, x in schedules])[:, None], 1).astype(np.float64)
        L = model.num_layers
        ratio = busiest_blocks(L, S[None, :], v.astype(np.int64)) / (L / S[None, :].astype(np.float64))
        transfers = np.where(S > 1, 2.0 * (v * m + S - 1), 0.0)  # `pipeline.p2p_transfers_on_critical_path`
    # (s, R, n) from here: s schedules, R recomputations
    v, interleaved, ratio, transfers = v[:, None], interleaved[:, None], ratio[:, None], transfers[:, None]
    fill = (S - 1.0) / np.maximum(v, 1.0)
    first = FIRST_GATHER_SHARE / np.maximum(m, 1.0)
    host = parts.host_mb_s  # (R, n)
    out = np.zeros((len(ratio), *parts.compute_mb_s.shape))
    for j in range(parts.compute_mb_s.shape[1]):
        compute = parts.compute_mb_s[:, j]  # (R, n)
        # at least a micro-batch's compute on the busiest stage, times m: what prefetched collectives
        # can hide behind is at most PREFETCH_COVER of that (`steptime._prefetched_exposed`)
        busiest_mb = compute * ratio  # (s, R, n)
        cover = PREFETCH_COVER * m * busiest_mb
        depth, a2a = priced.depth_s[:, j], priced.a2a_s[:, j]  # (R, n)
        if stack.overlap_depth_comm:
            depth = np.maximum(depth - cover, depth * first)
        # overlapped all-to-alls (Megatron-Core's combined 1F1B, `steptime._combined_1f1b_exposed`):
        # each layer's four wait for at least what exceeds the layer's forward and backward
        hidden = np.maximum(a2a - m * busiest_mb, a2a * first)
        experts_s = np.where(priced.overlaps & interleaved, hidden, a2a)
        exposed_mb = (priced.tp_s[:, j] + experts_s + priced.etp_s[:, j] + depth) / m
        t_mb = np.maximum(compute + exposed_mb + parts.sync_mb_s + stack.host_exposed_fraction * host, host)
        # the bubble scales the busiest stage's micro-batch by the average stage's share of its compute
        # (`steptime._pipeline_seconds`): at least t_mb over the busiest stage's compute at its most,
        # and never below the average stage's compute
        bubble = fill * parts.average_mb_s[:, j] * np.maximum(1.0, t_mb / np.maximum(busiest_mb, 1e-30))
        out[:, :, j] = m * t_mb + bubble + transfers * priced.p2p_call_s[:, j] + parts.optimizer_s
    return out[0] if schedules is None else out


def _p2p_call_s(cluster: Cluster, training: Training,
                comm: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]],
                geo: dict[str, dict[str, np.ndarray]], G_intra_r: np.ndarray) -> np.ndarray:
    """Seconds of one pipeline send under the placement (`steptime._p2p_seconds`)."""
    n = len(G_intra_r)
    if P2P_KEY not in comm:
        return np.zeros(n)
    payload = comm[P2P_KEY][0]
    if training.effective_stack.p2p_scatter_gather:
        payload = payload / G_intra_r
    g = geo["inter"]
    two = np.full(n, 2.0)
    alpha, busbw = collectives.link_constants(cluster, "send_recv", two, g["intra"], np.ones(n))
    per_call = collectives.collective_time_s("send_recv", payload, two, alpha, busbw)
    return np.where(g["size"] > 1, per_call, 0.0)


def _expert_geometry(model: Model, cluster: Cluster, training: Training, parts: BoundParts,
                     orders: list[tuple[str, ...]], which: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """The expert groups' geometry (`experts.expert_geometry`) of the families, each under its
    placement `orders[which]`."""
    n = len(parts.microbatches)
    placed = replace(parts.plans, placement=orders[0], placements=tuple(orders),
                     placement_index=np.asarray(which))
    geo: dict[str, dict[str, np.ndarray]] = {}
    for cp in context_degrees(parts.plans):
        idx = np.flatnonzero(parts.plans.G_cp == cp)
        view = context.view(model, training, _rows(placed, idx), int(cp))[2]
        scatter_geometry(geo, experts.expert_geometry(view, cluster.gpus_per_node_used, int(cp)), idx, n)
    return geo


def _expert_seconds(model: Model, cluster: Cluster, training: Training,
                    comm: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]],
                    geo: dict[str, dict[str, np.ndarray]] | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(all-to-all, expert tensor-parallel) seconds per step of the expert collectives at their least
    (`steptime._predict_many`'s `ep_a2a`, `ep_etp`) in the expert groups' geometry `geo`
    (`_expert_geometry`), arrays of `n`."""
    if geo is None or not any(axis in ("ep", "etp") for axis, _, _ in comm):
        return np.zeros(n), np.zeros(n)
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
    return a2a, etp


@dataclass(frozen=True, kw_only=True)
class MemoryBound:
    """GiB per GPU that no plan of each family goes below: `states_gib[z]` (weights, gradients,
    optimizer state) at the z-th ZeRO stage given, plus `rest_gib[i, j]` (activations, buffers,
    overhead) at the i-th recomputation and j-th sequence-parallel setting; and the capacity the
    search compares a plan's memory with. A plan running a schedule that holds more micro-batches
    in flight than plain 1F1B adds `in_flight_gib[i, j]` for each (`schedule_in_flight`)."""

    states_gib: np.ndarray
    rest_gib: np.ndarray
    in_flight_gib: np.ndarray
    capacity_gib: float


def schedule_in_flight(num_layers: int, stages: np.ndarray, microbatches: np.ndarray,
                       schedules: list[tuple[int, int]]) -> np.ndarray:
    """(schedules, n): micro-batches' worth of the relaxed stage's activations that a plan running
    each (schedule code, virtual stages) holds on its first stage beyond what `memory_bound` counts
    (plain 1F1B's min(m, G_inter) on L / G_inter blocks): its own count (`memory.in_flight`) on
    its busiest stage's blocks (`traffic.busiest_blocks`, at least L / G_inter), which the model
    prices (`steptime.memory_many`). Never negative: GPipe holds m, interleaving G_inter + (G_inter -
    1) / v, both at least 1F1B's."""
    S = np.asarray(stages, dtype=np.int64)
    m = np.asarray(microbatches, dtype=np.float64)
    relaxed = num_layers / S.astype(np.float64)
    plain = memory_in_flight(S, 1, SCHEDULE_CODE["1f1b"], m, "first")
    out = np.zeros((len(schedules), len(S)))
    for k, (code, v) in enumerate(schedules):
        blocks = busiest_blocks(num_layers, S, max(int(v), 1))
        out[k] = np.maximum(blocks / relaxed * memory_in_flight(S, v, code, m, "first") - plain, 0.0)
    return out


def memory_bound(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                 zero_stages: list[int], recomputes: list[int], sequence_parallel: list[bool],
                 states_gib: np.ndarray | None = None) -> MemoryBound:
    """The memory bound of families given as one row each (grid and micro-batch size; the other
    option columns are ignored). `states_gib`: the rows' states where already known
    (`states_bound` of their grids: the states do not depend on the micro-batch size)."""
    cluster, training = apply_constants(cluster, training)

    def one(cp: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        model_v, training_v, part = context.view(model, training, _rows(arrays, idx), cp)
        known = None if states_gib is None else states_gib[:, idx]
        return _memory_one_cp(model_v, cluster, training_v, part, zero_stages, recomputes, sequence_parallel,
                              known)

    pieces = _by_context_degree(arrays, one)
    n = len(arrays)
    states = np.zeros((len(zero_stages), n))
    rest = np.zeros((len(recomputes), len(sequence_parallel), n))
    per_mb = np.zeros((len(recomputes), len(sequence_parallel), n))
    for idx, (s, r, f) in pieces:
        states[:, idx] = s
        rest[..., idx] = r
        per_mb[..., idx] = f
    return MemoryBound(states_gib=states, rest_gib=rest, in_flight_gib=per_mb,
                       capacity_gib=capacity_per_rank_gib(cluster))


def _memory_one_cp(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                   zero_stages: list[int], recomputes: list[int], sequence_parallel: list[bool],
                   states: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(states (Z, n), rest (R, P, n), each micro-batch in flight (R, P, n)) in GiB on the relaxed
    first stage. A mixture of experts' rows that differ only in their expert degrees hold the same
    units: those are evaluated once per run of such siblings, and the routed experts' share
    (`memory.expert_state_bytes`, `memory.expert_rest_bytes`) per row."""
    siblings = _expert_siblings(model, arrays, arrays)  # one set of rows
    if states is None:
        states = _states_one_cp(model, training, arrays, zero_stages, siblings)
    if siblings is None:
        return (states, *_rest_parts(model, cluster, training, arrays, recomputes, sequence_parallel))
    first, run = siblings
    rest, per_mb = (x[..., run] for x in _rest_parts(model, cluster, training, arrays.take(first), recomputes,
                                                     sequence_parallel, experts=False))
    combos, stage, m, shape = _settings(model, training, arrays, recomputes, sequence_parallel)
    acts, comm, overhead, each = expert_rest_bytes(model, cluster, training, combos, stage, m, "first")
    rest += ((acts + comm + overhead) / GIB).reshape(shape)
    per_mb += (each / GIB).reshape(shape)
    return states, rest, per_mb


@dataclass(frozen=True, kw_only=True)
class StatesBound:
    """`MemoryBound.states_gib` alone (weights, gradients and optimizer state per ZeRO stage), with
    the capacity: more than the capacity rules a grid out whatever its activations."""

    states_gib: np.ndarray
    capacity_gib: float


def states_bound(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                 zero_stages: list[int]) -> StatesBound:
    """`memory_bound`'s states alone, (Z, n) GiB, the same values: what a search checks for every grid
    of a mixture of experts before it bounds their time (`tuner.families.grid_table`). A grid's
    states do not depend on its micro-batch size, recomputation or schedule, and the units' share is
    evaluated once per run of sibling grids, the routed experts' once per expert layout
    (`_expert_states_gib`), so this costs far less than the whole memory bound."""
    cluster, training = apply_constants(cluster, training)

    def one(cp: int, idx: np.ndarray) -> np.ndarray:
        model_v, training_v, part = context.view(model, training, _rows(arrays, idx), cp)
        return _states_one_cp(model_v, training_v, part, zero_stages, _expert_siblings(model_v, part, part))

    states = np.zeros((len(zero_stages), len(arrays)))
    for idx, s in _by_context_degree(arrays, one):
        states[:, idx] = s
    return StatesBound(states_gib=states, capacity_gib=capacity_per_rank_gib(cluster))


def _states_one_cp(model: Model, training: Training, arrays: PlanArrays, zero_stages: list[int],
                   siblings: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """(Z, n) states in GiB on the relaxed first stage (`_memory_one_cp`'s), the units once per run of
    `siblings` (`_expert_siblings`) where given."""
    if siblings is None:
        return _states_parts(model, training, arrays, zero_stages)
    first, run = siblings
    states = _states_parts(model, training, arrays.take(first), zero_stages, experts=False)[:, run]
    stage, base = _relaxed_first(model, arrays)
    plain = with_options(arrays, **base)
    return states + _expert_states_gib(model, training, plain, stage.blocks, zero_stages)


_EXPERT_STATE_COLUMNS = ("G_inter", "G_ep", "expert_tp", "edp")
"""What the routed experts' states of a row depend on (`memory.expert_shards`, `model_state_bytes`):
its stage's blocks, the experts and shards it holds, the expert-data degree ZeRO shards them over."""


def _expert_states_gib(model: Model, training: Training, arrays: PlanArrays, blocks: np.ndarray,
                       zero_stages: list[int]) -> np.ndarray:
    """(Z, n) GiB of the routed experts' weights, gradients and optimizer state per row at each ZeRO
    stage (`memory.expert_state_bytes`), worked out once per distinct `_EXPERT_STATE_COLUMNS` where
    that at least halves the rows (a grid table's tens of thousands of rows hold a few hundred)."""
    n = len(arrays)
    if n >= experts.DISTINCT_FROM:
        degrees = experts.expert_degrees(arrays)
        columns = {"G_inter": arrays.G_inter, "G_ep": degrees["ep"], "expert_tp": degrees["etp"],
                   "edp": degrees["edp"]}
        some, which = distinct_rows([columns[name] for name in _EXPERT_STATE_COLUMNS])
        if len(some) * 2 <= n:
            blocks = np.broadcast_to(np.asarray(blocks, dtype=np.float64), (n,))
            return _expert_states_gib(model, training, arrays.take(some), blocks[some], zero_stages)[:, which]
    local, folded = expert_shards(model, arrays, blocks)  # the same for every ZeRO stage
    by_zero = _stacked([folded.with_columns(zero_stage=z) for z in zero_stages])
    held = model_state_bytes(training, np.tile(local, len(zero_stages)), by_zero)
    return ((held.params + held.grads + held.optimizer) / GIB).reshape(len(zero_stages), n)


def _relaxed_first(model: Model, arrays: PlanArrays) -> tuple[StageShape, dict[str, int | bool]]:
    """The relaxed first stage the memory bound takes (L / G_inter blocks, the embedding; the head
    too without a pipeline), and the options it is evaluated at before each is varied."""
    n = len(arrays)
    S = arrays.G_inter
    first = StageShape(blocks=model.num_layers / S.astype(np.float64), has_embedding=np.ones(n, bool),
                       has_head=S == 1, is_first=np.ones(n, bool), is_last=S == 1)
    base = dict(schedule=SCHEDULE_CODE["1f1b"], virtual_stages=1, recompute=RECOMPUTE_CODE["none"],
                zero_stage=0, sequence_parallel=False)
    return first, base


def _states_parts(model: Model, training: Training, arrays: PlanArrays, zero_stages: list[int],
                  experts: bool = True) -> np.ndarray:
    """`_memory_one_cp`'s states row by row (the routed experts left out unless `experts`): every
    ZeRO stage in one stacked evaluation (a call costs a fixed overhead that grows with the model)."""
    n = len(arrays)
    first, base = _relaxed_first(model, arrays)
    Z = len(zero_stages)
    plain = with_options(arrays, **base)
    by_zero = _stacked([plain.with_columns(zero_stage=z) for z in zero_stages])
    # the units' memory does not read the ZeRO stage: worked out once, its arrays repeated per stage
    parts = [replace(p, **{f: np.tile(v, Z) for f, v in vars(p).items() if np.ndim(v)})
             for p in unit_parts(model, training, plain, first)]
    held = state_bytes(model, training, by_zero, _tiled(first, Z), parts, experts=experts)
    return ((held.params + held.grads + held.optimizer) / GIB).reshape(Z, n)


def _rest_parts(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays, recomputes: list[int],
                sequence_parallel: list[bool], experts: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """`_memory_one_cp`'s rest and each micro-batch in flight row by row (the routed experts left out
    unless `experts`)."""
    combos, stage, m, shape = _settings(model, training, arrays, recomputes, sequence_parallel)
    acts, comm, overhead, each = rest_bytes(model, cluster, training, combos, stage, m, "first",
                                            unit_parts(model, training, combos, stage), experts=experts)
    return ((acts + comm + overhead) / GIB).reshape(shape), (each / GIB).reshape(shape)


def _settings(model: Model, training: Training, arrays: PlanArrays, recomputes: list[int],
              sequence_parallel: list[bool]
              ) -> tuple[PlanArrays, StageShape, np.ndarray, tuple[int, int, int]]:
    """`arrays` on the relaxed first stage (`_relaxed_first`) at every (recomputation,
    sequence-parallel) setting, stacked for one evaluation (a call costs a fixed overhead that grows
    with the model): the rows, their stage and micro-batch counts, and the (R, P, n) shape the
    results fold back into."""
    first, base = _relaxed_first(model, arrays)
    plain = with_options(arrays, **base)
    combos = _stacked([plain.with_columns(recompute=rc, sequence_parallel=sp)
                       for rc in recomputes for sp in sequence_parallel])
    k = len(recomputes) * len(sequence_parallel)
    m = arrays.num_microbatches(training).astype(np.float64)
    return combos, _tiled(first, k), np.tile(m, k), (len(recomputes), len(sequence_parallel), len(arrays))
