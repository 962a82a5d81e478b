"""The survey behind the rounding allowance's constant c (docs/precision.md, "The rounding allowance").

For every solver x precision, over SPD systems with kappa from 1 to 1e4 (three spectrum
shapes, several D and seeds) and GKA ridge systems, at every iterate, this measures

    ratio_i = rounding_i / (kappa (n u_acc + u_store)),    rounding_i = ||x_hat_i - x_mp_i|| / ||x*||

with kappa from ``analysis.precision.allowance_kappa`` (the method's L/mu widened to the
stored spectrum; the stored matrix's own for CG), n = D. c must exceed the worst ratio, wherever the
allowance applies (``analysis.precision.allowance_applies``). CG is measured differently:
finite-precision CG loses orthogonality and lags the mp replay, so its per-iterate
rounding is not small once the replay has converged; its ratio is that of the *final*
forward error ``||x_hat_r - x*|| / ||x*||`` after ``4 D`` iterations (its attainable accuracy).

Run: ``python -m analysis allowance [--quick] [--out DIR]`` or, the same command line,
``python -m analysis.studies.allowance [--quick] [--out DIR]`` (prints the table and writes
``DIR/allowance.md``, ``reports/`` by default). Ground truth is cached, so a rerun takes seconds.
"""

from __future__ import annotations

import math
import numbers
import pathlib
import sys
from dataclasses import dataclass
from typing import Iterable

import torch

from analysis.argtypes import (
    HelpFormatter,
    OneLineParser,
    add_run_options,
    plain,
    settle_run_options,
)
from analysis.precision import ALLOWANCE_C, PRECISIONS, allowance_applies, allowance_kappa
from analysis.references import iterative as gt
from analysis.testing.strategies.ridge import ridge_system
from analysis.testing.strategies.spd import SPECTRUM_KINDS, spd_system
from solvers import validation as _v


@dataclass
class SurveyProblem:
    name: str
    H: torch.Tensor
    q: torch.Tensor
    L: float
    mu: float


def survey_problems(quick: bool) -> list:
    dims = (8,) if quick else (8, 12, 16)
    kappas = (
        (1.0, 10.0, 100.0, 1e3, 1e4)
        if quick
        else (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1e3, 3e3, 1e4)
    )
    seeds = (0,) if quick else (0, 1)
    out = []
    for D in dims:
        for kappa in kappas:
            for kind in SPECTRUM_KINDS:
                for seed in seeds:
                    S = spd_system(D, kappa, kind, seed=seed)
                    out.append(
                        SurveyProblem(f"{kind}-D{D}-k{kappa:g}-s{seed}", S.H, S.q, S.L, S.mu)
                    )
    for D in (8,) if quick else (8, 16, 32):
        for a in (0.01, 0.02, 0.1):
            R = ridge_system(D, a, T=64, seed=D)
            out.append(
                SurveyProblem(
                    f"ridge-D{D}-a{a:g}", R.ridge.A, R.q, float(R.ridge.L), float(R.ridge.mu)
                )
            )
    return out


def survey_iters(method: str, kappa: float, D: int) -> int:
    """Enough iterations to converge to below every working precision (or a cost cap)."""
    # an unknown method got Chebyshev's count, a D < 1 a negative one for CG, a kappa < 1
    # (or NaN, inf) "math domain error" or a ZeroDivisionError
    if not isinstance(method, str) or method not in gt.METHODS:
        raise ValueError(f"method must be one of {gt.METHODS}, got {method!r}")
    D = _v.count("D", D, minimum=1)
    if isinstance(kappa, bool) or not isinstance(kappa, numbers.Real):
        raise TypeError(f"kappa must be a float, got {type(kappa).__name__}")
    if not 1.0 <= kappa < math.inf:
        raise ValueError(f"kappa must be a finite float >= 1, got {kappa}")
    ra = (math.sqrt(kappa) - 1.0) / (math.sqrt(kappa) + 1.0)
    if method == "cg":
        return 4 * D
    if method == "gd":
        rate = (kappa - 1.0) / (kappa + 1.0)
        return 1 if rate == 0 else min(2000, math.ceil(math.log(1e-17) / math.log(rate)))
    if method == "agd":
        return (
            1
            if ra == 0
            else min(1200, math.ceil(2 * math.log(1e-17) / math.log(1 - 1 / math.sqrt(kappa))))
        )
    return 1 if ra == 0 else min(600, math.ceil(math.log(1e-17) / math.log(ra)))


@dataclass
class SurveyResult:
    method: str
    precision: str
    worst_ratio: (
        float  # over the cases where the allowance applies (c kappa (n u_acc + u_store) < 1);
        # 0 when there is none or every one measured a rounding of exactly 0; NaN if one was NaN
    )
    worst_problem: str  # "" when worst_ratio is 0 (no case, or no case with a positive ratio)
    worst_iterate: int  # -1 when worst_problem is ""
    cases: int
    skipped: (
        int  # allowance does not apply: stored matrix not SPD, or c kappa (n u_acc + u_store) >= 1
    )
    beyond_ratio: (
        float  # over the SPD cases with c kappa (...) >= 1 but kappa (n u_acc + u_store) < 1
    )
    beyond_cases: int


def _worse(ratio: float, worst: float) -> bool:
    """``ratio`` replaces ``worst``: larger, or NaN (a non-finite run) where ``worst`` is not."""
    return not math.isnan(worst) and (math.isnan(ratio) or ratio > worst)


def survey(quick: bool = False, methods: Iterable[str] = gt.METHODS, progress=None) -> list:
    # checked before any work: methods="cg" was read as "c", "g", and an unknown method or a
    # progress that is not callable failed after the first exact solutions
    if isinstance(methods, str):
        raise TypeError(f"methods must be an iterable of method names, not the str {methods!r}")
    methods = tuple(methods)
    bad = [m for m in methods if not isinstance(m, str) or m not in gt.METHODS]
    if bad:
        raise ValueError(f"methods must be among {gt.METHODS}, got {bad}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {type(progress).__name__}")
    problems = survey_problems(quick)
    results = []
    for method in methods:
        for arith in PRECISIONS:
            worst, where, at, cases, skipped, beyond, n_beyond = 0.0, "", -1, 0, 0, 0.0, 0
            for P in problems:
                if progress:
                    progress(f"allowance {method} {arith.label} {P.name}")
                H, q = P.H.to(arith.dtype), P.q.to(arith.dtype)
                exact = gt.exact_solution(H, q)
                bounds = {} if method == "cg" else {"L": P.L, "mu": P.mu}
                kappa, D = float(allowance_kappa(exact.eigenvalues, **bounds)), H.shape[-1]
                unit = kappa * (D * arith.u_acc + arith.u_store)
                applies = bool(exact.spd) and allowance_applies(kappa, D, arith)
                if not applies:
                    skipped += 1
                    if not (bool(exact.spd) and unit < 1.0):
                        continue
                iters = survey_iters(method, P.L / P.mu, D)
                split = gt.error_split(
                    method, H, q, iters=iters, L=P.L, mu=P.mu, bf16_mode=arith.mode
                )
                measured = split.forward[-1:] if method == "cg" else split.rounding
                ratios = measured / unit
                i = int(torch.argmax(ratios))  # a NaN, if any, is the maximum
                ratio = float(ratios[i])
                if not applies:
                    n_beyond += 1
                    beyond = ratio if _worse(ratio, beyond) else beyond
                    continue
                cases += 1
                if _worse(ratio, worst):
                    worst, where = ratio, P.name
                    at = iters if method == "cg" else i
            results.append(
                SurveyResult(
                    method, arith.label, worst, where, at, cases, skipped, beyond, n_beyond
                )
            )
    return results


def _worst_cells(r: SurveyResult) -> tuple:
    """(worst ratio, margin, problem, iterate) as table cells: with no case to name, a dash and
    why rather than a placeholder (a 0 ratio, an infinite margin, iterate -1)."""
    if r.cases == 0:
        return "-", "-", "none: the allowance applies to no case", "-"
    if not r.worst_problem:  # every case measured, every rounding exactly 0
        return "0", "-", f"none: rounding exactly 0 in all {r.cases} cases", "-"
    margin = ALLOWANCE_C / r.worst_ratio  # NaN for a NaN ratio
    return f"{r.worst_ratio:.3g}", f"{margin:.3g}", r.worst_problem, str(r.worst_iterate)


def as_markdown(results: list) -> str:
    lines = [
        f"Worst rounding / (kappa (n u_acc + u_store)) per solver and precision (c = {ALLOWANCE_C:g}).",
        "'beyond': SPD cases outside the guarantee (c kappa (n u_acc + u_store) >= 1) but with",
        "kappa (n u_acc + u_store) < 1.",
        "",
        "| solver | precision | worst ratio | margin c/ratio | problem | iterate | cases | no guarantee "
        "| worst ratio beyond | cases beyond |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        worst, margin, problem, iterate = _worst_cells(r)
        lines.append(
            f"| {r.method} | {r.precision} | {worst} | {margin} | {problem} | "
            f"{iterate} | {r.cases} | {r.skipped} | {r.beyond_ratio:.3g} | {r.beyond_cases} |"
        )
    return "\n".join(lines) + "\n"


def write_table(quick: bool, out: pathlib.Path, progress=None) -> tuple:
    """Run the survey and write its table to ``out/allowance.md``: (the table, the path)."""
    path = pathlib.Path(out) / "allowance.md"
    # was found only at the write, after the whole survey ("" would mean the current folder)
    if (isinstance(out, str) and not out.strip()) or not path.parent.is_dir():
        raise ValueError(f"out must be an existing folder, got {str(out)!r}")
    md = as_markdown(survey(quick=quick, progress=progress))
    path.write_text(md)
    return md, path


def main(argv=None) -> int:
    """``python -m analysis.studies.allowance``: the command line of ``python -m analysis
    allowance`` (``--quick``/``--full``, ``--recompute``, ``--out DIR``)."""
    parser = OneLineParser(
        prog="python -m analysis.studies.allowance",
        description=plain(__doc__),
        formatter_class=HelpFormatter,
    )
    add_run_options(parser)
    args = parser.parse_args(argv)
    settle_run_options(parser, args)
    md, path = write_table(
        args.quick, args.out, progress=lambda m: print(m, file=sys.stderr, flush=True)
    )
    print(f"allowance -> {path}", file=sys.stderr)
    print(md)
    return 0


__all__ = [
    "SurveyResult",
    "as_markdown",
    "main",
    "survey",
    "survey_iters",
    "survey_problems",
    "write_table",
]


if __name__ == "__main__":
    raise SystemExit(main())
