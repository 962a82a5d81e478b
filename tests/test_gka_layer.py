"""The per-token GKA layer (solvers/gka.py) against mpmath ground truth (analysis/references/gka.py).

Bounds used here:
* ROUND: ``analysis.references.gka.layer_rounding_bound`` on
  ``rounding_t = ||y_hat_t - y_mp_t|| / (||U_t||_F ||x*_t||)`` (stored states, lambda_t, the
  system matrix, the solve's allowance, the output product; first order times 2).
* TRUNC: ``analysis.references.gka.truncation_bound``: Chebyshev ``1/T_{r+1}(1/rho)``, CG
  ``2 sqrt(kappa) R_a^r`` with ``kappa = (1 + a)/a`` (eq. (4)), on the same scale.
* eq. (4): ``kappa_t <= (a + 1)/a`` for the exact ``H_t + lambda_t I``.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from analysis.precision import PRECISIONS
from analysis.references.gka import layer_rounding_bound, layer_truth, ridge_kappa, truncation_bound
from analysis.testing.strategies.gka import gka_case, gka_cases
from solvers import Arith, Status
from solvers.gka import gka_layer

F64 = torch.float64
VARIANTS = [("exact", None), ("chebyshev", 8), ("cg", 4)]


def check_against_truth(case, arith, solver, iters):
    y, info = gka_layer(
        case.q,
        case.k,
        case.v,
        a=case.a,
        g=case.g,
        beta=case.beta,
        solver=solver,
        iters=iters,
        bf16_mode=arith.mode,
        return_info=True,
    )
    truth = layer_truth(
        case.q, case.k, case.v, a=case.a, g=case.g, beta=case.beta, solver=solver, iters=iters
    )
    split = truth.split(y)
    D = case.k.shape[-1]
    ok_round = bool(
        (split["rounding"] <= layer_rounding_bound(truth, D, case.a, arith)).all()
    )  # ROUND
    # TRUNC checks the a-priori bound on the exact r-step iterates (mpmath), not the implementation:
    # split()["truncation"] does not depend on y (ROUND is the implementation's check). Attained
    # when an eigenvalue sits at L (e.g. D = 1): both sides carry one float64 rounding
    tb = truncation_bound(solver, ridge_kappa(case.a), iters) * (1 + 4 * 2.0**-53)
    ok_trunc = bool((split["truncation"] <= tb).all())
    return ok_round, ok_trunc, truth, info


@pytest.mark.parametrize("arith", PRECISIONS, ids=lambda a: a.label)
@pytest.mark.parametrize("solver,iters", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_layer_matches_mpmath(arith, solver, iters):
    case = gka_case(T=6, D=4, Dv=3, a=0.1, seed=1).to(arith.dtype)
    ok_round, ok_trunc, truth, info = check_against_truth(case, arith, solver, iters)
    assert ok_round and ok_trunc
    assert info.status == Status.COMPLETED and info.precision == arith.label
    a = case.a
    assert bool(
        (truth.kappa <= (a + 1) / a * (1 + 4 * 2.0**-53)).all()
    )  # eq. (4): exact kappa, both sides rounded to float64


@given(
    case=gka_cases(max_T=5, max_D=4),
    dtype=st.sampled_from([F64, torch.float32]),
    variant=st.sampled_from(VARIANTS),
)
def test_layer_matches_mpmath_property(case, dtype, variant):
    ok_round, ok_trunc, truth, _ = check_against_truth(case.to(dtype), Arith(dtype), *variant)
    assert ok_round and ok_trunc
    assert bool(
        (truth.kappa <= (case.a + 1) / case.a * (1 + 4 * 2.0**-53)).all()
    )  # eq. (4), float64 roundings of both sides


def test_off_by_one_gate_fails():
    """Decaying H_{t-1} by gamma_{t-1} instead of gamma_t (gates shifted by one token) breaks ROUND."""
    case = gka_case(T=6, D=4, Dv=3, a=0.1, seed=2)
    shifted = torch.cat([torch.zeros(1, dtype=F64), case.g[:-1]])
    y = gka_layer(case.q, case.k, case.v, a=case.a, g=shifted, beta=case.beta)
    truth = layer_truth(case.q, case.k, case.v, a=case.a, g=case.g, beta=case.beta)
    assert not bool(
        (truth.split(y)["rounding"] <= layer_rounding_bound(truth, 4, case.a, Arith(F64))).all()
    )


def test_beta_applied_to_keys_only_fails():
    """Eq. (55) puts beta_t on both H_t and U_t; beta on H only (v scaled by 1/beta) breaks ROUND."""
    case = gka_case(T=5, D=3, Dv=2, a=0.1, seed=4)
    y = gka_layer(case.q, case.k, case.v / case.beta[:, None], a=case.a, g=case.g, beta=case.beta)
    truth = layer_truth(case.q, case.k, case.v, a=case.a, g=case.g, beta=case.beta)
    assert not bool(
        (truth.split(y)["rounding"] <= layer_rounding_bound(truth, 3, case.a, Arith(F64))).all()
    )


def test_ablations_are_exact():
    """g = None is gamma = 1 and beta = None is beta = 1, bit for bit (multiplying by 1 is exact)."""
    case = gka_case(T=5, D=3, Dv=2, seed=3)
    for solver, iters in VARIANTS:
        base = gka_layer(case.q, case.k, case.v, a=0.2, solver=solver, iters=iters)
        ones = gka_layer(
            case.q,
            case.k,
            case.v,
            a=0.2,
            g=torch.zeros(5, dtype=F64),
            beta=torch.ones(5, dtype=F64),
            solver=solver,
            iters=iters,
        )
        assert torch.equal(base, ones)


def test_batch_broadcast_and_layout():
    """Leading dimensions broadcast (g shared by all heads here); (B, T, H, D) is ``transpose(1, 2)``."""
    case = gka_case(T=5, D=3, Dv=2, batch=(2, 3), seed=5)
    g = case.g[0, 0]
    y = gka_layer(case.q, case.k, case.v, a=0.1, g=g, beta=case.beta)
    for b in range(2):
        for h in range(3):
            one = gka_layer(
                case.q[b, h], case.k[b, h], case.v[b, h], a=0.1, g=g, beta=case.beta[b, h]
            )
            # same arithmetic per system, but batched matmuls may sum in another order: ROUND on each side
            truth = layer_truth(
                case.q[b, h], case.k[b, h], case.v[b, h], a=0.1, g=g, beta=case.beta[b, h]
            )
            gap = (y[b, h] - one).norm(dim=-1) / truth.scale
            assert (gap <= 2 * layer_rounding_bound(truth, 3, 0.1, Arith(F64))).all()
    bthd = [x.transpose(1, 2) for x in (case.q, case.k, case.v)]  # fla layout (B, T, H, D)
    y2 = gka_layer(*[x.transpose(1, 2) for x in bthd], a=0.1, g=g, beta=case.beta).transpose(1, 2)
    assert torch.equal(y2.transpose(1, 2), y)


def test_empty_and_zero_length():
    q = torch.zeros(0, 4, 3)
    assert gka_layer(q, q, torch.zeros(0, 4, 2), a=0.1).shape == (0, 4, 2)
    q = torch.zeros(2, 0, 3)
    y, info = gka_layer(
        q, q, torch.zeros(2, 0, 2), a=0.1, solver="chebyshev", iters=3, return_info=True
    )
    assert y.shape == (2, 0, 2) and info.x.shape == (2, 0, 3) and info.status == Status.COMPLETED


def test_zero_length_backward_and_positional_gates():
    # T = 0: y is empty but still a function of the inputs, so a backward gives zero gradients
    q = torch.zeros(2, 0, 3, dtype=torch.float64, requires_grad=True)
    gka_layer(q, q, torch.zeros(2, 0, 2, dtype=torch.float64), a=0.1).sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape
    # g and beta may be passed by position, as kernels.gka_layer takes them
    case = gka_case(T=4, D=3, Dv=2, seed=8)
    kw = dict(a=0.1, solver="chebyshev", iters=3)
    assert torch.equal(
        gka_layer(case.q, case.k, case.v, case.g, case.beta, **kw),
        gka_layer(case.q, case.k, case.v, g=case.g, beta=case.beta, **kw),
    )


def test_overflowed_frobenius_norm_and_nonfinite_y_are_reported():
    case = gka_case(T=4, D=3, Dv=2, seed=9)
    # ||H_t||_F overflows float64 from finite keys: one error naming k and beta, for every solver
    for solver, iters in (("exact", None), ("chebyshev", 3), ("cg", 3)):
        with pytest.raises(ValueError, match="not finite at token t = 1: it overflows float64"):
            gka_layer(case.q, case.k * 1e160, case.v, a=0.1, solver=solver, iters=iters)
    # y overflows on its own (finite x): NONFINITE, never COMPLETED
    big_q = case.q * (1e300 / case.q.abs().max())  # x_t ~ 1e300 and U_t ~ 1e12: y_t overflows
    y, info = gka_layer(big_q, case.k, case.v * 1e12, a=0.1, return_info=True)
    assert not torch.isfinite(y).all() and torch.isfinite(info.x).all()
    assert info.status == Status.NONFINITE


def test_info_and_iters_zero():
    case = gka_case(T=4, D=3, Dv=2, seed=6)
    y, info = gka_layer(case.q, case.k, case.v, a=0.1, g=case.g, beta=case.beta, return_info=True)
    assert info.solver == "exact" and info.iters is None
    # lambda = a ||H||_F is the same float64 product in the layer (eq. (4)): no tolerance
    assert torch.equal(info.lam, 0.1 * info.fro)
    # Cholesky solve: (A + dA) x = q, |dA| <= gamma_{3D+1} |L||L^T| (Higham Thm 10.4) and
    # || |L||L^T| ||_2 <= D ||A||_2 <= D (1 + a) ||H||_F, so ||q - A x|| <= gamma_{3D+1} D ||A||_2 ||x||
    D, u = 3, 2.0**-53
    gamma = (3 * D + 1) * u / (1 - (3 * D + 1) * u)
    assert bool((info.residual_norms <= gamma * D * 1.1 * info.fro * info.x.norm(dim=-1)).all())
    y0 = gka_layer(
        case.q, case.k, case.v, a=0.1, g=case.g, beta=case.beta, solver="chebyshev", iters=0
    )
    assert torch.isfinite(y0).all()


def test_bad_input_and_not_modified():
    case = gka_case(T=4, D=3, Dv=2, seed=7)
    args = (case.q, case.k, case.v)
    kw = {"g": case.g, "beta": case.beta}
    saved = [t.clone() for t in (*args, case.g, case.beta)]
    cases = [
        (dict(a=0.0), ValueError, "a must be"),
        (dict(a=-1.0), ValueError, "a must be"),
        (dict(a=float("nan")), ValueError, "a must be"),
        (dict(a="0.1"), TypeError, "a must be"),
        (dict(a=0.1, solver="lu"), ValueError, "solver"),
        (dict(a=0.1, solver="cg"), TypeError, "iters"),
        (dict(a=0.1, solver="exact", iters=3), ValueError, "iters"),
        (dict(a=0.1, solver="chebyshev", iters=-1), ValueError, "iters"),
        (dict(a=0.1, bf16_mode="fast"), ValueError, "bf16_mode"),
    ]
    for extra, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            gka_layer(*args, **kw, **extra)
    with pytest.raises(ValueError, match="g = log gamma must be <= 0"):
        gka_layer(*args, a=0.1, g=-case.g, beta=case.beta)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        gka_layer(*args, a=0.1, g=case.g, beta=-case.beta)
    with pytest.raises(ValueError, match="beta has 3 tokens"):
        gka_layer(*args, a=0.1, beta=case.beta[:3])
    with pytest.raises(ValueError, match="k has key dimension 2"):
        gka_layer(case.q, case.k[:, :2], case.v, a=0.1)
    with pytest.raises(ValueError, match="v has 3 tokens"):
        gka_layer(case.q, case.k, case.v[:3], a=0.1)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        gka_layer(case.q[0], case.k, case.v, a=0.1)
    with pytest.raises(TypeError, match="k has dtype"):
        gka_layer(case.q, case.k.float(), case.v, a=0.1)
    with pytest.raises(ValueError, match="do not broadcast"):
        gka_layer(case.q.expand(2, 4, 3), case.k.expand(3, 4, 3), case.v, a=0.1)
    bad = case.q.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="q has 1 non-finite"):
        gka_layer(bad, case.k, case.v, a=0.1)
    zero_k = case.k.clone()
    zero_k[0] = 0.0
    with pytest.raises(ValueError, match="H_t = 0 at token t = 1"):
        gka_layer(case.q, zero_k, case.v, a=0.1)
    for precision in PRECISIONS:
        gka_layer(
            *(x.to(precision.dtype) for x in args),
            a=0.1,
            g=case.g.to(precision.dtype),
            beta=case.beta.to(precision.dtype),
            solver="cg",
            iters=2,
            bf16_mode=precision.mode,
        )
    for before, after in zip(saved, (*args, case.g, case.beta)):
        assert torch.equal(before, after)


def test_verification_rows_hold():
    """The family's verification table (quick): every row within its bounds, all four precisions."""
    from analysis.verification import gka

    rows = gka.rows(True)
    assert {r.precision for r in rows} == {a.label for a in PRECISIONS}
    assert all(r.holds for r in rows), [(r.solver, r.precision) for r in rows if not r.holds]
