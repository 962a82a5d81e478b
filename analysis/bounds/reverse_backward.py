"""A-posteriori running error bound for the reverse backward passes of Chebyshev iteration.

The methods ``"reverse"`` and ``"reverse_stored_omega"`` of ``solvers.chebyshev_backward`` and
``kernels.chebyshev_backward`` (GKA Appendix E.1, Algorithm 2, corrected: docs/errata.md) run,
after the forward (GKA Algorithm 1, eq. (44)-(45)), for i = r..1

    lam_{i-1} = (w_i - c_i H^T) lam_i - (w_{i+1} - 1) lam_{i+1}        (eq. (46) / (51); w_{r+1} := 1)
    xi_{i-2}  = (xi_i - w_i xi_{i-1} + c_i (H xi_{i-1} - q)) / (1 - w_i) (eq. (49) / (50), q sign corrected)
    dq = sum_{i=1..r} c_i lam_i + c_0 lam_0,   dH = -sum_{i=1..r} c_i lam_i xi_{i-1}^T   (eq. (48), (53)-(54))

starting from the forward's stored ``xi_r, xi_{r-1}`` and ``lam_r = g``; the weights
``w_i = omega_i`` are read back (stored) or recovered by (47)/(52),
``nu_{i-1} = 4/rho^2 (1 - 1/nu_i)``, from omega_r (``"reverse"``). ``c_i = 2 w_i/(L+mu)``,
``c_0 = 2/(L+mu)``.

The bound follows the *exact* run (float64, exact weights, on the values the kernel received)
and bounds how far a kernel honouring a precision contract can be from it, as
``analysis.bounds.contract.linear_bound`` does for the forward:

* **Forward.** The kernel's forward iterates are ``x_hat_m = x_m + d_m`` with
  ``d_m = sum_{k<=m} P_{m,k}(H) delta_k``, delta_k the local errors of Algorithm 1's steps
  (``linear_bound``'s channels: plain and operand; their norms are evaluated here with
  ``linear_bound``'s running bound E as the drift).
* **Rebuilt iterates.** Eq. (49) is the exact inverse of step i. Reversed exactly from the
  forward's ``(x_hat_r, x_hat_{r-1})``, a forward local error delta_k reaches the rebuilt slot j
  as ``P_{j,k}(H)`` for ``k <= j`` (it is undone back to where it was committed and then carried
  forward), 0 for ``k = j + 1``, and as ``Rv_{j,k-2}(H) / (1 - w_k)`` for ``k >= j + 2``: the
  reversed recurrence from a unit in slot ``k - 2``. ``Rv_{j,m}`` (a unit at slot m, zero at
  m+1, run down by (49)) has per eigenvalue two roots of modulus ``(w_i - 1)^(-1/2)`` per step:
  this is where the reversal amplifies (GKA Remark 2; up to ``1/|1 - w|`` in one step). The
  reversal's own local errors eps_j (matvec accumulation, operand rounding of ``xi_{i-1}``,
  elementwise operations, the division by ``fl(1 - w_hat_i)``, charged 6u in float32 arithmetic
  since a GPU's ``/`` is within 2 ulps, not correctly rounded; the weights' errors, the store
  of the rebuilt iterate) enter slot j and propagate by ``Rv``.
* **Adjoint.** Local errors phi_m of the adjoint steps (the same channels) propagate by the
  exact adjoint response ``Lr_{i,m}(H)`` (a unit at slot m, zero at m+1, run down by (46)).
* **Outputs.** ``dq_hat - dq = sum_m Sq_m(H) phi_m + sum_i dc_i lam_hat_i + accumulation``,
  ``Sq_m = sum_{i<=m} c_i Lr_{i,m}``. ``dH_hat - dH = -sum_i c_i (dl_i x_{i-1}^T + lam_i dz_{i-1}^T
  + dl_i dz_{i-1}^T) - sum_i dc_i lam_hat_i z_hat_{i-1}^T + rounding``. For one source e through
  ``T_i(H)``, ``||sum_i c_i T_i(H) e x_{i-1}^T||_F^2 = sum_k e~_k^2 ||sum_i c_i T_i(l_k) x_{i-1}||^2``
  in H's eigenbasis (rows), and likewise by columns for ``lam_i (T_i e)^T``: each source has a
  per-eigenvalue gain ``t_{n,k} = ||sum_i c_i T_i(l_k) v_i||`` and the sources combine by
  ``propagated_norm_bound`` (sqrt(S_1 S_2)). The product of two deviations is kept (rigorous).

Every norm a local error needs (``||x_hat||``, ``||lam_hat||``, ``||z_hat||``) is the exact one
plus the bound so far: a forward recursion in the order the kernel computes (rigorous). The
weights' and constants' fp32 rounding are first order with a factor-2 margin
(``contract._constant_errors``); for ``"reverse"`` the recovered weights' errors are carried
through (47) by its derivative ``4 / (rho^2 nu_i^2)``, and the bound is infinite
once they reach a tenth of ``w_i - 1``. The float64 evaluation of the responses is exact to
``u_64`` times the reversal's growth, far inside every conclusive case. H must be symmetric
(the responses are evaluated on its eigenvalues).

Where the reversal's growth ``prod (w_i - 1)^(-1/2)`` (about ``R_a^-r``) times the contract's
roundoff reaches 1 the bound on dH is vacuous, honestly: the kernel's rebuilt iterates can be
that far off. dq does not use the rebuilt iterates; under ``"reverse_stored_omega"`` its bound
is the adjoint's, as accurate as the implicit method's (under ``"reverse"`` the recovered
weights' errors enter it too: at float32, D = 8, kappa 100, 9.3e-3 ||dq|| at r = 8 against
3.3e-4, and infinite from r = 12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from analysis.precision import gamma
from solvers import validation as _v
from solvers.contracts import parse

from .contract import (
    SAFETY,
    _constant_errors,
    _schedule,
    linear_bound,
    propagated_norm_bound,
    value_roundoff,
)

_F64 = torch.float64
REVERSE_METHODS = ("reverse", "reverse_stored_omega")
_CHUNK_BYTES = 2**28  # working memory of one chunk of systems


@dataclass
class ReverseBound:
    """Per system: ``dq``, ``dH`` bounds on ``||dq_hat - dq||_2`` and ``||dH_hat - dH||_F``
    (before the output's own rounding); ``dq_exact``, ``dH_exact`` the exact gradients (float64);
    ``rebuilt`` ``(r+1, *batch)`` the bound on the rebuilt iterates' deviations (slots r, r-1:
    the forward's), ``adjoint`` ``(r+1, *batch)`` on the adjoints'."""

    dq: torch.Tensor
    dH: torch.Tensor
    dq_exact: torch.Tensor
    dH_exact: torch.Tensor
    rebuilt: torch.Tensor
    adjoint: torch.Tensor


def _store(x, drift, contract, stored: bool):
    """The store of a vector: ``u (||x|| + drift)`` (Higham eq. (2.4)), 0 if not stored."""
    if not stored:
        return torch.zeros_like(drift)
    return contract.u_store * (torch.linalg.vector_norm(x, dim=-1) + drift)


def reverse_backward_bound(
    H,
    q,
    g,
    *,
    L,
    mu,
    iters: int,
    method: str,
    contract,
    value_u: Optional[float] = None,
) -> ReverseBound:
    """Running bound (module docstring) for ``method`` in ``("reverse", "reverse_stored_omega")``
    under ``contract``; H ``(*batch, D, D)`` symmetric, q, g ``(*batch, D)``, L, mu per system
    (``L > mu``). ``value_u``: roundoff of H's values (default: read off H)."""
    if method not in REVERSE_METHODS:
        raise ValueError(f"method must be one of {REVERSE_METHODS}, got {method!r}")
    contract = parse(contract)
    iters = _v.count("iters", iters)
    H = H.detach().cpu().to(_F64)
    q = q.detach().cpu().to(_F64)
    g = g.detach().cpu().to(_F64)
    batch = torch.broadcast_shapes(H.shape[:-2], q.shape[:-1], g.shape[:-1])
    D = H.shape[-1]
    H = H.expand(*batch, D, D).reshape(-1, D, D)
    q = q.expand(*batch, D).reshape(-1, D)
    g = g.expand(*batch, D).reshape(-1, D)
    N = H.shape[0]
    if N == 0 or D == 0:
        raise ValueError(f"H must hold at least one system with D >= 1, got shape {tuple(H.shape)}")
    if not bool((H == H.transpose(-1, -2)).all()):
        raise ValueError("H must be symmetric: the responses are evaluated on its eigenvalues")
    Lt = torch.broadcast_to(torch.as_tensor(L, dtype=_F64).cpu(), batch).reshape(N)
    mt = torch.broadcast_to(torch.as_tensor(mu, dtype=_F64).cpu(), batch).reshape(N)
    if value_u is None:
        value_u = value_roundoff(H)
    # the responses take O(r^2 D) and the dH gains O(r D^2) per system: in chunks of systems
    per = 8 * ((2 * iters + 3) * D * D + 4 * (iters + 1) ** 2 * D)
    size = max(1, int(_CHUNK_BYTES // per))
    parts = [
        _flat(
            H[a : a + size],
            q[a : a + size],
            g[a : a + size],
            Lt[a : a + size],
            mt[a : a + size],
            iters,
            method,
            contract,
            value_u,
        )
        for a in range(0, N, size)
    ]
    r = iters
    cat = lambda i, dim=0: torch.cat([p[i] for p in parts], dim=dim)  # noqa: E731
    return ReverseBound(
        cat(0).reshape(batch),
        cat(1).reshape(batch),
        cat(2).reshape(*batch, D),
        cat(3).reshape(*batch, D, D),
        cat(4, 1).reshape(r + 1, *batch),
        cat(5, 1).reshape(r + 1, *batch),
    )


def _flat(H, q, g, Lt, mt, iters, method, contract, value_u):
    """The bound for N flattened systems: (dq, dH, dq_exact, dH_exact, EZ, EL)."""
    N, D = q.shape
    r = iters
    u = contract.u_acc
    # a division in float32 arithmetic: Triton's ``/`` on a GPU is div.full.f32, within 2 ulps,
    # not correctly rounded; charged 6u as analysis.bounds.gka_layer.U_FAST (under the
    # interpreter and in the references it is IEEE, which this covers too)
    u_div = 6 * u if contract.accumulate == torch.float32 else u
    u_st = contract.u_store
    stored = contract.stores("iterate")
    u_op = contract.u_operand(u_st if stored else u)  # an fp32 (or stored bf16) vector operand
    u_opH = contract.u_operand(value_u)
    mv_err = (1 + gamma(D, u)) * (1 + u_opH) - 1  # accumulation and H's rounding, product kept

    # forward: exact trajectory and its running bound (linear_bound, same contract)
    fwd = linear_bound("chebyshev", H, q, L=Lt, mu=mt, iters=r, contract=contract, value_u=value_u)
    X, E = fwd.x, fwd.bound  # (r+1, N, D), (r+1, N)
    c, b, _, s, extra = _schedule("chebyshev", Lt, mt, r, (N,))
    w = extra["omega"]  # (r, N): w[i-1] = omega_i
    dc, db, _ = _constant_errors("chebyshev", c, b, torch.zeros_like(b), extra, u)
    ds = 2 * 5 * u * s
    # per-slot weights, index i = 0..r+1 (w_0 unused, w_{r+1} := 1)
    W = torch.cat([torch.full((1, N), 2.0, dtype=_F64), w, torch.ones(1, N, dtype=_F64)])
    C = torch.cat([s.unsqueeze(0), c, torch.zeros(1, N, dtype=_F64)])
    dW = torch.cat([torch.zeros(1, N, dtype=_F64), db, torch.zeros(1, N, dtype=_F64)])
    dC = torch.cat([ds.unsqueeze(0), dc, torch.zeros(1, N, dtype=_F64)])
    if method == "reverse" and r >= 1:
        # (47) recovers nu_{i-1} = 4/rho^2 (1 - 1/nu_i) from omega_r; first order, margin 2
        rho2 = extra["rho2"]
        dWr = dW.clone()
        for i in range(r, 1, -1):
            deriv = 4.0 / (rho2 * W[i] ** 2)
            local = 2 * (10 * u * W[i - 1] + 4.0 / rho2 * u_div / W[i])
            dWr[i - 1] = 2 * deriv * dWr[i] + local
        dWrev = dWr
        dCrev = dWr * s + 2 * 5 * u * C.abs()
        dCrev[0] = ds
    else:
        dWrev, dCrev = dW, dC
    big = dWrev[1 : r + 1] > 0.1 * (W[1 : r + 1] - 1.0).abs() if r >= 1 else None

    lam_eig = torch.linalg.eigvalsh(H)  # (N, D)
    normA = lam_eig.abs().amax(-1)
    absH = torch.linalg.matrix_norm(H.abs(), ord=2)
    mv = lambda M, v: (M @ v.unsqueeze(-1)).squeeze(-1)  # noqa: E731
    nrm = lambda v: torch.linalg.vector_norm(v, dim=-1)  # noqa: E731

    # responses on the eigenvalues, [slot, source-slot, N, D]
    le = lam_eig
    P = torch.zeros((r + 1, r + 1, N, D), dtype=_F64)  # forward: unit at slot k, 0 at k-1
    for k in range(r + 1):
        cur, old = torch.ones_like(le), torch.zeros_like(le)
        P[k, k] = cur
        for i in range(k + 1, r + 1):
            cur, old = (
                (W[i].unsqueeze(-1) - C[i].unsqueeze(-1) * le) * cur
                - (W[i].unsqueeze(-1) - 1.0) * old,
                cur,
            )
            P[i, k] = cur
    Rv = torch.zeros((r + 1, r + 1, N, D), dtype=_F64)  # reverse (49): unit at slot m, 0 at m+1
    for m in range(r + 1):
        cur, nxt = torch.ones_like(le), torch.zeros_like(le)
        Rv[m, m] = cur
        for j in range(m - 1 if m <= r - 2 else -1, -1, -1):  # slots r-1, r are never rebuilt
            i = j + 2  # the step that rebuilds slot j from slots j+2 (nxt) and j+1 (cur)
            wi, ci = W[i].unsqueeze(-1), C[i].unsqueeze(-1)
            new = (nxt - (wi - ci * le) * cur) / (1.0 - wi)
            nxt, cur = cur, new
            Rv[j, m] = cur
    Lr = torch.zeros((r + 1, r + 1, N, D), dtype=_F64)  # adjoint (46): unit at slot m, 0 at m+1
    for m in range(r + 1):
        cur, nxt = torch.ones_like(le), torch.zeros_like(le)
        Lr[m, m] = cur
        for j in range(m - 1, -1, -1):
            i = j + 1
            new = (W[i].unsqueeze(-1) - C[i].unsqueeze(-1) * le) * cur - (
                W[i + 1].unsqueeze(-1) - 1.0
            ) * nxt
            nxt, cur = cur, new
            Lr[j, m] = cur
    # a forward local error at slot k seen in the rebuilt slot j
    Psi = torch.zeros_like(P)
    for j in range(r + 1):
        for k in range(r + 1):
            if k <= j:
                Psi[j, k] = P[j, k]
            elif k >= j + 2:
                Psi[j, k] = Rv[j, k - 2] / (1.0 - W[k]).unsqueeze(-1)
    # channel multipliers: plain 1; operand c_k lambda (the operand of step k's product)
    opm = C[: r + 1].unsqueeze(-1) * le  # [slot of the step's product operand -> its c]

    # exact adjoints lam_0..lam_r
    lam = [None] * (r + 2)
    lam[r], lam[r + 1] = g, torch.zeros_like(g)
    for i in range(r, 0, -1):
        lam[i - 1] = (
            W[i].unsqueeze(-1) * lam[i]
            - C[i].unsqueeze(-1) * mv(H.transpose(-1, -2), lam[i])
            - (W[i + 1].unsqueeze(-1) - 1.0) * lam[i + 1]
        )
    Lam = torch.stack(lam[: r + 1])  # (r+1, N, D)
    nlam = nrm(Lam)
    nx = nrm(X)
    nq = nrm(q)
    Hx_q = nrm(mv(H.unsqueeze(0), X) - q) if r >= 1 else torch.zeros_like(nx)  # (r+1, N)
    absHx = nrm(mv(H.abs().unsqueeze(0), X.abs()))
    absHl = nrm(mv(H.abs().transpose(-1, -2).unsqueeze(0), Lam.abs()))

    # ---- forward local errors (linear_bound's model, chebyshev, drift = its E) ----
    fplain = torch.zeros((r + 1, N), dtype=_F64)
    fop = torch.zeros((r + 1, N), dtype=_F64)
    fplain[0] = 3 * u * s * nq * (1 + u) + _store(X[0], E[0], contract, stored)
    for i in range(1, r + 1):
        k = i - 1
        e1, e2 = E[k], (E[k - 1] if k >= 1 else torch.zeros_like(E[k]))
        zn = nx[k] + e1
        zop = zn * (1 + u_op)
        dx = nrm(X[k] - (X[k - 1] if k >= 1 else 0 * X[k])) + e1 + e2
        gn = Hx_q[k] + normA * e1 + absH * (mv_err * zop + u_op * zn)
        hz = absHx[k] + absH * e1
        ci, bi = c[k], b[k].abs()
        plain = ci * mv_err * (hz * (1 + u_op) + absH * u_op * zn)
        plain = plain + 2 * u * (2 * ci * gn + 2 * zn + 2 * bi * dx + zn)
        plain = plain + dc[k] * gn + db[k].abs() * dx
        fplain[i] = plain * (1 + u) + _store(X[i], E[i], contract, stored)
        fop[i] = u_op * zn

    # ---- adjoint: local errors phi_m at slot m = r-1..0 and the running bound EL ----
    aplain = torch.zeros((r + 1, N), dtype=_F64)
    aop = torch.zeros((r + 1, N), dtype=_F64)
    EL = torch.zeros((r + 1, N), dtype=_F64)

    def adj_acc(m, plain_m):
        """Bound on the adjoint's deviation at slot m: sources at slots m..r-1 (the operand of
        step i, lam_i, enters slot i-1 as c_i H e)."""
        if m >= r:
            return torch.zeros(N, dtype=_F64)
        pl = aplain.clone()
        pl[m] = plain_m
        resp = {"plain": Lr[m, m:r].abs(), "operand": (Lr[m, m:r] * opm[m + 1 : r + 1]).abs()}
        return SAFETY * propagated_norm_bound(resp, {"plain": pl[m:r], "operand": aop[m:r]})

    for i in range(r, 0, -1):
        m = i - 1
        ln = nlam[i] + EL[i]
        ln1 = nlam[i + 1] + EL[i + 1] if i < r else torch.zeros(N, dtype=_F64)
        wi, ci, bnext = W[i], C[i], (W[i + 1] - 1.0).abs()
        grow = 1 + dCrev[i] / ci
        y = (normA * (1 + u_op) + absH * mv_err * (1 + u_op)) * ln
        plain = ci * grow * mv_err * ((absHl[i] + absH * EL[i]) * (1 + u_op) + absH * u_op * ln)
        plain = plain + 3 * u * (wi * ln + ci * y + bnext * ln1) * (1 + 2 * u)
        plain = plain + dWrev[i] * ln + dCrev[i] * y + dWrev[i + 1] * ln1
        aop[m] = u_op * ln * grow
        pre = adj_acc(m, plain)
        plain = plain + _store(Lam[m], pre, contract, stored)
        aplain[m] = plain
        EL[m] = adj_acc(m, plain)

    # ---- rebuilt iterates: slots r, r-1 from the forward; eps_j at j = r-2..0 ----
    eplain = torch.zeros((r + 1, N), dtype=_F64)
    eop = torch.zeros((r + 1, N), dtype=_F64)  # operand of step j+2 (xi_{j+1}), mult c_{j+2} l
    EZ = torch.zeros((r + 1, N), dtype=_F64)

    def reb_resp(j):
        resp = {
            "plain": torch.cat([Psi[j].abs(), Rv[j].abs()]),
            "operand": torch.cat([(Psi[j, 1:] * opm[1:]).abs(), (Rv[j, : r - 1] * opm[2:]).abs()]),
        }
        return resp

    def reb_acc(j, eps_plain_j):
        ep = eplain.clone()
        ep[j] = eps_plain_j
        nrms = {"plain": torch.cat([fplain, ep]), "operand": torch.cat([fop[1:], eop[: r - 1]])}
        return SAFETY * propagated_norm_bound(reb_resp(j), nrms)

    for j in (r, r - 1):
        if j >= 0:
            EZ[j] = torch.minimum(reb_acc(j, eplain[j]), E[j])
    inf = torch.full((N,), float("inf"), dtype=_F64)
    for j in range(r - 2, -1, -1):
        i = j + 2
        zn_i, zn_p = nx[i] + EZ[i], nx[i - 1] + EZ[i - 1]
        wi, ci = W[i], C[i]
        grow = 1 + dCrev[i] / ci
        den = ((wi - 1.0).abs() - dWrev[i]) * (1 - u)
        den = torch.where(den > 0, den, torch.full_like(den, float("nan")))
        yq = (
            Hx_q[i - 1]
            + normA * EZ[i - 1]
            + absH * mv_err * zn_p * (1 + u_op)
            + normA * u_op * zn_p
        )
        num = (
            ci
            * grow
            * mv_err
            * ((absHx[i - 1] + absH * EZ[i - 1]) * (1 + u_op) + absH * u_op * zn_p)
        )
        num = num + u * (2 * zn_i + 3 * wi * zn_p + 3 * ci * yq) * (1 + 2 * u)
        num = num + dWrev[i] * zn_p + dCrev[i] * yq
        eop[j] = u_op * zn_p * grow / den
        # the exact-weight rebuild of the kernel's inputs is x_j plus the deviation carried in so far
        carried = reb_acc(j, torch.zeros(N, dtype=_F64))
        zj = nx[j] + carried
        eps = num / den + zj * (dWrev[i] + u * ((wi - 1.0).abs() + dWrev[i])) / den
        prior = reb_acc(j, eps)
        eps = eps + u_div / (1 - u_div) * (nx[j] + prior)  # the division's rounding
        pre = reb_acc(j, eps)
        eps = eps + _store(X[j], pre, contract, stored)
        eps = torch.where(torch.isnan(eps), inf, eps)
        eplain[j] = eps
        EZ[j] = reb_acc(j, eps)
        EZ[j] = torch.where(torch.isnan(EZ[j]), inf, EZ[j])

    # ---- dq ----
    Sq = torch.zeros((r + 1, N, D), dtype=_F64)  # response of a unit phi at slot m
    for m in range(r + 1):
        Sq[m] = (C[: m + 1, :, None] * Lr[: m + 1, m]).sum(0)
    nrms = {"plain": aplain[:r], "operand": aop[:r]}
    resp = {"plain": Sq[:r].abs(), "operand": (Sq[:r] * opm[1 : r + 1]).abs()}
    Eq = SAFETY * propagated_norm_bound(resp, nrms) if r >= 1 else torch.zeros(N, dtype=_F64)
    lamh = nlam + EL  # ||lam_hat_i||
    terms = C[: r + 1].abs() * lamh  # ||c_i lam_hat_i||
    Eq = Eq + (dCrev[: r + 1] * lamh).sum(0)
    # fp32 accumulation: dq = c_r lam_r, + c_{r-1} lam_{r-1}, ..., + c_0 lam_0: each product and
    # each partial sum rounded once
    order = list(range(r, -1, -1))
    partial = torch.zeros(N, dtype=_F64)
    acc = torch.zeros(N, dtype=_F64)
    for i in order:
        partial = partial + terms[i] * (1 + u)
        acc = acc + u * terms[i] + u * partial
    Eq = (Eq + acc * (1 + 2 * u)) * SAFETY

    # ---- dH ----
    if r >= 1:
        cl = C[1 : r + 1].unsqueeze(-1) * Lam[1:]  # (r, N, D): c_i lam_i, i = 1..r
        # term A: adjoint deviations times the exact iterates (rows in the eigenbasis)
        cLr = C[1 : r + 1, None, :, None] * Lr[1:, :r]  # [i=1..r, m=0..r-1, N, k]
        Wa = torch.einsum("imnk,ind->mnkd", cLr, X[:r])  # sum_i c_i Lr_{i,m}(l_k) x_{i-1}
        ta = torch.linalg.vector_norm(Wa, dim=-1)  # (m, N, k)
        termA = propagated_norm_bound(
            {"plain": ta, "operand": ta * opm[1 : r + 1].abs()},
            {"plain": aplain[:r], "operand": aop[:r]},
        )
        # term B: exact adjoints times the rebuilt deviations (columns in the eigenbasis)
        PsiAll = torch.cat([Psi, Rv], dim=1)  # [slot, source, N, k]
        Wb = torch.einsum("isnk,ind->snkd", PsiAll[:r], cl)  # slot i-1 = 0..r-1
        tb = torch.linalg.vector_norm(Wb, dim=-1)  # (sources, N, k)
        opb = torch.cat([opm[1:], opm[2:]])  # operand sources: fwd slots 1..r, eps slots 0..r-2
        tbo = torch.cat([tb[1 : r + 1], tb[r + 1 : 2 * r]]) * opb.abs()
        termB = propagated_norm_bound(
            {"plain": tb, "operand": tbo},
            {"plain": torch.cat([fplain, eplain]), "operand": torch.cat([fop[1:], eop[: r - 1]])},
        )
        ci = C[1 : r + 1]
        termC = (ci * EL[1:] * EZ[:r]).sum(0)
        zh = nx[:r] + EZ[:r]
        termD = (dCrev[1 : r + 1] * lamh[1:] * zh).sum(0)
        prods = ci * lamh[1:] * zh
        rnd = (3 * u * prods + u * torch.cumsum(prods.flip(0) * (1 + 3 * u), 0).flip(0)).sum(0)
        EH = SAFETY * (termA + termB + termC + termD + rnd * (1 + 2 * u))
        dH_exact = -(cl.unsqueeze(-1) * X[:r].unsqueeze(-2)).sum(0)
    else:
        EH = torch.zeros(N, dtype=_F64)
        dH_exact = torch.zeros(N, D, D, dtype=_F64)
    if big is not None:
        bad = big.any(0)
        Eq = torch.where(bad, inf, Eq)
        EH = torch.where(bad, inf, EH)
    EH = torch.where(torch.isnan(EH), inf, EH)
    Eq = torch.where(torch.isnan(Eq), inf, Eq)
    dq_exact = (C[: r + 1].unsqueeze(-1) * Lam).sum(0)
    return Eq, EH, dq_exact, dH_exact, EZ, EL


__all__ = ["REVERSE_METHODS", "ReverseBound", "reverse_backward_bound"]
