"""Working request bodies for every route, shown in the OpenAPI docs (/docs) and posted by the tests.

Each one is a real question: GPT-3 175B on 1,024 A100s of Selene (Megatron-LM's SC'21 layout
8-way tensor x 16-way pipeline x 8-way data parallel, batch 1,536), a profile as `gridtune profile`
writes it, and a measurement as `engine.train` sends it back.
"""

from __future__ import annotations

from typing import Any

MODEL_GPT3: dict[str, Any] = {"preset": "gpt3-175b"}
CLUSTER_SELENE_1024: dict[str, Any] = {"preset": "selene", "num_gpus": 1024}
TRAINING_GPT3: dict[str, Any] = {"global_batch_size": 1536, "dtype": "bf16"}
PLAN_MEGATRON: dict[str, Any] = {
    "G_data": 8,
    "G_inter": 16,
    "G_intra_d": 1,
    "G_intra_r": 8,
    "G_intra_c": 1,
    "micro_batch_size": 1,
    "schedule": "interleaved-1f1b",
    "virtual_stages": 2,
    "recompute": "selective",
    "zero_stage": 1,
}

PREDICT: dict[str, Any] = {
    "model": MODEL_GPT3,
    "cluster": CLUSTER_SELENE_1024,
    "training": TRAINING_GPT3,
    "plan": PLAN_MEGATRON,
}

PREDICT_EXPLICIT: dict[str, Any] = {
    "model": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "ffn_hidden_size": 14336,
        "seq_length": 8192,
        "vocab_size": 128256,
        "gated_mlp": True,
    },
    "cluster": {
        "num_gpus": 64,
        "gpus_per_node": 8,
        "gpu": "H100-SXM",
        "intra_node_bandwidth_GBps": 450.0,
        "inter_node_bandwidth_GBps": 50.0,
    },
    "training": {"global_batch_size": 512, "dtype": "bf16"},
    "plan": {"G_data": 8, "G_intra_r": 8, "micro_batch_size": 1, "zero_stage": 1},
}

RECOMMEND: dict[str, Any] = {
    "model": MODEL_GPT3,
    "cluster": CLUSTER_SELENE_1024,
    "training": TRAINING_GPT3,
    "top_k": 5,
    "search": {"time_budget_s": 10.0, "zero_stage": [0, 1]},
}

PROFILE: dict[str, Any] = {
    "profile_id": "",
    "collectives": [
        {
            "op": "all_reduce",
            "level": "intra",
            "group_size": 8,
            "alpha_us": 12.0,
            "busbw_GBps": 230.0,
            "r2": 0.998,
        },
        {
            "op": "all_gather",
            "level": "intra",
            "group_size": 8,
            "alpha_us": 9.0,
            "busbw_GBps": 240.0,
            "r2": 0.997,
        },
        {
            "op": "reduce_scatter",
            "level": "intra",
            "group_size": 8,
            "alpha_us": 9.0,
            "busbw_GBps": 235.0,
            "r2": 0.997,
        },
        {
            "op": "all_reduce",
            "level": "inter",
            "group_size": 16,
            "alpha_us": 40.0,
            "busbw_GBps": 21.0,
            "r2": 0.99,
        },
    ],
    "gemm_tflops_max": 265.0,
    "gemm_half_size": 64.0,
    "gemm_overhead_us": 8.0,
    "hbm_bandwidth_GBps": 1800.0,
    "corrections": {},
    "source": "profile",
    "provenance": {"host": "node001", "tool": "gridtune profile", "nccl": "2.21.5"},
}

CLUSTER_CREATE: dict[str, Any] = {
    "name": "selene-a100-profiled",
    "cluster": {"preset": "selene", "num_gpus": 1024},
    "profile": PROFILE,
}

MEASUREMENT: dict[str, Any] = {
    "model": MODEL_GPT3,
    "cluster": CLUSTER_SELENE_1024,
    "training": TRAINING_GPT3,
    "plan": PLAN_MEGATRON,
    "measured": {
        "iteration_time_s": 40.1,
        "compute_s": 31.5,
        "tp_comm_s": 4.2,
        "dp_comm_s": 0.9,
        "pp_bubble_s": 3.1,
        "pp_p2p_s": 0.4,
    },
    "prediction": {"iteration_time_s": 38.6},
}
