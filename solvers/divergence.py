"""Status DIVERGED: a residual that grew more than any run on a valid input can make it grow.

Chebyshev (GKA Algorithm 1), GD and AGD take eigenvalue bounds ``[mu, L]`` of an SPD H on
trust: checking them costs O(D^3). On an H that breaks the promise (indefinite, non-symmetric,
spectrum outside ``[mu, L]``) the iteration grows without bound and still "completes". The
final residual, which ``return_info`` measures anyway, tells:

* **Exact arithmetic.** From x_0 = 0 the residual is ``r_i = q - H x_i = p_i(H) q`` with
  ``p_i(0) = 1``; for symmetric H with spectrum in ``[mu, L]``,
  ``||r_i|| <= max_{t in [mu, L]} |p_i(t)| ||q|| <= G ||q||``, with G over all i:
  Chebyshev ``1 / T_{i+1}(1/rho) <= 1`` (the bound of ``solvers.chebyshev``), GD
  ``((kappa - 1)/(kappa + 1))^i <= 1``, AGD ``sqrt(2 (1 - 1/sqrt(kappa))^i) <= sqrt(2)``
  (Nesterov 2004, Thm 2.2.3, applied to the quadratic along one eigenvector of eigenvalue t:
  ``t/2 p_i(t)^2 <= (1 - 1/sqrt(kappa))^i (t + mu)/2``).
* **Rounding.** The computed iterate is off by at most ``A ||x*||``, ``A = c kappa (n u_acc +
  u_store)`` the toolkit's rounding allowance (docs/precision.md, "The rounding allowance",
  c = 8); that moves the residual by at most ``L A ||x*|| <= kappa A ||q||``.

So a run on a valid input ends with ``||r_r|| <= (G + kappa A) ||q||``; beyond that its status
is DIVERGED. It is a detector of impossible growth, not a certificate: COMPLETED does not
prove the input was valid (a wrong H can still shrink the residual), and where ``A >= 1`` (the
allowance asserts nothing, docs/precision.md) the limit is a generous one rather than a bound.
"""

from __future__ import annotations

import math

import torch

from .solve_info import Status, norm64

# Constant c of the rounding allowance c kappa (n u_acc + u_store) (docs/precision.md, "Why c = 8").
ALLOWANCE_C = 8.0

# G: the largest |p_i(t)| over t in [mu, L] and all i of each method's residual polynomial.
RESIDUAL_GROWTH = {"chebyshev": 1.0, "gd": 1.0, "agd": math.sqrt(2.0)}


def divergence_limit(
    method: str, L: torch.Tensor, mu: torch.Tensor, n: int, u_acc: float, u_store: float
) -> torch.Tensor:
    """``G + kappa A``: the largest ``||r_r|| / ||q||`` a valid input allows (module docstring).

    L, mu: float64 per-system bounds; n: the length of the dot products (D)."""
    kappa = L / mu
    return RESIDUAL_GROWTH[method] + kappa * (ALLOWANCE_C * kappa * (n * u_acc + u_store))


def flag_divergence(
    status: torch.Tensor, final_residual: torch.Tensor, q: torch.Tensor, limit: torch.Tensor
) -> torch.Tensor:
    """``status`` raised to DIVERGED where ``||q - H x_r|| > limit ||q||`` (a worse status, such
    as NONFINITE, is kept). Everything stays on the device: no host synchronisation."""
    q_norm = norm64(q)  # no overflow of the sum of squares for q ~ 1e300
    grew = final_residual > limit.to(final_residual.device) * q_norm
    return torch.where(grew, torch.clamp(status, min=int(Status.DIVERGED)), status)
