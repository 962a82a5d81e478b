"""Error metrics of an approximate solution ``x`` of ``A x = q`` (docs/precision.md "Metrics").

All metrics are computed in float64 (or mpmath where float64 itself would be too coarse)
from the *stored* values, so that measuring adds no error comparable to what is measured:

* relative forward error ``||x - x*||_2 / ||x*||_2`` against the mpmath solution;
* normwise backward error (Rigal-Gaches; Higham, *Accuracy and Stability*, Thm 7.1)
  ``eta = ||q - A x||_2 / (||A||_2 ||x||_2 + ||q||_2)`` with the spectral norm ``||A||_2``
  (from float64 eigenvalues of the stored, symmetric A) -- the smallest relative perturbation
  of A and q, in the 2-norm, for which x is an exact solution;
* residual norms ``||q - A x||_2``;
* the A-norm error ``||x - x*||_A / ||x*||_A`` in which CG's bound is stated.

The residual is formed in float64 from bf16/fp32 stored values, where every product is
exact (at most 48 significant bits) and only the D-term sum rounds (relative ~D 2^-53);
for float64 inputs, where that sum's rounding is as large as the residual itself, it is
formed exactly in mpmath.
"""

from __future__ import annotations

import mpmath
import torch

from solvers import validation as _v

from . import mp as amp
from .mp import HighPrecision


def _float(name: str, x, *, min_ndim: int = 1, finite: bool = True) -> torch.Tensor:
    """A floating tensor with ``ndim >= min_ndim`` (finite unless ``finite=False``: an iterate
    may have diverged, and measures as such)."""
    return _v.floating(name, x, min_ndim=min_ndim, finite_values=finite)


def _matrix(A) -> torch.Tensor:
    A = _float("A", A, min_ndim=2)
    if A.shape[-1] != A.shape[-2] or A.shape[-1] == 0:
        raise ValueError(f"A must be square (..., D, D) with D >= 1, got shape {tuple(A.shape)}")
    return A


def _vectors(A: torch.Tensor, **named) -> None:
    """Each named vector ``(..., D)`` matches A's D and broadcasts with A's batch."""
    for name, x in named.items():
        if x.shape[-1] != A.shape[-1]:
            raise ValueError(
                f"{name} has last dimension {x.shape[-1]} but A is {A.shape[-2]}x{A.shape[-1]}"
            )
    _v.batch_shape(
        "A and " + ", ".join(named), A.shape[:-2], *(x.shape[:-1] for x in named.values())
    )


def _as_reference(x_star) -> HighPrecision:
    if isinstance(x_star, HighPrecision):
        return x_star
    x_star = _float("x_star", x_star).to(torch.float64)
    return HighPrecision(x_star, torch.zeros_like(x_star))


def relative_forward_error(x: torch.Tensor, x_star) -> torch.Tensor:
    """``||x - x*||_2 / ||x*||_2`` over the last dimension (x* a tensor or a HighPrecision)."""
    ref = _as_reference(x_star)
    x = _float("x", x, finite=False)
    if x.shape[-1] != ref.hi.shape[-1]:
        raise ValueError(f"x has last dimension {x.shape[-1]} but x_star has {ref.hi.shape[-1]}")
    _v.batch_shape("x and x_star", x.shape[:-1], ref.hi.shape[:-1])
    n = ref.norm()
    if bool((n == 0).any()):
        raise ValueError("x_star has a zero vector: the relative error is undefined")
    return ref.distance(x) / n


def a_norm_error(A: torch.Tensor, x: torch.Tensor, x_star) -> torch.Tensor:
    """``||x - x*||_A / ||x*||_A`` for SPD ``A`` (the norm of CG's bound ``2 R_a^i``)."""
    ref = _as_reference(x_star)
    A = _matrix(A)
    x = _float("x", x, finite=False)
    _vectors(A, x=x, x_star=ref.hi)
    A64 = A.to(torch.float64)
    e = ref.difference(x)

    def a_norm(v):
        Av = (A64 @ v.unsqueeze(-1)).squeeze(-1)
        return torch.sqrt(torch.clamp((v * Av).sum(-1), min=0.0))

    return a_norm(e) / a_norm(ref.hi)


def _residual_mp(A: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    batch = torch.broadcast_shapes(A.shape[:-2], q.shape[:-1], x.shape[:-1])
    D = A.shape[-1]
    # Convert each distinct matrix to mpmath once: x often carries an iteration axis in front.
    A_own = A.detach().cpu().to(torch.float64).reshape(-1, D, D)
    own_batch = (1,) * (len(batch) - (A.ndim - 2)) + tuple(A.shape[:-2])
    which = torch.arange(A_own.shape[0]).reshape(own_batch).expand(batch).reshape(-1).tolist()
    qf = q.detach().cpu().to(torch.float64).expand(*batch, D).reshape(-1, D).tolist()
    xf = x.detach().cpu().to(torch.float64).expand(*batch, D).reshape(-1, D).tolist()
    converted = {}
    out = []
    with amp.precision():
        for k, qi, xi in zip(which, qf, xf):
            rows = converted.get(k)
            if rows is None:
                rows = converted[k] = [[mpmath.mpf(a) for a in row] for row in A_own[k].tolist()]
            xm = [mpmath.mpf(v) for v in xi]
            r = [mpmath.mpf(b) - mpmath.fdot(row, xm) for row, b in zip(rows, qi)]
            out.append(float(mpmath.sqrt(mpmath.fdot(r, r))))
    return torch.tensor(out, dtype=torch.float64).reshape(batch)


def residual_norm(A: torch.Tensor, q: torch.Tensor, x: torch.Tensor, *, exact=None) -> torch.Tensor:
    """``||q - A x||_2`` of stored values; ``exact`` (default: when any input is float64)
    forms it in mpmath, otherwise in float64."""
    A = _matrix(A)
    q = _float("q", q)
    x = _float("x", x, finite=False)
    _vectors(A, q=q, x=x)
    if exact is not None and not isinstance(exact, bool):
        raise TypeError(f"exact must be a bool or None, got {type(exact).__name__}")
    if exact is None:
        exact = torch.float64 in (A.dtype, q.dtype, x.dtype)
    if exact:
        return _residual_mp(A, q, x)
    A64, q64, x64 = A.to(torch.float64), q.to(torch.float64), x.to(torch.float64)
    r = q64 - (A64 @ x64.unsqueeze(-1)).squeeze(-1)
    return torch.linalg.vector_norm(r, dim=-1)


def residual_norms(A: torch.Tensor, q: torch.Tensor, iterates: torch.Tensor) -> torch.Tensor:
    """``||q - A x_i||_2`` for iterates ``(iters + 1, *batch, D)`` (float64 arithmetic)."""
    return residual_norm(A, q, iterates, exact=False)


def spectral_norm(A: torch.Tensor) -> torch.Tensor:
    """``||A||_2`` of a symmetric stored matrix, from its float64 eigenvalues."""
    A = _matrix(A)
    return torch.linalg.eigvalsh(A.to(torch.float64)).abs().amax(dim=-1)


def backward_error(
    A: torch.Tensor, q: torch.Tensor, x: torch.Tensor, *, exact=None
) -> torch.Tensor:
    """Normwise backward error ``||q - A x||_2 / (||A||_2 ||x||_2 + ||q||_2)`` (2-norms).

    Broadcasts ``x`` over leading dims, e.g. iterates ``(iters + 1, *batch, D)``.
    """
    r = residual_norm(A, q, x, exact=exact)
    nA = spectral_norm(A)
    nx = torch.linalg.vector_norm(x.to(torch.float64), dim=-1)
    nq = torch.linalg.vector_norm(q.to(torch.float64), dim=-1)
    return r / (nA * nx + nq)


__all__ = [
    "a_norm_error",
    "backward_error",
    "relative_forward_error",
    "residual_norm",
    "residual_norms",
    "spectral_norm",
]
