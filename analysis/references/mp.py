"""Exact conversion between torch tensors and mpmath, and high-precision linear algebra.

Ground truth is computed from the inputs *as rounded to the working precision*: every
float64 / float32 / bfloat16 value is a dyadic rational, converted exactly (through
float64, which represents all three exactly) and then solved at ``DPS`` >= 50 digits.
mpmath uses the gmpy2 backend when it is installed (``mpmath.libmp.BACKEND == 'gmpy'``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import mpmath
import numpy as np
import torch

from solvers import validation as _v

DPS = 50  # digits for ground truth: far below every working precision's 16 digits


@contextmanager
def precision(dps: int = DPS):
    """Run a block at ``dps`` decimal digits (mpmath.workdps, restored on exit)."""
    # mpmath silently runs dps <= 0 at 1 digit and truncates a float: garbage, not an error
    with mpmath.workdps(_v.count("dps", dps, minimum=1)):
        yield


def to_mp(t: torch.Tensor) -> mpmath.matrix:
    """A 1-D or 2-D tensor as an mpmath matrix (vectors become column matrices), exactly."""
    # a complex tensor lost its imaginary part, an int64 above 2^53 was rounded: not exact
    _v.floating("t", t, min_ndim=0, finite_values=False)
    a = t.detach().to("cpu", torch.float64).numpy()
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"to_mp takes a 1-D or 2-D tensor, got shape {tuple(t.shape)}")
    m = mpmath.matrix(a.shape[0], a.shape[1])
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            m[i, j] = mpmath.mpf(float(a[i, j]))
    return m


def to_tensor(m, dtype: torch.dtype = torch.float64, vector: bool = False) -> torch.Tensor:
    """An mpmath matrix back to a tensor, rounded once (through float64) to ``dtype``."""
    if not isinstance(m, mpmath.matrix):
        raise TypeError(f"m must be an mpmath matrix, got {type(m).__name__}")
    # an int dtype truncated the values, a string failed as an "invalid device string"
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if vector and min(m.rows, m.cols) > 1:  # was flattened silently
        raise ValueError(f"vector=True needs a row or a column, got a {m.rows}x{m.cols} matrix")
    rows, cols = m.rows, m.cols
    a = np.array([[float(m[i, j]) for j in range(cols)] for i in range(rows)], dtype=np.float64)
    t = torch.from_numpy(a)
    if vector:
        t = t.reshape(-1)
    return t.to(dtype)


def solve_spd(A: mpmath.matrix, b: mpmath.matrix) -> mpmath.matrix:
    """Solve ``A x = b`` for SPD ``A`` by Cholesky at the current mpmath precision."""
    if A.rows != A.cols or b.rows != A.rows:  # mpmath: "Value should be equal to n"
        raise ValueError(
            f"A must be n x n and b have n rows, got A {A.rows}x{A.cols} and b {b.rows}x{b.cols}"
        )
    return mpmath.cholesky_solve(A, b)


def norm(v: mpmath.matrix) -> mpmath.mpf:
    """Euclidean norm of a column (or Frobenius norm of a matrix)."""
    return mpmath.sqrt(mpmath.fsum(x * x for x in v))


@dataclass
class HighPrecision:
    """mpmath values as double-double tensors: value = hi + lo, |lo| <= ulp(hi) / 2."""

    hi: torch.Tensor
    lo: torch.Tensor

    @classmethod
    def from_mp(cls, values, shape) -> "HighPrecision":
        """From a flat sequence of mpf (row-major for ``shape``)."""
        hi = [float(v) for v in values]
        lo = [float(v - h) for v, h in zip(values, hi)]
        as_t = lambda a: torch.tensor(a, dtype=torch.float64).reshape(shape)  # noqa: E731
        return cls(as_t(hi), as_t(lo))

    def difference(self, x: torch.Tensor) -> torch.Tensor:
        """``x - value`` in float64, accurate to a relative ~1e-16 of the difference itself.

        (x - hi) is exact when x and hi are within a factor 2 (Sterbenz) and otherwise
        rounded relative to the result; lo then corrects the value to ~32 digits.
        """
        _v.floating("x", x, min_ndim=0, finite_values=False)  # a diverged iterate is measured
        # a last dimension of 1 broadcast silently against D: a distance to another vector
        if self.hi.ndim and (x.ndim == 0 or x.shape[-1] != self.hi.shape[-1]):
            raise ValueError(
                f"x has shape {tuple(x.shape)} but the value has {tuple(self.hi.shape)}: "
                "the last dimensions must match"
            )
        _v.batch_shape("x and the value", x.shape, self.hi.shape)
        return (x.to(torch.float64) - self.hi) - self.lo

    def distance(self, x: torch.Tensor) -> torch.Tensor:
        """``||x - value||_2`` over the last dimension."""
        return torch.linalg.vector_norm(self.difference(x), dim=-1)

    def norm(self) -> torch.Tensor:
        return torch.linalg.vector_norm(self.hi, dim=-1)

    def __getitem__(self, idx) -> "HighPrecision":
        return HighPrecision(self.hi[idx], self.lo[idx])
