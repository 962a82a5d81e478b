"""Chunkwise GKA quantities: ``||H_t||_F`` (GKA Sec. 4.2.1, eq. (5)) and the backward terms
``B_i k_i`` (Sec. 4.2.2, eqs. (9)-(10)).

Within a chunk of C tokens with initial state H_0, log decays g_1..g_C and cumulative
``G_c = sum_{i <= c} g_i`` (appendix eq. (16)), the decay mask is

    M_{j,c} = zeta_c / zeta_j = exp(G_c - G_j)  for c >= j,  0 otherwise   (upper triangular)

and ``H_c = zeta_c H_0 + sum_j M_{j,c} beta_j k_j k_j^T`` (``zeta_c = exp(G_c)``). Then

    ||H_c||_F^2 = zeta_c^2 ||H_0||_F^2 + 2 zeta_c sum_j M_{j,c} beta_j k_j^T H_0 k_j
                  + column-sum(((W) M) . M)_c,     W = (G_C . G_C) . (beta beta^T)      (5)

with the Gram matrix ``G_C = K K^T`` (rows of K are the chunk's keys; the paper's K_C is
``K^T``). The third term is ``sum_{i,j} M_{i,c} M_{j,c} W_{ij} = (M^T W M)_{cc}``, which is
what the printed column-sum computes (checked in ``tests/test_gka_chunkwise.py``).

The printed ratio form zeta_c / zeta_j (:func:`ratio_decay_mask`) gives 0/0 once the
cumulative product underflows; every function here uses the log-space form (:func:`decay_mask`).

All arithmetic goes through an :class:`Arith`: chunk initial states are stored values, all
intra-chunk quantities live in the compute dtype (what a kernel keeps on chip).
"""

from __future__ import annotations

import torch

from . import validation as check
from ._arith import Arith
from .gates import cumsum_compute
from .gka import check_frobenius, validate_gates, validate_keys


def decay_mask(G: torch.Tensor) -> torch.Tensor:
    """``M[..., j, c] = exp(G_c - G_j)`` for ``c >= j`` and 0 below (appendix eq. (16)).

    ``G (..., C)`` cumulative log decays in a compute dtype; the result has G's dtype. The
    excluded entries are set to ``-inf`` before the exponential, so no overflow (and no
    ``inf * 0`` in a backward pass) ever occurs.
    """
    C = G.shape[-1]
    upper = torch.ones(C, C, dtype=torch.bool, device=G.device).triu()
    diff = G.unsqueeze(-2) - G.unsqueeze(-1)  # [j, c] = G_c - G_j
    return torch.exp(torch.where(upper, diff, torch.full_like(diff, float("-inf"))))


def ratio_decay_mask(gamma: torch.Tensor) -> torch.Tensor:
    """The printed Sec. 4.2.1 form ``M_{j,c} = zeta_c / zeta_j``, ``zeta = cumprod(gamma)``.

    Kept to show why the log-space form is used: once ``zeta_j`` underflows to 0 the ratio is
    0/0 = NaN (e.g. float32, C = 8 gates of e^{-20}).
    """
    zeta = torch.cumprod(gamma, dim=-1)
    C = gamma.shape[-1]
    upper = torch.ones(C, C, dtype=torch.bool, device=gamma.device).triu()
    ratio = zeta.unsqueeze(-2) / zeta.unsqueeze(-1)
    return torch.where(upper, ratio, torch.zeros_like(ratio))


def _colsum(ar: Arith, X: torch.Tensor) -> torch.Tensor:
    """Sum over the row index of ``X (..., m, n)`` (sequentially rounded in strict bf16)."""
    return ar.rmatvec(X, torch.ones(X.shape[-2], dtype=ar.compute, device=X.device))


def frobenius_third_term(ar: Arith, W: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """``column-sum(((W) M) . M)``, GKA eq. (5), with ``W = G_C . G_C`` (times beta beta^T)."""
    return _colsum(ar, ar.matmul(W, M) * M)


def chunk_frobenius_terms(ar: Arith, H0: torch.Tensor, K: torch.Tensor, G: torch.Tensor, beta=None):
    """The three terms of ``||H_c||_F^2``, c = 1..C, for one chunk (Sec. 4.2.1).

    H0 ``(..., D, D)`` stored initial state, K ``(..., C, D)`` stored keys, G ``(..., C)``
    cumulative log decays (compute dtype), beta ``(..., C)`` or None. Returns three
    ``(..., C)`` compute-dtype tensors.
    """
    M = decay_mask(G)
    zeta = torch.exp(G)
    Kc = ar.up(K)
    H0f = H0.flatten(-2)
    t1 = zeta * zeta * ar.dot(H0f, H0f).unsqueeze(-1)
    quad = ar.dot(Kc, ar.matmul(Kc, ar.up(H0).transpose(-1, -2)))  # k_j^T H_0 k_j
    if beta is not None:
        quad = beta * quad
    t2 = 2.0 * zeta * ar.rmatvec(M, quad)
    gram = ar.matmul(Kc, Kc.transpose(-1, -2))
    W = gram * gram
    if beta is not None:
        W = W * beta.unsqueeze(-1) * beta.unsqueeze(-2)
    return t1, t2, frobenius_third_term(ar, W, M)


def chunk_state_update(
    ar: Arith, H0: torch.Tensor, K: torch.Tensor, G: torch.Tensor, beta=None
) -> torch.Tensor:
    """The next chunk's initial state ``H_C = zeta_C H_0 + K^T diag(beta M_{:,C}) K``, stored."""
    Kc = ar.up(K)
    coef = torch.exp(G[..., -1:] - G)  # M_{j,C}
    if beta is not None:
        coef = coef * beta
    upd = ar.matmul(Kc.transpose(-1, -2), coef.unsqueeze(-1) * Kc)
    return ar.store(torch.exp(G[..., -1])[..., None, None] * ar.up(H0) + upd)


def _chunks(T: int, chunk_size) -> list:
    chunk_size = check.count("chunk_size", chunk_size, minimum=1)
    return [(s, min(s + chunk_size, T)) for s in range(0, T, chunk_size)]


def _key_inputs(k, g, beta):
    """Validated keys and gates ``(..., T, D)``, ``(..., T)``, broadcast to one batch shape."""
    k = validate_keys("k", k)
    check.has_values("k", k, "the chunkwise norms (the gate and overflow checks)")
    g, beta, shapes = validate_gates(g, beta, "k", k)
    B = check.batch_shape("k, g and beta", k.shape[:-2], *shapes)
    T, D = k.shape[-2], k.shape[-1]
    return (
        k.expand(*B, T, D),
        None if g is None else g.expand(*B, T),
        None if beta is None else beta.expand(*B, T),
        B,
    )


def chunkwise_frobenius(
    k,
    *,
    g=None,
    beta=None,
    chunk_size: int,
    bf16_mode: str = "storage",
    return_states: bool = False,
):
    """``||H_t||_F`` for t = 1..T by the chunkwise formula (GKA Sec. 4.2.1, eq. (5)).

    k ``(..., T, D)``; g ``(..., T)`` log decays (``<= 0``) or None; beta ``(..., T)`` input gates
    (appendix eq. (55)) or None; ``chunk_size >= 1`` (T need not be a multiple). Chunk
    initial states are passed chunk to chunk by :func:`chunk_state_update` from ``H = 0``.

    Returns ``(..., T)`` in the compute dtype (float32 for bf16 storage mode: a kernel keeps
    the norms, and lambda_t, in fp32), and with ``return_states`` also the stored chunk
    initial states ``(..., N, D, D)``. A norm that overflows the compute dtype is a ValueError
    (the layer's message); a zero norm is a valid answer here.
    """
    kk, gg, bb, B = _key_inputs(k, g, beta)
    chunks = _chunks(kk.shape[-2], chunk_size)
    check.bf16_mode(bf16_mode)
    check.flag("return_states", return_states)
    ar = Arith(kk.dtype, bf16_mode)
    D = kk.shape[-1]
    H0 = torch.zeros(*B, D, D, dtype=ar.dtype, device=kk.device)
    norms, states = [], []
    for s, e in chunks:
        G = (
            torch.zeros(*B, e - s, dtype=ar.compute, device=kk.device)
            if gg is None
            else cumsum_compute(ar, ar.up(gg[..., s:e]))
        )
        bc = None if bb is None else ar.up(bb[..., s:e])
        t1, t2, t3 = chunk_frobenius_terms(ar, H0, kk[..., s:e, :], G, bc)
        norms.append(torch.sqrt(t1 + t2 + t3))
        states.append(H0)
        H0 = chunk_state_update(ar, H0, kk[..., s:e, :], G, bc)
    out = (
        torch.cat(norms, dim=-1)
        if norms
        else torch.zeros(*B, 0, dtype=ar.compute, device=kk.device)
    )
    # Only the overflow half of the layer's check applies (its zero-norm half is about
    # lambda_t = 0 in a solve, and a zero norm is a right answer here): finite entries pass.
    check_frobenius(torch.where(torch.isfinite(out), torch.ones_like(out), out))
    if not return_states:
        return out
    st = (
        torch.stack(states, dim=-3)
        if states
        else torch.zeros(*B, 0, D, D, dtype=ar.dtype, device=kk.device)
    )
    return out, st


def chunk_backward_coefficients(G: torch.Tensor, w: torch.Tensor):
    """Sec. 4.2.2: ``b_i = sum_c M_{i,c} w_c zeta_c`` and ``M_w = M diag(w) M^T`` for one chunk.

    ``b`` multiplies H_0 in ``B_i^intra``; ``M_w[i, j]`` multiplies ``k_j k_j^T``. G, w ``(..., C)``.
    """
    M = decay_mask(G)
    b = (M @ (w * torch.exp(G)).unsqueeze(-1)).squeeze(-1)
    Mw = (M * w.unsqueeze(-2)) @ M.transpose(-1, -2)
    return b, Mw


def chunk_intra_Bk(
    H0: torch.Tensor, K: torch.Tensor, G: torch.Tensor, w: torch.Tensor, beta=None
) -> torch.Tensor:
    """Rows ``B_i^intra k_i = b_i H_0 k_i + sum_j M_w[i, j] (k_j^T k_i) beta_j k_j`` (Sec. 4.2.2).

    The paper's ``H_0 (diag(b) K_C) + K_C ((K_C^T K_C) . M_w)`` with its typo
    ``diag(b) K_C`` read as ``K_C diag(b)`` (``docs/errata.md``); rows here are tokens.
    """
    b, Mw = chunk_backward_coefficients(G, w)
    bK = K if beta is None else beta.unsqueeze(-1) * K
    return b.unsqueeze(-1) * (K @ H0.transpose(-1, -2)) + ((K @ K.transpose(-1, -2)) * Mw) @ bK


def chunk_intra_Btilde(
    H0: torch.Tensor, K: torch.Tensor, G: torch.Tensor, w: torch.Tensor, beta=None
) -> torch.Tensor:
    """``sum_{c=1}^C zeta_c w_c H_c = (sum_c zeta_c^2 w_c) H_0 + K^T diag(beta b) K`` (Sec. 4.2.2,
    "cross-chunk"; the printed lower limit c = i is c = 1)."""
    b, _ = chunk_backward_coefficients(G, w)
    zeta = torch.exp(G)
    s = (zeta * zeta * w).sum(-1)
    coef = b if beta is None else beta * b
    return s[..., None, None] * H0 + K.transpose(-1, -2) @ (coef.unsqueeze(-1) * K)


def chunkwise_Bk(
    k, w, *, g=None, beta=None, chunk_size: int, cross: str = "corrected"
) -> torch.Tensor:
    """``o_i = B_i k_i`` with ``B_i = sum_{t >= i} M_{i,t} w_t H_t`` (Lemma 1, eq. (9)), chunkwise.

    float64 reference of Sec. 4.2.2: per chunk ``B_i k_i = B_i^intra k_i + M_{i,C} Bt_{C+1} k_i``
    (eq. (10)) with ``Bt_{C+1} = gamma_{C+1} B_{C+1}`` carried backwards by
    ``Bt_1 = zeta_C Bt_{C+1} + sum_c zeta_c w_c H_c``. ``cross="printed"`` uses the printed
    coefficient ``zeta_C`` of ``Bt_{C+1} k_i`` instead of ``M_{i,C}`` (kept to be refuted).
    Inputs are converted to float64; w ``(..., T)``, its batch broadcast to that of k, g, beta.
    """
    if cross not in ("corrected", "printed"):
        raise ValueError(f"cross must be 'corrected' or 'printed', got {cross!r}")
    kk, gg, bb, B = _key_inputs(k, g, beta)
    w = check.tensor("w", w, min_ndim=1)
    if w.shape[-1] != kk.shape[-2]:
        raise ValueError(f"w has {w.shape[-1]} tokens but k has {kk.shape[-2]}")
    # w is Lemma 1's w_t of these systems: its batch broadcasts to theirs, it cannot add systems
    if check.batch_shape("k, g, beta and w", B, w.shape[:-1]) != B:
        raise ValueError(
            f"w has batch shape {tuple(w.shape[:-1])}, which does not broadcast to the batch "
            f"{tuple(B)} of k, g and beta"
        )
    f64 = torch.float64
    kk = kk.to(f64)
    w = w.to(f64).expand(*B, kk.shape[-2])
    gg = None if gg is None else gg.to(f64)
    bb = None if bb is None else bb.to(f64)
    chunks = _chunks(kk.shape[-2], chunk_size)
    D = kk.shape[-1]
    _, H0s = chunkwise_frobenius(kk, g=gg, beta=bb, chunk_size=chunk_size, return_states=True)
    Gs = [
        torch.zeros(*B, e - s, dtype=f64, device=kk.device)
        if gg is None
        else torch.cumsum(gg[..., s:e], -1)
        for s, e in chunks
    ]
    out = [None] * len(chunks)
    Bt = torch.zeros(*B, D, D, dtype=f64, device=kk.device)
    for n in reversed(range(len(chunks))):
        s, e = chunks[n]
        K, G = kk[..., s:e, :], Gs[n]
        bc = None if bb is None else bb[..., s:e]
        coef = torch.exp(G[..., -1:]) if cross == "printed" else torch.exp(G[..., -1:] - G)
        out[n] = chunk_intra_Bk(H0s[..., n, :, :], K, G, w[..., s:e], bc) + coef.unsqueeze(-1) * (
            K @ Bt.transpose(-1, -2)
        )
        Bt = torch.exp(G[..., -1])[..., None, None] * Bt + chunk_intra_Btilde(
            H0s[..., n, :, :], K, G, w[..., s:e], bc
        )
    return torch.cat(out, dim=-2) if out else torch.zeros(*B, 0, D, dtype=f64, device=kk.device)


def first_step_matvec(
    H0: torch.Tensor, k1: torch.Tensor, gamma1, xi: torch.Tensor, *, form: str = "corrected"
):
    """``H_{[t]+1} xi`` from a chunk's initial state without forming ``H_{[t]+1}`` (Sec. 4.2.1).

    ``"corrected"``: ``gamma_1 H_{[t]} xi + k_1 (k_1^T xi)``, as (CH) gives; ``"printed"``:
    ``H_{[t]} xi + gamma_1 k_1 (k_1^T xi)``, the decay on the wrong term (docs/errata.md).
    H0 ``(..., D, D)``, k1 and xi ``(..., D)``, gamma1 a float or ``(...)`` tensor.
    """
    if form not in ("corrected", "printed"):
        raise ValueError(f"form must be 'corrected' or 'printed', got {form!r}")
    gamma1 = torch.as_tensor(gamma1, dtype=H0.dtype, device=H0.device)
    Hxi = (H0 @ xi.unsqueeze(-1)).squeeze(-1)
    kkxi = k1 * (k1 * xi).sum(-1, keepdim=True)
    if form == "printed":
        return Hxi + gamma1.unsqueeze(-1) * kkxi
    return gamma1.unsqueeze(-1) * Hxi + kkxi
