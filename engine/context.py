"""Context parallelism: causal attention over a sequence split in G_cp chunks, K/V passed in a ring.

    grid = engine.init(G_cp=2, G_data=2)               # axis "cp" (rank order: col, row, cp, ...)
    loader = engine.create_dataloader(ds, 8)           # each cp rank gets its two sequence chunks
    model = engine.ParallelGPT(cfg, grid)              # attention runs as ring attention over "cp"

Load balancing (the shared CP contract; Megatron-Core and torchtitan cut the sequence the same
way): the sequence is cut in 2*G_cp equal chunks and cp rank i holds chunks i and 2*G_cp-1-i, so
every rank has as many causal (query, key) pairs as the others. `local_positions` gives a rank's
token positions, `split_sequence` its part of a [batch, seq, ...] tensor (the data loader applies
it, so every tensor of a batch with a sequence dim arrives already split).

Ring attention (`ring_attention`): each rank keeps its queries; the keys and values of every cp
rank visit it in turn, G_cp - 1 hops to the next rank (K and V stacked into one message), and each
visit adds one block to an online softmax (running log-sum-exp, as flash attention merges
blocks; Liu et al., "Ring Attention with Blockwise Transformers", 2023). The causal mask compares
global positions, so it is exact for the load-balanced order. Backward (a hand-written autograd
Function, no saved K/V of other ranks): K/V travel the ring again (G_cp - 1 hops) with their
gradient accumulator dK/dV, which every rank adds its contribution to and passes on (G_cp hops:
the last one returns each block's gradient to its owner). Per attention layer and micro-batch this
is exactly the contract's traffic on the "cp" group: forward G_cp - 1 sends and receives of
2 * T_c * kvh * e bytes; backward G_cp - 1 of K/V plus G_cp of dK/dV, same size (T_c = local
tokens, kvh = this rank's heads * head_dim).

Why not torch's `context_parallel` (torch.distributed.tensor.experimental): it rewrites SDPA calls
for DTensor inputs and its ring uses all-gather or all-to-all rotation through functional
collectives; the engine's activations are plain tensors with their own row/col layout, and the
contract counts point-to-point sends. The point-to-point ring here works on gloo (isend/irecv of
CPU tensors) and NCCL alike.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from engine.comm import group_rank, group_size
from engine.grid import Grid, GridError


def chunk_ids(cp_rank: int, G_cp: int) -> tuple[int, int]:
    """The two sequence chunks (of 2*G_cp) that cp rank `cp_rank` holds."""
    return cp_rank, 2 * G_cp - 1 - cp_rank


def check_sequence(seq_length: int, G_cp: int) -> None:
    if seq_length % (2 * G_cp):
        raise GridError(f"seq_length={seq_length} is not divisible by 2*G_cp = {2 * G_cp} "
                        "(context parallelism cuts the sequence in 2*G_cp chunks)")


def local_positions(seq_length: int, G_cp: int, cp_rank: int, device: Any = None) -> torch.Tensor:
    """Global positions of the tokens cp rank `cp_rank` holds (seq_length = the full sequence)."""
    if G_cp == 1:
        return torch.arange(seq_length, device=device)
    check_sequence(seq_length, G_cp)
    c = seq_length // (2 * G_cp)
    a, b = chunk_ids(cp_rank, G_cp)
    return torch.cat([torch.arange(a * c, (a + 1) * c, device=device),
                      torch.arange(b * c, (b + 1) * c, device=device)])


def split_sequence(x: torch.Tensor, G_cp: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This cp rank's part (its two chunks, in order) of a tensor with the full sequence on `dim`."""
    if G_cp == 1:
        return x
    seq = x.shape[dim]
    check_sequence(seq, G_cp)
    return x.index_select(dim, local_positions(seq, G_cp, cp_rank, device=x.device))


def grid_positions(grid: Grid, local_length: int, device: Any = None) -> torch.Tensor:
    """Global positions of this rank's `local_length` tokens on `grid` (arange without cp)."""
    G = grid.size("cp") if "cp" in grid.degrees else 1
    return local_positions(local_length * G, G, grid.coord("cp") if G > 1 else 0, device=device)


def _exchange(send: torch.Tensor, group: Any) -> tuple[torch.Tensor, list[Any]]:
    """Post the ring hop: `send` to the next cp rank, a buffer received from the previous one."""
    G, r = group_size(group), group_rank(group)
    recv = torch.empty_like(send)
    works = [dist.isend(send, dist.get_global_rank(group, (r + 1) % G), group=group),
             dist.irecv(recv, dist.get_global_rank(group, (r - 1) % G), group=group)]
    return recv, works


def _wait(works: list[Any]) -> None:
    for w in works:
        w.wait()


def _block(q: torch.Tensor, k: torch.Tensor, pos_q: torch.Tensor, pos_k: torch.Tensor,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked scores of one K block and the causal mask (query position >= key position)."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = pos_q[:, None] >= pos_k[None, :]
    return s.masked_fill(~mask, float("-inf")), mask


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any,
                positions: list[torch.Tensor]) -> torch.Tensor:
        G, r = group_size(group), group_rank(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        kv = torch.stack([k, v]).contiguous()
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        for t in range(G):
            src = (r - t) % G
            pending: list[Any] = []
            if t < G - 1:
                nxt, pending = _exchange(kv, group)
            s, mask = _block(q, kv[0], positions[r], positions[src], scale)
            blk_lse = torch.logsumexp(s, dim=-1)
            p = torch.where(mask, torch.exp(s - blk_lse[..., None]), torch.zeros((), dtype=s.dtype))
            blk_out = torch.matmul(p, kv[1])
            new_lse = torch.logaddexp(lse, blk_lse)
            old_w = torch.exp(lse - new_lse)  # 0 where lse was -inf (no block yet)
            blk_w = torch.where(torch.isinf(blk_lse), torch.zeros((), dtype=q.dtype),
                                torch.exp(blk_lse - new_lse))
            out = out * old_w[..., None] + blk_out * blk_w[..., None]
            lse = new_lse
            if pending:
                _wait(pending)
                kv = nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.positions, ctx.scale = group, positions, scale
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None,
                                                        None]:
        q, k, v, out, lse = ctx.saved_tensors
        group, positions, scale = ctx.group, ctx.positions, ctx.scale
        G, r = group_size(group), group_rank(group)
        dout = dout.contiguous()
        D = (dout * out).sum(-1)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)
        for t in range(G):
            src = (r - t) % G
            pending: list[Any] = []
            if t < G - 1:
                nxt, pending = _exchange(kv, group)
            s, mask = _block(q, kv[0], positions[r], positions[src], scale)
            p = torch.where(mask, torch.exp(s - lse[..., None]), torch.zeros((), dtype=s.dtype))
            dv = torch.matmul(p.transpose(-1, -2), dout)
            dp = torch.matmul(dout, kv[1].transpose(-1, -2))
            ds = p * (dp - D[..., None])
            dq += torch.matmul(ds, kv[0]) * scale
            dk = torch.matmul(ds.transpose(-1, -2), q) * scale
            outgoing = (dkv + torch.stack([dk, dv])).contiguous()
            # the block's gradient travels with it; the last hop returns it to its owner
            dkv, grad_works = _exchange(outgoing, group)
            _wait(grad_works)
            if pending:
                _wait(pending)
                kv = nxt
        return dq, dkv[0], dkv[1], None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, G_cp: int,
                   cp_rank: int) -> torch.Tensor:
    """Causal attention of [b, heads, T, d] local queries over the whole sequence, whose keys and
    values are spread over the cp `group` in the load-balanced order (module docstring)."""
    if group is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    positions = [local_positions(T * G_cp, G_cp, j, device=q.device) for j in range(G_cp)]
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), group, positions)


def causal_attention_cp(qkv: torch.Tensor, heads: int, head_dim: int, grid: Grid) -> torch.Tensor:
    """engine.models.gpt.causal_attention with the sequence split over cp: [b, T, heads*3*head_dim]
    (per-head q, k, v) -> [b, T, heads*head_dim]."""
    b, s, _ = qkv.shape
    q, k, v = qkv.view(b, s, heads, 3, head_dim).permute(3, 0, 2, 1, 4).unbind(0)
    out = ring_attention(q, k, v, grid.comm_group("cp"), grid.size("cp"), grid.coord("cp"))
    return out.transpose(1, 2).reshape(b, s, heads * head_dim)
