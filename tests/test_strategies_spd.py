"""analysis.testing.strategies.spd: the generated systems have the spectrum they claim."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from analysis.precision import gamma
from analysis.testing.strategies import (
    SPECTRUM_KINDS,
    haar_orthogonal,
    ridge_system,
    ridge_systems,
    spd_matrices,
    spd_system,
    spectrum,
)

u64 = 2.0**-53


@pytest.mark.parametrize("kind", SPECTRUM_KINDS)
@pytest.mark.parametrize("kappa", [1.0, 10.0, 1e4])
def test_spectrum_ends_and_kappa_exact(kind, kappa):
    lam = spectrum(9, kappa, kind, lam_max=2.0, seed=3)
    assert lam.dtype == torch.float64 and lam.shape == (9,)
    assert float(lam[-1]) == 2.0 and float(lam[0]) == 2.0 / kappa
    assert bool((lam[1:] >= lam[:-1]).all())


def test_clustered_spectrum_has_two_clusters():
    lam = spectrum(10, 1e3, "clustered", seed=0)
    assert bool((lam[:5] <= 1.1e-3).all()) and bool((lam[5:] >= 1 / 1.1).all())


@given(spd_matrices(min_dim=1, max_dim=12, max_kappa=1e4))
def test_spd_matrix_has_the_prescribed_eigenvalues(case):
    H, lam = case
    assert torch.equal(H, H.T)  # exactly symmetric, so every rounding of it is too
    got = torch.linalg.eigvalsh(H)
    # eigvalsh is backward stable and Q is orthogonal to ~D u: |error| <= ~4 D u ||H||
    assert float((got - lam).abs().max()) <= 4 * H.shape[-1] * u64 * float(lam.max()) * 4


def test_haar_orthogonal_is_orthogonal_and_batched():
    Q = haar_orthogonal(6, seed=1, batch=(2,))
    eye = torch.eye(6, dtype=torch.float64)
    assert float((Q @ Q.transpose(-1, -2) - eye).abs().max()) < 16 * u64 * 6


def test_spd_system_is_reproducible_and_unit_rhs():
    a, b = spd_system(7, 50.0, "outliers", seed=4), spd_system(7, 50.0, "outliers", seed=4)
    assert torch.equal(a.H, b.H) and torch.equal(a.q, b.q)
    # q / ||q||: the norm gamma_{D/2+1}, the division u, the norm again gamma_{D/2+1}: gamma_{D+3}
    assert float(a.q.norm()) == pytest.approx(1.0, rel=gamma(7 + 3, u64), abs=0)
    # the ends are exact but mu = fl(1/50): kappa = 1/mu to gamma_2
    assert a.kappa == pytest.approx(50.0, rel=gamma(2, u64), abs=0) and a.L == 1.0


@given(ridge_systems(min_dim=2, max_dim=10))
def test_ridge_systems_have_the_gka_form(case):
    """GKA eq. (4): lambda = a ||H||_F, L = ||H||_F + lambda, mu = lambda, kappa <= (a+1)/a."""
    R = case.ridge
    fro = torch.linalg.matrix_norm(case.H)
    # solvers.gka_ridge forms lambda = a ||H||_F and L = ||H||_F + lambda by these same float64
    # operations (matrix_norm of the same H): equal, no tolerance
    assert float(R.lam) == R.a * float(fro)
    assert float(R.L) == float(fro + R.lam)
    assert _spectrum_in(case, float(R.mu), float(R.L))


def _spectrum_in(case, mu: float, L: float, T: int = 64) -> bool:
    """eigvalsh(A) in [mu, L] up to the stored data's rounding and eigvalsh's (Weyl; Higham's
    gamma_n): H = a sum of <= T (ridge_systems' max_T) gated outer products is within
    gamma_{T+2} tr(H) of a PSD matrix, A's diagonal rounds once (u max A_ii), eigvalsh errs by
    D u ||A||_2 (LAPACK, p(D) = D); at the top lam_max(H) <= ||H||_F to gamma_{D^2 + 1} and
    L = fl(fro + lam): gamma_{D^2 + 3} relative."""
    A = case.ridge.A
    eig = torch.linalg.eigvalsh(A)
    D, lam_max = A.shape[-1], float(eig[-1])
    move = gamma(T + 2, u64) * float(torch.trace(case.H)) + u64 * float(A.diagonal().max())
    move += D * u64 * lam_max
    return float(eig[0]) >= mu - move and lam_max <= L * (1 + gamma(D * D + 3, u64)) + move


def test_ridge_spectrum_check_fails_for_wrong_ends():
    """The check can fail on a rank-one H (T = 1), whose A attains both ends: mu 0.1 % too large,
    or L = ||H||_F without lambda."""
    case = ridge_system(6, 0.02, T=1, seed=0)
    R = case.ridge
    assert _spectrum_in(case, float(R.mu), float(R.L), T=1)
    assert not _spectrum_in(case, float(R.mu) * (1 + 1e-3), float(R.L), T=1)
    assert not _spectrum_in(case, float(R.mu), float(R.L - R.lam), T=1)


def test_bad_spectrum_arguments():
    with pytest.raises(ValueError, match="kind"):
        spectrum(4, 10.0, "uniform")
    with pytest.raises(ValueError, match="kappa"):
        spectrum(4, 0.5)
    with pytest.raises(ValueError, match="D must be"):
        spectrum(0, 10.0)
    with pytest.raises(ValueError, match="gamma"):
        ridge_system(4, 0.02, gamma=1.5)


def test_one_log_uniform_generator_for_the_harness_and_the_strategies():
    """The harness draws its SPD problems from strategies.log_uniform_spd (one generator, one
    name); its old name in the harness still answers, with a DeprecationWarning."""
    import pytest

    from analysis.testing import harness
    from analysis.testing.strategies import log_uniform_spd

    H = log_uniform_spd(5, 3, 100.0, 2.0, torch.Generator().manual_seed(0))
    ev = torch.linalg.eigvalsh(H)
    # both ends attained: the stored fl(Q diag(lam) Q^T) is within D gamma_D lam_max of it, Haar
    # Q orthogonal to ~D u, eigvalsh within D u lam_max (LAPACK, p(D) = D): (D gamma_D + 2 D u)
    # lam_max = 7.8e-15 absolute (3.9e-13 relative at 0.02)
    atol = (5 * gamma(5, u64) + 2 * 5 * u64) * 2.0
    assert torch.allclose(ev[:, 0], torch.full((3,), 0.02, dtype=torch.float64), rtol=0, atol=atol)
    assert torch.allclose(ev[:, -1], torch.full((3,), 2.0, dtype=torch.float64), rtol=0, atol=atol)
    case = harness.spd_case(5, (3,), 100.0, iters=2, scale=2.0, seed=0)
    with pytest.warns(DeprecationWarning, match="log_uniform_spd"):
        assert harness.spd_matrices is log_uniform_spd
    assert case.inputs["H"].shape == (3, 5, 5)
