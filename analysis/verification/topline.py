"""The report's top-line verdict: verification rows held / failed / inconclusive, and the claim
runs by verdict, with the failing printed claims grouped by severity when the catalogue records
severities (``proofs_check.errata``); without them the failing claims are counted unsorted.
"""

from __future__ import annotations

from typing import Callable, Optional

PRINTED = "as printed"  # proofs_check.claim.PRINTED: the statement as the paper prints it

# Verification verdicts (analysis.cli.verdict) by what they mean for the top line.
HELD = ("holds", "holds (running bound)")
INCONCLUSIVE = ("no guarantee",)  # and every "inconclusive (...)" verdict


# severities counted in the headline; the others (out-of-setting, degenerate, wording, rounding) beside it
HEADLINE_SEVERITIES = ("substantive", "numerical")


def row_counts(verdicts: list) -> dict:
    """``{"rows", "held", "failed", "inconclusive"}`` of a list of verification verdicts.

    The three always add up to ``rows``: a verdict that is neither held nor FAILS (no guarantee,
    inconclusive, or one this module does not know) counts as inconclusive, never as held."""
    held = sum(v in HELD for v in verdicts)
    failed = sum(v.startswith("FAILS") for v in verdicts)
    return {
        "rows": len(verdicts),
        "held": held,
        "failed": failed,
        "inconclusive": len(verdicts) - held - failed,
    }


def severity_lookup() -> Optional[Callable[[str], Optional[str]]]:
    """``claim id -> severity`` from the catalogue, or None when it records no severities."""
    try:
        from proofs_check.errata import severity_of
    except ImportError:
        return None
    return severity_of


def severity_order() -> tuple:
    """The catalogue's severities, heaviest first (empty when it has none)."""
    try:
        from proofs_check.errata import SEVERITIES
    except ImportError:
        return ()
    return tuple(SEVERITIES)


def _severity(row: dict, lookup) -> Optional[str]:
    """A claim row's severity: its own ``severity`` field, else the catalogue's, else None."""
    if row.get("severity"):
        return row["severity"]
    if lookup is None:
        return None
    try:
        return lookup(row["claim"])
    except Exception:  # a catalogue being edited must not break the report
        return None


def claim_counts(rows: list) -> dict:
    """Claim runs by verdict, and the distinct claims failing as printed, by severity.

    ``rows``: ``proofs_check.runner.table_rows``. ``failing_by_severity`` maps severity (or
    ``"unrated"``) to the number of distinct printed claims (form ``as printed``) whose run
    fails; ``failing_other`` counts the other failing claims (refuted extensions, corrected
    forms); ``mismatches`` counts runs whose verdict differs from the recorded one.
    """
    by_verdict: dict = {}
    for r in rows:
        by_verdict[r["verdict"]] = by_verdict.get(r["verdict"], 0) + 1
    lookup = severity_lookup()
    printed = [r for r in rows if r.get("form", PRINTED) == PRINTED]
    failing = {r["claim"]: _severity(r, lookup) for r in printed if r["verdict"] == "fails"}
    failing_other = {
        r["claim"] for r in rows if r.get("form", PRINTED) != PRINTED and r["verdict"] == "fails"
    }
    order = severity_order()
    by_severity: dict = {}
    for sev in sorted(
        set(failing.values()), key=lambda s: order.index(s) if s in order else len(order)
    ):
        by_severity[sev or "unrated"] = sum(v == sev for v in failing.values())
    return {
        "runs": len(rows),
        "claims": len({r["claim"] for r in rows}),
        "by_verdict": by_verdict,
        "failing_claims": len(failing),
        "failing_by_severity": by_severity,
        "failing_other": len(failing_other),
        "mismatches": sum(not r.get("matches", True) for r in rows),
    }


def markdown(rows: dict, claims: Optional[dict], figures: dict, family_failures: int) -> list:
    """The top-line lines of report.md (``rows``: :func:`row_counts`; ``claims``:
    :func:`claim_counts` or None when proofs_check is missing; ``figures``: written / failed)."""
    if rows["rows"]:
        lines = [
            f"**Verification: {rows['held']} of {rows['rows']} rows hold, {rows['failed']} fail, "
            f"{rows['inconclusive']} inconclusive** (a bound as large as what it bounds checks "
            "nothing: no rounding bound below 1 applies, or the truncation bound is vacuous)."
        ]
    else:
        lines = ["**Verification: no rows ran, so nothing was checked.**"]
    if family_failures:
        lines.append(f"**{family_failures} solver families failed to run** (listed below).")
    if claims is None:
        lines.append("Claims: not run (proofs_check is not installed).")
    else:
        verb = {
            "holds": "hold",
            "fails": "fail",
        }  # "211 hold, 53 fail"; other verdicts name a state
        verdicts = ", ".join(
            f"{n} {verb.get(v, v)}"
            for v, n in sorted(claims["by_verdict"].items(), key=lambda kv: -kv[1])
        )
        lines.append(
            f"**Claims: {claims['runs']} runs of {claims['claims']} claims: {verdicts}.** "
            f"{claims['mismatches']} runs differ from the recorded verdict."
        )
        if claims["failing_claims"]:
            rated = {s: n for s, n in claims["failing_by_severity"].items() if s != "unrated"}
            if rated:
                # the headline counts what makes a paper give wrong results (substantive, numerical);
                # the lighter severities stand beside it (docs/errata.md)
                by = claims["failing_by_severity"]
                heavy = {s: n for s, n in by.items() if s in HEADLINE_SEVERITIES}
                light = {s: n for s, n in by.items() if s not in HEADLINE_SEVERITIES}
                text = (
                    f"**{sum(heavy.values())} printed statements fail** ("
                    + (
                        ", ".join(f"{n} {s}" for s, n in heavy.items())
                        or "none substantive or numerical"
                    )
                    + ")"
                )
                if light:
                    text += "; beside them " + ", ".join(f"{n} {s}" for s, n in light.items())
            else:
                text = f"**{claims['failing_claims']} printed statements fail**"
                text += " (the catalogue records no severities)"
            if claims["failing_other"]:
                text += (
                    f"; {claims['failing_other']} other claims (extensions, corrected forms) fail"
                )
            lines.append(text + ".")
    lines.append(f"Figures: {figures['written']} written, {figures['failed']} failed.")
    return [line + "  " for line in lines[:-1]] + lines[-1:]
