"""Spectral Koopman Attention (Echo, section 3.2 and Appendix F), written against Arith.

Pipeline for one head (Appendix F, steps 2-10; our names in brackets):

2. sequence-max normalisation ``z^ = z / m``, ``m = max(max_t ||z_t||, 1e-6)`` (eq. (3))
   [:func:`sequence_max_scale`]; frozen at the prefill value while decoding (section 3.2.1);
3. statistics ``G~ = eps I + sum z^_t z^_t^T``, ``M = sum z^_t z^_{t-1}^T``,
   ``C_v = sum v_t z^_t^T`` in prefix mode (eqs. (4)-(6)), masked mode (eq. (53)) or
   chunk-causal mode (eqs. (7)-(10)) [:func:`koopman_statistics`,
   :func:`chunk_causal_statistics`, :class:`KoopmanStream` token by token (section 3.5)];
4. ``G~ = L L^T`` with the jittered fallback ``G~ + 1e-4 I`` [``solvers.cholesky``];
5. whitened operator ``A_w = L^{-1} M L^{-T}`` (eq. (22), Prop. A.3) [:func:`whitened_operator`];
6. ``A'_w = gamma A_w / max(1, sigma_max(A_w))`` (eq. (12)), sigma_max by 6 power iterations
   or exactly, ``gamma in [1, 1.5]`` [:func:`spectral_normalize`, :func:`power_sigma_max`];
7. value map ``B_v = C_v G~^{-1}`` by two triangular solves (Prop. I.7) [:func:`value_map`];
8.-10. ``w_q = L^{-1} z^q``, ``w_f = A'_w^K w_q``, ``z_f = L w_f``, ``y = eta B_v z_f``
   (eq. (13), Prop. I.8: ``y = eta C_v G~^{-1} L A'^K_w L^{-1} z^q``) [:func:`koopman_readout`].

For comparison: :func:`ridge_readout` ``C_v G~^{-1} z^q`` (eq. (59), the K = 0 readout without
eta, Cor. I.9) and :func:`linear_attention_readout` ``C_v z^q`` (eq. (58)).

Where the paper is ambiguous or wrong we follow Appendix F and say so (docs/koopman.md,
docs/errata.md): ``A_w`` is the *whitened* operator of eq. (22) (eq. (11) uses the same name for
``M G^{-1}``); ``m`` is the max over all positions, masked or not (step 2 precedes step 3).

Precision: the paper runs steps 3-9 in FP32. Here every step runs in the working precision
of the inputs (``solvers._arith``); in bf16 storage mode, statistics are summed in fp32 and
rounded once when stored, and every intermediate (L, A_w, B_v, w_q, w_f, z_f) is stored bf16.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from . import validation as check
from ._arith import Arith
from .cholesky import (
    DEFAULT_JITTER,
    CholeskyError,
    CholeskyInfo,
    JitterWarning,
    cholesky,
    solve_lower,
    solve_upper,
)
from .solve_info import Status, worst_status

SCALE_FLOOR = 1e-6  # clamp of the sequence max (section 3.2.1)
DEFAULT_EPS = 1e-3  # ridge epsilon (eqs. (4)-(6))
POWER_ITERS = 6  # "6 power iterations" (eq. (12), Appendix F step 6)
GAMMA_RANGE = (1.0, 1.5)  # learned gamma (eq. (12), Prop. D.3)


# ----------------------------------------------------------------------------- statistics


@dataclass
class KoopmanStatistics:
    """Sufficient statistics of one operator estimate per system (eqs. (4)-(10), (53)).

    G: ``(*batch, r, r)`` the regularised Gram ``G~ = eps I + sum z^_t z^_t^T`` (eq. (4) includes
        eps I in G; Appendix F calls it G~).
    M: ``(*batch, r, r)`` lag-one covariance ``sum z^_t z^_{t-1}^T``.
    Cv: ``(*batch, P, r)`` value-key covariance ``sum v_t z^_t^T``.
    scale: ``batch``-shaped float64, the sequence max ``m`` the keys were divided by.
    eps: the ridge epsilon; bf16_mode: the arithmetic the statistics were computed in.
    """

    G: torch.Tensor
    M: torch.Tensor
    Cv: torch.Tensor
    scale: torch.Tensor
    eps: float
    bf16_mode: str = "storage"

    @property
    def arith(self) -> Arith:
        return Arith(self.G.dtype, self.bf16_mode)

    @property
    def batch(self) -> torch.Size:
        return self.G.shape[:-2]

    def normalize(self, zq: torch.Tensor) -> torch.Tensor:
        """Queries ``(*batch, Q, r)`` divided by the frozen scale: ``z^q = z^q / m`` (eq. (3))."""
        return _normalize(self.arith, zq, self.scale)


def sequence_max_scale(z) -> torch.Tensor:
    """``m = max(max_t ||z_t||_2, 1e-6)`` over the ``T`` axis of ``z (..., T, r)`` (eq. (3)).

    Computed in float64 from the stored keys, as a per-sequence parameter that each precision
    rounds once (``Arith.scalar``). Every position counts, masked or not (Appendix F step 2).
    """
    z = check.tensor("z", z, min_ndim=2)
    norms = torch.linalg.vector_norm(z.to(torch.float64), dim=-1)
    if norms.shape[-1] == 0:
        return torch.full(norms.shape[:-1], SCALE_FLOOR, dtype=torch.float64, device=z.device)
    return norms.amax(dim=-1).clamp(min=SCALE_FLOOR)


def _normalize(ar: Arith, z: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return ar.store(ar.up(z) / ar.scalar(scale)[..., None, None])


def _accumulate(ar: Arith, init: torch.Tensor, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``init + sum_t x_t y_t^T`` for ``X (..., T, a)``, ``Y (..., T, b)``, in the compute dtype.

    Strict bf16 adds one token at a time from ``init``, every product and sum rounded: the
    order a token-by-token stream uses, so the two agree bit for bit.
    """
    if not ar.strict:
        return ar.up(init) + ar.matmul(X.mT, Y)
    acc = init
    for t in range(X.shape[-2]):
        acc = acc + X[..., t, :, None] * Y[..., t, None, :]
    return acc


def _check_data(z, v, mask):
    z = check.tensor("z", z, min_ndim=2)
    v = check.tensor("v", v, min_ndim=2)
    check.same_kind("v", v, "z", z)
    check.has_values("z", z, "the statistics (the sequence max, the finiteness checks)")
    if v.shape[-2] != z.shape[-2]:
        raise ValueError(
            f"v has {v.shape[-2]} positions but z has {z.shape[-2]} (shapes (..., T, P), (..., T, r))"
        )
    batch = check.batch_shape("z and v", z.shape[:-2], v.shape[:-2])
    if mask is not None:
        mask = _check_mask(mask, z)
        batch = check.batch_shape("z and mask", batch, mask.shape[:-1])
        mask = mask.expand(*batch, z.shape[-2])
    z = z.expand(*batch, *z.shape[-2:])
    v = v.expand(*batch, *v.shape[-2:])
    return z, v, mask, batch


def _mask_tensor(mask) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    return mask


def _mask_bool(mask: torch.Tensor) -> torch.Tensor:
    """A bool or 0/1 mask as bool (shared by the statistics and the stream, so 0.5 is refused by both)."""
    if mask.dtype != torch.bool:
        if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be boolean or hold only 0 and 1")
        mask = mask != 0
    return mask


def _check_mask(mask, z: torch.Tensor) -> torch.Tensor:
    mask = _mask_tensor(mask)
    if mask.ndim < 1 or mask.shape[-1] != z.shape[-2]:
        raise ValueError(
            f"mask must have shape (..., T) with T = {z.shape[-2]}, got {tuple(mask.shape)}"
        )
    return _mask_bool(mask).to(z.device)


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite float >= 0, got {eps}")
    return float(eps)


def _scale_for(z: torch.Tensor, scale, batch) -> torch.Tensor:
    if scale is None:
        return sequence_max_scale(z)
    m = check.parameter("scale", scale, batch, z.device)
    if m.numel() and not bool((m > 0).all()):
        raise ValueError(f"scale must be > 0, got min {float(m.min())}")
    return m


def _check_held_scale(ar: Arith, m: torch.Tensor) -> None:
    """``m`` as the computation holds it (``Arith.scalar``): a positive float64 scale can still
    round to 0 or inf in float32 (1e-40, 1e39), and z / m is then inf or 0."""
    held = ar.scalar(m)
    if held.numel() and not bool((torch.isfinite(held) & (held > 0)).all()):
        raise ValueError(
            f"scale (min {float(m.min()):.3g}, max {float(m.max()):.3g}) rounds to 0 or inf in "
            f"{ar.compute}: z / scale is undefined; use a scale the working precision holds"
        )


def _normalized_keys(ar: Arith, z: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``z^ = z / m`` (eq. (3)), refused when it overflows (a scale far below the keys' norms)."""
    _check_held_scale(ar, m)
    Z = _normalize(ar, z, m)
    if Z.numel() and not bool(torch.isfinite(Z).all()):
        raise ValueError(
            f"z / scale overflows {ar.dtype} (scale min {float(m.min()):.3g}): the scale is too "
            "small for these keys; pass a larger scale (or scale=None for the sequence max)"
        )
    return Z


def _check_statistics_finite(ar: Arith, *stats: torch.Tensor) -> None:
    """G~, M, C_v as stored: finite z^ can still overflow in the sums (z^ ~ 1e20 in float32)."""
    for x in stats:
        if x.numel() and not bool(torch.isfinite(x).all()):
            raise ValueError(
                f"the statistics G~, M, C_v overflow {ar.dtype}: z / scale (or v) is too large; "
                "pass a larger scale or rescale v"
            )


def _raw_statistics(ar: Arith, Z: torch.Tensor, V: torch.Tensor, w: torch.Tensor, eps: float):
    """Unrounded (compute-dtype) ``G~, M, C_v`` of normalised keys Z with 0/1 weights w (eq. (53))."""
    r, P = Z.shape[-1], V.shape[-1]
    batch = Z.shape[:-2]
    eye = torch.eye(r, dtype=ar.compute, device=Z.device)
    init_G = (ar.scalar(eps) * eye).expand(*batch, r, r)
    wz = w.to(Z.dtype).unsqueeze(-1)
    pair = (w[..., 1:] & w[..., :-1]).to(Z.dtype).unsqueeze(-1)  # m_t = m_{t+1} = 1 (eq. (53))
    zeros_rr = torch.zeros(*batch, r, r, dtype=ar.compute, device=Z.device)
    G = _accumulate(ar, init_G, Z * wz, Z)
    M = _accumulate(ar, zeros_rr, Z[..., 1:, :] * pair, Z[..., :-1, :])
    Cv = _accumulate(ar, torch.zeros(*batch, P, r, dtype=ar.compute, device=Z.device), V * wz, Z)
    return G, M, Cv


def koopman_statistics(
    z, v, *, mask=None, eps: float = DEFAULT_EPS, scale=None, bf16_mode: str = "storage"
):
    """Prefix-mode (eqs. (4)-(6)) or masked-mode (eq. (53)) statistics of one sequence per system.

    Args:
        z: keys ``(..., T, r)``; v: values ``(..., T, P)``, same dtype; batch dims broadcast.
        mask: optional action mask ``(..., T)``, bool or 0/1. ``G`` and ``C_v`` sum over positions
            with ``m_t = 1``, ``M`` over pairs with ``m_t = m_{t+1} = 1``. A mask that selects
            nothing gives ``G~ = eps I``, ``M = 0``, ``C_v = 0`` (every readout is then 0).
        eps: ridge epsilon >= 0 (paper: 1e-3). ``eps = 0`` is the unregularised estimator of
            Prop. A.1; ``G`` is then singular when the data span fewer than r directions and
            the Cholesky's jittered fallback decides (docs/koopman.md).
        scale: ``None`` for the sequence max of these keys (eq. (3)), or the frozen ``m``
            (float or ``batch``-shaped tensor) of an earlier prefill.
        bf16_mode: ``"storage"`` or ``"strict"`` for bfloat16 inputs.

    Returns:
        :class:`KoopmanStatistics` (stored in z's dtype).
    """
    z, v, mask, batch = _check_data(z, v, mask)
    eps = _check_eps(eps)
    check.bf16_mode(bf16_mode)
    ar = Arith(z.dtype, bf16_mode)
    m = _scale_for(z, scale, batch)
    w = mask if mask is not None else torch.ones(z.shape[:-1], dtype=torch.bool, device=z.device)
    G, M, Cv = (ar.store(x) for x in _raw_statistics(ar, _normalized_keys(ar, z, m), v, w, eps))
    _check_statistics_finite(ar, G, M, Cv)
    return KoopmanStatistics(G, M, Cv, m.expand(batch), eps, bf16_mode)


def chunk_causal_statistics(
    z, v, *, chunk_size: int = 64, eps: float = DEFAULT_EPS, scale=None, bf16_mode: str = "storage"
):
    """Chunk-causal statistics (eqs. (7)-(10)): one operator per chunk from strictly earlier chunks.

    The sequence is split into ``C = ceil(T / S)`` chunks of ``S = chunk_size`` positions (the
    last one may be shorter). Per-chunk sums ``G_c, M_c, C_{v,c}`` (eq. (7)) are combined by an
    exclusive prefix sum; ``M^(c)`` adds the boundary transitions ``z^_{i,0} z^_{i-1,-1}^T``,
    i = 1..c-1 (eq. (9)), so ``M^(c)`` is exactly the prefix-mode ``M`` of the first ``c S``
    tokens. Chunk 0 sees no data: ``G~ = eps I``, ``M = 0``, ``C_v = 0``.

    Note: with ``scale=None`` the normaliser ``m`` is the max over the *whole* sequence (eq. (3)),
    so a chunk's operator depends on the norms of later tokens (docs/koopman.md).

    Returns:
        :class:`KoopmanStatistics` with batch ``(..., C)``.
    """
    z, v, _, batch = _check_data(z, v, None)
    S = check.count("chunk_size", chunk_size, minimum=1)
    eps = _check_eps(eps)
    check.bf16_mode(bf16_mode)
    ar = Arith(z.dtype, bf16_mode)
    m = _scale_for(z, scale, batch)
    T, r, P = z.shape[-2], z.shape[-1], v.shape[-1]
    C = -(-T // S)
    pad = C * S - T  # zero keys and values add exact zeros to every sum
    Z = torch.nn.functional.pad(_normalized_keys(ar, z, m), (0, 0, 0, pad))
    Z = Z.reshape(*batch, C, S, r)
    V = torch.nn.functional.pad(v, (0, 0, 0, pad)).reshape(*batch, C, S, P)
    zero_rr = torch.zeros(*batch, C, r, r, dtype=ar.compute, device=z.device)
    G_c = _accumulate(ar, zero_rr, Z, Z)
    Zc = ar.up(Z)
    boundary = Zc[..., 1:, 0, :, None] * Zc[..., :-1, -1, None, :]  # z^_{i,0} z^_{i-1,-1}^T
    boundary = torch.cat([zero_rr[..., :1, :, :], boundary], dim=-3)
    M_c = _accumulate(ar, boundary, Z[..., 1:, :], Z[..., :-1, :])
    Cv_c = _accumulate(ar, torch.zeros(*batch, C, P, r, dtype=ar.compute, device=z.device), V, Z)
    eye = ar.scalar(eps) * torch.eye(r, dtype=ar.compute, device=z.device)
    G = _exclusive_prefix(eye.expand(*batch, r, r), G_c)
    M = _exclusive_prefix(torch.zeros(*batch, r, r, dtype=ar.compute, device=z.device), M_c)
    Cv = _exclusive_prefix(torch.zeros(*batch, P, r, dtype=ar.compute, device=z.device), Cv_c)
    scale_c = m.unsqueeze(-1).expand(*batch, C)
    G, M, Cv = ar.store(G), ar.store(M), ar.store(Cv)
    _check_statistics_finite(ar, G, M, Cv)
    return KoopmanStatistics(G, M, Cv, scale_c, eps, bf16_mode)


def _exclusive_prefix(init: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """``out_c = init + sum_{i<c} X_i`` over the chunk axis (-3), summed left to right."""
    outs, acc = [], init
    for c in range(X.shape[-3]):
        outs.append(acc)
        acc = acc + X[..., c, :, :]
    if not outs:
        return X + init.unsqueeze(-3)  # no chunks: an empty (..., 0, a, b) result
    return torch.stack(outs, dim=-3)


class KoopmanStream:
    """Token-by-token accumulation for decoding (section 3.5), state ``2 r^2 + P r + r + 1``.

    Each :meth:`update` adds ``z^_t z^_t^T`` to G, ``z^_t z^_{t-1}^T`` to M and ``v_t z^_t^T`` to
    C_v, with ``z^_t = z_t / m`` for the frozen scale ``m``. The accumulators live in the compute
    dtype (fp32 in bf16 storage mode, as a kernel keeps its running sums) and are rounded once
    by :meth:`statistics`. A stream agrees with :func:`koopman_statistics` over the same tokens
    with the same scale: bit for bit in strict bf16 (same summation order), within the
    summation bound otherwise.

    Create with :meth:`prefill` (``m`` = sequence max of the prefix, frozen afterwards) or
    directly with a known ``scale``.
    """

    def __init__(
        self,
        r: int,
        P: int,
        *,
        scale,
        eps: float = DEFAULT_EPS,
        dtype=torch.float32,
        bf16_mode: str = "storage",
        batch_shape=(),
        device=None,
    ):
        # r = 0 or P = 0 as koopman_statistics allows them: empty statistics, every readout 0.
        r = check.count("r", r)
        P = check.count("P", P)
        eps = _check_eps(eps)
        check.bf16_mode(bf16_mode)
        self.arith = Arith(dtype, bf16_mode)
        self.eps = eps
        batch = torch.Size(batch_shape)
        self.scale = check.parameter("scale", scale, batch, device or "cpu")
        if self.scale.numel() and not bool((self.scale > 0).all()):
            raise ValueError(f"scale must be > 0, got min {float(self.scale.min())}")
        _check_held_scale(self.arith, self.scale)
        ar = self.arith
        eye = torch.eye(r, dtype=ar.compute, device=device)
        self.G = (ar.scalar(eps) * eye).expand(*batch, r, r).clone()
        self.M = torch.zeros(*batch, r, r, dtype=ar.compute, device=device)
        self.Cv = torch.zeros(*batch, P, r, dtype=ar.compute, device=device)
        self.z_prev = torch.zeros(*batch, r, dtype=dtype, device=device)
        self.has_prev = torch.zeros(batch, dtype=torch.bool, device=device)
        self.tokens = 0

    @classmethod
    def prefill(
        cls, z, v, *, mask=None, eps: float = DEFAULT_EPS, scale=None, bf16_mode: str = "storage"
    ):
        """A stream holding the statistics of a prefix ``z (..., T, r)``, ``v (..., T, P)``.

        ``m`` is the prefix's sequence max (or ``scale``) and stays frozen for later tokens.
        """
        z, v, mask, batch = _check_data(z, v, mask)
        stream = cls(
            z.shape[-1],
            v.shape[-1],
            scale=_scale_for(z, scale, batch),
            eps=eps,
            dtype=z.dtype,
            bf16_mode=bf16_mode,
            batch_shape=batch,
            device=z.device,
        )
        ar = stream.arith
        w = (
            mask
            if mask is not None
            else torch.ones(z.shape[:-1], dtype=torch.bool, device=z.device)
        )
        Z = _normalized_keys(ar, z, stream.scale)
        stream.G, stream.M, stream.Cv = _raw_statistics(ar, Z, v, w, stream.eps)
        _check_statistics_finite(ar, *(ar.store(x) for x in (stream.G, stream.M, stream.Cv)))
        if z.shape[-2]:
            stream.z_prev = Z[..., -1, :].clone()
            stream.has_prev = w[..., -1].clone()
        stream.tokens = z.shape[-2]
        return stream

    def update(self, z_t, v_t, *, mask=None) -> None:
        """Add one token ``z_t (*batch, r)``, ``v_t (*batch, P)``; ``mask`` (*batch) skips systems.

        A skipped (masked) token adds nothing and breaks the lag-one chain, as eq. (53).
        """
        ar = self.arith
        z_t = check.tensor("z_t", z_t, min_ndim=1)
        v_t = check.tensor("v_t", v_t, min_ndim=1)
        if z_t.dtype != ar.dtype or v_t.dtype != ar.dtype:
            raise TypeError(
                f"z_t and v_t must be {ar.dtype} like the stream, got {z_t.dtype}, {v_t.dtype}"
            )
        batch, r, P = self.G.shape[:-2], self.G.shape[-1], self.Cv.shape[-2]
        if z_t.shape[-1] != r or v_t.shape[-1] != P:
            raise ValueError(
                f"z_t must be (..., {r}) and v_t (..., {P}), got {tuple(z_t.shape)}, {tuple(v_t.shape)}"
            )
        try:
            z_t = z_t.expand(*batch, r)
            v_t = v_t.expand(*batch, P)
        except RuntimeError:
            raise ValueError(
                f"z_t {tuple(z_t.shape)} and v_t {tuple(v_t.shape)} do not broadcast to the "
                f"stream's batch {tuple(batch)}"
            ) from None
        w = torch.ones(batch, dtype=torch.bool, device=z_t.device)
        if mask is not None:
            # the same values as koopman_statistics accepts (0.5 is not True)
            mask = _mask_bool(_mask_tensor(mask)).to(z_t.device)
            try:
                w = torch.broadcast_to(mask, batch)
            except RuntimeError:
                raise ValueError(
                    f"mask must have the stream's batch shape {tuple(batch)} (or broadcast to "
                    f"it), got {tuple(mask.shape)}"
                ) from None
        zh = _normalized_keys(ar, z_t.unsqueeze(-2), self.scale).squeeze(-2)
        zh = zh * w.to(ar.dtype).unsqueeze(-1)
        pair = (w & self.has_prev).to(ar.dtype).unsqueeze(-1)
        zc, vc = ar.up(zh), ar.up(v_t * w.to(ar.dtype).unsqueeze(-1))
        G = self.G + zc[..., :, None] * zc[..., None, :]
        M = self.M + (zc * pair)[..., :, None] * ar.up(self.z_prev)[..., None, :]
        Cv = self.Cv + vc[..., :, None] * zc[..., None, :]
        # checked before anything is assigned: a refused token leaves the stream as it was
        _check_statistics_finite(ar, *(ar.store(x) for x in (G, M, Cv)))
        self.G, self.M, self.Cv = G, M, Cv
        self.z_prev = torch.where(w.unsqueeze(-1), zh, self.z_prev)
        self.has_prev = w
        self.tokens += 1

    def rescale(self, scale) -> None:
        """Change the frozen scale to ``scale`` (footnote 1 of section 3.2.1, corrected).

        With ``rho = m_old / m_new``: ``G~ <- eps I + rho^2 (G~ - eps I)``, ``M <- rho^2 M``,
        ``C_v <- rho C_v`` (C_v is linear in z^, and eps I is not data). The printed footnote
        rescales all statistics by ``rho^2``, which is wrong for C_v and for eps I
        (docs/errata.md).
        """
        ar = self.arith
        new = check.parameter("scale", scale, self.scale.shape, self.scale.device)
        if new.numel() and not bool((new > 0).all()):
            raise ValueError(f"scale must be > 0, got min {float(new.min())}")
        _check_held_scale(ar, new)
        rho = ar.scalar(self.scale / new)
        r = self.G.shape[-1]
        eye = ar.scalar(self.eps) * torch.eye(r, dtype=ar.compute, device=self.G.device)
        self.G = eye + rho[..., None, None] ** 2 * (self.G - eye)
        self.M = rho[..., None, None] ** 2 * self.M
        self.Cv = rho[..., None, None] * self.Cv
        self.z_prev = ar.store(rho[..., None] * ar.up(self.z_prev))
        self.scale = new

    def statistics(self) -> KoopmanStatistics:
        """The accumulated statistics, rounded once to the storage dtype."""
        ar = self.arith
        return KoopmanStatistics(
            ar.store(self.G),
            ar.store(self.M),
            ar.store(self.Cv),
            self.scale.clone(),
            self.eps,
            ar.mode,
        )


# ----------------------------------------------------------------------------- operators


def whitened_operator(M, L, *, bf16_mode: str = "storage"):
    """``A_w = L^{-1} M L^{-T}`` (eq. (22), Prop. A.3) by Appendix F step 5.

    ``L Y = M`` and ``L Z = Y^T`` by forward substitution, ``A_w = Z^T``. ``L (..., r, r)`` is
    the Cholesky factor of ``G~`` (lower triangle read), ``M (..., r, r)``.
    """
    L = check.square_matrix("L", L)
    M = check.square_matrix("M", M)
    check.same_kind("M", M, "L", L)
    if M.shape[-1] != L.shape[-1]:
        raise ValueError(f"M is {tuple(M.shape[-2:])} but L is {tuple(L.shape[-2:])}")
    Lb = L.unsqueeze(-3)
    Yt = solve_lower(Lb, M.mT, bf16_mode=bf16_mode)  # row j: Y[:, j] = L^{-1} M[:, j]
    return solve_lower(Lb, Yt.mT, bf16_mode=bf16_mode)  # row j: Z[:, j] = L^{-1} Y[j, :]^T


def value_map(Cv, L, *, bf16_mode: str = "storage"):
    """``B_v = C_v G~^{-1}`` (Appendix F step 7) by the two triangular solves of Prop. I.7.

    ``L Y = C_v^T`` (forward), ``L^T Z = Y`` (back), ``B_v = Z^T``; ``C_v (..., P, r)``.
    """
    L = check.square_matrix("L", L)
    Cv = check.tensor("Cv", Cv, min_ndim=2)
    check.same_kind("Cv", Cv, "L", L)
    if Cv.shape[-1] != L.shape[-1]:
        raise ValueError(f"Cv has {Cv.shape[-1]} columns but L is {L.shape[-1]}x{L.shape[-1]}")
    Lb = L.unsqueeze(-3)
    Yt = solve_lower(Lb, Cv, bf16_mode=bf16_mode)  # row p: Y[:, p] = L^{-1} C_v[p, :]^T
    return solve_upper(Lb.mT, Yt, bf16_mode=bf16_mode)  # row p: Z[:, p] = B_v[p, :]


def _pow2_exponent(m: torch.Tensor) -> torch.Tensor:
    """``e`` with ``m / 2^e`` in [1/2, 1) (0 for m = 0), per entry of ``m >= 0``."""
    return torch.frexp(m.to(torch.float64)).exponent


def _times_pow2(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``x * 2^n`` (``n`` integral, broadcast), exact unless the result leaves ``x.dtype``'s range.

    Applied in float64 in steps of at most ``2^512`` so that no factor overflows on the way
    (float64 exponents span 2^-1074 .. 2^1023)."""
    out, n = x.to(torch.float64), n.to(torch.float64)
    while bool((n != 0).any()):
        step = n.clamp(-512, 512)
        out, n = out * torch.exp2(step), n - step
    return out.to(x.dtype)


def _check_v0(v0, A: torch.Tensor):
    """The power iteration's start: None or a nonzero ``(..., r)`` broadcast to A's batch."""
    if v0 is None:
        return None
    v0 = check.rhs("v0", v0, "A", A)
    if check.batch_shape("A and v0", A.shape[:-2], v0.shape[:-1]) != A.shape[:-2]:
        raise ValueError(
            f"v0 has batch shape {tuple(v0.shape[:-1])}, which does not broadcast to A's "
            f"{tuple(A.shape[:-2])}"
        )
    if v0.numel() and bool((v0 == 0).all(-1).any()):
        raise ValueError(
            "v0 must be nonzero in every system: power iteration from v0 = 0 stays at 0 "
            "(a sigma_max estimate of 0)"
        )
    return v0


def _unit(ar: Arith, x: torch.Tensor) -> torch.Tensor:
    """``x / ||x||`` stored; a zero vector stays zero (its sigma estimate is then 0, not NaN)."""
    nrm = ar.norm(x)
    safe = torch.where(nrm > 0, nrm, torch.ones_like(nrm))
    return ar.store(ar.up(x) / safe.unsqueeze(-1))


def power_sigma_max(
    A, *, iters: int = POWER_ITERS, v0=None, bf16_mode: str = "storage"
) -> torch.Tensor:
    """Estimate of ``sigma_max(A)`` by ``iters`` steps of power iteration (eq. (12): 6 steps).

    ``v_0 = v0`` (default the unit all-ones vector; the paper does not say); each step
    ``u = A v / ||A v||``, ``v = A^T u / ||A^T u||``, so ``v_k ~ (A^T A)^k v_0``; the estimate is
    ``||A v_k|| <= sigma_max(A)``: power iteration never overestimates. With ``s_1 >= s_2`` the
    two largest singular values and ``theta_0`` the angle between ``v_0`` and the top right
    singular vector, ``sigma_max / estimate <= sqrt(1 + tan^2 theta_0 (s_2/s_1)^{4k})``
    (``analysis.references.koopman.power_ratio_bound``).

    ``v0``: None or a nonzero ``(..., r)`` tensor of A's dtype, broadcast to A's batch.

    Returns the estimate per system (``batch``-shaped) in the compute dtype (inf only where
    sigma_max itself exceeds that dtype's range).
    """
    A = check.square_matrix("A", A)
    iters = check.count("iters", iters)
    check.bf16_mode(bf16_mode)
    v0 = _check_v0(v0, A)
    ar = Arith(A.dtype, bf16_mode)
    r = A.shape[-1]
    if r == 0:
        return torch.zeros(A.shape[:-2], dtype=ar.compute, device=A.device)
    # A (and v0) scaled by powers of two so that their largest entries lie in [1/2, 1): exact,
    # so every rounding of the iteration is the unscaled one's, but A v and ||A v||^2 can no
    # longer overflow (A ~ 1e30 in float32 gave sigma = 0) or underflow on the way.
    e = _pow2_exponent(A.abs().amax((-2, -1)))
    A = _times_pow2(A, -e[..., None, None])
    if v0 is None:
        v = ar.store(
            torch.full(A.shape[:-1], 1.0 / math.sqrt(r), dtype=torch.float64, device=A.device)
        )
    else:
        ev = _pow2_exponent(v0.abs().amax(-1))
        v = _times_pow2(v0, -ev[..., None]).expand(A.shape[:-1])
        if iters == 0:  # the estimate is ||A v0||: v0's scale stays in it
            e = e + ev
    for _ in range(iters):
        u = _unit(ar, ar.matvec(A, v))
        v = _unit(ar, ar.rmatvec(A, u))
    return _times_pow2(ar.norm(ar.store(ar.matvec(A, v))), e)


def _gamma(gamma, batch, device) -> torch.Tensor:
    g = check.parameter("gamma", gamma, batch, device)
    lo, hi = GAMMA_RANGE
    if g.numel() and not bool(((g >= lo) & (g <= hi)).all()):
        raise ValueError(
            f"gamma must lie in [{lo}, {hi}] (Echo eq. (12)), got {g.min().item()}..{g.max().item()}"
        )
    return g


@dataclass
class SpectralNormInfo:
    """sigma: the sigma_max estimate used (compute dtype); sigma_exact: float64 SVD of the stored A."""

    sigma: torch.Tensor
    sigma_exact: torch.Tensor
    precision: str


def spectral_normalize(
    A,
    *,
    gamma=1.0,
    sigma: str = "power",
    iters: int = POWER_ITERS,
    v0=None,
    bf16_mode: str = "storage",
    return_info: bool = False,
):
    """``A' = gamma A / max(sigma_max(A), 1)`` (eq. (12), Appendix F step 6).

    ``sigma="power"``: the paper's estimate, :func:`power_sigma_max` with ``iters`` steps;
    ``sigma="exact"``: the largest singular value of the stored A (float64 SVD, rounded once to
    the compute dtype). gamma in [1, 1.5] (float or ``batch``-shaped tensor). The factor
    ``gamma / max(sigma, 1)`` is formed in the compute dtype and applied with one rounding
    (the paper's two steps A^ = A / max(1, sigma), A' = gamma A^ fused, as a kernel does).

    With the exact sigma, ``||A'|| <= gamma`` (Props. D.2, D.3); with the power estimate only
    ``||A'|| <= gamma sqrt(1 + tan^2 theta_0 (s_2/s_1)^{4k})`` (docs/errata.md).
    """
    A = check.square_matrix("A", A)
    check.bf16_mode(bf16_mode)
    if not isinstance(sigma, str) or sigma not in ("power", "exact"):
        raise ValueError(f"sigma must be 'power' or 'exact', got {sigma!r}")
    # Checked whichever sigma is used: an option that is wrong is wrong for both.
    iters = check.count("iters", iters)
    _check_v0(v0, A)
    ar = Arith(A.dtype, bf16_mode)
    g = ar.scalar(_gamma(gamma, A.shape[:-2], A.device))
    if A.shape[-1]:
        exact = torch.linalg.matrix_norm(A.to(torch.float64), ord=2)
    else:
        exact = torch.zeros(A.shape[:-2], dtype=torch.float64, device=A.device)
    if sigma == "power":
        s = power_sigma_max(A, iters=iters, v0=v0, bf16_mode=bf16_mode)
    else:
        s = ar.scalar(exact)
    if s.numel() and not bool(torch.isfinite(s).all()):
        # the factor gamma / sigma would round to 0 and A' = 0: no operator, not a normalised one
        raise ValueError(
            f"A has sigma_max {float(exact.max()):.3g}, which overflows {ar.compute}: "
            "A' = gamma A / sigma_max cannot be formed; rescale A"
        )
    factor = g / torch.clamp(s, min=1.0)
    out = ar.store(ar.up(A) * factor[..., None, None])
    if not return_info:
        return out
    return out, SpectralNormInfo(sigma=s, sigma_exact=exact, precision=ar.label)


# ----------------------------------------------------------------------------- readouts


@dataclass
class KoopmanInfo:
    """What a readout reports (``return_info=True``).

    system_status: ``batch``-shaped :class:`Status` codes: COMPLETED, JITTERED (the Cholesky
        needed jitter), BREAKDOWN (it failed even then; outputs NaN) or NONFINITE.
    factor: the :class:`~solvers.cholesky.CholeskyInfo`; L: the factor of G~.
    A: the operator the power filter used (``A'_w``, after spectral normalisation); sigma: its
        sigma_max estimate; Bv: the value map. None where a readout does not form them.
    """

    system_status: torch.Tensor
    precision: str
    factor: CholeskyInfo
    L: torch.Tensor
    Bv: torch.Tensor
    A: Optional[torch.Tensor] = None
    sigma: Optional[torch.Tensor] = None

    @property
    def status(self) -> Status:
        return worst_status(self.system_status)


def _check_stats(stats) -> KoopmanStatistics:
    if not isinstance(stats, KoopmanStatistics):
        raise TypeError(
            f"stats must be KoopmanStatistics (from koopman_statistics), got {type(stats).__name__}"
        )
    return stats


def _check_queries(stats: KoopmanStatistics, zq) -> torch.Tensor:
    zq = check.tensor("zq", zq, min_ndim=2)
    check_query_shape(stats, zq)
    return zq


def check_query_shape(stats: KoopmanStatistics, zq: torch.Tensor) -> None:
    """Queries ``(*batch, Q, r)`` matching the statistics' batch, r, dtype and device."""
    check.same_kind("zq", zq, "stats.G", stats.G)
    r = stats.G.shape[-1]
    if zq.shape[-1] != r:
        raise ValueError(f"zq must have shape (*batch, Q, {r}), got {tuple(zq.shape)}")
    if tuple(zq.shape[:-2]) != tuple(stats.batch):
        raise ValueError(
            f"zq must have shape (*batch, Q, r) with batch = {tuple(stats.batch)} of the statistics, got {tuple(zq.shape)}"
        )


def _factor_gram(stats: KoopmanStatistics, jitter: float, return_info: bool):
    """Step 4 with the failure policy of ``solvers.cholesky`` (warn / raise unless info is asked)."""
    ar = stats.arith
    L, finfo = cholesky(stats.G, jitter=jitter, bf16_mode=ar.mode, return_info=True)
    if not return_info:
        broken = finfo.system_status == Status.BREAKDOWN
        if bool(broken.any()):
            raise CholeskyError(
                f"G~ is not positive definite in {ar.label} even after jitter {jitter:g} I "
                f"in {int(broken.sum())} system(s); pass return_info=True to get a status instead"
            )
        if finfo.status == Status.JITTERED:
            warnings.warn(
                f"Cholesky of G~ needed jitter {jitter:g} I in "
                f"{int((finfo.system_status == Status.JITTERED).sum())} system(s)",
                JitterWarning,
                stacklevel=3,
            )
    usable = finfo.system_status != Status.BREAKDOWN
    # Broken systems continue on the identity so no NaN spreads; their outputs become NaN below.
    eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device)
    L_work = torch.where(usable[..., None, None], L, eye)
    return L_work, finfo, usable, L


def _finish(ar: Arith, y, finfo, usable, L, Bv, A=None, sigma=None, return_info=False):
    y = torch.where(usable[..., None, None], y, torch.full_like(y, float("nan")))
    if not return_info:
        return y
    status = finfo.system_status.clone()
    nonfinite = usable & ~torch.isfinite(y).flatten(start_dim=y.ndim - 2).all(dim=-1)
    status = torch.where(nonfinite, torch.full_like(status, int(Status.NONFINITE)), status)
    return y, KoopmanInfo(status, ar.label, finfo, L, Bv, A, sigma)


def koopman_readout(
    stats,
    zq,
    *,
    K: int = 2,
    eta=1.5,
    gamma=1.0,
    sigma: str = "power",
    power_iters: int = POWER_ITERS,
    v0=None,
    jitter: float = DEFAULT_JITTER,
    return_info: bool = False,
):
    """SKA retrieval ``y = eta B_v L A'^K_w L^{-1} z^q`` (eq. (13), Appendix F steps 4-10).

    Equals ``eta C_v G~^{-1} Phi_K z^q`` with ``Phi_K = L A'^K_w L^{-1}`` (Prop. I.8). Steps:
    ``G~ = L L^T``; ``A_w = L^{-1} M L^{-T}``; ``A'_w = gamma A_w / max(1, sigma)``;
    ``B_v = C_v G~^{-1}``; ``w_q = L^{-1} z^q``; ``w_f = A'^K_w w_q``; ``z_f = L w_f``;
    ``y = eta B_v z_f``.

    Args:
        stats: :class:`KoopmanStatistics` with batch ``(*batch)``; its dtype and bf16 mode are
            the working precision.
        zq: raw queries ``(*batch, Q, r)``; they are divided by ``stats.scale`` (eq. (3)).
        K: power-filter order >= 0 (paper: 2); K = 0 gives ``eta`` times :func:`ridge_readout`.
        eta: output scale (paper: learned, init 1.5), float or ``batch``-shaped tensor.
        gamma: in [1, 1.5]; sigma, power_iters, v0: see :func:`spectral_normalize`.
        jitter: Cholesky fallback (paper: 1e-4); see ``solvers.cholesky`` for the policy.
        return_info: also return a :class:`KoopmanInfo`.

    Returns:
        ``y (*batch, Q, P)`` in the working dtype, or ``(y, info)``.
    """
    stats = _check_stats(stats)
    zq = _check_queries(stats, zq)
    K = check.count("K", K)
    # checked by its own name here (spectral_normalize would call it iters)
    power_iters = check.count("power_iters", power_iters)
    ar = stats.arith
    eta_c = ar.scalar(check.parameter("eta", eta, stats.batch, zq.device))
    check.flag("return_info", return_info)
    L, finfo, usable, L_info = _factor_gram(stats, jitter, return_info)
    mode = ar.mode
    A_w = whitened_operator(stats.M, L, bf16_mode=mode)
    A, sinfo = spectral_normalize(
        A_w, gamma=gamma, sigma=sigma, iters=power_iters, v0=v0, bf16_mode=mode, return_info=True
    )
    Bv = value_map(stats.Cv, L, bf16_mode=mode)
    Lq = L.unsqueeze(-3)
    w = solve_lower(Lq, stats.normalize(zq), bf16_mode=mode)
    for _ in range(K):
        w = ar.store(ar.matvec(A.unsqueeze(-3), w))
    z_f = ar.store(ar.matvec(Lq, w))
    y = ar.store(eta_c[..., None, None] * ar.matvec(Bv.unsqueeze(-3), z_f))
    return _finish(ar, y, finfo, usable, L_info, Bv, A, sinfo.sigma, return_info)


def ridge_readout(stats, zq, *, jitter: float = DEFAULT_JITTER, return_info: bool = False):
    """Ridge retrieval ``C_v G~^{-1} z^q`` (eq. (59)) as ``B_v z^q`` with B_v of Prop. I.7."""
    stats = _check_stats(stats)
    zq = _check_queries(stats, zq)
    ar = stats.arith
    check.flag("return_info", return_info)
    L, finfo, usable, L_info = _factor_gram(stats, jitter, return_info)
    Bv = value_map(stats.Cv, L, bf16_mode=ar.mode)
    y = ar.store(ar.matvec(Bv.unsqueeze(-3), stats.normalize(zq)))
    return _finish(ar, y, finfo, usable, L_info, Bv, return_info=return_info)


def linear_attention_readout(stats, zq):
    """Linear attention ``C_v z^q`` (eq. (58)): one gradient step from B = 0 (Prop. I.5)."""
    stats = _check_stats(stats)
    zq = _check_queries(stats, zq)
    ar = stats.arith
    return ar.store(ar.matvec(stats.Cv.unsqueeze(-3), stats.normalize(zq)))


__all__ = [
    "KoopmanInfo",
    "KoopmanStatistics",
    "KoopmanStream",
    "SpectralNormInfo",
    "chunk_causal_statistics",
    "koopman_readout",
    "koopman_statistics",
    "linear_attention_readout",
    "power_sigma_max",
    "ridge_readout",
    "sequence_max_scale",
    "spectral_normalize",
    "value_map",
    "whitened_operator",
]
