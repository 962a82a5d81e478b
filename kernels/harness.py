"""Property checks of any kernel against the reference it should match, within the bound of
the precision model: the engine of tests/test_kernels_*.py, usable from pytest and the CLI.

    python -m kernels.harness kernels:chebyshev solvers:chebyshev --strategy spd \\
        --precision bfloat16 --model float32 --examples 50

For every case a strategy draws, the inputs are rounded to ``precision`` (the kernel's input
dtype); the kernel runs on them; the reference runs in float32 on the same values (widened
exactly). For each output and system the error ``||kernel - reference||`` is held to

    bound = B(model) + B(float32)  +  u(out) ||kernel output||

* ``B(arith)`` bounds one run's rounding error in that arithmetic (distance to the exact
  result of the same algorithm on the same inputs): once for the kernel's arithmetic
  (``model``: "float32" for kernels that keep float32 iterates, "bfloat16/storage" for
  kernels that store bf16 intermediates) and once for the float32 reference; their sum
  bounds the distance between the two runs (triangle inequality). The strategy supplies B:
  for linear solvers the precision model's allowance
  ``analysis.precision.rounding_allowance(kappa, n, arith)`` (docs/precision.md) times a
  bound on ``||x*||``; for KLA the running error bounds of ``analysis.kaczmarz_bounds``;
* the last term is the one rounding of the stored result to the kernel's output dtype.

A NaN (an unwritten output: :func:`nan_poisoned_empty` fills fresh buffers with NaN) fails.
hypothesis shrinks a failing case; the report names the worst error/bound ratio seen, the
output and system where it occurred, and the shrunk counterexample.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from analysis.precision import by_label, rounding_allowance
from solvers import Arith, unit_roundoff

PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REFERENCE_ARITH = Arith(torch.float32)


# ---------------------------------------------------------------------------------------
# NaN-poisoned allocation
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def nan_poisoned_empty():
    """Within the block, ``torch.empty`` returns floating buffers full of NaN (integers: -1),
    so an output element a kernel forgot to write fails every comparison."""
    real = torch.empty

    def poisoned(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(-1)
        return t

    torch.empty = poisoned
    try:
        yield
    finally:
        torch.empty = real


# ---------------------------------------------------------------------------------------
# cases and strategies
# ---------------------------------------------------------------------------------------


@dataclass
class Case:
    """One drawn problem: float64 inputs (exact values before rounding), keyword options,
    and a label for reports. Inputs are passed positionally in dict order."""

    inputs: dict
    options: dict
    label: str

    def __repr__(self) -> str:
        return f"Case({self.label})"


@dataclass
class Strategy:
    """How to draw cases and what bounds their outputs.

    ``scales(case, rounded, model)`` returns one per-system tensor per output: the bound
    ``B(model) + B(float32)`` on that output's error (before the output-rounding term);
    ``rounded`` holds the inputs as the kernel saw them (float64 values, on the device).
    """

    name: str
    cases: st.SearchStrategy
    outputs: tuple
    core_dims: tuple
    scales: Callable
    doc: str = ""


def _orthogonal(D: int, n: int, gen: torch.Generator) -> torch.Tensor:
    Q, R = torch.linalg.qr(torch.randn(n, D, D, dtype=torch.float64, generator=gen, device=gen.device))
    return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


def spd_matrices(D: int, n: int, kappa: float, scale: float, gen: torch.Generator) -> torch.Tensor:
    """n symmetric matrices ``Q diag(lam) Q^T`` with spectrum in [scale/kappa, scale], both
    ends attained, the rest log-uniform; float64."""
    Q = _orthogonal(D, n, gen)
    t = torch.rand(n, D, dtype=torch.float64, generator=gen, device=gen.device)
    if D >= 2:
        t[:, 0], t[:, 1] = 0.0, 1.0
    lam = scale * kappa ** (t - 1.0)
    H = (Q * lam.unsqueeze(-2)) @ Q.transpose(-1, -2)
    return (H + H.transpose(-1, -2)) / 2


@st.composite
def _spd_case(draw, *, max_d, max_batch, max_iters, max_kappa, bounds, cotangent, methods, precision, device):
    D = draw(st.sampled_from(sorted({1, 2, 3, 5, 8, 13, 16, 17, 64, 100, 128, max_d} & set(range(1, max_d + 1)))))
    n = draw(st.sampled_from(sorted({1, 2, 3, 7, max_batch} & set(range(1, max_batch + 1)))))
    batch = draw(st.sampled_from([(n,), (1, n), ()] if n == 1 else [(n,), (n, 1)]))
    method = draw(st.sampled_from(methods)) if methods else None
    reverse = method in ("reverse", "reverse_stored_omega")
    # the reverse methods in GKA's regime, kappa >= 10 (Remark 2): below it omega_i - 1 is
    # small and eq. (49) amplifies errors by (omega_i - 1)^(-1/2) per step (reverse_growth)
    kappa = draw(st.floats(10.0, max(10.0, max_kappa)) if reverse else st.floats(1.0, max_kappa))
    iters = draw(st.integers(0, min(max_iters, 3) if method == "reverse" else max_iters))
    scale = draw(st.sampled_from([1.0, 1e-3, 37.5]))
    seed = draw(st.integers(0, 2**31 - 1))
    loose = draw(st.sampled_from([1.0, 1.25]))
    per_system = draw(st.booleans())
    try:
        return spd_case(D, batch, kappa, iters=iters, scale=scale, seed=seed, loose=loose, per_system=per_system,
                        bounds=bounds, cotangent=cotangent, method=method, precision=precision, device=device)
    except ValueError:  # rounding to the input dtype made a matrix indefinite
        assume(False)


def spd_case(D: int, batch: tuple, kappa: float, *, iters: int, scale: float = 1.0, seed: int = 0,
             loose: float = 1.0, per_system: bool = True, bounds: bool = True, cotangent: bool = False,
             method: Optional[str] = None, precision: torch.dtype = torch.bfloat16, device="cpu") -> Case:
    """One :class:`Case` of SPD systems ``H (*batch, D, D)`` with spectrum in
    ``[scale/kappa, scale]`` (:func:`spd_matrices`), a Gaussian q (and cotangent ``grad_x``).

    ``bounds``: options ``L, mu`` enclosing the spectrum of H *as rounded to* ``precision``
    (widened by ``loose``; one pair for the batch unless ``per_system``; ``L >= 1.5 mu`` for the
    reverse methods, which need L > mu). Raises ValueError if rounding made a matrix indefinite.
    """
    reverse = method in ("reverse", "reverse_stored_omega")
    gen = torch.Generator(device=device).manual_seed(seed)
    H = spd_matrices(D, max(1, math.prod(batch)), kappa, scale, gen).reshape(*batch, D, D)
    q = torch.randn(*batch, D, dtype=torch.float64, generator=gen, device=device)
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
    label = (f"D={D} batch={batch} kappa~{kappa:.3g} scale={scale} iters={iters} seed={seed} "
             f"loose={loose} per_system_bounds={per_system}" + (f" method={method}" if method else ""))
    return Case(inputs, options, label)


def _lam_min(H: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigvalsh(H)[..., 0]


def _kappa(H: torch.Tensor, options: dict) -> torch.Tensor:
    """The condition number the allowance uses: L/mu when the method is given bounds
    (the iteration's behaviour depends on them), the matrix's own otherwise."""
    if "L" in options:
        L = torch.as_tensor(options["L"], dtype=torch.float64, device=H.device)
        mu = torch.as_tensor(options["mu"], dtype=torch.float64, device=H.device)
        return torch.broadcast_to(L / mu, H.shape[:-2])
    ev = torch.linalg.eigvalsh(H)
    return ev[..., -1] / ev[..., 0]


def allowances(kappa, n: int, model: Arith) -> torch.Tensor:
    """``allowance(model) + allowance(float32)`` (analysis.precision.rounding_allowance)."""
    kappa = torch.as_tensor(kappa, dtype=torch.float64)
    return (rounding_allowance(1.0, n, model) + rounding_allowance(1.0, n, REFERENCE_ARITH)) * kappa


def _solve_scales(case, rounded, model):
    """x: ||x_kernel - x_ref|| <= allowances * ||x*||, ||x*|| <= ||q|| / lambda_min."""
    H, q = rounded["H"], rounded["q"]
    D = H.shape[-1]
    return (allowances(_kappa(H, case.options), D, model).to(H.device) * q.norm(dim=-1) / _lam_min(H),)


def _cg_scales(case, rounded, model):
    """CG has no forward-stable rounding bound: two finite-precision runs lose orthogonality
    differently and their iterates can part by far more than kappa n u mid-convergence
    (docs/precision.md measures CG by its attainable accuracy). What holds for each run is
    the Chebyshev bound in the H-norm, ``||x_k - x*||_H <= 2 R_a^k ||x*||_H`` (Greenbaum
    1989: finite-precision CG behaves as exact CG on a matrix with eigenvalues in tiny
    intervals around H's), plus its attainable accuracy, taken as the allowance. In the
    2-norm ``||e||_2 <= sqrt(kappa) ||e||_H / ||x*||_H * ||x*||_2``; so
    ``||x_kernel - x_ref|| <= (2 sqrt(kappa) min(1, 2 R_a^k) + allowances) ||q|| / lambda_min``.
    The check bites once CG has converged (and on NaN); the identity test of
    tests/test_kernels_gradient_cg.py pins the first steps."""
    H, q = rounded["H"], rounded["q"]
    D = H.shape[-1]
    ev = torch.linalg.eigvalsh(H)
    kappa = ev[..., -1] / ev[..., 0]
    ra = (kappa.sqrt() - 1) / (kappa.sqrt() + 1)
    trunc = 2.0 * kappa.sqrt() * torch.clamp(2.0 * ra ** case.options["iters"], max=1.0)
    return ((trunc + allowances(kappa, D, model).to(H.device)) * q.norm(dim=-1) / ev[..., 0],)


def spd(max_d: int = 16, max_batch: int = 4, max_iters: int = 30, max_kappa: float = 100.0,
        bounds: bool = True, precision: torch.dtype = torch.bfloat16, device="cpu") -> Strategy:
    """Batches of SPD systems ``H x = q`` with known spectrum (kappa up to ``max_kappa``),
    for solvers called as ``f(H, q, *, [L, mu,] iters)``; ``bounds=False`` for CG.
    ``precision``: the kernel's input dtype (L, mu enclose the rounded matrix's spectrum);
    ``device``: where cases are generated (the GPU for large batches)."""
    cases = _spd_case(max_d=max_d, max_batch=max_batch, max_iters=max_iters, max_kappa=max_kappa,
                      bounds=bounds, cotangent=False, methods=None, precision=precision, device=device)
    if not bounds:
        return Strategy("spd_nobounds", cases, ("x",), (1,), _cg_scales,
                        doc="SPD systems for CG; bound: both runs within CG's convergence bound (_cg_scales)")
    return Strategy("spd", cases, ("x",), (1,), _solve_scales,
                    doc="SPD systems; bound: allowances * ||q|| / lambda_min")


def _omegas64(L, mu, iters, shape, device):
    L = torch.broadcast_to(torch.as_tensor(L, dtype=torch.float64, device=device), shape)
    mu = torch.broadcast_to(torch.as_tensor(mu, dtype=torch.float64, device=device), shape)
    rho2 = ((L - mu) / (L + mu)) ** 2
    w = [torch.full_like(rho2, 2.0)]
    for _ in range(iters):
        w.append(4.0 / (4.0 - rho2 * w[-1]))
    return L, mu, torch.stack(w, -1)


def reverse_growth(L, mu, iters: int, shape, device="cpu") -> torch.Tensor:
    """How much the rebuilt iterates of the reverse methods can amplify a rounding error, per
    system (float64): GKA eq. (49) runs Algorithm 1's three-term recurrence backwards; on
    [mu, L] its characteristic roots are complex with modulus sqrt(omega_i - 1) < 1
    (omega_i lies between omega_1* and 2, where rho^2 omega^2 < 4 (omega - 1)), so backwards an
    error grows by ``(omega_i - 1)^(-1/2)`` per step (GKA Remark 2), times at most r as the
    roots coalesce when omega_i -> omega_1*: ``R = r prod_{i=2..r} (omega_i - 1)^(-1/2)``."""
    L, mu, w = _omegas64(L, mu, iters, shape, device)
    growth = torch.full(shape, float(max(iters, 1)), dtype=torch.float64, device=device)
    if iters >= 2:
        growth = growth * torch.prod((w[..., 2:] - 1.0) ** -0.5, dim=-1)
    return growth


def nu_growth(L, mu, iters: int, shape, device="cpu") -> torch.Tensor:
    """``G_nu``: how much the recovered weights of method "reverse" amplify one rounding.

    (47) ``nu_{i-1} = 4/rho^2 (1 - 1/nu_i)`` multiplies an error in nu_i by
    ``4 / (rho^2 nu_i^2)`` (omega_1* is a repelling fixed point of the reversed schedule);
    ``G_nu`` is the sum over the steps of the products of these factors, so each recovered
    weight carries a relative error <= G_nu u."""
    L, mu, w = _omegas64(L, mu, iters, shape, device)
    rho2 = ((L - mu) / (L + mu)) ** 2
    total = torch.ones(shape, dtype=torch.float64, device=device)
    prod = torch.ones_like(total)
    for i in range(iters, 0, -1):
        prod = prod * 4.0 / (rho2 * w[..., i] ** 2)
        total = total + prod
    return total


def adjoint_sum(H, q, g, L, mu, iters: int) -> torch.Tensor:
    """``sum_{i=1..r} c_i ||lambda_i|| max_j ||xi_j||`` in float64 (GKA eq. (46), (48)): the
    size of the terms dH = -sum c_i lambda_i xi_{i-1}^T adds up, before cancellation."""
    shape = H.shape[:-2]
    L, mu, w = _omegas64(L, mu, iters, shape, H.device)
    step = (2.0 / (L + mu)).unsqueeze(-1)
    xi_prev, xi = torch.zeros_like(q), step * q
    xi_max = xi.norm(dim=-1)
    for i in range(1, iters + 1):
        wi = w[..., i].unsqueeze(-1)
        xi_new = xi - wi * step * ((H @ xi.unsqueeze(-1)).squeeze(-1) - q) + (wi - 1.0) * (xi - xi_prev)
        xi_prev, xi = xi, xi_new
        xi_max = torch.maximum(xi_max, xi.norm(dim=-1))
    total = torch.zeros(shape, dtype=torch.float64, device=H.device)
    lam, lam_next = g, torch.zeros_like(g)
    for i in range(iters, 0, -1):
        wi = w[..., i].unsqueeze(-1)
        c = wi * step
        total = total + (c * lam).norm(dim=-1)
        b_next = -(w[..., i + 1].unsqueeze(-1) - 1.0) if i < iters else torch.zeros_like(wi)
        lam_prev = wi * lam - c * (H.transpose(-1, -2) @ lam.unsqueeze(-1)).squeeze(-1) + b_next * lam_next
        lam_next, lam = lam, lam_prev
    return total * xi_max


def _backward_scales(case, rounded, model):
    """dq = p_r(H) g (Lemma 2) is a solve-like map: allowances * 3 ||g|| / lambda_min (|p_r|
    <= (1 + 2 R_a^{r+1}) / lambda_min on the spectrum). dH:
    * implicit, dH = -dq x^T: allowances * (||dq|| ||x|| relative errors of both factors)
      <= allowances * 2 * 9 ||g|| ||q|| / lambda_min^2;
    * reverse methods: allowances * reverse_growth * 2 * adjoint_sum (errors in lambda_i and
      in the rebuilt xi_{i-1}, each term c_i lambda_i xi_{i-1}^T).
    Method "reverse" recovers its weights with relative error <= G_nu u in each run
    (nu_growth): one more rounding per step of size 2 G_nu u, so its allowances grow by the
    factor (n + 1 + 2 G_nu) / (n + 1) (the allowance is proportional to n u_acc + u_store)."""
    H, q, g = rounded["H"], rounded["q"], rounded["grad_x"]
    opts = case.options
    D = H.shape[-1]
    a = allowances(_kappa(H, opts), D, model).to(H.device)
    lmin = _lam_min(H)
    dq = a * 3.0 * g.norm(dim=-1) / lmin
    method = opts["method"]
    if method == "implicit":
        return dq, a * 18.0 * g.norm(dim=-1) * q.norm(dim=-1) / lmin**2
    if method == "reverse":
        g_nu = nu_growth(opts["L"], opts["mu"], opts["iters"], H.shape[:-2], H.device)
        widen = (D + 1 + 2.0 * g_nu) / (D + 1)
        a, dq = a * widen, dq * widen
    growth = reverse_growth(opts["L"], opts["mu"], opts["iters"], H.shape[:-2], H.device)
    return dq, a * growth * 2.0 * adjoint_sum(H, q, g, opts["L"], opts["mu"], opts["iters"])


def spd_backward(max_d: int = 16, max_batch: int = 4, max_iters: int = 12, max_kappa: float = 100.0,
                 methods=("implicit", "reverse", "reverse_stored_omega"),
                 precision: torch.dtype = torch.bfloat16, device="cpu") -> Strategy:
    """SPD systems with a cotangent, for backward passes ``f(H, q, grad_x, *, L, mu, iters,
    method) -> (dq, dH)``. Reverse methods: kappa >= 10 (GKA Remark 2's regime); "reverse"
    keeps r <= 3 (its weights come through an unstable recurrence, :func:`nu_growth`)."""
    cases = _spd_case(max_d=max_d, max_batch=max_batch, max_iters=max_iters, max_kappa=max_kappa,
                      bounds=True, cotangent=True, methods=tuple(methods), precision=precision, device=device)
    return Strategy("spd_backward", cases, ("dq", "dH"), (1, 2), _backward_scales,
                    doc="SPD systems + cotangent; bounds in _backward_scales")


@st.composite
def _kla_case(draw, *, max_T, dims, max_heads, max_batch, chunk_size, per_channel, precision, device):
    from analysis.strategies import kla_case

    T = draw(st.sampled_from(sorted({1, 5, chunk_size - 1, chunk_size, chunk_size + 3, 100, 300, max_T}
                                    & set(range(1, max_T + 1)))))
    lo = 10.0 ** draw(st.floats(-1.0, 0.0))
    c = kla_case(T, B=draw(st.integers(1, max_batch)), H=draw(st.integers(1, max_heads)),
                 d_k=draw(st.sampled_from(dims)), d_v=draw(st.sampled_from(dims)),
                 key_norms=(lo, lo * 10.0 ** draw(st.floats(0.0, 1.0))),
                 per_channel=draw(st.booleans()) if per_channel else False,
                 alpha=(draw(st.sampled_from((0.5, 0.9, 0.99))), 1.0), eta=(0.5, 1.0),
                 chunk_size=chunk_size, seed=draw(st.integers(0, 2**31 - 1)))
    # gates as the kernel stores them (rounded to its input dtype), passed to both callables
    opts = {"alpha": c.alpha.to(precision).to(torch.float32).to(device),
            "eta": c.eta.to(precision).to(torch.float32).to(device), "eps": c.eps, "chunk_size": chunk_size}
    label = (f"B,T,H={tuple(c.q.shape[:3])} d_k={c.q.shape[-1]} d_v={c.v.shape[-1]} key_norms~{lo:.2g} "
             f"alpha>={float(c.alpha.min()):.2g} per_channel={c.per_channel} seed={c.seed}")
    return Case({"q": c.q.to(device), "k": c.k.to(device), "v": c.v.to(device)}, opts, label)


def _kla_scales(case, rounded, model):
    """o_t and S_T: the kernel's chunkwise running error bound in its model plus the float32
    reference's (tokenwise and chunkwise bounds added, so either reference form is covered):
    ``analysis.kaczmarz_bounds.kla_chunkwise_bound`` / ``kla_tokenwise_bound`` (docs/kla.md)."""
    from analysis.kaczmarz_bounds import kla_chunkwise_bound, kla_tokenwise_bound

    x = {k: v.cpu() for k, v in rounded.items()}
    kw = dict(alpha=case.options["alpha"].cpu().double(), eta=case.options["eta"].cpu().double(),
              eps=case.options["eps"])
    C = case.options["chunk_size"]
    Bo, BS = kla_chunkwise_bound(x["q"], x["k"], x["v"], chunk_size=C, arith=model, **kw)
    To, TS = kla_tokenwise_bound(x["q"], x["k"], x["v"], arith=REFERENCE_ARITH, **kw)
    Co, CS = kla_chunkwise_bound(x["q"], x["k"], x["v"], chunk_size=C, arith=REFERENCE_ARITH, **kw)
    dev = rounded["q"].device
    return (Bo + To + Co).to(dev), (BS + TS + CS).to(dev)


def kla(max_T: int = 300, dims=(16, 32, 64), max_heads: int = 2, max_batch: int = 2, chunk_size: int = 64,
        per_channel: bool = False, precision: torch.dtype = torch.bfloat16, device="cpu", **_unused) -> Strategy:
    """KLA sequences (analysis.strategies.kla_case) in fla's layout ``(B, T, H, d)``, for
    ``f(q, k, v, *, alpha, eta, eps, chunk_size) -> (o, S_T)`` (solvers.kla_chunkwise,
    solvers.kla_recurrent, a KLA kernel); zero initial state; T around the chunk size."""
    cases = _kla_case(max_T=max_T, dims=tuple(dims), max_heads=max_heads, max_batch=max_batch,
                      chunk_size=chunk_size, per_channel=per_channel, precision=precision, device=device)
    return Strategy("kla", cases, ("o", "S_T"), (1, 2), _kla_scales,
                    doc="KLA sequences; bound: analysis.kaczmarz_bounds running error bounds")


STRATEGIES = {
    "spd": spd,
    "spd_nobounds": lambda **kw: spd(bounds=False, **kw),
    "spd_backward": spd_backward,
    "kla": kla,
}


# ---------------------------------------------------------------------------------------
# running checks
# ---------------------------------------------------------------------------------------


@dataclass
class Finding:
    """The error/bound ratio of one output of one system in one case (``reference_norm``: the
    norm of that system's reference output, to state error and bound relative to it)."""

    ratio: float
    output: str
    system: int
    error: float
    bound: float
    case: str
    reference_norm: float = float("nan")

    def __str__(self) -> str:
        return (f"ratio {self.ratio:.3g} (error {self.error:.3e} vs bound {self.bound:.3e}) "
                f"in output {self.output!r}, system {self.system}, case {self.case}")


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

    @property
    def passed(self) -> bool:
        return self.failure is None and self.error is None

    def __str__(self) -> str:
        head = (f"{self.kernel} vs {self.reference} | strategy {self.strategy} | inputs {self.precision} | "
                f"model {self.model} | {self.examples} cases")
        lines = [head, f"worst: {self.worst}" if self.worst else "worst: (no case ran)"]
        if self.failure:
            lines.append(f"FAILED, shrunk counterexample: {self.failure}")
        if self.error:
            lines.append(f"FAILED with an exception: {self.error}")
        if self.passed:
            lines.append("PASSED: every output within its bound")
        return "\n".join(lines)


def _to(v, device):
    return v.to(device) if isinstance(v, torch.Tensor) else v


def _tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def run_case(kernel, reference, strategy: Strategy, case: Case, *, precision: torch.dtype,
             model: Arith, device) -> list:
    """Run one case through both callables; returns one :class:`Finding` per output (the
    worst system of each)."""
    rounded_in = {k: v.to(precision).to(device) for k, v in case.inputs.items()}
    ref_in = {k: v.to(torch.float32) for k, v in rounded_in.items()}
    opts = {k: _to(v, device) for k, v in case.options.items()}
    k_out = _tuple(kernel(*rounded_in.values(), **opts))
    r_out = _tuple(reference(*ref_in.values(), **opts))
    if len(k_out) != len(strategy.outputs) or len(r_out) != len(strategy.outputs):
        raise AssertionError(f"expected outputs {strategy.outputs}, got {len(k_out)} from the kernel "
                             f"and {len(r_out)} from the reference")
    exact = {k: v.to(torch.float64) for k, v in rounded_in.items()}
    scales = strategy.scales(case, exact, model)
    findings = []
    for name, core, k, r, b in zip(strategy.outputs, strategy.core_dims, k_out, r_out, scales):
        if k.shape != r.shape:
            raise AssertionError(f"output {name!r}: kernel shape {tuple(k.shape)} != reference {tuple(r.shape)}")
        dims = tuple(range(-core, 0))
        k64, r64 = k.to(torch.float64), r.to(torch.float64)
        err = torch.linalg.vector_norm(k64 - r64, dim=dims) if core else (k64 - r64).abs()
        out_round = unit_roundoff(k.dtype) * torch.linalg.vector_norm(k64, dim=dims)  # one rounding of the result
        bound = torch.broadcast_to(b.to(err.device), err.shape) + out_round
        # an exact match passes even where the bound is 0 (e.g. dH of r = 0 steps); NaN fails
        ratio = torch.where(err == 0, torch.zeros_like(err), err / bound).reshape(-1)
        ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, math.inf), ratio)
        if ratio.numel() == 0:
            continue
        j = int(torch.argmax(ratio))
        ref_norm = torch.linalg.vector_norm(r64, dim=dims) if core else r64.abs()
        findings.append(Finding(float(ratio[j]), name, j, float(err.reshape(-1)[j]), float(bound.reshape(-1)[j]),
                                case.label, float(ref_norm.reshape(-1)[j])))
    return findings


def check(kernel, reference, strategy: Strategy, *, precision: str = "bfloat16", model: str = "float32",
          examples: Optional[int] = None, device=None, poison: bool = True, shrink: bool = True) -> Report:
    """Run the property check; never raises for a failing kernel (see the Report).

    ``examples``: hypothesis max_examples (default: the loaded profile's); ``shrink=False``
    reports the first failing case as drawn (fast, for tests of deliberately broken kernels).
    """
    dtype = PRECISIONS[precision]
    arith = by_label(model)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rep = Report(_name(kernel), _name(reference), strategy.name, precision, model)
    state = {"last_failure": None}

    def prop(case):
        rep.examples += 1
        ctx = nan_poisoned_empty() if poison else contextlib.nullcontext()
        with ctx:
            found = run_case(kernel, reference, strategy, case, precision=dtype, model=arith, device=device)
        for f in found:
            rep.history.append(f)
            if rep.worst is None or f.ratio > rep.worst.ratio:
                rep.worst = f
        bad = [f for f in found if not f.ratio <= 1.0]
        if bad:
            state["last_failure"] = max(bad, key=lambda f: f.ratio)
            raise AssertionError(str(state["last_failure"]))

    run = given(strategy.cases)(prop)
    overrides = {"report_multiple_bugs": False, "deadline": None}  # first calls compile kernels
    if examples is not None:
        overrides["max_examples"] = examples
    if not shrink:
        overrides["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    run = settings(**overrides)(run)
    try:
        run()
    except AssertionError:
        rep.failure = state["last_failure"]
        if rep.failure is None:
            raise
    except Exception as e:  # noqa: BLE001 - a kernel that crashes is a finding, reported
        rep.error = f"{type(e).__name__}: {e}"
    return rep


def assert_matches(kernel, reference, strategy: Strategy, **kw) -> Report:
    """:func:`check`, raising AssertionError with the report when any output exceeds its bound."""
    rep = check(kernel, reference, strategy, **kw)
    if not rep.passed:
        raise AssertionError(str(rep))
    return rep


def _name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def load(spec: str):
    """``"package.module:function"`` -> the function."""
    mod, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"expected module:function, got {spec!r}")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.harness", description=__doc__.splitlines()[0])
    ap.add_argument("kernel", help="module:function of the kernel under test")
    ap.add_argument("reference", help="module:function of the reference it should match")
    ap.add_argument("--strategy", choices=sorted(STRATEGIES), required=True)
    ap.add_argument("--precision", choices=sorted(PRECISIONS), default="bfloat16", help="kernel input dtype")
    ap.add_argument("--model", default="float32", help="the kernel's arithmetic: float32 | bfloat16/storage | ...")
    ap.add_argument("--examples", type=int, default=50)
    ap.add_argument("--max-d", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--device", default=None)
    ap.add_argument("--no-shrink", action="store_true", help="report the first failing case as drawn")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes = {} if args.strategy == "kla" else {"max_d": args.max_d, "max_batch": args.max_batch}
    strat = STRATEGIES[args.strategy](precision=PRECISIONS[args.precision], device=device, **sizes)
    rep = check(load(args.kernel), load(args.reference), strat, precision=args.precision, model=args.model,
                examples=args.examples, device=device, shrink=not args.no_shrink)
    print(rep)
    return 0 if rep.passed else 1


if __name__ == "__main__":
    sys.exit(main())
