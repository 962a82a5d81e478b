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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CARRY_BLOCK = 1024  # entries of a state per program: a (128, 128) state is 16 programs per sequence


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
