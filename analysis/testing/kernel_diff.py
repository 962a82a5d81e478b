"""``svt diff OLD.json NEW.json``: what changed between two ``svt check-kernel`` reports of a
kernel (two versions of it, or one version on two machines).

Runs are matched by (input dtype, contract). For each the table shows the old and new verdict
and worst error/bound ratio, and what changed: a verdict that got worse (PASS -> INCONCLUSIVE
-> FAIL), one that got better, a worst ratio that moved by more than ``--ratio-change``
(relative; the ratio is the kernel's error over its bound, so 0.3 -> 0.9 means the kernel
used three times as much of its error budget), or a run present in one report only.

Exit status: 1 when any verdict got worse (a run's or the overall one), else 0; 2 for a usage
error (a file that is missing, not JSON, or not a check-kernel report; reports of different
references, whose ratios measure different things; reports with no run in common, e.g. one of
float32 inputs only and one of bfloat16 inputs only). A larger ratio within the same verdict
does not fail the comparison: it is shown, for a person to judge. Ratios compare like with
like only when both reports drew the same cases (same seed, cases per run and sizes); the
output says when they did not.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from typing import Optional

from ..argtypes import HelpFormatter, plain
from .check_kernel import FORMAT, VERDICT_RANK, UsageError, as_float, table

DEFAULT_RATIO_CHANGE = 0.1
CASE_SETTINGS = ("seed", "max_examples", "sizes", "shrink")


def load(path: str, argument: str) -> dict:
    """A check-kernel report; UsageError naming ``argument`` if it is not one."""
    p = pathlib.Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise UsageError(
            argument, f"{path!r} cannot be read: {e.strerror or type(e).__name__}"
        ) from None
    except json.JSONDecodeError as e:
        raise UsageError(argument, f"{path!r} is not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(
            argument, f'{path!r} is not a check-kernel report (no "format": "{FORMAT}")'
        )
    return data


def _runs(report: dict) -> list:
    """(input dtype, contract) of every run of a report, in its order."""
    return list(dict.fromkeys((r["precision"], r["contract"]) for r in report.get("runs", [])))


def no_common_run(old: dict, new: dict) -> None:
    """UsageError naming ``NEW.json`` when the reports share no (input dtype, contract) run:
    nothing would be compared, and "unchanged" would be said of nothing."""
    olds, news = _runs(old), _runs(new)
    if set(olds) & set(news):
        return
    o_dtypes, n_dtypes = ({p for p, _ in runs} for runs in (olds, news))
    if o_dtypes.isdisjoint(n_dtypes):  # name what differs: the input dtypes ...
        o_what, n_what = (f"{'/'.join(sorted(d)) or 'no'} inputs" for d in (o_dtypes, n_dtypes))
    else:  # ... or the contracts
        o_what, n_what = (", ".join(f"{p} / {c}" for p, c in r) or "no run" for r in (olds, news))
    raise UsageError(
        "NEW.json",
        f"no run in common with OLD.json (NEW.json: {n_what}; OLD.json: {o_what}): nothing to "
        "compare; check both with the same --precision and --model",
    )


def _ratio_change(old: Optional[float], new: Optional[float], threshold: float) -> Optional[str]:
    if old is None or new is None or old == new:
        return None
    if math.isnan(old) or math.isnan(new) or math.isinf(old) or math.isinf(new):
        return f"ratio {old:.3g} -> {new:.3g}"
    if old == 0 or new == 0:
        return f"ratio {old:.3g} -> {new:.3g}"
    factor = new / old
    if abs(factor - 1.0) <= threshold:
        return None
    return f"ratio x{factor:.3g}"


def compare(old: dict, new: dict, *, ratio_change: float = DEFAULT_RATIO_CHANGE) -> dict:
    """The comparison: one row per (input dtype, contract) in either report, the overall
    verdicts, and counts (``worse``, ``better``, ``ratio_changed``)."""
    key = lambda r: (r["precision"], r["contract"])  # noqa: E731
    olds, news = {key(r): r for r in old["runs"]}, {key(r): r for r in new["runs"]}
    rows, worse, better, moved = [], 0, 0, 0
    for k in list(olds) + [k for k in news if k not in olds]:
        o, n = olds.get(k), news.get(k)
        ov, nv = (o or {}).get("verdict"), (n or {}).get("verdict")
        oratio, nratio = (
            as_float((o or {}).get("worst_ratio")),
            as_float((n or {}).get("worst_ratio")),
        )
        changes = []
        if o is None or n is None:
            changes.append("only in NEW" if o is None else "only in OLD")
        elif VERDICT_RANK[nv] > VERDICT_RANK[ov]:
            changes.append("verdict WORSE")
            worse += 1
        elif VERDICT_RANK[nv] < VERDICT_RANK[ov]:
            changes.append("verdict better")
            better += 1
        if o is not None and n is not None:
            r = _ratio_change(oratio, nratio, ratio_change)
            if r:
                changes.append(r)
                moved += 1
        rows.append(
            {
                "precision": k[0],
                "contract": k[1],
                "old_verdict": ov,
                "new_verdict": nv,
                "old_ratio": oratio,
                "new_ratio": nratio,
                "change": "; ".join(changes),
            }
        )
    overall_worse = VERDICT_RANK[new["verdict"]] > VERDICT_RANK[old["verdict"]]
    same_cases = all(old["settings"].get(s) == new["settings"].get(s) for s in CASE_SETTINGS)
    # reports written before trajectory mode have no key: read as off
    same_mode = bool(old["settings"].get("trajectory")) == bool(new["settings"].get("trajectory"))
    return {
        "rows": rows,
        "old_verdict": old["verdict"],
        "new_verdict": new["verdict"],
        "worse": worse,
        "better": better,
        "ratio_changed": moved,
        "overall_worse": overall_worse,
        "same_cases": same_cases,
        "same_mode": same_mode,
    }


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def _pair(old: str, new: str) -> str:
    return old if old == new else f"{old} -> {new}"


def format_comparison(old: dict, new: dict, result: dict, old_name: str, new_name: str) -> str:
    def version(rep):
        src = rep.get("kernel_source") or {}
        sha = (src.get("sha256") or "")[:12]
        prov = rep.get("provenance") or {}
        return (
            f"{rep.get('kernel_spec', rep['kernel'])}"
            + (f" (source {sha})" if sha else "")
            + (f", {prov.get('device')}, {prov.get('date')}" if prov else "")
        )

    lines = [
        f"OLD {old_name}: {version(old)}",
        f"NEW {new_name}: {version(new)}",
        f"reference: {new['reference']} (strategy {new['strategy']})",
        "",
    ]
    head = ("inputs", "contract", "verdict OLD -> NEW", "worst ratio OLD -> NEW", "change")
    body = [
        (
            r["precision"],
            r["contract"],
            _pair(r["old_verdict"] or "-", r["new_verdict"] or "-"),
            _pair(_fmt(r["old_ratio"]), _fmt(r["new_ratio"])),
            r["change"] or "-",
        )
        for r in result["rows"]
    ]
    lines += [table(head, body), ""]
    for precision in dict.fromkeys(r["precision"] for r in result["rows"]):
        o = old.get("precisions", {}).get(precision, {})
        n = new.get("precisions", {}).get(precision, {})
        if o.get("tightest_contract_met") != n.get("tightest_contract_met") or o.get(
            "verdict"
        ) != n.get("verdict"):
            lines.append(
                f"{precision} inputs: {o.get('verdict', '-')} (tightest contract met: "
                f"{o.get('tightest_contract_met') or 'none'}) -> {n.get('verdict', '-')} (tightest contract met: "
                f"{n.get('tightest_contract_met') or 'none'})"
            )
    if not result.get("same_mode", True):
        lines.append(
            "note: one report ran in trajectory mode and the other did not: every step is checked "
            "in that mode, so its ratios are not comparable with the other's"
        )
    if not result["same_cases"]:
        lines.append(
            "note: the reports drew different cases (seed, cases per run or sizes differ): ratios compare "
            "different problems"
        )
    change = (
        "WORSE"
        if result["overall_worse"]
        else (
            "better"
            if VERDICT_RANK[result["new_verdict"]] < VERDICT_RANK[result["old_verdict"]]
            else "unchanged"
        )
    )
    lines.append(
        f"verdict: {result['old_verdict']} -> {result['new_verdict']} ({change}); "
        f"{result['worse']} run(s) worse, {result['better']} better, "
        f"{result['ratio_changed']} worst ratio(s) changed"
    )
    return "\n".join(lines)


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``diff`` on an argparse subparsers object."""
    p = sub.add_parser(
        "diff",
        help="what changed between two check-kernel reports (verdicts, worst ratios)",
        description=plain(__doc__),
        formatter_class=HelpFormatter,
    )
    p.add_argument("old", metavar="OLD.json", help="the earlier report (svt check-kernel --out)")
    p.add_argument("new", metavar="NEW.json", help="the later report")
    p.add_argument(
        "--ratio-change",
        type=float,
        default=DEFAULT_RATIO_CHANGE,
        metavar="R",
        help="flag a worst ratio that moved by more than this relative amount",
    )
    return p


def run(args, prog: str = "svt diff") -> int:
    try:
        if not args.ratio_change >= 0:
            raise UsageError("--ratio-change", f"expected a number >= 0, got {args.ratio_change}")
        old, new = load(args.old, "OLD.json"), load(args.new, "NEW.json")
        if (old["like"], old["strategy"]) != (new["like"], new["strategy"]):
            raise UsageError(
                "NEW.json",
                f"checks a kernel like {new['like']} (strategy {new['strategy']}), OLD.json "
                f"like {old['like']} (strategy {old['strategy']}): not comparable",
            )
        no_common_run(old, new)
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    result = compare(old, new, ratio_change=args.ratio_change)
    print(format_comparison(old, new, result, args.old, args.new))
    return 1 if result["worse"] or result["overall_worse"] else 0


__all__ = ["compare", "format_comparison", "load", "run"]
