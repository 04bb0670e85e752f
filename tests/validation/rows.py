"""Build published-format CSV rows for the validation tests (one fully stated run by default)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from validation.loader import DATA_DIR

with open(DATA_DIR / "published_dev.csv", newline="") as _fh:
    HEADER = next(csv.reader(_fh))
"""The columns of the vendored published format (the tests write rows in exactly that format)."""

BASE = {
    "source": "test source",
    "model_name": "GPT 1.3B",
    "num_layers": "24",
    "hidden_size": "2048",
    "num_heads": "16",
    "seq_len": "2048",
    "vocab_size": "51200",
    "global_batch_size": "512",
    "micro_batch_size": "4",
    "tp": "2",
    "pp": "2",
    "dp": "16",
    "cp": "1",
    "virtual_pp": "1",
    "sequence_parallel": "false",
    "num_gpus": "64",
    "gpu_type": "A100 80GB",
    "gpus_per_node": "8",
    "metric_name": "iteration_time_s",
    "metric_value": "2.5",
    "framework": "megatron-core",
    "year": "2024",
    "zero_stage": "1",
    "activation_checkpointing": "none",
    "flash_attention": "true",
    "linear_precision": "bf16",
    "attention_precision": "bf16",
    "overlap_grad_reduce": "true",
    "overlap_param_gather": "true",
    "tp_comm_overlap": "false",
    "gpu_memory_gb": "80",
    "peak_memory_gib": "",
}


def row(**changes: str) -> dict[str, str]:
    out = dict(BASE)
    out.update(changes)
    return out


def write(path: Path, *rows: dict[str, str]) -> Path:
    buf = io.StringIO()
    extra = [k for r in rows for k in r if k not in HEADER]
    fields = HEADER + list(dict.fromkeys(extra))
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r.get(k, "") for k in fields})
    path.write_text(buf.getvalue())
    return path
