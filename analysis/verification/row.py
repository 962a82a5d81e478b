"""One line of the verification table."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass
class VerificationRow:
    """A solver run in one precision on one problem, measured against mpmath ground truth.

    forward_error: ``||x_hat - x*|| / ||x*||`` against the exact (>= 50 digit) solution of the
        inputs as rounded to the working precision.
    backward_error: ``||q - A x_hat|| / (||A|| ||x_hat|| + ||q||)`` (normwise, 2-norms).
    truncation: ``||x_mp - x*|| / ||x*||``, the same iteration replayed in mpmath (NaN for
        direct methods); truncation_bound is its a-priori bound (e.g. 1/T_{r+1}(1/rho)).
    rounding: ``||x_hat - x_mp|| / ||x*||``; rounding_bound is the precision model's
        allowance ``c * kappa * (n u_acc + u_store)`` (docs/precision.md).
    running_bound: the run's own a-posteriori (running) bound on the same rounding
        (``analysis.bounds.running``; Chebyshev, GD, AGD), max over iterates; NaN where a family
        has none. running_ratio: the worst ratio of ``analysis.bounds.running.RunningCheck`` --
        ``rounding_i / running_bound_i`` at every iterate, each step's implied local error against
        its local bound, the bound's recurrence against the replay: <= 1 holds.
    reference_size: the size of the exact result in the units of truncation and rounding (1 for
        errors relative to the result itself; ``||y*|| / S`` for errors relative to a scale S). A
        bound >= it says nothing (the report calls such a row inconclusive, never held).
    holds: every measured value within every bound given (whether those bounds say anything
        is the report's verdict, ``analysis.cli.verdict``).
    """

    solver: str
    precision: str
    problem: str
    n: int
    kappa: float
    iters: Optional[int]
    forward_error: float
    backward_error: float
    truncation: float
    truncation_bound: float
    rounding: float
    rounding_bound: float
    running_bound: float = float("nan")
    running_ratio: float = float("nan")
    notes: str = ""
    extra: dict = field(default_factory=dict)
    reference_size: float = 1.0

    @property
    def holds(self) -> bool:
        """Every measured value within its bound. A NaN bound means no claim is made; a NaN
        measurement against a real bound fails (a NaN never passes), as does a NaN or inf result."""
        if not math.isfinite(self.forward_error):
            return False
        ok_t = within(self.truncation, self.truncation_bound)
        ok_r = within(self.rounding, self.rounding_bound)
        ok_run = math.isnan(self.running_bound) or within(self.running_ratio, 1.0)
        return ok_t and ok_r and ok_run

    def as_dict(self) -> dict:
        d = asdict(self)
        d["holds"] = self.holds
        return d


def within(measured: float, bound: float) -> bool:
    """``measured <= bound``; a NaN bound makes no claim, a NaN measurement never passes."""
    if math.isnan(bound):
        return True
    return not math.isnan(measured) and measured <= bound


def nanmax(values) -> float:
    """``max`` that a NaN cannot hide: Python's ``max`` keeps the first item whenever a later one
    compares False, so ``max([0.1, nan])`` is 0.1; here any NaN makes the result NaN, and so does
    an empty set (no case was measured: never a pass)."""
    values = [float(v) for v in values]
    if not values or any(math.isnan(v) for v in values):
        return float("nan")
    return max(values)


def status_note(status) -> str:
    """``status NAME`` for a clean outcome; otherwise also the status's advice (``Status.advice``),
    so that a row whose solve jittered or broke down says what that means and what to do."""
    clean = status.name in ("COMPLETED", "CONVERGED")
    return f"status {status.name}" if clean else f"status {status.explain()}"
