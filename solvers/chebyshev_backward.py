"""Backward pass of Chebyshev iteration (GKA Algorithm 1): four ways to get ``(dq, dH)``.

Given the cotangent ``g = dL/dxi_r`` of the forward ``xi_r = solvers.chebyshev(H, q, ...)``
(GKA Algorithm 1, written as GKA eq. (44)-(45))

    xi_i = A_i xi_{i-1} + b_i xi_{i-2} + c_i q,   A_i = omega_i I - c_i H,
    b_i = -(omega_i - 1),   c_i = 2 omega_i / (L + mu),   c_0 = 2 / (L + mu),   xi_{-1} = 0,

the exact adjoint (reverse-mode chain rule) of that loop is, with ``lambda_i = dL/dxi_i``,

    lambda_r = g,  lambda_{r+1} = 0,
    lambda_{i-1} = A_i^T lambda_i + b_{i+1} lambda_{i+1}               (GKA eq. (46) / (51))
    dq = sum_{i=0..r} c_i lambda_i,   dH = -sum_{i=1..r} c_i lambda_i xi_{i-1}^T      (eq. (48))

``method`` chooses how it is evaluated:

* ``"autograd"``: torch.autograd through the forward loop itself (``solvers.chebyshev`` with
  ``requires_grad`` inputs), in the working precision: what a user of the forward gets.
  Memory: every iterate of the loop (O(r D) per system) plus autograd's graph.
* ``"implicit"``: GKA Table 1 / Lemma 2: ``dq = CH(H, g, r)`` (the forward solver run on g)
  and ``dH = -dq x^T`` with ``x = xi_r``. ``dq`` equals the exact adjoint in exact arithmetic
  when H is symmetric (Lemma 2: xi_r = p_r(H) q with p_r(H) symmetric); ``dH`` is the
  gradient of the *exact* solve, not of the truncated loop, and differs from it by a
  truncation error (docs/chebyshev_backward.md). Memory O(D).
* ``"reverse"``: GKA Appendix E.1 / Algorithm 2, corrected (docs/errata.md, "GKA"): the
  iterates are rebuilt backwards from ``xi_r, xi_{r-1}`` by eq. (49) and the weights from
  ``omega_r`` alone by the reversed schedule (47)/(52). Memory O(D) besides dH.
* ``"reverse_stored_omega"``: the same with omega_1..omega_r recorded by the forward pass
  (r scalars per system) instead of recovered.

Deviations of ``"reverse"`` from the printed Algorithm 2 (each is an erratum, kept as
:func:`algorithm2_as_printed`): (49)/(50) subtract ``c_i q`` (printed: add); the last term of
dq uses ``c_0 = 2/(L+mu)`` (printed: ``2 nu_0/(L+mu)`` with ``nu_0 = 2`` from (52), twice
c_0); no dH term for i = 0 (xi_0 does not depend on H; printed: one with a rebuilt xi_{-1}).

Gradients are those of the unconstrained matrix argument: ``dH[j, k] = dL/dH_jk`` for the
matvec ``H xi`` as written (``dH`` is not symmetrised; for a loss restricted to symmetric H
use ``(dH + dH^T) / 2``). The adjoint applies ``H^T`` so it stays exact for any square H.
No gradient flows to L or mu (they are parameters, as in the forward).

Rounding model (``solvers._arith``): the reverse methods store their reconstructed iterates
and adjoints ``lambda_i`` in the working dtype, compute every update in the compute dtype,
and keep the dq, dH accumulators in the compute dtype (a kernel's fp32 registers), rounding
them once on output. Stability: the reversed schedule (47) has omega_1* as a *repelling*
fixed point (the reversed step multiplies errors by ~R_a^-2) and the reversed recurrence (49)
multiplies rounding errors by ~R_a^-1 per step; docs/chebyshev_backward.md has the measured
table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from . import validation as check
from ._arith import Arith
from .chebyshev import chebyshev, chebyshev_steps
from .solve_info import Status, build_info, nonfinite_status
from .system import System, prepare, sum_to_shape

METHODS = ("autograd", "implicit", "reverse", "reverse_stored_omega")


def chebyshev_backward(
    H,
    q,
    grad_x,
    *,
    L,
    mu,
    iters: int,
    method: str,
    bf16_mode: str = "storage",
    return_info: bool = False,
):
    """``(dq, dH)`` for ``xi_r = chebyshev(H, q, L=L, mu=mu, iters=iters)`` and ``dL/dxi_r = grad_x``.

    Args:
        H, q, L, mu, iters, bf16_mode: as for :func:`solvers.chebyshev` (same checks).
        grad_x: ``(*batch, D)``, the cotangent of the forward's output (its broadcast shape),
            same dtype and device as H.
        method: ``"autograd"``, ``"implicit"``, ``"reverse"`` or ``"reverse_stored_omega"``
            (module docstring). The reverse methods need ``L > mu`` (b_i != 0 in eq. (49)).
        return_info: also return a :class:`SolveInfo`. Its ``iterates`` are xi_0..xi_r as the
            method saw them (rebuilt by eq. (49) for the reverse methods, the forward's
            otherwise); ``omegas`` the weights it used (recovered by (47) for ``"reverse"``);
            ``xi_minus1`` (reverse methods) the rebuilt xi_{-1}, exactly 0 without rounding;
            status NONFINITE for a system whose dq or dH is not finite.

    Returns:
        ``(dq, dH)`` shaped like ``q`` and ``H`` (summed over broadcast batch dims), in H's
        dtype; or ``(dq, dH, info)``.
    """
    iters = check.count("iters", iters)
    _check_method("method", method, METHODS)
    check.flag("return_info", return_info)
    sys = prepare(H, q, L=L, mu=mu, need_bounds=True, bf16_mode=bf16_mode)
    g = _cotangent(grad_x, sys)
    if method == "autograd":
        dq, dH, trace = _autograd(H, q, g, L, mu, iters, bf16_mode, return_info)
    elif method == "implicit":
        dq, dH, trace = _implicit(sys, g, iters, return_info)
    else:
        _check_reversible(sys, iters)
        state = _forward_state(sys, iters, keep_omegas=method == "reverse_stored_omega")
        dq, dH, trace = _reverse(sys, g, state, return_info)
    dq, dH = _reduce_and_store(sys.arith, dq, q.shape), _reduce_and_store(sys.arith, dH, H.shape)
    if not return_info:
        return dq, dH
    return dq, dH, _info(sys, method, dq, dH, trace)


PRINTED_CORRECTIONS = ("q_sign", "c0")


def algorithm2_as_printed(
    H, q, grad_x, *, L, mu, iters: int, bf16_mode: str = "storage", corrections=()
):
    """GKA Algorithm 2 as printed (appendix, eqs. (50)-(54)), optionally with named corrections.

    Printed: Initialize nu_r <- omega_r, nu_{r+1} <- 0, nu_0 <- 1, d xi_{r+1} <- 0,
    dq <- 2 nu_r/(L+mu) d xi_r, dH <- -2 nu_r/(L+mu) d xi_r xi_{r-1}^T; for i = r..1:
    (50) xi_{i-2} <- -1/(nu_i - 1) (xi_i - (nu_i I - 2 nu_i/(L+mu) H) xi_{i-1} + 2 nu_i/(L+mu) q),
    (51) d xi_{i-1} <- nu_i d xi_i - 2 nu_i/(L+mu) H d xi_i - (nu_{i+1} - 1) d xi_{i+1},
    (52) nu_{i-1} <- 4/rho^2 (1 - 1/nu_i),  (53) dq += 2 nu_{i-1}/(L+mu) d xi_{i-1},
    (54) dH -= 2 nu_{i-1}/(L+mu) d xi_{i-1} xi_{i-2}^T.

    As printed it is not the gradient of Algorithm 1 (docs/errata.md, "GKA"). ``corrections``
    is a subset of :data:`PRINTED_CORRECTIONS`, so that each erratum can be shown on its own:
    ``"q_sign"``: (50) subtracts 2 nu_i/(L+mu) q (the inverse of (44)); ``"c0"``: the weight of
    d xi_0 in dq (and in (54)) is c_0 = 2/(L+mu), not 2 nu_0/(L+mu) with nu_0 = omega_0 = 2 from
    (52) (at r = 0 the printed nu_r <- omega_r = 2 overrides nu_0 <- 1 the same way). With both
    it agrees with ``chebyshev_backward(..., method="reverse")`` up to rounding.
    """
    iters = check.count("iters", iters)
    corrections = tuple(corrections)
    for name in corrections:
        _check_method("corrections", name, PRINTED_CORRECTIONS)
    sys = prepare(H, q, L=L, mu=mu, need_bounds=True, bf16_mode=bf16_mode)
    g = _cotangent(grad_x, sys)
    _check_reversible(sys, iters)
    ar, Hs = sys.arith, sys.H
    state = _forward_state(sys, iters, keep_omegas=False)
    step = sys.param(2.0 / (sys.L + sys.mu))
    four_over_rho2 = _four_over_rho2(sys)
    q_sign = -1.0 if "q_sign" in corrections else 1.0

    def weight(nu, i):  # 2 nu_i / (L + mu), the c_i of (45); c_0 on its own with "c0"
        return step if (i == 0 and "c0" in corrections) else nu.unsqueeze(-1) * step

    q_c = ar.up(sys.q)
    nu = state.omegas[-1]
    nu_next = torch.zeros_like(nu)
    xi, xi_prev = state.xi, state.xi_prev
    lam, lam_next = g, torch.zeros_like(g)
    c = weight(nu, iters)
    dq = c * ar.up(lam)
    dH = -_outer(c, ar.up(lam), ar.up(xi_prev))
    for i in range(iters, 0, -1):
        w = nu.unsqueeze(-1)
        c = w * step
        inner = ar.up(xi) - (w * ar.up(xi_prev) - c * ar.matvec(Hs, xi_prev)) + q_sign * c * q_c
        xi_prev2 = ar.store(-inner / (w - 1.0))
        lam_prev = ar.store(
            w * ar.up(lam)
            - c * ar.matvec(Hs, lam)
            - (nu_next.unsqueeze(-1) - 1.0) * ar.up(lam_next)
        )
        nu_prev = four_over_rho2 * (1.0 - 1.0 / nu)
        c_prev = weight(nu_prev, i - 1)
        dq = dq + c_prev * ar.up(lam_prev)
        dH = dH - _outer(c_prev, ar.up(lam_prev), ar.up(xi_prev2))
        xi, xi_prev = xi_prev, xi_prev2
        lam_next, lam = lam, lam_prev
        nu_next, nu = nu, nu_prev
    return _reduce_and_store(ar, dq, q.shape), _reduce_and_store(ar, dH, H.shape)


class ChebyshevSolve(torch.autograd.Function):
    """``xi_r = chebyshev(H, q, ...)`` whose backward is one of :data:`METHODS` except autograd.

    ``ChebyshevSolve.apply(H, q, L, mu, iters, backward, bf16_mode)``; prefer
    :func:`chebyshev_solve`. The forward saves only what its backward needs: ``"implicit"``
    H and xi_r; ``"reverse"`` H, q, xi_r, xi_{r-1}, omega_r; ``"reverse_stored_omega"`` those
    and omega_0..omega_r. No gradient flows to L or mu.
    """

    @staticmethod
    def forward(ctx, H, q, L, mu, iters, backward, bf16_mode):
        iters = check.count("iters", iters)
        _check_method("backward", backward, METHODS[1:])
        sys = prepare(H, q, L=L, mu=mu, need_bounds=True, bf16_mode=bf16_mode)
        if backward != "implicit":
            _check_reversible(sys, iters)
        state = _forward_state(sys, iters, keep_omegas=backward == "reverse_stored_omega")
        if backward == "implicit":
            ctx.save_for_backward(H, q, state.xi)
        else:
            ctx.save_for_backward(H, q, state.xi, state.xi_prev)
        ctx.omegas, ctx.stored_omegas = state.omegas, state.stored_omegas
        ctx.L, ctx.mu, ctx.iters, ctx.backward, ctx.batch = (
            sys.L,
            sys.mu,
            iters,
            backward,
            sys.batch,
        )
        ctx.bf16_mode = bf16_mode
        return state.xi

    @staticmethod
    @once_differentiable  # the backward's own steps are not differentiated: no second derivatives
    def backward(ctx, grad_x):
        H, q, xi, *rest = ctx.saved_tensors
        D = H.shape[-1]
        sys = System(
            H=H.expand(*ctx.batch, D, D),
            q=q.expand(*ctx.batch, D),
            batch=ctx.batch,
            arith=Arith(H.dtype, ctx.bf16_mode),
            L=ctx.L,
            mu=ctx.mu,
        )
        g = grad_x.to(H.dtype).expand(*ctx.batch, D)
        if ctx.backward == "implicit":
            dq, dH, _ = _implicit(sys, g, ctx.iters, False, x=xi)
        else:
            state = _ForwardState(xi, rest[0], ctx.omegas, ctx.iters, ctx.stored_omegas)
            dq, dH, _ = _reverse(sys, g, state, False)
        ar = sys.arith
        return (
            _reduce_and_store(ar, dH, H.shape),
            _reduce_and_store(ar, dq, q.shape),
            None,
            None,
            None,
            None,
            None,
        )


def chebyshev_solve(
    H, q, *, L, mu, iters: int, backward: str = "implicit", bf16_mode: str = "storage"
):
    """:func:`solvers.chebyshev` (GKA Algorithm 1) with a chosen backward pass.

    ``backward="autograd"`` returns ``solvers.chebyshev(...)`` itself (torch records the
    loop; higher derivatives work); ``"implicit"``, ``"reverse"`` and
    ``"reverse_stored_omega"`` go through :class:`ChebyshevSolve` (first derivatives only).
    The result equals ``solvers.chebyshev(H, q, L=L, mu=mu, iters=iters)`` bit for bit.
    """
    iters = check.count("iters", iters)
    _check_method("backward", backward, METHODS)
    if backward == "autograd":
        return chebyshev(H, q, L=L, mu=mu, iters=iters, bf16_mode=bf16_mode)
    return ChebyshevSolve.apply(H, q, L, mu, iters, backward, bf16_mode)


@dataclass
class _ForwardState:
    """What the reverse pass starts from: xi_r, xi_{r-1} (stored dtype) and the weights.

    omegas: ``[omega_r]``, or with ``stored_omegas`` ``[omega_0, ..., omega_r]`` (compute dtype).
    """

    xi: torch.Tensor
    xi_prev: torch.Tensor
    omegas: list
    iters: int
    stored_omegas: bool


def _forward_state(sys: System, iters: int, *, keep_omegas: bool) -> _ForwardState:
    """Algorithm 1 keeping only the last two iterates: :func:`solvers.chebyshev.chebyshev_steps`,
    the forward's own steps (tests assert bitwise equality in every precision)."""
    omegas = []
    for omega, xi_prev, xi in chebyshev_steps(sys, iters):  # noqa: B007  (the last pair is the state)
        omegas = omegas + [omega] if keep_omegas else [omega]
    if iters >= 2 and bool((omega <= 1.0).any()):
        raise ValueError(
            "the reverse methods need omega_r > 1 in the working precision (eq. (49) divides "
            "by omega_i - 1); L/mu is too close to 1 for this precision"
        )
    return _ForwardState(xi, xi_prev, omegas, iters, keep_omegas)


def _reverse(sys: System, g: torch.Tensor, state: _ForwardState, keep_trace: bool):
    """Corrected GKA Algorithm 2: the adjoint (46) run together with the rebuilt iterates (49).

    With one weight in ``state.omegas`` the earlier ones are recovered by (47)/(52):
    ``nu_{i-1} = 4/rho^2 (1 - 1/nu_i)``; with all of them they are read back.
    Returns dq ``(*batch, D)`` and dH ``(*batch, D, D)`` in the compute dtype, and the trace.
    """
    ar, Hs = sys.arith, sys.H
    stored, iters = state.stored_omegas, state.iters
    q_c = ar.up(sys.q)
    step = sys.param(2.0 / (sys.L + sys.mu))
    four_over_rho2 = None if stored else _four_over_rho2(sys)
    nu = state.omegas[-1]
    xi, xi_prev = state.xi, state.xi_prev
    lam, lam_next = g, torch.zeros_like(g)
    nu_next = torch.ones_like(nu)  # b_{r+1} multiplies lambda_{r+1} = 0
    dq = torch.zeros_like(q_c)
    dH = torch.zeros(
        *sys.batch, sys.H.shape[-1], sys.H.shape[-1], dtype=ar.compute, device=q_c.device
    )
    rebuilt, used = [xi], [nu]
    for i in range(iters, 0, -1):
        w = nu.unsqueeze(-1)
        c = w * step  # c_i
        dq = dq + c * ar.up(lam)
        dH = dH - _outer(
            c, ar.up(lam), ar.up(xi_prev)
        )  # eq. (48): xi_i depends on H via -c_i H xi_{i-1}
        lam_prev = ar.store(
            w * ar.up(lam)
            - c * ar.rmatvec(Hs, lam)
            - (nu_next.unsqueeze(-1) - 1.0) * ar.up(lam_next)
        )
        # eq. (49), corrected sign on q: xi_{i-2} = (xi_i - A_i xi_{i-1} - c_i q) / b_i
        xi_prev2 = ar.store(
            (ar.up(xi) - w * ar.up(xi_prev) + c * (ar.matvec(Hs, xi_prev) - q_c)) / (1.0 - w)
        )
        nu_prev = state.omegas[i - 1] if stored else four_over_rho2 * (1.0 - 1.0 / nu)
        if keep_trace:
            rebuilt.append(xi_prev)
            used.append(nu_prev)
        xi, xi_prev = xi_prev, xi_prev2
        lam_next, lam = lam, lam_prev
        nu_next, nu = nu, nu_prev
    dq = dq + step * ar.up(lam)  # c_0 lambda_0 with c_0 = 2/(L+mu), not 2 nu_0/(L+mu)
    trace = None
    if keep_trace:
        if iters == 0:
            xi_prev = torch.zeros_like(xi)
        trace = {
            "iterates": rebuilt[::-1],
            "omegas": torch.stack(used[::-1], dim=-1),
            "xi_minus1": xi_prev,
        }
    return dq, dH, trace


def _implicit(sys: System, g: torch.Tensor, iters: int, keep_trace: bool, x=None):
    """GKA Table 1: dq = CH(H, g, r); dH = -dq x^T (the exact solve's dH, evaluated at x = xi_r)."""
    ar = sys.arith
    L, mu, mode = sys.L, sys.mu, ar.mode
    dq = chebyshev(sys.H, g, L=L, mu=mu, iters=iters, bf16_mode=mode)
    trace = None
    if x is None:
        if keep_trace:
            x, fwd = chebyshev(
                sys.H, sys.q, L=L, mu=mu, iters=iters, bf16_mode=mode, return_info=True
            )
            trace = {"iterates": list(fwd.iterates), "omegas": fwd.omegas}
        else:
            x = chebyshev(sys.H, sys.q, L=L, mu=mu, iters=iters, bf16_mode=mode)
    return ar.up(dq), -(ar.up(dq).unsqueeze(-1) * ar.up(x).unsqueeze(-2)), trace


def _autograd(H, q, g, L, mu, iters, bf16_mode, keep_trace):
    """torch.autograd through :func:`solvers.chebyshev` on detached copies of the inputs."""
    with torch.enable_grad():
        H_leaf = H.detach().requires_grad_(True)
        q_leaf = q.detach().requires_grad_(True)
        out = chebyshev(
            H_leaf, q_leaf, L=L, mu=mu, iters=iters, bf16_mode=bf16_mode, return_info=keep_trace
        )
        x, fwd = out if keep_trace else (out, None)
        dq, dH = torch.autograd.grad(x, (q_leaf, H_leaf), grad_outputs=g, allow_unused=True)
    if dH is None:  # iters = 0: xi_0 = 2q/(L+mu) does not depend on H
        dH = torch.zeros_like(H)
    trace = None
    if keep_trace:
        trace = {"iterates": [t.detach() for t in fwd.iterates], "omegas": fwd.omegas.detach()}
    return dq, dH, trace


def _info(sys: System, method: str, dq: torch.Tensor, dH: torch.Tensor, trace):
    status = torch.full(sys.batch, int(Status.COMPLETED), device=dq.device)
    dq_b = dq.expand(*sys.batch, dq.shape[-1])
    dH_b = dH.expand(*sys.batch, *dH.shape[-2:]).flatten(-2)
    status = nonfinite_status(torch.cat([dq_b, dH_b], dim=-1), status)
    extras = {"method": method, "omegas": trace["omegas"]}
    if "xi_minus1" in trace:
        extras["xi_minus1"] = trace["xi_minus1"]
    return build_info(sys.H, sys.q, trace["iterates"], status, sys.arith.label, extras)


def _outer(c: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``c u v^T`` for ``c (..., 1)``, ``u, v (..., D)``: one rounded product per entry."""
    return (c * u).unsqueeze(-1) * v.unsqueeze(-2)


def _reduce_and_store(ar, t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a broadcast-batch gradient down to the input's ``shape`` and round it once."""
    return ar.store(sum_to_shape(t, shape))


def _cotangent(grad_x, sys: System) -> torch.Tensor:
    """The cotangent of xi_r: a finite tensor of H's dtype and device and the output's shape."""
    if not isinstance(grad_x, torch.Tensor):
        raise TypeError(f"grad_x must be a torch.Tensor, got {type(grad_x).__name__}")
    check.same_kind("grad_x", grad_x, "H", sys.H)  # before any value is read (device first)
    expected = (*sys.batch, sys.H.shape[-1])
    if tuple(grad_x.shape) != expected:
        raise ValueError(
            f"grad_x must have the shape of the forward's output {expected}, got {tuple(grad_x.shape)}"
        )
    check.finite("grad_x", grad_x)
    return grad_x


def _check_method(name: str, method, allowed) -> None:
    if not isinstance(method, str) or method not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {method!r}")


def _four_over_rho2(sys: System) -> torch.Tensor:
    rho = (sys.L - sys.mu) / (sys.L + sys.mu)
    return sys.arith.scalar(4.0 / rho**2)


def _check_reversible(sys: System, iters: int) -> None:
    """Eq. (49) divides by b_i = -(omega_i - 1), zero when L == mu (GD is not reversible)."""
    check.has_values("H", sys.H, "the reverse methods (L > mu, the rebuilt iterates)")
    if iters >= 1 and sys.L.numel() and bool((sys.L == sys.mu).any()):
        raise ValueError(
            "the reverse methods need L > mu in every system: with L == mu, "
            "b_i = -(omega_i - 1) = 0 and eq. (49) cannot rebuild the iterates"
        )
