"""DeepSpeed engine logs: the configuration dump and the throughput timer.

`deepspeed/runtime/config.py` (`DeepSpeedConfig.print`) lists the configuration at start-up,

    [INFO] [config.py:957:print]   gradient_accumulation_steps .. 2

and the engine's `ThroughputTimer` (`deepspeed/utils/timer.py`, created with the engine's
`train_batch_size`) logs every `steps_per_print` steps

    [INFO] [timer.py:189:stop] 0/40, SamplesPerSec=83.48, MemAllocated=0.26GB, MaxMemAllocated=9.02GB

(newer versions: `RunningAvgSamplesPerSec=..., CurrSamplesPerSec=...`), so a step takes
train_batch_size / samples per second. The model is the user's own code, so it comes from the caller
(`--model`); the batch from `train_batch_size` when the dump shows it, else from `--global-batch-size`;
data parallelism from train_batch_size / (micro-batch x accumulation). Memory sizes are GiB (the timer
divides bytes by 1024^3).
"""

from __future__ import annotations

import re
from typing import Any

from tuner.logs.common import dotted_values, lines, median_after_warmup

SAMPLES = re.compile(r"(?:CurrSamplesPerSec|(?<![A-Za-z])SamplesPerSec)=([\d.]+)")
MAX_MEM = re.compile(r"MaxMemAllocated=([\d.]+)GB")
STAGE = re.compile(r"\bstage=(\d)")


def matches(text: str) -> bool:
    return bool(SAMPLES.search(text))


def parse(text: str, *, config: object = None) -> dict[str, Any]:
    body = lines(text)
    args = dotted_values([line for line in body if "config.py" in line and ":print]" in line])
    rates = [float(m.group(1)) for line in body if (m := SAMPLES.search(line))]
    out: dict[str, Any] = {"source": "deepspeed", "samples_per_s": median_after_warmup(rates)}
    peaks = [float(m.group(1)) for line in body if (m := MAX_MEM.search(line))]
    if peaks:
        out["peak_memory_gib"] = max(peaks)
    training: dict[str, Any] = {"stack": "deepspeed"}
    if args.get("train_batch_size", "").isdigit():
        training["global_batch_size"] = int(args["train_batch_size"])
    if args.get("bfloat16_enabled") == "True":
        training["dtype"] = "bf16"
    elif args.get("fp16_enabled") == "True":
        training["dtype"] = "fp16"
    elif "fp16_enabled" in args or "bfloat16_enabled" in args:
        training["dtype"] = "fp32"
    out["training"] = training
    plan: dict[str, Any] = {}
    micro = args.get("train_micro_batch_size_per_gpu", "")
    accum = args.get("gradient_accumulation_steps", "")
    if micro.isdigit():
        plan["micro_batch_size"] = int(micro)
        out["data_parallel_from_batch"] = (int(micro), int(accum) if accum.isdigit() else 1)
    stage = STAGE.search(args.get("zero_config", ""))
    if stage:
        plan["zero_stage"] = int(stage.group(1))
    out["plan"] = plan
    return out
