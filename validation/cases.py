"""What the loader hands to scoring: one `Case` per usable row, one `Skipped` per unusable one."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfmodels.specs import Cluster, Model, Plan, Training
from validation.hardware import CardMemory


@dataclass(frozen=True, kw_only=True)
class Case:
    """One published run.

    The run used one of `trainings` x `plans` (the product is its candidate set); each holds one
    value per field the row states and every possible value per field it leaves empty (`unknown`
    names those columns). `layout_stated`: degrees and micro-batch are stated, so the row can take
    part in a ranking group.
    """

    case_id: str
    source: str
    framework: str
    group: str
    model: Model
    cluster: Cluster
    trainings: tuple[Training, ...]
    plans: tuple[Plan, ...]
    measured_time_s: float | None
    measured_memory_gib: float | None = None
    expect_oom: bool = False
    layout_stated: bool = True
    unknown: tuple[str, ...] = ()
    card_memory: CardMemory = field(default_factory=lambda: CardMemory(gib=0.0))
    notes: str = ""

    @property
    def candidate_count(self) -> int:
        return len(self.trainings) * len(self.plans)


@dataclass(frozen=True, kw_only=True)
class Skipped:
    case_id: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Loaded:
    cases: list[Case] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def extend(self, other: Loaded) -> None:
        self.cases.extend(other.cases)
        self.skipped.extend(other.skipped)
