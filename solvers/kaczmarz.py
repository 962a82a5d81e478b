"""Kaczmarz's row-projection method for ``A x = b`` (KLA eq. (2), ref. [15] of the KLA paper).

One step projects the iterate onto the hyperplane of row ``i``:

    x <- x + omega (b_i - a_i^T x) / (||a_i||^2 + eps) a_i

``omega`` is the relaxation (``0 < omega < 2``: each step is then non-expansive towards every
solution and the method converges for consistent systems) and ``eps >= 0`` the stabiliser of
KLA eq. (3) (``eps = 0``, ``omega = 1``: the exact projection). A *sweep* is ``m`` steps:

* ``order="cyclic"``: rows 0, 1, ..., m-1. One sweep with ``omega = 1``, ``eps = 0`` is
  Gauss-Seidel on ``A A^T y = b - A x`` (x = x + A^T y), i.e. the closed form
  ``x + A^T tril(A A^T)^{-1} (b - A x)``; in general ``x + A^T (D_eps/omega + L)^{-1} (b - A x)``
  with ``D_eps = diag(||a_i||^2 + eps)`` and ``L`` the strict lower part of ``A A^T``.
* ``order="random"``: m rows drawn independently per sweep, row i with probability
  ``||a_i||^2 / ||A||_F^2`` (Strohmer-Vershynin). With ``omega = 1``, ``eps = 0`` and a
  consistent full-column-rank system, ``E||x_k - x*||^2 <= (1 - 1/kappa_F^2)^k ||x_0 - x*||^2``
  after k single-row steps, ``kappa_F = ||A||_F ||A^+||_2``.

Zero rows (``a_i = 0``) with ``eps = 0``: the equation reads ``0 = b_i``. If ``b_i = 0`` every
x satisfies it, the projection is the identity and the row is skipped; if ``b_i != 0`` the
system is inconsistent and a ValueError names A and the row. With ``eps > 0`` a zero row
gives a zero step for any b_i (``0 / eps``), so nothing needs defining.

Rounding model (``solvers._arith``): the row norms ``||a_i||^2 + eps`` are computed once in the
compute dtype; every step computes the residual ``b_i - a_i^T x`` as a dot product in the
compute dtype and stores the new iterate once in the working dtype.

This differs from pyamg's ``kaczmarz_richardson``/``gauss_seidel_ne`` in: batched over leading
dimensions, a relaxation range check, the KLA stabiliser ``eps``, and norm-weighted random
order with a caller-supplied ``torch.Generator``.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from . import validation as check
from ._arith import Arith
from .solve_info import Status, build_info, nonfinite_status

ORDERS = ("cyclic", "random")


def kaczmarz(
    A,
    b,
    *,
    sweeps: int,
    order: str = "cyclic",
    relaxation: float = 1.0,
    eps: float = 0.0,
    x0=None,
    generator: Optional[torch.Generator] = None,
    bf16_mode: str = "storage",
    return_info: bool = False,
):
    """``sweeps`` sweeps of (relaxed, stabilised) Kaczmarz on ``A x = b`` (KLA eqs. (2)-(3)).

    Args:
        A: ``(..., m, n)``, any m, n (square, over- or underdetermined).
        b: ``(..., m)``, same dtype and device; batch dimensions broadcast with A's.
        sweeps: number of sweeps (m row steps each), >= 0.
        order: ``"cyclic"`` or ``"random"`` (rows drawn with probability proportional to
            ``||a_i||^2``, independently for each batch member).
        relaxation: omega, ``0 < omega < 2``.
        eps: stabiliser added to ``||a_i||^2`` (KLA eq. (3)), >= 0.
        x0: start ``(..., n)`` (default zeros), same dtype and device.
        generator: ``torch.Generator`` for ``order="random"`` (None: torch's global
            generator); ignored for cyclic order. The same generator state gives the same rows.
        bf16_mode: ``"storage"`` or ``"strict"``; ignored unless the dtype is bfloat16.
        return_info: also return a :class:`SolveInfo`: ``residual_norms`` ``||b - A x||``
            (float64) after each sweep, ``iterates`` (sweeps + 1), ``rows`` (the row order of
            each sweep, ``(sweeps, *batch, m)``), status COMPLETED or NONFINITE.

    Returns:
        x in A's dtype, or ``(x, info)``.
    """
    A = check.tensor("A", A, min_ndim=2)
    b = check.tensor("b", b, min_ndim=1)
    check.same_kind("b", b, "A", A)
    check.has_values("A", A, "Kaczmarz (its zero-row check)")
    if b.shape[-1] != A.shape[-2]:
        raise ValueError(
            f"b has last dimension {b.shape[-1]} but A has {A.shape[-2]} rows (shape {tuple(A.shape)})"
        )
    sweeps = check.count("sweeps", sweeps)
    check.flag("return_info", return_info)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    relaxation = _relaxation(relaxation)
    eps = _nonnegative("eps", eps)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    check.bf16_mode(bf16_mode)
    m, n = A.shape[-2], A.shape[-1]
    shapes = [A.shape[:-2], b.shape[:-1]]
    if x0 is not None:
        x0 = check.tensor("x0", x0, min_ndim=1)
        check.same_kind("x0", x0, "A", A)
        if x0.shape[-1] != n:
            raise ValueError(f"x0 has last dimension {x0.shape[-1]} but A has {n} columns")
        shapes.append(x0.shape[:-1])
    batch = check.batch_shape("A, b and x0", *shapes)
    A = A.expand(*batch, m, n)
    b = b.expand(*batch, m)
    # A copy, so that even with no step taken the result never aliases the caller's x0.
    x = (
        torch.zeros((*batch, n), dtype=A.dtype, device=A.device)
        if x0 is None
        else x0.expand(*batch, n).clone()
    )

    ar = Arith(A.dtype, bf16_mode)
    denominators, skip = _row_denominators(A, b, eps, ar)
    omega = ar.scalar(relaxation)
    b_c = ar.up(b)
    iterates, orders = [x], []
    for _ in range(sweeps):
        rows = _sweep_rows(A, order, batch, generator)
        for s in range(m):
            x = _project(A, b_c, x, rows[..., s], denominators, skip, omega, ar)
        if return_info:
            iterates.append(x)
            orders.append(rows)
    if not return_info:
        return x
    status = nonfinite_status(x, torch.full(batch, int(Status.COMPLETED), device=x.device))
    rows_hist = torch.stack(orders) if orders else torch.zeros((0, *batch, m), dtype=torch.long)
    return x, build_info(A, b, iterates, status, ar.label, {"rows": rows_hist})


def _relaxation(omega) -> float:
    if isinstance(omega, bool) or not isinstance(omega, numbers.Real):
        raise TypeError(f"relaxation must be a float, got {type(omega).__name__}")
    if not 0.0 < float(omega) < 2.0:
        raise ValueError(
            f"relaxation must satisfy 0 < relaxation < 2, got {omega}: a relaxed projection "
            "x + omega (b_i - a_i^T x)/||a_i||^2 a_i is non-expansive towards the solutions, "
            "and Kaczmarz converges, only for 0 < omega < 2"
        )
    return float(omega)


def _nonnegative(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(v).__name__}")
    if not (float(v) >= 0.0 and float(v) < float("inf")):
        raise ValueError(f"{name} must be a finite float >= 0, got {v}")
    return float(v)


def _row_denominators(A: torch.Tensor, b: torch.Tensor, eps: float, ar: Arith):
    """``||a_i||^2 + eps`` in the compute dtype, and the rows skipped (zero row, b_i = 0)."""
    den = ar.dot(A, A) + ar.scalar(eps)
    if not bool(torch.isfinite(den).all()):  # every step would be a / inf = 0: x stays at 0
        where = _first(~torch.isfinite(den))
        raise ValueError(
            f"A has row {where[-1]} (batch index {where[:-1]}) whose squared norm overflows in "
            f"{ar.compute}: rescale A and b"
        )
    vanishing = den == 0
    if bool(vanishing.any()):
        zero_row = (A == 0).all(dim=-1)
        underflow = vanishing & ~zero_row
        if bool(underflow.any()):
            where = _first(underflow)
            raise ValueError(
                f"A has row {where[-1]} (batch index {where[:-1]}) whose squared norm underflows to 0 "
                f"in {ar.compute}: rescale A or pass eps > 0"
            )
        inconsistent = vanishing & (b != 0)
        if bool(inconsistent.any()):
            where = _first(inconsistent)
            raise ValueError(
                f"A has a zero row (row {where[-1]}, batch index {where[:-1]}) but b[{where[-1]}] = "
                f"{float(b[where])} != 0: the equation 0 = b_i has no solution, the system is "
                "inconsistent and the projection onto that row is undefined (with eps > 0 such rows "
                "give a zero step)"
            )
    return torch.where(vanishing, torch.ones_like(den), den), vanishing


def _first(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0])


def _sweep_rows(A: torch.Tensor, order: str, batch: torch.Size, generator) -> torch.Tensor:
    """Row indices of one sweep, ``(*batch, m)`` (int64)."""
    m = A.shape[-2]
    if order == "cyclic" or m == 0:
        return torch.arange(m, device=A.device).expand(*batch, m)
    # Sampling weights are a choice of the method, not arithmetic of the solve: float64.
    weights = (A.to(torch.float64) ** 2).sum(-1).reshape(-1, m)
    # A batch member with A = 0 has only skipped rows; any distribution will do.
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, torch.ones_like(weights))
    device = generator.device if generator is not None else A.device
    if weights.shape[0] == 0:
        return torch.zeros((*batch, m), dtype=torch.long, device=A.device)
    rows = torch.multinomial(weights.to(device), m, replacement=True, generator=generator)
    return rows.to(A.device).reshape(*batch, m)


def _project(A, b_c, x, rows, denominators, skip, omega, ar: Arith) -> torch.Tensor:
    """One relaxed projection per batch member onto row ``rows`` (KLA eq. (3) with omega = eta)."""
    n = A.shape[-1]
    a = A.gather(-2, rows[..., None, None].expand(*rows.shape, 1, n)).squeeze(-2)
    pick = rows[..., None]
    b_i = b_c.gather(-1, pick).squeeze(-1)
    den = denominators.gather(-1, pick).squeeze(-1)
    skipped = skip.gather(-1, pick).squeeze(-1)
    residual = b_i - ar.dot(a, x)
    coef = torch.where(skipped, torch.zeros_like(residual), omega * residual / den)
    return ar.store(ar.up(x) + coef.unsqueeze(-1) * ar.up(a))
