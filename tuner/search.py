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

import dataclasses
import time
from collections import Counter

import numpy as np

from perfmodels.plans import from_columns
from perfmodels.specs import AXES, SCALAR_PLAN_FIELDS, Cluster, Model, Training
from perfmodels.steptime import memory_many, predict_many
from tuner import constraints as C
from tuner.space import (
    EXPERT_COLUMNS,
    GRID_COLUMNS,
    cp_options,
    expand_options,
    expert_rows,
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
    grids = expert_rows(model, grids[alive], options)  # + G_ep, G_etp (one pair for a dense model)
    if model.is_moe and len(grids):
        ecols = {name: grids[:, j] for j, name in enumerate((*GRID_COLUMNS, *EXPERT_COLUMNS))}
        looked_at += len(grids) - int(alive.sum())
        keep = np.ones(len(grids), dtype=bool)
        for fn in C.EXPERT_GRID_CONSTRAINTS:
            keep = pruned.apply(fn(model, cluster, training, ecols), keep)
        grids = grids[keep]
    return grids, looked_at


def _valid_plans(model: Model, cluster: Cluster, training: Training, options: SearchOptions,
                 cols: C.Columns, pruned: _Pruned) -> np.ndarray:
    """Mask of the expanded plans no plan constraint rejects. The two dominance rules apply only
    when the user left the dominating choice in the search: a pinned gpipe or selective is kept."""
    ok = np.ones(len(cols["G_data"]), dtype=bool)
    for fn in C.PLAN_CONSTRAINTS:
        ok = pruned.apply(fn(model, cluster, training, cols), ok)
    gpipe_pinned_only = options.schedule is not None and "1f1b" not in options.schedule
    if not gpipe_pinned_only:
        ok = pruned.apply(C.gpipe_dominated(model, cluster, training, cols), ok)
    if not (options.recompute and "none" not in options.recompute):
        ok = pruned.apply(C.selective_without_scores(model, cluster, training, cols), ok)
    return ok


def recommend(model: Model, cluster: Cluster, training: Training, top_k: int = 10,
              search: SearchOptions | None = None, *, diagnose: bool = True) -> Recommendation:
    """The `top_k` fastest valid layouts with predictions, and every rejection counted by reason.
    When pins leave no layout, the explanation says which rules reject each pinned value
    (`tuner.pins.diagnose_pins`; `diagnose=False` skips that)."""
    options = search or SearchOptions()
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if cluster.num_gpus > MAX_GPUS:
        raise ValueError(f"cluster.num_gpus={cluster.num_gpus} exceeds the search limit of {MAX_GPUS}")
    t0 = time.perf_counter()
    pruned = _Pruned(options.examples_per_reason)
    grids, num_evaluated = _valid_grids(model, cluster, training, options, pruned)
    best_batches: list[tuple[float, object, int]] = []  # (time, batch, index)
    num_valid = 0
    truncated = False
    orders = stack_placements(
        training, placements(options, with_cp=bool((grids[:, GRID_COLUMNS.index("G_cp")] > 1).any()),
                             moe=model.is_moe),
        pinned=options.placement is not None, model=model)
    stopped = (orders[0], 0)
    for order in orders:
        for j, exp in enumerate(expand_options(model, training, grids, options, order, orders)):
            stopped = (order, j + 1)
            cols = exp.columns
            num_evaluated += len(cols["G_data"])
            ok = _valid_plans(model, cluster, training, options, cols, pruned)
            if not ok.any():
                continue
            arrays = from_columns(placement=exp.placement, **{k: v[ok] for k, v in cols.items()})
            mem = memory_many(model, cluster, training, arrays)
            fits = pruned.apply(
                C.out_of_memory(mem.total_gib, mem.capacity_gib), np.ones(len(arrays), dtype=bool)
            )
            num_valid += int(fits.sum())
            if not fits.any():
                continue
            arrays = arrays.take(np.flatnonzero(fits))
            batch = predict_many(model, cluster, training, arrays)
            # exact ties go to the simpler plan: no ZeRO, no recomputation, default placement
            simpler = (arrays.zero_stage + arrays.recompute + (exp.placement != orders[0])
                       + arrays.sequence_parallel + (arrays.G_cp > 1) + (arrays.G_ep > 1))
            times = batch.iteration_time_s * (1.0 + 1e-9 * simpler)
            keep = top_k * len(orders)  # room for placements that merge into one row
            k = min(keep, len(times))
            if k:
                idx = np.argpartition(times, k - 1)[:k]
                for i in idx:
                    best_batches.append((float(times[i]), batch, int(i)))
                best_batches.sort(key=lambda x: x[0])
                del best_batches[keep:]
            if time.perf_counter() - t0 > options.time_budget_s:
                truncated = True
                break
        if truncated:
            break
    candidates = _merge_placements(best_batches, top_k)
    skipped, exact = 0, True
    if truncated:
        skipped, exact = _count_rest(model, training, grids, options, orders, *stopped)
        approx = "" if exact else "at least "
        pruned.counts[
            f"not evaluated: time budget of {options.time_budget_s:g} s ran out ({approx}{skipped:,} plans "
            f"never scored)"
        ] += skipped
    source = "preset" if cluster.profile is None else cluster.profile.source
    explanation = explain(candidates)
    if not candidates and diagnose and not truncated:
        from tuner.pins import diagnose_pins, pinned_fields

        if pinned_fields(options):
            explanation = diagnose_pins(
                lambda alone: recommend(model, cluster, training, 1, alone, diagnose=False), options,
                cluster.num_gpus)
    return Recommendation(
        best=candidates[0] if candidates else None,
        candidates=candidates,
        num_evaluated=num_evaluated,
        num_valid=num_valid,
        pruned=dict(pruned.counts),
        pruned_examples=pruned.examples,
        constants_source=source,
        explanation=explanation,
        search_time_s=time.perf_counter() - t0,
        complete=not truncated,
        num_not_evaluated=skipped,
    )


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


def _merge_placements(best: list[tuple[float, object, int]], top_k: int) -> list[Candidate]:
    """The `top_k` fastest distinct plans. A plan seen again under another placement with the same
    predicted time (to 1e-6) is folded into the first row as an equivalent placement; a plan that
    differs from a row only in its ZeRO stage with the same predicted time and memory per GPU (to 1e-6;
    e.g. ZeRO-1 and ZeRO-2 where the stack keeps full gradients either way) is folded into it as an
    equivalent ZeRO stage. The row shows the simpler plan (the ranking breaks exact ties toward it)."""
    rows: list[tuple[object, list[tuple[str, ...]], list[int]]] = []
    index: dict[tuple, int] = {}
    by_zero: dict[tuple, int] = {}
    plans = []
    for _, batch, i in best:
        plan = batch.arrays.to_plan(i)  # type: ignore[attr-defined]
        seconds = float(f"{float(batch.iteration_time_s[i]):.6g}")  # type: ignore[attr-defined]
        key = (dataclasses.replace(plan, placement=None), seconds)
        if key in index:
            rows[index[key]][1].append(plan.order)
            continue
        gib = float(f"{float(batch.memory.total_gib[i]):.6g}")  # type: ignore[attr-defined]
        zero_key = (dataclasses.replace(plan, placement=None, zero_stage=0), seconds, gib)
        if zero_key in by_zero:
            row = by_zero[zero_key]
            index[key] = row  # its other placements fold into the same row
            if plan.order == plans[row].order and plan.zero_stage not in rows[row][2]:
                rows[row][2].append(plan.zero_stage)
            elif plan.order != plans[row].order:
                rows[row][1].append(plan.order)
            continue
        if len(rows) == top_k:
            continue
        index[key] = by_zero[zero_key] = len(rows)
        rows.append(((batch, i), [], []))
        plans.append(plan)
    return [Candidate(rank=r + 1, plan=plans[r], prediction=b.prediction(i),  # type: ignore[attr-defined]
                      equivalent_placements=tuple(dict.fromkeys(eq)),
                      equivalent_zero_stages=tuple(sorted(zs)))
            for r, ((b, i), eq, zs) in enumerate(rows)]


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
