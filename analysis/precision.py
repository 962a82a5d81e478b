"""The precision model: unit roundoffs, the bf16 modes, and the rounding allowance.

The arithmetic itself lives in ``solvers._arith`` (``solvers`` imports nothing from here);
this module adds what the analysis needs to hold results to a bound. See docs/precision.md.
"""

from __future__ import annotations

import torch

from solvers._arith import BF16_MODES, Arith, unit_roundoff

PRECISIONS = (
    Arith(torch.float64),
    Arith(torch.float32),
    Arith(torch.bfloat16, "storage"),
    Arith(torch.bfloat16, "strict"),
)

# Constant c of the rounding allowance c * kappa * (n u_acc + u_store); its justification is
# in docs/precision.md ("The rounding allowance") and it is not tuned per test.
ALLOWANCE_C = 8.0


def rounding_allowance(kappa: float, n: int, arith: Arith, c: float = ALLOWANCE_C) -> float:
    """Bound on the relative rounding error ``||x_hat - x_mp|| / ||x*||`` of a stable solve.

    ``kappa``: condition number of the system; ``n``: length of the dot products (D);
    u_acc: roundoff of the accumulation, u_store: of the stored values (equal except in bf16
    storage mode, where products accumulate in fp32 and only stores round to bf16).
    """
    return c * float(kappa) * (n * arith.u_acc + arith.u_store)


def by_label(label: str) -> Arith:
    """The Arith named ``float64``, ``float32``, ``bfloat16/storage`` or ``bfloat16/strict``."""
    for a in PRECISIONS:
        if a.label == label:
            return a
    raise ValueError(f"unknown precision {label!r}; expected one of {[a.label for a in PRECISIONS]}")


__all__ = ["ALLOWANCE_C", "Arith", "BF16_MODES", "PRECISIONS", "by_label", "rounding_allowance", "unit_roundoff"]
