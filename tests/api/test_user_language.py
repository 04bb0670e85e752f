"""The REST API in its users' words: Megatron's names for plan fields and pins, a GPU by its short
name with a count, one clear error (with the closest names) for an unknown preset or stack; and the
page at / served from the package with a policy that keeps it on this origin."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.routers import web

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model": {"preset": "llama3-8b"}, "cluster": {"preset": "eos", "num_gpus": 64},
        "training": {"global_batch_size": 256, "stack": "megatron-core"}}
PLAN = {"G_data": 8, "G_intra_r": 8, "micro_batch_size": 2, "sequence_parallel": True}


def test_megatron_names_in_a_plan_predict_the_same_as_the_grid_names(client):
    by_grid = client.post("/v1/predict", json={**BASE, "plan": PLAN})
    by_alias = client.post("/v1/predict", json={**BASE, "plan": {"dp": 8, "tp": 8, "mbs": 2,
                                                                   "sequence_parallel": True}})
    assert by_grid.status_code == by_alias.status_code == 200, by_alias.text
    assert by_alias.json()["iteration_time_s"] == by_grid.json()["iteration_time_s"]
    pp = client.post("/v1/predict", json={**BASE, "plan": {"dp": 2, "tp": 8, "pp": 4, "vpp": 2, "mbs": 1,
                                                             "schedule": "interleaved-1f1b"}})
    grid = client.post("/v1/predict", json={**BASE, "plan": {"G_data": 2, "G_intra_r": 8, "G_inter": 4,
                                                               "virtual_stages": 2, "micro_batch_size": 1,
                                                               "schedule": "interleaved-1f1b"}})
    assert pp.status_code == 200 and pp.json() == grid.json()


def test_megatron_names_pin_the_search(client):
    search = {"tp": [4], "pp": [1, 2], "mbs": [1]}
    r = client.post("/v1/recommend", json={**BASE, "top_k": 5, "search": search})
    assert r.status_code == 200, r.text
    for cand in r.json()["candidates"]:
        assert cand["plan"]["G_intra_r"] == 4 and cand["plan"]["G_inter"] in (1, 2)
        assert cand["plan"]["micro_batch_size"] == 1


def test_a_field_given_twice_or_not_modelled_is_one_clear_422(client):
    r = client.post("/v1/recommend", json={**BASE, "search": {"tp": [2], "G_intra_r": [4]}})
    assert r.status_code == 422 and "'tp' and 'G_intra_r' both set G_intra_r" in r.text
    r = client.post("/v1/predict", json={**BASE, "plan": {**PLAN, "pp": 1, "G_inter": 1}})
    assert r.status_code == 422 and "both set G_inter" in r.text
    from api.schemas import PlanIn

    for alias, field in (("cp", "G_cp"), ("ep", "G_ep"), ("etp", "G_etp")):
        r = client.post("/v1/predict", json={**BASE, "plan": {"G_data": 8, "G_intra_r": 8, alias: 1}})
        if field in PlanIn.model_fields:  # once context/expert parallelism is modelled
            assert r.status_code == 200, r.text
        else:
            assert r.status_code == 422
            assert f"'{alias}' means {field}, which this version of gridtune does not model yet" in r.text


@pytest.mark.parametrize("stack", ["megatron", {"name": "megatron"}])
def test_unknown_stack_is_one_error_with_the_closest_names(client, stack):
    r = client.post("/v1/predict", json={**BASE, "training": {"global_batch_size": 256, "stack": stack},
                                         "plan": PLAN})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert len(detail) == 1 and detail[0]["loc"] == ["body", "training", "stack"]
    assert "unknown stack preset 'megatron'; did you mean 'megatron-lm', 'megatron-core'" in detail[0]["msg"]


@pytest.mark.parametrize(("where", "value", "suggestion"), [
    ("model", {"preset": "llama3-70"}, "did you mean 'llama3-70b'"),
    ("cluster", {"preset": "selen", "num_gpus": 64}, "did you mean 'selene'"),
    ("cluster", {"preset": "eos", "num_gpus": 64, "gpu": "H10"}, "did you mean 'H20'"),
])
def test_unknown_presets_suggest_the_closest_name(client, where, value, suggestion):
    r = client.post("/v1/predict", json={**BASE, where: value, "plan": PLAN})
    assert r.status_code == 422 and suggestion in r.text, r.text


def test_a_gpu_name_and_a_count_are_a_cluster_as_in_the_cli(client):
    """{"gpu": "H100", "num_gpus": 64} takes node size and links from the preset node of that GPU (eos),
    exactly what `gridtune --gpu H100 --gpus 64` does."""
    h100 = {"gpu": "H100", "num_gpus": 64}
    by_name = client.post("/v1/predict", json={**BASE, "cluster": h100, "plan": PLAN})
    by_preset = client.post("/v1/predict", json={**BASE, "plan": PLAN})
    assert by_name.status_code == 200, by_name.text
    assert by_name.json()["iteration_time_s"] == by_preset.json()["iteration_time_s"]
    slower = client.post("/v1/predict", json={**BASE, "cluster": {"gpu": "H100", "num_gpus": 64,
                                                                   "inter_node_bandwidth_GBps": 5.0},
                                              "plan": PLAN})
    assert slower.json()["iteration_time_s"] > by_name.json()["iteration_time_s"]  # a given field wins
    mi300 = client.post("/v1/predict", json={**BASE, "cluster": {"gpu": "MI300", "num_gpus": 64},
                                             "plan": PLAN})
    assert mi300.status_code == 200 and mi300.json()["memory"]["capacity_gib"] == 192.0
    r = client.post("/v1/predict", json={**BASE, "cluster": {"gpu": "L40S", "num_gpus": 8}, "plan": PLAN})
    assert r.status_code == 422 and "no cluster preset has L40S GPUs" in r.text


def test_the_page_is_served_from_the_package_with_a_same_origin_policy(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for needed in ('name="model"', 'name="cluster"', 'name="gpus"', 'name="global_batch_size"',
                   'name="stack"', 'type="submit"', "<table", 'src="/web/app.js"'):
        assert needed in r.text
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    assert "http" not in r.text.replace("http-equiv", "")  # no absolute URL: nothing from elsewhere
    for name in ("app.js", "app.css", "favicon.svg"):
        asset = client.get(f"/web/{name}")
        assert asset.status_code == 200 and asset.content == (web.WEB_DIR / name).read_bytes()
        assert "https://" not in asset.text and "http://" not in asset.text.replace("http://www.w3.org", "")
    assert client.get("/web/..%2Fschemas.py").status_code == 404
    assert client.get("/web/index.py").status_code == 404
    assert client.head("/").status_code == 200
    # shipped in the wheel
    assert '\napi = ["web/*"]\n' in (ROOT / "pyproject.toml").read_text()
    assert {p.name for p in web.WEB_DIR.iterdir()} == {"index.html", *web.ASSETS}
