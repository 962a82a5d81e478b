"""Running (a-posteriori) rounding-error bounds for Chebyshev, GD and AGD, from the actual run.

The a-priori allowance ``c kappa (n u_acc + u_store)`` (``analysis.precision``) is a worst case
over all runs and says nothing (>= 1) for bf16 at GKA's own setting (a = 0.02, kappa <= 51).
A *running* error analysis (Wilkinson; Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., Sec. 3.3) instead bounds the rounding of one run from the values that
run computed. docs/precision.md, "Running error bounds (bf16)", has the derivation; in short:

1. **The recurrence.** The three methods are linear stationary-coefficient two-step
   recurrences ``x_i = a_i(H) x_{i-1} + b_i(H) x_{i-2} + c_i q`` (Chebyshev, GKA Alg. 1:
   ``a_i = omega_i (I - step H)``, ``b_i = -(omega_i - 1)``; GD: ``a = I - step H``, ``b = 0``;
   AGD with its y eliminated: ``a = (1 + beta)(I - step H)``, ``b = -beta (I - step H)``), with
   the constants the working solver used (``analysis.references.iterative.working_constants``) and the
   exact weights omega_i of the mpmath replay -- so that, as in ``analysis.references.iterative``,
   the "rounding" compared against is arithmetic rounding only.
2. **Local errors.** Step i applied in exact arithmetic to the *stored* iterates
   ``x_hat_{i-1}, x_hat_{i-2}`` gives ``y_i``; the run stored ``x_hat_i = y_i + delta_i``.
   ``|delta_i|`` is bounded componentwise by following the solver's own expression, operation
   by operation, through the standard model ``fl(a op b) = (a op b)(1 + d)``, ``|d| <= u``
   (:class:`_Bounded`): a dot product of length n adds ``gamma_n(u_acc) |H| |x|`` (Higham
   eq. (3.11), any summation order; strict bf16's left-to-right sums column by column, eq.
   (3.4)), every elementwise operation ``u_acc`` times its result (strict: plus the fp32 double
   rounding, :func:`op_roundoff`), and a bf16 store (storage mode only) ``u_store`` times the
   stored value. The weights omega_hat_i the run used are compared with the exact
   omega_i (computed in mpmath): their difference enters as a known perturbation.
3. **Propagation.** ``d_i = x_hat_i - x_mp_i`` obeys ``d_i = a_i(H) d_{i-1} + b_i(H) d_{i-2} +
   delta_i`` exactly (the recurrence is linear), so ``d_i = sum_{j<=i} P_{i,j}(H) delta_j`` with
   the scalar responses ``tau_{i,j}(lam)``: ``tau_{j,j} = 1``, ``tau_{j-1,j} = 0``, ``tau_{i,j} =
   a_i(lam) tau_{i-1,j} + b_i(lam) tau_{i-2,j}``. H is symmetric, so ``||P_{i,j}(H)||_2 = G_{i,j} =
   max_k |tau_{i,j}(lam_k)|`` over its eigenvalues -- exactly, no interval or grid needed (a max
   over [lam_min, lam_max] would also be rigorous, and never smaller). Hence

       ||x_hat_i - x_mp_i||_2 <= SAFETY * sum_{j<=i} G_{i,j} ||b_j||_2,   |delta_j| <= b_j.

Order of the bound: no O(u^2) term is dropped -- the local bounds keep every product of two
errors (``err_a err_b``, ``u err``) and ``gamma_n = n u / (1 - n u)`` is Higham's exact form,
and the propagation is an identity. What is approximate is only the float64 evaluation of the
bound itself (magnitudes, eigenvalues, the responses): relative ``O(r^2 D u_64)`` at most, far
below ``SAFETY - 1 = 2^-20``. It is therefore rigorous for the model above (round to nearest, no
underflow or overflow), not merely first order.

Tensors: iterates ``(iters + 1, *batch, D)``; bounds ``(iters + 1, *batch)``. :func:`running_bound`
returns the ABSOLUTE 2-norm bound on ``||x_hat_i - x_mp_i||``; :func:`running_check` divides it
by ``||x*||`` (like ``ErrorSplit.rounding`` and the verification table's rounding column) and
also checks every step's implied local error and the bound's recurrence (:class:`RunningCheck`).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional

import mpmath
import torch

from analysis.precision import by_label, gamma
from analysis.references import mp as amp
from analysis.references.iterative import ErrorSplit, working_constants
from solvers import Arith, omega_schedule
from solvers import validation as _v

METHODS = ("chebyshev", "gd", "agd")

# Covers the float64 evaluation of the bound: relative O(r D u_64) for its arithmetic and
# O(r^2 D u_64) for float64 eigenvalues (Markov's inequality bounds tau'): < 2e-8 for r <= 1000,
# D <= 128.
SAFETY = 1.0 + 2.0**-20

_F64 = torch.float64


# ---------------------------------------------------------------- the rounding model


def op_roundoff(arith: Arith) -> float:
    """u of one elementwise operation in the compute dtype. Strict bf16: torch evaluates a bf16
    op in fp32 and rounds the result to bf16 -- exact for products of two bf16 values, but a
    sum may round twice, so ``u_bf16 + u_fp32 (1 + u_bf16)`` (the double-rounding bound)."""
    if arith.strict:
        u32 = 2.0**-24
        return arith.u_acc + u32 * (1.0 + arith.u_acc)
    return arith.u_acc


def store_roundoff(arith: Arith) -> float:
    """u of the store: bf16 storage mode rounds fp32 results to bf16; elsewhere a no-op."""
    return arith.u_store if arith.compute != arith.dtype else 0.0


@dataclass
class _Bounded:
    """A computed quantity c_hat through its exact reference value and an error bound.

    ``val``: the exact-arithmetic value of the same expression evaluated on the stored iterates
    (formed in float64: only its magnitude is used, multiplied by u); ``err``: a componentwise
    bound on ``|c_hat - val|``.
    """

    val: torch.Tensor
    err: torch.Tensor


def _exact(v: torch.Tensor) -> _Bounded:
    return _Bounded(v, torch.zeros_like(v))


class _Model:
    """The rounding of one arithmetic: elementwise ops with u_acc, dot products with
    gamma_n(u_acc), stores with :func:`store_roundoff`."""

    def __init__(self, arith: Arith, H: torch.Tensor):
        self.u = op_roundoff(arith)
        self.u_store = store_roundoff(arith)
        self.H = H
        # |fl(H x) - H x| <= (|H| o W) |x| with column weights W_k: gamma_n for an unknown order
        # (torch's matmul), and for strict bf16's left-to-right sum of rounded products
        # gamma_n for k = 1 and gamma_{n-k+2} for k >= 2 (Higham eq. (3.4)).
        n = H.shape[-1]
        if arith.strict:
            w = [gamma(n if k == 1 else n - k + 2, self.u) for k in range(1, n + 1)]
        else:
            w = [gamma(n, self.u)] * n
        self.absH = H.abs()
        self.weighted = self.absH * torch.tensor(w, dtype=_F64)

    @staticmethod
    def _rounded(val, err, u):
        # fl(z) = z (1 + d): |fl(z) - val| <= |z - val| + u |z| <= err + u (|val| + err)
        return _Bounded(val, err + u * (val.abs() + err))

    def add(self, a: _Bounded, b: _Bounded, sign: float = 1.0) -> _Bounded:
        return self._rounded(a.val + sign * b.val, a.err + b.err, self.u)

    def sub(self, a: _Bounded, b: _Bounded) -> _Bounded:
        return self.add(a, b, -1.0)

    def mul(self, a: _Bounded, b: _Bounded) -> _Bounded:
        err = a.val.abs() * b.err + b.val.abs() * a.err + a.err * b.err
        return self._rounded(a.val * b.val, err, self.u)

    def matvec(self, x: _Bounded) -> _Bounded:
        """fl(H x_hat) with |x_hat - x.val| <= x.err: |H| x.err + gamma_n |H| |x_hat| (Higham (3.11))."""
        mv = lambda A, v: (A @ v.unsqueeze(-1)).squeeze(-1)  # noqa: E731
        return _Bounded(
            mv(self.H, x.val), mv(self.absH, x.err) + mv(self.weighted, x.val.abs() + x.err)
        )

    def store(self, a: _Bounded) -> _Bounded:
        return self._rounded(a.val, a.err, self.u_store)


# ----------------------------------------------------------------- the local errors


def _shifted(iterates: torch.Tensor) -> tuple:
    """(x_hat_{i-1}, x_hat_{i-2}) for i = 1..r, with x_hat_{-1} = 0 (Chebyshev's xi_{-1}; for
    GD/AGD x_0 = 0, so x_{-1} = 0 makes the eliminated AGD recurrence start correctly)."""
    prev = iterates[:-1]
    prev2 = (
        torch.cat([torch.zeros_like(iterates[:1]), iterates[:-2]])
        if iterates.shape[0] > 1
        else prev
    )
    return prev, prev2


def _local_chebyshev(m: _Model, x, xp, q, step, omega: _Bounded) -> _Bounded:
    """xi_i = fl_store(xi - (omega step) g + (omega - 1)(xi - xi_prev)), g = fl(H xi) - q,
    evaluated as solvers/chebyshev.py does: ((xi - t1 g) + t4 (xi - xi_prev))."""
    g = m.sub(m.matvec(_exact(x)), _exact(q))
    t1 = m.mul(omega, _exact(step))
    t3 = m.sub(_exact(x), m.mul(t1, g))
    t4 = m.sub(omega, _exact(torch.ones_like(omega.val)))
    t6 = m.mul(t4, m.sub(_exact(x), _exact(xp)))
    return m.store(m.add(t3, t6))


def _local_gd(m: _Model, x, q, step) -> _Bounded:
    """x_i = fl_store(x - step (fl(H x) - q)), solvers/gradient.py gd."""
    g = m.sub(m.matvec(_exact(x)), _exact(q))
    return m.store(m.sub(_exact(x), m.mul(_exact(step), g)))


def _local_agd(m: _Model, x, xp, q, step, beta) -> _Bounded:
    """y = fl_store(x + beta (x - x_prev)); x_new = fl_store(y - step (fl(H y) - q)),
    solvers/gradient.py agd, against the eliminated recurrence in x alone."""
    y = m.store(m.add(_exact(x), m.mul(_exact(beta), m.sub(_exact(x), _exact(xp)))))
    g = m.sub(m.matvec(y), _exact(q))
    return m.store(m.sub(y, m.mul(_exact(step), g)))


def working_omegas(rho2: torch.Tensor, iters: int, arith: Arith) -> torch.Tensor:
    """omega_hat_0..omega_r as solvers/chebyshev.py computes them (compute dtype), ``(*batch, r+1)``."""
    return omega_schedule(rho2.to(arith.compute), iters).to(_F64)


def exact_omegas(rho2: torch.Tensor, iters: int) -> tuple:
    """The replay's weights omega_0..omega_r (mpmath, from the rounded rho^2) as a double-double
    ``(hi, lo)`` pair of ``(*batch, r+1)`` float64 tensors (``analysis.references.iterative`` replay).
    Typed out in mpmath on purpose, independent of ``solvers.omega_schedule`` (the exact side)."""
    flat = rho2.reshape(-1).tolist()
    table = {}
    with amp.precision():
        for v in set(flat):
            omega, hi, lo = mpmath.mpf(2), [], []
            for i in range(iters + 1):
                if i:
                    omega = 4 / (4 - mpmath.mpf(v) * omega)
                hi.append(float(omega))
                lo.append(float(omega - hi[-1]))
            table[v] = (hi, lo)
    shape = (*rho2.shape, iters + 1)
    hi = torch.tensor([table[v][0] for v in flat], dtype=_F64).reshape(shape)
    lo = torch.tensor([table[v][1] for v in flat], dtype=_F64).reshape(shape)
    return hi, lo


def _batched_constant(v: torch.Tensor, batch) -> torch.Tensor:
    return torch.broadcast_to(v, batch).unsqueeze(-1)


@dataclass
class _Recurrence:
    """Per-step coefficients of x_i = a_i(H) x_{i-1} + b_i(H) x_{i-2} + c_i q, as functions of
    lam: a_i(lam) = a0_i + a1_i lam, b_i(lam) = b0_i + b1_i lam; each ``(r, *batch)``."""

    a0: torch.Tensor
    a1: torch.Tensor
    b0: torch.Tensor
    b1: torch.Tensor
    c: torch.Tensor


def _recurrence(method: str, consts: dict, batch, iters: int, omega=None) -> _Recurrence:
    step = torch.broadcast_to(consts["step"], batch).expand(iters, *batch)
    zero = torch.zeros_like(step)
    if method == "chebyshev":
        w = omega.movedim(-1, 0)[1:]  # omega_i for i = 1..r
        return _Recurrence(w, -w * step, 1.0 - w, zero, w * step)
    if method == "gd":
        return _Recurrence(torch.ones_like(step), -step, zero, zero, step)
    beta = torch.broadcast_to(consts["beta"], batch).expand(iters, *batch)
    return _Recurrence(1.0 + beta, -(1.0 + beta) * step, -beta, beta * step, step)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


@dataclass
class LocalBounds:
    """Componentwise bounds ``|delta_i| <= bound[i]`` ``(r+1, *batch, D)`` of the local errors, and
    the recurrence (exact weights) they are local errors of."""

    bound: torch.Tensor
    recurrence: _Recurrence


def local_bounds(method: str, H, q, iterates, *, L, mu, arith: Arith, omegas=None) -> LocalBounds:
    """Bounds on the local error of every step of a run, from its stored ``iterates``.

    omegas: the weights omega_hat_0..omega_r the run used (``SolveInfo.omegas``); default: the
    solver's own schedule in the compute dtype (:func:`working_omegas`).
    """
    _check_method(method)
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be a solvers.Arith, got {type(arith).__name__}")
    H = _v.square_matrix("H", H)
    if H.shape[-1] == 0:
        raise ValueError(f"H must be at least 1x1, got shape {tuple(H.shape)}")
    q = _v.tensor("q", q, min_ndim=1)
    if q.shape[-1] != H.shape[-1]:
        raise ValueError(f"q has last dimension {q.shape[-1]} but H is {H.shape[-2]}x{H.shape[-1]}")
    for name, x in (("L", L), ("mu", mu)):
        if isinstance(x, bool) or not isinstance(x, (numbers.Real, torch.Tensor)):
            raise TypeError(f"{name} must be a float or a tensor, got {type(x).__name__}")
        if isinstance(x, torch.Tensor) and not x.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
    if (
        not isinstance(iterates, torch.Tensor)
        or not iterates.is_floating_point()
        or iterates.ndim < 2
        or iterates.shape[-1] != H.shape[-1]
    ):
        raise ValueError(
            f"iterates must be (iters + 1, *batch, D) with D = {H.shape[-1]}, "
            f"got {tuple(getattr(iterates, 'shape', ()))}"
        )
    H64, q64, its = H.to(_F64), q.to(_F64), iterates.to(_F64)
    iters = its.shape[0] - 1
    batch = its.shape[1:-1]
    H64 = H64.expand(*batch, *H64.shape[-2:])
    q64 = q64.expand(*batch, q64.shape[-1])
    _v.batch_shape("H, q and iterates", H.shape[:-2], q.shape[:-1], batch)
    Lb = _v.parameter("L", L, batch, "cpu")
    mb = _v.parameter("mu", mu, batch, "cpu")
    _v.spectrum_bounds(Lb, mb)
    consts = working_constants(method, Lb, mb, arith)
    m = _Model(arith, H64)
    step = _batched_constant(consts["step"], batch)
    x, xp = _shifted(its)
    omega_exact = None
    if method == "chebyshev":
        what = working_omegas(consts["rho2"], iters, arith) if omegas is None else omegas.to(_F64)
        hi, lo = exact_omegas(consts["rho2"], iters)
        omega_exact = hi
        # omega_hat - hi is exact (Sterbenz: both in [1, 2]); lo corrects to ~32 digits
        w = _Bounded(
            hi.movedim(-1, 0)[1:].unsqueeze(-1),
            ((what - hi) - lo).abs().movedim(-1, 0)[1:].unsqueeze(-1),
        )
        first = m.store(m.mul(_exact(step), _exact(q64))).err.unsqueeze(
            0
        )  # xi_0 = fl_store(step q)
        rest = _local_chebyshev(m, x, xp, q64, step, w).err
    else:
        first = torch.zeros_like(its[:1])  # x_0 = 0 exactly
        rest = (
            _local_gd(m, x, q64, step)
            if method == "gd"
            else _local_agd(m, x, xp, q64, step, _batched_constant(consts["beta"], batch))
        ).err
    bound = torch.cat([first, rest])
    return LocalBounds(bound, _recurrence(method, consts, batch, iters, omega_exact))


def propagation(rec: _Recurrence, eigenvalues: torch.Tensor) -> torch.Tensor:
    """``G[i, j] = max_k |tau_{i,j}(lam_k)|`` = ``||P_{i,j}(H)||_2``, ``(r+1, r+1, *batch)``, 0 for j > i.

    eigenvalues: ``(*batch, D)`` of the stored (symmetric) H.
    """
    r = rec.a0.shape[0]
    lam = eigenvalues.to(_F64)
    G = torch.zeros((r + 1, r + 1, *lam.shape[:-1]), dtype=_F64)
    # responses of every source j at once: cur = tau_{i, j}, prev = tau_{i-1, j}, shape (r+1, *batch, D)
    cur = torch.zeros((r + 1, *lam.shape), dtype=_F64)
    prev = torch.zeros_like(cur)
    cur[0] = 1.0
    G[0, 0] = 1.0
    for i in range(1, r + 1):
        ai = rec.a0[i - 1].unsqueeze(-1) + rec.a1[i - 1].unsqueeze(-1) * lam
        bi = rec.b0[i - 1].unsqueeze(-1) + rec.b1[i - 1].unsqueeze(-1) * lam
        cur, prev = ai * cur + bi * prev, cur
        cur[i] = 1.0  # the error committed at step i itself
        G[i, : i + 1] = cur[: i + 1].abs().amax(dim=-1)
    return G


def _bound_from(local: LocalBounds, eigenvalues) -> torch.Tensor:
    G = propagation(local.recurrence, eigenvalues)
    norms = torch.linalg.vector_norm(local.bound, dim=-1)  # (r+1, *batch)
    return SAFETY * torch.einsum("ij...,j...->i...", G, norms)


def running_bound(
    method: str, H, q, info, *, L, mu, arith: Arith, eigenvalues=None
) -> torch.Tensor:
    """ABSOLUTE bound ``(iters + 1, *batch)`` on ``||x_hat_i - x_mp_i||_2`` for every iterate of a run.

    info: the run's :class:`solvers.solve_info.SolveInfo` (anything with ``iterates`` and, for
    Chebyshev, optionally ``omegas``: the weights the run used); eigenvalues: of the stored H,
    default float64 ``eigvalsh`` (accurate to ~D u_64 ||H||, which moves G by a relative
    ~r^2 D u_64: inside SAFETY).
    """
    its = info.iterates
    omegas = getattr(info, "extras", {}).get("omegas") if method == "chebyshev" else None
    local = local_bounds(method, H, q, its, L=L, mu=mu, arith=arith, omegas=omegas)
    if eigenvalues is None:
        batch = its.shape[1:-1]
        eigenvalues = torch.linalg.eigvalsh(H.to(_F64).expand(*batch, *H.shape[-2:]))
    return _bound_from(local, eigenvalues)


def _apply(rec: _Recurrence, H64: torch.Tensor, x: torch.Tensor) -> tuple:
    """``(a_i(H) x_{i-1} + b_i(H) x_{i-2}, its magnitude |a_i||x_{i-1}| + |b_i||x_{i-2}|)`` for i = 1..r."""
    xp, xpp = _shifted(x)
    mv = lambda A, v: (A @ v.unsqueeze(-1)).squeeze(-1)  # noqa: E731
    co = lambda c: c.unsqueeze(-1)  # noqa: E731
    val = co(rec.a0) * xp + co(rec.a1) * mv(H64, xp) + co(rec.b0) * xpp + co(rec.b1) * mv(H64, xpp)
    absH = H64.abs()
    mag = (
        co(rec.a0).abs() * xp.abs()
        + co(rec.a1).abs() * mv(absH, xp.abs())
        + co(rec.b0).abs() * xpp.abs()
        + co(rec.b1).abs() * mv(absH, xpp.abs())
    )
    return val, mag


@dataclass
class RunningCheck:
    """A run held to its running bound, at every iterate / step (each ratio <= 1 passes).

    bound: ``(r+1, *batch)`` :func:`running_bound` relative to ``||x*||`` (compare with
        ``ErrorSplit.rounding``); rounding_ratio: rounding / bound.
    local_ratio: per step, ``max_k |delta_i|_k / b_i,k``: the local error the measured rounding
        implies, ``delta_i = d_i - a_i(H) d_{i-1} - b_i(H) d_{i-2}`` (``d_i = x_hat_i - x_mp_i``,
        double-double accurate), against its componentwise bound -- the running bound step by
        step, which catches an extra rounding per step that the summed bound absorbs.
    recurrence_ratio: per step, the residual of the mpmath replay in the bound's recurrence
        ``x_mp_i - a_i x_mp_{i-1} - b_i x_mp_{i-2} - c_i q`` against its float64 evaluation error
        ``4 gamma_{D+6}(u_64)`` times the terms' magnitudes: > 1 means the bound propagates
        errors through a recurrence the replay does not run (an inconsistent bound).
    """

    bound: torch.Tensor
    rounding_ratio: torch.Tensor
    local_ratio: torch.Tensor
    recurrence_ratio: torch.Tensor

    @property
    def worst(self) -> dict:
        return {
            k: float(getattr(self, k).max()) if getattr(self, k).numel() else 0.0
            for k in ("rounding_ratio", "local_ratio", "recurrence_ratio")
        }

    @property
    def passes(self) -> bool:
        return all(v <= 1.0 for v in self.worst.values())


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den with 0/0 = 0 (nothing committed, nothing allowed) and NaN -> inf (a failure)."""
    r = torch.where(num == 0, torch.zeros_like(num), num / den)
    return torch.nan_to_num(r, nan=float("inf"))


def running_check(
    split: ErrorSplit, H, q, *, L, mu, omegas=None, local: Optional[LocalBounds] = None
) -> RunningCheck:
    """Hold the run in ``split`` (its ``H``, ``q`` as stored) to its running bound at every iterate.

    local: precomputed :func:`local_bounds` (e.g. built on a deliberately wrong recurrence).
    The run must store, and report, the iterates its recurrence runs on (a kernel that keeps
    fp32 iterates for bf16 data is a float32 run on bf16-valued inputs: split it with ``H.float()``).
    """
    arith = by_label(split.precision)
    used = working_constants(split.method, L, mu, arith)
    if any(
        not torch.equal(
            torch.broadcast_to(v, split.replay.constants[k].shape), split.replay.constants[k]
        )
        for k, v in used.items()
    ):
        raise ValueError(
            "split: the running bound is of arithmetic rounding against a replay with the working "
            "constants (ground_truth constants='working'); this replay used other constants"
        )
    if local is None:
        local = local_bounds(
            split.method, H, q, split.iterates, L=L, mu=mu, arith=arith, omegas=omegas
        )
    bound = _bound_from(local, split.exact.eigenvalues) / split.exact.x.norm()
    batch = split.iterates.shape[1:-1]
    H64 = H.to(_F64).expand(*batch, *H.shape[-2:])
    q64 = q.to(_F64).expand(*batch, q.shape[-1])
    d = split.replay.iterates.difference(split.iterates)
    pred, _ = _apply(local.recurrence, H64, d)
    delta = torch.cat([d[:1], d[1:] - pred]).abs()
    local_ratio = _ratio(delta, local.bound).amax(dim=-1)
    x_mp = split.replay.iterates.hi
    pred, mag = _apply(local.recurrence, H64, x_mp)
    cq = local.recurrence.c.unsqueeze(-1) * q64
    residual = (x_mp[1:] - pred - cq).abs()
    tol = 4.0 * gamma(H.shape[-1] + 6, 2.0**-53) * (x_mp[1:].abs() + mag + cq.abs())
    rec_ratio = torch.cat([torch.zeros_like(local_ratio[:1]), _ratio(residual, tol).amax(dim=-1)])
    return RunningCheck(bound, _ratio(split.rounding, bound), local_ratio, rec_ratio)


__all__ = [
    "LocalBounds",
    "METHODS",
    "RunningCheck",
    "SAFETY",
    "exact_omegas",
    "local_bounds",
    "op_roundoff",
    "propagation",
    "running_bound",
    "running_check",
    "store_roundoff",
    "working_omegas",
]
