"""Regression tests of the second review of analysis.references / analysis.bounds inputs."""

import pytest
import torch

from analysis.bounds.kaczmarz import kla_chunkwise_bound, kla_tokenwise_bound
from analysis.bounds.kla_kernel import kla_kernel_bound
from analysis.bounds.running import running_bound
from analysis.precision import gamma
from analysis.references import metrics as M
from analysis.references.gates import exact_gate_functions
from solvers import Arith

F64 = torch.float64
AR = Arith(torch.float32)


def _qkv():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 2, 3, dtype=F64, generator=g)
    return q, q.clone(), torch.randn(4, 2, 2, dtype=F64, generator=g)


def _tok(**kw):
    q, k, v = _qkv()
    args = dict(alpha=0.9, eta=1.0, arith=AR) | kw
    return kla_tokenwise_bound(args.pop("q", q), args.pop("k", k), args.pop("v", v), **args)


def _chunk(**kw):
    q, k, v = _qkv()
    args = dict(alpha=0.9, eta=1.0, arith=AR, chunk_size=2) | kw
    return kla_chunkwise_bound(args.pop("q", q), args.pop("k", k), args.pop("v", v), **args)


def _kern(**kw):
    q, k, v = _qkv()
    args = dict(alpha=0.9, eta=1.0, input_precision="ieee", input_dtype=torch.float32) | kw
    return kla_kernel_bound(args.pop("q", q), args.pop("k", k), args.pop("v", v), **args)


@pytest.mark.parametrize("fn", [_tok, _chunk, _kern])
@pytest.mark.parametrize(
    "kw, err, word",
    [
        (dict(alpha=float("nan")), ValueError, "alpha"),
        (dict(alpha=0.0), ValueError, "alpha"),
        (dict(alpha=1.5), ValueError, "alpha"),
        (dict(eta=-1.0), ValueError, "eta"),
        (dict(eta=float("inf")), ValueError, "eta"),
        (dict(eps=float("nan")), ValueError, "eps"),
        (dict(coefficient="nope"), ValueError, "coefficient"),
        (dict(normalize_queries=1), TypeError, "normalize_queries"),
        (dict(k=torch.full((4, 2, 3), float("nan"), dtype=F64)), ValueError, "k"),
        (dict(v=torch.zeros(3, 2, 2, dtype=F64)), ValueError, "v"),
        (dict(q=torch.zeros(4, 2, 3, dtype=torch.int64)), TypeError, "q"),
        (dict(initial_state=torch.zeros(2, 3, 3, dtype=F64)), ValueError, "initial_state"),
    ],
)
def test_kla_bounds_reject_bad_inputs(fn, kw, err, word):
    with pytest.raises(err, match=word):
        fn(**kw)


@pytest.mark.parametrize("fn", [_tok, _chunk])
def test_kla_bounds_reject_zero_query(fn):
    # formerly a NaN bound (0/0), which no comparison fails
    with pytest.raises(ValueError, match="q has a query of norm 0"):
        fn(q=torch.zeros(4, 2, 3, dtype=F64))


def test_kla_bound_arith_chunk_and_precision():
    with pytest.raises(TypeError, match="arith"):
        _tok(arith="float32")
    with pytest.raises(ValueError, match="chunk_size"):
        _chunk(chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size"):
        _chunk(chunk_size=2.5)
    with pytest.raises(ValueError, match="chunk_size"):
        _kern(chunk_size=8)
    with pytest.raises(ValueError, match="input_precision"):
        _kern(input_precision="fp8")
    with pytest.raises(TypeError, match="input_dtype"):
        _kern(input_dtype="float32")


def test_kla_bounds_good_inputs_unchanged():
    q, k, v = _qkv()
    S0 = torch.ones(2, 3, 2, dtype=F64)
    copies = [t.clone() for t in (q, k, v, S0)]
    for fn in (_tok, _chunk, _kern):
        B, E = fn(q=q, k=k, v=v, initial_state=S0)
        assert torch.isfinite(B).all() and torch.isfinite(E).all()
    for a, b in zip((q, k, v, S0), copies):
        assert torch.equal(a, b)


def test_exact_gate_functions_rejects_non_gate():
    # formerly any object silently got the sigmoid's functions
    with pytest.raises(TypeError, match="gate"):
        exact_gate_functions("balanced")


def test_metrics_reject_bad_inputs():
    A = 2 * torch.eye(3, dtype=F64)
    x = torch.ones(3, dtype=F64)
    with pytest.raises(ValueError, match="x has last dimension"):
        M.relative_forward_error(torch.ones(4, dtype=F64), x)
    with pytest.raises(ValueError, match="x_star"):
        M.relative_forward_error(x, torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match="x_star"):
        M.relative_forward_error(x, torch.full((3,), float("nan"), dtype=F64))
    with pytest.raises(ValueError, match="q has last dimension"):
        M.residual_norm(A, x[:2], x)
    with pytest.raises(ValueError, match="A has"):
        M.backward_error(A * float("nan"), x, x)
    with pytest.raises(ValueError, match="A must be square"):
        M.spectral_norm(torch.ones(2, 3, dtype=F64))
    with pytest.raises(TypeError, match="A must be a torch.Tensor"):
        M.a_norm_error([[1.0]], x, x)
    with pytest.raises(ValueError, match="batch shapes"):
        M.residual_norm(A.expand(2, 3, 3), x.expand(3, 3), x)
    with pytest.raises(TypeError, match="exact"):
        M.residual_norm(A, x, x, exact="yes")
    assert float(M.a_norm_error(A, x, x)) == 0.0
    # eta = sqrt(3) / (2 sqrt(3) + sqrt(3)) = 1/3 in float64 (u = 2^-53, Higham's gamma_n):
    # ||q - A x|| from mpmath (50 digits) rounded once (1); ||A||_2 by eigvalsh, within
    # u ||A||_2 (LAPACK Users' Guide 4.7, p(n) = 1) (1); ||x|| (or ||q||, the other term): a
    # 3-term sum of squares and a sqrt (4); the product and the sum (2); the division (1); the
    # expected 1/3 rounded (1): gamma_10
    eta = float(M.backward_error(A, x, x))
    assert eta == pytest.approx(1 / 3, rel=gamma(10, 2.0**-53), abs=0)


class _Info:
    iterates = torch.zeros(3, 3, dtype=F64)


@pytest.mark.parametrize(
    "kw, err, word",
    [
        (dict(L=float("nan")), ValueError, "L"),
        (dict(mu=-1.0), ValueError, "mu"),
        (dict(L=0.5), ValueError, "L must be >= mu"),
        (dict(L=True), TypeError, "L"),
        (dict(arith="float64"), TypeError, "arith"),
        (dict(q=torch.ones(2, dtype=F64)), ValueError, "q"),
        (dict(H=torch.ones(3, 2, dtype=F64)), ValueError, "H"),
        (dict(H=torch.full((3, 3), float("nan"), dtype=F64)), ValueError, "H"),
    ],
)
def test_running_bound_rejects_bad_inputs(kw, err, word):
    args = (
        dict(
            H=2 * torch.eye(3, dtype=F64),
            q=torch.ones(3, dtype=F64),
            L=2.0,
            mu=1.0,
            arith=Arith(F64),
        )
        | kw
    )
    with pytest.raises(err, match=word):
        running_bound("gd", args.pop("H"), args.pop("q"), _Info(), **args)
