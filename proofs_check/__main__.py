"""``python -m proofs_check``: run the claim catalogue and print the table (see runner.py)."""

import sys

from .pipe import run_quietly
from .runner import main

sys.exit(run_quietly(main, sys.argv[1:]))
