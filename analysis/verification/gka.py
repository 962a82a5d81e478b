"""Verification rows for the GKA layer (``solvers.gka``) and its chunkwise Frobenius norm
(``solvers.gka_chunk``), every precision against mpmath (``analysis.gka_reference``).

Family-specific fields (``VerificationRow`` docs give the generic meaning):

* ``gka_layer/<solve>`` (exact Cholesky, Chebyshev r = 10, CG r = 3 < D) on one sequence with
  decay and input gates: forward_error = ``max_t ||y_hat_t - y*_t|| / ||y*_t||``;
  backward_error = ``max_t`` of the solve's normwise backward error against the exact
  ``H_t + lambda_t I``; truncation and rounding are per token over the output's scale
  ``||U_t||_F ||x*_t||``, reported at the token where they are largest relative to their bound:
  truncation against ``1/T_{r+1}(1/rho)`` (Chebyshev) or ``2 sqrt(kappa) R_a^r`` (CG) with
  ``kappa = (1 + a)/a`` (eq. (4)); rounding against ``layer_rounding_bound`` (stored states,
  lambda, the solve's allowance; a worst case that exceeds 1 in bf16 -- then the row only
  documents the measured value). kappa: the largest exact ``kappa_t``.
* ``gka_frobenius/naive`` and ``gka_frobenius/chunk C=3``: ``||H_t||_F`` by the per-token
  recurrence and by eq. (5); forward_error = rounding = ``max_t |f_hat - f*| / f*`` at the worst
  token relative to ``naive_frobenius_bound`` / ``chunk_frobenius_bound`` (over f*); no
  truncation, no backward error (NaN).
"""

from __future__ import annotations

import torch

from analysis import gka_reference as ref
from analysis.precision import PRECISIONS
from analysis.strategies.gka import gka_case
from solvers.gka import gka_layer
from solvers.gka_chunk import chunkwise_frobenius

from .row import VerificationRow

NAN = float("nan")
F64 = torch.float64
VARIANTS = (("exact", None), ("chebyshev", 10), ("cg", 3))  # CG r < D: exact termination would hide truncation
CHUNK = 3


def _worst(measured: torch.Tensor, bound: torch.Tensor) -> tuple:
    """(measured, bound) at the token where measured/bound is largest."""
    t = int(torch.argmax(measured / bound))
    return float(measured[t]), float(bound[t])


def _layer_rows(case, ar, problem: str) -> list:
    D = case.k.shape[-1]
    rows = []
    for solver, iters in VARIANTS:
        y, info = gka_layer(case.q, case.k, case.v, a=case.a, g=case.g, beta=case.beta, solver=solver,
                            iters=iters, bf16_mode=ar.mode, return_info=True)
        truth = ref.layer_truth(case.q, case.k, case.v, a=case.a, g=case.g, beta=case.beta, solver=solver,
                                iters=iters)
        split = truth.split(y)
        rnd, rnd_bound = _worst(split["rounding"], ref.layer_rounding_bound(truth, D, case.a, ar))
        if solver == "exact":
            trc = trc_bound = NAN
        else:
            tb = ref.truncation_bound(solver, ref.ridge_kappa(case.a), iters) * (1 + 4 * 2.0**-53)
            trc, trc_bound = float(split["truncation"].max()), tb
        rows.append(VerificationRow(
            solver=f"gka_layer/{solver}", precision=ar.label, problem=problem, n=D, kappa=float(truth.kappa.max()),
            iters=iters, forward_error=float(split["forward"].max()),
            backward_error=float(truth.backward_errors(info.x, case.q).max()),
            truncation=trc, truncation_bound=trc_bound, rounding=rnd, rounding_bound=rnd_bound,
            notes=f"status {info.status.name}; errors over ||U_t||_F ||x*_t||, worst token vs its bound",
        ))
    return rows


def _frobenius_rows(case, ar, problem: str) -> list:
    D = case.k.shape[-1]
    truth = ref.layer_truth(case.q, case.k, case.v, a=case.a, g=case.g, beta=case.beta)
    exact = truth.fro
    _, info = gka_layer(case.q, case.k, case.v, a=case.a, g=case.g, beta=case.beta, bf16_mode=ar.mode,
                        return_info=True)
    chunk = chunkwise_frobenius(case.k, g=case.g, beta=case.beta, chunk_size=CHUNK, bf16_mode=ar.mode).to(F64)
    bounds = {
        "naive": (info.fro, ref.naive_frobenius_bound(truth.H_abs_fro, exact, D, ar)),
        f"chunk C={CHUNK}": (chunk, ref.chunk_frobenius_bound(truth.H_abs_fro, exact, ref.log_decay_mass(case.g, CHUNK),
                                                              D, CHUNK, ar)),
    }
    rows = []
    for name, (got, bound) in bounds.items():
        err = (got - exact).abs() / exact
        rnd, rnd_bound = _worst(err, bound / exact)
        rows.append(VerificationRow(
            solver=f"gka_frobenius/{name}", precision=ar.label, problem=problem, n=D, kappa=NAN, iters=None,
            forward_error=float(err.max()), backward_error=NAN, truncation=NAN, truncation_bound=NAN,
            rounding=rnd, rounding_bound=rnd_bound,
            notes="||H_t||_F relative error, worst token vs its bound (eq. (5) for the chunked row)",
        ))
    return rows


def rows(quick: bool) -> list:
    T, D, Dv = (6, 4, 3) if quick else (8, 6, 4)
    base = gka_case(T=T, D=D, Dv=Dv, a=0.1, regime="moderate", seed=0)
    problem = f"1 sequence T={T} D={D} Dv={Dv} a=0.1, gates g in [-3,0], beta in [0.2,1]"
    out = []
    for ar in PRECISIONS:
        case = base.to(ar.dtype)
        out += _layer_rows(case, ar, problem)
        out += _frobenius_rows(case, ar, problem)
    return out
