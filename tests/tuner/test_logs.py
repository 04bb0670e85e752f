"""Training-log parsers (tuner.logs) on real log excerpts (tests/data/logs: each file names its source)."""

from __future__ import annotations

import pathlib

import pytest

from perfmodels import presets
from perfmodels.calibration import calibrate_runs
from tuner.closed_loop.runs import run_from_dict
from tuner.logs import detect, parse_log

LOGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "logs"


def test_megatron_argument_dump_and_iteration_lines() -> None:
    (run,) = parse_log(LOGS / "megatron_gpt345m_dp4.log")
    # GPT-2 345M as its arguments state it; the vocabulary Megatron padded to 50304
    assert run["model"] == {"num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                            "seq_length": 1024, "vocab_size": 50304, "ffn_hidden_size": 4096,
                            "tied_embeddings": True}
    assert run["training"] == {"global_batch_size": 8, "dtype": "fp16", "stack": "megatron-lm",
                               "flash_attention": False}
    assert run["plan"] == {"G_data": 4, "G_inter": 1, "G_intra_r": 1, "micro_batch_size": 1}
    # iterations 1000..5000 (the first logged interval is warm-up): median of 12 values, by hand
    assert run["iteration_time_s"] == pytest.approx(0.2909)
    assert run["peak_memory_gib"] == pytest.approx(8786.0 / 1024)
    (tp2,) = parse_log(LOGS / "megatron_gpt345m_tp2_pp2.log")
    assert tp2["plan"] == {"G_data": 1, "G_inter": 2, "G_intra_r": 2, "micro_batch_size": 4,
                           "sequence_parallel": True}
    # after the warm-up interval: 1082.6, 1109.8, 839.6, 1031.7 ms, whose median is between the middle two
    assert tp2["iteration_time_s"] == pytest.approx((1.0317 + 1.0826) / 2)


def test_megatron_logs_calibrate_end_to_end() -> None:
    cluster = presets.cluster("selene", num_gpus=4)
    objects = [parse_log(LOGS / name)[0] for name in
               ("megatron_gpt345m_dp4.log", "megatron_gpt345m_tp2_pp2.log", "megatron_gpt345m_tp4.log")]
    runs = [run_from_dict(i, obj, cluster) for i, obj in enumerate(objects)]
    cal = calibrate_runs(runs)
    assert cal.mape_after < cal.mape_before
    assert cal.parameters["memory_overhead_gib"].fitted  # the logs report their peaks
    # the band claims what leave-one-out saw: no tighter than the worst held-out run it is built from
    assert cal.uncertainty_rel >= min(cal.loo_errors)


def test_torchtitan_metrics_lines_with_the_job_toml() -> None:
    (run,) = parse_log(LOGS / "torchtitan_llama3_8b_cp2.log", config=LOGS / "torchtitan_llama3_8b.toml")
    # 4 GPUs (NGPU=4), context parallel 2 from the command line, so FSDP over 2; local batch 1 x 8192
    # tokens; rank 2 logged steps 1 and 10, step 10's 5,615 tokens/s per GPU:
    # step = global batch 2 x 8192 / (5615 x 4 GPUs)
    assert run["iteration_time_s"] == pytest.approx(2 * 8192 / (5615 * 4))
    assert run["peak_memory_gib"] == pytest.approx(44.84)
    assert run["model"] == {"preset": "llama3-8b", "seq_length": 4096, "attention_span": 8192}
    assert run["plan"] == {"G_data": 4, "G_inter": 1, "G_intra_r": 1, "micro_batch_size": 1,
                           "recompute": "full", "zero_stage": 3}
    assert run["training"]["stack"] == "torchtitan" and run["training"]["global_batch_size"] == 4
    cluster = presets.cluster("grand-teton", num_gpus=8)
    assert run_from_dict(0, run, cluster).plans[0].world_size == 4
    with pytest.raises(ValueError, match="job TOML"):
        parse_log(LOGS / "torchtitan_llama3_8b_cp2.log")


def test_deepspeed_timer_and_config_lines() -> None:
    with pytest.raises(ValueError, match="--global-batch-size"):
        parse_log(LOGS / "deepspeed_timer.log", defaults={"model": {"preset": "gpt2-medium"}})
    (run,) = parse_log(LOGS / "deepspeed_timer.log",
                       defaults={"model": {"preset": "gpt2-medium"}, "global_batch_size": 32})
    # SamplesPerSec at steps 40 and 50; the first is warm-up: 32 samples / 83.738... per second
    assert run["iteration_time_s"] == pytest.approx(32 / 83.73838805358588)
    assert run["peak_memory_gib"] == pytest.approx(9.02)
    assert run["training"]["stack"] == "deepspeed"
    from tuner.logs import deepspeed
    from tuner.logs.common import dotted_values, lines

    config = dotted_values(lines((LOGS / "deepspeed_config.log").read_text()))
    assert config["gradient_accumulation_steps"] == "2" and config["fp16_enabled"] == "False"
    assert not deepspeed.matches((LOGS / "deepspeed_config.log").read_text())  # no throughput line


def test_detect_and_refuse_unknown_logs(tmp_path) -> None:
    assert detect((LOGS / "megatron_gpt345m_tp4.log").read_text()) == "megatron"
    assert detect((LOGS / "torchtitan_llama3_8b_cp2.log").read_text()) == "torchtitan"
    assert detect((LOGS / "deepspeed_timer.log").read_text()) == "deepspeed"
    other = tmp_path / "other.log"
    other.write_text("epoch 1 loss 2.3\n")
    with pytest.raises(ValueError, match=r"other\.log: not a Megatron"):
        parse_log(other)
