"""The tf32 contract's hypothesis on the GPU: a product with ``input_precision="tf32"`` cuts
each float32 operand to tf32 (10 explicit significand bits) within the contract's unit
(solvers/contracts.py, ``OPERAND_ROUNDOFF["tf32"]``). Measured on the tensor-core paths Triton
takes (``mma`` tiles of 16 and, on Hopper, warp-group MMA tiles of 64) and on PyTorch's cuBLAS
with TF32 allowed, by multiplying operands chosen between two tf32 numbers by 1. On an H100
(run 35, docs/validation.md) Triton truncated every operand and cuBLAS rounded to nearest: a
unit of 2^-11 (round to nearest), which the contract had, was exceeded by Triton, so the
contract's tf32 unit is one spacing, 2^-10, which covers both."""

from __future__ import annotations

import math

import pytest
import torch

from solvers.contracts import OPERAND_ROUNDOFF

TF32_U = OPERAND_ROUNDOFF["tf32"]  # solvers.contracts: truncation or round to nearest
RN_U = 2.0**-11  # round to nearest: half a spacing


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
def test_triton_tf32_dot_operands_within_the_contract(tile):
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
    # the contract's hypothesis: |fl_tf32(v) - v| <= u |v| (one spacing: truncation covered)
    assert float(rel) <= TF32_U, (float(rel), got, v)
    # and each result is one of v's two tf32 neighbours (nothing coarser)
    assert bool(((got == low) | (got == high)).all())


@pytest.mark.gpu
def test_cublas_tf32_matmul_operands_within_the_contract():
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
    assert float(rel) <= TF32_U, float(rel)  # as above (cuBLAS rounded to nearest: RN_U, run 35)


def test_probe_values_separate_the_two_roundings():
    # the probes sit strictly between two tf32 numbers, half of them above the midpoint, so a
    # truncating operand exceeds half a spacing (RN_U) and stays within one (TF32_U), and an
    # operand cut to a coarser format exceeds both (checked here on the CPU, emulated)
    v = probe_values()
    low, high = tf32_neighbours(v)
    assert bool(((low < v) & (v < high)).all())
    nearest = torch.where(v - low < high - v, low, high)
    rel = lambda t: float(((t.double() - v.double()).abs() / v.double()).max())  # noqa: E731
    assert rel(nearest) <= RN_U < rel(low) <= TF32_U
    coarser = (v.view(torch.int32) & ~0x3FFF).view(torch.float32)  # 9 significand bits kept
    assert rel(coarser) > TF32_U


@pytest.mark.gpu
def test_triton_tf32x3_dot_products_within_the_contract():
    """``input_precision="tf32x3"`` (three tf32 products of split operands): one product a b at a
    time (the other terms of the dot zero), against the exact product in float64. The contract
    treats it as operands rounded with u = OPERAND_ROUNDOFF["tf32x3"], so a product errs by at
    most ``(1 + u)^2 - 1`` relative (Higham Lemma 3.1)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import triton
    import triton.language as tl

    from solvers.contracts import OPERAND_ROUNDOFF

    @triton.jit
    def rowdot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr):
        # c_i = sum_k a_ik b_k0 with b = e_0 b_00 scaled per row: one product per row
        om, ok, on = tl.arange(0, M), tl.arange(0, K), tl.arange(0, 16)
        a = tl.load(a_ptr + om[:, None] * K + ok[None, :])
        b = tl.load(b_ptr + ok[:, None] * 16 + on[None, :])
        c = tl.dot(a, b, input_precision="tf32x3")
        tl.store(c_ptr + om[:, None] * 16 + on[None, :], c)

    gen = torch.Generator().manual_seed(0)
    M, K = 64, 16
    worst = 0.0
    for _ in range(64):
        x = torch.exp(4 * torch.randn(M, generator=gen)) * torch.sign(torch.randn(M, generator=gen))
        w = float(torch.exp(4 * torch.randn(1, generator=gen)))
        a = torch.zeros(M, K, dtype=torch.float32)
        a[:, 0] = x
        b = torch.zeros(K, 16, dtype=torch.float32)
        b[0, 0] = w
        c = torch.empty(M, 16, dtype=torch.float32, device="cuda")
        rowdot_kernel[(1,)](a.cuda(), b.cuda(), c, M=M, K=K, num_warps=4)
        exact = a[:, 0].double() * b[0, 0].double()
        rel = ((c[:, 0].cpu().double() - exact).abs() / exact.abs()).max()
        worst = max(worst, float(rel))
    u = OPERAND_ROUNDOFF["tf32x3"]
    print(
        f"tf32x3: largest relative error of one product {worst:.3e} = 2^{math.log2(worst):.2f}; contract (1+u)^2-1 = {(1 + u) ** 2 - 1:.3e}"
    )
    assert worst <= (1 + u) ** 2 - 1 + 2.0**-24, worst  # the product's own float32 rounding
