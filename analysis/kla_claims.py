"""Deprecated: the KLA statements moved to :mod:`proofs_check.kla_gaps` (and are claims of the
catalogue, :mod:`proofs_check.claims.kla`). This module re-exports them for one release."""

import warnings

warnings.warn("analysis.kla_claims moved to proofs_check.kla_gaps; import it from there", DeprecationWarning,
              stacklevel=2)

from proofs_check.kla_gaps import (PROP5_FORMS, PROP6_FORMS, chunkwise_gap, proposition1, proposition2,  # noqa: E402
                                   proposition5_gap, proposition6_gap, state_split_gap, table6_gap, theorem1)

__all__ = ["PROP5_FORMS", "PROP6_FORMS", "chunkwise_gap", "proposition1", "proposition2", "proposition5_gap",
           "proposition6_gap", "state_split_gap", "table6_gap", "theorem1"]
