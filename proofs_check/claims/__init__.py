"""Claim modules, one per paper (``gka``, ``gka_backward``, ``kla``, ``echo``, ``gates``) plus
``reported`` (the numbers the papers print: tables, ratios, state sizes). Each registers its
claims with :func:`proofs_check.registry.register` on import."""
