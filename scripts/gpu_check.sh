#!/usr/bin/env bash
# The one command for a GPU machine: checks the engine's GPU path and the performance
# model on this machine, prints one table, exits non-zero when a check fails or misses its target.
#
#   bash scripts/gpu_check.sh [OUT_DIR]        # default OUT_DIR: ./gpu_check_out (or $OUT when set)
#
# With NVIDIA GPUs (nvidia-smi lists them):
#   1. the engine's equivalence tests (tests/engine/test_equivalence.py, test_zero.py, test_recompute.py)
#      on NCCL with as many ranks as GPUs (grids needing more ranks are skipped);
#   2. the built-in GPT (~1.1 B parameters, bf16) trained by engine.train on one GPU: step time, MFU,
#      peak memory (bench/gpu_check.py gpt1b);
#   3. one rank of 12 larger layouts on one GPU with torch's fake process group, predicted
#      (perfmodels.predict, the engine's Training options) against measured peak memory (target
#      within 10%) and forward+backward time (within 15%) (bench/gpu_check.py layouts);
#   4. `gridtune profile` on the GPU (GEMM and HBM curves).
# Without a GPU it says so and runs the CPU subset: the engine's test suite on gloo and a quick
# `gridtune profile --nproc 2`.
#
# Runs with PYTHONPATH=. and the machine's python3 (or .venv/bin/python when it exists and no GPU
# is present); needs torch, numpy, scipy, pandas, rich, pytest; never imports the service (api/).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-./gpu_check_out}}"
mkdir -p "$OUT_DIR"
# NVML answers "is there a GPU" without initializing CUDA, so processes can still fork GPU ranks
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTORCH_NVML_BASED_CUDA_CHECK=1
# growable segments: the caching allocator's reserve stays close to what is allocated (less
# fragmentation), as a production job would run
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
PY=python3
ROWS=()
FAILED=0

row() {  # check, result, target, status
    ROWS+=("$1|$2|$3|$4")
    if [ "$4" != "ok" ]; then FAILED=1; fi
}

pytest_summary() {  # log file -> "N passed, M skipped..."
    grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$1" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//'
}

NGPU=0
if command -v nvidia-smi >/dev/null 2>&1; then
    NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -c . || true)
fi

if [ "$NGPU" -gt 0 ]; then
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    echo "== $NGPU x $GPU_NAME; torch $($PY -c 'import torch; print(torch.__version__)')"

    echo "== 1. engine equivalence tests on NCCL, $NGPU rank(s) at most"
    GRIDTUNE_TEST_BACKEND=nccl GRIDTUNE_TEST_MAX_WORLD="$NGPU" OMP_NUM_THREADS=4 \
        $PY -m pytest -q -p no:cacheprovider tests/engine/test_equivalence.py tests/engine/test_zero.py \
        tests/engine/test_recompute.py 2>&1 | tee "$OUT_DIR/nccl_tests.log"
    rc=${PIPESTATUS[0]}
    row "engine equivalence on NCCL" "$(pytest_summary "$OUT_DIR/nccl_tests.log")" "all pass, 1e-5" \
        "$([ "$rc" -eq 0 ] && echo ok || echo FAIL)"

    echo "== 2. built-in GPT ~1B, bf16, engine.train on one GPU"
    if $PY bench/gpu_check.py gpt1b --out "$OUT_DIR" 2>&1 | tee "$OUT_DIR/gpt1b.log"; then
        while IFS='|' read -r a b c d; do row "$a" "$b" "$c" "$d"; done \
            < <($PY bench/gpu_check.py summary-gpt1b --out "$OUT_DIR")
    else
        row "GPT 1.1B bf16, 1 GPU (engine.train)" "crashed (see gpt1b.log)" "trains" "FAIL"
    fi

    echo "== 3. one rank of 12 layouts, fake process group, predicted vs measured"
    if $PY bench/gpu_check.py layouts --out "$OUT_DIR" 2>&1 | tee "$OUT_DIR/layouts.log"; then
        while IFS='|' read -r a b c d; do row "$a" "$b" "$c" "$d"; done \
            < <($PY bench/gpu_check.py summary-layouts --out "$OUT_DIR")
    else
        row "fake-group layouts" "crashed (see layouts.log)" "runs" "FAIL"
    fi

    echo "== 4. gridtune profile on the GPU"
    if $PY -m cli profile --nproc 1 --quick --out "$OUT_DIR/profile.json" 2>&1 | tee "$OUT_DIR/profile.log"; then
        res=$($PY -c "
import json; d = json.load(open('$OUT_DIR/profile.json'))
g, h = d.get('gemm_tflops_max'), d.get('hbm_bandwidth_GBps')
print(f'GEMM {g:.0f} TFLOP/s max, HBM {h:.0f} GB/s' if g and h else 'no GEMM/HBM fit')")
        row "gridtune profile (GEMM, HBM curves)" "$res" "fits" "$(case "$res" in no*) echo FAIL;; *) echo ok;; esac)"
    else
        row "gridtune profile (GEMM, HBM curves)" "crashed (see profile.log)" "fits" "FAIL"
    fi
else
    echo "== no NVIDIA GPU on this machine: running the CPU subset (engine tests on gloo, gridtune profile)"
    [ -x .venv/bin/python ] && PY=.venv/bin/python
    OMP_NUM_THREADS=1 $PY -m pytest -q -p no:cacheprovider tests/engine 2>&1 | tee "$OUT_DIR/cpu_tests.log"
    rc=${PIPESTATUS[0]}
    row "engine tests on gloo (CPU)" "$(pytest_summary "$OUT_DIR/cpu_tests.log")" "all pass" \
        "$([ "$rc" -eq 0 ] && echo ok || echo FAIL)"
    if OMP_NUM_THREADS=1 $PY -m cli profile --nproc 2 --quick --out "$OUT_DIR/profile.json" \
        > "$OUT_DIR/profile.log" 2>&1; then
        row "gridtune profile --nproc 2 (CPU)" "$(grep -E '^GEMM' "$OUT_DIR/profile.log" | head -1)" "fits" ok
    else
        row "gridtune profile --nproc 2 (CPU)" "crashed (see profile.log)" "fits" FAIL
    fi
    row "GPU checks" "skipped: no GPU available" "-" ok
fi

echo
printf '%-42s | %-88s | %-22s | %s\n' "check" "result" "target" "status"
printf '%s\n' "$(printf '%.0s-' {1..170})"
for r in "${ROWS[@]}"; do
    IFS='|' read -r a b c d <<< "$r"
    printf '%-42s | %-88s | %-22s | %s\n' "$a" "$b" "$c" "$d"
done
exit $FAILED
