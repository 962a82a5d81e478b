"""Outside-in review of analysis.testing.strategies: a bad option is a named error when the
strategy is built, and every draw keeps the documented promises (kappa range, sizes, domains)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.testing import strategies as S
from analysis.testing.strategies.gates import _RANGES

u64 = 2.0**-53  # unit roundoff of float64


def draws(strategy, n: int = 25) -> list:
    """The first ``n`` derandomised draws (the same on every run)."""
    out = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(strategy)
    def collect(x):
        out.append(x)

    collect()
    return out


# ---------------------------------------------------------------- bad options at call time

BAD = [
    # (call, exception, the argument named in the message)
    (lambda: S.bf16_vectors(-1), ValueError, "n must be"),
    (lambda: S.bf16_matrices(-1, 2), ValueError, "rows must be"),
    (lambda: S.bf16_tensors((2.5,)), TypeError, "shape entry"),
    (lambda: S.bf16_tensors((2,), dtype=torch.float16), TypeError, "dtype"),
    (lambda: S.bf16_tensors((2,), dtype=torch.int32), TypeError, "dtype"),
    (lambda: S.bf16_floats(0.1001, 0.1002), ValueError, "no bf16 value"),
    (lambda: S.bf16_floats(0.0, 0.0, allow_zero=False), ValueError, "no bf16 value"),
    (lambda: S.bf16_floats("a", 1.0), TypeError, "min_value"),
    (lambda: S.bf16_floats(min_magnitude=math.inf), ValueError, "min_magnitude"),
    (lambda: S.log_gates(-1), ValueError, "T must be"),
    (lambda: S.log_gate_sequences(-1), ValueError, "T must be"),
    (lambda: S.log_gate_sequences(4, regimes=()), ValueError, "regimes"),
    (lambda: S.log_gate_sequences(4, regimes="moderate"), TypeError, "regimes"),
    (lambda: S.log_gate_sequences(4, regimes=("bogus",)), ValueError, "regimes"),
    (lambda: S.log_gate_values(4, "bogus"), ValueError, "regime"),
    (lambda: S.log_gate_values(2.5), TypeError, "T must be"),
    (lambda: S.gka_cases(max_T=0), ValueError, "max_T"),
    (lambda: S.gka_cases(a_range=(-1.0, 0.5)), ValueError, r"a_range\[0\]"),
    (lambda: S.gka_cases(a_range=(0.0, 0.5)), ValueError, r"a_range\[0\]"),
    (lambda: S.gka_cases(a_range=(1.0, 0.5)), ValueError, r"a_range\[0\] must be <="),
    (lambda: S.gka_cases(regimes=()), ValueError, "regimes"),
    (lambda: S.gka_case(a=-1.0), ValueError, "a must be"),
    (lambda: S.gka_case(T=0), ValueError, "T must be"),
    (lambda: S.gka_sequences(min_T=0, max_T=0), ValueError, "min_T"),
    (lambda: S.gka_sequences(min_T=3, max_T=2), ValueError, "min_T must be <= max_T"),
    (lambda: S.gka_sequences(a=(-0.1,)), ValueError, "a: a must be"),
    (lambda: S.gka_sequences(a=0.1), TypeError, "a must be a sequence"),
    (lambda: S.gka_sequences(max_entry=1e-3), ValueError, "max_entry"),
    (lambda: S.gka_sequences(min_log_gate=1.0), ValueError, "min_log_gate"),
    (lambda: S.gka_systems(min_dim=0), ValueError, "min_dim"),
    (lambda: S.gka_systems(a=(0.0,)), ValueError, "a: a must be"),
    (lambda: S.gka_systems(max_keys=0), ValueError, "max_keys"),
    (lambda: S.eigenvalue_bounds(min_kappa=0.5), ValueError, "min_kappa"),
    (lambda: S.eigenvalue_bounds(min_kappa=100.0, max_kappa=10.0), ValueError, "min_kappa"),
    (lambda: S.eigenvalue_bounds(max_kappa=math.inf), ValueError, "max_kappa"),
    (lambda: S.eigenvalue_bounds(min_kappa=1.0, max_kappa=1.0), ValueError, "max_kappa > 1"),
    (lambda: S.ridge_system(0, 0.1), ValueError, "D must be"),
    (lambda: S.ridge_system(4, 0.1, T=0), ValueError, "T must be"),
    (lambda: S.ridge_systems(min_dim=5, max_dim=2), ValueError, "min_dim"),
    (lambda: S.ridge_systems(a=(-1.0,)), ValueError, "a: a must be"),
    (lambda: S.spectra(max_kappa=0.5), ValueError, "max_kappa"),
    (lambda: S.spectra(kinds="geometric"), TypeError, "kinds"),
    (lambda: S.spectra(kinds=("bogus",)), ValueError, "kinds"),
    (lambda: S.spd_matrices(max_kappa=math.nan), ValueError, "max_kappa"),
    (lambda: S.spd_systems(min_kappa=0.5), ValueError, "min_kappa"),
    (lambda: S.spd_systems(min_kappa=100.0, max_kappa=10.0), ValueError, "min_kappa"),
    (lambda: S.spd_systems(min_dim=0, max_dim=0), ValueError, "min_dim"),
    (lambda: S.spd_systems(min_dim=1, min_kappa=10.0), ValueError, "min_dim = 1"),
    (lambda: S.spd_system(4, math.inf), ValueError, "kappa"),
    (lambda: S.spectrum(1, 10.0), ValueError, "D = 1"),
    (lambda: S.spectrum(4, 10.0, lam_max=-1.0), ValueError, "lam_max"),
    (lambda: S.spd_matrix(torch.tensor([-1.0, 2.0])), ValueError, "eigenvalues"),
    (lambda: S.haar_orthogonal(0), ValueError, "D must be"),
    (lambda: S.log_uniform_spd(4, 2, 0.5, 1.0, torch.Generator()), ValueError, "kappa"),
    (lambda: S.log_uniform_spd(4, 2, 10.0, -1.0, torch.Generator()), ValueError, "scale"),
    (lambda: S.spd_batch([]), ValueError, "systems"),
    (lambda: S.kla_cases(max_T=0), ValueError, "max_T"),
    (lambda: S.kla_cases(coefficients=("bogus",)), ValueError, "coefficients"),
    (lambda: S.kla_cases(coefficients="kaczmarz"), TypeError, "coefficients"),
    (lambda: S.kla_cases(eps_choices=(-1.0,)), ValueError, "eps_choices"),
    (lambda: S.kla_case(0), ValueError, "T must be"),
    (lambda: S.kla_case(4, coefficient="bogus"), ValueError, "coefficient"),
    (lambda: S.kla_case(4, near_zero_keys=-1), ValueError, "near_zero_keys"),
    (lambda: S.kla_case(4, key_norms=(0.0, 1.0)), ValueError, "key_norms"),
    (lambda: S.kla_case(4, chunk_size=0), ValueError, "chunk_size"),
    (lambda: S.consistent_systems(max_kappa=0.5), ValueError, "max_kappa"),
    (lambda: S.consistent_systems(tall=False, max_n=1), ValueError, "max_n"),
    (lambda: S.consistent_systems(max_row_scale=0.5), ValueError, "max_row_scale"),
    (lambda: S.consistent_system(4, 3, kappa=0.5), ValueError, "kappa"),
    (lambda: S.consistent_system(0, 3), ValueError, "m must be"),
    (lambda: S.consistent_system(4, 3, row_scales=(0.0, 1.0)), ValueError, "row_scales"),
]


@pytest.mark.parametrize("call, exc, name", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_option_is_a_named_error_at_call_time(call, exc, name):
    with pytest.raises(exc, match=name):
        call()  # building the strategy, before any draw


# ---------------------------------------------------------------- promises kept on every draw


def test_spd_systems_kappa_within_the_requested_range():
    lo, hi = 1.5, 50.0
    for s in draws(S.spd_systems(min_dim=2, max_dim=4, min_kappa=lo, max_kappa=hi)):
        # the strategy picks kappa in [lo, hi]; the stored ends are 1 and fl(1/kappa), and
        # SPDSystem.kappa = fl(1 / fl(1/kappa)): two roundings of float64 division
        slack = (1 + u64) / (1 - u64)
        assert lo / slack <= s.kappa <= hi * slack, s.kappa
        # eigvalsh of the stored H: within 4 D u ||H|| * 4 of the prescribed eigenvalues, the
        # bound of tests/test_strategies_spd.py (backward-stable eigvalsh, Q orthogonal to ~D u)
        ev = torch.linalg.eigvalsh(s.H)
        assert float((ev - s.eigenvalues).abs().max()) <= 16 * s.D * u64 * s.L


def test_spectra_kappa_at_most_max_kappa():
    for lam, _ in draws(S.spectra(min_dim=2, max_dim=3, max_kappa=3.0)):
        assert float(lam[-1] / lam[0]) <= 3.0 * (1 + u64) / (1 - u64)  # as above


def test_spectra_dimension_one_is_kappa_one():
    for lam, _ in draws(S.spectra(min_dim=1, max_dim=1, max_kappa=10.0), 5):
        assert lam.tolist() == [1.0]


def test_eigenvalue_bounds_kappa_exactly_in_range():
    lo, hi = 50.0, 2.0e4
    for strict in (True, False):
        for L, mu in draws(S.eigenvalue_bounds(min_kappa=lo, max_kappa=hi, strict=strict)):
            assert L > mu > 0 and lo <= L / mu <= hi  # as computed in float64: no slack


def test_log_gate_values_mixed_draws_from_the_three_regimes():
    for g in draws(S.log_gate_values(6, "mixed"), 10):
        assert g.shape == (6,)
        for x in g.tolist():
            assert any(lo <= x <= hi for lo, hi in _RANGES.values())


def test_consistent_systems_respect_max_m():
    for s in draws(S.consistent_systems(max_m=3, max_n=8, tall=True), 15):
        m, n = s.A.shape
        assert n <= m <= 3


def test_gka_systems_entries_within_max_entry():
    for case in draws(S.gka_systems(max_dim=2, max_keys=2, max_entry=0.5), 10):
        assert all(abs(x) <= 0.5 for key in case.keys for x in key)
        assert any(x != 0.0 for key in case.keys for x in key)  # ||H||_F > 0


def test_builders_reproducible_and_draws_not_aliased():
    a, b, c = (S.spd_system(5, 10.0, seed=s) for s in (3, 3, 4))
    assert torch.equal(a.H, b.H) and torch.equal(a.q, b.q) and not torch.equal(a.H, c.H)
    ka, kb = S.kla_case(5, seed=1), S.kla_case(5, seed=1)
    assert torch.equal(ka.k, kb.k) and not torch.equal(ka.k, S.kla_case(5, seed=2).k)

    # a kernel that writes into its inputs must not change the next draws
    def run(mutate):
        out = []
        for s in draws(S.spd_systems(max_dim=3), 5):
            out.append(s.H.clone())
            if mutate:
                s.H.mul_(7.0)
        return out

    assert all(torch.equal(x, y) for x, y in zip(run(False), run(True)))


def test_strategies_compose_with_combinators():
    s = st.one_of(
        S.spd_systems(max_dim=3, max_kappa=10.0).map(lambda s: s.kappa),
        st.tuples(S.eigenvalue_bounds(max_kappa=10.0)).map(lambda t: t[0][0] / t[0][1]),
        S.gka_cases(max_T=2, max_D=2).map(lambda c: 1.0 + c.a),
    ).filter(lambda k: k >= 1.0)
    assert all(1.0 <= k <= 10.0 * (1 + u64) / (1 - u64) for k in draws(s, 10))
    assert draws(S.log_gate_sequences(3).map(lambda g: g.shape), 3)[0] == (3,)
