"""Koopman (Echo SKA) test data shared by the reference and kernel tests."""

import torch

F64 = torch.float64


def ar1_data(T=24, r=6, P=3, Q=4, batch=(), seed=0, dyn=0.8):
    """Keys with AR(1) dynamics and uneven norms, Gaussian values and queries (float64)."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(*batch, T, r, generator=g, dtype=F64)
    z = e.clone()
    for t in range(1, T):
        z[..., t, :] = dyn * z[..., t - 1, :] + e[..., t, :]
    z = z * (0.3 + torch.rand(*batch, T, 1, generator=g, dtype=F64))
    v = torch.randn(*batch, T, P, generator=g, dtype=F64)
    zq = torch.randn(*batch, Q, r, generator=g, dtype=F64)
    return z, v, zq
