"""Figures: every module writes its files on a tiny problem, the cache works, and the numeric
cores behind the paper tables hold against the printed values (with broken variants)."""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch
from allocation_support import LargestAllocation

import solvers
from analysis.bounds import iterative as bounds
from analysis.figures import (
    FIGURES,
    decay_gates,
    echo_koopman,
    gka_fig1a,
    gka_fig1bd,
    gka_fig5,
    gka_omega,
    kla_kaczmarz,
    precision_sweep,
)
from analysis.figures import _common as C
from analysis.figures._cg_reversal import cg_coefficients
from analysis.precision import PRECISIONS, gamma, rounding_allowance

U64 = 2.0**-53


def _run(name, out_dir, recompute=True):
    mod = importlib.import_module(f"analysis.figures.{name}")
    return mod.run(out_dir, quick=True, recompute=recompute, overrides=mod.TINY)


@pytest.mark.parametrize("name", FIGURES)
def test_figure_writes_its_files(name, tmp_path):
    mod = importlib.import_module(f"analysis.figures.{name}")
    assert isinstance(mod.NAME, str) and isinstance(mod.HELP, str) and mod.HELP
    files = _run(name, tmp_path)
    suffixes = {f.suffix for f in files}
    assert {".png", ".svg", ".csv", ".json"} <= suffixes, suffixes
    for f in files:
        assert f.exists() and f.stat().st_size > 0, f
    assert (tmp_path / f"{mod.NAME}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stamp = json.loads((tmp_path / f"{mod.NAME}.json").read_text())["provenance"]
    assert {"commit", "device", "torch", "date"} <= set(stamp["data"]) and stamp["data"]["commit"]
    assert (
        "data: " in (tmp_path / f"{mod.NAME}.svg").read_text()
    )  # the footer names what produced it


def test_cache_skips_recomputation_until_recompute(tmp_path, monkeypatch):
    first = _run("gka_omega", tmp_path)

    def refuse(params):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(gka_omega, "compute", refuse)
    assert _run("gka_omega", tmp_path, recompute=False) == first
    with pytest.raises(AssertionError, match="recomputed"):
        _run("gka_omega", tmp_path, recompute=True)


def test_cache_rerenders_missing_files_without_recomputing(tmp_path, monkeypatch):
    files = _run("gka_omega", tmp_path)
    files[0].unlink()
    monkeypatch.setattr(gka_omega, "compute", lambda params: pytest.fail("recomputed"))
    assert _run("gka_omega", tmp_path, recompute=False)[0].exists()


def test_cache_key_changes_with_params():
    assert C.cache_key({"a": 1}, gka_omega.__file__) != C.cache_key({"a": 2}, gka_omega.__file__)


# --- the paper-table helper ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,printed,ok",
    [
        (0.72533, "0.7253", True),
        (0.72536, "0.7253", False),
        (6.547e-5, "6e-5", False),
        (6.547e-5, "6.5e-5", True),
        (0.2008, "0.2", True),
        (0.0597, "0.0597", True),
        (0.26, "0.2", False),
        # decided exactly (Fraction), no tolerance: a tie agrees, one ulp past it does not
        # (the former margin of 1e-12 took 150 + 1 ulp for 1e2)
        (150.0, "1e2", True),
        (math.nextafter(150.0, math.inf), "1e2", False),
        (0.0625, "0.063", True),
        (math.nextafter(0.0625, 0.0), "0.063", False),
        (float("nan"), "0.5", False),
    ],
)
def test_rounds_to_uses_the_printed_last_digit(value, printed, ok):
    assert C.rounds_to(value, printed) is ok


# --- Remark 1 (GKA appendix D.1) --------------------------------------------------------------


def test_remark1_printed_values_hold_except_r30():
    table = gka_omega.remark1_table()
    for n, (pr, pra) in gka_omega.REMARK1_PRINTED.items():
        r, ra = table[n]
        assert C.rounds_to(ra, pra), (n, ra, pra)
        if n != 30:
            assert C.rounds_to(r, pr), (n, r, pr)


def test_remark1_r30_printed_is_truncated_erratum():
    # docs/errata.md "GKA appendix D.1, Remark 1": printed 6e-5 fails, corrected 6.5e-5 holds
    r30 = gka_omega.remark1_table()[30][0]
    assert not C.rounds_to(r30, gka_omega.REMARK1_PRINTED[30][0])
    assert C.rounds_to(r30, "6.5e-5")


def test_remark1_check_catches_missing_rho_factor():
    # broken variant: R taken as R_a (dropping (kappa-1)/(kappa+1)) must fail the printed R
    ra = gka_omega.remark1_table()[1][1]
    assert not C.rounds_to(ra, gka_omega.REMARK1_PRINTED[1][0])


def test_remark1_check_catches_wrong_kappa():
    # broken variant: kappa = 1/0.02 = 50 (forgetting the +a in L) must fail the printed R
    assert not C.rounds_to(gka_omega.remark1_table(kappa=50)[1][0], "0.7253")


# --- Lemma 3/4: the omega schedule --------------------------------------------------------------


@pytest.mark.parametrize("kappa", [2, 11, 51, 1001])
def test_lemma4_bound_holds_and_rate_tends_to_ra_squared(kappa):
    w, star = gka_omega.exact_schedule(kappa, 60)
    gaps = [float(x - star) for x in w]
    bound = bounds.omega_gap_bound(kappa, torch.arange(61)).tolist()
    # Lemma 4 with exact gaps (50 digits); the bound R^i (2 - omega_1*) is a float64 evaluation of
    # i + 6 operations, relative error <= (i + 6) u_64
    assert all(g <= b * (1 + (i + 6) * 2.0**-53) for i, (g, b) in enumerate(zip(gaps, bound)))
    ra2 = float(bounds.contraction_rate(kappa)) ** 2
    # ratio_i = rho^2 omega_1* omega_i / 4 -> R_a^2, with error rho^2 omega_1* gap_i / 4 <= gap_i;
    # measured where the gap is still far above the 50-digit resolution; ra2 itself is a float64
    # evaluation of a few operations (<= 8 u_64 relative)
    i = max(j for j, g in enumerate(gaps) if g > 1e-30)
    assert abs(gaps[i] / gaps[i - 1] - ra2) <= gaps[i - 1] + 8 * 2.0**-53 * ra2


def test_lemma4_check_catches_a_too_fast_rate():
    # broken variant: claiming rate 0.99 R_a^2 must be violated by the exact gaps
    w, star = gka_omega.exact_schedule(51, 40)
    ra2 = float(bounds.contraction_rate(51)) ** 2
    gaps = [float(x - star) for x in w]
    assert any(g > (0.99 * ra2) ** i * gaps[0] for i, g in enumerate(gaps))


def _remark2_tolerance(kappa: float) -> float:
    """Relative float64 error of omega_1* - 1 against R_a^2 (first order, Higham's u): rho =
    (k - 1)/(k + 1) carries 3u, rho^2 7u; 1 - rho^2 amplifies that by rho^2/(1 - rho^2) and the
    sqrt halves it, 1 + s damps it by s/(1 + s) (s = sqrt(1 - rho^2)); 2/(1 + s) adds 4u. Then
    omega_1* - 1 (exact: Sterbenz) divides by R_a^2 = omega_1* - 1 (a factor omega_1*/(omega_1* - 1),
    99 at kappa = 1.5), and R_a^2 itself is 5 roundings squared: 11u. Measured <= 0.43 of it
    (104u at kappa = 1.5; the old tolerance, 1e-12 = 9000u, was called "a few ulps")."""
    rho = (kappa - 1.0) / (kappa + 1.0)
    s = math.sqrt(1.0 - rho**2)
    ws = 2.0 / (1.0 + s)
    d_ws = 7 * U64 * rho**2 / (2 * s * (1 + s)) + 4 * U64
    return d_ws * ws / (ws - 1.0) + 11 * U64


@pytest.mark.parametrize("kappa", [1.5, 10.0, 51.0, 1e4])
def test_remark2_divisor_lower_end_is_ra_squared(kappa):
    lower = float(bounds.omega_star(bounds.rho(kappa, 1.0))) - 1.0
    # identity omega_1* - 1 = R_a^2, to the evaluation error of both sides
    ra2 = float(bounds.contraction_rate(kappa)) ** 2
    assert math.isclose(lower, ra2, rel_tol=_remark2_tolerance(kappa), abs_tol=0.0)
    # the check can fail: R_a (not squared) is not the lower end
    ra = float(bounds.contraction_rate(kappa))
    assert not math.isclose(lower, ra, rel_tol=_remark2_tolerance(kappa), abs_tol=0.0)


def test_computed_schedule_is_the_solvers():
    w = gka_omega._computed_schedule(51.0, 10, PRECISIONS[0])
    assert torch.equal(w, solvers.chebyshev_weights(51.0, 1.0, 10))


# --- CG replay behind Fig. 5b --------------------------------------------------------------------


@pytest.mark.parametrize("arith", PRECISIONS, ids=lambda a: a.label)
def test_cg_coefficients_are_the_solvers_scalars(arith):
    """alpha_0 = q^T q / q^T H q exactly in exact arithmetic (x_1 = alpha_0 q); the recorded
    value, computed in the compute dtype, agrees to the rounding of two dot products and a
    division: |rel| <= (2 n + 1) u_acc + u_store (Higham (3.5); the store rounds q)."""
    P = solvers.fig1a_problems(1, 12, 1, 8, a=0.02, seed=1)
    A, q = P.A.reshape(-1, 8, 8).to(arith.dtype), P.q.reshape(-1, 8).to(arith.dtype)
    c = cg_coefficients(A, q, iters=15, bf16_mode=arith.mode)
    A64, q64 = A.double(), q.double()
    alpha0 = (q64 * q64).sum(-1) / (q64 * (A64 @ q64.unsqueeze(-1)).squeeze(-1)).sum(-1)
    rel = ((c.alpha[0].double() - alpha0) / alpha0).abs()
    assert float(rel.max()) <= (2 * 8 + 1) * arith.u_acc + arith.u_store
    ok = torch.isfinite(c.beta)
    assert bool((c.beta[ok] >= 0).all())  # beta_i = ||r_{i+1}||^2 / ||r_i||^2
    assert c.three_term_divisor().shape[0] == 14


def test_cg_alpha_check_detects_a_wrong_step():
    # broken variant: a CG whose first step were 2 alpha_0 must fail the closed-form check
    P = solvers.fig1a_problems(1, 12, 1, 8, a=0.02, seed=1)
    A, q = P.A.reshape(-1, 8, 8), P.q.reshape(-1, 8)
    c = cg_coefficients(A, q, iters=3)
    alpha0 = (q * q).sum(-1) / (q * (A @ q.unsqueeze(-1)).squeeze(-1)).sum(-1)
    assert float(((2 * c.alpha[0] - alpha0) / alpha0).abs().max()) > 0.5


# --- Fig. 1a helpers ------------------------------------------------------------------------------


def test_crossover_is_where_ch_catches_up_after_cg_leads():
    assert gka_fig1a.crossover([1, 0.5, 0.4, 0.1], [1, 0.6, 0.2, 0.2]) == 3
    assert gka_fig1a.crossover([1, 0.5, 0.4], [1, 0.6, 0.5]) == -1  # CG never leads


def test_fig1a_paper_table_is_in_the_json(tmp_path):
    _run("gka_fig1a", tmp_path)
    meta = json.loads((tmp_path / "gka_fig1a.json").read_text())
    assert {r["paper"] for r in meta["paper"]} >= {"CG", "10", "CH"}


# --- KLA Prop. 2 (eq. (5)) as measured by the figure ---------------------------------------------


def _kla_inputs():
    g = torch.Generator().manual_seed(3)
    S0 = torch.randn(6, 3, generator=g, dtype=torch.float64)
    k = torch.randn(6, generator=g, dtype=torch.float64)
    return S0, k / torch.linalg.vector_norm(k), torch.randn(3, generator=g, dtype=torch.float64)


@pytest.mark.parametrize(
    "eta,knorm,eps", [(0.5, 0.01, 1e-4), (1.0, 1.0, 0.0), (1.9, 3.0, 1e-6), (0.2, 1e-3, 1e-6)]
)
def test_kla_one_step_factor_is_eq5(eta, knorm, eps):
    S0, d, v = _kla_inputs()
    m = kla_kaczmarz.one_step_factor(S0, d * knorm, v, eta, eps, "kaczmarz", PRECISIONS[0])
    # eq. (5) is an identity: only the float64 evaluation separates the two
    tol = _eq5_tolerance(S0, d * knorm, v, eta, eps, m)
    assert abs(m - kla_kaczmarz.prop2_factor(eta, knorm, eps)) <= tol


def _eq5_tolerance(S0, k, v, eta, eps, m) -> float:
    """|m_hat - m| for m = ||v - S_1^T k|| / ||e||, e = v - S_0^T k, S_1 = S_0 + beta k e^T, in
    float64 (Higham's gamma_n, d_k = 6, componentwise): e within gamma_{d_k+1} c, c = |v| + |S_0|^T|k|;
    S_1 within gamma_{d_k+4} (|S_0| + beta |k| c^T) (beta 3 roundings, the outer product, the sum),
    so |S_1 - S_1_hat|^T |k| <= gamma_{d_k+4} (|S_0|^T|k| + beta ||k||^2 c); e+ adds
    gamma_{d_k+1} (|v| + |S_1|^T |k|); the norms and the division 3u m. The formula's own
    evaluation (5 roundings on terms <= 1 + eta) and ||k||^2 = knorm^2 (1 + gamma_{d_k+2}) (moving
    the factor by <= eta gamma_{d_k+2}): gamma_{d_k+5} (1 + 2 eta). At most 2e-14 here (the old 1e-12 was 50 times that)."""
    dk, u = k.numel(), U64
    B = S0.abs().T @ k.abs()
    c = v.abs() + B
    e = v - S0.T @ k
    k2 = float(k @ k)
    beta = eta / (k2 + eps)
    dS = gamma(dk + 4, u) * (B + beta * k2 * c)
    e_plus = gamma(dk + 1, u) * (v.abs() + B + beta * k2 * e.abs()) + dS
    e_err = gamma(dk + 1, u) * c
    measured = (float(e_plus.norm()) + m * float(e_err.norm())) / float(e.norm()) + 3 * u * m
    return measured + gamma(dk + 5, u) * (1 + 2 * eta)


def test_kla_factor_check_catches_the_gdn_coefficient():
    # broken variant: GDN's beta = eta does not follow eq. (5) at ||k|| != 1
    S0, d, v = _kla_inputs()
    m = kla_kaczmarz.one_step_factor(S0, d * 3.0, v, 0.5, 1e-6, "gdn", PRECISIONS[0])
    tol = _eq5_tolerance(S0, d * 3.0, v, 0.5, 1e-6, m)
    assert abs(m - kla_kaczmarz.prop2_factor(0.5, 3.0, 1e-6)) > tol


# --- Echo App. D.1 -------------------------------------------------------------------------------


def test_d1_tables_round_to_printed():
    for K, table in echo_koopman.D1_TABLE.items():
        for lam, printed in table.items():
            assert C.rounds_to(lam**K, printed), (K, lam, printed)


def test_d1_table_check_catches_a_wrong_power():
    # broken variant: |lambda|^3 instead of |lambda|^2 fails the K = 2 table
    assert not all(C.rounds_to(lam**3, p) for lam, p in echo_koopman.D1_TABLE[2].items())


def test_mode_gain_on_a_known_operator():
    A = torch.tensor(
        [[0.9, 0.5], [0.0, 0.3]], dtype=torch.float64
    )  # non-normal, eigenvalues 0.9, 0.3
    lam, gain = echo_koopman.mode_gains(A.unsqueeze(0), 2)
    # A^2 v = lambda^2 v for each eigenvector: gain = |lambda|^2 to eig's accuracy. ||A||_2 = 1.07,
    # both eigenvalues have condition 1/|y^H x| = 1.30, gap 0.6; LAPACK's backward error
    # p(n) u ||A|| with p(2) = 2: |lambda_hat| within 1.3 * 2u * 1.07 = 2.8u, its square
    # 2 * 0.9 * 2.8u + u = 6u; the eigenvector within 1.3 * 2u * 1.07 / 0.6 = 4.6u, moving
    # ||A^2 v|| / ||v|| by (||A^2|| + |lambda|^2) 4.6u = 9u; two complex 2-term products 5u, the
    # norms and the division 3u: 23u absolute (measured 0.125u)
    assert torch.allclose(gain, lam**2, rtol=0, atol=23 * U64)
    # the check can fail: the gain of A^3 is not |lambda|^2
    _, gain3 = echo_koopman.mode_gains(A.unsqueeze(0), 3)
    assert not torch.allclose(gain3, lam**2, rtol=0, atol=23 * U64)


# --- gate proposal worked example -----------------------------------------------------------------


def test_gate_numbers_hold_except_the_100x():
    p = decay_gates.paper_numbers()
    assert C.rounds_to(p["sigma'(4.6)"], "0.01") and C.rounds_to(p["phi'(10)"], "0.002")
    # 2 a z / (a z^2 + b)^2 at a = b = z = 1 is 2/4: every operation exact, no tolerance
    assert p["phi'(1)"] == 0.5
    # sigma'(0)/sigma'(4.6) = 0.25 / (sigma(4.6) sigma(-4.6)) ~ 25.4: the printed "100x" fails
    assert 25 < p["sigmoid ratio"] < 26
    assert not C.rounds_to(p["sigmoid ratio"], "1e2")


# --- Fig. 1b/1d: Lemma 2 ---------------------------------------------------------------------------


def _layer_inputs():
    params = {**gka_fig1bd.params_for(True), **gka_fig1bd.TINY}
    return params, gka_fig1bd.make_case(params)


def test_lemma2_chebyshev_implicit_dq_is_autograd_dq():
    params, (q, k, v, g, beta, dy) = _layer_inputs()
    kw = dict(a=params["a"], solver="chebyshev", iters=8, arith=PRECISIONS[0])
    dq_i, _ = gka_fig1bd.implicit_grads(q, k, v, g, beta, dy, **kw)
    dq_a, _ = gka_fig1bd.autograd_grads(q, k, v, g, beta, dy, **kw)
    # Lemma 2: equal in exact arithmetic
    assert float(torch.linalg.vector_norm(dq_i - dq_a) / torch.linalg.vector_norm(dq_a)) <= (
        _lemma2_tolerance(params, q)
    )


def _lemma2_tolerance(params, q) -> float:
    """dq = P(A) dx two ways in float64 (Chebyshev run on dx; autograd's adjoint of the forward
    run): each within the rounding allowance c kappa (D u + u) of the exact value, kappa =
    (1 + a)/a = 51 of Chebyshev's interval (docs/precision.md): 2 A = 8.2e-13 at D = 8
    (measured 1.7e-14; the old 1e-10 was 120 times the bound)."""
    kappa = (1 + params["a"]) / params["a"]
    return 2 * rounding_allowance(kappa, q.shape[-1], PRECISIONS[0])


def test_lemma2_check_fails_for_cg():
    # broken variant: CG is not a fixed polynomial in H, so its implicit dq differs from autograd's
    params, (q, k, v, g, beta, dy) = _layer_inputs()
    kw = dict(a=params["a"], solver="cg", iters=3, arith=PRECISIONS[0])
    dq_i, _ = gka_fig1bd.implicit_grads(q, k, v, g, beta, dy, **kw)
    dq_a, _ = gka_fig1bd.autograd_grads(q, k, v, g, beta, dy, **kw)
    assert float(torch.linalg.vector_norm(dq_i - dq_a) / torch.linalg.vector_norm(dq_a)) > (
        _lemma2_tolerance(params, q)
    )


def test_precision_sweep_crossover_interpolates():
    rows = [{"truncation": 1e-12, "rounding": 1e-8}, {"truncation": 1e-4, "rounding": 1e-8}]
    k = precision_sweep.crossover_kappa([1.0, 100.0], rows)
    assert 1.0 < k < 100.0
    assert math.isnan(precision_sweep.crossover_kappa([1.0], rows[:1]))


def test_stamp_of_redrawn_data_is_the_computing_run_not_the_drawing_one(tmp_path):
    """Re-drawing cached data (the gallery) keeps the provenance of the run that computed it."""
    files = _run("gka_omega", tmp_path)
    cache = json.loads((tmp_path / "_cache" / "gka_omega.json").read_text())
    cache["data"]["provenance"] = {
        **cache["data"]["provenance"],
        "device": "NVIDIA H200",
        "date": "2026-11-22 01:00 UTC",
    }
    out = tmp_path / "redrawn"
    out.mkdir()
    C.render_stamped(gka_omega.render, out, cache["params"], cache["data"])
    stamp = json.loads((out / "gka_omega.json").read_text())["provenance"]
    assert (
        stamp["data"]["device"] == "NVIDIA H200"
        and stamp["drawn"]["date"] != "2026-11-22 01:00 UTC"
    )
    assert "NVIDIA H200" in (out / "gka_omega.svg").read_text() and files


def test_echo_panel_b_marks_each_power_normalised_operator_above_one():
    """Panel (b) of echo_koopman draws operators with ||A^_w|| > 1 in their own series, counted in the legend."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    n = {
        "gap": [0.5, 0.6, 0.7],
        "norm_power": [0.9, 1.2, 1.0],
        "norm_exact": [1.0] * 3,
        "normK2_power": [0.8] * 3,
    }
    echo_koopman._normalisation_panel(ax, n)
    over = [ln.get_ydata().tolist() for ln in ax.lines if ln.get_color() == "tab:red"]
    labels = ax.get_legend_handles_labels()[1]
    plt.close(fig)
    assert over == [[1.2]] and any("1 of 3 operators" in lbl for lbl in labels)


def test_gka_fig5_paper_scale_allocates_at_most_its_systems():
    """The paper-scale run (131072 systems of D = 128, 50 CG steps in each precision) asks for
    at most one float64 copy of its systems (16 GiB) in any one allocation. Every allocation is
    linear in the number of systems N, so the largest at N = 2 and N = 4 (D and the iteration
    count as in the paper) scales to the paper's N; a history that broadcast H along the
    iterations asked for 51 copies (816 GiB, CUDA out of memory on an H200)."""
    paper = gka_fig5.PAPER_SCALE
    D, n_paper = paper["D"], paper["B"] * paper["T"] * paper["heads"]  # 131072 systems
    per_system = []
    for T in (2, 4):
        params = {
            **gka_fig5.params_for(True),
            "scale": {"B": 1, "T": T, "heads": 1, "D": D},
            "kappas": [10.0],
            "device": "cpu",
        }
        with LargestAllocation() as big:
            gka_fig5.compute(params)
        per_system.append(big.nbytes / T)
    assert per_system[0] == per_system[1]  # linear in N, so the extrapolation holds
    systems64 = n_paper * D * D * 8  # fig1a_problems builds them in float64 anyway
    asked = per_system[0] * n_paper
    assert asked <= systems64, f"{asked / 2**30:.1f} GiB in one allocation at paper scale"
