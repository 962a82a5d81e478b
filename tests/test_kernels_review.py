"""Kernels on inputs a review found mishandled: Koopman statistics whose M or Cv batch differs
from G's (read out of bounds before), r = 0 and a NaN v0; chebyshev_adaptive on D = 0 and on a
NaN in H; kernels.cg on empty systems and on right-hand sides whose ||q||^2 leaves float32."""

import dataclasses

import pytest
import torch
from kernel_support import DEVICE, needs_triton_device

import kernels
import solvers
from solvers import Status

pytestmark = needs_triton_device


def koopman_case():
    g = torch.Generator().manual_seed(0)
    z, v = torch.randn(2, 30, 5, generator=g), torch.randn(2, 30, 3, generator=g)
    st = solvers.koopman_statistics(z.to(DEVICE), v.to(DEVICE))
    return st, torch.randn(2, 4, 5, generator=g).to(DEVICE)


def test_koopman_statistics_batches_broadcast_as_the_reference_or_are_refused():
    st, zq = koopman_case()
    # M or Cv of one system for the batch: broadcast, as the reference does, i.e. bitwise the
    # readout of the statistics expanded by hand (before, the kernel read past their end)
    for name, one in (("M", st.M[:1]), ("Cv", st.Cv[:1])):
        shared = dataclasses.replace(st, **{name: one})
        expanded = dataclasses.replace(st, **{name: one.expand_as(getattr(st, name)).clone()})
        assert torch.equal(
            kernels.koopman_readout(shared, zq), kernels.koopman_readout(expanded, zq)
        )
    for name, bad in (("Cv", torch.randn(3, 3, 5)), ("M", torch.randn(3, 5, 5))):
        with pytest.raises(ValueError, match=f"stats.{name} has batch shape"):
            kernels.koopman_readout(dataclasses.replace(st, **{name: bad.to(DEVICE)}), zq)


def test_koopman_r0_is_zero_and_nan_v0_is_named():
    s = solvers.KoopmanStatistics(
        torch.zeros(2, 0, 0, device=DEVICE),
        torch.zeros(2, 0, 0, device=DEVICE),
        torch.zeros(2, 3, 0, device=DEVICE),
        torch.ones(2, dtype=torch.float64, device=DEVICE),
        1e-3,
    )
    with kernels_poisoned():
        y = kernels.koopman_readout(s, torch.zeros(2, 4, 0, device=DEVICE))
    assert y.shape == (2, 4, 3) and not y.any()
    st, zq = koopman_case()
    with pytest.raises(ValueError, match="v0 has 5 non-finite"):
        kernels.koopman_readout(st, zq, v0=torch.full((5,), float("nan"), device=DEVICE))


def kernels_poisoned():
    from analysis.testing.harness import nan_poisoned_empty

    return nan_poisoned_empty()  # an output the kernel never writes is NaN, not leftover memory


def test_chebyshev_adaptive_empty_and_nan():
    with pytest.raises(ValueError, match="zero Frobenius norm"):
        with kernels_poisoned():
            kernels.chebyshev_adaptive(
                torch.zeros(2, 0, 0, device=DEVICE),
                torch.zeros(2, 0, device=DEVICE),
                a=0.1,
                iters=2,
            )
    H = torch.eye(3, device=DEVICE).expand(2, 3, 3).clone()
    H[0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="H has 1 non-finite"):
        kernels.chebyshev_adaptive(H, torch.ones(2, 3, device=DEVICE), a=0.1, iters=3)


@pytest.mark.parametrize("factor", [2.0**67, 2.0**-84, 2.0**126])
def test_cg_kernel_scales_q_as_the_reference(factor):
    # ||f q||^2 leaves float32's range; CG is homogeneous and f a power of two, so the kernel's
    # run on f q is exactly f times its run on q (the old kernel froze at x = 0, CONVERGED)
    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64, generator=g))
    H = (Q @ torch.diag(torch.linspace(1, 10, 4, dtype=torch.float64)) @ Q.T).float().to(DEVICE)
    q = torch.randn(4, dtype=torch.float64, generator=g).float().to(DEVICE)
    x, info = kernels.cg(H, q * factor, iters=10, return_info=True)
    assert torch.equal(x / factor, kernels.cg(H, q, iters=10))
    assert info.status == Status.CONVERGED


def test_cg_kernel_empty_systems_and_callback_type():
    with kernels_poisoned():
        _, info = kernels.cg(
            torch.zeros(3, 0, 0, device=DEVICE),
            torch.zeros(3, 0, device=DEVICE),
            iters=3,
            return_info=True,
        )
    assert (info.system_status == Status.CONVERGED).all()
    with pytest.raises(TypeError, match="callback must be callable"):
        kernels.cg(torch.eye(2, device=DEVICE), torch.ones(2, device=DEVICE), iters=1, callback=3)


def test_koopman_zero_v0_and_overflowing_frobenius_norm_as_the_references():
    st, zq = koopman_case()
    for readout in (kernels.koopman_readout, solvers.koopman_readout):
        with pytest.raises(ValueError, match="v0 must be nonzero in every system"):
            readout(st, zq, v0=torch.zeros(5, device=DEVICE))
    k = torch.randn(1, 8, 4, device=DEVICE) * 1e19  # finite keys, ||H_t||_F overflows float32
    for frobenius in (kernels.chunkwise_frobenius, solvers.chunkwise_frobenius):
        with pytest.raises(ValueError, match="overflows float32"):
            frobenius(k, chunk_size=4)
