"""A per-token forward bound on the GKA layer's output ``y_t = U_t x_t`` (GKA eq. (CH), appendix
eq. (55)) for the chunkwise kernels (``kernels.gka_layer``, Triton and warp-group MMA), held against
the float64 reference: ``y_t = U_t x_t`` with U_t the exact value state and x_t the float64 r-step
iterate, from the same inputs.

``LTB-y`` (:func:`layer_output_bound`). For a token t of chunk c the kernels compute, after the
solve, ``y = zeta_t R_hat^T xi + sum_{c0<=j<=t} A_j v_j`` in float32 with ``xi`` the stored x
(``x_hat``, as the kernel returns it, as a product operand), ``R_hat`` the stored chunk-start value
state and ``A_j = op(fl(fl(k_j . xi) Mt_tj))`` the masked chunk product (kernels/gka_layer_fwd.py,
``HAS_Y``; kernels/gka_layer_wgmma.py, ``HAS_Y``), then store y in ``out_dtype``. With u, u_dot,
u_op, gamma_m, ubar, e_gate, e_z, e_m as in ``analysis.bounds.gka_layer`` (u = 2^-24 on the CUDA
cores, u_dot = 2^-23 for the accumulation inside a tensor-core product; Higham 2002: the standard
model eq. (2.4), Lemma 3.1, eq. (3.4) for sums, eq. (3.11) for products with a vector), and
``U_t = zeta_t R + sum_j m_j v_j k_j^T`` the exact value state:

    y_hat - U_t x = U_t (xi - x) + zeta (R_hat - R) xi + sum_j (A_j - m_j k_j . xi) v_j
                    + (the float32 accumulation and the gate) + (the store)

0. **The iterate.** ``||xi - x|| <= E_xi = E_x + u_x (||x|| + E_x)``, E_x the LTB bound on
   ``||x_hat - x||`` (``analysis.bounds.gka_layer.layer_token_bound`` with the same ``out_dtype``:
   the kernels multiply the stored x) and u_x = u_op where the operand rounds x again (x stored in
   float32 under bf16 operands), else 0. Its effect: ``||U_t||_2 E_xi`` (normwise: LTB bounds a
   norm, not a direction).
1. **The value state.** ``states_kernel`` walks ``R <- fl(zeta_C R) + V^T Kc`` with the same
   coefficient keys Kc as the key state, and stores R in bf16 (bf16 operands) or float32:
   ``analysis.bounds.gka_layer.chunk_state_bound`` with V in place of K gives the exact R, the
   centre Rm and the half-width RU of the interval ``R_hat`` lies in, entrywise (LTB item 1). With
   ``E0 = Rm - R`` known: ``||(R_hat - R) xi|| <= ||E0||_2 ||xi|| + || RU |xi| ||``.
2. **The masked chunk product** (LTB item 2): ``A_j = m_j (k_j . xi + e_j)(1 + theta_j)``,
   ``|theta_j| <= ubar``, ``|e_j| <= gamma_D(u_dot) |k_j|^T |xi|`` (eq. (3.4); ``k_j . xi`` is a
   tensor-core product). The theta part,
   ``G^T diag(theta) F xi`` with ``F = diag(sqrt m) K``, ``G = diag(sqrt m) V``, is at most
   ``ubar ||V^T diag(m) V||_2^(1/2) ||F xi||`` and at most ``ubar || |V|^T (m |K xi|) ||``
   (componentwise); the smaller is taken. The e part: ``(1 + ubar) gamma_D(u_dot) || |V|^T (m |K|
   |xi|) ||``.
3. **The float32 accumulation** (eq. (3.4)): every term of y passes through at most D + C + 2
   roundings (the product, the D-term and C-term sums, the gate, the sum of the two parts; the
   tensor cores' accumulation onto the first part counted too): ``gamma_{D+C+4}(u_dot) || zeta (1 +
   e_z) |R_hat| |xi| + (1 + ubar)(1 + gamma_D(u_dot)) |V|^T (m |K| |xi|) ||``, and the gate's own
   error ``e_z zeta |R_hat| |xi|`` (Triton multiplies the state part by the float32 zeta_t). The
   sums are tensor-core products (``X R^T`` and ``A V`` accumulating onto it: ``mm_acc``,
   ``warpgroup_mma(..., acc)``), which truncate; the one or two roundings on the CUDA cores (the
   gated Triton path's ``fl(zeta fl(X R^T))``, the float32 model's ``Y + mm(A, V)``) are charged
   at u_dot too, the larger unit.
4. **The store** of y in ``out_dtype``: ``analysis.bounds.contract.store_error_bound`` at y with
   the drift 0.-3. (float32: none, the accumulator is float32).

Where only ``||xi - x||`` is known, every ``|xi|`` above is taken as ``|x| + d``, ``||d|| <=
E_xi``: ``|| M |xi| || <= || M |x| || + ||M||_2 E_xi`` for an entrywise non-negative M. The float64
evaluation (reference, norms) is inside ``contract.SAFETY``. As in LTB, float32 arithmetic on the
CUDA cores is IEEE round to nearest (u) and the float32 accumulation inside a tensor-core product
(``tl.dot``, ``warpgroup_mma``: the value state's walk, ``k_j . xi``, y's sums) truncates (Fasi
et al. 2021), charged u_dot = 2^-23 as in ``analysis.bounds.kla_kernel``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from analysis.precision import gamma
from solvers import validation as _v

from .contract import SAFETY, store_error_bound
from .gka_layer import (
    CONTRACTS,
    F64,
    U32,
    U_BF16,
    U_DOT,
    _gate_error,
    chunk_state_bound,
    chunked,
    layer_token_bound,
    pad_chunks,
    round_bf16,
)


@dataclass
class LayerOutputBound:
    """LTB-y at the tokens ``tokens`` ``(n,)`` of every sequence: ``y`` ``(N, n, Dv)`` the float64
    reference output ``U_t x_t``, ``bound`` ``(N, n)`` on ``||y_kernel - y||_2``; ``x``,
    ``x_bound`` the float64 iterate and LTB on the kernel's stored x."""

    tokens: torch.Tensor
    y: torch.Tensor
    bound: torch.Tensor
    x: torch.Tensor
    x_bound: torch.Tensor

    @property
    def relative(self) -> torch.Tensor:
        """bound / ||y_t||: below 1 the check says something, at or above it is INCONCLUSIVE."""
        return self.bound / torch.linalg.vector_norm(self.y, dim=-1)


def _nonneg_norm(M: torch.Tensor, x: torch.Tensor, slack: torch.Tensor) -> torch.Tensor:
    """A bound on ``|| M |xi| ||`` for entrywise non-negative M ``(..., m, D)`` and any xi within
    ``slack`` of x ``(..., D)``: ``|| M |x| || + ||M||_2 slack``."""
    return torch.linalg.vector_norm(M @ x.abs()[..., None], dim=(-2, -1)) + (
        torch.linalg.matrix_norm(M, ord=2) * slack
    )


def layer_output_bound(
    q,
    k,
    v,
    g=None,
    beta=None,
    *,
    a: float,
    iters: int,
    chunk_size: int,
    contract: str,
    tokens=None,
    out_dtype: Optional[torch.dtype] = torch.bfloat16,
    batch: int = 64,
) -> LayerOutputBound:
    """LTB-y (module docstring) for the tokens ``tokens`` (indices into T; None: all).

    Arguments as :func:`analysis.bounds.gka_layer.layer_token_bound`, and v ``(N, T, Dv)``, the
    values the kernel received (representable in the contract's operand precision, as k);
    ``out_dtype``: the dtype the kernel returns x and y in (``kernels.gka_layer``: q's dtype)."""
    ltb = layer_token_bound(
        q,
        k,
        g,
        beta,
        a=a,
        iters=iters,
        chunk_size=chunk_size,
        contract=contract,
        tokens=tokens,
        out_dtype=out_dtype,
        batch=batch,
    )  # validates q, k, g, beta, a, iters, chunk_size, contract, tokens
    k = k.detach().cpu().to(F64)
    N, T, D = k.shape
    v = _v.floating("v", v, min_ndim=3).detach().cpu().to(F64)
    if v.ndim != 3 or tuple(v.shape[:2]) != (N, T):
        raise ValueError(f"v must be (N, T, Dv) with (N, T) = {(N, T)}, got {tuple(v.shape)}")
    u_op = U_BF16 if contract == "bfloat16/operands" else 0.0
    if not torch.equal(round_bf16(v) if u_op > 0 else v.to(torch.float32).to(F64), v):
        raise ValueError(
            f"v must be representable in {'bfloat16' if u_op > 0 else 'float32'} for the "
            f"{contract} contract (the kernel's products take it unrounded)"
        )
    assert contract in CONTRACTS  # layer_token_bound checked it
    g = None if g is None else g.detach().cpu().to(F64)
    beta = None if beta is None else beta.detach().cpu().to(F64)
    C = int(chunk_size)
    u_out = 0.0 if out_dtype in (None, torch.float32, torch.float64) else U_BF16
    # 0. the operand rounds x again only when x is not stored in bf16 already
    u_x = u_op if out_dtype != torch.bfloat16 else 0.0

    K, G, bb = chunked(k, g, beta, C)
    V = pad_chunks(v, C)
    e_gate = _gate_error(g, C)
    gated = g is not None or beta is not None
    e_z = e_gate
    e_m = e_gate + U32 if gated else 0.0
    # 1. the value state: exact R, the stored one within [Rm - RU, Rm + RU]
    R, Rm, RU = chunk_state_bound(V, K, G, bb, e_gate=e_gate, gated=gated, u_op=u_op)
    nE0 = torch.linalg.matrix_norm(Rm - R, ord=2)  # (N, nc)
    Rabs = Rm.abs() + RU  # >= |R_hat|

    ubar = (1 + u_op) * (1 + U32) * (1 + e_m) - 1
    gD = gamma(D, U_DOT)  # k_j . xi: a tensor-core product (module docstring, 2.)
    # y's sums: tensor-core products onto each other, CUDA-core roundings charged at U_DOT (3.)
    g_acc = gamma(D + C + 4, U_DOT)
    tk = ltb.tokens
    ys, bounds = [], []
    for i in range(0, tk.numel(), batch):
        tb = tk[i : i + batch]
        x = ltb.x[:, i : i + batch]  # (N, n, D)
        nx = torch.linalg.vector_norm(x, dim=-1)
        Ex = ltb.bound[:, i : i + batch]
        Exi = Ex + u_x * (nx + Ex)  # 0.
        c, p = tb // C, tb % C
        Kt, Vt, Gt = K[:, c], V[:, c], G[:, c]  # (N, n, C, D), (N, n, C, Dv), (N, n, C)
        Gp = Gt.gather(-1, p.expand(N, -1)[..., None])
        upto = (torch.arange(C)[None, :] <= p[:, None]).to(F64)
        m = torch.exp((Gp - Gt).clamp_max(0.0)) * bb[:, c] * upto  # the mask weights m_j
        zeta = torch.exp(Gp[..., 0])[..., None]  # (N, n, 1)
        Ut = zeta[..., None] * R[:, c] + Vt.transpose(-1, -2) @ (m[..., None] * Kt)
        y = (Ut @ x[..., None])[..., 0]
        # 0. the iterate's error through U_t
        e0 = torch.linalg.matrix_norm(Ut, ord=2) * Exi
        # 1. the stored value state
        e1 = zeta[..., 0] * (nE0[:, c] * (nx + Exi) + _nonneg_norm(RU[:, c], x, Exi))
        # 2. the masked chunk product: theta part (the smaller of two bounds) and e part
        kn = torch.linalg.vector_norm(Kt, dim=-1)  # ||k_j||
        Kx = (Kt @ x[..., None])[..., 0]  # k_j . x
        Fx = (
            torch.sqrt((m * Kx**2).sum(-1))
            + torch.sqrt(
                torch.linalg.matrix_norm(Kt.transpose(-1, -2) @ (m[..., None] * Kt), ord=2)
            )
            * Exi
        )  # >= ||F xi||
        nG = torch.sqrt(torch.linalg.matrix_norm(Vt.transpose(-1, -2) @ (m[..., None] * Vt), ord=2))
        Va = Vt.abs().transpose(-1, -2)  # (N, n, Dv, C)
        comp = torch.linalg.vector_norm(Va @ (m * Kx.abs())[..., None], dim=(-2, -1)) + (
            torch.linalg.vector_norm(Va @ (m * kn)[..., None], dim=(-2, -1)) * Exi
        )  # >= || |V|^T (m |K xi|) ||
        VmK = Va @ (m[..., None] * Kt.abs())  # |V|^T diag(m) |K|, (N, n, Dv, D)
        VmK_xi = torch.linalg.vector_norm(VmK @ x.abs()[..., None], dim=(-2, -1)) + (
            torch.linalg.vector_norm(Va @ (m * kn)[..., None], dim=(-2, -1)) * Exi
        )  # >= || |V|^T (m |K| |xi|) ||, as |k_j|^T |d| <= ||k_j|| ||d||
        e2 = ubar * torch.minimum(nG * Fx, comp) + (1 + ubar) * gD * VmK_xi
        # 3. the float32 accumulation and the gate
        Rx = zeta[..., 0] * _nonneg_norm(Rabs[:, c], x, Exi)  # >= zeta || |R_hat| |xi| ||
        e3 = (g_acc * (1 + e_z) + e_z) * Rx + g_acc * (1 + ubar) * (1 + gD) * VmK_xi
        drift = SAFETY * (e0 + e1 + e2 + e3)
        # 4. the store
        total = drift + store_error_bound(y, drift, u_out, out_dtype) if u_out > 0 else drift
        ys.append(y)
        bounds.append(total)
    return LayerOutputBound(tk, torch.cat(ys, 1), torch.cat(bounds, 1), ltb.x, ltb.bound)


__all__ = ["LayerOutputBound", "layer_output_bound"]
