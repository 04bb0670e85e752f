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

    def place(self, buf: torch.Tensor, local: torch.Tensor, coords: dict[str, int], degrees: dict[str, int]) -> None:
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
