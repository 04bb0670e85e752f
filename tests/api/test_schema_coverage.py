"""The request schemas accept every field of the domain specs they stand for.

When a spec in perfmodels (or SearchOptions in tuner) grows a field, the service must learn it too,
or clients that send what `perfmodels.io`'s `*_to_dict` writes would get a 422. This test names the
field to add to api/schemas.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from api import schemas
from perfmodels import specs
from tuner.types import SearchOptions

PAIRS = [
    (specs.Model, schemas.ModelIn),
    (specs.LayerSpec, schemas.LayerIn),
    (specs.GPU, schemas.GPUIn),
    (specs.Cluster, schemas.ClusterIn),
    (specs.Training, schemas.TrainingIn),
    (specs.Plan, schemas.PlanIn),
    (specs.Profile, schemas.ProfileIn),
    (specs.CollectiveFit, schemas.CollectiveFitIn),
    (SearchOptions, schemas.SearchIn),
]


@pytest.mark.parametrize(("spec", "schema"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_schema_accepts_every_spec_field(spec, schema):
    missing = sorted({f.name for f in dataclasses.fields(spec)} - set(schema.model_fields))
    assert not missing, f"api/schemas.py {schema.__name__} lacks {missing} (fields of {spec.__name__})"


def test_prediction_fields_are_documented_or_passed_through():
    documented = set(schemas.PredictionOut.model_fields)
    for name in ("iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory", "breakdown"):
        assert name in documented
    assert schemas.PredictionOut.model_config.get("extra") == "allow"


def test_a_layer_model_as_io_writes_it_is_accepted(client):
    """model_to_dict of a layer-list model carries zeros for the transformer dimensions."""
    from perfmodels.io import model_to_dict

    model = specs.Model(
        layers=(
            specs.LayerSpec(name="fc1", in_features=64, out_features=256, rows_per_sample=32),
            specs.LayerSpec(name="fc2", in_features=256, out_features=64, rows_per_sample=32, transpose=True),
        )
    )
    body = {"model": model_to_dict(model), "cluster": {"preset": "local-cpu", "num_gpus": 4},
            "training": {"global_batch_size": 8, "dtype": "fp32"}, "plan": {"G_data": 2, "G_intra_r": 2}}
    r = client.post("/v1/predict", json=body)
    assert r.status_code == 200, r.text
    zero = {**body, "model": {"num_layers": 4, "hidden_size": 0, "num_attention_heads": 4, "seq_length": 32,
                              "vocab_size": 256}}
    r = client.post("/v1/predict", json=zero)
    assert r.status_code == 422 and "model.hidden_size must be a positive integer, got 0" in r.text


def test_cuda_graph_scope_is_accepted_and_checked(client):
    """`training.cuda_graph_scope` (Megatron's scope names) reaches the model; an unknown scope is a
    422 naming the field."""
    body = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"preset": "eos", "num_gpus": 16},
            "training": {"global_batch_size": 512, "dtype": "fp8", "stack": "nemo",
                         "expert_load_imbalance": 1.0},
            "plan": {"G_data": 8, "G_inter": 2, "G_ep": 8, "G_etp": 1, "virtual_stages": 12,
                     "schedule": "interleaved-1f1b"}}
    eager = client.post("/v1/predict", json=body)
    assert eager.status_code == 200, eager.text
    graphed_body = {**body, "training": {**body["training"],
                                         "cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]}}
    graphed = client.post("/v1/predict", json=graphed_body)
    assert graphed.status_code == 200, graphed.text
    assert graphed.json()["iteration_time_s"] < 0.9 * eager.json()["iteration_time_s"]
    bad_training = {**body["training"], "cuda_graph_scope": ["moe"]}
    bad = client.post("/v1/predict", json={**body, "training": bad_training})
    assert bad.status_code == 422
    assert "cuda_graph_scope" in bad.text
