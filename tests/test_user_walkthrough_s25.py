"""A new user's walk through README.md and docs/ (session 25): the defects found, pinned.

* On/off options (``return_info``, ``return_final_state``, ``return_states``, ``return_lambda``)
  took any truthy value: ``return_info="no"`` returned a tuple. They are bools now, refused by
  name otherwise, in the references and the kernels alike (kernels.kla and kernels.koopman
  already were).
* ``Status.COMPLETED``'s advice told the user to "pass tol=", an argument no solver has.
* ``svt claims`` named itself ``python -m analysis claims`` in its usage and errors.
* docs/precision.md gave the bf16 storage-mode allowance limit as 31.98 / 31.5 (n = 8 / 128);
  the formula beside it gives 31.996 / 31.94.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from pathlib import Path

import pytest
import torch

import solvers

ROOT = Path(__file__).resolve().parents[1]


def _spd(D=3, dtype=torch.float64):
    return torch.eye(D, dtype=dtype) * 2.0, torch.ones(D, dtype=dtype)


def _stats():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(10, 3, dtype=torch.float64, generator=g)
    v = torch.randn(10, 2, dtype=torch.float64, generator=g)
    return solvers.koopman_statistics(z, v), torch.randn(1, 3, dtype=torch.float64, generator=g)


def _kla_inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 1, 2, generator=g).to(dtype) for _ in range(3))
    return q, k, v


def _linear_calls(mod, H, q):
    """Chebyshev, GD, AGD and CG of ``mod`` (solvers or kernels: the same signatures)."""
    for name in ("chebyshev", "gd", "agd"):
        yield (
            name,
            "return_info",
            lambda f, name=name: getattr(mod, name)(H, q, L=2.0, mu=1.0, iters=2, return_info=f),
        )
    yield "cg", "return_info", lambda f: mod.cg(H, q, iters=2, return_info=f)


def _reference_calls():
    H, q = _spd()
    gk = torch.randn(5, 3, dtype=torch.float64)
    A = torch.randn(4, 2, dtype=torch.float64)
    b = A @ torch.ones(2, dtype=torch.float64)
    yield from _linear_calls(solvers, H, q)
    yield (
        "chebyshev_backward",
        "return_info",
        lambda f: solvers.chebyshev_backward(
            H, q, q, L=2.0, mu=1.0, iters=2, method="implicit", return_info=f
        ),
    )
    yield "cholesky", "return_info", lambda f: solvers.cholesky(H, return_info=f)
    yield "kaczmarz", "return_info", lambda f: solvers.kaczmarz(A, b, sweeps=1, return_info=f)
    yield (
        "gka_layer",
        "return_info",
        lambda f: solvers.gka_layer(gk, gk, gk[:, :2], a=0.1, return_info=f),
    )
    yield (
        "chunkwise_frobenius",
        "return_states",
        lambda f: solvers.chunkwise_frobenius(gk, chunk_size=2, return_states=f),
    )
    for name in ("kla_recurrent", "kla_chunkwise"):
        yield (
            name,
            "return_final_state",
            lambda f, name=name: getattr(solvers, name)(
                *_kla_inputs(), alpha=0.9, eta=0.5, return_final_state=f
            ),
        )
    yield (
        "koopman_readout",
        "return_info",
        lambda f: solvers.koopman_readout(*_stats(), return_info=f),
    )
    yield "ridge_readout", "return_info", lambda f: solvers.ridge_readout(*_stats(), return_info=f)


REFERENCE_CALLS = {name: (option, call) for name, option, call in _reference_calls()}


@pytest.mark.parametrize("name", sorted(REFERENCE_CALLS))
@pytest.mark.parametrize("bad", ["no", 1, None])
def test_reference_flags_must_be_bools(name, bad):
    option, call = REFERENCE_CALLS[name]
    with pytest.raises(TypeError, match=rf"^{option} must be a bool"):
        call(bad)
    call(False)  # the documented values still work
    call(True)


def _kernel_calls():
    import kernels

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU under the interpreter
    H, q = (t.to(device) for t in _spd(dtype=torch.float32))
    yield from _linear_calls(kernels, H, q)
    yield (
        "chebyshev_adaptive",
        "return_lambda",
        lambda f: kernels.chebyshev_adaptive(H, q, a=0.1, iters=2, return_lambda=f),
    )
    yield (
        "chebyshev_backward",
        "return_info",
        lambda f: kernels.chebyshev_backward(
            H, q, q, L=2.0, mu=1.0, iters=2, method="implicit", return_info=f
        ),
    )
    yield (
        "chunkwise_frobenius",
        "return_states",
        lambda f: kernels.chunkwise_frobenius(
            torch.randn(4, 3, device=device), chunk_size=2, return_states=f
        ),
    )


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="the kernels need a GPU or TRITON_INTERPRET=1",
)
@pytest.mark.parametrize(
    "name",
    [
        "chebyshev",
        "gd",
        "agd",
        "cg",
        "chebyshev_adaptive",
        "chebyshev_backward",
        "chunkwise_frobenius",
    ],
)
def test_kernel_flags_must_be_bools(name):
    pytest.importorskip("triton")
    calls = {n: (o, c) for n, o, c in _kernel_calls()}
    option, call = calls[name]
    with pytest.raises(TypeError, match=rf"^{option} must be a bool"):
        call("no")
    call(False)


def test_completed_advice_names_only_arguments_that_exist():
    """Each ``name=`` an advice tells the user to pass is a parameter of some public solver."""
    params = set()
    for name in solvers.__all__:
        obj = getattr(solvers, name)
        if callable(obj) and not inspect.isclass(obj):
            try:
                params |= set(inspect.signature(obj).parameters)
            except (TypeError, ValueError):
                pass
    for status in solvers.Status:
        for arg in re.findall(r"\b([A-Za-z_]\w*)=", status.advice):
            assert arg in params, f"{status.name}'s advice names {arg}=, which no solver takes"
    assert "rtol=" in solvers.Status.COMPLETED.advice


def test_svt_claims_names_itself_svt(monkeypatch, capsys):
    from analysis import cli

    monkeypatch.setattr(sys, "argv", [str(ROOT / ".venv" / "bin" / "svt")])
    assert cli.main(["claims", "--papr", "gka"]) == 2
    err = capsys.readouterr().err
    assert "svt claims: error" in err and "python -m analysis" not in err
    code = cli.main(["claims", "--help"])
    assert code == 0
    assert capsys.readouterr().out.startswith("usage: svt claims")


def test_precision_doc_allowance_limits_match_the_formula():
    from analysis.precision import rounding_allowance

    text = (ROOT / "docs" / "precision.md").read_text()
    row = next(
        line for line in text.splitlines() if line.startswith("| bfloat16/storage | kappa <")
    )
    shown = re.findall(r"([\d.]+) at n = (\d+)", row)
    assert len(shown) == 2, row
    ar = solvers.Arith(torch.bfloat16, "storage")
    for value, n in shown:
        exact = 1.0 / rounding_allowance(1.0, int(n), ar)
        digits = len(value.split(".")[1])
        assert round(exact, digits) == float(value), (n, exact, value)


def test_koopman_readout_names_power_iters():
    """A bad ``power_iters`` was reported as ``iters`` (the name inside spectral_normalize)."""
    with pytest.raises(ValueError, match=r"^power_iters must be >= 0"):
        solvers.koopman_readout(*_stats(), power_iters=-1)
    with pytest.raises(TypeError, match=r"^power_iters must be an int"):
        solvers.koopman_readout(*_stats(), power_iters=2.5)
