"""Review of the claim route (``run_claim(..., impl=...)``, ``python -m proofs_check --impl``):
a contract bound at least the size of what the output approximates is vacuous (zeros would pass
it); a run that never called the implementation under test gives no verdict on it; a claim runs
only in its own precisions (a contract equal to one of them names it); a failing run's
measurement is printed once."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import solvers
from analysis.testing.strategies.ridge import GKASystem
from proofs_check import contract_route, get, runner
from proofs_check.claim import FAILS, HOLDS
from proofs_check.implementations import merged
from solvers.contracts import PRESETS

# a 1x1 ridge system, r = 1: in strict bf16 the contract's running bound (0.775 ||x*||) is below
# ||x*|| but above ||xi_1|| (0.088 ||x*||), so an output of zeros is within it
SMALL = (GKASystem(keys=((-0.0556640625,),), q=(-0.12060546875,), a=0.01), 1)


def zeros_on_1d(A, q, *, L, mu, iters, bf16_mode="storage"):
    """Algorithm 1, but zeros for a 1x1 system: broken, and only there."""
    if q.shape[-1] == 1:
        return torch.zeros_like(q)
    return solvers.chebyshev(A, q, L=L, mu=mu, iters=iters, bf16_mode=bf16_mode)


ZEROS_ON_1D = {"chebyshev": zeros_on_1d}
GOOD = {"chebyshev": solvers.chebyshev}


def test_a_bound_above_the_iterates_size_is_vacuous():
    claim = get("gka.alg1")
    check = contract_route.tightened(claim, "bfloat16/strict")
    m = check(SMALL, merged(claim, ZEROS_ON_1D), "bfloat16/strict")
    assert m.bound < 1.0  # not caught by the old relative-bound >= 1 test
    assert contract_route.vacuous(m) or not m.ok, m


def test_zeros_are_never_reported_holds_in_bf16_strict():
    claim = dataclasses.replace(get("gka.alg1"), examples=(SMALL,))
    r = runner.run_claim(
        claim, "bfloat16/strict", impl=merged(claim, ZEROS_ON_1D), examples=1, shrink=False
    )
    assert r.verdict != HOLDS, r


def test_a_run_that_never_calls_the_implementation_gives_no_verdict():
    rate = get("gka.alg1.rate")  # mp only: the mpmath references, never `chebyshev`
    results = runner._run_pairs(
        [(rate, "mp"), (get("gka.alg1"), "float64")],
        examples=2,
        deterministic=True,
        shrink=False,
        progress=None,
        jobs=1,
        cache=False,
        impl=GOOD,
    )
    assert [r.verdict for r in results] == [runner.NOT_EXERCISED, HOLDS]
    assert not runner.differs(results[0]) and runner.exit_status(results) == 0
    text = runner.format_table(results)
    assert "not exercised" in text and "did not call your functions" in text


def test_cli_reports_an_unexercised_claim(capsys, monkeypatch, tmp_path):
    (tmp_path / "s25_impl.py").write_text(
        "import solvers\nIMPL = {'chebyshev': solvers.chebyshev}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code = runner.main(["--claim", "gka.alg1.rate", "--impl", "s25_impl:IMPL", "--examples", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "holds" not in out.split("not exercised")[0].splitlines()[-1], out
    assert "not exercised" in out


def test_a_claim_runs_only_in_its_own_precisions():
    alg1, rate = get("gka.alg1"), get("gka.alg1.rate")
    impl = merged(alg1, GOOD)
    with pytest.raises(ValueError, match="bfloat16/operands"):
        runner.run_claim(alg1, "bfloat16/operands", impl=impl, examples=1)
    with pytest.raises(ValueError, match="runs in mp"):
        runner.run_claim(rate, "float32", impl=impl, examples=1)
    with pytest.raises(ValueError, match="not in precision 'fp16'"):
        runner.run_claim(alg1, "fp16", examples=1)
    r = runner.run_claim(alg1, PRESETS["bfloat16/storage"], impl=impl, examples=2, shrink=False)
    assert r.precision == "bfloat16/storage" and r.verdict == HOLDS


def test_a_failing_run_prints_its_measurement_once():
    def omega1(A, q, *, L, mu, iters, bf16_mode="storage"):
        return 0.9 * solvers.chebyshev(A, q, L=L, mu=mu, iters=iters, bf16_mode=bf16_mode)

    claim = get("gka.alg1")
    r = runner.run_claim(
        claim, "float32", impl=merged(claim, {"chebyshev": omega1}), examples=5, shrink=False
    )
    assert r.verdict == FAILS
    text = runner.format_table([r])
    assert text.count(f"{r.worst.value:.6g}") == 1, text
