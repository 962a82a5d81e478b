#!/usr/bin/env bash
# KLA and Koopman kernels on one GPU, one call: graph-capture and GPU tests, then the two
# benchmarks (profiler, graph-replay and wall times), logs and JSON under $OUT.
#   bash benchmarks/gpu_kla_koopman.sh [tests] [bench] [profile]
# fla-core comes from a wheel in ../../.whl or .whl (the GPU machine has no network).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-reports/gpu}
mkdir -p "$OUT"
WHL=$(ls ../../.whl/fla_core-*.whl .whl/fla_core-*.whl 2>/dev/null | head -1)
[ -n "$WHL" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$WHL"
export PYTHONPATH=$PWD:/tmp/site
# compiled kernels and autotuning results shared by the test and benchmark processes
export TRITON_CACHE_DIR=/tmp/tcache TRITON_CACHE_AUTOTUNING=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"; date -u; } | tee "$OUT/machine.txt"
for what in "$@"; do
    case "$what" in
        tests)
            timeout ${TESTS_TIMEOUT:-200} python3 -m pytest ${GPU_TESTS:-tests/test_kernels_graph_capture.py tests/test_kernels_kla.py \
                tests/test_kernels_koopman.py} -q -s -o addopts="" -m gpu -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -30 ;;
        bench|profile)
            flag=$([ "$what" = profile ] && echo --profile)
            timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_kla.py --out "$OUT/kla.json" $flag 2>&1 | tee "$OUT/kla-bench.log" | grep -v "^ *[A-Za-z_].*  [0-9.]*%" | tail -40
            timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_koopman.py --out "$OUT/koopman.json" $flag 2>&1 | tee "$OUT/koopman-bench.log" | tail -16 ;;
        *) echo "unknown step $what" ;;
    esac
done
ls -la "$OUT"
