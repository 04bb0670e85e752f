"""The command line in its users' words: Megatron's names in --plan and --pin, "did you mean" for
preset names, every missing model field at once, why pins leave nothing, an exit status that says
whether a layout fits, one-line database errors, a GPU by its short name in a cluster file.
Each test runs the real command line (`cli.main`)."""

from __future__ import annotations

import json

import pytest

from cli import main

LLAMA = ["--model", "llama3-70b", "--cluster", "eos", "--gpus", "256", "--global-batch-size", "512",
         "--stack", "megatron-core"]
GRID_PLAN = "G_data=16,G_inter=4,G_intra_r=4,virtual_stages=5,micro_batch_size=1,schedule=interleaved-1f1b," \
            "sequence_parallel=true,zero_stage=2"
MEGATRON_PLAN = "dp=16,pp=4,tp=4,vpp=5,mbs=1,schedule=interleaved-1f1b,sequence_parallel=true,zero_stage=2"


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_predict_takes_megatron_names_and_answers_flat_like_rest(capsys):
    assert main(["predict", *LLAMA, "--plan", GRID_PLAN, "--json"]) == 0
    by_grid = _json(capsys)
    assert main(["predict", *LLAMA, "--plan", MEGATRON_PLAN, "--json"]) == 0
    by_alias = _json(capsys)
    assert by_alias == by_grid
    # the REST shape: the prediction at the top, the plan beside it
    assert by_alias["memory"]["fits"] is True and by_alias["iteration_time_s"] > 0
    assert by_alias["plan"]["G_intra_r"] == 4 and by_alias["plan"]["virtual_stages"] == 5
    from fastapi.testclient import TestClient

    from api import create_app
    from api.settings import Settings

    with TestClient(create_app(Settings(database_url="sqlite://"))) as client:
        rest = client.post("/v1/predict", json={
            "model": {"preset": "llama3-70b"}, "cluster": {"preset": "eos", "num_gpus": 256},
            "training": {"global_batch_size": 512, "stack": "megatron-core"},
            "plan": {"dp": 16, "pp": 4, "tp": 4, "vpp": 5, "mbs": 1, "schedule": "interleaved-1f1b",
                     "sequence_parallel": True, "zero_stage": 2}}).json()
    assert set(rest) - {"profile_id"} <= set(by_alias)
    assert rest["iteration_time_s"] == by_alias["iteration_time_s"]


def test_predict_exits_1_when_the_layout_does_not_fit(capsys):
    # ZeRO-1 instead of 2: 80.6 GiB on an 80 GiB H100
    plan = MEGATRON_PLAN.replace("zero_stage=2", "zero_stage=1")
    assert main(["predict", *LLAMA, "--plan", plan, "--json"]) == 1
    assert _json(capsys)["memory"]["fits"] is False
    assert main(["predict", *LLAMA, "--plan", plan]) == 1
    assert capsys.readouterr().out.startswith("DOES NOT FIT")


def test_an_alias_and_its_field_together_or_an_unmodelled_alias_is_one_line(capsys):
    assert main(["predict", *LLAMA, "--plan", "tp=4,G_intra_r=4,dp=64"]) == 2
    assert "'tp' and 'G_intra_r' both set G_intra_r" in capsys.readouterr().err
    from perfmodels.specs import Plan

    if "G_cp" not in Plan.__dataclass_fields__:  # until context parallelism is modelled
        assert main(["predict", *LLAMA, "--plan", "tp=4,cp=2,dp=32"]) == 2
        assert "'cp' means G_cp, which this version of gridtune does not model yet" in capsys.readouterr().err


def test_pins_take_megatron_names(capsys):
    args = ["recommend", *LLAMA, "--top", "3", "--json"]
    assert main([*args, "--pin", "tp=8", "--pin", "pp=1,2", "--pin", "mbs=1"]) == 0
    by_alias = _json(capsys)
    assert main([*args, "--pin", "G_intra_r=8", "--pin", "G_inter=1,2", "--pin", "micro_batch_size=1"]) == 0
    assert by_alias["candidates"] == _json(capsys)["candidates"]
    assert all(c["plan"]["G_intra_r"] == 8 for c in by_alias["candidates"])
    assert main([*args, "--pin", "G_intra=8"]) == 2
    assert "did you mean 'G_intra_r'?" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "name", "suggestion"), [
    ("--model", "llama3-70", "did you mean 'llama3-70b'"),
    ("--cluster", "selen", "did you mean 'selene'"),
    ("--gpu", "H10", "did you mean 'H20'"),
])
def test_unknown_preset_names_suggest_the_closest(capsys, flag, name, suggestion):
    args = {"--model": "llama3-8b", "--cluster": "eos", "--gpus": "8", "--global-batch-size": "8"}
    args[flag] = name
    assert main(["predict", *[x for kv in args.items() for x in kv], "--plan", "tp=8"]) == 2
    err = capsys.readouterr().err
    assert suggestion in err and err.count("\n") == 1


def test_every_missing_model_field_in_one_message(tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"num_layers": 32, "hidden_size": 4096}))
    assert main(["predict", "--model-file", str(path), "--cluster", "eos", "--gpus", "8",
                 "--global-batch-size", "8", "--plan", "tp=8"]) == 2
    assert "model is missing num_attention_heads, seq_length, vocab_size" in capsys.readouterr().err


@pytest.mark.parametrize(("pins", "says"), [
    (["G_intra_r=3"], "G_intra_r=3: no grid of 256 GPUs has it (3 does not divide 256)"),
    (["tp=128"], "G_intra_r=128: every layout with it is rejected by G_intra_r does not divide "
                 "model.num_attention_heads=64"),
    (["tp=8", "pp=80"], "G_inter=80: no grid of 256 GPUs has it"),
])
def test_pins_that_empty_the_space_say_which_rule_rejected_each_value(capsys, pins, says):
    args = ["recommend", *LLAMA, "--json"]
    for pin in pins:
        args += ["--pin", pin]
    assert main(args) == 1
    out = _json(capsys)
    assert out["best"] is None and says in out["explanation"], out["explanation"]
    if len(pins) == 2:  # tp=8 is fine alone: the combination is what is rejected
        assert "G_intra_r=8 has valid layouts alone" in out["explanation"]


@pytest.mark.parametrize(("url", "says"), [
    ("foo://bar", "unknown database kind"),
    ("not a url", "not a database URL"),
    ("postgresql+psycopg://someone:secret@127.0.0.1:1/x", "cannot open it"),
])
@pytest.mark.parametrize("command", [["db", "status"], ["serve", "--port", "0"]])
def test_bad_database_urls_are_one_line(capsys, monkeypatch, url, says, command):
    monkeypatch.setenv("GRIDTUNE_DATABASE_URL", "sqlite://")  # `serve` exports its URL: restored after
    assert main([*command, "--database-url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gridtune: error: --database-url") and says in err
    assert err.count("\n") == 1 and "secret" not in err and "Traceback" not in err


def test_cluster_file_with_a_gpu_name_and_a_count(tmp_path, capsys):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"gpu": "H100", "num_gpus": 256}))
    base = ["predict", "--model", "llama3-70b", "--global-batch-size", "512", "--stack", "megatron-core",
            "--plan", MEGATRON_PLAN, "--json"]
    assert main([*base, "--cluster-file", str(path)]) == 0
    from_file = _json(capsys)
    assert main([*base, "--cluster", "eos", "--gpus", "256"]) == 0
    assert from_file["iteration_time_s"] == _json(capsys)["iteration_time_s"]
    assert main([*base, "--gpu", "MI300", "--gpus", "256"]) == 0
    assert _json(capsys)["memory"]["capacity_gib"] == 192.0


@pytest.mark.parametrize(("ranks", "per_rank_gib"), [(1, 24.0), (4, 6.0), (8, 3.0), (16, 3.0)])
def test_local_cpu_ranks_share_the_host_memory(capsys, ranks, per_rank_gib):
    """CPU ranks are processes of one host: the preset's 24 GiB is divided among the ranks on a node
    (8 per node), not given to each."""
    code = main(["predict", "--model", "gpt2-small", "--cluster", "local-cpu", "--gpus", str(ranks),
                 "--global-batch-size", "16", "--dtype", "fp32", "--plan", f"G_data={ranks}", "--json"])
    assert code in (0, 1)
    assert _json(capsys)["memory"]["capacity_gib"] == per_rank_gib


def test_zero_stages_with_the_same_time_and_memory_are_one_row(capsys):
    """GPT-3 175B on 1,024 Selene GPUs: ZeRO-1 and ZeRO-2 of the best grid predict the same step and
    memory; they are one row ("1=2"), so the top list holds distinct layouts."""
    import tuner
    from perfmodels import Training, presets
    from perfmodels.steptime import predict

    model, cluster = presets.model("gpt3-175b"), presets.cluster("selene", 1024)
    training = Training(global_batch_size=1536)
    rec = tuner.recommend(model, cluster, training, top_k=6)
    merged = [c for c in rec.candidates if c.equivalent_zero_stages]
    assert merged, "expected ZeRO-1/2 twins in the top list"
    keys = set()
    for c in rec.candidates:
        # no two rows left that differ only in the ZeRO stage at the same time and memory
        pred = c.prediction
        key = (c.plan.grid_string(), c.plan.micro_batch_size, c.plan.schedule, c.plan.virtual_stages,
               c.plan.recompute, round(pred.iteration_time_s, 6), round(pred.memory.per_gpu_gib, 6))
        assert key not in keys
        keys.add(key)
    for c in merged:
        for z in c.equivalent_zero_stages:  # each merged stage really predicts the same
            from dataclasses import replace

            twin = predict(model, cluster, training, replace(c.plan, zero_stage=z))
            assert twin.iteration_time_s == pytest.approx(c.prediction.iteration_time_s, rel=1e-6)
            assert twin.memory.per_gpu_gib == pytest.approx(c.prediction.memory.per_gpu_gib, rel=1e-6)
    assert main(["recommend", "--model", "gpt3-175b", "--cluster", "selene", "--gpus", "1024",
                 "--global-batch-size", "1536", "--top", "6", "--json"]) == 0
    out = _json(capsys)
    assert [c.get("equivalent_zero_stages", []) for c in out["candidates"]] == \
        [list(c.equivalent_zero_stages) for c in rec.candidates]


def test_table_shows_the_real_innermost_axis_and_sequence_parallelism(capsys):
    from cli.recommend import innermost_axis
    from perfmodels.specs import Plan

    assert innermost_axis(Plan(G_data=8, G_intra_r=8)) == "row"  # col has one rank: not "col"
    assert innermost_axis(Plan(G_data=8, G_intra_c=2, G_intra_r=4)) == "col"
    assert innermost_axis(Plan(G_data=1)) == "-"
    assert main(["recommend", *LLAMA, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "SP" in out and "yes" in out  # NeMo's recipe is sequence parallel
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert rows and not any(" col " in line for line in rows)


def test_batch_size_sweep_plots_what_it_measured(tmp_path, capsys):
    from tuner.plot import sweep_lines

    png = tmp_path / "sweep.png"
    assert main(["sweep", "--model", "gpt2-small", "--cluster", "eos", "--gpus", "8", "--global-batch-size",
                 "64,128,256", "--time-budget", "5", "--json", "--plot", str(png)]) == 0
    points = _json(capsys)["points"]
    lines = sweep_lines(points, "global_batch_size")
    assert list(lines) == ["predicted (best layout)"]  # no "linear scaling" at a fixed GPU count
    assert lines["predicted (best layout)"][1] == [p["tokens_per_s"] for p in points]
    assert png.stat().st_size > 10_000
    gpus = sweep_lines([{"x": 8, "tokens_per_s": 100.0}, {"x": 16, "tokens_per_s": 180.0}], "gpus")
    assert gpus["linear scaling from the smallest GPU count"] == ([8.0, 16.0], [100.0, 200.0])


@pytest.mark.parametrize("command", ["recommend", "predict", "sweep", "presets", "profile", "serve", "db",
                                     "train", "validate"])
def test_help_shows_each_default_once(capsys, command):
    import re

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text
    # one "default" per option: never two in one option's help (the description above is prose)
    for entry in re.split(r" (?=--[a-z])", text.split(" options: ", 1)[1]):
        assert entry.lower().count("default") <= 1, entry
    if command == "recommend":
        assert "stop searching after S seconds (default: 30.0)" in text
    if command == "serve":
        assert "TCP port (default: 8000; 0 picks a free one)" in text
    if command == "train":  # options without a help text still say their default
        assert "--steps STEPS (default: 50)" in text and "--lr LR (default: 0.003)" in text
