"""Status never says COMPLETED when the result is garbage: Chebyshev, GD and AGD (references
and kernels) report DIVERGED when the final residual exceeds ``(G + kappa A) ||q||``, what an
SPD H with spectrum in [mu, L] allows with rounding included (solvers.divergence), and never
on such an H."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from kernel_support import DEVICE, needs_triton_device, poisoned_outputs  # noqa: F401 - autouse fixture

import kernels
import solvers
from analysis.precision import PRECISIONS
from analysis.references.chebyshev_backward import spd_problem
from solvers import Status
from solvers.divergence import divergence_limit, flag_divergence

METHODS = ("chebyshev", "gd", "agd")
IDS = [a.label for a in PRECISIONS]
D, ITERS, L, MU = 8, 30, 1.0, 0.1


def _broken_promise(kind: str):
    """float64 systems whose H breaks the promise 'SPD with spectrum in [mu, L] = [0.1, 1]':
    ``indefinite``: symmetric, eigenvalues from -0.5 to 1; ``nonsymmetric``: eigenvalues in
    [0.1, 1] plus a skew part of norm 2 (complex eigenvalues far outside the interval)."""
    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    lo = -0.5 if kind == "indefinite" else MU
    H = (Q * torch.linspace(lo, L, D, dtype=torch.float64)) @ Q.T
    if kind == "nonsymmetric":
        S = torch.randn(D, D, generator=g, dtype=torch.float64)
        S = S - S.T
        H = H + 2.0 * S / torch.linalg.matrix_norm(S, ord=2)
    return (H + H.T) / 2 if kind == "indefinite" else H, torch.randn(
        D, generator=g, dtype=torch.float64
    )


@pytest.mark.parametrize("kind", ["indefinite", "nonsymmetric"])
@pytest.mark.parametrize("ar", PRECISIONS, ids=IDS)
@pytest.mark.parametrize("method", METHODS)
def test_reference_reports_divergence(method, ar, kind):
    """The residual grows from ~3 to 1e8..1e11 in 30 iterations (it used to say COMPLETED)."""
    H, q = _broken_promise(kind)
    solve = getattr(solvers, method)
    x, info = solve(
        H.to(ar.dtype), q.to(ar.dtype), L=L, mu=MU, iters=ITERS, bf16_mode=ar.mode, return_info=True
    )
    assert info.status in (Status.DIVERGED, Status.NONFINITE)
    assert info.status == Status.DIVERGED or not torch.isfinite(x).all()


@needs_triton_device
@pytest.mark.parametrize("kind", ["indefinite", "nonsymmetric"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
def test_kernel_reports_divergence(method, dtype, kind):
    H, q = _broken_promise(kind)
    _, info = getattr(kernels, method)(
        H.to(DEVICE, dtype), q.to(DEVICE, dtype), L=L, mu=MU, iters=ITERS, return_info=True
    )
    assert info.status == Status.DIVERGED


@needs_triton_device
@pytest.mark.parametrize("method", METHODS)
def test_kernel_flags_only_the_diverging_system_of_a_batch(method):
    """Per-system status: a valid system next to an indefinite one stays COMPLETED."""
    H_bad, q = _broken_promise("indefinite")
    pb = spd_problem(D, 10.0, torch.float64, seed=1)
    H = torch.stack([H_bad, pb.H / pb.L]).float()  # the valid one: spectrum in [0.1, 1]
    _, info = getattr(kernels, method)(
        H.to(DEVICE), q.expand(2, D).float().to(DEVICE), L=L, mu=MU, iters=ITERS, return_info=True
    )
    assert info.system_status.tolist() == [int(Status.DIVERGED), int(Status.COMPLETED)]
    assert info.status == Status.DIVERGED


@given(
    method=st.sampled_from(METHODS),
    ar=st.sampled_from(PRECISIONS),
    dim=st.integers(1, 12),
    kappa=st.floats(1.5, 1e3),
    iters=st.integers(0, 40),
    seed=st.integers(0, 2**16),
)
def test_no_divergence_reported_on_a_valid_input(method, ar, dim, kappa, iters, seed):
    """SPD with eigenvalues spanning [mu, L] (both ends hit), every precision: never DIVERGED.
    Measured ||r_r|| / (limit ||q||) over 1500 random such runs (D <= 16, kappa <= 1e3, r <= 40):
    at most 1 - 2e-14 (GD at r = 0, where r_0 = q exactly and G = 1 is attained); 0.84
    Chebyshev, 0.71 AGD (1/sqrt 2 at r = 0); in bf16 at most 0.61 (storage), 0.22 (strict)."""
    try:
        pb = spd_problem(dim, kappa, ar.dtype, seed)
    except ValueError:  # bf16 rounding made H indefinite: not a valid input
        assume(False)
    _, info = getattr(solvers, method)(
        pb.H, pb.q, L=pb.L, mu=pb.mu, iters=iters, bf16_mode=ar.mode, return_info=True
    )
    assert info.status == Status.COMPLETED


@needs_triton_device
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
def test_kernel_reports_completed_on_gka_problems(method, dtype):
    """GKA's Fig. 1a problems (a = 0.02, kappa <= 51): COMPLETED, as the reference."""
    P = solvers.fig1a_problems(B=1, T=4, heads=1, D=16).to(dtype)
    _, info = getattr(kernels, method)(
        P.A.to(DEVICE), P.q.to(DEVICE), L=P.L, mu=P.mu, iters=ITERS, return_info=True
    )
    _, ref = getattr(solvers, method)(P.A, P.q, L=P.L, mu=P.mu, iters=ITERS, return_info=True)
    assert info.status == ref.status == Status.COMPLETED


def test_the_limit_is_where_the_flag_goes_up():
    """Flagged just above ``limit ||q||``, not at or below it; a worse status (NONFINITE) is kept."""
    Lt, mt = torch.tensor([2.0, 2.0, 2.0]), torch.tensor([1.0, 1.0, 1.0])
    limit = divergence_limit("agd", Lt.double(), mt.double(), 4, 2.0**-24, 2.0**-24)
    q = torch.tensor([[3.0, 4.0, 0.0, 0.0]] * 3, dtype=torch.float64)  # ||q|| = 5
    final = 5 * limit * torch.tensor([1 - 1e-12, 1 + 1e-12, 1 + 1e-12], dtype=torch.float64)
    status = torch.tensor([Status.COMPLETED, Status.COMPLETED, Status.NONFINITE])
    out = flag_divergence(status, final, q, limit)
    assert out.tolist() == [int(Status.COMPLETED), int(Status.DIVERGED), int(Status.NONFINITE)]
    # G = sqrt(2) for AGD, plus kappa A = 2 * 8 * 2 * (4 + 1) 2^-24: every product is exact (powers
    # of two times 5), sqrt is correctly rounded, the sum rounds once on both sides: no tolerance
    assert float(limit[0]) == math.sqrt(2.0) + 2 * 8 * 2 * 5 * 2.0**-24


def test_status_order_and_codes():
    """Worse is larger: a batch reports DIVERGED over BREAKDOWN, NONFINITE over DIVERGED."""
    assert Status.BREAKDOWN < Status.DIVERGED < Status.NONFINITE
    assert Status.DIVERGED.name == "DIVERGED"
