"""The JSON the service speaks, as pydantic models: they document the API (OpenAPI) and check types
and ranges at the door. They are never passed inward: routes dump them to plain dicts and convert
those with `perfmodels.io` (the one converter the CLI shares), which builds the frozen domain
dataclasses and raises `ValueError` naming field and value for anything pydantic cannot see
(unknown presets, grid product vs GPU count, divisibility).

Ranges here are of two kinds. Sizes (GPUs, layers, hidden size) have "absurd input" bounds that keep
every request cheap to answer. Physical constants (bandwidths, latencies, TFLOP/s, memory) have
*plausible* ranges (`PLAUSIBLE`), wide enough for any hardware of the next decade and a CPU test box,
narrow enough that a typo such as 1e-300 GB/s cannot produce a 5e301 s step; a 422 names the range.

Strings: every string in a request (free-form JSON included) must be valid Unicode (an unpaired
UTF-16 surrogate such as "\\ud800" is refused: it cannot be encoded as UTF-8, so it could neither be
answered nor stored), and names and ids must not contain NUL (PostgreSQL text cannot hold it).
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from api import examples
from perfmodels.presets import unknown_name
from perfmodels.stacks import FLASH_KERNEL_VALUES, STACK_PRESETS, TORCH_COMPILE_VALUES
from tuner.aliases import MEGATRON_ALIASES, rename_aliases
from tuner.catalog import PLAUSIBLE, plausible_range  # noqa: F401 - api.errors quotes the ranges from here
from tuner.store import Measurement

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]
Recompute = Literal["none", "selective", "full"]
Axis = Literal["col", "row", "cp", "depth", "inter", "data"]
AXES = ("col", "row", "depth", "inter", "data")
"""The five AxoNN axes; a placement may also place "cp" (context parallelism) among them."""


def _is_ordering(order: list[str]) -> bool:
    return sorted(order) in (sorted(AXES), sorted((*AXES, "cp")))
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"]

PROFILE_EXTRAS = ("provenance", "fits", "expected", "holdout_median_abs_error")
"""Free-form keys of a profile document that perfmodels.io.profile_from_dict accepts and ignores."""
MAX_GPUS = 1 << 22  # the domain's own "absurd" bound (perfmodels.specs.Cluster)
MAX_LAYERS = 4096  # explicit layer lists (what the engine extracts); Llama-3 405B has 882 Linears

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_nul(value: str) -> str:
    bad = _BAD_TEXT.search(value)
    if bad is not None:
        raise ValueError("must not contain a NUL character" if bad.group() == "\x00"
                         else "must not contain an unpaired UTF-16 surrogate")
    return value


def find_surrogate(value: Any, where: str = "body", depth: int = 0) -> str | None:
    """The path of the first string (value or key) holding an unpaired surrogate, else None."""
    if depth > 64:
        return None
    if isinstance(value, str):
        return where if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _SURROGATE.search(key):
                return f"{where} (a key)"
            found = find_surrogate(item, f"{where}.{key}", depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = find_surrogate(item, f"{where}[{i}]", depth + 1)
            if found:
                return found
    return None


def _physical(kind: str, *, strict_low: bool = False) -> Any:
    lo, hi, unit = PLAUSIBLE[kind]
    bounds = {"gt": lo} if strict_low else {"ge": lo}
    return Field(le=hi, description=f"plausible range {lo:g} to {hi:g} {unit}", **bounds)


Degree = Annotated[int, Field(ge=1, le=MAX_GPUS)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_no_nul)]
PosFloat = Annotated[float, Field(gt=0, le=1e9)]
NonNegFloat = Annotated[float, Field(ge=0, le=1e9)]
Bandwidth = Annotated[float, _physical("bandwidth_GBps")]
Latency = Annotated[float, _physical("latency_us")]
Tflops = Annotated[float, _physical("peak_tflops")]
TflopsOrZero = Annotated[float, Field(ge=0, le=PLAUSIBLE["peak_tflops"][1],
                                      description="plausible range 0 (none) or 1e-4 to 1e5 TFLOP/s")]
MemoryGib = Annotated[float, _physical("memory_gib")]
HbmBandwidth = Annotated[float, _physical("hbm_bandwidth_GBps")]
Efficiency = Annotated[float, _physical("efficiency")]


class _In(BaseModel):
    """Request objects: unknown keys, NaN/Infinity and loose types ("4" or 4.0 for an integer, 0 for
    a boolean) are rejected with the field's name; integers are fine where numbers are expected."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class _Root(_In):
    """A whole request body: no string anywhere in it (free-form JSON included) may hold an unpaired
    surrogate; the 422 names the path."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = find_surrogate(data)
        if where is not None:
            raise ValueError(f"{where} holds an unpaired UTF-16 surrogate (not valid Unicode text)")
        return data


class _Out(BaseModel):
    """Response objects: extra keys pass through, so the model can grow fields without a 500."""

    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------------------------
# Requests: the four specs
# --------------------------------------------------------------------------------------------


class LayerIn(_In):
    """One layer of an arbitrary network (what the engine extracts from an nn.Module)."""

    name: Annotated[str, Field(max_length=200), AfterValidator(_no_nul)] = "layer"
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

    model_config = ConfigDict(
        json_schema_extra={"examples": [examples.MODEL_GPT3, examples.PREDICT_EXPLICIT["model"]]}
    )

    preset: (
        Annotated[
            str, Field(max_length=100, description="e.g. gpt3-175b, llama3-70b"), AfterValidator(_no_nul)
        ]
        | None
    ) = None
    name: Annotated[str, Field(max_length=200), AfterValidator(_no_nul)] | None = None
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
    dropout: bool | None = None
    attention_span: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    layers: Annotated[list[LayerIn], Field(min_length=1, max_length=MAX_LAYERS)] | None = None
    # mixture of experts and attention variants: Megatron-Core's names (perfmodels.specs.Model)
    num_moe_experts: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    moe_router_topk: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    moe_ffn_hidden_size: Annotated[int, Field(ge=1, le=1 << 22)] | None = None
    moe_shared_expert_intermediate_size: Annotated[int, Field(ge=0, le=1 << 22)] | None = None
    moe_layer_freq: (
        Annotated[int, Field(ge=1, le=100_000)]
        | Annotated[list[Annotated[int, Field(ge=0, le=1)]], Field(min_length=1, max_length=100_000)]
        | None
    ) = None
    kv_channels: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    multi_latent_attention: bool | None = None
    q_lora_rank: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    kv_lora_rank: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    qk_head_dim: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    qk_pos_emb_head_dim: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    v_head_dim: Annotated[int, Field(ge=1, le=1 << 16)] | None = None


class GPUIn(_In):
    """A GPU by preset name with overrides, or by its numbers (peak TFLOP/s per dtype, memory)."""

    preset: Annotated[str, Field(max_length=100), AfterValidator(_no_nul)] | None = None
    name: Annotated[str, Field(max_length=200), AfterValidator(_no_nul)] | None = None
    peak_tflops: dict[Dtype, TflopsOrZero] | None = None
    peak_tflops_fp32: Tflops | None = None
    peak_tflops_tf32: TflopsOrZero | None = None
    peak_tflops_bf16: Tflops | None = None
    peak_tflops_fp16: Tflops | None = None
    peak_tflops_fp8: TflopsOrZero | None = None
    memory_gib: MemoryGib | None = None
    hbm_bandwidth_GBps: HbmBandwidth | None = None
    gemm_efficiency_max: Efficiency | None = None
    gemm_efficiency_fp8: Efficiency | None = None
    flash_fwd_efficiency: Efficiency | None = None
    flash_bwd_efficiency: Efficiency | None = None
    memory_efficiency: Efficiency | None = None
    vendor: Annotated[str, Field(max_length=50), AfterValidator(_no_nul)] | None = None


class CollectiveFitIn(_In):
    """Fitted alpha-beta constants of one collective at one link level and group size."""

    op: CollectiveOp
    level: Literal["intra", "inter"]
    group_size: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    alpha_us: Annotated[float, _physical("alpha_us")]
    busbw_GBps: Bandwidth
    r2: Annotated[float, Field(ge=-1e9, le=1)] | None = Field(
        None, description="fit quality; null when unknown"
    )


class ProfileIn(_In):
    """Constants measured by `gridtune profile` (perfmodels.io.profile_to_dict), plus the
    informational keys (PROFILE_EXTRAS: "provenance", "fits", ...), which are stored verbatim."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.PROFILE]})

    profile_id: Annotated[str, Field(max_length=200), AfterValidator(_no_nul)] | None = None
    collectives: Annotated[list[CollectiveFitIn], Field(max_length=10_000)] = []
    gemm_tflops_max: Tflops | None = None
    gemm_half_size: Annotated[float, Field(gt=0, le=1e6)] | None = None
    gemm_overhead_us: Latency | None = None
    hbm_bandwidth_GBps: HbmBandwidth | None = None
    corrections: dict[
        Annotated[str, Field(max_length=100), AfterValidator(_no_nul)], Annotated[float, Field(gt=0, le=1e6)]
    ] = {}
    source: Literal["profile", "calibrated"] = "profile"
    uncertainty_rel: Annotated[float, Field(ge=0, le=10)] | None = None
    run_scatter_rel: Annotated[float, Field(ge=0, le=10)] | None = None
    constants: dict[
        Annotated[str, Field(max_length=100), AfterValidator(_no_nul)], Annotated[float, Field(ge=0, le=1e6)]
    ] | None = None
    provenance: Any = None
    fits: Any = None
    expected: Any = None
    holdout_median_abs_error: Any = None


CLUSTER_FIELDS = (
    "num_gpus",
    "gpus_per_node",
    "gpu",
    "intra_node_bandwidth_GBps",
    "inter_node_bandwidth_GBps",
)
CLUSTER_ANY_OF = [
    *({"required": list(fields), "properties": {f: {"not": {"type": "null"}} for f in fields}}
      for fields in (("preset",), ("profile_id",), CLUSTER_FIELDS)),
    {"required": ["gpu", "num_gpus"],
     "properties": {"gpu": {"type": "string"}, "num_gpus": {"type": "integer"}}},
]
"""What the OpenAPI schema says a cluster needs, exactly what `_says_which_hardware` checks: a
non-null `preset`, a non-null `profile_id`, all of CLUSTER_FIELDS non-null, or a GPU preset name
with a count (the node fields then come from that GPU's cluster preset; `"preset": null` is a
missing preset, so the schema must not accept it as one)."""
CLUSTER_RULE = ("a cluster needs a 'preset', a stored 'profile_id', all of " + ", ".join(CLUSTER_FIELDS)
                + ", or a GPU preset name in 'gpu' with 'num_gpus' (the anyOf below); otherwise the answer "
                "is 422")


class ClusterIn(_In):
    """A cluster by preset (with overrides such as num_gpus) or by its fields; `profile_id` names a
    stored profile (POST /v1/clusters) whose fitted constants replace the defaults."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [examples.CLUSTER_SELENE_1024, examples.PREDICT_EXPLICIT["cluster"]],
                           "anyOf": CLUSTER_ANY_OF, "x-rule": CLUSTER_RULE}
    )

    preset: (
        Annotated[
            str, Field(max_length=100, description="e.g. selene, eos, frontier"), AfterValidator(_no_nul)
        ]
        | None
    ) = None
    name: Annotated[str, Field(max_length=200), AfterValidator(_no_nul)] | None = None
    num_gpus: Annotated[int, Field(ge=1, le=MAX_GPUS)] | None = None
    gpus_per_node: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    gpu: Annotated[str, Field(max_length=100), AfterValidator(_no_nul)] | GPUIn | None = None
    intra_node_bandwidth_GBps: Bandwidth | None = None
    inter_node_bandwidth_GBps: Bandwidth | None = None
    intra_node_latency_us: Latency | None = None
    inter_node_latency_us: Latency | None = None
    link_efficiency_intra: Efficiency | None = None
    link_efficiency_inter: Efficiency | None = None
    backend: Literal["nccl", "rccl", "gloo"] | None = None
    cpu_cores_per_node: Annotated[int, Field(
        ge=1, le=1 << 16, description="CPU ranks (gloo) only: the physical cores a node's ranks share; "
        "more ranks than cores are time-sliced (omit for GPUs)")] | None = None
    profile_id: Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_no_nul)] | None = None
    profile: ProfileIn | None = None

    @model_validator(mode="after")
    def _says_which_hardware(self) -> ClusterIn:
        if isinstance(self.gpu, str) and self.num_gpus is not None:
            return self  # a GPU by name and a count: node size and links from that GPU's preset node
        if self.preset is None and self.profile_id is None and any(
                getattr(self, f) is None for f in CLUSTER_FIELDS):
            missing = [f for f in CLUSTER_FIELDS if getattr(self, f) is None]
            raise ValueError(
                f"cluster needs a 'preset', a stored 'profile_id', a 'gpu' name with 'num_gpus', or all of "
                f"{list(CLUSTER_FIELDS)} (missing {missing})"
            )
        return self


StackName = Literal[tuple(sorted(STACK_PRESETS))]  # type: ignore[valid-type]


def _known_stack(value: Any) -> Any:
    """One clear error for an unknown stack name (with the closest names), instead of one per member
    of the `stack` union."""
    name = value.get("name") if isinstance(value, dict) else value
    if isinstance(name, str) and name not in STACK_PRESETS:
        raise unknown_name("stack", name, sorted(STACK_PRESETS))
    return value


def _megatron_names(value: Any, known: Any) -> Any:
    """Megatron's names (tp, pp, dp, cp, ep, etp, vpp, mbs) renamed to the plan fields they mean."""
    if isinstance(value, dict) and any(isinstance(k, str) and k.lower() in MEGATRON_ALIASES for k in value):
        return rename_aliases(value, known, where="")
    return value
BytesPerParam = Annotated[float, Field(ge=0, le=64)]
TorchCompile = Literal[TORCH_COMPILE_VALUES]  # type: ignore[valid-type]
FlashKernel = Literal[FLASH_KERNEL_VALUES]  # type: ignore[valid-type]


class StackIn(_In):
    """A training-stack preset with some of its options changed (perfmodels.stacks.Stack)."""

    name: StackName
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    overlap_tp_comm: bool | None = None
    overlap_depth_comm: bool | None = None
    zero2_grad_reduce: Literal["per_step", "per_microbatch"] | None = None
    zero3_gather: Literal["layer", "tensor"] | None = None
    flash_attention: bool | None = None
    flash_kernel: FlashKernel | None = None
    selective_recompute: Literal["attention-core", "per-op"] | None = None
    host_us_per_block: Latency | None = None
    host_exposed_fraction: Annotated[float, Field(ge=0, le=1)] | None = None
    p2p_scatter_gather: bool | None = None
    weight_bytes: BytesPerParam | None = None
    master_bytes: BytesPerParam | None = None
    grad_bytes_bf16: BytesPerParam | None = None
    grad_bytes_fp16: BytesPerParam | None = None
    fp32_grad_bytes_bf16: BytesPerParam | None = None
    zero2_grad_bytes: BytesPerParam | None = None
    zero2_master_bytes: BytesPerParam | None = None
    optimizer_state_bytes: BytesPerParam | None = None
    fp8_weight_cache_bytes: BytesPerParam | None = None
    context_gib: Annotated[float, Field(ge=0, le=64)] | None = None
    comm_buffer_gib: Annotated[float, Field(ge=0, le=64)] | None = None
    fragmentation: Annotated[float, Field(ge=0, le=10)] | None = None
    schedules: Annotated[list[Schedule], Field(min_length=1, max_length=3)] | None = None
    zero_stages: (
        Annotated[list[Annotated[int, Field(ge=0, le=3)]], Field(min_length=1, max_length=4)] | None
    ) = None
    tensor_parallel: bool | None = None
    pipeline_parallel: bool | None = None
    tensor_parallel_3d: bool | None = None
    sequence_parallel: bool | None = None
    vocab_parallel_embedding: bool | None = None
    loss_bytes_per_logit: BytesPerParam | None = None
    loss_parallel_bytes_per_logit: BytesPerParam | None = None
    sp_saves_gathered_inputs: bool | None = None
    moe_gates_in_experts: bool | None = None
    torch_compile: TorchCompile | None = None
    full_recompute_repeats_layer: bool | None = None

    @field_validator("name", mode="before")
    @classmethod
    def _name_is_known(cls, value: Any) -> Any:
        return _known_stack(value)


class TrainingIn(_In):
    """Batch, precision and the training stack (`stack`: a preset name, or {"name": ..., option: value});
    the option fields override one behaviour of the stack each (null: as the stack does)."""

    global_batch_size: Annotated[int, Field(ge=1, le=1 << 24)]
    dtype: Dtype = "bf16"
    attention_dtype: Literal["fp32", "tf32", "bf16", "fp16"] | None = None
    optimizer: Literal["adam", "adamw", "sgd"] | None = None
    stack: StackName | StackIn | None = None
    overlap_grad_reduce: bool | None = None
    overlap_tp_comm: bool | None = None
    overlap_param_gather: bool | None = None
    overlap_depth_comm: bool | None = None
    flash_attention: bool | None = None
    p2p_scatter_gather: bool | None = None
    zero3_gather: Literal["layer", "tensor"] | None = None
    host_us_per_block: Latency | None = None
    host_exposed_fraction: Annotated[float, Field(ge=0, le=1)] | None = None
    torch_compile: TorchCompile | None = None
    flash_kernel: FlashKernel | None = None
    full_recompute_repeats_layer: bool | None = None
    expert_load_imbalance: Annotated[float, Field(ge=1, le=64)] | None = None
    moe_token_dispatcher: Literal["alltoall", "flex"] | None = None
    cuda_graph_scope: list[Literal["attn", "mlp", "moe_router", "moe_preprocess"]] | None = Field(
        default=None, max_length=4)

    @field_validator("stack", mode="before")
    @classmethod
    def _stack_is_known(cls, value: Any) -> Any:
        return _known_stack(value)


class PlanIn(_In):
    """One layout: G_data x G_inter x G_intra_d x G_intra_r x G_intra_c plus the options that change cost.
    Megatron's names are accepted for the fields they mean: tp (G_intra_r), pp (G_inter), dp (G_data),
    cp (G_cp), ep (G_ep), etp (G_etp), vpp (virtual_stages), mbs (micro_batch_size)."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.PLAN_MEGATRON]})

    G_data: Degree = 1
    G_inter: Degree = 1
    G_intra_d: Degree = 1
    G_intra_r: Degree = 1
    G_intra_c: Degree = 1
    G_cp: Degree = Field(1, description="context parallelism (multiplies the world size)")
    G_ep: Degree = Field(1, description="expert parallelism: divides model.num_moe_experts")
    G_etp: Degree | None = Field(None, description="expert tensor parallelism (null: G_intra_r)")
    micro_batch_size: Annotated[int, Field(ge=1, le=1 << 24)] = 1
    schedule: Schedule = "1f1b"
    virtual_stages: Annotated[int, Field(ge=1, le=1024)] = 1
    recompute: Recompute = "none"
    zero_stage: Annotated[int, Field(ge=0, le=3)] = 0
    placement: Annotated[list[Axis], Field(min_length=5, max_length=6)] | None = None
    sequence_parallel: bool = False

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        return _megatron_names(data, cls.model_fields)


class SearchIn(_In):
    """Pins for the search (tuner.types.SearchOptions): each list is the allowed values of that
    dimension; leave a dimension out to search all of it. Megatron's names are accepted as in the
    plan (tp, pp, dp, cp, ep, etp, vpp, mbs)."""

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        return _megatron_names(data, cls.model_fields)

    G_data: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_inter: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_intra_d: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_intra_r: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_intra_c: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_cp: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_ep: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    G_etp: Annotated[list[Degree], Field(min_length=1, max_length=64)] | None = None
    micro_batch_size: (
        Annotated[list[Annotated[int, Field(ge=1, le=1 << 24)]], Field(min_length=1, max_length=64)] | None
    ) = None
    schedule: Annotated[list[Schedule], Field(min_length=1, max_length=3)] | None = None
    virtual_stages: (
        Annotated[list[Annotated[int, Field(ge=1, le=1024)]], Field(min_length=1, max_length=64)] | None
    ) = None
    recompute: Annotated[list[Recompute], Field(min_length=1, max_length=3)] | None = None
    zero_stage: (
        Annotated[list[Annotated[int, Field(ge=0, le=3)]], Field(min_length=1, max_length=4)] | None
    ) = None
    placement: Annotated[
        list[Annotated[list[Axis], Field(min_length=5, max_length=6)]], Field(min_length=1, max_length=720)
    ] | None = None
    sequence_parallel: Annotated[list[bool], Field(min_length=1, max_length=2)] | None = None
    max_micro_batch_size: Annotated[int, Field(ge=1, le=4096)] | None = None
    time_budget_s: (
        Annotated[
            float,
            Field(gt=0, le=600, description="wall-clock budget; the server caps it (GRIDTUNE_MAX_SEARCH_S)"),
        ]
        | None
    ) = None
    examples_per_reason: Annotated[int, Field(ge=0, le=50)] | None = None
    exhaustive: bool | None = Field(None, description=(
        "score every plan instead of skipping the families a lower bound proves unable to enter the "
        "top list: the same answer, slower; for checking"))
    suggest_trials: Annotated[int, Field(ge=0, le=10, description=(
        "when the leaders are closer than the band, name this many layouts whose measurement best "
        "separates them (the answer's 'uncertainty')"))] | None = None

    @field_validator("placement")
    @classmethod
    def _placements_are_orderings(cls, value: list[list[str]] | None) -> list[list[str]] | None:
        for order in value or ():
            if not _is_ordering(order):
                raise ValueError(f"each placement must be an ordering of {list(AXES)}, got {order}")
        return value


class PredictRequest(_Root):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.PREDICT]})

    model: ModelIn
    cluster: ClusterIn
    training: TrainingIn
    plan: PlanIn


class RecommendRequest(_Root):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.RECOMMEND]})

    model: ModelIn
    cluster: ClusterIn
    training: TrainingIn
    top_k: Annotated[int, Field(ge=1, le=100)] = 10
    search: SearchIn | None = None


class ClusterCreate(_Root):
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


class MeasurementCreate(_Root):
    """One measured step configuration (what `engine.train` sends back)."""

    model_config = ConfigDict(json_schema_extra={"examples": [examples.MEASUREMENT]})

    model: ModelIn
    cluster: ClusterIn
    training: TrainingIn
    plan: PlanIn
    measured: MeasuredIn
    prediction: dict[str, Any] | None = None
    cluster_id: (
        Annotated[
            str,
            Field(min_length=1, max_length=200, description="default: cluster.profile_id, else cluster name"),
            AfterValidator(_no_nul),
        ]
        | None
    ) = None


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
    G_cp: int = 1
    G_ep: int = 1
    G_etp: int | None = None
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
    equivalent_placements: list[list[str]] = Field(
        [], description="other rank orders of this plan that predict the same time (merged into this row)")
    equivalent_zero_stages: list[int] = Field(
        [], description="other ZeRO stages of this plan that predict the same time and memory (merged)")


class LaunchOut(_Out):
    kind: str
    stack: str = Field("", description="the stack preset the plan was ranked for")
    text: str = Field(description="what to paste: a command line, a JSON config, or Python")
    args: list[str] = []
    config: dict[str, Any] = {}
    notes: list[str] = Field([], description="what the stack cannot express, or what to set by hand")


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
    complete: bool = Field(
        True, description="false when the time budget ran out before every plan was scored"
    )
    num_not_evaluated: int = 0
    num_proved_slower: int = Field(0, description=(
        "plans never scored because a lower bound on their memory exceeds the GPU's or on their step "
        "time exceeds the k-th best time found (0 with search.exhaustive)"))
    exhaustive: bool = False
    launch: dict[str, LaunchOut] = Field(
        {}, description="the best plan's launch for every framework that runs the stack it was ranked for "
                        "(keys among megatron, nemo, deepspeed, torchtitan, fsdp, gridtune: the text "
                        "`gridtune recommend --emit KIND` prints)")


class ClusterOut(_Out):
    id: str
    name: str
    cluster: dict[str, Any] | None
    profile: dict[str, Any]
    created_at: _dt.datetime


class ClusterList(_Out):
    items: list[ClusterOut]
    next_offset: int | None = Field(None, description="pass as offset to get the next (older) page")


# The stored measurement's fields are defined once, by `tuner.store.Measurement`; the response
# model is built from that dataclass so a new stored field shows up here (and in the OpenAPI doc).
MeasurementOut = create_model(
    "MeasurementOut", __base__=_Out, __module__=__name__,
    **{name: (hint, ...) for name, hint in get_type_hints(Measurement).items()},
)


class MeasurementList(_Out):
    items: list[MeasurementOut]
    next_before_id: int | None = Field(None, description="pass as before_id to get the next (older) page")


class Health(_Out):
    status: Literal["ok", "degraded"]
    database: str
    version: str
    ready: bool | None = Field(None, description="the store takes writes now")
    reason: str = Field("", description="why not ready")
    writable: dict[str, bool] = Field(
        {}, description="per table the service writes (without the table prefix): does a write to it "
                        "succeed now (a lock on one table blocks writes to that table only)")


class Live(_Out):
    status: Literal["ok"]
    version: str


class PresetsOut(_Out):
    models: dict[str, dict[str, Any]]
    clusters: dict[str, dict[str, Any]]
    gpus: dict[str, dict[str, Any]]
    stacks: dict[str, dict[str, Any]] = {}


class ErrorItem(_Out):
    loc: list[str | int]
    msg: str
    type: str


CLUSTER_RULE_422 = {"detail": [{
    "loc": ["body", "cluster"],
    "msg": "cluster: Value error, cluster needs a 'preset', a stored 'profile_id', a 'gpu' name with "
           "'num_gpus', or all of ['num_gpus', 'gpus_per_node', 'gpu', 'intra_node_bandwidth_GBps', "
           "'inter_node_bandwidth_GBps'] (missing ['gpu', 'intra_node_bandwidth_GBps', "
           "'inter_node_bandwidth_GBps']), got {'num_gpus': 64, 'gpus_per_node': 8}",
    "type": "value_error",
    "input": "{'num_gpus': 64, 'gpus_per_node': 8}",
}]}
"""The documented 422 of a cluster given as {"num_gpus": 64, "gpus_per_node": 8}: no GPU to take the
node's links from (tests check the API answers exactly this)."""


class ErrorOut(_Out):
    """Every 4xx/5xx body: `detail` is a list of {loc, msg, type} for invalid input (each message
    names the field and the value), or one sentence. The example is the 422 of a cluster that
    breaks the cluster rule (see ClusterIn's anyOf)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [CLUSTER_RULE_422]})

    detail: list[ErrorItem] | str
