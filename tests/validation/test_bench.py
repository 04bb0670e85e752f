"""bench/validate_published.py end to end: a small file, --json, and the no-usable-row exit."""

import importlib.util
import json
from pathlib import Path

from .rows import row, write

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "validate_published", ROOT / "bench" / "validate_published.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_json_report_over_a_data_dir_and_an_extra_csv(tmp_path: Path, capsys, monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench, "plans_per_second", lambda: 1.0)
    data = tmp_path / "data"
    data.mkdir()
    write(data / "a.csv", row(), row(micro_batch_size="2", metric_value="2.7"), row(micro_batch_size="8"))
    extra = write(tmp_path / "b.csv", row(linear_precision="", attention_precision=""))
    assert bench.main(["--data-dir", str(data), "--csv", str(extra), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows_used"] == 4 and report["multi_candidate_rows"] == 1
    assert report["per_framework"]["megatron-core"]["rows"] == 4
    # a ranking group is one workload: the row that leaves its precision open is not ranked with the three
    # bf16 rows (groups need >= 3 runs), which stay a group of their own
    assert len(report["groups"]) == 1 and report["groups"][0]["runs"] == 3
    assert set(report["iteration_time_fastest_fitting_candidate"]) == {"rows", "mape", "median", "p90"}


def test_text_report_names_its_figures(tmp_path: Path, capsys, monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench, "plans_per_second", lambda: 1.0)
    write(tmp_path / "a.csv", row(peak_memory_gib="30"))
    assert bench.main(["--data-dir", str(tmp_path), "--verbose"]) == 0
    out = capsys.readouterr().out
    for words in ("iteration-time MAPE (median candidate)", "fastest fitting candidate", "per source:",
                  "per framework:", "false OOM", "OOM rows", "memory MAPE", "plans/s"):
        assert words in out


def test_no_usable_row_exits_1_naming_the_options(tmp_path: Path, capsys):
    write(tmp_path / "bad.csv", row(global_batch_size=""))
    assert _bench().main(["--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "--data-dir" in err and "--csv" in err and "global batch size" in err
    assert _bench().main(["--data-dir", str(tmp_path / "nowhere")]) == 1


def test_a_missing_extra_csv_is_named(tmp_path: Path, capsys):
    assert _bench().main(["--csv", str(tmp_path / "absent.csv")]) == 1
    assert "absent.csv" in capsys.readouterr().err


def test_vtrain_residuals_starts_from_the_ranking_validate_published_reports(capsys):
    """bench/vtrain_residuals.py: its unweighted line is the model as validate_published scores the same
    vTrain groups (Spearman and the measured best's predicted rank)."""
    from validation import loader, summary
    from validation.scoring import score_case

    spec = importlib.util.spec_from_file_location("vtrain_residuals", ROOT / "bench" / "vtrain_residuals.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    d = mod.runs()
    got = mod.ranking(d, d["predicted"].to_numpy())
    cases = loader.load([loader.DATA_DIR / "vtrain_multi.csv"]).cases
    groups = summary.ranking_groups([(c, score_case(c)) for c in cases])
    want = {g.group.split()[1]: (g.spearman, g.measured_best_predicted_rank) for g in groups}
    assert {k: (round(r, 6), b) for k, (r, b) in got.items()} == {
        k: (round(r, 6), b) for k, (r, b) in want.items()}
