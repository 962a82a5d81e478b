#!/usr/bin/env bash
# Creates .venv on first use and installs the toolkit into it (editable).
# torch: a torch that Python can already import is kept (a GPU user keeps theirs, the venv
# sees it through --system-site-packages); otherwise torch==2.13.0 is installed first, so
# pip never resolves the bare `torch` requirement to a multi-GB CUDA build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv --system-site-packages "$venv"
fi
vpy="$venv/bin/python"
stamp="$venv/.svt-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    if ! "$vpy" -c "import torch" >/dev/null 2>&1; then
        "$vpy" -m pip install -q "torch==2.13.0"
    fi
    "$vpy" -m pip install -q -e "$root"
    touch "$stamp"
fi
