"""Regression tests from a new user's trial of the toolkit (session 27): bad input a user would
plausibly type, in Python and on the command line, gets one clear error naming the argument
(exit status 2 on a command line), never a traceback from inside torch or hypothesis and never
a FAIL blamed on the kernel."""

from __future__ import annotations

import pytest
import torch

import solvers
from analysis.references import iterative
from analysis.testing import harness

F32 = torch.float32


def _system(batch=2, D=4):
    H = 2.0 * torch.eye(D).expand(batch, D, D).clone()
    return H, torch.ones(batch, D)


# ------------------------------------------------------------------ solvers on the meta device


@pytest.mark.parametrize("name", ["chebyshev", "gd", "agd"])
def test_meta_tensors_run_on_shapes_as_cg_does(name):
    # was: RuntimeError "Tensor.item() cannot be called on meta tensors" from the L >= mu check
    H, q = _system()
    x = getattr(solvers, name)(H.to("meta"), q.to("meta"), L=3.0, mu=1.0, iters=3)
    assert x.device.type == "meta" and x.shape == (2, 4)
    assert solvers.cg(H.to("meta"), q.to("meta"), iters=3).shape == (2, 4)


def test_meta_tensors_keep_the_float_parameter_checks():
    H, q = _system()
    with pytest.raises(ValueError, match=r"^L has 1 non-finite"):
        solvers.chebyshev(H.to("meta"), q.to("meta"), L=float("nan"), mu=1.0, iters=3)


def _meta_calls():
    H, q = _system()
    Hm, qm = H.to("meta"), q.to("meta")
    k = torch.randn(1, 8, 2, 4).to("meta")
    z, v = torch.randn(2, 16, 3).to("meta"), torch.randn(2, 16, 2).to("meta")
    return {
        "reverse": (
            "H",
            lambda: solvers.chebyshev_backward(
                Hm, qm, qm, L=3.0, mu=1.0, iters=3, method="reverse"
            ),
        ),
        "reverse_stored_omega": (
            "H",
            lambda: solvers.chebyshev_backward(
                Hm, qm, qm, L=3.0, mu=1.0, iters=3, method="reverse_stored_omega"
            ),
        ),
        "kla_chunkwise": (
            "q",
            lambda: solvers.kla_chunkwise(k, k, k, alpha=0.9, eta=0.5, chunk_size=4),
        ),
        "kla_recurrent": ("q", lambda: solvers.kla_recurrent(k, k, k, alpha=0.9, eta=0.5)),
        "koopman_statistics": ("z", lambda: solvers.koopman_statistics(z, v)),
        "cholesky": ("G", lambda: solvers.cholesky(Hm)),
        "kaczmarz": ("A", lambda: solvers.kaczmarz(Hm, qm, sweeps=2)),
        "gka_layer": ("q", lambda: solvers.gka_layer(k, k, k, a=0.02)),
        "chunkwise_frobenius": ("k", lambda: solvers.chunkwise_frobenius(k, chunk_size=4)),
        "gka_ridge": ("H", lambda: solvers.gka_ridge(Hm, 0.02)),
        "error_split": (
            "H",
            lambda: iterative.error_split("chebyshev", Hm, qm, L=3.0, mu=1.0, iters=2),
        ),
    }


@pytest.mark.parametrize("which", sorted(_meta_calls()))
def test_meta_tensors_where_values_are_read_name_the_argument(which):
    # was: RuntimeError "Tensor.item() cannot be called on meta tensors" from inside torch
    arg, call = _meta_calls()[which]
    with pytest.raises(ValueError, match=rf"^{arg} is on the meta device, which holds no values"):
        call()


# ------------------------------------------------------------------ kernels and autograd


def _kernel_calls(H, q):
    import kernels

    return {
        "chebyshev": lambda: kernels.chebyshev(H, q, L=3.0, mu=1.0, iters=2),
        "gd": lambda: kernels.gd(H, q, L=3.0, mu=1.0, iters=2),
        "agd": lambda: kernels.agd(H, q, L=3.0, mu=1.0, iters=2),
        "cg": lambda: kernels.cg(H, q, iters=2),
        "chebyshev_adaptive": lambda: kernels.chebyshev_adaptive(H, q, a=0.02, iters=2),
    }


@pytest.mark.parametrize("name", ["chebyshev", "gd", "agd", "cg", "chebyshev_adaptive"])
def test_kernel_without_backward_refuses_inputs_that_require_grad(name):
    # was: a result without gradient, silently (solvers.X -> kernels.X stopped training H, q)
    pytest.importorskip("triton")
    import os

    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    H, q = (t.to(device) for t in _system())
    with pytest.raises(ValueError, match=rf"^H requires grad, but kernels.{name} has no backward"):
        _kernel_calls(H.clone().requires_grad_(), q)[name]()
    with torch.no_grad():  # inference with parameters that require grad still runs
        assert _kernel_calls(H.clone().requires_grad_(), q)[name]().shape == (2, 4)
    assert _kernel_calls(H, q)[name]().shape == (2, 4)


def test_koopman_and_frobenius_kernels_refuse_inputs_that_require_grad():
    pytest.importorskip("triton")
    import os

    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    import kernels

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    z, v = torch.randn(2, 32, 4, generator=g), torch.randn(2, 32, 3, generator=g)
    zq = torch.randn(2, 5, 4, generator=g).to(device)
    stats = solvers.koopman_statistics(z.to(device), v.to(device))
    with pytest.raises(ValueError, match=r"^zq requires grad, but kernels.koopman_readout"):
        kernels.koopman_readout(stats, zq.clone().requires_grad_())
    grad_stats = solvers.koopman_statistics(z.to(device).requires_grad_(), v.to(device))
    with pytest.raises(ValueError, match=r"^stats.G requires grad"):
        kernels.koopman_readout(grad_stats, zq)
    with torch.no_grad():
        assert kernels.koopman_readout(grad_stats, zq).shape == (2, 5, 3)
    k = torch.randn(1, 8, 4, generator=g).to(device)
    with pytest.raises(ValueError, match=r"^k requires grad, but kernels.chunkwise_frobenius"):
        kernels.chunkwise_frobenius(k.clone().requires_grad_(), chunk_size=4)
    assert kernels.chunkwise_frobenius(k, chunk_size=4).shape == (1, 8)


# ------------------------------------------------------------------ harness.check from Python


@pytest.mark.parametrize(
    "examples, error, match",
    [
        (0, ValueError, r"^examples must be >= 1"),
        (-1, ValueError, r"^examples must be >= 1"),
        (2.5, TypeError, r"^examples must be an int"),
        (True, TypeError, r"^examples must be an int"),
    ],
)
def test_check_examples_is_named(examples, error, match):
    # was: hypothesis's InvalidArgument "max_examples=0 must be at least one ..."
    with pytest.raises(error, match=match):
        harness.check(solvers.chebyshev, solvers.chebyshev, "spd", examples=examples)


@pytest.mark.parametrize(
    "device, match",
    [
        ("meta", r"^device: 'meta' holds no values"),
        ("tpu", r"^device: expected a torch device such as cpu or cuda, got 'tpu'"),
    ]
    + ([] if torch.cuda.is_available() else [("cuda", r"^device: 'cuda': no CUDA device")]),
)
def test_check_device_is_named(device, match):
    # was: meta and (without a GPU) cuda were a FAIL "with an exception outside any case",
    # blamed on the kernel; tpu torch's RuntimeError listing every backend
    with pytest.raises(ValueError, match=match):
        harness.check(solvers.chebyshev, solvers.chebyshev, "spd", examples=1, device=device)


def test_spd_method_typo_is_named():
    # was: accepted, then a FAIL "with an exception outside any case" on every check
    with pytest.raises(ValueError, match=r"^method must be one of \('chebyshev', 'gd', 'agd'\)"):
        harness.spd(method="chebychev")
    assert harness.spd(method="gd").name == "spd"


def test_prepare_hook_of_another_signature_is_named(capsys):
    # was: a FAIL "with an exception outside any case: TypeError: chebyshev() takes 2
    # positional arguments but 3 were given", exit status 1, as if the kernel had failed
    with pytest.raises(TypeError, match=r"^prepare must take \(rounded, options, precision\)"):
        harness.check(
            solvers.chebyshev, solvers.chebyshev, "spd", examples=1, prepare=solvers.chebyshev
        )
    argv = ["solvers:chebyshev", "solvers:chebyshev", "--strategy", "spd", "--examples", "1"]
    assert harness.main(argv + ["--prepare", "solvers:chebyshev"]) == 2
    assert "argument --prepare: prepare must take" in capsys.readouterr().err
    assert harness.prepare_hook(harness.kla_prepare) is harness.kla_prepare


def test_cli_device_meta_is_a_usage_error(capsys):
    # was: exit status 1, "FAIL with an exception outside any case: RuntimeError: META device
    # type not an accelerator."
    with pytest.raises(SystemExit) as e:
        harness.main(
            ["solvers:chebyshev", "solvers:chebyshev", "--strategy", "spd", "--device", "meta"]
        )
    assert e.value.code == 2
    assert "argument --device: 'meta' holds no values" in capsys.readouterr().err


# ------------------------------------------------------------------ check_kernel from Python


def _my_gd(H, q, *, L, mu, iters):
    return solvers.gd(H.float(), q.float(), L=L, mu=mu, iters=iters)


def test_check_kernel_takes_the_like_spellings_of_the_command_line():
    from analysis.testing.check_kernel import check_kernel

    # was: KeyError 'solvers.gd' (svt check-kernel --like solvers.gd works) and KeyError 'gdd';
    # precisions="float32" and models="float32" were read letter by letter (KeyError 'f',
    # "unknown contract 'f'")
    kw = dict(precisions="float32", models="float32", examples=2)
    report = check_kernel(_my_gd, "solvers.gd", **kw)
    assert report["like"] == "gd" and report["settings"]["precisions"] == ["float32"]
    assert report["verdict"] == "PASS", report["runs"]
    with pytest.raises(ValueError, match=r"unknown reference 'gdd'"):
        check_kernel(_my_gd, "gdd", **kw)
    with pytest.raises(ValueError, match=r"^precisions must name input dtypes .* got 'float16'"):
        check_kernel(_my_gd, "gd", precisions=("float16",), models=["float32"], examples=2)


# ------------------------------------------------------------------ python -m proofs_check


def test_impl_naming_a_solver_is_a_usage_error(capsys):
    # was: a traceback (TypeError: chebyshev() missing 2 required positional arguments),
    # exit status 1
    from proofs_check.runner import main

    assert main(["--claim", "gka.alg1", "--impl", "solvers:chebyshev", "--list"]) == 2
    err = capsys.readouterr().err
    assert "argument --impl: 'solvers:chebyshev' is a function that takes arguments" in err
    assert "expected a mapping of names to functions" in err


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_check_kernel_out_that_cannot_be_created_is_a_usage_error_up_front(capsys):
    # was (as root, where os.access says yes): every run first, then a FileNotFoundError
    # traceback writing the report
    from analysis import cli

    argv = ["check-kernel", "solvers:gd", "--like", "gd", "--precision", "float32"]
    code = cli.main(argv + ["--model", "float32", "--max-examples", "1", "-o", "/proc/x.json"])
    assert code == 2
    captured = capsys.readouterr()
    assert "argument --out: cannot write '/proc/x.json'" in captured.err
    assert "PASS" not in captured.out + captured.err  # nothing ran
