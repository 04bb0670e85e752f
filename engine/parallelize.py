"""`engine.parallelize(model)`: split the `torch.nn.Linear`s of a model that is already built.

    model = LlamaForCausalLM(LlamaConfig(...))        # or transformers' from_pretrained, any nn.Module
    model = engine.wrap(engine.parallelize(model, grid))
    engine.save_consolidated("model.pt", model)      # a state_dict that loads back into transformers

Why next to engine.auto_parallelize: libraries such as Hugging Face transformers re-initialize
their layers after construction with `isinstance(module, nn.Linear)` checks, which a constructor
swapped during construction cannot pass; sharding the finished model keeps every value (and the
library's own initialization) exactly, so multi-rank training equals single-process training.
Each `nn.Linear` (exact class) whose shapes divide on the grid becomes `engine.Linear.from_dense`
(same values, this rank's shard, same parameter names); a Linear whose weight is shared with
another module (tied embeddings) stays replicated. The full model exists once per rank during the
call, so use it for models that fit one device (the shards are what training keeps).

transformers' `Conv1D` (GPT-2's attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj: a Linear whose
weight is stored [in, out]) becomes `engine.Linear.from_conv1d`: split exactly like nn.Linear,
weight kept in Conv1D's [in, out] layout, so `engine.full_state_dict` / `save_consolidated` give
Conv1D's keys and shapes (GPT2LMHeadModel.load_state_dict reads them). c_attn fuses q, k and v in
its output columns; engine.Linear all-gathers its full output (over row) before returning it, so
the attention module splits and reshapes by heads exactly as in one process: no column
permutation is needed (tests/engine/test_hf.py proves the values at 1e-5).

A mixture-of-experts block (`engine.models.gpt.MoEMLP`, or any module with its layout: `router`
Linear, `fc1` [experts, ffn, hidden] and `fc2` [experts, hidden, ffn] parameters, `top_k`,
optional `shared`) becomes `engine.MoE.from_serial`: experts over the grid's ep group, each FFN
split over etp (engine.moe), same values.
"""

from __future__ import annotations

from torch import nn

from engine.grid import Grid, current_grid
from engine.linear import Linear, split_problems


def is_conv1d(module: nn.Module) -> bool:
    """Whether `module` is transformers' `Conv1D` (checked by name: transformers stays optional)."""
    cls = type(module)
    return (cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.")
            and isinstance(getattr(module, "weight", None), nn.Parameter) and module.weight.dim() == 2)


def is_moe_block(module: nn.Module) -> bool:
    """engine.models.gpt.MoEMLP or a module with its layout (router, fc1/fc2 expert stacks, top_k)."""
    fc1, fc2 = getattr(module, "fc1", None), getattr(module, "fc2", None)
    return (isinstance(getattr(module, "router", None), nn.Linear) and isinstance(fc1, nn.Parameter)
            and isinstance(fc2, nn.Parameter) and fc1.dim() == 3 and fc2.dim() == 3
            and isinstance(getattr(module, "top_k", None), int))


def parallelize(model: nn.Module, grid: Grid | None = None, *, transpose: bool = False) -> nn.Module:
    """Replace, in place, every splittable nn.Linear (and transformers Conv1D) of `model` by an
    engine.Linear; returns `model`."""
    grid = current_grid(grid)
    uses: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            uses[id(p)] = uses.get(id(p), 0) + 1
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if is_moe_block(child):
                from engine.moe import MoE

                setattr(parent, name, MoE.from_serial(child, grid))
                continue
            conv1d = is_conv1d(child)
            if (type(child) is not nn.Linear and not conv1d) or uses.get(id(child.weight), 0) > 1:
                continue
            in_features, out_features = (child.weight.shape if conv1d
                                         else (child.in_features, child.out_features))
            if split_problems(in_features, out_features, transpose, grid.degrees):
                continue
            if conv1d:
                new = Linear.from_conv1d(child, transpose=transpose, grid=grid)
            else:
                new = Linear.from_dense(child, transpose=transpose, grid=grid)
            new.requires_grad_(child.weight.requires_grad)
            setattr(parent, name, new)
    return model
