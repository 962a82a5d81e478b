"""Property checks of any kernel against the reference it should match, within the bound of the
kernel's declared precision contract: the engine of tests/test_kernels_*.py, usable from pytest
and the command line.

    python -m analysis.testing.harness kernels:chebyshev solvers:chebyshev --strategy spd \\
        --precision bfloat16 --model bfloat16/operands --seed 0

For every case a strategy draws, the inputs are rounded to ``precision`` (the kernel's input
dtype); an optional ``prepare`` hook turns them into what *both* callables receive (the same
rounded beta, normalised query, gates: fair pairing); the kernel runs on them, the reference
runs in float32 on the same values (widened exactly). For each output and system

    error <= bound = B(contract) + B(float32) + R(kernel output)

* ``B(contract)`` bounds the kernel's distance to the exact result of the same algorithm on the
  same inputs, for the arithmetic it declares (``--model``: a ``solvers.contracts.Contract``
  preset such as ``float32``, ``bfloat16/operands``, ``bfloat16/storage``, ``tf32``, or a
  composed one); ``B(float32)`` the reference's; ``R`` is the one rounding of the returned
  result, half a spacing at each entry (:func:`output_rounding_bound`), left out where the
  strategy's B already ends with it (``Strategy.stored_outputs``). Strategies supply B from
  ``analysis.bounds.contract`` (running bounds along the exact trajectory, or along the
  kernel's own in trajectory mode) and
  ``analysis.bounds.kaczmarz`` (KLA);
* a case whose bound is at least the size of what it bounds (``bound >= ||reference output||``)
  cannot tell a correct kernel from a broken one: it is *vacuous*, and a run with a vacuous
  case and no failure is INCONCLUSIVE, never PASS.

Verdicts: PASS (every case conclusive and within its bound), FAIL (some output beyond its bound,
a NaN, a crash or a wrong output shape -- each reported with its case), INCONCLUSIVE. The CLI
exits 0 / 1 / 3 for them and 2 for a usage or import error. A failing case is printed as a
Python snippet that rebuilds it exactly (``Case.snippet``).

Plugging in a strategy (the extension point)
-------------------------------------------
A :class:`Strategy` is a hypothesis strategy of :class:`Case` (so ``@given(harness.spd())``
works) plus what bounds its outputs. Construct it with

* ``name``; ``cases``: a hypothesis strategy drawing :class:`Case` (float64 ``inputs`` passed
  positionally in dict order, keyword ``options`` passed to both callables, ``meta`` passed to
  neither; ``build``/``build_kwargs`` name a function that rebuilds the case);
* ``outputs``: names of the callables' outputs, ``core_dims``: how many trailing dims of each
  form one system's vector / matrix (0: elementwise);
* ``scales(case, rounded, contract) -> tuple of tensors``: one per output, broadcast to that
  output's per-system shape, bounding ``||kernel - reference||`` before the output-rounding
  term. ``rounded``: the inputs as both callables saw them (after ``prepare``), float64, on the
  device; ``case.options`` are the prepared options; ``contract``: the kernel's
  :class:`solvers.contracts.Contract` (``contract.u_acc``, ``u_store``, ``u_operand(u)``,
  ``stores("iterate")``; ``analysis.bounds.contract.arith_of(contract)`` maps it onto the
  references' ``Arith`` for bounds written against one). Add the float32 reference's own
  bound (``REFERENCE_CONTRACT``);
* optional ``errors(case, rounded, kernel_outputs, reference_outputs)``: replaces the distance
  to the reference by another measured error (one ``(error, extra_bound)`` pair per output),
  as CG's check does (its A-norm error to the exact solution);
* optional ``steps_option``: the option counting the steps of an iteration whose i-th iterate
  does not depend on the count ("iters" for Chebyshev, GD, AGD). In trajectory mode
  (``check(..., trajectory=True)``) the kernel is also run for every smaller count and
  ``scales`` receives its iterates as ``observed=`` and records its worst step with
  :func:`note_trajectory`.

Register it as ``STRATEGIES["name"] = factory`` (a function taking ``precision=``, ``device=``
and size keywords) to reach it from the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import math
import numbers
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from analysis.argtypes import (
    HelpFormatter,
    OneLineParser,
    condition_number,
    interpret_without_gpu,
    plain,
    positive_int,
    usable_device,
)
from analysis.argtypes import device as device_arg
from analysis.bounds.contract import (
    LINEAR_METHODS,
    arith_of,
    as_contract,
    cg_bound,
    fro_error,
    half_spacings,
    linear_bound,
    value_roundoff,
)
from analysis.bounds.reverse_backward import reverse_backward_bound
from analysis.precision import rounding_allowance
from analysis.testing.koopman_strategy import koopman_problem, koopman_strategy
from analysis.testing.strategies.reproducible import pin_local_constants
from analysis.testing.strategies.spd import log_uniform_spd
from solvers import Arith, unit_roundoff
from solvers.contracts import PRESETS

PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REFERENCE_ARITH = Arith(torch.float32)
REFERENCE_CONTRACT = PRESETS["float32"]
PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}
USAGE_ERROR = 2


# ---------------------------------------------------------------------------------------
# NaN-poisoned allocation
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def nan_poisoned_empty():
    """Within the block, ``torch.empty``, ``torch.empty_like``, ``torch.empty_strided`` and
    ``Tensor.new_empty`` return floating buffers full of NaN (integers: -1), so an output element
    a kernel forgot to write fails every comparison."""
    real = {
        (torch, "empty"): torch.empty,
        (torch, "empty_like"): torch.empty_like,
        (torch, "empty_strided"): torch.empty_strided,
        (torch.Tensor, "new_empty"): torch.Tensor.new_empty,
    }

    def poisoning(alloc):
        def poisoned(*args, **kwargs):
            t = alloc(*args, **kwargs)
            if t.is_floating_point() or t.is_complex():
                t.fill_(float("nan"))
            elif t.dtype != torch.bool:
                t.fill_(-1)
            return t

        return poisoned

    for (owner, name), alloc in real.items():
        setattr(owner, name, poisoning(alloc))
    try:
        yield
    finally:
        for (owner, name), alloc in real.items():
            setattr(owner, name, alloc)


# ---------------------------------------------------------------------------------------
# cases and strategies
# ---------------------------------------------------------------------------------------


@dataclass
class Case:
    """One drawn problem: float64 inputs (exact values before rounding), keyword options, a label,
    ``meta`` (seen by the bounds only) and the builder that rebuilds it (:meth:`snippet`)."""

    inputs: dict
    options: dict
    label: str
    meta: dict = field(default_factory=dict)
    build: str = ""
    build_kwargs: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Case({self.label})"

    def snippet(self) -> str:
        """Python that rebuilds this case exactly (every float in full precision, via repr)."""
        if not self.build:
            return f"# no builder recorded for {self.label}"
        mod, _, fn = self.build.rpartition(".")
        args = ", ".join(f"{k}={_py(v)}" for k, v in self.build_kwargs.items())
        return f"import torch\nfrom {mod} import {fn}\ncase = {fn}({args})"


def _py(v) -> str:
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    return repr(v)


class Strategy(SearchStrategy):
    """How to draw cases and what bounds their outputs (module docstring: the extension point).
    Itself a hypothesis strategy drawing :class:`Case`."""

    def __init__(
        self,
        name: str,
        cases: SearchStrategy,
        outputs: tuple,
        core_dims: tuple,
        scales: Callable,
        doc: str = "",
        errors: Optional[Callable] = None,
        vacuity_dims: Optional[tuple] = None,
        stored_outputs: Optional[Callable] = None,
        steps_option: Optional[str] = None,
    ):
        super().__init__()
        # steps_option: the option that counts the steps of an iteration whose i-th iterate does
        # not depend on the count (Chebyshev, GD, AGD: "iters"), or None. With it, a check run
        # with ``trajectory=True`` observes the kernel's iterates (one run per step count) and
        # ``scales`` receives them as ``observed=`` (analysis.bounds.contract.linear_bound)
        self.steps_option = steps_option
        # stored_outputs(contract) -> per output, the dtype to which the kernel's bound already
        # rounds that output (the store of its last iterate, state or o_t), or None: an output
        # returned in that dtype or a finer one was rounded once, inside the bound, so the
        # output-rounding term is not added a second time
        self.stored_outputs = stored_outputs
        # per output, the dims of its entries (core dims removed) that make one unit for the
        # vacuity test, or None: a KLA sequence's outputs o_t are judged together, since a
        # token whose output cancels to a small vector says nothing about the bound
        self.vacuity_dims = tuple(vacuity_dims) if vacuity_dims else (None,) * len(outputs)
        self.name, self.cases, self.outputs, self.core_dims = (
            name,
            cases,
            tuple(outputs),
            tuple(core_dims),
        )
        self.scales, self.doc, self.errors = scales, doc, errors

    def do_draw(self, data):
        return data.draw(self.cases)

    def __repr__(self) -> str:
        return f"Strategy({self.name})"


SPD_SCALES = (1.0, 1e-3, 37.5)  # the spectra's largest eigenvalues the spd strategies draw
REVERSE_MAX_ITERS = 5  # spd_backward's steps for the "reverse" method (_spd_case)


def _dims(max_d: int, pow2: bool) -> list:
    if pow2:
        return [d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d <= max_d] or [1]
    return sorted({1, 2, 3, 5, 8, 13, 16, 17, 64, 100, 128, max_d} & set(range(1, max_d + 1)))


def _draw_iters(draw, hi: int, *, lo: int = 0) -> int:
    """An iteration count in ``lo..hi`` whose simplest choice is ``lo + 1`` steps, with ``lo``
    as likely as any other count.

    After every passing case hypothesis tries it again with some choices at their simplest
    value. Drawn as ``st.integers(0, hi)`` that put a third of the ``spd`` cases at ``iters = 0``
    (21 of 50 at seed 0), where a Chebyshev, GD or AGD kernel returns ``2q / (L + mu)`` or 0
    and no step of the iteration is checked. One step checks the step, omega_1 and rho: at
    kappa = 1 (the simplest spectrum) it is the exact solution, so a wrong constant shows in
    full (a rho from kappa + 1, a lagged omega). Shrinking goes to one step as well."""
    if hi <= lo:
        return lo
    k = draw(st.integers(0, hi - lo))
    return lo + 1 + k if k < hi - lo else lo


def _cg_min_iters(kappa: float, max_iters: int) -> int:
    """The fewest CG steps whose convergence bound can be conclusive: ``2 R^k <= 1/2`` with
    ``R = (sqrt(kappa) - 1) / (sqrt(kappa) + 1)`` (at most ``max_iters``).

    Below it ``cg_bound``'s rate ``2 R^k`` (times ``||x*||_A``, the size it is compared with) is
    vacuous whatever the contract (at 0 steps ``x = 0`` and the bound is ``2 ||x*||_A``), and
    one such case made every run of a correct CG INCONCLUSIVE: at seed 0, 50 examples, 22 of the
    ``spd_nobounds`` cases under ``float32``. The kappa is the drawn one: rounding H to bf16 can
    raise it (near kappa = 1000), and such a case can still be vacuous."""
    r = (math.sqrt(kappa) - 1.0) / (math.sqrt(kappa) + 1.0)
    need = 1 if r <= 0.0 else math.ceil(math.log(4.0) / -math.log(r))
    return min(max(1, need), max_iters)


@st.composite
def _spd_case(
    draw,
    *,
    max_d,
    max_batch,
    max_iters,
    max_kappa,
    bounds,
    cotangent,
    methods,
    precision,
    device,
    pow2=False,
    unit_q=False,
    min_lambda=None,
):
    # D = max_d, the largest size a kernel's tiles must cover (where padding and masking slips
    # live), was one of up to 11 sizes (9% of the cases at max_d = 128); weighted to about a
    # quarter. The first size (1) stays the simplest, where shrinking goes.
    dims = _dims(max_d, pow2)
    D = draw(st.sampled_from(dims + dims[-1:] * (len(dims) // 4)))
    n = draw(st.sampled_from(sorted({1, 2, 3, 7, max_batch} & set(range(1, max_batch + 1)))))
    batch = draw(st.sampled_from([(n,), (1, n), ()] if n == 1 else [(n,), (n, 1)]))
    method = draw(st.sampled_from(methods)) if methods else None
    reverse = method in ("reverse", "reverse_stored_omega")
    # the reverse methods in GKA's regime, kappa >= 10 (Remark 2): below it omega_i - 1 is
    # small and eq. (49) amplifies errors by (omega_i - 1)^(-1/2) per step (GKA Remark 2)
    if min_lambda is None:
        kappa = draw(
            st.floats(10.0, max(10.0, max_kappa)) if reverse else st.floats(1.0, max_kappa)
        )
        # "reverse" rebuilds its weights through the unstable recurrence (47): up to r = 5 its
        # running bound stays conclusive under every contract (bf16 operands, kappa 10: dH's
        # bound 0.64 of ||dH|| at r = 5, 1.2 at r = 6; tests/test_harness_reverse_backward_bound.py)
        hi = min(max_iters, REVERSE_MAX_ITERS) if method == "reverse" else max_iters
        iters = _draw_iters(draw, hi, lo=0 if bounds else _cg_min_iters(kappa, hi))
        scale = draw(st.sampled_from(SPD_SCALES))
    else:  # lambda_min = scale / kappa >= min_lambda by construction (a filter starved hypothesis)
        scale = draw(st.sampled_from([s for s in SPD_SCALES if s >= min_lambda]))
        kappa = draw(st.floats(1.0, min(max_kappa, scale / min_lambda)))
        iters = _draw_iters(draw, max_iters, lo=0 if bounds else _cg_min_iters(kappa, max_iters))
    seed = draw(st.integers(0, 2**31 - 1))
    loose = draw(st.sampled_from([1.0, 1.25]))
    per_system = draw(st.booleans())
    try:
        return spd_case(
            D,
            batch,
            kappa,
            iters=iters,
            scale=scale,
            seed=seed,
            loose=loose,
            per_system=per_system,
            bounds=bounds,
            cotangent=cotangent,
            method=method,
            precision=precision,
            device=device,
            unit_q=unit_q,
        )
    except ValueError:  # rounding to the input dtype made a matrix indefinite
        assume(False)


def spd_case(
    D: int,
    batch: tuple,
    kappa: float,
    *,
    iters: int,
    scale: float = 1.0,
    seed: int = 0,
    loose: float = 1.0,
    per_system: bool = True,
    bounds: bool = True,
    cotangent: bool = False,
    method: Optional[str] = None,
    precision: torch.dtype = torch.bfloat16,
    device="cpu",
    unit_q: bool = False,
) -> Case:
    """One :class:`Case` of SPD systems ``H (*batch, D, D)`` with spectrum in
    ``[scale/kappa, scale]`` (:func:`analysis.testing.strategies.spd.log_uniform_spd`), a Gaussian q (unit norm with ``unit_q``;
    and cotangent ``grad_x``).

    ``bounds``: options ``L, mu`` enclosing the spectrum of H *as rounded to* ``precision``
    (widened by ``loose``; one pair for the batch unless ``per_system``; ``L >= 1.5 mu`` for the
    reverse methods, which need L > mu). Raises ValueError if rounding made a matrix indefinite.
    """
    build_kwargs = dict(
        D=D,
        batch=tuple(batch),
        kappa=float(kappa),
        iters=iters,
        scale=scale,
        seed=seed,
        loose=loose,
        per_system=per_system,
        bounds=bounds,
        cotangent=cotangent,
        method=method,
        precision=precision,
        device=str(device),
        unit_q=unit_q,
    )
    reverse = method in ("reverse", "reverse_stored_omega")
    gen = torch.Generator(device=device).manual_seed(seed)
    H = log_uniform_spd(D, max(1, math.prod(batch)), kappa, scale, gen).reshape(*batch, D, D)
    q = torch.randn(*batch, D, dtype=torch.float64, generator=gen, device=device)
    if unit_q:
        q = q / q.norm(dim=-1, keepdim=True)
    ev = torch.linalg.eigvalsh(H.to(precision).to(torch.float64))
    lo, hi = ev[..., 0], ev[..., -1]
    if not bool((lo > 0).all()):
        raise ValueError(f"a matrix is not positive definite once rounded to {precision}")
    inputs = {"H": H, "q": q}
    if cotangent:
        inputs["grad_x"] = torch.randn(*batch, D, dtype=torch.float64, generator=gen, device=device)
    options = {"iters": iters}
    if bounds:
        L, mu = hi * loose, lo / loose
        if reverse:  # the reverse methods need L > mu strictly
            L = torch.maximum(L, mu * 1.5)
        if not per_system:
            L, mu = float(L.max()), float(mu.min())
        options.update(L=L, mu=mu)
    if method:
        options["method"] = method
    label = (
        f"D={D} batch={batch} kappa={float(kappa)!r} scale={scale} iters={iters} seed={seed} "
        f"loose={loose} per_system_bounds={per_system}" + (f" method={method}" if method else "")
    )
    return Case(
        inputs, options, label, build="analysis.testing.harness.spd_case", build_kwargs=build_kwargs
    )


def _lam_min(H: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigvalsh(H)[..., 0]


def _kappa(H: torch.Tensor, options: dict) -> torch.Tensor:
    """L/mu when the method is given bounds, the matrix's own condition number otherwise."""
    if "L" in options:
        L = torch.as_tensor(options["L"], dtype=torch.float64, device=H.device)
        mu = torch.as_tensor(options["mu"], dtype=torch.float64, device=H.device)
        return torch.broadcast_to(L / mu, H.shape[:-2])
    ev = torch.linalg.eigvalsh(H)
    return ev[..., -1] / ev[..., 0]


def allowances(kappa, n: int, model) -> torch.Tensor:
    """A-priori ``allowance(model) + allowance(float32)`` (analysis.precision.rounding_allowance);
    ``model`` an Arith or a contract (mapped by ``analysis.bounds.contract.arith_of``)."""
    arith = model if isinstance(model, Arith) else arith_of(as_contract(model))
    kappa = torch.as_tensor(kappa, dtype=torch.float64)
    return (rounding_allowance(1.0, n, arith) + rounding_allowance(1.0, n, REFERENCE_ARITH)) * kappa


def _method_of(case: Case) -> str:
    """The linear method the reference runs: ``case.meta["method"]``, or read off the reference's
    name (``solvers.gd`` -> gd, ``solvers.agd`` -> agd), else Chebyshev."""
    if "method" in case.meta:
        return case.meta["method"]
    ref = case.meta.get("reference", "")
    tail = ref.rsplit(".", 1)[-1]
    return tail if tail in ("gd", "agd") else "chebyshev"


def _two_runs(method, H, q, options, contract, observed=None, **kw):
    """The kernel's running bound plus the float32 reference's (both against the exact run);
    ``observed``: the kernel's own iterates (trajectory mode), checked step by step."""
    # H's values as received: rounded again where the contract's operand format is coarser
    # (float32 inputs under bf16 operands or tf32)
    args = dict(
        L=options["L"], mu=options["mu"], iters=options["iters"], value_u=value_roundoff(H), **kw
    )
    k = linear_bound(method, H, q, contract=contract, observed=observed, **args)
    r = linear_bound(method, H, q, contract=REFERENCE_CONTRACT, **args)
    return k, r


def note_trajectory(case: Case, run) -> None:
    """Record in ``case.meta["trajectory"]`` the worst step of a ``linear_bound`` run given the
    kernel's iterates (``run.departed``): ``(step, system, ratio, error, bound, ||x_step||)``, the first step
    of the largest ratio. :func:`run_case` reports it as the finding ``x at step i of r``, a FAIL
    when the ratio exceeds 1 (the kernel left its bound there, and the final bound, built on
    its values, is void)."""
    d = run.departed.reshape(run.departed.shape[0], -1)
    d = torch.nan_to_num(d, nan=math.inf)
    worst = d.amax(-1)
    step = int(torch.nonzero(worst == worst.max())[0, 0])
    system = int(torch.argmax(d[step]))
    ratio = float(d[step, system])
    bound = float(run.bound[step].reshape(-1)[system])
    size = float(torch.linalg.vector_norm(run.x[step], dim=-1).reshape(-1)[system])
    case.meta["trajectory"] = (step, system, ratio, ratio * bound, bound, size)


def _solve_scales(case, rounded, contract, observed=None):
    """x: running bounds of the kernel's contract and of the float32 reference
    (``analysis.bounds.contract.linear_bound``) for the method the reference runs."""
    H, q = rounded["H"].cpu(), rounded["q"].cpu()
    opts = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in case.options.items()}
    k, r = _two_runs(_method_of(case), H, q, opts, contract, observed)
    if observed is not None:
        note_trajectory(case, k)
    return ((k.bound[-1] + r.bound[-1]).to(rounded["H"].device),)


def _stored_iterate(contract) -> tuple:
    """x: ``linear_bound`` bounds the store of the last iterate too when the contract stores it."""
    return (contract.storage if contract.stores("iterate") else None,)


def _cg_errors(case, rounded, k_out, r_out):
    """CG: the kernel's A-norm error to the exact solution x* (float64), and the A-norm size of
    the one rounding of its stored output, ``u(out) sqrt(lam_max) ||x_hat||``."""
    H, q = rounded["H"], rounded["q"]
    x = k_out[0].to(torch.float64)
    xs = torch.linalg.solve(H, q.unsqueeze(-1)).squeeze(-1)
    e = x - xs
    err = torch.sqrt(torch.clamp((e * (H @ e.unsqueeze(-1)).squeeze(-1)).sum(-1), min=0.0))
    top = torch.linalg.eigvalsh(H)[..., -1]
    return ((err, unit_roundoff(k_out[0].dtype) * top.sqrt() * x.norm(dim=-1)),)


def _cg_scales(case, rounded, contract):
    """CG's finite-precision convergence bound for the kernel's contract
    (``analysis.bounds.contract.cg_bound``, a model: see there), times ``||x*||_A``; given q,
    the bound uses where x* lies in H's spectrum."""
    H, q = rounded["H"], rounded["q"]
    xs = torch.linalg.solve(H, q.unsqueeze(-1)).squeeze(-1)
    size = torch.sqrt((xs * q).sum(-1))
    rel = cg_bound(H.cpu(), iters=case.options["iters"], contract=contract, q=q.cpu()).relative
    return (rel.to(H.device) * size,)


def _strategy_options(
    *, positive=(), non_negative=(), at_least_one=(), positive_floats=(), precision=None
):
    """Check a strategy factory's options up front (a bad option is the caller's error, named
    here, never a FAIL of the kernel): each group is ``(name, value)`` pairs."""
    for name, v, lo in [(n, v, 1) for n, v in positive] + [(n, v, 0) for n, v in non_negative]:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    for name, v, strict, lo in [(n, v, False, 1.0) for n, v in at_least_one] + [
        (n, v, True, 0.0) for n, v in positive_floats
    ]:
        ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (v <= lo if strict else v < lo):
            sign = ">" if strict else ">="
            raise ValueError(f"{name} must be a finite number {sign} {lo:g}, got {v!r}")
    if precision is not None:
        input_dtype(precision)


def spd(
    max_d: int = 16,
    max_batch: int = 4,
    max_iters: int = 30,
    max_kappa: float = 100.0,
    bounds: bool = True,
    precision: torch.dtype = torch.bfloat16,
    device="cpu",
    *,
    pow2: bool = False,
    unit_q: bool = False,
    min_lambda: Optional[float] = None,
    method: Optional[str] = None,
) -> Strategy:
    """Batches of SPD systems ``H x = q`` with known spectrum (kappa up to ``max_kappa``), for
    solvers called as ``f(H, q, *, [L, mu,] iters)``; ``bounds=False`` for CG.

    ``precision``: the kernel's input dtype (L, mu enclose the rounded matrix's spectrum);
    ``device``: where cases are generated; ``pow2``: D a power of two only (kernels that do not
    pad); ``unit_q``: unit-norm right-hand sides; ``min_lambda``: only spectra with
    ``lambda_min >= min_lambda``; ``method``: "chebyshev" / "gd" / "agd" (default: read off the
    reference's name)."""
    _strategy_options(
        positive=(("max_d", max_d), ("max_batch", max_batch)),
        non_negative=(("max_iters", max_iters),),
        at_least_one=(("max_kappa", max_kappa),),
        positive_floats=() if min_lambda is None else (("min_lambda", min_lambda),),
        precision=precision,
    )
    if min_lambda is not None and min_lambda > max(SPD_SCALES):
        raise ValueError(
            f"min_lambda must be at most {max(SPD_SCALES)} (the largest spectrum scale drawn), "
            f"got {min_lambda}"
        )
    if method is not None and method not in LINEAR_METHODS:
        # checked here: in the bound, a typo was a FAIL "with an exception outside any case"
        raise ValueError(f"method must be one of {LINEAR_METHODS} or None, got {method!r}")
    cases = _spd_case(
        max_d=max_d,
        max_batch=max_batch,
        max_iters=max_iters,
        max_kappa=max_kappa,
        bounds=bounds,
        cotangent=False,
        methods=None,
        precision=precision,
        device=device,
        pow2=pow2,
        unit_q=unit_q,
        min_lambda=min_lambda,
    )
    if method is not None:
        cases = cases.map(lambda c: _with_meta(c, method=method))
    if not bounds:
        return Strategy(
            "spd_nobounds",
            cases,
            ("x",),
            (1,),
            _cg_scales,
            errors=_cg_errors,
            doc="SPD systems for CG; A-norm error to x* within CG's finite-precision convergence bound",
        )
    return Strategy(
        "spd",
        cases,
        ("x",),
        (1,),
        _solve_scales,
        doc="SPD systems; running bound of the contract along the exact trajectory",
        stored_outputs=_stored_iterate,
        steps_option="iters",
    )


def _with_meta(case: Case, **meta) -> Case:
    case.meta.update(meta)
    return case


# ---------------------------------------------------------------------- GKA ridge form


def gka_ridge_reference(H, q, *, a: float, iters: int):
    """GKA eq. (4) then Algorithm 1 with the references: ``solvers.gka_ridge`` (lambda = a ||H||_F,
    L = ||H||_F (1 + a), mu = lambda) and ``solvers.chebyshev`` on ``H + lambda I``."""
    import solvers

    sys_ = solvers.gka_ridge(H, a)
    return solvers.chebyshev(sys_.A, q, L=sys_.L, mu=sys_.mu, iters=iters)


def gka_ridge_case(
    D: int,
    batch: tuple,
    *,
    a: float,
    iters: int,
    kappa_h: float = 100.0,
    scale: float = 1.0,
    seed: int = 0,
    unit_q: bool = True,
    device="cpu",
) -> Case:
    """Systems of GKA's ridge form: H symmetric positive semidefinite (spectrum in
    ``[scale/kappa_h, scale]``), q (unit norm by default, as GKA's normalised queries), ridge
    strength a; the callables solve ``(H + a ||H||_F I) x = q`` in ``iters`` Chebyshev steps."""
    build_kwargs = dict(
        D=D,
        batch=tuple(batch),
        a=float(a),
        iters=iters,
        kappa_h=float(kappa_h),
        scale=scale,
        seed=seed,
        unit_q=unit_q,
        device=str(device),
    )
    gen = torch.Generator(device=device).manual_seed(seed)
    H = log_uniform_spd(D, max(1, math.prod(batch)), kappa_h, scale, gen).reshape(*batch, D, D)
    q = torch.randn(*batch, D, dtype=torch.float64, generator=gen, device=device)
    if unit_q:
        q = q / q.norm(dim=-1, keepdim=True)
    label = f"D={D} batch={batch} a={float(a)!r} kappa_h={float(kappa_h)!r} scale={scale} iters={iters} seed={seed}"
    return Case(
        {"H": H, "q": q},
        {"a": float(a), "iters": iters},
        label,
        build="analysis.testing.harness.gka_ridge_case",
        build_kwargs=build_kwargs,
    )


@st.composite
def _gka_ridge_case(draw, *, max_d, max_batch, max_iters, min_a, pow2, unit_q, device):
    D = draw(st.sampled_from(_dims(max_d, pow2)))
    n = draw(st.sampled_from(sorted({1, 2, 3, max_batch} & set(range(1, max_batch + 1)))))
    a = draw(
        st.sampled_from([x for x in (0.02, 0.05, 0.2, 1.0) if x >= min_a] or [min_a])
        | st.floats(min_a, max(min_a, 1.0))
    )
    return gka_ridge_case(
        D,
        (n,),
        a=a,
        iters=draw(st.integers(0, max_iters)),
        kappa_h=draw(st.sampled_from([1.0, 10.0, 1e4])),
        scale=draw(st.sampled_from([1.0, 0.05, 37.5])),
        seed=draw(st.integers(0, 2**31 - 1)),
        unit_q=unit_q,
        device=device,
    )


def _ridge_scales(case, rounded, contract, observed=None):
    """x: Chebyshev on ``H + lambda I`` with L, mu of eq. (4) from the stored H; the kernel's
    lambda and step carry the relative error of its own ||H||_F (``fro_error``)."""
    H, q = rounded["H"].cpu(), rounded["q"].cpu()
    a, iters = case.options["a"], case.options["iters"]
    fro = torch.linalg.matrix_norm(H)
    lam = a * fro
    out = []
    for c, obs in ((as_contract(contract), observed), (REFERENCE_CONTRACT, None)):
        rel = fro_error(H.shape[-1], c)
        if not math.isfinite(rel):  # ||H||_F in bf16 (strict): no bound on lambda, none on x
            out.append(torch.full(H.shape[:-2], math.inf, dtype=torch.float64))
            continue
        run = linear_bound(
            "chebyshev",
            H,
            q,
            L=fro + lam,
            mu=lam,
            iters=iters,
            contract=c,
            shift=lam,
            shift_error=lam * rel,
            param_rel_error=rel,
            observed=obs,
            value_u=value_roundoff(H),
        )
        if obs is not None:
            note_trajectory(case, run)
        out.append(run.bound[-1])
    return ((out[0] + out[1]).to(rounded["H"].device),)


def gka_ridge(
    max_d: int = 16,
    max_batch: int = 3,
    max_iters: int = 30,
    min_a: float = 0.02,
    precision: torch.dtype = torch.bfloat16,
    device="cpu",
    *,
    pow2: bool = False,
    unit_q: bool = True,
) -> Strategy:
    """GKA's ridge form (eq. (4)): ``f(H, q, *, a, iters)`` solves ``(H + a ||H||_F I) x = q`` by
    Algorithm 1 with ``L = ||H||_F (1 + a)``, ``mu = a ||H||_F`` (kappa <= (1 + a)/a: 51 at
    a = 0.02); ``min_a``: the smallest ridge strength drawn (lambda >= min_a ||H||_F);
    reference :func:`gka_ridge_reference`, kernel e.g. ``kernels.chebyshev_adaptive``."""
    _strategy_options(
        positive=(("max_d", max_d), ("max_batch", max_batch)),
        non_negative=(("max_iters", max_iters),),
        positive_floats=(("min_a", min_a),),
        precision=precision,
    )
    cases = _gka_ridge_case(
        max_d=max_d,
        max_batch=max_batch,
        max_iters=max_iters,
        min_a=min_a,
        pow2=pow2,
        unit_q=unit_q,
        device=device,
    )
    return Strategy(
        "gka_ridge",
        cases,
        ("x",),
        (1,),
        _ridge_scales,
        doc="GKA ridge systems; running bound of the contract on H + a||H||_F I",
        stored_outputs=_stored_iterate,
        steps_option="iters",
    )


# ---------------------------------------------------------------------- backward


def _backward_scales(case, rounded, contract):
    """dq = CH(H, g, r) (Lemma 2: the forward recurrence on the cotangent).

    * implicit: running bounds (``linear_bound``) of the kernel's contract and of float32 for
      dq and for x = CH(H, q, r); dH = -dq x^T, so ``||dH_hat - dH|| <= E_dq (||x|| + E_x) +
      ||dq|| E_x`` plus the outer product's rounding ``u_acc ||dq_hat|| ||x_hat||``;
    * reverse methods ("reverse", "reverse_stored_omega", GKA Algorithm 2 corrected): the
      running bound of ``analysis.bounds.reverse_backward.reverse_backward_bound`` for the
      kernel's contract plus the float32 reference's: the forward's local errors, the reversed
      steps' (49) and the adjoint's (46) local errors, each through its exact response on H's
      eigenvalues (the reversal's growth ``(omega_i - 1)^(-1/2)`` per step included), to dq and
      dH (eq. (48)). It replaces the former a-priori allowance (``allowances`` times
      ``reverse_growth * 2 * adjoint_sum``), which was a house model, not a bound (the new one
      is rigorous but for the float32 constants and weights, first order with a margin of 2, as in
      ``contract.linear_bound``); where the
      reversal's growth makes it vacuous (dH in bf16 beyond a few steps) the case is vacuous
      and the verdict INCONCLUSIVE.
    """
    H, q, g = rounded["H"], rounded["q"], rounded["grad_x"]
    opts = case.options
    method = opts["method"]
    dev = H.device
    c = as_contract(contract)
    Hc, qc, gc = H.cpu(), q.cpu(), g.cpu()
    o = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in opts.items()}
    if method == "implicit":
        dq_k, dq_r = _two_runs("chebyshev", Hc, gc, o, c)
        x_k, x_r = _two_runs("chebyshev", Hc, qc, o, c)
        E_dq = dq_k.bound[-1] + dq_r.bound[-1]
        E_x = x_k.bound[-1] + x_r.bound[-1]
        ndq, nx = dq_k.x[-1].norm(dim=-1), x_k.x[-1].norm(dim=-1)
        outer = c.u_acc * (ndq + E_dq) * (nx + E_x) + REFERENCE_CONTRACT.u_acc * ndq * nx
        return E_dq.to(dev), (E_dq * (nx + E_x) + ndq * E_x + outer).to(dev)
    args = dict(L=o["L"], mu=o["mu"], iters=o["iters"], method=method)
    k = reverse_backward_bound(Hc, qc, gc, contract=c, **args)
    r = reverse_backward_bound(Hc, qc, gc, contract=REFERENCE_CONTRACT, **args)
    return (k.dq + r.dq).to(dev), (k.dH + r.dH).to(dev)


def spd_backward(
    max_d: int = 16,
    max_batch: int = 4,
    max_iters: int = 12,
    max_kappa: float = 100.0,
    methods=("implicit", "reverse", "reverse_stored_omega"),
    precision: torch.dtype = torch.bfloat16,
    device="cpu",
    *,
    pow2: bool = False,
) -> Strategy:
    """SPD systems with a cotangent, for backward passes ``f(H, q, grad_x, *, L, mu, iters,
    method) -> (dq, dH)``. Reverse methods: kappa >= 10 (GKA Remark 2's regime); "reverse"
    keeps r <= REVERSE_MAX_ITERS = 5 (its weights come through the unstable recurrence (47);
    beyond, its bound turns vacuous in bf16)."""
    _strategy_options(
        positive=(("max_d", max_d), ("max_batch", max_batch)),
        non_negative=(("max_iters", max_iters),),
        at_least_one=(("max_kappa", max_kappa),),
        precision=precision,
    )
    cases = _spd_case(
        max_d=max_d,
        max_batch=max_batch,
        max_iters=max_iters,
        max_kappa=max_kappa,
        bounds=True,
        cotangent=True,
        methods=tuple(methods),
        precision=precision,
        device=device,
        pow2=pow2,
    )
    return Strategy(
        "spd_backward",
        cases,
        ("dq", "dH"),
        (1, 2),
        _backward_scales,
        doc="SPD systems + cotangent; bounds in _backward_scales",
    )


# ---------------------------------------------------------------------- KLA


def kla_harness_case(
    T: int,
    *,
    B: int,
    H: int,
    d_k: int,
    d_v: int,
    key_norms: tuple,
    per_channel: bool,
    alpha_low: float,
    chunk_size: int,
    seed: int,
    precision: torch.dtype = torch.bfloat16,
    device="cpu",
    eta_high: float = 1.0,
) -> Case:
    """One KLA case in fla's layout (analysis.testing.strategies.kla_case), gates rounded to the input
    dtype as a kernel stores them; eta uniform in [0.5, eta_high] (KLA allows up to 2)."""
    from analysis.testing.strategies import kla_case

    build_kwargs = dict(
        T=T,
        B=B,
        H=H,
        d_k=d_k,
        d_v=d_v,
        key_norms=tuple(float(x) for x in key_norms),
        per_channel=per_channel,
        alpha_low=float(alpha_low),
        chunk_size=chunk_size,
        seed=seed,
        precision=precision,
        device=str(device),
        eta_high=float(eta_high),
    )
    c = kla_case(
        T,
        B=B,
        H=H,
        d_k=d_k,
        d_v=d_v,
        key_norms=tuple(key_norms),
        per_channel=per_channel,
        alpha=(alpha_low, 1.0),
        eta=(0.5, float(eta_high)),
        chunk_size=chunk_size,
        seed=seed,
    )
    opts = {
        "alpha": c.alpha.to(precision).to(torch.float32).to(device),
        "eta": c.eta.to(precision).to(torch.float32).to(device),
        "eps": c.eps,
        "chunk_size": chunk_size,
    }
    label = (
        f"B,T,H={tuple(c.q.shape[:3])} d_k={d_k} d_v={d_v} key_norms={tuple(key_norms)!r} "
        f"alpha>={alpha_low} eta<={eta_high} per_channel={per_channel} seed={seed}"
    )
    return Case(
        {"q": c.q.to(device), "k": c.k.to(device), "v": c.v.to(device)},
        opts,
        label,
        build="analysis.testing.harness.kla_harness_case",
        build_kwargs=build_kwargs,
    )


@st.composite
def _kla_case(
    draw, *, max_T, dims, max_heads, max_batch, chunk_size, per_channel, precision, device
):
    T = draw(
        st.sampled_from(
            sorted(
                {1, 5, chunk_size - 1, chunk_size, chunk_size + 3, 100, 300, max_T}
                & set(range(1, max_T + 1))
            )
        )
    )
    # keys down to norm 1e-3, where eps/||k||^2 is no longer negligible, and eta up to 2 (KLA's
    # range): without them a misplaced eps or a clipped eta went unseen
    lo = 10.0 ** draw(st.floats(-3.0, 0.0))
    return kla_harness_case(
        T,
        B=draw(st.integers(1, max_batch)),
        H=draw(st.integers(1, max_heads)),
        d_k=draw(st.sampled_from(dims)),
        d_v=draw(st.sampled_from(dims)),
        key_norms=(lo, lo * 10.0 ** draw(st.floats(0.0, 1.0))),
        per_channel=draw(st.booleans()) if per_channel else False,
        alpha_low=draw(st.sampled_from((0.5, 0.9, 0.99))),
        eta_high=draw(st.sampled_from((1.0, 2.0))),
        chunk_size=chunk_size,
        seed=draw(st.integers(0, 2**31 - 1)),
        precision=precision,
        device=device,
    )


KLA_FORMS = ("chunkwise", "tokenwise", "either")


def _kla_scales(case, rounded, contract, form="chunkwise"):
    """o_t and S_T: the kernel's running error bound in its contract (mapped onto the
    references' arithmetic by ``arith_of``: a bf16-operand kernel is held to the bf16-storage
    bound, whose stored roundings are where its operand roundings enter) plus the float32
    reference's (tokenwise and chunkwise bounds added, so either reference form is covered):
    ``analysis.bounds.kaczmarz.kla_chunkwise_bound`` / ``kla_tokenwise_bound`` (docs/kla.md).
    The kernel's bound is that of the form it declares (``form``): KLA Algorithm 1 token by token
    (``"tokenwise"``), its chunkwise WY form (``"chunkwise"``, fla's and ours), or ``"either"``
    (the larger of the two, entry by entry). In bf16 a tokenwise kernel rounds its state every
    token and errs up to about 4 times more than the chunkwise bound allows (state rounded once
    a chunk): held to it, the toolkit's own ``solvers.kla_recurrent`` FAILs."""
    from analysis.bounds.kaczmarz import kla_chunkwise_bound, kla_tokenwise_bound

    x = {k: v.cpu() for k, v in rounded.items()}
    o = case.options
    kw = dict(
        alpha=o["alpha"].cpu().double(),
        eta=torch.as_tensor(o["eta"]).cpu().double(),
        eps=o["eps"],
        normalize_queries=o.get("normalize_queries", True),
    )
    C = o["chunk_size"]
    arith = arith_of(as_contract(contract))
    if form != "tokenwise":
        Bo, BS = kla_chunkwise_bound(x["q"], x["k"], x["v"], chunk_size=C, arith=arith, **kw)
    if form != "chunkwise":
        Ko, KS = kla_tokenwise_bound(x["q"], x["k"], x["v"], arith=arith, **kw)
        Bo, BS = (Ko, KS) if form == "tokenwise" else (torch.maximum(Bo, Ko), torch.maximum(BS, KS))
    To, TS = kla_tokenwise_bound(x["q"], x["k"], x["v"], arith=REFERENCE_ARITH, **kw)
    Co, CS = kla_chunkwise_bound(x["q"], x["k"], x["v"], chunk_size=C, arith=REFERENCE_ARITH, **kw)
    dev = rounded["q"].device
    return (Bo + To + Co).to(dev), (BS + TS + CS).to(dev)


def kla_prepare(rounded: dict, options: dict, precision: torch.dtype):
    """Fair pairing for KLA kernels whose API takes the normalised query and the Kaczmarz
    coefficient in the input dtype (fla's ``chunk_gated_delta_rule``): computes
    ``q_hat = q / ||q||`` and ``beta = eta / (||k||^2 + eps)`` once, rounds both to ``precision``,
    and hands both callables (and the bound) ``q_hat`` with ``normalize_queries=False`` and the
    ``eta`` that reproduces the rounded beta (``eta = beta (||k||^2 + eps)``, float32)."""
    q, k = rounded["q"], rounded["k"]
    qh = (
        (q.to(torch.float64) / q.to(torch.float64).norm(dim=-1, keepdim=True))
        .to(precision)
        .to(torch.float64)
    )
    nk = k.to(torch.float64).pow(2).sum(-1) + options["eps"]
    eta = torch.as_tensor(options["eta"], dtype=torch.float64, device=q.device)
    beta = (eta / nk).to(precision).to(torch.float64)
    out = dict(rounded, q=qh)
    opts = dict(options, eta=(beta * nk).to(torch.float32), normalize_queries=False)
    return out, opts


def kla(
    max_T: int = 300,
    dims=(16, 32, 64),
    max_heads: int = 2,
    max_batch: int = 2,
    chunk_size: int = 64,
    per_channel: bool = False,
    precision: torch.dtype = torch.bfloat16,
    device="cpu",
    *,
    form: str = "chunkwise",
) -> Strategy:
    """KLA sequences (analysis.testing.strategies.kla_case) in fla's layout ``(B, T, H, d)``, for
    ``f(q, k, v, *, alpha, eta, eps, chunk_size[, normalize_queries]) -> (o, S_T)``
    (solvers.kla_chunkwise, solvers.kla_recurrent, a KLA kernel); zero initial state. ``form``:
    the form the kernel computes, whose bound it is held to (:func:`_kla_scales`):
    ``"chunkwise"`` (fla's and ours), ``"tokenwise"`` (a recurrent kernel) or ``"either"``."""
    if form not in KLA_FORMS:
        raise ValueError(f"form must be one of {KLA_FORMS}, got {form!r}")
    _strategy_options(
        positive=(("max_T", max_T), ("max_heads", max_heads), ("max_batch", max_batch))
        + tuple((f"dims[{i}]", d) for i, d in enumerate(dims)),
        precision=precision,
    )
    cases = _kla_case(
        max_T=max_T,
        dims=tuple(dims),
        max_heads=max_heads,
        max_batch=max_batch,
        chunk_size=chunk_size,
        per_channel=per_channel,
        precision=precision,
        device=device,
    )
    return Strategy(
        "kla",
        cases,
        ("o", "S_T"),
        (1, 2),
        functools.partial(_kla_scales, form=form),
        doc=f"KLA sequences ({form} form); bound: analysis.bounds.kaczmarz running error bounds",
        vacuity_dims=((-2,), None),  # o (B, T, H): a head's whole sequence is one unit
        stored_outputs=_kla_stored,
    )


def _kla_stored(contract) -> tuple:
    """o_t and S_T: the KLA bounds end with each o_t and S_T stored in the dtype of the
    references' arithmetic they are written for (``arith_of``: ``u_store |o_t|``,
    ``u_store |S_T|``, analysis.bounds.kaczmarz)."""
    dtype = arith_of(as_contract(contract)).dtype
    return (dtype, dtype)


STRATEGIES = {
    "spd": spd,
    "spd_nobounds": lambda **kw: spd(bounds=False, **kw),
    "spd_backward": spd_backward,
    "gka_ridge": gka_ridge,
    "kla": kla,
}


def koopman_case(**kw) -> Case:
    """One case of the ``koopman`` strategy, rebuilt exactly (arguments:
    ``analysis.testing.koopman_strategy.koopman_problem``)."""
    return Case(
        **koopman_problem(**kw), build="analysis.testing.harness.koopman_case", build_kwargs=kw
    )


def koopman(**options) -> Strategy:
    """Echo SKA readouts ``f(G, M, Cv, zq, *, scale, K, eta, gamma) -> y``; cases, options and
    the bound: ``analysis.testing.koopman_strategy`` (``koopman_strategy``)."""
    return Strategy(**koopman_strategy(koopman_case, **options))


STRATEGIES["koopman"] = koopman


# ---------------------------------------------------------------------------------------
# running checks
# ---------------------------------------------------------------------------------------


@dataclass
class Finding:
    """The error/bound ratio of one output of one system in one case (``reference_norm``: the
    norm of that system's reference output). ``vacuous``: the bound is at least the reference
    output's norm (no conclusion either way unless the error exceeds it); ``crash``: the
    exception or shape mismatch that made the case a finding."""

    ratio: float
    output: str
    system: int
    error: float
    bound: float
    case: str
    reference_norm: float = float("nan")
    vacuous: bool = False
    crash: str = ""
    snippet: str = ""
    # trajectory mode only: whether the case's bound used the kernel's iterates (False: it fell
    # back to the exact trajectory's bound, the kernel's runs differing)
    trajectory_observed: Optional[bool] = None

    @property
    def failed(self) -> bool:
        return bool(self.crash) or not self.ratio <= 1.0

    def __str__(self) -> str:
        if self.crash:
            return f"{self.crash} in case {self.case}"
        rel = (
            f", bound/||ref|| {self.bound / self.reference_norm:.4g}"
            if self.reference_norm and math.isfinite(self.reference_norm)
            else ""
        )
        return (
            f"ratio {self.ratio:.6g} (error {self.error:.6e} vs bound {self.bound:.6e}{rel}"
            f"{', VACUOUS bound' if self.vacuous else ''}) in output {self.output!r}, system {self.system}, "
            f"case {self.case}"
        )


@dataclass
class Report:
    kernel: str
    reference: str
    strategy: str
    precision: str
    model: str
    examples: int = 0
    worst: Optional[Finding] = None
    failure: Optional[Finding] = None
    error: Optional[str] = None
    history: list = field(default_factory=list)
    vacuous_cases: int = 0
    shrunk: bool = True
    seed: Optional[int] = None
    shrink_cases: int = 0  # of ``examples``, those run after the first failure (shrinking)
    trajectory: bool = False  # the kernel's iterates observed (check(trajectory=True))
    trajectory_fallbacks: int = 0  # cases whose iterates could not be used (not deterministic)

    @property
    def verdict(self) -> str:
        if self.failure is not None or self.error is not None:
            return FAIL
        if self.vacuous_cases or self.examples == 0:
            return INCONCLUSIVE
        return PASS

    @property
    def passed(self) -> bool:
        """No output beyond its bound and nothing crashed (PASS or INCONCLUSIVE; see :attr:`verdict`)."""
        return self.verdict != FAIL

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def _cases(self) -> str:
        """How many cases ran: those drawn, and apart from them those tried while shrinking (so
        that ``--examples 5`` is not reported as "103 cases")."""
        if not self.shrink_cases:
            return f"{self.examples} cases"
        drawn = self.examples - self.shrink_cases
        return f"{drawn} case{'s' if drawn != 1 else ''} drawn, {self.shrink_cases} more while shrinking"

    def __str__(self) -> str:
        head = (
            f"{self.kernel} vs {self.reference} | strategy {self.strategy} | inputs {self.precision} | "
            f"contract {self.model} | {self._cases()}"
            + (f" | seed {self.seed}" if self.seed is not None else "")
            + (" | trajectory observed" if self.trajectory else "")
        )
        if self.trajectory_fallbacks:
            head += (
                f" ({self.trajectory_fallbacks} case{'s' if self.trajectory_fallbacks != 1 else ''} "
                "not: runs that differ, bounded along the exact trajectory)"
            )
        lines = [head, f"worst: {self.worst}" if self.worst else "worst: (no case ran)"]
        if self.failure:
            what = "shrunk counterexample" if self.shrunk else "first failing case (not shrunk)"
            lines.append(f"FAIL, {what}: {self.failure}")
            if self.failure.snippet:
                lines.append(
                    "rebuild it with:\n"
                    + "\n".join("    " + s for s in self.failure.snippet.splitlines())
                )
        if self.error:
            lines.append(f"FAIL with an exception outside any case: {self.error}")
        if self.verdict == INCONCLUSIVE:
            why = (
                f"{self.vacuous_cases} of {self.examples} cases had a bound at least as large as the output "
                f"(no non-vacuous bound for this contract there)"
                if self.examples
                else "no case ran"
            )
            lines.append(f"INCONCLUSIVE: no output beyond its bound, but {why}")
        if self.verdict == PASS:
            lines.append("PASS: every output within its non-vacuous bound")
        return "\n".join(lines)


def _to(v, device):
    return v.to(device) if isinstance(v, torch.Tensor) else v


def _tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _crash(case: Case, strategy: Strategy, what: str) -> list:
    return [
        Finding(
            math.inf,
            strategy.outputs[0] if strategy.outputs else "?",
            0,
            math.nan,
            math.nan,
            case.label,
            crash=what,
            snippet=case.snippet(),
        )
    ]


def run_case(
    kernel,
    reference,
    strategy: Strategy,
    case: Case,
    *,
    precision: torch.dtype,
    model,
    device,
    prepare: Optional[Callable] = None,
    outputs: Optional[list] = None,
    trajectory: bool = False,
) -> list:
    """Run one case through both callables; returns one :class:`Finding` per output (the worst
    system of each). Never raises for the kernel: a crash or a wrong output is a finding.
    ``trajectory``: also run the kernel for every smaller step count (strategies with a
    ``steps_option``), bound its stores at its own values and check every step
    (:func:`observe_trajectory`).

    ``model``: the kernel's contract (a :class:`solvers.contracts.Contract`, a name, or a
    references' ``Arith``); ``prepare(rounded, options, precision) -> (inputs, options)``: what
    both callables (and the bound) receive instead of the rounded inputs (fair pairing);
    ``outputs``: a list that receives the kernel's outputs, for a caller that measures more than
    the bound without running the kernel twice."""
    _callables(kernel=kernel, reference=reference)
    if not isinstance(trajectory, bool):
        raise TypeError(f"trajectory must be True or False, got {trajectory!r}")
    contract = as_contract(model)
    precision = input_dtype(precision)
    device = _checked_device(device)
    strategy = as_strategy(strategy, precision, device)
    case.meta.setdefault("reference", _name(reference))
    rounded_in = {k: v.to(precision).to(device) for k, v in case.inputs.items()}
    opts = {k: _to(v, device) for k, v in case.options.items()}
    if prepare is not None:
        rounded_in, opts = prepare(rounded_in, opts, precision)
        rounded_in = {k: v.to(precision) for k, v in rounded_in.items()}
    # the reference (and the bound) get copies made before the kernel ran, so a kernel that
    # writes into its inputs is caught here, not blamed on the damaged reference
    ref_in = {k: v.to(torch.float32, copy=True) for k, v in rounded_in.items()}
    saved = {k: v.clone() for k, v in rounded_in.items()}
    saved_opts = {k: v.clone() for k, v in opts.items() if isinstance(v, torch.Tensor)}
    try:
        k_out = _tuple(kernel(*rounded_in.values(), **opts))
        if outputs is not None:
            outputs.extend(k_out)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a kernel that crashes is a finding
        return _crash(case, strategy, f"kernel raised {type(e).__name__}: {e}")
    changed = _modified(saved, rounded_in) + _modified(saved_opts, opts)
    if changed:
        return _crash(
            case, strategy, f"kernel modified its input {', '.join(map(repr, changed))} in place"
        )
    rounded_in, opts = saved, {**opts, **saved_opts}
    try:
        r_out = _tuple(reference(*ref_in.values(), **opts))
    except Exception as e:  # noqa: BLE001 - reported with the case, like a kernel crash
        return _crash(case, strategy, f"reference raised {type(e).__name__}: {e}")
    if len(k_out) != len(strategy.outputs) or len(r_out) != len(strategy.outputs):
        return _crash(
            case,
            strategy,
            f"expected outputs {strategy.outputs}, got {len(k_out)} from the kernel and "
            f"{len(r_out)} from the reference",
        )
    coarsest = _coarsest_output(contract, precision)
    for name, k, r in zip(strategy.outputs, k_out, r_out):
        if not isinstance(k, torch.Tensor) or k.shape != r.shape:
            got = tuple(k.shape) if isinstance(k, torch.Tensor) else type(k).__name__
            return _crash(
                case, strategy, f"output {name!r}: kernel gave {got}, reference {tuple(r.shape)}"
            )
        if k.device != r.device:
            # compared as is, this raised outside any case ("Tensor on device cpu is not on the
            # expected device meta!"): no case, no snippet, no word that the kernel was at fault
            return _crash(
                case,
                strategy,
                f"output {name!r}: kernel returned it on device {k.device}, but its inputs were "
                f"on {r.device}; return the result on the inputs' device",
            )
        if k.dtype not in OUTPUT_DTYPES:
            return _crash(
                case,
                strategy,
                f"output {name!r}: kernel gave dtype {str(k.dtype)[6:]}, expected one of "
                f"{', '.join(str(d)[6:] for d in OUTPUT_DTYPES)}",
            )
        if unit_roundoff(k.dtype) > unit_roundoff(coarsest):
            # the bound adds the rounding of the dtype the kernel returns, so an undeclared
            # downcast (float32 inputs, bf16 result) would pass with a bf16 allowance
            return _crash(
                case,
                strategy,
                f"output {name!r}: kernel gave dtype {str(k.dtype)[6:]}, coarser than "
                f"{str(coarsest)[6:]}, which the contract {contract.name!r} allows for "
                f"{str(precision)[6:]} inputs; declare the output dtype in the contract "
                f"(e.g. '{contract.name};output={str(k.dtype)[6:]}') if the kernel means to "
                "round its result",
            )
    observed = None
    if trajectory and strategy.steps_option is not None:
        # the outputs kept before the kernel runs again (it may reuse its output buffer)
        k_out = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in k_out)
        observed = observe_trajectory(kernel, rounded_in, opts, strategy.steps_option, k_out[0])
        if isinstance(observed, str):
            return _crash(case, strategy, observed)

    exact = {k: v.to(torch.float64) for k, v in rounded_in.items()}
    prepared = Case(case.inputs, opts, case.label, case.meta, case.build, case.build_kwargs)
    if observed is None:
        scales = strategy.scales(prepared, exact, contract)
    else:
        scales = strategy.scales(prepared, exact, contract, observed=observed)
    steps = []
    if observed is not None and "trajectory" in prepared.meta:
        step, system, ratio, error, bound, size = prepared.meta.pop("trajectory")
        f = Finding(
            ratio,
            f"{strategy.outputs[0]} at step {step} of {opts[strategy.steps_option]}",
            system,
            error,
            bound,
            case.label,
            reference_norm=size,  # the exact i-th iterate's: not a vacuity test, a scale
        )
        if f.failed:  # the final bound rests on the kernel's values: void from this step on
            f.snippet = case.snippet()
            return [f]
        steps.append(f)
    measured = strategy.errors(prepared, exact, k_out, r_out) if strategy.errors else None
    covered = (
        strategy.stored_outputs(contract)
        if strategy.stored_outputs
        else (None,) * len(strategy.outputs)
    )
    findings = []
    for idx, (name, core, k, r, b) in enumerate(
        zip(strategy.outputs, strategy.core_dims, k_out, r_out, scales)
    ):
        dims = tuple(range(-core, 0))
        k64, r64 = k.to(torch.float64), r.to(torch.float64)
        if measured is None:
            err = torch.linalg.vector_norm(k64 - r64, dim=dims) if core else (k64 - r64).abs()
            if _rounded_in_bound(covered[idx], k.dtype):
                out_round = torch.zeros((), dtype=torch.float64, device=err.device)
            else:
                out_round = output_rounding_bound(k, dims)
            size = torch.linalg.vector_norm(r64, dim=dims) if core else r64.abs()
        else:
            err, out_round = measured[idx]
            size = _measured_size(prepared, exact, idx, err)
        bound = torch.broadcast_to(b.to(err.device), err.shape) + out_round
        # a NaN bound (e.g. gamma_n with n u >= 1 times 0) is no bound: vacuous, never a failure
        bound = torch.nan_to_num(bound, nan=math.inf)
        # an exact match passes even where the bound is 0 (e.g. dH of r = 0 steps); NaN fails
        ratio = torch.where(err == 0, torch.zeros_like(err), err / bound).reshape(-1)
        ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, math.inf), ratio)
        if ratio.numel() == 0:
            continue
        unit = strategy.vacuity_dims[idx]
        if unit is not None and size.numel():
            size = torch.broadcast_to(size.amax(dim=unit, keepdim=True), size.shape)
        ref_norm = size.reshape(-1)
        vac = (bound.reshape(-1) >= ref_norm) & (ref_norm > 0)
        j = int(torch.argmax(ratio))
        f = Finding(
            float(ratio[j]),
            name,
            j,
            float(err.reshape(-1)[j]),
            float(bound.reshape(-1)[j]),
            case.label,
            float(ref_norm[j]),
            vacuous=bool(vac.any()),
        )
        if f.failed:
            f.snippet = case.snippet()
        findings.append(f)
    if trajectory and strategy.steps_option is not None:
        for f in findings + steps:
            f.trajectory_observed = observed is not None
    return findings + steps


OUTPUT_DTYPES = (torch.float64, torch.float32, torch.bfloat16)  # what the bounds model


def observe_trajectory(kernel, inputs: dict, options: dict, steps: str, last: torch.Tensor):
    """The kernel's iterates ``(r+1, *batch, D)``: copies of its first output run with ``steps =
    0, ..., r - 1``, then ``last`` (its output of the r-step run), in the dtype it returned; or
    a message (str) saying why a run is a finding: a crash, a shape or device that differs from
    the r-step output's, an input or option tensor written in place. Every run gets fresh copies
    of the inputs and option tensors. None (the check falls back to the bound along the exact
    trajectory, which holds for any run) where the trajectory is not one the bound can use: a
    step's output in another dtype than the r-step output's, or a repeated r-step run that
    differs from the first (a kernel that is not deterministic).

    Precondition of the bound built on the result (``analysis.bounds.contract.linear_bound``,
    ``observed``): the i-step run computes the first i steps of the r-step run, as Chebyshev,
    GD and AGD do; it is assumed, not checked. What is checked is that each i-step output lies
    within its step's bound of the exact i-th iterate. A kernel whose i-step runs are correct
    but round otherwise than its r-step run (a summation order chosen by the step count) can
    only be held to a smaller bound than it needs: a false FAIL, never a false PASS."""
    r = options[steps]
    outs = []
    for i in (*range(r), r):
        fresh = {k: v.clone() for k, v in inputs.items()}
        opts = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in options.items()}
        try:
            out = _tuple(kernel(*fresh.values(), **{**opts, steps: i}))[0]
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a crash is a finding
            return f"kernel raised {type(e).__name__}: {e} when run with {steps}={i}"
        tensors = {k: v for k, v in options.items() if isinstance(v, torch.Tensor)}
        written = _modified(inputs, fresh) + _modified(tensors, opts)
        if written:
            return (
                f"kernel modified its input {', '.join(map(repr, written))} in place when run "
                f"with {steps}={i}"
            )
        if (
            not isinstance(out, torch.Tensor)
            or out.shape != last.shape
            or out.device != last.device
        ):
            got = (
                f"shape {tuple(out.shape)} on {out.device}"
                if isinstance(out, torch.Tensor)
                else type(out).__name__
            )
            return (
                f"kernel run with {steps}={i} returned {got}, its {steps}={r} run shape "
                f"{tuple(last.shape)} on {last.device}"
            )
        if out.dtype != last.dtype:
            return None
        # a copy: a kernel may hand back the same buffer on every call (a CUDA-graph replay)
        outs.append(out.detach().to("cpu", copy=True))
    if not _same(outs[-1], last.detach().cpu()):
        return None
    return torch.stack(outs[:-1] + [last.detach().to("cpu", copy=True)])


def output_rounding_bound(y: torch.Tensor, dims: tuple) -> torch.Tensor:
    """A bound on ``||y - v||_2`` over ``dims`` (an entry's absolute value for ``dims = ()``) for
    any value v that rounds to nearest to the result ``y`` in its dtype: half a spacing at each
    entry, ``u 2^floor(log2 |y_i|)`` (u = the dtype's unit roundoff; ``u 2^e_min`` for a zero or
    subnormal entry). Below a power of two ``y_i = 2^e`` the spacing halves, so ``u 2^e`` covers
    both sides. At most ``u |y_i|`` for a normal entry (Higham eq. (2.4)), on average about 0.7 of it."""
    h = half_spacings(y.detach(), unit_roundoff(y.dtype), y.dtype)
    return torch.linalg.vector_norm(h, dim=dims) if dims else h


def _rounded_in_bound(stored: Optional[torch.dtype], out: torch.dtype) -> bool:
    """Whether an output returned in ``out`` was already rounded inside the bound (the strategy's
    ``stored_outputs``: it bounds a store to ``stored``, and ``out`` is that dtype or finer, so
    returning the stored value rounds nothing more)."""
    return stored is not None and unit_roundoff(out) <= unit_roundoff(stored)


def _coarsest_output(contract, precision: torch.dtype) -> torch.dtype:
    """The coarsest result dtype a contract allows for inputs of ``precision``: its declared
    ``output``; else the inputs' dtype, or the storage dtype where the contract stores
    intermediates rounded to it (a bf16-storage kernel may return its stored iterate)."""
    if contract.output is not None:
        return contract.output
    if contract.stored and unit_roundoff(contract.storage) > unit_roundoff(precision):
        return contract.storage
    return precision


def _modified(before: dict, after: dict) -> list:
    """The names of the tensors in ``before`` whose values in ``after`` differ (written in place)."""
    return [k for k, v in before.items() if not _same(v, after[k])]


def _same(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Bitwise the same values (NaN where NaN was)."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    eq = before == after
    if before.is_floating_point():
        eq = eq | (torch.isnan(before) & torch.isnan(after))
    return bool(eq.all())


def input_dtype(precision) -> torch.dtype:
    """A kernel input dtype from its name in PRECISIONS or the dtype itself; ValueError else."""
    if isinstance(precision, str) and precision in PRECISIONS:
        return PRECISIONS[precision]
    if isinstance(precision, torch.dtype) and precision in PRECISIONS.values():
        return precision
    raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")


def as_strategy(strategy, precision: torch.dtype, device) -> Strategy:
    """A :class:`Strategy`, or one of STRATEGIES by name built for ``precision`` and ``device``."""
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str) and strategy in STRATEGIES:
        return STRATEGIES[strategy](precision=precision, device=device)
    raise ValueError(
        f"strategy must be an analysis.testing.harness.Strategy or one of {sorted(STRATEGIES)}, "
        f"got {strategy!r}"
    )


def _measured_size(case: Case, exact: dict, idx: int, err: torch.Tensor) -> torch.Tensor:
    """What a measured error (``Strategy.errors``) is compared with for vacuity: for CG, ``||x*||_A``."""
    H, q = exact["H"], exact["q"]
    xs = torch.linalg.solve(H, q.unsqueeze(-1)).squeeze(-1)
    return torch.sqrt((xs * q).sum(-1)).to(err.device)


DERANDOMISED_PROFILES = (
    "ci",
    "svt-ci",
)  # the toolkit's CI profile, under its short and plugin names


def derandomised() -> bool:
    """Whether a search without a seed draws the same cases in every call and every process.

    Under a hypothesis profile loaded in this process (the pytest plugin's ``svt-ci``, the
    project's ``ci``; hypothesis loads its own ``ci`` profile when it detects CI): that
    profile's ``derandomize``. Where none was loaded (a script, the command line, a pytest run
    whose ``HYPOTHESIS_PROFILE`` no plugin loads): True when ``HYPOTHESIS_PROFILE`` names
    ``ci``, ``svt-ci`` or a registered profile with ``derandomize=True``, else hypothesis's
    default, a fresh random search each call (hypothesis itself never reads that variable).
    """
    if settings.get_current_profile_name() != "default":
        return bool(settings.default.derandomize)
    name = os.environ.get("HYPOTHESIS_PROFILE", "")
    if name in DERANDOMISED_PROFILES:
        return True
    try:
        return (
            bool(settings.get_profile(name).derandomize)
            if name
            else bool(settings.default.derandomize)
        )
    except Exception:  # noqa: BLE001 - a name no one registered: the default profile's behaviour
        return bool(settings.default.derandomize)


def check(
    kernel,
    reference,
    strategy: Strategy,
    *,
    precision: str = "bfloat16",
    model="float32",
    examples: Optional[int] = None,
    device=None,
    poison: bool = True,
    shrink: bool = True,
    seed: Optional[int] = None,
    prepare: Optional[Callable] = None,
    progress: bool = False,
    derandomize: Optional[bool] = None,
    trajectory: bool = False,
) -> Report:
    """Run the property check; never raises for the kernel (see the :class:`Report`).

    ``model``: the kernel's contract (``solvers.contracts.parse`` names, a Contract, or an Arith);
    ``examples``: hypothesis max_examples (default: the loaded profile's); ``shrink=False`` reports
    the first failing case as drawn; ``seed``: draw cases from this seed (the same cases for the
    same seed, in every call and process); without one, ``derandomize=True`` draws the same cases
    in every call and process, ``False`` a fresh random search each call, and ``None`` (the
    default) follows :func:`derandomised`; ``prepare``: fair pairing hook (:func:`run_case`);
    ``progress``: a line on stderr every few seconds; ``trajectory``: observe the kernel's
    iterates (r more runs per case; strategies with a ``steps_option``), which bounds its stores
    at its own values (bf16 storage on GKA's ridge systems: 4.7% of ||x|| in place of 5.6%) and
    checks every step (:func:`observe_trajectory`). Needs a deterministic kernel whose i-step
    run is the prefix of its r-step run, as Chebyshev's, GD's and AGD's are.
    """
    pin_local_constants()  # the cases depend on strategy and seed only (analysis.testing.strategies.reproducible)
    _callables(kernel=kernel, reference=reference)
    prepare_hook(prepare)
    dtype = input_dtype(precision)
    contract = as_contract(model)
    device = _checked_device(device)
    if not isinstance(trajectory, bool):
        raise TypeError(f"trajectory must be True or False, got {trajectory!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    if examples is not None and (
        isinstance(examples, bool) or not isinstance(examples, numbers.Integral)
    ):
        raise TypeError(f"examples must be an int or None, got {examples!r}")
    if examples is not None and examples < 1:
        raise ValueError(f"examples must be >= 1 (cases to draw), got {examples}")
    strategy = as_strategy(strategy, dtype, device)
    if trajectory and strategy.steps_option is None:
        raise ValueError(
            f"trajectory=True needs a strategy whose iterations can be observed step by step "
            f"(a steps_option: spd, gka_ridge); {strategy.name!r} has none"
        )
    rep = Report(
        _name(kernel),
        _name(reference),
        strategy.name,
        str(dtype).replace("torch.", ""),
        contract.name,
        shrunk=shrink,
        seed=seed,
        trajectory=bool(trajectory),
    )
    state = {
        "last_failure": None,
        "vacuous": set(),
        "t0": time.perf_counter(),
        "shown": time.perf_counter(),
    }

    def prop(case):
        rep.examples += 1
        if state["last_failure"] is not None:
            rep.shrink_cases += 1
        ctx = nan_poisoned_empty() if poison else contextlib.nullcontext()
        with ctx:
            found = run_case(
                kernel,
                reference,
                strategy,
                case,
                precision=dtype,
                model=contract,
                device=device,
                prepare=prepare,
                trajectory=trajectory,
            )
        for f in found:
            rep.history.append(f)
            # the worst finding shown is the worst conclusive one (or a failure); a vacuous
            # bound's ratio says nothing about the kernel
            w = rep.worst
            if (
                w is None
                or (w.vacuous and not w.failed and (not f.vacuous or f.ratio > w.ratio))
                or ((not f.vacuous or f.failed) and f.ratio > w.ratio)
            ):
                rep.worst = f
            if f.vacuous:
                state["vacuous"].add(case.label)
        now = time.perf_counter()
        if progress and now - state["shown"] > 3.0:
            state["shown"] = now
            print(
                f"  [harness] {rep.examples} cases in {now - state['t0']:.0f} s, worst ratio "
                f"{rep.worst.ratio if rep.worst else float('nan'):.4g}",
                file=sys.stderr,
                flush=True,
            )
        bad = [f for f in found if f.failed]
        if bad:
            state["last_failure"] = max(bad, key=lambda f: f.ratio)
            raise AssertionError(str(state["last_failure"]))

    run = given(strategy.cases)(prop)
    overrides = {
        "report_multiple_bugs": False,
        "deadline": None,
        "database": None,
        "suppress_health_check": list(HealthCheck),
    }
    if examples is not None:
        overrides["max_examples"] = examples
    if seed is not None:
        overrides["derandomize"] = False
        run = hypothesis_seed(seed)(run)
    else:
        overrides["derandomize"] = derandomised() if derandomize is None else bool(derandomize)
    if not shrink:
        overrides["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    run = settings(**overrides)(run)
    try:
        run()
    except AssertionError:
        rep.failure = state["last_failure"]
        if rep.failure is None:
            rep.error = "AssertionError outside the property (see the traceback with pytest)"
    except Exception as e:  # noqa: BLE001 - a failure of the strategy or reference is reported, not raised
        rep.error = f"{type(e).__name__}: {e}"
    rep.vacuous_cases = len(state["vacuous"])
    # counted here, not in the property: the derandomised cases hang on the property's source
    rep.trajectory_fallbacks = len({f.case for f in rep.history if f.trajectory_observed is False})
    return rep


def assert_matches(
    kernel, reference, strategy: Strategy, *, conclusive: bool = True, **kw
) -> Report:
    """:func:`check`, raising AssertionError with the report on FAIL and on INCONCLUSIVE (a vacuous
    bound proves nothing); ``conclusive=False`` lets INCONCLUSIVE through, for strategies whose
    bound is vacuous on part of the domain by nature (say so next to the call)."""
    rep = check(kernel, reference, strategy, **kw)
    if rep.verdict == FAIL or (conclusive and rep.verdict != PASS):
        raise AssertionError(str(rep))
    return rep


def _checked_device(device) -> torch.device:
    """``device`` for :func:`check` (None: cuda if available, else cpu), or a ValueError naming
    it: a CUDA device on a machine without one or ``meta`` (no values to compare) was reported
    as a FAIL of the kernel, an unknown name as torch's RuntimeError."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return usable_device(device)
    except ValueError as e:
        raise ValueError(f"device: {e}") from None


def prepare_hook(prepare):
    """``prepare`` (or None) if it can be called as ``prepare(rounded, options, precision)``;
    a TypeError naming it otherwise. A hook of another signature (a solver given by mistake)
    was a FAIL "with an exception outside any case", as if the kernel had failed."""
    if prepare is None:
        return None
    if not callable(prepare):
        raise TypeError(f"prepare must be a callable or None, got {prepare!r}")
    try:
        inspect.signature(prepare).bind(None, None, None)
    except TypeError:
        raise TypeError(
            f"prepare must take (rounded, options, precision) and return (inputs, options); "
            f"{_name(prepare)}{inspect.signature(prepare)} does not"
        ) from None
    except ValueError:  # no signature to read (a builtin): left to the call
        pass
    return prepare


def _callables(**named) -> None:
    """TypeError naming the argument that is not callable: a "module:function" string passed
    here (the pytest fixture takes those) was reported as a FAIL of every case, "reference
    raised TypeError: 'str' object is not callable"."""
    for arg, fn in named.items():
        if callable(fn):
            continue
        hint = f"; resolve it with harness.load({fn!r})" if isinstance(fn, str) else ""
        raise TypeError(f"{arg} must be a callable, got {fn!r}{hint}")


def _name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class UsageError(ValueError):
    """A bad command-line argument (exit status 2)."""


def load(spec: str):
    """``"package.module:function"`` -> the function; UsageError naming what is wrong."""
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise UsageError(f"expected module:function, got {spec!r}")
    try:
        obj = importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module, reported in one line
        raise UsageError(
            f"cannot import module {mod!r} of {spec!r}: {type(e).__name__}: {e}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {mod!r} has no attribute {attr!r} (from {spec!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{spec!r} is not callable")
    return obj


HELP_EPILOG = """\
strategies (--strategy; the kernel is called as the reference is):
  spd           Chebyshev / GD / AGD f(H, q, *, L, mu, iters): running bound of the contract
  spd_nobounds  CG f(H, q, *, iters): CG's finite-precision convergence bound (a model)
  spd_backward  f(H, q, grad_x, *, L, mu, iters, method) -> (dq, dH)
  gka_ridge     f(H, q, *, a, iters) solving (H + a ||H||_F I) x = q (GKA eq. (4)); reference
                analysis.testing.harness:gka_ridge_reference
  kla           f(q, k, v, *, alpha, eta, eps, chunk_size) -> (o, S_T)
  koopman       f(G, M, Cv, zq, *, scale, K, eta, gamma) -> y (Echo eq. (13)): an all-orders
                bound (a proof under Higham's backward errors); INCONCLUSIVE where it is vacuous
spd and gka_ridge take --trajectory: every step count run, each step held to its bound

verdicts: PASS every output within its bound, every bound conclusive; FAIL an output beyond its
bound, a NaN, a crash or a wrong shape (printed with a snippet that rebuilds the case);
INCONCLUSIVE no failure, but some bound was as large as the output it bounds.
exit status: 0 PASS, 1 FAIL, 2 usage or import error, 3 INCONCLUSIVE"""


def _parser() -> argparse.ArgumentParser:
    ap = OneLineParser(
        prog="python -m analysis.testing.harness",
        description=plain(__doc__.split("\n\n")[0]),
        formatter_class=HelpFormatter,
        epilog=HELP_EPILOG,
    )
    ap.add_argument("kernel", help="module:function of the kernel under test")
    ap.add_argument("reference", help="module:function of the reference it should match")
    ap.add_argument(
        "--strategy",
        choices=sorted(STRATEGIES),
        required=True,
        help="what cases to draw and how to bound the outputs (below)",
    )
    ap.add_argument(
        "--precision", choices=sorted(PRECISIONS), default="bfloat16", help="kernel input dtype"
    )
    ap.add_argument(
        "--model",
        default="float32",
        help=f"the kernel's precision contract: one of {', '.join(sorted(PRESETS))}, optionally with "
        "';key=value' changes (solvers.contracts.parse)",
    )
    ap.add_argument("--examples", type=positive_int, default=50, help="cases to draw (at least 1)")
    ap.add_argument(
        "--seed",
        type=int,
        default=None,
        help="draw cases from this seed (default: derandomised, the same cases on every run)",
    )
    ap.add_argument(
        "--max-d", type=positive_int, default=16, help="largest system size D (not for kla)"
    )
    ap.add_argument(
        "--max-batch", type=positive_int, default=4, help="largest batch of systems (not for kla)"
    )
    ap.add_argument(
        "--max-kappa",
        type=condition_number,
        default=None,
        help="spd strategies: largest condition number (default: the strategy's, 100)",
    )
    ap.add_argument(
        "--pow2", action="store_true", help="draw only power-of-two D (kernels that do not pad)"
    )
    ap.add_argument(
        "--kla-form",
        choices=KLA_FORMS,
        default=None,
        help="with --strategy kla: the form the kernel computes, whose bound it is held to "
        "(default: chunkwise; tokenwise for a recurrent kernel; either when unknown)",
    )
    ap.add_argument(
        "--prepare",
        default=None,
        help="module:function fair-pairing hook run on both callables' inputs (e.g. "
        "analysis.testing.harness:kla_prepare; default: none)",
    )
    ap.add_argument(
        "--device",
        type=device_arg,
        default=None,
        help="where to run (default: cuda if available, else cpu; on the cpu Triton kernels run "
        "through Triton's interpreter, TRITON_INTERPRET=1)",
    )
    ap.add_argument(
        "--no-shrink", action="store_true", help="report the first failing case as drawn, unshrunk"
    )
    ap.add_argument(
        "--trajectory",
        action="store_true",
        help="spd and gka_ridge: also run the kernel for every smaller iteration count, bound "
        "its stores at its own iterates (bf16 storage: about 4.7%% of ||x|| on GKA's ridge "
        "systems, not 5.6%%) and check every step; needs a deterministic kernel",
    )
    return ap


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    warning = interpret_without_gpu(args.device)  # before the kernel's module imports Triton
    steps = (
        ("--model", lambda: as_contract(args.model)),
        ("KERNEL", lambda: load(args.kernel)),
        ("REFERENCE", lambda: load(args.reference)),
        ("--prepare", lambda: prepare_hook(load(args.prepare)) if args.prepare else None),
    )
    got = []
    for option, step in steps:
        try:
            got.append(step())
        except (UsageError, ValueError, TypeError) as e:
            print(f"{ap.prog}: error: argument {option}: {e}", file=sys.stderr)
            return USAGE_ERROR
    contract, kernel, reference, prepare = got
    if warning:  # after the usage errors, which stay one line
        print(warning, file=sys.stderr)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # --max-d, --max-batch and --pow2 size the SPD and ridge strategies; the sequence and
    # gradient strategies draw their own shapes
    sized = args.strategy in ("spd", "spd_nobounds", "spd_backward", "gka_ridge")
    sizes = {"max_d": args.max_d, "max_batch": args.max_batch} if sized else {}
    if args.pow2 and sized:
        sizes["pow2"] = True
    if args.max_kappa is not None and args.strategy in ("spd", "spd_nobounds", "spd_backward"):
        sizes["max_kappa"] = args.max_kappa
    if args.trajectory and args.strategy not in ("spd", "gka_ridge"):
        print(
            f"{ap.prog}: error: argument --trajectory: only with --strategy spd or gka_ridge "
            "(whose methods' i-th iterate does not depend on the iteration count)",
            file=sys.stderr,
        )
        return USAGE_ERROR
    if args.kla_form is not None:
        if args.strategy != "kla":
            print(
                f"{ap.prog}: error: argument --kla-form: only with --strategy kla", file=sys.stderr
            )
            return USAGE_ERROR
        sizes["form"] = args.kla_form
    strat = STRATEGIES[args.strategy](precision=PRECISIONS[args.precision], device=device, **sizes)
    # without --seed the search is derandomised: two runs of one command draw the same cases
    rep = check(
        kernel,
        reference,
        strat,
        precision=args.precision,
        model=contract,
        examples=args.examples,
        device=device,
        shrink=not args.no_shrink,
        seed=args.seed,
        prepare=prepare,
        progress=True,
        derandomize=True,
        trajectory=args.trajectory,
    )
    print(rep)
    if rep.failure is not None and rep.failure.snippet:
        print(_rerun_snippet(args, device, sizes))
    return rep.exit_code


def _rerun_snippet(args, device, sizes: dict) -> str:
    """The lines that, pasted after the printed case, rerun it as this command did."""
    opts = "".join(f", {k}={v!r}" for k, v in sizes.items())
    prepare = f", prepare=harness.load({args.prepare!r})" if args.prepare else ""
    lines = [
        "from analysis.testing import harness",
        f"strategy = harness.STRATEGIES[{args.strategy!r}](precision=torch.{args.precision}, "
        f"device={str(device)!r}{opts})",
        "with harness.nan_poisoned_empty():",
        f"    findings = harness.run_case(harness.load({args.kernel!r}), "
        f"harness.load({args.reference!r}), strategy, case, precision={args.precision!r}, "
        f"model={args.model!r}, device={str(device)!r}{prepare}"
        f"{', trajectory=True' if args.trajectory else ''})",
        "print(*findings, sep='\\n')",
    ]
    return "then rerun it with:\n" + "\n".join("    " + line for line in lines)


if __name__ == "__main__":
    sys.exit(main())


def __getattr__(name):
    # the harness's SPD generator had the name of the hypothesis strategy strategies.spd_matrices
    if name == "spd_matrices":
        import warnings

        warnings.warn(
            "analysis.testing.harness.spd_matrices is now analysis.testing.strategies.log_uniform_spd; "
            "the old name works until the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return log_uniform_spd
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
