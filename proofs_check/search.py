"""One claim searched in one precision by hypothesis (:func:`run_claim`).

The search lets hypothesis draw cases from the claim's strategy, tries the claim's stored
examples first, and stops at the first case whose measurement exceeds its bound. Used by the
runner (``python -m proofs_check``), its worker processes (:mod:`proofs_check.parallel`) and the
replay of recorded searches (:mod:`proofs_check.replay`).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Mapping, Optional

from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings
from hypothesis import seed as hypothesis_seed

from analysis.testing.strategies.reproducible import pin_local_constants

from . import contract_route
from .claim import ERROR, FAILS, HOLDS, PENDING, Claim, Measurement, Pending, Result

DEFAULT_EXAMPLES = 25


class Violation(AssertionError):
    """A case whose measured value exceeds its bound."""


def violation_message(claim: Claim, precision: str, m: Measurement) -> str:
    """One line: the claim, the precision, value > bound and the measurement's detail."""
    return f"{claim.id} [{precision}]: {m.value:.6g} > {m.bound:.6g} {m.detail}"


def worse(a: Measurement, b: Optional[Measurement]) -> bool:
    """Is ``a`` the worse of two measurements (a failure first, then the larger ratio; NaN worst)?"""
    if b is None:
        return True
    if a.ok != b.ok:
        return not a.ok
    ra, rb = a.ratio, b.ratio
    if math.isnan(ra):
        return not math.isnan(rb)
    return not math.isnan(rb) and ra > rb


def check_seed(seed):
    """``seed`` as given (None or a non-negative int), or ValueError naming it."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return seed


def run_claim(
    claim: Claim,
    precision: str,
    *,
    examples: int = DEFAULT_EXAMPLES,
    deterministic: bool = True,
    impl: Optional[Mapping] = None,
    shrink: bool = True,
    record: Optional[list] = None,
    seed: Optional[int] = None,
) -> Result:
    """Search one claim in one precision. ``impl`` replaces ``claim.implementation()``
    (how :mod:`proofs_check.broken` injects a broken implementation); such a run is held to the
    precision's contract bound where one exists and reports ``inconclusive`` instead of
    ``holds`` when a case's bound is vacuous (:mod:`proofs_check.contract_route`). ``record``: a
    list that receives ``(case, passed)`` for every call of the check, in order
    (:mod:`proofs_check.replay`). ``seed``: draw the cases from this seed instead (other cases
    than the deterministic search, the same on every run; ``deterministic`` is then ignored)."""
    seed = check_seed(seed)
    pin_local_constants()  # the cases depend on the strategy alone (analysis.testing.strategies.reproducible)
    start = time.perf_counter()
    try:
        implementation = claim.implementation() if impl is None else impl
    except Pending as exc:
        return Result(
            claim,
            precision,
            0,
            None,
            PENDING,
            message=str(exc),
            seconds=time.perf_counter() - start,
        )
    state = {"tried": 0, "worst": None, "fail": None, "vacuous": 0}
    # an implementation under test is held to its precision's contract (proofs_check.contract_route)
    check = claim.check if impl is None else contract_route.tightened(claim, precision)

    def body(case):
        state["tried"] += 1
        snapshot = copy.deepcopy(case) if record is not None else None
        m = check(case, implementation, precision)
        state["vacuous"] += contract_route.vacuous(m)
        if record is not None:
            record.append((snapshot, m.ok))
        if worse(m, state["worst"]):
            state["worst"] = m
        if not m.ok:
            state["fail"] = (case, m)
            raise Violation(violation_message(claim, precision, m))

    test = given(claim.strategy())(body)
    for case in reversed(claim.examples):
        test = example(case)(test)
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    test = settings(
        max_examples=max(1, examples),
        derandomize=deterministic and seed is None,
        database=None,
        deadline=None,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        phases=phases,
        print_blob=False,
    )(test)
    verdict, counterexample, message = HOLDS, None, ""
    try:
        test()
    except Violation as exc:
        case, m = state["fail"]
        verdict, counterexample, message = FAILS, claim.describe(case), str(exc)
        state["worst"] = m
    except Exception as exc:  # a defect of the check or of the reference it calls
        verdict, message = ERROR, f"{type(exc).__name__}: {exc}"
    if verdict == HOLDS and state["vacuous"]:
        verdict = contract_route.INCONCLUSIVE
        message = (
            f"{state['vacuous']} of {state['tried']} cases had a vacuous bound (at least the "
            "size of the exact result or of the exact iterate it bounds)"
        )
    return Result(
        claim,
        precision,
        state["tried"],
        state["worst"],
        verdict,
        counterexample,
        message,
        time.perf_counter() - start,
    )
