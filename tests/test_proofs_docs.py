"""The catalogue is the one source of truth: docs/claims.md and docs/errata.md are generated from it
(and fail here when stale), every failing printed claim has exactly one erratum story with a severity,
every substantive or numerical erratum has its size at the paper's sizes, the README quotes the
headline count, the coverage pass names registered checks, and the CLI's usage errors are one line
with exit status 2. Also: a replayed search reaches the fresh search's verdict, and a changed check is
never hidden by a recording.
"""

import dataclasses
import pathlib
import subprocess
import sys

import pytest

from proofs_check import coverage, docs, errata, registry, replay, runner, search
from proofs_check.claim import FAILS, PRINTED, Measurement

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_generated_docs_are_current():
    assert not docs.stale(), "regenerate with `python -m proofs_check --write-docs`"


def test_measurements_cover_every_run():
    record = docs.load_measurements()
    runs = {f"{c.id}|{p}" for c in registry.all_claims() for p in c.precisions}
    assert set(record["runs"]) == runs, "regenerate with `python -m proofs_check --write-docs`"


def test_every_failing_claim_has_one_story_and_every_story_a_claim():
    assert errata.check(registry.all_claims()) == []
    text = docs.ERRATA_MD.read_text()
    for e in errata.ERRATA:
        assert text.count(f"<!-- story: {e.slug} -->") == 1, e.slug
    stories = {key for kind, key in docs.parse_bodies(text) if kind == "story"}
    assert stories == {e.slug for e in errata.ERRATA}


def test_errata_check_catches_bookkeeping_errors():
    claims = registry.all_claims()
    victim = errata.ERRATA[0]
    broken = [
        dataclasses.replace(victim, severity="serious"),
        dataclasses.replace(errata.ERRATA[1], magnitude=""),
    ]
    saved = errata.ERRATA
    try:
        errata.ERRATA = tuple(broken) + saved[2:]
        problems = errata.check(claims)
    finally:
        errata.ERRATA = saved
    assert any("unknown severity" in p for p in problems)
    assert any("needs its magnitude" in p for p in problems)
    orphan = dataclasses.replace(
        registry.get("gka.lemma3"), expected=FAILS, id="gka.orphan.printed"
    )
    assert any(
        "gka.orphan.printed has no erratum story" in p for p in errata.check(claims + [orphan])
    )


def test_headline_counts_substantive_and_numerical_only():
    n = docs.counts()
    failing = [c for c in registry.all_claims() if c.form == PRINTED and c.expected == FAILS]
    assert sum(n.values()) == len(failing)
    assert docs.headline().startswith(f"{n['substantive'] + n['numerical']} fail as printed")


def test_readme_quotes_the_headline():
    readme = (ROOT / "README.md").read_text()
    assert docs.headline() in readme, (
        "README.md's 'What we found' must quote proofs_check.docs.headline()"
    )


def test_coverage_pass_names_registered_checks():
    ids = {c.id for c in registry.all_claims()}
    for p in coverage.PASSES:
        assert p.area in coverage.AREAS, p
        missing = [c for c in p.claims if c not in ids]
        assert not missing, (p.paper, p.area, missing)
    assert {p.paper for p in coverage.PASSES} == {"gka", "kla", "echo", "gates"}


# ---------------------------------------------------------------------------------- CLI


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "proofs_check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--claim", "zzz"), "did you mean"),
        (("--claim", "gka.lema3"), "did you mean 'gka.lemma3'"),
        (("--examples", "-3"), "--examples"),
        (("--examples", "0"), "--examples"),
        (("--jobs", "0"), "--jobs"),
        (("--seed", "-1"), "--seed"),
        (("--seed", "1", "--random"), "exclude each other"),
        (("--seed", "1", "--write-docs"), "--seed"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args, needle):
    out = _cli(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert out.stdout == ""


def test_a_seed_draws_other_cases_the_same_on_every_run():
    """``seed``: reproducible (same seed, same cases and worst value) and not the default search
    (another seed, or none, draws other cases); a bad seed is a ValueError naming it."""
    claim = registry.get("gka.lemma1")

    def worst(**kw):
        r = search.run_claim(claim, "float64", examples=4, shrink=False, **kw)
        return r.tried, r.worst.value

    assert worst(seed=3) == worst(seed=3)
    assert len({worst(seed=3), worst(seed=4), worst()}) == 3
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="seed"):
            search.run_claim(claim, "float64", examples=1, seed=bad)
    with pytest.raises(ValueError, match="seed"):
        runner.run(claims=["gka.lemma1"], seed=-2)


def test_run_rejects_nonpositive_examples():
    with pytest.raises(ValueError, match="examples"):
        runner.run(claims=["gka.lemma3"], examples=0)


# ------------------------------------------------------------------------------- replay


def test_replay_reaches_the_fresh_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("SVT_CACHE_DIR", str(tmp_path))
    ids = ["gka.chunk_matvec", "kla.prop2", "gates.softplus"]
    fresh = runner.run(claims=ids, examples=4, cache=False)
    recorded = runner.run(claims=ids, examples=4)
    replayed = runner.run(claims=ids, examples=4)
    assert all(r.extra.get("replayed") for r in replayed)
    for rows in (runner.table_rows(recorded), runner.table_rows(replayed)):
        for a, b in zip(runner.table_rows(fresh), rows):
            a, b = dict(a, seconds=0), dict(b, seconds=0)
            assert a == b


def test_a_changed_check_is_not_hidden_by_the_recording(tmp_path, monkeypatch):
    monkeypatch.setenv("SVT_CACHE_DIR", str(tmp_path))
    assert runner.run(claims=["gka.lemma3"], examples=4, precisions=["mp"])[0].matches  # records
    claim = registry.get("gka.lemma3")
    broken = dataclasses.replace(
        claim, check=lambda case, impl, prec: Measurement(2.0, 1.0, "broken")
    )
    monkeypatch.setitem(registry._CLAIMS, "gka.lemma3", broken)
    calls = replay.load("gka.lemma3", "mp", (4, True, True))
    assert calls and replay.replay(broken, "mp", calls, {}, search.violation_message) is None
    r = runner.run(claims=["gka.lemma3"], examples=4, precisions=["mp"])[0]
    assert r.verdict == FAILS and not r.matches and not r.extra.get("replayed")


def test_parallel_run_matches_serial(tmp_path, monkeypatch):
    monkeypatch.setenv("SVT_NO_CACHE", "1")
    ids = ["gka.lemma3", "kla.prop1"]
    serial = runner.table_rows(runner.run(claims=ids, examples=3, jobs=1))
    parallel = runner.table_rows(runner.run(claims=ids, examples=3, jobs=2))
    assert [dict(r, seconds=0) for r in serial] == [dict(r, seconds=0) for r in parallel]


# --------------------------------------------------------------------------- magnitudes


def test_every_magnitude_command_names_a_computation():
    from proofs_check import magnitudes

    for e in errata.ERRATA:
        if e.command:
            name = e.command.split()[-1]
            assert (
                e.command == f"{errata.MAGNITUDE_COMMAND} {name}" and name in magnitudes.MAGNITUDES
            ), e.slug


def test_cheap_magnitudes_match_the_catalogue(capsys):
    from proofs_check import magnitudes

    assert magnitudes.main(["echo_complexity", "gates_scale"]) == 0
    out = capsys.readouterr().out
    assert "T=2048: cost(2T) / cost(T) = 2\n" in out and "T=65536: cost(2T) / cost(T) = 2\n" in out
    assert "statistics cost T r^2 / printed T-term T r^2/S: 64 (= S)" in out
    assert "alpha=0.99 (z=9.95): |phi'|/phi^2 = 0.00203" in out
    by_slug = {e.slug: e for e in errata.ERRATA}
    assert "S = 64 times smaller than the statistics cost" in by_slug["echo-complexity"].magnitude
    assert "2.0e-3 against the printed 20" in by_slug["gates-balanced-scale"].magnitude
    with pytest.raises(SystemExit) as exc:
        magnitudes.main(["no_such"])
    assert exc.value.code == 2
