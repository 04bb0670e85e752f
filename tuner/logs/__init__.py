"""Training logs as calibration runs: Megatron-LM / NeMo, torchtitan and DeepSpeed.

`parse_log(path)` reads one log and returns the run objects `POST /v1/calibrations` takes
(`{"model", "training", "plan", "iteration_time_s", "peak_memory_gib"?}`), with what the log does not
state taken from `defaults` (the CLI's `--model`, `--global-batch-size`). The format is told by the
lines the framework prints; each parser lives in its own module and names, in its docstring, the
framework source that writes those lines:

- `megatron`: the argument dump (`------------------------ arguments ------------------------`,
  `name ....... value`) and the `elapsed time per iteration (ms)` lines of `megatron/training.py`;
- `torchtitan`: `Building <model> <flavor> with ...Args(...)`, the device mesh, `Training starts ...`
  and the `step: ... memory: ...GiB ... tps: ...` metrics lines; its job TOML (`config=`) fills the rest;
- `deepspeed`: the engine's configuration dump (`[config.py:N:print]  name ..... value`) and the
  throughput timer (`SamplesPerSec=`, `MaxMemAllocated=`).

The median over logged steps after the first (warm-up) is the measured step time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.logs import deepspeed, megatron, torchtitan

PARSERS = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed}


def detect(text: str) -> str:
    """Which framework wrote `text` (ValueError when none of the known formats matches)."""
    for name, module in PARSERS.items():
        if module.matches(text):
            return name
    raise ValueError("not a Megatron-LM/NeMo, torchtitan or DeepSpeed training log (no step-time lines "
                     "found: 'elapsed time per iteration (ms)', 'train_step_timing', 'tps:', "
                     "'SamplesPerSec=')")


def parse_log(path: str | Path, *, config: str | Path | None = None,
              defaults: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The run(s) a training log describes; ValueError names the file and what it lacks."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise ValueError(f"--log {str(path)!r}: {exc.strerror or exc}") from None
    try:
        kind = detect(text)
        run = PARSERS[kind].parse(text, config=config)
        return [complete(run, defaults or {}, kind)]
    except ValueError as exc:
        raise ValueError(f"--log {path.name}: {exc}") from None


def complete(run: dict[str, Any], defaults: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Fill what the log left out from `defaults`; say what is still missing."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in run.items()}
    if not out.get("model") and defaults.get("model"):
        out["model"] = dict(defaults["model"])
    training = out.setdefault("training", {})
    if "global_batch_size" not in training and defaults.get("global_batch_size"):
        training["global_batch_size"] = int(defaults["global_batch_size"])
    if "iteration_time_s" not in out and "samples_per_s" in out:
        if "global_batch_size" not in training:
            raise ValueError(f"the {kind} log gives samples/s but not the global batch size: pass "
                             "--global-batch-size")
        out["iteration_time_s"] = training["global_batch_size"] / out["samples_per_s"]
    out.pop("samples_per_s", None)
    plan = out.get("plan", {})
    if "G_data" not in plan and "data_parallel_from_batch" in out:
        micro, accum = out.pop("data_parallel_from_batch")
        plan["G_data"] = max(1, training["global_batch_size"] // (micro * accum))
    out.pop("data_parallel_from_batch", None)
    missing = [k for k in ("model", "iteration_time_s") if not out.get(k)]
    if "global_batch_size" not in training:
        missing.append("global batch size")
    if missing:
        hint = {"model": "--model PRESET or --model-file", "global batch size": "--global-batch-size"}
        raise ValueError(f"the {kind} log does not state {', '.join(missing)}; pass "
                         + ", ".join(hint.get(m, m) for m in missing))
    return out
