"""Whole-file loading, unknown options as candidates, and no stack rule keyed to the source text."""

from dataclasses import replace
from pathlib import Path

import pytest

from validation import loader
from validation.candidates import Layout, candidate_plans

from .rows import row, write


def _case(tmp_path: Path, **changes: str):
    loaded = loader.load([write(tmp_path / "r.csv", row(**changes))])
    assert not loaded.skipped, loaded.skipped
    return loaded.cases[0]


# --- golden whole-file loads (the vendored data; counts change only when the files or the loader do)


def test_vendored_files_load_with_known_usable_and_skipped_counts():
    per_file = {p.name: loader.load_file(p) for p in loader.default_paths()}
    counts = {name: (len(part.cases), len(part.skipped)) for name, part in per_file.items()}
    assert counts == {
        "published_dev.csv": (87, 4),
        "published_modern.csv": (97, 0),
        "vtrain_multi.csv": (109, 0),
        "published_torchtitan.csv": (7, 0),
        "published_torchtitan_h100.csv": (2, 0),
        "published_nemo_perf_summary.csv": (16, 0),
        "published_llmfoundry_h100.csv": (77, 0),
        "published_torchtitan_compiled.csv": (12, 0),
        "published_megatron_bridge_moe.csv": (7, 0),
    }
    reasons = sorted(s.reason.split(":")[0] for s in per_file["published_dev.csv"].skipped)
    assert reasons == ["global batch size or GPU count not stated"] * 2 + [
        "mfu_percent with linear_precision unstated"] * 2


def test_vtrain_rows_carry_the_stack_facts_of_vtrain_multi_stack_md():
    cases = loader.load_file(loader.DATA_DIR / "vtrain_multi.csv").cases
    assert {c.candidate_count for c in cases} == {1}
    groups = {c.group for c in cases}
    assert len(groups) == 4 and all(g.startswith("megatron-deepspeed ") for g in groups)
    training, plan = cases[0].trainings[0], cases[0].plans[0]
    assert (training.stack, training.dtype, training.attention_dtype, training.flash_attention) == (
        "megatron-deepspeed", "fp16", "fp16", False)
    assert (training.overlap_grad_reduce, training.overlap_param_gather, training.overlap_tp_comm) == (
        False, False, False)
    assert (plan.recompute, plan.zero_stage, plan.schedule, plan.sequence_parallel) == (
        "full",
        0,
        "1f1b",
        False,
    )
    assert cases[0].cluster.gpu.memory_gib == 80.0 and "not stated" in cases[0].card_memory.assumed


def test_single_node_vtrain_layout_and_bad_rows(tmp_path: Path):
    cols = (
        "global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
        "data parallelism,pipeline parallelism,iteration time (ms)"
    )
    single = tmp_path / "single.csv"
    single.write_text(
        f"# GPUs,{cols}\n8,8,1,1024,16,20,1024,8,1,1,815.840026\n4,16,oops,1024,16,12,1024,4,1,1,709.98\n"
    )
    loaded = loader.load([single])
    (case,) = loaded.cases
    assert case.group.startswith("megatron-deepspeed gpt-h1024-L20")
    plan = case.plans[0]
    assert (plan.G_intra_r, plan.G_data, plan.G_inter, plan.micro_batch_size) == (8, 1, 1, 1)
    assert case.measured_time_s == pytest.approx(0.815840026)
    assert [s.case_id for s in loaded.skipped] == ["single.csv:3"]
    # vTrain's own ground_truth_single.csv starts with a UTF-8 byte-order mark: the same rows load
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + single.read_bytes())
    again = loader.load([bom])
    assert [c.measured_time_s for c in again.cases] == [case.measured_time_s]
    assert [s.case_id for s in again.skipped] == ["bom.csv:3"]


# --- no rule keyed to the source, year or notes


def test_the_same_row_under_another_source_year_or_notes_is_the_same_case(tmp_path: Path):
    """Old loaders read the stack from a year in the source name, a paper id, or 'overlap' in the notes."""
    variants = [dict(), dict(source="Megatron-LM SC21 (arXiv 2104.04473) Table 1 (2021)", year="2021",
                             notes="tp-comm-overlap; overlap"),
                dict(source="DeepSpeed ZeRO-3 OneFlow-GPT 2019", year="2019", notes="zero-3")]
    for empty_stack in (False, True):
        stack_blanks = (
            dict(
                activation_checkpointing="",
                linear_precision="",
                attention_precision="",
                overlap_grad_reduce="",
                zero_stage="",
                virtual_pp="",
                metric_name="tflops_per_gpu",
                metric_value="150",
            )
            if empty_stack
            else {}
        )
        cases = [_case(tmp_path, **stack_blanks, **v) for v in variants]
        first = cases[0]
        for other in cases[1:]:
            assert other.trainings == first.trainings
            assert other.plans == first.plans
            assert other.measured_time_s == first.measured_time_s
            assert other.model == first.model and other.cluster == first.cluster
            assert replace(other, case_id="", source="", notes="") == replace(
                first, case_id="", source="", notes=""
            )


# --- unknown options become candidates, stated ones do not


def test_empty_stack_flags_carry_both_values(tmp_path: Path):
    case = _case(
        tmp_path, flash_attention="", overlap_grad_reduce="", overlap_param_gather="", tp_comm_overlap=""
    )
    assert len(case.trainings) == 16 and len(case.plans) == 1
    assert {t.flash_attention for t in case.trainings} == {True, False}
    assert {(t.overlap_grad_reduce, t.overlap_param_gather, t.overlap_tp_comm) for t in case.trainings} == {
        (a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)}
    assert set(case.unknown) == {
        "flash_attention",
        "overlap_grad_reduce",
        "overlap_param_gather",
        "tp_comm_overlap",
    }


def test_empty_precision_carries_every_mixed_precision_the_card_runs(tmp_path: Path):
    assert {t.dtype for t in _case(tmp_path, gpu_type="H100", linear_precision="").trainings} == {
        "bf16", "fp16", "fp8"}
    assert {t.dtype for t in _case(tmp_path, gpu_type="A100", linear_precision="").trainings} == {
        "bf16",
        "fp16",
    }
    v100 = _case(
        tmp_path,
        gpu_type="V100-SXM2-16GB",
        linear_precision="",
        attention_precision="",
        tp="1",
        pp="1",
        dp="64",
    )
    assert {t.dtype for t in v100.trainings} == {"fp16"}  # no bf16 units


def test_empty_framework_carries_every_stack(tmp_path: Path):
    from perfmodels.stacks import STACK_PRESETS

    case = _case(tmp_path, framework="")
    assert {t.stack for t in case.trainings} == set(STACK_PRESETS)
    assert case.framework == "any stack"


def test_empty_zero_stage_and_checkpointing_carry_every_value_the_stack_offers(tmp_path: Path):
    from perfmodels.stacks import preset

    case = _case(tmp_path, zero_stage="", activation_checkpointing="")
    offered = {z for t in case.trainings for z in preset(t.effective_stack.name).zero_stages}
    assert {(p.zero_stage, p.recompute) for p in case.plans} == {
        (z, r) for z in offered for r in ("none", "selective", "full")}


def test_unknown_options_expand_only_to_what_the_stack_can_run(tmp_path: Path):
    """OneFlow GPT (2021) had neither interleaved schedules nor sequence parallelism: empty cells
    for them do not bring those in as candidates."""
    case = _case(tmp_path, framework="oneflow", sequence_parallel="", virtual_pp="", zero_stage="")
    assert case.plans and not any(
        p.sequence_parallel or p.virtual_stages > 1 or p.zero_stage for p in case.plans
    )


def test_empty_layout_columns_expand_only_what_is_missing(tmp_path: Path):
    case = _case(tmp_path, micro_batch_size="", virtual_pp="", sequence_parallel="")
    assert {p.G_intra_r for p in case.plans} == {2} and {p.G_inter for p in case.plans} == {2}
    assert {p.micro_batch_size for p in case.plans} == {1, 2, 4, 8, 16}
    assert {p.sequence_parallel for p in case.plans} == {False, True}
    assert {p.virtual_stages for p in case.plans} == {1, 2, 3, 4, 6, 8}
    assert not case.layout_stated


def test_missing_pipeline_degree_is_enumerated_not_taken_as_one():
    lay = Layout(num_gpus=64, global_batch=512, tp=8, pp=None, dp=None, micro_batch=1, virtual_pp=1,
                 sequence_parallel=False)
    plans = candidate_plans(lay, layers=24, heads=16, recomputes=("full",), zero_stages=(0,), placement=None)
    assert {(p.G_intra_r, p.G_inter, p.G_data) for p in plans} == {(8, 1, 8), (8, 2, 4), (8, 4, 2), (8, 8, 1)}


def test_stated_data_and_tensor_degrees_fix_the_pipeline_degree():
    lay = Layout(num_gpus=64, global_batch=512, tp=4, pp=None, dp=8, micro_batch=1, virtual_pp=1,
                 sequence_parallel=False)
    plans = candidate_plans(lay, layers=24, heads=16, recomputes=("none",), zero_stages=(0,), placement=None)
    assert {(p.G_intra_r, p.G_inter, p.G_data) for p in plans} == {(4, 2, 8)}


def test_context_parallel_row_carries_its_real_cp_degree(tmp_path: Path):
    """cp=4: the plan's G_cp is 4 (perfmodels.context costs the quarter-sequence chunks, the ring and
    the dp-cp gradient group); the model keeps its 8192-token samples and the batch its 64."""
    case = _case(
        tmp_path,
        seq_len="8192",
        cp="4",
        dp="4",
        tp="2",
        pp="2",
        num_gpus="64",
        micro_batch_size="1",
        global_batch_size="64",
    )
    assert (case.model.seq_length, case.model.span) == (8192, 8192)
    assert case.trainings[0].global_batch_size == 64
    assert {(p.G_data, p.G_cp) for p in case.plans} == {(4, 4)}
    assert case.measured_time_s == pytest.approx(2.5)


def test_llama_style_rows_get_swiglu_and_grouped_query_attention(tmp_path: Path):
    """A model convention, not a stack one: from explicit columns first, the family name second."""
    named = _case(tmp_path, model_name="Llama 3 70B", num_layers="80", hidden_size="8192", num_heads="64",
                  ffn_hidden_size="28672", tp="8", pp="4", dp="2", global_batch_size="64")
    assert named.model.gated_mlp and named.model.num_query_groups == 8
    explicit = loader.load([write(tmp_path / "e.csv", {**row(model_name="Llama 3 8B"), "gated_mlp": "false",
                                                       "num_query_groups": "4"})]).cases
    assert not explicit[0].model.gated_mlp and explicit[0].model.num_query_groups == 4


def test_an_oom_row_has_no_measured_time_and_is_flagged(tmp_path: Path):
    case = _case(tmp_path, metric_value="OOM")
    assert case.expect_oom and case.measured_time_s is None


def test_moe_rows_state_the_recompute_of_their_containers_recipe():
    """The 25.11 rows' recompute is the 25.11 container's recipe's (Megatron-Bridge v0.2.0: Qwen3
    recompute_granularity None; GPT-OSS recompute_modules layernorm + moe_act with the granularity left
    None, so nothing recomputed), so every MoE
    row is one candidate, not a median over the stack's recompute options."""
    cases = loader.load_file(loader.DATA_DIR / "published_megatron_bridge_moe.csv").cases
    recomputes = sorted((c.model.num_moe_experts, {p.recompute for p in c.plans}.pop()) for c in cases)
    assert {c.candidate_count for c in cases} == {1}
    assert recomputes == [(128, "none")] * 6 + [(256, "selective")]
    # the 25.09 DeepSeek-V3 H100 recipe (Megatron-Bridge v0.1.0rc3 run_script.py) turned gradient
    # reduction overlap off and ran DeepEP (the flex dispatcher)
    (deepseek,) = [c for c in cases if c.model.num_moe_experts == 256]
    assert [(t.overlap_grad_reduce, t.moe_token_dispatcher) for t in deepseek.trainings] == [(False, "flex")]


def test_the_25_11_moe_rows_read_the_layout_their_recipe_ran():
    """Qwen3-30B-A3B 25.11 H100: the table's MBS 2 / VP 24 / GA 32 repeat the 25.09 tokendrop line; the
    25.11 recipe (Megatron-Bridge v0.2.0 QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG) runs GBS 512, MBS 1,
    PP 2, VP 12, EP 8 on 16 GPUs (DP 8, GA 64), FP8, no recompute. GPT-OSS-120B 25.11 H100: the
    table's MBS 4 / GA 2 contradict GBS 512 at PP 4 on 64 GPUs; the 25.11 recipe (Megatron-Bridge
    v0.2.0 GPT_OSS_120B_H100_BF16_BASE_CONFIG) runs MBS 1, so DP 16 and
    GA 512 / (1 x 16) = 32 (validation/data/README.md)."""
    cases = loader.load_file(loader.DATA_DIR / "published_megatron_bridge_moe.csv").cases
    rows = {c.case_id.split(":")[1]: c for c in cases}
    qwen, oss = rows["6"], rows["8"]
    ((q,), (o,)) = (qwen.plans, oss.plans)
    assert (qwen.model.name, q.G_data, q.G_inter, q.G_intra_r, q.G_ep, q.G_etp, q.micro_batch_size,
            q.virtual_stages, q.schedule, q.recompute, q.zero_stage) == (
        "Qwen3-30B-A3B", 8, 2, 1, 8, 1, 1, 12, "interleaved-1f1b", "none", 1)
    assert {(t.dtype, t.global_batch_size) for t in qwen.trainings} == {("fp8", 512)}
    assert (oss.model.name, o.G_data, o.G_inter, o.G_intra_r, o.G_ep, o.G_etp, o.micro_batch_size,
            o.virtual_stages, o.recompute, o.zero_stage) == ("GPT-OSS-120B", 16, 4, 1, 8, 1, 1, 1, "none", 1)
    assert {(t.dtype, t.global_batch_size) for t in oss.trainings} == {("bf16", 512)}


def test_a_cuda_graph_scope_column_states_what_the_run_replayed_from_graphs(tmp_path):
    """`cuda_graph_scope` (space-separated Megatron scope names) sets `Training.cuda_graph_scope`;
    rows without it run eager."""
    import csv

    source = loader.DATA_DIR / "published_megatron_bridge_moe.csv"
    with source.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rows[3]["cuda_graph_scope"] = "attn moe_router moe_preprocess"
    path = tmp_path / "graphs.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*rows[0].keys(), "cuda_graph_scope"])
        writer.writeheader()
        writer.writerows(rows)
    cases = loader.load_file(path).cases
    scopes = [{t.cuda_graph_scope for t in c.trainings} for c in cases]
    assert scopes[3] == {("attn", "moe_router", "moe_preprocess")}
    assert all(s == {()} for i, s in enumerate(scopes) if i != 3)
