"""What every figure module shares: the Agg backend, saving, data files, the paper table, caching.

A figure module computes a JSON-able ``data`` dict from a ``params`` dict, then renders it.
:func:`produce` runs that pipeline with a cache: the data of a finished experiment is stored
under ``out_dir/_cache/<name>.json`` keyed by a hash of (params, the source of the figure
module, of this module and of the ``solvers`` package), so editing any of them recomputes,
and a second ``report`` with unchanged code and parameters only re-checks that the files exist.

Files a figure writes, all beside each other in ``out_dir``:
``<name>.png`` / ``<name>.svg`` (the plot), ``<name>.csv`` (long-format measured series),
``<name>.json`` (parameters, measured summary, paper values), and, where the paper prints
numbers, ``<name>_paper.md`` / ``<name>_paper.csv`` (paper value vs ours, one row each).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import pathlib
import sys
import time
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch

from analysis import provenance as _prov

FIGURE_DPI = 130
GALLERY_DPI = 100
_ROOT = pathlib.Path(__file__).resolve().parents[2]

# One colour per method across all figures, so a reader learns them once.
METHOD_COLORS = {
    "chebyshev": "tab:blue",
    "cg": "tab:orange",
    "gd": "tab:green",
    "agd": "tab:red",
    "exact": "black",
}
PRECISION_STYLES = {
    "float64": "-",
    "float32": "--",
    "bfloat16/storage": "-.",
    "bfloat16/strict": ":",
}


def on_gpu(quick: bool) -> bool:
    """Paper-scale sizes run only with a GPU and outside quick mode."""
    return (not quick) and torch.cuda.is_available()


def device(quick: bool) -> torch.device:
    return torch.device("cuda") if on_gpu(quick) else torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# Paper value vs ours


@dataclass
class PaperRow:
    """One number the paper prints next to ours.

    ``agrees`` is decided by the caller from the printed rounding (e.g. a value printed to 4
    digits agrees when ours rounds to it); ``note`` says how (or why not).
    """

    quantity: str
    paper: str
    ours: str
    agrees: Optional[bool]
    note: str = ""


def rounds_to(value: float, printed: str) -> bool:
    """Does ``value`` round to the printed decimal string at the printed number of digits?

    ``printed`` is what the paper shows ("0.7253", "6e-5", "0.0016"): the value agrees when it
    lies within half a unit of the printed last digit, a tie included (the paper's rule for
    ties is not known).

    Decided exactly, with no tolerance: the float64 ``value`` and the decimal string are both
    rational numbers, and ``Fraction`` holds them and the half unit ``10^(e - decimals) / 2``
    without rounding. (The former float64 evaluation rounded the printed value, the power of
    ten, the half unit and the difference, and a margin of 1e-12 stood in for those roundings;
    a tie such as 0.0625 printed 0.063 now counts exactly.) The value's own error, from how the
    caller computed it, is the caller's to bound.
    """
    if not math.isfinite(float(value)):
        return False
    text = printed.strip().lower()
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2])
    half_unit = Fraction(1, 2) * Fraction(10) ** ((int(exponent) if exponent else 0) - decimals)
    return abs(Fraction(float(value)) - Fraction(text)) <= half_unit


def _cell(text: str) -> str:
    """A markdown table cell: the norms' bars (``||k||``, ``|lambda|^2``) escaped, or each ``|``
    would end the cell and shift the row's columns."""
    return str(text).replace("|", "\\|")


def paper_table_markdown(rows: Sequence[PaperRow]) -> str:
    lines = ["| quantity | paper | ours | agrees | note |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        mark = {True: "yes", False: "**no**", None: "n/a"}[r.agrees]
        cells = (r.quantity, r.paper, r.ours, mark, r.note)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_paper_table(
    out_dir: pathlib.Path, name: str, rows: Sequence[PaperRow]
) -> list[pathlib.Path]:
    md = out_dir / f"{name}_paper.md"
    md.write_text(paper_table_markdown(rows))
    return [md, write_csv(out_dir / f"{name}_paper.csv", [asdict(r) for r in rows])]


# ---------------------------------------------------------------------------------------------
# Data files


def write_data(
    out_dir: pathlib.Path,
    name: str,
    rows: Sequence[dict],
    summary: dict,
    table: Optional[Sequence[PaperRow]] = None,
) -> list[pathlib.Path]:
    """The data files beside a plot: ``<name>.csv`` (``rows``, long format), ``<name>.json``
    (``summary``, plus the paper table under ``"paper"``) and, with a table, ``<name>_paper.md``
    and ``<name>_paper.csv``."""
    summary = {**summary, "provenance": stamp()}
    if table is None:
        return [
            write_csv(out_dir / f"{name}.csv", rows),
            write_json(out_dir / f"{name}.json", summary),
        ]
    return [
        write_csv(out_dir / f"{name}.csv", rows),
        write_json(out_dir / f"{name}.json", {**summary, "paper": [asdict(r) for r in table]}),
        *write_paper_table(out_dir, name, table),
    ]


def write_csv(path: pathlib.Path, rows: Sequence[dict]) -> pathlib.Path:
    """Long-format CSV; the header is the union of the rows' keys in first-seen order."""
    header: list = []
    for r in rows:
        header.extend(k for k in r if k not in header)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        for r in rows:
            w.writerow({k: _plain(v) for k, v in r.items()})
    return path


def write_json(path: pathlib.Path, obj) -> pathlib.Path:
    path.write_text(json.dumps(obj, indent=1, default=_plain, allow_nan=True))
    return path


def _plain(v):
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, float) and math.isfinite(v):
        return float(f"{v:.10g}")
    return v


def tolist(t: torch.Tensor) -> list:
    """A tensor as a float64 list (for the JSON cache)."""
    return t.detach().to("cpu", torch.float64).tolist()


# ---------------------------------------------------------------------------------------------
# Plot helpers


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, imported when a figure is drawn: the CLI
    imports every figure module for its --help, and matplotlib is an optional extra."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(
            "drawing figures needs matplotlib: pip install 'solver-verification-toolkit[figures]' "
            "(or pip install matplotlib)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(ncols: int, nrows: int = 1, *, width: float = 4.6, height: float = 3.6):
    fig, axes = pyplot().subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False
    )
    return fig, axes


def finish_axis(
    ax,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logy: bool = True,
    logx: bool = False,
    legend: bool = True,
    legend_size: float = 7.0,
):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    if logy:
        ax.set_yscale("log")
    if logx:
        ax.set_xscale("log")
    ax.grid(True, which="major", alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend_size, loc="best")


def positive(values) -> list:
    """Values for a log axis: zeros and negatives become NaN (a gap), never a fake tiny value."""
    return [v if (v is not None and v > 0 and math.isfinite(v)) else float("nan") for v in values]


# Provenance of the figure being rendered: ``render_stamped`` sets it around a module's
# ``render``, so that ``save_figure`` (footer) and ``write_data`` (JSON) stamp it without every
# figure module passing it through.
_STAMP: dict = {}

# Colours of the working precisions where a panel separates them by colour (Dark2: distinct
# from METHOD_COLORS' tab: colours and readable in greyscale by lightness).
PRECISION_COLORS = {
    "float64": "#1b9e77",
    "float32": "#d95f02",
    "bfloat16/storage": "#7570b3",
    "bfloat16/strict": "#e7298a",
}


def render_stamped(render: Callable, out_dir: pathlib.Path, params: dict, data: dict) -> list:
    """``render(out_dir, params, data)`` with its footer and JSON stamped by ``data["provenance"]``
    (what computed the data; recorded by :func:`produce`) and by what draws it now."""
    _STAMP.clear()
    unknown = dict.fromkeys(("commit", "device", "torch", "date"), "not recorded")
    _STAMP.update({"data": data.get("provenance") or unknown, "drawn": _prov.provenance()})
    try:
        return render(out_dir, params, data)
    finally:
        _STAMP.clear()


def stamp() -> dict:
    """The provenance of the figure being rendered (computed now when called outside
    :func:`render_stamped`)."""
    if not _STAMP:
        here = _prov.provenance()
        return {"data": here, "drawn": here}
    return dict(_STAMP)


def rounding_floor(ax, u: float, label: str = "rounding floor u") -> None:
    """A horizontal line at the unit roundoff ``u`` of the stored values: a relative error (or a
    residual relative to ||q||) cannot be resolved below it in that precision."""
    ax.axhline(u, color="0.45", lw=0.9, ls=(0, (6, 2, 1, 2)), label=label, zorder=1)


def save_figure(
    fig,
    out_dir: pathlib.Path,
    name: str,
    suptitle: str = "",
    *,
    legend_from=None,
    legend_cols: int = 6,
) -> list[pathlib.Path]:
    """Write ``<name>.png`` and ``<name>.svg`` and close the figure.

    A footer names what produced it (:func:`stamp`). ``legend_from``: an axis whose legend
    entries go into one legend below all panels (for grids where a legend would cover data).
    """
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    height = fig.get_size_inches()[1]
    footer_in = 0.2
    bottom_in = footer_in
    if legend_from is not None:
        handles, labels = legend_from.get_legend_handles_labels()
        rows = -(-len(labels) // legend_cols)
        legend_in = 0.2 * rows + 0.15
        fig.legend(
            handles,
            labels,
            loc="lower center",
            ncol=legend_cols,
            fontsize=8,
            frameon=False,
            bbox_to_anchor=(0.5, footer_in / height),
        )
        bottom_in += legend_in
    st = stamp()
    fig.text(
        0.995,
        0.004,
        _prov.footer(st["data"], st["drawn"]),
        ha="right",
        va="bottom",
        fontsize=6,
        color="0.4",
    )
    fig.tight_layout(rect=(0, bottom_in / height, 1, 1))
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    fig.savefig(png, dpi=FIGURE_DPI)
    fig.savefig(svg)
    pyplot().close(fig)
    return [png, svg]


# ---------------------------------------------------------------------------------------------
# The cached pipeline


def _source_digest(module_file: str) -> str:
    h = hashlib.sha256()
    files = [pathlib.Path(module_file), pathlib.Path(__file__)]
    files += sorted((_ROOT / "solvers").glob("*.py"))
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def cache_key(params: dict, module_file: str) -> str:
    blob = json.dumps(params, sort_keys=True, default=str) + _source_digest(module_file)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def figure_runner(module_name: str):
    """A figure module's ``run`` (``run = figure_runner(__name__)``): the module's ``params_for``
    (quick), updated by ``overrides`` (tests pass its TINY), through :func:`produce` with its
    ``NAME``, ``compute`` and ``render``, looked up when it runs (so a test may replace them)."""

    def run(
        out_dir: pathlib.Path, *, quick: bool, recompute: bool, overrides: Optional[dict] = None
    ) -> list:
        """Write the figure and its data into ``out_dir``; ``overrides`` replaces parameters (tests pass TINY)."""
        module = sys.modules[module_name]
        params = {**module.params_for(quick), **(overrides or {})}
        return produce(
            out_dir,
            module.NAME,
            params,
            module.__file__,
            module.compute,
            module.render,
            recompute=recompute,
        ).files

    return run


@dataclass
class Outcome:
    """What :func:`produce` did: the files, whether the data came from the cache, the time."""

    files: list
    cached: bool
    seconds: float


def produce(
    out_dir: pathlib.Path,
    name: str,
    params: dict,
    module_file: str,
    compute: Callable[[dict], dict],
    render: Callable[[pathlib.Path, dict, dict], list],
    *,
    recompute: bool,
) -> Outcome:
    """Compute (or load cached) data for ``params`` and render it into ``out_dir``.

    ``compute(params) -> data`` (JSON-able); ``render(out_dir, params, data) -> files``.
    With a cache hit and every recorded file present, nothing is recomputed or redrawn.
    """
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = out_dir / "_cache"
    cache_dir.mkdir(exist_ok=True)
    cache_file = cache_dir / f"{name}.json"
    key = cache_key(params, module_file)
    start = time.perf_counter()
    entry = None
    if not recompute and cache_file.exists():
        try:
            entry = json.loads(cache_file.read_text())
        except json.JSONDecodeError:
            entry = None
        if entry is not None and entry.get("key") != key:
            entry = None
    if entry is not None:
        files = [out_dir / f for f in entry.get("files", [])]
        if files and all(f.exists() for f in files):
            return Outcome(files, True, time.perf_counter() - start)
        data = entry["data"]
        cached = True
    else:
        data = compute(params)
        data["compute_seconds"] = round(time.perf_counter() - start, 3)
        data["provenance"] = _prov.provenance()
        cached = False
    files = [pathlib.Path(f) for f in render_stamped(render, out_dir, params, data)]
    cache_file.write_text(
        json.dumps(
            {"key": key, "params": params, "data": data, "files": [f.name for f in files]},
            default=_plain,
        )
    )
    return Outcome(files, cached, time.perf_counter() - start)
