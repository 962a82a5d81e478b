"""Gradient checks for KLA / GDN kernels: the ``kla_backward`` strategy of ``analysis.testing.harness``.

A kernel under test is a *gradient callable* in flash-linear-attention's layout

    f(q, k, v, g, beta, h0, do, dht, *, mode, eps, chunk_size, cu_seqlens, gate_dtype)
        -> (dq, dk, dv, dg, dbeta, dh0)

q, k ``(B, T, H, d_k)``; v, do ``(B, T, HV, d_v)``; g (log decay, ``alpha = exp(g)``) and beta
``(B, T, HV)``; h0, dht ``(N, HV, d_k, d_v)`` with N = B, or the number of sequences when
``cu_seqlens`` (B = 1) packs several; HV a multiple of H (grouped values). It returns the
gradients of ``<o, do> + <S_T, dht>`` where ``(o, S_T)`` is the recurrence of KLA Algorithm 1
(left; docs/kla.md):

    S_t = alpha_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,    o_t = S_t^T q^_t

with ``mode="gdn"``: b_t = beta_t, q^ = q (fla's ``chunk_gated_delta_rule`` with scale 1);
``mode="kla"``: b_t = beta_t / (||k_t||^2 + eps) (eq. (3); beta plays eta), q^ = q / ||q||.
:func:`gradients_of` turns any forward ``(q, k, v, *, g, beta, initial_state, ...) -> (o, S_T)``
into such a callable through autograd; :func:`reference_gradients` is autograd through the
float32 token-by-token recurrence ``solvers.kla_recurrent`` on the same rounded inputs.

``gate_dtype`` declares the kernel's gate storage: a kernel that rounds ``alpha = exp(g)`` to
bf16 (``kernels.kla_chunkwise`` with bf16 inputs) is paired with a reference that rounds it
the same way, so both differentiate the same function (the rounding's derivative taken as 1).

Bound (:func:`adjoint_bounds`): the backward of this recurrence is the adjoint recurrence
``M_t = dS_t + q^_t do_t^T``, ``dS_{t-1} = alpha_t (I - b_t k_t k_t^T) M_t`` -- linear in the
cotangent and independent of the states -- and every gradient is a product of an adjoint
quantity and a forward one (dv_t = b M_t^T k_t, db_t = k_t^T M_t e_t, dq^_t = S_t do_t,
dalpha_t = <(I - b k k^T) M_t, S_{t-1}>, dk_t = b (M_t e_t - S~_{t-1} M_t^T k_t), dh0 = dS_0).
A first-order running bound follows the forward error E^S and the adjoint error E^M along
the float64 trajectory, each token adding its local rounding and propagating the earlier
ones through the token map's norm ``G_t = alpha_t max(1, |1 - b_t ||k_t||^2|)``; each
gradient's error is then bounded by the product rule. docs/gradients.md derives it and
states its limits.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from solvers import Arith

from .harness import REFERENCE_ARITH, STRATEGIES, Case, Strategy

OUTPUTS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
CORE_DIMS = (1, 1, 1, 0, 0, 2)
MODES = ("gdn", "kla")


# ---------------------------------------------------------------------------------------
# forwards and gradient callables
# ---------------------------------------------------------------------------------------


def _segments(T: int, cu_seqlens):
    """(start, end) of every sequence: the whole batch row without cu_seqlens."""
    if cu_seqlens is None:
        return [(0, T)]
    cu = [int(c) for c in cu_seqlens]
    return list(zip(cu[:-1], cu[1:]))


def _round_gate(x: torch.Tensor, gate_dtype) -> torch.Tensor:
    """x as a kernel storing it in gate_dtype sees it; derivative 1 through the rounding."""
    if gate_dtype is None:
        return x
    return x + (x.to(gate_dtype).to(x.dtype) - x).detach()


def _per_sequence(run, q, k, v, g, beta, h0, cu_seqlens):
    """Apply ``run(q, k, v, g, beta, h0) -> (o, S)`` (batch-shaped) to every sequence: the
    batch as is, or each packed sequence of cu_seqlens; returns o and the stacked S_T."""
    if cu_seqlens is None:
        return run(q, k, v, g, beta, h0)
    os, Ss = [], []
    for i, (s, e) in enumerate(_segments(q.shape[1], cu_seqlens)):
        o, S = run(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], h0[i : i + 1])
        os.append(o)
        Ss.append(S)
    return torch.cat(os, 1), torch.cat(Ss, 0)


def recurrent_forward(
    q, k, v, *, g, beta, initial_state, mode="gdn", eps=1e-6, cu_seqlens=None, gate_dtype=None, **_
):
    """The token-by-token recurrence (``solvers.kla_recurrent``) in q's dtype, in the layout of
    the module docstring: grouped values by repeating q and k over each group, packed
    sequences one by one."""
    from solvers import kla_recurrent

    group = v.shape[2] // q.shape[2]

    def run(q, k, v, g, beta, h0):
        alpha = _round_gate(torch.exp(g), gate_dtype)
        return kla_recurrent(
            q.repeat_interleave(group, 2),
            k.repeat_interleave(group, 2),
            v,
            alpha=alpha,
            eta=beta,
            eps=eps,
            initial_state=h0,
            coefficient="kaczmarz" if mode == "kla" else "gdn",
            normalize_queries=mode == "kla",
        )

    return _per_sequence(run, q, k, v, g, beta, initial_state, cu_seqlens)


def kla_kernel_forward(
    q,
    k,
    v,
    *,
    g,
    beta,
    initial_state,
    mode="gdn",
    eps=1e-6,
    chunk_size=64,
    cu_seqlens=None,
    input_precision=None,
    adjoint=None,
    broken_variant=None,
    **_,
):
    """``kernels.kla_chunkwise_trainable`` in this layout (no grouped values; packed
    sequences one by one). It stores alpha = exp(g) and beta in q's dtype: declare
    ``gate_dtype=q.dtype`` for bf16 inputs."""
    from kernels.kla_backward import kla_chunkwise_trainable

    if v.shape[2] != q.shape[2]:
        raise ValueError(
            f"kernels.kla_chunkwise has no grouped values: v has {v.shape[2]} heads, q {q.shape[2]}"
        )

    def run(q, k, v, g, beta, h0):
        return kla_chunkwise_trainable(
            q,
            k,
            v,
            alpha=torch.exp(g.float()),
            eta=beta.float(),
            eps=eps,
            chunk_size=chunk_size,
            initial_state=h0,
            input_precision=input_precision,
            adjoint=adjoint,
            broken_variant=broken_variant,
            coefficient="kaczmarz" if mode == "kla" else "gdn",
            normalize_queries=mode == "kla",
        )

    return _per_sequence(run, q, k, v, g, beta, initial_state, cu_seqlens)


def fla_gdn_forward(q, k, v, *, g, beta, initial_state, mode="gdn", cu_seqlens=None, **_):
    """flash-linear-attention's ``chunk_gated_delta_rule`` (scale 1, g and the states in
    float32, beta in q's dtype), GDN mode only."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    if mode != "gdn":
        raise ValueError(
            "fla_gdn_forward covers mode='gdn' (fla's beta is not normalised by the key)"
        )
    o, S = chunk_gated_delta_rule(
        q,
        k,
        v,
        g.float(),
        beta.to(q.dtype),
        scale=1.0,
        initial_state=initial_state.float(),
        output_final_state=True,
        cu_seqlens=cu_seqlens,
    )
    return o, S


def gradients_of(forward):
    """The gradient callable of a forward (module docstring): autograd of
    ``<o, do> + <S_T, dht>`` with respect to q, k, v, g, beta, h0."""

    def grads(q, k, v, g, beta, h0, do, dht, **opts):
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
        o, S = forward(*leaves[:3], g=leaves[3], beta=leaves[4], initial_state=leaves[5], **opts)
        torch.autograd.backward((o, S), (do.to(o.dtype), dht.to(S.dtype)))
        return tuple(x.grad if x.grad is not None else torch.zeros_like(x) for x in leaves)

    grads.__qualname__ = f"gradients_of({getattr(forward, '__qualname__', forward)})"
    grads.__module__ = getattr(forward, "__module__", "?")
    grads.__wrapped__ = forward  # what it runs (svt_pytest reads Triton off it)
    return grads


def kla_kernel_variant(**fixed):
    """Gradient callable of ``kernels.kla_chunkwise_trainable`` with keywords fixed, e.g.
    ``adjoint="torch"`` or ``broken_variant="dq_late"`` (kernels.kla_backward.BROKEN_VARIANTS)."""

    def forward(*args, **opts):
        return kla_kernel_forward(*args, **opts, **fixed)

    forward.__qualname__ = (
        "kla_kernel_forward(" + ", ".join(f"{k}={v!r}" for k, v in fixed.items()) + ")"
    )
    forward.__svt_triton__ = True
    return gradients_of(forward)


# Triton kernels behind these forwards (imported when they run): the pytest plugin skips them on
# a CPU without Triton's interpreter instead of failing (svt_pytest reads ``__svt_triton__``)
kla_kernel_forward.__svt_triton__ = True
fla_gdn_forward.__svt_triton__ = True
reference_gradients = gradients_of(recurrent_forward)
kla_kernel_gradients = gradients_of(kla_kernel_forward)
fla_gdn_gradients = gradients_of(fla_gdn_forward)


# ---------------------------------------------------------------------------------------
# the running bound of the adjoint recurrence
# ---------------------------------------------------------------------------------------


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u) (Lemma 3.1)."""
    return n * u / (1.0 - n * u)


def product_rounding(arith: Arith, n: int) -> float:
    """Relative (norm-wise) error of one computed product ``A B`` with inner dimension n whose
    operands are stored in ``arith.dtype`` and accumulated in ``arith.compute``:
    ``|fl(A^ B^) - A B| <= (2 u_store + gamma_n(u_acc)) |A| |B|`` plus ``u_store`` for
    storing the result (first order). The norm form uses ``|| |A| |B| ||_F <= ||A||_F ||B||_F``."""
    return 3.0 * arith.u_store + gamma(n, arith.u_acc)


def adjoint_bounds(
    q, k, v, g, beta, h0, do, dht, *, mode, eps, cu_seqlens, arith: Arith, n: int, chunk=None
):
    """Per-output bounds on ``||grad_kernel - grad_exact||`` for a run in ``arith`` whose
    products have inner dimension at most n (module docstring; docs/gradients.md).

    Inputs float64 (the rounded values). Returns tensors that broadcast against the error
    of each output in :data:`OUTPUTS` (per token and head for dq, dk, dv; per element for
    dg, dbeta; per sequence and head for dh0).

    ``chunk``: the chunk length of a chunked kernel, whose dg is a reverse cumulative sum
    within the chunk of per-token terms that cancel (:func:`_chunk_dg_terms`)."""
    base, dg_chunk = unit_bounds(
        q, k, v, g, beta, h0, do, dht, mode=mode, eps=eps, cu_seqlens=cu_seqlens, chunk=chunk
    )
    return combine(base, dg_chunk, product_rounding(arith, n), 0.0)


def combine(base, dg_chunk, eps_kernel: float, eps_reference: float):
    """Bounds of two runs from :func:`unit_bounds`: every term of the first-order bound is
    linear in the per-product rounding eps, so the sum of the two runs' bounds is
    ``(eps_kernel + eps_reference) base``, plus the chunked kernel's dg term."""
    out = [(eps_kernel + eps_reference) * b for b in base]
    if dg_chunk is not None:
        out[OUTPUTS.index("dg")] = out[OUTPUTS.index("dg")] + eps_kernel * dg_chunk
    return tuple(out)


def unit_bounds(q, k, v, g, beta, h0, do, dht, *, mode, eps, cu_seqlens, chunk=None):
    """The bounds of :func:`adjoint_bounds` for a per-product rounding of 1, and the chunked
    dg term (None without ``chunk``), along one float64 trajectory."""
    group = v.shape[2] // q.shape[2]
    B, T, H, _ = q.shape
    HV = v.shape[2]
    names = ("dq", "dk", "dv", "dg", "dbeta", "dg_chunk")
    out = {name: torch.zeros(B, T, HV, dtype=torch.float64) for name in names}
    dh0 = torch.zeros(h0.shape[:2], dtype=torch.float64)
    qe, ke = q.repeat_interleave(group, 2), k.repeat_interleave(group, 2)
    for i, (s, e) in enumerate(_segments(T, cu_seqlens)):
        for b in range(B):
            seq = i if cu_seqlens is not None else b
            res = _sequence_bounds(
                qe[b, s:e],
                ke[b, s:e],
                v[b, s:e],
                g[b, s:e],
                beta[b, s:e],
                h0[seq],
                do[b, s:e],
                dht[seq],
                mode,
                eps,
                1.0,
                chunk,
            )
            for name in names:
                out[name][b, s:e] = res[name]
            dh0[seq] = res["dh0"]
    # q and k are shared by the HV / H value heads of a group: their gradients add up
    for name in ("dq", "dk"):
        out[name] = out[name].reshape(B, T, H, group).sum(-1)
    base = tuple(out[name] for name in OUTPUTS[:5]) + (dh0,)
    return base, (out["dg_chunk"] if chunk is not None else None)


def _sequence_bounds(q, k, v, g, beta, h0, do, dht, mode, eps, ep, chunk=None):
    """One sequence, all heads at once: q, k ``(T, HV, d_k)``, v, do ``(T, HV, d_v)``, g,
    beta ``(T, HV)``, h0, dht ``(HV, d_k, d_v)``."""
    T = q.shape[0]
    nrm = lambda x: torch.linalg.vector_norm(x, dim=(-2, -1))  # noqa: E731
    a = torch.exp(g)
    nk2 = (k * k).sum(-1)
    nk = nk2.sqrt()
    nq = q.norm(dim=-1)
    den = nk2 + eps
    if mode == "kla":
        b = torch.where(
            den > 0, beta / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den)
        )
        qh = q / torch.where(nq > 0, nq, torch.ones_like(nq)).unsqueeze(-1)
    else:
        b, qh = beta, q
    nqh = qh.norm(dim=-1)
    nv, ndo = v.norm(dim=-1), do.norm(dim=-1)
    G = a * torch.clamp((1.0 - b * nk2).abs(), min=1.0)
    # forward trajectory and its running error bound E^S
    S = h0.clone()
    ES = torch.zeros(q.shape[1], dtype=torch.float64)
    nSp, ne, nS, ESp, ESt, ee = [], [], [], [], [], []
    states = []
    for t in range(T):
        states.append(S)
        St = a[t, :, None, None] * S
        et = v[t] - torch.einsum("hkv,hk->hv", St, k[t])
        Snew = St + b[t, :, None, None] * k[t, :, :, None] * et[:, None, :]
        nSp.append(nrm(S))
        ne.append(et.norm(dim=-1))
        # e_t: the product S~^T k and the subtraction
        E_e = a[t] * nk[t] * ES + ep * (nv[t] + a[t] * nSp[-1] * nk[t])
        ee.append(E_e)
        ESp.append(ES)
        ES = G[t] * ES + ep * (
            a[t] * nSp[-1] * (1 + b[t] * nk2[t]) + b[t] * nk[t] * (ne[-1] + nv[t]) + nrm(Snew)
        )
        ESt.append(ES)
        nS.append(nrm(Snew))
        S = Snew
    # adjoint trajectory and its running error bound E^M
    dS = dht.clone()
    EdS = torch.zeros_like(ES)
    res = {
        name: torch.zeros(T, q.shape[1], dtype=torch.float64)
        for name in ("dq", "dk", "dv", "dg", "dbeta")
    }
    # sizes of the terms a chunked kernel's dg sums: <q^_t, S_t do_t> (outputs), the key's
    # decayed products b ||k|| ||M|| (||e|| + alpha ||S_{t-1}|| ||k||) and <S_t, dS_t> (the
    # state carried past t; counted at every token, a chunk end is any token)
    cancel = torch.zeros(T, q.shape[1], dtype=torch.float64)
    for t in range(T - 1, -1, -1):
        M = dS + qh[t, :, :, None] * do[t, :, None, :]
        nM = nrm(M)
        EM = EdS + ep * nqh[t] * ndo[t]
        kM = torch.einsum("hk,hkv->hv", k[t], M)
        N = M - b[t, :, None, None] * k[t, :, :, None] * kM[:, None, :]
        nN = nrm(N)
        EN = torch.clamp((1.0 - b[t] * nk2[t]).abs(), min=1.0) * EM + ep * nM * (1 + b[t] * nk2[t])
        # dv_t = b M^T k
        res["dv"][t] = b[t] * nk[t] * EM + ep * b[t] * nk[t] * nM
        # db_t = k^T M e_t
        E_db = nk[t] * (EM * ne[t] + nM * ee[t]) + ep * nk[t] * nM * ne[t]
        db = (
            (kM * (v[t] - torch.einsum("hkv,hk->hv", a[t, :, None, None] * states[t], k[t])))
            .sum(-1)
            .abs()
        )
        # dk_t = b (M e - S~ M^T k) (+ the coefficient's -2 db b k / den for KLA)
        E_dk = (
            b[t] * (EM * ne[t] + nM * ee[t])
            + b[t] * a[t] * nk[t] * (ESp[t] * nM + nSp[t] * EM)
            + ep * b[t] * nM * (ne[t] + a[t] * nSp[t] * nk[t])
        )
        if mode == "kla":
            scale = torch.where(
                den[t] > 0,
                1.0 / torch.where(den[t] > 0, den[t], torch.ones_like(den[t])),
                torch.zeros_like(den[t]),
            )
            E_dk = E_dk + 2 * b[t] * scale * nk[t] * (E_db + ep * db)
            res["dbeta"][t] = scale * (E_db + ep * db)
        else:
            res["dbeta"][t] = E_db
        res["dk"][t] = E_dk
        # dalpha_t = <N, S_{t-1}>, dg = alpha dalpha
        res["dg"][t] = a[t] * (EN * nSp[t] + nN * ESp[t] + ep * nN * nSp[t])
        # dq^_t = S_t do_t; dq = (I - q^ q^T) dq^ / ||q|| for KLA (the projection is non-expansive)
        E_dqh = ESt[t] * ndo[t] + ep * nS[t] * ndo[t]
        if mode == "kla":
            E_dqh = (E_dqh + ep * nS[t] * ndo[t]) / torch.where(
                nq[t] > 0, nq[t], torch.ones_like(nq[t])
            )
        res["dq"][t] = E_dqh
        cancel[t] = (
            nqh[t] * nS[t] * ndo[t]
            + b[t] * nk[t] * nM * (ne[t] + a[t] * nSp[t] * nk[t])
            + nS[t] * nrm(dS)
        )
        # carry: dS_{t-1} = alpha N
        EdS = a[t] * EN + ep * a[t] * nN
        dS = a[t, :, None, None] * N
    res["dh0"] = EdS
    res["dg_chunk"] = (
        ep * _chunk_dg_terms(cancel, chunk) if chunk is not None else torch.zeros_like(res["dg"])
    )
    return res


def _chunk_dg_terms(c: torch.Tensor, C: int) -> torch.Tensor:
    """``sum_{i=t}^{end of t's chunk} c_i``: a chunked kernel forms dg_t by summing, from
    the chunk's end back to t, the derivatives of the chunk's outputs with respect to the
    cumulative log decay ``G_i`` -- terms of sizes c_i that cancel (in exact arithmetic their
    sum is ``<(I - b k k^T) M_t, S_{t-1}>`` alpha_t, often far smaller). Each is computed with
    relative error eps, so the sum's error is at most eps times the sum of their sizes."""
    T = c.shape[0]
    out = torch.zeros_like(c)
    for s in range(0, T, C):
        block = c[s : s + C]
        out[s : s + C] = block.flip(0).cumsum(0).flip(0)
    return out


# ---------------------------------------------------------------------------------------
# the strategy
# ---------------------------------------------------------------------------------------


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


GATE_REGIMES = ("weak", "strong", "mixed")  # g in [-0.02, 0], in [-10, -9.5], or both


@st.composite
def _case(
    draw,
    *,
    dims,
    max_T,
    chunk_size,
    modes,
    gva,
    varlen,
    positive,
    device,
    gates=GATE_REGIMES,
    heads=(1, 2),
):
    mode = draw(st.sampled_from(modes))
    C = chunk_size
    T = draw(
        st.sampled_from(sorted({1, C - 1, C, C + 3, 2 * C + 5, max_T} & set(range(1, max_T + 1))))
    )
    H = draw(st.sampled_from(heads))
    HV = H * (draw(st.sampled_from((1, 2))) if gva else 1)
    d_k, d_v = draw(st.sampled_from(dims)), draw(st.sampled_from(dims))
    packed = varlen and T >= 3 and draw(st.booleans())
    B = 1 if packed else draw(st.sampled_from((1, 2)))
    seed = draw(st.integers(0, 2**31 - 1))
    gates = draw(st.sampled_from(gates))  # g near 0, near -10, both
    betas = draw(st.sampled_from(("small", "large", "mixed")))  # beta near 0, near 2, both
    init = draw(st.booleans())
    final = draw(st.booleans())
    uniform = positive and draw(st.booleans())
    return kla_grad_case(
        mode=mode,
        B=B,
        T=T,
        H=H,
        HV=HV,
        d_k=d_k,
        d_v=d_v,
        C=C,
        packed=bool(packed),
        gates=gates,
        betas=betas,
        init=bool(init),
        final=bool(final),
        uniform=bool(uniform),
        seed=seed,
        device=str(device),
    )


def kla_grad_case(
    *,
    mode,
    B,
    T,
    H,
    HV,
    d_k,
    d_v,
    C,
    packed=False,
    gates="weak",
    betas="small",
    init=False,
    final=False,
    uniform=False,
    seed=0,
    device="cpu",
) -> Case:
    """One case of :func:`kla_backward`, rebuilt from what the strategy drew (the snippet of a
    failing case calls this): ``mode`` in :data:`MODES`; ``packed``: B = 1 and cu_seqlens cuts T
    into 2-3 sequences; ``gates`` in :data:`GATE_REGIMES`; ``betas`` ``"small"``, ``"large"`` or
    ``"mixed"``; ``init``, ``final``: a random (else zero) h0 and dht; ``uniform``: q, k, v with
    entries in [0, 1); ``seed``: the generator of every tensor."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if gates not in GATE_REGIMES:
        raise ValueError(f"gates must be one of {GATE_REGIMES}, got {gates!r}")
    if betas not in ("small", "large", "mixed"):
        raise ValueError(f"betas must be one of ('small', 'large', 'mixed'), got {betas!r}")
    if HV % H:
        raise ValueError(f"HV must be a multiple of H, got HV={HV}, H={H}")
    if packed and (B != 1 or T < 3):
        raise ValueError(f"packed needs B=1 and T >= 3, got B={B}, T={T}")
    gen = torch.Generator().manual_seed(seed)
    f64 = dict(dtype=torch.float64, generator=gen)
    k = _unit_rows(torch.randn(B, T, H, d_k, **f64))
    if mode == "kla":  # Kaczmarz normalises the key: draw norms over a decade either side of 1
        k = k * 10.0 ** (2.0 * torch.rand(B, T, H, 1, **f64) - 1.0)
        q = torch.randn(B, T, H, d_k, **f64)
    else:  # GDN as trained: unit keys and queries (beta ||k||^2 <= 2 keeps it non-expansive)
        q = _unit_rows(torch.randn(B, T, H, d_k, **f64))
    v = torch.randn(B, T, HV, d_v, **f64)
    if uniform:  # positive entries: every key and query in one orthant, inner products near 1
        q, k = (_unit_rows(torch.rand(B, T, H, d_k, **f64)) for _ in range(2))
        v = torch.rand(B, T, HV, d_v, **f64)
    u = torch.rand(B, T, HV, **f64)
    weak, strong = -0.02 * u, -10.0 + 0.5 * u
    g = {
        "weak": weak,
        "strong": strong,
        "mixed": torch.where(torch.rand(B, T, HV, **f64) < 0.5, weak, strong),
    }[gates]
    w = torch.rand(B, T, HV, **f64)
    small, large = 0.02 * w, 1.95 + 0.05 * w
    beta = {
        "small": small,
        "large": large,
        "mixed": torch.where(torch.rand(B, T, HV, **f64) < 0.5, small, large),
    }[betas]
    cu = None
    N = B
    if packed:
        cuts = sorted(set(int(c) for c in torch.randint(1, T, (2,), generator=gen)))
        cu = torch.tensor([0, *cuts, T], dtype=torch.long)
        N = len(cu) - 1
    h0 = (
        torch.randn(N, HV, d_k, d_v, **f64)
        if init
        else torch.zeros(N, HV, d_k, d_v, dtype=torch.float64)
    )
    do = torch.randn(B, T, HV, d_v, **f64)
    dht = (
        torch.randn(N, HV, d_k, d_v, **f64)
        if final
        else torch.zeros(N, HV, d_k, d_v, dtype=torch.float64)
    )
    label = (
        f"mode={mode}{' positive' if uniform else ''} B,T,H,HV=({B},{T},{H},{HV}) d_k={d_k} d_v={d_v} C={C} gates={gates} beta={betas} "
        f"h0={'random' if init else 0} dht={'random' if final else 0} cu_seqlens={None if cu is None else cu.tolist()} "
        f"seed={seed}"
    )
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "h0": h0, "do": do, "dht": dht}
    opts = {
        "mode": mode,
        "eps": 1e-6,
        "chunk_size": C,
        "cu_seqlens": None if cu is None else cu.to(device),
    }
    kw = dict(
        mode=mode,
        B=B,
        T=T,
        H=H,
        HV=HV,
        d_k=d_k,
        d_v=d_v,
        C=C,
        packed=packed,
        gates=gates,
        betas=betas,
        init=init,
        final=final,
        uniform=uniform,
        seed=seed,
        device=str(device),
    )
    return Case(
        {n: x.to(device) for n, x in inputs.items()},
        opts,
        label,
        build="analysis.testing.gradient_harness.kla_grad_case",
        build_kwargs=kw,
    )


def _scales_for(gate_dtype, kernel_inner):
    def scales(case, rounded, model):
        """Bound of the kernel's run in ``model`` plus the float32 reference's, each from
        :func:`adjoint_bounds` (the triangle inequality through the exact gradient)."""
        x = {name: t.cpu() for name, t in rounded.items()}
        opts = case.options
        if gate_dtype is not None:  # both differentiate at the stored gate
            x["g"] = torch.log(torch.exp(x["g"]).to(gate_dtype).to(torch.float64))
        d = max(x["q"].shape[-1], x["v"].shape[-1])
        cu = None if opts["cu_seqlens"] is None else opts["cu_seqlens"].cpu()
        kw = dict(mode=opts["mode"], eps=opts["eps"], cu_seqlens=cu)
        C = kernel_inner(opts)
        base, dg_chunk = unit_bounds(*x.values(), chunk=C or None, **kw)
        total = combine(
            base, dg_chunk, product_rounding(model, d + C), product_rounding(REFERENCE_ARITH, d)
        )
        return tuple(b.to(rounded["q"].device) for b in total)

    return scales


def kla_backward(
    max_T: int = 40,
    dims=(16, 32),
    chunk_size: int = 16,
    modes=MODES,
    gva: bool = False,
    varlen: bool = True,
    gate_dtype=None,
    chunked: bool = True,
    positive_inputs: bool = False,
    gates=GATE_REGIMES,
    heads=(1, 2),
    device="cpu",
    precision=None,  # the harness rounds the inputs to the check's precision
) -> Strategy:
    """KLA / GDN sequences with cotangents for gradient callables (module docstring).

    Draws T around the chunk size (not a multiple of it included), packed sequences
    (cu_seqlens) when ``varlen``, grouped values (HV = 2 H) when ``gva`` (for kernels that
    allow them), weak / strong / mixed gates (g in [-0.02, 0] or [-10, -9.5]), beta near 0
    and near 2, random or zero initial state and final-state cotangent, d_k and d_v drawn
    independently from ``dims``. ``gate_dtype``: the kernel's gate storage (module
    docstring). ``chunked``: the kernel sums over a chunk as well as a head dimension (its
    products' inner dimension is d + C, not d). ``positive_inputs``: half the cases draw q, k
    (unit rows) and v with uniform entries in [0, 1), as fla's own tests do. ``gates``: the
    regimes to draw from (a subset of :data:`GATE_REGIMES`; the bf16 bound on dg is conclusive
    mostly under weak gates). ``heads``: the numbers of query heads H to draw from (a GPU search
    fixes one, since a kernel may compile and autotune per head count)."""
    bad = set(gates) - set(GATE_REGIMES)
    if not gates or bad:
        raise ValueError(f"gates must be a non-empty subset of {GATE_REGIMES}, got {gates!r}")
    if isinstance(modes, str) or not modes or set(modes) - set(MODES):
        raise ValueError(f"modes must be a non-empty subset of {MODES}, got {modes!r}")
    for name, val in (("dims", dims), ("heads", heads)):
        if isinstance(val, (str, int)) or not val or not all(_positive_int(x) for x in val):
            raise ValueError(f"{name} must be a non-empty tuple of positive ints, got {val!r}")
    for name, val in (("max_T", max_T), ("chunk_size", chunk_size)):
        if not _positive_int(val):
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    cases = _case(
        dims=tuple(dims),
        max_T=max_T,
        chunk_size=chunk_size,
        modes=tuple(modes),
        gva=gva,
        varlen=varlen,
        positive=positive_inputs,
        device=device,
        gates=tuple(gates),
        heads=tuple(heads),
    )
    inner = (lambda opts: opts["chunk_size"]) if chunked else (lambda opts: 0)
    return Strategy(
        "kla_backward",
        cases,
        OUTPUTS,
        CORE_DIMS,
        _scales_for(gate_dtype, inner),
        doc="KLA/GDN sequences + cotangents; bound: running bound of the adjoint recurrence",
    )


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def with_gate_dtype(fn, gate_dtype):
    """``fn`` with the keyword ``gate_dtype`` fixed (the harness passes only case options)."""

    def bound(*args, **opts):
        return fn(*args, gate_dtype=gate_dtype, **opts)

    bound.__qualname__ = getattr(fn, "__qualname__", repr(fn))
    bound.__module__ = getattr(fn, "__module__", "?")
    bound.__wrapped__ = fn  # what it runs (svt_pytest reads Triton off it)
    return bound


def inconclusive(report) -> list:
    """Findings whose bound is at least the reference gradient's norm: no check (report them
    as INCONCLUSIVE, never as a pass). A finding is the worst entry of its output; it is
    vacuous when any entry's bound was (``Finding.vacuous``, what ``Report.vacuous_cases``
    counts), which that worst entry's own bound and norm need not show."""
    return [f for f in report.history if f.vacuous or f.bound >= f.reference_norm > 0]


STRATEGIES.setdefault("kla_backward", kla_backward)

__all__ = [
    "OUTPUTS",
    "adjoint_bounds",
    "fla_gdn_gradients",
    "gradients_of",
    "inconclusive",
    "kla_backward",
    "kla_grad_case",
    "kla_kernel_gradients",
    "kla_kernel_variant",
    "product_rounding",
    "unit_bounds",
    "recurrent_forward",
    "reference_gradients",
    "with_gate_dtype",
]
