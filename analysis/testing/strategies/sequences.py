"""Key / value / query sequences for KLA and GDN, and consistent systems for Kaczmarz.

Deterministic builders (``kla_case``, ``consistent_system``) take a seed; the hypothesis
strategies (``kla_cases``, ``consistent_systems``) draw the parameters that matter for the
numerics -- sequence length vs chunk size, head dimensions (d_k != d_v), key norms over decades
including near-zero and exactly-zero keys, per-head or per-channel decay, the gate range, eps --
and a seed, then call the builders. Everything is float64; ``KLACase.rounded(dtype)`` gives the
inputs as a working precision stores them.

Zero keys come with zero values, so a case is valid for every eps (solvers.kla: a zero key
with a nonzero value and eps = 0 is an inconsistent constraint and an error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from hypothesis import strategies as st

from solvers.kla import COEFFICIENTS, nonnegative

from . import _checks

_F64 = torch.float64
_seeds = st.integers(min_value=0, max_value=2**31 - 1)


@dataclass
class KLACase:
    """One KLA / GDN input sequence in the solvers' layout (``(B, T, H, d)``), float64."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    alpha: torch.Tensor  # (B, T, H) per head or (B, T, H, d_k) per channel
    eta: torch.Tensor  # (B, T, H)
    initial_state: torch.Tensor  # (B, H, d_k, d_v)
    eps: float
    chunk_size: int
    coefficient: str
    seed: int

    @property
    def T(self) -> int:
        return self.k.shape[-3]

    @property
    def per_channel(self) -> bool:
        return self.alpha.ndim == self.k.ndim

    def rounded(self, dtype: torch.dtype) -> dict:
        """q, k, v, alpha, eta, initial_state as stored in ``dtype``."""
        names = ("q", "k", "v", "alpha", "eta", "initial_state")
        return {n: getattr(self, n).to(dtype) for n in names}

    def kwargs(self, dtype: torch.dtype, bf16_mode: str = "storage") -> dict:
        """Keyword arguments of ``solvers.kla_recurrent`` (add ``chunk_size`` for the chunk form)."""
        x = self.rounded(dtype)
        return dict(
            alpha=x["alpha"],
            eta=x["eta"],
            eps=self.eps,
            initial_state=x["initial_state"],
            coefficient=self.coefficient,
            bf16_mode=bf16_mode,
        )


def _log_uniform(shape, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    lo_l, hi_l = torch.log(torch.tensor(lo, dtype=_F64)), torch.log(torch.tensor(hi, dtype=_F64))
    return torch.exp(lo_l + (hi_l - lo_l) * torch.rand(shape, generator=g, dtype=_F64))


def _directions(shape, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=g, dtype=_F64)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-300)


def kla_case(
    T: int = 12,
    *,
    B: int = 1,
    H: int = 2,
    d_k: int = 6,
    d_v: int = 4,
    key_norms=(0.3, 3.0),
    near_zero_keys: int = 0,
    zero_keys: int = 0,
    value_scale: float = 1.0,
    query_norms=(0.5, 2.0),
    per_channel: bool = False,
    alpha=(0.6, 1.0),
    eta=(0.1, 1.0),
    eps: float = 1e-6,
    coefficient: str = "kaczmarz",
    state_scale: float = 1.0,
    chunk_size: int = 4,
    seed: int = 0,
) -> KLACase:
    """A sequence with controlled norms.

    Keys: random directions, norms log-uniform in ``key_norms``; ``near_zero_keys`` tokens (per
    batch member and head, at random positions) get norms log-uniform in [1e-4, 1e-2] and
    ``zero_keys`` further tokens k = 0 (with v = 0). Values: Gaussian times ``value_scale``;
    queries: norms log-uniform in ``query_norms``; alpha uniform in ``alpha`` (per head or per
    channel), eta uniform in ``eta``; the initial state Gaussian times ``state_scale``."""
    # these gave a case silently outside its description (or one the solvers reject later):
    # T = 0, a norm range through 0, an unknown coefficient, eps < 0
    T = _checks.count("T", T, minimum=1)
    for name, n in (("B", B), ("H", H), ("d_k", d_k), ("d_v", d_v), ("chunk_size", chunk_size)):
        _checks.count(name, n, minimum=1)
    # more special keys than tokens is clipped to T (tests/test_kernels_kla.py relies on it)
    near_zero_keys = _checks.count("near_zero_keys", near_zero_keys)
    zero_keys = _checks.count("zero_keys", zero_keys)
    for name, (lo, hi) in (("key_norms", key_norms), ("query_norms", query_norms)):
        _checks.real(f"{name}[0]", lo, low=0.0, low_open=True)
        _checks.ordered(f"{name}[0]", lo, f"{name}[1]", _checks.real(f"{name}[1]", hi))
    if coefficient not in COEFFICIENTS:
        raise ValueError(f"coefficient must be one of {COEFFICIENTS}, got {coefficient!r}")
    nonnegative("eps", eps)
    g = torch.Generator().manual_seed(seed)
    k = _directions((B, T, H, d_k), g) * _log_uniform((B, T, H, 1), *key_norms, g)
    v = torch.randn(B, T, H, d_v, generator=g, dtype=_F64) * value_scale
    special = torch.rand(B, H, T, generator=g).argsort(-1)  # random token order per (batch, head)
    for n in range(B):
        for h in range(H):
            tiny = special[n, h, :near_zero_keys]
            k[n, tiny, h] = _directions((len(tiny), d_k), g) * _log_uniform(
                (len(tiny), 1), 1e-4, 1e-2, g
            )
            zero = special[n, h, near_zero_keys : near_zero_keys + zero_keys]
            k[n, zero, h] = 0.0
            v[n, zero, h] = 0.0
    q = _directions((B, T, H, d_k), g) * _log_uniform((B, T, H, 1), *query_norms, g)
    a_shape = (B, T, H, d_k) if per_channel else (B, T, H)
    a = alpha[0] + (alpha[1] - alpha[0]) * torch.rand(a_shape, generator=g, dtype=_F64)
    e = eta[0] + (eta[1] - eta[0]) * torch.rand(B, T, H, generator=g, dtype=_F64)
    S0 = torch.randn(B, H, d_k, d_v, generator=g, dtype=_F64) * state_scale
    return KLACase(
        q=q,
        k=k,
        v=v,
        alpha=a,
        eta=e,
        initial_state=S0,
        eps=eps,
        chunk_size=chunk_size,
        coefficient=coefficient,
        seed=seed,
    )


def kla_cases(
    *,
    max_T: int = 16,
    max_d: int = 8,
    max_heads: int = 2,
    coefficients: Sequence[str] = ("kaczmarz",),
    eps_choices: Sequence[float] = (0.0, 1e-6, 1e-2),
    near_zero: bool = True,
    zero: bool = True,
    per_channel: Optional[bool] = None,
    max_chunk: int = 8,
):
    """Strategy: :class:`KLACase` with T in [1, max_T], d_k, d_v in [1, max_d] drawn
    independently, chunk sizes in [1, max_chunk] (T % C != 0 included), key norms spanning
    decades (lowest 10^-2..1, highest up to 10), optionally near-zero and zero keys, decay per
    head or per channel. GDN cases get unit-norm keys (its coefficient is not normalised, so
    ``beta ||k||^2 <= 1`` keeps the recurrence non-expansive as in practice)."""
    # checked when the strategy is built; coefficients="gdn" was sampled letter by letter and
    # unknown coefficients or eps < 0 were drawn silently
    max_T, max_d = (
        _checks.count("max_T", max_T, minimum=1),
        _checks.count("max_d", max_d, minimum=1),
    )
    max_heads = _checks.count("max_heads", max_heads, minimum=1)
    max_chunk = _checks.count("max_chunk", max_chunk, minimum=1)
    coefficients = _checks.choices("coefficients", coefficients, COEFFICIENTS)
    eps_choices = _checks.choices("eps_choices", eps_choices)
    for e in eps_choices:
        nonnegative("eps_choices entry", e)

    @st.composite
    def build(draw):
        T = draw(st.integers(1, max_T))
        coefficient = draw(st.sampled_from(tuple(coefficients)))
        lo = 10.0 ** draw(st.floats(-2.0, 0.0))
        hi = lo * 10.0 ** draw(st.floats(0.0, 1.0))
        key_norms = (1.0, 1.0) if coefficient == "gdn" else (lo, hi)
        n_tiny = draw(st.integers(0, T // 3)) if near_zero and coefficient != "gdn" else 0
        n_zero = draw(st.integers(0, min(2, T - n_tiny))) if zero else 0
        a_lo = draw(st.sampled_from((0.05, 0.5, 0.9)))
        return kla_case(
            T,
            H=draw(st.integers(1, max_heads)),
            d_k=draw(st.integers(1, max_d)),
            d_v=draw(st.integers(1, max_d)),
            key_norms=key_norms,
            near_zero_keys=n_tiny,
            zero_keys=n_zero,
            per_channel=draw(st.booleans()) if per_channel is None else per_channel,
            alpha=(a_lo, 1.0),
            eta=(draw(st.sampled_from((0.0, 0.5))), 1.0),
            eps=draw(st.sampled_from(tuple(eps_choices))),
            coefficient=coefficient,
            chunk_size=draw(st.integers(1, max_chunk)),
            seed=draw(_seeds),
        )

    return build()


@dataclass
class KaczmarzSystem:
    """A consistent ``A x = b`` (float64): ``A (*batch, m, n)`` of full rank, ``b = A x_star`` as
    computed in float64 -- consistent up to ``u |A| |x_star|`` (tests that compare with x_star
    account for that; ``analysis.verification.kaczmarz.integer_system`` is exactly consistent)."""

    A: torch.Tensor
    b: torch.Tensor
    x_star: torch.Tensor
    seed: int

    @property
    def kappa(self) -> torch.Tensor:
        """2-norm condition number ``sigma_max / sigma_min`` of A."""
        s = torch.linalg.svdvals(self.A)
        return s[..., 0] / s[..., -1]


def consistent_system(
    m: int,
    n: int,
    *,
    kappa: float = 10.0,
    row_scales=(1.0, 1.0),
    batch: Sequence[int] = (),
    seed: int = 0,
) -> KaczmarzSystem:
    """``A = U diag(sigma) V^T`` with sigma log-spaced from 1 to 1/kappa (Haar U, V), then row i
    scaled by a factor log-uniform in ``row_scales`` (unequal row norms make norm-weighted
    sampling matter; they change the condition number, which :attr:`KaczmarzSystem.kappa`
    re-measures). ``x_star`` Gaussian, ``b = A x_star``."""
    # kappa < 1 or a row scale <= 0 (NaN rows) gave a system unlike its description, silently
    m, n = _checks.count("m", m, minimum=1), _checks.count("n", n, minimum=1)
    kappa = _checks.real("kappa", kappa, low=1.0)
    lo = _checks.real("row_scales[0]", row_scales[0], low=0.0, low_open=True)
    _checks.ordered(
        "row_scales[0]", lo, "row_scales[1]", _checks.real("row_scales[1]", row_scales[1])
    )
    g = torch.Generator().manual_seed(seed)
    r = min(m, n)
    U, _ = torch.linalg.qr(torch.randn(*batch, m, r, generator=g, dtype=_F64))
    V, _ = torch.linalg.qr(torch.randn(*batch, n, r, generator=g, dtype=_F64))
    sigma = (
        torch.logspace(0.0, -torch.log10(torch.tensor(kappa, dtype=_F64)).item(), r, dtype=_F64)
        if r > 1
        else torch.ones(r, dtype=_F64)
    )
    A = (U * sigma) @ V.transpose(-1, -2)
    A = A * _log_uniform((*batch, m, 1), *row_scales, g)
    x = torch.randn(*batch, n, generator=g, dtype=_F64)
    return KaczmarzSystem(A=A, b=(A @ x.unsqueeze(-1)).squeeze(-1), x_star=x, seed=seed)


def consistent_systems(
    *,
    max_m: int = 12,
    max_n: int = 8,
    max_kappa: float = 1e2,
    tall: Optional[bool] = None,
    max_row_scale: float = 10.0,
):
    """Strategy: :class:`KaczmarzSystem`, tall (m >= n, unique solution) or wide (m < n),
    kappa up to ``max_kappa``, row-norm spread up to ``max_row_scale``."""
    # checked when the strategy is built; max_m < max_n gave tall systems with m > max_m
    max_m, max_n = (
        _checks.count("max_m", max_m, minimum=1),
        _checks.count("max_n", max_n, minimum=1),
    )
    max_kappa = _checks.real("max_kappa", max_kappa, low=1.0)
    _checks.real("max_row_scale", max_row_scale, low=1.0)
    if tall is False and max_n < 2:
        raise ValueError(f"wide systems (m < n) need max_n >= 2, got max_n={max_n}")
    if tall is None and max_n < 2:
        raise ValueError(f"max_n must be >= 2 for wide systems; pass tall=True, got max_n={max_n}")

    @st.composite
    def build(draw):
        is_tall = draw(st.booleans()) if tall is None else tall
        if is_tall:
            n = draw(st.integers(1, min(max_n, max_m)))
            m = draw(st.integers(n, max(n, max_m)))
        else:
            m = draw(st.integers(1, min(max_m, max_n - 1)))
            n = draw(st.integers(m + 1, max_n))
        kappa = _checks.clamp(10.0 ** draw(st.floats(0.0, math.log10(max_kappa))), 1.0, max_kappa)
        spread = draw(st.floats(1.0, max_row_scale))
        return consistent_system(
            m, n, kappa=kappa, row_scales=(1.0 / spread, 1.0), seed=draw(_seeds)
        )

    return build()


__all__ = [
    "KLACase",
    "KaczmarzSystem",
    "consistent_system",
    "consistent_systems",
    "kla_case",
    "kla_cases",
]
