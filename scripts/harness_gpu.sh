#!/usr/bin/env bash
# The harness on the GPU: third-party kernels (flash-linear-attention: KLA via
# chunk_gated_delta_rule, MesaNet CG decoding / chunked) and ours, under their declared
# contracts (docs/harness.md, docs/validation.md "Harness on the GPU").
# Usage (repository root, fla-core installed):  bash scripts/harness_gpu.sh [LOG]
# ONLY="fla_kla chebyshev" runs those alone; LIMIT_OVERRIDE=S gives each run S seconds; OUT=DIR
# receives fla_kla.txt.
set -u
LOG=${1:-/dev/stdout}
export PYTHONPATH=${PYTHONPATH:-$PWD}:$PWD/tests PYTHONUNBUFFERED=1
export FLA_ONE_CONFIG=${FLA_ONE_CONFIG:-1}  # fla_adapter: first autotuning config (compile time)
H() {  # one harness run: name, per-run time limit (s), arguments; ONLY="name ..." selects runs
  local name=$1 limit=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  limit=${LIMIT_OVERRIDE:-$limit}
  echo "=== $name: python -m analysis.testing.harness $*" >>"$LOG"
  local t0=$SECONDS
  timeout "$limit" python -W ignore -m analysis.testing.harness "$@" --seed 0 >>"$LOG" 2>/dev/null
  echo "=== exit $? in $((SECONDS - t0)) s" >>"$LOG"
}
P() {  # one python step (progress on stderr kept in the log): name, time limit (s), arguments
  local name=$1 limit=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  limit=${LIMIT_OVERRIDE:-$limit}
  echo "=== $name: python $*" >>"$LOG"
  local t0=$SECONDS
  timeout "$limit" python -W ignore "$@" >>"$LOG" 2>&1
  echo "=== exit $? in $((SECONDS - t0)) s" >>"$LOG"
}
nvidia-smi --query-gpu=name --format=csv,noheader >>"$LOG" 2>&1
# third-party kernels
# fla's chunk_gated_delta_rule as KLA, bf16 and float32 inputs, fair pairing: one shape (compiled
# before the search), fla's first autotuning configuration (tests/fla_adapter.py, kla_verdicts)
P fla_kla 240 tests/fla_adapter.py kla --examples 12 --out "${OUT:-.}"
# (without fair pairing the bf16 run FAILs on the pairing, not on fla: shown on the CPU by
# tests/test_harness_matrix.py::test_fair_pairing_prepare_hook; over all shapes it outruns any limit)
H mesa_cg_decoding 40 fla_adapter:mesa_cg_decoding solvers:cg --strategy spd_nobounds --precision bfloat16 \
  --model float32 --max-d 64 --max-batch 16 --examples 12
H mesa_cg_chunk 60 fla_adapter:mesa_cg_chunk solvers:cg --strategy spd_nobounds --precision bfloat16 \
  --model bfloat16/operands --max-d 64 --max-batch 16 --examples 12
# ours
S="--precision bfloat16 --model float32 --max-d 128 --max-batch 32 --examples 10"
H chebyshev 25 kernels:chebyshev solvers:chebyshev --strategy spd $S
H cg 25 kernels:cg solvers:cg --strategy spd_nobounds $S
H gd 25 kernels:gd solvers:gd --strategy spd $S
H agd 25 kernels:agd solvers:agd --strategy spd $S
H chebyshev_adaptive 25 kernels:chebyshev_adaptive analysis.testing.harness:gka_ridge_reference --strategy gka_ridge $S
# trajectory mode (docs/harness.md): every step count run, each step checked against its bound
H chebyshev_trajectory 60 kernels:chebyshev solvers:chebyshev --strategy spd $S --trajectory
H gd_trajectory 60 kernels:gd solvers:gd --strategy spd $S --trajectory
H agd_trajectory 60 kernels:agd solvers:agd --strategy spd $S --trajectory
H chebyshev_adaptive_trajectory 60 kernels:chebyshev_adaptive analysis.testing.harness:gka_ridge_reference --strategy gka_ridge $S --trajectory
H chebyshev_backward 30 kernels:chebyshev_backward solvers:chebyshev_backward --strategy spd_backward $S
H kla_chunkwise 40 kernels:kla_chunkwise solvers:kla_chunkwise --strategy kla --precision bfloat16 \
  --model bfloat16/operands --examples 8
# the Koopman readout (statistics as inputs, analysis/testing/koopman_strategy.py), float32 and
# bf16 inputs under its float32 contract (input_precision "ieee")
K="analysis.testing.koopman_strategy:koopman_kernel analysis.testing.koopman_strategy:koopman_reference"
H koopman_float32 60 $K --strategy koopman --precision float32 --model float32 --examples 10
H koopman_bfloat16 60 $K --strategy koopman --precision bfloat16 --model float32 --examples 10
