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
"""

from __future__ import annotations

from torch import nn

from engine.grid import Grid, current_grid
from engine.linear import Linear, split_problems


def parallelize(model: nn.Module, grid: Grid | None = None, *, transpose: bool = False) -> nn.Module:
    """Replace, in place, every splittable nn.Linear of `model` by an engine.Linear; returns `model`."""
    grid = current_grid(grid)
    uses: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            uses[id(p)] = uses.get(id(p), 0) + 1
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or uses.get(id(child.weight), 0) > 1:
                continue
            if split_problems(child.in_features, child.out_features, transpose, grid.degrees):
                continue
            new = Linear.from_dense(child, transpose=transpose, grid=grid)
            new.requires_grad_(child.weight.requires_grad)
            setattr(parent, name, new)
    return model
