"""gridtune's training engine: AxoNN-style 3D tensor x pipeline x data parallelism on torch.distributed.

    import engine
    grid = engine.init(G_data=2, G_intra_r=2, G_intra_c=1, G_intra_d=2, G_inter=1)  # or AxoNN's order
    loader = engine.create_dataloader(dataset, global_batch_size=64, micro_batch_size=4)
    model = engine.ParallelGPT(cfg, grid)  # only this rank's shards; or: with engine.auto_parallelize(): ...
    loss = engine.forward_backward(model, tokens, targets, micro_batch_size=4)
    engine.step(model, optimizer, max_grad_norm=1.0)    # sync gradients, clip, optimizer.step()

See docs/engine.md for the AxoNN-style flow, DESIGN.md section 1 for the layout and
perfmodels/traffic.py for the bytes every step sends.
"""

from engine.auto import AutoLinear, auto_parallelize
from engine.block_pipeline import BlockPipeline
from engine.checkpoint import full_state_dict, load_checkpoint, save_checkpoint, save_consolidated
from engine.data import create_dataloader, local_batch_size
from engine.grads import (
    clip_grad_norm_,
    grad_norm,
    no_sync,
    overlap_grad_reduce,
    step,
    sync_gradients,
    wrap,
)
from engine.grid import Grid, GridError, current_grid, init
from engine.linear import Linear, ShardedLinear, prefetch_depth
from engine.loop import forward_backward
from engine.memory import model_state_bytes
from engine.moe import MoE
from engine.parallel_gpt import ParallelGPT
from engine.parallelize import parallelize
from engine.pipeline import Pipeline
from engine.precision import LossScaler, MixedPrecision
from engine.recorder import CommRecorder
from engine.train import TrainReport, train
from engine.zero import ZeroOptimizer
from engine.zero3 import Zero3

__all__ = [
    "AutoLinear",
    "BlockPipeline",
    "CommRecorder",
    "Grid",
    "GridError",
    "Linear",
    "LossScaler",
    "MixedPrecision",
    "MoE",
    "ParallelGPT",
    "Pipeline",
    "ShardedLinear",
    "TrainReport",
    "Zero3",
    "ZeroOptimizer",
    "auto_parallelize",
    "clip_grad_norm_",
    "create_dataloader",
    "current_grid",
    "forward_backward",
    "full_state_dict",
    "grad_norm",
    "init",
    "load_checkpoint",
    "local_batch_size",
    "model_state_bytes",
    "no_sync",
    "overlap_grad_reduce",
    "parallelize",
    "prefetch_depth",
    "save_checkpoint",
    "save_consolidated",
    "step",
    "sync_gradients",
    "train",
    "wrap",
]
