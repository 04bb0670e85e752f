"""Every layout a published run could have used, given what its row states.

A stated field is used as stated; an empty one is not guessed. Missing tensor/pipeline/data degrees
expand to every split of the GPUs (tensor parallelism inside a node, as every framework here does it),
a missing micro-batch to every divisor of the per-replica batch up to 16, missing virtual stages to
every interleaving the schedule allows, a missing sequence-parallel flag to both values (where
tensor parallelism exists), and the recompute and ZeRO options to the values `StackOptions` holds.
What a layout must satisfy is asked of `perfmodels.rules`, the rules the search and
`combination_problems` apply too.

Run the tests: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/validation/test_candidates.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodels import rules
from perfmodels.specs import Plan

_TENSOR_DEGREES = (1, 2, 4, 8)
_VIRTUAL_STAGES = (2, 3, 4, 6, 8)
_MAX_MICRO_BATCH = 16


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The layout columns of a row; None where the cell is empty."""

    num_gpus: int
    global_batch: int
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    virtual_pp: int | None = None
    sequence_parallel: bool | None = None
    cp: int = 1
    """Context parallelism (stated, or 1): the other degrees split num_gpus / cp."""
    ep: int = 1
    """Expert parallelism (stated, or 1); it re-divides a stage's ranks, so splits no GPUs."""
    etp: int | None = None
    """Expert tensor parallelism (None: Megatron-Core's default, the tensor-parallel size)."""

    @property
    def stated(self) -> bool:
        """Degrees and micro-batch all stated: the row names one layout (ranking groups use only these)."""
        degrees = self.tp is not None and self.pp is not None
        return degrees and self.micro_batch is not None


def _degree_combos(lay: Layout, *, layers: int, heads: int) -> list[tuple[int, int, int]]:
    G, tp, pp, dp = lay.num_gpus // lay.cp, lay.tp, lay.pp, lay.dp
    if tp and pp:
        return [(tp, pp, dp or G // (tp * pp))]
    if dp and G % dp == 0:
        mp = G // dp
        if tp or pp:
            t, p = (tp, mp // tp) if tp else (mp // pp, pp)  # type: ignore[operator]
            return [(t, p, dp)]
        return [(t, mp // t, dp) for t in divisors(mp)
                if t <= 8 and rules.heads_split(heads, t) and rules.enough_layers(layers, mp // t, 1)]
    if tp or pp:
        return [
            (t, p, G // (t * p))
            for t in ([tp] if tp else _TENSOR_DEGREES)
            for p in ([pp] if pp else divisors(G))
            if G % (t * p) == 0 and rules.heads_split(heads, t) and rules.enough_layers(layers, p, 1)
        ]
    return [(t, p, G // (t * p)) for t in _TENSOR_DEGREES if G % t == 0 and rules.heads_split(heads, t)
            for p in divisors(G // t) if rules.enough_layers(layers, p, 1)]


def candidate_plans(lay: Layout, *, layers: int, heads: int, recomputes: tuple[str, ...],
                    zero_stages: tuple[int, ...], placement: tuple[str, ...] | None,
                    can_interleave: bool = True, can_sequence_parallel: bool = True) -> list[Plan]:
    """Every Plan consistent with the stated layout columns and the stack's recompute/ZeRO options.

    An empty virtual-stage or sequence-parallel cell only expands to what the row's stack can run
    (`Stack.schedules`, `Stack.sequence_parallel`): a framework without interleaving did not use it.
    """
    plans: list[Plan] = []
    if lay.sequence_parallel is not None:
        sps: tuple[bool, ...] = (lay.sequence_parallel,)
    else:
        sps = (False, True) if can_sequence_parallel else (False,)
    for t, p, d in _degree_combos(lay, layers=layers, heads=heads):
        if t * p * d * lay.cp != lay.num_gpus or not rules.batch_split(lay.global_batch, d, 1):
            continue
        per_replica = lay.global_batch // d
        micros = (
            [lay.micro_batch]
            if lay.micro_batch
            else [x for x in divisors(per_replica) if x <= _MAX_MICRO_BATCH]
        )
        for micro in micros:
            if not rules.divides(micro, per_replica):
                continue
            n_micro = per_replica // micro
            if lay.virtual_pp:  # stated: as stated wherever there is a pipeline to interleave
                vs = [lay.virtual_pp if p > 1 else 1]
            else:  # not stated: any interleaving the schedule allows
                vs = [1] + [v for v in _VIRTUAL_STAGES
                            if can_interleave and p > 1 and rules.interleave_fits(n_micro, p)
                            and rules.enough_layers(layers, p, v)]
            for v in vs:
                for sp in sps:
                    if sp and t == 1 and lay.sequence_parallel is None:
                        continue  # sequence parallelism needs tensor parallelism to split over
                    for rc in recomputes:
                        for z in zero_stages:
                            plans.append(
                                Plan(
                                    G_data=d,
                                    G_inter=p,
                                    G_intra_r=t,
                                    G_cp=lay.cp,
                                    G_ep=lay.ep,
                                    G_etp=lay.etp,
                                    micro_batch_size=micro,
                                    schedule="interleaved-1f1b" if v > 1 else "1f1b",
                                    virtual_stages=v,
                                    recompute=rc,
                                    sequence_parallel=sp and t > 1,  # type: ignore[arg-type]
                                    zero_stage=z,
                                    placement=placement,
                                )
                            )
    return plans
