"""Statuses that must not lie, and inputs the working precision cannot hold (review findings):
CG on right-hand sides whose ||q||^2 overflows or underflows, Kaczmarz rows whose norm
overflows, a divergence on q ~ 1e300, GKA's ridge strength outside float32's range, and
second derivatives of the once-differentiable Chebyshev solve."""

import pytest
import torch
from kernel_support import DEVICE

import kernels
import solvers
from solvers import Status

F64 = torch.float64


def spd4():
    """A 4 x 4 SPD matrix with eigenvalues 1..10, a right-hand side and the exact solution."""
    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=F64, generator=g))
    H = Q @ torch.diag(torch.linspace(1, 10, 4, dtype=F64)) @ Q.T
    q = torch.randn(4, dtype=F64, generator=g)
    return H, q, torch.linalg.solve(H, q)


@pytest.mark.parametrize(
    "dtype, factor",
    [(torch.float32, 2.0**67), (torch.float32, 2.0**-84), (F64, 2.0**532), (F64, 2.0**997)],
)
def test_cg_is_right_where_the_squared_norm_of_q_leaves_the_range(dtype, factor):
    # ||f q||^2 overflows (f ~ 1e20, 1e160, 1e300) or underflows (f ~ 5e-26) in the dtype; the old
    # code froze at x = 0 with status CONVERGED (inf <= floor = inf, or 0 <= 0). CG is homogeneous
    # and f is a power of two, so the run on f q is exactly f times the run on q: no tolerance
    H, q, _ = spd4()
    H, q = H.to(dtype), q.to(dtype)
    x, info = solvers.cg(H, q * factor, iters=10, return_info=True)
    assert torch.equal(x / factor, solvers.cg(H, q, iters=10))
    assert info.status == Status.CONVERGED
    assert torch.isfinite(info.residual_norms).all()


def test_cg_scaling_changes_no_rounding():
    # a power-of-two scaling is exact: bitwise the result of the unscaled iteration
    H, q, _ = spd4()
    x1 = solvers.cg(H.float(), q.float(), iters=5)
    x2 = solvers.cg(H.float(), q.float() * 2.0**40, iters=5) / 2.0**40
    assert torch.equal(x1, x2)


def test_cg_overflowing_curvature_is_nonfinite_not_completed():
    H, q, _ = spd4()
    # entries up to 3e38 (finite in float32); q is scaled to max|q| ~ 1, so p^T H p overflows
    H_big = (H / H.abs().max() * 3e38).float()
    _, info = solvers.cg(H_big, q.float(), iters=3, return_info=True)
    assert info.status == Status.NONFINITE


def test_cg_result_is_not_the_callers_x0():
    H, q, _ = spd4()
    x0 = torch.zeros(4, dtype=F64)
    x = solvers.cg(H, q, iters=0, x0=x0)
    x.add_(1.0)
    assert not x0.any()


def test_kaczmarz_row_norm_overflow_is_an_error():
    H, q, _ = spd4()
    with pytest.raises(ValueError, match="squared norm overflows"):
        solvers.kaczmarz(H * 1e200, q * 1e200, sweeps=3)


def test_divergence_is_seen_at_q_1e300():
    H, q, _ = spd4()
    # L = 2 does not enclose the spectrum [1, 10]: the residual grows, at any scale of q
    _, info = solvers.chebyshev(H, q * 1e300, L=2.0, mu=1.0, iters=10, return_info=True)
    assert info.status == Status.DIVERGED
    _, info = solvers.chebyshev(H, q * 1e300, L=10.0, mu=1.0, iters=10, return_info=True)
    assert info.status == Status.COMPLETED and torch.isfinite(info.residual_norms).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gka_ridge_strength_outside_float32_is_an_error():
    q, k, v = torch.randn(3, 1, 8, 4, generator=torch.Generator().manual_seed(1)).unbind(0)
    for a in (1e300, 1e-300):
        with pytest.raises(ValueError, match="rounds to .* in float32"):
            solvers.gka_layer(q, k, v, a=a, solver="chebyshev", iters=3)
        with pytest.raises(ValueError, match="rounds to .* in float32"):
            kernels.gka_layer(q, k, v, a=a, iters=3)
    # float64 holds 1e-300: no error there
    solvers.gka_layer(q.double(), k.double(), v.double(), a=1e-300, solver="exact")


def test_chebyshev_solve_has_no_second_derivative():
    H, q, _ = spd4()
    q = q.clone().requires_grad_()
    H = H.clone().requires_grad_()
    x = solvers.chebyshev_solve(H, q, L=10.0, mu=1.0, iters=5, backward="implicit")
    (g,) = torch.autograd.grad(x.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), q)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_kla_empty_keys_with_normalised_queries_raise_in_reference_and_kernel():
    # d_k = 0: every query has norm 0, so o_t = S_t^T q_t / ||q_t|| is 0/0 (was a silent NaN)
    q, k, v = torch.zeros(1, 5, 1, 0), torch.zeros(1, 5, 1, 0), torch.randn(1, 5, 1, 3)
    for kla in (solvers.kla_recurrent, solvers.kla_chunkwise, kernels.kla_chunkwise):
        kw = {} if kla is solvers.kla_recurrent else {"chunk_size": 16}
        dev = DEVICE if kla is kernels.kla_chunkwise else "cpu"
        with pytest.raises(ValueError, match="query of norm 0"):
            kla(q.to(dev), k.to(dev), v.to(dev), alpha=0.9, eta=1.0, **kw)
