"""The GKA layer's implicit backward in Triton: the formulas of kernels/gka_layer_bwd.py, fused.

The PyTorch form (:func:`kernels.gka_layer_bwd.implicit_backward`, kept as the reference and for
the float64 checks) writes every intermediate to memory: at GKA's size the ``(D, D)`` sums and
carries ``P_end``, ``Q_end`` are 268 MB each in float32, and each of about twenty elementwise
passes and batched products over them or over the ``(T, D)`` rows costs a trip through HBM.
Here three kinds of kernel compute the same quantities with the intermediates in registers:

* :func:`dx_kernel`, one program per chunk: ``dx_c = U_c^T dy_c = zeta_c R^T dy_c + sum_{j <= c}
  Mt[c, j] beta_j k_j (v_j . dy_c)`` (eq. (6); ``transposed_state_products``), the right-hand
  side of the dq solve.
* The carries, one program per (sequence, block of rows) walking the chunks backwards, as
  ``kernels.gka_layer_carry`` does, but keeping the carried sum in registers and writing only
  what the chunk kernel reads of it. Of ``P_end`` the gradients need only ``K (P_end +
  P_end^T)`` (in ``dk`` as ``Pk + P^T k``, in ``k^T P k = k^T (P + P^T) k / 2``), so
  :func:`sym_carry_kernel` carries the symmetric ``Sigma = P_end + P_end^T`` by rows; then
  ``(K Sigma)[:, rows] = K Sigma[rows, :]^T`` is complete in one program. Its chunk term
  ``delta + delta^T`` is formed in the kernel from the state (``delta = sum_c zeta_c dH_c``, the
  module docstring of kernels/gka_layer_bwd.py), so neither ``delta`` nor ``P_end`` is ever
  written. ``Q_end`` (``(Dv, D)``, not symmetric) is needed as ``K Q_end^T`` and ``V Q_end``:
  :func:`q_carry_kernel` carries it by rows for the first and by columns for the second.
* :func:`chunk_grads_kernel`, one program per chunk: ``dk``, ``dv``, ``dbeta`` and the per-token
  ``dG`` of kernels/gka_layer_bwd.py from the chunk's rows, the chunk-start states (read once, a
  block of rows at a time) and the carried products.

Arithmetic: float32 throughout, every product at float32 accuracy (``input_precision="ieee"``),
as the PyTorch form on the GPU; the sums run in other orders, which GRAD's rounding term
``gamma_m(u_32)`` on the absolute terms covers (analysis/testing/gka_gradient_harness.py).
Padding tokens carry k = v = 0, dq = dy = 0 and a finite ||H_t||_F > 0, so they add nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 16  # rows (or columns) of a carried sum a program holds: 8 programs a sequence at D = 128
STATE_BLOCK = 32  # rows of a chunk-start state the chunk kernel reads at a time
# products on tensor cores in three tf32 products instead of float32 FMAs: a trial switch for the
# benchmark (the GRAD bound models float32 products; docs/performance.md)
FAST_PRODUCTS = False
CARRY_WARPS = 4  # warps of a carry program (trial switch)
COLUMNS = 32  # columns of dk or dv a chunk-column program forms (and the blocks it contracts in)


@triton.jit
def _dot(a, b, FAST: tl.constexpr = False):
    """A float32 product: at float32 accuracy (``ieee``, CUDA cores), or with FAST on tensor
    cores in three tf32 products (``tf32x3``; a trial, not the default)."""
    if FAST:
        return tl.dot(a, b, input_precision="tf32x3")
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _tile(p, row0, o_c, o_x, W):
    """Rows ``row0 + o_c`` and columns ``o_x`` (zero at and beyond W) of a row-major tensor with W
    columns, as float32."""
    return tl.load(
        p + (row0 + o_c)[:, None] * W + o_x[None, :], mask=(o_x < W)[None, :], other=0.0
    ).to(tl.float32)


@triton.jit
def _gates(p_G, row0, o_c, C: tl.constexpr, HAS_G: tl.constexpr):
    """``(G, zeta, decay, e, M)`` of a chunk: cumulative log gates G (0 without a gate),
    ``zeta = exp(G)``, the chunk's decay ``exp(G_C)``, ``e_i = exp(G_C - G_i)`` and the mask
    ``M[i, c] = exp(G_c - G_i)`` for ``c >= i``, else 0 (solvers.gka_chunk.decay_mask)."""
    if HAS_G:
        G = tl.load(p_G + row0 + o_c)
    else:
        G = tl.zeros([C], dtype=tl.float32)
    last = tl.sum(tl.where(o_c == C - 1, G, 0.0), axis=0)
    upper = o_c[None, :] >= o_c[:, None]
    M = tl.exp(tl.where(upper, G[None, :] - G[:, None], float("-inf")))
    return G, tl.exp(G), tl.exp(last), tl.exp(last - G), M


@triton.jit
def _weights(X, dQ, p_fro, row0, o_c, M, zeta, a2):
    """Lemma 1's ``w_c = 2 a x_c . dq_c / ||H_c||_F`` and ``b_i = sum_c M[i, c] w_c zeta_c``
    (solvers.gka_chunk.chunk_backward_coefficients)."""
    w = a2 * tl.sum(X * dQ, axis=1) / tl.load(p_fro + row0 + o_c)
    b = tl.sum(M * (w * zeta)[None, :], axis=1)
    return w, b


@triton.jit
def _beta(p_b, row0, o_c, C: tl.constexpr, HAS_B: tl.constexpr):
    if HAS_B:
        return tl.load(p_b + row0 + o_c).to(tl.float32)
    return tl.full([C], 1.0, tl.float32)


@triton.jit
def dx_kernel(
    p_k,
    p_v,
    p_dy,
    p_G,
    p_b,
    p_R,
    p_dx,
    NC,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BJ: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    FAST: tl.constexpr,
    HAS_B: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1)
    o_c = tl.arange(0, C)
    o_d = tl.arange(0, BLOCK_D)
    o_v = tl.arange(0, BLOCK_V)
    row0 = i_n * NC * C + i_c * C
    base = i_n * NC + i_c
    _, zeta, _, _, M = _gates(p_G, row0, o_c, C, HAS_G)
    bK = _tile(p_k, row0, o_c, o_d, D) * _beta(p_b, row0, o_c, C, HAS_B)[:, None]
    V = _tile(p_v, row0, o_c, o_v, DV)
    dY = _tile(p_dy, row0, o_c, o_v, DV)
    acc = tl.zeros([C, BLOCK_D], dtype=tl.float32)
    for v0 in tl.static_range(0, BLOCK_V, BJ):  # dY R, a block of R's rows at a time
        o_j = v0 + tl.arange(0, BJ)
        R = tl.load(
            p_R + base * DV * D + o_j[:, None] * D + o_d[None, :],
            mask=(o_j < DV)[:, None] & (o_d < D)[None, :],
            other=0.0,
        )
        acc += _dot(_tile(p_dy, row0, o_c, o_j, DV), R, FAST)
    dx = zeta[:, None] * acc + _dot(tl.trans(M) * _dot(dY, tl.trans(V), FAST), bK, FAST)
    tl.store(p_dx + (row0 + o_c)[:, None] * D + o_d[None, :], dx, mask=(o_d < D)[None, :])


@triton.jit
def sym_carry_kernel(
    p_k,
    p_x,
    p_dq,
    p_G,
    p_b,
    p_fro,
    p_S,
    p_out,
    NC,
    a2,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BR: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    FAST: tl.constexpr,
    HAS_B: tl.constexpr,
):
    # rows o_r of Sigma_n = P_end,n + P_end,n^T, carried backwards:
    #   Sigma_{n-1} = zeta^n_C Sigma_n + delta_n + delta_n^T,
    #   delta = -(s/2) S - K^T diag(coef/2) K - (dq . zeta)^T X     (kernels/gka_layer_bwd.py)
    # with s = sum_c zeta_c^2 w_c and coef = beta b; out_n[:, o_r] = K_n Sigma_n[o_r, :]^T
    i_n = tl.program_id(0).to(tl.int64)
    o_r = tl.program_id(1) * BR + tl.arange(0, BR)
    o_c = tl.arange(0, C)
    o_d = tl.arange(0, BLOCK_D)
    m_rd = (o_r < D)[:, None] & (o_d < D)[None, :]
    E = tl.zeros([BR, BLOCK_D], dtype=tl.float32)
    for step in range(NC):
        n = NC - 1 - step
        row0 = i_n * NC * C + n * C
        K = _tile(p_k, row0, o_c, o_d, D)
        out = _dot(K, tl.trans(E), FAST)
        tl.store(p_out + (row0 + o_c)[:, None] * D + o_r[None, :], out, mask=(o_r < D)[None, :])
        X = _tile(p_x, row0, o_c, o_d, D)
        dQ = _tile(p_dq, row0, o_c, o_d, D)
        _, zeta, decay, _, M = _gates(p_G, row0, o_c, C, HAS_G)
        w, b = _weights(X, dQ, p_fro, row0, o_c, M, zeta, a2)
        hc = 0.5 * b * _beta(p_b, row0, o_c, C, HAS_B)
        s = tl.sum(zeta * zeta * w, axis=0)
        Kr = _tile(p_k, row0, o_c, o_r, D)
        zq = dQ * zeta[:, None]
        zqr = _tile(p_dq, row0, o_c, o_r, D) * zeta[:, None]
        Xr = _tile(p_x, row0, o_c, o_r, D)
        p_Sn = p_S + (i_n * NC + n) * D * D
        S_rows = tl.load(p_Sn + o_r[:, None] * D + o_d[None, :], mask=m_rd, other=0.0)
        S_cols = tl.load(p_Sn + o_d[None, :] * D + o_r[:, None], mask=m_rd, other=0.0)
        delta = -(0.5 * s) * (S_rows + S_cols)
        delta -= _dot(tl.trans(Kr), hc[:, None] * K, FAST) + _dot(
            tl.trans(hc[:, None] * Kr), K, FAST
        )
        delta -= _dot(tl.trans(zqr), X, FAST) + _dot(tl.trans(Xr), zq, FAST)
        E = decay * E + delta


@triton.jit
def q_carry_kernel(
    p_k,
    p_v,
    p_x,
    p_dy,
    p_G,
    p_kqt,
    p_vq,
    NC,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BR: tl.constexpr,
    ROW_PROGRAMS: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    FAST: tl.constexpr,
):
    # Q_{n-1} = zeta^n_C Q_n + (dy . zeta)^T X (kernels/gka_layer_bwd.py, (Dv, D)); the first
    # ROW_PROGRAMS programs of a sequence carry rows o_r of it and write (K Q_n^T)[:, o_r], the
    # others columns o_j and write (V Q_n)[:, o_j]
    i_n = tl.program_id(0).to(tl.int64)
    i_p = tl.program_id(1)
    o_c = tl.arange(0, C)
    o_d = tl.arange(0, BLOCK_D)
    o_v = tl.arange(0, BLOCK_V)
    if i_p < ROW_PROGRAMS:
        o_r = i_p * BR + tl.arange(0, BR)
        E = tl.zeros([BR, BLOCK_D], dtype=tl.float32)
        for step in range(NC):
            n = NC - 1 - step
            row0 = i_n * NC * C + n * C
            K = _tile(p_k, row0, o_c, o_d, D)
            out = _dot(K, tl.trans(E), FAST)
            tl.store(
                p_kqt + (row0 + o_c)[:, None] * DV + o_r[None, :], out, mask=(o_r < DV)[None, :]
            )
            _, zeta, decay, _, _ = _gates(p_G, row0, o_c, C, HAS_G)
            zy = _tile(p_dy, row0, o_c, o_r, DV) * zeta[:, None]
            E = decay * E + _dot(tl.trans(zy), _tile(p_x, row0, o_c, o_d, D), FAST)
    else:
        o_j = (i_p - ROW_PROGRAMS) * BR + tl.arange(0, BR)
        F = tl.zeros([BLOCK_V, BR], dtype=tl.float32)
        for step in range(NC):
            n = NC - 1 - step
            row0 = i_n * NC * C + n * C
            out = _dot(_tile(p_v, row0, o_c, o_v, DV), F, FAST)
            tl.store(p_vq + (row0 + o_c)[:, None] * D + o_j[None, :], out, mask=(o_j < D)[None, :])
            _, zeta, decay, _, _ = _gates(p_G, row0, o_c, C, HAS_G)
            zy = _tile(p_dy, row0, o_c, o_v, DV) * zeta[:, None]
            F = decay * F + _dot(tl.trans(zy), _tile(p_x, row0, o_c, o_j, D), FAST)


@triton.jit
def chunk_pairs_kernel(
    p_k,
    p_x,
    p_dq,
    p_v,
    p_dy,
    p_G,
    p_b,
    p_fro,
    p_pairs,
    p_w,
    NC,
    a2,
    D: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_V: tl.constexpr,
    FAST: tl.constexpr,
):
    # the chunk's (C, C) products, contracted over D (and Dv) a block of BK columns at a time,
    # with their masks and weights folded in (kernels/gka_layer_bwd.py, sgn = -1):
    #   pairs[0] = M . (K X^T)                 (dk: - pairs[0] dq;  dv: + pairs[0] dy)
    #   pairs[1] = ((K K^T) . M_w) diag(beta)  (the w H part: pairs[1] K)
    #   pairs[2] = M . (V dY^T - K dQ^T)       (dk: + pairs[2] X)
    #   pairs[3] = Mt . (X K^T) diag(beta)     (H_t x_t and U_t x_t within the chunk: pairs[3] K, V)
    # and w (Lemma 1) per token
    i_n = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1)
    o_c = tl.arange(0, C)
    row0 = i_n * NC * C + i_c * C
    KX = tl.zeros([C, C], dtype=tl.float32)
    KQ = tl.zeros([C, C], dtype=tl.float32)
    KK = tl.zeros([C, C], dtype=tl.float32)
    XK = tl.zeros([C, C], dtype=tl.float32)
    xq = tl.zeros([C], dtype=tl.float32)
    for d0 in tl.static_range(0, D, BK):
        o_d = d0 + tl.arange(0, BK)
        K = _tile(p_k, row0, o_c, o_d, D)
        X = _tile(p_x, row0, o_c, o_d, D)
        dQ = _tile(p_dq, row0, o_c, o_d, D)
        KX += _dot(K, tl.trans(X), FAST)
        KQ += _dot(K, tl.trans(dQ), FAST)
        KK += _dot(K, tl.trans(K), FAST)
        XK += _dot(X, tl.trans(K), FAST)
        xq += tl.sum(X * dQ, axis=1)
    VY = tl.zeros([C, C], dtype=tl.float32)
    if HAS_V:
        for d0 in tl.static_range(0, DV, BK):
            o_d = d0 + tl.arange(0, BK)
            VY += _dot(
                _tile(p_v, row0, o_c, o_d, DV), tl.trans(_tile(p_dy, row0, o_c, o_d, DV)), FAST
            )
    _, zeta, _, _, M = _gates(p_G, row0, o_c, C, HAS_G)
    w = a2 * xq / tl.load(p_fro + row0 + o_c)
    beta = _beta(p_b, row0, o_c, C, HAS_B)
    Mw = _dot(M * w[None, :], tl.trans(M), FAST)
    o_cc = o_c[:, None] * C + o_c[None, :]
    base = (i_n * NC + i_c) * 4 * C * C
    tl.store(p_pairs + base + o_cc, M * KX)
    tl.store(p_pairs + base + C * C + o_cc, KK * Mw * beta[None, :])
    tl.store(p_pairs + base + 2 * C * C + o_cc, M * (VY - KQ))
    tl.store(p_pairs + base + 3 * C * C + o_cc, tl.trans(M) * XK * beta[None, :])
    tl.store(p_w + row0 + o_c, w)


@triton.jit
def chunk_columns_kernel(
    p_k,
    p_x,
    p_dq,
    p_v,
    p_dy,
    p_G,
    p_b,
    p_w,
    p_S,
    p_R,
    p_pairs,
    p_ksig,
    p_kqt,
    p_vq,
    p_dk,
    p_dv,
    p_part,
    NC,
    D: tl.constexpr,
    DV: tl.constexpr,
    BN: tl.constexpr,
    D_PROGRAMS: tl.constexpr,
    C: tl.constexpr,
    HAS_G: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_V: tl.constexpr,
    FAST: tl.constexpr,
):
    # columns o_j of dk (the first D_PROGRAMS programs of a chunk) or of dv (the others), and
    # their columns' share of the row sums k^T P k, v^T Q k (into dbeta) and <dH, H>, <dU, U>
    # (into dG), written to part[program] for the host to add up (kernels/gka_layer_bwd.py):
    #   dk = beta (e (K Sigma + V Q_end) - pairs0 dQ - b . (K S) - pairs1 K + pairs2 X)
    #   dv = beta (pairs0 dY + e K Q_end^T)
    i_n = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1)
    i_p = tl.program_id(2)
    o_c = tl.arange(0, C)
    row0 = i_n * NC * C + i_c * C
    base = i_n * NC + i_c
    o_cc = o_c[:, None] * C + o_c[None, :]
    p_pc = p_pairs + base * 4 * C * C + o_cc
    _, zeta, _, e, M = _gates(p_G, row0, o_c, C, HAS_G)
    beta = _beta(p_b, row0, o_c, C, HAS_B)
    P0 = tl.load(p_pc)
    P3 = tl.load(p_pc + 3 * C * C)
    if i_p < D_PROGRAMS:
        o_j = i_p * BN + tl.arange(0, BN)
        m_j = o_j < D
        # (K S)[:, o_j] and (X S^T)[:, o_j] = X S[:, o_j] (S symmetric), a block of rows at a time
        KS = tl.zeros([C, BN], dtype=tl.float32)
        XS = tl.zeros([C, BN], dtype=tl.float32)
        for r0 in tl.static_range(0, D, BN):
            o_r = r0 + tl.arange(0, BN)
            S = tl.load(
                p_S + base * D * D + o_r[:, None] * D + o_j[None, :],
                mask=(o_r < D)[:, None] & m_j[None, :],
                other=0.0,
            )
            KS += _dot(_tile(p_k, row0, o_c, o_r, D), S, FAST)
            XS += _dot(_tile(p_x, row0, o_c, o_r, D), S, FAST)
        K = _tile(p_k, row0, o_c, o_j, D)
        dQ = _tile(p_dq, row0, o_c, o_j, D)
        KSig = _tile(p_ksig, row0, o_c, o_j, D)
        w = tl.load(p_w + row0 + o_c)
        b = tl.sum(M * (w * zeta)[None, :], axis=1)
        wH = b[:, None] * KS + _dot(tl.load(p_pc + C * C), K, FAST)
        Pk = _dot(P0, dQ, FAST) + 0.5 * wH
        dk = (
            e[:, None] * KSig
            - Pk
            - 0.5 * wH
            + _dot(tl.load(p_pc + 2 * C * C), _tile(p_x, row0, o_c, o_j, D), FAST)
        )
        kPk = 0.5 * e * tl.sum(K * KSig, axis=1) - tl.sum(K * Pk, axis=1)
        own = -(zeta * tl.sum(dQ * XS, axis=1) + tl.sum(dQ * _dot(P3, K, FAST), axis=1))
        if HAS_V:
            dk += e[:, None] * _tile(p_vq, row0, o_c, o_j, D)
        tl.store(
            p_dk + (row0 + o_c)[:, None] * D + o_j[None, :], beta[:, None] * dk, mask=m_j[None, :]
        )
    else:
        o_j = (i_p - D_PROGRAMS) * BN + tl.arange(0, BN)
        m_j = o_j < DV
        # (X R^T)[:, o_j], a block of R's columns at a time (R is (Dv, D), not symmetric)
        XR = tl.zeros([C, BN], dtype=tl.float32)
        for r0 in tl.static_range(0, D, BN):
            o_r = r0 + tl.arange(0, BN)
            Rt = tl.load(
                p_R + base * DV * D + o_j[None, :] * D + o_r[:, None],
                mask=(o_r < D)[:, None] & m_j[None, :],
                other=0.0,
            )
            XR += _dot(_tile(p_x, row0, o_c, o_r, D), Rt, FAST)
        V = _tile(p_v, row0, o_c, o_j, DV)
        dY = _tile(p_dy, row0, o_c, o_j, DV)
        Qk = _dot(P0, dY, FAST) + e[:, None] * _tile(p_kqt, row0, o_c, o_j, DV)
        kPk = tl.sum(V * Qk, axis=1)  # this program's share of v^T Q k
        own = zeta * tl.sum(dY * XR, axis=1) + tl.sum(dY * _dot(P3, V, FAST), axis=1)
        tl.store(
            p_dv + (row0 + o_c)[:, None] * DV + o_j[None, :], beta[:, None] * Qk, mask=m_j[None, :]
        )
    part = (i_p * tl.num_programs(0) * NC * C + row0 + o_c) * 2
    tl.store(p_part + part, kPk)
    tl.store(p_part + part + 1, own)


def _block(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def dx_from_dy(k, v, dy, G, beta, R, C: int) -> torch.Tensor:
    """``dx = U_t^T dy_t`` for every token, ``(N, Tp, D)`` float32, from the padded flat rows
    k ``(N, Tp, D)``, v, dy ``(N, Tp, Dv)``, cumulative gates G ``(N, Tp)`` (None: no gate), beta
    (None) and the float32 value states R ``(N, NC, Dv, D)``."""
    N, Tp, D = k.shape
    Dv = v.shape[-1]
    NC = Tp // C
    dx = torch.empty(N, Tp, D, dtype=torch.float32, device=k.device)
    if N and NC:
        dx_kernel[(N, NC)](
            k,
            v,
            dy,
            k if G is None else G,
            k if beta is None else beta,
            R,
            dx,
            NC,
            D=D,
            DV=Dv,
            BLOCK_D=_block(D),
            BLOCK_V=_block(Dv),
            BJ=min(STATE_BLOCK, _block(Dv)),
            C=C,
            HAS_G=G is not None,
            HAS_B=beta is not None,
            FAST=FAST_PRODUCTS,
            num_warps=4,
        )
    return dx


def carried_products(*, k, x, dq, fro, G, beta, S, a: float, C: int, v=None, dy=None) -> tuple:
    """What the chunks after each chunk contribute to its gradients, ``(ksig, kqt, vq)``: the rows
    ``K_n (P_end,n + P_end,n^T)`` ``(N, Tp, D)`` and, with v, ``K_n Q_end,n^T`` ``(N, Tp, Dv)`` and
    ``V_n Q_end,n`` ``(N, Tp, D)`` (None without v), float32; arguments as
    :func:`implicit_backward_fused`."""
    N, Tp, D = k.shape
    NC = Tp // C
    f32 = dict(dtype=torch.float32, device=k.device)
    ksig = torch.zeros(N, Tp, D, **f32)
    has_v = v is not None
    Dv = v.shape[-1] if has_v else 1
    kqt = torch.zeros(N, Tp, Dv, **f32) if has_v else None
    vq = torch.zeros(N, Tp, D, **f32) if has_v else None
    if not (N and NC):
        return ksig, kqt, vq
    BD, BV = _block(D), _block(Dv)
    g_ = k if G is None else G
    sym_carry_kernel[(N, triton.cdiv(D, ROWS))](
        k, x, dq, g_, k if beta is None else beta, fro, S, ksig, NC, 2.0 * a,
        D=D, BLOCK_D=BD, BR=ROWS, C=C, HAS_G=G is not None, HAS_B=beta is not None, FAST=FAST_PRODUCTS,
        num_warps=CARRY_WARPS,
    )  # fmt: skip
    if has_v:
        rows = triton.cdiv(Dv, ROWS)
        q_carry_kernel[(N, rows + triton.cdiv(D, ROWS))](
            k, v, x, dy, g_, kqt, vq, NC,
            D=D, DV=Dv, BLOCK_D=BD, BLOCK_V=BV, BR=ROWS, ROW_PROGRAMS=rows, C=C,
            HAS_G=G is not None, FAST=FAST_PRODUCTS, num_warps=CARRY_WARPS,
        )  # fmt: skip
    return ksig, kqt, vq


def implicit_backward_fused(
    *, k, x, dq, fro, G, beta, S, a: float, C: int, v=None, dy=None, R=None, carried=None
) -> tuple:
    """``(dk, dv, dbeta, dG)`` as :func:`kernels.gka_layer_bwd.implicit_backward` (sgn = -1),
    from the padded flat rows ``(N, Tp, .)`` (k, v in the inputs' dtype, x in the forward's
    output dtype, dq, dy float32), ||H_t||_F ``fro`` ``(N, Tp)``, G, beta ``(N, Tp)`` or None and
    the float32 chunk-start states S ``(N, NC, D, D)`` (and R ``(N, NC, Dv, D)`` with v). dv is
    None without v. Every output is float32 and flat ``(N, Tp, .)``. ``carried``: the
    :func:`carried_products` (computed here when None)."""
    N, Tp, D = k.shape
    NC = Tp // C
    f32 = dict(dtype=torch.float32, device=k.device)
    has_v = v is not None
    Dv = v.shape[-1] if has_v else 1
    dk = torch.empty(N, Tp, D, **f32)
    dv = torch.empty(N, Tp, Dv, **f32) if has_v else None
    if not (N and NC):
        return dk, dv, torch.empty(N, Tp, **f32), torch.empty(N, Tp, **f32)
    if carried is None:
        carried = carried_products(
            k=k, x=x, dq=dq, fro=fro, G=G, beta=beta, S=S, a=a, C=C, v=v, dy=dy
        )
    ksig, kqt, vq = carried
    pairs = torch.empty(N, NC, 4, C, C, **f32)
    w = torch.empty(N, Tp, **f32)
    g_ = k if G is None else G
    b_ = k if beta is None else beta
    v_, dy_ = (v, dy) if has_v else (k, dq)
    flags = dict(C=C, HAS_G=G is not None, HAS_B=beta is not None, HAS_V=has_v, FAST=FAST_PRODUCTS)
    chunk_pairs_kernel[(N, NC)](
        k, x, dq, v_, dy_, g_, b_, fro, pairs, w, NC, 2.0 * a,
        D=D, DV=Dv, BK=COLUMNS, num_warps=4, **flags,
    )  # fmt: skip
    d_prog = triton.cdiv(D, COLUMNS)
    programs = d_prog + (triton.cdiv(Dv, COLUMNS) if has_v else 0)
    part = torch.empty(programs, N, Tp, 2, **f32)
    chunk_columns_kernel[(N, NC, programs)](
        k, x, dq, v_, dy_, g_, b_, w, S, R if has_v else S, pairs, ksig,
        kqt if has_v else ksig, vq if has_v else ksig, dk, dv if has_v else dk, part, NC,
        D=D, DV=Dv, BN=COLUMNS, D_PROGRAMS=d_prog, num_warps=4, **flags,
    )  # fmt: skip
    # the row sums over the column blocks: k^T P k + v^T Q k (dbeta) and <dH, H> + <dU, U> (dG)
    sums = part.sum(0)
    dbeta = sums[..., 0]
    own = sums[..., 1] - 0.5 * w * fro * fro
    dG = own - (dbeta if beta is None else beta.float() * dbeta)
    return dk, dv, dbeta, dG


__all__ = ["carried_products", "dx_from_dy", "implicit_backward_fused"]
