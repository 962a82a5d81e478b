"""Review findings on ``python -m proofs_check``: the record reproduces, an empty selection is a
usage error, ``--impl`` merges over the claims' own mappings and reports an inconclusive run as
such (exit status 3), every erratum has a size at the paper's sizes (or says why none applies)
printed by its command, and a closed pipe ends the output quietly."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import solvers
from proofs_check import contract_route, docs, errata, magnitudes, registry, runner
from proofs_check.claim import HOLDS, Measurement, Result

ROOT = pathlib.Path(__file__).resolve().parents[1]

# implementation mappings for --impl (this module is importable as test_proofs_check_review)
ONLY_CHEBYSHEV = {"chebyshev": solvers.chebyshev}
EMPTY = {}
MISSPELT = {"chebyshevv": solvers.chebyshev}


def _usage_error(capsys, argv) -> str:
    """The one line of a usage error (exit status 2, as SystemExit or as main's return value)."""
    try:
        code = runner.main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and "error:" in err[0], err
    return err[0]


# ------------------------------------------------------------------- A: the record reproduces


@pytest.mark.parametrize("claim_id", ["gka.alg2.corrected", "gka.lemma2.dH_gap"])
def test_recorded_numbers_are_those_of_a_fresh_run(claim_id):
    """docs/claims.md's measured column (proofs_check/measured.json) is a fresh deterministic run's:
    these two had gone stale (float32 2.52e-07 / 1.24e-4 and 27.6 / 27.6 recorded)."""
    record = docs.load_measurements()
    results = runner.run(claims=[claim_id], jobs=1, cache=False, examples=record["examples"])
    fresh = docs.record_measurements(results, record["examples"])["runs"]
    # the claim's whole record, not the fresh keys' part of it: an empty run passed vacuously
    recorded = {k: v for k, v in record["runs"].items() if k.split("|")[0] == claim_id}
    assert recorded and fresh == recorded


# --------------------------------------------------------------- B: an empty selection


def test_paper_and_claim_that_select_nothing_are_a_usage_error(capsys):
    line = _usage_error(capsys, ["--paper", "kla", "--claim", "gka.eq4"])
    assert "--paper kla" in line and "--claim gka.eq4" in line
    line = _usage_error(capsys, ["--list", "--paper", "kla", "--claim", "gka.eq4"])
    assert "--paper kla" in line


def test_a_precision_the_claim_does_not_run_in_is_a_usage_error(capsys):
    line = _usage_error(capsys, ["--claim", "gka.eq4", "--precision", "bfloat16/strict"])
    assert "--claim gka.eq4" in line and "--precision bfloat16/strict" in line
    assert "bfloat16/storage" in line  # what it does run in


# ------------------------------------------------------------------------------ C: --impl


def test_inconclusive_is_not_a_changed_verdict(capsys, monkeypatch):
    """A run on an implementation under test with a vacuous bound: 'inconclusive', not MISMATCH,
    exit status 3 (the harness's convention); a real change still exits 1."""

    def fake(claim, precision, **kw):
        verdict = contract_route.INCONCLUSIVE if precision == "bfloat16/strict" else HOLDS
        return Result(claim, precision, 3, Measurement(0.1, 0.2), verdict, message="1 of 3 vacuous")

    monkeypatch.setattr(runner, "run_claim", fake)
    argv = ["--claim", "gka.alg1", "--impl", "test_proofs_check_review:ONLY_CHEBYSHEV"]
    assert runner.main(argv) == 3
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and "inconclusive (recorded: holds)" in out
    assert "0 differ from the record, 1 inconclusive" in out
    claim = registry.get("gka.alg1")
    failed = Result(claim, "float32", 3, Measurement(1.0, 0.5), "fails")
    vague = Result(claim, "bfloat16/strict", 3, None, contract_route.INCONCLUSIVE)
    assert runner.exit_status([vague]) == 3 and runner.exit_status([vague, failed]) == 1


def test_impl_replaces_only_the_functions_it_provides(capsys):
    """A mapping with one function runs (the mpmath references, ridge_mp among them, stay the
    toolkit's): no KeyError rows."""
    argv = ["--claim", "gka.alg1", "--precision", "mp", "--precision", "float64"]
    argv += ["--examples", "2", "--impl", "test_proofs_check_review:ONLY_CHEBYSHEV"]
    assert runner.main(argv) == 0
    out = capsys.readouterr().out
    assert "KeyError" not in out and "error" not in out


@pytest.mark.parametrize(
    "name, named",
    [("EMPTY", "provides none of the functions"), ("MISSPELT", "chebyshevv")],
)
def test_impl_that_replaces_nothing_is_a_usage_error(capsys, name, named):
    line = _usage_error(
        capsys, ["--claim", "gka.alg1", "--impl", f"test_proofs_check_review:{name}"]
    )
    assert "--impl" in line and named in line
    assert "chebyshev" in line and "gka_ridge" in line  # the functions it could provide


def test_impl_is_documented_in_help_and_claims_md(capsys):
    with pytest.raises(SystemExit):
        runner.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "merged over each claim's own mapping" in text
    assert "gka: " in text and " chebyshev," in text and "kla: " in text
    assert "3 no verdict differs but some run is inconclusive" in text
    md = docs.CLAIMS_MD.read_text()
    assert "## Testing your implementation (`--impl`)" in md
    assert "| GKA (Gated KalmaNet) | `chebyshev`, " in md and "--impl my_impl:IMPL" in md


# ---------------------------------------------------------------------------- D: errata sizes


def test_every_erratum_has_a_size_or_says_why_none_applies():
    for e in errata.ERRATA:
        assert e.magnitude, e.slug
        if e.magnitude.startswith(errata.NO_SIZE):
            assert not e.headline, e.slug
        else:
            assert e.command.startswith(errata.MAGNITUDE_COMMAND + " "), e.slug
            assert e.command.split()[-1] in magnitudes.MAGNITUDES, e.slug
    index = docs.ERRATA_MD.read_text().split("## Index")[1].split("\n## ")[0]
    rows = [line for line in index.splitlines() if line.startswith("| [")]
    assert len(rows) == len(errata.ERRATA) and not [r for r in rows if r.endswith("| - |")]


def test_errata_check_wants_a_command_for_every_size():
    import dataclasses

    victim = next(e for e in errata.ERRATA if e.slug == "gates-sigmoid-ratio")
    saved = errata.ERRATA
    try:
        errata.ERRATA = tuple(
            dataclasses.replace(e, command="") if e is victim else e for e in saved
        )
        problems = errata.check(registry.all_claims())
    finally:
        errata.ERRATA = saved
    assert any("gates-sigmoid-ratio" in p and "command" in p for p in problems), problems


# each magnitude newly given a command: a line it prints, and the figure the catalogue quotes
PRINTED_SIZES = {
    "gka_eq24": ("printed: relative error of the w_t H_t parts of dG_1..dG_C+1: 2\n", "exactly 2"),
    "gates_softplus": ("no correct digit from z: -37.4\n", "below z = -37.4"),
    "gates_sigmoid_ratio": ("(printed 100): 25.25\n", "25.25x"),
    "gates_log_domain": (
        "float32: log phi as printed is -inf for |z| <=: 0.000244 (0.00019 of N(0, 1) pre-activations)\n",
        "2^-12 = 2.4e-4 in float32 (1.9e-4 of N(0, 1) pre-activations)",
    ),
    "echo_state_size": (
        "1,110,256 B = 1084 KiB = 1.06 MiB, 14.1x",
        "1,110,256 B = 1084 KiB (14.1x",
    ),
    "echo_rotation": (
        "sigma_min(R) (printed 1): 0.5\n",
        "sigma_min(R) = 0.5 against the printed 1",
    ),
}


def test_new_magnitude_commands_print_the_catalogued_sizes(capsys):
    assert magnitudes.main(sorted(PRINTED_SIZES)) == 0
    out = capsys.readouterr().out
    by_command = {e.command.split()[-1]: e for e in errata.ERRATA if e.command}
    for name, (printed, catalogued) in PRINTED_SIZES.items():
        assert f"{name}: " in out and printed in out, (name, out)
        assert catalogued in by_command[name].magnitude, name
    by_slug = {e.slug: e for e in errata.ERRATA}
    assert "12.1x" in by_slug["echo-state-size"].magnitude  # the 180M model, 951,648 B


# --------------------------------------------------------------------------- E: closed pipe


@pytest.mark.parametrize(
    "argv", [["proofs_check", "--list"], ["proofs_check.magnitudes", "echo_flops"]]
)
def test_a_closed_pipe_ends_the_output_quietly(argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    proc.stdout.close()  # the reader goes away before anything is written (`| head` done early)
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141
