"""Plots for docs/performance.md from the committed benchmark JSON (no GPU needed).

    python benchmarks/plot.py benchmarks/results/h200-run1-forward-backward.json \
        benchmarks/results/h200-run2-kla-koopman.json --out docs/figures
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _rows(paths):
    rows = []
    for p in paths:
        rows += [r for r in json.loads(Path(p).read_text())["rows"] if "ms" in r]
    return rows


def plot_time_vs_n(rows, out: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, dtype in zip(axes, ("float32", "bfloat16")):
        ops = sorted({r["op"] for r in rows if r["suite"] == "forward" and r["dtype"] == dtype and r.get("iters") in (30, None)})
        for op in ops:
            pts = sorted((r["N"], r["ms"]) for r in rows if r["suite"] == "forward" and r["op"] == op and r["dtype"] == dtype)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=op)
        roof = sorted({(r["N"], r["roofline_ms"]) for r in rows if r["suite"] == "forward" and r["dtype"] == dtype})
        ax.plot([p[0] for p in roof], [p[1] for p in roof], "k--", label="roofline (read H once)")
        ax.set(xscale="log", yscale="log", xlabel="systems N (D = 128)", title=f"{dtype} inputs, r = 30")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("median time (ms)")
    for ax in axes:
        ax.legend(fontsize=6, loc="upper left")
    path = out / "perf_time_vs_n.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_time_vs_r(rows, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    N = max(r["N"] for r in rows if r["suite"] == "forward")
    for op in ("kernels.chebyshev", "solvers.chebyshev eager"):
        for dtype, ls in (("float32", "-"), ("bfloat16", "--")):
            pts = sorted((r["iters"], r["ms"]) for r in rows if r["suite"] == "forward" and r["N"] == N
                         and r["dtype"] == dtype and r["op"].startswith(op + " r="))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o", label=f"{op} ({dtype})")
    ax.set(yscale="log", xlabel="iterations r", ylabel="median time (ms)", title=f"Chebyshev, N = {N}, D = 128")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    path = out / "perf_time_vs_r.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_roofline_fraction(rows, out: Path) -> Path:
    sel = [r for r in rows if r.get("fraction_of_roofline") and r["op"].startswith("kernels.")
           and r.get("N", 0) in (131072, 0) or (r.get("suite") in ("kla", "koopman") and r["op"].startswith("kernels."))]
    labels = [f"{r['op']} {r.get('dtype', '')} {('r=' + str(r['r'])) if 'r' in r else ''}".strip() for r in sel]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(sel) + 1))
    ax.barh(range(len(sel)), [r["fraction_of_roofline"] for r in sel])
    ax.axvline(1 / 2.5, color="k", ls="--", label="issue 7 target: within 2.5x (Chebyshev)")
    ax.set_yticks(range(len(sel)), labels, fontsize=7)
    ax.set(xscale="log", xlabel="fraction of the memory roofline (1 = reads inputs once at copy bandwidth)")
    ax.legend(fontsize=7)
    path = out / "perf_roofline_fraction.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", type=Path, default=Path("docs/figures"))
    args = ap.parse_args(argv)
    rows = _rows(args.json)
    args.out.mkdir(parents=True, exist_ok=True)
    for f in (plot_time_vs_n, plot_time_vs_r, plot_roofline_fraction):
        print(f(rows, args.out))


if __name__ == "__main__":
    main()
