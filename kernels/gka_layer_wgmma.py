"""The GKA solve stage on Hopper's warp-group MMA, written in Gluon: ``kernels.gka_solve``'s fast path.

Contract ``bfloat16/operands``, as ``chebyshev_rows`` in kernels/gka_layer_fwd.py: float32
iterate, residual and accumulators, the product operands (the scaled iterate, the masked chunk
product, the state) rounded to bf16. What differs is the layout, chosen by hand where Triton's
``tl.dot`` could not be steered (docs/performance.md):

* one program of one warp group (4 warps) per chunk of C = 64 tokens: every product is one
  warp-group MMA tile of 64 rows (``HGMMA`` 64 x N x 16), with the state S, the keys K and q in
  shared memory for the whole chunk (read by the tensor cores directly) and the float32 tiles
  in registers, 255 a thread, so that two programs share an SM;
* per step: the operand ``z = s x`` stored once in bf16 (two buffers, so one barrier a step),
  ``P = z K^T`` and ``z S`` issued together, ``A = mask(P)`` in bf16 straight from registers into
  ``+= A K``, and meanwhile the part of the update that does not wait for the products;
* the iterate carried is ``z_c = s_c x_c`` (s_c = 2 / (L_c + mu_c), GKA Algorithm 1's step),
  the operand before its rounding, so no product waits for a rescaling:

      z <- w (1 - s lambda) z - (w - 1) z_prev + (w s^2) q - (w s) (z S + A K),

  and ``x = z / s`` at the end. In exact arithmetic this is the Triton kernel's recurrence times
  s_c; in float32 it rounds in different places (the forward bound covers both, tested on the
  GPU).

The backward's dq (eq. (6): the same r steps with the cotangent dx in place of q) runs on this
kernel too, with dx kept in float32 in shared memory (``RHS_F32``), as the Triton kernel keeps
it.

Before the loop the program computes ``||H_t||_F`` by eq. (5) without gates (``||S||_F^2 +
2 sum_{j<=c} k_j^T S k_j + sum_{i,j<=c} (k_i . k_j)^2``, the products with the loop's bf16
operands) and raises the flags of the Triton kernel (a non-finite q or k, ``H_t = 0`` at a
token, a non-finite x). It covers no gates, no input gate, D = 128, bf16 inputs and a GPU with
warp-group MMA (sm_90); :func:`supported` says when, and elsewhere kernels.gka_layer runs the
Triton kernel. Gluon has no CPU interpreter, so this kernel is tested on the GPU only
(tests/test_kernels_gka_layer.py), against the float64 reference and the Triton kernel.
"""

from __future__ import annotations

import torch

# Gluon's API still changes between Triton releases: the kernel runs only on the versions it was
# compiled and tested with on the GPU (docs/validation.md); elsewhere the Triton kernel runs.
TESTED_TRITON = ("3.6.",)

try:  # Gluon is experimental: absent from older Triton, and it has no CPU interpreter
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    AVAILABLE = True
except Exception:  # noqa: BLE001 - any import failure means: not available here
    AVAILABLE = False

CHUNK = 64  # tokens a program: one warp-group MMA tile of rows
WARPS = 4  # one warp group
DIM = 128  # key dimension D the layouts are written for


def supported(q: torch.Tensor, has_gates: bool, contract: str, v=None) -> bool:
    """Whether :func:`solve_chunks_wgmma` runs this call: contract bfloat16/operands, bf16 inputs,
    D (and Dv, for the layer) = 128, no gates, a CUDA device of compute capability 9.x, Gluon
    importable from a Triton version in TESTED_TRITON."""
    return (
        AVAILABLE
        and triton.__version__.startswith(TESTED_TRITON)
        and (v is None or v.shape[-1] == DIM)
        and contract == "bfloat16/operands"
        and not has_gates
        and q.dtype == torch.bfloat16
        and q.shape[-1] == DIM
        and q.is_cuda
        and torch.cuda.get_device_capability(q.device)[0] == 9
    )


if AVAILABLE:

    @gluon.jit
    def _nonfinite(x):
        """1 if some entry of ``x`` is NaN or infinite, else 0 (``x - x`` is 0 only for finite x)."""
        f = x.to(gl.float32)
        return gl.max(gl.max(gl.where(f - f != 0.0, 1, 0), axis=1), axis=0)

    @gluon.jit
    def _prefix(v, lower, layout: gl.constexpr):
        """``out_c = sum_{j <= c} v_j`` for a [C] vector ``v``: the masked row sums of a [C, C]
        tile in ``layout`` (lower[c, j] = j <= c)."""
        vj = gl.convert_layout(v, gl.SliceLayout(0, layout))
        return gl.sum(gl.where(lower, vj[None, :], 0.0), axis=1)

    @gluon.jit
    def wgmma_solve_kernel(
        p_q,
        p_k,
        p_v,
        p_H,
        p_U,
        p_fro,
        p_x,
        p_y,
        p_flag,
        T,
        NC,
        iters,
        step_scale,
        rho2,
        step_lam,
        D: gl.constexpr,
        C: gl.constexpr,
        SQRT: gl.constexpr,
        HAS_Y: gl.constexpr,
        RHS_F32: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        # float32 tiles [C, D] and [C, C] in the warp-group MMA layout (one group: warps [4, 1])
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
        )
        att_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, C, 16]
        )
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
        ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        sl_S: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, D], gl.bfloat16)
        sl_K: gl.constexpr = gl.NVMMASharedLayout.get_default_for([C, D], gl.bfloat16)
        sl_Q32: gl.constexpr = gl.NVMMASharedLayout.get_default_for([C, D], gl.float32)

        i_n = gl.program_id(0).to(gl.int64)
        i_c = gl.program_id(1).to(gl.int64)
        base = i_n * NC + i_c
        row0 = i_n * NC * C + i_c * C

        # the state, the keys and q into shared memory, once (q is read again each step: in
        # registers it would cost the second program per SM)
        o_r = gl.arange(0, D, layout=gl.SliceLayout(1, ld_l))
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
        S = gl.load(p_H + base * D * D + o_r[:, None] * D + o_d[None, :])
        Sf = S.to(gl.float32)
        ss = gl.sum(gl.sum(Sf * Sf, axis=1), axis=0)  # ||S||_F^2
        s_S = gl.allocate_shared_memory(gl.bfloat16, [D, D], sl_S, S)
        o_t = gl.arange(0, C, layout=gl.SliceLayout(1, ld_l))
        ld_offs = (row0 + o_t)[:, None] * D + o_d[None, :]
        K = gl.load(p_k + ld_offs)
        Qb = gl.load(p_q + ld_offs)
        flag = _nonfinite(K) | _nonfinite(Qb)
        s_K = gl.allocate_shared_memory(gl.bfloat16, [C, D], sl_K, K)
        if RHS_F32:  # the backward's cotangent (float32): kept as it is, 16 KB more a program
            s_Q = gl.allocate_shared_memory(gl.float32, [C, D], sl_Q32, Qb)
        else:
            s_Q = gl.allocate_shared_memory(gl.bfloat16, [C, D], sl_K, Qb)
        s_Z = gl.allocate_shared_memory(gl.bfloat16, [2, C, D], sl_K)  # the operand, two buffers
        fence_async_shared()
        gl.thread_barrier()

        a_t = gl.arange(0, C, layout=gl.SliceLayout(1, acc_l))
        a_d = gl.arange(0, D, layout=gl.SliceLayout(0, acc_l))
        c_t = gl.arange(0, C, layout=gl.SliceLayout(1, att_l))
        c_j = gl.arange(0, C, layout=gl.SliceLayout(0, att_l))
        lower = c_t[:, None] >= c_j[None, :]
        P0 = gl.zeros([C, C], gl.float32, att_l)

        # eq. (5) without gates: ||H_c||_F^2 = ||S||_F^2 + 2 sum_{j<=c} k_j^T S k_j
        #   + sum_{i, j <= c} (k_i . k_j)^2, the products with the same bf16 operands as the loop
        KS = warpgroup_mma(s_K, s_S, gl.zeros([C, D], gl.float32, acc_l), use_acc=False)
        quad = gl.sum(KS * s_K.load(acc_l).to(gl.float32), axis=1)  # k_j^T S k_j
        G = warpgroup_mma(s_K, s_K.permute((1, 0)), P0, use_acc=False)  # k_i . k_j
        W = G * G
        # sum_{i, j <= c} W_ij = prefix over m of e_m = W_mm + 2 sum_{j < m} W_mj (W symmetric;
        # the float32 sums run in another order than the Triton kernel's, so ||H||_F differs
        # from it by rounding, about 1e-7)
        e = gl.sum(gl.where(c_t[:, None] > c_j[None, :], 2.0 * W, gl.where(lower, W, 0.0)), axis=1)
        fro = ss + 2.0 * gl.convert_layout(_prefix(quad, lower, att_l), gl.SliceLayout(1, att_l))
        fro = fro + _prefix(e, lower, att_l)
        if SQRT:
            fro = gl.sqrt(fro)
        gl.store(p_fro + row0 + c_t, fro)
        real_c = (i_c * C + c_t) < T
        flag |= gl.max(gl.where(real_c & ~(fro > 0.0), 4, 0), axis=0)

        # GKA Algorithm 1 on z = s x (module docstring): -s q and the rescaling move out of the
        # products' way, and the update's first part runs while the tensor cores do
        s = gl.convert_layout(step_scale / fro, gl.SliceLayout(1, acc_l))
        Z = s_Q.load(acc_l).to(gl.float32) * s[:, None]  # x_0 = s q, as chebyshev_rows
        Z = Z * s[:, None]
        Zp = gl.zeros([C, D], gl.float32, acc_l)
        zero = gl.zeros([C, D], gl.float32, acc_l)
        w = step_scale * 0.0 + 2.0
        for i in range(iters):
            w = 4.0 / (4.0 - rho2 * w)  # solvers.omega_schedule, as chebyshev_rows
            # a buffer is written again two steps later, after the barrier below has seen
            # every product of the step between read it
            b_Z = s_Z.index(i % 2)
            b_Z.store(Z.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            P = warpgroup_mma(b_Z, s_K.permute((1, 0)), P0, use_acc=False, is_async=True)
            acc = warpgroup_mma(b_Z, s_S, zero, use_acc=False, is_async=True)
            P = warpgroup_mma_wait(num_outstanding=1, deps=(P,))
            A = gl.convert_layout(gl.where(lower, P, 0.0).to(gl.bfloat16), dot_a)
            acc = warpgroup_mma(A, s_K, acc, is_async=True)
            ws = w * s
            t = (w * (1.0 - step_lam)) * Z - (w - 1.0) * Zp
            t = t + (ws * s)[:, None] * s_Q.load(acc_l).to(gl.float32)
            Zp = Z
            res = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            Z = t - ws[:, None] * res
        X = Z / s[:, None]

        Xo = X.to(p_x.dtype.element_ty)
        gl.store(p_x + (row0 + a_t)[:, None] * D + a_d[None, :], Xo)
        # flag 8: a non-finite x at a real token (padding tokens are stored, not checked)
        real = (i_c * C + a_t) < T
        Xf = gl.where(real[:, None], Xo.to(gl.float32), 0.0)
        flag |= 8 * _nonfinite(Xf)
        if HAS_Y:
            # y = X R^T + (M . X K^T) V with x as stored (as the Triton kernel): the value state R
            # and v take the places of S and q in shared memory, free after the loop
            gl.thread_barrier()
            # offsets formed again here rather than kept alive through the loop
            y_r = gl.arange(0, D, layout=gl.SliceLayout(1, ld_l))
            y_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
            y_t = gl.arange(0, C, layout=gl.SliceLayout(1, ld_l))
            R = gl.load(p_U + base * D * D + y_r[:, None] * D + y_d[None, :])
            Vb = gl.load(p_v + (row0 + y_t)[:, None] * D + y_d[None, :])
            flag |= 2 * _nonfinite(Vb)
            s_S.store(R)
            s_Q.store(Vb)
            b_Z = s_Z.index(iters % 2)
            b_Z.store(Xo.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            P = warpgroup_mma(b_Z, s_K.permute((1, 0)), P0, use_acc=False, is_async=True)
            Y = warpgroup_mma(b_Z, s_S.permute((1, 0)), zero, use_acc=False, is_async=True)
            P = warpgroup_mma_wait(num_outstanding=1, deps=(P,))
            A = gl.convert_layout(gl.where(lower, P, 0.0).to(gl.bfloat16), dot_a)
            Y = warpgroup_mma(A, s_Q, Y, is_async=True)
            Y = warpgroup_mma_wait(num_outstanding=0, deps=(Y,))
            Yo = Y.to(p_y.dtype.element_ty)
            gl.store(p_y + (row0 + a_t)[:, None] * D + a_d[None, :], Yo)
            flag |= 8 * _nonfinite(gl.where(real[:, None], Yo.to(gl.float32), 0.0))
        gl.store(p_flag + base, flag)


def emulate_solve(q: torch.Tensor, k: torch.Tensor, *, a: float, iters: int) -> torch.Tensor:
    """x of :func:`wgmma_solve_kernel` (no gates, chunks of CHUNK) in plain torch float32 on any
    device, operation by operation, for checks where Gluon cannot run (it has no interpreter):
    the chunk states ``K^T K`` accumulated in float32 and stored in bf16; eq. (5) summed as the
    kernel sums it; the scaled iterate ``z = s x`` carried in float32 and rounded to bf16 for
    ``z S`` and ``z K^T``; the masked product rounded to bf16 for ``A K``; ``x = z / s`` returned
    in bf16. q, k: bf16 ``(N, T, D)``. The products' float32 sums run in the order of the device's
    matmul, not the tensor cores' (both within the forward bound's gamma_m)."""
    N, T, D = q.shape
    C = CHUNK
    Tp = max(C, -(-T // C) * C)
    chunks = lambda t: torch.nn.functional.pad(t.float(), (0, 0, 0, Tp - T)).reshape(N, -1, C, D)  # noqa: E731
    Q, K = chunks(q), chunks(k)
    S, states = torch.zeros(N, D, D, device=q.device), []
    for c in range(K.shape[1]):
        states.append(S.to(torch.bfloat16).float())
        S = S + K[:, c].transpose(-1, -2) @ K[:, c]
    S = torch.stack(states, 1)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32, device=q.device)  # noqa: E731
    a = float(a)
    step_scale, rho2 = f32(2.0 / (1.0 + 2.0 * a)), f32((1.0 / (1.0 + 2.0 * a)) ** 2)
    step_lam = f32(2.0 / (1.0 + 2.0 * a) * a)
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    W = (K @ K.transpose(-1, -2)) ** 2
    e = torch.where(torch.tril(lower, -1), 2.0 * W, torch.where(lower, W, 0.0)).sum(-1)
    quad = ((K @ S) * K).sum(-1)
    fro = torch.sqrt((S * S).sum((-1, -2))[..., None] + 2.0 * quad.cumsum(-1) + e.cumsum(-1))
    s = (step_scale / fro)[..., None]
    Z, Zp, w = Q * s * s, torch.zeros_like(Q), f32(2.0)
    for _ in range(iters):
        w = 4.0 / (4.0 - rho2 * w)
        Zb = Z.to(torch.bfloat16).float()
        A = torch.where(lower, Zb @ K.transpose(-1, -2), 0.0).to(torch.bfloat16).float()
        res = Zb @ S + A @ K
        ws = w * s
        t = (w * (1.0 - step_lam)) * Z - (w - 1.0) * Zp + (ws * s) * Q
        Zp, Z = Z, t - ws * res
    return (Z / s).reshape(N, Tp, D)[:, :T].to(torch.bfloat16)


def emulate_layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, a: float, iters: int):
    """``(y, x)`` of :func:`wgmma_solve_kernel` with ``HAS_Y`` (the layer, no gates, chunks of
    CHUNK) in plain torch float32, operation by operation, as :func:`emulate_solve` for x: the
    value states ``V^T K`` accumulated in float32 and stored in bf16 (R, the state at each chunk
    start); ``Y = X R^T`` from the stored bf16 x, the masked product ``x K^T`` (diagonal included)
    rounded to bf16 and ``A V`` accumulated onto Y in float32; y and x returned in bf16. q, k, v:
    bf16 ``(N, T, D)``. The float32 sums run in the order of the device's matmul."""
    N, T, D = q.shape
    C = CHUNK
    Tp = max(C, -(-T // C) * C)
    chunks = lambda t: torch.nn.functional.pad(t.float(), (0, 0, 0, Tp - T)).reshape(
        N, -1, C, t.shape[-1]
    )  # noqa: E731
    K, V = chunks(k), chunks(v)
    x = emulate_solve(q, k, a=a, iters=iters)
    X = chunks(x)  # the stored bf16 x, exact in float32
    R, states = torch.zeros(N, v.shape[-1], D, device=q.device), []
    for c in range(K.shape[1]):
        states.append(R.to(torch.bfloat16).float())  # the chunk-start state, stored in bf16
        R = R + V[:, c].transpose(-1, -2) @ K[:, c]
    R = torch.stack(states, 1)
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    Y = X @ R.transpose(-1, -2)
    A = torch.where(lower, X @ K.transpose(-1, -2), 0.0).to(torch.bfloat16).float()
    Y = Y + A @ V
    return Y.reshape(N, Tp, -1)[:, :T].to(torch.bfloat16), x


def solve_chunks_wgmma(p, H0, U0=None, *, a, iters, x_dtype, y_dtype=None, sqrt=True, rhs=None):
    """``(x, y, fro, flags)`` for every chunk by :func:`wgmma_solve_kernel`: x ``(N, Tp, D)`` in
    ``x_dtype``; y ``(N, Tp, Dv)`` in ``y_dtype`` when U0 is given (the layer), else None; the
    float32 ``||H_t||_F`` (eq. (5)) ``(N, Tp)``; int32 flags ``(N, NC)`` with the bits of
    kernels/gka_layer_fwd.py. ``p``: kernels.gka_layer's prepared inputs in chunks of CHUNK
    tokens; H0, U0: the bf16 chunk-start states; ``sqrt=False`` takes lambda from
    ``||H_t||_F^2`` (the tests' broken variant); ``rhs``: a float32 right-hand side ``(N, Tp, D)``
    in place of q (the backward's cotangent; without U0)."""
    N, Tp, D = p.k.shape
    NC = Tp // p.C
    dev = p.k.device
    x = torch.empty((N, Tp, D), dtype=x_dtype, device=dev)
    y = None if U0 is None else torch.empty((N, Tp, D), dtype=y_dtype, device=dev)
    fro = torch.empty((N, Tp), dtype=torch.float32, device=dev)
    flags = torch.empty((N, NC), dtype=torch.int32, device=dev)
    a64 = float(a)
    step_scale = 2.0 / (1.0 + 2.0 * a64)  # 2/(L + mu) times ||H_t||_F, as the Triton kernel
    if N:
        wgmma_solve_kernel[(N, NC)](
            p.q if rhs is None else rhs,
            p.k,
            p.v if U0 is not None else p.k,
            H0,
            U0 if U0 is not None else H0,
            fro,
            x,
            y if y is not None else x,
            flags,
            p.T,
            NC,
            iters,
            step_scale,
            (1.0 / (1.0 + 2.0 * a64)) ** 2,
            step_scale * a64,
            D=D,
            C=p.C,
            SQRT=sqrt,
            HAS_Y=U0 is not None,
            RHS_F32=rhs is not None,
            num_warps=WARPS,
        )
    return x, y, fro, flags
