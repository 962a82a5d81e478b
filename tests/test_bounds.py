"""analysis.bounds: closed forms, the paper's printed numbers, and the bounds against exact replays."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import solvers
from analysis.bounds import checks
from analysis.bounds import iterative as bounds
from analysis.precision import gamma
from analysis.references import iterative as gt
from analysis.testing.strategies import spd_system

kappas = st.floats(1.0, 1e6)
iters = st.integers(0, 400)
U64 = 2.0**-53


def _evaluation_error(b: float) -> float:
    """Relative float64 error of ``chebyshev_bound``'s value b (Higham's gamma_n, u = 2^-53,
    exp/log/log1p counted as 2 roundings, i.e. 1 ulp). a = log1p(2 (sqrt k + 1)/(k - 1)): sqrt,
    +, -, / and log1p: gamma_6 relative; times i + 1: gamma_7; log T = (i + 1) a +
    log1p(exp(-2 (i + 1) a)) - log 2 and b = exp(-log T) add gamma_7 of |log b| + 1; with
    (i + 1) a <= |log b| + log 2: |b_hat / b - 1| <= gamma_14 (|log b| + 1) (first order)."""
    return gamma(14, U64) * (abs(math.log(b)) + 1.0) if b > 0 else 0.0


def _rate_error(i) -> float:
    """Relative float64 error of ``chebyshev_rate_bound`` = 2 R_a^{i+1}: R_a = (k - 1)/(sqrt k + 1)^2
    is 5 roundings, raised to the power i + 1, and pow's own ulp: gamma_{5 (i+1) + 2}."""
    return gamma(5 * (i + 1) + 2, U64)


@given(kappas, iters)
def test_chebyshev_bound_is_one_over_t_of_one_over_rho(kappa, i):
    """1/T_{i+1}(1/rho) against mpmath's Chebyshev polynomial at rho = (kappa-1)/(kappa+1) exactly,
    to the accuracy bounds.with_evaluation_slack claims: 2^-50 (8 + 4 |log b| + i) relative."""
    with mpmath.workdps(60):
        k = mpmath.mpf(kappa)
        if k == 1:
            assert float(bounds.chebyshev_bound(kappa, i)) == 0.0
            return
        exact = 1 / mpmath.chebyt(i + 1, (k + 1) / (k - 1))
        if exact < 1e-300:
            return
        got = float(bounds.chebyshev_bound(kappa, i))
        claimed = 2.0**-50 * (8 + 4 * abs(math.log(float(exact))) + i)
        assert abs(mpmath.mpf(got) - exact) <= claimed * exact


def test_chebyshev_bound_naive_acosh_is_inaccurate_at_large_kappa():
    """Why the bound goes through log1p: acosh(fl(1/rho)) loses a factor ~kappa/4 near 1."""
    kappa, i = 1e6, 2000
    with mpmath.workdps(60):
        k = mpmath.mpf(kappa)
        exact = float(-mpmath.log(1 / mpmath.chebyt(i + 1, (k + 1) / (k - 1))))
    r = (kappa - 1.0) / (kappa + 1.0)
    naive = float(bounds.log_chebyshev_t(i + 1, 1.0 / r))
    b = float(bounds.chebyshev_bound(kappa, i))
    accurate = -math.log(b)
    # |log b_hat - log b| <= the relative error of b (_evaluation_error) plus this log's ulp:
    # gamma_14 (exact + 1) + gamma_2 exact = 6.7e-15 here; the naive path is off by 3.4e-12
    tol = _evaluation_error(b) + gamma(2, U64) * exact
    assert abs(accurate - exact) <= tol < abs(naive - exact)


@given(kappas, iters)
def test_chebyshev_bound_below_rate_bound(kappa, i):
    """T_k(1/rho) >= (R_a^-k + R_a^k)/2 => 1/T_{i+1} <= 2 R_a^{i+1} (GKA Alg. 1 error bound chain)."""
    b = float(bounds.chebyshev_bound(kappa, i))
    tiny = 2.2250738585072014e-308  # below it, float64 is subnormal and relative accuracy is lost
    assert _below_rate_bound(b, float(bounds.chebyshev_rate_bound(kappa, i)), i, tiny)


def _below_rate_bound(b: float, rate: float, i: int, tiny: float = 0.0) -> bool:
    """b <= rate up to both sides' float64 evaluation errors: 1/T_{i+1}(1/rho) = 2 R_a^{i+1} /
    (1 + R_a^{2(i+1)}), so the two are equal to working precision once R_a^{2(i+1)} < u and
    only the evaluation errors separate them (measured: b exceeds rate by up to 1.3e-13)."""
    if b <= tiny:
        return True
    return b <= rate * (1 + _evaluation_error(b)) * (1 + _rate_error(i)) + tiny


def test_rate_bound_check_fails_without_the_factor_two():
    """_below_rate_bound can fail: 1/T_{i+1}(1/rho) ~ 2 R_a^{i+1} exceeds R_a^{i+1} (the
    rate bound without its factor 2) by far more than the evaluation errors."""
    for kappa, i in ((10.0, 0), (10.0, 30), (1e4, 200)):
        b = float(bounds.chebyshev_bound(kappa, i))
        assert not _below_rate_bound(b, 0.5 * float(bounds.chebyshev_rate_bound(kappa, i)), i)


@given(kappas, iters)
def test_chebyshev_bound_for_exact_constants_reduces_to_paper_bound(kappa, i):
    L, mu = kappa, 1.0
    step, rho2 = 2.0 / (L + mu), ((L - mu) / (L + mu)) ** 2
    general = float(bounds.chebyshev_bound_for_constants(step, rho2, mu, L, i))
    paper = float(bounds.chebyshev_bound(kappa, i))
    assert general == pytest.approx(paper, **_general_form_tolerance(paper, i))


def _general_form_tolerance(paper: float, i: int) -> dict:
    """The general form evaluates T_{i+1} at t = (1 - step lam)/rho', |t| ~ 1 at lam = mu, L,
    with the ends moved out 4u (1 + |t|) = 8u and t's own roundings (step, the product, the
    difference, rho' = sqrt(rho2)) <= 8u more: T_k has slope k^2 at |t| = 1, so the value moves
    by <= 16u (i + 1)^2 relative (2.9e-10 at i = 400); both forms' log-domain evaluation adds
    2 _evaluation_error. As kappa -> 1, 1 - step lam cancels to an absolute few u: abs 2^-50."""
    return dict(rel=16 * U64 * (i + 1) ** 2 + 2 * _evaluation_error(paper), abs=2.0**-50)


def test_general_form_check_fails_one_degree_off():
    """The tolerance above catches a general form one degree off (T_{i+2} in place of T_{i+1}):
    consecutive bounds differ by a factor ~R_a (1 - 2e-3 at kappa = 1e6, i = 400)."""
    for kappa, i in ((1.5, 0), (10.0, 30), (1e6, 400)):
        step, rho2 = 2.0 / (kappa + 1.0), ((kappa - 1.0) / (kappa + 1.0)) ** 2
        late = float(bounds.chebyshev_bound_for_constants(step, rho2, 1.0, kappa, i + 1))
        paper = float(bounds.chebyshev_bound(kappa, i))
        assert late != pytest.approx(paper, **_general_form_tolerance(paper, i))


@given(kappas, iters)
def test_gd_bound_for_step_reduces_to_paper_bound(kappa, i):
    L, mu = kappa, 1.0
    got = float(bounds.gd_bound_for_step(2.0 / (L + mu), mu, L, i))
    assert got == pytest.approx(float(bounds.gd_bound(kappa, i)), **_gd_step_tolerance(kappa, i))


def _gd_step_tolerance(kappa: float, i: int) -> dict:
    """Each factor |1 - step lam| (step = fl(2/(L + mu)): 2 roundings; the product and the
    difference: 2 more, on a term <= 2) is within an absolute 6u of rho = (k - 1)/(k + 1), itself
    3 roundings: relative delta = 6u/rho + 3u per factor, compounded i times, and pow's ulp:
    (1 + delta)^i (1 + 2u) - 1. The old rel 1e-12 (i + 1) failed at kappa = 1 + 1e-10, i = 1
    (rho = 5e-11: relative 5e-11, the cancellation in 1 - step mu). abs: underflow."""
    rho = (kappa - 1.0) / (kappa + 1.0)
    if rho == 0.0:  # kappa = 1: step = 1 exactly, every factor is exactly 0
        return dict(rel=0.0, abs=0.0)
    delta = 6 * U64 / rho + 3 * U64
    growth = i * math.log1p(delta) + 2 * U64  # log of (1 + delta)^i (1 + 2u), >= 0
    return dict(rel=math.expm1(growth) if growth < 700 else math.inf, abs=1e-300)


def test_gd_step_check_fails_one_step_late():
    """The tolerance above catches an off-by-one exponent (|1 - step lam|^{i+1})
    even at kappa = 1e6, where one more factor rho changes the value by 2e-6."""
    for kappa in (1.0 + 1e-10, 2.0, 1e6):
        L, mu = kappa, 1.0
        late = float(bounds.gd_bound_for_step(2.0 / (L + mu), mu, L, 4))
        assert late != pytest.approx(
            float(bounds.gd_bound(kappa, 3)), **_gd_step_tolerance(kappa, 3)
        )


def _within_last_digit(value: float, printed: str) -> bool:
    """``value`` agrees with a printed approximation to within one unit of its last digit."""
    mantissa = printed.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(printed.lower().split("e")[1]) if "e" in printed.lower() else 0
    return abs(value - float(printed)) < 10.0 ** (exponent - decimals)


def test_gka_remark_1_numbers():
    """GKA appendix D.1 Remark 1 at kappa = 51: R ~ 0.7253, R_a ~ 0.7543 and the printed powers
    (each within one unit of its last printed digit; R^30 = 6.55e-5 is printed as 6e-5)."""
    R, Ra = float(bounds.omega_contraction(51.0)), float(bounds.contraction_rate(51.0))
    assert _within_last_digit(R, "0.7253") and _within_last_digit(Ra, "0.7543")
    printed_R = {5: "0.2", 10: "0.04", 20: "0.0016", 30: "6e-5"}
    printed_Ra = {5: "0.244", 10: "0.0597", 20: "0.0036", 30: "0.0002"}
    for k, v in printed_R.items():
        assert _within_last_digit(R**k, v), (k, R**k, v)
    for k, v in printed_Ra.items():
        assert _within_last_digit(Ra**k, v), (k, Ra**k, v)


def test_remark_1_check_can_fail():
    assert not _within_last_digit(0.7543**10, "0.0497")


@given(st.floats(1.0, 1e8), st.integers(1, 200))
def test_lemma_3_and_4_weight_schedule(kappa, r):
    """GKA Lemma 3: 2 = omega_0 >= ... >= omega_r >= omega_1* (> 1 for L > mu); Lemma 4:
    omega_i - omega_1* <= R^i (2 - omega_1*). Checked on the float64 schedule with a slack of a
    few ulps per step (the recursion rounds once per step)."""
    w = solvers.chebyshev_weights(kappa, 1.0, r)
    rho = float(bounds.rho(kappa, 1.0))
    ws = float(bounds.omega_star(rho))
    ulp = 2.0**-52 * 2.0
    assert float(w[0]) == 2.0
    assert bool((w[1:] <= w[:-1] + 4 * ulp).all())
    assert float(w.min()) >= ws - 8 * ulp
    i = torch.arange(r + 1, dtype=torch.float64)
    gap = bounds.omega_gap_bound(kappa, i)
    assert bool((w - ws <= gap + 8 * ulp * (i + 1)).all())


def test_omega_star_is_the_fixed_point():
    for rho in (0.0, 1e-8, 0.5, 0.96, 0.9999):
        ws = float(bounds.omega_star(rho))
        assert 4.0 / (4.0 - rho**2 * ws) == pytest.approx(ws, rel=_FIXED_POINT_REL)


# omega_1* = 2/(1 + sqrt(1 - rho^2)) is within gamma_4 of its value at the rounded rho^2 (1 - r2,
# sqrt, +, /); the map w -> 4/(4 - rho^2 w) has slope rho^2 w^2 / 4 <= 1 there and adds 3 roundings
# (the product, the difference, the division), and the test's rho**2 is the same rounded r2:
# gamma_{4 + 4 + 3} = gamma_11 relative
_FIXED_POINT_REL = gamma(11, U64)


def test_fixed_point_check_fails_without_the_factor_two():
    """The fixed-point check can fail: 1/(1 + sqrt(1 - rho^2)) (omega_1* without its factor 2) is
    not a fixed point (both roots of rho^2 w^2 - 4 w + 4 = 0 are: test_broken_omega_star_fails_lemma_3
    tells them apart)."""
    for rho in (1e-8, 0.5, 0.9999):
        half = 1.0 / (1.0 + math.sqrt(1.0 - rho**2))
        assert 4.0 / (4.0 - rho**2 * half) != pytest.approx(half, rel=_FIXED_POINT_REL)


def test_broken_omega_star_fails_lemma_3():
    """The Lemma 3 check can fail: omega_2* (the other root) is not a lower bound of the schedule."""
    rho = 0.9
    omega2 = 2 * (1 + math.sqrt(1 - rho**2)) / rho**2
    w = solvers.chebyshev_weights(19.0, 1.0, 30)
    assert float(w.min()) < omega2


def test_broken_lemma_4_rate_fails():
    """The Lemma 4 check can fail: R_a^2 (faster than the true rate) is violated."""
    kappa = 51.0
    w = solvers.chebyshev_weights(kappa, 1.0, 40)
    ws = float(bounds.omega_star(float(bounds.rho(kappa, 1.0))))
    i = torch.arange(41, dtype=torch.float64)
    too_fast = (float(bounds.omega_contraction(kappa)) ** 2) ** i * (2 - ws)
    assert bool((w - ws > too_fast)[1:10].any())


# ------------------------------------------------ paper bounds vs exact replays (float64 data)

SYSTEMS = [
    spd_system(8, k, kind, seed=s)
    for k in (10.0, 1e3)
    for kind in ("geometric", "outliers")
    for s in (0, 1)
]


@pytest.mark.parametrize("S", SYSTEMS, ids=lambda S: f"{S.kind}-k{S.kappa:g}-s{S.seed}")
def test_paper_bounds_hold_for_exact_constant_replays(S):
    """With the paper's constants (mpmath from L, mu) and the spectrum in [mu, L], the replays
    obey the printed bounds at every iterate: Chebyshev 1/T_{i+1}(1/rho) <= 2 R_a^{i+1}, GD
    ((k-1)/(k+1))^i, AGD Nesterov, CG 2 R_a^i (H-norm) and sqrt(kappa) 2 R_a^i (2-norm).
    Slack: the float64 H's eigenvalues differ from the prescribed [mu, L] by ~1e-16 relative
    (bounds.with_evaluation_slack's k^2 u covers the resulting change of T_k)."""
    n = 60
    i = torch.arange(n + 1, dtype=torch.float64)
    slack = lambda b: bounds.with_evaluation_slack(b, i) * (1 + 4 * 2.0**-53 * (i + 1) ** 2)  # noqa: E731
    cases = {
        "chebyshev": bounds.chebyshev_bound(S.kappa, i),
        "gd": bounds.gd_bound(S.kappa, i),
        "agd": bounds.agd_bound(S.kappa, i),
    }
    for method, b in cases.items():
        rep = gt.replay(method, S.H, S.q, iters=n, L=S.L, mu=S.mu, constants="exact")
        assert bool((rep.truncation <= slack(b)).all()), method
    rep = gt.replay("cg", S.H, S.q, iters=n)
    assert bool((rep.truncation_H <= slack(bounds.cg_bound(S.kappa, i))).all())
    assert bool((rep.truncation <= slack(bounds.cg_bound_2norm(S.kappa, i))).all())
    b, rate = bounds.chebyshev_bound(S.kappa, i), bounds.chebyshev_rate_bound(S.kappa, i)
    assert all(_below_rate_bound(float(b[j]), float(rate[j]), j) for j in range(n + 1))


def test_chebyshev_bound_is_attained_on_the_extreme_eigenvectors():
    """D = 2 with eigenvalues exactly mu and L: |P_{i+1}| = 1/T_{i+1}(1/rho) at both, so the
    replay's truncation equals the bound (to float64 evaluation): the bound is tight."""
    S = spd_system(2, 10.0, seed=0)
    rep = gt.replay("chebyshev", S.H, S.q, iters=30, L=S.L, mu=S.mu, constants="exact")
    b = bounds.chebyshev_bound(S.kappa, torch.arange(31.0))
    assert bool(((rep.truncation / b - 1).abs() <= _attained_tolerance(S, b)).all())


def _attained_tolerance(S, b: torch.Tensor) -> torch.Tensor:
    """|truncation / bound - 1| at iterate i: the stored H's eigenvalues (mpmath, rounded: + u L)
    sit d_lam from mu and L, i.e. t = (1 - step lam)/rho sits 2 d_lam/(L - mu) from +-1, where T_k
    has slope k^2: (i + 1)^2 2 d_lam/(L - mu); plus b's _evaluation_error and the readout's u
    (measured: 5.2e-14 at i = 30, bound 2.5e-13)."""
    lam = gt.exact_solution(S.H, S.q).eigenvalues
    d_lam = max(abs(float(lam[0]) - S.mu), abs(float(lam[-1]) - S.L)) + U64 * S.L
    k = torch.arange(1, b.numel() + 1, dtype=torch.float64)
    evaluation = torch.tensor([_evaluation_error(float(x)) for x in b], dtype=torch.float64)
    return k**2 * 2 * d_lam / (S.L - S.mu) + evaluation + U64


def test_attained_check_fails_against_the_rate_bound():
    """The tightness check can fail: 2 R_a^{i+1} (not attained; 1/T_{i+1} = 2 R_a^{i+1} /
    (1 + R_a^{2(i+1)})) is off by R_a^2 = 0.27 at i = 0."""
    S = spd_system(2, 10.0, seed=0)
    rep = gt.replay("chebyshev", S.H, S.q, iters=30, L=S.L, mu=S.mu, constants="exact")
    rate = bounds.chebyshev_rate_bound(S.kappa, torch.arange(31.0))
    assert not bool(((rep.truncation / rate - 1).abs() <= _attained_tolerance(S, rate)).all())


def _eq4_holds(case, T: int, exact, kappa_bound: float) -> bool:
    """mu <= lam_min, lam_max <= L and kappa <= kappa_bound for the stored A = fl(H + lam I), up to
    the rounding of the stored data (Weyl's inequality for each perturbation, Higham's gamma_n):
    * lower end: H (exact, of the stored keys) is PSD; the stored H differs by <= gamma_{T+2} tr H
      in the 2-norm (T-term sums of w k_i k_j, and the symmetrisation); A's diagonal rounds once
      (u max A_ii); the mp eigenvalue rounds to float64 (u mu);
    * upper end: lam_max(H) <= ||H||_F, computed to gamma_{D^2 + 1}; L = fl(fro + lam) one more,
      A's diagonal and the eigenvalue's rounding two more: gamma_{D^2 + 5} relative;
    * kappa: the two ends, L / mu vs (a + 1)/a (3 roundings each side) and the float ratio: + gamma_7.
    Rank one (T = 1) attains both ends: the measured lam_min is 17u below mu at a = 0.01."""
    A, D = case.ridge.A, case.ridge.A.shape[-1]
    mu, L = float(case.ridge.mu), float(case.ridge.L)
    lo = gamma(T + 2, U64) * float(torch.trace(case.H)) + U64 * float(A.diagonal().max()) + U64 * mu
    hi = gamma(D * D + 5, U64)
    lam = exact.eigenvalues
    return (
        float(lam[0]) >= mu - lo
        and float(lam[-1]) <= L * (1 + hi)
        and float(exact.kappa) <= kappa_bound * (1 + hi + gamma(7, U64)) / (1 - lo / mu)
    )


def test_eq4_ridge_kappa_bound():
    """GKA eq. (4): kappa(H + a||H||_F I) <= (a + 1)/a, from the exact (mpmath) spectrum; at
    T = 40 keys far inside the interval, at T = 1 (rank-one H) at both of its ends."""
    from analysis.testing.strategies import ridge_system

    for a in (0.01, 0.02, 0.1):
        for T in (40, 1):
            case = ridge_system(12, a, T=T, seed=3)
            exact = gt.exact_solution(case.ridge.A, case.q)
            assert _eq4_holds(case, T, exact, case.ridge.kappa_bound)


def test_eq4_check_fails_for_wrong_ends_or_bound():
    """The eq. (4) check can fail, on the rank-one H that attains both ends: for kappa <= 1/a
    (the bound without its + 1), for L = ||H||_F (without lambda) and for mu 0.1 % too large."""
    import dataclasses

    from analysis.testing.strategies import ridge_system

    for a in (0.01, 0.1):
        case = ridge_system(12, a, T=1, seed=3)
        exact = gt.exact_solution(case.ridge.A, case.q)
        assert not _eq4_holds(case, 1, exact, 1.0 / a)
        r = case.ridge
        for wrong in (dict(L=r.L - r.lam), dict(mu=r.mu * (1 + 1e-3))):
            bad = dataclasses.replace(case, ridge=dataclasses.replace(r, **wrong))
            assert not _eq4_holds(bad, 1, exact, r.kappa_bound), wrong


def test_checks_spectral_interval_contains_the_mp_eigenvalues():
    S = spd_system(6, 1e3, seed=4)
    split = gt.error_split("chebyshev", S.H, S.q, iters=3, L=S.L, mu=S.mu)
    lo, hi = checks.spectral_interval(split)
    with mpmath.workdps(50):
        from analysis.references import mp as amp

        ev = mpmath.eigsy(amp.to_mp(S.H), eigvals_only=True)
        assert mpmath.mpf(float(lo)) <= min(ev) and max(ev) <= mpmath.mpf(float(hi))
