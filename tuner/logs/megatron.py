"""Megatron-LM (and Megatron-DeepSpeed, NeMo) logs: the argument dump and the iteration lines.

`megatron/training.py` (`_print_args` at start-up; `training_log` every `--log-interval` steps) writes

    ------------------------ arguments ------------------------
      num_layers ...................................... 24
    ...
     iteration      100/    5000 | consumed samples: 800 | elapsed time per iteration (ms): 296.8 | ...
    [Rank 0] (after 100 iterations) memory (MB) | allocated: ... | max allocated: ... | max reserved: 8786.0

(Megatron-LM 992da75, as in tests/data/logs/megatron_gpt345m_*.log). Newer versions print the
elapsed time as `current/average`, and NeMo's Lightning loop logs `train_step_timing in s`; both are
read. The model, batch, precision and layout come from the arguments; the stack is megatron-core
when the log says Transformer Engine or Megatron-Core models, megatron-lm otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from tuner.logs.common import dotted_values, lines, median_after_warmup, number

ITERATION_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([\d.,]+)")
NEMO_STEP_S = re.compile(r"train_step_timing in s[=:]\s*([\d.]+)")
MAX_RESERVED_MB = re.compile(r"max reserved:\s*([\d.]+)")
PADDED_VOCAB = re.compile(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")
WORLD = re.compile(r"using world size: (\d+), data-parallel-size: (\d+), tensor-model-parallel size: (\d+), "
                   r"pipeline-model-parallel size: (\d+)")


def matches(text: str) -> bool:
    return bool(ITERATION_MS.search(text) or NEMO_STEP_S.search(text))


def _int(args: dict[str, str], name: str) -> int | None:
    value = args.get(name)
    if value is None or value in ("None", ""):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _true(args: dict[str, str], name: str) -> bool:
    return args.get(name, "False") == "True"


def parse(text: str, *, config: object = None) -> dict[str, Any]:
    body = lines(text)
    args = dotted_values(body)
    times = [number(m.group(1)) / 1000.0 for line in body if (m := ITERATION_MS.search(line))]
    times += [float(m.group(1)) for line in body if (m := NEMO_STEP_S.search(line))]
    out: dict[str, Any] = {"iteration_time_s": median_after_warmup(times), "source": "megatron"}
    reserved = [float(m.group(1)) for line in body if (m := MAX_RESERVED_MB.search(line))]
    if reserved:
        out["peak_memory_gib"] = max(reserved) / 1024.0
    vocab = next((int(m.group(1)) for line in body if (m := PADDED_VOCAB.search(line))), None)
    vocab = vocab or _int(args, "padded_vocab_size") or _int(args, "vocab_size")
    shape = {k: _int(args, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length")}
    if all(shape.values()) and vocab:
        model: dict[str, Any] = {**shape, "vocab_size": vocab}
        if _int(args, "ffn_hidden_size"):
            model["ffn_hidden_size"] = _int(args, "ffn_hidden_size")
        if _true(args, "group_query_attention") and _int(args, "num_query_groups"):
            model["num_query_groups"] = _int(args, "num_query_groups")
        if _true(args, "swiglu"):
            model["gated_mlp"] = True
        model["tied_embeddings"] = not _true(args, "untie_embeddings_and_output_weights")
        out["model"] = model
    training: dict[str, Any] = {}
    if _int(args, "global_batch_size"):
        training["global_batch_size"] = _int(args, "global_batch_size")
    training["dtype"] = "bf16" if _true(args, "bf16") else "fp16" if _true(args, "fp16") else "fp32"
    mcore = _true(args, "use_mcore_models") or args.get("transformer_impl") == "transformer_engine"
    training["stack"] = "megatron-core" if mcore else "megatron-lm"
    if "use_flash_attn" in args:
        training["flash_attention"] = _true(args, "use_flash_attn") or mcore
    if "overlap_grad_reduce" in args:
        training["overlap_grad_reduce"] = _true(args, "overlap_grad_reduce")
    out["training"] = training
    world = next((m for line in body if (m := WORLD.search(line))), None)
    plan: dict[str, Any] = {
        "G_data": _int(args, "data_parallel_size") or (int(world.group(2)) if world else None),
        "G_inter": _int(args, "pipeline_model_parallel_size") or (int(world.group(4)) if world else 1),
        "G_intra_r": _int(args, "tensor_model_parallel_size") or (int(world.group(3)) if world else 1),
        "micro_batch_size": _int(args, "micro_batch_size") or 1,
    }
    if plan["G_data"] is None:
        plan.pop("G_data")
    vpp = _int(args, "virtual_pipeline_model_parallel_size")
    if vpp and vpp > 1:
        plan.update(schedule="interleaved-1f1b", virtual_stages=vpp)
    if _true(args, "sequence_parallel"):
        plan["sequence_parallel"] = True
    granularity = args.get("recompute_granularity")
    if granularity in ("full", "selective"):
        plan["recompute"] = granularity
    elif _true(args, "checkpoint_activations"):
        plan["recompute"] = "full"
    if _true(args, "use_distributed_optimizer"):
        plan["zero_stage"] = 1
    out["plan"] = plan
    return out
