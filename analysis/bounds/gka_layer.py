"""A per-token forward bound for the GKA layer's chunkwise kernels (``kernels.gka_solve`` /
``kernels.gka_layer``, Triton and warp-group MMA), held against the float64 reference.

``LTB`` (:func:`layer_token_bound`). For a token t of chunk c (chunk start c0, ``C`` tokens a
chunk) the kernel solves ``(H_t + lambda_t I) x = q_t`` by r Chebyshev steps without forming H_t:
its product is ``H_t xi ~ zeta_t S_c xi + K^T (Mt_t . K xi)``, S_c the chunk-start state, Mt the
gated mask (kernels/gka_layer_fwd.py, ``chebyshev_rows``; kernels/gka_layer_wgmma.py). The bound
is ``analysis.bounds.contract.linear_bound`` on the float64 system ``(H_t, q_t, lambda_t = a
||H_t||_F)`` -- the reference's own trajectory, the local errors propagated through the exact
Chebyshev responses on A_t's eigenvalues -- with the layer's product given as ``H_error`` and the
kernel's elementwise arrangement as ``extra_plain``, plus the output store. Its terms, u = 2^-24
(float32 on the CUDA cores: elementwise operations, ``tl.sum`` / ``gl.sum``), u_dot = 2^-23 (the
float32 accumulation inside a tensor-core product, ``tl.dot`` and ``warpgroup_mma``: the tensor
cores add with truncation, Fasi, Higham, Mikaitis and Pranesh 2021, so twice u; the convention of
``analysis.bounds.kla_kernel``, :data:`U_DOT`), u_op = 2^-8 (bf16 operands; 0 for
``float32/ieee``), gamma_m(w) = m w / (1 - m w), gamma_m = gamma_m(u) (Higham 2002, Lemma 3.1: a
value through m roundings; a sum, in any order, whose every term passes through at most m
roundings is within gamma_m of the sum of the terms' magnitudes, as in the proof of eq. (3.4); a
product with a vector, eq. (3.11); a term through a roundings at u_dot and b at u within
``(1 + gamma_a(u_dot))(1 + gamma_b) - 1``); each rounding obeys the standard model eq. (2.4) with
its unit, but for the GPU's fast float32 division and square root (Triton's and Gluon's ``/`` and
``sqrt``: div.full.f32 within 2 ulps, sqrt.approx.f32 within 3), taken within ``U_FAST = 6u``:

1. **The chunk state.** The states kernel walks ``S <- fl(zeta_C S) + K^T Kc`` in float32 (the
   products of bf16 keys and the coefficient keys ``Kc_j = op(fl(coef_j k_j))``, ``coef_j =
   exp(G_C - G_j) beta_j``). Round to nearest is monotone, so every entry of Kc lies in
   ``[rd(v - e_key |v|), rd(v + e_key |v|)]``, ``v = coef_j k_j`` in float64, ``e_key = (1 +
   e_gate)(1 + u)^2 - 1`` (the float32 exp, beta and key products; 0 and Kc = K without gates),
   rd the operand rounding (:func:`round_bf16`, exact; none in float32): centre Vm and half-width
   Vu, mostly one value, known. Around the state of the centres ``Sk <- zeta_C Sk + K^T Vm``
   (float64) the kernel's float32 state stays within the entrywise running bound ``delta <- zeta
   (1 + e_gate)(1 + u) delta + zeta ((1 + e_gate)(1 + u) - 1) |Sk| + |K|^T Vu + gamma_{C+2}(u_dot)
   (zeta (1 + e_gate)(1 + u)(|Sk| + delta) + |K|^T (|Vm| + Vu))`` (eq. (2.4) for the decay, on the
   CUDA cores; eq. (3.4) for the chunk's products added to the carried state, a ``tl.dot`` onto
   the decayed state: at u_dot, the separate float32 addition of the float32 model included).
   With bf16 operands the state is then
   **stored in bf16**: ``S_hat`` lies entrywise in ``[rd(Sk - delta), rd(Sk + delta)]``, centre
   ``S_m``, half-width ``U`` (float32: ``S_m = Sk``, ``U = delta``). So ``S_hat = S + E0 + dU``,
   S the exact state, ``E0 = S_m - S`` a *known* matrix (the actual rounding of the actual state
   and keys) and ``|dU| <= U``. Its effect on the product (the kernel multiplies by
   ``S_hat^T``): ``||E0^T xi|| <= ||E0||_2 ||xi||`` (normwise: E0's signs are mixed, which a
   componentwise ``|E0| |xi|`` or ``u_op |S| |xi|`` would ignore, adding them up: several times
   larger at D = 128) and ``U^T |xi|``.
2. **The masked chunk product** ``A_j = op(fl(P_j Mt_tj))``, ``P_j = fl(k_j . xi)``:
   ``A_j = m_j (k_j . xi + e_j)(1 + theta_j)``, ``|theta_j| <= ubar = (1 + u_op)(1 + u)(1 + e_m) - 1``
   (the operand rounding and the mask's elementwise product), ``|e_j| <= gamma_D(u_dot) |k_j|^T
   |xi|`` (eq. (3.4); ``k_j . xi`` is a tensor-core product). The theta part is
   ``F^T diag(theta) F xi`` with
   ``F = diag(sqrt m) K``, ``F^T F = B_t = sum_{c0<=j<=t} m_j k_j k_j^T`` the chunk's part of H_t
   (only the chunk's <= C keys, their signs kept). By the polar decomposition ``F^T = B_t^(1/2) V``
   and, as ``B_t <= H_t`` (H_t - B_t = zeta_t S is positive semidefinite), Douglas' lemma
   ``B_t^(1/2) = H_t^(1/2) Z`` with ``||Z|| <= 1``, it is ``H_t^(1/2) w`` with ``||w|| <= ubar
   ||F xi|| <= ubar ||B_t||_2^(1/2) ||xi||``: ``linear_bound``'s ``H_error_range = (ubar
   ||B_t||^(1/2), 0)``, whose channel is not amplified on H_t's small eigenvalues (on the first
   tokens, where H_t has rank t, a plain ``ubar ||B_t|| ||xi||`` made the bound 3-5 times larger).
   The e part is ``<= (1 + ubar) gamma_D(u_dot) |B|~_t |xi|`` (|B|~: absolute keys), in
   ``H_error``.
3. **The accumulation** of ``zeta S_hat^T xi + sum_j A_j k_j - s q`` in float32 (D + C + 1 terms
   of bf16 x bf16 products, exact in float32, or float32 products; the gate multiplication):
   ``g_acc (zeta (1 + e_z)(|S_m| + U) + (1 + ubar)(1 + gamma_D(u_dot)) |B|~_t) |xi|`` and, for
   the q term, ``g_acc s |q|`` (in ``extra_plain``), ``g_acc = gamma_{D+C+4}(u_dot)``; the gate's
   own error ``e_z zeta (|S_m| + U) |xi|``. The D- and C-term sums are tensor-core products
   accumulating onto each other (``mm_acc``, ``warpgroup_mma(..., acc)``); the at most two
   roundings a term meets on the CUDA cores (the gated Triton path's ``fl(zeta fl(xi S))`` and
   ``+ (-s q)``, the float32 model's ``acc + mm(...)``) are charged at u_dot too, the larger unit.
   So ``H_error = zeta (U + ||E0||_2 I) + (1 + ubar) gamma_D(u_dot) |B|~_t + g_acc (...) + e_z
   zeta (|S_m| + U)``, for ``xi`` the operand as rounded (the operand channel of
   ``linear_bound``: ``|xi_hat - s x| <= u_op |s x|``).
4. **lambda_t and the step** from the kernel's eq. (5) norm, evaluated in float32 on S_hat:
   ``||zeta S_hat + B_t||_F`` is within ``zeta (||E0||_F + ||U||_F)`` of ``||H_t||_F``; eq. (5)'s
   three sums of products (``||S_hat||_F^2``: D^2 exact squares; ``sum_j m_j k_j^T S_hat k_j``;
   ``||B_t||_F^2`` from the Gram matrix) add ``dev2 = ((1 + e_z)^2 (1 + gamma_{D^2+5}) - 1)
   zeta^2 ||S_hat||_F^2 + ((1 + e_z)(1 + e_m)(1 + gamma_D(u_dot))(1 + gamma_{D+C+8}) - 1) 2 zeta
   sum_j m_j |k_j|^T |S_hat| |k_j| + ((1 + e_m)^2 (1 + gamma_{2D+C}(u_dot))(1 + gamma_{C+10}) - 1)
   || |B|~_t ||_F^2`` to the square (``||S_hat||_F^2`` is summed on the CUDA cores; ``S_hat k_j``
   and the Gram matrix ``k_i . k_j``, squared, are tensor-core products of D terms; the Triton
   kernel's C-term ``M W`` is a float32 ``tl.dot`` with ``input_precision="ieee"``, which the GPU
   runs as FMAs, charged at u_dot all the same (an over-charge; the warp-group MMA kernel sums it
   with ``gl.sum``);
   the other sums are ``tl.sum`` / ``gl.sum``), ``|sqrt(a') - sqrt(a)| <= |a' - a| / sqrt(a)``,
   and the fast root adds U_FAST:
   ``dfro = zeta (||E0||_F + ||U||_F) + dev2 / f_lo + U_FAST f_hi``, f_lo / f_hi the bounds on
   ``||zeta S_hat + B_t||_F``. The kernel's step ``s = fl(2/(1+2a)) / fro_hat`` (a fast division:
   ``theta_s = (1 + u)(1 + U_FAST) - 1``) and ``s lambda = fl(2a/(1+2a))`` make its shift
   ``lambda_k = a fro_hat (1 + eta)``, ``|eta| <= (1 + 1.01u) / ((1 - u)(1 - U_FAST)) - 1``:
   ``shift_error = a dfro + eta a (fro + dfro)``; its step moves relatively by at most
   ``param_rel_error = (rho + theta_s) / (1 - rho)``, ``rho = dfro / fro`` (the batch's largest;
   linear_bound takes twice that, and 10 u for the constants' own rounding), plus the weights'
   error beyond linear_bound's model of their recurrence (its division is a fast one:
   :func:`_omega_extra`, relative ``dw / w`` here and ``dw`` on ``||x_{i-1}|| + ||x_{i-2}||`` in
   ``extra_plain``, for ``b_i = w_i - 1``). ``rho >= 1/2``: no bound (inf).
5. **Gates**: ``e_gate = ((2C + 2) Lambda + 3) u`` per chunk (Lambda the largest sum |g| over a
   chunk; the exp and the chunk cumsum, as the FWD bound of
   ``analysis.testing.gka_gradient_harness``); ``e_z = e_gate`` for zeta_t, ``e_m = e_gate + u``
   for the mask with beta; 0 without gates and input gates.
6. **The kernels' elementwise arithmetic** (``extra_plain``, added to linear_bound's own model):
   the Triton kernel forms ``x <- fl(fl(fl(w(1 - s lambda)) x - fl((w-1) x_prev)) - fl(w Res))``
   with ``Res = fl(s H xi - fl(s q))`` and the operand ``xi = op(fl(s x))``; the warp-group MMA
   kernel carries ``z = s x``: ``z <- fl(fl(fl(a z - b z_prev) + fl(fl(fl(ws) s) q)) - fl(ws
   res))``, ``x = fl(z / s)`` at the end. With ``w <= W = 2``, ``1 - s lambda <= 1`` and the
   product per unit x ``sigma = s_hi (||H_t||_2 + ||H_error||_2 + ubar ||B_t||_2)(1 + u_op)(1 +
   u)`` (s_hi the kernel's largest step), counting each rounding of either kernel, in x units
   (the constants' own errors are linear_bound's): ``p_0 = W (7 + 4 sigma) u +
   W s_hi ||H_t||_2 (1 + u_op)(1 + u) u`` (the last: Triton's fl(s x) before the operand rounding)
   on ``||x_{i-1}||``, ``p_1 = 5u`` on ``||x_{i-2}||``, ``p_2 = W s_hi (gamma_{D+C+4} + 6u)(1 + u)``
   on ``||q||``; at step 0, ``x_0 = fl(s q)`` (or ``fl(fl(q s) s) / s``) with the kernel's s:
   ``p_3 = s ((1 + theta_s) / (1 - rho) - 1) + gamma_2 s_hi``.
7. **The output**: the warp-group MMA kernel's ``x = z / s`` (``U_FAST (||x_r|| + E_r)``) and the
   store in ``out_dtype``: :func:`analysis.bounds.contract.store_error_bound` (half a spacing at the
   value, with the drift).

The float32 arithmetic on the CUDA cores (elementwise operations, ``tl.sum`` / ``gl.sum``, the
fast division and root apart) is IEEE round to nearest, u = 2^-24. The float32 accumulation inside
a tensor-core product (``tl.dot``, ``warpgroup_mma``: the chunk state's walk, ``k_j . xi``, the
accumulation of the product H xi, eq. (5)'s ``S k_j``, Gram matrix and ``M W``) is not: the tensor
cores add with truncation (Fasi et al. 2021), charged u_dot = 2^-23 per rounding as in
``analysis.bounds.kla_kernel`` (items 1-4). A ``tl.dot`` with ``input_precision="ieee"`` on
float32 operands may run on the CUDA cores instead; it is charged u_dot all the same (the bound
does not depend on how Triton lowers it). The float64 evaluation (trajectory, eigenvalues, norms)
is inside ``contract.SAFETY``.

The layer's output ``y_t = U_t x_t`` has a bound of its own on top of this one
(``analysis.bounds.gka_layer_output``); :func:`chunk_state_bound` serves both states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from analysis.precision import gamma
from solvers import validation as _v

from .contract import linear_bound, store_error_bound
from .kla_kernel import U_DOT

F64 = torch.float64
U32 = 2.0**-24  # float32 on the CUDA cores (round to nearest)
# U_DOT (2^-23, from analysis.bounds.kla_kernel): the float32 accumulation inside a tensor-core
# product (tl.dot, warpgroup_mma), which truncates (module docstring)
U_BF16 = 2.0**-8
# the kernels' contracts (kernels.gka_layer.CONTRACTS) and the linear_bound preset of each
CONTRACTS = {"bfloat16/operands": "bfloat16/operands", "float32/ieee": "float32"}
W_MAX = 2.0 * (1.0 + 2.0**-20)  # Chebyshev weights omega_i < 2, and their float32 values
# a float32 division or square root on the GPU (Triton's and Gluon's ``/`` and ``sqrt`` are the
# fast ones: div.full.f32 within 2 ulps, sqrt.approx.f32 within 3 ulps; an ulp is <= 2u relative)
U_FAST = 6 * U32


@dataclass
class LayerTokenBound:
    """LTB at the tokens ``tokens`` ``(n,)`` of every sequence: ``x`` ``(N, n, D)`` the float64
    r-step iterate (the reference), ``bound`` ``(N, n)`` on ``||x_kernel - x||_2``, and ``fro``,
    ``dfro`` ``(N, n)``: ``||H_t||_F`` and the bound on the kernel's error in it."""

    tokens: torch.Tensor
    x: torch.Tensor
    bound: torch.Tensor
    fro: torch.Tensor
    dfro: torch.Tensor

    @property
    def relative(self) -> torch.Tensor:
        """bound / ||x_t||: below 1 the check says something, at or above it is INCONCLUSIVE."""
        return self.bound / torch.linalg.vector_norm(self.x, dim=-1)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x`` rounded to the nearest bfloat16 (ties to even), exactly, as a float64 tensor
    (no detour through float32, whose double rounding can differ at a tie). Finite values in
    bfloat16's range; below its normal range the subnormal spacing 2^-133."""
    _, e = torch.frexp(x)  # x = m 2^e, 1/2 <= |m| < 1: 8 significant bits give a spacing 2^(e-8)
    spacing = torch.ldexp(torch.ones_like(x), e.clamp_min(-125) - 8)
    return torch.round(x / spacing) * spacing


def _omega_extra(a: float, iters: int):
    """The Chebyshev weights' error beyond linear_bound's model of their recurrence (which takes
    each of its three operations within 2u): the GPU's division is within U_FAST, 1.1 u w_i more a
    step, carried by the recurrence's derivative ``rho^2 w_i^2 / 4`` (module docstring, 4.).
    Returns ``(max_i dw_i / w_i, max_i dw_i)``."""
    rho2 = (1.0 / (1.0 + 2.0 * a)) ** 2
    w, dw, rel, ab = 2.0, 0.0, 0.0, 0.0
    for _ in range(iters):
        w = 4.0 / (4.0 - rho2 * w)
        dw = rho2 * w * w / 4 * (1 + 8 * U32) * dw + 1.1 * U32 * w
        rel, ab = max(rel, dw / w), max(ab, dw)
    return rel, ab


def _gate_error(g: Optional[torch.Tensor], C: int) -> float:
    """e_gate (module docstring, 5.): ``((2C + 2) Lambda + 3) u``, Lambda the largest sum |g| over a
    chunk of C tokens (0 without a gate)."""
    if g is None:
        return 0.0
    N, T = g.shape
    nc = -(-T // C)
    lam = torch.nn.functional.pad(g.abs(), (0, nc * C - T)).reshape(N, nc, C).sum(-1).max()
    return ((2 * C + 2) * float(lam) + 3) * U32


def chunked(k: torch.Tensor, g, beta, C: int):
    """float64 ``k`` ``(N, T, D)``, g, beta ``(N, T)`` or None in chunks of C tokens, T padded with
    zeros: ``K`` ``(N, nc, C, D)``, the chunk-local cumulative log decay ``G`` (eq. (16)) and the
    input gates ``bb`` ``(N, nc, C)`` (0 and 1 where absent). Any ``(N, T, Dv)`` tensor chunks as
    k does: :func:`pad_chunks`."""
    N, T, _ = k.shape
    K = pad_chunks(k, C)
    nc = K.shape[1]
    gg = torch.zeros(N, T, dtype=F64) if g is None else g
    G = torch.cumsum(pad_chunks(gg[..., None], C)[..., 0], -1)
    if beta is None:
        return K, G, torch.ones(N, nc, K.shape[2], dtype=F64)
    return K, G, pad_chunks(beta[..., None], C)[..., 0]


def pad_chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """``(N, T, D)`` zero-padded to whole chunks and split: ``(N, nc, C, D)``."""
    N, T, D = x.shape
    nc = -(-T // C)
    return torch.nn.functional.pad(x, (0, 0, 0, nc * C - T)).reshape(N, nc, C, D)


def chunk_state_bound(
    left, K, G, bb, *, e_gate: float, gated: bool, u_op: float, store: Optional[bool] = None
):
    """The chunk-start states of ``states_kernel`` (module docstring, 1.): the key state S
    (``left = K``) or the value state U (``left = V``, ``(N, nc, C, Dv)``), ``sum_j coef_j l_j
    k_j^T`` over the earlier chunks. Returns ``(S, Sm, Uh)`` ``(N, nc, Dv, D)``: the exact state
    and the centre and half-width of the interval the kernel's stored one lies in, entrywise.
    The products take ``left`` as it is (it must be representable in the operand precision).
    ``store``: the state stored in bf16 (None: with bf16 operands, as the forward stores it;
    False: kept in float32 with bf16 operands, as the backward's ``chunk_states`` keeps it)."""
    N, nc, C, D = K.shape
    Dl = left.shape[-1]
    rnd = round_bf16 if u_op > 0 else (lambda t: t)
    e_key = (1 + e_gate) * (1 + U32) ** 2 - 1 if gated else 0.0
    # a chunk's C products (rounded in float32 too) added to the state: a tensor-core product
    # accumulating onto the decayed state (mm_acc), or in the float32 model a tl.dot and one float32
    # addition, charged at the larger unit U_DOT (module docstring, 1.)
    g_dot = gamma(C + 2, U_DOT)
    S = torch.zeros(N, nc, Dl, D, dtype=F64)
    Sk, delta = torch.zeros_like(S), torch.zeros_like(S)
    cur, cur_k, cur_d = (torch.zeros(N, Dl, D, dtype=F64) for _ in range(3))
    for c in range(nc):
        S[:, c], Sk[:, c], delta[:, c] = cur, cur_k, cur_d
        coef = torch.exp(G[:, c, -1:] - G[:, c]) * bb[:, c]  # (N, C)
        dec = torch.exp(G[:, c, -1])[:, None, None]
        Kc, Lc = K[:, c], left[:, c]
        v = coef[..., None] * Kc  # the coefficient keys, rounded by the kernel: within [lo, hi]
        lo, hi = rnd(v - e_key * v.abs()), rnd(v + e_key * v.abs())
        Vm, Vu = (lo + hi) / 2, (hi - lo) / 2
        Lt_ = Lc.transpose(-1, -2)
        cur = dec * cur + Lt_ @ (coef[..., None] * Kc)
        carried = dec * (1 + e_gate) * (1 + U32)  # fl(dec_hat S32)'s factor
        cur_d = (
            carried * cur_d
            + dec * ((1 + e_gate) * (1 + U32) - 1) * cur_k.abs()
            + Lc.abs().transpose(-1, -2) @ Vu
            + g_dot
            * (carried * (cur_k.abs() + cur_d) + Lc.abs().transpose(-1, -2) @ (Vm.abs() + Vu))
        )
        cur_k = dec * cur_k + Lt_ @ Vm
    stored = (u_op > 0) if store is None else store
    if stored:  # the state stored in bf16: S_hat in [rd(Sk - delta), rd(Sk + delta)]
        lo, hi = round_bf16(Sk - delta), round_bf16(Sk + delta)
        return S, (lo + hi) / 2, (hi - lo) / 2
    return S, Sk, delta


def quad_u(Kt: torch.Tensor, Uh: torch.Tensor) -> torch.Tensor:
    """``|k_j|^T Uh |k_j|`` for the rows k_j of Kt ``(..., C, D)``, Uh ``(..., D, D)``."""
    return ((Kt.abs() @ Uh) * Kt.abs()).sum(-1)


def layer_token_bound(
    q,
    k,
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
    rhs_error=None,
    float32_states: bool = False,
) -> LayerTokenBound:
    """LTB (module docstring) for the tokens ``tokens`` (indices into T; None: all) of a layer run.

    q, k ``(N, T, D)``, g, beta ``(N, T)`` or None: the values the kernel received (any float
    dtype, widened exactly); a, iters: the layer's ridge strength and Chebyshev steps;
    chunk_size: the chunk the kernel ran with (64 on the warp-group MMA path); contract: the
    kernel's, ``"bfloat16/operands"`` or ``"float32/ieee"``; out_dtype: the dtype x is returned in
    (its store is bounded; float32: exact). ``batch``: tokens per ``linear_bound`` call (memory:
    ``(r+1)^2 D`` float64 numbers a token). Raises ValueError where some H_t = 0 (the kernel
    raises too).

    For the backward's second solve (``analysis.bounds.gka_layer_grad``, LTB-dq): q is then any
    float64 right-hand side (the exact cotangent dx), ``rhs_error`` ``(N, n)`` a bound on the
    distance of the kernel's right-hand side from it at the tokens (module docstring of
    gka_layer_grad: it enters each step as ``w_i s dx_err``, in ``extra_plain``), and
    ``float32_states=True`` the Triton backward's states: kept in float32 and rounded to bf16 as
    operands (the products see the same values as the forward's stored state; eq. (5)'s
    ``||S||_F^2`` sees the float32 one)."""
    if contract not in CONTRACTS:
        raise ValueError(
            f"contract must be one of {sorted(CONTRACTS)} (float32/tf32x3 has no operand model), "
            f"got {contract!r}"
        )
    q = _v.floating("q", q, min_ndim=3).detach().cpu().to(F64)
    k = _v.floating("k", k, min_ndim=3).detach().cpu().to(F64)
    if q.shape != k.shape or q.ndim != 3:
        raise ValueError(
            f"q and k must both be (N, T, D), got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    N, T, D = q.shape
    g = None if g is None else _v.floating("g", g, min_ndim=2).detach().cpu().to(F64)
    beta = None if beta is None else _v.floating("beta", beta, min_ndim=2).detach().cpu().to(F64)
    for name, x in (("g", g), ("beta", beta)):
        if x is not None and tuple(x.shape) != (N, T):
            raise ValueError(f"{name} must be (N, T) = {(N, T)}, got {tuple(x.shape)}")
    a = _v.ridge_strength(a)  # a bad a named here, not as the mu or L it would make
    iters = _v.count("iters", iters)
    C = _v.count("chunk_size", chunk_size, minimum=1)
    tokens = (
        torch.arange(T) if tokens is None else torch.as_tensor(tokens, dtype=torch.long).flatten()
    )
    if tokens.numel() == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= T:
        raise ValueError(f"tokens must be non-empty indices in [0, {T}), got {tokens.tolist()}")
    u_op = U_BF16 if contract == "bfloat16/operands" else 0.0
    # the products take k as it is: bf16 keys for bf16 operands, float32 (or bf16) keys otherwise
    exact = round_bf16(k) if u_op > 0 else k.to(torch.float32).to(F64)
    if not torch.equal(exact, k):
        raise ValueError(
            f"k must be representable in {'bfloat16' if u_op > 0 else 'float32'} for the "
            f"{contract} contract (the kernel's products take it unrounded)"
        )
    u_out = 0.0 if out_dtype in (None, torch.float32, torch.float64) else U_BF16
    if rhs_error is not None:
        rhs_error = torch.as_tensor(rhs_error, dtype=F64).detach().cpu()
        if tuple(rhs_error.shape) != (N, tokens.numel()) or not bool((rhs_error >= 0).all()):
            raise ValueError(
                f"rhs_error must be non-negative of shape (N, n) = {(N, tokens.numel())}, got "
                f"{tuple(rhs_error.shape)}"
            )
    K, G, bb = chunked(k, g, beta, C)

    # 5. gates
    e_gate = _gate_error(g, C)
    gated = g is not None or beta is not None
    e_z = e_gate
    e_m = e_gate + U32 if gated else 0.0
    # 1. chunk-start states: exact (S), the kernel's stored one within [Sm - Uh, Sm + Uh]
    S, Sm, Uh = chunk_state_bound(K, K, G, bb, e_gate=e_gate, gated=gated, u_op=u_op)
    E0 = Sm - S
    nE0 = torch.linalg.matrix_norm(E0, ord=2)  # (N, nc)
    fE0 = torch.linalg.matrix_norm(E0) + torch.linalg.matrix_norm(Uh)  # ||S_hat - S||_F
    fSh = torch.linalg.matrix_norm(Sm) + torch.linalg.matrix_norm(Uh)  # >= ||S_hat||_F
    Shabs = Sm.abs() + Uh  # >= |S_hat| (not symmetric: the kernel multiplies by S_hat^T)
    f32_states = float32_states and u_op > 0
    if f32_states:
        # the float32 state S32 in [Sk - dl, Sk + dl]; its bf16 operand rd(S32) in [Sm - Uh, Sm + Uh]
        # (rounding is monotone: the same interval as the forward's stored state). Eq. (5) takes
        # ||S32||_F^2: | ||S32||^2 - ||S||^2 | <= |<Sk - S, Sk + S>| + 2 <|Sk|, dl> + ||dl||^2
        _, Sk, dl = chunk_state_bound(
            K, K, G, bb, e_gate=e_gate, gated=gated, u_op=u_op, store=False
        )
        dS2 = (
            ((Sk - S) * (Sk + S)).sum((-1, -2)).abs()
            + 2 * (Sk.abs() * dl).sum((-1, -2))
            + (dl * dl).sum((-1, -2))
        )
        fSh = torch.maximum(fSh, torch.linalg.matrix_norm(Sk) + torch.linalg.matrix_norm(dl))

    ubar = (1 + u_op) * (1 + U32) * (1 + e_m) - 1
    gD = gamma(D, U_DOT)  # k_j . xi: a tensor-core product (module docstring, 2.)
    # the accumulation of the product (module docstring, 3.): tensor-core sums onto each other; the
    # at most two CUDA-core roundings a term meets are charged at the larger unit U_DOT too
    g_acc = gamma(D + C + 4, U_DOT)
    ss = 2.0 / (1.0 + 2.0 * a)
    dw_rel, dw_abs = _omega_extra(a, iters)
    # the kernel's shift step_lam / s: fl(fl64(2a/(1+2a))) over fl(fl(2/(1+2a)) / fro_hat)
    eta_shift = (1 + 1.01 * U32) / ((1 - U32) * (1 - U_FAST)) - 1
    eye = torch.eye(D, dtype=F64)
    out = {n: [] for n in ("x", "bound", "fro", "dfro")}
    # batches of up to ``batch`` tokens, the first chunk's apart: the relative error of the
    # kernel's ||H_t||_F (param_rel_error, one float per linear_bound call) is far smaller there
    # (no state), and alike in the later chunks
    order = torch.argsort(tokens, stable=True)
    first = tokens[order] < C
    groups = [
        part[i : i + batch]
        for part in (order[first], order[~first])
        for i in range(0, part.numel(), batch)
    ]
    for sel in groups:
        tb = tokens[sel]
        c, p = tb // C, tb % C
        # the tokens' chunk keys and mask weights m_j = exp(G_t - G_j) beta_j for j <= t in chunk
        Kt = K[:, c]  # (N, n, C, D)
        Gt = G[:, c]  # (N, n, C)
        Gp = Gt.gather(-1, p.expand(N, -1)[..., None])  # (N, n, 1)
        upto = (torch.arange(C)[None, :] <= p[:, None]).to(F64)  # (n, C)
        m = torch.exp((Gp - Gt).clamp_max(0.0)) * bb[:, c] * upto
        zeta = torch.exp(Gp[..., 0])  # (N, n)
        Bt = Kt.transpose(-1, -2) @ (m[..., None] * Kt)
        Ba = Kt.abs().transpose(-1, -2) @ (m[..., None] * Kt.abs())
        Sc = S[:, c]
        H = zeta[..., None, None] * Sc + Bt
        fro = torch.linalg.matrix_norm(H)
        if not bool((fro > 0).all()):
            bad = tb[(fro == 0).any(0)].tolist()
            raise ValueError(f"H_t = 0 at tokens {bad}: the system is singular")
        lam = a * fro
        # 4. the kernel's ||H_t||_F
        zf = zeta * fE0[:, c]
        quad = ((Kt.abs() @ Shabs[:, c]) * Kt.abs()).sum(-1)  # |k_j|^T |S_hat| |k_j|
        # (module docstring, 4.) ||S_hat||_F^2 on the CUDA cores; S_hat k_j (D terms) and the Gram
        # matrix (D terms, squared: 2D), with the Triton kernel's M W (C terms): tensor-core sums
        dev2 = (
            ((1 + e_z) ** 2 * (1 + gamma(D * D + 5, U32)) - 1) * (zeta * fSh[:, c]) ** 2
            + ((1 + e_z) * (1 + e_m) * (1 + gamma(D, U_DOT)) * (1 + gamma(D + C + 8, U32)) - 1)
            * 2
            * zeta
            * (m * quad).sum(-1)
            + ((1 + e_m) ** 2 * (1 + gamma(2 * D + C, U_DOT)) * (1 + gamma(C + 10, U32)) - 1)
            * torch.linalg.matrix_norm(Ba) ** 2
        )
        if f32_states:
            # |f^2 - fro^2| <= zeta^2 dS2 + 2 zeta sum_j m_j |k_j^T (S_hat - S) k_j| + dev2, and
            # |f - fro| <= |f^2 - fro^2| / fro
            kEk = ((Kt @ E0[:, c]) * Kt).sum(-1).abs() + quad_u(Kt, Uh[:, c])
            spread = (zeta**2 * dS2[:, c] + 2 * zeta * (m * kEk).sum(-1) + dev2) / fro
            f_lo, f_hi = fro - spread, fro + spread
            dfro = torch.where(f_lo > 0, spread + U_FAST * f_hi, torch.full_like(fro, math.inf))
        else:
            f_lo = fro - zf
            f_hi = fro + zf + dev2 / f_lo.clamp_min(1e-300)
            dfro = torch.where(
                f_lo > 0,
                zf + dev2 / f_lo.clamp_min(1e-300) + U_FAST * f_hi,
                torch.full_like(fro, math.inf),
            )
        rho = dfro / fro
        ok = rho < 0.5
        rho_c = torch.where(ok, rho, torch.zeros_like(rho))
        s_eff = ss / fro
        theta_s = (1 + U32) * (1 + U_FAST) - 1  # fl(2/(1+2a)) / fro_hat, a fast division
        s_hi = ss * (1 + theta_s) / (fro - torch.where(ok, dfro, torch.zeros_like(dfro)))
        # 1.-3. and 5.: the product's error
        Sabs = Shabs[:, c].transpose(-1, -2)
        nB = torch.linalg.matrix_norm(Bt, ord=2)
        Herr = (
            zeta[..., None, None] * (Uh[:, c].transpose(-1, -2) + nE0[:, c][..., None, None] * eye)
            + (1 + ubar) * gD * Ba
            + g_acc * (zeta[..., None, None] * (1 + e_z) * Sabs + (1 + ubar) * (1 + gD) * Ba)
            + e_z * zeta[..., None, None] * Sabs
        )
        nH = torch.linalg.matrix_norm(H, ord=2)
        sigma = (
            s_hi * (nH + torch.linalg.matrix_norm(Herr, ord=2) + ubar * nB) * (1 + u_op) * (1 + U32)
        )
        # 6. the kernels' elementwise arithmetic
        extra = torch.stack(
            [
                W_MAX * (7 + 4 * sigma) * U32
                + W_MAX * s_hi * nH * (1 + u_op) * (1 + U32) * U32
                + dw_abs,
                torch.full_like(fro, 5 * U32 + dw_abs),
                W_MAX * s_hi * (g_acc + 6 * U32) * (1 + U32),
                s_eff * ((1 + theta_s) / (1 - rho_c) - 1) + gamma(2, U32) * s_hi,
            ],
            -1,
        )
        prel = float(((rho_c + theta_s) / (1 - rho_c)).max()) + dw_rel
        no_rhs_bound = torch.zeros_like(fro, dtype=torch.bool)
        if rhs_error is not None:
            # the kernel's right-hand side within rhs_error of q: each step adds w_i s (rhs - q)
            # (w_i <= W_MAX), x_0 adds s (rhs - q), and every rounding counted on ||q|| grows by
            # the same factor; the residual norm linear_bound scales its constants' rounding with
            # grows by ||rhs - q||, which the (64 u + 2 prel) term covers
            nq = torch.linalg.vector_norm(q[:, tb], dim=-1)
            er = rhs_error[:, sel]
            rel = er / nq.clamp_min(1e-300)
            no_rhs_bound = (nq == 0) & (er > 0)
            rel = torch.where(no_rhs_bound, torch.zeros_like(rel), rel)
            extra[..., 2] = extra[..., 2] * (1 + rel) + s_hi * rel * (
                W_MAX * (1 + 64 * U32 + 2 * prel) + dw_abs
            )
            extra[..., 3] = extra[..., 3] * (1 + rel) + s_hi * rel * (1 + 4 * U32 + 2 * prel)
        run = linear_bound(
            "chebyshev",
            H,
            q[:, tb],
            L=fro * (1 + a),
            mu=lam,
            iters=iters,
            contract=CONTRACTS[contract],
            shift=lam,
            shift_error=a * dfro.where(ok, torch.zeros_like(dfro))
            + eta_shift * a * (fro + dfro.where(ok, torch.zeros_like(dfro))),
            param_rel_error=prel,
            H_error=Herr,
            extra_plain=extra,
            H_error_range=(ubar * nB.sqrt(), 0.0),
        )
        xr, E = run.x[-1], run.bound[-1]
        nx = torch.linalg.vector_norm(xr, dim=-1)
        # 7. x = fl(z / s) (warp-group MMA kernel), then the store
        pre = E + U_FAST * (nx + E)
        total = pre + store_error_bound(xr, pre, u_out, out_dtype) if u_out > 0 else pre
        out["x"].append(xr)
        out["bound"].append(
            torch.where(ok & ~no_rhs_bound, total, torch.full_like(total, math.inf))
        )
        out["fro"].append(fro)
        out["dfro"].append(dfro)
    back = torch.argsort(torch.cat(groups))  # the tokens' own order
    cat = {n: torch.cat(v, 1)[:, back] for n, v in out.items()}
    return LayerTokenBound(tokens, cat["x"], cat["bound"], cat["fro"], cat["dfro"])


__all__ = ["CONTRACTS", "LayerTokenBound", "layer_token_bound", "round_bf16"]
