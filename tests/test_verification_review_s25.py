"""Review of the verification rows' verdicts (session 25): a bound as large as what it bounds is no
check (inconclusive, never held), NaN or inf never holds, zero rows never read as all held, the
top-line counts add up to the rows, and each check prints its tightness (measured / bound).

Every test here failed on the code before the review.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from verification_support import fake_row, install_fake_family

from analysis import cli
from analysis.verification import topline
from analysis.verification.row import VerificationRow

NAN = float("nan")


def _row(**kw) -> VerificationRow:
    return fake_row(**{"iters": 5, "truncation": 0.01, "truncation_bound": 0.1, **kw})


@pytest.fixture
def family(monkeypatch):
    return install_fake_family(monkeypatch, "fake_s25", _row())


# ------------------------------------------------------------------ vacuous bounds


@pytest.mark.parametrize("bound", [1.0, 1.76, 6.69, math.inf])
def test_a_vacuous_truncation_bound_is_inconclusive_not_held(bound):
    """Old: "holds" (AGD's 6.69, CG's 1.76, random Kaczmarz's 2.88 in the quick table)."""
    row = _row(truncation=0.9, truncation_bound=bound)
    v = cli.verdict(row)
    assert v.startswith("inconclusive") and "truncation bound vacuous" in v
    assert topline.row_counts([v]) == {"rows": 1, "held": 0, "failed": 0, "inconclusive": 1}


def test_a_conclusive_truncation_bound_still_holds():
    assert cli.verdict(_row(truncation=0.09, truncation_bound=0.1)) == "holds"
    assert cli.verdict(_row(truncation=0.0, truncation_bound=0.0)) == "holds"  # KLA's identity


def test_a_bound_above_the_results_own_size_is_no_guarantee():
    """ska_readout: errors over the scale S, the readout itself is y/S = 0.0047 of it; old: the
    bfloat16/storage row's allowance 0.31 (67 times the readout) "holds"."""
    row = _row(
        truncation=0.0,
        truncation_bound=NAN,
        rounding=1.2e-4,
        rounding_bound=0.31,
        reference_size=0.0047,
    )
    assert cli.verdict(row) == "no guarantee"
    assert cli.verdict(_row(truncation_bound=NAN, rounding_bound=3e-4, reference_size=0.0047)) == (
        "holds"
    )


def test_ska_rows_carry_the_readouts_size():
    from analysis.verification import koopman

    row = koopman._readout_row(koopman.PRECISIONS[2], 64, 4, 0.0)  # bfloat16/storage, i.i.d.
    assert row.reference_size == row.extra["y_over_S"]  # the same float: no tolerance
    assert row.rounding_bound > row.reference_size and cli.verdict(row) == "no guarantee"


def test_solver_rows_report_a_conclusive_iterate_where_one_exists():
    """Old: AGD's rows reported the iterate of bound 6.69 (no check) though later iterates have
    bounds < 1; now the worst ratio among those, and the row holds conclusively."""
    from analysis.verification import _solver_rows

    ratio = torch.tensor([1.0, 0.13, 0.5, 0.01, 0.002])
    bound = torch.tensor([1.0, 6.7, 2.0, 0.75, 0.4])
    assert _solver_rows.worst_iterate(ratio, bound, 1) == 3
    assert _solver_rows.worst_iterate(ratio, torch.full_like(bound, 2.0), 1) == 2  # none < 1
    failing = torch.tensor([0.0, 1.5, 0.5, 0.01, 0.002])
    assert _solver_rows.worst_iterate(failing, bound, 1) == 1  # a failure is never hidden
    p = _solver_rows.problems(True)[0]  # fig1a-a0.02-t16, kappa 51, r = 30
    row = _solver_rows.row("agd", p, _solver_rows.PRECISIONS[0])
    assert row.truncation_bound < 1 and cli.verdict(row) == "holds"


# ------------------------------------------------------------------ NaN / inf


def test_an_infinite_result_never_holds():
    """Old: "holds (running bound)" with forward error inf."""
    row = _row(
        forward_error=math.inf,
        rounding=0.05,
        rounding_bound=2.0,
        running_bound=0.1,
        running_ratio=0.5,
    )
    assert cli.verdict(row).startswith("FAILS") and not row.holds


def test_a_nan_rounding_never_holds_by_the_running_bound():
    """Old: "holds (running bound)" with rounding NaN (the allowance >= 1 was not checked)."""
    row = _row(rounding=NAN, rounding_bound=2.0, running_bound=0.1, running_ratio=0.5)
    assert cli.verdict(row).startswith("FAILS")


def test_nanmax_does_not_hide_a_nan():
    from analysis.verification.row import nanmax

    assert max([0.1, NAN]) == 0.1  # the trap
    assert math.isnan(nanmax([0.1, NAN])) and math.isnan(nanmax([]))
    assert nanmax([0.1, 0.3]) == 0.3


def test_a_gate_nan_at_a_later_grid_point_fails_the_row():
    """Old: ``max(errs)`` kept the first error, the row held with a NaN at z = -0.3."""
    from analysis.verification import gates
    from solvers.gates import SigmoidGate

    class Broken(SigmoidGate):
        def value(self, z, bf16_mode=None):
            out = super().value(z, bf16_mode=bf16_mode).clone()
            out[3] = NAN
            return out

    ar = gates.PRECISIONS[0]
    z = torch.tensor(gates.GRID, dtype=torch.float64)
    rows = {r.solver: r for r in gates._pointwise_rows(Broken(), "broken", ar, z, "grid")}
    bad = rows["gate/broken/value"]
    assert math.isnan(bad.forward_error) and cli.verdict(bad).startswith("FAILS")


def test_kla_rows_hold_every_token_to_its_own_bound():
    """Old: the row compared max_t err_t with max_t B_t only; the per-token ratio (extra's
    max_ratio) entered no verdict, so a token beyond its bound could hold."""
    from analysis.verification import kaczmarz

    for r in kaczmarz._kla_rows(True):
        assert r.running_ratio == r.extra["max_ratio"] and math.isfinite(r.running_bound)
    r = kaczmarz._kla_rows(True)[0]
    r.running_ratio = 1.2  # one token past its bound, the maxima still in order
    assert r.rounding <= r.rounding_bound and cli.verdict(r) == "FAILS (running bound)"


# ------------------------------------------------------------------ counts, zero rows, tightness


def test_row_counts_add_up_to_the_rows():
    """Old: a verdict outside the known strings was counted nowhere (held + failed +
    inconclusive < rows)."""
    c = topline.row_counts(
        ["holds", "inconclusive (truncation bound vacuous; rounding holds)", "?"]
    )
    assert c == {"rows": 3, "held": 1, "failed": 0, "inconclusive": 2}


def test_zero_rows_never_read_as_all_held(tmp_path, family):
    """Old: exit 0 and "0 of 0 rows hold"."""
    family.ROWS = []
    assert cli.main(["verify", "--quick", "--out", str(tmp_path)]) == 1
    text = " ".join(topline.markdown(topline.row_counts([]), None, {"written": 0, "failed": 0}, 0))
    assert "no rows ran" in text and "0 of 0" not in text


def test_the_json_holds_field_agrees_with_the_verdict(tmp_path, family):
    """Old: ``"holds": true`` beside the verdict "no guarantee" (rounding 0.5 within a bound 2)."""
    family.ROWS = [_row(rounding=0.5, rounding_bound=2.0), _row(truncation_bound=3.0), _row()]
    assert cli.main(["verify", "--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "verification" / "verification.json").read_text())["rows"]
    assert [(r["verdict"].split(" ")[0], r["holds"]) for r in rows] == [
        ("no", False),
        ("inconclusive", False),
        ("holds", True),
    ]
    # truncation / bound = 0.01 / 0.1, the same float64 division; json reads back exactly
    assert rows[2]["truncation_ratio"] == 0.01 / 0.1


def test_the_table_prints_the_tightness_of_every_check():
    """Old: only rounding/bound; truncation/bound and the running check's ratio were not shown."""
    text = cli.format_table([_row(running_bound=1e-5, running_ratio=0.25)])
    head = text.splitlines()[0]
    assert "truncation/bound" in head and "running ratio" in head and "rounding/bound" in head
    assert "1.00e-01" in text and "2.50e-01" in text


def test_the_summary_does_not_hide_a_nan_forward_error():
    """Old: ``max`` over the group kept 1e-7 and dropped the NaN; no inconclusive column."""
    s = cli.summary_table([_row(), _row(forward_error=NAN), _row(truncation_bound=2.0)])
    assert "| nan |" in s and "inconclusive" in s.splitlines()[0]
    assert "| fake | float32 | 3 | 1 | 0 | 0 | 1 | 1 |" in s
