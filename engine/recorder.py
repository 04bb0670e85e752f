"""Count every collective this rank issues, per grid axis: calls and bytes.

    rec = engine.CommRecorder(grid)
    with rec:
        loss = engine.train_step(...)
    rec.bytes_per_group()   # {"row": ..., "col": ..., "depth": ..., "inter": ..., "data": ...}
    rec.reset()

A TorchDispatchMode on the c10d and functional-collective ops (see
shared/notes/torch_distributed_on_cpu.md section 6), so it sees the engine's own collectives,
torch.distributed.pipelining's send/recv and anything else issued on this thread, in forward and
backward alike. Payload convention, the one perfmodels.traffic uses: all-reduce = the tensor,
all-gather = the gathered output, reduce-scatter = the input, send/recv = the tensor. Groups that
are not one of the grid's axes (the world group, ad-hoc groups) are counted under "other".

Group names follow the shared CP/MoE contract: "cp" (the ring of engine.context), "ep", "etp",
"edp" (engine.moe's expert groups; all_to_all = the input tensor); the flattened data x cp group
of context parallelism is counted under "data". Collectives issued inside `uncounted()` (the
MoE's routing metadata: split sizes and row-to-expert indices, not payload) are not counted.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.grid import Grid

AXES_REPORTED = ("row", "col", "depth", "inter", "data")
_STATE = threading.local()


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Collectives issued inside are not counted by any CommRecorder (metadata, not payload)."""
    previous = getattr(_STATE, "paused", False)
    _STATE.paused = True
    try:
        yield
    finally:
        _STATE.paused = previous


def _nbytes(t: Any) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _group_name(x: Any) -> str:
    if isinstance(x, str):
        return x
    from torch._C._distributed_c10d import ProcessGroup

    pg = ProcessGroup.unbox(x) if isinstance(x, torch.ScriptObject) else x
    return str(pg.group_name)


def _rules() -> dict[Any, tuple[str, Callable[[tuple], tuple[Any, int]]]]:
    c, f = torch.ops.c10d, torch.ops._c10d_functional
    table: list[tuple[Any, str, str, Callable[[tuple], tuple[Any, int]]]] = [
        (c, "allreduce_", "all_reduce", lambda a: (a[1], _nbytes(a[0]))),
        (c, "allreduce_coalesced_", "all_reduce", lambda a: (a[1], _nbytes(a[0]))),
        (c, "_allgather_base_", "all_gather", lambda a: (a[2], _nbytes(a[0]))),
        (c, "allgather_", "all_gather", lambda a: (a[2], _nbytes(a[0]))),
        (c, "allgather_into_tensor_coalesced_", "all_gather", lambda a: (a[2], _nbytes(a[0]))),
        (c, "_reduce_scatter_base_", "reduce_scatter", lambda a: (a[2], _nbytes(a[1]))),
        (c, "reduce_scatter_", "reduce_scatter", lambda a: (a[2], _nbytes(a[1]))),
        (c, "reduce_scatter_tensor_coalesced_", "reduce_scatter", lambda a: (a[2], _nbytes(a[1]))),
        (c, "broadcast_", "broadcast", lambda a: (a[1], _nbytes(a[0]))),
        (c, "alltoall_base_", "all_to_all", lambda a: (a[2], _nbytes(a[1]))),
        (c, "send", "send", lambda a: (a[1], _nbytes(a[0]))),
        (c, "recv_", "recv", lambda a: (a[1], _nbytes(a[0]))),
        (f, "all_reduce", "all_reduce", lambda a: (a[2], _nbytes(a[0]))),
        (f, "all_gather_into_tensor", "all_gather", lambda a: (a[2], _nbytes(a[0]) * int(a[1]))),
        (f, "reduce_scatter_tensor", "reduce_scatter", lambda a: (a[3], _nbytes(a[0]))),
        (f, "all_to_all_single", "all_to_all", lambda a: (a[3], _nbytes(a[0]))),
        (f, "broadcast", "broadcast", lambda a: (a[2], _nbytes(a[0]))),
    ]
    out = {}
    for ns, name, kind, fn in table:
        packet = getattr(ns, name, None)
        if packet is not None:
            out[packet.default] = (kind, fn)
    return out


class CommRecorder(TorchDispatchMode):
    """Calls and logical bytes per (axis, op) issued on this thread while active."""

    def __init__(self, grid: Grid) -> None:
        super().__init__()
        self.grid = grid
        self.rules = _rules()
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.bytes: collections.Counter[tuple[str, str]] = collections.Counter()

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        rule = self.rules.get(func)
        if rule is not None and not getattr(_STATE, "paused", False):
            kind, fn = rule
            group, nbytes = fn(args)
            axis = self.grid.axis_of_group(_group_name(group)) or "other"
            self.calls[(axis, kind)] += 1
            self.bytes[(axis, kind)] += nbytes
        return func(*args, **(kwargs or {}))

    def bytes_per_group(self) -> dict[str, int]:
        out = dict.fromkeys(AXES_REPORTED, 0)
        for (axis, _), nb in self.bytes.items():
            out[axis] = out.get(axis, 0) + nb
        return out

    def calls_per_group(self) -> dict[str, int]:
        out = dict.fromkeys(AXES_REPORTED, 0)
        for (axis, _), n in self.calls.items():
            out[axis] = out.get(axis, 0) + n
        return out

    def table(self) -> list[tuple[str, str, int, int]]:
        """(axis, op, calls, bytes) rows, for printing."""
        return sorted((axis, op, self.calls[(axis, op)], self.bytes[(axis, op)]) for axis, op in self.calls)

