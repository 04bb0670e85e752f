"""ZeRO-3 over the data axis, composed with the engine's row/col tensor parallelism.

    model = engine.ParallelGPT(cfg, grid)                  # or engine.wrap(any net)
    opt = engine.Zero3(model, torch.optim.AdamW, lr=1e-3)  # parameters, gradients, state: 1/G_data each
    loss = engine.forward_backward(model, tokens, targets, micro_batch_size=2)
    engine.step(model, opt, max_grad_norm=1.0)
    opt.materialize()                                      # full local shards again (checkpoints, eval)

The model's parameters are grouped into units (the built-in GPT: the embeddings, each block, the
final norm with the head; any other net: each module that owns parameters). Each unit's local
parameters are one flat vector zero-padded to a multiple of G_data; data rank i keeps the i-th
equal segment and the parameters hold nothing between uses.
Per micro-batch each unit is all-gathered over data before its forward and again before its
backward (from a hook on its outputs' gradients), and its gradient is reduce-scattered over data as
soon as autograd has accumulated all of it (post-accumulate-grad hooks), then freed. The optimizer
steps the shards only. Autograd's saved copies of the parameters are packed as (unit, offset,
shape) by saved-tensor hooks, so freeing a unit really frees it and backward reads the re-gathered
values. perfmodels.traffic (zero_stage=3, `Stack.zero3_gather="layer"`) predicts exactly these
calls and bytes: per micro-batch, per unit, two all-gathers and one reduce-scatter of the unit's
padded flat vector.

Why not torch FSDP2 (`fully_shard` on the data dimension of the mesh): FSDP2 replaces every
parameter by a new DTensor parameter, which drops the engine's shard specs (row/col/depth layout,
vocabulary padding) that gradient sync, global-norm clipping and checkpoints read; it divides
gradients by the data size itself, while the engine scales once by 1/(G_data*G_intra_d) after the
depth reduction; and it pads every parameter's first dimension separately, which is not the flat
per-unit layout perfmodels.traffic counts. With G_intra_d > 1 each unit's depth-replicated
gradients (biases, norms, embeddings) are all-reduced over depth right before the unit's data
reduce-scatter (one call per unit and micro-batch, as perfmodels.traffic counts for zero_stage=3).

Under a pipeline (G_inter > 1; engine.Pipeline or engine.BlockPipeline) a schedule interleaves the
forwards and backwards of many micro-batches, so per-micro-batch gathering would re-gather every
unit up to 2m times. There each stage's units are all-gathered once per step, before the
schedule's first micro-batch, and kept through the whole schedule (the schedule's gradients
accumulate in full); after its last micro-batch each unit's gradient is depth-reduced (G_intra_d >
1) and reduce-scattered over data once, and the unit is freed (resharded) until the next step:
per step and unit one all-gather and one reduce-scatter, what perfmodels.traffic counts for
zero_stage=3 with G_inter > 1 (`_grad_sync_events`) and perfmodels.memory's full-stage peak. The
pipeline calls `begin_pipeline_step` / `end_pipeline_step` itself (engine.pipeline.run_schedule).

MoE expert weights (engine.moe) are sharded over the expert-data group instead of data: a module
holding both (a block with an engine.MoE MLP) gets two units, one per group, gathered and freed
together (Megatron-Core's distributed optimizer shards expert parameters over the
expert-data-parallel group the same way). `hybrid_shard` cuts its groups from the data group and
is refused with experts (ValueError before any collective).

CPU offload (`offload=`, engine.zero.offload_mode):
- "optimizer" (DeepSpeed's `offload_optimizer` without `offload_param`): the optimizer's fp32
  shards, their gradients and its state live in host memory and the step runs on the CPU; each
  unit also keeps a device copy of its parameter shard (`_Unit.local`), which the all-gathers read
  and which the step refreshes from the host shard (one shard-sized copy down per unit and step).
- "params" or True (DeepSpeed's `offload_param` + `offload_optimizer`, FSDP's
  `CPUOffload(offload_params=True)`): the parameter shard *is* the host shard; each gather copies
  it to the device first, so between uses the device holds nothing of the unit.
`placement()` says where each kind of state lives.
"""

from __future__ import annotations

import datetime
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.comm import all_gather_flat, group_rank, group_size, reduce_scatter_consumed
from engine.grads import (
    ZERO_ATTR,
    ShardedGradNorm,
    flat_slice_pieces,
    is_expert,
    replicated_over_depth,
)
from engine.grid import Grid, grid_of
from engine.zero import offload_mode


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class _Unit:
    """One gather unit: its modules, its parameters as one padded flat vector, this rank's shard of
    it over `group` (the data group; for MoE expert weights, `expert=True`, the expert-data group:
    a module holding both gets two units)."""

    def __init__(self, owner: Zero3, modules: list[nn.Module], params: list[nn.Parameter], *,
                 group: Any, expert: bool = False) -> None:
        self.owner = owner
        self.modules, self.params = modules, params
        self.group, self.expert = group, expert
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        total = sum(self.numels)
        world = group_size(group)
        self.padded = -(-total // world) * world
        self.segment = self.padded // world
        start = self.start = group_rank(group) * self.segment
        flat = torch.zeros(self.padded, dtype=params[0].dtype, device=params[0].device)
        offset = 0
        for p, n in zip(params, self.numels):
            flat[offset:offset + n] = p.detach().reshape(-1)
            offset += n
        self.shard = nn.Parameter(flat[start:start + self.segment].to(owner.state_device, copy=True))
        # the parameter shard the gathers read: the optimizer's own shard, or (offload="optimizer")
        # a device copy of it refreshed after every step
        self.local: torch.Tensor = self.shard
        if owner.offload == "optimizer":
            self.local = flat[start:start + self.segment].to(owner.param_device, copy=True)
        # positions of depth-replicated parameters in the flat vector (their gradients need a depth sum)
        self.rep_index: torch.Tensor | None = None
        if owner.depth_group is not None:
            idx, offset = [], 0
            for p, n in zip(params, self.numels):
                if replicated_over_depth(p):
                    idx.append(torch.arange(offset, offset + n))
                offset += n
            if idx:
                self.rep_index = torch.cat(idx).to(params[0].device)
        self.full: torch.Tensor | None = None
        self.materialized = False  # gathered by materialize(): the user may change the values
        self.forwards_done = 0
        self.pending = sum(1 for p in params if p.requires_grad)
        self.free()

    def gather(self) -> None:
        """All-gather the unit over data (once until the next free) and point the parameters at it."""
        if self.full is not None:
            return
        with torch.no_grad():
            full = all_gather_flat(self.local.detach().to(self.owner.grid.device), self.group)
            offset = 0
            for p, n, shape in zip(self.params, self.numels, self.shapes):
                p.data = full[offset:offset + n].view(shape)
                offset += n
        self.full = full
        self.owner.live[full.untyped_storage().data_ptr()] = self
        self.owner.note_peak()

    @torch.no_grad()
    def write_back(self) -> None:
        """After materialize(): the gathered values (possibly changed by the user, a checkpoint load
        or load_state_dict) become this rank's shard again."""
        if self.materialized and self.full is not None:
            mine = self.full[self.start:self.start + self.segment]
            self.shard.data.copy_(mine.to(self.shard.device))
            if self.local is not self.shard:
                self.local.copy_(mine.to(self.local.device))
        self.materialized = False

    @torch.no_grad()
    def refresh_local(self) -> None:
        """offload="optimizer": the stepped host shard copied into the device shard the gathers read."""
        if self.local is not self.shard:
            self.local.copy_(self.shard.detach().to(self.local.device))

    def free(self) -> None:
        self.write_back()
        if self.full is not None:
            self.owner.live.pop(self.full.untyped_storage().data_ptr(), None)
        self.full = None
        for p in self.params:
            p.data = p.data.new_empty(0)

    def reduce(self) -> None:
        """Reduce-scatter the unit's accumulated gradient over data into the shard's gradient."""
        self.owner.note_peak()
        device = self.owner.grid.device
        flat = torch.zeros(self.padded, dtype=self.shard.dtype, device=device)
        offset = 0
        for p, n in zip(self.params, self.numels):
            if p.grad is not None:
                flat[offset:offset + n] = p.grad.reshape(-1)
            offset += n
        if self.rep_index is not None:  # depth-replicated parameters saw other samples on each depth rank
            rep = flat[self.rep_index]
            dist.all_reduce(rep, group=self.owner.depth_group)
            flat[self.rep_index] = rep
        mine = reduce_scatter_consumed(flat, self.group)
        if self.owner.replica_group is not None and not self.expert:  # HybridShard: the shard groups' sums
            dist.all_reduce(mine, group=self.owner.replica_group)
        mine = mine.to(self.owner.state_device)
        if self.shard.grad is None:
            self.shard.grad = mine.clone() if mine is flat else mine
        else:
            self.shard.grad.add_(mine)
        for p in self.params:
            p.grad = None
        self.pending = sum(1 for p in self.params if p.requires_grad)
        self.free()


def _hybrid_groups(grid: Grid, shard: int) -> tuple[Any, Any]:
    """HybridShard (FSDP's and AxonML's name): ZeRO-3 within groups of `shard` consecutive data
    ranks, replicated across them. Returns (this rank's shard group, its replica group); every rank
    creates every group (new_subgroups_by_enumeration), before any training collective."""
    data = grid.comm_group("data")
    size = 1 if data is None else dist.get_world_size(data)
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 1 or size % shard:
        raise ValueError(f"hybrid_shard must be a positive divisor of the data group's {size} ranks "
                         f"(G_data*G_cp), got {shard!r}")
    if data is None or shard == size:
        return data, None
    mine = dist.get_process_group_ranks(data)
    everyone: list[Any] = [None] * grid.world_size
    dist.all_gather_object(everyone, mine)
    groups = sorted({tuple(g) for g in everyone})
    shards = [list(g[i:i + shard]) for g in groups for i in range(0, size, shard)]
    replicas = [list(g[o::shard]) for g in groups for o in range(shard)]
    timeout = None if grid.timeout_s is None else datetime.timedelta(seconds=grid.timeout_s)
    shard_group, _ = dist.new_subgroups_by_enumeration(shards, timeout=timeout)
    replica_group, _ = dist.new_subgroups_by_enumeration(replicas, timeout=timeout)
    dist.barrier()  # every rank has created every group before any goes on
    return shard_group, replica_group


def _units_of(model: nn.Module) -> list[list[nn.Module]]:
    from engine.parallel_gpt import ParallelGPT

    gpt = model if isinstance(model, ParallelGPT) else None
    if gpt is not None:
        units: list[list[nn.Module]] = []
        if gpt.has_embedding:
            units.append([gpt.tok_emb, gpt.pos_emb])
        units += [[gpt.blocks[k]] for k in gpt.blocks]
        if gpt.has_head:
            units.append([gpt.ln_f, gpt.head])
        return units
    return [[m] for m in model.modules() if any(True for _ in m.parameters(recurse=False))]


class Zero3(ShardedGradNorm, torch.optim.Optimizer):
    """ZeRO-3 as a `torch.optim.Optimizer` over `model` (see the module docstring).

    One parameter group (the optimizer keywords apply to all parameters); LR schedulers read and
    write `param_groups[0]`. `materialize()` gathers every unit and keeps it (for
    `engine.full_state_dict`, evaluation, checkpoints); the next forward frees them again.
    """

    def __init__(self, model: nn.Module, optimizer_class: Any = torch.optim.AdamW, *,
                 grid: Grid | None = None, offload: bool | str | None = False,
                 hybrid_shard: int | None = None,
                 **optimizer_kwargs: Any) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError("model must be an nn.Module (ZeRO-3 hooks its modules), "
                             f"got {type(model).__name__}")
        mode = offload_mode(offload, zero3=True)  # None, "optimizer" or "params"
        self.grid = grid_of(model, grid)
        has_experts = any(is_expert(p) for p in model.parameters() if p.requires_grad)
        if hybrid_shard is not None and has_experts:  # before _hybrid_groups' collectives
            raise ValueError(f"hybrid_shard={hybrid_shard!r}: HybridShard groups are cut from the data "
                             "group, but MoE expert weights are sharded over the expert-data group; "
                             "use hybrid_shard=None with engine.MoE")
        # under a pipeline: gathered once per step for the whole schedule (module docstring)
        self.pipelined = self.grid.size("inter") > 1
        self.model, self.offload = model, mode
        self.group = self.grid.comm_group("data")
        self.replica_group: Any = None
        if hybrid_shard is not None:
            self.group, self.replica_group = _hybrid_groups(self.grid, hybrid_shard)
        self.depth_group = self.grid.comm_group("depth")
        # the optimizer's shards, gradients and state; the parameter shards the gathers read
        self.state_device = torch.device("cpu") if mode is not None else self.grid.device
        self.param_device = torch.device("cpu") if mode == "params" else self.grid.device
        params = [p for p in model.parameters() if p.requires_grad]
        super().__init__(params, dict(optimizer_kwargs))
        self.live: dict[int, _Unit] = {}
        seen: set[int] = set()
        self.units: list[_Unit] = []
        self.unit_of: dict[int, _Unit] = {}
        for modules in _units_of(model):
            mine = []
            for m in modules:
                for p in m.parameters():
                    if p.requires_grad and id(p) not in seen:
                        seen.add(id(p))
                        mine.append(p)
            # dense parameters sharded over data, MoE experts over the expert-data group (as
            # Megatron-Core's distributed optimizer shards its expert buffers)
            for expert, group in ((False, self.group), (True, self.grid.expert_comm_group("edp"))):
                part = [p for p in mine if is_expert(p) == expert]
                if part:
                    unit = _Unit(self, modules, part, group=group, expert=expert)
                    self.units.append(unit)
                    for p in part:
                        self.unit_of[id(p)] = unit
        # modules using a parameter another unit owns (tied weights: GPT-2's head is the token
        # embedding's weight) gather that unit for their own forward and free it after
        self.borrowers: list[tuple[nn.Module, list[_Unit]]] = []
        covered = {id(u): {id(sub) for um in u.modules for sub in um.modules()} for u in self.units}
        for m in model.modules():
            owners: list[_Unit] = []
            for p in m.parameters(recurse=False):
                unit = self.unit_of.get(id(p))
                if unit is not None and id(m) not in covered[id(unit)] and unit not in owners:
                    owners.append(unit)
            if owners:
                self.borrowers.append((m, owners))
        missing = [p for p in params if id(p) not in seen]
        if missing:
            raise ValueError(f"{len(missing)} trainable parameters of {type(model).__name__} "
                             "belong to no module")
        self.inner = optimizer_class([{"params": [u.shard for u in self.units]}], **optimizer_kwargs)
        for key, value in self.inner.defaults.items():
            self.defaults.setdefault(key, value)
            self.param_groups[0].setdefault(key, value)
        self.peak_model_state_bytes = 0
        self._install_hooks()
        self._scaled = False
        for p in params:
            setattr(p, ZERO_ATTR, weakref.ref(self))

    # ---- memory ------------------------------------------------------------------------------

    def model_state_bytes(self) -> int:
        """Bytes of model states this rank holds now: parameter shards, their gradients, the
        optimizer state, plus the gathered units and their unreduced gradients."""
        total = 0
        for unit in self.units:
            total += _nbytes(unit.shard) + _nbytes(unit.shard.grad)
            if unit.local is not unit.shard:
                total += _nbytes(unit.local)
            if unit.full is not None:
                total += _nbytes(unit.full)
            total += sum(_nbytes(p.grad) for p in unit.params)
        for state in self.inner.state.values():
            total += sum(_nbytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        return total

    def placement(self) -> dict[str, torch.device]:
        """Where each kind of model state lives between uses: "param_shards" (what the all-gathers
        read), "optimizer_shards" (the fp32 shards the optimizer steps), "grad_shards",
        "optimizer_state"; and "gathered" (the all-gathered units, always the compute device)."""
        unit = self.units[0]
        return {"param_shards": unit.local.device, "optimizer_shards": unit.shard.device,
                "grad_shards": self.state_device, "optimizer_state": self.state_device,
                "gathered": self.grid.device}

    def note_peak(self) -> None:
        self.peak_model_state_bytes = max(self.peak_model_state_bytes, self.model_state_bytes())

    # ---- hooks -------------------------------------------------------------------------------

    def _install_hooks(self) -> None:
        if self.pipelined:  # a forward outside the schedule (evaluation) gathers what it uses, keeps it
            for unit in self.units:
                for m in unit.modules:
                    m.register_forward_pre_hook(lambda *_, u=unit: u.gather())
            for m, owners in self.borrowers:
                for unit in owners:
                    m.register_forward_pre_hook(lambda *_, u=unit: u.gather())
            return
        # While the model runs forward, autograd would keep the gathered parameters alive through
        # the tensors it saves; _pack replaces a view of a gathered unit by its coordinates, and
        # _unpack gathers the unit again in backward. Per unit: gather before its forward, free
        # after it (re-gathered by a hook on its output's gradient, before its backward), and
        # reduce-scatter once autograd has accumulated every parameter's gradient.
        saved = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self.model.register_forward_pre_hook(lambda *_: saved.__enter__())
        self.model.register_forward_hook(lambda *_: saved.__exit__(None, None, None))
        for unit in self.units:
            for m in unit.modules:
                m.register_forward_pre_hook(lambda *_, u=unit: u.gather())
                m.register_forward_hook(lambda _m, _i, out, u=unit: self._after_forward(u, out))
            for p in unit.params:
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda _p, u=unit: self._after_grad(u))
        for m, owners in self.borrowers:
            for unit in owners:
                m.register_forward_pre_hook(lambda *_, u=unit: u.gather())
                m.register_forward_hook(lambda _m, _i, out, u=unit: self._after_borrowed_forward(u, out))

    def _pack(self, t: torch.Tensor) -> Any:
        try:
            unit = self.live.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            return t
        if unit is None:
            return t
        return (unit, t.storage_offset(), tuple(t.shape), tuple(t.stride()))

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        unit, offset, shape, stride = packed
        unit.gather()
        assert unit.full is not None
        return unit.full.as_strided(shape, stride, offset)

    def _after_forward(self, unit: _Unit, out: Any) -> None:
        unit.forwards_done += 1
        if unit.forwards_done < len(unit.modules):
            return
        unit.forwards_done = 0
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t in outs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda g, u=unit: u.gather())
        unit.free()

    def _after_borrowed_forward(self, unit: _Unit, out: Any) -> None:
        """A module using another unit's (tied) parameter ran: free that unit again, re-gathered
        before the module's backward like after the unit's own forward."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t in outs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda g, u=unit: u.gather())
        unit.free()

    def _after_grad(self, unit: _Unit) -> None:
        unit.pending -= 1
        if unit.pending == 0:
            unit.reduce()

    # ---- pipeline: once per step ------------------------------------------------------------

    def begin_pipeline_step(self) -> None:
        """All-gather every unit of this stage over data (one call per unit), before the schedule's
        first micro-batch; the parameters stay gathered until `end_pipeline_step`."""
        for unit in self.units:
            unit.gather()

    @torch.no_grad()
    def end_pipeline_step(self) -> None:
        """After the schedule's last micro-batch: each unit's accumulated gradient depth-reduced and
        reduce-scattered over data (one call each per unit), then the unit freed."""
        for unit in self.units:
            unit.reduce()

    # ---- optimizer ---------------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        for unit in self.units:
            unit.shard.grad = None
        self._scaled = False

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Finish the step's gradients: reduce units not reduced yet (parameters without gradients
        this step), then scale by 1/(G_data*G_intra_d) once."""
        if self._scaled:
            return
        for unit in self.units:
            if unit.pending != sum(1 for p in unit.params if p.requires_grad) or unit.shard.grad is None:
                unit.reduce()
        for unit in self.units:
            unit.shard.grad.mul_(1.0 / self.grid.grad_shards)
        self._scaled = True

    def _weighted_pieces(self) -> tuple[list[torch.Tensor], list[float]]:
        pieces, weights = [], []
        for unit in self.units:
            if unit.expert:
                continue
            more, w = flat_slice_pieces(unit.shard.grad, unit.start, unit.start + unit.segment, unit.params,
                                        unit.numels, self.grid)
            pieces += more
            weights += w
        return pieces, weights

    def _expert_pieces(self) -> list[torch.Tensor] | None:
        experts = [unit for unit in self.units if unit.expert]
        if not experts:
            return None
        return [unit.shard.grad for unit in experts if unit.shard.grad is not None]

    def _norm_model(self, model: nn.Module | None) -> nn.Module | None:
        return model if model is not None else self.model

    def _grad_shards(self) -> list[torch.Tensor]:
        return [unit.shard for unit in self.units]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            raise ValueError("Zero3.step does not take a closure (got one)")
        for unit in self.units:  # values changed while materialized are the ones to update
            unit.write_back()
        self.reduce_gradients()
        hyper = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        self.inner.param_groups[0].update(hyper)
        self.inner.step()
        for unit in self.units:  # offload="optimizer": the device shards follow the host shards
            unit.refresh_local()
        self.note_peak()  # the optimizer state exists from the first step on
        for p in self.param_groups[0]["params"]:  # engine.sync_gradients leaves empty placeholders
            p.grad = None
        for unit in self.units:  # parameters gathered since (materialize) are stale now
            unit.free()
        self._scaled = False
        return None

    def materialize(self) -> None:
        """Gather every unit and keep it (a collective over data): full local shards for
        engine.full_state_dict, evaluation or a checkpoint. Values written into the parameters
        meanwhile (load_state_dict, engine.load_checkpoint, user code) become the shards at the
        next forward or step, which frees the units again."""
        for unit in self.units:
            unit.gather()
            unit.materialized = True

    def gathered(self) -> list[bool]:
        return [unit.full is not None for unit in self.units]

    def release(self, keep: list[bool]) -> None:
        """Free (writing back) the units not in `keep` (a `gathered()` taken before a materialize)."""
        for unit, k in zip(self.units, keep):
            if not k:
                unit.free()

    # ---- unsharded optimizer state (checkpoints) --------------------------------------------

    def per_parameter_state(self) -> dict[int, dict[str, Any]]:
        """The optimizer state as a plain optimizer holds it, keyed by id(parameter), each tensor
        shaped like the (local, tensor-parallel) parameter: a collective over data per unit."""
        out: dict[int, dict[str, Any]] = {}
        for unit in self.units:
            state = self.inner.state.get(unit.shard, {})
            entries: list[dict[str, Any]] = [{} for _ in unit.params]
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    full = all_gather_flat(value.detach().to(self.grid.device), unit.group)
                    offset = 0
                    for entry, n, shape in zip(entries, unit.numels, unit.shapes):
                        entry[key] = full[offset:offset + n].view(shape).clone()
                        offset += n
                else:
                    for entry in entries:
                        entry[key] = value.clone() if isinstance(value, torch.Tensor) else value
            for p, entry in zip(unit.params, entries):
                if entry:
                    out[id(p)] = entry
        return out

    def load_per_parameter_state(self, states: dict[int, dict[str, Any]]) -> None:
        """Inverse of `per_parameter_state`: keep this rank's segment of each unit's state."""
        for unit in self.units:
            mine = [states.get(id(p), {}) for p in unit.params]
            keys = {k for entry in mine for k in entry}
            target: dict[str, Any] = {}
            for key in keys:
                values = [entry.get(key) for entry in mine]
                if all(isinstance(v, torch.Tensor) and v.dim() > 0 for v in values):
                    flat = torch.zeros(unit.padded, dtype=unit.shard.dtype, device=self.grid.device)
                    offset = 0
                    for v, n in zip(values, unit.numels):
                        flat[offset:offset + n] = v.reshape(-1).to(flat)
                        offset += n
                    target[key] = flat[unit.start:unit.start + unit.segment].to(self.state_device, copy=True)
                else:
                    value = next(v for v in values if v is not None)
                    target[key] = value.clone() if isinstance(value, torch.Tensor) else value
            if target:
                self.inner.state[unit.shard] = target

    def state_dict(self) -> dict[str, Any]:
        hyper = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {"inner": self.inner.state_dict(), "param_groups": [hyper]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.param_groups[0].update(state_dict["param_groups"][0])
        self.inner.load_state_dict(state_dict["inner"])
