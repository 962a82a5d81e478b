"""``python -m analysis``: the main job -- verification table, figures, claims, report.

Subcommands (``python -m analysis --help``):

* ``verify``  -- the verification table: every family in ``analysis.verification.FAMILIES``,
  printed and saved as CSV, JSON and markdown under ``<out>/verification/``;
* ``report`` (the default) -- ``verify``, then every figure in ``analysis.figures.FIGURES``,
  then every claim (``proofs_check.runner.run``, when ``proofs_check`` is installed), and
  ``<out>/report.md``: the summary per solver and precision first, each figure with the
  paper's printed values next to ours (its ``_paper.md`` table) and links to its files, the
  claims table;
* ``claims`` -- the claim catalogue (``proofs_check.runner.main``); its arguments, ``--help``
  included, pass through;
* ``allowance`` -- the survey behind the rounding allowance's constant (``analysis.studies.allowance``);
* ``check-kernel`` -- hold a kernel of yours to a reference of the toolkit through the kernel
  harness, every contract that applies, with a JSON report (``analysis.testing.check_kernel``);
* ``diff`` -- what changed between two check-kernel reports (``analysis.testing.kernel_diff``);
* one subcommand per figure module, named by its ``NAME``.

Common flags, before or after the command: ``--quick`` (small problems; the default without a
GPU), ``--full``, ``--recompute`` (ignore cached ground truth and figure data), ``--out DIR``
(default ``reports``). One given on both sides with different values, an empty ``--out``, or one
the command does not take (``claims`` takes ``--out`` only, ``check-kernel`` and ``diff`` have
their own) is a usage error (:func:`merge_levels`).
Progress goes to stderr as one line per step.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import io
import json
import math
import os
import pathlib
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Optional

from . import verification
from .argtypes import OneLineParser, add_run_options, settle_run_options
from .figures import FIGURES
from .verification import topline
from .verification.row import VerificationRow, nanmax, within

DEFAULT_OUT = pathlib.Path("reports")
DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"  # the checkout's docs/, if any


# -------------------------------------------------------------------------- progress


class Progress:
    """One stderr line per step: ``[elapsed] message``; overwritten in place on a terminal."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.inplace = self.stream.isatty()

    def __call__(self, message: str) -> None:
        line = f"[{time.perf_counter() - self.start:6.1f}s] {message}"
        if self.inplace:
            self.stream.write("\r\x1b[2K" + line[:150])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self, message: str) -> None:
        if self.inplace:
            self.stream.write("\r\x1b[2K")
        self(message)
        if self.inplace:
            self.stream.write("\n")


# ---------------------------------------------------------------------- verification


def _conclusive(bound: float, row: VerificationRow) -> bool:
    """A bound says something only where it is finite and below the size of the result it bounds
    errors of (1 for relative errors): a bound as large as that is no check. NaN: no bound."""
    size = row.reference_size
    return math.isfinite(bound) and bound < size if math.isfinite(size) else False


def _allowance_applies(row: VerificationRow) -> bool:
    return _conclusive(row.rounding_bound, row)


def _has_running_bound(row: VerificationRow) -> bool:
    return math.isfinite(row.running_bound)  # a NaN ratio against it then fails


def verdict(row: VerificationRow) -> str:
    """``holds`` / ``holds (running bound)`` / ``FAILS (...)`` / ``no guarantee`` /
    ``inconclusive (truncation bound vacuous; rounding holds[ by running bound])``.

    The a-priori allowance says nothing once it is >= the result's size (relative error 1 = no
    accuracy; analysis.precision.allowance_applies). The running bound (analysis.bounds.running)
    is a rigorous bound of the run itself, so it is checked whenever the row has one, and it is a
    guarantee where it is below that size. "no guarantee" where neither rounding bound says
    anything. A truncation bound as large as the result's size (or infinite) checks nothing
    either: such a row is inconclusive, never held, even where its rounding holds. A NaN or
    infinite result or rounding is a failure (a NaN comparison is False, never a pass).
    """
    if math.isnan(row.forward_error):
        return "FAILS (non-finite result)"
    if not within(row.truncation, row.truncation_bound):
        return "FAILS (truncation)"
    if _allowance_applies(row) and not within(row.rounding, row.rounding_bound):
        return "FAILS (rounding)"
    if _has_running_bound(row) and not within(row.running_ratio, 1.0):
        return "FAILS (running bound)"
    if not (math.isfinite(row.forward_error) and math.isfinite(row.rounding)):
        return "FAILS (non-finite result)"
    if _allowance_applies(row):
        rounding = "holds"
    elif _has_running_bound(row) and _conclusive(row.running_bound, row):
        rounding = "holds (running bound)"
    else:
        return "no guarantee"
    if not math.isnan(row.truncation_bound) and not _conclusive(row.truncation_bound, row):
        how = "" if rounding == "holds" else " by running bound"
        return f"inconclusive (truncation bound vacuous; rounding holds{how})"
    return rounding


def rounding_ratio(row: VerificationRow) -> float:
    """rounding / the tighter applicable bound: the allowance where it is < 1, the running bound
    where the row has one (the smaller if both); the allowance where neither applies."""
    applicable = [
        b
        for b, ok in (
            (row.rounding_bound, _allowance_applies(row)),
            (row.running_bound, _has_running_bound(row)),
        )
        if ok
    ]
    bound = min(applicable) if applicable else row.rounding_bound
    return row.rounding / bound if bound > 0 else float("nan")


def truncation_ratio(row: VerificationRow) -> float:
    """truncation / its bound (the tightness of the truncation check); NaN without a bound."""
    b = row.truncation_bound
    if math.isnan(b) or b <= 0:
        return 0.0 if b == 0 and row.truncation == 0 else float("nan")
    return row.truncation / b


def collect_rows(quick: bool, progress: Progress) -> tuple:
    rows, failures = [], []
    for name in verification.FAMILIES:
        progress(f"verify: family {name}")
        t = time.perf_counter()
        try:
            module = importlib.import_module(f"{verification.__name__}.{name}")
            got = module.rows(quick)
        except Exception as exc:  # one broken family must not hide the others
            failures.append((name, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            progress(f"verify: family {name} FAILED: {exc}")
            continue
        rows.extend(got)
        progress(f"verify: family {name}: {len(got)} rows in {time.perf_counter() - t:.1f}s")
    return rows, failures


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf"
        return f"{v:.2e}"
    return "" if v is None else str(v)


COLUMNS = (
    "solver",
    "precision",
    "problem",
    "n",
    "kappa",
    "iters",
    "forward_error",
    "backward_error",
    "truncation",
    "truncation_bound",
    "truncation_ratio",
    "rounding",
    "rounding_bound",
    "running_bound",
    "running_ratio",
    "rounding_ratio",
    "verdict",
)
HEADS = {
    "rounding_ratio": "rounding/bound",
    "truncation_ratio": "truncation/bound",
    "running_ratio": "running ratio",
}


def table_rows(rows: list) -> list:
    out = []
    for r in rows:
        d = {k: getattr(r, k) for k in COLUMNS if hasattr(r, k)}
        d["rounding_ratio"] = rounding_ratio(r)
        d["truncation_ratio"] = truncation_ratio(r)
        d["verdict"] = verdict(r)
        out.append(d)
    return out


def format_table(rows: list, markdown: bool = False) -> str:
    data = [[_fmt(d[c]) for c in COLUMNS] for d in table_rows(rows)]
    heads = [HEADS.get(c, c.replace("_error", "").replace("_bound", " bound")) for c in COLUMNS]
    if markdown:
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(r) + " |" for r in data]
        return "\n".join(lines) + "\n"
    widths = [
        max(len(h), *(len(r[i]) for r in data)) if data else len(h) for i, h in enumerate(heads)
    ]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return (
        "\n".join(
            [fmt.format(*heads), fmt.format(*("-" * w for w in widths))]
            + [fmt.format(*r) for r in data]
        )
        + "\n"
    )


VERIFY_LEGEND = """\
forward = ||x - x*||/||x*|| (x* exact, >= 50 digits, of the stored inputs); backward =
||q - A x||/(||A||_2 ||x|| + ||q||); truncation = mp replay vs x* at the iterate where
truncation/bound is worst (CG: H-norm); rounding = working vs mp replay, max over iterates
(CG: final forward error); rounding bound = c kappa (n u_acc + u_store), c = {c:g}
(docs/precision.md); running bound = the run's own a-posteriori bound on its rounding, max
over iterates (Chebyshev/GD/AGD; docs/precision.md "Running error bounds"), held at every
iterate and step; running ratio = the running check's worst ratio (<= 1 holds);
truncation/bound and rounding/bound = measured over bound (rounding: the tighter applicable
bound), how tight each check is; "holds (running bound)": the allowance is >= 1 but the running
bound is < 1 and holds; "no guarantee": neither rounding bound is < 1; "inconclusive (truncation
bound vacuous; ...)": the rounding holds but the truncation bound is >= 1 (or >= the exact
result's size where errors are relative to another scale), so it checks nothing. A bound >= 1
(the size) proves nothing; such rows are never counted as held.
"""


def write_verification(rows: list, failures: list, out_dir: pathlib.Path) -> list:
    from .precision import ALLOWANCE_C

    out_dir.mkdir(parents=True, exist_ok=True)
    trows = table_rows(rows)
    csv_path = out_dir / "verification.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS) + ["notes"])
        w.writeheader()
        for r, d in zip(rows, trows):
            w.writerow({**d, "notes": r.notes})
    json_path = out_dir / "verification.json"
    from .provenance import provenance

    payload = {
        "provenance": provenance(),
        "allowance_c": ALLOWANCE_C,
        "rows": [
            {
                **r.as_dict(),
                # "holds" agrees with the verdict: a row within a bound that says nothing
                # (no guarantee, inconclusive) does not hold
                "holds": d["verdict"] in topline.HELD,
                "verdict": d["verdict"],
                "rounding_ratio": d["rounding_ratio"],
                "truncation_ratio": d["truncation_ratio"],
            }
            for r, d in zip(rows, trows)
        ],
        "family_failures": [{"family": n, "error": e} for n, e, _ in failures],
    }
    json_path.write_text(json.dumps(payload, indent=1, default=float))
    md_path = out_dir / "verification.md"
    md = [
        "# Verification table",
        "",
        VERIFY_LEGEND.format(c=ALLOWANCE_C),
        format_table(rows, markdown=True),
    ]
    if failures:
        md += ["", "## Families that failed to run", ""] + [f"* `{n}`: {e}" for n, e, _ in failures]
    md_path.write_text("\n".join(md))
    return [csv_path, json_path, md_path]


def run_verify(args, progress: Progress) -> tuple:
    rows, failures = collect_rows(args.quick, progress)
    files = write_verification(rows, failures, args.out / "verification")
    return rows, failures, files


# --------------------------------------------------------------------------- figures


def figure_modules() -> list:
    return [importlib.import_module(f"analysis.figures.{name}") for name in FIGURES]


def run_figure(module, args, progress: Progress) -> tuple:
    progress(f"figure {module.NAME}: running")
    t = time.perf_counter()
    try:
        files = list(module.run(args.out / "figures", quick=args.quick, recompute=args.recompute))
    except Exception as exc:
        progress(f"figure {module.NAME} FAILED: {type(exc).__name__}: {exc}")
        return [], f"{type(exc).__name__}: {exc}"
    progress(f"figure {module.NAME}: {len(files)} files in {time.perf_counter() - t:.1f}s")
    return files, None


# ---------------------------------------------------------------------------- claims


def claims_runner():
    """The module ``proofs_check.runner`` if it is installed, else None."""
    try:
        return importlib.import_module("proofs_check.runner")
    except ImportError:
        return None


UNAVAILABLE = "proofs_check is not available (no proofs_check.runner)"


def run_claims(
    argv: list, out_dir: Optional[pathlib.Path], prog: str = "python -m analysis claims"
) -> tuple:
    """``python -m analysis claims``: ``proofs_check.runner.main(argv)``; returns (exit code or
    None if unavailable, captured output). Its table is also saved as ``out_dir/claims.txt``.
    ``prog`` names the command in usage lines and errors (``svt claims`` when run as svt)."""
    runner = claims_runner()
    if runner is None:
        return None, UNAVAILABLE
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            code = runner.main(list(argv), prog=prog)
    except SystemExit as exc:  # argparse inside the runner (--help, a bad option)
        code = exc.code if isinstance(exc.code, int) else 2
    text = buf.getvalue()
    if any(a in ("-h", "--help") for a in argv):
        return (
            code,
            text
            + f"\nAlso: --out DIR (default {DEFAULT_OUT}): the table is saved as DIR/claims/claims.txt.\n",
        )
    if out_dir is not None and code != 2:  # a usage error leaves the last table in place
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "claims.txt").write_text(text)
    return code, text


@dataclass
class ClaimsOutcome:
    """The report's claim run: ``proofs_check.runner.table_rows`` and the printed table."""

    rows: list
    text: str

    @property
    def mismatches(self) -> int:
        return sum(not r["matches"] for r in self.rows)


def report_claims(out_dir: pathlib.Path, progress: Progress) -> Optional[ClaimsOutcome]:
    """Every claim in every precision it lists (``proofs_check.runner.run``, its default
    number of examples), saved as ``out_dir/claims.txt`` and ``claims.json``; None if
    proofs_check is not installed."""
    runner = claims_runner()
    if runner is None:
        return None
    results = runner.run(
        progress=lambda r: progress(f"claims: {r.claim.id} [{r.precision}] {r.verdict}")
    )
    outcome = ClaimsOutcome(runner.table_rows(results), runner.format_table(results))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "claims.txt").write_text(outcome.text + "\n")
    (out_dir / "claims.json").write_text(json.dumps(outcome.rows, indent=1, default=str))
    return outcome


# ---------------------------------------------------------------------------- report


def summary_table(rows: list) -> str:
    """Per solver and precision: verdict counts, worst forward error, worst truncation/bound and
    rounding/bound (a NaN forward error shows as nan, never hidden by the rest)."""
    groups = {}
    for r, d in zip(rows, table_rows(rows)):
        groups.setdefault((r.solver, r.precision), []).append((r, d))
    lines = [
        "| solver | precision | rows | holds | holds (running bound) | no guarantee | inconclusive "
        "| fails | worst forward error | worst truncation/bound | worst rounding/bound |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (solver, prec), items in groups.items():
        verdicts = [d["verdict"] for _, d in items]
        fails = sum(v.startswith("FAILS") for v in verdicts)
        inconclusive = sum(v.startswith("inconclusive") for v in verdicts)
        fwd = nanmax(r.forward_error for r, _ in items)
        ratios = [d["rounding_ratio"] for _, d in items if not math.isnan(d["rounding_ratio"])]
        t_ratios = [
            d["truncation_ratio"] for _, d in items if not math.isnan(d["truncation_ratio"])
        ]
        lines.append(
            f"| {solver} | {prec} | {len(items)} | {verdicts.count('holds')} | "
            f"{verdicts.count('holds (running bound)')} | "
            f"{verdicts.count('no guarantee')} | {inconclusive} | {fails} | {_fmt(fwd)} | "
            f"{_fmt(max(t_ratios, default=float('nan')))} | {_fmt(max(ratios, default=float('nan')))} |"
        )
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    """A markdown table cell: numbers to 3 digits, ``|`` escaped."""
    if isinstance(v, float):
        return f"{v:.3g}"
    return ("-" if v is None else str(v)).replace("|", "\\|")


def docs_link(name: str, out: pathlib.Path) -> str:
    """A markdown link to ``docs/<name>`` of this checkout from a file in the folder ``out``,
    relative so that it resolves wherever ``out`` is (``../docs/<name>`` from ``reports/``); the
    name alone where the toolkit is installed without its docs."""
    target = DOCS / name
    if not target.is_file():
        return f"docs/{name} (in the toolkit's repository)"
    try:
        rel = pathlib.Path(os.path.relpath(target, pathlib.Path(out).resolve())).as_posix()
    except ValueError:  # on another drive (Windows): no relative path
        rel = target.as_uri()
    return f"[docs/{name}]({rel})"


def claims_section(claims: Optional[ClaimsOutcome], out: pathlib.Path = DEFAULT_OUT) -> list:
    if claims is None:
        return [UNAVAILABLE]
    n_claims = len({r["claim"] for r in claims.rows})
    lines = [
        f"{len(claims.rows)} runs of {n_claims} claims (`proofs_check.runner`); {claims.mismatches} differ "
        "from the record. Counterexamples: [claims/claims.txt](claims/claims.txt) "
        f"([json](claims/claims.json)); catalogue: {docs_link('claims.md', out)}.",
        "",
        "| claim | source | precision | cases | worst | bound | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in claims.rows:
        text = (
            r["verdict_text"]
            if r["matches"]
            else f"**MISMATCH**: {r['verdict_text']} (recorded: {r['expected']})"
        )
        lines.append(
            "| "
            + " | ".join(
                _cell(v)
                for v in (
                    r["claim"],
                    r["source"],
                    r["precision"],
                    r["cases"],
                    r["worst"],
                    r["bound"],
                    text,
                )
            )
            + " |"
        )
    return lines


def figure_section(module, files: list, error: Optional[str], out: pathlib.Path) -> list:
    """The plot, the paper's printed values next to ours (``<NAME>_paper.md``, inlined) and
    links to every file the figure wrote."""
    lines = [f"### {module.NAME}", "", module.HELP, ""]
    if error:
        lines += [f"**Failed:** {error}", ""]
    for f in files:
        if str(f).endswith(".png"):
            lines += [f"![{module.NAME}]({os.path.relpath(f, out)})", ""]
    for f in files:
        if pathlib.Path(f).name == f"{module.NAME}_paper.md":
            lines += ["Paper vs ours:", "", pathlib.Path(f).read_text().rstrip(), ""]
    lines += [f"* [{pathlib.Path(f).name}]({os.path.relpath(f, out)})" for f in files]
    return lines + [""]


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def provenance_line(prov: dict) -> str:
    return (
        f"Produced by commit {prov['commit']} on {prov['device']} (Python {prov['python']}, torch {prov['torch']}, "
        f"Triton {prov['triton']}), {prov['date']}."
    )


def write_report(
    args, rows, failures, figures, claims: Optional[ClaimsOutcome], timings
) -> pathlib.Path:
    """``<out>/report.md`` (top-line verdict and provenance first, then the detail) and
    ``<out>/report.json`` (the same top line and provenance, machine-readable)."""
    from .precision import ALLOWANCE_C
    from .provenance import provenance

    out = args.out
    prov = provenance()
    counts = topline.row_counts([verdict(r) for r in rows])
    claim_counts = None if claims is None else topline.claim_counts(claims.rows)
    fig_counts = {
        "written": sum(not e for _, _, e in figures),
        "failed": sum(bool(e) for _, _, e in figures),
    }
    lines = [
        "# Verification report",
        "",
        *topline.markdown(counts, claim_counts, fig_counts, len(failures)),
        "",
        provenance_line(prov)
        + f" Mode: {'quick' if args.quick else 'full'}; rounding allowance constant "
        f"c = {ALLOWANCE_C:g} ({docs_link('precision.md', out)}).",
        "",
        "## Summary per solver and precision",
        "",
        summary_table(rows),
        "Full table: [verification/verification.md](verification/verification.md) "
        "([csv](verification/verification.csv), [json](verification/verification.json)).",
        "",
    ]
    if failures:
        lines += [
            "Families that failed to run: " + ", ".join(f"`{n}` ({e})" for n, e, _ in failures),
            "",
        ]
    if "kernels" in verification.FAMILIES and not _cuda_available():
        from .verification.kernels import NO_GPU

        lines += [NO_GPU, ""]
    lines += ["## Figures", ""]
    if not figures:
        lines.append("No figure modules are registered (analysis/figures/__init__.py FIGURES).")
    for module, files, error in figures:
        lines += figure_section(module, files, error, out)
    lines += ["## Claims", ""] + claims_section(claims, out)
    lines += ["", "## Timings", ""] + [f"* {k}: {v:.1f} s" for k, v in timings.items()]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    summary = {
        "provenance": prov,
        "mode": "quick" if args.quick else "full",
        "allowance_c": ALLOWANCE_C,
        "verification": counts,
        "family_failures": [n for n, _, _ in failures],
        "claims": claim_counts,
        "figures": {**fig_counts, "failed_names": [m.NAME for m, _, e in figures if e]},
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
    }
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    return path


# ------------------------------------------------------------------------------ main


def _common(parser: argparse.ArgumentParser, level: str) -> None:
    """``--quick``/``--full``, ``--recompute``, ``--out`` (:func:`analysis.argtypes.add_run_options`):
    ``level`` ``"top"`` before the command (reconciled with the command's own by
    :func:`merge_levels`), ``"sub"`` after it."""
    add_run_options(parser, level, DEFAULT_OUT)


def merge_levels(parser: argparse.ArgumentParser, args) -> None:
    """Reconcile the common options given before the command (``top_*``) with the command's own:
    the same option twice with different values (``--quick gka_omega --full``, ``--out A
    gka_omega --out B``) is a usage error, as is one the command does not take (``--quick
    check-kernel``, ``claims --full``); sets ``args.quick``, ``args.recompute``, ``args.out``."""
    command = args.command
    top_quick, top_recompute, top_out = args.top_quick, args.top_recompute, args.top_out
    top_quick_name = {True: "--quick", False: "--full", None: None}[top_quick]
    if command in ("check-kernel", "diff"):  # their own options, after the command
        for name in (top_quick_name, "--recompute" if top_recompute else None):
            if name:
                parser.error(f"argument {name}: not an option of {command}")
        if top_out is not None:
            own = " (its report file is its own --out FILE, after the command)"
            parser.error(
                f"argument --out: not an option of {command}"
                + (own if command == "check-kernel" else "")
            )
        return
    quick = getattr(args, "quick", None)
    if command == "claims":  # proofs_check.runner's options; of the common ones only --out applies
        recompute = top_recompute or getattr(args, "recompute", False)
        names = {True: "--quick", False: "--full", None: None}
        for name in (top_quick_name, names[quick], "--recompute" if recompute else None):
            if name:
                parser.error(
                    f"argument {name}: not an option of claims ({parser.prog} claims --help lists them)"
                )
    if top_quick is not None and quick is not None and top_quick != quick:
        parser.error(
            f"argument {'--quick' if quick else '--full'}: not allowed with argument "
            f"{top_quick_name} (given before {command})"
        )
    args.quick = top_quick if quick is None else quick
    args.recompute = bool(top_recompute or getattr(args, "recompute", False))
    out = getattr(args, "out", None)
    if top_out is not None and out is not None and top_out != out:
        parser.error(
            f"argument --out: given twice with different values: {str(top_out)!r} before "
            f"{command} and {str(out)!r} after it"
        )
    args.out = out or top_out or DEFAULT_OUT


DESCRIPTION = """\
The toolkit's main job: the verification table (every solver in every precision against
mpmath ground truth), the figures (paper vs ours), the claim catalogue and the report that
gathers them. Without a COMMAND it runs `report`."""

EPILOG = """\
examples:
  %(prog)s report --quick          everything at small sizes -> reports/report.md
  %(prog)s verify --out /tmp/r     the verification table only
  %(prog)s gka_omega               one figure (PNG, SVG, CSV, JSON) -> reports/figures/
  %(prog)s claims --paper gka      the claim table of one paper (claims --help: its options)
  %(prog)s check-kernel mymod:solve --like solvers.chebyshev   your kernel vs the reference
  %(prog)s diff old.json new.json  what changed between two check-kernel reports

exit status: 0 no row failed (inconclusive rows do not fail) / matched the record, 1 a row
failed or no row ran, a figure or family could not run or a claim's verdict changed, 2 usage error; check-kernel: 0 PASS, 1 FAIL, 2 usage or
import error, 3 INCONCLUSIVE; diff: 1 when a verdict got worse."""

SUBCOMMANDS = {
    "verify": (
        "the verification table (every solver x precision vs mpmath)",
        "Run every solver family of the verification table in every precision against mpmath ground "
        "truth; print the table and save it as CSV, JSON and markdown under DIR/verification/. "
        "Exit 1 if a row fails its bound.",
    ),
    "report": (
        "verify + every figure + claims -> DIR/report.md (default)",
        "The verification table, every figure and every claim, gathered in DIR/report.md "
        "(top-line verdict and provenance first, then the detail) and DIR/report.json.",
    ),
    "allowance": (
        "the survey behind the rounding allowance's constant c",
        "Measure rounding / (kappa (n u_acc + u_store)) over problem families and precisions: the "
        "survey that justifies the allowance constant c; writes DIR/allowance.md.",
    ),
}


def prog_name() -> str:
    """``svt`` when run through the installed command, else ``python -m analysis``."""
    return "svt" if pathlib.Path(sys.argv[0]).name == "svt" else "python -m analysis"


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    prog = prog_name()
    p = OneLineParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _common(p, "top")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (help_, description) in SUBCOMMANDS.items():
        _common(sub.add_parser(name, help=help_, description=description), "sub")
    # no -h of its own: --help and every other argument pass through to proofs_check.runner
    c = sub.add_parser(
        "claims",
        add_help=False,
        help="the claim catalogue (proofs_check.runner); its arguments "
        f"pass through ({prog} claims --help lists them)",
    )
    _common(c, "sub")
    from .testing import check_kernel, kernel_diff

    check_kernel.add_parser(sub)
    kernel_diff.add_parser(sub)
    for module in figure_modules():
        description = (
            f"{module.HELP}. Writes {module.NAME}.png/.svg (plot), .csv (measured series) and .json "
            f"(parameters, summary, provenance) into DIR/figures/; the computed data is cached in "
            f"DIR/figures/_cache/ and reused while the code and parameters are unchanged."
        )
        _common(sub.add_parser(module.NAME, help=module.HELP, description=description), "sub")
    return p


def prepare(parser: argparse.ArgumentParser, args) -> None:
    """Settle ``--quick`` (the default without a CUDA GPU) and ``--recompute``, check ``--out``."""
    if args.quick is None:
        args.quick = not _cuda_available()
    settle_run_options(parser, args)


def run_allowance(args, progress: Progress) -> int:
    """``allowance``: the survey, printed and written to ``DIR/allowance.md``."""
    from .studies import allowance

    md, path = allowance.write_table(args.quick, args.out, progress)
    progress.done(f"allowance -> {path}")
    print(md)
    return 0


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "claims":
        parser.error(f"unrecognised arguments: {' '.join(extra)}")
    args.command = args.command or "report"
    merge_levels(parser, args)
    if args.command in ("check-kernel", "diff"):  # no --out folder, no --quick: their own options
        from .testing import check_kernel, kernel_diff

        module = check_kernel if args.command == "check-kernel" else kernel_diff
        return module.run(args, prog=f"{parser.prog} {args.command}")
    prepare(parser, args)
    progress = Progress()

    if args.command == "verify":
        rows, failures, files = run_verify(args, progress)
        progress.done(f"verify: {len(rows)} rows -> {files[-1]}")
        print(format_table(rows))
        bad = [r for r in rows if verdict(r).startswith("FAILS")]
        return 1 if bad or failures or not rows else 0  # no rows: nothing checked, no pass

    if args.command == "claims":
        code, text = run_claims(extra, args.out / "claims", prog=f"{parser.prog} claims")
        if text:  # nothing after a usage error, which went to stderr
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0 if code is None else int(code)

    if args.command == "allowance":
        return run_allowance(args, progress)

    modules = {m.NAME: m for m in figure_modules()}
    if args.command in modules:
        files, error = run_figure(modules[args.command], args, progress)
        progress.done(f"{args.command}: {len(files)} files")
        for f in files:
            print(f)
        return 1 if error else 0

    # report
    timings = {}
    t = time.perf_counter()
    rows, failures, _ = run_verify(args, progress)
    timings["verify"] = time.perf_counter() - t
    figures = []
    for module in modules.values():
        t = time.perf_counter()
        files, error = run_figure(module, args, progress)
        timings[f"figure {module.NAME}"] = time.perf_counter() - t
        figures.append((module, files, error))
    t = time.perf_counter()
    progress("claims: running")
    claims = report_claims(args.out / "claims", progress)
    timings["claims"] = time.perf_counter() - t
    path = write_report(args, rows, failures, figures, claims, timings)
    progress.done(f"report -> {path}")
    print(summary_table(rows))
    print(
        path.read_text().split("\n## Summary")[0].replace("**", "").strip()
    )  # the top line and provenance
    print(f"report: {path}")
    bad = (
        any(verdict(r).startswith("FAILS") for r in rows)
        or not rows  # nothing checked is no pass
        or failures
        or any(e for _, _, e in figures)
        or (claims is not None and claims.mismatches)
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
