"""The ``kla_backward`` gradient strategy (analysis.testing.gradient_harness): it passes correct
backward passes and catches each deliberately broken one (kernels.kla_backward.BROKEN_VARIANTS).

Bounds: analysis.testing.gradient_harness.adjoint_bounds (running bound of the adjoint recurrence,
docs/gradients.md), for the kernel's model plus the float32 reference."""

import pytest
import torch
from kernel_support import DEVICE, needs_triton_device

from analysis.testing import harness
from analysis.testing.gradient_harness import (
    GATE_REGIMES,
    adjoint_bounds,
    inconclusive,
    kla_backward,
    kla_kernel_variant,
    recurrent_forward,
    reference_gradients,
    with_gate_dtype,
)
from kernels.kla_backward import BROKEN_VARIANTS

pytestmark = needs_triton_device

SETTINGS = {"float32": ("float32", None), "bfloat16": ("bfloat16/storage", torch.bfloat16)}


def _check(kernel, precision, examples, **kw):
    model, gate_dtype = SETTINGS[precision]
    strat = kla_backward(gate_dtype=gate_dtype, device=DEVICE, **kw)
    return harness.check(
        kernel,
        with_gate_dtype(reference_gradients, gate_dtype),
        strat,
        precision=precision,
        model=model,
        examples=examples,
        device=DEVICE,
        shrink=False,
    )


@pytest.mark.parametrize("precision", sorted(SETTINGS))
def test_strategy_passes_on_the_plain_torch_backward(precision):
    rep = _check(kla_kernel_variant(adjoint="torch"), precision, examples=8)
    assert rep.passed, str(rep)
    assert rep.worst.ratio < 1.0


@pytest.mark.parametrize("variant", sorted(BROKEN_VARIANTS))
@pytest.mark.parametrize("precision", sorted(SETTINGS))
def test_broken_variant_is_caught(variant, precision):
    """The broken-variant matrix: every variant fails the check under every input precision.

    A flipped dg shows only where the bf16 bound on dg is conclusive: under strong gates the
    terms of dg cancel and its bf16 bound exceeds dg itself (INCONCLUSIVE, not a pass), so in
    bf16 that row draws weak gates (g in [-0.02, 0]); the decay variant needs strong gates to
    show, so the other rows draw every regime."""
    gates = ("weak",) if (variant, precision) == ("dg_sign", "bfloat16") else GATE_REGIMES
    rep = _check(
        kla_kernel_variant(adjoint="torch", broken_variant=variant),
        precision,
        examples=30,
        gates=gates,
    )
    assert not rep.passed, f"{variant} ({BROKEN_VARIANTS[variant]}) was not caught:\n{rep}"
    assert rep.error is None, rep.error
    assert rep.failure.ratio > 1.0


def test_reference_gradients_match_float64_within_the_bound():
    """The float32 reference against the float64 run of the same recurrence: its own bound
    (adjoint_bounds in float32, inner dimension max(d_k, d_v)) holds, and is not vacuous."""
    g = torch.Generator().manual_seed(3)
    B, T, H, dk, dv = 1, 20, 2, 8, 12
    q = torch.nn.functional.normalize(
        torch.randn(B, T, H, dk, generator=g, dtype=torch.float64), dim=-1
    )
    k = torch.nn.functional.normalize(
        torch.randn(B, T, H, dk, generator=g, dtype=torch.float64), dim=-1
    )
    v = torch.randn(B, T, H, dv, generator=g, dtype=torch.float64)
    gl = -torch.rand(B, T, H, generator=g, dtype=torch.float64)
    beta = 2 * torch.rand(B, T, H, generator=g, dtype=torch.float64)
    h0, dht = (torch.randn(B, H, dk, dv, generator=g, dtype=torch.float64) for _ in range(2))
    do = torch.randn(B, T, H, dv, generator=g, dtype=torch.float64)
    x = (q, k, v, gl, beta, h0, do, dht)
    opts = dict(mode="gdn", eps=1e-6, cu_seqlens=None)
    exact = reference_gradients(*x, **opts)
    got = reference_gradients(*(t.float() for t in x), **opts)
    bounds = adjoint_bounds(*x, arith=harness.REFERENCE_ARITH, n=max(dk, dv), **opts)
    for name, e, r, b, core in zip(
        ("dq", "dk", "dv", "dg", "dbeta", "dh0"), exact, got, bounds, (1, 1, 1, 0, 0, 2)
    ):
        dims = tuple(range(-core, 0))
        err = (
            (r.double() - e).abs()
            if not core
            else torch.linalg.vector_norm(r.double() - e, dim=dims)
        )
        size = e.abs() if not core else torch.linalg.vector_norm(e, dim=dims)
        assert bool((err <= b).all()), f"{name}: worst ratio {float((err / b).max())}"
        assert float(b.max()) < float(size.max()), f"{name}: bound {float(b.max())} is vacuous"


def test_inconclusive_names_vacuous_bounds():
    rep = harness.Report("k", "r", "kla_backward", "bfloat16", "bfloat16/storage")
    rep.history = [
        harness.Finding(0.5, "dg", 0, 1e-3, 2e-3, "c", 1e-3),
        harness.Finding(0.5, "dq", 0, 1e-3, 2e-3, "c", 1.0),
    ]
    assert [f.output for f in inconclusive(rep)] == ["dg"]
    # vacuous at another entry than the worst one: listed too, as Report.vacuous_cases counts it
    rep.history.append(harness.Finding(0.5, "dk", 0, 1e-3, 2e-3, "c", 1.0, vacuous=True))
    assert [f.output for f in inconclusive(rep)] == ["dg", "dk"]


def test_varlen_reference_runs_each_sequence_from_its_own_state():
    """cu_seqlens packs sequences: the second starts from its own h0, not the first's S_T."""
    g = torch.Generator().manual_seed(0)
    q, k = (
        torch.nn.functional.normalize(
            torch.randn(1, 7, 1, 4, generator=g, dtype=torch.float64), dim=-1
        )
        for _ in range(2)
    )
    v = torch.randn(1, 7, 1, 3, generator=g, dtype=torch.float64)
    gl, beta = -torch.rand(1, 7, 1, dtype=torch.float64), torch.rand(1, 7, 1, dtype=torch.float64)
    h0 = torch.randn(2, 1, 4, 3, generator=g, dtype=torch.float64)
    o, S = recurrent_forward(
        q, k, v, g=gl, beta=beta, initial_state=h0, cu_seqlens=torch.tensor([0, 3, 7])
    )
    o2, S2 = recurrent_forward(
        q[:, 3:], k[:, 3:], v[:, 3:], g=gl[:, 3:], beta=beta[:, 3:], initial_state=h0[1:]
    )
    assert torch.equal(o[:, 3:], o2) and torch.equal(S[1:], S2)


# ------------------------------------------------------------------ the GKA layer (gka_layer_backward)

# Each broken variant is drawn where the output it breaks has a conclusive GRAD bound: dq
# everywhere; dk (the lambda path) and dg (a cumulative sum whose terms cancel) under no or
# weak gates, with a >= 0.2 and, for dg, T <= 5 (GRAD on dg grows with the tokens summed: at
# T = 19 it is 1-3 times dg itself, too loose to catch a sign).
GKA_VARIANT_DRAWS = {
    "dq_without_solve": {},
    "dk_without_lambda": {"gates": ("none", "weak"), "a_values": (0.2, 0.5)},
    "dg_sign": {"gates": ("weak",), "a_values": (0.2, 0.5), "max_T": 5},
}


def _gka_check(variant, examples, **kw):
    from analysis.testing.gka_gradient_harness import (
        gka_implicit_reference,
        gka_kernel_variant,
        gka_layer_backward,
    )

    return harness.check(
        gka_kernel_variant(broken_variant=variant),
        gka_implicit_reference,
        gka_layer_backward(device=DEVICE, **kw),
        precision="float32",
        model="float32",
        examples=examples,
        device=DEVICE,
        shrink=False,
    )


def test_gka_strategy_passes_on_the_implicit_backward():
    """kernels.gka_layer's implicit backward within GRAD (analysis.testing.gka_gradient_harness) in every
    drawn case; dq, dk and dv have conclusive findings (dg and dbeta are often INCONCLUSIVE:
    their terms cancel, docs/gradients.md)."""
    rep = _gka_check(None, examples=6)
    assert rep.passed, str(rep)
    conclusive = {f.output for f in rep.history if not f.vacuous and f.reference_norm > 0}
    assert {"dq", "dk", "dv"} <= conclusive, conclusive


@pytest.mark.parametrize("variant", sorted(GKA_VARIANT_DRAWS))
def test_gka_broken_variant_is_caught(variant):
    """The GKA broken-variant matrix (analysis.testing.gka_gradient_harness.BROKEN_GKA_VARIANTS): each fails
    GRAD with a conclusive bound (not merely beyond a vacuous one)."""
    rep = _gka_check(variant, examples=8, **GKA_VARIANT_DRAWS[variant])
    assert not rep.passed, f"{variant} was not caught:\n{rep}"
    assert rep.error is None, rep.error
    assert rep.failure.ratio > 1.0 and not rep.failure.vacuous, str(rep.failure)


def test_gka_strategy_refuses_unknown_arguments():
    from analysis.testing.gka_gradient_harness import gka_kernel_variant, gka_layer_backward

    with pytest.raises(ValueError, match="gates"):
        gka_layer_backward(gates=("medium",))
    with pytest.raises(ValueError, match="broken_variant"):
        gka_kernel_variant(broken_variant="nope")


@pytest.mark.gpu
def test_gka_strategy_gpu():
    """On the GPU at d in {64, 128}, C = 32 (the float32/ieee default): the implicit backward
    within GRAD, and the missing second solve caught. At these sizes GRAD is conclusive for dq
    only (dk and dv: bound/gradient 2 to 260 under the interpreter, docs/gradients.md)."""
    kw = dict(dims=(64, 128), chunk_size=32, max_T=70)
    rep = _gka_check(None, examples=4, **kw)
    assert rep.passed, str(rep)
    assert "dq" in {f.output for f in rep.history if not f.vacuous and f.reference_norm > 0}
    bad = _gka_check("dq_without_solve", examples=4, **kw)
    assert not bad.passed and not bad.failure.vacuous, str(bad)
