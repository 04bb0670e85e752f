"""The JSON the service speaks, as pydantic models: they document the API (OpenAPI) and check types
and ranges at the door. They are never passed inward: routes dump them to plain dicts and convert
those with `perfmodels.io` (the one converter the CLI shares), which builds the frozen domain
dataclasses and raises `ValueError` naming field and value for anything pydantic cannot see
(unknown presets, grid product vs GPU count, divisibility).

Ranges here are "absurd input" bounds (e.g. at most 4,194,304 GPUs, hidden size 2**20), not
physics: they keep every request cheap to answer and every number far from overflow.
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api import examples

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]
Recompute = Literal["none", "selective", "full"]
Axis = Literal["col", "row", "depth", "inter", "data"]
AXES = ("col", "row", "depth", "inter", "data")
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"]

PROFILE_EXTRAS = ("provenance", "fits", "expected", "holdout_median_abs_error")
"""Free-form keys of a profile document that perfmodels.io.profile_from_dict accepts and ignores."""
MAX_GPUS = 1 << 22  # the domain's own "absurd" bound (perfmodels.specs.Cluster)
MAX_LAYERS = 4096  # explicit layer lists (what the engine extracts); Llama-3 405B has 882 Linears

Degree = Annotated[int, Field(ge=1, le=MAX_GPUS)]
Name = Annotated[str, Field(min_length=1, max_length=200)]
PosFloat = Annotated[float, Field(gt=0, le=1e9)]
NonNegFloat = Annotated[float, Field(ge=0, le=1e9)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class _In(BaseModel):
    """Request objects: unknown keys, NaN/Infinity and loose types ("4" or 4.0 for an integer, 0 for
    a boolean) are rejected with the field's name; integers are fine where numbers are expected."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class _Out(BaseModel):
    """Response objects: extra keys pass through, so the model can grow fields without a 500."""

    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------------------------
# Requests: the four specs
# --------------------------------------------------------------------------------------------


class LayerIn(_In):
    """One layer of an arbitrary network (what the engine extracts from an nn.Module)."""

    name: Annotated[str, Field(max_length=200)] = "layer"
    kind: Literal["linear", "other"] = "linear"
    in_features: Annotated[int, Field(ge=0, le=1 << 24)] = 0
    out_features: Annotated[int, Field(ge=0, le=1 << 24)] = 0
    bias: bool = True
    rows_per_sample: Annotated[int, Field(ge=1, le=1 << 24)] = 1
    transpose: bool = False
    parallel: bool = True
    params: Annotated[int, Field(ge=0, le=1 << 40)] = 0
    flops_per_sample: Annotated[float, Field(ge=0, le=1e18)] = 0.0
    activation_elements_per_sample: Annotated[float, Field(ge=0, le=1e15)] = 0.0


class ModelIn(_In):
    """A transformer by its shape, a named preset (with optional overrides), or a list of layers."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.MODEL_GPT3, examples.PREDICT_EXPLICIT["model"]]})

    preset: Annotated[str, Field(max_length=100, description="e.g. gpt3-175b, llama3-70b")] | None = None
    name: Annotated[str, Field(max_length=200)] | None = None
    # 0 is what perfmodels.io.model_to_dict writes for a layer-list model; a transformer with a
    # zero dimension gets the domain's 422 ("model.hidden_size must be a positive integer, got 0")
    num_layers: Annotated[int, Field(ge=0, le=100_000)] | None = None
    hidden_size: Annotated[int, Field(ge=0, le=1 << 20)] | None = None
    num_attention_heads: Annotated[int, Field(ge=0, le=1 << 16)] | None = None
    ffn_hidden_size: Annotated[int, Field(ge=0, le=1 << 22)] | None = None
    seq_length: Annotated[int, Field(ge=0, le=1 << 24)] | None = None
    vocab_size: Annotated[int, Field(ge=0, le=1 << 24)] | None = None
    num_query_groups: Annotated[int, Field(ge=0, le=1 << 16)] | None = None
    gated_mlp: bool | None = None
    tied_embeddings: bool | None = None
    attention_span: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    layers: Annotated[list[LayerIn], Field(min_length=1, max_length=MAX_LAYERS)] | None = None


class GPUIn(_In):
    """A GPU by preset name with overrides, or by its numbers (peak TFLOP/s per dtype, memory)."""

    preset: Annotated[str, Field(max_length=100)] | None = None
    name: Annotated[str, Field(max_length=200)] | None = None
    peak_tflops: dict[Dtype, Annotated[float, Field(ge=0, le=1e6)]] | None = None
    peak_tflops_fp32: Annotated[float, Field(gt=0, le=1e6)] | None = None
    peak_tflops_tf32: Annotated[float, Field(ge=0, le=1e6)] | None = None
    peak_tflops_bf16: Annotated[float, Field(gt=0, le=1e6)] | None = None
    peak_tflops_fp16: Annotated[float, Field(gt=0, le=1e6)] | None = None
    peak_tflops_fp8: Annotated[float, Field(ge=0, le=1e6)] | None = None
    memory_gib: Annotated[float, Field(gt=0, le=1e6)] | None = None
    hbm_bandwidth_GBps: Annotated[float, Field(gt=0, le=1e7)] | None = None
    gemm_efficiency_max: Fraction | None = None
    memory_efficiency: Fraction | None = None
    vendor: Annotated[str, Field(max_length=50)] | None = None


class CollectiveFitIn(_In):
    """Fitted alpha-beta constants of one collective at one link level and group size."""

    op: CollectiveOp
    level: Literal["intra", "inter"]
    group_size: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    alpha_us: NonNegFloat
    busbw_GBps: Annotated[float, Field(gt=0, le=1e7)]
    r2: Annotated[float, Field(ge=-1e9, le=1)] | None = Field(None, description="fit quality; null when unknown")


class ProfileIn(_In):
    """Constants measured by `gridtune profile` (perfmodels.io.profile_to_dict), plus the
    informational keys (PROFILE_EXTRAS: "provenance", "fits", ...), which are stored verbatim."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.PROFILE]})

    profile_id: Annotated[str, Field(max_length=200)] | None = None
    collectives: Annotated[list[CollectiveFitIn], Field(max_length=10_000)] = []
    gemm_tflops_max: Annotated[float, Field(gt=0, le=1e6)] | None = None
    gemm_half_size: Annotated[float, Field(gt=0, le=1e6)] | None = None
    gemm_overhead_us: NonNegFloat | None = None
    hbm_bandwidth_GBps: Annotated[float, Field(gt=0, le=1e7)] | None = None
    corrections: dict[Annotated[str, Field(max_length=100)], Annotated[float, Field(gt=0, le=1e6)]] = {}
    source: Literal["profile", "calibrated"] = "profile"
    uncertainty_rel: Annotated[float, Field(ge=0, le=1e3)] | None = None
    provenance: Any = None
    fits: Any = None
    expected: Any = None
    holdout_median_abs_error: Any = None


class ClusterIn(_In):
    """A cluster by preset (with overrides such as num_gpus) or by its fields; `profile_id` names a
    stored profile (POST /v1/clusters) whose fitted constants replace the defaults."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [examples.CLUSTER_SELENE_1024, examples.PREDICT_EXPLICIT["cluster"]]}
    )

    preset: Annotated[str, Field(max_length=100, description="e.g. selene, eos, frontier")] | None = None
    name: Annotated[str, Field(max_length=200)] | None = None
    num_gpus: Annotated[int, Field(ge=1, le=MAX_GPUS)] | None = None
    gpus_per_node: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    gpu: Annotated[str, Field(max_length=100)] | GPUIn | None = None
    intra_node_bandwidth_GBps: Annotated[float, Field(gt=0, le=1e7)] | None = None
    inter_node_bandwidth_GBps: Annotated[float, Field(gt=0, le=1e7)] | None = None
    intra_node_latency_us: NonNegFloat | None = None
    inter_node_latency_us: NonNegFloat | None = None
    link_efficiency_intra: Fraction | None = None
    link_efficiency_inter: Fraction | None = None
    backend: Literal["nccl", "rccl", "gloo"] | None = None
    profile_id: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    profile: ProfileIn | None = None


class TrainingIn(_In):
    global_batch_size: Annotated[int, Field(ge=1, le=1 << 24)]
    dtype: Dtype = "bf16"
    optimizer: Literal["adam", "adamw", "sgd"] | None = None
    overlap_grad_reduce: bool | None = None
    overlap_tp_comm: bool | None = None
    flash_attention: bool | None = None
    p2p_scatter_gather: bool | None = None
    zero3_gather: Literal["layer", "tensor"] | None = None
    overlap_param_gather: bool | None = None
    host_us_per_block: Annotated[float, Field(ge=0, le=1e6)] | None = None


class PlanIn(_In):
    """One layout: G_data x G_inter x G_intra_d x G_intra_r x G_intra_c plus the options that change cost."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.PLAN_MEGATRON]})

    G_data: Degree = 1
    G_inter: Degree = 1
    G_intra_d: Degree = 1
    G_intra_r: Degree = 1
    G_intra_c: Degree = 1
    micro_batch_size: Annotated[int, Field(ge=1, le=1 << 24)] = 1
    schedule: Schedule = "1f1b"
    virtual_stages: Annotated[int, Field(ge=1, le=1024)] = 1
    recompute: Recompute = "none"
    zero_stage: Annotated[int, Field(ge=0, le=3)] = 0
    placement: Annotated[list[Axis], Field(min_length=5, max_length=5)] | None = None
    sequence_parallel: bool = False


class SearchIn(_In):
    """Pins for the search (tuner.types.SearchOptions): each list is the allowed values of that
    dimension; leave a dimension out to search all of it."""

    G_data: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_inter: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_intra_d: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_intra_r: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_intra_c: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    micro_batch_size: Annotated[list[Annotated[int, Field(ge=1, le=1 << 24)]], Field(min_length=1, max_length=64)] | None = None
    schedule: Annotated[list[Schedule], Field(min_length=1, max_length=3)] | None = None
    virtual_stages: Annotated[list[Annotated[int, Field(ge=1, le=1024)]], Field(min_length=1, max_length=64)] | None = None
    recompute: Annotated[list[Recompute], Field(min_length=1, max_length=3)] | None = None
    zero_stage: Annotated[list[Annotated[int, Field(ge=0, le=3)]], Field(min_length=1, max_length=4)] | None = None
    placement: Annotated[
        list[Annotated[list[Axis], Field(min_length=5, max_length=5)]], Field(min_length=1, max_length=120)
    ] | None = None
    sequence_parallel: Annotated[list[bool], Field(min_length=1, max_length=2)] | None = None
    max_micro_batch_size: Annotated[int, Field(ge=1, le=4096)] | None = None
    time_budget_s: Annotated[
        float, Field(gt=0, le=600, description="wall-clock budget; the server caps it (GRIDTUNE_MAX_SEARCH_S)")
    ] | None = None
    examples_per_reason: Annotated[int, Field(ge=0, le=50)] | None = None

    @field_validator("placement")
    @classmethod
    def _placements_are_orderings(cls, value: list[list[str]] | None) -> list[list[str]] | None:
        for order in value or ():
            if sorted(order) != sorted(AXES):
                raise ValueError(f"each placement must be an ordering of {list(AXES)}, got {order}")
        return value


class PredictRequest(_In):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.PREDICT]})

    model: ModelIn
    cluster: ClusterIn
    training: TrainingIn
    plan: PlanIn


class RecommendRequest(_In):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.RECOMMEND]})

    model: ModelIn
    cluster: ClusterIn
    training: TrainingIn
    top_k: Annotated[int, Field(ge=1, le=100)] = 10
    search: SearchIn | None = None


class ClusterCreate(_In):
    """A profile from `gridtune profile`, under a name; `cluster` says which hardware it measured."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.CLUSTER_CREATE]})

    name: Name
    cluster: ClusterIn | None = None
    profile: ProfileIn


class MeasuredIn(BaseModel):
    """What the engine measured: `iteration_time_s` plus any per-component times (compute_s,
    tp_comm_s, dp_comm_s, pp_bubble_s, ...), stored verbatim."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)

    iteration_time_s: Annotated[float, Field(gt=0, le=1e9)]


class MeasurementCreate(_In):
    """One measured step configuration (what `engine.train` sends back)."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.MEASUREMENT]})

    model: ModelIn
    cluster: ClusterIn
    training: TrainingIn
    plan: PlanIn
    measured: MeasuredIn
    prediction: dict[str, Any] | None = None
    cluster_id: Annotated[
        str, Field(min_length=1, max_length=200, description="default: cluster.profile_id, else cluster name")
    ] | None = None


# --------------------------------------------------------------------------------------------
# Responses (numbers that are not finite come back as null)
# --------------------------------------------------------------------------------------------

Num = float | None


class MemoryOut(_Out):
    per_gpu_gib: Num
    capacity_gib: Num = None
    fits: bool


class BreakdownOut(_Out):
    compute_s: Num
    tp_comm_s: Num
    dp_comm_s: Num
    pp_bubble_s: Num
    pp_p2p_s: Num
    exposed_comm_s: Num
    host_wait_s: Num = None


class PredictionOut(_Out):
    iteration_time_s: Num
    tokens_per_s: Num
    tflops_per_gpu: Num
    mfu: Num
    memory: MemoryOut
    breakdown: BreakdownOut
    bytes_per_group: dict[str, Num] = {}
    constants_source: str = "preset"
    profile_id: str | None = Field(None, description="the stored profile whose constants were used")


class PlanOut(_Out):
    G_data: int
    G_inter: int
    G_intra_d: int
    G_intra_r: int
    G_intra_c: int
    micro_batch_size: int
    schedule: str
    virtual_stages: int
    recompute: str
    zero_stage: int
    placement: list[str] | None = None


class BestOut(_Out):
    plan: PlanOut
    prediction: PredictionOut


class CandidateOut(BestOut):
    rank: int


class RecommendOut(_Out):
    best: BestOut | None
    candidates: list[CandidateOut]
    num_evaluated: int
    num_valid: int
    pruned: dict[str, int]
    pruned_examples: dict[str, list[str]] = {}
    constants_source: str = "preset"
    profile_id: str | None = None
    explanation: str = ""
    search_time_s: Num = None


class ClusterOut(_Out):
    id: str
    name: str
    cluster: dict[str, Any] | None
    profile: dict[str, Any]
    created_at: _dt.datetime


class ClusterList(_Out):
    items: list[ClusterOut]


class MeasurementOut(_Out):
    id: int
    cluster_id: str | None
    model: dict[str, Any]
    cluster: dict[str, Any]
    training: dict[str, Any]
    plan: dict[str, Any]
    measured: dict[str, Any]
    prediction: dict[str, Any] | None
    created_at: _dt.datetime


class MeasurementList(_Out):
    items: list[MeasurementOut]
    next_before_id: int | None = Field(None, description="pass as before_id to get the next (older) page")


class Health(_Out):
    status: Literal["ok", "degraded"]
    database: str
    version: str


class ErrorItem(_Out):
    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(_Out):
    detail: list[ErrorItem] | str
