"""torchtitan logs: the metrics lines, the model and mesh lines, and the job's TOML configuration.

torchtitan (`torchtitan/train.py`, `torchtitan/components/metrics.py`) logs

    Building llama3 8B with ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ...)
    Building 1-D device mesh with ['dp_shard'], [8]
    Training starts at step 1, with local batch size 1, global batch size 8, sequence length 8192, ...
    step: 10  loss:  9.8821  memory: 49.59GiB(35.46%)  tps: 7,026  mfu: 41.15%

where `tps` is tokens per second per GPU (the tokens of a data-parallel rank over the step time and
the ranks that share them), so a step takes global batch x sequence / (tps x GPUs). Lines a log lacks
come from the job TOML (`config=`: `[training]` `local_batch_size`/`batch_size`, `seq_len`;
`[parallelism]` degrees; `[activation_checkpoint]` `mode`) and the `--section.key value` overrides of
the `run_train.sh` command line when the log shows it (`NGPU=` gives the GPU count). The model comes
from the `Building ... with ...Args(...)` line (Llama formula for the FFN width), else from the preset
named `<model>-<flavor>` (llama3 + 8B -> llama3-8b) when one exists.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Any

import tomllib

from tuner.logs.common import lines, median_after_warmup, number

STEP = re.compile(r"step:\s*(\d+)\s.*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+)")
RANK = re.compile(r"\[rank(\d+)\]")
BUILD = re.compile(r"Building (\w+) (\S+) with \w*Args\((.*)\)")
MESH = re.compile(r"Building \d+-D device mesh with \[(.*?)\], \[(.*?)\]")
STARTS = re.compile(r"local batch size (\d+), global batch size (\d+), sequence length (\d+)")
NGPU = re.compile(r"\bNGPU=(\d+)")


def matches(text: str) -> bool:
    return bool(STEP.search(text))


def _kv(args: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip("'\"") for m in re.finditer(r"(\w+)=([^,()]+)", args)}


def _llama_ffn(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """torchtitan's Llama FeedForward width: 2/3 of 4 x dim, times the multiplier, rounded up."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * math.ceil(hidden / multiple_of)


def _model_from_args(args: dict[str, str], seq_len: int | None) -> dict[str, Any]:
    dim, heads = int(args["dim"]), int(args["n_heads"])
    kv = args.get("n_kv_heads")
    mult = args.get("ffn_dim_multiplier")
    return {
        "num_layers": int(args["n_layers"]), "hidden_size": dim, "num_attention_heads": heads,
        "num_query_groups": int(kv) if kv and kv != "None" else heads,
        "ffn_hidden_size": _llama_ffn(dim, int(args.get("multiple_of", 256)),
                                      float(mult) if mult and mult != "None" else None),
        "vocab_size": int(args["vocab_size"]), "seq_length": int(seq_len or args.get("max_seq_len", 2048)),
        "gated_mlp": True, "dropout": False, "tied_embeddings": False,
    }


def _overrides(body: list[str]) -> tuple[dict[str, str], int | None]:
    """`--section.key value` of the run_train.sh command line, and its NGPU."""
    for line in body:
        if "run_train.sh" in line or "torchtitan/train.py" in line:
            ngpu = NGPU.search(line)
            words = shlex.split(line)
            over = {}
            for i, w in enumerate(words):
                if w.startswith("--") and "." in w and i + 1 < len(words):
                    key, _, val = w[2:].partition("=")
                    over[key] = val or words[i + 1]
            return over, int(ngpu.group(1)) if ngpu else None
    return {}, None


def _toml(config: str | Path | None) -> dict[str, Any]:
    if config is None:
        return {}
    try:
        return tomllib.loads(Path(config).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"torchtitan config {str(config)!r}: {exc}") from None


def parse(text: str, *, config: str | Path | None = None) -> dict[str, Any]:
    body = lines(text)
    cfg = _toml(config)
    over, ngpu = _overrides(body)

    def setting(section: str, key: str, default: Any = None) -> Any:
        if f"{section}.{key}" in over:
            return over[f"{section}.{key}"]
        return cfg.get(section, {}).get(key, default)

    steps: dict[int, list[tuple[int, float, float]]] = {}
    for line in body:
        m = STEP.search(line)
        if m:
            rank = RANK.search(line)
            steps.setdefault(int(rank.group(1)) if rank else 0, []).append(
                (int(m.group(1)), float(m.group(2)), number(m.group(3))))
    # one rank's lines, in step order: the rank the log shows most steps of (the lowest on a tie)
    rows = sorted(steps[max(steps, key=lambda r: (len(steps[r]), -r))])
    tps = median_after_warmup([r[2] for r in rows])
    out: dict[str, Any] = {"source": "torchtitan", "peak_memory_gib": max(r[1] for r in rows)}

    starts = next((m for line in body if (m := STARTS.search(line))), None)
    seq = int(starts.group(3)) if starts else setting("training", "seq_len")
    local = int(starts.group(1)) if starts else setting(
        "training", "local_batch_size", setting("training", "batch_size"))
    mesh = next((m for line in body if (m := MESH.search(line))), None)
    degrees: dict[str, int] = {}
    if mesh:
        names = [n.strip(" '\"") for n in mesh.group(1).split(",")]
        degrees = dict(zip(names, (int(x) for x in mesh.group(2).split(",")), strict=True))
        world = math.prod(degrees.values())
    else:
        world = ngpu or 0
        for key, name in (("tensor_parallel_degree", "tp"), ("pipeline_parallel_degree", "pp"),
                          ("context_parallel_degree", "cp"),
                          ("data_parallel_replicate_degree", "dp_replicate")):
            degrees[name] = int(setting("parallelism", key, 1) or 1)
        shard = int(setting("parallelism", "data_parallel_shard_degree", -1) or -1)
        if shard == -1 and world:
            shard = world // math.prod(degrees.values())
        degrees["dp_shard"] = shard
    if not world:
        raise ValueError("the torchtitan log names no device mesh and no NGPU: give the GPU count")
    tp, pp, cp = (degrees.get(k, 1) for k in ("tp", "pp", "cp"))
    dp = world // (tp * pp * cp)
    if seq is None or local is None:
        raise ValueError("the torchtitan log and config give no batch size and sequence length: pass the "
                         "job TOML (--log-config)")
    seq, local = int(seq), int(local)
    global_batch = int(starts.group(2)) if starts else local * degrees.get("dp_shard", 1) * degrees.get(
        "dp_replicate", 1)
    out["iteration_time_s"] = global_batch * seq / (tps * world)

    build = next((m for line in body if (m := BUILD.search(line))), None)
    if build:
        out["model"] = _model_from_args(_kv(build.group(3)), seq)
    else:
        name = setting("model", "name")
        flavor = str(setting("model", "flavor", "")).split("_")[0]
        from perfmodels import presets

        preset = f"{name}-{flavor}".lower()
        if name and preset in presets.model_names():
            # context parallelism: each rank holds 1/cp of every sequence (as the validation loader)
            out["model"] = {"preset": preset, "seq_length": seq // cp, "attention_span": seq}
    mode = str(setting("activation_checkpoint", "mode", "none"))
    compile_on = setting("training", "compile", setting("compile", "enable", False))
    out["training"] = {"global_batch_size": global_batch * cp, "dtype": "bf16", "stack": "torchtitan",
                       **({"torch_compile": "blocks"} if str(compile_on).lower() == "true" else {})}
    shard = degrees.get("dp_shard", 1)
    out["plan"] = {"G_data": dp * cp, "G_inter": pp, "G_intra_r": tp, "micro_batch_size": local,
                   "recompute": {"full": "full", "selective": "selective"}.get(mode, "none"),
                   "zero_stage": 3 if shard > 1 else 0}
    if "model" in out and "preset" not in out["model"] and cp > 1:
        out["model"].update(seq_length=seq // cp, attention_span=seq)
    return out
