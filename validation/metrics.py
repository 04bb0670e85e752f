"""Turn a published throughput figure into seconds per optimizer step.

Sources publish step time, tokens/s, samples/s, model TFLOP/s per GPU or MFU. The model predicts
step time, so every metric is converted here with the definition its source uses:

- `tflops_per_gpu` is Megatron-LM's model-FLOP count (Narayanan et al. 2021, arXiv 2104.04473,
  eq. 3), which counts the recomputed forward pass when every layer is checkpointed. Whether it
  does is read from the row's own `activation_checkpointing` column, nothing else;
- `mfu` / `mfu_percent` divide the same count *without* recomputation by the dense peak of the
  linear dtype (the usual MFU definition).

Run the tests: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/validation/test_metrics.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodels.compute import block_flops_per_token

TIME_METRICS = (
    "iteration_time_s",
    "iteration_time_ms",
    "step_time_ms",
    "tokens_per_s",
    "tokens_per_second",
    "throughput_tokens_per_s",
    "tokens_per_s_per_gpu",
    "tokens_per_second_per_gpu",
    "samples_per_s",
    "sequences_per_s",
    "throughput_samples_per_s",
    "tflops_per_gpu",
    "mfu",
    "mfu_percent",
)


def megatron_flops(*, batch: int, seq: int, layers: int, hidden: int, vocab: int, ffn: int | None = None,
                   recompute_full: bool, kv_hidden: int | None = None, gated: bool = False) -> float:
    """FLOPs per iteration as Megatron-LM reports them (Narayanan et al. 2021, eq. 3).

    72 B s L h^2 (1 + s/(6h) + V/(12 L h)) for forward+backward with ffn = 4h; full recomputation
    adds one forward of the transformer layers (96 B s L h^2 (1 + s/(6h) + V/(16 L h))). Grouped
    query attention shrinks the key/value projections to `kv_hidden`; a gated MLP has three matrices.
    """
    f = ffn or 4 * hidden
    kv = kv_hidden or hidden
    per_layer_fwd = (
        batch * seq * block_flops_per_token(hidden=hidden, kv_hidden=kv, ffn=f, gated=gated, span=seq)
    )
    head_fwd = 2 * batch * seq * hidden * vocab
    passes = 4 if recompute_full else 3
    return float(passes * layers * per_layer_fwd + 3 * head_fwd)


@dataclass(frozen=True, kw_only=True)
class RunShape:
    """What a metric conversion needs to know about one run (whole sequences, before any context
    parallel split)."""

    global_batch: int
    seq: int
    layers: int
    hidden: int
    vocab: int
    ffn: int
    kv_hidden: int
    gated: bool
    num_gpus: int


def step_time_s(metric: str, value: float, shape: RunShape, *, recompute_full: bool,
                peak_tflops: float) -> float:
    """Seconds per optimizer step from one published metric.

    `recompute_full`: the row states full activation checkpointing (Megatron's TFLOP/s then count
    the recomputed forward). `peak_tflops`: dense peak of the linear dtype, for MFU. Raises
    ValueError naming the metric when it is not a time or throughput metric.
    """
    m = metric.strip().lower()
    tokens = float(shape.global_batch * shape.seq)

    def flops(recompute: bool) -> float:
        return megatron_flops(
            batch=shape.global_batch,
            seq=shape.seq,
            layers=shape.layers,
            hidden=shape.hidden,
            vocab=shape.vocab,
            ffn=shape.ffn,
            recompute_full=recompute,
            kv_hidden=shape.kv_hidden,
            gated=shape.gated,
        )

    if m == "iteration_time_s":
        return value
    if m in ("iteration_time_ms", "step_time_ms"):
        return value / 1000.0
    if m in ("tokens_per_s", "tokens_per_second", "throughput_tokens_per_s"):
        return tokens / value
    if m in ("tokens_per_s_per_gpu", "tokens_per_second_per_gpu"):
        return tokens / (value * shape.num_gpus)
    if m in ("samples_per_s", "sequences_per_s", "throughput_samples_per_s"):
        return shape.global_batch / value
    if m == "tflops_per_gpu":
        return flops(recompute_full) / (value * 1e12 * shape.num_gpus)
    if m in ("mfu", "mfu_percent"):  # "mfu" is a fraction, "mfu_percent" a percent
        fraction = value if m == "mfu" else value / 100.0
        return flops(False) / (fraction * peak_tflops * 1e12 * shape.num_gpus)
    raise ValueError(f"metric {metric!r} is not a time metric (known: {', '.join(TIME_METRICS)})")
