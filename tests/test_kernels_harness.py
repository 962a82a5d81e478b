"""analysis.testing.harness itself: the CLI, the report, the NaN poisoning, the KLA strategy."""

import torch
from kernel_support import DEVICE, needs_triton_device, poisoned_outputs  # noqa: F401

import kernels
import solvers
from analysis.precision import gamma
from analysis.testing import harness

pytestmark = needs_triton_device


def test_poisoned_empty_is_nan_and_restored():
    real = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)
    like = torch.zeros(3)
    with harness.nan_poisoned_empty():
        assert torch.isnan(torch.empty(3)).all() and (torch.empty(2, dtype=torch.int8) == -1).all()
        assert torch.isnan(torch.empty_like(like)).all() and torch.isnan(like.new_empty(2)).all()
        assert torch.isnan(torch.empty_strided((2, 2), (2, 1))).all()
    assert (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty) == real


def doubled(H, q, **kw):
    """A missing factor 1/2: wrong on every nonzero case."""
    return 2 * kernels.chebyshev(H, q, **kw)


def test_cli_passes_a_kernel_and_fails_a_broken_one(capsys):
    args = [
        "--strategy",
        "spd",
        "--precision",
        "bfloat16",
        "--examples",
        "4",
        "--max-d",
        "8",
        "--max-batch",
        "2",
        "--device",
        DEVICE,
    ]
    assert harness.main(["kernels:chebyshev", "solvers:chebyshev", *args]) == 0
    assert "PASS:" in capsys.readouterr().out
    assert (
        harness.main(["test_kernels_harness:doubled", "solvers:chebyshev", *args, "--no-shrink"])
        == 1
    )
    out = capsys.readouterr().out
    assert "FAIL" in out and "first failing case" in out and "ratio" in out


def test_report_names_an_exception():
    def crashes(H, q, **kw):
        raise RuntimeError("kernel launch failed")

    rep = harness.check(
        crashes, solvers.chebyshev, harness.spd(max_d=4, max_batch=1), examples=2, device=DEVICE
    )
    assert rep.verdict == harness.FAIL and "kernel launch failed" in str(rep.failure)


def test_kla_strategy_bounds_the_reference_in_bf16():
    # solvers.kla_chunkwise run in bf16 storage mode is a "kernel" with bf16 intermediates: the
    # bfloat16/storage model's chunkwise bound (plus the float32 reference's) must hold
    strat = harness.kla(max_T=40, dims=(3, 8), chunk_size=8, precision=torch.bfloat16)
    harness.assert_matches(
        solvers.kla_chunkwise,
        solvers.kla_chunkwise,
        strat,
        precision="bfloat16",
        model="bfloat16/storage",
        examples=5,
        device="cpu",
    )


def test_kla_strategy_catches_a_scaled_readout():
    def scaled(q, k, v, **kw):
        o, S = solvers.kla_chunkwise(q, k, v, **kw)
        return o * 1.05, S

    strat = harness.kla(max_T=40, dims=(3, 8), chunk_size=8, precision=torch.bfloat16)
    rep = harness.check(
        scaled,
        solvers.kla_chunkwise,
        strat,
        precision="bfloat16",
        model="bfloat16/storage",
        examples=5,
        device="cpu",
        shrink=False,
    )
    assert not rep.passed


# ------------------------------------------------------------------ usability (CPU, no Triton)

import hypothesis  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given  # noqa: E402

from kernels import emulate  # noqa: E402

CLI = [
    "--strategy",
    "spd",
    "--examples",
    "6",
    "--max-d",
    "4",
    "--max-batch",
    "2",
    "--device",
    "cpu",
    "--seed",
    "0",
]


def half_iterations(H, q, *, L, mu, iters):
    return emulate.chebyshev(H, q, L=L, mu=mu, iters=iters, broken="half")


def wrong_shape(H, q, **kw):
    return q[..., :1]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (
            ["no_such_module_xyz:f", "solvers:chebyshev"],
            "cannot import module 'no_such_module_xyz'",
        ),
        (["solvers:no_such_function", "solvers:chebyshev"], "has no attribute 'no_such_function'"),
        (["solvers.chebyshev", "solvers:chebyshev"], "expected module:function"),
        (
            ["kernels.emulate:chebyshev", "solvers:chebyshev", "--model", "bfloat16/bogus"],
            "unknown contract",
        ),
        (["kernels.emulate:chebyshev", "solvers:chebyshev", "--examples", "0"], "--examples"),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(argv, needle, capsys):
    args = argv + [a for a in CLI if argv.count("--examples") == 0 or a not in ("--examples", "6")]
    with pytest.raises(SystemExit) if "--examples" in argv else _nullcontext() as exc:
        code = harness.main(args)
    code = exc.value.code if "--examples" in argv else code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and needle in err[0], err  # one line, no usage block


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def test_cli_exit_codes_pass_fail_inconclusive(capsys):
    assert (
        harness.main(
            [
                "kernels.emulate:chebyshev",
                "solvers:chebyshev",
                *CLI,
                "--model",
                "bfloat16/operands",
                "--max-kappa",
                "20",
            ]
        )
        == 0
    )
    assert "PASS" in capsys.readouterr().out
    assert (
        harness.main(
            [
                "test_kernels_harness:half_iterations",
                "solvers:chebyshev",
                *CLI,
                "--model",
                "bfloat16/operands",
                "--no-shrink",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "first failing case (not shrunk)" in out and "shrunk counterexample" not in out
    assert "case = spd_case(" in out  # the paste-able snippet
    # CG at r = 0 can only be vacuous: ||x_0 - x*||_A = ||x*||_A
    assert harness.main(
        [
            "kernels.emulate:cg",
            "solvers:cg",
            "--strategy",
            "spd_nobounds",
            "--examples",
            "3",
            "--max-d",
            "4",
            "--device",
            "cpu",
            "--seed",
            "0",
            "--model",
            "bfloat16/operands",
        ]
    ) in (0, 3)


def test_crash_and_wrong_shape_are_findings_with_their_case():
    def crashes(H, q, **kw):
        raise RuntimeError("boom")

    for fn, needle in (
        (crashes, "kernel raised RuntimeError: boom"),
        (wrong_shape, "output 'x': kernel gave"),
    ):
        rep = harness.check(
            fn,
            solvers.chebyshev,
            harness.spd(max_d=4, max_batch=1),
            examples=3,
            device="cpu",
            shrink=False,
            seed=1,
        )
        assert (
            rep.verdict == harness.FAIL and needle in str(rep) and "case = spd_case(" in str(rep)
        ), str(rep)


def writes_its_input(H, q, **kw):
    """Right answer, then the right-hand side zeroed: the reference must not see it."""
    x = solvers.chebyshev(H, q, **kw)
    q.zero_()
    return x


def returns_integers(H, q, **kw):
    return solvers.chebyshev(H, q, **kw).round().to(torch.int64)


def leaves_a_column_unwritten(H, q, **kw):
    x = solvers.chebyshev(H, q, **kw)
    out = torch.empty_like(x)  # poisoned with NaN by the harness
    out[..., 1:] = x[..., 1:]
    return out


def test_modified_inputs_wrong_dtypes_and_unwritten_outputs_are_findings():
    for fn, needle in (
        (writes_its_input, "kernel modified its input 'q' in place"),
        (returns_integers, "output 'x': kernel gave dtype int64"),
        (leaves_a_column_unwritten, "error nan"),
    ):
        for precision in ("float32", "bfloat16"):
            rep = harness.check(
                fn,
                solvers.chebyshev,
                "spd",  # strategies by name, as the pytest plugin takes them
                precision=precision,
                examples=3,
                device="cpu",
                shrink=False,
                seed=1,
            )
            assert rep.verdict == harness.FAIL and needle in str(rep), str(rep)
            assert "case = spd_case(" in str(rep)
    # the case can be run again by hand with the same names
    case = harness.spd_case(3, (1,), 10.0, iters=4, seed=0, precision=torch.float32)
    found = harness.run_case(
        writes_its_input,
        solvers.chebyshev,
        "spd",
        case,
        precision="float32",
        model="float32",
        device="cpu",
    )
    assert "modified its input 'q'" in found[0].crash


def test_bad_strategy_options_are_the_callers_error():
    for build, kw, needle in (
        (harness.spd, dict(max_d=0), "max_d must be an integer >= 1"),
        (harness.spd, dict(max_batch=-3), "max_batch"),
        (harness.spd, dict(max_kappa=0.5), "max_kappa must be a finite number >= 1"),
        (harness.spd, dict(precision=torch.float16), "precision must be one of"),
        (harness.spd_backward, dict(max_kappa=float("nan")), "max_kappa"),
        (harness.gka_ridge, dict(min_a=-1.0), "min_a must be a finite number > 0"),
        (harness.kla, dict(max_T=0), "max_T"),
    ):
        with pytest.raises(ValueError, match=needle):
            build(**kw)
    with pytest.raises(TypeError, match="max_t"):  # a misspelt option is not ignored
        harness.kla(max_t=3)
    with pytest.raises(TypeError, match="seed must be an int"):
        harness.check(solvers.chebyshev, solvers.chebyshev, "spd", seed="abc", device="cpu")
    with pytest.raises(ValueError, match="strategy must be"):
        harness.check(solvers.chebyshev, solvers.chebyshev, "spdd", device="cpu")


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--max-kappa", "0"], "argument --max-kappa"),
        (["--max-kappa", "nan"], "argument --max-kappa"),
        (["--device", "cudaa"], "argument --device"),
        (["--model", "bogus"], "argument --model: unknown contract"),
        (["--kla-form", "tokenwise"], "argument --kla-form: only with --strategy kla"),
        (["--kla-form", "recurrent"], "argument --kla-form"),
    ],
)
def test_cli_bad_values_name_the_option(extra, needle, capsys):
    argv = ["kernels.emulate:chebyshev", "solvers:chebyshev", "--strategy", "spd"] + extra
    try:
        code = harness.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err


def test_snippet_rebuilds_the_case_exactly():
    case = harness.spd_case(5, (2,), 51.123456789012345, iters=7, seed=3, per_system=False)
    ns = {}
    exec(case.snippet(), ns)
    again = ns["case"]
    assert repr(51.123456789012345) in case.snippet()  # full precision
    assert all(torch.equal(case.inputs[k], again.inputs[k]) for k in case.inputs)
    assert case.options == again.options


def test_seed_reproduces_and_varies_the_cases():
    def labels(seed):
        rep = harness.check(
            emulate.bind(emulate.chebyshev, "float32"),
            solvers.chebyshev,
            harness.spd(max_d=4, max_batch=1),
            model="float32",
            examples=5,
            device="cpu",
            seed=seed,
        )
        return [f.case for f in rep.history]

    assert labels(7) == labels(7) and labels(7) != labels(8)


def test_strategies_are_composable_hypothesis_strategies():
    seen = []

    @hypothesis.settings(max_examples=5, database=None, derandomize=True)
    @given(harness.spd(max_d=64, pow2=True, unit_q=True, min_lambda=1e-2).map(lambda c: c.inputs))
    def prop(inputs):
        D = inputs["q"].shape[-1]
        assert D & (D - 1) == 0
        # float64, Higham's gamma_n (u = 2^-53): q / ||q|| and its norm, two D-term sums of
        # squares, two sqrt and a division: gamma_{2D+3}
        unit = gamma(2 * D + 3, 2.0**-53)
        assert torch.allclose(inputs["q"].norm(dim=-1), torch.ones(()).double(), rtol=unit, atol=0)
        # lambda_min >= 1e-2 for the drawn spectrum; the stored H = fl(Q diag(lam) Q^T) is within
        # gamma_D || |Q| |Lambda| |Q|^T ||_2 <= D gamma_D lam_max of it, Haar Q orthogonal to ~D u and
        # eigvalsh within D u lam_max (LAPACK, p(D) = D): (D gamma_D + 2 D u) lam_max
        lam = torch.linalg.eigvalsh(inputs["H"])
        slack = (D * gamma(D, 2.0**-53) + 2 * D * 2.0**-53) * float(lam[..., -1].max())
        assert float(lam[..., 0].min()) >= 1e-2 - slack
        seen.append(D)

    prop()
    assert seen


def _vacuous(case, rounded, contract):
    return (torch.tensor(float("inf")),)  # a bound that covers anything


def test_assert_matches_refuses_an_inconclusive_verdict():
    """A vacuous bound passes a broken kernel (x/2): assert_matches must not let that through unless
    told (``conclusive=False``), and the report says INCONCLUSIVE, never PASS."""
    loose = harness.Strategy(
        "loose", harness.spd(max_d=4, max_batch=2).cases, ("x",), (1,), _vacuous
    )

    def halved(H, q, **kw):
        return solvers.chebyshev(H, q, **kw) / 2

    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        harness.assert_matches(halved, solvers.chebyshev, loose, examples=3, device="cpu")
    rep = harness.assert_matches(
        halved, solvers.chebyshev, loose, examples=3, device="cpu", conclusive=False
    )
    assert rep.verdict == harness.INCONCLUSIVE


def test_gradient_strategies_refuse_misspelt_options():
    from analysis.testing.gka_gradient_harness import gka_layer_backward
    from analysis.testing.gradient_harness import kla_backward

    for build in (kla_backward, gka_layer_backward):
        with pytest.raises(TypeError, match="max_t"):  # was swallowed: T drawn up to the default
            build(max_t=3)


def test_spd_min_lambda_is_drawn_not_filtered():
    """``spd(min_lambda=...)`` builds spectra with lambda_min >= min_lambda (it filtered them, and
    a min_lambda near the largest scale starved hypothesis into a health-check failure at the
    first draw); one above every scale is refused when the strategy is built."""
    from hypothesis import given, settings

    u = 2.0**-24  # H is stored in float32: Weyl moves each eigenvalue by at most ||dH||_2
    for min_lambda in (10.0, 37.5):
        seen = []

        @settings(max_examples=15, derandomize=True, deadline=None)
        @given(harness.spd(min_lambda=min_lambda, max_d=4, precision=torch.float32))
        def draw(case):
            H = case.inputs["H"].double()
            slack = u * torch.linalg.matrix_norm(H, dim=(-2, -1)).max()  # ||dH||_2 <= u ||H||_F
            seen.append(float(torch.linalg.eigvalsh(H).min() + slack))

        draw()
        assert len(seen) == 15 and min(seen) >= min_lambda, (min_lambda, min(seen))
    with pytest.raises(ValueError, match="min_lambda must be at most"):
        harness.spd(min_lambda=40.0)
