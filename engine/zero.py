"""ZeRO-1: optimizer state sharded over G_data.

    opt = engine.ZeroOptimizer(model, torch.optim.AdamW, lr=1e-3)
    loss = engine.forward_backward(...)
    engine.sync_gradients(model, data=False)   # depth reductions and the 1/(G_data*G_d) scaling
    opt.step()                                   # reduce-scatter grads, step the shard, all-gather params
    opt.zero_grad()

All of this rank's trainable parameters are viewed as one flat vector, padded with zeros to a
multiple of G_data; data rank i owns the i-th equal segment, and the wrapped optimizer only ever
sees that segment (so its state is 1/G_data of the usual). Per step the data group carries one
reduce-scatter of the padded flat gradient and one all-gather of the padded flat parameters
(perfmodels.traffic: "dp_grad" reduce_scatter and "dp_param" all_gather, padded the same way).
Element-wise optimizers (SGD, Adam, AdamW) give exactly the unsharded result.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.comm import all_gather_flat, group_rank, group_size, reduce_scatter_flat
from engine.grid import Grid, current_grid


class ZeroOptimizer:
    def __init__(self, model: nn.Module, optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW, *,
                 grid: Grid | None = None, **optimizer_kwargs: Any) -> None:
        self.grid = current_grid(grid)
        self.group = self.grid.group("data")
        self.params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in self.params)
        world = group_size(self.group)
        self.padded = -(-total // world) * world
        self.segment = self.padded // world
        start = group_rank(self.group) * self.segment
        flat = self._flat([p.detach() for p in self.params])
        self.shard = nn.Parameter(flat[start:start + self.segment].clone())
        self.start = start
        self.inner = optimizer_class([self.shard], **optimizer_kwargs)

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        if flat.numel() < self.padded:
            flat = torch.cat([flat, flat.new_zeros(self.padded - flat.numel())])
        return flat

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        # the parameters are the truth (a checkpoint load or user code may have changed them)
        flat_params = self._flat([p.detach() for p in self.params])
        self.shard.copy_(flat_params[self.start:self.start + self.segment])
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat_grad = self._flat(grads)
        if self.group is None:
            self.shard.grad = flat_grad[self.start:self.start + self.segment].clone()
        else:
            self.shard.grad = reduce_scatter_flat(flat_grad, self.group)
        self.inner.step()
        full = all_gather_flat(self.shard.detach(), self.group)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.copy_(full[offset:offset + n].view_as(p))
            offset += n

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    def per_parameter_state(self) -> list[dict[str, Any]]:
        """The unsharded optimizer state, one dict per parameter (in `self.params` order), shaped like
        the parameter: what a plain optimizer would hold. A collective over the data group."""
        state = self.inner.state.get(self.shard, {})
        out: list[dict[str, Any]] = [{} for _ in self.params]
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == self.shard.shape:
                full = all_gather_flat(value.detach(), self.group)
                offset = 0
                for i, p in enumerate(self.params):
                    out[i][key] = full[offset:offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
            else:
                for entry in out:
                    entry[key] = value.clone() if isinstance(value, torch.Tensor) else value
        return out

    def load_per_parameter_state(self, states: list[dict[str, Any]]) -> None:
        """Inverse of `per_parameter_state`: keep this rank's segment of each per-parameter tensor."""
        keys = {k for entry in states for k in entry}
        target: dict[str, Any] = {}
        for key in keys:
            values = [entry.get(key) for entry in states]
            if all(isinstance(v, torch.Tensor) and v.shape == p.shape for v, p in zip(values, self.params)):
                flat = self._flat([v.to(self.shard.dtype) for v in values])
                target[key] = flat[self.start:self.start + self.segment].clone()
            else:
                value = next(v for v in values if v is not None)
                target[key] = value.clone() if isinstance(value, torch.Tensor) else value
        self.inner.state[self.shard] = target
