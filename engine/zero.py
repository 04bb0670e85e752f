"""ZeRO-1 and ZeRO-2: optimizer state (and gradients) sharded over G_data, as a real
`torch.optim.Optimizer`.

    opt = engine.ZeroOptimizer(model, torch.optim.AdamW, lr=1e-3)      # or model.parameters() / groups
    opt = engine.ZeroOptimizer(model, torch.optim.AdamW, stage=2, offload=True, lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)                     # schedulers see opt.param_groups
    loss = engine.forward_backward(...)
    engine.step(model, opt, max_grad_norm=1.0)   # depth reductions + 1/(G_data*G_d) scaling, clip, step
    opt.zero_grad()

All of this rank's trainable parameters (group by group) are viewed as one flat vector, padded with
zeros to a multiple of G_data; data rank i owns the i-th equal segment, and the wrapped optimizer
only ever sees that segment (one shard tensor per parameter group it overlaps, with that group's
hyperparameters, copied from `opt.param_groups` at every step so LR schedulers work). Per step the
data group carries one reduce-scatter of the padded flat gradient and one all-gather of the padded
flat parameters (perfmodels.traffic: "dp_grad" reduce_scatter and "dp_param" all_gather, padded
the same way). Element-wise optimizers (SGD, Adam, AdamW) give exactly the unsharded result.

`engine.sync_gradients(model)` knows the model is sharded (it skips the data all-reduce), and
`engine.clip_grad_norm_` / `engine.grad_norm` reduce-scatter first and take the norm of the
reduced shards summed over data, so clipping uses the global norm on every rank.
One ZeroOptimizer per set of parameters: the newest one built over a parameter is the one
sync_gradients and the norm functions consult.
`step()` releases the full gradients (p.grad = None, as zero_grad(set_to_none=True) does) before
the parameters are all-gathered, so the two never coexist; at most one full-size flat buffer (the
reduce-scatter's input, then the all-gather's output) exists at a time.
`stage=2` (ZeRO-2) also makes the gradients views of one padded flat buffer per space at
`zero_grad()` (autograd accumulates into it; Megatron-Core's `main_grad` views of its bucket
buffers), which the reduce-scatter consumes in place and then drops, so the step never holds the
gradients and a flat copy of them at once (a gradient replaced since, e.g. by `model.zero_grad()`,
falls back to the copy). It frees every full gradient as soon as the reduce-scatter has read it: only
this rank's 1/G_data shard of the gradient lives on through clipping and the optimizer step, so
the gradient memory between backward and the next backward is 1/G_data of ZeRO-1's. The
communication is ZeRO-1's (one reduce-scatter per step after the last micro-batch, as Megatron-Core's
distributed optimizer does; perfmodels' `Stack.zero2_grad_reduce="per_step"`, the gridtune
stack's). ZeRO-3 (parameters sharded too) is engine.zero3.
`offload="optimizer"` (or True) keeps the shards, their gradients and the optimizer state in host
memory (the optimizer step runs on the CPU; only the reduced gradient shard goes down and the
updated parameter shard comes back up), DeepSpeed's `offload_optimizer`. `offload="params"`
(parameters kept in host memory between uses, DeepSpeed's `offload_param`) needs ZeRO-3
(engine.Zero3): ZeRO-1/2 keep every full parameter on the device for the forward, so it is refused
(`offload_mode`).
MoE expert weights (engine.moe; `engine.grads.is_expert`) are split over ep/etp and replicated
only over the expert-data group, so they form a second flat space sharded over "edp" (the data
group when the grid has no expert groups), as Megatron-Core's distributed optimizer keeps its
expert buffers over the expert-data-parallel group (megatron/core/distributed/
distributed_data_parallel.py, `expert_parallel_buffers`); each space gets its own reduce-scatter
and all-gather per step, and the global norm counts each expert shard once
(engine.grads.expert_power_sum).
`state_dict()` is this rank's (its shard of the state plus the hyperparameters); engine's
checkpoints store the unsharded per-parameter state instead, which reloads under any grid.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine.comm import all_gather_flat, all_gather_flat_into, group_rank, group_size, reduce_scatter_consumed
from engine.grads import ZERO_ATTR, ShardedGradNorm, flat_slice_pieces, is_expert, restore_hyperparameters
from engine.grid import Grid, grid_of


def offload_mode(offload: Any, *, zero3: bool) -> str | None:
    """The offload choice as None (nothing offloaded), "optimizer" (the optimizer's shards, their
    gradients and its state in host memory; the step runs on the CPU) or "params" ("optimizer" plus
    the parameter shards kept in host memory between uses; ZeRO-3 only). `True` keeps its old
    meaning, the most the stage offloads: "params" under ZeRO-3 (its parameter shards were always
    the optimizer's), "optimizer" under ZeRO-1/2. Raises ValueError naming the argument and value;
    no collective, so every rank raises before any."""
    if offload is None or offload is False or offload == "none":
        return None
    if offload is True:
        return "params" if zero3 else "optimizer"
    if isinstance(offload, str) and offload in ("optimizer", "params"):
        if offload == "params" and not zero3:
            raise ValueError("offload='params' needs ZeRO-3 (engine.Zero3, zero_stage=3): ZeRO-1/2 keep "
                             "the full parameters on the device; use offload='optimizer'")
        return offload
    raise ValueError(f"offload must be False, True, 'none', 'optimizer' or 'params', got {offload!r}")


class _Space:
    """One sharding domain of a ZeroOptimizer: some of its parameters (in parameter-group order)
    viewed as one flat vector zero-padded to a multiple of the size of `group`, whose member i owns
    the i-th equal segment. The dense parameters form one space over the data group; MoE expert
    weights (engine.grads.is_expert) another over the expert-data group, because they are split
    over ep/etp and replicated only there (Megatron-Core's distributed optimizer keeps one buffer
    per group the same way: megatron/core/distributed/distributed_data_parallel.py builds
    `expert_parallel_buffers` over the expert-data-parallel group beside the dense `buffers`)."""

    def __init__(self, params: list[torch.Tensor], group_index: list[int], group: Any, *, expert: bool,
                 num_groups: int) -> None:
        self.params, self.group, self.expert = params, group, expert
        self.numels = [p.numel() for p in params]
        total = sum(self.numels)
        world = group_size(group)
        self.padded = -(-total // world) * world
        self.segment = self.padded // world
        self.start = group_rank(group) * self.segment
        # (parameter group, flat start, flat end) of each group's run; the padding goes to the last run
        self.runs: list[tuple[int, int, int]] = []
        offset = 0
        for gi in range(num_groups):
            n = sum(m for m, g in zip(self.numels, group_index) if g == gi)
            if n:
                self.runs.append((gi, offset, offset + n))
            offset += n
        if self.runs:
            gi, a, _ = self.runs[-1]
            self.runs[-1] = (gi, a, self.padded)
        self.grad_buffer: torch.Tensor | None = None  # ZeRO-2: the gradients as views of one flat buffer
        self.param_buffer: torch.Tensor | None = None  # the parameters as views of one flat buffer

    def bind_params(self) -> None:
        """Make the parameters views of one padded flat buffer (same values), which the step's
        all-gather then writes in place: no full-size gathered copy beside the parameters
        (Megatron-Core's distributed optimizer all-gathers into its `param_data` buffer the same way:
        megatron/core/distributed/param_and_grad_buffer.py). Only for parameters of one dtype and
        device (else the step gathers into a separate buffer and copies, as before)."""
        if self.group is None or not self.params:
            return
        first = self.params[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in self.params):
            return
        buf = torch.zeros(self.padded, dtype=first.dtype, device=first.device)
        offset = 0
        with torch.no_grad():
            for p, n in zip(self.params, self.numels):
                view = buf[offset:offset + n].view_as(p)
                view.copy_(p.detach())
                p.data = view
                offset += n
        self.param_buffer = buf

    def params_in_buffer(self) -> bool:
        """Whether every parameter is still its view of `param_buffer` (nobody re-pointed one)."""
        return _views_of(self.param_buffer, [p.data for p in self.params], self.numels)

    def bucket_grads(self) -> None:
        """ZeRO-2: give every parameter a zeroed gradient that is a view of one padded flat buffer,
        so that autograd accumulates into it in place and the reduce-scatter reads it as is (no
        full-size copy beside the gradients). Megatron-Core's distributed optimizer does the same
        (megatron/core/distributed/param_and_grad_buffer.py: `main_grad` views of the bucket's
        `grad_data`), as does DDP's `gradient_as_bucket_view`."""
        if self.group is None or not self.params:
            return
        self.grad_buffer = buf = torch.zeros(self.padded, dtype=self.params[0].dtype,
                                             device=self.params[0].device)
        offset = 0
        for p, n in zip(self.params, self.numels):
            p.grad = buf[offset:offset + n].view_as(p)
            offset += n

    @property
    def end(self) -> int:
        return self.start + self.segment

    def grads_in_buffer(self) -> bool:
        """Whether every gradient is still its view of `grad_buffer` (autograd accumulated in place;
        nobody replaced or dropped one since `bucket_grads`)."""
        return _views_of(self.grad_buffer, [p.grad for p in self.params], self.numels)


def _views_of(buf: torch.Tensor | None, tensors: list[torch.Tensor | None], numels: list[int]) -> bool:
    """Whether tensors[i] is the i-th consecutive view of `buf` (of numels[i] elements)."""
    if buf is None:
        return False
    base = buf.untyped_storage().data_ptr()
    offset = 0
    for t, n in zip(tensors, numels):
        if t is None or t.untyped_storage().data_ptr() != base or t.storage_offset() != offset \
                or not t.is_contiguous():
            return False
        offset += n
    return True



class ZeroOptimizer(ShardedGradNorm, torch.optim.Optimizer):
    """ZeRO-1/2 (module docstring). MoE expert weights are sharded over the expert-data group, the
    other parameters over the data group (`_Space`)."""

    def __init__(self, params: nn.Module | Iterable[Any], optimizer_class: Any = torch.optim.AdamW, *,
                 grid: Grid | None = None, stage: int = 1, offload: bool | str | None = False,
                 **optimizer_kwargs: Any) -> None:
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2 (ZeRO-3 is engine.zero3.Zero3), got {stage!r}")
        self.offload = offload_mode(offload, zero3=False)  # None or "optimizer"
        self.stage = stage
        self.grid = grid_of(params, grid)
        self.state_device = torch.device("cpu") if self.offload else self.grid.device
        self.group = self.grid.comm_group("data")
        if isinstance(params, nn.Module):
            params = [p for p in params.parameters() if p.requires_grad]
        super().__init__(params, dict(optimizer_kwargs))
        self.params = [p for g in self.param_groups for p in g["params"]]
        group_index = [gi for gi, g in enumerate(self.param_groups) for _ in g["params"]]
        self.spaces: list[_Space] = []
        for expert, group in ((False, self.group), (True, self.grid.expert_comm_group("edp"))):
            members = [i for i, p in enumerate(self.params) if is_expert(p) == expert]
            if members or not expert:
                self.spaces.append(_Space([self.params[i] for i in members],
                                          [group_index[i] for i in members], group, expert=expert,
                                          num_groups=len(self.param_groups)))
        # one shard tensor per (space, parameter group) run that overlaps this rank's segment
        self.pieces: list[tuple[_Space, int, int, int]] = []  # (space, group index, flat start, flat end)
        inner_groups = []
        for space in self.spaces:
            for gi, g_start, g_end in space.runs:
                a, b = max(g_start, space.start), min(g_end, space.end)
                if a < b:
                    values = self._segment_of(space, list(space.params), a, b)
                    shard = nn.Parameter(values.to(self.state_device))
                    self.pieces.append((space, gi, a, b))
                    inner_groups.append({**self._hyper(self.param_groups[gi]), "params": [shard]})
        if not inner_groups:  # a rank whose whole segment is padding still needs an optimizer
            gi = len(self.param_groups) - 1
            space = self.spaces[0]
            self.pieces.append((space, gi, space.end, space.end))
            empty = nn.Parameter(torch.zeros(0, dtype=self.params[0].dtype, device=self.state_device))
            inner_groups.append({**self._hyper(self.param_groups[gi]), "params": [empty]})
        self.inner = optimizer_class(inner_groups, **optimizer_kwargs)
        # every hyperparameter the wrapped optimizer has (its defaults too: lr, betas, ...) is visible
        # in opt.param_groups, where LR schedulers and user code read and write them
        for key, value in self.inner.defaults.items():
            self.defaults.setdefault(key, value)
            for g in self.param_groups:
                g.setdefault(key, value)
        self._reduced = False
        for p in self.params:
            setattr(p, ZERO_ATTR, weakref.ref(self))
        for space in self.spaces:
            space.bind_params()

    def placement(self) -> dict[str, torch.device]:
        """Where each kind of model state lives: "params" (the full parameters the forward reads),
        "param_shards" (the optimizer's shards), "grad_shards" and "optimizer_state"."""
        return {"params": self.params[0].device, "param_shards": self.shards[0].device,
                "grad_shards": self.state_device, "optimizer_state": self.state_device}

    @staticmethod
    def _hyper(group: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in group.items() if k != "params"}

    @property
    def shards(self) -> list[torch.Tensor]:
        return [g["params"][0] for g in self.inner.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad; under ZeRO-2 the gradients then become zeroed views of one flat buffer
        per space (`_Space.bucket_grads`), which the reduce-scatter consumes in place."""
        super().zero_grad(set_to_none=set_to_none)
        if self.stage == 2:
            for space in self.spaces:
                space.bucket_grads()
        self._reduced = False

    def _segment_of(self, space: _Space, tensors: list[torch.Tensor | None], lo: int,
                    hi: int) -> torch.Tensor:
        """Elements [lo, hi) of `space`'s padded flat concatenation of `tensors` (None reads as
        zeros), built from the overlapping slices only: no full-size flat copy."""
        out = torch.zeros(hi - lo, dtype=self.params[0].dtype, device=self.grid.device)
        offset = 0
        for n, t in zip(space.numels, tensors):
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b and t is not None:
                out[a - lo:b - lo] = t.detach().reshape(-1)[a - offset:b - offset]
            offset += n
        return out

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Reduce-scatter each space's flat gradient over its group into the shards (once per step).

        Memory: one padded flat buffer is the reduce-scatter's input (a collective needs it
        contiguous); each gradient is copied in and, under ZeRO-2, freed right away, so the buffer
        replaces the gradients instead of doubling them. Nothing else full-size is allocated."""
        if self._reduced:
            return
        for space in self.spaces:
            if space.group is None:
                mine = self._segment_of(space, [p.grad for p in space.params], space.start, space.end)
            elif space.grads_in_buffer():  # ZeRO-2: the gradients are the buffer, reduced in place
                flat, space.grad_buffer = space.grad_buffer, None
                for p in space.params:
                    p.grad = None
                mine = reduce_scatter_consumed(flat, space.group)
                del flat
            else:
                flat = torch.zeros(space.padded, dtype=self.params[0].dtype, device=self.grid.device)
                offset = 0
                for p, n in zip(space.params, space.numels):
                    if p.grad is not None:
                        flat[offset:offset + n] = p.grad.reshape(-1)
                        if self.stage == 2:  # ZeRO-2: only the shard of the gradient lives on
                            p.grad = None
                    offset += n
                mine = reduce_scatter_consumed(flat, space.group)
                del flat
                space.grad_buffer = None  # (replaced gradients: the buffer is stale)
            for shard, (sp, _, a, b) in zip(self.shards, self.pieces):
                if sp is space:
                    piece = mine[a - space.start:b - space.start]
                    shard.grad = piece.to(self.state_device, copy=True) \
                        if len(self.pieces) > 1 or self.offload is not None else piece
        if self.stage == 2:
            for p in self.params:
                p.grad = None
        self._reduced = True

    def _weighted_pieces(self) -> tuple[list[torch.Tensor], list[float]]:
        """This rank's reduced dense gradient cut at parameter boundaries, each with 1 /
        (tensor-parallel ranks holding the same values)."""
        pieces, weights = [], []
        for shard, (space, _, a, b) in zip(self.shards, self.pieces):
            if b > a and not space.expert:
                more, w = flat_slice_pieces(shard.grad, a, b, space.params, space.numels, self.grid)
                pieces += more
                weights += w
        return pieces, weights

    def _expert_pieces(self) -> list[torch.Tensor] | None:
        if not any(space.expert for space in self.spaces):
            return None
        return [shard.grad for shard, (space, _, a, b) in zip(self.shards, self.pieces)
                if space.expert and b > a and shard.grad is not None]

    def _grad_shards(self) -> list[torch.Tensor]:
        return self.shards

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            raise ValueError("ZeroOptimizer.step does not take a closure (got one)")
        # the parameters are the truth (a checkpoint load or user code may have changed them);
        # only this rank's segment is read (no full-size flat copy of the parameters)
        for shard, (space, _, a, b) in zip(self.shards, self.pieces):
            if b > a:
                shard.copy_(self._segment_of(space, list(space.params), a, b))
        self.reduce_gradients()
        for inner, (_, gi, _, _) in zip(self.inner.param_groups, self.pieces):
            inner.update(self._hyper(self.param_groups[gi]))  # LR schedulers write to self.param_groups
        self.inner.step()
        # the full gradients are read (reduced into the shards): released now, as
        # zero_grad(set_to_none=True) would, so they do not sit beside the gathered parameters
        for p in self.params:
            p.grad = None
        for space in self.spaces:
            mine = torch.zeros(space.segment, dtype=self.params[0].dtype, device=self.grid.device)
            for shard, (sp, _, a, b) in zip(self.shards, self.pieces):
                if sp is space:
                    mine[a - space.start:b - space.start] = shard.detach().to(mine.device)
            if space.group is not None and space.params_in_buffer():
                # into the parameters themselves (they are views of the buffer): nothing full-size
                all_gather_flat_into(space.param_buffer, mine, space.group)
                continue
            # the gathered parameters are the one full-size temporary of the step
            full = all_gather_flat(mine, space.group)
            offset = 0
            for p, n in zip(space.params, space.numels):
                p.copy_(full[offset:offset + n].view_as(p))
                offset += n
            del full
        self._reduced = False
        return None

    # ---- state -------------------------------------------------------------------------------

    def _layout(self) -> list[dict[str, int]]:
        return [{"start": sp.start, "segment": sp.segment, "padded": sp.padded} for sp in self.spaces]

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard of the inner optimizer's state, plus every group's hyperparameters."""
        return {"inner": self.inner.state_dict(), "param_groups": [self._hyper(g) for g in self.param_groups],
                "zero": self._layout()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        zero = state_dict.get("zero", [])
        saved = [zero] if isinstance(zero, dict) else zero  # one dict: written before expert spaces
        if saved and saved != self._layout():
            raise ValueError(f"state_dict holds the ZeRO segments {saved} but this rank owns "
                             f"{self._layout()}; use engine.load_checkpoint to reshard")
        restore_hyperparameters(self.param_groups, state_dict["param_groups"], "state_dict")
        self.inner.load_state_dict(state_dict["inner"])

    def per_parameter_state(self) -> list[dict[str, Any]]:
        """The unsharded optimizer state, one dict per parameter (in `self.params` order), shaped like
        the parameter: what a plain optimizer would hold. A collective over each space's group."""
        keys: dict[str, Any] = {}
        for shard in self.shards:
            for key, value in self.inner.state.get(shard, {}).items():
                keys.setdefault(key, value)
        out: dict[int, dict[str, Any]] = {id(p): {} for p in self.params}
        for key, sample in keys.items():
            if isinstance(sample, torch.Tensor) and sample.dim() > 0:
                for space in self.spaces:
                    mine = torch.zeros(space.segment, dtype=sample.dtype, device=self.grid.device)
                    for shard, (sp, _, a, b) in zip(self.shards, self.pieces):
                        value = self.inner.state.get(shard, {}).get(key)
                        if sp is space and value is not None and b > a:
                            mine[a - space.start:b - space.start] = value.detach().to(mine.device)
                    full = all_gather_flat(mine, space.group)
                    offset = 0
                    for p, n in zip(space.params, space.numels):
                        out[id(p)][key] = full[offset:offset + n].view_as(p).clone()
                        offset += n
            else:
                for entry in out.values():
                    entry[key] = sample.clone() if isinstance(sample, torch.Tensor) else sample
        return [out[id(p)] for p in self.params]

    def load_per_parameter_state(self, states: list[dict[str, Any]]) -> None:
        """Inverse of `per_parameter_state`: keep this rank's segment of each per-parameter tensor."""
        by_id = {id(p): entry for p, entry in zip(self.params, states)}
        keys = {k for entry in states for k in entry}
        target: list[dict[str, Any]] = [{} for _ in self.shards]
        for key in keys:
            values = [entry.get(key) for entry in states]
            if all(isinstance(v, torch.Tensor) and v.shape == p.shape for v, p in zip(values, self.params)):
                for space in self.spaces:
                    flat = torch.zeros(space.padded, dtype=self.shards[0].dtype, device=self.grid.device)
                    offset = 0
                    for p, n in zip(space.params, space.numels):
                        flat[offset:offset + n] = by_id[id(p)][key].reshape(-1).to(flat)
                        offset += n
                    for entry, (sp, _, a, b) in zip(target, self.pieces):
                        if sp is space:
                            entry[key] = flat[a:b].to(self.state_device, copy=True)
            else:
                value = next(v for v in values if v is not None)
                for entry in target:
                    entry[key] = value.clone() if isinstance(value, torch.Tensor) else value
        for shard, entry in zip(self.shards, target):
            self.inner.state[shard] = entry
