"""The grid: one object that owns the DeviceMesh and every process group of the 4D layout.

    import engine
    grid = engine.init(G_data=2, G_intra_r=2, G_intra_c=1, G_intra_d=2, G_inter=1)
    grid = engine.init(1, 2, 2, 1, 2)        # positional, AxoNN's order:
                                             #   G_inter, G_data, G_intra_r, G_intra_c, G_intra_d
    grid.size("row"), grid.coord("depth"), grid.group("col")   # a real ProcessGroup, also for size-1 axes

`grid.group(axis)` always returns a real group holding this rank (a single-rank group for an axis
of size one: torch reads `group=None` as the whole world, so None would silently reduce over every
rank). The engine's own collectives use `grid.comm_group(axis)`, which is None for size-1 axes, so
nothing is ever issued on them (perfmodels.traffic counts nothing there either).

Device: on NCCL every rank uses `cuda:LOCAL_RANK` (torchrun's LOCAL_RANK, Slurm's SLURM_LOCALID,
else rank % gpus_per_node / the visible device count) and `init` calls `torch.cuda.set_device` on
it, also when the user called `init_process_group("nccl")` first (as the AxoNN guide does).

`init` works after `torch.distributed.init_process_group` (any launcher), or initializes the
default group itself from the environment: torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
`MASTER_ADDR`/`MASTER_PORT`) or Slurm (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, with
`MASTER_ADDR` defaulting to the first host of `SLURM_JOB_NODELIST` when it is a plain name).

Rank order is perfmodels.layout's (default placement: col innermost, data outermost), so the flat
rank of a process equals `perfmodels.layout.rank_of(coords, degrees, placement)` and engine and
model agree on which ranks talk to which. The mesh dims are always named MESH_ORDER (outermost
first); a non-default placement permutes which world ranks sit at which mesh coordinates.

Validation happens before any collective: a grid whose product differs from the world size fails
on every rank with a message naming every factor.

The one piece of module state, on purpose: `init` remembers the grid it returns (`_CURRENT`), as
AxoNN's `ax.init` does, because that is the documented public model: `engine.init(...)`, then
layers and loaders find the grid (`engine.Linear(k, n)`, `with engine.auto_parallelize(): ...`,
`engine.create_dataloader(...)` without `grid=`). Only the public entry points that build
something from nothing read it (`current_grid`): Linear/ShardedLinear, auto_parallelize,
parallelize, ParallelGPT, create_dataloader. Functions given a model or blocks (wrap,
sync_gradients, step, grad_norm, clip_grad_norm_, the checkpoint functions, ZeroOptimizer, Zero3,
BlockPipeline) take the grid the model was wrapped or built on (`grid_of`: `engine.wrap` records
it, every engine layer holds one) and fall back to `init`'s only for a model without engine parts.
Code inside the engine passes the grid it holds (`grid=`) and never reads the global itself.
There are no process-group globals: every group lives on a Grid.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from perfmodels.layout import MESH_ORDER, rank_coords, rank_of
from perfmodels.specs import AXES, AXIS_FIELDS

ENGINE_MESH = ("data", "inter", "depth", "cp", "row", "col")
"""The engine's mesh dims, outermost first: perfmodels' five axes plus context parallelism ("cp",
Plan.G_cp) between depth and row, the shared CP/MoE contract's default rank order (innermost
first: col, row, cp, depth, inter, data; Megatron-Core's tp-cp-...-dp with the pipeline inside data)."""
FIELDS = {**AXIS_FIELDS, "cp": "G_cp"}

_CURRENT: list[Grid] = []  # the grid the last engine.init returned (see the module docstring)
GRID_ATTR = "_gridtune_grid"  # engine.wrap records the model's grid here (read by grid_of)


class GridError(ValueError):
    """A grid that cannot be built (degrees vs world size, divisibility); raised before any collective."""


def grid_string(degrees: dict[str, int]) -> str:
    out = " ".join(f"{AXIS_FIELDS[a]}={degrees[a]}" for a in MESH_ORDER)
    return out + (f" G_cp={degrees['cp']}" if degrees.get("cp", 1) > 1 else "")


def with_cp(order: tuple[str, ...]) -> tuple[str, ...]:
    """A placement (innermost first) with "cp" in it: a five-axis placement gets it right after
    "row", the contract's default position."""
    if "cp" in order:
        return order
    i = order.index("row") + 1
    return (*order[:i], "cp", *order[i:])


def check_degrees(degrees: dict[str, int], world_size: int) -> None:
    """Raise GridError unless every degree is a positive int and their product is the world size."""
    axes = ENGINE_MESH if degrees.get("cp", 1) != 1 else MESH_ORDER
    for axis in axes:
        value = degrees[axis]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GridError(f"{FIELDS[axis]} must be a positive integer, got {value!r}")
    product = 1
    for axis in axes:
        product *= degrees[axis]
    if product != world_size:
        factors = "*".join(str(degrees[a]) for a in MESH_ORDER)
        names = "G_data*G_inter*G_intra_d*G_intra_r*G_intra_c"
        if axes == ENGINE_MESH:
            factors, names = factors + f"*{degrees['cp']}", names + "*G_cp"
        raise GridError(
            f"{names} = {factors} = {product} but the world size is "
            f"{world_size} ({grid_string(degrees)})"
        )


@dataclass(frozen=True, kw_only=True)
class Grid:
    """Degrees, this rank's coordinates, the DeviceMesh and one process group per axis.

    `groups[axis]` is the ProcessGroup of every axis (size-1 axes included); `comm_group(axis)` is
    None for size-1 axes, which is what the engine's collectives take (nothing is sent there).
    """

    degrees: dict[str, int]
    placement: tuple[str, ...]
    rank: int
    world_size: int
    coords: dict[str, int]
    device: torch.device
    mesh: DeviceMesh | None = None
    groups: dict[str, Any] = field(default_factory=dict)
    group_names: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None

    def size(self, axis: str) -> int:
        return self.degrees[axis]

    def coord(self, axis: str) -> int:
        return self.coords[axis]

    def group(self, axis: str) -> Any:
        """The ProcessGroup along `axis` containing this rank (a one-rank group when the axis has
        size one)."""
        if axis not in self.degrees:
            raise ValueError(f"axis must be one of {list(self.degrees)}, got {axis!r}")
        return self.groups[axis]

    def comm_group(self, axis: str) -> Any:
        """The group the engine's collectives use along `axis`: None when the axis has size one (skip).

        "data" is the flattened data x cp group when G_cp > 1 (Megatron's dp-cp group): every
        parameter is replicated over cp, so its gradient (and ZeRO's sharding) spans both."""
        if axis == "data":
            return self.groups[axis] if self.degrees["data"] * self.degrees.get("cp", 1) > 1 else None
        return self.groups[axis] if self.degrees[axis] > 1 else None

    def expert_comm_group(self, kind: str) -> Any:
        """The group engine.moe's expert weights use for `kind` ("etp", "ep" or "edp"); None where
        that group has one rank. With expert groups built (engine.init with G_ep > 1 or a G_etp other
        than G_intra_r) they are the folded groups of `expert_groups`; without them the experts are
        split over the row group and replicated over data (x cp), Megatron-Core's defaults
        (expert_tensor_parallel_size = tensor_model_parallel_size, expert-data = data parallel)."""
        if kind not in ("etp", "ep", "edp"):
            raise ValueError(f"kind must be 'etp', 'ep' or 'edp', got {kind!r}")
        if kind in self.degrees:
            return self.comm_group(kind)
        return {"etp": self.comm_group("row"), "ep": None, "edp": self.comm_group("data")}[kind]

    @property
    def grad_shards(self) -> int:
        """How many ranks saw different tokens of one replicated parameter's gradient
        (G_data * G_intra_d * G_cp): the gradient is their mean."""
        return self.batch_shards * self.degrees.get("cp", 1)

    def axis_of_group(self, group_name: str) -> str | None:
        """Grid axis of a process group (by its c10d name), for the communication recorder."""
        for axis, name in self.group_names.items():
            if name == group_name:
                return axis
        return None

    @property
    def batch_shards(self) -> int:
        """How many ways the global batch is split (G_data * G_intra_d)."""
        return self.degrees["data"] * self.degrees["depth"]

    @property
    def batch_shard_index(self) -> int:
        return self.coords["data"] * self.degrees["depth"] + self.coords["depth"]

    @property
    def is_first_stage(self) -> bool:
        return self.coords["inter"] == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords["inter"] == self.degrees["inter"] - 1

    def describe(self) -> str:
        return grid_string(self.degrees)


def local_device_index(rank: int | None = None, gpus_per_node: int | None = None) -> int:
    """This process's GPU on its node: LOCAL_RANK (torchrun), SLURM_LOCALID (Slurm), else
    rank % gpus_per_node (or % the visible device count)."""
    env = os.environ
    for key in ("LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        if key in env:
            return int(env[key])
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else int(env.get("RANK", "0"))
    per_node = gpus_per_node or (torch.cuda.device_count() if torch.cuda.is_available() else 1)
    return rank % max(1, per_node)


def _uses_cuda(backend: str) -> bool:
    return "nccl" in backend or backend.startswith("cuda")


def _init_default_group(backend: str | None, timeout_s: float, gpus_per_node: int | None = None) -> None:
    """Initialize torch.distributed from torchrun or Slurm variables (or a single process)."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        if "MASTER_ADDR" not in env:
            nodes = env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "127.0.0.1"))
            # a plain first host ("nid001" or "a,b"); compressed lists ("nid[001-004]") need MASTER_ADDR
            first = nodes.split(",")[0]
            if "[" in first:
                first = first.split("[")[0] + first.split("[")[1].split("-")[0].split(",")[0].rstrip("]")
            env["MASTER_ADDR"] = first
        env.setdefault("MASTER_PORT", "29500")
    else:
        rank, world = 0, 1
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in env:
            from engine.launch import free_port

            env["MASTER_PORT"] = str(free_port())
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if _uses_cuda(backend):
        torch.cuda.set_device(local_device_index(rank, gpus_per_node))
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def default_group_timeout_s(fallback_s: float = 600.0) -> float:
    """The collective timeout of the default process group (what the launcher passed to
    init_process_group), read from its backend's options; `fallback_s` when none is readable."""
    pg = dist.distributed_c10d._get_default_group()
    for device in pg._device_types:
        try:
            return float(pg._get_backend(device).options._timeout.total_seconds())
        except (AttributeError, RuntimeError):
            continue
    return fallback_s


def set_group_timeout(pg: Any, timeout_s: float) -> None:
    """Give `pg` the grid's collective timeout.

    DeviceMesh builds its per-dim groups with `new_group(timeout=None)` unless a backend_override
    carries options, and `new_group` then falls back to the backend default (30 min on gloo,
    10 min on NCCL): torch/distributed/device_mesh.py `_init_one_process_group` (torch 2.13,
    `timeout = pg_options._timeout if pg_options else None`). `distributed_c10d._set_pg_timeout`
    sets the timeout of an existing group's gloo/NCCL backends.
    """
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s), pg)


def _env_world_size() -> int:
    env = os.environ
    if "WORLD_SIZE" in env:
        return int(env["WORLD_SIZE"])
    if "SLURM_NTASKS" in env:
        return int(env["SLURM_NTASKS"])
    return 1


def init(G_inter: int = 1, G_data: int = 1, G_intra_r: int = 1, G_intra_c: int = 1, G_intra_d: int = 1, *,
         G_cp: int = 1, G_ep: int = 1, G_etp: int | None = None,
         gpus_per_node: int | None = None, placement: tuple[str, ...] | list[str] | None = None,
         backend: str | None = None, device: str | torch.device | None = None,
         timeout_s: float | None = None) -> Grid:
    """Build the grid (and the default process group if needed); return it.

    Positional arguments follow AxoNN's `ax.init(G_inter, G_data, G_intra_r, G_intra_c, G_intra_d)`;
    keywords work in any order. `placement` is the axis order innermost first (perfmodels'
    convention), default ("col", "row", "depth", "inter", "data"). `device`: where this rank's
    tensors live; default `cuda:<local rank>` on NCCL (set as the current device), else the CPU
    (pass "cuda" with the fake backend to run one rank of a large layout on one GPU). Raises
    GridError on every rank, before any collective, when the degrees do not multiply to the world
    size.
    """
    if gpus_per_node is not None and (isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int)
                                      or gpus_per_node < 1):
        raise GridError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    degrees = {"data": G_data, "inter": G_inter, "depth": G_intra_d, "row": G_intra_r, "col": G_intra_c,
               "cp": G_cp}
    given = tuple(placement) if placement is not None else AXES
    five = tuple(a for a in AXES if a != "cp")  # a placement of the five AxoNN axes gets "cp" after "row"
    if sorted(given) not in (sorted(AXES), sorted(five)):
        raise GridError(f"placement must be an ordering of {list(AXES)} (or of {list(five)}), "
                        f"got {list(given)}")
    order = with_cp(given)
    world = dist.get_world_size() if dist.is_initialized() else _env_world_size()
    check_degrees(degrees, world)
    explicit_etp = G_etp is not None and G_etp != G_intra_r
    G_etp = check_expert_degrees(degrees, world, G_ep, G_etp)
    if not dist.is_initialized():
        _init_default_group(backend, 600.0 if timeout_s is None else timeout_s, gpus_per_node)
    if timeout_s is None:
        timeout_s = default_group_timeout_s()
    rank = dist.get_rank()
    if device is None:
        device = "cuda" if _uses_cuda(str(dist.get_backend())) else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", local_device_index(rank, gpus_per_node))
        torch.cuda.set_device(device)
    device_type = device.type
    names = ENGINE_MESH
    shape = tuple(degrees[a] for a in names)
    if order == with_cp(AXES):
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    else:
        ranks = torch.empty(shape, dtype=torch.int64)
        for flat in range(world):
            # mesh index (in MESH_ORDER coordinates) -> world rank placed by `order`
            idx = []
            rem = flat
            for size in reversed(shape):
                idx.append(rem % size)
                rem //= size
            idx.reverse()
            coords = dict(zip(names, idx))
            ranks[tuple(idx)] = rank_of(coords, degrees, order)
        mesh = DeviceMesh(device_type, mesh=ranks, mesh_dim_names=names)
    groups: dict[str, Any] = {}
    group_names: dict[str, str] = {}
    for axis in names:
        if axis == "data" and G_cp > 1:
            # Megatron's dp-cp group: one flattened group over data and cp (the contract counts
            # its traffic under "data"), always a group of its own, so that the recorder tells it
            # from the cp group even when both span the same ranks
            pg = _data_cp_group(rank, degrees, order, timeout_s)
        else:
            pg = mesh[axis].get_group()
        set_group_timeout(pg, timeout_s)
        groups[axis] = pg
        if degrees[axis] > 1 or (axis == "data" and G_cp > 1):  # the recorder attributes only real axes
            group_names[axis] = pg.group_name
    if G_ep > 1 or explicit_etp:
        expert_groups(rank, degrees, order, G_ep, G_etp, timeout_s, groups, group_names)
    if (G_ep > 1 or explicit_etp or G_cp > 1) and world > 1:
        # new_group does not wait for the ranks outside the group: without this a rank could go
        # on (and, in a short script, exit with the store) while others still create theirs
        dist.barrier()
    placed = order if G_cp > 1 or "cp" in given else given  # five axes as before when there is no cp
    grid = Grid(degrees=degrees, placement=placed, rank=rank, world_size=world,
                coords=rank_coords(rank, degrees, order), device=device, mesh=mesh, groups=groups,
                group_names=group_names, timeout_s=timeout_s)
    for axis in ("etp", "ep", "edp"):
        if axis in degrees:
            grid.coords[axis] = dist.get_rank(groups[axis])
    _CURRENT[:] = [grid]
    return grid


EXPERT_RANK_ORDER = ("col", "row", "cp", "depth", "data")
"""Within one pipeline stage, ranks ordered by these coordinates, innermost first (the contract)."""


def check_expert_degrees(degrees: dict[str, int], world: int, G_ep: int, G_etp: int | None) -> int:
    """Validate G_ep/G_etp before any collective; returns G_etp (None -> G_intra_r)."""
    G_etp = degrees["row"] if G_etp is None else G_etp
    for name, value in (("G_ep", G_ep), ("G_etp", G_etp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GridError(f"{name} must be a positive integer, got {value!r}")
    stage = world // degrees["inter"]
    if stage % (G_ep * G_etp):
        raise GridError(f"G_etp*G_ep = {G_etp}*{G_ep} = {G_etp * G_ep} does not divide the ranks of one "
                        f"pipeline stage (world / G_inter = {world}/{degrees['inter']} = {stage})")
    return G_etp


def expert_groups(rank: int, degrees: dict[str, int], order: tuple[str, ...], G_ep: int, G_etp: int,
                  timeout_s: float, groups: dict[str, Any], group_names: dict[str, str]) -> None:
    """The etp, ep and edp groups (shared CP/MoE contract): one pipeline stage's ranks ordered by
    (col, row, cp, depth, data) innermost first; consecutive blocks of G_etp are the etp groups,
    stride G_etp the ep groups, stride G_etp*G_ep the expert-data groups. Every rank creates every
    group, in one order (new_group is collective); fills `groups`/`group_names` and degrees."""
    from itertools import product

    timeout = datetime.timedelta(seconds=timeout_s)
    n = 1
    for a in EXPERT_RANK_ORDER:
        n *= degrees[a]
    G_edp = n // (G_ep * G_etp)
    for inter in range(degrees["inter"]):
        stage = []
        for combo in product(*(range(degrees[a]) for a in reversed(EXPERT_RANK_ORDER))):
            coords = dict(zip(reversed(EXPERT_RANK_ORDER), combo))
            stage.append(rank_of({**coords, "inter": inter}, degrees, order))
        # `stage` lists ranks with col varying fastest (innermost first)
        layouts = {
            "etp": [[stage[b * G_etp + i] for i in range(G_etp)] for b in range(n // G_etp)],
            "ep": [[stage[b * G_etp * G_ep + o + j * G_etp] for j in range(G_ep)]
                   for b in range(G_edp) for o in range(G_etp)],
            "edp": [[stage[o + j * G_etp * G_ep] for j in range(G_edp)] for o in range(G_etp * G_ep)],
        }
        for axis, lists in layouts.items():
            for ranks in lists:
                pg = dist.new_group(ranks, timeout=timeout, group_desc=f"expert_{axis}")
                if rank in ranks:
                    groups[axis] = pg
                    group_names[axis] = pg.group_name
                    degrees[axis] = len(ranks)
    for axis in ("etp", "ep", "edp"):
        if degrees.get(axis, 1) == 1:
            group_names.pop(axis, None)


def _data_cp_group(rank: int, degrees: dict[str, int], order: tuple[str, ...], timeout_s: float) -> Any:
    """This rank's flattened data x cp group; every rank creates every such group, in one order."""
    from itertools import product

    others = [a for a in ENGINE_MESH if a not in ("data", "cp")]
    mine = None
    for combo in product(*(range(degrees[a]) for a in others)):
        coords = dict(zip(others, combo))
        ranks = sorted(rank_of({**coords, "data": d, "cp": c}, degrees, order)
                       for d in range(degrees["data"]) for c in range(degrees["cp"]))
        pg = dist.new_group(ranks, timeout=datetime.timedelta(seconds=timeout_s), group_desc="data_cp")
        if rank in ranks:
            mine = pg
    return mine


def current_grid(grid: Grid | None = None) -> Grid:
    """`grid` if given, else the one the last `engine.init` returned: for the public entry points
    that build something from nothing (engine.Linear, auto_parallelize, create_dataloader, ...)."""
    if grid is not None:
        return grid
    if not _CURRENT:
        raise RuntimeError("no grid: call engine.init(...) first or pass grid=")
    return _CURRENT[0]



def grid_of(model: nn.Module | Any, grid: Grid | None = None) -> Grid:
    """`grid` if given, else the grid `model` was wrapped on (engine.wrap) or built on (the first
    engine layer in it), else the last `engine.init`'s. `model`: a module, or a list of modules
    (BlockPipeline's blocks); anything else (an iterable of parameters) has no grid of its own."""
    if grid is not None:
        return grid
    roots = [model] if isinstance(model, nn.Module) else []
    if isinstance(model, (list, tuple)):
        roots = list(model)
    for root in roots:
        if not isinstance(root, nn.Module):
            continue
        for m in root.modules():
            found = getattr(m, GRID_ATTR, None) or getattr(m, "grid", None)
            if isinstance(found, Grid):
                return found
    return current_grid()
