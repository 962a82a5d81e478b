"""solvers.kaczmarz: the closed form of a sweep, convergence bounds, rounding vs mpmath, bad input.

Bounds used (analysis.bounds.kaczmarz, docs/kla.md):
* pyamg's closed form of one cyclic sweep, ``x0 + A^T (D_eps/omega + L)^{-1} (b - A x0)`` -- an
  identity, evaluated exactly in mpmath; the float64 sweep may differ from it only by its own
  rounding, held to the running bound ``kaczmarz_rounding_bound`` (gamma_n / gamma_{n+4}-sized
  local errors carried through the exact linear parts of the later steps).
* cyclic convergence: ``||e_k|| <= ||M^k||_2 ||e_0||`` with M the sweep operator (exact).
* randomized convergence (Strohmer-Vershynin 2009, Thm. 2): ``E||e_k||^2 <= (1 - 1/kappa_F^2)^k
  ||e_0||^2``, checked on the exact expectation (second-moment recursion) and the sampler
  checked against that expectation by the central limit theorem (6 standard errors).
"""

import importlib
import math

import mpmath
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from analysis.bounds.kaczmarz import (
    cyclic_error_bound,
    gamma,
    kaczmarz_rounding_bound,
    random_expected_sq_error,
    strohmer_vershynin_rate,
)
from analysis.precision import PRECISIONS
from analysis.references import mp as amp
from analysis.references.kaczmarz import (
    kaczmarz_limit,
    mp_kaczmarz,
    mp_sweep_closed_form,
    working_scalar,
)
from analysis.testing.strategies import consistent_system, consistent_systems
from solvers import Status, kaczmarz

kz = importlib.import_module("solvers.kaczmarz")
F64 = torch.float64
U64 = 2.0**-53


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- closed form


def sweep_identity_gap(A, b, x0, relaxation=1.0, eps=0.0):
    """(||sweep(x0) - closed form||, bound): the float64 sweep against the exact closed form."""
    x1 = kaczmarz(A, b, sweeps=1, x0=x0, relaxation=relaxation, eps=eps)
    exact = mp_sweep_closed_form(A, b, x0, relaxation=relaxation, eps=eps)
    bound = kaczmarz_rounding_bound(
        A, b, sweeps=1, x0=x0, relaxation=relaxation, eps=eps, arith=PRECISIONS[0]
    )[-1]
    return exact.distance(x1), bound


@given(
    consistent_systems(max_kappa=1e3),
    st.floats(0.1, 1.9),
    st.sampled_from((0.0, 1e-3, 1.0)),
    st.integers(0, 2**31 - 1),
)
def test_cyclic_sweep_equals_closed_form(system, omega, eps, seed):
    # pyamg's gold identity (relaxation 1, eps 0: tril(A A^T)) and its SOR generalisation;
    # bound: the sweep's own float64 rounding (running bound, gamma_n / gamma_{n+4} per step).
    x0 = torch.randn(system.A.shape[-1], generator=_gen(seed), dtype=F64)
    gap, bound = sweep_identity_gap(system.A, system.b, x0, omega, eps)
    assert bool((gap <= bound).all()), (gap, bound)


def test_closed_form_is_the_mp_sweep():
    # The identity itself at 50 digits: replay and closed form agree to double-double resolution.
    s = consistent_system(7, 4, kappa=30, row_scales=(0.2, 1.0), seed=3)
    x0 = torch.randn(4, generator=_gen(1), dtype=F64)
    for omega, eps in ((1.0, 0.0), (1.5, 0.1)):
        replay = mp_kaczmarz(s.A, s.b, sweeps=1, x0=x0, relaxation=omega, eps=eps)[1]
        closed = mp_sweep_closed_form(s.A, s.b, x0, relaxation=omega, eps=eps)
        gap = ((replay.hi - closed.hi) + (replay.lo - closed.lo)).norm()
        assert float(gap) <= 1e-28 * float(closed.norm())  # double-double resolution ~1e-32


def test_broken_missing_normalisation_fails_identity(monkeypatch):
    s = consistent_system(6, 4, kappa=10, row_scales=(0.1, 1.0), seed=5)
    x0 = torch.zeros(4, dtype=F64)
    monkeypatch.setattr(
        kz,
        "_row_denominators",
        lambda A, b, eps, ar: (
            torch.ones(A.shape[:-1], dtype=ar.compute),
            torch.zeros(A.shape[:-1], dtype=torch.bool),
        ),
    )
    gap, bound = sweep_identity_gap(s.A, s.b, x0)
    assert bool((gap > bound).any())


def test_broken_shifted_row_order_fails_identity(monkeypatch):
    s = consistent_system(6, 4, kappa=10, seed=6)
    original = kz._sweep_rows
    monkeypatch.setattr(
        kz, "_sweep_rows", lambda A, order, batch, g: original(A, order, batch, g).roll(1, -1)
    )
    gap, bound = sweep_identity_gap(s.A, s.b, torch.zeros(4, dtype=F64))
    assert bool((gap > bound).any())


# ----------------------------------------------------------------------------- convergence


def inconsistency_drift(A, b, x_star, sweeps, omega):
    """The stored ``b = fl(A x*)`` misses ``A x*`` by ``db`` (exact, mpmath): the exact iteration on
    (A, b) drifts from the one on (A, A x*) by ``d_k = M d_{k-1} + N db``, ``N = A^T (D/omega + L)^{-1}``,
    so ``||d_k|| <= sum_{j<k} ||M^j||_2 ||N db||`` (an input error, not a rounding error)."""
    with amp.precision():
        db = [
            mpmath.mpf(bi)
            - mpmath.fdot([mpmath.mpf(a) for a in row], [mpmath.mpf(x) for x in x_star.tolist()])
            for row, bi in zip(A.tolist(), b.tolist())
        ]
    db = torch.tensor([float(d) for d in db], dtype=F64)
    T = torch.tril(A @ A.T, -1) + torch.diag((A * A).sum(-1) / omega)
    step = (A.T @ torch.linalg.solve_triangular(T, db.unsqueeze(-1), upper=False)).norm()
    powers = cyclic_error_bound(A, 1.0, sweeps, relaxation=omega)
    # float64 evaluation (first order, Higham): T's entries gamma_n; the triangular solve
    # gamma_m relative backward (Thm 8.5), so forward m cond_2(T) gamma_m (|| |B| ||_2 <= sqrt(m) ||B||_2
    # for |T^-1| and |T|); A^T and the norm gamma_{m+n}; ||M^j|| as in the test's forming term,
    # gamma_{k n + 1}; the cumulative sum gamma_k
    m, n = A.shape
    cond = float(torch.linalg.cond(T))
    rel = gamma(m + n, U64) + m * cond * gamma(m + n, U64) + gamma(sweeps * n + 1 + sweeps, U64)
    return torch.cat([torch.zeros(1, dtype=F64), torch.cumsum(powers[:-1], 0)]) * step * (1 + rel)


@given(consistent_systems(tall=True, max_kappa=1e2), st.floats(0.2, 1.8))
def test_cyclic_error_within_sweep_operator_bound(system, omega):
    # ||e_k|| <= ||M^k||_2 ||e_0|| (exact) + the drift from b's inconsistency + the rounding
    # bound of the run + float64 error of forming M^k (gamma_{k n} ||e_0||).
    sweeps = 6
    x, info = kaczmarz(system.A, system.b, sweeps=sweeps, relaxation=omega, return_info=True)
    err = (info.iterates - system.x_star).norm(dim=-1)
    e0 = system.x_star.norm()
    bound = cyclic_error_bound(system.A, e0, sweeps, relaxation=omega)
    drift = inconsistency_drift(system.A, system.b, system.x_star, sweeps, omega)
    rounding = kaczmarz_rounding_bound(
        system.A, system.b, sweeps=sweeps, relaxation=omega, arith=PRECISIONS[0]
    )
    forming = gamma(torch.arange(sweeps + 1) * system.A.shape[-1] + 1, U64) * e0
    assert bool((err <= bound + drift + rounding + forming).all()), (
        err - bound - drift - rounding - forming
    )


def test_cyclic_converges_to_the_solution_nearest_x0():
    # Underdetermined consistent system: the limit is x0 + A^+ (b - A x0) (projections never
    # leave x0 + range(A^T)).
    s = consistent_system(3, 6, kappa=5, seed=11)
    x0 = torch.randn(6, generator=_gen(2), dtype=F64)
    x = kaczmarz(s.A, s.b, sweeps=200, x0=x0)
    limit = kaczmarz_limit(s.A, s.b, x0)
    rate = float(
        torch.linalg.matrix_norm(torch.linalg.matrix_power(_sweep_on_range(s.A), 200), ord=2)
    )
    # sweep-operator bound + the run's rounding: kaczmarz_rounding_bound, ~200 sweeps x 3 rows of
    # gamma-sized steps (rounding errors in null(A) are never contracted) = 1.3e-12 here; the old
    # 1e-13 was below that (measured 4.9e-16)
    rounding = float(kaczmarz_rounding_bound(s.A, s.b, sweeps=200, x0=x0, arith=PRECISIONS[0])[-1])
    assert float(limit.distance(x)) <= rate * float(limit.distance(x0)) + rounding
    # the check can fail: a run from 0 (x0 ignored) converges to the minimum-norm solution
    x_zero = kaczmarz(s.A, s.b, sweeps=200)
    assert float(limit.distance(x_zero)) > rate * float(limit.distance(x0)) + rounding


def _sweep_on_range(A):
    from analysis.bounds.kaczmarz import sweep_operator

    M = sweep_operator(A)
    Q, _ = torch.linalg.qr(A.T)  # the error stays in range(A^T), where M contracts
    return Q.T @ M @ Q


def test_strohmer_vershynin_bound_holds_for_the_exact_expectation():
    # E||e_k||^2 (exact, no sampling) <= (1 - 1/kappa_F^2)^k ||e_0||^2, SV Thm. 2; float64
    # evaluation of both sides allowed gamma_{k n^2} relative.
    s = consistent_system(10, 4, kappa=20, row_scales=(0.05, 1.0), seed=4)
    e0 = s.x_star
    steps = 60
    expected = random_expected_sq_error(s.A, e0, steps)
    rate = strohmer_vershynin_rate(s.A)
    sv = rate ** torch.arange(steps + 1, dtype=F64) * e0.norm() ** 2
    slack = 1 + gamma(torch.arange(steps + 1) * 16 + 16, U64)
    assert bool((expected <= sv * slack).all())
    assert float(expected[-1]) < 0.5 * float(expected[0])  # not vacuous: it does contract


def random_order_sample_check(A, x_star, *, members=400, sweeps=4, seed=0):
    """(|sample mean - E|, 6 standard errors + rounding) for ||e||^2 after ``sweeps`` sweeps."""
    m = A.shape[-2]
    Ab = A.expand(members, *A.shape)
    bb = (A @ x_star).expand(members, m)
    x = kaczmarz(Ab, bb, sweeps=sweeps, order="random", generator=_gen(seed))
    sq = ((x - x_star) ** 2).sum(-1)
    exact = random_expected_sq_error(A, x_star, sweeps * m)[-1]
    stderr = sq.std() / math.sqrt(members)
    # rounding (first order, Higham's gamma): from x0 = 0 every ||e_s|| <= ||x*||, so each of the
    # k = sweeps m steps errs by <= (2 gamma_n + gamma_{n+4} + 4u) ||x*|| <= gamma_{3n+8} ||x*||
    # (kaczmarz_rounding_bound's delta_s) and the run by d = k gamma_{3n+8} ||x*||: ||e||^2 by
    # (2 ||x*|| + d) d; the sample mean gamma_{members+n}; the exact expectation gamma_{n^2 (k+1)}
    # (as in test_strohmer_vershynin_bound_holds_for_the_exact_expectation): ~2e-13 ||x*||^2 here
    n, k = A.shape[-1], sweeps * m
    d = k * gamma(3 * n + 8, U64) * float(x_star.norm())
    rounding = (
        (2 * float(x_star.norm()) + d) * d
        + gamma(members + n, U64) * float(sq.mean())
        + gamma(n * n * (k + 1), U64) * float(exact)
    )
    return float((sq.mean() - exact).abs()), float(6 * stderr) + rounding


def test_random_order_matches_exact_expectation():
    s = consistent_system(8, 3, kappa=5, row_scales=(0.02, 1.0), seed=7)
    gap, allowed = random_order_sample_check(s.A, s.x_star)
    assert gap <= allowed


def test_broken_uniform_sampling_misses_the_expectation(monkeypatch):
    s = consistent_system(8, 3, kappa=5, row_scales=(0.02, 1.0), seed=7)

    def uniform(A, order, batch, generator):
        m = A.shape[-2]
        return torch.randint(0, m, (*batch, m), generator=generator)

    monkeypatch.setattr(kz, "_sweep_rows", uniform)
    gap, allowed = random_order_sample_check(s.A, s.x_star)
    assert gap > allowed


def row_frequency_gap(A, draws_sweeps=2000, seed=0):
    """max_i |f_i - p_i| / (6 sqrt(p_i (1 - p_i) / N)) for the rows a random run drew."""
    b = torch.zeros(A.shape[-2], dtype=F64)
    _, info = kaczmarz(
        A, b, sweeps=draws_sweeps, order="random", generator=_gen(seed), return_info=True
    )
    rows = info.rows.reshape(-1)
    N = rows.numel()
    p = (A**2).sum(-1) / (A**2).sum()
    f = torch.bincount(rows, minlength=A.shape[-2]).to(F64) / N
    return float(((f - p).abs() / (6 * torch.sqrt(p * (1 - p) / N))).max())


def test_random_rows_are_norm_weighted():
    A = torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64).sqrt())
    assert row_frequency_gap(A) <= 1.0  # CLT, 6 standard errors per row


def test_broken_uniform_rows_fail_frequency_check(monkeypatch):
    monkeypatch.setattr(
        kz,
        "_sweep_rows",
        lambda A, order, batch, g: torch.randint(
            0, A.shape[-2], (*batch, A.shape[-2]), generator=g
        ),
    )
    A = torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64).sqrt())
    assert row_frequency_gap(A) > 1.0


def test_random_order_is_reproducible():
    s = consistent_system(6, 3, seed=2)
    x1 = kaczmarz(s.A, s.b, sweeps=3, order="random", generator=_gen(5))
    x2 = kaczmarz(s.A, s.b, sweeps=3, order="random", generator=_gen(5))
    x3 = kaczmarz(s.A, s.b, sweeps=3, order="random", generator=_gen(6))
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)


# ----------------------------------------------------------------------------- precisions


@pytest.mark.parametrize("order", ["cyclic", "random"])
@pytest.mark.parametrize("arith", PRECISIONS, ids=lambda a: a.label)
def test_rounding_within_bound_vs_mp_replay(arith, order):
    # ||x^_k - x_k^mp|| <= running rounding bound, every sweep; the replay uses the same rows
    # and the relaxation / eps as rounded to the compute dtype.
    s = consistent_system(6, 4, kappa=20, row_scales=(0.1, 1.0), batch=(2,), seed=9)
    A, b = s.A.to(arith.dtype), s.b.to(arith.dtype)
    omega, eps = 1.3, 1e-3
    x, info = kaczmarz(
        A,
        b,
        sweeps=3,
        order=order,
        relaxation=omega,
        eps=eps,
        generator=_gen(0),
        bf16_mode=arith.mode,
        return_info=True,
    )
    assert (
        x.dtype == arith.dtype and info.precision == arith.label and info.status == Status.COMPLETED
    )
    rows = info.rows if order == "random" else None
    om, ep = working_scalar(omega, arith), working_scalar(eps, arith)
    replay = mp_kaczmarz(A, b, sweeps=3, rows=rows, relaxation=om, eps=ep)
    bound = kaczmarz_rounding_bound(A, b, sweeps=3, rows=rows, relaxation=om, eps=ep, arith=arith)
    err = replay.distance(info.iterates)
    assert bool((err <= bound).all()), (err, bound)
    assert float(err.max()) > 0 or arith.dtype == F64  # the comparison measures something


# ----------------------------------------------------------------------------- zero rows


def test_zero_row_with_zero_rhs_is_skipped():
    s = consistent_system(5, 3, seed=1)
    A = torch.cat([s.A[:2], torch.zeros(1, 3, dtype=F64), s.A[2:]])
    b = torch.cat([s.b[:2], torch.zeros(1, dtype=F64), s.b[2:]])
    assert torch.equal(kaczmarz(A, b, sweeps=4), kaczmarz(s.A, s.b, sweeps=4))


def test_zero_row_with_nonzero_rhs_is_inconsistent():
    A = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=F64)
    with pytest.raises(ValueError, match=r"A has a zero row \(row 1.*inconsistent"):
        kaczmarz(A, torch.tensor([1.0, 2.0], dtype=F64), sweeps=1)


def test_zero_row_with_eps_gives_zero_step():
    A = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=F64)
    x = kaczmarz(A, torch.tensor([1.0, 2.0], dtype=F64), sweeps=1, eps=1e-3)
    assert torch.isfinite(x).all() and float(x[1]) == 0.0


def test_row_norm_underflow_is_an_error():
    A = torch.tensor([[1e-30, 0.0], [0.0, 1.0]], dtype=torch.float32)
    with pytest.raises(ValueError, match="underflows"):
        kaczmarz(A, torch.ones(2, dtype=torch.float32), sweeps=1)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("omega", [0.0, 2.0, -0.5, 2.5])
def test_relaxation_outside_0_2_is_rejected(omega):
    A = torch.eye(2, dtype=F64)
    with pytest.raises(ValueError, match=r"0 < relaxation < 2.*converges"):
        kaczmarz(A, torch.ones(2, dtype=F64), sweeps=1, relaxation=omega)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(sweeps=-1), ValueError, "sweeps"),
        (dict(sweeps=1.5), TypeError, "sweeps"),
        (dict(sweeps=1, order="backwards"), ValueError, "order"),
        (dict(sweeps=1, eps=-1.0), ValueError, "eps"),
        (dict(sweeps=1, generator=3), TypeError, "generator"),
        (dict(sweeps=1, bf16_mode="fast"), ValueError, "bf16_mode"),
        (dict(sweeps=1, x0=torch.zeros(3, dtype=F64)), ValueError, "x0"),
        (dict(sweeps=1, x0=torch.zeros(2, dtype=torch.float32)), TypeError, "x0"),
    ],
)
def test_bad_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        kaczmarz(torch.eye(2, dtype=F64), torch.ones(2, dtype=F64), **kwargs)


def test_bad_shapes_and_values():
    A = torch.eye(3, dtype=F64)
    with pytest.raises(ValueError, match="b has last dimension"):
        kaczmarz(A, torch.ones(2, dtype=F64), sweeps=1)
    with pytest.raises(ValueError, match="do not broadcast"):
        kaczmarz(torch.eye(3, dtype=F64).expand(2, 3, 3), torch.ones(4, 3, dtype=F64), sweeps=1)
    with pytest.raises(ValueError, match="non-finite"):
        kaczmarz(A, torch.tensor([1.0, float("nan"), 0.0], dtype=F64), sweeps=1)
    with pytest.raises(TypeError, match="A must be"):
        kaczmarz([[1.0]], torch.ones(1, dtype=F64), sweeps=1)


def test_inputs_not_modified():
    s = consistent_system(5, 3, seed=8)
    x0 = torch.randn(3, generator=_gen(0), dtype=F64)
    copies = [t.clone() for t in (s.A, s.b, x0)]
    x = kaczmarz(s.A, s.b, sweeps=2, x0=x0, order="random", generator=_gen(1))
    x0_again = kaczmarz(s.A, s.b, sweeps=0, x0=x0)
    x0_again.add_(1.0)  # the result never aliases x0
    for t, c in zip((s.A, s.b, x0), copies):
        assert torch.equal(t, c)
    assert x.data_ptr() != x0.data_ptr()


def test_empty_batch_zero_rows_zero_sweeps():
    A = torch.zeros(0, 4, 3, dtype=F64)
    assert kaczmarz(A, torch.zeros(0, 4, dtype=F64), sweeps=2, order="random").shape == (0, 3)
    x0 = torch.ones(3, dtype=F64)
    assert torch.equal(
        kaczmarz(torch.zeros(0, 3, dtype=F64), torch.zeros(0, dtype=F64), sweeps=3, x0=x0), x0
    )
    _, info = kaczmarz(
        torch.eye(2, dtype=F64), torch.ones(2, dtype=F64), sweeps=0, return_info=True
    )
    assert info.residual_norms.shape == (1,) and info.rows.shape == (0, 2)


def test_batched_broadcast_matches_loop():
    s = consistent_system(5, 3, batch=(3,), seed=12)
    x0 = torch.randn(3, generator=_gen(3), dtype=F64)
    x = kaczmarz(s.A, s.b, sweeps=3, x0=x0)
    # Batched and single dot products may sum in different orders: both are within the
    # rounding bound of the exact replay, so within twice that of each other.
    bound = kaczmarz_rounding_bound(s.A, s.b, sweeps=3, x0=x0, arith=PRECISIONS[0])[-1]
    for i in range(3):
        assert float((x[i] - kaczmarz(s.A[i], s.b[i], sweeps=3, x0=x0)).norm()) <= 2 * float(
            bound[i]
        )


def test_verification_rows_hold():
    # The verification family (Kaczmarz cyclic/random and KLA tokenwise/chunkwise, 4 precisions
    # each): every row within its truncation and rounding bounds.
    from analysis.verification import FAMILIES
    from analysis.verification.kaczmarz import rows

    assert "kaczmarz" in FAMILIES
    got = rows(quick=True)
    assert len(got) == 16 and {r.precision for r in got} == {a.label for a in PRECISIONS}
    assert all(r.holds for r in got), [(r.solver, r.precision) for r in got if not r.holds]
