"""Verification rows for gradient descent (step 2/(L+mu)) and Nesterov's AGD in every precision.

Truncation: GD's replay against ``max |1 - step lam|^i`` over the stored spectrum
(``gd_bound_for_step``, equal to ``((kappa-1)/(kappa+1))^i`` for exact constants); AGD's
against Nesterov's ``sqrt((kappa+1)(1-1/sqrt kappa)^i)`` (``agd_bound``). Rounding: every
iterate against the allowance.
"""

from ._solver_rows import rows_for


def rows(quick: bool) -> list:
    return rows_for(("gd", "agd"), quick)
