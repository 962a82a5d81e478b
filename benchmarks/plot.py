"""Plots for docs/performance.md from the committed benchmark JSON (no GPU needed).

    python benchmarks/plot.py benchmarks/results/h200-run1-forward-backward.json \
        benchmarks/results/h200-run2-kla-koopman.json --out docs/figures

The benchmarks measured two sizes (N) and two iteration counts (r) per operation, so the time
plots are dot charts, one row per operation, not lines through two points. Every plot names the
GPU, software and date of the run in a footer, and the commit that drew it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Marker per measured size / iteration count, so two values of one operation read as a pair.
MARKERS = ("o", "s", "^", "D")
DTYPE_COLORS = {"float32": "tab:blue", "bfloat16": "tab:orange"}


def _load(paths):
    """Rows with a time, and the environment of each run (GPU, versions, date).

    Only benchmarks/bench.py's results (``env`` and ``rows``) are plotted; other JSON in the
    same folder (bench_gka_layer.py, bench_kla.py, fla_640_repro.py, ...) is skipped with a note,
    so that ``benchmarks/results/*.json`` works as a glob."""
    rows, envs = [], []
    for p in paths:
        doc = json.loads(Path(p).read_text())
        if not (isinstance(doc, dict) and "env" in doc and "rows" in doc):
            print(f"skipped (not a benchmarks/bench.py result): {p}", file=sys.stderr)
            continue
        rows += [r for r in doc["rows"] if "ms" in r]
        envs.append(doc.get("env", {}))
    return rows, envs


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short=10", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown commit"


def _footer(fig, envs) -> int:
    """What measured the data and what drew it, wrapped to the figure's width; returns the lines."""
    runs = {}
    for e in envs:
        key = f"{e.get('gpu', '?')}, torch {e.get('torch', '?')}, triton {e.get('triton', '?')}"
        runs.setdefault(key, []).append(str(e.get("date", "?"))[:16])
    measured = "; ".join(f"{k}, {' and '.join(sorted(d))} UTC" for k, d in runs.items())
    drawn = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    text = textwrap.fill(
        f"measured: {measured}  |  drawn: {_commit()}, {drawn}",
        width=int(fig.get_size_inches()[0] * 19),
    )
    fig.text(0.995, 0.005, text, ha="right", va="bottom", fontsize=6, color="0.4")
    return text.count("\n") + 1


def _save(fig, envs, path: Path) -> Path:
    lines = _footer(fig, envs)
    fig.tight_layout(rect=(0, (0.1 + 0.1 * lines) / fig.get_size_inches()[1], 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _op_name(op: str) -> str:
    """The operation without its iteration suffix (``kernels.cg r=30`` -> ``kernels.cg``)."""
    return op.split(" r=")[0]


def _dot_chart(ax, points: dict, values: list, label_of, colour: str) -> None:
    """One row per key of ``points`` ({op: {value: ms}}), a marker per measured value."""
    ops = sorted(points, key=lambda o: max(points[o].values()))
    for y, op in enumerate(ops):
        ms = points[op]
        ax.plot(
            [ms[v] for v in values if v in ms],
            [y] * sum(v in ms for v in values),
            color="0.75",
            lw=0.8,
            zorder=1,
        )
        for v, marker in zip(values, MARKERS):
            if v in ms:
                ax.plot(ms[v], y, marker, color=colour, ms=5, zorder=2)
    for v, marker in zip(values, MARKERS):
        ax.plot([], [], marker, color=colour, label=label_of(v))
    ax.set_yticks(range(len(ops)), ops, fontsize=7)
    ax.set_xscale("log")
    ax.grid(True, axis="x", which="both", alpha=0.3)


def plot_time_vs_n(rows, envs, out: Path) -> Path:
    fwd = [r for r in rows if r["suite"] == "forward" and r.get("iters") in (30, None)]
    sizes = sorted({r["N"] for r in fwd})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, dtype in zip(axes, ("float32", "bfloat16")):
        points = {}
        for r in fwd:
            if r["dtype"] == dtype:
                points.setdefault(_op_name(r["op"]), {})[r["N"]] = r["ms"]
        _dot_chart(ax, points, sizes, lambda n: f"N = {n}", DTYPE_COLORS[dtype])
        roof = {r["N"]: r["roofline_ms"] for r in fwd if r["dtype"] == dtype}
        for n in sizes:
            if n in roof:
                ax.axvline(roof[n], color="black", ls="--", lw=0.8)
                ax.text(
                    roof[n] * 1.08, len(points) - 0.6, f"roofline\nN = {n}", fontsize=6, va="top"
                )
        ax.set(xlabel="median time (ms), log scale", title=f"{dtype} inputs (D = 128, r = 30)")
        ax.legend(fontsize=7, loc="lower right")
    return _save(fig, envs, out / "perf_time_vs_n.png")


def plot_time_vs_r(rows, envs, out: Path) -> Path:
    N = max(r["N"] for r in rows if r["suite"] == "forward")
    fig, ax = plt.subplots(figsize=(7, 3.2))
    iters = sorted({r["iters"] for r in rows if r["suite"] == "forward" and r.get("iters")})
    labels = []
    for op in ("kernels.chebyshev", "solvers.chebyshev eager"):
        for dtype in ("float32", "bfloat16"):
            ms = {
                r["iters"]: r["ms"]
                for r in rows
                if r["suite"] == "forward"
                and r["N"] == N
                and r["dtype"] == dtype
                and r["op"].startswith(op + " r=")
            }
            y = len(labels)
            labels.append(f"{op} ({dtype})")
            ax.plot(
                [ms[i] for i in iters if i in ms],
                [y] * sum(i in ms for i in iters),
                color="0.75",
                lw=0.8,
            )
            for i, marker in zip(iters, MARKERS):
                if i in ms:
                    ax.plot(ms[i], y, marker, color=DTYPE_COLORS[dtype], ms=6)
    for i, marker in zip(iters, MARKERS):
        ax.plot([], [], marker, color="0.3", label=f"r = {i}")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set(xscale="log", xlabel="median time (ms), log scale", title=f"Chebyshev, N = {N}, D = 128")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, envs, out / "perf_time_vs_r.png")


def plot_roofline_fraction(rows, envs, out: Path) -> Path:
    sel = [
        r
        for r in rows
        if r.get("fraction_of_roofline")
        and r["op"].startswith("kernels.")
        and (r.get("N", 0) in (131072, 0) or r.get("suite") in ("kla", "koopman"))
    ]
    labels = [
        " ".join(filter(None, (r["op"], r.get("dtype"), f"r={r['r']}" if "r" in r else None)))
        for r in sel
    ]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(sel) + 1.3))
    ax.barh(range(len(sel)), [r["fraction_of_roofline"] for r in sel])
    ax.axvline(
        1 / 2.5, color="k", ls="--", label="target for Chebyshev: within 2.5x of the roofline"
    )
    ax.set_yticks(range(len(sel)), labels, fontsize=7)
    ax.set(
        xscale="log",
        xlabel="fraction of the memory roofline (1 = reads inputs once at copy bandwidth)",
    )
    ax.legend(fontsize=7)
    return _save(fig, envs, out / "perf_roofline_fraction.png")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("json", nargs="+", help="benchmark result files (benchmarks/results/*.json)")
    ap.add_argument("--out", type=Path, default=Path("docs/figures"), help="folder for the PNGs")
    args = ap.parse_args(argv)
    rows, envs = _load(args.json)
    args.out.mkdir(parents=True, exist_ok=True)
    for f in (plot_time_vs_n, plot_time_vs_r, plot_roofline_fraction):
        print(f(rows, envs, args.out))


if __name__ == "__main__":
    main()
