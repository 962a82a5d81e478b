"""The refined contract running bound (``analysis.bounds.contract``): never above the plain
sum-of-maxima bound with stores bounded by ``u ||x_hat||``, still covering every contract's
emulation (kappa up to 1000), and covering hand-built adversarial error sequences that a
non-rigorous quantity fails to cover."""

from __future__ import annotations

import math

import pytest
import torch

import analysis.bounds.contract as cb
from analysis.precision import Arith, gamma, rounding_allowance
from analysis.studies.contract_tightness import (
    _systems,
    adversarial_storage_run,
    binade_ridge_system,
    binade_ridge_worst_case,
    eigenbasis_store_bound,
    flip_search,
    strongest_operand_run,
    strongest_storage_run,
)
from analysis.testing import harness
from kernels import emulate

CONTRACTS = ("float32", "tf32", "bfloat16/operands", "bfloat16/storage")
U64 = 2.0**-53


def evaluation_slack(iters: int) -> float:
    """``1 + gamma_{2N+1}``: how far one float64 evaluation of ``linear_bound``'s running bound can
    sit above another whose exact value is at least as large, N roundings per evaluation.

    The refined and the old bound take the same float64 inputs (trajectory, responses, schedule:
    computed identically by both runs) through the same recursion, and exactly the refined one is
    never above the old: ``sqrt(S_1 S_2) <= S_2`` since ``S_1 <= S_2``, and the refined store
    ``min(u (||x|| + drift), spacing)`` is at most the old ``u (||x|| + drift)`` (a path of 2
    roundings, bounding it). When every step's responses peak at the same eigenvalue, S_1 = S_2
    exactly and the two evaluations round differently (S_1 and S_2 are summed over tensors of
    different shapes, which torch does not promise to reduce in one order): measured, the refined bound is then 1 ulp (2u relative) above the old one.
    Everything is a sum, product or square root of nonnegative values, degree 1 in the previous
    bounds, so relative errors never grow along the recursion, they only add (Higham Lemma 3.1):
    per step, along any path, at most 19 roundings forming the local error from E_{i-1}, E_{i-2}
    (``linear_bound``'s eta, counted on its code), twice the combination (a product per term,
    <= iters + 1 steps and <= 3 channels summed, S_1 S_2, sqrt, SAFETY: iters + 6), and 3 for the
    store and its addition: ``2 iters + 34``. Each evaluation is within gamma_N of its exact value,
    ``N = (iters + 1)(2 iters + 34)``, so ``new <= old (1 + gamma_N) / (1 - gamma_N) = old (1 +
    gamma_2N)``, and one more rounding forms ``old * slack``: ``1 + gamma_{2N+1}``, 6.5e-13 at 30
    steps."""
    n = (iters + 1) * (2 * iters + 34)
    return 1.0 + gamma(2 * n + 1, U64)


# float64 evaluation of a bound against an attained error: S_1, S_2 and the attained error are
# each sums of <= 12 nonnegative products (gamma_12 relative, Higham Lemma 3.1); sqrt(S_1 S_2)
# adds a product and a sqrt (2u): the bound covers the attained error to within
# gamma_12 + (2 gamma_12 + 2u)/2 <= gamma_26 relative
COVER_SLACK = 1.0 - gamma(26, U64)


def sum_of_maxima(resp, norms, gain=None):
    """The previous combination: sum over steps and channels of max_k |tau m| times ||eta||."""
    return sum((t.amax(-1) * norms[ch]).sum(0) for ch, t in resp.items())


def unit_roundoff_store(x, drift, u, dtype):
    """The previous store term: u (||x|| + drift)."""
    return u * (torch.linalg.vector_norm(x, dim=-1) + drift)


def _bounds(monkeypatch, method, H, q, contract, **kw):
    new = cb.linear_bound(method, H, q, contract=contract, **kw)
    with monkeypatch.context() as m:
        m.setattr(cb, "propagated_norm_bound", sum_of_maxima)
        m.setattr(cb, "store_error_bound", unit_roundoff_store)
        old = cb.linear_bound(method, H, q, contract=contract, **kw)
    return new, old


@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("method", ("chebyshev", "gd", "agd"))
@pytest.mark.parametrize("kappa", (2.0, 51.0, 1000.0))
def test_refined_bound_is_below_the_old_one_and_covers_the_emulation(
    monkeypatch, contract, method, kappa
):
    case = harness.spd_case(16, (4,), kappa, iters=30, seed=3)
    H, q = (case.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
    L, mu = case.options["L"], case.options["mu"]
    new, old = _bounds(monkeypatch, method, H, q, contract, L=L, mu=mu, iters=30)
    assert torch.equal(new.x, old.x)
    # never above the old bound but for the float64 evaluation of both (evaluation_slack)
    assert bool((new.bound <= old.bound * evaluation_slack(30)).all()), (
        new.bound[-1],
        old.bound[-1],
    )
    x = getattr(emulate, method)(
        H.float(), q.float(), L=L, mu=mu, iters=30, contract=contract
    ).double()
    measured = torch.linalg.vector_norm(x - new.x[-1], dim=-1)
    assert bool((measured <= new.bound[-1]).all()), (
        measured,
        new.bound[-1],
    )  # the contract's running bound


@pytest.mark.parametrize("contract", CONTRACTS)
def test_refined_bound_on_gka_ridge_systems(monkeypatch, contract):
    case = harness.gka_ridge_case(32, (4,), a=0.02, iters=30, kappa_h=1e4, seed=1)
    H, q = (case.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
    fro = torch.linalg.matrix_norm(H)
    lam = 0.02 * fro
    new, old = _bounds(
        monkeypatch, "chebyshev", H, q, contract, L=fro + lam, mu=lam, iters=30, shift=lam
    )
    assert bool((new.bound <= old.bound * evaluation_slack(30)).all())  # evaluation_slack
    assert bool((new.bound[-1] < old.bound[-1]).all()) or contract == "float32"  # it does tighten
    x = emulate.gka_ridge(H.float(), q.float(), a=0.02, iters=30, contract=contract).double()
    assert bool((torch.linalg.vector_norm(x - new.x[-1], dim=-1) <= new.bound[-1]).all())


# --- adversarial error sequences --------------------------------------------------------------


def _worst_aligned(resp, norms):
    """The error of ``w_n = sign(t_{n,k}) e_n`` along one eigenvector k, best k: attained
    exactly, so any rigorous bound is at least this."""
    width = next(iter(resp.values())).shape[-1]
    return max(
        float(sum((t[..., k].abs() * norms[ch]).sum(0) for ch, t in resp.items()))
        for k in range(width)
    )


def _same_run(a: torch.Tensor, b: torch.Tensor, A: torch.Tensor) -> bool:
    """Two float64 runs of the same Chebyshev recurrence on A (the study's unperturbed run and
    linear_bound's reference trajectory, which may sum in another order): each within the
    rounding allowance c kappa (D u + u) of the exact iterate, relative to ||x*|| (docs/precision.md),
    so within twice it of each other (measured: 8e-16 relative; allowance 7.7e-13 at kappa = 51,
    D = 16)."""
    lam = torch.linalg.eigvalsh(A)
    allow = rounding_allowance(float(lam[-1] / lam[0]), A.shape[-1], Arith(torch.float64))
    return float(torch.linalg.vector_norm(a - b)) <= 2 * allow * float(torch.linalg.vector_norm(a))


def _two_eigenvalue_case():
    """Two steps whose responses peak at different eigenvalues: T_1 = diag(1, 0), T_2 = diag(0, 1),
    ||w_n|| <= 1. Attained: w_1 = e_1, w_2 = e_2 -> ||T_1 w_1 + T_2 w_2|| = sqrt(2) = sqrt(S1 S2)."""
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    return {"plain": t}, {"plain": torch.ones(2, dtype=torch.float64)}, math.sqrt(2.0)


def _covers(bound_fn) -> bool:
    """Whether ``bound_fn`` covers the attained errors of the adversarial sequences."""
    resp, norms, attained = _two_eigenvalue_case()
    if float(bound_fn(resp, norms)) < attained * COVER_SLACK:
        return False
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        resp = {
            ch: torch.rand(6, 5, generator=gen, dtype=torch.float64) ** 4
            for ch in ("plain", "operand")
        }
        norms = {ch: torch.rand(6, generator=gen, dtype=torch.float64) for ch in resp}
        if float(bound_fn(resp, norms)) < _worst_aligned(resp, norms) * COVER_SLACK:
            return False
    return True


def test_combination_covers_adversarial_sequences_and_the_check_can_fail():
    assert _covers(cb.propagated_norm_bound)
    assert _covers(sum_of_maxima)
    resp, norms, attained = _two_eigenvalue_case()
    # the bound is attained: entries 0 and 1 make S_1 = 1 and S_2 = 2 exact, and sqrt is
    # correctly rounded (IEEE) in torch as in math: equal, no tolerance
    assert float(cb.propagated_norm_bound(resp, norms)) == attained
    # not rigorous: the max over eigenvalues of the sum alone, or the bound shaved by 10%
    assert not _covers(
        lambda r, n: torch.stack(
            [
                sum((t[..., k].abs() * n[ch]).sum(0) for ch, t in r.items())
                for k in range(next(iter(r.values())).shape[-1])
            ]
        ).amax(0)
    )
    assert not _covers(lambda r, n: 0.9 * cb.propagated_norm_bound(r, n))


def test_storage_bound_covers_an_adversarial_store_sequence():
    """Errors of a full half spacing, aligned with the eigenvector of the smallest eigenvalue
    (where the responses peak) with the sign that adds them up: the bound must cover it; the
    same check fails for the bound without the drift term (stores bounded by h(x) alone)."""
    D, iters = 16, 30
    had = torch.tensor([[1.0]], dtype=torch.float64)
    while had.shape[0] < D:
        had = torch.cat([torch.cat([had, had], 1), torch.cat([had, -had], 1)], 0)
    V = had / math.sqrt(D)  # |v_k| all equal: the store errors project fully onto v_min
    lam = torch.cat(
        [torch.tensor([1.0 / 51]), torch.linspace(0.5, 1.0, D - 1, dtype=torch.float64)]
    )
    H = V @ torch.diag(lam) @ V.T
    q = H @ (
        1.001 * torch.sign(V[:, 0])
    )  # x* along v_min, every component just above a power of two
    L, mu = float(lam.max()), float(lam.min())
    run = cb.linear_bound("chebyshev", H, q, L=L, mu=mu, iters=iters, contract="bfloat16/storage")
    x, exact = adversarial_storage_run(H, q, L=L, mu=mu, iters=iters, v=V[:, 0])
    assert _same_run(exact, run.x[-1], H)
    err = float(torch.linalg.vector_norm(x - exact))
    bound = float(run.bound[-1])
    assert err <= bound, (err, bound)
    x, exact = strongest_storage_run(
        H, q, L=L, mu=mu, iters=iters
    )  # searched signs: at least as strong
    searched = float(torch.linalg.vector_norm(x - exact))
    # the search's first round takes sign(tau_j(A) x*) with x* along v_min by construction:
    # the aligned signs themselves, so at least as strong exactly (no tolerance)
    assert err <= searched <= bound, (err, searched, bound)
    print(f"adversarial storage error / bound = {err / bound:.3f}, searched {searched / bound:.3f}")
    with pytest.MonkeyPatch.context() as m:  # drop the drift: not rigorous
        m.setattr(
            cb,
            "store_error_bound",
            lambda x, d, u, dt: (
                u
                * torch.linalg.vector_norm(
                    u * torch.exp2(torch.floor(torch.log2(x.abs()))) / u, dim=-1
                )
            ),
        )
        assert (
            float(
                cb.linear_bound(
                    "chebyshev", H, q, L=L, mu=mu, iters=iters, contract="bfloat16/storage"
                ).bound[-1]
            )
            < err
        )


def test_operand_rounding_sequences_stay_within_the_bound_and_are_not_small():
    """bfloat16/operands on SPD systems at kappa = 51: the strongest operand-rounding sequence
    found (any signs, full half spacings) stays below the bound and reaches over a quarter of it
    (0.39 at D = 128, docs/harness.md): the bound's size at the worst-case spectrum belongs to the
    rounding model, not to slack, and a bound shaved to a quarter would be unsound."""
    case = harness.spd_case(32, (3,), 51.0, iters=30, seed=1)
    H, q = (case.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
    bound_kw = {"L": case.options["L"], "mu": case.options["mu"]}
    run = cb.linear_bound("chebyshev", H, q, iters=30, contract="bfloat16/operands", **bound_kw)
    for s, (A, L, mu) in enumerate(_systems(H, q, bound_kw)):
        x, exact = strongest_operand_run(A, q[s], L=L, mu=mu, iters=30)
        assert _same_run(exact, run.x[-1, s], A)
        err, bound = float(torch.linalg.vector_norm(x - exact)), float(run.bound[-1, s])
        assert 0.25 * bound < err <= bound, (err, bound)


def test_same_run_check_fails_one_iterate_off():
    """_same_run can fail: x_29 in place of x_30 (an off-by-one trajectory index) is ~R^30 ||x||
    = 2e-4 relative away, far beyond twice the float64 allowance."""
    case = harness.spd_case(16, (1,), 51.0, iters=30, seed=3)
    H, q = (case.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
    L, mu = case.options["L"], case.options["mu"]
    run = cb.linear_bound("chebyshev", H, q, L=L, mu=mu, iters=30, contract="bfloat16/storage")
    x, exact = adversarial_storage_run(H[0], q[0], L=float(L[0]), mu=float(mu[0]), iters=30, v=q[0])
    assert _same_run(exact, run.x[-1, 0], H[0])
    assert not _same_run(exact, run.x[-2, 0], H[0])


def test_searched_store_signs_stay_within_the_bound_on_ridge_systems():
    """GKA ridge systems: the strongest store sequence found (any signs, full half spacings) stays
    below the bound and beats the one signed along the bottom eigenvector; combining the same
    store errors componentwise in A's eigenbasis costs more than by norms (why it is not used)."""
    case = harness.gka_ridge_case(32, (3,), a=0.02, iters=30, kappa_h=1e4, seed=2)
    H, q = (case.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
    fro = torch.linalg.matrix_norm(H)
    lam = 0.02 * fro
    run = cb.linear_bound(
        "chebyshev", H, q, L=fro + lam, mu=lam, iters=30, shift=lam, contract="bfloat16/storage"
    )
    for s in range(3):
        A = H[s] + lam[s] * torch.eye(32, dtype=torch.float64)
        L, mu = float(fro[s] + lam[s]), float(lam[s])
        x, exact = strongest_storage_run(A, q[s], L=L, mu=mu, iters=30)
        searched = float(torch.linalg.vector_norm(x - exact))
        x, exact = adversarial_storage_run(
            A, q[s], L=L, mu=mu, iters=30, v=torch.linalg.eigh(A).eigenvectors[:, 0]
        )
        aligned = float(torch.linalg.vector_norm(x - exact))
        assert aligned < searched <= float(run.bound[-1, s]), (
            aligned,
            searched,
            float(run.bound[-1, s]),
        )
        comp, norm = eigenbasis_store_bound(A, run.x[:, s], L=L, mu=mu, iters=30)
        assert float(comp) > float(norm)


def test_sign_flips_never_weaken_the_search_and_stay_within_the_bound():
    """flip_search judges each flip on the whole perturbed run, binade jumps included: the refined
    sequence is at least as strong as the first-order one, still within the bound, and a flip
    that weakens it is never kept (the search on a sequence of all +1 signs only grows)."""
    case = harness.gka_ridge_case(16, (2,), a=0.02, iters=20, kappa_h=1e4, seed=5)
    H, q = (case.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
    fro = torch.linalg.matrix_norm(H)
    lam = 0.02 * fro
    run = cb.linear_bound(
        "chebyshev", H, q, L=fro + lam, mu=lam, iters=20, shift=lam, contract="bfloat16/storage"
    )
    for s in range(2):
        A = H[s] + lam[s] * torch.eye(16, dtype=torch.float64)
        kw = dict(L=float(fro[s] + lam[s]), mu=float(lam[s]), iters=20)
        plain = torch.linalg.vector_norm(torch.sub(*strongest_storage_run(A, q[s], **kw)))
        refined = torch.linalg.vector_norm(
            torch.sub(*strongest_storage_run(A, q[s], flips=2, **kw))
        )
        assert plain <= refined <= run.bound[-1, s], (plain, refined, run.bound[-1, s])
        ones = torch.ones(21, 16, dtype=torch.float64)
        start = torch.linalg.vector_norm(
            torch.sub(*adversarial_storage_run(A, q[s], signs=ones, **kw))
        )
        signs = flip_search(A, q[s], signs=ones, sweeps=1, **kw)
        after = torch.linalg.vector_norm(
            torch.sub(*adversarial_storage_run(A, q[s], signs=signs, **kw))
        )
        assert after > start


def test_store_error_bound_covers_rounding_within_the_drift():
    """Round ``y = x + drift`` to bf16 for drifts spent where they cost most (on the components
    nearest the next power of two) and at random: ``||fl(y) - y||`` within the bound, which is
    below ``u (||x|| + drift)``; without the knapsack term the drift into the next binade is missed."""
    u = 2.0**-8
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=gen, dtype=torch.float64)
    nx = torch.linalg.vector_norm(x, dim=-1)
    for rel in (0.0, 1e-3, 0.02, 0.1):
        drift = rel * nx
        bound = cb.store_error_bound(x, drift, u, torch.bfloat16)
        # exact: store_error_bound returns min(u (nx + drift), spacing) with the same float64
        # operations on the same x and drift, so its first term equals this side bit for bit
        assert bool((bound <= u * (nx + drift)).all())
        gap = torch.exp2(torch.floor(torch.log2(x.abs())) + 1) - x.abs()
        # all the drift on the component nearest its next power of two, just past it
        k = gap.argmin(-1, keepdim=True)
        push = torch.zeros_like(x).scatter(
            -1, k, torch.minimum(drift.unsqueeze(-1), gap.gather(-1, k) * 1.0000001)
        )
        rand = torch.randn(x.shape, generator=gen, dtype=torch.float64)
        rand = rand / torch.linalg.vector_norm(rand, dim=-1, keepdim=True) * drift.unsqueeze(-1)
        # the drift that makes the largest error in the next binade: |y_k| = T_k + 2h_k (just under)
        T = torch.exp2(torch.floor(torch.log2(x.abs())) + 1)
        far = torch.zeros_like(x).scatter(
            -1,
            k,
            torch.minimum(
                drift.unsqueeze(-1), (T - x.abs() + 2 * u * T / 2 * (1 - 2.0**-20)).gather(-1, k)
            ),
        )
        for y in (x + torch.sign(x) * push, x + torch.sign(x) * far, x + rand):
            err = torch.linalg.vector_norm(y.to(torch.bfloat16).double() - y, dim=-1)
            assert bool((err <= bound).all()), (rel, (err / bound).max())
    # the check can fail: h(x) alone does not cover a push into the next binade
    x = torch.tensor(
        [[1.0 - 2.0**-9, 1.0 - 2.0**-9]], dtype=torch.float64
    )  # fl rounds exactly onto 1
    y = torch.tensor(
        [[1.0 + 2.0**-8 - 2.0**-30, 1.0 + 2.0**-8 - 2.0**-30]], dtype=torch.float64
    )  # h(y) = 2^-8
    drift = torch.linalg.vector_norm(y - x, dim=-1)
    err = torch.linalg.vector_norm(y.to(torch.bfloat16).double() - y, dim=-1)
    h_of_x = torch.linalg.vector_norm(u * torch.exp2(torch.floor(torch.log2(x.abs()))), dim=-1)
    assert bool((err > h_of_x).all()) and bool(
        (err <= cb.store_error_bound(x, drift, u, torch.bfloat16)).all()
    )


def test_the_rounding_model_allows_over_five_percent_on_a_ridge_system_at_gka_settings():
    """At the issue's own settings (GKA's ridge form, a = 0.02 so kappa = 51, r = 30, D = 128,
    bf16 inputs), a store sequence the bf16-storage rounding model allows moves x_r by more than
    5% of ||x||: no bound built on that model can be 5% on every such system (docs/harness.md,
    "Non-vacuity"). The bound covers it, and the same check fails for the bound without the
    drift in the stores (below the searched error here: the drift term is needed)."""
    H, q = binade_ridge_system(128)
    assert torch.equal(H.to(torch.bfloat16).double(), H)  # bf16 inputs
    assert torch.equal(q.to(torch.bfloat16).double(), q)
    # PSD: eigvalsh's eigenvalues are within p(D) u ||H||_2 of the exact ones (LAPACK Users'
    # Guide 4.7; p(D) = D for Householder tridiagonalisation): measured -2.8u, bound -128u
    assert float(torch.linalg.eigvalsh(H)[0]) >= -H.shape[-1] * U64 * float(
        torch.linalg.matrix_norm(H, 2)
    )
    fro = torch.linalg.matrix_norm(H)
    # kappa of eq. (4)'s interval: (1 + a)/a with a = fl(0.02) (its representation error u moves
    # 1/a by 50u) and 4 roundings: gamma_5 relative (measured: 1 ulp of 51 = 1.4e-16 relative)
    assert math.isclose(
        float((fro + 0.02 * fro) / (0.02 * fro)), 51.0, rel_tol=gamma(5, U64), abs_tol=0.0
    )
    w = binade_ridge_worst_case(128, iters=30)
    assert 0.05 < w["searched_over_x"] <= w["bound_over_x"], w
    assert w["drift_free_over_x"] < w["searched_over_x"]
    print(
        f"binade ridge system: searched {w['searched_over_x']:.4f}, bound {w['bound_over_x']:.4f}, "
        f"round-to-nearest {w['emulation_over_x']:.5f} of ||x||"
    )
