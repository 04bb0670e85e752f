"""Where a training step's time goes, measured from the outside of the engine (no engine hook).

Why: the closed loop compares the performance model's breakdown (compute, tensor-parallel
communication per group, data-parallel reduction, pipeline bubble) with what really happened.

How (cheap enough to leave on for every step):
- `CommTimer`, while active, replaces the torch.distributed collective functions (all_reduce,
  all_gather_into_tensor / all_gather_single, reduce_scatter_tensor / reduce_scatter_single,
  broadcast, all_to_all_single, ...) by timing wrappers, wherever a module holds a reference to
  them (torch.distributed itself and every loaded `engine.*` module, e.g. engine.comm binds its
  flat all-gather at import). On gloo the engine's collectives are synchronous, so a call's wall
  time is its communication wait. On CUDA (NCCL) a call only enqueues work, so each one is fenced
  by two CUDA events on the current stream (which NCCL makes wait for the collective) and its time
  is the events' elapsed time, read when the step ends (`StepClock` synchronizes the device at both
  ends of a step, so wall time covers the GPU work too). The time is added to the grid axis of its
  process group ("row", "col", "depth", "data", "inter"; anything else, e.g. the world group, is
  "other").
- The time the pipeline schedule spends in `torch.distributed.pipelining.schedules._wait_batch_p2p`
  (waiting for activations or gradients of the neighbouring stage: bubble plus transfer) is
  counted as "pp_wait".
- `StepClock` turns those totals into one `StepSample` per optimizer step: wall seconds, seconds
  per axis, pipeline wait, and the rest as compute.

A TorchDispatchMode would see every collective too, but it intercepts every aten op and doubled
the step time of a small GPT on CPU; wrapping only the collectives costs a few microseconds each.

    timer = CommTimer(grid)
    clock = StepClock(timer)
    with timer:
        for step in range(n):
            clock.start()
            ... forward, backward, sync, optimizer.step() ...
            sample = clock.stop()
"""

from __future__ import annotations

import collections
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from engine.grid import Grid

AXES_TIMED = ("row", "col", "depth", "data", "inter", "cp", "ep", "etp", "edp", "other")
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
               "broadcast", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter")


def _group_of(args: tuple, kwargs: dict, position: int) -> Any:
    if "group" in kwargs:
        return kwargs["group"]
    return args[position] if len(args) > position else None


def _group_position(fn: Callable[..., Any]) -> int:
    import inspect

    try:
        return list(inspect.signature(fn).parameters).index("group")
    except (ValueError, TypeError):
        return 10**6


class CommTimer:
    """Seconds spent in collectives per grid axis, and in pipeline p2p waits, while active."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._restore: list[tuple[Any, str, Any]] = []
        self._axis_cache: dict[int, str] = {}
        self.cuda = grid.device.type == "cuda"
        self._pending: list[tuple[str, Any, Any]] = []  # (axis, start event, end event) not yet read

    def _axis(self, group: Any) -> str:
        if group is None:
            return "other"
        key = id(group)
        axis = self._axis_cache.get(key)
        if axis is None:
            axis = self.grid.axis_of_group(str(getattr(group, "group_name", ""))) or "other"
            self._axis_cache[key] = axis
        return axis

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        position = _group_position(fn)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            axis = self._axis(_group_of(args, kwargs, position))
            self.calls[axis] += 1
            with self.span(axis):
                return fn(*args, **kwargs)

        return timed

    @contextlib.contextmanager
    def span(self, key: str) -> Iterator[None]:
        """Add the time of the block to `key`: host wall time, or CUDA-event time on the GPU."""
        if self.cuda:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._pending.append((key, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[key] += time.perf_counter() - t0

    def resolve(self) -> None:
        """Read the CUDA events recorded so far (waits for them)."""
        for key, start, end in self._pending:
            end.synchronize()
            self.seconds[key] += start.elapsed_time(end) / 1e3
        self._pending.clear()

    def __enter__(self) -> CommTimer:
        from torch.distributed import distributed_c10d
        from torch.distributed.pipelining import schedules

        originals = {id(getattr(distributed_c10d, n)): getattr(distributed_c10d, n)
                     for n in COLLECTIVES if hasattr(distributed_c10d, n)}
        wrappers = {key: self._wrap(fn) for key, fn in originals.items()}
        modules = [dist, distributed_c10d] + [
            m for name, m in list(sys.modules.items())
            if (name == "engine" or name.startswith("engine.")) and m is not None]
        for module in modules:
            for name, value in list(vars(module).items()):
                if callable(value) and id(value) in originals and value is originals[id(value)]:
                    self._restore.append((module, name, value))
                    setattr(module, name, wrappers[id(value)])
        wait = getattr(schedules, "_wait_batch_p2p", None)
        if wait is not None:
            def timed_wait(work: Any) -> Any:
                with self.span("pp_wait"):
                    return wait(work)

            self._restore.append((schedules, "_wait_batch_p2p", wait))
            schedules._wait_batch_p2p = timed_wait
        return self

    def __exit__(self, *exc: Any) -> None:
        for module, name, value in reversed(self._restore):
            setattr(module, name, value)
        self._restore.clear()

    def totals(self) -> dict[str, float]:
        self.resolve()
        out = dict.fromkeys((*AXES_TIMED, "pp_wait"), 0.0)
        out.update(self.seconds)
        return out


@dataclass(frozen=True, kw_only=True)
class StepSample:
    """One optimizer step on this rank (seconds)."""

    wall_s: float
    comm_s: dict[str, float] = field(default_factory=dict)
    pp_wait_s: float = 0.0

    @property
    def comm_total_s(self) -> float:
        return sum(self.comm_s.values())

    @property
    def compute_s(self) -> float:
        """Whatever was not spent waiting for communication: GEMMs, element-wise work, optimizer."""
        return max(self.wall_s - self.comm_total_s - self.pp_wait_s, 0.0)


class StepClock:
    """Wall time of each step plus the CommTimer's per-axis deltas over the same interval."""

    def __init__(self, timer: CommTimer) -> None:
        self.timer = timer
        self._t0 = 0.0
        self._before: dict[str, float] = {}

    def _sync(self) -> None:
        if self.timer.cuda:
            import torch

            torch.cuda.synchronize()

    def start(self) -> None:
        self._sync()
        self._before = self.timer.totals()
        self._t0 = time.perf_counter()

    def stop(self) -> StepSample:
        self._sync()
        wall = time.perf_counter() - self._t0
        after = self.timer.totals()
        delta = {k: after[k] - self._before.get(k, 0.0) for k in after}
        pp = delta.pop("pp_wait", 0.0)
        comm = {k: v for k, v in delta.items() if k in AXES_TIMED}
        return StepSample(wall_s=wall, comm_s=comm, pp_wait_s=pp)
