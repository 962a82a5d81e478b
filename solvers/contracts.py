"""Precision contracts: what arithmetic a kernel (or a reference mode) declares it performs.

A contract is plain data, so references, kernels and the analysis can all import it
(``solvers`` imports nothing from ``analysis`` or ``kernels``). The bounds that hold a run to
its contract live in ``analysis.bounds.contract``; docs/precision.md explains the model.

Fields:

* ``input``: the dtype the inputs arrive in (``None``: whatever the caller passes);
* ``operands``: the precision the operands of every product are rounded to before the
  multiply: ``"fp64"``, ``"fp32"``, ``"tf32"`` (u = 2^-10: Triton's tf32 ``tl.dot``
  truncates its float32 operands to tf32 on Hopper, measured in docs/validation.md, run 35;
  cuBLAS rounds them to nearest, 2^-11, which the same u covers), ``"tf32x3"`` (three tf32 products,
  u about 2^-22) or ``"bf16"`` (u = 2^-8). An operand that already lies in that format
  (a bf16 input, a bf16-stored iterate) is not rounded again;
* ``stored``: which intermediates are stored rounded to ``storage`` between steps, from
  :data:`INTERMEDIATES` (``"iterate"`` of an iterative solver, ``"state"`` of a recurrent
  layer, ``"wy"`` blocks of a chunked one, ``"residual"``/``"direction"`` of CG);
* ``accumulate``: the dtype sums and elementwise updates are carried out in (float32 on
  tensor cores and in our kernels);
* ``output``: the dtype of the result (``None``: the kernel's own choice, measured, but the
  harness fails a result coarser than the inputs, or than ``storage`` where intermediates are
  stored rounded: an undeclared downcast).

Presets (:data:`PRESETS`, :func:`parse`): ``float64``, ``float32``, ``tf32``, ``tf32x3``,
``bfloat16/operands`` (fp32 iterate and accumulators, every product's operands rounded to
bf16: GKA's chunked Chebyshev kernel, fla's MesaNet CG), ``bfloat16/storage`` (fp32
arithmetic, intermediates stored in bf16: the references' bf16 storage mode) and
``bfloat16/strict`` (every operation rounded to bf16: the references' strict mode).
Compose your own with :func:`parse`: ``"float32;operands=bf16;stored=iterate"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch

OPERAND_ROUNDOFF = {
    "fp64": 2.0**-53,
    "fp32": 2.0**-24,
    "tf32x3": 2.0**-22,
    # one tf32 spacing relative (10 stored significand bits), not half of one: truncation, which
    # Triton's tf32 tl.dot does on H100 (tests/test_tf32_operand_rounding.py), errs by up to it
    "tf32": 2.0**-10,
    "bf16": 2.0**-8,
}
INTERMEDIATES = ("iterate", "state", "wy", "residual", "direction")
_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
}
_U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}


@dataclass(frozen=True)
class Contract:
    """The declared arithmetic of one kernel or reference mode (module docstring)."""

    name: str
    operands: str = "fp32"
    stored: frozenset = field(default_factory=frozenset)
    storage: torch.dtype = torch.bfloat16
    accumulate: torch.dtype = torch.float32
    input: Optional[torch.dtype] = None
    output: Optional[torch.dtype] = None

    def __post_init__(self):
        if self.operands not in OPERAND_ROUNDOFF:
            raise ValueError(
                f"operands must be one of {sorted(OPERAND_ROUNDOFF)}, got {self.operands!r}"
            )
        bad = set(self.stored) - set(INTERMEDIATES)
        if bad:
            raise ValueError(
                f"stored must name intermediates from {INTERMEDIATES}, got {sorted(bad)}"
            )
        for what in ("storage", "accumulate"):
            if getattr(self, what) not in _U:
                raise ValueError(
                    f"{what} must be float64, float32 or bfloat16, got {getattr(self, what)}"
                )
        object.__setattr__(self, "stored", frozenset(self.stored))

    @property
    def u_acc(self) -> float:
        """Unit roundoff of sums and elementwise operations."""
        return _U[self.accumulate]

    @property
    def u_store(self) -> float:
        """Unit roundoff of a stored intermediate (0 when nothing is stored rounded)."""
        return _U[self.storage] if self.stored and _U[self.storage] > self.u_acc else 0.0

    def u_operand(self, value_u: float) -> float:
        """Roundoff of an operand that is held with unit roundoff ``value_u`` when it enters a
        product: 0 if it already fits the operand format, else the operand format's u."""
        u = OPERAND_ROUNDOFF[self.operands]
        return u if u > value_u else 0.0

    def stores(self, what: str) -> bool:
        return what in self.stored and self.u_store > 0

    def with_input(self, dtype: Optional[torch.dtype]) -> "Contract":
        return replace(self, input=dtype)

    def __str__(self) -> str:
        stored = "+".join(sorted(self.stored)) or "nothing"
        acc = str(self.accumulate).replace("torch.", "")
        return f"{self.name} (operands {self.operands}, stored {stored} in {str(self.storage)[6:]}, accumulate {acc})"


PRESETS = {
    "float64": Contract(
        "float64", operands="fp64", storage=torch.float64, accumulate=torch.float64
    ),
    "float32": Contract("float32"),
    "tf32": Contract("tf32", operands="tf32"),
    "tf32x3": Contract("tf32x3", operands="tf32x3"),
    "bfloat16/operands": Contract("bfloat16/operands", operands="bf16"),
    "bfloat16/storage": Contract("bfloat16/storage", stored=frozenset(INTERMEDIATES)),
    "bfloat16/strict": Contract(
        "bfloat16/strict",
        operands="bf16",
        stored=frozenset(INTERMEDIATES),
        accumulate=torch.bfloat16,
    ),
}


def parse(text) -> Contract:
    """A preset name, optionally followed by ``;key=value`` changes (keys: operands, stored
    (``+``-separated, or ``none``), storage, accumulate, input, output), e.g.
    ``"float32;operands=bf16;stored=iterate"``. A :class:`Contract` is returned unchanged."""
    if isinstance(text, Contract):
        return text
    if not isinstance(text, str):
        raise TypeError(f"contract must be a Contract or a name, got {type(text).__name__}")
    head, *changes = [p.strip() for p in text.split(";")]
    if head not in PRESETS:
        raise ValueError(
            f"unknown contract {head!r}; expected one of {sorted(PRESETS)} (optionally with "
            f"';key=value' changes)"
        )
    c, kw = PRESETS[head], {}
    for ch in changes:
        key, sep, val = ch.partition("=")
        key, val = key.strip(), val.strip()
        if not sep:
            raise ValueError(f"contract change {ch!r} is not key=value")
        if key == "operands":
            kw[key] = val
        elif key == "stored":
            kw[key] = frozenset() if val in ("", "none") else frozenset(val.split("+"))
        elif key in ("storage", "accumulate", "input", "output"):
            if val not in _DTYPES:
                raise ValueError(f"contract {key} must be one of {sorted(_DTYPES)}, got {val!r}")
            kw[key] = _DTYPES[val]
        else:
            raise ValueError(
                f"unknown contract key {key!r}; expected operands, stored, storage, accumulate, "
                f"input or output"
            )
    return replace(c, name=text if changes else c.name, **kw)


def of_reference(dtype: torch.dtype, bf16_mode: str = "storage") -> Contract:
    """The contract a reference solver in ``solvers`` runs under (``solvers._arith.Arith``):
    float64 / float32 native; bf16 ``storage`` -> ``bfloat16/storage``; ``strict`` -> ``bfloat16/strict``."""
    if dtype == torch.float64:
        return PRESETS["float64"]
    if dtype == torch.float32:
        return PRESETS["float32"]
    if dtype == torch.bfloat16:
        return PRESETS["bfloat16/strict" if bf16_mode == "strict" else "bfloat16/storage"]
    raise TypeError(f"dtype must be float64, float32 or bfloat16, got {dtype}")


__all__ = ["Contract", "INTERMEDIATES", "OPERAND_ROUNDOFF", "PRESETS", "of_reference", "parse"]
