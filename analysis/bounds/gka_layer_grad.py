"""A per-token bound on the GKA layer kernels' gradient dq (``kernels.gka_layer``'s implicit
backward), held against the float64 implicit dq from the same inputs and cotangent: LTB-dq.

What the kernel computes (kernels/gka_layer.py, ``backward_chunks``): the cotangent of x,
``dx_t = U_t^T dy_t`` (GKA eq. (6)'s right-hand side; y_t = U_t x_t), in PyTorch float32 from the
backward's chunk-start value states R (``states_kernel``, float32, bf16 operands under
``bfloat16/operands``) and the chunk's own tokens,

    dx_c = zeta_c R^T dy_c + sum_{j <= c} Mt[c, j] (dy_c . v_j) beta_j k_j
           (kernels.gka_layer_bwd.transposed_state_products),

then ``dq_t`` by one more r-step Chebyshev solve with the same H_t and lambda_t, the float32 dx as
its right-hand side (the Triton solve kernel on float32 chunk states rounded to bf16 as operands,
or the warp-group MMA kernel with ``RHS_F32`` on bf16 states of its own, chunks of 64), returned
in the inputs' dtype. By GKA Lemma 2 the gradient of the truncated loop with respect to q is
exactly ``dq_t = p_r(A_t) dx_t`` (x_r = p_r(A_t) q_t, A_t = H_t + lambda_t I, p_r(A_t)
symmetric): the reference here is that, in float64, with the exact ``dx_t`` (the r Chebyshev
iterates of ``(A_t, dx_t)``; it equals ``solvers.gka_implicit_grads``' dq, tested).

The bound (:func:`layer_dq_bound`), per token t:

1. **The cotangent.** ``||dx_hat_t - dx_t|| <= E_dx,t`` (:func:`cotangent_bound`). The value state
   R32 lies entrywise in ``[Rk - dR, Rk + dR]`` around the float64 state Rk of the kernel's own
   coefficient keys (``analysis.bounds.gka_layer.chunk_state_bound`` with V, ``store=False``:
   Higham 2002 eq. (2.4) for the decay, eq. (3.4) for the chunk's sums, which ``states_kernel``
   accumulates on the tensor cores: u_dot = 2^-23, truncation); ``Rk - R`` is a known
   matrix, so its effect ``zeta_t (Rk - R)^T dy_t`` enters as the norm of a known vector, and
   ``zeta_t dR^T |dy_t|``. The float32 evaluation: each state term passes through ``Dv + 2``
   roundings (``zeta dy``, the product, the sum of Dv + 1 terms) and the gate's
   ``e_z`` (the exp and chunk cumsum of LTB's 5.), each chunk term through ``(dy . v_j)``
   (gamma_Dv, Higham eq. (3.4)), the mask ``(1 + e_m)``, three products and the two sums
   (gamma_{C + Dv + 2}, Lemma 3.1 with ``(1 + gamma_a)(1 + gamma_b) <= 1 + gamma_{a+b}``). So
   ``E_dx = zeta ||(Rk - R)^T dy|| + || zeta dR^T |dy| + eps_s zeta (|Rk| + dR)^T |dy| + eps_i
   sum_j m_j (|v_j| . |dy|) |k_j| ||`` with ``eps_s = (1 + e_z)(1 + gamma_{Dv+2}) - 1`` and
   ``eps_i = (1 + gamma_Dv)(1 + e_m)(1 + u)^3 (1 + gamma_{C+Dv+2}) - 1``, u = 2^-24: PyTorch's
   float32 matmuls, which the backward runs at precision "highest"
   (``kernels._launch.ieee_float32_matmuls``: no TF32), are cuBLAS SGEMMs on the CUDA cores,
   fused multiply-adds rounding to nearest, not tensor-core products (which truncate; those are
   the states' and the solve's, charged u_dot in ``analysis.bounds.gka_layer``).
2. **The solve on the computed cotangent.** LTB (``analysis.bounds.gka_layer.layer_token_bound``,
   its module docstring derives every term, the tensor-core accumulations at u_dot = 2^-23) on
   the float64 system ``(H_t, dx_t, lambda_t)``:
   the same product error (chunk state, masked chunk product, accumulation, gates), the same
   lambda_t and step from eq. (5), the same elementwise arithmetic, with three changes:
   (a) the right-hand side is float32 and enters the kernel unrounded (no bf16 operand: it is
   only added, ``s q``); (b) the kernel's right-hand side is ``dx_hat = dx + e``, ``||e|| <=
   E_dx``: the step ``x <- ... + w_i s q`` commits the local error ``w_i s e`` at every step and
   ``s e`` at x_0, which ``linear_bound`` propagates through the exact Chebyshev responses
   tau_{i,j} on A_t's eigenvalues (``extra_plain``; the roundings counted on ``||q||`` grow by
   ``1 + E_dx / ||dx||``); (c) on the Triton path the chunk states are float32 (the backward's
   ``chunk_states``) rounded to bf16 as operands: the products see the forward's stored values,
   eq. (5)'s ``||S||_F^2`` the float32 ones (``float32_states=True``: ``| ||S32||_F^2 -
   ||S||_F^2 | <= |<Sk - S, Sk + S>| + 2 <|Sk|, dS> + ||dS||_F^2`` and ``2 zeta sum_j m_j
   |k_j^T (S_hat - S) k_j|`` for the quadratic term, then ``|f - fro| <= |f^2 - fro^2| / fro``).
3. **The output**: dq is returned in the inputs' dtype (bf16: half a spacing at the value, with
   the drift, as LTB's 7.).

Where this leaves dq's error: in bf16 the operand rounding of the iterate and the state's
rounding, as in the forward (LTB), relative to ``||dq_t||``; the cotangent's float32 error adds
``~ ||p_r(A_t)|| E_dx``, negligible at GKA's setting (no gates: the coefficient keys are the keys,
exact). The old GRAD criterion (analysis.testing.gka_gradient_harness) took dq's bound from
``2/mu`` times FWD's relative bound on the whole sequence: 9.8 ||dq|| in bf16, INCONCLUSIVE.

dv and dk are not bounded here: with the per-token bounds of x (LTB) and dq (this one) in place
of GRAD's global rho they stay INCONCLUSIVE in bf16 at GKA's setting. The worst first-order error
of dv_i, dk_i over all x and dq errors within those per-token norms is already 1.5-1.6 times
the gradient at the median at T = 128 (``analysis.studies.gka_layer_grad_tightness --dv``;
docs/gka_layer.md, "dv and dk stay INCONCLUSIVE"): ``dv_i = beta_i sum_{t >= i} M_{i,t} dy_t (x_t .
k_i)`` sees x's error through ``k_i . e_t``, which a normwise bound must allow to be all of
``||e_t||``, while ``|x_t . k_i|`` is 1.7% of ``||x_t||`` at the median (below LTB's 3.5%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from analysis.precision import gamma
from solvers import validation as _v

from .gka_layer import (
    CONTRACTS,
    F64,
    U32,
    U_BF16,
    _gate_error,
    chunk_state_bound,
    chunked,
    layer_token_bound,
    pad_chunks,
)

WGMMA_CHUNK = 64  # the warp-group MMA kernel's chunk (kernels.gka_layer_wgmma.CHUNK)


@dataclass
class LayerGradBound:
    """LTB-dq at the tokens ``tokens`` ``(n,)``: ``dq`` ``(N, n, D)`` the float64 reference
    ``p_r(A_t) dx_t``, ``bound`` ``(N, n)`` on ``||dq_kernel - dq||_2``, ``dx`` ``(N, n, D)`` the
    exact cotangent ``U_t^T dy_t`` and ``dx_error`` ``(N, n)`` the bound on the kernel's."""

    tokens: torch.Tensor
    dq: torch.Tensor
    bound: torch.Tensor
    dx: torch.Tensor
    dx_error: torch.Tensor

    @property
    def relative(self) -> torch.Tensor:
        """bound / ||dq_t||: below 1 the check says something, at or above it is INCONCLUSIVE."""
        return self.bound / torch.linalg.vector_norm(self.dq, dim=-1)


def _f64(name, x, ndim):
    if x is None:
        return None
    return _v.floating(name, x, min_ndim=ndim).detach().cpu().to(F64)


def cotangent_bound(k, v, dy, g=None, beta=None, *, chunk_size: int, contract: str):
    """The exact cotangent ``dx_t = U_t^T dy_t`` ``(N, T, D)`` and the bound ``(N, T)`` on the
    kernel's float32 one (module docstring, 1.), for the backward's chunk ``chunk_size``."""
    k, v, dy = _f64("k", k, 3), _f64("v", v, 3), _f64("dy", dy, 3)
    g, beta = _f64("g", g, 2), _f64("beta", beta, 2)
    # the backward casts the cotangent to float32 (kernels.gka_layer: ``d_out.float()``) and the
    # bound takes dy as exact there: a value float32 would round is refused, not silently charged
    # to nothing (round it first: the bound is then on the values the kernel received)
    if not torch.equal(dy.to(torch.float32).to(F64), dy):
        raise ValueError(
            "dy must be representable in float32: the kernel's backward takes the cotangent as "
            "float32 and the bound assumes it exact there (round dy to float32 first)"
        )
    N, T, D = k.shape
    Dv = v.shape[-1]
    if tuple(v.shape[:2]) != (N, T) or tuple(dy.shape) != (N, T, Dv):
        raise ValueError(
            f"v and dy must be (N, T, Dv) with (N, T) = {(N, T)}, got {tuple(v.shape)}, "
            f"{tuple(dy.shape)}"
        )
    C = chunk_size
    u_op = U_BF16 if contract == "bfloat16/operands" else 0.0
    K, G, bb = chunked(k, g, beta, C)
    V, dY = pad_chunks(v, C), pad_chunks(dy, C)
    e_gate = _gate_error(g, C)
    gated = g is not None or beta is not None
    e_m = e_gate + U32 if gated else 0.0
    R, Rk, dR = chunk_state_bound(
        V, K, G, bb, e_gate=e_gate, gated=gated, u_op=u_op, store=False
    )  # (N, nc, Dv, D)
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool))
    Mt = torch.where(lower, torch.exp((G[..., :, None] - G[..., None, :]).clamp_max(0.0)), 0.0)
    Mt = Mt * bb[..., None, :]  # [c, j] = exp(G_c - G_j) beta_j, j <= c
    zeta = torch.exp(G)[..., None]  # (N, nc, C, 1)
    dx = zeta * (dY @ R) + (Mt * (dY @ V.transpose(-1, -2))) @ K
    aY = dY.abs()
    eps_s = (1 + e_gate) * (1 + gamma(Dv + 2, U32)) - 1
    eps_i = (1 + gamma(Dv, U32)) * (1 + e_m) * (1 + U32) ** 3 * (1 + gamma(C + Dv + 2, U32)) - 1
    known = torch.linalg.vector_norm(zeta * (dY @ (Rk - R)), dim=-1)
    walk = zeta * (aY @ dR) + eps_s * zeta * (aY @ (Rk.abs() + dR))
    intra = eps_i * ((Mt * (aY @ V.abs().transpose(-1, -2))) @ K.abs())
    err = known + torch.linalg.vector_norm(walk + intra, dim=-1)
    flat = lambda t: t.reshape(N, -1, *t.shape[3:])[:, :T]  # noqa: E731
    return flat(dx), flat(err)


def layer_dq_bound(
    k,
    v,
    dy,
    g=None,
    beta=None,
    *,
    a: float,
    iters: int,
    chunk_size: int,
    contract: str,
    tokens=None,
    out_dtype: Optional[torch.dtype] = torch.bfloat16,
    dq_kernel: str = "triton",
    batch: int = 64,
) -> LayerGradBound:
    """LTB-dq (module docstring) for the tokens ``tokens`` (None: all) of ``kernels.gka_layer``'s
    backward with cotangent ``dy`` (the values the kernel received; they must be representable in
    float32, where the backward takes them: ValueError naming ``dy`` otherwise).

    k ``(N, T, D)``, v, dy ``(N, T, Dv)``, g, beta ``(N, T)`` or None; a, iters: the layer's;
    chunk_size: the backward's chunk (the call's ``chunk_size``); contract: the kernel's;
    out_dtype: the dtype dq is returned in (the inputs'); ``dq_kernel``: ``"triton"`` (the Triton
    solve on the backward's float32 states) or ``"wgmma"`` (the warp-group MMA kernel, chunks of
    64 on bf16 states, where the forward ran there). Raises ValueError where some H_t = 0."""
    if contract not in CONTRACTS:
        raise ValueError(f"contract must be one of {sorted(CONTRACTS)}, got {contract!r}")
    if dq_kernel not in ("triton", "wgmma"):
        raise ValueError(f"dq_kernel must be 'triton' or 'wgmma', got {dq_kernel!r}")
    C = _v.count("chunk_size", chunk_size, minimum=1)
    dx, err = cotangent_bound(k, v, dy, g, beta, chunk_size=C, contract=contract)
    T = dx.shape[1]
    tokens = (
        torch.arange(T) if tokens is None else torch.as_tensor(tokens, dtype=torch.long).flatten()
    )
    if tokens.numel() == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= T:
        raise ValueError(f"tokens must be non-empty indices in [0, {T}), got {tokens.tolist()}")
    solve = layer_token_bound(
        dx,
        k,
        g,
        beta,
        a=a,
        iters=iters,
        chunk_size=WGMMA_CHUNK if dq_kernel == "wgmma" else C,
        contract=contract,
        tokens=tokens,
        out_dtype=out_dtype,
        batch=batch,
        rhs_error=err[:, tokens],
        float32_states=dq_kernel == "triton",
    )
    return LayerGradBound(tokens, solve.x, solve.bound, dx[:, tokens], err[:, tokens])


__all__ = ["LayerGradBound", "cotangent_bound", "layer_dq_bound"]
