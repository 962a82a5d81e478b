"""Chebyshev iteration, GKA Algorithm 1.

Solves ``H xi = q`` for SPD ``H`` whose spectrum lies in ``[mu, L]``:

    rho = (L - mu) / (L + mu),  omega_0 = 2,  xi_{-1} = 0,  xi_0 = 2 q / (L + mu)
    for i = 1..r:
        omega_i = 4 / (4 - rho^2 omega_{i-1})                          (weight schedule)
        xi_i = xi_{i-1} - 2 omega_i / (L + mu) (H xi_{i-1} - q)           (grad descent)
                + (omega_i - 1) (xi_{i-1} - xi_{i-2})                       (momentum)

``xi_i`` is the Chebyshev iterate of polynomial degree ``i + 1``: its error satisfies
``||xi_i - x*|| <= ||x*|| / T_{i+1}(1/rho) <= 2 R_a^{i+1} ||x*||`` with
``R_a = (sqrt(kappa) - 1) / (sqrt(kappa) + 1)``, ``kappa = L / mu`` (``analysis.bounds``).

Differences from the printed algorithm, all rounding-only: the two assignments to xi_i are
fused and stored once (a kernel never stores the intermediate); ``rho``, ``2/(L+mu)`` are
computed in float64 and rounded once to the compute dtype.
"""

from __future__ import annotations

import torch

from . import validation as check
from .solve_info import Status, build_info, nonfinite_status
from .system import System, prepare, with_divergence


def omega_schedule(rho2: torch.Tensor, iters: int) -> torch.Tensor:
    """GKA Algorithm 1's weights from ``rho^2``: omega_0 = 2, omega_i = 4 / (4 - rho^2 omega_{i-1}),
    evaluated in ``rho2``'s dtype; shape ``(*rho2.shape, iters + 1)``.

    The one definition of the recurrence, unchecked: for callers that validated L and mu already
    (:func:`chebyshev_weights`, the solver's own steps, the kernels' host-side copies of the
    schedule). Users call :func:`chebyshev_weights`.
    """
    omegas = [torch.full_like(rho2, 2.0)]
    for _ in range(iters):
        omegas.append(4.0 / (4.0 - rho2 * omegas[-1]))
    return torch.stack(omegas, dim=-1)


def chebyshev_weights(L, mu, iters: int, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The weight schedule omega_0 .. omega_r of GKA Algorithm 1, shape ``(*batch, iters + 1)``.

    omega_0 = 2 and omega_i = 4 / (4 - rho^2 omega_{i-1}). By GKA Lemma 3,
    ``2 = omega_0 >= ... >= omega_r > omega_1* = 2 (1 - sqrt(1 - rho^2)) / rho^2``.
    ``L`` and ``mu`` are floats or tensors (broadcast together); ``L == mu`` gives all ones
    after omega_0.
    """
    iters = check.count("iters", iters)
    Lt = torch.as_tensor(L, dtype=torch.float64) if not isinstance(L, torch.Tensor) else L
    mt = torch.as_tensor(mu, dtype=torch.float64) if not isinstance(mu, torch.Tensor) else mu
    batch = check.batch_shape("L and mu", Lt.shape, mt.shape)
    Lt = check.parameter("L", Lt, batch, Lt.device)
    mt = check.parameter("mu", mt, batch, Lt.device)
    check.spectrum_bounds(Lt, mt)
    return omega_schedule((((Lt - mt) / (Lt + mt)) ** 2).to(dtype), iters)


def chebyshev(H, q, *, L, mu, iters: int, bf16_mode: str = "storage", return_info: bool = False):
    """r iterations of Chebyshev iteration on ``H xi = q`` (GKA Algorithm 1).

    Args:
        H: ``(..., D, D)`` symmetric positive definite, float64 / float32 / bfloat16.
        q: ``(..., D)``, same dtype and device; batch dimensions broadcast with H's.
        L, mu: eigenvalue bounds ``L >= mu > 0``, floats or tensors broadcast over the batch.
        iters: r >= 0; ``iters = 0`` returns xi_0 = 2q/(L+mu).
        bf16_mode: ``"storage"`` or ``"strict"`` (see ``solvers._arith``); ignored unless bf16.
        return_info: also return a :class:`SolveInfo` with residual norms, iterates xi_0..xi_r
            and ``omegas`` (omega_0..omega_r as computed in the working precision). Status:
            COMPLETED, NONFINITE, or DIVERGED when the final residual grew beyond what an SPD H
            with spectrum in ``[mu, L]`` allows (``solvers.divergence``: H broke the promise).

    Returns:
        xi_r in H's dtype, or ``(xi_r, info)``.
    """
    iters = check.count("iters", iters)
    check.flag("return_info", return_info)
    sys = prepare(H, q, L=L, mu=mu, need_bounds=True, bf16_mode=bf16_mode)
    iterates, omegas = [], []
    for omega, _, xi in chebyshev_steps(sys, iters):
        if return_info:
            iterates.append(xi)
            omegas.append(omega)
    if not return_info:
        return xi
    status = nonfinite_status(xi, torch.full(sys.batch, int(Status.COMPLETED), device=xi.device))
    info = build_info(
        sys.H, sys.q, iterates, status, sys.arith.label, {"omegas": torch.stack(omegas, dim=-1)}
    )
    return xi, with_divergence(info, sys, "chebyshev")


def chebyshev_steps(sys: System, iters: int):
    """GKA Algorithm 1 on a prepared system, one step at a time (shared with the reverse
    methods of ``solvers.chebyshev_backward``, which keep only the last two iterates).

    Yields ``(omega_i, xi_{i-1}, xi_i)`` for i = 0..iters, the iterates as stored and omega_i in
    the compute dtype (``omega_0 = 2``, ``xi_{-1} = 0``).
    """
    ar = sys.arith
    q_c = ar.up(sys.q)
    step = sys.param(2.0 / (sys.L + sys.mu))
    omegas = omega_schedule(ar.scalar(((sys.L - sys.mu) / (sys.L + sys.mu)) ** 2), iters)
    xi_prev = torch.zeros_like(sys.q)
    xi = ar.store(step * q_c)
    yield omegas[..., 0], xi_prev, xi
    for i in range(1, iters + 1):
        omega = omegas[..., i]
        w = omega.unsqueeze(-1)
        grad = ar.matvec(sys.H, xi) - q_c
        xi_new = ar.up(xi) - (w * step) * grad + (w - 1.0) * (ar.up(xi) - ar.up(xi_prev))
        xi_prev, xi = xi, ar.store(xi_new)
        yield omega, xi_prev, xi
