"""Full state dicts, per-rank checkpoints that reload under any grid (resharding), consolidated export.

- `full_state_dict(model)`: the unsharded parameters and buffers (CPU tensors) on every rank, with
  the keys and shapes of the unparallelized model's `state_dict()` (vocabulary padding removed).
  Each piece is contributed once (by the first member of every axis it is replicated over) and
  gathered over col, row, depth and pipeline stages only: never over data, never over the world.
- `save_checkpoint(dir, model, optimizer, step, scheduler=...)`: every rank writes its own file
  `dir/rank-XXXXX.pt`: data replica 0 its parameter/buffer pieces and, for AdamW-style optimizers,
  their per-parameter state; every rank its RNG states (torch CPU and CUDA, Python, NumPy), the
  optimizer's hyperparameters per group and the LR scheduler's state. Rank 0 adds `index.pt`
  (grid, placement, which tensors and shard specs each file holds). Nothing is gathered (ZeRO-1
  state excepted: it is gathered over data into the per-parameter form). `consolidated=True` (or
  `save_consolidated(file, model)`) also writes one single-process `state_dict` file that
  `GPT.load_state_dict` (or any unparallelized model) reads.
- `load_checkpoint(dir, model, optimizer, scheduler=...)`: every rank reads only the files whose
  pieces overlap its own shards (on the same grid: exactly one), assembles one tensor at a time,
  keeps its shard under the *current* grid, restores hyperparameters, scheduler and (same grid)
  its RNG states. Returns the saved step.

engine.MoE expert weights (split over ep and etp, replicated over the expert-data group) are
stored apart, each piece with its box in the unsplit MoEMLP tensor (`MoE.expert_boxes`) and written
by the first member of its expert-data group; a reader cuts its own box out of the pieces that
overlap it, so experts reload under any G_ep/G_etp (and into one process), optimizer state too.

Optimizer state is matched by parameter name (the model's `named_parameters()`), so it survives
resharding too; scalar state (AdamW's `step`) is copied as is. engine.ZeroOptimizer (ZeRO-1) state
is gathered over data into the same per-parameter form when saving and re-segmented when loading, so
checkpoints move freely between ZeRO-1 and plain optimizers and between grids.
"""

from __future__ import annotations

import os
import random
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.grads import restore_hyperparameters, zero_optimizer_of
from engine.grid import Grid, grid_of
from engine.shard import ShardSpec, spec_of
from engine.zero import ZeroOptimizer
from engine.zero3 import Zero3
from perfmodels.layout import rank_coords

Pieces = dict[str, tuple[ShardSpec | None, dict[str, int], torch.Tensor]]
INDEX = "index.pt"
CONSOLIDATED = "consolidated.pt"
TENSOR_AXES = ("depth", "row", "col")


def _file(path: str, rank: int) -> str:
    return os.path.join(path, f"rank-{rank:05d}.pt")


def _named_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, ShardSpec | None]]:
    """The model's state_dict entries (parameters and persistent buffers) and their shard specs."""
    state = model.state_dict(keep_vars=True)
    return state, {name: spec_of(t) for name, t in state.items()}


def _owner(spec: ShardSpec | None, grid: Grid) -> bool:
    """Whether this rank contributes the piece: first member of every axis it is replicated over."""
    axes = spec.replicated_axes() if spec is not None else TENSOR_AXES
    return all(grid.coord(a) == 0 for a in axes)


def _zero3_of(model: nn.Module, optimizer: Any = None) -> Zero3 | None:
    """The engine.Zero3 sharding `model` (its parameters hold nothing between uses), if any."""
    if isinstance(optimizer, Zero3):
        return optimizer
    found = zero_optimizer_of(model)
    return found if isinstance(found, Zero3) else None


class _Materialized:
    """Under ZeRO-3: every unit gathered for the block (full local shards), the units that were not
    gathered before freed again at the end."""

    def __init__(self, zero3: Zero3 | None) -> None:
        self.zero3 = zero3

    def __enter__(self) -> None:
        if self.zero3 is not None:
            self.before = self.zero3.gathered()
            self.zero3.materialize()

    def __exit__(self, *exc: Any) -> None:
        if self.zero3 is not None:
            self.zero3.release(self.before)


Box = tuple[tuple[int, int], ...]
ExpertPieces = dict[str, tuple[tuple[int, ...], Box, torch.Tensor]]


def _expert_boxes(model: nn.Module) -> dict[str, tuple[tuple[int, ...], Box]]:
    """Every engine.MoE expert weight of `model` by state_dict name: (the unsplit MoEMLP's shape,
    this rank's box in it). Experts are split over ep (whole experts) and etp (FFN columns), which
    ShardSpec's row/col/depth layout does not describe, so checkpoints store them with explicit
    boxes instead (as torch.distributed.checkpoint stores chunk offsets beside each shard)."""
    from engine.moe import MoE

    out = {}
    for prefix, m in model.named_modules():
        if isinstance(m, MoE):
            for key, value in m.expert_boxes().items():
                out[f"{prefix}.{key}" if prefix else key] = value
    return out


def _writes_experts(grid: Grid) -> bool:
    """Whether this rank writes its expert pieces: the first member of its expert-data group (the
    experts' only replicas), whatever its data coordinate (with G_ep > 1 the ep group is made of
    data ranks, so "data replica 0 writes" would keep one ep rank's experts only)."""
    edp = grid.expert_comm_group("edp")
    return edp is None or dist.get_rank(edp) == 0


def _box_overlap(a: Box, b: Box) -> Box | None:
    box = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return box if all(lo < hi for lo, hi in box) else None


def _assemble_box(parts: list[tuple[tuple[int, ...], Box, torch.Tensor]], shape: tuple[int, ...], box: Box,
                  name: str, like: torch.Tensor) -> torch.Tensor | None:
    """This rank's `box` of expert tensor `name` from the saved pieces that overlap it (never the
    full tensor); None when no piece holds it."""
    out: torch.Tensor | None = None
    covered = 0
    for saved_shape, saved_box, piece in parts:
        if tuple(saved_shape) != tuple(shape):
            raise ValueError(f"checkpoint holds {name} with shape {tuple(saved_shape)}, the model "
                             f"{tuple(shape)} (a different number of experts or FFN size)")
        inter = _box_overlap(saved_box, box)
        if inter is None:
            continue
        if out is None:
            out = torch.zeros(tuple(hi - lo for lo, hi in box), dtype=piece.dtype)
        src = piece[tuple(slice(lo - s0, hi - s0) for (lo, hi), (s0, _) in zip(inter, saved_box))]
        out[tuple(slice(lo - m0, hi - m0) for (lo, hi), (m0, _) in zip(inter, box))] = src
        n = 1
        for lo, hi in inter:
            n *= hi - lo
        covered += n
    if out is None:
        return None
    if covered < out.numel():
        raise ValueError(f"checkpoint lacks part of {name} (this rank's box {box} is not covered)")
    return out.to(device=like.device, dtype=like.dtype).view_as(like)


def _gathered_experts(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every expert of each engine.MoE (gathered over etp and ep, a collective within the stage),
    under the unsplit model's names."""
    from engine.moe import MoE

    out = {}
    for prefix, m in model.named_modules():
        if isinstance(m, MoE):
            for key, t in m.gather_experts().items():
                out[f"{prefix}.{key}" if prefix else key] = t
    return out


def _place_all(pieces_by_rank: list[tuple[dict[str, int], Pieces]]) -> dict[str, torch.Tensor]:
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


def full_state_dict(model: nn.Module, *, grid: Grid | None = None) -> dict[str, torch.Tensor]:
    """Unsharded parameters and buffers (CPU tensors) on every rank.

    A collective over col, row, depth and pipeline stages (each data replica assembles its own)."""
    grid = grid_of(model, grid)
    with _Materialized(_zero3_of(model)):
        state, specs = _named_tensors(model)
        state.update(_gathered_experts(model))
        mine: Pieces = {name: (specs[name], dict(grid.coords), t.detach().cpu().clone())
                        for name, t in state.items() if _owner(specs[name], grid)}
    gathered: list[tuple[dict[str, int], Pieces]] = [(dict(grid.degrees), mine)]
    # axis by axis, each gather carrying what the previous axes collected: never over data
    # (replicas hold the same pieces) and never a world-sized gather
    for axis in ("col", "row", "depth", "inter"):
        group = grid.comm_group(axis)
        if group is None:
            continue
        box: list[Any] = [None] * grid.size(axis)
        dist.all_gather_object(box, gathered, group=group)
        gathered = [item for part in box for item in part]
    full = _place_all(gathered)
    order = list(state)
    extra = {k: v for k, v in full.items() if k not in state}
    return {name: full[name] for name in order if name in full} | extra


def save_consolidated(file: str, model: nn.Module, *, grid: Grid | None = None) -> None:
    """One single-process state_dict file (rank 0 writes it); a collective like full_state_dict."""
    grid = grid_of(model, grid)
    full = full_state_dict(model, grid=grid)
    if grid.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
        torch.save(full, file)
    if grid.world_size > 1:
        dist.barrier()


def _optimizer_state_by_name(model: nn.Module, optimizer: Any) -> dict[str, dict[str, Any]]:
    """Per-parameter optimizer state keyed by parameter name (ZeRO-1: gathered over data first)."""
    by_id = {id(p): name for name, p in model.named_parameters()}
    if isinstance(optimizer, Zero3):
        return {by_id[i]: st for i, st in optimizer.per_parameter_state().items() if i in by_id}
    if isinstance(optimizer, ZeroOptimizer):
        return {by_id[id(p)]: st for p, st in zip(optimizer.params, optimizer.per_parameter_state())}
    out = {}
    for p, state in optimizer.state.items():
        if id(p) in by_id:
            out[by_id[id(p)]] = state
    return out


def _rng_state(grid: Grid) -> dict[str, Any]:
    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if grid.device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(grid.device)
    try:
        import numpy as np

        out["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with the project
        pass
    return out


def _restore_rng(state: dict[str, Any], grid: Grid) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and grid.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], grid.device)
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def _hyperparameters(optimizer: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def save_checkpoint(path: str, model: nn.Module, optimizer: Any = None, step: int = 0, *,
                    scheduler: Any = None, grid: Grid | None = None, consolidated: bool = False) -> None:
    """Every rank writes its own file (data replica 0 with the model and optimizer pieces), rank 0
    the index; every rank returns after a barrier. `consolidated=True` also writes
    `dir/consolidated.pt` (the single-process state_dict)."""
    grid = grid_of(model, grid)
    with _Materialized(_zero3_of(model, optimizer)):
        _save_pieces(path, model, optimizer, step, scheduler, grid)
    if consolidated:
        save_consolidated(os.path.join(path, CONSOLIDATED), model, grid=grid)
    if grid.world_size > 1:
        dist.barrier()


def _save_pieces(path: str, model: nn.Module, optimizer: Any, step: int, scheduler: Any, grid: Grid) -> None:
    # every rank takes part (ZeRO-1/3 gather their state over data); data replica 0 writes the pieces
    states = _optimizer_state_by_name(model, optimizer) if optimizer is not None else {}
    os.makedirs(path, exist_ok=True)
    state, specs = _named_tensors(model)
    boxes = _expert_boxes(model)
    model_pieces: Pieces = {}
    optim: dict[str, Pieces] = {}
    scalars: dict[str, dict[str, Any]] = {}
    experts: ExpertPieces = {}
    optim_experts: dict[str, ExpertPieces] = {}
    params = dict(model.named_parameters())
    if boxes and _writes_experts(grid):  # each expert piece once: the first of its replicas
        experts = {name: (*boxes[name], state[name].detach().cpu().clone()) for name in boxes}
        for name in boxes:
            for key, value in states.get(name, {}).items():
                if isinstance(value, torch.Tensor) and value.shape == params[name].shape and value.dim() > 0:
                    optim_experts.setdefault(key, {})[name] = (*boxes[name], value.detach().cpu().clone())
                else:
                    copy = value.clone() if isinstance(value, torch.Tensor) else value
                    scalars.setdefault(name, {})[key] = copy
    if grid.coord("data") == 0:
        model_pieces = {name: (specs[name], dict(grid.coords), t.detach().cpu().clone())
                        for name, t in state.items() if name not in boxes}
        for name, st in states.items():
            if name in boxes:
                continue
            for key, value in st.items():
                if isinstance(value, torch.Tensor) and value.shape == params[name].shape and value.dim() > 0:
                    optim.setdefault(key, {})[name] = (spec_of(params[name]), dict(grid.coords),
                                                        value.detach().cpu().clone())
                else:
                    copy = value.clone() if isinstance(value, torch.Tensor) else value
                    scalars.setdefault(name, {})[key] = copy
    payload = {"degrees": dict(grid.degrees), "coords": dict(grid.coords), "step": int(step),
               "model": model_pieces, "experts": experts, "optim_experts": optim_experts,
               "optim": optim, "scalars": scalars, "rng": _rng_state(grid),
               "param_groups": _hyperparameters(optimizer) if optimizer is not None else None,
               "scheduler": scheduler.state_dict() if scheduler is not None else None}
    torch.save(payload, _file(path, grid.rank))
    # the index: which tensors (and specs) each file holds, so a reader opens only what it needs
    entry = ({name: spec for name, (spec, _, _) in model_pieces.items()},
             {name: (shape, box) for name, (shape, box, _) in experts.items()})
    entries: list[Any] = [None] * grid.world_size
    if grid.world_size > 1:
        dist.all_gather_object(entries, entry)
    else:
        entries = [entry]
    if grid.rank == 0:
        torch.save({"degrees": dict(grid.degrees), "placement": tuple(grid.placement),
                    "world_size": grid.world_size, "step": int(step),
                    "files": {r: e[0] for r, e in enumerate(entries) if e[0]},
                    "expert_files": {r: e[1] for r, e in enumerate(entries) if e[1]}},
                   os.path.join(path, INDEX))


def _bounds(spec: ShardSpec, coords: dict[str, int], degrees: dict[str, int]) -> tuple[tuple[int, int], ...]:
    """A box (per dim: start, stop) of the padded full tensor that contains the piece at `coords`."""
    shape = spec.padded_shape
    slices = spec.block_slices(coords, degrees)
    box = [(s.start or 0, s.stop if s.stop is not None else n) for s, n in zip(slices, shape)]
    if spec.depth_flat and degrees["depth"] > 1:
        block = spec.block_shape(degrees)
        width = 1
        for n in block[1:]:
            width *= n
        per = block[0] * width // degrees["depth"]
        f0, f1 = coords["depth"] * per, (coords["depth"] + 1) * per
        r0 = box[0][0]
        box[0] = (r0 + f0 // width, r0 + (f1 - 1) // width + 1)
    return tuple(box)


def _overlaps(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    return all(max(x0, y0) < min(x1, y1) for (x0, x1), (y0, y1) in zip(a, b))


def _needed_expert_files(index: dict[str, Any], boxes: dict[str, tuple[tuple[int, ...], Box]]) -> list[int]:
    """Saved ranks whose expert pieces overlap this rank's expert boxes."""
    needed = []
    for rank, entry in sorted(index.get("expert_files", {}).items()):
        if any(name in boxes and _box_overlap(box, boxes[name][1]) is not None
               for name, (_, box) in entry.items()):
            needed.append(rank)
    return needed


def _needed_files(index: dict[str, Any], specs: dict[str, ShardSpec | None], grid: Grid) -> list[int]:
    """Saved ranks whose (non-expert) pieces overlap this rank's (conservative boxes)."""
    saved_degrees = index["degrees"]
    placement = tuple(index["placement"])
    if saved_degrees == grid.degrees and placement == tuple(grid.placement):  # same grid: own counterpart
        from perfmodels.layout import rank_of

        return [rank_of({**grid.coords, "data": 0}, saved_degrees, placement)]
    needed = []
    for rank, entry in sorted(index["files"].items()):
        coords = rank_coords(rank, saved_degrees, placement)
        for name, saved_spec in entry.items():
            if name not in specs:
                continue
            spec = specs[name]
            if saved_spec is None or spec is None:
                if all(coords[a] == 0 for a in TENSOR_AXES):  # replicated: the first copy is enough
                    needed.append(rank)
                    break
                continue
            if any(coords[a] != 0 for a in saved_spec.replicated_axes()):
                continue  # a copy of what the first member of that axis saved
            mine = _bounds(spec, grid.coords, grid.degrees)
            if _overlaps(_bounds(saved_spec, coords, saved_degrees), mine):
                needed.append(rank)
                break
    return needed


def _shard_for(full: torch.Tensor, t: torch.Tensor, spec: ShardSpec | None, grid: Grid) -> torch.Tensor:
    local = full if spec is None else spec.shard(full, grid.coords, grid.degrees)
    return local.to(device=t.device, dtype=t.dtype).view_as(t)


def _local_tensors(payloads: list[dict[str, Any]], key: str, name: str, t: torch.Tensor,
                   spec: ShardSpec | None, grid: Grid, optim_key: str | None = None) -> torch.Tensor | None:
    """This rank's piece of tensor `name` from the loaded files (one full tensor at a time)."""
    parts = []
    for pl in payloads:
        pieces = pl[key] if optim_key is None else pl[key].get(optim_key, {})
        if name in pieces:
            parts.append((pl["degrees"], {name: pieces[name]}))
    if not parts:
        return None
    saved_spec, coords, local = parts[0][1][name]
    if saved_spec == spec and parts[0][0] == grid.degrees and coords == grid.coords:
        return local.to(device=t.device, dtype=t.dtype).view_as(t)  # same grid: the piece itself
    full = _place_all(parts)[name]
    return _shard_for(full, t, spec, grid)


def load_checkpoint(path: str, model: nn.Module, optimizer: Any = None, *, scheduler: Any = None,
                    grid: Grid | None = None, restore_rng: bool = True) -> int:
    """Load pieces saved under any grid into this rank's shards; returns the saved step."""
    grid = grid_of(model, grid)
    index_path = os.path.join(path, INDEX)
    if not os.path.exists(index_path):
        raise FileNotFoundError(f"no checkpoint index {index_path} (written by engine.save_checkpoint)")
    index = torch.load(index_path, weights_only=False)
    # under ZeRO-3 the parameters hold nothing between uses: load into the gathered units, which
    # become the shards at the next forward or step (Zero3.materialize)
    zero3 = _zero3_of(model, optimizer)
    if zero3 is not None:
        zero3.materialize()
    state, specs = _named_tensors(model)
    boxes = _expert_boxes(model)
    dense_specs = {name: spec for name, spec in specs.items() if name not in boxes}
    ranks = sorted(set(_needed_files(index, dense_specs, grid)) | set(_needed_expert_files(index, boxes)))
    payloads = [torch.load(_file(path, r), weights_only=False) for r in ranks]
    available = {name for pl in payloads for name in (*pl["model"], *pl.get("experts", {}))}
    missing = sorted(set(state) - available)
    if missing:
        raise KeyError(f"checkpoint {path} lacks {missing}")
    with torch.no_grad():
        for name, t in state.items():
            if name in boxes:
                local = _expert_local(payloads, "experts", name, t, boxes[name])
            else:
                local = _local_tensors(payloads, "model", name, t, specs[name], grid)
            assert local is not None
            t.copy_(local)
    own = _file(path, grid.rank)
    same_grid = index["degrees"] == grid.degrees and tuple(index["placement"]) == tuple(grid.placement)
    mine = next((pl for r, pl in zip(ranks, payloads) if r == grid.rank), None)
    if mine is None and os.path.exists(own):
        mine = torch.load(own, weights_only=False)
    meta = mine if mine is not None else payloads[0]
    if optimizer is not None:
        _load_optimizer(payloads, model, optimizer, grid)
        if meta.get("param_groups") is not None:
            restore_hyperparameters(optimizer.param_groups, meta["param_groups"], f"checkpoint {path}")
    if scheduler is not None:
        if meta.get("scheduler") is None:
            raise ValueError(f"checkpoint {path} holds no LR scheduler state (saved without scheduler=)")
        scheduler.load_state_dict(meta["scheduler"])
    if restore_rng and same_grid and mine is not None and "rng" in mine:
        _restore_rng(mine["rng"], grid)
    return int(index["step"])


def _expert_local(payloads: list[dict[str, Any]], key: str, name: str, t: torch.Tensor,
                  box: tuple[tuple[int, ...], Box], optim_key: str | None = None) -> torch.Tensor | None:
    """This rank's box of expert tensor `name` (a parameter, or its optimizer state `optim_key`)."""
    parts = []
    for pl in payloads:
        pieces = pl.get(key, {}) if optim_key is None else pl.get(key, {}).get(optim_key, {})
        if name in pieces:
            parts.append(pieces[name])
    return _assemble_box(parts, box[0], box[1], name, t) if parts else None


def _load_optimizer(payloads: list[dict[str, Any]], model: nn.Module, optimizer: Any, grid: Grid) -> None:
    params = dict(model.named_parameters())
    boxes = _expert_boxes(model)
    keys = sorted({k for pl in payloads for k in (*pl["optim"], *pl.get("optim_experts", {}))})
    scalars: dict[str, dict[str, Any]] = {}
    for pl in payloads:
        scalars.update(pl["scalars"])
    per_param: dict[str, dict[str, Any]] = {name: {} for name in params}
    for key in keys:
        for name, p in params.items():
            if name in boxes:
                local = _expert_local(payloads, "optim_experts", name, p, boxes[name], optim_key=key)
            else:
                local = _local_tensors(payloads, "optim", name, p, spec_of(p), grid, optim_key=key)
            if local is not None:
                per_param[name][key] = local.clone()
    for name in params:
        for key, value in scalars.get(name, {}).items():
            per_param[name][key] = value.clone() if isinstance(value, torch.Tensor) else value
    if isinstance(optimizer, Zero3):
        optimizer.load_per_parameter_state({id(p): per_param[name] for name, p in params.items()
                                            if per_param[name]})
    elif isinstance(optimizer, ZeroOptimizer):
        names = {id(p): name for name, p in params.items()}
        optimizer.load_per_parameter_state([per_param[names[id(p)]] for p in optimizer.params])
    else:
        for name, p in params.items():
            if per_param[name]:
                optimizer.state[p].update(per_param[name])
