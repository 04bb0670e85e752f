"""The service with mixture-of-experts models and context parallelism: the new fields, and 422s that
name the bad values."""

from __future__ import annotations

DEEPSEEK = {
    "model": {"preset": "deepseek-v3"},
    "cluster": {"preset": "eos", "num_gpus": 1024},
    "training": {"global_batch_size": 8192, "stack": "megatron-core", "dtype": "fp8"},
}
PUBLISHED = {"G_data": 64, "G_inter": 8, "G_intra_r": 2, "G_ep": 64, "G_etp": 1, "micro_batch_size": 1,
             "schedule": "interleaved-1f1b", "virtual_stages": 4, "recompute": "selective",
             "sequence_parallel": True, "zero_stage": 1}


def _msgs(r) -> str:
    assert r.status_code == 422, r.text
    return " ".join(item["msg"] for item in r.json()["detail"])


def test_predict_deepseek_v3_published_layout(client):
    r = client.post("/v1/predict", json={**DEEPSEEK, "plan": PUBLISHED})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["breakdown"]["ep_comm_s"] > 0
    assert body["bytes_per_group"]["ep"] > 0
    assert body["memory"]["fits"]


def test_g_ep_not_dividing_the_experts_is_422(client):
    plan = {**PUBLISHED, "G_ep": 48}
    text = _msgs(client.post("/v1/predict", json={**DEEPSEEK, "plan": plan}))
    assert "G_ep=48 does not divide model.num_moe_experts=256" in text


def test_g_cp_larger_than_the_sequence_allows_is_422(client):
    body = {"model": {"preset": "tiny-gpt"}, "cluster": {"preset": "eos", "num_gpus": 32},
            "training": {"global_batch_size": 1, "stack": "megatron-core"}, "plan": {"G_cp": 32}}
    text = _msgs(client.post("/v1/predict", json=body))
    assert "G_cp=32 is larger than model.seq_length=32 allows" in text


def test_bad_expert_fields_are_422_naming_the_value(client):
    model = {"preset": "mixtral-8x7b", "moe_router_topk": 9}
    body = {**DEEPSEEK, "model": model, "plan": {"G_data": 1024}}
    assert "model.moe_router_topk=9 is more than model.num_moe_experts=8" in _msgs(
        client.post("/v1/predict", json=body))
    body = {**DEEPSEEK, "model": {"preset": "mixtral-8x7b", "num_moe_experts": 0}, "plan": {"G_data": 1024}}
    assert "got 0" in _msgs(client.post("/v1/predict", json=body))
    dense = {**DEEPSEEK, "model": {"preset": "llama3.1-8b"}, "plan": {"G_data": 1024, "G_ep": 8}}
    assert "G_ep=8 needs a mixture-of-experts model" in _msgs(client.post("/v1/predict", json=dense))


def test_recommend_searches_expert_parallelism_with_pins(client):
    body = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"preset": "eos", "num_gpus": 16},
            "training": {"global_batch_size": 1024, "stack": "megatron-core", "dtype": "fp8"},
            "top_k": 3,
            "search": {"G_inter": [1], "G_intra_r": [1], "G_ep": [8, 16], "micro_batch_size": [1]}}
    r = client.post("/v1/recommend", json=body)
    assert r.status_code == 200, r.text
    best = r.json()["best"]["plan"]
    assert best["G_ep"] in (8, 16) and best["G_cp"] == 1
    # the best plan predicted alone agrees with the search
    question = {k: body[k] for k in ("model", "cluster", "training")}
    one = client.post("/v1/predict", json={**question, "plan": best})
    assert one.status_code == 200, one.text
    assert abs(one.json()["iteration_time_s"] - r.json()["best"]["prediction"]["iteration_time_s"]) < 1e-6 * (
        one.json()["iteration_time_s"])


def test_stack_option_moe_gates_in_experts(client):
    """`training.stack.moe_gates_in_experts` false: the gates weight the combined expert outputs,
    which keeps each MoE layer's [T*k, h] expert output for backward (`experts.activation_bytes`),
    so the published layout's activations grow; a non-boolean is a 422 naming the field."""
    core = client.post("/v1/predict", json={**DEEPSEEK, "plan": PUBLISHED}).json()["memory"]
    stack = {"name": "megatron-core", "moe_gates_in_experts": False}
    after = client.post("/v1/predict", json={**DEEPSEEK, "training": {**DEEPSEEK["training"], "stack": stack},
                                              "plan": PUBLISHED})
    assert after.status_code == 200, after.text
    assert after.json()["memory"]["activations_gib"] > core["activations_gib"]
    bad = {"name": "megatron-core", "moe_gates_in_experts": "sometimes"}
    r = client.post("/v1/predict", json={**DEEPSEEK, "training": {**DEEPSEEK["training"], "stack": bad},
                                         "plan": PUBLISHED})
    assert r.status_code == 422 and "moe_gates_in_experts" in r.text
