"""The physical constants of a training stack on a cluster that calibration fits, and how they enter
the model.

Why these: what reorders layouts between an a-priori model and a measured cluster is not "compute is
10% slower" but effects with a shape: GEMMs that lose efficiency as tensor parallelism shrinks them,
a fixed cost per layer per micro-batch that makes micro-batch 1 slower than 4, a tensor-parallel link
that delivers less than its datasheet, a pipeline send that waits on synchronisation. Each parameter
below is one such constant, with the preset's value as its prior and a plausible range; it replaces
the corresponding field of the specs, so every later prediction (any model, any layout on the same
cluster and stack) uses it through the ordinary formulas:

- `gemm_efficiency` (fraction of the dtype's dense peak): `GPU.gemm_efficiency_max`
  (`gemm_efficiency_fp8` in FP8; a microbenchmark profile's `gemm_tflops_max`);
- `gemm_half_size` (elements): `Profile.gemm_half_size`, how fast efficiency falls at small shards
  (`compute.gemm_time_s`: 1 / (1 + H/m + H/n + H/k));
- `attention_efficiency` (fraction of the attention dtype's peak, forward): `GPU.flash_fwd_efficiency`
  (backward keeps the preset's backward/forward ratio);
- `host_us_per_layer` (us per layer per micro-batch, forward + backward): the host's time to issue a
  layer's kernels, a floor under the step (`Stack.host_us_per_block` x 3), and
  `host_exposed_fraction`: the share of it that adds to GPU time (`Stack.host_exposed_fraction`), so
  the additive host cost per layer per micro-batch is their product;
- `intra_node_busbw_GBps`, `intra_node_latency_us`: collectives inside a node (tensor parallelism):
  `Cluster.intra_node_bandwidth_GBps` x `link_efficiency_intra`, `Cluster.intra_node_latency_us`;
  on a cluster whose profile measured in-node all-reduces (`gridtune profile`, or a preset that ships
  nccl-tests tables such as `vtrain-a100`), those measurements are what `collectives.link_constants`
  costs in-node collectives with, so there the parameter is the whole-node all-reduce's measured bus
  bandwidth and a calibrated value scales every in-node fit by the same factor (`_measured_intra_busbw`);
- `inter_node_busbw_GBps` (GB/s per GPU): `Cluster.inter_node_bandwidth_GBps` x `link_efficiency_inter`;
- `p2p_latency_us` (us per pipeline transfer): the send/recv latency (`Profile.collectives`, op
  `send_recv`);
- `memory_overhead_gib` (GiB per GPU): `Stack.context_gib` (CUDA context, workspaces, the framework's
  own allocations), fitted from measured peaks.

`Profile.constants` carries fitted values by name; `apply_constants(cluster, training)` writes them
into the specs (idempotent: applying twice is applying once), and `perfmodels.steptime.predict_many`
calls it first, so a calibrated profile attached to a cluster is all a caller needs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from perfmodels import stacks
from perfmodels.compute import (
    AMPERE_FLASH_TFLOPS,
    AMPERE_SM_CLOCK_SPEEDUP_ON_HOPPER,
    DEFAULT_GEMM_HALF_SIZE,
    host_seconds_per_block,
)
from perfmodels.specs import Cluster, CollectiveFit, Profile, Training

HOST_PASSES = 3.0
"""Forward plus backward (twice the ops) of one layer: the passes `host_us_per_layer` counts."""


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One calibrated constant: its unit, what it means, its prior spread and plausible range.

    `scale` "log": the prior is log-normal, `sigma` in natural-log units (0.2 = about +/-20%);
    "linear": normal, `sigma` in the parameter's unit (for constants whose prior may be 0)."""

    name: str
    unit: str
    what: str
    scale: Literal["log", "linear"]
    sigma: float
    lower: float
    upper: float


PARAMETERS: tuple[Parameter, ...] = (
    Parameter(name="gemm_efficiency", unit="fraction", scale="log", sigma=0.2, lower=0.02, upper=1.0,
              what="sustained fraction of the dtype's dense peak that large GEMMs reach"),
    Parameter(name="gemm_half_size", unit="elements", scale="log", sigma=0.7, lower=1.0, upper=4096.0,
              what="shape at which a GEMM dimension halves efficiency (fall-off at small shards)"),
    Parameter(name="attention_efficiency", unit="fraction", scale="log", sigma=0.3, lower=0.03, upper=1.0,
              what="fraction of peak the fused attention kernel reaches in forward"),
    Parameter(name="host_us_per_layer", unit="us", scale="linear", sigma=1000.0, lower=0.0, upper=100000.0,
              what="host time to issue one layer's forward and backward per micro-batch (a floor)"),
    Parameter(name="host_exposed_fraction", unit="fraction", scale="linear", sigma=0.1, lower=0.0, upper=1.0,
              what="share of that host time that adds to GPU time (the additive host cost)"),
    Parameter(name="intra_node_busbw_GBps", unit="GB/s", scale="log", sigma=0.4, lower=0.5, upper=5000.0,
              what="bus bandwidth of collectives inside a node (tensor parallelism)"),
    Parameter(name="intra_node_latency_us", unit="us", scale="linear", sigma=15.0, lower=0.0, upper=2000.0,
              what="latency per step of a collective inside a node"),
    Parameter(name="inter_node_busbw_GBps", unit="GB/s", scale="log", sigma=0.5, lower=0.1, upper=2000.0,
              what="network bus bandwidth per GPU (data and pipeline parallelism across nodes)"),
    Parameter(name="p2p_latency_us", unit="us", scale="linear", sigma=150.0, lower=0.0, upper=50000.0,
              what="fixed cost of one pipeline send/receive (launch and synchronisation)"),
    Parameter(name="memory_overhead_gib", unit="GiB", scale="linear", sigma=2.0, lower=0.0, upper=40.0,
              what="per-GPU memory besides model states and activations (context, workspaces)"),
)
"""Every calibrated constant, in the order fits and reports list them."""

PARAMETER_NAMES = tuple(p.name for p in PARAMETERS)
BY_NAME = {p.name: p for p in PARAMETERS}


def check_names(constants: Mapping[str, float]) -> None:
    unknown = sorted(set(constants) - set(PARAMETER_NAMES))
    if unknown:
        raise ValueError(f"unknown calibrated constant(s) {unknown}; known: {list(PARAMETER_NAMES)}")


def check_values(constants: Mapping[str, float], where: str = "profile.constants") -> None:
    """ValueError naming the first constant that is unknown or outside its parameter's plausible
    range (the fit never leaves it; a profile written by hand may), before it reaches a spec whose
    own check would name the GPU or stack field instead."""
    check_names(constants)
    for name, value in constants.items():
        p = BY_NAME[name]
        if not (math.isfinite(value) and p.lower <= value <= p.upper):
            raise ValueError(f"{where}.{name}={value:g} is outside its plausible range {p.lower:g} to "
                             f"{p.upper:g} {p.unit}")


def _strip(cluster: Cluster) -> Cluster:
    """The cluster without calibrated constants (what priors are read from)."""
    prof = cluster.profile
    if prof is None or not prof.constants:
        return cluster
    return dataclasses.replace(cluster, profile=dataclasses.replace(prof, constants=()))


def _gemm_dtype_fields(cluster: Cluster, training: Training) -> str:
    gpu = cluster.gpu
    if training.dtype == "fp8" and gpu.gemm_efficiency_fp8 is not None and gpu.peak_tflops_fp8 > 0:
        return "gemm_efficiency_fp8"
    return "gemm_efficiency_max"


def _flash_cap(cluster: Cluster, training: Training) -> float:
    """The forward efficiency a pre-Hopper flash kernel is capped at on this GPU (1 when native)."""
    if training.effective_stack.flash_kernel != "pre-hopper":
        return 1.0
    peak = cluster.gpu.peak_tflops(training.attention_compute_dtype)
    return AMPERE_FLASH_TFLOPS[0] * AMPERE_SM_CLOCK_SPEEDUP_ON_HOPPER / peak


def _send_recv_alpha(cluster: Cluster) -> float:
    prof = cluster.profile
    for fit in prof.collectives if prof is not None else ():
        if fit.op == "send_recv" and fit.level == "inter":
            return float(fit.alpha_us)
    return float(cluster.inter_node_latency_us)


def _measured_intra_busbw(cluster: Cluster) -> float | None:
    """The bus bandwidth the cluster's profile measured for an all-reduce over the most GPUs of one
    node, or None when it measured no in-node all-reduce.

    Where a profile has such fits, `collectives.link_constants` costs in-node collectives with them
    and not with `Cluster.intra_node_bandwidth_GBps` (vtrain-a100: 193-228 GB/s measured, 150 in the
    field), so the tensor-parallel bandwidth a calibration fits must be read from, and written into,
    those fits: as the link field alone it moved no all-reduce of such a cluster (a parameter the
    runs could never identify, at a prior the model did not use)."""
    prof = cluster.profile
    fits = [f for f in (prof.collectives if prof is not None else ())
            if f.op == "all_reduce" and f.level == "intra"]
    if not fits:
        return None
    return float(max(fits, key=lambda f: f.group_size).busbw_GBps)


def priors(cluster: Cluster, training: Training) -> dict[str, float]:
    """Each parameter's a-priori value for this cluster and stack (presets, the stack, a microbenchmark
    profile; never a calibration already attached), clipped into its plausible range."""
    cluster = _strip(cluster)
    gpu, prof, stack = cluster.gpu, cluster.profile, training.effective_stack
    eff = float(getattr(gpu, _gemm_dtype_fields(cluster, training)))
    if prof is not None and prof.gemm_tflops_max:
        eff = prof.gemm_tflops_max / gpu.peak_tflops(training.dtype)
    half = DEFAULT_GEMM_HALF_SIZE.get(gpu.vendor, 56.0)
    if prof is not None and prof.gemm_half_size is not None:
        half = prof.gemm_half_size
    host_block_us = host_seconds_per_block(cluster, training) * 1e6
    values = {
        "gemm_efficiency": eff,
        "gemm_half_size": half,
        "attention_efficiency": min(gpu.flash_fwd_efficiency, _flash_cap(cluster, training)),
        "host_us_per_layer": HOST_PASSES * host_block_us,
        "host_exposed_fraction": stack.host_exposed_fraction,
        "intra_node_busbw_GBps": _measured_intra_busbw(cluster) or (
            cluster.intra_node_bandwidth_GBps * cluster.link_efficiency_intra),
        "intra_node_latency_us": cluster.intra_node_latency_us,
        "inter_node_busbw_GBps": cluster.inter_node_bandwidth_GBps * cluster.link_efficiency_inter,
        "p2p_latency_us": _send_recv_alpha(cluster),
        "memory_overhead_gib": stack.context_gib,
    }
    return {p.name: float(min(max(values[p.name], p.lower), p.upper)) for p in PARAMETERS}


def apply_constants(cluster: Cluster, training: Training,
                    constants: Mapping[str, float] | None = None) -> tuple[Cluster, Training]:
    """`cluster` and `training` with the calibrated constants written into their fields.

    `constants` default to the ones the cluster's profile carries; with none, the specs come back
    unchanged (the same objects). Each value is absolute, so applying twice is applying once."""
    if constants is None:
        prof = cluster.profile
        if prof is None or not prof.constants:
            return cluster, training
        constants = dict(prof.constants)
    if not constants:
        return cluster, training
    check_names(constants)
    c = dict(constants)
    gpu = cluster.gpu
    gpu_changes: dict[str, float] = {}
    cluster_changes: dict[str, object] = {}
    profile = cluster.profile or Profile()
    profile_changes: dict[str, object] = {}
    training_changes: dict[str, object] = {}
    stack_changes: dict[str, object] = {}
    if "gemm_efficiency" in c:
        gpu_changes[_gemm_dtype_fields(cluster, training)] = c["gemm_efficiency"]
        if profile.gemm_tflops_max:
            profile_changes["gemm_tflops_max"] = c["gemm_efficiency"] * gpu.peak_tflops(training.dtype)
    if "gemm_half_size" in c:
        profile_changes["gemm_half_size"] = c["gemm_half_size"]
    if "attention_efficiency" in c:
        ratio = gpu.flash_bwd_efficiency / gpu.flash_fwd_efficiency
        gpu_changes["flash_fwd_efficiency"] = c["attention_efficiency"]
        gpu_changes["flash_bwd_efficiency"] = min(1.0, c["attention_efficiency"] * ratio)
        if training.effective_stack.flash_kernel != "native":
            training_changes["flash_kernel"] = "native"  # the measured rate already says what the kernel does
    if "host_us_per_layer" in c:
        training_changes["host_us_per_block"] = c["host_us_per_layer"] / HOST_PASSES
    if "host_exposed_fraction" in c:
        training_changes["host_exposed_fraction"] = c["host_exposed_fraction"]
    if "intra_node_busbw_GBps" in c:
        measured = _measured_intra_busbw(cluster)
        if measured is None:
            intra = c["intra_node_busbw_GBps"] / cluster.link_efficiency_intra
            cluster_changes["intra_node_bandwidth_GBps"] = intra
        else:
            # every in-node fit and the link field by one factor: the measured size dependence is
            # kept, and the whole-node all-reduce reads back the value (idempotent); pipeline sends
            # keep their own constant (`p2p_latency_us`)
            scale = c["intra_node_busbw_GBps"] / measured
            cluster_changes["intra_node_bandwidth_GBps"] = cluster.intra_node_bandwidth_GBps * scale
            profile_changes["collectives"] = tuple(
                dataclasses.replace(f, busbw_GBps=f.busbw_GBps * scale)
                if f.level == "intra" and f.op != "send_recv" else f
                for f in profile.collectives)
    if "intra_node_latency_us" in c:
        cluster_changes["intra_node_latency_us"] = c["intra_node_latency_us"]
    if "inter_node_busbw_GBps" in c:
        inter = c["inter_node_busbw_GBps"] / cluster.link_efficiency_inter
        cluster_changes["inter_node_bandwidth_GBps"] = inter
    if "memory_overhead_gib" in c:
        stack_changes["context_gib"] = c["memory_overhead_gib"]
    if gpu_changes:
        cluster_changes["gpu"] = dataclasses.replace(gpu, **gpu_changes)
    out = dataclasses.replace(cluster, **cluster_changes) if cluster_changes else cluster
    if "p2p_latency_us" in c:
        kept = profile_changes.get("collectives", profile.collectives)  # in-node fits as scaled above
        profile_changes["collectives"] = _with_p2p(out, dataclasses.replace(profile, collectives=kept),
                                                   c["p2p_latency_us"])
    if profile_changes or cluster.profile is None:
        out = dataclasses.replace(out, profile=dataclasses.replace(profile, **profile_changes))
    if stack_changes:
        training_changes["stack"] = dataclasses.replace(stacks.resolve(training.stack), **stack_changes)
    if training_changes:
        training = dataclasses.replace(training, **training_changes)
    return out, training


def _with_p2p(cluster: Cluster, profile: Profile, alpha_us: float) -> tuple[CollectiveFit, ...]:
    """The profile's collectives with pipeline send/recv at `alpha_us` on both link levels; the
    bandwidth stays what the cluster's links (or a measured send/recv fit) give."""
    from perfmodels.collectives import expected_busbw_GBps

    kept = [f for f in profile.collectives if not (f.op == "send_recv" and f.group_size == 2)]
    measured = {f.level: f for f in profile.collectives if f.op == "send_recv" and f.group_size == 2}
    fits = []
    for level in ("intra", "inter"):
        bw = measured[level].busbw_GBps if level in measured else float(
            expected_busbw_GBps(cluster, "send_recv", level, 1))
        fits.append(CollectiveFit(op="send_recv", level=level, group_size=2, alpha_us=float(alpha_us),  # type: ignore[arg-type]
                                  busbw_GBps=float(bw)))
    return tuple(kept + fits)
