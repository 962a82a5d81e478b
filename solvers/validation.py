"""Input checks at the public boundary: one clear error naming the argument, never a NaN.

Every public solver calls these once, before any arithmetic. None of them modifies its
argument; the solvers themselves never write into a caller's tensor.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._arith import SUPPORTED_DTYPES


def tensor(name: str, x, *, min_ndim: int = 0) -> torch.Tensor:
    """``x`` must be a finite floating tensor of a supported dtype with ``ndim >= min_ndim``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating tensor (float64, float32 or bfloat16), got {x.dtype}"
        )
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; supported: float64, float32, bfloat16")
    if x.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions, got shape {tuple(x.shape)}"
        )
    finite(name, x)
    return x


def floating(name: str, x, *, min_ndim: int = 1, finite_values: bool = True) -> torch.Tensor:
    """``x`` must be a floating tensor of any float dtype (measurements and bounds widen it
    exactly to float64) with ``ndim >= min_ndim``, finite unless ``finite_values=False`` (an
    iterate may have diverged, and is measured as such)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions, got shape {tuple(x.shape)}"
        )
    if finite_values:
        finite(name, x)
    return x


def finite(name: str, x: torch.Tensor) -> None:
    # A meta tensor has no values to check (its device is checked by same_kind).
    if x.device.type == "meta":
        return
    if x.numel() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} has {bad} non-finite entries (NaN or Inf)")


def has_values(name: str, x: torch.Tensor, what: str) -> None:
    """``x`` must hold values: a meta tensor (shapes only) cannot go where ``what`` reads them
    (a range check, a pivot, a zero key), which would otherwise fail inside torch."""
    if x.device.type == "meta":
        raise ValueError(
            f"{name} is on the meta device, which holds no values: {what} cannot run on it "
            "(pass cpu or cuda tensors)"
        )


def square_matrix(name: str, H) -> torch.Tensor:
    H = tensor(name, H, min_ndim=2)
    if H.shape[-1] != H.shape[-2]:
        raise ValueError(
            f"{name} must be square in its last two dimensions, got shape {tuple(H.shape)}"
        )
    return H


def same_kind(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """``x`` must share ``ref``'s dtype and device."""
    if x.dtype != ref.dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but {ref_name} has {ref.dtype}; they must match"
        )
    if x.device != ref.device:
        raise ValueError(
            f"{name} is on {x.device} but {ref_name} is on {ref.device}; they must match"
        )


def rhs(name: str, q, H_name: str, H: torch.Tensor) -> torch.Tensor:
    """A right-hand side ``(..., D)`` for the matrix ``H (..., D, D)``."""
    q = tensor(name, q, min_ndim=1)
    same_kind(name, q, H_name, H)
    if q.shape[-1] != H.shape[-1]:
        raise ValueError(
            f"{name} has last dimension {q.shape[-1]} but {H_name} is {H.shape[-2]}x{H.shape[-1]}"
        )
    batch_shape(f"{H_name} and {name}", H.shape[:-2], q.shape[:-1])
    return q


def batch_shape(what: str, *shapes) -> torch.Size:
    try:
        return torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise ValueError(
            f"batch shapes of {what} do not broadcast: {[tuple(s) for s in shapes]}"
        ) from None


def ridge_strength(a) -> float:
    """GKA's ridge strength ``a`` (``lambda = a ||H||_F``, eq. (4)): a finite float > 0."""
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        raise TypeError(f"a must be a float, got {type(a).__name__}")
    if not a > 0 or a != a or a == float("inf"):
        raise ValueError(f"a must be a finite float > 0, got {a}")
    return float(a)


def real(name: str, x, *, low: float = -math.inf, low_open: bool = False) -> float:
    """A finite real number ``>= low`` (``> low`` when ``low_open``), as a float; a one-element
    tensor is read as its value. NaN, inf, bools and non-numbers are refused by name."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    if not (math.isfinite(x) and (x > low if low_open else x >= low)):
        bound = "" if low == -math.inf else f" {'>' if low_open else '>='} {low:g}"
        raise ValueError(f"{name} must be a finite real{bound}, got {x}")
    return float(x)


def count(name: str, n, *, minimum: int = 0) -> int:
    """A whole number such as ``iters`` or ``sweeps``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return int(n)


def flag(name: str, v) -> bool:
    """An on/off option such as ``return_info``: True or False. A string such as ``"no"`` or a
    number would otherwise be read by its truthiness and silently change what is returned."""
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(v).__name__} {v!r}")
    return v


def tolerance(name: str, v, *, allow_none: bool = False):
    """A stopping tolerance such as ``rtol`` or ``atol``: a finite real >= 0 (or None where
    ``allow_none``). ``not 0 <= v < inf`` also rejects NaN, which would silently never stop.

    Shared by the references (``solvers.cg``) and the kernels (``kernels.cg``)."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < math.inf:
        raise ValueError(
            f"{name} must be a finite float >= 0{' or None' if allow_none else ''}, got {v!r}"
        )
    return float(v)


def parameter(name: str, v, batch: torch.Size, device) -> torch.Tensor:
    """A per-system scalar (float or tensor broadcast over the batch) as a float64 tensor.

    float64 so that derived constants (rho, 2/(L+mu)) are computed once accurately; the
    solver rounds them to its working precision.
    """
    if isinstance(v, bool):
        raise TypeError(f"{name} must be a float or a tensor, got bool")
    if isinstance(v, numbers.Real):
        if not math.isfinite(v):  # checked here: on a meta device the value is gone
            raise ValueError(f"{name} has 1 non-finite entries (NaN or Inf)")
        t = torch.tensor(float(v), dtype=torch.float64, device=device)
    elif isinstance(v, torch.Tensor):
        if not (v.is_floating_point() or v.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"{name} must be a real tensor, got {v.dtype}")
        if v.device != torch.device(device) and v.numel() != 1:
            raise ValueError(f"{name} is on {v.device} but the data is on {device}")
        t = v.detach().to(device=device, dtype=torch.float64)
    else:
        raise TypeError(f"{name} must be a float or a tensor, got {type(v).__name__}")
    finite(name, t)
    try:
        return torch.broadcast_to(t, batch)
    except RuntimeError:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}, which does not broadcast to the batch {tuple(batch)}"
        ) from None


def spectrum_bounds(L: torch.Tensor, mu: torch.Tensor) -> None:
    """``L >= mu > 0`` (GKA Algorithm 1, line 1). On a meta device (shapes only, as ``finite``)
    there are no values to compare: a float L or mu was checked on the host by ``parameter``."""
    if "meta" in (L.device.type, mu.device.type):
        return
    if mu.numel() and not bool((mu > 0).all()):
        raise ValueError(f"mu must be > 0, got min(mu) = {float(mu.min())}")
    if L.numel() and not bool((L >= mu).all()):
        worst = int(torch.argmin(L - mu))
        raise ValueError(
            f"L must be >= mu, got L = {float(L.flatten()[worst])} < mu = {float(mu.flatten()[worst])}"
        )


def bf16_mode(mode) -> str:
    if mode not in ("storage", "strict"):
        raise ValueError(f"bf16_mode must be 'storage' or 'strict', got {mode!r}")
    return mode
