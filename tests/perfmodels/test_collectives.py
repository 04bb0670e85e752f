"""Collective cost identities (textbook alpha-beta, field_facts.md)."""

import dataclasses
import itertools

import numpy as np

from perfmodels import collectives, presets


def t(op, nbytes, p, alpha=10.0, bw=100.0):
    return float(collectives.collective_time_s(op, np.array([nbytes]), np.array([p]), np.array([alpha]),
                                               np.array([bw]))[0])


def test_all_reduce_bandwidth_term_equals_reduce_scatter_plus_all_gather():
    for p in (2, 4, 8, 64):
        n = 1 << 30
        assert np.isclose(
            t("all_reduce", n, p, alpha=0),
            t("reduce_scatter", n, p, alpha=0) + t("all_gather", n, p, alpha=0),
        )


def test_group_of_one_costs_nothing():
    for op in collectives.OPS:
        assert t(op, 1 << 20, 1) == 0.0


def test_time_grows_with_bytes_and_latency_with_group_size():
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
        sizes = [1 << k for k in range(10, 30, 4)]
        times = [t(op, s, 8) for s in sizes]
        assert all(a < b for a, b in itertools.pairwise(times))
    assert t("all_gather", 0, 16) > t("all_gather", 0, 4)


def test_ring_all_reduce_matches_hand_formula():
    # 2(p-1)/p * N / beta with p=4, N=1 GB, busbw 100 GB/s -> 15 ms; tree latency 2*log2(4)=4 steps of 10 us
    assert np.isclose(t("all_reduce", 1e9, 4, alpha=10.0, bw=100.0), 1.5 * 1e9 / 100e9 + 4 * 10e-6)


def test_gloo_reduce_scatter_costs_an_all_reduce():
    cpu = presets.cluster("local-cpu", 4)
    args = (np.array([1e6]), np.array([1.0]), np.array([4.0]), np.array([True]), np.array([4]))
    rs = collectives.cost_s(cpu, "reduce_scatter", *args)
    ar = collectives.cost_s(cpu, "all_reduce", *args)
    assert rs == ar
    nccl = dataclasses.replace(cpu, backend="nccl")
    assert collectives.cost_s(nccl, "reduce_scatter", *args) < 0.6 * ar


def test_inter_node_groups_share_nics():
    selene = presets.cluster("selene", 64)
    one = collectives.expected_busbw_GBps(selene, "all_reduce", "inter", 1)
    eight = collectives.expected_busbw_GBps(selene, "all_reduce", "inter", 8)
    intra = collectives.expected_busbw_GBps(selene, "all_reduce", "intra", 8)
    assert np.isclose(one, 25 * 0.85)          # one GPU's HDR NIC
    assert np.isclose(eight, min(intra, 8 * 25 * 0.85))  # a whole node's NICs, capped by NVLink
    assert one < eight <= intra
