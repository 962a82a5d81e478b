"""argparse pieces shared by the toolkit's command lines (``svt`` / ``python -m analysis``,
``python -m analysis.testing.harness``, ``python -m proofs_check`` and the smaller ones), so that a usage
error reads the same everywhere: one line naming the argument, exit status 2."""

from __future__ import annotations

import argparse
import re


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


__all__ = ["HelpFormatter", "OneLineParser", "non_negative_int", "plain", "positive_int"]
