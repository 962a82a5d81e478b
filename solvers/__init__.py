"""Reference solvers: plain PyTorch, batched over leading dimensions, float64 / float32 /
bfloat16 (storage or strict mode). See docs/api.md and docs/precision.md.

Each public function validates its inputs once, never modifies them, and can return a
history record (``return_info=True``) with a :class:`Status`.
"""

from ._arith import Arith, unit_roundoff
from ._info import SolveInfo, Status
from .cg import cg
from .chebyshev import chebyshev, chebyshev_weights
from .chebyshev_backward import ChebyshevSolve, algorithm2_as_printed, chebyshev_backward, chebyshev_solve
from .gradient import agd, gd
from .kaczmarz import kaczmarz
from .kla import (
    forward_substitution,
    kaczmarz_coefficient,
    kla_chunk_outputs,
    kla_chunk_system,
    kla_chunkwise,
    kla_recurrent,
    wy_matrices,
    wy_representation,
)
from .ridge import Fig1aProblems, RidgeSystem, fig1a_problems, gka_ridge

__all__ = [
    "Arith",
    "ChebyshevSolve",
    "Fig1aProblems",
    "RidgeSystem",
    "SolveInfo",
    "Status",
    "agd",
    "algorithm2_as_printed",
    "cg",
    "chebyshev",
    "chebyshev_backward",
    "chebyshev_solve",
    "chebyshev_weights",
    "fig1a_problems",
    "gd",
    "forward_substitution",
    "gka_ridge",
    "kaczmarz",
    "kaczmarz_coefficient",
    "kla_chunk_outputs",
    "kla_chunk_system",
    "kla_chunkwise",
    "kla_recurrent",
    "unit_roundoff",
    "wy_matrices",
    "wy_representation",
]
