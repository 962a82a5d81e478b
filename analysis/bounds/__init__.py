"""Error bounds: a-priori, running (a-posteriori) and per precision contract, per family.

``iterative`` (a-priori bounds of Chebyshev, CG, GD, AGD), ``running`` (running rounding bounds
of those solvers), ``contract`` (running bounds of a kernel that declares a precision contract),
``cholesky``, ``kaczmarz`` (Kaczmarz and KLA), ``kla_kernel``, ``gka_layer`` (the GKA layer's
chunkwise kernels, per token), ``gka_layer_output`` (the same for the layer's output y),
``gka_layer_grad`` (the backward's dq solve),
``reverse_backward`` (the reverse Chebyshev backward, GKA Algorithm 2), ``koopman`` (the SKA
readout), and ``checks`` (a run held to its bounds at every iterate).
"""

import importlib as _importlib
import warnings as _warnings


def __getattr__(name):
    # ``analysis.bounds`` was the module of the a-priori bounds before it became this package
    iterative = _importlib.import_module("analysis.bounds.iterative")
    if name.startswith("__") or not hasattr(iterative, name):
        raise AttributeError(f"module 'analysis.bounds' has no attribute {name!r}")
    _warnings.warn(
        f"analysis.bounds.{name} moved to analysis.bounds.iterative.{name}; the old name works "
        "until the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(iterative, name)
