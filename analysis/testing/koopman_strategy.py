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

The bound
---------
:func:`analysis.bounds.koopman.readout_bound` (its module docstring derives it: a proof to all
orders under stated hypotheses, for the kernel's one-tile path, its divisions and square roots
charged the GPU's fast ``div.full.f32`` / ``sqrt.approx.f32`` error; what stays outside it is
listed there) for the kernel's contract plus the float32 reference's;
:func:`analysis.bounds.koopman.model_bound` keeps the first-order model of earlier versions
(``harness.koopman(bound="model")``).

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
from typing import Callable

import torch
from hypothesis import assume
from hypothesis import strategies as st

import solvers
from analysis.bounds.koopman import model_bound, readout_bound, readout_terms
from solvers import validation as check
from solvers.contracts import PRESETS
from solvers.koopman import DEFAULT_EPS, GAMMA_RANGE, KoopmanStatistics

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
    bound: str = "proof",
) -> dict:
    """The keyword arguments of the harness's ``Strategy`` for SKA readouts (``harness.koopman``
    calls this with ``build = harness.koopman_case``, the builder of :func:`koopman_problem`'s
    Case).

    ``max_r`` (<= 64, the kernel's limit), ``max_P`` (<= 128), ``max_Q``, ``max_batch``,
    ``max_K``: the largest sizes drawn; ``gains``: the factors M is multiplied by (module
    docstring); ``pow2``: r and P powers of two only (kernels that do not pad); ``precision``:
    the kernel's input dtype (G~ is checked as rounded to it); ``device``: where the cases live;
    ``bound``: ``"proof"`` (:func:`readout_bound`, default) or ``"model"`` (the first-order
    :func:`model_bound`, fewer INCONCLUSIVE runs under tf32 and no guarantee).
    """
    if bound not in ("proof", "model"):
        raise ValueError(f"bound must be 'proof' or 'model', got {bound!r}")
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
        scales=koopman_scales if bound == "proof" else koopman_model_scales,
        doc="Echo SKA readouts f(G, M, Cv, zq, *, scale, K, eta, gamma); bound: "
        + (
            "a proof to all orders under stated hypotheses (Higham Thms 10.3, 8.5, 10.8; eq. (12)'s "
            "power estimate bracketed; the GPU's fast division and root charged; the kernel's "
            "blocked path outside them), INCONCLUSIVE where a condition fails"
            if bound == "proof"
            else "the allowance (K + 2) kappa(G~), n = r, times the factor norms of y "
            "(a first-order model)"
        ),
        # y (*batch, Q): a system's queries are judged together, since a query whose output
        # cancels to a small vector says nothing about the bound
        vacuity_dims=((-1,),),
    )


def koopman_scales(case, rounded, contract) -> tuple:
    """y: the kernel's bound (:func:`readout_bound`, ``algorithm="either"``, its products under
    ``contract``) plus the float32 reference's (``algorithm="solves"``): a proof under the
    hypotheses of :mod:`analysis.bounds.koopman` (what stays outside them listed there)."""
    o = case.options
    args = (rounded["G"], rounded["M"], rounded["Cv"], rounded["zq"])
    kw = dict(scale=o["scale"], K=o["K"], eta=o["eta"], gamma=o["gamma"])
    return (
        readout_bound(*args, contract=contract, algorithm="either", **kw)
        + readout_bound(*args, contract=REFERENCE_CONTRACT, algorithm="solves", **kw),
    )


def koopman_model_scales(case, rounded, contract) -> tuple:
    """y: the first-order model (:func:`model_bound`) of the kernel plus the reference's."""
    o = case.options
    args = (rounded["G"], rounded["M"], rounded["Cv"], rounded["zq"])
    kw = dict(scale=o["scale"], K=o["K"], eta=o["eta"], gamma=o["gamma"])
    return (
        model_bound(*args, contract=contract, **kw)
        + model_bound(*args, contract=REFERENCE_CONTRACT, **kw),
    )


__all__ = [
    "koopman_kernel",
    "koopman_problem",
    "koopman_reference",
    "koopman_model_scales",
    "koopman_scales",
    "koopman_sequences",
    "koopman_strategy",
    "on_statistics",
    "model_bound",
    "readout_bound",
    "readout_terms",
]
