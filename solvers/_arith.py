"""The arithmetic a reference solver runs in: working precision and, for bfloat16, a mode.

Every solver in this package is written against an :class:`Arith`, so the same source line
means the same rounding model in every precision (``docs/precision.md``):

* float64 / float32: native PyTorch arithmetic in that dtype.
* bfloat16, ``mode="storage"`` (default): values the algorithm *stores* (iterates, inputs)
  are bfloat16; products, sums and elementwise updates are computed in float32 and rounded
  to bfloat16 once, when the result is stored. This is what tensor cores and Triton's
  ``tl.dot(..., out_dtype=tl.float32)`` do.
* bfloat16, ``mode="strict"``: every elementary operation (each multiply, each add of a
  dot product, each elementwise op) is rounded to bfloat16; dot products are summed
  sequentially. A worst case, for studying how bad bf16 can be.

Unit roundoffs: u = 2^-53, 2^-24, 2^-8 (``torch.finfo(dtype).eps`` is 2u).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BF16_MODES = ("storage", "strict")
SUPPORTED_DTYPES = (torch.float64, torch.float32, torch.bfloat16)

_UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}


def unit_roundoff(dtype: torch.dtype) -> float:
    """u for a working dtype (half of ``torch.finfo(dtype).eps``)."""
    try:
        return _UNIT_ROUNDOFF[dtype]
    except KeyError:
        raise TypeError(f"dtype must be one of float64, float32, bfloat16, got {dtype}") from None


@dataclass(frozen=True)
class Arith:
    """Working precision of one solve: the storage dtype and the bf16 mode.

    ``compute`` is the dtype intermediate results live in before they are stored: float32
    for bf16 storage mode, the storage dtype otherwise.
    """

    dtype: torch.dtype
    mode: str = "storage"

    def __post_init__(self):
        if self.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dtype must be one of float64, float32, bfloat16, got {self.dtype}")
        if self.mode not in BF16_MODES:
            raise ValueError(f"bf16_mode must be one of {BF16_MODES}, got {self.mode!r}")

    @property
    def compute(self) -> torch.dtype:
        if self.dtype == torch.bfloat16 and self.mode == "storage":
            return torch.float32
        return self.dtype

    @property
    def strict(self) -> bool:
        return self.dtype == torch.bfloat16 and self.mode == "strict"

    @property
    def label(self) -> str:
        """Name used in reports: ``float64``, ``float32``, ``bfloat16/storage``, ``bfloat16/strict``."""
        name = str(self.dtype).replace("torch.", "")
        return f"{name}/{self.mode}" if self.dtype == torch.bfloat16 else name

    @property
    def u_store(self) -> float:
        return unit_roundoff(self.dtype)

    @property
    def u_acc(self) -> float:
        """Unit roundoff of accumulation inside dot products."""
        return unit_roundoff(self.compute)

    def up(self, x: torch.Tensor) -> torch.Tensor:
        """A stored value, widened to the compute dtype (exact)."""
        return x.to(self.compute)

    def store(self, x: torch.Tensor) -> torch.Tensor:
        """Round a computed value to the storage dtype (round to nearest even)."""
        return x.to(self.dtype)

    def scalar(self, x) -> torch.Tensor:
        """A per-system parameter (L, mu, a, ...) as a compute-dtype tensor.

        Parameters are computed in float64 by the caller and rounded once here: a kernel
        receives them as fp32 scalars, and in strict mode as bf16.
        """
        return torch.as_tensor(x, dtype=torch.float64).to(self.compute)

    def matvec(self, A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``A @ x`` for ``A (..., m, n)``, ``x (..., n)``, in the compute dtype."""
        A = A.to(self.compute)
        x = x.to(self.compute)
        if not self.strict:
            return (A @ x.unsqueeze(-1)).squeeze(-1)
        return _sequential_sum(A * x.unsqueeze(-2))

    def rmatvec(self, A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``A^T @ x`` for ``A (..., m, n)``, ``x (..., m)``."""
        return self.matvec(A.transpose(-1, -2), x)

    def dot(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``sum(x * y, -1)`` in the compute dtype."""
        x = x.to(self.compute)
        y = y.to(self.compute)
        if not self.strict:
            return (x.unsqueeze(-2) @ y.unsqueeze(-1)).squeeze(-1).squeeze(-1)
        return _sequential_sum(x * y)

    def matmul(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """``A @ B`` in the compute dtype (strict: every product and partial sum rounded)."""
        A = A.to(self.compute)
        B = B.to(self.compute)
        if not self.strict:
            return A @ B
        return _sequential_sum(A.unsqueeze(-1) * B.unsqueeze(-3), dim=-2)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        """Euclidean norm over the last dimension, in the compute dtype."""
        return torch.sqrt(self.dot(x, x))


def _sequential_sum(terms: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Left-to-right recursive summation, each partial sum rounded to the terms' dtype.

    ``torch.sum`` on bf16 accumulates in fp32; strict bf16 needs the textbook recursive
    summation whose error bound is gamma_{n-1} (Higham, eq. (4.4)).
    """
    terms = terms.movedim(dim, -1)
    if terms.shape[-1] == 0:
        return torch.zeros(terms.shape[:-1], dtype=terms.dtype, device=terms.device)
    acc = terms[..., 0]
    for k in range(1, terms.shape[-1]):
        acc = acc + terms[..., k]
    return acc


def arith_for(dtype: torch.dtype, bf16_mode: str = "storage") -> Arith:
    """The :class:`Arith` of a solve whose inputs have ``dtype``."""
    return Arith(dtype, bf16_mode)
