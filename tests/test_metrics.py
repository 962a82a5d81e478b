"""analysis.references.metrics and the ground-truth values they use: identities, not tolerance guesses."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from analysis.precision import gamma
from analysis.references import iterative as gt
from analysis.references import metrics
from analysis.references import mp as amp
from analysis.testing.strategies import spd_matrices, spd_system, spd_systems

u64 = 2.0**-53


def _identity_defect(A, q, x, eta):
    """Rigal-Gaches: with r = q - A x, the perturbations dA = eta ||A||_2 r x^T / (||r|| ||x||)
    and dq = -eta ||q|| r / ||r|| make x exact, ``(A + dA) x = q + dq``, iff eta is the normwise
    backward error (Higham, Thm 7.1). Returns ``||(A + dA) x - (q + dq)||`` relative to
    ``||A||_2 ||x|| + ||q||``."""
    r = q - A @ x
    nA = float(torch.linalg.matrix_norm(A, ord=2))
    dA = eta * nA * torch.outer(r, x) / (r.norm() * x.norm())
    dq = -eta * q.norm() * r / r.norm()
    return float(((A + dA) @ x - (q + dq)).norm()) / (nA * float(x.norm()) + float(q.norm()))


@given(
    spd_systems(min_dim=2, max_dim=8, max_kappa=1e3),
    st.floats(1e-8, 1e-2),
    st.integers(0, 2**31 - 1),
)
def test_backward_error_is_the_optimal_perturbation(S, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.linalg.solve(S.H, S.q) + scale * torch.randn(S.D, generator=g, dtype=torch.float64)
    eta = float(metrics.backward_error(S.H, S.q, x))
    # the identity holds up to its float64 evaluation: ~ D u (||A|| ||x|| + ||q||)
    assert _identity_defect(S.H, S.q, x, eta) <= 4 * S.D * u64


def test_backward_error_with_frobenius_norm_breaks_the_identity():
    """A broken backward error (||A||_F for ||A||_2) fails the same identity check."""
    S = spd_system(6, 100.0, seed=1)
    x = torch.linalg.solve(S.H, S.q) + 1e-3
    r = S.q - S.H @ x
    nF = float(torch.linalg.matrix_norm(S.H))
    eta_F = float(r.norm()) / (nF * float(x.norm()) + float(S.q.norm()))
    assert _identity_defect(S.H, S.q, x, eta_F) > 4 * S.D * u64


def test_backward_error_of_float64_solution_uses_exact_residual():
    """For float64 data the residual is formed in mpmath: the float64 residual's own rounding
    (~D u ||A|| ||x||) would otherwise be as large as the quantity measured."""
    S = spd_system(8, 1e3, seed=2)
    x = gt.exact_solution(S.H, S.q).x.hi  # x* rounded once: eta ~ u
    eta_exact = float(metrics.backward_error(S.H, S.q, x))
    with mpmath.workdps(60):
        A, q, xm = amp.to_mp(S.H), amp.to_mp(S.q), amp.to_mp(x)
        r = q - A * xm
        direct = float(
            mpmath.norm(r) / (float(metrics.spectral_norm(S.H)) * mpmath.norm(xm) + mpmath.norm(q))
        )
    # the same quotient but for float64's ||x||, ||q|| (gamma_{D/2+1} each), the exact residual's
    # rounding, the product, sum and division: gamma_{D+6} relative (measured 0)
    rel = gamma(S.D + 6, u64)
    assert eta_exact == pytest.approx(direct, rel=rel, abs=0)
    assert eta_exact <= 4 * u64  # a correctly rounded solution is backward stable
    # the check can fail: the float64 residual's rounding moves eta by 6 % here
    eta_float = float(metrics.backward_error(S.H, S.q, x, exact=False))
    assert eta_float != pytest.approx(direct, rel=rel, abs=0)


def test_residual_norm_bf16_in_float64_is_exact_products():
    S = spd_system(8, 10.0, seed=3)
    A, q = S.H.to(torch.bfloat16), S.q.to(torch.bfloat16)
    x = torch.linalg.solve(A.double(), q.double()).to(torch.bfloat16)
    fast = float(metrics.residual_norm(A, q, x))
    exact = float(metrics.residual_norm(A, q, x, exact=True))
    assert fast == pytest.approx(exact, rel=8 * 8 * u64)  # only the D-term sums round (gamma_D)


def test_relative_forward_error_of_exact_solution_is_zero_and_scales():
    S = spd_system(6, 10.0, seed=4)
    ex = gt.exact_solution(S.H, S.q)
    assert float(metrics.relative_forward_error(ex.x.hi + ex.x.lo, ex.x)) <= 2 * u64
    xs = ex.x.hi
    # xs (1 + 1e-3): fl(1.001) and the products err by 2u of 1.001 ||x*||, and xs = hi misses x* by
    # lo (u ||x*||), i.e. (2 * 1.001 + 1) u / 1e-3 of the result; the double-double distance, its
    # norm and the division gamma_{D+4}, the literal 1e-3 u: 3002u + gamma_{D+5} (measured 176u)
    rel = (2 * 1.001 + 1) * u64 / 1e-3 + gamma(S.D + 5, u64)
    assert float(metrics.relative_forward_error(xs * (1 + 1e-3), ex.x)) == pytest.approx(
        1e-3, rel=rel, abs=0
    )


def test_a_norm_error_matches_definition():
    S = spd_system(6, 100.0, seed=5)
    ex = gt.exact_solution(S.H, S.q)
    x = ex.x.hi + 1e-4 * torch.arange(6, dtype=torch.float64)
    e = x - ex.x.hi
    want = torch.sqrt(e @ S.H @ e) / torch.sqrt(ex.x.hi @ S.H @ ex.x.hi)
    # e = x - hi is exact where Sterbenz applies (else within u |e_i|) but misses x - x* by lo:
    # sqrt(kappa) ||lo|| / ||e|| relative in the A-norm; each of the four quadratic forms v^T H v
    # within gamma_{2D} |v|^T |H| |v| <= gamma_{2D} D kappa v^T H v, halved by the sqrt; the
    # divisions 2u, the comparison u: 1.4e-11 here (measured 791u = 8.8e-14)
    kappa = S.kappa
    lo_term = math.sqrt(kappa) * (float(ex.x.lo.norm()) / float(e.norm()) + u64)
    rel = lo_term + 2 * gamma(2 * S.D, u64) * S.D * kappa + 3 * u64
    assert float(metrics.a_norm_error(S.H, x, ex.x)) == pytest.approx(float(want), rel=rel, abs=0)
    # the check can fail: the 2-norm relative error is not the A-norm one
    two_norm = float(metrics.relative_forward_error(x, ex.x))
    assert two_norm != pytest.approx(float(want), rel=rel, abs=0)


@given(spd_matrices(min_dim=1, max_dim=8, max_kappa=1e4))
def test_spectral_norm_is_the_largest_eigenvalue(case):
    H, lam = case
    assert float(metrics.spectral_norm(H)) == pytest.approx(float(lam.max()), rel=64 * u64)


def test_metrics_broadcast_over_iterates():
    S = spd_system(5, 10.0, seed=6)
    its = torch.stack([torch.zeros(5, dtype=torch.float64), S.q, torch.linalg.solve(S.H, S.q)])
    eta = metrics.backward_error(S.H, S.q, its)
    assert eta.shape == (3,)
    # x = 0: eta = ||q|| / ||q||, the exact residual's norm rounded once over float64's ||q||
    # (gamma_{D/2+1}) and the division: gamma_{D+2}
    assert float(eta[0]) == pytest.approx(1.0, rel=gamma(S.D + 2, u64), abs=0)
    norms = metrics.residual_norms(S.H, S.q, its)
    # q - A 0 = q exactly; two float64 norms of it, gamma_{D/2+1} each
    assert norms.shape == (3,)
    assert float(norms[0]) == pytest.approx(float(S.q.norm()), rel=gamma(S.D + 2, u64), abs=0)


# ------------------------------------------------------------------ ground truth


def test_exact_solution_matches_mpmath_cholesky_to_32_digits():
    S = spd_system(6, 1e3, seed=7)
    ex = gt.exact_solution(S.H.to(torch.float32), S.q.to(torch.float32))
    with mpmath.workdps(60):
        x = mpmath.lu_solve(amp.to_mp(S.H.to(torch.float32)), amp.to_mp(S.q.to(torch.float32)))
        for i in range(6):
            got = mpmath.mpf(float(ex.x.hi[i])) + mpmath.mpf(float(ex.x.lo[i]))
            assert abs(got - x[i]) <= mpmath.mpf(10) ** -30 * abs(x[i])


def test_high_precision_difference_is_accurate_at_float64_scale():
    """x - x* for x within 1e-16 of x*: the double-double keeps ~16 more digits than float64."""
    with mpmath.workdps(50):
        v = mpmath.mpf(1) / 3
        hp = gt.HighPrecision.from_mp([v], (1,))
        x = torch.tensor([float(v)], dtype=torch.float64)
        want = float(mpmath.mpf(float(v)) - v)
    # x = hi exactly, so (x - hi) - lo = -lo with no rounding; lo is v - hi rounded once, as is
    # want: equal, no tolerance
    assert float(hp.difference(x)[0]) == want


def test_indefinite_stored_matrix_is_flagged_not_hidden():
    H = torch.diag(torch.tensor([1.0, -1e-3], dtype=torch.float64))
    ex = gt.exact_solution(H, torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert not bool(ex.spd) and float(ex.kappa) == float("inf")
    # -1 / fl(1e-3) (the stored entry: u) rounded once (u): gamma_2
    assert float(ex.x.hi[1]) == pytest.approx(-1000.0, rel=gamma(2, u64), abs=0)


def test_cache_hit_and_recompute(tmp_path, monkeypatch):
    monkeypatch.setenv("SVT_CACHE_DIR", str(tmp_path))
    S = spd_system(4, 10.0, seed=8)
    a = gt.replay("chebyshev", S.H, S.q, iters=5, L=S.L, mu=S.mu)
    files = sorted((tmp_path / "ground_truth").rglob("*.pt"))
    assert len(files) == 2  # one exact solution, one replay
    mtimes = [f.stat().st_mtime_ns for f in files]
    b = gt.replay("chebyshev", S.H, S.q, iters=5, L=S.L, mu=S.mu)
    assert torch.equal(a.iterates.hi, b.iterates.hi)
    assert [f.stat().st_mtime_ns for f in files] == mtimes  # read, not rewritten
    gt._WRITTEN.clear()  # as in a new process
    gt.replay("chebyshev", S.H, S.q, iters=5, L=S.L, mu=S.mu, recompute=True)
    assert [f.stat().st_mtime_ns for f in files] != mtimes


def test_cache_key_depends_on_stored_bytes_dtype_and_constants(tmp_path, monkeypatch):
    monkeypatch.setenv("SVT_CACHE_DIR", str(tmp_path))
    S = spd_system(4, 10.0, seed=9)
    gt.replay("gd", S.H, S.q, iters=3, L=S.L, mu=S.mu)
    gt.replay("gd", S.H.to(torch.float32), S.q.to(torch.float32), iters=3, L=S.L, mu=S.mu)
    gt.replay("gd", S.H, S.q, iters=3, L=S.L * 2, mu=S.mu)
    assert len(list((tmp_path / "ground_truth" / "replay").glob("*.pt"))) == 3


def test_replay_rejects_bad_arguments():
    S = spd_system(3, 2.0, seed=0)
    with pytest.raises(ValueError, match="method"):
        gt.replay("jacobi", S.H, S.q, iters=2)
    with pytest.raises(ValueError, match="constants"):
        gt.replay("gd", S.H, S.q, iters=2, L=S.L, mu=S.mu, constants="rounded")
    with pytest.raises(ValueError, match="iters"):
        gt.replay("cg", S.H, S.q, iters=-1)
    with pytest.raises(TypeError, match="L and mu"):
        gt.replay("chebyshev", S.H, S.q, iters=2)
    with pytest.raises(ValueError, match="dps"):
        gt.exact_solution(S.H, S.q, dps=30)


def test_empty_batch_ground_truth():
    H = torch.zeros(0, 3, 3, dtype=torch.float64)
    q = torch.zeros(0, 3, dtype=torch.float64)
    split = gt.error_split("chebyshev", H, q, iters=4, L=2.0, mu=1.0)
    assert split.rounding.shape == (5, 0) and split.truncation.shape == (5, 0)
