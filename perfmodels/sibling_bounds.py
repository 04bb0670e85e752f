"""A mixture of experts' grid table bounded by parent and by expert layout, not grid by grid.

A mixture of experts' search has tens of thousands of grids, each a *parent* (the six degrees, of
which there are a couple of thousand) with one expert choice (G_ep, G_etp). Each term of a grid's
coarsest time bound (`bounds.grid_bound_s`) and of its states (`bounds.states_bound`) reads either
the parent alone (the units' compute and memory, micro-batch counts, bubble, the MoE layers' wait
for the host), or the expert layout alone (the routed experts' forward; their weights, gradients
and optimizer state), or both (the all-to-alls' floor, the host's ops per local expert). The first
two are evaluated once per parent and once per distinct layout and gathered per grid; only the
last is evaluated grid by grid. The formulas and their order of operations are those of
`bounds.grid_bound_s` and `bounds.states_bound`, so the values are theirs to the bit
(tests/tuner/test_bounded_search.py); this only skips the plan arrays over every grid that the
general path builds, several times over (`tuner.families.grid_table` calls it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfmodels import context, experts
from perfmodels.bounds import (
    StatesBound,
    _corrections,
    _expert_states_gib,
    _relaxed_first,
    _relaxed_stage,
    _stacked,
    _states_parts,
    all_to_all_floor_from,
    all_to_all_floor_terms,
    with_options,
)
from perfmodels.compute import gemm_curve, hbm_rate, stage_computes
from perfmodels.constants import apply_constants
from perfmodels.memory import capacity_per_rank_gib
from perfmodels.plans import RECOMPUTE_CODE, PlanArrays, context_degrees, distinct_rows, equal_runs
from perfmodels.specs import Cluster, Model, Training
from perfmodels.steptime import _host_seconds_per_microbatch
from perfmodels.traffic import StageShape


@dataclass(frozen=True, kw_only=True)
class Siblings:
    """Grids as (parent, expert choice): arrays over parents, and over grids (`parent`, `G_ep`,
    `G_etp`). A parent's row holds the expert columns of its first grid: the general path evaluates
    each run of siblings at its first row, and the units' share is taken from there."""

    low: PlanArrays
    """(parents,) each parent at its smallest micro-batch size and its largest ZeRO stage."""
    high: PlanArrays
    """(parents,) the same at its largest micro-batch size."""
    max_virtual: np.ndarray
    """(parents,) the most virtual stages its schedules run."""
    parent: np.ndarray
    """(grids,) each grid's parent, ascending (each parent's grids in a row)."""
    G_ep: np.ndarray
    G_etp: np.ndarray
    layout: np.ndarray
    """(grids,) each grid's expert layout: its parent's stages, tensor- and context-parallel degrees
    and micro-batch sizes with its expert degrees, what the routed experts' terms read in a context
    view (`layout_low`)."""
    layout_low: PlanArrays
    """(layouts,) a grid of each layout at its parent's smallest micro-batch size (as `low`)."""
    layout_high: PlanArrays
    """(layouts,) the same at its parent's largest micro-batch size (as `high`)."""

    def __len__(self) -> int:
        return len(self.parent)

    def take(self, index: np.ndarray) -> Siblings:
        """The grids `index` (ascending), with only their parents, each at its first grid's expert
        columns (as the general path's runs of siblings)."""
        parent = self.parent[index]
        first, run = equal_runs([parent])
        kept = parent[first]
        experts_at = {"G_ep": self.G_ep[index][first], "G_etp": self.G_etp[index][first]}
        return Siblings(low=self.low.take(kept).with_columns(**experts_at),
                        high=self.high.take(kept).with_columns(**experts_at),
                        max_virtual=self.max_virtual[kept], parent=run, G_ep=self.G_ep[index],
                        G_etp=self.G_etp[index], layout=self.layout[index], layout_low=self.layout_low,
                        layout_high=self.layout_high)

    def grids(self, parents: PlanArrays) -> PlanArrays:
        """`parents` (a row per parent) at every grid: the parent's columns with the grid's own
        expert degrees."""
        return parents.take(self.parent).with_columns(G_ep=self.G_ep, G_etp=self.G_etp)

    def by_context_degree(self, model: Model, training: Training,
                          one: Callable[[Model, Training, Siblings], np.ndarray]) -> np.ndarray:
        """`one(model, training, siblings)` (an array over the grids, last axis) on the grids of each
        context-parallel degree in its view (`perfmodels.context.view`), put together."""
        cps = context_degrees(self.low)
        if len(cps) <= 1:  # one degree, or no grid
            return one(*_viewed(model, training, self, int(cps[0]) if len(cps) else 1))
        out = None
        for cp in cps:
            index = np.flatnonzero(self.low.G_cp[self.parent] == cp)
            part = one(*_viewed(model, training, self.take(index), int(cp)))
            if out is None:
                out = np.zeros((*part.shape[:-1], len(self)))
            out[..., index] = part
        return out  # type: ignore[return-value]


def _viewed(model: Model, training: Training, sib: Siblings, cp: int) -> tuple[Model, Training, Siblings]:
    if cp == 1:
        return model, training, sib
    model_v, training_v, low = context.view(model, training, sib.low, cp)
    high = context.view(model, training, sib.high, cp)[2]
    return model_v, training_v, Siblings(
        low=low, high=high, max_virtual=sib.max_virtual, parent=sib.parent, G_ep=sib.G_ep, G_etp=sib.G_etp,
        layout=sib.layout, layout_low=context.view(model, training, sib.layout_low, cp)[2],
        layout_high=context.view(model, training, sib.layout_high, cp)[2])


def siblings(low: PlanArrays, high: PlanArrays, max_virtual: np.ndarray, parent: np.ndarray,
             G_ep: np.ndarray, G_etp: np.ndarray) -> Siblings:
    """`Siblings` of the parents' rows and the grids' parents and expert degrees, with their expert
    layouts numbered (once for the states and the time bound: each reads a part of the layout)."""
    number = distinct_rows([low.G_inter, low.G_intra_r, low.G_cp, low.micro_batch_size,
                            high.micro_batch_size])[1]
    expert = G_ep * (int(G_etp.max(initial=0)) + 1) + G_etp  # a number per pair, not consecutive
    some, layout = distinct_rows([number[parent], expert])
    experts_at = {"G_ep": G_ep[some], "G_etp": G_etp[some]}
    return Siblings(low=low, high=high, max_virtual=max_virtual, parent=parent, G_ep=G_ep, G_etp=G_etp,
                    layout=layout, layout_low=low.take(parent[some]).with_columns(**experts_at),
                    layout_high=high.take(parent[some]).with_columns(**experts_at))


def sibling_states_bound(model: Model, cluster: Cluster, training: Training, sib: Siblings,
                         zero_stages: list[int]) -> StatesBound:
    """`bounds.states_bound` of each grid ((Z, grids) GiB, at its smallest micro-batch size): the
    units' states once per parent, the routed experts' once per expert layout (`Siblings.layout`;
    `bounds._expert_states_gib` reads the stage's blocks and the expert degrees)."""
    cluster, training = apply_constants(cluster, training)

    def one(model_v: Model, training_v: Training, part: Siblings) -> np.ndarray:
        units = _states_parts(model_v, training_v, part.low, zero_stages, experts=False)
        stage, base = _relaxed_first(model_v, part.layout_low)
        reps = with_options(part.layout_low, **base)
        routed = _expert_states_gib(model_v, training_v, reps, np.asarray(stage.blocks), zero_stages)
        return np.take(units, part.parent, axis=1) + np.take(routed, part.layout, axis=1)

    return StatesBound(states_gib=sib.by_context_degree(model, training, one),
                       capacity_gib=capacity_per_rank_gib(cluster))


def sibling_grid_bound_s(model: Model, cluster: Cluster, training: Training, sib: Siblings,
                         sequence_parallel: list[bool]) -> np.ndarray:
    """(grids,) `bounds.grid_bound_s` of each grid between its parent's smallest and largest
    micro-batch size (any option: no recomputation, the least over `sequence_parallel`)."""
    cluster, training = apply_constants(cluster, training)
    return sib.by_context_degree(model, training, lambda model_v, training_v, part: _grid_bound_one_cp(
        model_v, cluster, training_v, part, sequence_parallel))


def _grid_bound_one_cp(model: Model, cluster: Cluster, training: Training, sib: Siblings,
                       sequence_parallel: list[bool]) -> np.ndarray:
    """`bounds._grid_bound_one_cp` at no recomputation, for micro-batch sizes from the parents' `low`
    to their `high` (see there): each micro-batch's compute at least the relaxed stage's at the
    largest size, the bubble's at least the blocks alone at the smallest, and a floor from the
    all-to-alls and the host."""
    low, high, parent = sib.low, sib.high, sib.parent
    n_par, k = len(low), len(sequence_parallel)
    S = low.G_inter.astype(np.float64)
    blocks_only = StageShape(blocks=model.num_layers / S, has_embedding=np.zeros(n_par, bool),
                             has_head=np.zeros(n_par, bool), is_first=S == 1, is_last=np.ones(n_par, bool))
    relaxed = _relaxed_stage(model, low)
    m_fewest = high.num_microbatches(training).astype(np.float64)[parent]
    c_compute = _corrections(cluster)("compute")
    fill = ((S - 1.0) / np.maximum(sib.max_virtual, 1).astype(np.float64))[parent]
    none = RECOMPUTE_CODE["none"]

    # the units: the blocks alone at the smallest size, the relaxed stage at the largest, at every
    # sequence-parallel setting, in one evaluation (a call costs a fixed overhead that grows with
    # the model); the routed experts of the parent's first grid taken out, each grid's own put in
    reps = _stacked([with_options(rows, recompute=none, sequence_parallel=sp)
                     for rows in (low, high) for sp in sequence_parallel])
    shape = _joined([blocks_only] * k + [relaxed] * k)
    comp = stage_computes(model, cluster, training, reps, [shape])[0]
    forward = _stacked([with_options(rows, sequence_parallel=sp)
                        for rows in (sib.layout_low, sib.layout_high) for sp in sequence_parallel])
    gemm, mem = experts.layer_compute(model, training, forward, gemm_curve(cluster, training),
                                      hbm_rate(cluster))
    routed_fwd = (gemm + mem).reshape(2 * k, len(sib.layout_low))
    layers = (np.asarray(blocks_only.blocks, dtype=np.float64) * model.moe_fraction)[parent]

    def compute_s(e: int) -> np.ndarray:
        at = slice(e * n_par, (e + 1) * n_par)
        routed = np.asarray(comp.experts_fwd_s)[at]
        units = comp.fwd_s[at] + comp.bwd_s[at] - 3.0 * routed
        return (units[parent] + layers * 3.0 * routed_fwd[e][sib.layout]) * c_compute

    # the host's floor reads the local experts: grid by grid
    grids = with_options(sib.grids(low), recompute=none)
    host = _host_seconds_per_microbatch(model, cluster, training, grids,
                                        relaxed.per_plan(lambda x: x[parent]))
    sync = experts.sync_wait_s(model, cluster, training, with_options(low, recompute=none),
                               relaxed.blocks)[parent]
    out = np.full(len(sib), np.inf)
    for j, a2a in enumerate(_all_to_all_floors(model, cluster, training, sib, sequence_parallel)):
        c_low, c_high = compute_s(j), compute_s(k + j)
        out = np.minimum(out, np.maximum(m_fewest * (c_high + sync) + a2a, m_fewest * host) + fill * c_low)
    return out


def _all_to_all_floors(model: Model, cluster: Cluster, training: Training, sib: Siblings,
                       sequence_parallel: list[bool]) -> list[np.ndarray]:
    """`bounds._all_to_all_floor_s` of each grid at its parent's largest micro-batch size, for each
    sequence-parallel setting: the terms that read G_ep once per degree, the parent's once per parent
    (its tokens per rank split over the row ranks or not, `experts.sequence_split`: under sequence
    parallelism, or where the expert tensor-parallel group is not the row group)."""
    n, high, parent = len(sib), sib.high, sib.parent
    if training.moe_token_dispatcher == "flex" or not n:
        return [np.zeros(n) for _ in sequence_parallel]
    degrees = np.flatnonzero(np.bincount(sib.G_ep))
    share, latency = all_to_all_floor_terms(cluster, degrees)
    number = np.zeros(int(degrees[-1]) + 1, dtype=np.int64)
    number[degrees] = np.arange(len(degrees))
    at = number[sib.G_ep]
    split = experts.tokens_per_rank(model, with_options(high, sequence_parallel=True))[parent]
    whole = experts.tokens_per_rank(model, with_options(high, sequence_parallel=False, G_etp=0))[parent]
    folded = (sib.G_etp > 0) & (sib.G_etp != high.G_intra_r[parent])
    args = (high.G_inter[parent], high.num_microbatches(training)[parent])
    return [all_to_all_floor_from(model, cluster, training, sib.G_ep, share[at], latency[at], *args,
                                  split if sp else np.where(folded, split, whole), sib.max_virtual[parent])
            for sp in sequence_parallel]


def _joined(shapes: list[StageShape]) -> StageShape:
    """The stage shapes of several sets of plans stacked one after the other (`bounds._stacked`)."""
    def cat(name: str) -> np.ndarray:
        return np.concatenate([np.broadcast_to(np.asarray(getattr(st, name)), (len(st.is_last),))
                               for st in shapes])

    return StageShape(blocks=cat("blocks"), has_embedding=cat("has_embedding"), has_head=cat("has_head"),
                      is_first=cat("is_first"), is_last=cat("is_last"))
