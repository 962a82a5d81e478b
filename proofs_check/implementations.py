"""The implementation mappings the claims' checks call, and an implementation under test merged over them.

Every claim's check is ``check(case, impl, precision)``: ``impl`` is a mapping of names to
functions, by default ``claim.implementation()``. Names ending in ``_mp`` are the exact mpmath
references the checks compare with; the other names are the implementations a claim exercises
(``solvers.chebyshev``, ``solvers.gka_ridge``, ``solvers.kla_chunkwise``, ...), which
``python -m proofs_check --impl MODULE:NAME`` replaces by yours.

A user mapping replaces only the names it provides (:func:`merged`): the rest of each claim's
mapping, the mpmath references included, stays the toolkit's. :func:`select` checks a user
mapping against the selected claims (a name no selected claim calls, or a mapping that replaces
nothing, is a usage error) and keeps the claims whose mapping has one of its names.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .claim import PAPERS, Claim, Pending

REFERENCE_SUFFIX = "_mp"


def names_of(claim: Claim) -> tuple:
    """The names of ``claim``'s implementation mapping (empty when its module is pending)."""
    try:
        return tuple(claim.implementation())
    except Pending:
        return ()


def is_reference(name: str) -> bool:
    """An exact (mpmath) reference: never needed from an implementation under test."""
    return name.endswith(REFERENCE_SUFFIX)


def merged(claim: Claim, user: Mapping) -> dict:
    """``claim``'s own implementation mapping with the entries of ``user`` replacing its own."""
    return {**claim.implementation(), **user}


def by_name(claims: Iterable[Claim]) -> dict:
    """Implementation name (not a reference) -> ids of the claims whose mapping has it, in order."""
    out: dict = {}
    for c in claims:
        for name in names_of(c):
            if not is_reference(name):
                out.setdefault(name, []).append(c.id)
    return dict(sorted(out.items()))


def select(user: Mapping, claims: list, spec: str = "the mapping") -> list:
    """The claims of ``claims`` whose mapping has a name of ``user``; ``ValueError`` (one line)
    when ``user`` names a function no selected claim calls or replaces none of them."""
    offered = sorted(by_name(claims))
    known = {n for c in claims for n in names_of(c)}
    unknown = sorted(str(n) for n in user if n not in known)
    hint = (
        f"the selected claims call {', '.join(offered)}"
        if offered
        else "the selected claims call no implementation (only exact references)"
    )
    if unknown:
        raise ValueError(
            f"{spec} provides {', '.join(unknown)}, which no selected claim calls ({hint})"
        )
    if not user:
        raise ValueError(f"{spec} provides none of the functions the selected claims call ({hint})")
    return [c for c in claims if any(n in names_of(c) for n in user)]


def help_lines(width: int = 88) -> list:
    """Per paper, the implementation names its claims call: for ``--help``."""
    import textwrap

    from . import registry

    lines = []
    for paper in PAPERS:
        names = by_name(registry.all_claims(paper))
        if names:
            lines += textwrap.wrap(
                f"{paper}: {', '.join(names)}",
                width,
                initial_indent="  ",
                subsequent_indent="      ",
                break_on_hyphens=False,
            )
    return lines


def markdown() -> list:
    """The ``--impl`` section of docs/claims.md: what the mapping is, the names per paper, an example."""
    from . import registry

    lines = [
        "## Testing your implementation (`--impl`)",
        "",
        "Each check calls the functions it exercises through a mapping of names to functions, the claim's "
        "implementation mapping (by default the toolkit's: `solvers`, `analysis.references`; names ending in "
        "`_mp` are the exact mpmath references it compares with). `python -m proofs_check --impl MODULE:NAME` "
        "loads a mapping of your own (or a zero-argument function returning one) and merges it over each "
        "claim's mapping: your entries replace the toolkit's functions of the same name, everything else "
        "(the mpmath references included) stays. Only the selected claims whose mapping has one of your names "
        "run, each held to its precision's contract bound where one exists (`gka.alg1`), and a run whose bound "
        "was vacuous on some case is reported `inconclusive`, not `holds`: a bound at least the size of the "
        "exact result, or of the exact iterate it bounds the error of (so an all-zero result cannot hold). A "
        "run that never called any of your functions (a check of the mpmath references alone, say) is "
        "reported `not exercised`, never `holds`. A name that no selected claim calls, "
        "or an empty mapping, is a usage error (exit 2). Exit status: 0 every verdict matches the record, "
        "1 some verdict differs from it, 2 usage error, 3 no verdict differs but some run is inconclusive.",
        "",
        "Example: your Chebyshev solver, with `solvers.chebyshev`'s signature, under GKA's Algorithm 1 claims:",
        "",
        '<!--pytest.mark.skip(reason="needs a module of your own on the path")-->',
        "```bash",
        "cat > my_impl.py <<'EOF'",
        "import solvers",
        "",
        'def my_chebyshev(A, q, *, L, mu, iters, bf16_mode="storage"):',
        "    return solvers.chebyshev(A, q, L=L, mu=mu, iters=iters, bf16_mode=bf16_mode)",
        "",
        'IMPL = {"chebyshev": my_chebyshev}',
        "EOF",
        "python -m proofs_check --claim gka.alg1 --impl my_impl:IMPL",
        "```",
        "",
        "The names each paper's claims take from their mapping, besides the `_mp` references (your function "
        "replaces the toolkit's function of that name and takes the same arguments; `python -m proofs_check "
        "--help` lists them too):",
        "",
        "| paper | names | claims whose mapping has them |",
        "|---|---|---|",
    ]
    for paper, title in PAPERS.items():
        groups: dict = {}  # names sharing the same claims share a row
        for name, ids in by_name(registry.all_claims(paper)).items():
            groups.setdefault(tuple(ids), []).append(name)
        for ids, names in groups.items():
            lines.append(
                f"| {title} | {', '.join(f'`{n}`' for n in names)} | "
                f"{', '.join(f'`{i}`' for i in ids)} |"
            )
    return lines + [""]


__all__ = [
    "REFERENCE_SUFFIX",
    "by_name",
    "help_lines",
    "is_reference",
    "markdown",
    "merged",
    "names_of",
    "select",
]
