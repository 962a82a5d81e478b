"""Shared pytest set-up: hypothesis profiles and NaN-poisoned allocation for kernel tests.

Profiles (select with HYPOTHESIS_PROFILE): ``ci`` — deterministic (derandomised), no
deadline, few examples, what scripts/test.sh uses; ``thorough`` — many random examples for
local runs; ``dev`` (default) — the hypothesis defaults without a deadline.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from analysis.strategies.reproducible import pin_local_constants

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=12,
                          suppress_health_check=_SUPPRESS, print_blob=True, database=None)
settings.register_profile("thorough", deadline=None, max_examples=400, suppress_health_check=_SUPPRESS)
settings.register_profile("dev", deadline=None, suppress_health_check=_SUPPRESS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
# derandomised cases depend on strategy and seed only, not on which modules are loaded
pin_local_constants()

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run pytest -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
