"""Conjugate gradient with a fixed iteration count as a Triton kernel, one program per system.

Same recurrence and the same freezing rules as ``solvers.cg`` (whose docstring states them
and the bound): a system whose residual vanishes, meets the tolerance, or whose p^T H p
stops being positive is frozen (alpha = beta = 0) instead of dividing by zero; the kernel
records which rule froze it so that ``return_info`` reports the same Status values.

Contract: ``float32`` (``solvers.contracts``): float32 iterate, products and accumulation; bf16 inputs
widened exactly (a bf16 H multiplies through three exact bf16 pieces of the iterate, fp32-accurate);
``input_precision="tf32"``: ``tf32``; the result rounded once to ``out_dtype``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from solvers import validation as check
from solvers.solve_info import Status, power_of_two_scale

from . import _launch as launch
from ._matvec import load_matrix, load_vector, matvec, store_vector

# The reference's rounding floor uses u of its accumulation dtype, float32 here.
U_FP32 = 2.0**-24


@triton.jit
def cg_kernel(
    p_H,
    p_q,
    p_x0,
    p_x,
    p_flags,
    p_xs,
    stride_xs,
    iters,
    rtol,
    atol,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
    USE_TOL: tl.constexpr,
    STORE_ALL: tl.constexpr,
    U: tl.constexpr,
    HAS_X0: tl.constexpr,
):
    """flags: 1 = converged/frozen by a vanishing residual, 2 = breakdown (p^T H p <= 0)."""
    i_n = tl.program_id(0).to(tl.int64)
    b_H = load_matrix(p_H, i_n, D, BLOCK_D, MODE)
    b_q = load_vector(p_q, i_n, D, BLOCK_D)
    if HAS_X0:  # r_0 = q - H x0 (scipy's x0)
        b_x = load_vector(p_x0, i_n, D, BLOCK_D)
        b_r = b_q - matvec(b_H, b_x, MODE, BLOCK_D)
    else:
        b_x = tl.zeros([BLOCK_D], dtype=tl.float32)
        b_r = b_q
    b_p = b_r
    b_rr = tl.sum(b_r * b_r)
    b_qn = tl.sqrt(tl.sum(b_q * b_q))
    b_thr = tl.maximum(rtol * b_qn, atol)
    # At or below the rounding floor ||r|| <= u ||q|| further steps are noise (and
    # alpha = rr / pHp of two underflowing numbers): a fixed-count run freezes there.
    b_floor = (U * b_qn) * (U * b_qn)
    if USE_TOL:
        b_done = b_rr <= b_thr * b_thr
    else:
        b_done = b_rr <= b_floor
    b_broke = b_rr < 0.0
    if STORE_ALL:
        store_vector(p_xs, i_n, b_x, D, BLOCK_D)
    for i in range(iters):
        b_Hp = matvec(b_H, b_p, MODE, BLOCK_D)
        b_pHp = tl.sum(b_p * b_Hp)
        b_stalled = ~b_done & (b_pHp <= 0.0)
        b_done = b_done | (b_stalled & (b_rr <= b_floor))
        b_broke = b_broke | (b_stalled & (b_rr > b_floor))
        b_active = ~b_done & ~b_broke
        b_alpha = tl.where(b_active, b_rr / tl.where(b_active, b_pHp, 1.0), 0.0)
        b_x = b_x + b_alpha * b_p
        b_r = b_r - b_alpha * b_Hp
        b_rr_new = tl.sum(b_r * b_r)
        b_beta = tl.where(b_active, b_rr_new / tl.where(b_active, b_rr, 1.0), 0.0)
        b_p = tl.where(b_active, b_r + b_beta * b_p, b_p)
        b_rr = tl.where(b_active, b_rr_new, b_rr)
        if USE_TOL:
            b_done = b_done | (b_active & (b_rr <= b_thr * b_thr))
        else:
            b_done = b_done | (b_active & (b_rr <= b_floor))
        if STORE_ALL:
            store_vector(p_xs + (i + 1) * stride_xs, i_n, b_x, D, BLOCK_D)
    store_vector(p_x, i_n, b_x, D, BLOCK_D)
    tl.store(p_flags + i_n, tl.where(b_broke, 2, tl.where(b_done, 1, 0)).to(tl.int8))


def cg(
    H,
    q,
    *,
    iters: int,
    rtol=None,
    atol: float = 0.0,
    x0=None,
    callback=None,
    bf16_mode: str = "storage",
    return_info: bool = False,
    input_precision: str = "ieee",
    out_dtype=None,
    tensor_cores=None,
):
    """``iters`` steps of CG on ``H x = q`` (``solvers.cg``), optionally freezing a system once
    ``||r_i|| <= max(rtol ||q||, atol)`` (recursive residual).

    ``x0``: initial guess as in ``solvers.cg`` (H's dtype and device, broadcasting to the systems'
    shape; loaded into the float32 iterate). ``callback`` is not available: every iteration runs
    inside one launch; ``return_info=True`` gives the iterates (``info.iterates``) afterwards.

    Returns x (or ``(x, info)`` with the Status per system: COMPLETED, CONVERGED,
    MAX_ITERS_REACHED, BREAKDOWN, NONFINITE). Differences from the reference and the extra
    options: as ``kernels.chebyshev``; ``info.alphas`` and ``info.betas`` are None (the kernel keeps
    them in registers; ``solvers.cg`` records them). As the reference, the systems are solved for
    q scaled by a power of two near ``1 / max|q|`` (one for the batch; exact), so that ``||q||^2``
    neither overflows nor underflows in float32.
    """
    iters = check.count("iters", iters)
    rtol = check.tolerance("rtol", rtol, allow_none=True)
    atol = check.tolerance("atol", atol)
    check.flag("return_info", return_info)
    if callback is not None and not callable(callback):
        raise TypeError(
            f"callback must be callable (called as callback(xk)) or None, got {type(callback).__name__}"
        )
    if callback is not None:
        raise ValueError(
            "callback: kernels.cg runs every iteration inside one launch and cannot call back; use "
            "solvers.cg for a callback, or return_info=True for the iterates (info.iterates)"
        )
    launch.no_autograd("cg", "solvers.cg differentiates through the iteration", H=H, q=q, x0=x0)
    launch.bf16_mode(bf16_mode)
    precision = launch.input_precision(input_precision)
    H2, q2, batch = launch.systems(H, q)
    x02 = None if x0 is None else _initial_guess(x0, H, batch, q2.shape[-1])
    mode = launch.matvec_mode(H2.dtype, precision, tensor_cores)
    odt = launch.out_dtype(out_dtype, H2.dtype)
    use_tol = rtol is not None or atol > 0
    N, D = q2.shape
    x = launch.empty_out((N, D), odt, q2.device)
    flags = launch.empty_out((N,), torch.int8, q2.device)
    xs = launch.empty_out((iters + 1, N, D) if return_info else (1, 1, 1), odt, q2.device)
    if N and not D:  # no kernel runs: r = 0 from the start, converged as the reference's
        flags.fill_(1)
    # CG is homogeneous in (q, x): solve for q scaled by one power of two for the batch, exactly
    # (on the device: no host sync)
    scale = power_of_two_scale(q2, dim=None, inverse=True)
    q_in = q2 * scale
    x0_in = None if x02 is None else x02 * scale
    atol_in = float(atol * scale) if atol > 0 else 0.0  # the residual scales with q
    if N and D:
        for s, n in launch.launches(N):
            cg_kernel[(n,)](
                H2[s:],
                q_in[s:],
                q_in[s:] if x0_in is None else x0_in[s:],
                x[s:],
                flags[s:],
                xs[:, s:] if return_info else xs,
                N * D,
                iters,
                float(rtol or 0.0),
                atol_in,
                D=D,
                BLOCK_D=launch.block(D),
                MODE=mode,
                USE_TOL=use_tol,
                STORE_ALL=return_info,
                U=U_FP32,
                HAS_X0=x02 is not None,
                num_warps=launch.num_warps(D),
            )
    x = (x / scale).to(odt)
    if return_info:
        xs = (xs / scale).to(odt)
    launch.finite_result(x, H=H, q=q, **({} if x0 is None else {"x0": x0}))
    x = x.reshape(*batch, D)
    if not return_info:
        return x
    flags = flags.reshape(batch).to(torch.int64)
    status = torch.full(
        batch, int(Status.MAX_ITERS_REACHED if use_tol else Status.COMPLETED), device=x.device
    )
    status = torch.where(flags == 1, torch.full_like(status, Status.CONVERGED), status)
    status = torch.where(flags == 2, torch.full_like(status, Status.BREAKDOWN), status)
    return x, launch.info(
        H2, q2, batch, x, xs, launch.precision_label(H2.dtype, precision), status=status
    )


def _initial_guess(x0, H, batch, D: int) -> torch.Tensor:
    """x0 as a contiguous ``(N, D)`` tensor: H's dtype and device, a shape broadcasting to the
    systems' ``(*batch, D)`` (finiteness is checked on the result, as for H and q)."""
    x0 = launch.tensor("x0", x0, min_ndim=1)
    check.same_kind("x0", x0, "H", H)
    try:
        shape = torch.broadcast_shapes(x0.shape, (*batch, D))
    except RuntimeError:
        shape = None
    if shape != (*batch, D):
        raise ValueError(
            f"x0 has shape {tuple(x0.shape)}, which does not broadcast to the systems' shape "
            f"{(*batch, D)} (batch and D of H and q)"
        )
    return launch.flat(x0.expand(*batch, D), 1)
