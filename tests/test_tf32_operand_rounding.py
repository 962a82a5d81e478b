"""The tf32 contract's hypothesis on the GPU: a product with ``input_precision="tf32"`` rounds
each float32 operand to tf32 (10 explicit significand bits) to nearest, unit roundoff 2^-11
(solvers/contracts.py, ``"tf32": 2.0**-11``). Hardware or a compiler that truncated the operand
instead would err by up to 2^-10, twice the contract's unit, and every tf32 bound of the toolkit
would be too small by that factor in its operand terms. Measured here on the tensor-core paths
Triton takes (``mma`` tiles of 16 and, on Hopper, warp-group MMA tiles of 64) and on PyTorch's
cuBLAS with TF32 allowed, by multiplying operands chosen between two tf32 numbers by 1."""

from __future__ import annotations

import pytest
import torch

TF32_U = 2.0**-11  # solvers.contracts: tf32 operands rounded to nearest


def tf32_neighbours(v: torch.Tensor):
    """The tf32 numbers just below and above float32 ``v`` (> 0): its significand cut to 10 bits,
    and one tf32 spacing more."""
    bits = v.view(torch.int32)
    low = (bits & ~0x1FFF).view(torch.float32)
    high = ((bits & ~0x1FFF) + 0x2000).view(torch.float32)
    return low, high


def probe_values() -> torch.Tensor:
    """Positive float32 values at 1/8, 1/4, 3/8, ..., 7/8 of a tf32 spacing above a tf32 number,
    over several binades: round to nearest and truncation differ on the upper half."""
    base = torch.tensor([1.0, 1.5, 3.25, 0.1, 7e-3, 123.0], dtype=torch.float32)
    low, _ = tf32_neighbours(base)
    steps = torch.arange(1, 8, dtype=torch.int32) * 0x400  # eighths of 2^13 ulps
    return (low.view(torch.int32)[:, None] + steps[None, :]).view(torch.float32).flatten()


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [16, 64])
def test_triton_tf32_dot_rounds_operands_to_nearest(tile):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import triton
    import triton.language as tl

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        om, on, ok = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        a = tl.load(a_ptr + om[:, None] * K + ok[None, :])
        b = tl.load(b_ptr + ok[:, None] * N + on[None, :])
        c = tl.dot(a, b, input_precision="tf32")
        tl.store(c_ptr + om[:, None] * N + on[None, :], c)

    v = probe_values()
    M, N, K = max(tile, 64), tile, 16
    results = []
    for start in range(0, v.numel(), M):
        chunk = v[start : start + M]
        a = torch.zeros(M, K, dtype=torch.float32)
        a[: chunk.numel(), 0] = chunk
        b = torch.zeros(K, N, dtype=torch.float32)
        b[0, 0] = 1.0  # exact in tf32: C[:, 0] is A[:, 0] as the tensor core read it
        c = torch.empty(M, N, dtype=torch.float32, device="cuda")
        dot_kernel[(1,)](a.cuda(), b.cuda(), c, M=M, N=N, K=K, num_warps=4)
        results.append(c[: chunk.numel(), 0].cpu())
    got = torch.cat(results)
    low, high = tf32_neighbours(v)
    nearest = torch.where(v - low < high - v, low, high)  # no ties among the probes
    print(
        f"tile {tile}: {int((got == nearest).sum())} of {v.numel()} round to nearest, "
        f"{int((got == low).sum())} truncated"
    )
    rel = ((got.double() - v.double()).abs() / v.double()).max()
    # the contract's hypothesis: |fl_tf32(v) - v| <= 2^-11 |v| (round to nearest)
    assert float(rel) <= TF32_U, (float(rel), got, v)


@pytest.mark.gpu
def test_cublas_tf32_matmul_rounds_operands_to_nearest():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    v = probe_values()
    a = torch.zeros(v.numel(), 16, dtype=torch.float32)
    a[:, 0] = v
    b = torch.zeros(16, 16, dtype=torch.float32)
    b[0, 0] = 1.0
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        got = (a.cuda() @ b.cuda())[:, 0].cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    low, high = tf32_neighbours(v)
    nearest = torch.where(v - low < high - v, low, high)
    print(
        f"cuBLAS: {int((got == nearest).sum())} of {v.numel()} round to nearest, {int((got == low).sum())} truncated, {int((got == v).sum())} exact (no tf32)"
    )
    rel = ((got.double() - v.double()).abs() / v.double()).max()
    assert float(rel) <= TF32_U, float(rel)  # as above


def test_probe_values_separate_the_two_roundings():
    # the probes sit strictly between two tf32 numbers, half of them above the midpoint, so a
    # truncating operand fails the assertion above and a rounding one passes (checked here on
    # the CPU with both roundings emulated)
    v = probe_values()
    low, high = tf32_neighbours(v)
    assert bool(((low < v) & (v < high)).all())
    nearest = torch.where(v - low < high - v, low, high)
    assert float(((nearest.double() - v.double()).abs() / v.double()).max()) <= TF32_U
    assert float(((low.double() - v.double()).abs() / v.double()).max()) > TF32_U
