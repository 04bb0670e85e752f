"""Full state dicts and sharded checkpoints that reload under any grid (resharding).

- `full_state_dict(model)`: the unsharded tensors on every rank, with the keys and shapes of the
  unparallelized model's `state_dict()` (vocabulary padding removed). Built from every rank's
  pieces and their `ShardSpec`s (engine.shard), so it needs no knowledge of the layers.
- `save_checkpoint(dir, model, optimizer, step)`: every rank of data replica 0 writes its own
  pieces (parameters and, for AdamW-style optimizers, their per-parameter state) with the grid
  degrees and its coordinates to `dir/rank-XXXXX.pt`; nothing is gathered.
- `load_checkpoint(dir, model, optimizer)`: every rank reads the pieces it overlaps with (all
  files, for simplicity), reassembles full tensors and keeps its own shard under the *current*
  grid, so a checkpoint saved on one grid loads on another. Returns the saved step.

Optimizer state is matched by parameter name (the model's `named_parameters()`), so it survives
resharding too; scalar state (AdamW's `step`) is copied as is. engine.ZeroOptimizer (ZeRO-1) state
is gathered over data into the same per-parameter form when saving and re-segmented when loading, so
checkpoints move freely between ZeRO-1 and plain optimizers and between grids.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.grid import Grid, current_grid
from engine.shard import ShardSpec, spec_of
from engine.zero import ZeroOptimizer

Pieces = dict[str, tuple[ShardSpec | None, dict[str, int], torch.Tensor]]


def _assemble(pieces_by_rank: list[tuple[dict[str, int], Pieces]]) -> dict[str, torch.Tensor]:
    full: dict[str, torch.Tensor] = {}
    specs: dict[str, ShardSpec | None] = {}
    for degrees, pieces in pieces_by_rank:
        for name, (spec, coords, local) in pieces.items():
            if spec is None:
                full.setdefault(name, local.clone())
                specs[name] = None
                continue
            if name not in full:
                full[name] = torch.zeros(spec.padded_shape, dtype=local.dtype)
                specs[name] = spec
            spec.place(full[name], local, coords, degrees)
    return {name: (t if specs[name] is None else specs[name].trim(t)) for name, t in full.items()}


def _local_pieces(named: dict[str, torch.Tensor], params: dict[str, torch.Tensor], grid: Grid) -> Pieces:
    return {name: (spec_of(params[name]), dict(grid.coords), t.detach().cpu().clone()) for name, t in named.items()}


def full_state_dict(model: nn.Module, *, grid: Grid | None = None) -> dict[str, torch.Tensor]:
    """Unsharded parameters (CPU tensors) on every rank; a collective over the whole world."""
    grid = current_grid(grid)
    params = dict(model.named_parameters())
    mine = _local_pieces(params, params, grid) if grid.coord("data") == 0 else {}
    gathered: list[Any] = [None] * grid.world_size
    if grid.world_size > 1:
        dist.all_gather_object(gathered, (grid.degrees, mine))
    else:
        gathered = [(grid.degrees, mine)]
    return _assemble(gathered)


def _optimizer_state_by_name(model: nn.Module, optimizer: Any) -> dict[str, dict[str, Any]]:
    """Per-parameter optimizer state keyed by parameter name (ZeRO-1: gathered over data first)."""
    by_id = {id(p): name for name, p in model.named_parameters()}
    if isinstance(optimizer, ZeroOptimizer):
        return {by_id[id(p)]: st for p, st in zip(optimizer.params, optimizer.per_parameter_state())}
    out = {}
    for p, state in optimizer.state.items():
        if id(p) in by_id:
            out[by_id[id(p)]] = state
    return out


def save_checkpoint(path: str, model: nn.Module, optimizer: Any, step: int, *,
                    grid: Grid | None = None) -> None:
    """Each rank of data replica 0 writes its own pieces; every rank returns after a barrier."""
    grid = current_grid(grid)
    # every rank takes part (ZeRO-1 gathers its state over data); data replica 0 writes
    states = _optimizer_state_by_name(model, optimizer) if optimizer is not None else {}
    if grid.coord("data") == 0:
        os.makedirs(path, exist_ok=True)
        params = dict(model.named_parameters())
        model_pieces = _local_pieces(params, params, grid)
        optim: dict[str, Pieces] = {}
        scalars: dict[str, dict[str, Any]] = {}
        if optimizer is not None:
            for name, state in states.items():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.shape == params[name].shape and value.dim() > 0:
                        optim.setdefault(key, {})[name] = (spec_of(params[name]), dict(grid.coords),
                                                            value.detach().cpu().clone())
                    else:
                        scalars.setdefault(name, {})[key] = value.clone() if isinstance(value, torch.Tensor) else value
        payload = {"degrees": dict(grid.degrees), "step": int(step), "model": model_pieces, "optim": optim,
                   "scalars": scalars}
        torch.save(payload, os.path.join(path, f"rank-{grid.rank:05d}.pt"))
    if grid.world_size > 1:
        dist.barrier()


def load_checkpoint(path: str, model: nn.Module, optimizer: Any = None, *,
                    grid: Grid | None = None) -> int:
    """Load pieces saved under any grid into this rank's shards; returns the saved step."""
    grid = current_grid(grid)
    files = sorted(f for f in os.listdir(path) if f.startswith("rank-") and f.endswith(".pt"))
    payloads = [torch.load(os.path.join(path, f), weights_only=False) for f in files]
    if not payloads:
        raise FileNotFoundError(f"no rank-*.pt checkpoint files in {path}")
    full = _assemble([(p["degrees"], p["model"]) for p in payloads])
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(full))
    if missing:
        raise KeyError(f"checkpoint {path} lacks parameters {missing}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(_shard_for(full[name], p, grid))
    if optimizer is not None:
        keys = sorted({k for pl in payloads for k in pl["optim"]})
        scalars = {}
        for pl in payloads:
            scalars.update(pl["scalars"])
        per_param: dict[str, dict[str, Any]] = {name: {} for name in params}
        for key in keys:
            full_state = _assemble([(pl["degrees"], pl["optim"].get(key, {})) for pl in payloads])
            for name, p in params.items():
                if name in full_state:
                    per_param[name][key] = _shard_for(full_state[name], p, grid).clone()
        for name in params:
            for key, value in scalars.get(name, {}).items():
                per_param[name][key] = value.clone() if isinstance(value, torch.Tensor) else value
        if isinstance(optimizer, ZeroOptimizer):
            names = {id(p): name for name, p in params.items()}
            optimizer.load_per_parameter_state([per_param[names[id(p)]] for p in optimizer.params])
        else:
            for name, p in params.items():
                if per_param[name]:
                    optimizer.state[p].update(per_param[name])
    return int(payloads[0]["step"])


def _shard_for(full: torch.Tensor, p: torch.Tensor, grid: Grid) -> torch.Tensor:
    spec = spec_of(p)
    local = full if spec is None else spec.shard(full, grid.coords, grid.degrees)
    return local.to(device=p.device, dtype=p.dtype).view_as(p)
