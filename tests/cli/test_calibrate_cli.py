"""`gridtune calibrate`: runs from a JSON-lines file, a validation-format CSV or a log, stored in the
service store or a file, then used by `gridtune predict --profile NAME|FILE`."""

from __future__ import annotations

import csv
import json
import pathlib

import pytest

from cli import main
from perfmodels import presets
from perfmodels.constants import apply_constants, priors
from perfmodels.specs import Plan, Training
from perfmodels.steptime import predict

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = presets.model("gpt3-7.5b")
CLUSTER = presets.cluster("selene", num_gpus=64)
TRAINING = Training(global_batch_size=256, stack="megatron-core")
PLANS = [{"G_data": 8, "G_intra_r": 8, "micro_batch_size": 2},
         {"G_data": 16, "G_intra_r": 4, "micro_batch_size": 1},
         {"G_data": 8, "G_inter": 2, "G_intra_r": 4, "micro_batch_size": 1}]
HELD_OUT = "G_data=32,G_intra_r=2,micro_batch_size=2"
TRUTH = {"gemm_efficiency": priors(CLUSTER, TRAINING)["gemm_efficiency"] * 0.7}


def _measured(plan: dict) -> float:
    cluster, training = apply_constants(CLUSTER, TRAINING, TRUTH)
    return predict(MODEL, cluster, training, Plan(**plan)).iteration_time_s


def _jsonl(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "runs.jsonl"
    lines = [json.dumps({"model": {"preset": "gpt3-7.5b"}, "training": {"global_batch_size": 256},
                         "plan": plan, "iteration_time_s": _measured(plan)}) for plan in PLANS]
    path.write_text("# three measured layouts\n" + "\n".join(lines) + "\n")
    return path


def _predict(capsys, *extra: str) -> dict:
    capsys.readouterr()
    assert main(["predict", "--model", "gpt3-7.5b", "--global-batch-size", "256", "--stack", "megatron-core",
                 "--plan", HELD_OUT, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_jsonl_runs_to_a_file_then_predict_with_it(tmp_path, capsys) -> None:
    out = tmp_path / "selene.json"
    assert main(["calibrate", "--runs", str(_jsonl(tmp_path)), "--cluster", "selene", "--gpus", "64",
                 "--stack", "megatron-core", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gemm_efficiency" in text and "leave-one-out" in text and "kept at its prior" in text
    doc = json.loads(out.read_text())
    assert doc["source"] == "calibrated" and doc["constants"]["gemm_efficiency"] < 0.8
    want = _measured({"G_data": 32, "G_intra_r": 2, "micro_batch_size": 2})
    calibrated = _predict(capsys, "--profile", str(out))  # the calibration's own cluster: no --cluster needed
    plain = _predict(capsys, "--cluster", "selene", "--gpus", "64")
    assert calibrated["constants_source"] == "calibrated"
    error = {k: abs(p["iteration_time_s"] - want) / want for k, p in (("cal", calibrated), ("plain", plain))}
    assert error["cal"] < 0.03 < error["plain"]


def test_stored_by_name_in_the_service_store(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("GRIDTUNE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    assert main(["calibrate", "--runs", str(_jsonl(tmp_path)), "--cluster", "selene", "--gpus", "64",
                 "--name", "my-selene", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["profile"] == "my-selene" and answer["parameters"]["gemm_efficiency"]["fitted"]
    pred = _predict(capsys, "--cluster", "selene", "--gpus", "64", "--profile", "my-selene")
    assert pred["constants_source"] == "calibrated" and pred["uncertainty_rel"] == answer["uncertainty_rel"]


def test_validation_csv_runs(tmp_path, capsys) -> None:
    out = tmp_path / "v100.json"
    src = ROOT / "validation" / "data" / "published_dev.csv"
    with open(src, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader
                if r["gpu_type"] == "V100-SXM2-16GB" and r["framework"] == "megatron-lm"][:6]
        fields = reader.fieldnames
    csv_path = tmp_path / "runs.csv"
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    assert main(["calibrate", "--runs", str(csv_path), "--out", str(out), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(answer["runs"]) >= 2 and answer["mape_after"] <= answer["mape_before"]


def test_bad_runs_file_names_the_run(tmp_path, capsys) -> None:
    path = _jsonl(tmp_path)
    lines = path.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["iteration_time_s"] = 0
    path.write_text("\n".join([lines[0], lines[1], json.dumps(bad)]) + "\n")
    assert main(["calibrate", "--runs", str(path), "--cluster", "selene", "--gpus", "64",
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "runs[1].iteration_time_s" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("missing", ["--runs", "--cluster"])
def test_missing_input_is_one_line(tmp_path, capsys, missing) -> None:
    args = ["calibrate", "--runs", str(_jsonl(tmp_path)), "--cluster", "selene", "--gpus", "64"]
    i = args.index(missing)
    del args[i:i + 2]
    if missing == "--cluster":
        del args[args.index("--gpus"):args.index("--gpus") + 2]
    assert main(args) == 2
    assert "gridtune: error:" in capsys.readouterr().err
