"""What a collective costs: alpha-beta per link level, placement-aware, vectorized over plans.

    t(op, p, N) = latency_steps(op, p) * alpha + bytes_factor(op, p) * N / busbw

N is the full buffer (all-reduce: the tensor; all-gather: the output; reduce-scatter: the input).
`busbw` is the bus bandwidth nccl-tests reports, comparable to one link's bandwidth. For a group
inside one node it is the NVLink/xGMI bandwidth times the library's efficiency; for a group that
crosses nodes with q members on each node, all n/q groups of that axis share the node's NICs at
once, so each ring gets q GPUs' worth of NIC bandwidth (and never more than NVLink).

Ring latency grows with p; NCCL switches to trees (2 log2 p steps) where that is cheaper, so the
latency term is the smaller of the two. gloo has no reduce-scatter algorithm of its own: it runs a
full all-reduce and keeps a slice, so on a gloo cluster reduce-scatter costs an all-reduce.
A fitted profile (gridtune profile) replaces alpha and busbw per (op, level, group size).
"""

from __future__ import annotations

import numpy as np

from perfmodels.specs import Cluster, CollectiveFit

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")


def latency_steps(op: str, p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if op == "all_reduce":
        ring = 2.0 * (p - 1)
        tree = 2.0 * np.ceil(np.log2(np.maximum(p, 1)))
        return np.minimum(ring, np.maximum(tree, np.minimum(ring, 2.0)))
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return p - 1
    if op in ("send_recv", "send", "recv"):
        return np.ones_like(p)
    if op == "broadcast":
        return np.ceil(np.log2(np.maximum(p, 1)))
    raise ValueError(f"unknown collective op {op!r}; known: {list(OPS)}")


def bytes_factor(op: str, p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if op == "all_reduce":
        return 2.0 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    if op in ("send_recv", "send", "recv", "broadcast"):
        return np.ones_like(p)
    raise ValueError(f"unknown collective op {op!r}; known: {list(OPS)}")


def collective_time_s(op: str, nbytes: np.ndarray, p: np.ndarray, alpha_us: np.ndarray,
                      busbw_GBps: np.ndarray) -> np.ndarray:
    """Seconds for one call; zero for groups of one rank."""
    p = np.asarray(p, dtype=np.float64)
    t = latency_steps(op, p) * np.asarray(alpha_us) * 1e-6 + bytes_factor(op, p) * np.asarray(nbytes) / (
        np.asarray(busbw_GBps) * 1e9
    )
    return np.where(p > 1, t, 0.0)


def expected_busbw_GBps(
    cluster: Cluster, op: str, level: str, members_per_node: np.ndarray | int = 1
) -> np.ndarray:
    """What the preset hardware says a group's bus bandwidth should be (GB/s).

    intra: NVLink bandwidth x library efficiency. inter: q GPUs' share of the node's NICs, capped
    by NVLink (q = members of the group on each node).
    """
    intra = cluster.intra_node_bandwidth_GBps * cluster.link_efficiency_intra
    q = np.asarray(members_per_node, dtype=np.float64)
    if level == "intra":
        return np.full_like(q, intra)
    inter = q * cluster.inter_node_bandwidth_GBps * cluster.link_efficiency_inter
    return np.minimum(intra, inter)


def _profile_lookup(fits: tuple[CollectiveFit, ...], op: str, level: str, p: np.ndarray):
    """Fitted (alpha, busbw) for the nearest measured group size of this op and level, or None."""
    cands = [f for f in fits if f.op == op and f.level == level]
    if not cands:
        return None
    sizes = np.array([f.group_size for f in cands], dtype=np.float64)
    alphas = np.array([f.alpha_us for f in cands])
    bws = np.array([f.busbw_GBps for f in cands])
    idx = np.abs(np.log2(np.maximum(p, 1))[:, None] - np.log2(sizes)[None, :]).argmin(axis=1)
    return alphas[idx], bws[idx]


def link_constants(cluster: Cluster, op: str, p: np.ndarray, intra: np.ndarray,
                   members_per_node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(alpha_us, busbw_GBps) for groups of size p; from the profile when it measured this op."""
    p = np.asarray(p, dtype=np.float64)
    intra = np.asarray(intra, dtype=bool)
    if op in ("send", "recv"):
        op = "send_recv"
    alpha = np.where(intra, cluster.intra_node_latency_us, cluster.inter_node_latency_us).astype(np.float64)
    bw_intra = expected_busbw_GBps(cluster, op, "intra", members_per_node)
    bw_inter = expected_busbw_GBps(cluster, op, "inter", members_per_node)
    busbw = np.where(intra, bw_intra, bw_inter)
    prof = cluster.profile
    if prof is not None and prof.collectives:
        for level, mask in (("intra", intra), ("inter", ~intra)):
            if not mask.any():
                continue
            found = _profile_lookup(prof.collectives, op, level, p)
            if found is None and level == "inter":
                found = _profile_lookup(prof.collectives, op, "intra", p)
                if found is not None:  # only intra measured: keep the network share from the preset
                    a, b = found
                    found = (np.maximum(a, cluster.inter_node_latency_us), np.minimum(b, bw_inter))
            if found is not None:
                a, b = found
                alpha = np.where(mask, a, alpha)
                busbw = np.where(mask, b, busbw)
    return alpha, busbw


def costed_op(cluster: Cluster, op: str) -> str:
    """The algorithm that really runs. gloo has no reduce-scatter: it all-reduces the whole buffer
    and keeps a slice, so without measured reduce-scatter constants it is costed as an all-reduce
    (a profile's reduce-scatter fit already contains that behaviour)."""
    if op in ("send", "recv"):
        return "send_recv"
    if cluster.backend == "gloo" and op == "reduce_scatter":
        measured = cluster.profile is not None and any(f.op == op for f in cluster.profile.collectives)
        return op if measured else "all_reduce"
    return op


def cost_s(cluster: Cluster, op: str, byte_calls: np.ndarray, calls: np.ndarray, p: np.ndarray,
           intra: np.ndarray, members_per_node: np.ndarray) -> np.ndarray:
    """Seconds for `calls` calls of `op` moving `byte_calls` bytes in all (full-buffer bytes x calls)."""
    op = costed_op(cluster, op)
    p = np.asarray(p, dtype=np.float64)
    alpha, busbw = link_constants(cluster, op, p, intra, members_per_node)
    measured = cluster.profile is not None and any(f.op == op for f in cluster.profile.collectives)
    if op == "all_to_all" and not measured:
        return all_to_all_s(cluster, byte_calls, calls, p, intra, members_per_node, alpha)
    # `calls` calls pay the latency term each; their bytes add up: the one-call formula with alpha x calls
    return collective_time_s(op, byte_calls, p, alpha * calls, busbw)


def all_to_all_s(cluster: Cluster, byte_calls: np.ndarray, calls: np.ndarray, p: np.ndarray,
                 intra: np.ndarray, members_per_node: np.ndarray, alpha_us: np.ndarray,
                 inter_scale: np.ndarray | float = 1.0) -> np.ndarray:
    """Seconds of all-to-alls moving `byte_calls` input bytes in all, in groups of p ranks with q on
    each node. Unlike a ring, an all-to-all sends every rank's data straight to every peer: of each
    rank's buffer, (q - 1)/p goes to peers on its node over NVLink and (p - q)/p leaves the node
    through the rank's own NIC share (`inter_node_bandwidth_GBps` per GPU), the two at once (NCCL
    posts every peer's send together; nccl-tests' alltoall bus bandwidth on several nodes is the NIC
    rate). Inside one node it is the NVLink rate. `inter_scale`: the share of the off-node bytes that
    really travel (a node-deduplicating dispatcher, `perfmodels.experts.node_dedup`)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.where(np.asarray(intra, bool), p, np.minimum(np.asarray(members_per_node, np.float64), p))
    nvlink = cluster.intra_node_bandwidth_GBps * cluster.link_efficiency_intra * 1e9
    nic = cluster.inter_node_bandwidth_GBps * cluster.link_efficiency_inter * 1e9
    b = np.asarray(byte_calls, dtype=np.float64)
    seconds = np.maximum(b * (q - 1) / p / nvlink, b * (p - q) / p / nic * inter_scale)
    t = latency_steps("all_to_all", p) * alpha_us * 1e-6 * np.asarray(calls) + seconds
    return np.where(p > 1, t, 0.0)
