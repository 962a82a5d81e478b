"""Autograd through the fixed-count CG reference past convergence gives finite gradients.

Before the rounding-floor freeze, CG kept stepping after ``||r|| <= u ||q||`` with
``alpha = rr / pHp`` of two underflowing numbers; its derivative ``-rr / pHp^2`` overflowed and
autograd returned NaN gradients (float64 from r = 30, float32 from r = 10 on these problems,
D = 8; found by the Fig. 1b/1d experiment).
"""

import pytest
import torch

import solvers
from analysis.precision import Arith, rounding_allowance


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("iters", [10, 30, 60])
def test_cg_gradients_stay_finite_past_convergence(dtype, iters):
    P = solvers.fig1a_problems(1, 16, 1, 8, seed=1)
    A = P.A.to(dtype).requires_grad_()
    q = P.q.to(dtype).requires_grad_()
    x = solvers.cg(A, q, iters=iters)
    x.sum().backward()
    assert torch.isfinite(A.grad).all() and torch.isfinite(q.grad).all()


def test_frozen_iterate_is_at_working_accuracy():
    """The freeze happens only at the rounding floor: the frozen iterate's forward error is
    within the precision model's rounding allowance c kappa (n u_acc + u_store) for float64
    (kappa <= (1 + a)/a = 51, eq. (4))."""
    P = solvers.fig1a_problems(1, 16, 1, 8, seed=1)
    x, info = solvers.cg(P.A, P.q, iters=60, return_info=True)
    assert info.status == solvers.Status.CONVERGED
    exact = torch.linalg.solve(P.A, P.q)
    rel = torch.linalg.vector_norm(x - exact, dim=-1) / torch.linalg.vector_norm(exact, dim=-1)
    allowance = rounding_allowance(51.0, 8, Arith(torch.float64))
    assert float(rel.max()) <= allowance
