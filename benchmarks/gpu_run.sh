#!/usr/bin/env bash
# One batched GPU session (device tool): kernel GPU tests, then benchmarks, logs under $OUT.
#   bash benchmarks/gpu_run.sh tests      # pytest -m gpu over every kernel test file
#   bash benchmarks/gpu_run.sh bench      # the benchmark suite (benchmarks/bench.py)
#   bash benchmarks/gpu_run.sh docs       # the docs' code blocks marked gpu (needs pytest-codeblocks)
#   bash benchmarks/gpu_run.sh fla        # the harness's worked example against fla (docs/harness.md)
#   bash benchmarks/gpu_run.sh reliability harness gradsearch   # bad-input/status tests, contracts, fla #640 search
# Carry .whl (fla-core, einops, hypothesis, ...) with the call; the GPU machine has no network.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-reports/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    # Only what the machine lacks: its own torch/triton/numpy stay.
    for w in .whl/*.whl; do
        name=$(basename "$w" | cut -d- -f1 | tr _ -)
        python3 -c "import importlib.metadata as m; m.version('$name')" >/dev/null 2>&1 || echo "$w"
    done > /tmp/missing_wheels
    if [ -s /tmp/missing_wheels ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $(cat /tmp/missing_wheels)
    fi
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" | tee -a "$OUT/machine.txt"
for what in "$@"; do
    case "$what" in
        tests)
            timeout ${TESTS_TIMEOUT:-300} python3 -m pytest ${GPU_TESTS:-tests/test_kernels_*.py} -q -o addopts="" -m gpu -p no:cacheprovider \
                2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
        docs)  # the code blocks of README.md and docs/ marked gpu and not slow (pytest-codeblocks: carry its wheel)
            # the blocks call `python` as a user would; the machine may only have python3
            if ! command -v python >/dev/null; then
                mkdir -p /tmp/pybin && ln -sf "$(command -v python3)" /tmp/pybin/python && export PATH=/tmp/pybin:$PATH
            fi
            HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} timeout ${DOCS_TIMEOUT:-300} python3 -m pytest README.md docs \
                --codeblocks -v --durations=0 -o addopts="" -m "gpu and not slow" -p no:cacheprovider \
                2>&1 | tee "$OUT/gpu_docs.log" | tail -20 ;;
        bench)
            timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/bench.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -80 ;;
        reliability)  # the reliability tests' kernel cases, on the GPU
            timeout ${REL_TIMEOUT:-120} python3 -m pytest tests/test_reliability_status.py tests/test_reliability_inputs.py \
                tests/test_reliability_mutants.py -q -o addopts="" -k kernel -p no:cacheprovider \
                2>&1 | tee "$OUT/gpu_reliability.log" | tail -15 ;;
        harness)  # third-party and our kernels under their contracts (scripts/harness_gpu.sh; ONLY= selects)
            bash scripts/harness_gpu.sh "$OUT/harness_gpu.log"; grep -E "^===|^PASS|^FAIL|^INCONCLUSIVE|worst" "$OUT/harness_gpu.log" | tail -40 ;;
        gradsearch)  # the gradient strategy on fla's chunk_gated_delta_rule backward, #640 guard bypassed
            timeout $(( ${SEARCH_BUDGET:-150} + 60 )) python3 benchmarks/bench_kla_backward.py --out "$OUT" --part search \
                --budget ${SEARCH_BUDGET:-150} 2>&1 | tail -25 ;;
        fla)
            timeout ${FLA_TIMEOUT:-240} python3 -m analysis.testing.harness tests.fla_adapter:kla_via_fla solvers:kla_chunkwise --strategy kla \
                --precision bfloat16 --model bfloat16/storage --examples 10 2>&1 | tee "$OUT/fla_harness.log" | tail -20 ;;
        *) echo "unknown step $what" ;;
    esac
done
