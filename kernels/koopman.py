"""Spectral Koopman Attention readout (Echo eq. (13), Appendix F steps 4-10) fused in one Triton
kernel, one program per system.

Same result as ``solvers.koopman_readout`` (whose docstring states the pipeline). The program
keeps the r x r matrices of its system on chip (r <= 64), in one of two layouts chosen by
:func:`layout`: one tile padded to a power of two (``koopman_kernel``), or 2 x 2 blocks split
at B1 (``koopman_blocked_kernel``: r = 48 is 32 + 16, nothing padded; steps 1-2 by blocks,
:func:`block_cholesky_inverse`). It runs, in float32:

1. the Cholesky factor of ``G~`` (right-looking, Higham Alg. 10.2 reordered; a pivot that is not
   positive and finite marks the factorisation failed, and the system is refactored once as
   ``G~ + jitter I``, as ``solvers.cholesky``) and, in the same sweep over the columns,
2. ``L^{-1}`` by forward substitution on the columns of I (Higham Alg. 8.1);
3. ``A_w = L^{-1} M L^{-T}`` (eq. (22)), its power estimate of sigma_max (eq. (12), the
   reference's 6 steps from the unit all-ones vector) and ``A'_w = gamma A_w / max(1, sigma)``;
4. ``W = C_v L^{-T}`` and ``F = eta W A'^K_w`` (P x r);
5. for each block of queries: ``w = L^{-1} z^q / m`` and ``y = F w``.

Step 5 uses ``B_v L = C_v L^{-T} L^{-1} L = C_v L^{-T}``: ``y = eta B_v L A'^K L^{-1} z^q`` of the
reference (Prop. I.8) with the value map applied in whitened coordinates, one triangular
factor fewer. Products are ``tl.dot`` with ``input_precision`` "ieee" (default: float32
accuracy), "tf32x3" or "tf32"; inputs float32 or bfloat16 (widened exactly), the result rounded
once to ``out_dtype``. So a bfloat16 kernel is float32 arithmetic on the bf16 statistics:
compare it with the reference run in float32 on their float32 copies.

Contract: ``float32`` (``input_precision="ieee"``); "tf32x3" / "tf32" select ``tf32x3`` / ``tf32``.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch
import triton
import triton.language as tl

from solvers import validation as check
from solvers.cholesky import DEFAULT_JITTER, CholeskyError, CholeskyInfo, JitterWarning
from solvers.koopman import (
    GAMMA_RANGE,
    POWER_ITERS,
    KoopmanInfo,
    KoopmanStatistics,
    check_query_shape,
)
from solvers.solve_info import Status

from . import _launch as launch
from ._matvec import stored

MAX_R = 64
MAX_P = 128
PRECISIONS = ("ieee", "tf32x3", "tf32")
JITTERED: tl.constexpr = tl.constexpr(int(Status.JITTERED))
BREAKDOWN: tl.constexpr = tl.constexpr(int(Status.BREAKDOWN))


@triton.jit
def cholesky_inverse(Gt, r, jitter, R: tl.constexpr, WANT_L: tl.constexpr):
    """``L`` with ``L L^T = G + jitter I`` and ``X = L^{-1}`` (valid r x r block of the
    identity-padded [R, R] tile), in one sweep over the columns j:

    * Cholesky, right-looking: ``l_jj = sqrt(a_jj)``, ``l_ij = a_ij / l_jj`` (i > j), then
      ``A <- A - l l^T`` (Higham Alg. 10.2 with the inner products summed as they arrive);
    * forward substitution on the columns of I, column-oriented: row j of X is
      ``b_j / l_jj``, then ``b_i <- b_i - l_ij x_j`` for i > j (Higham Alg. 8.1 likewise).

    Four passes over the tile per column, for the r columns that exist (the identity padding
    beyond r needs no sweep: its L and X stay the identity). Returns (L or zeros, X, first
    failed column or -1); a failed pivot continues as 1 so that nothing non-finite spreads (as
    ``solvers.cholesky``)."""
    o = tl.arange(0, R)
    A = Gt + tl.where((o[:, None] == o[None, :]) & (o < r)[:, None], jitter, 0.0)
    X = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    L = tl.zeros([R, R], dtype=tl.float32)
    failed = tl.full([], -1, dtype=tl.int32)
    for j in range(r):
        col = tl.sum(tl.where(o[None, :] == j, A, 0.0), axis=1)
        d = tl.sum(tl.where(o == j, col, 0.0), axis=0)
        ok = (d > 0) & (d < float("inf"))  # NaN fails the first test
        failed = tl.where((failed < 0) & (ok == 0), j, failed)
        l_jj = tl.sqrt(tl.where(ok, d, 1.0))
        l = tl.where(o > j, col / l_jj, 0.0)
        A = A - l[:, None] * l[None, :]
        x_j = tl.sum(tl.where(o[:, None] == j, X, 0.0), axis=0) / l_jj
        X = tl.where(o[:, None] == j, x_j[None, :], X - l[:, None] * x_j[None, :])
        if WANT_L:
            L = tl.where(o[None, :] == j, (l + tl.where(o == j, l_jj, 0.0))[:, None], L)
    return L, X, failed


@triton.jit
def unit(x):
    """``x / ||x||``; a zero vector stays zero (its sigma estimate is then 0, not NaN)."""
    n = tl.sqrt(tl.sum(x * x, axis=0))
    return x / tl.where(n > 0, n, 1.0)


@triton.jit
def mm(a, b, PREC: tl.constexpr):
    if PREC == 1:
        c = tl.dot(a, b, input_precision="tf32x3")
    elif PREC == 2:
        c = tl.dot(a, b, input_precision="tf32")
    else:
        c = tl.dot(a, b, input_precision="ieee")
    return c


@triton.jit
def load_tile(p, i_n, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """System i_n's ``rows x cols`` matrix as a zero-padded float32 [BR, BC] tile."""
    return load_block(p + i_n * (rows * cols), cols, 0, 0, rows, cols, BR, BC)


@triton.jit
def store_tile(p, i_n, x, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    store_block(p + i_n * (rows * cols), x, cols, 0, 0, rows, cols, BR, BC)


@triton.jit
def load_block(p, ld, row0, col0, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """The ``rows x cols`` block at (row0, col0) of a row-major matrix with leading dimension
    ``ld``, as a zero-padded float32 [BR, BC] tile."""
    o_r = tl.arange(0, BR)
    o_c = tl.arange(0, BC)
    ptr = p + (row0 + o_r)[:, None] * ld + (col0 + o_c)[None, :]
    return tl.load(ptr, mask=(o_r < rows)[:, None] & (o_c < cols)[None, :], other=0.0).to(
        tl.float32
    )


@triton.jit
def store_block(p, x, ld, row0, col0, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    o_r = tl.arange(0, BR)
    o_c = tl.arange(0, BC)
    ptr = p + (row0 + o_r)[:, None] * ld + (col0 + o_c)[None, :]
    tl.store(ptr, stored(x, p.dtype.element_ty), mask=(o_r < rows)[:, None] & (o_c < cols)[None, :])


@triton.jit
def check_parameters(p_bad, p_scale, i_n, eta, gamma, gamma_lo, gamma_hi):
    """``p_bad[i_n]``: 1 when eta is not finite, gamma is outside [gamma_lo, gamma_hi] or the
    scale m is not finite and > 0, else 0. Returns ``1 / m``."""
    scale = tl.load(p_scale + i_n)
    ok = (
        (eta - eta == 0)
        & (gamma >= gamma_lo)
        & (gamma <= gamma_hi)
        & (scale > 0)
        & (scale < float("inf"))
    )
    tl.store(p_bad + i_n, tl.where(ok, 0.0, 1.0))
    return 1.0 / scale


@triton.jit
def koopman_kernel(
    p_G,
    p_M,
    p_Cv,
    p_zq,
    p_scale,
    p_eta,
    p_gamma,
    p_v0,
    p_y,
    p_status,
    p_finite,
    p_bad,
    p_failed,
    p_L,
    p_A,
    p_sigma,
    p_Bv,
    r,
    P,
    Q,
    K,
    power_iters,
    jitter,
    v0_stride,
    eta_stride,
    gamma_stride,
    gamma_lo,
    gamma_hi,
    start,
    R: tl.constexpr,
    BP: tl.constexpr,
    BQ: tl.constexpr,
    STORE_INFO: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per system: Appendix F steps 4-10 (module docstring). ``p_status`` gets the
    factorisation's Status; ``p_finite`` 0 when every output is finite, NaN otherwise (the sum
    of 0 x each, before a broken system's outputs are set to NaN); ``p_bad`` 1 when eta is not
    finite, gamma is outside [gamma_lo, gamma_hi] or the scale m is not finite and > 0, else 0.
    ``eta_stride`` / ``gamma_stride`` 0: one value for every system."""
    i_n = tl.program_id(0).to(tl.int64) + start
    o = tl.arange(0, R)
    m_r = o < r
    eye_pad = tl.where((o[:, None] == o[None, :]) & (o >= r)[:, None], 1.0, 0.0)
    Gt = load_tile(p_G, i_n, r, r, R, R) + eye_pad
    L, X, failed = cholesky_inverse(Gt, r, 0.0, R, STORE_INFO)
    status = tl.where(failed >= 0, JITTERED, 0)
    if failed >= 0:
        L, X, again = cholesky_inverse(Gt, r, jitter, R, STORE_INFO)
        status = tl.where(again >= 0, BREAKDOWN, status)
    usable = status != BREAKDOWN
    tl.store(p_status + i_n, status)

    # whitened operator, its power estimate of sigma_max and the spectral normalisation
    Mt = load_tile(p_M, i_n, r, r, R, R)
    Aw = mm(mm(X, Mt, PREC), tl.trans(X), PREC)
    v = tl.load(p_v0 + i_n * v0_stride + o, mask=m_r, other=0.0)
    for _ in range(power_iters):
        u = unit(tl.sum(Aw * v[None, :], axis=1))
        v = unit(tl.sum(Aw * u[:, None], axis=0))
    Av = tl.sum(Aw * v[None, :], axis=1)
    sigma = tl.sqrt(tl.sum(Av * Av, axis=0))
    gamma = tl.load(p_gamma + i_n * gamma_stride)
    A = Aw * (gamma / tl.maximum(sigma, 1.0))

    # F = eta C_v L^{-T} A'^K (P x r)
    W = mm(load_tile(p_Cv, i_n, P, r, BP, R), tl.trans(X), PREC)
    F = W
    for _ in range(K):
        F = mm(F, A, PREC)
    eta = tl.load(p_eta + i_n * eta_stride)
    F = F * eta

    if STORE_INFO:
        tl.store(p_failed + i_n, failed)
        tl.store(p_sigma + i_n, sigma)
        store_tile(p_L, i_n, L, r, r, R, R)
        store_tile(p_A, i_n, A, r, r, R, R)
        store_tile(p_Bv, i_n, mm(W, X, PREC), P, r, BP, R)

    # queries: y = F L^{-1} z^q / m, blocks of BQ
    inv_scale = check_parameters(p_bad, p_scale, i_n, eta, gamma, gamma_lo, gamma_hi)
    o_q = tl.arange(0, BQ)
    o_p = tl.arange(0, BP)
    finite = tl.zeros([BQ], dtype=tl.float32)
    for q0 in range(0, Q, BQ):
        m_q = (q0 + o_q) < Q
        Zq = tl.load(
            p_zq + i_n * Q * r + (q0 + o_q)[:, None] * r + o[None, :],
            mask=m_q[:, None] & m_r[None, :],
            other=0.0,
        ).to(tl.float32)
        Wq = mm(Zq * inv_scale, tl.trans(X), PREC)
        Y = mm(Wq, tl.trans(F), PREC)
        m_y = m_q[:, None] & (o_p < P)[None, :]
        finite += tl.sum(tl.where(m_y, Y * 0.0, 0.0), axis=1)
        Y = tl.where(usable, Y, float("nan"))
        ptr = p_y + i_n * Q * P + (q0 + o_q)[:, None] * P + o_p[None, :]
        tl.store(ptr, stored(Y, p_y.dtype.element_ty), mask=m_y)
    tl.store(p_finite + i_n, tl.sum(finite, axis=0))


@triton.jit
def mm2(a, b, c, d, PREC: tl.constexpr):
    """``a b + c d`` (the two halves of a product over a split inner dimension)."""
    return mm(a, b, PREC) + mm(c, d, PREC)


@triton.jit
def eye_beyond(n, B: tl.constexpr):
    """Ones on the diagonal of a [B, B] tile from row n on: the padding of a diagonal block."""
    o = tl.arange(0, B)
    return tl.where((o[:, None] == o[None, :]) & (o >= n)[:, None], 1.0, 0.0)


@triton.jit
def block_cholesky_inverse(
    G11,
    G21,
    G22,
    r1,
    r2,
    jitter,
    B1: tl.constexpr,
    B2: tl.constexpr,
    WANT_L: tl.constexpr,
    PREC: tl.constexpr,
):
    """``L`` and ``X = L^{-1}`` of ``G + jitter I`` in 2 x 2 blocks (rows and columns split at
    r1; Higham Section 10.1.2, the block form of Alg. 10.2):

    ``L11 = chol(G11)``, ``L21 = G21 L11^{-T}``, ``L22 = chol(G22 - L21 L21^T)``, and
    ``X11 = L11^{-1}``, ``X22 = L22^{-1}``, ``X21 = -X22 L21 X11``.

    The diagonal blocks run :func:`cholesky_inverse` on tiles of edge B1 and B2 instead of one
    tile of edge B1 + B2, so its per-column sweeps touch (B1^2 + B2^2) entries, not (B1 + B2)^2,
    and a size such as r = 48 = 32 + 16 pads nothing; the off-diagonal work is three tl.dot
    products (PREC; tf32 asks tf32x3 here, so that the Schur complement keeps float32-level
    accuracy). Returns (L11, L21, L22 or zeros, X11, X21, X22, first failed column or -1)."""
    L11, X11, f1 = cholesky_inverse(G11, r1, jitter, B1, WANT_L)
    L21 = mm(G21, tl.trans(X11), PREC)
    L22, X22, f2 = cholesky_inverse(G22 - mm(L21, tl.trans(L21), PREC), r2, jitter, B2, WANT_L)
    X21 = -mm(X22, mm(L21, X11, PREC), PREC)
    failed = tl.where(f1 >= 0, f1, tl.where(f2 >= 0, r1 + f2, -1))
    return L11, L21, L22, X11, X21, X22, failed


@triton.jit
def unit2(x1, x2):
    """``x / ||x||`` for x split in two parts; a zero vector stays zero (sigma is then 0, not NaN)."""
    n = tl.sqrt(tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0))
    n = tl.where(n > 0, n, 1.0)
    return x1 / n, x2 / n


@triton.jit
def koopman_blocked_kernel(
    p_G,
    p_M,
    p_Cv,
    p_zq,
    p_scale,
    p_eta,
    p_gamma,
    p_v0,
    p_y,
    p_status,
    p_finite,
    p_bad,
    p_failed,
    p_L,
    p_A,
    p_sigma,
    p_Bv,
    r,
    P,
    Q,
    K,
    power_iters,
    jitter,
    v0_stride,
    eta_stride,
    gamma_stride,
    gamma_lo,
    gamma_hi,
    start,
    B1: tl.constexpr,
    B2: tl.constexpr,
    BP: tl.constexpr,
    BQ: tl.constexpr,
    STORE_INFO: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per system: Appendix F steps 4-10 (module docstring), every r x r matrix held
    as 2 x 2 blocks split at ``r1 = min(r, B1)`` (the second block: r - r1 <= B2 rows; empty
    when r <= B1). ``p_status`` gets the factorisation's Status; ``p_finite`` 0 when every
    output is finite, NaN otherwise (the sum of 0 x each, before a broken system's outputs are
    set to NaN); ``p_bad`` 1 when eta is not finite, gamma is outside [gamma_lo, gamma_hi] or the
    scale m is not finite and > 0, else 0. ``eta_stride`` / ``gamma_stride`` 0: one value for
    every system."""
    i_n = tl.program_id(0).to(tl.int64) + start
    r1 = tl.minimum(r, B1)
    r2 = r - r1
    FPREC: tl.constexpr = 1 if PREC == 2 else PREC  # the factorisation's products: never bare tf32
    p_Gn = p_G + i_n * r * r
    G11 = load_block(p_Gn, r, 0, 0, r1, r1, B1, B1) + eye_beyond(r1, B1)
    G21 = load_block(p_Gn, r, r1, 0, r2, r1, B2, B1)
    G22 = load_block(p_Gn, r, r1, r1, r2, r2, B2, B2) + eye_beyond(r2, B2)
    L11, L21, L22, X11, X21, X22, failed = block_cholesky_inverse(
        G11, G21, G22, r1, r2, 0.0, B1, B2, STORE_INFO, FPREC
    )
    status = tl.where(failed >= 0, JITTERED, 0)
    if failed >= 0:
        L11, L21, L22, X11, X21, X22, again = block_cholesky_inverse(
            G11, G21, G22, r1, r2, jitter, B1, B2, STORE_INFO, FPREC
        )
        status = tl.where(again >= 0, BREAKDOWN, status)
    usable = status != BREAKDOWN
    tl.store(p_status + i_n, status)

    # whitened operator A_w = X M X^T, its power estimate of sigma_max, the spectral normalisation
    p_Mn = p_M + i_n * r * r
    M11 = load_block(p_Mn, r, 0, 0, r1, r1, B1, B1)
    M12 = load_block(p_Mn, r, 0, r1, r1, r2, B1, B2)
    M21 = load_block(p_Mn, r, r1, 0, r2, r1, B2, B1)
    M22 = load_block(p_Mn, r, r1, r1, r2, r2, B2, B2)
    T11 = mm(X11, M11, PREC)
    T12 = mm(X11, M12, PREC)
    T21 = mm2(X21, M11, X22, M21, PREC)
    T22 = mm2(X21, M12, X22, M22, PREC)
    X11t = tl.trans(X11)
    X21t = tl.trans(X21)
    X22t = tl.trans(X22)
    A11 = mm(T11, X11t, PREC)
    A12 = mm2(T11, X21t, T12, X22t, PREC)
    A21 = mm(T21, X11t, PREC)
    A22 = mm2(T21, X21t, T22, X22t, PREC)
    o1 = tl.arange(0, B1)
    o2 = tl.arange(0, B2)
    p_v = p_v0 + i_n * v0_stride
    v1 = tl.load(p_v + o1, mask=o1 < r1, other=0.0)
    v2 = tl.load(p_v + r1 + o2, mask=o2 < r2, other=0.0)
    for _ in range(power_iters):
        u1, u2 = unit2(
            tl.sum(A11 * v1[None, :], axis=1) + tl.sum(A12 * v2[None, :], axis=1),
            tl.sum(A21 * v1[None, :], axis=1) + tl.sum(A22 * v2[None, :], axis=1),
        )
        v1, v2 = unit2(
            tl.sum(A11 * u1[:, None], axis=0) + tl.sum(A21 * u2[:, None], axis=0),
            tl.sum(A12 * u1[:, None], axis=0) + tl.sum(A22 * u2[:, None], axis=0),
        )
    Av1 = tl.sum(A11 * v1[None, :], axis=1) + tl.sum(A12 * v2[None, :], axis=1)
    Av2 = tl.sum(A21 * v1[None, :], axis=1) + tl.sum(A22 * v2[None, :], axis=1)
    sigma = tl.sqrt(tl.sum(Av1 * Av1, axis=0) + tl.sum(Av2 * Av2, axis=0))
    gamma = tl.load(p_gamma + i_n * gamma_stride)
    c = gamma / tl.maximum(sigma, 1.0)
    A11 = A11 * c
    A12 = A12 * c
    A21 = A21 * c
    A22 = A22 * c

    # F = eta C_v L^{-T} A'^K (P x r), as the column blocks F1 (P x r1) and F2 (P x r2)
    p_Cn = p_Cv + i_n * P * r
    C1 = load_block(p_Cn, r, 0, 0, P, r1, BP, B1)
    C2 = load_block(p_Cn, r, 0, r1, P, r2, BP, B2)
    W1 = mm(C1, X11t, PREC)
    W2 = mm2(C1, X21t, C2, X22t, PREC)
    F1 = W1
    F2 = W2
    for _ in range(K):
        F1n = mm2(F1, A11, F2, A21, PREC)
        F2 = mm2(F1, A12, F2, A22, PREC)
        F1 = F1n
    eta = tl.load(p_eta + i_n * eta_stride)
    F1 = F1 * eta
    F2 = F2 * eta

    if STORE_INFO:
        tl.store(p_failed + i_n, failed)
        tl.store(p_sigma + i_n, sigma)
        p_Ln = p_L + i_n * r * r
        store_block(p_Ln, L11, r, 0, 0, r1, r1, B1, B1)
        store_block(p_Ln, tl.zeros([B1, B2], dtype=tl.float32), r, 0, r1, r1, r2, B1, B2)
        store_block(p_Ln, L21, r, r1, 0, r2, r1, B2, B1)
        store_block(p_Ln, L22, r, r1, r1, r2, r2, B2, B2)
        p_An = p_A + i_n * r * r
        store_block(p_An, A11, r, 0, 0, r1, r1, B1, B1)
        store_block(p_An, A12, r, 0, r1, r1, r2, B1, B2)
        store_block(p_An, A21, r, r1, 0, r2, r1, B2, B1)
        store_block(p_An, A22, r, r1, r1, r2, r2, B2, B2)
        p_Bn = p_Bv + i_n * P * r  # B_v = W X = C_v G~^{-1}
        store_block(p_Bn, mm2(W1, X11, W2, X21, PREC), r, 0, 0, P, r1, BP, B1)
        store_block(p_Bn, mm(W2, X22, PREC), r, 0, r1, P, r2, BP, B2)

    # queries: y = F L^{-1} z^q / m, blocks of BQ
    inv_scale = check_parameters(p_bad, p_scale, i_n, eta, gamma, gamma_lo, gamma_hi)
    o_q = tl.arange(0, BQ)
    o_p = tl.arange(0, BP)
    F1t = tl.trans(F1)
    F2t = tl.trans(F2)
    p_zn = p_zq + i_n * Q * r
    p_yn = p_y + i_n * Q * P
    finite = tl.zeros([BQ], dtype=tl.float32)
    for q0 in range(0, Q, BQ):
        Z1 = load_block(p_zn, r, q0, 0, Q - q0, r1, BQ, B1) * inv_scale
        Z2 = load_block(p_zn, r, q0, r1, Q - q0, r2, BQ, B2) * inv_scale
        Y = mm2(mm(Z1, X11t, PREC), F1t, mm2(Z1, X21t, Z2, X22t, PREC), F2t, PREC)
        m_y = ((q0 + o_q) < Q)[:, None] & (o_p < P)[None, :]
        finite += tl.sum(tl.where(m_y, Y * 0.0, 0.0), axis=1)
        Y = tl.where(usable, Y, float("nan"))
        store_block(p_yn, Y, P, q0, 0, Q - q0, P, BQ, BP)
    tl.store(p_finite + i_n, tl.sum(finite, axis=0))


def layout(r: int, precision: str):
    """``None`` for one tile of edge ``block(r)``, else the diagonal-block edges (B1, B2) of the
    blocked kernel. Chosen from timings on an H200 (docs/performance.md, "Fused Koopman
    readout"): blocks win where they remove padding or most of the factorisation's sweeps
    (r = 48: 32 + 16 instead of a padded 64; both products and sweeps shrink), one tile wins
    where the blocks would be many small products (tf32x3 at r = 64: 32 + 32 blocks took 8.5
    ms, one 64 tile 5.2 ms; "ieee" at r = 24: 2.0 against 1.95 ms). r <= 16 is one tile."""
    if r <= 16 or (precision == "ieee" and r <= 32) or (precision != "ieee" and r > 48):
        return None
    B1 = 32 if r > 32 else 16
    return B1, launch.block(r - B1)


def _prune(configs, named_args, **kwargs):
    """Warps worth timing (scripts/compile_sm90.py): r <= 32 compiles without spills at 4 warps
    (and 2: fewer threads per reduction over the small tile); r = 64 spills with CUDA-core
    products below 8 warps and not with tf32x3 at 4."""
    if kwargs["R"] <= 32:
        keep = (2, 4)
    elif kwargs["PREC"] == 0:
        keep = (8, 16)
    else:
        keep = (4, 8)
    return [c for c in configs if c.num_warps in keep]


# Autotuned on a GPU over the warps per system (the interpreter cannot time).
koopman_tuned = triton.autotune(
    configs=[triton.Config({}, num_warps=w, num_stages=1) for w in (2, 4, 8, 16)],
    key=["R", "BP", "BQ", "STORE_INFO", "PREC"],
    prune_configs_by={"early_config_prune": _prune},
)(koopman_kernel)

# The blocked kernel at 2 or 4 warps (the fastest on an H200 at r = 24 and 48; 8 were slower
# everywhere, and with tf32x3 at r = 48 -- [16, 32] blocks -- gave a result at tf32 accuracy,
# 1.5e-3, on Triton 3.6, so they are never tried).
koopman_blocked_tuned = triton.autotune(
    configs=[triton.Config({}, num_warps=w, num_stages=1) for w in (2, 4)],
    key=["B1", "B2", "BP", "BQ", "STORE_INFO", "PREC"],
)(koopman_blocked_kernel)


# ----------------------------------------------------------------------------- host side


def _stats(stats) -> KoopmanStatistics:
    if not isinstance(stats, KoopmanStatistics):
        raise TypeError(
            f"stats must be KoopmanStatistics (from solvers.koopman_statistics), got {type(stats).__name__}"
        )
    for name in ("G", "M", "Cv"):
        launch.tensor(f"stats.{name}", getattr(stats, name), min_ndim=2)
    check.same_kind("stats.M", stats.M, "stats.G", stats.G)
    check.same_kind("stats.Cv", stats.Cv, "stats.G", stats.G)
    r = stats.G.shape[-1]
    if stats.G.shape[-2] != r or stats.M.shape[-2:] != (r, r) or stats.Cv.shape[-1] != r:
        raise ValueError(
            f"stats must hold G, M (*batch, r, r) and Cv (*batch, P, r), got {tuple(stats.G.shape)}, "
            f"{tuple(stats.M.shape)}, {tuple(stats.Cv.shape)}"
        )
    for name in ("M", "Cv"):  # the kernel reads one per system of G: broadcast as the reference
        x = getattr(stats, name)
        try:
            ok = torch.broadcast_shapes(x.shape[:-2], stats.G.shape[:-2]) == stats.G.shape[:-2]
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"stats.{name} has batch shape {tuple(x.shape[:-2])}, which does not broadcast to "
                f"stats.G's {tuple(stats.G.shape[:-2])}"
            )
    if r > MAX_R:
        raise ValueError(
            f"the kernel keeps r x r matrices on chip and supports r <= {MAX_R}, got r = {r}"
        )
    if stats.Cv.shape[-2] > MAX_P:
        raise ValueError(
            f"the kernel supports value dimensions P <= {MAX_P}, got P = {stats.Cv.shape[-2]}"
        )
    return stats


def _zero_start(name: str) -> None:
    """The reference's error for a power iteration started at 0 (it would stay 0: sigma = 0)."""
    raise ValueError(
        f"{name} must be nonzero in every system: power iteration from {name} = 0 stays at 0"
    )


def _queries(stats: KoopmanStatistics, zq) -> torch.Tensor:
    zq = launch.tensor("zq", zq, min_ndim=2)  # finiteness: checked in the kernel's flag
    check_query_shape(stats, zq)
    return zq


def _per_system(name: str, v, batch, device, low=None, high=None):
    """A per-system parameter for the kernel: ``(float32 tensor, stride)``. A Python number is
    checked here (finite, in [low, high]) and placed by a fill -- one element, stride 0, no
    host-to-device copy; a tensor is broadcast to the batch and checked in the kernel (its
    ``p_bad`` flag; :func:`_explain_parameters` names the argument)."""
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        if not math.isfinite(float(v)):
            raise ValueError(f"{name} has 1 non-finite entries (NaN or Inf)")
        if low is not None and not (low <= float(v) <= high):
            raise ValueError(
                f"{name} must lie in [{low}, {high}] (Echo eq. (12)), got {float(v)}..{float(v)}"
            )
        return torch.full((1,), float(v), dtype=torch.float32, device=device), 0
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name} must be a float or a tensor, got {type(v).__name__}")
    if not (v.is_floating_point() or v.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"{name} must be a real tensor, got {v.dtype}")
    if v.device != torch.device(device) and v.numel() != 1:
        raise ValueError(f"{name} is on {v.device} but the data is on {device}")
    try:
        t = torch.broadcast_to(v.detach().to(device=device, dtype=torch.float64), batch)
    except RuntimeError:
        raise ValueError(
            f"{name} has shape {tuple(v.shape)}, which does not broadcast to the batch {tuple(batch)}"
        ) from None
    return launch.fp32(t.reshape(-1)), 1


def _explain_parameters(eta, gamma, scale, batch, device) -> None:
    """The reference's errors for eta, gamma and stats.scale (read on the host)."""
    launch.per_system("eta", eta, batch, device)
    g = launch.per_system("gamma", gamma, batch, device)
    lo, hi = GAMMA_RANGE
    if g.numel() and not bool(((g >= lo) & (g <= hi)).all()):
        raise ValueError(
            f"gamma must lie in [{lo}, {hi}] (Echo eq. (12)), got {g.min().item()}..{g.max().item()}"
        )
    m = launch.per_system("scale", scale, batch, device)
    if m.numel() and not bool((m > 0).all()):
        raise ValueError(f"stats.scale must be > 0, got min {float(m.min())}")


def _jitter(jitter) -> float:
    if isinstance(jitter, bool) or not isinstance(jitter, numbers.Real):
        raise TypeError(f"jitter must be a float, got {type(jitter).__name__}")
    if not (jitter >= 0 and math.isfinite(jitter)):
        raise ValueError(f"jitter must be a finite float >= 0, got {jitter}")
    return float(jitter)


def koopman_readout(
    stats,
    zq,
    *,
    K: int = 2,
    eta=1.5,
    gamma=1.0,
    sigma: str = "power",
    power_iters: int = POWER_ITERS,
    v0=None,
    jitter: float = DEFAULT_JITTER,
    return_info: bool = False,
    input_precision: str = "ieee",
    out_dtype=None,
    check_inputs=True,
):
    """SKA retrieval ``y = eta B_v L A'^K_w L^{-1} z^q`` (Echo eq. (13), Appendix F steps 4-10), fused.

    Accepts what ``solvers.koopman_readout`` accepts and returns the same -- ``y (*batch, Q, P)``,
    or ``(y, KoopmanInfo)`` -- with the same failure policy (a jittered factorisation warns
    unless ``return_info``; one that fails even then raises ``CholeskyError`` or, with
    ``return_info``, has status BREAKDOWN and NaN outputs). Differences: statistics float32 or
    bfloat16 with r <= 64 and P <= 128 on a CUDA device (CPU under TRITON_INTERPRET=1); all
    arithmetic float32 (module docstring); ``sigma="power"`` only (the exact sigma_max is an SVD:
    use the reference); ``v0`` of shape (r,) or (*batch, r). Extra options: ``input_precision``
    ("ieee", "tf32x3", "tf32") for the products, ``out_dtype`` (default: the statistics' dtype),
    ``check_inputs``: ``True`` (default) reads the kernel's status at the end of the call (one
    synchronisation) to apply the failure policy and name a bad input; a
    ``kernels.DeferredChecks`` records the same for its ``verify()``; ``False`` reads nothing
    (broken systems still come back as NaN, and ``return_info`` still carries each system's
    status). With either of the last two the call never synchronises or copies between host
    and device, and can be captured in a CUDA graph (docs/kernels.md).
    """
    stats = _stats(stats)
    zq = _queries(stats, zq)
    launch.no_autograd(
        "koopman_readout",
        "solvers.koopman_readout differentiates it",
        **{"stats.G": stats.G, "stats.M": stats.M, "stats.Cv": stats.Cv},
        zq=zq,
        eta=eta,
        gamma=gamma,
    )
    K = check.count("K", K)
    power_iters = check.count("power_iters", power_iters)
    if sigma != "power":
        raise ValueError(
            f"kernels.koopman_readout supports sigma='power' only (eq. (12)), got {sigma!r}; "
            "solvers.koopman_readout(..., sigma='exact') takes the exact sigma_max by SVD"
        )
    launch.choice("input_precision", input_precision, PRECISIONS)
    if not isinstance(return_info, bool):
        raise TypeError(f"return_info must be a bool, got {type(return_info).__name__}")
    jitter = _jitter(jitter)
    launch.bf16_mode(stats.bf16_mode)
    G = stats.G
    batch, r, P, Q = stats.batch, G.shape[-1], stats.Cv.shape[-2], zq.shape[-2]
    dev = G.device
    checks = launch.checks_for(check_inputs, dev)
    odt = launch.out_dtype(out_dtype, G.dtype)
    eta_t, eta_stride = _per_system("eta", eta, batch, dev)
    gamma_t, gamma_stride = _per_system("gamma", gamma, batch, dev, *GAMMA_RANGE)
    scale, _ = _per_system("stats.scale", stats.scale, batch, dev)
    if scale.numel() == 1 and math.prod(batch) != 1:
        scale = scale.expand(math.prod(batch)).contiguous()
    if v0 is None:  # the reference's start, the unit all-ones vector rounded once
        v0 = torch.full((1, r), 1.0 / math.sqrt(r) if r else 0.0, dtype=torch.float32, device=dev)
    else:
        v0 = launch.tensor("v0", v0, min_ndim=1)
        if checks is not None:  # device flags, as the kernel's other value checks (no host sync)
            given = v0
            checks.add(~torch.isfinite(given).all(), lambda: check.finite("v0", given))
            checks.add((given == 0).all(-1).any(), lambda: _zero_start("v0"))
        if v0.shape[-1] != r:
            raise ValueError(f"v0 must have shape (..., {r}), got {tuple(v0.shape)}")
        try:
            v0 = launch.flat(v0.expand(*batch, r), 1).to(torch.float32)
        except RuntimeError:
            raise ValueError(
                f"v0 has shape {tuple(v0.shape)}, which does not broadcast to {(*batch, r)}"
            ) from None
    N = math.prod(batch)
    G2, M2, C2, z2 = (
        launch.flat(G, 2),
        launch.flat(stats.M.expand(*batch, r, r), 2),
        launch.flat(stats.Cv.expand(*batch, P, r), 2),
        launch.flat(zq, 2),
    )
    y = launch.empty_out((N, Q, P), odt, dev)
    status = launch.empty_out((N,), torch.int32, dev)
    finite = launch.empty_out((N,), torch.float32, dev)
    bad = launch.empty_out((N,), torch.float32, dev)
    info = {}
    if return_info:
        info = {
            "failed": launch.empty_out((N,), torch.int32, dev),
            "L": launch.empty_out((N, r, r), G.dtype, dev),
            "A": launch.empty_out((N, r, r), G.dtype, dev),
            "sigma": launch.empty_out((N,), torch.float32, dev),
            "Bv": launch.empty_out((N, P, r), G.dtype, dev),
        }
    if N and r:
        split = layout(r, input_precision)
        prec = PRECISIONS.index(input_precision)
        args = (
            G2,
            M2,
            C2,
            z2,
            scale,
            eta_t,
            gamma_t,
            v0,
            y,
            status,
            finite,
            bad,
            *(info[k] if return_info else status for k in ("failed", "L", "A", "sigma", "Bv")),
            r,
            P,
            Q,
            K,
            power_iters,
            jitter,
            r if v0.shape[0] > 1 else 0,
            eta_stride,
            gamma_stride,
            *GAMMA_RANGE,
        )
        R = launch.block(r)
        meta = dict(
            BP=launch.block(max(P, 1)),
            BQ=min(64 if R < 64 else 32, launch.block(max(Q, 1))),
            STORE_INFO=return_info,
            PREC=prec,
        )
        if split is None:
            kernel, tuned, meta = koopman_kernel, koopman_tuned, dict(meta, R=R)
        else:
            kernel, tuned, meta = (
                koopman_blocked_kernel,
                koopman_blocked_tuned,
                dict(meta, B1=split[0], B2=split[1]),
            )
        for s, n in launch.launches(N):
            if launch.interpreting():
                kernel[(n,)](*args, s, **meta, num_warps=4)
            else:
                tuned[(n,)](*args, s, **meta)
    elif N:  # r = 0: no statistics, y = 0 as the reference's
        y.zero_()
        status.zero_()
        finite.zero_()
        bad.zero_()
        if return_info:
            info["failed"].fill_(-1)
            info["sigma"].zero_()
    return _finish(
        stats,
        zq,
        y.reshape(*batch, Q, P),
        status.reshape(batch),
        finite.reshape(batch),
        bad,
        info,
        jitter,
        return_info,
        input_precision,
        checks,
        check_inputs,
        (eta, gamma),
    )


def _finish(
    stats,
    zq,
    y,
    status,
    finite,
    bad,
    info,
    jitter,
    return_info,
    input_precision,
    checks,
    check_inputs,
    params,
):
    """The reference's failure policy, through the call's checks (``check_inputs``): read at
    the end of the call in one synchronisation, later (DeferredChecks), or not at all."""
    batch = stats.batch
    usable = status != int(Status.BREAKDOWN)
    nonfinite = usable & ~torch.isfinite(finite)
    if checks is not None and status.numel():

        def parameters():
            _explain_parameters(*params, stats.scale, batch, y.device)

        def inputs():  # never a silent NaN from a NaN input
            for name in ("G", "M", "Cv"):
                check.finite(f"stats.{name}", getattr(stats, name))
            check.finite("zq", zq)

        checks.add(bad.ne(0).any(), parameters)
        checks.add(nonfinite.any() | (~usable).any(), inputs)
        if not return_info:

            def breakdown():
                raise CholeskyError(
                    f"G~ is not positive definite in float32 even after jitter {jitter:g} I "
                    f"in {int((~usable).sum())} system(s); pass return_info=True to get a status instead"
                )

            def jittered():
                warnings.warn(
                    f"Cholesky of G~ needed jitter {jitter:g} I in "
                    f"{int((status == int(Status.JITTERED)).sum())} system(s)",
                    JitterWarning,
                    stacklevel=6 if check_inputs is True else 3,
                )  # the caller of koopman_readout / verify

            checks.add((~usable).any(), breakdown)
            checks.add((status == int(Status.JITTERED)).any(), jittered)
    launch.finish_checks(check_inputs, checks)
    label = f"{str(stats.G.dtype).replace('torch.', '')}-statistics/float32-arithmetic"
    if not return_info:
        return y
    r, P = stats.G.shape[-1], stats.Cv.shape[-2]
    L = info["L"].reshape(*batch, r, r)
    used = torch.where(status == int(Status.JITTERED), jitter, 0.0).to(torch.float64)
    diag_L = torch.diagonal(L, dim1=-2, dim2=-1).to(torch.float64) ** 2
    diag_G = torch.diagonal(stats.G, dim1=-2, dim2=-1).to(torch.float64) + used.unsqueeze(-1)
    ratio = (
        (diag_L / diag_G).amin(-1) if r else torch.ones(batch, dtype=torch.float64, device=y.device)
    )
    ratio = torch.where(usable, ratio, torch.full_like(ratio, float("nan")))
    factor = CholeskyInfo(
        system_status=status.clone().long(),
        failed_column=info["failed"].reshape(batch).long(),
        pivot_ratio=ratio,
        jitter=jitter,
        precision=label,
    )
    system_status = torch.where(
        nonfinite, torch.full_like(status, int(Status.NONFINITE)), status
    ).long()
    return y, KoopmanInfo(
        system_status,
        label + ("" if input_precision == "ieee" else f"/{input_precision}-products"),
        factor,
        L,
        info["Bv"].reshape(*batch, P, r),
        info["A"].reshape(*batch, r, r),
        info["sigma"].reshape(batch),
    )
