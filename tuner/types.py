"""What a search takes (options, pins) and returns (ranked candidates with reasons).

`SearchOptions` pins any plan dimension: each field is None (search it) or a tuple of allowed
values. The REST body's "search" object and the CLI's flags map onto these field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfmodels.specs import Plan, Prediction


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    G_data: tuple[int, ...] | None = None
    G_inter: tuple[int, ...] | None = None
    G_intra_d: tuple[int, ...] | None = None
    G_intra_r: tuple[int, ...] | None = None
    G_intra_c: tuple[int, ...] | None = None
    micro_batch_size: tuple[int, ...] | None = None
    schedule: tuple[str, ...] | None = None
    virtual_stages: tuple[int, ...] | None = None
    recompute: tuple[str, ...] | None = None
    zero_stage: tuple[int, ...] | None = None
    placement: tuple[tuple[str, ...], ...] | None = None
    sequence_parallel: tuple[bool, ...] | None = (False,)
    max_micro_batch_size: int = 64
    time_budget_s: float = 10.0
    examples_per_reason: int = 3


@dataclass(frozen=True, kw_only=True)
class Candidate:
    rank: int
    plan: Plan
    prediction: Prediction


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
