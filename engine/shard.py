"""How a rank's local tensor maps onto the full (unsharded) tensor: the `ShardSpec` of a parameter.

Every parameter the engine creates carries one (`param._gridtune_shard`); parameters without one
are replicated on every rank. Checkpoints, `full_state_dict`, gradient sync and norm clipping all
read it, so they need no knowledge of which layer a parameter came from.

Layout of a 3D-parallel Linear weight W[n, k] (DESIGN.md section 1): the block of this (row, col)
rank is W[rows, cols] with the output dim split over row and the input over col (transposed:
output over col, input over row); that block is flattened and split into G_intra_d equal chunks,
chunk `depth` on this rank. `padded_dim0` pads dim 0 with zeros first (the LM head's vocabulary).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

SHARD_ATTR = "_gridtune_shard"


@dataclass(frozen=True, kw_only=True)
class ShardSpec:
    full_shape: tuple[int, ...]
    row_dim: int | None = None
    col_dim: int | None = None
    depth_flat: bool = False
    padded_dim0: int | None = None

    @property
    def padded_shape(self) -> tuple[int, ...]:
        if self.padded_dim0 is None:
            return self.full_shape
        return (self.padded_dim0, *self.full_shape[1:])

    def replicated_axes(self) -> tuple[str, ...]:
        """Tensor-parallel axes over which every member holds the same local tensor."""
        out = []
        if not self.depth_flat:
            out.append("depth")
        if self.row_dim is None:
            out.append("row")
        if self.col_dim is None:
            out.append("col")
        return tuple(out)

    def block_slices(self, coords: dict[str, int], degrees: dict[str, int]) -> tuple[slice, ...]:
        shape = self.padded_shape
        slices = [slice(None)] * len(shape)
        for axis, dim in (("row", self.row_dim), ("col", self.col_dim)):
            if dim is not None:
                size = shape[dim] // degrees[axis]
                slices[dim] = slice(coords[axis] * size, (coords[axis] + 1) * size)
        return tuple(slices)

    def local_shape(self, degrees: dict[str, int]) -> tuple[int, ...]:
        shape = list(self.padded_shape)
        for axis, dim in (("row", self.row_dim), ("col", self.col_dim)):
            if dim is not None:
                shape[dim] //= degrees[axis]
        if self.depth_flat:
            numel = 1
            for s in shape:
                numel *= s
            return (numel // degrees["depth"],)
        return tuple(shape)

    def block_shape(self, degrees: dict[str, int]) -> tuple[int, ...]:
        shape = list(self.padded_shape)
        for axis, dim in (("row", self.row_dim), ("col", self.col_dim)):
            if dim is not None:
                shape[dim] //= degrees[axis]
        return tuple(shape)

    def pad(self, full: torch.Tensor) -> torch.Tensor:
        if self.padded_dim0 is None or self.padded_dim0 == full.shape[0]:
            return full
        extra = torch.zeros((self.padded_dim0 - full.shape[0], *full.shape[1:]), dtype=full.dtype,
                            device=full.device)
        return torch.cat([full, extra], dim=0)

    def shard(self, full: torch.Tensor, coords: dict[str, int], degrees: dict[str, int]) -> torch.Tensor:
        """This rank's local piece of the full tensor (a fresh contiguous tensor)."""
        block = self.pad(full)[self.block_slices(coords, degrees)]
        if self.depth_flat:
            flat = block.reshape(-1)
            size = flat.numel() // degrees["depth"]
            return flat[coords["depth"] * size:(coords["depth"] + 1) * size].clone()
        return block.clone().contiguous()

    def place(self, buf: torch.Tensor, local: torch.Tensor, coords: dict[str, int],
              degrees: dict[str, int]) -> None:
        """Write a local piece into a padded full buffer (the inverse of `shard`)."""
        sl = self.block_slices(coords, degrees)
        if self.depth_flat:
            block = buf[sl].clone()
            flat = block.reshape(-1)
            size = flat.numel() // degrees["depth"]
            flat[coords["depth"] * size:(coords["depth"] + 1) * size] = local.reshape(-1)
            buf[sl] = flat.view(block.shape)
        else:
            buf[sl] = local.reshape(buf[sl].shape)

    def trim(self, padded: torch.Tensor) -> torch.Tensor:
        return padded[: self.full_shape[0]] if self.padded_dim0 is not None else padded


def spec_of(p: torch.Tensor) -> ShardSpec | None:
    return getattr(p, SHARD_ATTR, None)


def mark(p: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    setattr(p, SHARD_ATTR, spec)
    return p


# --------------------------------------------------------------------------------------------
# Materializing only the local shard
# --------------------------------------------------------------------------------------------

CHUNK_ELEMENTS = 1 << 20  # 4 MiB of fp32 per drawn chunk


def rows_per_chunk(shape: tuple[int, ...]) -> int:
    """Rows of a full tensor drawn at a time: ~CHUNK_ELEMENTS, and a multiple of 16 elements (so a
    chunked `normal_` draws exactly the values of one call over the whole tensor; uniform_ is
    element by element anyway)."""
    width = 1
    for s in shape[1:]:
        width *= s
    step = 16 // math.gcd(width, 16) if width else 1
    rows = max(step, (CHUNK_ELEMENTS // max(width, 1)) // step * step)
    return rows


def drawn_chunks(shape: tuple[int, ...],
                 draw: Callable[[torch.Tensor], object]) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, rows) of a full CPU tensor of `shape` drawn chunk by chunk with `draw(t)` (an
    in-place init such as `t.uniform_(-b, b)` on the default generator), in the order one call over
    the whole tensor would draw them; at most one chunk is alive at a time."""
    rows = rows_per_chunk(shape)
    n = shape[0]
    start = 0
    while start < n:
        count = min(rows, n - start)
        if n - (start + count) < 16 and start + count < n:
            count = n - start  # keep a short tail in the last call (normal_ redraws tails under 16)
        t = torch.empty((count, *shape[1:]))
        draw(t)
        yield start, t
        start += count


def tensor_chunks(full: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """An existing full tensor as one chunk (from_serial / from_dense)."""
    yield 0, full.detach()


def materialize(spec: ShardSpec, chunks: Iterable[tuple[int, torch.Tensor]], coords: dict[str, int],
                degrees: dict[str, int], *, dtype: torch.dtype | None = None,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """This rank's local piece, built from the full tensor's row chunks without ever holding the
    full tensor (nor the (row, col) block when it is further split over depth). Every chunk is
    consumed, so the RNG advances exactly as drawing the whole tensor would. Rows past the real
    tensor (vocabulary padding) stay zero. 1-D and 2-D tensors."""
    shape = spec.padded_shape
    block = spec.block_shape(degrees)
    slices = spec.block_slices(coords, degrees)
    r0, r1 = slices[0].start or 0, slices[0].stop if slices[0].stop is not None else shape[0]
    cols = slices[1] if len(shape) > 1 else None
    width = block[1] if len(block) > 1 else 1
    local_shape = spec.local_shape(degrees)
    if spec.depth_flat:
        per = (block[0] * width) // degrees["depth"]
        f0, f1 = coords["depth"] * per, (coords["depth"] + 1) * per
    local: torch.Tensor | None = None
    for start, t in chunks:
        if local is None:
            local = torch.zeros(local_shape, dtype=dtype or t.dtype, device=device)
        a, b = max(start, r0), min(start + t.shape[0], r1)
        if a >= b:
            continue
        sub = t[a - start:b - start]
        if cols is not None:
            sub = sub[:, cols]
        j0 = a - r0
        if not spec.depth_flat:
            local[j0:j0 + (b - a)] = sub.to(device=device, dtype=local.dtype)
            continue
        p0, p1 = max(j0 * width, f0), min((j0 + b - a) * width, f1)
        if p0 < p1:
            flat = sub.reshape(-1)
            piece = flat[p0 - j0 * width:p1 - j0 * width]
            local[p0 - f0:p1 - f0] = piece.to(device=device, dtype=local.dtype)
    if local is None:
        local = torch.zeros(local_shape, dtype=dtype or torch.float32, device=device)
    return local
