"""A small GPT (decoder-only transformer) in plain PyTorch, with no distributed code.

Token embedding + learned position embedding, `num_layers` pre-LN blocks (LayerNorm, QKV Linear,
causal attention, out-proj, residual; LayerNorm, fc1, GELU, fc2, residual), a final LayerNorm and
an untied LM head Linear(hidden -> vocab, no bias); `forward(tokens, targets)` returns the mean
cross entropy. The QKV output is laid out per head as [head, (q, k, v), head_dim] so that splitting
its features into contiguous parts splits whole heads (what the parallel version does over row).

engine.parallel_gpt.ParallelGPT.from_serial(gpt, grid) builds the 3D/pipeline-parallel version
with the same values; the equivalence tests train both and compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    num_layers: int = 2
    hidden_size: int = 32
    num_attention_heads: int = 8
    ffn_hidden_size: int | None = None
    seq_length: int = 8
    vocab_size: int = 64

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_spec(self, name: str = "gpt"):  # -> perfmodels.specs.Model
        """The perfmodels description of this model (for predictions and the byte contract)."""
        from perfmodels.specs import Model

        return Model(name=name, num_layers=self.num_layers, hidden_size=self.hidden_size,
                     num_attention_heads=self.num_attention_heads, ffn_hidden_size=self.ffn,
                     seq_length=self.seq_length, vocab_size=self.vocab_size,
                     num_query_groups=self.num_attention_heads, gated_mlp=False)


def causal_attention(qkv: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """[b, s, heads*3*head_dim] (per-head q, k, v) -> [b, s, heads*head_dim]."""
    b, s, _ = qkv.shape
    q, k, v = qkv.view(b, s, heads, 3, head_dim).permute(3, 0, 2, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, s, heads * head_dim)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(causal_attention(self.qkv(x), self.heads, self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.ffn)
        self.fc2 = nn.Linear(cfg.ffn, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_emb = nn.Embedding(cfg.seq_length, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
