"""GKA Lemma 4 and Remark 1: how fast the weight schedule omega_i converges to omega_1*.

omega_0 = 2, omega_i = 4 / (4 - rho^2 omega_{i-1}) (GKA Algorithm 1, weight schedule).
Lemma 4: ``omega_i - omega_1* <= R^i (omega_0 - omega_1*)`` with
``R = (kappa - 1)/(kappa + 1) * R_a``. The exact one-step ratio is
``(omega_i - omega_1*) / (omega_{i-1} - omega_1*) = rho^2 omega_1* omega_i / 4`` (Lemma 4's proof,
step (i)), which tends to ``rho^2 omega_1*^2 / 4 = R_a^2``: the schedule converges at rate
``R_a^2`` asymptotically (0.569 at kappa = 51), faster than the bound's R (0.725).

The figure plots the gap in exact arithmetic (mpmath, 50 digits) for several kappa with
Lemma 4's bound and the asymptotic rate, the measured one-step ratio, and the gap of the
schedule as each precision computes it (float64, float32 = bf16 storage mode's compute dtype,
bf16 strict), which stalls at the precision's resolution of omega_1*.

:func:`remark1_table` is the numeric core of Remark 1 (R, R_a and their powers at kappa = 51),
held against the printed values in tests/test_figures.py.
"""

from __future__ import annotations

import pathlib

import mpmath
import torch

import solvers
from analysis.bounds import iterative as bounds
from analysis.precision import PRECISIONS

from . import _common as C

NAME = "gka_omega"
HELP = "GKA Lemma 4 / Remark 1: omega_i - omega_1* vs i, bound R^i, measured rate R_a^2, Remark 1 table"
TINY = {"iters": 20}  # a seconds-long run for tests/test_figures.py

REMARK1_KAPPA = 51  # L / mu = 1.02 / 0.02 (Remark 1)
REMARK1_POWERS = (1, 5, 10, 20, 30)
# Remark 1 as printed (GKA appendix D.1): power -> (R^n, R_a^n)
REMARK1_PRINTED = {
    1: ("0.7253", "0.7543"),
    5: ("0.2", "0.244"),
    10: ("0.04", "0.0597"),
    20: ("0.0016", "0.0036"),
    30: ("6e-5", "0.0002"),
}
KAPPAS = (11, 51, 101, 1001)


def remark1_table(kappa=REMARK1_KAPPA, powers=REMARK1_POWERS, dps: int = 50) -> dict:
    """``{n: (R^n, R_a^n)}`` in mpmath at ``dps`` digits (returned as floats).

    R = (kappa - 1)/(kappa + 1) * R_a (Lemma 4), R_a = (sqrt(kappa) - 1)/(sqrt(kappa) + 1) (Remark 1).
    """
    with mpmath.workdps(dps):
        k = mpmath.mpf(kappa)
        ra = (mpmath.sqrt(k) - 1) / (mpmath.sqrt(k) + 1)
        r = (k - 1) / (k + 1) * ra
        return {n: (float(r**n), float(ra**n)) for n in powers}


def exact_schedule(kappa, iters: int, dps: int = 50) -> tuple:
    """``(omega_0..omega_iters, omega_1*)`` in mpmath for L = kappa, mu = 1."""
    with mpmath.workdps(dps):
        k = mpmath.mpf(kappa)
        rho2 = ((k - 1) / (k + 1)) ** 2
        w = [mpmath.mpf(2)]
        for _ in range(iters):
            w.append(4 / (4 - rho2 * w[-1]))
        star = 2 / (1 + mpmath.sqrt(1 - rho2))
        return w, star


def first_within(gaps: list, tol: float) -> int:
    """First i with gap_i <= tol (-1 if none)."""
    return next((i for i, g in enumerate(gaps) if g <= tol), -1)


def params_for(quick: bool) -> dict:
    return {"kappas": list(KAPPAS), "iters": 40 if quick else 60, "dps": 50}


def _computed_schedule(kappa: float, iters: int, arith) -> torch.Tensor:
    """omega_0..omega_iters as ``solvers.chebyshev`` computes them in ``arith`` (its ``omegas``
    history; the 1x1 system only carries L = kappa, mu = 1)."""
    one = torch.ones(1, 1, dtype=arith.dtype)
    _, info = solvers.chebyshev(
        one, one[0], L=kappa, mu=1.0, iters=iters, bf16_mode=arith.mode, return_info=True
    )
    return info.omegas.to(torch.float64)


def compute(params: dict) -> dict:
    iters = params["iters"]
    out = {}
    for kappa in params["kappas"]:
        w, star = exact_schedule(kappa, iters, params["dps"])
        with mpmath.workdps(params["dps"]):
            gaps = [float(x - star) for x in w]
            ratios = [float((w[i] - star) / (w[i - 1] - star)) for i in range(1, iters + 1)]
        computed = {}
        for arith in PRECISIONS:
            if arith.label == "bfloat16/storage":
                continue  # its schedule is float32's (Arith.compute); plotted once as float32
            c = _computed_schedule(float(kappa), iters, arith)
            computed[arith.label] = [abs(float(mpmath.mpf(float(v)) - star)) for v in c]
        out[str(kappa)] = {
            "gap": gaps,
            "ratio": ratios,
            "omega_star": float(star),
            "R": float(bounds.omega_contraction(kappa)),
            "Ra2": float(bounds.contraction_rate(kappa)) ** 2,
            "lemma4": C.tolist(bounds.omega_gap_bound(kappa, torch.arange(iters + 1))),
            "computed": computed,
        }
    return {"kappas": out, "remark1": {str(n): v for n, v in remark1_table().items()}}


def paper_rows(data: dict) -> list:
    rows = []
    for n, (pr, pra) in REMARK1_PRINTED.items():
        r, ra = data["remark1"][str(n)]
        suffix = "" if n == 1 else f"^{n}"
        for sym, printed, ours in ((f"R{suffix}", pr, r), (f"R_a{suffix}", pra, ra)):
            ok = C.rounds_to(ours, printed)
            rows.append(
                C.PaperRow(
                    f"{sym} at kappa = 51 (Remark 1)",
                    printed,
                    f"{ours:.4g}",
                    ok,
                    "" if ok else "printed value truncated, not rounded (docs/errata.md)",
                )
            )
    d = data["kappas"][str(REMARK1_KAPPA)]
    u_bf16 = 2.0**-8
    tol = u_bf16 * d["omega_star"]
    exact_i = first_within(d["gap"], tol)
    bound_i = first_within(d["lemma4"], tol)
    rows.append(
        C.PaperRow(
            "iterations until omega_i is within bf16 resolution of omega_1* (kappa = 51)",
            "at most 20",
            f"{exact_i} (Lemma 4 bound: {bound_i})",
            exact_i <= 20 and bound_i <= 20,
            "gap <= u_bf16 * omega_1*, u_bf16 = 2^-8",
        )
    )
    rows.append(
        C.PaperRow(
            "asymptotic contraction of omega_i - omega_1* (kappa = 51)",
            "R = 0.7253 (bound)",
            f"R_a^2 = {d['Ra2']:.4f} (measured last ratio {d['ratio'][-1]:.4f})",
            None,
            "Lemma 4 holds but is loose: the exact rate is R_a^2 < R",
        )
    )
    return rows


def render(out_dir: pathlib.Path, params: dict, data: dict) -> list:
    fig, axes = C.subplots(3, width=4.8)
    its = list(range(params["iters"] + 1))
    colors = dict(
        zip(map(str, params["kappas"]), ["tab:green", "tab:blue", "tab:orange", "tab:red"])
    )
    ax = axes[0][0]
    for k, d in data["kappas"].items():
        col = colors[k]
        ax.plot(its, C.positive(d["gap"]), color=col, lw=1.6, label=f"kappa={k} exact")
        ax.plot(
            its,
            C.positive(d["lemma4"]),
            color=col,
            lw=0.9,
            ls="--",
            label=f"Lemma 4: R^i (R={d['R']:.3f})",
        )
        g0 = d["gap"][0]
        ax.plot(its, [g0 * d["Ra2"] ** i for i in its], color=col, lw=0.8, ls=":")
    C.finish_axis(
        ax,
        xlabel="iteration i",
        ylabel="omega_i - omega_1*",
        legend_size=6,
        title="gap (dotted: (omega_0 - omega_1*) R_a^{2i})",
    )
    ax = axes[0][1]
    for k, d in data["kappas"].items():
        col = colors[k]
        ax.plot(its[1:], d["ratio"], color=col, lw=1.4, label=f"kappa={k}")
        ax.axhline(d["R"], color=col, lw=0.8, ls="--")
        ax.axhline(d["Ra2"], color=col, lw=0.8, ls=":")
    C.finish_axis(
        ax,
        xlabel="iteration i",
        ylabel="gap ratio g_i / g_{i-1}",
        logy=False,
        title="one-step ratio of g_i = omega_i - omega_1* (dashed: R, dotted: R_a^2)",
        legend=False,
    )
    # two rows at the right, between the smallest kappa's ratio and its R: loc="best" put four
    # rows in the lower left, over the first iterations of kappa = 11
    ax.legend(fontsize=6, loc="lower right", bbox_to_anchor=(1.0, 0.07), ncol=2)
    ax = axes[0][2]
    d = data["kappas"][str(REMARK1_KAPPA)]
    # wide and light underneath: float64 follows it to ~1e-16, so a thin black line was hidden
    ax.plot(its, C.positive(d["gap"]), color="0.7", lw=4.0, zorder=1, label="exact (mpmath)")
    for label, gap in d["computed"].items():
        ax.plot(
            its,
            C.positive(gap),
            ls=C.PRECISION_STYLES[label],
            lw=1.3,
            label=f"computed in {label}" + (" (= bf16 storage)" if label == "float32" else ""),
        )
    ax.axhline(2.0**-8 * d["omega_star"], color="gray", lw=0.8, ls="-.", label="u_bf16 * omega_1*")
    C.finish_axis(
        ax,
        xlabel="iteration i",
        ylabel="|omega_i - omega_1*|",
        legend_size=6,
        title=f"kappa = {REMARK1_KAPPA}: schedule in each precision",
    )
    files = C.save_figure(
        fig, out_dir, NAME, "GKA Lemma 4 / Remark 1: convergence of the Chebyshev weight schedule"
    )
    rows = []
    for k, d in data["kappas"].items():
        for i in its:
            row = {
                "kappa": int(k),
                "iteration": i,
                "gap_exact": d["gap"][i],
                "lemma4_bound": d["lemma4"][i],
                "ratio": d["ratio"][i - 1] if i else "",
                "R": d["R"],
                "Ra2": d["Ra2"],
            }
            row.update({f"gap_{lab}": g[i] for lab, g in d["computed"].items()})
            rows.append(row)
    files += C.write_data(
        out_dir, NAME, rows, {"params": params, "remark1": data["remark1"]}, paper_rows(data)
    )
    return files


run = C.figure_runner(__name__)
