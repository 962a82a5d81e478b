"""``python -m proofs_check``: run the claim catalogue and print the table (see runner.py)."""

import sys

from .runner import main

sys.exit(main(sys.argv[1:]))
