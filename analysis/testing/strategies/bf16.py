"""bfloat16-representable inputs: the same numbers in every working precision.

A value drawn here is exactly representable in bfloat16 (8 significant bits, 8-bit exponent),
hence also in float32 and float64. Feeding the same draw to a solver in float64, float32 and
bf16 then compares the *arithmetic* of the precisions on identical inputs: no difference can
come from rounding the inputs. Cases are plain Python floats and tuples, so a shrunk
counterexample prints as a literal that can be pasted into ``@example(...)``.

Example::

    from hypothesis import given
    from analysis.testing.strategies.bf16 import bf16_floats, bf16_tensors

    @given(bf16_tensors((4, 4), min_value=-2.0, max_value=2.0))
    def test_symmetric_part(A):            # A: float64 tensor of bf16-representable values
        assert torch.equal(A.to(torch.bfloat16).to(torch.float64), A)
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import torch
from hypothesis import strategies as st

from . import _checks

BF16_MANTISSA_BITS = 7  # stored fraction bits; 8 significant bits with the implicit one
BF16_MIN_NORMAL = 2.0**-126
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
_EXACT_DTYPES = (torch.float64, torch.float32, torch.bfloat16)


def to_bf16(x: float) -> float:
    """``x`` rounded to the nearest bfloat16 (ties to even), as a Python float."""
    return float(torch.tensor(float(x), dtype=torch.float64).to(torch.bfloat16).item())


def is_bf16(t) -> bool:
    """Every entry of ``t`` (tensor or float) is exactly a bfloat16 value."""
    t = torch.as_tensor(t, dtype=torch.float64)
    return bool(torch.equal(t.to(torch.bfloat16).to(torch.float64), t))


def _any_bf16(lo: float, hi: float, min_magnitude: float) -> bool:
    """Some normal bf16 ``v`` has ``lo <= v <= hi`` and ``|v| >= min_magnitude``."""
    for a, b in ((max(lo, min_magnitude), hi), (lo, min(hi, -min_magnitude))):
        if a <= b:
            v = to_bf16(a)  # the nearest bf16 to a; the next one up if it rounded below
            v = (
                v
                if v >= a
                else float(
                    torch.nextafter(
                        torch.tensor(v, dtype=torch.bfloat16),
                        torch.tensor(math.inf, dtype=torch.bfloat16),
                    )
                )
            )
            if v <= b:
                return True
    return False


@functools.lru_cache(
    maxsize=None
)  # one strategy object per argument set: hypothesis caches per object
def bf16_floats(
    min_value: float = -4.0,
    max_value: float = 4.0,
    *,
    allow_zero: bool = True,
    min_magnitude: float = 2.0**-8,
):
    """Strategy: bfloat16 values in ``[min_value, max_value]``.

    Nonzero values have magnitude >= ``min_magnitude`` (normal bf16 numbers; no subnormals, so
    that no precision flushes them). Drawn as sign x (1 + m/128) x 2^e, which shrinks towards
    0.0 (if allowed) and then towards +-1.0 and simple binary fractions.
    """
    min_value, max_value = (
        _checks.real("min_value", min_value),
        _checks.real("max_value", max_value),
    )
    min_magnitude = _checks.real("min_magnitude", min_magnitude)
    if not min_value <= max_value:
        raise ValueError(f"min_value must be <= max_value, got {min_value} > {max_value}")
    if not min_magnitude >= BF16_MIN_NORMAL:
        raise ValueError(f"min_magnitude must be >= the smallest normal bf16 {BF16_MIN_NORMAL}")
    top = max(abs(min_value), abs(max_value))
    if top > BF16_MAX:
        raise ValueError(f"bounds must be within the bf16 range +-{BF16_MAX}")
    # an empty range would only fail later, inside hypothesis, as a health check or Unsatisfiable
    if not (allow_zero and min_value <= 0.0 <= max_value) and not _any_bf16(
        min_value, max_value, min_magnitude
    ):
        raise ValueError(
            f"no bf16 value in [min_value, max_value] = [{min_value}, {max_value}] with "
            f"magnitude >= min_magnitude = {min_magnitude}"
            + ("" if allow_zero else " (allow_zero=False)")
        )
    e_lo = math.floor(math.log2(min_magnitude))
    e_hi = max(e_lo, math.floor(math.log2(top)) if top > 0 else e_lo)
    signs = [s for s in (1.0, -1.0) if (s > 0 and max_value > 0) or (s < 0 and min_value < 0)]

    def build(sign, e, m):
        return sign * (1.0 + m / 2**BF16_MANTISSA_BITS) * 2.0**e

    nonzero = st.builds(
        build,
        st.sampled_from(signs) if signs else st.just(1.0),
        st.integers(e_lo, e_hi),
        st.integers(0, 2**BF16_MANTISSA_BITS - 1),
    )
    nonzero = nonzero.filter(lambda v: min_value <= v <= max_value and abs(v) >= min_magnitude)
    if allow_zero and min_value <= 0.0 <= max_value:
        return st.one_of(st.just(0.0), nonzero)
    return nonzero


@functools.lru_cache(maxsize=None)
def bf16_vectors(n: int, **kwargs):
    """Strategy: a tuple of ``n`` bf16 values (keyword arguments as :func:`bf16_floats`)."""
    n = _checks.count("n", n)  # n < 0 would silently give ()
    return st.tuples(*[bf16_floats(**kwargs) for _ in range(n)])


@functools.lru_cache(maxsize=None)
def bf16_matrices(rows: int, cols: int, **kwargs):
    """Strategy: a ``rows``-tuple of ``cols``-tuples of bf16 values."""
    rows, cols = _checks.count("rows", rows), _checks.count("cols", cols)
    return st.tuples(*[bf16_vectors(cols, **kwargs) for _ in range(rows)])


def bf16_tensors(shape: Sequence[int], *, dtype: torch.dtype = torch.float64, **kwargs):
    """Strategy: a tensor of ``shape`` holding bf16 values, stored in ``dtype`` (exact for
    float64, float32 and bfloat16)."""
    # int(2.5) would silently truncate a shape; an int dtype or float16 would not hold the values
    shape = _checks.shape("shape", shape)
    if dtype not in _EXACT_DTYPES:
        raise TypeError(
            f"dtype must be one of {_EXACT_DTYPES} (exact for bf16 values), got {dtype!r}"
        )
    n = math.prod(shape)
    return st.lists(bf16_floats(**kwargs), min_size=n, max_size=n).map(
        lambda xs: torch.tensor(xs, dtype=torch.float64).reshape(shape).to(dtype)
    )


__all__ = [
    "BF16_MAX",
    "bf16_floats",
    "bf16_matrices",
    "bf16_tensors",
    "bf16_vectors",
    "is_bf16",
    "to_bf16",
]
