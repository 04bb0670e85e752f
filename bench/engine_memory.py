"""Peak memory per rank of a 16-layer GPT at hidden 2048 on 4 ranks (row2 x col2), measured by the
engine (TrainReport.memory: peak RSS per rank on CPU), against its shard of weights, gradients and
AdamW state plus activations, and against perfmodels' prediction (target <= 1.3x).

Why: the engine builds only each rank's shards (engine.ParallelGPT(cfg) draws the full tensors
chunk by chunk and keeps its slice), so peak memory must follow the shard, not the model.

    OMP_NUM_THREADS=1 .venv/bin/python bench/engine_memory.py [--layers 16 --hidden 2048 --seq 128]

fp32 on gloo (CPU): 16 bytes per local parameter (weights, gradients, AdamW's two moments). The
activations and the prediction come from perfmodels.predict for the same plan on the local-cpu
cluster; the RSS also holds the Python/torch runtime (printed as the baseline before the model).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GIB = 2**30


def _run(rank: int, world: int, cfg: Any, batch: int) -> dict[str, Any]:
    import torch

    from engine.train import peak_rss_bytes, stdlib_text_dataset, train
    from perfmodels.specs import Plan

    baseline = peak_rss_bytes()
    data = stdlib_text_dataset(cfg.seq_length, 400_000)
    report = train(
        cfg,
        data,
        batch,
        2,
        plan=Plan(G_intra_r=2, G_intra_c=2, micro_batch_size=batch),
        warmup_steps=1,
        progress=False,
        record=False,
        use_calibrated=False,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4, foreach=False),
    )
    return {"report": report, "baseline": baseline}


def _linear(rank: int, world: int) -> dict[str, float]:
    """The issue's repro: engine.Linear(4096, 16384) on row2 x col2 keeps a 64 MiB shard; how much does
    building it raise this rank's peak RSS? (It used to build the full 256 MiB weight first.)"""
    import torch

    import engine
    from engine.train import peak_rss_bytes

    engine.init(G_intra_r=2, G_intra_c=2)
    torch.manual_seed(0)
    engine.Linear(16, 16)  # warm the allocator and code paths
    before = peak_rss_bytes()
    layer = engine.Linear(4096, 16384)
    after = peak_rss_bytes()
    shard = sum(p.numel() * p.element_size() for p in layer.parameters())
    return {"shard_mib": shard / 2**20, "peak_growth_mib": (after - before) / 2**20}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from engine.launch import launch
    from engine.models.gpt import GPTConfig
    from perfmodels.specs import Plan
    from perfmodels.steptime import predict
    from tuner.closed_loop import engine_training, local_cluster

    torch.set_num_threads(1)
    lin = launch(_linear, world_size=4, timeout_s=600)
    print(
        "engine.Linear(4096, 16384) on row2 x col2: shard "
        + ", ".join(f"{r['shard_mib']:.0f}" for r in lin)
        + " MiB; peak RSS growth while building it "
        + ", ".join(f"{r['peak_growth_mib']:.0f}" for r in lin)
        + " MiB per rank (the full weight is 256 MiB)"
    )
    cfg = GPTConfig(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
                    seq_length=args.seq, vocab_size=args.vocab)
    results = launch(_run, world_size=4, args=(cfg, args.batch), timeout_s=1800)
    report = results[0]["report"]
    pred = predict(cfg.to_spec(), local_cluster(4), engine_training(args.batch),
                   Plan(G_intra_r=2, G_intra_c=2, micro_batch_size=args.batch))
    mem = pred.memory
    local = mem.params_gib * GIB / 4  # fp32 weights of rank 0's shard (embeddings split over col only)
    states = local * 16 / GIB
    bound = states + mem.activations_gib
    total_params = cfg.to_spec().num_params
    print(
        f"GPT {cfg.num_layers} layers x hidden {cfg.hidden_size}, seq {cfg.seq_length}, vocab "
        f"{cfg.vocab_size}: "
        f"{total_params / 1e6:.0f} M parameters ({total_params * 16 / GIB:.2f} GiB of fp32 "
        "weights+grads+AdamW "
        f"unsharded); 4 ranks row2 x col2, micro-batch {args.batch}, fp32"
    )
    print(
        f"rank 0 holds {local / 1e6:.1f} M parameters: weights+grads+optimizer {states:.2f} GiB; activations "
        f"(perfmodels) {mem.activations_gib:.2f} GiB; shard + activations = {bound:.2f} GiB"
    )
    for r, m in enumerate(report.memory):
        print(
            f"  rank {r}: peak RSS {m.peak_rss_bytes / GIB:.2f} GiB (runtime before the model "
            f"{results[r]['baseline'] / GIB:.2f} GiB) -> {m.peak_rss_bytes / GIB / bound:.2f} x (shard + "
            "activations)"
        )
    worst = max(m.peak_rss_bytes for m in report.memory) / GIB
    print(f"peak per rank {worst:.2f} GiB = {worst / bound:.2f} x (shard + activations) (target <= 1.3); "
          f"perfmodels predicts {mem.per_gpu_gib:.2f} GiB per rank (params {mem.params_gib:.2f}, grads "
          f"{mem.grads_gib:.2f}, optimizer {mem.optimizer_gib:.2f}, activations {mem.activations_gib:.2f}, "
          f"buffers {mem.comm_buffers_gib:.2f}, overhead {mem.overhead_gib:.2f}): measured / predicted = "
          f"{worst / mem.per_gpu_gib:.2f}")
    print(
        f"step time {report.median_step_time_s:.1f} s; losses {', '.join(f'{x:.3f}' for x in report.losses)}"
    )


if __name__ == "__main__":
    main()
