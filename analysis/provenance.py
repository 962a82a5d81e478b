"""What produced a result: the toolkit's commit (or version), the versions of Python, torch and
Triton, the device and the date. Figures stamp it in a footer and their JSON; the report puts it
at the top of ``report.md`` and in its JSON, so a number can be traced to the run behind it.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import pathlib
import platform
import subprocess

_ROOT = pathlib.Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def commit() -> str:
    """Short git commit of the toolkit's checkout, ``+dirty`` when files differ from it; the
    package version when the toolkit is installed without its git history. ``SVT_COMMIT`` in the
    environment overrides both: a copy of a checkout sent to another machine without its ``.git``
    names the commit it was made from. A checkout is only read from its own repository: a copy
    placed inside another repository's tree (an ignored folder) would otherwise report the outer
    repository's commit."""
    override = os.environ.get("SVT_COMMIT", "").strip()
    if override:
        return override
    try:

        def git(*args):
            return subprocess.run(
                ["git", "-C", str(_ROOT), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()

        if pathlib.Path(git("rev-parse", "--show-toplevel")).resolve() != _ROOT:
            raise subprocess.SubprocessError("not the toolkit's own repository")
        head = git("rev-parse", "--short=10", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        from analysis import __version__

        return f"version {__version__}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def device_name() -> str:
    """The CUDA device torch would use, else ``CPU (<machine>)``."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine() or 'unknown'})"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def provenance(device: str | None = None) -> dict:
    """Commit, versions, device (``device`` overrides the detected one) and date of this run."""
    import torch

    return {
        "commit": commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "device": device or device_name(),
        "date": now(),
    }


def footer(prov: dict, drawn: dict | None = None) -> str:
    """One line for a figure's footer: what computed the data and, if different, what drew it."""
    text = f"data: {prov.get('commit', '?')}, {prov.get('device', '?')}, torch {prov.get('torch', '?')}, {prov.get('date', '?')}"
    if drawn and (drawn.get("commit"), drawn.get("date")[:10]) != (
        prov.get("commit"),
        str(prov.get("date", ""))[:10],
    ):
        text += f"  |  drawn: {drawn.get('commit')}, {drawn.get('date')}"
    return text
