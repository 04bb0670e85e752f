"""Plans as columns of numpy arrays, so thousands of layouts are scored in one pass.

`PlanArrays` holds one int array per plan field (schedules and recompute as small integer codes;
G_etp 0 for "Megatron-Core's default", the Plan's None). Plans share one `placement`, or each takes
one of `placements` by its `placement_index` (a search scores several placements in one pass; group
geometry is computed per placement, `by_placement`). `from_plans` / `to_plan` convert to and from
`Plan` objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from perfmodels.specs import (
    AXES,
    AXIS_FIELDS,
    RECOMPUTE,
    SCALAR_PLAN_FIELDS,
    SCHEDULES,
    Plan,
    Training,
    default_placement,
)

SCHEDULE_CODE = {name: i for i, name in enumerate(SCHEDULES)}
RECOMPUTE_CODE = {name: i for i, name in enumerate(RECOMPUTE)}


@dataclass(frozen=True, kw_only=True)
class PlanArrays:
    G_data: np.ndarray
    G_inter: np.ndarray
    G_intra_d: np.ndarray
    G_intra_r: np.ndarray
    G_intra_c: np.ndarray
    G_cp: np.ndarray
    G_ep: np.ndarray
    G_etp: np.ndarray
    micro_batch_size: np.ndarray
    schedule: np.ndarray
    virtual_stages: np.ndarray
    recompute: np.ndarray
    zero_stage: np.ndarray
    sequence_parallel: np.ndarray
    placement: tuple[str, ...] = AXES
    placements: tuple[tuple[str, ...], ...] = ()
    """With `placement_index`: the placements the plans take (`placement` is then the first)."""
    placement_index: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.G_data.shape[0])

    def degrees(self) -> dict[str, np.ndarray]:
        return {axis: getattr(self, name) for axis, name in AXIS_FIELDS.items()}

    def _derived(self, name: str, compute) -> np.ndarray:
        """A column derived from others, kept with these plans (read-only) until `with_columns`
        replaces one it reads (`_DERIVED_FROM`): a mixture of experts' bounds read the same ones
        over and over."""
        cache = self.__dict__.setdefault("_derived_columns", {})
        value = cache.get(name)
        if value is None:
            value = cache[name] = compute()
            value.setflags(write=False)
        return value

    @property
    def world_size(self) -> np.ndarray:
        """Ranks of each plan: the product of its six degrees (G_ep and G_etp re-divide a stage)."""
        return self._derived("world_size", lambda: self.G_data * self.G_inter * self.G_intra_d
                             * self.G_intra_r * self.G_intra_c * self.G_cp)

    @property
    def expert_tp(self) -> np.ndarray:
        """G_etp resolved: 0 (the Plan's None) is Megatron-Core's default, the tensor-parallel size."""
        return self._derived("expert_tp", lambda: np.where(self.G_etp > 0, self.G_etp, self.G_intra_r))

    def num_microbatches(self, training: Training) -> np.ndarray:
        """Micro-batches per optimizer step on each (data, depth) replica."""
        per_replica = training.global_batch_size // (self.G_data * self.G_intra_d)
        return np.maximum(per_replica // self.micro_batch_size, 1)

    def take(self, index: np.ndarray) -> PlanArrays:
        fields = {name: getattr(self, name)[index] for name in _ARRAY_FIELDS}
        if self.placement_index is None:
            return PlanArrays(**fields, placement=self.placement)
        return PlanArrays(**fields, placement=self.placement, placements=self.placements,
                          placement_index=self.placement_index[index])

    def placement_of(self, i: int) -> tuple[str, ...]:
        if self.placement_index is None:
            return self.placement
        return self.placements[int(self.placement_index[i])]

    def by_placement(self) -> list[tuple[tuple[str, ...], np.ndarray | None]]:
        """(placement, indices of its plans) for each placement present; indices None when every
        plan shares `placement`."""
        if self.placement_index is None:
            return [(self.placement, None)]
        return [(order, idx) for k, order in enumerate(self.placements)
                for idx in [np.flatnonzero(self.placement_index == k)] if len(idx)]

    def with_columns(self, **columns: np.ndarray | int | bool) -> PlanArrays:
        """These plans with some columns replaced (scalars broadcast): `dataclasses.replace` without
        its per-field argument handling, which the search's bounds call thousands of times."""
        out = object.__new__(PlanArrays)
        out.__dict__.update(self.__dict__)
        derived = self.__dict__.get("_derived_columns")
        if derived:  # keep what the replaced columns do not change
            out.__dict__["_derived_columns"] = {k: v for k, v in derived.items()
                                                if not _DERIVED_FROM[k] & columns.keys()}
        n = len(self)
        for name, value in columns.items():
            if name not in _ARRAY_FIELDS:
                raise TypeError(f"PlanArrays has no column {name!r}")
            value = np.asarray(value)
            out.__dict__[name] = np.full(n, value) if value.ndim == 0 else value
        return out

    def one_placement(self, order: tuple[str, ...]) -> PlanArrays:
        """These plans, all under `order`."""
        return replace(self, placement=order, placements=(), placement_index=None)

    def to_plan(self, i: int) -> Plan:
        return Plan(
            G_data=int(self.G_data[i]),
            G_inter=int(self.G_inter[i]),
            G_intra_d=int(self.G_intra_d[i]),
            G_intra_r=int(self.G_intra_r[i]),
            G_intra_c=int(self.G_intra_c[i]),
            G_cp=int(self.G_cp[i]),
            G_ep=int(self.G_ep[i]),
            G_etp=int(self.G_etp[i]) if self.G_etp[i] > 0 else None,
            micro_batch_size=int(self.micro_batch_size[i]),
            schedule=SCHEDULES[int(self.schedule[i])],  # type: ignore[arg-type]
            virtual_stages=int(self.virtual_stages[i]),
            recompute=RECOMPUTE[int(self.recompute[i])],  # type: ignore[arg-type]
            zero_stage=int(self.zero_stage[i]),
            placement=None if self.placement_of(i) == AXES else self.placement_of(i),
            sequence_parallel=bool(self.sequence_parallel[i]),
        )


_ARRAY_FIELDS = SCALAR_PLAN_FIELDS
_DERIVED_FROM = {
    "world_size": frozenset({"G_data", "G_inter", "G_intra_d", "G_intra_r", "G_intra_c", "G_cp"}),
    "expert_tp": frozenset({"G_etp", "G_intra_r"}),
}
"""The columns each of `PlanArrays`' derived columns reads."""


def context_degrees(arrays: PlanArrays) -> np.ndarray:
    """The context-parallel degrees of `arrays`, ascending: a count per value, not a sort (a grid
    table's column has tens of thousands of rows)."""
    return np.flatnonzero(np.bincount(arrays.G_cp)) if len(arrays) else np.zeros(0, dtype=np.int64)


def equal_runs(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each run of consecutive rows equal in every one of `columns`, each row's run):
    what the search evaluates once and spreads to the run's rows."""
    n = len(columns[0]) if len(columns) else 0
    change = np.zeros(n, dtype=bool)
    change[:1] = True
    for col in columns:
        change[1:] |= col[1:] != col[:-1]
    return np.flatnonzero(change), np.cumsum(change) - 1


def distinct_rows(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(a row of each distinct combination of values of `columns`, each row's combination), for
    columns of small non-negative integers (degrees, micro-batch sizes, flags): each value numbered
    by a count of the values present and the numbers combined, so no row is sorted (a column of the
    grid table has tens of thousands of rows)."""
    n = len(columns[0]) if len(columns) else 0
    key = np.zeros(n, dtype=np.int64)
    for col in columns:
        col = np.asarray(col, dtype=np.int64)
        present = np.bincount(col) > 0
        number = np.cumsum(present) - 1  # each present value's number
        key = key * int(present.sum()) + number[col]
    slots = int(key.max(initial=-1)) + 1
    some = np.full(slots, -1, dtype=np.int64)
    some[key] = np.arange(n)  # any row of each combination: its rows agree in every column
    used = np.flatnonzero(some >= 0)
    which = np.empty(slots, dtype=np.int64)
    which[used] = np.arange(len(used))
    return some[used], which[key]


def from_plans(plans: Sequence[Plan]) -> PlanArrays:
    if not plans:
        raise ValueError("from_plans needs at least one plan")
    order = plans[0].full_order
    if any(p.full_order != order for p in plans):
        raise ValueError("all plans of one PlanArrays must share a placement")

    def col(values: list[int]) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)

    return PlanArrays(
        G_data=col([p.G_data for p in plans]),
        G_inter=col([p.G_inter for p in plans]),
        G_intra_d=col([p.G_intra_d for p in plans]),
        G_intra_r=col([p.G_intra_r for p in plans]),
        G_intra_c=col([p.G_intra_c for p in plans]),
        G_cp=col([p.G_cp for p in plans]),
        G_ep=col([p.G_ep for p in plans]),
        G_etp=col([p.G_etp or 0 for p in plans]),
        micro_batch_size=col([p.micro_batch_size for p in plans]),
        schedule=col([SCHEDULE_CODE[p.schedule] for p in plans]),
        virtual_stages=col([p.virtual_stages for p in plans]),
        recompute=col([RECOMPUTE_CODE[p.recompute] for p in plans]),
        zero_stage=col([p.zero_stage for p in plans]),
        sequence_parallel=np.asarray([p.sequence_parallel for p in plans], dtype=bool),
        placement=order,
    )


def from_columns(placement: tuple[str, ...] = AXES, *, placements: Sequence[tuple[str, ...]] = (),
                 placement_index: np.ndarray | None = None, **columns: np.ndarray) -> PlanArrays:
    """Build from raw columns; missing options take the Plan defaults (a placement of the five
    axes without "cp" gets it where the default order has it). With `placement_index`, plan i takes
    `placements[placement_index[i]]`."""
    placement = default_placement(tuple(placement))
    if placement_index is not None:
        orders = tuple(default_placement(tuple(o)) for o in placements)
        return replace(from_columns(orders[0], **columns), placements=orders,
                       placement_index=np.asarray(placement_index, dtype=np.int64))
    n = len(next(iter(columns.values())))
    defaults = {
        "G_data": 1, "G_inter": 1, "G_intra_d": 1, "G_intra_r": 1, "G_intra_c": 1, "G_cp": 1, "G_ep": 1,
        "G_etp": 0, "micro_batch_size": 1,
        "schedule": SCHEDULE_CODE["1f1b"], "virtual_stages": 1, "recompute": RECOMPUTE_CODE["none"],
        "zero_stage": 0, "sequence_parallel": False,
    }
    fields = {}
    for name in _ARRAY_FIELDS:
        if name in columns:
            value = np.asarray(columns[name])
            if name == "G_etp" and value.dtype == object:  # None: the default
                value = np.asarray([0 if v is None else v for v in value])
        else:
            value = np.full(n, defaults[name])
        fields[name] = value.astype(bool if name == "sequence_parallel" else np.int64)
    return PlanArrays(**fields, placement=tuple(placement))
