"""The performance model's description of a torch model, read off its modules without allocating.

Why: `engine.train(..., auto=True)` must ask the tuner for a layout before the model exists on any
device. Building the model under `torch.device("meta")` gives every shape with no memory, and a
walk over its modules gives the layer list the model needs.

    from engine.extract import model_spec
    spec = model_spec(GPTConfig(num_layers=4, hidden_size=64))       # built-in GPT: transformer spec
    spec = model_spec(lambda: MyNet(), rows_per_sample=1)            # any net: a layer list

- the built-in GPT (a `GPTConfig`, a `GPT`, or a factory returning one) maps to the transformer
  `Model` with the same sizes (`GPTConfig.to_spec`), which is what perfmodels.traffic counts;
- any other `nn.Module`: each `nn.Linear` (and transformers' `Conv1D`) becomes
  `LayerSpec(kind="linear", in/out/bias, rows_per_sample)`, each other leaf module with parameters
  (norms, embeddings, convolutions) `LayerSpec(kind="other", params=..., flops_per_sample=...)`;
  the result is `Model(layers=...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from engine.models.gpt import GPT, GPTConfig
from engine.parallelize import is_conv1d
from perfmodels.specs import LayerSpec, Model

ModelLike = GPTConfig | nn.Module | Callable[[], nn.Module]


def build_on_meta(factory: Callable[[], nn.Module]) -> nn.Module:
    """Run `factory()` with parameters created on the meta device (shapes only, no storage)."""
    with torch.device("meta"):
        return factory()


def gpt_config_of(model: ModelLike) -> GPTConfig | None:
    """The GPTConfig when `model` is (or builds) the built-in GPT, else None."""
    if isinstance(model, GPTConfig):
        return model
    if isinstance(model, GPT):
        return model.cfg
    if callable(model) and not isinstance(model, nn.Module):
        built = build_on_meta(model)
        return built.cfg if isinstance(built, GPT) else None
    return None


def layer_specs(module: nn.Module, *, rows_per_sample: int = 1) -> tuple[LayerSpec, ...]:
    """One LayerSpec per leaf module that has parameters, in registration order."""
    layers: list[LayerSpec] = []
    for name, sub in module.named_modules():
        if any(True for _ in sub.children()):
            continue
        params = sum(p.numel() for p in sub.parameters(recurse=False))
        if isinstance(sub, nn.Linear) or is_conv1d(sub):  # transformers' Conv1D: weight [in, out]
            k, n = (sub.in_features, sub.out_features) if isinstance(sub, nn.Linear) else sub.weight.shape
            layers.append(LayerSpec(name=name or "linear", kind="linear", in_features=int(k),
                                    out_features=int(n), bias=getattr(sub, "bias", None) is not None,
                                    rows_per_sample=rows_per_sample, parallel=True))
        elif params:
            # element-wise-ish work: a couple of FLOPs per parameter per row (norms, embeddings)
            layers.append(LayerSpec(name=name or type(sub).__name__, kind="other", params=int(params),
                                    flops_per_sample=float(2 * params * rows_per_sample),
                                    activation_elements_per_sample=float(rows_per_sample)))
    if not layers:
        raise ValueError(f"{type(module).__name__} has no parameters to train")
    return tuple(layers)


def model_spec(model: ModelLike, *, rows_per_sample: int = 1, name: str | None = None) -> Model:
    """perfmodels Model for the built-in GPT (transformer fields) or any net (a layer list).

    A factory is built on the meta device; an existing module is only walked (nothing copied).
    """
    cfg = gpt_config_of(model)
    if cfg is not None:
        return cfg.to_spec(name or "gpt")
    module: Any = model if isinstance(model, nn.Module) else build_on_meta(model)
    return Model(name=name or type(module).__name__,
                 layers=layer_specs(module, rows_per_sample=rows_per_sample))
