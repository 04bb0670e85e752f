"""The cluster a published run ran on, from its hardware columns.

`gpu_type` names the GPU family (free text such as "A100 80GB (DGX A100, Selene)"); the card's
memory comes from the explicit `gpu_memory_gb` column (a vendor's "80 GB" card is taken as 80 GiB of
HBM, which is how the presets count it). When that column is empty the memory is unknown: the
cluster gets the largest card of the family, so that the fit verdict never calls a run out of memory
only because we guessed a small card, and `CardMemory.assumed` says so for the report.
Interconnect columns are parsed for their rates ("8x 200 Gb/s HDR InfiniBand per node").

Run the tests: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/validation/test_hardware.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from perfmodels import presets
from perfmodels.specs import GPU, Cluster

_FAMILIES = ("GH200", "GB200", "H200", "H100", "H20", "B200",
             "MI300X", "MI250X", "MI210", "L40S", "A100", "V100")

_NVLINK_PER_DIRECTION = {
    "V100": 150.0,
    "A100": 300.0,
    "H100": 450.0,
    "H200": 450.0,
    "GH200": 450.0,
    "H20": 450.0,
    "B200": 900.0,
    "GB200": 900.0,
    "MI250X": 100.0,
    "MI300X": 448.0,
    "MI210": 150.0,
    "L40S": 32.0,
}
"""NVLink / Infinity Fabric GB/s per GPU per direction of each generation."""

_DEFAULT_NETWORK_GBPS = {"V100": 12.5 / 8, "A100": 25.0, "H100": 50.0, "H200": 50.0, "B200": 50.0,
                         "GB200": 50.0}
"""Network GB/s per GPU of the usual fabric of a GPU generation, when the row names no rate."""

# GB200 before B200, GH200 before H200: the longer name is the other card
_PLAIN_NAMES = (("GH200", "GH200"), ("GB200", "GB200"), ("L40S", "L40S"), ("MI210", "MI210"),
                ("H200", "H200"), ("B200", "B200"), ("MI300", "MI300X"), ("MI250", "MI250X-GCD"))


def gpu_preset(text: str) -> str:
    """The preset a `gpu_type` text names (ValueError when none)."""
    t = text.upper().replace(" ", "")
    if "H20" in t and not re.search(r"H200|H100", t):
        return "H20"
    for key, name in _PLAIN_NAMES:
        if key in t:
            return name
    if "H100" in t or "H800" in t:  # H800: an H100 with NVLink cut to 400 GB/s
        return "H100-PCIe" if "PCIE" in t else "H100-SXM"
    if "A100" in t or "A800" in t:  # A800: an A100 with NVLink cut to 400 GB/s
        return "A100-40GB" if "40GB" in t or "40G" in t else "A100-80GB"
    if "V100" in t:
        return "V100-16GB" if "16GB" in t or "16G" in t else "V100-32GB"
    raise ValueError(f"gpu_type {text!r} is not a known GPU")


def family(preset: str) -> str:
    """GPU family of a preset name ("A100-40GB" -> "A100")."""
    up = preset.upper()
    for fam in _FAMILIES:
        if up.startswith(fam):
            return fam
    return up.split("-")[0]


@dataclass(frozen=True, kw_only=True)
class CardMemory:
    """The memory the fit verdict uses, and whether the row stated it."""

    gib: float
    assumed: str = ""
    """Empty when the row states the card's memory; otherwise why this value was taken."""


def family_cards(fam: str) -> list[GPU]:
    """Every GPU preset of one family (e.g. both A100 cards)."""
    return [presets.gpu(n) for n in presets.gpu_names() if family(n) == fam]


def card(gpu_type: str, memory_gb: float | None) -> tuple[GPU, CardMemory]:
    """The GPU of a row: the family's preset whose memory is nearest the stated one (its HBM bandwidth
    and power limit differ between cards: a 96 GB H100 is the HBM2e variant), with the stated memory;
    the named card with the family's largest memory when unstated."""
    named = presets.gpu(gpu_preset(gpu_type))
    cards = family_cards(family(named.name)) or [named]
    if memory_gb is None:
        largest = max(cards, key=lambda g: g.memory_gib)
        # the named card's speeds (an "H100" is the SXM part, not the power-capped 96 GB variant) with
        # the family's largest memory
        base = named
        note = (f"card memory not stated: fit verdict on the largest {family(named.name)} card "
                f"({largest.memory_gib:g} GiB)")
        return replace(base, memory_gib=largest.memory_gib), CardMemory(gib=largest.memory_gib, assumed=note)
    if memory_gb <= 0:
        raise ValueError(f"gpu_memory_gb={memory_gb:g} is not a positive number")
    base = min(cards, key=lambda g: (abs(g.memory_gib - memory_gb), g.name != named.name))
    return replace(base, memory_gib=float(memory_gb)), CardMemory(gib=float(memory_gb))


_RATE = r"(\d+(?:\.\d+)?)\s*([GT])(b|B)(?:its?|ytes?)?(?:ps|/s)"


def inter_per_gpu_GBps(text: str, gpus_per_node: int, fam: str) -> float:
    """Network GB/s per GPU from e.g. '8x 200 Gb/s HDR InfiniBand per node', '4x 25 GB/s Slingshot'
    or '100 Gb/s'. Lower-case b is bits, upper-case B bytes; a count 'Nx' multiplies."""
    t = text or ""
    rate = re.search(_RATE, t)
    if not rate:
        return _DEFAULT_NETWORK_GBPS.get(fam, 25.0)
    value, scale, unit = float(rate.group(1)), rate.group(2), rate.group(3)
    many = re.search(r"(\d+)\s*[x\u00d7]", t[: rate.start()])
    count = int(many.group(1)) if many else 1
    gbytes = value * (1000.0 if scale == "T" else 1.0) / (8.0 if unit == "b" else 1.0)
    return count * gbytes / gpus_per_node


def intra_per_gpu_GBps(text: str, fam: str) -> float:
    """NVLink of the GPU's generation, unless the row says the GPUs only share PCIe."""
    t = (text or "").lower()
    if "pcie" in t and "nvlink" not in t and "nvswitch" not in t:
        return 64.0 if "gen5" in t or fam in ("H100", "H200", "B200") else 32.0
    return _NVLINK_PER_DIRECTION.get(fam, 300.0)


def cluster_from_columns(*, gpu_type: str, memory_gb: float | None, num_gpus: int, gpus_per_node: int | None,
                         intra_text: str, inter_text: str) -> tuple[Cluster, CardMemory]:
    """The cluster of a published_dev/modern row and the card memory its fit verdict uses."""
    gpu, memory = card(gpu_type, memory_gb)
    fam = family(gpu.name)
    # the NVLink domain when the row does not say: a DGX-2 has 16 GPUs; a GB200 NVL72 rack 72, of which
    # jobs use a whole number of GPUs (64-GPU slices where 72 do not divide the job)
    gpn = gpus_per_node or (16 if "DGX-2" in gpu_type else 8)
    if fam == "GB200" and not gpus_per_node:
        gpn = next((n for n in (72, 64, 36, 32, 16, 8, 4) if num_gpus % n == 0), 1)
    gpn = min(gpn, num_gpus)
    intra = intra_per_gpu_GBps(intra_text, fam)
    if re.search(r"[AH]800", gpu_type.upper()):
        intra = min(intra, 200.0)  # export parts: 400 GB/s NVLink in all, 200 per direction
    inter = inter_per_gpu_GBps(inter_text, gpn, fam)
    cluster = Cluster(name=f"{fam}-published", num_gpus=num_gpus, gpus_per_node=gpn, gpu=gpu,
                      intra_node_bandwidth_GBps=intra, inter_node_bandwidth_GBps=inter,
                      backend="rccl" if fam.startswith("MI") else "nccl")
    return cluster, memory
