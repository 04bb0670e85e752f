"""The plan-validity rules, one function each: the single place every caller asks.

Each rule is a predicate on plain numbers that works elementwise on numpy arrays too, so the same
function serves one plan (`specs.combination_problems`, which names the problem in words), whole
columns of candidate plans (`tuner/constraints.py`, which counts the rejections) and the layouts a
published run could have used (`validation/candidates.py`). A rule returns True where the layout
is allowed. The words of each message stay with the caller, who knows which fields it has.

Run the tests: `.venv/bin/python -m pytest -q tests/perfmodels/test_rules.py tests/tuner/test_search.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Int = Any  # an int, or an integer numpy array (the rules broadcast)


def divides(part: Int, whole: Int) -> Any:
    """`part` splits `whole` evenly (a tensor-parallel degree over heads or hidden size, a batch over
    replicas, ...)."""
    return whole % part == 0


def heads_split(num_attention_heads: Int, G_intra_r: Int) -> Any:
    """Row parallelism splits attention heads: each rank must own whole heads."""
    return divides(G_intra_r, num_attention_heads)


def query_groups_split(num_query_groups: Int, G_intra_r: Int) -> Any:
    """Grouped-query attention: the key/value groups are either split over row ranks or replicated
    on them, so one of the two must divide the other."""
    return divides(G_intra_r, num_query_groups) | divides(num_query_groups, G_intra_r)


def hidden_split(size: Int, G_intra_r: Int, G_intra_c: Int) -> Any:
    """A row x col tensor-parallel group splits the hidden (and the FFN hidden) size evenly."""
    return divides(G_intra_r * G_intra_c, size)


def enough_layers(num_layers: Int, G_inter: Int, virtual_stages: Int) -> Any:
    """Every pipeline chunk (stage x virtual stage) holds at least one layer."""
    return num_layers >= G_inter * virtual_stages


def batch_split(global_batch_size: Int, G_data: Int, G_intra_d: Int) -> Any:
    """Data and depth ranks each take whole samples of the global batch."""
    return divides(G_data * G_intra_d, global_batch_size)


def num_microbatches(global_batch_size: Int, G_data: Int, G_intra_d: Int, micro_batch_size: Int) -> Any:
    """Micro-batches per replica and step (the pipeline's m)."""
    return global_batch_size // (G_data * G_intra_d * micro_batch_size)


def microbatch_split(global_batch_size: Int, G_data: Int, G_intra_d: Int, micro_batch_size: Int) -> Any:
    """A replica's share of the batch is a whole number of micro-batches."""
    return divides(G_data * G_intra_d * micro_batch_size, global_batch_size)


def interleave_fits(microbatches: Int, G_inter: Int) -> Any:
    """Interleaved 1F1B runs the micro-batches in rounds of one per stage: a multiple of G_inter."""
    return divides(G_inter, microbatches)


def enough_microbatches(microbatches: Int, G_inter: Int) -> Any:
    """1F1B-style schedules need a micro-batch per stage (torch.distributed.pipelining refuses fewer)."""
    return microbatches >= G_inter


def sequence_parallel_row_only(G_intra_d: Int, G_intra_c: Int) -> Any:
    """Megatron-style sequence parallelism shards the row group's activations: no col or depth split."""
    return (G_intra_c == 1) & (G_intra_d == 1)


def sequence_parallel_has_rows(G_intra_r: Int) -> Any:
    """Sequence parallelism splits over the row group, so there must be more than one row rank."""
    return G_intra_r > 1


# ---------------------------------------------------------------------------------------------
# Context parallelism and mixture-of-experts (Megatron-Core's rules; docs/architecture.md)
# ---------------------------------------------------------------------------------------------


def context_split(seq_length: Int, G_cp: Int) -> Any:
    """Context parallelism with causal load balancing cuts every sequence into 2*G_cp equal chunks
    (cp rank i holds chunks i and 2*G_cp-1-i; Megatron-Core's `get_batch_on_this_cp_rank`), so
    2*G_cp divides the sequence length. G_cp = 1 always holds."""
    return (G_cp == 1) | divides(2 * G_cp, seq_length)


def experts_split(num_moe_experts: Int, G_ep: Int) -> Any:
    """Expert parallelism gives each of the G_ep ranks the same number of whole experts."""
    return divides(G_ep, num_moe_experts)


def expert_grid_fits(stage_ranks: Int, G_ep: Int, G_etp: Int) -> Any:
    """MoE parallel folding re-divides a pipeline stage's ranks (world / G_inter) into
    G_etp x G_ep x expert-data: G_etp * G_ep divides them."""
    return divides(G_ep * G_etp, stage_ranks)


def dense_without_experts(is_moe: Any, G_ep: Int) -> Any:
    """A model without experts has no expert parallelism: G_ep = 1."""
    return is_moe | (G_ep == 1)
# --------------------------------------------------------------------------------------------
# What a training stack's launcher accepts (`Stack.tp_splits_query_groups`, `pipeline_layer_split`,
# `pipeline_max_zero_stage`, `launch_zero_stages`); perfmodels/launchable.py words them and cites
# the framework line that enforces each.
# --------------------------------------------------------------------------------------------


def query_groups_split_exact(num_query_groups: Int, G_intra_r: Int) -> Any:
    """The tensor-parallel ranks split the key/value groups: G_intra_r divides num_query_groups."""
    return divides(G_intra_r, num_query_groups)


def _ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b)


def even_layer_split(num_layers: Int, G_inter: Int, virtual_stages: Int) -> Any:
    """Every pipeline chunk (stage x virtual stage) holds the same number of layers."""
    return divides(G_inter * virtual_stages, num_layers)


def megatron_uneven_split(num_layers: Int, G_inter: Int, virtual_stages: Int) -> Any:
    """Megatron's uneven pipeline (--decoder-first/last-pipeline-num-layers) can cut the layers so
    that no stage holds more than the balanced split's busiest stage, ceil(L / (S v)) * v layers:
    first and last stage counts f, l and one count m on every middle stage, each a multiple of v
    and in [v, ceil(L / (S v)) * v], with f + l + (S - 2) m = L. In units of v (L' = L / v,
    c = ceil(L' / S)), a middle count m' exists when
    max(1, ceil((L' - 2c) / (S - 2))) <= min(c, floor((L' - 2) / (S - 2))); with S = 2 when L' >= 2."""
    L = num_layers // virtual_stages
    c = _ceil_div(L, G_inter)
    middle = np.maximum(G_inter - 2, 1)  # avoid dividing by 0 where there is no middle stage
    lo = np.maximum(1, _ceil_div(L - 2 * c, middle))
    hi = np.minimum(c, (L - 2) // middle)
    fits = (G_inter == 2) & (L >= 2) | (G_inter > 2) & (lo <= hi)
    return divides(virtual_stages, num_layers) & (G_inter >= 2) & (G_inter <= L) & fits


def megatron_first_last(num_layers: int, G_inter: int, virtual_stages: int) -> tuple[int, int] | None:
    """The (first, last) stage layer counts of the uneven split `megatron_uneven_split` allows, with
    the middle stages as full as the balanced split's busiest stage (so the first and last, which
    also hold the embedding and the loss, are the lighter ones); None when the layers split evenly.
    ValueError when neither works."""
    L, S, v = int(num_layers), int(G_inter), int(virtual_stages)
    if S == 1 or L % (S * v) == 0:
        return None
    if not bool(megatron_uneven_split(L, S, v)):
        raise ValueError(f"model.num_layers={L} splits neither evenly over G_inter*virtual_stages = {S}*{v} "
                         "nor with Megatron's first/last-stage counts")
    units = L // v
    c = -(-units // S)
    m = min(c, (units - 2) // (S - 2)) if S > 2 else 0
    rest = units - (S - 2) * m
    first = rest // 2
    return first * v, (rest - first) * v


def megatron_layout_split(num_layers: Int, G_inter: Int, virtual_stages: Int) -> Any:
    """Megatron-Core's custom pipeline layout (`--pipeline-model-parallel-layout`, Megatron-LM
    megatron/training/arguments.py:927-950 and :3103 at NVIDIA/Megatron-LM d98e8a64; checked by
    `PipelineParallelLayerLayout` in TransformerConfig, megatron-core 0.16.0) lists the layers of each
    of the G_inter x virtual_stages chunks, the embedding in the first and the loss in the last:
    `megatron_layout` cuts them with no chunk above the balanced split's ceil(L / (S v)) layers,
    which holds every layer when there are at least as many layers as chunks."""
    return G_inter * virtual_stages <= num_layers


def megatron_layout(num_layers: int, G_inter: int, virtual_stages: int) -> str:
    """The `--pipeline-model-parallel-layout` string of a balanced cut: every chunk ceil(L / (S v))
    layers, less one, where the layers fall short, first for the last chunk (the loss's), then the
    first (the embedding's), then alternately from the ends inwards. Chunk i runs on pipeline rank i
    mod S as its virtual stage i // S (Megatron's order), so no rank holds more than the busiest
    stage the model prices, ceil(L / (S v)) v layers. E.g. 61 layers over 8 x 4 chunks:
    "Et|t*2|...|t*2|t|tL"."""
    L, chunks = int(num_layers), int(G_inter) * int(virtual_stages)
    if chunks > L:
        raise ValueError(f"model.num_layers={L} is fewer than the G_inter*virtual_stages = {chunks} chunks")
    per = -(-L // chunks)
    counts = [per] * chunks
    ends = [i for pair in zip(range(chunks - 1, -1, -1), range(chunks)) for i in pair]
    for i in list(dict.fromkeys(ends))[: per * chunks - L]:
        counts[i] -= 1
    parts = [("t" if n == 1 else f"t*{n}" if n else "") for n in counts]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "L"
    return "|".join(parts)


def torchtitan_layer_split(num_layers: Int, G_inter: Int, virtual_stages: Int) -> Any:
    """torchtitan (`pipeline_parallel_layers_per_stage` = ceil(L / (S v)), no first/last weights)
    makes ceil(L / layers_per_stage) stages, which must be the S * v chunks of the plan."""
    chunks = G_inter * virtual_stages
    per = _ceil_div(num_layers, chunks)
    return (G_inter == 1) | (_ceil_div(num_layers, per) == chunks)


def layer_split(kind: str, num_layers: Int, G_inter: Int, virtual_stages: Int) -> Any:
    """The stack's `pipeline_layer_split` rule: "megatron" (even, or Megatron's first/last-stage
    counts), "megatron-core" (those, or a custom layout), "torchtitan" or "any"."""
    if kind in ("megatron", "megatron-core"):
        ok = (G_inter == 1) | even_layer_split(num_layers, G_inter, virtual_stages) | megatron_uneven_split(
            num_layers, G_inter, virtual_stages)
        if kind == "megatron-core":
            ok = ok | megatron_layout_split(num_layers, G_inter, virtual_stages)
        return ok
    if kind == "torchtitan":
        return torchtitan_layer_split(num_layers, G_inter, virtual_stages)
    return np.ones(np.shape(G_inter), bool) if np.ndim(G_inter) else True


def pipeline_zero(G_inter: Int, zero_stage: Int, max_stage: int) -> Any:
    """With pipeline parallelism the stack allows ZeRO stages up to `max_stage` only."""
    return (G_inter == 1) | (zero_stage <= max_stage)


def sequence_parallel_seq_split(seq_length: Int, G_intra_r: Int, G_cp: Int = 1) -> Any:
    """Sequence parallelism scatters each rank's sequence (seq_length / G_cp tokens) over the row
    ranks along its first dimension, which must divide evenly (Megatron-Core
    megatron/core/tensor_parallel/mappings.py:74, `_split_along_first_dim`)."""
    return divides(G_intra_r * G_cp, seq_length)
