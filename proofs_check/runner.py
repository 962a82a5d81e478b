"""Run the claim catalogue: ``python -m proofs_check`` and the functions behind it.

For each (claim, precision) the runner lets hypothesis search the claim's strategy for a case
whose :class:`~proofs_check.claim.Measurement` exceeds its bound, trying the claim's stored
``examples`` first. No violation: observed verdict ``holds`` (with the worst value/bound seen).
A violation: ``fails``, with the shrunk counterexample. The process exits non-zero exactly
when some observed verdict differs from the recorded one (``Claim.expected``).

Public API (also used by ``python -m analysis claims``):

* :func:`run` -> ``list[Result]``;
* :func:`table_rows` -> one dict per result (claim, source, precision, cases, worst, bound,
  verdict, matches);
* :func:`format_table` -> the printed table;
* :func:`main` ``(argv, *, prog) -> int``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Iterable, Mapping, Optional

from analysis.argtypes import HelpFormatter, OneLineParser, non_negative_int, positive_int

from . import registry
from .claim import (
    ALL_PRECISIONS,
    CORRECTED,
    ERROR,
    EXTENSION,
    FAILS,
    HOLDS,
    NO_INPUT,
    PENDING,
    PRINTED,
    Result,
)
from .contract_route import INCONCLUSIVE
from .search import DEFAULT_EXAMPLES, check_seed
from .search import run_claim as _search_claim


def claim_precision(claim, precision) -> str:
    """The precision label ``precision`` names for ``claim``: one of ``claim.precisions``, or a
    precision contract (a :class:`solvers.contracts.Contract` or a contract name) equal to the
    preset of one of them. ``ValueError`` otherwise: a claim has no check outside its precisions
    (its check would run in some other precision, or in none, and report that run's verdict)."""
    if isinstance(precision, str) and precision in claim.precisions:
        return precision
    contract = None
    try:
        from solvers.contracts import PRESETS, parse

        contract = parse(precision)
    except (TypeError, ValueError):
        pass
    else:
        if contract.name in claim.precisions and PRESETS.get(contract.name) == contract:
            return contract.name
    other = contract is not None and contract.name not in ALL_PRECISIONS
    what = f"contract {contract.name!r}" if other else f"precision {precision!r}"
    hint = (
        " (a claim runs in its own precisions, the toolkit references' arithmetic; to hold a "
        "kernel to another contract use analysis.testing.harness)"
        if other
        else ""
    )
    raise ValueError(f"{claim.id} runs in {', '.join(claim.precisions)}, not in {what}{hint}")


def run_claim(claim, precision, **kwargs) -> Result:
    """Search one claim in one precision (:func:`proofs_check.search.run_claim`, same keyword
    arguments: ``examples``, ``deterministic``, ``impl``, ``shrink``, ``record``, ``seed``).
    ``precision``: one of ``claim.precisions``, or a precision contract equal to one of them
    (:func:`claim_precision`; ``ValueError`` otherwise)."""
    return _search_claim(claim, claim_precision(claim, precision), **kwargs)


def run(
    paper: Optional[str] = None,
    claims: Optional[Iterable[str]] = None,
    *,
    examples: int = DEFAULT_EXAMPLES,
    precisions: Optional[Iterable[str]] = None,
    deterministic: bool = True,
    shrink: bool = True,
    progress=None,
    jobs: int = 1,
    cache: bool = True,
    impl: Optional[Mapping] = None,
    seed: Optional[int] = None,
) -> list:
    """Run the selected claims; one :class:`Result` per (claim, precision), in catalogue order.

    ``precisions``: restrict to these labels (each claim runs in those it supports); by
    default every precision the claim lists. ``progress(result)`` is called after each run.
    ``jobs``: worker processes (:mod:`proofs_check.parallel`). ``cache``: replay recorded
    deterministic searches where they reproduce (:mod:`proofs_check.replay`); the verdicts are
    those of a fresh search either way. ``impl``: an implementation under test, merged over each
    claim's own mapping (:func:`proofs_check.implementations.merged`: it replaces only the
    functions it provides), searched afresh in this process and held to the precision's
    contract (a vacuous bound makes the run ``inconclusive``). ``seed``: draw the cases from this
    seed (other cases than the default deterministic search, the same on every run).
    """
    check_seed(seed)
    if examples < 1:
        raise ValueError(f"examples must be a positive integer, got {examples}")
    wanted = None if precisions is None else list(precisions)
    if wanted is not None:
        bad = [p for p in wanted if p not in ALL_PRECISIONS]
        if bad:
            raise ValueError(f"unknown precision(s) {bad}; expected some of {list(ALL_PRECISIONS)}")
    return _run_pairs(
        [
            (claim, p)
            for claim in registry.all_claims(paper, claims)
            for p in claim.precisions
            if wanted is None or p in wanted
        ],
        examples=examples,
        deterministic=deterministic,
        shrink=shrink,
        progress=progress,
        jobs=jobs,
        cache=cache,
        impl=impl,
        seed=seed,
    )


def _run_pairs(
    pairs: list, *, examples, deterministic, shrink, progress, jobs, cache, impl, seed=None
) -> list:
    """:func:`run` on the ``(claim, precision)`` pairs it selected (:func:`main` selects its own)."""
    if impl is not None:  # an implementation under test: searched afresh, in this process
        from .claim import Pending
        from .implementations import merged

        calls, counted = _counting(impl)
        results = []
        for claim, p in pairs:
            try:
                mapping = merged(claim, counted)
            except Pending as exc:
                results.append(Result(claim, p, 0, None, PENDING, message=str(exc)))
            else:
                if calls is not None:
                    calls[0] = 0
                result = run_claim(
                    claim,
                    p,
                    examples=examples,
                    deterministic=deterministic,
                    shrink=shrink,
                    impl=mapping,
                    seed=seed,
                )
                if calls is not None and calls[0] == 0 and result.verdict == HOLDS:
                    # the check ran the toolkit's functions (or mpmath references) alone: its
                    # "holds" says nothing about the implementation under test
                    result.extra["verdict_on_toolkit"] = result.verdict
                    result.verdict = NOT_EXERCISED
                    result.message = (
                        f"no case called {', '.join(sorted(map(str, impl)))} in this precision "
                        f"(the check ran the toolkit's functions only): no verdict on your "
                        f"implementation"
                    )
                results.append(result)
            if progress is not None:
                progress(results[-1])
        return results
    from .parallel import run_pairs

    return run_pairs(
        pairs,
        examples=examples,
        deterministic=deterministic,
        shrink=shrink,
        jobs=jobs,
        cache=cache,
        progress=progress,
        seed=seed,
    )


NOT_EXERCISED = "not exercised"  # --impl: no case of the run called the implementation under test


def _counting(impl: Mapping) -> tuple:
    """``(calls, counted)``: ``impl`` with each function wrapped to add its calls to
    ``calls[0]``; ``calls`` is None (nothing counted) when some entry is a class or not a
    function, whose use by a check cannot be seen."""
    import functools
    import inspect

    if any(inspect.isclass(f) or not callable(f) for f in impl.values()):
        return None, dict(impl)
    calls = [0]

    def counted(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            calls[0] += 1
            return f(*args, **kwargs)

        return wrapper

    return calls, {k: counted(f) for k, f in impl.items()}


def is_not_exercised(result: Result) -> bool:
    """A run on an implementation under test in which no case called any of its functions."""
    return result.verdict == NOT_EXERCISED


def is_inconclusive(result: Result) -> bool:
    """A run on an implementation under test that found no failure but had a vacuous bound on some
    case, where the record says ``holds``: no verdict either way, not a changed verdict."""
    return result.verdict == INCONCLUSIVE and result.expected == HOLDS


def differs(result: Result) -> bool:
    """The observed verdict is a different verdict from the recorded one (inconclusive and not
    exercised are none)."""
    return not result.matches and not is_inconclusive(result) and not is_not_exercised(result)


def exit_status(results: list) -> int:
    """0 every verdict matches the record, 1 some verdict differs from it, 3 none differs but some
    run is inconclusive (2, a usage error, is :func:`main`'s)."""
    if any(differs(r) for r in results):
        return 1
    return 3 if any(is_inconclusive(r) for r in results) else 0


def verdict_text(result: Result, results: Iterable[Result] = ()) -> str:
    """``holds`` / ``holds, loose by X`` / ``fails as printed, corrected form holds`` / ``fails``."""
    c, v = result.claim, result.verdict
    if v == HOLDS:
        if c.loose is not None and result.worst is not None and result.worst.ratio > 0:
            return f"holds, loose by {1.0 / result.worst.ratio:.3g}x"
        return "holds (corrected form)" if c.form == CORRECTED else HOLDS
    if v == FAILS:
        if c.form == PRINTED and c.twin is not None:
            from .errata import severity_of

            severity = severity_of(c.id)
            label = f"fails as printed ({severity})" if severity else "fails as printed"
            twin = [r for r in results if r.claim.id == c.twin and r.precision == result.precision]
            if twin and twin[0].verdict == HOLDS:
                return label + ", corrected form holds"
            return label
        if c.form == EXTENSION:
            return "fails (does not extend)"
        return FAILS
    return v


def table_rows(results: list) -> list:
    """One plain dict per result, for machine-readable reports."""
    rows = []
    for r in results:
        w = r.worst
        rows.append(
            {
                "claim": r.claim.id,
                "paper": r.claim.paper,
                "source": r.claim.source,
                "form": r.claim.form,
                "precision": r.precision,
                "cases": r.tried,
                "worst": None if w is None else w.value,
                "bound": None if w is None else w.bound,
                "verdict": r.verdict,
                "verdict_text": verdict_text(r, results),
                "expected": r.expected,
                "matches": r.matches,
                "counterexample": r.counterexample,
                "message": r.message,
                "seconds": round(r.seconds, 3),
            }
        )
    return rows


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.3g}"


TABLE_HEAD = ("claim", "source", "precision", "cases", "worst", "bound", "verdict")


def _row_text(r: Result, results: list) -> str:
    text = verdict_text(r, results)
    if r.matches:
        return text
    if is_inconclusive(r):
        return f"{text} (recorded: {r.expected})"
    if is_not_exercised(r):
        return f"{text}: your functions were not called"
    return f"MISMATCH: {text} (recorded: {r.expected})"


def _wide_rows(results: list) -> list:
    """One line per run, every column in full (``--wide``; the table saved beside a report)."""
    body = [
        (
            r.claim.id,
            r.claim.source,
            r.precision,
            str(r.tried),
            _fmt(r.worst and r.worst.value),
            _fmt(r.worst and r.worst.bound),
            _row_text(r, results),
        )
        for r in results
    ]
    widths = [
        max(len(h), *(len(row[i]) for row in body)) if body else len(h)
        for i, h in enumerate(TABLE_HEAD)
    ]
    lines = [
        "  ".join(h.ljust(widths[i]) for i, h in enumerate(TABLE_HEAD)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    return lines + ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]


def _wrapped_rows(results: list, width: int) -> list:
    """The table within ``width`` columns: a line per claim (id and source, wrapped), then a line
    per precision it ran in, the verdict wrapped under its own column."""
    import textwrap

    prec_w = max([len("precision")] + [len(r.precision) for r in results]) + 2
    cols = ((prec_w, "  precision"), (5, "cases"), (8, "worst"), (8, "bound"))
    indent = sum(w for w, _ in cols) + 2 * len(cols)
    if width - indent < 24:  # too narrow for a verdict column: the verdict goes under its row
        indent = 4
    verdict_w = width - indent
    head = "  ".join(h.ljust(w) for w, h in cols) + ("  verdict" if indent > 4 else "")
    lines = (
        ["claim  (source)", head.rstrip()] + ([] if indent > 4 else ["    verdict"]) + ["-" * width]
    )
    last = None
    for r in results:
        if r.claim.id != last:
            last = r.claim.id
            lines += textwrap.wrap(
                f"{r.claim.id}  ({r.claim.source})",
                width,
                subsequent_indent="    ",
                break_on_hyphens=False,
            ) or [r.claim.id]
        cells = (
            "  " + r.precision,
            str(r.tried),
            _fmt(r.worst and r.worst.value),
            _fmt(r.worst and r.worst.bound),
        )
        left = "  ".join(c.ljust(w) for c, (w, _) in zip(cells, cols))
        text = textwrap.wrap(_row_text(r, results), verdict_w, break_on_hyphens=False) or [""]
        if indent == 4:
            lines.append(left.rstrip())
            lines += ["    " + t for t in text]
        else:
            lines.append(f"{left}  {text[0]}".rstrip())
            lines += [" " * indent + t for t in text[1:]]
    return lines


def _failures(results: list, show_counterexamples: bool, width: Optional[int]) -> list:
    """For every failing run: the case it failed on, its fields named (``Claim.describe``), and
    the measured value against its bound; then runs that errored or differ from the record."""
    import textwrap

    def wrap(text: str, indent: str) -> list:
        if width is None:
            return [indent + text]
        return textwrap.wrap(
            text,
            width,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_on_hyphens=False,
        ) or [indent]

    out, vague, idle = [], [], []
    for r in results:
        if is_inconclusive(r):
            vague += wrap(f"{r.claim.id} [{r.precision}] {r.verdict}: {r.message}", "")
            continue
        if is_not_exercised(r):
            idle += wrap(f"{r.claim.id} [{r.precision}]: {r.message}", "")
            continue
        if r.verdict == FAILS and show_counterexamples:
            out += wrap(
                f"{r.claim.id} [{r.precision}] counterexample: {r.counterexample or NO_INPUT}", ""
            )
            if r.worst is not None:
                detail = f" ({r.worst.detail})" if r.worst.detail else ""
                out += wrap(
                    f"measured {r.worst.value:.6g} > bound {r.worst.bound:.6g}{detail}", "    "
                )
        shown = r.verdict == FAILS and show_counterexamples  # its measurement is printed above
        if r.verdict in (ERROR, PENDING) or (not r.matches and r.message and not shown):
            out += wrap(f"{r.claim.id} [{r.precision}] {r.verdict}: {r.message}", "")
    if out:
        out = ["", "counterexamples (measured value against its bound):"] + out
    if vague:
        out += ["", "inconclusive (no case failed, but some case's bound was vacuous):"] + vague
    if idle:
        out += ["", "not exercised (no verdict on your implementation):"] + idle
    return out


def format_table(
    results: list, *, show_counterexamples: bool = True, width: Optional[int] = None
) -> str:
    """The claim table: every run in full, one line each (``width=None``, as saved in reports), or
    wrapped within ``width`` columns (the terminal's: :func:`main`); then each failing run's
    counterexample with its fields named and its measured value against the bound, and the
    count of runs that differ from the record."""
    lines = _wide_rows(results) if width is None else _wrapped_rows(results, width)
    extra = _failures(results, show_counterexamples, width)
    mism = sum(differs(r) for r in results)
    vague = sum(is_inconclusive(r) for r in results)
    idle = sum(is_not_exercised(r) for r in results)
    summary = f"{len(results)} runs of {len({r.claim.id for r in results})} claims; {mism} differ from the record"
    if vague:
        summary += f", {vague} inconclusive"
    if idle:
        summary += f", {idle} did not call your functions"
    if {c.id for c in registry.all_claims()} <= {r.claim.id for r in results}:
        from .docs import headline

        summary += f"\nerrata: {headline()}"
    return "\n".join(lines + extra + ["", summary])


def table_width(wide: bool, width: Optional[int] = None) -> Optional[int]:
    """The width to wrap the table to: ``width`` if given; None (no wrapping) with ``wide`` or
    when the output is not a terminal (a file, a pipe, a log: full lines stay greppable); else
    the terminal's width."""
    import shutil

    if width is not None:
        return width
    if wide or not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


DESCRIPTION = """\
Check the papers' claims (docs/claims.md) and compare each verdict with the record.

Each claim runs in each precision it lists: hypothesis searches its strategy for a case whose
measured value exceeds its bound, trying the claim's stored examples first. The table gives,
per claim and precision, the cases tried, the worst value and its bound, and the verdict
(holds / fails as printed, with the severity of the erratum, and whether the corrected form
holds). Every failing run's counterexample follows, its fields named, with the measured value
against the bound. Deterministic searches are replayed from the user cache directory where
they reproduce (the verdicts are those of a fresh search either way)."""

EPILOG = """\
examples:
  %(prog)s                          the whole catalogue
  %(prog)s --paper gka --jobs 2     one paper's claims, two worker processes
  %(prog)s --claim gka.alg2 --wide  claims whose id starts with gka.alg2, one line per run
  %(prog)s --claim gka.alg1 --impl mymod:IMPL
                                          GKA's Algorithm 1 claims on your implementation

--impl MODULE:NAME: NAME is a mapping of names to functions (or a zero-argument function
returning one), e.g. IMPL = {"chebyshev": my_chebyshev} in mymod.py. It is merged over each
claim's own mapping: your functions replace the toolkit's of the same name (same arguments),
the rest, the exact mpmath references (names ending in _mp) included, stays. Only the selected
claims whose mapping has one of your names run, held to each precision's contract bound where
one exists (a bound at least the size of what the output approximates is vacuous); a run with a
vacuous bound on some case is "inconclusive", and one in which no case called your functions is
"not exercised" (no verdict, not a change). A name no selected claim calls, or an empty mapping,
is a usage error. The names each paper's claims take (docs/claims.md,
"Testing your implementation", lists the claims of each):
{names}

exit status: 0 every verdict matches the record, 1 some verdict differs from it, 2 usage error,
3 no verdict differs but some run is inconclusive (--impl)"""


def _parser(prog: str) -> argparse.ArgumentParser:
    from .implementations import help_lines

    # %-formatting of the epilog is argparse's (%(prog)s): the names go in by replace
    epilog = EPILOG.replace("{names}", "\n".join(help_lines()))
    p = OneLineParser(
        prog=prog, description=DESCRIPTION, epilog=epilog, formatter_class=HelpFormatter
    )
    p.add_argument(
        "--paper",
        choices=sorted(["gka", "kla", "echo", "gates"]),
        help="only this paper's claims (default: every paper)",
    )
    p.add_argument(
        "--claim",
        action="append",
        metavar="ID",
        help="claim id or id prefix (repeatable), e.g. gka.lemma3 or gka.alg2 (default: every claim)",
    )
    p.add_argument(
        "--examples",
        type=positive_int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help="hypothesis examples per claim and precision",
    )
    p.add_argument(
        "--precision",
        action="append",
        choices=list(ALL_PRECISIONS),
        help="only these precisions (repeatable; default: each claim's own list)",
    )
    p.add_argument(
        "--random",
        action="store_true",
        help="random search instead of the deterministic one (default: deterministic, replayable)",
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        metavar="N",
        help="draw the cases from seed N: other cases than the default search, the same on every run",
    )
    p.add_argument(
        "--no-shrink", action="store_true", help="report counterexamples unshrunk (faster)"
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the selected claims (id, source, precisions) and exit",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="worker processes (default: the number of cores)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="search every claim afresh instead of replaying recorded searches (in the user cache directory)",
    )
    p.add_argument(
        "--write-docs",
        action="store_true",
        help="run every claim and regenerate docs/claims.md, docs/errata.md (index and metadata) and "
        "proofs_check/measured.json from the catalogue",
    )
    p.add_argument(
        "--timings",
        nargs="?",
        const=15,
        type=positive_int,
        metavar="N",
        help="after the table, list the N slowest claim x precision runs (N: 15 if omitted)",
    )
    p.add_argument(
        "--impl",
        metavar="MODULE:NAME",
        help="implementation under test: a mapping of names to functions (or a function returning "
        "one), merged over each claim's own (see below); runs the selected claims that take one "
        "of its names",
    )
    layout = p.add_mutually_exclusive_group()
    layout.add_argument(
        "--wide",
        action="store_true",
        help="one line per run, every column in full, however wide (the default when the output "
        "is not a terminal)",
    )
    layout.add_argument(
        "--width",
        type=positive_int,
        metavar="N",
        help="wrap the table to N columns (default: the terminal's width)",
    )
    return p


def format_timings(results: list, n: int) -> str:
    """The ``n`` slowest runs, and the total time the searches took."""
    slow = sorted(results, key=lambda r: -r.seconds)[:n]
    lines = [
        f"slowest {len(slow)} of {len(results)} runs (sum of all runs {sum(r.seconds for r in results):.1f} s):"
    ]
    lines += [
        f"  {r.seconds:6.2f} s  {r.claim.id} [{r.precision}] ({r.tried} cases"
        f"{', replayed' if r.extra.get('replayed') else ''})"
        for r in slow
    ]
    return "\n".join(lines)


def _load_impl(spec: str) -> Mapping:
    """``module:name`` -> the mapping it names (or that the zero-argument function returns)."""
    import importlib

    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"expected module:name, got {spec!r}")
    try:
        obj = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r}: {exc}") from None
    if callable(obj) and not isinstance(obj, Mapping):
        import inspect

        try:
            inspect.signature(obj).bind()
        except TypeError:
            # a solver itself (say solvers:chebyshev) was a traceback from calling it bare
            raise ValueError(
                f"{spec!r} is a function that takes arguments; expected a mapping of names to "
                f"functions (e.g. IMPL = {{'chebyshev': my_chebyshev}}) or a function of no "
                f"arguments returning one"
            ) from None
        except ValueError:  # no signature to read (a builtin): call it as before
            pass
        obj = obj()
    if not isinstance(obj, Mapping):
        raise ValueError(f"{spec!r} is not a mapping of names to functions")
    return obj


def _empty_selection(args, selected: list) -> Optional[str]:
    """The usage error for options that together select no run (None when some run is left)."""
    picked = [f"--paper {args.paper}"] if args.paper else []
    picked += [f"--claim {c}" for c in args.claim or ()]
    if not selected:
        homes = sorted({c.paper for c in registry.all_claims(None, args.claim)})
        return (
            f"{' and '.join(picked)} select no claim (the --claim ids are "
            f"{', '.join(homes)} claims)"
        )
    if args.precision and not any(p in args.precision for c in selected for p in c.precisions):
        runs_in = "; ".join(f"{c.id} runs in {', '.join(c.precisions)}" for c in selected[:3])
        more = f"; and {len(selected) - 3} more claims" if len(selected) > 3 else ""
        options = picked + [f"--precision {p}" for p in args.precision]
        return f"{' and '.join(options)} select no run ({runs_in}{more})"
    return None


def main(argv: Optional[list] = None, *, prog: str = "python -m proofs_check") -> int:
    """The command line; ``prog`` names it in ``--help`` (``python -m analysis claims`` passes its own)."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    try:
        selected = registry.all_claims(args.paper, args.claim)
    except ValueError as exc:
        parser.error(f"--claim: {exc}")
    if args.write_docs and (
        args.paper
        or args.claim
        or args.precision
        or args.random
        or args.seed is not None
        or args.list
        or args.impl
    ):
        parser.error(
            "--write-docs runs the whole catalogue deterministically: drop --paper, --claim, --precision, "
            "--random, --seed, --list and --impl"
        )
    if args.random and args.seed is not None:
        parser.error("--random and --seed exclude each other (a seeded search is already random)")
    empty = _empty_selection(args, selected)
    if empty:
        parser.error(empty)
    if args.precision:
        selected = [c for c in selected if any(p in args.precision for p in c.precisions)]
    impl = None
    if args.impl:
        from .implementations import select

        try:
            impl = _load_impl(args.impl)
            selected = select(impl, selected, repr(args.impl))
        except ValueError as exc:
            print(f"{prog}: error: argument --impl: {exc}", file=sys.stderr)
            return 2
    if args.list:
        for c in selected:
            print(f"{c.id:48s} {c.source:40s} {','.join(c.precisions)}")
        return 0

    def progress(r: Result) -> None:
        flag = (
            "  <-- inconclusive"
            if is_inconclusive(r)
            else "  <-- your functions not called"
            if is_not_exercised(r)
            else "  <-- differs from the record"
        )
        print(
            f"  {r.claim.id} [{r.precision}] {r.verdict} ({r.tried} cases, {r.seconds:.1f}s)"
            f"{'' if r.matches else flag}",
            file=sys.stderr,
            flush=True,
        )

    results = _run_pairs(
        [
            (c, p)
            for c in selected
            for p in c.precisions
            if not args.precision or p in args.precision
        ],
        examples=args.examples,
        deterministic=not args.random,
        shrink=not args.no_shrink,
        progress=progress,
        jobs=args.jobs,
        cache=not args.no_cache,
        impl=impl,
        seed=args.seed,
    )
    print(format_table(results, width=table_width(args.wide, args.width)))
    if args.write_docs:
        from . import docs

        for path in docs.write(results, args.examples):
            print(f"wrote {path}", file=sys.stderr)
    if args.timings:
        print("\n" + format_timings(results, args.timings))
    return exit_status(results)
