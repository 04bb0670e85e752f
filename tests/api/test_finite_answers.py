"""Every numeric input of /v1/predict at an extreme (1e-320, 1e308, NaN, +-Infinity) gets a 422 naming
the field or a finite answer: never a 500, never a 200 with a null or non-finite time.

The inputs are found by walking the OpenAPI schema of the request alongside two rich bodies (an
explicit transformer on a cluster with a GPU object, an inline profile and a stack object; and a
model given as a layer list), so a numeric field added to any request object is covered without
editing this test (the coverage assertion fails when a numeric field of the schema is not reached).
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api import create_app, examples
from api.settings import Settings

EXTREMES: tuple[tuple[str, str], ...] = (
    ("5e-324", "5e-324"),
    ("1e-320", "1e-320"),
    ("1e308", "1e308"),
    ("-1e308", "-1e308"),
    ("NaN", "NaN"),
    ("Infinity", "Infinity"),
    ("-Infinity", "-Infinity"),
)
"""(label, JSON text) of each value: NaN and Infinity are sent as the bare tokens many JSON
encoders write (Python's json, JavaScript's JSON5 readers), which are not standard JSON."""

MARK = 987654.125
"""A placeholder number put where the extreme goes, then replaced in the JSON text."""

RICH: dict[str, Any] = {
    "model": dict(examples.PREDICT_EXPLICIT["model"], attention_span=8192),
    "cluster": {
        **examples.PREDICT_EXPLICIT["cluster"],
        "gpu": {"preset": "H100-SXM", "peak_tflops": {"bf16": 989.0}},
        "intra_node_latency_us": 5.0,
        "inter_node_latency_us": 10.0,
        "link_efficiency_intra": 0.8,
        "link_efficiency_inter": 0.85,
        "profile": {
            "collectives": [examples.PROFILE["collectives"][0]],
            "gemm_tflops_max": 700.0,
            "gemm_half_size": 64.0,
            "gemm_overhead_us": 8.0,
            "hbm_bandwidth_GBps": 3000.0,
            "corrections": {"compute": 1.0},
            "uncertainty_rel": 0.1,
            # calibrated constants of a stack on a cluster (perfmodels.constants)
            "constants": {"gemm_efficiency": 0.7, "host_us_per_layer": 40.0, "inter_node_busbw_GBps": 40.0},
        },
    },
    "training": {"global_batch_size": 512, "dtype": "bf16", "host_us_per_block": 10.0,
                 "stack": {"name": "megatron-lm"}},
    "plan": examples.PREDICT_EXPLICIT["plan"],
}
SLOW_GPU: dict[str, Any] = {
    **RICH,
    "cluster": {**examples.PREDICT_EXPLICIT["cluster"],
                "gpu": {"preset": "H100-SXM", "hbm_bandwidth_GBps": 0.1, "memory_efficiency": 0.8,
                        "gemm_efficiency_max": 0.8, "flash_fwd_efficiency": 0.5,
                        "flash_bwd_efficiency": 0.4}},
}
"""No profile, so the GPU's own efficiencies and its (slowest plausible) HBM bandwidth are used."""
LAYERS: dict[str, Any] = {
    **examples.PREDICT,
    "model": {"layers": [{"name": "fc", "kind": "linear", "in_features": 1024, "out_features": 1024},
                         {"name": "act", "kind": "other", "flops_per_sample": 1e6,
                          "activation_elements_per_sample": 1e4}]},
    "cluster": {"preset": "local-cpu", "num_gpus": 4},
    "training": {"global_batch_size": 8, "dtype": "fp32"},
    "plan": {"G_data": 4},
}


@pytest.fixture(scope="module")
def client():
    app = create_app(Settings(database_url="sqlite://", cache_mb=0))
    with TestClient(app) as c:
        yield c


def _resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = spec["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _options(spec: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    node = _resolve(spec, node)
    if "anyOf" in node and "properties" not in node:
        return [o for n in node["anyOf"] for o in _options(spec, n)]
    if "oneOf" in node and "properties" not in node:
        return [o for n in node["oneOf"] for o in _options(spec, n)]
    return [node]


def _numeric(spec: dict[str, Any], node: dict[str, Any]) -> bool:
    return any(o.get("type") in ("number", "integer") for o in _options(spec, node))


def _object_schema(spec: dict[str, Any], node: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    for option in _options(spec, node):
        if option.get("type") == "object" and "properties" in option:
            return option.get("title", "?"), option
    return None


def numeric_fields(spec: dict[str, Any], root: str) -> set[tuple[str, str]]:
    """(object title, field) of every numeric property reachable from component `root`."""
    seen: set[str] = set()
    out: set[tuple[str, str]] = set()

    def visit(node: dict[str, Any]) -> None:
        for option in _options(spec, node):
            if option.get("type") == "array":
                visit(option.get("items", {}))
            elif option.get("type") == "object":
                title = option.get("title", "?")
                if "properties" in option:
                    if title in seen:
                        continue
                    seen.add(title)
                    for name, prop in option["properties"].items():
                        if _numeric(spec, prop) or _numeric_map(spec, prop):
                            out.add((title, name))
                        visit(prop)

    visit({"$ref": f"#/components/schemas/{root}"})
    return out


def _numeric_map(spec: dict[str, Any], node: dict[str, Any]) -> bool:
    return any(o.get("type") == "object" and isinstance(o.get("additionalProperties"), dict)
               and _numeric(spec, o["additionalProperties"]) for o in _options(spec, node))


def mutations(spec: dict[str, Any], body: dict[str, Any], root: str):
    """(path, title, field, body with MARK at that field) for each numeric field of each object in `body`."""

    def walk(value: Any, node: dict[str, Any], path: tuple[Any, ...]):
        if isinstance(value, list):
            for option in _options(spec, node):
                if option.get("type") == "array" and value:
                    yield from walk(value[0], option.get("items", {}), (*path, 0))
            return
        if not isinstance(value, dict):
            return
        found = _object_schema(spec, node)
        if found is None:
            return
        title, schema = found
        for name, prop in schema["properties"].items():
            if _numeric(spec, prop):
                yield (*path, name), title, name
            elif _numeric_map(spec, prop):
                key = next(iter(value.get(name) or {}), None)
                if key is not None:
                    yield (*path, name, key), title, name
            if name in value:
                yield from walk(value[name], prop, (*path, name))

    for path, title, name in walk(body, {"$ref": f"#/components/schemas/{root}"}, ()):
        mutated = copy.deepcopy(body)
        target = mutated
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = MARK
        yield path, title, name, mutated


def _non_finite(value: Any, where: str = "") -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [where]
    if isinstance(value, dict):
        return [w for k, v in value.items() for w in _non_finite(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [w for i, v in enumerate(value) for w in _non_finite(v, f"{where}[{i}]")]
    return []


TIMES = ("iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu")


def test_every_numeric_predict_input_at_an_extreme_gets_a_422_or_a_finite_answer(client):
    spec = client.get("/openapi.json").json()
    for base in (RICH, SLOW_GPU, LAYERS):
        r = client.post("/v1/predict", json=base)
        assert r.status_code == 200, r.text[:500]
    reached: set[tuple[str, str]] = set()
    failures: list[str] = []
    cases = 0
    for base in (RICH, SLOW_GPU, LAYERS):
        for path, title, name, body in mutations(spec, base, "PredictRequest"):
            reached.add((title, name))
            text = json.dumps(body)
            assert text.count(repr(MARK)) == 1, path
            for label, token in EXTREMES:
                cases += 1
                r = client.post("/v1/predict", content=text.replace(repr(MARK), token),
                                headers={"content-type": "application/json"})
                where = ".".join(map(str, path))
                if r.status_code == 422:
                    msg = json.dumps(r.json()["detail"])
                    if name not in msg:
                        failures.append(f"{where}={label}: 422 does not name {name!r}: {msg[:200]}")
                elif r.status_code == 200:
                    answer = r.json()
                    bad = _non_finite(answer) + [k for k in TIMES if answer.get(k) is None]
                    if answer["memory"].get("per_gpu_gib") is None:
                        bad.append("memory.per_gpu_gib")
                    bad += [f"breakdown.{k}" for k, v in answer["breakdown"].items() if v is None]
                    if bad:
                        failures.append(f"{where}={label}: 200 with null/non-finite {bad}")
                else:
                    failures.append(f"{where}={label}: {r.status_code} {r.text[:200]}")
    missing = numeric_fields(spec, "PredictRequest") - reached
    assert not missing, f"numeric request fields no body reaches (add them to RICH/LAYERS): {sorted(missing)}"
    assert cases > 300
    assert not failures, f"{len(failures)} of {cases} cases:\n" + "\n".join(failures[:80])


def test_a_non_finite_answer_is_a_422_naming_the_input_that_caused_it(client, monkeypatch):
    """The final guard: should the model still overflow for some input (simulated here: an
    intra-node bandwidth below 10 GB/s gives an infinite step), the answer is a 422 that names that
    input, not a 200 with null."""
    import dataclasses

    from api import service

    real = service.predict_step

    def overflowing(model, cluster, training, plan):
        pred = real(model, cluster, training, plan)
        if cluster.intra_node_bandwidth_GBps < 1:
            return dataclasses.replace(pred, iteration_time_s=math.inf)
        return pred

    monkeypatch.setattr(service, "predict_step", overflowing)
    body = copy.deepcopy(examples.PREDICT_EXPLICIT)
    assert client.post("/v1/predict", json=body).status_code == 200
    body["cluster"]["gpu"] = {"preset": "H100-SXM", "memory_gib": 80.0}
    body["cluster"]["intra_node_bandwidth_GBps"] = 0.5
    body["cluster"]["gpus_per_node"] = 8
    r = client.post("/v1/predict", json=body)
    assert r.status_code == 422, r.text[:300]
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "cluster", "intra_node_bandwidth_GBps"], item
    assert "iteration_time_s" in item["msg"] and "0.5" in item["msg"], item


def test_python_users_get_a_value_error_naming_the_field():
    from perfmodels import presets
    from perfmodels.specs import GPU

    h100 = presets.gpu("H100-SXM")
    for name, value in (("memory_efficiency", 5e-324), ("gemm_efficiency_max", 1e-320),
                        ("flash_fwd_efficiency", 5e-324), ("hbm_bandwidth_GBps", 1e-3)):
        with pytest.raises(ValueError, match=rf"gpu\.{name}=.*plausible range"):
            dataclasses_replace(h100, **{name: value})
    cluster = presets.cluster("selene")
    with pytest.raises(ValueError, match=r"cluster\.link_efficiency_inter=.*plausible range"):
        dataclasses_replace(cluster, link_efficiency_inter=1e-320)
    assert GPU  # the class the presets are


def dataclasses_replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_the_reported_500_is_a_422_naming_the_field(client):
    """The issue's case: memory_efficiency=5e-324 on a 0.1 GB/s HBM divided by zero (a 500)."""
    body = copy.deepcopy(examples.PREDICT_EXPLICIT)
    body["cluster"]["gpu"] = {"preset": "H100-SXM", "memory_efficiency": 5e-324, "hbm_bandwidth_GBps": 0.1}
    r = client.post("/v1/predict", json=body)
    assert r.status_code == 422, r.text[:300]
    (item,) = r.json()["detail"]  # only what is wrong inside the GPU object, not "gpu is not a string"
    assert item["loc"] == ["body", "cluster", "gpu", "GPUIn", "memory_efficiency"], item
    assert "plausible range 0.001 to 1" in r.text, r.text[:300]
