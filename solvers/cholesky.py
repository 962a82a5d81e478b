"""Batched Cholesky factorisation ``G = L L^T`` and triangular solves, written against Arith.

Echo/SKA factors its regularised Gram matrix ``G~ = L L^T`` (section 3.2.3, Appendix F step 4)
and whitens with forward and back substitution (steps 5, 7, 8). torch has no bfloat16 Cholesky
on the CPU and no strict-bf16 arithmetic at all, so the factorisation and the solves are ours,
so that every precision of ``solvers._arith`` runs the same source line.

Algorithm (left-looking, column by column; Higham, *Accuracy and Stability*, Alg. 10.2 written
for ``L = R^T``)::

    for j = 1..n:
        s_i = g_ij - sum_{k<j} l_ik l_jk          (i = j..n, one matvec)
        l_jj = sqrt(s_j);   l_ij = s_i / l_jj      (i > j)

Only the lower triangle of ``G`` is read. Bounds (exact statements in ``analysis.bounds.cholesky``):

* Cholesky (Higham Thm 10.3): if the factorisation runs to completion, the computed factor
  satisfies ``L L^T = G + dG`` with ``|dG| <= gamma_{n+1} |L| |L^T|``.
* Substitution (Higham Thm 8.5): the computed ``x`` of ``T x = b`` satisfies
  ``(T + dT) x = b`` with ``|dT| <= gamma_n |T|``.

In bf16 storage mode each stored entry adds one rounding of ``u_store`` on top of the fp32
arithmetic (two for the squared diagonal), which ``analysis.bounds.cholesky`` adds to gamma.

Failure and jitter (section 3.2.3: "jittered fallback G + 1e-4 I on failure"): a pivot
``s_j`` that is not positive (or not finite) means the factorisation failed for that system.
Only the failed systems are refactored as ``G + jitter I``, the jitter being added to the
diagonal in the compute dtype (as a kernel that loads G and adds the jitter in registers does;
in strict bf16 the addition is itself rounded, so a jitter below half an ulp of the diagonal
is lost). The outcome is never silent:

* jitter succeeded -> ``Status.JITTERED`` in the info, and a :class:`JitterWarning` when the
  caller did not ask for the info;
* jitter failed too (or ``jitter=0``) -> with ``return_info=True`` the system's status is
  ``Status.BREAKDOWN`` and its factor is NaN from the failed column on (the status says why);
  without the info a :class:`CholeskyError` (a ``ValueError``) names the system and pivot.

This differs from ``torch.linalg.cholesky`` in: the jittered retry; bfloat16 and strict bf16;
a status instead of an exception when ``return_info=True``; ``n = 0`` and empty batches work.
Like it, autograd runs through the factor and the substitutions (they are built out of place).
:func:`cholesky_solve` is the factor-and-solve of GKA's exact layer, on validated inputs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from . import validation as check
from ._arith import Arith
from .solve_info import Status, worst_status

DEFAULT_JITTER = 1e-4  # Echo section 3.2.3


class CholeskyError(ValueError):
    """G is not positive definite in the working precision, even after the jittered retry."""


class JitterWarning(UserWarning):
    """A factorisation succeeded only after adding jitter (the caller did not ask for the info)."""


@dataclass
class CholeskyInfo:
    """What a factorisation reports (``return_info=True``).

    system_status: ``batch``-shaped int tensor of :class:`Status` codes: COMPLETED, JITTERED or
        BREAKDOWN.
    failed_column: ``batch``-shaped int tensor, the first column whose pivot was not positive in
        the unjittered attempt (-1 where there was none).
    pivot_ratio: ``batch``-shaped float64, ``min_j l_jj^2 / g_jj`` of the returned factor (of
        ``G + jitter I`` where jittered; NaN where broken down). Close to 0 means ``G`` is
        numerically singular even when every pivot came out positive.
    jitter: the jitter that was (or would have been) added.
    precision: ``float64``, ``float32``, ``bfloat16/storage`` or ``bfloat16/strict``.
    """

    system_status: torch.Tensor
    failed_column: torch.Tensor
    pivot_ratio: torch.Tensor
    jitter: float
    precision: str

    @property
    def status(self) -> Status:
        return worst_status(self.system_status)


def _factor(ar: Arith, G: torch.Tensor, jitter: float):
    """One attempt: the factor of ``G + jitter I`` and, per system, the first failed column.

    The factor is built out of place, one column appended at a time (never written into), so
    that autograd can run through the factorisation (``solvers.gka``'s exact solve needs it)."""
    n = G.shape[-1]
    batch = G.shape[:-2]
    L = G.new_zeros(*batch, n, 0, dtype=ar.dtype)  # columns 0..j-1 of the factor
    failed = torch.full(batch, -1, dtype=torch.long, device=G.device)
    for j in range(n):
        col = ar.up(G[..., j:, j])
        if jitter:
            col = torch.cat([col[..., :1] + ar.scalar(jitter), col[..., 1:]], dim=-1)
        s = col - ar.matvec(L[..., j:, :], L[..., j, :])
        pivot = s[..., 0]
        bad = ~((pivot > 0) & torch.isfinite(pivot))  # NaN compares False; Inf is an overflow
        failed = torch.where(bad & (failed < 0), torch.full_like(failed, j), failed)
        # A failed system continues on a unit pivot so that no NaN spreads through the batch;
        # its factor is discarded (retried with jitter or marked BREAKDOWN).
        pivot = torch.where(bad, torch.ones_like(pivot), pivot)
        l_jj = ar.store(torch.sqrt(pivot))
        # Dividing by the stored diagonal keeps l_ij l_jj = s_i for the values later solves use.
        below = ar.store(s[..., 1:] / ar.up(l_jj).unsqueeze(-1))
        column = torch.cat(
            [G.new_zeros(*batch, j, dtype=ar.dtype), l_jj.unsqueeze(-1), below], dim=-1
        )
        L = torch.cat([L, column.unsqueeze(-1)], dim=-1)
    return L, failed


def _pivot_ratio(G: torch.Tensor, L: torch.Tensor, jitter: torch.Tensor) -> torch.Tensor:
    n = G.shape[-1]
    if n == 0:
        return torch.ones(G.shape[:-2], dtype=torch.float64, device=G.device)
    d = torch.diagonal(L, dim1=-2, dim2=-1).to(torch.float64) ** 2
    g = torch.diagonal(G, dim1=-2, dim2=-1).to(torch.float64) + jitter.unsqueeze(-1)
    return (d / g).amin(dim=-1)


def cholesky(
    G, *, jitter: float = DEFAULT_JITTER, bf16_mode: str = "storage", return_info: bool = False
):
    """Lower-triangular ``L`` with ``G = L L^T`` (Echo section 3.2.3 / Appendix F step 4).

    Args:
        G: ``(..., n, n)`` symmetric positive definite, float64 / float32 / bfloat16; only its
            lower triangle is read.
        jitter: added to the diagonal of systems whose factorisation fails, once (paper: 1e-4).
            ``0`` disables the retry.
        bf16_mode: ``"storage"`` or ``"strict"``; ignored unless G is bfloat16.
        return_info: also return a :class:`CholeskyInfo`.

    Returns:
        ``L`` in G's dtype, or ``(L, info)``. See the module docstring for how failures are
        reported (JITTERED / BREAKDOWN / :class:`CholeskyError`).
    """
    G = check.square_matrix("G", G)
    check.has_values("G", G, "the Cholesky factorisation (its pivots)")
    check.bf16_mode(bf16_mode)
    check.flag("return_info", return_info)
    jitter = _jitter(jitter)
    ar = Arith(G.dtype, bf16_mode)
    L, failed = _factor(ar, G, 0.0)
    status = torch.where(failed >= 0, int(Status.JITTERED), int(Status.COMPLETED))
    used_jitter = torch.zeros(G.shape[:-2], dtype=torch.float64, device=G.device)
    retry = failed >= 0
    if bool(retry.any()):
        broken = retry.clone()
        if jitter > 0:
            L_j, failed_j = _factor(ar, G[retry], jitter)
            L[retry] = L_j
            used_jitter[retry] = jitter
            broken[retry] = failed_j >= 0
        status = torch.where(broken, int(Status.BREAKDOWN), status)
        if bool(broken.any()):
            if not return_info:
                first = tuple(int(i) for i in broken.nonzero()[0])
                raise CholeskyError(
                    f"G is not positive definite in {ar.label}: system {first} has a non-positive "
                    f"pivot in column {int(failed[first])}"
                    + (
                        f", also after adding jitter {jitter:g} I"
                        if jitter > 0
                        else " (jitter disabled)"
                    )
                )
            L[broken] = _nan_from(L[broken], failed[broken])
        elif not return_info:
            warnings.warn(
                f"Cholesky of G succeeded only after adding jitter {jitter:g} I in "
                f"{int(retry.sum())} system(s) ({ar.label}); pass return_info=True to see which",
                JitterWarning,
                stacklevel=2,
            )
    if not return_info:
        return L
    ratio = _pivot_ratio(G, L, used_jitter)
    info = CholeskyInfo(
        system_status=status,
        failed_column=failed,
        pivot_ratio=ratio,
        jitter=jitter,
        precision=ar.label,
    )
    return L, info


def _nan_from(L: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """Columns ``>= column`` of each (broken) factor set to NaN: the status says why."""
    n = L.shape[-1]
    cols = torch.arange(n, device=L.device)
    mask = (cols >= column.unsqueeze(-1)).unsqueeze(-2).expand_as(L)
    lower = torch.ones(n, n, dtype=torch.bool, device=L.device).tril()
    return torch.where(mask & lower, torch.full_like(L, float("nan")), L)


def _jitter(jitter) -> float:
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)):
        raise TypeError(f"jitter must be a float, got {type(jitter).__name__}")
    if not (jitter >= 0 and jitter != float("inf")):
        raise ValueError(f"jitter must be a finite float >= 0, got {jitter}")
    return float(jitter)


def _triangular(name: str, T, b, *, bf16_mode: str) -> tuple:
    T = check.square_matrix(name, T)
    b = check.rhs("b", b, name, T)
    check.bf16_mode(bf16_mode)
    diag = torch.diagonal(T, dim1=-2, dim2=-1)
    if diag.numel() and bool((diag == 0).any()):
        raise ValueError(
            f"{name} is singular: its diagonal has {int((diag == 0).sum())} zero entries"
        )
    batch = check.batch_shape(f"{name} and b", T.shape[:-2], b.shape[:-1])
    n = T.shape[-1]
    return T.expand(*batch, n, n), b.expand(*batch, n), Arith(T.dtype, bf16_mode)


def solve_lower(L, b, *, bf16_mode: str = "storage"):
    """Forward substitution ``x = L^{-1} b`` for lower-triangular ``L (..., n, n)`` and ``b (..., n)`` (Higham Alg. 8.1).

    ``x_i = (b_i - sum_{j<i} l_ij x_j) / l_ii``; only the lower triangle of L is read. Backward
    error (Higham Thm 8.5): ``(L + dL) x = b``, ``|dL| <= gamma_n |L|``. A zero diagonal entry
    is a ``ValueError`` (L singular).
    """
    L, b, ar = _triangular("L", L, b, bf16_mode=bf16_mode)
    return _forward_substitution(ar, L, b)


def solve_upper(U, b, *, bf16_mode: str = "storage"):
    """Back substitution ``x = U^{-1} b`` for upper-triangular ``U (..., n, n)`` and ``b (..., n)`` (Higham Alg. 8.2).

    ``x_i = (b_i - sum_{j>i} u_ij x_j) / u_ii``, i = n..1; only the upper triangle of U is
    read (pass ``L.mT`` to solve with ``L^T``). Backward error as for forward substitution.
    """
    U, b, ar = _triangular("U", U, b, bf16_mode=bf16_mode)
    return _back_substitution(ar, U, b)


def _forward_substitution(ar: Arith, L: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x = b.new_zeros(
        *b.shape[:-1], 0
    )  # x_1..x_{i-1}, appended to (not written into): autograd runs through
    for i in range(L.shape[-1]):
        s = ar.up(b[..., i]) - ar.dot(L[..., i, :i], x)
        x = torch.cat([x, ar.store(s / ar.up(L[..., i, i])).unsqueeze(-1)], dim=-1)
    return x


def _back_substitution(ar: Arith, U: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x = b.new_zeros(*b.shape[:-1], 0)  # x_{i+1}..x_n, prepended to (not written into)
    for i in reversed(range(U.shape[-1])):
        s = ar.up(b[..., i]) - ar.dot(U[..., i, i + 1 :], x)
        x = torch.cat([ar.store(s / ar.up(U[..., i, i])).unsqueeze(-1), x], dim=-1)
    return x


def cholesky_solve(ar: Arith, A: torch.Tensor, b: torch.Tensor):
    """Solve SPD ``A x = b`` in ``ar``'s arithmetic: :func:`cholesky` without the jittered retry,
    then forward and back substitution (GKA's exact solve, ``solvers.gka``).

    For callers that validated ``A (..., n, n)`` and ``b (..., n)`` (same batch shape)
    themselves: nothing is checked here, and a non-finite intermediate runs on as in a kernel.
    Every entry of L, of the intermediate z and of x is a stored value; autograd runs through.
    Returns ``(x, broke)``: ``broke`` marks systems with a pivot that is not positive (or not
    finite), whose x is NaN.
    """
    L, failed = _factor(ar, A, 0.0)
    broke = failed >= 0
    x = _back_substitution(ar, L.mT, _forward_substitution(ar, L, b))
    return torch.where(broke.unsqueeze(-1), torch.full_like(x, float("nan")), x), broke
