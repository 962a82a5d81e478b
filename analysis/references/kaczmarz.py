"""mpmath replays of Kaczmarz and KLA / GDN: the ground truth of ``solvers.kaczmarz`` and
``solvers.kla`` (docs/kla.md).

Every replay takes the inputs *as the working solver used them* -- stored tensors converted
exactly, the relaxation / eps as rounded to the compute dtype (:func:`working_scalar`), alpha and
eta as rounded to the working dtype -- and runs the same recurrence at ``dps`` digits. Results
come back as double-double :class:`analysis.references.iterative.HighPrecision` so that float64 rounding
errors are measured with full relative accuracy.

* :func:`mp_kaczmarz`: the same row sequence (cyclic, or the rows a random-order run drew);
  :func:`kaczmarz_limit`: the exact point a consistent system's iteration converges to,
  ``x0 + A^+ (b - A x0)``.
* :func:`mp_kla`: KLA Algorithm 1 token by token, or (``chunk_size``) Algorithm 1 right with
  exact decay ratios -- the two agree to ~10^-dps (Props. 3-4), which the tests check.

Cost: a replay is O(T d_k d_v) mp operations per head (~10 ms for T = 16, d = 8).
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import mpmath
import torch

from solvers import Arith
from solvers import kla as _kla
from solvers import validation as _v

from . import mp as amp
from .mp import HighPrecision


def working_scalar(x: float, arith: Arith) -> float:
    """A parameter (relaxation, eps) as the working solver uses it: rounded to the compute dtype."""
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be a solvers.Arith, got {type(arith).__name__}")
    return float(arith.scalar(x))


def _mpf_list(t: torch.Tensor) -> list:
    return [mpmath.mpf(v) for v in t.detach().cpu().to(torch.float64).reshape(-1).tolist()]


def _rows(t: torch.Tensor) -> list:
    """A 2-D tensor as a list of rows of mpf (exact)."""
    a = t.detach().cpu().to(torch.float64)
    return [[mpmath.mpf(v) for v in row] for row in a.tolist()]


# ----------------------------------------------------------------------------- Kaczmarz


def _flat_systems(A, b, x0):
    """``(batch, m, n, A, b, x0)`` with the batch broadcast and flattened (x0 None: zeros).

    Checked first: a mismatch raised torch's expand / reshape error, NaN came back as NaN."""
    A = _v.floating("A", A, min_ndim=2)
    m, n = A.shape[-2:]
    if m == 0 or n == 0:
        raise ValueError(f"A must have m, n >= 1, got shape {tuple(A.shape)}")
    b = _v.floating("b", b)
    if b.shape[-1] != m:
        raise ValueError(f"b has last dimension {b.shape[-1]} but A has {m} rows")
    if x0 is not None:
        x0 = _v.floating("x0", x0)
        if x0.shape[-1] != n:
            raise ValueError(f"x0 has last dimension {x0.shape[-1]} but A has {n} columns")
    batch = _v.batch_shape(
        "A, b and x0", A.shape[:-2], b.shape[:-1], () if x0 is None else x0.shape[:-1]
    )
    A_f = A.expand(*batch, m, n).reshape(-1, m, n)
    b_f = b.expand(*batch, m).reshape(-1, m)
    x_f = (
        torch.zeros(A_f.shape[0], n, dtype=torch.float64)
        if x0 is None
        else x0.expand(*batch, n).reshape(-1, n)
    )
    return batch, m, n, A_f, b_f, x_f


def _relaxation_eps(relaxation, eps) -> None:
    """omega in (0, 2] (2: a working omega < 2 may round up to it) and eps >= 0, finite: NaN
    replayed as NaN, eps < 0 changed the step (or skipped rows), omega = 0 divided by zero."""
    if isinstance(relaxation, bool) or not isinstance(relaxation, numbers.Real):
        raise TypeError(f"relaxation must be a float, got {type(relaxation).__name__}")
    if not 0 < relaxation <= 2:
        raise ValueError(f"relaxation must be in (0, 2], got {relaxation}")
    _v.tolerance("eps", eps)


def mp_kaczmarz(
    A,
    b,
    *,
    sweeps: int,
    rows=None,
    relaxation: float = 1.0,
    eps: float = 0.0,
    x0=None,
    dps: int = amp.DPS,
) -> HighPrecision:
    """Kaczmarz iterates after each sweep, ``(sweeps + 1, *batch, n)``, replayed in mpmath.

    ``rows``: ``(sweeps, *batch, m)`` row order (``info.rows`` of a random-order run); None
    means cyclic. A row with ``||a_i||^2 + eps = 0`` is skipped (the solver's zero-row rule).
    """
    batch, m, n, A_f, b_f, x_f = _flat_systems(A, b, x0)
    sweeps, dps = _v.count("sweeps", sweeps), _v.count("dps", dps, minimum=1)
    _relaxation_eps(relaxation, eps)
    if rows is not None:  # an index out of range raised IndexError, -1 read the last row
        if not isinstance(rows, torch.Tensor) or rows.dtype not in (torch.int32, torch.int64):
            raise TypeError("rows must be an integer tensor (sweeps, *batch, m) of row indices")
        if rows.ndim < 1 or rows.shape[0] < sweeps or tuple(rows.shape[1:]) != (*batch, m):
            raise ValueError(
                f"rows must have shape (>= sweeps, *batch, m) = (>= {sweeps}, "
                f"{', '.join(str(d) for d in (*batch, m))}), got {tuple(rows.shape)}"
            )
        if rows.numel() and not bool(((rows >= 0) & (rows < m)).all()):
            raise ValueError(f"rows must hold row indices in [0, {m})")
        rows = rows[:sweeps]
    r_f = None if rows is None else rows.reshape(sweeps, -1, m)
    values = [[] for _ in range(sweeps + 1)]
    with amp.precision(dps):
        omega, eps_m = mpmath.mpf(relaxation), mpmath.mpf(eps)
        for s in range(A_f.shape[0]):
            Am, bm, x = _rows(A_f[s]), _mpf_list(b_f[s]), _mpf_list(x_f[s])
            den = [mpmath.fdot(a, a) + eps_m for a in Am]
            values[0].extend(x)
            for sweep in range(sweeps):
                order = range(m) if r_f is None else r_f[sweep, s].tolist()
                for i in order:
                    if den[i] == 0:
                        continue
                    c = omega * (bm[i] - mpmath.fdot(Am[i], x)) / den[i]
                    x = [xj + c * aj for xj, aj in zip(x, Am[i])]
                values[sweep + 1].extend(x)
        flat = [v for per_sweep in values for v in per_sweep]
        return HighPrecision.from_mp(flat, (sweeps + 1, *batch, n))


def kaczmarz_limit(A, b, x0=None, *, dps: int = amp.DPS) -> HighPrecision:
    """``x0 + A^+ (b - A x0)``: the limit of Kaczmarz (omega in (0, 2), eps = 0) on a consistent
    system -- the solution closest to x0. Full rank is assumed: ``A^+ r = (A^T A)^{-1} A^T r`` for
    m >= n, ``A^T (A A^T)^{-1} r`` for m < n, solved by mp Cholesky."""
    batch, m, n, A_f, b_f, x_f = _flat_systems(A, b, x0)
    dps = _v.count("dps", dps, minimum=1)
    out = []
    with amp.precision(dps):
        for s in range(A_f.shape[0]):
            Am = amp.to_mp(A_f[s])
            x = amp.to_mp(x_f[s])
            r = amp.to_mp(b_f[s]) - Am * x
            try:
                if m >= n:
                    step = amp.solve_spd(Am.T * Am, Am.T * r)
                else:
                    step = Am.T * amp.solve_spd(Am * Am.T, r)
            except (ValueError, ZeroDivisionError):  # mpmath's Cholesky error, named
                raise ValueError(
                    f"A must have full rank (kaczmarz_limit assumes it); system {s} of the "
                    "flattened batch does not"
                ) from None
            out.extend(x[j] + step[j] for j in range(n))
        return HighPrecision.from_mp(out, (*batch, n))


def mp_sweep_closed_form(
    A, b, x0=None, *, relaxation: float = 1.0, eps: float = 0.0, dps: int = amp.DPS
) -> HighPrecision:
    """One cyclic sweep in closed form, ``x0 + A^T (D_eps/omega + L)^{-1} (b - A x0)`` (pyamg's
    identity; ``tril(A A^T)`` for omega = 1, eps = 0), by exact forward substitution in mpmath.
    ``D_eps = diag(||a_i||^2 + eps)``, L the strict lower part of ``A A^T``; rows with
    ``||a_i||^2 + eps = 0`` (skipped by the solver) get y_i = 0."""
    batch, m, n, A_f, b_f, x_f = _flat_systems(A, b, x0)
    dps = _v.count("dps", dps, minimum=1)
    _relaxation_eps(relaxation, eps)
    out = []
    with amp.precision(dps):
        omega, eps_m = mpmath.mpf(relaxation), mpmath.mpf(eps)
        for s in range(A_f.shape[0]):
            Am, bm, x = _rows(A_f[s]), _mpf_list(b_f[s]), _mpf_list(x_f[s])
            r = [bi - mpmath.fdot(a, x) for a, bi in zip(Am, bm)]
            y = []
            for i in range(m):
                diag = (mpmath.fdot(Am[i], Am[i]) + eps_m) / omega
                acc = r[i] - mpmath.fsum(mpmath.fdot(Am[i], Am[j]) * y[j] for j in range(i))
                y.append(mpmath.mpf(0) if diag == 0 else acc / diag)
            out.extend(x[j] + mpmath.fsum(Am[i][j] * y[i] for i in range(m)) for j in range(n))
        return HighPrecision.from_mp(out, (*batch, n))


# ----------------------------------------------------------------------------- KLA


def mp_kla(
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
    chunk_size: Optional[int] = None,
    dps: int = amp.DPS,
):
    """KLA / GDN in mpmath: ``(o (..., T, H, d_v), S_T (..., H, d_k, d_v))`` as HighPrecision.

    Layout and arguments as ``solvers.kla_recurrent`` (alpha, eta: tensors or floats, already
    rounded as the solver rounds them; eps as :func:`working_scalar` gives it). ``chunk_size``
    None replays Algorithm 1 (left); an int replays Algorithm 1 (right) -- Prop. 3's triangular
    solve and Prop. 4's outputs, with ``gamma_i / gamma_j`` formed as exact products.
    """
    _kla.check_arguments(q, k, v, alpha, eta, eps, initial_state, coefficient, normalize_queries)
    if chunk_size is not None:
        chunk_size = _v.count("chunk_size", chunk_size, minimum=1)  # 0: range()'s error
    dps = _v.count("dps", dps, minimum=1)
    *lead, T, H, d_k = k.shape
    d_v = v.shape[-1]
    per_channel = isinstance(alpha, torch.Tensor) and alpha.ndim == k.ndim
    al = torch.as_tensor(alpha, dtype=torch.float64).to(torch.float64)
    al = al.expand(*k.shape) if per_channel else al.expand(*k.shape[:-1])
    et = torch.as_tensor(eta, dtype=torch.float64).to(torch.float64).expand(*k.shape[:-1])
    S0 = (
        torch.zeros(*lead, H, d_k, d_v, dtype=torch.float64)
        if initial_state is None
        else initial_state.expand(*lead, H, d_k, d_v)
    )
    # the batch size spelt out: reshape(-1, ...) is ambiguous when T, H or d is 0
    flat = lambda t, tail: t.to(torch.float64).reshape(math.prod(lead), *tail)  # noqa: E731
    qf, kf, vf = flat(q, (T, H, d_k)), flat(k, (T, H, d_k)), flat(v, (T, H, d_v))
    af = flat(al, (T, H, d_k) if per_channel else (T, H))
    ef, sf = flat(et, (T, H)), flat(S0, (H, d_k, d_v))
    outs, states = [], []
    with amp.precision(dps):
        for n in range(qf.shape[0]):
            o_heads, s_heads = [], []
            for h in range(H):
                head = _Head(
                    q=_rows(qf[n, :, h]),
                    k=_rows(kf[n, :, h]),
                    v=_rows(vf[n, :, h]),
                    alpha=_rows(af[n, :, h])
                    if per_channel
                    else [[a] * d_k for a in _mpf_list(af[n, :, h])],
                    eta=_mpf_list(ef[n, :, h]),
                    S0=_rows(sf[n, h]),
                    eps=mpmath.mpf(eps),
                    gdn=coefficient == "gdn",
                    normalize=normalize_queries,
                )
                o, S = head.tokenwise() if chunk_size is None else head.chunkwise(chunk_size)
                o_heads.append(o)
                s_heads.append(S)
            # (T, H, d_v) row-major for this batch member
            outs.extend(o_heads[h][t][j] for t in range(T) for h in range(H) for j in range(d_v))
            states.extend(x for S in s_heads for row in S for x in row)
        return (
            HighPrecision.from_mp(outs, (*lead, T, H, d_v)),
            HighPrecision.from_mp(states, (*lead, H, d_k, d_v)),
        )


class _Head:
    """One head's sequence in mpmath: lists of rows; alpha always per channel (a per-head decay
    repeated d_k times is the same operator)."""

    def __init__(self, *, q, k, v, alpha, eta, S0, eps, gdn, normalize):
        self.q, self.k, self.v, self.alpha, self.eta = q, k, v, alpha, eta
        self.S0, self.eps, self.gdn, self.normalize = S0, eps, gdn, normalize
        self.beta = [self._beta(t) for t in range(len(k))]

    def _beta(self, t):
        if self.gdn:
            return self.eta[t]
        den = mpmath.fdot(self.k[t], self.k[t]) + self.eps
        return mpmath.mpf(0) if den == 0 else self.eta[t] / den

    def _read(self, S, t):
        d_v = len(S[0]) if S else len(self.v[t])
        o = [mpmath.fdot([S[c][j] for c in range(len(S))], self.q[t]) for j in range(d_v)]
        if self.normalize:
            nq = mpmath.sqrt(mpmath.fdot(self.q[t], self.q[t]))
            o = [x / nq for x in o]
        return o

    def tokenwise(self):
        """Algorithm 1 (left)."""
        S = [row[:] for row in self.S0]
        d_k, d_v = len(self.S0), len(self.v[0]) if self.v else 0  # T = 0: no k[0]
        outs = []
        for t in range(len(self.k)):
            Sd = [[self.alpha[t][c] * S[c][j] for j in range(d_v)] for c in range(d_k)]
            e = [
                self.v[t][j] - mpmath.fdot([Sd[c][j] for c in range(d_k)], self.k[t])
                for j in range(d_v)
            ]
            S = [
                [Sd[c][j] + self.beta[t] * self.k[t][c] * e[j] for j in range(d_v)]
                for c in range(d_k)
            ]
            outs.append(self._read(S, t))
        return outs, S

    def chunkwise(self, C: int):
        """Algorithm 1 (right) chunk by chunk (Props. 3-4, App. B.5 per channel)."""
        S = [row[:] for row in self.S0]
        d_k, d_v = len(self.S0), len(self.v[0]) if self.v else 0  # T = 0: no k[0]
        T = len(self.k)
        outs = []
        for start in range(0, T, C):
            idx = list(range(start, min(start + C, T)))
            n = len(idx)
            gamma = []  # gamma_i per channel, cumulative from the chunk start
            acc = [mpmath.mpf(1)] * d_k
            for t in idx:
                acc = [a * al for a, al in zip(acc, self.alpha[t])]
                gamma.append(acc)
            ratio = lambda i, j: [gamma[i][c] / gamma[j][c] for c in range(d_k)]  # noqa: E731
            gram = lambda x, y, r: mpmath.fsum(x[c] * y[c] * r[c] for c in range(d_k))  # noqa: E731
            U = []
            for a, i in enumerate(idx):
                pred = [
                    mpmath.fsum(gamma[a][c] * self.k[i][c] * S[c][j] for c in range(d_k))
                    for j in range(d_v)
                ]
                rhs = [self.beta[i] * (self.v[i][j] - pred[j]) for j in range(d_v)]
                for b_ in range(a):
                    L_ab = self.beta[i] * gram(self.k[i], self.k[idx[b_]], ratio(a, b_))
                    rhs = [x - L_ab * u for x, u in zip(rhs, U[b_])]
                U.append(rhs)
            for a, i in enumerate(idx):
                o = [
                    mpmath.fsum(gamma[a][c] * self.q[i][c] * S[c][j] for c in range(d_k))
                    for j in range(d_v)
                ]
                for b_ in range(a + 1):
                    N_ab = gram(self.q[i], self.k[idx[b_]], ratio(a, b_))
                    o = [x + N_ab * u for x, u in zip(o, U[b_])]
                if self.normalize:
                    nq = mpmath.sqrt(mpmath.fdot(self.q[i], self.q[i]))
                    o = [x / nq for x in o]
                outs.append(o)
            last = n - 1
            S = [
                [
                    gamma[last][c] * S[c][j]
                    + mpmath.fsum(
                        ratio(last, b_)[c] * self.k[idx[b_]][c] * U[b_][j] for b_ in range(n)
                    )
                    for j in range(d_v)
                ]
                for c in range(d_k)
            ]
        return outs, S
