"""Backward of the KLA / GDN chunkwise kernel: the chunked adjoint recurrence in Triton.

``kla_chunkwise_trainable`` is ``kernels.kla_chunkwise`` (the forward, unchanged) with a
backward, so that ``o.backward(...)`` reaches q, k, v, alpha, eta and the initial state.

The forward of one chunk (KLA Algorithm 1 right, Props. 3-4; docs/kla.md), written with the
chunk's *state-free* operands

    Qg = D_gamma Q^            Q^ = Diag(1/||q_i||) Q (or Q with normalize_queries=False)
    Kg = D_gamma K             Kr = Diag(gamma_C / gamma_j) K          gC = gamma_C
    X  = (I + L)^{-1} B        L = B (A^- . K K^T)                     (Prop. 3)
    Ph = A . Q^ K^T                                                    (Prop. 4)

is linear in the incoming state S_0 and the values:

    R = V - Kg S_0,   U = X R,   O = Qg S_0 + Ph U,   S_C = gC S_0 + Kr^T U       (eqs. (7)-(9))

Its adjoint, chunk by chunk from the last (dS_C: the cotangent of the outgoing state, dO of
the outputs), is the *chunked adjoint recurrence*

    dU = Ph^T dO + Kr dS_C,   dR = X^T dU,   dV = dR
    dS_0 = Qg^T dO + gC dS_C - Kg^T dR                                   (carried to the chunk before)

and the cotangents of the state-free operands are outer products along it:

    dQg = dO S_0^T,  dPh = dO U^T,  dKr = U dS_C^T,  dX = dU R^T,  dKg = -dR S_0^T,  dgC = <S_0, dS_C>.

Two Triton kernels, one program per (head, block of d_v columns) like the forward's
recurrence: ``states_kernel`` replays the forward and stores every chunk's incoming state;
``adjoint_kernel`` walks the chunks backwards with dS in float32 registers, writes dV, dS_0
of the first chunk and, per chunk, the column-block partial sums of the operand cotangents
(summed over the d_v blocks on the host). The map from (q, k, alpha, eta) to the state-free
operands has no recurrence -- every chunk is independent -- and is differentiated by
autograd of its batched float32 torch form (:func:`chunk_operands`): the triangular solve's
adjoint, the Gram and decay-mask products, the Kaczmarz coefficient ``eta / (||k||^2 + eps)``
(eq. (3)), the query normalisation and the cumulative log decay.

Precision contract: the forward's (``kernels.kla`` module docstring). Every product of the
two recurrences is a ``tl.dot`` accumulated in float32 with operands in the model
``input_precision`` (``"bf16"``, the bfloat16 default, rounds S_0, R, U, X, Ph, dO, dS, dU
and dR to bfloat16 at the GEMM boundary; ``"ieee"``, the float32 default, keeps float32
operands); the state, the adjoint state and all accumulations are float32; the chunk
operands and their autograd run in float32. Gradients are returned in the dtype of the
input they belong to. alpha and eta are used as the forward uses them, rounded to q's dtype;
their gradients pass that rounding unchanged (the derivative of the rounded value is taken
as 1, so dalpha is the gradient at the rounded gate).

Restrictions (errors, not silent): per-head decay only (alpha ``(..., T, H)`` or a float);
``bf16_mode="storage"`` as the forward.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from solvers.kla import broadcast_gate

from . import _launch as launch
from .kla import PRECISIONS, RUNTIME_LENGTHS, _arguments, kla_chunkwise, mm

# ----------------------------------------------------------------------------- operands


def _pad_time(x: torch.Tensor, Tp: int, value: float = 0.0) -> torch.Tensor:
    """``(N, T, ...)`` padded along T to Tp."""
    pad = [0, 0] * (x.ndim - 2) + [0, Tp - x.shape[1]]
    return torch.nn.functional.pad(x, pad, value=value)


def chunk_operands(
    q, k, alpha, eta, *, eps: float, chunk_size: int, kaczmarz: bool, normalize: bool
):
    """The state-free chunk operands of the module docstring, float32, differentiable.

    q, k ``(N, T, H, d_k)``; alpha, eta ``(N, T, H)``. T is padded to a multiple of C by
    tokens with k = q = 0, decay 1 and no write. Returns ``(Qg, Kg, Kr, X, Ph, gC)`` with
    ``Qg, Kg, Kr (N H, NT, C, d_k)``, ``X, Ph (N H, NT, C, C)``, ``gC (N H, NT)``."""
    N, T, H, DK = k.shape
    C = chunk_size
    NT = -(-T // C)
    Tp = NT * C

    def chunks(x):  # (N, Tp, H, ...) -> (N H, NT, C, ...)
        x = x.movedim(2, 1)
        return x.reshape(N * H, NT, C, *x.shape[3:])

    qf, kf = q.float(), k.float()
    if normalize:
        qn = qf.norm(dim=-1, keepdim=True)
        qf = qf / torch.where(qn > 0, qn, torch.ones_like(qn))
    Q, K = chunks(_pad_time(qf, Tp)), chunks(_pad_time(kf, Tp))
    la = chunks(_pad_time(torch.log(alpha.float()), Tp))  # log 1 = 0 on the padding
    g = la.cumsum(-1)
    e = chunks(_pad_time(eta.float(), Tp))
    if kaczmarz:  # eq. (3); a zero key with eps = 0 gets no write (solvers.kla)
        den = (K * K).sum(-1) + eps
        beta = torch.where(
            den > 0, e / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den)
        )
    else:
        beta = e
    idx = torch.arange(C, device=k.device)
    strict = idx[None, :] < idx[:, None]
    lower = idx[None, :] <= idx[:, None]
    diff = g.unsqueeze(-1) - g.unsqueeze(-2)  # g_i - g_j
    # masked differences are positive and never exponentiated
    A_strict = torch.exp(torch.where(strict, diff, torch.full_like(diff, -math.inf)))
    A_lower = torch.exp(torch.where(lower, diff, torch.full_like(diff, -math.inf)))
    L = beta.unsqueeze(-1) * (A_strict * (K @ K.transpose(-1, -2)))
    eye = torch.eye(C, device=k.device, dtype=torch.float32)
    X = torch.linalg.solve_triangular(
        eye + L, torch.diag_embed(beta), upper=False, unitriangular=True
    )
    Ph = A_lower * (Q @ K.transpose(-1, -2))
    gam = torch.exp(g)
    g_last = g[..., -1:]
    Qg = Q * gam.unsqueeze(-1)
    Kg = K * gam.unsqueeze(-1)
    Kr = K * torch.exp(g_last - g).unsqueeze(-1)
    return Qg, Kg, Kr, X, Ph, torch.exp(g_last.squeeze(-1))


# ----------------------------------------------------------------------------- kernels


@triton.jit
def _tile(p, base, D: tl.constexpr, C: tl.constexpr, BD: tl.constexpr):
    """The contiguous (C, D) block at ``base`` as a [C, BD] tile, zero beyond D."""
    o_r = tl.arange(0, C)
    o_d = tl.arange(0, BD)
    return tl.load(p + base + o_r[:, None] * D + o_d[None, :], mask=(o_d < D)[None, :], other=0.0)


@triton.jit
def _tile_t(p, base, D: tl.constexpr, C: tl.constexpr, BD: tl.constexpr):
    """Its transpose, [BD, C], read transposed from memory.

    Every transposed operand is loaded this way (or written to scratch and read back
    transposed) rather than made by ``tl.trans`` of a register tile: a transposed product
    result fed to ``tl.dot`` is miscompiled on Hopper by Triton 3.4 to 3.7.0 (the bug behind
    flash-linear-attention's guard #640)."""
    o_r = tl.arange(0, C)
    o_d = tl.arange(0, BD)
    return tl.load(p + base + o_r[None, :] * D + o_d[:, None], mask=(o_d < D)[:, None], other=0.0)


@triton.jit
def _transposed(p_scr, x, R: tl.constexpr, Cc: tl.constexpr):
    """``x^T`` ([Cc, R] from an [R, Cc] tile) through this program's global scratch."""
    o_r = tl.arange(0, R)
    o_c = tl.arange(0, Cc)
    tl.debug_barrier()  # earlier readers of the scratch are done
    tl.store(p_scr + o_r[:, None] * Cc + o_c[None, :], x)
    tl.debug_barrier()  # the whole tile is written
    return tl.load(p_scr + o_r[None, :] * Cc + o_c[:, None])


@triton.jit
def _program(H, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr):
    """This program's (head, d_v block): ids and the chunk / d_k / d_v offsets."""
    NV: tl.constexpr = (DV + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    return (
        pid,
        i_v,
        i_nh,
        i_nh // H,
        i_nh % H,
        tl.arange(0, BK),
        i_v * BV + tl.arange(0, BV),
        tl.arange(0, C),
    )


@triton.jit(do_not_specialize=RUNTIME_LENGTHS)
def states_kernel(
    p_Kg,
    p_Kr,
    p_X,
    p_v,
    p_gC,
    p_h0,
    p_S,
    T,
    H,
    NT,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    HAS_H0: tl.constexpr,
    PREC: tl.constexpr,
):
    """The forward once more, storing the incoming state of every chunk (float32):
    ``R = V - Kg S``, ``U = X R``, ``S <- gC S + Kr^T U``."""
    pid, i_v, i_nh, i_n, i_h, o_k, o_v, o_c = _program(H, DV, BK, BV, C)
    m_state = (o_k < DK)[:, None] & (o_v < DV)[None, :]
    p_state = o_k[:, None] * DV + o_v[None, :]
    if HAS_H0:
        S = tl.load(p_h0 + i_nh * DK * DV + p_state, mask=m_state, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    for i_t in range(NT):
        i_c = i_nh * NT + i_t
        tl.store(p_S + i_c * DK * DV + p_state, S, mask=m_state)
        t = i_t * C + o_c
        m_t = t < T
        V = tl.load(
            p_v + ((i_n * T + t) * H + i_h)[:, None] * DV + o_v[None, :],
            mask=m_t[:, None] & (o_v < DV)[None, :],
            other=0.0,
        ).to(tl.float32)
        Kg = _tile(p_Kg, i_c * C * DK, DK, C, BK)
        KrT = _tile_t(p_Kr, i_c * C * DK, DK, C, BK)
        X = tl.load(p_X + i_c * C * C + o_c[:, None] * C + o_c[None, :])
        U = mm(X, V - mm(Kg, S, PREC), PREC)
        S = tl.load(p_gC + i_c) * S + mm(KrT, U, PREC)


@triton.jit(do_not_specialize=RUNTIME_LENGTHS)
def adjoint_kernel(
    p_Qg,
    p_Kg,
    p_Kr,
    p_X,
    p_Ph,
    p_v,
    p_gC,
    p_S,
    p_do,
    p_dht,
    p_dv,
    p_dh0,
    p_dQg,
    p_dKg,
    p_dKr,
    p_dX,
    p_dPh,
    p_dgC,
    p_scr,
    T,
    H,
    NT,
    NH,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    HAS_DHT: tl.constexpr,
    PREC: tl.constexpr,
):
    """The chunked adjoint recurrence (module docstring), chunks from last to first; the
    operand cotangents of d_v block ``i_v`` go to slice ``i_v`` of the partial buffers.
    Transposes: read transposed from memory, or through scratch (see :func:`_tile_t`)."""
    pid, i_v, i_nh, i_n, i_h, o_k, o_v, o_c = _program(H, DV, BK, BV, C)
    m_k = o_k < DK
    m_vv = o_v < DV
    m_state = m_k[:, None] & m_vv[None, :]
    p_state = o_k[:, None] * DV + o_v[None, :]
    p_state_t = o_k[None, :] * DV + o_v[:, None]  # the state block transposed, [BV, BK]
    m_state_t = m_k[None, :] & m_vv[:, None]
    p_scr = p_scr + pid * (BK * BV + C * BV)  # [BK, BV] then [C, BV] or [BV, C]
    if HAS_DHT:
        dS = tl.load(p_dht + i_nh * DK * DV + p_state, mask=m_state, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros([BK, BV], dtype=tl.float32)
    p_ck = o_c[:, None] * DK + o_k[None, :]
    p_cc = o_c[:, None] * C + o_c[None, :]
    p_cc_t = o_c[None, :] * C + o_c[:, None]
    m_ck = m_k[None, :] & (o_c >= 0)[:, None]
    for j in range(NT):
        i_t = NT - 1 - j
        i_c = i_nh * NT + i_t
        part = i_v * NH * NT + i_c  # this chunk's slot in the partial buffers
        t = i_t * C + o_c
        m_t = t < T
        p_tv = ((i_n * T + t) * H + i_h)[:, None] * DV + o_v[None, :]
        m_tv = m_t[:, None] & m_vv[None, :]
        V = tl.load(p_v + p_tv, mask=m_tv, other=0.0).to(tl.float32)
        dO = tl.load(p_do + p_tv, mask=m_tv, other=0.0).to(tl.float32)
        S0 = tl.load(p_S + i_c * DK * DV + p_state, mask=m_state, other=0.0)
        S0T = tl.load(p_S + i_c * DK * DV + p_state_t, mask=m_state_t, other=0.0)
        QgT = _tile_t(p_Qg, i_c * C * DK, DK, C, BK)
        Kg = _tile(p_Kg, i_c * C * DK, DK, C, BK)
        KgT = _tile_t(p_Kg, i_c * C * DK, DK, C, BK)
        Kr = _tile(p_Kr, i_c * C * DK, DK, C, BK)
        X = tl.load(p_X + i_c * C * C + p_cc)
        XT = tl.load(p_X + i_c * C * C + p_cc_t)
        PhT = tl.load(p_Ph + i_c * C * C + p_cc_t)
        gC = tl.load(p_gC + i_c)
        R = V - mm(Kg, S0, PREC)
        U = mm(X, R, PREC)
        dU = mm(PhT, dO, PREC) + mm(Kr, dS, PREC)
        dR = mm(XT, dU, PREC)
        tl.store(p_dv + p_tv, dR.to(p_dv.dtype.element_ty), mask=m_tv)
        tl.store(p_dQg + part * C * DK + p_ck, mm(dO, S0T, PREC), mask=m_ck)
        tl.store(p_dKg + part * C * DK + p_ck, -mm(dR, S0T, PREC), mask=m_ck)
        tl.store(
            p_dKr + part * C * DK + p_ck, mm(U, _transposed(p_scr, dS, BK, BV), PREC), mask=m_ck
        )
        tl.store(p_dX + part * C * C + p_cc, mm(dU, _transposed(p_scr + BK * BV, R, C, BV), PREC))
        tl.store(p_dPh + part * C * C + p_cc, mm(dO, _transposed(p_scr + BK * BV, U, C, BV), PREC))
        tl.store(p_dgC + part, tl.sum(tl.sum(tl.where(m_state, S0 * dS, 0.0), axis=1), axis=0))
        dS = mm(QgT, dO, PREC) + gC * dS - mm(KgT, dR, PREC)
    tl.store(p_dh0 + i_nh * DK * DV + p_state, dS, mask=m_state)


# ----------------------------------------------------------------------------- host side


def _block_v(DV: int) -> int:
    """d_v columns per program: all of them under the interpreter (fewest programs), 32 on a
    GPU (the adjoint keeps about a dozen C x BV and d_k x BV tiles live)."""
    return launch.block(DV) if launch.interpreting() else min(32, launch.block(DV))


def _warps(BK: int) -> int:
    """Warps per program of the adjoint kernels: 8 at d_k = 128 on a GPU, else 4."""
    return 8 if BK >= 128 and not launch.interpreting() else 4


def chunk_adjoint(ops, v, h0, do, dht, *, chunk_size: int, prec: str):
    """Run both kernels. ``ops`` = :func:`chunk_operands`' outputs (detached, contiguous);
    v, do ``(N, T, H, d_v)``; h0, dht ``(N, H, d_k, d_v)`` or None. Returns ``dv (float32),
    dh0 (float32)`` and the cotangents of ``(Qg, Kg, Kr, X, Ph, gC)``."""
    Qg, Kg, Kr, X, Ph, gC = ops
    if prec == "bf16":  # the bf16 model rounds these operands at every product: store them so
        Qg, Kg, Kr, X, Ph = (x.to(torch.bfloat16) for x in (Qg, Kg, Kr, X, Ph))
    N, T, H, DV = v.shape
    NH, NT, C, DK = Kg.shape
    BK, BV = launch.block(DK), _block_v(DV)
    warps = _warps(BK)
    # num_stages=1: no software pipelining of the chunk loops. The H200 faults at d_k = 128
    # were not pipelining: they are C = 64 wgmma products (see _wgmma_miscompiled).
    NV = triton.cdiv(DV, BV)
    dev = v.device
    f32 = dict(dtype=torch.float32, device=dev)
    S = torch.empty((NH, NT, DK, DV), **f32)
    grid = (NH * NV,)
    P = PRECISIONS[prec]
    states_kernel[grid](
        Kg,
        Kr,
        X,
        v,
        gC,
        h0 if h0 is not None else v,
        S,
        T,
        H,
        NT,
        DK=DK,
        DV=DV,
        BK=BK,
        BV=BV,
        C=C,
        HAS_H0=h0 is not None,
        PREC=P,
        num_warps=warps,
        num_stages=1,
    )
    dv = torch.empty((N, T, H, DV), **f32)
    dh0 = torch.empty((NH, DK, DV), **f32)
    dQg = torch.empty((NV, NH, NT, C, DK), **f32)
    dKg, dKr = torch.empty_like(dQg), torch.empty_like(dQg)
    dX = torch.empty((NV, NH, NT, C, C), **f32)
    dPh = torch.empty_like(dX)
    dgC = torch.empty((NV, NH, NT), **f32)
    scratch = torch.empty((NH * NV, BK * BV + C * BV), **f32)
    adjoint_kernel[grid](
        Qg,
        Kg,
        Kr,
        X,
        Ph,
        v,
        gC,
        S,
        do,
        dht if dht is not None else do,
        dv,
        dh0,
        dQg,
        dKg,
        dKr,
        dX,
        dPh,
        dgC,
        scratch,
        T,
        H,
        NT,
        NH,
        DK=DK,
        DV=DV,
        BK=BK,
        BV=BV,
        C=C,
        HAS_DHT=dht is not None,
        PREC=P,
        num_warps=warps,
        num_stages=1,
    )
    return dv, dh0, tuple(x.sum(0) for x in (dQg, dKg, dKr, dX, dPh, dgC))


def _time_chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """``(N, T, H, D)`` -> ``(N H, NT, C, D)``, T zero-padded to a multiple of C."""
    N, T, H, D = x.shape
    NT = -(-T // C)
    return _pad_time(x, NT * C).movedim(2, 1).reshape(N * H, NT, C, D)


def _time_unchunk(x: torch.Tensor, N: int, T: int, H: int) -> torch.Tensor:
    """Inverse of :func:`_time_chunks`."""
    return x.reshape(N, H, -1, x.shape[-1])[:, :, :T].movedim(1, 2)


def chunk_adjoint_torch(ops, v, h0, do, dht, *, chunk_size: int, late_query_state: bool = False):
    """:func:`chunk_adjoint` in plain float32 torch, chunk by chunk: the specification the
    kernels are tested against. ``late_query_state=True`` is a deliberately wrong variant
    (dQg from the state one chunk late) for the strategy's discrimination tests."""
    Qg, Kg, Kr, X, Ph, gC = ops
    N, T, H, DV = v.shape
    NH, NT, C, DK = Kg.shape
    V, dO = _time_chunks(v.float(), C), _time_chunks(do.float(), C)
    S = torch.zeros(NH, DK, DV, device=v.device) if h0 is None else h0.reshape(NH, DK, DV).float()
    states = []
    for c in range(NT):
        states.append(S)
        U = X[:, c] @ (V[:, c] - Kg[:, c] @ S)
        S = gC[:, c, None, None] * S + Kr[:, c].transpose(-1, -2) @ U
    states.append(S)
    dS = torch.zeros_like(S) if dht is None else dht.reshape(NH, DK, DV).float()
    dV = torch.zeros_like(V)
    cot = [torch.zeros_like(x) for x in ops]
    for c in range(NT - 1, -1, -1):
        S0 = states[c]
        R = V[:, c] - Kg[:, c] @ S0
        U = X[:, c] @ R
        dU = Ph[:, c].transpose(-1, -2) @ dO[:, c] + Kr[:, c] @ dS
        dR = X[:, c].transpose(-1, -2) @ dU
        dV[:, c] = dR
        S_q = states[c + 1] if late_query_state else S0
        for i, val in enumerate(
            (
                dO[:, c] @ S_q.transpose(-1, -2),
                -dR @ S0.transpose(-1, -2),
                U @ dS.transpose(-1, -2),
                dU @ R.transpose(-1, -2),
                dO[:, c] @ U.transpose(-1, -2),
                (S0 * dS).sum((-2, -1)),
            )
        ):
            cot[i][:, c] = val
        dS = (
            Qg[:, c].transpose(-1, -2) @ dO[:, c]
            + gC[:, c, None, None] * dS
            - Kg[:, c].transpose(-1, -2) @ dR
        )
    return _time_unchunk(dV, N, T, H), dS, tuple(cot)


# Deliberately wrong backward variants: the gradient strategy must catch each
# (tests/test_harness_gradients.py). Never used unless asked for by name.
BROKEN_VARIANTS = {
    "dg_sign": "dg with the wrong sign",
    "dk_decay": "the decay ratio gamma_C / gamma_j missing in dk's term from the state update K^T Diag(.) U",
    "dbeta_unnormalised": "deta from the unnormalised key (missing the 1 / (||k||^2 + eps) of eq. (3))",
    "dq_late": "dq from the state one chunk late",
}


class _Trainable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, alpha, eta, h0, opts, back):
        o, S = kla_chunkwise(
            q, k, v, alpha=alpha, eta=eta, initial_state=h0, return_final_state=True, **opts
        )
        ctx.save_for_backward(q, k, v, alpha, eta, h0)
        ctx.opts = {**opts, **back}
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        q, k, v, alpha, eta, h0 = ctx.saved_tensors
        opts = ctx.opts
        C = opts["chunk_size"]
        N, T, H, DK = k.shape
        if N * T * H * DK * v.shape[-1] == 0:
            # nothing reached the kernels (their reshapes need a token and a feature): zero
            # gradients, and dS_0 = dS_T, as the reference's -- with no token S_T is S_0 (else
            # the state is empty)
            dh0 = None if h0 is None else dS.reshape(h0.shape).to(h0.dtype)
            return (*(torch.zeros_like(x) for x in (q, k, v, alpha, eta)), dh0, None, None)
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(True) for x in (q, k, alpha, eta)]
            ops = chunk_operands(
                *leaves,
                eps=opts["eps"],
                chunk_size=C,
                kaczmarz=opts["coefficient"] == "kaczmarz",
                normalize=opts["normalize_queries"],
            )
            flat = lambda x: x.reshape(N, T, H, -1).contiguous()  # noqa: E731
            args = (
                tuple(x.detach().contiguous() for x in ops),
                flat(v),
                None if h0 is None else h0.reshape(N, H, *h0.shape[-2:]).contiguous(),
                flat(do if do is not None else torch.zeros_like(v)).contiguous(),
                None if dS is None else dS.reshape(N, H, *dS.shape[-2:]).contiguous(),
            )
            variant = opts.get("variant")
            if opts.get("adjoint", "triton") == "torch" or variant == "dq_late":
                dv, dh0, cot = chunk_adjoint_torch(
                    *args, chunk_size=C, late_query_state=variant == "dq_late"
                )
            else:
                dv, dh0, cot = chunk_adjoint(*args, chunk_size=C, prec=opts["input_precision"])
            grads = torch.autograd.grad(ops, leaves, cot, allow_unused=True)
        dq, dk, dalpha, deta = (
            torch.zeros_like(x) if gr is None else gr for x, gr in zip((q, k, alpha, eta), grads)
        )
        if variant is not None:
            dk, dalpha, deta = _break(variant, dk, dalpha, deta, k, alpha, cot[2], opts)
        dq, dk, dalpha, deta = (
            gr.to(x.dtype) for x, gr in zip((q, k, alpha, eta), (dq, dk, dalpha, deta))
        )
        dh0_out = None if h0 is None else dh0.reshape(h0.shape).to(h0.dtype)
        return dq, dk, dv.reshape(v.shape).to(v.dtype), dalpha, deta, dh0_out, None, None


def _break(variant, dk, dalpha, deta, k, alpha, dKr, opts):
    """Apply one of :data:`BROKEN_VARIANTS` to correct gradients."""
    if variant == "dg_sign":
        return dk, -dalpha, deta
    if variant == "dk_decay":  # dK received r_j dKr_j from the state update; make it dKr_j
        N, T, H, _ = k.shape
        C = opts["chunk_size"]
        g = _time_chunks(torch.log(alpha.float()).unsqueeze(-1), C).squeeze(-1).cumsum(-1)
        r = torch.exp(g[..., -1:] - g).unsqueeze(-1)
        return dk + _time_unchunk((1.0 - r) * dKr, N, T, H), dalpha, deta
    if variant == "dbeta_unnormalised":
        return dk, dalpha, deta * (k.float().pow(2).sum(-1) + opts["eps"])
    if variant == "dq_late":
        return dk, dalpha, deta
    raise ValueError(f"variant must be one of {tuple(BROKEN_VARIANTS)}, got {variant!r}")


def _wgmma_miscompiled(device, chunk_size: int, prec: str) -> bool:
    """The Triton adjoint is known to be miscompiled for this device and configuration: a
    Hopper GPU (compute capability 9.x), C = 64 (every chunk product a wgmma instruction; at
    C = 32 nearly all are mma.sync) and tensor-core operands. Measured on an H200 with Triton 3.6
    (benchmarks/kla_fault_sweep.py): at C = 64 in bf16, 8 of the 9 cases reached faulted or gave
    gradients off by O(1); at C = 16 and 32 every case, bf16 and float32, was correct.
    float32 ("ieee": CUDA-core products) at C = 64 was not reached."""
    return (
        device.type == "cuda"
        and chunk_size == 64
        and prec != "ieee"
        and torch.cuda.get_device_capability(device)[0] == 9
    )


def kla_chunkwise_trainable(
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
    input_precision=None,
    check_inputs=True,
    adjoint=None,
    broken_variant=None,
):
    """``kernels.kla_chunkwise`` (same arguments and checks, returns ``(o, S_T)``) with a
    backward: the chunked adjoint recurrence of the module docstring, in the forward's
    precision contract. Differentiable in q, k, v, alpha, eta (per-head tensors
    ``(..., T, H)`` or floats) and initial_state. ``check_inputs``: as the forward's (the
    backward reads no flags).

    ``adjoint="torch"`` runs the recurrence in plain torch (:func:`chunk_adjoint_torch`, the
    specification the kernels are tested against), ``"triton"`` in the Triton kernels; the
    default is "triton" under the interpreter and "torch" on a CUDA device. On a Hopper GPU
    (compute capability 9.x) the Triton adjoint is refused at ``chunk_size=64`` with tensor-core
    products (``input_precision`` other than "ieee"): Triton 3.6 miscompiles it there -- illegal
    memory accesses and wrong gradients on an H200 -- while chunk sizes 16 and 32 were correct
    (docs/validation.md, "KLA/GDN backward on the GPU");
    ``broken_variant`` (a key of :data:`BROKEN_VARIANTS`) makes the backward deliberately
    wrong, to show that a gradient check catches it."""
    a = _arguments(  # the forward's own checks (kernels.kla), not a second set
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
        "storage",
        True,
        input_precision,
        None,
        check_inputs,
    )
    return trainable(a, alpha, eta, adjoint=adjoint, broken_variant=broken_variant)


def trainable(a, alpha, eta, *, adjoint=None, broken_variant=None):
    """:func:`kla_chunkwise_trainable` on arguments checked by ``kernels.kla._arguments``
    (``a``; alpha and eta as passed, so that their gradients reach them)."""
    q = a.q
    if adjoint is None:
        adjoint = "torch" if q.is_cuda else "triton"
    if adjoint not in ("triton", "torch"):
        raise ValueError(f"adjoint must be 'triton' or 'torch', got {adjoint!r}")
    if broken_variant is not None and broken_variant not in BROKEN_VARIANTS:
        raise ValueError(
            f"broken_variant must be one of {tuple(BROKEN_VARIANTS)} or None, got {broken_variant!r}"
        )
    lead = q.shape[:-3]
    T, H = q.shape[-3], q.shape[-2]
    n = math.prod(lead)
    gates = []
    for name, x in (("alpha", alpha), ("eta", eta)):
        if isinstance(x, torch.Tensor) and x.ndim == q.ndim:
            raise ValueError(
                f"{name}: the backward supports per-head gates (..., T, H) only, got {tuple(x.shape)}"
            )
        xt = (
            x
            if isinstance(x, torch.Tensor)
            else torch.tensor(float(x), dtype=torch.float32, device=q.device)
        )
        # as the forward uses it: broadcast to (..., T, H) and rounded to q's dtype
        # (solvers.kla.broadcast_gate); the gradient passes the rounding unchanged. Values are
        # checked by the forward's kernel, as check_inputs says (no synchronisation here)
        rounded, _ = broadcast_gate(name, xt.detach(), q.shape[:-1], None, q, check_finite=False)
        rounded = rounded.float()
        if xt.requires_grad:
            xe = xt.float().expand(q.shape[:-1])
            rounded = xe + (rounded - xe).detach()
        gates.append(rounded.reshape(n, T, H))
    prec = a.prec
    if adjoint == "triton" and _wgmma_miscompiled(q.device, a.C, prec):
        name = torch.cuda.get_device_name(q.device) if q.is_cuda else str(q.device)
        raise ValueError(
            f"adjoint='triton' is refused on {name} at chunk_size=64 with "
            f"input_precision={prec!r}: the Triton adjoint kernels are miscompiled there (illegal memory "
            "accesses and wrong gradients on an H200 with Triton 3.6; docs/validation.md). Pass "
            "adjoint='torch' (the CUDA default), or chunk_size=16 or 32"
        )
    opts = dict(
        eps=a.eps,
        chunk_size=a.C,
        coefficient=a.coefficient,
        normalize_queries=a.normalize_queries,
        input_precision=prec,
        check_inputs=a.check_inputs,
    )
    back = dict(adjoint=adjoint, variant=broken_variant)
    flat = lambda x: x.reshape(n, *x.shape[len(lead) :])  # noqa: E731
    h0 = None if a.S0 is None else flat(a.S0)
    o, S = _Trainable.apply(flat(q), flat(a.k), flat(a.v), gates[0], gates[1], h0, opts, back)
    return o.reshape(*lead, *o.shape[1:]), S.reshape(*lead, *S.shape[1:])
