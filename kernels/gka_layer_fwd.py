"""The GKA layer's forward as two Triton kernels: chunk states, then the chunk solve.

Per chunk of C tokens with the state at the chunk start ``S = H_{[t]}``, ``R = U_{[t]}``, the
chunk-local cumulative log decays ``G_c = g_1 + ... + g_c`` (appendix eq. (16); log space, no
0/0 once the products underflow), ``zeta_c = exp(G_c)`` and the masked decay
``Mt[c, j] = exp(G_c - G_j) beta_j`` for ``j <= c`` (the transpose of GKA's M, times the gate):

    H_c = zeta_c S + sum_{j <= c} Mt[c, j] k_j k_j^T                                (CH)
    ||H_c||_F^2 = zeta_c^2 ||S||_F^2 + 2 zeta_c sum_j Mt[c, j] k_j^T S k_j
                  + rowsum((Mt' W) . Mt')_c,  W = (K K^T) . (K K^T) . beta beta^T    (5)

(``Mt'`` without the beta). With the rows of X the chunk's iterates, every ``H_c x_c`` at once
is two tensor-core products and one elementwise mask:

    H X = diag(zeta) X S + (Mt . X K^T) K,         Y = diag(zeta) X R^T + (Mt . X K^T) V

1. :func:`states_kernel` -- one program per (sequence, block of state columns) walks the chunks
   in order: ``S <- zeta_C S + K^T diag(exp(G_C - G_j) beta_j) K`` (and R with V), storing the
   state at each chunk start (float32 for the float32 contracts, bf16 for bfloat16/operands).
2. :func:`solve_kernel` -- one program per (sequence, chunk), all chunks at once: eq. (5) for
   lambda_c = a ||H_c||_F, then GKA Algorithm 1 for the C systems together in the step-scaled
   form of :func:`chebyshev_rows`, then Y; and one int32 flag per chunk for the checks that need values: 1 a non-finite q or k, 2 a
   non-finite v, 4 ``||H_t||_F`` not > 0 at a token < T, 8 a non-finite x or y.

Without a gate (``HAS_G`` off) both kernels are compiled without decays (G = 0, zeta = 1).

Chebyshev constants: ``L = ||H_c||_F (1 + a)``, ``mu = a ||H_c||_F``, so ``rho = 1/(1 + 2a)``
is the same for every token (the weights omega_i are scalars) and ``2/(L + mu) =
(2/(1 + 2a)) / ||H_c||_F``; the two host constants are computed in float64 and rounded once.

Operand models (``kernels.kla.mm``): ``bf16`` rounds the fp32 iterate X, the masked products
``Mt . X K^T`` and the state to bf16 at each product (the fast path, as GKA's own kernel);
``ieee`` and ``tf32x3`` keep float32 accuracy. Iterates, residuals, accumulators and
eq. (5) are float32 in every model.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._matvec import INTERPRETED, stored
from .kla import BF16, mm, operand

SQ_ROWS: tl.constexpr = tl.constexpr(16)  # rows of the state per step of ||S||_F^2


@triton.jit
def mm_acc(a, b, acc, PREC: tl.constexpr):
    """``acc + a @ b``: on the GPU in the bf16 model one tensor-core product accumulating into
    acc (fewer registers and adds than a separate product and sum); otherwise ``kla.mm``."""
    if PREC == BF16 and not INTERPRETED:
        c = tl.dot(operand(a, PREC), operand(b, PREC), acc=acc)
    else:
        c = acc + mm(a, b, PREC)
    return c


@triton.jit
def states_kernel(
    p_k,
    p_v,
    p_G,
    p_b,
    p_H,
    p_U,
    NC,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_J: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_U: tl.constexpr,
    PREC: tl.constexpr,
):
    # Loads are issued in the step that uses them and the compiler's software pipeliner (the
    # launch's num_stages = 3) prefetches them as asynchronous copies: on the H200 at GKA's
    # size the walk takes 0.070 ms pipelined, 0.145 ms with num_stages = 1 and 0.120 ms with a
    # hand-written look-ahead; walking segments of chunks in parallel programs (the state at a
    # segment's start recomputed by each) was slower too (0.081-0.19 ms; docs/performance.md).
    i_n = tl.program_id(0).to(tl.int64)
    i_j = tl.program_id(1)
    o_c = tl.arange(0, C)
    o_d = tl.arange(0, BLOCK_D)
    o_v = tl.arange(0, BLOCK_V)
    o_j = i_j * BLOCK_J + tl.arange(0, BLOCK_J)
    m_d = o_d < D
    m_j = o_j < D
    m_v = o_v < DV
    Tp = NC * C
    b_H = tl.zeros([BLOCK_D, BLOCK_J], dtype=tl.float32)
    b_U = tl.zeros([BLOCK_V, BLOCK_J], dtype=tl.float32)
    for ic in range(NC):
        base = (i_n * NC + ic).to(tl.int64)
        p_Hc = p_H + base * D * D + o_d[:, None] * D + o_j[None, :]
        tl.store(p_Hc, stored(b_H, p_H.dtype.element_ty), mask=m_d[:, None] & m_j[None, :])
        if HAS_U:
            p_Uc = p_U + base * DV * D + o_v[:, None] * D + o_j[None, :]
            tl.store(p_Uc, stored(b_U, p_U.dtype.element_ty), mask=m_v[:, None] & m_j[None, :])
        row = i_n * Tp + ic * C + o_c
        b_K = tl.load(p_k + row[:, None] * D + o_d[None, :], mask=m_d[None, :], other=0.0)
        b_Kj = tl.load(p_k + row[:, None] * D + o_j[None, :], mask=m_j[None, :], other=0.0).to(
            tl.float32
        )
        if HAS_G:
            b_G = tl.load(p_G + row)
            b_Glast = tl.sum(tl.where(o_c == C - 1, b_G, 0.0), axis=0)
            b_coef = tl.exp(b_Glast - b_G)
            b_decay = tl.exp(b_Glast)
        else:  # no gate: no decay
            b_coef = tl.full([C], 1.0, tl.float32)
            b_decay = 1.0
        if HAS_B:
            b_coef = b_coef * tl.load(p_b + row).to(tl.float32)
        b_Kc = b_Kj * b_coef[:, None]
        b_H = mm_acc(tl.trans(b_K), b_Kc, b_decay * b_H, PREC)
        if HAS_U:
            b_V = tl.load(p_v + row[:, None] * DV + o_v[None, :], mask=m_v[None, :], other=0.0)
            b_U = mm_acc(tl.trans(b_V), b_Kc, b_decay * b_U, PREC)


@triton.jit
def nonfinite(b_x):
    """1 if some entry of ``b_x`` is NaN or infinite, else 0 (``x - x`` is 0 only for finite x)."""
    b_f = b_x.to(tl.float32)
    return tl.max(tl.max(tl.where(b_f - b_f == 0.0, 0, 1), axis=1), axis=0)


# GKA Algorithm 1 for the C systems of a chunk at once, in the step-scaled form: with
# s_c = 2/(L_c + mu_c) and s_c lambda_c = step_lam for every token,
#   x_c <- w (1 - step_lam) x_c - (w - 1) x_c,prev - w (s_c H_c x_c - s_c q_c)
# and the operand s_c x_c (one bf16 rounding) serves both products:
#   s_c H_c x_c = zeta_c S (s_c x_c) + sum_j Mt[c, j] k_j k_j . (s_c x_c)


@triton.jit
def chebyshev_rows(
    b_Q, b_K, b_S, b_Mt, b_s, b_zeta, iters, rho2, step_lam, HAS_G: tl.constexpr, PREC: tl.constexpr
):
    """The iterates of the chunk as the rows of a [C, D] tile: three mma products per step
    (``X S``, ``X K^T``, ``A K``) and four float32 operations per entry."""
    b_nQs = -(b_Q * b_s[:, None])
    b_X = -b_nQs
    b_Xp = tl.zeros_like(b_X)
    b_w = 2.0
    for _ in range(iters):
        b_w = 4.0 / (4.0 - rho2 * b_w)  # solvers.omega_schedule, in device code
        b_Xs = operand(b_X * b_s[:, None], PREC)
        if HAS_G:
            b_acc = mm(b_Xs, b_S, PREC) * b_zeta[:, None] + b_nQs
        else:
            b_acc = mm_acc(b_Xs, b_S, b_nQs, PREC)
        b_A = mm(b_Xs, tl.trans(b_K), PREC) * b_Mt  # [c, j] = Mt[c, j] (s_c x_c) . k_j
        b_Res = mm_acc(b_A, b_K, b_acc, PREC)
        b_Xn = (b_w * (1.0 - step_lam)) * b_X - (b_w - 1.0) * b_Xp - b_w * b_Res
        b_Xp = b_X
        b_X = b_Xn
    return b_X


@triton.jit
def solve_kernel(
    p_q,
    p_k,
    p_v,
    p_G,
    p_b,
    p_H,
    p_U,
    p_x,
    p_y,
    p_fro,
    p_flag,
    T,
    NC,
    iters,
    a,
    step_scale,
    rho2,
    step_lam,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_Y: tl.constexpr,
    STORE_X: tl.constexpr,
    PREC: tl.constexpr,
    SQRT: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1).to(tl.int64)
    o_c = tl.arange(0, C)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    t_c = i_c * C + o_c  # token index in the (padded) sequence
    real = t_c < T
    row = i_n * NC * C + t_c
    b_K = tl.load(p_k + row[:, None] * D + o_d[None, :], mask=m_d[None, :], other=0.0)  # [C, D]
    b_Kf = b_K.to(tl.float32)
    b_Q = tl.load(p_q + row[:, None] * D + o_d[None, :], mask=m_d[None, :], other=0.0).to(
        tl.float32
    )
    flag = nonfinite(b_K) | nonfinite(b_Q)
    base = i_n * NC + i_c
    p_S = p_H + base * D * D
    b_S = tl.load(
        p_S + o_d[:, None] * D + o_d[None, :], mask=m_d[:, None] & m_d[None, :], other=0.0
    )
    # ||S||_F^2 over row blocks (a loop, so that no float32 copy of the whole state is live)
    b_sq = tl.zeros([SQ_ROWS, BLOCK_D], dtype=tl.float32)
    for i0 in range(0, BLOCK_D, SQ_ROWS):
        o_r = i0 + tl.arange(0, SQ_ROWS)
        b_blk = tl.load(
            p_S + o_r[:, None] * D + o_d[None, :], mask=(o_r < D)[:, None] & m_d[None, :], other=0.0
        ).to(tl.float32)
        b_sq += b_blk * b_blk
    b_ss = tl.sum(tl.sum(b_sq, axis=1), axis=0)
    lower = o_c[:, None] >= o_c[None, :]  # [c, j]: j <= c
    # the decay mask M[c, j] = exp(G_c - G_j) (j <= c) and Mt = M with beta_j
    if HAS_G:
        b_G = tl.load(p_G + row)
        b_M = tl.where(lower, tl.exp(tl.where(lower, b_G[:, None] - b_G[None, :], 0.0)), 0.0)
        b_zeta = tl.exp(b_G)
    else:
        b_M = tl.where(lower, 1.0, 0.0)
        b_zeta = tl.full([C], 1.0, tl.float32)
    if HAS_B:
        b_beta = tl.load(p_b + row).to(tl.float32)
        b_Mt = b_M * b_beta[None, :]
    else:
        b_Mt = b_M
    # eq. (5): the three terms, each a sum of non-negative products (S is PSD); S enters as the
    # same operand as in the loop
    b_quad = tl.sum(b_Kf * mm(b_K, b_S, PREC), axis=1)  # rows (S k_j)^T, S symmetric
    if HAS_B:
        b_quad = b_quad * b_beta
    b_t1 = b_zeta * b_zeta * b_ss
    b_t2 = 2.0 * b_zeta * tl.sum(b_M * b_quad[None, :], axis=1)
    b_gram = mm(b_K, tl.trans(b_K), PREC)
    b_W = b_gram * b_gram
    if HAS_B:
        b_W = b_W * b_beta[:, None] * b_beta[None, :]
    b_t3 = tl.sum(tl.dot(b_M, b_W, input_precision="ieee") * b_M, axis=1)
    b_fro = b_t1 + b_t2 + b_t3
    if SQRT:
        b_fro = tl.sqrt(b_fro)
    tl.store(p_fro + row, b_fro)
    flag |= tl.max(tl.where(real & ~(b_fro > 0.0), 4, 0), axis=0)
    b_s = step_scale / b_fro
    b_X = chebyshev_rows(b_Q, b_K, b_S, b_Mt, b_s, b_zeta, iters, rho2, step_lam, HAS_G, PREC)
    b_Xo = stored(b_X, p_x.dtype.element_ty)
    # padding tokens are stored too (the backward reads them) but not checked
    flag |= 8 * nonfinite(tl.where(real[:, None] & m_d[None, :], b_Xo.to(tl.float32), 0.0))
    if STORE_X:
        tl.store(p_x + row[:, None] * D + o_d[None, :], b_Xo, mask=m_d[None, :])
    if HAS_Y:
        o_v = tl.arange(0, BLOCK_V)
        m_v = o_v < DV
        # Y = zeta . X R^T + (Mt . X K^T) V with x as stored (the reference multiplies the stored x)
        b_Xs = b_Xo.to(tl.float32)
        b_R = tl.load(
            p_U + base * DV * D + o_v[:, None] * D + o_d[None, :],
            mask=m_v[:, None] & m_d[None, :],
            other=0.0,
        )
        b_V = tl.load(p_v + row[:, None] * DV + o_v[None, :], mask=m_v[None, :], other=0.0)
        flag |= 2 * nonfinite(b_V)
        b_A = mm(b_Xs, tl.trans(b_K), PREC) * b_Mt
        b_Y = mm(b_Xs, tl.trans(b_R), PREC)
        if HAS_G:
            b_Y = b_Y * b_zeta[:, None]
        b_Y = mm_acc(b_A, b_V, b_Y, PREC)
        b_Yo = stored(b_Y, p_y.dtype.element_ty)
        flag |= 8 * nonfinite(tl.where(real[:, None] & m_v[None, :], b_Yo.to(tl.float32), 0.0))
        tl.store(p_y + row[:, None] * DV + o_v[None, :], b_Yo, mask=m_v[None, :])
    tl.store(p_flag + base, flag)
