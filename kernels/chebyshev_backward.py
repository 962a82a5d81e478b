"""Backward pass of Chebyshev iteration (GKA Algorithm 1) as Triton kernels, and the
autograd wrapper ``chebyshev_solve``.

Mirrors ``solvers.chebyshev_backward`` (whose docstring derives the adjoint and states the
corrections to GKA Algorithm 2); the methods:

* ``"implicit"`` (GKA Table 1 / Lemma 2): ``dq = CH(H, g, r)`` — the forward recurrence run
  on the cotangent g — and ``dH = -dq x^T`` with ``x = xi_r``. One fused kernel: each
  program loads H once, runs both recurrences (on q for x, unless x is given, and on g)
  and writes dq and the outer product dH.
* ``"reverse"`` (GKA Appendix E.1 / Algorithm 2, corrected): the adjoint (46)
  ``lambda_{i-1} = A_i^T lambda_i + b_{i+1} lambda_{i+1}`` run together with the iterates
  rebuilt backwards by eq. (49), ``xi_{i-2} = (xi_i - A_i xi_{i-1} - c_i q) / b_i``, and the
  weights recovered from omega_r alone by (47), ``nu_{i-1} = 4/rho^2 (1 - 1/nu_i)``;
  ``dq = sum_i c_i lambda_i``, ``dH = -sum_i c_i lambda_i xi_{i-1}^T`` accumulated on chip.
* ``"reverse_stored_omega"``: the same, reading omega_0..omega_r recorded by the forward
  (an ``(N, r + 1)`` float32 array) instead of recovering them.

``chebyshev_backward`` recomputes the forward in the same program (H is read once);
``chebyshev_solve``'s backward starts from what its forward saved (float32 xi_r, and xi_{r-1}
for the reverse methods). All arithmetic float32; dq, dH rounded once to ``out_dtype``
(default H's dtype). ``"autograd"`` has no kernel: torch cannot differentiate through a
Triton kernel; use ``solvers.chebyshev_backward`` / ``solvers.chebyshev_solve`` for it.

Contract: ``float32`` (``solvers.contracts``): float32 iterates, adjoints, products and accumulation; bf16 inputs
widened exactly (a bf16 H multiplies through three exact bf16 pieces of the iterate, fp32-accurate);
``input_precision="tf32"``: ``tf32``; the result rounded once to ``out_dtype``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from solvers import omega_schedule
from solvers import validation as check
from solvers.system import sum_to_shape

from . import _launch as launch
from ._matvec import load_matrix, load_vector, matvec, rmatvec, store_matrix, store_vector
from .chebyshev import chebyshev_steps, constants
from .chebyshev import run as forward_run

METHODS = ("implicit", "reverse", "reverse_stored_omega")


@triton.jit
def implicit_kernel(
    p_H,
    p_q,
    p_g,
    p_x,
    p_step,
    p_rho2,
    p_dq,
    p_dH,
    iters,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
    HAVE_X: tl.constexpr,
):
    """dq = CH(H, g, r); dH = -dq x^T, x = xi_r read (HAVE_X) or computed here from q."""
    i_n = tl.program_id(0).to(tl.int64)
    b_H = load_matrix(p_H, i_n, D, BLOCK_D, MODE)
    b_step = tl.load(p_step + i_n)
    b_rho2 = tl.load(p_rho2 + i_n)
    if HAVE_X:
        b_x = load_vector(p_x, i_n, D, BLOCK_D)
    else:
        b_x, _ = chebyshev_steps(
            b_H,
            load_vector(p_q, i_n, D, BLOCK_D),
            b_step,
            b_rho2,
            iters,
            p_dq,
            0,
            i_n,
            D,
            BLOCK_D,
            MODE,
            False,
        )
    b_dq, _ = chebyshev_steps(
        b_H,
        load_vector(p_g, i_n, D, BLOCK_D),
        b_step,
        b_rho2,
        iters,
        p_dq,
        0,
        i_n,
        D,
        BLOCK_D,
        MODE,
        False,
    )
    store_vector(p_dq, i_n, b_dq, D, BLOCK_D)
    store_matrix(p_dH, i_n, -(b_dq[:, None] * b_x[None, :]), D, BLOCK_D)


@triton.jit
def reverse_kernel(
    p_H,
    p_q,
    p_g,
    p_x,
    p_xprev,
    p_step,
    p_rho2,
    p_nu,
    p_omegas,
    p_dq,
    p_dH,
    iters,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
    FORWARD: tl.constexpr,
    STORED: tl.constexpr,
):
    """Corrected GKA Algorithm 2 for one system.

    FORWARD: run Algorithm 1 here for xi_r, xi_{r-1} (else read them from p_x, p_xprev).
    STORED: read omega_{i-1} from p_omegas (row of r + 1); else p_nu holds 4/rho^2 and
    omega_r comes from the forward's recurrence (the last row entry, or computed here).
    """
    i_n = tl.program_id(0).to(tl.int64)
    b_H = load_matrix(p_H, i_n, D, BLOCK_D, MODE)
    b_q = load_vector(p_q, i_n, D, BLOCK_D)
    b_step = tl.load(p_step + i_n)
    if FORWARD:
        b_x, b_xp = chebyshev_steps(
            b_H, b_q, b_step, tl.load(p_rho2 + i_n), iters, p_dq, 0, i_n, D, BLOCK_D, MODE, False
        )
    else:
        b_x = load_vector(p_x, i_n, D, BLOCK_D)
        b_xp = load_vector(p_xprev, i_n, D, BLOCK_D)
    p_om = p_omegas + i_n * (iters + 1)
    b_nu = tl.load(p_om + iters)
    if not STORED:
        b_four = tl.load(p_nu + i_n)
    b_lam = load_vector(p_g, i_n, D, BLOCK_D)
    b_lam_next = tl.zeros([BLOCK_D], dtype=tl.float32)
    b_nu_next = 1.0  # b_{r+1} multiplies lambda_{r+1} = 0
    b_dq = tl.zeros([BLOCK_D], dtype=tl.float32)
    b_dH = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    for k in range(iters):
        i = iters - k
        b_c = b_nu * b_step  # c_i
        b_dq += b_c * b_lam
        b_dH -= (b_c * b_lam)[:, None] * b_xp[None, :]  # eq. (48)
        b_lam_prev = (
            b_nu * b_lam - b_c * rmatvec(b_H, b_lam, MODE, BLOCK_D) - (b_nu_next - 1.0) * b_lam_next
        )
        b_xpp = (b_x - b_nu * b_xp + b_c * (matvec(b_H, b_xp, MODE, BLOCK_D) - b_q)) / (
            1.0 - b_nu
        )  # (49)
        if STORED:
            b_nu_prev = tl.load(p_om + i - 1)
        else:
            b_nu_prev = b_four * (1.0 - 1.0 / b_nu)  # (47)
        b_x = b_xp
        b_xp = b_xpp
        b_lam_next = b_lam
        b_lam = b_lam_prev
        b_nu_next = b_nu
        b_nu = b_nu_prev
    b_dq += b_step * b_lam  # c_0 lambda_0, c_0 = 2/(L+mu)
    store_vector(p_dq, i_n, b_dq, D, BLOCK_D)
    store_matrix(p_dH, i_n, b_dH, D, BLOCK_D)


def _reversible(Lt, mt, omegas, iters):
    """The reverse methods divide by b_i = -(omega_i - 1) (eq. (49)): refuse L == mu and a
    schedule that rounds to omega_r <= 1, as the reference does."""
    if iters >= 1 and Lt.numel() and bool((Lt == mt).any()):
        raise ValueError(
            "the reverse methods need L > mu in every system: with L == mu, "
            "b_i = -(omega_i - 1) = 0 and eq. (49) cannot rebuild the iterates"
        )
    if iters >= 2 and omegas.numel() and bool((omegas[:, -1] <= 1.0).any()):
        raise ValueError(
            "the reverse methods need omega_r > 1 in float32 (eq. (49) divides by omega_i - 1); "
            "L/mu is too close to 1"
        )


def _launch_backward(
    method, H2, q2, g2, step, rho2, Lt, mt, iters, mode, grad_dtype, x=None, xprev=None
):
    """dq ``(N, D)``, dH ``(N, D, D)`` in ``grad_dtype`` for flattened systems."""
    N, D = q2.shape
    dev = q2.device
    dq = launch.empty_out((N, D), grad_dtype, dev)
    dH = launch.empty_out((N, D, D), grad_dtype, dev)
    if N == 0 or D == 0:
        return dq, dH
    BD = launch.block(D)
    if method == "implicit":
        have_x = x is not None
        for s, n in launch.launches(N):
            implicit_kernel[(n,)](
                H2[s:],
                q2[s:],
                g2[s:],
                x[s:] if have_x else q2[s:],
                step[s:],
                rho2[s:],
                dq[s:],
                dH[s:],
                iters,
                D=D,
                BLOCK_D=BD,
                MODE=mode,
                HAVE_X=have_x,
                num_warps=launch.num_warps(D),
            )
        return dq, dH
    omegas = omega_schedule(rho2, iters).contiguous()
    _reversible(Lt, mt, omegas, iters)
    stored = method == "reverse_stored_omega"
    rho = (Lt - mt) / (Lt + mt)
    four = launch.fp32(4.0 / rho**2) if not stored else step
    forward = x is None
    for s, n in launch.launches(N):
        reverse_kernel[(n,)](
            H2[s:],
            q2[s:],
            g2[s:],
            (q2 if forward else x)[s:],
            (q2 if forward else xprev)[s:],
            step[s:],
            rho2[s:],
            four[s:],
            omegas[s:],
            dq[s:],
            dH[s:],
            iters,
            D=D,
            BLOCK_D=BD,
            MODE=mode,
            FORWARD=forward,
            STORED=stored,
            # dH's accumulator joins H on chip: twice the threads keep registers per thread in bounds
            num_warps=2 * launch.num_warps(D),
        )
    return dq, dH


def _grads(dq2, dH2, batch, q_shape, H_shape, dtype):
    """Per-system gradients summed down to the broadcast inputs' shapes, rounded once."""
    D = dq2.shape[-1]
    return (
        sum_to_shape(dq2.reshape(*batch, D), q_shape).to(dtype),
        sum_to_shape(dH2.reshape(*batch, D, D), H_shape).to(dtype),
    )


def _method(name, m):
    if not isinstance(m, str) or m not in METHODS:
        extra = (
            " ('autograd' has no kernel: use solvers.chebyshev_backward)" if m == "autograd" else ""
        )
        raise ValueError(f"{name} must be one of {METHODS}, got {m!r}{extra}")
    return m


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
    input_precision: str = "ieee",
    out_dtype=None,
    tensor_cores=None,
):
    """``(dq, dH)`` for ``xi_r = chebyshev(H, q, L=L, mu=mu, iters=iters)`` and ``dL/dxi_r = grad_x``
    (``solvers.chebyshev_backward``; GKA Table 1 / Algorithm 2 corrected, by ``method``).

    Shapes, checks and results as the reference (gradients summed over broadcast batch dims,
    in H's dtype unless ``out_dtype``); differences: methods "implicit", "reverse",
    "reverse_stored_omega" only, no ``return_info``, float32 arithmetic (as kernels.chebyshev).
    """
    iters = check.count("iters", iters)
    _method("method", method)
    if check.flag("return_info", return_info):
        raise ValueError(
            "return_info is not supported by kernels.chebyshev_backward; "
            "solvers.chebyshev_backward(..., return_info=True) gives the history"
        )
    launch.bf16_mode(bf16_mode)
    precision = launch.input_precision(input_precision)
    H2, q2, batch, Lt, mt = launch.bounded_systems(H, q, L, mu)
    g2 = _cotangent(grad_x, H2, batch)
    mode = launch.matvec_mode(H2.dtype, precision, tensor_cores)
    odt = launch.out_dtype(out_dtype, H2.dtype)
    reduce = tuple(H.shape) != (*batch, *H.shape[-2:]) or tuple(q.shape) != tuple(batch) + (
        q.shape[-1],
    )
    step, rho2 = constants(Lt, mt)
    dq2, dH2 = _launch_backward(
        method, H2, q2, g2, step, rho2, Lt, mt, iters, mode, torch.float32 if reduce else odt
    )
    _finite_grads(dq2, dH2, H=H, q=q, grad_x=grad_x)
    return _grads(dq2, dH2, batch, q.shape, H.shape, odt)


def _finite_grads(dq2: torch.Tensor, dH2: torch.Tensor, **inputs) -> None:
    """Never a silent NaN in dq or dH: both are checked, with one device read (where
    ``launch.finite_result`` reads one), since dH = -dq x^T is non-finite when x is (a NaN or
    Inf in q reaches x, and dH, but not dq). A non-finite input is named; gradients that
    overflowed from finite inputs are returned, as the reference returns them."""
    if dH2.numel():
        finite = torch.isfinite(dq2).all() & torch.isfinite(dH2).all()
        launch.finite_result(torch.where(finite, 0.0, float("nan")), **inputs)


def _cotangent(grad_x, H2, batch) -> torch.Tensor:
    g = launch.tensor("grad_x", grad_x, min_ndim=1)
    check.same_kind("grad_x", g, "H", H2)
    expected = (*batch, H2.shape[-1])
    if tuple(g.shape) != expected:
        raise ValueError(
            f"grad_x must have the shape of the forward's output {expected}, got {tuple(g.shape)}"
        )
    return launch.flat(g, 1)


class ChebyshevSolve(torch.autograd.Function):
    """``xi_r = kernels.chebyshev(H, q, ...)`` whose backward is a kernel of :data:`METHODS`.

    Use :func:`chebyshev_solve`. The forward saves H, q, float32 xi_r (and xi_{r-1} for
    the reverse methods); no gradient flows to L or mu.
    """

    @staticmethod
    def forward(ctx, H, q, L, mu, iters, backward, precision, tensor_cores):
        H2, q2, batch, Lt, mt = launch.bounded_systems(H, q, L, mu)
        mode = launch.matvec_mode(H2.dtype, precision, tensor_cores)
        step, rho2 = constants(Lt, mt)
        if backward != "implicit":
            _reversible(Lt, mt, omega_schedule(rho2, iters).contiguous(), iters)
        x32, xprev, _ = forward_run(
            H2,
            q2,
            step,
            rho2,
            iters,
            mode=mode,
            out_dtype=torch.float32,
            store_prev=backward != "implicit",
        )
        launch.finite_result(x32, H=H, q=q)
        ctx.save_for_backward(H2, q2, x32, xprev if xprev is not None else x32, step, rho2, Lt, mt)
        ctx.shapes = (batch, q.shape, H.shape, H.dtype)
        ctx.iters, ctx.backward, ctx.mode = iters, backward, mode
        D = q2.shape[-1]
        return x32.to(H.dtype).reshape(*batch, D)

    @staticmethod
    def backward(ctx, grad_x):
        H2, q2, x32, xprev, step, rho2, Lt, mt = ctx.saved_tensors
        batch, q_shape, H_shape, dtype = ctx.shapes
        g2 = launch.flat(grad_x.to(dtype).expand(*batch, H2.shape[-1]), 1)
        dq2, dH2 = _launch_backward(
            ctx.backward,
            H2,
            q2,
            g2,
            step,
            rho2,
            Lt,
            mt,
            ctx.iters,
            ctx.mode,
            torch.float32,
            x=x32,
            xprev=xprev,
        )
        _finite_grads(dq2, dH2, grad_x=grad_x)
        dq, dH = _grads(dq2, dH2, batch, q_shape, H_shape, dtype)
        return dH, dq, None, None, None, None, None, None


def chebyshev_solve(
    H,
    q,
    *,
    L,
    mu,
    iters: int,
    backward: str = "implicit",
    bf16_mode: str = "storage",
    input_precision: str = "ieee",
    tensor_cores=None,
):
    """``kernels.chebyshev`` with a kernel backward (``solvers.chebyshev_solve``).

    ``backward``: "implicit" (default), "reverse" or "reverse_stored_omega"; first
    derivatives only, for H and q. The result equals ``kernels.chebyshev(H, q, ...)``.
    """
    iters = check.count("iters", iters)
    _method("backward", backward)
    launch.bf16_mode(bf16_mode)
    precision = launch.input_precision(input_precision)
    return ChebyshevSolve.apply(H, q, L, mu, iters, backward, precision, tensor_cores)
