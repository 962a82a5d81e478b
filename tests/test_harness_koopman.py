"""The harness's ``koopman`` strategy (analysis.testing.koopman_strategy): Echo SKA readouts
``f(G, M, Cv, zq, *, scale, K, eta, gamma) -> y`` held to ``B(contract) + B(float32)``, the
all-orders bound ``readout_bound`` (a proof under Higham Thms 10.3, 8.5, 10.8 and the power
estimate's bracket; ``model_bound`` is the first-order model it replaced).

* ``kernels.koopman_readout`` (interpreter on the CPU) and ``solvers.koopman_readout`` PASS under
  float32 with seed 0 and the ci profile's 12 cases; a plain-torch emulation of the kernel's
  algorithm with tf32 operands never FAILs under tf32;
* broken variants FAIL with seed 0 and 12 cases (no shrinking), each far beyond the bound:
  output x 0.9, eta's sign flipped, K - 1 and K + 1 powers, the first system's eta for every
  system (a stride slip), no spectral normalisation (a factor ``max(1, sigma)^K`` on the cases
  with M x 3); output x 0.99 FAILs too, since the bound is below 1% of ||y|| on most cases;
* the bound is not vacuous on the drawn float32 cases (bound / ||y|| quantiles), holds on the
  emulations of both algorithms measured against the exact readout (measured / bound
  quantiles, float32 and bf16 inputs, float32 and tf32 operands), is exceeded by a tf32
  readout held to the float32 bound (it is no larger than it must be), and is ``inf``
  (INCONCLUSIVE) where a condition of the proof fails;
* each step's bound (the factor's backward error, ``X^ L - I``, the whitened operator, the
  power estimate's interval) holds for the kernel's algorithm emulated under float32, tf32 and
  bf16 operands, and a whitening from M^T leaves its step's bound.
"""

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import settings
from kernel_support import DEVICE, needs_triton_device, poisoned_outputs  # noqa: F401

import solvers
import svt_pytest
from analysis.testing import harness
from analysis.testing import koopman_strategy as ks
from kernels.emulate import round_significand, truncate_significand

SEED = 0
svt_pytest.register_profiles()  # idempotent; the plugin has done it under pytest
CI_EXAMPLES = settings.get_profile("svt-ci").max_examples  # 12, whatever profile is loaded
F64 = torch.float64
F32 = torch.float32
BROKEN = (
    "scaled",
    "eta_sign",
    "k_minus_one",
    "k_plus_one",
    "eta_of_first_system",
    "unnormalised",
)


def _cut(x, bits):
    """An operand as the kernel's products take it: tf32 (10 bits) truncated, as Triton's tf32 dot
    does on Hopper (docs/validation.md, run 35); other widths rounded to nearest."""
    return truncate_significand(x, bits) if bits == 10 else round_significand(x, bits)


def emulated_readout(G, M, Cv, zq, *, scale, K, eta, gamma, operand_bits=23, broken=None):
    """``kernels.koopman_readout``'s algorithm in plain torch, float32 (kernels/koopman.py):
    ``G~ = L L^T``, ``X = L^{-1}`` by substitution on I, ``A_w = X M X^T``, 6 power steps,
    ``A' = gamma A_w / max(1, sigma)``, ``F = eta C_v X^T A'^K``, ``y = F X zq / m``; the
    operands of every product rounded to ``operand_bits`` significand bits (10: tf32).

    ``broken``: ``"scaled"`` (y x 0.9), ``"scaled_099"`` (y x 0.99), ``"eta_sign"`` (-eta),
    ``"k_minus_one"`` / ``"k_plus_one"`` (K -+ 1 powers), ``"eta_of_first_system"`` (every system
    scaled by the first system's eta: a stride slip), ``"unnormalised"`` (``A' = gamma A_w``,
    eq. (12) left out)."""
    if broken not in (None, "scaled_099", *BROKEN):
        raise ValueError(f"broken must be None or one of {BROKEN}, got {broken!r}")

    def mm(a, b):
        return _cut(a, operand_bits) @ _cut(b, operand_bits)

    G, M, Cv, zq = (x.to(torch.float32) for x in (G, M, Cv, zq))
    batch, r = G.shape[:-2], G.shape[-1]
    eye = torch.eye(r, dtype=torch.float32).expand_as(G)
    X = torch.linalg.solve_triangular(torch.linalg.cholesky(G), eye, upper=False)
    A_w = mm(mm(X, M), X.mT)
    g = torch.broadcast_to(torch.as_tensor(gamma, dtype=torch.float32), batch)
    factor = g if broken == "unnormalised" else g / solvers.power_sigma_max(A_w).clamp(min=1.0)
    A = A_w * factor[..., None, None]
    F = mm(Cv, X.mT)
    powers = {"k_minus_one": max(K - 1, 0), "k_plus_one": K + 1}.get(broken, K)
    for _ in range(powers):
        F = mm(F, A)
    e = torch.broadcast_to(torch.as_tensor(eta, dtype=torch.float32), batch)
    if broken == "eta_of_first_system":
        e = torch.full_like(e, float(e.reshape(-1)[0]))
    if broken == "eta_sign":
        e = -e
    F = F * e[..., None, None]
    inv = 1.0 / torch.broadcast_to(torch.as_tensor(scale, dtype=torch.float32), batch)
    y = mm(mm(zq * inv[..., None, None], X.mT), F.mT)
    return {"scaled": 0.9, "scaled_099": 0.99}.get(broken, 1.0) * y


def _emulation(**kw):
    def readout(*args, **options):
        return emulated_readout(*args, **options, **kw)

    readout.__qualname__ = f"emulated_readout({', '.join(f'{k}={v!r}' for k, v in kw.items())})"
    return readout


def scaled_kernel(G, M, Cv, zq, **options):
    """The kernel with its output x 0.9."""
    return 0.9 * ks.koopman_kernel(G, M, Cv, zq, **options)


def _check(kernel, model="float32", precision="float32", device="cpu", **kw):
    return harness.check(
        kernel,
        ks.koopman_reference,
        harness.koopman(precision=harness.PRECISIONS[precision], device=device),
        precision=precision,
        model=model,
        device=device,
        seed=SEED,
        examples=kw.pop("examples", CI_EXAMPLES),
        **kw,
    )


# ----------------------------------------------------------------------------- correct readouts


@needs_triton_device
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_kernel_passes_under_float32(precision):
    # float32 arithmetic on float32 or bf16 statistics (widened exactly): kernels/koopman.py
    rep = _check(ks.koopman_kernel, precision=precision, device=DEVICE)
    assert rep.verdict == harness.PASS and rep.examples == CI_EXAMPLES, str(rep)


def test_reference_and_emulation_pass_under_float32():
    for kernel in (ks.koopman_reference, _emulation()):
        rep = _check(kernel)
        assert rep.verdict == harness.PASS and rep.examples == CI_EXAMPLES, str(rep)


def test_tf32_emulation_is_never_beyond_the_tf32_bound():
    # tf32 operands (2^-10) make the bound vacuous wherever 8 (K + 2) kappa(G~) u_tf32 S_q
    # reaches ||y||: INCONCLUSIVE there is the harness's answer; never FAIL
    rep = _check(_emulation(operand_bits=10), model="tf32")
    # the bound itself: measured / bound <= 1 on every finding (readout_bound is a proof, so the
    # only derived threshold is 1; the former "max ratio < 0.5" was the margin asked of the
    # first-order model this bound replaced, and a proof implies no margin: the 250 drawn cases
    # of docs/harness.md reach 0.53 of the kernel's bound)
    assert rep.verdict != harness.FAIL, str(rep)
    # not a tolerance: "never FAIL" says something only where the bound is conclusive (an inf
    # bound gives ratio 0): some findings have a bound below ||y|| and a nonzero error within
    # it (seed 0, 12 cases: 5 conclusive, worst ratio 0.36)
    conclusive = [f for f in rep.history if not f.vacuous and math.isfinite(f.bound)]
    assert conclusive and max(f.ratio for f in conclusive) > 0.0, str(rep)
    # and the tf32 bound can fail: the same emulation with y x 0.9 FAILs under it
    broken = _check(_emulation(operand_bits=10, broken="scaled"), model="tf32", shrink=False)
    assert broken.verdict == harness.FAIL and broken.failure.ratio > 1.0, str(broken)


def test_on_statistics_wraps_a_stats_readout():
    case = harness.koopman_case(T=40, r=5, P=3, Q=2, batch=(2,), K=2, eta=(1.5, -0.5), seed=3)
    x = {k: v.to(torch.float32) for k, v in case.inputs.items()}
    wrapped = ks.on_statistics(solvers.koopman_readout)
    assert torch.equal(
        wrapped(*x.values(), **case.options), ks.koopman_reference(*x.values(), **case.options)
    )
    assert "koopman_readout" in wrapped.__qualname__
    with pytest.raises(TypeError, match="readout must be a callable"):
        ks.on_statistics("solvers:koopman_readout")


# ----------------------------------------------------------------------------- broken readouts


@pytest.mark.parametrize("broken", BROKEN)
def test_broken_readouts_fail(broken):
    rep = _check(_emulation(broken=broken), shrink=False)
    assert rep.verdict == harness.FAIL, f"{broken} not caught:\n{rep}"
    # far beyond the bound, not at its edge
    assert rep.failure.ratio > 10.0, str(rep)


def test_one_percent_scaling_fails():
    # the bound is below 1% of ||y|| on most float32 cases, so y x 0.99 is caught
    rep = _check(_emulation(broken="scaled_099"), shrink=False)
    assert rep.verdict == harness.FAIL and rep.failure.ratio > 1.0, str(rep)


@needs_triton_device
def test_scaled_kernel_fails():
    rep = _check(scaled_kernel, device=DEVICE, shrink=False)
    assert rep.verdict == harness.FAIL and rep.failure.ratio > 10.0, str(rep)
    assert "from analysis.testing.harness import koopman_case" in rep.failure.snippet


def test_failing_case_is_rebuilt_by_its_snippet():
    rep = _check(_emulation(broken="scaled"), shrink=False)
    scope = {}
    exec(rep.failure.snippet, scope)  # noqa: S102 - the harness's own rebuild snippet
    again = harness.run_case(
        _emulation(broken="scaled"),
        ks.koopman_reference,
        harness.koopman(precision=torch.float32),
        scope["case"],
        precision="float32",
        model="float32",
        device="cpu",
    )
    assert scope["case"].label == rep.failure.case
    assert math.isclose(again[0].ratio, rep.failure.ratio, rel_tol=1e-12)


# ----------------------------------------------------------------------------- the bound


def _drawn(precision=torch.float32, examples=3 * CI_EXAMPLES):
    """The cases the strategy draws with seed 0, recorded by its builder."""
    seen = []

    def build(**kw):
        seen.append(harness.koopman_case(**kw))
        return seen[-1]

    def reference_on_float32(*args, **options):
        # the reference on the float32 copies of the (possibly bf16) inputs: the same readout
        # as the harness's reference, so nothing can FAIL while the cases are recorded
        return ks.koopman_reference(*(a.to(torch.float32) for a in args), **options)

    strategy = harness.Strategy(**ks.koopman_strategy(build, precision=precision))
    rep = harness.check(
        reference_on_float32,
        ks.koopman_reference,
        strategy,
        precision=precision,
        device="cpu",
        seed=SEED,
        examples=examples,
    )
    assert rep.verdict != harness.FAIL, str(rep)
    return seen


def _quantiles(x):
    t = torch.tensor(x, dtype=F64)
    return [float(torch.quantile(t, q)) for q in (0.5, 0.9, 1.0)]


def _tightness(precision=torch.float32):
    """On 36 drawn cases: bound / ||y|| per contract (the harness's applied bound, kernel's plus
    reference's, against the size its vacuity test uses: the system's largest query output) and
    measured / bound for the kernel's algorithm emulated with float32 and tf32 operands
    (``algorithm="inverse"``) and for ``solvers.koopman_readout`` in float32 (``"solves"``), each
    against the exact readout (float64 on the same statistics)."""
    size = {"float32": [], "tf32": [], "r": []}
    meas = {"float32": [], "tf32": [], "reference": []}
    for case in _drawn(precision):
        x = {k: v.to(precision).to(torch.float32) for k, v in case.inputs.items()}
        x64 = [v.to(F64) for v in x.values()]
        o = case.options
        size["r"].append(x["G"].shape[-1])
        exact = ks.koopman_reference(*x64, **o)
        norm = exact.norm(dim=-1).amax(-1, keepdim=True)
        B_ref = ks.readout_bound(*x64, contract="float32", algorithm="solves", **o)
        y = ks.koopman_reference(*x.values(), **o).to(F64)
        meas["reference"].append(float(((y - exact).norm(dim=-1) / B_ref).max()))
        for contract, bits in (("float32", 23), ("tf32", 10)):
            y = emulated_readout(*x.values(), **o, operand_bits=bits).to(F64)
            B = ks.readout_bound(*x64, contract=contract, algorithm="inverse", **o)
            meas[contract].append(float(((y - exact).norm(dim=-1) / B).max()))
            (applied,) = ks.koopman_scales(case, dict(zip(x, x64)), contract)
            size[contract].append(float((applied / norm).max()))
    return size, meas


@pytest.mark.parametrize("precision", [torch.float32, torch.bfloat16])
def test_bound_is_conclusive_and_holds(precision):
    size, meas = _tightness(precision)
    r = size.pop("r")
    q = {c: _quantiles(v) for c, v in (size | {"m_" + k: v for k, v in meas.items()}).items()}
    # a proof: no correct readout beyond it, and not 1e6 times below it everywhere
    for c in meas:
        assert q["m_" + c][2] < 1.0 and q["m_" + c][2] > 1e-3, q
    # float32: conclusive everywhere, a few percent of ||y|| on half the cases
    assert q["float32"][0] < 0.05 and q["float32"][2] < 1.0, q
    # tf32: vacuous (INCONCLUSIVE runs, docs/harness.md) on about half of the cases (49% of 250
    # drawn, 83% of these 36): the worst case of 2^-10 operand roundings in X M X^T,
    # th || |X||M||X|^T ||, reaches ||A_w|| from r of about 13 (r = 64: 78 of 92 vacuous); at
    # r <= 8 it is a check on most cases (5 of 73 vacuous over the 250)
    small = [s for s, n in zip(size["tf32"], r) if n <= 8]
    assert small and sum(s >= 1.0 for s in small) / len(small) < 0.5, (small, q)


def _emulated_steps(x, bits, broken=None):
    """The kernel's algorithm's intermediate results (``emulated_readout``): the float32 factor
    L^, X^ = L^{-1} by substitution, A^_w = fl(fl(X^ M) X^T) with operands rounded to ``bits``,
    its power estimate; ``broken="transposed_m"``: A^_w from M^T (a plausible indexing slip)."""
    G, M = x["G"], x["M"].mT if broken == "transposed_m" else x["M"]
    L = torch.linalg.cholesky(G)
    X = torch.linalg.solve_triangular(L, torch.eye(G.shape[-1]).expand_as(G), upper=False)

    def mm(a, b):
        return _cut(a, bits) @ _cut(b, bits)

    A_w = mm(mm(X, M), X.mT)
    return L.to(F64), X.to(F64), A_w.to(F64), solvers.power_sigma_max(A_w).to(F64)


@pytest.mark.parametrize("contract,bits", [("float32", 23), ("tf32", 10), ("bfloat16/operands", 7)])
def test_each_step_of_the_proof_holds(contract, bits):
    # every intermediate bound of readout_bound (module docstring, steps 1-4) holds for the
    # kernel's algorithm emulated under the contract, wherever the proof's conditions hold;
    # A_w from M^T (a broken whitening) leaves the whitened operator's bound on some case
    used, caught = {}, False
    for case in _drawn(examples=CI_EXAMPLES):
        x = {k: v.to(torch.float32) for k, v in case.inputs.items()}
        x64 = [v.to(F64) for v in x.values()]
        _, st = ks.readout_bound(
            *x64, contract=contract, algorithm="inverse", return_steps=True, **case.options
        )
        ok = st["valid"]
        if not bool(ok.any()):
            continue
        G64, M64 = x64[0], x64[1]
        L = torch.linalg.cholesky(G64)
        X = torch.linalg.solve_triangular(L, torch.eye(L.shape[-1], dtype=F64), upper=False)
        Lh, Xh, Aw_h, sig_h = _emulated_steps(x, bits)
        A_w = X @ M64 @ X.mT
        checks = {
            "eps": torch.linalg.matrix_norm(X @ (Lh @ Lh.mT - G64) @ X.mT) / st["eps"],
            "phi": torch.linalg.matrix_norm(Xh @ L - torch.eye(L.shape[-1], dtype=F64)) / st["phi"],
            "dw": torch.linalg.matrix_norm(Aw_h - A_w) / st["dw"],
            "hi": sig_h / st["hi"],
            "lo": st["lo"] / sig_h,
        }
        for k, v in checks.items():
            used[k] = max(used.get(k, 0.0), float(v[ok].max()))
        _, _, Aw_b, _ = _emulated_steps(x, bits, broken="transposed_m")
        caught |= bool((torch.linalg.matrix_norm(Aw_b - A_w) > st["dw"])[ok].any())
    assert used and max(used.values()) <= 1.0, used
    assert caught


def test_float32_bound_is_exceeded_by_a_tf32_readout():
    # the bound is no larger than it must be: tf32 operands (2^-10) break the float32 bound
    worst = 0.0
    for case in _drawn(examples=CI_EXAMPLES):
        x = {k: v.to(torch.float32) for k, v in case.inputs.items()}
        x64 = [v.to(F64) for v in x.values()]
        exact = ks.koopman_reference(*x64, **case.options)
        y = emulated_readout(*x.values(), **case.options, operand_bits=10).to(F64)
        B = ks.readout_bound(*x64, contract="float32", **case.options)
        worst = max(worst, float(((y - exact).norm(dim=-1) / B).max()))
    assert worst > 1.0, worst


def test_model_bound_is_kept_as_an_option():
    # bound="model": the first-order model of the earlier strategy, same cases
    strategy = harness.koopman(precision=torch.float32, bound="model")
    assert "first-order model" in strategy.doc
    rep = harness.check(
        ks.koopman_reference,
        ks.koopman_reference,
        strategy,
        precision="float32",
        device="cpu",
        seed=SEED,
        examples=4,
    )
    assert rep.verdict == harness.PASS, str(rep)
    case = harness.koopman_case(T=40, r=5, P=3, Q=2, K=2, seed=3)
    x = [v.to(torch.float32).to(F64) for v in case.inputs.values()]
    S, _ = ks.readout_terms(*x, **case.options)
    assert bool((ks.model_bound(*x, contract="float32", **case.options) <= S).all())


def test_failed_conditions_give_an_infinite_bound():
    # bf16 operands in the factorisation: eps = ||X dG X^T||_F reaches 1/2 at r = 64, the
    # Neumann bounds do not apply and the case is INCONCLUSIVE (inf), not PASS
    case = harness.koopman_case(T=256, r=64, P=3, Q=2, dyn=0.8, K=2, seed=0, precision=F32)
    x = [v.to(torch.float32).to(F64) for v in case.inputs.values()]
    kw = dict(contract="float32", **case.options)
    assert bool(torch.isfinite(ks.readout_bound(*x, **kw)).all())
    B = ks.readout_bound(*x, factor_contract="bfloat16/operands", **kw)
    assert bool(torch.isinf(B).all())
    with pytest.raises(ValueError, match="algorithm must be"):
        ks.readout_bound(*x, algorithm="lu", **kw)


def test_scale_bounds_the_readout():
    # S_q >= ||y_q||: every term of the bound is a multiple of it
    for case in _drawn(examples=CI_EXAMPLES):
        x = {k: v.to(F64) for k, v in case.inputs.items()}
        o = case.options
        S, kappa = ks.readout_terms(*x.values(), **o)
        y = ks.koopman_reference(*x.values(), **o).norm(dim=-1)
        assert bool((y <= S * (1 + 1e-12)).all()) and bool((kappa >= 1).all())


def test_indefinite_statistics_give_an_infinite_bound():
    case = harness.koopman_case(T=20, r=3, P=2, Q=1, seed=1)
    x = {k: v.clone() for k, v in case.inputs.items()}
    x["G"] = -x["G"]
    B = ks.readout_bound(*x.values(), contract="float32", **case.options)
    assert bool(torch.isinf(B).all())


# ----------------------------------------------------------------------------- options and CLI


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(max_r=65), "max_r must be at most 64"),
        (dict(max_P=0), "max_P must be >= 1"),
        (dict(gains=()), "gains must be a non-empty tuple"),
        (dict(max_K=-1), "max_K must be >= 0"),
        (dict(pow2="yes"), "pow2 must be a bool"),
        (dict(precision=torch.float64), "precision must be torch.float32 or torch.bfloat16"),
        (dict(bound="first-order"), "bound must be 'proof' or 'model'"),
    ],
)
def test_bad_strategy_options_are_named(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        harness.koopman(**kw)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(eta=3.0), r"\|eta\| must lie in \[0.25, 2.0\]"),
        (dict(gamma=0.5), r"gamma must lie in \[1.0, 1.5\]"),
        (dict(batch=(2,), eta=(1.0,)), "eta must be a float or 2 floats"),
        (dict(batch=(), gamma=(1.0,)), "gamma must be a float or 1 floats|per-system eta or gamma"),
        (dict(dyn=1.0), r"dyn must lie in \[0, 1\)"),
        (dict(batch=(1, 2)), r"batch must be \(\) or \(n,\)"),
        (dict(r=0), "r must be >= 1"),
    ],
)
def test_bad_case_arguments_are_named(kw, match):
    args = dict(T=20, r=3, P=2, Q=1) | kw
    with pytest.raises(ValueError, match=match):
        ks.koopman_problem(**args)


def test_ill_conditioned_statistics_are_refused():
    # T < r: G~ = eps I + a rank-T sum, kappa ~ lambda_max / eps, beyond Higham Thm 10.7 in bf16
    with pytest.raises(ValueError, match="not safely factorable"):
        ks.koopman_problem(4, 16, 2, 1, dyn=0.9, precision=torch.bfloat16)


def test_pow2_draws_powers_of_two():
    seen = []

    def build(**kw):
        seen.append(kw)
        return harness.koopman_case(**kw)

    strategy = harness.Strategy(**ks.koopman_strategy(build, pow2=True, max_r=16))
    harness.check(
        ks.koopman_reference,
        ks.koopman_reference,
        strategy,
        precision="bfloat16",
        device="cpu",
        seed=SEED,
        examples=8,
    )
    assert seen and all(kw["r"] in (1, 2, 4, 8, 16) and kw["P"] in (4, 8, 16) for kw in seen)


def test_cli_runs_the_koopman_strategy():
    cmd = [
        sys.executable,
        "-m",
        "analysis.testing.harness",
        "analysis.testing.koopman_strategy:koopman_reference",
        "analysis.testing.koopman_strategy:koopman_reference",
        "--strategy",
        "koopman",
        "--precision",
        "float32",
        "--examples",
        "3",
        "--seed",
        "0",
        "--device",
        "cpu",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "strategy koopman" in out.stdout and "PASS" in out.stdout
