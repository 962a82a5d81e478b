"""Decay-gate parameterisations (solvers/gates.py) and the gate proposal's printed claims.

Bounds used here:
* OPS: every gate formula is a path of at most 8 elementary operations without cancellation
  (the stable forms are chosen for that), each exact to 1 ulp = 2u (exp, log1p, division,
  ...), so a computed value is within ``OPS u = 16 u`` of the exact one (relative, first
  order), plus one ``u_store`` for the final rounding to bf16.
* A cumulative log decay ``G_t`` summed sequentially is within ``gamma_t sum |g|`` (Higham
  eq. (4.4)), so ``exp(G_t)`` is within that (plus OPS u) relatively.
"""

import math

import mpmath
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from analysis.precision import PRECISIONS
from analysis.references.gates import exact_gate_functions
from analysis.testing.strategies.gates import log_gate_sequences, pre_activations
from solvers.gates import (
    GATES,
    BalancedGate,
    SigmoidGate,
    SoftplusGate,
    cumulative_log_decay,
    gradient_over_weight,
    printed_balanced_gradient_scale,
    stable_gradient_scale,
)

F64 = torch.float64
OPS = 16  # see module docstring
U = 2.0**-53
DPS = 50


def _rel(x: float, ref) -> float:
    if ref == 0:
        return abs(x)
    return float(abs(mpmath.mpf(x) - ref) / abs(ref))


ALL_GATES = [SigmoidGate(), SoftplusGate(), BalancedGate(), BalancedGate(a=0.5, b=2.0)]
GATE_IDS = ["sigmoid", "softplus", "balanced", "balanced-a0.5-b2"]


@pytest.mark.parametrize("gate", ALL_GATES, ids=GATE_IDS)
@pytest.mark.parametrize("arith", PRECISIONS, ids=lambda a: a.label)
def test_gate_functions_match_mpmath(gate, arith):
    zs = torch.tensor([-30.0, -8.0, -1.5, -0.3, 0.02, 0.7, 3.0, 9.0, 35.0], dtype=F64).to(
        arith.dtype
    )
    exact = exact_gate_functions(gate)
    bound = OPS * arith.u_acc + arith.u_store  # OPS bound
    with mpmath.workdps(DPS):
        for name, ref in exact.items():
            out = getattr(gate, name)(zs, bf16_mode=arith.mode).to(F64)
            for z, o in zip(zs.to(F64).tolist(), out.tolist()):
                r = ref(mpmath.mpf(z))
                if r == -mpmath.inf:
                    assert o == -math.inf
                    continue
                if arith.dtype != F64 and abs(r) < torch.finfo(arith.dtype).tiny:
                    continue  # below the normal range of the working dtype: no relative accuracy exists
                assert _rel(o, r) <= bound, (name, z, o, float(r))


@pytest.mark.parametrize("gate", ALL_GATES, ids=GATE_IDS)
@given(z=pre_activations("any"))
def test_derivatives_match_autograd(gate, z):
    # below 1e-150, z^2 is subnormal and autograd's 1/(a z^2) overflows to inf (ours does not)
    assume(abs(z) > 1e-150 or z == 0)
    zt = torch.tensor([z], dtype=F64, requires_grad=True)
    for fn, dfn in (("value", "derivative"), ("log_value", "log_derivative")):
        out = getattr(gate, fn)(zt)
        if not torch.isfinite(out).all():
            continue  # log phi = -inf where phi = 0: no derivative to compare
        (auto,) = torch.autograd.grad(out.sum(), zt)
        mine = getattr(gate, dfn)(zt.detach())
        # OPS bound on both sides, times the cancellation autograd's quotient rule suffers:
        # d(n/s) = n'/s - n s'/s^2 and d(log n - log s) cancel by a factor s + n = 2 a z^2 + 2b - 1
        # for the balanced gate; e/(1 + e) by at most 3 for the sigmoid.
        cond = 2 * gate.a * z * z + 2 * gate.b if isinstance(gate, BalancedGate) else 3.0
        assert torch.allclose(mine, auto, rtol=2 * OPS * 2.0**-53 * cond, atol=0.0), (
            fn,
            z,
            mine,
            auto,
        )


def test_softplus_gate_is_the_sigmoid():
    """Proposal's "exponential reparameterisation" 1 - exp(-softplus(z)) equals sigma(z)."""
    z = torch.linspace(-20, 20, 81, dtype=F64)
    # OPS bound on each side; the printed form is only accurate where it does not cancel (z > -1)
    ok = z > -1
    p = SoftplusGate().printed_value(z)
    s = SigmoidGate().value(z)
    assert torch.allclose(p[ok], s[ok], rtol=2 * OPS * 2.0**-53, atol=0)
    assert torch.equal(
        gradient_over_weight(SoftplusGate(), z), gradient_over_weight(SigmoidGate(), z)
    )


@given(z=pre_activations("near_zero"))
def test_log_form_keeps_gates_near_zero(z):
    """gamma ~ e^z for z << 0: the printed 1 - exp(-softplus(z)) cancels, the log form does not."""
    zt = torch.tensor([z], dtype=F64)
    with mpmath.workdps(DPS):
        exact_log = -mpmath.log(1 + mpmath.exp(-mpmath.mpf(z)))
        exact = mpmath.exp(exact_log)
    assert _rel(float(SoftplusGate().log_value(zt)), exact_log) <= OPS * 2.0**-53  # OPS bound
    assert _rel(float(SoftplusGate().value(zt)), exact) <= OPS * 2.0**-53
    printed = float(SoftplusGate().printed_value(zt))
    # cancellation in 1 - exp(-gamma): exp(-gamma) is rounded to a multiple of u near 1, so the
    # relative error is up to u / gamma: not one correct digit once gamma < u/2 (z < -37.5)
    assert _rel(printed, exact) <= 2.0**-53 / float(exact) + OPS * 2.0**-53
    if z < -37.5:
        assert _rel(printed, exact) >= 0.5


@pytest.mark.parametrize("gate", [SigmoidGate(), BalancedGate()], ids=["sigmoid", "balanced"])
@given(z=pre_activations("near_one"))
def test_log_form_keeps_gates_near_one(gate, z):
    """For 1 - gamma < u the stored gamma is 1 and log(gamma) = 0; log_value and complement keep it."""
    zt = torch.tensor([z], dtype=torch.float32)
    f = exact_gate_functions(gate)
    with mpmath.workdps(DPS):  # at the stored (float32) z
        comp, logv = f["complement"](mpmath.mpf(float(zt))), f["log_value"](mpmath.mpf(float(zt)))
    assert _rel(float(gate.complement(zt)), comp) <= OPS * 2.0**-24  # OPS bound, float32
    assert _rel(float(gate.log_value(zt)), logv) <= OPS * 2.0**-24
    if comp < 2.0**-25:  # gamma rounds to 1 in float32: the direct log loses the decay entirely
        assert float(torch.log(gate.value(zt))) == 0.0


@given(g=log_gate_sequences(12))
def test_cumulative_log_decay_matches_cumprod(g):
    """exp(G_t) = prod gamma_i (float64), within gamma_t sum|g| + OPS u; in float32 the direct
    product underflows to 0 for near-zero gates while the log form stays exact to that bound."""
    G = cumulative_log_decay(g)
    with mpmath.workdps(DPS):
        exact = [
            mpmath.fsum(mpmath.mpf(x) for x in g[: t + 1].tolist()) for t in range(g.shape[-1])
        ]
    mass = torch.cumsum(g.abs(), -1)
    for t in range(g.shape[-1]):
        u = 2.0**-53
        assert abs(float(G[t]) - float(exact[t])) <= (t + 1) * u * float(mass[t]) / (
            1 - (t + 1) * u
        )  # gamma_t sum|g|
    g32 = g.to(torch.float32)
    G32 = cumulative_log_decay(g32).to(F64)
    direct = torch.cumprod(torch.exp(g32), -1).to(F64)
    with mpmath.workdps(DPS):  # of the stored float32 gates
        exact32 = torch.tensor(
            [
                float(mpmath.fsum(mpmath.mpf(x) for x in g32[: t + 1].tolist()))
                for t in range(g.shape[-1])
            ],
            dtype=F64,
        )
    t = torch.arange(1, g.shape[-1] + 1, dtype=F64)
    u32 = 2.0**-24
    gamma_t = t * u32 / (1 - t * u32)
    assert (
        (G32 - exact32).abs() <= gamma_t * torch.cumsum(g32.to(F64).abs(), -1)
    ).all()  # gamma_t sum|g|
    underflow = exact32 < math.log(torch.finfo(torch.float32).tiny) - 20
    assert (direct[underflow] == 0).all()  # the direct product has nothing left to divide by


def test_cumulative_log_decay_fails_off_by_one():
    """A cumulative sum that starts one token late (exclusive scan) is caught by the identity."""
    g = torch.tensor([-0.1, -0.5, -0.2], dtype=F64)
    G = cumulative_log_decay(g)
    shifted = torch.cat([torch.zeros(1, dtype=F64), G[:-1]])
    direct = torch.cumprod(torch.exp(g), 0)
    # G_t within gamma_t sum|g| (module docstring), exp adds 2u; the direct product: t exps
    # (2u each) and t - 1 products: gamma_{3t} relative, so together gamma_t sum|g| + gamma_{3t+2}
    t = torch.arange(1, 4, dtype=F64)
    u = 2.0**-53
    gam = lambda n: n * u / (1 - n * u)  # noqa: E731  Higham's gamma_n
    bound = (gam(t) * torch.cumsum(g.abs(), 0) + gam(3 * t + 2)) * direct
    assert bool(((torch.exp(G) - direct).abs() <= bound).all())
    assert not bool(((torch.exp(shifted) - direct).abs() <= bound).all())


# ------------------------------------------------------------------ the proposal's printed claims


@given(z=st.floats(0.05, 50.0), a=st.floats(0.1, 5.0), b=st.floats(1.0, 5.0))
def test_balanced_scale_printed_fails_corrected_holds(z, a, b):
    """Printed: |phi'|/phi^2 = 2a|z|. True: 2a|z|/(a z^2 + b - 1)^2; 2a|z| is |phi'|/(1-phi)^2."""
    gate = BalancedGate(a, b)
    zt = torch.tensor([z, -z], dtype=F64)
    with mpmath.workdps(DPS):
        am, bm, zm = mpmath.mpf(a), mpmath.mpf(b), mpmath.mpf(z)
        exact = float(2 * am * zm / (am * zm * zm + bm - 1) ** 2)
    # OPS bound on value and derivative, doubled by the square and the quotient
    assert torch.allclose(
        gradient_over_weight(gate, zt), torch.full((2,), exact, dtype=F64), rtol=4 * OPS * 2.0**-53
    )
    assert torch.allclose(
        stable_gradient_scale(gate, zt),
        printed_balanced_gradient_scale(zt, a=a),
        rtol=4 * OPS * 2.0**-53,
    )


def test_balanced_scale_printed_counterexample():
    """a = b = 1, z = 2: |phi'|/phi^2 = 0.25, printed 2|z| = 4 (they meet only at z = 1)."""
    z = torch.tensor([2.0, 1.0], dtype=F64)
    got = gradient_over_weight(BalancedGate(), z)
    # OPS bound on value and derivative, doubled by the square and the quotient
    assert (
        abs(float(got[0]) - 0.25) <= 4 * OPS * 2.0**-53 * 0.25
        and float(printed_balanced_gradient_scale(z)[0]) == 4.0
    )
    assert abs(float(got[1]) - 2.0) <= 4 * OPS * 2.0**-53 * 2.0


def test_sigmoid_scale_and_exponential_identities():
    """(1 - sigma)/sigma = e^{-z} (unbounded as z -> -inf, contrary to the softplus row's "bounded");
    StableSSM's |phi'|/(1 - phi)^2 = e^z for the sigmoid."""
    z = torch.linspace(-30, 30, 61, dtype=F64)
    for gate in (SigmoidGate(), SoftplusGate()):
        assert torch.allclose(gradient_over_weight(gate, z), torch.exp(-z), rtol=4 * OPS * 2.0**-53)
        assert torch.allclose(stable_gradient_scale(gate, z), torch.exp(z), rtol=4 * OPS * 2.0**-53)


def test_continuous_stable_ssm_scale():
    """StableSSM's continuous-time f(w) = -1/(a w^2 + b): |f'|/f^2 = 2a|w| (holds as printed)."""
    w = torch.linspace(-5, 5, 21, dtype=F64, requires_grad=True)
    a, b = 0.7, 1.3
    f = -1.0 / (a * w * w + b)
    (df,) = torch.autograd.grad(f.sum(), w)
    # OPS bound on f and on autograd's f' (one quotient-rule path), doubled by the square and the quotient
    assert torch.allclose(
        df.abs() / f.detach() ** 2, 2 * a * w.detach().abs(), rtol=4 * OPS * 2.0**-53, atol=0
    )


def test_proposal_numbers():
    """The worked numbers of "Effect on optimization" and "Risks" (docs/errata.md). Tolerances:
    float64 values within OPS u of exact (relative), plus the rounding of their argument and of
    the expected value (below, per value); printed decimals at the precision they are printed
    with."""
    sig, bal = SigmoidGate(), BalancedGate()
    z99 = math.log(99.0)  # sigma(z) = 0.99
    t = lambda x: torch.tensor([x], dtype=F64)  # noqa: E731
    assert abs(z99 - 4.6) < 0.01  # "z ~ 4.6": holds
    d99, d50 = float(sig.derivative(t(z99))), float(sig.derivative(t(0.0)))
    # sigma'(log 99) = 0.99 * 0.01 exactly: OPS u, plus log 99's rounding (4.6u absolute, times
    # |sigma''/sigma'| = 0.98: 4.5u relative) and 0.0099's (u): (OPS + 6) u relative = 2.4e-17
    assert (
        abs(d99 - 0.0099) <= (OPS + 6) * U * 0.0099 and d50 == 0.25
    )  # "sigma'(4.6) ~ 0.01", "sigma'(0) = 0.25": hold
    assert abs(d50 / d99 - 25.2525) < 1e-3  # printed "100x smaller": the ratio is 25.25
    assert not abs(d50 / d99 - 100) < 10
    zb = math.sqrt(99.0)  # phi(z) = 0.99 for a = b = 1
    # phi(sqrt 99) = 99/100 exactly: OPS u, plus sqrt 99's rounding (moving phi by 0.02u) and
    # 0.99's (u): (OPS + 2) u relative
    phi_b = float(bal.value(t(zb)))
    assert abs(phi_b - 0.99) <= (OPS + 2) * U * 0.99 and abs(zb - 10) < 0.06  # "z ~ 10": holds
    # OPS u, and 20 / 101**2 rounded once: (OPS + 1) u relative = 3.7e-18
    assert abs(float(bal.derivative(t(10.0))) - 20 / 101**2) <= (OPS + 1) * U * (
        20 / 101**2
    )  # "phi'(10) = 20/101^2 ~ 0.002"
    assert (
        float(bal.value(t(1.0))) == 0.5 and float(bal.derivative(t(1.0))) == 0.5
    )  # "phi'(1) = 2/4 = 0.5"
    ratio = 0.5 / (20 / 101**2)
    assert (
        abs(ratio - 255.0) < 0.1 and abs(ratio - 250) / 250 < 0.03
    )  # "250x": loose but true (255)
    assert float(bal.value(t(0.0))) == 0.0  # "phi(0) = 0"
    assert float(bal.log_value(t(0.0))) == -math.inf  # "log phi in (-inf, 0)": fails at z = 0
    # d log phi/dz = 2/(z (1 + z^2)) is unbounded near z = 0; the sigmoid's, sigma(-z), is <= 1
    assert float(bal.log_derivative(t(1e-3))) > 1999 and float(sig.log_derivative(t(-50.0))) <= 1.0


@pytest.mark.parametrize("b", [0.5, 0.25])
def test_discrete_stable_ssm_range_needs_b_above_half(b):
    """ "1 - 1/(a w^2 + b) maps R to (-1, 1)" holds only for b > 1/2: at w = 0 it is 1 - 1/b."""
    assert 1 - 1 / b <= -1


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "bad,exc",
    [
        ([1.0], TypeError),
        (torch.tensor([1, 2]), TypeError),
        (torch.tensor([float("nan")]), ValueError),
        (torch.tensor([float("inf")]), ValueError),
    ],
)
def test_bad_input(bad, exc):
    with pytest.raises(exc, match="z"):
        GATES["sigmoid"].value(bad)
    with pytest.raises(exc, match="z"):
        GATES["balanced"].log_value(bad)


@pytest.mark.parametrize("a,b", [(0.0, 1.0), (1.0, -1.0), (float("nan"), 1.0), (True, 1.0)])
def test_balanced_parameters(a, b):
    with pytest.raises(ValueError):
        BalancedGate(a, b)


def test_bad_mode_and_not_modified():
    z = torch.tensor([0.5, -2.0], dtype=torch.bfloat16)
    z0 = z.clone()
    with pytest.raises(ValueError, match="bf16_mode"):
        SigmoidGate().value(z, bf16_mode="fast")
    for gate in GATES.values():
        for fn in ("value", "derivative", "complement", "log_value", "log_derivative"):
            getattr(gate, fn)(z, bf16_mode="strict")
    cumulative_log_decay(-z.abs())
    assert torch.equal(z, z0)


def test_empty():
    z = torch.zeros(0, 3, dtype=torch.float32)
    assert SigmoidGate().value(z).shape == (0, 3)
    assert cumulative_log_decay(z).shape == (0, 3)


def test_unstable_derivative_form_fails_near_one():
    """The textbook sigma (1 - sigma) (what SigmoidGate.derivative avoids) is 0 at z = 40 in float64,
    where the OPS bound of test_gate_functions_match_mpmath demands ~4e-18 to 16u relative."""
    z = torch.tensor([40.0], dtype=F64)
    s = SigmoidGate().value(z)
    with mpmath.workdps(DPS):
        exact = exact_gate_functions(SigmoidGate())["derivative"](mpmath.mpf(40))
    assert _rel(float(s * (1 - s)), exact) == 1.0
    assert _rel(float(SigmoidGate().derivative(z)), exact) <= OPS * 2.0**-53
