"""`gridtune recommend` and `gridtune predict` as a user runs them (`python -m cli`, a real process):
one JSON object, one-line errors, a plot file.

Run: `.venv/bin/python -m pytest -q tests/cli/test_cli_search.py`.
"""

import json
import subprocess
import sys

from perfmodels.specs import Plan


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_recommend_json_is_one_object():
    out = run_cli("recommend", "--model", "gpt3-175b", "--cluster", "selene", "--gpus", "64",
                  "--global-batch-size", "256", "--top", "3", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) >= {"best", "candidates", "num_evaluated", "pruned"}
    assert len(data["candidates"]) == 3
    plan = Plan(**{k: (tuple(v) if k == "placement" else v) for k, v in data["best"]["plan"].items()})
    assert plan.world_size == 64
    assert data["best"]["prediction"]["iteration_time_s"] > 0
    assert data["best"]["prediction"]["memory"]["fits"] is True


def test_cli_predict_and_errors_are_one_line():
    ok = run_cli("predict", "--model", "gpt3-175b", "--cluster", "selene", "--gpus", "64",
                 "--global-batch-size", "64", "--plan", "G_inter=8,G_intra_r=8,recompute=full", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["memory"]["fits"]
    bad = run_cli("predict", "--model", "gpt3-175b", "--cluster", "selene", "--gpus", "64",
                  "--global-batch-size", "64", "--plan", "G_inter=8,G_intra_r=4")
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0
    assert "= 32 but cluster.num_gpus = 64" in bad.stderr
    worse = run_cli("recommend", "--model", "gpt3-175b", "--cluster", "selene", "--global-batch-size", "8",
                    "--pin", "G_foo=2")
    assert (
        worse.returncode == 2 and "unknown field 'G_foo'" in worse.stderr and "Traceback" not in worse.stderr
    )


def test_cli_plot_writes_a_png(tmp_path):
    path = tmp_path / "top.png"
    out = run_cli("recommend", "--model", "gpt3-1.7b", "--cluster", "selene", "--gpus", "16",
                  "--global-batch-size", "64", "--top", "4", "--plot", str(path), "--json")
    assert out.returncode == 0, out.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
