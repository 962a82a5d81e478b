"""Regression tests of the fourth review of bad input: analysis.references.iterative and .mp,
analysis.studies.allowance and .cg_agreement. A clear error naming the argument, never a NaN,
a silently different result or a traceback from deep inside torch / mpmath / scipy."""

import mpmath
import pytest
import torch

from analysis.references import iterative as it
from analysis.references import mp as amp
from analysis.studies import allowance as al
from solvers import Arith

F64 = torch.float64
NAN = float("nan")
H = torch.tensor([[2.0, 0.5, 0.0], [0.5, 2.0, 0.0], [0.0, 0.0, 1.0]], dtype=F64)
Q = torch.ones(3, dtype=F64)


# ------------------------------------------------------------------------ constants


@pytest.mark.parametrize(
    "args, exc, word",
    [
        (("nope", 2.0, 1.0), ValueError, "method must"),  # were AGD's constants
        (("agd", 1.0, 0.0), ValueError, "mu > 0"),  # was ZeroDivisionError
        (("agd", 1.0, -1.0), ValueError, "mu > 0"),  # was a complex beta
        (("gd", 1.0, 2.0), ValueError, "L >= mu"),  # was a step for L < mu
        (("chebyshev", NAN, 1.0), ValueError, "finite"),  # was NaN
        (("gd", None, 1.0), TypeError, "L must"),  # was mpmath's "cannot create mpf"
        (("gd", 2.0, torch.tensor(1.0)), TypeError, "mu must"),
    ],
)
def test_exact_constants_rejects_bad_inputs(args, exc, word):
    with pytest.raises(exc, match=word):
        it.exact_constants(*args)


def test_exact_constants_good_inputs():
    assert it.exact_constants("cg", None, None) == {}  # CG has none (was a TypeError)
    with amp.precision(30):
        c = it.exact_constants("agd", mpmath.mpf(4), 1)  # mpf, as analysis.references.gka
        assert c["beta"] == mpmath.mpf(1) / 3 and c["step"] == mpmath.mpf(1) / 4


@pytest.mark.parametrize(
    "args, exc, word",
    [
        (("gd", 1.0, 2.0), ValueError, "L must be >= mu"),  # was a step for L < mu
        (("agd", 1.0, 0.0), ValueError, "mu must be > 0"),  # was a NaN beta
        (("chebyshev", NAN, 1.0), ValueError, "L has"),  # were NaN constants
        (("gd", None, 1.0), TypeError, "L must"),  # was torch's "must be real number"
        (("gd", torch.ones(2), torch.ones(3)), ValueError, "L and mu"),
    ],
)
def test_working_constants_rejects_bad_inputs(args, exc, word):
    with pytest.raises(exc, match=word):
        it.working_constants(*args, Arith(F64))


def test_working_constants_rejects_bad_arith_and_leaves_inputs_alone():
    with pytest.raises(TypeError, match="arith"):  # was AttributeError
        it.working_constants("gd", 2.0, 1.0, "float64")
    L, mu = torch.tensor([4.0, 2.0], dtype=F64), torch.tensor(1.0, dtype=F64)
    c = it.working_constants("agd", L, mu, Arith(F64))
    # (sqrt(4) - 1)/(sqrt(4) + 1): sqrt(4) = 2 and the sums exact, the division rounds once,
    # as 1 / 3 does: equal, no tolerance
    assert c["beta"].shape == (2,) and float(c["beta"][0]) == 1 / 3
    assert torch.equal(L, torch.tensor([4.0, 2.0], dtype=F64)) and float(mu) == 1.0


# ------------------------------------------------------------------------ mp_iterates

HM = [[mpmath.mpf(2), mpmath.mpf(0)], [mpmath.mpf(0), mpmath.mpf(2)]]
QM = [mpmath.mpf(1), mpmath.mpf(1)]
CM = {"step": mpmath.mpf(1) / 2, "rho2": mpmath.mpf(0)}


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(iters=-1), ValueError, "iters"),  # was x_0 alone
        (dict(iters=1.5), TypeError, "iters must"),  # was range()'s TypeError
        (dict(constants={}), ValueError, "constants must hold"),  # was KeyError
        (dict(q=QM[:1]), ValueError, "H must be a D x D"),  # was read in part
        (dict(H=[row + [mpmath.mpf(1)] for row in HM]), ValueError, "H must be a D x D"),
        (dict(H=torch.eye(2, dtype=F64)), TypeError, "lists of mpf"),  # was mpmath's error
    ],
)
def test_mp_iterates_rejects_bad_inputs(kw, exc, word):
    args = dict(H=HM, q=QM, iters=2, constants=CM) | kw
    with pytest.raises(exc, match=word):
        it.mp_iterates("chebyshev", args.pop("H"), args.pop("q"), **args)


# ------------------------------------------------------------------------ exact / split


def test_exact_solution_rejects_non_symmetric_and_bad_dps():
    # mp Cholesky reads one triangle: this was silently the solution of diag(2, 2), [0.5, 0.5]
    with pytest.raises(ValueError, match="H must be symmetric"):
        it.exact_solution(torch.tensor([[2.0, 1.0], [0.0, 2.0]], dtype=F64), Q[:2])
    with pytest.raises(TypeError, match="dps must"):
        it.exact_solution(H, Q, dps="60")  # was "'<' not supported"
    with pytest.raises(TypeError, match="dps must"):
        it.exact_solution(H, Q, dps=float("inf"))  # was mpmath's OverflowError


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(method="nope"), ValueError, "method must"),  # was KeyError
        (dict(iterates=[[0.0] * 3] * 3), TypeError, "iterates must"),  # was AttributeError
        (dict(iterates=torch.zeros(3, dtype=F64)), ValueError, "iterates must"),  # silent
        (dict(iterates=torch.zeros(2, 3, dtype=F64)), ValueError, "iterates must"),
        (dict(iterates=torch.zeros(3, 2, 3, dtype=F64)), ValueError, "iterates must"),
    ],
)
def test_error_split_rejects_bad_inputs(kw, exc, word):
    args = dict(method="gd", iters=2, L=3.0, mu=1.0) | kw
    with pytest.raises(exc, match=word):
        it.error_split(args.pop("method"), H, Q, **args)


def test_error_split_good_iterates_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("SVT_CACHE_DIR", str(tmp_path))
    its = torch.zeros(3, 3, dtype=F64)
    its[1:] = NAN  # a diverged run is measured, not refused
    Hc, qc, itc = H.clone(), Q.clone(), its.clone()
    split = it.error_split("gd", Hc, qc, iters=2, L=3.0, mu=1.0, iterates=itc)
    assert float(split.forward[0]) == 1.0 and split.forward[1:].isnan().all()
    assert torch.equal(Hc, H) and torch.equal(qc, Q) and torch.equal(itc.isnan(), its.isnan())


# ------------------------------------------------------------------------ mp


def test_mp_conversions_reject_bad_inputs():
    for dps in (0, -3):  # mpmath ran these at 1 digit
        with pytest.raises(ValueError, match="dps"), amp.precision(dps):
            pass
    with pytest.raises(TypeError, match="dps"), amp.precision(2.5):  # was truncated to 2
        pass
    with pytest.raises(TypeError, match="t must be a floating"):
        amp.to_mp(torch.tensor([1 + 2j]))  # the imaginary part was dropped
    with pytest.raises(TypeError, match="t must be a floating"):
        amp.to_mp(torch.tensor([2**53 + 1]))  # was rounded: not exact
    with pytest.raises(TypeError, match="t must be a torch.Tensor"):
        amp.to_mp([1.0, 2.0])  # was AttributeError
    m = mpmath.matrix([[1.5, 2], [3, 4]])
    with pytest.raises(TypeError, match="dtype"):
        amp.to_tensor(m, dtype="float32")  # was "Invalid device string"
    with pytest.raises(TypeError, match="dtype"):
        amp.to_tensor(m, dtype=torch.int64)  # 1.5 was truncated to 1
    with pytest.raises(ValueError, match="vector"):
        amp.to_tensor(m, vector=True)  # was flattened
    with pytest.raises(TypeError, match="m must"):
        amp.to_tensor([[1.0]])
    with pytest.raises(ValueError, match="A must be n x n"):
        amp.solve_spd(mpmath.eye(2), mpmath.matrix([1, 1, 1]))  # was "Value should be equal to n"


def test_high_precision_difference_rejects_mismatched_x():
    hp = amp.HighPrecision.from_mp([mpmath.mpf(1) / 3] * 3, (3,))
    with pytest.raises(ValueError, match="last dimensions"):
        hp.distance(torch.ones(5, 1, dtype=F64))  # D = 1 broadcast against 3: was 5 numbers
    with pytest.raises(ValueError, match="last dimensions"):
        hp.difference(torch.ones(4, dtype=F64))  # was torch's size error
    with pytest.raises(TypeError, match="x must"):
        hp.difference([1.0, 1.0, 1.0])
    assert hp.distance(torch.ones(2, 3, dtype=F64)).shape == (2,)  # batches still broadcast


# ------------------------------------------------------------------------ allowance


@pytest.mark.parametrize(
    "args, exc, word",
    [
        (("nope", 10.0, 8), ValueError, "method must"),  # was Chebyshev's count
        (("cg", 10.0, -1), ValueError, "D must"),  # was -4 iterations
        (("chebyshev", 0.5, 8), ValueError, "kappa"),  # was "math domain error"
        (("agd", float("inf"), 8), ValueError, "kappa"),  # was ZeroDivisionError
        (("gd", NAN, 8), ValueError, "kappa"),
    ],
)
def test_survey_iters_rejects_bad_inputs(args, exc, word):
    with pytest.raises(exc, match=word):
        al.survey_iters(*args)


def _no_work(*a, **k):
    raise AssertionError("work started before the arguments were checked")


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(methods="cg"), TypeError, "methods"),  # was read as "c", "g": KeyError
        (dict(methods=["gd", "nope"]), ValueError, "methods"),  # KeyError after gd's survey
        (dict(progress=1), TypeError, "progress"),  # "'int' object is not callable"
    ],
)
def test_survey_checks_arguments_before_any_work(kw, exc, word, monkeypatch):
    monkeypatch.setattr(al, "survey_problems", _no_work)
    with pytest.raises(exc, match=word):
        al.survey(quick=True, **kw)


def test_write_table_checks_out_before_the_survey(tmp_path, monkeypatch):
    monkeypatch.setattr(al, "survey", _no_work)
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "missing", tmp_path / "file", ""):
        with pytest.raises(ValueError, match="out must"):
            al.write_table(True, out)


# ------------------------------------------------------------------------ cg_agreement


def test_scipy_iterates_rejects_bad_inputs():
    pytest.importorskip("scipy")
    from analysis.studies.cg_agreement import scipy_iterates

    with pytest.raises(ValueError, match="iters"):
        scipy_iterates(H, Q, -1)  # was x_0 alone
    with pytest.raises(ValueError, match="q has"):
        scipy_iterates(H, Q * NAN, 2)  # were NaN iterates
    with pytest.raises(ValueError, match="one D x D matrix"):
        scipy_iterates(H.expand(2, 3, 3), Q, 2)  # was scipy's "ndim <= 2"
    with pytest.raises(TypeError, match="bfloat16"):
        scipy_iterates(H.bfloat16(), Q.bfloat16(), 2)  # was numpy's TypeError
    with pytest.raises(TypeError, match="H must"):
        scipy_iterates(H.tolist(), Q, 2)  # was AttributeError
    Hg = H.clone().requires_grad_()
    assert scipy_iterates(Hg, Q, 2).shape == (3, 3)  # was "Can't call numpy() ... grad"
