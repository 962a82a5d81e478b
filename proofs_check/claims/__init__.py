"""Claim modules, one per paper (``gka``, ``gka_backward``, ``kla``, ``echo``, ``gates``) plus
``reported`` (the numbers the papers print: tables, ratios, state sizes). Each declares its claims
on import with :func:`proofs_check.registry.claim` (a decorator on the check, whose docstring is
the statement), :func:`proofs_check.registry.erratum` (a printed statement and our correction)
and :func:`proofs_check.registry.not_checkable`."""
