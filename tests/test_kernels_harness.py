"""kernels.harness itself: the CLI, the report, the NaN poisoning, the KLA strategy."""

import torch
from kernel_support import DEVICE, needs_triton_device, poisoned_outputs  # noqa: F401

import kernels
import solvers
from kernels import harness

pytestmark = needs_triton_device


def test_poisoned_empty_is_nan_and_restored():
    real = torch.empty
    with harness.nan_poisoned_empty():
        assert torch.isnan(torch.empty(3)).all() and (torch.empty(2, dtype=torch.int8) == -1).all()
    assert torch.empty is real


def doubled(H, q, **kw):
    """A missing factor 1/2: wrong on every nonzero case."""
    return 2 * kernels.chebyshev(H, q, **kw)


def test_cli_passes_a_kernel_and_fails_a_broken_one(capsys):
    args = ["--strategy", "spd", "--precision", "bfloat16", "--examples", "4", "--max-d", "8",
            "--max-batch", "2", "--device", DEVICE]
    assert harness.main(["kernels:chebyshev", "solvers:chebyshev", *args]) == 0
    assert "PASSED" in capsys.readouterr().out
    assert harness.main(["test_kernels_harness:doubled", "solvers:chebyshev", *args, "--no-shrink"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "counterexample" in out and "ratio" in out


def test_report_names_an_exception():
    def crashes(H, q, **kw):
        raise RuntimeError("kernel launch failed")

    rep = harness.check(crashes, solvers.chebyshev, harness.spd(max_d=4, max_batch=1), examples=2, device=DEVICE)
    assert not rep.passed and "kernel launch failed" in rep.error


def test_kla_strategy_bounds_the_reference_in_bf16():
    # solvers.kla_chunkwise run in bf16 storage mode is a "kernel" with bf16 intermediates: the
    # bfloat16/storage model's chunkwise bound (plus the float32 reference's) must hold
    strat = harness.kla(max_T=40, dims=(3, 8), chunk_size=8, precision=torch.bfloat16)
    harness.assert_matches(solvers.kla_chunkwise, solvers.kla_chunkwise, strat, precision="bfloat16",
                           model="bfloat16/storage", examples=5, device="cpu")


def test_kla_strategy_catches_a_scaled_readout():
    def scaled(q, k, v, **kw):
        o, S = solvers.kla_chunkwise(q, k, v, **kw)
        return o * 1.05, S

    strat = harness.kla(max_T=40, dims=(3, 8), chunk_size=8, precision=torch.bfloat16)
    rep = harness.check(scaled, solvers.kla_chunkwise, strat, precision="bfloat16", model="bfloat16/storage",
                        examples=5, device="cpu", shrink=False)
    assert not rep.passed
