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

Three kernels (docs/kernels.md "KLA"), launched with no host-device copy or synchronisation:

1. ``gates_kernel``, one program per (sequence, chunk, head): the chunk-local cumulative log
   decay g, eta in float32, and a flag per program when a gate is out of range or not finite;
2. ``prepare_kernel``, one program per (chunk, head), all chunks at once: beta from the keys
   (the Kaczmarz normalisation happens here, in float32), the decayed C x C Gram matrix L, the
   unit-lower inverse ``(I + L)^{-1}`` by forward substitution on the 16 x 16 diagonal blocks and
   block forward substitution for the rest (fp32, ``input_precision="ieee"``), and P; X' and P
   are stored per chunk;
3. ``recurrence_kernel``, one program per (head, block of d_v columns), walks the chunks in
   order with the state block in float32 registers: the products above, outputs, state update,
   and a finiteness flag per program.

The flags are read at the end of the call (``check_inputs=True``, one synchronisation), later
(a ``kernels.DeferredChecks``) or not at all (``False``); the last two make a call capturable in
a CUDA graph.

Precision model (``input_precision``): every product with a d_k, d_v or chunk-length inner
dimension is a ``tl.dot`` accumulated in float32, whose *operands* are

* ``"ieee"`` (float32 default): used as they are (float32 or exact bf16 inputs) -- float32
  accuracy throughout;
* ``"tf32x3"`` / ``"tf32"``: float32 operands split into three tf32 products / rounded to tf32;
* ``"bf16"`` (bfloat16 default, as flash-linear-attention): rounded to bfloat16 at the GEMM
  boundary: the state S_0, the right-hand side V - D_gamma K S_0, U, X', P and the decayed U of
  the state update (the bf16 inputs q, k, v are exact).

Everything else -- beta, the decays, L, the inverse, the state, all accumulations -- is float32.
``analysis.bounds.kla_kernel.kla_kernel_bound`` bounds the result's rounding error in each
model, step by step as written here.

Contract: float32 inputs: ``float32`` (``input_precision="ieee"``); bfloat16 inputs: ``bfloat16/operands``
(chunk GEMM operands rounded to bf16, state and accumulation float32, as flash-linear-attention);
``input_precision`` "tf32x3" / "tf32" / "bf16" selects ``tf32x3`` / ``tf32`` / ``bfloat16/operands``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from solvers import validation as check
from solvers.kla import broadcast_gate, check_qkv, initial_state_view, nonnegative

from . import _launch as launch
from ._matvec import INTERPRETED, stored

# Operand precisions of the chunk GEMMs (docs/kernels.md, "KLA"); kept in sync with
# analysis.bounds.kla_kernel.OPERAND_ROUNDING.
IEEE: tl.constexpr = tl.constexpr(0)
TF32X3: tl.constexpr = tl.constexpr(1)
TF32: tl.constexpr = tl.constexpr(2)
BF16: tl.constexpr = tl.constexpr(3)
PRECISIONS = {"ieee": 0, "tf32x3": 1, "tf32": 2, "bf16": 3}
CHUNK_SIZES = (16, 32, 64)
COEFFICIENTS = ("kaczmarz", "gdn")
SUB: tl.constexpr = tl.constexpr(16)  # edge of the diagonal blocks inverted by substitution
# Sequence lengths and chunk counts are never specialised on: Triton turns an integer argument
# equal to 1 into a constant, so a sequence of one chunk (T <= C) would get its own binary with
# the chunk loop removed -- and on an H200 with Triton 3.6 that binary of the forward faulted
# with an illegal memory access at d_k = 128, C = 64 in bfloat16 (docs/validation.md, "KLA/GDN
# backward on the GPU"), while the looping binary runs every T. One binary serves every length.
RUNTIME_LENGTHS = ["T", "NT"]


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
def channel_gram(
    p_x,
    p_y,
    p_g,
    base_k,
    base_g,
    t_i,
    t_j,
    m_i,
    m_j,
    H,
    DK: tl.constexpr,
    LOWER: tl.constexpr,
    STRICT: tl.constexpr,
):
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
        M += tl.where(
            m, x[:, None] * y[None, :] * tl.exp(tl.where(m, gi[:, None] - gj[None, :], 0.0)), 0.0
        )
    return M


@triton.jit
def substitution_step(p_N, Y, i, o, stride):
    """Row i of ``Y = (I + N)^{-1} - I`` from the rows above it (forward substitution on the
    columns of I, Higham Alg. 8.1): ``Y_i = -N_i - sum_{j<i} N_ij Y_j``. Row i of N is read
    back from its copy at p_N (rows ``stride`` apart): a load, where extracting it from the
    register tile would be a reduction across threads on the program's critical path."""
    a = -tl.load(p_N + i * stride + o)
    a = tl.where(o < i, a, 0.0)
    a = a + tl.sum(a[:, None] * Y, axis=0)
    return tl.where((o == i)[:, None], a[None, :], Y)


@triton.jit
def invert_diagonal_blocks(N0, N1, N2, N3, NB: tl.constexpr, p_N, C: tl.constexpr):
    """``(I + N_b)^{-1}`` of the NB strictly lower 16 x 16 diagonal blocks by forward
    substitution, float32, in one loop so that the independent substitutions overlap; p_N:
    the chunk's C x C N in the program's scratch (substitution_step reads its rows)."""
    o = tl.arange(0, SUB)
    Y0 = -N0  # rows 0 and 1 of X - I are already -N
    Y1 = -N1
    Y2 = -N2
    Y3 = -N3
    for i in range(2, SUB):
        Y0 = substitution_step(p_N, Y0, i, o, C)
        if NB > 1:
            Y1 = substitution_step(p_N + SUB * C + SUB, Y1, i, o, C)
        if NB > 2:
            Y2 = substitution_step(p_N + 2 * SUB * (C + 1), Y2, i, o, C)
            Y3 = substitution_step(p_N + 3 * SUB * (C + 1), Y3, i, o, C)
    eye = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    return Y0 + eye, Y1 + eye, Y2 + eye, Y3 + eye


@triton.jit
def store_block(p_A, base_a, i: tl.constexpr, j: tl.constexpr, X, C: tl.constexpr):
    """Block (i, j) of the chunk's C x C matrix at base_a."""
    o = tl.arange(0, SUB)
    ptr = p_A + base_a + (o + i * SUB)[:, None] * C + (o + j * SUB)[None, :]
    tl.store(ptr, stored(X, p_A.dtype.element_ty))


@triton.jit
def scratch_block(p_N, i: tl.constexpr, j: tl.constexpr, C: tl.constexpr):
    """Block (i, j) of the C x C float32 matrix at p_N."""
    o = tl.arange(0, SUB)
    return tl.load(p_N + (o + i * SUB)[:, None] * C + (o + j * SUB)[None, :])


@triton.jit
def sq_norms(K):
    Kf = K.to(tl.float32)
    return tl.sum(Kf * Kf, axis=1)


@triton.jit(do_not_specialize=["grid_size", *RUNTIME_LENGTHS])
def prepare_kernel(
    p_q,
    p_k,
    p_g,
    p_eta,
    p_A,
    p_P,
    p_scr,
    T,
    Tp,
    H,
    NT,
    eps,
    start,
    grid_size,
    DK: tl.constexpr,
    BK: tl.constexpr,
    BKS: tl.constexpr,
    C: tl.constexpr,
    NB: tl.constexpr,
    KACZMARZ: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (chunk, head): X' = (I + L)^{-1} B and P of the chunk (module docstring).

    Keys and queries are read in slices of BKS columns, accumulating ||k||^2 and the C x C
    products K K^T and Q K^T, so only one slice is on chip at a time. ``N = B L`` goes to the
    program's float32 scratch at ``p_scr`` (C x C, then beta), from which the 16 x 16 blocks of
    the block forward substitution are read back. ``grid_size``: unused here, an autotuning key
    (:func:`grid_bucket`)."""
    pid = tl.program_id(0).to(tl.int64) + start
    i_nh = pid // NT
    i_t = pid % NT
    i_n = i_nh // H
    i_h = i_nh % H
    t0 = i_t * C
    base_k = (i_n * T * H + i_h) * DK
    base_e = i_n * Tp * H + i_h  # eta: (N, Tp, H) float32 from gates_kernel
    if PER_CHANNEL:
        base_g = (i_n * Tp * H + i_h) * DK
    else:
        base_g = i_n * Tp * H + i_h
    base_a = (i_nh * NT + i_t) * C * C
    p_N = p_scr + pid * (C * C + C)
    HD = H * DK
    o_c = tl.arange(0, C)
    t = t0 + o_c.to(tl.int64)
    m_t = t < T
    tile = o_c[:, None] * C + o_c[None, :]

    # squared key norms, K K^T and Q K^T, d_k in slices of BKS
    n = tl.zeros([C], dtype=tl.float32)
    Gm = tl.zeros([C, C], dtype=tl.float32)
    P = tl.zeros([C, C], dtype=tl.float32)
    for c0 in range(0, DK, BKS):
        Kt = rows(p_k, base_k, t0, T, HD, c0, DK, BKS, C)
        n += sq_norms(Kt)
        if not PER_CHANNEL:
            P += mm(rows(p_q, base_k, t0, T, HD, c0, DK, BKS, C), tl.trans(Kt), PREC)
            Gm += mm(Kt, tl.trans(Kt), PREC)

    # P = A . Q K^T (diagonal included), L = A^- . K K^T (strictly lower)
    if PER_CHANNEL:
        P = channel_gram(p_q, p_k, p_g, base_k, base_g, t, t, m_t, m_t, H, DK, True, False)
        L = channel_gram(p_k, p_k, p_g, base_k, base_g, t, t, m_t, m_t, H, DK, False, True)
    else:
        g = tl.load(p_g + base_g + t * H)  # padded rows hold g of the last token (log 1 = 0 added)
        P = decay_mask(P, g, g, m_t, m_t, False)
        P = tl.where((o_c[:, None] >= o_c[None, :]), P, 0.0)
        L = decay_mask(Gm, g, g, m_t, m_t, True)
    tl.store(p_P + base_a + tile, stored(P, p_P.dtype.element_ty))

    # beta (Kaczmarz eq. (3)): a zero key with eps = 0 gets no write
    eta = tl.load(p_eta + base_e + t * H, mask=m_t, other=0.0)
    if KACZMARZ:
        d = n + eps
        beta = tl.where(d > 0, eta / tl.where(d > 0, d, 1.0), 0.0)
        # ||k||^2 overflowed: eta / inf = 0 would silently skip the token with a finite result;
        # NaN makes the result non-finite, so the finiteness flag reports it and
        # _explain_nonfinite raises the reference's error (solvers.kla._beta)
        beta = tl.where(d < float("inf"), beta, float("nan"))
    else:
        beta = eta
    tl.store(p_N + tile, beta[:, None] * L)
    tl.store(p_N + C * C + o_c, beta)
    tl.debug_barrier()  # the blocks are read by other threads than wrote them

    # (I + N)^{-1}, N = B L: substitution on the diagonal blocks, then block forward
    # substitution on the columns of I, X_bc = -X_bb sum_{c<=m<b} N_bm X_mc; stored as
    # X' = X diag(beta)
    o_s = tl.arange(0, SUB)
    b0 = tl.load(p_N + C * C + o_s)
    z16 = tl.zeros([SUB, SUB], dtype=tl.float32)
    N11 = z16
    N22 = z16
    N33 = z16
    if NB > 1:
        N11 = scratch_block(p_N, 1, 1, C)
    if NB > 2:
        N22 = scratch_block(p_N, 2, 2, C)
        N33 = scratch_block(p_N, 3, 3, C)
    X00, X11, X22, X33 = invert_diagonal_blocks(
        scratch_block(p_N, 0, 0, C), N11, N22, N33, NB, p_N, C
    )
    store_block(p_A, base_a, 0, 0, X00 * b0[None, :], C)
    if NB > 1:
        b1 = tl.load(p_N + C * C + SUB + o_s)
        X10 = -mm_ieee(X11, mm_ieee(scratch_block(p_N, 1, 0, C), X00))
        store_block(p_A, base_a, 0, 1, z16, C)
        store_block(p_A, base_a, 1, 0, X10 * b0[None, :], C)
        store_block(p_A, base_a, 1, 1, X11 * b1[None, :], C)
    if NB > 2:
        b2 = tl.load(p_N + C * C + 2 * SUB + o_s)
        b3 = tl.load(p_N + C * C + 3 * SUB + o_s)
        N20 = scratch_block(p_N, 2, 0, C)
        N21 = scratch_block(p_N, 2, 1, C)
        N30 = scratch_block(p_N, 3, 0, C)
        N31 = scratch_block(p_N, 3, 1, C)
        N32 = scratch_block(p_N, 3, 2, C)
        X21 = -mm_ieee(X22, mm_ieee(N21, X11))
        X20 = -mm_ieee(X22, mm_ieee(N20, X00) + mm_ieee(N21, X10))
        X32 = -mm_ieee(X33, mm_ieee(N32, X22))
        X31 = -mm_ieee(X33, mm_ieee(N31, X11) + mm_ieee(N32, X21))
        X30 = -mm_ieee(X33, mm_ieee(N30, X00) + mm_ieee(N31, X10) + mm_ieee(N32, X20))
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


# ----------------------------------------------------------------------------- gates


@triton.jit
def gate_value(x, ROUND_BF16: tl.constexpr):
    """A gate as float32, rounded to bfloat16 first (to nearest even) when ROUND_BF16."""
    if ROUND_BF16:
        x = stored(x.to(tl.float32), tl.bfloat16)
    return x.to(tl.float32)


@triton.jit
def gates_kernel(
    p_alpha,
    p_eta,
    p_g,
    p_eta32,
    p_bad,
    alpha_s,
    eta_s,
    T,
    Tp,
    H,
    NT,
    start,
    DK: tl.constexpr,
    BK: tl.constexpr,
    C: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    ALPHA_SCALAR: tl.constexpr,
    ETA_SCALAR: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """One program per (sequence, chunk, head): ``g_i = sum_{r<=i} log alpha_r`` within the
    chunk (float32; padded tokens have decay 1, so they repeat the chunk's last g, as
    :func:`chunk_log_decay`), eta widened to float32 (zero on padded tokens), and
    ``p_bad[pid] = 1`` where a gate fails ``0 < alpha <= 1`` or ``0 <= eta < inf`` (NaN fails),
    else 0. A gate given as a number arrives as ``alpha_s`` / ``eta_s``, read from no memory.
    ``ROUND_BF16``: gate tensors are rounded to bfloat16 as they are read (the rounding to the
    keys' dtype that the reference does first), so a float32 gate with bfloat16 keys needs no
    separate cast kernel."""
    pid = tl.program_id(0).to(tl.int64) + start
    i_h = pid % H
    i_t = (pid // H) % NT
    i_n = pid // (H * NT)
    t = i_t * C + tl.arange(0, C).to(tl.int64)
    m_t = t < T
    row = (i_n * T + t) * H + i_h  # (N, T, H) index of each token
    row_p = (i_n * Tp + t) * H + i_h  # the same in the padded (N, Tp, H) layout
    if PER_CHANNEL:
        o_k = tl.arange(0, BK)
        m = m_t[:, None] & (o_k < DK)[None, :]
        a = gate_value(
            tl.load(p_alpha + row[:, None] * DK + o_k[None, :], mask=m, other=1.0), ROUND_BF16
        )
        g = tl.cumsum(tl.log(a), axis=0)
        tl.store(p_g + row_p[:, None] * DK + o_k[None, :], g, mask=(o_k < DK)[None, :])
        bad = tl.sum(tl.sum(tl.where((a > 0) & (a <= 1), 0, 1), axis=1), axis=0)
    else:
        if ALPHA_SCALAR:
            a = tl.where(m_t, alpha_s, 1.0)
        else:
            a = gate_value(tl.load(p_alpha + row, mask=m_t, other=1.0), ROUND_BF16)
        tl.store(p_g + row_p, tl.cumsum(tl.log(a), axis=0))
        bad = tl.sum(tl.where((a > 0) & (a <= 1), 0, 1), axis=0)
    if ETA_SCALAR:
        e = tl.where(m_t, eta_s, 0.0)
    else:
        e = gate_value(tl.load(p_eta + row, mask=m_t, other=0.0), ROUND_BF16)
    tl.store(p_eta32 + row_p, e)
    bad += tl.sum(tl.where((e >= 0) & (e < float("inf")), 0, 1), axis=0)
    tl.store(p_bad + pid, tl.where(bad > 0, 1.0, 0.0))


# ----------------------------------------------------------------------------- recurrence


@triton.jit
def chunk_decay(p_g, base_g, t0, o_c, o_k, m_k, H, DK: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """``gamma = exp(g)`` of the chunk's tokens, (C,) per head or (C, BK) per channel, and the
    chunk's last g (padded rows of g hold the last token's value)."""
    t_last = t0 + o_c.shape[0] - 1
    if PER_CHANNEL:
        g = tl.load(
            p_g + (base_g + t0 * (H * DK)) + (o_c[:, None] * (H * DK) + o_k[None, :]),
            mask=m_k[None, :],
            other=0.0,
        )
        g_last = tl.load(p_g + base_g + t_last * (H * DK) + o_k, mask=m_k, other=0.0)
    else:
        g = tl.load(p_g + base_g + (t0 + o_c) * H)
        g_last = tl.load(p_g + base_g + t_last * H)
    return g, g_last


@triton.jit
def chunk_output(
    Q, S_op, P, U, g, m_t, PER_CHANNEL: tl.constexpr, NORMALIZE: tl.constexpr, PREC: tl.constexpr
):
    """``O = (D_gamma Q S_0 + P U) / ||q||`` row-wise (eq. (8)), S_0 already a GEMM operand."""
    if PER_CHANNEL:
        QS = mm(Q.to(tl.float32) * tl.exp(g), S_op, PREC)
    else:
        QS = mm(Q, S_op, PREC) * tl.exp(g)[:, None]
    O = QS + mm(P, U, PREC)
    if NORMALIZE:
        Qf = Q.to(tl.float32)
        qn = tl.sqrt(tl.sum(Qf * Qf, axis=1))
        O = O / tl.where(m_t, qn, 1.0)[:, None]
    return O


@triton.jit
def finite_flag(p_flag, i_row, i_v, value, NV: tl.constexpr):
    """``p_flag[8 i_row + i_v] = value`` (0 when finite, else NaN); the program of the first
    d_v block also zeroes the slots of the blocks that do not exist (NV < 8), so the flags
    need no initialisation."""
    o8 = tl.arange(0, 8).to(tl.int64)
    mine = o8 == i_v
    absent = (o8 >= NV) & ((o8 * 0 + i_v) == 0)
    tl.store(p_flag + i_row * 8 + o8, tl.where(mine, value, 0.0), mask=mine | absent)


@triton.jit(do_not_specialize=["grid_size", *RUNTIME_LENGTHS])
def recurrence_kernel(
    p_q,
    p_k,
    p_v,
    p_g,
    p_A,
    p_P,
    p_h0,
    p_o,
    p_ht,
    p_flag,
    T,
    Tp,
    H,
    NT,
    grid_size,
    nh_start,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    HAS_H0: tl.constexpr,
    NORMALIZE: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (head, d_v block): the chunks in order, state block in float32.

    ``p_flag[8 i_nh + i_v]`` gets 0 when every output and the final state are finite and NaN
    otherwise (the sum of 0 x each value), so the host checks one small tensor, not o.
    ``grid_size``: unused here, an autotuning key (:func:`grid_bucket`). (A
    separate pass computing the outputs of all chunks at once, from stored states, was slower
    on an H200: 0.74 against 0.56 ms at B=4, T=4096, H=16, D=128 in bf16; docs/performance.md.)"""
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
        V = tl.load(
            p_v + (base_v + t0 * (H * DV)) + (o_c[:, None] * (H * DV) + o_v[None, :]),
            mask=m_t[:, None] & m_v[None, :],
            other=0.0,
        )
        base_a = (i_nh * NT + i_t) * C * C
        A = tl.load(p_A + base_a + o_c[:, None] * C + o_c[None, :])
        S_op = operand(S, PREC)
        g, g_last = chunk_decay(p_g, base_g, t0, o_c, o_k, m_k, H, DK, PER_CHANNEL)
        if PER_CHANNEL:
            KS = mm(K.to(tl.float32) * tl.exp(g), S_op, PREC)  # D_gamma K S_0, elementwise decay
        else:
            KS = mm(K, S_op, PREC) * tl.exp(g)[:, None]
        U = mm(A, V.to(tl.float32) - KS, PREC)
        m_o = m_t[:, None] & m_v[None, :]
        Q = rows(p_q, base_k, t0, T, H * DK, 0, DK, BK, C)
        P = tl.load(p_P + base_a + o_c[:, None] * C + o_c[None, :])
        O = chunk_output(Q, S_op, P, U, g, m_t, PER_CHANNEL, NORMALIZE, PREC)
        p_out = p_o + (base_v + t0 * (H * DV)) + (o_c[:, None] * (H * DV) + o_v[None, :])
        tl.store(p_out, stored(O, p_o.dtype.element_ty), mask=m_o)
        finite += tl.sum(tl.where(m_o, O * 0.0, 0.0), axis=1)
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
    finite_flag(p_flag, i_nh, i_v, flag, NV)


# Warps and pipelining depth of prepare_kernel, autotuned on a GPU: the substitutions on 16 x 16
# blocks favour few warps, the Gram products more; (4, 3) was the fixed choice before.
prepare_tuned = triton.autotune(
    configs=[
        triton.Config({}, num_warps=w, num_stages=s) for w, s in ((4, 3), (2, 3), (8, 3), (4, 1))
    ],
    key=["DK", "C", "NB", "KACZMARZ", "PER_CHANNEL", "PREC", "grid_size"],
    prune_configs_by={
        "early_config_prune": lambda configs, named_args, **kw: (
            configs[:1]
            if kw["PER_CHANNEL"]
            else configs[::2]
            if kw["PREC"] == PRECISIONS["ieee"]
            else configs
        )
    },
)(prepare_kernel)


def _recurrence_configs():
    # (BV, warps, stages) that compile for sm_90 without register spills in the bf16 model
    # at d_k = d_v = 128 (scripts/compile_sm90.py; docs/kernels.md, "KLA").
    return [
        triton.Config({"BV": bv}, num_warps=w, num_stages=s)
        for bv, w, s in ((16, 4, 2), (32, 4, 2), (32, 8, 2), (64, 8, 2))
    ]


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
    key=["DK", "DV", "C", "PER_CHANNEL", "PREC", "NORMALIZE", "grid_size"],
    prune_configs_by={"early_config_prune": _prune},
)(recurrence_kernel)


# ----------------------------------------------------------------------------- host side


def chunk_log_decay(alpha: torch.Tensor, C: int, per_channel: bool) -> torch.Tensor:
    """``g_i = sum_{r<=i} log alpha_r`` within each chunk of C tokens, float32, with T padded to
    a multiple of C by tokens of decay 1 (so padded rows repeat the chunk's last g).

    alpha ``(N, T, H)`` or ``(N, T, H, d_k)``; returns ``(N, Tp, H[, d_k])``, contiguous. The
    forward computes the same in ``gates_kernel`` (see :func:`gate_tensors`); this PyTorch form
    runs on any device."""
    N, T = alpha.shape[:2]
    NT = -(-T // C)
    la = torch.log(alpha.to(torch.float32))
    pad = [0, 0] * (la.ndim - 2) + [0, NT * C - T]
    la = torch.nn.functional.pad(la, pad)
    return (
        la.reshape(N, NT, C, *la.shape[2:]).cumsum(2).reshape(N, NT * C, *la.shape[2:]).contiguous()
    )


def gate_tensors(alpha, eta, shape, C: int, per_channel: bool, device, round_bf16: bool = False):
    """``(g, eta32, bad)`` for the kernels in one launch of ``gates_kernel``: the chunk-local
    cumulative log decay ``g (N, Tp, H[, d_k])`` (as :func:`chunk_log_decay`), eta as float32
    ``(N, Tp, H)`` and one validity flag per program. ``alpha`` / ``eta``: a float (rounded
    already) or a contiguous ``(N, T, H[, d_k])`` / ``(N, T, H)`` tensor on the device, rounded
    to bfloat16 in the kernel when ``round_bf16`` (bfloat16 keys, :func:`_gate`)."""
    N, T, H, DK = shape
    NT = -(-T // C)
    dev = device
    g = torch.empty(
        (N, NT * C, H, DK) if per_channel else (N, NT * C, H), dtype=torch.float32, device=dev
    )
    eta32 = torch.empty((N, NT * C, H), dtype=torch.float32, device=dev)
    bad = torch.empty((N * NT * H,), dtype=torch.float32, device=dev)
    a_scalar, e_scalar = not isinstance(alpha, torch.Tensor), not isinstance(eta, torch.Tensor)
    for s, n in launch.launches(N * NT * H):
        gates_kernel[(n,)](
            g if a_scalar else alpha,
            eta32 if e_scalar else eta,
            g,
            eta32,
            bad,
            float(alpha) if a_scalar else 1.0,
            float(eta) if e_scalar else 0.0,
            T,
            NT * C,
            H,
            NT,
            s,
            DK=DK,
            BK=launch.block(DK),
            C=C,
            PER_CHANNEL=per_channel,
            ALPHA_SCALAR=a_scalar,
            ETA_SCALAR=e_scalar,
            ROUND_BF16=round_bf16,
            num_warps=4 if per_channel else 1,
        )
    return g, eta32, bad


def _gate(name: str, x, k: torch.Tensor, channels: bool):
    """A gate as the kernels take it: ``(value, per_channel)`` with value a float rounded to
    k's dtype -- checked here, on the host -- or a contiguous ``(N, T, H[, d_k])`` tensor,
    checked in ``gates_kernel``. A float32 tensor with bfloat16 keys stays float32: the kernel
    rounds it as it reads it (``gate_tensors(..., round_bf16=True)``), one cast kernel fewer
    per gate and call."""
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        value = torch.tensor(float(x), dtype=torch.float64).to(
            k.dtype
        )  # CPU: as the reference rounds it
        _check_gate(name, value)
        return float(value), False
    keep = isinstance(x, torch.Tensor) and x.dtype == torch.float32 and k.dtype == torch.bfloat16
    like = torch.empty((), dtype=torch.float32, device=k.device) if keep else k
    t, per_channel = broadcast_gate(
        name, x, k.shape[:-1], k.shape if channels else None, like, check_finite=False
    )
    return launch.flat(t, 3 if per_channel else 2), per_channel


GATE_RANGES = {"alpha": (0.0, True, 1.0), "eta": (0.0, False, None)}  # (low, low open, high)


def _check_gate(name: str, x: torch.Tensor) -> None:
    """The reference's errors for a gate (solvers.kla_chunkwise)."""
    low, low_open, high = GATE_RANGES[name]
    check.finite(name, x)
    bad = bool(((x <= low) if low_open else (x < low)).any()) or (
        high is not None and bool((x > high).any())
    )
    if bad:
        interval = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}{']' if high is not None else ')'}"
        raise ValueError(
            f"{name} must lie in {interval} (after rounding to {x.dtype}); "
            f"got values in [{float(x.min())}, {float(x.max())}]"
        )


def _check_gates(alpha, eta) -> None:
    for name, x in (("alpha", alpha), ("eta", eta)):
        if isinstance(x, torch.Tensor):
            _check_gate(name, x)


def _zero_keys_flag(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A device flag for :func:`_zero_keys`: some key's squared norm is 0 in float32 while the
    key or its value is not zero."""
    vanishing = k.float().pow(2).sum(-1) == 0
    return (vanishing & ((k != 0).any(-1) | (v != 0).any(-1))).any()


def _zero_keys(k: torch.Tensor, v: torch.Tensor) -> None:
    """eps = 0 (KLA): a zero key needs a zero value, and no nonzero key may underflow (as
    ``solvers.kla_chunkwise``)."""
    norms = k.float().pow(2).sum(-1)
    vanishing = norms == 0
    if not bool(vanishing.any()):
        return
    where = lambda m: tuple(int(i) for i in m.nonzero()[0])  # noqa: E731
    underflow = vanishing & (k != 0).any(-1)
    if bool(underflow.any()):
        raise ValueError(
            f"k has a nonzero key whose squared norm underflows to 0 in torch.float32 at (batch..., "
            f"token, head) {where(underflow)}: rescale k or pass eps > 0"
        )
    inconsistent = vanishing & (v != 0).any(-1)
    if bool(inconsistent.any()):
        raise ValueError(
            f"k has a zero key with a nonzero value at (batch..., token, head) {where(inconsistent)} and "
            "eps = 0: the constraint S^T k_t = v_t reads 0 = v_t, which no state satisfies (KLA eq. (1)); "
            "pass eps > 0 or zero v_t"
        )


def _explain_nonfinite(q, k, v, initial_state, normalize_queries):
    """Never a silent NaN: the result is not finite; name the input the reference would have
    rejected."""
    for name, x in (("q", q), ("k", k), ("v", v)) + (
        (("initial_state", initial_state),) if initial_state is not None else ()
    ):
        check.finite(name, x)
    if normalize_queries:
        zero = q.float().pow(2).sum(-1) == 0
        if bool(zero.any()):
            idx = tuple(int(i) for i in zero.nonzero()[0])
            raise ValueError(
                f"q has a query of norm 0 in torch.float32 at (batch..., token, head) {idx}: "
                "o_t = S_t^T q_t / ||q_t|| is undefined; pass normalize_queries=False"
            )
    if not bool(torch.isfinite(k.float().pow(2).sum(-1)).all()):
        raise ValueError("||k_t||^2 overflows in torch.float32: rescale k")


def _precision(p, dtype: torch.dtype) -> str:
    return launch.choice(
        "input_precision", p, PRECISIONS, default="bf16" if dtype == torch.bfloat16 else "ieee"
    )


def kla_chunkwise(
    q,
    k,
    v,
    *,
    alpha,
    eta,
    eps: float = 1e-6,
    chunk_size: int = 64,
    initial_state=None,
    coefficient: str = "kaczmarz",
    normalize_queries: bool = True,
    bf16_mode: str = "storage",
    return_final_state: bool = True,
    input_precision=None,
    out_dtype=None,
    check_inputs=True,
):
    """KLA / GDN chunk by chunk (KLA Algorithm 1 right, Props. 3-4, App. B.5) on a GPU.

    Accepts what ``solvers.kla_chunkwise`` accepts and returns the same -- ``o (..., T, H, d_v)``
    and, unless ``return_final_state=False``, ``S_T (..., H, d_k, d_v)`` -- with these
    differences: q, k, v float32 or bfloat16 with d_k, d_v <= 128, on a CUDA device (CPU under
    TRITON_INTERPRET=1); ``chunk_size`` 16, 32 or 64; ``bf16_mode="strict"`` is refused (the
    state and all accumulations are float32); ``return_final_state`` must be a bool. The
    Kaczmarz coefficient ``beta_t = eta_t / (||k_t||^2 + eps)`` is computed in the kernel from
    the keys.

    Extra options: ``input_precision`` -- the operands of the chunk GEMMs: ``"ieee"``
    (float32 default), ``"tf32x3"``, ``"tf32"`` or ``"bf16"`` (bfloat16 default; the model of
    flash-linear-attention), see the module docstring; ``out_dtype`` (default: the input
    dtype) for o and S_T; ``check_inputs`` -- checks of values on the device (gates in range
    and finite, non-finite inputs behind a non-finite result, ||k||^2 overflow, zero keys when
    eps = 0): ``True`` (default) reads the kernels' flags at the end of the call, one
    synchronisation, and raises the reference's error; a ``kernels.DeferredChecks`` records
    them for its ``verify()``; ``False`` skips them. With either of the last two the call never
    synchronises or copies between host and device, and can be captured in a CUDA graph
    (docs/kernels.md).

    Differentiable: when grad mode is on and q, k, v, alpha, eta or initial_state requires grad,
    the call goes through :func:`kernels.kla_chunkwise_trainable` (this forward, with the chunked
    adjoint recurrence as its backward; per-head gates, ``bf16_mode="storage"``, no ``out_dtype``).
    Both paths check their arguments in :func:`_arguments`.
    """
    a = _arguments(
        q,
        k,
        v,
        alpha,
        eta,
        eps,
        chunk_size,
        initial_state,
        coefficient,
        normalize_queries,
        bf16_mode,
        return_final_state,
        input_precision,
        out_dtype,
        check_inputs,
    )
    if torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad
        for x in (q, k, v, alpha, eta, initial_state)
    ):
        from .kla_backward import trainable  # imports this module: no cycle at load time

        if out_dtype is not None or bf16_mode != "storage":
            raise ValueError(
                "kla_chunkwise with gradients takes out_dtype=None and bf16_mode='storage'"
            )
        o, S = trainable(a, alpha, eta)
        return (o, S) if return_final_state else o
    q, k, v, S0, C, checks = a.q, a.k, a.v, a.S0, a.C, a.checks
    *lead, T, H, DK = k.shape
    DV = v.shape[-1]
    prec, kaczmarz = a.prec, a.coefficient == "kaczmarz"
    if checks is not None and kaczmarz and a.eps == 0.0:
        checks.add(_zero_keys_flag(k, v), lambda: _zero_keys(k, v))
    gates = (a.alpha, a.eta)
    explain_gates = lambda: _check_gates(  # noqa: E731
        *(x.to(k.dtype) if isinstance(x, torch.Tensor) else x for x in gates)
    )

    N = math.prod(lead)
    q2, k2, v2 = (launch.flat(x, 3) for x in (q, k, v))
    o = launch.empty_out((N, T, H, DV), a.odt, q.device)
    ht = launch.empty_out((N, H, DK, DV), a.odt, q.device) if return_final_state else None
    if N * H * T * DK * DV:
        NT = -(-T // C)
        g, eta32, bad = gate_tensors(
            a.alpha, a.eta, (N, T, H, DK), C, a.per_channel, q.device, k.dtype == torch.bfloat16
        )
        h0 = None if S0 is None else launch.flat(S0, 3)
        store_dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        A = launch.empty_out((N * H, NT, C, C), store_dtype, q.device)
        P = launch.empty_out((N * H, NT, C, C), store_dtype, q.device)
        BK = launch.block(DK)
        scratch = torch.empty(
            N * H * NT * (C + 1) * C, dtype=torch.float32, device=q.device
        )  # prepare_kernel's N, beta
        for s, n in launch.launches(N * H * NT):
            meta = dict(
                DK=DK,
                BK=BK,
                BKS=min(BK, 32),
                C=C,
                NB=C // 16,
                KACZMARZ=kaczmarz,
                PER_CHANNEL=a.per_channel,
                PREC=PRECISIONS[prec],
            )
            args = (
                q2,
                k2,
                g,
                eta32,
                A,
                P,
                scratch,
                T,
                g.shape[1],
                H,
                NT,
                a.eps,
                s,
                grid_bucket(N * H * NT),
            )
            if launch.interpreting():
                prepare_kernel[(n,)](*args, **meta, num_warps=4)
            else:
                prepare_tuned[(n,)](*args, **meta)
        flags = _recurrence(
            q2,
            k2,
            v2,
            g,
            A,
            P,
            h0,
            o,
            ht,
            T,
            H,
            NT,
            DK,
            DV,
            BK,
            C,
            a.per_channel,
            normalize_queries,
            prec,
        )
        if checks is not None:
            checks.add(bad.ne(0).any(), explain_gates)
            checks.add(
                ~torch.isfinite(flags).all(),
                lambda: _explain_nonfinite(q, k, v, a.initial_state, normalize_queries),
            )
    else:
        # Nothing for the kernels (an empty batch, sequence or feature dimension): o_t is an
        # empty product when d_k = 0 -- 0, or 0 / ||q_t|| = NaN as in the reference -- and S_T
        # is S_0 (no token) or empty. The values the reference checks are still checked.
        o.fill_(float("nan") if normalize_queries else 0.0)
        if return_final_state:
            ht.copy_(torch.zeros_like(ht) if S0 is None else launch.flat(S0, 3))
        if checks is not None:
            gates_bad = _gates_flag(*gates, k.dtype)  # no gates_kernel launched to flag them
            if gates_bad is not None:
                checks.add(gates_bad, explain_gates)
            checks.add(
                _degenerate_flag(q, k, v, a.initial_state, o, normalize_queries, kaczmarz),
                lambda: _explain_nonfinite(q, k, v, a.initial_state, normalize_queries),
            )
    o = o.reshape(*lead, T, H, DV)
    S = None if ht is None else ht.reshape(*lead, H, DK, DV)
    launch.finish_checks(check_inputs, checks)
    return (o, S) if return_final_state else o


@dataclass(frozen=True)
class _Args:
    """kla_chunkwise's arguments as :func:`_arguments` checked them."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    alpha: object  # as the kernels take it (:func:`_gate`)
    eta: object
    per_channel: bool
    initial_state: torch.Tensor | None  # as passed (errors count its entries, as the reference)
    S0: torch.Tensor | None  # initial_state expanded to (..., H, d_k, d_v)
    C: int
    eps: float
    coefficient: str
    normalize_queries: bool
    prec: str
    odt: torch.dtype
    check_inputs: object
    checks: launch.DeferredChecks | None


def _arguments(
    q,
    k,
    v,
    alpha,
    eta,
    eps,
    chunk_size,
    initial_state,
    coefficient,
    normalize_queries,
    bf16_mode,
    return_final_state,
    input_precision,
    out_dtype,
    check_inputs,
) -> _Args:
    """Every argument check of :func:`kla_chunkwise`, with and without gradients (and of
    ``kernels.kla_chunkwise_trainable``): the reference's errors, raised before any launch;
    nothing here reads device values."""
    C = check.count("chunk_size", chunk_size, minimum=1)
    if C not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES} for the kernel, got {C}")
    if coefficient not in COEFFICIENTS:
        raise ValueError(f"coefficient must be one of {COEFFICIENTS}, got {coefficient!r}")
    if not isinstance(normalize_queries, bool):
        raise TypeError(f"normalize_queries must be a bool, got {type(normalize_queries).__name__}")
    if not isinstance(return_final_state, bool):
        raise TypeError(
            f"return_final_state must be a bool, got {type(return_final_state).__name__}"
        )
    launch.bf16_mode(bf16_mode)
    eps = nonnegative("eps", eps)
    q = launch.tensor("q", q, min_ndim=3)
    k = launch.tensor("k", k, min_ndim=3)
    v = launch.tensor("v", v, min_ndim=3)
    check_qkv(q, k, v)
    *lead, T, H, DK = k.shape
    DV = v.shape[-1]
    for name, d in (("k", DK), ("v", DV)):
        launch.dimension(name, d)  # d = 0 is allowed, as in the reference (nothing to launch)
    prec = _precision(input_precision, q.dtype)
    odt = launch.out_dtype(out_dtype, q.dtype)
    checks = launch.checks_for(check_inputs, q.device)
    alpha_g, per_channel = _gate("alpha", alpha, k, channels=True)
    eta_g, _ = _gate("eta", eta, k, channels=False)
    S0 = None
    if initial_state is not None:
        initial_state = launch.tensor("initial_state", initial_state, min_ndim=3)
        check.same_kind("initial_state", initial_state, "q", q)
        S0 = initial_state_view(initial_state, k, DV)
    return _Args(
        q,
        k,
        v,
        alpha_g,
        eta_g,
        per_channel,
        initial_state,
        S0,
        C,
        eps,
        coefficient,
        normalize_queries,
        prec,
        odt,
        check_inputs,
        checks,
    )


def _gates_flag(alpha, eta, dtype: torch.dtype):
    """gates_kernel's test in torch, as a device flag (None when both gates are numbers, checked
    on the host already): a gate tensor, rounded to ``dtype``, out of its range or not finite.
    Explained by :func:`_check_gates`."""
    bad = []
    for name, x in (("alpha", alpha), ("eta", eta)):
        if isinstance(x, torch.Tensor):
            x = x.to(dtype)
            low, low_open, high = GATE_RANGES[name]
            ok = (x > low) if low_open else (x >= low)
            ok = ok & ((x <= high) if high is not None else (x < math.inf))  # NaN fails both
            bad.append(~ok.all())
    return torch.stack(bad).any() if bad else None


def _degenerate_flag(q, k, v, initial_state, o, normalize_queries, kaczmarz) -> torch.Tensor:
    """A device flag for a call with nothing to launch: what the reference would still reject
    (a non-finite input, a zero query, an overflowing ||k||^2) or a non-finite result (d_k = 0
    with normalize_queries: 0 / 0). Explained by :func:`_explain_nonfinite`."""
    xs = (q, k, v, o) if initial_state is None else (q, k, v, o, initial_state)
    bad = [~torch.isfinite(x).all() for x in xs]
    if normalize_queries:  # the reference checks query norms where q has entries
        bad.append((q.float().pow(2).sum(-1) == 0).any() & (q.numel() > 0))
    if kaczmarz:
        bad.append(~torch.isfinite(k.float().pow(2).sum(-1)).all())
    return torch.stack(bad).any()


def grid_bucket(programs: int) -> int:
    """The number of programs rounded up to a power of two: part of the autotuning key, so that
    a configuration chosen for a small grid (a test at B=2, H=4: 0.32 ms per call at B=4, H=16
    on an H200) is not reused for a large one (0.20 ms when tuned there)."""
    return 1 << max(0, programs - 1).bit_length()


def _recurrence(
    q2, k2, v2, g, A, P, h0, o, ht, T, H, NT, DK, DV, BK, C, per_channel, normalize, prec
):
    """Launch the recurrence; returns its finiteness flags (recurrence_kernel)."""
    NH = q2.shape[0] * H
    flags = torch.empty(
        NH * 8, dtype=torch.float32, device=q2.device
    )  # 8: d_v blocks per head, at most
    args = (
        q2,
        k2,
        v2,
        g,
        A,
        P,
        h0 if h0 is not None else q2,
        o,
        ht if ht is not None else o,
        flags,
        T,
        g.shape[1],
        H,
        NT,
        grid_bucket(NH),
    )
    meta = dict(
        DK=DK,
        DV=DV,
        BK=BK,
        C=C,
        PER_CHANNEL=per_channel,
        NORMALIZE=normalize,
        PREC=PRECISIONS[prec],
        HAS_H0=h0 is not None,
        STORE_FINAL=ht is not None,
    )
    # at most 8 d_v blocks per head (BV >= 16): keep every launch within the grid limit
    per_launch = max(1, launch.MAX_GRID // 8)
    for start in range(0, NH, per_launch):
        n = min(per_launch, NH - start)
        if launch.interpreting():
            BV = min(64, launch.block(DV))
            recurrence_kernel[(n * triton.cdiv(DV, BV),)](*args, start, BV=BV, **meta, num_warps=4)
        else:
            recurrence_tuned[lambda m, n=n: (n * triton.cdiv(DV, m["BV"]),)](*args, start, **meta)
    return flags
