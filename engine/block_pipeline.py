"""Pipelines for any model given as a sequence of blocks, composed with 3D tensor and data parallelism.

    grid = engine.init(G_inter=2, G_data=2)
    with engine.auto_parallelize(grid, pipeline=True):     # optional: split each block's Linears
        blocks = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16), ...)
    pipe = engine.BlockPipeline(blocks, grid, loss_fn=F.mse_loss, schedule="1f1b", micro_batch_size=2,
                                local_batch_size=8, example_input=torch.zeros(2, 16))
    loss = engine.forward_backward(pipe.model, x_local, y_local, pipeline=pipe)  # None off the last stage
    engine.step(pipe.model, optimizer)           # optimizer over pipe.model.parameters()

`blocks`: an `nn.Sequential` or a list of modules (an embedding first and a head last are just
blocks). They are cut into G_inter * virtual_stages contiguous chunks of nearly equal block count;
chunk k runs on pipeline rank k % G_inter (loop placement, as interleaved 1F1B expects). Every
rank builds the whole sequence (same seed, so every rank has the single-process values), runs one
example micro-batch through it without gradients to learn each chunk's output shape and dtype
(torch.distributed.pipelining then runs with static shapes: no shape-inference traffic), and keeps
only its own chunks in `pipe.model` (an nn.Module, wrapped with engine.wrap: replicas broadcast,
sync guard, overlapped data reduction; split over stages, so norms reduce over the pipeline too).
Schedules: "gpipe", "1f1b", "interleaved-1f1b" (`virtual_stages` > 1). `loss_fn(output, target)`
must be a mean over the micro-batch; gradients are the mean over the local batch, as in
single-process training. The model code stays free of distributed code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from engine.grads import STAGE_SPLIT_ATTR, wrap
from engine.grid import Grid, GridError, grid_of
from engine.pipeline import SCHEDULES, run_schedule


def split_blocks(n_blocks: int, n_chunks: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of nearly equal size (the first ones one block larger)."""
    base, extra = divmod(n_blocks, n_chunks)
    out, start = [], 0
    for k in range(n_chunks):
        end = start + base + (1 if k < extra else 0)
        out.append((start, end))
        start = end
    return out


class _Chunks(nn.Module):
    """This rank's chunks of the block sequence (the module the optimizer and engine.step see).

    Each block is registered under its index in the whole sequence, so parameter names are global
    and equal the unsplit `nn.Sequential(*blocks)`'s ("4.weight" on whichever stage holds block 4):
    engine.full_state_dict / save_consolidated gather every stage without collisions and
    checkpoints reload under other pipeline and data degrees. The stages' nn.Sequential chunks
    hold the same block objects (not registered here a second time)."""

    def __init__(self, chunks: list[nn.Sequential], starts: list[int]) -> None:
        super().__init__()
        for chunk, start in zip(chunks, starts):
            for i, blk in enumerate(chunk):
                self.add_module(str(start + i), blk)
        self._stage_chunks = list(chunks)
        setattr(self, STAGE_SPLIT_ATTR, True)


class BlockPipeline:
    def __init__(self, blocks: nn.Sequential | Sequence[nn.Module], grid: Grid | None = None, *,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], schedule: str = "1f1b",
                 micro_batch_size: int, local_batch_size: int, example_input: torch.Tensor,
                 virtual_stages: int = 1) -> None:
        blocks = list(blocks)
        grid = grid_of(blocks, grid)
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
        for name, value in (("micro_batch_size", micro_batch_size), ("local_batch_size", local_batch_size),
                            ("virtual_stages", virtual_stages)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if local_batch_size % micro_batch_size:
            raise ValueError(f"local_batch_size={local_batch_size} is not divisible by "
                             f"micro_batch_size={micro_batch_size}")
        if virtual_stages > 1 and schedule != "interleaved-1f1b":
            raise ValueError(f"virtual_stages={virtual_stages} needs schedule='interleaved-1f1b', "
                             f"got {schedule!r}")
        S, s = grid.size("inter"), grid.coord("inter")
        n_chunks = S * virtual_stages
        if len(blocks) < n_chunks:
            raise ValueError(f"blocks: {len(blocks)} blocks cannot fill "
                             f"G_inter*virtual_stages={n_chunks} chunks")
        n_mb = local_batch_size // micro_batch_size
        if schedule != "gpipe" and n_mb < S:
            raise ValueError(f"{schedule} needs at least G_inter={S} micro-batches per step, got {n_mb}")
        if not isinstance(example_input, torch.Tensor) or example_input.shape[0] != micro_batch_size:
            raise ValueError(f"example_input must be a tensor of one micro-batch ({micro_batch_size} rows)")
        self.grid, self.loss_fn, self.n_microbatches = grid, loss_fn, n_mb
        self.local_batch_size, self.micro_batch_size = local_batch_size, micro_batch_size
        ranges = split_blocks(len(blocks), n_chunks)
        # static shapes: one example micro-batch through every chunk (collectives of auto-parallelized
        # blocks run on every rank alike)
        shapes = []
        with torch.no_grad():
            x = example_input.to(grid.device)
            self.input_dtype = x.dtype
            for a, b in ranges:
                inp = x
                for blk in blocks[a:b]:
                    x = blk(x)
                shapes.append((inp, x))
        mine = [k for k in range(n_chunks) if k % S == s]
        chunks = [nn.Sequential(*blocks[ranges[k][0]:ranges[k][1]]) for k in mine]
        self.model = wrap(_Chunks(chunks, [ranges[k][0] for k in mine]), grid=grid)
        self.stages = []
        for k, chunk in zip(mine, chunks):
            inp, out = shapes[k]
            inp_arg = torch.empty_like(inp, requires_grad=k > 0 and inp.is_floating_point())
            out_arg = torch.empty_like(out, requires_grad=True)
            self.stages.append(PipelineStage(chunk, stage_index=k, num_stages=n_chunks, device=grid.device,
                                             input_args=inp_arg, output_args=out_arg,
                                             group=grid.group("inter")))
        self.loss_scale = 1.0
        first = self.stages if schedule == "interleaved-1f1b" else self.stages[0]
        self.schedule = SCHEDULES[schedule](first, n_mb,
                                            loss_fn=lambda o, t: self.loss_fn(o, t) * self.loss_scale)
        self.is_first = any(st.is_first for st in self.stages)
        self.is_last = any(st.is_last for st in self.stages)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, *, loss_scale: float = 1.0) -> float | None:
        """Forward and backward of all micro-batches of this local batch; mean loss on the last stage."""
        for name, t in (("inputs", inputs), ("targets", targets)):
            if not isinstance(t, torch.Tensor) or t.shape[0] != self.local_batch_size:
                raise GridError(f"{name} must have {self.local_batch_size} rows (the local batch), got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        return run_schedule(self, inputs, targets, loss_scale)
