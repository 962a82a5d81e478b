"""GKA's ridge regressions (Sec. 4.1, eq. (4)): literal bf16 cases and seeded larger systems.

GKA (Sec. 4.1, eq. (CH), appendix D.2) solves at every token t

    H_t = gamma_t H_{t-1} + k_t k_t^T,   lambda_t = a ||H_t||_F,   x_t = (H_t + lambda_t I)^{-1} q_t

with decays ``gamma_t = exp(g_t)``, ``g_t <= 0`` (log space, as the paper's kernels do) and an
optional chunk initial state ``H_0``. A :class:`GKASequence` holds the keys, log-gates,
queries, cotangents ``dL/dx_t`` and ``a`` as plain tuples of bf16-representable floats
(:mod:`analysis.testing.strategies.bf16`), so that

* every working precision sees the same inputs, and the mpmath ground truth converts them
  exactly;
* a shrunk counterexample prints as a literal to paste into ``@example``.

:func:`ridge_systems` / :func:`ridge_system` (seeded, float64) build larger systems of the same
form at one token -- up to 64 unit-norm keys with a constant decay -- when the test needs size
rather than token-level structure, gates, cotangents or shrinkable literals.

Example::

    from hypothesis import given
    from analysis.testing.strategies.ridge import gka_sequences

    @given(gka_sequences(max_T=4, max_dim=3))
    def test_kappa_bound(seq):
        for t in range(seq.T):
            H = seq.H(t)                               # float64 tensor, H_t
            lam = seq.a * torch.linalg.matrix_norm(H)
            ev = torch.linalg.eigvalsh(H + lam * torch.eye(seq.D, dtype=H.dtype))
            assert ev[-1] / ev[0] <= (seq.a + 1) / seq.a * (1 + 1e-12)   # GKA eq. (4)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from solvers.ridge import RidgeSystem, gka_ridge

from . import _checks
from .bf16 import bf16_floats, bf16_vectors, to_bf16

_F64 = torch.float64

PAPER_RIDGE_STRENGTHS = (0.01, 0.02, 0.05, 0.1)  # GKA appendix K's a
RIDGE_STRENGTHS = PAPER_RIDGE_STRENGTHS + (0.5,)  # and a loose one


@dataclass(frozen=True)
class GKASequence:
    """T tokens of a GKA ridge regression (1-based token t is index t-1 of each tuple).

    keys, queries, cotangents: T tuples of D floats; log_gates: T floats ``g_t <= 0``
    (``gamma_t = exp(g_t)``); a: ridge strength; H0_keys: keys whose outer products sum to the
    initial state H_0 (empty: H_0 = 0).
    """

    keys: tuple
    log_gates: tuple
    queries: tuple
    cotangents: tuple
    a: float
    H0_keys: tuple = ()

    @property
    def T(self) -> int:
        return len(self.keys)

    @property
    def D(self) -> int:
        return len(self.keys[0])

    @property
    def gammas(self) -> tuple:
        return tuple(math.exp(g) for g in self.log_gates)

    def tensor(self, name: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """``keys``/``queries``/``cotangents`` ``(T, D)``, ``log_gates`` ``(T,)``, ``H0_keys`` ``(n, D)``."""
        data = getattr(self, name)
        if name == "H0_keys" and not data:
            return torch.zeros(0, self.D, dtype=dtype)
        return torch.tensor(data, dtype=torch.float64).to(dtype)

    def H0(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        K0 = self.tensor("H0_keys")
        return (K0.T @ K0).to(dtype)

    def H(self, t: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """``H_t`` (t = 0..T) in float64 by the recurrence, rounded once to ``dtype``."""
        H = self.H0()
        K = self.tensor("keys")
        for i in range(t):
            H = math.exp(self.log_gates[i]) * H + torch.outer(K[i], K[i])
        return H.to(dtype)


@dataclass(frozen=True)
class GKASystem:
    """One ridge system of GKA eq. (4): ``H = sum_j k_j k_j^T`` (n keys), query q, strength a."""

    keys: tuple
    q: tuple
    a: float

    @property
    def D(self) -> int:
        return len(self.q)

    def H(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        K = torch.tensor(self.keys, dtype=torch.float64)
        return (K.T @ K).to(dtype)

    def q_tensor(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return torch.tensor(self.q, dtype=torch.float64).to(dtype)


def _nonzero_rows(rows) -> bool:
    return any(any(x != 0.0 for x in r) for r in rows)


_MIN_ENTRY = 2.0**-8  # bf16_floats' default min_magnitude: the smallest nonzero entry drawn


def _entry_bound(max_entry) -> float:
    """``max_entry`` of the literal strategies: below 2^-8 every entry would be 0."""
    return _checks.real("max_entry", max_entry, low=_MIN_ENTRY)


def _bf16_at_most(x: float) -> float:
    v = to_bf16(x)
    return (
        v
        if v <= x
        else float(
            torch.nextafter(
                torch.tensor(v, dtype=torch.bfloat16), torch.tensor(0.0, dtype=torch.bfloat16)
            )
        )
    )


def gka_sequences(
    *,
    min_T: int = 1,
    max_T: int = 4,
    min_dim: int = 1,
    max_dim: int = 3,
    gated: bool = True,
    with_H0: bool = False,
    a=RIDGE_STRENGTHS,
    max_entry: float = 2.0,
    min_log_gate: float = -2.0,
):
    """Strategy: :class:`GKASequence`.

    Keys have at least one nonzero entry at token 1 (so ``||H_t||_F > 0`` and lambda_t > 0 for
    every t when there is no H_0); log-gates are in ``[min_log_gate, 0]`` (0 everywhere when
    ``gated=False``: the "no weighting" ablation); ``with_H0`` adds 1-2 keys for a chunk
    initial state H_0.
    """
    # checked when the strategy is built: min_T = 0 gave a sequence with one key and no
    # gates/queries; a <= 0 a singular system; max_entry below the smallest nonzero entry
    # (2^-8) or min_log_gate > 0 only an error or a health-check failure at the first draw
    min_T, max_T = _checks.sizes("min_T", min_T, "max_T", max_T)
    min_dim, max_dim = _checks.sizes("min_dim", min_dim, "max_dim", max_dim)
    a = _checks.ridge_strengths("a", a)
    max_entry = _entry_bound(max_entry)
    if _checks.real("min_log_gate", min_log_gate) > 0.0:
        raise ValueError(f"min_log_gate must be <= 0 (g_t <= 0), got {min_log_gate}")

    @st.composite
    def build(draw):
        T = draw(st.integers(min_T, max_T))
        D = draw(st.integers(min_dim, max_dim))
        entry = dict(min_value=-max_entry, max_value=max_entry)
        first = draw(bf16_vectors(D, **entry).filter(lambda r: _nonzero_rows([r])))
        keys = (first,) + tuple(draw(bf16_vectors(D, **entry)) for _ in range(T - 1))
        if gated:
            g = tuple(draw(bf16_floats(min_log_gate, 0.0)) for _ in range(T))
        else:
            g = (0.0,) * T
        queries = tuple(draw(bf16_vectors(D, **entry)) for _ in range(T))
        cot = tuple(draw(bf16_vectors(D, **entry)) for _ in range(T))
        H0 = ()
        if with_H0:
            n0 = draw(st.integers(1, 2))
            H0 = tuple(draw(bf16_vectors(D, **entry)) for _ in range(n0))
        return GKASequence(
            keys=keys,
            log_gates=g,
            queries=queries,
            cotangents=cot,
            a=draw(st.sampled_from(a)),
            H0_keys=H0,
        )

    return build()


def gka_systems(
    *,
    min_dim: int = 1,
    max_dim: int = 4,
    max_keys: int = 5,
    a=RIDGE_STRENGTHS,
    max_entry: float = 2.0,
):
    """Strategy: :class:`GKASystem` with 1..max_keys keys (``||H||_F > 0``), including rank-one H,
    which attains the bound of eq. (4)."""
    # min_dim = 0 gave a 1-entry key with an empty q; a <= 0 a singular system
    min_dim, max_dim = _checks.sizes("min_dim", min_dim, "max_dim", max_dim)
    max_keys = _checks.count("max_keys", max_keys, minimum=1)
    a = _checks.ridge_strengths("a", a)
    max_entry = _entry_bound(max_entry)
    # the replacement of an all-zero draw stays within +-max_entry (1.0 for max_entry >= 1)
    unit = 1.0 if max_entry >= 1.0 else _bf16_at_most(max_entry)

    @st.composite
    def build(draw):
        D = draw(st.integers(min_dim, max_dim))
        n = draw(st.integers(1, max_keys))
        entry = dict(min_value=-max_entry, max_value=max_entry)
        keys = tuple(draw(bf16_vectors(D, **entry)) for _ in range(n))
        keys = keys if _nonzero_rows(keys) else ((unit,) + (0.0,) * (D - 1),) + keys[1:]
        return GKASystem(keys=keys, q=draw(bf16_vectors(D, **entry)), a=draw(st.sampled_from(a)))

    return build()


def eigenvalue_bounds(
    *, min_kappa: float = 1.0 + 2**-6, max_kappa: float = 1e4, strict: bool = True
):
    """Strategy: ``(L, mu)`` with ``L >= mu > 0`` (``L > mu`` when ``strict``), kappa = L/mu in
    ``[min_kappa, max_kappa]``, mu a bf16 value in [2^-4, 4]: the inputs of GKA Algorithm 1."""
    # kappa < 1 gave L < mu (strict=False) or L = mu + ulp outside the range; strict with
    # max_kappa = 1 cannot have L > mu
    min_kappa, max_kappa = _checks.kappas("min_kappa", min_kappa, "max_kappa", max_kappa)
    if strict and not max_kappa > 1.0:
        raise ValueError(f"strict=True (L > mu) needs max_kappa > 1, got {max_kappa}")

    @st.composite
    def build(draw):
        mu = draw(bf16_floats(2.0**-4, 4.0, allow_zero=False))
        lo, hi = math.log2(min_kappa), math.log2(max_kappa)
        kappa = 2.0 ** draw(st.floats(lo, hi))
        L = mu * kappa
        if strict and not L > mu:
            L = math.nextafter(mu, math.inf)
        # 2 ** log2(kappa) and mu * kappa round: step L back inside the promised range of L / mu
        while L / mu > max_kappa:
            L = math.nextafter(L, 0.0)
        while L / mu < min_kappa or (strict and not L > mu):
            L = math.nextafter(L, math.inf)
        return L, mu

    return build()


# --------------------------------------------------------------------- seeded (float64)


@dataclass
class RidgeCase:
    """A GKA ridge system (eq. (4)): ``ridge.A = H + a ||H||_F I`` with L, mu; and a query q."""

    ridge: RidgeSystem
    q: torch.Tensor
    H: torch.Tensor
    seed: int


def ridge_system(D: int, a: float, *, T: int = 64, gamma: float = 1.0, seed: int = 0) -> RidgeCase:
    """GKA's regression at token T: ``H = sum_t gamma^(T-t) k_t k_t^T`` for unit-norm keys
    (GKA Sec. 4.1, "Forward Recurrence"), regularised by ``lambda = a ||H||_F`` (eq. (4));
    q a unit-norm query. gamma = 1 is the Fig. 1a generator (appendix F) at one token."""
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    # D = 0 or T = 0 failed as "H has zero Frobenius norm", naming neither
    D, T = _checks.count("D", D, minimum=1), _checks.count("T", T, minimum=1)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, D, generator=g, dtype=_F64)
    k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    w = gamma ** torch.arange(T - 1, -1, -1, dtype=_F64)
    H = torch.einsum("t,ti,tj->ij", w, k, k)
    H = 0.5 * (H + H.T)
    q = torch.randn(D, generator=g, dtype=_F64)
    return RidgeCase(ridge=gka_ridge(H, a), q=q / torch.linalg.vector_norm(q), H=H, seed=seed)


def ridge_systems(*, min_dim: int = 2, max_dim: int = 12, a=PAPER_RIDGE_STRENGTHS, max_T: int = 64):
    """Strategy: :class:`RidgeCase` of the GKA form, a drawn from ``a``, gamma in [0.8, 1]."""
    # checked when the strategy is built, not at the first draw
    min_dim, max_dim = _checks.sizes("min_dim", min_dim, "max_dim", max_dim)
    max_T = _checks.count("max_T", max_T, minimum=1)
    a = _checks.ridge_strengths("a", a)

    @st.composite
    def build(draw):
        D = draw(st.integers(min_dim, max_dim))
        T = draw(st.integers(1, max_T))
        gamma = draw(st.sampled_from((1.0, 0.99, 0.9, 0.8)))
        return ridge_system(
            D, draw(st.sampled_from(a)), T=T, gamma=gamma, seed=draw(st.integers(0, 2**31 - 1))
        )

    return build()


__all__ = [
    "GKASequence",
    "GKASystem",
    "PAPER_RIDGE_STRENGTHS",
    "RIDGE_STRENGTHS",
    "RidgeCase",
    "eigenvalue_bounds",
    "gka_sequences",
    "gka_systems",
    "ridge_system",
    "ridge_systems",
]
