"""How far two float64 runs of the same CG recurrence are apart, iterate by iterate, and why
(docs/precision.md, "CG").

``python -m analysis.studies.cg_agreement [--quick] [--seeds 4]`` runs ``solvers.cg`` and
``scipy.sparse.linalg.cg`` (the same Hestenes-Stiefel recurrence; they differ only in the
summation order of the dot products and matrix-vector products) from x_0 = 0 for 4D steps on
``spd_system(D, kappa, "geometric", seed)``, replays CG in mpmath
(``analysis.references.iterative.replay``) and prints, in units of the rounding allowance
``A = c kappa (D u + u)`` (``analysis.precision.rounding_allowance``), relative to ``||x*||``:

* ``|ours - scipy| / 2A``: the largest before step D, at step D, and at step 4D;
* ``|ours - mp| / A``: the largest before step D and at step D;
* ``|ours - x*| / A`` at step D, where exact CG has terminated (the mp replay is ~1e-33 there);
* the largest ``forward_k / (sqrt(kappa) 2 R_a^k + A)`` over both runs and all k (CG's
  per-iterate check, ``analysis.bounds.checks.cg_forward_ratio``);
* ``max |x_4D - x*| / A`` over both runs: the attainable accuracy the allowance is held to.

Needs scipy (an optional dependency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

import solvers
from analysis.argtypes import HelpFormatter, OneLineParser, plain, positive_int
from analysis.precision import rounding_allowance
from analysis.references.iterative import exact_solution, replay
from analysis.testing.strategies.spd import spd_system
from solvers import Arith
from solvers import validation as _v

FULL = [(D, kappa) for D in (8, 16) for kappa in (10.0, 50.0, 1000.0)]
QUICK = [(8, 50.0)]


@dataclass
class Agreement:
    """One system's measurements, each in units of the allowance (see the module docstring)."""

    D: int
    kappa: float
    seed: int
    ours_scipy_before_D: float
    ours_scipy_at_D: float
    ours_scipy_at_4D: float
    ours_mp_before_D: float
    ours_mp_at_D: float
    ours_exact_at_D: float
    forward_ratio: float
    exact_at_4D: float


def scipy_iterates(H: torch.Tensor, q: torch.Tensor, iters: int) -> torch.Tensor:
    """``scipy.sparse.linalg.cg``'s iterates x_0 = 0 .. x_iters (``rtol = atol = 0``: every step runs)."""
    from scipy.sparse.linalg import cg as scipy_cg

    # iters = -1 returned x_0 alone; a batch, a list, bf16 or a grad-tracking tensor failed
    # deep in scipy or numpy, a NaN ran to NaN iterates
    iters = _v.count("iters", iters)
    H = _v.square_matrix("H", H)
    q = _v.rhs("q", q, "H", H)
    if H.ndim != 2 or q.ndim != 1:
        raise ValueError(
            f"H must be one D x D matrix and q one vector, got {tuple(H.shape)}, {tuple(q.shape)}"
        )
    if H.dtype == torch.bfloat16:
        raise TypeError("H has dtype torch.bfloat16; scipy takes float64 or float32")
    seen = [np.zeros(q.shape[-1])]
    scipy_cg(
        H.detach().cpu().numpy(),
        q.detach().cpu().numpy(),
        rtol=0.0,
        atol=0.0,
        maxiter=iters,
        callback=lambda xk: seen.append(xk.copy()),
    )
    return torch.from_numpy(np.stack(seen))


def measure(D: int, kappa: float, seed: int) -> Agreement:
    S = spd_system(D, kappa, "geometric", seed=seed)
    iters = 4 * D
    _, info = solvers.cg(S.H, S.q, iters=iters, return_info=True)
    ours, theirs = info.iterates, scipy_iterates(S.H, S.q, iters)
    exact = exact_solution(S.H, S.q)
    mp = replay("cg", S.H, S.q, iters=iters).iterates
    size = float(exact.x.norm())
    kap = float(exact.kappa)
    A = rounding_allowance(kap, D, Arith(torch.float64))
    ra = (math.sqrt(kap) - 1.0) / (math.sqrt(kap) + 1.0)
    bound = math.sqrt(kap) * 2.0 * ra ** torch.arange(iters + 1, dtype=torch.float64) + A
    apart = (ours - theirs).norm(dim=-1) / (2 * A * size)
    off_mp = mp.distance(ours) / (A * size)
    fwd = torch.stack([exact.x.distance(ours), exact.x.distance(theirs)]) / size
    return Agreement(
        D,
        kap,
        seed,
        float(apart[:D].max()),
        float(apart[D]),
        float(apart[-1]),
        float(off_mp[:D].max()),
        float(off_mp[D]),
        float(fwd[0, D] / A),
        float((fwd / bound).max()),
        float(fwd[:, -1].max() / A),
    )


HEADER = (
    "| D | kappa | seed | max k<D: ours-scipy / 2A | k=D | k=4D | max k<D: ours-mp / A | k=D "
    "| ours-x* at k=D / A | max fwd / (sqrt(kappa) 2R^k + A) | max x_4D-x* / A |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def as_row(a: Agreement) -> str:
    cells = [
        a.ours_scipy_before_D,
        a.ours_scipy_at_D,
        a.ours_scipy_at_4D,
        a.ours_mp_before_D,
        a.ours_mp_at_D,
        a.ours_exact_at_D,
        a.forward_ratio,
        a.exact_at_4D,
    ]
    return f"| {a.D} | {a.kappa:.4g} | {a.seed} | " + " | ".join(f"{c:.3g}" for c in cells) + " |"


def main(argv=None) -> int:
    parser = OneLineParser(
        prog="python -m analysis.studies.cg_agreement",
        description=plain(__doc__),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="D = 8, kappa = 50 only")
    parser.add_argument("--seeds", type=positive_int, default=4, help="seeds per (D, kappa)")
    args = parser.parse_args(argv)
    try:
        import scipy.sparse.linalg  # noqa: F401
    except ImportError:
        parser.error("needs scipy (pip install scipy)")
    print(HEADER)
    for D, kappa in QUICK if args.quick else FULL:
        for seed in range(args.seeds):
            print(as_row(measure(D, kappa, seed)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
