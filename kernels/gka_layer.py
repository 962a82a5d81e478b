"""The GKA layer on the GPU without materialising H_t: ``gka_layer`` and its solve stage ``gka_solve``.

Same recurrence and results as ``solvers.gka_layer`` with ``solver="chebyshev"`` (GKA eq. (CH),
appendix eq. (55); Sec. 4.1 eq. (4) for lambda_t = a ||H_t||_F; Algorithm 1 for the solve),
computed chunkwise (kernels/gka_layer_fwd.py): chunk states by the GDN-style chunk recurrence,
``||H_t||_F`` by eq. (5) in the solve kernel, and the r Chebyshev steps for all tokens of a chunk
at once, ``H_t X`` as ``(state X)`` plus the gated intra-chunk terms as tensor-core products.
On Hopper, for bf16 inputs with D = Dv = 128, no gates and the default chunk, the forward after
the chunk states runs on warp-group MMA instead (kernels/gka_layer_wgmma.py, Gluon; the same
contract; ``SOLVE_KERNEL``).

Backward (an ``autograd.Function``) by implicit differentiation, as GKA trains: x_t is treated as
the exact solution of ``(H_t + lambda_t I) x_t = q_t``, ``dq_t`` is one more r-step Chebyshev
solve with the cotangent ``dx_t = U_t^T dy_t`` (eq. (6); by Lemma 2 this is exactly the gradient
of the truncated loop with respect to q), and dk, dv, dg, dbeta follow Lemma 1 / appendix D.2
through the chunk recurrence, including the ``lambda_t = a ||H_t||_F`` path
(kernels/gka_layer_bwd.py, PyTorch on the GPU's float32, the walk over the chunks a Triton
kernel, kernels/gka_layer_carry.py). The gradients with respect to k, g and
beta differ from autograd through the truncated loop by a truncation term that shrinks like the
Chebyshev error (docs/gka_layer.md, "Kernel").

Contracts (``contract=``):

* ``"bfloat16/operands"`` (default for bf16 inputs; the fast path, as GKA's own kernel):
  iterates, residuals, accumulators and eq. (5) in float32; the product operands (the iterate,
  the masked chunk products, the chunk states) rounded to bf16.
* ``"float32/ieee"`` (default for float32 inputs) and ``"float32/tf32x3"``: every product at
  float32 accuracy, chunk states stored in float32.

Checks (``check_inputs``, as ``kernels.kla_chunkwise``): shapes, dtypes and devices on the host;
the values (finite q, k, v, g <= 0, beta >= 0, H_t != 0, finite outputs) as flags written by the
solve kernel and read at the end of the call (True), by a ``kernels.DeferredChecks`` or not at all
(False). A raised flag runs the reference checks for the reference's error.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional

import torch
import triton
from torch.autograd.function import once_differentiable

from solvers import validation as check
from solvers.gka import LayerInputs, check_frobenius, check_ridge_in, validate_inputs
from solvers.solve_info import Status, nonfinite_status, worst_status

from . import _launch as launch
from . import gka_layer_wgmma as wgmma
from .gka_layer_bwd import chunked, implicit_backward, reverse_cumsum, transposed_state_products
from .gka_layer_carry import carry_backwards, symmetric_carry
from .gka_layer_fwd import solve_kernel, states_kernel
from .kla import PRECISIONS

CONTRACTS = {"bfloat16/operands": "bf16", "float32/ieee": "ieee", "float32/tf32x3": "tf32x3"}
CHUNK_SIZES = (16, 32, 64)  # None: DEFAULT_CHUNK of the contract
# lambda_t = a ||H_t||_F takes the square root of eq. (5); tests switch it off to show they
# catch "lambda without the square root".
_FRO_SQRT = True
# Launch shapes of the solve kernel (benchmarks/bench_gka_layer.py --variants on the H200: C = 32
# with 4 warps 0.676 ms for the solve kernel; C = 16 with 2 warps 0.664 ms but its chunk states
# cost 0.203 ms instead of 0.070; register caps (3-5 programs per SM) and C = 64 with 8 warps on
# warp-group MMA were 19-145% slower; docs/performance.md).
SOLVE_LAUNCH = {"num_warps": 4, "num_stages": 1}
# The other launch shapes measured against it, (chunk, warps, register cap): compared side by side
# by benchmarks/bench_gka_layer.py --variants, each held within the forward bound by the GPU tests.
ALTERNATIVE_LAUNCHES = ((16, 2, 200), (16, 2, None), (16, 4, 128), (32, 4, 168), (64, 8, None))


def solve_launch(num_warps: int, maxnreg=None) -> dict:
    """The solve kernel's launch options for a shape of ALTERNATIVE_LAUNCHES (one stage: the
    kernel's loop carries its own operands)."""
    return {"num_warps": num_warps, "num_stages": 1, **({"maxnreg": maxnreg} if maxnreg else {})}


# Which kernel runs the forward's solve: "auto" -- the warp-group MMA kernel
# (kernels/gka_layer_wgmma.py, chunks of 64) where it applies (bfloat16/operands, bf16, D = Dv =
# 128, no gates, a Hopper GPU, the default chunk size), else the Triton solve kernel; "triton" --
# always the Triton kernel (benchmarks and tests compare the two).
SOLVE_KERNEL = "auto"
# Default chunk per contract: float32 operands need four times the shared memory of bf16 ones.
DEFAULT_CHUNK = {"bfloat16/operands": 32, "float32/ieee": 32, "float32/tf32x3": 16}
STATES_BLOCK_J = 32


@dataclass
class GKAKernelInfo:
    """What the kernel computed besides y: x ``(..., T, D)`` as stored, ``fro`` and ``lam``
    ``(..., T)`` float64 copies of its float32 ``||H_t||_F`` (eq. (5)) and ``lambda_t``;
    system_status ``(..., T)`` :class:`solvers.Status` codes per token (NONFINITE where x_t or y_t
    overflowed from finite inputs, else COMPLETED), as ``solvers.gka.GKAInfo``. There are no
    residual norms: they would need the H_t the kernel never forms."""

    x: torch.Tensor
    fro: torch.Tensor
    lam: torch.Tensor
    precision: str
    solver: str
    iters: int
    system_status: torch.Tensor

    @property
    def status(self) -> Status:
        return worst_status(self.system_status)


def resolve_contract(contract, dtype: torch.dtype) -> str:
    default = "bfloat16/operands" if dtype == torch.bfloat16 else "float32/ieee"
    return launch.choice("contract", contract, CONTRACTS, default=default)


def chunk_cumulative_gates(
    g2: Optional[torch.Tensor], N: int, Tp: int, C: int, device
) -> Optional[torch.Tensor]:
    """``G_c = g_1 + ... + g_c`` within each chunk (appendix eq. (16)), float32 ``(N, Tp)``; padding
    tokens carry g = 0 (G stays at the chunk's last value). None without a gate (G = 0: the
    kernels then skip every decay)."""
    if g2 is None:
        return None
    return torch.cumsum(g2.float().reshape(N, Tp // C, C), -1).reshape(N, Tp).contiguous()


@dataclass
class _Prepared:
    q: torch.Tensor
    k: torch.Tensor
    v: Optional[torch.Tensor]
    g: Optional[torch.Tensor]
    beta: Optional[torch.Tensor]
    G: Optional[torch.Tensor]
    batch: torch.Size
    T: int
    C: int

    def gates(self) -> torch.Tensor:
        """G as a tensor (zeros without a gate), for the PyTorch backward."""
        if self.G is not None:
            return self.G
        return torch.zeros(self.k.shape[:2], dtype=torch.float32, device=self.k.device)


def _pad(x: Optional[torch.Tensor], Tp: int) -> Optional[torch.Tensor]:
    if x is None or x.shape[1] == Tp:
        return x
    pad = torch.zeros(x.shape[0], Tp - x.shape[1], *x.shape[2:], dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], 1)


def structure(q, k, v, g, beta, a) -> LayerInputs:
    """``solvers.gka.validate_inputs`` without reading any value (types, dtypes, devices and
    shapes, errors naming the argument): the values (finite inputs, g <= 0, beta >= 0) are
    checked on the device by the solve kernel's flags and :func:`gate_flags`."""
    a = check.ridge_strength(a)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if x is not None:
            launch.tensor(name, x, min_ndim=1 if name in ("g", "beta") else 2)
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        if x is not None:
            check.same_kind(name, x, "q", q)
    T, D = q.shape[-2], q.shape[-1]
    if D == 0:
        raise ValueError("q must have key dimension D >= 1, got 0")
    if k.shape[-1] != D:
        raise ValueError(f"k has key dimension {k.shape[-1]} but q has {D}")
    for name, x in (("k", k), ("v", v)):
        if x.shape[-2] != T:
            raise ValueError(f"{name} has {x.shape[-2]} tokens but q has {T} (layout (..., T, D))")
    for name, x in (("g", g), ("beta", beta)):
        if x is not None and x.shape[-1] != T:
            raise ValueError(f"{name} has {x.shape[-1]} tokens but q has {T} (layout (..., T))")
    shapes = [x.shape[:-1] for x in (g, beta) if x is not None]
    batch = check.batch_shape(
        "q, k, v, g and beta", q.shape[:-2], k.shape[:-2], v.shape[:-2], *shapes
    )
    return LayerInputs(q, k, v, g, beta, a, batch)


def prepare(q, k, v, g, beta, a, chunk_size) -> _Prepared:
    """Validate the structure (errors name the argument; values: :func:`structure`), broadcast,
    flatten to ``(N, T, .)`` and pad T to a multiple of the chunk with zeros (padding tokens add
    nothing to any state)."""
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size!r}")
    if q is None or k is None:
        raise TypeError(f"{'q' if q is None else 'k'} must be a torch.Tensor, got NoneType")
    kv = v if v is not None else (q[..., :1] if isinstance(q, torch.Tensor) else q)
    inp = structure(q, k, kv, g, beta, a)
    T, D = inp.q.shape[-2], inp.q.shape[-1]
    launch.dimension("q", D)
    if v is not None:
        launch.dimension("v", v.shape[-1])
    B = inp.batch
    C = chunk_size
    Tp = max(C, -(-T // C) * C)
    q2 = _pad(launch.flat(inp.q.expand(*B, T, D), 2), Tp)
    k2 = _pad(launch.flat(inp.k.expand(*B, T, D), 2), Tp)
    v2 = None if v is None else _pad(launch.flat(inp.v.expand(*B, T, v.shape[-1]), 2), Tp)
    g2 = None if inp.g is None else _pad(launch.flat(inp.g.expand(*B, T), 1), Tp)
    b2 = None if inp.beta is None else _pad(launch.flat(inp.beta.expand(*B, T), 1), Tp)
    G = chunk_cumulative_gates(g2, q2.shape[0], Tp, C, q2.device)
    return _Prepared(q2, k2, v2, g2, b2, G, B, T, C)


def chunk_states(p: _Prepared, state_dtype: torch.dtype, prec: str, with_u: bool):
    """The states ``H``, ``U`` at every chunk start, ``(N, NC, D, D)`` / ``(N, NC, Dv, D)``."""
    N, Tp, D = p.k.shape
    NC = Tp // p.C
    Dv = p.v.shape[-1] if with_u else 1
    H0 = launch.empty_out((N, NC, D, D), state_dtype, p.k.device)
    U0 = launch.empty_out((N, NC, Dv, D), state_dtype, p.k.device) if with_u else H0
    BJ = min(STATES_BLOCK_J, launch.block(D))
    if N:
        dummy = p.k
        states_kernel[(N, triton.cdiv(D, BJ))](
            p.k,
            p.v if with_u else p.k,
            _or(p.G, dummy),
            _or(p.beta, dummy),
            H0,
            U0,
            NC,
            D=D,
            DV=Dv,
            BLOCK_D=launch.block(D),
            BLOCK_V=launch.block(Dv),
            BLOCK_J=BJ,
            C=p.C,
            HAS_G=p.G is not None,
            HAS_B=p.beta is not None,
            HAS_U=with_u,
            PREC=PRECISIONS[prec],
            num_warps=4,
            # the walk's loads pipelined (states_kernel's comment); for the solve stage's walk
            # (bf16 keys and states, H alone) one stage more is 12-14% faster at GKA's size
            # (runs 13-14, docs/validation.md); with U, or float32 states (the backward), it was
            # as fast or slower, so those keep 3
            num_stages=4 if p.k.dtype == state_dtype == torch.bfloat16 and not with_u else 3,
        )
    return H0, (U0 if with_u else None)


def _or(x: Optional[torch.Tensor], dummy: torch.Tensor) -> torch.Tensor:
    """A pointer for an absent optional input (the kernel never reads it: HAS_G / HAS_B off)."""
    return x if x is not None else dummy


def solve_chunks(p: _Prepared, rhs, H0, U0, *, a, iters, prec, x_dtype, y_dtype=None, store_x=True):
    """Eq. (5), the r Chebyshev steps and (with U0) Y for every chunk: ``(x, y, fro, flags)``
    padded; ``flags`` ``(N, NC)`` int32 per chunk, bits as in kernels/gka_layer_fwd.py (a
    non-finite q or k, v, H_t = 0 at a token < T, a non-finite x or y)."""
    N, Tp, D = p.k.shape
    NC = Tp // p.C
    Dv = p.v.shape[-1] if U0 is not None else 1
    x = launch.empty_out((N, Tp, D), x_dtype, p.k.device)
    y = launch.empty_out((N, Tp, Dv), y_dtype, p.k.device) if U0 is not None else None
    fro = launch.empty_out((N, Tp), torch.float32, p.k.device)
    flags = launch.empty_out((N, NC), torch.int32, p.k.device)
    a64 = float(a)
    step_scale = 2.0 / (1.0 + 2.0 * a64)  # 2/(L + mu) times ||H_t||_F
    if N:
        solve_kernel[(N, NC)](
            rhs,
            p.k,
            _or(p.v if U0 is not None else None, p.k),
            _or(p.G, fro),
            _or(p.beta, fro),
            H0,
            _or(U0, H0),
            x,
            _or(y, x),
            fro,
            flags,
            p.T,
            NC,
            iters,
            a64,
            step_scale,
            (1.0 / (1.0 + 2.0 * a64)) ** 2,
            step_scale * a64,
            D=D,
            DV=Dv,
            BLOCK_D=launch.block(D),
            BLOCK_V=launch.block(Dv),
            C=p.C,
            HAS_G=p.G is not None,
            HAS_B=p.beta is not None,
            HAS_Y=U0 is not None,
            STORE_X=store_x,
            PREC=PRECISIONS[prec],
            SQRT=_FRO_SQRT,
            **SOLVE_LAUNCH,
        )
    return x, y, fro, flags


def _unpad(x: torch.Tensor, p: _Prepared) -> torch.Tensor:
    return x[:, : p.T].reshape(*p.batch, p.T, *x.shape[2:])


def gate_flags(g: Optional[torch.Tensor], beta: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A device bool: some g is not finite or > 0, or some beta is not finite or < 0 (no
    synchronisation; the small (..., T) gates only)."""
    bad = None
    for x, out_of_range in ((g, lambda t: t > 0), (beta, lambda t: t < 0)):
        if x is not None and x.numel():
            b = (~torch.isfinite(x) | out_of_range(x)).any()
            bad = b if bad is None else bad | b
    return bad


def _explain(q, k, v, g, beta, a, fro: torch.Tensor, out: torch.Tensor) -> None:
    """Raise the error of a call whose flags were raised, as the references would: the input
    checks of ``solvers.gka.validate_inputs`` (naming the argument), then H_t = 0; a result that
    overflowed from finite inputs is returned as the references return it."""
    validate_inputs(q, k, v if v is not None else q[..., :1], g, beta, a)
    check_frobenius(fro)
    launch.finite_result(
        out,
        **{
            n: x
            for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))
            if x is not None
        },
    )


def _record_checks(checks, flags, p: _Prepared, fro2, out2, q, k, v, g, beta, a) -> None:
    """One device bool for the call (kernel flags and gate ranges) and its explanation."""
    if checks is None:
        return
    bad = (
        flags.amax() > 0
        if flags.numel()
        else torch.zeros((), dtype=torch.bool, device=flags.device)
    )
    gbad = gate_flags(g, beta)
    if gbad is not None:
        bad = bad | gbad
    fro, out = fro2[:, : p.T], out2[:, : p.T]
    checks.add(bad, lambda: _explain(q, k, v, g, beta, a, fro, out))


def _forward(p: _Prepared, *, a, iters, contract, layer: bool, x_dtype, y_dtype, kernel="triton"):
    prec = CONTRACTS[contract]
    state_dtype = torch.bfloat16 if prec == "bf16" else torch.float32
    H0, U0 = chunk_states(p, state_dtype, prec, with_u=layer)
    if kernel == "wgmma":  # eq. (5), the loop and y on warp-group MMA (kernels/gka_layer_wgmma.py)
        return wgmma.solve_chunks_wgmma(
            p, H0, U0, a=a, iters=iters, x_dtype=x_dtype, y_dtype=y_dtype, sqrt=_FRO_SQRT
        )
    return solve_chunks(
        p, p.q, H0, U0, a=a, iters=iters, prec=prec, x_dtype=x_dtype, y_dtype=y_dtype
    )


def solve_kernel_for(q, g, beta, contract: str, v=None, auto_chunk: bool = True) -> str:
    """Which kernel runs a call's forward: "wgmma" where the warp-group MMA kernel applies
    (``SOLVE_KERNEL``; v: the layer's values, None for the solve stage; ``auto_chunk``: the caller
    left the chunk size to the default), else "triton"."""
    if (
        SOLVE_KERNEL == "auto"
        and auto_chunk
        and wgmma.supported(q, g is not None or beta is not None, contract, v)
    ):
        return "wgmma"
    return "triton"


def _unbroadcast(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sum a gradient of the broadcast shape back to the shape of the input ``like``."""
    extra = grad.ndim - like.ndim
    if extra:
        grad = grad.sum(tuple(range(extra)))
    dims = tuple(i for i, (s, t) in enumerate(zip(like.shape, grad.shape)) if s == 1 and t != 1)
    if dims:
        grad = grad.sum(dims, keepdim=True)
    return grad.to(like.dtype)


def _cotangent_solve(p: _Prepared, dx2, H0, *, a, iters, contract, kernel):
    """dq = the r Chebyshev steps on the cotangent dx (eq. (6)), ``(N, Tp, D)`` float32: with
    ``kernel="wgmma"`` (where the forward ran there) on the warp-group MMA kernel, in its chunks
    of 64 with bf16 states of its own (at GKA's size the Triton solve at the backward's chunk
    took 0.76 ms, the forward's solve on warp-group MMA 0.50 ms); else by the Triton solve kernel
    on the backward's states."""
    if kernel == "wgmma":
        C = wgmma.CHUNK
        Tp = max(C, -(-p.T // C) * C)
        p64 = _Prepared(_pad(p.q, Tp), _pad(p.k, Tp), None, None, None, None, p.batch, p.T, C)
        H64, _ = chunk_states(p64, torch.bfloat16, CONTRACTS[contract], with_u=False)
        rhs = _pad(dx2, Tp).contiguous()
        dq, _, _, _ = wgmma.solve_chunks_wgmma(
            p64, H64, a=a, iters=iters, x_dtype=torch.float32, sqrt=_FRO_SQRT, rhs=rhs
        )
        return dq[:, : dx2.shape[1]].contiguous()  # the backward's padding is never longer
    dq, _, _, _ = solve_chunks(
        p, dx2, H0, None, a=a, iters=iters, prec=CONTRACTS[contract], x_dtype=torch.float32
    )
    return dq


def backward_chunks(p: _Prepared, x2, fro2, dx2, dy2, *, a, iters, contract, dq_kernel="triton"):
    """dq, dk, dv, dg, dbeta as flat padded ``(N, Tp, .)`` float32 tensors (module docstring).
    Its PyTorch float32 products run in IEEE float32 whatever the caller's TF32 setting
    (``launch.ieee_float32_matmuls``): the contract, and LTB-dq, have them in float32."""
    with launch.ieee_float32_matmuls():
        return _backward_chunks(
            p, x2, fro2, dx2, dy2, a=a, iters=iters, contract=contract, dq_kernel=dq_kernel
        )


def _backward_chunks(p: _Prepared, x2, fro2, dx2, dy2, *, a, iters, contract, dq_kernel):
    prec = CONTRACTS[contract]
    layer = dy2 is not None
    H0, U0 = chunk_states(p, torch.float32, prec, with_u=layer)
    C = p.C
    K, G = chunked(p.k.float(), C), chunked(p.gates(), C)
    beta = None if p.beta is None else chunked(p.beta.float(), C)
    V = dY = None
    if layer:
        V, dY = chunked(p.v.float(), C), chunked(dy2, C)
        dx2 = transposed_state_products(dY, K, V, G, beta, U0).reshape(
            dx2.shape if dx2 is not None else p.q.shape
        )
    dq2 = _cotangent_solve(
        p, dx2.contiguous(), H0, a=a, iters=iters, contract=contract, kernel=dq_kernel
    )
    X, dQ = chunked(x2.float(), C), chunked(dq2, C)
    dk, dv, dbeta, dG = implicit_backward(
        K=K,
        G=G,
        beta=beta,
        X=X,
        dQ=dQ,
        fro=chunked(fro2, C),
        S=H0,
        a=a,
        V=V,
        dY=dY,
        R=U0,
        carry=carry_backwards,
        symmetric_carry=symmetric_carry,
    )
    flat = lambda t: None if t is None else t.reshape(t.shape[0], -1, *t.shape[3:])  # noqa: E731
    dG = flat(dG)
    dG[:, p.T :] = 0.0
    dg = reverse_cumsum(dG[:, : p.T])
    return dq2, flat(dk), flat(dv), dg, flat(dbeta)


class _GKAFunction(torch.autograd.Function):
    """y (layer) or x (solve stage) with the implicit backward of the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, cfg):
        layer = v is not None
        kernel = solve_kernel_for(q, g, beta, cfg["contract"], v, cfg["auto_chunk"])
        chunk = wgmma.CHUNK if kernel == "wgmma" else cfg["chunk_size"]
        p = prepare(q, k, v, g, beta, cfg["a"], chunk)
        x2, y2, fro2, flags = _forward(
            p,
            a=cfg["a"],
            iters=cfg["iters"],
            contract=cfg["contract"],
            layer=layer,
            x_dtype=cfg["x_dtype"],
            y_dtype=q.dtype,
            kernel=kernel,
        )
        checks = launch.checks_for(cfg["check_inputs"], p.k.device)
        _record_checks(checks, flags, p, fro2, y2 if layer else x2, q, k, v, g, beta, cfg["a"])
        launch.finish_checks(cfg["check_inputs"], checks)
        ctx.cfg = cfg
        ctx.batch = tuple(p.batch)
        ctx.save_for_backward(q, k, v, g, beta, x2, fro2)
        out = _unpad(y2 if layer else x2, p)
        aux = _unpad(x2, p) if layer else x2.new_empty(0)
        fro = _unpad(fro2, p)
        ctx.mark_non_differentiable(aux, fro)
        return out, aux, fro

    @staticmethod
    @once_differentiable  # the implicit backward is not itself differentiable
    def backward(ctx, d_out, _d_aux, _d_fro):
        q, k, v, g, beta, x2, fro2 = ctx.saved_tensors
        if q.shape[-2] == 0 or 0 in ctx.batch:  # nothing computed: zero gradients
            return (*(None if x is None else torch.zeros_like(x) for x in (q, k, v, g, beta)), None)
        cfg = ctx.cfg
        # the configured chunk, also after a warp-group MMA forward in chunks of 64 (the
        # backward's Triton kernels run best at the default); padding to a multiple of it never
        # exceeds the forward's padding, so x and ||H||_F are cut to it
        p = prepare(q, k, v, g, beta, cfg["a"], cfg["chunk_size"])
        N, Tp = p.q.shape[0], p.q.shape[1]
        x2, fro2 = x2[:, :Tp].contiguous(), fro2[:, :Tp].contiguous()
        cot = _pad(
            d_out.expand(*p.batch, *d_out.shape[-2:]).reshape(N, p.T, -1).float(), Tp
        ).contiguous()
        layer = v is not None
        dq2, dk2, dv2, dg2, db2 = backward_chunks(
            p,
            x2,
            fro2,
            None if layer else cot,
            cot if layer else None,
            a=cfg["a"],
            iters=cfg["iters"],
            contract=cfg["contract"],
            dq_kernel=solve_kernel_for(q, g, beta, cfg["contract"], v, cfg["auto_chunk"]),
        )
        B, T = p.batch, p.T
        grads = [
            _unbroadcast(dq2[:, :T].reshape(*B, T, -1), q),
            _unbroadcast(dk2[:, :T].reshape(*B, T, -1), k),
        ]
        grads.append(None if not layer else _unbroadcast(dv2[:, :T].reshape(*B, T, -1), v))
        grads.append(None if g is None else _unbroadcast(dg2.reshape(*B, T), g))
        grads.append(None if beta is None else _unbroadcast(db2[:, :T].reshape(*B, T), beta))
        return (*grads, None)


def _chunk_size(chunk_size) -> int:
    """A chunk size of CHUNK_SIZES as a Python int (the kernels take it as a compile-time
    constant: 16.0 or a numpy integer would fail deep inside)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral):
        raise TypeError(f"chunk_size must be an int in {CHUNK_SIZES} or None, got {chunk_size!r}")
    if int(chunk_size) not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size!r}")
    return int(chunk_size)


def _ridge_in_float32(a) -> float:
    """a checked as the reference checks it, in the kernels' float32 arithmetic."""
    a = check.ridge_strength(a)
    check_ridge_in(a, torch.float32)
    return a


def _config(a, iters, chunk_size, contract, dtype, x_dtype, check_inputs):
    contract = resolve_contract(contract, dtype)
    if not (isinstance(check_inputs, bool) or isinstance(check_inputs, launch.DeferredChecks)):
        raise TypeError(
            f"check_inputs must be True, False or a kernels.DeferredChecks, got {type(check_inputs).__name__}"
        )
    return {
        "a": _ridge_in_float32(a),
        "iters": check.count("iters", iters),
        "chunk_size": DEFAULT_CHUNK[contract] if chunk_size is None else _chunk_size(chunk_size),
        "auto_chunk": chunk_size is None,
        "contract": contract,
        "x_dtype": x_dtype,
        "check_inputs": check_inputs,
    }


def gka_layer(
    q,
    k,
    v,
    g=None,
    beta=None,
    *,
    a: float,
    solver: str = "chebyshev",
    iters: int,
    chunk_size: Optional[int] = None,
    contract: Optional[str] = None,
    bf16_mode: str = "storage",
    return_info: bool = False,
    check_inputs=True,
):
    """GKA layer output ``y_t = U_t x_t`` (eq. (CH), eq. (55)) with r Chebyshev steps per token.

    Contract: ``contract`` (module docstring): ``"bfloat16/operands"`` -- float32 iterate,
    residual, accumulators and eq. (5), bf16 product operands; ``"float32/ieee"`` /
    ``"float32/tf32x3"`` -- float32-accurate products.

    Args as ``solvers.gka_layer`` (q, k ``(..., T, D)``, v ``(..., T, Dv)``, g, beta ``(..., T)`` or
    None; float32 or bfloat16 on a CUDA device, D, Dv <= 128), with ``solver="chebyshev"`` only
    and ``iters`` required; ``chunk_size`` in (16, 32, 64) or None (``DEFAULT_CHUNK`` of the
    contract: at D = 128 float32 operands need the smaller chunks); ``bf16_mode`` must be ``"storage"``
    (the kernel rounds only stored values and product operands).
    ``check_inputs``: True, False or a ``kernels.DeferredChecks`` (module docstring).
    Returns y in q's dtype, or ``(y, GKAKernelInfo)``. Differentiable in q, k, v, g, beta by the
    implicit backward. Raises ValueError if some ``H_t = 0`` or an input is not finite.
    """
    if solver != "chebyshev":
        raise ValueError(
            f"kernels.gka_layer supports solver='chebyshev' only, got {solver!r} "
            "(solvers.gka_layer has 'exact' and 'cg')"
        )
    if bf16_mode != "storage":
        raise ValueError(f"kernels.gka_layer supports bf16_mode='storage' only, got {bf16_mode!r}")
    if v is None:
        raise TypeError("v must be a tensor (..., T, Dv)")
    cfg = _config(
        a,
        iters,
        chunk_size,
        contract,
        q.dtype if isinstance(q, torch.Tensor) else None,
        None,
        check_inputs,
    )
    cfg["x_dtype"] = q.dtype if isinstance(q, torch.Tensor) else None  # prepare() names a bad q
    y, x, fro = _GKAFunction.apply(q, k, v, g, beta, cfg)
    if not return_info:
        return y
    fro64 = fro.detach().to(torch.float64)
    completed = torch.full(fro.shape, int(Status.COMPLETED), device=fro.device)
    return y, GKAKernelInfo(
        x=x.detach(),
        fro=fro64,
        lam=cfg["a"] * fro64,
        precision=cfg["contract"],
        solver=solver,
        iters=cfg["iters"],
        system_status=nonfinite_status(y.detach(), nonfinite_status(x.detach(), completed)),
    )


def gka_solve(
    q,
    k,
    g=None,
    beta=None,
    *,
    a: float,
    iters: int,
    chunk_size: Optional[int] = None,
    contract: Optional[str] = None,
    out_dtype=None,
    return_fro: bool = False,
    check_inputs=True,
):
    """The solve stage alone: ``x_t`` = r Chebyshev steps on ``(H_t + a ||H_t||_F I) x_t = q_t`` for
    every token (chunk states, eq. (5), Algorithm 1), H_t never formed.

    Contract: as :func:`gka_layer`. Returns x ``(..., T, D)`` in ``out_dtype`` (default q's dtype)
    and with ``return_fro`` also the float32 ``||H_t||_F``. Differentiable (implicit backward:
    dq by one more solve, dk, dg, dbeta through the chunk recurrence).
    """
    dt = launch.out_dtype(out_dtype, q.dtype if isinstance(q, torch.Tensor) else torch.float32)
    cfg = _config(
        a,
        iters,
        chunk_size,
        contract,
        q.dtype if isinstance(q, torch.Tensor) else None,
        dt,
        check_inputs,
    )
    x, _, fro = _GKAFunction.apply(q, k, None, g, beta, cfg)
    return (x, fro) if return_fro else x
