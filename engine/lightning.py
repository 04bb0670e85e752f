"""`GridtuneStrategy`: PyTorch Lightning trains a LightningModule with the engine's 4D layout.

    trainer = pl.Trainer(strategy=engine.lightning.GridtuneStrategy(G_intra_r=2, G_intra_c=2),
                         accelerator="cpu", devices=1, max_steps=1000, use_distributed_sampler=True)
    trainer.fit(module, dataloader)      # every rank: torchrun / srun / engine.launch start them

Processes are created outside Lightning (torchrun, srun, engine.launch; LOCAL_RANK, RANK and
WORLD_SIZE in the environment), as with AxoNN's strategy. At setup the strategy builds the grid
(engine.init; G_data defaults to what the other degrees leave of the world), splits the module's
nn.Linears with engine.parallelize (same values, this rank's shards) and wraps it (engine.wrap:
replicas broadcast, sync guard, overlapped data reduction); after every backward it runs
engine.sync_gradients, so the optimizer sees the single-process gradient. Lightning's
DistributedSampler gets num_replicas = G_data * G_intra_d and this rank's replica index, so the
tensor-parallel ranks of a replica read the same samples. Limits: accumulate_grad_batches=1;
Lightning's own checkpoints would hold this rank's shards (use engine.save_checkpoint).

Gradient clipping (`Trainer(gradient_clip_val=...)`, algorithm "norm") clips by the norm of the
whole model's gradient (engine.clip_grad_norm_: shards summed over the tensor axes, replicas
counted once), not by each rank's local shards: Lightning's Precision.clip_grad_by_norm calls
torch.nn.utils.clip_grad_norm_ on this rank's parameters only (pytorch_lightning 2.6
plugins/precision/precision.py), which gives every tensor-parallel rank a different coefficient.
`self.log(..., sync_dist=True, reduce_fx=...)` reduces with that function's name ("mean", "sum",
"max", "min"), over the batch shards (tensor-parallel replicas log the same value once).

AxoNN's Lightning names are accepted: `GridtuneStrategy(G_intra_r=..., G_intra_c=..., G_intra_d=...,
overlap_communication=True)` (overlap is always on: engine.wrap overlaps the data reduction).
Needs `pip install gridtune[lightning]`.
"""

from __future__ import annotations

import os
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import ParallelStrategy
from torch import Tensor


class GridtuneStrategy(ParallelStrategy):
    strategy_name = "gridtune"

    def __init__(self, *, G_inter: int = 1, G_data: int | None = None, G_intra_r: int = 1, G_intra_c: int = 1,
                 G_intra_d: int = 1, overlap_communication: bool = True, **kwargs: Any) -> None:
        for name, value in (("G_inter", G_inter), ("G_intra_r", G_intra_r), ("G_intra_c", G_intra_c),
                            ("G_intra_d", G_intra_d), ("G_data", 1 if G_data is None else G_data)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if G_inter != 1:
            raise ValueError("G_inter must be 1 with Lightning (a LightningModule has no pipeline stages), "
                             f"got {G_inter}")
        if not isinstance(overlap_communication, bool):
            raise ValueError(f"overlap_communication must be True or False, got {overlap_communication!r}")
        super().__init__(**kwargs)
        self.overlap_communication = overlap_communication
        self.degrees = {"G_inter": G_inter, "G_data": G_data, "G_intra_r": G_intra_r, "G_intra_c": G_intra_c,
                        "G_intra_d": G_intra_d}
        self.grid: Any = None

    # ---- ranks and devices (the processes exist already) --------------------------------------

    @property
    def is_distributed(self) -> bool:  # Lightning then gives the dataloader a DistributedSampler
        return True

    @property
    def global_rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0))

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))

    @property
    def root_device(self) -> torch.device:
        if self.grid is not None:
            return self.grid.device
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")

    def _configure_launcher(self) -> None:
        self._launcher = None

    def setup_environment(self) -> None:
        super().setup_environment()
        import engine
        from engine.train import ensure_process_group

        ensure_process_group()
        degrees = dict(self.degrees)
        if degrees["G_data"] is None:
            others = degrees["G_inter"] * degrees["G_intra_r"] * degrees["G_intra_c"] * degrees["G_intra_d"]
            degrees["G_data"] = max(1, self.world_size // others)
        self.grid = engine.init(**degrees)

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def _setup_model(self, model: Any) -> Any:
        import engine

        if self.lightning_module is not None and self.lightning_module.trainer is not None \
                and self.lightning_module.trainer.accumulate_grad_batches != 1:
            raise ValueError("GridtuneStrategy needs accumulate_grad_batches=1 "
                             "(gradients sync after each backward)")
        engine.parallelize(model, self.grid)
        self._clip_by_global_norm()
        return engine.wrap(model, grid=self.grid)

    def _clip_by_global_norm(self) -> None:
        """Make the precision plugin's norm clipping use the whole model's gradient norm."""
        import types

        import engine

        plugin = self.precision_plugin
        strategy = self

        def clip_grad_by_norm(_self: Any, optimizer: Any, clip_val: float) -> None:
            engine.clip_grad_norm_(strategy.lightning_module, float(clip_val), grid=strategy.grid)

        plugin.clip_grad_by_norm = types.MethodType(clip_grad_by_norm, plugin)

    def post_backward(self, closure_loss: Tensor) -> None:
        import engine

        engine.sync_gradients(self.lightning_module, grid=self.grid)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        g = self.grid
        return {"num_replicas": g.batch_shards, "rank": g.coord("data") * g.size("depth") + g.coord("depth")}

    # ---- collectives over the world --------------------------------------------------------------

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """All-reduce a logged value: "max"/"min" as such, "sum" over the batch shards (the
        tensor-parallel ranks of one shard log the same value), "mean" (default) over the world."""
        if not isinstance(tensor, Tensor) or not dist.is_initialized() or self.world_size == 1:
            return tensor
        out = tensor.detach().clone().float()
        name = str(reduce_op).lower().rsplit(".", 1)[-1] if reduce_op is not None else "mean"
        if name in ("max", "min"):
            dist.all_reduce(out, op=dist.ReduceOp.MAX if name == "max" else dist.ReduceOp.MIN, group=group)
            return out
        if name not in ("mean", "avg", "sum"):
            raise ValueError(f"reduce_op must be 'mean', 'sum', 'max' or 'min', got {reduce_op!r}")
        dist.all_reduce(out, group=group)
        size = self.world_size if group is None else dist.get_world_size(group)
        if name in ("mean", "avg"):
            out /= size
        elif self.grid is not None and group is None:
            out /= self.world_size // self.grid.batch_shards
        return out

    def barrier(self, name: str | None = None) -> None:
        if dist.is_initialized():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def teardown(self) -> None:
        super().teardown()


__all__ = ["GridtuneStrategy", "pl"]
