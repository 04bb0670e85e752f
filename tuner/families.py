"""Families of plans and their lower bounds: what lets the search skip most of the space unscored.

A family is one grid (its six degrees and expert degrees, a row of the search's grid table), one
micro-batch size and one placement; its plans are every schedule, recomputation, ZeRO stage and
sequence-parallel setting `tuner.space.combine` would expand it into. `perfmodels.bounds` gives,
per recomputation and sequence-parallel setting, a time no plan of the family can beat and, per
ZeRO stage as well, a memory no plan goes below. The search scores families cheapest bound first,
expands only the (recompute, ZeRO, sequence-parallel) parts that can still fit and win, and stops
where the next family's bound passes its k-th best time.

The bound's placement-free parts (compute, host, bubble, optimizer, collective byte sums, memory)
are built once per (grid, micro-batch size); each placement then only prices the tensor-parallel
collectives on its links.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfmodels.bounds import (
    BoundParts,
    PricedComm,
    StatesBound,
    blocks_bound_s,
    bound_parts,
    grid_bound_s,
    lower_bound_s,
    memory_bound,
    price_comm,
    schedule_in_flight,
)
from perfmodels.plans import SCHEDULE_CODE, PlanArrays, equal_runs, from_columns
from perfmodels.sibling_bounds import Siblings, sibling_grid_bound_s, sibling_states_bound, siblings
from perfmodels.specs import Cluster, Model, Training
from tuner.constraints import stack_runs_masks, stack_runs_options
from tuner.space import (
    EXPERT_COLUMNS,
    GRID_COLUMNS,
    first_placement_masks,
    micro_batch_values,
    option_lists,
    plans_per_grid,
    schedule_mask,
)
from tuner.types import SearchOptions

BOUND_SLACK = 1e-7
"""Relative margin a bound must clear its limit by: bound and prediction add the same terms in
different orders (rounding)."""


@dataclass(frozen=True, kw_only=True)
class Families:
    """The families of a search that can hold a plan that fits (arrays over families, last axis),
    ordered placement by placement."""

    order_index: np.ndarray
    """Index of the family's placement in the search's list of placements."""
    grid: np.ndarray
    """Row of the search's grid table."""
    micro_batch: np.ndarray
    pair: np.ndarray
    """Index of the family's (grid, micro-batch size) in `fits`."""
    plans: np.ndarray
    """How many plans the family expands into."""
    bound_s: np.ndarray
    """Seconds per step no plan of the family that fits can beat."""
    parts: BoundParts | None
    """The placement-free parts of the bounds (`perfmodels.bounds.bound_parts`), of which family f
    has row `part_row[f]`: `schedule_bounds` prices them per schedule when a family is expanded."""
    recomputes: np.ndarray
    """The recomputation options (indices into the search's) that `parts` holds, those some family
    may run (fits and the stack runs it): the others have no bound (infinite), so plans that fit but
    that the stack's rules would reject are counted as proved out, not scored."""
    part_row: np.ndarray
    """Row of `parts` (and of the pair in `fits`' last axis order) each family has."""
    priced: PricedComm | None
    """The families' collectives priced under their placements (`perfmodels.bounds.price_comm`)."""
    spare_gib: np.ndarray
    """(Z, R, P, pairs): the room the memory bound leaves under plain 1F1B for that (ZeRO, recompute,
    sequence-parallel) choice, negative where it does not fit (-inf where the grid has no such
    plan: ZeRO > 0 without data parallelism)."""
    in_flight_gib: np.ndarray
    """(R, P, pairs): what each further micro-batch in flight adds to the bound
    (`perfmodels.bounds.MemoryBound`)."""
    out_of_memory: int
    """Plans of the families left out because none of their options fits in memory."""
    schedules: np.ndarray
    """(F, schedule options): the schedules each family runs that the rules allow."""
    options: tuple[list[tuple[int, int]], list[int], list[int], list[bool]]

    @property
    def fits(self) -> np.ndarray:
        """(Z, R, P, pairs): whether the memory bound leaves room for that choice under plain 1F1B."""
        return self.spare_gib >= 0.0


@dataclass(frozen=True, kw_only=True)
class Pairs:
    """Every (grid, micro-batch size) of a search, with the coarse bound that holds for all its
    families (`perfmodels.bounds.blocks_bound_s`), arrays over pairs."""

    grid: np.ndarray
    micro_batch: np.ndarray
    plans: np.ndarray
    """Plans of the pair under one placement."""
    placements: np.ndarray
    """How many of the search's placements place the pair's grid (each is a family)."""
    bound_s: np.ndarray
    max_virtual: np.ndarray
    max_zero: np.ndarray
    schedules: np.ndarray
    """(pairs, schedule options): the schedules each pair runs that the rules allow."""
    placed: np.ndarray
    """(placements, parents): which placements expand which grids' parents (`GridTable`)."""
    parent: np.ndarray
    """(grids,) each grid's parent."""
    options: tuple[list[tuple[int, int]], list[int], list[int], list[bool]]
    spare_gib: np.ndarray
    """(Z, R, P, pairs): as `Families.spare_gib`."""
    in_flight_gib: np.ndarray
    """(R, P, pairs): as `Families.in_flight_gib`."""
    out_of_memory: int
    """Plans of the pairs left out because none of their options fits in memory."""

    @property
    def fits(self) -> np.ndarray:
        """(Z, R, P, pairs): whether the memory bound leaves room for that choice under plain 1F1B."""
        return self.spare_gib >= 0.0


def merged_pairs(taken: list[tuple[Pairs, np.ndarray]]) -> tuple[Pairs, np.ndarray]:
    """The pairs `rows` of several batches (`(batch, rows)`, as a search's pool hands them out) as
    one batch and its rows, so their families are built in one pass (each costs a fixed overhead)."""
    if len(taken) == 1:
        return taken[0]
    first = taken[0][0]

    def cat(name: str, axis: int = 0) -> np.ndarray:
        return np.concatenate([np.take(getattr(p, name), rows, axis=axis) for p, rows in taken], axis=axis)

    merged = Pairs(grid=cat("grid"), micro_batch=cat("micro_batch"), plans=cat("plans"),
                   placements=cat("placements"), bound_s=cat("bound_s"), max_virtual=cat("max_virtual"),
                   max_zero=cat("max_zero"), schedules=cat("schedules"), placed=first.placed,
                   parent=first.parent, options=first.options, spare_gib=cat("spare_gib", axis=-1),
                   in_flight_gib=cat("in_flight_gib", axis=-1), out_of_memory=0)
    return merged, np.arange(len(merged.grid))


Screen = Callable[[dict[str, np.ndarray], np.ndarray, str], np.ndarray]
"""`screen(columns, weights, level)`: the mask of rows, given as columns, that the schedule-level rules
allow, each row standing for `weights` plans (for the counts); `level` "grid": (grid, schedule) rows
and the rules that do not read the micro-batch size, "pair": (grid, micro-batch size, schedule) rows
and the rules that do (`constraints.READS_MICRO_BATCH`)."""


@dataclass(frozen=True, kw_only=True)
class GridTable:
    """Every grid of the search with the coarsest bound (`perfmodels.bounds.grid_bound_s`: any
    micro-batch size, placement and option), its (grid, micro-batch size) pairs and plan counts.

    What depends on the six degrees alone (plan counts, schedules, placements, micro-batch sizes) is
    held once per *parent*: the grids of a mixture of experts that differ only in their expert
    degrees share one (a dense model's grids are their own parents)."""

    bound_s: np.ndarray
    """(grids,) seconds no plan of the grid can beat (inf: the grid expands into no plan the stack
    runs that may fit in memory)."""
    parent: np.ndarray
    """(grids,) each grid's parent (index into the per-parent arrays below)."""
    counts: np.ndarray
    """(parents,) plans of one micro-batch size under one placement."""
    runs: np.ndarray
    """(parents, schedule options): the schedules each parent's pipeline runs."""
    placed: np.ndarray
    """(placements, parents): which placements expand which parents' grids."""
    pair_micro_batch: np.ndarray
    pair_start: np.ndarray
    """(parents + 1,): the micro-batch sizes of parent P's grids are
    pair_micro_batch[pair_start[P]:pair_start[P + 1]]."""
    total_plans: int
    out_of_memory: int = 0
    """Plans of the grids whose weights, gradients and optimizer state alone exceed the memory at
    every ZeRO stage they have (`_states_floor`)."""
    states_gib: np.ndarray | None = None
    """(ZeRO stages, grids) those states where the table worked them out (a mixture of experts' grids
    the search may expand), which the pairs' memory bound reuses (they hold for every micro-batch
    size)."""
    options: tuple[list[tuple[int, int]], list[int], list[int], list[bool]]


def grid_parents(model: Model, grids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first grid of each run of grids equal in the six degree columns, each grid's run). A mixture
    of experts' grids come as each degree grid's expert choices in a row (`tuner.space.expert_rows`);
    a dense model's grids are their own runs."""
    n = len(grids)
    if not model.is_moe:
        return np.arange(n), np.arange(n)
    return equal_runs([grids[:, j] for j in range(len(GRID_COLUMNS))])


def grid_table(model: Model, cluster: Cluster, training: Training, grids: np.ndarray, options: SearchOptions,
               orders: list[tuple[str, ...]]) -> GridTable:
    """The grids of the search over `grids` (degree and expert columns) and `orders`, bounded. A
    placement other than the first expands only the grids it is the first to place differently
    (`tuner.space.first_placement_mask`), as the exhaustive expansion does."""
    lists = option_lists(training, options)
    sched_opts, rc_opts, zero_opts, sp_opts = lists
    uneven = model.is_moe
    mbs = np.asarray(micro_batch_values(options), dtype=np.int64)
    first, parent = grid_parents(model, grids)
    pg = grids[first]
    per_replica = training.global_batch_size // (pg[:, 0] * pg[:, 2])
    counts = plans_per_grid(pg, sched_opts, rc_opts, zero_opts, sp_opts, model.depth, uneven)
    # which micro-batch sizes divide each parent's samples per replica, worked out once per distinct
    # count: divisors[u, :ndiv[u]] are the indices into `mbs` for the u-th distinct count
    values, which = np.unique(per_replica, return_inverse=True)
    divides = values[:, None] % mbs[None, :] == 0
    ndiv = divides.sum(axis=1)
    divisors = np.argsort(~divides, axis=1, kind="stable")[:, : max(int(ndiv.max(initial=0)), 1)]
    listed = np.arange(divisors.shape[1])[None, :] < ndiv[which][:, None]
    pi, col = np.nonzero(listed & (counts[:, None] > 0))
    mb = mbs[divisors[which[pi], col]]
    placed = first_placement_masks(pg, orders)
    sizes = np.bincount(pi, minlength=len(pg))
    start = np.concatenate([[0], np.cumsum(sizes)])
    runs = schedule_mask(pg[:, 1], sched_opts, model.depth, uneven)
    bound = np.full(len(grids), np.inf)
    has = np.flatnonzero(sizes[parent] > 0)
    plans = counts * sizes * placed.sum(axis=0)  # (parents,) each grid's plans
    out_of_memory = 0
    states_gib = None
    if len(has) and model.is_moe:
        bound, states_gib, out_of_memory = _expert_grid_bounds(
            model, cluster, training, grids, first, parent, has, plans, (mb, start, runs), lists)
    elif len(has):
        smallest, largest, v_max = _extremes(grids, has, parent, mb, start, runs, lists)
        bound[has] = grid_bound_s(model, cluster, training, smallest, largest, v_max,
                                  [bool(x) for x in sp_opts])
    children = np.bincount(parent, minlength=len(pg))
    return GridTable(bound_s=bound, parent=parent, counts=counts, runs=runs, placed=placed,
                     pair_micro_batch=mb, pair_start=start, total_plans=int((children * plans).sum()),
                     out_of_memory=out_of_memory, states_gib=states_gib, options=lists)


def _expert_grid_bounds(model: Model, cluster: Cluster, training: Training, grids: np.ndarray,
                        first: np.ndarray, parent: np.ndarray, has: np.ndarray, plans: np.ndarray,
                        per_parent: tuple[np.ndarray, np.ndarray, np.ndarray],
                        options: tuple[list[tuple[int, int]], list[int], list[int], list[bool]]
                        ) -> tuple[np.ndarray, np.ndarray, int]:
    """A mixture of experts' grid bounds (`GridTable.bound_s`), the states the pairs reuse
    (`GridTable.states_gib`) and the plans of the grids that cannot fit: `grids[has]` (those with a
    micro-batch size) as their parents and expert degrees (`perfmodels.sibling_bounds`), the states
    floor first (`_states_floor`), then the bound of the grids that may fit. `per_parent`: the
    table's (pair_micro_batch, pair_start, runs)."""
    zero_opts, sp_opts = options[2], options[3]
    pair_micro_batch, pair_start, runs = per_parent
    sizes = np.diff(pair_start)
    with_pairs = np.flatnonzero(sizes > 0)
    low, high, v_max = _extremes(grids, first[with_pairs], parent, pair_micro_batch, pair_start, runs,
                                 options)
    own = np.cumsum(sizes > 0) - 1  # each parent's row among `with_pairs`
    every = len(has) == len(grids)
    sib = siblings(low, high, v_max, own[parent[has]], grids[has, len(GRID_COLUMNS)],
                   grids[has, len(GRID_COLUMNS) + 1])
    states = sibling_states_bound(model, cluster, training, sib, zero_opts)
    fits, runnable = _states_floor(training, states, sib, options)
    out_of_memory = int(plans[parent[has[~fits]]].sum())
    keep = np.flatnonzero(runnable)
    bound = np.full(len(grids), np.inf)
    if every:
        held = np.where(runnable, states.states_gib, np.nan)
    else:
        held = np.full((len(zero_opts), len(grids)), np.nan)
        held[:, has[keep]] = states.states_gib[:, keep]
    bound[has[keep]] = sibling_grid_bound_s(model, cluster, training, sib.take(keep),
                                            [bool(x) for x in sp_opts])
    return bound, held, out_of_memory


def _states_floor(training: Training, states: StatesBound, sib: Siblings,
                  options: tuple[list[tuple[int, int]], list[int], list[int], list[bool]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(whether each grid's weights, gradients and optimizer state (`states`, which every plan's memory
    holds whatever its activations: the pairs' memory bound adds those) may fit in memory at some
    ZeRO stage it has, and at some stage the stack runs). Most of a large mixture of experts'
    cheapest-bound grids hold too many experts per GPU for that: checked for all of them at once,
    they are never bounded or expanded."""
    _, rc_opts, zero_opts, sp_opts = options
    sharded = (sib.low.G_data > 1)[sib.parent]  # a ZeRO stage above 0 shards over G_data
    z_ok = stack_runs_masks(training, sib.low.G_inter, zero_opts, rc_opts, [bool(x) for x in sp_opts])[0]
    least = run = np.full(len(sib), np.inf)
    for i, z in enumerate(zero_opts):
        held = states.states_gib[i] if z == 0 else np.where(sharded, states.states_gib[i], np.inf)
        least = np.minimum(least, held)
        if z_ok[i].all():
            run = np.minimum(run, held)
        elif z_ok[i].any():
            run = np.minimum(run, np.where(z_ok[i][sib.parent], held, np.inf))
    room = states.capacity_gib * (1.0 + BOUND_SLACK)
    return least <= room, run <= room


def _extremes(grids: np.ndarray, gi: np.ndarray, parent: np.ndarray, pair_micro_batch: np.ndarray,
              pair_start: np.ndarray, runs: np.ndarray,
              options: tuple[list[tuple[int, int]], list[int], list[int], list[bool]]
              ) -> tuple[PlanArrays, PlanArrays, np.ndarray]:
    """The grids `gi` at their smallest and at their largest micro-batch size (their largest ZeRO
    stage), and the most virtual stages their schedules run: what a grid's bounds take
    (`GridTable`'s per-parent arrays)."""
    sched_opts, _, zero_opts, _ = options
    par = parent[gi]
    zero = np.where(grids[gi, 0] > 1, max(zero_opts), 0)
    smallest = _representatives(grids, gi, pair_micro_batch[pair_start[par]], zero)
    largest = smallest.with_columns(micro_batch_size=pair_micro_batch[pair_start[par + 1] - 1])
    return smallest, largest, _max_virtual(runs, np.asarray(sched_opts, dtype=np.int64))[par]


def pairs(model: Model, cluster: Cluster, training: Training, grids: np.ndarray, table: GridTable,
          subset: np.ndarray, screen: Screen | None = None) -> Pairs:
    """The (grid, micro-batch size) pairs of the grids `subset` that expand into at least one plan
    the rules of `screen` allow, with their coarse bounds."""
    sched_opts, rc_opts, zero_opts, sp_opts = table.options
    sched = np.asarray(sched_opts, dtype=np.int64)
    par = table.parent[subset]
    sizes = table.pair_start[par + 1] - table.pair_start[par]
    first = np.cumsum(np.concatenate([[0], sizes[:-1]]))  # where each grid's pairs start in `rows`
    rows = np.repeat(table.pair_start[par] - first, sizes) + np.arange(sizes.sum())
    # `local`: each pair's grid's index into `subset`; pairs in (parent, micro-batch size) order, so a
    # mixture of experts' siblings come in runs the bounds evaluate once (`perfmodels.bounds`)
    local = np.repeat(np.arange(len(subset)), sizes)
    order = np.lexsort((local, table.pair_micro_batch[rows], par[local]))
    local, rows = local[order], rows[order]
    gi, mb = subset[local], table.pair_micro_batch[rows]
    runs = table.runs[par]
    per_schedule = table.counts[par] // np.maximum(runs.sum(axis=1), 1)  # plans of one schedule, one mb
    n_placed_grid = table.placed[:, par].sum(axis=0)
    if screen is not None:
        # the rules that do not read the micro-batch size once per (grid, schedule), the others per pair
        f, si = np.nonzero(runs)
        cols = {name: grids[subset[f], j] for j, name in enumerate((*GRID_COLUMNS, *EXPERT_COLUMNS))}
        cols.update(schedule=sched[si, 0], virtual_stages=sched[si, 1])
        runs[f, si] = screen(cols, (per_schedule * n_placed_grid * sizes)[f], "grid")
    allowed = runs[local]  # (pairs, s)
    n_placed = n_placed_grid[local]
    if screen is not None:
        f, si = np.nonzero(allowed)
        cols = {name: grids[gi[f], j] for j, name in enumerate((*GRID_COLUMNS, *EXPERT_COLUMNS))}
        cols.update(micro_batch_size=mb[f], schedule=sched[si, 0], virtual_stages=sched[si, 1])
        allowed[f, si] = screen(cols, (per_schedule[local] * n_placed)[f], "pair")
    keep = allowed.any(axis=1)
    gi, mb, allowed, n_placed, local = gi[keep], mb[keep], allowed[keep], n_placed[keep], local[keep]
    plans = per_schedule[local] * allowed.sum(axis=1)
    # the memory bound first: a pair none of whose options fits is dropped (and counted), and the
    # recomputation memory forces on the others counts in their time bound
    z_max = np.where(grids[gi, 0] > 1, max(zero_opts), 0)
    reps = _representatives(grids, gi, mb, z_max)
    sps = [bool(x) for x in sp_opts]
    known = None if table.states_gib is None else table.states_gib[:, gi]
    mem = memory_bound(model, cluster, training, reps, zero_opts, rc_opts, sps, states_gib=known)
    has_zero = np.asarray([(z == 0) | (grids[gi, 0] > 1) for z in zero_opts])  # (Z, pairs)
    least = mem.states_gib[:, None, None, :] + mem.rest_gib[None, :, :, :]  # (Z, R, P, pairs)
    spare = np.where(has_zero[:, None, None, :], mem.capacity_gib * (1.0 + BOUND_SLACK) - least, -np.inf)
    fit = (spare >= 0.0).any(axis=(0, 1, 2))
    out_of_memory = int((plans * n_placed)[~fit].sum())
    gi, mb, allowed, n_placed, plans = gi[fit], mb[fit], allowed[fit], n_placed[fit], plans[fit]
    spare, z_max, reps = spare[..., fit], z_max[fit], reps.take(np.flatnonzero(fit))
    fits = spare >= 0.0
    # the most virtual stages a pair's schedules run, its largest ZeRO stage (smallest optimizer)
    v_max = _max_virtual(allowed, sched)
    # the least over the options that fit and that the stack runs (`families`)
    runnable = (fits & stack_runs_options(training, grids[gi, 1], zero_opts, rc_opts, sps)).any(axis=0)
    used = np.flatnonzero(runnable.any(axis=(1, 2)))  # the recomputations some pair may run
    bound = np.full(len(gi), np.inf)
    if len(used):
        per_option = blocks_bound_s(model, cluster, training, reps, v_max, [rc_opts[r] for r in used], sps)
        bound = np.min(np.where(runnable[used], per_option, np.inf), axis=(0, 1))
    return Pairs(grid=gi, micro_batch=mb, plans=plans, placements=n_placed, bound_s=bound, max_virtual=v_max,
                 max_zero=z_max, schedules=allowed, placed=table.placed, parent=table.parent,
                 options=table.options, spare_gib=spare, in_flight_gib=mem.in_flight_gib[..., fit],
                 out_of_memory=out_of_memory)


def _max_virtual(runs: np.ndarray, sched: np.ndarray) -> np.ndarray:
    """The most virtual stages any schedule a row runs (`runs`: rows x schedule options) has; 1
    without interleaving."""
    v = np.where(sched[:, 0] == SCHEDULE_CODE["interleaved-1f1b"], sched[:, 1], 1)
    return np.max(np.where(runs, v[None, :], 1), axis=1)


def _representatives(grids: np.ndarray, gi: np.ndarray, mb: np.ndarray, zero: np.ndarray) -> PlanArrays:
    """The grids `gi` at micro-batch size `mb` and ZeRO stage `zero`, the other options at their
    defaults."""
    columns = {name: grids[gi, j] for j, name in enumerate((*GRID_COLUMNS, *EXPERT_COLUMNS))}
    return from_columns(**columns, micro_batch_size=mb, zero_stage=zero)


def families(model: Model, cluster: Cluster, training: Training, grids: np.ndarray, pr: Pairs,
             subset: np.ndarray, orders: list[tuple[str, ...]]) -> Families:
    """The families of the pairs `subset` (indices into `pr`) under every placement that places
    their grid, with their plan counts and bounds; families with no option that fits are counted,
    not returned."""
    _, rc_opts, zero_opts, sp_opts = pr.options
    gi, mb = pr.grid[subset], pr.micro_batch[subset]
    reps = _representatives(grids, gi, mb, pr.max_zero[subset])
    sps = [bool(x) for x in sp_opts]
    fits = pr.fits[..., subset]  # (Z, R, P, pairs): the pairs' memory bound
    any_fit = fits.any(axis=(0, 1, 2))
    # the bound is taken over the options that fit and that the stack runs: the others are expanded
    # only where they also pass the bound, and their rules reject them there
    runnable = stack_runs_options(training, grids[gi, 1], zero_opts, rc_opts, sps)
    sub_fits = (fits & runnable).any(axis=0)  # (R, P, pairs)
    fitting = np.flatnonzero(any_fit)
    # bounds only for the recomputations some family may run (the others are never the least)
    need = np.flatnonzero(sub_fits[..., fitting].any(axis=(1, 2)))
    sub_fits = sub_fits[need]
    parts = (bound_parts(model, cluster, training, reps.take(fitting), pr.max_virtual[subset][fitting],
                         [rc_opts[r] for r in need], sps) if len(fitting) and len(need) else None)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("order_index", "pair", "bound_s")}
    out_of_memory = int((pr.plans[subset] * pr.placements[subset])[~any_fit].sum())
    part_row: list[np.ndarray] = []
    placed = pr.placed[:, pr.parent[gi[fitting]]]  # (placements, fitting)
    for p in range(len(orders)):
        local = np.flatnonzero(placed[p])  # index into `fitting`
        if parts is None or not len(local):
            continue
        out["order_index"].append(np.full(len(local), p))
        out["pair"].append(fitting[local])
        part_row.append(local)
    priced: PricedComm | None = None
    if out["pair"]:
        # every placement's families priced in one pass, each under its own placement
        rows, which = np.concatenate(part_row), np.concatenate(out["order_index"])
        mine = parts.take(rows)  # type: ignore[union-attr]
        priced = price_comm(model, cluster, training, mine, (orders, which))
        sub = lower_bound_s(model, cluster, training, mine, priced)  # (R, P, families): any schedule
        out["bound_s"].append(np.min(np.where(sub_fits[:, :, np.concatenate(out["pair"])], sub, np.inf),
                                     axis=(0, 1)))
    pair = np.concatenate(out["pair"]) if out["pair"] else np.zeros(0, dtype=np.int64)
    return Families(
        order_index=np.concatenate(out["order_index"]) if pair.size else np.zeros(0, dtype=np.int64),
        grid=gi[pair], micro_batch=mb[pair], pair=pair, plans=pr.plans[subset][pair],
        bound_s=np.concatenate(out["bound_s"]) if pair.size else np.zeros(0),
        parts=parts, recomputes=need,
        part_row=np.concatenate(part_row) if pair.size else np.zeros(0, dtype=np.int64),
        priced=priced,
        spare_gib=pr.spare_gib[..., subset], in_flight_gib=pr.in_flight_gib[..., subset],
        out_of_memory=out_of_memory, schedules=pr.schedules[subset][pair], options=pr.options)


def schedule_bounds(model: Model, cluster: Cluster, training: Training, fam: Families, rows: np.ndarray
                    ) -> np.ndarray:
    """(F, schedules, R, P) seconds no plan of families `rows` running that schedule, with that
    recomputation and sequence-parallel setting, can beat (`perfmodels.bounds.lower_bound_s` per
    schedule: its own bubble, pipeline sends and busiest stage). Worked out only for the families a
    search expands: the family's own bound, over any schedule, orders the search."""
    sched_opts, rc_opts, _, sp_opts = fam.options
    out = np.full((len(rows), len(sched_opts), len(rc_opts), len(sp_opts)), np.inf)
    if fam.parts is None or fam.priced is None:
        return out
    used = np.flatnonzero(fam.schedules[rows].any(axis=0))
    sub = lower_bound_s(model, cluster, training, fam.parts.take(fam.part_row[rows]), fam.priced.take(rows),
                        [sched_opts[k] for k in used])  # (s, R, P, F)
    out[np.ix_(np.arange(len(rows)), used, fam.recomputes)] = np.moveaxis(sub, -1, 0)
    return out


def schedule_fits(model: Model, fam: Families, rows: np.ndarray) -> np.ndarray:
    """(F, schedules, Z, R, P): whether the memory bound of families `rows` leaves room for each
    schedule with each (ZeRO, recompute, sequence-parallel) choice: a schedule that holds more
    micro-batches in flight than plain 1F1B, or on a busier stage, adds their activations
    (`perfmodels.bounds.schedule_in_flight`), so an interleaved plan that cannot fit is not scored."""
    parts = fam.parts
    assert parts is not None  # a family exists only where its bound parts do
    at = fam.part_row[rows]
    extra = schedule_in_flight(model.num_layers, parts.plans.G_inter[at], parts.microbatches[at],
                               fam.options[0]).T  # (F, s)
    pair = fam.pair[rows]
    spare = np.moveaxis(fam.spare_gib[..., pair], -1, 0)  # (F, Z, R, P)
    per_mb = np.moveaxis(fam.in_flight_gib[..., pair], -1, 0)  # (F, R, P)
    return spare[:, None] >= extra[:, :, None, None, None] * per_mb[:, None, None]


@dataclass(frozen=True, kw_only=True)
class Expanded:
    columns: dict[str, np.ndarray] | None
    order_index: np.ndarray | None = None
    """Each plan's placement (index into the search's placements)."""
    skipped_memory: int
    """Plans of the families left out because their (ZeRO, recompute, sequence-parallel) choice
    cannot fit."""
    skipped_time: int
    """Plans left out because their (recompute, sequence-parallel) choice's bound passes the limit."""


def expand(fam: Families, rows: np.ndarray, grids: np.ndarray, limit_s: float,
           bounds: np.ndarray, fits: np.ndarray) -> Expanded:
    """The plans of families `rows` that may fit and may beat `limit_s` (`bounds`: their
    `schedule_bounds`; `fits`: their `schedule_fits`), as columns in the order `tuner.space.combine`
    makes them (the schedules the rules allow only)."""
    sched_opts, rc_opts, zero_opts, sp_opts = fam.options
    g = grids[fam.grid[rows]]
    sched = np.asarray(sched_opts, dtype=np.int64)
    valid = fam.schedules[rows]  # (F, s)
    has_zero = np.asarray([(z == 0) | (g[:, 0] > 1) for z in zero_opts]).T  # (F, Z)
    fast = (bounds * (1.0 - BOUND_SLACK) <= limit_s) & valid[:, :, None, None]  # (F, s, R, P)
    skipped_memory = int((valid[:, :, None, None, None] & has_zero[:, None, :, None, None] & ~fits).sum())
    fits_rzp = np.transpose(fits, (0, 1, 3, 2, 4))  # (F, s, R, Z, P)
    skipped_time = int((valid[:, :, None, None, None] & fits_rzp & ~fast[:, :, :, None, :]).sum())
    # (family, schedule, recompute, ZeRO, sequence parallel), combine's order
    f, si, ri, zi, pi = np.nonzero(fits_rzp & fast[:, :, :, None, :])
    if not len(f):
        return Expanded(columns=None, skipped_memory=skipped_memory, skipped_time=skipped_time)
    cols = {name: g[f, j] for j, name in enumerate((*GRID_COLUMNS, *EXPERT_COLUMNS))}
    cols["micro_batch_size"] = fam.micro_batch[rows][f]
    cols["schedule"] = sched[si, 0]
    cols["virtual_stages"] = sched[si, 1]
    cols["recompute"] = np.asarray(rc_opts, dtype=np.int64)[ri]
    cols["zero_stage"] = np.asarray(zero_opts, dtype=np.int64)[zi]
    cols["sequence_parallel"] = np.asarray(sp_opts, dtype=bool)[pi]
    return Expanded(columns=cols, order_index=fam.order_index[rows][f], skipped_memory=skipped_memory,
                    skipped_time=skipped_time)
