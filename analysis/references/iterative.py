"""mpmath ground truth for the linear solvers: the exact solution and exact replays.

For a batch of systems ``H x = q`` *as stored* in a working dtype (every stored value is a
dyadic rational, converted exactly by :func:`analysis.references.mp.to_mp`):

* :func:`exact_solution` solves each system by Cholesky at ``dps`` >= 50 digits
  (``analysis.references.mp.DPS``) and records the stored matrix's spectrum.
* :func:`replay` runs the same iteration as the working solver -- Chebyshev (GKA Algorithm 1
  with the same omega recursion), CG, GD, AGD, exactly the recurrences of
  ``solvers/chebyshev.py``, ``solvers/cg.py``, ``solvers/gradient.py`` -- in mpmath and
  returns every iterate.
* :func:`error_split` puts the two together with the working solver's own iterates:
  ``truncation_i = ||x_mp_i - x*|| / ||x*||`` and ``rounding_i = ||x_hat_i - x_mp_i|| / ||x*||``.

The constants of the replay (decision, see docs/precision.md "Ground truth"): by default
(``constants="working"``) the replay uses *exactly* the per-system constants the working
solver used -- 2/(L+mu), rho^2, 1/L, the AGD momentum -- i.e. the float64 value after
``Arith.scalar`` rounded it to the compute dtype (fp32 in bf16 storage mode, bf16 in strict
mode). Then ``rounding`` measures arithmetic rounding only, and the rounding of the constants
shows up in ``truncation``, which is held to the bound *for the constants used*
(``analysis.bounds.iterative.chebyshev_bound_for_constants``). ``constants="exact"`` replays with the
constants computed in mpmath from the float64 L and mu: the paper's algorithm for the given
(L, mu), held to the paper's bounds.

mpmath values are returned as double-double pairs (:class:`HighPrecision`, ~32 digits), ample
to measure float64 rounding (~1e-16) with full relative accuracy, and vectorised.

Cost (gmpy backend, one core): a mp matvec is ~0.03 ms at D=8, ~0.07 ms at D=12, ~0.4 ms at
D=32 (~7 ms at D=128); Cholesky ~1 ms, ~2 ms, ~13 ms (~1 s at D=128); the symmetric
eigenvalues (``mpmath.eigsy``) ~20 ms, ~45 ms, ~0.26 s. A 100-iteration replay of one D=12
system takes ~10 ms. Results are cached on disk, one file per system, under
``ground_truth/`` in the user cache directory (:func:`cache_root`; ``SVT_CACHE_DIR`` overrides
it), keyed by a hash of the
stored bytes, the method, the constants, the iteration count, dps and the source of the code
that computes the cached values;
``SVT_NO_CACHE=1`` disables the cache, ``SVT_RECOMPUTE=1`` (or ``recompute=True``, or the
CLI's ``--recompute``) recomputes and overwrites.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import numbers
import os
import pathlib
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import mpmath
import torch

from solvers import Arith
from solvers import agd as agd_solver
from solvers import cg as cg_solver
from solvers import chebyshev as chebyshev_solver
from solvers import gd as gd_solver
from solvers import validation as _v

from . import mp as amp
from .metrics import backward_error
from .mp import HighPrecision  # noqa: F401  (re-exported: the values this module returns)

METHODS = ("chebyshev", "cg", "gd", "agd")
SOLVERS = {"chebyshev": chebyshev_solver, "cg": cg_solver, "gd": gd_solver, "agd": agd_solver}
NEEDS_BOUNDS = {"chebyshev": True, "cg": False, "gd": True, "agd": True}
CONSTANTS = {"chebyshev": ("step", "rho2"), "cg": (), "gd": ("step",), "agd": ("step", "beta")}


def _method(method) -> str:
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


# ----------------------------------------------------------------------------- values


@dataclass
class ExactSolution:
    """The >= 50-digit solution of each stored system, and the stored matrix's spectrum.

    x: ``(*batch, D)``; eigenvalues: ``(*batch, D)`` ascending, of the stored (symmetric)
    matrix, computed in mpmath and rounded to float64; spd: the mp Cholesky succeeded (the stored
    matrix is positive definite -- bf16 rounding can destroy that at large kappa; those
    systems are solved by mp LU instead).
    """

    x: HighPrecision
    eigenvalues: torch.Tensor
    spd: torch.Tensor

    @property
    def norm2(self) -> torch.Tensor:
        """``||H||_2`` of the stored matrix (float64, from the stored values)."""
        return self.eigenvalues.abs().amax(dim=-1)

    @property
    def kappa(self) -> torch.Tensor:
        """2-norm condition number of the stored matrix (inf where it is not positive definite)."""
        lo, hi = self.eigenvalues[..., 0], self.eigenvalues[..., -1]
        return torch.where(
            lo > 0,
            hi / lo.clamp_min(torch.finfo(torch.float64).tiny),
            torch.full_like(lo, float("inf")),
        )


@dataclass
class Replay:
    """Every iterate of the mpmath replay, and its truncation error measured in mpmath.

    iterates: ``(iters + 1, *batch, D)``, indexed like ``SolveInfo.iterates``.
    truncation: ``(iters + 1, *batch)`` ``||x_mp_i - x*||_2 / ||x*||_2``.
    truncation_H: the same in the H-norm, ``||x_mp_i - x*||_H / ||x*||_H`` (CG's bound's norm).
    constants: the per-system constants the replay used (float64 tensors, ``batch``-shaped).
    """

    method: str
    iterates: HighPrecision
    truncation: torch.Tensor
    truncation_H: torch.Tensor
    constants: dict = field(default_factory=dict)


# ------------------------------------------------------------------------- constants


def working_constants(method: str, L, mu, arith: Arith) -> dict:
    """The per-system constants of the working solver, as the values it computed.

    Mirrors the solvers exactly: a float64 expression of L and mu, rounded once by
    ``Arith.scalar`` to the compute dtype (fp32 in bf16 storage mode, bf16 in strict mode).
    Returned as float64 tensors (exact: the rounded values are representable).
    """
    if _method(method) == "cg":
        return {}
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be a solvers.Arith, got {type(arith).__name__}")
    # L < mu, mu <= 0 or a NaN gave NaN (or negative) constants silently
    given = [v for v in (L, mu) if isinstance(v, torch.Tensor)]
    batch = _v.batch_shape("L and mu", *(v.shape for v in given))
    device = given[0].device if given else "cpu"
    L, mu = _v.parameter("L", L, batch, device), _v.parameter("mu", mu, batch, device)
    _v.spectrum_bounds(L, mu)
    rounded = lambda v: arith.scalar(v).to(torch.float64)  # noqa: E731
    if method in ("chebyshev", "gd"):
        consts = {"step": rounded(2.0 / (L + mu))}  # chebyshev.py / gradient.py: 2/(L+mu)
        if method == "chebyshev":
            consts["rho2"] = rounded(((L - mu) / (L + mu)) ** 2)
        return consts
    sk = torch.sqrt(L / mu)  # agd
    return {"step": rounded(1.0 / L), "beta": rounded((sk - 1.0) / (sk + 1.0))}


def exact_constants(method: str, L, mu) -> dict:
    """The constants of ``method`` (as :func:`working_constants` names them) computed in mpmath,
    at the caller's precision, from L and mu (floats, converted exactly, or mpf): the paper's
    algorithm."""
    # an unknown method got AGD's constants; mu = 0 divided by zero; mu < 0 gave a complex
    # beta, L < mu or a NaN wrong constants, silently
    if _method(method) == "cg":
        return {}
    for name, v in (("L", L), ("mu", mu)):
        if isinstance(v, bool) or not isinstance(v, (numbers.Real, mpmath.mpf)):
            raise TypeError(f"{name} must be a float or an mpf, got {type(v).__name__}")
    L, mu = mpmath.mpf(L), mpmath.mpf(mu)
    if not (mpmath.isfinite(L) and mpmath.isfinite(mu) and L >= mu > 0):
        raise ValueError(f"L and mu must be finite with L >= mu > 0, got L = {L}, mu = {mu}")
    if method in ("chebyshev", "gd"):
        c = {"step": 2 / (L + mu)}
        if method == "chebyshev":
            c["rho2"] = ((L - mu) / (L + mu)) ** 2
        return c
    sk = mpmath.sqrt(L / mu)
    return {"step": 1 / L, "beta": (sk - 1) / (sk + 1)}


# ---------------------------------------------------------------------------- replays


def _matvec(H, x):
    return [mpmath.fdot(row, x) for row in H]


def _dot(x, y):
    return mpmath.fdot(x, y)


def _replay_chebyshev(H, q, iters, c):
    """GKA Algorithm 1, as solvers/chebyshev.py: xi_0 = step q, then omega and the fused update.

    The weights are typed out in mpmath on purpose, independent of ``solvers.omega_schedule``:
    this is the exact reference that the schedule's working-precision values are held to."""
    step, rho2 = c["step"], c["rho2"]
    omega = mpmath.mpf(2)
    xi_prev = [mpmath.mpf(0)] * len(q)
    xi = [step * v for v in q]
    out = [xi]
    for _ in range(iters):
        omega = 4 / (4 - rho2 * omega)
        grad = [g - v for g, v in zip(_matvec(H, xi), q)]
        xi_new = [
            a - omega * step * g + (omega - 1) * (a - b) for a, g, b in zip(xi, grad, xi_prev)
        ]
        xi_prev, xi = xi, xi_new
        out.append(xi)
    return out


def _replay_cg(H, q, iters, c):
    """Hestenes-Stiefel CG from x_0 = 0, as solvers/cg.py (a system freezes when r or p^T H p is 0)."""
    zero = mpmath.mpf(0)
    x = [zero] * len(q)
    r = list(q)
    p = list(q)
    rr = _dot(r, r)
    out = [x]
    for _ in range(iters):
        Hp = _matvec(H, p)
        pHp = _dot(p, Hp)
        if rr != 0 and pHp > 0:
            alpha = rr / pHp
            x = [a + alpha * b for a, b in zip(x, p)]
            r = [a - alpha * b for a, b in zip(r, Hp)]
            rr_new = _dot(r, r)
            beta = rr_new / rr
            p = [a + beta * b for a, b in zip(r, p)]
            rr = rr_new
        out.append(x)
    return out


def _replay_gd(H, q, iters, c):
    """x_{i+1} = x_i - step (H x_i - q) from x_0 = 0, as solvers/gradient.py gd."""
    step = c["step"]
    x = [mpmath.mpf(0)] * len(q)
    out = [x]
    for _ in range(iters):
        x = [a - step * (g - v) for a, g, v in zip(x, _matvec(H, x), q)]
        out.append(x)
    return out


def _replay_agd(H, q, iters, c):
    """Nesterov with step 1/L and constant momentum, x_0 = y_0 = 0, as solvers/gradient.py agd."""
    step, beta = c["step"], c["beta"]
    x = [mpmath.mpf(0)] * len(q)
    y = x
    out = [x]
    for _ in range(iters):
        x_new = [a - step * (g - v) for a, g, v in zip(y, _matvec(H, y), q)]
        y = [a + beta * (a - b) for a, b in zip(x_new, x)]
        x = x_new
        out.append(x)
    return out


_REPLAYS = {"chebyshev": _replay_chebyshev, "cg": _replay_cg, "gd": _replay_gd, "agd": _replay_agd}


def mp_iterates(method: str, H, q, iters: int, constants: dict) -> list:
    """The iterates ``x_0 .. x_iters`` of ``method`` run in mpmath at the caller's precision:
    the replays behind :func:`replay`, for callers that build their own mp systems
    (``analysis.references.gka``).

    H: the matrix as a list of rows of mpf; q: a list of mpf; constants: as returned by
    :func:`exact_constants` (or :func:`working_constants`, converted to mpf). Each iterate
    is a list of mpf.
    """
    _method(method)
    iters = _v.count("iters", iters)  # -1 returned x_0 alone, silently
    if isinstance(H, torch.Tensor) or isinstance(q, torch.Tensor):
        raise TypeError("H and q must be lists of mpf, not tensors (see analysis.references.mp)")
    # a q shorter or longer than H was read in part (zip), silently
    D = len(q)
    if D == 0 or len(H) != D or any(len(row) != D for row in H):
        raise ValueError(
            f"H must be a D x D list of rows for q of length D >= 1, got {len(H)} rows "
            f"of lengths {sorted({len(row) for row in H})} and D = {D}"
        )
    missing = [k for k in CONSTANTS[method] if k not in constants]
    if missing:  # was a KeyError
        raise ValueError(f"constants must hold {CONSTANTS[method]} for {method}, missing {missing}")
    return _REPLAYS[method](H, q, iters, constants)


# ------------------------------------------------------------------------------ cache


_WRITTEN: set = set()  # cache files written by this process


CACHE_APP = "solver-verification-toolkit"


def cache_root() -> pathlib.Path:
    """Where the toolkit caches ground truth: ``SVT_CACHE_DIR`` if set, else the user cache
    directory (``platformdirs.user_cache_dir``, e.g. ``~/.cache/solver-verification-toolkit``
    on Linux) -- never inside the installed package, which may be read-only or shared."""
    root = os.environ.get("SVT_CACHE_DIR")
    if root:
        return pathlib.Path(root).expanduser()
    try:
        import platformdirs
    except (
        ImportError
    ):  # a checkout run without installing: the XDG default platformdirs would give
        base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
        return pathlib.Path(base) / CACHE_APP
    return pathlib.Path(platformdirs.user_cache_dir(CACHE_APP, appauthor=False))


def _cache_dir() -> Optional[pathlib.Path]:
    if os.environ.get("SVT_NO_CACHE", "") not in ("", "0"):
        return None
    return cache_root() / "ground_truth"


def _recompute_requested(recompute: bool) -> bool:
    return recompute or os.environ.get("SVT_RECOMPUTE", "") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _code_digest() -> str:
    """Hash of the code whose output is cached: editing any of it invalidates the cache."""
    code = (_solve_one, _replay_one, HighPrecision.from_mp, *_REPLAYS.values())
    return hashlib.sha256("".join(inspect.getsource(f) for f in code).encode()).hexdigest()[:16]


def _key(*parts) -> str:
    h = hashlib.sha256(_code_digest().encode())
    for p in parts:
        if isinstance(p, torch.Tensor):
            h.update(p.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
        else:
            h.update(repr(p).encode())
        h.update(b"|")
    return h.hexdigest()


def _cached(kind: str, key: str, compute, recompute: bool):
    """``compute()`` (a dict of tensors), through the on-disk cache."""
    folder = _cache_dir()
    if folder is None:
        return compute()
    path = folder / kind / f"{key}.pt"
    # A recompute request recomputes each entry once per process, not at every use.
    if path.exists() and (path in _WRITTEN or not _recompute_requested(recompute)):
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # a truncated file from an interrupted run: recompute it
            pass
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
        torch.save(value, f)
    os.replace(f.name, path)
    _WRITTEN.add(path)
    return value


# ------------------------------------------------------------------------ public API


def _flat_systems(H: torch.Tensor, q: torch.Tensor):
    H = _v.square_matrix("H", H)
    q = _v.tensor("q", q, min_ndim=1)
    if q.shape[-1] != H.shape[-1]:
        raise ValueError(f"q has last dimension {q.shape[-1]} but H is {H.shape[-2]}x{H.shape[-1]}")
    if H.shape[-1] == 0:
        raise ValueError(f"H must have D >= 1, got shape {tuple(H.shape)}")
    _v.has_values("H", H, "the mpmath ground truth")
    _v.has_values("q", q, "the mpmath ground truth")
    # mp Cholesky reads one triangle only: a non-symmetric H was silently another system
    if not torch.equal(H, H.mT):
        raise ValueError("H must be symmetric (exactly, as stored)")
    batch = _v.batch_shape("H and q", H.shape[:-2], q.shape[:-1])
    D = H.shape[-1]
    Hf = H.expand(*batch, D, D).reshape(-1, D, D)
    qf = q.expand(*batch, D).reshape(-1, D)
    return batch, D, Hf, qf


def _mp_rows(t: torch.Tensor):
    return [[mpmath.mpf(v) for v in row] for row in t.detach().to("cpu", torch.float64).tolist()]


def _mp_vec(t: torch.Tensor):
    return [mpmath.mpf(v) for v in t.detach().to("cpu", torch.float64).tolist()]


def _solve_one(Hi: torch.Tensor, qi: torch.Tensor, dps: int) -> dict:
    with amp.precision(dps):
        A, b = amp.to_mp(Hi), amp.to_mp(qi)
        spd = True
        try:
            x = amp.solve_spd(A, b)
        except (ValueError, ZeroDivisionError):
            spd = False  # rounding made the stored matrix indefinite: still solve it exactly
            try:
                x = mpmath.lu_solve(A, b)
            except ZeroDivisionError:
                x = mpmath.matrix([mpmath.nan] * Hi.shape[-1])
        values = [x[i] for i in range(Hi.shape[-1])]
        hp = HighPrecision.from_mp(values, (Hi.shape[-1],))
        # mp eigenvalues, each then rounded once to float64: relative (not ||H||-relative)
        # accuracy 2^-53, which the bounds evaluated at lam_min need at large kappa.
        eig = sorted(float(v) for v in mpmath.eigsy(A, eigvals_only=True)) if Hi.shape[-1] else []
    return {
        "hi": hp.hi,
        "lo": hp.lo,
        "eig": torch.tensor(eig, dtype=torch.float64),
        "spd": torch.tensor(spd),
    }


def exact_solution(
    H: torch.Tensor, q: torch.Tensor, *, dps: int = amp.DPS, recompute: bool = False
) -> ExactSolution:
    """The exact (``dps``-digit Cholesky) solution of each stored system ``H x = q``.

    H: ``(..., D, D)`` symmetric, q: ``(..., D)``, any working dtype; batch dims broadcast.
    """
    if _v.count("dps", dps) < amp.DPS:  # a str or None failed deep, inf in mpmath
        raise ValueError(f"dps must be >= {amp.DPS} for ground truth, got {dps}")
    batch, D, Hf, qf = _flat_systems(H, q)
    parts = [
        _cached(
            "exact",
            _key("exact", Hi, qi, D, dps),
            lambda Hi=Hi, qi=qi: _solve_one(Hi, qi, dps),
            recompute,
        )
        for Hi, qi in zip(Hf, qf)
    ]
    stack = lambda k, shape: (  # noqa: E731
        torch.stack([p[k] for p in parts]).reshape(shape)
        if parts
        else torch.zeros(shape, dtype=torch.float64)
    )
    x = HighPrecision(stack("hi", (*batch, D)), stack("lo", (*batch, D)))
    spd = (
        torch.stack([p["spd"] for p in parts]).reshape(batch)
        if parts
        else torch.zeros(batch, dtype=torch.bool)
    )
    return ExactSolution(x=x, eigenvalues=stack("eig", (*batch, D)), spd=spd)


def _replay_one(method, Hi, qi, xi_star, iters, consts, dps) -> dict:
    D = qi.shape[-1]
    with amp.precision(dps):
        H = _mp_rows(Hi)
        q = _mp_vec(qi)
        its = _REPLAYS[method](H, q, iters, consts)
        x_star = [
            mpmath.mpf(h) + mpmath.mpf(l) for h, l in zip(xi_star.hi.tolist(), xi_star.lo.tolist())
        ]
        # x* itself only to ~32 digits (double-double): truncation below ~1e-30 reads as ~1e-31.
        nx = mpmath.sqrt(_dot(x_star, x_star))
        xHx = _dot(x_star, _matvec(H, x_star))  # <= 0 only if rounding made H indefinite
        trunc, trunc_H = [], []
        for x in its:
            e = [a - b for a, b in zip(x, x_star)]
            trunc.append(float(mpmath.sqrt(_dot(e, e)) / nx) if nx else 0.0)
            eHe = _dot(e, _matvec(H, e))
            trunc_H.append(float(mpmath.sqrt(eHe / xHx)) if xHx > 0 and eHe >= 0 else float("nan"))
        hp = HighPrecision.from_mp([v for x in its for v in x], (iters + 1, D))
    return {
        "hi": hp.hi,
        "lo": hp.lo,
        "trunc": torch.tensor(trunc, dtype=torch.float64),
        "trunc_H": torch.tensor(trunc_H, dtype=torch.float64),
    }


def replay(
    method: str,
    H: torch.Tensor,
    q: torch.Tensor,
    *,
    iters: int,
    L=None,
    mu=None,
    bf16_mode: str = "storage",
    constants: str = "working",
    dps: int = amp.DPS,
    recompute: bool = False,
) -> Replay:
    """Every iterate x_0 .. x_iters of ``method`` run on the stored ``H, q`` in mpmath.

    constants: ``"working"`` -- the constants the working solver of ``H``'s dtype and
    ``bf16_mode`` used (so that working minus replay is arithmetic rounding only);
    ``"exact"`` -- computed in mpmath from the float64 ``L, mu``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if constants not in ("working", "exact"):
        raise ValueError(f"constants must be 'working' or 'exact', got {constants!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be an int >= 0, got {iters!r}")
    if NEEDS_BOUNDS[method] and (L is None or mu is None):
        raise TypeError(f"{method} needs L and mu")
    batch, D, Hf, qf = _flat_systems(H, q)
    if NEEDS_BOUNDS[method]:
        _v.spectrum_bounds(_v.parameter("L", L, batch, "cpu"), _v.parameter("mu", mu, batch, "cpu"))
    n = Hf.shape[0]
    exact = exact_solution(H, q, dps=dps, recompute=recompute)
    xs = HighPrecision(exact.x.hi.reshape(-1, D), exact.x.lo.reshape(-1, D))
    if NEEDS_BOUNDS[method]:
        Lb = torch.broadcast_to(torch.as_tensor(L, dtype=torch.float64), batch).reshape(-1)
        mb = torch.broadcast_to(torch.as_tensor(mu, dtype=torch.float64), batch).reshape(-1)
    else:
        Lb = mb = torch.zeros(n, dtype=torch.float64)
    if constants == "working":
        work = working_constants(method, Lb, mb, Arith(H.dtype, bf16_mode))
        per_system = [{k: mpmath.mpf(float(v[s])) for k, v in work.items()} for s in range(n)]
    else:
        with amp.precision(dps):
            per_system = [exact_constants(method, float(Lb[s]), float(mb[s])) for s in range(n)]
    parts = []
    for s in range(n):
        c = per_system[s]
        key_consts = (constants, float(Lb[s]), float(mb[s]), tuple(str(v) for v in c.values()))
        key = _key("replay", method, Hf[s], qf[s], D, iters, key_consts, dps)
        compute = lambda s=s, c=c: _replay_one(method, Hf[s], qf[s], xs[s], iters, c, dps)  # noqa: E731
        parts.append(_cached("replay", key, compute, recompute))

    def stack(k, tail):
        if not parts:
            return torch.zeros((iters + 1, *batch, *tail), dtype=torch.float64)
        return torch.stack([p[k] for p in parts], dim=1).reshape(iters + 1, *batch, *tail)

    its = HighPrecision(stack("hi", (D,)), stack("lo", (D,)))
    names = per_system[0].keys() if per_system else ()
    consts = {
        k: torch.tensor([float(c[k]) for c in per_system], dtype=torch.float64).reshape(batch)
        for k in names
    }
    return Replay(method, its, stack("trunc", ()), stack("trunc_H", ()), consts)


@dataclass
class ErrorSplit:
    """One working-precision run measured against mpmath, at every iterate i = 0..iters.

    All errors are relative to ``||x*||_2`` and shaped ``(iters + 1, *batch)``:
    forward = ||x_hat_i - x*||, truncation = ||x_mp_i - x*||, rounding = ||x_hat_i - x_mp_i||
    (so forward <= truncation + rounding). backward: normwise backward error of x_hat_i
    (``analysis.references.metrics.backward_error``).
    """

    method: str
    precision: str
    iterates: torch.Tensor
    exact: ExactSolution
    replay: Replay
    forward: torch.Tensor
    truncation: torch.Tensor
    rounding: torch.Tensor
    backward: torch.Tensor

    @property
    def kappa(self) -> torch.Tensor:
        return self.exact.kappa


def error_split(
    method: str,
    H: torch.Tensor,
    q: torch.Tensor,
    *,
    iters: int,
    L=None,
    mu=None,
    bf16_mode: str = "storage",
    iterates: Optional[torch.Tensor] = None,
    constants: str = "working",
    dps: int = amp.DPS,
    recompute: bool = False,
) -> ErrorSplit:
    """Run ``solvers.<method>`` (or take its ``iterates``, e.g. from a kernel) and split its error.

    iterates: ``(iters + 1, *batch, D)`` as ``SolveInfo.iterates``; when omitted the reference
    solver runs with ``return_info=True``.
    """
    _method(method)  # was a KeyError
    if iterates is not None:
        # a list failed deep in torch; (D,) or (iters + 1, D) against a batch broadcast silently
        batch, D, _, _ = _flat_systems(H, q)
        _v.floating("iterates", iterates, finite_values=False)  # a diverged run is measured
        want = (_v.count("iters", iters) + 1, *batch, D)
        if tuple(iterates.shape) != want:
            raise ValueError(
                f"iterates must be (iters + 1, *batch, D) = {want}, got {tuple(iterates.shape)}"
            )
    if iterates is None:
        kw = {"L": L, "mu": mu} if NEEDS_BOUNDS[method] else {}
        _, info = SOLVERS[method](H, q, iters=iters, bf16_mode=bf16_mode, return_info=True, **kw)
        iterates = info.iterates
    rep = replay(
        method,
        H,
        q,
        iters=iters,
        L=L,
        mu=mu,
        bf16_mode=bf16_mode,
        constants=constants,
        dps=dps,
        recompute=recompute,
    )
    exact = exact_solution(H, q, dps=dps)
    nx = exact.x.norm()
    forward = exact.x.distance(iterates) / nx
    rounding = rep.iterates.distance(iterates) / nx
    backward = backward_error(H, q, iterates)
    return ErrorSplit(
        method,
        Arith(H.dtype, bf16_mode).label,
        iterates,
        exact,
        rep,
        forward,
        rep.truncation,
        rounding,
        backward,
    )
