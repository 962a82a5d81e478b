"""The claim catalogue: every claim module registers its :class:`Claim` objects here.

Claim modules live in :mod:`proofs_check.claims` (one per paper); :func:`all_claims` imports
them on first use, so importing :mod:`proofs_check` stays cheap.

A claim module declares its claims where their checks are defined::

    claim, erratum = for_paper("kla", implementation=_impl)

    @claim("kla.lagrange", source="KLA App. A.2, eq. (13)", strategy=_token_cases)
    def _check_lagrange(case, impl, prec):
        '''The Lagrangian stationary point of eq. (1) ... gives the Kaczmarz update.

        Measured: mp: S~ - k lambda^T against the update, and its constraint residual.
        '''

The docstring of the check declares the statement and what is measured. A printed statement
that fails and our corrected form of it are declared together by :func:`erratum`, which registers
both twins with one check factory, links them, and records the printed twin as failing on its
counterexample. Each claim remembers the file that declared it (``Claim.file``, a column of
docs/claims.md).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import pathlib
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from .claim import CORRECTED, FAILS, HOLDS, MP, PAPERS, PRINTED, Claim, Uncheckable

_CLAIMS: dict = {}
_UNCHECKABLE: dict = {}
_LOADED = False

CLAIM_MODULES = ("gka", "gka_backward", "kla", "echo", "gates", "reported")


_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _declaring_file(depth: int) -> str:
    """Repository-relative path of the module ``depth`` frames up (the claim module declaring)."""
    name = sys._getframe(depth + 1).f_globals.get("__name__", "")
    path = getattr(sys.modules.get(name), "__file__", None)
    if path is None:
        return ""
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(_ROOT)) if path.is_relative_to(_ROOT) else path.name


def _add(c: Claim, file: str) -> None:
    if c.id in _CLAIMS:
        raise ValueError(f"claim {c.id} registered twice")
    if not c.file:
        c.file = file
    _CLAIMS[c.id] = c


def register(*claims: Claim) -> None:
    """Register ready-made :class:`Claim` objects (prefer :func:`claim` and :func:`erratum`)."""
    file = _declaring_file(1)
    for c in claims:
        _add(c, file)


def one_line(text: str) -> str:
    """Declared text as it is stored and printed: whitespace runs (line breaks) become one space."""
    return " ".join(text.split())


_LABELLED = re.compile(r"^([A-Z][a-z]+):\s+(.*)$", re.S)
CLAIM_FIELDS = {"Measured": "quantity", "Note": "note"}


def parse_text(text: str, where: str, fields: Optional[dict] = None) -> dict:
    """Declared text as fields: the first paragraph is the ``statement``; each later paragraph
    starts with a label of ``fields`` (default :data:`CLAIM_FIELDS`: ``Measured: ...`` is the
    ``quantity``, ``Note: ...`` the ``note``). Line breaks become spaces."""
    fields = CLAIM_FIELDS if fields is None else fields
    first, *rest = re.split(r"\n\s*\n", inspect.cleandoc(text).strip())
    out = {"statement": one_line(first)}
    for para in rest:
        m = _LABELLED.match(para.strip())
        if m is None or m.group(1) not in fields:
            raise ValueError(f"{where}: a paragraph after the first must start with "
                             f"{' or '.join(repr(x + ':') for x in fields)}, got {para.strip()[:40]!r}")
        out[fields[m.group(1)]] = one_line(m.group(2))
    return out


def parse_docstring(check: Callable) -> dict:
    """A check's docstring as claim fields (:func:`parse_text`: statement, ``Measured:``, ``Note:``)."""
    doc = inspect.getdoc(check)
    if not doc:
        raise ValueError(f"check {check.__qualname__} has no docstring: the docstring is the claim's statement")
    return parse_text(doc, f"check {check.__qualname__}")


def claim(id: str, *, paper: str, source: str, strategy: Callable[[], Any], implementation: Callable,
          statement: Optional[str] = None, quantity: Optional[str] = None, note: Optional[str] = None,
          **fields) -> Callable:
    """Decorate ``check(case, impl, precision) -> Measurement`` to register it as claim ``id``.

    The check's docstring declares the text: its first paragraph is the statement, a paragraph
    ``Measured: ...`` what the check measures and holds it to (the quantity), an optional
    ``Note: ...`` what the report should add. ``statement``, ``quantity`` and ``note`` given here
    take the place of the docstring's (one check factory serving several claims). ``fields`` are
    the other :class:`Claim` fields (``precisions``, ``expected``, ``form``, ``twin``, ``loose``,
    ``examples``). Returns the check unchanged.
    """

    def decorate(check: Callable) -> Callable:
        text = {"statement": statement} if statement is not None else parse_docstring(check)
        if quantity is not None:
            text["quantity"] = quantity
        if note is not None:
            text["note"] = note
        if "quantity" not in text:
            raise ValueError(f"claim {id}: no quantity (a 'Measured:' paragraph in the docstring, or quantity=)")
        _add(Claim(id=id, paper=paper, source=source, statement=one_line(text["statement"]),
                   quantity=one_line(text["quantity"]), note=one_line(text.get("note", "")), strategy=strategy,
                   check=check, implementation=implementation, **fields), _declaring_file(1))
        return check

    return decorate


@dataclass(frozen=True)
class Twin:
    """One form of an erratum: what differs between the printed statement and our correction.

    ``quantity``, ``precisions`` and ``implementation`` default to those given to :func:`erratum`;
    ``check`` to the form of :func:`erratum`'s check factory. ``examples`` of the printed twin: the
    shrunk counterexample, always tried first.
    """

    id: str
    source: str
    statement: str
    quantity: Optional[str] = None
    examples: tuple = ()
    note: str = ""
    precisions: Optional[tuple] = None
    implementation: Optional[Callable] = None
    check: Optional[Callable] = None
    loose: Optional[float] = None


def erratum(printed: Twin, corrected: Twin, *, paper: str, strategy: Callable[[], Any], implementation: Callable,
            check: Optional[Callable] = None, args: tuple = (), quantity: Optional[str] = None,
            precisions: tuple = (MP,)) -> None:
    """Register a printed statement that fails and our corrected form, linked as twins.

    ``check`` is a :func:`proofs_check.claims._common.formed` factory: the printed twin runs
    ``check("printed", *args)`` and is recorded as failing, on its counterexample (``examples``,
    required); the corrected twin runs ``check("corrected", *args)`` and is recorded as holding.
    A twin whose check is made otherwise names it (``Twin(check=...)``).
    """
    if not printed.examples:
        raise ValueError(f"claim {printed.id}: the printed form of an erratum needs its counterexample (examples=)")
    if check is None and (printed.check is None or corrected.check is None):
        raise ValueError(f"claim {printed.id}: give erratum(check=) or both twins' checks")
    file = _declaring_file(1)
    for twin, form, other, expected in ((printed, PRINTED, corrected, FAILS), (corrected, CORRECTED, printed, HOLDS)):
        q = twin.quantity if twin.quantity is not None else quantity
        if q is None:
            raise ValueError(f"claim {twin.id}: no quantity (give erratum(quantity=) or the twin's)")
        _add(Claim(id=twin.id, paper=paper, source=twin.source, statement=one_line(twin.statement), quantity=one_line(q),
                   strategy=strategy,
                   check=twin.check or check("printed" if form == PRINTED else "corrected", *args),
                   implementation=twin.implementation or implementation,
                   precisions=twin.precisions if twin.precisions is not None else precisions, expected=expected,
                   form=form, twin=other.id, examples=twin.examples, note=one_line(twin.note), loose=twin.loose), file)


def with_defaults(**defaults) -> tuple:
    """``(claim, erratum)`` with a module's defaults (``implementation``, ``strategy``...) filled in."""
    return functools.partial(claim, **defaults), functools.partial(erratum, **defaults)


def for_paper(paper: str, **defaults) -> tuple:
    """``(claim, erratum)`` for the claims of one paper: :func:`with_defaults` with ``paper``."""
    return with_defaults(paper=paper, **defaults)


def not_checkable(id: str, *, paper: str, source: str, text: str) -> None:
    """Register a statement of a paper that no computation can check, and why (docs/claims.md lists it).

    ``text``: the statement, then a paragraph ``Why: ...`` (the reason)."""
    fields = parse_text(text, f"claim {id}", {"Why": "reason"})
    if "reason" not in fields:
        raise ValueError(f"claim {id}: say why it is not checkable (a paragraph 'Why: ...')")
    register_uncheckable(Uncheckable(id, paper, source, fields["statement"], fields["reason"]))


def register_uncheckable(*items: Uncheckable) -> None:
    """Register statements no computation can check, with the reason."""
    for u in items:
        if u.id in _UNCHECKABLE or u.id in _CLAIMS:
            raise ValueError(f"claim {u.id} registered twice")
        _UNCHECKABLE[u.id] = u


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for name in CLAIM_MODULES:
        importlib.import_module(f"proofs_check.claims.{name}")
    for c in _CLAIMS.values():
        if c.twin is not None and c.twin not in _CLAIMS:
            raise ValueError(f"claim {c.id}: twin {c.twin} is not registered")
    from . import errata

    problems = errata.check(_CLAIMS.values())
    if problems:
        raise ValueError("the errata table (proofs_check/errata.py) disagrees with the claims: " + "; ".join(problems))


def all_claims(paper: Optional[str] = None, ids: Optional[Iterable[str]] = None) -> list:
    """Registered checkable claims in catalogue order, filtered by paper and/or id.

    ``ids`` entries match a claim id exactly or as a prefix ending at a dot
    (``gka.lemma3`` selects ``gka.lemma3`` and ``gka.lemma3.float``; ``gka.alg2`` selects
    every Algorithm 2 claim).
    """
    _load()
    if paper is not None and paper not in PAPERS:
        raise ValueError(f"unknown paper {paper!r}; expected one of {sorted(PAPERS)}")
    out = [c for c in _CLAIMS.values() if paper is None or c.paper == paper]
    if ids is not None:
        wanted = list(ids)
        unknown = [w for w in wanted if not any(_id_matches(c.id, w) for c in _CLAIMS.values())]
        if unknown:
            hints = [f"did you mean {' or '.join(repr(h) for h in suggest(w))}?" for w in unknown if suggest(w)]
            if not hints:
                hints = [f"did you mean an id under {', '.join(repr(p) for p in PAPERS)}? `--list` lists them"]
            raise ValueError(f"unknown claim id(s) {', '.join(repr(w) for w in unknown)} ({'; '.join(hints)})")
        out = [c for c in out if any(_id_matches(c.id, w) for w in wanted)]
    return out


def suggest(wanted: str, n: int = 3) -> list:
    """Registered ids or id prefixes (ending at a dot) closest to ``wanted``."""
    _load()
    names = set(_CLAIMS)
    for cid in _CLAIMS:
        parts = cid.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return difflib.get_close_matches(wanted, sorted(names), n=n, cutoff=0.5)


def uncheckable(paper: Optional[str] = None) -> list:
    _load()
    return [u for u in _UNCHECKABLE.values() if paper is None or u.paper == paper]


def get(claim_id: str) -> Claim:
    _load()
    return _CLAIMS[claim_id]


def _id_matches(claim_id: str, wanted: str) -> bool:
    return claim_id == wanted or claim_id.startswith(wanted + ".")
