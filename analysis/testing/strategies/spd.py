"""SPD test systems with a prescribed spectrum.

Deterministic builders (``spectrum``, ``spd_matrix``, ``spd_system``; ``log_uniform_spd`` for a
batch drawn from a generator) take a seed, so the
verification table and the figures are reproducible; the hypothesis strategies (``spectra``,
``spd_matrices``, ``spd_systems``) draw their parameters and a seed and call the builders.
GKA's ridge systems (eq. (4)) are in :mod:`analysis.testing.strategies.ridge`.

Everything is float64: ``H = Q diag(lambda) Q^T`` with Haar-random orthogonal ``Q``
(QR of a Gaussian with the signs of R's diagonal fixed), symmetrised exactly. The returned
``eigenvalues`` are the prescribed ones; those of the float64 ``H`` differ by ~1e-16 ||H||,
and those of ``H`` rounded to a working dtype by up to ``u ||H||_F`` -- ground truth
(``analysis.references.iterative``) always re-measures the stored matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from hypothesis import strategies as st

from . import _checks

SPECTRUM_KINDS = ("geometric", "clustered", "outliers")
_F64 = torch.float64


def spectrum(
    D: int, kappa: float, kind: str = "geometric", *, lam_max: float = 1.0, seed: int = 0
) -> torch.Tensor:
    """D eigenvalues in ``[lam_max / kappa, lam_max]``, both ends attained (ascending).

    geometric: log-uniformly spaced; clustered: half at each end, within a factor 1.1
    (hard for CG's bound, easy for CG); outliers: one eigenvalue at each end, the rest
    log-uniform random inside ``[lam_min, lam_max]`` (a few outliers, as in attention
    covariances). D = 1 gives ``[lam_max]`` (kappa must then be 1).
    """
    if kind not in SPECTRUM_KINDS:
        raise ValueError(f"kind must be one of {SPECTRUM_KINDS}, got {kind!r}")
    D = _checks.count("D", D, minimum=1)
    # kappa = inf gave NaN eigenvalues, lam_max <= 0 a spectrum that is not positive, and
    # D = 1 with kappa > 1 silently kappa 1
    kappa = _checks.real("kappa", kappa, low=1.0)
    lam_max = _checks.real("lam_max", lam_max, low=0.0, low_open=True)
    if D == 1 and kappa != 1.0:
        raise ValueError(f"a 1x1 spectrum has kappa 1: D = 1 needs kappa = 1, got {kappa}")
    if D == 1:
        return torch.tensor([lam_max], dtype=_F64)
    lo = lam_max / kappa
    if kind == "geometric":
        lam = torch.logspace(0.0, 1.0, D, base=float(kappa), dtype=_F64) * lo
    elif kind == "clustered":
        g = torch.Generator().manual_seed(seed)
        spread = 1.0 + 0.1 * torch.rand(D, generator=g, dtype=_F64)
        half = D // 2
        lam = torch.cat([lo * spread[:half], lam_max / spread[half:]])
    else:
        g = torch.Generator().manual_seed(seed)
        inner = torch.exp(
            torch.rand(D - 2, generator=g, dtype=_F64)
            * torch.log(torch.tensor(float(kappa), dtype=_F64))
        )
        lam = torch.cat([torch.tensor([lo, lam_max], dtype=_F64), lo * inner])
    lam, _ = torch.sort(
        torch.clamp(lam, lo, lam_max)
    )  # clusters wider than [lo, lam_max] at kappa < 1.1
    lam[0], lam[-1] = lo, lam_max  # the prescribed ends exactly
    return lam


def haar_orthogonal(
    D: int, *, seed: int = 0, batch: Sequence[int] = (), generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    """Haar-distributed orthogonal ``(*batch, D, D)`` in float64 (QR of a Gaussian, the signs of
    R's diagonal fixed), drawn from ``generator`` (on its device) or a fresh one seeded ``seed``."""
    D = _checks.count("D", D, minimum=1)
    g = torch.Generator().manual_seed(seed) if generator is None else generator
    Z = torch.randn(*batch, D, D, generator=g, dtype=_F64, device=g.device)
    Q, R = torch.linalg.qr(Z)
    return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


def log_uniform_spd(
    D: int, n: int, kappa: float, scale: float, generator: torch.Generator
) -> torch.Tensor:
    """n matrices ``Q diag(lam) Q^T`` ``(n, D, D)``, float64, on ``generator``'s device: spectrum
    in ``[scale/kappa, scale]`` with both ends attained and the rest log-uniform, Haar ``Q``.
    The kernel harness's SPD problems (``analysis.testing.harness.spd_case``) and the report's
    kernel rows are drawn here, so a failing case can be rebuilt from its seed."""
    # kappa < 1 or scale <= 0 gave matrices that are not SPD in the promised range, silently
    D, n = _checks.count("D", D, minimum=1), _checks.count("n", n, minimum=0)
    _checks.real("kappa", kappa, low=1.0)
    _checks.real("scale", scale, low=0.0, low_open=True)
    Q = haar_orthogonal(D, batch=(n,), generator=generator)
    t = torch.rand(n, D, dtype=_F64, generator=generator, device=generator.device)
    if D >= 2:
        t[:, 0], t[:, 1] = 0.0, 1.0
    lam = scale * kappa ** (t - 1.0)
    H = (Q * lam.unsqueeze(-2)) @ Q.transpose(-1, -2)
    return (H + H.transpose(-1, -2)) / 2


def spd_matrix(eigenvalues: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    """``Q diag(eigenvalues) Q^T`` (float64, exactly symmetric) for Haar ``Q``."""
    lam = eigenvalues.to(_F64)
    # eigenvalues <= 0 (or NaN) gave a matrix that is not SPD, silently
    if lam.ndim < 1 or lam.shape[-1] < 1:
        raise ValueError(f"eigenvalues must have a last dimension >= 1, got {tuple(lam.shape)}")
    if not bool((torch.isfinite(lam) & (lam > 0)).all()):
        raise ValueError("eigenvalues must be finite and > 0 (an SPD matrix)")
    Q = haar_orthogonal(lam.shape[-1], seed=seed, batch=lam.shape[:-1])
    H = (Q * lam.unsqueeze(-2)) @ Q.transpose(-1, -2)
    return 0.5 * (H + H.transpose(-1, -2))


@dataclass
class SPDSystem:
    """``H x = q`` with the spectrum of H prescribed; ``L``, ``mu`` = its extreme eigenvalues."""

    H: torch.Tensor
    q: torch.Tensor
    eigenvalues: torch.Tensor
    kind: str
    seed: int

    @property
    def L(self) -> float:
        return float(self.eigenvalues[..., -1].max())

    @property
    def mu(self) -> float:
        return float(self.eigenvalues[..., 0].min())

    @property
    def kappa(self) -> float:
        return self.L / self.mu

    @property
    def D(self) -> int:
        return self.H.shape[-1]


def spd_system(
    D: int, kappa: float, kind: str = "geometric", *, seed: int = 0, lam_max: float = 1.0
) -> SPDSystem:
    """An SPD system with ``spectrum(D, kappa, kind)`` and a unit-norm Gaussian ``q``."""
    lam = spectrum(D, kappa, kind, lam_max=lam_max, seed=seed)
    H = spd_matrix(lam, seed=seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    q = torch.randn(D, generator=g, dtype=_F64)
    return SPDSystem(H=H, q=q / torch.linalg.vector_norm(q), eigenvalues=lam, kind=kind, seed=seed)


def spd_batch(systems: Sequence[SPDSystem], dtype: torch.dtype = _F64):
    """Systems as one batch: ``(H, q)`` stacked and rounded once to ``dtype``, and their
    ``L``, ``mu`` as float64 ``(len(systems),)`` tensors."""
    if not len(systems):
        raise ValueError("systems must not be empty")
    H = torch.stack([s.H for s in systems]).to(dtype)
    q = torch.stack([s.q for s in systems]).to(dtype)
    L = torch.tensor([s.L for s in systems], dtype=_F64)
    mu = torch.tensor([s.mu for s in systems], dtype=_F64)
    return H, q, L, mu


# --------------------------------------------------------------------- hypothesis


def _arguments(min_dim, max_dim, min_kappa, max_kappa, kinds):
    """The strategies' options, checked when the strategy is built (not at the first draw)."""
    min_dim, max_dim = _checks.sizes("min_dim", min_dim, "max_dim", max_dim)
    min_kappa, max_kappa = _checks.kappas("min_kappa", min_kappa, "max_kappa", max_kappa)
    kinds = _checks.choices("kinds", kinds, SPECTRUM_KINDS)
    return min_dim, max_dim, min_kappa, max_kappa, kinds


_seeds = st.integers(min_value=0, max_value=2**31 - 1)


def spectra(*, min_dim: int = 2, max_dim: int = 12, max_kappa: float = 1e4, kinds=SPECTRUM_KINDS):
    """Strategy: ``(eigenvalues, kind)`` with D in [min_dim, max_dim], kappa in [1, max_kappa]
    (log-uniform-ish: hypothesis draws the exponent). D = 1 has kappa 1."""
    min_dim, max_dim, _, max_kappa, kinds = _arguments(min_dim, max_dim, 1.0, max_kappa, kinds)

    @st.composite
    def build(draw):
        D = draw(st.integers(min_dim, max_dim))
        kappa = _checks.clamp(10.0 ** draw(st.floats(0.0, math.log10(max_kappa))), 1.0, max_kappa)
        kind = draw(st.sampled_from(kinds))
        return spectrum(D, kappa if D > 1 else 1.0, kind, seed=draw(_seeds)), kind

    return build()


def spd_matrices(
    *, min_dim: int = 2, max_dim: int = 12, max_kappa: float = 1e4, kinds=SPECTRUM_KINDS
):
    """Strategy: ``(H, eigenvalues)``, float64 ``H = Q diag(lambda) Q^T``."""
    _arguments(min_dim, max_dim, 1.0, max_kappa, kinds)  # at call time, as spectra does

    @st.composite
    def build(draw):
        lam, _ = draw(spectra(min_dim=min_dim, max_dim=max_dim, max_kappa=max_kappa, kinds=kinds))
        return spd_matrix(lam, seed=draw(_seeds)), lam

    return build()


def spd_systems(
    *,
    min_dim: int = 2,
    max_dim: int = 12,
    min_kappa: float = 1.0,
    max_kappa: float = 1e4,
    kinds=SPECTRUM_KINDS,
):
    """Strategy: :class:`SPDSystem` with kappa in [min_kappa, max_kappa]."""
    min_dim, max_dim, min_kappa, max_kappa, kinds = _arguments(
        min_dim, max_dim, min_kappa, max_kappa, kinds
    )
    if min_dim == 1 and min_kappa > 1.0:  # a 1x1 system has kappa 1, outside the range
        raise ValueError(f"min_dim = 1 needs min_kappa = 1 (D = 1 has kappa 1), got {min_kappa}")

    @st.composite
    def build(draw):
        D = draw(st.integers(min_dim, max_dim))
        # float64 logarithms (the float32 torch.log10 of a Python float put kappa up to 1e-7
        # relative outside the range), and 10 ** log10 rounds: clamp into the range
        lo, hi = math.log10(min_kappa), math.log10(max_kappa)
        kappa = _checks.clamp(10.0 ** draw(st.floats(lo, hi)), min_kappa, max_kappa)
        return spd_system(D, kappa, draw(st.sampled_from(kinds)), seed=draw(_seeds))

    return build()


__all__ = [
    "SPDSystem",
    "SPECTRUM_KINDS",
    "haar_orthogonal",
    "log_uniform_spd",
    "spd_batch",
    "spd_matrices",
    "spd_matrix",
    "spd_system",
    "spd_systems",
    "spectra",
    "spectrum",
]
