"""Gradient descent and Nesterov's accelerated gradient descent on ``min 1/2 x^T H x - q^T x``.

The baselines of GKA Fig. 1a, "with stepsizes that are optimal for regression problems":

* ``gd``: x_0 = 0, x_{i+1} = x_i - 2/(L + mu) (H x_i - q). Error bound
  ``||x_i - x*|| <= ((kappa - 1)/(kappa + 1))^i ||x*||``.
* ``agd``: Nesterov with step 1/L and constant momentum beta = (sqrt(kappa) - 1)/(sqrt(kappa) + 1):
  x_0 = y_0 = 0, x_{i+1} = y_i - (H y_i - q)/L, y_{i+1} = x_{i+1} + beta (x_{i+1} - x_i).
  Bound (Nesterov 2004, Thm 2.2.3 with f - f* = 1/2 e^T H e):
  ``||x_i - x*|| <= sqrt((kappa + 1) (1 - 1/sqrt(kappa))^i) ||x*||``.
"""

from __future__ import annotations

import torch

from . import validation as check
from .solve_info import Status, build_info, nonfinite_status
from .system import prepare, with_divergence


def _finish(method, sys, x, iterates, return_info):
    """x, or ``(x, SolveInfo)`` with status COMPLETED, NONFINITE or DIVERGED (the final residual
    grew beyond what an SPD H with spectrum in ``[mu, L]`` allows, ``solvers.divergence``)."""
    if not return_info:
        return x
    status = nonfinite_status(x, torch.full(sys.batch, int(Status.COMPLETED), device=x.device))
    return x, with_divergence(
        build_info(sys.H, sys.q, iterates, status, sys.arith.label), sys, method
    )


def gd(H, q, *, L, mu, iters: int, bf16_mode: str = "storage", return_info: bool = False):
    """``iters`` steps of gradient descent with the optimal step 2/(L+mu) from x_0 = 0: GKA Fig. 1a's
    GD baseline, ``x_{i+1} = x_i - 2/(L + mu) (H x_i - q)`` (module docstring)."""
    iters = check.count("iters", iters)
    check.flag("return_info", return_info)
    sys = prepare(H, q, L=L, mu=mu, need_bounds=True, bf16_mode=bf16_mode)
    ar = sys.arith
    step = sys.param(2.0 / (sys.L + sys.mu))
    q_c = ar.up(sys.q)
    x = torch.zeros_like(sys.q)
    iterates = [x]
    for _ in range(iters):
        x = ar.store(ar.up(x) - step * (ar.matvec(sys.H, x) - q_c))
        if return_info:
            iterates.append(x)
    return _finish("gd", sys, x, iterates, return_info)


def agd(H, q, *, L, mu, iters: int, bf16_mode: str = "storage", return_info: bool = False):
    """``iters`` steps of Nesterov's method, step 1/L, momentum (sqrt(kappa)-1)/(sqrt(kappa)+1): GKA
    Fig. 1a's AGD baseline (Nesterov 2004, scheme (2.2.19); module docstring)."""
    iters = check.count("iters", iters)
    check.flag("return_info", return_info)
    sys = prepare(H, q, L=L, mu=mu, need_bounds=True, bf16_mode=bf16_mode)
    ar = sys.arith
    step = sys.param(1.0 / sys.L)
    sk = torch.sqrt(sys.L / sys.mu)
    beta = sys.param((sk - 1.0) / (sk + 1.0))
    q_c = ar.up(sys.q)
    x = torch.zeros_like(sys.q)
    y = x
    iterates = [x]
    for _ in range(iters):
        x_new = ar.store(ar.up(y) - step * (ar.matvec(sys.H, y) - q_c))
        y = ar.store(ar.up(x_new) + beta * (ar.up(x_new) - ar.up(x)))
        x = x_new
        if return_info:
            iterates.append(x)
    return _finish("agd", sys, x, iterates, return_info)
