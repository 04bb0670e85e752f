"""engine.train end to end on real forked gloo ranks: the layout is chosen, the loss goes down, each
step's time is split by group, and the measurement lands in a real SQLite store.

Tiny models and few steps (the machine has two cores shared with other suites); nothing here
asserts a duration.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.extract import layer_specs, model_spec
from engine.launch import launch
from engine.models.gpt import GPT, GPTConfig
from engine.train import _log_sd
from perfmodels import rules
from perfmodels.specs import Plan
from tuner.store import Store

ROOT = Path(__file__).resolve().parents[2]
CFG = GPTConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=256)


def _example():
    spec = importlib.util.spec_from_file_location("train_gpt_stdlib",
                                                  ROOT / "examples" / "train_gpt_stdlib.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stdlib_example_learns_and_stores_its_measurement(tmp_path):
    url = f"sqlite:///{tmp_path / 'gridtune.db'}"
    report = _example().run(nproc=2, steps=40, global_batch_size=16, layers=2, hidden=32, heads=4, seq=16,
                            lr=3e-3, database=url, progress=False, max_bytes=300_000)
    assert report.world_size == 2 and report.plan.world_size == 2
    assert len(report.losses) == 40
    first, last = sum(report.losses[:5]) / 5, sum(report.losses[-5:]) / 5
    assert first > 4.5  # ~ln(256) at the start
    assert last < first - 1.0, report.losses
    # the measurement really is in the store, with the plan and the prediction
    rows = Store(url).list_measurements(cluster_id=report.cluster_id)
    assert len(rows) == 1
    row = rows[0]
    assert row.id == report.measurement_id
    assert row.measured["iteration_time_s"] == pytest.approx(report.median_step_time_s)
    steady = report.step_times_s[report.warmup_steps:]
    assert row.measured["step_scatter_rel"] == pytest.approx(_log_sd(steady))
    assert row.plan["G_data"] == report.plan.G_data and row.plan["G_intra_r"] == report.plan.G_intra_r
    assert row.prediction["iteration_time_s"] == pytest.approx(report.predicted_step_time_s)
    assert row.prediction["constants_source"] == "preset"


def _run_plan(rank, world, plan, url):
    from engine.train import stdlib_text_dataset, train

    report = train(CFG, stdlib_text_dataset(CFG.seq_length, 100_000), 8, 5, plan=plan, warmup_steps=2,
                   database_url=url, progress=False, record=url is not None, use_calibrated=url is not None)
    return report


@pytest.mark.parametrize("plan, busy, idle", [
    (Plan(G_intra_r=2, micro_batch_size=2), "tp_comm_row_s", ("dp_comm_s", "tp_comm_col_s", "pp_bubble_s")),
    (Plan(G_inter=2, micro_batch_size=2), "pp_bubble_s", ("dp_comm_s", "tp_comm_row_s", "tp_comm_depth_s")),
])
def test_step_time_is_split_by_group(plan, busy, idle):
    reports = launch(_run_plan, 2, args=(plan, None), timeout_s=120)
    assert reports[0] == reports[1]  # every rank returns the same report
    measured = reports[0].measured
    assert measured[busy] > 0
    for name in idle:
        assert measured[name] == 0.0, (name, measured)
    assert 0 < measured["compute_s"] <= measured["iteration_time_s"] * 1.5
    assert reports[0].prediction is not None and reports[0].measurement_id is None


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _Blobs(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.y = torch.randint(0, 3, (512,), generator=g)
        self.x = torch.randn(512, 8, generator=g) * 0.5 + nn.functional.one_hot(self.y, 8).float() * 2

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def _run_mlp(rank, world, url, built, plan):
    from engine.train import train

    return train(_MLP() if built else _MLP, _Blobs(), 32, 30, plan=plan, database_url=url, progress=False,
                 optimizer=lambda p: torch.optim.SGD(p, lr=0.2))


def test_arbitrary_net_is_extracted_on_meta_and_trained(tmp_path):
    spec = model_spec(_MLP)
    assert [layer.kind for layer in spec.layers] == ["linear", "other", "linear"]
    assert spec.layers[0].in_features == 8 and spec.layers[0].out_features == 32
    assert spec.layers[1].params == 64
    assert spec.num_params == sum(p.numel() for p in _MLP().parameters())
    url = f"sqlite:///{tmp_path / 'g.db'}"
    # built already: it can only be replicated, so the tuner is asked for data-parallel plans
    report = launch(_run_mlp, 2, args=(url, True, None), timeout_s=120)[0]
    assert report.plan.G_data == 2
    assert report.losses[-1] < 0.5 * report.losses[0]
    # a factory: engine.auto_parallelize splits the Linears that divide (8->32 over row here)
    split = launch(_run_mlp, 2, args=(url, False, Plan(G_intra_r=2, micro_batch_size=16)), timeout_s=120)[0]
    assert split.plan.G_intra_r == 2 and split.measured["tp_comm_row_s"] > 0
    assert split.losses[-1] < 0.5 * split.losses[0]


def test_gpt_spec_matches_the_engine_model_without_allocating():
    assert model_spec(CFG) == CFG.to_spec("gpt")
    assert model_spec(lambda: GPT(CFG)) == CFG.to_spec("gpt")
    layers = layer_specs(GPT(CFG))
    assert sum(spec.num_params for spec in layers) == sum(p.numel() for p in GPT(CFG).parameters())


def test_a_plan_that_does_not_fit_fails_on_every_rank_with_the_reason():
    from engine.launch import RankFailed

    with pytest.raises(RankFailed, match=r"cluster\.num_gpus = 2"):
        launch(_run_plan, 2, args=(Plan(G_data=4), None), timeout_s=60)


SHARED_RULES = [
    # (plan, the perfmodels.rules verdict for it), the model: 4 layers, 6 heads, hidden 48, batch 12
    (Plan(G_data=2, micro_batch_size=4), lambda p: rules.microbatch_split(12, p.G_data, p.G_intra_d, 4)),
    (Plan(G_intra_r=4), lambda p: rules.heads_split(6, p.G_intra_r)),
    (Plan(G_intra_r=2, G_intra_c=3), lambda p: rules.hidden_split(48, p.G_intra_r, p.G_intra_c)),
    (Plan(G_inter=2, virtual_stages=3, schedule="interleaved-1f1b"),
     lambda p: rules.enough_layers(4, p.G_inter, p.virtual_stages)),
    (Plan(G_intra_r=2, G_data=2), lambda p: True),
]


@pytest.mark.parametrize("plan, allowed", SHARED_RULES)
def test_engine_refuses_a_shared_rule_with_perfmodels_verdict_and_words(plan, allowed):
    """engine.train's refusal of a plan that breaks a rule of perfmodels.rules is perfmodels' own:
    the same verdict, the same message first; the built-in GPT's split check agrees too."""
    import dataclasses

    from engine.parallel_gpt import gpt_split_problems
    from engine.train import engine_limits, engine_problems
    from perfmodels import presets
    from perfmodels.specs import Training, combination_problems

    cfg = GPTConfig(num_layers=4, hidden_size=48, num_attention_heads=6, seq_length=8, vocab_size=64)
    spec, training = cfg.to_spec("gpt"), Training(global_batch_size=12)
    cluster = dataclasses.replace(presets.cluster("local-cpu", num_gpus=1), num_gpus=plan.world_size)
    perf = combination_problems(spec, cluster, training, plan)
    engine = engine_problems(spec, plan, training)
    assert bool(perf) == (not allowed(plan))
    assert engine == perf + engine_limits(spec, plan, training)
    degrees = {"data": plan.G_data, "inter": plan.G_inter, "depth": plan.G_intra_d, "row": plan.G_intra_r,
               "col": plan.G_intra_c}
    shape_ok = rules.heads_split(6, plan.G_intra_r) and rules.hidden_split(48, plan.G_intra_r, plan.G_intra_c)
    layers_ok = rules.enough_layers(4, plan.G_inter, plan.virtual_stages)
    assert (not gpt_split_problems(cfg, degrees, plan.virtual_stages)) == (shape_ok and layers_ok)


def _train_with_defaults(rank, world):
    import engine
    from engine.train import DEFAULT_TIMED_STEPS, stdlib_text_dataset

    report = engine.train(CFG, stdlib_text_dataset(CFG.seq_length, 100_000), auto=True, record=False,
                          progress=False, use_calibrated=False)
    return report, DEFAULT_TIMED_STEPS


def test_the_missions_call_runs_with_default_batch_and_steps():
    """Issue 23 (7): `engine.train(model, dataset, auto=True)` raised TypeError (no defaults)."""
    (report, timed), _ = launch(_train_with_defaults, 2, timeout_s=180)
    assert report.steps == report.warmup_steps + timed and len(report.losses) == report.steps
    assert report.measured["steps_measured"] == timed
    assert report.plan.world_size == 2
    # two samples per rank: every layout of the world divides it
    assert report.tokens_per_s == pytest.approx(2 * 2 * CFG.seq_length / report.median_step_time_s)
    for m in report.memory:  # the process's own RSS before training, below the peak
        assert 0 < m.baseline_rss_bytes <= m.peak_rss_bytes
        assert m.training_rss_bytes == m.peak_rss_bytes - m.baseline_rss_bytes


def test_cli_train_json_carries_per_rank_memory(capsys):
    import json

    from cli import main

    assert main(["train", "--nproc", "2", "--steps", "4", "--warmup", "2", "--layers", "1", "--hidden", "16",
                 "--heads", "2", "--seq", "8", "--global-batch-size", "4", "--plan", "G_data=2",
                 "--no-store", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["rank"] for m in out["memory"]] == [0, 1]
    import os

    assert out["ranks_per_core"] == pytest.approx(2 / len(os.sched_getaffinity(0)))
    for m in out["memory"]:
        assert m["device"] == "cpu" and m["peak_bytes"] == m["peak_rss_bytes"] > 0
        assert 0 < m["baseline_rss_bytes"] <= m["peak_rss_bytes"]


def test_cli_train_json_carries_memory_per_pipeline_stage(capsys):
    """Issue 23: pipeline memory stats. Each rank says which stage it is, and the report gives each
    stage's largest peak (4 ranks: 2 stages x 2 data replicas, in the default rank order)."""
    import json

    from cli import main

    assert main(["train", "--nproc", "4", "--steps", "3", "--warmup", "1", "--layers", "2", "--hidden", "16",
                 "--heads", "2", "--seq", "8", "--global-batch-size", "8", "--plan", "G_data=2,G_inter=2",
                 "--no-store", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stages = {m["rank"]: m["stage"] for m in out["memory"]}
    from perfmodels.layout import rank_coords
    from perfmodels.specs import AXES

    degrees = {"col": 1, "row": 1, "cp": 1, "depth": 1, "inter": 2, "data": 2}
    assert stages == {r: rank_coords(r, degrees, AXES)["inter"] for r in range(4)}
    assert sorted(stages.values()) == [0, 0, 1, 1]
    for stage in (0, 1):
        peaks = [m["peak_bytes"] for m in out["memory"] if m["stage"] == stage]
        assert out["peak_memory_by_stage_gib"][str(stage)] == pytest.approx(max(peaks) / 2**30)


def test_step_scatter_is_the_sample_sd_of_log_step_times():
    """Steps of 1 s and e s: logs 0 and 1, sample sd = sqrt(((0-0.5)^2 + (1-0.5)^2) / 1) = 0.70711."""
    import math

    assert _log_sd([1.0, math.e]) == pytest.approx(math.sqrt(0.5))
    assert _log_sd([2.0]) == 0.0
