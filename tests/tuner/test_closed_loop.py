"""The closed loop: figures, measurement records, calibration from a real store, and `gridtune
validate` on real forked ranks (profile, predict, run every plan, calibrate) feeding
`engine.train(auto=True)`, which then predicts with the calibrated profile.

Nothing asserts a duration; the end-to-end test runs 2 ranks, a 2-layer GPT and 2+2 steps per plan.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from perfmodels import presets
from perfmodels.specs import Model, Plan, Profile
from perfmodels.steptime import predict
from tuner import closed_loop as cl
from tuner.store import Store

MODEL = Model(name="t", num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=256)


def test_figures():
    assert cl.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert cl.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert cl.mape([1.0, 3.0], [2.0, 2.0]) == pytest.approx(0.5)
    # measured best is index 2, which is third in predicted order
    assert cl.predicted_rank_of_measured_best([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 1.0, 9.0]) == 3
    assert cl.spread_plans([5.0, 1.0, 3.0, 2.0, 4.0], 3) == [1, 2, 0]
    assert cl.spread_plans([1.0, 2.0], 3) == [0, 1]


def test_local_cluster_says_how_many_cores_its_ranks_share_and_records_keep_it():
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cl.local_cluster(4).cpu_cores_per_node == cores
    cluster = cl.local_cluster(4, cpu_cores=2)
    assert float(cluster.ranks_per_core(4)) == 2.0
    plan = Plan(G_data=4, micro_batch_size=1)
    rec = cl.measurement_record(model=MODEL, cluster=cluster, training=cl.engine_training(4), plan=plan,
                                measured={"iteration_time_s": 0.1}, prediction=None)
    _, back, _, _ = cl.record_specs(rec)
    assert back.cpu_cores_per_node == 2  # calibration predicts the records on the machine they ran on


def test_engine_specs_say_what_the_engine_does():
    cluster = cl.local_cluster(4)
    assert cluster.num_gpus == 4 and cluster.gpus_per_node == 4 and cluster.backend == "gloo"
    training = cl.engine_training(16)
    stack = training.effective_stack
    assert training.dtype == "fp32" and stack.name == "gridtune"
    # the engine overlaps the data-parallel all-reduce with backward (engine.grads._OverlappedReducer)
    assert stack.overlap_grad_reduce and not stack.overlap_tp_comm and stack.flash_attention
    options = cl.engine_search_options(micro_batch_size=2)
    plans = [c.plan for c in cl.candidate_plans(MODEL, cluster, training, options)]
    assert plans and all(p.micro_batch_size == 2 and p.schedule == "1f1b" and p.zero_stage == 0
                         and p.recompute == "none" and p.order == ("col", "row", "depth", "inter", "data")
                         for p in plans)
    grids = {(p.G_data, p.G_inter, p.G_intra_d, p.G_intra_r, p.G_intra_c) for p in plans}
    assert len(grids) == len(plans)  # one plan per grid: every valid grid exactly once
    assert (4, 1, 1, 1, 1) in grids and (1, 1, 1, 1, 4) in grids
    dp_only = cl.candidate_plans(MODEL, cluster, training, cl.engine_search_options(data_parallel_only=True))
    assert {c.plan.G_data for c in dp_only} == {4}


def _record(plan: Plan, measured_s: float, profile: Profile | None, parts: dict | None = None) -> dict:
    cluster = cl.local_cluster(2, profile)
    training = cl.engine_training(8)
    pred = predict(MODEL, cluster, training, plan)
    measured = {"iteration_time_s": measured_s, **(parts or {})}
    return cl.measurement_record(
        model=MODEL, cluster=cluster, training=training, plan=plan, measured=measured, prediction=pred
    )


def test_record_round_trip_through_a_real_sqlite_store_and_calibration(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'loop.db'}")
    plans = [Plan(G_data=2, micro_batch_size=2), Plan(G_intra_r=2, micro_batch_size=2),
             Plan(G_inter=2, micro_batch_size=2), Plan(G_intra_d=2, micro_batch_size=2)]
    base = Profile(profile_id="p", gemm_overhead_us=1.0)
    for plan in plans:
        rec = _record(plan, 1.0, base)  # predictions are far below 1 s: calibration must scale up
        back = cl.record_specs(rec)
        assert back[0] == MODEL and dataclasses.replace(back[3], placement=None) == plan
        assert back[1].profile == base
        store.add_measurement(cluster_id="here", **json.loads(json.dumps(rec)))
    assert cl.latest_calibrated_profile(store, "here") is None
    result = cl.calibrate_cluster(store, "here")
    assert result is not None and result.num_measurements == 4
    assert result.mape_after < result.mape_before
    stored = cl.latest_calibrated_profile(store, "here")
    assert stored is not None and stored.source == "calibrated" and stored.uncertainty_rel > 0
    assert stored.profile_id == "calibrated:here"
    cluster = cl.local_cluster(2, stored)
    pred = predict(MODEL, cluster, cl.engine_training(8), plans[0])
    assert pred.constants_source == "calibrated"
    assert pred.uncertainty_rel == pytest.approx(stored.uncertainty_rel)
    assert cl.calibrate_cluster(store, "nobody") is None


def test_refit_recovers_kernel_overhead_and_collective_cost():
    """Measurements synthesized with known constants: the refit finds them again."""
    fits = tuple(_fits())
    base = Profile(profile_id="b", collectives=fits, gemm_overhead_us=1.0)
    truth = dataclasses.replace(
        base,
        gemm_overhead_us=150.0,
        collectives=tuple(
            dataclasses.replace(f, alpha_us=f.alpha_us * 5, busbw_GBps=f.busbw_GBps / 5) for f in fits
        ),
    )
    records = []
    for plan in (Plan(G_data=2, micro_batch_size=2), Plan(G_intra_r=2, micro_batch_size=2),
                 Plan(G_intra_c=2, micro_batch_size=2)):
        true = predict(MODEL, cl.local_cluster(2, truth), cl.engine_training(8), plan).breakdown
        parts = {"compute_s": true.compute_s + true.optimizer_s, "tp_comm_row_s": true.tp_comm_row_s,
                 "tp_comm_col_s": true.tp_comm_col_s, "tp_comm_depth_s": true.tp_comm_depth_s,
                 "dp_comm_s": true.dp_comm_s}
        records.append(_record(plan, sum(parts.values()), base, parts))
    refit = cl.refit_constants(records, base)
    assert refit.kernel_overhead_us == pytest.approx(150.0, rel=1e-6)
    assert refit.collective_factor_by_group_size[2] == pytest.approx(5.0, rel=1e-6)
    result = cl.calibrate_records(records, base)
    assert result.mape_after < 0.05 < result.mape_before


def test_refit_leaves_out_what_the_stack_runs_in_the_background():
    """The engine prefetches depth all-gathers and all-reduces gradients in buckets (async_op): a
    depth record's measured depth wait is only what did not overlap (here nothing), and its
    compute holds the gathers' copies: only their sum is observable. The wait must not set the
    collective cost, and the kernel overhead must come out right from the sum."""
    fits = tuple(_fits())
    base = Profile(profile_id="b", collectives=fits, gemm_overhead_us=1.0)
    truth = dataclasses.replace(base, gemm_overhead_us=150.0)
    cluster = cl.local_cluster(2, truth)
    row = Plan(G_intra_r=2, micro_batch_size=2)
    true = predict(MODEL, cluster, cl.engine_training(8), row).breakdown
    parts = {"compute_s": true.compute_s + true.optimizer_s, "tp_comm_row_s": true.tp_comm_row_s}
    records = [_record(row, sum(parts.values()), base, parts)]
    depth = Plan(G_intra_d=2, micro_batch_size=2)
    true = predict(MODEL, cluster, cl.engine_training(8), depth).breakdown
    everything = true.compute_s + true.optimizer_s + true.tp_comm_depth_s
    records.append(_record(depth, everything, base, {"compute_s": everything, "tp_comm_depth_s": 0.0}))
    refit = cl.refit_constants(records, base)
    assert refit.kernel_overhead_us == pytest.approx(150.0, rel=1e-6)
    assert refit.collective_factor_by_group_size[2] == pytest.approx(1.0, rel=1e-6)  # not 0
    alone = cl.refit_constants(records[1:], base)  # the depth record by itself: overhead, no factor
    assert alone.kernel_overhead_us == pytest.approx(150.0, rel=1e-6)
    assert alone.collective_factor_by_group_size == {}


def _fits():
    from perfmodels.specs import CollectiveFit

    for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        yield CollectiveFit(op=op, level="intra", group_size=2, alpha_us=100.0, busbw_GBps=1.0)


def test_validate_closes_the_loop_on_real_ranks(tmp_path, capsys):
    """gridtune validate on 2 ranks: every valid plan really runs, the measurements and the
    calibrated profile land in the store, calibration reduces the error on the plans it did not
    see, and engine.train(auto=True) afterwards predicts with the calibrated constants."""
    from cli import main

    url = f"sqlite:///{tmp_path / 'validate.db'}"
    code = main(["validate", "--nproc", "2", "--model", "tiny-gpt", "--global-batch-size", "8",
                 "--micro-batch-size", "2", "--steps", "2", "--warmup", "1", "--rounds", "1",
                 "--calibrate-on", "3", "--database", url, "--cluster-id", "ci", "--json",
                 "--plot", str(tmp_path / "pred_vs_meas.png")])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("spearman", "measured_best_predicted_rank", "mape_uncalibrated", "mape_calibrated", "plans"):
        assert key in out
    grids = {(p["plan"]["G_data"], p["plan"]["G_inter"], p["plan"]["G_intra_d"], p["plan"]["G_intra_r"],
              p["plan"]["G_intra_c"]) for p in out["plans"]}
    assert grids == {(2, 1, 1, 1, 1), (1, 2, 1, 1, 1), (1, 1, 2, 1, 1), (1, 1, 1, 2, 1), (1, 1, 1, 1, 2)}
    assert all(p["measured_s"] > 0 for p in out["plans"])
    assert sum(p["used_for_calibration"] for p in out["plans"]) == 3
    assert 1 <= out["measured_best_predicted_rank"] <= 5
    for key in ("spearman", "mape_uncalibrated", "mape_uncalibrated_holdout", "mape_calibrated"):
        assert out[key] is not None, key  # finite numbers (two held-out plans of two steps: no thresholds)
    assert (tmp_path / "pred_vs_meas.png").stat().st_size > 0

    store = Store(url)
    assert store.count_measurements("ci") == 5
    calibrated = cl.latest_calibrated_profile(store, "ci")
    assert calibrated is not None and calibrated.source == "calibrated"
    # calibration from the five real measured runs really reduces their prediction error
    result = cl.calibrate_cluster(store, "ci", save=False)
    assert result.num_measurements == 5
    assert result.mape_after < result.mape_before

    from engine.launch import launch

    report = launch(_auto_train, 2, args=(url,), timeout_s=120)[0]
    assert report.constants_source == "calibrated"
    assert report.prediction.constants_source == "calibrated"
    assert store.count_measurements("ci") == 6  # and the run itself was stored for the next calibration


def _auto_train(rank, world, url):
    from engine.models.gpt import GPTConfig
    from engine.train import stdlib_text_dataset, train

    spec = presets.model("tiny-gpt")
    cfg = GPTConfig(num_layers=spec.num_layers, hidden_size=spec.hidden_size,
                    num_attention_heads=spec.num_attention_heads, seq_length=spec.seq_length,
                    vocab_size=spec.vocab_size)
    return train(cfg, stdlib_text_dataset(cfg.seq_length, 100_000), 8, 3, auto=True, warmup_steps=1,
                 micro_batch_size=2, database_url=url, cluster_id="ci", progress=False)


@pytest.fixture
def live_service(tmp_path, monkeypatch):
    """The real REST service (uvicorn in a thread) on a fresh SQLite file, with an API key."""
    import threading
    import time

    import uvicorn

    from api import create_app
    from api.settings import Settings
    from engine.launch import free_port

    url = f"sqlite:///{tmp_path / 'svc.db'}"
    app = create_app(
        Settings(
            database_url=url,
            api_key="k-123",
            max_search_time_s=5.0,
            default_search_time_s=5.0,
            search_isolation="thread",
        )
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    monkeypatch.setenv("GRIDTUNE_API_KEY", "k-123")
    yield f"http://127.0.0.1:{port}", url
    server.should_exit = True
    thread.join(timeout=10)


def test_service_recommends_and_stores_measurements(live_service, monkeypatch):
    base_url, db_url = live_service
    profile = Profile(profile_id="cal", gemm_overhead_us=100.0, source="calibrated", uncertainty_rel=0.2,
                      corrections=(("compute", 1.5), ("tp_comm", 0.0)))
    cluster = cl.local_cluster(2, profile)
    training = cl.engine_training(8)
    plan = cl.service_recommend(
        base_url, MODEL, cluster, training, cl.engine_search_options(micro_batch_size=2)
    )
    assert plan.world_size == 2 and plan.micro_batch_size == 2 and plan.schedule == "1f1b"
    local_best = cl.candidate_plans(MODEL, cluster, training, cl.engine_search_options(micro_batch_size=2))[
        0
    ].plan
    assert (plan.G_data, plan.G_inter, plan.G_intra_d, plan.G_intra_r, plan.G_intra_c) == (
        local_best.G_data,
        local_best.G_inter,
        local_best.G_intra_d,
        local_best.G_intra_r,
        local_best.G_intra_c,
    )
    rec = cl.measurement_record(model=MODEL, cluster=cluster, training=training, plan=plan,
                                measured={"iteration_time_s": 0.05, "compute_s": 0.03},
                                prediction=predict(MODEL, cluster, training, plan))
    out = cl.post_measurement(base_url, rec, cluster_id="svc")
    stored = Store(db_url).list_measurements(cluster_id="svc")
    assert [m.id for m in stored] == [out["id"]]
    assert stored[0].measured["iteration_time_s"] == 0.05
    assert stored[0].prediction["constants_source"] == "calibrated"
    monkeypatch.setenv("GRIDTUNE_API_KEY", "wrong")
    with pytest.raises(ValueError, match="401"):
        cl.post_measurement(base_url, rec, cluster_id="svc")


def test_run_scatter_is_measured_from_repeated_rounds_repeated_runs_or_steps():
    """Where the machine's run-to-run scatter comes from, each value derived by hand."""
    import math

    plan_a, plan_b = Plan(G_data=2, micro_batch_size=2), Plan(G_intra_r=2, micro_batch_size=2)
    # validate's records: each the median of 2 rounds, with the pooled round-to-round scatter 0.2
    # (1 dof each): pooled over both = 0.2, 2 dof
    rounds = [_record(p, 1.0, None, {"run_scatter_rel": 0.2, "runs_measured": 2.0}) for p in (plan_a, plan_b)]
    got = cl.measured_run_scatter(rounds)
    assert (got.source, got.dof) == ("runs", 2) and got.scatter_rel == pytest.approx(0.2)
    # two engine.train runs of one plan, 1.0 s and 1.2 s: sd of their logs = ln(1.2) / sqrt(2)
    again = [_record(plan_a, 1.0, None), _record(plan_a, 1.2, None), _record(plan_b, 5.0, None)]
    got = cl.measured_run_scatter(again)
    assert (got.source, got.dof) == ("runs", 1)
    assert got.scatter_rel == pytest.approx(math.log(1.2) / math.sqrt(2))
    # both kinds pool by their degrees of freedom: sqrt((2 * 0.2^2 + ln(1.2)^2 / 2) / 3)
    got = cl.measured_run_scatter(rounds + again)
    assert got.dof == 3
    assert got.scatter_rel == pytest.approx(math.sqrt((2 * 0.04 + math.log(1.2) ** 2 / 2) / 3))
    # one run only: the standard error of the median of its 10 steps scattering by 10%,
    # sqrt(pi / 2) * 0.1 / sqrt(10) = 0.03963
    single = [_record(plan_a, 1.0, None, {"step_scatter_rel": 0.1, "steps_measured": 10.0})]
    got = cl.measured_run_scatter(single)
    assert got.source == "steps" and got.scatter_rel == pytest.approx(0.03963, abs=1e-5)
    assert cl.measured_run_scatter([_record(plan_a, 1.0, None)]).source == "assumed"


def test_stored_calibration_band_holds_the_measured_scatter(tmp_path):
    """Records whose rounds scattered by 25%: the stored profile keeps 0.25 and its band is at least
    1.645 x 25% = 41%, whatever the leave-one-out error (the old band ignored it)."""
    store = Store(f"sqlite:///{tmp_path / 'scatter.db'}")
    base = Profile(profile_id="p", gemm_overhead_us=1.0)
    for plan in (Plan(G_data=2, micro_batch_size=2), Plan(G_intra_r=2, micro_batch_size=2),
                 Plan(G_inter=2, micro_batch_size=2), Plan(G_intra_d=2, micro_batch_size=2)):
        rec = _record(plan, 1.0, base, {"run_scatter_rel": 0.25, "runs_measured": 2.0})
        store.add_measurement(cluster_id="noisy", **json.loads(json.dumps(rec)))
    result = cl.calibrate_cluster(store, "noisy")
    stored = cl.latest_calibrated_profile(store, "noisy")
    assert stored.run_scatter_rel == pytest.approx(0.25)
    assert stored.uncertainty_rel >= 1.6449 * 0.25 - 1e-9
    assert result.uncertainty_rel == pytest.approx(stored.uncertainty_rel)
    plan = Plan(G_data=2, micro_batch_size=2)
    pred = predict(MODEL, cl.local_cluster(2, stored), cl.engine_training(8), plan)
    assert pred.uncertainty_rel == pytest.approx(stored.uncertainty_rel)


def test_validate_keeps_the_median_of_its_rounds_and_their_scatter():
    """Two rounds of two plans: plan A 44 and 58 ms, plan B 100 and 100 ms. The record is the
    median (51 ms, not the fastest 44 ms: engine.train reports one run's median, the band must
    hold for that), and the scatter is pooled: sqrt((ln(58/44)^2 / 2 + 0) / 2) = ln(58/44) / 2."""
    import math

    from cli.validate import round_statistics

    def m(t: float, c: float) -> dict:
        return {"iteration_time_s": t, "compute_s": c}

    rounds = [[m(0.044, 0.03), m(0.058, 0.04)], [m(0.100, 0.08), m(0.100, 0.08)], []]
    a, b, none = round_statistics(rounds)
    assert none is None
    assert a["iteration_time_s"] == pytest.approx(0.051)
    assert a["compute_s"] == 0.03  # the parts of the lower median round
    assert a["runs_measured"] == 2.0 and b["iteration_time_s"] == pytest.approx(0.1)
    assert a["run_scatter_rel"] == pytest.approx(math.log(58 / 44) / 2)
    assert b["run_scatter_rel"] == a["run_scatter_rel"]  # the machine's noise, pooled
