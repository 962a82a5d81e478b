"""Chebyshev / CG / GD / AGD in every precision against mpmath, at EVERY iterate.

For each run, ``analysis.references.iterative.error_split`` gives the truncation (mp replay vs the
exact solution) and the rounding (working iterates vs the mp replay) of every iterate;
``analysis.bounds.checks`` holds them to their bounds:

* truncation <= the method's bound for the constants used (Chebyshev 1/T_{i+1}(1/rho'),
  GD max|1 - step lam|^i, AGD Nesterov, CG 2 R_a^i in the H-norm);
* rounding <= c kappa (n u_acc + u_store) wherever that allowance is < 1 (docs/precision.md);
  CG: forward error <= sqrt(kappa) 2 R_a^i + allowance. Where it is >= 1 (bf16 at kappa >~ 32),
  Chebyshev / GD / AGD rounding is held to the run's own running bound instead, in
  tests/test_running_bounds.py (not repeated here).

Every property has a broken implementation that it catches (bottom of the file).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import solvers
from analysis.bounds import checks
from analysis.bounds import iterative as bounds
from analysis.precision import PRECISIONS, gamma, rounding_allowance
from analysis.references import iterative as gt
from analysis.studies.allowance import survey_iters
from analysis.testing.strategies import ridge_systems, spd_batch, spd_system, spd_systems
from solvers import Arith

IDS = [a.label for a in PRECISIONS]
KAPPAS = (10.0, 100.0, 1e3, 1e4)
D = 8


def run(method, S_H, S_q, L, mu, arith, iters):
    H, q = S_H.to(arith.dtype), S_q.to(arith.dtype)
    split = gt.error_split(method, H, q, iters=iters, L=L, mu=mu, bf16_mode=arith.mode)
    return split, checks.check(split, L, mu)


def capped_iters(method, kappa, D):
    """survey_iters, capped so one run stays ~0.1 s (GD at kappa 1e4 would need ~2e5)."""
    return min(survey_iters(method, kappa, D), 400)


# ------------------------------------------------------------------ the grid


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
@pytest.mark.parametrize("kappa", KAPPAS)
@pytest.mark.parametrize("method", gt.METHODS)
def test_every_iterate_within_bounds(method, kappa, arith):
    S = spd_system(D, kappa, "geometric", seed=11)
    split, res = run(method, S.H, S.q, S.L, S.mu, arith, capped_iters(method, kappa, D))
    # truncation_i <= bound_i (analysis.bounds.checks.truncation_bounds), every iterate
    assert res.truncation <= 1.0, f"truncation/bound = {res.truncation:.3g}"
    # rounding_i <= c kappa (n u_acc + u_store) where that is < 1 (CG: forward <= sqrt(k) 2R_a^i + allowance)
    assert res.rounding <= 1.0, f"rounding/allowance = {res.rounding:.3g}"


def test_grid_asserts_rounding_somewhere_in_every_precision():
    """The allowance must apply to some grid cases in each precision, or the grid tests nothing."""
    for arith in PRECISIONS:
        kappa_max = 1.0 / rounding_allowance(1.0, D, arith)
        assert kappa_max > (10.0 if arith.label != "bfloat16/strict" else 1.0), arith.label


@pytest.mark.parametrize("arith", PRECISIONS[3:], ids=IDS[3:])
@pytest.mark.parametrize("method", gt.METHODS)
def test_strict_bf16_within_allowance_where_it_applies(method, arith):
    """bf16 strict: c kappa (n+1) 2^-8 < 1 needs kappa < 3.5 at n = 8; the grid above has none."""
    S = spd_system(D, 3.0, "outliers", seed=5)
    split, res = run(method, S.H, S.q, S.L, S.mu, arith, capped_iters(method, 3.0, D))
    assert res.applies
    assert res.truncation <= 1.0 and res.rounding <= 1.0, res


@pytest.mark.parametrize("arith", PRECISIONS[2:], ids=IDS[2:])
def test_bf16_at_kappa_1e4_has_no_guarantee_and_none_is_claimed(arith):
    """kappa u > 1: rounding to bf16 alone moves eigenvalues by ~u ||H|| >> lam_min = 1e-4, the
    stored matrix is indefinite, and Chebyshev's error is >> 1. The allowance must not apply
    (honest "no guarantee"), while the truncation bound still holds for the stored problem."""
    S = spd_system(D, 1e4, "geometric", seed=1)
    split, res = run("chebyshev", S.H, S.q, S.L, S.mu, arith, 310)
    assert not res.applies
    assert not bool(split.exact.spd)
    assert float(split.forward[-1]) > 1.0  # completely wrong, as kappa u > 1 allows
    assert res.truncation <= 1.0


# ------------------------------------------------------------- hypothesis


@given(spd_systems(min_dim=2, max_dim=10, max_kappa=1e4), st.sampled_from(PRECISIONS))
def test_chebyshev_property_every_iterate(S, arith):
    split, res = run(
        "chebyshev", S.H, S.q, S.L, S.mu, arith, capped_iters("chebyshev", S.kappa, S.D)
    )
    assert res.truncation <= 1.0, res  # truncation <= 1/T_{i+1}(1/rho') over the stored spectrum
    assert res.rounding <= 1.0, res  # rounding <= c kappa (n u_acc + u_store) where < 1


@given(
    spd_systems(min_dim=2, max_dim=10, max_kappa=1e4),
    st.sampled_from(PRECISIONS),
    st.sampled_from(("cg", "gd", "agd")),
)
def test_baselines_property_every_iterate(S, arith, method):
    split, res = run(
        method, S.H, S.q, S.L, S.mu, arith, min(capped_iters(method, S.kappa, S.D), 200)
    )
    assert res.truncation <= 1.0, (
        res
    )  # the method's exact-arithmetic bound (analysis.bounds.checks)
    assert res.rounding <= 1.0, res  # allowance (CG: sqrt(kappa) 2 R_a^i + allowance)


@given(ridge_systems(min_dim=2, max_dim=12), st.sampled_from(PRECISIONS))
def test_chebyshev_on_gka_ridge_systems(case, arith):
    """GKA eq. (4): L = ||H||_F + lambda, mu = lambda; r = 30 as in the paper (appendix F)."""
    R = case.ridge
    split, res = run("chebyshev", R.A, case.q, float(R.L), float(R.mu), arith, 30)
    assert res.truncation <= 1.0, res
    assert res.rounding <= 1.0, res


# ------------------------------------------------------------- consistency


def test_float64_replay_matches_working_solver_to_rounding():
    """In float64 the working solver and the replay differ by rounding only: ~u kappa."""
    S = spd_system(D, 100.0, "outliers", seed=2)
    split, _ = run("chebyshev", S.H, S.q, S.L, S.mu, PRECISIONS[0], 60)
    assert float(split.rounding.max()) < rounding_allowance(
        100.0, D, PRECISIONS[0]
    )  # c kappa (n+1) 2^-53


def test_forward_error_splits_into_truncation_plus_rounding():
    """Triangle inequality: forward <= truncation + rounding (all relative to ||x*||)."""
    S = spd_system(D, 1e3, "clustered", seed=4)
    for arith in PRECISIONS:
        split, _ = run("agd", S.H, S.q, S.L, S.mu, arith, 80)
        excess = split.forward - (split.truncation + split.rounding)
        # each of the three is a float64 norm of a double-double difference over ||x*||: the
        # difference 2 roundings, the D-term norm gamma_{D/2+1}, the division u: gamma_{D+4}
        # relative (Higham's gamma_n, u = 2^-53); the subtractions above u more
        total = split.forward + split.truncation + split.rounding
        bound = gamma(D + 5, 2.0**-53) * total
        assert bool((excess <= bound).all()), arith.label
        # the check can fail: a truncation read one iterate late (the error has decayed since)
        late = split.forward[:-1] - (split.truncation[1:] + split.rounding[:-1])
        assert not bool((late <= bound[:-1]).all()), arith.label


def test_batched_split_matches_per_system():
    S1, S2 = spd_system(6, 10.0, seed=1), spd_system(6, 300.0, seed=2)
    H, q, L, mu = spd_batch([S1, S2], torch.float32)
    both = gt.error_split("chebyshev", H, q, iters=20, L=L, mu=mu)
    one = gt.error_split("chebyshev", H[1], q[1], iters=20, L=S2.L, mu=S2.mu)
    # the mp side is per system and exact; the working side may sum in another order when batched
    assert torch.equal(both.truncation[:, 1], one.truncation)
    assert torch.equal(both.replay.iterates.hi[:, 1], one.replay.iterates.hi)
    assert torch.equal(both.exact.eigenvalues[1], one.exact.eigenvalues)


def test_replay_constants_are_those_the_solver_used():
    """Working constants = Arith.scalar rounding of the float64 expressions (strict: bf16)."""
    c = gt.working_constants("chebyshev", 1.02, 0.02, Arith(torch.bfloat16, "strict"))
    assert float(c["step"]) == float(
        torch.tensor(2.0 / 1.04, dtype=torch.float64).to(torch.bfloat16)
    )
    assert float(c["rho2"]) == float(
        torch.tensor((1.0 / 1.04) ** 2, dtype=torch.float64).to(torch.bfloat16)
    )
    # and the working solver's first iterate is exactly step * q stored (one rounding): xi_0
    q = torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16)
    xi0 = solvers.chebyshev(
        torch.eye(3, dtype=torch.bfloat16), q, L=1.02, mu=0.02, iters=0, bf16_mode="strict"
    )
    assert torch.equal(xi0, (c["step"] * q.double()).to(torch.bfloat16))


def test_exact_constants_replay_differs_from_working_in_strict_bf16():
    """bf16 strict rounds rho^2 = (50/52)^2 to 0.92578125: the replays must differ, and the
    'exact' replay satisfies the paper's bound 1/T_{i+1}(1/rho) (float64 storage)."""
    S = spd_system(D, 51.0, seed=3)
    H, q = S.H.to(torch.bfloat16), S.q.to(torch.bfloat16)
    w = gt.replay("chebyshev", H, q, iters=20, L=S.L, mu=S.mu, bf16_mode="strict")
    e = gt.replay("chebyshev", H, q, iters=20, L=S.L, mu=S.mu, constants="exact")
    assert float(w.constants["rho2"]) != float(e.constants["rho2"])
    assert float((w.truncation - e.truncation).abs().max()) > 1e-4


# ------------------------------------------------- broken implementations


def _chebyshev_variant(H, q, *, L, mu, iters, omega_update, step_scale=1.0, momentum_shift=0.0):
    """GKA Algorithm 1 in float64 with one deliberate change (returns xi_0 .. xi_r)."""
    step = step_scale * 2.0 / (L + mu)
    rho2 = ((L - mu) / (L + mu)) ** 2
    omega, prev, xi = 2.0, torch.zeros_like(q), step * q
    its = [xi]
    for _ in range(iters):
        omega = omega_update(omega, rho2)
        new = xi - omega * step * (H @ xi - q) + (omega - 1.0 + momentum_shift) * (xi - prev)
        prev, xi = xi, new
        its.append(xi)
    return torch.stack(its)


BROKEN_CHEBYSHEV = {
    # rho instead of rho^2 in the weight schedule
    "omega_uses_rho": dict(omega_update=lambda w, r2: 4.0 / (4.0 - math.sqrt(r2) * w)),
    # omega frozen at its start value 2 (no schedule)
    "omega_not_updated": dict(omega_update=lambda w, r2: w),
    # gradient step 4/(L+mu) instead of 2/(L+mu)
    "step_off_by_factor_2": dict(omega_update=lambda w, r2: 4.0 / (4.0 - r2 * w), step_scale=2.0),
    # momentum weight omega instead of omega - 1
    "momentum_weight_omega": dict(
        omega_update=lambda w, r2: 4.0 / (4.0 - r2 * w), momentum_shift=1.0
    ),
}


@pytest.mark.parametrize("variant", sorted(BROKEN_CHEBYSHEV))
def test_broken_chebyshev_fails_every_iterate_check_at_kappa_100(variant):
    S = spd_system(D, 100.0, "geometric", seed=11)
    its = _chebyshev_variant(S.H, S.q, L=S.L, mu=S.mu, iters=60, **BROKEN_CHEBYSHEV[variant])
    split = gt.error_split("chebyshev", S.H, S.q, iters=60, L=S.L, mu=S.mu, iterates=its)
    assert checks.check(split, S.L, S.mu).rounding > 1.0


def test_the_correct_variant_passes_the_same_check():
    S = spd_system(D, 100.0, "geometric", seed=11)
    its = _chebyshev_variant(
        S.H, S.q, L=S.L, mu=S.mu, iters=60, omega_update=lambda w, r2: 4.0 / (4.0 - r2 * w)
    )
    split = gt.error_split("chebyshev", S.H, S.q, iters=60, L=S.L, mu=S.mu, iterates=its)
    assert checks.check(split, S.L, S.mu).passes


def test_cautionary_tale_final_iterate_check_at_small_kappa_misses_a_broken_schedule():
    """STYLE.md: a final-iterate check at small kappa with 10 n iterations passes the Chebyshev
    whose schedule uses rho for rho^2 (it still converges, as Chebyshev for a wider interval);
    our every-iterate check at kappa = 100 catches it (test above)."""
    S = spd_system(D, 2.0, seed=1)
    its = _chebyshev_variant(
        S.H, S.q, L=S.L, mu=S.mu, iters=10 * D, **BROKEN_CHEBYSHEV["omega_uses_rho"]
    )
    x_star = torch.linalg.solve(S.H, S.q)
    assert float((its[-1] - x_star).norm() / x_star.norm()) < 1e-6  # the weak check passes


def test_broken_replay_fails_the_truncation_bound(monkeypatch):
    """The truncation check can fail: a replay whose omega schedule uses rho (not rho^2)."""

    def wrong(H, q, iters, c):
        return gt._replay_chebyshev(H, q, iters, {**c, "rho2": c["rho2"] ** 0.5})

    monkeypatch.setitem(gt._REPLAYS, "chebyshev", wrong)
    monkeypatch.setenv("SVT_NO_CACHE", "1")
    S = spd_system(D, 100.0, seed=11)
    split = gt.error_split("chebyshev", S.H, S.q, iters=60, L=S.L, mu=S.mu)
    assert checks.check(split, S.L, S.mu).truncation > 1.0


def test_broken_gd_step_fails():
    """GD with step 2/mu... any step > 2/L diverges on the top eigenvalue."""
    S = spd_system(D, 100.0, seed=11)
    step = 2.5 / (S.L + S.mu)
    x, its = torch.zeros_like(S.q), []
    for _ in range(41):
        its.append(x)
        x = x - step * (S.H @ x - S.q)
    split = gt.error_split("gd", S.H, S.q, iters=40, L=S.L, mu=S.mu, iterates=torch.stack(its))
    assert checks.check(split, S.L, S.mu).rounding > 1.0


def test_broken_agd_momentum_sign_fails():
    S = spd_system(D, 100.0, seed=11)
    beta = -(math.sqrt(S.kappa) - 1.0) / (math.sqrt(S.kappa) + 1.0)
    x = y = torch.zeros_like(S.q)
    its = [x]
    for _ in range(40):
        x_new = y - (S.H @ y - S.q) / S.L
        y = x_new + beta * (x_new - x)
        x = x_new
        its.append(x)
    split = gt.error_split("agd", S.H, S.q, iters=40, L=S.L, mu=S.mu, iterates=torch.stack(its))
    assert checks.check(split, S.L, S.mu).rounding > 1.0


def test_broken_cg_beta_inverted_fails():
    """CG with beta = r_i^T r_i / r_{i+1}^T r_{i+1} (inverted) loses conjugacy and stalls."""
    S = spd_system(D, 100.0, seed=11)
    x, r = torch.zeros_like(S.q), S.q.clone()
    p, rr = r.clone(), r @ r
    its = [x]
    for _ in range(3 * D):
        Hp = S.H @ p
        alpha = rr / (p @ Hp)
        x, r = x + alpha * p, r - alpha * Hp
        rr_new = r @ r
        p = r + (rr / rr_new) * p
        rr = rr_new
        its.append(x)
    split = gt.error_split("cg", S.H, S.q, iters=3 * D, iterates=torch.stack(its))
    assert checks.check(split).rounding > 1.0


def test_broken_bound_off_by_one_is_violated():
    """The truncation bound is not vacuous: with degree i + 2 instead of i + 1 it is violated."""
    S = spd_system(D, 100.0, seed=11)
    split = gt.error_split("chebyshev", S.H, S.q, iters=40, L=S.L, mu=S.mu)
    i = torch.arange(41, dtype=torch.float64)
    assert bool((split.truncation > bounds.chebyshev_bound(S.kappa, i + 1)).any())
