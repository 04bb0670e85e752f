"""Mixture-of-experts layers: expert parallelism, its all-to-all, its grouped GEMMs and its memory.

A mixture-of-experts (MoE) layer replaces a block's MLP by a router (a Linear h -> E, replicated on
every rank, softmax and top-k in fp32), `moe_router_topk` = k routed experts per token out of
`num_moe_experts` = E, and optionally shared experts that every token passes through (an ordinary
tensor-parallel MLP, `perfmodels.structure`). Which layers are MoE layers is `Model.moe_layer_freq`;
a stage's blocks are costed as the model's mean (`Model.moe_fraction` of them MoE layers).

Parallelism (Megatron-Core "MoE parallel folding", `megatron/core/parallel_state.py`
`initialize_model_parallel(expert_model_parallel_size, expert_tensor_parallel_size)`, and
docs/architecture.md): the world / G_inter ranks of one pipeline stage are re-divided into G_etp
(innermost) x G_ep x expert-data. Each rank holds E / G_ep experts, each split over the G_etp
ranks like a Megatron tensor-parallel MLP (fc1 by columns, fc2 by rows).

Per MoE layer and micro-batch, with T tokens on this rank (micro_batch_size x seq / G_cp, divided
by G_intra_r where the layer's tokens are split over the row ranks: `sequence_split`), h = hidden
size, e = bytes per element (the byte contract of `perfmodels.traffic`):
  fwd  all-to-all over "ep"   dispatch  T*k*h*e   (every (token, expert) pair, the rank's own included)
  fwd  all-to-all over "ep"   combine   T*k*h*e
  bwd  the same two again (their gradients)
  "etp", tokens split over the row ranks (Megatron-Core's order, `MoEAlltoAllTokenDispatcher` in
       megatron/core/transformer/moe/token_dispatcher.py at NVIDIA/Megatron-LM d98e8a64: after the
       all-to-all `dispatch_postprocess` all-gathers the received rows over the expert
       tensor-parallel group, `combine_preprocess` reduce-scatters the experts' partial outputs
       before the combine; `gather_from_sequence_parallel_region`'s backward is a reduce-scatter,
       `reduce_scatter_to_sequence_parallel_region`'s an all-gather, tensor_parallel/mappings.py):
       fwd  all-gather of the G_etp members' rows [G_etp*T*k, h] + reduce-scatter of as many;
       bwd  reduce-scatter + all-gather of the same, each G_etp*T*k*h*e
  "etp", tokens replicated over the etp group (the row group, without sequence parallelism):
       fwd  all-reduce of the expert output [T*k, h]; bwd  all-reduce of the input gradient
  "row", tokens split by the stack around the layer (G_etp != G_intra_r without sequence
       parallelism, `emulated_split`): fwd  all-gather of the output [b*seq, h] back to every row
       rank; bwd  all-gather of the input gradient [b*seq, h] and of the gates' [b*seq, k] (fp32)
  full recomputation repeats the dispatch, the combine and the etp collectives around the experts
       in every stack: a reentrant one reruns the whole layer, and one whose recomputation stops at
       the layer's last saved tensor (`Stack.full_recompute_repeats_layer` False: PyTorch's
       non-reentrant checkpoint with early stopping) still reaches past the combine, because the
       ops after it save tensors: the gate weighting saves the combine's output (engine.moe
       `y * weights`; Megatron-Core's unpermute with probs; torchtitan's
       `routed_output * top_scores` when scores are applied after the experts) and the unpermute
       saves its index (`index_add` in engine.moe, `scatter_add` in torchtitan's `MoE.forward`,
       torchtitan/models/moe.py at pytorch/torchtitan a481c26). The row gather back
       (`emulated_split`) follows the unpermute: it is repeated by a reentrant stack, and by one
       that stops early only where a shared expert runs after it (engine.moe adds the shared
       expert's output last, and its Linears save tensors; that expert's own last all-reduce is
       the layer's last and is not repeated: `perfmodels.traffic`)
  selective recomputation (`recompute="selective"`) recomputes no MoE layer, on any stack: Megatron-Core
       recomputes one only where `recompute_modules` names "moe" (transformer_config.py: '"mlp":
       recompute the dense MLP submodule. "moe": recompute the MoE layer.'; transformer_layer.py sets
       `recompute_mlp` only `if not isinstance(self.mlp, MoELayer)`, at NVIDIA/Megatron-LM c767b38682,
       2025-09-30, as at d98e8a64). Its default modules (["core_attn"], what "selective" means on a
       Megatron stack) and the MoE recipes' ["mla_up_proj", "mlp"] (DeepSeek-V3 on H100,
       Megatron-Bridge) or ["layernorm", "moe_act"] (GPT-OSS) keep the MoE layers' activations and
       run no second dispatch or combine
  step all-reduce over "edp" of the local expert gradients (ZeRO-1/2: reduce-scatter + all-gather),
       as Megatron's distributed optimizer shards expert parameters over the expert-data group.

Compute: the router GEMM, then each local expert's fc1 and fc2 as one grouped GEMM at the per-expert
token count m = G_etp x T x k x G_ep / E (T x k x G_ep / E where the etp group's tokens are alike),
priced on the GPU as one kernel's work (`grouped_gemm_s`; Transformer Engine's `GroupedLinear` on
Hopper runs one cuBLAS GEMM per expert over four streams, whose tails overlap), and
the token permutation / unpermutation (`PERMUTE_PASSES` passes over the T x k x h dispatched
activations). Expert compute and the all-to-all wait for the most loaded rank:
`EXPERT_LOAD_IMBALANCE` (or `Training.expert_load_imbalance`) scales their time, never the bytes.

Host: an MoE layer issues more ops than a dense block, its router, dispatcher and combine, and on
stacks that launch the experts' GEMMs one expert at a time ops per local expert (`host_ops`); with
many local experts in FP8 a layer takes the host longer to issue than the GPU to run, and the step is
host-bound (`steptime._host_seconds_per_microbatch` is the floor of a micro-batch).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from perfmodels.layout import axis_stride
from perfmodels.plans import PlanArrays, distinct_rows
from perfmodels.specs import Cluster, Model, Training

EXPERT_LOAD_IMBALANCE = 1.15
"""Tokens on the busiest expert-parallel rank over the mean, in dropless training with load
balancing (Megatron-Core's default: no token dropping, an auxiliary balancing loss; DeepSeek-V3's
bias-based balancing): every rank waits for the busiest in the all-to-all and in the experts'
GEMMs. An assumed typical value (a few experts a little over the mean, averaged over each rank's
E / G_ep experts), stated here rather than fitted; it scales time, never bytes."""
PERMUTE_PASSES = 4.0
"""Passes over the T x k x h dispatched activations per forward, besides the GEMMs: permute (read the
tokens, write k copies sorted by expert), unpermute (read the expert outputs, write the weighted
sum) (Megatron-Core `moe_utils.permute` / `unpermute`)."""
ROUTER_FP32_PASSES = 3.0
"""Passes over the T x E router logits in fp32 per forward: softmax (or sigmoid), top-k and the
auxiliary-loss statistics."""


HOST_OPS_PER_BLOCK = 30.0
"""Host-side ops one transformer block's forward issues, in the unit `compute.HOST_US_PER_BLOCK` prices
("about 30 ops at ~30 us each"): the scale in which the ops below are counted."""
ATTENTION_HOST_OPS = 15.0
"""The attention sublayer's share of a block's ops (input norm, QKV, rotary embedding, the attention
kernel, output projection, residual; the MLP sublayer the other half): what a CUDA graph of scope
"attn" (or "mlp", for a dense block's MLP) replaces by one graph launch."""
MOE_ROUTER_HOST_OPS = 4.0
"""An MoE layer's router per forward, in block ops: Megatron-Core's `TopKRouter.forward`
(megatron/core/transformer/moe/router.py at NVIDIA/Megatron-LM core_v0.15.0) runs the gating GEMM
and its fp32 cast, the fused top-k and score function (`moe_router_fusion`), the forced-balance
random logits where set, the auxiliary-loss statistics and their tracker: about a dozen plain tensor
ops, each (no module hooks, no autograd Function of Transformer Engine) about a third of a block's
module-level op. A CUDA graph of scope "moe_router" replaces them by one launch."""
MOE_PREPROCESS_HOST_OPS = 4.0
"""The dispatcher's preprocessing per forward, in block ops (`MoEAlltoAllTokenDispatcher.preprocess`
and `dispatch_preprocess`, token_dispatcher.py at core_v0.15.0): the routing map's counts per expert,
their all-gather over the tensor/expert-parallel group, the reshapes, sums and index selections that
give the all-to-all's split sizes, their non-blocking device-to-host copies and the fused token
permutation: about a dozen plain ops. Scope "moe_preprocess" captures them."""
MOE_DISPATCH_COMBINE_HOST_OPS = 4.0
"""The rest of an MoE layer's forward besides its experts' GEMMs, in block ops: the dispatch
all-to-all and the host synchronisation it waits for, the sort of the received chunks by local
expert, the fused activation, the unsort, the combine all-to-all and the unpermutation (`MoELayer`
`dispatch` / `routed_experts_compute` / `combine`, moe_layer.py at core_v0.15.0): about a dozen
plain ops, never in a per-layer CUDA graph of a dropless layer (their shapes follow the routing)."""


def host_ops(model: Model, training: Training, arrays: PlanArrays) -> np.ndarray:
    """Host-side ops per forward of one transformer block of `model`, averaged over its dense and
    MoE blocks (Model.moe_fraction), in `HOST_OPS_PER_BLOCK` units of `compute.HOST_US_PER_BLOCK`;
    a backward issues twice as many (the passes of `steptime._host_seconds_per_microbatch`).

    A dense block issues `HOST_OPS_PER_BLOCK`. An MoE layer issues, besides its attention sublayer
    and the MLP-sized rest of a block, its router, dispatcher and combine (`MOE_ROUTER_HOST_OPS`,
    `MOE_PREPROCESS_HOST_OPS`, `MOE_DISPATCH_COMBINE_HOST_OPS`), and, on a stack whose grouped
    linears launch one GEMM per expert, ops per local expert (E / G_ep) in each of its two grouped
    linears (`Stack.grouped_linear_host_ops_per_expert`, plus
    `Stack.grouped_linear_fp8_host_ops_per_expert` in FP8). That is why a fine-grained MoE layer can
    take the host longer to issue than the GPU to run: with 16 local experts in FP8 on Megatron-Core
    an MoE layer is 30 + 12 + 2 x 4 x 16 = 170 ops, between five and six dense blocks' worth.

    Parts captured in CUDA graphs (`Training.cuda_graph_scope`) cost one launch instead of their ops:
    "attn" the attention half of every block, "mlp" the MLP half of a dense block, "moe_router" and
    "moe_preprocess" those parts of an MoE layer."""
    scopes = set(training.cuda_graph_scope)
    graphed = lambda scope, ops: 1.0 if scope in scopes else ops  # noqa: E731
    attention = graphed("attn", ATTENTION_HOST_OPS)
    mlp_half = HOST_OPS_PER_BLOCK - ATTENTION_HOST_OPS
    dense = attention + graphed("mlp", mlp_half)
    if not model.is_moe:
        return np.full(len(arrays), dense)
    stack = training.effective_stack
    per_expert = stack.grouped_linear_host_ops_per_expert
    if training.dtype == "fp8":
        per_expert = per_expert + stack.grouped_linear_fp8_host_ops_per_expert
    local = float(model.num_moe_experts) / arrays.G_ep
    moe = (attention + mlp_half + graphed("moe_router", MOE_ROUTER_HOST_OPS)
           + graphed("moe_preprocess", MOE_PREPROCESS_HOST_OPS) + MOE_DISPATCH_COMBINE_HOST_OPS
           + 2.0 * per_expert * local)
    share = model.moe_fraction
    return (1.0 - share) * dense + share * moe


def load_imbalance(training: Training) -> float:
    """The busiest expert-parallel rank's tokens over the mean: the training's, or the default."""
    value = training.expert_load_imbalance
    return float(EXPERT_LOAD_IMBALANCE if value is None else value)


def sync_wait_s(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                blocks: np.ndarray) -> np.ndarray:
    """Seconds per micro-batch the GPUs of a stage wait for the host in its MoE layers. A dropless
    dispatcher needs the received token counts on the host before it can size its buffers, so the
    host waits for the device once per MoE layer forward, and after that the GPU runs only as fast
    as the host issues the rest of the layer: about one block's forward issue time
    (`compute.host_seconds_per_block`). Full recomputation syncs again. Every dropless dispatcher
    of Megatron-Core does so:
    - "alltoall": `MoEAlltoAllTokenDispatcher` moves the split sizes to the host and synchronizes at
      its `cuda_sync_point` (token_dispatcher.py);
    - "flex" with HybridEP: `_HybridEPManager.dispatch` passes `num_permuted_tokens=None` unless a
      static budget (`moe_expert_rank_capacity_factor`) or drop-and-pad is set, and
      `hybrid_ep_dispatch` then "obtains the size from a GPU tensor, which causes a D2H
      synchronization" (fused_a2a.py, `non_blocking = num_permuted_tokens is not None`);
    - "flex" with DeepEP: `FusedDispatch.forward` returns `num_recv_tokens_per_expert_list`, a host
      list DeepEP's normal-mode dispatch fills by waiting for the device's counts (fused_a2a.py,
      `tokens_per_expert = torch.tensor(num_recv_tokens_per_expert_list)`);
    all at NVIDIA/Megatron-LM d98e8a64. gridtune's training is dropless without a static budget
    (the published MoE recipes of validation/data set none on H100)."""
    from perfmodels.compute import host_seconds_per_block
    from perfmodels.plans import RECOMPUTE_CODE

    if not model.is_moe:
        return np.zeros(len(arrays))
    again = arrays.recompute == RECOMPUTE_CODE["full"]
    layers = np.asarray(blocks, dtype=np.float64) * model.moe_fraction
    return layers * (1.0 + again) * host_seconds_per_block(cluster, training)


def overlapped_exposed_s(a2a_s: np.ndarray, attention_fwd_s: np.ndarray,
                         experts_fwd_s: np.ndarray) -> np.ndarray:
    """Seconds the four all-to-alls of one MoE layer (each `a2a_s`) add to a forward and a backward
    of that layer run together, as Megatron-Core's combined 1F1B schedule runs them
    (`--overlap-moe-expert-parallel-comm`: `TransformerLayerSchedulePlan.run`,
    megatron/core/models/common/model_chunk_schedule_plan.py at NVIDIA/Megatron-LM d98e8a64):

        comm stream:    combine_bwd      | dispatch_fwd -> dispatch_bwd         | combine_fwd
        compute stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd     | pre_dispatch_bwd

    with `attention_fwd_s` the layer's forward before the dispatch ("pre_dispatch": attention, the
    router, the shared experts) and `experts_fwd_s` its routed experts' ("mlp"); backward twice the
    forward, half of the experts' backward the input gradient that `dispatch_bwd` waits for. The
    middle phase: `mlp_fwd` waits for `dispatch_fwd`, `dispatch_bwd` for `mlp_bwd`'s input gradient.
    Each phase lasts as long as the longer of its streams; what exceeds the compute is exposed."""
    c = np.asarray(a2a_s, dtype=np.float64)
    a_f = np.asarray(attention_fwd_s, dtype=np.float64)
    m_f = np.asarray(experts_fwd_s, dtype=np.float64)
    a_b, m_b = 2.0 * a_f, 2.0 * m_f
    middle = np.maximum(np.maximum(m_b, c) + m_f, np.maximum(c, 0.5 * m_b) + c)
    together = np.maximum(c, a_f) + middle + np.maximum(c, a_b)
    return together - (a_f + a_b + m_f + m_b)


def expert_flops_per_token(model: Model) -> float:
    """Forward FLOPs per token of one MoE layer besides its shared experts: the router (2 h E) and
    the k routed experts (2 FLOPs per multiply-add of each expert's weights)."""
    if not model.is_moe:
        return 0.0
    router = 2.0 * model.hidden_size * int(model.num_moe_experts)
    return router + model.moe_router_topk * 2.0 * model.expert_params


def expert_degrees(arrays: PlanArrays) -> dict[str, np.ndarray]:
    """Sizes of the "etp", "ep" and "edp" groups of each plan (world / G_inter ranks of a stage
    folded into G_etp x G_ep x expert-data)."""
    etp = arrays.expert_tp
    stage = arrays.world_size // arrays.G_inter
    return {"etp": etp, "ep": arrays.G_ep, "edp": np.maximum(stage // np.maximum(arrays.G_ep * etp, 1), 1)}


def expert_geometry(arrays: PlanArrays, gpus_per_node: int, cp: int = 1) -> dict[str, dict[str, np.ndarray]]:
    """Link level and members per node of the expert groups, like `layout.group_geometry`.

    Within a stage the ranks are ordered by their coordinates innermost first (col, row, cp, depth,
    data; `layout.expert_groups` lists them): etp groups are consecutive blocks, ep groups stride
    G_etp, edp stride G_etp * G_ep. The axes placed inside "inter" make blocks of consecutive world
    ranks (all of the stage when the pipeline is outermost, as in Megatron's order; col*row*cp*depth
    with the default placement, where the next block of the stage starts G_inter blocks later), so a
    group is `a` members at its stride inside a block, repeated a block apart; its members per node
    follow from the two strides (exact for placements that keep the stage axes in that order, as
    the tests check against `layout.expert_groups`). `cp`: the context-parallel degree when `arrays`
    is the context view of `perfmodels.context` (its G_data holds G_data * G_cp)."""
    n = int(gpus_per_node)
    deg = expert_degrees(arrays)
    real = {**arrays.degrees(), "cp": np.full(len(arrays), cp), "data": arrays.G_data // cp}
    if arrays.placement_index is not None:  # each plan under its own placement
        inner = axis_stride(real, arrays.placements, arrays.placement_index, "inter")
    else:
        order = arrays.placement
        inner = np.ones(len(arrays), dtype=np.int64)
        for axis in order[: order.index("inter")]:
            inner = inner * real[axis]
    block_stride = inner * arrays.G_inter  # world ranks between the starts of consecutive blocks
    out: dict[str, dict[str, np.ndarray]] = {}
    stride = np.ones(len(arrays), dtype=np.int64)
    for name in ("etp", "ep", "edp"):
        p = deg[name].astype(np.int64)
        s = stride
        # a group is `a` members at stride s inside a block, repeated `outer` times a block apart (every
        # degree, stride and block is at least 1)
        span = s * p
        past = s >= inner
        a = np.where(span <= inner, p, np.where(past, 1, np.maximum(inner // s, 1)))
        outer = np.maximum(p // a, 1)
        outer_stride = np.where(past, (s // inner) * block_stride, block_stride)
        reach = outer * outer_stride
        intra = np.where(outer > 1, (reach <= n) & (n % reach == 0), (span <= n) & (n % span == 0))
        q_inner = np.minimum(a, np.maximum(n // s, 1))
        blocks_per_node = np.minimum(outer, np.maximum(n // outer_stride, 1))
        q = np.where(outer_stride < n, q_inner * blocks_per_node, q_inner)
        q = np.where(intra, p, np.minimum(q, p))
        out[name] = {"size": p, "stride": s, "members_per_node": q, "intra": intra | (p == 1)}
        stride = span
    return out


GATE_BYTES = 4
"""Bytes per gate (a token's weight for one of its k experts): the router's probabilities are fp32
(Megatron-Core `moe_utils.topk_softmax_with_capacity`: `torch.softmax(logits, dim=-1,
dtype=torch.float32)`; engine.moe likewise)."""


def sequence_split(arrays: PlanArrays) -> np.ndarray:
    """Whether each plan's MoE layers hold the row group's tokens split over its ranks (T / G_intra_r
    each) rather than replicated on every one, so that an etp group's members hold different tokens
    and all-gather them after the dispatch.

    Under sequence parallelism the layer's input is already split (Megatron-Core trains MoE layers
    with TP > 1 only so: `MoELayer.forward` raises "performance may degrade if MoE and tensor
    parallelism are enabled without also enabling sequence parallelism", moe_layer.py at
    NVIDIA/Megatron-LM d98e8a64). A layout whose etp group is not its row group (G_etp != G_intra_r,
    "MoE parallel folding") must split the tokens too: with row-replicated tokens the ranks of an ep
    group inside one row group would dispatch the same tokens twice (and their experts count each
    twice), so a stack without sequence parallelism splits them itself (`emulated_split`). Only the
    etp group being the row group, without sequence parallelism, keeps them replicated (each etp
    member then holds the same tokens and the partial outputs are all-reduced)."""
    return arrays.sequence_parallel | (arrays.expert_tp != arrays.G_intra_r)


def emulated_split(arrays: PlanArrays) -> np.ndarray:
    """Plans whose MoE layers split row-replicated tokens themselves: G_etp != G_intra_r > 1 without
    sequence parallelism (a stack without it, the gridtune engine: engine.moe keeps each row rank's
    1/G_intra_r of the tokens before the dispatch and all-gathers the layer's output over row
    after the combine). Megatron-Core never runs these (`sequence_split`); under sequence parallelism
    the split comes free with the layer's input and the gather is the next layer's."""
    return ~arrays.sequence_parallel & (arrays.expert_tp != arrays.G_intra_r) & (arrays.G_intra_r > 1)


def tokens_per_rank(model: Model, arrays: PlanArrays) -> np.ndarray:
    """T: tokens this rank holds when a micro-batch reaches an MoE layer (the sample's sequence, or
    its context-parallel chunk, split over the row ranks where `sequence_split`)."""
    b = arrays.micro_batch_size.astype(np.float64)
    return b * model.seq_length / np.where(sequence_split(arrays), arrays.G_intra_r, 1)


def _expert_tokens(model: Model, arrays: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """(tokens one expert GEMM runs over, this rank's local experts)."""
    T = tokens_per_rank(model, arrays)
    etp = arrays.expert_tp.astype(np.float64)
    gathered = np.where(sequence_split(arrays), etp, 1.0)  # Megatron all-gathers over etp first
    E = float(model.num_moe_experts)
    local = E / arrays.G_ep
    return gathered * T * model.moe_router_topk / local, local


def local_expert_params(model: Model, arrays: PlanArrays) -> np.ndarray:
    """Routed-expert parameters this rank holds for one MoE layer: E / G_ep experts over G_etp."""
    return float(model.num_moe_experts) / arrays.G_ep * model.expert_params / arrays.expert_tp


def add_events(ev: object, model: Model, training: Training, arrays: PlanArrays, moe_layers: np.ndarray,
               m: np.ndarray, full_rc: np.ndarray) -> np.ndarray:
    """Add one stage's expert communication to `ev` (a `traffic._Events`, whose degrees must hold
    the expert groups) for `moe_layers` MoE layers on the stage; returns the local expert parameters
    (their gradients go over "edp", not "data"). Full recomputation repeats both all-to-alls and the
    etp collectives; selective recomputation repeats neither (module docstring).

    The etp traffic of split tokens is the all-gather and reduce-scatter Megatron-Core issues (the
    module docstring), each counted at its gathered size as the engine's recorder counts it: in
    ring bytes the pair moves what one all-reduce of that size does (2 (p-1)/p of it), so its time
    is an all-reduce's, but it is two calls of the full buffer each, not one."""
    e = training.bytes_per_element
    h, k = model.hidden_size, model.moe_router_topk
    T = tokens_per_rank(model, arrays)
    a2a = T * k * h * e
    stack = training.effective_stack
    # a recomputed MoE layer runs its forward up to the combine and past it (module docstring)
    again = moe_layers * m * full_rc
    for phase, calls in (("fwd", 2.0 * moe_layers * m), ("bwd", 2.0 * moe_layers * m),
                         ("recompute", 2.0 * again)):
        ev.add("ep", "all_to_all", phase, "ep_a2a", a2a, calls)  # type: ignore[attr-defined]
    split = sequence_split(arrays)
    gathered = a2a * arrays.expert_tp  # the etp group's received rows
    for phase, tag, calls in (("fwd", "tp_fwd", moe_layers * m), ("bwd", "tp_bwd", moe_layers * m),
                              ("recompute", "tp_fwd", again)):
        ev.add("etp", "all_reduce", phase, tag, a2a, calls * ~split)  # type: ignore[attr-defined]
        ev.add("etp", "all_gather", phase, tag, gathered, calls * split)  # type: ignore[attr-defined]
        ev.add("etp", "reduce_scatter", phase, tag, gathered, calls * split)  # type: ignore[attr-defined]
    # a stack without sequence parallelism gathers the layer's output back over row, and in
    # backward its input's and its gates' gradients (each row rank routes every token)
    emulated = moe_layers * m * emulated_split(arrays)
    rows = arrays.micro_batch_size * model.seq_length
    ev.add("row", "all_gather", "fwd", "tp_fwd", rows * h * e, emulated)  # type: ignore[attr-defined]
    # recomputed where something after it saves a tensor (module docstring)
    gather_again = stack.full_recompute_repeats_layer or bool(model.shared_expert_size)
    ev.add("row", "all_gather", "recompute", "tp_fwd", rows * h * e,  # type: ignore[attr-defined]
           emulated * full_rc * gather_again)
    ev.add("row", "all_gather", "bwd", "tp_bwd", rows * h * e, emulated)  # type: ignore[attr-defined]
    ev.add("row", "all_gather", "bwd", "tp_bwd", rows * k * GATE_BYTES, emulated)  # type: ignore[attr-defined]
    local = moe_layers * local_expert_params(model, arrays)
    z = arrays.zero_stage
    edp = expert_degrees(arrays)["edp"]
    padded = np.ceil(local / edp) * edp * e
    ev.add("edp", "all_reduce", "step", "dp_grad", local * e, 1.0 * (z == 0))  # type: ignore[attr-defined]
    ev.add("edp", "reduce_scatter", "step", "dp_grad", padded, 1.0 * (z >= 1))  # type: ignore[attr-defined]
    ev.add("edp", "all_gather", "step", "dp_param", padded, 1.0 * (z >= 1))  # type: ignore[attr-defined]
    return local


LAYER_COLUMNS = ("micro_batch_size", "G_intra_r", "G_ep", "G_etp", "sequence_parallel")
"""The plan columns `layer_compute` reads (tokens per rank, expert tensor parallelism, local experts)."""
DISTINCT_FROM = 4096
"""Rows from which finding the distinct ones pays (below, numbering them costs what it saves)."""


def layer_compute(model: Model, training: Training, arrays: PlanArrays, curve: object,
                  hbm_rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(GEMM seconds, memory-bound seconds) of one MoE layer's router and routed experts per
    micro-batch forward on this rank, with the load imbalance (backward: twice the GEMMs and the
    memory-bound passes, as for every block). For many rows, evaluated once per distinct combination
    of `LAYER_COLUMNS` where that at least halves them (a mixture of experts' grid table repeats a
    few hundred expert layouts over tens of thousands of grids), each row getting its own values."""
    if len(arrays) >= DISTINCT_FROM:
        some, which = distinct_rows([getattr(arrays, name) for name in LAYER_COLUMNS])
        if len(some) * 2 <= len(arrays):
            gemm, mem = _layer_compute(model, training, arrays.take(some), curve, hbm_rate)
            return gemm[which], mem[which]
    return _layer_compute(model, training, arrays, curve, hbm_rate)


def _layer_compute(model: Model, training: Training, arrays: PlanArrays, curve: object,
                   hbm_rate: float) -> tuple[np.ndarray, np.ndarray]:
    from perfmodels.compute import gemm_time_s

    e = training.bytes_per_element
    h, f, E = model.hidden_size, float(model.moe_ffn_hidden_size), float(model.num_moe_experts)
    up = (2.0 if model.gated_mlp else 1.0) * f
    etp = arrays.expert_tp.astype(np.float64)
    T = tokens_per_rank(model, arrays)
    m_e, local = _expert_tokens(model, arrays)
    ovh = curve.overhead_s  # type: ignore[attr-defined]
    # one grouped GEMM per projection: each local expert's share, one launch
    w = 1.0 if training.dtype == "fp8" else float(e)
    grouped = (grouped_gemm_s(m_e, up / etp, h, local, curve, hbm_rate, w, e)
               + grouped_gemm_s(m_e, h, f / etp, local, curve, hbm_rate, w, e))
    router = gemm_time_s(T, E, h, curve)
    imbalance = load_imbalance(training)
    gemm = router + imbalance * grouped
    pairs = T * model.moe_router_topk
    act = m_e * local * (up + f) / etp  # activation function: read the fc1 output, write its result
    mem = ((PERMUTE_PASSES * pairs * h * e + act * e) * imbalance
           + ROUTER_FP32_PASSES * T * E * 4.0)
    if training.dtype == "fp8":
        # FP8 experts (Transformer Engine's grouped linears) quantize each GEMM's input, as the dense
        # linears do (`compute.FP8_CAST_BYTES_PER_ELEMENT`; backward's gradients: twice, as there)
        from perfmodels.compute import FP8_CAST_BYTES_PER_ELEMENT

        mem = mem + m_e * local * (h + f / etp) * FP8_CAST_BYTES_PER_ELEMENT * imbalance
    return gemm, mem / hbm_rate + 3.0 * ovh


def grouped_gemm_s(m: np.ndarray, n: np.ndarray | float, k: np.ndarray | float, groups: np.ndarray | float,
                   curve: object, hbm_rate: float, weight_bytes: float, act_bytes: float) -> np.ndarray:
    """Seconds of one grouped GEMM: `groups` experts, each [m, k] x [k, n], in one launch.

    The dense GEMM curve (`compute.gemm_time_s`) per expert, one launch overhead for all; and never
    faster than reading every expert's weights (and the tokens in and out) from memory once. At the
    few tokens per expert of a layout with many experts and little expert parallelism (m below the
    ~200 FLOPs per byte where a Hopper GPU turns compute-bound), the weights' bytes, not the FLOPs,
    set the time. Measured with `bench/moe_grouped_gemm.py` (torch._grouped_mm, bf16, H200,
    2026-11-28): at 32 tokens per expert the DeepSeek-V3 and Qwen3 expert GEMMs ran at 6-10% of
    the bf16 peak, 2.2-2.8x the curve's time (1.4-1.7x this floor's); from 256 tokens up at
    0.8-1.1x the curve's."""
    from perfmodels.compute import gemm_time_s

    ovh = curve.overhead_s  # type: ignore[attr-defined]
    flops_s = groups * (gemm_time_s(m, n, k, curve) - ovh)
    bytes_s = groups * (n * k * weight_bytes + m * (n + k) * act_bytes) / hbm_rate
    return np.maximum(flops_s, bytes_s) + ovh


def activation_bytes(model: Model, training: Training, arrays: PlanArrays) -> np.ndarray:
    """Bytes one MoE layer's router and routed experts keep for backward per micro-batch.

    Per row its local experts run (`_expert_tokens`: the rank's T*k dispatched (token, expert)
    pairs, all-gathered over G_etp where the tokens are split, as Megatron-Core's
    `dispatch_postprocess` does): fc1's input (h), fc1's output (the activation function's input,
    2f gated, split over G_etp) and fc2's input (the activation output, f over G_etp); per token
    the fp32 router probabilities [T, E]. The token permutation and the all-to-alls save no
    tokens: Transformer Engine's fused `moe_permute` / `moe_unpermute` without merging probs save
    only their `row_id_map` (`_moe_permute_mask_map`, `_moe_unpermute_mask_map` in
    transformer_engine/pytorch/permutation.py at NVIDIA/TransformerEngine 0a67aa3b), Megatron-Core's
    unfused `moe_utils.permute` an index_select's indices.

    Where the gates weight the tokens (`Stack.moe_gates_in_experts`):
    - False (the engine's `y * weights` after the combine; torchtitan's `routed_output *
      top_scores`): that product saves the combine's output, T*k rows of h on the token side;
    - True (Megatron-Core): the gates multiply the activation output inside the experts, before
      fc2 (`TEGroupedMLP.forward`'s `bias_act_func`: `weighted_bias_swiglu_impl(intermediate,
      bias, permuted_probs)`, or `intermediate * permuted_probs`), and the combine's unpermute is
      called without probs (`MoEAlltoAllTokenDispatcher.combine_postprocess`), so fc2's output is
      never saved: the weighted activation keeps each row's gate instead (GATE_BYTES); at
      NVIDIA/Megatron-LM 6c8cdd57 (2025-11-18, megatron/core/transformer/moe/experts.py and
      token_dispatcher.py) as at d98e8a64.

    In FP8 on a stack whose linears save their FP8-cast input (`Stack.fp8_saves_fp8_inputs`), the
    experts' grouped linears do so too: Transformer Engine's `_GroupedLinear.forward` saves the
    quantized `inputmats` for the weight-gradient GEMM, not the bf16 input
    (transformer_engine/pytorch/module/grouped_linear.py at NVIDIA/TransformerEngine 3ea13561), so
    fc1's input (the dispatched tokens) and fc2's (the activation output) are kept at 1 byte."""
    e = training.bytes_per_element
    stack = training.effective_stack
    h, f = model.hidden_size, float(model.moe_ffn_hidden_size)
    up = (2.0 if model.gated_mlp else 1.0) * f
    etp = arrays.expert_tp
    T = tokens_per_rank(model, arrays)
    m_e, local = _expert_tokens(model, arrays)
    rows = m_e * local  # the rows this rank's experts run
    in_b = 1.0 if training.dtype == "fp8" and stack.fp8_saves_fp8_inputs else e  # grouped linears' inputs
    kept = rows * (h * in_b + up / etp * e + f / etp * in_b)
    if stack.moe_gates_in_experts:
        kept = kept + rows * GATE_BYTES
    else:
        kept = kept + T * model.moe_router_topk * h * e
    return kept + 4.0 * T * float(model.num_moe_experts)


def node_dedup(model: Model, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Inter-node bytes of a node-deduplicating dispatch (DeepEP / HybridEP, `Training.moe_token_dispatcher
    == "flex"`) over those of a plain all-to-all, for ep groups of p ranks with q per node: a token's k
    experts, drawn uniformly from the group's N = p/q nodes, reach (N - 1)(1 - (1 - 1/N)^k) distinct
    remote nodes where the all-to-all sends k (N - 1)/N copies off the node."""
    nodes = np.maximum(np.asarray(p, np.float64) / np.maximum(np.asarray(q, np.float64), 1.0), 1.0)
    k = float(model.moe_router_topk)
    plain = k * (nodes - 1.0) / nodes
    distinct = (nodes - 1.0) * (1.0 - (1.0 - 1.0 / nodes) ** k)
    return np.where(nodes > 1.0, distinct / np.maximum(plain, 1e-30), 1.0)


def group_seconds(cluster: Cluster, model: Model, training: Training, events: list,
                  geo: Mapping[str, Mapping[str, np.ndarray]], secs: Mapping[tuple[str, str], np.ndarray],
                  n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(all-to-all, expert tensor-parallel, expert gradient) seconds per step: the all-to-alls costed
    here (`collectives.all_to_all_s`, node-deduplicated for the "flex" dispatcher) with the load
    imbalance, the others from the costed events (`steptime._comm_seconds` keys)."""
    from perfmodels import collectives

    zeros = np.zeros(n)
    etp = sum((v for (axis, _), v in secs.items() if axis == "etp"), zeros.copy())
    edp = sum((v for (axis, _), v in secs.items() if axis == "edp"), zeros.copy())
    if not model.is_moe:
        return zeros, etp, edp
    byte_calls, calls = zeros.copy(), zeros.copy()
    for ev in events:
        if ev.axis == "ep":
            byte_calls = byte_calls + ev.payload_bytes * ev.calls
            calls = calls + ev.calls
    g = geo["ep"]
    flex = training.moe_token_dispatcher == "flex"
    scale = node_dedup(model, g["size"], g["members_per_node"]) if flex else 1.0
    alpha = np.where(g["intra"], cluster.intra_node_latency_us, cluster.inter_node_latency_us)
    a2a = collectives.all_to_all_s(cluster, byte_calls, calls, g["size"], g["intra"], g["members_per_node"],
                                   alpha, inter_scale=scale)
    return load_imbalance(training) * a2a, etp, edp
