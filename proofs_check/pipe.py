"""Command lines whose output is cut short by a closed pipe (``python -m proofs_check --list | head``)
end quietly, as ``head`` expects, instead of with a ``BrokenPipeError`` traceback."""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

# the shell's status of a process ended by SIGPIPE (128 + 13)
BROKEN_PIPE_STATUS = 141


def run_quietly(main: Callable[[Optional[list]], int], argv: Optional[list] = None) -> int:
    """``main(argv)``, and its output flushed; a reader that went away ends it with status 141."""
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python flushes stdout once more at exit: point it at /dev/null so that flush is silent
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return BROKEN_PIPE_STATUS
