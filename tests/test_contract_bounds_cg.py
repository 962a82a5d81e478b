"""CG's finite-precision convergence bound (``analysis.bounds.contract.cg_bound``: the Chebyshev
rate of a spectrum widened by delta, Greenbaum 1989, plus the residual gap's local errors through
``A^-1/2``, Greenbaum 1997; a model, see the module docstring).

Correct CGs never exceed it, at every step checked, under every contract; it uses where x* lies
in the spectrum; and under the bf16 contracts it is now conclusive where the former floor
``4 u_b kappa^1.5`` was not, so broken CGs that were INCONCLUSIVE there FAIL.
"""

from __future__ import annotations

import math

import pytest
import torch

import solvers
from analysis.bounds.contract import cg_bound
from analysis.testing import harness
from analysis.testing.strategies.spd import haar_orthogonal, log_uniform_spd
from kernels import emulate
from solvers.contracts import parse

F64 = torch.float64
CONTRACTS = ("float32", "tf32", "bfloat16/operands", "bfloat16/storage")


def _spectrum(D, n, kappa, kind, g):
    if D == 1:
        return torch.ones(n, 1, dtype=F64)
    if kind == "log-uniform":
        t = torch.rand(n, D, dtype=F64, generator=g)
        t[:, 0], t[:, 1] = 0.0, 1.0
        return kappa ** (t - 1.0)
    i = torch.arange(D, dtype=F64)
    if kind == "linear":  # spread evenly: where the Chebyshev rate is closest to exact CG's
        lam = 1.0 / kappa + i / (D - 1) * (1.0 - 1.0 / kappa)
    else:  # Strakos (1991), rho = 0.8: dense at the low end, isolated at the top, where
        # finite-precision CG is delayed most against exact CG
        lam = 1.0 / kappa + i / (D - 1) * (1.0 - 1.0 / kappa) * 0.8 ** (D - 1 - i)
    return lam.expand(n, D).clone()


def _systems(D, kappa, kind, where, *, n=4, seed=0):
    """n SPD systems with bf16 values: H = Q diag(lam) Q^T (Haar Q), q Gaussian or along H's
    bottom or top eigenvector (plus 1e-3 of a Gaussian), both rounded to bf16; None where the
    rounding made a matrix indefinite (kappa 1000 at D >= 16: no A-norm, as the harness's
    ``spd_case`` refuses too)."""
    g = torch.Generator().manual_seed(seed)
    lam = _spectrum(D, n, kappa, kind, g)
    Q = haar_orthogonal(D, batch=(n,), generator=g)
    H = (Q * lam.unsqueeze(-2)) @ Q.transpose(-1, -2)
    z = torch.randn(n, D, dtype=F64, generator=g)
    q = {"gaussian": z, "bottom": Q[..., 0] + 1e-3 * z, "top": Q[..., -1] + 1e-3 * z}[where]
    H, q = ((H + H.transpose(-1, -2)) / 2).to(torch.bfloat16), q.to(torch.bfloat16)
    if not bool((torch.linalg.eigvalsh(H.double())[:, 0] > 0).all()):
        return None
    return H, q


def _relative_anorm_error(H, q, x):
    """``||x - x*||_A / ||x*||_A`` in float64 on the rounded inputs, x ``(..., n, D)``."""
    A, b = H.double(), q.double()
    xs = torch.linalg.solve(A, b.unsqueeze(-1)).squeeze(-1)
    e = x.double() - xs
    err = torch.sqrt(torch.clamp((e * (A @ e.unsqueeze(-1)).squeeze(-1)).sum(-1), min=0.0))
    return err / torch.sqrt((xs * b).sum(-1))


def _steps(D, kappa):
    """Steps checked: 1, 2, 3, D/2, D, D + 2, 2D. Past convergence the recursive ``r^T r`` would
    shrink into fp32's subnormals, which the rounding model, as every standard one, excludes; the
    CGs checked here freeze at the rounding floor ``r^T r <= (u ||q||)^2`` (kernels.cg's guard,
    followed by kernels.emulate.cg and solvers.cg), so every step up to 2D is inside the model."""
    return sorted({1, 2, 3, D // 2, D, D + 2, 2 * D} - {0})


GRID = [
    (D, kappa, kind, where)
    for D in (1, 2, 5, 8, 16, 32)
    for kappa in (1.5, 16.0, 100.0, 1000.0)
    for kind in ("log-uniform", "linear", "strakos")
    for where in ("gaussian", "bottom", "top")
    if D > 1 or (kappa == 1.5 and kind == "log-uniform")
]


@pytest.mark.parametrize("contract", CONTRACTS)
def test_cg_bound_covers_the_contracts_emulation_at_every_step_checked(contract):
    """kernels.emulate.cg under its contract (result kept in float32: the harness adds the
    output's rounding separately) against cg_bound on 286 system groups, D 1-32, kappa up to
    1000, three spectra, q Gaussian or along the bottom / top eigenvector."""
    worst, used = 0.0, 0
    for i, (D, kappa, kind, where) in enumerate(GRID):
        system = _systems(D, 1.0 if D == 1 else kappa, kind, where, seed=i)
        if system is None:
            continue
        H, q = system
        used += 1
        ks = _steps(D, kappa)
        bound = cg_bound(H, iters=max(ks), contract=contract, q=q, all_steps=True).relative
        for k in ks:
            x = emulate.cg(H, q, iters=k, contract=f"{contract};output=float32")
            err = _relative_anorm_error(H, q, x)
            # cg_bound: ||x_k - x*||_A <= (min(1, 2 R_delta^k) + gap floor) ||x*||_A
            assert bool((err <= bound[k]).all()), (D, kappa, kind, where, k, err, bound[k])
            worst = max(worst, float((err / bound[k]).max()))
    assert used >= 0.9 * len(GRID), used
    assert worst > 0.5, worst  # the bound is not loose everywhere: the rate is attained at k = 1


def test_cg_bound_covers_solvers_cg_in_bf16_storage_at_every_step():
    """solvers.cg in bf16 storage mode (its iterates, every step to 2D) against cg_bound under
    the contract of that mode (``of_reference(bfloat16, "storage")`` = ``bfloat16/storage``)."""
    for i, (D, kappa, kind, where) in enumerate(GRID):
        system = _systems(D, 1.0 if D == 1 else kappa, kind, where, seed=100 + i)
        if system is None:
            continue
        H, q = system
        K = max(_steps(D, kappa))
        _, info = solvers.cg(H, q, iters=K, return_info=True)
        err = _relative_anorm_error(H, q, torch.stack(list(info.iterates)))
        bound = cg_bound(H, iters=K, contract="bfloat16/storage", q=q, all_steps=True).relative
        # cg_bound at every step 1..K (step 0 is x = 0: error and bound both ||x*||_A, equal up to
        # their float64 evaluation)
        assert bool((err[1:] <= bound[1:]).all()), (D, kappa, kind, where, (err / bound).max())


def test_cg_bound_uses_where_x_star_lies():
    """Without q the bound takes the worst q (``sqrt(lam_n) ||x*|| / ||x*||_A`` and
    ``||q|| / (sqrt(lam_1) ||x*||_A)`` both sqrt(kappa)), so it is never below the bound given
    any q; x* along the top eigenvector gets a lower floor than along the bottom one (the
    iterate's store, ``u sqrt(lam_n) ||x||``, is worth sqrt(kappa) less in ``||x*||_A`` units)."""
    floors = {}
    for where in ("gaussian", "bottom", "top"):
        H, q = _systems(16, 100.0, "log-uniform", where, seed=7)  # SPD once rounded (checked)
        for c in ("bfloat16/operands", "bfloat16/storage", "float32"):
            given = cg_bound(H, iters=30, contract=c, q=q)
            worst_q = cg_bound(H, iters=30, contract=c)
            assert bool((worst_q.relative >= given.relative).all()), (where, c)
            floors[where, c] = given.attainable
    assert bool((floors["top", "bfloat16/storage"] < floors["bottom", "bfloat16/storage"]).all())


def _median_bound(contract, kappa, D=16, iters=30):
    g = torch.Generator().manual_seed(0)
    H = log_uniform_spd(D, 32, kappa, 1.0, g).to(torch.bfloat16)
    q = torch.randn(32, D, dtype=F64, generator=g).to(torch.bfloat16)
    return float(cg_bound(H, iters=iters, contract=contract, q=q).relative.median())


@pytest.mark.parametrize(
    "contract, documented",
    [
        ("bfloat16/operands", (0.063, 0.21, 0.48)),
        ("bfloat16/storage", (0.32, 1.4, 3.7)),
        ("tf32", (0.015, 0.048, 0.10)),  # tf32 u = 2^-10 (truncation, run 35)
    ],
)
def test_cg_bound_at_the_documented_kappas(contract, documented):
    """bound / ||x*||_A at kappa 16, 51, 100 (D = 16, k = 30, log-uniform spectra, Gaussian q,
    median of 32: docs/harness.md, the spd_nobounds bullet), to the 2 digits printed. The former
    floor alone, ``4 u_b kappa^1.5`` (``u_b = 2^-8 + gamma_16(2^-24)``), was 1.0, 5.8 and 15.6 for
    both bf16 contracts: vacuous from kappa 16."""
    for kappa, doc in zip((16.0, 51.0, 100.0), documented):
        got = _median_bound(contract, kappa)
        assert abs(got - doc) <= 0.05 * doc, (contract, kappa, got, doc)  # 2 significant digits
    u_b = 2.0**-8 + 16 * 2.0**-24 / (1 - 16 * 2.0**-24)
    if contract.startswith("bfloat16"):
        assert 4 * u_b * 16.0**1.5 > 1.0  # the former floor at kappa 16: vacuous by itself


def _cg_beta0(contract):
    """CG with beta = 0 (steepest descent with CG's alpha), honouring ``contract``'s roundings
    (bf16 operands of every product, bf16 stores): a slip a kernel author can make."""
    c = parse(contract)

    def op(v):
        return v.to(torch.bfloat16).float() if c.operands == "bf16" else v

    def st(what, v):
        return v.to(torch.bfloat16).float() if c.stores(what) else v

    def cg(H, q, *, iters):
        Hf, qf = H.float(), q.float()
        x, r = torch.zeros_like(qf), st("residual", qf)
        for _ in range(iters):
            p = st("direction", r)
            Ap = (op(Hf) @ op(p).unsqueeze(-1)).squeeze(-1)
            pAp, rr = (op(p) * op(Ap)).sum(-1), (op(r) * op(r)).sum(-1)
            ok = (pAp > 0) & (rr > 0)
            a = torch.where(ok, rr / torch.where(ok, pAp, torch.ones_like(pAp)), 0.0)
            x = st("iterate", x + a.unsqueeze(-1) * p)
            r = st("residual", r - a.unsqueeze(-1) * Ap)
        return x.to(q.dtype)

    return cg


def _check(kernel, contract):
    return harness.check(
        kernel,
        solvers.cg,
        harness.spd(bounds=False),
        precision="bfloat16",
        model=contract,
        device="cpu",
        shrink=False,
        seed=0,
    )


def test_broken_cgs_fail_under_bf16_operands_where_they_were_inconclusive():
    """The default spd_nobounds strategy (D <= 16, kappa <= 100, up to 30 steps), seed 0, the
    profile's examples, under ``bfloat16/operands``. With the former floor 8 of the 12 cases
    were vacuous and every run INCONCLUSIVE, the correct emulation and the broken ones alike
    (beta = 0, half the steps). Now the correct CG PASSes with every case conclusive and both
    broken CGs FAIL (ratios 2.1 and 1.1 at seed 0)."""
    contract = "bfloat16/operands"
    ok = _check(emulate.bind(emulate.cg, contract), contract)
    assert ok.verdict == harness.PASS and ok.vacuous_cases == 0, str(ok)
    for broken in (_cg_beta0(contract), emulate.bind(emulate.cg, contract, "half")):
        rep = _check(broken, contract)
        assert rep.verdict == harness.FAIL, str(rep)


@pytest.mark.parametrize(
    "kw, exc, what",
    [
        (dict(q=torch.ones(2, dtype=F64)), ValueError, "q"),
        (dict(q=torch.ones(2, 3, dtype=F64)), ValueError, "batch"),
        (dict(all_steps=1), TypeError, "all_steps"),
    ],
)
def test_cg_bound_bad_q_and_flags(kw, exc, what):
    H = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=F64)).expand(4, 3, 3)
    with pytest.raises(exc, match=what):
        cg_bound(H, iters=2, contract="float32", **kw)


def test_cg_bound_all_steps_and_edge_cases():
    H = torch.diag(torch.tensor([1.0, 2.0, 4.0], dtype=F64)).expand(2, 3, 3)
    q = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=F64)
    b = cg_bound(H, iters=5, contract="bfloat16/storage", q=q, all_steps=True)
    assert b.rate.shape == b.attainable.shape == (6, 2)
    last = cg_bound(H, iters=5, contract="bfloat16/storage", q=q)
    assert torch.equal(last.relative, b.relative[-1])
    assert bool(torch.isfinite(b.relative).all())  # q = 0: finite, never NaN
    assert torch.equal(b.rate[0], torch.ones(2, dtype=F64))  # x_0 = 0: error ||x*||_A exactly
    bad = torch.diag(torch.tensor([-1.0, 1.0, 2.0], dtype=F64))
    rel = cg_bound(bad, iters=2, contract="float32", q=torch.ones(3, dtype=F64)).relative
    assert math.isinf(float(rel))  # no A-norm: inf, not a NaN that reads as a pass
