"""``x0`` and ``callback`` of ``solvers.cg`` (and ``x0`` of ``kernels.cg``) with the semantics of
``scipy.sparse.linalg.cg``: same iterates, same number of callback calls, same stopping test."""

from __future__ import annotations

import math

import pytest
import torch

import solvers
from analysis.precision import rounding_allowance
from solvers import Arith, Status

sl = pytest.importorskip("scipy.sparse.linalg")


def _spd(D, kappa, seed, batch=()):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(*batch, D, D, dtype=torch.float64, generator=g))
    lam = kappa ** -torch.linspace(0, 1, D, dtype=torch.float64)
    H = (Q * lam) @ Q.transpose(-1, -2)
    q = torch.randn(*batch, D, dtype=torch.float64, generator=g)
    x0 = torch.randn(*batch, D, dtype=torch.float64, generator=g)
    return (H + H.transpose(-1, -2)) / 2, q, x0


def _scipy(H, q, x0, **kw):
    seen = []
    x, info = sl.cg(
        H.numpy(),
        q.numpy(),
        x0=None if x0 is None else x0.numpy(),
        callback=lambda xk: seen.append(torch.from_numpy(xk.copy())),
        **kw,
    )
    return torch.from_numpy(x), seen, info


def _agreement(H, q, x0, kappa):
    """How far two runs of the same CG recurrence (ours, scipy's: they differ only in the
    summation order of dot and matrix-vector products) may be apart after k < D steps: twice
    the rounding allowance c kappa (D u_acc + u_store) (docs/precision.md), relative to the size
    of what they move (||x*|| + ||x0||). Measured: at most 1.2% of it in these tests.

    This is not a bound CG obeys in general: finite-precision CG loses orthogonality, so its
    iterates are not within the allowance of the exact ones (docs/precision.md, "CG"), and two
    runs drift apart at a rate that grows with D, kappa and k. Hence the small case (D = 7,
    kappa = 20, k <= 6 < D). At k = D exact CG has terminated and each run's error to x* is its
    own amplified rounding, so two runs differ by as much as that error: measured with
    ``python -m analysis.studies.cg_agreement``, 0.2-1.7 x 2A at D = 8, kappa = 50 and up to
    6e5 x 2A at D = 16, kappa = 50 (up to 3e4 x 2A already at k < D there). Beyond D the runs
    are compared through their error to x* instead
    (test_both_runs_reach_the_attainable_accuracy)."""
    xs = torch.linalg.solve(H, q)
    scale = xs.norm() + (0.0 if x0 is None else x0.norm())
    return 2.0 * rounding_allowance(kappa, H.shape[-1], Arith(torch.float64)) * float(scale)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_x0", [True, False])
def test_fixed_count_matches_scipy_iterate_by_iterate(seed, use_x0):
    kappa, iters = 20.0, 6
    H, q, x0 = _spd(7, kappa, seed)
    x0 = x0 if use_x0 else None
    seen = []
    x = solvers.cg(H, q, iters=iters, x0=x0, callback=seen.append)
    # rtol=0: scipy runs all maxiter steps, as our fixed-count default does
    xs, ref, info = _scipy(H, q, x0, rtol=0.0, atol=0.0, maxiter=iters)
    tol = _agreement(H, q, x0, kappa)
    assert len(seen) == len(ref) == iters
    for k, (a, b) in enumerate(zip(seen, ref)):
        assert float((a - b).norm()) <= tol, f"iterate {k + 1}"
    assert float((x - xs).norm()) <= tol


@pytest.mark.parametrize("kappa", [50.0, 1000.0])
def test_both_runs_reach_the_attainable_accuracy(kappa):
    """k up to 4D, past CG's finite termination: no per-iterate agreement bound exists there
    (see _agreement), but each run is held to what the toolkit claims for CG at every iterate,
    forward_k <= sqrt(kappa) 2 R_a^k + A (``analysis.bounds.checks.cg_forward_ratio``: the
    exact-arithmetic bound, which finite-precision CG keeps up to a slight widening of the
    spectrum, Greenbaum 1989, plus the attainable accuracy), and after 4D steps to the
    allowance A itself (docs/precision.md, "CG"; measured: at most 0.003 A). Then the two runs
    agree within 2A. The last check is not vacuous: at step D - 1 each run is still ~1e10 A
    from x*."""
    from analysis.references.iterative import exact_solution

    D = 8
    H, q, _ = _spd(D, kappa, 0)
    iters = 4 * D
    _, info = solvers.cg(H, q, iters=iters, return_info=True)
    _, seen, _ = _scipy(H, q, None, rtol=0.0, atol=0.0, maxiter=iters)
    theirs = torch.stack([torch.zeros(D, dtype=torch.float64), *seen])
    exact = exact_solution(H, q)
    size = float(exact.x.norm())
    kap = float(exact.kappa)
    A = rounding_allowance(kap, D, Arith(torch.float64))
    R = (math.sqrt(kap) - 1) / (math.sqrt(kap) + 1)
    bound = math.sqrt(kap) * 2 * R ** torch.arange(iters + 1, dtype=torch.float64) + A
    for run in (info.iterates, theirs):
        forward = exact.x.distance(run) / size
        assert bool((forward <= bound).all()), (forward / bound).max()
        assert float(forward[-1]) <= A
        assert float(forward[D - 1]) > A
    assert float((info.iterates[-1] - theirs[-1]).norm()) <= 2 * A * size


@pytest.mark.parametrize("seed", range(4))
def test_tolerance_stops_where_scipy_stops(seed):
    H, q, x0 = _spd(8, 50.0, seed)
    seen = []
    x, info = solvers.cg(H, q, iters=100, rtol=1e-6, x0=x0, callback=seen.append, return_info=True)
    xs, ref, code = _scipy(H, q, x0, rtol=1e-6, maxiter=100)
    assert code == 0 and int(info.system_status) == Status.CONVERGED
    assert len(seen) == len(ref)  # one call per update, none after convergence
    # both stop on the recursive residual <= rtol ||q||; the true residual differs from it by at
    # most the residual gap, bounded by 2 (k + 1)(D + 2) u (||H|| max_j ||x_j|| + ||q||)
    # (Greenbaum, Iterative Methods for Solving Linear Systems, 1997, Sec. 7.3, with margin 2)
    k, D, u = len(seen), H.shape[-1], 2.0**-53
    xmax = max(float(t.norm()) for t in [x0, *seen])
    gap = (
        2 * (k + 1) * (D + 2) * u * (float(torch.linalg.matrix_norm(H, 2)) * xmax + float(q.norm()))
    )
    for sol in (x, xs):
        assert float((q - H @ sol).norm()) <= 1e-6 * float(q.norm()) + gap


def test_x0_at_the_solution_converges_at_once():
    H, q, _ = _spd(5, 10.0, 0)
    xs = torch.linalg.solve(H, q)
    calls = []
    x, info = solvers.cg(H, q, iters=10, rtol=1e-8, x0=xs, callback=calls.append, return_info=True)
    _, ref, _ = _scipy(H, q, xs, rtol=1e-8, maxiter=10)
    assert calls == ref == []
    assert torch.equal(x, xs) and int(info.system_status) == Status.CONVERGED


@pytest.mark.parametrize(
    "dtype, mode",
    [
        (torch.float64, "storage"),
        (torch.float32, "storage"),
        (torch.bfloat16, "storage"),
        (torch.bfloat16, "strict"),
    ],
)
def test_zero_x0_is_the_default_bit_for_bit(dtype, mode):
    H, q, _ = _spd(6, 30.0, 1, batch=(3,))
    H, q = H.to(dtype), q.to(dtype)
    a = solvers.cg(H, q, iters=5, bf16_mode=mode)
    b = solvers.cg(H, q, iters=5, bf16_mode=mode, x0=torch.zeros_like(q))
    assert torch.equal(a, b)


def test_x0_changes_the_run_and_meets_the_bound():
    """With x0, ||x_i - x*||_H <= 2 R^i ||x0 - x*||_H (R = (sqrt(k) - 1)/(sqrt(k) + 1)), in float64;
    and a guess is used at all: a run from x0 differs from the run from zero."""
    kappa = 40.0
    H, q, x0 = _spd(9, kappa, 2, batch=(4,))
    xs = torch.linalg.solve(H, q.unsqueeze(-1)).squeeze(-1)
    x, info = solvers.cg(H, q, iters=6, x0=x0, return_info=True)
    R = (math.sqrt(kappa) - 1) / (math.sqrt(kappa) + 1)

    def hnorm(e):
        return torch.sqrt(((H @ e.unsqueeze(-1)).squeeze(-1) * e).sum(-1))

    e0 = hnorm(x0 - xs)
    # rounding, additive: the float64 run (k = 6 < D = 9 steps, as in _agreement) and xs each
    # within the allowance A = c kappa (D u + u) of their exact values, relative to what they
    # move (||x*|| + ||x0||); in the H-norm times sqrt(lam_max) = 1: 2 A (||x*|| + ||x0||) ~ 7e-12
    allow = rounding_allowance(kappa, H.shape[-1], Arith(torch.float64))
    slack = (
        2 * allow * (xs.norm(dim=-1) + x0.norm(dim=-1)) * torch.linalg.eigvalsh(H)[..., -1].sqrt()
    )
    for i, xi in enumerate(info.iterates):
        assert bool((hnorm(xi - xs) <= 2 * R**i * e0 + slack).all()), i
    assert torch.equal(info.iterates[0], x0)
    # the guess is used: the two runs differ by more than the rounding of both (2 A each)
    moved = (x - solvers.cg(H, q, iters=6)).norm(dim=-1) * torch.linalg.eigvalsh(H)[..., -1].sqrt()
    assert bool((moved > 2 * slack).all())


def test_one_guess_broadcasts_to_every_system():
    H, q, x0 = _spd(5, 10.0, 3, batch=(2, 3))
    one = x0[0, 0]
    assert torch.equal(
        solvers.cg(H, q, iters=4, x0=one), solvers.cg(H, q, iters=4, x0=one.expand(2, 3, 5))
    )


def test_inputs_are_not_modified_and_callback_gets_copies():
    H, q, x0 = _spd(6, 10.0, 4)
    before = [t.clone() for t in (H, q, x0)]
    expected = solvers.cg(H, q, iters=5, x0=x0)

    def vandal(xk):
        xk.fill_(1e9)  # writing into what the callback gets must not change the run

    x = solvers.cg(H, q, iters=5, x0=x0, callback=vandal)
    assert torch.equal(x, expected)
    assert all(torch.equal(a, b) for a, b in zip(before, (H, q, x0)))


@pytest.mark.parametrize(
    "kw, error, words",
    [
        (dict(x0=torch.zeros(4, dtype=torch.float64)), ValueError, "x0 has last dimension 4"),
        (dict(x0=torch.zeros(2, 6, dtype=torch.float64)), ValueError, "x0"),
        (
            dict(x0=torch.zeros(6, dtype=torch.float32)),
            TypeError,
            "x0 has dtype torch.float32 but H has torch.float64",
        ),
        (
            dict(x0=torch.full((6,), float("nan"), dtype=torch.float64)),
            ValueError,
            "x0 has 6 non-finite entries",
        ),
        (dict(x0=[0.0] * 6), TypeError, "x0 must be a torch.Tensor"),
        (dict(callback=3), TypeError, "callback must be callable"),
    ],
)
def test_bad_options_name_the_argument(kw, error, words):
    H, q, _ = _spd(6, 10.0, 5, batch=(3,))
    with pytest.raises(error, match=words.replace("(", r"\(")):
        solvers.cg(H, q, iters=3, **kw)


def test_x0_must_not_grow_the_batch():
    H, q, _ = _spd(6, 10.0, 5)
    with pytest.raises(
        ValueError,
        match=r"x0 has shape \(3, 6\), which does not broadcast to the systems' shape \(6,\)",
    ):
        solvers.cg(H, q, iters=3, x0=torch.zeros(3, 6, dtype=torch.float64))


# ------------------------------------------------------------------------------- kernel


def test_kernel_x0_matches_the_reference():
    kernels = pytest.importorskip("kernels")
    H, q, x0 = _spd(8, 20.0, 6, batch=(3,))
    H, q, x0 = H.float(), q.float(), x0.float()
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU under the interpreter
    Hd, qd, xd = H.to(dev), q.to(dev), x0.to(dev)
    assert torch.equal(kernels.cg(Hd, qd, iters=0, x0=xd).cpu(), x0)
    ref, got = solvers.cg(H, q, iters=5, x0=x0), kernels.cg(Hd, qd, iters=5, x0=xd).cpu()
    # both float32 runs of one recurrence: each within the float32 allowance of the exact one
    tol = (
        _agreement(H.double(), q.double(), x0.double(), 20.0)
        / 2
        * (
            rounding_allowance(1.0, 8, Arith(torch.float32))
            / rounding_allowance(1.0, 8, Arith(torch.float64))
        )
    )
    assert float((ref - got).norm()) <= tol
    # the kernel uses the guess: its two runs differ by more than both runs' rounding (2 tol)
    assert float((got - kernels.cg(Hd, qd, iters=5).cpu()).norm()) > 2 * tol


def test_kernel_options_name_the_argument():
    kernels = pytest.importorskip("kernels")
    H, q, _ = _spd(4, 10.0, 7, batch=(2,))
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU under the interpreter
    H, q = H.float().to(dev), q.float().to(dev)
    with pytest.raises(
        ValueError, match="callback: kernels.cg runs every iteration inside one launch"
    ):
        kernels.cg(H, q, iters=2, callback=print)
    with pytest.raises(ValueError, match=r"x0 has shape \(3,\), which does not broadcast"):
        kernels.cg(H, q, iters=2, x0=torch.zeros(3, device=dev))
    with pytest.raises(TypeError, match="x0 has dtype torch.bfloat16 but H has torch.float32"):
        kernels.cg(H, q, iters=2, x0=torch.zeros(4, dtype=torch.bfloat16, device=dev))
    with pytest.raises(ValueError, match="x0"):
        kernels.cg(H, q, iters=2, x0=torch.full((4,), float("inf"), device=dev))


def test_agreement_study_prints_its_table(capsys):
    """``python -m analysis.studies.cg_agreement --quick``: the measurements behind _agreement's
    docstring and docs/precision.md ("CG"), one row per seed."""
    from analysis.studies import cg_agreement

    assert cg_agreement.main(["--quick", "--seeds", "1"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 3 and rows[-1].startswith("| 8 | 50 | 0 |")
