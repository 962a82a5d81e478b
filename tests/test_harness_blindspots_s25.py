"""Blind spots of the harness's SPD strategies, found by planting realistic kernel slips.

* ``spd`` drew ``iters = 0`` in a third of its cases or more (hypothesis retries every passing
  case with its later choices at their simplest value, and 0 was the simplest count): 21 of
  50 at seed 0, cases where a Chebyshev, GD or AGD kernel returns ``2q / (L + mu)`` or 0 and
  no step of the iteration is checked. Now the simplest count is 1 and 0 is as rare as any
  other count (``harness._draw_iters``).
* ``D = max_d`` was one size among up to 11 (9% of the cases at ``max_d = 128``; none in the 12
  cases of seed 0 at ``max_d = 64`` or 128): a slip in the path where D fills the kernel's
  tile went unseen. Now about a quarter of the cases.
* CG (``spd_nobounds``): at 0 steps, and at fewer than about ``log 4 / -log R`` steps, CG's
  convergence bound ``2 R^k ||x*||_A`` is vacuous whatever the contract, so a correct CG was
  INCONCLUSIVE under ``float32`` at every seed. Now the strategy draws at least that many
  steps (``harness._cg_min_iters``).

Each fix has a planted slip that the old draws missed at a fixed seed and the new ones catch.
"""

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed

import solvers
from analysis.testing import harness
from analysis.testing.strategies.reproducible import pin_local_constants
from kernels import emulate

SEED = 0


def _draws(strategy, n, seed):
    """The cases ``harness.check(..., examples=n, seed=seed)`` runs, without running a kernel."""
    pin_local_constants()
    out = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(strategy.cases)
    def collect(case):
        out.append(case)

    collect()
    return out


def _check(kernel, reference, strategy, model, examples, precision="bfloat16"):
    return harness.check(
        kernel,
        reference,
        strategy,
        precision=precision,
        model=model,
        examples=examples,
        device="cpu",
        seed=SEED,
        shrink=False,
    )


def test_spd_draws_zero_iterations_rarely():
    """Old: 21 of the 50 cases at seed 0 had iters = 0. 0 stays reachable (xi_0's own rounding)."""
    iters = [c.options["iters"] for c in _draws(harness.spd(), 50, SEED)]
    assert sum(i == 0 for i in iters) <= 3, iters
    assert sum(i >= 2 for i in iters) >= 25, iters  # most cases run several steps
    reached = [c.options["iters"] for s in range(1, 4) for c in _draws(harness.spd(), 50, s)]
    assert 0 in reached


def test_spd_iterations_shrink_to_one_step():
    """The simplest case hypothesis shrinks to has one step (the choice's simplest value)."""
    case = _draws(harness.spd(max_iters=5), 1, SEED)[0]
    assert case.options["iters"] == 1, case.label


def test_spd_draws_largest_dimension_often():
    """Old: D = max_d in 9-12% of the cases, none of the 12 at seed 0 for max_d = 64 and 128."""
    for max_d in (64, 128):
        dims = [
            c.inputs["q"].shape[-1]
            for s in range(4)
            for c in _draws(harness.spd(max_d=max_d), 50, s)
        ]
        assert sum(d == max_d for d in dims) >= 0.2 * len(dims), (max_d, dims)
        first = [c.inputs["q"].shape[-1] for c in _draws(harness.spd(max_d=max_d), 12, SEED)]
        assert max_d in first, (max_d, first)
    # the spd_backward and CG strategies draw the same way
    dims = [c.inputs["q"].shape[-1] for c in _draws(harness.spd_backward(max_d=64), 50, SEED)]
    assert sum(d == 64 for d in dims) >= 10, dims


def _chebyshev(H, q, *, L, mu, iters, kappa_shift=0.0, momentum_sign=1.0):
    """GKA Algorithm 1 in float32, with two slips to plant: rho from ``L / mu + kappa_shift``
    (a kernel that takes kappa + 1), the momentum's sign."""
    Hc, qc = H.float(), q.float()
    L64 = torch.broadcast_to(torch.as_tensor(L, dtype=torch.float64), qc.shape[:-1])
    mu64 = torch.broadcast_to(torch.as_tensor(mu, dtype=torch.float64), qc.shape[:-1])
    kappa = L64 / mu64 + kappa_shift
    step = (2.0 / (L64 + mu64)).float().unsqueeze(-1)
    rho2 = (((kappa - 1.0) / (kappa + 1.0)) ** 2).float()
    prev, xi, omega = torch.zeros_like(qc), step * qc, torch.full_like(rho2, 2.0)
    for _ in range(iters):
        omega = 4.0 / (4.0 - rho2 * omega)
        w = omega.unsqueeze(-1)
        g = (Hc @ xi.unsqueeze(-1)).squeeze(-1) - qc
        prev, xi = xi, xi - w * step * g + momentum_sign * (w - 1.0) * (xi - prev)
    return xi.to(q.dtype)


def _full_tile_slip(H, q, *, L, mu, iters):
    """A Chebyshev kernel with tiles of 64 whose unmasked fast path (D fills the tile) flips the
    momentum's sign: right on every other D."""
    sign = -1.0 if q.shape[-1] == 64 else 1.0
    return _chebyshev(H, q, L=L, mu=mu, iters=iters, momentum_sign=sign)


def _rho_from_kappa_plus_one(H, q, *, L, mu, iters):
    return _chebyshev(H, q, L=L, mu=mu, iters=iters, kappa_shift=1.0)


def test_wrong_rho_is_caught_at_the_profiles_examples():
    """rho from kappa + 1 under bf16 operands, 12 cases: the old draws PASSed it on seeds 0-3
    (worst ratio 0.34-0.73; their simplest cases ran 0 steps, where rho does not enter); one
    step at kappa = 1 moves x by a third of ||x||."""
    rep = _check(
        _rho_from_kappa_plus_one, solvers.chebyshev, harness.spd(), "bfloat16/operands", 12
    )
    assert rep.verdict == harness.FAIL, rep
    assert rep.failure.ratio > 2, rep
    # the correct kernel passes the same cases
    ok = _check(_chebyshev, solvers.chebyshev, harness.spd(), "bfloat16/operands", 12)
    assert ok.verdict == harness.PASS, ok


def test_full_tile_slip_is_caught_at_the_profiles_examples():
    """12 cases (the svt-ci profile's), seed 0, max_d = 64: the old draws had no D = 64 (PASS)."""
    rep = _check(_full_tile_slip, solvers.chebyshev, harness.spd(max_d=64), "float32", 12)
    assert rep.verdict == harness.FAIL, rep
    assert "D=64" in rep.failure.case


def test_correct_cg_is_conclusive_under_float32():
    """Old: INCONCLUSIVE at seed 0 (12 and 50 cases): CG's bound is vacuous at 0 steps."""
    for precision in ("float32", "bfloat16"):
        rep = _check(
            emulate.bind(emulate.cg, "float32"),
            solvers.cg,
            harness.spd(bounds=False, precision=getattr(torch, precision)),
            "float32",
            50,
            precision=precision,
        )
        assert rep.verdict == harness.PASS, rep


def test_cg_draws_enough_steps_for_its_bound():
    """Every CG case has 2 R^k <= 1/2 (or max_iters steps): its bound can be conclusive."""
    for c in _draws(harness.spd(bounds=False), 50, SEED):
        kappa, k = c.build_kwargs["kappa"], c.options["iters"]
        r = (math.sqrt(kappa) - 1) / (math.sqrt(kappa) + 1)
        assert 2 * r**k <= 0.5, c.label
    short = _draws(harness.spd(bounds=False, max_iters=2), 10, SEED)
    assert all(1 <= c.options["iters"] <= 2 for c in short)


def _downcast(H, q, *, L, mu, iters):
    """A correct float32 Chebyshev whose result is silently rounded to bf16."""
    return _chebyshev(H, q, L=L, mu=mu, iters=iters).to(torch.bfloat16)


def test_undeclared_downcast_of_the_output_fails():
    """A kernel on float32 inputs that returns bf16 was held to a bf16 output allowance (the
    bound adds the rounding of the dtype returned) and PASSed under ``float32`` and ``tf32``
    (worst ratio 0.83). A result coarser than the inputs is now a failure with its case unless
    the contract declares it (``output=``) or stores its intermediates in that dtype."""
    for model in ("float32", "tf32", "bfloat16/operands"):
        rep = _check(_downcast, solvers.chebyshev, harness.spd(), model, 12, precision="float32")
        assert rep.verdict == harness.FAIL, rep
        assert "coarser than float32" in rep.failure.crash, rep.failure
        assert f"'{model};output=bfloat16'" in rep.failure.crash
    # declared, it is held to its own rounding again, as is a kernel storing its iterate in bf16
    for model in ("float32;output=bfloat16", "bfloat16/storage"):
        rep = _check(_downcast, solvers.chebyshev, harness.spd(), model, 12, precision="float32")
        assert rep.verdict == harness.PASS, (model, rep)
    # bf16 inputs and a bf16 result: the inputs' own dtype, allowed as before
    ok = _check(_downcast, solvers.chebyshev, harness.spd(), "float32", 12)
    assert ok.verdict == harness.PASS, ok
