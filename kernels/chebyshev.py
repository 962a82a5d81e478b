"""Chebyshev iteration (GKA Algorithm 1) as a Triton kernel, one program per system.

Same recurrence as ``solvers.chebyshev`` (whose docstring states it and its bound):

    omega_i = 4 / (4 - rho^2 omega_{i-1})
    xi_i = xi_{i-1} - 2 omega_i / (L + mu) (H xi_{i-1} - q) + (omega_i - 1)(xi_{i-1} - xi_{i-2})

with per-system L and mu. The program loads its matrix once and keeps it on chip for all r
iterations; xi_{i-1}, xi_{i-2}, q and the products are float32 whatever the input dtype, so
a bfloat16 input is solved with float32 arithmetic on its bf16 values (compare against
``solvers.chebyshev`` on the float32 copies of the same inputs, see tests/test_kernels_chebyshev.py).
The result is rounded once to ``out_dtype`` (default: H's dtype, as the reference returns).

Contract: ``float32`` (``solvers.contracts``): float32 iterate, products and accumulation; bf16 inputs
widened exactly (a bf16 H multiplies through three exact bf16 pieces of the iterate, fp32-accurate);
``input_precision="tf32"``: ``tf32``; the result rounded once to ``out_dtype``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from solvers import omega_schedule, unit_roundoff
from solvers import validation as check
from solvers.contracts import OPERAND_ROUNDOFF
from solvers.divergence import divergence_limit, flag_divergence

from . import _launch as launch
from ._matvec import load_matrix, load_vector, matvec, store_vector


@triton.jit
def chebyshev_steps(
    b_H,
    b_q,
    b_step,
    b_rho2,
    iters,
    p_xs,
    stride_xs,
    i_n,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
    STORE_ALL: tl.constexpr,
):
    """r Chebyshev steps from xi_{-1} = 0, xi_0 = step q (step = 2/(L+mu)); returns
    (xi_r, xi_{r-1}) in float32. With STORE_ALL, xi_0..xi_r go to p_xs, stride_xs apart."""
    b_w = 2.0
    b_xp = tl.zeros([BLOCK_D], dtype=tl.float32)
    b_x = b_step * b_q
    if STORE_ALL:
        store_vector(p_xs, i_n, b_x, D, BLOCK_D)
    for i in range(iters):
        b_w = 4.0 / (
            4.0 - b_rho2 * b_w
        )  # solvers.omega_schedule, in device code (info.omegas: equal)
        b_g = matvec(b_H, b_x, MODE, BLOCK_D) - b_q
        b_xn = b_x - (b_w * b_step) * b_g + (b_w - 1.0) * (b_x - b_xp)
        b_xp = b_x
        b_x = b_xn
        if STORE_ALL:
            store_vector(p_xs + (i + 1) * stride_xs, i_n, b_x, D, BLOCK_D)
    return b_x, b_xp


@triton.jit
def chebyshev_kernel(
    p_H,
    p_q,
    p_step,
    p_rho2,
    p_x,
    p_xprev,
    p_xs,
    stride_xs,
    iters,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
    STORE_PREV: tl.constexpr,
    STORE_ALL: tl.constexpr,
):
    """One program per system: load H once, iterate, store xi_r (and xi_{r-1}, or all)."""
    i_n = tl.program_id(0).to(tl.int64)
    b_H = load_matrix(p_H, i_n, D, BLOCK_D, MODE)
    b_q = load_vector(p_q, i_n, D, BLOCK_D)
    b_x, b_xp = chebyshev_steps(
        b_H,
        b_q,
        tl.load(p_step + i_n),
        tl.load(p_rho2 + i_n),
        iters,
        p_xs,
        stride_xs,
        i_n,
        D,
        BLOCK_D,
        MODE,
        STORE_ALL,
    )
    store_vector(p_x, i_n, b_x, D, BLOCK_D)
    if STORE_PREV:
        store_vector(p_xprev, i_n, b_xp, D, BLOCK_D)


# Unit roundoff of a tf32 operand (10 stored mantissa bits, truncated by the hardware): the
# products' u with input_precision="tf32" (solvers.contracts).
U_TF32 = OPERAND_ROUNDOFF["tf32"]


def with_divergence(
    info,
    method: str,
    q2: torch.Tensor,
    Lt: torch.Tensor,
    mt: torch.Tensor,
    precision: str,
    out_dtype,
):
    """``info`` with status DIVERGED where the final residual exceeds what the eigenvalue bounds
    allow (``solvers.divergence``), for a kernel's arithmetic: float32 accumulation (tf32
    products where asked), the result stored in ``out_dtype``. Uses only tensors already on the
    device (the residuals ``info`` measured): no extra host synchronisation."""
    batch = info.system_status.shape
    u_acc = U_TF32 if precision == "tf32" else unit_roundoff(torch.float32)
    limit = divergence_limit(method, Lt, mt, q2.shape[-1], u_acc, unit_roundoff(out_dtype)).reshape(
        batch
    )
    q = q2.reshape(*batch, q2.shape[-1])
    info.system_status = flag_divergence(info.system_status, info.residual_norms[-1], q, limit)
    return info


def constants(L: torch.Tensor, mu: torch.Tensor):
    """``2/(L+mu)`` and ``rho^2`` from float64 L, mu, each rounded once to float32."""
    return launch.fp32(2.0 / (L + mu)), launch.fp32(((L - mu) / (L + mu)) ** 2)


def run(
    H2, q2, step, rho2, iters, *, mode, out_dtype, store_prev=False, store_all=False, warps=None
):
    """Launch on flattened ``(N, D, D)``, ``(N, D)`` inputs. Returns ``(x, xprev, xs)``: x
    ``(N, D)``; xi_{r-1} ``(N, D)`` in float32 when ``store_prev``, else None; the iterates
    ``(iters + 1, N, D)`` when ``store_all``, else None."""
    N, D = q2.shape
    dev = q2.device
    x = launch.empty_out((N, D), out_dtype, dev)
    xprev = launch.empty_out((N, D) if store_prev else (1,), torch.float32, dev)
    xs = launch.empty_out((iters + 1, N, D) if store_all else (1, 1, 1), out_dtype, dev)
    if N and D:
        for s, n in launch.launches(N):
            chebyshev_kernel[(n,)](
                H2[s:],
                q2[s:],
                step[s:],
                rho2[s:],
                x[s:],
                xprev[s:] if store_prev else xprev,
                xs[:, s:] if store_all else xs,
                N * D,
                iters,
                D=D,
                BLOCK_D=launch.block(D),
                MODE=mode,
                STORE_PREV=store_prev,
                STORE_ALL=store_all,
                num_warps=warps or launch.num_warps(D),
            )
    return x, (xprev if store_prev else None), (xs if store_all else None)


_DIFFERENTIABLE = (
    "kernels.chebyshev_solve is the same forward with a kernel backward (for H and q); "
    "solvers.chebyshev differentiates through the iteration"
)


def chebyshev(
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
    """r iterations of Chebyshev iteration (GKA Algorithm 1) on ``H xi = q``, batched.

    Accepts what ``solvers.chebyshev`` accepts and returns the same (xi_r in H's dtype, or
    ``(xi_r, SolveInfo)``), with these differences: H, q float32 or bfloat16 with D <= 128 on
    a CUDA device (CPU under TRITON_INTERPRET=1); iterates float32 throughout, so
    ``bf16_mode="strict"`` is refused. ``return_info`` costs a store of every iterate; its
    status is COMPLETED, NONFINITE or DIVERGED (as the reference, ``solvers.divergence``).

    Extra options: ``input_precision`` "ieee" (default, fp32-accurate products) or "tf32"
    (float32 inputs only: products on tensor cores with tf32 operands); ``out_dtype``
    (float32 keeps the result unrounded); ``tensor_cores`` for bfloat16: None (default),
    True or False choose between two products of the same accuracy (kernels._matvec).
    """
    iters = check.count("iters", iters)
    check.flag("return_info", return_info)
    launch.no_autograd("chebyshev", _DIFFERENTIABLE, H=H, q=q, L=L, mu=mu)
    launch.bf16_mode(bf16_mode)
    precision = launch.input_precision(input_precision)
    H2, q2, batch, Lt, mt = launch.bounded_systems(H, q, L, mu)
    mode = launch.matvec_mode(H2.dtype, precision, tensor_cores)
    odt = launch.out_dtype(out_dtype, H2.dtype)
    step, rho2 = constants(Lt, mt)
    D = q2.shape[-1]
    x, _, xs = run(H2, q2, step, rho2, iters, mode=mode, out_dtype=odt, store_all=return_info)
    launch.finite_result(x, H=H, q=q)
    if not return_info:
        return x.reshape(*batch, D)
    x = x.reshape(*batch, D)
    extras = {"omegas": omega_schedule(rho2, iters).reshape(*batch, iters + 1)}
    info = launch.info(
        H2, q2, batch, x, xs, launch.precision_label(H2.dtype, precision), extras=extras
    )
    return x, with_divergence(info, "chebyshev", q2, Lt, mt, precision, odt)
