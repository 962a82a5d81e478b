"""GKA Fig. 1b / 1d: relative difference of the gradients of [q_t, k_t] from those of the exact
solver, for CG (1b) and Chebyshev (1d), backward by implicit differentiation (impl) or
torch.autograd (auto), vs the iteration count r, for a single GKA layer.

Layer: ``solvers.gka.gka_layer`` (eq. (CH), lambda_t = a ||H_t||_F, a = 0.02) on
``analysis.testing.strategies.gka.gka_case`` inputs with unit-norm q_t, k_t (as appendix F normalises
them) and a moderate decay gate; loss ``sum_t <dy_t, y_t>`` for a fixed random dy.

* reference: the exact (Cholesky) layer in float64, differentiated by
  ``solvers.gka_grad.gka_autograd_grads`` (the paper's ``torch.linalg.solve``);
* auto: ``torch.autograd`` through ``gka_layer(solver=..., iters=r)`` in the working precision;
* impl (GKA Table 1, Lemma 1): the forward in the working precision gives x_hat_t; the
  backward solves ``dq_t = SOLVER(H_t + lambda_t I, dx_t, r)`` with the same solver and r in
  the working precision, and forms dk by Lemma 1 (``solvers.gka_grad.lemma1_dk``, recursions
  (8)-(9)) with x_hat_t in place of x_t*. The accumulation of dk from the stored dq, x_hat is
  done in float64, so the curve shows the solver's error, not the accumulation's.

Plotted: ``||[dq, dk] - [dq*, dk*]|| / ||[dq*, dk*]||`` (Frobenius over all tokens). A CG
that kept iterating past convergence would give CG (auto) NaN gradients: alpha_i = rr/pHp with
pHp^2 underflowing makes autograd's ``-rr/pHp^2`` infinite and ``inf * 0 = NaN``.
``solvers.cg`` freezes a system once ``||r|| <= u ||q||`` (its rounding floor), so autograd
never differentiates that step; non-finite gradients are still counted (JSON, paper table) and
would show as a gap in the curve. Also measured: Lemma 2, ``||dq_impl - dq_auto|| / ||dq_auto||``.
Paper (Sec. 4.2.3): CG (impl) single layer about 1e-3; CH (impl) and CH (auto) down to about
1e-6, nearly overlapping (Lemma 2: their dq agree exactly in exact arithmetic). The figure's
precision is not stated; float32 is the one whose rounding floor (~1e-6) matches.
"""

from __future__ import annotations

import pathlib

import torch

import solvers
from analysis.precision import PRECISIONS
from analysis.testing.strategies.gka import gka_case
from solvers.gka import gka_layer, run_layer, validate_inputs
from solvers.gka_grad import gka_autograd_grads, lemma1_dk, reverse_decay_sum

from . import _common as C

NAME = "gka_fig1bd"
HELP = "GKA Fig. 1b/1d: gradient of [q, k] vs exact, CG and CH, implicit vs autograd, vs iterations"
# a seconds-long run for tests/test_figures.py
TINY = {
    "T": 4,
    "D": 8,
    "Dv": 4,
    "batch": [1],
    "iters": [2, 6],
    "precisions": ["float64", "float32"],
}

F64 = torch.float64
# autograd through strict bf16 sums is slow; quick mode keeps float64 and float32
PLOTTED = ("float64", "float32", "bfloat16/storage")
MODES = ("impl", "auto")
SOLVER_LABELS = {"cg": "CG", "chebyshev": "CH"}


def params_for(quick: bool) -> dict:
    if quick:
        size = {"T": 12, "D": 32, "Dv": 16, "batch": [1]}
        iters = [2, 5, 10, 15, 20, 30, 40, 50]
    elif C.on_gpu(quick):
        # the token loop is launch-bound on a GPU (T = 256, D = 64 did not finish in 280 s on
        # an H200): the paper's D with a short sequence
        size = {"T": 32, "D": 128, "Dv": 64, "batch": [4]}
        iters = [2, 5, 10, 20, 30, 40, 50]
    else:
        size = {"T": 64, "D": 32, "Dv": 32, "batch": [2]}
        iters = [1, 2, 4, 6, 8, 10, 15, 20, 25, 30, 40, 50]
    precisions = list(PLOTTED[:2]) if quick else list(PLOTTED)
    return {
        **size,
        "iters": iters,
        "a": 0.02,
        "seed": 0,
        "precisions": precisions,
        "device": str(C.device(quick)),
    }


def make_case(params: dict):
    c = gka_case(
        params["T"],
        params["D"],
        params["Dv"],
        a=params["a"],
        regime="moderate",
        batch=tuple(params["batch"]),
        seed=params["seed"],
    )
    unit = lambda x: x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # noqa: E731
    g = torch.Generator().manual_seed(params["seed"] + 7)
    dy = torch.randn(c.v.shape, generator=g, dtype=F64)
    dev = torch.device(params["device"])
    mv = lambda x: None if x is None else x.to(dev)  # noqa: E731
    return mv(unit(c.q)), mv(unit(c.k)), mv(c.v), mv(c.g), mv(c.beta), mv(dy)


def autograd_grads(q, k, v, g, beta, dy, *, a, solver, iters, arith):
    """dq, dk by torch.autograd through the working-precision layer."""
    leaves = [x.detach().to(arith.dtype).requires_grad_(True) for x in (q, k)]
    with torch.enable_grad():
        y = gka_layer(
            leaves[0],
            leaves[1],
            v.to(arith.dtype),
            a=a,
            g=g.to(arith.dtype),
            beta=beta.to(arith.dtype),
            solver=solver,
            iters=iters,
            bf16_mode=arith.mode,
        )
        loss = (y.to(F64) * dy).sum()
        dq, dk = torch.autograd.grad(loss, leaves)
    return dq.to(F64), dk.to(F64)


def implicit_grads(q, k, v, g, beta, dy, *, a, solver, iters, arith):
    """dq, dk by GKA Table 1 with the iterative solver in the backward (module docstring)."""
    inp = validate_inputs(
        q.to(arith.dtype),
        k.to(arith.dtype),
        v.to(arith.dtype),
        g.to(arith.dtype),
        beta.to(arith.dtype),
        a,
    )
    tr = run_layer(inp, arith, solver, iters, keep_states=True)
    D = q.shape[-1]
    dx = arith.store(arith.matvec(tr.U.transpose(-1, -2), dy.to(arith.dtype)))
    lam = arith.up(tr.lam)
    eye = torch.eye(D, dtype=arith.compute, device=q.device)
    A = arith.store(arith.up(tr.H) + lam[..., None, None] * eye)
    if solver == "chebyshev":
        dq = solvers.chebyshev(
            A, dx, L=(tr.fro + tr.lam).to(F64), mu=tr.lam.to(F64), iters=iters, bf16_mode=arith.mode
        )
    else:
        dq = solvers.cg(A, dx, iters=iters, bf16_mode=arith.mode)
    x, H, fro = tr.x.to(F64), tr.H.to(F64), tr.fro.to(F64)
    dq = dq.to(F64)
    gamma = torch.exp(g.to(arith.dtype).to(F64))
    b = beta.to(arith.dtype).to(F64)
    w = 2.0 * a * (x * dq).sum(-1) / fro  # Lemma 1
    dk = lemma1_dk(k.to(arith.dtype).to(F64), dq, x, H, w, gamma=gamma, beta=b)
    Q = reverse_decay_sum(dy.unsqueeze(-1) * x.unsqueeze(-2), gamma)  # value path of dk
    dk = dk + (
        (Q.transpose(-1, -2) @ (b.unsqueeze(-1) * v.to(arith.dtype).to(F64)).unsqueeze(-1)).squeeze(
            -1
        )
    )
    return dq, dk


def relative_difference(dq, dk, ref) -> float:
    num = torch.linalg.vector_norm(torch.cat([(dq - ref.dq).flatten(), (dk - ref.dk).flatten()]))
    den = torch.linalg.vector_norm(torch.cat([ref.dq.flatten(), ref.dk.flatten()]))
    return float(num / den)


def compute(params: dict) -> dict:
    q, k, v, g, beta, dy = make_case(params)
    ref = gka_autograd_grads(q, k, v, dy, a=params["a"], g=g, beta=beta)
    series, lemma2, nonfinite = {}, {}, {}
    for arith in PRECISIONS:
        if arith.label not in params["precisions"]:
            continue
        for solver in SOLVER_LABELS:
            grads = {
                mode: [
                    fn(q, k, v, g, beta, dy, a=params["a"], solver=solver, iters=r, arith=arith)
                    for r in params["iters"]
                ]
                for mode, fn in (("impl", implicit_grads), ("auto", autograd_grads))
            }
            for mode, per_r in grads.items():
                key = f"{solver}|{mode}|{arith.label}"
                series[key] = [relative_difference(dq, dk, ref) for dq, dk in per_r]
                nonfinite[key] = [
                    int((~torch.isfinite(torch.cat([dq.flatten(), dk.flatten()]))).sum())
                    for dq, dk in per_r
                ]
            if solver == "chebyshev":  # Lemma 2: impl and auto give the same dq
                lemma2[arith.label] = [
                    float(torch.linalg.vector_norm(i[0] - a_[0]) / torch.linalg.vector_norm(a_[0]))
                    for i, a_ in zip(grads["impl"], grads["auto"])
                ]
    return {"series": series, "lemma2_dq": lemma2, "nonfinite": nonfinite}


def cg_auto_row(iters: list, nonfinite: list, label: str) -> C.PaperRow:
    """CG (auto)'s non-finite gradient count as a paper row; the note explains what was seen
    (the overflow when there are NaNs, the freeze at the rounding floor that prevents it when
    there are none)."""
    first_bad = next((r for r, n in zip(iters, nonfinite) if n), None)
    if first_bad is None:
        note = (
            "solvers.cg freezes a system at its rounding floor ||r|| <= u ||q||, so autograd "
            "never meets pHp ~ 0"
        )
    else:
        note = "past convergence pHp ~ rr tiny: d(rr/pHp)/dpHp = -rr/pHp^2 overflows, inf * 0 = NaN"
    return C.PaperRow(
        f"CG (auto) non-finite gradients ({label})",
        "(finite curve)",
        "none" if first_bad is None else f"NaN from r = {first_bad}",
        first_bad is None,
        note,
    )


def paper_rows(params: dict, data: dict) -> list:
    s, r = data["series"], params["iters"][-1]
    rows = []
    for label in params["precisions"]:
        rows.append(
            C.PaperRow(
                f"CG (impl) rel. gradient difference, r = {r} ({label})",
                "~1e-3",
                f"{s[f'cg|impl|{label}'][-1]:.1e}",
                None,
                "Fig. 1b, single layer",
            )
        )
        rows.append(cg_auto_row(params["iters"], data["nonfinite"][f"cg|auto|{label}"], label))
        for mode in MODES:
            rows.append(
                C.PaperRow(
                    f"CH ({mode}) rel. gradient difference, r = {r} ({label})",
                    "~1e-6",
                    f"{s[f'chebyshev|{mode}|{label}'][-1]:.1e}",
                    None,
                    "Fig. 1d, single layer",
                )
            )
        l2 = max(data["lemma2_dq"][label])
        rows.append(
            C.PaperRow(
                f"CH dq: impl vs auto, max over r ({label})",
                "equal (Lemma 2)",
                f"{l2:.1e}",
                None,
                "rounding-level agreement expected",
            )
        )
    return rows


def render(out_dir: pathlib.Path, params: dict, data: dict) -> list:
    fig, axes = C.subplots(2, width=5.2)
    its = params["iters"]
    for ax, solver, panel in ((axes[0][0], "cg", "(b)"), (axes[0][1], "chebyshev", "(d)")):
        for label in params["precisions"]:
            for mode, marker in (("impl", "o"), ("auto", "x")):
                ax.plot(
                    its,
                    C.positive(data["series"][f"{solver}|{mode}|{label}"]),
                    ls=C.PRECISION_STYLES[label],
                    marker=marker,
                    ms=4,
                    color="tab:blue" if mode == "impl" else "tab:red",
                    label=f"{SOLVER_LABELS[solver]} ({mode}) {label}",
                )
        C.finish_axis(
            ax,
            xlabel="iterations r",
            ylabel="||d[q,k] - d[q,k]*|| / ||d[q,k]*||",
            legend_size=6,
            title=f"GKA Fig. 1{panel[1]}: {SOLVER_LABELS[solver]} vs exact solver",
        )
    files = C.save_figure(
        fig,
        out_dir,
        NAME,
        f"Single GKA layer, T={params['T']}, D={params['D']}, "
        f"a={params['a']}, batch={params['batch']}",
    )
    rows = [
        {
            "solver": key.split("|")[0],
            "mode": key.split("|")[1],
            "precision": key.split("|")[2],
            "iters": r,
            "relative_difference": v,
        }
        for key, vals in data["series"].items()
        for r, v in zip(its, vals)
    ]
    files += C.write_data(out_dir, NAME, rows, {"params": params}, paper_rows(params, data))
    return files


run = C.figure_runner(__name__)
