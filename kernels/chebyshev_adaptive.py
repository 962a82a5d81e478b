"""Chebyshev iteration on the GKA ridge system with the regularisation computed in the kernel.

GKA eq. (4): ``lambda = a ||H||_F``, ``L = ||H||_F + lambda``, ``mu = lambda``; then GKA
Algorithm 1 on ``(H + lambda I) xi = q`` — ``solvers.gka_ridge`` followed by
``solvers.chebyshev``, fused: each program reads its H once, forms ``||H||_F`` from the
registers (sum of squares in float32, square root in float32), derives lambda, L, mu, the
step ``2/(L+mu)`` and ``rho^2`` in float64 and rounds them once to float32 (as the reference
does from its float64 parameters), and multiplies by ``H + lambda I`` as ``H x + lambda x``
without forming it.

Contract: ``float32`` (``solvers.contracts``): float32 ||H||_F, iterate, products and accumulation; bf16 inputs
widened exactly (a bf16 H multiplies through three exact bf16 pieces of the iterate, fp32-accurate);
``input_precision="tf32"``: ``tf32``; the result rounded once to ``out_dtype``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from solvers import validation as check

from . import _launch as launch
from ._matvec import load_matrix, load_vector, matvec, store_vector


@triton.jit
def adaptive_kernel(
    p_H,
    p_q,
    p_a,
    p_x,
    p_fro,
    iters,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    b_H = load_matrix(p_H, i_n, D, BLOCK_D, MODE)
    b_q = load_vector(p_q, i_n, D, BLOCK_D)
    b_H32 = b_H.to(tl.float32)
    b_fro = tl.sqrt(tl.sum(tl.sum(b_H32 * b_H32, axis=1), axis=0))
    tl.store(p_fro + i_n, b_fro)
    # eq. (4) in float64, each constant rounded once to float32
    b_f64 = b_fro.to(tl.float64)
    b_lam64 = tl.load(p_a) * b_f64
    b_L = b_f64 + b_lam64
    b_lam = b_lam64.to(tl.float32)
    b_step = (2.0 / (b_L + b_lam64)).to(tl.float32)
    b_rho = (b_L - b_lam64) / (b_L + b_lam64)
    b_rho2 = (b_rho * b_rho).to(tl.float32)
    b_w = 2.0
    b_xp = tl.zeros([BLOCK_D], dtype=tl.float32)
    b_x = b_step * b_q
    for _ in range(iters):
        b_w = 4.0 / (4.0 - b_rho2 * b_w)  # solvers.omega_schedule, in device code
        b_g = matvec(b_H, b_x, MODE, BLOCK_D) + b_lam * b_x - b_q
        b_xn = b_x - (b_w * b_step) * b_g + (b_w - 1.0) * (b_x - b_xp)
        b_xp = b_x
        b_x = b_xn
    store_vector(p_x, i_n, b_x, D, BLOCK_D)


def chebyshev_adaptive(
    H,
    q,
    *,
    a: float,
    iters: int,
    return_lambda: bool = False,
    bf16_mode: str = "storage",
    input_precision: str = "ieee",
    out_dtype=None,
    tensor_cores=None,
):
    """r Chebyshev iterations on ``(H + a ||H||_F I) xi = q`` with L, mu of GKA eq. (4).

    H: ``(..., D, D)`` symmetric positive semidefinite with ``||H||_F > 0`` (a system with
    ``||H||_F = 0`` raises ValueError, as ``solvers.gka_ridge`` does); q ``(..., D)``; ``a > 0``.
    Returns xi_r in H's dtype (or ``out_dtype``); with ``return_lambda`` also the lambda each
    system used, float64 ``(...)`` = ``a * fro`` with ``fro`` the kernel's float32 ||H||_F.
    Other options as ``kernels.chebyshev``.
    """
    iters = check.count("iters", iters)
    a = check.ridge_strength(a)
    check.flag("return_lambda", return_lambda)
    launch.no_autograd(
        "chebyshev_adaptive",
        "solvers.gka_ridge then solvers.chebyshev differentiate through it",
        H=H,
        q=q,
    )
    launch.bf16_mode(bf16_mode)
    precision = launch.input_precision(input_precision)
    H2, q2, batch = launch.systems(H, q)
    mode = launch.matvec_mode(H2.dtype, precision, tensor_cores)
    odt = launch.out_dtype(out_dtype, H2.dtype)
    N, D = q2.shape
    x = launch.empty_out((N, D), odt, q2.device)
    fro = launch.empty_out((N,), torch.float32, q2.device)
    a_t = torch.tensor([a], dtype=torch.float64, device=q2.device)
    if N and not D:  # no kernel runs: ||H||_F of an empty matrix is 0, as the reference finds
        fro.zero_()
    if N and D:
        for s, n in launch.launches(N):
            adaptive_kernel[(n,)](
                H2[s:],
                q2[s:],
                a_t,
                x[s:],
                fro[s:],
                iters,
                D=D,
                BLOCK_D=launch.block(D),
                MODE=mode,
                num_warps=launch.num_warps(D),
            )
    if fro.numel() and not bool((fro > 0).all()):
        check.finite("H", H)  # a NaN in H makes ||H||_F NaN: name the NaN, not a zero norm
        raise ValueError("H has zero Frobenius norm in some system: lambda = a ||H||_F would be 0")
    launch.finite_result(x, H=H, q=q)
    x = x.reshape(*batch, D)
    if not return_lambda:
        return x
    return x, a * fro.to(torch.float64).reshape(batch)
