"""Where every rank sits in the grid, which links each group crosses, and how layers split into stages.

An axis missing from a `degrees` mapping has degree 1 (a grid given by its five AxoNN degrees has no
context parallelism).

The engine builds its DeviceMesh from the same functions, so model and engine agree on which
ranks talk to which. Placement is an axis order, innermost (consecutive ranks) first; the
default puts column innermost and data outermost, as AxoNN does.

Group geometry, for a group along one axis with stride `s` (product of the degrees placed inside
it) and size `p`, on nodes of `n` GPUs:
- all members on one node when `s * p <= n` and `n % (s * p) == 0`: level "intra";
- otherwise the group crosses the network with `q = clip(n // s, 1, p)` members per node. Every
  GPU of a node belongs to exactly one group of each axis, so `n / q` groups share the node's NICs
  when they all communicate at once; each group's ring then gets `q` GPUs' worth of NIC bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from perfmodels.specs import AXES

MESH_ORDER = tuple(a for a in reversed(AXES) if a != "cp")
"""Outermost-first names of the engine's five DeviceMesh dims (last name = contiguous ranks): the
default placement reversed, without "cp" (a grid without context parallelism; the engine adds its cp
dim where it builds one)."""
MESH_ORDER_CP = tuple(reversed(AXES))
"""The same with context parallelism: the default placement reversed."""


def strides(degrees: Mapping[str, int], order: Sequence[str] = AXES) -> dict[str, int]:
    """Rank stride of each axis: 1 for the innermost, then the running product of inner degrees."""
    out: dict[str, int] = {}
    running = 1
    for axis in order:
        out[axis] = running
        running *= int(degrees.get(axis, 1))
    return out


def rank_coords(rank: int, degrees: Mapping[str, int], order: Sequence[str] = AXES) -> dict[str, int]:
    """Coordinates of a world rank on each axis."""
    world = int(np.prod([int(degrees.get(a, 1)) for a in order]))
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} is outside the grid of {world} ranks")
    st = strides(degrees, order)
    return {axis: (rank // st[axis]) % int(degrees.get(axis, 1)) for axis in order}


def rank_of(coords: Mapping[str, int], degrees: Mapping[str, int], order: Sequence[str] = AXES) -> int:
    st = strides(degrees, order)
    return int(sum(int(coords.get(a, 0)) * st[a] for a in order))


def group_ranks(rank: int, axis: str, degrees: Mapping[str, int], order: Sequence[str] = AXES) -> list[int]:
    """World ranks of the group along `axis` that contains `rank`, in axis-coordinate order."""
    coords = rank_coords(rank, degrees, order)
    members = []
    for i in range(int(degrees[axis])):
        c = dict(coords)
        c[axis] = i
        members.append(rank_of(c, degrees, order))
    return members


def all_groups(axis: str, degrees: Mapping[str, int], order: Sequence[str] = AXES) -> list[list[int]]:
    """Every group along `axis`, each as its ranks; the list DeviceMesh-independent launchers need."""
    world = int(np.prod([int(degrees.get(a, 1)) for a in order]))
    seen: set[int] = set()
    groups = []
    for r in range(world):
        if r in seen:
            continue
        g = group_ranks(r, axis, degrees, order)
        seen.update(g)
        groups.append(g)
    return groups


# --------------------------------------------------------------------------------------------
# Vectorized group geometry (arrays of plans)
# --------------------------------------------------------------------------------------------


def group_geometry(
    degrees: Mapping[str, np.ndarray], order: Sequence[str], gpus_per_node: int
) -> dict[str, dict[str, np.ndarray]]:
    """For each axis: size, stride, members per node and whether the group crosses nodes.

    `degrees[axis]` are integer arrays of equal length (one entry per plan); `order` is the
    placement shared by those plans.
    """
    n = int(gpus_per_node)
    running = np.ones_like(np.asarray(degrees[order[0]]), dtype=np.int64)
    out: dict[str, dict[str, np.ndarray]] = {}
    for axis in order:
        p = np.asarray(degrees[axis], dtype=np.int64)
        s = running
        span = s * p
        intra = (span <= n) & (n % np.maximum(span, 1) == 0)
        q = np.clip(n // np.maximum(s, 1), 1, None)
        q = np.minimum(q, p)
        q = np.where(intra, p, q)
        out[axis] = {"size": p, "stride": s.copy(), "members_per_node": q, "intra": intra | (p == 1)}
        running = s * p
    return out


def order_strides(degrees: Mapping[str, np.ndarray], orders: Sequence[Sequence[str]],
                  which: np.ndarray) -> dict[str, np.ndarray]:
    """Each axis's stride (the product of the degrees placed inside it) for plans that each take
    one of `orders` (`which`: the index of each plan's), all orders at once: every plan's degrees
    in its own order, an exclusive running product, put back in axis order."""
    axes = list(orders[0])
    perm = np.asarray([[axes.index(a) for a in o] for o in orders], dtype=np.int64)[np.asarray(which)]
    deg = np.stack([np.asarray(degrees[a], dtype=np.int64) for a in axes], axis=1)  # (n, axes)
    placed = np.take_along_axis(deg, perm, axis=1)
    running = np.cumprod(np.concatenate([np.ones((len(deg), 1), np.int64), placed[:, :-1]], axis=1), axis=1)
    strides = np.empty_like(running)
    np.put_along_axis(strides, perm, running, axis=1)
    return {a: strides[:, j] for j, a in enumerate(axes)}


def axis_stride(degrees: Mapping[str, np.ndarray], orders: Sequence[Sequence[str]], which: np.ndarray,
                axis: str) -> np.ndarray:
    """`order_strides(degrees, orders, which)[axis]` alone: the product of the degrees each plan's
    order places inside `axis`, one product per order picked per plan (no per-plan permutation)."""
    which = np.asarray(which)
    out = np.ones(len(which), dtype=np.int64)
    for k, order in enumerate(orders):
        inside = list(order[: list(order).index(axis)])
        if not inside:
            continue
        product = np.asarray(degrees[inside[0]], dtype=np.int64)
        for other in inside[1:]:
            product = product * np.asarray(degrees[other], dtype=np.int64)
        out = np.where(which == k, product, out)
    return out


def group_geometry_orders(degrees: Mapping[str, np.ndarray], orders: Sequence[Sequence[str]],
                          which: np.ndarray, gpus_per_node: int) -> dict[str, dict[str, np.ndarray]]:
    """`group_geometry` of plans that each take one of `orders` (`which`), in one pass (the same
    formulas on each plan's own strides, `order_strides`)."""
    n = int(gpus_per_node)
    strides = order_strides(degrees, orders, which)
    out: dict[str, dict[str, np.ndarray]] = {}
    for axis in orders[0]:
        p = np.asarray(degrees[axis], dtype=np.int64)
        s = strides[axis]
        span = s * p
        intra = (span <= n) & (n % np.maximum(span, 1) == 0)
        q = np.minimum(np.clip(n // np.maximum(s, 1), 1, None), p)
        q = np.where(intra, p, q)
        out[axis] = {"size": p, "stride": s, "members_per_node": q, "intra": intra | (p == 1)}
    return out


# --------------------------------------------------------------------------------------------
# Pipeline stage partition (shared by engine and model)
# --------------------------------------------------------------------------------------------


def partition_layers(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Split `num_layers` blocks into `num_stages` contiguous [start, end) ranges.

    Balanced; when the split is uneven the extra blocks go to the stages after the first (the
    first stage also holds the embedding, the last the LM head and loss), so the busiest stage
    has ceil(num_layers / num_stages) blocks.
    """
    if num_stages < 1 or num_layers < num_stages:
        raise ValueError(
            f"cannot split num_layers={num_layers} into num_stages={num_stages} non-empty stages"
        )
    base, extra = divmod(num_layers, num_stages)
    start_with_extra = 1 if extra < num_stages else 0
    sizes = [base + (1 if start_with_extra <= s < start_with_extra + extra else 0) for s in range(num_stages)]
    bounds = []
    start = 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def partition_chunks(
    num_layers: int, num_stages: int, virtual_stages: int = 1
) -> list[list[tuple[int, int]]]:
    """Interleaved placement: `num_stages * virtual_stages` chunks; stage s holds chunks s, s+S, ..."""
    chunks = partition_layers(num_layers, num_stages * virtual_stages)
    return [[chunks[v * num_stages + s] for v in range(virtual_stages)] for s in range(num_stages)]


# --------------------------------------------------------------------------------------------
# Expert groups of mixture-of-experts layers (MoE parallel folding)
# --------------------------------------------------------------------------------------------

STAGE_ORDER = ("col", "row", "cp", "depth", "data")
"""How a pipeline stage's ranks are numbered for the expert groups: by their coordinates, innermost
first (docs/architecture.md, "The grid")."""


def expert_groups(degrees: Mapping[str, int], G_ep: int, G_etp: int,
                  order: Sequence[str] = AXES) -> dict[str, list[list[int]]]:
    """Every "etp", "ep" and "edp" group as world ranks. Each pipeline stage's world / G_inter ranks,
    numbered by `STAGE_ORDER`, fold into G_etp (consecutive numbers) x G_ep (stride G_etp) x
    expert-data (stride G_etp * G_ep), as Megatron-Core's MoE parallel folding does; the engine builds
    its expert process groups from these lists."""
    stage_size = int(np.prod([int(degrees.get(a, 1)) for a in STAGE_ORDER]))
    if G_ep < 1 or G_etp < 1 or stage_size % (G_ep * G_etp):
        raise ValueError(f"G_etp*G_ep = {G_etp}*{G_ep} = {G_etp * G_ep} does not divide the {stage_size} "
                         "ranks of a pipeline stage (world size / G_inter)")
    edp = stage_size // (G_ep * G_etp)
    out: dict[str, list[list[int]]] = {"etp": [], "ep": [], "edp": []}
    for stage in range(int(degrees.get("inter", 1))):
        ranks = [0] * stage_size
        for local in range(stage_size):
            coords, rest = {"inter": stage}, local
            for axis in STAGE_ORDER:
                size = int(degrees.get(axis, 1))
                coords[axis], rest = rest % size, rest // size
            ranks[local] = rank_of(coords, degrees, order)
        for e in range(edp):
            for p in range(G_ep):
                base = (e * G_ep + p) * G_etp
                out["etp"].append(ranks[base: base + G_etp])
        for e in range(edp):
            for t in range(G_etp):
                out["ep"].append([ranks[(e * G_ep + p) * G_etp + t] for p in range(G_ep)])
        for p in range(G_ep):
            for t in range(G_etp):
                out["edp"].append([ranks[(e * G_ep + p) * G_etp + t] for e in range(edp)])
    return out
