"""The running bound of the reverse backward methods (GKA Algorithm 2, corrected: eq. (46), (48),
(49); ``analysis.bounds.reverse_backward``) and its use by the harness's ``spd_backward``.

(a) it holds for the references: ``solvers.chebyshev_backward`` (reverse, reverse_stored_omega)
    in float32, bf16 storage and bf16 strict, an emulation of the bf16-operands and tf32
    contracts, and ``kernels.chebyshev_backward`` under the interpreter, on drawn cases with
    kappa up to 100 and several iteration counts;
(b) broken reversals FAIL the harness where the bound is conclusive (float32, kappa <= 51,
    r <= 10): the omega schedule applied in the wrong order, one reversed step skipped, dq
    scaled by 0.9 -- and the correct emulation PASSes there;
(c) tightness, measured / bound, is reported (``-s``) and kept within (0, 1].
"""

import os
import statistics

import pytest
import torch

import solvers
from analysis.bounds.reverse_backward import reverse_backward_bound
from analysis.studies.reverse_backward_bound import reverse_system as system
from analysis.testing import harness
from solvers.contracts import of_reference

F32 = torch.float32
REVERSE = ("reverse", "reverse_stored_omega")


def _round_tf32(v):
    """Round to tf32 (10 stored mantissa bits), to nearest even."""
    m, e = torch.frexp(v)
    return torch.ldexp(torch.round(m * 2.0**11) / 2.0**11, e)


_OPERAND = {
    "fp32": lambda v: v,
    "bf16": lambda v: v.to(torch.bfloat16).to(F32),
    "tf32": _round_tf32,
}


def emulated_reverse(
    H,
    q,
    grad_x,
    *,
    L,
    mu,
    iters,
    method,
    operands="fp32",
    order="right",
    skip=None,
    dq_scale=1.0,
):
    """Corrected GKA Algorithm 2 with stored weights (eq. (46), (48), (49)) in float32, every
    product's vector operand rounded to ``operands`` (the contract ``float32``, ``tf32`` or
    ``bfloat16/operands``). Broken on request: ``order="reversed"`` applies omega_{r+1-i} at
    step i; ``skip`` leaves out reversed step ``skip``; ``dq_scale`` scales dq."""
    rnd = _OPERAND[operands]
    H, q, g = H.to(F32), q.to(F32), grad_x.to(F32)
    batch = torch.broadcast_shapes(H.shape[:-2], q.shape[:-1])
    D = H.shape[-1]
    H, q, g = H.expand(*batch, D, D), q.expand(*batch, D), g.expand(*batch, D)
    Lt = torch.broadcast_to(torch.as_tensor(L, dtype=torch.float64), batch)
    mt = torch.broadcast_to(torch.as_tensor(mu, dtype=torch.float64), batch)
    step = (2.0 / (Lt + mt)).to(F32).unsqueeze(-1)
    w = solvers.omega_schedule((((Lt - mt) / (Lt + mt)) ** 2).to(F32), iters)
    mv = lambda M, v: (M @ rnd(v).unsqueeze(-1)).squeeze(-1)  # noqa: E731
    xp, x = torch.zeros_like(q), step * q
    for i in range(1, iters + 1):
        wi = w[..., i : i + 1]
        x, xp = x - (wi * step) * (mv(H, x) - q) + (wi - 1.0) * (x - xp), x
    lam, lam_next = g, torch.zeros_like(g)
    nu_next = torch.ones_like(w[..., :1])
    dq = torch.zeros_like(q)
    dH = torch.zeros(*batch, D, D, dtype=F32)
    for i in range(iters, 0, -1):
        if i == skip:
            continue
        wi = w[..., i : i + 1] if order == "right" else w[..., iters + 1 - i : iters + 2 - i]
        c = wi * step
        dq = dq + c * lam
        dH = dH - (c * lam).unsqueeze(-1) * xp.unsqueeze(-2)
        lam_prev = wi * lam - c * mv(H.transpose(-1, -2), lam) - (nu_next - 1.0) * lam_next
        xpp = (x - wi * xp + c * (mv(H, xp) - q)) / (1.0 - wi)
        x, xp = xp, xpp
        lam_next, lam, nu_next = lam, lam_prev, wi
    return (dq + step * lam) * dq_scale, dH


def measured(out, b):
    """(error / bound) for dq and dH, the bound plus the one rounding of the returned result."""
    dq, dH = out
    rq = harness.output_rounding_bound(dq, (-1,))
    rH = harness.output_rounding_bound(dH, (-2, -1))
    eq = torch.linalg.vector_norm(dq.double() - b.dq_exact, dim=-1)
    eH = torch.linalg.matrix_norm(dH.double() - b.dH_exact)
    return float(eq / (b.dq + rq)), float(eH / (b.dH + rH))


# kappa up to 100, r up to 30 (the "reverse" method's recovered weights: r <= 4, the strategy's
# regime; beyond it they drift and its bound is infinite)
GRID = [
    (D, kappa, r, seed)
    for D, kappa, seed in ((5, 12.0, 1), (16, 16.0, 2), (16, 51.0, 3), (9, 100.0, 4))
    for r in (1, 3, 8, 20, 30)
]


def _iters_ok(method, r):
    return method == "reverse_stored_omega" or r <= 4


REFERENCE_MODES = [(F32, "storage"), (torch.bfloat16, "storage"), (torch.bfloat16, "strict")]


@pytest.mark.parametrize(
    "dtype,mode", REFERENCE_MODES, ids=["float32", "bf16-storage", "bf16-strict"]
)
@pytest.mark.parametrize("method", REVERSE)
def test_bound_holds_for_the_references(dtype, mode, method):
    contract = of_reference(dtype, mode)
    for D, kappa, r, seed in GRID:
        if not _iters_ok(method, r):
            continue
        H, q, g, L, mu = system(D, kappa, seed, dtype, loose=1.25 if seed % 2 else 1.0)
        b = reverse_backward_bound(H, q, g, L=L, mu=mu, iters=r, method=method, contract=contract)
        out = solvers.chebyshev_backward(
            H.to(dtype),
            q.to(dtype),
            g.to(dtype),
            L=L,
            mu=mu,
            iters=r,
            method=method,
            bf16_mode=mode,
        )
        tq, tH = measured(out, b)
        assert tq <= 1.0 and tH <= 1.0, (contract.name, method, D, kappa, r, tq, tH)


@pytest.mark.parametrize(
    "operands,contract,precision",
    [
        ("bf16", "bfloat16/operands", torch.bfloat16),
        ("tf32", "tf32", F32),
        ("fp32", "float32", F32),
    ],
)
def test_bound_holds_for_the_emulated_contracts(operands, contract, precision):
    for D, kappa, r, seed in GRID:
        H, q, g, L, mu = system(D, kappa, seed, precision)
        b = reverse_backward_bound(
            H, q, g, L=L, mu=mu, iters=r, method="reverse_stored_omega", contract=contract
        )
        out = emulated_reverse(
            H, q, g, L=L, mu=mu, iters=r, method="reverse_stored_omega", operands=operands
        )
        tq, tH = measured(out, b)
        assert tq <= 1.0 and tH <= 1.0, (contract, D, kappa, r, tq, tH)


needs_interpreter = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)


@needs_interpreter
@pytest.mark.parametrize("precision", ["ieee", "tf32"])
@pytest.mark.parametrize("method", REVERSE)
def test_bound_holds_for_the_kernel(method, precision):
    import kernels

    contract = "float32" if precision == "ieee" else "tf32"
    for D, kappa, r, seed in ((4, 16.0, 3, 5), (7, 51.0, 4, 6), (8, 100.0, 12, 7)):
        if not _iters_ok(method, r):
            r = 4
        H, q, g, L, mu = system(D, kappa, seed, F32)
        b = reverse_backward_bound(H, q, g, L=L, mu=mu, iters=r, method=method, contract=contract)
        out = kernels.chebyshev_backward(
            H.float(),
            q.float(),
            g.float(),
            L=L,
            mu=mu,
            iters=r,
            method=method,
            input_precision=precision,
        )
        tq, tH = measured(out, b)
        assert tq <= 1.0 and tH <= 1.0, (contract, method, D, kappa, r, tq, tH)


def _strategy(precision=F32, max_iters=10):
    # where the bound is conclusive: float32, kappa <= 51, r <= 10 (dH bound ~2e-3 ||dH||);
    # bf16 operands: r <= 5 (dH conclusive to r = 6 at kappa 16-100, D = 16)
    return harness.spd_backward(
        max_d=9,
        max_batch=2,
        max_iters=max_iters,
        max_kappa=51.0,
        methods=("reverse_stored_omega",),
        precision=precision,
    )


SETTINGS = {
    "float32": dict(precision="float32", model="float32", strategy=lambda: _strategy()),
    "bfloat16/operands": dict(
        precision="bfloat16",
        model="bfloat16/operands",
        strategy=lambda: _strategy(torch.bfloat16, max_iters=5),
        operands="bf16",
    ),
}


def _check(kernel, contract, examples=12):
    s = SETTINGS[contract]
    return harness.check(
        kernel,
        solvers.chebyshev_backward,
        s["strategy"](),
        precision=s["precision"],
        model=s["model"],
        examples=examples,
        seed=0,
        shrink=False,
    )


@pytest.mark.parametrize("contract", sorted(SETTINGS))
def test_harness_passes_a_correct_reversal_conclusively(contract):
    operands = SETTINGS[contract].get("operands", "fp32")

    def correct(*a, **kw):
        return emulated_reverse(*a, **kw, operands=operands)

    rep = _check(correct, contract)
    assert rep.verdict == harness.PASS, str(rep)
    if contract != "float32":  # float32's emulation is the reference's arithmetic, bit for bit
        assert rep.worst.ratio > 1e-3, str(rep)


@needs_interpreter
def test_harness_passes_the_kernel_conclusively():
    import kernels

    rep = _check(kernels.chebyshev_backward, "float32", examples=10)
    assert rep.verdict == harness.PASS and rep.worst.ratio > 0, str(rep)


BROKEN = {
    "omega_order_reversed": dict(order="reversed"),
    "one_step_skipped": dict(skip=2),
    "dq_scaled_0.9": dict(dq_scale=0.9),
}


@pytest.mark.parametrize("contract", sorted(SETTINGS))
@pytest.mark.parametrize("flaw", sorted(BROKEN))
def test_harness_fails_a_broken_reversal(flaw, contract):
    operands = SETTINGS[contract].get("operands", "fp32")

    def broken(*a, **kw):
        return emulated_reverse(*a, **kw, operands=operands, **BROKEN[flaw])

    rep = _check(broken, contract)
    assert rep.verdict == harness.FAIL and rep.failure is not None, str(rep)
    assert rep.failure.ratio > 1.0 and rep.error is None, str(rep)


def test_the_former_allowance_is_gone_for_reverse_methods():
    # the harness's bound for a reverse method is the running bound of the kernel's contract plus
    # the float32 reference's, nothing else
    case = harness.spd_case(
        8, (), 30.0, iters=6, seed=9, cotangent=True, method="reverse_stored_omega", precision=F32
    )
    rounded = {k: v.to(F32).to(torch.float64) for k, v in case.inputs.items()}
    dq_b, dH_b = harness._backward_scales(case, rounded, "bfloat16/operands")
    o = case.options
    args = dict(L=o["L"], mu=o["mu"], iters=6, method="reverse_stored_omega")
    H, q, g = rounded["H"], rounded["q"], rounded["grad_x"]
    k = reverse_backward_bound(H, q, g, contract="bfloat16/operands", **args)
    f = reverse_backward_bound(H, q, g, contract="float32", **args)
    assert torch.allclose(dq_b, k.dq + f.dq) and torch.allclose(dH_b, k.dH + f.dH)


def test_tightness_distribution(capsys):
    """measured / bound over the grid, per contract: all in (0, 1]; printed with -s."""
    rows = []
    for contract, run in (
        ("float32", lambda *a, **k: solvers.chebyshev_backward(*a, **k)),
        ("bfloat16/storage", lambda *a, **k: solvers.chebyshev_backward(*a, **k)),
        ("bfloat16/operands", lambda *a, **k: emulated_reverse(*a, **k, operands="bf16")),
    ):
        prec = F32 if contract == "float32" else torch.bfloat16
        tq, tH, vq, vH = [], [], 0, 0
        for D, kappa, r, seed in GRID:
            H, q, g, L, mu = system(D, kappa, seed, prec)
            m = "reverse_stored_omega"
            b = reverse_backward_bound(H, q, g, L=L, mu=mu, iters=r, method=m, contract=contract)
            out = run(H.to(prec), q.to(prec), g.to(prec), L=L, mu=mu, iters=r, method=m)
            a, c = measured(out, b)
            tq.append(a)
            tH.append(c)
            vq += bool(b.dq >= b.dq_exact.norm())
            vH += bool(b.dH >= b.dH_exact.norm())
        assert max(tq) <= 1.0 and max(tH) <= 1.0
        assert min(tq) > 0 and min(tH) > 0
        rows.append(
            f"{contract:18s} dq measured/bound median {statistics.median(tq):.3g} max {max(tq):.3g}"
            f" (vacuous {vq}/{len(GRID)}); dH median {statistics.median(tH):.3g} max {max(tH):.3g}"
            f" (vacuous {vH}/{len(GRID)})"
        )
    with capsys.disabled():
        print("\n" + "\n".join(rows))


@pytest.mark.parametrize("contract", ["float32", "bfloat16/operands", "bfloat16/storage"])
def test_the_reverse_cap_is_where_the_bound_stays_conclusive(contract):
    """spd_backward draws "reverse" up to REVERSE_MAX_ITERS = 5 steps: there every contract's
    bound on dq and dH is below the gradient's norm (GKA's regime's low end, kappa = 10, where
    the reversal grows fastest); one step more and bf16 operands' dH bound is vacuous."""
    r = harness.REVERSE_MAX_ITERS

    def worst(iters):
        c = harness.spd_case(16, (8,), 10.0, iters=iters, seed=1, cotangent=True, method="reverse")
        H, q, g = (c.inputs[k].to(torch.bfloat16).double() for k in ("H", "q", "grad_x"))
        o = c.options
        b = reverse_backward_bound(
            H, q, g, L=o["L"], mu=o["mu"], iters=iters, method="reverse", contract=contract
        )
        return max(
            float((b.dq / b.dq_exact.norm(dim=-1)).max()),
            float((b.dH / torch.linalg.matrix_norm(b.dH_exact)).max()),
        )

    assert worst(r) < 1.0  # conclusive: bound below ||dq||, ||dH|| (0.64 for bf16 operands)
    if contract == "bfloat16/operands":
        assert worst(r + 1) >= 1.0  # vacuous one step later (1.2): the cap is not arbitrary
