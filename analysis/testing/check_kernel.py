"""``svt check-kernel MODULE:FN --like REFERENCE``: one command that holds your kernel to a
reference of the toolkit, through the kernel harness, and writes a JSON report.

What it does:

* ``--like`` names the reference the kernel should match (``solvers.chebyshev``,
  ``solvers.cg``, ``chebyshev_backward``, ``kla_chunkwise``...: the references listed below);
  the harness strategy that draws its cases and bounds its outputs follows from it;
* the kernel runs on float32 and on bfloat16 inputs (``--precision`` picks one) under every
  precision contract listed below (``--model`` declares yours instead); each (input
  dtype, contract) pair is one run of the harness (``analysis.testing.harness.check``) with its
  verdict and worst error/bound ratio;
* without ``--model`` an input dtype PASSES when some contract holds (the first that does,
  tightest first, is reported as the kernel's tightest contract met); it is INCONCLUSIVE when
  none holds but some contract's bounds were vacuous, and FAILS when every contract fails.
  With ``--model`` every declared contract must hold. The overall verdict is the worst over
  the input dtypes, and the exit status is the harness's: 0 PASS, 1 FAIL, 2 usage or import
  error, 3 INCONCLUSIVE;
* without a CUDA device, ``TRITON_INTERPRET=1`` is set before the kernel's module is imported,
  so a Triton kernel runs through Triton's interpreter on the CPU;
* the JSON report (``--out``) holds every run, the settings that rebuild its cases, the
  kernel's source file with its SHA-256, and the provenance of the run
  (``analysis.provenance``). ``svt diff OLD.json NEW.json`` (:mod:`analysis.testing.kernel_diff`)
  compares two of them.

``MODULE`` is imported as ``python -m`` would (the current directory first); ``path/to/file.py:FN``
loads a file directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import pathlib
import sys
import time
from dataclasses import dataclass
from typing import Optional

from ..argtypes import (
    HelpFormatter,
    OneLineParser,
    condition_number,
    interpret_without_gpu,
    plain,
    positive_int,
)
from ..argtypes import device as device_arg

FORMAT = "svt-check-kernel/1"
PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}  # as analysis.testing.harness.EXIT_CODES
USAGE_ERROR = 2
VERDICT_RANK = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2}  # worse verdicts rank higher
PRECISIONS = ("float32", "bfloat16")
# tightest first: the first contract that holds is the tightest the kernel is known to meet
CONTRACTS = (
    "float32",
    "tf32x3",
    "tf32",
    "bfloat16/operands",
    "bfloat16/storage",
    "bfloat16/strict",
)
DEFAULT_EXAMPLES = 20
DEFAULT_OUT = "check-kernel.json"
DEFAULT_SEED = 0
DEFAULT_MAX_D, DEFAULT_MAX_BATCH = 16, 4


@dataclass(frozen=True)
class Like:
    """A reference a kernel can be checked against: the harness strategy that draws its
    cases, where the reference lives (``module:function``; ``harness:``, ``gradients:`` and
    ``gka_gradients:`` mean the harness modules), the call signature the kernel must have and
    the contracts the strategy bounds."""

    strategy: str
    reference: str
    signature: str
    contracts: tuple = None  # None: every preset of CONTRACTS


LIKE = {
    "chebyshev": Like(
        "spd", "solvers:chebyshev", "f(H, q, *, L, mu, iters) -> x (GKA Algorithm 1)"
    ),
    "gd": Like("spd", "solvers:gd", "f(H, q, *, L, mu, iters) -> x"),
    "agd": Like("spd", "solvers:agd", "f(H, q, *, L, mu, iters) -> x"),
    "cg": Like("spd_nobounds", "solvers:cg", "f(H, q, *, iters) -> x"),
    "chebyshev_backward": Like(
        "spd_backward",
        "solvers:chebyshev_backward",
        "f(H, q, grad_x, *, L, mu, iters, method) -> (dq, dH)",
    ),
    "gka_ridge": Like(
        "gka_ridge",
        "harness:gka_ridge_reference",
        "f(H, q, *, a, iters) -> x solving (H + a ||H||_F I) x = q (GKA eq. (4))",
    ),
    "kla_chunkwise": Like(
        "kla", "solvers:kla_chunkwise", "f(q, k, v, *, alpha, eta, eps, chunk_size) -> (o, S_T)"
    ),
    "kla_backward": Like(
        "kla_backward",
        "gradients:reference_gradients",
        "f(q, k, v, g, beta, h0, do, dht, *, mode, eps, chunk_size, cu_seqlens, gate_dtype) -> "
        "(dq, dk, dv, dg, dbeta, dh0)",
    ),
    "koopman_readout": Like(
        "koopman",
        "analysis.testing.koopman_strategy:koopman_reference",
        "f(G, M, Cv, zq, *, scale, K, eta, gamma) -> y (Echo eq. (13), statistics as inputs)",
        # its bound (analysis.bounds.koopman, a proof under stated hypotheses) is vacuous in
        # bf16 arithmetic
        contracts=("float32", "tf32x3", "tf32"),
    ),
    "gka_layer_backward": Like(
        "gka_layer_backward",
        "gka_gradients:gka_implicit_reference",
        "f(q, k, v, g, beta, dy, *, a, iters, chunk_size, gated) -> (dq, dk, dv, dg, dbeta)",
        contracts=("float32", "bfloat16/operands"),
    ),
}
SPD_STRATEGIES = ("spd", "spd_nobounds", "spd_backward")
# the strategies whose methods' i-th iterate does not depend on the iteration count
TRAJECTORY_STRATEGIES = ("spd", "gka_ridge")


class UsageError(ValueError):
    """A bad argument: ``(argument, message)``, exit status 2."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"argument {argument}: {message}")


# ---------------------------------------------------------------------------------------
# what to check
# ---------------------------------------------------------------------------------------


def like_name(text: str) -> str:
    """``solvers.chebyshev``, ``solvers:chebyshev``, ``kernels.chebyshev`` or ``chebyshev``
    -> the key of :data:`LIKE`; UsageError naming ``--like`` otherwise."""
    prefix, _, name = text.replace(":", ".").rpartition(".")
    if name not in LIKE or prefix not in ("", "solvers", "kernels"):
        raise UsageError(
            "--like",
            f"unknown reference {text!r}; expected one of {', '.join(LIKE)} "
            "(optionally as solvers.NAME)",
        )
    return name


def harness():
    """The kernel harness module, and with it the gradient strategies registered into it."""
    from . import (
        gka_gradient_harness,  # noqa: F401  (registers "gka_layer_backward")
        gradient_harness,  # noqa: F401  (registers "kla_backward")
    )
    from . import harness as h

    return h


def reference_of(like: Like):
    h = harness()
    mod, _, fn = like.reference.partition(":")
    if mod == "harness":
        return getattr(h, fn)
    if mod == "gradients":
        from . import gradient_harness

        return getattr(gradient_harness, fn)
    if mod == "gka_gradients":
        from . import gka_gradient_harness

        return getattr(gka_gradient_harness, fn)
    return h.load(like.reference)


def load_kernel(spec: str):
    """``module:function`` (imported with the current directory first on the path) or
    ``path/to/file.py:function``; UsageError naming ``KERNEL``."""
    mod, sep, attr = spec.rpartition(":") if ".py:" in spec else spec.partition(":")
    if not sep or not mod or not attr:
        raise UsageError("KERNEL", f"expected MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if mod.endswith(".py"):
        path = pathlib.Path(mod).expanduser().resolve()
        if not path.is_file():
            raise UsageError("KERNEL", f"no such file {mod!r} (from {spec!r})")
        name = f"_svt_checked_{path.stem}"
        spec_ = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec_)
        sys.modules[name] = module
        try:
            spec_.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's file, reported in one line
            del sys.modules[name]
            raise UsageError("KERNEL", f"cannot import {mod!r}: {type(e).__name__}: {e}") from None
        internal, mod = name, f"{name}:{attr}"
    else:
        internal = None
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as python -m: the current directory's modules first
        mod = f"{mod}:{attr}"
    try:
        return harness().load(mod)
    except ValueError as e:  # the harness's UsageError names what is wrong
        message = str(e)
        if internal:  # the file the user named, not the module name it was loaded under
            message = message.replace(f"module {internal!r}", f"file {path.name!r}")
            message = message.replace(repr(mod), repr(spec)).replace(internal, path.name)
        raise UsageError("KERNEL", message) from None
    except ImportError as e:  # e.g. a Triton kernel where Triton is not installed
        raise UsageError("KERNEL", f"cannot load {spec!r}: {e}") from None


def source_of(fn) -> dict:
    """The file that defines ``fn`` and its SHA-256 (which version of the kernel was checked)."""
    import inspect

    try:
        path = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        path = None
    if not path or not os.path.isfile(path):
        return {"file": None, "sha256": None}
    return {
        "file": str(path),
        "sha256": hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest(),
    }


def contracts_for(models: Optional[list], like: Optional[Like] = None) -> tuple:
    """The declared contracts (validated: UsageError naming ``--model``), else the contracts
    the reference's strategy bounds (:data:`CONTRACTS` unless it names fewer)."""
    allowed = (like.contracts if like else None) or CONTRACTS
    if not models:
        return allowed
    from solvers.contracts import parse

    for m in models:
        try:
            name = parse(m).name
        except (TypeError, ValueError) as e:
            raise UsageError("--model", str(e)) from None
        if like is not None and like.contracts and name not in like.contracts:
            raise UsageError(
                "--model",
                f"the {like.strategy} strategy bounds the contracts {', '.join(like.contracts)}, "
                f"not {m!r}",
            )
    return tuple(dict.fromkeys(models))


def strategy_sizes(name: str, args) -> dict:
    """The size options that apply to strategy ``name``."""
    if name in SPD_STRATEGIES or name == "gka_ridge":
        sizes = {
            "max_d": args.max_d or DEFAULT_MAX_D,
            "max_batch": args.max_batch or DEFAULT_MAX_BATCH,
        }
        if args.pow2:
            sizes["pow2"] = True
        if args.max_kappa is not None and name in SPD_STRATEGIES:
            sizes["max_kappa"] = args.max_kappa
        return sizes
    if name == "kla" and args.kla_form is not None:
        return {"form": args.kla_form}
    return {}


def ignored_sizes(name: str, args) -> None:
    """UsageError naming a size option given for a strategy that draws its own shapes (it was
    silently ignored: ``--max-kappa 5 --like gka_ridge`` still drew kappa up to 51)."""
    sized = name in SPD_STRATEGIES or name == "gka_ridge"
    for option, given, applies in (
        ("--max-d", args.max_d is not None, sized),
        ("--max-batch", args.max_batch is not None, sized),
        ("--pow2", args.pow2, sized),
        ("--max-kappa", args.max_kappa is not None, name in SPD_STRATEGIES),
        ("--kla-form", args.kla_form is not None, name == "kla"),
        ("--trajectory", getattr(args, "trajectory", False), name in TRAJECTORY_STRATEGIES),
    ):
        if given and not applies:
            raise UsageError(option, f"the {name} strategy does not take it")


# ---------------------------------------------------------------------------------------
# running and reporting
# ---------------------------------------------------------------------------------------


def _number(x):
    """A float for JSON: non-finite values as the strings "inf", "-inf", "nan" (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def as_float(x) -> float:
    """Inverse of :func:`_number`; None stays None."""
    return None if x is None else float(x)


def finding_dict(f) -> Optional[dict]:
    if f is None:
        return None
    return {k: _number(v) for k, v in dataclasses.asdict(f).items()}


def run_dict(rep, precision: str, contract: str, seconds: float) -> dict:
    """One harness Report as the JSON report stores it (its history left out)."""
    decisive = rep.failure or rep.worst
    return {
        "precision": precision,
        "contract": contract,
        "verdict": rep.verdict,
        "examples": rep.examples,
        "vacuous_cases": rep.vacuous_cases,
        "worst_ratio": _number(decisive.ratio) if decisive else None,
        "worst": finding_dict(rep.worst),
        "failure": finding_dict(rep.failure),
        "error": rep.error,
        "text": str(rep),
        "seconds": round(seconds, 3),
    }


def precision_verdict(runs: list, declared: bool) -> tuple:
    """``(verdict, tightest contract that holds or None)`` for the runs of one input dtype
    (module docstring: any contract holding suffices unless contracts were declared)."""
    verdicts = [r["verdict"] for r in runs]
    met = next((r["contract"] for r in runs if r["verdict"] == PASS), None)
    if declared or not verdicts:
        return max(verdicts, key=VERDICT_RANK.get, default=INCONCLUSIVE), met
    if met is not None:
        return PASS, met
    return (INCONCLUSIVE if INCONCLUSIVE in verdicts else FAIL), None


def check_kernel(
    kernel,
    like: str,
    *,
    precisions=PRECISIONS,
    models: Optional[list] = None,
    examples: int = DEFAULT_EXAMPLES,
    seed: Optional[int] = DEFAULT_SEED,
    device: Optional[str] = None,
    sizes: Optional[dict] = None,
    prepare=None,
    shrink: bool = True,
    progress=None,
    trajectory: bool = False,
) -> dict:
    """Run the harness for every (input dtype, contract) pair; returns the report dict (without
    provenance, which :func:`main` adds). ``kernel``: a callable; ``like``: a :data:`LIKE` key
    (or ``solvers.NAME``, as ``--like`` takes it); ``precisions``, ``models``: a name or a
    sequence of names; ``trajectory``: the harness's trajectory mode (``harness.check``)."""
    import torch

    h = harness()
    # checked here as on the command line: a misspelt name, one string where a sequence is
    # wanted ("float32" read letter by letter) or a dtype the harness has no strategy for were
    # KeyErrors ('gdd', 'f') or an unknown contract 'f'
    if not isinstance(like, str):
        raise TypeError(f"like must be a reference name such as 'chebyshev', got {like!r}")
    like = like_name(like)
    spec = LIKE[like]
    precisions = (precisions,) if isinstance(precisions, str) else tuple(precisions)
    for p in precisions:
        if p not in h.PRECISIONS:
            raise ValueError(
                f"precisions must name input dtypes among {sorted(h.PRECISIONS)}, got {p!r}"
            )
    if not precisions:
        raise ValueError("precisions is empty: name at least one input dtype")
    models = [models] if isinstance(models, str) else models
    reference = reference_of(spec)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    contracts = contracts_for(models, spec)
    runs, per_precision, names = [], {}, None
    for precision in precisions:
        mine = []
        for contract in contracts:
            strat = h.STRATEGIES[spec.strategy](
                precision=h.PRECISIONS[precision], device=device, **(sizes or {})
            )
            t = time.perf_counter()
            rep = h.check(
                kernel,
                reference,
                strat,
                precision=precision,
                model=contract,
                examples=examples,
                device=device,
                shrink=shrink,
                seed=seed,
                prepare=prepare,
                trajectory=trajectory,
            )
            mine.append(run_dict(rep, precision, contract, time.perf_counter() - t))
            names = (rep.kernel, rep.reference)
            if progress:
                progress(mine[-1])
        verdict, met = precision_verdict(mine, declared=bool(models))
        per_precision[precision] = {"verdict": verdict, "tightest_contract_met": met}
        runs += mine
    overall = max(
        (p["verdict"] for p in per_precision.values()), key=VERDICT_RANK.get, default=INCONCLUSIVE
    )
    kernel_name, reference_name = names or (repr(kernel), like)
    return {
        "format": FORMAT,
        "kernel": kernel_name,
        "like": like,
        "reference": reference_name,
        "strategy": spec.strategy,
        "verdict": overall,
        "exit_code": EXIT_CODES[overall],
        "settings": {
            "precisions": list(precisions),
            "contracts": list(contracts),
            "declared": bool(models),
            "max_examples": examples,
            "seed": seed,
            "device": str(device),
            "sizes": sizes or {},
            "shrink": shrink,
            "trajectory": bool(trajectory),
            "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        },
        "precisions": per_precision,
        "runs": runs,
    }


def _ratio(x) -> str:
    x = as_float(x)
    return "-" if x is None else f"{x:.3g}"


def format_runs(runs: list) -> str:
    """The runs as a table: inputs, contract, verdict, cases, worst ratio, bound/||ref||."""
    head = ("inputs", "contract", "verdict", "cases", "worst ratio", "bound/||ref||", "seconds")
    rows = []
    for r in runs:
        w = r["failure"] or r["worst"]
        rel = "-"
        if (
            w
            and as_float(w["reference_norm"]) not in (None, 0.0)
            and math.isfinite(as_float(w["reference_norm"]))
        ):
            rel = f"{as_float(w['bound']) / as_float(w['reference_norm']):.3g}"
        rows.append(
            (
                r["precision"],
                r["contract"],
                r["verdict"],
                str(r["examples"]),
                _ratio(r["worst_ratio"]),
                rel,
                f"{r['seconds']:.1f}",
            )
        )
    return table(head, rows)


def table(head: tuple, rows: list) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)
    ]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def summary(report: dict) -> str:
    """The table, one line per input dtype, the details of what failed, the verdict."""
    lines = [
        f"{report['kernel']} like {report['reference']} (strategy {report['strategy']}, "
        f"{report['settings']['max_examples']} cases per run, seed {report['settings']['seed']}, "
        f"device {report['settings']['device']}"
        f"{', trajectory mode' if report['settings'].get('trajectory') else ''})",
        "",
        format_runs(report["runs"]),
        "",
    ]
    for precision, p in report["precisions"].items():
        runs = [r for r in report["runs"] if r["precision"] == precision]
        failed = [r["contract"] for r in runs if r["verdict"] == FAIL]
        if p["tightest_contract_met"]:
            line = f"{precision} inputs: {p['verdict']}; tightest contract met: {p['tightest_contract_met']}"
        else:
            line = f"{precision} inputs: {p['verdict']}; no contract met"
        if failed:
            line += f" (fails {', '.join(failed)})"
        lines.append(line)
        if p["verdict"] == FAIL:  # the loosest contract it fails: the strongest evidence
            lines += ["", next(r for r in reversed(runs) if r["verdict"] == FAIL)["text"], ""]
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines)


def write_report(report: dict, path: str) -> None:
    text = json.dumps(report, indent=1, allow_nan=False)
    if path == "-":
        print(text)
    else:
        pathlib.Path(path).write_text(text + "\n")


# ---------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------

EPILOG = (
    "references (--like), their strategy and the call the kernel must accept:\n"
    + "\n".join(
        f"  {name:<19s} {like.strategy:<19s} {like.signature}" for name, like in LIKE.items()
    )
    + f"""

contracts tried without --model, tightest first: {", ".join(CONTRACTS)}
(gka_layer_backward: float32 and bfloat16/operands, the contracts its bound covers)

examples:
  svt check-kernel my_kernels:chebyshev --like solvers.chebyshev
  svt check-kernel ./fast_cg.py:cg --like solvers.cg --precision bfloat16 --model bfloat16/operands
  svt diff old.json new.json

exit status: 0 PASS, 1 FAIL, 2 usage or import error, 3 INCONCLUSIVE (no failure, but a bound
was vacuous: no evidence either way)"""
)


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``check-kernel`` on an argparse subparsers object."""
    p = sub.add_parser(
        "check-kernel",
        help="hold your kernel to a reference of the toolkit under its precision "
        "contract; writes a JSON report",
        description=plain(__doc__),
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "kernel",
        metavar="KERNEL",
        help="the kernel under test: MODULE:FUNCTION or FILE.py:FUNCTION",
    )
    p.add_argument(
        "--like",
        required=True,
        metavar="REFERENCE",
        help=f"the reference it should match: {', '.join(LIKE)} (also as solvers.NAME)",
    )
    p.add_argument(
        "--precision",
        action="append",
        choices=PRECISIONS,
        help="input dtype (repeatable; default: both float32 and bfloat16)",
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="CONTRACT",
        help="the contract the kernel declares (repeatable): a preset (float32, tf32, tf32x3, "
        "bfloat16/operands, bfloat16/storage, bfloat16/strict) with optional ';key=value' changes; "
        "default: try every preset and report the tightest met",
    )
    p.add_argument(
        "--max-examples",
        "--examples",
        dest="examples",
        type=positive_int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help="cases per run (hypothesis max_examples)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="draw cases from this seed: every run, every contract and every version of the kernel "
        "checked with the same seed sees the same cases, so that svt diff compares like with like",
    )
    p.add_argument(
        "--out",
        "-o",
        default=DEFAULT_OUT,
        metavar="FILE",
        help="the JSON report ('-': standard output)",
    )
    p.add_argument(
        "--max-d",
        type=positive_int,
        default=None,  # None: not given (refused for the strategies that do not take it)
        metavar="D",
        help=f"largest system size D (SPD and ridge strategies; default: {DEFAULT_MAX_D})",
    )
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"largest batch of systems (SPD and ridge strategies; default: {DEFAULT_MAX_BATCH})",
    )
    p.add_argument(
        "--max-kappa",
        type=condition_number,
        default=None,
        metavar="K",
        help="largest condition number (SPD strategies; default: the strategy's, 100)",
    )
    p.add_argument(
        "--pow2", action="store_true", help="draw power-of-two D only (kernels that do not pad)"
    )
    p.add_argument(
        "--kla-form",
        choices=("chunkwise", "tokenwise", "either"),
        default=None,
        help="with --like kla: the form your kernel computes, whose bound it is held to "
        "(default: chunkwise; tokenwise for a recurrent kernel; either when unknown)",
    )
    p.add_argument(
        "--prepare",
        default=None,
        metavar="MODULE:FUNCTION",
        help="fair-pairing hook run on the inputs of both callables "
        "(e.g. analysis.testing.harness:kla_prepare)",
    )
    p.add_argument(
        "--device",
        type=device_arg,
        default=None,
        help="where to run (default: cuda if available, else cpu)",
    )
    p.add_argument(
        "--no-shrink", action="store_true", help="report the first failing case as drawn (faster)"
    )
    p.add_argument(
        "--trajectory",
        action="store_true",
        help="Chebyshev, GD, AGD and gka_ridge: also run the kernel for every smaller iteration "
        "count, bound its stores at its own iterates and check every step (deterministic kernels)",
    )
    return p


def _writable(path: str) -> None:
    if path == "-":
        return
    if not path.strip():  # pathlib reads '' as '.', reported as "a directory"
        raise UsageError("--out", f"expected a file name, got {path!r}")
    p = pathlib.Path(path)
    if p.is_dir():
        raise UsageError("--out", f"{path!r} is a directory; give a file name")
    if not p.parent.is_dir() or not os.access(p.parent, os.W_OK):
        raise UsageError(
            "--out", f"cannot write {path!r}: its folder does not exist or is not writable"
        )
    # os.access can say yes where the write fails (root on a read-only or virtual file system,
    # /proc): open it now, before the checks run, rather than a traceback at the end
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as e:
        raise UsageError(
            "--out", f"cannot write {path!r}: {e.strerror or type(e).__name__}"
        ) from None
    if not existed:
        p.unlink(missing_ok=True)


def run(args, prog: str = "svt check-kernel") -> int:
    """``svt check-kernel`` with parsed ``args``; prints the summary, writes the report."""
    try:
        like = like_name(args.like)
        ignored_sizes(LIKE[like].strategy, args)
        contracts_for(args.model, LIKE[like])
        _writable(args.out)
        warning = interpret_without_gpu(args.device)
        kernel = load_kernel(args.kernel)
        prepare = None
        if args.prepare:
            try:
                prepare = harness().prepare_hook(harness().load(args.prepare))
            except (ValueError, TypeError) as e:
                raise UsageError("--prepare", str(e)) from None
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    if warning:
        print(warning, file=sys.stderr)

    def progress(r):
        print(
            f"  [{r['precision']} / {r['contract']}] {r['verdict']} ({r['examples']} cases, "
            f"worst ratio {_ratio(r['worst_ratio'])}, {r['seconds']:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    precisions = tuple(dict.fromkeys(args.precision or PRECISIONS))
    report = check_kernel(
        kernel,
        like,
        precisions=precisions,
        models=args.model,
        examples=args.examples,
        seed=args.seed,
        device=args.device,
        sizes=strategy_sizes(LIKE[like].strategy, args),
        prepare=prepare,
        shrink=not args.no_shrink,
        progress=progress,
        trajectory=args.trajectory,
    )
    import platform

    from ..provenance import provenance

    report["kernel_spec"] = args.kernel
    report["kernel_source"] = source_of(kernel)
    on_gpu = report["settings"]["device"].startswith("cuda")
    report["provenance"] = provenance(
        None if on_gpu else f"CPU ({platform.machine() or 'unknown'})"
    )
    write_report(report, args.out)
    print(summary(report), file=sys.stderr if args.out == "-" else sys.stdout)
    if args.out != "-":
        print(f"report: {args.out}")
    return report["exit_code"]


PROG = "python -m analysis.testing.check_kernel"


def main(argv: Optional[list] = None) -> int:
    """``python -m analysis.testing.check_kernel``: the same command as ``svt check-kernel``
    (without it the module ran nothing and exited 0, whatever its arguments)."""

    class _One:  # add_parser's subparsers object, giving a stand-alone one-line-error parser
        def add_parser(self, name, help=None, **kw):
            return OneLineParser(prog=PROG, **kw)

    args = add_parser(_One()).parse_args(argv)
    return run(args, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "CONTRACTS",
    "LIKE",
    "Like",
    "add_parser",
    "check_kernel",
    "like_name",
    "load_kernel",
    "main",
    "precision_verdict",
    "run",
    "summary",
]
