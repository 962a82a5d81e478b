"""Findings of an outside review of the command lines (defects 5 to 12), one test or more each:
usage errors are one line naming the argument with exit status 2, nothing is silently ignored,
and what the commands print or write is true."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest
from test_cli import _row

from analysis import cli, verification

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _one_line_usage_error(exc, capsys, *needles):
    """``exc`` is exit status 2 and stderr is one line naming every needle; stdout is empty."""
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    code = exc.value.code if hasattr(exc, "value") else exc
    assert code == 2, (code, err)
    assert len(lines) == 1 and "error:" in lines[0], err
    assert "Traceback" not in err and out == "", (out, err)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def fake_figure(monkeypatch):
    mod = types.ModuleType("analysis.figures.fake_fig")
    mod.NAME, mod.HELP = "fake_fig", "a fake figure for the CLI tests"
    mod.calls = []

    def run(out_dir, *, quick, recompute):
        mod.calls.append((quick, recompute, out_dir))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "fake_fig.csv").write_text("a\n1\n")
        return [out_dir / "fake_fig.csv"]

    mod.run = run
    monkeypatch.setitem(sys.modules, "analysis.figures.fake_fig", mod)
    monkeypatch.setattr(cli, "FIGURES", ["fake_fig"])
    return mod


# ------------------------------------------------------------------- 5: allowance's __main__


def test_allowance_module_runs_as_a_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-m", "analysis.studies.allowance", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert p.returncode == 0 and "usage: python -m analysis.studies.allowance" in p.stdout
    for option in ("--quick", "--full", "--recompute", "--out DIR", "(default: reports)"):
        assert option in p.stdout, option
    p = subprocess.run(
        [sys.executable, "-m", "analysis.studies.allowance", "--quick", "--full"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--full" in p.stderr


def test_allowance_main_writes_the_table(tmp_path, monkeypatch, capsys):
    from analysis.studies import allowance

    seen = []

    def survey(quick, progress=None):
        seen.append(quick)
        return [allowance.SurveyResult("gd", "float32", 0.5, "p", 3, 2, 0, 0.0, 0)]

    monkeypatch.setattr(allowance, "survey", survey)
    assert allowance.main(["--full", "--out", str(tmp_path / "a")]) == 0
    assert seen == [False] and "| gd | float32 | 0.5 | 16 | p | 3 |" in capsys.readouterr().out
    assert "| gd | float32 |" in (tmp_path / "a" / "allowance.md").read_text()


# ---------------------------------------------------------------------------- 6: gallery


def _gallery(argv):
    from analysis.figures import gallery

    return gallery.main(argv)


def test_gallery_unknown_figure_suggests_the_close_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _gallery(["gka_omga", "--out", str(tmp_path), "--docs", str(tmp_path / "gal")])
    _one_line_usage_error(exc, capsys, "'gka_omga'", "did you mean 'gka_omega'")


def test_gallery_out_must_hold_cached_data(tmp_path, capsys):
    for out, needle in ((tmp_path / "nonexist", "no such folder"), (tmp_path, "no cached")):
        with pytest.raises(SystemExit) as exc:
            _gallery(["--out", str(out), "--docs", str(tmp_path / "gal")])
        _one_line_usage_error(exc, capsys, "argument --out", needle)
    assert not (tmp_path / "gal").exists()


def _cached_gallery(tmp_path, monkeypatch):
    """A report folder with gka_omega's cache entry; rendering stubbed by a 4x4 PNG."""
    from PIL import Image

    from analysis.figures import gallery

    cache = gallery.cache_file(tmp_path / "rep", "gka_omega")
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"params": {}, "data": {}}))

    def render_stamped(render, out_dir, params, data):
        Image.new("RGB", (4, 4), "white").save(out_dir / "gka_omega.png")

    monkeypatch.setattr(gallery.C, "render_stamped", render_stamped)
    return tmp_path / "rep"


def test_gallery_unwritable_docs_is_a_usage_error(tmp_path, monkeypatch, capsys):
    out = _cached_gallery(tmp_path, monkeypatch)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exc:
        _gallery(["gka_omega", "--out", str(out), "--docs", str(tmp_path / "file" / "sub")])
    _one_line_usage_error(exc, capsys, "argument --docs")


def test_gallery_redraws_cached_and_fails_on_a_named_uncached_one(tmp_path, monkeypatch, capsys):
    out = _cached_gallery(tmp_path, monkeypatch)
    assert _gallery(["gka_omega", "--out", str(out), "--docs", str(tmp_path / "g")]) == 0
    assert (tmp_path / "g" / "gka_omega.png").is_file()
    code = _gallery(["gka_omega", "gka_fig9", "--out", str(out), "--docs", str(tmp_path / "g")])
    assert code == 1 and "skip gka_fig9" in capsys.readouterr().err


def test_gallery_help_is_whole_with_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        _gallery(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0
    assert "re-rendered at a small resolution." in out  # not cut after the first line
    assert out.count("(default: ") >= 2 and "reports)" in out and "figures)" in out


# ------------------------------------------------------------------ 7: contract_tightness


def test_contract_tightness_help_describes_every_option(capsys):
    from analysis.studies import contract_tightness

    with pytest.raises(SystemExit):
        contract_tightness.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for option, default in (("--D D", 128), ("--iters ITERS", 30), ("--systems SYSTEMS", 32)):
        text = out.split(option + " ", 1)[1].split(" --", 1)[0]
        assert f"(default: {default})" in text and len(text) > len(f"(default: {default})") + 5


# --------------------------------------------------------------------- 8: allowance table


def test_allowance_row_without_a_worst_case_says_why(monkeypatch):
    """gd in strict bf16, quick: the allowance applies only at kappa = 1, where the stored H is
    I and one step x = q is exact, so every rounding is 0: no 0 / inf / -1 placeholders."""
    from analysis.studies import allowance

    kappa_one = [p for p in allowance.survey_problems(True) if "-k1-" in p.name]
    monkeypatch.setattr(allowance, "survey_problems", lambda quick: kappa_one)
    results = allowance.survey(quick=True, methods=("gd",))
    strict = next(r for r in results if r.precision == "bfloat16/strict")
    assert strict.cases == 3 and strict.worst_ratio == 0
    row = next(
        line
        for line in allowance.as_markdown(results).splitlines()
        if line.startswith("| gd | bfloat16/strict |")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:7] == ["0", "-", "none: rounding exactly 0 in all 3 cases", "-", "3"], cells
    none = allowance.SurveyResult("gd", "x", 0.0, "", -1, 0, 5, 0.0, 0)
    assert "| - | - | none: the allowance applies to no case | - | 0 |" in allowance.as_markdown(
        [none]
    )


def test_allowance_nan_ratio_is_the_worst():
    from analysis.studies import allowance

    assert allowance._worse(float("nan"), 0.5) and not allowance._worse(1.0, float("nan"))
    assert allowance._worse(0.6, 0.5) and not allowance._worse(0.4, 0.5)


# ------------------------------------------------------------------- 9: diff, no common run


def _report(path, runs, verdict="PASS"):
    from analysis.testing import check_kernel

    path.write_text(
        json.dumps(
            {
                "format": check_kernel.FORMAT,
                "kernel": "k",
                "like": "cg",
                "strategy": "spd_nobounds",
                "reference": "solvers:cg",
                "verdict": verdict,
                "settings": {"seed": 0, "max_examples": 4, "sizes": {}, "shrink": True},
                "runs": [
                    {"precision": p, "contract": c, "verdict": verdict, "worst_ratio": 0.5}
                    for p, c in runs
                ],
            }
        )
    )
    return str(path)


def test_diff_of_reports_with_no_run_in_common_is_a_usage_error(tmp_path, capsys):
    v1 = _report(tmp_path / "v1.json", [("float32", "float32"), ("float32", "tf32")])
    bf = _report(tmp_path / "bf.json", [("bfloat16", "bfloat16/operands")])
    assert cli.main(["diff", v1, bf]) == 2
    _one_line_usage_error(2, capsys, "NEW.json", "no run in common", "bfloat16", "float32")
    other = _report(tmp_path / "o.json", [("float32", "bfloat16/storage")])
    assert cli.main(["diff", v1, other]) == 2
    _one_line_usage_error(2, capsys, "float32 / bfloat16/storage", "float32 / tf32")
    some = _report(tmp_path / "s.json", [("float32", "float32"), ("bfloat16", "float32")])
    assert cli.main(["diff", v1, some]) == 0  # one run in common: compared, the rest listed
    assert "only in NEW" in capsys.readouterr().out


# -------------------------------------------------------- 10: conflicting / repeated options


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--quick", "fake_fig", "--full"], ["--full", "--quick"]),
        (["--full", "fake_fig", "--quick"], ["--quick", "--full"]),
        (["--out", "A", "fake_fig", "--out", "B"], ["--out", "'A'", "'B'"]),
        (["fake_fig", "--out", "A", "--out", "B"], ["--out", "'A'", "'B'"]),
        (["--out", "", "fake_fig"], ["--out", "''"]),
        (["fake_fig", "--out", ""], ["--out", "''"]),
        (["--quick", "allowance", "--full"], ["--full"]),
        (["--quick", "check-kernel", "a:b", "--like", "cg"], ["--quick", "check-kernel"]),
        (["--out", "A", "diff", "a.json", "b.json"], ["--out", "diff"]),
        (["--quick", "claims", "--paper", "gka"], ["--quick", "claims"]),
        (["claims", "--full"], ["--full", "claims"]),
        (["claims", "--recompute", "--out", "A"], ["--recompute", "claims"]),
    ],
)
def test_conflicting_options_are_usage_errors(
    argv, needles, fake_figure, tmp_path, monkeypatch, capsys
):
    from analysis.studies import allowance

    monkeypatch.setattr(allowance, "survey", lambda **kw: pytest.fail("the survey ran"))
    monkeypatch.chdir(tmp_path)  # where an empty --out would write
    argv = [str(tmp_path / a) if a in ("A", "B") else a for a in argv]
    needles = [f"'{tmp_path / n[1]}'" if n in ("'A'", "'B'") else n for n in needles]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    _one_line_usage_error(exc, capsys, *needles)
    assert fake_figure.calls == [] and not list(tmp_path.iterdir())


def test_the_same_option_on_both_sides_agrees(fake_figure, tmp_path, monkeypatch):
    monkeypatch.delenv("SVT_RECOMPUTE", raising=False)
    out = str(tmp_path)
    assert cli.main(["--quick", "--out", out, "fake_fig", "--quick", "--out", out]) == 0
    assert cli.main(["--full", "--recompute", "fake_fig", "--out", out]) == 0
    assert [c[:2] for c in fake_figure.calls] == [(True, False), (False, True)]
    assert {c[2] for c in fake_figure.calls} == {tmp_path / "figures"}
    monkeypatch.delenv("SVT_RECOMPUTE")


# ------------------------------------------------------------------- 11: report's doc links


@pytest.fixture
def tiny_report(monkeypatch):
    fam = types.ModuleType("analysis.verification.fake")
    row = _row()  # tests/test_cli.py's passing row
    fam.rows = lambda quick: [row]
    monkeypatch.setitem(sys.modules, "analysis.verification.fake", fam)
    monkeypatch.setattr(verification, "FAMILIES", ["fake"])
    monkeypatch.setattr(cli, "FIGURES", [])
    runner = types.SimpleNamespace(
        run=lambda progress=None: [],
        table_rows=lambda results: [],
        format_table=lambda results: "claim  verdict",
    )
    monkeypatch.setattr(cli, "claims_runner", lambda: runner)


def test_report_links_to_the_docs_resolve_from_any_folder(tmp_path, tiny_report, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out in (tmp_path / "elsewhere" / "deep", pathlib.Path("rel")):
        assert cli.main(["report", "--quick", "--out", str(out)]) == 0
        text = (out / "report.md").read_text()
        links = re.findall(r"\]\(([^)]*docs/[a-z]+\.md)\)", text)
        assert {pathlib.Path(link).name for link in links} == {"precision.md", "claims.md"}
        for link in links:
            assert (out / link).resolve().is_file(), link


def test_report_links_from_reports_at_the_root_are_unchanged():
    for name in ("precision.md", "claims.md"):
        assert cli.docs_link(name, ROOT / "reports") == f"[docs/{name}](../docs/{name})"


def test_report_links_without_the_docs_name_them(monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "DOCS", tmp_path / "no-docs")
    assert cli.docs_link("claims.md", tmp_path) == "docs/claims.md (in the toolkit's repository)"


# ------------------------------------------------------- 12: claims' stdout, check-kernel's file


def test_claims_usage_error_prints_nothing_on_stdout(tmp_path, capsys):
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "claims.txt").write_text("the last table\n")
    assert cli.main(["claims", "--paper", "gkaa", "--out", str(tmp_path)]) == 2
    _one_line_usage_error(2, capsys, "--paper", "'gkaa'")
    assert (tmp_path / "claims" / "claims.txt").read_text() == "the last table\n"


def test_claims_output_ends_without_a_blank_line(tmp_path, monkeypatch, capsys):
    def main(argv, *, prog):
        print("claim  verdict\nlemma3 holds")
        return 0

    monkeypatch.setattr(cli, "claims_runner", lambda: types.SimpleNamespace(main=main))
    assert cli.main(["claims", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "claim  verdict\nlemma3 holds\n"


def test_check_kernel_file_spec_errors_name_the_file(tmp_path):
    from analysis.testing import check_kernel

    f = tmp_path / "my_kernels.py"
    f.write_text("x = 1\n")
    for attr, needle in (("nofn", "has no attribute 'nofn'"), ("x", "is not callable")):
        with pytest.raises(check_kernel.UsageError) as exc:
            check_kernel.load_kernel(f"{f}:{attr}")
        message = str(exc.value)
        assert "_svt_checked" not in message and "my_kernels.py" in message and needle in message
