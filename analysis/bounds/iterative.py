"""A-priori error bounds of the solvers, each citing its source (docs/precision.md "Bounds").

Errors are relative to ``||x*||`` (iterations start at 0, so ``e_0 = -x*``; Chebyshev's
xi_{-1} = 0). ``kappa = L / mu`` for methods given eigenvalue bounds, ``R_a = (sqrt(kappa) - 1)
/ (sqrt(kappa) + 1)`` (GKA appendix D.1, Remark 1). All functions take floats or tensors,
broadcast, and return float64 tensors; ``i`` is the iteration index of the iterate bounded.

Chebyshev polynomials of large degree overflow float64 (T_k(1/rho) ~ R_a^-k), so they are
evaluated through ``log T_k``.
"""

from __future__ import annotations

import math
import numbers

import torch

from solvers import validation as _v

_F64 = torch.float64


def _t(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=_F64)


def _real(name: str, x) -> torch.Tensor:
    """A real scalar or tensor (not bool, not complex) as float64; NaN rejected."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
        raise TypeError(f"{name} must be a real number or tensor, got bool")
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise TypeError(f"{name} must be real, got {x.dtype}")
    elif not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number or tensor, got {type(x).__name__}")
    t = _t(x.detach() if isinstance(x, torch.Tensor) else x)
    if t.numel() and bool(torch.isnan(t).any()):
        raise ValueError(f"{name} has NaN entries")
    return t


def _finite(name: str, x) -> torch.Tensor:
    """:func:`_real`, and finite (an Inf would make the bound NaN or silently ignore it)."""
    t = _real(name, x)
    _v.finite(name, t)
    return t


def _broadcast(**named: torch.Tensor) -> None:
    """The arguments must broadcast together (a clear error, not torch's shape error)."""
    _v.batch_shape(" and ".join(named), *(t.shape for t in named.values()))


def _no_bound(kappa: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``inf`` where kappa = inf (no bound applies), not the NaN of ``inf / inf``."""
    return torch.where(torch.isinf(kappa), torch.full_like(b, float("inf")), b)


def _index(i) -> torch.Tensor:
    """An iteration index: a whole number >= 0 (int, or a tensor of whole values)."""
    if isinstance(i, numbers.Real) and not isinstance(i, (bool, numbers.Integral)):
        raise TypeError(f"i must be an int (an iteration index), got {i!r}")
    t = _real("i", i)
    if t.numel() and not bool((torch.isfinite(t) & (t >= 0) & (t == torch.floor(t))).all()):
        raise ValueError(f"i must hold whole numbers >= 0, got {i!r}")
    return t


def _kappa(kappa) -> torch.Tensor:
    """A condition number: >= 1 (inf allowed: no bound)."""
    t = _real("kappa", kappa)
    if t.numel() and not bool((t >= 1).all()):
        raise ValueError(f"kappa must be >= 1, got min(kappa) = {float(t.min())}")
    return t


def contraction_rate(kappa) -> torch.Tensor:
    """``R_a = (sqrt(kappa) - 1)/(sqrt(kappa) + 1)``, the rate of optimal first-order methods
    (GKA appendix D.1, Remark 1)."""
    kappa = _kappa(kappa)
    r = (kappa - 1.0) / (torch.sqrt(kappa) + 1.0) ** 2  # = (s - 1)/(s + 1), s = sqrt(kappa)
    return torch.where(torch.isinf(kappa), torch.ones_like(r), r)  # its limit 1, not inf/inf


def rho(L, mu) -> torch.Tensor:
    """``rho = (L - mu)/(L + mu) = (kappa - 1)/(kappa + 1)`` (GKA Algorithm 1, line 2)."""
    L, mu = _finite("L", L), _finite("mu", mu)
    _broadcast(L=L, mu=mu)
    if mu.numel() and not bool((mu > 0).all()):
        raise ValueError(f"mu must be > 0, got min(mu) = {float(mu.min())}")
    if not bool((L >= mu).all()):
        raise ValueError("L must be >= mu")
    return (L - mu) / (L + mu)


def log_chebyshev_t(k, x) -> torch.Tensor:
    """``log T_k(x)`` for ``x >= 1``: ``k acosh(x) + log((1 + exp(-2 k acosh x)) / 2)``."""
    k, x = _real("k", k), _real("x", x)
    _broadcast(k=k, x=x)
    if x.numel() and not bool((x >= 1).all()):
        raise ValueError(f"x must be >= 1, got min(x) = {float(x.min())}")
    return _log_chebyshev_t(k, x)


def _log_chebyshev_t(k, x) -> torch.Tensor:
    """:func:`log_chebyshev_t` unchecked, x clamped to >= 1 (callers mask |x| <= 1)."""
    k, x = _t(k), _t(x)
    a = k * torch.acosh(torch.clamp(x, min=1.0))
    return a + torch.log1p(torch.exp(-2.0 * a)) - math.log(2.0)


def _log_t_from_acosh(k, a) -> torch.Tensor:
    """``log T_k(x)`` given ``a = acosh(x)``."""
    ka = _t(k) * a
    return ka + torch.log1p(torch.exp(-2.0 * ka)) - math.log(2.0)


def _acosh_inv_rho(rho2) -> torch.Tensor:
    """``acosh(1/rho) = log1p((1 - rho + sqrt(1 - rho^2)) / rho)`` from rho^2, accurate to a few
    ulps even as rho -> 1 (where ``acosh(fl(1/rho))`` loses a factor ~kappa: acosh has slope
    ``1/sqrt(x^2 - 1)`` at x -> 1). ``1 - rho^2`` is exact for rho^2 >= 1/2 (Sterbenz), and
    ``1 - rho = (1 - rho^2)/(1 + rho)``."""
    rho2 = _t(rho2)
    one_minus = 1.0 - rho2
    r = torch.sqrt(rho2)
    safe = torch.where(r > 0, r, torch.ones_like(r))
    return torch.log1p((one_minus / (1.0 + r) + torch.sqrt(one_minus)) / safe)


def chebyshev_bound(kappa, i) -> torch.Tensor:
    """``||xi_i - x*|| / ||x*|| <= 1 / T_{i+1}(1/rho)`` for GKA Algorithm 1 with the spectrum
    in [mu, L] (xi_i has degree i + 1; the standard Chebyshev-iteration bound, e.g. Saad,
    *Iterative Methods*, Sec. 12.1; GKA Sec. 4.2.3 / [47]). ``kappa = 1`` gives 0 for i >= 0.
    Evaluated as ``acosh(1/rho) = -log R_a = log1p(2 (sqrt(kappa) + 1)/(kappa - 1))``: a log1p of
    a positive, accurately formed argument, so no cancellation at any kappa."""
    kappa, i = _kappa(kappa), _index(i)
    _broadcast(kappa=kappa, i=i)
    a = torch.log1p(2.0 * (torch.sqrt(kappa) + 1.0) / (kappa - 1.0))
    return _no_bound(kappa, torch.exp(-_log_t_from_acosh(i + 1.0, a)))


def chebyshev_rate_bound(kappa, i) -> torch.Tensor:
    """``1/T_{i+1}(1/rho) <= 2 R_a^{i+1}`` (since ``T_k(1/rho) >= (R_a^-k + R_a^k)/2``)."""
    kappa, i = _kappa(kappa), _index(i)
    _broadcast(kappa=kappa, i=i)
    return _no_bound(kappa, 2.0 * contraction_rate(kappa) ** (i + 1.0))


def _abs_chebyshev_t_max(k, t_lo, t_hi) -> torch.Tensor:
    """``max |T_k(t)|`` over ``t in [t_lo, t_hi]``: 1 on [-1, 1], monotone in |t| outside.

    The ends are first moved outward by 4 ulps: they were computed in float64, and just
    outside [-1, 1] ``T_k`` rises with slope k^2, so an end rounded inward would make the
    maximum too small (by ~k^2 u relative) when an eigenvalue sits at mu' or L'."""
    k = _t(k)
    out = 4.0 * 2.0**-53
    # an end that overflowed to -+inf stays there (inf - inf would be a NaN, read as |t| <= 1)
    t_lo = torch.where(torch.isinf(t_lo), t_lo, t_lo - out * (1.0 + t_lo.abs()))
    t_hi = torch.where(torch.isinf(t_hi), t_hi, t_hi + out * (1.0 + t_hi.abs()))

    def abs_t(t):
        big = torch.exp(_log_chebyshev_t(k, t.abs()))
        return torch.where(t.abs() > 1.0, big, torch.ones_like(big))

    inside = (t_lo <= 1.0) & (t_hi >= -1.0)
    return torch.maximum(torch.maximum(abs_t(t_lo), abs_t(t_hi)), inside.to(_F64))


def chebyshev_bound_for_constants(step, rho2, lam_min, lam_max, i) -> torch.Tensor:
    """The Chebyshev bound for the constants actually used and the matrix actually stored.

    Algorithm 1 depends on (L, mu) only through ``step = 2/(L+mu)`` and ``rho^2``; with the
    rounded values it is exactly Algorithm 1 for ``L' = (1 + rho')/step``,
    ``mu' = (1 - rho')/step``, ``rho' = sqrt(rho2)``. Its error is
    ``e_i = P_{i+1}(H) e_{-1}`` with ``P_k(lam) = T_k((1 - step lam)/rho') / T_k(1/rho')``, hence

        ||xi_i - x*|| / ||x*|| <= max_{lam in [lam_min, lam_max]} |T_{i+1}((1 - step lam)/rho')| / T_{i+1}(1/rho')

    which equals :func:`chebyshev_bound` when [lam_min, lam_max] lies in [mu', L'] and is
    > 1 (growth, honestly reported) when the stored matrix has an eigenvalue <= 0.
    ``rho2 = 0`` (L = mu) degenerates to Richardson: ``max |1 - step lam|^{i+1}``.
    """
    step, rho2, lo, hi = (
        _finite(n, v)
        for n, v in (("step", step), ("rho2", rho2), ("lam_min", lam_min), ("lam_max", lam_max))
    )
    i = _index(i)
    _broadcast(step=step, rho2=rho2, lam_min=lo, lam_max=hi, i=i)
    k = i + 1.0
    if rho2.numel() and not bool(((rho2 >= 0) & (rho2 <= 1)).all()):
        raise ValueError(f"rho2 must be in [0, 1], got {rho2}")
    rho_p = torch.sqrt(rho2)
    safe = torch.where(rho_p > 0, rho_p, torch.ones_like(rho_p))
    t_hi, t_lo = (1.0 - step * lo) / safe, (1.0 - step * hi) / safe
    num = torch.log(_abs_chebyshev_t_max(k, t_lo, t_hi))
    cheb = torch.exp(num - _log_t_from_acosh(k, _acosh_inv_rho(rho2)))
    richardson = torch.maximum((1.0 - step * lo).abs(), (1.0 - step * hi).abs()) ** k
    return torch.where(rho_p > 0, cheb, richardson)


def with_evaluation_slack(bound, i) -> torch.Tensor:
    """A bound as evaluated here, widened by its own float64 evaluation error, for comparison
    with mpmath-measured errors.

    ``exp(-log T_k)`` with ``log T_k`` up to ~745 (computed from an accurate ``acosh(1/rho)``)
    carries a relative error of a few ``|log bound| u`` (u = 2^-53), the powers ``R^i`` likewise
    ``i u``; the measured errors bottom out at ~1e-31 (double-double ground truth). Spectral ends
    must be widened by the caller (``analysis.bounds.checks.spectral_interval``).
    """
    b, i = _real("bound", bound), _index(i)
    _broadcast(bound=b, i=i)
    if b.numel() and not bool((b >= 0).all()):
        raise ValueError(f"bound must be >= 0, got min(bound) = {float(b.min())}")
    logb = torch.log(b.clamp_min(torch.finfo(_F64).tiny)).abs()
    return b * (1.0 + 2.0**-50 * (8.0 + 4.0 * logb + i)) + 1e-30


def gd_bound(kappa, i) -> torch.Tensor:
    """``||x_i - x*|| / ||x*|| <= ((kappa - 1)/(kappa + 1))^i``: gradient descent with step
    2/(L + mu) (solvers/gradient.py; Nesterov 2004, Thm 2.1.15 specialised to quadratics)."""
    kappa, i = _kappa(kappa), _index(i)
    _broadcast(kappa=kappa, i=i)
    return _no_bound(kappa, ((kappa - 1.0) / (kappa + 1.0)) ** i)


def gd_bound_for_step(step, lam_min, lam_max, i) -> torch.Tensor:
    """``max_{lam in [lam_min, lam_max]} |1 - step lam|^i``: GD's exact worst case for the step
    actually used (equals :func:`gd_bound` for step = 2/(L+mu) and the spectrum [mu, L])."""
    step, lo, hi = _finite("step", step), _finite("lam_min", lam_min), _finite("lam_max", lam_max)
    i = _index(i)
    _broadcast(step=step, lam_min=lo, lam_max=hi, i=i)
    return torch.maximum((1.0 - step * lo).abs(), (1.0 - step * hi).abs()) ** i


def cg_bound(kappa, i) -> torch.Tensor:
    """``||x_i - x*||_H / ||x*||_H <= 2 R_a^i``: CG in the H-norm (solvers/cg.py; Saad,
    *Iterative Methods*, Thm 6.29). Exact arithmetic; kappa of the matrix itself; ``inf`` for
    kappa = inf (an indefinite matrix: no H-norm, no bound)."""
    kappa, i = _kappa(kappa), _index(i)
    _broadcast(kappa=kappa, i=i)
    return _no_bound(kappa, 2.0 * contraction_rate(kappa) ** i)


def cg_bound_2norm(kappa, i) -> torch.Tensor:
    """:func:`cg_bound` in the 2-norm: ``||e||_2 <= ||e||_H / sqrt(lam_min)`` and
    ``||x*||_H <= sqrt(lam_max) ||x*||_2`` give ``||x_i - x*||/||x*|| <= sqrt(kappa) 2 R_a^i``."""
    return torch.sqrt(_kappa(kappa)) * cg_bound(kappa, i)


def agd_bound(kappa, i) -> torch.Tensor:
    """``||x_i - x*|| / ||x*|| <= sqrt((kappa + 1)(1 - 1/sqrt(kappa))^i)`` for Nesterov's method
    with step 1/L and momentum (sqrt kappa - 1)/(sqrt kappa + 1) from x_0 = 0, spectrum in
    [mu, L] (Nesterov 2004, Thm 2.2.3 with f - f* = e^T H e / 2; solvers/gradient.py)."""
    kappa, i = _kappa(kappa), _index(i)
    _broadcast(kappa=kappa, i=i)
    return torch.sqrt((kappa + 1.0) * (1.0 - 1.0 / torch.sqrt(kappa)) ** i)


def omega_star(rho_) -> torch.Tensor:
    """``omega_1* = 2 (1 - sqrt(1 - rho^2)) / rho^2``, the limit of GKA's weight schedule
    (GKA appendix, Lemma 3); 1 at rho = 0 (its limit)."""
    r = _real("rho", rho_)
    if r.numel() and not bool((r.abs() <= 1).all()):
        raise ValueError(f"rho must be in [-1, 1], got max |rho| = {float(r.abs().max())}")
    r2 = r**2
    safe = torch.where(r2 > 0, r2, torch.ones_like(r2))
    # 1 - sqrt(1 - r2) = r2 / (1 + sqrt(1 - r2)): no cancellation at small rho
    return torch.where(r2 > 0, 2.0 / (1.0 + torch.sqrt(1.0 - safe)), torch.ones_like(r2))


def omega_contraction(kappa) -> torch.Tensor:
    """``R = (kappa - 1)/(kappa + 1) * (sqrt kappa - 1)/(sqrt kappa + 1)`` (GKA Lemma 4)."""
    kappa = _kappa(kappa)
    r = (kappa - 1.0) / (kappa + 1.0) * contraction_rate(kappa)
    return torch.where(torch.isinf(kappa), torch.ones_like(r), r)  # its limit 1, not inf/inf


def omega_gap_bound(kappa, i) -> torch.Tensor:
    """``omega_i - omega_1* <= R^i (omega_0 - omega_1*)`` with omega_0 = 2 (GKA Lemma 4)."""
    kappa, i = _kappa(kappa), _index(i)
    _broadcast(kappa=kappa, i=i)
    r = torch.where(torch.isinf(kappa), torch.ones_like(kappa), (kappa - 1.0) / (kappa + 1.0))
    return _no_bound(kappa, omega_contraction(kappa) ** i * (2.0 - omega_star(r)))


__all__ = [
    "agd_bound",
    "cg_bound",
    "cg_bound_2norm",
    "chebyshev_bound",
    "chebyshev_bound_for_constants",
    "chebyshev_rate_bound",
    "contraction_rate",
    "gd_bound",
    "gd_bound_for_step",
    "log_chebyshev_t",
    "omega_contraction",
    "omega_gap_bound",
    "omega_star",
    "rho",
    "with_evaluation_slack",
]
