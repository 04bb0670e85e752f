"""The bounded search (tuner.families, perfmodels.bounds) against the exhaustive one.

Two claims, each checked on real search spaces:
1. every bound is below what the model predicts: for every plan of a space, its family's time bound
   (at the plan's own recomputation, sequence-parallel setting, ZeRO stage and virtual stages) is
   at most its predicted step time, the coarse per-pair bound too, and its memory bound at most its
   predicted memory;
2. so the default (bounded) search returns exactly the exhaustive search's top list: the same plans,
   the same predicted times to the last bit, the same merged placements and ZeRO stages, with every
   plan either checked or proved out.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfmodels import presets
from perfmodels.bounds import (
    blocks_bound_s,
    bound_parts,
    grid_bound_s,
    grid_bounds_by_option,
    lower_bound_s,
    memory_bound,
    schedule_in_flight,
    states_bound,
    with_options,
)
from perfmodels.plans import RECOMPUTE_CODE, from_columns
from perfmodels.specs import Profile, Training
from perfmodels.steptime import memory_many, predict_many
from tuner import SearchOptions, recommend
from tuner import constraints as C
from tuner import search as S
from tuner.families import grid_table
from tuner.space import expand_options, option_lists, placements

MEGATRON = Training(global_batch_size=64, stack="megatron-core")
SPACES = {
    # (model, cluster, GPUs, training, model changes)
    "gpt3-175b-selene-64": ("gpt3-175b", "selene", 64, Training(global_batch_size=1536), {}),
    "llama3-8b-32k-megatron-cp": ("llama3-8b", "eos", 32, MEGATRON, {"seq_length": 32768}),
    "mixtral-megatron-32": ("mixtral-8x7b", "eos", 32,
                            Training(global_batch_size=256, stack="megatron-core"), {}),
    "mixtral-gridtune-32": ("mixtral-8x7b", "eos", 32, Training(global_batch_size=256), {}),
    "gpt2-deepspeed-16": ("gpt2-xl", "dgx1-v100", 16, Training(global_batch_size=128, stack="deepspeed"), {}),
    "llama2-fsdp-overlap-32": ("llama2-7b", "perlmutter", 32,
                               Training(global_batch_size=256, stack="fsdp", overlap_tp_comm=True), {}),
    "tiny-cpu-8": ("tiny-gpt", "local-cpu", 8, Training(global_batch_size=32, dtype="fp32"), {}),
    "tiny-cpu-shared-cores-8": ("tiny-gpt", "local-cpu", 8, Training(global_batch_size=32, dtype="fp32"), {}),
    "gpt3-calibrated-megatron-64": ("gpt3-18b", "selene", 64,
                                    Training(global_batch_size=512, stack="megatron-lm"), {}),
}
CALIBRATED = Profile(source="calibrated", corrections=(("compute", 1.07), ("tp_comm", 1.3), ("dp_comm", 0.9)),
                     constants=(("gemm_half_size", 300.0), ("host_us_per_layer", 2400.0),
                                ("host_exposed_fraction", 0.5), ("intra_node_busbw_GBps", 150.0),
                                ("memory_overhead_gib", 6.0)))
"""A calibrated profile (constants and per-component corrections), as `gridtune calibrate` makes."""


def _space(name: str):
    model_name, cluster_name, gpus, training, changes = SPACES[name]
    model = presets.model(model_name)
    if changes:
        model = dataclasses.replace(model, **changes)
    cluster = presets.cluster(cluster_name, gpus)
    if "calibrated" in name:
        cluster = dataclasses.replace(cluster, profile=CALIBRATED)
    if "shared-cores" in name:  # 8 ranks on 2 cores (Cluster.cpu_cores_per_node): compute stretched
        cluster = dataclasses.replace(cluster, cpu_cores_per_node=2)
    return model, cluster, training


def _every_plan(model, cluster, training):
    """Every plan of the exhaustive expansion (before any rule), one PlanArrays per placement."""
    options = SearchOptions()
    grids, _ = S._valid_grids(model, cluster, training, options, S._Pruned(0))
    orders = S.stack_placements(training, placements(options, with_cp=bool((grids[:, 5] > 1).any()),
                                                     moe=model.is_moe), pinned=False, model=model)
    for order in orders:
        for exp in expand_options(model, training, grids, options, order, orders):
            yield from_columns(placement=order, **exp.columns)


@pytest.mark.parametrize("name", list(SPACES))
def test_bounds_never_exceed_the_prediction(name):
    model, cluster, training = _space(name)
    checked = 0
    for arrays in _every_plan(model, cluster, training):
        # on a sample of each batch: the bound computations cost about as much as the predictions
        arrays = arrays.take(np.arange(0, len(arrays), max(1, len(arrays) // 4000)))
        batch = predict_many(model, cluster, training, arrays)
        mem = memory_many(model, cluster, training, arrays)
        v = np.where(arrays.schedule == 2, arrays.virtual_stages, 1)
        # the pair's bound at each plan's own recomputation and sequence-parallel setting
        coarse = blocks_bound_s(model, cluster, training, arrays, v, list(RECOMPUTE_CODE.values()),
                                [False, True])
        coarse = coarse[arrays.recompute, arrays.sequence_parallel.astype(int), np.arange(len(arrays))]
        assert (coarse <= batch.iteration_time_s * (1 + 1e-9)).all()
        # the grid's bound, over the smallest and largest micro-batch sizes its replicas can take
        per_replica = training.global_batch_size // (arrays.G_data * arrays.G_intra_d)
        largest = np.max([np.where(per_replica % b == 0, b, 1) for b in range(1, 65)], axis=0)
        grid = grid_bound_s(model, cluster, training, with_options(arrays, micro_batch_size=1),
                            with_options(arrays, micro_batch_size=largest), v, [False, True])
        assert (grid <= batch.iteration_time_s * (1 + 1e-9)).all()
        for rc in np.unique(arrays.recompute):
            for sp in np.unique(arrays.sequence_parallel):
                idx = np.flatnonzero((arrays.recompute == rc) & (arrays.sequence_parallel == sp))
                if not len(idx):
                    continue
                part = arrays.take(idx)
                # the grid's bound at the plan's own recomputation and sequence-parallel setting (the
                # search raises a grid's bound to it where memory rules out the cheaper settings)
                forced = grid_bounds_by_option(
                    model, cluster, training, with_options(part, micro_batch_size=1),
                    with_options(part, micro_batch_size=largest[idx]), v[idx], [int(rc)], [bool(sp)])[0, 0]
                assert (forced <= batch.iteration_time_s[idx] * (1 + 1e-9)).all()
                parts = bound_parts(model, cluster, training, part, v[idx], [int(rc)], [bool(sp)])
                bound = lower_bound_s(model, cluster, training, parts, part.placement)[0, 0]
                t = batch.iteration_time_s[idx]
                worst = np.max(bound / t)
                assert worst <= 1 + 1e-9, f"time bound above the prediction by {worst - 1:.2e}"
                # the bound of the plans that run one schedule, at that schedule
                runs = sorted({(int(a), int(b)) for a, b in zip(part.schedule, part.virtual_stages)})
                per_schedule = lower_bound_s(model, cluster, training, parts, part.placement, runs)[:, 0, 0]
                which = [runs.index((int(a), int(b))) for a, b in zip(part.schedule, part.virtual_stages)]
                own = per_schedule[which, np.arange(len(idx))]
                assert (own <= t * (1 + 1e-9)).all(), f"schedule bound above by {np.max(own / t) - 1:.2e}"
                assert (own >= bound * (1 - 1e-9)).all()  # never looser than the any-schedule bound
                for z in np.unique(part.zero_stage):
                    jdx = np.flatnonzero(part.zero_stage == z)
                    sub = part.take(jdx)
                    bound_mem = memory_bound(model, cluster, training, sub, [int(z)], [int(rc)], [bool(sp)])
                    low = bound_mem.states_gib[0] + bound_mem.rest_gib[0, 0]
                    assert (low <= mem.total_gib[idx][jdx] * (1 + 1e-9)).all()
                    # at the plan's own schedule: the micro-batches it holds beyond 1F1B's, on its
                    # busiest stage (`schedule_in_flight`)
                    extra = schedule_in_flight(model.num_layers, sub.G_inter, sub.num_microbatches(training),
                                               runs)
                    own_extra = extra[[which[j] for j in jdx], np.arange(len(jdx))]
                    with_schedule = low + own_extra * bound_mem.in_flight_gib[0, 0]
                    assert (with_schedule <= mem.total_gib[idx][jdx] * (1 + 1e-9)).all()
                    assert (own_extra >= 0).all()
                checked += len(idx)
        # the grid's states floor (`tuner.families.grid_table` for a mixture of experts): the first
        # stage's weights, gradients and optimizer state `states_bound` gives at each plan's own ZeRO
        # stage (any micro-batch size), what `memory_bound` gives, at most the plan's peak memory
        one = with_options(arrays, micro_batch_size=1)
        floor = states_bound(model, cluster, training, one, [0, 1, 2, 3])
        assert np.array_equal(floor.states_gib, memory_bound(model, cluster, training, one, [0, 1, 2, 3],
                                                              [0], [False]).states_gib)
        own = floor.states_gib[arrays.zero_stage, np.arange(len(arrays))]
        assert (own <= mem.total_gib * (1 + 1e-9)).all()
    assert checked > 500


def _rows(rec):
    return [(c.plan, c.prediction.iteration_time_s, c.equivalent_placements, c.equivalent_zero_stages)
            for c in rec.candidates]


@pytest.mark.parametrize("name", list(SPACES))
def test_bounded_search_returns_the_exhaustive_top_list(name):
    model, cluster, training = _space(name)
    bounded = recommend(model, cluster, training, top_k=10)
    full = recommend(model, cluster, training, top_k=10, search=SearchOptions(exhaustive=True))
    assert _rows(bounded) == _rows(full)
    assert full.num_proved_slower == 0 and full.exhaustive and not bounded.exhaustive
    # every plan is either checked (by a rule, or scored) or proved out by a bound
    assert bounded.num_evaluated + bounded.num_proved_slower == full.num_evaluated
    assert bounded.num_valid <= full.num_valid


def test_the_issue_case_proves_most_of_the_space_and_matches_top_25():
    """GPT-3 175B on 1,024 Selene GPUs: the same 25 rows, scoring a small share of the plans."""
    model, cluster = presets.model("gpt3-175b"), presets.cluster("selene", 1024)
    training = Training(global_batch_size=1536)
    bounded = recommend(model, cluster, training, top_k=25)
    full = recommend(model, cluster, training, top_k=25, search=SearchOptions(exhaustive=True))
    assert _rows(bounded) == _rows(full)
    assert bounded.num_valid * 20 < full.num_valid
    assert bounded.num_proved_slower > 0.5 * full.num_evaluated
    assert any("lower bound" in reason for reason in bounded.pruned)


@pytest.mark.parametrize("options", [
    SearchOptions(schedule=("gpipe",)),
    SearchOptions(recompute=("full",), zero_stage=(3,)),
    SearchOptions(G_intra_r=(8,), micro_batch_size=(1, 2)),
    SearchOptions(sequence_parallel=(True,), virtual_stages=(2, 3)),
])
def test_pinned_searches_agree(options):
    model, cluster = presets.model("gpt3-39b"), presets.cluster("selene", 128)
    training = Training(global_batch_size=512, stack="megatron-core")
    bounded = recommend(model, cluster, training, top_k=5, search=options)
    full = recommend(model, cluster, training, top_k=5, search=dataclasses.replace(options, exhaustive=True))
    assert _rows(bounded) == _rows(full)


def test_schedule_level_rules_read_only_grid_and_schedule_columns():
    """The rules the bounded search applies before expanding recomputation, ZeRO and sequence
    parallelism must not read those columns (or their answer would be a guess)."""
    allowed = {"G_data", "G_inter", "G_intra_d", "G_intra_r", "G_intra_c", "G_cp", "G_ep", "G_etp",
               "micro_batch_size", "schedule", "virtual_stages"}

    class Reads(dict):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.read: set[str] = set()

        def __getitem__(self, key):
            self.read.add(key)
            return super().__getitem__(key)

        def get(self, key, default=None):
            self.read.add(key)
            return super().get(key, default)

    n = 4
    cols = {name: np.full(n, 2, dtype=np.int64) for name in allowed}
    cols.update(recompute=np.zeros(n, dtype=np.int64), zero_stage=np.ones(n, dtype=np.int64),
                sequence_parallel=np.ones(n, dtype=bool))
    rules = [fn for fn in (*C.PLAN_CONSTRAINTS, C.gpipe_dominated) if fn.__name__ in C.SCHEDULE_LEVEL]
    assert len(rules) == len(C.SCHEDULE_LEVEL)
    for stack in ("megatron-core", "deepspeed", "fsdp", "torchtitan", "gridtune", "nemo"):
        for model_name in ("gpt3-39b", "mixtral-8x7b"):
            for fn in rules:
                seen = Reads(cols)
                fn(presets.model(model_name), presets.cluster("selene", 64),
                   Training(global_batch_size=64, stack=stack), seen)
                assert seen.read <= allowed, f"{fn.__name__} reads {seen.read - allowed}"
                # the bounded search applies these per (grid, schedule), before micro-batch sizes
                assert ("micro_batch_size" in seen.read) == (fn.__name__ in C.READS_MICRO_BATCH), fn.__name__


@pytest.mark.parametrize("name", ["gpt2-deepspeed-16", "mixtral-megatron-32", "tiny-cpu-8",
                                  "mixtral-gridtune-32"])
def test_options_the_stack_cannot_run_are_rejected_by_its_rules(name):
    """The family and pair bounds leave out the (ZeRO, recompute, sequence-parallel) options
    `constraints.stack_runs_options` says no plan with them runs: every such plan of the space must
    be one the plan rules reject, or the search could prove out a plan that wins."""
    model, cluster, training = _space(name)
    options = SearchOptions()
    _, rc_opts, zero_opts, sp_opts = option_lists(training, options)
    grids, _ = S._valid_grids(model, cluster, training, options, S._Pruned(0))
    orders = S.stack_placements(training, placements(options, with_cp=bool((grids[:, 5] > 1).any()),
                                                     moe=model.is_moe), pinned=False, model=model)
    left_out = 0
    for exp in expand_options(model, training, grids, options, orders[0], orders):
        cols = exp.columns
        runs = C.stack_runs_options(training, cols["G_inter"], zero_opts, rc_opts, [bool(x) for x in sp_opts])
        where = (np.searchsorted(zero_opts, cols["zero_stage"]), np.searchsorted(rc_opts, cols["recompute"]),
                 np.asarray([sp_opts.index(bool(x)) for x in cols["sequence_parallel"]]),
                 np.arange(len(cols["G_data"])))
        ok = S._valid_plans(model, cluster, training, options, cols, S._Pruned(0))
        assert not (ok & ~runs[where]).any()
        left_out += int((~runs[where]).sum())
    assert left_out > 0  # the stacks here leave some options out (ZeRO-3, selective, ZeRO-2 with a pipeline)


def test_deepseek_on_1024_gpus_matches_the_exhaustive_search():
    """The issue's mixture-of-experts case on Megatron-Core (combined 1F1B overlap of the all-to-alls,
    DeepSeek-V3's 256 experts over every G_ep): the same top list as scoring every plan."""
    model, cluster = presets.model("deepseek-v3"), presets.cluster("eos", 1024)
    training = Training(global_batch_size=8192, stack="megatron-core")
    bounded = recommend(model, cluster, training, top_k=10)
    full = recommend(model, cluster, training, top_k=10, search=SearchOptions(exhaustive=True))
    assert _rows(bounded) == _rows(full)
    assert bounded.num_evaluated + bounded.num_proved_slower == full.num_evaluated
    assert bounded.num_valid * 20 < full.num_valid


@pytest.mark.parametrize("stack", ["gridtune", "megatron-core"])
def test_the_grid_table_states_are_the_pairs_own(stack):
    """A mixture of experts' grid table drops the grids whose states alone cannot fit and keeps the
    others' states (`families.grid_table`), which the pairs' memory bound reuses at every micro-batch
    size: the same values, to the bit, as the bound works out for each pair, and every dropped grid
    is one whose states exceed the memory at every ZeRO stage the stack runs."""
    model, cluster = presets.model("deepseek-v3"), presets.cluster("eos", 1024)
    training = Training(global_batch_size=4096, stack=stack)
    options = SearchOptions()
    grids, _ = S._valid_grids(model, cluster, training, options, S._Pruned(0))
    orders = S.stack_placements(training, placements(options, moe=True), pinned=False, model=model)
    table = grid_table(model, cluster, training, grids, options, orders)
    _, rc_opts, zero_opts, sp_opts = table.options
    kept = np.isfinite(table.bound_s)
    assert 0 < kept.sum() < len(grids)
    # every pair of every kept grid, at its own micro-batch sizes and largest ZeRO stage
    gi = np.flatnonzero(kept)
    par = table.parent[gi]
    sizes = table.pair_start[par + 1] - table.pair_start[par]
    rows = np.repeat(gi, sizes)
    mb = table.pair_micro_batch[np.concatenate([np.arange(table.pair_start[p], table.pair_start[p + 1])
                                                for p in par])]
    reps = from_columns(**{name: grids[rows, j] for j, name in enumerate(
        ("G_data", "G_inter", "G_intra_d", "G_intra_r", "G_intra_c", "G_cp", "G_ep", "G_etp"))},
        micro_batch_size=mb, zero_stage=np.where(grids[rows, 0] > 1, max(zero_opts), 0))
    sps = [bool(x) for x in sp_opts]
    own = memory_bound(model, cluster, training, reps, zero_opts, rc_opts, sps)
    reused = memory_bound(model, cluster, training, reps, zero_opts, rc_opts, sps,
                          states_gib=table.states_gib[:, rows])
    assert np.array_equal(own.states_gib, reused.states_gib)
    assert np.array_equal(own.rest_gib, reused.rest_gib)
    # the dropped grids (with micro-batch sizes): no ZeRO stage the stack runs leaves room for the states
    dropped = np.flatnonzero(~kept & (table.pair_start[table.parent + 1] > table.pair_start[table.parent]))
    one = from_columns(**{name: grids[dropped, j] for j, name in enumerate(
        ("G_data", "G_inter", "G_intra_d", "G_intra_r", "G_intra_c", "G_cp", "G_ep", "G_etp"))})
    states = states_bound(model, cluster, training, one, zero_opts)
    runs = C.stack_runs_masks(training, one.G_inter, zero_opts, rc_opts, sps)[0]
    has = np.asarray([(z == 0) | (one.G_data > 1) for z in zero_opts])
    least = np.min(np.where(runs & has, states.states_gib, np.inf), axis=0)
    assert len(dropped) and (least > states.capacity_gib).all()


@pytest.mark.parametrize("name,gpus,stack,cp", [("deepseek-v3", 1024, "gridtune", None),
                                                ("deepseek-v3", 1024, "megatron-core", (1, 2)),
                                                ("mixtral-8x7b", 256, "gridtune", (1, 2, 4))])
def test_the_grid_table_bounds_siblings_as_the_general_path(name, gpus, stack, cp):
    """A mixture of experts' grid table bounds its grids by parent and by expert layout
    (`perfmodels.sibling_bounds`): the same time bounds and states, to the bit, as
    `bounds.grid_bound_s` and `bounds.states_bound` work out on the grids' own rows, context-parallel
    degrees apart in their views."""
    model, cluster = presets.model(name), presets.cluster("eos", gpus)
    training = Training(global_batch_size=4096, stack=stack)
    options = SearchOptions(G_cp=cp)
    grids, _ = S._valid_grids(model, cluster, training, options, S._Pruned(0))
    orders = S.stack_placements(training, placements(options, with_cp=cp is not None, moe=True), pinned=False,
                                model=model)
    table = grid_table(model, cluster, training, grids, options, orders)
    sched_opts, _, zero_opts, sp_opts = table.options
    gi = np.flatnonzero(np.isfinite(table.bound_s))
    par = table.parent[gi]
    assert len(np.unique(grids[gi, 5])) == (1 if cp is None else len(cp))
    assert len(gi) > 2 * len(np.unique(par))  # siblings: several expert layouts per parent
    low = from_columns(**{name: grids[gi, j] for j, name in enumerate(
        ("G_data", "G_inter", "G_intra_d", "G_intra_r", "G_intra_c", "G_cp", "G_ep", "G_etp"))},
        micro_batch_size=table.pair_micro_batch[table.pair_start[par]],
        zero_stage=np.where(grids[gi, 0] > 1, max(zero_opts), 0))
    high = low.with_columns(micro_batch_size=table.pair_micro_batch[table.pair_start[par + 1] - 1])
    v = np.max(np.where(table.runs[par], [s[1] if s[0] == 2 else 1 for s in sched_opts], 1), axis=1)
    general = grid_bound_s(model, cluster, training, low, high, v, [bool(x) for x in sp_opts])
    assert np.array_equal(table.bound_s[gi], general)
    states = states_bound(model, cluster, training, low, zero_opts).states_gib
    assert np.array_equal(table.states_gib[:, gi], states)
