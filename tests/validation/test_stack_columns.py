"""The loader reads every stack column, and only the stack columns, into the case's Training and Plan."""

from pathlib import Path

import pytest

from validation import loader

from .rows import row, write


def _case(tmp_path: Path, **changes: str):
    loaded = loader.load([write(tmp_path / "r.csv", row(**changes))])
    assert not loaded.skipped, loaded.skipped
    (case,) = loaded.cases
    return case


def _one(case):
    assert case.candidate_count == 1, (case.unknown, case.candidate_count)
    return case.trainings[0], case.plans[0]


def test_a_fully_stated_row_is_one_candidate(tmp_path: Path):
    training, plan = _one(_case(tmp_path))
    assert (plan.G_intra_r, plan.G_inter, plan.G_data, plan.micro_batch_size) == (2, 2, 16, 4)
    assert training.global_batch_size == 512


@pytest.mark.parametrize("framework, stack", [
    ("megatron-lm", "megatron-lm"), ("megatron-core", "megatron-core"), ("nemo", "nemo"),
    ("megatron-deepspeed", "megatron-deepspeed"), ("deepspeed", "deepspeed"), ("fsdp", "fsdp"),
    ("torchtitan", "torchtitan"), ("oneflow", "oneflow"), ("axonn", "gridtune"), ("other", "gridtune"),
])
def test_framework_column_picks_the_stack_preset(tmp_path: Path, framework, stack):
    training, plan = _one(_case(tmp_path, framework=framework))
    assert training.stack == stack
    megatron_order = ("col", "row", "depth", "data", "inter")
    ordered = framework in (
        "megatron-lm",
        "megatron-core",
        "nemo",
        "megatron-deepspeed",
        "deepspeed",
        "torchtitan",
    )
    assert (plan.placement == megatron_order) == ordered


def test_unknown_framework_is_skipped_with_the_known_names(tmp_path: Path):
    loaded = loader.load([write(tmp_path / "r.csv", row(framework="jax-thing"))])
    assert "framework='jax-thing'" in loaded.skipped[0].reason and "megatron-core" in loaded.skipped[0].reason


@pytest.mark.parametrize("zero", ["0", "1", "2", "3"])
def test_zero_stage_column(tmp_path: Path, zero):
    _, plan = _one(_case(tmp_path, zero_stage=zero))
    assert plan.zero_stage == int(zero)


@pytest.mark.parametrize("text, recompute", [("none", "none"), ("selective", "selective"), ("full", "full"),
                                             ("selective-op", "selective")])
def test_activation_checkpointing_column(tmp_path: Path, text, recompute):
    framework = "torchtitan" if text == "selective-op" else "megatron-core"
    _, plan = _one(_case(tmp_path, activation_checkpointing=text, framework=framework))
    assert plan.recompute == recompute


def test_partial_checkpointing_is_skipped_with_a_reason(tmp_path: Path):
    loaded = loader.load([write(tmp_path / "r.csv", row(activation_checkpointing="partial"))])
    assert not loaded.cases and "partial" in loaded.skipped[0].reason


def test_checkpointing_and_recompute_columns_must_agree(tmp_path: Path):
    loaded = loader.load([write(tmp_path / "r.csv", row(activation_checkpointing="full", recompute="none"),
                                row(activation_checkpointing="", recompute="full"))])
    assert "disagree" in loaded.skipped[0].reason
    assert loaded.cases[0].plans[0].recompute == "full"  # the layout column when it is the only one


@pytest.mark.parametrize("flash", ["true", "false"])
def test_flash_attention_column(tmp_path: Path, flash):
    training, _ = _one(_case(tmp_path, flash_attention=flash))
    assert training.flash_attention is (flash == "true")


@pytest.mark.parametrize("linear, attention, dtype, attention_dtype", [
    ("bf16", "bf16", "bf16", "bf16"), ("fp16", "fp16", "fp16", "fp16"), ("fp8", "bf16", "fp8", "bf16"),
    ("float8", "", "fp8", None), ("fp32", "fp32", "fp32", "fp32"),
])
def test_precision_columns(tmp_path: Path, linear, attention, dtype, attention_dtype):
    training, _ = _one(
        _case(tmp_path, gpu_type="H100", linear_precision=linear, attention_precision=attention)
    )
    assert (training.dtype, training.attention_dtype) == (dtype, attention_dtype)


def test_precision_column_is_read_when_linear_precision_is_empty(tmp_path: Path):
    training, _ = _one(_case(tmp_path, linear_precision="", precision="amp_bf16"))
    assert training.dtype == "bf16"


@pytest.mark.parametrize("column, field", [("overlap_grad_reduce", "overlap_grad_reduce"),
                                           ("overlap_param_gather", "overlap_param_gather"),
                                           ("tp_comm_overlap", "overlap_tp_comm")])
@pytest.mark.parametrize("value", ["true", "false"])
def test_overlap_columns_override_the_stack(tmp_path: Path, column, field, value):
    training, _ = _one(_case(tmp_path, **{column: value}))
    assert getattr(training, field) is (value == "true")
    assert getattr(training.effective_stack, field) is (value == "true")


def test_a_bad_flag_value_is_skipped_naming_the_column(tmp_path: Path):
    loaded = loader.load([write(tmp_path / "r.csv", row(tp_comm_overlap="maybe"))])
    assert "tp_comm_overlap='maybe'" in loaded.skipped[0].reason


@pytest.mark.parametrize("value", ["none", "blocks", "blocks+loss"])
def test_torch_compile_column_sets_what_the_compiler_covers(tmp_path: Path, value):
    training, _ = _one(_case(tmp_path, framework="torchtitan", torch_compile=value))
    assert training.effective_stack.torch_compile == value


def test_an_absent_torch_compile_column_keeps_the_stack_default_and_a_bad_one_is_skipped(tmp_path: Path):
    training, _ = _one(_case(tmp_path, framework="torchtitan"))
    assert training.effective_stack.torch_compile == "none"
    loaded = loader.load([write(tmp_path / "r.csv", row(torch_compile="inductor"))])
    assert "torch_compile='inductor'" in loaded.skipped[0].reason


def test_gpu_memory_column_sets_the_card_and_peak_memory_the_measurement(tmp_path: Path):
    case = _case(tmp_path, gpu_type="H100", gpu_memory_gb="96", peak_memory_gib="61.5")
    assert case.cluster.gpu.memory_gib == 96.0 and not case.card_memory.assumed
    assert case.measured_memory_gib == 61.5
    forty = _case(tmp_path, gpu_type="A100", gpu_memory_gb="40")
    assert (forty.cluster.gpu.name, forty.cluster.gpu.memory_gib) == ("A100-40GB", 40.0)


def test_unstated_card_memory_takes_the_largest_card_and_says_so(tmp_path: Path):
    case = _case(tmp_path, gpu_type="A100", gpu_memory_gb="")
    assert case.cluster.gpu.memory_gib == 80.0
    assert "not stated" in case.card_memory.assumed


def test_sequence_parallel_virtual_stages_and_micro_batch_columns(tmp_path: Path):
    _, plan = _one(_case(tmp_path, sequence_parallel="true", virtual_pp="3", micro_batch_size="2"))
    assert (plan.sequence_parallel, plan.virtual_stages, plan.schedule, plan.micro_batch_size) == (
        True, 3, "interleaved-1f1b", 2)


@pytest.mark.parametrize("framework, value", [("torchtitan", "pre-hopper"), ("torchtitan", "native"),
                                              ("fsdp", "native")])
def test_flash_kernel_column_states_the_attention_kernel(tmp_path: Path, framework, value):
    training, _ = _one(_case(tmp_path, framework=framework, flash_kernel=value))
    assert training.effective_stack.flash_kernel == value


def test_an_absent_flash_kernel_column_keeps_the_stack_default_and_a_bad_one_is_skipped(tmp_path: Path):
    assert _one(_case(tmp_path, framework="torchtitan"))[0].effective_stack.flash_kernel == "native"
    assert _one(_case(tmp_path, framework="fsdp"))[0].effective_stack.flash_kernel == "pre-hopper"
    loaded = loader.load([write(tmp_path / "r.csv", row(flash_kernel="fa3"))])
    assert "flash_kernel='fa3'" in loaded.skipped[0].reason
