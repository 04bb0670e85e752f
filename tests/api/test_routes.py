"""Every route of the service, in-process (TestClient), on a fresh SQLite file per test.

Covers the happy paths with real predictions, the stored-profile path (predictions change and say
which constants they used), and the errors: each bad body gets a 422 whose message names the field
and the value; writes need the key when one is set. Run:
`.venv/bin/python -m pytest tests/api -q`.
"""

from __future__ import annotations

import copy
import json

import pytest

import api
from api import examples
from tests.api.conftest import API_KEY

TINY = {
    "model": {"preset": "tiny-gpt"},
    "cluster": {"preset": "local-cpu", "num_gpus": 4},
    "training": {"global_batch_size": 8, "dtype": "fp32"},
    "plan": {"G_data": 2, "G_intra_r": 2, "micro_batch_size": 1},
}


def _with(body: dict, path: str, value) -> dict:
    """A deep copy of `body` with `path` ("plan.G_data") set to `value`."""
    out = copy.deepcopy(body)
    node = out
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return out


def _msgs(response) -> str:
    assert response.status_code == 422, (response.status_code, response.text)
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail
    for item in detail:
        assert set(item) >= {"loc", "msg", "type"}
    return " | ".join(item["msg"] for item in detail)


# --------------------------------------------------------------------------------------------
# predict
# --------------------------------------------------------------------------------------------


def test_predict_returns_the_design_fields(client):
    r = client.post("/v1/predict", json=examples.PREDICT)
    assert r.status_code == 200, r.text
    body = r.json()
    for key in ("iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory", "breakdown",
                "bytes_per_group", "constants_source"):
        assert key in body
    for key in ("compute_s", "tp_comm_s", "dp_comm_s", "pp_bubble_s", "pp_p2p_s", "exposed_comm_s"):
        assert body["breakdown"][key] >= 0
    assert body["memory"]["per_gpu_gib"] > 0 and isinstance(body["memory"]["fits"], bool)
    assert 0 < body["mfu"] < 1
    assert body["iteration_time_s"] > 0
    # tokens/s is what one iteration processes over its time
    tokens = 1536 * 2048
    assert body["tokens_per_s"] == pytest.approx(tokens / body["iteration_time_s"], rel=1e-6)
    assert body["constants_source"] == "preset" and body["profile_id"] is None


def test_predict_explicit_fields_and_tiny_model(client):
    r = client.post("/v1/predict", json=examples.PREDICT_EXPLICIT)
    assert r.status_code == 200, r.text
    r = client.post("/v1/predict", json=TINY)
    assert r.status_code == 200, r.text
    assert r.json()["iteration_time_s"] > 0


def test_predict_twice_the_data_replicas_nearly_halves_the_step(client):
    """Same global batch over twice the data-parallel replicas: each replica computes half as many
    samples and moves half the tensor-parallel bytes, so those parts halve exactly; only the
    gradient all-reduce (new with G_data=2) and the optimizer step (not split by data parallelism)
    stay. Together they are under a tenth of the step here, hence the 0.6 bound."""
    small = client.post(
        "/v1/predict", json=_with(_with(TINY, "cluster.num_gpus", 2), "plan.G_data", 1)
    ).json()
    big = client.post("/v1/predict", json=TINY).json()
    for part in ("compute_s", "tp_comm_s"):
        assert big["breakdown"][part] == pytest.approx(small["breakdown"][part] / 2, rel=1e-9), part
    assert small["breakdown"]["dp_comm_s"] == 0 < big["breakdown"]["dp_comm_s"]
    assert big["iteration_time_s"] < 0.6 * small["iteration_time_s"]


@pytest.mark.parametrize(
    ("path", "value", "loc_end", "needle"),
    [
        (
            "plan.G_data",
            3,
            "body",
            "G_data*G_inter*G_intra_d*G_intra_r*G_intra_c = 3*16*1*8*1 = 384 but cluster.num_gpus = 1024",
        ),
        ("plan.G_intra_r", 64, "body", None),  # set below with a matching product
        (
            "cluster.num_gpus",
            -8,
            "num_gpus",
            "cluster.num_gpus: Input should be greater than or equal to 1, got -8",
        ),
        ("cluster.num_gpus", 0, "num_gpus", "got 0"),
        ("cluster.num_gpus", 10**12, "num_gpus", "got 1000000000000"),
        ("model.preset", "gpt-5-omega", "model", "unknown model preset 'gpt-5-omega'"),
        ("cluster.preset", "atlantis", "cluster", "unknown cluster preset 'atlantis'"),
        ("cluster.gpu", "TPU-v9", "cluster", "unknown GPU preset 'TPU-v9'"),
        (
            "plan.schedule",
            "zigzag",
            "schedule",
            "plan.schedule: Input should be 'gpipe', '1f1b' or 'interleaved-1f1b', got 'zigzag'",
        ),
        ("plan.zero_stage", 7, "zero_stage", "got 7"),
        ("plan.G_inter", "four", "G_inter", "plan.G_inter: Input should be a valid integer"),
        ("plan.micro_batch_size", 1.5, "micro_batch_size", "got 1.5"),
        ("training.dtype", "int4", "dtype", "got 'int4'"),
        ("training.global_batch_size", 1001, "body", "training.global_batch_size=1001 is not divisible by"),
        ("plan.warp_drive", True, "warp_drive", "plan.warp_drive: Extra inputs are not permitted, got True"),
        ("cluster.inter_node_bandwidth_GBps", -25.0, "inter_node_bandwidth_GBps", "got -25.0"),
        (
            "plan.placement",
            ["col", "row", "depth", "inter", "inter"],
            "plan",
            "plan.placement must be an ordering",
        ),
    ],
)
def test_predict_bad_input_is_422_naming_field_and_value(client, path, value, loc_end, needle):
    body = _with(examples.PREDICT, path, value)
    if path == "plan.G_intra_r":  # product right (16*1*64 = 1024), but 64 does not divide 96 heads
        body = _with(_with(body, "plan.G_inter", 1), "plan.G_data", 16)
        needle = "G_intra_r=64 does not divide model.num_attention_heads=96"
    r = client.post("/v1/predict", json=body)
    text = _msgs(r)
    assert needle in text, text
    assert any(item["loc"][-1] == loc_end for item in r.json()["detail"]), r.json()


def test_predict_reports_every_combination_problem_at_once(client):
    body = _with(_with(examples.PREDICT, "plan.G_data", 5), "plan.G_intra_r", 7)
    text = _msgs(client.post("/v1/predict", json=body))
    assert "but cluster.num_gpus = 1024" in text
    assert "G_intra_r=7 does not divide model.num_attention_heads=96" in text


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "body is not valid JSON"),
        ("[]", "body"),
        ('"a string"', "body"),
        ("", "body"),
        ('{"model": {"preset": "gpt3-175b"}}', "cluster: field required"),
    ],
)
def test_predict_malformed_bodies_are_422(client, content, needle):
    r = client.post("/v1/predict", content=content, headers={"content-type": "application/json"})
    assert needle in _msgs(r)


def test_predict_non_finite_numbers_are_422(client):
    raw = json.dumps(examples.PREDICT).replace(
        '"num_gpus": 1024', '"num_gpus": 1024, "inter_node_bandwidth_GBps": NaN'
    )
    r = client.post("/v1/predict", content=raw, headers={"content-type": "application/json"})
    assert "inter_node_bandwidth_GBps" in _msgs(r)
    raw = json.dumps(examples.PREDICT).replace(
        '"num_gpus": 1024', '"num_gpus": 1024, "intra_node_latency_us": Infinity'
    )
    assert "intra_node_latency_us" in _msgs(
        client.post("/v1/predict", content=raw, headers={"content-type": "application/json"})
    )


def test_predict_with_unknown_profile_id_is_422_naming_it(client):
    body = _with(examples.PREDICT, "cluster.profile_id", "nope-123")
    r = client.post("/v1/predict", json=body)
    assert "cluster.profile_id='nope-123' names no stored profile" in _msgs(r)
    assert r.json()["detail"][0]["loc"] == ["body", "cluster", "profile_id"]


# --------------------------------------------------------------------------------------------
# clusters (profiles) and predictions that use them
# --------------------------------------------------------------------------------------------


def test_cluster_profiles_store_list_get(client):
    r = client.post("/v1/clusters", json=examples.CLUSTER_CREATE)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["name"] == "selene-a100-profiled" and created["id"]
    assert created["profile"]["provenance"] == examples.PROFILE["provenance"]  # verbatim extra keys
    assert created["cluster"] == {"preset": "selene", "num_gpus": 1024}
    other = client.post("/v1/clusters", json={"name": "bare", "profile": {"gemm_tflops_max": 200.0}}).json()
    listed = client.get("/v1/clusters").json()["items"]
    assert [c["id"] for c in listed] == [other["id"], created["id"]]  # newest first
    got = client.get(f"/v1/clusters/{created['id']}")
    assert got.status_code == 200 and got.json()["profile"] == created["profile"]
    assert client.get("/v1/clusters/bare").json()["id"] == other["id"]  # by name too
    slashed = client.post("/v1/clusters", json={"name": "calibrated:box@host/4", "profile": {}}).json()
    assert client.get("/v1/clusters/calibrated:box@host/4").json()["id"] == slashed["id"]
    missing = client.get("/v1/clusters/does-not-exist")
    assert missing.status_code == 404 and "does-not-exist" in missing.json()["detail"]
    assert len(client.get("/v1/clusters?limit=1").json()["items"]) == 1
    assert len(client.get("/v1/clusters").json()["items"]) == 3


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"name": "x"}, "profile: field required"),
        ({"name": "", "profile": {}}, "name: String should have at least 1 character"),
        (
            {
                "name": "x",
                "profile": {
                    "collectives": [
                        {
                            "op": "all_reduce",
                            "level": "intra",
                            "group_size": 8,
                            "alpha_us": 1.0,
                            "busbw_GBps": -3.0,
                        }
                    ]
                },
            },
            "profile.collectives[0].busbw_GBps: Input should be greater than or equal to 0.001, got -3.0 "
            "(plausible range",
        ),
        (
            {
                "name": "x",
                "profile": {
                    "collectives": [
                        {
                            "op": "teleport",
                            "level": "intra",
                            "group_size": 8,
                            "alpha_us": 1.0,
                            "busbw_GBps": 3.0,
                        }
                    ]
                },
            },
            "got 'teleport'",
        ),
        ({"name": "x", "profile": {"source": "guess"}}, "got 'guess'"),
        ({"name": "x", "profile": {"bogus": 1}}, "profile.bogus: Extra inputs are not permitted"),
        ({"name": "x", "profile": {}, "cluster": {"preset": "nowhere"}}, "unknown cluster preset 'nowhere'"),
        ({"name": "x", "profile": {}, "cluster": {"num_gpus": 8}}, "cluster needs"),
        (
            {"name": "x", "profile": {}, "cluster": {"preset": "selene", "num_gpus": 12}},
            "cluster.num_gpus=12 is not a whole number of nodes",
        ),
    ],
)
def test_bad_cluster_profiles_are_422(client, body, needle):
    assert needle in _msgs(client.post("/v1/clusters", json=body))
    assert client.get("/v1/clusters").json()["items"] == []


def test_predict_and_recommend_use_a_stored_profile(client):
    slow = copy.deepcopy(examples.CLUSTER_CREATE)
    slow["profile"]["gemm_tflops_max"] = 100.0  # a much slower GEMM than the preset's ~265
    pid = client.post("/v1/clusters", json=slow).json()["id"]
    preset = client.post("/v1/predict", json=examples.PREDICT).json()
    profiled = client.post("/v1/predict", json=_with(examples.PREDICT, "cluster", {"profile_id": pid})).json()
    assert profiled["profile_id"] == pid
    assert profiled["constants_source"] != "preset" and "profile" in profiled["constants_source"]
    assert profiled["breakdown"]["compute_s"] > 1.5 * preset["breakdown"]["compute_s"]
    # the request's fields override the stored cluster (here: fewer GPUs, smaller grid)
    body = _with(examples.PREDICT, "cluster", {"profile_id": pid, "num_gpus": 512})
    body["plan"] = {**examples.PLAN_MEGATRON, "G_data": 4}
    assert client.post("/v1/predict", json=body).status_code == 200
    # by name as well as by id
    by_name = client.post(
        "/v1/predict", json=_with(examples.PREDICT, "cluster", {"profile_id": slow["name"]})
    ).json()
    assert by_name["profile_id"] == pid
    rec = client.post(
        "/v1/recommend",
        json={**TINY_RECOMMEND, "cluster": {"preset": "local-cpu", "num_gpus": 4, "profile_id": pid}},
    )
    assert rec.status_code == 200, rec.text
    assert rec.json()["profile_id"] == pid and rec.json()["constants_source"] != "preset"


# --------------------------------------------------------------------------------------------
# recommend
# --------------------------------------------------------------------------------------------

TINY_RECOMMEND = {k: v for k, v in TINY.items() if k != "plan"} | {"top_k": 3}


def test_recommend_tiny_model_ranks_valid_plans(client):
    r = client.post("/v1/recommend", json=TINY_RECOMMEND)
    assert r.status_code == 200, r.text
    rec = r.json()
    for key in ("best", "candidates", "num_evaluated", "num_valid", "pruned", "pruned_examples",
                "constants_source", "explanation"):
        assert key in rec
    assert 1 <= len(rec["candidates"]) <= 3
    assert [c["rank"] for c in rec["candidates"]] == list(range(1, len(rec["candidates"]) + 1))
    times = [c["prediction"]["iteration_time_s"] for c in rec["candidates"]]
    assert times == sorted(times)
    assert rec["best"]["plan"] == rec["candidates"][0]["plan"]
    plan = rec["best"]["plan"]
    assert plan["G_data"] * plan["G_inter"] * plan["G_intra_d"] * plan["G_intra_r"] * plan["G_intra_c"] == 4
    assert rec["num_evaluated"] >= rec["num_valid"] >= len(rec["candidates"])
    # the best plan, predicted on its own, agrees with the search's prediction
    one = client.post("/v1/predict", json={**TINY, "plan": plan}).json()
    assert one["iteration_time_s"] == pytest.approx(rec["best"]["prediction"]["iteration_time_s"], rel=1e-6)


def test_recommend_search_pins_are_respected(client):
    body = {**TINY_RECOMMEND, "top_k": 10, "search": {"G_intra_r": [1], "G_inter": [1], "zero_stage": [0],
                                                       "time_budget_s": 2.0}}
    rec = client.post("/v1/recommend", json=body).json()
    assert rec["candidates"]
    for cand in rec["candidates"]:
        assert (
            cand["plan"]["G_intra_r"] == 1
            and cand["plan"]["G_inter"] == 1
            and cand["plan"]["zero_stage"] == 0
        )


def test_recommend_gpt3_on_1024_gpus(client):
    r = client.post("/v1/recommend", json=examples.RECOMMEND)
    assert r.status_code == 200, r.text
    rec = r.json()
    best = rec["best"]["plan"]
    assert (
        best["G_data"] * best["G_inter"] * best["G_intra_d"] * best["G_intra_r"] * best["G_intra_c"] == 1024
    )
    assert rec["best"]["prediction"]["memory"]["fits"] is True
    assert best["zero_stage"] in (0, 1)


def test_recommend_bounded_and_exhaustive_agree_and_say_what_was_proved(client):
    """The default search proves most of the space out; search.exhaustive scores all of it: the same
    candidates with the same predicted times either way."""
    bounded = client.post("/v1/recommend", json=examples.RECOMMEND).json()
    body = {**examples.RECOMMEND, "search": {**examples.RECOMMEND["search"], "exhaustive": True}}
    r = client.post("/v1/recommend", json=body)
    assert r.status_code == 200, r.text
    full = r.json()
    assert full["exhaustive"] is True and full["num_proved_slower"] == 0
    assert bounded["exhaustive"] is False and bounded["num_proved_slower"] > bounded["num_valid"]
    assert bounded["num_evaluated"] + bounded["num_proved_slower"] == full["num_evaluated"]
    assert [(c["plan"], c["prediction"]["iteration_time_s"]) for c in bounded["candidates"]] == [
        (c["plan"], c["prediction"]["iteration_time_s"]) for c in full["candidates"]]
    bad = {**examples.RECOMMEND, "search": {"exhaustive": "sometimes"}}
    assert "search.exhaustive" in _msgs(client.post("/v1/recommend", json=bad))


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        (
            {"cluster": {"preset": "selene", "num_gpus": 2_000_000}},
            "cluster.num_gpus=2,000,000 is more than this service searches (1,048,576",
        ),
        (
            {"cluster": {"preset": "selene", "num_gpus": 5_000_000}},
            "less than or equal to 4194304, got 5000000",
        ),
        ({"top_k": 0}, "top_k: Input should be greater than or equal to 1, got 0"),
        ({"top_k": 100_000}, "got 100000"),
        ({"search": {"G_data": []}}, "search.G_data: List should have at least 1 item"),
        ({"search": {"schedule": ["sideways"]}}, "search.schedule[0]"),
        ({"search": {"time_budget_s": -1}}, "search.time_budget_s: Input should be greater than 0, got -1"),
        ({"search": {"time_budget_s": 10_000}}, "got 10000"),
        ({"search": {"placement": [["col", "row"]]}}, "search.placement[0]"),
        (
            {"search": {"placement": [["col"] * 5]}},
            "each placement must be an ordering of ['col', 'row', 'depth', 'inter', 'data'], got ['col', "
            "'col'",
        ),
        ({"search": {"unknown_knob": [1]}}, "search.unknown_knob: Extra inputs are not permitted"),
        ({"model": {"preset": "nonexistent-llm"}}, "unknown model preset 'nonexistent-llm'"),
        ({"plan": {"G_data": 1}}, "plan: Extra inputs are not permitted"),
    ],
)
def test_recommend_bad_input_is_422(client, patch, needle):
    body = {**examples.RECOMMEND, **patch}
    assert needle in _msgs(client.post("/v1/recommend", json=body))


def test_recommend_time_budget_is_capped_by_the_server(tmp_path):
    from fastapi.testclient import TestClient

    from api import create_app
    from api.schemas import SearchIn
    from api.service import search_options
    from tests.api.conftest import make_settings

    settings = make_settings(tmp_path, max_search_time_s=0.5)
    options, budget = search_options(SearchIn(time_budget_s=500.0), settings)
    assert budget == 0.5 and options.time_budget_s == 0.5
    with TestClient(create_app(settings)) as c:
        body = {**examples.RECOMMEND, "search": {"time_budget_s": 500.0}}
        r = c.post("/v1/recommend", json=body)
        assert r.status_code == 200, r.text  # finished (best effort) instead of pinning the server


# --------------------------------------------------------------------------------------------
# measurements
# --------------------------------------------------------------------------------------------


def test_measurements_store_and_list(client):
    r = client.post("/v1/measurements", json=examples.MEASUREMENT)
    assert r.status_code == 201, r.text
    m = r.json()
    assert m["id"] >= 1 and m["cluster_id"] == "selene"
    assert m["measured"] == examples.MEASUREMENT["measured"]
    assert m["prediction"] == {"iteration_time_s": 38.6}
    pid = client.post("/v1/clusters", json=examples.CLUSTER_CREATE).json()["id"]
    tiny = {**TINY, "measured": {"iteration_time_s": 0.25, "compute_s": 0.2, "per_rank": [0.24, 0.26]}}
    for _ in range(3):
        assert (
            client.post("/v1/measurements", json=_with(tiny, "cluster.name", "my-laptop")).status_code == 201
        )
    with_profile = _with(examples.MEASUREMENT, "cluster", {"profile_id": pid})
    assert client.post("/v1/measurements", json=with_profile).json()["cluster_id"] == pid
    explicit = {**tiny, "cluster_id": "rack-7"}
    assert client.post("/v1/measurements", json=explicit).json()["cluster_id"] == "rack-7"

    everything = client.get("/v1/measurements").json()["items"]
    assert len(everything) == 6
    assert [x["id"] for x in everything] == sorted((x["id"] for x in everything), reverse=True)
    laptop = client.get("/v1/measurements", params={"cluster_id": "my-laptop"}).json()
    assert len(laptop["items"]) == 3 and laptop["items"][0]["measured"]["per_rank"] == [0.24, 0.26]
    assert laptop["next_before_id"] is None
    page = client.get("/v1/measurements", params={"limit": 2}).json()
    assert len(page["items"]) == 2 and page["next_before_id"] == page["items"][-1]["id"]
    rest = client.get("/v1/measurements", params={"limit": 10, "before_id": page["next_before_id"]}).json()
    assert len(rest["items"]) == 4
    assert client.get("/v1/measurements", params={"cluster_id": pid}).json()["items"][0]["cluster_id"] == pid


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"measured": {}}, "measured.iteration_time_s: field required"),
        (
            {"measured": {"iteration_time_s": -1.0}},
            "measured.iteration_time_s: Input should be greater than 0, got -1.0",
        ),
        ({"measured": {"iteration_time_s": "fast"}}, "got 'fast'"),
        ({"plan": {"G_data": 2}}, "= 2 but cluster.num_gpus = 1024"),
        ({"cluster": {"profile_id": "ghost"}}, "cluster.profile_id='ghost' names no stored profile"),
        ({"cluster_id": ""}, "cluster_id: String should have at least 1 character"),
    ],
)
def test_bad_measurements_are_422_and_not_stored(client, patch, needle):
    assert needle in _msgs(client.post("/v1/measurements", json={**examples.MEASUREMENT, **patch}))
    assert client.get("/v1/measurements").json()["items"] == []


def test_measurement_with_nan_inside_free_form_fields_is_422(client):
    raw = json.dumps(examples.MEASUREMENT).replace('"compute_s": 31.5', '"compute_s": NaN')
    r = client.post("/v1/measurements", content=raw, headers={"content-type": "application/json"})
    assert "compute_s" in _msgs(r)
    raw = json.dumps(examples.MEASUREMENT).replace('"prediction": {"iteration_time_s": 38.6}',
                                                   '"prediction": {"iteration_time_s": Infinity}')
    r = client.post("/v1/measurements", content=raw, headers={"content-type": "application/json"})
    assert "prediction.iteration_time_s must be a finite number" in _msgs(r)
    assert client.get("/v1/measurements").json()["items"] == []


@pytest.mark.parametrize("query", ["limit=0", "limit=100000", "limit=x", "before_id=0"])
def test_bad_measurement_queries_are_422(client, query):
    assert "got" in _msgs(client.get(f"/v1/measurements?{query}"))


# --------------------------------------------------------------------------------------------
# auth
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/clusters", examples.CLUSTER_CREATE), ("/v1/measurements", examples.MEASUREMENT)]
)
def test_writes_need_the_key_when_one_is_set(keyed_client, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"},
                    {"Authorization": API_KEY}):
        r = keyed_client.post(path, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.status_code, r.text)
        assert "GRIDTUNE_API_KEY" in r.json()["detail"]
        assert r.headers["www-authenticate"] == "Bearer"
    assert keyed_client.get(path).json()["items"] == []
    ok = keyed_client.post(path, json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 201, ok.text
    assert len(keyed_client.get(path).json()["items"]) == 1  # reads stay open


def test_reads_and_model_routes_stay_open_with_a_key(keyed_client):
    assert keyed_client.post("/v1/predict", json=examples.PREDICT).status_code == 200
    assert keyed_client.get("/healthz").status_code == 200
    assert keyed_client.get("/metrics").status_code == 200


def test_no_key_configured_means_open_writes(client):
    assert client.post("/v1/measurements", json=examples.MEASUREMENT).status_code == 201


# --------------------------------------------------------------------------------------------
# health, metrics, docs
# --------------------------------------------------------------------------------------------


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    writable = r.json().pop("writable")  # one entry per table the service writes
    assert {"profiles", "measurements"} <= set(writable) and all(writable.values()), writable
    assert {k: v for k, v in r.json().items() if k != "writable"} == {
        "status": "ok", "database": "sqlite", "version": api.__version__, "ready": True, "reason": ""}


def test_metrics_count_requests_by_route_template(client):
    client.post("/v1/predict", json=examples.PREDICT)
    client.post("/v1/predict", json={})
    client.get("/v1/clusters/abc")
    client.get("/no/such/path")
    text = client.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    body = text.text
    assert 'gridtune_http_requests_total{method="POST",route="/v1/predict",status="200"} 1' in body
    assert 'gridtune_http_requests_total{method="POST",route="/v1/predict",status="422"} 1' in body
    assert (
        'gridtune_http_requests_total{method="GET",route="/v1/clusters/{cluster_id:path}",status="404"} 1'
        in body
    )
    assert 'route="<unmatched>",status="404"} 1' in body
    assert "# TYPE gridtune_http_request_duration_seconds histogram" in body
    assert 'gridtune_http_request_duration_seconds_count{method="POST",route="/v1/predict"} 2' in body
    assert (
        'gridtune_http_request_duration_seconds_bucket{method="POST",route="/v1/predict",le="+Inf"} 2' in body
    )
    assert "gridtune_cache_misses_total 1" in body and "gridtune_searches_pending 0" in body
    for line in body.splitlines():  # every sample line parses as `name{labels} number`
        if line and not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])


def test_every_request_body_in_the_openapi_docs_has_a_working_example(client):
    spec = client.get("/openapi.json").json()
    posted = 0
    # clusters first: nothing else depends on stored state, but keep the order of a real session
    for path in ("/v1/clusters", "/v1/measurements", "/v1/predict", "/v1/recommend"):
        op = spec["paths"][path]["post"]
        content = op["requestBody"]["content"]["application/json"]
        named = content.get("examples") or {}
        assert named, f"{path} has no examples"
        for name, example in named.items():
            r = client.post(path, json=example["value"])
            assert r.status_code in (200, 201), (path, name, r.text)
            posted += 1
    assert posted >= 5
    assert {"/healthz", "/metrics", "/v1/clusters/{cluster_id}"} <= set(spec["paths"])


def test_docs_page_is_served(client):
    r = client.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()


def test_accepts_what_gridtune_profile_upload_sends(client):
    """The body `tuner.profiles.upload` POSTs: a full cluster_to_dict and a profile document with
    provenance, fits, expected (and keys io does not know moved into provenance)."""
    from perfmodels import presets
    from perfmodels.io import cluster_to_dict, json_safe
    from tuner import profiles

    doc = {**examples.PROFILE, "fits": [{"op": "all_reduce", "r2": None, "n_points": 12}],
           "expected": [{"op": "all_reduce", "ratio": 0.93}], "holdout_median_abs_error": 0.04}
    doc["collectives"] = [{**doc["collectives"][0], "r2": None}]  # NaN fits come out as null
    body = {"name": "uploaded", "profile": profiles.service_profile(doc),
            "cluster": json_safe(cluster_to_dict(presets.cluster("local-cpu", 4)))}
    r = client.post("/v1/clusters", json=body)
    assert r.status_code == 201, r.text
    stored = r.json()
    assert stored["profile"]["fits"] == doc["fits"] and stored["profile"]["expected"] == doc["expected"]
    assert 0.04 in (stored["profile"].get("holdout_median_abs_error"),
                    stored["profile"].get("provenance", {}).get("holdout_median_abs_error"))
    pid = stored["id"]
    pred = client.post("/v1/predict", json={**TINY, "cluster": {"profile_id": pid}})
    assert pred.status_code == 200, pred.text
    assert pred.json()["profile_id"] == pid


def test_healthz_is_503_when_the_database_does_not_answer(client, monkeypatch):
    from tuner.store import Readiness

    monkeypatch.setattr(client.app.state.store, "readiness", lambda: Readiness(ready=False, reason="down"))
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json()["status"] == "degraded"


def test_a_database_that_stops_answering_is_503_not_500(client, monkeypatch):
    import sqlalchemy as sa

    def down(**_kwargs):
        raise sa.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(client.app.state.store, "add_measurement", down)
    r = client.post("/v1/measurements", json=examples.MEASUREMENT)
    assert r.status_code == 503 and "database is not answering" in r.json()["detail"]


def test_service_on_postgres(tmp_path, postgres_url):
    import uuid

    from fastapi.testclient import TestClient

    from api import create_app
    from tests.api.conftest import make_settings

    settings = make_settings(tmp_path, database_url=postgres_url, table_prefix=f"api{uuid.uuid4().hex[:10]}_")
    app = create_app(settings)
    try:
        with TestClient(app) as c:
            assert c.get("/healthz").json()["database"] == "postgresql"
            pid = c.post("/v1/clusters", json=examples.CLUSTER_CREATE).json()["id"]
            for _ in range(3):
                assert (
                    c.post("/v1/measurements", json={**examples.MEASUREMENT, "cluster_id": pid}).status_code
                    == 201
                )
            items = c.get("/v1/measurements", params={"cluster_id": pid}).json()["items"]
            assert len(items) == 3 and items[0]["measured"] == examples.MEASUREMENT["measured"]
            assert c.get(f"/v1/clusters/{pid}").json()["profile"] == examples.PROFILE
            assert (
                c.post("/v1/predict", json={**examples.PREDICT, "cluster": {"profile_id": pid}}).json()[
                    "profile_id"
                ]
                == pid
            )
    finally:
        app.state.store.drop_tables()
        app.state.store.close()


def test_accepts_what_the_closed_loop_posts(client):
    """The body `tuner.closed_loop.post_measurement` sends (measurement_record + for_service)."""
    import dataclasses

    from perfmodels import predict, presets
    from perfmodels.io import plan_to_dict, profile_from_dict
    from perfmodels.specs import Plan, Training
    from tuner import closed_loop as loop

    model, training, plan = (
        presets.model("tiny-gpt"),
        Training(global_batch_size=8, dtype="fp32"),
        Plan(G_data=4),
    )
    for cluster in (presets.cluster("local-cpu", 4),
                    dataclasses.replace(presets.cluster("local-cpu", 4), name="my-box",
                                        profile=profile_from_dict(examples.PROFILE))):
        pred = predict(model, cluster, training, plan)
        record = loop.measurement_record(
            model=model,
            cluster=cluster,
            training=training,
            plan=plan,
            measured={"iteration_time_s": 0.5, "compute_s": 0.3},
            prediction=pred,
        )
        body = {**loop.for_service(record), "cluster_id": "box@host/4"}
        r = client.post("/v1/measurements", json=body)
        assert r.status_code == 201, r.text
    items = client.get("/v1/measurements", params={"cluster_id": "box@host/4"}).json()["items"]
    assert len(items) == 2
    # what calibration reads back through the store rebuilds the same specs
    stored = client.app.state.store.list_measurements(cluster_id="box@host/4")
    for m in stored:
        got_model, got_cluster, got_training, got_plan = loop.record_specs(m)
        assert got_cluster.num_gpus == 4
        assert (got_model, got_training) == (model, training)
        assert plan_to_dict(got_plan) == plan_to_dict(plan)  # placement written out explicitly
