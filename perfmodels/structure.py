"""What a network is made of, as the cost model reads it: the units a pipeline stage holds.

Every `Model` describes itself as a tuple of `Unit`s (`Model.units`), and compute, memory and the
model FLOPs evaluate that one description, whichever kind of model it came from:

- a transformer is three units: its block (four grid-split Linears, the attention core and the
  residual stream's element-wise work) repeated `num_layers` times, the LM head (a vocabulary
  Linear and the loss) on the last stage, and the embedding on the first;
- an explicit layer list (`Model(layers=...)`, what `engine.extract` reads from an `nn.Module`) is
  one unit holding all its layers in order, spread evenly over the pipeline stages, each Linear
  split where auto_parallelize splits it.

A stage's cost is the sum over units of (how many of the unit the stage holds) x (the unit's cost).
The vectorized transformer formulas are that sum for the repeated-block case: the block is
evaluated once, over all plans at once, and multiplied by the stage's block count.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from perfmodels.specs import Model

Split = Literal["grid", "auto", "plain"]
Placement = Literal["block", "embedding", "head", "spread"]
Degree = int | np.ndarray


@dataclass(frozen=True)
class Linear:
    """Linear(k -> n) applied to `rows_per_sample` rows of every sample.

    `split`: "grid" is a 3D-parallel Linear whose shapes the plan rules make divide (a transformer's:
    a "normal" one splits n over row and k over col, a `transposed` one the other way round);
    "auto" is auto_parallelize's: 3D-parallel where its shapes divide, else replicated; "plain" is
    replicated on every rank. `vocab`: n is a vocabulary, padded to a multiple of G_r*G_d.
    """

    name: str
    k: int
    n: int
    rows_per_sample: int
    transposed: bool = False
    bias: bool = True
    split: Split = "grid"
    vocab: bool = False
    share: float = 1.0
    """Fraction of the unit's copies that hold this Linear: a block's dense MLP where only some
    layers are dense (mixture-of-experts models), its shared experts where only some are MoE."""

    def divides(self, out_split: Degree, in_split: Degree, depth: Degree) -> bool | np.ndarray:
        """Whether this Linear is split on a grid whose output/input feature splits and depth degree
        are these: always for a "grid" Linear, never for a "plain" one, and for an "auto" one where n
        divides over `out_split`, k over `in_split` and the weight shard over `depth`."""
        if self.split != "auto":
            return self.split == "grid"
        n, k = self.n, self.k
        shard = (n // out_split) * (k // in_split)
        return ((n % out_split) == 0) & ((k % in_split) == 0) & (shard % depth == 0)

    @property
    def flops_per_row(self) -> float:
        """Forward FLOPs per row (2 per multiply-add, unpadded shapes)."""
        return 2.0 * self.k * self.n


@dataclass(frozen=True)
class Other:
    """A layer known only by its parameters, forward FLOPs and the activation elements it keeps per
    sample (norms, embeddings, convolutions of a layer list; replicated on every rank)."""

    name: str
    params: int
    flops_per_sample: float
    activation_elements_per_sample: float


@dataclass(frozen=True)
class Unit:
    """One part of a network and where the pipeline puts it.

    `placement`: "block" units repeat `count` times and are split over the stages by
    `traffic.stage_shape` (a stage holds `StageShape.blocks` of them); the "embedding" sits on the
    first stage, the "head" on the last; a "spread" unit is divided evenly, 1/G_inter of it on
    every stage. `layers` run in order (Linears and `Other`s). `attention`: the unit is a
    transformer block, so it also has the attention core, the residual stream's norms and
    element-wise kernels and Korthikanti's activations, shaped by the Model's fields. `loss`: the
    unit ends in the loss (its logits go through softmax and cross entropy). `params`: the
    parameters one copy of the unit holds, as the memory model counts them.
    """

    name: str
    placement: Placement
    count: int = 1
    layers: tuple[Linear | Other, ...] = ()
    params: int = 0
    attention: bool = False
    loss: bool = False

    @property
    def linears(self) -> tuple[Linear, ...]:
        return tuple(layer for layer in self.layers if isinstance(layer, Linear))

    @property
    def issues_host_ops(self) -> bool:
        """Whether the host's per-block issue time (`compute.host_seconds_per_block`) applies: to
        transformer blocks and the head; a spread layer list's host costs are inside its compute."""
        return self.placement in ("block", "head")


def _attention_linears(model: Model) -> tuple[Linear, ...]:
    """The attention projections of a block: QKV and the output projection (queries of
    `Model.q_size`), or multi-latent attention's (Megatron-Core `MLASelfAttention`: the query and
    key/value down-projections are not split over tensor-parallel ranks, "duplicated"; the
    up-projections are column-parallel, the output projection row-parallel)."""
    h, kv, s, q = model.hidden_size, model.kv_hidden_size, model.seq_length, model.q_size
    bias = not model.gated_mlp
    if not model.multi_latent_attention:
        return (Linear("qkv", h, q + 2 * kv, s, bias=bias),
                Linear("out_proj", q, h, s, transposed=True, bias=bias))
    a, pos = model.num_attention_heads, int(model.qk_pos_emb_head_dim)
    qk, v, kv_rank = int(model.qk_head_dim) + pos, int(model.v_head_dim), int(model.kv_lora_rank)
    out: list[Linear] = []
    if model.q_lora_rank:
        out += [Linear("q_down", h, int(model.q_lora_rank), s, bias=False, split="plain"),
                Linear("q_up", int(model.q_lora_rank), a * qk, s, bias=False)]
    else:
        out.append(Linear("q", h, a * qk, s, bias=False))
    out += [Linear("kv_down", h, kv_rank + pos, s, bias=False, split="plain"),
            Linear("kv_up", kv_rank, a * (int(model.qk_head_dim) + v), s, bias=False),
            Linear("out_proj", a * v, h, s, transposed=True, bias=False)]
    return tuple(out)


def _mlp_linears(model: Model) -> tuple[Linear, ...]:
    """A block's tensor-parallel MLPs: the dense MLP in the layers that have one, the shared experts
    in the mixture-of-experts layers (their routed experts are `perfmodels.experts`')."""
    h, f, s = model.hidden_size, int(model.ffn_hidden_size), model.seq_length
    gated, bias = model.gated_mlp, not model.gated_mlp
    up = 2 if gated else 1
    moe = model.moe_fraction
    out: list[Linear] = []
    if moe < 1.0:
        out += [Linear("fc1", h, up * f, s, bias=bias, share=1.0 - moe),
                Linear("fc2", f, h, s, transposed=True, bias=bias, share=1.0 - moe)]
    fs = model.shared_expert_size
    if moe > 0.0 and fs:
        # a shared expert is an MLP of the block's kind (Megatron's SharedExpertMLP follows
        # add_bias_linear as the dense MLP does)
        out += [Linear("shared_fc1", h, up * fs, s, bias=bias, share=moe),
                Linear("shared_fc2", fs, h, s, transposed=True, bias=bias, share=moe)]
    return tuple(out)


def _transformer_units(model: Model) -> tuple[Unit, ...]:
    h, s = model.hidden_size, model.seq_length
    block = Unit(
        name="block", placement="block", count=model.num_layers, params=model.params_per_layer,
        attention=True, layers=(*_attention_linears(model), *_mlp_linears(model)),
    )
    embedding = Unit(name="embedding", placement="embedding", params=model.embedding_params)
    lm_head = Linear("lm_head", h, model.vocab_size, s, bias=False, vocab=True)
    head = Unit(name="head", placement="head", loss=True, layers=(lm_head,),
                params=0 if model.tied_embeddings else model.embedding_params)
    return (block, head, embedding)


def _layer_list_units(model: Model) -> tuple[Unit, ...]:
    layers: list[Linear | Other] = []
    for spec in model.layers:
        if spec.kind == "linear":
            layers.append(Linear(spec.name, spec.in_features, spec.out_features, spec.rows_per_sample,
                                 transposed=spec.transpose, bias=spec.bias,
                                 split="auto" if spec.parallel else "plain"))
        else:
            layers.append(Other(spec.name, spec.params, float(spec.flops_per_sample),
                                float(spec.activation_elements_per_sample)))
    return (Unit(name="layers", placement="spread", layers=tuple(layers), params=model.num_params),)


@lru_cache(maxsize=128)
def units_of(model: Model) -> tuple[Unit, ...]:
    """The units of `model` (see the module docstring); `Model.units` calls this."""
    return _transformer_units(model) if model.kind == "transformer" else _layer_list_units(model)
