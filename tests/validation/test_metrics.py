"""Published metrics -> seconds per step, against hand-computed values."""

from pathlib import Path

import pytest

from validation import loader
from validation.metrics import RunShape, megatron_flops, step_time_s

from .rows import row, write

# GPT-1.7B of Megatron-LM SC21 Table 1: 512 x 2048 tokens, 24 layers, h 2304, 32 GPUs, 137 TFLOP/s
B, S, L, H, V, G = 512, 2048, 24, 2304, 51200, 32
SHAPE = RunShape(global_batch=B, seq=S, layers=L, hidden=H, vocab=V, ffn=4 * H, kv_hidden=H, gated=False,
                 num_gpus=G)


def test_megatron_flops_is_the_papers_closed_form():
    """Narayanan et al. 2021 eq. 3: 96 B s L h^2 (1 + s/6h + V/16Lh) with full recomputation,
    72 B s L h^2 (1 + s/6h + V/12Lh) without."""
    with_rc = 96 * B * S * L * H**2 * (1 + S / (6 * H) + V / (16 * L * H))
    without = 72 * B * S * L * H**2 * (1 + S / (6 * H) + V / (12 * L * H))
    assert megatron_flops(batch=B, seq=S, layers=L, hidden=H, vocab=V, recompute_full=True) == pytest.approx(
        with_rc
    )
    assert megatron_flops(batch=B, seq=S, layers=L, hidden=H, vocab=V, recompute_full=False) == pytest.approx(
        without
    )


def test_tflops_per_gpu_counts_recompute_only_when_stated():
    with_rc = 96 * B * S * L * H**2 * (1 + S / (6 * H) + V / (16 * L * H))
    without = 72 * B * S * L * H**2 * (1 + S / (6 * H) + V / (12 * L * H))
    assert step_time_s(
        "tflops_per_gpu", 137.0, SHAPE, recompute_full=True, peak_tflops=312.0
    ) == pytest.approx(with_rc / (137e12 * G))
    assert step_time_s(
        "tflops_per_gpu", 137.0, SHAPE, recompute_full=False, peak_tflops=312.0
    ) == pytest.approx(without / (137e12 * G))


def test_mfu_divides_the_count_without_recompute_by_the_dtype_peak():
    without = 72 * B * S * L * H**2 * (1 + S / (6 * H) + V / (12 * L * H))
    for metric, value in (("mfu", 0.44), ("mfu_percent", 44.0)):
        got = step_time_s(metric, value, SHAPE, recompute_full=True, peak_tflops=312.0)
        assert got == pytest.approx(without / (0.44 * 312e12 * G))


@pytest.mark.parametrize("metric, value, seconds", [
    ("iteration_time_s", 2.5, 2.5),
    ("iteration_time_ms", 2500.0, 2.5),
    ("step_time_ms", 2500.0, 2.5),
    ("tokens_per_s", B * S / 2.5, 2.5),
    ("tokens_per_s_per_gpu", B * S / 2.5 / G, 2.5),
    ("samples_per_s", B / 2.5, 2.5),
])
def test_time_and_throughput_metrics(metric, value, seconds):
    assert step_time_s(metric, value, SHAPE, recompute_full=False, peak_tflops=312.0) == pytest.approx(
        seconds
    )


def test_a_non_time_metric_is_refused_by_name():
    with pytest.raises(ValueError, match="'loss' is not a time metric"):
        step_time_s("loss", 2.0, SHAPE, recompute_full=False, peak_tflops=312.0)


def test_the_rows_activation_checkpointing_column_decides_the_recompute_count(tmp_path: Path):
    """Same TFLOP/s figure: a row stating full checkpointing ran 4/3 as many transformer FLOPs."""
    base = dict(
        model_name="GPT",
        num_layers="24",
        hidden_size="2304",
        num_heads="24",
        vocab_size="51200",
        global_batch_size="512",
        micro_batch_size="16",
        tp="1",
        pp="1",
        dp="32",
        num_gpus="32",
        metric_name="tflops_per_gpu",
        metric_value="137",
        linear_precision="fp16",
        attention_precision="fp16",
    )
    path = write(tmp_path / "r.csv", row(**base, activation_checkpointing="full"),
                 row(**base, activation_checkpointing="none"))
    full, none = (c.measured_time_s for c in loader.load([path]).cases)
    with_rc = 96 * B * S * L * H**2 * (1 + S / (6 * H) + V / (16 * L * H))
    without = 72 * B * S * L * H**2 * (1 + S / (6 * H) + V / (12 * L * H))
    assert full == pytest.approx(with_rc / (137e12 * G))
    assert none == pytest.approx(without / (137e12 * G))


def test_mfu_with_unstated_precision_is_skipped_where_the_peaks_differ(tmp_path: Path):
    """H100: bf16 and fp8 peaks differ, so an MFU figure without a stated precision is no time."""
    path = write(tmp_path / "r.csv", row(gpu_type="H100", linear_precision="", attention_precision="",
                                         metric_name="mfu_percent", metric_value="40"),
                 row(gpu_type="A100", linear_precision="", attention_precision="",
                     metric_name="mfu_percent", metric_value="40"))
    loaded = loader.load([path])
    assert [c.case_id for c in loaded.cases] == ["r.csv:3"]  # A100: bf16 and fp16 share the peak
    assert "peak it divides by differs" in loaded.skipped[0].reason
