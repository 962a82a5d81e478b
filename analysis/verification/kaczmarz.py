"""Verification rows for Kaczmarz and KLA (tokenwise and chunkwise), every precision vs mpmath.

Family-specific fields (``VerificationRow`` docs give the generic meaning):

* ``kaczmarz/cyclic``, ``kaczmarz/random``: a consistent *integer* system (A, x* with entries in
  [-3, 3], so b = A x* and the system are exact in every precision -- rounding the inputs never
  makes it inconsistent). forward_error ``||x^ - x*|| / ||x*||``; backward_error normwise
  (``||b - A x^|| / (||A||_2 ||x^|| + ||b||)``); truncation = the mpmath replay (same rows) vs x*,
  bound ``||M^k||_2 ||x*||`` for cyclic order (M the exact sweep operator) and, for random order,
  ``sqrt(E||e_k||^2 / delta)`` with delta = 1e-3 (Markov on the exact expectation, itself below
  Strohmer-Vershynin's ``(1 - 1/kappa_F^2)^k``); rounding = ``||x^ - x_mp|| / ||x*||`` vs the running
  bound ``analysis.bounds.kaczmarz.kaczmarz_rounding_bound``. kappa = sigma_max / sigma_min.
* ``kla/tokenwise``, ``kla/chunkwise``: a KLA sequence (analysis.testing.strategies.kla_case). forward
  error ``max_t ||o^_t - o_t|| / max_t ||o_t||`` against the mpmath replay of Algorithm 1 (left),
  which is exact (a direct method: no truncation). For the chunkwise row, truncation = the
  mpmath chunkwise replay (Props. 3-4) vs the tokenwise one -- an identity, held to the
  double-double resolution 1e-28; rounding = ``max_t ||o^_t - o_mp_t|| / max_t ||o_t||`` vs the
  running bounds ``kla_tokenwise_bound`` / ``kla_chunkwise_bound`` on the same scale, and
  ``extra['max_ratio']`` = running_ratio = ``max_t error_t / bound_t`` (the per-token check: the
  row fails when any token's error exceeds its own bound). kappa: NaN (no linear system);
  n = d_k; iters = T.
"""

from __future__ import annotations

import math

import torch

from analysis.bounds.kaczmarz import (
    cyclic_error_bound,
    kaczmarz_rounding_bound,
    kla_chunkwise_bound,
    kla_tokenwise_bound,
    random_expected_sq_error,
    strohmer_vershynin_rate,
)
from analysis.precision import PRECISIONS
from analysis.references.kaczmarz import kaczmarz_limit, mp_kaczmarz, mp_kla, working_scalar
from analysis.testing.strategies.sequences import kla_case
from solvers import kaczmarz, kla_chunkwise, kla_recurrent

from .row import VerificationRow

F64 = torch.float64
NAN = float("nan")
MARKOV_DELTA = 1e-3


def integer_system(m: int, n: int, seed: int = 0):
    """A full-column-rank integer system with entries in [-3, 3] and its integer solution."""
    g = torch.Generator().manual_seed(seed)
    while True:
        A = torch.randint(-3, 4, (m, n), generator=g).to(F64)
        if int(torch.linalg.matrix_rank(A)) == n and bool(((A * A).sum(-1) > 0).all()):
            break
    x = torch.randint(-3, 4, (n,), generator=g).to(F64)
    return A, x, A @ x


def _kaczmarz_rows(quick: bool) -> list:
    m, n, sweeps = (8, 4, 6) if quick else (12, 6, 12)
    A64, x_star, b64 = integer_system(m, n)
    s = torch.linalg.svdvals(A64)
    kappa = float(s[0] / s[-1])
    norm_x = float(x_star.norm())
    out = []
    for order in ("cyclic", "random"):
        for ar in PRECISIONS:
            A, b = A64.to(ar.dtype), b64.to(ar.dtype)
            x, info = kaczmarz(
                A,
                b,
                sweeps=sweeps,
                order=order,
                generator=torch.Generator().manual_seed(0),
                bf16_mode=ar.mode,
                return_info=True,
            )
            rows = info.rows if order == "random" else None
            replay = mp_kaczmarz(A, b, sweeps=sweeps, rows=rows)
            exact = kaczmarz_limit(A, b)  # = x_star: the stored system is the integer one
            trunc = exact.distance(replay.hi[-1]) / norm_x
            if order == "cyclic":
                t_bound = float(cyclic_error_bound(A64, norm_x, sweeps)[-1]) / norm_x
                t_note = "truncation bound ||M^k||_2 (exact sweep operator)"
            else:
                expected = random_expected_sq_error(A64, x_star, sweeps * m)[-1]
                t_bound = math.sqrt(float(expected) / MARKOV_DELTA) / norm_x
                sv = float(strohmer_vershynin_rate(A64)) ** (sweeps * m)
                t_note = (
                    f"truncation bound sqrt(E||e||^2/{MARKOV_DELTA:g}) (Markov, holds w.p. >= 0.999); "
                    f"E||e_k||^2/||e_0||^2 = {float(expected) / norm_x**2:.2e} <= SV (1-1/kF^2)^k = {sv:.2e}"
                )
            r_bound = (
                float(kaczmarz_rounding_bound(A, b, sweeps=sweeps, rows=rows, arith=ar)[-1])
                / norm_x
            )
            x64 = x.to(F64)
            resid = float((b.to(F64) - A64 @ x64).norm())
            out.append(
                VerificationRow(
                    solver=f"kaczmarz/{order}",
                    precision=ar.label,
                    problem=f"integer consistent {m}x{n}",
                    n=n,
                    kappa=kappa,
                    iters=sweeps,
                    forward_error=float((x64 - x_star).norm()) / norm_x,
                    backward_error=resid / (float(s[0]) * float(x64.norm()) + float(b64.norm())),
                    truncation=float(trunc),
                    truncation_bound=t_bound,
                    rounding=float(replay.distance(x.unsqueeze(0).expand(sweeps + 1, n))[-1])
                    / norm_x,
                    rounding_bound=r_bound,
                    notes=f"{t_note}; rounding bound: running bound, local errors through the later steps' linear parts",
                )
            )
    return out


def _kla_rows(quick: bool) -> list:
    T, C = (12, 5) if quick else (24, 8)
    case = kla_case(
        T, H=2, d_k=6, d_v=4, chunk_size=C, per_channel=not quick, near_zero_keys=1, seed=7
    )
    problem = f"kla T={T} H=2 d_k=6 d_v=4 C={C}" + (" per-channel" if case.per_channel else "")
    # Props. 3-4: the exact chunkwise form against the exact tokenwise one (double-double results)
    mkw = dict(alpha=case.alpha, eta=case.eta, eps=case.eps, initial_state=case.initial_state)
    o_tok, o_chk = (
        mp_kla(case.q, case.k, case.v, **mkw)[0],
        mp_kla(case.q, case.k, case.v, chunk_size=C, **mkw)[0],
    )
    diff = (o_tok.hi - o_chk.hi) + (o_tok.lo - o_chk.lo)
    identity_gap = float(
        torch.linalg.vector_norm(diff, dim=-1).max() / o_tok.norm().max().clamp_min(1e-300)
    )
    out = []
    for form in ("tokenwise", "chunkwise"):
        for ar in PRECISIONS:
            x = case.rounded(ar.dtype)
            kw = case.kwargs(ar.dtype, ar.mode)
            eps = working_scalar(case.eps, ar)
            bkw = dict(
                alpha=x["alpha"], eta=x["eta"], eps=eps, initial_state=x["initial_state"], arith=ar
            )
            if form == "tokenwise":
                o, _ = kla_recurrent(x["q"], x["k"], x["v"], **kw)
                B, _ = kla_tokenwise_bound(x["q"], x["k"], x["v"], **bkw)
            else:
                o, _ = kla_chunkwise(x["q"], x["k"], x["v"], chunk_size=C, **kw)
                B, _ = kla_chunkwise_bound(x["q"], x["k"], x["v"], chunk_size=C, **bkw)
            om, _ = mp_kla(
                x["q"],
                x["k"],
                x["v"],
                alpha=x["alpha"],
                eta=x["eta"],
                eps=eps,
                initial_state=x["initial_state"],
            )
            scale = float(om.norm().max())
            err = om.distance(o)
            max_ratio = float((err / B).max())  # the per-token check
            out.append(
                VerificationRow(
                    solver=f"kla/{form}",
                    precision=ar.label,
                    problem=problem,
                    n=6,
                    kappa=NAN,
                    iters=T,
                    forward_error=float(err.max()) / scale,
                    backward_error=NAN,
                    truncation=0.0 if form == "tokenwise" else identity_gap,
                    truncation_bound=0.0 if form == "tokenwise" else 1e-28,
                    rounding=float(err.max()) / scale,
                    rounding_bound=float(B.max()) / scale,
                    notes=(
                        "exact = mpmath Algorithm 1 (left); "
                        if form == "tokenwise"
                        else "truncation = mp Algorithm 1 right vs left (Props. 3-4, identity); "
                    )
                    + "rounding bound: running bound (docs/kla.md)",
                    # the bound is per token: err_t <= B_t at every t is the check (max err <=
                    # max B is weaker), carried as the row's running check
                    running_bound=float(B.max()) / scale,
                    running_ratio=max_ratio,
                    extra={"max_ratio": max_ratio},
                )
            )
    return out


def rows(quick: bool) -> list:
    return _kaczmarz_rows(quick) + _kla_rows(quick)
