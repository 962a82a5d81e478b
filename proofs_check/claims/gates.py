"""Gate reparameterisation proposal: the gradient-scale claims (Background, Mathematical Formulation,
Theoretical Analysis and its table) and the numbers of 'Effect on optimization' and 'Risks'.

mp checks evaluate the formulas exactly (derivatives by mpmath.diff); working-precision checks
run ``solvers.gates`` (the gate classes and their gradient-scale helpers).
"""

from __future__ import annotations

import math

import mpmath
import torch
from hypothesis import strategies as st

from analysis.testing.strategies.bf16 import bf16_floats

from .. import mpla
from ..claim import ALL_PRECISIONS, MP, WORKING, Measurement
from ..declare import Twin, for_paper, not_checkable
from ._common import (
    F64,
    allowance,
    arith,
    attr,
    exact_identity,
    exact_inequality,
    formed,
    mpf,
    worst,
)

A_B = (0.25, 0.5, 1.0, 2.0)


def sigmoid(z):
    return 1 / (1 + mpmath.exp(-z))


def balanced(z, a=1, b=1):
    """phi(z) = max(0, 1 - 1/(a z^2 + b)) (Mathematical Formulation)."""
    return max(mpf(0), 1 - 1 / (mpf(a) * z**2 + mpf(b)))


def stablessm_discrete(w, a, b):
    """f*(w) = 1 - 1/(a w^2 + b) (Background, 'Adaptation to decay gates')."""
    return 1 - 1 / (mpf(a) * w**2 + mpf(b))


def balanced_derivative(z, a=1, b=1):
    """phi'(z) = 2 a z / (a z^2 + b)^2 where phi > 0 (Mathematical Formulation)."""
    return 2 * mpf(a) * z / (mpf(a) * z**2 + mpf(b)) ** 2


def _impl():
    return {
        "sigmoid_mp": sigmoid,
        "balanced_mp": balanced,
        "stablessm_mp": stablessm_discrete,
        "balanced_derivative_mp": balanced_derivative,
        "stablessm_continuous_mp": lambda w, a, b: -1 / (mpf(a) * w**2 + mpf(b)),
    }


def _impl_solvers():
    impl = dict(_impl())
    mod = "solvers.gates"
    impl["gates"] = attr(mod, "GATES")
    impl["BalancedGate"] = attr(mod, "BalancedGate")
    impl["gradient_over_weight"] = attr(mod, "gradient_over_weight")
    impl["stable_gradient_scale"] = attr(mod, "stable_gradient_scale")
    impl["cumulative_log_decay"] = attr(mod, "cumulative_log_decay")
    return impl


claim, erratum = for_paper("gates", implementation=_impl)


_Z = lambda lo=-16.0, hi=16.0: bf16_floats(lo, hi)  # noqa: E731


@claim(
    "gates.stablessm_continuous",
    source="Gate proposal, Background, 'StableSSM's insight'",
    strategy=lambda: st.tuples(_Z(), st.sampled_from(A_B), st.sampled_from(A_B)),
)
def _check_continuous(case, impl, prec) -> Measurement:
    """For f*(w) = -1/(a w^2 + b), the gradient scale |f'(w)|/f(w)^2 equals 2a|w|.

    Measured: mp: mpmath.diff of f against 2a|w|, held to 1e-30.
    """
    w, a, b = case
    with mpla.exact():
        f = lambda x: impl["stablessm_continuous_mp"](x, a, b)  # noqa: E731
        w = mpf(w)
        return exact_identity(
            abs(mpmath.diff(f, w)) / f(w) ** 2, 2 * mpf(a) * abs(w), "|f'|/f^2 = 2a|w|"
        )


@formed
def _discrete_range(form):
    def check(case, impl, prec) -> Measurement:
        w, a, b = case
        with mpla.exact():
            v = impl["stablessm_mp"](mpf(w), a, b)
            if form == "printed":
                return worst([exact_inequality(-1, v, "f* > -1"), exact_inequality(v, 1, "f* < 1")])
            return worst(
                [
                    exact_inequality(1 - 1 / mpf(b), v, "f* >= 1 - 1/b"),
                    exact_inequality(v, 1, "f* < 1"),
                ]
            )

    return check


erratum(
    Twin(
        "gates.stablessm_discrete.range.printed",
        source="Gate proposal, Background, 'Adaptation to decay gates'",
        statement="""f*(w) = 1 - 1/(a w^2 + b) maps R into (-1, 1).""",
        quantity="""mp: f*(w) against -1 and 1 for a, b in {1/4, 1/2, 1, 2}.""",
        examples=((0.0, 1.0, 0.25),),
    ),
    Twin(
        "gates.stablessm_discrete.range.corrected",
        source="Gate proposal, Background (corrected)",
        statement="""f* maps R onto [1 - 1/b, 1): inside (-1, 1) exactly when b > 1/2 (and into [0, 1) when b >=
                          1).""",
        quantity="""mp: f*(w) against 1 - 1/b and 1.""",
    ),
    check=_discrete_range,
    strategy=lambda: st.tuples(_Z(), st.sampled_from(A_B), st.sampled_from(A_B)),
    case_fields=("w", "a", "b"),
)


@formed
def _scale(form, which):
    """The 'gradient scale' of f* (which = 'stablessm', general a, b) or of phi (which = 'balanced', a = b = 1)."""

    def check(case, impl, prec) -> Measurement:
        w, a, b = case if which == "stablessm" else (case, 1.0, 1.0)
        if prec != MP:
            ar = arith(prec)
            z = torch.tensor([w], dtype=F64).to(ar.dtype)
            g = impl["BalancedGate"](a, b)
            zr = float(z.to(F64))
            if a * zr * zr + b <= 1.0:
                return Measurement(0.0, 1.0, "phi = 0 there: no scale")
            if form == "printed":
                got = float(impl["gradient_over_weight"](g, z, bf16_mode=ar.mode))
            else:
                got = float(impl["stable_gradient_scale"](g, z, bf16_mode=ar.mode))
            target = 2 * a * abs(zr)
            # a few rounded operations (square, sum, division, the stored derivative and complement): kappa 1
            return Measurement(
                abs(got - target) / target, allowance(1.0, 4, prec), "scale vs 2a|z|"
            )
        with mpla.exact():
            w = mpf(w)
            f = lambda x: impl["stablessm_mp"](x, a, b)  # noqa: E731
            if f(w) <= 0:
                return Measurement(0.0, 1.0, "f* <= 0 (phi clipped to 0)")
            d = abs(mpmath.diff(f, w))
            denom = f(w) ** 2 if form == "printed" else (1 - f(w)) ** 2
            return exact_identity(
                d / denom, 2 * mpf(a) * abs(w), "|f'|/f^2" if form == "printed" else "|f'|/(1-f)^2"
            )

    return check


_AB_CASES = lambda: st.tuples(_Z(), st.sampled_from(A_B), st.sampled_from(A_B))  # noqa: E731
claim(
    "gates.stablessm_discrete.scale",
    source="Gate proposal, Background, 'Adaptation to decay gates' ('with gradient scale 2a|w|')",
    statement="""f*(w) = 1 - 1/(a w^2 + b) has gradient scale 2a|w| in StableSSM's discrete-time sense, |f*'(w)| /
                      (1 - f*(w))^2 = 2a|w| ('the same balanced property').""",
    quantity="""mp: |f'|/(1 - f)^2 (mpmath.diff) against 2a|w| where f* > 0, held to 1e-30.""",
    note="""The sentence gives no formula; StableSSM's discrete-time gradient scale is |f'|/(1 - f)^2, where the
                 distance to 1 plays the role the continuous-time eigenvalue plays in |f'|/f^2. Read as |f'|/f^2 (the
                 proposal's formula for its own gate, gates.balanced.scale) it would be 2a|w|/(a w^2 + b - 1)^2.""",
    strategy=_AB_CASES,
    case_fields=("w", "a", "b"),
)(_scale("corrected", "stablessm"))
erratum(
    Twin(
        "gates.balanced.scale.printed",
        source="Gate proposal, Mathematical Formulation and Theoretical Analysis (table row)",
        statement="""For phi(z) = max(0, 1 - 1/(z^2 + 1)), |phi'(z)|/phi(z)^2 = 2|z|: linear, bounded and
                          balanced.""",
        quantity="""mp: |phi'|/phi^2 against 2|z| where phi > 0; working precisions:
                         solvers.gates.gradient_over_weight.""",
        precisions=(MP, "float64", "float32"),
        examples=(2.0,),
        note="""With a = b = 1, |phi'|/phi^2 = 2/|z|^3 (equal to 2|z| only at |z| = 1): it diverges at 0 and
                     vanishes at infinity like the sigmoid's.""",
    ),
    Twin(
        "gates.balanced.scale.corrected",
        source="Gate proposal, Theoretical Analysis (corrected)",
        statement="""|phi'(z)| / (1 - phi(z))^2 = 2a|z| wherever phi > 0 (solvers.gates.stable_gradient_scale).""",
        quantity="""mp: against 2|z|, held to 1e-30; working precisions: stable_gradient_scale against 2a|z|
                         within the allowance.""",
        precisions=ALL_PRECISIONS,
    ),
    check=_scale,
    args=("balanced",),
    strategy=lambda: _Z(),
    implementation=_impl_solvers,
    case_fields=("z",),
)


@claim(
    "gates.sigmoid.scale",
    source="Gate proposal, Mathematical Formulation; Theoretical Analysis (sigmoid row)",
    strategy=lambda: bf16_floats(-40.0, 40.0),
)
def _check_sigmoid_scale(z, impl, prec) -> Measurement:
    """sigma'(z) = sigma(1 - sigma), and |sigma'|/sigma^2 = (1 - sigma)/sigma (= e^{-z}), which diverges as sigma -> 0
    and vanishes as sigma -> 1; sigma' -> 0 at both ends.

    Measured: mp: the identities (mpmath.diff), held to 1e-30.
    """
    with mpla.exact():
        z = mpf(z)
        s = impl["sigmoid_mp"](z)
        d = mpmath.diff(impl["sigmoid_mp"], z)
        parts = [
            exact_identity(d, s * (1 - s), "sigma' = sigma (1 - sigma)"),
            exact_identity(abs(d) / s**2, (1 - s) / s, "|sigma'|/sigma^2 = (1 - sigma)/sigma"),
        ]
        # diverges as sigma -> 0 and vanishes as sigma -> 1: (1 - s)/s = e^{-z}, monotone decreasing
        parts.append(exact_identity((1 - s) / s, mpmath.exp(-z), "= e^{-z}"))
        return worst(parts)


@claim(
    "gates.balanced.basics",
    source="Gate proposal, Mathematical Formulation; Parallelism Analysis",
    strategy=_AB_CASES,
)
def _check_balanced_basics(case, impl, prec) -> Measurement:
    """phi maps R into [0, 1) with phi(0) = 0 for b = 1 and phi -> 1 as |z| -> infinity; phi' = 2az/(az^2 + b)^2 where
    phi > 0; for b >= 1 the max(0, .) never binds (no warp divergence).

    Measured: mp: each statement (the derivative by mpmath.diff).
    """
    z, a, b = case
    with mpla.exact():
        z = mpf(z)
        phi = lambda x: impl["balanced_mp"](x, a, b)  # noqa: E731
        parts = [exact_inequality(0, phi(z), "phi >= 0"), exact_inequality(phi(z), 1, "phi < 1")]
        if mpf(a) * z**2 + mpf(b) > 1:
            parts.append(
                exact_identity(mpmath.diff(phi, z), impl["balanced_derivative_mp"](z, a, b), "phi'")
            )
        if b == 1.0:
            parts.append(exact_identity(phi(mpf(0)), mpf(0), "phi(0) = 0"))
        if b >= 1.0:  # then max(0, .) never binds
            parts.append(
                exact_inequality(0, 1 - 1 / (mpf(a) * z**2 + mpf(b)), "1 - 1/(a z^2 + b) >= 0")
            )
        return worst(parts)


@claim(
    "gates.balanced.solver",
    source="Gate proposal, Mathematical Formulation (as implemented in solvers.gates)",
    strategy=lambda: bf16_floats(-64.0, 64.0),
    precisions=WORKING,
    implementation=_impl_solvers,
)
def _check_balanced_solver(z, impl, prec) -> Measurement:
    """solvers.gates.BalancedGate computes phi and phi' to working accuracy (relative), including near phi = 0 where the
    printed 1 - 1/(z^2 + 1) cancels.

    Measured: relative error of value and derivative against mp, held to allowance(1, 4).
    """
    ar = arith(prec)
    zt = torch.tensor([z], dtype=F64).to(ar.dtype)
    g = impl["gates"]["balanced"]
    zr = float(zt.to(F64))
    with mpla.exact():
        phi = impl["balanced_mp"](mpf(zr))
        dphi = 2 * mpf(zr) / (mpf(zr) ** 2 + 1) ** 2 if zr != 0 else mpf(0)
    v = float(g.value(zt, bf16_mode=ar.mode).to(F64))
    d = float(g.derivative(zt, bf16_mode=ar.mode).to(F64))
    ev = abs(v - float(phi)) / max(float(phi), 1e-300) if phi != 0 else abs(v)
    ed = abs(d - float(dphi)) / max(abs(float(dphi)), 1e-300) if dphi != 0 else abs(d)
    # a handful of rounded operations per value (square, add, divide, store): kappa 1
    return Measurement(max(ev, ed), allowance(1.0, 4, prec), "phi and phi' (relative)")


@formed
def _softplus(form):
    def check(z, impl, prec) -> Measurement:
        with mpla.exact():
            z = mpf(z)
            same = exact_identity(
                1 - mpmath.exp(-mpmath.log(1 + mpmath.exp(z))),
                impl["sigmoid_mp"](z),
                "1 - e^{-softplus} = sigma",
            )
            if form == "corrected":
                return same
            # printed: a different parameterisation, 'better than sigmoid but still imbalanced'
            return Measurement(float(same.ok), 0.0, "1 - exp(-softplus(z)) equals sigma(z)")

    return check


erratum(
    Twin(
        "gates.softplus.printed",
        source="Gate proposal, Baseline 3 and Theoretical Analysis (softplus row)",
        statement="""The exponential reparameterisation 1 - e^{-softplus(z)} is a different gate from the
                          sigmoid: bounded but exponentially varying, better than sigmoid but still imbalanced.""",
        quantity="""mp: value 1 when 1 - e^{-softplus(z)} = sigma(z), held to 0.""",
        examples=(0.0,),
    ),
    Twin(
        "gates.softplus.corrected",
        source="Gate proposal (corrected)",
        statement="""e^{-softplus(z)} = 1/(1 + e^z), so 1 - e^{-softplus(z)} = sigma(z) identically: the
                          baseline is the sigmoid.""",
        quantity="""mp: the identity, held to 1e-30.""",
    ),
    check=_softplus,
    strategy=lambda: bf16_floats(-40.0, 40.0),
    case_fields=("z",),
)


@formed
def _sig_numbers(form):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            z99 = mpmath.log(99)  # sigma(z) = 0.99
            d99 = impl["sigmoid_mp"](z99) * (1 - impl["sigmoid_mp"](z99))
            ratio = mpf("0.25") / d99
            printed_ratio = 100 if form == "printed" else 25
            parts = [
                Measurement(
                    float(abs(z99 - mpf("4.6")) / mpf("0.05")),
                    1.0,
                    f"z = {mpmath.nstr(z99, 5)} printed 4.6",
                ),
                Measurement(
                    float(abs(d99 - mpf("0.01")) / mpf("0.005")),
                    1.0,
                    f"sigma'(4.6) = {mpmath.nstr(d99, 4)} printed 0.01",
                ),
                Measurement(
                    float(abs(ratio - printed_ratio) / (printed_ratio * mpf("0.05"))),
                    1.0,
                    f"ratio {mpmath.nstr(ratio, 4)} printed {printed_ratio}x",
                ),
            ]
            return worst(parts)

    return check


erratum(
    Twin(
        "gates.effect.sigmoid.printed",
        source="Gate proposal, Theoretical Analysis, 'Effect on optimization'",
        statement="""With sigmoid, alpha = 0.99 (z ~ 4.6) gets sigma'(4.6) ~ 0.01, 100x smaller than alpha =
                          0.5's 0.25.""",
        quantity="""mp: z and sigma' to the printed digit (half a unit), the ratio to 5% (the two factors are
                         rounded).""",
        examples=(None,),
    ),
    Twin(
        "gates.effect.sigmoid.corrected",
        source="Gate proposal, 'Effect on optimization' (corrected)",
        statement="""sigma'(4.595) = 0.99 x 0.01 = 0.0099: 25x (not 100x) smaller than sigma'(0) = 0.25.""",
        quantity="""as the printed form with 25x.""",
    ),
    check=_sig_numbers,
    strategy=lambda: st.just(None),
)


@claim(
    "gates.effect.balanced",
    source="Gate proposal, 'Effect on optimization'; Risks and Limitations 2",
    strategy=lambda: st.just(None),
)
def _check_balanced_numbers(case, impl, prec) -> Measurement:
    """Balanced phi: 0.99 at z ~ 10 (sigmoid at 4.6), phi'(10) = 20/101^2 ~ 0.002, phi = 0.5 at z = 1 with phi'(1) =
    0.5, a 250x ratio.

    Measured: mp: each number to its printed digit; the ratio 255.0 to the 2% rounding of the printed 0.002 it is
    computed from.
    """
    with mpla.exact():
        z99 = mpmath.sqrt(99)  # phi(z) = 0.99
        d10 = impl["balanced_derivative_mp"](mpf(10))
        d1 = impl["balanced_derivative_mp"](mpf(1))
        rounding = (
            abs(mpf("0.002") - d10) / d10
        )  # the printed ratio is 0.5/0.002: it inherits this rounding
        return worst(
            [
                Measurement(
                    float(abs(z99 - 10) / mpf("0.5")),
                    1.0,
                    f"phi = 0.99 at z = {mpmath.nstr(z99, 5)} printed 10",
                ),
                Measurement(
                    float(abs(d10 - mpf("0.002")) / mpf("0.0005")),
                    1.0,
                    f"phi'(10) = {mpmath.nstr(d10, 4)} printed 0.002",
                ),
                exact_identity(impl["balanced_mp"](mpf(1)), mpf("0.5"), "phi(1) = 0.5"),
                exact_identity(d1, mpf("0.5"), "phi'(1) = 0.5"),
                Measurement(
                    float(abs(d1 / d10 - 250) / 250),
                    float(rounding) * 1.01,
                    f"ratio {mpmath.nstr(d1 / d10, 5)} printed 250x",
                ),
                exact_inequality(mpmath.log(99), z99, "sigmoid reaches 0.99 first (Risks 2)"),
            ]
        )


@claim(
    "gates.slower_approach",
    source="Gate proposal, 'If hypothesis is wrong', Scenario B; Risks 2",
    strategy=lambda: bf16_floats(2.0**-8, 40.0, allow_zero=False),
)
def _check_slower(z, impl, prec) -> Measurement:
    """phi approaches 1 more slowly than the sigmoid: 1 - phi(z) = 1/(z^2 + 1) >= 1/(1 + e^z) = 1 - sigma(z) for z > 0.

    Measured: mp: the two complements for z in (0, 40].
    """
    with mpla.exact():
        z = mpf(z)
        return exact_inequality(
            1 - impl["sigmoid_mp"](z), 1 - impl["balanced_mp"](z), "1 - sigma(z) <= 1 - phi(z)"
        )


@formed
def _log_domain(form):
    def check(z, impl, prec) -> Measurement:
        # printed, working precision: log(1 - 1/(z^2 + 1)) evaluated as printed, in the precision
        if prec != MP and form == "printed":
            if z == 0.0:
                return Measurement(0.0, 1.0, "z = 0: log phi = -inf exactly (the mp run)")
            ar = arith(prec)
            zt = torch.tensor([z], dtype=F64).to(ar.dtype)
            lv = float(torch.log(1 - 1 / (zt * zt + 1)).to(F64))
            return Measurement(float(lv == -math.inf), 0.0, f"log phi({z}) as printed = {lv}")
        if prec == MP:
            with mpla.exact():
                phi = impl["balanced_mp"](mpf(z))
                ok = (
                    phi > 0 if form == "printed" else True
                )  # printed: log phi in (-inf, 0) for every z
                return Measurement(float(not ok), 0.0, f"phi({z}) = {mpmath.nstr(phi, 4)}")
        ar = arith(prec)
        zt = torch.tensor([z], dtype=F64).to(ar.dtype)
        lv = float(impl["gates"]["balanced"].log_value(zt, bf16_mode=ar.mode).to(F64))
        zr = float(zt.to(F64))
        expected = -math.inf if zr * zr + 1.0 <= 1.0 else math.log(zr * zr / (zr * zr + 1.0))
        if math.isinf(expected):
            return Measurement(float(lv != -math.inf), 0.0, "log phi(0) = -inf")
        return Measurement(
            abs(lv - expected) / max(1.0, abs(expected)), allowance(1.0, 4, prec), "log phi"
        )

    return check


erratum(
    Twin(
        "gates.log_domain.printed",
        source="Gate proposal, Mathematical Formulation ('log phi in (-inf, 0)')",
        statement="""phi(z) in [0, 1), so log phi(z) in (-inf, 0) is well-defined for the cumulative log-space
                          decay ('numerically identical to the sigmoid case'; GLA keeps log alpha in FP32).""",
        quantity="""mp: value 1 at a z where phi(z) = 0 (log phi = -inf), held to 0; float32: value 1 at a z != 0
                         where log(1 - 1/(z^2 + 1)), evaluated as printed, is -inf.""",
        precisions=(MP, "float32"),
        examples=(0.0, 2.0**-14),
        note="""Exact arithmetic fails only at z = 0 (Risks 3 notes the -inf as phi -> 0; the formulation's '(-inf,
                     0)' excludes it). Evaluated as printed, z^2 + 1 rounds to 1 and log phi is -inf on a band: |z| <=
                     2^-12 ~ 2.4e-4 in float32, |z| <~ 0.06 in bf16.""",
    ),
    Twin(
        "gates.log_domain.corrected",
        source="Gate proposal, Risks 3 (corrected statement)",
        statement="""log phi(z) lies in [-inf, 0): -inf exactly where phi = 0 (z = 0 for a = b = 1);
                          solvers.gates computes it without cancellation elsewhere.""",
        quantity="""working precisions: BalancedGate.log_value against log(z^2/(z^2 + 1)) (relative to max(1,
                         |log phi|)), and -inf at 0.""",
        precisions=ALL_PRECISIONS,
        implementation=_impl_solvers,
    ),
    check=_log_domain,
    strategy=lambda: bf16_floats(-4.0, 4.0),
    case_fields=("z",),
)


@claim(
    "gates.log_cumsum",
    source="Gate proposal, Mathematical Formulation ('log gamma^{i->j} = sum log phi(z)')",
    strategy=lambda: st.lists(bf16_floats(2.0**-3, 32.0, allow_zero=False), min_size=1, max_size=8),
    precisions=WORKING,
    implementation=_impl_solvers,
)
def _check_log_cumsum(zs, impl, prec) -> Measurement:
    """The cumulative log decay of the balanced gates is the sum of log phi (solvers.gates.cumulative_log_decay of
    BalancedGate.log_value) to working accuracy.

    Measured: max error / sum |log phi| (all terms <= 0: no cancellation) against allowance(1, T + 4).
    """
    ar = arith(prec)
    g = impl["gates"]["balanced"]
    zt = torch.tensor(zs, dtype=F64).to(ar.dtype)
    logs = g.log_value(zt, bf16_mode=ar.mode)
    got = impl["cumulative_log_decay"](logs, bf16_mode=ar.mode).to(F64)
    with mpla.exact():
        acc, exact = mpf(0), []
        for z in zt.to(F64).tolist():
            acc += mpmath.log(impl["balanced_mp"](mpf(z)))
            exact.append(acc)
    scale = sum(abs(float(x)) for x in logs.to(F64))  # no cancellation: every term <= 0
    err = max(abs(float(a) - float(b)) for a, b in zip(got, exact))
    return Measurement(
        err / scale if scale > 0 else err,
        allowance(1.0, len(zs) + 4, prec),
        "log gamma_{i->j} vs sum log phi",
    )


not_checkable(
    "gates.hypotheses",
    paper="gates",
    source="Gate proposal, Hypothesis 1-3, Expected Outcome, MVE success criteria",
    text="""
    2-5x higher stable learning rate, 0.3-0.8% lower perplexity, zero overhead, >50% lower gradient variance.

    Why: Predictions of experiments not yet run (status: ongoing).""",
)
not_checkable(
    "gates.op_counts",
    paper="gates",
    source="Gate proposal, Memory Access Pattern Analysis",
    text="""
    Sigmoid costs 1 exp + 1 add + 1 div; phi 1 mul + 1 add + 1 div + 1 sub + 1 max per element.

    Why: A count of the formula's operations, true by reading it; throughput is hardware-dependent.""",
)
