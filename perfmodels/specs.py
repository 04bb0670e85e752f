"""The nouns of the performance model: what is trained, on what, how, and with which layout.

Every spec is a frozen, keyword-only dataclass with units in its field names. Construction
validates each field on its own; `validate_combination` checks what only the combination can
violate (grid product vs GPU count, divisibility, batch splits). Both raise `ValueError` whose
message names the field and the value, so the CLI, the REST service and the engine can pass it on
to the user unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from perfmodels import stacks
from perfmodels.ranges import check_plausible
from perfmodels.stacks import DEFAULT_STACK, Stack

if TYPE_CHECKING:
    from perfmodels.structure import Unit

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
RECOMPUTE = ("none", "selective", "full")
AXES = ("col", "row", "cp", "depth", "inter", "data")
"""Grid axis names, in the default placement order: innermost (consecutive ranks) first. "cp" is
context parallelism (Megatron-Core's tp-cp-...-dp order, with our pipeline inside data)."""
AXIS_FIELDS = {
    "data": "G_data",
    "inter": "G_inter",
    "depth": "G_intra_d",
    "row": "G_intra_r",
    "col": "G_intra_c",
    "cp": "G_cp",
}
"""Axis name -> the Plan field holding its degree: the five AxoNN degrees outermost (data) first,
then context parallelism."""
DEGREE_FIELDS = tuple(AXIS_FIELDS.values())
"""The six degree fields of a Plan whose product is the world size: G_data, G_inter, G_intra_d,
G_intra_r, G_intra_c, G_cp."""
GRID5_FIELDS = DEGREE_FIELDS[:5]
"""The five AxoNN degrees (without context parallelism), as messages about dense grids name them."""
EXPERT_GROUPS = ("etp", "ep", "edp")
"""Groups of mixture-of-experts layers, innermost first: expert tensor parallel, expert parallel,
expert data parallel (Megatron-Core's MoE parallel folding re-divides one pipeline stage's ranks)."""


def default_placement(order: tuple[str, ...]) -> tuple[str, ...]:
    """A placement given without "cp" (the five axes of gridtune before context parallelism) gets
    "cp" right after "row", where the default order has it; a full ordering is returned unchanged."""
    if "cp" in order or sorted(order) != sorted(a for a in AXES if a != "cp"):
        return tuple(order)
    out = list(order)
    out.insert(out.index("row") + 1, "cp")
    return tuple(out)
BACKENDS = ("nccl", "rccl", "gloo")

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


def _positive_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


def _non_negative_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}.{name} must be a non-negative integer, got {value!r}")


def _positive_float(owner: str, name: str, value: object, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = value >= 0 if allow_zero else value > 0
        ok = ok and value == value and value != float("inf")
    if not ok:
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{owner}.{name} must be {kind} finite number, got {value!r}")


def _choice(owner: str, name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """One layer of an arbitrary network, as the engine extracts it from an `nn.Module`.

    kind "linear": a Linear(in_features -> out_features) applied to `rows_per_sample` rows of
    every sample (the sequence length for token models, 1 for an MLP on vectors); `parallel` says
    whether auto_parallelize turned it into a 3D-parallel Linear (shapes divide) or kept it plain
    (replicated on every rank). kind "other": parameters and per-sample FLOPs of anything else
    (norms, embeddings, convolutions treated as replicated), with the activation elements it keeps.
    """

    name: str = "layer"
    kind: Literal["linear", "other"] = "linear"
    in_features: int = 0
    out_features: int = 0
    bias: bool = True
    rows_per_sample: int = 1
    transpose: bool = False
    parallel: bool = True
    params: int = 0
    flops_per_sample: float = 0.0
    activation_elements_per_sample: float = 0.0

    def __post_init__(self) -> None:
        _choice("layer", "kind", self.kind, ("linear", "other"))
        if self.kind == "linear":
            _positive_int(f"layer[{self.name}]", "in_features", self.in_features)
            _positive_int(f"layer[{self.name}]", "out_features", self.out_features)
            _positive_int(f"layer[{self.name}]", "rows_per_sample", self.rows_per_sample)
        else:
            _non_negative_int(f"layer[{self.name}]", "params", self.params)
            _positive_float(f"layer[{self.name}]", "flops_per_sample", self.flops_per_sample, allow_zero=True)

    @property
    def num_params(self) -> int:
        if self.kind == "linear":
            return self.in_features * self.out_features + (self.out_features if self.bias else 0)
        return self.params


@dataclass(frozen=True, kw_only=True)
class Model:
    """A decoder-only transformer (GPT/Llama family) or, with `layers`, an arbitrary network.

    `ffn_hidden_size` defaults to 4 * hidden_size; `num_query_groups` (GQA) defaults to the
    number of heads; `gated_mlp` means SwiGLU (three FFN matrices instead of two).
    `attention_span` (defaults to `seq_length`) is how many positions each query attends over; it
    differs only when a sequence is split over ranks (context parallelism): then `seq_length` is
    one rank's chunk and `attention_span` the whole sequence.
    `dropout`: the model trains with hidden and attention dropout (GPT-2/GPT-3 and Megatron's GPT
    default, p = 0.1), so every block saves a 1-byte mask after attention and after the MLP (and one
    over the scores when attention is not fused). Llama-family models, Nemotron-4 and MPT train with
    p = 0, and PyTorch's dropout then returns its input without drawing a mask, so they save none.
    """

    name: str = "custom"
    num_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    ffn_hidden_size: int | None = None
    seq_length: int = 0
    vocab_size: int = 0
    num_query_groups: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = False
    attention_span: int | None = None
    dropout: bool = True
    layers: tuple[LayerSpec, ...] = ()
    num_moe_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | tuple[int, ...] = 1
    kv_channels: int | None = None
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None

    def __post_init__(self) -> None:
        if self.layers:
            object.__setattr__(self, "layers", tuple(self.layers))
            if self.num_layers == 0:
                object.__setattr__(self, "num_layers", len(self.layers))
            if self.num_layers != len(self.layers):
                raise ValueError(f"model.num_layers={self.num_layers} but model.layers lists "
                                 f"{len(self.layers)} layers: leave num_layers out for a layer list")
            if not any(layer.kind == "linear" or layer.flops_per_sample > 0 for layer in self.layers):
                raise ValueError("model.layers do no work: give at least one linear layer or a layer with "
                                 "flops_per_sample > 0")
            return
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
            if getattr(self, name) == 0 and not isinstance(getattr(self, name), bool):
                # left at its default: say that a transformer needs it, and what the other kind is
                raise ValueError(f"model.{name} must be a positive integer, got 0 (a transformer needs it; "
                                 "give model.layers for another network)")
            _positive_int("model", name, getattr(self, name))
        for name in ("gated_mlp", "tied_embeddings", "dropout"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        _positive_int("model", "ffn_hidden_size", self.ffn_hidden_size)
        if self.attention_span is not None:
            _positive_int("model", "attention_span", self.attention_span)
        if self.attention_span is not None and self.attention_span < self.seq_length:
            raise ValueError(f"model.attention_span={self.attention_span} is shorter than "
                             f"model.seq_length={self.seq_length}")
        if self.num_query_groups is None:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        _positive_int("model", "num_query_groups", self.num_query_groups)
        self._check_attention_variant()
        self._check_experts()
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"model.num_attention_heads={self.num_attention_heads} is not divisible by "
                f"model.num_query_groups={self.num_query_groups}"
            )

    def _check_attention_variant(self) -> None:
        """`kv_channels` (a head size other than hidden / heads, as in Qwen3 and GPT-OSS) and
        multi-latent attention (DeepSeek-V2/V3, Kimi-K2: Megatron-Core's MLATransformerConfig, whose
        defaults fill the dimensions not given: kv_lora_rank 512, qk_head_dim 128, qk_pos_emb_head_dim
        64, v_head_dim 128; q_lora_rank None = queries without a low-rank projection)."""
        if self.kv_channels is not None:
            _positive_int("model", "kv_channels", self.kv_channels)
        if not isinstance(self.multi_latent_attention, bool):
            raise ValueError(f"model.multi_latent_attention must be true or false, got "
                             f"{self.multi_latent_attention!r}")
        mla = {"kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
        for name, default in mla.items():
            if getattr(self, name) is None and self.multi_latent_attention:
                object.__setattr__(self, name, default)
        for name in ("q_lora_rank", *mla):
            if getattr(self, name) is not None:
                if not self.multi_latent_attention:
                    raise ValueError(f"model.{name}={getattr(self, name)!r} needs "
                                     "model.multi_latent_attention=true")
                _positive_int("model", name, getattr(self, name))

    def _check_experts(self) -> None:
        """Mixture-of-experts fields, Megatron-Core's names: `num_moe_experts` (None: dense),
        `moe_router_topk`, `moe_ffn_hidden_size` (None: ffn_hidden_size), the shared experts' size
        (None or 0: none) and `moe_layer_freq` (k: every k-th layer, Megatron's `i % k == 0`; or a
        0/1 list with one entry per layer)."""
        freq = self.moe_layer_freq
        if isinstance(freq, list):
            freq = tuple(freq)
            object.__setattr__(self, "moe_layer_freq", freq)
        if self.num_moe_experts is None:
            for name in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size"):
                if getattr(self, name):
                    raise ValueError(f"model.{name}={getattr(self, name)!r} needs model.num_moe_experts")
            return
        _positive_int("model", "num_moe_experts", self.num_moe_experts)
        _positive_int("model", "moe_router_topk", self.moe_router_topk)
        if self.moe_router_topk > self.num_moe_experts:
            raise ValueError(f"model.moe_router_topk={self.moe_router_topk} is more than "
                             f"model.num_moe_experts={self.num_moe_experts}")
        if self.moe_ffn_hidden_size is None:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        _positive_int("model", "moe_ffn_hidden_size", self.moe_ffn_hidden_size)
        if self.moe_shared_expert_intermediate_size is not None:
            _non_negative_int("model", "moe_shared_expert_intermediate_size",
                              self.moe_shared_expert_intermediate_size)
        if isinstance(freq, tuple):
            if len(freq) != self.num_layers or any(isinstance(x, bool) or x not in (0, 1) for x in freq):
                raise ValueError(f"model.moe_layer_freq must be an int or a list of {self.num_layers} "
                                 f"zeros and ones (one per layer), got {list(freq)!r}")
            if not any(freq):
                raise ValueError("model.moe_layer_freq lists no mixture-of-experts layer (all zeros)")
        else:
            _positive_int("model", "moe_layer_freq", freq)

    @classmethod
    def from_layers(cls, layers: tuple[LayerSpec, ...] | list[LayerSpec], name: str = "custom") -> Model:
        """An arbitrary network given as its layers (what `engine.extract` reads from an nn.Module)."""
        return cls(name=name, layers=tuple(layers))

    @property
    def kind(self) -> Literal["transformer", "layers"]:
        """"transformer" (given by its shape) or "layers" (an explicit layer list). Both describe
        themselves as `units`, which is all the cost model reads; only the plan rules on a
        transformer's head and hidden splits, and the engine's choice of GPT or auto_parallelize,
        ask for the kind."""
        return "layers" if self.layers else "transformer"

    @property
    def is_transformer(self) -> bool:
        return self.kind == "transformer"

    @property
    def units(self) -> tuple[Unit, ...]:
        """The units the cost model evaluates (`perfmodels.structure`)."""
        from perfmodels.structure import units_of  # structure reads Model; imported here to avoid a cycle

        return units_of(self)

    @property
    def depth(self) -> int:
        """The layers a pipeline splits: `num_layers` (a layer list's length for a layer list)."""
        return self.num_layers

    @property
    def tokens_per_sample(self) -> int:
        """Tokens one sample counts as in tokens/s and MFU: the sequence, or 1 for a layer list (whose
        FLOPs are per sample)."""
        return self.seq_length if self.kind == "transformer" else 1

    @property
    def head_dim(self) -> int:
        """The size of one attention head: `kv_channels`, or hidden / heads."""
        if self.kv_channels is not None:
            return int(self.kv_channels)
        return self.hidden_size // self.num_attention_heads

    @property
    def q_size(self) -> int:
        """Width of the queries (and of the attention output before its projection): heads x head
        size, the hidden size unless `kv_channels` says otherwise (or the heads' value size under
        multi-latent attention)."""
        if self.multi_latent_attention:
            return self.num_attention_heads * int(self.v_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def attention_core_dim(self) -> float:
        """Mean of the query-key and the value head sizes: the attention core's FLOPs per score are
        2 x (qk + v) = 4 x this (the head size for standard attention; (qk + rope + v) / 2 for MLA)."""
        if self.multi_latent_attention:
            return (int(self.qk_head_dim) + int(self.qk_pos_emb_head_dim) + int(self.v_head_dim)) / 2.0
        return float(self.head_dim)

    @property
    def is_moe(self) -> bool:
        return self.num_moe_experts is not None

    @property
    def moe_layer_pattern(self) -> tuple[int, ...]:
        """One 0/1 per layer: 1 where the layer is a mixture of experts (Megatron-Core's
        `moe_layer_freq`: an int k makes layer i an MoE layer when i % k == 0). Empty for dense."""
        if not self.is_moe:
            return ()
        freq = self.moe_layer_freq
        if isinstance(freq, tuple):
            return freq
        return tuple(1 if i % int(freq) == 0 else 0 for i in range(self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_pattern)

    @property
    def moe_fraction(self) -> float:
        """Share of the layers that are mixtures of experts (0 for a dense model)."""
        return self.num_moe_layers / self.num_layers if self.is_moe else 0.0

    @property
    def mean_dense_ffn(self) -> float:
        """FFN width of the tensor-parallel MLP per block, averaged over the layers: `ffn_hidden_size`
        for a dense model; for a mixture of experts the dense layers' FFN and the MoE layers' shared
        experts, weighted by how many layers are of each kind."""
        if not self.is_moe:
            return float(self.ffn_hidden_size)
        share = self.moe_fraction
        return (1.0 - share) * float(self.ffn_hidden_size) + share * self.shared_expert_size

    @property
    def shared_expert_size(self) -> int:
        return int(self.moe_shared_expert_intermediate_size or 0)

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (fc1, gated: two matrices, and fc2)."""
        if not self.is_moe:
            return 0
        return (3 if self.gated_mlp else 2) * self.hidden_size * int(self.moe_ffn_hidden_size)

    @property
    def attention_params(self) -> int:
        """Weights of one block's attention (projections; MLA's down/up projections and norms)."""
        h = self.hidden_size
        if self.multi_latent_attention:
            a = self.num_attention_heads
            qk = int(self.qk_head_dim) + int(self.qk_pos_emb_head_dim)
            q = (h * self.q_lora_rank + self.q_lora_rank * a * qk + self.q_lora_rank
                 if self.q_lora_rank else h * a * qk)
            kv = h * (int(self.kv_lora_rank) + int(self.qk_pos_emb_head_dim)) + int(self.kv_lora_rank) * a * (
                int(self.qk_head_dim) + int(self.v_head_dim)) + int(self.kv_lora_rank)
            return q + kv + self.q_size * h
        return h * (self.q_size + 2 * self.kv_hidden_size) + self.q_size * h

    @property
    def span(self) -> int:
        """Positions each query attends over: `attention_span`, or the whole sample."""
        return self.attention_span if self.attention_span is not None else self.seq_length

    @property
    def kv_hidden_size(self) -> int:
        """Key (or value) width: query groups x head size; under MLA the mean of the up-projected
        keys' and values' widths (heads x (qk + rope + v) / 2)."""
        if self.multi_latent_attention:
            qkv = int(self.qk_head_dim) + int(self.qk_pos_emb_head_dim) + int(self.v_head_dim)
            return self.num_attention_heads * qkv // 2
        return int(self.num_query_groups) * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights (+biases and two norms) of one transformer block; for a mixture of experts the
        mean over the layers of what is not a routed expert (the dense MLP where a layer has one, the
        router and shared experts where it is an MoE layer). `expert_params` are counted apart."""
        h, f = self.hidden_size, int(self.ffn_hidden_size)
        n = 3 if self.gated_mlp else 2
        if not self.is_moe:
            return self.attention_params + n * h * f + 4 * h
        share = self.moe_fraction
        moe = h * int(self.num_moe_experts) + n * h * self.shared_expert_size
        return self.attention_params + round((1 - share) * n * h * f + share * moe) + 4 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        if self.layers:
            return sum(layer.num_params for layer in self.layers)
        head = 0 if self.tied_embeddings else self.embedding_params
        experts = self.num_moe_layers * int(self.num_moe_experts or 0) * self.expert_params
        return (self.num_layers * self.params_per_layer + experts + self.embedding_params + head
                + 2 * self.hidden_size)


# --------------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One accelerator: dense peak TFLOP/s per dtype, memory, HBM bandwidth.

    `gemm_efficiency_max` is the fraction of peak that a large, well-shaped GEMM reaches on this
    family (cuBLAS/hipBLASLt); the efficiency curve in `perfmodels.compute` falls from it for small
    or skinny shards. `gemm_efficiency_fp8` is the same for FP8 GEMMs (None: as for 16-bit).
    `flash_fwd_efficiency` / `flash_bwd_efficiency`: the fraction of the attention dtype's dense peak
    that fused causal attention reaches in forward and in backward (FlashAttention-2 class kernels;
    backward is slower per FLOP: it recomputes the scores and accumulates dQ atomically).
    `memory_efficiency` is the fraction of HBM bandwidth that streaming kernels (norms, softmax,
    element-wise) reach.
    """

    name: str
    peak_tflops_fp32: float
    peak_tflops_tf32: float
    peak_tflops_bf16: float
    peak_tflops_fp16: float
    peak_tflops_fp8: float = 0.0
    memory_gib: float
    hbm_bandwidth_GBps: float
    gemm_efficiency_max: float = 0.85
    gemm_efficiency_fp8: float | None = None
    flash_fwd_efficiency: float = 0.45
    flash_bwd_efficiency: float = 0.35
    memory_efficiency: float = 0.8
    vendor: str = "nvidia"

    def __post_init__(self) -> None:
        for name in (
            "peak_tflops_fp32",
            "peak_tflops_bf16",
            "peak_tflops_fp16",
            "memory_gib",
            "hbm_bandwidth_GBps",
        ):
            _positive_float("gpu", name, getattr(self, name))
            check_plausible(name, getattr(self, name), where=f"gpu.{name}")
        _positive_float("gpu", "peak_tflops_fp8", self.peak_tflops_fp8, allow_zero=True)
        _positive_float("gpu", "peak_tflops_tf32", self.peak_tflops_tf32, allow_zero=True)
        for name in ("peak_tflops_fp8", "peak_tflops_tf32"):
            if getattr(self, name) > 0:  # 0: the GPU has no such unit
                check_plausible(name, getattr(self, name), where=f"gpu.{name}")
        for name in (
            "gemm_efficiency_max",
            "memory_efficiency",
            "flash_fwd_efficiency",
            "flash_bwd_efficiency",
            "gemm_efficiency_fp8",
        ):
            value = getattr(self, name)
            if value is None and name == "gemm_efficiency_fp8":
                continue
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"gpu.{name} must be in (0, 1], got {value!r}")
            check_plausible(name, value, where=f"gpu.{name}")  # a denormal fraction is not finite arithmetic

    def gemm_efficiency(self, dtype: str) -> float:
        """Sustained fraction of `dtype`'s dense peak for large GEMMs."""
        if dtype == "fp8" and self.gemm_efficiency_fp8 is not None and self.peak_tflops_fp8 > 0:
            return float(self.gemm_efficiency_fp8)
        return float(self.gemm_efficiency_max)

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for `dtype`; fp8 falls back to bf16 on parts without fp8 units."""
        _choice("training", "dtype", dtype, DTYPES)
        value = getattr(self, f"peak_tflops_{dtype}")
        if dtype == "fp8" and value == 0:
            return self.peak_tflops_bf16
        if dtype == "tf32" and value == 0:
            return self.peak_tflops_fp32
        return float(value)


@dataclass(frozen=True, kw_only=True)
class CollectiveFit:
    """Fitted alpha-beta constants for one collective at one link level and group size.

    time = latency_steps(op, p) * alpha_us + bytes_factor(op, p) * bytes / (busbw_GBps * 1e9)
    """

    op: str
    level: Literal["intra", "inter"]
    group_size: int
    alpha_us: float
    busbw_GBps: float
    r2: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Constants measured on a real cluster by `gridtune profile` (or imported from nccl-tests).

    `gemm_tflops_max` (the asymptotic TFLOP/s a large GEMM reaches in the training dtype),
    `gemm_half_size` and `gemm_overhead_us` replace the GPU family's efficiency curve (see
    `perfmodels.compute.gemm_time_s`); `corrections` are per-component multipliers from
    calibration against measured steps. `constants` are physical constants of a training stack on
    this cluster fitted to measured runs (`perfmodels.constants.PARAMETERS`, by name), which
    `perfmodels.constants.apply_constants` writes into the GPU, cluster and stack before a prediction.
    """

    profile_id: str = ""
    collectives: tuple[CollectiveFit, ...] = ()
    gemm_tflops_max: float | None = None
    gemm_half_size: float | None = None
    gemm_overhead_us: float | None = None
    hbm_bandwidth_GBps: float | None = None
    corrections: tuple[tuple[str, float], ...] = ()
    source: Literal["profile", "calibrated"] = "profile"
    uncertainty_rel: float | None = None
    constants: tuple[tuple[str, float], ...] = ()
    run_scatter_rel: float | None = None
    """Relative standard deviation of one measured run's step time about its plan's typical time on
    this cluster (run to run), as calibration measured it; part of `uncertainty_rel`, kept so a
    user sees how much of the band is the machine rather than the model."""

    def correction(self, component: str) -> float:
        return dict(self.corrections).get(component, 1.0)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """A homogeneous GPU cluster.

    Bandwidths are per GPU per direction (GB/s): `intra_node_bandwidth_GBps` is the NVLink/xGMI
    bandwidth of one GPU; `inter_node_bandwidth_GBps` is the network bandwidth per GPU (a node's
    NIC bandwidth divided by its GPUs), so a node sends `gpus_per_node * inter_node_bandwidth_GBps`
    in all. `link_efficiency_*` is the fraction of that the collective library reaches as bus
    bandwidth on large messages (a fitted profile replaces both).

    `cpu_cores_per_node`: on a cluster whose "GPUs" are processes on CPU cores (gloo), the physical
    cores a node's ranks share; None (the default) means every rank has a device of its own, as on
    GPUs. With more ranks on a node than cores, the operating system time-slices them: while all
    ranks compute, each gets cores / ranks of the single-rank rate, and a pipeline's idle stages
    hand their core to the busy ones instead of overlapping with them (`ranks_per_core`,
    `perfmodels.steptime._core_sharing_stretch`).
    """

    name: str = "custom"
    num_gpus: int
    gpus_per_node: int
    gpu: GPU
    intra_node_bandwidth_GBps: float
    inter_node_bandwidth_GBps: float
    intra_node_latency_us: float = 5.0
    inter_node_latency_us: float = 10.0
    link_efficiency_intra: float = 0.8
    link_efficiency_inter: float = 0.85
    backend: Literal["nccl", "rccl", "gloo"] = "nccl"
    profile: Profile | None = None
    profile_id: str | None = None
    cpu_cores_per_node: int | None = None

    def __post_init__(self) -> None:
        _positive_int("cluster", "num_gpus", self.num_gpus)
        if self.cpu_cores_per_node is not None:
            _positive_int("cluster", "cpu_cores_per_node", self.cpu_cores_per_node)
            if self.gpu.vendor != "cpu":  # a GPU rank computes on its device, not on the host's cores
                raise ValueError(f"cluster.cpu_cores_per_node={self.cpu_cores_per_node} is for ranks that "
                                 f"compute on CPU cores; cluster.gpu is {self.gpu.name} ({self.gpu.vendor})")
        _positive_int("cluster", "gpus_per_node", self.gpus_per_node)
        if self.num_gpus > 1 << 22:
            raise ValueError(f"cluster.num_gpus={self.num_gpus} is absurd (more than 4,194,304 GPUs)")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ValueError(
                f"cluster.num_gpus={self.num_gpus} is not a whole number of nodes of "
                f"cluster.gpus_per_node={self.gpus_per_node}"
            )
        for name in ("intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps"):
            _positive_float("cluster", name, getattr(self, name))
            check_plausible(name, getattr(self, name), where=f"cluster.{name}")
        for name in ("intra_node_latency_us", "inter_node_latency_us"):
            _positive_float("cluster", name, getattr(self, name), allow_zero=True)
            check_plausible(name, getattr(self, name), where=f"cluster.{name}")
        for name in ("link_efficiency_intra", "link_efficiency_inter"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"cluster.{name} must be in (0, 1], got {value!r}")
            check_plausible(name, value, where=f"cluster.{name}")
        _choice("cluster", "backend", self.backend, BACKENDS)

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def gpus_per_node_used(self) -> int:
        return min(self.gpus_per_node, self.num_gpus)

    def ranks_per_core(self, world_size: np.ndarray | int) -> np.ndarray:
        """A node's ranks per core they share, min(gpus_per_node, world_size) / `cpu_cores_per_node`
        (0 when ranks do not share cores, as on GPUs; `engine.train` reports the same figure).

        Why: a core runs one process at a time; k runnable compute-bound processes on C < k cores
        each get C/k of a core (the kernel's fair scheduler; measured on this project's 2-core test
        machine with 1-4 single-threaded matmul processes: 1.0x, 1.0x, 1.5x, 2.0x the time of one).
        How often the ranks are runnable at once depends on the plan (`perfmodels.steptime`)."""
        world = np.asarray(world_size, dtype=np.float64)
        if self.cpu_cores_per_node is None:
            return np.zeros_like(world)
        return np.minimum(float(self.gpus_per_node), world) / float(self.cpu_cores_per_node)

    def with_gpus(self, num_gpus: int) -> Cluster:
        return replace(self, num_gpus=num_gpus)


# --------------------------------------------------------------------------------------------
# Training setup and plan
# --------------------------------------------------------------------------------------------


CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe_router", "moe_preprocess")
"""The per-layer CUDA-graph scopes of Megatron-Core's Transformer Engine implementation that gridtune
prices (megatron/core/transformer/transformer_config.py `cuda_graph_scope`)."""


@dataclass(frozen=True, kw_only=True)
class Training:
    """How the model is trained, independent of the layout: batch, precision and the software stack.

    `stack` names the framework that runs the layout (a preset of `perfmodels.stacks`, or a `Stack`);
    it decides the optimizer and gradient bytes, what selective recomputation means, the overlaps,
    the host cost and the memory overheads. The option fields below default to None, "what the
    stack does"; a value overrides the stack one option at a time (see `perfmodels.stacks.Stack`
    for what each means). `effective_stack` is the result.

    `dtype` is the precision of the linear layers' GEMMs ("fp8": Transformer Engine's FP8 recipes,
    with bf16 activations and communication); `attention_dtype` the precision of the attention core
    (None: the same as `dtype`, except bf16 under fp8, which is what those recipes do).
    """

    global_batch_size: int
    dtype: Dtype = "bf16"
    attention_dtype: Dtype | None = None
    optimizer: Literal["adam", "adamw", "sgd"] = "adamw"
    stack: str | Stack = DEFAULT_STACK
    overlap_grad_reduce: bool | None = None
    overlap_tp_comm: bool | None = None
    overlap_param_gather: bool | None = None
    overlap_depth_comm: bool | None = None
    flash_attention: bool | None = None
    p2p_scatter_gather: bool | None = None
    zero3_gather: Literal["layer", "tensor"] | None = None
    host_us_per_block: float | None = None
    host_exposed_fraction: float | None = None
    torch_compile: stacks.TorchCompile | None = None
    flash_kernel: stacks.FlashKernel | None = None
    full_recompute_repeats_layer: bool | None = None
    """Whether `recompute="full"` reruns each layer whole (`Stack.full_recompute_repeats_layer`): say
    True for a torchtitan from 2025-08-29 on (full AC with early_stop=False) or a run on torch 2.0
    or older (no early stop), None for what the stack does."""
    moe_token_dispatcher: Literal["alltoall", "flex"] = "alltoall"
    """How MoE layers move tokens: "alltoall" (Megatron-Core's `alltoall` dispatcher, the engine's:
    every (token, expert) pair travels), or "flex" (`--moe-token-dispatcher-type flex` with the
    DeepEP or HybridEP backend: a token goes once to each remote node that holds one of its experts
    and is forwarded over NVLink there; `perfmodels.experts.node_dedup`). Both are dropless and wait
    for the received token counts on the host once per MoE layer forward (`experts.sync_wait_s`)."""
    cuda_graph_scope: tuple[str, ...] = ()
    """Parts of each layer captured in CUDA graphs and replayed (Megatron-Core's `--cuda-graph-impl
    transformer_engine` with `--cuda-graph-scope`, Megatron-Bridge's `cuda_graph_scope`): "attn"
    (the attention sublayer), "mlp" (a dense block's MLP), "moe_router" (an MoE layer's router),
    "moe_preprocess" (its dispatcher's preprocessing before the all-to-all). A captured part costs the
    host one graph launch instead of its ops (`perfmodels.experts.host_ops`); the GPU work is the
    same. Empty: everything is issued op by op (eager)."""
    expert_load_imbalance: float | None = None
    """Tokens on the busiest expert-parallel rank over the mean (None: `experts.EXPERT_LOAD_IMBALANCE`;
    1.0 where the run forces balanced routing, as Megatron-Bridge's MoE benchmarks do with
    `moe_router_force_load_balancing`)."""

    def __post_init__(self) -> None:
        _positive_int("training", "global_batch_size", self.global_batch_size)
        _choice("training", "moe_token_dispatcher", self.moe_token_dispatcher, ("alltoall", "flex"))
        if isinstance(self.cuda_graph_scope, str) or not isinstance(self.cuda_graph_scope, (tuple, list)):
            raise ValueError(f"training.cuda_graph_scope must be a list of {list(CUDA_GRAPH_SCOPES)}, "
                             f"got {self.cuda_graph_scope!r}")
        for scope in self.cuda_graph_scope:
            _choice("training", "cuda_graph_scope", scope, CUDA_GRAPH_SCOPES)
        object.__setattr__(self, "cuda_graph_scope", tuple(dict.fromkeys(self.cuda_graph_scope)))
        if self.expert_load_imbalance is not None:
            value = self.expert_load_imbalance
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= value <= 64.0:
                raise ValueError(f"training.expert_load_imbalance must be a number in [1, 64], got {value!r}")
        _choice("training", "dtype", self.dtype, DTYPES)
        if self.attention_dtype is not None:
            _choice("training", "attention_dtype", self.attention_dtype, ("fp32", "tf32", "bf16", "fp16"))
        _choice("training", "optimizer", self.optimizer, ("adam", "adamw", "sgd"))
        if self.torch_compile is not None:
            _choice("training", "torch_compile", self.torch_compile, stacks.TORCH_COMPILE_VALUES)
        if self.flash_kernel is not None:
            _choice("training", "flash_kernel", self.flash_kernel, stacks.FLASH_KERNEL_VALUES)
        if self.zero3_gather is not None:
            _choice("training", "zero3_gather", self.zero3_gather, ("layer", "tensor"))
        if self.host_us_per_block is not None:
            _positive_float("training", "host_us_per_block", self.host_us_per_block, allow_zero=True)
        for name in _STACK_OVERRIDES:
            value = getattr(self, name)
            if (
                value is not None
                and name not in _NON_BOOL_OVERRIDES
                and not isinstance(value, bool)
            ):
                raise ValueError(f"training.{name} must be true, false or null, got {value!r}")
        object.__setattr__(self, "_stack", self._resolve_stack())

    def _resolve_stack(self) -> Stack:
        base = stacks.resolve(self.stack)
        overrides = {
            name: getattr(self, name) for name in _STACK_OVERRIDES if getattr(self, name) is not None
        }
        try:
            return replace(base, **overrides) if overrides else base
        except ValueError as exc:
            raise ValueError(str(exc).replace("stack.", "training.", 1)) from None

    @property
    def effective_stack(self) -> Stack:
        """The stack preset with this Training's overrides applied."""
        return self._stack  # type: ignore[attr-defined]

    @property
    def stack_name(self) -> str:
        return self.effective_stack.name

    @property
    def linear_dtype(self) -> str:
        return self.dtype

    @property
    def attention_compute_dtype(self) -> str:
        if self.attention_dtype is not None:
            return self.attention_dtype
        return "bf16" if self.dtype == "fp8" else self.dtype

    @property
    def bytes_per_element(self) -> int:
        """Bytes of an activation or a communicated element (fp8 training keeps them bf16)."""
        return {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}[self.dtype]


_STACK_OVERRIDES = ("overlap_grad_reduce", "overlap_tp_comm", "overlap_param_gather", "overlap_depth_comm",
                    "flash_attention", "p2p_scatter_gather", "zero3_gather", "host_us_per_block",
                    "host_exposed_fraction", "torch_compile", "flash_kernel", "full_recompute_repeats_layer")
"""Training fields that, when set, override the stack's behaviour of the same name."""
_NON_BOOL_OVERRIDES = ("zero3_gather", "host_us_per_block", "host_exposed_fraction", "torch_compile",
                       "flash_kernel")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One parallel layout: the grid degrees plus the options that change cost.

    `G_cp`: context parallelism (each sample's sequence split over G_cp ranks; it multiplies the
    world size). `G_ep` / `G_etp`: expert parallelism and expert tensor parallelism of
    mixture-of-experts layers, which re-divide the world / G_inter ranks of one pipeline stage into
    G_etp (innermost) x G_ep x expert-data (Megatron-Core's "MoE parallel folding"); they do not
    multiply the world size. `G_etp=None` is Megatron-Core's default, the tensor-parallel size
    (G_intra_r); `expert_tp` resolves it.
    `placement`: the axis order, innermost (consecutive ranks, fastest links) first; default
    ("col", "row", "cp", "depth", "inter", "data"); an order of the five axes without "cp" gets it
    right after "row". `sequence_parallel`: Megatron-style sequence
    parallelism for the row-parallel (G_intra_r) case (reduce-scatter/all-gather instead of
    all-reduce, activations split over the row group).
    """

    G_data: int = 1
    G_inter: int = 1
    G_intra_d: int = 1
    G_intra_r: int = 1
    G_intra_c: int = 1
    G_cp: int = 1
    G_ep: int = 1
    G_etp: int | None = None
    micro_batch_size: int = 1
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = "1f1b"
    virtual_stages: int = 1
    recompute: Literal["none", "selective", "full"] = "none"
    zero_stage: int = 0
    placement: tuple[str, ...] | None = None
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in (*DEGREE_FIELDS, "G_ep", "micro_batch_size", "virtual_stages"):
            _positive_int("plan", name, getattr(self, name))
        if self.G_etp is not None:
            _positive_int("plan", "G_etp", self.G_etp)
        _choice("plan", "schedule", self.schedule, SCHEDULES)
        _choice("plan", "recompute", self.recompute, RECOMPUTE)
        if isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"plan.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.virtual_stages > 1 and self.schedule != "interleaved-1f1b":
            raise ValueError(
                f"plan.virtual_stages={self.virtual_stages} needs plan.schedule='interleaved-1f1b', "
                f"got {self.schedule!r}"
            )
        if self.placement is not None:
            object.__setattr__(self, "placement", tuple(self.placement))
            placement = default_placement(self.placement)  # the five axes alone: "cp" after "row"
            if sorted(placement) != sorted(AXES):
                raise ValueError(f"plan.placement must be an ordering of {list(AXES)}, got {list(placement)}")

    @property
    def world_size(self) -> int:
        return math.prod(getattr(self, name) for name in DEGREE_FIELDS)

    @property
    def full_order(self) -> tuple[str, ...]:
        """The placement over all six axes (cp included)."""
        return default_placement(self.placement) if self.placement else AXES

    @property
    def order(self) -> tuple[str, ...]:
        """The placement as users see it: over the five AxoNN axes when G_cp = 1 (where "cp" sits
        changes no rank), over all six with context parallelism."""
        if self.G_cp > 1:
            return self.full_order
        return tuple(a for a in self.full_order if a != "cp")

    def degree(self, axis: str) -> int:
        return int(getattr(self, AXIS_FIELDS[axis]))

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallelism: G_etp, or Megatron-Core's default (the tensor-parallel size)."""
        return int(self.G_etp) if self.G_etp is not None else int(self.G_intra_r)

    def grid_string(self) -> str:
        """The degrees; G_cp, G_ep and G_etp only where they are set (a dense grid reads as before)."""
        out = " ".join(f"{name}={getattr(self, name)}" for name in GRID5_FIELDS)
        for name in ("G_cp", "G_ep"):
            if getattr(self, name) != 1:
                out += f" {name}={getattr(self, name)}"
        if self.G_etp is not None:
            out += f" G_etp={self.G_etp}"
        return out


SCALAR_PLAN_FIELDS = tuple(f.name for f in fields(Plan) if f.name != "placement")
"""Every Plan field but the placement: one number or name per plan (the columns of
`perfmodels.plans.PlanArrays`, the CSV of candidates, what differs between two plans)."""


def validate_combination(model: Model, cluster: Cluster, training: Training, plan: Plan) -> None:
    """Check what no single spec can: every problem at once, each naming its fields and values."""
    problems = combination_problems(model, cluster, training, plan)
    if problems:
        raise ValueError("; ".join(problems))


def combination_problems(model: Model, cluster: Cluster, training: Training, plan: Plan) -> list[str]:
    """Every rule of `perfmodels.rules` this plan breaks, in words that name the fields and values
    (empty when the combination is valid). The search applies the same rules to whole columns of
    plans in `tuner/constraints.py`."""
    problems: list[str] = []
    if plan.world_size != cluster.num_gpus:
        named = DEGREE_FIELDS if plan.G_cp != 1 else GRID5_FIELDS
        problems.append(
            f"{'*'.join(named)} = {'*'.join(str(getattr(plan, f)) for f in named)} = "
            f"{plan.world_size} but cluster.num_gpus = {cluster.num_gpus}"
        )
    return problems + plan_problems(model, training, plan)


def plan_problems(model: Model, training: Training, plan: Plan) -> list[str]:
    """The rules of `perfmodels.rules` that involve only the model, the batch and the plan (all of
    `combination_problems` but the world size), in the same words. engine.train asks this too, so
    a plan the engine refuses for a shared rule is refused in perfmodels' words."""
    from perfmodels import rules  # rules is a leaf module; imported here to keep specs free of cycles

    problems: list[str] = []
    gb, mb = training.global_batch_size, plan.micro_batch_size
    if not rules.microbatch_split(gb, plan.G_data, plan.G_intra_d, mb):
        problems.append(
            f"training.global_batch_size={gb} is not divisible by G_data*G_intra_d*micro_batch_size = "
            f"{plan.G_data}*{plan.G_intra_d}*{mb} = {plan.G_data * plan.G_intra_d * mb}"
        )
    problems += _shape_problems(model, plan)
    chunks = plan.G_inter * plan.virtual_stages
    if not rules.enough_layers(model.depth, plan.G_inter, plan.virtual_stages):
        problems.append(
            f"model.num_layers={model.num_layers} is fewer than G_inter*virtual_stages = "
            f"{plan.G_inter}*{plan.virtual_stages} = {chunks} pipeline chunks" if not model.layers else
            f"model has {model.depth} layers, fewer than G_inter*virtual_stages = {chunks}"
        )
    if plan.schedule == "interleaved-1f1b" and plan.G_inter > 1:
        m = rules.num_microbatches(gb, plan.G_data, plan.G_intra_d, mb)
        if not rules.interleave_fits(m, plan.G_inter):
            problems.append(
                f"interleaved-1f1b needs the number of micro-batches ({m}) to be a multiple of "
                f"G_inter={plan.G_inter}"
            )
    if plan.sequence_parallel and not rules.sequence_parallel_row_only(plan.G_intra_d, plan.G_intra_c):
        problems.append(
            "plan.sequence_parallel applies to row-only tensor parallelism (G_intra_c = G_intra_d = 1)"
        )
    return problems + context_expert_problems(model, training, plan)


def context_expert_problems(model: Model, training: Training, plan: Plan) -> list[str]:
    """The rules of context and expert parallelism (`perfmodels.rules`), in words, and whether the
    training stack runs them (`Stack.context_parallel`, `Stack.expert_parallel`)."""
    from perfmodels import rules

    problems: list[str] = []
    if plan.G_cp == 1 and plan.G_ep == 1 and plan.G_etp is None:
        return problems
    if model.kind != "transformer":
        return [f"plan.G_cp={plan.G_cp}, G_ep={plan.G_ep} and G_etp={plan.G_etp} apply to transformers, "
                "not to a model given as a layer list"]
    stack = training.effective_stack
    s = model.seq_length
    if not rules.context_split(s, plan.G_cp):
        problems.append(
            f"G_cp={plan.G_cp} is larger than model.seq_length={s} allows: context parallelism cuts each "
            f"sequence into 2*G_cp = {2 * plan.G_cp} equal chunks (causal load balancing), so 2*G_cp must "
            "divide seq_length")
    if plan.G_cp > 1 and not stack.context_parallel:
        problems.append(f"the {stack.name} stack does not run context parallelism (G_cp={plan.G_cp})")
    if not rules.dense_without_experts(model.is_moe, plan.G_ep):
        problems.append(
            f"G_ep={plan.G_ep} needs a mixture-of-experts model (model.num_moe_experts is not set)")
    if model.is_moe:
        E = int(model.num_moe_experts)
        if not rules.experts_split(E, plan.G_ep):
            problems.append(f"G_ep={plan.G_ep} does not divide model.num_moe_experts={E}")
        stage_ranks = plan.world_size // plan.G_inter
        etp = plan.expert_tp
        if not rules.expert_grid_fits(stage_ranks, plan.G_ep, etp):
            problems.append(
                f"G_etp*G_ep = {etp}*{plan.G_ep} = {etp * plan.G_ep} does not divide the {stage_ranks} ranks "
                "of a pipeline stage (world size / G_inter)")
        if (plan.G_ep > 1 or etp > 1) and not stack.expert_parallel:
            problems.append(f"the {stack.name} stack does not run expert parallelism (G_ep={plan.G_ep}, "
                            f"G_etp={etp})")
    return problems


def _shape_problems(model: Model, plan: Plan) -> list[str]:
    """The tensor-parallel split of a transformer's heads, query groups and hidden sizes (a model
    given as an explicit layer list has its own per-layer `parallel` flags instead)."""
    from perfmodels import rules

    if model.kind != "transformer":
        return []
    problems: list[str] = []
    r, c = plan.G_intra_r, plan.G_intra_c
    if not rules.heads_split(model.num_attention_heads, r):
        problems.append(
            f"G_intra_r={r} does not divide model.num_attention_heads={model.num_attention_heads}"
        )
    elif not rules.query_groups_split(int(model.num_query_groups), r):
        # only said when the heads split: a head split that fails already explains the layout
        problems.append(
            f"G_intra_r={r} and model.num_query_groups={model.num_query_groups}: neither divides the other"
        )
    for name in ("hidden_size", "ffn_hidden_size"):
        size = int(getattr(model, name))
        if not rules.hidden_split(size, r, c):
            problems.append(f"G_intra_r*G_intra_c={r * c} does not divide model.{name}={size}")
    return problems


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Per-GPU memory of the busiest pipeline stage, in GiB."""

    per_gpu_gib: float
    capacity_gib: float
    fits: bool
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    comm_buffers_gib: float
    overhead_gib: float


@dataclass(frozen=True, kw_only=True)
class TimeBreakdown:
    """Where one optimizer step's time goes (seconds, busiest stage, per GPU)."""

    compute_s: float
    gemm_s: float
    attention_s: float
    memory_bound_s: float
    recompute_s: float
    tp_comm_s: float
    tp_comm_row_s: float
    tp_comm_col_s: float
    tp_comm_depth_s: float
    dp_comm_s: float
    pp_bubble_s: float
    pp_p2p_s: float
    optimizer_s: float
    exposed_comm_s: float
    hidden_comm_s: float
    host_wait_s: float = 0.0
    ep_comm_s: float = 0.0
    """Expert all-to-alls (with the load imbalance) and expert tensor-parallel all-reduces."""
    cp_comm_s: float = 0.0
    """Context-parallel ring transfers (all of them; `exposed_comm_s` holds what attention does not hide)."""


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The model's answer for one plan."""

    iteration_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    memory: MemoryBreakdown
    breakdown: TimeBreakdown
    bytes_per_group: dict[str, float] = field(default_factory=dict)
    calls_per_group: dict[str, float] = field(default_factory=dict)
    constants_source: str = "preset"
    uncertainty_rel: float = 0.15
