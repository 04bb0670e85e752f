"""Read published-run CSVs into `Case`s: the model, cluster, stack and layout each row states.

Two formats, told apart by their header (see validation/data/README.md):
- vTrain's ground truth (`ground_truth_multi.csv` / `ground_truth_single.csv`: Megatron-DeepSpeed on
  an A100 cluster). The file has no stack columns; the facts of vtrain_multi_stack.md (taken from the
  vTrain repository itself) fill them, and the row then goes through the same reader as any other;
- the published_dev / published_modern format: one run per row with hardware, metric and stack columns.

The stack comes only from the stack columns (`validation.stack_columns`); the hardware only from the
hardware columns (`validation.hardware`); nothing is keyed to the source's name, year or notes, so
the same row under another `source` string is the same case. Empty cells are unknown, and a case
carries every candidate for them (`validation.candidates`). A row that cannot be used is returned as
`Skipped` with the reason, never raised.

    from validation import loader
    loaded = loader.load(loader.default_paths())   # every CSV in validation/data

Run the tests: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/validation`.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from perfmodels import presets, stacks
from perfmodels.specs import Cluster, Model, Plan, Training
from validation.candidates import Layout, candidate_plans
from validation.cases import Case, Loaded, Skipped
from validation.hardware import CardMemory, card, cluster_from_columns
from validation.metrics import RunShape, step_time_s
from validation.stack_columns import StackOptions, parse_bool, read_stack

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The vendored published runs (copies of the project's shared validation set)."""

VTRAIN_STACK: dict[str, str] = {
    "framework": "megatron-deepspeed",  # stated: vTrain data/README.md
    "zero_stage": "0",  # implied: the simulator models a plain gradient all-reduce
    "activation_checkpointing": "full",  # implied: "use_checkpoint": true in all validation configs
    "flash_attention": "false",  # implied: the profiled model builds the full score tensor
    "linear_precision": "fp16",  # implied: profiled with torch.float16
    "attention_precision": "fp16",
    "overlap_grad_reduce": "false",  # implied: "use_gradient_bucket": false
    "overlap_param_gather": "false",  # implied: no distributed optimizer or ZeRO-3
    "tp_comm_overlap": "false",  # implied: Megatron-DeepSpeed has no TP-communication overlap
}
"""Stack facts of every vTrain ground-truth row, from data/vtrain_multi_stack.md (each cited there).
The schedule is 1F1B ("pipeline_scheduling": "1f1b"); sequence parallelism is off, Megatron's
default (the simulator has no option for it); the card's memory (40 or 80 GB) is not stated."""

DEFAULT_VOCAB = 51200
"""Megatron's padded GPT-2 vocabulary: a model convention for rows that leave `vocab_size` empty."""


def default_paths(data_dir: Path = DATA_DIR) -> list[Path]:
    return sorted(Path(data_dir).glob("*.csv"))


def load(paths: Iterable[Path]) -> Loaded:
    """Load every CSV (vTrain or published format, told apart by their headers)."""
    out = Loaded()
    for path in paths:
        out.extend(load_file(Path(path)))
    return out


def load_file(path: Path) -> Loaded:
    # utf-8-sig: vTrain's ground_truth_single.csv (and any spreadsheet export) starts with a byte-order
    # mark, which would otherwise become part of the first column's name
    with open(path, newline="", encoding="utf-8-sig") as fh:
        header = fh.readline()
    make = _vtrain_case if "iteration time (ms)" in header else _published_case
    return _load_rows(path, make)


def _load_rows(path: Path, make_case: Callable[[str, Mapping[str, str]], Case]) -> Loaded:
    out = Loaded()
    with open(path, newline="", encoding="utf-8-sig") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            cid = f"{path.name}:{i + 2}"
            try:
                out.cases.append(make_case(cid, row))
            except KeyError as exc:
                out.skipped.append(Skipped(case_id=cid, reason=f"column {exc} missing"))
            except (TypeError, ValueError) as exc:
                out.skipped.append(Skipped(case_id=cid, reason=str(exc)))
    return out


def _int(row: Mapping[str, str], column: str) -> int | None:
    """A whole number from a cell; None when empty; ValueError naming the column for other text."""
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{column}={text!r} is not a number") from None
    if not value.is_integer() or value < 0:
        raise ValueError(f"{column}={text!r} is not a whole number")
    return int(value)


def _float(column: str, value: str | None) -> float | None:
    text = (value or "").strip()
    if not text:
        return None
    try:
        out = float(text)
    except ValueError:
        raise ValueError(f"{column}={text!r} is not a number") from None
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"{column}={text!r} is not a positive number")
    return out


# --------------------------------------------------------------------------------------------
# vTrain ground truth
# --------------------------------------------------------------------------------------------


def _vtrain_case(cid: str, row: Mapping[str, str]) -> Case:
    gpus, h, L = (_int(row, k) for k in ("# GPUs", "hidden size", "# layers"))
    size = (row.get("Parameters (billion)") or "").strip()
    published = {
        "source": "vTrain ground truth (VIA-Research/vTrain, MICRO'24)",
        "model_name": f"gpt-{size}b" if size else f"gpt-h{h}-L{L}",
        "num_layers": row["# layers"],
        "hidden_size": row["hidden size"],
        "num_heads": row["attention heads"],
        "seq_len": row["sequence length"],
        "global_batch_size": row["global batch"],
        "micro_batch_size": row["micro batch"],
        "tp": row["tensor parallelism"],
        "pp": row["pipeline parallelism"],
        "dp": row["data parallelism"],
        "virtual_pp": "1",
        "sequence_parallel": "false",
        "cp": "1",
        "num_gpus": row["# GPUs"],
        "gpu_type": "A100",
        "metric_name": "iteration_time_ms",
        "metric_value": row["iteration time (ms)"],
        **VTRAIN_STACK,
    }
    gpu, memory = card("A100", None)
    cluster = replace(presets.cluster("vtrain-a100", num_gpus=gpus), gpu=gpu)
    return _published_case(cid, published, cluster=(cluster, memory))


# --------------------------------------------------------------------------------------------
# published_dev / published_modern format
# --------------------------------------------------------------------------------------------

_LLAMA_STYLE = ("llama", "mistral", "qwen", "gemma", "deepseek", "internlm", "baichuan", "yi-")


_NO_DROPOUT = (*_LLAMA_STYLE, "nemotron", "mpt")
"""Model families whose published training configurations set dropout to 0 (Llama, Mistral, Qwen...
configs; Nemotron-4's NeMo config; MPT's LLM Foundry configs). GPT-2/GPT-3-style models keep
Megatron's default of 0.1."""


def _dropout(row: Mapping[str, str]) -> bool:
    """Whether the model trains with dropout: the row's own `dropout` column (true/false) when it has
    one, else the model family's published configuration. Like `_block_style`, a fact of the model."""
    stated = parse_bool("dropout", row.get("dropout"))
    if stated is not None:
        return stated
    name = (row.get("model_name") or "").lower()
    return not any(k in name for k in _NO_DROPOUT)


def _block_style(row: Mapping[str, str], heads: int) -> tuple[bool, int]:
    """(gated MLP, query groups): the row's own `gated_mlp` / `num_query_groups` columns when it has
    them, else the model family's published architecture (Llama-style blocks: SwiGLU; Llama 2 70B,
    Llama 3, Mistral and Nemotron-4: 8 key/value groups). This describes the model, not the training stack, so
    reading it from the model's name is not the stack guessing the loader avoids."""
    name = (row.get("model_name") or "").lower()
    gated = parse_bool("gated_mlp", row.get("gated_mlp"))
    if gated is None:
        gated = any(k in name for k in _LLAMA_STYLE)
    groups = _int(row, "num_query_groups") or _int(row, "num_kv_heads")
    if groups is None:
        eight = re.search(r"llama[\s-]*3|mistral|llama[\s-]*2[\s-]*70b|nemotron[\s-]*4", name)
        groups = 8 if eight and heads % 8 == 0 else heads
    return gated, groups


def _preset_model(row: Mapping[str, str], model: Model) -> Model:
    """A row naming a model preset (`model_preset`: the mixture-of-experts and attention-variant
    fields its columns cannot hold) is that preset at the row's sequence length."""
    name = (row.get("model_preset") or "").strip()
    if not name:
        return model
    return replace(presets.model(name), name=model.name, seq_length=model.seq_length)


def _with_routing(row: Mapping[str, str], trainings: tuple[Training, ...]) -> tuple[Training, ...]:
    """`moe_force_balance` true: the run forced balanced routing (Megatron-Bridge's MoE benchmarks,
    `moe_router_force_load_balancing`), so no rank waits for a busier one. `cuda_graph_scope`
    (Megatron's scope names separated by spaces, e.g. "attn moe_router moe_preprocess"): the parts
    of each layer the run replayed from CUDA graphs."""
    dispatcher = (row.get("moe_token_dispatcher") or "").strip()
    if dispatcher:
        trainings = tuple(replace(t, moe_token_dispatcher=dispatcher) for t in trainings)
    scopes = tuple((row.get("cuda_graph_scope") or "").split())
    if scopes:
        trainings = tuple(replace(t, cuda_graph_scope=scopes) for t in trainings)
    if not parse_bool("moe_force_balance", row.get("moe_force_balance")):
        return trainings
    return tuple(replace(t, expert_load_imbalance=1.0) for t in trainings)


def _unstated_layout_columns(plans: list[Plan]) -> list[str]:
    """The layout columns (CSV names) on which the candidate plans differ."""
    columns = (("tp", "G_intra_r"), ("pp", "G_inter"), ("micro_batch_size", "micro_batch_size"),
               ("virtual_pp", "virtual_stages"), ("sequence_parallel", "sequence_parallel"))
    return [column for column, fieldname in columns if len({getattr(p, fieldname) for p in plans}) > 1]


def _measured_step_s(metric: str, value_text: str, shape: RunShape, stack: StackOptions,
                     cluster: Cluster) -> float:
    """Seconds per step from the row's metric (throughput, MFU, or time), or ValueError saying why not."""
    value = _float("metric_value", value_text)
    if value is None:
        raise ValueError("metric_value is empty")
    peaks = {cluster.gpu.peak_tflops(d) for d in stack.dtypes}
    if metric.lower().startswith("mfu") and len(peaks) > 1:
        raise ValueError(f"{metric} with linear_precision unstated: the peak it divides by differs "
                         f"between {', '.join(stack.dtypes)}")
    return step_time_s(metric, value, shape, recompute_full=stack.recompute_full_stated,
                       peak_tflops=peaks.pop())


def _row_cluster(row: Mapping[str, str], num_gpus: int) -> tuple[Cluster, CardMemory]:
    """The cluster a row's hardware columns describe, and how its card memory was known."""
    return cluster_from_columns(
        gpu_type=row.get("gpu_type") or "",
        memory_gb=_float("gpu_memory_gb", row.get("gpu_memory_gb")),
        num_gpus=num_gpus,
        gpus_per_node=_int(row, "gpus_per_node"),
        intra_text=row.get("intra_node_interconnect") or "",
        inter_text=row.get("inter_node_interconnect") or "",
    )


def _published_case(cid: str, row: Mapping[str, str], *,
                    cluster: tuple[Cluster, CardMemory] | None = None) -> Case:
    metric = (row.get("metric_name") or "").strip()
    value_text = (row.get("metric_value") or "").strip()
    expect_oom = "oom" in metric.lower() or value_text.upper() == "OOM"
    L, h, a, s = (_int(row, k) for k in ("num_layers", "hidden_size", "num_heads", "seq_len"))
    if not (L and h and a and s):
        raise ValueError("model dimensions missing")
    gb, G = _int(row, "global_batch_size"), _int(row, "num_gpus")
    if not gb or not G:
        raise ValueError("global batch size or GPU count not stated")
    vocab = _int(row, "vocab_size") or DEFAULT_VOCAB
    gated, groups = _block_style(row, a)
    ffn = _int(row, "ffn_hidden_size") or (-(-8 * h // 3 // 256) * 256 if gated else 4 * h)

    the_cluster, memory = cluster if cluster is not None else _row_cluster(row, G)
    stack = read_stack(row, the_cluster.gpu)

    # context parallelism: the row's cp is the plan's G_cp (perfmodels.context costs the 1/cp chunks,
    # the dp-cp gradient group and the key/value ring)
    cp = _int(row, "cp") or 1
    if cp > 1 and s % (2 * cp):
        raise ValueError(f"seq_len={s} does not split into 2*cp={2 * cp} chunks")
    model = Model(name=row.get("model_name") or "gpt", num_layers=L, hidden_size=h, num_attention_heads=a,
                  ffn_hidden_size=ffn, seq_length=s, vocab_size=vocab,
                  gated_mlp=gated, num_query_groups=groups, dropout=_dropout(row),
                  # GPT-style blocks (Megatron's GPT, MPT) tie the LM head to the word embedding;
                  # Llama-style (gated) models and Nemotron-4 keep their own head (their configs)
                  tied_embeddings=not gated and "nemotron" not in (row.get("model_name") or "").lower())
    model = _preset_model(row, model)

    dp = _int(row, "dp")
    layout = Layout(num_gpus=G, global_batch=gb, tp=_int(row, "tp"), pp=_int(row, "pp"), cp=cp,
                    ep=_int(row, "ep") or 1, etp=_int(row, "etp"),
                    dp=dp if dp else None, micro_batch=_int(row, "micro_batch_size"),
                    virtual_pp=_int(row, "virtual_pp"),
                    sequence_parallel=parse_bool("sequence_parallel", row.get("sequence_parallel")))
    presets_ = [stacks.preset(name) for name in stack.stacks]
    zero_stages = stack.zero_stages if "zero_stage" not in stack.unknown else tuple(
        z for z in stack.zero_stages if any(z in st.zero_stages for st in presets_))
    plans = candidate_plans(layout, layers=L, heads=a, recomputes=stack.recomputes, zero_stages=zero_stages,
                            placement=stack.placement,
                            can_interleave=any("interleaved-1f1b" in st.schedules for st in presets_),
                            can_sequence_parallel=any(st.sequence_parallel for st in presets_))
    if not plans:
        raise ValueError("no layout consistent with the stated degrees")
    # the stack options not stated, and the layout columns whose emptiness leaves more than one value
    unknown = [*stack.unknown, *_unstated_layout_columns(plans)]
    measured = None
    if not expect_oom:
        shape = RunShape(global_batch=gb, seq=s, layers=L, hidden=h, vocab=vocab, ffn=ffn,
                         kv_hidden=model.kv_hidden_size, gated=gated, num_gpus=G)
        measured = _measured_step_s(metric, value_text, shape, stack, the_cluster)

    framework = stack.framework or "any stack"
    # a ranking group compares layouts of one workload: same model, sequence, precision, cluster and batch
    precision = "/".join(stack.dtypes)
    group = (f"{framework} {model.name.split(' (')[0]} L{L} h{h} s{s} {precision} on {G} "
             f"{the_cluster.gpu.name} gb{gb}")
    return Case(
        case_id=cid,
        source=(row.get("source") or "").strip(),
        framework=framework,
        group=group,
        model=model,
        cluster=the_cluster,
        trainings=_with_routing(row, stack.trainings(gb)),
        plans=tuple(plans),
        measured_time_s=measured,
        measured_memory_gib=_float("peak_memory_gib", row.get("peak_memory_gib")),
        expect_oom=expect_oom,
        layout_stated=layout.stated,
        unknown=tuple(unknown),
        card_memory=memory,
        notes=row.get("notes") or "",
    )
