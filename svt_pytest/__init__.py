"""The toolkit's pytest plugin: hypothesis profiles, the ``kernel_harness`` fixture, markers.

Installed with the package (entry point ``pytest11``, name ``svt_pytest``; disable it with
``-p no:svt_pytest``). A user's kernel test is then three lines::

    def test_my_kernel(kernel_harness):
        kernel_harness.assert_matches(my_kernel, "solvers:chebyshev", strategy="spd", model="bfloat16/operands")

What it provides (docs/harness.md, "From pytest"):

* hypothesis profiles ``svt-ci`` (derandomised, no deadline, 12 examples, no example database:
  the same cases on every run), ``svt-thorough`` (400 random examples) and ``svt-dev`` (the
  hypothesis defaults without a deadline), selected with ``HYPOTHESIS_PROFILE=svt-ci`` or
  ``--hypothesis-profile=svt-ci``. Selecting one also pins hypothesis's pool of local constants
  (``analysis.testing.strategies.reproducible``), so derandomised cases depend on the strategy and seed
  alone. ``load_profile("ci")`` (``thorough``, ``dev``) loads ours under the short name, for a
  project that asks for it in its conftest: the plugin never claims those names by itself,
  since hypothesis has a built-in ``ci`` profile and projects register their own;
* the ``kernel_harness`` fixture (:class:`KernelHarness`);
* the markers ``gpu`` (skipped where CUDA is unavailable) and ``slow`` (skipped under the
  ``svt-ci`` profile unless ``SVT_SLOW=1``);
* ``--svt-inconclusive={fail,xfail,skip}`` (ini ``svt_inconclusive``): what an INCONCLUSIVE
  harness verdict does to the test; ``fail`` by default.

Why this module is a package of its own: every other package of the toolkit imports torch on
import, and ``kernels`` imports triton. pytest imports this module in every run of every
project of an environment the toolkit is installed in, so it imports only the standard library
and pytest; torch, hypothesis and the harness are imported when a profile of ours is selected,
a ``gpu`` test is collected, or the fixture is used.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional, Union

import pytest

PROFILES = ("svt-ci", "svt-thorough", "svt-dev")
ALIASES = {"ci": "svt-ci", "thorough": "svt-thorough", "dev": "svt-dev"}
INCONCLUSIVE_ACTIONS = ("fail", "xfail", "skip")
MARKERS = (
    "gpu: needs a CUDA GPU (skipped without one; run with: pytest -m gpu on a GPU machine)",
    "slow: long-running; skipped under the svt-ci hypothesis profile unless SVT_SLOW=1",
)

_state = {"profile": None}  # the profile of ours loaded last (its svt- name), for the slow marker


# ---------------------------------------------------------------------------------------
# hypothesis profiles
# ---------------------------------------------------------------------------------------


def register_profiles() -> None:
    """Register ``svt-ci``, ``svt-thorough`` and ``svt-dev`` with hypothesis (idempotent)."""
    from hypothesis import HealthCheck, settings

    # the harness's strategies build float64 matrices and solve them in every draw: slow
    # draws and large data are expected, not a sign of a bad strategy
    suppress = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    # on hypothesis's defaults, not on whatever profile is loaded when this runs
    base = settings.get_profile("default")
    settings.register_profile(
        "svt-ci",
        base,
        derandomize=True,
        deadline=None,
        max_examples=12,
        suppress_health_check=suppress,
        print_blob=True,
        database=None,
    )
    settings.register_profile(
        "svt-thorough", base, deadline=None, max_examples=400, suppress_health_check=suppress
    )
    settings.register_profile("svt-dev", base, deadline=None, suppress_health_check=suppress)


def is_ours(name: Optional[str]) -> bool:
    return name in PROFILES or name in ALIASES


def load_profile(name: str) -> str:
    """Load one of our profiles (``svt-ci``, ``svt-thorough``, ``svt-dev``) or an alias
    (``ci``, ``thorough``, ``dev``: registered as a copy of ours, replacing any profile of that
    name) and pin hypothesis's local constants; returns the svt- name. ValueError naming
    ``name`` for anything else."""
    if not is_ours(name):
        raise ValueError(
            f"unknown profile {name!r}: expected one of {', '.join(PROFILES + tuple(ALIASES))}"
        )
    from hypothesis import settings

    register_profiles()
    target = ALIASES.get(name, name)
    if name in ALIASES:
        settings.register_profile(name, settings.get_profile(target))
    settings.load_profile(name)
    from analysis.testing.strategies.reproducible import pin_local_constants

    pin_local_constants()  # derandomised cases depend on strategy and seed, not on loaded modules
    _state["profile"] = target
    return target


def _selected_profile(config) -> Optional[str]:
    return config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE")


# ---------------------------------------------------------------------------------------
# pytest hooks
# ---------------------------------------------------------------------------------------


def pytest_addoption(parser):
    group = parser.getgroup("svt", "solver-verification toolkit (kernel_harness fixture)")
    group.addoption(
        "--svt-inconclusive",
        choices=INCONCLUSIVE_ACTIONS,
        default=None,
        help="what an INCONCLUSIVE kernel_harness verdict does to the test (default: the ini "
        "value svt_inconclusive, else fail)",
    )
    parser.addini(
        "svt_inconclusive",
        "what an INCONCLUSIVE kernel_harness verdict does: fail, xfail or skip",
        default="fail",
    )


@pytest.hookimpl(tryfirst=True)  # before hypothesis's own plugin loads --hypothesis-profile
def pytest_configure(config):
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    name = _selected_profile(config)
    if name in PROFILES:  # the short aliases only where a project asks (load_profile)
        load_profile(name)


def pytest_collection_modifyitems(config, items):
    gpu = [item for item in items if "gpu" in item.keywords]
    if gpu and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run pytest -m gpu on a GPU machine)")
        for item in gpu:
            item.add_marker(skip)
    if _state["profile"] == "svt-ci" and os.environ.get("SVT_SLOW") != "1":
        skip = pytest.mark.skip(
            reason="slow: skipped under the svt-ci profile (set SVT_SLOW=1 to run it)"
        )
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------
# the kernel_harness fixture
# ---------------------------------------------------------------------------------------


def _uses_triton(fn) -> bool:
    """Whether ``fn``'s module holds Triton (a triton module or a Triton-jitted function):
    such a kernel cannot run on a CPU without Triton's interpreter. A callable (or one it wraps,
    through ``functools.partial`` or ``__wrapped__``) that sets ``__svt_triton__`` says it
    outright: the gradient harnesses' kernel callables do, since their Triton is imported only
    when they run."""
    while True:
        flag = getattr(fn, "__svt_triton__", None)
        if flag is not None:
            return bool(flag)
        inner = getattr(fn, "func", None) or getattr(
            fn, "__wrapped__", None
        )  # functools.partial, wraps
        if inner is None:
            break
        fn = inner
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    for value in vars(module).values() if module else ():
        owner = value.__name__ if isinstance(value, type(sys)) else type(value).__module__
        if owner == "triton" or owner.startswith("triton."):
            return True
    return False


class KernelHarness:
    """What the ``kernel_harness`` fixture returns: :mod:`analysis.testing.harness` run from a test.

    ``device``: ``"cuda"`` if available, else ``"cpu"``. Every check NaN-poisons ``torch.empty``
    while the kernel runs, so an output element it never writes fails.
    """

    def __init__(self, inconclusive: str = "fail"):
        if inconclusive not in INCONCLUSIVE_ACTIONS:
            raise ValueError(
                f"inconclusive must be one of {INCONCLUSIVE_ACTIONS}, got {inconclusive!r}"
            )
        self.inconclusive = inconclusive
        self._device = None

    @property
    def harness(self):
        """The :mod:`analysis.testing.harness` module (imported on first use)."""
        from analysis.testing import harness

        return harness

    @property
    def device(self) -> str:
        if self._device is None:
            self._device = "cuda" if _cuda_available() else "cpu"
        return self._device

    def strategy(self, strategy, *, precision: str = "bfloat16", **sizes):
        """A :class:`analysis.testing.harness.Strategy`: ``strategy`` itself, or the one registered in
        ``harness.STRATEGIES`` under that name, built for ``precision`` on :attr:`device` with
        ``sizes`` (``max_d``, ``max_batch``, ``max_kappa``, ``pow2``...)."""
        h = self.harness
        if isinstance(strategy, h.Strategy):
            if sizes:
                raise TypeError(
                    f"sizes {sorted(sizes)} apply to a strategy name, not to a Strategy "
                    f"({strategy.name}): build it with them instead"
                )
            return strategy
        if not isinstance(strategy, str) or strategy not in h.STRATEGIES:
            raise ValueError(
                f"strategy must be an analysis.testing.harness.Strategy or one of {sorted(h.STRATEGIES)}, "
                f"got {strategy!r}"
            )
        if precision not in h.PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(h.PRECISIONS)}, got {precision!r}")
        return h.STRATEGIES[strategy](
            precision=h.PRECISIONS[precision], device=self.device, **sizes
        )

    def _callable(self, what, role: str) -> Callable:
        if isinstance(what, str):
            return self.harness.load(what)  # UsageError naming the spec
        if not callable(what):
            raise TypeError(
                f"{role} must be a callable or 'module:function', got {type(what).__name__}"
            )
        return what

    def skip_unless_runnable(self, kernel, triton: Optional[bool] = None) -> None:
        """Skip the test when ``kernel`` is a Triton kernel and there is neither a GPU nor Triton's
        interpreter (``triton``: None = detect from the kernel's module)."""
        if self.device != "cpu" or os.environ.get("TRITON_INTERPRET") == "1":
            return
        if triton if triton is not None else _uses_triton(kernel):
            pytest.skip(
                f"{getattr(kernel, '__qualname__', kernel)!s} is a Triton kernel and there is no CUDA GPU: "
                "run on a GPU, or on the CPU with TRITON_INTERPRET=1 set before the kernel is imported "
                "(Triton's interpreter)"
            )

    def check(
        self,
        kernel,
        reference,
        strategy: Union[str, object] = "spd",
        *,
        model="float32",
        precision: str = "bfloat16",
        examples: Optional[int] = None,
        seed: Optional[int] = None,
        prepare: Optional[Callable] = None,
        shrink: bool = True,
        triton: Optional[bool] = None,
        trajectory: bool = False,
        **sizes,
    ):
        """Run :func:`analysis.testing.harness.check` and return its Report (no assertion).

        ``kernel``, ``reference``: callables or ``"module:function"``; ``strategy``: a name in
        ``harness.STRATEGIES`` (with ``sizes``) or a Strategy; ``model``: the kernel's precision
        contract; ``precision``: its input dtype; ``examples``: cases (default: the loaded
        hypothesis profile's, 12 under ``svt-ci``); ``seed``: draw from this seed; ``prepare``:
        fair-pairing hook; ``triton``: whether the kernel needs Triton (None: detect);
        ``trajectory``: the harness's trajectory mode (every step count run and checked)."""
        kernel, reference = self._callable(kernel, "kernel"), self._callable(reference, "reference")
        self.skip_unless_runnable(kernel, triton)
        strat = self.strategy(strategy, precision=precision, **sizes)
        return self.harness.check(
            kernel,
            reference,
            strat,
            precision=precision,
            model=model,
            examples=examples,
            device=self.device,
            poison=True,
            shrink=shrink,
            seed=seed,
            prepare=prepare,
            trajectory=trajectory,
        )

    def assert_matches(
        self,
        kernel,
        reference,
        strategy: Union[str, object] = "spd",
        *,
        inconclusive: Optional[str] = None,
        **kw,
    ):
        """:meth:`check`, then: FAIL fails the test with the harness's report (the worst case, the
        shrunk counterexample and the snippet that rebuilds it); INCONCLUSIVE fails it too unless
        ``inconclusive`` (default: ``--svt-inconclusive``) is ``"xfail"`` or ``"skip"``; PASS
        returns the Report."""
        action = inconclusive or self.inconclusive
        if action not in INCONCLUSIVE_ACTIONS:
            raise ValueError(f"inconclusive must be one of {INCONCLUSIVE_ACTIONS}, got {action!r}")
        rep = self.check(kernel, reference, strategy, **kw)
        h = self.harness
        if rep.verdict == h.FAIL:
            pytest.fail(str(rep), pytrace=False)
        if rep.verdict == h.INCONCLUSIVE:
            # a vacuous bound cannot tell this kernel from a broken one: passing would claim a
            # check that did not happen
            {
                "fail": lambda m: pytest.fail(m, pytrace=False),
                "xfail": pytest.xfail,
                "skip": pytest.skip,
            }[action](
                f"INCONCLUSIVE (the kernel was not checked where the bound is vacuous):\n{rep}"
            )
        return rep


@pytest.fixture
def kernel_harness(request) -> KernelHarness:
    """Check a kernel against its reference within its precision contract (:class:`KernelHarness`)."""
    action = request.config.getoption("svt_inconclusive") or request.config.getini(
        "svt_inconclusive"
    )
    return KernelHarness(inconclusive=action)
