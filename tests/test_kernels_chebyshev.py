"""kernels.chebyshev and kernels.chebyshev_adaptive against the references (GKA Algorithm 1,
eq. (4)), within the precision model's bound (analysis/testing/harness.py states it), plus the
kernel contract: errors, empty and broadcast batches, non-contiguous inputs, many launches.
"""

import functools

import pytest
import torch
from kernel_support import (  # noqa: F401 - poisoned_outputs is an autouse fixture
    DEVICE,
    DTYPES,
    broken_fails,
    fp32_out,
    large,
    needs_triton_device,
    poisoned_outputs,
    small,
)

import kernels
import solvers
from analysis.precision import rounding_allowance
from analysis.testing import harness
from analysis.testing.strategies import log_uniform_spd
from kernels import _launch
from solvers import Arith
from solvers.contracts import OPERAND_ROUNDOFF

pytestmark = needs_triton_device


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_chebyshev_matches_reference(precision):
    # bound: harness, (allowance(float32) + allowance(float32)) * ||q|| / lambda_min + u(out) ||x||
    harness.assert_matches(
        kernels.chebyshev,
        solvers.chebyshev,
        small(harness.spd, precision),
        precision=precision,
        device=DEVICE,
    )


@pytest.mark.parametrize("tensor_cores", [True, False])
def test_chebyshev_float32_result_matches_reference_bf16_products(tensor_cores):
    # the three-piece bf16 split on tensor cores (kernels._matvec.DOT3) and the CUDA-core
    # product (FMA), both at fp32 accuracy; result unrounded
    kernel = functools.partial(
        kernels.chebyshev, out_dtype=torch.float32, tensor_cores=tensor_cores
    )
    harness.assert_matches(
        kernel,
        solvers.chebyshev,
        small(harness.spd, "bfloat16"),
        precision="bfloat16",
        device=DEVICE,
        examples=8,
    )


def test_chebyshev_float32_result_matches_reference():
    harness.assert_matches(
        fp32_out(kernels.chebyshev),
        solvers.chebyshev,
        small(harness.spd, "bfloat16"),
        precision="bfloat16",
        device=DEVICE,
        examples=8,
    )


def test_return_info_matches_reference_history():
    P = solvers.fig1a_problems(B=1, T=3, heads=1, D=7, a=0.05, seed=1)
    H, q = P.A.to(torch.bfloat16).to(DEVICE), P.q.to(torch.bfloat16).to(DEVICE)
    x, info = kernels.chebyshev(
        H, q, L=P.L, mu=P.mu, iters=6, return_info=True, out_dtype=torch.float32
    )
    xr, ref = solvers.chebyshev(H.float(), q.float(), L=P.L, mu=P.mu, iters=6, return_info=True)
    assert (
        info.iterates.shape == ref.iterates.shape
        and info.residual_norms.shape == ref.residual_norms.shape
    )
    assert torch.equal(info.omegas, ref.omegas)  # the same float32 weight recurrence
    assert info.status == solvers.Status.COMPLETED and "float32-iterates" in info.precision
    # every iterate within the forward bound: 2 allowance(float32, kappa = L/mu) ||q|| / mu
    tol = (
        2 * rounding_allowance(P.L / P.mu, 7, Arith(torch.float32)) * q.float().norm(dim=-1) / P.mu
    )
    assert ((info.iterates - ref.iterates).norm(dim=-1) <= tol).all()


def test_tf32_products_within_tf32_allowance():
    # input_precision="tf32": operands cut to tf32 (truncated on Hopper, u = 2^-10) on a GPU; the
    # interpreter computes in float32, which the same bound covers. bound: allowance with the
    # contract's tf32 u.
    P = solvers.fig1a_problems(B=1, T=4, heads=1, D=16, a=0.05, seed=2)
    H, q = P.A.float().to(DEVICE), P.q.float().to(DEVICE)
    x = kernels.chebyshev(H, q, L=P.L, mu=P.mu, iters=20, input_precision="tf32")
    xr = solvers.chebyshev(H, q, L=P.L, mu=P.mu, iters=20)
    kappa, n, u_tf32 = P.L / P.mu, 16, OPERAND_ROUNDOFF["tf32"]
    tol = (
        8.0 * kappa * (n * u_tf32 + u_tf32) * q.norm(dim=-1) / P.mu
        + 2 * rounding_allowance(kappa, n, Arith(torch.float32)) * q.norm(dim=-1) / P.mu
    )
    assert ((x - xr).norm(dim=-1) <= tol).all()


# --- the GKA adaptive variant (eq. (4)) ------------------------------------------------


def _psd(batch, D, rank, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(*batch, rank, D, dtype=torch.float64, generator=g)
    return (k.transpose(-1, -2) @ k).to(dtype), torch.randn(
        *batch, D, dtype=torch.float64, generator=g
    ).to(dtype)


@pytest.mark.parametrize(
    "precision,D,rank", [("bfloat16", 16, 40), ("float32", 5, 2), ("bfloat16", 13, 1)]
)
def test_adaptive_matches_gka_ridge_then_chebyshev(precision, D, rank):
    a, iters = 0.02, 20
    H, q = _psd((3,), D, rank, DTYPES[precision], seed=D)
    H, q = H.to(DEVICE), q.to(DEVICE)
    x, lam = kernels.chebyshev_adaptive(
        H, q, a=a, iters=iters, return_lambda=True, out_dtype=torch.float32
    )
    ridge = solvers.gka_ridge(H.double(), a)
    # lambda: ||H||_F^2 summed in float32 over n = D^2 non-negative terms, relative error
    # <= gamma_n (Higham Thm 4.4 with the products' rounding), the square root halves it
    # and adds u: |lam - lam_ref| <= (gamma_n / 2 + u) lam_ref.
    n, u = D * D, 2.0**-24
    gamma = n * u / (1 - n * u)
    assert ((lam - ridge.lam).abs() <= (gamma / 2 + u) * ridge.lam).all()
    # x: the reference solve of (H + lam I) with the kernel's lambda and eq. (4)'s L, mu;
    # bound: 2 allowance(float32, kappa = (1+a)/a) * ||q|| / lambda (lambda <= eigenvalues).
    fro = lam / a
    A = (
        H.double() + lam[:, None, None] * torch.eye(D, dtype=torch.float64, device=H.device)
    ).float()
    xr = solvers.chebyshev(A, q.float(), L=fro + lam, mu=lam, iters=iters)
    tol = (
        2 * rounding_allowance((1 + a) / a, D, Arith(torch.float32)) * q.float().norm(dim=-1) / lam
    )
    assert ((x - xr).double().norm(dim=-1) <= tol).all()


def test_adaptive_rejects_zero_matrix():
    H = torch.zeros(2, 4, 4, device=DEVICE)
    H[0] = torch.eye(4)
    with pytest.raises(ValueError, match="zero Frobenius norm"):
        kernels.chebyshev_adaptive(H, torch.ones(2, 4, device=DEVICE), a=0.1, iters=3)


def test_broken_adaptive_fails_lambda_check():
    # lambda computed from ||H||_F^2 instead of ||H||_F (a missing square root) must fail
    H, q = _psd((2,), 6, 3, torch.float32, seed=0)
    _, lam = kernels.chebyshev_adaptive(
        H.to(DEVICE), q.to(DEVICE), a=0.02, iters=2, return_lambda=True
    )
    wrong = lam * (lam / 0.02)
    ref = solvers.gka_ridge(H.double(), 0.02).lam
    gamma = 36 * 2.0**-24 / (1 - 36 * 2.0**-24)
    assert not ((wrong.cpu() - ref).abs() <= (gamma / 2 + 2.0**-24) * ref).all()


# --- deliberately broken kernels: the property check must catch each -------------------


def off_by_one(H, q, *, L, mu, iters, **kw):
    return kernels.chebyshev(H, q, L=L, mu=mu, iters=iters + 1, **kw)


def wrong_step(H, q, *, L, mu, iters, **kw):
    """Step 2/(L + mu/2) instead of 2/(L + mu)."""
    return kernels.chebyshev(H, q, L=L, mu=torch.as_tensor(mu) * 0.5, iters=iters, **kw)


def skips_last_system(H, q, *, L, mu, iters, **kw):
    """Writes every system but the last: the NaN-poisoned buffer shows it."""
    D = q.shape[-1]
    H2, q2 = H.expand(*q.shape[:-1], D, D).reshape(-1, D, D), q.reshape(-1, D)
    L2 = torch.as_tensor(L, dtype=torch.float64).expand(q.shape[:-1]).reshape(-1)
    mu2 = torch.as_tensor(mu, dtype=torch.float64).expand(q.shape[:-1]).reshape(-1)
    out = torch.empty(q2.shape, dtype=H.dtype, device=H.device)
    out[:-1] = kernels.chebyshev(H2[:-1], q2[:-1], L=L2[:-1], mu=mu2[:-1], iters=iters, **kw)
    return out.reshape(q.shape)


@pytest.mark.parametrize("broken", [off_by_one, wrong_step], ids=lambda f: f.__name__)
def test_property_check_catches(broken):
    broken_fails(fp32_out(broken), solvers.chebyshev, small(harness.spd, "float32"))


def test_property_check_catches_unwritten_output():
    rep = broken_fails(skips_last_system, solvers.chebyshev, small(harness.spd, "float32"))
    assert rep.failure.ratio == float("inf")  # NaN error


# --- the kernel contract ---------------------------------------------------------------


def _problem(batch=(3,), D=6, dtype=torch.float32):
    H = log_uniform_spd(
        D, max(1, torch.Size(batch).numel()), 10.0, 1.0, torch.Generator().manual_seed(0)
    )
    q = torch.randn(*batch, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return H.reshape(*batch, D, D).to(dtype).to(DEVICE), q.to(dtype).to(DEVICE)


def test_errors_name_the_argument():
    H, q = _problem()
    with pytest.raises(TypeError, match="H has dtype torch.float64"):
        kernels.chebyshev(H.double(), q.double(), L=1.0, mu=0.1, iters=2)
    with pytest.raises(TypeError, match="q has dtype"):
        kernels.chebyshev(H, q.bfloat16(), L=1.0, mu=0.1, iters=2)
    with pytest.raises(ValueError, match="D <= 128"):
        kernels.chebyshev(
            torch.eye(129, device=DEVICE), torch.ones(129, device=DEVICE), L=1.0, mu=1.0, iters=1
        )
    with pytest.raises(ValueError, match="L must be >= mu"):
        kernels.chebyshev(H, q, L=0.1, mu=1.0, iters=2)
    with pytest.raises(ValueError, match="strict"):
        kernels.chebyshev(H.bfloat16(), q.bfloat16(), L=1.0, mu=0.1, iters=2, bf16_mode="strict")
    with pytest.raises(ValueError, match="tf32"):
        kernels.chebyshev(
            H.bfloat16(), q.bfloat16(), L=1.0, mu=0.1, iters=2, input_precision="tf32"
        )
    with pytest.raises(ValueError, match="input_precision"):
        kernels.chebyshev(H, q, L=1.0, mu=0.1, iters=2, input_precision="fast")
    with pytest.raises(TypeError, match="iters"):
        kernels.chebyshev(H, q, L=1.0, mu=0.1, iters=2.0)


def test_nan_input_is_named_not_returned():
    H, q = _problem()
    q = q.clone()
    q[1, 2] = float("nan")
    with pytest.raises(ValueError, match="q has 1 non-finite"):
        kernels.chebyshev(H, q, L=1.0, mu=0.1, iters=3)


def test_cpu_tensor_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    H, q = _problem()
    with pytest.raises(ValueError, match="CUDA device|TRITON_INTERPRET"):
        kernels.chebyshev(H.cpu(), q.cpu(), L=1.0, mu=0.1, iters=2)


@pytest.mark.parametrize("kernel", ["chebyshev", "gd", "agd"])
def test_empty_batch(kernel):
    H, q = torch.empty(0, 5, 5, device=DEVICE), torch.empty(0, 5, device=DEVICE)
    x = getattr(kernels, kernel)(H, q, L=1.0, mu=0.5, iters=3)
    assert x.shape == (0, 5)


def test_broadcast_noncontiguous_and_inputs_untouched():
    H, q = _problem(batch=(3,), D=9)
    q_big = torch.randn(2, 3, 18, device=DEVICE, dtype=torch.float32)[..., ::2]  # strided view
    H_t = H.transpose(-1, -2)  # symmetric: same values, non-contiguous
    L, mu = torch.tensor([1.0, 1.2, 1.4], device=DEVICE), 0.1  # per-system L lives with the data
    before = (H_t.clone(), q_big.clone())
    x = kernels.chebyshev(H_t, q_big, L=L, mu=mu, iters=5)
    assert x.shape == (2, 3, 9)
    assert torch.equal(H_t, before[0]) and torch.equal(q_big, before[1])
    expected = kernels.chebyshev(
        H.expand(2, 3, 9, 9).contiguous(), q_big.contiguous(), L=L, mu=mu, iters=5
    )
    assert torch.equal(x, expected)


def test_many_launches_equal_one(monkeypatch):
    # batches beyond CUDA's grid limit run as several launches: exercised with a limit of 2
    H, q = _problem(batch=(5,), D=4)
    one = kernels.chebyshev(H, q, L=1.0, mu=0.1, iters=4)
    monkeypatch.setattr(_launch, "MAX_GRID", 2)
    assert torch.equal(kernels.chebyshev(H, q, L=1.0, mu=0.1, iters=4), one)


# --- GPU: realistic sizes --------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_cores", [False, True])
def test_gpu_chebyshev_large(tensor_cores):
    kernel = functools.partial(kernels.chebyshev, tensor_cores=tensor_cores)
    harness.assert_matches(
        kernel,
        solvers.chebyshev,
        large(harness.spd, "bfloat16"),
        precision="bfloat16",
        device="cuda",
        examples=4,
    )


@pytest.mark.gpu
def test_gpu_grid_beyond_65535_systems():
    N, D = 70000, 16
    h = torch.linspace(1, 2, N, device="cuda").bfloat16()  # the diagonal as stored
    H = torch.eye(D, device="cuda", dtype=torch.bfloat16) * h[:, None, None]
    q = torch.ones(N, D, device="cuda", dtype=torch.bfloat16)
    x = kernels.chebyshev(H, q, L=2.0, mu=1.0, iters=30, out_dtype=torch.float32)
    exact = 1.0 / h.double()
    # Chebyshev bound 2 R_a^{r+1} with kappa = 2 (R_a = 0.1716), plus float32 allowance
    tol = 2 * ((2**0.5 - 1) / (2**0.5 + 1)) ** 31 + 2 * rounding_allowance(
        2.0, D, Arith(torch.float32)
    )
    assert ((x.double() - exact[:, None]).abs().max(dim=-1).values <= tol * exact).all()
