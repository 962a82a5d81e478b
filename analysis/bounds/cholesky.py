"""Classical rounding bounds for Cholesky and substitution, and their exact measurement.

Bounds (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.):

* Thm 8.5 (substitution): the computed solution of ``T x = b`` satisfies ``(T + dT) x = b``
  with ``|dT| <= gamma_n |T|``.
* Thm 10.3 (Cholesky): if Cholesky runs to completion on ``G``, the computed factor satisfies
  ``L L^T = G + dG`` with ``|dG| <= gamma_{n+1} |L| |L^T|``.

``gamma_k = k u / (1 - k u)`` bounds ``|prod_{i<=k} (1 + delta_i)^{+-1} - 1|`` for ``|delta_i| <= u``.
In bf16 storage mode the arithmetic is fp32 (``u_acc``) and every stored entry is rounded once
more to bf16 (``u_store``): one extra rounding per solution entry, two for the squared Cholesky
diagonal. The bound then is the product form ``(1 + u_acc)^k (1 + u_store)^s - 1`` over
those roundings, taken in the worst direction ``1 / (1 - u)`` so that it is rigorous.

The measured backward errors are evaluated in mpmath from the stored values (exact products,
50-digit sums), so the measurement adds nothing of its own.
"""

from __future__ import annotations

import mpmath
import torch

from analysis.precision import rounding_product
from analysis.references.mp import precision, to_mp
from solvers import Arith
from solvers import validation as _v


def _square(name: str, T) -> torch.Tensor:
    """One system's finite square matrix ``(n, n)``, n >= 1."""
    T = _v.square_matrix(name, T)
    if T.ndim != 2 or T.shape[-1] == 0:
        raise ValueError(f"{name} must be one (n, n) matrix with n >= 1, got {tuple(T.shape)}")
    return T


def _arith(arith) -> Arith:
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be a solvers.Arith, got {type(arith).__name__}")
    return arith


def cholesky_bound(n: int, arith: Arith) -> float:
    """Higham Thm 10.3: ``|G - L L^T| <= gamma_{n+1} |L| |L^T|`` (+2 bf16 stores in storage mode)."""
    return rounding_product(_v.count("n", n, minimum=1) + 1, _arith(arith), 2)


def substitution_bound(n: int, arith: Arith) -> float:
    """Higham Thm 8.5: ``(T + dT) x = b``, ``|dT| <= gamma_n |T|`` (+1 bf16 store in storage mode)."""
    return rounding_product(_v.count("n", n, minimum=1), _arith(arith), 1)


def cholesky_backward_error(G: torch.Tensor, L: torch.Tensor) -> float:
    """``max_ij |G - L L^T|_ij / (|L| |L^T|)_ij`` for one system, in mpmath.

    G's lower triangle is used (mirrored), as the factorisation reads only that. An entry where
    ``(|L||L^T|)_ij = 0`` must match exactly; a mismatch there returns ``inf``.
    """
    G, L = _square("G", G), _square("L", L)
    if G.shape != L.shape:
        raise ValueError(f"G {tuple(G.shape)} and L {tuple(L.shape)} must have the same shape")
    with precision():
        n = G.shape[-1]
        Gm, Lm = to_mp(G.to(torch.float64)), to_mp(L.to(torch.float64))
        worst = mpmath.mpf(0)
        for i in range(n):
            for j in range(i + 1):
                prod = mpmath.fsum(Lm[i, k] * Lm[j, k] for k in range(j + 1))
                scale = mpmath.fsum(abs(Lm[i, k] * Lm[j, k]) for k in range(j + 1))
                diff = abs(Gm[i, j] - prod)
                if scale == 0:
                    if diff != 0:
                        return float("inf")
                    continue
                worst = max(worst, diff / scale)
        return float(worst)


def substitution_backward_error(
    T: torch.Tensor, x: torch.Tensor, b: torch.Tensor, *, lower: bool
) -> float:
    """Componentwise backward error ``max_i |b - T x|_i / (|T| |x|)_i`` (Oettli-Prager, b exact).

    By Thm 8.5 this is <= gamma_n for a computed substitution. ``0/0`` counts as 0, ``r/0`` as inf.
    """
    if not isinstance(lower, bool):
        raise TypeError(f"lower must be a bool, got {type(lower).__name__}")
    T = _square("T", T)
    x, b = _v.tensor("x", x, min_ndim=1), _v.tensor("b", b, min_ndim=1)
    for name, v in (("x", x), ("b", b)):
        if tuple(v.shape) != (T.shape[-1],):
            raise ValueError(f"{name} must have shape ({T.shape[-1]},), got {tuple(v.shape)}")
    with precision():
        n = T.shape[-1]
        Tm, xm, bm = (
            to_mp(T.to(torch.float64)),
            to_mp(x.to(torch.float64)),
            to_mp(b.to(torch.float64)),
        )
        worst = mpmath.mpf(0)
        for i in range(n):
            cols = range(i + 1) if lower else range(i, n)
            r = bm[i] - mpmath.fsum(Tm[i, j] * xm[j] for j in cols)
            scale = mpmath.fsum(abs(Tm[i, j] * xm[j]) for j in cols)
            if scale == 0:
                if r != 0:
                    return float("inf")
                continue
            worst = max(worst, abs(r) / scale)
        return float(worst)
