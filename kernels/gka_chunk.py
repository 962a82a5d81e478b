"""``||H_t||_F`` for every token by GKA's chunkwise formula (Sec. 4.2.1, eq. (5)) as a Triton
kernel: one program per sequence walks its chunks in order.

Mirrors ``solvers.gka_chunk.chunkwise_frobenius`` (whose docstring states the formula): for a
chunk with initial state H_0, cumulative log decays G and mask ``M_{j,c} = exp(G_c - G_j)``
(c >= j; log form, no 0/0 once the products underflow),

    ||H_c||_F^2 = zeta_c^2 ||H_0||_F^2 + 2 zeta_c sum_j M_{j,c} beta_j k_j^T H_0 k_j
                  + column-sum(((G_C . G_C . beta beta^T) M) . M)_c,           zeta_c = exp(G_c)

then ``H_0 <- zeta_C H_0 + K^T diag(beta_j M_{j,C}) K`` for the next chunk. The state, the
keys (widened exactly from bfloat16), the Gram matrix, the masks and all products are
float32 on chip (``tl.dot`` at ieee precision); the reference stores its chunk states in
the working dtype, so compare against it on float32 copies of the inputs.

Contract: ``float32``: state, Gram matrices, masks and products float32 (``tl.dot`` at ieee precision).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from solvers import validation as check
from solvers.gka import check_frobenius

from . import _launch as launch


@triton.jit
def frobenius_kernel(
    p_k,
    p_g,
    p_b,
    p_out,
    T,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    HAS_G: tl.constexpr,
    HAS_B: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    o_c = tl.arange(0, BLOCK_C)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    upper = o_c[:, None] <= o_c[None, :]  # [j, c]: c >= j
    b_H = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    for c0 in range(0, T, C):
        o_t = c0 + o_c
        m_t = (o_c < C) & (o_t < T)
        p_K = p_k + i_n * T * D + o_t[:, None].to(tl.int64) * D + o_d[None, :]
        b_K = tl.load(p_K, mask=m_t[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        if HAS_G:
            b_g = tl.load(p_g + i_n * T + o_t, mask=m_t, other=0.0).to(tl.float32)
        else:
            b_g = tl.zeros([BLOCK_C], dtype=tl.float32)
        b_G = tl.cumsum(b_g, axis=0)  # padded tokens add 0: G stays at its last value
        b_zeta = tl.exp(b_G)
        m_M = upper & m_t[:, None] & m_t[None, :]
        b_M = tl.where(m_M, tl.exp(tl.where(m_M, b_G[None, :] - b_G[:, None], 0.0)), 0.0)
        # first term
        b_t1 = b_zeta * b_zeta * tl.sum(tl.sum(b_H * b_H, axis=1), axis=0)
        # second term: k_j^T H_0 k_j, rows of K H_0^T are (H_0 k_j)^T
        b_KH = tl.dot(b_K, tl.trans(b_H), input_precision="ieee")
        b_quad = tl.sum(b_K * b_KH, axis=1)
        if HAS_B:
            b_beta = tl.load(p_b + i_n * T + o_t, mask=m_t, other=0.0).to(tl.float32)
            b_quad = b_quad * b_beta
        b_t2 = 2.0 * b_zeta * tl.sum(b_M * b_quad[:, None], axis=0)
        # third term, eq. (5)
        b_gram = tl.dot(b_K, tl.trans(b_K), input_precision="ieee")
        b_W = b_gram * b_gram
        if HAS_B:
            b_W = b_W * b_beta[:, None] * b_beta[None, :]
        b_t3 = tl.sum(tl.dot(b_W, b_M, input_precision="ieee") * b_M, axis=0)
        tl.store(p_out + i_n * T + o_t, tl.sqrt(b_t1 + b_t2 + b_t3), mask=m_t)
        # next chunk's initial state; G is non-increasing, so its last value is its minimum
        b_Glast = tl.min(tl.where(m_t, b_G, float("inf")), axis=0)
        b_coef = tl.where(m_t, tl.exp(b_Glast - b_G), 0.0)
        if HAS_B:
            b_coef = b_coef * b_beta
        b_H = tl.exp(b_Glast) * b_H + tl.dot(
            tl.trans(b_K * b_coef[:, None]), b_K, input_precision="ieee"
        )


def _gate(name, x, k2, batch, T):
    if x is None:
        return None
    x = launch.tensor(name, x, min_ndim=1)
    check.same_kind(name, x, "k", k2)
    if x.shape[-1] != T:
        raise ValueError(f"{name} has {x.shape[-1]} tokens but k has {T} (layout (..., T))")
    return x


def chunkwise_frobenius(
    k,
    *,
    g=None,
    beta=None,
    chunk_size: int,
    bf16_mode: str = "storage",
    return_states: bool = False,
):
    """``||H_t||_F`` for t = 1..T by GKA eq. (5), as ``solvers.chunkwise_frobenius``.

    k ``(..., T, D)`` float32 or bfloat16, D <= 128; g ``(..., T)`` log decays (<= 0) or None;
    beta ``(..., T)`` input gates (>= 0) or None; 1 <= chunk_size <= 128. Returns float32
    ``(..., T)``. ``return_states`` is not supported (the states never leave the chip).
    """
    chunk_size = check.count("chunk_size", chunk_size, minimum=1)
    if chunk_size > 128:
        raise ValueError(
            f"chunk_size must be <= 128 (one chunk's Gram matrix stays on chip), got {chunk_size}"
        )
    if check.flag("return_states", return_states):
        raise ValueError(
            "return_states is not supported by kernels.chunkwise_frobenius; "
            "solvers.chunkwise_frobenius(..., return_states=True) returns them"
        )
    launch.no_autograd(
        "chunkwise_frobenius",
        "solvers.chunkwise_frobenius differentiates it",
        k=k,
        g=g,
        beta=beta,
    )
    launch.bf16_mode(bf16_mode)
    k = launch.tensor("k", k, min_ndim=2)
    T, D = k.shape[-2], k.shape[-1]
    if D == 0:
        raise ValueError("k must have key dimension D >= 1, got 0")
    launch.dimension("k", D)
    g = _gate("g", g, k, None, T)
    beta = _gate("beta", beta, k, None, T)
    if g is not None and g.numel() and bool((g > 0).any()):
        raise ValueError(f"g = log gamma must be <= 0 (gamma in [0, 1]), got max {float(g.max())}")
    if beta is not None and beta.numel() and bool((beta < 0).any()):
        raise ValueError(f"beta must be >= 0, got min {float(beta.min())}")
    shapes = [k.shape[:-2]] + [x.shape[:-1] for x in (g, beta) if x is not None]
    batch = check.batch_shape("k, g and beta", *shapes)
    k2 = launch.flat(k.expand(*batch, T, D), 2)
    g2 = None if g is None else launch.flat(g.expand(*batch, T), 1)
    b2 = None if beta is None else launch.flat(beta.expand(*batch, T), 1)
    N = k2.shape[0]
    out = launch.empty_out((N, T), torch.float32, k.device)
    if N and T:
        for s, n in launch.launches(N):
            frobenius_kernel[(n,)](
                k2[s:],
                (g2 if g2 is not None else k2)[s:],
                (b2 if b2 is not None else k2)[s:],
                out[s:],
                T,
                D=D,
                BLOCK_D=launch.block(D),
                C=chunk_size,
                BLOCK_C=launch.block(chunk_size),
                HAS_G=g2 is not None,
                HAS_B=b2 is not None,
                num_warps=16 if D > 64 else 4,
            )
    launch.finite_result(
        out, k=k, **({} if g is None else {"g": g}), **({} if beta is None else {"beta": beta})
    )
    if out.numel() and not bool(torch.isfinite(out).all()):  # finite inputs: the norm overflowed
        check_frobenius(torch.where(torch.isfinite(out), torch.ones_like(out), out))
    return out.reshape(*batch, T)
