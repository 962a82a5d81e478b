"""``python -m analysis``: subcommands, flags, files written, verdicts, discovery of figures."""

from __future__ import annotations

import csv
import json
import sys
import types

import pytest
from verification_support import fake_row, install_fake_family

from analysis import cli, verification


def _row(**kw):
    return fake_row(**kw)


@pytest.fixture
def fake_family(monkeypatch):
    """A family module ``analysis.verification.fake`` whose rows the test chooses."""
    return install_fake_family(monkeypatch, "fake", _row())


@pytest.fixture
def fake_figure(monkeypatch):
    mod = types.ModuleType("analysis.figures.fake_fig")
    mod.NAME, mod.HELP = "fake_fig", "a fake figure for the CLI tests"
    mod.calls = []

    def run(out_dir, *, quick, recompute):
        mod.calls.append((quick, recompute))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "fake_fig.png").write_bytes(b"png")
        (out_dir / "fake_fig.csv").write_text("a\n1\n")
        (out_dir / "fake_fig_paper.md").write_text(
            "| quantity | paper | ours |\n| --- | --- | --- |\n| R | 0.7253 | 0.7253 |\n"
        )
        return [out_dir / "fake_fig.png", out_dir / "fake_fig.csv", out_dir / "fake_fig_paper.md"]

    mod.run = run
    monkeypatch.setitem(sys.modules, "analysis.figures.fake_fig", mod)
    monkeypatch.setattr(cli, "FIGURES", ["fake_fig"])
    return mod


@pytest.fixture
def fake_claims(monkeypatch):
    """A ``proofs_check.runner`` stand-in: ``main`` records its arguments, ``run`` gives one
    result per entry of ``RESULTS`` (claim id, matches the record)."""
    runner = types.SimpleNamespace(seen=[], RESULTS=[("gka.lemma3", True)])

    def main(argv, *, prog):
        runner.seen.append(list(argv))
        if "--help" in argv:
            print(f"usage: {prog} [--paper PAPER]")
            raise SystemExit(0)
        print("claim  verdict\nlemma3 holds")
        return 0

    def run(progress=None):
        runner.seen.append("run")
        return list(runner.RESULTS)

    runner.main, runner.run = main, run
    runner.table_rows = lambda results: [
        {
            "claim": c,
            "source": "GKA App. D.1, Lemma 3",
            "precision": "mp",
            "cases": 25,
            "worst": 0.5,
            "bound": 1.0,
            "verdict": "holds",
            "verdict_text": "holds",
            "expected": "holds",
            "matches": m,
        }
        for c, m in results
    ]
    runner.format_table = lambda results: (
        "claim  verdict\n" + "\n".join(f"{c} holds" for c, _ in results)
    )
    monkeypatch.setattr(cli, "claims_runner", lambda: runner)
    return runner


def test_verify_writes_table_files_and_prints(tmp_path, fake_family, capsys):
    assert cli.main(["verify", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "forward" in out and "holds" in out
    d = tmp_path / "verification"
    rows = list(csv.DictReader((d / "verification.csv").open()))
    assert rows[0]["solver"] == "fake" and rows[0]["verdict"] == "holds"
    # rounding / the applicable bound: the same float64 division, and csv writes repr(float),
    # which reads back exactly: no tolerance
    assert float(rows[0]["rounding_ratio"]) == 1e-7 / 1e-4
    payload = json.loads((d / "verification.json").read_text())
    assert payload["rows"][0]["verdict"] == "holds"
    assert "| fake | float32 |" in (d / "verification.md").read_text()


@pytest.mark.parametrize(
    "row,verdict,code",
    [
        (dict(rounding=1e-3), "FAILS (rounding)", 1),
        (dict(truncation=0.3), "FAILS (truncation)", 1),
        (dict(rounding=0.5, rounding_bound=2.0), "no guarantee", 0),
        (
            dict(rounding=0.05, rounding_bound=2.0, running_bound=0.1, running_ratio=0.5),
            "holds (running bound)",
            0,
        ),
        (
            dict(rounding=0.05, rounding_bound=2.0, running_bound=0.1, running_ratio=1.5),
            "FAILS (running bound)",
            1,
        ),
        (
            dict(rounding=0.5, rounding_bound=2.0, running_bound=3.0, running_ratio=0.5),
            "no guarantee",
            0,
        ),
    ],
)
def test_verdicts_and_exit_code(tmp_path, fake_family, row, verdict, code):
    fake_family.ROWS = [_row(**row)]
    assert cli.verdict(fake_family.ROWS[0]) == verdict
    assert cli.main(["verify", "--out", str(tmp_path)]) == code


def test_a_family_that_raises_is_reported_not_fatal(tmp_path, monkeypatch, capsys):
    mod = types.ModuleType("analysis.verification.broken")
    mod.rows = lambda quick: 1 / 0
    monkeypatch.setitem(sys.modules, "analysis.verification.broken", mod)
    monkeypatch.setattr(verification, "FAMILIES", ["broken"])
    assert cli.main(["verify", "--out", str(tmp_path)]) == 1
    assert "ZeroDivisionError" in (tmp_path / "verification" / "verification.md").read_text()


def test_report_runs_verify_figures_claims(tmp_path, fake_family, fake_figure, fake_claims, capsys):
    assert cli.main(["--quick", "--out", str(tmp_path)]) == 0  # report is the default command
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Verification report")
    assert "| fake | float32 | 1 | 1 | 0 | 0 |" in report  # summary per solver and precision
    assert "![fake_fig](figures/fake_fig.png)" in report and "figures/fake_fig.csv" in report
    assert "| R | 0.7253 | 0.7253 |" in report  # the paper's values next to ours, inlined
    assert (
        "| gka.lemma3 | GKA App. D.1, Lemma 3 | mp | 25 | 0.5 | 1 | holds |" in report
    )  # the claims table
    assert "0 differ from the record" in report
    assert "gka.lemma3 holds" in (tmp_path / "claims" / "claims.txt").read_text()
    assert json.loads((tmp_path / "claims" / "claims.json").read_text())[0]["claim"] == "gka.lemma3"
    assert fake_figure.calls == [(True, False)]
    assert fake_claims.seen == ["run"]


def test_report_fails_when_a_claim_differs_from_the_record(
    tmp_path, fake_family, fake_claims, monkeypatch
):
    monkeypatch.setattr(cli, "FIGURES", [])
    fake_claims.RESULTS = [("gka.lemma3", True), ("gka.lemma4", False)]
    assert cli.main(["report", "--out", str(tmp_path)]) == 1
    report = (tmp_path / "report.md").read_text()
    assert "1 differ from the record" in report and "**MISMATCH**" in report


def test_report_says_when_kernels_were_not_validated(
    tmp_path, fake_family, fake_claims, monkeypatch
):
    monkeypatch.setattr(cli, "FIGURES", [])
    monkeypatch.setattr(verification, "FAMILIES", ["fake", "kernels"])
    monkeypatch.setattr(cli, "_cuda_available", lambda: False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert cli.main(["report", "--quick", "--out", str(tmp_path)]) == 0
    assert "Kernel validation: no GPU" in (tmp_path / "report.md").read_text()


def test_report_without_proofs_check(tmp_path, fake_family, monkeypatch):
    monkeypatch.setattr(cli, "FIGURES", [])
    monkeypatch.setattr(cli, "claims_runner", lambda: None)
    assert cli.main(["report", "--out", str(tmp_path)]) == 0
    assert "proofs_check is not available" in (tmp_path / "report.md").read_text()


def test_figure_subcommand_and_flags(tmp_path, fake_figure, monkeypatch, capsys):
    monkeypatch.delenv("SVT_RECOMPUTE", raising=False)
    assert cli.main(["fake_fig", "--full", "--recompute", "--out", str(tmp_path)]) == 0
    assert fake_figure.calls == [(False, True)]
    assert str(tmp_path / "figures" / "fake_fig.png") in capsys.readouterr().out
    import os

    assert os.environ.get("SVT_RECOMPUTE") == "1"  # ground truth recomputes too
    monkeypatch.delenv("SVT_RECOMPUTE")


def test_figure_that_raises_fails_the_command(tmp_path, fake_figure):
    fake_figure.run = lambda out_dir, *, quick, recompute: 1 / 0
    assert cli.main(["fake_fig", "--out", str(tmp_path)]) == 1


def test_claims_subcommand_passes_arguments_through(tmp_path, fake_claims, capsys):
    assert cli.main(["claims", "--out", str(tmp_path), "--paper", "gka"]) == 0
    assert fake_claims.seen == [["--paper", "gka"]]
    assert "lemma3 holds" in capsys.readouterr().out


def test_claims_help_is_the_runners(tmp_path, fake_claims, capsys):
    assert cli.main(["claims", "--help", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m analysis claims [--paper PAPER]" in out and "--out DIR" in out
    assert not (tmp_path / "claims" / "claims.txt").exists()  # a help text is not a claims table


def test_claims_unavailable(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "claims_runner", lambda: None)
    assert cli.main(["claims", "--out", str(tmp_path)]) == 0
    assert "not available" in capsys.readouterr().out


def test_unknown_arguments_are_rejected(tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["verify", "--bogus", "--out", str(tmp_path)])


def test_help_lists_subcommands_and_registered_figures():
    out = cli.build_parser().format_help()
    for name in ("verify", "report", "claims", "allowance"):
        assert name in out
    from analysis.figures import FIGURES

    for name in FIGURES:
        assert name in out


def test_real_verify_families_quick(tmp_path, monkeypatch):
    """The chebyshev family end to end (quick): every row holds or carries no guarantee."""
    monkeypatch.setattr(verification, "FAMILIES", ["chebyshev"])
    assert cli.main(["verify", "--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "verification" / "verification.csv").open()))
    assert {r["precision"] for r in rows} == {
        "float64",
        "float32",
        "bfloat16/storage",
        "bfloat16/strict",
    }
    assert all(r["verdict"] in ("holds", "holds (running bound)", "no guarantee") for r in rows)


def test_report_starts_with_the_top_line_and_provenance(
    tmp_path, fake_family, fake_claims, monkeypatch
):
    monkeypatch.setattr(cli, "FIGURES", [])
    fake_family.ROWS = [
        _row(),
        _row(rounding=1.0),
        _row(rounding_bound=2.0),
    ]  # holds, FAILS, no guarantee
    assert cli.main(["report", "--out", str(tmp_path)]) == 1
    report = (tmp_path / "report.md").read_text()
    top = report.split("## Summary")[0]
    assert "**Verification: 1 of 3 rows hold, 1 fail, 1 inconclusive**" in top
    assert "**Claims: 1 runs of 1 claims: 1 hold.**" in top
    assert "Produced by commit" in top and "torch" in top and "Triton" in top
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["verification"] == {"rows": 3, "held": 1, "failed": 1, "inconclusive": 1}
    assert set(summary["provenance"]) >= {"commit", "python", "torch", "triton", "device", "date"}
    assert "provenance" in json.loads((tmp_path / "verification" / "verification.json").read_text())


def test_failing_claims_are_counted_by_severity_when_the_catalogue_has_them(monkeypatch):
    from analysis.verification import topline

    rows = [
        {"claim": "a", "verdict": "fails", "matches": True},
        {"claim": "b", "verdict": "fails", "matches": True},
        {"claim": "b", "verdict": "fails", "matches": True},
        {"claim": "c", "verdict": "holds", "matches": True},
        {"claim": "d", "verdict": "fails", "matches": True, "form": "extension"},
    ]
    monkeypatch.setattr(topline, "severity_lookup", lambda: {"a": "numerical", "b": "wording"}.get)
    monkeypatch.setattr(topline, "severity_order", lambda: ("substantive", "numerical", "wording"))
    counts = topline.claim_counts(rows)
    assert counts["failing_claims"] == 2 and list(counts["failing_by_severity"].items()) == [
        ("numerical", 1),
        ("wording", 1),
    ]
    assert counts["failing_other"] == 1  # a refuted extension is no printed statement
    rows_counts = {"rows": 1, "held": 1, "failed": 0, "inconclusive": 0}
    top = " ".join(topline.markdown(rows_counts, counts, {"written": 0, "failed": 0}, 0))
    assert (
        "**1 printed statements fail** (1 numerical); beside them 1 wording; 1 other claims" in top
    )
    monkeypatch.setattr(topline, "severity_lookup", lambda: None)  # a catalogue without severities
    counts = topline.claim_counts(rows)
    assert counts["failing_by_severity"] == {"unrated": 2}
    assert "(the catalogue records no severities)" in " ".join(
        topline.markdown(rows_counts, counts, {"written": 0, "failed": 0}, 0)
    )


def test_version_and_subcommand_help_with_defaults(capsys):
    import analysis

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip().endswith(analysis.__version__)
    for command in ("verify", "report", "allowance", "gka_omega"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        out = capsys.readouterr().out
        flat = " ".join(out.split())  # argparse wraps to the terminal's width
        assert "(default: reports)" in flat and "(default on a machine without a CUDA GPU)" in flat
        description = out.split("\n\n")[1]  # the paragraph after the usage line
        assert not description.startswith("options") and description.rstrip().endswith(".")


def test_status_prints_its_name():
    from solvers import Status

    assert str(Status.CONVERGED) == "CONVERGED" and f"{Status.DIVERGED:>10}" == "  DIVERGED"
    assert (
        int(Status.CONVERGED) == 1 and Status.NONFINITE > Status.BREAKDOWN
    )  # codes and order unchanged
