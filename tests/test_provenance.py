"""What a result says produced it (``analysis.provenance.commit``): the override for copies sent
without their history, and no commit borrowed from an enclosing repository."""

from __future__ import annotations

import subprocess

import pytest

from analysis import __version__, provenance


@pytest.fixture(autouse=True)
def _fresh_cache():
    provenance.commit.cache_clear()
    yield
    provenance.commit.cache_clear()


def test_the_environment_names_the_commit_of_a_copy(monkeypatch):
    monkeypatch.setenv("SVT_COMMIT", "abc1234567")
    assert provenance.commit() == "abc1234567"


def test_a_copy_inside_another_repository_does_not_report_its_commit(tmp_path, monkeypatch):
    monkeypatch.delenv("SVT_COMMIT", raising=False)
    outer = tmp_path / "outer"
    (outer / "ignored" / "toolkit").mkdir(parents=True)
    (outer / "f").write_text("x")
    for args in (
        ["init", "-q"],
        ["add", "f"],
        ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "outer"],
    ):
        subprocess.run(["git", "-C", str(outer), *args], check=True, capture_output=True)
    monkeypatch.setattr(provenance, "_ROOT", outer / "ignored" / "toolkit")
    assert provenance.commit() == f"version {__version__}"
    # the check can fail: the outer repository's own root does report its commit
    provenance.commit.cache_clear()
    monkeypatch.setattr(provenance, "_ROOT", outer.resolve())
    assert not provenance.commit().startswith("version")
