"""What a solve reports besides its solution: a status value and the per-iteration history."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional

import torch


class Status(enum.IntEnum):
    """Outcome of one system's solve. Larger is worse; a batch reports its worst member.

    Each status carries :attr:`advice`: what it means and what to do about it, printed with the
    status by the command lines and the report (``status.explain()``).
    """

    COMPLETED = 0  # a fixed iteration count ran to the end (no tolerance was asked for)
    CONVERGED = 1  # the requested tolerance was met
    JITTERED = 2  # a factorisation failed and succeeded only after adding jitter
    MAX_ITERS_REACHED = 3  # a tolerance was asked for and not met
    BREAKDOWN = 4  # a divisor vanished (e.g. p^T H p = 0 in CG with r != 0)
    # the final residual grew beyond what an SPD H with spectrum in [mu, L] allows, rounding
    # included (Chebyshev, GD, AGD; solvers.divergence): the input broke the method's promise
    DIVERGED = 5
    NONFINITE = 6  # an iterate became non-finite (overflow in low precision)

    @property
    def advice(self) -> str:
        """What this outcome means for the result, and what to do about it."""
        return _ADVICE[self]

    def explain(self) -> str:
        """``NAME: advice``, one line."""
        return f"{self.name}: {self.advice}"

    # Print by name: an IntEnum prints its digit from Python 3.11 on, and "1" tells a reader nothing.
    # int(status) still gives the code (ordering, CSV columns, tensors of codes).
    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(self.name, spec)


_ADVICE = {
    Status.COMPLETED: "the requested number of iterations ran; no tolerance was asked for, so the "
    "accuracy is whatever the method's bound gives at that count (CG: pass rtol= or atol= to have "
    "it checked; Chebyshev, GD and AGD take no tolerance).",
    Status.CONVERGED: "the residual met the requested tolerance.",
    Status.JITTERED: "the matrix was not numerically positive definite in this precision; it was "
    "factorised after adding jitter to its diagonal, so the result solves a perturbed system: use a "
    "higher precision or a larger ridge if that perturbation matters.",
    Status.MAX_ITERS_REACHED: "the tolerance was not met within the iterations allowed: raise iters, "
    "loosen tol, or precondition the system (the rate depends on its condition number).",
    Status.BREAKDOWN: "a divisor vanished (CG: p^T H p <= 0 with a nonzero residual; Cholesky: a "
    "non-positive pivot), so H is not positive definite in this precision: check that H is SPD, or "
    "regularise it.",
    Status.DIVERGED: "the residual grew beyond what an SPD H with spectrum in [mu, L] allows, rounding "
    "included: check that L bounds H's largest eigenvalue and mu its smallest from below, and that H is "
    "symmetric positive definite.",
    Status.NONFINITE: "an iterate overflowed or became NaN, so the result is garbage: check the inputs "
    "for Inf/NaN and their scale, or use a wider precision (float32 instead of bfloat16).",
}
assert set(_ADVICE) == set(Status)


def worst_status(system_status: torch.Tensor) -> Status:
    """The worst per-system status of a batch (COMPLETED for an empty batch).

    ``Status`` is ordered by severity, so this is the maximum code."""
    if system_status.numel() == 0:
        return Status.COMPLETED
    return Status(int(system_status.max()))


@dataclass
class SolveInfo:
    """Per-iteration history of a solve (``return_info=True``).

    residual_norms: ``(iters + 1, *batch)`` float64, ``||q - H x_i||`` of each *stored* iterate,
        measured in float64 so that the measurement adds no rounding of its own.
    iterates: ``(iters + 1, *batch, D)``, the stored iterates x_0 .. x_r in the working dtype
        (Chebyshev: xi_0 .. xi_r; the zero start xi_{-1} is omitted).
    system_status: ``batch``-shaped int tensor of :class:`Status` codes.
    precision: ``float64``, ``float32``, ``bfloat16/storage`` or ``bfloat16/strict``.
    iterations: the number of iterations run.

    Method-specific histories (None where the method has none):

    omegas: Chebyshev's weights ``omega_0 .. omega_r``, ``(*batch, iters + 1)``.
    alphas, betas: CG's step lengths and direction updates, ``(iters, *batch)`` (NaN once frozen).
    rows: Kaczmarz's row order per sweep.
    method, xi_minus1: the Chebyshev backward pass's method and the reversal's recovered start.
    """

    residual_norms: torch.Tensor
    iterates: torch.Tensor
    system_status: torch.Tensor
    precision: str
    iterations: int
    omegas: Optional[torch.Tensor] = None
    alphas: Optional[torch.Tensor] = None
    betas: Optional[torch.Tensor] = None
    rows: Optional[torch.Tensor] = None
    method: Optional[str] = None
    xi_minus1: Optional[torch.Tensor] = None

    @property
    def status(self) -> Status:
        return worst_status(self.system_status)

    @property
    def extras(self) -> dict:
        """The method-specific histories that are set, by name (the older dict view)."""
        return {f: getattr(self, f) for f in HISTORY_FIELDS if getattr(self, f) is not None}


HISTORY_FIELDS = ("omegas", "alphas", "betas", "rows", "method", "xi_minus1")


def norm64(v: torch.Tensor) -> torch.Tensor:
    """``||v||_2`` over the last axis in float64, without overflow or underflow of the sum of
    squares: v is scaled by a power of two (exactly) near its largest entry first, so the norm
    is inf only when the norm itself exceeds float64's range (||q|| of q ~ 1e300 is finite)."""
    v = v.to(torch.float64)
    scale = power_of_two_scale(v)
    return torch.linalg.vector_norm(v / scale.unsqueeze(-1), dim=-1) * scale


def power_of_two_scale(v: torch.Tensor, *, dim=-1, inverse: bool = False) -> torch.Tensor:
    """Per slice along ``dim`` (every entry if ``dim`` is None): ``2^e`` with e the exponent of
    the largest |entry| (``max / 2^e`` in [1/2, 1)), or with ``inverse`` a power of two near
    ``1 / max`` (``max * s`` in [1, 2)) clamped so that it and its inverse are normal in v's dtype;
    1 for a zero, empty or non-finite slice. Scaling by it is exact, so a computation that is
    homogeneous in v (a norm, CG) can run on ``v * s`` without leaving the dtype's range."""
    if dim is None:
        m = v.abs().amax() if v.numel() else v.new_zeros(())
    else:
        m = (
            v.abs().amax(dim=dim)
            if v.shape[dim]
            else torch.zeros(v.shape[:dim] + v.shape[dim:][1:], dtype=v.dtype, device=v.device)
        )
    m = m.to(torch.float64)
    ok = torch.isfinite(m) & (m > 0)
    _, e = torch.frexp(torch.where(ok, m, torch.ones_like(m)))
    e = torch.where(ok, e, torch.zeros_like(e))
    if inverse:
        emax = int(math.log2(torch.finfo(v.dtype).max)) - 1  # 126 (bf16, float32), 1022 (float64)
        e = torch.where(ok, 1 - e, torch.zeros_like(e)).clamp(-emax, emax)
    return torch.ldexp(torch.ones_like(m), e.to(m.dtype)).to(v.dtype)


def residual_norm64(H: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``||q - H x||_2`` evaluated in float64 from the stored values. q and x are scaled by one
    power of two (exact) so that neither ``H x`` nor the sum of squares overflows for large
    inputs: a run on q ~ 1e300 gets finite residual norms, and a divergence is still seen."""
    H64 = H.to(torch.float64)
    q64, x64 = q.to(torch.float64), x.to(torch.float64)  # H may be m x n (Kaczmarz): q, x differ
    scale = torch.maximum(power_of_two_scale(q64), power_of_two_scale(x64)).unsqueeze(-1)
    r = q64 / scale - (H64 @ (x64 / scale).unsqueeze(-1)).squeeze(-1)
    return norm64(r) * scale.squeeze(-1)


def history_residual_norms(
    H: torch.Tensor, q: torch.Tensor, iterates: torch.Tensor
) -> torch.Tensor:
    """:func:`residual_norm64` of each stored iterate ``iterates[i]``, ``(iters + 1, *batch)``.

    One iterate at a time: ``H @ iterates`` in one call would broadcast H along the history
    axis, and matmul materialises that broadcast, ``(iters + 1, *batch, D, D)`` in float64
    (816 GiB for 50 CG steps on GKA Fig. 1a's 131072 systems of D = 128). This way the
    largest temporary is H's float64 copy, and each norm is the same matvec as before.
    """
    H64 = H.to(torch.float64)
    return torch.stack([residual_norm64(H64, q, x) for x in iterates.unbind(0)])


def build_info(
    H: torch.Tensor,
    q: torch.Tensor,
    iterates: list,
    system_status: torch.Tensor,
    precision: str,
    extras: Optional[dict] = None,
) -> SolveInfo:
    stacked = torch.stack(iterates)
    norms = history_residual_norms(H, q, stacked)
    unknown = set(extras or {}) - set(HISTORY_FIELDS)
    if unknown:
        raise ValueError(f"extras: {sorted(unknown)} are not SolveInfo fields {HISTORY_FIELDS}")
    return SolveInfo(
        residual_norms=norms,
        iterates=stacked,
        system_status=system_status,
        precision=precision,
        iterations=len(iterates) - 1,
        **(extras or {}),
    )


def nonfinite_status(x: torch.Tensor, status: torch.Tensor) -> torch.Tensor:
    """Mark systems whose iterate is no longer finite; never silently pass a NaN on."""
    bad = ~torch.isfinite(x).all(dim=-1)
    return torch.where(bad, torch.full_like(status, Status.NONFINITE), status)
