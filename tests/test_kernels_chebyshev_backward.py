"""kernels.chebyshev_backward and kernels.chebyshev_solve against solvers.chebyshev_backward
(GKA Table 1 / Lemma 2, corrected Algorithm 2), forward and gradients with random
cotangents, within the bounds of analysis.testing.harness._backward_scales."""

import functools

import pytest
import torch
from kernel_support import (  # noqa: F401 - poisoned_outputs is an autouse fixture
    DEVICE,
    broken_fails,
    large,
    needs_triton_device,
    poisoned_outputs,
    small,
)

import kernels
import solvers
from analysis.testing import harness
from analysis.testing.strategies import log_uniform_spd

pytestmark = needs_triton_device

fp32_grads = functools.partial(kernels.chebyshev_backward, out_dtype=torch.float32)


REVERSE = ("reverse", "reverse_stored_omega")


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_backward_matches_reference(precision):
    # bounds: harness._backward_scales (dq: solve-like; dH implicit: product of two solves)
    harness.assert_matches(
        fp32_grads,
        solvers.chebyshev_backward,
        small(harness.spd_backward, precision, methods=("implicit",)),
        precision=precision,
        device=DEVICE,
    )


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_reverse_backward_within_its_running_bound(precision):
    # bounds: harness._backward_scales, reverse methods: the running bound of
    # analysis.bounds.reverse_backward (contract float32 + the float32 reference). In float32
    # arithmetic it is conclusive on the strategy's domain (kappa 10-100, r <= 12; the former
    # a-priori allowance was vacuous there: D = 1, kappa = 34, r = 3: 1575 ||dH||)
    harness.assert_matches(
        fp32_grads,
        solvers.chebyshev_backward,
        small(harness.spd_backward, precision, methods=REVERSE),
        precision=precision,
        device=DEVICE,
    )


def test_backward_bf16_outputs_and_tensor_cores():
    kernel = functools.partial(kernels.chebyshev_backward, tensor_cores=True)
    for methods in (("implicit",), REVERSE):  # as the two above
        harness.assert_matches(
            kernel,
            solvers.chebyshev_backward,
            small(harness.spd_backward, "bfloat16", methods=methods),
            precision="bfloat16",
            device=DEVICE,
            examples=8,
        )


def via_autograd(H, q, grad_x, *, L, mu, iters, method):
    """kernels.chebyshev_solve's backward through torch.autograd, as (dq, dH)."""
    H = H.detach().clone().requires_grad_(True)
    q = q.detach().clone().requires_grad_(True)
    x = kernels.chebyshev_solve(H, q, L=L, mu=mu, iters=iters, backward=method)
    x.backward(grad_x)
    return q.grad, H.grad


def test_autograd_wrapper_matches_reference():
    harness.assert_matches(
        via_autograd,
        solvers.chebyshev_backward,
        small(harness.spd_backward, "float32"),
        precision="float32",
        device=DEVICE,
        examples=8,
    )


def test_solve_forward_equals_kernel_forward():
    H = log_uniform_spd(5, 2, 20.0, 1.0, torch.Generator().manual_seed(0)).float().to(DEVICE)
    q = torch.randn(2, 5, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    for m in kernels.chebyshev_backward.__globals__["METHODS"]:
        x = kernels.chebyshev_solve(H, q, L=1.0, mu=0.05, iters=7, backward=m)
        assert torch.equal(x, kernels.chebyshev(H, q, L=1.0, mu=0.05, iters=7))


def test_broadcast_gradients_are_summed():
    # one H shared by a batch of right-hand sides: dH is the sum of the per-system dH's,
    # exactly the float32 sum of the kernel's results on the expanded batch
    H = log_uniform_spd(4, 1, 10.0, 1.0, torch.Generator().manual_seed(2))[0].float().to(DEVICE)
    q = torch.randn(3, 4, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    g = torch.randn(3, 4, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    for m in ("implicit", "reverse_stored_omega"):
        dq, dH = kernels.chebyshev_backward(H, q, g, L=1.0, mu=0.1, iters=5, method=m)
        eq, eH = kernels.chebyshev_backward(
            H.expand(3, 4, 4), q, g, L=1.0, mu=0.1, iters=5, method=m
        )
        rq, rH = solvers.chebyshev_backward(H, q, g, L=1.0, mu=0.1, iters=5, method=m)
        assert dH.shape == rH.shape == H.shape and dq.shape == rq.shape == q.shape
        assert torch.equal(dq, eq) and torch.equal(dH, eH.sum(0))


def test_errors():
    H = torch.eye(3, device=DEVICE)
    q = torch.ones(3, device=DEVICE)
    with pytest.raises(ValueError, match="autograd"):
        kernels.chebyshev_backward(H, q, q, L=1.0, mu=0.5, iters=2, method="autograd")
    with pytest.raises(ValueError, match="L > mu"):
        kernels.chebyshev_backward(H, q, q, L=1.0, mu=1.0, iters=2, method="reverse")
    with pytest.raises(ValueError, match="grad_x must have the shape"):
        kernels.chebyshev_backward(
            H, q, torch.ones(2, 3, device=DEVICE), L=1.0, mu=0.5, iters=2, method="implicit"
        )
    with pytest.raises(ValueError, match="return_info"):
        kernels.chebyshev_backward(
            H, q, q, L=1.0, mu=0.5, iters=2, method="implicit", return_info=True
        )


def dH_transposed(H, q, grad_x, **kw):
    dq, dH = fp32_grads(H, q, grad_x, **kw)
    return dq, dH.transpose(-1, -2)


def dq_extra_c0_term(H, q, grad_x, *, L, mu, iters, method):
    """dq with an extra 2/(L+mu) grad_x, the size of the error of the printed Algorithm 2's
    doubled c_0 (it uses 2 nu_0/(L+mu) with nu_0 = 2)."""
    dq, dH = fp32_grads(H, q, grad_x, L=L, mu=mu, iters=iters, method=method)
    step = 2.0 / (torch.as_tensor(L) + torch.as_tensor(mu))
    return dq + torch.as_tensor(step, dtype=dq.dtype, device=dq.device).unsqueeze(
        -1
    ) * grad_x.float(), dH


@pytest.mark.parametrize("broken", [dH_transposed, dq_extra_c0_term], ids=lambda f: f.__name__)
def test_property_check_catches(broken):
    broken_fails(broken, solvers.chebyshev_backward, small(harness.spd_backward, "float32"))


@pytest.mark.gpu
def test_gpu_backward_large():
    # both conclusive: the reverse methods' running bound (analysis.bounds.reverse_backward) is
    # conclusive on the CPU domain and at D = 128, r = 30 in float32 arithmetic
    # (analysis.studies.reverse_backward_bound: dH bound ~0.14 ||dH|| at kappa 10)
    for methods in (("implicit",), REVERSE):
        harness.assert_matches(
            kernels.chebyshev_backward,
            solvers.chebyshev_backward,
            large(harness.spd_backward, "bfloat16", max_iters=30, methods=methods),
            precision="bfloat16",
            device="cuda",
            examples=4,
        )
