"""A-posteriori running error bounds for a kernel that declares a precision contract.

The kernel's own trajectory is unknown (only its output is seen), so the bound is built on
the *exact* trajectory of the same algorithm on the same (rounded) inputs, computed here in
float64, plus a rigorous recursion for how far the kernel can have drifted from it.

Linear iterations (:func:`linear_bound`: Chebyshev, GKA Algorithm 1; GD; AGD; and Chebyshev
on the GKA ridge system ``(H + lambda I) x = q``, GKA eq. (4)). Every step has the form

    z_i = x_{i-1} + beta (x_{i-1} - x_{i-2})                    (beta = 0 but for AGD)
    x_i = z_i - c_i ((H + lambda I) z_i - q) + b_i (x_{i-1} - x_{i-2})

(Chebyshev: ``c_i = omega_i 2/(L+mu)``, ``b_i = omega_i - 1``; GD: ``c = 2/(L+mu)``; AGD:
``c = 1/L``, ``beta = (sqrt(kappa)-1)/(sqrt(kappa)+1)``). The kernel stores
``x_hat_i = step_i(x_hat_{i-1}, x_hat_{i-2}) + delta_i`` with a local error delta_i; the
deviation ``d_i = x_hat_i - x_i`` then obeys the *exact* linear recurrence
``d_i = a_i(A) d_{i-1} + b_i(A) d_{i-2} + delta_i`` (A = H + lambda I symmetric), so
``d_i = sum_{j<=i} P_{i,j}(A) delta_j`` with scalar responses tau_{i,j}(lam) on A's eigenvalues.

Local errors come in three channels, each a vector of known 2-norm times a known matrix
function of A, ``delta_j = sum_ch m_ch(A) eta_ch``:

* ``plain`` (m = 1): elementwise rounding in the accumulation dtype, the fp32 accumulation of
  ``H z`` (``gamma_D(u_acc) |H| |z|``, Higham eq. (3.11)), rounding of H itself when the
  operand format is coarser than the input, the weights' and constants' own rounding, and
  the store of x_i when the contract stores the iterate;
* ``operand`` (m = c_j (lam - lambda)): the product's operand ``z`` rounded to the contract's
  operand format, ``|e| <= u_op |z_hat|`` (bf16 operands: GKA's chunked kernel, fla's MesaNet);
* ``zstore`` (m = 1 - c_j lam): AGD's y stored rounded.

Hence, exactly, ``||d_i|| <= S_2 = sum_{j<=i} sum_ch max_k |tau_{i,j}(lam_k) m_ch,j(lam_k)| ||eta_ch,j||``;
by Cauchy-Schwarz also ``||d_i|| <= sqrt(S_1 S_2)`` with ``S_1 = max_k sum_{j,ch} |tau m|(lam_k) ||eta_ch,j||``
(:func:`propagated_norm_bound`), which is what is used: never above S_2, below it when the
responses of different steps peak at different eigenvalues. Keeping m inside the max matters: an
operand error is multiplied by c H before it enters, and ``max |tau c lam|`` is far below
``max|tau| ||c H||`` on the ends of the spectrum.

A stored iterate's error is bounded by half a spacing of the stored format at the value stored,
which is known up to the drift (:func:`store_error_bound`): on average about 0.7 of ``u ||x||``.
(A componentwise bound in A's eigenbasis, ``|(V^T e)_k| <= (|V|^T h)_k``, is not used: summed
over the eigenvalues where the responses are flat it is 3-5 times the norm bound at D = 128,
``analysis.studies.contract_tightness``.)

The norms ``||eta_j||`` need the kernel's ``||x_hat_{j-1}||``, which is bounded by
``||x_{j-1}|| + E_{j-1}`` with E the bound being computed: a rigorous forward recursion
(E_j uses E_{j-1}, E_{j-2}; the store term of step j uses the bound before that store).
Order: every bf16/tf32 term (u = 2^-8 / 2^-10) is rigorous, all products of errors kept. The
constants' and weights' rounding in the accumulation dtype (fp32) is bounded to first order
with a factor-2 margin (terms O(u_fp32^2) covered by it). The float64 evaluation of the bound
(trajectory, eigenvalues, responses) is inside ``SAFETY``.

CG (:func:`cg_bound`): no bound of this kind exists for CG's computed trajectory (it is not
forward stable: two runs lose orthogonality differently). What the check uses instead is the
*convergence bound in finite precision*, against the exact solution x* in the A-norm, not a
reference run: it catches a kernel that is less accurate than CG must be after k steps. It is a
*model* (constants below), and the CG verdict is marked model-based in the report.

With ``A = H + shift I``, ``||v||_{A^-1} = ||A^-1/2 v||`` and x_0 = 0, the kernel updates
``x_{j+1} = x_j + alpha_j p_j + xi_j`` and ``r_{j+1} = r_j - alpha_j (A p_j + mu_j) + rho_j``
(xi, rho: the roundings of the two updates and stores; mu: the product's error). One alpha_j and
one p_j enter both, so the residual gap ``f_j = q - A x_j - r_j`` obeys ``f_{j+1} = f_j - A xi_j +
alpha_j mu_j - rho_j`` whatever errors alpha_j and beta_j carry and however orthogonality is lost
(Greenbaum 1997, SIMAX 18(3); Sleijpen & van der Vorst 1996), and exactly
``||x* - x_k||_A = ||r_k + f_k||_{A^-1} <= ||r_k||_{A^-1} + ||f_k||_{A^-1}``. Relative to
``||x*||_A``:

* ``rate``, the updated residual: ``rho_k = min(1, 2 R_delta^k)``, Chebyshev on ``[lam_1 - delta,
  lam_n + delta]``. Greenbaum (1989, LAA 113) shows that finite-precision CG's updated residuals
  are those of exact CG on a matrix with eigenvalues in small intervals about A's. The widths her
  proof gives are not explicit and far larger than those observed; Greenbaum & Strakos (1992,
  SIMAX 13(1)) found that widths of order ``u ||A||`` reproduce finite-precision runs. The model:
  ``delta = CG_WIDTH u_eff ||A||_2 + gamma_D(u_acc) || |H| ||_2`` (plus H's own rounding), ``u_eff``
  the contract's coarsest roundoff, ``CG_WIDTH = 1``. No correct CG of the validation below
  exceeded the bound even with ``CG_WIDTH = 0`` (10 M steps), so the width is a margin, not a
  fit. (The rate alone is attained by exact CG on Chebyshev-extremal spectra, e.g. two
  eigenvalues with q on both at k = 1: measured over bound reaches 0.99 there whatever the
  arithmetic.)
* ``attainable``, the gap: each local error through ``A^-1/2``, summed over the steps (triangle
  inequality, worst case), with the kernel's vectors bounded through the rate:
  ``||dx_j||_A <= theta rho_j ||x*||_A`` (exact CG: ``||dx_j||_A = ||r_j||^2 / ||p_j||_A <=
  ||r_j||_{A^-1}`` since ``r_j^T p_j = ||r_j||^2``; ``theta = 1 + 8 u`` for the local orthogonality
  finite precision keeps, Strakos & Tichy 2002, ETNA 13; measured <= 1.007 in bf16),
  ``||r_{j+1}|| <= sqrt(lam_n) rho_{j+1} ||x*||_A`` and ``||x_{j+1}|| <= ||x*|| + ||e_{j+1}||_A /
  sqrt(lam_1)``. With ``sk = sqrt(kappa)`` and ``a = sqrt(lam_n) ||x*|| / ||x*||_A`` in ``[1, sk]``
  (where x* lies in A's spectrum; sk without q), per step:

  - the operand rounding of p in ``A p`` enters as ``alpha A (fl(p) - p)``, whose ``A^-1/2`` is
    ``A^1/2 alpha (fl(p) - p)``: ``u_op sk rho_j``, a sqrt(kappa) channel, not kappa;
  - the iterate's sum and store: ``sqrt(lam_n) min(u ||x_{j+1}||, ||dx_j||)`` -- x_j is
    representable, so rounding ``x_j + dx_j`` errs by at most dx_j (a lost update) -- about
    ``min(u a, sk rho_j)``;
  - the residual's sum and store: ``||rho_j|| / sqrt(lam_1) <= u sk rho_{j+1}``;
  - the accumulation of ``H p``, ``gamma_D(u_acc) || |H| || ||dx_j|| / sqrt(lam_1)``: the one kappa
    channel, at u_acc;
  - once: r_0 = fl(q) when q does not fit the format (``u ||q|| / sqrt(lam_1)``), and H rounded to
    the operand format when it does not fit it, a fixed delta_H whose steps sum to
    ``delta_H x_k`` (``u_op || |H| || ||x_k|| / sqrt(lam_1)``).

  The former floor ``4 u_b kappa^1.5`` composed a 2-norm forward error ``u_b kappa`` with the
  2-norm-to-A-norm factor sqrt(kappa), which are not worst at once. The sum over steps still grows
  like ``sum_j rho_j``, about sqrt(kappa) when convergence is slow, so a long run's floor can reach
  ``u kappa``: it is computed per case, not assumed. At D = 16, k = 30, log-uniform spectra and
  Gaussian q (median), bound / ``||x*||_A`` at kappa 16, 51, 100: bf16 operands 0.063, 0.21, 0.48;
  bf16 storage 0.32, 1.4, 3.7 (the iterate's store dominates); tf32 0.015, 0.048, 0.10
  (u = 2^-10); float32 8e-5, 8e-4, 0.006 (formerly 2.0, 6.7, 17 for both bf16 contracts).

Validation (correct CGs never exceed it): every step k <= 2D of ``kernels.emulate.cg`` under
float32, tf32, bf16 operands and bf16 storage (bf16 and float32 inputs), ``solvers.cg`` (float32,
bf16 storage and strict), ``kernels.cg`` (interpreter, float32 and tf32) and variants (matvec and
dot summation orders, 16-wide fp32 tiles, alpha = r^T p / p^T A p, p or r also rounded to bf16),
D 1-128, kappa 1.5-1000, log-uniform, geometric, linear, clustered, outlier and Strakos spectra,
q Gaussian or along the bottom / top eigenvectors: 12 M steps (8 M conclusive), no violation;
where the floor dominates (>= 10 x the rate) measured / bound is at most 0.38 (bf16 storage,
kappa 1.5, k = 4), 0.18 (bf16 operands), 0.16 (tf32, float32). The CGs checked freeze at the
rounding floor ``r^T r <= (u ||q||)^2`` (kernels.cg's guard): without it ``r^T r`` underflows
into fp32 subnormals past convergence (``||r_k|| < 1e-19 ||q||``), which the rounding model
excludes, and the run can diverge from there. Outside the model too: a Polak-Ribiere beta with
bf16 dot products cancels past convergence and diverges (errors up to 1e8 ``||x*||_A``). Both
FAIL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from analysis.precision import gamma
from solvers import Arith, unit_roundoff
from solvers import validation as _v
from solvers.contracts import OPERAND_ROUNDOFF, Contract, of_reference, parse

_F64 = torch.float64
SAFETY = 1.0 + 2.0**-20
LINEAR_METHODS = ("chebyshev", "gd", "agd")


@dataclass
class LinearRun:
    """The exact trajectory and the running bound of one contract, per system.

    x: ``(r+1, *batch, D)`` float64 exact iterates; bound: ``(r+1, *batch)`` absolute bound on
    ``||x_hat_i - x_i||_2`` for a kernel honouring the contract; departed (with an observed
    trajectory only, else None): ``(r+1, *batch)`` ``||x_obs_i - x_i|| / (bound_i + R(x_obs_i))``,
    R the rounding of the observed value to its own dtype where that is coarser than the format
    the kernel keeps x_i in (else 0): above 1 at a step where the observed trajectory left the
    bound (:func:`linear_bound`, ``observed``). At step r it is a check of the result against
    the exact run with no reference's bound added."""

    x: torch.Tensor
    bound: torch.Tensor
    departed: Optional[torch.Tensor] = None

    @property
    def relative(self) -> torch.Tensor:
        """The final bound over ``||x_r||``."""
        return self.bound[-1] / torch.linalg.vector_norm(self.x[-1], dim=-1)


def _float_tensor(name: str, x, min_ndim: int) -> torch.Tensor:
    """A finite floating tensor of any float dtype (the bounds widen it exactly to float64)."""
    return _v.floating(name, x, min_ndim=min_ndim)


def _matrix(name: str, H) -> torch.Tensor:
    H = _float_tensor(name, H, 2)
    if H.shape[-1] != H.shape[-2]:
        raise ValueError(
            f"{name} must be square in its last two dimensions, got shape {tuple(H.shape)}"
        )
    if H.shape[-1] == 0:
        raise ValueError(f"{name} must have D >= 1, got shape {tuple(H.shape)}")
    return H


def _non_negative(name: str, v, batch) -> torch.Tensor:
    t = _v.parameter(name, v, batch, "cpu")
    if t.numel() and not bool((t >= 0).all()):
        raise ValueError(f"{name} must be >= 0, got min {float(t.min())}")
    return t


def _schedule(method: str, L, mu, iters: int, batch):
    """Per-step (c_i, b_i, beta_i), ``(r, *batch)`` float64, and the first iterate's factor s0
    (x_0 = s0 q: Chebyshev's xi_0 = step q; GD / AGD start at 0)."""
    L = torch.broadcast_to(torch.as_tensor(L, dtype=_F64), batch)
    mu = torch.broadcast_to(torch.as_tensor(mu, dtype=_F64), batch)
    zero = torch.zeros((iters, *batch), dtype=_F64)
    if method == "chebyshev":
        s = 2.0 / (L + mu)
        rho2 = ((L - mu) / (L + mu)) ** 2
        w, ws = torch.full_like(s, 2.0), []
        for _ in range(iters):
            w = 4.0 / (4.0 - rho2 * w)
            ws.append(w)
        w = torch.stack(ws) if ws else zero
        return w * s, w - 1.0, zero, s, {"omega": w, "rho2": rho2, "s": s}
    if method == "gd":
        s = 2.0 / (L + mu)
        return s.expand(iters, *batch), zero, zero, torch.zeros_like(s), {"s": s}
    if method == "agd":
        sk = torch.sqrt(L / mu)
        beta = (sk - 1.0) / (sk + 1.0)
        return (
            (1.0 / L).expand(iters, *batch),
            zero,
            beta.expand(iters, *batch),
            torch.zeros_like(L),
            {"s": 1.0 / L},
        )
    raise ValueError(f"method must be one of {LINEAR_METHODS}, got {method!r}")


def _constant_errors(method: str, c, b, beta, extra, u: float):
    """First-order bounds (x2 margin) on |c_hat - c|, |b_hat - b|, |beta_hat - beta| when the kernel
    forms its constants in a dtype of roundoff u (each of s, rho^2, beta from L, mu in <= 4
    operations; the omega recurrence's three operations per step, propagated by its derivative
    rho^2 omega_i^2 / 4 < 1)."""
    if method != "chebyshev":
        return 2 * 5 * u * c.abs(), torch.zeros_like(b), 2 * 8 * u * beta.abs()
    w, rho2 = extra["omega"], extra["rho2"]
    dw, prev_w, out = torch.zeros_like(rho2), torch.full_like(rho2, 2.0), []
    for i in range(w.shape[0]):
        dw = rho2 * w[i] ** 2 / 4 * (1 + 8 * u) * dw + 2 * (
            prev_w * w[i] ** 2 / 4 * 4 * u * rho2 + 3 * u * w[i]
        )
        out.append(dw)
        prev_w = w[i]
    dw = torch.stack(out) if out else torch.zeros_like(c)
    s = extra["s"]
    return dw * s + 2 * 5 * u * c.abs(), dw + u, torch.zeros_like(beta)


def linear_bound(
    method: str,
    H,
    q,
    *,
    L,
    mu,
    iters: int,
    contract,
    shift=None,
    shift_error=None,
    value_u: Optional[float] = None,
    param_rel_error: float = 0.0,
    store_drift: bool = True,
    H_error=None,
    extra_plain=None,
    H_error_range=None,
    observed=None,
) -> LinearRun:
    """The exact trajectory of ``method`` on ``(H + shift I) x = q`` and the running bound of a
    kernel honouring ``contract`` (module docstring).

    H ``(*batch, D, D)`` symmetric, q ``(*batch, D)``: the values the kernel received (any dtype,
    widened exactly); L, mu: the method's eigenvalue bounds, broadcast over the batch; shift:
    lambda (GKA ridge), ``shift_error`` a bound on the kernel's error in it; value_u: roundoff
    of the input values (operand rounding of H when the operand format is coarser);
    param_rel_error: a relative error of the kernel's L and mu beyond their rounding (GKA
    ridge: its own ||H||_F), which moves the step c_i by as much. ``store_drift=False`` bounds each
    store at the exact iterate alone, ignoring that the kernel's value has drifted: NOT a bound,
    only a measure of what the drift costs (``analysis.studies.contract_tightness``).

    ``H_error`` ``(*batch, D, D)`` non-negative (None: the model above): a bound on the kernel's
    product, ``|(H z_hat computed) - H z_hat| <= H_error |z_hat|`` componentwise for the
    operand-rounded ``z_hat``, for a kernel that never holds H itself (the GKA layer: a rounded
    chunk state plus masked chunk products, ``analysis.bounds.gka_layer``). It *replaces* the
    ``gamma_D(u_acc) |H|`` and ``u_op(value_u) |H|`` terms: it must cover the product's
    accumulation and every rounding of the matrix's parts; the operand channel (z rounded before
    the product) stays as it is. It enters the plain channel as ``c_i ||H_error |z_hat| || <= c_i
    (||H_error |z| || + ||H_error||_2 (||z_hat - z||))``, z the exact iterate, and the bound on the
    kernel's residual norm (which scales the constants' rounding) by ``||H_error||_2 ||z_hat||``.
    A normwise bound ``||e|| <= h ||z_hat||`` is ``H_error = h I``.
    ``extra_plain`` ``(*batch, 4)`` non-negative (None: nothing): local errors of a kernel whose
    elementwise arithmetic is arranged otherwise than the model above, added to the plain channel
    of step i >= 1 as ``p_0 ||x_hat_{i-1}|| + p_1 ||x_hat_{i-2}|| + p_2 ||q||`` (the norms bounded
    by ``||x_j|| + E_j``) and of step 0 as ``p_3 ||q||``.
    ``H_error_range`` ``(h, nu)``, per-system non-negative (None: nothing): a further product
    error that lies in the range of H, ``e = (H + nu I)^(1/2) w`` with ``||w|| <= h ||z_hat||``
    (the GKA layer's masked chunk product rounded to bf16: ``K^T diag(theta) M K z`` with
    ``K^T M K <= H``). It has a channel of its own, ``range``: ``m = c_j sqrt(lam - lambda + nu)``,
    so it is not amplified on H's small eigenvalues as a plain error is; its norm
    ``sqrt(||H||_2 + nu) h ||z_hat||`` joins the residual bound as ``H_error`` does.

    ``observed`` ``(r+1, *batch, D)`` (None: the kernel's trajectory is unknown): the kernel's
    own iterates, ``observed[i]`` its output after i steps, in the dtype it returned (the harness
    obtains them by running a deterministic kernel with ``iters = 0, 1, ..., r``: Chebyshev's,
    GD's and AGD's i-th iterate does not depend on r). Where the contract stores the iterate,
    each store is then bounded *at the kernel's value* as well, and the smaller bound is used:
    a value y rounded to nearest, in the storage format or after it in any other, lands in y's
    binade or on its upper end, so ``|fl(y) - y| <= u 2^floor(log2 |x_obs|)`` component by
    component (:func:`half_spacings`), with no drift term (on GKA's ridge systems the drift
    costs 0.9 points of ||x||, ``analysis.studies.contract_tightness``). That holds only if
    ``observed`` is the trajectory of the run the bound is for: a precondition (the i-step run
    computes the first i steps of the r-step run), not something a bound can check. What is
    checked is the trajectory's consistency with the contract: ``LinearRun.departed`` is each
    step's ``||x_obs_i - x_i||`` over its bound; a ratio above 1 means the kernel left its
    contract at step i and the final bound is void for that system. Values from runs that are
    not the prefix can only make the bound smaller than the run needs (a false FAIL), since the
    store bound used is the smaller of the two.
    """
    if method not in LINEAR_METHODS:
        raise ValueError(f"method must be one of {LINEAR_METHODS}, got {method!r}")
    contract = parse(contract)
    H = _matrix("H", H)
    q = _float_tensor("q", q, 1)
    if q.shape[-1] != H.shape[-1]:
        raise ValueError(f"q has last dimension {q.shape[-1]} but H is {H.shape[-2]}x{H.shape[-1]}")
    iters = _v.count("iters", iters)
    batch = _v.batch_shape("H and q", H.shape[:-2], q.shape[:-1])
    if 0 in batch:
        raise ValueError(f"H and q have an empty batch {tuple(batch)}")
    H = H.detach().cpu().to(_F64)
    q = q.detach().cpu().to(_F64)
    L = _v.parameter("L", L, batch, "cpu")
    mu = _v.parameter("mu", mu, batch, "cpu")
    _v.spectrum_bounds(L, mu)
    if shift is not None:
        shift = _non_negative("shift", shift, batch)
    if shift_error is not None:
        shift_error = _non_negative("shift_error", shift_error, batch)
    value_u = _v.tolerance("value_u", value_u, allow_none=True)
    param_rel_error = _v.tolerance("param_rel_error", param_rel_error)
    if H_error is not None:
        H_error = _matrix("H_error", H_error).detach().cpu().to(_F64)
        if H_error.shape[-1] != H.shape[-1] or (H_error.numel() and not bool((H_error >= 0).all())):
            raise ValueError(
                f"H_error must be non-negative and {H.shape[-1]}x{H.shape[-1]}, got shape "
                f"{tuple(H_error.shape)}"
            )
        try:
            H_error = H_error.expand(*batch, *H_error.shape[-2:])
        except RuntimeError:
            raise ValueError(
                f"H_error has shape {tuple(H_error.shape)}, which does not broadcast to the batch "
                f"{tuple(batch)}"
            ) from None
    if extra_plain is not None:
        extra_plain = _float_tensor("extra_plain", extra_plain, 1).detach().cpu().to(_F64)
        if extra_plain.shape[-1] != 4 or not bool((extra_plain >= 0).all()):
            raise ValueError(
                f"extra_plain must be non-negative of shape (*batch, 4), got {tuple(extra_plain.shape)}"
            )
        extra_plain = torch.broadcast_to(extra_plain, (*batch, 4)).unbind(-1)
    if H_error_range is not None:
        if not isinstance(H_error_range, (tuple, list)) or len(H_error_range) != 2:
            raise TypeError("H_error_range must be a pair (h, nu)")
        range_h = _non_negative("H_error_range h", H_error_range[0], batch)
        range_nu = _non_negative("H_error_range nu", H_error_range[1], batch)
    H = H.expand(*batch, *H.shape[-2:])
    q = q.expand(*batch, q.shape[-1])
    D = H.shape[-1]
    if observed is not None:
        observed = _observed(observed, (iters + 1, *batch, D))
    shift = (
        torch.zeros(batch, dtype=_F64)
        if shift is None
        else torch.broadcast_to(torch.as_tensor(shift, dtype=_F64), batch)
    )
    dshift = (
        torch.zeros_like(shift)
        if shift_error is None
        else torch.broadcast_to(torch.as_tensor(shift_error, dtype=_F64), batch)
    )
    c, b, beta, s0, extra = _schedule(method, L, mu, iters, batch)
    u_acc, u_st = contract.u_acc, contract.u_store
    dc, db, dbeta = _constant_errors(method, c, b, beta, extra, u_acc)
    dc = dc + 2 * param_rel_error * c.abs()

    A = H + shift[..., None, None] * torch.eye(D, dtype=_F64)
    mv = lambda M, v: (M @ v.unsqueeze(-1)).squeeze(-1)  # noqa: E731
    # the exact trajectory
    xs = [s0.unsqueeze(-1) * q]
    prev = torch.zeros_like(q)
    zs, gs = [], []
    for i in range(iters):
        x = xs[-1]
        z = x + beta[i].unsqueeze(-1) * (x - prev)
        g = mv(A, z) - q
        xs.append(z - c[i].unsqueeze(-1) * g + b[i].unsqueeze(-1) * (x - prev))
        zs.append(z)
        gs.append(g)
        prev = x
    X = torch.stack(xs)
    nx = torch.linalg.vector_norm(X, dim=-1)

    # responses tau_{i,j}(lam_k) of a unit error added to x_j, and the channel gains
    lam = torch.linalg.eigvalsh(A)  # (*batch, D)
    lamH = lam - shift.unsqueeze(-1)
    r = iters
    T = torch.zeros((r + 1, r + 1, *batch, D), dtype=_F64)
    for j in range(r + 1):
        cur, old = torch.ones_like(lam), torch.zeros_like(lam)
        T[j, j] = cur
        for i in range(j + 1, r + 1):
            ci, bi, be = (v[i - 1].unsqueeze(-1) for v in (c, b, beta))
            damp = 1.0 - ci * lam
            cur, old = damp * (1.0 + be) * cur + bi * cur - (damp * be + bi) * old, cur
            T[i, j] = cur
    cj = torch.cat([torch.zeros_like(c[:1]), c])  # c of the step that commits the error at x_j
    # |tau_{i,j}(lam_k) m_ch,j(lam_k)| per channel, (r+1, r+1, *batch, D), and its max over k
    # (only the channels that can carry an error: the others' eta stay 0 and would add nothing)
    u_op_z = contract.u_operand(u_st if contract.stores("iterate") else u_acc)
    resp = {"plain": T.abs()}
    if u_op_z > 0:
        resp["operand"] = (T * (cj.unsqueeze(-1) * lamH).unsqueeze(0)).abs()
    if method == "agd" and contract.stores("iterate"):
        resp["zstore"] = (T * (1.0 - cj.unsqueeze(-1) * lam).unsqueeze(0)).abs()
    if H_error_range is not None:
        root = (lamH + range_nu.unsqueeze(-1)).clamp_min(0.0).sqrt()
        resp["range"] = (T * (cj.unsqueeze(-1) * root).unsqueeze(0)).abs()
    del T
    gain = {ch: t.amax(-1) for ch, t in resp.items()}

    absH = torch.linalg.matrix_norm(H.abs(), ord=2)
    normA = lam.abs().amax(-1)
    u_op_H = 0.0 if value_u is None else contract.u_operand(value_u)
    mv_err = gamma(D, u_acc)
    if H_error is not None:
        herr = torch.linalg.matrix_norm(H_error, ord=2)
    if H_error_range is not None:
        range_norm = torch.sqrt(lamH.abs().amax(-1) + range_nu) * range_h

    E = torch.zeros((r + 1, *batch), dtype=_F64)
    eta = {
        k: torch.zeros((r + 1, *batch), dtype=_F64) for k in ("plain", "operand", "zstore", "range")
    }

    def accumulated(i):
        return propagated_norm_bound(
            {ch: resp[ch][i, : i + 1] for ch in resp},
            {ch: eta[ch][: i + 1] for ch in resp},
            gain={ch: gain[ch][i, : i + 1] for ch in gain},
        )

    # x_0 = fl_store(s0 q): one product (and the constant's own rounding)
    nq = torch.linalg.vector_norm(q, dim=-1)
    eta["plain"][0] = (3 * u_acc * s0 * nq) * (1 + u_acc)
    # the kernel's s0 = 2/(L + mu) moves with its L and mu, as c_i does (param_rel_error)
    eta["plain"][0] += 2 * param_rel_error * s0.abs() * nq
    if extra_plain is not None:
        eta["plain"][0] += extra_plain[3] * nq
    pre = SAFETY * accumulated(0)
    at_kernel = None
    if observed is not None and contract.stores("iterate"):
        # half a spacing at the kernel's own stored values; a NaN or inf bounds nothing
        at_kernel = torch.linalg.vector_norm(
            half_spacings(observed.to(_F64), u_st, contract.storage), dim=-1
        )
        at_kernel = torch.nan_to_num(at_kernel, nan=math.inf)

    def stored(i, pre):
        b = store_error_bound(X[i], pre if store_drift else 0 * pre, u_st, contract.storage)
        return b if at_kernel is None else torch.minimum(b, at_kernel[i])

    eta["plain"][0] += stored(0, pre)
    E[0] = SAFETY * accumulated(0)
    for i in range(1, r + 1):
        k = i - 1
        e1, e2 = E[k], E[k - 1] if k >= 1 else torch.zeros_like(E[k])
        x1 = nx[k] + e1
        dx = torch.linalg.vector_norm(X[k] - (X[k - 1] if k >= 1 else 0 * X[k]), dim=-1) + e1 + e2
        zerr = (1 + beta[k].abs()) * e1 + beta[k].abs() * e2
        zn = torch.linalg.vector_norm(zs[k], dim=-1) + zerr
        zop = zn * (1 + u_op_z)  # ||z|| after its operand rounding: the product accumulates over it
        ci, bi, be = c[k], b[k].abs(), beta[k].abs()
        if H_error is None:
            gn = (
                torch.linalg.vector_norm(gs[k], dim=-1)
                + normA * zerr
                + absH * (mv_err * zop + u_op_z * zn)
            )
            # accumulation of H z (and H's rounding): || |H| |z_hat| || <= || |H| |z| || + || |H| || ||z_hat - z||
            hz = torch.linalg.vector_norm(mv(H.abs(), zs[k].abs()), dim=-1) + absH * zerr
            # (1 + gamma_D)(1 + u_op_H) - 1: the accumulation's and H's rounding, their product kept
            mv_h = (1 + mv_err) * (1 + u_op_H) - 1
            plain = ci * mv_h * (hz * (1 + u_op_z) + absH * u_op_z * zn)
        else:
            gn = (
                torch.linalg.vector_norm(gs[k], dim=-1)
                + normA * zerr
                + absH * u_op_z * zn
                + herr * zop
            )
            # ||H_error |z_hat| || <= ||H_error |z| || + ||H_error|| (||z_k - z|| + ||z_hat - z_k||)
            hz = torch.linalg.vector_norm(mv(H_error, zs[k].abs()), dim=-1)
            plain = ci * (hz + herr * (zerr + u_op_z * zn))
        if H_error_range is not None:
            gn = gn + range_norm * zop
        plain = plain + ci * (u_acc * shift + dshift) * zn  # lambda z
        plain = plain + 2 * u_acc * (
            2 * ci * gn + 2 * zn + 2 * bi * dx + x1 + be * dx
        )  # elementwise ops
        plain = plain + dc[k] * gn + db[k].abs() * dx + dbeta[k] * dx  # the constants' own rounding
        eta["plain"][i] = plain * (1 + u_acc)
        if extra_plain is not None:
            x2 = nx[k - 1] + e2 if k >= 1 else torch.zeros_like(x1)
            eta["plain"][i] += extra_plain[0] * x1 + extra_plain[1] * x2 + extra_plain[2] * nq
        eta["operand"][i] = u_op_z * zn
        if H_error_range is not None:
            eta["range"][i] = range_h * zop
        if method == "agd" and contract.stores("iterate"):
            eta["zstore"][i] = u_st * zn
        pre = SAFETY * accumulated(i)
        if contract.stores("iterate"):
            eta["plain"][i] += stored(i, pre)
        E[i] = SAFETY * accumulated(i)
    if observed is None:
        return LinearRun(X, E)
    held = u_st if contract.stores("iterate") else u_acc  # the format the kernel keeps x_i in
    return LinearRun(X, E, _departures(observed, X, E, held))


def _observed(observed, shape) -> torch.Tensor:
    """The kernel's iterates as returned (NaN and inf allowed: they are findings, not usage errors)."""
    if not isinstance(observed, torch.Tensor) or not observed.is_floating_point():
        raise TypeError(
            f"observed must be a floating tensor of the kernel's iterates, got "
            f"{type(observed).__name__ if not isinstance(observed, torch.Tensor) else observed.dtype}"
        )
    if tuple(observed.shape) != tuple(shape):
        raise ValueError(
            f"observed must have shape (iters + 1, *batch, D) = {tuple(shape)}, got "
            f"{tuple(observed.shape)}"
        )
    return observed.detach().cpu()


def _departures(
    observed: torch.Tensor, X: torch.Tensor, E: torch.Tensor, held_u: float
) -> torch.Tensor:
    """Per step and system, ``||x_obs_i - x_i||`` over ``E_i`` (which ends with the store of x_i
    where the contract stores it), plus the rounding of the observed value to its own dtype where
    that is coarser than the format the kernel keeps the iterate in (unit roundoff ``held_u``);
    inf where the observed value is not finite, 0 where both sides are 0."""
    obs = observed.to(_F64)
    dev = torch.linalg.vector_norm(obs - X, dim=-1)
    tiny = torch.finfo(observed.dtype).tiny
    allowed = torch.nan_to_num(E, nan=math.inf)  # no bound (0 inf in the recursion) is inf
    if unit_roundoff(observed.dtype) > held_u:
        allowed = E + torch.linalg.vector_norm(
            half_spacings(obs, unit_roundoff(observed.dtype), observed.dtype), dim=-1
        )
    ratio = torch.where(dev == 0, torch.zeros_like(dev), dev / allowed.clamp_min(tiny))
    return torch.nan_to_num(ratio, nan=math.inf)


def half_spacings(y: torch.Tensor, u: float, dtype: torch.dtype) -> torch.Tensor:
    """Half a spacing of the format of unit roundoff u (range of ``dtype``) at each entry of y,
    ``u 2^floor(log2 |y_i|)`` (``u 2^e_min`` at zero and below the normal range): a bound on
    ``|v - y_i|`` for any v that rounds to nearest to y_i, and on ``|fl(v) - v|`` for any v that
    rounds to y_i (in that format or a coarser one): fl maps v's binade ``[2^e, 2^(e+1))`` into
    ``[2^e, 2^(e+1)]``, so v's half spacing is at most y_i's. At most ``u |y_i|`` for a normal
    entry (Higham eq. (2.4)). Non-finite entries give inf."""
    a = y.to(_F64).abs()
    finite = torch.isfinite(a)
    tiny = torch.finfo(dtype).tiny
    h = u * torch.exp2(binade(torch.where(finite, a, torch.ones_like(a)).clamp_min(tiny)))
    return torch.where(finite, h, torch.full_like(h, math.inf))


def value_roundoff(x: torch.Tensor) -> float:
    """Roundoff of the values a kernel received: 2^-8 if every entry is a bfloat16, 2^-24 if
    every entry is a float32, else float64's 2^-53 (``linear_bound``'s ``value_u``: a product
    whose operand format is coarser rounds them)."""
    x = x.detach().to(_F64)
    if bool((x.to(torch.bfloat16).to(_F64) == x).all()):
        return 2.0**-8
    if bool((x.to(torch.float32).to(_F64) == x).all()):
        return 2.0**-24
    return 2.0**-53


def binade(y: torch.Tensor) -> torch.Tensor:
    """``floor(log2 y)`` for positive float64 ``y``, exactly: ``torch.log2``'s own rounding
    corrected at the edges of a binade (``2^e <= y < 2^(e+1)``)."""
    e = torch.floor(torch.log2(y))
    return e + (torch.exp2(e + 1) <= y).to(e.dtype) - (torch.exp2(e) > y).to(e.dtype)


def store_error_bound(
    x: torch.Tensor, drift: torch.Tensor, u: float, dtype: torch.dtype
) -> torch.Tensor:
    """A bound on ``||fl(y) - y||_2`` for any ``y`` with ``||y - x|| <= drift``, fl rounding to
    nearest in ``dtype`` (unit roundoff u): x ``(*batch, D)`` the exact pre-store value, drift ``(*batch)``.

    The minimum of two rigorous bounds. (a) ``u ||y|| <= u (||x|| + drift)`` (Higham eq. (2.4)).
    (b) Half a spacing, component by component, with ``d = y - x``. In x_k's binade
    ``[2^e, T_k)``, ``T_k = 2^(e+1)``, the error is at most ``h_k = u 2^e`` (``u 2^e_min`` below the
    normal range), and below the binade less. To leave it upwards, ``|d_k| >= g_k = T_k - |x_k|``;
    in the next binade the error is at most ``2 h_k`` and at most the distance ``|y_k| - T_k <=
    |d_k| - g_k`` to the representable ``T_k``, so it adds ``min(2h_k, |d_k| - g_k)^2 - h_k^2 <=
    3 h_k^2 min(1, d_k^2 / (g_k + 2h_k)^2)`` to the squared error (the ratio of the two is largest at
    ``|d_k| = g_k + 2h_k``). Two binades up, ``|d_k| >= 2T_k - |x_k| > |x_k|``, so the error is at
    most ``u |y_k| < 2u |d_k|``. Summed, with ``sum d_k^2 <= drift^2``:
    ``sum_k err_k^2 <= ||h||^2 + K + 4 u^2 drift^2``, K the fractional knapsack of values ``3 h_k^2``,
    weights ``(g_k + 2h_k)^2``, capacity ``drift^2``. Binades are taken at ``|x_k| + 2^-30 ||x||``,
    which covers the float64 evaluation of the exact trajectory (and only shortens the gaps).
    """
    nx = torch.linalg.vector_norm(x, dim=-1)
    plain = u * (nx + drift)
    if u <= 0:
        return plain
    emin = math.log2(torch.finfo(dtype).tiny)
    ax = x.abs() + 2.0**-30 * nx.unsqueeze(-1)
    ax = ax.clamp_min(2.0**emin)
    e = binade(ax).clamp_min(emin)
    h = u * torch.exp2(e)
    gap = torch.exp2(e + 1) - ax
    jumped = _fractional_knapsack(3 * h**2, (gap + 2 * h) ** 2, drift**2)  # one binade up
    spacing = torch.sqrt((h**2).sum(-1) + jumped + 4 * (u * drift) ** 2)  # two or more up: 2u |d_k|
    return torch.minimum(plain, spacing)


def _fractional_knapsack(
    value: torch.Tensor, weight: torch.Tensor, capacity: torch.Tensor
) -> torch.Tensor:
    """``max sum_k f_k value_k`` over ``0 <= f_k <= 1``, ``sum_k f_k weight_k <= capacity`` (weights
    > 0): an upper bound on any subset's total value within the capacity. Last axis = items."""
    order = torch.argsort(value / weight, dim=-1, descending=True)
    v, w = value.gather(-1, order), weight.gather(-1, order)
    taken = torch.cumsum(w, -1) - w  # weight before each item
    room = (capacity.unsqueeze(-1) - taken).clamp_min(0.0)
    return (v * torch.clamp(room / w, max=1.0)).sum(-1)


def propagated_norm_bound(resp: dict, norms: dict, gain: Optional[dict] = None) -> torch.Tensor:
    """A bound on ``||sum_n T_n w_n||_2`` over all vectors ``w_n`` with ``||w_n|| <= e_n``, where the
    ``T_n`` are diagonal in one orthonormal basis with entries ``t_{n,k}`` (here ``tau_{i,j} m_ch,j``
    on A's eigenvalues, n = (j, channel)).

    resp: per channel ``|t|`` of shape ``(n, *batch, D)``; norms: per channel ``e`` ``(n, *batch)``;
    gain: ``max_k |t|`` if already formed. Returns ``sqrt(S_1 S_2)`` with
    ``S_1 = max_k sum_n |t_{n,k}| e_n`` and ``S_2 = sum_n e_n max_k |t_{n,k}|``: by Cauchy-Schwarz
    with weights e_n, ``(sum_n |t_{n,k}| |w_{n,k}|)^2 <= (sum_n |t_{n,k}| e_n)(sum_n |t_{n,k}| w_{n,k}^2 / e_n)``;
    summed over k, ``<= S_1 sum_n max_k|t_{n,k}| ||w_n||^2 / e_n <= S_1 S_2``. Never above S_2 (the
    sum of per-step maxima) since ``S_1 <= S_2``, and never below the worst case by more than
    ``sqrt(S_2 / S_1)``: all w_n along the eigenvector that attains S_1 reach S_1 exactly.
    """
    s1, s2 = None, None
    for ch, t in resp.items():
        e = norms[ch]
        g = t.amax(-1) if gain is None else gain[ch]
        part1 = (t * e.unsqueeze(-1)).sum(0)
        part2 = (g * e).sum(0)
        s1 = part1 if s1 is None else s1 + part1
        s2 = part2 if s2 is None else s2 + part2
    return torch.sqrt(s1.amax(-1) * s2)


@dataclass
class CGBound:
    """CG's A-norm error to x* allowed for a contract (model: module docstring), per system, both
    parts relative to ``||x*||_A``: ``rate``: ``min(1, 2 R_delta^k)``, the bound on the updated
    residual's ``||r_k||_{A^-1}``; ``attainable``: the bound on the residual gap's
    ``||b - A x_k - r_k||_{A^-1}`` (the attainable accuracy)."""

    rate: torch.Tensor
    attainable: torch.Tensor

    @property
    def relative(self) -> torch.Tensor:
        return self.rate + self.attainable


# The widening of the spectrum in CG's rate, in units of the contract's coarsest roundoff times
# ||A||_2 (module docstring: a model constant, not a theorem's).
CG_WIDTH = 1.0


def _representable(x: torch.Tensor, u: float, dims: int) -> torch.Tensor:
    """Per system (the last ``dims`` axes reduced): every entry of x has a significand of at most
    ``-log2(u)`` bits, i.e. lies in the floating format of unit roundoff u (its range aside)."""
    m, _ = torch.frexp(x)
    t = m / u
    return (t == torch.round(t)).flatten(-dims).all(-1)


def cg_bound(H, *, iters: int, contract, shift=None, q=None, all_steps: bool = False) -> CGBound:
    """The finite-precision convergence bound of CG from x_0 = 0 on ``(H + shift I) x = q``
    (module docstring), relative to ``||x*||_A``.

    ``q`` ``(*batch, D)``: the right-hand side the kernel received; with it the bound uses where
    x* lies in A's spectrum (``sqrt(lam_max) ||x*|| / ||x*||_A`` and
    ``||q|| / (sqrt(lam_min) ||x*||_A)``, each between 1 and sqrt(kappa)); without it, the worst
    case over q (both sqrt(kappa)) and a q that the kernel rounds when it stores r_0.
    ``all_steps=True``: the bound after every step, ``(iters + 1, *batch)``, not only the last."""
    contract = parse(contract)
    H = _matrix("H", H).detach().cpu().to(_F64)
    batch = H.shape[:-2]
    if 0 in batch:
        raise ValueError(f"H has an empty batch {tuple(batch)}")
    iters = _v.count("iters", iters)
    _v.flag("all_steps", all_steps)
    D = H.shape[-1]
    if q is not None:
        q = _float_tensor("q", q, 1).detach().cpu().to(_F64)
        if q.shape[-1] != D:
            raise ValueError(f"q has last dimension {q.shape[-1]} but H is {D}x{D}")
        batch = _v.batch_shape("H and q", batch, q.shape[:-1])
        if 0 in batch:
            raise ValueError(f"H and q have an empty batch {tuple(batch)}")
        q = q.expand(*batch, D)
    H = H.expand(*batch, D, D)
    sh = (
        torch.zeros(batch, dtype=_F64)
        if shift is None
        else _v.parameter("shift", shift, batch, "cpu").clone()
    )
    lam, V = torch.linalg.eigh(H + sh[..., None, None] * torch.eye(D, dtype=_F64))
    l1, ln = lam[..., 0], lam[..., -1]
    spd = l1 > 0
    l1p = torch.where(spd, l1, torch.ones_like(l1))
    sk = torch.where(spd, torch.sqrt(ln / l1p), torch.ones_like(l1))  # sqrt(kappa)
    # where x* lies: a = sqrt(lam_n) ||x*|| / ||x*||_A, b = ||q|| / (sqrt(lam_1) ||x*||_A), in [1, sk]
    if q is None:
        a = b = sk
    else:
        w = ((V.transpose(-1, -2) @ q.unsqueeze(-1)).squeeze(-1)) ** 2
        lp = torch.where(spd.unsqueeze(-1), lam, torch.ones_like(lam))
        s2 = (w / lp).sum(-1)
        ok = spd & (s2 > 0)
        s2 = torch.where(ok, s2, torch.ones_like(s2))
        a = torch.where(ok, torch.sqrt(ln * (w / lp**2).sum(-1) / s2), sk).clamp(1.0, None)
        b = torch.where(ok, torch.sqrt(w.sum(-1) / (l1p * s2)), sk).clamp(1.0, None)
        a, b = torch.minimum(a, sk), torch.minimum(b, sk)

    ua = contract.u_acc
    ux = contract.u_store if contract.stores("iterate") else 0.0
    ur = contract.u_store if contract.stores("residual") else 0.0
    uo = contract.u_operand(contract.u_store if contract.stores("direction") else ua)
    # H as the product uses it: rounded to the operand format where that is coarser, else to the
    # accumulation dtype; a fixed perturbation of H (u_H = 0 if H already lies in that format)
    u_fmt = max(OPERAND_ROUNDOFF[contract.operands], ua)
    uH = torch.where(_representable(H, u_fmt, 2), 0.0, u_fmt).to(_F64)
    # r_0 = q rounded to the accumulation dtype and, if the residual is stored, to its format
    u_q_fmt = max(ua, ur)
    uq = (
        torch.full(batch, u_q_fmt, dtype=_F64)
        if q is None
        else torch.where(_representable(q, u_q_fmt, 1), 0.0, u_q_fmt).to(_F64)
    )
    absH = torch.linalg.eigvalsh(H.abs())[..., -1] * (1 + uH) + sh.abs()  # || |H| + |shift| I ||_2
    g = gamma(D + (0 if shift is None else 1), ua)  # the product's accumulation, Higham (3.11)

    # the rate: Chebyshev on the spectrum widened by delta (Greenbaum 1989; a model)
    u_eff = max(ua, contract.u_store, contract.u_operand(ua))
    delta = CG_WIDTH * u_eff * ln + g * absH + uH * absH
    lo = l1 - delta
    kw = torch.where(lo > 0, (ln + delta) / lo.clamp_min(1e-300), torch.full_like(lo, math.inf))
    R = torch.where(torch.isfinite(kw), (kw.sqrt() - 1) / (kw.sqrt() + 1), torch.ones_like(kw))
    steps = torch.arange(iters + 1, dtype=_F64).reshape(-1, *([1] * len(batch)))
    rho = torch.clamp(2 * R**steps, max=1.0)  # ||r_j||_{A^-1} / ||x*||_A <= rho_j

    # the attainable accuracy: the residual gap's local errors (Greenbaum 1997), each through A^-1/2
    theta = 1.0 + 8 * max(ua, contract.u_store, contract.u_operand(ua))  # ||dx_j||_A <= theta rho_j
    kappa_abs = absH / l1p  # || |H| || / lam_1: the accumulation error's amplification
    F = uq * b  # r_0's rounding: ||A^-1/2 (fl(q) - q)|| <= u_q ||q|| / sqrt(lam_1)
    Fs = [F]
    for j in range(iters):
        P = theta * rho[j]  # ||dx_j||_A / ||x*||_A
        xn = (a + sk * (rho[j + 1] + F)) * (1 + ux + 2 * ua)  # sqrt(lam_n) ||x_{j+1}|| / ||x*||_A
        # x_{j+1} = fl(x_j + fl(alpha p_j)), then stored: ||A^1/2 xi_j|| <= sqrt(lam_n) ||xi_j||.
        # x_j is representable in both formats, so neither the sum nor the store errs by more
        # than the update itself (a lost update): min(u ||x_{j+1}||, ||dx_j||)
        t = ua * sk * P + torch.minimum(ua * xn, (1 + ua) * sk * P)
        if ux > 0:
            t = t + torch.minimum(ux * xn, (1 + 2 * ua) * sk * P + ua * xn)
        # alpha A (fl_op(p) - p): ||A^1/2 alpha delta_p|| <= sqrt(lam_n) u_op ||dx_j||
        t = t + uo * sk * P
        # alpha (accumulation error of H p): ||A^-1/2 e|| <= gamma_D || |H| || ||dx_j|| / sqrt(lam_1)
        t = t + g * (1 + uo) * kappa_abs * P
        # r_{j+1} = fl(r_j - fl(alpha w_j)), then stored: ||A^-1/2 rho_j|| <= ||rho_j|| / sqrt(lam_1),
        # ||alpha w_j|| <= ||A dx_j|| + alpha ||mu_j||, ||A dx_j|| <= sqrt(lam_n) ||dx_j||_A,
        # ||r_{j+1}|| <= sqrt(lam_n) rho_{j+1} ||x*||_A (all over sqrt(lam_1) ||x*||_A)
        aw = sk * P + uo * sk**2 * P + g * (1 + uo) * kappa_abs * P
        rn = sk * rho[j + 1]
        t = t + ua * aw + torch.minimum(ua * (1 + ua) * rn, (1 + ua) * aw)
        if ur > 0:
            t = t + torch.minimum(ur * (1 + ua) * rn, (1 + 2 * ua) * aw + ua * rn)
        F = F + t
        Fs.append(F)
    F = torch.stack(Fs)
    # H's own rounding, a fixed delta_H: sum_j alpha_j delta_H p_j = delta_H x_k (not per step)
    F = F + uH * (absH / torch.sqrt(l1p * ln.clamp_min(1e-300))) * (a + sk * (rho + F))
    # no SPD matrix (lam_min <= 0): no A-norm, no floor -- inf, never a NaN that could read as a pass
    F = torch.where(spd & ~torch.isnan(F), F, torch.full_like(F, math.inf))
    return CGBound(rho, F) if all_steps else CGBound(rho[-1], F[-1])


def as_contract(model) -> Contract:
    """A Contract from a Contract, a preset name (``solvers.contracts.parse``) or a references'
    ``Arith`` (``solvers.contracts.of_reference``)."""
    if isinstance(model, Arith):
        return of_reference(model.dtype, model.mode)
    return parse(model)


def arith_of(contract: Contract) -> Arith:
    """The references' arithmetic whose bounds cover a contract, for bounds written against an
    ``Arith`` (``analysis.bounds.kaczmarz``): bf16 accumulation -> bf16 strict; bf16 storage or
    any operand format coarser than fp32 (bf16, tf32) -> bf16 storage (an operand rounded before
    a product enters as a stored value would, with u <= 2^-8); else float32 / float64."""
    contract = parse(contract)
    if contract.accumulate == torch.bfloat16:
        return Arith(torch.bfloat16, "strict")
    if contract.u_store > 0 or contract.u_operand(2.0**-24) > 0:
        return Arith(torch.bfloat16, "storage")
    return Arith(contract.accumulate)


def fro_error(D: int, contract) -> float:
    """Relative error of ``||H||_F`` computed in the contract's accumulation dtype: a sum of D^2
    squares (gamma_{D^2 + 1}) and a square root (u), halved by the root: a kernel's lambda = a ||H||_F."""
    D = _v.count("D", D, minimum=1)
    u = parse(contract).u_acc
    return 0.5 * gamma(D * D + 1, u) + u


__all__ = [
    "CGBound",
    "CG_WIDTH",
    "LINEAR_METHODS",
    "LinearRun",
    "SAFETY",
    "arith_of",
    "as_contract",
    "binade",
    "cg_bound",
    "fro_error",
    "gamma",
    "half_spacings",
    "linear_bound",
    "propagated_norm_bound",
    "store_error_bound",
    "value_roundoff",
]
