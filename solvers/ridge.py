"""The GKA ridge setting: adaptive regularisation (GKA eq. (4)) and the Fig. 1a problems.

``lambda = a ||H||_F``, ``L = ||H||_F + lambda``, ``mu = lambda``; then every eigenvalue of
``H + lambda I`` lies in ``[mu, L]`` and ``kappa <= (a + 1)/a`` (eq. (4)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import validation as check


@dataclass
class RidgeSystem:
    """``A = H + lambda I`` with the eigenvalue bounds GKA feeds Algorithm 1 (eq. (4)).

    A: ``(..., D, D)`` in H's dtype (formed in float64, rounded once).
    lam, L, mu: float64 ``batch``-shaped tensors; ``kappa_bound = (a + 1)/a``.
    """

    A: torch.Tensor
    lam: torch.Tensor
    L: torch.Tensor
    mu: torch.Tensor
    a: float

    @property
    def kappa_bound(self) -> float:
        return (self.a + 1.0) / self.a


def gka_ridge(H, a: float) -> RidgeSystem:
    """``H + a ||H||_F I`` and ``L = ||H||_F (1 + a)``, ``mu = a ||H||_F`` (GKA eq. (4)).

    H must be symmetric positive semidefinite with ``||H||_F > 0`` (a zero H would make
    lambda = 0 and the system singular).
    """
    H = check.square_matrix("H", H)
    check.has_values("H", H, "the ridge shift (its zero-norm check)")
    a = check.ridge_strength(a)
    H64 = H.to(torch.float64)
    fro = torch.linalg.matrix_norm(H64, ord="fro")
    if fro.numel() and not bool((fro > 0).all()):
        raise ValueError("H has zero Frobenius norm in some system: lambda = a ||H||_F would be 0")
    lam = a * fro
    eye = torch.eye(H.shape[-1], dtype=torch.float64, device=H.device)
    A = (H64 + lam[..., None, None] * eye).to(H.dtype)
    return RidgeSystem(A=A, lam=lam, L=fro + lam, mu=lam, a=a)


@dataclass
class Fig1aProblems:
    """Synthetic regression problems of GKA Fig. 1a (appendix F), shape ``(B, T, Hh, D, D)``.

    A: Frobenius-normalised cumulative key covariance plus ``a I``; spectrum in ``[a, 1 + a]``.
    q: unit-norm queries. L = 1 + a, mu = a (eq. (4) with ||H||_F = 1).
    """

    A: torch.Tensor
    q: torch.Tensor
    L: float
    mu: float
    a: float

    def to(self, dtype: torch.dtype) -> "Fig1aProblems":
        """The same problems rounded once to ``dtype``."""
        return Fig1aProblems(self.A.to(dtype), self.q.to(dtype), self.L, self.mu, self.a)


def fig1a_problems(
    B: int = 2,
    T: int = 64,
    heads: int = 2,
    D: int = 32,
    *,
    a: float = 0.02,
    seed: int = 0,
    device: Optional[torch.device] = None,
) -> Fig1aProblems:
    """GKA appendix F's generator: normalised keys and queries, cumulative key covariances
    normalised by their Frobenius norm, ridge ``a`` added to the diagonal.

    Differs from the printed snippet only in that everything is generated in float64 (with a
    seeded generator) and rounded once by :meth:`Fig1aProblems.to`, so all precisions solve the
    same problems. The paper's scale is ``B, T, heads, D = 8, 2048, 8, 128``.
    """
    for name, n in (("B", B), ("T", T), ("heads", heads), ("D", D)):
        check.count(name, n, minimum=1)
    a = check.ridge_strength(a)
    # torch.Generator.manual_seed's range; a wrong type is named here, not deep inside torch
    seed = check.count("seed", seed, minimum=-(2**63))
    if seed >= 2**64:
        raise ValueError(f"seed must be < 2**64, got {seed}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randn(B, T, heads, D, generator=g, dtype=torch.float64)
    q = torch.randn(B, T, heads, D, generator=g, dtype=torch.float64)
    k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    q = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True)
    kk = torch.einsum("...i,...j->...ij", k, k).cumsum(1)
    kk = kk / torch.linalg.matrix_norm(kk, ord="fro")[..., None, None]
    kk = kk + a * torch.eye(D, dtype=torch.float64)
    if device is not None:
        kk, q = kk.to(device), q.to(device)
    return Fig1aProblems(A=kk, q=q, L=1.0 + a, mu=a, a=a)
