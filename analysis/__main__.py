"""``python -m analysis``: see analysis/cli.py."""

import sys

from .cli import main

sys.exit(main())
