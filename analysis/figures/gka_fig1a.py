"""GKA Fig. 1a: residual norm per iteration of Chebyshev (CH), CG, GD and AGD on the appendix-F
synthetic problems, in every working precision, with each method's a-priori bound.

The problems are ``solvers.fig1a_problems`` (Frobenius-normalised cumulative key covariances
plus ``a I``, unit queries), generated once in float64 and rounded to each precision. CH, GD
and AGD get the paper's bounds ``L = 1 + a``, ``mu = a`` (eq. (4) with ``||H||_F = 1``).
Plotted: the maximum over all systems (solid) and the median (dashed) of ``||q - A x_i||`` with
``||q|| = 1``, and the exact-arithmetic bound of ``analysis.figures._runs.residual_bound``
(dotted) at ``kappa = (1 + a)/a``.

The paper prints no numbers for Fig. 1a, only three statements (Section 4.2.3): CG converges
fastest within a few iterations; CH reaches CG's accuracy at iteration 10; CH eventually
attains the smallest errors. The paper table measures each statement.
"""

from __future__ import annotations

import math
import pathlib

import torch

import solvers
from analysis.precision import PRECISIONS, by_label

from . import _common as C
from ._runs import METHODS, residual_bound, residual_history

NAME = "gka_fig1a"
HELP = "GKA Fig. 1a: residual norms of CH/CG/GD/AGD per iteration, every precision, with bounds"
TINY = {
    "scale": {"B": 1, "T": 8, "heads": 1, "D": 8},
    "iters": 10,
}  # a seconds-long run for tests/test_figures.py

PAPER_SCALE = {"B": 8, "T": 2048, "heads": 8, "D": 128}
CPU_SCALE = {"B": 2, "T": 256, "heads": 4, "D": 64}
QUICK_SCALE = {"B": 1, "T": 64, "heads": 2, "D": 32}
LABELS = {"chebyshev": "CH", "cg": "CG", "gd": "GD", "agd": "AGD"}


def params_for(quick: bool) -> dict:
    scale = QUICK_SCALE if quick else (PAPER_SCALE if C.on_gpu(quick) else CPU_SCALE)
    return {
        "scale": dict(scale),
        "a": 0.02,
        "iters": 50,
        "seed": 0,
        "precisions": [p.label for p in PRECISIONS],
        "device": str(C.device(quick)),
    }


def compute(params: dict) -> dict:
    s = params["scale"]
    P = solvers.fig1a_problems(
        s["B"],
        s["T"],
        s["heads"],
        s["D"],
        a=params["a"],
        seed=params["seed"],
        device=torch.device(params["device"]),
    )
    kappa = P.L / P.mu
    series = {}
    for arith in PRECISIONS:
        if arith.label not in params["precisions"]:
            continue
        series[arith.label] = {}
        for m in METHODS:
            r = residual_history(m, P.A, P.q, L=P.L, mu=P.mu, iters=params["iters"], arith=arith)
            finite = torch.where(torch.isfinite(r), r, torch.full_like(r, float("inf")))
            series[arith.label][m] = {
                "max": C.tolist(finite.max(dim=1).values),
                "median": C.tolist(r.median(dim=1).values),
                "nonfinite_systems": int((~torch.isfinite(r[-1])).sum()),
            }
    bounds = {m: [residual_bound(m, kappa, i) for i in range(params["iters"] + 1)] for m in METHODS}
    return {
        "kappa": kappa,
        "n_systems": int(P.q[..., 0].numel()),
        "series": series,
        "bounds": bounds,
    }


def crossover(ch: list, cg: list) -> int:
    """The iteration at which CH catches up with CG: the first i after CG has taken the lead
    (CG < CH) with CH <= CG again; -1 if CG never leads or CH never catches up."""
    lead = next((i for i in range(1, len(ch)) if cg[i] < ch[i]), None)
    if lead is None:
        return -1
    return next((i for i in range(lead + 1, len(ch)) if ch[i] <= cg[i]), -1)


def paper_rows(data: dict) -> list:
    rows = []
    for label, per in data["series"].items():
        med = {m: per[m]["median"] for m in METHODS}
        early = {m: med[m][3] for m in METHODS}
        fastest = min(early, key=early.get)
        rows.append(
            C.PaperRow(
                f"fastest method at iteration 3 ({label}, median)",
                "CG",
                LABELS[fastest],
                fastest == "cg",
            )
        )
        for stat in ("median", "max"):
            cross = crossover(per["chebyshev"][stat], per["cg"][stat])
            rows.append(
                C.PaperRow(
                    f"iteration CH catches up with CG ({label}, {stat})",
                    "10",
                    "never" if cross < 0 else str(cross),
                    None,
                    "'same accuracy at iteration 10'; precision and statistic not stated",
                )
            )
        final = {m: per[m]["max"][-1] for m in METHODS}
        rows.append(
            C.PaperRow(
                f"smallest final max residual ({label}, i={len(med['cg']) - 1})",
                "CH",
                smallest_final(final),
                min(final, key=final.get) == "chebyshev",
            )
        )
    return rows


def smallest_final(final: dict) -> str:
    """The method with the smallest final residual, with the value it is compared against: CH's
    when another method wins, the runner-up's when CH wins (not CH's own value twice)."""
    ranked = sorted(final, key=final.get)
    best = ranked[0]
    if best == "chebyshev":
        nxt = ranked[1]
        return f"CH {final[best]:.1e} (next: {LABELS[nxt]} {final[nxt]:.1e})"
    return f"{LABELS[best]} {final[best]:.1e} (CH {final['chebyshev']:.1e})"


def floor_bottom(u: float, top: float, data_bottom: float, room: float = 0.16) -> float:
    """The bottom of a log y axis from ``data_bottom`` to ``top`` that leaves at least the
    fraction ``room`` of the axis height below the rounding floor ``u`` (and at least 1.5
    decades), so that the two-line note under the floor stays inside the panel."""
    decades = max(1.5, room / (1.0 - room) * math.log10(top / u))
    return min(data_bottom, u / 10.0**decades)


def _legends(ax) -> None:
    """Two small legends beside the last panel (colour = method, line style = statistic)
    instead of twelve entries over the data."""
    from matplotlib.lines import Line2D

    methods = [Line2D([], [], color=C.METHOD_COLORS[m], lw=1.6, label=LABELS[m]) for m in METHODS]
    styles = [
        Line2D([], [], color="black", lw=1.6, label="max over systems"),
        Line2D([], [], color="black", lw=1.0, ls="--", label="median"),
        Line2D([], [], color="black", lw=0.8, ls=":", label="exact-arithmetic bound"),
        Line2D([], [], color="0.45", lw=0.9, ls=(0, (6, 2, 1, 2)), label="rounding floor u_store"),
    ]
    first = ax.legend(
        handles=methods,
        title="method",
        fontsize=6,
        title_fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        frameon=False,
    )
    ax.add_artist(first)
    ax.legend(
        handles=styles, fontsize=6, loc="lower left", bbox_to_anchor=(1.02, 0.0), frameon=False
    )


def render(out_dir: pathlib.Path, params: dict, data: dict) -> list:
    labels = list(data["series"])
    fig, axes = C.subplots(len(labels))
    fig.set_size_inches(4.6 * len(labels) + 1.4, 3.6)  # room for the legends beside the last panel
    its = list(range(params["iters"] + 1))
    for ax, label in zip(axes[0], labels):
        for m in METHODS:
            col = C.METHOD_COLORS[m]
            ser = data["series"][label][m]
            ax.plot(its, C.positive(ser["max"]), color=col, lw=1.6, label=f"{LABELS[m]} max")
            ax.plot(
                its,
                C.positive(ser["median"]),
                color=col,
                lw=1.0,
                ls="--",
                label=f"{LABELS[m]} median",
            )
            ax.plot(
                its,
                C.positive(data["bounds"][m]),
                color=col,
                lw=0.8,
                ls=":",
                label=f"{LABELS[m]} bound",
            )
        C.finish_axis(
            ax,
            xlabel="iteration i",
            ylabel="residual ||q - A x_i|| (||q|| = 1)",
            title=label,
            legend=False,
        )
        u = by_label(label).u_store
        ax.set_ylim(bottom=floor_bottom(u, 10.0, max(1e-17, ax.get_ylim()[0])), top=10.0)
        C.rounding_floor(ax, u, "rounding floor u_store ||q||")
        # below the floor the exact-arithmetic bounds promise what the stored q cannot resolve
        ax.axhspan(ax.get_ylim()[0], u, color="0.5", alpha=0.08, lw=0)
        ax.text(
            0.98,
            u * 0.5,
            "below u: bounds unattainable\nin this precision",
            transform=ax.get_yaxis_transform(),
            ha="right",
            va="top",
            fontsize=6,
            color="0.3",
        )
    _legends(axes[0][-1])
    s = params["scale"]
    title = (
        f"GKA Fig. 1a: B={s['B']}, T={s['T']}, heads={s['heads']}, D={s['D']}, a={params['a']} "
        f"(kappa <= {data['kappa']:.0f}), {data['n_systems']} systems"
    )
    files = C.save_figure(fig, out_dir, NAME, title)
    rows = []
    for label, per in data["series"].items():
        for m, ser in per.items():
            for i in its:
                rows.append(
                    {
                        "precision": label,
                        "method": m,
                        "iteration": i,
                        "max_residual": ser["max"][i],
                        "median_residual": ser["median"][i],
                        "bound": data["bounds"][m][i],
                    }
                )
    files += C.write_data(
        out_dir,
        NAME,
        rows,
        {"params": params, "kappa": data["kappa"], "n_systems": data["n_systems"]},
        paper_rows(data),
    )
    return files


run = C.figure_runner(__name__)
