"""Every command line of the toolkit reports a usage error as one line naming the argument,
with exit status 2 (analysis.argtypes.OneLineParser): no usage block, no traceback."""

import importlib

import pytest

# module -> the required arguments that come before the bad option
MAINS = {
    "analysis.cli": [],
    "analysis.references.chebyshev_backward": [],
    "analysis.figures.gallery": [],
    "analysis.studies.cg_agreement": [],
    "analysis.studies.contract_tightness": [],
    "proofs_check.magnitudes": [],
    "analysis.testing.harness": ["a:b", "c:d", "--strategy", "spd"],
    "proofs_check.runner": [],
}


@pytest.mark.parametrize("module", sorted(MAINS))
def test_unknown_option_is_one_line_and_exit_2(module, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main(MAINS[module] + ["--no-such-option"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2
    assert len(err) == 1 and "error:" in err[0] and "--no-such-option" in err[0], err


def test_help_still_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        importlib.import_module("analysis.testing.harness").main(["--help"])
    assert exc.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, name", [(["--D", "0"], "--D"), (["--flips", "-1"], "--flips")])
def test_contract_tightness_bad_values_are_one_line_and_exit_2(argv, name, capsys):
    main = importlib.import_module("analysis.studies.contract_tightness").main
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2
    assert len(err) == 1 and name in err[0], err
