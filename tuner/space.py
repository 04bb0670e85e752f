"""The layout search space: every ordered factorization of the GPU count into the five grid
degrees, times micro-batch sizes, schedules (with virtual stages), recomputation, ZeRO stages and
placements. Generated as numpy columns, never as Python objects per plan.

Grid degrees are not restricted to powers of two. Options expand per grid only where they mean
something: schedules and virtual stages only with G_inter > 1, ZeRO stages only with G_data > 1,
an alternative placement only when the axis it moves innermost has degree > 1 (otherwise it is
the default placement again).

Context parallelism (G_cp) is searched only where the sequence is long enough for it to matter
(`CP_MIN_SEQUENCE`, the shortest sequence NeMo's long-context recipes split) and the stack runs it,
or where the user pins it; a dense model at G_cp = 1 sees exactly the space it always had. Expert
parallelism is searched for mixture-of-experts models only: G_ep over the divisors of the expert
count and G_etp over Megatron-Core's default (the tensor-parallel size) and 1, the pairs that
divide a pipeline stage's ranks (pinned values are kept, so a rule can say why they fail).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from perfmodels.plans import RECOMPUTE_CODE, SCHEDULE_CODE
from perfmodels.specs import AXES, AXIS_FIELDS, DEGREE_FIELDS, Model, Training
from tuner.types import SearchOptions

GRID_COLUMNS = DEGREE_FIELDS
EXPERT_COLUMNS = ("G_ep", "G_etp")
"""Columns a grid gains for mixture-of-experts layers (after the six degrees); G_etp 0 = default."""
CP_MIN_SEQUENCE = 16384
"""Shortest sequence for which the search tries context parallelism unprompted: below it a sample's
attention is too short for splitting it to beat tensor or data parallelism (NeMo's long-context
recipes start CP at 16k tokens: Llama-3 8B 16k runs CP 2)."""
MAX_CP = 64
"""Largest context-parallel degree tried unprompted."""
MAX_VIRTUAL_STAGES = 8
CHUNK_PLANS = 250_000  # plans scored per batch: large enough to amortise, small enough for memory


def divisors(n: int) -> list[int]:
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def factorizations(n: int, parts: int = 5) -> np.ndarray:
    """All ordered `parts`-tuples of positive integers whose product is n, shape (k, parts), read-only
    (kept between calls: a service worker answers many questions about the same GPU counts)."""
    return _factorizations(int(n), int(parts))


@functools.lru_cache(maxsize=64)
def _factorizations(n: int, parts: int) -> np.ndarray:
    divs = divisors(n)
    out: list[tuple[int, ...]] = []

    def rec(prefix: tuple[int, ...], rest: int) -> None:
        if len(prefix) == parts - 1:
            out.append((*prefix, rest))
            return
        for d in divs:
            if d > rest:
                break
            if rest % d == 0:
                rec((*prefix, d), rest // d)

    rec((), n)
    table = np.asarray(out, dtype=np.int64).reshape(-1, parts)
    table.setflags(write=False)
    return table


MEGATRON_ORDER = ("col", "row", "cp", "depth", "data", "inter")
"""Megatron-Core's rank order (tp-cp-ep-dp innermost, the pipeline outermost): searched for
mixture-of-experts models, whose expert groups stay on consecutive ranks only with it."""


def placements(options: SearchOptions, with_cp: bool = False, moe: bool = False) -> list[tuple[str, ...]]:
    """The default order plus, for each other axis, the order that puts it innermost ("cp" only
    when the search holds context-parallel grids: otherwise that order is the default one), and
    for a mixture of experts Megatron's order (`MEGATRON_ORDER`)."""
    if options.placement is not None:
        return [tuple(p) for p in options.placement]
    orders = [AXES]
    for axis in AXES[1:]:
        if axis == "cp" and not with_cp:
            continue
        orders.append((axis, *[a for a in AXES if a != axis]))
    if moe:
        orders.append(MEGATRON_ORDER)
    return orders


def cp_options(model: Model, training: Training, options: SearchOptions, num_gpus: int) -> tuple[int, ...]:
    """Context-parallel degrees to search: the pins, or 1, or, for a transformer whose sequence is
    at least `CP_MIN_SEQUENCE` long on a stack that runs context parallelism, every divisor of the
    GPU count up to `MAX_CP` that splits the sequence into 2*G_cp chunks."""
    if options.G_cp is not None:
        return tuple(sorted(set(options.G_cp)))
    if (model.kind != "transformer" or model.seq_length < CP_MIN_SEQUENCE
            or not training.effective_stack.context_parallel):
        return (1,)
    return tuple(d for d in divisors(num_gpus) if (d <= MAX_CP and model.seq_length % (2 * d) == 0) or d == 1)


def expert_rows(model: Model, grids: np.ndarray, options: SearchOptions) -> np.ndarray:
    """The grids (six degree columns) with a G_ep and a G_etp column: (1, 0) for a dense model
    unless pinned, else every (G_ep, G_etp) pair of the search (see the module docstring), each
    grid's pairs in a row (`tuner.families.grid_parents` relies on it)."""
    return expert_table(grids, *expert_candidates(model, grids, options))


def expert_candidates(model: Model, grids: np.ndarray, options: SearchOptions
                      ) -> tuple[np.ndarray, np.ndarray]:
    """((P, 2) the (G_ep, G_etp) pairs of the search, (grids, P) which pairs each grid may take):
    `expert_rows` before its rows are made, so rules can drop some first (`expert_table`)."""
    if not model.is_moe:
        eps = options.G_ep or (1,)
        etps = options.G_etp or (0,)
    else:
        eps = options.G_ep or tuple(divisors(int(model.num_moe_experts)))
        etps = options.G_etp or (0, 1)
    pairs = np.asarray([(e, t) for e in eps for t in etps], dtype=np.int64).reshape(-1, 2)
    keep = np.ones((len(grids), len(pairs)), dtype=bool)
    if model.is_moe and options.G_ep is None:  # pinned degrees stay, so a rule can say why they fail
        tp = grids[:, GRID_COLUMNS.index("G_intra_r")][:, None]
        etp = np.where(pairs[None, :, 1] > 0, pairs[None, :, 1], tp)
        world = np.prod(grids[:, : len(GRID_COLUMNS)], axis=1)
        stage = (world // grids[:, GRID_COLUMNS.index("G_inter")])[:, None]
        keep = stage % (pairs[None, :, 0] * etp) == 0
        # G_etp=1 where the tensor-parallel size is 1 is the default again
        keep &= ~((pairs[None, :, 1] == 1) & (tp == 1) & (options.G_etp is None))
    return pairs, keep


def expert_table(grids: np.ndarray, pairs: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The rows of `expert_rows` that `keep` (grids, pairs) holds: grid-major, each grid's pairs in a
    row. Stored column by column (a Fortran-ordered array): the search reads the table a column at a
    time, over tens of thousands of rows for a mixture of experts, and a strided column costs several
    times a contiguous one."""
    grid, pair = np.divmod(np.flatnonzero(keep), len(pairs))
    columns = np.empty((grids.shape[1] + 2, len(grid)), dtype=np.int64)
    for j, values in enumerate((*grids.T, *pairs.T)):
        np.take(np.ascontiguousarray(values), grid if j < grids.shape[1] else pair, out=columns[j])
    return columns.T


@dataclass(frozen=True)
class Expansion:
    """Plans as columns (one placement), plus how many option combinations each grid produced."""

    columns: dict[str, np.ndarray]
    placement: tuple[str, ...]


def _allowed(values: tuple | None, column: np.ndarray) -> np.ndarray:
    if values is None:
        return np.ones(column.shape, dtype=bool)
    return np.isin(column, np.asarray(values))


def grid_rows(num_gpus: int, options: SearchOptions, cp_values: tuple[int, ...] = (1,)
              ) -> tuple[np.ndarray, np.ndarray]:
    """Factorizations of num_gpus into the six degrees (G_cp over `cp_values`, the five others
    every way) and the mask of those that respect the pins."""
    parts = []
    for cp in cp_values:
        if num_gpus % cp:
            continue
        five = factorizations(num_gpus // cp)
        parts.append(np.concatenate([five, np.full((len(five), 1), cp, dtype=np.int64)], axis=1))
    grids = np.concatenate(parts) if parts else np.zeros((0, len(GRID_COLUMNS)), dtype=np.int64)
    mask = np.ones(len(grids), dtype=bool)
    for j, name in enumerate(GRID_COLUMNS):
        mask &= _allowed(getattr(options, name), grids[:, j])
    return grids, mask


def placement_signature(grids: np.ndarray, placement: tuple[str, ...]) -> np.ndarray:
    """An integer per grid encoding the placement restricted to axes of degree > 1.

    Plans with equal signatures put every group on the same links, so only the first placement
    that produces a signature is evaluated."""
    index = {name: j for j, name in enumerate(AXIS_FIELDS)}  # the axes in GRID_COLUMNS order
    sig = np.zeros(len(grids), dtype=np.int64)
    for axis in placement:
        j = index[axis]
        sig = np.where(grids[:, j] > 1, sig * 7 + j + 1, sig)
    return sig


def first_placement_mask(grids: np.ndarray, placement: tuple[str, ...],
                         all_placements: list[tuple[str, ...]]) -> np.ndarray:
    """Grids whose placement `placement` puts some group on other links than every earlier one."""
    return first_placement_masks(grids, all_placements[: all_placements.index(placement) + 1])[-1]


def first_placement_masks(grids: np.ndarray, all_placements: list[tuple[str, ...]]) -> np.ndarray:
    """(placements, grids): `first_placement_mask` of every placement, each signature computed once."""
    sigs = [placement_signature(grids, order) for order in all_placements]
    out = np.ones((len(all_placements), len(grids)), dtype=bool)
    for p in range(1, len(all_placements)):
        for q in range(p):
            out[p] &= sigs[q] != sigs[p]
    return out


def expand_options(model: Model, training: Training, grids: np.ndarray, options: SearchOptions,
                   placement: tuple[str, ...], all_placements: list[tuple[str, ...]]) -> Iterator[Expansion]:
    """Yield the option combinations of the surviving grids, chunked by micro-batch size.

    Chunking keeps peak memory bounded on huge GPU counts and lets the caller stop at its time
    budget after any chunk.
    """
    if len(grids) == 0:
        return
    if placement != all_placements[0]:
        grids = grids[first_placement_mask(grids, placement, all_placements)]
        if len(grids) == 0:
            return
    if grids.shape[1] == len(GRID_COLUMNS):  # not yet expanded by the expert degrees
        grids = expert_rows(model, grids, options)
    if len(grids) == 0:
        return
    per_replica = training.global_batch_size // (grids[:, 0] * grids[:, 2])
    sched_opts, rc_opts, zero_opts, sp_opts = option_lists(training, options)
    layers = model.depth

    mb_values = micro_batch_values(options)
    pending: list[dict[str, np.ndarray]] = []
    size = 0
    # a transformer's repeated block is evaluated once per batch, an explicit layer list layer by layer:
    # smaller batches keep the time budget honest
    chunk = max(2_000, CHUNK_PLANS // max(1, len(model.layers) // 4))
    for mb in mb_values:
        ok = per_replica % mb == 0
        if not ok.any():
            continue
        cols = combine(grids[ok], mb, sched_opts, rc_opts, zero_opts, sp_opts, layers, uneven=model.is_moe)
        if cols is None:
            continue
        pending.append(cols)
        size += len(cols["G_data"])
        if size >= chunk:
            yield Expansion(columns=_concat(pending), placement=placement)
            pending, size = [], 0
    if pending:
        yield Expansion(columns=_concat(pending), placement=placement)


def option_lists(training: Training, options: SearchOptions
                 ) -> tuple[list[tuple[int, int]], list[int], list[int], list[bool]]:
    """The option values every grid is expanded over: (schedule code, virtual stages) pairs,
    recompute codes, ZeRO stages and sequence-parallel settings."""
    sched_opts: list[tuple[int, int]] = []
    allowed_sched = options.schedule or ("gpipe", "1f1b", "interleaved-1f1b")
    for name in allowed_sched:
        if name == "interleaved-1f1b":
            vs = options.virtual_stages or tuple(range(2, MAX_VIRTUAL_STAGES + 1))
            sched_opts.extend((SCHEDULE_CODE[name], int(v)) for v in vs if v > 1)
        else:
            sched_opts.append((SCHEDULE_CODE[name], 1))
    rc_opts = [RECOMPUTE_CODE[r] for r in (options.recompute or ("none", "selective", "full"))]
    zero_opts = list(options.zero_stage or (0, 1, 2, 3))
    # sequence parallelism is searched where the stack has it (Megatron's, torchtitan's)
    sp_opts = list(options.sequence_parallel or ((False, True) if training.effective_stack.sequence_parallel
                                                 else (False,)))
    return sched_opts, rc_opts, zero_opts, sp_opts


def micro_batch_values(options: SearchOptions) -> list[int]:
    if options.micro_batch_size is not None:
        return sorted(set(options.micro_batch_size))
    return list(range(1, options.max_micro_batch_size + 1))


def schedule_mask(G_inter: np.ndarray, sched_opts: list[tuple[int, int]], layers: int,
                  uneven: bool) -> np.ndarray:
    """(grids x schedule options): which schedules each grid runs. With one stage only the plain
    1F1B entry survives (the first option when 1F1B is not allowed); virtual stages must divide the
    layers (`uneven`: only not outnumber them, see `combine`)."""
    stages, which = np.unique(G_inter, return_inverse=True)
    if len(stages) < len(G_inter):  # worked out once per distinct stage count
        return schedule_mask(stages, sched_opts, layers, uneven)[which]
    sched = np.asarray(sched_opts, dtype=np.int64)
    one_stage = G_inter == 1
    valid = np.ones((len(G_inter), len(sched)), dtype=bool)
    is_plain_1f1b = (sched[:, 0] == SCHEDULE_CODE["1f1b"]) & (sched[:, 1] == 1)
    if not is_plain_1f1b.any():
        is_plain_1f1b = np.zeros(len(sched), dtype=bool)
        is_plain_1f1b[0] = True
    valid[one_stage] = is_plain_1f1b[None, :]
    v = sched[:, 1][None, :]
    even = (layers % (G_inter[:, None] * v)) == 0
    valid &= (v == 1) | (even if not uneven else layers >= G_inter[:, None] * v)
    return valid


def plans_per_grid(grids: np.ndarray, sched_opts: list[tuple[int, int]], rc_opts: list[int],
                   zero_opts: list[int], sp_opts: list[bool], layers: int, uneven: bool) -> np.ndarray:
    """How many plans `combine` makes of each grid (for one micro-batch size), without making them."""
    n_sched = schedule_mask(grids[:, 1], sched_opts, layers, uneven).sum(axis=1)
    n_zero = np.where(grids[:, 0] > 1, len(zero_opts), sum(1 for z in zero_opts if z == 0))
    return n_sched * len(rc_opts) * n_zero * len(sp_opts)


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def combine(
    g: np.ndarray,
    mb: int | np.ndarray,
    sched_opts: list[tuple[int, int]],
    rc_opts: list[int],
    zero_opts: list[int],
    sp_opts: list[bool],
    layers: int,
    uneven: bool = False,
) -> dict[str, np.ndarray] | None:
    """The plans of grids `g` at micro-batch size `mb` (one for all, or one per grid row): every
    (schedule, recompute, ZeRO, sequence-parallel) combination each grid runs. `uneven`: interleave
    virtual stages that do not divide the layers evenly (mixture-of-experts
    models: Megatron-Core's MoE recipes place their layers with `pipeline_model_parallel_layout`,
    e.g. DeepSeek-V3's 61 layers over 8 x 4 chunks); otherwise only where they divide."""
    G_data = g[:, 0]
    sched = np.asarray(sched_opts, dtype=np.int64)  # (s, 2)
    valid_sched = schedule_mask(g[:, 1], sched_opts, layers, uneven)
    gi, si = np.nonzero(valid_sched)
    zero = np.asarray(zero_opts, dtype=np.int64)
    rc = np.asarray(rc_opts, dtype=np.int64)
    sp = np.asarray(sp_opts, dtype=bool)
    # cartesian product of (grid, schedule) x recompute x zero x sp
    k = len(gi)
    idx_rc = np.repeat(np.arange(len(rc)), len(zero) * len(sp))
    idx_z = np.tile(np.repeat(np.arange(len(zero)), len(sp)), len(rc))
    idx_sp = np.tile(np.arange(len(sp)), len(rc) * len(zero))
    reps = len(idx_rc)
    gi_all = np.repeat(gi, reps)
    si_all = np.repeat(si, reps)
    rc_all = np.tile(rc[idx_rc], k)
    z_all = np.tile(zero[idx_z], k)
    sp_all = np.tile(sp[idx_sp], k)
    keep = (z_all == 0) | (G_data[gi_all] > 1)
    if not keep.any():
        return None
    gi_all, si_all, rc_all, z_all, sp_all = (x[keep] for x in (gi_all, si_all, rc_all, z_all, sp_all))
    cols = {name: g[gi_all, j] for j, name in enumerate((*GRID_COLUMNS, *EXPERT_COLUMNS))}
    cols["micro_batch_size"] = (np.full(len(gi_all), mb, dtype=np.int64) if np.ndim(mb) == 0
                                else np.asarray(mb, dtype=np.int64)[gi_all])
    cols["schedule"] = sched[si_all, 0]
    cols["virtual_stages"] = sched[si_all, 1]
    cols["recompute"] = rc_all
    cols["zero_stage"] = z_all
    cols["sequence_parallel"] = sp_all
    return cols
