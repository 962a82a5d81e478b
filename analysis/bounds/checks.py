"""Every-iterate checks of a run against its bounds (what tests and the verification table assert).

Given an :class:`analysis.references.iterative.ErrorSplit` -- from a reference solver or from a
kernel's iterates -- these return per-iterate ratios ``measured / bound``; a run passes when
every ratio is <= 1. Tests assert every iterate, not only the last (STYLE.md: the
cautionary tale of a Chebyshev that passes a final-iterate check and diverges at kappa = 100).

* truncation: the mp replay's error against the bound for the constants it used
  (Chebyshev: ``bounds.chebyshev_bound_for_constants``; GD: ``gd_bound_for_step``, both over
  the stored spectrum; AGD: Nesterov's ``agd_bound`` at ``precision.allowance_kappa``; CG: the
  H-norm error against ``cg_bound``), widened by ``bounds.with_evaluation_slack``;
* rounding: ``||x_hat_i - x_mp_i|| / ||x*||`` against ``precision.rounding_allowance``, only
  where the allowance applies (stored matrix SPD and allowance < 1);
* CG instead: its forward error against ``sqrt(kappa) 2 R_a^i + allowance`` at every iterate
  (exact-arithmetic bound plus attainable accuracy) -- see docs/precision.md, "CG".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from analysis.precision import allowance_kappa, by_label, rounding_allowance
from analysis.references.iterative import ErrorSplit
from solvers import validation as _v

from . import iterative as bounds


def _split(split) -> ErrorSplit:
    if not isinstance(split, ErrorSplit):
        raise TypeError(
            f"split must be an analysis.references.iterative.ErrorSplit, got {type(split).__name__}"
        )
    return split


def _inputs(split, L, mu) -> tuple:
    """``(split, L, mu)`` checked: L and mu both omitted, or finite with ``L >= mu > 0``,
    broadcast to the batch (float64). A NaN, zero or negative mu would otherwise make the
    allowance or the bound not apply, which reads as a pass."""
    split = _split(split)
    if (L is None) != (mu is None):
        raise TypeError("L and mu must be given together (or both omitted)")
    if L is None:
        return split, None, None
    eig = split.exact.eigenvalues
    L = _v.parameter("L", L, eig.shape[:-1], eig.device)
    mu = _v.parameter("mu", mu, eig.shape[:-1], eig.device)
    _v.spectrum_bounds(L, mu)
    return split, L, mu


def _iterations(split: ErrorSplit) -> torch.Tensor:
    n = split.truncation.shape[0]
    shape = (n,) + (1,) * (split.truncation.ndim - 1)
    return torch.arange(n, dtype=torch.float64).reshape(shape)


def method_kappa(split: ErrorSplit, L=None, mu=None) -> torch.Tensor:
    """The allowance's kappa (``precision.allowance_kappa``): L/mu widened to the stored
    spectrum for methods given bounds, the stored matrix's own for CG."""
    split, L, mu = _inputs(split, L, mu)
    if split.method == "cg":
        return allowance_kappa(split.exact.eigenvalues)
    return allowance_kappa(split.exact.eigenvalues, L, mu)


def spectral_interval(split: ErrorSplit) -> tuple:
    """``[lam_min, lam_max]`` of the stored matrix, widened by the float64 rounding of the
    mpmath eigenvalues (relative 2^-53 each), so that bounds over it are rigorous."""
    eig = _split(split).exact.eigenvalues
    lo, hi = eig[..., 0], eig[..., -1]
    widen = 2.0**-52
    return lo - lo.abs() * widen, hi + hi.abs() * widen


def truncation_bounds(split: ErrorSplit, L=None, mu=None) -> torch.Tensor:
    """``(iters + 1, *batch)`` bound on ``split.truncation`` (CG: on ``replay.truncation_H``)."""
    split, L, mu = _inputs(split, L, mu)
    i = _iterations(split)
    lo, hi = spectral_interval(split)
    c = split.replay.constants
    if split.method == "chebyshev":
        b = bounds.chebyshev_bound_for_constants(c["step"], c["rho2"], lo, hi, i)
    elif split.method == "gd":
        b = bounds.gd_bound_for_step(c["step"], lo, hi, i)
    else:
        ends = torch.stack([lo, hi], dim=-1)  # the widened spectrum, in allowance_kappa's format
        if split.method == "agd":
            b = bounds.agd_bound(allowance_kappa(ends, L, mu), i)
        else:
            b = bounds.cg_bound(allowance_kappa(ends), i)
    return bounds.with_evaluation_slack(b, i)


def measured_truncation(split: ErrorSplit) -> torch.Tensor:
    split = _split(split)
    return split.replay.truncation_H if split.method == "cg" else split.truncation


def truncation_ratio(split: ErrorSplit, L=None, mu=None) -> torch.Tensor:
    """Per-iterate ``truncation / bound``. An infinite bound (no bound applies: CG or AGD on a
    stored matrix that rounding made indefinite) gives 0, no claim; a NaN measurement under a
    finite bound gives inf, a failure."""
    return _truncation_ratio(split, truncation_bounds(split, L, mu))


def _truncation_ratio(split: ErrorSplit, b: torch.Tensor) -> torch.Tensor:
    r = torch.nan_to_num(measured_truncation(split) / b, nan=float("inf"))
    return torch.where(torch.isinf(b), torch.zeros_like(r), r)


def allowance(split: ErrorSplit, L=None, mu=None) -> tuple:
    """``(allowance, applies)``, both ``batch``-shaped: c kappa (n u_acc + u_store), and whether
    it says anything (stored matrix SPD and allowance < 1)."""
    split, L, mu = _inputs(split, L, mu)
    arith = by_label(split.precision)
    kappa = method_kappa(split, L, mu)
    n = split.iterates.shape[-1]
    a = rounding_allowance(1.0, n, arith) * kappa
    return a, split.exact.spd & (a < 1.0)


def rounding_ratio(split: ErrorSplit, L=None, mu=None) -> torch.Tensor:
    """Per-iterate ``rounding / allowance``; 0 where the allowance does not apply (no claim)."""
    a, applies = allowance(split, L, mu)
    r = split.rounding / a
    return torch.where(applies, r, torch.zeros_like(r))


def cg_forward_ratio(split: ErrorSplit) -> torch.Tensor:
    """CG: per-iterate ``forward / (sqrt(kappa) 2 R_a^i + allowance)``; 0 where no allowance applies."""
    split = _split(split)
    a, applies = allowance(split)
    kappa = split.exact.kappa
    b = (
        bounds.with_evaluation_slack(
            bounds.cg_bound_2norm(kappa, _iterations(split)), _iterations(split)
        )
        + a
    )
    r = split.forward / b
    return torch.where(applies, r, torch.zeros_like(r))


@dataclass
class CheckResult:
    """Worst ratios over every iterate and system (<= 1 passes).

    A ratio of 0 where no bound applies (an infinite truncation bound, an allowance that does
    not apply) is no claim: such a run is not ``conclusive`` and never ``passes`` (it is
    inconclusive unless some ratio exceeds 1)."""

    truncation: float
    rounding: float
    applies: bool  # the allowance applied to at least one system
    conclusive: bool = True  # every truncation bound finite, the allowance applied to every system

    @property
    def passes(self) -> bool:
        return self.conclusive and self.truncation <= 1.0 and self.rounding <= 1.0


def check(split: ErrorSplit, L=None, mu=None) -> CheckResult:
    """The worst truncation and rounding ratios of a run (CG: rounding = :func:`cg_forward_ratio`)."""
    split, L, mu = _inputs(split, L, mu)
    rr = cg_forward_ratio(split) if split.method == "cg" else rounding_ratio(split, L, mu)
    _, applies = allowance(split, L, mu)
    b = truncation_bounds(split, L, mu)
    return CheckResult(
        float(_truncation_ratio(split, b).max()),
        float(rr.max()),
        bool(applies.any()),
        bool(torch.isfinite(b).all() and applies.all()),
    )


__all__ = [
    "CheckResult",
    "allowance",
    "cg_forward_ratio",
    "check",
    "measured_truncation",
    "method_kappa",
    "rounding_ratio",
    "spectral_interval",
    "truncation_bounds",
    "truncation_ratio",
]
