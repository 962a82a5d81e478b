"""Claims run on an implementation under test (``run_claim(..., impl=...)``, ``--impl``) are held
to the same precision contracts and running bounds as ``analysis.testing.harness``.

A claim's own bound in a working precision is the a-priori rounding allowance of the precision
model, which in bf16 is as large as the quantity (an omega_0 = 1 Chebyshev "holds" under it).
For claims listed in :data:`TIGHTER`, a case measured on an implementation under test is held
instead to the smaller of that allowance and the contract's running bound
(``analysis.bounds.contract``) for the precision's contract
(``solvers.contracts.of_reference``). A case where even that bound is at least the quantity
the output approximates (the exact iterate's norm: an output of zeros would pass), or at least
the quantity the claim measures against (relative bound >= 1), is *vacuous*, and a run with
vacuous cases and no failure is reported ``inconclusive``, never ``holds``.
"""

from __future__ import annotations

from typing import Callable

import torch

from .claim import Measurement

INCONCLUSIVE = "inconclusive"


def _alg1_bound(case, precision: str) -> tuple:
    """gka.alg1: Algorithm 1 on GKA's ridge system (eq. (4)): ``(bound, size)``, the contract's
    running bound on ``||xi_hat_r - xi_r||`` and the exact iterate's norm ``||xi_r||``, both
    relative to ``||x*||`` as the claim measures (a bound >= size is vacuous: zeros pass it)."""
    from analysis.bounds.contract import linear_bound
    from solvers import gka_ridge
    from solvers.contracts import of_reference

    from .claims._common import arith

    sysc, r = case
    ar = arith(precision)
    rs = gka_ridge(sysc.H(ar.dtype), sysc.a)
    A, q = rs.A.to(torch.float64), sysc.q_tensor(ar.dtype).to(torch.float64)
    run = linear_bound(
        "chebyshev",
        A,
        q,
        L=float(rs.L),
        mu=float(rs.mu),
        iters=r,
        contract=of_reference(ar.dtype, ar.mode),
    )
    x_star = torch.linalg.solve(A, q)
    n = float(x_star.norm())
    if n == 0:
        return 0.0, 0.0
    return float(run.bound[-1]) / n, float(run.x[-1].norm()) / n


TIGHTER: dict = {"gka.alg1": _alg1_bound}


def tightened(claim, precision: str) -> Callable:
    """``claim.check`` with the contract's running bound where :data:`TIGHTER` has one (working
    precisions only); marks a vacuous bound in the measurement's detail (``"VACUOUS"``): one at
    least 1 (the measure's own scale) or at least the size of what the output approximates."""
    extra = TIGHTER.get(claim.id)

    def check(case, impl, prec):
        m = claim.check(case, impl, prec)
        if extra is None or prec == "mp":
            return m
        bound, size = extra(case, prec)
        b = min(m.bound, bound)
        empty = b >= 1.0 or (b >= size and size > 0)
        detail = f"{m.detail} contract bound {b:.4g}" + (
            f" VACUOUS (>= min(1, ||xi_r||/||x*|| = {size:.4g}))" if empty else ""
        )
        return Measurement(m.value, b, detail.strip())

    return check


def vacuous(m) -> bool:
    return m is not None and "VACUOUS" in (m.detail or "")


__all__ = ["INCONCLUSIVE", "TIGHTER", "tightened", "vacuous"]
