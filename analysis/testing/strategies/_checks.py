"""Argument checks for the strategies and builders: a bad option is a ValueError/TypeError
naming the argument when the strategy is *built*, not an obscure error (or an Unsatisfiable,
a health-check failure, a silently wrong case) later, inside hypothesis.

Whole numbers reuse :func:`solvers.validation.count`, real numbers :func:`~solvers.validation.real`, ridge strengths
:func:`solvers.validation.ridge_strength`, so the messages read as the solvers' do.
"""

from __future__ import annotations

from solvers import validation

count = validation.count  # (name, n, *, minimum): an int >= minimum
real = validation.real  # (name, x, *, low, low_open): a finite float >= (>) low


def ordered(lo_name: str, lo, hi_name: str, hi) -> None:
    """``lo <= hi`` (both already checked)."""
    if lo > hi:
        raise ValueError(f"{lo_name} must be <= {hi_name}, got {lo_name}={lo} > {hi_name}={hi}")


def sizes(lo_name: str, lo, hi_name: str, hi, *, minimum: int = 1) -> tuple:
    """Two whole numbers ``minimum <= lo <= hi``."""
    lo, hi = count(lo_name, lo, minimum=minimum), count(hi_name, hi, minimum=minimum)
    ordered(lo_name, lo, hi_name, hi)
    return lo, hi


def kappas(lo_name: str, lo, hi_name: str, hi) -> tuple:
    """Condition numbers ``1 <= lo <= hi < inf``."""
    lo, hi = real(lo_name, lo, low=1.0), real(hi_name, hi, low=1.0)
    ordered(lo_name, lo, hi_name, hi)
    return lo, hi


def clamp(x: float, lo: float, hi: float) -> float:
    """``x`` into ``[lo, hi]``: ``10 ** log10(kappa)`` may round an ulp outside the range."""
    return min(max(x, lo), hi)


def choices(name: str, values, allowed=None) -> tuple:
    """A non-empty sequence (not a string: ``"gdn"`` would be sampled letter by letter) of
    options, each in ``allowed`` when given."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of options, got {values!r}")
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} must not be empty")
    if allowed is not None:
        for v in values:
            if v not in allowed:
                raise ValueError(f"{name} must contain only {tuple(allowed)}, got {v!r}")
    return values


def ridge_strengths(name: str, values) -> tuple:
    """A non-empty sequence of GKA ridge strengths, each a finite float > 0 (eq. (4))."""
    values = choices(name, values)
    for v in values:
        try:
            validation.ridge_strength(v)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{name}: {e}") from None
    return values


def shape(name: str, s) -> tuple:
    """A tensor shape: a sequence of ints >= 0."""
    if isinstance(s, (str, bytes)) or not hasattr(s, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {s!r}")
    return tuple(count(f"{name} entry", n, minimum=0) for n in s)
