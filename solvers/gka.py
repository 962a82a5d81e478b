"""The Gated KalmaNet layer, per token: test-time ridge regression (GKA Sec. 4.1, eq. (CH)).

For t = 1..T, from H_0 = 0, U_0 = 0 (GKA eq. (CH); with the input gate beta_t of appendix
eq. (55)):

    H_t = gamma_t H_{t-1} + beta_t k_t k_t^T,     U_t = gamma_t U_{t-1} + beta_t v_t k_t^T
    lambda_t = a ||H_t||_F                                                       (Sec. 4.1, eq. (4))
    x_t = solve(H_t + lambda_t I, q_t),           y_t = U_t x_t

``solve`` is an exact (Cholesky) solve, r iterations of Chebyshev (GKA Algorithm 1 with
``L = ||H_t||_F + lambda_t``, ``mu = lambda_t``, so that ``kappa_t <= (a + 1)/a``) or r
iterations of CG. ``gamma_t = exp(g_t)``: the decay gate enters in log space (``g_t <= 0``),
as in appendix D.2; ``g=None`` is the "no weighting" ablation (appendix J.2, gamma = 1) and
``beta=None`` drops the input gate (beta = 1).

Layout: ``q, k (..., T, D)``, ``v (..., T, Dv)``, ``g, beta (..., T)``; leading dimensions
broadcast. flash-linear-attention's ``(B, T, H, D)`` is ``x.transpose(1, 2)`` of this.

Precision (``solvers._arith``): the states H_t, U_t, the system matrix ``H_t + lambda_t I``,
the solution x_t and the output y_t are stored values; ``||H_t||_F`` and lambda_t stay in the
compute dtype (a kernel keeps them as fp32 scalars).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import validation as check
from ._arith import Arith
from .cg import cg
from .chebyshev import chebyshev
from .cholesky import cholesky_solve
from .solve_info import Status, nonfinite_status, residual_norm64, worst_status

SOLVERS = ("exact", "chebyshev", "cg")


@dataclass
class GKAInfo:
    """What the layer computed besides y (``return_info=True``).

    x: ``(..., T, D)`` stored solutions; fro, lam: ``(..., T)`` float64 copies of the
    computed ``||H_t||_F`` and ``lambda_t``; residual_norms: ``(..., T)`` float64
    ``||q_t - (H_t + lambda_t I) x_t||`` with the stored system matrix; system_status:
    ``(..., T)`` :class:`Status` codes (BREAKDOWN: a Cholesky pivot <= 0; NONFINITE).
    """

    x: torch.Tensor
    fro: torch.Tensor
    lam: torch.Tensor
    residual_norms: torch.Tensor
    system_status: torch.Tensor
    precision: str
    solver: str
    iters: Optional[int]

    @property
    def status(self) -> Status:
        return worst_status(self.system_status)


@dataclass
class LayerInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: Optional[torch.Tensor]
    beta: Optional[torch.Tensor]
    a: float
    batch: torch.Size


def validate_gates(g, beta, ref_name: str, ref: torch.Tensor):
    """``g`` (log decays <= 0) and ``beta`` (>= 0), each ``(..., T)`` or None, for the
    ``(..., T, D)`` tensor ``ref``. Returns ``(g, beta, [their batch shapes])``."""
    T = ref.shape[-2]
    out, shapes = [], []
    for name, x in (("g", g), ("beta", beta)):
        if x is not None:
            x = check.tensor(name, x, min_ndim=1)
            check.same_kind(name, x, ref_name, ref)
            if x.shape[-1] != T:
                raise ValueError(
                    f"{name} has {x.shape[-1]} tokens but {ref_name} has {T} (layout (..., T))"
                )
            shapes.append(x.shape[:-1])
        out.append(x)
    g, beta = out
    if g is not None and g.numel() and bool((g > 0).any()):
        raise ValueError(f"g = log gamma must be <= 0 (gamma in [0, 1]), got max {float(g.max())}")
    if beta is not None and beta.numel() and bool((beta < 0).any()):
        raise ValueError(f"beta must be >= 0, got min {float(beta.min())}")
    return g, beta, shapes


def validate_keys(name: str, k) -> torch.Tensor:
    k = check.tensor(name, k, min_ndim=2)
    if k.shape[-1] == 0:
        raise ValueError(f"{name} must have key dimension D >= 1, got 0")
    return k


def validate_inputs(q, k, v, g, beta, a) -> LayerInputs:
    """Check and broadcast the layer's inputs (shared by the layer and its gradients).
    Raises TypeError/ValueError naming the argument."""
    a = check.ridge_strength(a)
    q = validate_keys("q", q)
    k = validate_keys("k", k)
    v = check.tensor("v", v, min_ndim=2)
    check.same_kind("k", k, "q", q)
    check.same_kind("v", v, "q", q)
    check.has_values("q", q, "the GKA layer (its gate and zero-key checks)")
    T, D = q.shape[-2], q.shape[-1]
    if k.shape[-1] != D:
        raise ValueError(f"k has key dimension {k.shape[-1]} but q has {D}")
    for name, x in (("k", k), ("v", v)):
        if x.shape[-2] != T:
            raise ValueError(f"{name} has {x.shape[-2]} tokens but q has {T} (layout (..., T, D))")
    g, beta, gate_shapes = validate_gates(g, beta, "q", q)
    batch = check.batch_shape(
        "q, k, v, g and beta", q.shape[:-2], k.shape[:-2], v.shape[:-2], *gate_shapes
    )
    return LayerInputs(q, k, v, g, beta, a, batch)


def rank1_update(
    ar: Arith, S: torch.Tensor, gamma, left: torch.Tensor, right: torch.Tensor
) -> torch.Tensor:
    """``store(gamma * S + left right^T)``; ``gamma=None`` means 1 (no multiply, no rounding)."""
    prev = ar.up(S)
    if gamma is not None:
        prev = gamma[..., None, None] * prev
    return ar.store(prev + left.unsqueeze(-1) * right.unsqueeze(-2))


def check_frobenius(fro: torch.Tensor, first_token: int = 1) -> None:
    """Raise the layer's error for the first token whose ``||H_t||_F`` is 0 (then lambda_t = 0 and
    ``H_t + lambda_t I`` is singular) or not finite (it overflowed from finite inputs).

    fro: ``(..., n)`` the norms of tokens ``first_token, ..., first_token + n - 1`` (1-based)."""
    if fro.numel() == 0:
        return
    over = ~torch.isfinite(fro)
    zero = ~over & ~(fro > 0)
    bad = (over | zero).reshape(-1, fro.shape[-1]).any(0)
    if not bool(bad.any()):
        return
    i = int(bad.nonzero()[0, 0])
    t = first_token + i
    if bool(over[..., i].any()):
        raise ValueError(
            f"||H_t||_F is not finite at token t = {t}: it overflows {str(fro.dtype)[6:]} "
            "(||H_t||_F grows like sum_t beta_t ||k_t||^2: the keys k or input gates beta are too "
            "large; rescale them)"
        )
    raise ValueError(
        f"H_t = 0 at token t = {t} (keys k / input gate beta vanish with no earlier state): "
        "lambda_t = a ||H_t||_F = 0 and H_t + lambda_t I is singular"
    )


def check_ridge_in(a: float, compute: torch.dtype) -> None:
    """``a`` as the computation holds it: a ridge strength that rounds to 0 or inf in the
    compute dtype (float32: a below 1e-45 or above 3e38) makes every ``lambda_t`` 0 or inf, a
    singular or NaN system; ValueError naming a."""
    held = torch.tensor(a, dtype=compute)
    if not (bool(torch.isfinite(held)) and float(held) > 0):
        raise ValueError(
            f"a = {a!r} rounds to {float(held)} in {str(compute)[6:]}: lambda_t = a ||H_t||_F "
            "would be 0 or inf; use a positive a that the working precision holds"
        )


def _connected_zeros(shape, ar: Arith, inp: LayerInputs) -> torch.Tensor:
    """Zeros of ``shape`` that depend on every input (their gradients are zeros, not missing)."""
    zero = sum(x.sum() for x in (inp.q, inp.k, inp.v, inp.g, inp.beta) if x is not None) * 0
    return ar.store(zero.to(ar.dtype)).expand(shape).clone()


@dataclass
class _Trace:
    y: torch.Tensor
    x: torch.Tensor
    fro: torch.Tensor
    lam: torch.Tensor
    residual: torch.Tensor
    status: torch.Tensor
    H: Optional[torch.Tensor]
    U: Optional[torch.Tensor]


def run_layer(
    inp: LayerInputs, ar: Arith, solver: str, iters: Optional[int], keep_states: bool = False
) -> _Trace:
    """The per-token recurrence on validated inputs (shared with ``solvers.gka_grad``)."""
    B, T, D = inp.batch, inp.q.shape[-2], inp.q.shape[-1]
    Dv = inp.v.shape[-1]
    q = inp.q.expand(*B, T, D)
    k = inp.k.expand(*B, T, D)
    v = inp.v.expand(*B, T, Dv)
    gamma = None if inp.g is None else torch.exp(ar.up(inp.g.expand(*B, T)))
    beta = None if inp.beta is None else ar.up(inp.beta.expand(*B, T))
    H = torch.zeros(*B, D, D, dtype=ar.dtype, device=q.device)
    U = torch.zeros(*B, Dv, D, dtype=ar.dtype, device=q.device)
    eye = torch.eye(D, dtype=ar.compute, device=q.device)
    a = ar.scalar(inp.a)
    check_ridge_in(inp.a, ar.compute)
    ys, xs, fros, lams, res, stats, Hs, Us = [], [], [], [], [], [], [], []
    for t in range(T):
        kt = ar.up(k[..., t, :])
        g_t = None if gamma is None else gamma[..., t]
        bk = kt if beta is None else beta[..., t, None] * kt
        bv = ar.up(v[..., t, :]) if beta is None else beta[..., t, None] * ar.up(v[..., t, :])
        H = rank1_update(ar, H, g_t, bk, kt)
        U = rank1_update(ar, U, g_t, bv, kt)
        fro = ar.norm(H.flatten(-2))
        check_frobenius(fro.unsqueeze(-1), first_token=t + 1)
        lam = a * fro
        A = ar.store(ar.up(H) + lam[..., None, None] * eye)
        broke = torch.zeros(B, dtype=torch.bool, device=q.device)
        if solver == "exact":
            x, broke = cholesky_solve(ar, A, q[..., t, :])
        elif solver == "chebyshev":
            x = chebyshev(
                A,
                q[..., t, :],
                L=(fro + lam).to(torch.float64),
                mu=lam.to(torch.float64),
                iters=iters,
                bf16_mode=ar.mode,
            )
        else:
            x = cg(A, q[..., t, :], iters=iters, bf16_mode=ar.mode)
        y = ar.store(ar.matvec(U, x))
        status = torch.full(B, int(Status.COMPLETED), device=q.device)
        status = nonfinite_status(y, nonfinite_status(x, status))  # y overflows on its own
        status = torch.where(broke, torch.full_like(status, Status.BREAKDOWN), status)
        ys.append(y)
        xs.append(x)
        fros.append(fro)
        lams.append(lam)
        res.append(residual_norm64(A, q[..., t, :], x))
        stats.append(status)
        if keep_states:
            Hs.append(H)
            Us.append(U)

    def stack(items, shape, dtype, dim):
        return (
            torch.stack(items, dim) if items else torch.zeros(shape, dtype=dtype, device=q.device)
        )

    return _Trace(
        # T = 0: an empty y that is still a function of the inputs, so that a backward runs
        y=stack(ys, (*B, 0, Dv), ar.dtype, -2) if ys else _connected_zeros((*B, 0, Dv), ar, inp),
        x=stack(xs, (*B, 0, D), ar.dtype, -2),
        fro=stack(fros, (*B, 0), ar.compute, -1),
        lam=stack(lams, (*B, 0), ar.compute, -1),
        residual=stack(res, (*B, 0), torch.float64, -1),
        status=stack(stats, (*B, 0), torch.int64, -1),
        H=stack(Hs, (*B, 0, D, D), ar.dtype, -3) if keep_states else None,
        U=stack(Us, (*B, 0, Dv, D), ar.dtype, -3) if keep_states else None,
    )


def gka_layer(
    q,
    k,
    v,
    g=None,
    beta=None,
    *,
    a: float,
    solver: str = "exact",
    iters: Optional[int] = None,
    bf16_mode: str = "storage",
    return_info: bool = False,
):
    """GKA layer output ``y_t = U_t x_t``, token by token (GKA eq. (CH), appendix eq. (55)).

    Args:
        q, k: ``(..., T, D)`` queries and keys; v: ``(..., T, Dv)`` values; one dtype
            (float64 / float32 / bfloat16) and device; leading dimensions broadcast.
        a: ridge strength, ``lambda_t = a ||H_t||_F`` (finite float > 0).
        g: ``(..., T)`` log decay gates ``g_t = log gamma_t <= 0``, or None (gamma = 1).
        beta: ``(..., T)`` input gates ``beta_t >= 0`` (appendix eq. (55)), or None (beta = 1).
        solver: ``"exact"`` (Cholesky), ``"chebyshev"`` (GKA Algorithm 1) or ``"cg"``.
        iters: iterations r for chebyshev / cg (required there, must be None for exact).
        bf16_mode: ``"storage"`` or ``"strict"`` (``solvers._arith``).
        return_info: also return a :class:`GKAInfo`.

    Returns:
        y ``(..., T, Dv)`` in the inputs' dtype, or ``(y, info)``. Raises ValueError if some
        ``H_t = 0`` (then lambda_t = 0 and the system is singular).
    """
    inp = validate_inputs(q, k, v, g, beta, a)
    check.flag("return_info", return_info)
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if solver == "exact":
        if iters is not None:
            raise ValueError(
                "iters is only for solver='chebyshev' or 'cg'; the exact solve takes none"
            )
    elif iters is None:
        raise TypeError(f"solver={solver!r} needs iters (the number of iterations r)")
    else:
        iters = check.count("iters", iters)
    check.bf16_mode(bf16_mode)
    ar = Arith(inp.q.dtype, bf16_mode)
    tr = run_layer(inp, ar, solver, iters)
    if not return_info:
        return tr.y
    info = GKAInfo(
        x=tr.x,
        fro=tr.fro.to(torch.float64),
        lam=tr.lam.to(torch.float64),
        residual_norms=tr.residual,
        system_status=tr.status,
        precision=ar.label,
        solver=solver,
        iters=iters,
    )
    return tr.y, info
