"""argparse pieces shared by the toolkit's command lines (``svt`` / ``python -m analysis``,
``python -m analysis.testing.harness``, ``python -m proofs_check`` and the smaller ones), so that a usage
error reads the same everywhere: one line naming the argument, exit status 2."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Optional


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (``prog: error: ...``, no usage block)
    and exit status 2; ``--help`` still prints the full usage. Subparsers inherit it."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` as written: descriptions and epilogs keep their line breaks, and every option
    that has a default shows it (``(default: ...)``), unless its help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = (
            action.default is None or action.default is False or action.default is argparse.SUPPRESS
        )
        if "default" in text or unset or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def plain(doc: str) -> str:
    """A module docstring as ``--help`` text: markup dropped (````x```` and ``:role:`x``` -> x)."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc).replace("``", "").strip()


def _int_at_least(text: str, minimum: int, wanted: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1; anything else is a usage error naming the value (exit status 2)."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An integer >= 0; anything else is a usage error naming the value (exit status 2)."""
    return _int_at_least(text, 0, "an integer >= 0")


def condition_number(text: str) -> float:
    """A finite float >= 1 (a largest condition number); anything else is a usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}") from None
    if not math.isfinite(value) or value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 1, got {text!r}")
    return value


def device(text: str) -> str:
    """A torch device string that exists here ("cpu", "cuda", "cuda:1", ...): a typo or a CUDA
    device on a machine without one is a usage error, not a failure of the kernel."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected a torch device such as cpu or cuda, got {text!r}"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return text


def interpret_without_gpu(device: Optional[str]) -> Optional[str]:
    """Set TRITON_INTERPRET=1 when a command runs kernels on the CPU, before any kernel module
    imports Triton; returns a warning when Triton was imported already (too late to take effect)."""
    import torch

    on_cpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cpu")
    if not on_cpu or "TRITON_INTERPRET" in os.environ:
        return None
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules:
        return "warning: Triton was imported before TRITON_INTERPRET=1 could be set; a Triton kernel may not run"
    return None


__all__ = [
    "HelpFormatter",
    "OneLineParser",
    "condition_number",
    "device",
    "interpret_without_gpu",
    "non_negative_int",
    "plain",
    "positive_int",
]
