"""Named constraints: each looks at columns of plans and says which ones it rejects, and why.

The rules themselves (what divides what) live in `perfmodels/rules.py`, shared with
`perfmodels.specs.combination_problems` and `validation/candidates.py`; a constraint here applies one
to columns of plans and words the reason.

A constraint is a pure function `(model, cluster, training, cols) -> (rejected_mask, reason, example)`
where `reason` is the key counted in `Recommendation.pruned` (it names the fields and the fixed
values, e.g. "G_intra_r does not divide model.num_attention_heads=12") and `example(i)` renders
one rejected plan's specifics ("G_intra_r=16 does not divide model.num_attention_heads=12").
Grid-level constraints run before options are expanded; plan-level ones after; memory last,
from the model's prediction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfmodels import rules
from perfmodels.plans import RECOMPUTE_CODE, SCHEDULE_CODE
from perfmodels.specs import GRID5_FIELDS, Cluster, Model, Training
from perfmodels.stacks import can_run, can_run_context_expert

Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class Rejection:
    mask: np.ndarray
    reason: str
    example: Callable[[int], str]


def _grid_str(cols: Columns, i: int) -> str:
    """The degrees of plan i: the five AxoNN ones, then G_cp, G_ep and G_etp where they are set."""
    out = " ".join(f"{name}={cols[name][i]}" for name in GRID5_FIELDS)
    for name in ("G_cp", "G_ep"):
        if name in cols and cols[name][i] != 1:
            out += f" {name}={cols[name][i]}"
    if "G_etp" in cols and cols["G_etp"][i] > 0:
        out += f" G_etp={cols['G_etp'][i]}"
    return out


def _none(n: int) -> Rejection:
    """Rejects nothing (a rule that does not apply to this model)."""
    return Rejection(np.zeros(n, bool), "", lambda i: "")


def heads_split(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    r = cols["G_intra_r"]
    if model.kind != "transformer":  # a layer list splits each Linear only where it divides
        return _none(len(r))
    a = model.num_attention_heads
    return Rejection(~rules.heads_split(a, r), f"G_intra_r does not divide model.num_attention_heads={a}",
                     lambda i: f"G_intra_r={r[i]} does not divide model.num_attention_heads={a}")


def query_groups_split(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    r = cols["G_intra_r"]
    if model.kind != "transformer":  # a layer list splits each Linear only where it divides
        return _none(len(r))
    g = int(model.num_query_groups)
    stack = training.effective_stack
    if stack.tp_splits_query_groups:  # perfmodels/launchable.py cites the framework line
        return Rejection(~rules.query_groups_split_exact(g, r),
                         f"G_intra_r does not divide model.num_query_groups={g} (the {stack.name} stack "
                         "splits the key/value groups)",
                         lambda i: f"G_intra_r={r[i]} does not divide model.num_query_groups={g}")
    return Rejection(~rules.query_groups_split(g, r),
                     f"G_intra_r and model.num_query_groups={g} do not divide each other",
                     lambda i: f"G_intra_r={r[i]} and model.num_query_groups={g} do not divide each other")


def hidden_split(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    r, c = cols["G_intra_r"], cols["G_intra_c"]
    if model.kind != "transformer":  # a layer list splits each Linear only where it divides
        return _none(len(r))
    h, f = model.hidden_size, int(model.ffn_hidden_size)
    bad = ~rules.hidden_split(h, r, c) | ~rules.hidden_split(f, r, c)
    return Rejection(
        bad,
        f"G_intra_r*G_intra_c does not divide model.hidden_size={h} and ffn_hidden_size={f}",
        lambda i: (
            f"G_intra_r*G_intra_c={r[i] * c[i]} does not divide model.hidden_size={h} "
            f"and model.ffn_hidden_size={f}"
        ),
    )


def enough_layers(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    layers = model.depth
    stages = cols["G_inter"]
    virtual = cols.get("virtual_stages", np.ones_like(stages))
    return Rejection(
        ~rules.enough_layers(layers, stages, virtual),
        f"G_inter*virtual_stages exceeds model.num_layers={layers}",
        lambda i: f"G_inter*virtual_stages={stages[i] * virtual[i]} exceeds model.num_layers={layers}",
    )


def batch_split(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    d, dd = cols["G_data"], cols["G_intra_d"]
    gb = training.global_batch_size
    return Rejection(
        ~rules.batch_split(gb, d, dd),
        f"G_data*G_intra_d does not divide training.global_batch_size={gb}",
        lambda i: f"G_data*G_intra_d={d[i] * dd[i]} does not divide training.global_batch_size={gb}",
    )


def enough_microbatches(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """1F1B-style schedules need at least one micro-batch per stage (torch.distributed.pipelining
    refuses fewer); interleaving needs a multiple of the stage count."""
    S = cols["G_inter"]
    m = rules.num_microbatches(
        training.global_batch_size, cols["G_data"], cols["G_intra_d"], cols["micro_batch_size"]
    )
    sched = cols["schedule"]
    too_few = (S > 1) & (sched != SCHEDULE_CODE["gpipe"]) & ~rules.enough_microbatches(m, S)
    not_multiple = (S > 1) & (sched == SCHEDULE_CODE["interleaved-1f1b"]) & ~rules.interleave_fits(m, S)

    def example(i: int) -> str:
        name = "interleaved-1f1b" if sched[i] == SCHEDULE_CODE["interleaved-1f1b"] else "1f1b"
        if too_few[i]:
            return f"{name}: {m[i]} micro-batches < G_inter={S[i]} stages"
        return f"{name}: {m[i]} micro-batches is not a multiple of G_inter={S[i]} stages"

    return Rejection(
        too_few | not_multiple,
        "1f1b/interleaved need num_microbatches >= G_inter (interleaved: a multiple of it)",
        example,
    )


def sequence_parallel_shape(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    sp = cols["sequence_parallel"].astype(bool)
    shape_ok = rules.sequence_parallel_has_rows(cols["G_intra_r"]) & rules.sequence_parallel_row_only(
        cols["G_intra_d"], cols["G_intra_c"])
    return Rejection(sp & ~shape_ok, "sequence_parallel needs G_intra_r > 1 and G_intra_c = G_intra_d = 1",
                     lambda i: f"sequence_parallel with {_grid_str(cols, i)}")


def gpipe_dominated(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """GPipe takes the same time as 1F1B and keeps all micro-batches in flight: never better.
    Only applied when 1F1B is also in the search (a user who pins gpipe gets it)."""
    bad = cols["schedule"] == SCHEDULE_CODE["gpipe"]
    return Rejection(bad, "gpipe is dominated by 1f1b (same time, more activation memory)",
                     lambda i: f"gpipe with {_grid_str(cols, i)}")


def selective_without_scores(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """Megatron's selective recomputation drops the s x s attention scores (Korthikanti et al.);
    with flash attention none are stored, so it only adds recomputation time: never better than none.
    A stack whose selective policy is per-op (torchtitan) saves other activations, so it stays."""

    stack = training.effective_stack
    pointless = (
        stack.flash_attention and stack.selective_recompute == "attention-core"
        and any(unit.attention for unit in model.units)
        and not model.is_moe  # Megatron's MoE recipes recompute the MoE layers (perfmodels.experts)
    )
    bad = (cols["recompute"] == RECOMPUTE_CODE["selective"]) & bool(pointless)
    return Rejection(bad, "selective recompute saves nothing with flash attention (no s x s scores stored)",
                     lambda i: f"selective recompute with {_grid_str(cols, i)}")


def stack_can_run(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """Only layouts the training stack implements (`Stack.schedules`, `zero_stages`, which tensor
    parallelism, pipelines, sequence parallelism): `--stack fsdp` ranks FSDP layouts only."""
    from perfmodels.specs import SCHEDULES

    stack = training.effective_stack
    names = np.asarray(SCHEDULES)[cols["schedule"]]
    n = len(cols["G_data"])
    ok = can_run(stack, G_inter=cols["G_inter"], G_intra_r=cols["G_intra_r"], G_intra_c=cols["G_intra_c"],
                 G_intra_d=cols["G_intra_d"], schedule_names=names, zero_stage=cols["zero_stage"],
                 sequence_parallel=cols.get("sequence_parallel", np.zeros(n, bool)))
    return Rejection(~ok, f"the {stack.name} stack does not run this layout",
                     lambda i: f"{stack.name} cannot run {_grid_str(cols, i)} schedule={names[i]} "
                               f"zero_stage={cols['zero_stage'][i]}")


def context_split(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """Context parallelism cuts each sequence into 2*G_cp chunks (causal load balancing)."""
    cp = cols.get("G_cp", np.ones_like(cols["G_data"]))
    if model.kind != "transformer":
        return Rejection(cp > 1, "G_cp applies to transformers", lambda i: f"G_cp={cp[i]} on a layer list")
    s = model.seq_length
    return Rejection(~rules.context_split(s, cp),
                     f"G_cp larger than model.seq_length={s} allows (2*G_cp must "
                     "divide it)", lambda i: f"G_cp={cp[i]}: 2*G_cp={2 * cp[i]} does not divide "
                     f"model.seq_length={s}")


def _expert_degrees(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """(G_ep, G_etp) per plan; a G_etp column of 0 (Plan.G_etp None) is Megatron-Core's default, the
    tensor-parallel size G_intra_r."""
    n = len(cols["G_data"])
    etp = cols.get("G_etp", np.zeros(n, np.int64))
    return cols.get("G_ep", np.ones(n, np.int64)), np.where(etp > 0, etp, cols["G_intra_r"])


def experts_split(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """G_ep divides the expert count; a dense model has G_ep = 1."""
    ep = cols.get("G_ep", np.ones_like(cols["G_data"]))
    if not model.is_moe:
        return Rejection(~rules.dense_without_experts(False, ep), "G_ep > 1 needs a mixture-of-experts model",
                         lambda i: f"G_ep={ep[i]} on a model without experts")
    E = int(model.num_moe_experts)
    return Rejection(~rules.experts_split(E, ep), f"G_ep does not divide model.num_moe_experts={E}",
                     lambda i: f"G_ep={ep[i]} does not divide model.num_moe_experts={E}")


def expert_grid_fits(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """MoE parallel folding: G_etp * G_ep divides the ranks of a pipeline stage."""
    n = len(cols["G_data"])
    if not model.is_moe:
        return _none(n)
    ep, etp = _expert_degrees(cols)
    stage = (cols["G_data"] * cols["G_intra_d"] * cols["G_intra_r"] * cols["G_intra_c"]
             * cols.get("G_cp", np.ones(n, np.int64)))
    return Rejection(~rules.expert_grid_fits(stage, ep, etp),
                     "G_etp*G_ep does not divide the ranks of a pipeline stage (world / G_inter)",
                     lambda i: f"G_etp*G_ep={etp[i]}*{ep[i]} does not divide the {stage[i]} ranks of a stage")


def stack_runs_context_expert(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """Context and expert parallelism only where the stack runs them (`Stack.context_parallel`,
    `Stack.expert_parallel`)."""
    stack = training.effective_stack
    n = len(cols["G_data"])
    cp = cols.get("G_cp", np.ones(n, np.int64))
    ep, etp = _expert_degrees(cols)
    if not model.is_moe:
        etp = np.ones(n, np.int64)
    ok = can_run_context_expert(stack, G_cp=cp, G_ep=ep, expert_tp=etp)
    return Rejection(~ok, f"the {stack.name} stack does not run this context or expert parallelism",
                     lambda i: f"{stack.name} cannot run G_cp={cp[i]} G_ep={ep[i]} G_etp={etp[i]}")


def stack_layer_split(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """The layers split over G_inter x virtual_stages the way the stack's launcher cuts them
    (`Stack.pipeline_layer_split`; perfmodels/launchable.py cites Megatron's and torchtitan's lines)."""
    stack = training.effective_stack
    S = cols["G_inter"]
    v = cols.get("virtual_stages", np.ones_like(S))
    L = model.depth
    ok = np.asarray(rules.layer_split(stack.pipeline_layer_split, L, S, v), bool) | (S == 1)
    return Rejection(~ok, f"model.num_layers={L} does not split over G_inter*virtual_stages as the "
                          f"{stack.name} stack cuts layers",
                     lambda i: f"{stack.name}: {L} layers over G_inter*virtual_stages={S[i]}*{v[i]}")


def stack_zero_stages(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """Only the ZeRO stages the stack's launcher offers (`Stack.launch_zero_stages`: megatron-core's
    pretrain_gpt.py has no ZeRO-2), and with a pipeline only those its pipeline allows
    (`Stack.pipeline_max_zero_stage`: DeepSpeed's pipeline engine asserts ZeRO < 2)."""
    stack = training.effective_stack
    z, S = cols["zero_stage"], cols["G_inter"]
    offered = stack.launch_zero_stages or stack.zero_stages
    not_offered = ~np.isin(z, offered)
    bad_pipe = ~rules.pipeline_zero(S, z, stack.pipeline_max_zero_stage)

    def example(i: int) -> str:
        if not_offered[i]:
            return f"{stack.name} launches ZeRO stages {list(offered)}, not {z[i]}"
        most = stack.pipeline_max_zero_stage
        return f"{stack.name} pipeline with G_inter={S[i]} allows ZeRO <= {most}, not {z[i]}"

    return Rejection(not_offered | bad_pipe,
                     f"the {stack.name} stack's launcher does not start this ZeRO stage (with this pipeline)",
                     example)


def sequence_parallel_seq(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """Sequence parallelism splits a rank's sequence evenly over the row ranks
    (`rules.sequence_parallel_seq_split`)."""
    sp = cols["sequence_parallel"].astype(bool)
    r = cols["G_intra_r"]
    if model.kind != "transformer":
        return _none(len(r))
    cp = cols.get("G_cp", np.ones_like(r))
    s = model.seq_length
    bad = sp & ~rules.sequence_parallel_seq_split(s, r, cp)
    return Rejection(bad, f"sequence_parallel needs G_intra_r*G_cp to divide model.seq_length={s}",
                     lambda i: f"sequence_parallel with G_intra_r={r[i]} does not split model.seq_length={s}")


def stack_recompute(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """Only the recomputation modes the stack's launcher offers (`Stack.launch_recomputes`: DeepSpeed,
    LLM Foundry and the engine checkpoint whole blocks, not Megatron's selective core)."""
    stack = training.effective_stack
    modes = stack.launch_recomputes or tuple(RECOMPUTE_CODE)
    rc = cols["recompute"]
    names = {code: name for name, code in RECOMPUTE_CODE.items()}
    bad = ~np.isin(rc, [RECOMPUTE_CODE[m] for m in modes])
    return Rejection(bad, f"the {stack.name} stack's launcher recomputes only {', '.join(modes)}",
                     lambda i: f"{stack.name} has no recompute={names[int(rc[i])]}")


def stack_runs_options(training: Training, G_inter: np.ndarray, zero_stages: list[int], recomputes: list[int],
                       sequence_parallel: list[bool]) -> np.ndarray:
    """(Z, R, P, n): whether any plan of each grid (its `G_inter`) with that ZeRO stage, recomputation
    and sequence-parallel setting can pass `stack_can_run`, `stack_zero_stages` and `stack_recompute`,
    whatever its other columns. False means one of them rejects every such plan: the bounded search
    leaves those options out of a family's bound (tests/tuner/test_bounded_search.py checks it)."""
    zero, rc, sp = stack_runs_masks(training, G_inter, zero_stages, recomputes, sequence_parallel)
    return zero[:, None, None, :] & rc[None, :, None, None] & sp[None, None, :, None]


def stack_runs_masks(training: Training, G_inter: np.ndarray, zero_stages: list[int], recomputes: list[int],
                     sequence_parallel: list[bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`stack_runs_options` as its three factors: (Z, n) ZeRO stages per grid, (R,) recomputations,
    (P,) sequence-parallel settings; an option runs where all three allow it."""
    stack = training.effective_stack
    S = np.asarray(G_inter)
    offered = stack.launch_zero_stages or stack.zero_stages
    zero = np.stack([(int(z) in stack.zero_stages and int(z) in offered)
                     & rules.pipeline_zero(S, z, stack.pipeline_max_zero_stage)
                     for z in zero_stages])  # (Z, n)
    runs = {RECOMPUTE_CODE[m] for m in stack.launch_recomputes or tuple(RECOMPUTE_CODE)}
    rc = np.asarray([int(r) in runs for r in recomputes], dtype=bool)  # (R,)
    sp = np.asarray([stack.sequence_parallel or not x for x in sequence_parallel])  # (P,)
    return zero, rc, sp


def stack_tp_with_pp(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """Tensor and pipeline parallelism together only where the stack's launcher runs both
    (`Stack.launch_tp_with_pp`: plain DeepSpeed's AutoTP does not go with its pipeline engine)."""
    stack = training.effective_stack
    r, S = cols["G_intra_r"], cols["G_inter"]
    bad = (r > 1) & (S > 1) & (not stack.launch_tp_with_pp)
    return Rejection(bad, f"the {stack.name} stack runs tensor or pipeline parallelism, not both",
                     lambda i: f"{stack.name}: G_intra_r={r[i]} with G_inter={S[i]}")


def expert_weights_fit(model: Model, cluster: Cluster, training: Training, cols: Columns) -> Rejection:
    """The routed experts' 16-bit weights a rank holds (E / G_ep experts over G_etp, in the mean
    stage's MoE layers; sharded over the expert-data ranks too where the stack has ZeRO-3) already
    exceed the GPU's memory: no option of the plan can fit it."""
    n = len(cols["G_data"])
    if not model.is_moe:
        return _none(n)
    ep, etp = _expert_degrees(cols)
    layers = model.num_layers * model.moe_fraction / cols["G_inter"]
    local = layers * float(model.num_moe_experts) / ep * model.expert_params / etp
    if 3 in training.effective_stack.zero_stages:
        stage = cols["G_data"] * cols["G_intra_d"] * cols["G_intra_r"] * cols["G_intra_c"] * cols.get(
            "G_cp", np.ones(n, np.int64))
        local = local / np.maximum(stage // np.maximum(ep * etp, 1), 1)
    gib = local * 2.0 / (1 << 30)
    capacity = float(cluster.gpu.memory_gib)
    return Rejection(gib > capacity, f"the routed experts' 16-bit weights alone exceed the {capacity:g} GiB "
                     "of a GPU", lambda i: f"G_ep={ep[i]} G_etp={etp[i]} G_inter={cols['G_inter'][i]}: "
                     f"{gib[i]:.0f} GiB of expert weights per GPU")


EXPERT_GRID_CONSTRAINTS = (expert_weights_fit,)
"""Applied to grids once their expert degrees are set, on columns of shape (grids, expert pairs)
before the rows are made (`tuner.search._valid_grids`): element-wise rules only."""
GRID_CONSTRAINTS = (heads_split, query_groups_split, hidden_split, batch_split, context_split, enough_layers)
"""Applied to the degree grids before anything else; `enough_layers` with one virtual stage (no
schedule puts fewer than one block on a stage), again per schedule in PLAN_CONSTRAINTS."""
SCHEDULE_LEVEL = frozenset({"enough_layers", "enough_microbatches", "stack_layer_split", "stack_tp_with_pp",
                            "experts_split", "expert_grid_fits", "stack_runs_context_expert",
                            "gpipe_dominated"})
"""Plan constraints that read only the grid, expert degrees, micro-batch size, schedule and virtual
stages (tests/tuner/test_bounded_search.py checks which columns each reads): the bounded search
applies them to (family, schedule) rows before it expands recomputation, ZeRO and sequence
parallelism."""
READS_MICRO_BATCH = frozenset({"enough_microbatches"})
"""The schedule-level constraints that read the micro-batch size: the others are applied once per
(grid, schedule), before micro-batch sizes are enumerated."""
PLAN_CONSTRAINTS = (enough_layers, enough_microbatches, sequence_parallel_shape, stack_can_run,
                    stack_layer_split, stack_zero_stages, stack_recompute, stack_tp_with_pp,
                    sequence_parallel_seq, experts_split, expert_grid_fits, stack_runs_context_expert)


def out_of_memory(needed_gib: np.ndarray, capacity_gib: float) -> Rejection:
    bad = needed_gib > capacity_gib
    return Rejection(bad, f"needs more memory per GPU than the {capacity_gib:g} GiB available",
                     lambda i: f"needs {needed_gib[i]:.1f} GiB per GPU > {capacity_gib:g} GiB")
