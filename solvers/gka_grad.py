"""Gradients of the GKA layer by implicit differentiation (GKA Sec. 4.2.2, Lemma 1, appendix D.2).

With ``A_t = H_t + lambda_t I``, ``lambda_t = a ||H_t||_F``, ``x_t = A_t^{-1} q_t``,
``y_t = U_t x_t`` and an upstream gradient dy_t:

    dx_t = U_t^T dy_t,   dU_t = dy_t x_t^T                            (local, from y_t = U_t x_t)
    dq_t = A_t^{-1} dx_t                                               (6)
    dH_t = -dq_t x_t^T - a (x_t^T dq_t) H_t / ||H_t||_F                (12)-(13), local
    w_t = 2 a x_t^T dq_t / ||H_t||_F                                   (Lemma 1)
    dk_i = beta_i sum_{t >= i} M_{i,t} (-dq_t x_t^T - x_t dq_t^T - w_t H_t) k_i    (7)
           + beta_i sum_{t >= i} M_{i,t} dU_t^T v_i                    (value path)

computed with the backward recursions (8) ``A_i = gamma_{i+1} A_{i+1} + dq_i x_i^T`` and (9)
``B_i = gamma_{i+1} B_{i+1} + w_i H_i``. For the log gates (appendix eqs. (16)-(22) with
H_0 = 0 and the whole sequence as one chunk):

    dG_i = <dH_i, H_i> + <dU_i, U_i> - beta_i (k_i^T P_i k_i + v_i^T Q_i k_i),
    P_i = sum_{t >= i} M_{i,t} dH_t,   Q_i = sum_{t >= i} M_{i,t} dU_t,   dg_t = sum_{i >= t} dG_i,

and ``dbeta_i = k_i^T P_i k_i + v_i^T Q_i k_i``. Everything is float64 (a reference).

The printed forms that do not hold are kept as functions, to be refuted by the tests
(``docs/errata.md``, GKA): :func:`lemma1_dk` with ``w_sign=+1`` is appendix eq. (15),
:func:`appendix40_dk` with ``product="printed"`` is appendix eq. (40), :func:`eq24_printed`
is appendix eq. (24).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import validation as check
from ._arith import Arith
from .chebyshev import chebyshev
from .cholesky import cholesky_solve
from .gka import check_ridge_in, gka_layer, run_layer, validate_inputs
from .gka_chunk import chunk_frobenius_terms, chunk_intra_Bk, decay_mask

F64 = torch.float64


@dataclass
class GKAGrads:
    """Gradients of ``sum_t <dy_t, y_t>``; dg / dbeta are None when the gate was not given.

    ``x`` and ``w`` (Lemma 1's w_t) are kept for the chunkwise checks; ``dg_scale`` and
    ``dbeta_scale`` are dg and dbeta summed from the absolute values of their terms: both
    cancel (dg_1 = 0 exactly; dbeta = 0 for T = 1, where y does not depend on beta), so a
    rounding bound needs the scale of what cancelled."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dg: Optional[torch.Tensor]
    dbeta: Optional[torch.Tensor]
    x: torch.Tensor
    w: torch.Tensor
    dg_scale: Optional[torch.Tensor] = None
    dbeta_scale: Optional[torch.Tensor] = None


def reverse_decay_sum(X: torch.Tensor, gamma: Optional[torch.Tensor]) -> torch.Tensor:
    """``S_i = sum_{t >= i} M_{i,t} X_t`` by ``S_i = gamma_{i+1} S_{i+1} + X_i`` (eqs. (8), (9)).

    X ``(..., T, m, n)``, gamma ``(..., T)`` or None (all ones)."""
    T = X.shape[-3]
    out = [None] * T
    S = torch.zeros_like(X[..., 0, :, :]) if T else None
    for t in reversed(range(T)):
        if t < T - 1 and gamma is not None:
            S = gamma[..., t + 1, None, None] * S
        S = S + X[..., t, :, :]
        out[t] = S
    return torch.stack(out, dim=-3) if T else X.clone()


def _mv(S: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (S @ x.unsqueeze(-1)).squeeze(-1)


def lemma1_dk(k, dq, x, H, w, *, gamma=None, beta=None, w_sign: float = -1.0) -> torch.Tensor:
    """The H-path of dk (GKA Lemma 1, eq. (7)) with the recursions (8)-(9).

    ``w_sign = -1`` is the main text's ``-w_t H_t``; ``w_sign = +1`` is appendix eq. (15)'s
    ``+w_t H_t``, which is wrong (docs/errata.md). Shapes: k, dq, x ``(..., T, D)``,
    H ``(..., T, D, D)``, w, gamma, beta ``(..., T)``.
    """
    Aseq = reverse_decay_sum(dq.unsqueeze(-1) * x.unsqueeze(-2), gamma)
    Bseq = reverse_decay_sum(w[..., None, None] * H, gamma)
    dk = -_mv(Aseq, k) - _mv(Aseq.transpose(-1, -2), k) + w_sign * _mv(Bseq, k)
    return dk if beta is None else beta.unsqueeze(-1) * dk


def appendix40_dk(k, dq, x, H, fro, *, a: float, g=None, product: str = "printed") -> torch.Tensor:
    """Appendix eq. (40) (no input gate): ``dk_l = -sum_{t >= l} c_{l,t} [<k_l, x_t> dq_t +
    <k_l, dq_t> x_t + 2a <x_t, dq_t> H_t k_l / ||H_t||_F]``.

    ``product="printed"``: ``c_{l,t} = prod_{i=l}^{t-1} gamma_i`` (eqs. (32)-(41)), the decay
    of a recurrence ``H_t = gamma_{t-1} H_{t-1} + k_t k_t^T``; ``"corrected"``:
    ``prod_{i=l+1}^{t} gamma_i = M_{l,t}``, that of (CH). They agree when all gammas are equal.
    """
    if product not in ("printed", "corrected"):
        raise ValueError(f"product must be 'printed' or 'corrected', got {product!r}")
    if g is None:
        G = torch.zeros(k.shape[:-1], dtype=k.dtype, device=k.device)
    else:
        G = torch.cumsum(g, dim=-1)
    if product == "printed":  # exponent G_{t-1} - G_{l-1}: shift G by one token
        G = torch.cat([torch.zeros_like(G[..., :1]), G[..., :-1]], dim=-1)
    coef = decay_mask(G)  # [l, t]
    kx = k @ x.transpose(-1, -2)  # [l, t] = <k_l, x_t>
    kdq = k @ dq.transpose(-1, -2)
    s = 2.0 * a * (x * dq).sum(-1) / fro  # [t]
    Hk = torch.einsum("...tij,...lj->...lti", H, k)  # [l, t] -> H_t k_l
    terms = (
        kx.unsqueeze(-1) * dq.unsqueeze(-3)
        + kdq.unsqueeze(-1) * x.unsqueeze(-3)
        + s[..., None, :, None] * Hk
    )
    return -(coef.unsqueeze(-1) * terms).sum(-2)


def _validate(q, k, v, dy, g, beta, a):
    """The layer's inputs and the upstream gradient, checked alike by both gradient functions.

    ``dy`` must have exactly y's shape ``(*batch, T, Dv)`` (the inputs' broadcast batch): a
    broadcast dy would silently sum gradients over systems that do not exist. Any supported
    dtype (it is converted exactly to float64), on q's device. ``a`` must not round to 0 or inf
    in the inputs' working precision, where the layer itself would refuse it."""
    inp = validate_inputs(q, k, v, g, beta, a)
    check_ridge_in(inp.a, Arith(inp.q.dtype).compute)
    dy = check.tensor("dy", dy, min_ndim=2)
    if dy.device != inp.q.device:
        raise ValueError(f"dy is on {dy.device} but q is on {inp.q.device}; they must match")
    T, Dv = inp.q.shape[-2], inp.v.shape[-1]
    if dy.shape[-2:] != (T, Dv):
        raise ValueError(f"dy must end in (T, Dv) = ({T}, {Dv}), got shape {tuple(dy.shape)}")
    if dy.shape[:-2] != inp.batch:
        raise ValueError(
            f"dy must have y's shape (*batch, T, Dv) = {(*inp.batch, T, Dv)} exactly, got "
            f"{tuple(dy.shape)}"
        )
    return inp, dy


def gka_implicit_grads(
    q, k, v, dy, *, a: float, g=None, beta=None, iters: Optional[int] = None
) -> GKAGrads:
    """Gradients of ``sum_t <dy_t, y_t>`` for :func:`solvers.gka.gka_layer` with the exact
    solve, by implicit differentiation (module docstring). Inputs in any supported dtype are
    converted exactly to float64; results are float64, shaped like the inputs' broadcast.

    ``iters=r``: the same formulas at r Chebyshev steps (GKA Algorithm 1, ``L = (1 + a)
    ||H_t||_F``, ``mu = a ||H_t||_F``): x_t and dq_t (eq. (6)) are r-step solves, as a kernel
    that trains by implicit differentiation computes them (Table 1).

    ``dy``: exactly y's shape ``(*batch, T, Dv)``, any supported dtype, on q's device."""
    inp, dy = _validate(q, k, v, dy, g, beta, a)
    B, T, D, Dv = inp.batch, inp.q.shape[-2], inp.q.shape[-1], inp.v.shape[-1]
    inp.q, inp.k, inp.v = inp.q.to(F64), inp.k.to(F64), inp.v.to(F64)
    inp.g = None if inp.g is None else inp.g.to(F64)
    inp.beta = None if inp.beta is None else inp.beta.to(F64)
    ar = Arith(F64)
    tr = run_layer(inp, ar, "exact" if iters is None else "chebyshev", iters, keep_states=True)
    H, U, x, fro = tr.H, tr.U, tr.x, tr.fro
    dy = dy.to(F64)
    k64 = inp.k.expand(*B, T, D)
    v64 = inp.v.expand(*B, T, Dv)
    gamma = None if inp.g is None else torch.exp(inp.g.expand(*B, T))
    beta64 = None if inp.beta is None else inp.beta.expand(*B, T)

    dx = _mv(U.transpose(-1, -2), dy)
    A = H + (inp.a * fro)[..., None, None] * torch.eye(D, dtype=F64, device=H.device)
    if iters is None:
        dq, _ = cholesky_solve(ar, A, dx)  # (6)
    else:
        dq = chebyshev(
            A, dx, L=(1.0 + inp.a) * fro, mu=inp.a * fro, iters=check.count("iters", iters)
        )
    w = 2.0 * inp.a * (x * dq).sum(-1) / fro  # Lemma 1
    dH = -dq.unsqueeze(-1) * x.unsqueeze(-2) - 0.5 * w[..., None, None] * H  # (13)
    dU = dy.unsqueeze(-1) * x.unsqueeze(-2)

    Q = reverse_decay_sum(dU, gamma)
    P = reverse_decay_sum(dH, gamma)
    dk = lemma1_dk(k64, dq, x, H, w, gamma=gamma, beta=beta64)
    bv = v64 if beta64 is None else beta64.unsqueeze(-1) * v64
    dk = dk + _mv(Q.transpose(-1, -2), bv)
    dv = _mv(Q, k64 if beta64 is None else beta64.unsqueeze(-1) * k64)
    kPk = (k64 * _mv(P, k64)).sum(-1)
    vQk = (v64 * _mv(Q, k64)).sum(-1)
    dbeta = None if inp.beta is None else kPk + vQk
    dbeta_scale = None if inp.beta is None else kPk.abs() + vQk.abs()
    dg = dg_scale = None
    if inp.g is not None:
        own = (dH * H).sum((-1, -2)) + (dU * U).sum((-1, -2))
        b = 1.0 if beta64 is None else beta64
        dG = own - (kPk + vQk) * b  # (22), H_0 = 0
        dg = _reverse_cumsum(dG)
        dg_scale = _reverse_cumsum(
            (dH * H).sum((-1, -2)).abs()
            + (dU * U).sum((-1, -2)).abs()
            + (kPk.abs() + vQk.abs()) * b
        )
    return GKAGrads(
        dq=dq,
        dk=dk,
        dv=dv,
        dg=dg,
        dbeta=dbeta,
        x=x,
        w=w,
        dg_scale=dg_scale,
        dbeta_scale=dbeta_scale,
    )


def _reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``out_t = sum_{i >= t} x_i`` (``dg_t = sum_{i >= t} dG_i`` since ``G_i = sum_{t <= i} g_t``)."""
    return torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1])


def gka_autograd_grads(q, k, v, dy, *, a: float, g=None, beta=None) -> GKAGrads:
    """The same gradients by ``torch.autograd`` through the float64 exact (Cholesky) layer.

    Inputs and ``dy`` are checked as by :func:`gka_implicit_grads` (one dtype for q, k, v, g,
    beta before the conversion to float64; dy exactly y's shape)."""
    inp, dy = _validate(q, k, v, dy, g, beta, a)
    leaves = {}
    for name in ("q", "k", "v", "g", "beta"):
        t = getattr(inp, name)
        leaves[name] = None if t is None else t.detach().to(F64).requires_grad_(True)
    with torch.enable_grad():
        y, info = gka_layer(
            leaves["q"],
            leaves["k"],
            leaves["v"],
            a=a,
            g=leaves["g"],
            beta=leaves["beta"],
            return_info=True,
        )
        loss = (y * dy.to(F64)).sum()
        wanted = [t for t in leaves.values() if t is not None]
        grads = dict(
            zip([n for n, t in leaves.items() if t is not None], torch.autograd.grad(loss, wanted))
        )
    return GKAGrads(
        dq=grads["q"],
        dk=grads["k"],
        dv=grads["v"],
        dg=grads.get("g"),
        dbeta=grads.get("beta"),
        x=info.x.detach(),
        w=torch.full_like(info.fro, float("nan")),
    )


def eq13_dH(H, x, dq, *, a: float, sign: float = -1.0) -> torch.Tensor:
    """Appendix eq. (13): ``dH = -dq x^T + sign * a (x^T dq) H / ||H||_F`` (printed: sign = -1)."""
    fro = torch.linalg.matrix_norm(H)
    return (
        -dq.unsqueeze(-1) * x.unsqueeze(-2)
        + sign * a * ((x * dq).sum(-1) / fro)[..., None, None] * H
    )


def chunk_states(H0, K, G) -> torch.Tensor:
    """``H_c = e^{G_c} H_0 + sum_{j <= c} e^{G_c - G_j} k_j k_j^T`` (appendix eq. (17)),
    ``(..., C, D, D)`` for K ``(..., C, D)``, G ``(..., C)``; differentiable in G."""
    M = decay_mask(G)  # [j, c]
    return torch.exp(G)[..., None, None] * H0.unsqueeze(-3) + torch.einsum(
        "...jc,...jd,...je->...cde", M, K, K
    )


def chunk_dG(H0, K, G, dH, dH_next):
    """``dG_1..dG_C`` (appendix eq. (22)) and ``dG_{C+1}`` (eq. (23)) for one chunk.

    H0 ``(..., D, D)``; K ``(..., C+1, D)`` keys k_1..k_{C+1}; G ``(..., C+1)``; dH ``(..., C, D, D)``
    local cotangents of H_1..H_C; dH_next ``(..., D, D)`` the aggregated cotangent of H_{C+1}.
    """
    C = dH.shape[-3]
    E = decay_mask(G)  # [j, c] = e^{G_c - G_j}, c >= j
    Kc = K[..., :C, :]
    quad = torch.einsum("...cde,...jd,...je->...cj", dH, K, K)  # [c, j] = k_j^T dH_c k_j
    own = torch.exp(G[..., :C]) * (dH * H0.unsqueeze(-3)).sum((-1, -2))
    own = own + (E[..., :, :C].transpose(-1, -2) * quad).sum(-1)  # sum_{j <= i} e^{G_i - G_j} ...
    later = (E[..., :C, :C] * quad[..., :, :C].transpose(-1, -2)).sum(
        -1
    )  # sum_{c >= i} e^{G_c - G_i} k_i^T dH_c k_i
    nxt = (Kc * (Kc @ dH_next.transpose(-1, -2))).sum(-1)  # k_i^T dH_{C+1} k_i
    dG = own - later - E[..., :C, C] * nxt
    dG_next = torch.exp(G[..., C]) * (dH_next * H0).sum((-1, -2)) + (E[..., :C, C] * nxt).sum(-1)
    return dG, dG_next


def eq24_printed(H0, K, G, w, B_next):
    """Appendix eq. (24) as printed: the parts of dG_i and dG_{C+1} due to the ``w_t H_t`` term,

        (1/2) <w_i H_i, H_i> - (1/2) k_i^T B_i k_i,
        (1/2) e^{G_C} <Bt_{C+1}, H_0> + (1/2) sum_j e^{G_C - G_j} k_j^T Bt_{C+1} k_j,

    evaluated with the chunkwise quantities of Sec. 4.2.2: ``||H_i||_F^2`` by eq. (5),
    ``B_i k_i = B_i^intra k_i + M_{i,C} Bt_{C+1} k_i``, ``Bt_{C+1} = gamma_{C+1} B_{C+1}``.
    K ``(..., C, D)``, G ``(..., C+1)``, w ``(..., C)``, B_next = B_{C+1} ``(..., D, D)``.
    The true parts are the negatives (:func:`eq24_corrected`; docs/errata.md).
    """
    C = K.shape[-2]
    Gc = G[..., :C]
    Bt = torch.exp(G[..., C] - G[..., C - 1])[..., None, None] * B_next
    fro2 = sum(chunk_frobenius_terms(Arith(F64), H0, K, Gc))
    Bk = chunk_intra_Bk(H0, K, Gc, w) + torch.exp(Gc[..., -1:] - Gc).unsqueeze(-1) * (
        K @ Bt.transpose(-1, -2)
    )
    first = 0.5 * w * fro2 - 0.5 * (K * Bk).sum(-1)
    second = 0.5 * torch.exp(Gc[..., -1]) * (Bt * H0).sum((-1, -2)) + 0.5 * (
        torch.exp(Gc[..., -1:] - Gc) * (K * (K @ Bt.transpose(-1, -2))).sum(-1)
    ).sum(-1)
    return first, second


def eq24_corrected(H0, K, G, w, B_next):
    """Appendix eq. (24) with the sign of ``dH_t = ... - (1/2) w_t H_t`` carried through."""
    first, second = eq24_printed(H0, K, G, w, B_next)
    return -first, -second
