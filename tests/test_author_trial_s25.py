"""Regression tests from an outsider's trial of the kernel harness (session 25).

Each pins a defect found by checking a plain-torch kernel from a folder outside the repository.
"""

from analysis.testing import harness


def _cheb(H, q, *, L, mu, iters):
    return solve(H, q, L=L, mu=mu, iters=iters)


def solve(H, q, *, L, mu, iters):
    import solvers

    return solvers.chebyshev(H.float(), q.float(), L=L, mu=mu, iters=iters)


def on_meta(H, q, *, L, mu, iters):
    """A kernel that returns its result on the wrong device."""
    return solve(H, q, L=L, mu=mu, iters=iters).to("meta")


def scaled(H, q, *, L, mu, iters):
    """A broken kernel: 1% off."""
    return solve(H, q, L=L, mu=mu, iters=iters) * 1.01


def test_wrong_device_is_a_finding_with_its_case():
    # was: "FAIL with an exception outside any case: RuntimeError: Tensor on device cpu is not
    # on the expected device meta!", no case, no snippet
    rep = harness.check(
        on_meta, solve, "spd", precision="float32", examples=3, seed=0, device="cpu"
    )
    assert rep.verdict == harness.FAIL and rep.error is None, rep
    assert "device meta" in rep.failure.crash and "cpu" in rep.failure.crash
    assert "spd_case(" in rep.failure.snippet


def _run_scaled(capsys):
    """The harness CLI on the failing kernel ``scaled``: 5 cases, seed 0, on the CPU."""
    code = harness.main(
        [f"{__name__}:scaled", "solvers:chebyshev", "--strategy", "spd", "--precision", "float32"]
        + ["--examples", "5", "--seed", "0", "--device", "cpu"]
    )
    return code, capsys.readouterr().out


def test_header_separates_drawn_cases_from_shrinking(capsys):
    # was: "--examples 5" reported as "103 cases" (the shrinker's runs counted as cases)
    code, out = _run_scaled(capsys)
    assert code == 1
    head = out.splitlines()[0]
    assert "while shrinking" in head, head
    drawn = int(head.split(" | ")[4].split()[0])
    assert 1 <= drawn <= 5, head


def test_cli_failure_prints_a_snippet_that_reruns_the_case(capsys):
    # was: only the case was printed; the run_case call (with the command's strategy sizes,
    # contract and poisoned empty) had to be pieced together from the docs
    code, out = _run_scaled(capsys)
    assert code == 1 and "then rerun it with:" in out
    block = out[out.index("rebuild it with:") :].splitlines()[1:]
    src = "\n".join(line[4:] for line in block if line.startswith("    "))
    scope: dict = {}
    exec(compile(src, "<snippet>", "exec"), scope)  # noqa: S102 - the printed repro, run as pasted
    findings = scope["findings"]
    assert findings and findings[0].failed and findings[0].ratio > 1


def test_a_string_where_a_callable_goes_is_a_type_error_naming_it():
    # was: a FAIL of every case, "reference raised TypeError: 'str' object is not callable",
    # reference named "?.'solvers:chebyshev'"
    import pytest

    with pytest.raises(TypeError, match=r"reference must be a callable.*harness\.load"):
        harness.check(_cheb, "solvers:chebyshev", "spd", examples=2, seed=0, device="cpu")
    case = harness.spd_case(D=2, batch=(1,), kappa=2.0, iters=2, seed=0)
    with pytest.raises(TypeError, match=r"kernel must be a callable.*harness\.load"):
        harness.run_case(
            "mymod:cheb", solve, "spd", case, precision="float32", model="float32", device="cpu"
        )
