"""Tests that kill mutants the rest of the suite let live: each one fails on a specific wrong
implementation named in its docstring.

Bounds used below:

* ``allow(ar)`` = rounding_allowance(kappa, D, ar) = 8 kappa (D u_acc + u_store) (docs/precision.md)
  and ``A_r`` = reversal_amplification(L, mu, r): the reverse methods are held to
  ``allow * A_r``, as in tests/test_chebyshev_backward.py.
* the standard model ``|fl(z) - z| <= u |z|`` (Higham, Thm 2.2) and the exact-arithmetic
  bounds of analysis.bounds, each attained by a constructed worst case, so that each is tested
  from both sides: never exceeded, and not looser than needed.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from kernel_support import DEVICE, needs_triton_device, poisoned_outputs  # noqa: F401 - autouse fixture

import kernels
import solvers
from analysis.bounds import iterative as bounds
from analysis.bounds import running as rb
from analysis.precision import rounding_allowance
from analysis.references.chebyshev_backward import rel, reversal_amplification, spd_problem
from solvers import Arith, unit_roundoff

F64, F32 = Arith(torch.float64), Arith(torch.float32)
D, KAPPA, ITERS = 8, 10.0, 5
REVERSE = ("reverse", "reverse_stored_omega")


# ----------------------------------------------------------- the adjoint on a non-symmetric H


def _nonsymmetric(dtype):
    """An SPD problem plus a skew part of norm mu/2: H != H^T, so an adjoint that applies H
    instead of H^T is wrong by O(||H - H^T||)."""
    pb = spd_problem(D, KAPPA, torch.float64, seed=3)
    S = torch.randn(D, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    S = S - S.T
    H = pb.H + (0.5 * pb.mu / float(torch.linalg.matrix_norm(S, ord=2))) * S
    return H.to(dtype), pb.q.to(dtype), pb.g.to(dtype), pb.L, pb.mu


def _autograd64(H, q, g, L, mu):
    d = lambda t: t.to(torch.float64)  # noqa: E731
    return solvers.chebyshev_backward(d(H), d(q), d(g), L=L, mu=mu, iters=ITERS, method="autograd")


@pytest.mark.parametrize("method", REVERSE)
def test_reverse_adjoint_is_exact_for_a_nonsymmetric_H(method):
    """The docstring promises exact gradients for any square H (the adjoint applies H^T).
    float64, within 2 allow(float64) * A_r (measured 9e-16, bound 1.9e-12); the mutant that
    applies H (``ar.rmatvec`` -> ``ar.matvec``) is off by 0.28 in dq and 0.20 in dH."""
    H, q, g, L, mu = _nonsymmetric(torch.float64)
    assert not torch.equal(H, H.T)
    ref_dq, ref_dH = _autograd64(H, q, g, L, mu)
    dq, dH = solvers.chebyshev_backward(H, q, g, L=L, mu=mu, iters=ITERS, method=method)
    tol = (
        2 * rounding_allowance(KAPPA, D, F64) * reversal_amplification(L, mu, ITERS)
    )  # allow * A_r
    assert rel(dq, ref_dq) <= tol and rel(dH, ref_dH) <= tol


@needs_triton_device
@pytest.mark.parametrize("method", REVERSE)
def test_reverse_kernel_adjoint_is_exact_for_a_nonsymmetric_H(method):
    """The kernel's adjoint product (``rmatvec``) against float64 autograd on the same float32
    inputs, within (allow(float32) + allow(float64)) * A_r (measured 5e-7, bound 5e-4); the
    kernel with ``matvec`` in its place is off by 0.28 in dq and 0.20 in dH."""
    H, q, g, L, mu = _nonsymmetric(torch.float32)
    ref_dq, ref_dH = _autograd64(H, q, g, L, mu)
    dq, dH = kernels.chebyshev_backward(
        H.to(DEVICE),
        q.to(DEVICE),
        g.to(DEVICE),
        L=L,
        mu=mu,
        iters=ITERS,
        method=method,
        out_dtype=torch.float32,
    )
    dq, dH = dq.cpu(), dH.cpu()
    tol = (
        rounding_allowance(KAPPA, D, F32) + rounding_allowance(KAPPA, D, F64)
    ) * reversal_amplification(L, mu, ITERS)
    assert rel(dq, ref_dq) <= tol and rel(dH, ref_dH) <= tol


# ----------------------------------------------------------- unit roundoffs, and bounds from both sides


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_unit_roundoff_is_half_the_machine_epsilon(dtype):
    """u = eps / 2 for round to nearest (Higham, Sec. 2.1); u(float32) = 2^-23 would double every
    float32 bound. Arith reports the same u for stores and, outside bf16 storage mode, sums."""
    u = torch.finfo(dtype).eps / 2
    assert unit_roundoff(dtype) == u
    assert Arith(dtype).u_store == u
    assert Arith(dtype, "strict").u_acc == u
    assert Arith(torch.bfloat16, "storage").u_acc == torch.finfo(torch.float32).eps / 2


def _worst_rounding(dtype) -> tuple:
    """A sum z = 1 + b whose rounding error is as large as the model allows: b = u (1 + 2u), the
    next number above half an ulp of 1, so fl(z) = 1 + 2u and |fl(z) - z| = u - 2u^2 ~ u |z|.
    Returns (|fl(z) - z| exactly, |z| exactly)."""
    u = Fraction(unit_roundoff(dtype))
    b = u * (1 + 2 * u)
    one = torch.tensor(1.0, dtype=dtype)
    computed = Fraction(float(one + torch.tensor(float(b), dtype=dtype)))
    assert Fraction(float(torch.tensor(float(b), dtype=dtype))) == b  # b itself is stored exactly
    z = 1 + b
    return abs(computed - z), z


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_standard_model_bound_is_attained(dtype):
    """|fl(z) - z| <= u |z| holds and is tight: a constructed sum reaches 1 - 3u of it (0.988 in
    bf16), so a u twice too large (or any bound on one rounding 3x looser than needed) fails."""
    err, z = _worst_rounding(dtype)
    ratio = err / (Fraction(unit_roundoff(dtype)) * z)
    assert 0.95 <= ratio <= 1


@pytest.mark.parametrize("kappa", [2.0, 10.0, 100.0])
@pytest.mark.parametrize("i", [0, 3, 10])
def test_chebyshev_and_gd_bounds_are_attained_at_mu(kappa, i):
    """On H = [mu] (D = 1) the error ratio is exactly the bound: 1/T_{i+1}(1/rho) for Chebyshev
    (|T_{i+1}| = 1 at the end of the interval) and rho^i for GD. float64: the run's own rounding
    is at most 8 (i + 1) u |x*| ((i + 1) steps of <= 4 roundings of values <= 2 |x*|), far below
    the smallest bound (7.6e-9), so a bound 3x looser than needed fails."""
    L, mu = kappa, 1.0
    H, q = torch.tensor([[mu]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    x_star = 1.0 / mu
    for solve, bound in (
        (solvers.chebyshev, bounds.chebyshev_bound),
        (solvers.gd, bounds.gd_bound),
    ):
        measured = abs(float(solve(H, q, L=L, mu=mu, iters=i)[0]) - x_star) / x_star
        assert abs(measured - float(bound(kappa, i))) <= 8 * (i + 1) * 2.0**-53


# ----------------------------------------------------------- the running bound's gamma_n


def _gamma(k: int, u: float) -> float:
    return k * u / (1.0 - k * u)


def test_local_bound_of_gd_matches_a_hand_derivation():
    """GD in float32 (no store rounding) on H = [[2, 1], [1, 2]], q = (1, 0), L = 3, mu = 1
    (step = 1/2 exactly), from the stored iterates x_0 = 0, x_1 = (1/2, 0).

    Step 2 computes x_1 - step (fl(H x_1) - q). Through the standard model, operation by
    operation (|H| |x_1| = (1, 1/2), H x_1 - q = (0, 1/2), step (H x_1 - q) = (0, 1/4),
    x_2 = (1/2, -1/4)), with gamma_2 = 2u/(1 - 2u) for the length-2 dot products (Higham (3.11)):

        matvec:   e_m = gamma_2 (1, 1/2)
        g:        e_g = e_m + u (|g| + e_m)
        step g:   e_s = step e_g + u (|step g| + step e_g)
        x - s g:  e_x = e_s + u (|x_2| + e_s)

    The first step (from x_0 = 0) has e = u (1 + u/2) + u (1/2 + u (1 + u/2)) in component 0
    and 0 in component 1. A bound with gamma_{n-1} = gamma_1 in place of gamma_2 (less
    rigorous, and invisible to any measured error) differs by ~u/2 = 1/3 of step 2's bound."""
    u = 2.0**-24
    H = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    q = torch.tensor([1.0, 0.0], dtype=torch.float64)
    iterates = torch.tensor([[0.0, 0.0], [0.5, 0.0], [0.5, -0.25]], dtype=torch.float64)
    got = rb.local_bounds("gd", H, q, iterates, L=3.0, mu=1.0, arith=F32).bound

    g2, step = _gamma(2, u), 0.5
    e1_first = u * (1 + u / 2)
    expected1 = [e1_first + u * (0.5 + e1_first), 0.0]
    expected2 = []
    for mv_abs, g_abs, x_abs in ((1.0, 0.0, 0.5), (0.5, 0.5, 0.25)):
        e_m = g2 * mv_abs
        e_g = e_m + u * (g_abs + e_m)
        e_s = step * e_g + u * (step * g_abs + step * e_g)
        expected2.append(e_s + u * (x_abs + e_s))
    expected = torch.tensor([[0.0, 0.0], expected1, expected2], dtype=torch.float64)
    # both sides are float64 evaluations of the same nonnegative expression of <= 15 operations:
    # gamma_15(u_64) each (Higham Lemma 3.1), so 2 gamma_15 apart (measured: equal)
    assert torch.allclose(got, expected, rtol=_LOCAL_RTOL, atol=0.0)


_LOCAL_RTOL = 2 * _gamma(15, 2.0**-53)


def test_local_bound_check_fails_for_gamma_n_minus_1(monkeypatch):
    """The hand-derivation check catches the mutant of its docstring: gamma_{n-1} = gamma_1 in
    place of gamma_2 for the length-2 dot products (1/3 of step 2's bound)."""
    real = rb.gamma
    monkeypatch.setattr(rb, "gamma", lambda n, u: real(n - 1 if n == 2 else n, u))
    with pytest.raises(AssertionError):
        test_local_bound_of_gd_matches_a_hand_derivation()
