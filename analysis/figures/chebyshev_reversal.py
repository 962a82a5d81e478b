"""Stability of the four Chebyshev backward passes (GKA appendix E.1, Algorithm 2, Remark 2).

For ``solvers.chebyshev_backward`` with ``method`` in autograd / implicit / reverse /
reverse_stored_omega, on ``analysis.references.chebyshev_backward.spd_problem(D, kappa)`` (geometric
spectrum, stored in the working dtype, L and mu of the stored matrix), against the mpmath
gradient of the truncated loop (``analysis.references.chebyshev_backward.measure``, which is stricter than
float64 autograd: it has no rounding at all):

* relative error of dq (solid) and dH (dashed) vs r, one panel per (precision, kappa);
* the reverse methods' reconstructions: the rebuilt xi_0 (reverse_stored_omega, eq. (49)) and
  the recovered weight nu_1 (reverse, eq. (47)), with their amplification estimates
  ``u_acc A_r`` (``reversal_amplification``, ~R_a^-r) and ``u_acc Gamma_r``
  (``omega_recovery_amplification``, ~R_a^-2r) as thin lines.

The implicit method's dH differs from the loop's by a truncation term even without rounding
(``implicit_dH_gap_bound``): its dH curve falls with r like the forward error, not to the
rounding floor. Paper (Remark 2): the reversal "can be done stably" since -b_i is in [0.25, 1].
The table holds the rebuilt xi_0 at kappa = 51, r = 30 (GKA's setting) to the precision
model's rounding allowance ``c kappa (n u_acc + u_store)``.
"""

from __future__ import annotations

import pathlib

from analysis.precision import PRECISIONS, by_label, rounding_allowance
from analysis.references import chebyshev_backward as cb

from . import _common as C

NAME = "chebyshev_reversal"
HELP = "Chebyshev backward (autograd/implicit/reverse/reverse_stored_omega): dq, dH, rebuilt xi_0, nu_1 errors vs r, kappa"

METHOD_COLORS = {
    "autograd": "tab:blue",
    "implicit": "tab:green",
    "reverse": "tab:red",
    "reverse_stored_omega": "tab:purple",
}
GKA_KAPPA, GKA_ITERS = 51.0, 30
TINY = {
    "kappas": [GKA_KAPPA],
    "iters": [5, GKA_ITERS],
    "D": 4,
}  # a seconds-long run for tests/test_figures.py


def params_for(quick: bool) -> dict:
    if quick:
        return {"kappas": [10.0, 51.0, 1000.0], "iters": [5, 10, 20, 30], "D": 8}
    return {"kappas": [10.0, 51.0, 1000.0], "iters": [2, 5, 10, 15, 20, 30, 40, 50], "D": 16}


def compute(params: dict) -> dict:
    cells = []
    for arith in PRECISIONS:
        for kappa in params["kappas"]:
            for r in params["iters"]:
                try:
                    found = cb.measure(arith, kappa, r, params["D"])
                except ValueError:
                    continue  # H indefinite once rounded (bf16 at large kappa): no problem to measure
                cells += [c.__dict__ for c in found]
    return {"cells": cells}


def _bound_lines(kappa: float, iters: list, u: float) -> tuple:
    L, mu = kappa, 1.0
    return (
        [u * cb.reversal_amplification(L, mu, r) for r in iters],
        [u * cb.omega_recovery_amplification(L, mu, r) for r in iters],
    )


def paper_rows(params: dict, data: dict) -> list:
    rows = []
    for arith in PRECISIONS:
        at = {
            (c["method"], c["kappa"], c["iters"]): c
            for c in data["cells"]
            if c["precision"] == arith.label
        }
        key = ("reverse_stored_omega", GKA_KAPPA, GKA_ITERS)
        if key not in at:
            continue
        allow = rounding_allowance(GKA_KAPPA, params["D"], arith)
        applies = allow < 1.0  # beyond 1 the allowance guarantees nothing (analysis.precision)
        why = "" if applies else "; allowance >= 1 does not apply"
        xi0 = at[key]["xi0_error"]
        rows.append(
            C.PaperRow(
                f"rebuilt xi_0 rel. error, kappa = 51, r = 30 ({arith.label})",
                "stable (Remark 2)",
                f"{xi0:.1e} (allowance {allow:.1e})",
                (xi0 <= allow) if applies else None,
                "reverse_stored_omega, eq. (49)" + why,
            )
        )
        nu1 = at[("reverse", GKA_KAPPA, GKA_ITERS)]["nu1_error"]
        rows.append(
            C.PaperRow(
                f"recovered nu_1 rel. error, kappa = 51, r = 30 ({arith.label})",
                "stable (eq. (47))",
                f"{nu1:.1e} (allowance {allow:.1e})",  # the verdict's yardstick, shown
                (nu1 <= allow) if applies else None,
                "reverse, eq. (47): omega_1* repels the reversed map" + why,
            )
        )
    return rows


def _row_limits(cells: list) -> tuple:
    """One y range per precision (row), wide enough for every measured error in it: a range
    shared by all rows would leave most of each panel empty and clip the largest errors."""
    vals = [
        c[k]
        for c in cells
        for k in ("dq_error", "dH_error", "xi0_error", "nu1_error")
        if c.get(k) is not None and 0 < c[k] < float("inf")
    ]
    if not vals:
        return 1e-17, 1e4
    return min(vals) / 5, max(max(vals) * 5, 10.0)


def _annotate_implicit_dH(ax, cells: list) -> None:
    """Mark the implicit method's dH where it stays near 1 (in float64 too): that gap is
    truncation (``implicit_dH_gap_bound``), not rounding, so more precision does not help."""
    imp = sorted((c for c in cells if c["method"] == "implicit"), key=lambda c: c["iters"])
    if imp and imp[-1]["dH_error"] > 0.1:
        last = imp[-1]
        ax.annotate(
            "implicit dH ~ 1:\ntruncation gap,\nnot rounding",
            xy=(last["iters"], last["dH_error"]),
            xytext=(0.55, 0.45),
            textcoords="axes fraction",
            fontsize=7,
            color="tab:green",
            arrowprops={"arrowstyle": "->", "color": "tab:green", "lw": 0.8},
        )


def _annotate_amplification(ax, cells: list) -> None:
    """Mark the rebuilt xi_0's growth: the reversal multiplies rounding by ~A_r ~ R_a^-r."""
    rso = sorted(
        (c for c in cells if c["method"] == "reverse_stored_omega"), key=lambda c: c["iters"]
    )
    if rso and rso[-1]["xi0_error"] > 0:
        last = rso[-1]
        ax.annotate(
            "reversal amplifies\nrounding: xi_0 error\n~ u_acc A_r",
            xy=(last["iters"], last["xi0_error"]),
            xytext=(0.03, 0.97),
            textcoords="axes fraction",
            fontsize=7,
            va="top",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1},
            arrowprops={"arrowstyle": "->", "color": "black", "lw": 0.8},
        )


def render(out_dir: pathlib.Path, params: dict, data: dict) -> list:
    labels = [a.label for a in PRECISIONS]
    kappas, its = params["kappas"], params["iters"]
    fig, axes = C.subplots(len(kappas), len(labels), width=4.2, height=3.1)
    for i, label in enumerate(labels):
        row_lim = _row_limits([c for c in data["cells"] if c["precision"] == label])
        u = by_label(label).u_acc
        for j, kappa in enumerate(kappas):
            ax = axes[i][j]
            mine = [c for c in data["cells"] if c["precision"] == label and c["kappa"] == kappa]
            if not mine:
                ax.text(0.5, 0.5, "H indefinite once rounded", ha="center", transform=ax.transAxes)
            for method, col in METHOD_COLORS.items():
                cs = sorted((c for c in mine if c["method"] == method), key=lambda c: c["iters"])
                rs = [c["iters"] for c in cs]
                ax.plot(
                    rs,
                    C.positive([c["dq_error"] for c in cs]),
                    color=col,
                    marker="o",
                    ms=3,
                    label=f"{method} dq",
                )
                ax.plot(
                    rs,
                    C.positive([c["dH_error"] for c in cs]),
                    color=col,
                    ls="--",
                    marker="x",
                    ms=3,
                    label=f"{method} dH",
                )
            rso = sorted(
                (c for c in mine if c["method"] == "reverse_stored_omega"), key=lambda c: c["iters"]
            )
            rev = sorted((c for c in mine if c["method"] == "reverse"), key=lambda c: c["iters"])
            ax.plot(
                [c["iters"] for c in rso],
                C.positive([c["xi0_error"] for c in rso]),
                color="black",
                lw=1.6,
                label="rebuilt xi_0",
            )
            ax.plot(
                [c["iters"] for c in rev],
                C.positive([c["nu1_error"] for c in rev]),
                color="gray",
                lw=1.6,
                label="recovered nu_1",
            )
            amp_xi, amp_nu = _bound_lines(kappa, its, u)
            ax.plot(its, amp_xi, color="black", lw=0.7, ls=":", label="u_acc A_r")
            ax.plot(its, amp_nu, color="gray", lw=0.7, ls=":", label="u_acc Gamma_r")
            C.finish_axis(
                ax,
                xlabel="iterations r" if i == len(labels) - 1 else "",
                ylabel=f"{label}: rel. error" if j == 0 else "",
                title=f"{label}, kappa = {kappa:g}",
                legend=False,
            )
            ax.set_ylim(*row_lim)
            if label == "float64":
                _annotate_implicit_dH(ax, mine)
            elif label == "float32" and j == 0:
                _annotate_amplification(ax, mine)
    files = C.save_figure(
        fig,
        out_dir,
        NAME,
        f"Chebyshev backward passes vs the mpmath gradient of the loop "
        f"(D = {params['D']}); rows: precision (own y range), columns: kappa",
        legend_from=axes[0][0],
        legend_cols=6,
    )
    amplification = {
        str(k): {
            "A_r": [cb.reversal_amplification(k, 1.0, r) for r in its],
            "Gamma_r": [cb.omega_recovery_amplification(k, 1.0, r) for r in its],
        }
        for k in kappas
    }
    files += C.write_data(
        out_dir,
        NAME,
        data["cells"],
        {"params": params, "amplification": amplification},
        paper_rows(params, data),
    )
    return files


run = C.figure_runner(__name__)
