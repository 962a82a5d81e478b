"""KLA / GDN chunkwise forward (KLA Algorithm 1, right; Props. 3-4; App. B.5) as Triton kernels.

Same recurrence and results as ``solvers.kla_chunkwise`` (whose docstring states it). Per chunk
of C tokens with incoming state S_0, cumulative log decay g (``g_i = sum_{r<=i} log alpha_r``),
``gamma_i = exp(g_i)`` and Kaczmarz coefficient ``beta_i = eta_i / (||k_i||^2 + eps)`` (eq. (3)):

    L   = B (A^- . K K^T)                  strictly lower, A^-_ij = exp(g_i - g_j)  (Prop. 3)
    X'  = (I + L)^{-1} B                   the chunk's solve, independent of the state
    P   = A . Q K^T                        lower, diagonal included                  (Prop. 4)
    U   = X' (V - D_gamma K S_0)           = U of Prop. 3
    O   = (D_gamma Q S_0 + P U) / ||q||    row-wise                                   (eq. (8))
    S_C = gamma_C S_0 + K^T Diag(gamma_C / gamma_j) U                                 (eq. (9))

Per-channel decay (App. B.5) replaces every decay product by its elementwise form.

Two kernels (kernels/kla.py, docs/kernels.md "KLA"):

1. ``prepare_kernel``, one program per (chunk, head), all chunks at once: beta from the keys
   (the Kaczmarz normalisation happens here, in float32), the decayed Gram blocks of L, the
   unit-lower inverse ``(I + L)^{-1}`` by forward substitution on the 16 x 16 diagonal blocks and
   block forward substitution for the rest (fp32, ``input_precision="ieee"``), and P; X' and P
   are stored per chunk.
2. ``recurrence_kernel``, one program per (head, block of d_v columns), walks the chunks in
   order with the state block in float32 registers: the products above, outputs, state update.

Precision model (``input_precision``): every product with a d_k, d_v or chunk-length inner
dimension is a ``tl.dot`` accumulated in float32, whose *operands* are

* ``"ieee"`` (float32 default): used as they are (float32 or exact bf16 inputs) -- float32
  accuracy throughout;
* ``"tf32x3"`` / ``"tf32"``: float32 operands split into three tf32 products / rounded to tf32;
* ``"bf16"`` (bfloat16 default, as flash-linear-attention): rounded to bfloat16 at the GEMM
  boundary: the state S_0, the right-hand side V - D_gamma K S_0, U, X', P and the decayed U of
  the state update (the bf16 inputs q, k, v are exact).

Everything else -- beta, the decays, L, the inverse, the state, all accumulations -- is float32.
``analysis.kla_kernel_bounds.kla_kernel_bound`` bounds the result's rounding error in each
model, step by step as written here.

Contract: float32 inputs: ``float32`` (``input_precision="ieee"``); bfloat16 inputs: ``bfloat16/operands``
(chunk GEMM operands rounded to bf16, state and accumulation float32, as flash-linear-attention);
``input_precision`` "tf32x3" / "tf32" / "bf16" selects ``tf32x3`` / ``tf32`` / ``bfloat16/operands``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from solvers import _validate as check
from solvers.kla import broadcast_gate, check_qkv, nonnegative

from . import _launch as launch
from ._matvec import INTERPRETED, stored

# Operand precisions of the chunk GEMMs (docs/kernels.md, "KLA"); kept in sync with
# analysis.kla_kernel_bounds.OPERAND_ROUNDING.
IEEE: tl.constexpr = tl.constexpr(0)
TF32X3: tl.constexpr = tl.constexpr(1)
TF32: tl.constexpr = tl.constexpr(2)
BF16: tl.constexpr = tl.constexpr(3)
PRECISIONS = {"ieee": 0, "tf32x3": 1, "tf32": 2, "bf16": 3}
CHUNK_SIZES = (16, 32, 64)
COEFFICIENTS = ("kaczmarz", "gdn")
SUB: tl.constexpr = tl.constexpr(16)  # edge of the diagonal blocks inverted by substitution


@triton.jit
def operand(x, PREC: tl.constexpr):
    """``x`` as a GEMM operand: bf16 (round to nearest even) in the BF16 model, else as is."""
    if PREC == BF16:
        if x.dtype != tl.bfloat16:
            x = stored(x, tl.bfloat16)
    return x


@triton.jit
def mm(a, b, PREC: tl.constexpr):
    """``a @ b`` accumulated in float32 with operands in the model PREC (module docstring).

    Triton's CPU interpreter multiplies bf16 operands as raw bit patterns (kernels._matvec), so
    under it bf16 operands are widened to float32 first: the same, exact, products."""
    if PREC == BF16:
        a = operand(a, PREC)
        b = operand(b, PREC)
        if INTERPRETED:
            c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            c = tl.dot(a, b, out_dtype=tl.float32)
    elif PREC == TF32:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    elif PREC == TF32X3:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32x3")
    else:
        if (a.dtype == tl.bfloat16 and b.dtype == tl.bfloat16) and not INTERPRETED:
            c = tl.dot(a, b, out_dtype=tl.float32)  # bf16 x bf16 products are exact in fp32
        else:
            c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return c


@triton.jit
def mm_ieee(a, b):
    """A float32 product at float32 accuracy (the small products of the triangular inverse)."""
    return tl.dot(a, b, input_precision="ieee")


# ----------------------------------------------------------------------------- prepare


@triton.jit
def rows(p, base, t0, T, stride, c0, D: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr):
    """Rows t0 .. t0 + BC - 1, columns c0 .. c0 + BD - 1 of a (T, stride)-strided tensor at
    ``base`` (int64): a [BC, BD] tile, zero beyond T and D. Offsets within the tile are int32
    (BC * stride < 2^31)."""
    o_r = tl.arange(0, BC)
    o_d = c0 + tl.arange(0, BD)
    ptr = p + (base + t0 * stride) + (o_r[:, None] * stride + o_d[None, :])
    m_t = (t0 + o_r) < T
    if D % BD == 0:  # no column mask: lets the compiler use wide loads
        x = tl.load(ptr, mask=m_t[:, None], other=0.0)
    else:
        x = tl.load(ptr, mask=m_t[:, None] & (o_d < D)[None, :], other=0.0)
    return x


@triton.jit
def decay_mask(G, gi, gj, m_i, m_j, STRICT: tl.constexpr):
    """``exp(g_i - g_j) G_ij`` where j < i (STRICT) or every valid (i, j), else 0; the masked
    differences (positive, may overflow) are never exponentiated."""
    o = tl.arange(0, G.shape[0])
    if STRICT:
        m = (o[:, None] > o[None, :]) & m_i[:, None] & m_j[None, :]
    else:
        m = m_i[:, None] & m_j[None, :]
    return tl.where(m, tl.exp(tl.where(m, gi[:, None] - gj[None, :], 0.0)) * G, 0.0)


@triton.jit
def channel_gram(p_x, p_y, p_g, base_k, base_g, t_i, t_j, m_i, m_j, H, DK: tl.constexpr, LOWER: tl.constexpr,
                 STRICT: tl.constexpr):
    """Per-channel decay (App. B.5): ``sum_c x_ic y_jc exp(g_ic - g_jc)``, channel by channel in
    float32, masked to j < i (STRICT), j <= i (LOWER) or every valid pair."""
    o_i = tl.arange(0, t_i.shape[0])
    o_j = tl.arange(0, t_j.shape[0])
    m = m_i[:, None] & m_j[None, :]
    if STRICT:
        m = m & (o_i[:, None] > o_j[None, :])
    if LOWER:
        m = m & (o_i[:, None] >= o_j[None, :])
    M = tl.zeros([t_i.shape[0], t_j.shape[0]], dtype=tl.float32)
    for c in range(DK):
        x = tl.load(p_x + base_k + t_i * (H * DK) + c, mask=m_i, other=0.0).to(tl.float32)
        y = tl.load(p_y + base_k + t_j * (H * DK) + c, mask=m_j, other=0.0).to(tl.float32)
        gi = tl.load(p_g + base_g + t_i * (H * DK) + c)
        gj = tl.load(p_g + base_g + t_j * (H * DK) + c)
        M += tl.where(m, x[:, None] * y[None, :] * tl.exp(tl.where(m, gi[:, None] - gj[None, :], 0.0)), 0.0)
    return M


@triton.jit
def substitution_step(N, Y, i, o):
    """Row i of ``Y = (I + N)^{-1} - I`` from the rows above it (forward substitution on the
    columns of I, Higham Alg. 8.1): ``Y_i = -N_i - sum_{j<i} N_ij Y_j``."""
    a = tl.sum(tl.where((o == i)[:, None], -N, 0.0), axis=0)
    a = tl.where(o < i, a, 0.0)
    a = a + tl.sum(a[:, None] * Y, axis=0)
    return tl.where((o == i)[:, None], a[None, :], Y)


@triton.jit
def invert_diagonal_blocks(N0, N1, N2, N3, NB: tl.constexpr):
    """``(I + N_b)^{-1}`` of the NB strictly lower 16 x 16 diagonal blocks by forward
    substitution, float32, in one loop so that the independent substitutions overlap."""
    o = tl.arange(0, SUB)
    Y0 = -N0  # rows 0 and 1 of X - I are already -N
    Y1 = -N1
    Y2 = -N2
    Y3 = -N3
    for i in range(2, SUB):
        Y0 = substitution_step(N0, Y0, i, o)
        if NB > 1:
            Y1 = substitution_step(N1, Y1, i, o)
        if NB > 2:
            Y2 = substitution_step(N2, Y2, i, o)
            Y3 = substitution_step(N3, Y3, i, o)
    eye = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    return Y0 + eye, Y1 + eye, Y2 + eye, Y3 + eye


@triton.jit
def store_block(p_A, base_a, i: tl.constexpr, j: tl.constexpr, X, C: tl.constexpr):
    """Block (i, j) of the chunk's C x C matrix at base_a."""
    o = tl.arange(0, SUB)
    ptr = p_A + base_a + (o + i * SUB)[:, None] * C + (o + j * SUB)[None, :]
    tl.store(ptr, stored(X, p_A.dtype.element_ty))


@triton.jit
def sub_block(p, base, t0, b: tl.constexpr, T, stride, c0, D: tl.constexpr, BD: tl.constexpr):
    return rows(p, base, t0 + b * SUB, T, stride, c0, D, BD, SUB)


@triton.jit
def sq_norms(K):
    Kf = K.to(tl.float32)
    return tl.sum(Kf * Kf, axis=1)


@triton.jit
def prepare_kernel(
    p_q, p_k, p_g, p_eta, p_A, p_P, T, Tp, H, NT, eps, start,
    DK: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
    KACZMARZ: tl.constexpr, PER_CHANNEL: tl.constexpr, PREC: tl.constexpr,
):
    """One program per (chunk, head): X' = (I + L)^{-1} B and P of the chunk (module docstring).

    Keys and queries are read in slices of BKS columns, accumulating ||k||^2, the Gram blocks
    K_b K_c^T of the 16-token sub-blocks b >= c and Q K^T, so only one slice is on chip at a time."""
    pid = tl.program_id(0).to(tl.int64) + start
    i_nh = pid // NT
    i_t = pid % NT
    i_n = i_nh // H
    i_h = i_nh % H
    t0 = i_t * C
    base_k = (i_n * T * H + i_h) * DK
    base_e = i_n * T * H + i_h
    if PER_CHANNEL:
        base_g = (i_n * Tp * H + i_h) * DK
    else:
        base_g = i_n * Tp * H + i_h
    base_a = (i_nh * NT + i_t) * C * C
    HD = H * DK
    o_s = tl.arange(0, SUB).to(tl.int64)
    o_c = tl.arange(0, C)
    t = t0 + o_c.to(tl.int64)
    m_t = t < T
    t_0 = t0 + o_s
    t_1 = t_0 + SUB
    t_2 = t_1 + SUB
    t_3 = t_2 + SUB

    # squared key norms, Gram blocks (per head) and Q K^T, d_k in slices of BKS
    z16 = tl.zeros([SUB, SUB], dtype=tl.float32)
    n0 = tl.zeros([SUB], dtype=tl.float32)
    n1 = tl.zeros([SUB], dtype=tl.float32)
    n2 = tl.zeros([SUB], dtype=tl.float32)
    n3 = tl.zeros([SUB], dtype=tl.float32)
    G00 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G10 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G11 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G20 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G21 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G22 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G30 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G31 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G32 = tl.zeros([SUB, SUB], dtype=tl.float32)
    G33 = tl.zeros([SUB, SUB], dtype=tl.float32)
    P = tl.zeros([C, C], dtype=tl.float32)
    for c0 in range(0, DK, BKS):
        K0 = sub_block(p_k, base_k, t0, 0, T, HD, c0, DK, BKS)
        n0 += sq_norms(K0)
        if NB > 1:
            K1 = sub_block(p_k, base_k, t0, 1, T, HD, c0, DK, BKS)
            n1 += sq_norms(K1)
        if NB > 2:
            K2 = sub_block(p_k, base_k, t0, 2, T, HD, c0, DK, BKS)
            K3 = sub_block(p_k, base_k, t0, 3, T, HD, c0, DK, BKS)
            n2 += sq_norms(K2)
            n3 += sq_norms(K3)
        if not PER_CHANNEL:
            P += mm(rows(p_q, base_k, t0, T, HD, c0, DK, BKS, C), tl.trans(rows(p_k, base_k, t0, T, HD, c0, DK, BKS, C)), PREC)
            G00 += mm(K0, tl.trans(K0), PREC)
            if NB > 1:
                G10 += mm(K1, tl.trans(K0), PREC)
                G11 += mm(K1, tl.trans(K1), PREC)
            if NB > 2:
                G20 += mm(K2, tl.trans(K0), PREC)
                G21 += mm(K2, tl.trans(K1), PREC)
                G22 += mm(K2, tl.trans(K2), PREC)
                G30 += mm(K3, tl.trans(K0), PREC)
                G31 += mm(K3, tl.trans(K1), PREC)
                G32 += mm(K3, tl.trans(K2), PREC)
                G33 += mm(K3, tl.trans(K3), PREC)

    # P = A . Q K^T over the whole chunk (diagonal included)
    if PER_CHANNEL:
        P = channel_gram(p_q, p_k, p_g, base_k, base_g, t, t, m_t, m_t, H, DK, True, False)
    else:
        g = tl.load(p_g + base_g + t * H)
        P = decay_mask(P, g, g, m_t, m_t, False)
        P = tl.where((o_c[:, None] >= o_c[None, :]), P, 0.0)
    tl.store(p_P + base_a + o_c[:, None] * C + o_c[None, :], stored(P, p_P.dtype.element_ty))

    # beta (Kaczmarz eq. (3)): a zero key with eps = 0 gets no write
    m0 = t_0 < T
    m1 = t_1 < T
    m2 = t_2 < T
    m3 = t_3 < T
    if KACZMARZ:
        d0 = n0 + eps
        d1 = n1 + eps
        d2 = n2 + eps
        d3 = n3 + eps
        b0 = tl.where(d0 > 0, tl.load(p_eta + base_e + t_0 * H, mask=m0, other=0.0) / tl.where(d0 > 0, d0, 1.0), 0.0)
        b1 = tl.where(d1 > 0, tl.load(p_eta + base_e + t_1 * H, mask=m1, other=0.0) / tl.where(d1 > 0, d1, 1.0), 0.0)
        b2 = tl.where(d2 > 0, tl.load(p_eta + base_e + t_2 * H, mask=m2, other=0.0) / tl.where(d2 > 0, d2, 1.0), 0.0)
        b3 = tl.where(d3 > 0, tl.load(p_eta + base_e + t_3 * H, mask=m3, other=0.0) / tl.where(d3 > 0, d3, 1.0), 0.0)
    else:
        b0 = tl.load(p_eta + base_e + t_0 * H, mask=m0, other=0.0)
        b1 = tl.load(p_eta + base_e + t_1 * H, mask=m1, other=0.0)
        b2 = tl.load(p_eta + base_e + t_2 * H, mask=m2, other=0.0)
        b3 = tl.load(p_eta + base_e + t_3 * H, mask=m3, other=0.0)

    # L = B (A^- . K K^T), block (b, c) for b >= c
    if PER_CHANNEL:
        L00 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_0, t_0, m0, m0, H, DK, False, True)
        if NB > 1:
            L10 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_1, t_0, m1, m0, H, DK, False, False)
            L11 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_1, t_1, m1, m1, H, DK, False, True)
        if NB > 2:
            L20 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_2, t_0, m2, m0, H, DK, False, False)
            L21 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_2, t_1, m2, m1, H, DK, False, False)
            L22 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_2, t_2, m2, m2, H, DK, False, True)
            L30 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_3, t_0, m3, m0, H, DK, False, False)
            L31 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_3, t_1, m3, m1, H, DK, False, False)
            L32 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_3, t_2, m3, m2, H, DK, False, False)
            L33 = channel_gram(p_k, p_k, p_g, base_k, base_g, t_3, t_3, m3, m3, H, DK, False, True)
    else:
        g0 = tl.load(p_g + base_g + t_0 * H)  # padded rows hold g of the last token (log 1 = 0 added)
        L00 = decay_mask(G00, g0, g0, m0, m0, True)
        if NB > 1:
            g1 = tl.load(p_g + base_g + t_1 * H)
            L10 = decay_mask(G10, g1, g0, m1, m0, False)
            L11 = decay_mask(G11, g1, g1, m1, m1, True)
        if NB > 2:
            g2 = tl.load(p_g + base_g + t_2 * H)
            g3 = tl.load(p_g + base_g + t_3 * H)
            L20 = decay_mask(G20, g2, g0, m2, m0, False)
            L21 = decay_mask(G21, g2, g1, m2, m1, False)
            L22 = decay_mask(G22, g2, g2, m2, m2, True)
            L30 = decay_mask(G30, g3, g0, m3, m0, False)
            L31 = decay_mask(G31, g3, g1, m3, m1, False)
            L32 = decay_mask(G32, g3, g2, m3, m2, False)
            L33 = decay_mask(G33, g3, g3, m3, m3, True)

    # (I + L)^{-1}: substitution on the diagonal blocks, then block forward substitution on the
    # columns of I, X_bc = -X_bb sum_{c<=m<b} L_bm X_mc; stored as X' = X diag(beta)
    N1 = z16
    N2 = z16
    N3 = z16
    if NB > 1:
        N1 = b1[:, None] * L11
    if NB > 2:
        N2 = b2[:, None] * L22
        N3 = b3[:, None] * L33
    X00, X11, X22, X33 = invert_diagonal_blocks(b0[:, None] * L00, N1, N2, N3, NB)
    store_block(p_A, base_a, 0, 0, X00 * b0[None, :], C)
    if NB > 1:
        X10 = -mm_ieee(X11, mm_ieee(b1[:, None] * L10, X00))
        store_block(p_A, base_a, 0, 1, z16, C)
        store_block(p_A, base_a, 1, 0, X10 * b0[None, :], C)
        store_block(p_A, base_a, 1, 1, X11 * b1[None, :], C)
    if NB > 2:
        L20 = b2[:, None] * L20
        L21 = b2[:, None] * L21
        L30 = b3[:, None] * L30
        L31 = b3[:, None] * L31
        L32 = b3[:, None] * L32
        X21 = -mm_ieee(X22, mm_ieee(L21, X11))
        X20 = -mm_ieee(X22, mm_ieee(L20, X00) + mm_ieee(L21, X10))
        X32 = -mm_ieee(X33, mm_ieee(L32, X22))
        X31 = -mm_ieee(X33, mm_ieee(L31, X11) + mm_ieee(L32, X21))
        X30 = -mm_ieee(X33, mm_ieee(L30, X00) + mm_ieee(L31, X10) + mm_ieee(L32, X20))
        store_block(p_A, base_a, 2, 0, X20 * b0[None, :], C)
        store_block(p_A, base_a, 2, 1, X21 * b1[None, :], C)
        store_block(p_A, base_a, 2, 2, X22 * b2[None, :], C)
        store_block(p_A, base_a, 3, 0, X30 * b0[None, :], C)
        store_block(p_A, base_a, 3, 1, X31 * b1[None, :], C)
        store_block(p_A, base_a, 3, 2, X32 * b2[None, :], C)
        store_block(p_A, base_a, 3, 3, X33 * b3[None, :], C)
        store_block(p_A, base_a, 0, 2, z16, C)
        store_block(p_A, base_a, 0, 3, z16, C)
        store_block(p_A, base_a, 1, 2, z16, C)
        store_block(p_A, base_a, 1, 3, z16, C)
        store_block(p_A, base_a, 2, 3, z16, C)


# ----------------------------------------------------------------------------- recurrence


@triton.jit
def recurrence_kernel(
    p_q, p_k, p_v, p_g, p_A, p_P, p_h0, p_o, p_ht, p_flag, T, Tp, H, NT, nh_start,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    PER_CHANNEL: tl.constexpr, HAS_H0: tl.constexpr, NORMALIZE: tl.constexpr, STORE_FINAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (head, d_v block): the chunks in order, state block in float32.

    ``p_flag[8 i_nh + i_v]`` gets 0 when every output and the final state are finite and NaN
    otherwise (the sum of 0 x each value), so the host checks one small tensor, not o."""
    NV: tl.constexpr = (DV + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV + nh_start
    i_n = i_nh // H
    i_h = i_nh % H
    o_k = tl.arange(0, BK)
    m_k = o_k < DK
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < DV
    o_c = tl.arange(0, C)
    base_k = (i_n * T * H + i_h) * DK
    base_v = (i_n * T * H + i_h) * DV
    if PER_CHANNEL:
        base_g = (i_n * Tp * H + i_h) * DK
    else:
        base_g = i_n * Tp * H + i_h
    p_state = i_nh * DK * DV + o_k[:, None] * DV + o_v[None, :]
    m_state = m_k[:, None] & m_v[None, :]
    if HAS_H0:
        S = tl.load(p_h0 + p_state, mask=m_state, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    t0 = tl.zeros([], dtype=tl.int64)  # first token of the chunk (int64: T H d may exceed 2^31)
    finite = tl.zeros([C], dtype=tl.float32)
    for i_t in range(NT):
        t = t0 + o_c
        m_t = t < T
        K = rows(p_k, base_k, t0, T, H * DK, 0, DK, BK, C)
        Q = rows(p_q, base_k, t0, T, H * DK, 0, DK, BK, C)
        V = tl.load(p_v + (base_v + t0 * (H * DV)) + (o_c[:, None] * (H * DV) + o_v[None, :]),
                    mask=m_t[:, None] & m_v[None, :], other=0.0)
        base_a = (i_nh * NT + i_t) * C * C
        A = tl.load(p_A + base_a + o_c[:, None] * C + o_c[None, :])
        P = tl.load(p_P + base_a + o_c[:, None] * C + o_c[None, :])
        t_last = t0 + C - 1  # padded rows of g hold the last token's value
        S_op = operand(S, PREC)
        if PER_CHANNEL:
            g = tl.load(p_g + (base_g + t0 * (H * DK)) + (o_c[:, None] * (H * DK) + o_k[None, :]), mask=m_k[None, :], other=0.0)
            g_last = tl.load(p_g + base_g + t_last * (H * DK) + o_k, mask=m_k, other=0.0)
            Gam = tl.exp(g)
            KS = mm(K.to(tl.float32) * Gam, S_op, PREC)  # D_gamma K S_0, elementwise decay
            QS = mm(Q.to(tl.float32) * Gam, S_op, PREC)
        else:
            g = tl.load(p_g + base_g + t * H)
            g_last = tl.load(p_g + base_g + t_last * H)
            gam = tl.exp(g)
            KS = mm(K, S_op, PREC) * gam[:, None]
            QS = mm(Q, S_op, PREC) * gam[:, None]
        R = V.to(tl.float32) - KS
        U = mm(A, R, PREC)
        O = QS + mm(P, U, PREC)
        if NORMALIZE:
            Qf = Q.to(tl.float32)
            qn = tl.sqrt(tl.sum(Qf * Qf, axis=1))
            O = O / tl.where(m_t, qn, 1.0)[:, None]
        p_out = p_o + (base_v + t0 * (H * DV)) + (o_c[:, None] * (H * DV) + o_v[None, :])
        tl.store(p_out, stored(O, p_o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
        finite += tl.sum(tl.where(m_t[:, None] & m_v[None, :], O * 0.0, 0.0), axis=1)
        if PER_CHANNEL:
            Rr = tl.where(m_t[:, None], tl.exp(g_last[None, :] - g), 0.0)
            S = tl.exp(g_last)[:, None] * S + mm(tl.trans(K.to(tl.float32) * Rr), U, PREC)
        else:
            r = tl.where(m_t, tl.exp(g_last - g), 0.0)
            S = tl.exp(g_last) * S + mm(tl.trans(K), U * r[:, None], PREC)
        t0 += C
    if STORE_FINAL:
        tl.store(p_ht + p_state, stored(S, p_ht.dtype.element_ty), mask=m_state)
    flag = tl.sum(finite, axis=0) + tl.sum(tl.sum(tl.where(m_state, S * 0.0, 0.0), axis=1), axis=0)
    tl.store(p_flag + i_nh * 8 + i_v, flag)


def _recurrence_configs():
    # (BV, warps, stages) that compile for sm_90 without register spills in the bf16 model
    # at d_k = d_v = 128 (scripts/compile_sm90.py; docs/kernels.md, "KLA").
    return [triton.Config({"BV": bv}, num_warps=w, num_stages=s)
            for bv, w, s in ((16, 4, 2), (32, 4, 2), (32, 8, 2), (64, 8, 2))]


def _prune(configs, named_args, **kwargs):
    """Configurations worth a compilation: all four for per-head decay in the bf16 model (the
    fast path); the float32 products spill at D = 128 whatever the tile
    (scripts/compile_sm90.py), so "tf32x3" / "tf32" try the two smallest tiles and "ieee" and
    per-channel decay (CUDA-core elementwise decays) take the smallest."""
    small = [c for c in configs if c.kwargs["BV"] <= 32 and c.num_warps == 4]
    if kwargs["PER_CHANNEL"] or kwargs["PREC"] == PRECISIONS["ieee"]:
        return small[:1]
    return configs if kwargs["PREC"] == PRECISIONS["bf16"] else small


# Autotuned on a GPU (the interpreter cannot time); keyed on everything that shapes the work.
recurrence_tuned = triton.autotune(
    configs=_recurrence_configs(),
    key=["DK", "DV", "C", "PER_CHANNEL", "PREC", "NORMALIZE"],
    prune_configs_by={"early_config_prune": _prune},
)(recurrence_kernel)


# ----------------------------------------------------------------------------- host side


def chunk_log_decay(alpha: torch.Tensor, C: int, per_channel: bool) -> torch.Tensor:
    """``g_i = sum_{r<=i} log alpha_r`` within each chunk of C tokens, float32, with T padded to
    a multiple of C by tokens of decay 1 (so padded rows repeat the chunk's last g).

    alpha ``(N, T, H)`` or ``(N, T, H, d_k)``; returns ``(N, Tp, H[, d_k])``, contiguous."""
    N, T = alpha.shape[:2]
    NT = -(-T // C)
    la = torch.log(alpha.to(torch.float32))
    pad = [0, 0] * (la.ndim - 2) + [0, NT * C - T]
    la = torch.nn.functional.pad(la, pad)
    return la.reshape(N, NT, C, *la.shape[2:]).cumsum(2).reshape(N, NT * C, *la.shape[2:]).contiguous()


def _gates_invalid(alpha: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
    """A device flag: some gate is not finite, or ``0 < alpha <= 1``, ``eta >= 0`` fails after
    rounding (read with the result's finiteness, in one synchronisation)."""
    if not alpha.numel():
        return torch.zeros((), dtype=torch.bool, device=alpha.device)
    return ~(((alpha > 0) & (alpha <= 1)).all() & (eta >= 0).all() & torch.isfinite(eta).all())


def _check_gates(alpha: torch.Tensor, eta: torch.Tensor) -> None:
    """The reference's errors for the gates (solvers.kla_chunkwise)."""
    for name, x, low, low_open, high in (("alpha", alpha, 0.0, True, 1.0), ("eta", eta, 0.0, False, None)):
        check.finite(name, x)
        bad = bool(((x <= low) if low_open else (x < low)).any()) or (high is not None and bool((x > high).any()))
        if bad:
            interval = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}{']' if high is not None else ')'}"
            raise ValueError(f"{name} must lie in {interval} (after rounding to {x.dtype}); "
                             f"got values in [{float(x.min())}, {float(x.max())}]")


def _zero_keys(k: torch.Tensor, v: torch.Tensor) -> None:
    """eps = 0 (KLA): a zero key needs a zero value, and no nonzero key may underflow (as
    ``solvers.kla_chunkwise``); one pass over k, only when eps = 0."""
    norms = k.float().pow(2).sum(-1)
    vanishing = norms == 0
    if not bool(vanishing.any()):
        return
    where = lambda m: tuple(int(i) for i in m.nonzero()[0])  # noqa: E731
    underflow = vanishing & (k != 0).any(-1)
    if bool(underflow.any()):
        raise ValueError(f"k has a nonzero key whose squared norm underflows to 0 in torch.float32 at (batch..., "
                         f"token, head) {where(underflow)}: rescale k or pass eps > 0")
    inconsistent = vanishing & (v != 0).any(-1)
    if bool(inconsistent.any()):
        raise ValueError(f"k has a zero key with a nonzero value at (batch..., token, head) {where(inconsistent)} and "
                         "eps = 0: the constraint S^T k_t = v_t reads 0 = v_t, which no state satisfies (KLA eq. (1)); "
                         "pass eps > 0 or zero v_t")


def _explain_nonfinite(q, k, v, initial_state, normalize_queries):
    """Never a silent NaN: the result is not finite; name the input the reference would have
    rejected."""
    for name, x in (("q", q), ("k", k), ("v", v)) + ((("initial_state", initial_state),) if initial_state is not None else ()):
        check.finite(name, x)
    if normalize_queries:
        zero = q.float().pow(2).sum(-1) == 0
        if bool(zero.any()):
            idx = tuple(int(i) for i in zero.nonzero()[0])
            raise ValueError(f"q has a query of norm 0 in torch.float32 at (batch..., token, head) {idx}: "
                             "o_t = S_t^T q_t / ||q_t|| is undefined; pass normalize_queries=False")
    if not bool(torch.isfinite(k.float().pow(2).sum(-1)).all()):
        raise ValueError("||k_t||^2 overflows in torch.float32: rescale k")


def _precision(p, dtype: torch.dtype) -> str:
    if p is None:
        return "bf16" if dtype == torch.bfloat16 else "ieee"
    if p not in PRECISIONS:
        raise ValueError(f"input_precision must be one of {tuple(PRECISIONS)} or None, got {p!r}")
    return p


def kla_chunkwise(
    q, k, v, *, alpha, eta, eps: float = 1e-6, chunk_size: int = 64, initial_state=None,
    coefficient: str = "kaczmarz", normalize_queries: bool = True, bf16_mode: str = "storage",
    return_final_state: bool = True, input_precision=None, out_dtype=None,
):
    """KLA / GDN chunk by chunk (KLA Algorithm 1 right, Props. 3-4, App. B.5) on a GPU.

    Accepts what ``solvers.kla_chunkwise`` accepts and returns the same -- ``o (..., T, H, d_v)``
    and, unless ``return_final_state=False``, ``S_T (..., H, d_k, d_v)`` -- with these
    differences: q, k, v float32 or bfloat16 with d_k, d_v <= 128, on a CUDA device (CPU under
    TRITON_INTERPRET=1); ``chunk_size`` 16, 32 or 64; ``bf16_mode="strict"`` is refused (the
    state and all accumulations are float32). The Kaczmarz coefficient
    ``beta_t = eta_t / (||k_t||^2 + eps)`` is computed in the kernel from the keys.

    Extra options: ``input_precision`` -- the operands of the chunk GEMMs: ``"ieee"``
    (float32 default), ``"tf32x3"``, ``"tf32"`` or ``"bf16"`` (bfloat16 default; the model of
    flash-linear-attention), see the module docstring; ``out_dtype`` (default: the input
    dtype) for o and S_T.
    """
    C = check.count("chunk_size", chunk_size, minimum=1)
    if C not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES} for the kernel, got {C}")
    if coefficient not in COEFFICIENTS:
        raise ValueError(f"coefficient must be one of {COEFFICIENTS}, got {coefficient!r}")
    if not isinstance(normalize_queries, bool):
        raise TypeError(f"normalize_queries must be a bool, got {type(normalize_queries).__name__}")
    if not isinstance(return_final_state, bool):
        raise TypeError(f"return_final_state must be a bool, got {type(return_final_state).__name__}")
    launch.bf16_mode(bf16_mode)
    eps = nonnegative("eps", eps)
    q = launch.tensor("q", q, min_ndim=3)
    k = launch.tensor("k", k, min_ndim=3)
    v = launch.tensor("v", v, min_ndim=3)
    check_qkv(q, k, v)
    *lead, T, H, DK = k.shape
    DV = v.shape[-1]
    for name, d in (("k", DK), ("v", DV)):
        if d == 0:
            raise ValueError(f"{name} must have a feature dimension >= 1, got 0")
        launch.dimension(name, d)
    prec = _precision(input_precision, q.dtype)
    odt = launch.out_dtype(out_dtype, q.dtype)
    alpha_t, per_channel = broadcast_gate("alpha", alpha, k.shape[:-1], k.shape, k, check_finite=False)
    eta_t, _ = broadcast_gate("eta", eta, k.shape[:-1], None, k, check_finite=False)
    gates_invalid = _gates_invalid(alpha_t, eta_t)
    if initial_state is not None:
        S0 = launch.tensor("initial_state", initial_state, min_ndim=3)
        check.same_kind("initial_state", S0, "q", q)
        if S0.shape[-3:] != (H, DK, DV):
            raise ValueError(f"initial_state must be (..., H, d_k, d_v) = (..., {H}, {DK}, {DV}), got {tuple(S0.shape)}")
        try:
            S0 = S0.expand(*lead, H, DK, DV)
        except RuntimeError:
            raise ValueError(f"initial_state has batch shape {tuple(S0.shape[:-3])}, which does not broadcast to q's {tuple(lead)}") from None
    else:
        S0 = None
    kaczmarz = coefficient == "kaczmarz"
    if kaczmarz and eps == 0.0:
        _zero_keys(k, v)

    N = math.prod(lead)
    q2, k2, v2 = (launch.flat(x, 3) for x in (q, k, v))
    o = launch.empty_out((N, T, H, DV), odt, q.device)
    ht = launch.empty_out((N, H, DK, DV), odt, q.device) if return_final_state else None
    flags = torch.zeros(N * H * 8, dtype=torch.float32, device=q.device)  # 0: finite (recurrence_kernel)
    if N * H and T:
        NT = -(-T // C)
        g = chunk_log_decay(launch.flat(alpha_t, 3 if per_channel else 2), C, per_channel)
        eta2 = launch.flat(eta_t, 2).to(torch.float32)
        h0 = None if S0 is None else launch.flat(S0, 3)
        store_dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        A = launch.empty_out((N * H, NT, C, C), store_dtype, q.device)
        P = launch.empty_out((N * H, NT, C, C), store_dtype, q.device)
        BK = launch.block(DK)
        for s, n in launch.launches(N * H * NT):
            prepare_kernel[(n,)](
                q2, k2, g, eta2, A, P, T, g.shape[1], H, NT, eps, s,
                DK=DK, BK=BK, BKS=min(BK, 32), C=C, NB=C // 16, KACZMARZ=kaczmarz, PER_CHANNEL=per_channel,
                PREC=PRECISIONS[prec], num_warps=4,
            )
        _recurrence(q2, k2, v2, g, A, P, h0, o, ht, flags, T, H, NT, DK, DV, BK, C, per_channel, normalize_queries, prec)
    elif return_final_state:
        ht.copy_(torch.zeros_like(ht) if S0 is None else launch.flat(S0, 3))
    o = o.reshape(*lead, T, H, DV)
    S = None if ht is None else ht.reshape(*lead, H, DK, DV)
    invalid, nonfinite = torch.stack([gates_invalid, ~torch.isfinite(flags).all()]).tolist()  # one synchronisation
    if invalid:
        _check_gates(alpha_t, eta_t)
    if nonfinite:
        _explain_nonfinite(q, k, v, S0, normalize_queries)
    return (o, S) if return_final_state else o


def _recurrence(q2, k2, v2, g, A, P, h0, o, ht, flags, T, H, NT, DK, DV, BK, C, per_channel, normalize, prec):
    NH = q2.shape[0] * H
    common = dict(DK=DK, DV=DV, BK=BK, C=C, PER_CHANNEL=per_channel, HAS_H0=h0 is not None,
                  NORMALIZE=normalize, STORE_FINAL=ht is not None, PREC=PRECISIONS[prec])
    args = (q2, k2, v2, g, A, P, h0 if h0 is not None else q2, o, ht if ht is not None else o, flags, T, g.shape[1], H, NT)
    # at most 8 d_v blocks per head (BV >= 16): keep every launch within the grid limit
    per_launch = max(1, launch.MAX_GRID // 8)
    for start in range(0, NH, per_launch):
        heads = min(per_launch, NH - start)
        if launch.interpreting():
            BV = min(64, launch.block(DV))
            recurrence_kernel[(heads * triton.cdiv(DV, BV),)](*args, start, BV=BV, **common, num_warps=4)
        else:
            recurrence_tuned[lambda meta: (heads * triton.cdiv(DV, meta["BV"]),)](*args, start, **common)
