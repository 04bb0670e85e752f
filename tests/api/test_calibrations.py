"""/v1/calibrations: runs in, constants stored, predict/recommend use them by profile id or name."""

from __future__ import annotations

import copy

from api.calibration_schemas import EXAMPLE
from perfmodels import presets
from perfmodels.constants import apply_constants, priors
from perfmodels.specs import Plan, Training
from perfmodels.steptime import predict

MODEL = presets.model("gpt3-7.5b")
CLUSTER = presets.cluster("selene", num_gpus=64)
TRAINING = Training(global_batch_size=256, stack="megatron-core")
PLANS = [
    {"G_data": 8, "G_intra_r": 8, "micro_batch_size": 2},
    {"G_data": 16, "G_intra_r": 4, "micro_batch_size": 1},
    {"G_data": 8, "G_inter": 2, "G_intra_r": 4, "micro_batch_size": 1},
    {"G_data": 32, "G_intra_r": 2, "micro_batch_size": 2},
]


def _measured(truth: dict[str, float], plan: dict) -> float:
    cluster, training = apply_constants(CLUSTER, TRAINING, truth)
    return predict(MODEL, cluster, training, Plan(**plan)).iteration_time_s


def _body(truth: dict[str, float], plans=PLANS, name="selene-mcore") -> dict:
    return {
        "name": name,
        "cluster": {"preset": "selene", "num_gpus": 64},
        "runs": [{"model": {"preset": "gpt3-7.5b"},
                  "training": {"global_batch_size": 256, "stack": "megatron-core"},
                  "plan": plan, "iteration_time_s": _measured(truth, plan)} for plan in plans],
    }


def test_round_trip_calibrate_then_predict_with_the_profile(client) -> None:
    truth = {"gemm_efficiency": priors(CLUSTER, TRAINING)["gemm_efficiency"] * 0.7}
    r = client.post("/v1/calibrations", json=_body(truth, PLANS[:3]))
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["name"] == "selene-mcore" and out["parameters"]["gemm_efficiency"]["fitted"]
    assert out["parameters"]["gemm_efficiency"]["value"] < out["parameters"]["gemm_efficiency"]["prior"]
    assert not out["parameters"]["memory_overhead_gib"]["fitted"]  # no peak measured
    for run in out["runs"]:
        after, before = (abs(run[k] - run["measured_s"]) for k in ("predicted_s_after", "predicted_s_before"))
        assert after < before
    assert client.get(f"/v1/calibrations/{out['profile_id']}").json() == out
    assert client.get("/v1/calibrations/selene-mcore").json() == out
    # a held-out layout, through /v1/predict by id and by name
    held_out = PLANS[3]
    body = {"model": {"preset": "gpt3-7.5b"}, "cluster": {"profile_id": out["profile_id"], "num_gpus": 64},
            "training": {"global_batch_size": 256, "stack": "megatron-core"}, "plan": held_out}
    pred = client.post("/v1/predict", json=body).json()
    plain = client.post("/v1/predict", json={**body, "cluster": {"preset": "selene", "num_gpus": 64}}).json()
    want = _measured(truth, held_out)
    assert pred["constants_source"] == "calibrated" and pred["profile_id"] == out["profile_id"]
    assert abs(pred["iteration_time_s"] - want) / want < 0.03 < abs(plain["iteration_time_s"] - want) / want
    assert pred["uncertainty_rel"] == out["uncertainty_rel"]
    by_name = client.post("/v1/predict", json={**body, "cluster": {"profile_id": "selene-mcore"}}).json()
    assert by_name["iteration_time_s"] == pred["iteration_time_s"]
    # another model on the same cluster and stack
    other = {**body, "model": {"preset": "gpt3-1.7b"}}
    assert client.post("/v1/predict", json=other).json()["constants_source"] == "calibrated"
    rec = client.post("/v1/recommend", json={"model": {"preset": "gpt3-7.5b"}, "cluster": body["cluster"],
                                             "training": body["training"], "top_k": 5,
                                             "search": {"suggest_trials": 2}})
    assert rec.status_code == 200, rec.text
    answer = rec.json()
    assert answer["best"]["prediction"]["constants_source"] == "calibrated"
    advice = answer["uncertainty"]
    assert advice["band"] == out["uncertainty_rel"]  # the calibrated band, not the preset's 15%
    assert len(advice["trials"]) == (min(2, len(advice["leaders"])) if advice["close"] else 0)


def test_bad_runs_get_422_naming_the_run_and_store_nothing(client) -> None:
    before = client.get("/v1/clusters").json()["items"]
    good = _body({}, PLANS[:2])
    cases = []
    empty = copy.deepcopy(good)
    empty["runs"] = []
    cases.append((empty, ["body", "runs"]))
    negative = copy.deepcopy(good)
    negative["runs"][1]["iteration_time_s"] = -2.0
    cases.append((negative, ["body", "runs", 1, "iteration_time_s"]))
    too_big = copy.deepcopy(good)
    too_big["runs"][1]["plan"] = {"G_data": 16, "G_intra_r": 8, "micro_batch_size": 1}  # 128 GPUs of 64
    cases.append((too_big, ["body", "runs", 1, "plan"]))
    indivisible = copy.deepcopy(good)
    indivisible["runs"][0]["plan"] = {"G_data": 8, "G_intra_r": 8, "micro_batch_size": 3}
    cases.append((indivisible, ["body", "runs", 0, "plan"]))
    other_gpu = copy.deepcopy(good)
    other_gpu["runs"][1]["cluster"] = {"preset": "dgx-h200", "num_gpus": 64}
    cases.append((other_gpu, ["body", "runs", 1, "cluster", "gpu"]))
    for body, loc in cases:
        r = client.post("/v1/calibrations", json=body)
        assert r.status_code == 422, (loc, r.text)
        locs = [e["loc"] for e in r.json()["detail"]]
        assert any(list(x[: len(loc)]) == loc for x in locs), (loc, locs)
    assert client.get("/v1/clusters").json()["items"] == before
    assert client.get("/v1/calibrations/selene-mcore").status_code == 404


def test_the_documented_example_calibrates(client) -> None:
    r = client.post("/v1/calibrations", json=EXAMPLE)
    assert r.status_code == 201, r.text
    assert r.json()["parameters"]["memory_overhead_gib"]["fitted"]  # the example measured a peak


def test_calibration_round_trip_on_postgres(tmp_path, postgres_url) -> None:
    import uuid

    from fastapi.testclient import TestClient

    from api import create_app
    from tests.api.conftest import make_settings

    settings = make_settings(tmp_path, database_url=postgres_url, table_prefix=f"cal{uuid.uuid4().hex[:10]}_")
    app = create_app(settings)
    try:
        with TestClient(app) as c:
            assert c.get("/healthz").json()["database"] == "postgresql"
            out = c.post("/v1/calibrations", json=EXAMPLE).json()
            assert c.get(f"/v1/calibrations/{out['profile_id']}").json() == out
            body = {"model": {"preset": "gpt3-1.7b"}, "cluster": {"profile_id": EXAMPLE["name"]},
                    "training": {"global_batch_size": 256, "stack": "megatron-core"},
                    "plan": {"G_data": 64, "micro_batch_size": 4}}
            pred = c.post("/v1/predict", json=body).json()
            assert pred["constants_source"] == "calibrated" and pred["profile_id"] == out["profile_id"]
    finally:
        app.state.store.drop_tables()
        app.state.store.close()
