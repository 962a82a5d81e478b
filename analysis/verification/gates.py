"""Verification rows for the decay gates (``solvers.gates``), every precision against mpmath.

Rows ``gate/<gate>/<quantity>`` for the sigmoid, the gradient-balanced gate
``max(0, 1 - 1/(a z^2 + b))`` (a = b = 1; the full table adds a = 0.5, b = 2) and the printed
``1 - exp(-softplus(z))`` (its mpmath reference is the printed formula, so the identity with the
sigmoid is checked, not assumed), on a fixed grid of pre-activations z that reaches gates near 0
(sigmoid z = -30: gamma ~ 1e-13; balanced z = 0.02: gamma ~ 4e-4) and near 1 (z = 35). Every
reference is evaluated at the z *as stored* in the working precision, at 50 digits.

* ``value``, ``derivative``, ``log_value`` (``log phi``, the log-space form): rounding = the worst
  relative error over the grid; rounding_bound = the OPS bound of ``tests/test_gates.py``:
  ``OPS u_acc + u_store`` with OPS = 16 (a path of <= 8 elementary operations without
  cancellation, each within 1 ulp = 2u, one final store).
* ``cumulative_log_decay``: ``G_t = sum_{i <= t} log gamma_i`` over the grid's log gates as
  stored (``cumulative_log_decay(gate.log_value(z))``) against the exact sum of those stored
  values. Since every ``g_i <= 0``, ``sum |g_i| = |G*_t|``, so Higham eq. (4.4)
  (``|G^_t - G*_t| <= gamma_t(u_acc) sum |g|``, the bound of ``tests/test_gates.py``) plus the one
  final store give the relative bound ``gamma_t + u_store (1 + gamma_t)``; rounding is
  ``max_t |G^_t - G*_t| / |G*_t|`` against that bound at t = T (the largest).

Direct evaluations: truncation fields NaN; forward_error = rounding; no backward error (NaN);
kappa NaN; n = number of grid points; iters None.
"""

from __future__ import annotations

import math

import mpmath
import torch

from analysis.precision import PRECISIONS
from analysis.references.gates import exact_gate_functions
from solvers.gates import BalancedGate, SigmoidGate, SoftplusGate, cumulative_log_decay

from .row import VerificationRow, nanmax

NAN = float("nan")
F64 = torch.float64
DPS = 50
OPS = 16  # tests/test_gates.py: <= 8 elementary ops, each within 2u
GRID = (-30.0, -8.0, -1.5, -0.3, 0.02, 0.7, 3.0, 9.0, 35.0)  # tests/test_gates.py's grid
FULL_GRID = GRID + (-40.0, -20.0, -3.0, -1.0, -0.05, 0.001, 0.3, 1.0, 2.0, 5.0, 15.0, 25.0)


def _relative_error(got: float, exact) -> float:
    if exact == 0:
        return abs(got)
    return float(abs(mpmath.mpf(got) - exact) / abs(exact))


def _pointwise_rows(gate, name: str, ar, z: torch.Tensor, problem: str) -> list:
    exact = exact_gate_functions(gate)
    zs = [mpmath.mpf(x) for x in z.to(F64).tolist()]
    bound = OPS * ar.u_acc + ar.u_store  # OPS bound (tests/test_gates.py)
    rows = []
    for quantity, ref in exact.items():
        got = getattr(gate, quantity)(z, bf16_mode=ar.mode).to(F64).tolist()
        errs = []
        for zi, gi in zip(zs, got):
            r = ref(zi)
            if (
                r == -mpmath.inf
            ):  # phi = 0 exactly (balanced gate at a^2 z^2 <= 1 - b): log phi must be -inf
                errs.append(0.0 if gi == -math.inf else math.inf)
            elif ar.dtype != F64 and abs(r) < torch.finfo(ar.dtype).tiny:
                continue  # below the working dtype's normal range: no relative accuracy exists
            else:
                errs.append(_relative_error(gi, r))
        err = nanmax(errs)  # a NaN at any grid point is the row's error, never hidden
        rows.append(
            VerificationRow(
                solver=f"gate/{name}/{quantity}",
                precision=ar.label,
                problem=problem,
                n=z.numel(),
                kappa=NAN,
                iters=None,
                forward_error=err,
                backward_error=NAN,
                truncation=NAN,
                truncation_bound=NAN,
                rounding=err,
                rounding_bound=bound,
                notes="worst relative error over the grid vs OPS bound 16 u_acc + u_store (tests/test_gates.py)",
            )
        )
    return rows


def _cumulative_row(gate, name: str, ar, z: torch.Tensor, problem: str) -> VerificationRow:
    g = gate.log_value(z, bf16_mode=ar.mode)
    G = cumulative_log_decay(g, bf16_mode=ar.mode).to(F64).tolist()
    T = g.numel()
    with mpmath.workdps(DPS):
        exact = [mpmath.fsum(mpmath.mpf(x) for x in g.to(F64).tolist()[: t + 1]) for t in range(T)]
        err = nanmax(_relative_error(G[t], exact[t]) for t in range(T))
    gamma_T = T * ar.u_acc / (1 - T * ar.u_acc)
    bound = gamma_T + ar.u_store * (
        1 + gamma_T
    )  # Higham (4.4) gamma_t sum|g| (sum|g| = |G*|) + one store
    return VerificationRow(
        solver=f"gate/{name}/cumulative_log_decay",
        precision=ar.label,
        problem=problem,
        n=T,
        kappa=NAN,
        iters=None,
        forward_error=err,
        backward_error=NAN,
        truncation=NAN,
        truncation_bound=NAN,
        rounding=err,
        rounding_bound=bound,
        notes="max_t |G^_t - G*_t|/|G*_t| over the stored log gates vs Higham (4.4) gamma_T + u_store (1 + gamma_T)",
    )


def rows(quick: bool) -> list:
    gates = {"sigmoid": SigmoidGate(), "balanced": BalancedGate(), "softplus": SoftplusGate()}
    if not quick:
        gates["balanced a=0.5 b=2"] = BalancedGate(a=0.5, b=2.0)
    grid = GRID if quick else FULL_GRID
    problem = (
        f"{len(grid)} pre-activations z in [{min(grid):g}, {max(grid):g}] (gates near 0 and near 1)"
    )
    out = []
    with mpmath.workdps(DPS):
        for ar in PRECISIONS:
            z = torch.tensor(grid, dtype=F64).to(ar.dtype)
            for name, gate in gates.items():
                out += _pointwise_rows(gate, name, ar, z, problem)
                out.append(_cumulative_row(gate, name, ar, z, problem))
    return out
