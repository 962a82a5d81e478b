"""The claim table as printed: wrapped to a width (``--wide`` for one line per run), every failing
run's counterexample with its fields named and its measured value against the bound."""

from __future__ import annotations

import pytest

from proofs_check import registry, runner
from proofs_check.claim import FAILS, NO_INPUT, describe_case, is_named

# one claim of each kind of case: a named tuple of fields, a single value, no input at all
CLAIMS = ["gates.stablessm_discrete.range", "gates.balanced.scale", "gka.remark1.values"]


@pytest.fixture(scope="module")
def results():
    return runner.run(claims=CLAIMS, jobs=1, cache=False, examples=5)


def test_case_descriptions():
    assert describe_case((2.0, 1.0, 0.5), ("w", "a", "b")) == "w=2.0, a=1.0, b=0.5"
    assert describe_case(2.0, ("z",)) == "z = 2.0"
    assert describe_case(None) == NO_INPUT
    assert describe_case({"S": 1}) == "{'S': 1}"
    # a tuple without names is what the catalogue must not print (the check below catches it)
    assert not is_named((2.0, 1.0), ()) and not is_named(2.0, ())
    assert is_named((2.0, 1.0), ("x", "y")) and is_named({"S": 1}) and is_named(None)


def test_every_recorded_failure_names_its_fields():
    """Each claim recorded as failing somewhere keeps a counterexample (its first example) that
    prints with named fields: a dict, a dataclass, a named tuple, or ``case_fields``."""
    unnamed = []
    for c in registry.all_claims():
        expected = [c.expected] if isinstance(c.expected, str) else list(c.expected.values())
        if FAILS in expected:
            unnamed += [f"{c.id}: {e!r}" for e in c.examples if not is_named(e, c.case_fields)]
    assert not unnamed, "counterexamples without field names:\n" + "\n".join(unnamed)


def test_failing_rows_print_the_case_and_the_measurement(results):
    text = runner.format_table(results, width=100)
    assert (
        "gates.stablessm_discrete.range.printed [mp] counterexample: w=0.0, a=1.0, b=0.25" in text
    )
    assert "gates.balanced.scale.printed [float64] counterexample: z = 2.0" in text
    assert "counterexample: None" not in text
    assert f"gka.remark1.values.printed [mp] counterexample: {NO_INPUT}" in " ".join(text.split())
    assert "measured 0.9375 > bound 1e-30 (|f'|/f^2)" in text
    assert "measured 1.09463 > bound 1 (R^30 = 6.547e-5 printed 6e-5)" in text


@pytest.mark.parametrize("width", [60, 80, 120])
def test_wrapped_table_fits_the_width(results, width):
    text = runner.format_table(results, width=width)
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, long
    # nothing is lost: every verdict text is there, wrapped
    flat = " ".join(text.split())
    for r in results:
        assert runner.verdict_text(r, results) in flat and r.claim.id in flat


def test_wide_table_is_one_line_per_run(results):
    lines = runner.format_table(results).split("\n\n")[0].splitlines()
    assert len(lines) == 2 + len(results)
    for r, line in zip(results, lines[2:]):
        assert (
            line.startswith(r.claim.id)
            and r.claim.source in line
            and runner.verdict_text(r, results) in line
        )


def test_table_width_choice(monkeypatch):
    assert runner.table_width(False, 72) == 72
    assert runner.table_width(True) is None
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    assert runner.table_width(False) is None  # a file or a pipe: full lines, greppable
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "90")  # what shutil.get_terminal_size reads first
    assert runner.table_width(False) == 90


def test_layout_options(capsys):
    for argv in (["--wide", "--width", "80"], ["--width", "0"]):
        with pytest.raises(SystemExit) as e:
            runner.main(["--list", *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "argument --width" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        runner.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 25)" in out and "exit status: 0 every verdict matches the record" in out
    assert "its fields named" in out
