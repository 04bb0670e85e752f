"""`GridtunePlugin`: train with Hugging Face Accelerate's loop on a gridtune grid (AxoNN's
`AxoNNPlugin` role).

    import engine
    from accelerate import Accelerator
    from engine.accelerate import GridtunePlugin

    plugin = GridtunePlugin(G_intra_r=2, G_intra_c=1, G_intra_d=1, G_data=2)   # engine.init on first use
    accelerator = Accelerator(cpu=True)          # after the grid: it reuses the process group
    model, optimizer, loader = plugin.prepare(model, optimizer, loader)   # not accelerator.prepare
    for x, y in loader:
        optimizer.zero_grad()
        with accelerator.autocast():
            loss = loss_fn(model(x.to(plugin.device)), y.to(plugin.device))
        accelerator.backward(loss)
        plugin.clip_grad_norm_(model, 1.0)      # optional; not accelerator.clip_grad_norm_
        optimizer.step()                         # gradients synchronized by the engine first

Processes come from `accelerate launch`, torchrun, srun or engine.launch. `prepare`:
- model: every nn.Linear whose shapes divide becomes an engine.Linear holding this rank's shard
  (`engine.parallelize`, same values as the model given: what `auto_parallelize` does at
  construction), moved to the grid's device and wrapped (`engine.wrap`: replicas broadcast, sync
  guard, overlapped data reduction);
- optimizer: the same class with the same parameter groups and hyperparameters, rebuilt over the
  parallelized parameters (matched by name); `zero_stage=1/2` wraps it in engine.ZeroOptimizer,
  `zero_stage=3` in engine.Zero3 (one parameter group), with `offload=` as there. Its `step()`
  first runs `engine.sync_gradients(model)` (data and depth reductions, 1/(G_data*G_intra_d)), so
  Accelerate's `optimizer.step()` gives the single-process update. It must not have stepped yet;
- dataloader: `engine.create_dataloader` over the same dataset, collate_fn and num_workers:
  `batch_size` samples per data replica (Accelerate's `split_batches=False`; the tensor-parallel
  ranks of a replica read the same samples), so the global batch is `batch_size * G_data *
  G_intra_d`; `split_batches=True` makes `batch_size` the global batch. A shuffling loader
  (RandomSampler) becomes a shuffling DistributedSampler (`seed`; call `loader.sampler.set_epoch`).

Why not `accelerator.prepare`: it would wrap the model in DistributedDataParallel over all ranks
(all-reducing tensor-parallel shards that differ) and shard the data over every rank. Use the
Accelerator for what is per rank: `backward`, `autocast`, `print`, `is_main_process`.
Needs `pip install gridtune[accelerate]`.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler

try:
    import accelerate
except ImportError as exc:  # pragma: no cover - the extra is optional
    raise ImportError("engine.accelerate needs Hugging Face Accelerate: "
                      "pip install gridtune[accelerate]") from exc


class GridtunePlugin:
    """The grid's degrees (AxoNN's names), ZeRO stage and offload; `prepare` builds the rest."""

    def __init__(self, *, G_inter: int = 1, G_data: int | None = None, G_intra_r: int = 1, G_intra_c: int = 1,
                 G_intra_d: int = 1, zero_stage: int = 0, offload: bool | str | None = False,
                 split_batches: bool = False, seed: int = 0) -> None:
        for name, value in (("G_inter", G_inter), ("G_intra_r", G_intra_r), ("G_intra_c", G_intra_c),
                            ("G_intra_d", G_intra_d), ("G_data", 1 if G_data is None else G_data)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if G_inter != 1:
            raise ValueError("G_inter must be 1 with Accelerate (a model given whole has no pipeline "
                             f"stages), got {G_inter}")
        if zero_stage not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
        from engine.zero import offload_mode

        offload_mode(offload, zero3=zero_stage == 3)
        if offload not in (None, False, "none") and zero_stage == 0:
            raise ValueError(f"offload={offload!r} offloads ZeRO's shards: give zero_stage 1, 2 or 3")
        self.degrees = {"G_inter": G_inter, "G_data": G_data, "G_intra_r": G_intra_r, "G_intra_c": G_intra_c,
                        "G_intra_d": G_intra_d}
        self.zero_stage, self.offload = zero_stage, offload
        self.split_batches, self.seed = split_batches, seed
        self.grid: Any = None
        self.accelerate_version = accelerate.__version__

    # ---- the grid ----------------------------------------------------------------------------

    def setup(self) -> Any:
        """engine.init with these degrees (G_data defaults to what the others leave of the world), once."""
        if self.grid is None:
            import torch.distributed as dist

            import engine
            from engine.train import ensure_process_group

            ensure_process_group()
            degrees = dict(self.degrees)
            if degrees["G_data"] is None:
                others = 1
                for axis in ("G_inter", "G_intra_r", "G_intra_c", "G_intra_d"):
                    others *= degrees[axis]
                degrees["G_data"] = max(1, dist.get_world_size() // others)
            self.grid = engine.init(**degrees)
        return self.grid

    @property
    def device(self) -> torch.device:
        return self.setup().device

    # ---- prepare -----------------------------------------------------------------------------

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                dataloader: DataLoader | None = None) -> tuple[Any, ...]:
        """(model, optimizer, dataloader) for this rank (see the module docstring); the ones given as
        None come back as None."""
        import engine

        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
        if optimizer is not None and any(optimizer.state.values()):
            raise ValueError("optimizer has already stepped: prepare it before training (its state would "
                             "be for the unsplit parameters)")
        grid = self.setup()
        names = {id(p): n for n, p in model.named_parameters()}
        groups = None
        if optimizer is not None:
            missing = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in names]
            if missing:
                raise ValueError(f"optimizer holds {len(missing)} parameters that are not the model's")
            groups = [{**{k: v for k, v in g.items() if k != "params"},
                       "params": [names[id(p)] for p in g["params"]]} for g in optimizer.param_groups]
        engine.parallelize(model, grid)
        model = engine.wrap(model.to(grid.device), grid=grid)
        opt = None if optimizer is None else self._optimizer(model, type(optimizer), groups)
        loader = None if dataloader is None else self._dataloader(dataloader)
        return model, opt, loader

    def _optimizer(self, model: nn.Module, cls: type, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        import engine

        params = dict(model.named_parameters())
        groups = [{**g, "params": [params[n] for n in g["params"]]} for g in groups]
        if self.zero_stage == 3:
            hyper = [{k: v for k, v in g.items() if k != "params"} for g in groups]
            if any(h != hyper[0] for h in hyper):
                raise ValueError("zero_stage=3 (engine.Zero3) steps one parameter group, but the optimizer "
                                 f"has {len(groups)} with different hyperparameters")
            accepted = inspect.signature(cls).parameters
            kwargs = {k: v for k, v in hyper[0].items() if k in accepted}
            opt: torch.optim.Optimizer = engine.Zero3(model, cls, grid=self.grid, offload=self.offload,
                                                      **kwargs)
        elif self.zero_stage:
            opt = engine.ZeroOptimizer(groups, cls, grid=self.grid, stage=self.zero_stage,
                                       offload=self.offload)
        else:
            opt = cls(groups)
        _sync_before_step(opt, model, self.grid)
        return opt

    def _dataloader(self, loader: DataLoader) -> DataLoader:
        import engine

        if not isinstance(loader, DataLoader) or loader.batch_size is None:
            raise ValueError("dataloader must be a torch DataLoader with a batch_size (not a batch_sampler)")
        grid = self.grid
        global_batch = loader.batch_size if self.split_batches else loader.batch_size * grid.batch_shards
        return engine.create_dataloader(loader.dataset, global_batch, None, loader.num_workers, grid=grid,
                                        shuffle=isinstance(loader.sampler, RandomSampler), seed=self.seed,
                                        collate_fn=loader.collate_fn, pin_memory=loader.pin_memory)

    # ---- helpers -----------------------------------------------------------------------------

    def clip_grad_norm_(self, model: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Synchronize the gradients, then clip them by the whole model's norm (engine.clip_grad_norm_);
        Accelerate's own clips each rank's shards by their local norm."""
        import engine

        engine.sync_gradients(model, grid=self.grid)
        return engine.clip_grad_norm_(model, max_norm, norm_type, grid=self.grid)


def _sync_before_step(opt: torch.optim.Optimizer, model: nn.Module, grid: Any) -> None:
    """`opt.step()` runs engine.sync_gradients(model) first (a no-op when already synchronized). Bound
    as a method so LR schedulers, which rewrap `opt.step.__func__`, keep working; the engine's
    global step pre-hook (the sync guard) then sees synchronized gradients."""
    import engine

    def step(self: torch.optim.Optimizer, closure: Any = None) -> Any:
        engine.sync_gradients(model, grid=grid)
        return type(self).step(self) if closure is None else type(self).step(self, closure)

    opt.step = types.MethodType(step, opt)  # type: ignore[method-assign]


__all__ = ["GridtunePlugin"]
