"""One optimizer step's time, composed from compute, communication, pipeline and optimizer parts.

    step = m * t_mb(busiest stage) + bubble + p2p + exposed data-parallel sync + optimizer

t_mb is never shorter than the host needs to issue the micro-batch's ops (eager PyTorch: see
`perfmodels.compute.HOST_US_PER_BLOCK`); the difference is reported as `host_wait_s`.

t_mb is forward + backward (+ recomputation) compute of the busiest stage plus the exposed part
of its per-micro-batch communication (tensor-parallel all-reduces, depth all-gathers and
reduce-scatters). What may hide behind what:
(the flags are the training stack's, `Training.effective_stack`, see `perfmodels.stacks`):
- tensor-parallel collectives are on the critical path (Megatron), except that with
  `overlap_tp_comm` the backward input-grad all-reduce overlaps the weight-grad GEMM (AxoNN,
  Transformer Engine userbuffers) and forward ones overlap the next GEMM by half;
- depth all-gathers / reduce-scatters are prefetched and overlap compute when `overlap_depth_comm`;
- ZeRO-2 per-micro-batch reduce-scatters (stacks that keep only the gradient shard) hide behind
  the rest of the backward when `overlap_grad_reduce`;
- ZeRO-3 parameter gathers and gradient reduce-scatters (per block or per tensor, every
  micro-batch; once per step under a pipeline) hide behind compute when `overlap_param_gather`
  (prefetch), else they are all exposed;
- the data-parallel gradient reduction (all-reduce, or the distributed optimizer's once-per-step
  reduce-scatter) overlaps the last micro-batch's backward when `overlap_grad_reduce`, else it runs
  after backward (after the whole pipeline schedule); the distributed optimizer's parameter
  all-gather overlaps the next forward when `overlap_param_gather`.

`predict_many` scores a whole PlanArrays at once (numpy, no Python loop per plan);
`predict` is the same code on a batch of one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfmodels import collectives, context, experts
from perfmodels.compute import (
    Rank,
    StageCompute,
    _attention,
    host_seconds_per_block,
    model_flops_per_token,
    stage_computes,
)
from perfmodels.constants import apply_constants
from perfmodels.layout import group_geometry, group_geometry_orders
from perfmodels.memory import StageMemory, capacity_per_rank_gib, peak_memory
from perfmodels.pipeline import bubble_s, p2p_transfers_on_critical_path
from perfmodels.plans import RECOMPUTE_CODE, SCHEDULE_CODE, PlanArrays, context_degrees, from_plans
from perfmodels.specs import (
    Cluster,
    MemoryBreakdown,
    Model,
    Plan,
    Prediction,
    TimeBreakdown,
    Training,
    validate_combination,
)
from perfmodels.stacks import Stack
from perfmodels.traffic import (
    EXTRA_AXES,
    REPORTED_AXES,
    CommEvent,
    StageShape,
    comm_events,
    stage_shape,
    units_on_stage,
)

TP_TAGS = ("tp_fwd", "tp_bwd", "norm", "loss", "convert")
DEPTH_TAGS = ("depth_ag", "depth_rs")
DP_OVERLAP_TAIL = 0.1
"""Share of an overlapped data-parallel gradient reduction that stays exposed: the last bucket is
ready only when backward ends (PyTorch DDP and Megatron's default 25-40 MB buckets are ~10% of a
stage's gradients at the model sizes where data-parallel time matters)."""
PREFETCH_COVER = 0.8
"""Fraction of compute time that prefetched collectives (ZeRO-3 gathers, depth gathers) can hide
behind: a collective's kernels take SMs from the GEMMs they overlap, so overlapped compute slows by
~20% (the contention NCCL's own docs and FSDP profiles show)."""
TP_FWD_EXPOSED_SHARE = 0.5
"""Share of a forward tensor-parallel collective left exposed when the stack overlaps TP communication:
it can only hide behind the next GEMM of the same layer, which is about as long (Transformer Engine's
userbuffer pipelining splits it in chunks; the first chunk has nothing to hide behind)."""
UNCERTAINTY_PRESET = 0.15
"""Relative band of a prediction from preset constants: the p90 error on published runs (17%) rounded."""
UNCERTAINTY_CPU_PRESET = 1.0
"""The CPU "device" preset is an order-of-magnitude guess until `gridtune profile` measures the machine."""
UNCERTAINTY_CALIBRATED = 0.08
"""Band after calibration on measured steps when the profile carries no leave-one-out error."""
FIRST_GATHER_SHARE = 0.05
"""Least exposed share of one micro-batch's prefetched collectives: the first unit's gather has no
compute to hide behind."""


@dataclass(frozen=True)
class BatchPrediction:
    """Predictions for every plan of a PlanArrays, as arrays (index i = plan i)."""

    arrays: PlanArrays
    iteration_time_s: np.ndarray
    tokens_per_s: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    parts: dict[str, np.ndarray]
    memory: StageMemory
    bytes_per_group: dict[str, np.ndarray]
    calls_per_group: dict[str, np.ndarray]
    constants_source: str
    uncertainty_rel: float

    def __len__(self) -> int:
        return len(self.arrays)

    def prediction(self, i: int) -> Prediction:
        mem = self.memory
        p = self.parts
        return Prediction(
            iteration_time_s=float(self.iteration_time_s[i]),
            tokens_per_s=float(self.tokens_per_s[i]),
            tflops_per_gpu=float(self.tflops_per_gpu[i]),
            mfu=float(self.mfu[i]),
            memory=MemoryBreakdown(
                per_gpu_gib=float(mem.total_gib[i]),
                capacity_gib=mem.capacity_gib,
                fits=bool(mem.total_gib[i] <= mem.capacity_gib),
                params_gib=float(mem.params_gib[i]),
                grads_gib=float(mem.grads_gib[i]),
                optimizer_gib=float(mem.optimizer_gib[i]),
                activations_gib=float(mem.activations_gib[i]),
                comm_buffers_gib=float(mem.comm_buffers_gib[i]),
                overhead_gib=float(mem.overhead_gib[i]),
            ),
            breakdown=TimeBreakdown(
                **{name: float(p[name][i]) for name in TimeBreakdown.__dataclass_fields__}
            ),
            bytes_per_group={k: float(v[i]) for k, v in self.bytes_per_group.items()},
            calls_per_group={k: float(v[i]) for k, v in self.calls_per_group.items()},
            constants_source=self.constants_source,
            uncertainty_rel=self.uncertainty_rel,
        )


def _category(ev: CommEvent, overlap_tp: bool) -> str:
    if ev.tag in TP_TAGS:
        if ev.tag == "tp_bwd":
            return "tp_bwd"
        return "tp_fwd_half" if overlap_tp and ev.tag == "tp_fwd" else "tp_exposed"
    if ev.tag in DEPTH_TAGS:
        return "depth"
    if ev.tag == "depth_grad":
        return "depth_grad"
    if ev.tag == "dp_param":
        return "dp_param"
    if ev.tag == "dp_grad":
        return "dp_mb" if ev.phase in ("fwd", "bwd") else "dp_step"
    if ev.tag == "zero3":
        return "zero3"
    return ev.tag


def _comm_seconds(cluster: Cluster, training: Training, arrays: PlanArrays, events: list[CommEvent],
                  geo: dict[str, dict[str, np.ndarray]]) -> dict[tuple[str, str], np.ndarray]:
    """Seconds per (axis, category) for one step. Cost is linear in bytes for a given group and
    op, so events are summed per (axis, op, category) first and each sum is costed once."""
    sums: dict[tuple[str, str, str], list[np.ndarray]] = {}
    for ev in events:
        if ev.tag == "p2p" or not ev.calls.any():
            continue
        key = (ev.axis, ev.op, _category(ev, training.effective_stack.overlap_tp_comm))
        acc = sums.setdefault(key, [np.zeros(len(arrays)), np.zeros(len(arrays))])
        acc[0] += ev.payload_bytes * ev.calls
        acc[1] += ev.calls
    out: dict[tuple[str, str], np.ndarray] = {}
    for (axis, op, cat), (byte_calls, calls) in sums.items():
        g = geo[axis]
        sec = collectives.cost_s(cluster, op, byte_calls, calls, g["size"], g["intra"], g["members_per_node"])
        out[(axis, cat)] = out.get((axis, cat), 0.0) + sec
    return out


def _p2p_seconds(cluster: Cluster, training: Training, arrays: PlanArrays, events: list[CommEvent],
                 geo: dict[str, dict[str, np.ndarray]]) -> np.ndarray:
    """Seconds of one pipeline transfer (the schedule decides how many sit on the critical path).

    Every stage boundary of a node sends at once, so each GPU gets its own share of the NICs;
    with scatter-gather each rank of the row group sends 1/G_r and the pieces are all-gathered
    over NVLink on arrival."""
    g = geo["inter"]
    payload = np.zeros(len(arrays))
    for ev in events:
        if ev.tag == "p2p" and ev.op == "send":
            payload = np.maximum(payload, ev.payload_bytes)
    if training.effective_stack.p2p_scatter_gather:
        payload = payload / arrays.G_intra_r
    two = np.full(len(arrays), 2.0)
    alpha, busbw = collectives.link_constants(cluster, "send_recv", two, g["intra"], np.ones(len(arrays)))
    per_call = collectives.collective_time_s("send_recv", payload, two, alpha, busbw)
    return np.where(g["size"] > 1, per_call, 0.0)


def _prefetched_exposed(
    total: np.ndarray, overlapped: bool | np.ndarray, compute_step: np.ndarray, m: np.ndarray
) -> np.ndarray:
    """Exposed part of per-micro-batch collectives that a prefetching stream runs behind compute:
    what `PREFETCH_COVER` of the compute cannot cover, and never less than `FIRST_GATHER_SHARE` of
    one micro-batch's share (the first gather has nothing to hide behind). Not overlapped (per plan
    when an array): all of it."""
    if not np.any(overlapped):
        return total
    hidden = np.maximum(total - PREFETCH_COVER * compute_step, total / np.maximum(m, 1) * FIRST_GATHER_SHARE)
    return np.where(overlapped, hidden, total)


def _combined_1f1b_exposed(model: Model, arrays: PlanArrays, st: StageShape, comp: StageCompute,
                           events: list[CommEvent], a2a_step_s: np.ndarray, m: np.ndarray,
                           full_rc: np.ndarray, c_compute: float) -> np.ndarray:
    """Exposed seconds per step of the expert all-to-alls under Megatron-Core's combined 1F1B
    schedule (`Stack.overlap_ep_comm`, interleaved pipelines): in the steady state each MoE layer's
    forward of one micro-batch runs with its backward of another (`experts.overlapped_exposed_s`,
    from the stage's per-layer compute); the chunks of the interleaved warm-up and cool-down
    (2 (p - 1) + (v - 1) p forward chunks of m v on the first stage, as many backward) have no
    partner and wait for their all-to-alls, as do the all-to-alls a full recomputation repeats."""
    blocks = np.maximum(np.asarray(st.blocks, dtype=np.float64), 1.0)
    moe_layers = blocks * model.moe_fraction
    calls = sum((ev.calls for ev in events if ev.axis == "ep"), np.zeros(len(arrays)))
    per_call = a2a_step_s / np.maximum(calls, 1e-30)
    experts_fwd = np.asarray(comp.experts_fwd_s, dtype=np.float64) * c_compute
    attention_fwd = (comp.fwd_s - comp.head_fwd_s) * c_compute - experts_fwd
    pair = experts.overlapped_exposed_s(per_call, attention_fwd / blocks,
                                        experts_fwd / np.maximum(moe_layers, 1e-30))
    p, v = arrays.G_inter.astype(np.float64), arrays.virtual_stages.astype(np.float64)
    chunks = m * v
    unpaired = np.minimum(2.0 * (p - 1.0) + (v - 1.0) * p, chunks) / np.maximum(chunks, 1.0)
    layer_mbs = moe_layers * m
    return ((1.0 - unpaired) * layer_mbs * pair + unpaired * 4.0 * layer_mbs * per_call
            + full_rc * 2.0 * layer_mbs * per_call)


def _average_stage(model: Model, arrays: PlanArrays) -> StageShape:
    """The mean stage: 1/G_inter of the blocks, the embedding and the head (a spread unit is already
    1/G_inter of itself on every stage)."""
    S = arrays.G_inter.astype(np.float64)
    return StageShape(blocks=model.num_layers / S, has_embedding=1.0 / S, has_head=1.0 / S,
                      is_first=np.ones(len(arrays), bool), is_last=np.ones(len(arrays), bool))


def _comm_by_kind(secs: dict[tuple[str, str], np.ndarray], n: int) -> dict[str, np.ndarray]:
    """Seconds of communication per kind that the overlap rules treat alike, summed over the axes
    they run on (`secs` is keyed by (axis, category) as `_comm_seconds` returns it)."""
    zeros = np.zeros(n)

    def total(axes: tuple[str, ...], cats: tuple[str, ...]) -> np.ndarray:
        return sum((secs.get((a, c), zeros) for a in axes for c in cats), zeros.copy())

    tp_cats = ("tp_exposed", "tp_fwd_half", "tp_bwd")
    return {
        "row": total(("row",), tp_cats),
        "col": total(("col",), tp_cats),
        "tp_bwd": total(("row", "col"), ("tp_bwd",)),
        "tp_exposed": total(("row", "col"), ("tp_exposed",)),
        "tp_fwd_half": total(("row", "col"), ("tp_fwd_half",)),
        "depth": total(("depth",), ("depth",)),
        "dp_mb": total(("data",), ("dp_mb",)),
        "dp_step": total(("data",), ("dp_step",)),
        "dp_param": total(("data",), ("dp_param",)),
        "zero3": total(("data",), ("zero3",)),
        "depth_grad": total(("depth",), ("depth_grad",)),
    }


def _host_seconds_per_microbatch(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                                 st: StageShape) -> np.ndarray:
    """Host time to issue one micro-batch of the busiest stage: each block's forward, backward
    (twice the ops) and recomputation, dearer per split tensor-parallel axis (more, smaller ops).
    Units spread over the stages (layer lists): per-layer host costs are inside their compute, so
    none here (`Unit.issues_host_ops`)."""
    stack = training.effective_stack
    passes = 3.0 + (arrays.recompute == RECOMPUTE_CODE["full"])
    # a transformer block's ops relative to a dense eager block's: an MoE layer's router, dispatch,
    # combine and per-expert GEMM launches, less what CUDA graphs capture (perfmodels.experts.host_ops)
    block_ops = experts.host_ops(model, training, arrays) / experts.HOST_OPS_PER_BLOCK
    blocks_issued = np.zeros(len(arrays))
    for unit in model.units:
        if unit.issues_host_ops:
            count = units_on_stage(unit, st, arrays)
            blocks_issued = blocks_issued + (count * block_ops if unit.placement == "block" else count)
    cost_r, cost_c, cost_d = stack.host_split_axis_costs
    axis_factor = (
        1.0
        + cost_r * (arrays.G_intra_r > 1)
        + cost_c * (arrays.G_intra_c > 1)
        + cost_d * (arrays.G_intra_d > 1)
    )
    return host_seconds_per_block(cluster, training) * passes * blocks_issued * axis_factor


def _per_group_totals(events: list[CommEvent], n: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(bytes, calls) per step on each axis's groups, for the report."""
    axes = REPORTED_AXES  # the order the answers have always listed them in
    byte_totals: dict[str, np.ndarray] = {a: np.zeros(n) for a in (*axes, *EXTRA_AXES)}
    call_totals: dict[str, np.ndarray] = {a: np.zeros(n) for a in (*axes, *EXTRA_AXES)}
    for ev in events:
        byte_totals[ev.axis] = byte_totals[ev.axis] + ev.payload_bytes * ev.calls
        call_totals[ev.axis] = call_totals[ev.axis] + ev.calls
    for extra in EXTRA_AXES:  # "cp", "ep", "etp", "edp" only where some plan uses them
        if not call_totals[extra].any():
            del byte_totals[extra], call_totals[extra]
    return byte_totals, call_totals


def _uncertainty(cluster: Cluster) -> float:
    """The relative band a prediction claims, by where its constants come from."""
    prof = cluster.profile
    # preset GPU constants are checked against published runs (MAPE ~11%); the CPU "device" preset is
    # an order-of-magnitude guess until `gridtune profile` measures the machine
    # the band comes from measured error: a profile's microbenchmarks do not measure a training step,
    # so until calibration against measured steps (which sets uncertainty_rel from leave-one-out
    # errors) the band stays the preset's
    preset_band = UNCERTAINTY_CPU_PRESET if cluster.gpu.vendor == "cpu" else UNCERTAINTY_PRESET
    if prof is None:
        return float(preset_band)
    if prof.source == "calibrated":
        return float(prof.uncertainty_rel or UNCERTAINTY_CALIBRATED)
    return float(max(preset_band, prof.uncertainty_rel or 0.0))


def _once_per_step_data_parallel(t: dict[str, np.ndarray], comp: StageCompute, stack: Stack,
                                 c_dp: float, hides: bool | np.ndarray = True,
                                 ) -> tuple[np.ndarray, np.ndarray]:
    """(total, exposed) seconds of the data-parallel communication that runs once per step: the
    gradient reduction after the last backward, and the distributed optimizer's parameter gather."""
    dp_total = t["dp_step"] * c_dp
    # overlapped gradient reduction runs in buckets behind the last backward; its last bucket
    # (DP_OVERLAP_TAIL of it) always waits
    window = comp.bwd_s + comp.recompute_s
    dp_exposed = np.where(stack.overlap_grad_reduce & hides,
                          np.maximum(dp_total - window, DP_OVERLAP_TAIL * dp_total), dp_total)
    # the distributed optimizer's parameter all-gather: behind the next step's forward when the
    # stack overlaps it (Megatron --overlap-param-gather), else after the optimizer step
    dp_param_total = t["dp_param"] * c_dp
    dp_param_exposed = np.where(stack.overlap_param_gather & hides,
                                np.maximum(dp_param_total - comp.fwd_s, DP_OVERLAP_TAIL * dp_param_total),
                                dp_param_total)
    return dp_total + dp_param_total, dp_exposed + dp_param_exposed


def _tensor_parallel_exposed(t: dict[str, np.ndarray], stack: Stack, c_tp: float,
                             wgrad_step: np.ndarray, hides: bool | np.ndarray = True) -> np.ndarray:
    """Tensor-parallel seconds on the critical path: what never overlaps, TP_FWD_EXPOSED_SHARE of
    the forward collectives, and the backward input-grad all-reduce less the weight-grad GEMMs it
    runs behind when the stack overlaps them."""
    tp_exposed = t["tp_exposed"] + TP_FWD_EXPOSED_SHARE * t["tp_fwd_half"]
    tp_bwd = t["tp_bwd"] * c_tp
    return tp_exposed * c_tp + np.where(stack.overlap_tp_comm & hides, np.maximum(tp_bwd - wgrad_step, 0.0),
                                        tp_bwd)


def _pipeline_seconds(arrays: PlanArrays, m: np.ndarray, t_mb: np.ndarray, comp: StageCompute,
                      avg: StageCompute, p2p_call_s: np.ndarray,
                      c_pp: float) -> tuple[np.ndarray, np.ndarray]:
    """(bubble, p2p on the critical path) in seconds. The bubble is idle time of the average stage,
    not the busiest: `t_mb` (the busiest stage's micro-batch) is scaled by their compute ratio."""
    avg_ratio = np.where(comp.fwd_s > 0, (avg.fwd_s + avg.bwd_s + avg.recompute_s) / np.maximum(
        comp.fwd_s + comp.bwd_s + comp.recompute_s, 1e-30), 1.0)
    bubble = bubble_s(t_mb * avg_ratio, arrays.G_inter, arrays.schedule, arrays.virtual_stages)
    p2p = (
        p2p_transfers_on_critical_path(m, arrays.G_inter, arrays.schedule, arrays.virtual_stages)
        * p2p_call_s
        * c_pp
    )
    return bubble, p2p


def _core_sharing_stretch(ranks_per_core: np.ndarray, cpu_busy_s: np.ndarray,
                          step_alone_s: np.ndarray) -> np.ndarray:
    """How many times longer every CPU-bound part of a step takes when a node's ranks share cores.

    Why: k runnable compute-bound processes on C < k cores each run at C/k of a core's rate (the
    kernel's fair scheduler; processor sharing, Kleinrock 1967). A rank is runnable while it
    computes, not while it waits in a collective, a pipeline receive or the bubble. On cores of its
    own the step takes `step_alone_s`, of which the mean rank computes `cpu_busy_s` (a pipeline's
    lighter stages wait for its busiest), so on average R x busy/step of the node's R ranks are
    runnable, and each runs that many / C times slower
    (never faster than alone):

        stretch = max(1, (R / C) x cpu_busy_s / step_alone_s)

    Data parallelism keeps every rank busy: 4 ranks on 2 cores, stretch 2. A 4-stage pipeline with
    m = 4 micro-batches of t is busy 4t of its 7t: stretch 8/7, a step of 8t, which is the node's
    work (16t) over its 2 cores; its bubble is not idle time added on top of 2x slower stages, as
    with GPUs of their own, but time the idle stages' cores give the busy ones. With m = 2 (busy
    2t of 5t, 0.8 ranks per core) nothing stretches. Measured with the engine (tiny-gpt, 16
    samples, 4 ranks on 2 cores): 4-way data parallel 46-55 ms, 4 stages 36-37 ms, 2x2 37 ms.
    On GPUs (`ranks_per_core` 0) the stretch is 1."""
    ratio = np.where(step_alone_s > 0, cpu_busy_s / np.maximum(step_alone_s, 1e-30), 0.0)
    return np.maximum(1.0, ranks_per_core * np.clip(ratio, 0.0, 1.0))


def _stretched(comp: StageCompute, stretch: np.ndarray) -> StageCompute:
    """`comp` with every time `stretch` times longer (ranks that share cores)."""
    return replace(comp, **{f: getattr(comp, f) * stretch for f in comp.__dataclass_fields__})


def predict_many(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays, *,
                 memory: StageMemory | None = None) -> BatchPrediction:
    """Score every plan in `arrays` (no validation: the tuner prunes invalid plans first). Plans
    with context parallelism are scored per G_cp through `perfmodels.context.view`. `memory`: the
    plans' `memory_many`, where a caller already has it (used for plans without context
    parallelism, whose memory it is exactly)."""
    cluster, training = apply_constants(cluster, training)  # a calibrated profile's constants, if any
    cps = context_degrees(arrays)
    if len(cps) == 1 and cps[0] == 1:
        return _predict_many(model, cluster, training, arrays, memory=memory)
    parts = []
    for cp in cps:
        idx = np.flatnonzero(arrays.G_cp == cp)
        real = arrays.take(idx)
        model_v, training_v, arrays_v = context.view(model, training, real, int(cp))
        parts.append((idx, _predict_many(model_v, cluster, training_v, arrays_v, cp=int(cp), real=real)))
    return _merge(arrays, parts)


def _merge(arrays: PlanArrays, parts: list[tuple[np.ndarray, BatchPrediction]]) -> BatchPrediction:
    """One BatchPrediction over `arrays` from predictions of its subsets (`idx`, prediction)."""
    n = len(arrays)

    def scatter(get) -> np.ndarray:
        out = np.zeros(n)
        for idx, b in parts:
            out[idx] = get(b)
        return out

    first = parts[0][1]
    keys_bytes = list(dict.fromkeys(k for _, b in parts for k in b.bytes_per_group))
    mem = StageMemory(**{f: scatter(lambda b, f=f: getattr(b.memory, f))
                         for f in ("params_gib", "grads_gib", "optimizer_gib", "activations_gib",
                                   "comm_buffers_gib", "overhead_gib", "total_gib")},
                      capacity_gib=first.memory.capacity_gib)
    return BatchPrediction(
        arrays=arrays,
        iteration_time_s=scatter(lambda b: b.iteration_time_s),
        tokens_per_s=scatter(lambda b: b.tokens_per_s),
        tflops_per_gpu=scatter(lambda b: b.tflops_per_gpu),
        mfu=scatter(lambda b: b.mfu),
        parts={k: scatter(lambda b, k=k: b.parts[k]) for k in first.parts},
        memory=mem,
        bytes_per_group={k: scatter(lambda b, k=k: b.bytes_per_group.get(k, 0.0)) for k in keys_bytes},
        calls_per_group={k: scatter(lambda b, k=k: b.calls_per_group.get(k, 0.0)) for k in keys_bytes},
        constants_source=first.constants_source,
        uncertainty_rel=first.uncertainty_rel,
    )


def _geometry(cluster: Cluster, arrays: PlanArrays, cp: int, real: PlanArrays | None,
              model: Model) -> dict[str, dict[str, np.ndarray]]:
    """Group geometry of every axis: the grid's (of the real plans, so the axes outside "cp" keep
    their strides, with the data group of the context view: G_data * G_cp ranks), and the expert
    groups' for a mixture of experts. Plans under several placements are placed each under its own
    in one pass (`layout.group_geometry_orders`)."""
    n = cluster.gpus_per_node_used

    def plain(a: PlanArrays) -> dict[str, dict[str, np.ndarray]]:
        if a.placement_index is None:
            return group_geometry(a.degrees(), a.placement, n)
        return group_geometry_orders(a.degrees(), a.placements, a.placement_index, n)

    geo = plain(arrays)
    if real is not None and cp > 1:
        geo = {**plain(real), "data": geo["data"]}
    if model.is_moe:
        geo.update(experts.expert_geometry(arrays, n, cp))
    return geo


def scatter_geometry(out: dict[str, dict[str, np.ndarray]], part: dict[str, dict[str, np.ndarray]],
                     idx: np.ndarray, n: int) -> None:
    """Write the group geometry `part` of plans `idx` into `out`, the geometry of all `n` plans."""
    for axis, fields in part.items():
        dest = out.setdefault(axis, {})
        for key, value in fields.items():
            value = np.asarray(value)
            dest.setdefault(key, np.zeros(n, dtype=value.dtype))[idx] = value


def _predict_many(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays, cp: int = 1,
                  real: PlanArrays | None = None, memory: StageMemory | None = None) -> BatchPrediction:
    """`predict_many` for plans of one context-parallel degree `cp`: `model`, `training` and
    `arrays` are the context view (`perfmodels.context.view`) of the `real` plans when cp > 1."""
    m = arrays.num_microbatches(training).astype(np.float64)
    st = stage_shape(model.num_layers, arrays, "busiest")
    comp, avg = stage_computes(model, cluster, training, arrays, [st, _average_stage(model, arrays)])
    geo = _geometry(cluster, arrays, cp, real, model)
    full_rc = (arrays.recompute == RECOMPUTE_CODE["full"]).astype(np.float64)
    events = comm_events(model, training, arrays, "busiest") + context.ring_events(
        model, training, arrays, cp, st.blocks.astype(np.float64), m, full_rc)
    prof = cluster.profile
    corr = (lambda name: prof.correction(name)) if prof is not None else (lambda name: 1.0)
    secs = _comm_seconds(cluster, training, arrays, events, geo)
    t = _comm_by_kind(secs, len(arrays))
    t["p2p_call"] = _p2p_seconds(cluster, training, arrays, events, geo)
    stack = training.effective_stack
    ep_a2a, ep_etp, ep_grad = experts.group_seconds(cluster, model, training, events, geo, secs, len(arrays))
    ring_total, ring_exposed = _ring_seconds(cluster, model, training, arrays, cp, geo, st, full_rc)

    c_compute, c_tp, c_dp, c_pp = corr("compute"), corr("tp_comm"), corr("dp_comm"), corr("pp_p2p")
    # ranks that share CPU cores (Cluster.cpu_cores_per_node) are time-sliced: compose the step on
    # cores of their own first, then again with every CPU-bound part stretched by how many ranks
    # are runnable per core on average in that schedule (_core_sharing_stretch)
    ranks_per_core = cluster.ranks_per_core((real if real is not None else arrays).world_size)
    shared = bool(np.any(ranks_per_core > 1.0))
    # communication hides behind compute only where something else does it: GPUs' copy engines and
    # NICs, or a CPU core no rank computes on. gloo's copies and reductions on CPU ranks that fill
    # every core (the engine's async depth prefetch, bucketed gradient all-reduce) take core time
    # from the compute instead: measured on 4 ranks / 2 cores, the depth plans' compute rose by
    # about what their gathers take while their collective waits stayed short
    hides = ranks_per_core < 1.0
    host_alone = _host_seconds_per_microbatch(model, cluster, training, arrays, st)
    sync_wait = experts.sync_wait_s(model, cluster, training, arrays, st.blocks)
    comp_alone, avg_alone = comp, avg
    t["dp_step"] = t["dp_step"] + ep_grad  # expert gradients over expert-data, as the dense ones over data
    stretch = np.ones(len(arrays))
    cpu_busy_alone = step_alone = np.zeros(len(arrays))  # set by the composition on cores of their own
    for composition in ("alone", "shared") if shared else ("alone",):
        if composition == "shared":
            stretch = _core_sharing_stretch(ranks_per_core, cpu_busy_alone, step_alone)
            comp, avg = _stretched(comp_alone, stretch), _stretched(avg_alone, stretch)
        compute_mb = (comp.fwd_s + comp.bwd_s + comp.recompute_s) * c_compute
        compute_step = m * compute_mb
        wgrad_step = m * comp.wgrad_s * c_compute

        tp_exposed = _tensor_parallel_exposed(t, stack, c_tp, wgrad_step, hides)
        tp_total = (t["row"] + t["col"]) * c_tp
        depth_total = t["depth"] * c_dp
        depth_exposed = _prefetched_exposed(depth_total, stack.overlap_depth_comm & hides, compute_step, m)
        # ZeRO-2 that keeps only its gradient shard reduce-scatters after every backward, in buckets
        # behind the rest of that backward when the stack overlaps gradient reduction
        dp_mb_total = t["dp_mb"] * c_dp
        dp_mb_exposed = _prefetched_exposed(
            dp_mb_total, stack.overlap_grad_reduce & hides, m * (comp.bwd_s + comp.recompute_s), m
        )
        # ZeRO-3: with prefetch each block's gathers and reduce-scatters run behind the neighbouring
        # block's compute, so only what compute cannot cover is exposed; fetched on demand, all of it
        zero3_total = t["zero3"] * c_dp
        zero3_exposed = _prefetched_exposed(zero3_total, stack.overlap_param_gather & hides, compute_step, m)
        # expert all-to-alls and expert tensor-parallel all-reduces sit on the critical path; the ring
        # shows only what its hops take beyond the attention they overlap (perfmodels.context)
        ep_total = (ep_a2a + ep_etp) * c_tp
        interleaved = arrays.schedule == SCHEDULE_CODE["interleaved-1f1b"]
        ep_exposed = np.where(stack.overlap_ep_comm & interleaved & (arrays.G_inter > 1) & hides,
                              _combined_1f1b_exposed(model, arrays, st, comp, events, ep_a2a * c_tp, m,
                                                     full_rc, c_compute),
                              ep_a2a * c_tp) + ep_etp * c_tp
        ring = ring_total * m * c_tp
        ring_exp = ring_exposed * m * c_tp
        per_mb_exposed = (tp_exposed + depth_exposed + dp_mb_exposed + zero3_exposed + ep_exposed
                          + ring_exp) / m
        t_mb_gpu = compute_mb + per_mb_exposed
        # where the framework launches asynchronously the GPU only waits when it outruns the host (a
        # floor); where it synchronizes around layers, `host_exposed_fraction` of the host time adds
        host_mb = host_alone * stretch
        # a dropless MoE layer synchronizes host and device once per forward (perfmodels.experts)
        t_mb_gpu = t_mb_gpu + sync_wait
        t_mb = np.maximum(t_mb_gpu + stack.host_exposed_fraction * host_mb, host_mb)

        bubble, p2p = _pipeline_seconds(arrays, m, t_mb, comp, avg, t["p2p_call"], c_pp)
        dp_total, dp_exposed = _once_per_step_data_parallel(t, comp, stack, c_dp, hides)
        depth_grad = t["depth_grad"] * c_dp
        optimizer = comp.optimizer_s * c_compute

        iteration = m * t_mb + bubble + p2p + dp_exposed + depth_grad + optimizer
        # what the average rank computes (not waits) in this step (the busiest stage's micro-batch
        # scaled to the mean stage's compute, as the bubble is), and the step
        mean_stage = np.where(comp.fwd_s > 0, (avg.fwd_s + avg.bwd_s + avg.recompute_s) / np.maximum(
            comp.fwd_s + comp.bwd_s + comp.recompute_s, 1e-30), 1.0)
        cpu_busy_alone = m * (t_mb - per_mb_exposed - sync_wait) * mean_stage + optimizer
        step_alone = iteration
    tokens = float(training.global_batch_size * model.tokens_per_sample)
    # model FLOPs (forward + backward = 3x forward, recomputation not counted), as MFU is defined
    flops = 3.0 * model_flops_per_token(model) * tokens
    peak = cluster.gpu.peak_tflops(training.dtype) * 1e12
    tflops_per_gpu = flops / (iteration * arrays.world_size) / 1e12
    comm_total = (tp_total + depth_total + dp_mb_total + zero3_total + dp_total + p2p + depth_grad + ep_total
                  + ring)
    exposed = (tp_exposed + depth_exposed + dp_mb_exposed + zero3_exposed + dp_exposed + p2p + depth_grad
               + ep_exposed + ring_exp)
    parts = {  # the TimeBreakdown fields, one array each
        "compute_s": compute_step,
        "gemm_s": m * (comp.gemm_fwd_s * 3.0) * c_compute,
        "attention_s": m * comp.attention_fwd_s * 3.0 * c_compute,
        "memory_bound_s": m * comp.memory_fwd_s * 3.0 * c_compute,
        "recompute_s": m * comp.recompute_s * c_compute,
        "tp_comm_s": tp_total,
        "tp_comm_row_s": t["row"] * c_tp,
        "tp_comm_col_s": t["col"] * c_tp,
        "tp_comm_depth_s": depth_total,
        "dp_comm_s": dp_total + dp_mb_total + zero3_total,
        "pp_bubble_s": bubble,
        "pp_p2p_s": p2p,
        "optimizer_s": optimizer,
        "exposed_comm_s": exposed,
        "hidden_comm_s": np.maximum(comm_total - exposed, 0.0),
        "host_wait_s": m * (t_mb - t_mb_gpu),
        "ep_comm_s": ep_total,
        "cp_comm_s": ring,
    }
    mem = memory if memory is not None else peak_memory(model, cluster, training, arrays, st.blocks, m)
    byte_totals, call_totals = _per_group_totals(events, len(arrays))
    source = "preset" if prof is None else prof.source
    return BatchPrediction(
        arrays=arrays, iteration_time_s=iteration, tokens_per_s=tokens / iteration,
        tflops_per_gpu=tflops_per_gpu, mfu=tflops_per_gpu * 1e12 / peak, parts=parts, memory=mem,
        bytes_per_group=byte_totals, calls_per_group=call_totals, constants_source=source,
        uncertainty_rel=_uncertainty(cluster),
    )


def memory_many(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays) -> StageMemory:
    """Only the memory part of `predict_many`: cheap enough to screen plans before timing them."""
    cluster, training = apply_constants(cluster, training)
    cps = context_degrees(arrays)
    if not (len(cps) == 1 and cps[0] == 1):
        n = len(arrays)
        names = ("params_gib", "grads_gib", "optimizer_gib", "activations_gib", "comm_buffers_gib",
                 "overhead_gib", "total_gib")
        out = {name: np.zeros(n) for name in names}
        capacity = capacity_per_rank_gib(cluster)  # as for plans without context parallelism
        for cp in cps:
            idx = np.flatnonzero(arrays.G_cp == cp)
            part = _memory_one_cp(model, cluster, training, arrays.take(idx), int(cp))
            for name in names:
                out[name][idx] = getattr(part, name)
        return StageMemory(**out, capacity_gib=capacity)
    m = arrays.num_microbatches(training).astype(np.float64)
    return peak_memory(
        model, cluster, training, arrays, stage_shape(model.num_layers, arrays, "busiest").blocks, m
    )


def _memory_one_cp(model: Model, cluster: Cluster, training: Training, arrays: PlanArrays,
                   cp: int) -> StageMemory:
    """Memory of plans of one context-parallel degree: their context view's, with the cp group's
    NCCL buffers."""
    model_v, training_v, arrays_v = context.view(model, training, arrays, cp)
    mem = memory_many(model_v, cluster, training_v, arrays_v)
    if cp == 1 or cluster.backend == "gloo":
        return mem
    extra = training.effective_stack.comm_buffer_gib
    return replace(mem, comm_buffers_gib=mem.comm_buffers_gib + extra, total_gib=mem.total_gib + extra)


def _ring_seconds(cluster: Cluster, model: Model, training: Training, arrays: PlanArrays, cp: int,
                  geo: dict[str, dict[str, np.ndarray]], st: StageShape,
                  full_rc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(total, exposed) ring seconds per micro-batch of the stage's attention layers."""
    n = len(arrays)
    if cp == 1:
        return np.zeros(n), np.zeros(n)
    rank = Rank.of(model, cluster, training, arrays)
    heads = model.num_attention_heads / rank.G_r
    attn_fwd, attn_bwd, _ = _attention(model, cluster, training, rank.b, heads)
    total, exposed = context.ring_exposed_s(cluster, model, training, arrays, cp, geo["cp"],
                                            np.asarray(attn_fwd), np.asarray(attn_bwd), full_rc)
    blocks = st.blocks.astype(np.float64)
    return total * blocks, exposed * blocks


def predict(model: Model, cluster: Cluster, training: Training, plan: Plan) -> Prediction:
    """Predict one plan; raises ValueError naming every inconsistent field first."""
    validate_combination(model, cluster, training, plan)
    return predict_many(model, cluster, training, from_plans([plan])).prediction(0)
