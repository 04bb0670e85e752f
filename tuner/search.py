"""Rank every layout for a model, cluster and batch; explain the winner; count what was rejected.

    rec = tuner.recommend(model, cluster, training, top_k=10, search=SearchOptions(...))

Pipeline of the search (all vectorized, no Python loop per plan):
1. factorize the GPU count into the five degrees, drop grids that break pins or grid constraints;
2. per placement and micro-batch size, expand the options (schedule, virtual stages, recompute,
   ZeRO stage, sequence parallelism) as numpy columns, drop plans that break plan constraints;
3. score them with `perfmodels.predict_many`, drop those that do not fit in memory, keep the
   fastest `top_k` seen so far;
4. stop early if the time budget runs out: the result says so (`complete=False`) and counts the
   plans it never scored (`num_not_evaluated`, by expanding the rest without scoring, which costs
   about 0.1 s per million plans).

Placements that predict exactly the same time for the same plan (the placement moves no group
across a link level) are one row: the simplest order is shown, the others are listed in
`Candidate.equivalent_placements`, so the top list holds `top_k` distinct layouts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np

from perfmodels.memory import StageMemory
from perfmodels.plans import from_columns
from perfmodels.specs import AXES, SCALAR_PLAN_FIELDS, Cluster, Model, Training
from perfmodels.steptime import memory_many, predict_many
from tuner import constraints as C
from tuner.allocator import keep_freed_memory
from tuner.families import (
    BOUND_SLACK,
    expand,
    families,
    grid_table,
    merged_pairs,
    pairs,
    schedule_bounds,
    schedule_fits,
)
from tuner.space import (
    EXPERT_COLUMNS,
    GRID_COLUMNS,
    cp_options,
    expand_options,
    expert_candidates,
    expert_table,
    grid_rows,
    placements,
)
from tuner.types import Candidate, Recommendation, SearchOptions

MAX_GPUS = 1 << 20
COUNT_SKIPPED_S = 1.0
"""At most this long is spent counting the plans a cut-short search did not evaluate."""


class _Pruned:
    def __init__(self, per_reason: int) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.per_reason = per_reason

    def apply(self, rej: C.Rejection, alive: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
        newly = rej.mask & alive
        n = int(newly.sum()) if weight is None else int(weight[newly].sum())
        if n:
            self.counts[rej.reason] += n
            ex = self.examples.setdefault(rej.reason, [])
            for i in np.flatnonzero(newly)[: max(0, self.per_reason - len(ex))]:
                ex.append(rej.example(int(i)))
        return alive & ~rej.mask


def _valid_grids(model: Model, cluster: Cluster, training: Training, options: SearchOptions,
                 pruned: _Pruned) -> tuple[np.ndarray, int]:
    """The degree grids the pins allow and no grid constraint rejects, and how many were looked at."""
    cps = cp_options(model, training, options, cluster.num_gpus)
    grids, pinned = grid_rows(cluster.num_gpus, options, cps)
    alive = pinned.copy()
    pinned_out = int((~pinned).sum())
    if pinned_out:
        pruned.counts["excluded by the search pins"] += pinned_out
    gcols = {name: grids[:, j] for j, name in enumerate(GRID_COLUMNS)}
    for fn in C.GRID_CONSTRAINTS:
        alive = pruned.apply(fn(model, cluster, training, gcols), alive)
    looked_at = len(alive)
    grids = grids[alive]
    pairs, keep = expert_candidates(model, grids, options)  # + G_ep, G_etp (one pair for a dense model)
    if model.is_moe and len(grids):
        looked_at += int(keep.sum()) - len(grids)
        # the expert rules on every (grid, expert pair) before any row is made: columns broadcast to
        # (grids, pairs), the rules' masks and examples read back flat
        shape = keep.shape
        ecols = {name: np.broadcast_to(grids[:, j, None], shape) for j, name in enumerate(GRID_COLUMNS)}
        ecols.update(G_ep=np.broadcast_to(pairs[:, 0], shape), G_etp=np.broadcast_to(pairs[:, 1], shape))
        flat = keep.ravel()
        for fn in C.EXPERT_GRID_CONSTRAINTS:
            rej = fn(model, cluster, training, ecols)
            flat = pruned.apply(C.Rejection(np.broadcast_to(rej.mask, shape).ravel(), rej.reason,
                                            lambda i, rej=rej: rej.example(np.unravel_index(i, shape))), flat)
        keep = flat.reshape(shape)
    grids = expert_table(grids, pairs, keep)
    return grids, looked_at


def _plan_rules(options: SearchOptions, level: str = "all") -> list:
    """The plan constraints in the order they are applied; `level` "schedule" keeps those that read
    only grid, micro-batch and schedule columns (`constraints.SCHEDULE_LEVEL`), "options" the rest.
    The dominance of 1F1B over GPipe applies only when the user left 1F1B in the search."""
    rules = list(C.PLAN_CONSTRAINTS)
    if not (options.schedule is not None and "1f1b" not in options.schedule):
        rules.append(C.gpipe_dominated)
    if level == "all":
        return rules
    return [fn for fn in rules if (fn.__name__ in C.SCHEDULE_LEVEL) == (level == "schedule")]


def _valid_plans(model: Model, cluster: Cluster, training: Training, options: SearchOptions,
                 cols: C.Columns, pruned: _Pruned, level: str = "all") -> np.ndarray:
    """Mask of the expanded plans no plan constraint rejects. The two dominance rules apply only
    when the user left the dominating choice in the search: a pinned gpipe or selective is kept."""
    ok = np.ones(len(cols["G_data"]), dtype=bool)
    for fn in _plan_rules(options, level):
        ok = pruned.apply(fn(model, cluster, training, cols), ok)
    if level != "schedule" and not (options.recompute and "none" not in options.recompute):
        ok = pruned.apply(C.selective_without_scores(model, cluster, training, cols), ok)
    return ok


KEY_COLUMNS = (*GRID_COLUMNS, *EXPERT_COLUMNS, "micro_batch_size", "schedule", "virtual_stages", "recompute",
               "zero_stage", "sequence_parallel")
"""Columns that, after the time and the placement, order plans of exactly equal time: the ranking does
not depend on the order plans were scored in, so a pruned and an exhaustive search agree."""
FIRST_GRIDS = 1_000
"""Grids expanded into (grid, micro-batch size) pairs in the first round; each later round doubles."""
FIRST_PAIRS = 500
"""Pairs refined into families in the first round; each later round doubles."""
FIRST_CHUNK_PLANS = 3_000
"""Plans of the most promising families scored first, to set a k-th best time the bounds can beat."""
BOUND_CHUNK_PLANS = 80_000


ROW_TIME_MARGIN = 2e-5
"""Relative margin above the k-th row's time within which a plan could still fold into a row: rows
merge plans whose times agree to 6 significant digits (`_merge_placements`)."""


class _Best:
    """The `keep` fastest plans scored so far, ordered by (time, placement index, KEY_COLUMNS), of
    which `_merge_placements` makes the top `top_k` rows."""

    def __init__(self, keep: int, top_k: int) -> None:
        self.keep = keep
        self.top_k = top_k
        self.rows: list[tuple[float, tuple, object, int]] = []
        self._limit: float | None = None

    def threshold(self) -> float:
        """A time no plan above which can change the answer: past the `keep`-th entry it is not kept;
        past the k-th row's time (plus `ROW_TIME_MARGIN`) it can neither make a row (there are k
        before it) nor fold into one (its time differs), and skipping it changes no other row."""
        if self._limit is None:
            keep_th = self.rows[-1][0] if len(self.rows) >= self.keep else float("inf")
            times = _row_times(self.rows, self.top_k)
            kth_row = times[-1] * (1.0 + ROW_TIME_MARGIN) if len(times) >= self.top_k else float("inf")
            self._limit = min(keep_th, kth_row)
        return self._limit

    def add(self, times: np.ndarray, batch, order_index: np.ndarray, cols: dict[str, np.ndarray]) -> None:
        k = min(self.keep, len(times))
        if not k:
            return
        kth = np.partition(times, k - 1)[k - 1]
        idx = np.flatnonzero(times <= min(kth, self.threshold()))
        if len(idx) > self.keep:  # exact ties at the cut: the same order as the final sort
            keys = [cols[c][idx] for c in reversed(KEY_COLUMNS)]
            idx = idx[np.lexsort((*keys, order_index[idx], times[idx]))[: self.keep]]
        for i in idx:
            key = (int(order_index[i]), *(int(cols[c][i]) for c in KEY_COLUMNS))
            self.rows.append((float(times[i]), key, batch, int(i)))
        self.rows.sort(key=lambda r: (r[0], r[1]))
        del self.rows[self.keep:]
        self._limit = None


def _fold_rows(best: list[tuple[float, tuple, object, int]], top_k: int
               ) -> tuple[list[int], list[tuple[int, int, str]]]:
    """The rows `_merge_placements` makes of `best`, from the entries' keys (no Plan objects): the
    entry heading each of the first `top_k` rows, and each later entry folded into a row, in order, as
    (row, entry, "placement" | "zero"). A plan seen again with the same predicted time (to 6 digits)
    folds into its row as another placement; one that differs from a row only in its ZeRO stage, with
    the same time and memory per GPU, folds into it as another ZeRO stage."""
    zero_at = 1 + KEY_COLUMNS.index("zero_stage")
    index: dict[tuple, int] = {}
    by_zero: dict[tuple, int] = {}
    heads: list[int] = []
    folds: list[tuple[int, int, str]] = []
    for e, (_, key, batch, i) in enumerate(best):
        seconds = float(f"{float(batch.iteration_time_s[i]):.6g}")  # type: ignore[attr-defined]
        plan_key = (key[1:], seconds)  # the plan without its placement
        if plan_key in index:
            folds.append((index[plan_key], e, "placement"))
            continue
        gib = float(f"{float(batch.memory.total_gib[i]):.6g}")  # type: ignore[attr-defined]
        zero_key = (key[1:zero_at] + key[zero_at + 1:], seconds, gib)  # ... and without its ZeRO stage
        if zero_key in by_zero:
            index[plan_key] = by_zero[zero_key]  # its other placements fold into the same row
            folds.append((by_zero[zero_key], e, "zero"))
            continue
        if len(heads) == top_k:
            continue
        index[plan_key] = by_zero[zero_key] = len(heads)
        heads.append(e)
    return heads, folds


def _row_times(best: list[tuple[float, tuple, object, int]], top_k: int) -> list[float]:
    """The ranking time of the first entry of each of the first `top_k` rows (`_fold_rows`)."""
    return [best[e][0] for e in _fold_rows(best, top_k)[0]]


def _score(model: Model, cluster: Cluster, training: Training, options: SearchOptions, cols: C.Columns,
           order_index: int | np.ndarray, orders: list[tuple[str, ...]], pruned: _Pruned, best: _Best,
           level: str = "all") -> int:
    """Check (the constraints of `level`), screen for memory and time the plans `cols`, under the
    placement `orders[order_index]` (one for all, or one per plan); the valid count."""
    ok = _valid_plans(model, cluster, training, options, cols, pruned, level)
    if not ok.any():
        return 0
    kept = {k: v[ok] for k, v in cols.items()}
    if np.ndim(order_index) == 0:
        arrays = from_columns(placement=orders[int(order_index)], **kept)
        index = np.full(len(arrays), int(order_index))
    else:
        index = np.asarray(order_index)[ok]
        arrays = from_columns(placements=orders, placement_index=index, **kept)
    mem = memory_many(model, cluster, training, arrays)
    fits = pruned.apply(C.out_of_memory(mem.total_gib, mem.capacity_gib), np.ones(len(arrays), dtype=bool))
    if not fits.any():
        return 0
    where = np.flatnonzero(fits)
    arrays = arrays.take(where)
    index = index[where]
    fitting = StageMemory(**{f.name: getattr(mem, f.name)[where] for f in dataclasses.fields(mem)
                             if f.name != "capacity_gib"}, capacity_gib=mem.capacity_gib)
    batch = predict_many(model, cluster, training, arrays, memory=fitting)
    # exact ties go to the simpler plan: no ZeRO, no recomputation, default placement
    simpler = (arrays.zero_stage + arrays.recompute + (index != 0)
               + arrays.sequence_parallel + (arrays.G_cp > 1) + (arrays.G_ep > 1))
    times = batch.iteration_time_s * (1.0 + 1e-9 * simpler)
    best.add(times, batch, index, {k: v[where] for k, v in kept.items()})
    return len(where)


@contextlib.contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """The cyclic garbage collector off for the duration (and back on only where it was on: a search
    in another thread that finds it off leaves it alone). A search makes many short-lived dicts and
    arrays and no reference cycles; its allocations trigger full collections that walk every object
    of the process (numpy's, pydantic's, the service's), about a tenth of a mixture of experts'
    search time. Reference counting still frees everything as it goes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def recommend(model: Model, cluster: Cluster, training: Training, top_k: int = 10,
              search: SearchOptions | None = None, *, diagnose: bool = True) -> Recommendation:
    """The `top_k` fastest valid layouts with predictions, and every rejection counted by reason.

    By default the search bounds each family of plans (one grid, micro-batch size and placement)
    from below (`perfmodels.bounds`) and scores families in order of their bound, until the next
    bound exceeds the k-th best time found: the rest are proved unable to enter the top list and are
    counted, not scored. `SearchOptions(exhaustive=True)` scores every plan; both return the same
    top list with the same times. When pins leave no layout, the explanation says which rules reject
    each pinned value (`tuner.pins.diagnose_pins`; `diagnose=False` skips that)."""
    keep_freed_memory()  # the search's temporaries reuse freed pages (`tuner.allocator`)
    with _without_cycle_collection():
        return _recommend(model, cluster, training, top_k, search, diagnose=diagnose)


def _recommend(model: Model, cluster: Cluster, training: Training, top_k: int,
               search: SearchOptions | None, *, diagnose: bool) -> Recommendation:
    options = search or SearchOptions()
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if cluster.num_gpus > MAX_GPUS:
        raise ValueError(f"cluster.num_gpus={cluster.num_gpus} exceeds the search limit of {MAX_GPUS}")
    t0 = time.perf_counter()
    pruned = _Pruned(options.examples_per_reason)
    grids, looked_at = _valid_grids(model, cluster, training, options, pruned)
    orders = stack_placements(
        training, placements(options, with_cp=bool((grids[:, GRID_COLUMNS.index("G_cp")] > 1).any()),
                             moe=model.is_moe),
        pinned=options.placement is not None, model=model)
    best = _Best(top_k * len(orders), top_k)  # room for placements that merge into one row
    run = _exhaustive if options.exhaustive else _bounded
    outcome = run(model, cluster, training, options, grids, orders, pruned, best, t0)
    candidates = _merge_placements(best.rows, top_k)
    if outcome.truncated:
        approx = "" if outcome.exact_skipped else "at least "
        pruned.counts[
            f"not evaluated: time budget of {options.time_budget_s:g} s ran out ({approx}"
            f"{outcome.skipped:,} plans never scored)"
        ] += outcome.skipped
    if outcome.proved_memory:
        pruned.counts[MEMORY_BOUND_REASON] += outcome.proved_memory
    if outcome.proved_time:
        pruned.counts[PROVED_REASON] += outcome.proved_time
    source = "preset" if cluster.profile is None else cluster.profile.source
    explanation = explain(candidates)
    if not candidates and diagnose and not outcome.truncated:
        from tuner.pins import diagnose_pins, pinned_fields

        if pinned_fields(options):
            explanation = diagnose_pins(
                lambda alone: recommend(model, cluster, training, 1, alone, diagnose=False), options,
                cluster.num_gpus)
    return Recommendation(
        best=candidates[0] if candidates else None,
        candidates=candidates,
        num_evaluated=looked_at + outcome.evaluated,
        num_valid=outcome.valid,
        pruned=dict(pruned.counts),
        pruned_examples=pruned.examples,
        constants_source=source,
        explanation=explanation,
        search_time_s=time.perf_counter() - t0,
        complete=not outcome.truncated,
        num_not_evaluated=outcome.skipped,
        num_proved_slower=outcome.proved_memory + outcome.proved_time,
        exhaustive=options.exhaustive,
    )


PROVED_REASON = "cannot reach the top list: a lower bound on their step time exceeds the k-th best time"
MEMORY_BOUND_REASON = ("needs more memory per GPU than available with every option of its grid and "
                       "micro-batch size (a lower bound on the memory)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Outcome:
    evaluated: int
    valid: int
    proved_memory: int = 0
    """Plans never scored: a bound on their memory exceeds the GPU's."""
    proved_time: int = 0
    """Plans never scored: a bound on their step time exceeds the k-th best time."""
    truncated: bool = False
    skipped: int = 0
    exact_skipped: bool = True


def _exhaustive(model: Model, cluster: Cluster, training: Training, options: SearchOptions, grids: np.ndarray,
                orders: list[tuple[str, ...]], pruned: _Pruned, best: _Best, t0: float) -> _Outcome:
    """Score every plan, placement by placement and micro-batch size by micro-batch size."""
    evaluated = valid = 0
    stopped = (orders[0], 0)
    for order in orders:
        for j, exp in enumerate(expand_options(model, training, grids, options, order, orders)):
            stopped = (order, j + 1)
            evaluated += len(exp.columns["G_data"])
            valid += _score(model, cluster, training, options, exp.columns, orders.index(order), orders,
                            pruned, best)
            if time.perf_counter() - t0 > options.time_budget_s:
                skipped, exact = _count_rest(model, training, grids, options, orders, *stopped)
                return _Outcome(evaluated=evaluated, valid=valid, truncated=True, skipped=skipped,
                                exact_skipped=exact)
    return _Outcome(evaluated=evaluated, valid=valid)


class _GridOrder:
    """The grids in the order of their bounds (ties by index, as a stable sort), sorted only as far as
    the search reaches: a mixture of experts has tens of thousands of grids, of which it expands a
    few thousand, and sorting them all costs about as much as a round of pairs. `order[:k]` are the
    k cheapest, `bounds[:k]` their bounds less the slack."""

    def __init__(self, bound_s: np.ndarray, first: int) -> None:
        self._all = bound_s
        self._cutoff = -np.inf  # every grid of bound <= this is in `order`
        self.order = np.zeros(0, dtype=np.int64)
        self.bounds = np.zeros(0)
        self._sort(first)

    def _sort(self, count: int) -> None:
        n = len(self._all)
        if count >= n:
            self.order, self._cutoff = np.argsort(self._all, kind="stable"), np.inf
        else:
            self._cutoff = float(np.partition(self._all, count)[count])
            idx = np.flatnonzero(self._all <= self._cutoff)
            self.order = idx[np.lexsort((idx, self._all[idx]))]
        self.bounds = self._all[self.order] * (1.0 - BOUND_SLACK)

    def reach(self, limit: float, wanted: int) -> int:
        """How many grids have a bound (less the slack) at or below `limit`, counting at least the
        first `wanted` of them (sorting further where needed): the search asks again for more."""
        while (limit >= self._cutoff * (1.0 - BOUND_SLACK) and np.isfinite(self._cutoff)
               and len(self.order) < wanted):
            self._sort(max(2 * len(self.order), wanted))
        return int(np.searchsorted(self.bounds, limit, side="right"))


class _Pool:
    """Items (pairs or families) of several batches, each with a lower bound, not yet expanded."""

    def __init__(self) -> None:
        self.batches: list = []
        self.bound = np.zeros(0)
        self.plans = np.zeros(0, dtype=np.int64)  # how many plans each item stands for
        self.done = np.zeros(0, dtype=bool)
        self.at = np.zeros((0, 2), dtype=np.int64)  # (batch, row)

    def add(self, batch, bounds: np.ndarray, plans: np.ndarray) -> None:
        self.batches.append(batch)
        self.bound = np.concatenate([self.bound, bounds])
        self.plans = np.concatenate([self.plans, plans])
        self.done = np.concatenate([self.done, np.zeros(len(bounds), dtype=bool)])
        rows = np.arange(len(bounds))
        which = np.full(len(rows), len(self.batches) - 1)
        self.at = np.concatenate([self.at, np.stack([which, rows], axis=1)])

    def open(self, limit: float) -> np.ndarray:
        """Items that may still hold a winner, cheapest bound first."""
        idx = np.flatnonzero(~self.done & (self.bound * (1.0 - BOUND_SLACK) <= limit))
        return idx[np.argsort(self.bound[idx], kind="stable")]

    def take(self, idx: np.ndarray) -> list[tuple[object, np.ndarray]]:
        """Mark `idx` expanded; (batch, its rows) for each batch they come from."""
        self.done[idx] = True
        return [(self.batches[b], self.at[idx][self.at[idx, 0] == b, 1]) for b in np.unique(self.at[idx, 0])]


def _bounded(model: Model, cluster: Cluster, training: Training, options: SearchOptions, grids: np.ndarray,
             orders: list[tuple[str, ...]], pruned: _Pruned, best: _Best, t0: float) -> _Outcome:
    """Best-first branch and bound over three levels (`tuner.families`, `perfmodels.bounds`):

    - a grid has the coarsest bound (any micro-batch size, placement and option);
    - a (grid, micro-batch size) pair, a bound for any placement and option, once its grid is
      expanded (the schedule rules applied on the way);
    - a family (the pair under one placement) has bounds on time per recomputation and
      sequence-parallel setting and on memory per ZeRO stage as well, once its pair is refined;
      families are scored, each only in the parts that may fit and win (`tuner.families.expand`).
    Each round works on whichever level holds the cheapest open bound; expanding a level only raises
    bounds, and scoring only lowers the k-th best time (`_Best.threshold`). It ends when no grid, pair
    or family has a bound at or below that time: everything left is proved unable to change the
    answer. Or when the time budget runs out."""
    screened = [0]

    def screen(cols: dict[str, np.ndarray], weights: np.ndarray, level: str) -> np.ndarray:
        ok = np.ones(len(weights), dtype=bool)
        for fn in _plan_rules(options, "schedule"):
            if (fn.__name__ in C.READS_MICRO_BATCH) == (level == "pair"):
                ok = pruned.apply(fn(model, cluster, training, cols), ok, weights)
        screened[0] += int(weights[~ok].sum())
        return ok

    table = grid_table(model, cluster, training, grids, options, orders)
    ordered = _GridOrder(table.bound_s, 2 * FIRST_GRIDS)
    pair_pool, family_pool = _Pool(), _Pool()
    expanded = 0  # grids expanded into pairs, in `ordered.order`
    evaluated = valid = 0
    memory_skipped, time_skipped = table.out_of_memory, 0
    grid_batch, pair_batch = FIRST_GRIDS, FIRST_PAIRS
    while True:
        limit = best.threshold()
        reach = ordered.reach(limit, expanded + 1)  # sorted further only as far as a round takes
        grid_bounds = ordered.bounds
        open_pairs, open_families = pair_pool.open(limit), family_pool.open(limit)
        next_grid = grid_bounds[expanded] if expanded < reach else np.inf
        next_pair = pair_pool.bound[open_pairs[0]] if len(open_pairs) else np.inf
        next_family = family_pool.bound[open_families[0]] if len(open_families) else np.inf
        if not np.isfinite(min(next_grid, next_pair, next_family)):
            break
        if not best.rows and len(open_families):
            next_grid = next_pair = np.inf  # dive: score the best families found so far to set a limit
        if next_grid <= min(next_pair, next_family):
            # the next `grid_batch` grids in bound order (a mixture of experts' grids whose states
            # cannot fit are bounded at infinity by the table, `tuner.families.grid_table`; the pairs'
            # own memory bound drops the few others that cannot fit)
            reach = ordered.reach(limit, expanded + grid_batch)
            subset = ordered.order[expanded:min(reach, expanded + grid_batch)]
            expanded += len(subset)
            grid_batch *= 2  # each round costs a fixed overhead: fewer, larger ones as the search goes on
            pr = pairs(model, cluster, training, grids, table, subset, screen)
            memory_skipped += pr.out_of_memory
            pair_pool.add(pr, pr.bound_s, pr.plans * pr.placements)
        elif next_pair <= next_family:
            pr, rows = merged_pairs(pair_pool.take(open_pairs[:pair_batch]))  # one pass for every batch
            fam = families(model, cluster, training, grids, pr, rows, orders)
            memory_skipped += fam.out_of_memory
            family_pool.add(fam, fam.bound_s, fam.plans)
            pair_batch *= 2
        else:
            size = FIRST_CHUNK_PLANS if evaluated == 0 else BOUND_CHUNK_PLANS
            plans = np.cumsum(family_pool.plans[open_families])
            chunk = open_families[: max(1, int(np.searchsorted(plans, size, side="right")))]
            parts = []
            for fam, rows in family_pool.take(chunk):
                part = expand(fam, rows, grids, limit, schedule_bounds(model, cluster, training, fam, rows),
                              schedule_fits(model, fam, rows))
                memory_skipped += part.skipped_memory
                time_skipped += part.skipped_time
                if part.columns is not None:
                    parts.append(part)
            if parts:  # one scoring pass for the families of every batch (each pass costs an overhead)
                cols = {k: np.concatenate([p.columns[k] for p in parts]) for k in parts[0].columns}  # type: ignore[index]
                evaluated += len(cols["G_data"])
                valid += _score(model, cluster, training, options, cols,
                                np.concatenate([p.order_index for p in parts]), orders,  # type: ignore[misc]
                                pruned, best, level="options")
        # the budget stops the search once it has an answer to give (its first scored chunk)
        if best.rows and time.perf_counter() - t0 > options.time_budget_s:
            rest = table.total_plans - evaluated - screened[0] - memory_skipped - time_skipped
            if rest > 0:
                return _Outcome(evaluated=evaluated + screened[0], valid=valid, truncated=True, skipped=rest,
                                proved_memory=memory_skipped, proved_time=time_skipped)
    evaluated += screened[0]
    return _Outcome(evaluated=evaluated, valid=valid, proved_memory=memory_skipped,
                    proved_time=table.total_plans - evaluated - memory_skipped)


def complete_order(partial: tuple[str, ...], axes: tuple[str, ...] = AXES) -> tuple[str, ...]:
    """`partial` (some axes, innermost first) as a whole order of `axes`: an axis it leaves out
    goes right after the axis the default order has before it (so "cp" follows "row")."""
    order = [a for a in partial if a in axes]
    for i, axis in enumerate(axes):
        if axis in order:
            continue
        before = [a for a in axes[:i] if a in order]
        order.insert(order.index(before[-1]) + 1 if before else 0, axis)
    return tuple(order)


def stack_placements(training: Training, orders: list[tuple[str, ...]], *, pinned: bool,
                     model: Model | None = None) -> list[tuple[str, ...]]:
    """The placements to search: the stack's launchable orders (`Stack.launch_placements`) where it
    has them, kept to the pinned ones when the user pinned placements. A mixture-of-experts model
    keeps only the orders with the pipeline outermost: Megatron-Core asserts that without pp-last
    ordering the attention and expert layers have the same data-parallel size
    (megatron/core/parallel_state.py:902 at NVIDIA/Megatron-LM d98e8a64), which expert folding breaks."""
    launch = training.effective_stack.launch_placements
    if not launch:
        return orders
    if model is not None and getattr(model, "num_moe_experts", None):
        outer = [p for p in launch if "inter" not in p or "data" not in p
                 or p.index("data") < p.index("inter")]
        launch = tuple(outer) or launch
    mine = list(dict.fromkeys(complete_order(p) for p in launch))
    if pinned:
        kept = [o for o in orders if o in mine]
        if not kept:
            raise ValueError(f"search.placement: the {training.effective_stack.name} stack builds only "
                             f"the rank orders {[list(o) for o in mine]}")
        return kept
    return mine


def _merge_placements(best: list[tuple[float, tuple, object, int]], top_k: int) -> list[Candidate]:
    """The `top_k` fastest distinct plans, with the placements and ZeRO stages folded into each row
    (`_fold_rows`: same predicted time, and for ZeRO stages the same memory per GPU, to 6 digits;
    e.g. ZeRO-1 and ZeRO-2 where the stack keeps full gradients either way). The row shows the
    simpler plan (the ranking breaks exact ties toward it). Plan objects are made only for what is
    shown."""
    heads, folds = _fold_rows(best, top_k)

    def plan_of(e: int):
        _, _, batch, i = best[e]
        return batch.arrays.to_plan(i)  # type: ignore[attr-defined]

    plans = [plan_of(e) for e in heads]
    placements: list[list[tuple[str, ...]]] = [[] for _ in heads]
    zero_stages: list[list[int]] = [[] for _ in heads]
    for row, e, kind in folds:
        plan = plan_of(e)
        if kind == "zero" and plan.order == plans[row].order:
            if plan.zero_stage not in zero_stages[row]:
                zero_stages[row].append(plan.zero_stage)
        else:
            placements[row].append(plan.order)
    return [Candidate(rank=r + 1, plan=plans[r], prediction=best[e][2].prediction(best[e][3]),  # type: ignore[attr-defined]
                      equivalent_placements=tuple(dict.fromkeys(placements[r])),
                      equivalent_zero_stages=tuple(sorted(zero_stages[r])))
            for r, e in enumerate(heads)]


def _count_rest(model: Model, training: Training, grids: np.ndarray, options: SearchOptions,
                orders: list[tuple[str, ...]], stopped_order: tuple[str, ...], done: int) -> tuple[int, bool]:
    """Plans a cut-short search never scored: the rest of the placement it stopped in (after its first
    `done` expansions), and every later placement, expanded without scoring. (count, exact); not
    exact when counting itself ran past COUNT_SKIPPED_S."""
    t0 = time.perf_counter()
    count = 0
    for order in orders[orders.index(stopped_order):]:
        for j, exp in enumerate(expand_options(model, training, grids, options, order, orders)):
            if order == stopped_order and j < done:
                continue
            count += len(exp.columns["G_data"])
            if time.perf_counter() - t0 > COUNT_SKIPPED_S:
                return count, False
    return count, True


_COMPONENTS = (
    "compute_s",
    "tp_comm_s",
    "dp_comm_s",
    "pp_bubble_s",
    "pp_p2p_s",
    "exposed_comm_s",
    "optimizer_s",
    "recompute_s",
)


def explain(candidates: list[Candidate]) -> str:
    """Why the best beats the runner-up: its margin and the components that differ most.

    The runner-up is the first candidate that is measurably slower (0.01%); candidates closer than
    that are reported as ties (often the same grid with a placement that changes no link level).
    """
    if not candidates:
        return "no layout fits: every candidate was rejected (see 'pruned')"
    best = candidates[0]
    tb = best.prediction.iteration_time_s
    ties = [c for c in candidates[1:] if c.prediction.iteration_time_s <= tb * (1 + 1e-4)]
    slower = [c for c in candidates[1:] if c.prediction.iteration_time_s > tb * (1 + 1e-4)]
    tie_note = f" ({len(ties)} other candidate(s) in the top list tie with it within 0.01%)" if ties else ""
    if not slower:
        return f"{best.plan.grid_string()} is the best layout found{tie_note}"
    second = slower[0]
    ts = second.prediction.iteration_time_s
    diffs = []
    for name in _COMPONENTS:
        a = getattr(best.prediction.breakdown, name)
        b = getattr(second.prediction.breakdown, name)
        if abs(a - b) > 1e-3 * max(tb, 1e-9):
            diffs.append((abs(a - b), name, a, b))
    diffs.sort(reverse=True)
    parts = [f"{name.removesuffix('_s')} {a:.3g} s vs {b:.3g} s" for _, name, a, b in diffs[:3]]
    changed = [f for f in SCALAR_PLAN_FIELDS if getattr(best.plan, f) != getattr(second.plan, f)]
    what = [f"{f}={getattr(best.plan, f)} (runner-up {getattr(second.plan, f)})" for f in changed]
    if best.plan.order != second.plan.order:
        what.append(f"placement {'/'.join(best.plan.order)} (runner-up {'/'.join(second.plan.order)})")
    return (
        f"best is {(ts - tb) / ts:.1%} faster than the runner-up #{second.rank} ({tb:.3g} s vs {ts:.3g} s "
        "per "
        f"step){tie_note}; it differs in {', '.join(what) or 'nothing'}; largest component differences: "
        f"{'; '.join(parts) or 'none'}"
    )
