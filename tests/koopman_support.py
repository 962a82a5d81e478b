"""Koopman (Echo SKA) test data shared by the reference and kernel tests."""

import torch

from analysis.testing.koopman_strategy import koopman_sequences

F64 = torch.float64


def ar1_data(T=24, r=6, P=3, Q=4, batch=(), seed=0, dyn=0.8):
    """Keys with AR(1) dynamics and uneven norms, Gaussian values and queries (float64): the
    harness's Koopman cases (``analysis.testing.koopman_strategy.koopman_sequences``)."""
    return koopman_sequences(T, r, P, Q, batch=batch, dyn=dyn, seed=seed)
