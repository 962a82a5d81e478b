"""Negative tests for property checks of the solvers' and kernels' tests that had none.

Each test plants a realistic bug (off-by-one step, a missing term, a wrong initial residual, a
freeze at the wrong threshold, a cancelling formula) by monkeypatching or by a wrapper defined
here (never in the production code), then runs THE SAME check as the positive test (usually the
positive test function itself) and asserts that it fails. Where the check is called through the
positive test, the failing assertion is pinned by its message or by the line it sits on, so that
an unrelated assertion failing first does not count as the check catching the bug.
"""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import mpmath
import pytest
import torch

import solvers
from analysis.precision import Arith
from analysis.references.gka import layer_rounding_bound
from solvers._arith import Arith as _SolverArith
from solvers.gates import SigmoidGate

F64 = torch.float64

# the positive tests' modules (tests/ is on sys.path under pytest's default import mode)
import test_cg_autograd as cga  # noqa: E402
import test_cg_options as cgo  # noqa: E402
import test_gates as tg  # noqa: E402
import test_gka_layer as tgl  # noqa: E402
import test_kla as tk  # noqa: E402
import test_metrics as tm  # noqa: E402


def _fails_at(fn, source_fragment: str):
    """Run ``fn``; it must raise AssertionError from the assert line containing
    ``source_fragment`` (the property check, not some other assertion of the test)."""
    with pytest.raises(AssertionError) as exc:
        fn()
    lines = [fr.line or "" for fr in traceback.extract_tb(exc.value.__traceback__)]
    assert any(source_fragment in ln for ln in lines), (source_fragment, lines[-1])
    return exc


# ----------------------------------------------------------------- planted bugs


def _dot_missing_last_term(self, x, y):
    """Arith.dot with an off-by-one summation range: the last product is dropped."""
    x = x.to(self.compute)[..., :-1]
    y = y.to(self.compute)[..., :-1]
    return (x.unsqueeze(-2) @ y.unsqueeze(-1)).squeeze(-1).squeeze(-1)


_REAL_CG = solvers.cg


def _cg_initial_residual_is_q(H, q, *, iters, x0=None, return_info=False, **kw):
    """CG whose initial residual is q instead of q - H x0 (x0 only added on at the end): every
    iterate is x0 + (the run from zero), which converges to x* + x0."""
    x, info = _REAL_CG(H, q, iters=iters, return_info=True, **kw)
    if x0 is not None:
        x = x + x0
        info = SimpleNamespace(iterates=info.iterates + x0, status=info.status)
    return (x, info) if return_info else x


def _cg_freezes_at_1e_6(H, q, *, iters, return_info=False, **kw):
    """CG that freezes a system at a relative residual of 1e-6 (a tolerance mistaken for the
    rounding floor u ||q||); its status is still CONVERGED."""
    return _REAL_CG(H, q, iters=iters, rtol=1e-6, return_info=return_info, **kw)


# ----------------------------------------------------------------- CG (solvers.cg)


def test_scipy_agreement_fails_on_a_dot_missing_its_last_term(monkeypatch):
    """test_cg_options.test_fixed_count_matches_scipy_iterate_by_iterate (bound: twice the
    rounding allowance, _agreement) catches a dot product that drops its last term."""
    monkeypatch.setattr(_SolverArith, "dot", _dot_missing_last_term)
    _fails_at(lambda: cgo.test_fixed_count_matches_scipy_iterate_by_iterate(0, True), "<= tol")


def test_x0_bound_fails_when_the_initial_residual_ignores_x0(monkeypatch):
    """test_cg_options.test_x0_changes_the_run_and_meets_the_bound (bound: 2 R^i ||x0 - x*||_H)
    catches r_0 = q instead of q - H x0 (iterates[0] is still x0, so only the bound can)."""
    monkeypatch.setattr(solvers, "cg", _cg_initial_residual_is_q)
    _fails_at(cgo.test_x0_changes_the_run_and_meets_the_bound, "2 * R**i * e0")


def test_frozen_iterate_check_fails_on_a_freeze_at_a_tolerance(monkeypatch):
    """test_cg_autograd.test_frozen_iterate_is_at_working_accuracy (bound: the rounding
    allowance c kappa (n u_acc + u_store)) catches a freeze at ||r|| <= 1e-6 ||q||, which still
    reports CONVERGED."""
    monkeypatch.setattr(solvers, "cg", _cg_freezes_at_1e_6)
    _fails_at(cga.test_frozen_iterate_is_at_working_accuracy, "<= allowance")


def test_kernel_x0_agreement_fails_when_the_kernel_ignores_x0_in_the_residual(monkeypatch):
    """test_cg_options.test_kernel_x0_matches_the_reference (bound: the float32 rounding
    allowance, scaled from _agreement) catches a kernel whose initial residual is q, not q - H x0
    (emulated by a wrapper: x0 + the kernel's run from zero)."""
    kernels = pytest.importorskip("kernels")
    real = kernels.cg

    def broken(H, q, *, iters, x0=None, **kw):
        if iters == 0:
            return real(H, q, iters=0, x0=x0, **kw)
        x = real(H, q, iters=iters, **kw)
        return x if x0 is None else x + x0

    monkeypatch.setattr(kernels, "cg", broken)
    _fails_at(cgo.test_kernel_x0_matches_the_reference, "<= tol")


# ----------------------------------------------------------------- GKA layer (solvers.gka)


@pytest.mark.parametrize("solver,iters", [("chebyshev", 8), ("cg", 4)])
def test_layer_rounding_check_fails_one_solver_step_short(monkeypatch, solver, iters):
    """test_gka_layer.check_against_truth (ROUND: layer_rounding_bound) catches a layer whose
    iterative solve runs one step fewer than asked (the mp replay runs ``iters``)."""
    real = tgl.gka_layer

    def short(*a, iters=None, **kw):
        return real(*a, iters=None if iters is None else iters - 1, **kw)

    monkeypatch.setattr(tgl, "gka_layer", short)
    case = tgl.gka_case(T=6, D=4, Dv=3, a=0.1, seed=1)
    ok_round, _, _, _ = tgl.check_against_truth(case, Arith(F64), solver, iters)
    assert not ok_round


def test_layer_rounding_bound_fails_on_a_float32_layer_sold_as_float64():
    """ROUND is not vacuous in float64: a layer computed in float32 and returned as float64 is
    outside the float64 bound (the float32 bound is 2^29 times larger)."""
    case = tgl.gka_case(T=6, D=4, Dv=3, a=0.1, seed=1)
    _, _, truth, _ = tgl.check_against_truth(case, Arith(F64), "exact", None)
    c32 = case.to(torch.float32)
    y = tgl.gka_layer(c32.q, c32.k, c32.v, a=case.a, g=c32.g, beta=c32.beta).to(F64)
    assert not bool(
        (truth.split(y)["rounding"] <= layer_rounding_bound(truth, 4, case.a, Arith(F64))).all()
    )


# ----------------------------------------------------------------- gates (solvers.gates)


def test_gate_mpmath_check_fails_on_a_cancelling_complement(monkeypatch):
    """test_gates.test_gate_functions_match_mpmath (OPS bound 16 u_acc + u_store) catches the
    complement computed as 1 - sigma(z), which cancels for z >> 0."""

    def one_minus_value(self, z, *, bf16_mode="storage"):
        return 1 - SigmoidGate.value(self, z, bf16_mode=bf16_mode)

    monkeypatch.setattr(SigmoidGate, "complement", one_minus_value)
    exc = _fails_at(
        lambda: tg.test_gate_functions_match_mpmath(SigmoidGate(), Arith(F64)), "<= bound"
    )
    assert str(exc.value).startswith("('complement'")


def test_gate_mpmath_check_fails_on_a_derivative_missing_a_factor(monkeypatch):
    """The same check catches the sigmoid derivative sigma(z) (the factor sigma(-z) missing)
    and sigma(z) sigma(-z) / 2 (a wrong scaling)."""
    for wrong in (lambda s, m: s, lambda s, m: s * m / 2):

        def derivative(self, z, *, bf16_mode="storage", wrong=wrong):
            zc = z.to(F64)
            return wrong(torch.sigmoid(zc), torch.sigmoid(-zc)).to(z.dtype)

        monkeypatch.setattr(SigmoidGate, "derivative", derivative)
        exc = _fails_at(
            lambda: tg.test_gate_functions_match_mpmath(SigmoidGate(), Arith(F64)), "<= bound"
        )
        assert str(exc.value).startswith("('derivative'")


def test_cumulative_log_decay_bound_fails_on_an_exclusive_scan():
    """test_gates.test_cumulative_log_decay_matches_cumprod's bound gamma_t sum|g| (not only the
    allclose of test_cumulative_log_decay_fails_off_by_one) catches an exclusive scan."""
    from solvers.gates import cumulative_log_decay

    g = torch.tensor([-0.1, -0.5, -0.2, -1.3], dtype=F64)
    G = cumulative_log_decay(g)
    shifted = torch.cat([torch.zeros(1, dtype=F64), G[:-1]])
    with mpmath.workdps(50):
        exact = torch.tensor(
            [float(mpmath.fsum(mpmath.mpf(x) for x in g[: i + 1].tolist())) for i in range(4)],
            dtype=F64,
        )
    t = torch.arange(1, 5, dtype=F64)
    u = 2.0**-53
    bound = t * u / (1 - t * u) * torch.cumsum(g.abs(), 0)  # gamma_t sum|g|
    assert bool(((G - exact).abs() <= bound).all())
    assert not bool(((shifted - exact).abs() <= bound).all())


# ----------------------------------------------------------------- KLA (solvers.kla)


def test_unnormalised_readout_check_fails_when_the_flag_is_ignored(monkeypatch):
    """test_kla.test_normalize_queries_false_reads_unnormalised (rtol 1e-13, commented as
    gamma_{2 d_k + 3}) catches a recurrence that ignores normalize_queries=False."""
    real = tk.kla_recurrent

    def ignores_flag(*a, normalize_queries=True, **kw):
        return real(*a, **kw)

    monkeypatch.setattr(tk, "kla_recurrent", ignores_flag)
    _fails_at(tk.test_normalize_queries_false_reads_unnormalised, "assert torch.allclose(")


# ----------------------------------------------------------------- references (ground truth)


def test_ground_truth_check_fails_on_a_float64_reference(monkeypatch):
    """test_metrics.test_exact_solution_matches_mpmath_cholesky_to_32_digits (10^-30 relative:
    the double-double ground truth's resolution, ~1e-32) catches a reference whose solve runs in
    float64 (rounded to working precision, the lo part lost)."""
    from analysis.references import mp as amp

    def float64_solve(A, b):
        n = A.rows
        At = torch.tensor([[float(A[i, j]) for j in range(n)] for i in range(n)], dtype=F64)
        bt = torch.tensor([float(b[i]) for i in range(n)], dtype=F64)
        return mpmath.matrix(torch.linalg.solve(At, bt).tolist())

    monkeypatch.setattr(amp, "solve_spd", float64_solve)
    monkeypatch.setenv("SVT_NO_CACHE", "1")
    _fails_at(tm.test_exact_solution_matches_mpmath_cholesky_to_32_digits, "10) ** -30")
