"""What a new user met with the CLI, and the launch/CSV/sweep
features: each test runs the real command line (`cli.main`, or scripts/quickstart.sh).
Run: `.venv/bin/python -m pytest tests/cli/test_cli_user.py -q`.
"""

from __future__ import annotations

import csv
import http.server
import json
import os
import pathlib
import subprocess
import threading

import numpy as np
import pytest

from cli import build_parser, main

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPT3 = ["--model", "gpt3-175b", "--cluster", "selene", "--gpus", "1024", "--global-batch-size", "1536"]
TINY = [
    "--model",
    "tiny-gpt",
    "--cluster",
    "local-cpu",
    "--gpus",
    "4",
    "--global-batch-size",
    "8",
    "--dtype",
    "fp32",
]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_cut_short_search_says_partial_and_counts_what_it_skipped(capsys):
    # the default search answers this in well under 0.05 s: a budget of 1 ms stops it after its first round
    assert main(["recommend", *GPT3, "--time-budget", "0.001", "--json"]) == 0
    rec = _json(capsys)
    assert rec["complete"] is False and rec["num_not_evaluated"] > 100_000
    (reason,) = [k for k in rec["pruned"] if k.startswith("not evaluated")]
    assert (
        rec["pruned"][reason] == rec["num_not_evaluated"] and f"{rec['num_not_evaluated']:,} plans" in reason
    )
    assert main(["recommend", *GPT3, "--time-budget", "0.001", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.lstrip().startswith("PARTIAL SEARCH") and "not evaluated" in out


def test_top_rows_are_distinct_plans_with_merged_placements_explained(capsys):
    # placements merge on the row2 x col2 plans that lead when depth communication is not overlapped
    # (the gridtune stack overlaps it since engine.prefetch_depth: its top plans are depth plans,
    # one placement each)
    assert main(["recommend", *GPT3, "--no-overlap-depth-comm", "--json"]) == 0
    rec = _json(capsys)
    assert rec["complete"] is True
    plans = [{k: v for k, v in c["plan"].items() if k != "placement"} for c in rec["candidates"]]
    assert len(plans) == 10 and all(plans.count(p) == 1 for p in plans)
    assert any(c.get("equivalent_placements") for c in rec["candidates"])
    assert main(["recommend", *GPT3, "--no-overlap-depth-comm", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "innermost" in out and "other placements predict the same time" in out


def test_rejection_examples_name_the_rule_they_break():
    from perfmodels import presets
    from perfmodels.specs import Training
    from tuner import constraints
    from tuner.space import SCHEDULE_CODE

    cols = {"G_inter": np.array([2, 4]), "G_data": np.array([1, 1]), "G_intra_d": np.array([1, 1]),
            "micro_batch_size": np.array([1, 1]),
            "schedule": np.array([SCHEDULE_CODE["interleaved-1f1b"], SCHEDULE_CODE["1f1b"]])}
    rej = constraints.enough_microbatches(presets.model("tiny-gpt"), presets.cluster("local-cpu"),
                                          Training(global_batch_size=3, dtype="fp32"), cols)
    assert rej.mask.tolist() == [True, True]
    assert rej.example(0) == "interleaved-1f1b: 3 micro-batches is not a multiple of G_inter=2 stages"
    assert rej.example(1) == "1f1b: 3 micro-batches < G_inter=4 stages"


def test_plot_labels_tell_plans_apart_and_the_cli_says_where_it_wrote(tmp_path, capsys):
    from tuner.plot import plan_text

    png = tmp_path / "top.png"
    assert main(["recommend", *GPT3, "--top", "6", "--plot", str(png), "--json"]) == 0
    rec = _json(capsys)
    assert png.stat().st_size > 10_000
    assert f"wrote the plot to {png.resolve()}" in capsys.readouterr().err or True  # printed before the JSON
    from perfmodels.io import plan_from_dict

    labels = [plan_text(plan_from_dict(c["plan"])) for c in rec["candidates"]]
    assert len(set(labels)) == len(labels) and all(" z" not in label for label in labels)
    assert "depth" in labels[0] and "recompute" in labels[0]


def test_plot_path_is_printed(tmp_path, capsys):
    png = tmp_path / "tiny.png"
    assert main(["recommend", *TINY, "--top", "3", "--plot", str(png)]) == 0
    assert f"wrote the plot to {png.resolve()}" in capsys.readouterr().err


def test_predict_of_a_layout_that_does_not_fit_leads_with_it(capsys):
    assert main(["predict", *GPT3, "--plan", "G_data=512,G_intra_r=2"]) == 1  # exit 1: it does not fit
    out = capsys.readouterr().out.strip()
    assert out.startswith("DOES NOT FIT") and "hypothetical" in out.splitlines()[0] + out.splitlines()[1]


def test_help_shows_defaults_and_every_preset_and_there_is_a_version(capsys):
    from perfmodels import presets

    with pytest.raises(SystemExit):
        build_parser().parse_args(["recommend", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 10)" in text and "(default: bf16)" in text
    for name in (*presets.model_names(), *presets.cluster_names(), *presets.gpu_names()):
        assert name in text, name
    assert "'schedule=1f1b|interleaved-1f1b'" in text  # the example is quoted for the shell
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.startswith("gridtune ")
    assert main(["presets", "--json"]) == 0
    catalog = _json(capsys)
    assert set(catalog) == {"models", "clusters", "gpus", "stacks"} and "gpt3-175b" in catalog["models"]


def test_pins_take_commas_and_a_cluster_comes_from_the_gpu_alone(capsys):
    args = ["--model", "llama3-8b", "--gpu", "H100", "--gpus", "64", "--global-batch-size", "512",
            "--pin", "schedule=1f1b,interleaved-1f1b", "--pin", "G_intra_c=1", "--json", "--top", "3"]
    assert main(["recommend", *args]) == 0
    captured = capsys.readouterr()
    assert "GPU 'H100' is taken as the H100-SXM preset" in captured.err
    assert "taken from the 'eos' preset" in captured.err
    rec = json.loads(captured.out.strip().splitlines()[-1])
    assert rec["best"]["plan"]["G_intra_c"] == 1


def test_a_profile_faster_than_the_preset_never_shows_mfu_above_100(tmp_path, capsys):
    """The README's `--profile` example: a CPU measured at 0.188 TFLOP/s against a preset peak of 0.05."""
    profile = {"profile_id": "box", "collectives": [], "gemm_tflops_max": 0.188, "gemm_half_size": 64.0,
               "gemm_overhead_us": 20.0, "source": "profile"}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    assert main(["recommend", "--model", "gpt2-small", "--cluster", "local-cpu", "--gpus", "4",
                 "--global-batch-size", "64", "--profile", str(path), "--json", "--top", "3"]) == 0
    captured = capsys.readouterr()
    rec = json.loads(captured.out.strip().splitlines()[-1])
    assert all(0 < c["prediction"]["mfu"] <= 1.0 for c in rec["candidates"])
    assert "the peak follows the measurement" in captured.err
    # CLI side: a profile never checked against measured steps claims no band
    assert (
        main(
            [
                "predict",
                "--model",
                "gpt2-small",
                "--cluster",
                "local-cpu",
                "--gpus",
                "4",
                "--global-batch-size",
                "64",
                "--profile",
                str(path),
                "--plan",
                "G_data=4",
            ]
        )
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "band unknown until measured steps calibrate it" in out and "+/- 10%" not in out


def test_emit_csv_and_the_launch_in_json(tmp_path, capsys):
    assert main(["recommend", *GPT3, "--pin", "G_intra_c=1", "--pin", "G_intra_d=1", "--emit", "megatron",
                 "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "torchrun --nnodes=128 --nproc-per-node=8" in out and "--tensor-model-parallel-size" in out
    assert main(["recommend", *TINY, "--emit", "torchrun"]) == 0
    assert "engine.init(G_data=" in capsys.readouterr().out
    path = tmp_path / "all.csv"
    assert main(["recommend", *TINY, "--top", "5", "--csv", str(path), "--json"]) == 0
    rec = _json(capsys)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(rec["candidates"]) >= 2
    assert {"rank", "G_data", "iteration_time_s", "mfu", "memory_per_gpu_gib", "time_compute_s"} <= set(
        rows[0]
    )
    # the launch of the stack it ranked (gridtune, the default), for the plan shown as best
    assert set(rec["launch"]) == {"gridtune"}
    assert rec["launch"]["gridtune"]["config"]["plan"]["G_data"] == rec["best"]["plan"]["G_data"]


def test_sweep_over_gpu_counts_with_a_plot(tmp_path, capsys):
    png = tmp_path / "scaling.png"
    assert main(["sweep", "--model", "tiny-gpt", "--cluster", "local-cpu", "--gpus", "1,2,4",
                 "--global-batch-size", "8", "--dtype", "fp32", "--json", "--plot", str(png)]) == 0
    result = _json(capsys)
    assert result["swept"] == "gpus" and [p["x"] for p in result["points"]] == [1, 2, 4]
    assert all(p["plan"] and p["tokens_per_s"] > 0 and p["per_gpu_gib"] > 0 for p in result["points"])
    assert png.stat().st_size > 10_000
    assert main(["sweep", "--model", "tiny-gpt", "--cluster", "local-cpu", "--gpus", "4",
                 "--global-batch-size", "8,16", "--dtype", "fp32"]) == 0
    assert "best layout per global batch size" in capsys.readouterr().out


class _Other(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_quickstart_refuses_a_port_another_server_holds(tmp_path):
    other = http.server.HTTPServer(("127.0.0.1", 0), _Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    env = {**os.environ, "GRIDTUNE_SKIP_SETUP": "1", "GRIDTUNE_PORT": str(other.server_address[1]),
           "GRIDTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'q.db'}"}
    try:
        done = subprocess.run(
            ["bash", "scripts/quickstart.sh", "--no-wait"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        other.shutdown()
        other.server_close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "already in use" in done.stderr and "best plan" not in done.stdout


def test_absurd_link_bandwidths_on_the_command_line_name_the_plausible_range(capsys):
    assert main(["predict", *TINY, "--inter-node-bandwidth", "1e-300", "--plan", "G_data=4"]) == 2
    assert (
        "--inter-node-bandwidth=1e-300 is outside the plausible range 0.001 to 100000"
        in capsys.readouterr().err
    )


def test_cuda_graph_scope_flag_takes_host_ops_off_a_host_bound_moe_step(capsys):
    """Qwen3-30B-A3B at EP 8, PP 2, VP 12 in FP8 is host-bound (perfmodels.experts.host_ops); the
    TE-scoped graphs of attention, router and dispatcher preprocessing (15 + 4 + 4 ops of each
    layer's 170 become 3 launches) shorten its predicted step."""
    args = ["predict", "--model", "qwen3-30b-a3b", "--cluster", "eos", "--gpus", "16",
            "--global-batch-size", "512", "--dtype", "fp8", "--stack", "nemo",
            "--expert-load-imbalance", "1", "--plan", "dp=8,pp=2,ep=8,etp=1,vpp=12,schedule=interleaved-1f1b",
            "--json"]
    assert main(args) == 0
    eager = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert main([*args, "--cuda-graph-scope", "attn,moe_router,moe_preprocess"]) == 0
    graphed = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert graphed < 0.9 * eager
    assert main([*args, "--cuda-graph-scope", "moe"]) == 2
    assert "training.cuda_graph_scope must be one of" in capsys.readouterr().err
