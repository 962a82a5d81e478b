"""The harness's output-rounding term: half a spacing at each returned entry, added only where
the strategy's bound does not already contain the store that produced the output."""

import functools

import pytest
import torch

from analysis.testing import harness
from kernels import emulate
from solvers import unit_roundoff
from solvers.contracts import parse


def _values(n: int, seed: int = 0) -> torch.Tensor:
    """float64 values over many binades, with exact powers of two, their neighbours, subnormals
    of bf16 and zeros among them."""
    g = torch.Generator().manual_seed(seed)
    mant = 1.0 + torch.rand(n, generator=g, dtype=torch.float64)
    expo = torch.randint(-140, 40, (n,), generator=g).to(torch.float64)
    v = mant * torch.exp2(expo) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    p2 = torch.exp2(torch.arange(-20, 20, dtype=torch.float64))
    return torch.cat(
        [v, p2, p2 * (1 + 2.0**-30), p2 * (1 - 2.0**-30), p2 * (1 - 2.0**-9), torch.zeros(4)]
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_half_spacing_covers_round_to_nearest(dtype):
    """|fl(v) - v| <= u 2^floor(log2 |fl(v)|) for every v (round to nearest, dtype's u), and the
    bound is attained: some v sit within 1% of it. At most u |fl(v)| for normal values."""
    v = _values(20000)
    y = v.to(dtype)
    h = harness.output_rounding_bound(y, ())
    err = (y.double() - v).abs()
    finite = torch.isfinite(y.double())
    assert bool((err[finite] <= h[finite]).all())  # the bound: half a spacing (RN)
    assert float((err[finite] / h[finite]).max()) > 0.99  # and no looser than that
    normal = finite & (y.double().abs() >= torch.finfo(dtype).tiny)
    assert bool((h[normal] <= unit_roundoff(dtype) * y.double().abs()[normal]).all())


def test_half_spacing_check_fails_on_a_quarter_spacing():
    """The covering check above fails for a bound half as large (a broken spacing)."""
    v = _values(20000)
    y = v.to(torch.bfloat16)
    h = harness.output_rounding_bound(y, ()) / 2
    assert not bool(((y.double() - v).abs() <= h).all())


def test_norm_over_core_dims():
    y = torch.tensor([[1.0, 3.0, -0.5], [0.0, 2.0**-130, 1.5]], dtype=torch.bfloat16)
    h = harness.output_rounding_bound(y, (-1,))
    u = 2.0**-8
    first = (u**2 * (1.0 + 2.0**2 + 0.5**2)) ** 0.5  # binades 2^0, 2^1, 2^-1
    assert h.shape == (2,)
    assert abs(float(h[0]) - first) <= 1e-15 * first  # exact up to the float64 sum


def _finding(kernel, strategy, case, model):
    (f,) = harness.run_case(
        kernel,
        harness.gka_ridge_reference,
        strategy,
        case,
        precision=torch.bfloat16,
        model=model,
        device="cpu",
    )
    return f


@pytest.mark.parametrize("model", ["bfloat16/storage", "bfloat16/operands", "float32"])
def test_ridge_output_rounding_counted_once(model):
    """Under bfloat16/storage the running bound already stores the last iterate in bf16, so a bf16
    result adds nothing more; under the other contracts the result's own rounding is added."""
    strategy = harness.gka_ridge(max_d=16)
    case = harness.gka_ridge_case(16, (3,), a=0.02, iters=6, seed=3)
    kernel = functools.partial(emulate.gka_ridge, contract=model)

    def bf16_out(H, q, **kw):
        return kernel(H, q, **kw).to(torch.bfloat16)

    contract = parse(model)
    exact = {k: v.to(torch.bfloat16).double() for k, v in case.inputs.items()}
    scales = harness._ridge_scales(case, exact, contract)[0]
    f = _finding(
        bf16_out,
        strategy,
        case,
        contract.name if model != "float32" else model + ";output=bfloat16",
    )
    x = bf16_out(*(v.to(torch.bfloat16) for v in case.inputs.values()), **case.options)
    extra = harness.output_rounding_bound(x, (-1,))[f.system]
    assert not f.failed  # the contract's own emulation stays within the bound
    if model == "bfloat16/storage":
        assert f.bound == pytest.approx(float(scales[f.system]), rel=1e-12)
    else:
        assert f.bound == pytest.approx(float(scales[f.system] + extra), rel=1e-12)
        assert float(extra) > 0


def test_kla_outputs_stored_in_the_bound():
    """KLA's bounds end with o_t and S_T stored in their arithmetic's dtype: bf16 under the bf16
    contracts, float32 under float32."""
    assert harness._kla_stored(parse("bfloat16/operands")) == (torch.bfloat16, torch.bfloat16)
    assert harness._kla_stored(parse("bfloat16/storage")) == (torch.bfloat16, torch.bfloat16)
    assert harness._kla_stored(parse("float32")) == (torch.float32, torch.float32)
    assert harness._rounded_in_bound(torch.bfloat16, torch.float32)
    assert not harness._rounded_in_bound(torch.float32, torch.bfloat16)
    assert not harness._rounded_in_bound(None, torch.float32)
