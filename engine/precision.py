"""Mixed precision: low-precision compute, fp32 master weights, a chosen gradient-reduction dtype.

    policy = engine.MixedPrecision(compute_dtype="bf16", reduce_dtype="bf16")
    policy.apply(model)                       # the data all-reduce runs in bf16 (half the bytes)
    with policy.autocast(grid.device):        # forward and backward compute in bf16
        loss = engine.forward_backward(model, x, y, loss_scale=scaler.scale)
    scaler.unscale_and_check(model, grid)     # fp16 only: divide by the scale, skip on inf/nan

Why: parameters, gradients and optimizer state stay fp32 (the "master weights"), so the update is
the fp32 update of low-precision gradients, as torch.autocast training does; only the matrix
products run in bf16/fp16. The reduction dtype is separate because halving the data-parallel bytes
is often worth the rounding of one sum (Megatron's `--grad-reduce-in-bf16`, FSDP2's
`MixedPrecisionPolicy(reduce_dtype=...)`). fp16 needs loss scaling (its range is small):
`LossScaler` multiplies the loss, divides the gradients after the reduction, and on an inf/nan in
any rank's gradients skips the step and halves the scale (a world all-reduce of one flag).
`engine.train(dtype="fp16", reduce_dtype="bf16")` does all of this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
REDUCE_DTYPE_ATTR = "_gridtune_reduce_dtype"


@dataclass(frozen=True, kw_only=True)
class MixedPrecision:
    """`compute_dtype`: the autocast dtype of forward and backward ("fp32" = no autocast);
    `reduce_dtype`: the dtype of the data-parallel gradient all-reduce."""

    compute_dtype: str = "fp32"
    reduce_dtype: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("compute_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value not in DTYPES:
                raise ValueError(f"{name} must be one of {sorted(DTYPES)}, got {value!r}")

    def autocast(self, device: torch.device) -> Any:
        return torch.autocast(device.type, dtype=DTYPES[self.compute_dtype],
                              enabled=self.compute_dtype != "fp32")

    def apply(self, model: nn.Module) -> nn.Module:
        """Make engine.sync_gradients (and the overlapped reducer) reduce `model`'s gradients in
        `reduce_dtype` (they are cast back to the parameters' fp32 afterwards)."""
        setattr(model, REDUCE_DTYPE_ATTR, DTYPES[self.reduce_dtype] if self.reduce_dtype != "fp32" else None)
        return model


def reduce_dtype_of(model: nn.Module) -> torch.dtype | None:
    return getattr(model, REDUCE_DTYPE_ATTR, None)


@dataclass(kw_only=True)
class LossScaler:
    """Dynamic loss scaling for fp16 (mutable: the scale changes during training)."""

    scale: float = 2.0 ** 16
    growth_interval: int = 2000
    _good_steps: int = field(default=0, repr=False)

    @torch.no_grad()
    def unscale_and_check(self, model: nn.Module, device: torch.device) -> bool:
        """Divide every gradient by the scale; True when all ranks' gradients are finite (then the
        step may run), False after halving the scale (skip the step). A world all-reduce."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)
        bad = torch.zeros((), device=device)
        for g in grads:
            if not torch.isfinite(g).all():
                bad += 1
                break
        if dist.is_initialized() and dist.get_world_size() > 1:
            # over the world: one rank skipping the step while others take it would split replicas
            dist.all_reduce(bad)
        if bad.item() > 0:
            self.scale /= 2.0
            self._good_steps = 0
            return False
        self._good_steps += 1
        if self._good_steps % self.growth_interval == 0:
            self.scale *= 2.0
        return True
