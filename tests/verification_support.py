"""Shared set-up of the report tests: a verification row with chosen numbers, and a fake row
family that ``analysis.verification`` runs in place of the real ones."""

import sys
import types

from analysis import verification
from analysis.verification.row import VerificationRow


def fake_row(**kw) -> VerificationRow:
    """A float32 row of a fake solver that holds; ``kw`` overrides any field."""
    base = dict(
        solver="fake",
        precision="float32",
        problem="p",
        n=4,
        kappa=10.0,
        iters=3,
        forward_error=1e-7,
        backward_error=1e-8,
        truncation=0.1,
        truncation_bound=0.2,
        rounding=1e-7,
        rounding_bound=1e-4,
    )
    base.update(kw)
    return VerificationRow(**base)


def install_fake_family(monkeypatch, name: str, first_row: VerificationRow):
    """The module ``analysis.verification.<name>`` as the only family, with ``ROWS`` (initially
    ``[first_row]``) the test may replace."""
    mod = types.ModuleType(f"analysis.verification.{name}")
    mod.ROWS = [first_row]
    mod.rows = lambda quick: list(mod.ROWS)
    monkeypatch.setitem(sys.modules, f"analysis.verification.{name}", mod)
    monkeypatch.setattr(verification, "FAMILIES", [name])
    return mod
