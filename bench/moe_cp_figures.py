"""The mixture-of-experts and context-parallelism figures of issue 22, printed.

    PYTHONPATH=. .venv/bin/python bench/moe_cp_figures.py

1. DeepSeek-V3 on 1024 H100s (eos), global batch 8192, Megatron-Core: the layout NVIDIA published
   (Megatron-Bridge 25.09 DGX-H100 table: TP2 PP8 VP4 EP64, 1,297 tokens/s/GPU, FP8 current scaling,
   force-balanced routing; the 25.09 recipe's selective recomputation of the MLA up-projections
   and dense MLPs, DeepEP, no overlapped gradient reduction) predicted, and what `recommend`
   answers (bf16, as the issue's command asks) next to the same layout predicted in bf16.
2. Llama-3 8B at 131,072 tokens on 64 H100s: what `recommend` answers (context parallelism, not
   tensor parallelism across nodes).
3. The published MoE and CP rows of validation/data: iteration-time MAPE, and memory where a peak is
   published.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfmodels import predict, presets
from perfmodels.specs import Plan, Training
from tuner import recommend
from tuner.types import SearchOptions
from validation import loader
from validation.scoring import score_case

PUBLISHED = Plan(G_data=64, G_inter=8, G_intra_r=2, G_ep=64, G_etp=1, micro_batch_size=1,
                 schedule="interleaved-1f1b", virtual_stages=4, recompute="selective", sequence_parallel=True,
                 zero_stage=1, placement=("col", "row", "cp", "depth", "data", "inter"))
"""Megatron-Core's rank order: tp-cp-ep-dp innermost, the pipeline outermost."""


def deepseek() -> None:
    model, cluster = presets.model("deepseek-v3"), presets.cluster("eos").with_gpus(1024)
    gpus = cluster.num_gpus
    fp8 = Training(global_batch_size=8192, stack="megatron-core", dtype="fp8", expert_load_imbalance=1.0,
                   moe_token_dispatcher="flex", overlap_grad_reduce=False)
    pred = predict(model, cluster, fp8, PUBLISHED)
    print(f"DeepSeek-V3 published layout {PUBLISHED.grid_string()} VP4, fp8, forced balance, flex: "
          f"predicted {pred.tokens_per_s / gpus:,.0f} tokens/s/GPU vs published 1,297 "
          f"({pred.tokens_per_s / gpus / 1297 - 1:+.1%}), {pred.memory.per_gpu_gib:.1f} GiB")
    bf16 = Training(global_batch_size=8192, stack="megatron-core")
    same = predict(model, cluster, bf16, PUBLISHED)
    rec = recommend(model, cluster, bf16, top_k=3, search=SearchOptions(time_budget_s=120.0))
    best = rec.best
    assert best is not None
    print(f"recommend (bf16, megatron-core): {best.plan.grid_string()} mb={best.plan.micro_batch_size} "
          f"{best.plan.schedule} v{best.plan.virtual_stages} recompute={best.plan.recompute}: "
          f"{best.prediction.tokens_per_s / gpus:,.0f} tokens/s/GPU; the published layout in bf16 predicts "
          f"{same.tokens_per_s / gpus:,.0f} ({same.memory.per_gpu_gib:.1f} GiB, "
          f"{'fits' if same.memory.fits else 'does not fit'}) "
          f"(recommended/published {best.prediction.tokens_per_s / same.tokens_per_s:.2f}); "
          f"{rec.num_evaluated:,} plans in {rec.search_time_s:.1f} s, complete={rec.complete}")


def long_llama() -> None:
    model = dataclasses.replace(presets.model("llama3.1-8b"), seq_length=131072)
    training = Training(global_batch_size=64, stack="megatron-core")
    rec = recommend(model, presets.cluster("eos").with_gpus(64), training, top_k=3)
    best = rec.best
    assert best is not None
    print(f"Llama-3 8B at 131,072 tokens on 64 H100s: {best.plan.grid_string()} "
          f"({best.prediction.tokens_per_s / 64:,.0f} tokens/s/GPU, "
          f"{best.prediction.memory.per_gpu_gib:.1f} GiB)")


def validation_rows() -> None:
    loaded = loader.load(loader.default_paths(loader.DATA_DIR))
    errs: dict[str, list[float]] = {"MoE": [], "CP": []}
    mem: list[float] = []
    for case in loaded.cases:
        kind = "MoE" if case.model.is_moe else "CP" if any(p.G_cp > 1 for p in case.plans) else None
        if kind is None or not case.measured_time_s:
            continue
        score = score_case(case)
        errs[kind].append(abs(score.median_time_s / case.measured_time_s - 1.0))
        if case.measured_memory_gib:
            mem.append(abs(score.memory_gib / case.measured_memory_gib - 1.0))
    for kind, values in errs.items():
        print(f"{kind} rows: {len(values)}, iteration-time MAPE {np.mean(values):.1%}")
    both = errs["MoE"] + errs["CP"]
    print(f"MoE and CP rows: {len(both)}, MAPE {np.mean(both):.1%}; memory where published: {len(mem)} rows, "
          f"MAPE {np.mean(mem):.1%}")


if __name__ == "__main__":
    deepseek()
    long_llama()
    validation_rows()
