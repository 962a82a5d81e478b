#!/usr/bin/env bash
# The test suite: deterministic hypothesis profile, Triton kernels through the interpreter.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/bootstrap.sh"
cd "$root"
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
exec "$root/.venv/bin/python" -m pytest -q -n "${SVT_TEST_WORKERS:-2}" "$@"
