"""argparse value types shared by the toolkit's command lines (``python -m kernels.harness``,
``python -m proofs_check``), so that a bad value reads the same everywhere."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1; anything else is a usage error naming the value (exit status 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


__all__ = ["positive_int"]
