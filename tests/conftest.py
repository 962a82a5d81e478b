"""The project's own pytest set-up; the rest comes from the toolkit's plugin (svt_pytest).

The plugin registers the hypothesis profiles (``svt-ci``/``ci``: derandomised, no deadline,
12 examples, what scripts/test.sh uses; ``svt-thorough``/``thorough``: many random examples;
``svt-dev``/``dev``: the hypothesis defaults without a deadline), the ``gpu`` and ``slow``
markers and the ``kernel_harness`` fixture. Here: the plugin is loaded even from a checkout that
is not installed, ``dev`` is the profile when HYPOTHESIS_PROFILE is unset, one CPU thread.
"""

import os

import torch

pytest_plugins = ["svt_pytest"]  # a no-op where the installed entry point already loaded it

torch.set_num_threads(1)


def pytest_configure(config):
    # the plugin loaded HYPOTHESIS_PROFILE / --hypothesis-profile if one was named; else dev
    if not (config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE")):
        import svt_pytest

        svt_pytest.load_profile("dev")
