"""Exact (mpmath) reference functions of the decay-gate parameterisations (solvers/gates.py).

Shared by the gate tests and the verification table, so both hold the working-precision
gates to the same ground truth. Evaluate inside ``analysis.references.mp.precision()`` (>= 50 digits).
"""

from __future__ import annotations

import mpmath

from solvers.gates import BalancedGate, SigmoidGate, SoftplusGate


def exact_gate_functions(gate) -> dict:
    """``value``, ``derivative``, ``complement``, ``log_value``, ``log_derivative`` of ``gate``
    as functions of an mpf ``z``.

    BalancedGate: phi(z) = max(0, 1 - 1/(a z^2 + b)); SigmoidGate: 1/(1 + e^-z);
    SoftplusGate: the printed form 1 - exp(-softplus(z)) (exactly the sigmoid, which the
    checks then observe rather than assume; its derivative is s(1 - s) of that value).
    """
    if not isinstance(gate, (BalancedGate, SigmoidGate)):
        raise TypeError(
            f"gate must be a solvers.gates BalancedGate, SigmoidGate or SoftplusGate, "
            f"got {type(gate).__name__}"
        )
    if isinstance(gate, BalancedGate):
        a, b = mpmath.mpf(gate.a), mpmath.mpf(gate.b)

        def val(z):
            return max(mpmath.mpf(0), 1 - 1 / (a * z * z + b))

        def der(z):
            return 2 * a * z / (a * z * z + b) ** 2 if val(z) > 0 else mpmath.mpf(0)

    else:
        printed = isinstance(gate, SoftplusGate)

        def val(z):
            return (
                1 - mpmath.exp(-mpmath.log(1 + mpmath.exp(z)))
                if printed
                else 1 / (1 + mpmath.exp(-z))
            )

        def der(z):
            s = val(z)
            return s * (1 - s)

    def comp(z):
        return 1 - val(z)

    def logv(z):
        v = val(z)
        return mpmath.log(v) if v > 0 else -mpmath.inf

    def logd(z):
        v = val(z)
        return der(z) / v if v > 0 else mpmath.mpf(0)

    return {
        "value": val,
        "derivative": der,
        "complement": comp,
        "log_value": logv,
        "log_derivative": logd,
    }
