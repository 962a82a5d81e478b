"""The benchmark scripts' CPU paths the docs name (docs/performance.md): plot.py over the
whole results folder, and bench.py's --help listing every suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_plot_skips_json_that_is_not_a_bench_result(tmp_path):
    """`python benchmarks/plot.py benchmarks/results/*.json` (docs/performance.md): the glob
    also matches bench_gka_layer.py, bench_kla.py and fla_640_repro.py results."""
    results = ROOT / "benchmarks" / "results"
    paths = [
        results / "h200-run1-forward-backward.json",
        results / "h200-run2-kla-koopman.json",
        results / "gka-layer-run22-bench.json",  # a dict without "rows"
        results / "kla-koopman-run4-kla.json",  # a list
        results / "fla-640-differential.json",  # "rows" without "env"
    ]
    out = tmp_path / "figures"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "plot.py"), *map(str, paths), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["perf_roofline_fraction.png", "perf_time_vs_n.png", "perf_time_vs_r.png"]
    assert proc.stderr.count("skipped") == 3


def test_plot_load_keeps_only_bench_results():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import plot
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    results = ROOT / "benchmarks" / "results"
    rows, envs = plot._load(
        [results / "h200-run1-forward-backward.json", results / "gka-layer-run22-bench.json"]
    )
    assert len(envs) == 1 and envs[0]["gpu"] == "NVIDIA H200"
    doc = json.loads((results / "h200-run1-forward-backward.json").read_text())
    assert len(rows) == sum("ms" in r for r in doc["rows"])


def test_bench_help_lists_every_suite():
    """docs/performance.md runs `--only kla,koopman`; --help names those suites."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "forward,backward,kla,koopman" in proc.stdout
