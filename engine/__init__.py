"""gridtune's training engine: AxoNN-style 3D tensor x pipeline x data parallelism on torch.distributed.

    import engine
    grid = engine.init(G_data=2, G_intra_r=2, G_intra_c=1, G_intra_d=2, G_inter=1)
    loader = engine.create_dataloader(dataset, global_batch_size=64)
    model = engine.ParallelGPT.from_serial(GPT(cfg), grid)     # or: with engine.auto_parallelize(): ...
    loss = engine.forward_backward(model, tokens, targets, micro_batch_size=4)
    engine.sync_gradients(model); optimizer.step()

See DESIGN.md section 1 for the layout and perfmodels/traffic.py for the bytes every step sends.
"""

from engine.auto import AutoLinear, auto_parallelize
from engine.checkpoint import full_state_dict, load_checkpoint, save_checkpoint
from engine.data import create_dataloader, local_batch_size
from engine.grads import clip_grad_norm_, grad_norm, no_sync, sync_gradients
from engine.grid import Grid, GridError, current_grid, init
from engine.linear import Linear
from engine.parallel_gpt import ParallelGPT
from engine.pipeline import Pipeline
from engine.recorder import CommRecorder
from engine.step import forward_backward
from engine.train import TrainReport, train
from engine.zero import ZeroOptimizer

__all__ = [
    "AutoLinear",
    "CommRecorder",
    "Grid",
    "GridError",
    "Linear",
    "ParallelGPT",
    "Pipeline",
    "TrainReport",
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
    "no_sync",
    "save_checkpoint",
    "sync_gradients",
    "train",
]
