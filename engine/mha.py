"""A head-parallel `nn.MultiheadAttention` for engine.auto_parallelize(attention=True).

Heads are split over the row group (Megatron's attention split): each rank keeps the q/k/v rows
of its heads in `in_proj_weight`/`in_proj_bias` and the matching input columns of `out_proj`,
attends with its heads only, and the partial outputs are summed over row (forward all-reduce,
backward identity); the input goes through `copy_to` (backward all-reduce over row). out_proj's
bias is replicated and added after the sum. Values: a full nn.MultiheadAttention is built with
its own initialization and only this rank's slices are kept (single-process values). Supported:
self- or cross-attention with equal embed dims, `batch_first` either way, `attn_mask` (bool or
float, 2-D), `key_padding_mask`, `is_causal`, dropout 0; `need_weights` is ignored (returns
None, like `need_weights=False`). Other configurations fall back to nn.MultiheadAttention.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.comm import copy_to, group_rank, group_size, reduce_from
from engine.grid import Grid
from engine.shard import ShardSpec, mark


class HeadParallelMultiheadAttention(nn.Module):
    def __init__(self, full: nn.MultiheadAttention, *, grid: Grid) -> None:
        super().__init__()
        self.group = grid.comm_group("row")
        p, r = group_size(self.group), group_rank(self.group)
        E, H = full.embed_dim, full.num_heads
        self.embed_dim, self.num_heads, self.local_heads = E, H, H // p
        self.head_dim = E // H
        self.batch_first = full.batch_first
        n = self.local_heads * self.head_dim
        rows = torch.cat([torch.arange(i * E + r * n, i * E + (r + 1) * n) for i in range(3)])
        dev = grid.device
        # nn.MultiheadAttention's (3E, E) in_proj_weight is held as (3, E, E) (q, k, v), split over row
        # on dim 1: engine.full_state_dict returns it in that shape (reshape(3 * E, E) for nn's)
        in_proj = full.in_proj_weight.detach()[rows].clone().view(3, n, E).to(dev)
        self.in_proj_weight = mark(nn.Parameter(in_proj), ShardSpec(full_shape=(3, E, E), row_dim=1))
        self.in_proj_bias = mark(nn.Parameter(full.in_proj_bias.detach()[rows].clone().view(3, n).to(dev)),
                                 ShardSpec(full_shape=(3, E), row_dim=1))
        self.out_proj = nn.Module()
        out_proj = full.out_proj.weight.detach()[:, r * n:(r + 1) * n].clone().to(dev)
        self.out_proj.weight = mark(nn.Parameter(out_proj), ShardSpec(full_shape=(E, E), row_dim=1))
        self.out_proj.bias = nn.Parameter(full.out_proj.bias.detach().clone().to(dev))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, None]:
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        q_in, k_in, v_in = (copy_to(t, self.group) for t in (query, key, value))
        w, b = self.in_proj_weight, self.in_proj_bias
        B, L, _ = q_in.shape
        S = k_in.shape[1]
        q = F.linear(q_in, w[0], b[0]).view(B, L, self.local_heads, self.head_dim).transpose(1, 2)
        k = F.linear(k_in, w[1], b[1]).view(B, S, self.local_heads, self.head_dim).transpose(1, 2)
        v = F.linear(v_in, w[2], b[2]).view(B, S, self.local_heads, self.head_dim).transpose(1, 2)
        mask = None
        if attn_mask is not None:
            mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask
            if mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask,
                                                                                         float("-inf"))
        if key_padding_mask is not None:
            kp = key_padding_mask.view(B, 1, 1, S)
            kp = torch.zeros(kp.shape, dtype=q.dtype, device=q.device).masked_fill(kp.bool(), float("-inf")) \
                if kp.dtype == torch.bool else kp.to(q.dtype)
            mask = kp if mask is None else mask + kp
        if is_causal and mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(B, L, -1)
        out = reduce_from(F.linear(out, self.out_proj.weight), self.group) + self.out_proj.bias
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, None


def make_mha(original: Any, grid: Grid) -> Any:
    def mha(embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
            add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: Any = None, vdim: Any = None,
            batch_first: bool = False, device: Any = None, dtype: Any = None) -> nn.Module:
        full = original(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim,
                        batch_first, device=device, dtype=dtype)
        p = grid.size("row")
        if (p == 1 or num_heads % p or dropout or not bias or add_bias_kv or add_zero_attn
                or not full._qkv_same_embed_dim):
            return full
        return HeadParallelMultiheadAttention(full, grid=grid)

    return mha
