"""The claim catalogue under the deterministic CI profile: every observed verdict is the recorded one.

Runs ``proofs_check.runner.run`` over every claim (per paper, so a failure names its paper) with
half the profile's examples, and checks the CLI, the table, the registry's bookkeeping and the
strategies users get from ``analysis.testing.strategies`` (bf16, ridge).
"""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import proofs_check
from analysis.precision import gamma
from analysis.testing.strategies.bf16 import bf16_floats, bf16_tensors, is_bf16, to_bf16
from analysis.testing.strategies.ridge import eigenvalue_bounds, gka_sequences, gka_systems
from proofs_check import declare, registry, runner
from proofs_check.claim import CORRECTED, EXTENSION, FAILS, HOLDS, PRINTED, WORKING, Measurement

PAPERS = ("gka", "kla", "echo", "gates")


def _examples() -> int:
    return max(2, settings().max_examples // 2)


@pytest.mark.parametrize("paper", PAPERS)
def test_every_verdict_is_the_recorded_one(paper):
    results = runner.run(paper, examples=_examples())
    bad = [r for r in results if not r.matches]
    assert results
    assert not bad, runner.format_table(bad)


def test_printed_forms_fail_with_their_stored_counterexample_first():
    # a printed form's stored @example alone decides it: one case, no search
    for claim in registry.all_claims():
        if claim.form == PRINTED and claim.expected == FAILS and claim.examples:
            r = runner.run_claim(claim, claim.precisions[0], examples=1, shrink=False)
            assert r.verdict == FAILS, (
                f"{claim.id}: stored counterexample no longer fails ({r.message})"
            )


def test_registry_bookkeeping():
    claims = registry.all_claims()
    ids = [c.id for c in claims]
    assert len(ids) == len(set(ids))
    for c in claims:
        assert c.source and c.statement and c.quantity, c.id
        assert c.precisions and all(p in ("mp",) + WORKING for p in c.precisions), c.id
        if c.twin is not None:
            twin = registry.get(c.twin)
            assert c.form in (PRINTED, CORRECTED), c.id
            if c.form == CORRECTED:
                assert twin.expected_for(twin.precisions[0]) == FAILS, c.id
        if c.form == PRINTED and c.expected == FAILS:
            assert c.twin is not None, f"{c.id}: a printed form that fails needs its corrected twin"
            assert c.examples, f"{c.id}: a printed form that fails keeps its counterexample"
        if c.form == EXTENSION:
            assert c.expected in (HOLDS, FAILS)
    assert {u.paper for u in registry.uncheckable()} == set(PAPERS)


def test_main_exit_status_and_table(capsys, monkeypatch):
    assert (
        runner.main(
            [
                "--claim",
                "gka.lemma3",
                "--claim",
                "gka.chunk_matvec",
                "--examples",
                "2",
                "--precision",
                "mp",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "gka.lemma3" in out and "fails as printed (wording), corrected form holds" in out
    claim = registry.get("gka.lemma3")
    monkeypatch.setitem(registry._CLAIMS, "gka.lemma3", dataclasses.replace(claim, expected=FAILS))
    assert runner.main(["--claim", "gka.lemma3", "--examples", "2", "--precision", "mp"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_list_filters_and_rows(capsys):
    assert runner.main(["--list", "--paper", "kla"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed and all(line.startswith("kla.") for line in listed)
    rows = runner.table_rows(runner.run(claims=["gates.softplus"], examples=2, precisions=["mp"]))
    assert {r["claim"] for r in rows} == {"gates.softplus.printed", "gates.softplus.corrected"}
    assert {"claim", "source", "precision", "cases", "worst", "bound", "verdict", "matches"} <= set(
        rows[0]
    )
    with pytest.raises(ValueError, match="unknown claim"):
        runner.run(claims=["no.such.claim"])
    with pytest.raises(ValueError, match="unknown precision"):
        runner.run(claims=["gka.lemma3"], precisions=["float16"])


def test_public_api():
    assert proofs_check.run is runner.run and proofs_check.main is runner.main
    assert len(proofs_check.all_claims()) == len(registry.all_claims())


# ------------------------------------------------------------------------ user strategies


@given(bf16_floats(-3.0, 3.0))
def test_bf16_floats_are_bf16(x):
    assert -3.0 <= x <= 3.0 and to_bf16(x) == x


@given(bf16_tensors((3, 2), min_value=-1.0, max_value=1.0))
def test_bf16_tensors_round_trip(t):
    assert t.shape == (3, 2) and t.dtype == torch.float64 and is_bf16(t)


@given(gka_sequences(max_T=3, max_dim=3, with_H0=True))
def test_gka_sequences_are_gka_regressions(seq):
    assert all(g <= 0.0 for g in seq.log_gates)
    for t in range(1, seq.T + 1):  # lambda_t > 0 and eq. (4)'s bound
        H = seq.H(t)
        fro = float(torch.linalg.matrix_norm(H))
        assert fro > 0
        A = H + seq.a * fro * torch.eye(seq.D, dtype=H.dtype)
        ev = torch.linalg.eigvalsh(A)
        # float64, Higham's gamma_n (u = 2^-53), Weyl for each perturbation: H_t's recurrence
        # (exp, scaling, sum per step; bf16 outer products exact) is within gamma_{3T+2} tr(H) of a
        # PSD matrix in the 2-norm; A's diagonal and eigvalsh (LAPACK, p(D) = D) add (D + 1) u ||A||;
        # both ends move by that, relative to lam_min; ||H||_F, lambda, (a + 1)/a and the ratio:
        # gamma_{D^2 + 4}. At most 4e-13 here (D, T <= 3, a >= 0.01)
        u = 2.0**-53
        move = gamma(3 * seq.T + 2, u) * float(torch.trace(H)) + (seq.D + 1) * u * float(ev[-1])
        slack = 2 * move / float(ev[0]) + gamma(seq.D**2 + 4, u)
        assert float(ev[-1] / ev[0]) <= (seq.a + 1) / seq.a * (1 + slack)
        assert all(is_bf16(seq.tensor(n)) for n in ("keys", "queries", "cotangents"))


@given(gka_systems(max_dim=3), eigenvalue_bounds(max_kappa=100.0))
def test_gka_systems_and_bounds(sysc, bounds):
    assert float(torch.linalg.matrix_norm(sysc.H())) > 0
    L, mu = bounds
    # the strategy steps L until fl(L / mu) <= max_kappa: the same division, no tolerance
    assert L > mu > 0 and L / mu <= 100.0 and not math.isnan(L)


def test_claims_md_lists_every_claim():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "claims.md").read_text()
    missing = [c.id for c in registry.all_claims() if f"`{c.id}`" not in text]
    missing += [u.id for u in registry.uncheckable() if f"`{u.id}`" not in text]
    assert not missing, (
        f"regenerate docs/claims.md (python -m proofs_check --write-docs): {missing}"
    )


# ------------------------------------------------------------------ declaring claims: @claim and erratum()


def _toy_factory(form):
    def check(case, impl, prec):
        return Measurement(float(case), 0.0 if form == "printed" else 1.0)

    return check


def test_claim_decorator_takes_the_docstring_as_statement(monkeypatch):
    monkeypatch.setattr(registry, "_CLAIMS", {})
    claim, _ = declare.for_paper("kla", implementation=dict)

    @claim("kla.toy", source="nowhere", quantity="the case", strategy=lambda: st.just(0.5))
    def check(case, impl, prec):
        """The toy statement,
        over two lines."""
        return Measurement(case, 1.0)

    c = registry._CLAIMS["kla.toy"]
    assert (
        c.statement == "The toy statement, over two lines."
        and c.check is check
        and c.paper == "kla"
    )
    assert c.file == "tests/test_proofs_check.py"
    with pytest.raises(ValueError, match="registered twice"):
        claim("kla.toy", source="s", quantity="q", strategy=lambda: st.just(0.5))(check)

    def undocumented(case, impl, prec):
        return Measurement(case, 1.0)

    with pytest.raises(ValueError, match="no docstring"):
        claim("kla.toy2", source="s", quantity="q", strategy=lambda: st.just(0.5))(undocumented)


def test_erratum_registers_linked_twins(monkeypatch):
    monkeypatch.setattr(registry, "_CLAIMS", {})
    _, erratum = declare.for_paper("kla", implementation=dict)
    erratum(
        declare.Twin("kla.toy.printed", source="p", statement="printed", examples=(0.5,), note="n"),
        declare.Twin(
            "kla.toy.corrected", source="c", statement="corrected", quantity="own quantity"
        ),
        check=_toy_factory,
        strategy=lambda: st.just(0.5),
        quantity="shared quantity",
        precisions=("mp", "float64"),
    )
    p, c = registry._CLAIMS["kla.toy.printed"], registry._CLAIMS["kla.toy.corrected"]
    assert (p.form, p.expected, p.twin, p.examples, p.quantity) == (
        PRINTED,
        FAILS,
        c.id,
        (0.5,),
        "shared quantity",
    )
    assert (c.form, c.expected, c.twin, c.examples, c.quantity) == (
        CORRECTED,
        HOLDS,
        p.id,
        (),
        "own quantity",
    )
    assert p.precisions == c.precisions == ("mp", "float64") and p.strategy is c.strategy
    assert not p.check(0.5, {}, "mp").ok and c.check(0.5, {}, "mp").ok
    with pytest.raises(ValueError, match="counterexample"):
        erratum(
            declare.Twin("kla.toy2.printed", source="p", statement="s"),
            declare.Twin("kla.toy2.corrected", source="c", statement="s"),
            check=_toy_factory,
            strategy=lambda: st.just(0.5),
            quantity="q",
        )


def test_every_claim_names_its_file():
    for c in registry.all_claims():
        assert c.file.startswith("proofs_check/claims/") and c.file.endswith(".py"), (c.id, c.file)


def test_not_checkable_reads_statement_and_reason(monkeypatch):
    monkeypatch.setattr(registry, "_UNCHECKABLE", {})
    declare.not_checkable(
        "kla.toy",
        paper="kla",
        source="s",
        text="""
        A statement over
        two lines.

        Why: no computation decides it.""",
    )
    u = registry._UNCHECKABLE["kla.toy"]
    assert (u.statement, u.reason) == ("A statement over two lines.", "no computation decides it.")
    with pytest.raises(ValueError, match="Why"):
        declare.not_checkable("kla.toy2", paper="kla", source="s", text="Only a statement.")


def test_old_kla_claims_path_warns_and_reexports():
    import importlib
    import sys

    from proofs_check.claims import kla

    for name in ("analysis.kla_claims", "proofs_check.kla_gaps"):
        sys.modules.pop(name, None)
        try:
            with pytest.warns(DeprecationWarning, match="proofs_check.claims.kla"):
                old = importlib.import_module(name)
            assert old.proposition5_gap is kla.proposition5_gap
        finally:  # so that the next import of the old name warns again
            sys.modules.pop(name, None)
