"""What a search takes (options, pins) and returns (ranked candidates with reasons).

`SearchOptions` pins any plan dimension: each field is None (search it) or a tuple of allowed
values. The REST body's "search" object and the CLI's flags map onto these field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfmodels.specs import AXES, DEGREE_FIELDS, RECOMPUTE, SCHEDULES, Plan, Prediction, default_placement


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    G_data: tuple[int, ...] | None = None
    G_inter: tuple[int, ...] | None = None
    G_intra_d: tuple[int, ...] | None = None
    G_intra_r: tuple[int, ...] | None = None
    G_intra_c: tuple[int, ...] | None = None
    G_cp: tuple[int, ...] | None = None
    """None: 1, or where the sequence is long enough to matter (`tuner.space.CP_MIN_SEQUENCE`) and
    the stack runs context parallelism, the degrees that split it (`tuner.space.cp_options`)."""
    G_ep: tuple[int, ...] | None = None
    """None: 1 for a dense model; the divisors of the expert count for a mixture of experts."""
    G_etp: tuple[int, ...] | None = None
    """None: Megatron-Core's default (the tensor-parallel size) and 1."""
    micro_batch_size: tuple[int, ...] | None = None
    schedule: tuple[str, ...] | None = None
    virtual_stages: tuple[int, ...] | None = None
    recompute: tuple[str, ...] | None = None
    zero_stage: tuple[int, ...] | None = None
    placement: tuple[tuple[str, ...], ...] | None = None
    sequence_parallel: tuple[bool, ...] | None = None
    """None: both where the training stack has Megatron's sequence parallelism, else off."""
    max_micro_batch_size: int = 64
    time_budget_s: float = 10.0
    examples_per_reason: int = 3
    exhaustive: bool = False
    """Score every plan instead of skipping the families a lower bound proves slower than the top
    list (`tuner.families`): the same answer, slower; for checking."""

    def __post_init__(self) -> None:
        if self.placement is not None:
            object.__setattr__(self, "placement", tuple(default_placement(tuple(o)) for o in self.placement))
            for order in self.placement:
                if sorted(order) != sorted(AXES):
                    raise ValueError(
                        f"search.placement entries must be orderings of {list(AXES)}, got {list(order)}"
                    )
        for name in (*DEGREE_FIELDS, "G_ep", "G_etp", "micro_batch_size", "virtual_stages"):
            values = getattr(self, name)
            if values is not None and (
                not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values)
            ):
                raise ValueError(
                    f"search.{name} must be a non-empty list of positive integers, got {values!r}"
                )
        if self.zero_stage is not None and (
            not self.zero_stage or any(v not in (0, 1, 2, 3) for v in self.zero_stage)
        ):
            raise ValueError(f"search.zero_stage must list values among 0-3, got {self.zero_stage!r}")
        for name, allowed in (("schedule", SCHEDULES), ("recompute", RECOMPUTE)):
            values = getattr(self, name)
            if values is not None and (not values or any(v not in allowed for v in values)):
                raise ValueError(f"search.{name} must list values among {list(allowed)}, got {values!r}")
        if self.max_micro_batch_size < 1:
            raise ValueError(f"search.max_micro_batch_size must be >= 1, got {self.max_micro_batch_size}")
        if not self.time_budget_s > 0:
            raise ValueError(f"search.time_budget_s must be > 0, got {self.time_budget_s}")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One ranked layout. `equivalent_placements`: other rank orders of the same plan that predict the
    same step time (merged into this row: the placement changes no link level for this grid)."""

    rank: int
    plan: Plan
    prediction: Prediction
    equivalent_placements: tuple[tuple[str, ...], ...] = ()
    equivalent_zero_stages: tuple[int, ...] = ()
    """Other ZeRO stages of this plan that predict the same time and memory (merged into this row)."""


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    best: Candidate | None
    candidates: list[Candidate]
    num_evaluated: int
    num_valid: int
    pruned: dict[str, int]
    pruned_examples: dict[str, list[str]] = field(default_factory=dict)
    constants_source: str = "preset"
    explanation: str = ""
    search_time_s: float = 0.0
    complete: bool = True
    """False when the time budget ran out: `num_not_evaluated` plans were never scored."""
    num_not_evaluated: int = 0
    num_proved_slower: int = 0
    """Plans never scored because a lower bound on their step time exceeds the k-th best time found
    (0 with `SearchOptions(exhaustive=True)`)."""
    exhaustive: bool = False
