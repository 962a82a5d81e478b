"""The kernel harness's ``koopman`` strategy: Spectral Koopman Attention readouts (Echo eq. (13),
Appendix F steps 4-10), for kernels such as ``kernels.koopman_readout``.

The call
--------
A readout kernel consumes the statistics, not the sequence, so the callables take them as
tensors::

    f(G, M, Cv, zq, *, scale, K, eta, gamma) -> y (*batch, Q, P)

``G (*batch, r, r)`` is the regularised Gram ``G~``, ``M (*batch, r, r)`` the lag-one
covariance, ``Cv (*batch, P, r)`` the value-key covariance, ``zq (*batch, Q, r)`` the raw queries
(divided by ``scale``, the sequence max m, inside); ``K``, ``eta``, ``gamma`` as in
``solvers.koopman_readout`` (eta and gamma a float or one value per system). The harness rounds
G, M, Cv and zq to the kernel's input dtype and gives the reference their float32 copies, so
both read the same statistics (computed inside each callable from bf16 keys, they would differ
between the two). :func:`koopman_kernel` and :func:`koopman_reference` put
``kernels.koopman_readout`` and ``solvers.koopman_readout`` behind this call;
:func:`on_statistics` does the same for any ``readout(stats, zq, **options)``.

The cases (:func:`koopman_problem`)
-----------------------------------
Keys with AR(1) dynamics ``z_t = dyn z_{t-1} + e_t`` (``dyn`` 0 (i.i.d.), 0.5 or 0.8) and uneven
norms (each token scaled by 0.3 + U(0, 1)), Gaussian values and queries, one sequence per system;
prefix-mode statistics (``solvers.koopman_statistics`` in float64, eps = 1e-3, m the sequence
max). r up to 64 (sizes where the kernel's tiles pad or split into blocks; ``pow2``: powers of
two), T = 4, 8 or 16 times r (plus 0-3 tokens), P >= 3 up to 128, K in 0..3, gamma in
[1, 1.5], eta in +-[0.25, 2], eta and gamma one value or one per system. G~ rounded to the input
dtype must be safe for float32 Cholesky (Higham Thm 10.7, ``20 r^1.5 kappa u <= 1``; a draw that
is not is discarded): a kernel that jitters where the reference does not is another computation,
not a rounding. SKA's own statistics make the whitened operator a contraction (docs/koopman.md),
so eq. (12)'s normalisation never acts on them; in part of the cases M is multiplied by
``gain = 3`` so that ``sigma_max(A_w) > 1`` and the normalisation (and its power estimate) is
exercised. Left out, because the bound below is vacuous there even in float32: fewer tokens or
slower-mixing keys (T = 2r, or dyn = 0.9 at T = 4r, give kappa(G~) in the hundreds to
thousands, as in early chunks of the chunk-causal mode), and P = 1 (y is then one inner product
of r terms, whose rounding bound exceeds |y| wherever the terms cancel).

The bound (:func:`readout_bound`) -- a model, not a proof
---------------------------------------------------------
Per query, ``||y_kernel - y_reference|| <= (A(contract) + A(float32)) S_q`` (plus the harness's
rounding of the returned y) with

* ``S_q = |eta| max_k ||W A'^k|| max(||A'^{K-k} w_q||, ||A'|| ||A'^{K-k-1} w_q||)``,
  ``W = C_v L^{-T}``, ``w_q = L^{-1} zq_q / m``, ``A' = gamma A_w / max(1, sigma)`` (the 6-step
  power estimate replayed), all exact (float64) on the rounded inputs. A first-order error of
  the chain ``y_q = eta W A' ... A' w_q`` (a whitening, a product, a factor A') sits between
  two partial products with at most one factor A' between them, so ``S_q`` is the size it
  multiplies; ``||y_q|| <= S_q <= |eta| ||W|| ||A'||^K ||w_q||``, which on SKA's own statistics
  (gain 1) is at most the a-priori scale ``S`` of the verification rows
  (``analysis.references.koopman.readout_scale``);
* ``A(c) = analysis.precision.rounding_allowance((K + 2) kappa(G~), r, c)``, the project's
  allowance ``8 kappa (n u_acc + u_store)`` (docs/precision.md, "Why c = 8") with the
  verification rows' ``kappa = (K + 2) kappa(G~)`` (K + 1 factors ``G~^{-1}`` in
  ``eta C_v G~^{-1} (M G~^{-1})^K zq``, plus the query's whitening) and ``n = r``, the length of
  every dot product once the statistics are inputs (the rows' ``max(T, r)`` also counts the sums
  that form them); the contract's operand rounding of a float32 value (tf32: 2^-11, tf32x3:
  2^-22, bf16: 2^-8) or its stores take the ``u_store`` place.

First order, every rounding aligned at its worst: a model of a backward-stable readout
(Cholesky, triangular inverse or solves, products), which both ``kernels.koopman_readout``
(explicit ``L^{-1}``, ``F = eta W A'^K``) and ``solvers.koopman_readout`` (two solves for
``B_v``, ``z_f = L w_f``) are, not a theorem about every algorithm. How tight, against the exact
readout (float64) on the same statistics, with one contract's bound (docs/harness.md, "Koopman
readout"; tests/test_harness_koopman.py):

* on 250 drawn cases (seeds 0-4, 50 each): ``bound / ||y||`` (kernel's plus reference's bound,
  ``||y||`` the system's largest query output) median 0.0021, 90% 0.059, max 0.44 under
  float32, never vacuous; under tf32 median 0.36, 90% 5, vacuous on 24% of the cases
  (INCONCLUSIVE runs); measured / bound median 3e-4, 90% 0.014, max 0.15 for the float32
  emulation of the kernel's algorithm (0.26 for ``solvers.koopman_readout`` in float32), median
  0.0039, max 0.12 for its tf32 emulation (operands rounded to nearest);
* ``kernels.koopman_readout`` on an H100 (Triton 3.6, 40 cases, seed 0, float32 result):
  measured / bound max 0.24 (``"ieee"``, float32), 0.05 (``"tf32x3"``), 0.48 (``"tf32"``, four
  times the tf32 emulation's worst).

The harness module holds the two wrappers that build its :class:`~analysis.testing.harness.Case`
and :class:`~analysis.testing.harness.Strategy` from what this module returns
(``harness.koopman_case``, ``harness.koopman``): this module cannot import the harness, which
imports it to register the strategy (tests/test_import_graph.py forbids the circle, and under
``python -m analysis.testing.harness`` the harness is ``__main__``, whose classes a module
importing ``analysis.testing.harness`` would not see).
"""

from __future__ import annotations

import math
import numbers
from types import SimpleNamespace
from typing import Callable

import torch
from hypothesis import assume
from hypothesis import strategies as st

import solvers
from analysis.precision import rounding_allowance
from solvers import validation as check
from solvers.contracts import PRESETS, parse
from solvers.koopman import DEFAULT_EPS, GAMMA_RANGE, POWER_ITERS, KoopmanStatistics

F64 = torch.float64
REFERENCE_CONTRACT = PRESETS["float32"]
OUTPUTS = ("y",)
# sizes the kernel's layouts meet: one tile (1-16, 32, 64), padding (3, 5, 13, 17, 33), 2 x 2
# blocks split at 16 or 32 (24, 48); the first of each list is the simplest, where shrinking goes
R_SIZES = (1, 2, 3, 5, 8, 13, 16, 17, 24, 33, 48, 64)
# P >= 3: with one value dimension y is one inner product of r terms, whose rounding bound (the
# sum of |terms|) exceeds |y| wherever the terms cancel, and the bound is vacuous there (module
# docstring); 3 still leaves most of the kernel's value tile padding
P_SIZES = (3, 8, 17, 64, 128)
Q_SIZES = (1, 2, 5, 17, 65)
DYNAMICS = (0.8, 0.0, 0.5)  # AR(1) coefficient of the keys; 0: i.i.d.
GAINS = (1.0, 3.0)  # M multiplied by this: 3 puts sigma_max(A_w) above 1 (eq. (12) acts)
T_FACTORS = (4, 8, 16)  # T = factor * r + 0..3 tokens
KS = (2, 1, 3, 0)  # the paper's K = 2 first


# ----------------------------------------------------------------------------- the call


def on_statistics(readout: Callable) -> Callable:
    """``readout(stats, zq, **options)`` (``solvers.koopman_readout``'s call) as the strategy's
    ``f(G, M, Cv, zq, *, scale, **options)``: the tensors become a ``KoopmanStatistics``
    (eps 1e-3 and bf16 storage mode: neither enters the readout)."""
    if not callable(readout):
        raise TypeError(f"readout must be a callable, got {readout!r}")

    def call(G, M, Cv, zq, *, scale, **options):
        return readout(KoopmanStatistics(G, M, Cv, scale, DEFAULT_EPS), zq, **options)

    call.__qualname__ = f"on_statistics({getattr(readout, '__qualname__', repr(readout))})"
    call.__module__ = getattr(readout, "__module__", __name__)
    return call


def koopman_reference(G, M, Cv, zq, *, scale, K: int = 2, eta=1.5, gamma=1.0):
    """``solvers.koopman_readout`` behind the strategy's call (module docstring)."""
    return solvers.koopman_readout(
        KoopmanStatistics(G, M, Cv, scale, DEFAULT_EPS), zq, K=K, eta=eta, gamma=gamma
    )


def koopman_kernel(G, M, Cv, zq, *, scale, K: int = 2, eta=1.5, gamma=1.0, **options):
    """``kernels.koopman_readout`` behind the strategy's call (``options``: its
    ``input_precision``, ``out_dtype``). Triton is imported at the first call, so that the
    command line can set TRITON_INTERPRET first on a machine without a GPU."""
    from kernels.koopman import koopman_readout

    return koopman_readout(
        KoopmanStatistics(G, M, Cv, scale, DEFAULT_EPS), zq, K=K, eta=eta, gamma=gamma, **options
    )


# ----------------------------------------------------------------------------- the cases


def koopman_sequences(T: int, r: int, P: int, Q: int, *, batch=(1,), dyn=0.8, seed=0):
    """Keys ``z (*batch, T, r)`` with AR(1) dynamics and uneven norms, values ``v (*batch, T, P)``
    and queries ``zq (*batch, Q, r)``, Gaussian, float64 (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(*batch, T, r, generator=g, dtype=F64)
    z = e.clone()
    for t in range(1, T):
        z[..., t, :] = dyn * z[..., t - 1, :] + e[..., t, :]
    z = z * (0.3 + torch.rand(*batch, T, 1, generator=g, dtype=F64))
    v = torch.randn(*batch, T, P, generator=g, dtype=F64)
    zq = torch.randn(*batch, Q, r, generator=g, dtype=F64)
    return z, v, zq


def _per_system(name: str, value, n: int, low: float, high: float, *, signed: bool):
    """``value`` (a float, or a tuple of one per system) rounded to float32, as both callables
    read it: ``(option, label)``. ``low <= value <= high``, or ``|value|`` when ``signed``."""
    many = isinstance(value, (tuple, list))
    values = list(value) if many else [value]
    if many and len(values) != n:
        raise ValueError(f"{name} must be a float or {n} floats (one per system), got {value!r}")
    out = []
    for x in values:
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
            raise ValueError(f"{name} must hold finite floats, got {value!r}")
        x = float(torch.tensor(float(x), dtype=torch.float32))
        if not low <= (abs(x) if signed else x) <= high:
            what = f"|{name}|" if signed else name
            raise ValueError(f"{what} must lie in [{low}, {high}], got {value!r}")
        out.append(x)
    return (torch.tensor(out, dtype=F64), tuple(out)) if many else (out[0], out[0])


def koopman_problem(
    T: int,
    r: int,
    P: int,
    Q: int,
    *,
    batch: tuple = (1,),
    dyn: float = 0.8,
    gain: float = 1.0,
    K: int = 2,
    eta=1.5,
    gamma=1.2,
    seed: int = 0,
    precision: torch.dtype = torch.bfloat16,
    device="cpu",
) -> dict:
    """The fields of one ``koopman`` case (``harness.koopman_case`` makes it a Case):
    ``inputs`` G, M, Cv, zq (float64, before rounding), ``options`` scale, K, eta, gamma,
    ``label``, ``meta``.

    ``batch``: ``()`` or ``(n,)``; ``dyn``: the keys' AR(1) coefficient in [0, 1); ``gain``: M
    multiplied by it; ``eta``: a float with ``0.25 <= |eta| <= 2``, or a tuple of one per
    system; ``gamma`` in [1, 1.5], likewise. Raises ValueError when G~ rounded to ``precision``
    is not safely factorable in float32 (``20 r^1.5 kappa u > 1``, Higham Thm 10.7).
    """
    for name, v, lo in (("T", T, 2), ("r", r, 1), ("P", P, 1), ("Q", Q, 1), ("K", K, 0)):
        check.count(name, v, minimum=lo)
    check.count("seed", seed)
    batch = tuple(batch)
    if len(batch) > 1 or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batch):
        raise ValueError(f"batch must be () or (n,) with n >= 1, got {batch!r}")
    dyn = check.real("dyn", dyn, low=0.0)
    if dyn >= 1.0:
        raise ValueError(f"dyn must lie in [0, 1), got {dyn}")
    gain = check.real("gain", gain, low=0.0, low_open=True)
    n = batch[0] if batch else 1
    eta_opt, eta_label = _per_system("eta", eta, n, 0.25, 2.0, signed=True)
    gamma_opt, gamma_label = _per_system("gamma", gamma, n, *GAMMA_RANGE, signed=False)
    if not batch and (isinstance(eta, (tuple, list)) or isinstance(gamma, (tuple, list))):
        raise ValueError("per-system eta or gamma needs batch = (n,)")
    if precision not in (torch.float32, torch.bfloat16):
        raise ValueError(f"precision must be torch.float32 or torch.bfloat16, got {precision!r}")
    z, v, zq = koopman_sequences(T, r, P, Q, batch=batch, dyn=dyn, seed=seed)
    stats = solvers.koopman_statistics(z, v)
    lam = torch.linalg.eigvalsh(stats.G.to(precision).to(F64))
    kappa = lam[..., -1] / lam[..., 0]
    if not bool((lam[..., 0] > 0).all()) or not bool((20 * r**1.5 * kappa * 2.0**-24 <= 1).all()):
        raise ValueError(
            f"G~ rounded to {precision} is not safely factorable in float32 (kappa "
            f"{float(kappa.max()):.3g}, Higham Thm 10.7 needs 20 r^1.5 kappa u <= 1)"
        )
    dev = torch.device(device)
    inputs = {
        "G": stats.G.to(dev),
        "M": (gain * stats.M).to(dev),
        "Cv": stats.Cv.to(dev),
        "zq": zq.to(dev),
    }
    scale = stats.scale.to(torch.float32).to(F64)  # both callables read m in float32
    options = {
        "scale": scale.to(dev),
        "K": K,
        "eta": eta_opt.to(dev) if isinstance(eta_opt, torch.Tensor) else eta_opt,
        "gamma": gamma_opt.to(dev) if isinstance(gamma_opt, torch.Tensor) else gamma_opt,
    }
    label = (
        f"T={T} r={r} P={P} Q={Q} batch={batch} dyn={dyn} gain={gain} K={K} eta={eta_label} "
        f"gamma={gamma_label} seed={seed} kappa(G~)<={float(kappa.max()):.3g}"
    )
    return {"inputs": inputs, "options": options, "label": label, "meta": {}}


def _sizes(limit: int, sizes: tuple, pow2: bool) -> list:
    """``sizes`` up to ``limit`` (with ``pow2``: the powers of two from ``sizes[0]`` on); at
    least ``[limit]``."""
    if pow2:
        sizes = tuple(d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d >= sizes[0])
    return [d for d in sizes if d <= limit] or [limit]


@st.composite
def _cases(draw, build, *, max_r, max_P, max_Q, max_batch, max_K, gains, pow2, precision, device):
    rs = _sizes(max_r, R_SIZES, pow2)
    # the largest r, where the kernel's tiles fill, about a quarter of the cases (as harness.spd)
    r = draw(st.sampled_from(rs + rs[-1:] * (len(rs) // 3)))
    T = draw(st.sampled_from(T_FACTORS)) * r + draw(st.integers(0, 3))
    n = draw(st.integers(1, max_batch))
    batch = draw(st.sampled_from([(n,), ()])) if n == 1 else (n,)
    per_system = len(batch) == 1 and draw(st.booleans())
    magnitudes = st.floats(0.25, 2.0) | st.sampled_from([1.5])
    signed = st.builds(lambda s, m: s * m, st.sampled_from([1.0, -1.0]), magnitudes)
    gammas = st.floats(*GAMMA_RANGE)
    kw = dict(
        T=T,
        r=r,
        P=draw(st.sampled_from(_sizes(max_P, P_SIZES, pow2))),
        Q=draw(st.sampled_from(_sizes(max_Q, Q_SIZES, False))),
        batch=batch,
        dyn=draw(st.sampled_from(DYNAMICS)),
        gain=draw(st.sampled_from(gains)),
        K=draw(st.sampled_from([k for k in KS if k <= max_K])),
        eta=tuple(draw(signed) for _ in range(n)) if per_system else draw(signed),
        gamma=tuple(draw(gammas) for _ in range(n)) if per_system else draw(gammas),
        seed=draw(st.integers(0, 2**31 - 1)),
        precision=precision,
        device=str(device),
    )
    try:
        return build(**kw)
    except ValueError:  # G~ not safely factorable once rounded (koopman_problem)
        assume(False)


def koopman_strategy(
    build: Callable,
    *,
    max_r: int = 64,
    max_P: int = 17,
    max_Q: int = 5,
    max_batch: int = 3,
    max_K: int = 3,
    gains: tuple = GAINS,
    pow2: bool = False,
    precision: torch.dtype = torch.bfloat16,
    device="cpu",
) -> dict:
    """The keyword arguments of the harness's ``Strategy`` for SKA readouts (``harness.koopman``
    calls this with ``build = harness.koopman_case``, the builder of :func:`koopman_problem`'s
    Case).

    ``max_r`` (<= 64, the kernel's limit), ``max_P`` (<= 128), ``max_Q``, ``max_batch``,
    ``max_K``: the largest sizes drawn; ``gains``: the factors M is multiplied by (module
    docstring); ``pow2``: r and P powers of two only (kernels that do not pad); ``precision``:
    the kernel's input dtype (G~ is checked as rounded to it); ``device``: where the cases live.
    """
    if not callable(build):
        raise TypeError(f"build must be a callable, got {build!r}")
    for name, v, hi in (
        ("max_r", max_r, 64),
        ("max_P", max_P, 128),
        ("max_Q", max_Q, None),
        ("max_batch", max_batch, None),
    ):
        check.count(name, v, minimum=1)
        if hi is not None and v > hi:
            raise ValueError(
                f"{name} must be at most {hi} (kernels.koopman_readout's limit), got {v}"
            )
    check.count("max_K", max_K)
    check.flag("pow2", pow2)
    if not isinstance(gains, (tuple, list)) or not gains:
        raise ValueError(f"gains must be a non-empty tuple of positive floats, got {gains!r}")
    for g in gains:
        check.real("gains", g, low=0.0, low_open=True)
    if precision not in (torch.float32, torch.bfloat16):
        raise ValueError(f"precision must be torch.float32 or torch.bfloat16, got {precision!r}")
    cases = _cases(
        build,
        max_r=max_r,
        max_P=max_P,
        max_Q=max_Q,
        max_batch=max_batch,
        max_K=max_K,
        gains=tuple(float(g) for g in gains),
        pow2=pow2,
        precision=precision,
        device=device,
    )
    return dict(
        name="koopman",
        cases=cases,
        outputs=OUTPUTS,
        core_dims=(1,),
        scales=koopman_scales,
        doc="Echo SKA readouts f(G, M, Cv, zq, *, scale, K, eta, gamma); bound: the allowance "
        "(K + 2) kappa(G~), n = r, times the factor norms of y (a first-order model)",
        # y (*batch, Q): a system's queries are judged together, since a query whose output
        # cancels to a small vector says nothing about the bound
        vacuity_dims=((-1,),),
    )


# ----------------------------------------------------------------------------- the bound


def _units(contract) -> SimpleNamespace:
    """The allowance's ``u_acc`` and ``u_store`` for a contract: its accumulation, and the
    larger of its stores and its operand rounding of a float32 value."""
    c = parse(contract)
    return SimpleNamespace(u_acc=c.u_acc, u_store=max(c.u_store, c.u_operand(2.0**-24)))


def _param(v, batch, device) -> torch.Tensor:
    return torch.broadcast_to(torch.as_tensor(v, dtype=F64, device=device), batch)


def readout_terms(G, M, Cv, zq, *, scale, K: int, eta, gamma, power_iters: int = POWER_ITERS):
    """``(S_q (*batch, Q), kappa(G~) (*batch))`` of the exact readout on these statistics
    (float64): ``S_q = |eta| max_k ||W A'^k|| max(||A'^{K-k} w_q||, ||A'|| ||A'^{K-k-1} w_q||)``
    with ``W = C_v L^{-T}``, ``w_q = L^{-1} zq_q / m`` (module docstring). A G~ that is not
    positive definite gives ``S_q = inf``."""
    G, M, Cv, zq = (x.to(F64) for x in (G, M, Cv, zq))
    batch, r = G.shape[:-2], G.shape[-1]
    L, info = torch.linalg.cholesky_ex(G)
    ok = info == 0
    eye = torch.eye(r, dtype=F64, device=G.device)
    L = torch.where(ok[..., None, None], L, eye)
    X = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False)
    A_w = X @ M @ X.mT
    sigma = solvers.power_sigma_max(A_w, iters=power_iters)
    A = (_param(gamma, batch, G.device) / sigma.clamp(min=1.0))[..., None, None] * A_w
    a = torch.linalg.matrix_norm(A, ord=2)
    m = _param(scale, batch, G.device)
    # left[k] = ||W A'^k||, right[j] = ||A'^j w_q|| (per query)
    WA, w = Cv @ X.mT, (zq @ X.mT) / m[..., None, None]
    left, right = [], []
    for _ in range(K + 1):
        left.append(torch.linalg.matrix_norm(WA, ord=2))
        right.append(torch.linalg.vector_norm(w, dim=-1))
        WA, w = WA @ A, w @ A.mT
    # every first-order error of the chain eta W A' ... A' w_q sits between two partial
    # products, with at most one factor A' in between replaced by its norm
    S = torch.stack(
        [
            left[k][..., None]
            * (
                right[K - k]
                if k == K
                else torch.maximum(right[K - k], a[..., None] * right[K - k - 1])
            )
            for k in range(K + 1)
        ]
    ).amax(0)
    S = _param(eta, batch, G.device).abs()[..., None] * S
    lam = torch.linalg.eigvalsh(G)
    kappa = torch.where(ok, lam[..., -1] / lam[..., 0], torch.full_like(lam[..., 0], math.inf))
    return torch.where(ok[..., None], S, torch.full_like(S, math.inf)), kappa


def readout_bound(G, M, Cv, zq, *, scale, K: int, eta, gamma, contract) -> torch.Tensor:
    """Per query ``(*batch, Q)``: ``A(contract) S_q``, the model bound on the distance of a
    readout honouring ``contract`` from the exact readout of these statistics (module
    docstring; ``A(c) = rounding_allowance((K + 2) kappa(G~), r, c)``)."""
    S, kappa = readout_terms(G, M, Cv, zq, scale=scale, K=K, eta=eta, gamma=gamma)
    r = G.shape[-1]
    units = _units(contract)
    allowance = torch.tensor(
        [rounding_allowance((K + 2) * float(k), r, units) for k in kappa.reshape(-1).tolist()],
        dtype=F64,
        device=S.device,
    ).reshape(kappa.shape)
    return allowance[..., None] * S


def koopman_scales(case, rounded, contract) -> tuple:
    """y: the kernel's model bound plus the float32 reference's (:func:`readout_bound`)."""
    o = case.options
    args = (rounded["G"], rounded["M"], rounded["Cv"], rounded["zq"])
    kw = dict(scale=o["scale"], K=o["K"], eta=o["eta"], gamma=o["gamma"])
    return (
        readout_bound(*args, contract=contract, **kw)
        + readout_bound(*args, contract=REFERENCE_CONTRACT, **kw),
    )


__all__ = [
    "koopman_kernel",
    "koopman_problem",
    "koopman_reference",
    "koopman_scales",
    "koopman_sequences",
    "koopman_strategy",
    "on_statistics",
    "readout_bound",
    "readout_terms",
]
