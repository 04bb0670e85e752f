"""What an engine run is, in the model's nouns, so predictions describe what the engine does.

- `local_cluster(nproc)`: the "local-cpu" preset with one node of `nproc` ranks (gloo) sharing this
  machine's cores (`Cluster.cpu_cores_per_node`);
- `engine_training(global_batch_size)`: the `gridtune` stack (perfmodels/stacks.py): fp32, AdamW,
  data-parallel reduction after backward (`engine.sync_gradients` runs after the last micro-batch:
  overlap_grad_reduce=False), synchronous tensor-parallel collectives (overlap_tp_comm=False), fused
  attention (the built-in GPT calls `scaled_dot_product_attention`: flash_attention=True);
- `engine_search_options(...)`: the options the engine runs on CPU: schedule 1f1b, no virtual
  stages, no recomputation, ZeRO 0, the default placement, no sequence parallelism.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

from perfmodels import presets
from perfmodels.specs import AXES, Cluster, Model, Profile, Training
from tuner.search import recommend
from tuner.types import Candidate, SearchOptions


def usable_cpu_cores() -> int:
    """The cores this process (and the ranks it forks) may run on: the affinity mask where the
    platform has one (taskset, cgroups cpusets and Slurm narrow it), else os.cpu_count()."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def local_cluster(nproc: int, profile: Profile | None = None, *, cpu_cores: int | None = None) -> Cluster:
    """`nproc` CPU ranks on one machine (gloo), optionally with measured/calibrated constants.

    The ranks share this machine's cores (`cpu_cores`, default `usable_cpu_cores()`): with more
    ranks than cores they are time-sliced, which `Cluster.cpu_cores_per_node` tells the model."""
    base = presets.cluster("local-cpu", num_gpus=nproc)
    return dataclasses.replace(
        base,
        gpus_per_node=nproc,
        cpu_cores_per_node=cpu_cores if cpu_cores is not None else usable_cpu_cores(),
        profile=profile,
        profile_id=profile.profile_id if profile is not None and profile.profile_id else None,
    )


def engine_training(global_batch_size: int, *, dtype: str = "fp32", optimizer: str = "adamw",
                    stack: str = "gridtune") -> Training:
    """The Training spec of what engine.train does: the `gridtune` stack (see perfmodels.stacks and
    the module docstring). Another `stack` predicts the same runs as that framework would behave,
    which shows how much of the engine's behaviour the stack presets capture."""
    return Training(global_batch_size=global_batch_size, dtype=dtype, optimizer=optimizer,  # type: ignore[arg-type]
                    stack=stack)


def engine_search_options(*, micro_batch_size: int | None = None, data_parallel_only: bool = False,
                          pipeline: bool = True, time_budget_s: float = 10.0) -> SearchOptions:
    """Pins that keep the search to what the engine runs (one micro-batch size when given).

    `pipeline=False`: nets other than the built-in GPT (engine.auto_parallelize splits their
    Linears over row/col/depth, but they have no pipeline stages). `data_parallel_only`: an
    already built net, which can only be replicated.
    """
    pins: dict[str, Any] = {}
    if not pipeline or data_parallel_only:
        pins["G_inter"] = (1,)
    if data_parallel_only:
        pins.update(G_intra_d=(1,), G_intra_r=(1,), G_intra_c=(1,))
    return SearchOptions(
        micro_batch_size=(micro_batch_size,) if micro_batch_size else None,
        schedule=("1f1b",),
        virtual_stages=(1,),
        recompute=("none",),
        zero_stage=(0,),
        placement=(AXES,),
        sequence_parallel=(False,),
        time_budget_s=time_budget_s,
        **pins,
    )


def candidate_plans(model: Model, cluster: Cluster, training: Training, options: SearchOptions,
                    top_k: int = 10_000) -> list[Candidate]:
    """Every plan the pinned search keeps, fastest predicted first."""
    return recommend(model, cluster, training, top_k=top_k, search=options).candidates


def default_cluster_id(cluster: Cluster) -> str:
    """Where measurements of this machine are filed: '<cluster name>@<host>/<ranks>'.

    Deliberately independent of the profile in use, so runs with measured, calibrated or preset
    constants all feed (and find) the same calibration."""
    return f"{cluster.name}@{socket.gethostname()}/{cluster.num_gpus}"
