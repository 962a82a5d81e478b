"""Gradient descent and Nesterov's method (the baselines of GKA Fig. 1a) as Triton kernels.

Same recurrences as ``solvers.gd`` / ``solvers.agd`` (their docstrings state the bounds):

* gd:  x_{i+1} = x_i - 2/(L + mu) (H x_i - q),  x_0 = 0
* agd: x_{i+1} = y_i - (H y_i - q)/L,  y_{i+1} = x_{i+1} + beta (x_{i+1} - x_i),
  beta = (sqrt(kappa) - 1)/(sqrt(kappa) + 1),  x_0 = y_0 = 0

One program per system, matrix on chip, float32 iterates (see kernels.chebyshev).

Contract: ``float32`` (``solvers.contracts``): float32 iterate, products and accumulation; bf16 inputs
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
from .chebyshev import with_divergence


@triton.jit
def gd_kernel(
    p_H,
    p_q,
    p_step,
    p_x,
    p_xs,
    stride_xs,
    iters,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
    STORE_ALL: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    b_H = load_matrix(p_H, i_n, D, BLOCK_D, MODE)
    b_q = load_vector(p_q, i_n, D, BLOCK_D)
    b_step = tl.load(p_step + i_n)
    b_x = tl.zeros([BLOCK_D], dtype=tl.float32)
    if STORE_ALL:
        store_vector(p_xs, i_n, b_x, D, BLOCK_D)
    for i in range(iters):
        b_x = b_x - b_step * (matvec(b_H, b_x, MODE, BLOCK_D) - b_q)
        if STORE_ALL:
            store_vector(p_xs + (i + 1) * stride_xs, i_n, b_x, D, BLOCK_D)
    store_vector(p_x, i_n, b_x, D, BLOCK_D)


@triton.jit
def agd_kernel(
    p_H,
    p_q,
    p_step,
    p_beta,
    p_x,
    p_xs,
    stride_xs,
    iters,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
    STORE_ALL: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    b_H = load_matrix(p_H, i_n, D, BLOCK_D, MODE)
    b_q = load_vector(p_q, i_n, D, BLOCK_D)
    b_step = tl.load(p_step + i_n)
    b_beta = tl.load(p_beta + i_n)
    b_x = tl.zeros([BLOCK_D], dtype=tl.float32)
    b_y = b_x
    if STORE_ALL:
        store_vector(p_xs, i_n, b_x, D, BLOCK_D)
    for i in range(iters):
        b_xn = b_y - b_step * (matvec(b_H, b_y, MODE, BLOCK_D) - b_q)
        b_y = b_xn + b_beta * (b_xn - b_x)
        b_x = b_xn
        if STORE_ALL:
            store_vector(p_xs + (i + 1) * stride_xs, i_n, b_x, D, BLOCK_D)
    store_vector(p_x, i_n, b_x, D, BLOCK_D)


def _solve(
    method,
    kernel,
    H,
    q,
    L,
    mu,
    iters,
    params,
    bf16_mode,
    return_info,
    input_precision,
    out_dtype,
    tensor_cores,
):
    iters = check.count("iters", iters)
    check.flag("return_info", return_info)
    launch.no_autograd(
        method, f"solvers.{method} differentiates through the iteration", H=H, q=q, L=L, mu=mu
    )
    launch.bf16_mode(bf16_mode)
    precision = launch.input_precision(input_precision)
    H2, q2, batch, Lt, mt = launch.bounded_systems(H, q, L, mu)
    mode = launch.matvec_mode(H2.dtype, precision, tensor_cores)
    odt = launch.out_dtype(out_dtype, H2.dtype)
    scalars = [launch.fp32(c) for c in params(Lt, mt)]
    N, D = q2.shape
    x = launch.empty_out((N, D), odt, q2.device)
    xs = launch.empty_out((iters + 1, N, D) if return_info else (1, 1, 1), odt, q2.device)
    if N and D:
        for s, n in launch.launches(N):
            kernel[(n,)](
                H2[s:],
                q2[s:],
                *[c[s:] for c in scalars],
                x[s:],
                xs[:, s:] if return_info else xs,
                N * D,
                iters,
                D=D,
                BLOCK_D=launch.block(D),
                MODE=mode,
                STORE_ALL=return_info,
                num_warps=launch.num_warps(D),
            )
    launch.finite_result(x, H=H, q=q)
    x = x.reshape(*batch, D)
    if not return_info:
        return x
    info = launch.info(H2, q2, batch, x, xs, launch.precision_label(H2.dtype, precision))
    return x, with_divergence(info, method, q2, Lt, mt, precision, odt)


def gd(
    H,
    q,
    *,
    L,
    mu,
    iters: int,
    bf16_mode: str = "storage",
    return_info: bool = False,
    input_precision: str = "ieee",
    out_dtype=None,
    tensor_cores=None,
):
    """``iters`` steps of gradient descent with step 2/(L+mu) from x_0 = 0 (``solvers.gd``).

    Differences from the reference, the extra options and the status (DIVERGED included): as
    ``kernels.chebyshev``.
    """
    return _solve(
        "gd",
        gd_kernel,
        H,
        q,
        L,
        mu,
        iters,
        lambda L, mu: (2.0 / (L + mu),),
        bf16_mode,
        return_info,
        input_precision,
        out_dtype,
        tensor_cores,
    )


def _agd_params(L, mu):
    sk = torch.sqrt(L / mu)
    return 1.0 / L, (sk - 1.0) / (sk + 1.0)


def agd(
    H,
    q,
    *,
    L,
    mu,
    iters: int,
    bf16_mode: str = "storage",
    return_info: bool = False,
    input_precision: str = "ieee",
    out_dtype=None,
    tensor_cores=None,
):
    """``iters`` steps of Nesterov's method, step 1/L, momentum (sqrt k - 1)/(sqrt k + 1)
    (``solvers.agd``). Differences and extra options: as ``kernels.chebyshev``."""
    return _solve(
        "agd",
        agd_kernel,
        H,
        q,
        L,
        mu,
        iters,
        _agd_params,
        bf16_mode,
        return_info,
        input_precision,
        out_dtype,
        tensor_cores,
    )
