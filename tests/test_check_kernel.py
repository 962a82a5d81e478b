"""``svt check-kernel`` and ``svt diff``: a user's kernel from a module outside the toolkit,
verdicts and exit codes, usage errors naming the argument, the JSON report, the comparison."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from analysis import cli
from analysis.testing import check_kernel, kernel_diff

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A plain-PyTorch Chebyshev iteration (GKA Algorithm 1) in float32: it meets the float32 contract.
KERNEL = textwrap.dedent('''
    import torch


    def cheb(H, q, *, L, mu, iters):
        H, q = H.float(), q.float()
        L = torch.as_tensor(L, dtype=torch.float32)[..., None]
        mu = torch.as_tensor(mu, dtype=torch.float32)[..., None]
        step, rho = 2.0 / (L + mu), (L - mu) / (L + mu)
        x_prev, x, w = torch.zeros_like(q), step * q, torch.full_like(step, 2.0)
        for _ in range(iters):
            w = 4.0 / (4.0 - rho**2 * w)
            r = (H @ x[..., None])[..., 0] - q
            x, x_prev = x - w * step * r + (w - 1.0) * (x - x_prev), x
        return x


    def half(H, q, *, L, mu, iters):
        """Broken: half the iterations it is asked for."""
        return cheb(H, q, L=L, mu=mu, iters=iters // 2)
''')
QUICK = [
    "--precision",
    "float32",
    "--model",
    "float32",
    "--max-examples",
    "4",
    "--max-d",
    "8",
    "--max-batch",
    "2",
]


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A folder outside the toolkit holding the user's kernel module, as the current directory."""
    d = tmp_path / "user"
    d.mkdir()
    (d / "user_kernels_ck.py").write_text(KERNEL)
    monkeypatch.chdir(d)
    monkeypatch.setattr(
        sys, "path", list(sys.path)
    )  # check-kernel puts the current directory first
    yield d
    sys.modules.pop("user_kernels_ck", None)


def _svt(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _check(function, out, capsys, *extra):
    """``svt check-kernel user_kernels_ck:FUNCTION --like chebyshev`` at the quick sizes."""
    argv = ["check-kernel", f"user_kernels_ck:{function}", "--like", "chebyshev", *QUICK, *extra]
    return _svt([*argv, "-o", out], capsys)


def _svt_process(argv, cwd, *, without_triton=False, timeout=300):
    """``svt ARGV`` in a fresh interpreter in ``cwd``, the toolkit on the path, TRITON_INTERPRET
    unset (check-kernel must set it itself); ``without_triton``: Triton made unimportable.
    The current directory is taken off the path first, as the installed ``svt`` script has it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    block = "sys.modules['triton'] = None; " if without_triton else ""
    code = (
        f"import sys; {block}sys.path.remove('') if '' in sys.path else None; "
        "from analysis.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_pass_from_another_directory_without_triton(tmp_path):
    """The installed command's path: a plain-torch kernel from a module in the current directory
    (not the toolkit's), Triton made unimportable: PASS, exit 0, a JSON report with provenance."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / "user_kernels_ck.py").write_text(KERNEL)
    argv = [
        "check-kernel",
        "user_kernels_ck:cheb",
        "--like",
        "solvers.chebyshev",
        *QUICK,
        "--out",
        "r.json",
    ]
    proc = _svt_process(argv, d, without_triton=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: PASS" in proc.stdout
    rep = json.loads((d / "r.json").read_text())
    assert rep["verdict"] == "PASS" and rep["exit_code"] == 0 and rep["like"] == "chebyshev"
    assert rep["precisions"]["float32"] == {"verdict": "PASS", "tightest_contract_met": "float32"}
    assert {"commit", "torch", "device", "date"} <= set(rep["provenance"])
    assert (
        rep["kernel_source"]["file"].endswith("user_kernels_ck.py")
        and len(rep["kernel_source"]["sha256"]) == 64
    )
    # set for the CPU run before any kernel import
    assert rep["settings"]["triton_interpret"] == "1"
    run = rep["runs"][0]
    assert run["examples"] == 4 and 0 < run["worst_ratio"] <= 1


def test_broken_kernel_fails_with_exit_1(user_dir, capsys):
    code, out, _ = _check("half", "bad.json", capsys, "--no-shrink")
    assert code == 1
    assert "verdict: FAIL" in out and "rebuild it with" in out
    rep = json.loads((user_dir / "bad.json").read_text())
    assert rep["verdict"] == "FAIL" and rep["runs"][0]["failure"]["ratio"] > 1


def test_file_path_spec(user_dir, tmp_path, capsys, monkeypatch):
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    code, out, _ = _svt(
        [
            "check-kernel",
            f"{user_dir / 'user_kernels_ck.py'}:cheb",
            "--like",
            "solvers:chebyshev",
            *QUICK,
        ],
        capsys,
    )
    assert code == 0, out
    assert (other / check_kernel.DEFAULT_OUT).is_file()


@pytest.mark.parametrize(
    "argv, argument",
    [
        (
            ["nosuch_module_ck:fn", "--like", "chebyshev"],
            "argument KERNEL: cannot import module 'nosuch_module_ck'",
        ),
        (
            ["user_kernels_ck:nofn", "--like", "chebyshev"],
            "argument KERNEL: module 'user_kernels_ck' has no attribute",
        ),
        (["user_kernels_ck", "--like", "chebyshev"], "argument KERNEL: expected MODULE:FUNCTION"),
        (["missing.py:fn", "--like", "chebyshev"], "argument KERNEL: no such file"),
        (
            ["user_kernels_ck:cheb", "--like", "nosuch"],
            "argument --like: unknown reference 'nosuch'",
        ),
        (
            ["user_kernels_ck:cheb", "--like", "cg", "--model", "fp99"],
            "argument --model: unknown contract 'fp99'",
        ),
        (["user_kernels_ck:cheb", "--like", "cg", "--out", "."], "argument --out:"),
        (
            ["user_kernels_ck:cheb", "--like", "gka_layer_backward", "--model", "tf32"],
            "argument --model: the gka_layer_backward strategy bounds the contracts float32, bfloat16/operands",
        ),
        (
            ["user_kernels_ck:cheb", "--like", "cg", "--max-examples", "0"],
            "argument --max-examples",
        ),
        (["user_kernels_ck:cheb"], "--like"),
        (
            ["user_kernels_ck:cheb", "--like", "mylib.whatever:chebyshev"],
            "argument --like: unknown reference 'mylib.whatever:chebyshev'",
        ),
        (["user_kernels_ck:cheb", "--like", "cg", "--max-kappa", "0.5"], "argument --max-kappa"),
        (["user_kernels_ck:cheb", "--like", "cg", "--device", "gpu0"], "argument --device"),
        (
            ["user_kernels_ck:cheb", "--like", "cg", "--kla-form", "tokenwise"],
            "argument --kla-form",
        ),
        (["user_kernels_ck:cheb", "--like", "cg", "--trajectory"], "argument --trajectory"),
    ],
)
def test_usage_errors_exit_2_naming_the_argument(user_dir, capsys, argv, argument):
    try:
        code, out, err = _svt(["check-kernel", *argv], capsys)
    except SystemExit as e:  # argparse's own errors (missing --like, a bad integer)
        code, (out, err) = e.code, capsys.readouterr()
    assert code == 2
    assert argument in err and len(err.strip().splitlines()) == 1 and not out
    assert not (user_dir / check_kernel.DEFAULT_OUT).exists()


def test_triton_kernel_without_triton_is_a_usage_error(tmp_path):
    argv = ["check-kernel", "kernels:chebyshev", "--like", "chebyshev"]
    proc = _svt_process(argv, tmp_path, without_triton=True, timeout=120)
    assert proc.returncode == 2 and not proc.stdout
    assert (
        "argument KERNEL: cannot load 'kernels:chebyshev': kernels.chebyshev needs Triton"
        in proc.stderr
    )
    assert 'pip install "solver-verification-toolkit[gpu]"' in proc.stderr


def test_like_names():
    assert {
        check_kernel.like_name(x)
        for x in ("solvers.chebyshev", "solvers:chebyshev", "kernels.chebyshev", "chebyshev")
    } == {"chebyshev"}
    assert check_kernel.LIKE["cg"].strategy == "spd_nobounds"


def _runs(*pairs):
    return [{"contract": c, "verdict": v} for c, v in pairs]


def test_precision_verdict_rules():
    """Without declared contracts one that holds suffices (the first, tightest, is reported); an
    INCONCLUSIVE is no FAIL; declared contracts must all hold."""
    v = check_kernel.precision_verdict
    assert v(
        _runs(("float32", "FAIL"), ("tf32", "PASS"), ("bfloat16/strict", "INCONCLUSIVE")), False
    ) == ("PASS", "tf32")
    assert v(_runs(("float32", "FAIL"), ("bfloat16/strict", "INCONCLUSIVE")), False) == (
        "INCONCLUSIVE",
        None,
    )
    assert v(_runs(("float32", "FAIL"), ("tf32", "FAIL")), False) == ("FAIL", None)
    assert v(_runs(("float32", "PASS"), ("tf32", "FAIL")), True) == ("FAIL", "float32")
    assert v(_runs(("float32", "PASS"), ("tf32", "INCONCLUSIVE")), True) == (
        "INCONCLUSIVE",
        "float32",
    )


def test_diff_reports_a_worse_verdict(user_dir, capsys):
    assert _check("cheb", "old.json", capsys)[0] == 0
    assert _check("half", "new.json", capsys, "--no-shrink")[0] == 1
    code, out, _ = _svt(["diff", "old.json", "new.json"], capsys)
    assert code == 1
    assert "verdict WORSE" in out and "verdict: PASS -> FAIL (WORSE)" in out
    line = next(x for x in out.splitlines() if x.split()[:2] == ["float32", "float32"])
    assert "PASS" in line and "FAIL" in line
    # the other way round it got better: exit 0; against itself nothing changed
    code, out, _ = _svt(["diff", "new.json", "old.json"], capsys)
    assert code == 0 and "verdict better" in out
    code, out, _ = _svt(["diff", "old.json", "old.json"], capsys)
    assert code == 0 and "0 run(s) worse, 0 better, 0 worst ratio(s) changed" in out


def test_diff_ratio_change_and_only_in_one():
    base = {
        "format": check_kernel.FORMAT,
        "like": "cg",
        "strategy": "spd_nobounds",
        "verdict": "PASS",
        "settings": {"seed": 0, "max_examples": 4, "sizes": {}, "shrink": True},
    }
    old = dict(
        base,
        runs=[
            {"precision": "float32", "contract": "float32", "verdict": "PASS", "worst_ratio": 0.2}
        ],
    )
    new = dict(
        base,
        runs=[
            {"precision": "float32", "contract": "float32", "verdict": "PASS", "worst_ratio": 0.6},
            {
                "precision": "bfloat16",
                "contract": "float32",
                "verdict": "FAIL",
                "worst_ratio": "inf",
            },
        ],
    )
    res = kernel_diff.compare(old, new)
    assert res["worse"] == 0 and res["ratio_changed"] == 1 and res["same_cases"]
    assert res["rows"][0]["change"] == "ratio x3" and res["rows"][1]["change"] == "only in NEW"
    assert res["same_mode"]  # neither ran in trajectory mode (an old report has no key)
    traj = dict(new, settings={**new["settings"], "trajectory": True})
    res = kernel_diff.compare(old, traj)
    assert not res["same_mode"]
    text = kernel_diff.format_comparison(
        dict(old, kernel="k", reference="r"), dict(traj, kernel="k", reference="r"), res, "o", "n"
    )
    assert "one report ran in trajectory mode" in text
    assert kernel_diff.compare(old, new, ratio_change=5.0)["ratio_changed"] == 0


def test_diff_usage_errors(tmp_path, capsys):
    (tmp_path / "x.json").write_text('{"a": 1}')
    (tmp_path / "y.json").write_text("not json")
    for a, b, msg in (
        ("x.json", "x.json", "is not a check-kernel report"),
        ("nope.json", "x.json", "cannot be read"),
        ("y.json", "x.json", "is not JSON"),
    ):
        code = cli.main(["diff", str(tmp_path / a), str(tmp_path / b)])
        err = capsys.readouterr().err
        assert code == 2 and f"argument OLD.json: {str(tmp_path / a)!r} {msg}" in err


def test_triton_interpret_is_set_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    check_kernel.interpret_without_gpu("cpu")
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the user's own setting is kept
    check_kernel.interpret_without_gpu("cpu")
    assert os.environ["TRITON_INTERPRET"] == "0"


def test_help_lists_the_new_commands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["check-kernel", "--help"])
    out = capsys.readouterr().out
    assert "--like REFERENCE" in out and "(default: 20)" in out and "exit status: 0 PASS" in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "check-kernel" in out and "diff" in out


def test_triton_kernel_runs_on_cpu_without_setting_the_interpreter(tmp_path):
    """No TRITON_INTERPRET in the environment and no GPU: check-kernel sets it before the
    kernel's module imports Triton, so the toolkit's own Triton kernel runs and passes."""
    pytest.importorskip("triton")
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU the kernel runs natively")
    sizes = ["--max-examples", "3", "--max-d", "4", "--max-batch", "1"]
    argv = [
        "check-kernel",
        "kernels:chebyshev",
        "--like",
        "chebyshev",
        *QUICK[:4],
        *sizes,
        "-o",
        "k.json",
    ]
    proc = _svt_process(argv, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "k.json").read_text())["settings"]["triton_interpret"] == "1"


def test_kla_form_reaches_the_strategy():
    """``--kla-form`` is passed to the kla strategy (the bound the kernel is held to)."""
    from types import SimpleNamespace

    args = SimpleNamespace(
        max_d=None, max_batch=None, pow2=False, max_kappa=None, kla_form="either"
    )
    assert check_kernel.strategy_sizes("kla", args) == {"form": "either"}
    args.kla_form = None
    assert check_kernel.strategy_sizes("kla", args) == {}


def test_trajectory_mode_is_recorded_and_catches_the_broken_kernel(user_dir, capsys, tmp_path):
    """``--trajectory`` reaches the harness (the report's settings say so); the correct kernel
    still PASSes and the half-iteration one FAILs."""
    out = str(tmp_path / "t.json")
    code, stdout, _ = _check("cheb", out, capsys, "--trajectory")
    rep = json.loads(pathlib.Path(out).read_text())
    assert code == 0 and rep["settings"]["trajectory"] is True
    assert "trajectory mode" in stdout.splitlines()[0]
    code, _, _ = _check("half", out, capsys, "--trajectory")
    assert code == 1
