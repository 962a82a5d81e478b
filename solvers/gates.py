"""Decay-gate parameterisations gamma = phi(z) and their log-space forms.

From the gate reparameterisation proposal (``papers/gate-reparameterization-proposal.md``,
"Mathematical Formulation" and "Theoretical Analysis"):

* ``sigmoid``:  ``phi(z) = 1 / (1 + e^{-z})``, ``phi' = phi (1 - phi)``.
* ``balanced``: ``phi(z) = max(0, 1 - 1/(a z^2 + b))`` (StableSSM's discrete-time form,
  default ``a = b = 1``), ``phi' = 2 a z / (a z^2 + b)^2`` where ``phi > 0``.
* ``softplus``: ``phi(z) = 1 - exp(-softplus(z))``. Since ``exp(-softplus(z)) = 1/(1 + e^z)``
  this *is* the sigmoid (``docs/errata.md``, gate proposal); it is kept under its printed
  name so that the identity is checked rather than assumed.

Every gate offers ``value``, ``derivative``, ``complement`` (``1 - phi``, computed without
cancellation, which matters for gates near 1), ``log_value`` (``log phi``, the form cumulative
decays are summed in: ``log prod gamma = sum log gamma`` neither underflows for gates near 0
nor rounds to 0 for gates near 1) and ``log_derivative`` (``d log phi / dz``).

Precision: each function evaluates its formula with elementary torch operations in
``Arith(z.dtype, bf16_mode).compute`` and rounds the result once to ``z.dtype``: in bf16
storage mode that is fp32 arithmetic with one rounding, in strict mode every operation is a
bf16 operation.
"""

from __future__ import annotations

import math

import torch

from . import validation as check
from ._arith import Arith


def _prepare(z, bf16_mode: str) -> tuple[Arith, torch.Tensor]:
    z = check.tensor("z", z)
    check.bf16_mode(bf16_mode)
    ar = Arith(z.dtype, bf16_mode)
    return ar, ar.up(z)


def _nonpositive(x: torch.Tensor) -> torch.Tensor:
    """``-|x|`` written as a branch, so that autograd's derivative at 0 is that of the x >= 0
    side (``abs`` has derivative 0 at 0, which would make d sigma/dz (0) come out 0)."""
    return torch.where(x >= 0, -x, x)


def _softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + e^x) = max(x, 0) + log1p(e^{-|x|})``, exact to a few ulps for every x.

    ``torch.nn.functional.softplus`` returns x itself above its threshold (20), a relative
    error of up to e^{-20}/20 ~ 1e-10: far above the float64 unit roundoff.
    """
    return torch.where(x >= 0, x, torch.zeros_like(x)) + torch.log1p(torch.exp(_nonpositive(x)))


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``1/(1 + e^{-x})`` evaluated so that no exponential overflows (also under autograd)."""
    e = torch.exp(_nonpositive(x))
    return torch.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


class SigmoidGate:
    """``phi = sigma(z)``; ``1 - phi = sigma(-z)``; ``log phi = -softplus(-z)``; ``d log phi/dz = sigma(-z)``."""

    name = "sigmoid"

    def value(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        return ar.store(_sigmoid(zc))

    def complement(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        return ar.store(_sigmoid(-zc))

    def derivative(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        # sigma(z) sigma(-z), not sigma (1 - sigma): for z >> 0, 1 - sigma rounds to 0.
        ar, zc = _prepare(z, bf16_mode)
        return ar.store(_sigmoid(zc) * _sigmoid(-zc))

    def log_value(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        return ar.store(-_softplus(-zc))

    def log_derivative(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        return ar.store(_sigmoid(-zc))


class SoftplusGate(SigmoidGate):
    """``phi = 1 - exp(-softplus(z))`` (the proposal's "exponential reparameterisation").

    ``exp(-softplus(z)) = 1/(1 + e^z) = sigma(-z)``, so ``phi = sigma(z)`` identically and all
    derived quantities are the sigmoid's. :meth:`printed_value` evaluates the formula as
    printed, ``1 - exp(-softplus(z))``, whose subtraction cancels catastrophically for gates
    near 0 (z << 0): the reason the log-space form exists.
    """

    name = "softplus"

    def printed_value(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        return ar.store(1.0 - torch.exp(-_softplus(zc)))


class BalancedGate:
    """``phi(z) = max(0, 1 - 1/(a z^2 + b))`` with ``a, b > 0`` (proposal, default ``a = b = 1``).

    With ``s = a z^2 + b`` and ``n = a z^2 + (b - 1)``: ``phi = max(0, n/s)`` (no cancellation
    near 0: the printed ``1 - 1/s`` rounds to 0 once ``a z^2 < u``), ``1 - phi = 1/s`` where
    ``phi > 0``, ``log phi = log1p(-1/s)`` near 1 and ``log n - log s`` elsewhere (``-inf``
    where phi = 0, e.g. z = 0 when b = 1), ``phi' = 2 a z / s^2`` and
    ``d log phi/dz = 2 a z / (s n)`` where phi > 0, and 0 where the max clips.
    """

    name = "balanced"

    def __init__(self, a: float = 1.0, b: float = 1.0):
        for label, p in (("a", a), ("b", b)):
            # a wrong type is a TypeError, a wrong value a ValueError (as solvers.validation);
            # a bool stays a ValueError, as tests/test_gates.py::test_balanced_parameters pins
            if not isinstance(p, (int, float)):
                raise TypeError(f"{label} must be a float, got {type(p).__name__}")
            if isinstance(p, bool) or not math.isfinite(p) or p <= 0:
                raise ValueError(f"{label} must be a finite float > 0, got {p!r}")
        self.a = float(a)
        self.b = float(b)

    def _parts(self, ar: Arith, zc: torch.Tensor):
        a = ar.scalar(self.a)
        az2 = a * (zc * zc)
        s = az2 + ar.scalar(self.b)
        n = az2 + ar.scalar(self.b - 1.0)  # b - 1 formed in float64, rounded once
        return s, n, n > 0

    def value(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        s, n, pos = self._parts(ar, zc)
        return ar.store(torch.where(pos, n / s, torch.zeros_like(s)))

    def complement(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        s, n, pos = self._parts(ar, zc)
        return ar.store(torch.where(pos, 1.0 / s, torch.ones_like(s)))

    def derivative(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        s, n, pos = self._parts(ar, zc)
        d = (2.0 * ar.scalar(self.a)) * zc / (s * s)
        return ar.store(torch.where(pos, d, torch.zeros_like(d)))

    def log_value(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        s, n, pos = self._parts(ar, zc)
        inv = 1.0 / s
        use_log1p = inv <= 0.5
        # Each branch only sees inputs it is accurate for, so that neither an unused value nor
        # its derivative (under autograd) can be infinite: log1p(-1) or log(0) would give NaN.
        near_one = torch.log1p(-torch.where(use_log1p, inv, torch.zeros_like(inv)))
        general = torch.log(torch.where(pos, n, torch.ones_like(n))) - torch.log(s)
        out = torch.where(use_log1p, near_one, general)
        return ar.store(torch.where(pos, out, torch.full_like(out, -math.inf)))

    def log_derivative(self, z, *, bf16_mode: str = "storage") -> torch.Tensor:
        ar, zc = _prepare(z, bf16_mode)
        s, n, pos = self._parts(ar, zc)
        safe_n = torch.where(pos, n, torch.ones_like(n))
        d = (2.0 * ar.scalar(self.a)) * zc / (s * safe_n)
        return ar.store(torch.where(pos, d, torch.zeros_like(d)))


GATES = {"sigmoid": SigmoidGate(), "balanced": BalancedGate(), "softplus": SoftplusGate()}


def gate_named(gate, *, needs=("value", "derivative")):
    """A gate object, or its name in :data:`GATES` (``"sigmoid"``, ``"balanced"``, ``"softplus"``)."""
    if isinstance(gate, str):
        if gate not in GATES:
            raise ValueError(f"gate must be one of {sorted(GATES)} or a gate object, got {gate!r}")
        return GATES[gate]
    missing = [m for m in needs if not callable(getattr(gate, m, None))]
    if missing:
        raise TypeError(
            f"gate must be a name in {sorted(GATES)} or a gate object with "
            f"{', '.join(needs)}; {type(gate).__name__} has no {', '.join(missing)}"
        )
    return gate


def gradient_over_weight(gate, z, *, bf16_mode: str = "storage") -> torch.Tensor:
    """``|phi'(z)| / phi(z)^2``, the "gradient scale" the proposal tabulates.

    Computed in float64 from the gate's working-precision derivative and value. For the
    balanced gate this is ``2 a |z| / (a z^2 + b - 1)^2``, not the printed ``2 a |z|``
    (``docs/errata.md``); it is ``inf`` where phi = 0. ``gate``: a gate or its name in :data:`GATES`.
    """
    gate = gate_named(gate)
    d = gate.derivative(z, bf16_mode=bf16_mode).to(torch.float64)
    v = gate.value(z, bf16_mode=bf16_mode).to(torch.float64)
    return d.abs() / (v * v)


def stable_gradient_scale(gate, z, *, bf16_mode: str = "storage") -> torch.Tensor:
    """``|phi'(z)| / (1 - phi(z))^2``: StableSSM's scale for a discrete-time decay.

    It is the quantity that equals ``2 a |z|`` for the balanced gate (where phi > 0) and
    ``e^z`` for the sigmoid. ``gate``: a gate or its name in :data:`GATES`.
    """
    gate = gate_named(gate, needs=("derivative", "complement"))
    d = gate.derivative(z, bf16_mode=bf16_mode).to(torch.float64)
    c = gate.complement(z, bf16_mode=bf16_mode).to(torch.float64)
    return d.abs() / (c * c)


def printed_balanced_gradient_scale(z, *, a: float = 1.0) -> torch.Tensor:
    """The proposal's printed claim ``|phi'(z)|/phi(z)^2 = 2 a |z|`` (kept to be refuted)."""
    return 2.0 * a * check.tensor("z", z).to(torch.float64).abs()


def cumulative_log_decay(log_gates, *, dim: int = -1, bf16_mode: str = "storage") -> torch.Tensor:
    """``G_t = sum_{i <= t} log gamma_i`` (GKA appendix D.2, the log-space cumulative decay).

    Summed sequentially in the compute dtype (strict bf16 rounds every partial sum) and
    rounded once. ``exp(G_t)`` underflows to 0 gracefully; ratios ``exp(G_c - G_j)`` of two
    underflowed products stay finite, where the direct ``prod gamma`` ratio gives 0/0.

    ``log_gates``: ``log gamma <= 0`` (gamma in [0, 1], as the GKA layer's g); ``dim``: an
    existing dimension of it.
    """
    g = check.tensor("log_gates", log_gates, min_ndim=1)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -g.ndim <= dim < g.ndim:
        raise ValueError(
            f"dim must lie in [{-g.ndim}, {g.ndim - 1}] for log_gates of shape {tuple(g.shape)}, got {dim}"
        )
    # the wording of solvers.gka.validate_gates: a positive log gate is a growing "decay"
    if g.numel() and bool((g > 0).any()):
        raise ValueError(
            f"log_gates = log gamma must be <= 0 (gamma in [0, 1]), got max {float(g.max())}"
        )
    check.bf16_mode(bf16_mode)
    ar = Arith(g.dtype, bf16_mode)
    return ar.store(cumsum_compute(ar, ar.up(g).movedim(dim, -1))).movedim(-1, dim)


def cumsum_compute(ar: Arith, x: torch.Tensor) -> torch.Tensor:
    """Cumulative sum over the last dimension in ``ar``'s compute dtype, not stored; in strict
    bf16 every partial sum is rounded (``torch.cumsum`` on bf16 accumulates in fp32)."""
    if not ar.strict:
        return torch.cumsum(x, dim=-1)
    parts = [x[..., :1]]
    for t in range(1, x.shape[-1]):
        parts.append(parts[-1] + x[..., t : t + 1])
    return torch.cat(parts, dim=-1)
