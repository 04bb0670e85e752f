"""Megatron sequence parallelism's tensor-parallel traffic, hand-derived.

With sequence parallelism each of a block's row all-reduces becomes an all-gather (before QKV and
fc1: the sequence shards gathered) and a reduce-scatter (after out_proj and fc2: the partial sums
reduced and scattered back over the sequence), the same bus volume as the all-reduce it replaces
(Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section
4.2.2). Per block and micro-batch, forward: 2 all-gathers and 2 reduce-scatters of the full
[b*s, h] activation; backward the same (their gradients).

    PYTHONPATH=. .venv/bin/python -m pytest tests/perfmodels/test_sequence_parallel.py -q
"""

from __future__ import annotations

from perfmodels.plans import from_plans
from perfmodels.specs import Model, Plan, Training
from perfmodels.traffic import comm_events

GPT = Model(name="gpt", num_layers=8, hidden_size=512, num_attention_heads=8, seq_length=256, vocab_size=1000)
B, GB = 2, 8


def _row(plan: Plan, phase: str) -> dict[str, tuple[float, float]]:
    """(calls, bytes) per step of each op over row in `phase`, for the blocks (tag tp_*)."""
    out: dict[str, tuple[float, float]] = {}
    training = Training(global_batch_size=GB, dtype="bf16", stack="megatron-core")
    for ev in comm_events(GPT, training, from_plans([plan])):
        if ev.axis == "row" and ev.phase == phase and ev.tag in ("tp_fwd", "tp_bwd"):
            calls, nbytes = out.get(ev.op, (0.0, 0.0))
            out[ev.op] = (calls + float(ev.calls[0]), nbytes + float(ev.calls[0] * ev.payload_bytes[0]))
    return out


def test_each_row_all_reduce_becomes_an_all_gather_and_a_reduce_scatter():
    m = GB // (B * 2)  # micro-batches per replica
    act = B * GPT.seq_length * GPT.hidden_size * 2  # one [b*s, h] activation in bf16
    sp = Plan(G_intra_r=4, G_data=2, micro_batch_size=B, sequence_parallel=True)
    plain = Plan(G_intra_r=4, G_data=2, micro_batch_size=B)
    for phase in ("fwd", "bwd"):
        row = _row(sp, phase)
        assert row["all_gather"] == (2 * GPT.num_layers * m, 2 * GPT.num_layers * m * act), phase
        assert row["reduce_scatter"] == (2 * GPT.num_layers * m, 2 * GPT.num_layers * m * act), phase
        assert row.get("all_reduce", (0.0, 0.0)) == (0.0, 0.0)
    # the forward all-reduces they replace without sequence parallelism: as many, of the same
    # activation (backward also holds the LM head's input-gradient all-reduce there)
    assert _row(plain, "fwd")["all_reduce"] == _row(sp, "fwd")["all_gather"]
