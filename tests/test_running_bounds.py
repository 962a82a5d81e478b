"""Running (a-posteriori) rounding bounds of Chebyshev / GD / AGD (analysis.bounds.running).

The a-priori allowance ``8 kappa (n u_acc + u_store)`` is >= 1 for bf16 at GKA's setting
(kappa <= 51), so tests/test_solvers_vs_mpmath.py asserts nothing about bf16 rounding there.
The running bound is computed from the run itself and is asserted here, in every precision:

* every iterate: ``||x_hat_i - x_mp_i|| / ||x*|| <= running bound_i`` (rounding vs the mpmath
  replay with the working constants, analysis.references.iterative);
* every step: the local error the measured rounding implies is within its componentwise bound;
* the bound's recurrence is the one the replay runs (residual at float64 evaluation level).

Tightness, worst measured/bound over every iterate (``rounding_i / bound_i``), D = 12, kappa = 51,
r = 30 (GD 90), geometric / clustered / outliers spectra x 2 seeds; the full table (kappa 10, 51,
1e3) is in docs/precision.md "Running error bounds (bf16)":

    kappa 51     float64    float32    bf16/storage  bf16/strict
    chebyshev    0.33-0.49  0.26-0.27  0.34-0.42     0.32-0.41
    gd           0.11-0.16  0.09-0.09  0.34-0.42     0.11-0.14
    agd          0.02-0.04  0.03-0.05  0.12-0.20     0.03-0.06

Not vacuous (test below): Chebyshev in bf16 storage mode on GKA Fig. 1a systems (a = 0.02,
kappa <= 51), D = 16, r = 30 (the paper's CH setting): max running bound 0.026-0.065 against a
measured rounding of 4.1e-3..7.2e-3, where the allowance is 1.59 (GD 0.024-0.050, AGD 0.15-0.42).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import solvers
from analysis.bounds import running as rb
from analysis.precision import PRECISIONS, allowance_applies
from analysis.references import iterative as gt
from analysis.testing.strategies import spd_batch, spd_system, spd_systems
from solvers import Arith

IDS = [a.label for a in PRECISIONS]
STORAGE = Arith(torch.bfloat16, "storage")
ITERS = {10.0: 40, 51.0: 30, 1e3: 100}


def split_of(method, S, arith, iters, iterates=None):
    H, q = S.H.to(arith.dtype), S.q.to(arith.dtype)
    split = gt.error_split(
        method, H, q, iters=iters, L=S.L, mu=S.mu, bf16_mode=arith.mode, iterates=iterates
    )
    return split, H, q


def check_of(method, S, arith, iters, iterates=None):
    split, H, q = split_of(method, S, arith, iters, iterates)
    return split, rb.running_check(split, H, q, L=S.L, mu=S.mu)


# --------------------------------------------------------------------- the grid


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
@pytest.mark.parametrize("kappa", sorted(ITERS))
@pytest.mark.parametrize("method", rb.METHODS)
def test_every_iterate_within_running_bound(method, kappa, arith):
    S = spd_system(12, kappa, "geometric", seed=3)
    iters = ITERS[kappa] * (3 if method == "gd" else 1)
    split, c = check_of(method, S, arith, iters)
    w = c.worst
    # rounding_i <= running bound_i (analysis.bounds.running: local bounds from the run, exact
    # propagation over the stored spectrum), every iterate
    assert w["rounding_ratio"] <= 1.0, w
    # every step's implied local error <= its componentwise bound (the model of solvers/*.py)
    assert w["local_ratio"] <= 1.0, w
    # the replay satisfies the bound's recurrence to float64 evaluation error 4 gamma_{D+6}(2^-53)
    assert w["recurrence_ratio"] <= 1.0, w
    # and the bound is not a formality: it is within a factor 100 of what is measured
    assert w["rounding_ratio"] > 0.01, w


@given(
    spd_systems(min_dim=2, max_dim=10, max_kappa=1e3),
    st.sampled_from(PRECISIONS),
    st.sampled_from(rb.METHODS),
)
def test_running_bound_property(S, arith, method):
    split, c = check_of(method, S, arith, 40)
    assert c.passes, c.worst  # rounding_i <= running bound_i, local_i <= 1, recurrence consistent


def test_running_bound_on_gka_systems_is_a_guarantee_where_the_allowance_is_not():
    """GKA Fig. 1a systems (a = 0.02, kappa <= 51, eq. (4)), D = 16, r = 30, bf16 storage mode:
    the allowance is 8 * 51 * (16 * 2^-24 + 2^-8) = 1.59 (vacuous); the running bound is
    < 0.1 for Chebyshev at every iterate (0.026-0.065 at tokens 8..64) and < 1 for GD/AGD."""
    P = solvers.fig1a_problems(B=1, T=64, heads=1, D=16, a=0.02, seed=0)
    H = P.A[0, (7, 15, 31, 63), 0].to(torch.bfloat16)
    q = P.q[0, (7, 15, 31, 63), 0].to(torch.bfloat16)
    assert not allowance_applies(P.L / P.mu, 16, STORAGE)
    for method, limit in (("chebyshev", 0.1), ("gd", 1.0), ("agd", 1.0)):
        split = gt.error_split(method, H, q, iters=30, L=P.L, mu=P.mu)
        c = rb.running_check(split, H, q, L=P.L, mu=P.mu)
        assert c.passes, (method, c.worst)
        assert float(c.bound.max()) < limit, (method, float(c.bound.max()))  # not vacuous


# ------------------------------------------------------------------ the API


def test_running_bound_from_solve_info_matches_the_check():
    """running_bound(info) is absolute; running_check divides by ||x*|| (mp eigenvalues)."""
    S = spd_system(8, 51.0, "outliers", seed=2)
    H, q = S.H.to(torch.bfloat16), S.q.to(torch.bfloat16)
    _, info = solvers.chebyshev(H, q, L=S.L, mu=S.mu, iters=30, return_info=True)
    absolute = rb.running_bound("chebyshev", H, q, info, L=S.L, mu=S.mu, arith=STORAGE)
    split = gt.error_split("chebyshev", H, q, iters=30, L=S.L, mu=S.mu, iterates=info.iterates)
    relative = rb.running_check(split, H, q, L=S.L, mu=S.mu).bound
    # float64 eigvalsh vs mp eigenvalues: each evaluation of the bound is within r^2 D u_64
    # relative (analysis/bounds/running.py), so 2 r^2 D u_64 = 1.6e-12 apart (measured 83u)
    tol = _evaluation_rtol(30, 8)
    torch.testing.assert_close(absolute / split.exact.x.norm(), relative, rtol=tol, atol=0.0)
    # the check can fail: the absolute bound is not the relative one (||x*|| != 1)
    assert not torch.allclose(absolute, relative, rtol=tol, atol=0.0)


def _evaluation_rtol(r: int, D: int) -> float:
    """Two float64 evaluations of a running bound over r iterations of a D x D system: each
    within r^2 D u_64 relative (its eigenvalues, magnitudes and responses; running.py's module
    docstring), so 2 r^2 D u_64 apart."""
    return 2 * r**2 * D * 2.0**-53


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
def test_working_omegas_are_the_solvers(arith):
    """The weights the bound assumes when a run reports none are bit for bit the solver's."""
    S = spd_system(6, 51.0, seed=1)
    _, info = solvers.chebyshev(
        S.H.to(arith.dtype),
        S.q.to(arith.dtype),
        L=S.L,
        mu=S.mu,
        iters=25,
        bf16_mode=arith.mode,
        return_info=True,
    )
    rho2 = gt.working_constants("chebyshev", S.L, S.mu, arith)["rho2"]
    assert torch.equal(rb.working_omegas(rho2, 25, arith), info.omegas.to(torch.float64))


def test_batched_bound_matches_per_system_and_leaves_inputs_alone():
    S1, S2 = spd_system(6, 10.0, seed=1), spd_system(6, 300.0, seed=2)
    H, q, L, mu = spd_batch([S1, S2], torch.bfloat16)
    _, info = solvers.agd(H, q, L=L, mu=mu, iters=20, return_info=True)
    H0, q0, its0 = H.clone(), q.clone(), info.iterates.clone()
    both = rb.running_bound("agd", H, q, info, L=L, mu=mu, arith=STORAGE)
    assert both.shape == (21, 2)
    assert torch.equal(H, H0) and torch.equal(q, q0) and torch.equal(info.iterates, its0)
    one = rb.running_bound(
        "agd",
        H[1],
        q[1],
        type(info)(
            info.residual_norms[:, 1],
            info.iterates[:, 1],
            info.system_status[1],
            info.precision,
            20,
        ),
        L=S2.L,
        mu=S2.mu,
        arith=STORAGE,
    )
    tol = _evaluation_rtol(20, 6)  # 5.3e-13 (measured: equal)
    torch.testing.assert_close(both[:, 1], one, rtol=tol, atol=0.0)
    # the check can fail: the other system's bound
    assert not torch.allclose(both[:, 0], one, rtol=tol, atol=0.0)


def test_empty_batch_and_zero_iterations():
    H = torch.eye(3, dtype=torch.float32).expand(0, 3, 3)
    q = torch.ones(0, 3, dtype=torch.float32)
    _, info = solvers.gd(H, q, L=1.0, mu=0.5, iters=4, return_info=True)
    assert rb.running_bound("gd", H, q, info, L=1.0, mu=0.5, arith=Arith(torch.float32)).shape == (
        5,
        0,
    )
    _, info = solvers.chebyshev(
        torch.eye(3), torch.ones(3), L=1.0, mu=0.5, iters=0, return_info=True
    )
    b = rb.running_bound(
        "chebyshev", torch.eye(3), torch.ones(3), info, L=1.0, mu=0.5, arith=Arith(torch.float32)
    )
    assert b.shape == (1,) and float(b[0]) > 0.0  # xi_0 = fl(step q): one rounding


def test_a_replay_with_exact_constants_is_refused():
    """The bound covers arithmetic rounding only: it is held against the working-constants replay."""
    S = spd_system(6, 51.0, seed=1)
    H, q = S.H.to(torch.bfloat16), S.q.to(torch.bfloat16)
    split = gt.error_split("chebyshev", H, q, iters=5, L=S.L, mu=S.mu, constants="exact")
    with pytest.raises(ValueError, match="split"):
        rb.running_check(split, H, q, L=S.L, mu=S.mu)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="method"):
        rb.local_bounds(
            "cg", torch.eye(2), torch.ones(2), torch.zeros(3, 2), L=1.0, mu=1.0, arith=STORAGE
        )
    with pytest.raises(ValueError, match="iterates"):
        rb.local_bounds(
            "gd", torch.eye(2), torch.ones(2), torch.zeros(3, 5), L=1.0, mu=1.0, arith=STORAGE
        )


# ------------------------------------------------------- broken implementations


def _chebyshev_bf16(H, q, L, mu, iters, *, store_twice=False, perturb=0.0):
    """solvers.chebyshev in bf16 storage mode with one deliberate change:
    store_twice -- the gradient step is stored to bf16, then the momentum added and stored again;
    perturb -- an extra ``perturb * u_bf16 * |xi|`` is added to every step before the store."""
    step = STORAGE.scalar(2.0 / (L + mu))
    rho2 = STORAGE.scalar(((L - mu) / (L + mu)) ** 2)
    qc, omega = q.float(), torch.tensor(2.0)
    prev, xi = torch.zeros_like(q), (step * qc).to(torch.bfloat16)
    its = [xi]
    for _ in range(iters):
        omega = 4.0 / (4.0 - rho2 * omega)
        g = H.float() @ xi.float() - qc
        if store_twice:
            half = (xi.float() - (omega * step) * g).to(torch.bfloat16)
            new = half.float() + (omega - 1.0) * (xi.float() - prev.float())
        else:
            new = xi.float() - (omega * step) * g + (omega - 1.0) * (xi.float() - prev.float())
        new = new + perturb * STORAGE.u_store * new.abs()
        prev, xi = xi, new.to(torch.bfloat16)
        its.append(xi)
    return torch.stack(its)


def _gd_agd_perturbed(method, H, q, L, mu, iters, perturb):
    """solvers.gd / agd in bf16 storage mode, each stored x perturbed by ``perturb u_bf16 |x|``."""
    up = lambda v: v.float()  # noqa: E731
    kick = lambda v: (v + perturb * STORAGE.u_store * v.abs()).to(torch.bfloat16)  # noqa: E731
    x = y = torch.zeros_like(q)
    if method == "gd":
        step = STORAGE.scalar(2.0 / (L + mu))
    else:
        step = STORAGE.scalar(1.0 / L)
        beta = STORAGE.scalar(((L / mu) ** 0.5 - 1.0) / ((L / mu) ** 0.5 + 1.0))
    its = [x]
    for _ in range(iters):
        base = x if method == "gd" else y
        x_new = kick(up(base) - step * (H.float() @ up(base) - q.float()))
        if method == "agd":
            y = (up(x_new) + beta * (up(x_new) - up(x))).to(torch.bfloat16)
        x = x_new
        its.append(x)
    return torch.stack(its)


@pytest.mark.parametrize("kappa", (10.0, 51.0))
def test_the_correct_variant_passes(kappa):
    S = spd_system(12, kappa, "geometric", seed=3)
    H = S.H.to(torch.bfloat16)
    its = _chebyshev_bf16(H, S.q.to(torch.bfloat16), S.L, S.mu, 30)
    _, c = check_of("chebyshev", S, STORAGE, 30, its)
    assert c.passes, c.worst


@pytest.mark.parametrize("kappa", (10.0, 51.0, 1e3))
def test_rounding_twice_per_step_violates_the_step_bound(kappa):
    """Two bf16 stores per step: each step commits up to ~2 u_bf16 |xi| where the model allows one
    store (u_bf16 |xi_hat|) plus fp32 terms; the implied local error exceeds its bound (measured
    local ratio 1.7-2.9, the correct solver's is <= 0.97). The summed bound absorbs it (ratio
    0.3-0.6): it is the step-wise part of the running bound that sees a second rounding."""
    S = spd_system(12, kappa, "geometric", seed=3)
    its = _chebyshev_bf16(
        S.H.to(torch.bfloat16), S.q.to(torch.bfloat16), S.L, S.mu, 30, store_twice=True
    )
    _, c = check_of("chebyshev", S, STORAGE, 30, its)
    assert c.worst["local_ratio"] > 1.0, c.worst


@pytest.mark.parametrize("method", rb.METHODS)
def test_extra_perturbation_of_10u_per_step_violates_the_running_bound(method):
    """An extra 10 u_bf16 |x| per step (kappa 51): the rounding exceeds the summed running bound
    at some iterate (measured/bound ~6 for Chebyshev) and every step's local bound (~11)."""
    S = spd_system(12, 51.0, "geometric", seed=3)
    H, q = S.H.to(torch.bfloat16), S.q.to(torch.bfloat16)
    if method == "chebyshev":
        its = _chebyshev_bf16(H, q, S.L, S.mu, 30, perturb=10.0)
    else:
        its = _gd_agd_perturbed(method, H, q, S.L, S.mu, 30, perturb=10.0)
    _, c = check_of(method, S, STORAGE, 30, its)
    assert c.worst["rounding_ratio"] > 1.0 and c.worst["local_ratio"] > 1.0, c.worst


def test_a_bound_that_forgets_the_bf16_store_is_violated():
    """The float32 model (no store rounding) applied to a bf16 storage-mode run: violated."""
    S = spd_system(12, 51.0, "geometric", seed=3)
    split, H, q = split_of("chebyshev", S, STORAGE, 30)
    wrong = rb.local_bounds(
        "chebyshev", H, q, split.iterates, L=S.L, mu=S.mu, arith=Arith(torch.float32)
    )
    c = rb.running_check(split, H, q, L=S.L, mu=S.mu, local=wrong)
    assert c.worst["rounding_ratio"] > 1.0 and c.worst["local_ratio"] > 1.0, c.worst


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
def test_a_bound_on_the_wrong_recurrence_is_inconsistent(arith, monkeypatch):
    """omega_{i-1} in place of omega_i (off by one in the weight schedule): the replay does not
    satisfy the bound's recurrence (residual >> its float64 evaluation error)."""
    exact = rb.exact_omegas

    def shifted(rho2, iters):
        hi, lo = exact(rho2, iters)
        return torch.cat([hi[..., :1], hi[..., :-1]], dim=-1), torch.cat(
            [lo[..., :1], lo[..., :-1]], dim=-1
        )

    monkeypatch.setattr(rb, "exact_omegas", shifted)
    S = spd_system(12, 51.0, "geometric", seed=3)
    _, c = check_of("chebyshev", S, arith, 30)
    assert c.worst["recurrence_ratio"] > 1.0, c.worst
