"""Decay gates for tests: pre-activations, and log gates ``g = log gamma <= 0`` by regime.

Regimes (``GATE_REGIMES``), chosen to reach the places where gate arithmetic breaks:

* ``moderate``: gamma in ~[0.05, 1), g in [-3, 0];
* ``near_zero``: gamma <= e^-10 (g in [-60, -10]): cumulative products underflow within a
  few tokens in float32 and bf16 -- the case the log-space form exists for;
* ``near_one``: 1 - gamma <= 1e-6 (g in [-1e-6, 0]): gamma rounds to 1 in float32 and bf16,
  so only the log form keeps the decay;
* ``mixed``: each token from one of the three.

Builders are deterministic (a seed); the strategies draw a regime and a seed (or the values
themselves, so that hypothesis can shrink them) and call the builders. Everything is float64.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from . import _checks

GATE_REGIMES = ("moderate", "near_zero", "near_one", "mixed")
_RANGES = {"moderate": (-3.0, 0.0), "near_zero": (-60.0, -10.0), "near_one": (-1e-6, 0.0)}
_F64 = torch.float64


def log_gates(
    T: int, regime: str = "moderate", *, seed: int = 0, batch: tuple = ()
) -> torch.Tensor:
    """``(*batch, T)`` log gates ``g <= 0`` of one regime (module docstring)."""
    if regime not in GATE_REGIMES:
        raise ValueError(f"regime must be one of {GATE_REGIMES}, got {regime!r}")
    T = _checks.count("T", T)
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(*batch, T, generator=gen, dtype=_F64)
    if regime != "mixed":
        lo, hi = _RANGES[regime]
        return lo + (hi - lo) * u
    pick = torch.randint(0, 3, (*batch, T), generator=gen)
    out = torch.empty(*batch, T, dtype=_F64)
    for i, name in enumerate(("moderate", "near_zero", "near_one")):
        lo, hi = _RANGES[name]
        out = torch.where(pick == i, lo + (hi - lo) * u, out)
    return out


def log_gate_sequences(T: int, regimes=GATE_REGIMES, batch: tuple = ()):
    """Hypothesis: ``(*batch, T)`` log gates of a drawn regime (values drawn through a seed)."""
    # checked here, when the strategy is built: a composite would only fail at the first draw
    # (and regimes="mixed" would be sampled letter by letter)
    T = _checks.count("T", T)
    regimes = _checks.choices("regimes", regimes, GATE_REGIMES)
    batch = _checks.shape("batch", batch)
    return _log_gate_sequences(T, regimes, batch)


@st.composite
def _log_gate_sequences(draw, T, regimes, batch):
    regime = draw(st.sampled_from(regimes))
    return log_gates(T, regime, seed=draw(st.integers(0, 2**31 - 1)), batch=batch)


def log_gate_values(T: int, regime: str = "moderate"):
    """Hypothesis: ``(T,)`` log gates drawn value by value (shrinkable) inside a regime's range;
    ``mixed``: each value inside the range of one of the other three."""
    T = _checks.count("T", T)
    if regime not in GATE_REGIMES:
        raise ValueError(f"regime must be one of {GATE_REGIMES}, got {regime!r}")
    return _log_gate_values(T, regime)


@st.composite
def _log_gate_values(draw, T, regime):
    if regime == "mixed":  # _RANGES has no entry for it: a KeyError at the first draw
        value = st.one_of(*[st.floats(lo, hi, allow_nan=False) for lo, hi in _RANGES.values()])
    else:
        lo, hi = _RANGES[regime]
        value = st.floats(lo, hi, allow_nan=False)
    vals = draw(st.lists(value, min_size=T, max_size=T))
    return torch.tensor(vals, dtype=_F64)


def pre_activations(regime: str = "any"):
    """Hypothesis floats z for ``gamma = phi(z)``: ``any`` in [-40, 40]; ``near_zero`` gates
    (sigmoid: z in [-45, -8]); ``near_one`` gates (z in [8, 40]); ``small`` |z| <= 1e-3
    (the balanced gate's phi -> 0)."""
    ranges = {
        "any": (-40.0, 40.0),
        "near_zero": (-45.0, -8.0),
        "near_one": (8.0, 40.0),
        "small": (-1e-3, 1e-3),
    }
    if regime not in ranges:
        raise ValueError(f"regime must be one of {tuple(ranges)}, got {regime!r}")
    lo, hi = ranges[regime]
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)
