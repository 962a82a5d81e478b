"""The divisors that reversing CG would need (GKA appendix E.1, Remark 2 and Fig. 5b).

GKA reverses Chebyshev through eq. (49), ``xi_{i-2} = (xi_i - A_i xi_{i-1} + c_i q) / b_i``
(sign of ``c_i q`` corrected, docs/errata.md), dividing by ``b_i = -(omega_i - 1)``. The paper
says reversing CG "would need to divide a quantity that is often numerically as small as 1e-3
or as large as 1e10" without naming it. Which quantity depends on the form CG is written in:

* Hestenes-Stiefel form (``solvers.cg``): from ``(x_{i+1}, r_{i+1}, p_{i+1})`` and the scalars,
  ``p_i = (p_{i+1} - r_{i+1}) / beta_i``, then ``r_i = r_{i+1} + alpha_i H p_i`` and
  ``x_i = x_{i+1} - alpha_i p_i``: the divisor is ``beta_i = r_{i+1}^T r_{i+1} / r_i^T r_i``.
* Three-term form, the analogue of GKA eq. (44): substituting ``p_i = r_i + beta_{i-1}
  (x_i - x_{i-1}) / alpha_{i-1}`` into ``x_{i+1} = x_i + alpha_i p_i`` gives

      x_{i+1} = ((1 + m_i) I - alpha_i H) x_i - m_i x_{i-1} + alpha_i q,   m_i = alpha_i beta_{i-1} / alpha_{i-1},

  so reversing it divides by ``b_i^CG = -m_i``; ``m_i`` plays the role of Chebyshev's
  ``omega_i - 1``.

:func:`cg_coefficients` replays ``solvers.cg`` operation for operation (same ``Arith`` calls,
same freezing of converged or broken-down systems, so its iterates equal ``solvers.cg``'s
bit for bit — tests/test_figures.py checks this) and records ``alpha_i``, ``beta_i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solvers._system import prepare


@dataclass
class CGCoefficients:
    """``alpha, beta``: ``(iters, *batch)`` in the compute dtype, NaN where a system was frozen
    (converged to working accuracy or broken down); ``iterates``: ``(iters + 1, *batch, D)``."""

    alpha: torch.Tensor
    beta: torch.Tensor
    iterates: torch.Tensor

    def hs_divisor(self) -> torch.Tensor:
        """``beta_i``, the divisor of the Hestenes-Stiefel reversal, ``(iters, *batch)``."""
        return self.beta

    def three_term_divisor(self) -> torch.Tensor:
        """``m_i = alpha_i beta_{i-1} / alpha_{i-1}`` for i = 1..iters-1, ``(iters - 1, *batch)``."""
        return self.alpha[1:] * self.beta[:-1] / self.alpha[:-1]


def cg_coefficients(H: torch.Tensor, q: torch.Tensor, *, iters: int, bf16_mode: str = "storage") -> CGCoefficients:
    """``solvers.cg(H, q, iters=iters)`` (no tolerance) with its scalars recorded."""
    sys = prepare(H, q, need_bounds=False, bf16_mode=bf16_mode)
    ar = sys.arith
    x = torch.zeros_like(sys.q)
    r = p = sys.q
    rr = ar.dot(r, r)
    done = rr == 0
    floor = (ar.u_acc * torch.sqrt(ar.dot(sys.q, sys.q))) ** 2
    broke = torch.zeros_like(done)
    alphas, betas, iterates = [], [], [x]
    nan = torch.full_like(rr, float("nan"))
    for _ in range(iters):
        Hp = ar.matvec(sys.H, p)
        pHp = ar.dot(p, Hp)
        stalled = ~done & (pHp <= 0)
        done = done | (stalled & (rr <= floor))
        broke = broke | (stalled & (rr > floor))
        active = ~done & ~broke
        alpha = torch.where(active, rr / torch.where(active, pHp, torch.ones_like(pHp)), torch.zeros_like(rr))
        x = ar.store(ar.up(x) + alpha.unsqueeze(-1) * ar.up(p))
        r = ar.store(ar.up(r) - alpha.unsqueeze(-1) * Hp)
        rr_new = ar.dot(r, r)
        beta = torch.where(active, rr_new / torch.where(active, rr, torch.ones_like(rr)), torch.zeros_like(rr))
        p = torch.where(active.unsqueeze(-1), ar.store(ar.up(r) + beta.unsqueeze(-1) * ar.up(p)), p)
        rr = torch.where(active, rr_new, rr)
        done = done | (active & (rr == 0))
        alphas.append(torch.where(active, alpha, nan))
        betas.append(torch.where(active, beta, nan))
        iterates.append(x)
    empty = torch.empty((0, *sys.batch), dtype=rr.dtype)
    return CGCoefficients(torch.stack(alphas) if alphas else empty, torch.stack(betas) if betas else empty,
                          torch.stack(iterates))
