"""The OpenAPI schema states the cluster rule ("a preset, a stored profile_id, a GPU preset name with
num_gpus, or all of num_gpus, gpus_per_node, gpu, intra_node_bandwidth_GBps,
inter_node_bandwidth_GBps"), so a client generated
from it (or a fuzzer) knows which clusters are valid: a cluster is valid by the schema exactly when
the API does not answer the cluster rule's 422, and the documented 422 example is what it answers."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api import create_app, examples, schemas
from api.settings import Settings

jsonschema_rs = pytest.importorskip("jsonschema_rs", reason="comes with schemathesis (dev extra)")

CLUSTERS = [
    ({"preset": "selene", "num_gpus": 1024}, True),
    ({"profile_id": "nowhere"}, True),  # valid by the schema; the API's 422 is "names no stored profile"
    (examples.PREDICT_EXPLICIT["cluster"], True),
    ({"gpu": "H100-SXM", "num_gpus": 64}, True),  # the node's links come from the GPU's cluster preset
    ({"num_gpus": 64, "gpus_per_node": 8}, False),
    ({"preset": None, "num_gpus": 64}, False),
    ({"profile_id": None, "preset": None}, False),
    ({**examples.PREDICT_EXPLICIT["cluster"], "gpu": None}, False),
    ({"profile": {"collectives": []}}, False),
    ({}, False),
]


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings(database_url="sqlite://"))) as c:
        yield c


def test_the_schema_and_the_api_agree_on_which_clusters_are_valid(client):
    spec = client.get("/openapi.json").json()
    validator = jsonschema_rs.Draft202012Validator({"$ref": "#/components/schemas/ClusterIn", **spec})
    for cluster, valid in CLUSTERS:
        assert validator.is_valid(cluster) is valid, cluster
        r = client.post("/v1/predict", json={**examples.PREDICT, "cluster": cluster})
        rule_422 = r.status_code == 422 and "cluster needs a 'preset'" in r.text
        assert rule_422 is not valid, (cluster, r.status_code, r.text[:300])


def test_the_documented_422_example_is_what_the_api_answers(client):
    spec = client.get("/openapi.json").json()
    assert spec["components"]["schemas"]["ErrorOut"]["examples"] == [schemas.CLUSTER_RULE_422]
    for path in ("/v1/predict", "/v1/recommend", "/v1/measurements"):
        ref = spec["paths"][path]["post"]["responses"]["422"]["content"]["application/json"]["schema"]
        assert ref == {"$ref": "#/components/schemas/ErrorOut"}, path
    assert spec["components"]["schemas"]["ClusterIn"]["x-rule"] == schemas.CLUSTER_RULE
    r = client.post("/v1/predict", json={**examples.PREDICT, "cluster": {"num_gpus": 64, "gpus_per_node": 8}})
    assert r.status_code == 422 and r.json() == schemas.CLUSTER_RULE_422, r.text
