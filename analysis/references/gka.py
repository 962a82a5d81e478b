"""mpmath ground truth for the GKA layer and the rounding bounds its checks are held to.

Ground truth (``docs/precision.md``): the layer's inputs *as stored* (q, k, v, g, beta in the
working dtype) are converted exactly to mpmath, and the recurrence (CH) with appendix eq. (55)
is run at ``dps`` digits: exact ``H_t, U_t, ||H_t||_F, lambda_t``, ``x*_t`` by Cholesky and
``y*_t = U_t x*_t``. For the Chebyshev and CG variants the same iteration is replayed in
mpmath on the exact ``H_t + lambda_t I`` with the exact ``L = ||H_t||_F + lambda_t``,
``mu = lambda_t``, so the error of the working-precision output splits into

    truncation_t = ||y_mp_t - y*_t|| / s_t,   rounding_t = ||y_hat_t - y_mp_t|| / s_t,
    s_t = ||U_t||_F ||x*_t||  (the output's natural scale: ||y*_t|| can cancel, s_t cannot)

and the truncation is held to ``||x_mp - x*|| / ||x*||``'s a-priori bound, since
``||y_mp - y*|| <= ||U_t||_2 ||x_mp - x*||``.

Bounds (first order, componentwise; the constant ``C_SECOND = 2`` covers the second-order
terms: every count below satisfies ``m u <= 1/2`` where it is used, and then
``gamma_m = m u / (1 - m u) <= 2 m u``, Higham, Lemma 3.1):

* a stored state ``H_t`` of the per-token recurrence carries a componentwise error
  ``<= t (6 u_acc + u_store) |H|_t`` with ``|H|_t = sum_j M_{j,t} beta_j |k_j| |k_j|^T``
  (per token: exp of the gate (2 u), the decay multiply, beta k, the outer product and the
  add (u each), the store (u_store));
* ``||H||_F`` from its D^2 entries: ``(D^2 + 3)/2 u_acc`` relative (sum of squares
  ``gamma_{D^2}``, halved by the square root, plus its rounding);
* the chunkwise eq. (5): see :func:`chunk_frobenius_bound`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import mpmath
import torch

from analysis.precision import rounding_allowance
from solvers import Arith
from solvers import validation as _v
from solvers.gka import SOLVERS, validate_inputs
from solvers.gka_chunk import chunkwise_frobenius

from . import iterative as gt
from . import mp as amp

C_SECOND = 2.0


def _vec(t: torch.Tensor):
    return amp.to_mp(t.reshape(-1))


def _fro(m) -> mpmath.mpf:
    return mpmath.sqrt(mpmath.fsum(m[i, j] ** 2 for i in range(m.rows) for j in range(m.cols)))


def _outer(a, b):
    out = mpmath.matrix(a.rows, b.rows)
    for i in range(a.rows):
        for j in range(b.rows):
            out[i, j] = a[i] * b[j]
    return out


def _replay(solver: str, A, q, L, mu, iters: int):
    """The working solver's iteration replayed in mpmath on the exact system (the replays of
    ``analysis.references.iterative``, fed the exact L and mu of this token rather than float64 ones)."""
    rows = [[A[i, j] for j in range(A.cols)] for i in range(A.rows)]
    qs = [q[i] for i in range(q.rows)]
    return mpmath.matrix(
        gt.mp_iterates(solver, rows, qs, iters, gt.exact_constants(solver, L, mu))[-1]
    )


def ridge_kappa(a: float) -> mpmath.mpf:
    """``(a + 1)/a`` (GKA eq. (4)) exactly for the float a, as an mpf: the Chebyshev bound
    amplifies a rounded kappa by ~(r + 1) and is attained, so it is fed the exact value."""
    a = _v.ridge_strength(a)  # a = 0 divided by zero, a < 0 gave a kappa < 1
    with amp.precision(30):
        return 1 + 1 / mpmath.mpf(float(a))


def truncation_bound(solver: str, kappa, iters: Optional[int]) -> float:
    """A-priori ``||x_r - x*|| / ||x*||``: Chebyshev ``1/T_{r+1}(1/rho)`` (rho = (k-1)/(k+1));
    CG ``2 sqrt(kappa) R_a^r`` (A-norm bound moved to the 2-norm); 0 for the exact solve."""
    _solver_iters(solver, iters)
    if solver == "exact":
        return 0.0
    # kappa < 1 gave a negative CG bound, NaN a NaN one and inf a Chebyshev bound of 0
    if isinstance(kappa, bool) or not isinstance(kappa, (numbers.Real, mpmath.mpf)):
        raise TypeError(f"kappa must be a real number, got {type(kappa).__name__}")
    if not 1 <= kappa < math.inf:
        raise ValueError(f"kappa must be a finite real >= 1, got {kappa}")
    with amp.precision(
        30
    ):  # the Chebyshev bound is attained (an eigenvalue at L): evaluate it accurately
        k = mpmath.mpf(kappa)
        if solver == "chebyshev":
            rho = (k - 1) / (k + 1)
            return float(1 / mpmath.cosh((iters + 1) * mpmath.acosh(1 / rho))) if rho > 0 else 0.0
        ra = (mpmath.sqrt(k) - 1) / (mpmath.sqrt(k) + 1)
        return float(2 * mpmath.sqrt(k) * ra**iters)


def _solver_iters(solver, iters) -> None:
    """``solver`` one of the layer's; ``iters`` an int >= 0 for chebyshev / cg (else unused)."""
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if solver != "exact":
        if iters is None:
            raise TypeError(f"solver={solver!r} needs iters (the number of iterations r)")
        _v.count("iters", iters)  # -1 silently replayed no iteration


def _tokens(name: str, x, T: int, width) -> None:
    """``x`` of shape ``(T, width)`` (width None: any): a shorter one raised IndexError from
    deep inside, a longer one was read only in part. Non-finite values measure as such."""
    x = _v.floating(name, x, min_ndim=2, finite_values=False)
    if x.ndim != 2 or x.shape[0] != T or (width is not None and x.shape[1] != width):
        want = f"({T}, {'*' if width is None else width})"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")


@dataclass
class LayerTruth:
    """Exact (mpmath) quantities of one sequence, per token t, as float64 summaries plus mp values.

    y_star, y_mp: lists of mp column vectors (y_mp is None for the exact solve);
    fro, scale (``||U_t||_F ||x*_t||``), kappa (of ``H_t + lambda_t I``), A_norm2, H_abs_fro
    (``|| |H|_t ||_F``), U_abs_fro, U_fro, x_norm: float64 tensors ``(T,)``; A: mp matrices.
    """

    y_star: list
    y_mp: Optional[list]
    x_star: list
    A: list
    fro: torch.Tensor
    scale: torch.Tensor
    kappa: torch.Tensor
    A_norm2: torch.Tensor
    H_abs_fro: torch.Tensor
    U_abs_fro: torch.Tensor
    U_fro: torch.Tensor
    dps: int = amp.DPS

    def split(self, y_hat: torch.Tensor) -> dict:
        """Per-token ``forward`` (``||y_hat - y*|| / ||y*||``), ``truncation``, ``rounding``
        (both over ``s_t``) as float64 tensors ``(T,)``; ``y_hat (T, Dv)``."""
        _tokens("y_hat", y_hat, len(self.y_star), self.y_star[0].rows if self.y_star else None)
        fw, tr, ro = [], [], []
        with amp.precision(self.dps):  # mpmath rounds every operation to the current precision
            self._split(y_hat, fw, tr, ro)
        as_t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        return {"forward": as_t(fw), "truncation": as_t(tr), "rounding": as_t(ro)}

    def _split(self, y_hat, fw, tr, ro):
        for t in range(len(self.y_star)):
            yh = _vec(y_hat[t])
            ys = self.y_star[t]
            ym = self.y_mp[t] if self.y_mp is not None else ys
            s = mpmath.mpf(float(self.scale[t]))
            fw.append(float(amp.norm(yh - ys) / amp.norm(ys)))
            tr.append(float(amp.norm(ym - ys) / s))
            ro.append(float(amp.norm(yh - ym) / s))

    def backward_errors(self, x_hat: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Per token ``||q - A x_hat|| / (||A||_2 ||x_hat|| + ||q||)`` with the exact A_t."""
        D = self.A[0].rows if self.A else None
        _tokens("x_hat", x_hat, len(self.A), D)
        _tokens("q", q, len(self.A), D)
        out = []
        with amp.precision(self.dps):
            for t, A in enumerate(self.A):
                xh, qt = _vec(x_hat[t]), _vec(q[t])
                r = amp.norm(qt - A * xh)
                out.append(
                    float(r / (mpmath.mpf(float(self.A_norm2[t])) * amp.norm(xh) + amp.norm(qt)))
                )
        return torch.tensor(out, dtype=torch.float64)


def layer_truth(
    q,
    k,
    v,
    *,
    a: float,
    g=None,
    beta=None,
    solver: str = "exact",
    iters: Optional[int] = None,
    dps: int = amp.DPS,
) -> LayerTruth:
    """Ground truth of ``solvers.gka_layer`` for one sequence: q, k ``(T, D)``, v ``(T, Dv)``,
    g, beta ``(T,)`` as stored (one working dtype, as the layer takes them; converted exactly)."""
    # The layer's own checks (a > 0, finite inputs, matching T and D, g <= 0, beta >= 0): a
    # mismatch raised IndexError / an mpmath error, or a longer k, v, g, beta was read in part.
    inp = validate_inputs(q, k, v, g, beta, a)
    if q.ndim != 2 or inp.batch != torch.Size([]):
        raise ValueError(
            "layer_truth takes one sequence: q, k (T, D), v (T, Dv), g, beta (T,); got "
            f"q of shape {tuple(q.shape)}, batch {tuple(inp.batch)}"
        )
    _solver_iters(solver, iters)
    dps = _v.count("dps", dps, minimum=1)
    T, D = q.shape
    Dv = v.shape[-1]
    out = {
        n: []
        for n in (
            "y_star",
            "y_mp",
            "x_star",
            "A",
            "fro",
            "scale",
            "kappa",
            "A_norm2",
            "H_abs_fro",
            "U_abs_fro",
            "U_fro",
        )
    }
    with amp.precision(dps):
        H = mpmath.matrix(D, D)
        U = mpmath.matrix(Dv, D)
        Habs = mpmath.matrix(D, D)
        Uabs = mpmath.matrix(Dv, D)
        am = mpmath.mpf(float(a))
        for t in range(T):
            kt, vt, qt = _vec(k[t]), _vec(v[t]), _vec(q[t])
            gam = mpmath.exp(mpmath.mpf(float(g[t]))) if g is not None else mpmath.mpf(1)
            bet = mpmath.mpf(float(beta[t])) if beta is not None else mpmath.mpf(1)
            H = gam * H + bet * _outer(kt, kt)
            U = gam * U + bet * _outer(vt, kt)
            ak, av = kt.apply(abs), vt.apply(abs)
            Habs = gam * Habs + bet * _outer(ak, ak)
            Uabs = gam * Uabs + bet * _outer(av, ak)
            fro = _fro(H)
            if fro == 0:  # the layer's error (solvers.gka.check_frobenius), not mpmath's
                raise ValueError(
                    f"H_t = 0 at token t = {t + 1} (keys k / input gate beta vanish with no "
                    "earlier state): lambda_t = 0 and H_t + lambda_t I is singular"
                )
            lam = am * fro
            A = H + lam * mpmath.eye(D)
            x = amp.solve_spd(A, qt)
            y = U * x
            if solver != "exact":
                out["y_mp"].append(U * _replay(solver, A, qt, fro + lam, lam, iters))
            ev = mpmath.eigsy(A, eigvals_only=True)
            lo, hi = min(ev), max(ev)
            out["y_star"].append(y)
            out["x_star"].append(x)
            out["A"].append(A)
            out["fro"].append(float(fro))
            out["scale"].append(float(_fro(U) * amp.norm(x)))
            out["kappa"].append(float(hi / lo))
            out["A_norm2"].append(float(hi))
            out["H_abs_fro"].append(float(_fro(Habs)))
            out["U_abs_fro"].append(float(_fro(Uabs)))
            out["U_fro"].append(float(_fro(U)))
    f64 = lambda n: torch.tensor(out[n], dtype=torch.float64)  # noqa: E731
    return LayerTruth(
        y_star=out["y_star"],
        y_mp=out["y_mp"] if solver != "exact" else None,
        x_star=out["x_star"],
        A=out["A"],
        fro=f64("fro"),
        scale=f64("scale"),
        kappa=f64("kappa"),
        A_norm2=f64("A_norm2"),
        H_abs_fro=f64("H_abs_fro"),
        U_abs_fro=f64("U_abs_fro"),
        U_fro=f64("U_fro"),
        dps=dps,
    )


def _dims(D, arith) -> int:
    """The bounds' D (an int >= 1) and arith (a solvers.Arith)."""
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be a solvers.Arith, got {type(arith).__name__}")
    return _v.count("D", D, minimum=1)


def state_eps(t, arith: Arith):
    """Componentwise relative error of a stored state after t per-token updates (first order)."""
    return t * (6.0 * arith.u_acc + arith.u_store)


def layer_rounding_bound(truth: LayerTruth, D: int, a: float, arith: Arith) -> torch.Tensor:
    """Per-token bound on ``rounding_t = ||y_hat_t - y_mp_t|| / (||U_t||_F ||x*_t||)``:

        C_SECOND [e_U + kappa_t dA_t / ||A_t||_2 + (D + 1) u_acc + u_store]
          + rounding_allowance(kappa_t, D, arith)

    * ``e_U = state_eps(t) || |U|_t ||_F / ||U_t||_F``: the stored U_t;
    * ``dA_t = state_eps(t) || |H|_t ||_F (1 + a sqrt(D)) + (D^2 + 3)/2 u_acc a ||H_t||_F sqrt(D)
      + u_store ||A_t||_F``: the stored H_t, the computed lambda_t, the store of
      ``A_t = H_t + lambda_t I`` -- a perturbation of the system moves x by kappa dA / ||A||_2;
    * ``(D + 1) u_acc + u_store``: the product ``U_t x_t`` and its store;
    * the solve's own rounding: the precision model's allowance (``analysis.precision``).

    Changing L, mu by a relative delta moves a Chebyshev iterate by ~ (r+1)^2 delta times its
    truncation error (Markov's inequality for T_{r+1}'), far below these terms. The bound is
    a worst case: it grows like ``t kappa u_store``, so in bf16 it exceeds 1 (says nothing)
    after a few tokens even though measured errors stay near 1e-3 (docs/gka_layer.md).
    """
    D, a = _dims(D, arith), _v.ridge_strength(a)
    if truth.A and truth.A[0].rows != D:  # another D silently gave another (smaller) bound
        raise ValueError(f"D = {D} but truth is of a layer with D = {truth.A[0].rows}")
    T = truth.fro.shape[0]
    t = torch.arange(1, T + 1, dtype=torch.float64)
    eps = state_eps(t, arith)
    u, s = arith.u_acc, arith.u_store
    root = math.sqrt(D)
    # ||A_t||_F <= ||H_t||_F + lambda_t sqrt(D) bounds the store of A_t.
    dA = (
        eps * truth.H_abs_fro * (1 + a * root)
        + (D * D + 3) / 2 * u * a * truth.fro * root
        + s * truth.fro * (1 + a * root)
    )
    e_U = eps * truth.U_abs_fro / truth.U_fro
    solve = torch.tensor(
        [rounding_allowance(float(k), D, arith) for k in truth.kappa], dtype=torch.float64
    )
    return C_SECOND * (e_U + truth.kappa * dA / truth.A_norm2 + (D + 1) * u + s) + solve


def naive_frobenius_bound(
    H_abs_fro: torch.Tensor, fro: torch.Tensor, D: int, arith: Arith
) -> torch.Tensor:
    """Bound on ``|fro_hat_t - ||H_t||_F|`` for the per-token recurrence (``solvers.gka``):
    ``C_SECOND [state_eps(t) || |H|_t ||_F + (D^2 + 3)/2 u_acc ||H_t||_F]`` (module docstring)."""
    D = _dims(D, arith)
    t = torch.arange(1, fro.shape[-1] + 1, dtype=torch.float64)
    return C_SECOND * (state_eps(t, arith) * H_abs_fro + (D * D + 3) / 2 * arith.u_acc * fro)


def chunk_frobenius_bound(
    H_abs_fro: torch.Tensor,
    fro: torch.Tensor,
    log_decay_mass: float,
    D: int,
    chunk_size: int,
    arith: Arith,
) -> torch.Tensor:
    """Bound on ``|fro_hat_t - ||H_t||_F|`` for the chunkwise eq. (5) (``solvers.gka_chunk``).

    With ``F = ||H||_F^2`` and ``F_abs = || |H| ||_F^2`` (all three terms of eq. (5) are sums of
    products whose absolute versions add up to F_abs), first order:

        |F_hat - F| <= [m u + 2 eps_M + 2 n eps_chunk] F_abs,   |fro_hat - fro| <= |F_hat - F| / fro + u fro

    * ``m = max(D^2 + 3, 2D + 2C + 5) + 2``: the longest rounding path through a term
      (third term: Gram entry gamma_D, its square, beta_i beta_j, W M over C terms, times M,
      the column sum over C terms; first: ||H_0||^2 over D^2 entries) and the two adds;
    * ``eps_M = (2C + 1) Lambda u + 2 u``: a mask entry exp(G_c - G_j) from cumulative sums
      ``G`` in error by ``gamma_C |G|`` (``Lambda = log_decay_mass``, the largest ``sum |g_i|``
      over one chunk), the difference and the exp;
    * ``eps_chunk = (C + 5) u + eps_M + u_store``: one chunk-state update (the matmul over C
      keys, the decay, the store); the n-th chunk starts from a state after n - 1 of them.
    """
    # chunk_size 0 gave NaN / inf, a negative one or a negative log_decay_mass a smaller bound
    D, chunk_size = _dims(D, arith), _v.count("chunk_size", chunk_size, minimum=1)
    log_decay_mass = _v.tolerance("log_decay_mass", log_decay_mass)
    u, s = arith.u_acc, arith.u_store
    T = fro.shape[-1]
    C = chunk_size
    n = torch.arange(T, dtype=torch.float64) // C  # chunk-state updates before this token's chunk
    eps_M = (2 * C + 1) * float(log_decay_mass) * u + 2 * u
    m = max(D * D + 3, 2 * D + 2 * C + 5) + 2
    eps_chunk = (C + 5) * u + eps_M + s
    dF = C_SECOND * (m * u + 2 * eps_M + 2 * n * eps_chunk) * H_abs_fro**2
    return dF / fro + u * fro


def abs_state_fro(k: torch.Tensor, g=None, beta=None) -> torch.Tensor:
    """``|| |H|_t ||_F`` with ``|H|_t = sum_j M_{j,t} beta_j |k_j| |k_j|^T``, in float64 (a bound
    ingredient, not a measurement), for k ``(..., T, D)``."""
    k = _v.floating("k", k, min_ndim=2)  # a 1-D k raised IndexError
    k64 = k.detach().to(torch.float64).abs()
    g64 = None if g is None else g.detach().to(torch.float64)
    b64 = None if beta is None else beta.detach().to(torch.float64)
    return chunkwise_frobenius(k64, g=g64, beta=b64, chunk_size=max(1, k.shape[-2]))


def log_decay_mass(g, chunk_size: int) -> float:
    """The largest ``sum |g_i|`` over one chunk (0 without gates)."""
    chunk_size = _v.count("chunk_size", chunk_size, minimum=1)  # 0 raised range()'s error
    if g is not None:
        g = _v.floating("g", g)  # a NaN gate gave a NaN mass
    if g is None or g.shape[-1] == 0:
        return 0.0
    a = g.detach().to(torch.float64).abs()
    T = a.shape[-1]
    return max(float(a[..., s : s + chunk_size].sum(-1).max()) for s in range(0, T, chunk_size))
