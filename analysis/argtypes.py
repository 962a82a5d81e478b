"""argparse pieces shared by the toolkit's command lines (``svt`` / ``python -m analysis``,
``python -m analysis.testing.harness``, ``python -m proofs_check`` and the smaller ones), so that a usage
error reads the same everywhere: one line naming the argument, exit status 2."""

from __future__ import annotations

import argparse
import difflib
import math
import os
import pathlib
import re
import sys
import tempfile
from typing import TYPE_CHECKING, Iterable, Optional

if TYPE_CHECKING:
    import torch


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


def usable_device(device) -> torch.device:
    """``device`` (a string or a torch.device) as a torch.device that can hold the data here, or
    a ValueError naming it: not a device at all, CUDA on a machine without one (or a missing
    index), ``meta`` (shapes without values: a check compares values)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(
            f"expected a torch device such as cpu or cuda, got {str(device)!r}"
        ) from None
    if dev.type == "meta":
        raise ValueError(
            f"{str(device)!r} holds no values (shapes only): a check compares values; use cpu or cuda"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{str(device)!r}: no CUDA device on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"{str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    if dev.type not in ("cpu", "cuda"):
        try:
            torch.empty(0, device=dev)
        except Exception:  # noqa: BLE001 - torch's error for a backend missing here varies
            raise ValueError(f"{str(device)!r}: this device is not available here") from None
    return dev


def device(text: str) -> str:
    """A torch device string that exists here ("cpu", "cuda", "cuda:1", ...): a typo, a CUDA
    device on a machine without one or ``meta`` is a usage error, not a failure of the kernel."""
    try:
        usable_device(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def folder(text: str) -> pathlib.Path:
    """A folder name; an empty one (``--out ''``, which would mean the current directory) is a
    usage error naming the value."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a folder name, got {text!r}")
    return pathlib.Path(text)


class StoreOnce(argparse.Action):
    """``store``, except that the option given twice with different values is a usage error
    (argparse would keep the last one silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        marker = f"_{self.dest}_given"
        before = getattr(namespace, marker, None)
        if before is not None and before != values:
            raise argparse.ArgumentError(
                self, f"given twice with different values: {str(before)!r} and {str(values)!r}"
            )
        setattr(namespace, marker, values)
        setattr(namespace, self.dest, values)


def writable_folder(parser: argparse.ArgumentParser, path: pathlib.Path, option: str) -> None:
    """Create ``path`` and make sure files can be written in it, before any work is done; if not,
    a usage error (exit 2) naming ``option`` instead of a traceback at the first write."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        parser.error(f"argument {option}: cannot write to {str(path)!r}: {reason}")


def add_run_options(
    parser: argparse.ArgumentParser, level: str = "only", default_out=pathlib.Path("reports")
) -> None:
    """The options of the main job's commands (``svt``, ``python -m analysis.studies.allowance``):
    ``--quick``/``--full``, ``--recompute``, ``--out DIR``. ``level`` ``"only"``: a command line of
    one level; ``"top"``: before a subcommand (dests ``top_quick``, ``top_recompute``,
    ``top_out``, to be reconciled with the subcommand's own, see ``analysis.cli.merge_levels``);
    ``"sub"``: after it (absent unless given). Unset ``--quick``/``--full`` is None (the caller
    decides); ``--out`` given twice with different values or empty is a usage error."""
    prefix = "top_" if level == "top" else ""
    unset = argparse.SUPPRESS if level == "sub" else None
    g = parser.add_mutually_exclusive_group()
    g.add_argument(
        "--quick",
        dest=prefix + "quick",
        action="store_true",
        default=unset,
        help="small problems, seconds per family (default on a machine without a CUDA GPU)",
    )
    g.add_argument(
        "--full",
        dest=prefix + "quick",
        action="store_false",
        default=unset,
        help="the full problem sets, paper-scale figures (default with a CUDA GPU)",
    )
    parser.add_argument(
        "--recompute",
        dest=prefix + "recompute",
        action="store_true",
        default=argparse.SUPPRESS if level == "sub" else False,
        help="ignore cached ground truth and figure data and compute them again (default: use the cache)",
    )
    parser.add_argument(
        "--out",
        dest=prefix + "out",
        type=folder,
        action=StoreOnce,
        default={"top": None, "sub": argparse.SUPPRESS}.get(level, default_out),
        metavar="DIR",
        help=f"output folder, created if missing (default: {default_out})",
    )


def settle_run_options(parser: argparse.ArgumentParser, args) -> None:
    """After :func:`add_run_options`: ``--quick`` unset means quick without a CUDA GPU;
    ``--recompute`` sets ``SVT_RECOMPUTE=1`` (read by ``analysis.references.iterative``); ``--out``
    is created and must be writable (else a usage error naming it)."""
    if args.quick is None:
        import torch

        args.quick = not torch.cuda.is_available()
    if args.recompute:
        os.environ["SVT_RECOMPUTE"] = "1"
    writable_folder(parser, args.out, "--out")


def did_you_mean(wanted: str, choices: Iterable[str], n: int = 3) -> str:
    """`` (did you mean 'x'?)`` for the choices closest to ``wanted`` (difflib, as
    ``proofs_check.registry.suggest``), or ``""`` when none is close."""
    close = difflib.get_close_matches(wanted, sorted(choices), n=n, cutoff=0.5)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


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
    "StoreOnce",
    "add_run_options",
    "condition_number",
    "device",
    "did_you_mean",
    "folder",
    "interpret_without_gpu",
    "non_negative_int",
    "plain",
    "positive_int",
    "settle_run_options",
    "usable_device",
    "writable_folder",
]
