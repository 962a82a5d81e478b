"""Kaczmarz Linear Attention (KLA) and Gated DeltaNet (GDN): tokenwise and chunkwise references.

KLA Algorithm 1 (left), one token, state ``S in R^{d_k x d_v}``:

    S~_{t-1} = D_t S_{t-1}                  D_t = alpha_t I (per head) or Diag(alpha_t) (per channel, App. B.5)
    e_t      = v_t - S~_{t-1}^T k_t
    beta_t   = eta_t / (||k_t||^2 + eps)    (coefficient="kaczmarz", eq. (3));  beta_t = eta_t for GDN
    S_t      = S~_{t-1} + beta_t k_t e_t^T
    o_t      = S_t^T q_t / ||q_t||_2        (Algorithm 1 line 6; normalize_queries=False drops the 1/||q_t||)

The chunkwise form (Algorithm 1 right, Props. 3-4) solves, per chunk of C tokens, the unit lower
triangular system ``(I + B (A^- . K K^T)) U = B (V - D_gamma K S_0)`` by forward substitution and
reads ``O = D_gamma Q S_0 + (A . Q K^T) U``, ``S_out = gamma_C S_0 + K^T Diag(gamma_C/gamma_j) U``,
with ``gamma_i = alpha_1 ... alpha_i`` and ``A_ij = gamma_i / gamma_j`` (j <= i). With per-channel
decay every decay product is elementwise over the d_k channels (App. B.5): ``A . K K^T`` becomes
``M_ij = sum_c k_ic k_jc gamma_ic / gamma_jc``.

Layout (as flash-linear-attention): ``q, k (..., T, H, d_k)``, ``v (..., T, H, d_v)``, ``alpha``
``(..., T, H)`` (per head) or ``(..., T, H, d_k)`` (per channel), ``eta (..., T, H)``, states
``(..., H, d_k, d_v)``, outputs ``(..., T, H, d_v)``. The chunk-level helpers (``kla_chunk_system``,
``forward_substitution``, ``kla_chunk_outputs``, ``wy_representation``, ``wy_matrices``) take one
chunk with time second to last: ``k (..., C, d_k)``, ``alpha (..., C)`` or ``(..., C, d_k)``;
their batch dimensions broadcast, rows and feature sizes must match. An empty chunk (C = 0)
gives empty results (and ``S_out = S_0``).

Inputs: alpha and eta are rounded once to the working dtype (the inputs "as rounded"); eps to
the compute dtype. ``0 < alpha <= 1`` and ``eta >= 0``; for KLA, ``0 <= eta <= 2`` makes every
token's transition ``alpha (I - beta k k^T)`` non-expansive (Prop. 2's factor in [-1, 1]).

Zero keys with ``eps = 0`` (KLA only): the constraint ``S^T k_t = v_t`` reads ``0 = v_t``. With
``v_t = 0`` every state satisfies it, the projection is the identity and the write is skipped
(``beta_t := 0``); with ``v_t != 0`` no state satisfies it and a ValueError names k and the token.
With ``eps > 0`` a zero key gives a zero write for any v_t (as in ``solvers.kaczmarz``).

Rounding model (``solvers._arith``): tokenwise, the state is stored in the working dtype after
every token (Algorithm 1 returns S_t); e, beta and the readout are computed in the compute dtype
and o_t stored once. Chunkwise, the stored values are the rows of U (stored as forward
substitution produces them), each chunk's outgoing state and the outputs; decay ratios, Gram
matrices, L and the right-hand side live in the compute dtype. Decay ratios are
``exp(g_i - g_j)`` with ``g_i = sum_{r<=i} log alpha_r`` summed sequentially in the compute dtype
(an identity for gamma_i / gamma_j that cannot underflow to 0/0 on long, strongly decaying chunks).

Differences from the printed Algorithm 1, all documented in docs/kla.md: the chunk outputs carry
the same ``1/||q_i||`` as the tokenwise readout (line 7 omits it; the text normalises q before
the readout), decay ratios through log-sums as above, and the WY recurrence of Prop. 5 is used in
its corrected form (docs/errata.md, "KLA").
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from . import validation as check
from ._arith import Arith

COEFFICIENTS = ("kaczmarz", "gdn")


def kla_recurrent(
    q,
    k,
    v,
    *,
    alpha,
    eta,
    eps: float = 1e-6,
    initial_state=None,
    coefficient: str = "kaczmarz",
    normalize_queries: bool = True,
    bf16_mode: str = "storage",
    return_final_state: bool = True,
):
    """KLA / GDN token by token (KLA Algorithm 1, left).

    Args:
        q, k: ``(..., T, H, d_k)``; v: ``(..., T, H, d_v)``; same dtype and device.
        alpha: decay in (0, 1], float or tensor ``(..., T, H)`` (per head) or ``(..., T, H, d_k)``
            (per channel, App. B.5), broadcast.
        eta: gate >= 0, float or tensor broadcast to ``(..., T, H)``.
        eps: stabiliser of eq. (3) (default 1e-6, the paper's App. C); unused for GDN.
        initial_state: S_0 ``(..., H, d_k, d_v)`` (default zeros), same dtype.
        coefficient: ``"kaczmarz"`` (beta = eta/(||k||^2 + eps), KLA) or ``"gdn"`` (beta = eta).
        normalize_queries: read ``o_t = S_t^T q_t / ||q_t||`` (Algorithm 1, line 6); False reads
            ``S_t^T q_t``. A zero query with normalisation is a ValueError.
        bf16_mode: ``"storage"`` or ``"strict"``; ignored unless bfloat16.
        return_final_state: also return S_T.

    Returns:
        o ``(..., T, H, d_v)`` in the input dtype, and S_T ``(..., H, d_k, d_v)`` if asked.
    """
    check.flag("return_final_state", return_final_state)
    x = _prepare(q, k, v, alpha, eta, eps, initial_state, coefficient, normalize_queries, bf16_mode)
    ar = x.arith
    S = x.state
    outputs = []
    for t in range(x.k.shape[-2]):
        a_t = x.alpha[..., t, :] if x.per_channel else x.alpha[..., t]
        decayed = _decay_state(ar.up(a_t), ar.up(S))
        k_t = x.k[..., t, :]
        e = ar.up(x.v[..., t, :]) - ar.rmatvec(decayed, k_t)
        write = (x.beta[..., t, None] * e).unsqueeze(-2)
        S = ar.store(decayed + ar.up(k_t).unsqueeze(-1) * write)
        outputs.append(_readout(S, x.q[..., t, :], x.normalize_queries, ar))
    o = _stack_time(outputs, x)
    return (o, S) if return_final_state else o


def kla_chunkwise(
    q,
    k,
    v,
    *,
    alpha,
    eta,
    eps: float = 1e-6,
    chunk_size: int = 64,
    initial_state=None,
    coefficient: str = "kaczmarz",
    normalize_queries: bool = True,
    bf16_mode: str = "storage",
    return_final_state: bool = True,
):
    """KLA / GDN chunk by chunk (KLA Algorithm 1, right; Props. 3-4; App. B.5 for per-channel decay).

    Same arguments and results as :func:`kla_recurrent`, plus ``chunk_size`` (C >= 1); T need not
    be a multiple of C (the last chunk is shorter). In exact arithmetic both functions return the
    same values; in floating point they differ by rounding (docs/kla.md, "Tokenwise vs chunkwise").
    """
    chunk_size = check.count("chunk_size", chunk_size, minimum=1)
    check.flag("return_final_state", return_final_state)
    x = _prepare(q, k, v, alpha, eta, eps, initial_state, coefficient, normalize_queries, bf16_mode)
    ar = x.arith
    S = x.state
    T = x.k.shape[-2]
    outputs = []
    for start in range(0, T, chunk_size):
        span = slice(start, min(start + chunk_size, T))
        decay = _ChunkDecay.of(
            x.alpha[..., span, :] if x.per_channel else x.alpha[..., span], x.per_channel, ar
        )
        K = x.k[..., span, :]
        L, R = _chunk_system(K, x.v[..., span, :], x.beta[..., span], decay, S, ar)
        U = _forward_substitution(L, R, ar)
        O, S = _chunk_outputs(x.q[..., span, :], K, U, decay, S, x.normalize_queries, ar)
        outputs.extend(O.unbind(-2))
    o = _stack_time(outputs, x)
    return (o, S) if return_final_state else o


def kaczmarz_coefficient(
    k, eta, *, eps: float = 1e-6, coefficient: str = "kaczmarz", bf16_mode: str = "storage"
):
    """beta = eta / (||k||^2 + eps) (KLA eq. (3)) or beta = eta (GDN), shape ``k.shape[:-1]``.

    ``k (..., d_k)``; ``eta`` float or tensor broadcast to ``k.shape[:-1]`` (rounded to k's dtype).
    Returned in the compute dtype. A zero key with eps = 0 gets beta = 0 (the write
    ``beta k e^T`` vanishes for any finite beta; :func:`kla_recurrent` also requires v = 0 there).
    """
    k = check.tensor("k", k, min_ndim=1)
    ar = Arith(k.dtype, check.bf16_mode(bf16_mode))
    coefficient = _coefficient(coefficient)
    eta_t = broadcast_gate("eta", eta, k.shape[:-1], None, k)[0]
    _check_range("eta", eta_t, low=0.0, low_open=False)
    return _beta(k, None, eta_t, nonnegative("eps", eps), coefficient, ar)


def kla_chunk_system(k, v, beta, alpha, initial_state, *, bf16_mode: str = "storage"):
    """The triangular system of KLA Prop. 3 (eq. (7)) for one chunk: ``(L, R)`` with
    ``L = B (A^- . K K^T)`` (strictly lower, ``(..., C, C)``) and ``R = B (V - D_gamma K S_0)``
    ``(..., C, d_v)``, both in the compute dtype; ``(I + L) U = R``.

    ``k (..., C, d_k)``, ``v (..., C, d_v)`` of k's dtype, ``beta (..., C)`` in k's dtype or the
    compute dtype (e.g. :func:`kaczmarz_coefficient`), ``alpha (..., C)`` or ``(..., C, d_k)``
    (per channel), ``initial_state (..., d_k, d_v)`` of k's dtype or None (zeros, as
    :func:`kla_recurrent`).
    """
    ar, k, decay = _chunk_args(k, alpha, bf16_mode)
    v = _chunk_rows("v", v, k)
    S0 = _chunk_state(initial_state, k, v.shape[-1], v.shape[:-2])
    return _chunk_system(k, v, ar.up(_chunk_beta(beta, k, ar)), decay, S0, ar)


def forward_substitution(L, R, *, dtype=None, bf16_mode: str = "storage"):
    """Solve ``(I + L) U = R``, ``L (..., C, C)`` strictly lower triangular, ``R (..., C, n)``.

    Row by row, ``U_i = R_i - sum_{j<i} L_ij U_j`` in the working precision ``dtype`` (default
    ``R.dtype``) and ``bf16_mode``, each row stored in ``dtype`` when computed -- pass
    ``dtype=torch.bfloat16`` with the float32 (L, R) of :func:`kla_chunk_system` to reproduce
    bf16 storage mode. The computed U satisfies ``(I + L + dL) U^ = R`` with ``|dL| <= gamma_C |L|`` (Higham 2002,
    Thm. 8.5).
    """
    L = check.square_matrix("L", L)
    R = check.tensor("R", R, min_ndim=2)
    check.same_kind("L", L, "R", R)  # both come from kla_chunk_system in one dtype
    if R.shape[-2] != L.shape[-1]:
        raise ValueError(
            f"R has {R.shape[-2]} rows but L is {L.shape[-2]}x{L.shape[-1]}; (I + L) U = R needs as many"
        )
    check.batch_shape("L and R", L.shape[:-2], R.shape[:-2])
    return _forward_substitution(
        L, R, Arith(R.dtype if dtype is None else dtype, check.bf16_mode(bf16_mode))
    )


def kla_chunk_outputs(
    q, k, U, alpha, initial_state, *, normalize_queries: bool = True, bf16_mode: str = "storage"
):
    """Chunk outputs and outgoing state of KLA Prop. 4 (eqs. (8)-(9)) from the solution U of
    Prop. 3: ``O = D_gamma Q S_0 + (A . Q K^T) U`` (row i divided by ``||q_i||`` when
    ``normalize_queries``) and ``S_out = gamma_C S_0 + K^T Diag(gamma_C / gamma_j) U``.
    Shapes as :func:`kla_chunk_system`: ``q (..., C, d_k)`` of k's dtype, ``U (..., C, d_v)`` in
    k's dtype or the compute dtype (as :func:`forward_substitution` returns it); returns
    ``(O (..., C, d_v), S_out (..., d_k, d_v))``. A zero query with ``normalize_queries`` is a
    ValueError, as in :func:`kla_recurrent`.
    """
    ar, k, decay = _chunk_args(k, alpha, bf16_mode)
    q = _chunk_rows("q", q, k, width=k.shape[-1])
    U = _chunk_rows("U", U, k, compute=ar)
    if not isinstance(normalize_queries, bool):
        raise TypeError(f"normalize_queries must be a bool, got {type(normalize_queries).__name__}")
    S0 = _chunk_state(initial_state, k, U.shape[-1], U.shape[:-2], q.shape[:-2])
    if normalize_queries:
        _check_queries(q, ar, chunk=True)
    return _chunk_outputs(q, k, U, decay, S0, normalize_queries, ar)


def wy_representation(k, v, beta, alpha, *, bf16_mode: str = "storage"):
    """The WY auxiliaries of KLA Props. 5-6 for one chunk (Prop. 5 corrected, docs/errata.md).

    With ``gamma_{r->i} = gamma_i / gamma_r`` (the decay strictly after r, as App. B.1 substitutes):

        w_i = beta_i (gamma_i k_i - sum_{r<i} (k_r^T gamma_{r->i} k_i) w_r)     (eq. (19), corrected)
        u_i = beta_i (v_i       - sum_{r<i} (k_r^T gamma_{r->i} k_i) u_r)     (eq. (21))

    so that ``P_i = gamma_i I - sum_{r<=i} gamma_{r->i} k_r w_r^T`` and
    ``H_i = sum_{r<=i} gamma_{r->i} k_r u_r^T`` give the state ``S_i = P_i S_0 + H_i``. Per-channel
    decay puts ``Diag(gamma)`` in place of ``gamma`` (App. B.5). Shapes as
    :func:`kla_chunk_system`; returns ``(W (..., C, d_k), U (..., C, d_v))`` in the working dtype.
    Both recurrences are the same triangular system as Prop. 3 with other right-hand sides.
    """
    ar, k, decay = _chunk_args(k, alpha, bf16_mode)
    v = _chunk_rows("v", v, k)
    b = ar.up(_chunk_beta(beta, k, ar)).unsqueeze(-1)
    L = b * _decayed_gram(k, k, decay, ar, strict=True)
    W = _forward_substitution(L, b * _scale_rows(k, decay.gamma(), ar), ar)
    U = _forward_substitution(L, b * ar.up(v), ar)
    return W, U


def wy_matrices(k, W, U, alpha, *, bf16_mode: str = "storage"):
    """``P_i (..., C, d_k, d_k)`` and ``H_i (..., C, d_k, d_v)`` of Props. 5-6 from the WY
    auxiliaries ``W (..., C, d_k)``, ``U (..., C, d_v)`` of :func:`wy_representation` (compute
    dtype), for i = 1..C; C = 0 gives empty ``(..., 0, d_k, d_k)`` and ``(..., 0, d_k, d_v)``."""
    ar, k, decay = _chunk_args(k, alpha, bf16_mode)
    W = _chunk_rows("W", W, k, width=k.shape[-1], compute=ar)
    U = _chunk_rows("U", U, k, compute=ar)
    d_k, d_v = k.shape[-1], U.shape[-1]
    batch = check.batch_shape("k, W and U", k.shape[:-2], W.shape[:-2], U.shape[:-2])
    if k.shape[-2] == 0:
        return (
            torch.zeros(*batch, 0, d_k, d_k, dtype=ar.compute, device=k.device),
            torch.zeros(*batch, 0, d_k, d_v, dtype=ar.compute, device=k.device),
        )
    eye = torch.eye(d_k, dtype=ar.compute, device=k.device).expand(*k.shape[:-2], d_k, d_k)
    Ps, Hs = [], []
    for i in range(k.shape[-2]):
        decayed_keys = _scale_rows(k[..., : i + 1, :], decay.ratios_to(i), ar).transpose(-1, -2)
        Ps.append(
            _decay_state(decay.gamma_at(i), eye) - ar.matmul(decayed_keys, W[..., : i + 1, :])
        )
        Hs.append(ar.matmul(decayed_keys, U[..., : i + 1, :]))
    return torch.stack(Ps, -3), torch.stack(Hs, -3)


# ----------------------------------------------------------------------------- preparation


@dataclass
class _Prepared:
    """Validated inputs in the per-head layout ``(..., H, T, d)``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    alpha: torch.Tensor  # (..., H, T) or (..., H, T, d_k), working dtype
    beta: torch.Tensor  # (..., H, T), compute dtype
    state: torch.Tensor  # (..., H, d_k, d_v), working dtype
    per_channel: bool
    normalize_queries: bool
    arith: Arith


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k ``(..., T, H, d_k)`` and v ``(..., T, H, d_v)`` of one dtype and device (fla's layout)."""
    check.same_kind("k", k, "q", q)
    check.same_kind("v", v, "q", q)
    if k.shape != q.shape:
        raise ValueError(
            f"q and k must have the same shape (..., T, H, d_k), got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"v must be (..., T, H, d_v) with the (..., T, H) of k {tuple(k.shape[:-1])}, got {tuple(v.shape)}"
        )


def initial_state_view(S0: torch.Tensor, k: torch.Tensor, d_v: int) -> torch.Tensor:
    """``S0`` ``(..., H, d_k, d_v)`` expanded to k's batch (a view), or an error naming
    initial_state: the shape check shared by the solvers, the kernels and the references."""
    *lead, _, H, d_k = k.shape
    if S0.shape[-3:] != (H, d_k, d_v):
        raise ValueError(
            f"initial_state must be (..., H, d_k, d_v) = (..., {H}, {d_k}, {d_v}), got {tuple(S0.shape)}"
        )
    try:
        return S0.expand(*lead, H, d_k, d_v)
    except RuntimeError:
        raise ValueError(
            f"initial_state has batch shape {tuple(S0.shape[:-3])}, which does not broadcast to q's {tuple(lead)}"
        ) from None


def check_arguments(
    q, k, v, alpha, eta, eps, initial_state, coefficient, normalize_queries, *, zero_queries=False
) -> float:
    """The KLA arguments as :func:`kla_recurrent` takes them, checked at the boundary of the
    references and bounds that replay it (``analysis.references.kaczmarz.mp_kla``,
    ``analysis.bounds.kaczmarz``); returns eps as a float. q, k, v finite floating tensors of
    fla's layout; alpha in (0, 1]; eta >= 0; eps >= 0; a known coefficient; a finite
    initial_state ``(..., H, d_k, d_v)`` whose batch broadcasts to k's; no query of norm 0
    under ``normalize_queries`` unless ``zero_queries``. Without it, NaN replays as NaN, a gate
    out of range as garbage, a shape mismatch as torch's reshape error and a zero query as a
    ZeroDivisionError, and a NaN bound would read as a pass."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check.floating(name, x, min_ndim=3)
    check_qkv(q, k, v)
    check.has_values("q", q, "KLA's checks (the gates' range, zero keys and queries)")
    _coefficient(coefficient)
    if not isinstance(normalize_queries, bool):
        raise TypeError(f"normalize_queries must be a bool, got {type(normalize_queries).__name__}")
    eps = nonnegative("eps", eps)
    kd = k.detach().to(torch.float64)  # the gates' ranges as given, before any rounding
    _check_range(
        "alpha",
        broadcast_gate("alpha", alpha, k.shape[:-1], k.shape, kd)[0],
        low=0.0,
        low_open=True,
        high=1.0,
    )
    _check_range(
        "eta", broadcast_gate("eta", eta, k.shape[:-1], None, kd)[0], low=0.0, low_open=False
    )
    if initial_state is not None:
        initial_state_view(
            check.floating("initial_state", initial_state, min_ndim=3), k, v.shape[-1]
        )
    if normalize_queries and not zero_queries and q.numel():
        if not bool((q.detach().to(torch.float64).norm(dim=-1) > 0).all()):
            raise ValueError(
                "q has a query of norm 0: o_t = S_t^T q_t / ||q_t|| is undefined; pass "
                "normalize_queries=False"
            )
    return eps


def _prepare(
    q, k, v, alpha, eta, eps, initial_state, coefficient, normalize_queries, bf16_mode
) -> _Prepared:
    q = check.tensor("q", q, min_ndim=3)
    k = check.tensor("k", k, min_ndim=3)
    v = check.tensor("v", v, min_ndim=3)
    check_qkv(q, k, v)
    check.has_values("q", q, "KLA's checks (the gates' range, zero keys and queries)")
    coefficient = _coefficient(coefficient)
    if not isinstance(normalize_queries, bool):
        raise TypeError(f"normalize_queries must be a bool, got {type(normalize_queries).__name__}")
    ar = Arith(q.dtype, check.bf16_mode(bf16_mode))
    eps = nonnegative("eps", eps)
    alpha_t, per_channel = broadcast_gate("alpha", alpha, k.shape[:-1], k.shape, k)
    _check_range("alpha", alpha_t, low=0.0, low_open=True, high=1.0)
    eta_t = broadcast_gate("eta", eta, k.shape[:-1], None, k)[0]
    _check_range("eta", eta_t, low=0.0, low_open=False)
    *lead, T, H, d_k = k.shape
    d_v = v.shape[-1]
    if initial_state is None:
        S0 = torch.zeros((*lead, H, d_k, d_v), dtype=q.dtype, device=q.device)
    else:
        S0 = check.tensor("initial_state", initial_state, min_ndim=3)
        check.same_kind("initial_state", S0, "q", q)
        # a copy: with T = 0 the final state is S_0, which must not alias the caller's tensor
        S0 = initial_state_view(S0, k, d_v).clone()
    # (..., T, H, d) -> (..., H, T, d): the recurrence runs along T for every head at once.
    qh, kh, vh = (t.movedim(-3, -2) for t in (q, k, v))
    alpha_h = alpha_t.movedim(-3, -2) if per_channel else alpha_t.movedim(-2, -1)
    eta_h = eta_t.movedim(-2, -1)
    if normalize_queries:
        _check_queries(qh, ar)
    beta = _beta(kh, vh, eta_h, eps, coefficient, ar)
    return _Prepared(qh, kh, vh, alpha_h, beta, S0, per_channel, normalize_queries, ar)


def _coefficient(c) -> str:
    if c not in COEFFICIENTS:
        raise ValueError(f"coefficient must be one of {COEFFICIENTS}, got {c!r}")
    return c


def nonnegative(name: str, v) -> float:
    """A finite float >= 0 (eps and friends), else an error naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(v).__name__}")
    if not (0.0 <= float(v) < float("inf")):
        raise ValueError(f"{name} must be a finite float >= 0, got {v}")
    return float(v)


def broadcast_gate(
    name, x, head_shape, channel_shape, like: torch.Tensor, *, check_finite: bool = True
):
    """A per-token gate as a tensor in ``like``'s dtype: ``(head_shape)`` or, when ``x`` has as
    many dimensions as ``channel_shape``, per channel. Returns ``(tensor, per_channel)``.

    ``check_finite=False`` skips the scan for NaN/Inf: the kernels check gates in-kernel and
    read one flag instead of synchronising on a separate pass."""
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a float or a tensor, got bool")
    if isinstance(x, numbers.Real):
        x = torch.tensor(float(x), dtype=torch.float64, device=like.device)
    elif isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
    else:
        raise TypeError(f"{name} must be a float or a tensor, got {type(x).__name__}")
    if check_finite:
        check.finite(name, x)
    per_channel = channel_shape is not None and x.ndim == len(channel_shape)
    target = channel_shape if per_channel else head_shape
    try:
        out = torch.broadcast_to(x.to(like.device), target)
    except RuntimeError:
        expected = f"{tuple(head_shape)}" + (
            f" or per channel {tuple(channel_shape)}" if channel_shape is not None else ""
        )
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}, which does not broadcast to {expected}"
        ) from None
    return out.to(like.dtype), per_channel


def _check_range(name, x, *, low, low_open, high=None):
    """Checked after rounding to the working dtype: what the algorithm will actually use."""
    if x.numel() == 0:
        return
    bad_low = (x <= low) if low_open else (x < low)
    if bool(bad_low.any()) or (high is not None and bool((x > high).any())):
        lo, hi = float(x.min()), float(x.max())
        interval = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}{']' if high is not None else ')'}"
        raise ValueError(
            f"{name} must lie in {interval} (after rounding to {x.dtype}); got values in [{lo}, {hi}]"
        )


def _check_queries(q: torch.Tensor, ar: Arith, *, chunk: bool = False) -> None:
    """No query of norm 0: ``q (..., H, T, d_k)``, or one chunk ``(..., C, d_k)`` if ``chunk``."""
    norms = ar.norm(q)  # (..., T): with d_k = 0 every query has norm 0 (q has no entries)
    if norms.numel() and not bool((norms > 0).all()):
        where = tuple(int(i) for i in (~(norms > 0)).nonzero()[0])
        at = (
            f"row {where[-1]}, batch index {where[:-1]}"
            if chunk
            else f"head {where[-2]}, token {where[-1]}, batch index {where[:-2]}"
        )
        raise ValueError(
            f"q has a query of norm 0 in {ar.compute} ({at}): o_t = S_t^T q_t / ||q_t|| is "
            "undefined; pass normalize_queries=False"
        )


def _beta(k, v, eta, eps: float, coefficient: str, ar: Arith) -> torch.Tensor:
    """KLA eq. (3) / GDN coefficient in the compute dtype, with the zero-key rule of the module doc."""
    if coefficient == "gdn":
        return ar.up(eta)
    den = ar.dot(k, k) + ar.scalar(eps)
    if den.numel() and not bool(torch.isfinite(den).all()):
        raise ValueError(f"||k_t||^2 overflows in {ar.compute}: rescale k")
    vanishing = den == 0
    if bool(vanishing.any()):
        zero_key = (k == 0).all(-1)
        underflow = vanishing & ~zero_key
        if bool(underflow.any()):
            raise ValueError(
                f"k has a nonzero key whose squared norm underflows to 0 in {ar.compute} at {_where(underflow)}: rescale k or pass eps > 0"
            )
        if v is not None:
            inconsistent = vanishing & (v != 0).any(-1)
            if bool(inconsistent.any()):
                raise ValueError(
                    f"k has a zero key with a nonzero value at {_where(inconsistent)} and eps = 0: the constraint "
                    "S^T k_t = v_t reads 0 = v_t, which no state satisfies (KLA eq. (1)); pass eps > 0 or zero v_t"
                )
    return torch.where(
        vanishing,
        torch.zeros_like(den),
        ar.up(eta) / torch.where(vanishing, torch.ones_like(den), den),
    )


def _where(mask: torch.Tensor) -> str:
    idx = tuple(int(i) for i in mask.nonzero()[0])
    return (
        f"head {idx[-2]}, token {idx[-1]}, batch index {idx[:-2]}"
        if len(idx) >= 2
        else f"index {idx}"
    )


def _stack_time(outputs: list, x: _Prepared) -> torch.Tensor:
    """Per-token outputs ``(..., H, d_v)`` to ``(..., T, H, d_v)``."""
    if not outputs:
        return x.v.new_zeros(x.v.shape).movedim(-2, -3)
    return torch.stack(outputs, dim=-3)


# ----------------------------------------------------------------------------- arithmetic


@dataclass(frozen=True)
class _ChunkDecay:
    """Cumulative log-decay ``g_i = sum_{r<=i} log alpha_r`` of one chunk (compute dtype):
    ``(..., C)`` per head or ``(..., C, d_k)`` per channel. Every decay product of Algorithm 1
    (right) is ``exp`` of a difference of these: ``gamma_i / gamma_j = exp(g_i - g_j)``."""

    g: torch.Tensor
    per_channel: bool

    @classmethod
    def of(cls, alpha: torch.Tensor, per_channel: bool, ar: Arith) -> "_ChunkDecay":
        # Summed left to right in the compute dtype, so strict bf16 rounds every partial sum
        # (torch.cumsum accumulates in a wider type).
        logs = torch.log(ar.up(alpha)).movedim(cls._axis(per_channel), 0)
        partial, acc = [], None
        for row in logs.unbind(0):
            acc = row if acc is None else acc + row
            partial.append(acc)
        g = torch.stack(partial, 0) if partial else logs
        return cls(g.movedim(0, cls._axis(per_channel)), per_channel)

    @staticmethod
    def _axis(per_channel: bool) -> int:
        return -2 if per_channel else -1

    def _at(self, i: int) -> torch.Tensor:
        return self.g.select(self._axis(self.per_channel), i)

    def gamma(self) -> torch.Tensor:
        """gamma_i for every row: the diagonal of D_gamma."""
        return torch.exp(self.g)

    def gamma_at(self, i: int) -> torch.Tensor:
        return torch.exp(self._at(i))

    def ratios_to(self, i: int) -> torch.Tensor:
        """gamma_i / gamma_r for r = 0..i (rows of ``Diag(gamma_C/gamma_j)`` when i = C - 1)."""
        ax = self._axis(self.per_channel)
        return torch.exp(self._at(i).unsqueeze(ax) - self.g.narrow(ax, 0, i + 1))

    def pairwise(self, strict: bool) -> torch.Tensor:
        """``gamma_i / gamma_j`` for j <= i (j < i if strict), 0 elsewhere: ``(..., C, C)`` or
        ``(..., C, C, d_k)``. The masked differences are never exponentiated (they are >= 0
        and could overflow)."""
        C = self.g.shape[self._axis(self.per_channel)]
        idx = torch.arange(C, device=self.g.device)
        mask = idx[None, :] < idx[:, None] if strict else idx[None, :] <= idx[:, None]
        if self.per_channel:
            diff = self.g.unsqueeze(-2) - self.g.unsqueeze(-3)
            mask = mask.unsqueeze(-1)
        else:
            diff = self.g.unsqueeze(-1) - self.g.unsqueeze(-2)
        return torch.exp(torch.where(mask, diff, torch.full_like(diff, float("-inf"))))


def _chunk_args(k, alpha, bf16_mode):
    k = check.tensor("k", k, min_ndim=2)
    ar = Arith(k.dtype, check.bf16_mode(bf16_mode))
    alpha_t, per_channel = broadcast_gate("alpha", alpha, k.shape[:-1], k.shape, k)
    _check_range("alpha", alpha_t, low=0.0, low_open=True, high=1.0)
    return ar, k, _ChunkDecay.of(alpha_t, per_channel, ar)


def _same_kind_or_compute(name: str, x: torch.Tensor, k: torch.Tensor, ar: Arith) -> None:
    """k's dtype, or the compute dtype the helpers return (fp32 beta and U for bf16 storage)."""
    if x.dtype != k.dtype and x.dtype != ar.compute:
        raise TypeError(
            f"{name} has dtype {x.dtype} but k has {k.dtype}; it must be {k.dtype} or the "
            f"compute dtype {ar.compute}"
        )
    if x.device != k.device:
        raise ValueError(f"{name} is on {x.device} but k is on {k.device}; they must match")


def _chunk_rows(name: str, x, k: torch.Tensor, *, width=None, compute: Arith = None):
    """A per-token tensor of the chunk ``(..., C, width)``: k's dtype (or, given ``compute``,
    the compute dtype too), k's C rows, a batch that broadcasts with k's."""
    x = check.tensor(name, x, min_ndim=2)
    if compute is None:
        check.same_kind(name, x, "k", k)
    else:
        _same_kind_or_compute(name, x, k, compute)
    if x.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"{name} has {x.shape[-2]} rows but k has {k.shape[-2]} (one per token of the chunk)"
        )
    if width is not None and x.shape[-1] != width:
        raise ValueError(f"{name} must be (..., C, {width}) like k, got {tuple(x.shape)}")
    check.batch_shape(f"k and {name}", k.shape[:-2], x.shape[:-2])
    return x


def _chunk_state(S0, k: torch.Tensor, d_v: int, *batches) -> torch.Tensor:
    """``initial_state (..., d_k, d_v)`` of k's dtype, batch broadcast with the chunk's; None is
    zeros (as :func:`kla_recurrent`)."""
    d_k = k.shape[-1]
    batch = check.batch_shape("k and the chunk's other inputs", k.shape[:-2], *batches)
    if S0 is None:
        return torch.zeros(*batch, d_k, d_v, dtype=k.dtype, device=k.device)
    S0 = check.tensor("initial_state", S0, min_ndim=2)
    check.same_kind("initial_state", S0, "k", k)
    if S0.shape[-2:] != (d_k, d_v):
        raise ValueError(
            f"initial_state must be (..., d_k, d_v) = (..., {d_k}, {d_v}), got {tuple(S0.shape)}"
        )
    check.batch_shape("initial_state and the chunk", S0.shape[:-2], batch)
    return S0


def _chunk_beta(beta, k: torch.Tensor, ar: Arith) -> torch.Tensor:
    """``beta (..., C)``: one coefficient per token of the chunk ``k (..., C, d_k)``."""
    beta = check.tensor("beta", beta, min_ndim=1)
    _same_kind_or_compute("beta", beta, k, ar)
    tokens = k.shape[:-1]
    if (
        beta.shape[-1] != tokens[-1]
        or check.batch_shape("beta and k", beta.shape, tokens) != tokens
    ):
        raise ValueError(
            f"beta must have shape {tuple(tokens)} (one per row of k), got {tuple(beta.shape)}"
        )
    return beta


def _decay_state(a: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """``D S``: a per-head decay ``a (...)`` or a per-channel one ``a (..., d_k)``, ``S (..., d_k, n)``."""
    a = a.to(S.dtype)
    return a[..., None, None] * S if a.ndim == S.ndim - 2 else a.unsqueeze(-1) * S


def _scale_rows(X: torch.Tensor, s: torch.Tensor, ar: Arith) -> torch.Tensor:
    """Row i of ``X (..., C, d)`` times ``s_i`` (``s (..., C)``) or elementwise (``s (..., C, d)``)."""
    s = s.to(ar.compute)
    return ar.up(X) * (s if s.ndim == X.ndim else s.unsqueeze(-1))


def _decayed_gram(X, Y, decay: _ChunkDecay, ar: Arith, *, strict: bool) -> torch.Tensor:
    """``M_ij = sum_c X_ic Y_jc gamma_ic / gamma_jc`` for j <= i (j < i if strict), else 0:
    ``A . X Y^T`` for a per-head decay, its App. B.5 generalisation per channel."""
    ratio = decay.pairwise(strict).to(ar.compute)
    if not decay.per_channel:
        return ratio * ar.matmul(X, Y.transpose(-1, -2))
    return ar.dot(ar.up(X).unsqueeze(-2) * ratio, Y.unsqueeze(-3))


def _chunk_system(K, V, beta, decay: _ChunkDecay, S0, ar: Arith):
    """Prop. 3: ``L = B (A^- . K K^T)``, ``R = B (V - D_gamma K S_0)`` in the compute dtype."""
    b = beta.to(ar.compute).unsqueeze(-1)
    R = b * (ar.up(V) - ar.matmul(_scale_rows(K, decay.gamma(), ar), S0))
    L = b * _decayed_gram(K, K, decay, ar, strict=True)
    return L, R


def _forward_substitution(L, R, ar: Arith) -> torch.Tensor:
    """``(I + L) U = R`` row by row; each row of U stored in the working dtype when computed and
    read back stored by the rows after it (a kernel keeps U in the storage dtype)."""
    rows = []
    for i in range(R.shape[-2]):
        acc = R[..., i, :].to(ar.compute)
        if i:
            acc = acc - ar.rmatvec(torch.stack(rows, -2), L[..., i, :i])
        rows.append(ar.store(acc))
    if not rows:
        return R.to(ar.dtype, copy=True)  # C = 0: never R itself
    return torch.stack(rows, -2)


def _chunk_outputs(Q, K, U, decay: _ChunkDecay, S0, normalize: bool, ar: Arith):
    """Prop. 4: ``O = D_gamma Q S_0 + (A . Q K^T) U`` (row-normalised by ``||q_i||``) and
    ``S_out = gamma_C S_0 + K^T Diag(gamma_C / gamma_j) U``, both stored in the working dtype."""
    C = K.shape[-2]
    if C == 0:  # an empty chunk: no outputs; the empty decay product is 1, so S_out = S_0
        batch = torch.broadcast_shapes(K.shape[:-2], U.shape[:-2], S0.shape[:-2])
        O = torch.zeros(
            *torch.broadcast_shapes(batch, Q.shape[:-2]),
            0,
            U.shape[-1],
            dtype=ar.dtype,
            device=K.device,
        )
        return O, ar.store(ar.up(S0)).expand(*batch, *S0.shape[-2:]).clone()
    O = ar.matmul(_scale_rows(Q, decay.gamma(), ar), S0) + ar.matmul(
        _decayed_gram(Q, K, decay, ar, strict=False), U
    )
    if normalize:
        O = O / ar.norm(Q).unsqueeze(-1)
    to_end = _scale_rows(K, decay.ratios_to(C - 1), ar).transpose(-1, -2)
    S_out = _decay_state(decay.gamma_at(C - 1), ar.up(S0)) + ar.matmul(to_end, U)
    return ar.store(O), ar.store(S_out)


def _readout(S, q_t, normalize: bool, ar: Arith) -> torch.Tensor:
    """Algorithm 1 line 6: ``o_t = S_t^T q_t / ||q_t||``, stored once."""
    o = ar.rmatvec(S, q_t)
    if normalize:
        o = o / ar.norm(q_t).unsqueeze(-1)
    return ar.store(o)
