"""nccl-tests output parses to exactly the numbers it printed (see tests/data/nccl_tests/README.md)."""

from __future__ import annotations

import json
import pathlib

import pytest

from perfmodels import fitting, nccl_tests

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "nccl_tests"
TEXT = DATA / "all_reduce_perf_2x8_a100.txt"
JSON = DATA / "all_gather_perf_1x8_h100.json"


def _row(df, size, in_place):
    hit = df[(df["bytes"] == size) & (df["in_place"] == in_place)]
    assert len(hit) == 1
    return hit.iloc[0]


@pytest.mark.parametrize(
    ("size", "count", "oop", "inp"),
    [
        (8, 2, (36.47, 0.00, 0.00), (34.74, 0.00, 0.00)),
        (4096, 1024, (44.54, 0.09, 0.17), (43.36, 0.09, 0.18)),
        (1048576, 262144, (85.58, 12.25, 22.97), (84.50, 12.41, 23.27)),
        (2097152, 524288, (99.19, 21.14, 39.64), (100.1, 20.94, 39.27)),
        (2147483648, 536870912, (18289, 117.42, 220.16), (17557, 122.31, 229.34)),
        (8589934592, 2147483648, (67689, 126.90, 237.94), (67811, 126.68, 237.52)),
    ],
)
def test_real_text_sample_parses_to_printed_numbers(size, count, oop, inp):
    df = nccl_tests.parse_file(TEXT)
    for in_place, (time_us, algbw, busbw) in ((False, oop), (True, inp)):
        r = _row(df, size, in_place)
        assert (r["count"], r["dtype"], r["redop"], r["root"]) == (count, "float", "sum", -1)
        assert (r["time_us"], r["algbw_GBps"], r["busbw_GBps"]) == (time_us, algbw, busbw)
        assert r["seconds"] == pytest.approx(time_us * 1e-6)
        assert r["wrong"] == 0
        assert r["trial"] == (1 if in_place else 0)


def test_real_text_sample_run_metadata():
    df = nccl_tests.parse_file(TEXT)
    assert len(df) == 2 * 31  # 8 B .. 8 GiB, out-of-place and in-place
    assert set(df["op"]) == {"all_reduce"}  # inferred: count * 4 B == size for a reduction
    assert set(df["group_size"]) == {16}
    assert set(df["level"]) == {"inter"} and set(df["members_per_node"]) == {8}
    assert df["host"].iloc[0] == "nccl-allreduce-job0-mpiworker-0,nccl-allreduce-job0-mpiworker-1"
    # what nccl-tests printed is what our factors say: busbw = algbw * 2(p-1)/p, algbw = size / time
    big = df[df["bytes"] >= 1 << 20]
    factor = float(fitting.bytes_factor("all_reduce", 16))
    assert ((big["busbw_GBps"] - big["algbw_GBps"] * factor).abs() <= 0.02 * big["busbw_GBps"] + 0.01).all()
    algbw = big["bytes"] / big["seconds"] / 1e9
    assert ((algbw - big["algbw_GBps"]).abs() <= 0.01 * big["algbw_GBps"] + 0.01).all()


def test_real_sample_fits_inter_node_all_reduce():
    fits, _ = fitting.fit_collectives(nccl_tests.parse_file(TEXT))
    fit = fits.iloc[0]
    assert (fit["op"], fit["level"], fit["group_size"], fit["members_per_node"]) == (
        "all_reduce",
        "inter",
        16,
        8,
    )
    assert 100 < fit["busbw_GBps"] < 300 and fit["alpha_us"] > 0


def test_json_mode_parses_to_the_file_numbers():
    doc = json.loads(JSON.read_text())
    df = nccl_tests.parse_file(JSON)
    assert len(df) == 2 * len(doc["results"])
    assert set(df["op"]) == {"all_gather"} and set(df["group_size"]) == {8}
    assert set(df["level"]) == {"intra"} and set(df["nccl_version"]) == {"2.27.3"}
    for res in doc["results"][::3]:
        for in_place, key in ((False, "out_of_place"), (True, "in_place")):
            r = _row(df, res["size"], in_place)
            assert (r["count"], r["dtype"], r["redop"], r["root"]) == (res["count"], "float", "none", -1)
            assert (r["time_us"], r["algbw_GBps"], r["busbw_GBps"]) == (
                res[key]["time"], res[key]["alg_bw"], res[key]["bus_bw"])
    fits, _ = fitting.fit_collectives(df[~df["in_place"]])
    assert fits.iloc[0]["alpha_us"] == pytest.approx(8.0, rel=0.01)
    assert fits.iloc[0]["busbw_GBps"] == pytest.approx(360.0, rel=0.01)


NEW_FORMAT = """\
[1,0]<stdout>:# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
[1,0]<stdout>:# Collective test starting: all_gather_perf_mpi
[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
[1,0]<stdout>:#
[1,0]<stdout>:# Using devices
[1,0]<stdout>:#  Rank  0 Group  0 Pid  100 on     nodeA device  0 [0000:19:00] NVIDIA H800
[1,0]<stdout>:#  Rank  1 Group  0 Pid  101 on     nodeA device  1 [0000:3b:00] NVIDIA H800
[1,0]<stdout>:#  Rank  2 Group  0 Pid  200 on     nodeB device  0 [0000:19:00] NVIDIA H800
[1,0]<stdout>:#  Rank  3 Group  0 Pid  201 on     nodeB device  1 [0000:3b:00] NVIDIA H800
[1,0]<stdout>:#
[1,0]<stdout>:#                                                              out-of-place                       in-place
[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
[1,0]<stdout>:#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
[1,0]<stdout>:        1024            64     float    none      -1    20.50    0.05    0.04       0    20.10    0.05    0.04     N/A
[1,0]<stdout>:        2048           128     float    none      -1    21.00    0.10    0.07       0    20.90    0.10    0.07     N/A
[1,0]<stdout>:# Out of bounds values : 0 OK
[1,0]<stdout>:# Collective test concluded: all_gather_perf_mpi
"""


def test_new_format_with_tagged_output():
    df = nccl_tests.parse_text(NEW_FORMAT)
    assert len(df) == 4
    assert set(df["op"]) == {"all_gather"}
    assert set(df["level"]) == {"inter"} and set(df["members_per_node"]) == {2}
    assert set(df["nccl_version"]) == {"2.28.7"}
    r = _row(df, 2048, True)
    assert (r["count"], r["time_us"], r["algbw_GBps"], r["busbw_GBps"]) == (128, 20.90, 0.10, 0.07)
    assert r["wrong"] != r["wrong"]  # N/A -> NaN


OLD_FORMAT = """\
 nThread 1 nGpus 1 minBytes 32 maxBytes 64 step: 2(factor) warmup iters: 5       iters: 20 validation: 1
 Using devices
   Rank  0 Pid 1821213 on AI-A100-01 device  0 [0x00] NVIDIA A100-SXM4-40GB
   Rank  1 Pid 1821214 on AI-A100-01 device  1 [0x00] NVIDIA A100-SXM4-40GB
                                                     out-of-place                       in-place
       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
          32             8   float     sum    12.35    0.00    0.00  0e+00    12.01    0.00    0.00  0e+00
          64            16   float     sum    12.60    0.01    0.01  0e+00    12.33    0.01    0.01  0e+00
 Out of bounds values : 0 OK
"""


def test_old_format_without_root_column_or_comment_marks():
    df = nccl_tests.parse_text(OLD_FORMAT, source="all_reduce_perf.log")
    assert len(df) == 4 and set(df["op"]) == {"all_reduce"} and set(df["group_size"]) == {2}
    r = _row(df, 64, False)
    assert (r["count"], r["redop"], r["root"], r["time_us"], r["busbw_GBps"], r["wrong"]) == (
        16, "sum", -1, 12.60, 0.01, 0.0)


def test_infer_op_and_test_names():
    assert nccl_tests.infer_op(4096, 1024, "float", "sum", -1, 8) == "all_reduce"
    assert nccl_tests.infer_op(4096, 128, "float", "sum", -1, 8) == "reduce_scatter"
    assert nccl_tests.infer_op(4096, 1024, "float", "none", -1, 8) == "send_recv"
    assert nccl_tests.infer_op(4096, 1024, "half", "none", 0, 8) == "broadcast"
    assert nccl_tests.infer_op(4096, 128, "float", "none", -1, 8) is None  # all_gather or alltoall
    assert nccl_tests.op_from_test_name("./build/alltoall_perf") == "all_to_all"
    assert nccl_tests.op_from_test_name("sendrecv_perf_mpi") == "send_recv"
    assert nccl_tests.op_from_test_name("a100_reduce_scatter_2node.txt") == "reduce_scatter"
    assert nccl_tests.nccl_version_from_code(23003) == "2.30.3"
    assert nccl_tests.nccl_version_from_code(2708) == "2.7.8"


def test_files_without_results_are_named(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing here\n")
    with pytest.raises(ValueError, match=r"empty\.txt"):
        nccl_tests.parse_files([empty])
    with pytest.raises(ValueError, match="no such file"):
        nccl_tests.parse_files([tmp_path / "missing.txt"])
