"""Conjugate gradient with a fixed iteration count (the setting of GKA Fig. 1 and MesaNet).

Hestenes-Stiefel CG from x_0 = 0:

    r_0 = p_0 = q;  alpha_i = r_i^T r_i / p_i^T H p_i;  x_{i+1} = x_i + alpha_i p_i;
    r_{i+1} = r_i - alpha_i H p_i;  beta_i = r_{i+1}^T r_{i+1} / r_i^T r_i;  p_{i+1} = r_{i+1} + beta_i p_i

Error bound (exact arithmetic): ``||x_i - x*||_H <= 2 R_a^i ||x*||_H``.

With an initial guess ``x0`` (as ``scipy.sparse.linalg.cg``'s), ``x_0 = x0`` and
``r_0 = p_0 = q - H x0``; the bound becomes ``||x_i - x*||_H <= 2 R_a^i ||x0 - x*||_H``.

Options named as in ``scipy.sparse.linalg.cg``: ``x0``, ``rtol``, ``atol`` (the same stopping
test ``||r_i|| <= max(rtol ||q||, atol)``, on the recursive residual and ``||q||``, not
``||r_0||``) and ``callback(xk)``, called after every iteration that updated an iterate, with a
copy of the current iterate, so that for one system it sees exactly the iterates scipy's does.

It differs from scipy's in: the default is a fixed number of iterations with no tolerance (as
in the papers); it solves a batch of systems, a system that meets the tolerance is frozen while
the others go on (``callback`` then sees the whole batch, the frozen systems unchanged);
``q = 0`` and a residual that vanishes to the rounding floor ``||r_i|| <= u ||q||`` freeze that
system (status CONVERGED) instead of dividing two underflowing numbers (which would also give
autograd a NaN gradient); the recursively updated residual r_i is what the method uses, the
history records the true residual.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import validation as check
from .solve_info import Status, build_info, nonfinite_status, power_of_two_scale
from .system import prepare


def cg(
    H,
    q,
    *,
    iters: int,
    rtol: Optional[float] = None,
    atol: float = 0.0,
    x0=None,
    callback: Optional[Callable[[torch.Tensor], object]] = None,
    bf16_mode: str = "storage",
    return_info: bool = False,
):
    """``iters`` steps of CG on ``H x = q`` (Hestenes-Stiefel, module docstring; GKA Fig. 1a's CG
    baseline); optionally stop a system once
    ``||r_i|| <= max(rtol ||q||, atol)`` (recursive residual, as scipy).

    ``x0``: initial guess ``(..., D)`` of H's dtype and device, broadcasting to the systems'
    shape (one guess for all systems, or one each); finite; default zeros. ``callback(xk)``:
    called after each iteration in which some system was still iterating, with a copy of the
    iterates ``(*batch, D)`` (module docstring). Neither input is modified.

    Returns x_iters (or ``(x, info)``; ``info.iterates`` starts at x0; ``info.alphas``,
    ``info.betas`` are ``(iters, *batch)`` in the compute dtype, NaN for the steps of a frozen
    system). Status per system: COMPLETED (no tolerance asked), CONVERGED, MAX_ITERS_REACHED,
    BREAKDOWN (``p^T H p <= 0``: H not positive definite in the working precision) or NONFINITE.
    """
    iters = check.count("iters", iters)
    rtol = check.tolerance("rtol", rtol, allow_none=True)
    atol = check.tolerance("atol", atol)
    check.flag("return_info", return_info)
    if callback is not None and not callable(callback):
        raise TypeError(
            f"callback must be callable (called as callback(xk)) or None, got {type(callback).__name__}"
        )
    sys = prepare(H, q, need_bounds=False, bf16_mode=bf16_mode)
    ar = sys.arith
    Hs = sys.H
    # CG is homogeneous in (q, x): run it on q scaled by a power of two near 1 / max|q| (exact,
    # so every rounding is the unscaled run's) and scale x back. Without this, ||q||^2
    # overflows (q ~ 1e20 in float32) or underflows (q ~ 1e-25) and every system froze at x0
    # with status CONVERGED.
    scale = power_of_two_scale(sys.q, inverse=True).unsqueeze(-1)  # (*batch, 1)
    qs = sys.q * scale
    if x0 is None:
        x = torch.zeros_like(qs)
        r = qs
    else:
        x = initial_guess(x0, sys.q, H) * scale  # a new tensor: never the caller's x0
        r = ar.store(ar.up(qs) - ar.matvec(Hs, x))
    p = r
    rr = ar.dot(r, r)
    use_tol = rtol is not None or atol > 0
    threshold = torch.maximum(
        float(rtol or 0.0) * torch.sqrt(ar.dot(qs, qs)), float(atol) * scale.squeeze(-1)
    )
    # The rounding floor ||r|| <= u ||q||: below it p^T H p can underflow to 0 (convergence
    # to working accuracy, not a breakdown), and a fixed-count run freezes there, because
    # further steps only add noise and alpha = rr / pHp of two tiny numbers would make
    # autograd through the loop overflow to inf * 0 = NaN.
    floor = (ar.u_acc * torch.sqrt(ar.dot(qs, qs))) ** 2
    done = rr <= threshold**2 if use_tol else rr <= floor
    broke = torch.zeros_like(done)
    overflow = torch.zeros_like(done)  # p^T H p not finite: H too large for the working precision
    iterates, alphas, betas = [x / scale], [], []
    nan = torch.full_like(rr, float("nan"))
    for _ in range(iters):
        Hp = ar.matvec(Hs, p)
        pHp = ar.dot(p, Hp)
        stalled = ~done & (pHp <= 0)
        done = done | (stalled & (rr <= floor))
        broke = broke | (stalled & (rr > floor))
        overflow = overflow | (~done & ~broke & ~torch.isfinite(pHp))
        active = ~done & ~broke & ~overflow
        # A frozen system gets alpha = 0 and keeps its iterate: no 0/0 ever reaches a NaN.
        alpha = torch.where(
            active, rr / torch.where(active, pHp, torch.ones_like(pHp)), torch.zeros_like(rr)
        )
        a = alpha.unsqueeze(-1)
        x = ar.store(ar.up(x) + a * ar.up(p))
        r = ar.store(ar.up(r) - a * Hp)
        rr_new = ar.dot(r, r)
        beta = torch.where(
            active, rr_new / torch.where(active, rr, torch.ones_like(rr)), torch.zeros_like(rr)
        )
        p = torch.where(active.unsqueeze(-1), ar.store(ar.up(r) + beta.unsqueeze(-1) * ar.up(p)), p)
        rr = torch.where(active, rr_new, rr)
        done = done | (active & (rr <= (threshold**2 if use_tol else floor)))
        if callback is not None and bool(active.any()):
            callback((x / scale).detach())
        if return_info:
            iterates.append(x / scale)
            alphas.append(torch.where(active, alpha, nan))
            betas.append(torch.where(active, beta, nan))
    x = x / scale
    if not return_info:
        return x
    status = torch.full(
        sys.batch, int(Status.MAX_ITERS_REACHED if use_tol else Status.COMPLETED), device=x.device
    )
    status = torch.where(done, torch.full_like(status, Status.CONVERGED), status)
    status = torch.where(broke, torch.full_like(status, Status.BREAKDOWN), status)
    status = torch.where(overflow, torch.full_like(status, Status.NONFINITE), status)
    status = nonfinite_status(x, status)
    empty = torch.empty((0, *sys.batch), dtype=rr.dtype, device=rr.device)
    scalars = {
        "alphas": torch.stack(alphas) if alphas else empty,
        "betas": torch.stack(betas) if betas else empty,
    }
    return x, build_info(Hs, sys.q, iterates, status, ar.label, scalars)


def initial_guess(x0, q: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
    """``x0`` checked (a finite tensor of H's dtype and device whose shape broadcasts to the
    systems' ``q.shape``) and expanded to it; a view, never written."""
    x0 = check.rhs("x0", x0, "H", H)
    try:
        shape = torch.broadcast_shapes(x0.shape, q.shape)
    except RuntimeError:
        shape = None
    if shape != q.shape:
        raise ValueError(
            f"x0 has shape {tuple(x0.shape)}, which does not broadcast to the systems' shape "
            f"{tuple(q.shape)} (batch and D of H and q)"
        )
    return x0.expand(q.shape)
