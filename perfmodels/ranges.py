"""Plausible ranges of the physical constants a user can give (bandwidths, latencies, peaks, memory,
efficiencies), shared by the specs' own checks (`GPU`, `Cluster`: a `ValueError` naming the field),
the REST schemas (a 422 quoting the range, documented in the OpenAPI schema) and the CLI's flags.

Why: a constant can be positive and finite and still make the model's arithmetic leave the finite
numbers: `memory_efficiency=5e-324` times `hbm_bandwidth_GBps=0.1` is 0.0 in IEEE doubles (a
division by zero), and a link efficiency of 1e-320 turns a gradient all-reduce into infinity
seconds. The ranges are wide enough for any hardware of the next decade and a CPU test box
(efficiencies down to 0.1% of peak), narrow enough that every product and quotient of them stays a
normal double: the slowest plausible device (1e-4 TFLOP/s at 0.1%, 0.1 GB/s HBM at 0.1%) still
answers a 4-million-GPU model in finite seconds.
"""

from __future__ import annotations

PLAUSIBLE: dict[str, tuple[float, float, str]] = {
    "bandwidth_GBps": (1e-3, 1e5, "GB/s per GPU per direction"),
    "latency_us": (0.0, 1e6, "microseconds"),
    "peak_tflops": (1e-4, 1e5, "TFLOP/s"),
    "memory_gib": (1e-2, 1e5, "GiB"),
    "hbm_bandwidth_GBps": (0.1, 1e6, "GB/s"),
    "alpha_us": (0.0, 1e6, "microseconds"),
    "efficiency": (1e-3, 1.0, "of peak"),
}
"""kind -> (lowest, highest, unit); both bounds included."""


def plausible_range(field: str) -> tuple[float, float, str] | None:
    """The plausible range of a field by its name (e.g. `inter_node_bandwidth_GBps`), if it has one."""
    if field.endswith("hbm_bandwidth_GBps"):
        return PLAUSIBLE["hbm_bandwidth_GBps"]
    for suffix in ("bandwidth_GBps", "latency_us", "memory_gib", "alpha_us"):
        if field.endswith(suffix):
            return PLAUSIBLE[suffix]
    if field == "busbw_GBps":
        return PLAUSIBLE["bandwidth_GBps"]
    if "efficiency" in field:
        return PLAUSIBLE["efficiency"]
    if (
        field.startswith("peak_tflops")
        or field == "gemm_tflops_max"
        or field in ("fp32", "tf32", "bf16", "fp16", "fp8")
    ):
        return PLAUSIBLE["peak_tflops"]
    return None


def check_plausible(field: str, value: float, where: str = "") -> None:
    """ValueError naming the field, the value and the plausible range when `value` is outside it."""
    found = plausible_range(field)
    if found is None:
        return
    lo, hi, unit = found
    if not lo <= value <= hi:
        raise ValueError(f"{where or field}={value:g} is outside the plausible range {lo:g} to {hi:g} {unit}")
