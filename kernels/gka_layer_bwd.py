"""The GKA layer's implicit backward, chunkwise, in PyTorch (GKA Sec. 4.2.2, Lemma 1, appendix D.2).

Same gradients as ``solvers.gka_grad.gka_implicit_grads`` (whose docstring states them) computed
per chunk from the chunk-start states, never forming H_t: with ``dx_t = U_t^T dy_t`` and
``dq_t = A_t^{-1} dx_t`` (eq. (6); the caller solves it with the same r Chebyshev steps as the
forward), ``w_t = 2 a x_t^T dq_t / ||H_t||_F`` (Lemma 1), the local cotangents
``dH_t = -dq_t x_t^T - (w_t / 2) H_t`` (eq. (13)) and ``dU_t = dy_t x_t^T`` enter

    P_i = sum_{t >= i} M_{i,t} dH_t,   Q_i = sum_{t >= i} M_{i,t} dU_t,
    dk_i = beta_i ((P_i + P_i^T) k_i + Q_i^T v_i),   dv_i = beta_i Q_i k_i,
    dbeta_i = k_i^T P_i k_i + v_i^T Q_i k_i,
    dG_i = <dH_i, H_i> + <dU_i, U_i> - beta_i dbeta_i,   dg_t = sum_{i >= t} dG_i.

Per chunk (local tokens c = 1..C, state S at the chunk start, ``M[i, c] = exp(G_c - G_i)``,
``e_i = M[i, C]``), ``P_i k_i`` splits into the rank-one part ``-(M . K X^T) dQ``, the
``w H`` part ``b_i S k_i + ((K K^T) . M diag(w) M^T) (beta K)`` with ``b = M (w . zeta)``
(chunk_intra_Bk), and the carry ``e_i P_end k_i`` of everything after the chunk, where
``P_end`` runs backwards over the chunks: ``P_end <- zeta_C P_end + sum_c zeta_c dH_c``
(chunk_intra_Btilde for the ``w H`` part). Q likewise with ``dU``. ``<dH_i, H_i> =
-dq_i . (H_i x_i) - (w_i / 2) ||H_i||_F^2`` and ``<dU_i, U_i> = dy_i . (U_i x_i)`` use the
chunked products below. Everything runs in the dtype of its inputs (float32 on the GPU,
float64 in the tests' reference).
"""

from __future__ import annotations

from typing import Optional

import torch

from solvers.gka_chunk import chunk_backward_coefficients, decay_mask


def chunked(x: Optional[torch.Tensor], C: int) -> Optional[torch.Tensor]:
    """``(N, NC * C, ...)`` as ``(N, NC, C, ...)``."""
    if x is None:
        return None
    return x.reshape(x.shape[0], x.shape[1] // C, C, *x.shape[2:])


def _decays(G: torch.Tensor):
    """``M[i, c] = exp(G_c - G_i)`` (upper), ``Mt = M^T`` (rows are tokens) and ``zeta = exp(G)``."""
    M = decay_mask(G)
    return M, M.transpose(-1, -2), torch.exp(G)


def _acc(acc: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``acc + A @ B`` for batched ``(..., m, k) @ (..., k, n)``, added in the product's epilogue
    (``Tensor.baddbmm_``: no separate pass to add). ``acc`` contiguous, owned by the caller,
    overwritten."""
    acc.view(-1, *acc.shape[-2:]).baddbmm_(
        A.reshape(-1, *A.shape[-2:]), B.reshape(-1, *B.shape[-2:])
    )
    return acc


def state_products(X, K, Vals, G, beta, S, zX=None):
    """Rows ``Z_c x_c`` for ``Z_c = zeta_c S + sum_{j <= c} Mt[c, j] beta_j vals_j k_j^T`` (H with
    Vals = K, U with Vals = V), all chunks at once. X ``(N, NC, C, D)``, S ``(N, NC, m, D)``. The
    row scaling zeta_c is applied to x_c (``zX``, the rows ``zeta_c x_c`` if the caller has them),
    so the state term adds in the product's epilogue."""
    _, Mt, zeta = _decays(G)
    bK = K if beta is None else beta.unsqueeze(-1) * K
    intra = (Mt * (X @ bK.transpose(-1, -2))) @ Vals
    return _acc(intra, zeta.unsqueeze(-1) * X if zX is None else zX, S.transpose(-1, -2))


def transposed_state_products(dY, K, V, G, beta, R):
    """Rows ``U_c^T dy_c = zeta_c R^T dy_c + sum_{j <= c} Mt[c, j] beta_j k_j (v_j . dy_c)``."""
    _, Mt, zeta = _decays(G)
    bK = K if beta is None else beta.unsqueeze(-1) * K
    return _acc((Mt * (dY @ V.transpose(-1, -2))) @ bK, zeta.unsqueeze(-1) * dY, R)


def _carry_backwards(delta: torch.Tensor, decay_last: torch.Tensor) -> torch.Tensor:
    """``E_n = sum_{m > n} (prod_{n < l < m} zeta^l_C) delta_m``: what the chunks after chunk n
    contribute, seen from its last token (``E_{NC-1} = 0``). delta ``(N, NC, a, b)``."""
    out = torch.zeros_like(delta)
    E = torch.zeros_like(delta[:, 0])
    for n in range(delta.shape[1] - 1, -1, -1):
        out[:, n] = E
        E = decay_last[:, n, None, None] * E + delta[:, n]
    return out


def _symmetric_carry(delta, S, c, decay_last):
    """``P + P^T`` for ``P = _carry_backwards(delta + c S, decay_last)``: the reference form of
    ``kernels.gka_layer_carry.symmetric_carry``. c ``(N, NC)``."""
    P = _carry_backwards(delta + c[..., None, None] * S, decay_last)
    return P + P.transpose(-1, -2)


def implicit_backward(
    *,
    K,
    G,
    beta,
    X,
    dQ,
    fro,
    S,
    a,
    V=None,
    dY=None,
    R=None,
    absolute: bool = False,
    carry=_carry_backwards,
    symmetric_carry=_symmetric_carry,
):
    """dk, dv, dbeta and the per-token dG of the module docstring, all chunked.

    K, X, dQ ``(N, NC, C, D)``; G, fro, beta ``(N, NC, C)`` (beta may be None); S ``(N, NC, D, D)``
    chunk-start states; for the layer also V, dY ``(N, NC, C, Dv)`` and R ``(N, NC, Dv, D)``
    (None for the solve stage alone, whose cotangent is dX directly). Padding tokens must have
    k = v = 0, dQ = dY = 0 and a finite fro > 0. Returns ``(dk, dv, dbeta, dG)`` (dv None
    without V). ``absolute=True`` (with entrywise absolute values as inputs) adds every term
    instead of subtracting: the sums of the terms' magnitudes, which rounding bounds scale with.
    ``carry(delta, decay_last)``: the walk that forms ``Q_end`` (default the PyTorch loop
    :func:`_carry_backwards`; the kernels pass ``kernels.gka_layer_carry.carry_backwards``);
    ``symmetric_carry(delta, S, c, decay_last)``: ``P_end + P_end^T`` for ``P_end`` the carry of
    ``delta + c S`` (default :func:`_symmetric_carry`; the kernels pass
    ``kernels.gka_layer_carry.symmetric_carry``). Only that sum enters: ``P k + P^T k`` in dk and
    ``k^T P k = k^T (P + P^T) k / 2`` in dbeta.
    """
    sgn = 1.0 if absolute else -1.0
    M, _, zeta = _decays(G)
    w = 2.0 * a * (X * dQ).sum(-1) / fro  # Lemma 1
    bK = K if beta is None else beta.unsqueeze(-1) * K
    b, Mw = chunk_backward_coefficients(G, w)
    e = torch.exp(G[..., -1:] - G)  # M_{i,C}
    decay_last = zeta[..., -1]
    # the w H part, shared by P k and P^T k (it is symmetric)
    wH_k = _acc(((K @ K.transpose(-1, -2)) * Mw) @ bK, b.unsqueeze(-1) * K, S)
    KX = M * (K @ X.transpose(-1, -2))  # [i, c] = M_{i,c} k_i . x_c
    s = (zeta * zeta * w).sum(-1)
    coef = b if beta is None else beta * b
    # sum_c zeta_c dH_c = sgn ((dQ . zeta)^T X + (s S + K^T (coef K)) / 2): its two products as
    # one (the operands side by side), the (D, D) s S term added inside the carry (halving is
    # exact); the (D, D) tensors are the largest of the backward, each pass over them counts
    half = 0.5 * sgn
    left = torch.cat([K, (sgn * zeta).unsqueeze(-1) * dQ], -2).transpose(-1, -2)  # (D, 2C)
    right = torch.cat([(half * coef).unsqueeze(-1) * K, X], -2)  # (2C, D)
    eK = e.unsqueeze(-1) * K
    KSig = eK @ symmetric_carry(left @ right, S, half * s, decay_last)
    # P k + P^T k = sgn (KX dQ + (M . K dQ^T) X + w H k) + e K (P_end + P_end^T): the local part
    # accumulated in the products' epilogues, the carried part added with the sign
    local = _acc(_acc(wH_k, KX, dQ), M * (K @ dQ.transpose(-1, -2)), X)
    dk_sum = torch.add(KSig, local, alpha=sgn)
    kPk = 0.5 * (K * dk_sum).sum(-1)  # k^T P k = k^T (P + P^T) k / 2
    zX = zeta.unsqueeze(-1) * X  # the rows zeta_c x_c, shared by H x, U x and sum_c zeta_c dU_c
    HX = state_products(X, K, K, G, beta, S, zX)
    own = sgn * ((dQ * HX).sum(-1) + 0.5 * w * fro * fro)
    dv = None
    vQk = torch.zeros_like(kPk)
    if V is not None:
        dU_sum = dY.transpose(-1, -2) @ zX  # sum_c zeta_c dU_c = sum_c dy_c (zeta_c x_c)^T
        Q_end = carry(dU_sum, decay_last)
        Qk = _acc(KX @ dY, eK, Q_end.transpose(-1, -2))
        vQk = (V * Qk).sum(-1)
        # Q^T v into dk: (M . V dY^T) X + e V Q_end, in the epilogues
        _acc(_acc(dk_sum, M * (V @ dY.transpose(-1, -2)), X), e.unsqueeze(-1) * V, Q_end)
        dv = Qk if beta is None else beta.unsqueeze(-1) * Qk
        own = own + (dY * state_products(X, K, V, G, beta, R, zX)).sum(-1)
    dbeta = kPk + vQk
    dk = dk_sum if beta is None else beta.unsqueeze(-1) * dk_sum
    dG = own + sgn * (dbeta if beta is None else beta * dbeta)
    return dk, dv, dbeta, dG


def chunk_states_reference(K, G, beta, V=None):
    """The chunk-start states ``H`` (and ``U`` with V) of (CH) in the inputs' dtype, ``(N, NC, D, D)``,
    by ``S <- zeta_C S + K^T diag(exp(G_C - G_j) beta_j) K`` (what ``states_kernel`` computes)."""
    N, NC = K.shape[:2]
    coef = torch.exp(G[..., -1:] - G)
    if beta is not None:
        coef = coef * beta
    H = torch.zeros(N, K.shape[-1], K.shape[-1], dtype=K.dtype, device=K.device)
    U = (
        None
        if V is None
        else torch.zeros(N, V.shape[-1], K.shape[-1], dtype=K.dtype, device=K.device)
    )
    Hs, Us = [], []
    for n in range(NC):
        Hs.append(H)
        Us.append(U)
        Kc = coef[:, n].unsqueeze(-1) * K[:, n]
        H = torch.exp(G[:, n, -1])[:, None, None] * H + K[:, n].transpose(-1, -2) @ Kc
        if V is not None:
            U = torch.exp(G[:, n, -1])[:, None, None] * U + V[:, n].transpose(-1, -2) @ Kc
    return torch.stack(Hs, 1), (None if V is None else torch.stack(Us, 1))


def reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``out_t = sum_{i >= t} x_i`` along the last dimension (``dg_t = sum_{i >= t} dG_i``)."""
    return torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1])
