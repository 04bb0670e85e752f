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
