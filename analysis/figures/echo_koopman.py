"""Echo / Spectral Koopman Attention: the power filter's gain (App. D.1), spectral normalisation
(Props. D.2, D.3) and the readout's sensitivity to the ridge eps and the precision.

Data: per system, keys from a linear dynamical system ``z_t = R z_{t-1} + noise`` (r = 24, the
paper's rank; R symmetric with eigenvalues spread over [0.1, 0.99], so the operator has modes
from transient to persistent), values ``v_t = W z_t + noise``; statistics, whitened operator and
readouts from ``solvers.koopman``.

(a) Gain of the power filter on each eigenmode of the actual whitened operator A_w:
    ``||A_w^K v_j|| / ||v_j||`` measured by applying A_w K times (float64; real and imaginary
    parts), against ``|lambda_j|^K`` and App. D.1's tables (K = 2, 4). Also the non-normality
    ``||A_w^K|| / rho(A_w)^K``: eigenmode gains do not bound the filter's gain on other vectors.
(b) Spectral normalisation: ``||A^_w||_2`` and ``||A^_w^K||_2`` after eq. (12) with gamma = 1,
    sigma from 6 power iterations (the paper's) and exact, vs the singular-value gap s_2/s_1;
    Prop. D.2 says <= 1 (it assumes the exact sigma_max). The whitened operators of stationary
    data have sigma_max <~ 1 (eq. (12) is then the identity), so Gaussian operators with
    sigma_max in ~[1, 5] are added.
(c) Ridge readout ``C_v G~^{-1} z^q`` in each precision vs float64 (same rounded inputs), vs eps,
    with the rounding allowance ``c kappa(G~) (r u_acc + u_store)``; here the keys' coordinates
    are scaled over three decades so that G~'s small eigenvalues (~1e-6) meet the eps grid.
"""

from __future__ import annotations

import math
import pathlib

import torch

import solvers.koopman as sk
from analysis.precision import PRECISIONS, by_label, rounding_allowance
from solvers.cholesky import cholesky

from . import _common as C

NAME = "echo_koopman"
HELP = "Echo SKA: power-filter gain per eigenmode (App. D.1) on actual operators, spectral normalisation, readout vs eps"
# a seconds-long run for tests/test_figures.py
TINY = {
    "T": 32,
    "systems": 2,
    "readout_systems": 1,
    "random_operators": 4,
    "eps_grid": [1e-3],
    "queries": 2,
}

F64 = torch.float64
D1_TABLE = {
    2: {0.95: "0.902", 0.90: "0.810", 0.70: "0.490", 0.50: "0.250", 0.30: "0.090"},
    4: {0.95: "0.815", 0.90: "0.656", 0.70: "0.240", 0.50: "0.063", 0.30: "0.008"},
}


def params_for(quick: bool) -> dict:
    return {
        "r": 24,
        "P": 8,
        "T": 256 if quick else 1024,
        "systems": 16 if quick else 64,
        "seed": 0,
        "readout_systems": 4 if quick else 16,
        "random_operators": 64 if quick else 512,
        "eps_grid": [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0],
        "queries": 8,
    }


def make_sequences(params: dict):
    """Keys of a stable linear system with spread-out persistence, and linear values."""
    g = torch.Generator().manual_seed(params["seed"])
    n, T, r, P = params["systems"], params["T"], params["r"], params["P"]
    Q, _ = torch.linalg.qr(torch.randn(n, r, r, generator=g, dtype=F64))
    rho = 0.1 + 0.89 * torch.rand(n, r, generator=g, dtype=F64)
    R = (Q * rho.unsqueeze(-2)) @ Q.mT
    z = torch.zeros(n, T, r, dtype=F64)
    noise = torch.randn(n, T, r, generator=g, dtype=F64)
    z[:, 0] = noise[:, 0]
    for t in range(1, T):
        z[:, t] = (R @ z[:, t - 1].unsqueeze(-1)).squeeze(-1) + 0.3 * noise[:, t]
    W = torch.randn(n, P, r, generator=g, dtype=F64)
    v = z @ W.mT + 0.1 * torch.randn(n, T, P, generator=g, dtype=F64)
    zq = torch.randn(n, params["queries"], r, generator=g, dtype=F64)
    return z, v, zq


def mode_gains(A: torch.Tensor, K: int) -> tuple:
    """(|lambda_j|, ||A^K v_j|| / ||v_j||) for every eigenpair of every system (float64)."""
    lam, V = torch.linalg.eig(A)
    W = V
    for _ in range(K):
        W = A.to(torch.complex128) @ W
    gain = torch.linalg.vector_norm(W, dim=-2) / torch.linalg.vector_norm(V, dim=-2)
    return lam.abs().flatten(), gain.flatten()


def compute(params: dict) -> dict:
    z, v, zq = make_sequences(params)
    st = sk.koopman_statistics(z, v)
    L = cholesky(st.G)
    Aw = sk.whitened_operator(st.M, L)
    gains = {}
    for K in (2, 4):
        lam, gain = mode_gains(Aw, K)
        gains[str(K)] = {"abs_lambda": C.tolist(lam), "gain": C.tolist(gain)}
    rho = torch.linalg.eigvals(Aw).abs().max(-1).values
    nonnormal = {
        str(K): C.tolist(torch.linalg.matrix_norm(torch.linalg.matrix_power(Aw, K), ord=2) / rho**K)
        for K in (2, 4)
    }
    # Whitened operators of stationary data have sigma_max <~ 1, where eq. (12) does nothing;
    # Gaussian operators with sigma_max > 1 exercise it too.
    g = torch.Generator().manual_seed(params["seed"] + 1)
    scale = 1.0 + 4.0 * torch.rand(params["random_operators"], 1, 1, generator=g, dtype=F64)
    rand = torch.randn(params["random_operators"], params["r"], params["r"], generator=g, dtype=F64)
    ops = torch.cat([Aw, rand * scale / math.sqrt(params["r"])])
    s = torch.linalg.svdvals(ops)
    normalisation = {
        "gap": C.tolist(s[:, 1] / s[:, 0]),
        "sigma": C.tolist(s[:, 0]),
        "family": ["whitened"] * Aw.shape[0] + ["gaussian"] * rand.shape[0],
    }
    for how in ("power", "exact"):
        Ah = sk.spectral_normalize(ops, gamma=1.0, sigma=how)
        normalisation[f"norm_{how}"] = C.tolist(torch.linalg.matrix_norm(Ah, ord=2))
        normalisation[f"normK2_{how}"] = C.tolist(torch.linalg.matrix_norm(Ah @ Ah, ord=2))
    readout = {}
    n_r = params["readout_systems"]
    # keys whose coordinates span three decades, so that G~'s small eigenvalues meet eps
    z = z[:n_r] * torch.logspace(0, -3, params["r"], dtype=F64)
    v, zq = v[:n_r], zq[:n_r]
    for eps in params["eps_grid"]:
        for arith in PRECISIONS[1:]:
            zs, vs, qs = z.to(arith.dtype), v.to(arith.dtype), zq.to(arith.dtype)
            ref_stats = sk.koopman_statistics(zs.to(F64), vs.to(F64), eps=eps)
            ref = sk.ridge_readout(ref_stats, qs.to(F64))
            stw = sk.koopman_statistics(zs, vs, eps=eps, bf16_mode=arith.mode)
            y, info = sk.ridge_readout(stw, qs, return_info=True)
            err = torch.linalg.vector_norm(
                (y.to(F64) - ref).flatten(1), dim=-1
            ) / torch.linalg.vector_norm(ref.flatten(1), dim=-1)
            ev = torch.linalg.eigvalsh(ref_stats.G)
            kappa = float((ev[:, -1] / ev[:, 0]).max())
            readout.setdefault(arith.label, []).append(
                {
                    "eps": eps,
                    "max_error": float(err.max()),
                    "median_error": float(err.median()),
                    "kappa_G": kappa,
                    "allowance": rounding_allowance(kappa, params["r"], arith),
                    "status": info.status.name,
                }
            )
    return {
        "gains": gains,
        "nonnormality": nonnormal,
        "normalisation": normalisation,
        "readout": readout,
    }


def paper_rows(data: dict) -> list:
    rows = []
    for K, table in D1_TABLE.items():
        for lam, printed in table.items():
            ours = lam**K
            rows.append(
                C.PaperRow(
                    f"|lambda|^{K} at |lambda| = {lam} (App. D.1)",
                    printed,
                    f"{ours:.4f}",
                    C.rounds_to(ours, printed),
                )
            )
        g = data["gains"][str(K)]
        worst = max(abs(gn - l**K) / l**K for l, gn in zip(g["abs_lambda"], g["gain"]) if l > 0)
        rows.append(
            C.PaperRow(
                f"eigenmode gain ||A_w^{K} v||/||v|| vs |lambda|^{K}, actual operators",
                "equal",
                f"max rel. diff {worst:.1e}",
                worst < 1e-6,
                "float64; the difference is torch.linalg.eig's accuracy (u times eigenvector conditioning)",
            )
        )
        rows.append(
            C.PaperRow(
                f"||A_w^{K}|| / rho(A_w)^{K} (non-normality), max over systems",
                "(not discussed)",
                f"{max(data['nonnormality'][str(K)]):.2f}",
                None,
                "> 1: a non-eigen query can gain more than the table says",
            )
        )
    rows.append(
        C.PaperRow(
            "K = 2 energy at |lambda| = 0.9 (Sec. 5)",
            "81%",
            f"{0.9**2:.0%}",
            True,
            "the 'energy' is |lambda|^K (amplitude^K), as in App. D.1",
        )
    )
    n = data["normalisation"]
    for how in ("power", "exact"):
        worst = max(n[f"norm_{how}"])
        rows.append(
            C.PaperRow(
                f"max ||A^_w|| after eq. (12), sigma by {how}",
                "<= 1 (Prop. D.2)",
                f"{worst:.4f}",
                worst <= 1.0 + 1e-12,
                "6 power iterations underestimate sigma_max" if how == "power" else "float64",
            )
        )
    return rows


def _normalisation_panel(ax, n: dict) -> None:
    """Panel (b): the norm after eq. (12), operators whose power-normalised norm exceeds Prop. D.2's
    bound 1 in their own colour and counted in the legend."""
    over = [(g, v) for g, v in zip(n["gap"], n["norm_power"]) if v > 1.0]
    under = [(g, v) for g, v in zip(n["gap"], n["norm_power"]) if v <= 1.0]
    ax.plot(
        [g for g, _ in under],
        [v for _, v in under],
        "o",
        color="tab:orange",
        ms=4,
        label="||A^_w||, sigma by 6 power its",
    )
    ax.plot(
        [g for g, _ in over],
        [v for _, v in over],
        "o",
        color="tab:red",
        mec="black",
        mew=0.5,
        ms=5,
        label=f"same, > 1 (shaded): breaks Prop. D.2 ({len(over)} of {len(n['gap'])} operators)",
    )
    ax.plot(n["gap"], n["normK2_power"], "x", color="tab:orange", ms=4, label="||A^_w^2||, power")
    ax.plot(n["gap"], n["norm_exact"], "o", color="tab:green", ms=3, label="||A^_w||, exact sigma")
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="Prop. D.2 bound 1")
    if over:
        ax.axhspan(1.0, max(v for _, v in over) * 1.05, color="tab:red", alpha=0.06, lw=0)
    C.finish_axis(
        ax,
        xlabel="singular-value gap s_2 / s_1 of A_w",
        ylabel="spectral norm",
        logy=False,
        legend=False,
        title="(b) spectral normalisation, gamma = 1",
    )
    top, bottom = max([1.0, *n["norm_power"]]), min([*n["normK2_power"], *n["norm_power"]])
    ax.set_ylim(
        top=top + 0.6 * (top - bottom)
    )  # the upper part of the panel holds the legend, above the data
    # one column: two ran past the panel's right edge into panel (c)'s axis label
    ax.legend(fontsize=6, loc="upper left", ncol=1)


def render(out_dir: pathlib.Path, params: dict, data: dict) -> list:
    fig, axes = C.subplots(3, width=4.8)
    fig.set_size_inches(4.8 * 3 + 1.8, 3.6)  # room for panel (c)'s legend beside it
    ax = axes[0][0]
    grid = [i / 200 for i in range(201)]
    for K, col in (("2", "tab:blue"), ("4", "tab:red")):
        g = data["gains"][K]
        ax.plot(
            g["abs_lambda"], g["gain"], ".", color=col, ms=3, alpha=0.5, label=f"measured, K = {K}"
        )
        ax.plot(grid, [x ** int(K) for x in grid], color=col, lw=0.8, label=f"|lambda|^{K}")
        ax.plot(
            list(D1_TABLE[int(K)]),
            [float(p) for p in D1_TABLE[int(K)].values()],
            "s",
            mfc="none",
            color=col,
            ms=7,
            label=f"App. D.1 table, K = {K}",
        )
    C.finish_axis(
        ax,
        xlabel="|lambda_j| of the whitened operator A_w",
        ylabel="gain ||A_w^K v_j|| / ||v_j||",
        logy=False,
        legend_size=6,
        title="(a) power-filter gain per eigenmode",
    )
    ax = axes[0][1]
    n = data["normalisation"]
    _normalisation_panel(ax, n)
    ax = axes[0][2]
    vacuous = []
    for label, rows in data["readout"].items():
        eps = [r["eps"] for r in rows]
        ls = C.PRECISION_STYLES[label]
        col = C.PRECISION_COLORS[label]
        ax.plot(
            eps,
            C.positive([r["max_error"] for r in rows]),
            ls=ls,
            color=col,
            marker="o",
            ms=3,
            label=f"{label} max error",
        )
        allowance = [r["allowance"] if r["allowance"] < 1 else float("nan") for r in rows]
        if any(a == a for a in allowance):  # a legend entry only for a line that is drawn
            ax.plot(eps, allowance, ls=ls, color=col, lw=0.8, alpha=0.7, label=f"{label} allowance")
        if any(a != a for a in allowance):
            vacuous.append(label)
    for u, name in sorted(
        {
            (by_label(lbl).u_store, "bf16" if lbl.startswith("bfloat16") else lbl)
            for lbl in data["readout"]
        }
    ):
        C.rounding_floor(ax, u, f"rounding floor u ({name})")
    if vacuous:
        ax.plot(
            [],
            [],
            " ",
            label="allowance >= 1 (vacuous, not drawn):\n  "
            + ", ".join(
                lbl.replace("bfloat16", "bf16")
                + (
                    " (all eps)"
                    if all(r["allowance"] >= 1 for r in data["readout"][lbl])
                    else " (part)"
                )
                for lbl in vacuous
            ),
        )
    C.finish_axis(
        ax,
        xlabel="ridge eps",
        ylabel="||y - y(float64)|| / ||y(float64)||",
        logx=True,
        legend=False,
        title="(c) ridge readout C_v G~^-1 z^q vs eps",
    )
    ax.legend(
        fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False
    )  # beside: no data hidden
    files = C.save_figure(
        fig,
        out_dir,
        NAME,
        f"Echo SKA: r = {params['r']}, T = {params['T']}, {params['systems']} systems",
    )
    rows = [
        {"panel": "a", "K": K, "abs_lambda": l, "gain": gn, "abs_lambda_K": l ** int(K)}
        for K, g in data["gains"].items()
        for l, gn in zip(g["abs_lambda"], g["gain"])
    ]
    rows += [
        {"panel": "b", "gap": gp, "sigma": s, "norm_power": a, "norm_exact": b, "normK2_power": c}
        for gp, s, a, b, c in zip(
            n["gap"], n["sigma"], n["norm_power"], n["norm_exact"], n["normK2_power"]
        )
    ]
    rows += [
        {"panel": "c", "precision": label, **r} for label, rs in data["readout"].items() for r in rs
    ]
    files += C.write_data(
        out_dir,
        NAME,
        rows,
        {"params": params, "nonnormality": data["nonnormality"]},
        paper_rows(data),
    )
    return files


run = C.figure_runner(__name__)
