"""Review of the pytest plugin (svt_pytest) with the gradient harnesses (kla_backward,
gka_layer_backward): regressions for the defects found, tiny CPU cases only."""

import pathlib
import re

import pytest
import torch

import svt_pytest
from analysis.testing import harness
from analysis.testing.gka_gradient_harness import (
    gka_implicit_reference,
    gka_kernel_gradients,
    gka_kernel_variant,
    gka_layer_backward,
)
from analysis.testing.gradient_harness import (
    fla_gdn_gradients,
    kla_backward,
    kla_kernel_gradients,
    kla_kernel_variant,
    reference_gradients,
    with_gate_dtype,
)

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "gradients.md"


def _tiny():
    return kla_backward(max_T=5, dims=(8,), chunk_size=4)


def _scaled(q, k, v, g, beta, h0, do, dht, **opts):
    """A wrong gradient callable: the reference's gradients times 1.5."""
    return tuple(1.5 * x for x in reference_gradients(q, k, v, g, beta, h0, do, dht, **opts))


def test_kla_backward_failure_prints_a_snippet_that_rebuilds_the_case():
    rep = harness.check(
        _scaled,
        reference_gradients,
        _tiny(),
        precision="float32",
        model="float32",
        examples=3,
        seed=0,
        shrink=False,
        device="cpu",
    )
    assert rep.verdict == harness.FAIL
    snippet = rep.failure.snippet
    assert "kla_grad_case(" in snippet and "no builder" not in snippet, snippet
    assert "kla_grad_case(" in str(rep)
    ns = {}
    exec(snippet, ns)  # noqa: S102 - the report's own snippet
    assert ns["case"].label == rep.failure.case


def test_kla_grad_case_names_bad_arguments():
    from analysis.testing.gradient_harness import kla_grad_case

    with pytest.raises(ValueError, match="mode"):
        kla_grad_case(mode="KLA", B=1, T=2, H=1, HV=1, d_k=4, d_v=4, C=4)
    with pytest.raises(ValueError, match="packed"):
        kla_grad_case(mode="gdn", B=2, T=5, H=1, HV=1, d_k=4, d_v=4, C=4, packed=True)


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"modes": ("KLA",)}, "modes"),
        ({"modes": "gdn"}, "modes"),
        ({"dims": ()}, "dims"),
        ({"heads": (0,)}, "heads"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"max_T": 0}, "max_T"),
    ],
)
def test_kla_backward_arguments_name_themselves(kw, name):
    with pytest.raises(ValueError, match=name):
        kla_backward(**kw)


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"dims": ()}, "dims"),
        ({"iters_values": (0,)}, "iters_values"),
        ({"a_values": (-0.1,)}, "a_values"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_gka_layer_backward_arguments_name_themselves(kw, name):
    with pytest.raises(ValueError, match=name):
        gka_layer_backward(**kw)


TRITON_CALLABLES = [
    kla_kernel_gradients,
    kla_kernel_variant(adjoint="torch"),
    fla_gdn_gradients,
    with_gate_dtype(kla_kernel_gradients, torch.bfloat16),
    gka_kernel_gradients,
    gka_kernel_variant(broken_variant="dg_sign"),
]


@pytest.mark.parametrize("fn", TRITON_CALLABLES, ids=lambda f: f.__qualname__)
def test_gradient_kernels_are_seen_as_triton(fn):
    assert svt_pytest._uses_triton(fn)


@pytest.mark.parametrize(
    "fn",
    [
        reference_gradients,
        with_gate_dtype(reference_gradients, torch.bfloat16),
        gka_implicit_reference,
    ],
    ids=lambda f: f.__qualname__,
)
def test_gradient_references_are_not_triton(fn):
    assert not svt_pytest._uses_triton(fn)


@pytest.mark.parametrize(
    "fn", [kla_kernel_gradients, gka_kernel_gradients], ids=lambda f: f.__qualname__
)
def test_gradient_kernel_skips_on_a_bare_cpu(fn, monkeypatch):
    """Without a GPU and without the interpreter the fixture skips (with the reason) instead of
    failing every case with the kernel's "CPU tensor" error."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kh = svt_pytest.KernelHarness()
    kh._device = "cpu"
    with pytest.raises(pytest.skip.Exception, match="Triton kernel"):
        kh.skip_unless_runnable(fn)


def test_a_gradient_kernel_that_writes_its_input_fails():
    def writes(q, k, v, g, beta, h0, do, dht, **opts):
        out = reference_gradients(q, k, v, g, beta, h0, do, dht, **opts)
        do.mul_(2)
        return out

    rep = harness.check(
        writes, reference_gradients, _tiny(), precision="float32", examples=1, seed=0, device="cpu"
    )
    assert rep.verdict == harness.FAIL and "modified its input 'do'" in str(rep)


def _block_after(marker_text: str):
    """(the HTML comments just above the python block containing marker_text, its code)."""
    text = DOCS.read_text()
    for m in re.finditer(r"((?:<!--.*-->\n)*)```python\n(.*?)```", text, re.S):
        if marker_text in m.group(2):
            return m.group(1), m.group(2)
    raise AssertionError(f"no python block with {marker_text!r} in {DOCS}")


def test_docs_gka_example_is_marked_gpu_and_asserts():
    """The block runs on cuda: unmarked, the docs test ran it on the CPU, where harness.check
    returned a FAIL report (no CUDA) that nothing looked at, and the block "passed"."""
    marks, code = _block_after("gka_layer_backward(dims=(64, 128)")
    assert "pytest.mark.gpu" in marks
    assert "assert rep.passed" in code
