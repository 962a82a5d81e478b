"""The matrix-vector product inside every iterative kernel, in three ways.

A program holds one system's matrix ``b_H`` ([BLOCK_D, BLOCK_D], zero-padded) on chip for all
iterations and multiplies it by a float32 iterate each step. The product must be as accurate
as a float32 dot product (the precision model: iterate and accumulation in fp32), except
where the caller asked for tf32.

* ``FMA``: ``sum_j H_ij x_j`` on the CUDA cores in fp32 (H widened to fp32 once, exactly).
* ``DOT3`` (bfloat16 H): the tensor cores take bf16 operands, so the fp32 iterate is split
  exactly into three bf16 pieces, ``x = x_hi + x_mid + x_lo + e`` with
  ``|e| <= 2^-24 |x|`` componentwise (each piece holds the next 8 significant bits; the
  differences are exact in fp32), placed in columns 0..2 of a [BLOCK_D, 16] operand.
  Products of bf16 numbers are exact in fp32 and the tensor core accumulates in fp32, so
  ``H x`` comes out with the error of an fp32 dot product plus ``|H| |e|``.
* ``DOT_TF32`` (float32 H, ``input_precision="tf32"``): one tl.dot with the iterate in
  column 0; operands cut to tf32 by the hardware (truncated on Hopper: u = 2^-10,
  ``solvers.contracts.OPERAND_ROUNDOFF``).
"""

import os

import triton
import triton.language as tl

FMA: tl.constexpr = tl.constexpr(0)
DOT3: tl.constexpr = tl.constexpr(1)
DOT_TF32: tl.constexpr = tl.constexpr(2)
# Variants timed by benchmarks/kernel_variants.py, not chosen by any public option:
# FMA_HT computes H^T x (= H x only for symmetric H): its reduction runs across the rows of
# the coalesced layout, few lanes apart, where FMA's runs along them, across 16 lanes;
# DOT3_T computes x^T H^T on tensor cores with the iterate as the 16-row A operand.
FMA_HT: tl.constexpr = tl.constexpr(3)
DOT3_T: tl.constexpr = tl.constexpr(4)

# Triton's CPU interpreter multiplies bfloat16 tl.dot operands as raw 16-bit patterns (seen
# with Triton 3.9), so under it DOT3 widens both operands to fp32 first: the same products,
# since bf16 x bf16 products and the split pieces are exact in fp32.
INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

# Smallest tl.dot operand edge: the iterate is padded to this many columns.
DOT_N: tl.constexpr = tl.constexpr(16)


@triton.jit
def split_columns(b_x, BLOCK_D: tl.constexpr):
    """The three-piece bf16 split of an fp32 vector, as columns 0..2 of a [BLOCK_D, 16] block."""
    o_c = tl.arange(0, DOT_N)[None, :]
    b_hi = b_x.to(tl.bfloat16).to(tl.float32)
    b_r = b_x - b_hi
    b_mid = b_r.to(tl.bfloat16).to(tl.float32)
    b_lo = (b_r - b_mid).to(tl.bfloat16).to(tl.float32)
    b_X = tl.where(
        o_c == 0,
        b_hi[:, None],
        tl.where(o_c == 1, b_mid[:, None], tl.where(o_c == 2, b_lo[:, None], 0.0)),
    )
    return b_X.to(tl.bfloat16)


@triton.jit
def matvec(b_H, b_x, MODE: tl.constexpr, BLOCK_D: tl.constexpr):
    """``H @ x`` as a float32 [BLOCK_D] vector (see the module docstring for MODE)."""
    if MODE == DOT3:
        b_X = split_columns(b_x, BLOCK_D)
        if INTERPRETED:
            b_y = tl.sum(
                tl.dot(b_H.to(tl.float32), b_X.to(tl.float32), input_precision="ieee"), axis=1
            )
        else:
            b_y = tl.sum(tl.dot(b_H, b_X, out_dtype=tl.float32), axis=1)
    elif MODE == DOT3_T:
        b_X = tl.trans(split_columns(b_x, BLOCK_D))
        b_Ht = tl.trans(b_H)
        if INTERPRETED:
            b_y = tl.sum(
                tl.dot(b_X.to(tl.float32), b_Ht.to(tl.float32), input_precision="ieee"), axis=0
            )
        else:
            b_y = tl.sum(tl.dot(b_X, b_Ht, out_dtype=tl.float32), axis=0)
    elif MODE == FMA_HT:
        b_y = tl.sum(b_H * b_x[:, None], axis=0)
    elif MODE == DOT_TF32:
        o_c = tl.arange(0, DOT_N)[None, :]
        b_X = tl.where(o_c == 0, b_x[:, None], 0.0)
        b_y = tl.sum(tl.dot(b_H, b_X, input_precision="tf32", out_dtype=tl.float32), axis=1)
    else:
        b_y = tl.sum(b_H * b_x[None, :], axis=1)
    return b_y


@triton.jit
def rmatvec(b_H, b_x, MODE: tl.constexpr, BLOCK_D: tl.constexpr):
    """``H^T @ x`` as a float32 [BLOCK_D] vector: the adjoint's product, as ``matvec``."""
    if MODE == DOT3:
        b_X = tl.trans(split_columns(b_x, BLOCK_D))
        if INTERPRETED:
            b_y = tl.sum(
                tl.dot(b_X.to(tl.float32), b_H.to(tl.float32), input_precision="ieee"), axis=0
            )
        else:
            b_y = tl.sum(tl.dot(b_X, b_H, out_dtype=tl.float32), axis=0)
    elif MODE == DOT_TF32:
        o_c = tl.arange(0, DOT_N)[:, None]
        b_X = tl.where(o_c == 0, b_x[None, :], 0.0)
        b_y = tl.sum(tl.dot(b_X, b_H, input_precision="tf32", out_dtype=tl.float32), axis=0)
    else:
        b_y = tl.sum(b_H * b_x[:, None], axis=0)
    return b_y


@triton.jit
def load_matrix(p_H, i_n, D: tl.constexpr, BLOCK_D: tl.constexpr, MODE: tl.constexpr):
    """System i_n's matrix as a zero-padded register block in the layout MODE multiplies with."""
    o_d = tl.arange(0, BLOCK_D)
    p_b = p_H + i_n * (D * D) + o_d[:, None] * D + o_d[None, :]
    if D == BLOCK_D:  # no mask: lets the compiler use 16-byte loads
        b_H = tl.load(p_b)
    else:
        m_d = o_d < D
        b_H = tl.load(p_b, mask=m_d[:, None] & m_d[None, :], other=0.0)
    if MODE == FMA or MODE == FMA_HT:
        b_H = b_H.to(tl.float32)
    return b_H


@triton.jit
def load_vector(p_x, i_n, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """System i_n's vector, widened to float32, zero beyond D."""
    o_d = tl.arange(0, BLOCK_D)
    if D == BLOCK_D:
        b_x = tl.load(p_x + i_n * D + o_d)
    else:
        b_x = tl.load(p_x + i_n * D + o_d, mask=o_d < D, other=0.0)
    return b_x.to(tl.float32)


@triton.jit
def stored(b_x, dtype: tl.constexpr):
    """``b_x`` rounded to the output dtype, to nearest even.

    Triton's CPU interpreter truncates float32 -> bfloat16 (seen with Triton 3.9: half of
    random values differ from round-to-nearest), which would double the output's rounding
    error; under it the rounding is done on the bits (finite values)."""
    if INTERPRETED and dtype == tl.bfloat16:
        b_bits = b_x.to(tl.uint32, bitcast=True)
        b_bits = b_bits + (0x7FFF + ((b_bits >> 16) & 1))
        b_y = (b_bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        b_y = b_x.to(dtype)
    return b_y


@triton.jit
def store_vector(p_x, i_n, b_x, D: tl.constexpr, BLOCK_D: tl.constexpr):
    o_d = tl.arange(0, BLOCK_D)
    tl.store(p_x + i_n * D + o_d, stored(b_x, p_x.dtype.element_ty), mask=o_d < D)


@triton.jit
def store_matrix(p_M, i_n, b_M, D: tl.constexpr, BLOCK_D: tl.constexpr):
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    p_b = p_M + i_n * (D * D) + o_d[:, None] * D + o_d[None, :]
    tl.store(p_b, stored(b_M, p_M.dtype.element_ty), mask=m_d[:, None] & m_d[None, :])
