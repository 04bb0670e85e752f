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
    num_moe_experts: int | None = None  # Megatron-Core's names; None = dense
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None  # None = ffn
    moe_shared_expert_intermediate_size: int | None = None  # None/0 = no shared expert
    moe_layer_freq: int = 1  # every k-th layer (0, k, 2k, ...) is MoE

    def is_moe_layer(self, i: int) -> bool:
        return bool(self.num_moe_experts) and i % self.moe_layer_freq == 0

    @property
    def moe_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_spec(self, name: str = "gpt"):  # -> perfmodels.specs.Model
        """The perfmodels description of this model (for predictions and the byte contract)."""
        import dataclasses

        from perfmodels.specs import Model

        moe = {"num_moe_experts": self.num_moe_experts, "moe_router_topk": self.moe_router_topk,
               "moe_ffn_hidden_size": self.moe_ffn_hidden_size,
               "moe_shared_expert_intermediate_size": self.moe_shared_expert_intermediate_size,
               "moe_layer_freq": self.moe_layer_freq}
        known = {f.name for f in dataclasses.fields(Model)}  # the MoE fields land with the moe model
        return Model(name=name, num_layers=self.num_layers, hidden_size=self.hidden_size,
                     num_attention_heads=self.num_attention_heads, ffn_hidden_size=self.ffn,
                     seq_length=self.seq_length, vocab_size=self.vocab_size,
                     num_query_groups=self.num_attention_heads, gated_mlp=False,
                     **{k: v for k, v in moe.items() if k in known and self.num_moe_experts})


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


class MoEMLP(nn.Module):
    """Mixture of experts (dropless, top-k): router Linear(hidden -> experts, no bias), softmax,
    the k largest probabilities renormalized to sum to one (Mixtral's gating), each token's output
    the weighted sum of its k experts' GELU MLPs (no biases, Megatron-Core's default for experts),
    plus an optional shared expert (a dense MLP every token goes through)."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int = 2,
                 shared_ffn: int | None = None) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"moe_router_topk must be in 1..num_moe_experts={num_experts}, got {top_k}")
        self.top_k = top_k
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.fc1 = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        self.fc2 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        for e in range(num_experts):  # nn.Linear's default initialization, expert by expert
            nn.init.kaiming_uniform_(self.fc1.data[e], a=5 ** 0.5)
            nn.init.kaiming_uniform_(self.fc2.data[e], a=5 ** 0.5)
        self.shared = None
        if shared_ffn:
            self.shared = nn.Sequential(nn.Linear(hidden, shared_ffn), nn.GELU(),
                                        nn.Linear(shared_ffn, hidden))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, hidden] -> (expert index [N, k], weight [N, k]). The probabilities are fp32 whatever
        the compute dtype, as Megatron-Core's router computes them (moe_utils.topk_softmax_with_capacity)."""
        probs = torch.softmax(self.router(x), dim=-1, dtype=torch.float32)
        top, idx = probs.topk(self.top_k, dim=-1)
        return idx, top / top.sum(-1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        idx, w = self.route(x)
        out = torch.zeros_like(x)
        for e in range(self.fc1.shape[0]):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            y = F.gelu(x[tok] @ self.fc1[e].t()) @ self.fc2[e].t()
            out = out.index_add(0, tok, (y * w[tok, slot, None]).to(out.dtype))
        if self.shared is not None:
            out = out + self.shared(x)
        return out.reshape(shape)


def moe_of(cfg: GPTConfig) -> MoEMLP:
    return MoEMLP(cfg.hidden_size, cfg.moe_ffn, cfg.num_moe_experts or 0, cfg.moe_router_topk,
                  cfg.moe_shared_expert_intermediate_size)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, index: int = 0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size)
        self.mlp = moe_of(cfg) if cfg.is_moe_layer(index) else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_emb = nn.Embedding(cfg.seq_length, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
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
