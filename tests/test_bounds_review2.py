"""Second review of bad input at the public boundary of analysis.bounds (checks, cholesky,
iterative, kla_kernel): a clear error naming the argument, never a traceback from inside
torch, never a NaN bound, and never a pass where no bound applied."""

import math

import pytest
import torch

from analysis.bounds import checks
from analysis.bounds import cholesky as ch
from analysis.bounds import iterative as it
from analysis.bounds.kla_kernel import kla_kernel_bound
from analysis.references import iterative as gt

F64 = torch.float64
INF = math.inf

# ----------------------------------------------------------------------- a-priori bounds


@pytest.mark.parametrize(
    "name", ["chebyshev_bound", "chebyshev_rate_bound", "gd_bound", "omega_gap_bound"]
)
@pytest.mark.parametrize("i", [0, 3])
def test_apriori_bound_at_infinite_kappa_is_inf_not_nan(name, i):
    # kappa = inf is allowed ("no bound"); it gave NaN (inf / inf), which no comparison fails
    assert math.isinf(float(getattr(it, name)(INF, i)))
    assert math.isinf(float(getattr(it, name)(torch.tensor([4.0, INF]), i)[1]))


def test_rates_at_infinite_kappa_are_their_limit_one():
    assert float(it.contraction_rate(INF)) == 1.0  # was NaN
    assert float(it.omega_contraction(INF)) == 1.0  # was NaN


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda: it.gd_bound(torch.full((2,), 4.0), torch.arange(3)), "kappa and i"),
        (lambda: it.chebyshev_bound(torch.full((2,), 4.0), torch.arange(3)), "kappa and i"),
        (lambda: it.rho(torch.full((2,), 4.0), torch.ones(3)), "L and mu"),
        (lambda: it.gd_bound_for_step(torch.ones(2), torch.ones(3), 2.0, 1), "step"),
        (
            lambda: it.chebyshev_bound_for_constants(
                0.5, 0.25, torch.ones(2), 2.0, torch.arange(3)
            ),
            "lam_min",
        ),
        (lambda: it.with_evaluation_slack(torch.ones(2), torch.arange(3)), "bound and i"),
        (lambda: it.log_chebyshev_t(torch.arange(2), torch.full((3,), 2.0)), "k and x"),
    ],
)
def test_apriori_shapes_that_do_not_broadcast_are_named(call, what):
    # was torch's RuntimeError "The size of tensor a (2) must match ..."
    with pytest.raises(ValueError, match=f"batch shapes of .*{what}"):
        call()


@pytest.mark.parametrize(
    "L, mu, what", [(INF, 1.0, "L"), (INF, INF, "L"), (torch.tensor([2.0, INF]), 1.0, "L")]
)
def test_rho_rejects_infinite_spectrum_ends(L, mu, what):
    with pytest.raises(ValueError, match=what):  # rho(inf, 1) was NaN
        it.rho(L, mu)


@pytest.mark.parametrize(
    "k, x, exc, what",
    [(2, 0.5, ValueError, "x must be >= 1"), (2, math.nan, ValueError, "x"),
     ("a", 2.0, TypeError, "k")],
)  # fmt: skip
def test_log_chebyshev_t_checks_its_domain(k, x, exc, what):
    # x < 1 was clamped to 1 (log T_2(0.5) "= 0"), NaN gave NaN, a str a torch error
    with pytest.raises(exc, match=what):
        it.log_chebyshev_t(k, x)


@pytest.mark.parametrize(
    "args, what",
    [
        ((INF, 1.0, 2.0), "step"),
        ((0.5, INF, 2.0), "lam_min"),
        ((0.5, 1.0, INF), "lam_max"),
    ],
)
def test_step_bounds_reject_non_finite_constants(args, what):
    step, lo, hi = args
    with pytest.raises(ValueError, match=what):  # gd: NaN for step = inf, lam_min = 0
        it.gd_bound_for_step(step, lo, hi, 3)
    with pytest.raises(ValueError, match=what):  # chebyshev: lam_min = inf gave 0.0103
        it.chebyshev_bound_for_constants(step, 0.25, lo, hi, 3)


def test_chebyshev_bound_for_constants_end_that_overflows_is_not_ignored():
    # step lam_min overflows to -inf; widening it gave inf - inf = NaN, read as |t| <= 1: 0.5
    assert math.isinf(float(it.chebyshev_bound_for_constants(1e200, 0.25, 1e200, 1e-200, 0)))


def test_with_evaluation_slack_rejects_a_negative_bound():
    with pytest.raises(ValueError, match="bound must be >= 0"):  # -1 gave -1: any ratio passed
        it.with_evaluation_slack(-1.0, 1)


@pytest.mark.parametrize("r, exc", [(math.nan, ValueError), (2.0, ValueError), ("a", TypeError)])
def test_omega_star_checks_rho(r, exc):
    with pytest.raises(exc, match="rho"):  # NaN gave 1.0, 2 gave NaN, "a" a torch error
        it.omega_star(r)


def test_apriori_fixes_keep_good_values():
    assert float(it.omega_star(0.0)) == 1.0 and float(it.omega_star(1.0)) == 2.0
    assert float(it.gd_bound_for_step(0.5, 1.0, 3.0, 2)) == 0.25
    # log T_1(2) = acosh 2 + log1p(exp(-2 acosh 2)) - log 2 = 1.317 + 0.069 - 0.693, u = 2^-53:
    # acosh (1 ulp) and the two sums give 4u on 1.317; the log1p term 12u (exp of an argument
    # carrying 4u times 2.6, exp and log1p 1 ulp each); log 2 and the difference 2u on 0.693:
    # absolute 7.4u, i.e. 10.7u = 1.2e-15 relative
    acosh2 = math.acosh(2.0)
    small = math.log1p(math.exp(-2 * acosh2))
    rel = (4 * acosh2 + 12 * small + 2 * math.log(2.0)) * 2.0**-53 / math.log(2.0)
    assert float(it.log_chebyshev_t(1, 2.0)) == pytest.approx(math.log(2.0), rel=rel)
    k = torch.tensor([4.0, 9.0], dtype=F64)
    kc = k.clone()
    assert torch.isfinite(it.chebyshev_bound(k, torch.tensor([[0], [5]]))).all()
    assert torch.equal(k, kc)


# ----------------------------------------------------------------------- Cholesky


@pytest.mark.parametrize("lower", [None, "no", 1])
def test_substitution_backward_error_lower_must_be_a_bool(lower):
    T = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=F64)
    x = torch.ones(2, dtype=F64)
    with pytest.raises(TypeError, match="lower"):  # "no" was read as True, None as False
        ch.substitution_backward_error(T, x, 2 * x, lower=lower)


# ----------------------------------------------------------------------- KLA kernel


def _kern(**kw):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 2, 3, dtype=F64, generator=g)
    v = torch.randn(4, 2, 2, dtype=F64, generator=g)
    args = dict(alpha=0.9, eta=1.0, input_precision="bf16", input_dtype=torch.float32) | kw
    return kla_kernel_bound(args.pop("q", q), args.pop("k", q), args.pop("v", v), **args)


def test_kla_kernel_bound_float_chunk_size_is_named():
    with pytest.raises(ValueError, match="chunk_size"):  # 16.0 was a TypeError from range()
        _kern(chunk_size=16.0)


@pytest.mark.parametrize("kw", [dict(eta=1e300), dict(k=torch.full((4, 2, 3), 1e200, dtype=F64))])
def test_kla_kernel_bound_that_overflows_is_inf_not_nan(kw):
    B, E = _kern(**kw)
    assert not torch.isnan(B).any() and not torch.isnan(E).any()
    assert torch.isinf(B).any()


# ----------------------------------------------------------------------- checks

H = torch.diag(torch.tensor([1.0, 2.0, 4.0], dtype=F64))
Q = torch.ones(3, dtype=F64)


@pytest.fixture(scope="module")
def agd():
    return gt.error_split("agd", H, Q, iters=3, L=4.0, mu=1.0)


@pytest.mark.parametrize(
    "L, mu, exc, what",
    [
        (4.0, None, TypeError, "L and mu"),
        (math.nan, 1.0, ValueError, "L"),
        (4.0, 0.0, ValueError, "mu must be > 0"),
        (4.0, -1.0, ValueError, "mu must be > 0"),
        (1.0, 4.0, ValueError, "L must be >= mu"),
        (torch.full((5,), 4.0), 1.0, ValueError, "L"),
        ("4", 1.0, TypeError, "L"),
    ],
)
@pytest.mark.parametrize("fn", [checks.check, checks.truncation_bounds, checks.allowance])
def test_checks_reject_bad_spectrum_bounds(agd, fn, L, mu, exc, what):
    # mu = 0 or -1 gave CheckResult(truncation=0, rounding=0): a pass; NaN L dropped the allowance
    with pytest.raises(exc, match=what):
        fn(agd, L, mu)


def test_checks_reject_a_non_split():
    with pytest.raises(TypeError, match="split"):  # was AttributeError: 'str' ... 'method'
        checks.check("split")


@pytest.mark.parametrize("method", ["cg", "agd"])
def test_check_with_no_bound_is_not_a_pass(method):
    """An indefinite stored matrix: infinite truncation bound and no allowance, every ratio 0
    ("no claim"). That is inconclusive, and check() reported passes = True."""
    Hi = torch.diag(torch.tensor([-1.0, 2.0, 4.0], dtype=F64))
    LM = dict(L=4.0, mu=1.0) if method == "agd" else {}
    split = gt.error_split(method, Hi, Q, iters=2, **LM)
    res = checks.check(split, *LM.values())
    assert res.truncation == 0.0 and res.rounding == 0.0
    assert not res.conclusive and not res.passes


def test_check_good_run_still_passes_and_inputs_unchanged(agd):
    L, mu = torch.tensor(4.0, dtype=F64), torch.tensor(1.0, dtype=F64)
    ev = agd.exact.eigenvalues.clone()
    res = checks.check(agd, L, mu)
    assert res.conclusive and res.passes
    assert float(L) == 4.0 and float(mu) == 1.0 and torch.equal(ev, agd.exact.eigenvalues)
