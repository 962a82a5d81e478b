"""The backward's chunk carry as one Triton kernel (kernels/gka_layer_bwd.py, ``P_end`` and ``Q_end``).

What the chunks after chunk n contribute to its cotangent sums, seen from its last token:

    E_{NC-1} = 0,    E_n = zeta^{n+1}_C E_{n+1} + delta_{n+1}                      (carry)

(``zeta^n_C = exp(G_C)`` of chunk n, the product of its gates; 1 without a gate), the reverse
of the chunk-state walk of the forward. :func:`kernels.gka_layer_bwd._carry_backwards` computes
it with one PyTorch step per chunk: two elementwise launches on a ``(N, D, D)`` slice per chunk
and state, about 512 launches at GKA's size (T = 4096, C = 32), most of the backward's time on
the GPU. Here one program per (sequence, block of entries) walks the chunks backwards with the
carry in registers: each ``delta`` entry is read once and each ``E`` entry written once. The
arithmetic per entry is the loop's, ``zeta * E + delta`` in float32 in the same order (the GPU
may fuse it into one FMA, which rounds once instead of twice).

Of ``P_end`` the gradients need only ``P_end + P_end^T`` (kernels/gka_layer_bwd.py), and its
chunk term is ``delta + c S`` with S the chunk-start state: :func:`symmetric_carry` walks square
tiles of that symmetric sum, adding ``delta + delta^T + c (S + S^T)`` as it goes, so that neither
``delta + c S`` nor ``P_end`` is written (two passes over ``(N, NC, D, D)`` float32 tensors fewer
than forming them, and one product ``K Sigma`` instead of ``K P^T`` and ``K P``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CARRY_BLOCK = 1024  # entries of a state per program: a (128, 128) state is 16 programs per sequence
SYM_TILE = 32  # edge of the square tiles of the symmetric carry: a (128, 128) state is 10 programs


@triton.jit
def carry_kernel(p_delta, p_decay, p_out, NC, SIZE, HAS_DECAY: tl.constexpr, BLOCK: tl.constexpr):
    i_n = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = o < SIZE
    b_E = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(NC):
        n = NC - 1 - step
        base = (i_n * NC + n) * SIZE
        tl.store(p_out + base + o, b_E, mask=m)
        b_d = tl.load(p_delta + base + o, mask=m, other=0.0)
        if HAS_DECAY:
            b_E = tl.load(p_decay + i_n * NC + n) * b_E + b_d
        else:
            b_E = b_E + b_d


def carry_backwards(delta: torch.Tensor, decay_last: torch.Tensor) -> torch.Tensor:
    """``E_n = sum_{m > n} (prod_{n < l < m} zeta^l_C) delta_m`` for float32 ``delta``
    ``(N, NC, a, b)`` and ``decay_last`` ``(N, NC)`` (module docstring); the same result as
    ``kernels.gka_layer_bwd._carry_backwards``. ``decay_last`` may be None (no gate)."""
    if delta.dtype != torch.float32:
        raise TypeError(f"delta must be float32, got {delta.dtype}")
    N, NC = delta.shape[:2]
    size = delta[0, 0].numel()
    delta = delta.contiguous()
    out = torch.empty_like(delta)
    if N == 0 or NC == 0 or size == 0:
        return out.zero_()
    has_decay = decay_last is not None
    decay = decay_last.to(torch.float32).contiguous() if has_decay else delta
    carry_kernel[(N, triton.cdiv(size, CARRY_BLOCK))](
        delta, decay, out, NC, size, HAS_DECAY=has_decay, BLOCK=CARRY_BLOCK, num_warps=4
    )
    return out


@triton.jit
def symmetric_carry_kernel(
    p_delta, p_S, p_c, p_decay, p_out, NC, D, HAS_DECAY: tl.constexpr, BT: tl.constexpr
):
    # tile (ti, tj), ti <= tj, of Sigma_n = E_n + E_n^T for the carry E of delta_m + c_m S_m:
    #   Sigma_{n-1} = zeta^n_C Sigma_n + (delta_n + delta_n^T) + c_n (S_n + S_n^T);
    # the tile and its mirror image are written, so each entry is carried once
    i_n = tl.program_id(0).to(tl.int64)
    ti = tl.program_id(1)
    tj = tl.program_id(2)
    if ti <= tj:
        o_i = ti * BT + tl.arange(0, BT)
        o_j = tj * BT + tl.arange(0, BT)
        m = (o_i < D)[:, None] & (o_j < D)[None, :]
        at = o_i[:, None] * D + o_j[None, :]  # [i, j]
        mirror = o_j[None, :] * D + o_i[:, None]  # [i, j] -> entry (j, i)
        b_E = tl.zeros([BT, BT], dtype=tl.float32)
        for step in range(NC):
            n = NC - 1 - step
            base = (i_n * NC + n) * D * D
            tl.store(p_out + base + at, b_E, mask=m)
            if ti != tj:
                tl.store(p_out + base + mirror, b_E, mask=m)
            b_d = tl.load(p_delta + base + at, mask=m, other=0.0)
            b_d += tl.load(p_delta + base + mirror, mask=m, other=0.0)
            b_s = tl.load(p_S + base + at, mask=m, other=0.0)
            b_s += tl.load(p_S + base + mirror, mask=m, other=0.0)
            b_d += tl.load(p_c + i_n * NC + n) * b_s
            if HAS_DECAY:
                b_E = tl.load(p_decay + i_n * NC + n) * b_E + b_d
            else:
                b_E = b_E + b_d


def symmetric_carry(
    delta: torch.Tensor, S: torch.Tensor, c: torch.Tensor, decay_last
) -> torch.Tensor:
    """``Sigma_n = E_n + E_n^T``, E the carry of ``delta_m + c_m S_m`` (module docstring): what
    the backward needs of ``P_end`` (kernels/gka_layer_bwd.py), formed without writing the sum
    ``delta + c S`` or ``P_end`` itself. delta, S float32 ``(N, NC, D, D)``; c, decay_last
    ``(N, NC)`` (decay_last may be None: no gate). The same result as
    ``P + P^T`` with ``P = kernels.gka_layer_bwd._carry_backwards(delta + c S, decay_last)``,
    up to float32 rounding in another order."""
    for name, t in (("delta", delta), ("S", S)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
    N, NC, D = delta.shape[:3]
    if delta.shape != S.shape or delta.shape[-1] != D:
        raise ValueError(
            f"delta and S must be (N, NC, D, D) alike, got {tuple(delta.shape)} and {tuple(S.shape)}"
        )
    delta, S = delta.contiguous(), S.contiguous()
    out = torch.empty_like(delta)
    if N == 0 or NC == 0 or D == 0:
        return out.zero_()
    has_decay = decay_last is not None
    c = c.to(torch.float32).contiguous()
    decay = decay_last.to(torch.float32).contiguous() if has_decay else c
    nt = triton.cdiv(D, SYM_TILE)
    symmetric_carry_kernel[(N, nt, nt)](
        delta, S, c, decay, out, NC, D, HAS_DECAY=has_decay, BT=SYM_TILE, num_warps=4
    )
    return out
