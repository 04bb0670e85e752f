"""Specs validate their fields and name the field and value in every error."""

import dataclasses

import pytest

from perfmodels import presets
from perfmodels.io import cluster_from_dict, model_from_dict, plan_from_dict, plan_to_dict, training_from_dict
from perfmodels.specs import Cluster, Model, Plan, Training, validate_combination


def test_plan_rejects_non_positive_degree_naming_it():
    with pytest.raises(ValueError, match=r"plan\.G_data must be a positive integer, got 0"):
        Plan(G_data=0)


def test_grid_product_mismatch_names_every_factor():
    model, cluster = presets.model("gpt3-175b"), presets.cluster("selene", 16)
    with pytest.raises(ValueError) as exc:
        validate_combination(model, cluster, Training(global_batch_size=64), Plan(G_data=3, G_intra_r=4))
    assert "G_data*G_inter*G_intra_d*G_intra_r*G_intra_c = 3*1*1*4*1 = 12 but cluster.num_gpus = 16" in str(
        exc.value
    )


def test_heads_batch_and_layers_problems_are_all_reported():
    model = Model(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=8, vocab_size=32)
    cluster = presets.cluster("local-cpu", 8)
    plan = Plan(G_intra_r=8, G_inter=1, micro_batch_size=3)
    with pytest.raises(ValueError) as exc:
        validate_combination(model, cluster, Training(global_batch_size=8), plan)
    msg = str(exc.value)
    assert "G_intra_r=8 does not divide model.num_attention_heads=4" in msg
    assert (
        "training.global_batch_size=8 is not divisible by G_data*G_intra_d*micro_batch_size = 1*1*3 = 3"
        in msg
    )


def test_layers_fewer_than_stages():
    model = Model(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=8, vocab_size=32)
    with pytest.raises(
        ValueError, match=r"model.num_layers=2 is fewer than G_inter\*virtual_stages = 4\*1 = 4"
    ):
        validate_combination(
            model, presets.cluster("local-cpu", 4), Training(global_batch_size=8), Plan(G_inter=4)
        )


def test_unknown_presets_list_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown model preset 'gpt5'.*gpt3-175b"):
        presets.model("gpt5")
    with pytest.raises(ValueError, match="unknown cluster preset 'mars'"):
        presets.cluster("mars")
    with pytest.raises(ValueError, match="unknown GPU preset"):
        presets.gpu("TPUv4")


def test_presets_have_vendor_numbers():
    assert presets.gpu("H100-SXM").peak_tflops("bf16") == 989.0
    assert presets.gpu("A100-80GB").peak_tflops("fp16") == 312.0
    assert presets.gpu("A100-80GB").peak_tflops("fp8") == 312.0  # no fp8 units: falls back to bf16
    gpt3 = presets.model("gpt3-175b")
    assert abs(gpt3.num_params / 1e9 - 175) < 1.0  # 174.6B with 51,200 vocabulary, untied head
    llama = presets.model("llama3-405b")
    assert llama.num_query_groups == 8 and llama.gated_mlp
    assert abs(llama.num_params / 1e9 - 405) < 6


def test_absurd_gpu_count_rejected():
    with pytest.raises(ValueError, match=r"cluster.num_gpus=10000000 is absurd"):
        dataclasses.replace(presets.cluster("selene"), num_gpus=10_000_000)
    with pytest.raises(ValueError, match="not a whole number of nodes"):
        dataclasses.replace(presets.cluster("selene"), num_gpus=12)


def test_json_round_trip_and_unknown_fields():
    model = model_from_dict({"preset": "gpt3-175b", "seq_length": 4096})
    assert model.seq_length == 4096 and model.hidden_size == 12288
    cluster = cluster_from_dict({"preset": "selene", "num_gpus": 64})
    assert isinstance(cluster, Cluster) and cluster.num_gpus == 64
    custom = cluster_from_dict(
        {
            "num_gpus": 16,
            "gpus_per_node": 8,
            "gpu": {"peak_tflops": {"bf16": 500}, "memory_gib": 64},
            "intra_node_bandwidth_GBps": 200,
            "inter_node_bandwidth_GBps": 25,
        }
    )
    assert custom.gpu.peak_tflops("bf16") == 500
    plan = Plan(G_data=2, G_inter=2, schedule="interleaved-1f1b", virtual_stages=2)
    assert plan_from_dict(plan_to_dict(plan)) == dataclasses.replace(plan, placement=plan.order)
    with pytest.raises(ValueError, match=r"training has unknown field\(s\) \['batch'\]"):
        training_from_dict({"batch": 3})
    with pytest.raises(ValueError, match=r"model.num_layers must be a positive integer, got -1"):
        model_from_dict({"num_layers": -1, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 4,
                         "vocab_size": 8})
