"""Bad input at the public boundary of ``analysis.bounds``: a clear error naming the argument,
never a traceback from deep inside torch, never a NaN (or a smaller) bound."""

import math

import pytest
import torch

from analysis.bounds import cholesky as ch
from analysis.bounds import contract as ct
from analysis.bounds import iterative as it
from analysis.bounds import kaczmarz as kz
from solvers import Arith

F64 = torch.float64
H = 2.0 * torch.eye(3, dtype=F64)
Q = torch.ones(3, dtype=F64)


def lin(**kw):
    args = dict(method="gd", H=H, q=Q, L=2.0, mu=1.0, iters=2, contract="float32")
    args.update(kw)
    method, Hm, qm = args.pop("method"), args.pop("H"), args.pop("q")
    return ct.linear_bound(method, Hm, qm, **args)


# ----------------------------------------------------------------------- a-priori bounds

APRIORI = ["chebyshev_bound", "chebyshev_rate_bound", "gd_bound", "cg_bound", "cg_bound_2norm",
           "agd_bound", "omega_gap_bound"]  # fmt: skip


@pytest.mark.parametrize("name", APRIORI)
@pytest.mark.parametrize("i, exc", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_apriori_bad_index(name, i, exc):
    with pytest.raises(exc, match="i must"):
        getattr(it, name)(10.0, i)


@pytest.mark.parametrize("name", APRIORI)
@pytest.mark.parametrize("kappa", [0.5, -1.0, float("nan")])
def test_apriori_bad_kappa(name, kappa):
    with pytest.raises(ValueError, match="kappa"):
        getattr(it, name)(kappa, 3)


def test_apriori_tensor_index_still_works():
    i = torch.arange(4, dtype=F64)
    # (3 - 1)/(3 + 1) = 0.5 and its powers are exact in float64: no tolerance
    assert torch.equal(it.gd_bound(3.0, i), 0.5**i)
    assert math.isinf(float(it.cg_bound(math.inf, 2)))
    with pytest.raises(ValueError, match="i must"):
        it.gd_bound(3.0, torch.tensor([0.0, -1.0]))


def test_rho_rejects_bad_spectrum():
    with pytest.raises(ValueError, match="L must be >= mu"):
        it.rho(1.0, 2.0)
    with pytest.raises(ValueError, match="mu must be > 0"):
        it.rho(1.0, 0.0)


def test_step_bounds_reject_negative_index():
    with pytest.raises(ValueError, match="i must"):
        it.gd_bound_for_step(0.1, 1.0, 10.0, -1)
    with pytest.raises(ValueError, match="i must"):
        it.chebyshev_bound_for_constants(0.1, 0.5, 1.0, 10.0, -1)


# ----------------------------------------------------------------------- contract bounds


@pytest.mark.parametrize(
    "kw, exc, what",
    [
        (dict(iters=-1), ValueError, "iters"),
        (dict(iters=1.5), TypeError, "iters"),
        (dict(iters=True), TypeError, "iters"),
        (dict(L=1.0, mu=2.0), ValueError, "L must be >= mu"),
        (dict(method="agd", L=1.0, mu=0.0), ValueError, "mu"),
        (dict(method="chebyshev", L=1.0, mu=-1.0), ValueError, "mu"),
        (dict(L=float("nan")), ValueError, "L"),
        (dict(L=torch.ones(5)), ValueError, "L"),
        (dict(H=H * float("nan")), ValueError, "H"),
        (dict(q=Q * float("inf")), ValueError, "q"),
        (dict(H=Q), ValueError, "H"),
        (dict(H=torch.ones(3, 2, dtype=F64)), ValueError, "H"),
        (dict(H=[[1.0]]), TypeError, "H"),
        (dict(H=torch.eye(3, dtype=torch.int64)), TypeError, "H"),
        (dict(q=torch.ones(4, dtype=F64)), ValueError, "q"),
        (dict(H=H.expand(2, 3, 3), q=Q.expand(3, 3)), ValueError, "batch"),
        (dict(H=torch.zeros(0, 0, dtype=F64), q=torch.zeros(0, dtype=F64)), ValueError, "H"),
        (
            dict(H=torch.zeros(0, 3, 3, dtype=F64), q=torch.zeros(0, 3, dtype=F64)),
            ValueError,
            "empty",
        ),
        (dict(method="nope"), ValueError, "method"),
        (dict(contract="nope"), ValueError, "contract"),
        (dict(shift=float("nan")), ValueError, "shift"),
        (dict(shift=-1.0), ValueError, "shift"),
        (dict(shift_error=-1.0), ValueError, "shift_error"),
        (dict(value_u=float("nan")), ValueError, "value_u"),
        (dict(param_rel_error=-1.0), ValueError, "param_rel_error"),
    ],
)
def test_linear_bound_bad_input(kw, exc, what):
    with pytest.raises(exc, match=what):
        lin(**kw)


def test_linear_bound_does_not_modify_inputs_and_is_finite():
    Hc, qc, L = H.clone(), Q.clone(), torch.tensor(2.0, dtype=F64)
    for method in ("chebyshev", "gd", "agd"):
        run = lin(method=method, H=Hc, q=qc, L=L)
        assert torch.isfinite(run.bound).all()
    assert torch.equal(Hc, H) and torch.equal(qc, Q) and float(L) == 2.0


@pytest.mark.parametrize(
    "kw, exc, what",
    [
        (dict(iters=-1), ValueError, "iters"),
        (dict(iters=1.5), TypeError, "iters"),
        (dict(iters=True), TypeError, "iters"),
        (dict(H=H * float("nan")), ValueError, "H"),
        (dict(H=Q), ValueError, "H"),
        (dict(H=torch.ones(3, 2, dtype=F64)), ValueError, "H"),
        (dict(H=torch.zeros(0, 0, dtype=F64)), ValueError, "H"),
        (dict(H=torch.zeros(0, 3, 3, dtype=F64)), ValueError, "empty"),
        (dict(shift=float("nan")), ValueError, "shift"),
        (dict(contract="nope"), ValueError, "contract"),
    ],
)
def test_cg_contract_bound_bad_input(kw, exc, what):
    args = dict(H=H, iters=2, contract="float32")
    args.update(kw)
    with pytest.raises(exc, match=what):
        ct.cg_bound(args.pop("H"), **args)


@pytest.mark.parametrize("Hm", [0.0 * H, torch.diag(torch.tensor([-1.0, 1.0, 2.0], dtype=F64))])
def test_cg_contract_bound_not_spd_is_inf_not_nan(Hm):
    rel = ct.cg_bound(Hm, iters=2, contract="float32").relative
    assert math.isinf(float(rel))  # NaN would compare False against any error: a silent pass


@pytest.mark.parametrize("D, exc", [(-1, ValueError), (0, ValueError), (1.5, TypeError)])
def test_fro_error_bad_D(D, exc):
    with pytest.raises(exc, match="D"):
        ct.fro_error(D, "float32")


# ----------------------------------------------------------------------- Cholesky


@pytest.mark.parametrize("fn", [ch.cholesky_bound, ch.substitution_bound])
@pytest.mark.parametrize("n, exc", [(-5, ValueError), (0, ValueError), (1.5, TypeError)])
def test_cholesky_bounds_bad_n(fn, n, exc):
    with pytest.raises(exc, match="n must"):
        fn(n, Arith(torch.float32))


def test_substitution_backward_error_nan_is_an_error_not_zero():
    with pytest.raises(ValueError, match="x"):
        ch.substitution_backward_error(H, Q * float("nan"), Q, lower=True)
    with pytest.raises(ValueError, match="x"):
        ch.substitution_backward_error(H, torch.ones(2, dtype=F64), Q, lower=True)


def test_cholesky_backward_error_bad_shapes():
    with pytest.raises(ValueError, match="G"):
        ch.cholesky_backward_error(Q, Q)
    with pytest.raises(ValueError, match="same shape"):
        ch.cholesky_backward_error(H, torch.eye(2, dtype=F64))


# ----------------------------------------------------------------------- Kaczmarz

A = torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=F64)
B = torch.ones(3, dtype=F64)


@pytest.mark.parametrize(
    "kw, exc, what",
    [
        (dict(sweeps=-1), ValueError, "sweeps"),
        (dict(sweeps=1.5), TypeError, "sweeps"),
        (dict(relaxation=2.5), ValueError, "relaxation"),
        (dict(relaxation=0.0), ValueError, "relaxation"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(b=torch.ones(2, dtype=F64)), ValueError, "b"),
        (dict(A=A * float("nan")), ValueError, "A"),
        (dict(x0=torch.ones(3, dtype=F64)), ValueError, "x0"),
        (dict(rows=torch.full((2, 3), 7)), ValueError, "rows"),
    ],
)
def test_kaczmarz_rounding_bound_bad_input(kw, exc, what):
    args = dict(A=A, b=B, sweeps=2, arith=Arith(torch.float32))
    args.update(kw)
    with pytest.raises(exc, match=what):
        kz.kaczmarz_rounding_bound(args.pop("A"), args.pop("b"), **args)


def test_cyclic_error_bound_bad_input():
    with pytest.raises(ValueError, match="sweeps"):
        kz.cyclic_error_bound(A, 1.0, -1)
    with pytest.raises(ValueError, match="relaxation"):
        kz.cyclic_error_bound(A, 1.0, 2, relaxation=3.0)
    with pytest.raises(ValueError, match="e0_norm"):
        kz.cyclic_error_bound(A, float("nan"), 2)
    with pytest.raises(ValueError, match="steps"):
        kz.random_expected_sq_error(A, torch.ones(2, dtype=F64), -1)


# ----------------------------------------------------------------------- references

from analysis.references import iterative as ref  # noqa: E402


@pytest.mark.parametrize(
    "Hm, qm, exc, what",
    [
        (H * float("nan"), Q, ValueError, "H"),
        (H, Q * float("inf"), ValueError, "q"),
        (H, torch.ones(4, dtype=F64), ValueError, "q"),
        (torch.ones(3, 2, dtype=F64), Q, ValueError, "H"),
        (H.expand(2, 3, 3), Q.expand(3, 3), ValueError, "batch"),
        (torch.zeros(0, 0, dtype=F64), torch.zeros(0, dtype=F64), ValueError, "H"),
        ([[1.0]], Q, TypeError, "H"),
    ],
)
def test_exact_solution_bad_input(Hm, qm, exc, what):
    with pytest.raises(exc, match=what):
        ref.exact_solution(Hm, qm, recompute=True)


@pytest.mark.parametrize("L, mu, what", [(1.0, 2.0, "L must be >= mu"), (2.0, 0.0, "mu"),
                                         (float("nan"), 1.0, "L")])  # fmt: skip
def test_replay_bad_spectrum(L, mu, what):
    with pytest.raises(ValueError, match=what):
        ref.replay("chebyshev", H, Q, iters=1, L=L, mu=mu, recompute=True)
