"""Pipeline parallelism over G_inter with torch.distributed.pipelining, composed with the 3D groups.

    pipe = Pipeline(model, grid, schedule="1f1b", micro_batch_size=1, local_batch_size=4)
    loss = pipe.step(tokens_local, targets_local)   # mean local loss on the last stage, else None

Stages are `ParallelGPT.chunks()` (blocks split by perfmodels.layout.partition_chunks), peers are
found in the grid's "inter" group, and shapes are static (no shape-inference traffic on step 0,
so every step sends exactly the activations perfmodels.traffic counts: [micro_batch, seq,
hidden/G_c] per send/recv). Schedules: "gpipe" (ScheduleGPipe), "1f1b" (Schedule1F1B) and
"interleaved-1f1b" (ScheduleInterleaved1F1B, `virtual_stages` chunks per rank, loop placement).
Gradients are scaled by 1/n_microbatches (mean over micro-batches); the schedule does not zero them.

The first step also runs torch.distributed.pipelining's one-time warm-up vote (a 4-byte int32
send/recv between neighbouring stages each way, deciding static vs dynamic metadata; every stage
votes static here), so traffic is compared with the model from the second step on.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from engine.grads import _OVERLAP_ATTR, zero_optimizer_of
from engine.grid import Grid, GridError
from engine.parallel_gpt import ParallelGPT

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B}


class Pipeline:
    def __init__(self, model: ParallelGPT, grid: Grid, *, schedule: str = "1f1b", micro_batch_size: int,
                 local_batch_size: int) -> None:
        if schedule not in SCHEDULES:
            raise GridError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
        if local_batch_size % micro_batch_size:
            raise GridError(f"local batch {local_batch_size} is not divisible by "
                            f"micro_batch_size={micro_batch_size}")
        S = grid.size("inter")
        v = model.virtual_stages
        if v > 1 and schedule != "interleaved-1f1b":
            raise GridError(f"virtual_stages={v} needs schedule='interleaved-1f1b', got {schedule!r}")
        self.model, self.grid = model, grid
        self.local_batch_size, self.micro_batch_size = local_batch_size, micro_batch_size
        self.n_microbatches = local_batch_size // micro_batch_size
        if schedule != "gpipe" and self.n_microbatches < S:
            raise GridError(f"{schedule} needs at least G_inter={S} micro-batches per step, got "
                            f"{local_batch_size}/{micro_batch_size} = {self.n_microbatches}")
        cfg, mb = model.cfg, micro_batch_size
        hidden_local = cfg.hidden_size // grid.size("col")
        seq = cfg.seq_length // grid.degrees.get("cp", 1)  # context parallelism: this rank's tokens
        self.seq_local = seq
        s = grid.coord("inter")
        self.stages = []
        for c, chunk in enumerate(model.chunks()):
            index = c * S + s
            if chunk.first:
                inp = torch.zeros(mb, seq, dtype=torch.long, device=grid.device)
            else:
                inp = torch.empty(mb, seq, hidden_local, device=grid.device, requires_grad=True)
            if chunk.last:
                vocab_local = model.padded_vocab // grid.size("row")
                out = torch.empty(mb, seq, vocab_local, device=grid.device, requires_grad=True)
            else:
                out = torch.empty(mb, seq, hidden_local, device=grid.device, requires_grad=True)
            self.stages.append(PipelineStage(chunk, stage_index=index, num_stages=S * v, device=grid.device,
                                             input_args=inp, output_args=out, group=grid.group("inter")))
        cls = SCHEDULES[schedule]
        first_arg = self.stages if schedule == "interleaved-1f1b" else self.stages[0]
        self.loss_scale = 1.0  # fp16 loss scaling: the schedule's backward runs on loss * loss_scale
        self.schedule = cls(first_arg, self.n_microbatches,
                            loss_fn=lambda out, tgt: model.loss_fn(out, tgt) * self.loss_scale)
        self.is_first = any(st.is_first for st in self.stages)
        self.is_last = any(st.is_last for st in self.stages)

    def check_batch(self, tokens: torch.Tensor, targets: torch.Tensor) -> None:
        """The static shapes the stages were built for; a mismatch would abort every rank inside the
        schedule's send/recv (SIGABRT), so it is refused here, before any collective, on every rank."""
        want = (self.local_batch_size, self.seq_local)
        for name, t in (("tokens", tokens), ("targets", targets)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name} has shape {got} but this pipeline was built for the local batch "
                    f"[local_batch_size={self.local_batch_size}, seq_length={want[1]}] "
                    f"(global batch / (G_data*G_intra_d) samples of "
                    f"micro_batch_size={self.micro_batch_size}); pass the batch engine.create_dataloader "
                    "yields, or build the Pipeline with this local batch")

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, *, loss_scale: float = 1.0) -> float | None:
        """Forward and backward of all micro-batches of this local batch; mean loss on the last stage."""
        self.check_batch(tokens, targets)
        return run_schedule(self, tokens, targets, loss_scale)


def run_schedule(pipe: Any, inputs: torch.Tensor, targets: torch.Tensor, loss_scale: float) -> float | None:
    """One step of `pipe`'s torch.distributed.pipelining schedule (Pipeline and BlockPipeline alike):
    the first stage feeds `inputs`, the last scores `targets`; the mean loss on the last stage.

    `pipe` has `grid`, `model` (wrapped), `schedule`, `n_microbatches`, `is_first`, `is_last` and a
    `loss_scale` its loss function multiplies by (set for this step only)."""
    inputs, targets = inputs.to(pipe.grid.device), targets.to(pipe.grid.device)
    losses: list[torch.Tensor] = []
    kwargs = {"target": targets, "losses": losses} if pipe.is_last else {}
    args = (inputs,) if pipe.is_first else ()
    # a parameter's data all-reduce (engine.grads, overlapped) launches after its last
    # micro-batch's backward, while the schedule drains the rest
    reducer = getattr(pipe.model, _OVERLAP_ATTR, None)
    if reducer is not None:  # the schedule divides the gradients by n after backward (scale_grads)
        reducer.expected, reducer.launch_scale = pipe.n_microbatches, 1.0 / pipe.n_microbatches
    # engine.Zero3 under a pipeline: the stage's units are gathered once for the whole schedule and
    # their gradients reduce-scattered once after it (perfmodels.traffic, zero_stage=3, G_inter > 1)
    zero3 = zero_optimizer_of(pipe.model)
    if not getattr(zero3, "pipelined", False):
        zero3 = None
    if zero3 is not None:
        zero3.begin_pipeline_step()
    pipe.loss_scale = loss_scale
    try:
        pipe.schedule.step(*args, return_outputs=False, **kwargs)
    finally:
        pipe.loss_scale = 1.0
        if reducer is not None:
            reducer.expected, reducer.launch_scale = 1, 1.0
    if zero3 is not None:
        zero3.end_pipeline_step()
    if pipe.is_last:
        return float(torch.stack([loss.detach() for loss in losses]).mean()) / loss_scale
    return None
