"""One optimizer step's forward and backward over micro-batches, with or without a pipeline.

    loss = forward_backward(model, tokens, targets, micro_batch_size=2)       # G_inter == 1
    loss = forward_backward(model, tokens, targets, pipeline=pipe)            # G_inter > 1
    engine.step(model, optimizer)          # sync_gradients + (clip) + optimizer.step()

Inputs are moved to the model's device (the data loader yields CPU tensors). Without a pipeline,
the local batch is split into micro-batches whose losses are scaled by 1/n_microbatches (gradient
accumulation, no gradient sync in between), which matches the mean loss over the local batch.
Returns the mean local loss (None on pipeline ranks without the loss).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from engine.grads import no_sync
from engine.pipeline import Pipeline


def forward_backward(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, *,
                     micro_batch_size: int | None = None, pipeline: Pipeline | None = None,
                     loss_scale: float = 1.0) -> float | None:
    """`loss_scale`: backward runs on loss * loss_scale (fp16 loss scaling, engine.LossScaler);
    the returned loss is unscaled."""
    if not isinstance(loss_scale, (int, float)) or isinstance(loss_scale, bool) or not loss_scale > 0:
        raise ValueError(f"loss_scale must be a positive number, got {loss_scale!r}")
    if pipeline is not None:
        return pipeline.step(tokens, targets, loss_scale=float(loss_scale))
    if micro_batch_size is not None and (isinstance(micro_batch_size, bool)
                                         or not isinstance(micro_batch_size, int) or micro_batch_size < 1):
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    mb = micro_batch_size or tokens.shape[0]
    if tokens.shape[0] % mb:
        raise ValueError(f"local batch {tokens.shape[0]} is not divisible by micro_batch_size={mb}")
    device = next((p.device for p in model.parameters()), tokens.device)
    tokens, targets = tokens.to(device), targets.to(device)
    n = tokens.shape[0] // mb
    total = torch.zeros((), device=device)
    for i in range(n):
        # every micro-batch but the last accumulates only (the overlapped data reduction, if the
        # model has one, launches during the last backward)
        with no_sync(model) if i < n - 1 else contextlib.nullcontext():
            loss = model(tokens[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb])
            (loss * (loss_scale / n)).backward()
        total += loss.detach().float()  # read back once, after the last micro-batch: on a GPU the host
    return float(total) / n             # keeps issuing the next micro-batch while this one runs
