"""`gridtune profile`: import nccl-tests, measure 2 gloo ranks, write/read files, upload to a local server."""

from __future__ import annotations

import argparse
import http.server
import json
import pathlib
import threading
from typing import ClassVar

import pandas as pd
import pytest

from cli import main
from cli.profile import parse_bytes
from perfmodels import fitting
from perfmodels.io import profile_from_dict
from tuner import profiles

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "nccl_tests"
SAMPLES = [str(DATA / "all_reduce_perf_2x8_a100.txt"), str(DATA / "all_gather_perf_1x8_h100.json")]


def _json_out(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_import_nccl_tests_writes_profile_rows_and_expectations(tmp_path, capsys):
    out = tmp_path / "sel.json"
    code = main(["profile", "--import-nccl-tests", *SAMPLES, "--cluster", "selene", "--name", "sel",
                 "--out", str(out), "--json"])
    assert code == 0
    doc = _json_out(capsys)
    assert doc["profile_id"] == "sel"
    assert 0 <= doc["holdout_median_abs_error"] < 1
    assert doc["provenance"]["source"] == "nccl-tests" and doc["provenance"]["nccl_version"] == "2.27.3"
    assert {(c["op"], c["level"], c["group_size"]) for c in doc["collectives"]} == {
        ("all_reduce", "inter", 16), ("all_gather", "intra", 8)}
    exp = {(e["op"], e["level"]): e for e in doc["expected"]}
    assert exp[("all_gather", "intra")]["ratio"] == pytest.approx(
        exp[("all_gather", "intra")]["measured_busbw_GBps"]
        / exp[("all_gather", "intra")]["expected_busbw_GBps"]
    )
    profile, saved = profiles.read_profile(out)
    assert len(profile.collectives) == 2 and saved["fits"] == doc["fits"]
    rows = profiles.read_rows(profiles.rows_path_for(out))
    assert list(rows.columns[: len(fitting.RAW_COLUMNS)]) == list(fitting.RAW_COLUMNS)
    assert len(rows) == 2 * 31 + 2 * 11


def test_measure_two_gloo_ranks_quick(tmp_path, capsys):
    """Also: says at once what it is doing, and `--nproc 2 --upload` stores a cluster
    of 2 GPUs, not the preset's 4."""
    out = tmp_path / "local.json"
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Recorder.seen = []
    try:
        code = main(["profile", "--nproc", "2", "--quick", "--max-bytes", "32K", "--out", str(out), "--json",
                     "--name", "box", "--upload", f"http://127.0.0.1:{server.server_address[1]}"])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0
    captured = capsys.readouterr()
    assert "starting 2 ranks (gloo)" in captured.err
    doc = json.loads(captured.out.strip().splitlines()[-1])
    assert _Recorder.seen[0][2]["cluster"]["num_gpus"] == 2
    prov = doc["provenance"]
    assert prov["backend"] == "gloo" and prov["world_size"] == 2 and prov["torch_version"]
    assert prov["expected_from_cluster"] == "local-cpu"
    ops = {f["op"] for f in doc["fits"]}
    assert ops == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert all(f["n_points"] == 4 and f["busbw_GBps"] > 0 for f in doc["fits"])  # 4, 8, 16, 32 KiB
    assert doc["holdout_median_abs_error"] is not None
    assert doc["gemm_tflops_max"] > 0 and doc["hbm_bandwidth_GBps"] > 0
    assert len(doc["expected"]) == len(doc["fits"])
    rows = pd.read_csv(doc["rows_path"])
    assert {"gemm", "copy", "all_reduce"} <= set(rows["op"])
    assert set(rows.loc[rows["op"] == "all_reduce", "backend"]) == {"gloo"}
    profile, _ = profiles.read_profile(out)
    assert profile.gemm_tflops_max == pytest.approx(doc["gemm_tflops_max"])


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((self.path, dict(self.headers), json.loads(body)))
        reply = json.dumps({"id": "c1", "name": "sel"}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def test_upload_posts_profile_with_bearer_key(tmp_path, capsys, monkeypatch):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.seen = []
    monkeypatch.setenv("GRIDTUNE_API_KEY", "s3cret")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        code = main(["profile", "--import-nccl-tests", SAMPLES[0], "--cluster", "selene", "--name", "sel",
                     "--out", str(tmp_path / "p.json"), "--upload", url, "--json"])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0
    assert _json_out(capsys)["uploaded"] == {"id": "c1", "name": "sel"}
    path, headers, body = _Recorder.seen[0]
    assert path == "/v1/clusters"
    assert headers["Authorization"] == "Bearer s3cret"
    assert body["name"] == "sel" and body["cluster"] == {"preset": "selene", "num_gpus": 4480}
    profile = profile_from_dict(body["profile"])  # what the service will parse
    assert profile.collectives[0].op == "all_reduce"
    assert body["profile"]["provenance"]["holdout_median_abs_error"] is not None


def test_upload_failure_is_one_line_error(tmp_path, capsys):
    code = main(
        [
            "profile",
            "--import-nccl-tests",
            SAMPLES[0],
            "--name",
            "x",
            "--out",
            str(tmp_path / "p.json"),
            "--upload",
            "http://127.0.0.1:9",
        ]
    )
    assert code == 2
    assert "upload to http://127.0.0.1:9/v1/clusters failed" in capsys.readouterr().err


def test_bad_inputs_exit_2(tmp_path, capsys):
    assert (
        main(
            ["profile", "--import-nccl-tests", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "x.json")]
        )
        == 2
    )
    assert "no such file" in capsys.readouterr().err
    assert main(["profile", "--import-nccl-tests", SAMPLES[0], "--cluster", "nowhere",
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "unknown cluster preset" in capsys.readouterr().err


def test_fits_with_negative_r2_are_warned_about():
    from cli.profile import fit_warnings

    doc = {
        "fits": [
            {"op": "all_reduce", "level": "intra", "group_size": 2, "members_per_node": 2, "r2": -0.4},
            {"op": "all_gather", "level": "intra", "group_size": 2, "members_per_node": 2, "r2": 0.99},
        ]
    }
    (warning,) = fit_warnings(doc)
    assert "all_reduce intra over 2 ranks" in warning and "R^2 = -0.40 < 0" in warning


def test_parse_bytes():
    assert parse_bytes("4096") == 4096
    assert parse_bytes("4M") == 4 << 20 and parse_bytes("64KiB") == 64 << 10 and parse_bytes("1g") == 1 << 30
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bytes("lots")


def test_runs_in_place_under_torchrun_environment(tmp_path):
    """With RANK/WORLD_SIZE set (as torchrun does), every rank measures and rank 0 writes the files."""
    import os
    import subprocess
    import sys

    from engine.launch import free_port

    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "inplace.json"
    port = str(free_port())
    code = ("import sys; from cli import main; sys.exit(main(['profile', '--quick', '--max-bytes', '8K', "
            f"'--ops', 'all_reduce,send_recv', '--out', {str(out)!r}]))")
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=root, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert "Collectives (gloo, 2 ranks" in results[0][0] and results[1][0] == ""
    profile, doc = profiles.read_profile(out)
    assert {c.op for c in profile.collectives} == {"all_reduce", "send_recv"}
    assert doc["provenance"]["world_size"] == 2


def test_upload_to_the_real_service_route(tmp_path):
    """The body `gridtune profile --upload` sends is accepted by POST /v1/clusters, and a wrong key
    is refused."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import Settings
    from perfmodels import presets

    out = tmp_path / "sel.json"
    assert main(["profile", "--import-nccl-tests", *SAMPLES, "--cluster", "selene", "--name", "sel",
                 "--out", str(out)]) == 0
    _, doc = profiles.read_profile(out)
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'store.db'}", api_key="k3y"))
    with TestClient(app) as client:
        with pytest.raises(ValueError, match=r"HTTP 40[13]"):
            profiles.upload("", doc, name="sel", api_key="wrong", client=client)
        answer = profiles.upload("", doc, name="sel", cluster=presets.cluster("selene"), api_key="k3y",
                                 client=client)
        stored = client.get(f"/v1/clusters/{answer['id']}").json()
    assert stored["name"] == "sel"
    assert {(c["op"], c["group_size"]) for c in stored["profile"]["collectives"]} == {
        ("all_reduce", 16), ("all_gather", 8)}
