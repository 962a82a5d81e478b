"""Verification rows for Echo / Spectral Koopman Attention: Cholesky, substitution, spectral
normalisation and the SKA readout, every precision against mpmath.

Family-specific fields (``VerificationRow`` docs give the generic meaning):

* ``cholesky``: forward_error ``||L^ - L*||_F / ||L*||_2``; backward_error
  ``||G - L^ L^^T||_2 / ||G||_2``; rounding = the componentwise backward error
  ``max |G - L^ L^^T| / (|L^||L^^T|)`` held to Higham Thm 10.3's ``gamma_{n+1}``
  (``analysis.bounds.cholesky.cholesky_bound``); no truncation (direct method, NaN).
* ``solve_lower``: forward substitution with the Cholesky factor; rounding = componentwise
  backward error held to Higham Thm 8.5's ``gamma_n``.
* ``spectral_normalize``: ``gamma A / max(1, sigma)`` with the 6-step power estimate on a
  matrix with sigma_max > 1; truncation = ``||A'_power - A'_exact|| / ||A'_exact||`` in mpmath
  (bound ``sqrt(1 + tan^2 theta_0 (s2/s1)^24) - 1``); rounding vs the mpmath replay, held to the
  allowance with kappa = 1, n = r (a norm estimate).
* ``ska_readout``: ``eta B_v L A'^K L^{-1} z^q`` (Appendix F); forward_error relative to
  ``||y*||`` (exact sigma); truncation and rounding relative to the a-priori scale
  ``S = |eta| gamma^K ||V|| ||z^q|| / sqrt(lambda_min(G~))`` (``analysis.references.koopman``); rounding
  bound = allowance with ``kappa = (K + 2) kappa(G~)``, ``n = max(T, r)``. reference_size =
  ``max ||y*|| / S``: a bound at or above it (in the S units) allows an error as large as the
  readout itself, so it is vacuous -- then the row only documents the measured value. The truncation is 0: ``||A_w|| < 1`` so eq. (12)
  never rescales the whitened operator (docs/koopman.md).
"""

from __future__ import annotations

import mpmath
import torch

import solvers
from analysis.bounds.cholesky import (
    cholesky_backward_error,
    cholesky_bound,
    substitution_backward_error,
    substitution_bound,
)
from analysis.precision import PRECISIONS, rounding_allowance
from analysis.references import koopman as km
from analysis.references.mp import precision, to_mp
from analysis.testing.strategies.spd import spd_matrix, spectrum

from .row import VerificationRow, status_note

NAN = float("nan")
F64 = torch.float64


def _n2(X: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(X.to(F64), ord=2))


def _cholesky_rows(ar, n: int, kappa: float, seed: int) -> list:
    G = spd_matrix(spectrum(n, kappa, "geometric", seed=seed), seed=seed + 1).to(ar.dtype)
    L, info = solvers.cholesky(G, bf16_mode=ar.mode, return_info=True)
    G64, L64 = G.to(F64), L.to(F64)
    with precision():
        Lm = mpmath.cholesky(to_mp(G64))
        fwd = float(mpmath.norm(to_mp(L64) - Lm) / max(mpmath.svd_r(Lm, compute_uv=False)))
    kap = float(torch.linalg.cond(G64))
    problem = f"spd n={n} kappa={kappa:g}"
    chol = VerificationRow(
        solver="cholesky",
        precision=ar.label,
        problem=problem,
        n=n,
        kappa=kap,
        iters=None,
        forward_error=fwd,
        backward_error=_n2(G64 - L64 @ L64.mT) / _n2(G64),
        truncation=NAN,
        truncation_bound=NAN,
        rounding=cholesky_backward_error(G, L),
        rounding_bound=cholesky_bound(n, ar),
        notes=f"{status_note(info.status)}; rounding = componentwise backward error vs Higham Thm 10.3 gamma_(n+1)",
    )
    b = torch.linspace(-1.0, 1.0, n, dtype=F64).to(ar.dtype)
    x = solvers.solve_lower(L, b, bf16_mode=ar.mode)
    x_star = torch.linalg.solve_triangular(L64, b.to(F64).unsqueeze(-1), upper=False).squeeze(-1)
    resid = float((b.to(F64) - L64 @ x.to(F64)).norm())
    sub = VerificationRow(
        solver="solve_lower",
        precision=ar.label,
        problem=problem + " (its factor)",
        n=n,
        kappa=float(torch.linalg.cond(L64)),
        iters=None,
        forward_error=float((x.to(F64) - x_star).norm() / x_star.norm()),
        backward_error=resid / (_n2(L64) * float(x.to(F64).norm()) + float(b.to(F64).norm())),
        truncation=NAN,
        truncation_bound=NAN,
        rounding=substitution_backward_error(L, x, b, lower=True),
        rounding_bound=substitution_bound(n, ar),
        notes="rounding = componentwise backward error vs Higham Thm 8.5 gamma_n",
    )
    return [chol, sub]


def _spectral_row(ar, r: int = 6, ratio: float = 0.95, gamma: float = 1.2) -> VerificationRow:
    g = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=F64))[0]
    V = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=F64))[0]
    s = 3.0 * ratio ** torch.arange(r, dtype=F64)
    A = ((U * s) @ V.mT).to(ar.dtype)
    Ap = solvers.spectral_normalize(A, gamma=gamma, sigma="power", bf16_mode=ar.mode)
    with precision():
        Am = to_mp(A.to(F64))
        sig_p = km.power_sigma(Am, 6)
        sig_e = km.singular_values(Am)[0][0]
        bound = km.power_ratio_bound(Am, 6)
    A64 = A.to(F64)
    exact = gamma * A64 / max(float(sig_e), 1.0)
    replay = gamma * A64 / max(float(sig_p), 1.0)
    nrm = _n2(exact)
    return VerificationRow(
        solver="spectral_normalize",
        precision=ar.label,
        problem=f"r={r} sigma=3 s2/s1={ratio}",
        n=r,
        kappa=float(s[0] / s[-1]),
        iters=6,
        forward_error=_n2(Ap.to(F64) - exact) / nrm,
        backward_error=NAN,
        truncation=_n2(replay - exact) / nrm,
        truncation_bound=bound - 1,
        rounding=_n2(Ap.to(F64) - replay) / nrm,
        rounding_bound=rounding_allowance(1.0, r, ar),
        notes="6-step power estimate vs exact sigma_max (eq. (12)); truncation bound sqrt(1+tan^2(s2/s1)^24)-1",
        extra={"sigma_power_mp": float(sig_p), "sigma_exact": float(sig_e)},
    )


def _ska_data(T: int, r: int, P: int, Q: int, dyn: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(T, r, generator=g, dtype=F64)
    z = e.clone()
    for t in range(1, T):
        z[t] = dyn * z[t - 1] + e[t]
    z = z * (0.3 + torch.rand(T, 1, generator=g, dtype=F64))
    return z, torch.randn(T, P, generator=g, dtype=F64), torch.randn(Q, r, generator=g, dtype=F64)


def _readout_row(
    ar, T: int, r: int, dyn: float, K: int = 2, eta: float = 1.5, gamma: float = 1.2
) -> VerificationRow:
    z, v, zq = (x.to(ar.dtype) for x in _ska_data(T, r, 3, 4, dyn, seed=T + r))
    stats = solvers.koopman_statistics(z, v, bf16_mode=ar.mode)
    y, info = solvers.koopman_readout(stats, zq, K=K, eta=eta, gamma=gamma, return_info=True)
    ref = km.readout(km.statistics(z, v), zq, v, K=K, eta=eta, gamma=gamma)
    y64 = y.to(F64)
    kappa = (K + 2) * ref.kappa
    y_over_s = float(ref.y_exact.norm(dim=-1).max()) / ref.scale
    return VerificationRow(
        solver="ska_readout",
        precision=ar.label,
        problem=f"{'ar1' if dyn else 'iid'} T={T} r={r} P=3 K={K} gamma={gamma}",
        n=max(T, r),
        kappa=ref.kappa,
        iters=6,
        forward_error=float((y64 - ref.y_exact).norm() / ref.y_exact.norm()),
        backward_error=NAN,
        truncation=float((ref.y_power - ref.y_exact).norm(dim=-1).max()) / ref.scale,
        truncation_bound=ref.power_bound**K - 1,
        rounding=float((y64 - ref.y_power).norm(dim=-1).max()) / ref.scale,
        rounding_bound=rounding_allowance(kappa, max(T, r), ar),
        notes=f"{status_note(info.status)}; errors relative to S = |eta| gamma^K ||V|| ||zq|| / sqrt(lam_min); "
        f"sigma_max(A_w) = {ref.sigma_exact:.4f} < 1 so truncation is 0; allowance kappa = (K+2) kappa(G~)",
        extra={
            "sigma_exact": ref.sigma_exact,
            "sigma_power_mp": ref.sigma_power,
            "y_over_S": y_over_s,
        },
        # errors are over S, not over ||y*||: a bound >= max ||y*|| / S allows an error as large
        # as the readout itself, so it checks nothing (analysis.cli.verdict)
        reference_size=y_over_s,
    )


def rows(quick: bool) -> list:
    """Cholesky / substitution (n = 8, kappa = 10; full: also n = 16, kappa = 100), spectral
    normalisation, and the readout on an AR(1) sequence (kappa(G~) ~ 25) and an i.i.d. one
    (kappa ~ 3; full: also T = 64, r = 8) in every precision."""
    chol = [(8, 10.0)] + ([] if quick else [(16, 100.0)])
    ska = [(24, 6, 0.8), (64, 4, 0.0)] + ([] if quick else [(64, 8, 0.9)])
    out = []
    for ar in PRECISIONS:
        for n, kappa in chol:
            out.extend(_cholesky_rows(ar, n, kappa, seed=n))
        out.append(_spectral_row(ar))
        for T, r, dyn in ska:
            out.append(_readout_row(ar, T, r, dyn))
    return out


__all__ = ["rows"]
