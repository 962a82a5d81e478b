"""Regression tests of the third review of analysis.references inputs (gka, kaczmarz, koopman,
chebyshev_backward): a clear error naming the argument, never a NaN, a silently different
result or a traceback from deep inside torch / mpmath."""

import mpmath
import pytest
import torch

from analysis.references import chebyshev_backward as cb
from analysis.references import gka
from analysis.references import kaczmarz as kz
from analysis.references import koopman as ko
from analysis.references import mp as amp
from solvers import Arith

F64 = torch.float64
NAN = float("nan")
F32 = Arith(torch.float32)
DPS = 20  # the checks run before any arithmetic; precision only matters for the good-input runs


def _seq(T=3, D=2, Dv=2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(T, d, dtype=F64, generator=g) for d in (D, D, Dv)]


# ----------------------------------------------------------------------------- gka


def _truth(**kw):
    q, k, v = _seq()
    args = dict(q=q, k=k, v=v, a=0.1, dps=DPS) | kw
    return gka.layer_truth(args.pop("q"), args.pop("k"), args.pop("v"), **args)


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(a=0.0), ValueError, "a must"),  # was ZeroDivisionError
        (dict(a=NAN), ValueError, "a must"),  # was mpmath's no-convergence RuntimeError
        (dict(k=torch.full((3, 2), NAN, dtype=F64)), ValueError, "k has"),
        (dict(v=torch.full((3, 2), float("inf"), dtype=F64)), ValueError, "v has"),  # was NaN
        (dict(k=torch.ones(2, 2, dtype=F64)), ValueError, "k has 2 tokens"),  # was IndexError
        (dict(k=torch.ones(5, 2, dtype=F64)), ValueError, "k has 5 tokens"),  # was read in part
        (dict(v=torch.ones(3, dtype=F64)), ValueError, "v must"),
        (dict(g=torch.zeros(2, dtype=F64)), ValueError, "g has 2 tokens"),  # was IndexError
        (dict(beta=torch.full((3,), -1.0, dtype=F64)), ValueError, "beta must"),
        (dict(q=[[1.0, 2.0]]), TypeError, "q must"),  # was AttributeError
        (dict(solver="cg"), TypeError, "iters"),
        (dict(solver="chebyshev", iters=-1), ValueError, "iters"),  # replayed no iteration
        (dict(solver="nope", iters=2), ValueError, "solver"),  # was "method must be ..."
        (dict(dps=0), ValueError, "dps"),  # 0 digits: garbage
        (dict(k=torch.zeros(3, 2, dtype=F64)), ValueError, "H_t = 0 at token t = 1"),
    ],
)
def test_layer_truth_rejects_bad_inputs(kw, exc, word):
    with pytest.raises(exc, match=word):
        _truth(**kw)


def test_layer_truth_measures_check_shapes_and_leave_inputs_alone():
    q, k, v = _seq()
    copies = [x.clone() for x in (q, k, v)]
    truth = _truth(q=q, k=k, v=v)
    for a, b in zip((q, k, v), copies):
        assert torch.equal(a, b)
    y = torch.stack([amp.to_tensor(y, vector=True) for y in truth.y_star])
    # y* rounded once per component: ||y - y*|| <= u ||y*||, the mp quotient rounded once more
    bound = 2.0**-53 * (1 + 2.0**-52)
    assert float(truth.split(y)["forward"].max()) <= bound
    # the check can fail: y* rounded to float32 is 2^-24 off
    assert float(truth.split(y.float().double())["forward"].max()) > bound
    with pytest.raises(ValueError, match="y_hat must have shape"):
        truth.split(y[:2])  # was IndexError
    with pytest.raises(ValueError, match="y_hat must have shape"):
        truth.split(torch.cat([y, y]))  # was read in part: a silent, wrong measurement
    with pytest.raises(ValueError, match="x_hat must have shape"):
        truth.backward_errors(torch.zeros(3, 3, dtype=F64), q)
    with pytest.raises(ValueError, match="D = 3 but truth"):
        gka.layer_rounding_bound(truth, 3, 0.1, F32)  # was another, smaller bound


@pytest.mark.parametrize(
    "args, exc, word",
    [
        (("cg", 0.5, 3), ValueError, "kappa"),  # was a negative bound
        (("chebyshev", NAN, 3), ValueError, "kappa"),  # was 0.0: a silent pass
        (("chebyshev", float("inf"), 3), ValueError, "kappa"),  # was 0.0
        (("chebyshev", 10.0, -1), ValueError, "iters"),  # was 1.0
        (("chebyshev", 10.0, None), TypeError, "iters"),
        (("nope", 10.0, 3), ValueError, "solver"),  # was CG's bound
    ],
)
def test_truncation_bound_rejects_bad_inputs(args, exc, word):
    with pytest.raises(exc, match=word):
        gka.truncation_bound(*args)


def test_gka_bounds_reject_bad_inputs():
    one = torch.ones(3, dtype=F64)
    with pytest.raises(ValueError, match="a must"):
        gka.ridge_kappa(-1.0)  # was kappa 0
    with pytest.raises(ValueError, match="chunk_size"):
        gka.chunk_frobenius_bound(one, one, 0.0, 2, 0, F32)  # was NaN / inf
    with pytest.raises(ValueError, match="chunk_size"):
        gka.chunk_frobenius_bound(one, one, 0.0, 2, -1, F32)  # was a negative bound
    with pytest.raises(ValueError, match="log_decay_mass"):
        gka.chunk_frobenius_bound(one, one, NAN, 2, 2, F32)
    with pytest.raises(ValueError, match="D must"):
        gka.naive_frobenius_bound(one, one, 0, F32)
    with pytest.raises(TypeError, match="arith"):
        gka.naive_frobenius_bound(one, one, 2, "float32")
    with pytest.raises(ValueError, match="chunk_size"):
        gka.log_decay_mass(one, 0)
    with pytest.raises(ValueError, match="g has"):
        gka.log_decay_mass(one * NAN, 2)  # was NaN
    with pytest.raises(ValueError, match="k must"):
        gka.abs_state_fro(one)  # was IndexError


# ----------------------------------------------------------------------------- kaczmarz

A = torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=F64)
B = torch.ones(3, dtype=F64)


@pytest.mark.parametrize("fn", ["mp_kaczmarz", "mp_sweep_closed_form", "kaczmarz_limit"])
@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(b=torch.ones(2, dtype=F64)), ValueError, "b has"),  # was torch's expand error
        (dict(A=A * NAN), ValueError, "A has"),  # was NaN
        (dict(x0=torch.ones(3, dtype=F64)), ValueError, "x0 has"),
        (dict(A=A.expand(2, 3, 2), b=B.expand(3, 3)), ValueError, "batch"),
        (dict(A=torch.zeros(0, 2, dtype=F64), b=torch.zeros(0, dtype=F64)), ValueError, "A must"),
        (dict(A=A.tolist()), TypeError, "A must"),
        (dict(dps=0), ValueError, "dps"),
    ],
)
def test_kaczmarz_references_reject_bad_systems(fn, kw, exc, word):
    args = dict(A=A, b=B, dps=DPS) | kw
    if fn == "mp_kaczmarz":
        args["sweeps"] = 1
    with pytest.raises(exc, match=word):
        getattr(kz, fn)(args.pop("A"), args.pop("b"), **args)


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(sweeps=-1), ValueError, "sweeps"),  # was IndexError
        (dict(relaxation=NAN), ValueError, "relaxation"),  # was NaN
        (dict(relaxation=3.0), ValueError, "relaxation"),
        (dict(eps=-4.0), ValueError, "eps"),  # was: every row with ||a||^2 = 4 skipped
        (dict(rows=torch.tensor([[0, 1, -1]])), ValueError, "rows"),  # -1 read the last row
        (dict(rows=torch.tensor([[0, 1, 7]])), ValueError, "rows"),  # was IndexError
        (dict(rows=torch.tensor([[0.0, 1.0, 2.0]])), TypeError, "rows"),
        (dict(A=A.expand(2, 3, 2), rows=torch.tensor([[[0, 1, 2]] * 3])), ValueError, "rows"),
    ],
)
def test_mp_kaczmarz_rejects_bad_parameters(kw, exc, word):
    args = dict(A=A, sweeps=1, dps=DPS) | kw
    with pytest.raises(exc, match=word):
        kz.mp_kaczmarz(args.pop("A"), B, **args)


def test_kaczmarz_references_good_inputs():
    rows = torch.tensor([[2, 1, 0], [0, 1, 2]])
    x = kz.mp_kaczmarz(A, B, sweeps=1, rows=rows, relaxation=2.0, dps=DPS)  # rows of >= sweeps
    assert x.hi.shape == (2, 2) and torch.equal(rows, torch.tensor([[2, 1, 0], [0, 1, 2]]))
    with pytest.raises(ValueError, match="relaxation"):
        kz.mp_sweep_closed_form(A, B, relaxation=0.0)  # was ZeroDivisionError
    with pytest.raises(ValueError, match="full rank"):
        kz.kaczmarz_limit(torch.ones(3, 2, dtype=F64), B, dps=DPS)  # was mpmath's error
    with pytest.raises(TypeError, match="arith"):
        kz.working_scalar(1.0, "float32")


def _kla(**kw):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 1, 2, dtype=F64, generator=g) for _ in range(3))
    args = dict(q=q, k=k, v=v, alpha=0.9, eta=1.0, dps=DPS) | kw
    return kz.mp_kla(args.pop("q"), args.pop("k"), args.pop("v"), **args)


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(alpha=NAN), ValueError, "alpha"),  # all of these were NaN or garbage outputs
        (dict(alpha=1.5), ValueError, "alpha"),
        (dict(alpha=0.0, chunk_size=2), ValueError, "alpha"),  # was ZeroDivisionError
        (dict(eta=-1.0), ValueError, "eta"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(coefficient="nope"), ValueError, "coefficient"),  # was read as "kaczmarz"
        (dict(normalize_queries="no"), TypeError, "normalize_queries"),
        (dict(q=torch.zeros(3, 1, 2, dtype=F64)), ValueError, "q has a query of norm 0"),
        (dict(k=torch.full((3, 1, 2), NAN, dtype=F64)), ValueError, "k has"),
        (dict(v=torch.zeros(2, 1, 2, dtype=F64)), ValueError, "v must"),  # torch reshape error
        (dict(initial_state=torch.zeros(1, 3, 3, dtype=F64)), ValueError, "initial_state"),
        (dict(initial_state=torch.full((1, 2, 2), NAN, dtype=F64)), ValueError, "initial_state"),
        (dict(chunk_size=0), ValueError, "chunk_size"),  # was range()'s error
        (dict(dps=-1), ValueError, "dps"),
    ],
)
def test_mp_kla_rejects_bad_inputs(kw, exc, word):
    with pytest.raises(exc, match=word):
        _kla(**kw)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_mp_kla_empty_sequence(chunk_size):
    # T = 0 raised torch's "reshape ... ambiguous" error; the solver returns S_0
    S0 = torch.ones(1, 2, 2, dtype=F64)
    e = torch.zeros(0, 1, 2, dtype=F64)
    o, S = _kla(q=e, k=e, v=e, initial_state=S0, chunk_size=chunk_size)
    assert o.hi.shape == (0, 1, 2) and torch.equal(S.hi, S0)


# ----------------------------------------------------------------------------- koopman


def _zv():
    g = torch.Generator().manual_seed(2)
    return torch.randn(4, 2, dtype=F64, generator=g), torch.randn(4, 2, dtype=F64, generator=g)


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(z=torch.full((4, 2), NAN, dtype=F64)), ValueError, "z has"),  # was NaN statistics
        (dict(v=torch.ones(2, 2, dtype=F64)), ValueError, "v has 2"),  # was IndexError
        (dict(v=torch.ones(6, 2, dtype=F64)), ValueError, "v has 6"),  # was read in part
        (dict(mask=torch.ones(3, dtype=torch.bool)), ValueError, "mask"),  # was IndexError
        (dict(mask=torch.full((4,), 0.5)), ValueError, "mask"),  # 0.5 was read as True
        (dict(eps=-1.0), ValueError, "eps"),  # an indefinite G~
        (dict(scale=0.0), ValueError, "scale"),  # was ZeroDivisionError
        (dict(scale=NAN), ValueError, "scale"),
        (dict(z=torch.ones(1, 4, 2, dtype=F64)), ValueError, "one sequence"),
    ],
)
def test_koopman_statistics_rejects_bad_inputs(kw, exc, word):
    z, v = _zv()
    args = dict(z=z, v=v) | kw
    with pytest.raises(exc, match=word):
        ko.statistics(args.pop("z"), args.pop("v"), **args)


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(zq=torch.ones(2, 3, dtype=F64)), ValueError, "zq must"),  # was mpmath's error
        (dict(zq=torch.full((2, 2), NAN, dtype=F64)), ValueError, "zq has"),  # was NaN
        (dict(v=torch.full((4, 2), NAN, dtype=F64)), ValueError, "v has"),
        (dict(K=-1), ValueError, "K must"),  # was an unfiltered readout
        (dict(power_iters=-1), ValueError, "power_iters"),
        (dict(gamma=0.0), ValueError, "gamma"),  # was zeros
        (dict(eta=NAN), ValueError, "eta"),
        (dict(st="st"), TypeError, "st must"),
    ],
)
def test_koopman_readout_rejects_bad_inputs(kw, exc, word):
    z, v = _zv()
    args = dict(st=ko.statistics(z, v), zq=z[:2], v=v) | kw
    with pytest.raises(exc, match=word):
        ko.readout(args.pop("st"), args.pop("zq"), args.pop("v"), **args)


def test_koopman_helpers_reject_bad_inputs():
    z, v = _zv()
    with pytest.raises(ValueError, match="positive definite"):
        ko.readout(ko.statistics(torch.zeros(4, 2, dtype=F64), v, eps=0.0), z[:2], v)
    A = mpmath.matrix([[1, 0.5], [0.2, 0.3]])
    with pytest.raises(ValueError, match="iters"):
        ko.power_ratio_bound(A, -1)  # was a bound for -1 steps
    with pytest.raises(ValueError, match="v0"):
        ko.power_ratio_bound(A, 2, mpmath.matrix([0, 0]))  # was ZeroDivisionError
    with pytest.raises(ValueError, match="square"):
        ko.power_ratio_bound(mpmath.matrix([[1, 0.5, 1], [0.2, 0.3, 1]]), 2)  # was a number
    with pytest.raises(ValueError, match="additions"):
        ko.statistics_bound(-1, F32, 2)  # was a smaller theta
    with pytest.raises(ValueError, match="lam_min"):
        ko.readout_scale(1.5, 1.0, 2, 1.0, 1.0, -1.0)  # was a complex number
    with pytest.raises(ValueError, match="v has 2"):
        ko.absolute_statistics(z, v[:2])  # was torch's size error
    with pytest.raises(ValueError, match="scale"):
        ko.absolute_statistics(z, v, scale=0.0)  # was inf
    with pytest.raises(ValueError, match="z has"):
        ko.absolute_statistics(z * NAN, v)  # was NaN


# ----------------------------------------------------------------------------- chebyshev_backward


@pytest.mark.parametrize(
    "args, exc, word",
    [
        ((3, 0.5, F64), ValueError, "kappa"),  # was a kappa-2 problem
        ((3, NAN, F64), ValueError, "kappa"),  # was LAPACK's error
        ((0, 10.0, F64), ValueError, "D must"),  # was IndexError
        ((3, 10.0, "float64"), TypeError, "dtype"),
    ],
)
def test_spd_problem_rejects_bad_inputs(args, exc, word):
    with pytest.raises(exc, match=word):
        cb.spd_problem(*args)


PB = cb.spd_problem(3, 10.0, F64)


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(iters=-1), ValueError, "iters"),  # was the 0-step loop
        (dict(L=PB.mu, mu=PB.L), ValueError, "L must be >= mu"),  # was another loop
        (dict(mu=0.0), ValueError, "mu must"),
        (dict(L=NAN), ValueError, "L must"),  # was NaN
        (dict(H=PB.H * NAN), ValueError, "H has"),
        (dict(q=PB.q[:2]), ValueError, "q must"),  # was mpmath's error
        (dict(g=torch.ones(5, dtype=F64)), ValueError, "g must"),
        (dict(H=PB.H[None]), ValueError, "H must"),
        (dict(dps=0), ValueError, "dps"),
    ],
)
def test_mp_adjoint_rejects_bad_inputs(kw, exc, word):
    args = dict(H=PB.H, q=PB.q, g=PB.g, L=PB.L, mu=PB.mu, iters=2, dps=DPS) | kw
    with pytest.raises(exc, match=word):
        cb.mp_adjoint(**args)


def test_chebyshev_backward_bounds_and_rel():
    assert cb.implicit_dH_gap_bound(1.0, 1.0, 3) == 0.0  # L = mu: was ZeroDivisionError
    with pytest.raises(ValueError, match="iters"):
        cb.truncation_eps(2.0, 1.0, -1)  # was 1.0
    with pytest.raises(ValueError, match="mu must"):
        cb.truncation_eps(2.0, 0.0, 3)  # was 1.0
    with pytest.raises(ValueError, match="same shape"):
        cb.rel(torch.ones(3, 3), torch.ones(3))  # broadcast: was 0.0
    with pytest.raises(ValueError, match="b is zero"):
        cb.rel(torch.zeros(3), torch.zeros(3))  # was NaN
    with pytest.raises(ValueError, match="kappa"):
        # the table swallowed the ValueError into an empty (or a wrong-kappa) table
        cb.stability_table(kappas=(0.5,), iters=(2,), precisions=(Arith(F64),), D=2)
    H, q, g = PB.H.clone(), PB.q.clone(), PB.g.clone()
    cb.mp_adjoint(H, q, g, PB.L, PB.mu, 2, dps=DPS)
    assert torch.equal(H, PB.H) and torch.equal(q, PB.q) and torch.equal(g, PB.g)
