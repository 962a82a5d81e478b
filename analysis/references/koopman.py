"""mpmath ground truth for Spectral Koopman Attention (Echo section 3.2, Appendix F).

One system at a time: the stored inputs (keys z, values v, queries zq) are converted exactly
(``analysis.references.mp.to_mp``) and the whole pipeline is replayed at ``DPS`` digits, twice:

* ``y_power``: the same algorithm as ``solvers.koopman_readout`` (6-step power iteration from
  the same start vector) in exact-ish arithmetic: ``||y_hat - y_power||`` is the **rounding**;
* ``y_exact``: with the exact ``sigma_max`` in eq. (12): ``||y_power - y_exact||`` is the
  **truncation** of the power iteration. It is exactly
  ``|(max(1, sigma_max) / max(1, sigma_power))^K - 1| ||y_exact||``, since the normalisation
  scales the output by ``(gamma / max(1, sigma))^K``.

Bounds provided here (each a function, named where tests assert it):

* :func:`power_ratio_bound`: ``sigma_max / sigma_power <= sqrt(1 + tan^2 theta_0 (s2/s1)^{4k})``
  for k steps of ``v <- A^T A v`` (the Rayleigh quotient argument for the symmetric A^T A);
* :func:`statistics_bound`: every entry of a computed statistic is within
  ``theta |sum|`` of the exact one, ``|sum|`` the sum of the absolute values of its terms
  (:func:`absolute_statistics`), recursive summation (Higham Lemma 3.1 / eq. (4.4));
* :func:`readout_scale`: ``S = |eta| gamma^K ||V||_2 ||z^q|| / sqrt(lambda_min(G~))``, an a-priori
  bound on ``||y||`` because ``||A_w|| <= 1`` and ``||C_v L^{-T}|| <= ||V||`` (docs/koopman.md);
  rounding is measured relative to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mpmath
import torch

from analysis.precision import gamma, rounding_product
from solvers import Arith
from solvers import validation as _v

from .mp import DPS, precision, to_mp

SCALE_FLOOR = 1e-6


@dataclass
class MpStatistics:
    """Exact statistics of one sequence: mpmath matrices G (with eps I), M, Cv and the scale m."""

    G: mpmath.matrix
    M: mpmath.matrix
    Cv: mpmath.matrix
    m: mpmath.mpf
    eps: mpmath.mpf


def statistics(
    z: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    eps: float = 1e-3,
    scale=None,
) -> MpStatistics:
    """Eqs. (4)-(6) / (53) for ``z (T, r)``, ``v (T, P)`` exactly; ``scale`` None = sequence max."""
    _sequence(z, v, mask)
    eps = _v.real("eps", eps, low=0.0)  # eps < 0 made G~ indefinite, NaN all of it NaN
    if scale is not None:
        scale = _v.real("scale", scale, low=0.0, low_open=True)  # 0 divided by zero
    T, r = z.shape
    P = v.shape[-1]
    Z, Vm = to_mp(z.to(torch.float64)), to_mp(v.to(torch.float64))
    w = [True] * T if mask is None else [bool(x) for x in mask.tolist()]
    if scale is None:
        m = max(
            [mpmath.sqrt(mpmath.fsum(Z[t, i] ** 2 for i in range(r))) for t in range(T)]
            + [mpmath.mpf(SCALE_FLOOR)]
        )
    else:
        m = mpmath.mpf(float(scale))
    Zh = Z / m
    G = mpmath.eye(r) * mpmath.mpf(eps)
    M = mpmath.zeros(r, r)
    Cv = mpmath.zeros(P, r)
    for t in range(T):
        if not w[t]:
            continue
        for i in range(r):
            for j in range(r):
                G[i, j] += Zh[t, i] * Zh[t, j]
                if t > 0 and w[t - 1]:
                    M[i, j] += Zh[t, i] * Zh[t - 1, j]
            for p in range(P):
                Cv[p, i] += Vm[t, p] * Zh[t, i]
    return MpStatistics(G, M, Cv, m, mpmath.mpf(eps))


def _sequence(z, v, mask) -> None:
    """One sequence ``z (T, r)``, ``v (T, P)``, ``mask (T,)`` of 0/1 (as the solver's): NaN came
    back as NaN statistics, a shorter v or mask raised IndexError, a longer one was read in part."""
    z = _v.floating("z", z, min_ndim=2)
    v = _v.floating("v", v, min_ndim=2)
    if z.ndim != 2 or v.ndim != 2:
        raise ValueError(
            f"z and v must be one sequence (T, r), (T, P); got {tuple(z.shape)}, {tuple(v.shape)}"
        )
    if v.shape[0] != z.shape[0]:
        raise ValueError(f"v has {v.shape[0]} positions but z has {z.shape[0]}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        if tuple(mask.shape) != (z.shape[0],):
            raise ValueError(f"mask must have shape ({z.shape[0]},), got {tuple(mask.shape)}")
        if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be boolean or hold only 0 and 1")  # 0.5 read as True


def cholesky(G: mpmath.matrix) -> mpmath.matrix:
    """Lower-triangular L with G = L L^T at the current precision."""
    try:
        return mpmath.cholesky(G)
    except (ValueError, ZeroDivisionError):  # mpmath's error, named (eps = 0 and rank-deficient z)
        raise ValueError(
            "G~ = eps I + sum z^ z^T must be positive definite (pass eps > 0 to statistics())"
        ) from None


def whitened(st: MpStatistics):
    """``(L, L^{-1}, A_w = L^{-1} M L^{-T})`` (eq. (22))."""
    L = cholesky(st.G)
    Li = mpmath.inverse(L)
    return L, Li, Li * st.M * Li.T


def _unit(x: mpmath.matrix) -> mpmath.matrix:
    n = mpmath.norm(x, 2)
    return x if n == 0 else x / n


def _square(A, v0) -> int:
    """A square mpmath matrix (A_w) and a start vector of its size: a non-square A gave a bound
    of the wrong operator."""
    if not isinstance(A, mpmath.matrix):
        raise TypeError(f"A must be an mpmath.matrix, got {type(A).__name__}")
    if A.rows != A.cols:
        raise ValueError(f"A must be square, got {A.rows}x{A.cols}")
    if v0 is not None and (not isinstance(v0, mpmath.matrix) or (v0.rows, v0.cols) != (A.rows, 1)):
        raise ValueError(f"v0 must be an mpmath column vector of {A.rows} entries")
    return A.rows


def power_sigma(A: mpmath.matrix, iters: int = 6, v0: Optional[mpmath.matrix] = None) -> mpmath.mpf:
    """The estimate of ``solvers.koopman.power_sigma_max`` replayed exactly."""
    iters = _v.count("iters", iters)  # -1 silently ran no step
    r = _square(A, v0)
    v = v0 if v0 is not None else mpmath.matrix([1 / mpmath.sqrt(r)] * r)
    for _ in range(iters):
        u = _unit(A * v)
        v = _unit(A.T * u)
    return mpmath.norm(A * v, 2)


def singular_values(A: mpmath.matrix):
    """``(s (descending), top right singular vector)``."""
    _, S, Vt = mpmath.svd_r(A)
    order = sorted(range(len(S)), key=lambda i: -S[i])
    s = [S[i] for i in order]
    top = mpmath.matrix([Vt[order[0], j] for j in range(A.cols)])
    return s, top


def power_ratio_bound(
    A: mpmath.matrix, iters: int = 6, v0: Optional[mpmath.matrix] = None
) -> float:
    """``sqrt(1 + tan^2 theta_0 (s2/s1)^{4k})`` >= ``sigma_max / sigma_power`` (k = iters).

    ``v_k ~ (A^T A)^k v_0``, so ``sigma_power^2 = sum c_i^2 s_i^{4k+2} / sum c_i^2 s_i^{4k}
    >= s1^2 / (1 + tan^2 theta_0 (s2/s1)^{4k})`` with ``c_i`` the coordinates of v_0 in the right
    singular basis and ``tan^2 theta_0 = (1 - c_1^2) / c_1^2``.
    """
    iters = _v.count("iters", iters)  # -1 gave a bound for a negative step count
    r = _square(A, v0)
    if v0 is not None and mpmath.norm(v0, 2) == 0:
        raise ValueError("v0 must be a nonzero vector")  # was ZeroDivisionError
    v = v0 if v0 is not None else mpmath.matrix([1 / mpmath.sqrt(r)] * r)
    s, top = singular_values(A)
    if s[0] == 0:
        return 1.0
    c1 = abs(mpmath.fsum(v[i] * top[i] for i in range(r))) / mpmath.norm(v, 2)
    if c1 == 0:
        return float("inf")
    tan2 = (1 - c1**2) / c1**2
    s2 = s[1] if len(s) > 1 else mpmath.mpf(0)
    return float(mpmath.sqrt(1 + tan2 * (s2 / s[0]) ** (4 * iters)))


def statistics_bound(additions: int, arith: Arith, r: int) -> float:
    """``theta`` with ``|S_hat - S| <= theta |S|_abs`` for a statistic whose every term passes
    through at most ``additions`` additions (keys of dimension r).

    Roundings on one term ``z^_i z^_j``: m rounded to the compute dtype and z / m for each factor
    (4), the product (1), the additions; stores of z^ (2) and of the result (1), bf16 storage
    mode only; and m itself, a float64 norm (relative error <= gamma_{r/2+1}(2^-53) <=
    gamma_{r+1}(2^-53), once per factor). Prefix / masked / stream: ``additions = T``;
    chunk-causal: ``S + C`` (within the chunk, then across chunks) <= ``T + C``.
    """
    # negative counts gave a smaller theta; a str arith an AttributeError
    additions, r = _v.count("additions", additions), _v.count("r", r)
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be a solvers.Arith, got {type(arith).__name__}")
    norm = gamma(r + 1, 2.0**-53)
    return (1 + rounding_product(additions + 5, arith, 3)) * (1 + norm) ** 2 - 1


def absolute_statistics(z: torch.Tensor, v: torch.Tensor, mask=None, scale=None, eps: float = 1e-3):
    """``(eps I + sum |z^||z^|^T, sum |z^_t||z^_{t-1}|^T, sum |v||z^|^T)`` in float64 (batched).

    The factors of :func:`statistics_bound`; float64 suffices, they only scale a bound.
    """
    # as in statistics(): NaN gave NaN factors, a mismatch torch's error, scale 0 inf factors
    z, v = _v.floating("z", z, min_ndim=2), _v.floating("v", v, min_ndim=2)
    if v.shape[-2] != z.shape[-2]:
        raise ValueError(f"v has {v.shape[-2]} positions but z has {z.shape[-2]}")
    if mask is not None and (
        not isinstance(mask, torch.Tensor) or mask.shape[-1:] != z.shape[-2:-1]
    ):
        raise ValueError(f"mask must be a tensor of shape (..., {z.shape[-2]})")
    if scale is not None:
        sc = torch.as_tensor(scale, dtype=torch.float64)
        if not bool((torch.isfinite(sc) & (sc > 0)).all()):
            raise ValueError("scale must be finite and > 0")
    eps = _v.real("eps", eps, low=0.0)
    z64, v64 = z.to(torch.float64).abs(), v.to(torch.float64).abs()
    m = (
        torch.linalg.vector_norm(z.to(torch.float64), dim=-1).amax(-1).clamp(min=SCALE_FLOOR)
        if scale is None
        else torch.as_tensor(scale, dtype=torch.float64)
    )
    zh = z64 / m[..., None, None]
    w = torch.ones(z.shape[:-1], dtype=torch.float64) if mask is None else mask.to(torch.float64)
    zw = zh * w[..., None]
    pair = (w[..., 1:] * w[..., :-1])[..., None]
    G = eps * torch.eye(z.shape[-1], dtype=torch.float64) + zw.mT @ zh
    M = (zh[..., 1:, :] * pair).mT @ zh[..., :-1, :]
    Cv = (v64 * w[..., None]).mT @ zh
    return G, M, Cv


@dataclass
class MpReadout:
    """Ground truth of one readout. y_power: exact replay with the power estimate; y_exact: with
    the exact sigma_max; sigma_*: those two; kappa, lam_min, lam_max: of G~; scale: S of
    :func:`readout_scale`; power_bound: :func:`power_ratio_bound` of A_w."""

    y_power: torch.Tensor
    y_exact: torch.Tensor
    sigma_power: float
    sigma_exact: float
    kappa: float
    lam_min: float
    lam_max: float
    scale: float
    power_bound: float


def readout(
    st: MpStatistics,
    zq: torch.Tensor,
    v: torch.Tensor,
    *,
    K: int = 2,
    eta: float = 1.5,
    gamma: float = 1.0,
    power_iters: int = 6,
) -> MpReadout:
    """Appendix F steps 4-10 in mpmath for queries ``zq (Q, r)`` (raw; divided by ``st.m``)."""
    if not isinstance(st, MpStatistics):
        raise TypeError(f"st must be an MpStatistics (of statistics()), got {type(st).__name__}")
    zq = _v.floating("zq", zq, min_ndim=2)  # NaN came back as NaN outputs
    if zq.ndim != 2 or zq.shape[1] != st.G.rows:
        raise ValueError(f"zq must have shape (Q, r) with r = {st.G.rows}, got {tuple(zq.shape)}")
    v = _v.floating("v", v, min_ndim=2)  # NaN: mpmath's svd did not converge
    if v.ndim != 2 or v.shape[1] != st.Cv.rows:
        raise ValueError(f"v must have shape (T, P) with P = {st.Cv.rows}, got {tuple(v.shape)}")
    # K = -1 silently applied no filter; gamma <= 0 flipped or zeroed the operator
    K, power_iters = _v.count("K", K), _v.count("power_iters", power_iters)
    eta, gamma = _v.real("eta", eta), _v.real("gamma", gamma, low=0.0, low_open=True)
    with precision(DPS):
        L, Li, A_w = whitened(st)
        sig_p = power_sigma(A_w, power_iters)
        s, _ = singular_values(A_w)
        sig_e = s[0]
        Bv = st.Cv * Li.T * Li
        Q = zq.shape[0]
        Zq = to_mp(zq.to(torch.float64)) / st.m
        outs = {}
        for name, sig in (("power", sig_p), ("exact", sig_e)):
            A = A_w * (mpmath.mpf(gamma) / max(sig, mpmath.mpf(1)))
            rows = []
            for k in range(Q):
                w = Li * Zq[k, :].T
                for _ in range(K):
                    w = A * w
                y = Bv * (L * w) * mpmath.mpf(eta)
                rows.append([float(y[p]) for p in range(y.rows)])
            outs[name] = torch.tensor(rows, dtype=torch.float64).reshape(Q, st.Cv.rows)
        lam = mpmath.eigsy(st.G)[0]
        lam_min, lam_max = min(lam), max(lam)
        Vn = (
            float(max(mpmath.svd_r(to_mp(v.to(torch.float64)), compute_uv=False)))
            if v.numel()
            else 0.0
        )
        qn = max((float(mpmath.norm(Zq[k, :], 2)) for k in range(Q)), default=0.0)
        return MpReadout(
            y_power=outs["power"],
            y_exact=outs["exact"],
            sigma_power=float(sig_p),
            sigma_exact=float(sig_e),
            kappa=float(lam_max / lam_min),
            lam_min=float(lam_min),
            lam_max=float(lam_max),
            scale=readout_scale(eta, gamma, K, Vn, qn, float(lam_min)),
            power_bound=power_ratio_bound(A_w, power_iters),
        )


def readout_scale(
    eta: float, gamma: float, K: int, v_norm: float, q_norm: float, lam_min: float
) -> float:
    """``S = |eta| gamma^K ||V||_2 ||z^q|| / sqrt(lambda_min(G~))`` >= ``||y||`` (docs/koopman.md).

    ``y = eta (C_v L^{-T}) A'^K (L^{-1} z^q)`` with ``C_v L^{-T} = V^T (L^{-1} Z)^T`` and
    ``||L^{-1} Z|| <= 1``, ``||A'|| <= gamma ||A_w|| <= gamma``, ``||L^{-1}|| = lambda_min^{-1/2}``.
    """
    # lam_min <= 0 divided by zero or gave a complex number, a negative norm a negative S
    eta, gamma = _v.real("eta", eta), _v.real("gamma", gamma, low=0.0, low_open=True)
    K = _v.count("K", K)
    v_norm, q_norm = _v.real("v_norm", v_norm, low=0.0), _v.real("q_norm", q_norm, low=0.0)
    lam_min = _v.real("lam_min", lam_min, low=0.0, low_open=True)
    return abs(eta) * gamma**K * v_norm * q_norm / lam_min**0.5
