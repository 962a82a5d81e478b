"""Shared by the chebyshev / cg / gradient families: default problems and one row per run.

Default problems (small D, so the mpmath replay is fast):

* ``fig1a-a0.02-t{T}``: GKA Fig. 1a systems (appendix F generator, ``solvers.fig1a_problems``)
  at a few tokens T of one sequence, ``a = 0.02``: ``kappa <= 51`` (eq. (4)), r = 30 iterations
  (the paper's setting for CH);
* ``geometric-k1e3``: a geometric spectrum with kappa = 1e3 (r = 100), and in the full run
  also ``outliers-k1e3`` and ``geometric-k1e4`` (r = 300), where bf16 has no guarantee.

Each row is measured at every iterate (``analysis.references.iterative.error_split``); it reports the
final forward and backward errors, the truncation/bound pair at the iterate where their ratio
is worst among those whose bound is < 1 (:func:`worst_iterate`; a bound >= 1 checks nothing), and the largest rounding over all iterates against the allowance and, for
Chebyshev / GD / AGD, against the run's own running bound (``analysis.bounds.running``: every
iterate and every step checked; the row shows the bound's max over iterates).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import solvers
from analysis.bounds import checks
from analysis.bounds import running as running_bounds
from analysis.precision import PRECISIONS, rounding_allowance
from analysis.references import iterative as gt
from analysis.testing.strategies.spd import spd_system
from solvers import Arith

from .row import VerificationRow, nanmax


@dataclass
class Problem:
    name: str
    H: torch.Tensor  # float64, rounded to each precision by the row
    q: torch.Tensor
    L: float
    mu: float
    iters: int


def problems(quick: bool) -> list:
    D = 8 if quick else 16
    P = solvers.fig1a_problems(B=1, T=64, heads=1, D=D, a=0.02, seed=0)
    out = []
    for t in (15, 63) if quick else (7, 15, 31, 63):
        out.append(Problem(f"fig1a-a0.02-t{t + 1}", P.A[0, t, 0], P.q[0, t, 0], P.L, P.mu, 30))
    specs = (
        [("geometric", 1e3, 100)]
        if quick
        else [("geometric", 1e3, 100), ("outliers", 1e3, 100), ("geometric", 1e4, 300)]
    )
    for kind, kappa, iters in specs:
        S = spd_system(D, kappa, kind, seed=0)
        out.append(Problem(f"{kind}-k{kappa:g}", S.H, S.q, S.L, S.mu, iters))
    return out


def worst_iterate(ratio: torch.Tensor, bound: torch.Tensor, first: int = 0) -> int:
    """The iterate whose truncation/bound pair the row reports: where the ratio is worst (from
    ``first``). Where no iterate fails (every ratio <= 1), the worst among the iterates whose bound
    says something (< 1, relative errors): a bound >= 1 there is no check, and reporting it would
    hide the conclusive iterates (AGD's and CG's bounds start above 1). Without such an iterate,
    the overall worst (whose vacuous bound the verdict then calls inconclusive)."""
    r, b = ratio[first:], bound[first:]
    overall = first + int(torch.argmax(r))
    conclusive = torch.isfinite(b) & (b < 1.0)
    if bool((r > 1).any()) or not bool(conclusive.any()):
        return overall
    return first + int(torch.argmax(torch.where(conclusive, r, torch.full_like(r, -1.0))))


def row(method: str, problem: Problem, arith: Arith) -> VerificationRow:
    H, q = problem.H.to(arith.dtype), problem.q.to(arith.dtype)
    split = gt.error_split(
        method, H, q, iters=problem.iters, L=problem.L, mu=problem.mu, bf16_mode=arith.mode
    )
    D = H.shape[-1]
    kappa = float(checks.method_kappa(split, problem.L, problem.mu))
    allowance = rounding_allowance(kappa, D, arith)
    bound = checks.truncation_bounds(split, problem.L, problem.mu)
    trunc = checks.measured_truncation(split)
    # x_0 = 0 gives truncation 1 = bound at i = 0 for GD: the worst ratio is sought from i = 1.
    first = 1 if problem.iters >= 1 else 0
    worst = worst_iterate(checks.truncation_ratio(split, problem.L, problem.mu), bound, first)
    running = {}
    if method == "cg":
        rounding = float(split.forward[-1])
        notes = (
            f"truncation in the H-norm vs 2 R_a^i at i={worst}; rounding = final forward error "
            "(attainable accuracy: CG lags its mp replay, see docs/precision.md)"
        )
    else:
        rounding = float(split.rounding.max())
        notes = (
            f"truncation vs bound at i={worst} (worst ratio where the bound is < 1); "
            "rounding = max over iterates"
        )
        rc = running_bounds.running_check(split, H, q, L=problem.L, mu=problem.mu)
        running = {
            "running_bound": float(rc.bound.max()),
            "running_ratio": nanmax(rc.worst.values()),
        }
        notes += (
            "; running bound: rounding_i/bound_i <= {rounding_ratio:.2g}, local <= {local_ratio:.2g}, "
            "recurrence <= {recurrence_ratio:.2g}"
        ).format(**rc.worst)
    if not bool(split.exact.spd):
        notes += "; stored matrix not positive definite"
    elif allowance >= 1.0:
        notes += "; c kappa (n u_acc + u_store) >= 1: no a-priori guarantee"
    return VerificationRow(
        solver=method,
        precision=arith.label,
        problem=problem.name,
        n=D,
        kappa=kappa,
        iters=problem.iters,
        forward_error=float(split.forward[-1]),
        backward_error=float(split.backward[-1]),
        truncation=float(trunc[worst]),
        truncation_bound=float(bound[worst]),
        rounding=rounding,
        rounding_bound=allowance,
        **running,
        notes=notes,
        extra={
            "stored_spd": bool(split.exact.spd),
            "constants": {k: float(v) for k, v in split.replay.constants.items()},
        },
    )


def rows_for(methods, quick: bool) -> list:
    return [row(m, p, arith) for m in methods for p in problems(quick) for arith in PRECISIONS]
