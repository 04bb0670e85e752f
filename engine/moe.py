"""Expert parallelism: `engine.MoE`, a mixture-of-experts MLP with its experts split over G_ep ranks
(all-to-all dispatch and combine) and each expert's FFN split over G_etp ranks.

    grid = engine.init(G_data=4, G_ep=2)            # experts over "ep", replicas over "edp"
    moe = engine.MoE(hidden, ffn, num_experts=8, top_k=2, grid=grid)      # or MoE.from_serial(...)
    y = moe(x)                                       # x, y: [..., hidden], this rank's tokens

The math is engine.models.gpt.MoEMLP's (dropless top-k, Mixtral's renormalized gating, bias-free
GELU experts, optional shared expert): `MoE.from_serial(serial)` keeps the same values, so a model
trains exactly as in one process. The groups (engine.grid.expert_groups, the shared contract):
one pipeline stage's ranks re-divided into etp (innermost) x ep x edp, Megatron-Core's "MoE
parallel folding"; expert e lives on ep rank e // (num_experts / G_ep).

Per MoE layer and micro-batch, with T local tokens, k = top_k and h = hidden:
- forward: the T*k (token, expert) rows, sorted by destination, go through one all-to-all over
  "ep" (dispatch, input [T*k, h]); each rank runs its experts on what it received and the results
  go back through a second all-to-all (combine, input = the rows it received); backward: the same
  two again, with their gradients. Summed over the ep group both carry T*k*h elements per rank on
  average (the contract's figure); a rank's combine input is what the routing sent it.
- G_etp > 1: fc1 split by output features, fc2 by input features over "etp" (Megatron TP). With
  the etp group the row group (G_etp = G_intra_r) its members hold the same tokens: the partial
  expert outputs are combined and then all-reduced over "etp" as [T*k, h] rows, and the
  dispatched input's gradient is all-reduced over "etp" before the dispatch's backward (again
  [T*k, h]). Otherwise see folding below. Either way the contract's etp traffic.
- expert gradients are all-reduced over "edp" by engine.sync_gradients (they are not replicated
  over data: `engine.grads.is_expert`), the router over data like any replicated parameter; the
  shared expert is split over row x col like the dense MLP (its output all-reduced over row).

Which all-to-all: `torch.distributed.all_to_all_single` with uneven split sizes. In torch 2.13 gloo
implements it for CPU tensors (ProcessGroupGloo alltoall_base, gloo's alltoallv), so one code path
serves gloo and NCCL; older gloo builds lacked it ("ProcessGroupGloo does not support alltoall"),
which is why this module keeps all dispatch traffic in one function (`_all_to_all`). The split
sizes themselves (G_ep integers) and the destination expert of every row travel in small
metadata all-to-alls that the communication recorder does not count (engine.recorder.uncounted):
the contract and perfmodels.traffic count payload only.

G_etp other than G_intra_r (Megatron-Core's "MoE parallel folding": the stage's ranks re-divided
into etp x ep x edp independently of the attention's row group), in Megatron-Core's order
(`MoEAlltoAllTokenDispatcher` in megatron/core/transformer/moe/token_dispatcher.py at
NVIDIA/Megatron-LM d98e8a64, and the region functions of megatron/core/tensor_parallel/mappings.py):
- the engine's activations are replicated over row, so each rank first keeps its 1/G_intra_r of the
  tokens (with their gates and experts; the routing is computed before the split, on values every
  row rank holds), as Megatron's sequence parallelism gives every rank its own tokens; backward
  all-gathers the input's and the gates' gradients over row;
- the T/G_intra_r tokens' rows are dispatched over "ep" as above;
- the etp group all-gathers the rows its members received (`dispatch_postprocess`:
  gather_from_sequence_parallel_region over the expert tensor-parallel group; backward
  reduce-scatter) and each member runs its fc1 columns and fc2 rows on all of them;
- the partial outputs are reduce-scattered back to the member that received each row
  (`combine_preprocess`: reduce_scatter_to_sequence_parallel_region; backward all-gather), combined
  over "ep", weighted by the gates, and the row group all-gathers the tokens back.
The row counts of an etp group's members differ (routing): the gathers and reduce-scatters move
exactly the rows (list all_gather / reduce_scatter with split sizes, as Megatron's
`output_split_sizes`; gloo refuses uneven all-gather lists, so there one all-reduce of the same
rows at their offsets stands in). The recorder's bytes are perfmodels.experts' for the gridtune
stack's plan (`sequence_split`, `emulated_split`; tests/engine/test_contract_moe_cp.py).

Limits (GridError before any collective): G_intra_c = G_intra_d = 1 for MoE layers, G_etp divides
moe_ffn_hidden_size, G_ep divides the number of experts (engine.init: G_etp*G_ep divides the ranks of
a pipeline stage). AxoNN's own MoE shards experts over its depth group; here the expert axes are
Megatron-Core's instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.linear import Linear as TorchLinear  # bound at import: auto_parallelize swaps nn.Linear

from engine.comm import copy_to, reduce_from
from engine.grads import EXPERT_ATTR
from engine.grid import Grid, GridError, current_grid
from engine.models.gpt import MoEMLP


def moe_problems(grid: Grid, num_experts: int, ffn: int) -> list[str]:
    d = grid.degrees
    G_ep, G_etp = d.get("ep", 1), d.get("etp", d["row"])
    out = []
    if num_experts % G_ep:
        out.append(f"G_ep={G_ep} does not divide num_moe_experts={num_experts}")
    if d["col"] != 1 or d["depth"] != 1:
        out.append(f"MoE layers need G_intra_c=1 and G_intra_d=1, got {d['col']} and {d['depth']}")
    if ffn % G_etp:
        out.append(f"G_etp={G_etp} does not divide moe_ffn_hidden_size={ffn}")
    return out


def _row_sizes(n: int, parts: int) -> list[int]:
    """torch.tensor_split's chunk sizes: n rows over `parts` members, the first n % parts one longer."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _gather_rows(x: torch.Tensor, sizes: list[int], group: Any) -> torch.Tensor:
    """Concatenate every member's rows (member i holds sizes[i]) in group-rank order: one all-gather
    whose output is exactly the sum(sizes) rows (the contract's payload, no padding).

    Equal sizes: all_gather_into_tensor. Uneven ones: a list all_gather into views of the output,
    as Megatron-Core's `_gather_along_first_dim(output_split_sizes=...)` does
    (megatron/core/tensor_parallel/mappings.py at NVIDIA/Megatron-LM d98e8a64); gloo refuses uneven
    lists ("ProcessGroupGloo::allgather: invalid tensor size"), so there each member's rows go into
    a zeroed output at their offset and one all-reduce sums them: the same output, one call of the
    same size on the same group (on the wire an all-reduce, as `engine.comm.reduce_scatter_consumed`
    trades gloo's missing reduce-scatter)."""
    r, total = dist.get_rank(group), sum(sizes)
    x = x.contiguous()
    out = x.new_empty((total, *x.shape[1:]))
    if len(set(sizes)) == 1:
        dist.all_gather_into_tensor(out, x, group=group)
    elif dist.get_backend(group) == "gloo":
        out.zero_()
        start = sum(sizes[:r])
        out[start:start + sizes[r]] = x
        dist.all_reduce(out, group=group)
    else:
        dist.all_gather(list(out.split(sizes)), x, group=group)
    return out


def _reduce_scatter_rows(x: torch.Tensor, sizes: list[int], group: Any) -> torch.Tensor:
    """Sum `x` (sum(sizes) rows, every member's) over the group and keep this member's sizes[r] rows:
    reduce_scatter_tensor for equal sizes, a list reduce_scatter for uneven ones (Megatron-Core's
    `_reduce_scatter_along_first_dim(input_split_sizes=...)`; gloo implements the uneven list)."""
    r = dist.get_rank(group)
    x = x.contiguous()
    out = x.new_empty((sizes[r], *x.shape[1:]))
    if len(set(sizes)) == 1:
        dist.reduce_scatter_tensor(out, x, group=group)
    else:
        dist.reduce_scatter(out, list(x.split(sizes)), group=group)
    return out


class _SplitRows(torch.autograd.Function):
    """Forward keeps this member's chunk of the rows (a tensor every member holds alike); backward
    all-gathers the chunks' gradients, so the input's gradient is whole and alike again (Megatron's
    scatter_to_sequence_parallel_region over dim 0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        sizes = _row_sizes(x.shape[0], dist.get_world_size(group))
        r = dist.get_rank(group)
        ctx.sizes, ctx.group = sizes, group
        start = sum(sizes[:r])
        return x[start:start + sizes[r]].clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _gather_rows(g, ctx.sizes, ctx.group), None


class _GatherRows(torch.autograd.Function):
    """Forward concatenates every member's rows (`sizes`); backward keeps this member's rows of the
    gradient (which every member holds whole: Megatron's gather_from_sequence_parallel_region with
    tensor_parallel_output_grad=False)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
        r = dist.get_rank(group)
        ctx.start, ctx.n = sum(sizes[:r]), sizes[r]
        return _gather_rows(x, sizes, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return g[ctx.start:ctx.start + ctx.n].contiguous(), None, None


class _GatherForExperts(torch.autograd.Function):
    """The etp group's received rows, all-gathered for its experts' column slices; backward
    reduce-scatters the partial input gradients the slices give (Megatron-Core's
    gather_from_sequence_parallel_region with output_split_sizes, which `dispatch_postprocess` of
    `MoEAlltoAllTokenDispatcher` applies over the expert tensor-parallel group)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
        ctx.group, ctx.sizes = group, sizes
        return _gather_rows(x, sizes, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _reduce_scatter_rows(g, ctx.sizes, ctx.group), None, None


class _ScatterFromExperts(torch.autograd.Function):
    """The partial expert outputs of every row the etp group gathered, summed over its row slices
    and scattered back to the member that received each row; backward all-gathers the gradients
    (Megatron-Core's reduce_scatter_to_sequence_parallel_region, which `combine_preprocess` applies
    over the expert tensor-parallel group)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
        ctx.group, ctx.sizes = group, sizes
        return _reduce_scatter_rows(x, sizes, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather_rows(g, ctx.sizes, ctx.group), None, None


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with split sizes; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _all_to_all(g.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


def _shared_expert(serial: nn.Sequential, grid: Grid) -> nn.Module:
    """The shared expert as the block's dense MLP is split (Megatron-Core's SharedExpertMLP is a
    tensor-parallel MLP; perfmodels counts it so): fc1 a normal 3D Linear, fc2 a transposed one, so
    its output is all-reduced over row like the dense MLP's. Where the shapes do not split over
    row x col it stays a replicated copy."""
    import copy

    from engine.linear import ShardedLinear

    fc1, act, fc2 = serial[0], serial[1], serial[2]
    split = grid.size("row") * grid.size("col")
    if split > 1 and fc1.out_features % split == 0 and fc1.in_features % split == 0:
        return nn.Sequential(ShardedLinear.from_dense(fc1, grid=grid), copy.deepcopy(act),
                             ShardedLinear.from_dense(fc2, transpose=True, grid=grid))
    return copy.deepcopy(serial).to(grid.device)


class MoE(nn.Module):
    """The expert-parallel MoEMLP (module docstring). Parameters: `router.weight` (replicated), the
    shared expert (split over row x col as the dense MLP is: `_shared_expert`), `fc1` [local experts,
    ffn/G_etp, hidden] and `fc2` [local experts, hidden, ffn/G_etp] (this rank's experts and etp
    slice, marked as expert weights)."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int = 2,
                 shared_ffn: int | None = None, *,
                 grid: Grid | None = None, _serial: MoEMLP | None = None) -> None:
        super().__init__()
        self.grid = grid = current_grid(grid)
        problems = moe_problems(grid, num_experts, ffn)
        if problems:
            raise GridError(f"engine.MoE({hidden}, {ffn}, num_experts={num_experts}) on grid "
                            f"{grid.describe()}: "
                            + "; ".join(problems))
        serial = _serial if _serial is not None else MoEMLP(hidden, ffn, num_experts, top_k, shared_ffn)
        self.top_k, self.num_experts = top_k, num_experts
        d = grid.degrees
        # without expert groups (G_ep = 1, G_etp = G_intra_r: engine.init builds none) etp is the row group
        self.G_ep, self.G_etp = d.get("ep", 1), d.get("etp", d["row"])
        etp_axis = "etp" if "etp" in d else "row"
        self.ep_group = grid.comm_group("ep") if self.G_ep > 1 else None
        self.etp_group = grid.comm_group(etp_axis) if self.G_etp > 1 else None
        # MoE parallel folding with an etp group other than the row group: the row-replicated
        # tokens are split over row (every rank of the stage then holds its own, as under Megatron's
        # sequence parallelism) and each etp group gathers the rows its members received in the
        # dispatch (`forward`)
        row = grid.comm_group("row")
        members = (sorted(dist.get_process_group_ranks(g)) if g is not None else [grid.rank]
                   for g in (self.etp_group, row))
        self.folded = next(members) != next(members)
        self.split_group = row if self.folded else None
        self.local = num_experts // self.G_ep
        ep_rank = grid.coords.get("ep", 0)
        etp_rank = grid.coords.get(etp_axis, 0)
        self.first_expert = ep_rank * self.local
        self.hidden, self.ffn, self.etp_rank = hidden, ffn, etp_rank
        f = ffn // self.G_etp
        experts = slice(self.first_expert, self.first_expert + self.local)
        cols = slice(etp_rank * f, (etp_rank + 1) * f)
        self.router = TorchLinear(hidden, num_experts, bias=False, device=grid.device)  # replicated
        self.fc1 = nn.Parameter(serial.fc1.detach()[experts, cols, :].clone().to(grid.device))
        self.fc2 = nn.Parameter(serial.fc2.detach()[experts, :, cols].clone().to(grid.device))
        for p in (self.fc1, self.fc2):
            setattr(p, EXPERT_ATTR, True)
        with torch.no_grad():
            self.router.weight.copy_(serial.router.weight)
        self.shared = None
        if serial.shared is not None:
            self.shared = _shared_expert(serial.shared, grid)

    @classmethod
    def from_serial(cls, serial: MoEMLP, grid: Grid | None = None) -> MoE:
        """Split an engine.models.gpt.MoEMLP (same values): this rank's experts and etp slice."""
        hidden, ffn = serial.fc1.shape[2], serial.fc1.shape[1]
        shared = serial.shared[0].out_features if serial.shared is not None else None
        return cls(hidden, ffn, serial.fc1.shape[0], serial.top_k, shared, grid=grid, _serial=serial)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Route, dispatch over ep, run the local experts, combine, in Megatron-Core's order (module
        docstring): etp all-reduces where the etp group's tokens are alike (it is the row group),
        else the etp group all-gathers the rows its members received after the dispatch and
        reduce-scatters the experts' outputs before the combine."""
        from engine.recorder import uncounted

        shape = x.shape
        full = x.reshape(-1, shape[-1])
        # fp32 gates, as Megatron-Core's router (moe_utils.topk_softmax_with_capacity:
        # torch.softmax(logits, dim=-1, dtype=torch.float32)); MoEMLP.route likewise
        probs = torch.softmax(self.router(full), dim=-1, dtype=torch.float32)
        top, idx = probs.topk(self.top_k, dim=-1)
        w = top / top.sum(-1, keepdim=True)
        x, w, idx = self._split_tokens(full, w, idx)
        flat_expert = idx.reshape(-1)  # row r = token r // k, slot r % k
        order = torch.argsort(flat_expert, stable=True)  # rows sorted by expert, hence by ep rank
        tokens = order // self.top_k
        expert_sorted = flat_expert[order]
        dest = expert_sorted // self.local
        send = torch.bincount(dest, minlength=self.G_ep)
        with uncounted():  # routing metadata: split sizes and each row's expert
            if self.ep_group is not None:
                recv_counts = torch.empty_like(send)
                dist.all_to_all_single(recv_counts, send, group=self.ep_group)
                send_l, recv_l = send.tolist(), recv_counts.tolist()
                recv_expert = _all_to_all(expert_sorted, send_l, recv_l, self.ep_group)
            else:
                send_l = recv_l = send.tolist()
                recv_expert = expert_sorted
        rows = x[tokens]
        if not self.folded:  # tokens alike over etp: backward all-reduces [T*k, h] over etp
            rows = copy_to(rows, self.etp_group)
        if self.ep_group is not None:
            rows = _AllToAll.apply(rows, send_l, recv_l, self.ep_group)  # dispatch
        gathered = self.folded and self.etp_group is not None
        if gathered:  # the rows every etp member received, for this rank's slice of their experts
            with uncounted():  # each member's row count and its rows' experts (metadata)
                counts = torch.zeros(self.G_etp, dtype=torch.int64, device=rows.device)
                dist.all_gather_into_tensor(counts, torch.tensor([rows.shape[0]], device=rows.device),
                                            group=self.etp_group)
                etp_sizes = counts.tolist()
                recv_expert = _gather_rows(recv_expert, etp_sizes, self.etp_group)
            rows = _GatherForExperts.apply(rows, self.etp_group, etp_sizes)
        local_expert = recv_expert - self.first_expert
        # `rows * 0`, not zeros_like: the combine's output must depend on the dispatch's even when
        # this rank received no rows, so that every rank runs both all-to-alls' backward (a rank
        # skipping one would pair its next collective with a peer's all-to-all)
        y = rows * 0.0
        for e in range(self.local):
            sel = (local_expert == e).nonzero(as_tuple=True)[0]
            if sel.numel():
                y = y.index_add(0, sel, F.gelu(rows[sel] @ self.fc1[e].t()) @ self.fc2[e].t())
        if gathered:  # partial sums of the etp slices, back to the member that received each row
            y = _ScatterFromExperts.apply(y, self.etp_group, etp_sizes)
        if self.ep_group is not None:
            y = _AllToAll.apply(y, recv_l, send_l, self.ep_group)  # combine
        if not self.folded:  # partial sums of the etp slices: all-reduce [T*k, h]
            y = reduce_from(y, self.etp_group)
        weights = w.reshape(-1)[order]
        out = torch.zeros_like(x).index_add(0, tokens, (y * weights[:, None]).to(x.dtype))
        if self.split_group is not None:  # back to the row-replicated layout
            out = _GatherRows.apply(out, self.split_group, _row_sizes(full.shape[0], self.split_group.size()))
        if self.shared is not None:
            out = out + self.shared(full)
        return out.reshape(shape)

    def _split_tokens(self, x: torch.Tensor, w: torch.Tensor,
                      idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tokens (with their gates and experts) this rank dispatches: with the etp group the row
        group, all of them (replicated over etp, as Megatron's experts without sequence
        parallelism); otherwise this rank's 1/G_intra_r of them, as Megatron's sequence parallelism
        holds them (`_SplitRows`: the backward all-gathers their gradients and the gates', so the
        replicated router's gradient stays whole on every row rank: perfmodels.experts counts
        these gathers as `emulated_split`). Routing is computed before the split, on the same
        values every row rank holds."""
        if self.split_group is not None:
            n = x.shape[0]
            x, w = _SplitRows.apply(x, self.split_group), _SplitRows.apply(w, self.split_group)
            r = dist.get_rank(self.split_group)
            sizes = _row_sizes(n, self.split_group.size())
            idx = idx[sum(sizes[:r]):sum(sizes[:r]) + sizes[r]]
        return x, w, idx

    def expert_boxes(self) -> dict[str, tuple[tuple[int, ...], tuple[tuple[int, int], ...]]]:
        """Where this rank's expert weights sit in the unsplit MoEMLP's tensors: for "fc1" and
        "fc2", (full shape, per dim (start, stop)); what sharded checkpoints store beside each piece
        so that any grid can find and cut the parts it needs (engine.checkpoint)."""
        f = self.ffn // self.G_etp
        experts = (self.first_expert, self.first_expert + self.local)
        cols = (self.etp_rank * f, (self.etp_rank + 1) * f)
        return {"fc1": ((self.num_experts, self.ffn, self.hidden), (experts, cols, (0, self.hidden))),
                "fc2": ((self.num_experts, self.hidden, self.ffn), (experts, (0, self.hidden), cols))}

    def gather_experts(self) -> dict[str, torch.Tensor]:
        """The full fc1 / fc2 of every expert (a collective over ep and etp), for checks and export."""
        parts = {}
        for name, dim in (("fc1", 1), ("fc2", 2)):
            t = getattr(self, name).detach().contiguous()
            if self.etp_group is not None:
                box = [torch.empty_like(t) for _ in range(self.G_etp)]
                dist.all_gather(box, t, group=self.etp_group)
                t = torch.cat(box, dim=dim)
            if self.ep_group is not None:
                box = [torch.empty_like(t) for _ in range(self.G_ep)]
                dist.all_gather(box, t, group=self.ep_group)
                t = torch.cat(box, dim=0)
            parts[name] = t.cpu()
        return parts
