"""GKA layer inputs for tests: one or a few sequences ``q, k (…, T, D)``, ``v (…, T, Dv)``,
log gates ``g`` and input gates ``beta (…, T)`` (GKA eq. (CH), appendix eq. (55)).

Keys and queries are Gaussian; ``beta`` is uniform in [0.2, 1] (a sigmoid output bounded away
from 0, so that no H_t vanishes); gates come from ``analysis.testing.strategies.gates``. float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from hypothesis import strategies as st

from solvers.validation import ridge_strength

from . import _checks
from .gates import GATE_REGIMES, log_gates

_F64 = torch.float64


@dataclass
class GKACase:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: Optional[torch.Tensor]
    beta: Optional[torch.Tensor]
    a: float

    def to(self, dtype: torch.dtype) -> "GKACase":
        """The same inputs rounded once to ``dtype``."""
        cv = lambda x: None if x is None else x.to(dtype)  # noqa: E731
        return GKACase(cv(self.q), cv(self.k), cv(self.v), cv(self.g), cv(self.beta), self.a)

    def kwargs(self) -> dict:
        return {"a": self.a, "g": self.g, "beta": self.beta}


def gka_case(
    T: int = 8,
    D: int = 5,
    Dv: int = 4,
    *,
    a: float = 0.1,
    regime: Optional[str] = "moderate",
    with_beta: bool = True,
    batch: tuple = (),
    seed: int = 0,
) -> GKACase:
    """A deterministic case; ``regime=None`` gives no decay gate (gamma = 1)."""
    # a <= 0 or an empty size would build a case no GKA layer accepts, silently
    T, D, Dv = (
        _checks.count("T", T, minimum=1),
        _checks.count("D", D, minimum=1),
        _checks.count("Dv", Dv, minimum=1),
    )
    a = ridge_strength(a)
    batch = _checks.shape("batch", batch)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, T, D, generator=gen, dtype=_F64)
    k = torch.randn(*batch, T, D, generator=gen, dtype=_F64)
    v = torch.randn(*batch, T, Dv, generator=gen, dtype=_F64)
    beta = 0.2 + 0.8 * torch.rand(*batch, T, generator=gen, dtype=_F64) if with_beta else None
    g = None if regime is None else log_gates(T, regime, seed=seed + 1, batch=batch)
    return GKACase(q, k, v, g, beta, a)


def gka_cases(
    max_T: int = 6,
    max_D: int = 4,
    regimes=GATE_REGIMES + (None,),
    a_range=(0.05, 1.0),
    batch: tuple = (),
):
    """Hypothesis: a :class:`GKACase` with drawn sizes, ridge strength, gate regime and seed."""
    # checked when the strategy is built (a composite fails only at the first draw, and
    # a_range=(-1, 1) or (0, 1) would silently draw ridge strengths a <= 0)
    max_T, max_D = (
        _checks.count("max_T", max_T, minimum=1),
        _checks.count("max_D", max_D, minimum=1),
    )
    regimes = _checks.choices("regimes", regimes, GATE_REGIMES + (None,))
    if isinstance(a_range, (str, bytes)) or len(a_range) != 2:
        raise TypeError(f"a_range must be a pair (low, high), got {a_range!r}")
    lo = _checks.real("a_range[0]", a_range[0], low=0.0, low_open=True)
    hi = _checks.real("a_range[1]", a_range[1], low=0.0, low_open=True)
    _checks.ordered("a_range[0]", lo, "a_range[1]", hi)
    return _gka_cases(max_T, max_D, regimes, (lo, hi), _checks.shape("batch", batch))


@st.composite
def _gka_cases(draw, max_T, max_D, regimes, a_range, batch):
    T = draw(st.integers(1, max_T))
    D = draw(st.integers(1, max_D))
    Dv = draw(st.integers(1, max_D))
    a = draw(st.floats(*a_range))
    regime = draw(st.sampled_from(regimes))
    return gka_case(
        T,
        D,
        Dv,
        a=a,
        regime=regime,
        with_beta=draw(st.booleans()),
        batch=batch,
        seed=draw(st.integers(0, 2**31 - 1)),
    )
