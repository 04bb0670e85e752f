"""The software stack of a published run, read only from the row's explicit stack columns.

Every value comes from a column (`framework`, `zero_stage`, `activation_checkpointing`,
`flash_attention`, `linear_precision`, `attention_precision`, `overlap_grad_reduce`,
`overlap_param_gather`, `tp_comm_overlap`; see validation/data/README.md). Nothing is inferred
from the source's name, its year, a paper id or the notes: a run of an unfamiliar stack, or one
made in another year, is read the same way. An empty cell is unknown and stays unknown: the
option keeps every value the run could have had, and scoring reports the median over them and
their spread (see `validation.scoring`).

Run the tests: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/validation/test_stack_columns.py`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from perfmodels.specs import GPU, Training
from perfmodels.stacks import FLASH_KERNEL_VALUES, TORCH_COMPILE_VALUES

FRAMEWORK_STACKS: dict[str, str] = {
    "megatron-lm": "megatron-lm",
    "megatron-core": "megatron-core",
    "nemo": "nemo",  # Megatron-Core underneath, with NeMo's bf16 gradient buffers
    "megatron-deepspeed": "megatron-deepspeed",
    "deepspeed": "deepspeed",
    "fsdp": "fsdp",
    "torchtitan": "torchtitan",
    "oneflow": "oneflow",
    # no preset of their own: our engine's stack, with the row's explicit flags on top
    "axonn": "gridtune",
    "other": "gridtune",
}
"""`framework` column value -> `perfmodels.stacks` preset name."""

MEGATRON_ORDER = ("col", "row", "depth", "data", "inter")
"""Rank order of Megatron-LM, DeepSpeed and torchtitan's device mesh: tensor innermost, then data,
pipeline outermost."""

RANK_ORDER: dict[str, tuple[str, ...] | None] = {
    "megatron-lm": MEGATRON_ORDER, "megatron-core": MEGATRON_ORDER, "nemo": MEGATRON_ORDER,
    "megatron-deepspeed": MEGATRON_ORDER, "deepspeed": MEGATRON_ORDER, "torchtitan": MEGATRON_ORDER,
}
"""Placement each framework gives the grid axes; others keep the model's default order."""

RECOMPUTE_VALUES: dict[str, str] = {"none": "none", "selective": "selective", "full": "full",
                                    # torchtitan's per-op selective: the stack says what it keeps
                                    "selective-op": "selective"}

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def parse_bool(column: str, text: str | None) -> bool | None:
    """true/false (or yes/no, 1/0); None for an empty cell; ValueError naming the column otherwise."""
    t = (text or "").strip().lower()
    if not t:
        return None
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(f"{column}={text!r} is not true/false")


def parse_dtype(column: str, text: str | None) -> str | None:
    """bf16/fp16/fp8/fp32 from a precision cell ('amp_bf16', 'fp16 mixed', 'float8' included)."""
    t = (text or "").strip().lower()
    if not t:
        return None
    for key, dtype in (("fp8", "fp8"), ("float8", "fp8"), ("bf16", "bf16"), ("bfloat16", "bf16"),
                       ("fp16", "fp16"), ("float16", "fp16"), ("fp32", "fp32"), ("float32", "fp32")):
        if key in t:
            return dtype
    raise ValueError(f"{column}={text!r} is not one of bf16, fp16, fp8, fp32")


def parse_choice(column: str, text: str | None, values: tuple[str, ...]) -> str | None:
    """One of `values` (case-insensitive) from an optional column; None for an empty cell (the stack's
    default); ValueError naming the column and the value otherwise."""
    t = (text or "").strip().lower()
    if not t:
        return None
    if t not in values:
        raise ValueError(f"{column}={t!r} is not one of {list(values)}")
    return t


def half_dtypes(gpu: GPU) -> tuple[str, ...]:
    """Mixed-precision dtypes the card runs at more than its fp32 rate: the candidates of a run whose
    precision is not stated."""
    out = ["bf16"] if gpu.peak_tflops_bf16 > gpu.peak_tflops_fp32 else []
    out.append("fp16")
    if gpu.peak_tflops_fp8 > 0:
        out.append("fp8")
    return tuple(out)


def _both(value: bool | None) -> tuple[bool, ...]:
    return (False, True) if value is None else (value,)


@dataclass(frozen=True, kw_only=True)
class StackOptions:
    """What a row says about its stack; each tuple holds one value when stated, every value when not."""

    framework: str
    stacks: tuple[str, ...]
    zero_stages: tuple[int, ...]
    recomputes: tuple[str, ...]
    recompute_full_stated: bool
    """The row itself says every layer was checkpointed (Megatron's TFLOP/s then count it)."""
    flash_attention: tuple[bool, ...]
    dtypes: tuple[str, ...]
    attention_dtype: str | None
    overlap_grad_reduce: tuple[bool, ...]
    overlap_param_gather: tuple[bool, ...]
    overlap_tp_comm: tuple[bool, ...]
    placement: tuple[str, ...] | None
    unknown: tuple[str, ...]
    """Columns left empty (their options hold every value)."""
    torch_compile: str | None = None
    """What torch.compile covered ('none', 'blocks', 'blocks+loss'); None: the stack's default. An
    optional column: the shared files do not carry it, and a run that leaves it out is scored as its
    stack runs by default (eager for every preset), not as a median over compile options."""
    flash_kernel: str | None = None
    """Which fused attention kernel ran ('native' to the GPU, or 'pre-hopper': FlashAttention-2 or
    an Ampere-era Triton kernel); None: the stack's default. Optional like `torch_compile`: what a
    stack's attention runs on depends on its version (see `perfmodels.stacks.Stack.flash_kernel`), so
    a file states it where the run's versions document it."""

    def trainings(self, global_batch_size: int) -> tuple[Training, ...]:
        """Every Training the run could have used: the product of the training options."""
        out = []
        for stack, dtype, flash, ogr, opg, otp in itertools.product(
                self.stacks, self.dtypes, self.flash_attention, self.overlap_grad_reduce,
                self.overlap_param_gather, self.overlap_tp_comm):
            out.append(Training(global_batch_size=global_batch_size, dtype=dtype, stack=stack,  # type: ignore[arg-type]
                                attention_dtype=self.attention_dtype, flash_attention=flash,
                                overlap_grad_reduce=ogr, overlap_param_gather=opg, overlap_tp_comm=otp,
                                torch_compile=self.torch_compile,  # type: ignore[arg-type]
                                flash_kernel=self.flash_kernel))  # type: ignore[arg-type]
        return tuple(out)


def _all_stacks() -> tuple[str, ...]:
    from perfmodels.stacks import STACK_PRESETS

    return tuple(STACK_PRESETS)


def read_stack(row: Mapping[str, str], gpu: GPU) -> StackOptions:
    """StackOptions from one row's stack columns (ValueError naming the column for a bad value)."""

    def cell(name: str) -> str:
        return (row.get(name) or "").strip()

    unknown: list[str] = []
    framework = cell("framework").lower()
    if framework:
        if framework not in FRAMEWORK_STACKS:
            raise ValueError(f"framework={framework!r} is not one of {sorted(FRAMEWORK_STACKS)}")
        stacks: tuple[str, ...] = (FRAMEWORK_STACKS[framework],)
    else:
        unknown.append("framework")
        stacks = _all_stacks()

    zero_text = cell("zero_stage")
    if zero_text:
        if zero_text not in ("0", "1", "2", "3"):
            raise ValueError(f"zero_stage={zero_text!r} is not 0, 1, 2 or 3")
        zeros: tuple[int, ...] = (int(zero_text),)
    else:
        unknown.append("zero_stage")
        zeros = (0, 1, 2, 3)

    ac = cell("activation_checkpointing").lower()
    layout_rc = cell("recompute").lower()  # the layout column of the same fact, older files only
    if ac == "partial":
        raise ValueError("activation_checkpointing='partial' (some layers) is not a plan option yet")
    if ac and ac not in RECOMPUTE_VALUES:
        raise ValueError(f"activation_checkpointing={ac!r} is not one of {[*RECOMPUTE_VALUES, 'partial']}")
    if layout_rc and layout_rc not in ("none", "selective", "full"):
        raise ValueError(f"recompute={layout_rc!r} is not none, selective or full")
    if ac and layout_rc and RECOMPUTE_VALUES[ac] != layout_rc:
        raise ValueError(f"activation_checkpointing={ac!r} and recompute={layout_rc!r} disagree")
    stated_rc = ac or layout_rc
    if stated_rc:
        recomputes: tuple[str, ...] = (RECOMPUTE_VALUES[stated_rc],)
    else:
        unknown.append("activation_checkpointing")
        recomputes = ("none", "selective", "full")

    linear = parse_dtype("linear_precision", cell("linear_precision")) or parse_dtype(
        "precision", cell("precision")
    )
    if linear is None:
        unknown.append("linear_precision")
    dtypes = (linear,) if linear else half_dtypes(gpu)
    attention = parse_dtype("attention_precision", cell("attention_precision"))

    flags = {}
    for column in ("flash_attention", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap"):
        value = parse_bool(column, cell(column))
        if value is None:
            unknown.append(column)
        flags[column] = _both(value)

    return StackOptions(
        torch_compile=parse_choice("torch_compile", cell("torch_compile"), TORCH_COMPILE_VALUES),
        flash_kernel=parse_choice("flash_kernel", cell("flash_kernel"), FLASH_KERNEL_VALUES),
        framework=framework, stacks=stacks, zero_stages=zeros, recomputes=recomputes,
        recompute_full_stated=stated_rc == "full", flash_attention=flags["flash_attention"], dtypes=dtypes,
        attention_dtype=attention, overlap_grad_reduce=flags["overlap_grad_reduce"],
        overlap_param_gather=flags["overlap_param_gather"], overlap_tp_comm=flags["tp_comm_overlap"],
        placement=RANK_ORDER.get(framework), unknown=tuple(unknown))
