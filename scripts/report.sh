#!/usr/bin/env bash
# The main job: regenerates the verification report under reports/ (subcommands: --help).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/python" -m analysis "${@:-report}"
