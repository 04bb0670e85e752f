"""Megatron-LM's names for plan fields, accepted wherever a user gives a plan or a search pin.

People who choose layouts think in Megatron's words (`--tensor-model-parallel-size`, "TP 8, PP 16,
DP 8"), not in gridtune's grid names; the CLI (`--plan tp=8,pp=16`, `--pin tp=4,8`) and the REST API
(`plan` and `search` objects) take both. The mapping follows Megatron-Core's parallel state
(megatron/core/parallel_state.py, `initialize_model_parallel`: tensor, pipeline, data, context and
expert model-parallel sizes, expert tensor-parallel size) and its arguments
(megatron/training/arguments.py: `--virtual-pipeline-model-parallel-size`, `--micro-batch-size`):

    tp -> G_intra_r    pp -> G_inter    dp -> G_data    cp -> G_cp
    ep -> G_ep         etp -> G_etp     vpp -> virtual_stages    mbs -> micro_batch_size

Megatron's tensor parallelism is AxoNN's row axis (G_intra_r); AxoNN's col and depth axes
(G_intra_c, G_intra_d) have no Megatron name.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

MEGATRON_ALIASES: dict[str, str] = {
    "tp": "G_intra_r",
    "pp": "G_inter",
    "dp": "G_data",
    "cp": "G_cp",
    "ep": "G_ep",
    "etp": "G_etp",
    "vpp": "virtual_stages",
    "mbs": "micro_batch_size",
}
"""Megatron's short name -> gridtune's plan field."""


def canonical_name(key: str, known: Collection[str], *, where: str) -> str:
    """The plan field `key` names (an alias or the field itself, any case for aliases); ValueError
    naming `where` when an alias points at a field this version does not have."""
    target = MEGATRON_ALIASES.get(key.strip().lower())
    if target is None:
        return key
    if target not in known:
        prefix = f"{where}: " if where else ""
        raise ValueError(
            f"{prefix}{key!r} means {target}, which this version of gridtune does not model yet "
            f"(known fields: {', '.join(sorted(known))})"
        )
    return target


def rename_aliases(data: Mapping[str, Any], known: Collection[str], *, where: str) -> dict[str, Any]:
    """`data` with Megatron's names replaced by gridtune's fields; ValueError when a field is given
    twice (e.g. both `tp` and `G_intra_r`) or an alias names a field that `known` lacks."""
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in data.items():
        name = canonical_name(str(key), known, where=where) if isinstance(key, str) else key
        if name in out:
            raise ValueError(f"{where}{': ' if where else ''}{given_as[name]!r} and {key!r} both set {name}; "
                             "give one")
        out[name] = value
        given_as[name] = key
    return out
