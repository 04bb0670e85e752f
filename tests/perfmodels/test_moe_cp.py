"""Mixture-of-experts and context parallelism: bytes, memory and rules against hand-derived cases."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfmodels import experts, memory, predict, presets
from perfmodels.plans import from_plans
from perfmodels.specs import Model, Plan, Training, combination_problems
from perfmodels.traffic import bytes_per_group, calls_per_group

# h=64, 4 heads, s=32, 4 experts of 32 (SwiGLU), top-2, every layer MoE
TINY_MOE = Model(name="tiny-moe", num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                 vocab_size=256, gated_mlp=True, dropout=False, num_moe_experts=4, moe_router_topk=2,
                 moe_ffn_hidden_size=32)
TINY = Model(name="tiny-gqa", num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
             seq_length=64, vocab_size=256, gated_mlp=True, dropout=False)
BF16 = Training(global_batch_size=4, dtype="bf16")  # the gridtune stack: fp32 weights, 16 B per parameter


def test_all_to_all_bytes_hand_derived():
    # G_ep=4 over 4 data ranks, one micro-batch of one sample: T = 32 tokens, k=2, h=64, e=2 bytes;
    # per MoE layer dispatch + combine forward and their gradients backward: 4 calls of T*k*h*e
    arrays = from_plans([Plan(G_data=4, G_ep=4, G_etp=1)])
    per_call = 32 * 2 * 64 * 2
    assert bytes_per_group(TINY_MOE, BF16, arrays)["ep"][0] == 2 * 4 * per_call
    assert calls_per_group(TINY_MOE, BF16, arrays)["ep"][0] == 8
    # the four ranks of the stage are all expert-parallel: no expert-data group
    assert "edp" not in bytes_per_group(TINY_MOE, BF16, arrays)
    # expert-data over 2 ranks (G_ep=2): the local experts' gradients all-reduced once per step,
    # 2 experts x 3 x 64 x 32 parameters x 2 layers x 2 bytes
    two = from_plans([Plan(G_data=4, G_ep=2, G_etp=1)])
    assert bytes_per_group(TINY_MOE, BF16, two)["edp"][0] == 2 * 3 * 64 * 32 * 2 * 2
    # expert tensor parallelism over 2 row ranks: forward and backward all-reduces of [T*k, h] per
    # layer and micro-batch (2 data ranks: 2 micro-batches of the batch of 4)
    etp = from_plans([Plan(G_data=2, G_intra_r=2, G_ep=2)])  # G_etp defaults to G_intra_r
    assert calls_per_group(TINY_MOE, BF16, etp)["etp"][0] == 2 * 2 * 2
    assert bytes_per_group(TINY_MOE, BF16, etp)["etp"][0] == 2 * 2 * 2 * per_call


def test_split_tokens_gather_over_etp_after_the_dispatch_hand_derived():
    # T = 32 tokens per sample, k=2, h=64, e=2 bytes, 2 MoE layers; the batch of 4 over 2 data ranks:
    # 2 micro-batches of one sample (over 4 data ranks: 1)
    T, k, h, e = 32, 2, 64, 2
    # Megatron-Core with sequence parallelism (etp = row = 2): T/2 tokens per rank, dispatched; the
    # etp group all-gathers its members' received rows after the dispatch and reduce-scatters the
    # outputs before the combine, backward the reverse: 4 calls of G_etp x (T/2)*k*h*e
    sp = from_plans([Plan(G_data=2, G_intra_r=2, G_ep=2, sequence_parallel=True)])
    assert bytes_per_group(TINY_MOE, BF16, sp)["ep"][0] == 2 * 2 * 4 * (T // 2) * k * h * e
    assert bytes_per_group(TINY_MOE, BF16, sp)["etp"][0] == 2 * 2 * 4 * 2 * (T // 2) * k * h * e
    assert calls_per_group(TINY_MOE, BF16, sp)["etp"][0] == 2 * 2 * 4
    # etp over 2 data ranks, no row parallelism: the members hold different tokens, so the same order
    d4 = from_plans([Plan(G_data=4, G_ep=2, G_etp=2)])
    assert bytes_per_group(TINY_MOE, BF16, d4)["etp"][0] == 2 * 1 * 4 * 2 * T * k * h * e
    assert calls_per_group(TINY_MOE, BF16, d4)["etp"][0] == 2 * 1 * 4
    # folded on row 2 without sequence parallelism (the gridtune stack): the row-replicated tokens
    # split over row (T/2 dispatched), the output all-gathered back over row, and in backward the
    # input's gradient [T, h] and the fp32 gates' [T, k]: 3 row all-gathers per layer and
    # micro-batch beyond the dense layers' (those of etp = row, whose MoE sends nothing over row)
    folded = from_plans([Plan(G_data=2, G_intra_r=2, G_ep=4, G_etp=1)])
    plain = from_plans([Plan(G_data=2, G_intra_r=2, G_ep=2)])
    assert bytes_per_group(TINY_MOE, BF16, folded)["ep"][0] == 2 * 2 * 4 * (T // 2) * k * h * e
    extra = (bytes_per_group(TINY_MOE, BF16, folded)["row"][0]
             - bytes_per_group(TINY_MOE, BF16, plain)["row"][0])
    assert extra == 2 * 2 * (2 * T * h * e + T * k * 4)
    extra_calls = (calls_per_group(TINY_MOE, BF16, folded)["row"][0]
                   - calls_per_group(TINY_MOE, BF16, plain)["row"][0])
    assert extra_calls == 2 * 2 * 3
    assert "etp" not in bytes_per_group(TINY_MOE, BF16, folded)
    # the same folding under sequence parallelism (Megatron-Core) splits nothing itself
    folded_sp = from_plans([Plan(G_data=2, G_intra_r=2, G_ep=4, G_etp=1, sequence_parallel=True),
                            Plan(G_data=2, G_intra_r=2, G_ep=2, sequence_parallel=True)])
    row = bytes_per_group(TINY_MOE, BF16, folded_sp)["row"]
    assert row[0] == row[1]
    assert list(experts.emulated_split(folded_sp)) == [False, False]
    assert list(experts.emulated_split(folded)) == [True]


def test_expert_memory_hand_derived():
    # ZeRO-0: E/G_ep = 2 experts of 3 x 64 x 32 per layer, 2 layers, 16 bytes each (gridtune stack)
    arrays = from_plans([Plan(G_data=4, G_ep=2, G_etp=1)])
    blocks = np.array([2.0])
    states = memory.expert_state_bytes(TINY_MOE, BF16, arrays, blocks)
    acts, comms = memory.expert_activations(TINY_MOE, BF16, arrays)
    local = 2 * 3 * 64 * 32 * 2
    assert states.params[0] + states.grads[0] + states.optimizer[0] == local * 16
    assert comms[0] == 2  # the ep and edp groups
    # activations: the dispatched tokens and the expert outputs (2 x T*k*h), fc1 and activation
    # outputs of the gathered tokens (T*k*(2f + f)), 2 bytes each, plus fp32 router probabilities
    T, k, h, f = 32, 2, 64, 32
    assert acts[0] == 2 * (2 * T * k * h + T * k * 3 * f) + 4 * T * 4
    # ZeRO-1 shards the optimizer state over the 2 expert-data ranks (master 0 + Adam 8 bytes)
    z1 = from_plans([Plan(G_data=4, G_ep=2, G_etp=1, zero_stage=1)])
    states1 = memory.expert_state_bytes(TINY_MOE, BF16, z1, blocks)
    assert states1.optimizer[0] == local * 8 / 2


def test_fp8_grouped_linears_keep_their_inputs_in_one_byte():
    # Transformer Engine's grouped linears save their FP8-cast inputs for backward: fc1's input (the
    # T*k dispatched tokens of h) and fc2's (the activation output, T*k of f) at 1 byte, the rest as
    # in bf16 (fc1's output); Megatron-Core weights by the gates inside the experts, so each row keeps
    # its fp32 gate and no expert output; plus the fp32 router probabilities
    arrays = from_plans([Plan(G_data=4, G_ep=2, G_etp=1)])
    T, k, h, f = 32, 2, 64, 32
    megatron = dict(global_batch_size=4, stack="megatron-core")
    bf16 = experts.activation_bytes(TINY_MOE, Training(**megatron, dtype="bf16"), arrays)[0]
    fp8 = experts.activation_bytes(TINY_MOE, Training(**megatron, dtype="fp8"), arrays)[0]
    assert bf16 == T * k * (2 * h + 2 * 2 * f + 2 * f + 4) + 4 * T * 4
    assert fp8 == T * k * (1 * h + 2 * 2 * f + 1 * f + 4) + 4 * T * 4
    # a stack that re-quantizes from the saved bf16 input (torchtitan's Float8Linear) keeps 2 bytes
    titan = dict(global_batch_size=4, stack="torchtitan")
    assert (experts.activation_bytes(TINY_MOE, Training(**titan, dtype="fp8"), arrays)[0]
            == experts.activation_bytes(TINY_MOE, Training(**titan, dtype="bf16"), arrays)[0])


def test_gates_inside_the_experts_save_no_expert_output():
    # Megatron-Core multiplies the activation output by the gates before fc2 (TEGroupedMLP) and
    # unpermutes without probs: per (token, expert) row fc1's input (h), fc1's output (2f, SwiGLU),
    # fc2's input (f), 2 bytes each, and the row's fp32 gate; no [T*k, h] expert output. The
    # gridtune engine weights the combined outputs (y * weights), which saves them: T*k*h*2 more,
    # and no per-row gate. Both keep the fp32 router probabilities [T, E].
    arrays = from_plans([Plan(G_data=4, G_ep=2, G_etp=1)])
    T, k, h, f, E = 32, 2, 64, 32, 4
    core = Training(global_batch_size=4, stack="megatron-core", dtype="bf16")
    core_bytes = experts.activation_bytes(TINY_MOE, core, arrays)[0]
    assert core_bytes == T * k * (2 * h + 4 * f + 2 * f + 4) + 4 * T * E
    assert experts.activation_bytes(TINY_MOE, BF16, arrays)[0] == (
        T * k * (2 * h + 4 * f + 2 * f) + T * k * h * 2 + 4 * T * E)
    # nemo is megatron-core's MoE code
    nemo = Training(global_batch_size=4, stack="nemo", dtype="bf16")
    assert experts.activation_bytes(TINY_MOE, nemo, arrays)[0] == core_bytes


def test_fc1_keeps_the_rows_gathered_over_the_expert_tensor_group():
    # sequence parallelism over row 2 = G_etp 2: T/2 = 16 tokens per rank, k=2, dispatched over
    # G_ep=2; the etp group all-gathers its members' received rows before fc1 (Megatron-Core's
    # dispatch_postprocess), so fc1's saved input is 2 x 16 x 2 = 64 rows of the full h, while
    # fc1's output (2f) and fc2's input (f) of those rows are split over the 2 etp ranks
    arrays = from_plans([Plan(G_data=2, G_intra_r=2, G_ep=2, sequence_parallel=True)])
    T, k, h, f, E = 16, 2, 64, 32, 4
    rows = 2 * T * k
    core = Training(global_batch_size=4, stack="megatron-core", dtype="bf16")
    assert experts.activation_bytes(TINY_MOE, core, arrays)[0] == (
        rows * (2 * h + 2 * (2 * f) / 2 + 2 * f / 2 + 4) + 4 * T * E)


def test_ring_attention_step_bytes():
    # G_cp=2: T_c = 32 tokens, K and V of 2 groups x 16 = 32 features each, 2 bytes: 4096 bytes a hop;
    # per layer forward 1 send + 1 receive, backward 1 + 2 of each (dK, dV return to their owner)
    arrays = from_plans([Plan(G_cp=2)])
    hop = 32 * 2 * 32 * 2
    training = Training(global_batch_size=1)
    assert bytes_per_group(TINY, training, arrays)["cp"][0] == 2 * (2 + 6) * hop
    assert calls_per_group(TINY, training, arrays)["cp"][0] == 2 * 8
    # the cp ranks reduce gradients with the data ranks: what G_data=2 without CP reduces
    flat = bytes_per_group(TINY, training, from_plans([Plan(G_data=2)]))["data"][0]
    assert bytes_per_group(TINY, training, arrays)["data"][0] == flat


def test_context_parallel_divides_activations():
    model = dataclasses.replace(presets.model("llama3.1-8b"), seq_length=32768)
    cluster = presets.cluster("eos").with_gpus(8)
    training = Training(global_batch_size=8, stack="megatron-core")
    one = predict(model, cluster, training, Plan(G_data=8, zero_stage=1))
    four = predict(model, cluster, training, Plan(G_data=2, G_cp=4, zero_stage=1))
    # the blocks' activations shrink 4x (the logits too; the CUDA context and fragmentation do not)
    assert four.memory.activations_gib == pytest.approx(one.memory.activations_gib / 4, rel=0.01)
    assert four.breakdown.cp_comm_s > 0


@pytest.mark.parametrize(("plan", "words"), [
    (Plan(G_data=64, G_inter=16, G_ep=48), "G_ep=48 does not divide model.num_moe_experts=256"),
    (Plan(G_data=512, G_cp=2, G_ep=256, G_etp=8),
     "G_etp*G_ep = 8*256 = 2048 does not divide the 1024 ranks"),
])
def test_expert_rules_name_the_values(plan, words):
    model = presets.model("deepseek-v3")
    cluster = presets.cluster("eos").with_gpus(1024)
    training = Training(global_batch_size=8192, stack="megatron-core")
    problems = "; ".join(combination_problems(model, cluster, training, plan))
    assert words.split(" the ")[0] in problems


def test_context_rules_name_the_values():
    model = presets.model("llama3.1-8b")  # seq 8192
    training = Training(global_batch_size=8, stack="megatron-core")
    cluster = presets.cluster("eos").with_gpus(8192)
    problems = combination_problems(model, cluster, training, Plan(G_cp=8192))
    assert any("G_cp=8192 is larger than model.seq_length=8192 allows" in p for p in problems)
    fsdp = Training(global_batch_size=8, stack="fsdp")
    problems = combination_problems(model, presets.cluster("eos").with_gpus(2), fsdp, Plan(G_cp=2))
    assert any("fsdp stack does not run context parallelism" in p for p in problems)
    dense = combination_problems(model, presets.cluster("eos").with_gpus(2), training, Plan(G_data=2, G_ep=2))
    assert any("G_ep=2 needs a mixture-of-experts model" in p for p in dense)


def test_model_fields_are_validated():
    with pytest.raises(ValueError, match=r"model.moe_router_topk=9 is more than model.num_moe_experts=8"):
        dataclasses.replace(presets.model("mixtral-8x7b"), moe_router_topk=9)
    with pytest.raises(ValueError, match=r"model.moe_layer_freq must be an int or a list of 32"):
        dataclasses.replace(presets.model("mixtral-8x7b"), moe_layer_freq=(1, 0))
    with pytest.raises(ValueError, match=r"model.kv_lora_rank=512 needs model.multi_latent_attention=true"):
        dataclasses.replace(presets.model("llama3.1-8b"), kv_lora_rank=512)


def test_presets_have_their_published_sizes():
    # total parameters as the model cards state them (billions)
    for name, billions in (("mixtral-8x7b", 46.7), ("mixtral-8x22b", 141), ("deepseek-v3", 671),
                           ("qwen3-30b-a3b", 30.5), ("qwen3-235b-a22b", 235), ("gpt-oss-20b", 20.9),
                           ("gpt-oss-120b", 116.8), ("llama4-maverick", 400), ("kimi-k2", 1040)):
        assert presets.model(name).num_params / 1e9 == pytest.approx(billions, rel=0.02), name
    assert presets.model("deepseek-v3").num_moe_layers == 58
    assert presets.model("llama4-maverick").num_moe_layers == 24


def test_expert_flops_count_active_experts():
    # DeepSeek-V3: ~37B activated parameters, so ~2 x 37e9 forward FLOPs per token besides attention
    model = presets.model("deepseek-v3")
    from perfmodels.compute import model_flops_per_token

    core = 4.0 * model.span * model.num_attention_heads * model.attention_core_dim
    dense_attention = core * model.num_layers
    active = (model_flops_per_token(model) - dense_attention) / 2
    assert active == pytest.approx(37e9, rel=0.06)
    assert experts.expert_flops_per_token(model) > 0


def test_load_imbalance_scales_all_to_all_time_not_bytes():
    cluster = presets.cluster("eos").with_gpus(16)
    plan = Plan(G_data=16, G_ep=4, G_etp=1)
    balanced = predict(TINY_MOE, cluster, Training(global_batch_size=16, expert_load_imbalance=1.0), plan)
    default = predict(TINY_MOE, cluster, Training(global_batch_size=16), plan)
    # the stated imbalance, 1.15
    assert default.breakdown.ep_comm_s == pytest.approx(1.15 * balanced.breakdown.ep_comm_s)
    assert default.bytes_per_group["ep"] == balanced.bytes_per_group["ep"]


def test_expert_memory_bound_seconds_hand_derived():
    # G_ep=4: one local expert receives T*k = 64 (token, expert) pairs; its fc1 writes 64 x 2f and the
    # activation 64 x f elements; permute/unpermute pass 4 x T*k*h elements; the router 3 fp32 passes
    # over T x E logits
    from perfmodels.compute import gemm_curve, hbm_rate

    cluster = presets.cluster("eos").with_gpus(4)
    training = Training(global_batch_size=4)
    arrays = from_plans([Plan(G_data=4, G_ep=4, G_etp=1)])
    curve = gemm_curve(cluster, training)
    _, mem = experts.layer_compute(TINY_MOE, training, arrays, curve, hbm_rate(cluster))
    T, k, h, f, E, e = 32, 2, 64, 32, 4, 2
    moved = (4 * T * k * h * e + T * k * 3 * f * e) * 1.15  # 4 passes; the stated imbalance
    router = 3 * T * E * 4  # 3 fp32 passes
    assert mem[0] == pytest.approx((moved + router) / hbm_rate(cluster) + 3 * curve.overhead_s)


def test_all_to_all_across_nodes_runs_at_each_gpus_nic_share():
    from perfmodels import collectives

    cluster = presets.cluster("eos").with_gpus(16)  # 450 GB/s NVLink x 0.8, 50 GB/s NIC per GPU x 0.85
    one = np.array([1e9])
    t = collectives.all_to_all_s(cluster, one, np.array([1.0]), np.array([16]), np.array([False]),
                                 np.array([8]), np.array([0.0]))
    assert t[0] == pytest.approx(1e9 * 8 / 16 / (50e9 * 0.85))
    inside = collectives.all_to_all_s(cluster, one, np.array([1.0]), np.array([8]), np.array([True]),
                                      np.array([8]), np.array([0.0]))
    assert inside[0] == pytest.approx(1e9 * 7 / 8 / (450e9 * 0.8))
    # DeepSeek-V3's top-8 over 8 nodes: 7 (1 - (7/8)^8) distinct remote nodes where 8 x 7/8 copies go
    dedup = experts.node_dedup(presets.model("deepseek-v3"), np.array([64.0]), np.array([8.0]))
    assert dedup[0] == pytest.approx((1 - (7 / 8) ** 8) / 1.0)


def test_ring_hop_hides_behind_attention():
    from perfmodels import context

    cluster = presets.cluster("eos").with_gpus(2)
    training = Training(global_batch_size=1)
    arrays = from_plans([Plan(G_cp=2)])
    model_v, training_v, arrays_v = context.view(TINY, training, arrays, 2)
    geo = {"intra": np.array([True])}
    hop = 4096 / (450e9 * 0.8) + 5e-6  # 2 x 32 tokens x 32 features x 2 bytes over NVLink, one latency
    total, exposed = context.ring_exposed_s(cluster, model_v, training_v, arrays_v, 2, geo, np.array([0.0]),
                                            np.array([0.0]), np.array([0.0]))
    assert total[0] == pytest.approx(3 * hop)  # 1 forward hop, 2 backward
    assert exposed[0] == pytest.approx(3 * hop)  # nothing to hide behind
    _, hidden = context.ring_exposed_s(cluster, model_v, training_v, arrays_v, 2, geo, np.array([1.0]),
                                       np.array([1.0]), np.array([0.0]))
    assert hidden[0] == 0.0


def test_context_parallelism_is_searched_from_the_minimum_sequence():
    from tuner.space import CP_MIN_SEQUENCE, cp_options
    from tuner.types import SearchOptions

    training = Training(global_batch_size=8, stack="megatron-core")
    long = dataclasses.replace(presets.model("llama3.1-8b"), seq_length=CP_MIN_SEQUENCE)
    short = dataclasses.replace(presets.model("llama3.1-8b"), seq_length=CP_MIN_SEQUENCE // 2)
    assert cp_options(long, training, SearchOptions(), 64) == (1, 2, 4, 8, 16, 32, 64)
    assert cp_options(short, training, SearchOptions(), 64) == (1,)
    assert cp_options(short, training, SearchOptions(G_cp=(2,)), 64) == (2,)


def test_dropless_dispatchers_wait_for_the_host_once_per_moe_layer_forward():
    from perfmodels.compute import host_seconds_per_block

    cluster = presets.cluster("eos").with_gpus(4)
    arrays = from_plans([Plan(G_data=4, G_ep=4, G_etp=1), Plan(G_data=4, G_ep=4, G_etp=1, recompute="full")])
    training = Training(global_batch_size=4, stack="megatron-core")
    wait = experts.sync_wait_s(TINY_MOE, cluster, training, arrays, np.array([2.0, 2.0]))
    host = host_seconds_per_block(cluster, training)
    assert list(wait) == pytest.approx([2 * host, 2 * 2 * host])  # two MoE layers; recomputed: twice
    # the dropless "flex" dispatcher (HybridEP without a static budget, DeepEP's normal mode) waits for
    # the received counts on the host too
    flex = dataclasses.replace(training, moe_token_dispatcher="flex")
    assert list(experts.sync_wait_s(TINY_MOE, cluster, flex, arrays, np.array([2.0, 2.0]))) == pytest.approx(
        [2 * host, 2 * 2 * host])


@pytest.mark.parametrize("order", [("col", "row", "cp", "depth", "inter", "data"),
                                   ("col", "row", "cp", "depth", "data", "inter")])
def test_expert_group_geometry_matches_the_listed_groups(order):
    """Members per node and link level of the expert groups, vectorized, against the groups
    `layout.expert_groups` lists (8 GPUs per node)."""
    from perfmodels import layout

    cases = [((1, 8, 1), 8, 1), ((2, 8, 2), 4, 1), ((2, 4, 4), 2, 2), ((4, 16, 2), 16, 1),
             ((1, 32, 4), 4, 2), ((8, 8, 2), 8, 1), ((2, 16, 8), 16, 2), ((1, 64, 2), 8, 1)]
    for (r, d, i), ep, etp in cases:
        deg = {"row": r, "data": d, "inter": i}
        groups = layout.expert_groups(deg, ep, etp, order)
        plan = Plan(G_data=d, G_inter=i, G_intra_r=r, G_ep=ep, G_etp=etp, placement=order)
        geo = experts.expert_geometry(from_plans([plan]), 8)
        for kind in ("etp", "ep", "edp"):
            members = groups[kind][0]
            per_node = [sum(1 for x in members if x // 8 == node) for node in {x // 8 for x in members}]
            assert bool(geo[kind]["intra"][0]) == (len(per_node) == 1), (kind, deg, ep, etp)
            assert int(geo[kind]["members_per_node"][0]) == max(per_node), (kind, deg, ep, etp)


def test_grouped_gemm_never_beats_reading_its_weights():
    # 8 experts of DeepSeek-V3's fc1 (7168 -> 2 x 2048), bf16, on a GEMM curve of 700 TFLOP/s and a
    # memory read at 3 TB/s: at 32 tokens per expert the 8 x 7168 x 4096 x 2 bytes of weights (470 MB,
    # 157 us) dwarf the 2 x 8 x 32 x 7168 x 4096 FLOPs (21.5 us at the curve's best); at 4096 tokens the
    # FLOPs (2.7 ms) dwarf the bytes (0.26 ms)
    from perfmodels.compute import GemmCurve, gemm_time_s

    curve = GemmCurve(tflops_max=700.0, half_size=56.0, overhead_s=4e-6)
    rate = 3e12
    small = experts.grouped_gemm_s(32, 4096, 7168, 8, curve, rate, 2.0, 2.0)
    weights = 8 * 7168 * 4096 * 2 + 8 * 32 * (4096 + 7168) * 2
    assert small == pytest.approx(weights / rate + 4e-6)
    large = experts.grouped_gemm_s(4096, 4096, 7168, 8, curve, rate, 2.0, 2.0)
    assert large == pytest.approx(8 * (gemm_time_s(4096, 4096, 7168, curve) - 4e-6) + 4e-6)


def test_selective_recomputation_keeps_the_moe_layers_on_megatron():
    """Megatron-Core recomputes a MoE layer only where recompute_modules names "moe" ("mlp" is the
    dense MLP only): `recompute="selective"` on megatron-core runs no second dispatch or combine,
    keeps the experts' activations and adds no MoE recompute time; full recomputation repeats both
    all-to-alls. T = 32 tokens, k=2, h=64, e=2: 4 calls of T*k*h*e per MoE layer (2) and micro-batch
    (1), 6 with full recomputation."""
    training = Training(global_batch_size=4, dtype="bf16", stack="megatron-core")
    plans = [Plan(G_data=4, G_ep=4, G_etp=1, recompute=r) for r in ("none", "selective", "full")]
    arrays = from_plans(plans)
    per_call = 32 * 2 * 64 * 2
    ep = bytes_per_group(TINY_MOE, training, arrays)["ep"]
    assert list(ep) == [2 * 4 * per_call, 2 * 4 * per_call, 2 * 6 * per_call]
    cluster = presets.cluster("eos").with_gpus(4)
    none, selective, full = (predict(TINY_MOE, cluster, training, p) for p in plans)
    # flash attention keeps no scores, so selective keeps every activation: the same memory as none
    assert selective.memory.activations_gib == pytest.approx(none.memory.activations_gib)
    assert selective.breakdown.ep_comm_s == pytest.approx(none.breakdown.ep_comm_s)
    assert full.breakdown.ep_comm_s == pytest.approx(1.5 * none.breakdown.ep_comm_s)


def test_combined_1f1b_overlaps_each_all_to_all_with_its_partner_node():
    """Megatron-Core's combined 1F1B (model_chunk_schedule_plan.py): combine_bwd || attention fwd,
    dispatch_fwd -> dispatch_bwd || mlp_bwd -> mlp_fwd, combine_fwd || attention bwd; backward twice
    the forward. All-to-all 1, attention forward 0.5, experts forward 0.25: phases max(1, 0.5) = 1,
    max(max(0.5, 1) + 0.25, max(1, 0.25) + 1) = 2, max(1, 1) = 1: 4 against 2.25 of compute."""
    assert experts.overlapped_exposed_s(np.array([1.0]), 0.5, 0.25)[0] == pytest.approx(4.0 - 2.25)
    # no all-to-all: nothing exposed; no compute: all four exposed; ample compute: hidden
    assert experts.overlapped_exposed_s(np.array([0.0]), 0.5, 0.25)[0] == pytest.approx(0.0)
    assert experts.overlapped_exposed_s(np.array([1.0]), 0.0, 0.0)[0] == pytest.approx(4.0)
    assert experts.overlapped_exposed_s(np.array([1.0]), 2.0, 2.0)[0] == pytest.approx(0.0)


def test_host_ops_of_a_moe_layer_hand_derived():
    """A block issues 30 ops a forward; an MoE layer 30 + 12 (router 4, dispatcher preprocessing 4,
    dispatch / sort / combine 4) + 2 grouped linears x local experts x (1 cuBLAS GEMM launch, + 3
    quantize launches in FP8 current scaling) on Megatron-Core; CUDA graphs replace a captured
    part's ops by one launch."""
    qwen = presets.model("qwen3-30b-a3b")  # 128 experts, every layer MoE
    arrays = from_plans([Plan(G_data=8, G_inter=2, G_ep=8, G_etp=1), Plan(G_data=16, G_ep=16, G_etp=1)])
    fp8 = Training(global_batch_size=512, stack="nemo", dtype="fp8")
    bf16 = dataclasses.replace(fp8, dtype="bf16")
    # 16 and 8 local experts
    assert list(experts.host_ops(qwen, fp8, arrays)) == pytest.approx(
        [30 + 12 + 2 * 4 * 16, 30 + 12 + 2 * 4 * 8])
    assert list(experts.host_ops(qwen, bf16, arrays)) == pytest.approx([30 + 12 + 2 * 16, 30 + 12 + 2 * 8])
    # Megatron-Core as Megatron-LM runs it: the same Transformer Engine grouped linears
    core = dataclasses.replace(fp8, stack="megatron-core")
    assert list(experts.host_ops(qwen, core, arrays)) == pytest.approx(
        [30 + 12 + 2 * 4 * 16, 30 + 12 + 2 * 4 * 8])
    assert list(experts.host_ops(qwen, dataclasses.replace(core, dtype="bf16"), arrays)) == pytest.approx(
        [30 + 12 + 2 * 16, 30 + 12 + 2 * 8])
    # one kernel for all experts (torch._grouped_mm): no per-expert ops
    titan = dataclasses.replace(fp8, stack="torchtitan")
    assert list(experts.host_ops(qwen, titan, arrays)) == pytest.approx([42, 42])
    # the 2026 recipes' TE-scoped graphs: attention (15 ops), router (4) and preprocessing (4) one launch each
    graphed = dataclasses.replace(fp8, cuda_graph_scope=("attn", "moe_router", "moe_preprocess"))
    assert list(experts.host_ops(qwen, graphed, arrays)) == pytest.approx(
        [1 + 15 + 1 + 1 + 4 + 2 * 4 * 16, 1 + 15 + 1 + 1 + 4 + 2 * 4 * 8])
    dense = presets.model("llama3.1-8b")
    assert list(experts.host_ops(dense, fp8, arrays)) == [30, 30]
    both = dataclasses.replace(fp8, cuda_graph_scope=["attn", "mlp", "attn"])
    assert both.cuda_graph_scope == ("attn", "mlp")
    assert list(experts.host_ops(dense, both, arrays)) == [2, 2]
    # an MoE layer's "mlp" is its MoE part, which no per-layer graph of a dropless layer captures
    assert list(experts.host_ops(qwen, dataclasses.replace(fp8, cuda_graph_scope=("mlp",)), arrays)) == \
        pytest.approx([170, 106])
    with pytest.raises(ValueError, match="cuda_graph_scope"):
        Training(global_batch_size=1, cuda_graph_scope=("moe",))
    with pytest.raises(ValueError, match="cuda_graph_scope"):
        Training(global_batch_size=1, cuda_graph_scope="attn")  # type: ignore[arg-type]


def test_fine_grained_fp8_experts_make_the_step_host_bound_hand_derived():
    """Qwen3-30B-A3B on 16 H100s as Megatron-Bridge's 25.11 recipe ran it (PP 2, VP 12, EP 8, MBS 1,
    GBS 512, FP8): the busiest stage issues 24 MoE layers of 170 ops and the head (one block's 30) per
    micro-batch, three passes of 0.9 ms per 30 ops: 0.0009 x 3 x (24 x 170 / 30 + 1) = 0.3699 s, more
    than the GPU needs, so the 64 micro-batches take 64 x 0.3699 s plus the pipeline's fill and sends
    (measured: 24.85 s a step, 5,275 tokens/s/GPU). With 4 local experts (EP 32) the same layer is 30 + 12 +
    32 = 74 ops and the GPU, not the host, sets the pace."""
    from perfmodels.steptime import _host_seconds_per_microbatch
    from perfmodels.traffic import stage_shape

    qwen = presets.model("qwen3-30b-a3b")
    cluster = presets.cluster("eos").with_gpus(16)
    order = ("col", "row", "cp", "depth", "data", "inter")
    plan = Plan(G_data=8, G_inter=2, G_ep=8, G_etp=1, micro_batch_size=1, schedule="interleaved-1f1b",
                virtual_stages=12, zero_stage=1, placement=order)
    fp8 = Training(global_batch_size=512, stack="nemo", dtype="fp8", expert_load_imbalance=1.0)
    arrays = from_plans([plan])
    host = _host_seconds_per_microbatch(qwen, cluster, fp8, arrays, stage_shape(qwen.num_layers, arrays))
    assert host[0] == pytest.approx(0.0009 * 3 * (24 * 170 / 30 + 1))
    pred = predict(qwen, cluster, fp8, plan)
    assert pred.breakdown.host_wait_s > 0.5 * pred.iteration_time_s
    assert 64 * 0.3699 < pred.iteration_time_s < 64 * 0.3699 + 1.0
    # bf16: one GEMM launch per expert, no quantize launches: 74 ops, 0.0009 x 3 x (24 x 74 / 30 + 1)
    # = 0.1625 s a micro-batch, about the GPU's own pace: the host waits little
    bf16 = predict(qwen, cluster, dataclasses.replace(fp8, dtype="bf16"), plan)
    assert bf16.breakdown.host_wait_s < 0.02 * bf16.iteration_time_s
