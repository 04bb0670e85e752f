"""Does some test fail when a constant of the step-time or memory model changes? Prints one row per
constant: its value, the mutated value, and the first test that caught it (or MISSED).

    .venv/bin/python bench/mutation_check.py [--only NAME]

Each mutation runs the model's tests (tests/perfmodels, tests/validation) in a fresh pytest process
with a small plugin that changes one constant before any test runs: a module constant, a field of a
GPU preset (and of every cluster preset built on that GPU), or a field of a training-stack preset.
Exit status 1 when any mutation goes unnoticed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (target, current value, mutated value). Targets: "module:NAME", "module:NAME[key]",
# "gpu:PRESET:field", "stack:PRESET:field", "cluster:PRESET:busbw_scale" (its measured collectives).
MUTATIONS: list[tuple[str, float, float]] = [
    ("perfmodels.steptime:DP_OVERLAP_TAIL", 0.1, 0.6),
    ("perfmodels.experts:EXPERT_LOAD_IMBALANCE", 1.15, 1.5),
    ("perfmodels.experts:PERMUTE_PASSES", 4.0, 2.0),
    ("perfmodels.experts:ROUTER_FP32_PASSES", 3.0, 1.0),
    ("perfmodels.experts:HOST_OPS_PER_BLOCK", 30.0, 60.0),
    ("perfmodels.experts:ATTENTION_HOST_OPS", 15.0, 5.0),
    ("perfmodels.experts:MOE_ROUTER_HOST_OPS", 4.0, 12.0),
    ("perfmodels.experts:MOE_PREPROCESS_HOST_OPS", 4.0, 12.0),
    ("perfmodels.experts:MOE_DISPATCH_COMBINE_HOST_OPS", 4.0, 12.0),
    ("stack:megatron-core:grouped_linear_host_ops_per_expert", 1.0, 3.0),
    ("stack:megatron-core:grouped_linear_fp8_host_ops_per_expert", 3.0, 1.0),
    ("perfmodels.steptime:PREFETCH_COVER", 0.8, 0.2),
    ("perfmodels.steptime:FIRST_GATHER_SHARE", 0.05, 0.5),
    ("perfmodels.compute:FP8_CAST_BYTES_PER_ELEMENT", 3.0, 1.0),
    ("perfmodels.compute:PER_OP_SELECTIVE_GEMM_SHARE", 0.5, 1.0),
    ("stack:megatron-core:optimizer_step_bytes", 30.0, 60.0),
    ("stack:gridtune:optimizer_step_bytes", 94.0, 30.0),
    ("stack:gridtune:host_scale", 2.0 / 3.0, 1.0),
    ("stack:gridtune:split_axis_memory_passes", 1.0, 0.0),
    ("perfmodels.compute:HOST_US_PER_BLOCK[nvidia]", 900.0, 1800.0),
    ("perfmodels.compute:KERNEL_OVERHEAD_US[nvidia]", 4.0, 40.0),
    ("perfmodels.compute:DEFAULT_GEMM_HALF_SIZE[nvidia]", 56.0, 200.0),
    ("perfmodels.memory:PER_OP_SELECTIVE_KEEP", 0.5, 0.9),
    ("perfmodels.compute:SCORE_PASSES", 4.5, 2.0),
    ("perfmodels.compute:RESIDUAL_PASSES", 12.0, 6.0),
    ("perfmodels.compute:ELEMENTWISE_KERNELS_PER_BLOCK", 8, 16),
    ("perfmodels.compute:OTHER_LAYER_EFFICIENCY", 0.3, 0.6),
    ("perfmodels.steptime:TP_FWD_EXPOSED_SHARE", 0.5, 1.0),
    ("perfmodels.steptime:UNCERTAINTY_PRESET", 0.15, 0.5),
    ("perfmodels.steptime:UNCERTAINTY_CPU_PRESET", 1.0, 0.5),
    ("perfmodels.steptime:UNCERTAINTY_CALIBRATED", 0.08, 0.3),
    ("gpu:H100-SXM:gemm_efficiency_max", 0.62, 0.80),
    ("gpu:H100-SXM:gemm_efficiency_fp8", 0.50, 0.70),
    ("gpu:H100-SXM:flash_fwd_efficiency", 0.45, 0.20),
    ("gpu:H100-SXM:flash_bwd_efficiency", 0.40, 0.70),
    ("gpu:A100-80GB:gemm_efficiency_max", 0.80, 0.60),
    ("stack:megatron-deepspeed:host_exposed_fraction", 0.0, 0.5),
    ("stack:megatron-core:context_gib", 0.9, 3.0),
    ("stack:megatron-core:comm_buffer_gib", 0.15, 1.0),
    ("stack:megatron-core:fragmentation", 0.05, 0.5),
    ("stack:megatron-core:fp8_weight_cache_bytes", 2.0, 0.0),
    ("stack:megatron-core:zero2_grad_bytes", 2.0, 4.0),
    ("stack:megatron-core:zero2_master_bytes", 2.0, 4.0),
    ("stack:deepspeed:fp32_grad_bytes_bf16", 4.0, 0.0),
    ("stack:fsdp:weight_bytes", 4.0, 2.0),
    ("stack:gridtune:optimizer_state_bytes", 8.0, 12.0),
    ("perfmodels.memory:RESIDUAL_BYTES_NO_DROPOUT", 8.0, 10.0),
    ("perfmodels.memory:DROPOUT_MASK_BYTES", 2.0, 0.0),
    ("perfmodels.memory:SCORE_BYTES_NO_DROPOUT", 2.0, 5.0),
    ("perfmodels.memory:SCORE_DROPOUT_BYTES", 3.0, 0.0),
    ("stack:nemo:grad_bytes_bf16", 2.0, 4.0),
    ("stack:torchtitan:elementwise_bytes_scale", 2.8, 1.0),
    ("stack:torchtitan:loss_bytes_per_logit", 12.0, 6.0),
    ("gpu:H100-96GB:peak_tflops_bf16", 912.0, 835.0),
    ("perfmodels.stacks:COMPILED_LOSS_BYTES_PER_LOGIT", 4.0, 6.0),
    ("stack:torchtitan:loss_parallel_bytes_per_logit", 16.0, 12.0),
    ("perfmodels.memory:GEMM_INPUT_BYTES", 4.0, 2.0),
    ("perfmodels.compute:AMPERE_SM_CLOCK_SPEEDUP_ON_HOPPER", (132 / 108) * (1.98 / 1.41), 1.0),
    ("gpu:B200:gemm_efficiency_fp8", 0.70 * 0.50 / 0.62, 0.70),
    ("gpu:GB200:peak_tflops_bf16", 2500.0, 2250.0),
    ("cluster:vtrain-a100:busbw_scale", 1.0, 0.66),
]

PLUGIN = '''
import dataclasses, importlib, os

def pytest_configure(config):
    target, value = os.environ["GRIDTUNE_MUTATION"].rsplit("=", 1)
    value = float(value)
    kind, rest = target.split(":", 1)
    if kind == "gpu":
        from perfmodels import presets
        name, field = rest.split(":")
        key = name.lower()
        new = dataclasses.replace(presets._GPUS[key], **{field: value})
        presets._GPUS[key] = new
        for ckey, cl in list(presets._CLUSTERS.items()):
            if cl.gpu.name == new.name:
                presets._CLUSTERS[ckey] = dataclasses.replace(cl, gpu=new)
    elif kind == "cluster":  # scale the bus bandwidth of every measured collective of a cluster preset
        from perfmodels import presets
        name, _ = rest.split(":")
        cl = presets._CLUSTERS[name]
        fits = tuple(dataclasses.replace(f, busbw_GBps=f.busbw_GBps * value) for f in cl.profile.collectives)
        presets._CLUSTERS[name] = dataclasses.replace(
            cl, profile=dataclasses.replace(cl.profile, collectives=fits))
    elif kind == "stack":
        from perfmodels import stacks
        name, field = rest.split(":")
        stacks.STACK_PRESETS[name] = dataclasses.replace(stacks.STACK_PRESETS[name], **{field: value})
    else:
        module = importlib.import_module(kind)
        if rest.endswith("]"):
            name, key = rest[:-1].split("[")
            getattr(module, name)[key] = value
        else:
            setattr(module, rest, value)
'''


def run_one(target: str, mutated: float, plugin_dir: str) -> str | None:
    """The first failing test's id, or None when every test passed."""
    env = dict(os.environ, GRIDTUNE_MUTATION=f"{target}={mutated}",
               PYTHONPATH=os.pathsep.join([plugin_dir, str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "gridtune_mutation",
                          "-p", "no:cacheprovider", "tests/perfmodels", "tests/validation"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode == 0:
        return None
    for line in out.stdout.splitlines():
        if line.startswith("FAILED") or line.startswith("ERROR"):
            return line.split(" ")[1]
    return f"(pytest exit {out.returncode})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="run the mutations whose target contains this text")
    args = ap.parse_args(argv)
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "gridtune_mutation.py").write_text(PLUGIN)
        for target, value, mutated in MUTATIONS:
            if args.only and args.only not in target:
                continue
            caught = run_one(target, mutated, tmp)
            missed += caught is None
            print(
                f"{target:<52} {value:>6g} -> {mutated:<6g} "
                f"{'MISSED' if caught is None else 'caught by ' + caught}",
                flush=True,
            )
    print(f"{missed} mutation(s) not caught by any test")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
