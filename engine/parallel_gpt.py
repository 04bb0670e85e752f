"""The 4D-parallel version of engine.models.gpt.GPT (AxoNN pattern), built from a serial one.

    grid = engine.init(G_data=2, G_intra_r=2, G_intra_c=2)
    model = ParallelGPT(cfg, grid)                   # same values as GPT(cfg), only this rank's shards
    model = ParallelGPT.from_serial(GPT(cfg), grid)  # or shard an existing serial GPT
    loss = model(tokens_local, targets_local)        # G_inter == 1

Layout: the residual stream is [b, s, hidden/G_c] (features split over col, replicated over row);
QKV is a normal 3D Linear (heads split over row), out-proj transposed; fc1 normal, fc2 transposed,
so activations never change layout. LayerNorms reduce their statistics over col; embeddings are
split over col along hidden; the LM head is a normal Linear with the vocabulary padded to a multiple
of G_r*G_d (perfmodels.traffic.padded_vocab) and the loss is a vocab-parallel cross entropy over
row. The batch is split over G_data x G_intra_d by the caller (engine.create_dataloader).

With G_inter > 1 each rank builds only the blocks of its pipeline stage(s), partitioned by
perfmodels.layout.partition_chunks (the same function the performance model uses); `chunks()`
returns the stage modules for torch.distributed.pipelining (engine.pipeline). Parameter names
equal the serial model's (blocks are a ModuleDict keyed by the global block index), so
`engine.full_state_dict` returns the serial state_dict's keys.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from engine.context import causal_attention_cp, check_sequence, grid_positions
from engine.grads import STAGE_SPLIT_ATTR, wrap
from engine.grid import Grid, GridError, current_grid
from engine.layers import ParallelLayerNorm, SplitEmbedding, vocab_parallel_cross_entropy
from engine.linear import ShardedLinear, linear_init_chunks
from engine.models.gpt import GPT, GPTConfig, causal_attention, moe_of
from engine.moe import MoE
from engine.shard import drawn_chunks, tensor_chunks
from perfmodels import rules
from perfmodels.layout import partition_chunks


def padded_vocab_size(vocab_size: int, degrees: dict[str, int]) -> int:
    """perfmodels.traffic.padded_vocab for one grid."""
    m = degrees["row"] * degrees["depth"]
    return -(-vocab_size // m) * m


def gpt_split_problems(cfg: GPTConfig, degrees: dict[str, int], virtual_stages: int = 1) -> list[str]:
    """Why this GPT cannot be split on this grid, each message naming the factors: perfmodels.rules'
    head, hidden and layer-count rules, then the engine's own depth rule (`gpt_depth_problems`)."""
    G_r, G_c, S = degrees["row"], degrees["col"], degrees["inter"]
    problems = []
    if not rules.heads_split(cfg.num_attention_heads, G_r):
        problems.append(f"G_intra_r={G_r} does not divide num_attention_heads={cfg.num_attention_heads}")
    for name, size in (("hidden_size", cfg.hidden_size), ("ffn_hidden_size", cfg.ffn)):
        if not rules.hidden_split(size, G_r, G_c):
            problems.append(f"G_intra_r*G_intra_c={G_r}*{G_c}={G_r * G_c} does not divide {name}={size}")
    if not problems:
        problems += gpt_depth_problems(cfg, degrees)
    if not rules.enough_layers(cfg.num_layers, S, virtual_stages):
        problems.append(f"num_layers={cfg.num_layers} is fewer than "
                        f"G_inter*virtual_stages={S}*{virtual_stages}")
    return problems


def gpt_depth_problems(cfg: GPTConfig, degrees: dict[str, int]) -> list[str]:
    """The engine's own rule (not in perfmodels.rules): every rank's row x col block of each weight
    is split once more over depth (engine.Linear's flat depth shard), so G_intra_d must divide it."""
    G_r, G_c, G_d = degrees["row"], degrees["col"], degrees["depth"]
    for k, n in ((cfg.hidden_size, 3 * cfg.hidden_size), (cfg.hidden_size, cfg.hidden_size),
                 (cfg.hidden_size, cfg.ffn), (cfg.ffn, cfg.hidden_size)):
        if (n * k // (G_r * G_c)) % G_d:
            return [f"G_intra_d={G_d} does not divide the {n}x{k} weight block of "
                    f"{n * k // (G_r * G_c)} elements (G_intra_r*G_intra_c={G_r * G_c})"]
    return []


class _Source:
    """Where the full tensors come from, in GPT.__init__'s order: a serial GPT (slices of its tensors),
    the CPU generator drawn chunk by chunk exactly as GPT(cfg) draws ("serial"), or nothing ("local":
    each shard drawn on its own on the device). Parts of other pipeline stages are drawn and dropped
    ("serial"), so every stage's values equal GPT(cfg)'s with the same seed."""

    def __init__(self, serial: GPT | None, init: str) -> None:
        if init not in ("serial", "local"):
            raise ValueError(f"init must be 'serial' or 'local', got {init!r}")
        self.serial, self.init = serial, init

    def skip_block(self, cfg: GPTConfig, index: int = 0) -> None:
        if self.serial is not None or self.init == "local":
            return
        h, f = cfg.hidden_size, cfg.ffn
        moe = cfg.is_moe_layer(index)
        for n, k in ((3 * h, h), (h, h)) if moe else ((3 * h, h), (h, h), (f, h), (h, f)):
            for chunks in linear_init_chunks(n, k, True):
                for _ in chunks or ():
                    pass
        if moe:
            moe_of(cfg)  # the experts' draws, in GPT(cfg)'s order

    def embedding(self, rows: int, hidden: int, serial: nn.Embedding | None) -> Iterator | None:
        if serial is not None:
            return tensor_chunks(serial.weight)
        if self.init == "local":
            return None
        return drawn_chunks((rows, hidden), lambda t: t.normal_())


def _linear(source: _Source, serial: nn.Linear | None, k: int, n: int, bias: bool, grid: Grid, *,
            transpose: bool = False, padded_out_features: int | None = None) -> ShardedLinear:
    if serial is not None:
        return ShardedLinear.from_dense(serial, transpose=transpose, grid=grid,
                                        padded_out_features=padded_out_features)
    return ShardedLinear(k, n, bias, transpose=transpose, grid=grid, padded_out_features=padded_out_features,
                         init=source.init)


class ParallelAttention(nn.Module):
    def __init__(self, serial: nn.Module | None, cfg: GPTConfig, grid: Grid, source: _Source) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.local_heads = cfg.num_attention_heads // grid.size("row")
        self.head_dim = cfg.head_dim
        self.cp_grid = grid if grid.degrees.get("cp", 1) > 1 else None
        self.qkv = _linear(source, serial and serial.qkv, h, 3 * h, True, grid)
        self.proj = _linear(source, serial and serial.proj, h, h, True, grid, transpose=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cp_grid is not None:  # the sequence is split over cp: ring attention (engine.context)
            return self.proj(causal_attention_cp(self.qkv(x), self.local_heads, self.head_dim, self.cp_grid))
        return self.proj(causal_attention(self.qkv(x), self.local_heads, self.head_dim))


class ParallelMLP(nn.Module):
    def __init__(self, serial: nn.Module | None, cfg: GPTConfig, grid: Grid, source: _Source) -> None:
        super().__init__()
        h, f = cfg.hidden_size, cfg.ffn
        self.fc1 = _linear(source, serial and serial.fc1, h, f, True, grid)
        self.fc2 = _linear(source, serial and serial.fc2, f, h, True, grid, transpose=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def _norm(cfg: GPTConfig, grid: Grid, serial: nn.LayerNorm | None) -> ParallelLayerNorm:
    return ParallelLayerNorm(cfg.hidden_size, grid.comm_group("col"), weight=serial and serial.weight,
                             bias=serial and serial.bias, device=grid.device)


class ParallelBlock(nn.Module):
    def __init__(self, serial: nn.Module | None, cfg: GPTConfig, grid: Grid, source: _Source,
                 index: int = 0) -> None:
        super().__init__()
        self.ln1 = _norm(cfg, grid, serial and serial.ln1)
        self.attn = ParallelAttention(serial and serial.attn, cfg, grid, source)
        self.ln2 = _norm(cfg, grid, serial and serial.ln2)
        if cfg.is_moe_layer(index):  # experts over ep/etp (engine.moe), same values as GPT(cfg)'s
            self.mlp: nn.Module = MoE.from_serial(serial.mlp if serial is not None else moe_of(cfg), grid)
        else:
            self.mlp = ParallelMLP(serial and serial.mlp, cfg, grid, source)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ParallelGPT(nn.Module):
    """This rank's part of the GPT: its blocks, plus the embedding (first stage) and the final norm,
    head and loss (last stage).

    `ParallelGPT(cfg, grid)` builds only this rank's shards (peak memory follows the shard, not the
    model): with `init="serial"` (default) the values equal `GPT(cfg)`'s for the same seed (the full
    tensors are drawn chunk by chunk on the CPU and dropped), with `init="local"` each shard is drawn
    on its own on the device (fast, for benchmarks). `from_serial(gpt)` shards an existing GPT.
    """

    def __init__(self, cfg: GPTConfig | GPT, grid: Grid | None = None, *, virtual_stages: int = 1,
                 recompute: bool = False, init: str = "serial") -> None:
        super().__init__()
        serial = cfg if isinstance(cfg, GPT) else None
        cfg = serial.cfg if serial is not None else cfg
        grid = current_grid(grid)
        source = _Source(serial, init)
        self.recompute = recompute
        problems = gpt_split_problems(cfg, grid.degrees, virtual_stages)
        if problems:
            raise GridError(f"GPT cannot be split on grid {grid.describe()}: " + "; ".join(problems))
        if grid.degrees.get("cp", 1) > 1:
            check_sequence(cfg.seq_length, grid.size("cp"))
        self.cfg, self.grid, self.virtual_stages = cfg, grid, virtual_stages
        S, s = grid.size("inter"), grid.coord("inter")
        setattr(self, STAGE_SPLIT_ATTR, S > 1)
        self.chunk_ranges = partition_chunks(cfg.num_layers, S, virtual_stages)[s]
        self.has_embedding = s == 0
        self.has_head = s == S - 1
        col = grid.comm_group("col")
        tok = source.embedding(cfg.vocab_size, cfg.hidden_size, serial and serial.tok_emb)
        pos = source.embedding(cfg.seq_length, cfg.hidden_size, serial and serial.pos_emb)
        if self.has_embedding:
            self.tok_emb = SplitEmbedding(cfg.vocab_size, cfg.hidden_size, col, chunks=tok,
                                          device=grid.device)
            self.pos_emb = SplitEmbedding(cfg.seq_length, cfg.hidden_size, col, chunks=pos,
                                          device=grid.device)
        else:
            for chunks in (tok, pos):
                for _ in chunks or ():
                    pass
        mine = {i for start, end in self.chunk_ranges for i in range(start, end)}
        self.blocks = nn.ModuleDict()
        built = {}
        for i in range(cfg.num_layers):  # GPT.__init__'s order, so the RNG stream matches
            if i in mine:
                built[i] = ParallelBlock(serial.blocks[i] if serial is not None else None, cfg, grid, source,
                                         i)
            else:
                source.skip_block(cfg, i)
        for i in sorted(built):
            self.blocks[str(i)] = built[i]
        if self.has_head:
            self.ln_f = _norm(cfg, grid, serial and serial.ln_f)
            self.padded_vocab = padded_vocab_size(cfg.vocab_size, grid.degrees)
            self.head = _linear(source, serial and serial.head, cfg.hidden_size, cfg.vocab_size, False, grid,
                                padded_out_features=self.padded_vocab)
            self.vocab_start = grid.coord("row") * (self.padded_vocab // grid.size("row"))
        wrap(self, grid=grid)

    @classmethod
    def from_serial(cls, serial: GPT, grid: Grid | None = None, *, virtual_stages: int = 1,
                    recompute: bool = False) -> ParallelGPT:
        """Shard an existing GPT. `recompute=True`: full activation recomputation (each block
        checkpointed; its forward, collectives included, runs again in backward)."""
        return cls(serial, grid, virtual_stages=virtual_stages, recompute=recompute)

    def run_block(self, i: int, x: torch.Tensor) -> torch.Tensor:
        block = self.blocks[str(i)]
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(block, x, use_reentrant=False)
        return block(x)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = grid_positions(self.grid, tokens.shape[1], device=tokens.device)  # global positions under cp
        return self.tok_emb(tokens) + self.pos_emb(pos)

    def run_blocks(self, x: torch.Tensor, start: int, end: int) -> torch.Tensor:
        for i in range(start, end):
            x = self.run_block(i, x)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Row-split (padded) vocabulary logits from the last stage's hidden states."""
        return self.head(self.ln_f(x))

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, targets, self.grid.comm_group("row"), self.vocab_start,
                                           self.cfg.vocab_size)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss over the local batch; only for G_inter == 1 (pipelines use `chunks()`)."""
        if self.grid.size("inter") != 1:
            raise RuntimeError("with G_inter > 1 run the model through engine.pipeline.Pipeline")
        x = self.run_blocks(self.embed(tokens), 0, self.cfg.num_layers)
        return self.loss_fn(self.logits(x), targets)

    def chunks(self) -> list[GPTChunk]:
        """One pipeline stage module per virtual stage of this rank, in order."""
        S = self.grid.size("inter")
        s = self.grid.coord("inter")
        n = len(self.chunk_ranges)
        return [GPTChunk(self, start, end, first=(v == 0 and s == 0), last=(v == n - 1 and s == S - 1))
                for v, (start, end) in enumerate(self.chunk_ranges)]


class GPTChunk(nn.Module):
    """A pipeline stage: tokens or hidden states in, hidden states or row-split logits out."""

    def __init__(self, model: ParallelGPT, start: int, end: int, *, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.start, self.end = start, end
        self.grid = model.grid
        self.run_block = model.run_block
        if first:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        self.blocks = nn.ModuleDict({str(i): model.blocks[str(i)] for i in range(start, end)})
        if last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = grid_positions(self.grid, x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)
        for i in range(self.start, self.end):
            x = self.run_block(i, x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x
