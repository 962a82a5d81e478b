"""kernels.gd, kernels.agd and kernels.cg against solvers.gd / agd / cg (GKA Fig. 1a's
baselines), within the precision model's bound (kernels/harness.py)."""

import functools

import pytest
import torch
from kernel_support import (  # noqa: F401 - poisoned_outputs is an autouse fixture
    DEVICE,
    broken_fails,
    fp32_out,
    large,
    needs_triton_device,
    poisoned_outputs,
    small,
)

import kernels
import solvers
from kernels import harness

pytestmark = needs_triton_device


@pytest.mark.parametrize("name", ["gd", "agd"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_gradient_methods_match_reference(name, precision):
    # bound: harness, (allowance(float32) * 2) * ||q|| / lambda_min + u(out) ||x||
    harness.assert_matches(fp32_out(getattr(kernels, name)), getattr(solvers, name),
                           small(harness.spd, precision), precision=precision, device=DEVICE, examples=8)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_cg_matches_reference(precision):
    # kappa of the allowance: the rounded matrix's own lambda_max / lambda_min
    harness.assert_matches(fp32_out(kernels.cg), solvers.cg, small(harness.spd, precision, bounds=False),
                           precision=precision, device=DEVICE)


def test_cg_tensor_cores_match_reference():
    kernel = functools.partial(kernels.cg, out_dtype=torch.float32, tensor_cores=True)
    harness.assert_matches(kernel, solvers.cg, small(harness.spd, "bfloat16", bounds=False),
                           precision="bfloat16", device=DEVICE, examples=6)


def test_cg_status_and_tolerance_as_reference():
    H = harness.spd_matrices(6, 4, 50.0, 1.0, torch.Generator().manual_seed(3)).float()
    q = torch.randn(4, 6, generator=torch.Generator().manual_seed(4))
    q[2] = 0.0  # b = 0: frozen at once, CONVERGED
    H, q = H.to(DEVICE), q.to(DEVICE)
    for kw in ({"iters": 3}, {"iters": 30, "rtol": 1e-3}, {"iters": 2, "rtol": 1e-6}):
        x, info = kernels.cg(H, q, return_info=True, **kw)
        xr, ref = solvers.cg(H, q, return_info=True, **kw)
        assert torch.equal(info.system_status, ref.system_status), kw
        assert info.iterates.shape == ref.iterates.shape
    assert int(info.system_status[2]) == solvers.Status.CONVERGED and torch.equal(x[2], torch.zeros_like(x[2]))


def test_cg_indefinite_is_breakdown():
    H = torch.diag(torch.tensor([1.0, -1.0])).to(DEVICE)
    q = torch.tensor([1.0, 1.0], device=DEVICE)
    x, info = kernels.cg(H, q, iters=3, return_info=True)
    assert info.status == solvers.Status.BREAKDOWN and torch.isfinite(x).all()


def gd_step_1_over_L(H, q, *, L, mu, iters, **kw):
    """GD with step 1/L (GKA uses 2/(L+mu)): mu = L gives 2/(2L)."""
    return kernels.gd(H, q, L=L, mu=L, iters=iters, **kw)


def agd_without_momentum(H, q, *, L, mu, iters, **kw):
    """L == mu gives beta = 0: plain GD with step 1/L, not Nesterov's method."""
    return kernels.agd(H, q, L=L, mu=L, iters=iters, **kw)


def cg_one_step_short(H, q, *, iters, **kw):
    return kernels.cg(H, q, iters=max(iters - 1, 0), **kw)


def test_property_check_catches_wrong_gd_step():
    broken_fails(fp32_out(gd_step_1_over_L), solvers.gd, small(harness.spd, "float32"))


def test_property_check_catches_agd_without_momentum():
    broken_fails(fp32_out(agd_without_momentum), solvers.agd, small(harness.spd, "float32"))


def test_property_check_catches_cg_off_by_one():
    broken_fails(fp32_out(cg_one_step_short), solvers.cg, small(harness.spd, "float32", bounds=False))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gd", "agd", "cg"])
def test_gpu_large(name):
    strat = large(harness.spd, "bfloat16", bounds=name != "cg")
    harness.assert_matches(getattr(kernels, name), getattr(solvers, name), strat,
                           precision="bfloat16", device="cuda", examples=4)
