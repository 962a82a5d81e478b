"""Bounds for Kaczmarz and KLA / GDN: convergence rates and rounding bounds (docs/kla.md).

Convergence (exact arithmetic):

* :func:`strohmer_vershynin_rate`: randomized Kaczmarz with row probabilities ``||a_i||^2 /
  ||A||_F^2`` satisfies ``E||x_k - x*||^2 <= (1 - 1/kappa_F^2)^k ||x_0 - x*||^2`` after k single-row
  steps, ``kappa_F = ||A||_F ||A^+||_2`` (Strohmer & Vershynin 2009, Thm. 2; full column rank).
* :func:`random_expected_sq_error`: that expectation *exactly*, by the second-moment recursion
  ``X <- sum_i p_i P_i X P_i`` (P_i the projector of row i), so the SV bound can be checked
  without sampling noise.
* :func:`sweep_operator`: the linear part ``M = I - A^T (D_eps/omega + L)^{-1} A`` of one
  cyclic sweep (the pyamg closed form); ``||e_k|| <= ||M^k||_2 ||e_0||`` is exact for the cyclic
  order (:func:`cyclic_error_bound`).

Rounding (first order; ``gamma_n = n u / (1 - n u)``, Higham 2002, Lemma 3.1), each written as a
*running error bound* evaluated along the float64 trajectory:

* :func:`kaczmarz_rounding_bound`: local errors
  ``delta_s <= omega (gamma_n ||x_s|| + gamma_{n+4} |r_i|/||a_i||) + (u_acc + u_store) ||x_{s+1}||``, each
  carried through the exact linear parts of the later steps (relaxed projections, norm <= 1 for
  0 < omega < 2) of the rows actually used.
* :func:`kla_tokenwise_bound`: KLA's token map ``S -> (I - beta k k^T) D S + beta k v^T`` has
  norm ``G_t <= max(alpha_t) max(1, |1 - beta_t ||k_t||^2|)`` (= max alpha_t <= 1 for KLA with
  eta <= 2); the local error is ``gamma_{d_k+5} m_t + (u_acc + u_store) ||S_t||_F`` with
  ``m_t = ||S~||_F + beta ||k|| (||S~||_F ||k|| + ||e||)``; ``E_t = G_t E_{t-1} + delta_t``.
* :func:`kla_chunkwise_bound`: per chunk, componentwise perturbations of the decay ratios
  (log-sums in the compute dtype), the Gram matrices, L and the right-hand side, then forward
  substitution (Higham Thm. 8.5: ``(I + L + dL) U^ = R``, ``|dL| <= gamma_C |L|``), pushed
  through ``|(I + L)^{-1}|`` -- the growth of the chunk's triangular solve, the Skeel-type
  quantity ``|| |(I+L)^{-1}| |I+L| |U| ||`` that makes the rounding of the chunk form
  ``~ C u growth``; the incoming state error travels through ``||P_i||_2 <= prod G_s``.

log / exp are taken to be accurate to 2u (one ulp), sums left to right as in ``solvers.kla``.
"""

from __future__ import annotations

import math

import torch

from solvers import Arith
from solvers import validation as _v
from solvers.kla import check_arguments

_F64 = torch.float64


def _system_matrix(A) -> torch.Tensor:
    A = _v.tensor("A", A, min_ndim=2)
    if 0 in A.shape:
        raise ValueError(f"A must be non-empty (batch, m, n all >= 1), got shape {tuple(A.shape)}")
    return A


def _relaxation(relaxation, eps) -> tuple:
    """``0 < omega < 2`` and ``eps >= 0``: what every bound here assumes (``||P_s||_2 <= 1``)."""
    if isinstance(relaxation, bool) or not isinstance(relaxation, (int, float)):
        raise TypeError(f"relaxation must be a float, got {type(relaxation).__name__}")
    if not 0 < relaxation < 2:
        raise ValueError(f"relaxation must be in (0, 2), got {relaxation}")
    return float(relaxation), _v.tolerance("eps", eps)


def gamma(n, u: float):
    """Higham's ``gamma_n = n u / (1 - n u)`` (inf once ``n u >= 1``); n may be a tensor."""
    nu = torch.as_tensor(n, dtype=_F64) * u
    return torch.where(nu < 1, nu / (1 - nu).clamp_min(1e-300), torch.full_like(nu, math.inf))


# ----------------------------------------------------------------------------- Kaczmarz


def strohmer_vershynin_rate(A: torch.Tensor) -> torch.Tensor:
    """``1 - 1/kappa_F^2`` with ``kappa_F = ||A||_F / sigma_min(A)`` (float64, per system)."""
    A = _system_matrix(A).to(_F64)
    s = torch.linalg.svdvals(A)
    kappa_f = torch.linalg.matrix_norm(A) / s[..., -1]
    return 1.0 - 1.0 / kappa_f**2


def random_expected_sq_error(A: torch.Tensor, e0: torch.Tensor, steps: int) -> torch.Tensor:
    """Exact ``E||e_k||^2``, k = 0..steps, of randomized Kaczmarz (omega = 1, eps = 0) on a
    consistent system with initial error e0, rows drawn with probability ``||a_i||^2/||A||_F^2``.

    ``e_{k+1} = P_i e_k`` with ``P_i = I - a_i a_i^T/||a_i||^2``, so ``X_k = E[e_k e_k^T]`` obeys
    ``X_{k+1} = sum_i p_i P_i X_k P_i`` and ``E||e_k||^2 = tr X_k``. A single system (2-D A)."""
    A, e0 = _system_matrix(A), _v.tensor("e0", e0, min_ndim=1)
    if A.ndim != 2 or tuple(e0.shape) != (A.shape[-1],):
        raise ValueError(
            f"A must be one (m, n) matrix and e0 (n,), got {tuple(A.shape)} and {tuple(e0.shape)}"
        )
    steps = _v.count("steps", steps)
    A, e0 = A.to(_F64), e0.to(_F64)
    norms2 = (A * A).sum(-1)
    keep = norms2 > 0
    A, norms2 = A[keep], norms2[keep]
    p = norms2 / norms2.sum()
    n = A.shape[-1]
    P = torch.eye(n, dtype=_F64) - A.unsqueeze(-1) * A.unsqueeze(-2) / norms2[:, None, None]
    X = torch.outer(e0, e0)
    out = [torch.trace(X)]
    for _ in range(steps):
        X = torch.einsum("i,iab,bc,icd->ad", p, P, X, P)
        out.append(torch.trace(X))
    return torch.stack(out)


def sweep_operator(A: torch.Tensor, *, relaxation: float = 1.0, eps: float = 0.0) -> torch.Tensor:
    """``M = I - A^T (D_eps/omega + L)^{-1} A``, the error map of one cyclic sweep (float64).

    ``D_eps = diag(||a_i||^2 + eps)``, L the strict lower part of ``A A^T``. Rows with
    ``||a_i||^2 + eps = 0`` are skipped by the solver and dropped here."""
    A = _system_matrix(A).to(_F64)
    relaxation, eps = _relaxation(relaxation, eps)
    den = (A * A).sum(-1) + eps
    if A.ndim == 2:
        A = A[den > 0]
        den = den[den > 0]
    G = A @ A.transpose(-1, -2)
    T = torch.tril(G, -1) + torch.diag_embed(den / relaxation)
    n = A.shape[-1]
    return torch.eye(n, dtype=_F64) - A.transpose(-1, -2) @ torch.linalg.solve_triangular(
        T, A, upper=False
    )


def cyclic_error_bound(
    A: torch.Tensor, e0_norm, sweeps: int, *, relaxation: float = 1.0, eps: float = 0.0
) -> torch.Tensor:
    """``||M^k||_2 ||e_0||``, k = 0..sweeps: the exact worst case over e_0 of that norm."""
    sweeps = _v.count("sweeps", sweeps)
    e0_norm = _v.parameter("e0_norm", e0_norm, torch.Size(A.shape[:-2]), "cpu")
    if e0_norm.numel() and not bool((e0_norm >= 0).all()):
        raise ValueError("e0_norm must be >= 0")
    M = sweep_operator(A, relaxation=relaxation, eps=eps)
    Mk = torch.eye(M.shape[-1], dtype=_F64).expand_as(M)
    out = []
    for _ in range(sweeps + 1):
        out.append(torch.linalg.matrix_norm(Mk, ord=2) * torch.as_tensor(e0_norm, dtype=_F64))
        Mk = M @ Mk
    return torch.stack(out)


def kaczmarz_rounding_bound(
    A,
    b,
    *,
    sweeps: int,
    rows=None,
    relaxation: float = 1.0,
    eps: float = 0.0,
    x0=None,
    arith: Arith,
) -> torch.Tensor:
    """Bound on ``||x^_k - x_k^mp||_2`` after each sweep, ``(sweeps + 1, *batch)``.

    Local error of step s: the residual ``r_i = b_i - a_i^T x_s`` is computed with error
    ``<= gamma_n |a_i|^T |x_s| + u |r_i|``, the coefficient ``omega r_i / (||a_i||^2 + eps)`` then carries
    relative error gamma_{n+4} (denominator gamma_{n+1}, two operations) on top, and the update
    and store add ``(u_acc + u_store) ||x_{s+1}||``; with ``|a|^T|x| <= ||a|| ||x||`` and ``||a||^2 <= den``:
    ``delta_s <= omega (gamma_n ||x_s|| + gamma_{n+4} |r_i| / ||a_i||) + (u_acc + u_store) ||x_{s+1}||``.
    Two runs of the same steps differ by the linear parts ``P_s = I - omega a_i a_i^T / (||a_i||^2 + eps)``
    of the steps after it, so ``E_k = ||P_m..P_1||_2 E_{k-1} + sum_s ||P_m..P_{s+1}||_2 delta_s`` for the
    rows actually used (every ``||P_s||_2 <= 1`` for 0 < omega < 2, eps >= 0)."""
    A = _system_matrix(A)
    b = _v.tensor("b", b, min_ndim=1)
    if b.shape[-1] != A.shape[-2]:
        raise ValueError(f"b has last dimension {b.shape[-1]} but A has {A.shape[-2]} rows")
    if x0 is not None:
        x0 = _v.tensor("x0", x0, min_ndim=1)
        if x0.shape[-1] != A.shape[-1]:
            raise ValueError(
                f"x0 has last dimension {x0.shape[-1]} but A has {A.shape[-1]} columns"
            )
    sweeps = _v.count("sweeps", sweeps)
    relaxation, eps = _relaxation(relaxation, eps)
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be a solvers.Arith, got {type(arith).__name__}")
    batch = _v.batch_shape(
        "A, b and x0", A.shape[:-2], b.shape[:-1], () if x0 is None else x0.shape[:-1]
    )
    m, n = A.shape[-2:]
    if rows is not None:
        if not isinstance(rows, torch.Tensor) or rows.dtype not in (torch.int32, torch.int64):
            raise TypeError("rows must be an integer tensor (sweeps, *batch, m) of row indices")
        if rows.shape[0] < sweeps or rows.shape[-1] != m:
            raise ValueError(
                f"rows must have shape (>= sweeps, *batch, {m}), got {tuple(rows.shape)}"
            )
        if rows.numel() and not bool(((rows >= 0) & (rows < m)).all()):
            raise ValueError(f"rows must hold row indices in [0, {m})")
    A = A.to(_F64).expand(*batch, m, n)
    b = b.to(_F64).expand(*batch, m)
    x = torch.zeros(*batch, n, dtype=_F64) if x0 is None else x0.to(_F64).expand(*batch, n)
    norms2 = (A * A).sum(-1)
    den = norms2 + eps
    safe = torch.where(den > 0, den, torch.ones_like(den))
    g_dot, g_coef = float(gamma(n, arith.u_acc)), float(gamma(n + 4, arith.u_acc))
    u_sum = arith.u_acc + arith.u_store
    eye = torch.eye(n, dtype=_F64).expand(*batch, n, n)
    total = torch.zeros(batch, dtype=_F64)
    out = [total]
    for sweep in range(sweeps):
        order = torch.arange(m).expand(*batch, m) if rows is None else rows[sweep]
        deltas, steps = [], []
        for s in range(m):
            i = order[..., s : s + 1]
            a = A.gather(-2, i.unsqueeze(-1).expand(*batch, 1, n)).squeeze(-2)
            b_i, d_i, n2 = (
                b.gather(-1, i).squeeze(-1),
                safe.gather(-1, i).squeeze(-1),
                norms2.gather(-1, i).squeeze(-1),
            )
            live = (den.gather(-1, i).squeeze(-1) > 0).to(_F64)
            r_i = b_i - (a * x).sum(-1)
            c = live * relaxation * r_i / d_i
            x_new = x + c.unsqueeze(-1) * a
            row_norm = torch.sqrt(n2).clamp_min(1e-300)
            local = relaxation * (
                g_dot * x.norm(dim=-1) + g_coef * r_i.abs() / row_norm
            ) + u_sum * x_new.norm(dim=-1)
            deltas.append(live * local)
            w = (live * relaxation / d_i)[..., None, None]
            steps.append(eye - w * a.unsqueeze(-1) * a.unsqueeze(-2))
            x = x_new
        suffix, carried = eye, torch.zeros(batch, dtype=_F64)
        for s in reversed(range(m)):
            carried = carried + torch.linalg.matrix_norm(suffix, ord=2) * deltas[s]
            suffix = suffix @ steps[s]
        total = torch.linalg.matrix_norm(suffix, ord=2) * total + carried
        out.append(total)
    return torch.stack(out)


# ----------------------------------------------------------------------------- KLA


def _arith(arith) -> Arith:
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be a solvers.Arith, got {type(arith).__name__}")
    return arith


def _heads(q, k, v, alpha, eta, eps, initial_state, coefficient):
    """float64 per-head layout ``(..., H, T, d)``; alpha always per channel ``(..., H, T, d_k)``."""
    *lead, T, H, d_k = k.shape
    d_v = v.shape[-1]
    qh, kh, vh = (t.to(_F64).movedim(-3, -2) for t in (q, k, v))
    per_channel = isinstance(alpha, torch.Tensor) and alpha.ndim == k.ndim
    al = torch.as_tensor(alpha, dtype=_F64)
    al = (
        al.expand(*k.shape).movedim(-3, -2)
        if per_channel
        else al.expand(*k.shape[:-1]).movedim(-2, -1).unsqueeze(-1).expand(*lead, H, T, d_k)
    )
    et = torch.as_tensor(eta, dtype=_F64).expand(*k.shape[:-1]).movedim(-2, -1)
    S0 = (
        torch.zeros(*lead, H, d_k, d_v, dtype=_F64)
        if initial_state is None
        else initial_state.to(_F64).expand(*lead, H, d_k, d_v)
    )
    norms2 = (kh * kh).sum(-1)
    if coefficient == "gdn":
        beta = et
    else:
        den = norms2 + eps
        beta = torch.where(
            den > 0, et / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den)
        )
    growth = al.amax(-1) * torch.clamp((1 - beta * norms2).abs(), min=1.0)
    return qh, kh, vh, al, beta, S0, growth


def kla_tokenwise_bound(
    q,
    k,
    v,
    *,
    alpha,
    eta,
    eps: float = 1e-6,
    initial_state=None,
    coefficient: str = "kaczmarz",
    normalize_queries: bool = True,
    arith: Arith,
):
    """Bounds on ``||o^_t - o_t||_2`` ``(..., T, H)`` and ``||S^_T - S_T||_F`` ``(..., H)`` for
    ``solvers.kla_recurrent`` in ``arith`` (inputs as rounded; module doc for the derivation)."""
    arith = _arith(arith)
    eps = check_arguments(q, k, v, alpha, eta, eps, initial_state, coefficient, normalize_queries)
    qh, kh, vh, al, beta, S, growth = _heads(q, k, v, alpha, eta, eps, initial_state, coefficient)
    d_k = kh.shape[-1]
    ua, us = arith.u_acc, arith.u_store
    g_step, g_read = float(gamma(d_k + 5, ua)), float(gamma(2 * d_k + 2, ua))
    E = torch.zeros(S.shape[:-2], dtype=_F64)
    bounds = []
    for t in range(kh.shape[-2]):
        k_t, b_t = kh[..., t, :], beta[..., t]
        Sd = al[..., t, :].unsqueeze(-1) * S
        e = vh[..., t, :] - (Sd * k_t.unsqueeze(-1)).sum(-2)
        S = Sd + b_t[..., None, None] * k_t.unsqueeze(-1) * e.unsqueeze(-2)
        kn, Sdn, Sn = k_t.norm(dim=-1), Sd.norm(dim=(-2, -1)), S.norm(dim=(-2, -1))
        m_t = Sdn + b_t * kn * (Sdn * kn + e.norm(dim=-1))
        E = growth[..., t] * E + g_step * m_t + (ua + us) * Sn
        q_t = qh[..., t, :]
        qn = q_t.norm(dim=-1)
        scale = torch.ones_like(qn) if normalize_queries else qn
        o = (S * q_t.unsqueeze(-1)).sum(-2) / (qn.unsqueeze(-1) if normalize_queries else 1.0)
        bounds.append(E * scale + g_read * Sn * scale + us * o.norm(dim=-1))
    B_o = (
        torch.stack(bounds, -1).movedim(-1, -2)
        if bounds
        else torch.zeros(*kh.shape[:-3], 0, kh.shape[-3], dtype=_F64)
    )
    return B_o, E


def kla_chunkwise_bound(
    q,
    k,
    v,
    *,
    alpha,
    eta,
    eps: float = 1e-6,
    chunk_size: int,
    initial_state=None,
    coefficient: str = "kaczmarz",
    normalize_queries: bool = True,
    arith: Arith,
):
    """Bounds on ``||o^_t - o_t||_2`` ``(..., T, H)`` and ``||S^_T - S_T||_F`` ``(..., H)`` for
    ``solvers.kla_chunkwise`` in ``arith`` (module doc; docs/kla.md for the derivation)."""
    arith = _arith(arith)
    chunk_size = _v.count("chunk_size", chunk_size, minimum=1)
    eps = check_arguments(q, k, v, alpha, eta, eps, initial_state, coefficient, normalize_queries)
    qh, kh, vh, al, beta, S, growth = _heads(q, k, v, alpha, eta, eps, initial_state, coefficient)
    T, d_k = kh.shape[-2], kh.shape[-1]
    ua, us = arith.u_acc, arith.u_store
    g = lambda n: float(gamma(n, ua))  # noqa: E731
    beta_err = 0.0 if coefficient == "gdn" else g(d_k + 2)
    E = torch.zeros(S.shape[:-2], dtype=_F64)
    bounds = []
    for start in range(0, T, chunk_size):
        sl = slice(start, min(start + chunk_size, T))
        K, V, Q, B = kh[..., sl, :], vh[..., sl, :], qh[..., sl, :], beta[..., sl]
        C = K.shape[-2]
        logs = torch.log(al[..., sl, :])
        gl = torch.cumsum(logs, -2)  # (..., C, d_k)
        cum_abs = torch.cumsum(gl.abs(), -2)
        tri = torch.tril(torch.ones(C, C, dtype=torch.bool))
        diff = gl.unsqueeze(-2) - gl.unsqueeze(-3)  # (..., i, j, c): g_i - g_j
        r = torch.where(
            tri.unsqueeze(-1),
            torch.exp(torch.where(tri.unsqueeze(-1), diff, torch.zeros_like(diff))),
            torch.zeros_like(diff),
        )
        e_g = ua * (3 * diff.abs() + (cum_abs.unsqueeze(-2) - cum_abs.unsqueeze(-3)))
        er = torch.expm1(e_g) * (1 + 2 * ua) + 2 * ua  # relative error of a computed ratio
        gam = torch.exp(gl)
        er0 = torch.expm1(ua * (3 * gl.abs() + cum_abs)) * (1 + 2 * ua) + 2 * ua

        def gram(X, Y, mask):
            m = mask.unsqueeze(-1)
            prod = X.unsqueeze(-2) * Y.unsqueeze(-3) * r
            aprod = X.abs().unsqueeze(-2) * Y.abs().unsqueeze(-3) * r
            z = torch.zeros_like(prod)
            return (
                torch.where(m, prod, z).sum(-1),
                torch.where(m, aprod, z).sum(-1),
                torch.where(m, aprod * er, z).sum(-1),
            )

        strict = torch.tril(torch.ones(C, C, dtype=torch.bool), -1)
        M, M_abs, M_eps = gram(K, K, strict)
        L = B.unsqueeze(-1) * M
        dL = (
            B.unsqueeze(-1) * (g(d_k + 2) * M_abs + M_eps * (1 + g(d_k + 1)))
            + beta_err * B.unsqueeze(-1) * M.abs()
        )
        pred = torch.einsum("...ic,...cj->...ij", gam * K, S)
        pred_abs = torch.einsum("...ic,...cj->...ij", gam * K.abs(), S.abs())
        pred_eps = torch.einsum("...ic,...cj->...ij", gam * er0 * K.abs(), S.abs())
        R = B.unsqueeze(-1) * (V - pred)
        dR = (
            B.unsqueeze(-1) * (g(d_k + 3) * (V.abs() + pred_abs) + pred_eps * (1 + g(d_k + 1)))
            + beta_err * R.abs()
        )
        Tinv = torch.linalg.inv(torch.eye(C, dtype=_F64) + L)
        U = Tinv @ R
        dU = Tinv.abs() @ (dR + (dL + g(C) * (L.abs() + dL)) @ U.abs() + us * U.abs())

        N, N_abs, N_eps = gram(Q, K, tri)
        Pq = torch.einsum("...ic,...cj->...ij", gam * Q, S)
        Pq_abs = torch.einsum("...ic,...cj->...ij", gam * Q.abs(), S.abs())
        Pq_eps = torch.einsum("...ic,...cj->...ij", gam * er0 * Q.abs(), S.abs())
        qn = Q.norm(dim=-1)
        nu = qn if normalize_queries else torch.ones_like(qn)
        O = (Pq + N @ U) / nu.unsqueeze(-1)
        dO = (
            g(d_k + 2) * Pq_abs
            + Pq_eps * (1 + g(d_k + 1))
            + (g(d_k + 1) * N_abs + N_eps * (1 + g(d_k + 1))) @ U.abs()
            + N.abs() @ dU
            + g(C + 1) * (N.abs() @ U.abs() + Pq.abs())
        ) / nu.unsqueeze(-1)
        dO = dO + (g(d_k + 3) * normalize_queries + us) * O.abs()
        G_i = torch.cumprod(growth[..., sl], -1)
        bounds.append(dO.norm(dim=-1) + G_i * E.unsqueeze(-1) * qn / nu)

        r_end, er_end = r[..., C - 1, :, :], er[..., C - 1, :, :]  # (..., j, c)
        KU = (r_end * K).transpose(-1, -2) @ U
        S_new = gam[..., C - 1, :].unsqueeze(-1) * S + KU
        dS = ((er0[..., C - 1, :] + ua) * gam[..., C - 1, :]).unsqueeze(-1) * S.abs()
        dS = (
            dS
            + (r_end * (er_end + g(C + 2)) * K.abs()).transpose(-1, -2) @ U.abs()
            + (r_end * K.abs()).transpose(-1, -2) @ dU
        )
        dS = dS + us * S_new.abs()
        E = dS.norm(dim=(-2, -1)) + G_i[..., -1] * E
        S = S_new
    B_o = (
        torch.cat(bounds, -1).movedim(-1, -2)
        if bounds
        else torch.zeros(*kh.shape[:-3], 0, kh.shape[-3], dtype=_F64)
    )
    return B_o, E
