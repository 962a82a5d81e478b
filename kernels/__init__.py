"""Triton kernels mirroring ``solvers``: same names, arguments and results.

Each kernel keeps one system's matrix on chip across all iterations, iterates and
accumulates in float32 and takes float32 or bfloat16 inputs with D <= 128 (docs/api.md).
"""

from .cg import cg
from .chebyshev import chebyshev
from .chebyshev_adaptive import chebyshev_adaptive
from .chebyshev_backward import chebyshev_backward, chebyshev_solve
from .gka_chunk import chunkwise_frobenius
from .gradient import agd, gd
from .kla import kla_chunkwise
from .koopman import koopman_readout

__all__ = ["agd", "cg", "chebyshev", "chebyshev_adaptive", "chebyshev_backward", "chebyshev_solve", "chunkwise_frobenius", "gd", "kla_chunkwise", "koopman_readout"]
from .kla_backward import kla_chunkwise_trainable  # noqa: E402  (backward of kla_chunkwise)

__all__ += ["kla_chunkwise_trainable"]
