"""What every kernel wrapper does before and after a launch: checks, flattening, grids.

Contract shared by all kernels (docs/api.md, "kernels"):

* inputs float32 or bfloat16 (float64 is refused: use ``solvers``), on a CUDA device, or on
  the CPU when ``TRITON_INTERPRET=1`` (Triton's interpreter; slow, for tests);
* ``D <= 128`` (one system's matrix stays on chip); any D, masked to the next power of two;
* any batch shape and size: batch dims are broadcast and flattened to ``N`` systems; a
  launch covers at most ``MAX_GRID`` programs and larger batches run in several launches;
* inputs that are not contiguous, or broadcast, are copied to contiguous ``(N, ...)``
  buffers first (the caller's tensors are never written);
* per-system scalars (L, mu, ...) are checked like the references check them, turned into
  the derived constants in float64 and rounded once to float32, as ``Arith.scalar`` does;
* a kernel without a backward refuses inputs that require grad (:func:`no_autograd`).
"""

from __future__ import annotations

import contextlib
import os

import torch

from solvers import validation as check
from solvers.solve_info import Status, build_info, nonfinite_status

MAX_D = 128
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
INPUT_PRECISIONS = ("ieee", "tf32")
# CUDA's limit on grid dimension x; tests lower it to exercise the multi-launch path.
MAX_GRID = 2**31 - 1


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def device_ok(name: str, x: torch.Tensor) -> None:
    """Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter."""
    if x.is_cuda:
        return
    if x.device.type == "cpu" and interpreting():
        return
    if x.device.type == "cpu":
        raise ValueError(
            f"{name} is a CPU tensor: Triton kernels need a CUDA device "
            "(or set TRITON_INTERPRET=1 before importing triton to run them, slowly, on the CPU)"
        )
    raise ValueError(f"{name} is on {x.device}; Triton kernels need a CUDA device")


def no_autograd(fn: str, instead: str, **tensors) -> None:
    """A kernel without a backward refuses inputs that require grad while grad mode is on,
    naming the first: its result carried no gradient, so a training loop that swapped
    ``solvers.X`` for ``kernels.X`` stopped updating H and q without a word. ``instead``: the
    differentiable route to suggest."""
    if not torch.is_grad_enabled():
        return
    for name, x in tensors.items():
        if isinstance(x, torch.Tensor) and x.requires_grad:
            raise ValueError(
                f"{name} requires grad, but kernels.{fn} has no backward: its result would "
                f"carry no gradient. {instead}; or pass {name}.detach() (or call it under "
                "torch.no_grad()) to run it without one"
            )


@contextlib.contextmanager
def ieee_float32_matmuls():
    """PyTorch's float32 matmuls in IEEE float32 for the block, whatever the caller set
    (``torch.backends.cuda.matmul.allow_tf32`` or ``set_float32_matmul_precision("high")`` let
    cuBLAS round their operands to tf32): a kernel whose float32 products are part of its
    declared contract (the GKA backward's PyTorch GEMMs, bounded by LTB-dq with float32
    products) must not inherit a coarser one."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def kernel_dtype(name: str, x: torch.Tensor) -> None:
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"{name} has dtype {x.dtype}; kernels take float32 or bfloat16 "
            "(float64 runs through the references in solvers)"
        )


def dimension(name: str, D: int) -> None:
    if D > MAX_D:
        raise ValueError(
            f"{name} has D = {D}; kernels hold one D x D matrix on chip and support D <= {MAX_D}"
        )


def choice(name: str, value, allowed, *, default=None):
    """``value`` if it is one of ``allowed``; ``default`` for None when a default is given (e.g.
    a per-dtype product precision); otherwise a ValueError naming the argument."""
    if value is None and default is not None:
        return default
    if value not in allowed:
        or_none = " or None" if default is not None else ""
        raise ValueError(f"{name} must be one of {tuple(allowed)}{or_none}, got {value!r}")
    return value


def input_precision(p) -> str:
    return choice("input_precision", p, INPUT_PRECISIONS)


def out_dtype(dt, default: torch.dtype) -> torch.dtype:
    if dt is None:
        return default
    if dt not in KERNEL_DTYPES:
        raise TypeError(f"out_dtype must be torch.float32 or torch.bfloat16, got {dt}")
    return dt


def block(D: int) -> int:
    """Register block edge for D: a power of two, at least 16 (the smallest tl.dot edge)."""
    return max(16, 1 << (D - 1).bit_length())


def tensor(name: str, x, *, min_ndim: int = 0) -> torch.Tensor:
    """A float32 / bfloat16 tensor on a device kernels run on, with ``ndim >= min_ndim``.

    Unlike ``solvers.validation.tensor`` this does not read every entry for finiteness before
    the launch (a second pass over the matrices would cost as much as the kernel's own);
    :func:`finite_result` checks the (small) result instead and names a non-finite input.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor (float32 or bfloat16), got {x.dtype}")
    kernel_dtype(name, x)
    device_ok(name, x)
    if x.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions, got shape {tuple(x.shape)}"
        )
    return x


def systems(H, q, *, H_name: str = "H", q_name: str = "q"):
    """Validate a batch of systems ``H (..., D, D)``, ``q (..., D)`` for a kernel.

    Returns ``(H, q, batch)`` with H, q contiguous ``(N, D, D)`` / ``(N, D)`` views or copies.
    """
    H = tensor(H_name, H, min_ndim=2)
    if H.shape[-1] != H.shape[-2]:
        raise ValueError(
            f"{H_name} must be square in its last two dimensions, got shape {tuple(H.shape)}"
        )
    q = tensor(q_name, q, min_ndim=1)
    check.same_kind(q_name, q, H_name, H)
    if q.shape[-1] != H.shape[-1]:
        raise ValueError(
            f"{q_name} has last dimension {q.shape[-1]} but {H_name} is {H.shape[-2]}x{H.shape[-1]}"
        )
    batch = check.batch_shape(f"{H_name} and {q_name}", H.shape[:-2], q.shape[:-1])
    D = H.shape[-1]
    dimension(H_name, D)
    return flat(H.expand(*batch, D, D), 2), flat(q.expand(*batch, D), 1), batch


def finite_result(result: torch.Tensor, **inputs) -> None:
    """Never a silent NaN from a NaN input: if the result is not finite, name the input that
    was not (the references reject it up front). A result that overflowed from finite
    inputs is returned as the references return it (``return_info`` reports NONFINITE)."""
    if result.numel() == 0 or bool(torch.isfinite(result).all()):
        return
    for name, x in inputs.items():
        check.finite(name, x)


def flat(x: torch.Tensor, core: int) -> torch.Tensor:
    """``x`` as a contiguous ``(N, *core_shape)`` tensor (a copy when it is not one already)."""
    n = 1
    for s in x.shape[: x.ndim - core]:
        n *= s
    return x.reshape(n, *x.shape[x.ndim - core :]).contiguous()


def per_system(name: str, v, batch: torch.Size, device) -> torch.Tensor:
    """A per-system scalar as a float64 tensor of shape ``(N,)``."""
    return check.parameter(name, v, batch, device).reshape(-1).contiguous()


def fp32(x: torch.Tensor) -> torch.Tensor:
    """A float64 per-system constant rounded once to float32 (``Arith.scalar``)."""
    return x.to(torch.float32).contiguous()


def launches(N: int):
    """``(start, count)`` pairs covering N programs, at most ``MAX_GRID`` at a time."""
    start = 0
    while start < N:
        count = min(MAX_GRID, N - start)
        yield start, count
        start += count


def empty_out(shape, dtype, device) -> torch.Tensor:
    """Output buffer; tests poison ``torch.empty`` with NaN so unwritten entries fail."""
    return torch.empty(shape, dtype=dtype, device=device)


# Matrix-vector product modes of kernels._matvec (kept in sync with its constants).
FMA, DOT3, DOT_TF32, FMA_HT, DOT3_T = 0, 1, 2, 3, 4


def matvec_mode(dtype: torch.dtype, precision: str, tensor_cores) -> int:
    """Which product a kernel uses (kernels._matvec): fixed by the dtype and the precision
    asked for, except for bfloat16 where ``tensor_cores`` (None: the default) picks between
    two products of the same fp32 accuracy."""
    if tensor_cores not in (None, True, False):
        raise TypeError(f"tensor_cores must be None, True or False, got {tensor_cores!r}")
    if precision == "tf32":
        if dtype != torch.float32:
            raise ValueError(
                "input_precision='tf32' applies to float32 inputs; bfloat16 products are already "
                "exact in fp32 and run at fp32 accuracy"
            )
        if tensor_cores is False:
            raise ValueError(
                "input_precision='tf32' means a tensor-core product; tensor_cores=False contradicts it"
            )
        return DOT_TF32
    if dtype == torch.float32:
        if tensor_cores:
            raise ValueError(
                "float32 products at ieee precision do not run on tensor cores; pass input_precision='tf32'"
            )
        return FMA
    if tensor_cores is None:
        tensor_cores = BF16_TENSOR_CORES_DEFAULT
    return DOT3 if tensor_cores else FMA


# bfloat16 default product: the tensor-core split (DOT3) ran the r = 30, D = 128 Chebyshev
# forward in 7.4 ms against 9.3 ms for FMA on an H200 (docs/kernels.md, "Performance").
BF16_TENSOR_CORES_DEFAULT = True


def bf16_mode(mode) -> str:
    """Kernels accept the references' ``bf16_mode`` for drop-in use; only "storage" exists."""
    check.bf16_mode(mode)
    if mode == "strict":
        raise ValueError(
            "bf16_mode='strict' (every operation rounded to bf16) exists only in solvers; kernels "
            "store bf16 inputs and outputs and keep float32 iterates and accumulators"
        )
    return mode


def precision_label(dtype: torch.dtype, precision: str) -> str:
    """How a kernel's result was computed, for ``SolveInfo.precision``."""
    inputs = str(dtype).replace("torch.", "")
    return f"{inputs}-inputs/float32-iterates" + ("/tf32-products" if precision == "tf32" else "")


def info(H2, q2, batch, x, xs, precision: str, status=None, extras=None):
    """The ``SolveInfo`` of a kernel run from its stored iterates ``xs (iters + 1, N, D)``.

    ``status``: per-system Status codes ``(N,)`` decided in the kernel (default COMPLETED);
    non-finite results are marked NONFINITE here, as the references do.
    """
    D = q2.shape[-1]
    if status is None:
        status = torch.full(batch, int(Status.COMPLETED), device=x.device)
    status = nonfinite_status(x, status.reshape(batch))
    return build_info(
        H2.reshape(*batch, D, D),
        q2.reshape(*batch, D),
        list(xs.reshape(xs.shape[0], *batch, D).unbind(0)),
        status,
        precision,
        extras,
    )


def bounded_systems(H, q, L, mu):
    """``systems`` plus eigenvalue bounds ``L >= mu > 0`` as float64 ``(N,)`` tensors."""
    H2, q2, batch = systems(H, q)
    Lt = per_system("L", L, batch, H2.device)
    mt = per_system("mu", mu, batch, H2.device)
    check.spectrum_bounds(Lt, mt)
    return H2, q2, batch, Lt, mt


def num_warps(D: int) -> int:
    """Warps per program: one warpgroup (4 warps) for D > 32, the fastest for D = 128 with
    every product mode on an H200 (docs/kernels.md, "Performance"); fewer for small blocks."""
    return 4 if D > 32 else 2


# ----------------------------------------------------------------------------- checks read later


class DeferredChecks:
    """Input checks that need device values, collected over kernel calls and read in one
    synchronisation when :meth:`verify` is called.

    Pass one as ``check_inputs=`` to ``kernels.kla_chunkwise`` or ``kernels.koopman_readout``:
    the call then neither synchronises nor copies between host and device (so it can be
    captured in a CUDA graph); its kernels still write their status flags, and ``verify()``
    raises the error the call would have raised with ``check_inputs=True``. Under a CUDA
    graph the flags are rewritten by every replay, so ``verify()`` after a replay checks that
    replay's inputs. ``clear()`` forgets what was recorded."""

    def __init__(self):
        self._pending = []

    def add(self, bad: torch.Tensor, explain) -> None:
        """``bad``: a device bool (0-d); ``explain()`` raises the clear error when it is true."""
        self._pending.append((bad, explain))

    def __len__(self) -> int:
        return len(self._pending)

    def clear(self) -> None:
        self._pending = []

    def verify(self) -> None:
        if not self._pending:
            return
        flags = torch.stack(
            [b.reshape(()).to(torch.bool).to(self._pending[0][0].device) for b, _ in self._pending]
        ).tolist()
        for raised, (_, explain) in zip(flags, self._pending):
            if raised:
                explain()


def checks_for(check_inputs, device: torch.device):
    """The collector of one call's device-value checks: a fresh one to verify at the end of
    the call (``True``), the caller's :class:`DeferredChecks`, or ``None`` (``False``: flags are
    written by the kernels but not read)."""
    if check_inputs is True:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "check_inputs=True reads device values after the launch, which a CUDA graph capture "
                "cannot do: pass check_inputs=False or a kernels.DeferredChecks and call its verify()"
            )
        return DeferredChecks()
    if check_inputs is False:
        return None
    if isinstance(check_inputs, DeferredChecks):
        return check_inputs
    raise TypeError(
        f"check_inputs must be True, False or a kernels.DeferredChecks, got {type(check_inputs).__name__}"
    )


def finish_checks(check_inputs, checks) -> None:
    """Verify now when the caller asked for immediate checks (``check_inputs=True``)."""
    if check_inputs is True:
        checks.verify()
