"""Plain-PyTorch emulations of precision contracts: what a kernel honouring a contract computes.

Each function runs one algorithm with the roundings its :class:`solvers.contracts.Contract`
declares, and nothing else: operands of every product rounded to ``contract.operands`` (bf16:
``x.to(bfloat16)`` before ``H x``, as GKA's chunked Chebyshev kernel and fla's MesaNet CG do;
tf32 by truncating the significand, as Triton does on Hopper; tf32x3 by its rounded two-term
tf32 split), sums and updates in ``contract.accumulate``, the intermediates named in
``contract.stored`` rounded to ``contract.storage`` when stored. The harness's own tests hold them to their contracts' bounds (tests/test_harness_matrix.py) and
catch deliberately broken variants (``broken=``) under every contract.

Signatures follow the references: ``chebyshev(H, q, *, L, mu, iters, contract)``, ``gd``,
``agd``, ``cg(H, q, *, iters, contract)``, ``gka_ridge(H, q, *, a, iters, contract)``,
``kla(q, k, v, *, alpha, eta, eps, chunk_size, contract)``; :func:`bind` fixes the contract.
Inputs are checked as the references check theirs (``solvers.validation``: a ValueError or
TypeError naming the argument); the result has the contract's ``output`` dtype when it
declares one, else the inputs' dtype.

Broken variants (``broken=``): ``"half"`` (half the iterations), ``"scaled"`` (output x 0.9),
``"omega0"`` (Chebyshev with omega_0 = 1 instead of 2), ``"fro_squared"`` (ridge lambda =
a ||H||_F^2), ``"no_key_norm"`` (KLA with beta = eta, no 1/||k||^2).
"""

from __future__ import annotations

import functools

import torch

from solvers import validation as check
from solvers.contracts import Contract, parse
from solvers.solve_info import power_of_two_scale

_F32 = torch.float32
BROKEN = ("half", "scaled", "omega0", "fro_squared", "no_key_norm")
# the broken variants each emulation implements: any other would silently run the correct
# algorithm, and a "broken" variant that PASSes (or one that crashes, which FAILs) tells nothing
_BROKEN_OF = {
    "chebyshev": ("half", "scaled", "omega0"),
    "gd": ("half", "scaled"),
    "agd": ("half", "scaled"),
    "cg": ("half", "scaled"),
    "gka_ridge": ("half", "scaled", "omega0", "fro_squared"),
    "kla": ("scaled", "no_key_norm"),
}


def _broken(fn: str, broken):
    allowed = _BROKEN_OF[fn]
    if broken is not None and (not isinstance(broken, str) or broken not in allowed):
        raise ValueError(f"broken must be None or one of {allowed} for {fn}, got {broken!r}")
    return broken


def _contract(contract) -> Contract:
    """``parse``, its error naming the ``contract`` argument (a bad ``;key=value`` change
    otherwise reads "operands must be ...", naming no argument)."""
    try:
        return parse(contract)
    except (TypeError, ValueError) as e:
        if "contract" in str(e):
            raise
        raise type(e)(f"contract {contract!r}: {e}") from None


def _system(H, q, L=None, mu=None, *, bounds=True):
    """The references' checks (``solvers.system.prepare``): H square, q matching, both finite
    floating tensors of one dtype; ``L >= mu > 0`` finite, as float64 tensors over the batch.
    Without them a NaN, a mismatched shape or L < mu gave a silent NaN, garbage or a deep
    torch error, and an integer q an integer result of zeros."""
    H = check.square_matrix("H", H)
    q = check.rhs("q", q, "H", H)
    if not bounds:
        return None, None
    batch = check.batch_shape("H and q", H.shape[:-2], q.shape[:-1])
    L64 = check.parameter("L", L, batch, H.device)
    mu64 = check.parameter("mu", mu, batch, H.device)
    check.spectrum_bounds(L64, mu64)
    return L64, mu64


def _float32_and_bits(x, bits):
    """x as a contiguous float32 tensor and ``0 <= bits <= 23`` checked: a float32 has 23
    significand bits; beyond, the shifts of the callers are negative (a bare torch error)."""
    x = check.floating("x", x, min_ndim=0, finite_values=False).to(_F32).contiguous()
    bits = check.count("bits", bits)
    if bits > 23:
        raise ValueError(f"bits must be <= 23 (float32's significand), got {bits}")
    return x, bits


def round_significand(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round float32 values to ``bits`` explicit significand bits (round to nearest even): tf32
    keeps 10, bf16 7; ``0 <= bits <= 23`` (23: float32 itself)."""
    x, bits = _float32_and_bits(x, bits)
    drop = 23 - bits
    if drop == 0:
        return x.clone()
    i = x.view(torch.int32)
    half = (1 << (drop - 1)) - 1
    lsb = (i >> drop) & 1
    r = ((i + half + lsb) >> drop) << drop
    return torch.where(torch.isfinite(x), r.view(_F32), x)


def truncate_significand(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Cut float32 values to ``bits`` explicit significand bits, toward zero: what Triton's tf32
    ``tl.dot`` does to float32 operands on Hopper (docs/validation.md, run 35;
    tests/test_tf32_operand_rounding.py). ``0 <= bits <= 23``."""
    x, bits = _float32_and_bits(x, bits)
    mask = ~((1 << (23 - bits)) - 1)
    cut = (x.view(torch.int32) & mask).view(_F32)
    return torch.where(torch.isfinite(x), cut, x)


class _Arith:
    """The roundings of one contract on float32 tensors."""

    def __init__(self, contract: Contract):
        self.c = _contract(contract)
        self.acc = self.c.accumulate if self.c.accumulate != torch.bfloat16 else _F32

    def operand(self, x):
        op = self.c.operands
        if op == "bf16":
            return x.to(torch.bfloat16).to(self.acc)
        if (
            op == "tf32"
        ):  # as Triton's tf32 tl.dot on Hopper: truncated (the contract's u covers it)
            return truncate_significand(x, 10).to(self.acc)
        if op == "tf32x3":
            # each operand replaced by its two-term tf32 split hi + lo (|x - hi - lo| <= 2^-22 |x|,
            # hi and lo rounded to 10 bits); the product below then forms all four partial
            # products, where Triton's tf32x3 drops lo*lo (at most 2^-22 of the product): both
            # within the contract's unit u_op = 2^-22 per operand
            hi = round_significand(x, 10)
            lo = round_significand(x.to(_F32) - hi, 10)
            return (hi + lo).to(self.acc)
        return x.to(self.acc)

    def acc_round(self, x):
        """Strict bf16 contracts round every elementwise result to bf16."""
        return x.to(torch.bfloat16).to(self.acc) if self.c.accumulate == torch.bfloat16 else x

    def store(self, what: str, x):
        return x.to(self.c.storage).to(self.acc) if self.c.stores(what) else x

    def matvec(self, H, x):
        return self.acc_round((self.operand(H) @ self.operand(x).unsqueeze(-1)).squeeze(-1))

    def dot(self, x, y):
        return self.acc_round((self.operand(x) * self.operand(y)).sum(-1))

    def scalar(self, v, like):
        return torch.as_tensor(v, dtype=torch.float64, device=like.device).to(self.acc)


def _out(x, like, broken, ar):
    x = x * 0.9 if broken == "scaled" else x
    # the contract's output dtype when it declares one (``;output=float32``), else the inputs'
    return x.to(ar.c.output or like.dtype)


def _steps(iters: int, broken) -> int:
    return iters // 2 if broken == "half" else iters


def chebyshev(H, q, *, L, mu, iters: int, contract="bfloat16/operands", broken=None, shift=None):
    """GKA Algorithm 1 under ``contract`` (``shift``: solve ``(H + shift I) x = q``, the shift
    applied as ``H x + shift x`` with x in the accumulation dtype)."""
    iters = check.count("iters", iters)
    broken = _broken("chebyshev", broken)
    ar = _Arith(contract)
    L64, mu64 = _system(H, q, L, mu)
    if shift is not None:
        shift = check.parameter("shift", shift, L64.shape, H.device)
    Hc, qc = H.to(ar.acc), q.to(ar.acc)
    step = ar.scalar(2.0 / (L64 + mu64), Hc).unsqueeze(-1)
    rho2 = ar.scalar(((L64 - mu64) / (L64 + mu64)) ** 2, Hc)
    lam = None if shift is None else ar.scalar(shift, Hc).unsqueeze(-1)
    prev = torch.zeros_like(qc)
    xi = ar.store("iterate", ar.acc_round(step * qc))
    omega = torch.full_like(rho2, 1.0 if broken == "omega0" else 2.0)
    for _ in range(_steps(iters, broken)):
        # solvers.omega_schedule's recurrence, typed out on purpose: each operation rounds as the contract says
        omega = ar.acc_round(4.0 / (4.0 - rho2 * omega))
        w = omega.unsqueeze(-1)
        Hx = ar.matvec(Hc, xi) + (0 if lam is None else lam * xi)
        g = ar.acc_round(Hx - qc)
        new = ar.acc_round(xi - ar.acc_round(w * step) * g) + ar.acc_round((w - 1.0) * (xi - prev))
        prev, xi = xi, ar.store("iterate", ar.acc_round(new))
    return _out(xi, q, broken, ar)


def gd(H, q, *, L, mu, iters: int, contract="bfloat16/operands", broken=None):
    """Gradient descent, step 2/(L + mu), from 0."""
    iters = check.count("iters", iters)
    broken = _broken("gd", broken)
    ar = _Arith(contract)
    L64, mu64 = _system(H, q, L, mu)
    Hc, qc = H.to(ar.acc), q.to(ar.acc)
    step = ar.scalar(2.0 / (L64 + mu64), Hc).unsqueeze(-1)
    x = torch.zeros_like(qc)
    for _ in range(_steps(iters, broken)):
        x = ar.store("iterate", ar.acc_round(x - step * ar.acc_round(ar.matvec(Hc, x) - qc)))
    return _out(x, q, broken, ar)


def agd(H, q, *, L, mu, iters: int, contract="bfloat16/operands", broken=None):
    """Nesterov's method, step 1/L, momentum (sqrt(kappa) - 1)/(sqrt(kappa) + 1), from 0."""
    iters = check.count("iters", iters)
    broken = _broken("agd", broken)
    ar = _Arith(contract)
    L64, mu64 = _system(H, q, L, mu)
    Hc, qc = H.to(ar.acc), q.to(ar.acc)
    sk = torch.sqrt(L64 / mu64)
    step = ar.scalar(1.0 / L64, Hc).unsqueeze(-1)
    beta = ar.scalar((sk - 1.0) / (sk + 1.0), Hc).unsqueeze(-1)
    x = prev = torch.zeros_like(qc)
    for _ in range(_steps(iters, broken)):
        y = ar.store("iterate", ar.acc_round(x + beta * (x - prev)))
        prev, x = (
            x,
            ar.store("iterate", ar.acc_round(y - step * ar.acc_round(ar.matvec(Hc, y) - qc))),
        )
    return _out(x, q, broken, ar)


def cg(H, q, *, iters: int, contract="bfloat16/operands", broken=None):
    """Conjugate gradients from 0 (Hestenes-Stiefel), operands of ``H p`` and of the inner
    products rounded by the contract (fla's MesaNet CG: bf16), with ``kernels.cg``'s guards:
    q scaled by one power of two for the batch, and a system frozen (alpha = beta = 0, p and
    ``r^T r`` kept) once ``r^T r <= (u ||q||)^2``, the rounding floor, or once ``p^T H p <= 0``.

    Without the freeze the recursive residual goes on shrinking past the floor into float32's
    subnormals within 2D steps (D = 128 at kappa 4-10; D = 64 with q of order 2^-40, which the
    scaling now makes the same run as q of order 1): there ``r^T r`` and ``p^T H p`` keep a few
    bits, alpha and beta come out wrong (beta > 1) and the iterate diverged (measured up to
    4e16 ``||x*||_A``; tests/test_emulate_cg_floor.py), which the kernel's guard prevents."""
    iters = check.count("iters", iters)
    broken = _broken("cg", broken)
    ar = _Arith(contract)
    _system(H, q, bounds=False)
    Hc, qc = H.to(ar.acc), q.to(ar.acc)
    # kernels.cg: CG is homogeneous in (q, x), so it runs on q scaled by one power of two for
    # the batch (exact: every rounding is the unscaled run's) and ||q||^2 stays in range
    scale = power_of_two_scale(qc, dim=None, inverse=True)
    qs = qc * scale
    x = torch.zeros_like(qs)
    r = ar.store("residual", qs)
    p = ar.store("direction", r)
    rr = ar.dot(r, r)
    # kernels.cg's cg_kernel (fixed count, no tolerance): floor (u ||q||)^2 with u the
    # accumulation's roundoff and ||q|| summed unrounded in the accumulation dtype; done at
    # the floor, broken where p^T H p <= 0 above it, and a done or broken system frozen
    floor = (ar.c.u_acc * torch.sqrt((qs * qs).sum(-1))) ** 2
    done = rr <= floor
    broke = rr < 0
    for _ in range(_steps(iters, broken)):
        Ap = ar.matvec(Hc, p)
        pAp = ar.dot(p, Ap)
        stalled = ~done & (pAp <= 0)
        done = done | (stalled & (rr <= floor))
        broke = broke | (stalled & (rr > floor))
        active = ~done & ~broke
        alpha = torch.where(
            active, rr / torch.where(active, pAp, torch.ones_like(pAp)), torch.zeros_like(pAp)
        )
        # alpha = 0 leaves a frozen system's x and r as they are (both already stored values)
        x = ar.store("iterate", ar.acc_round(x + alpha.unsqueeze(-1) * p))
        r = ar.store("residual", ar.acc_round(r - alpha.unsqueeze(-1) * Ap))
        rr_new = ar.dot(r, r)
        beta = torch.where(
            active, rr_new / torch.where(active, rr, torch.ones_like(rr)), torch.zeros_like(rr)
        )
        p_new = ar.store("direction", ar.acc_round(r + beta.unsqueeze(-1) * p))
        p = torch.where(active.unsqueeze(-1), p_new, p)
        rr = torch.where(active, rr_new, rr)
        done = done | (active & (rr <= floor))
    return _out(x / scale, q, broken, ar)


def gka_ridge(H, q, *, a: float, iters: int, contract="bfloat16/operands", broken=None):
    """GKA eq. (4) in the kernel: ``||H||_F`` in the accumulation dtype, lambda = a ||H||_F
    (``broken="fro_squared"``: a ||H||_F^2), L = ||H||_F + lambda, mu = lambda, then Algorithm 1
    on ``H + lambda I``."""
    # solvers.gka_ridge's checks: without them a <= 0, a NaN or a zero H gave NaN or garbage
    iters = check.count("iters", iters)
    a = check.ridge_strength(a)
    broken = _broken("gka_ridge", broken)
    ar = _Arith(contract)
    _system(H, q, bounds=False)
    fro = torch.linalg.matrix_norm(H.to(ar.acc)).to(torch.float64)
    if fro.numel() and not bool((fro > 0).all()):
        raise ValueError("H has zero Frobenius norm in some system: lambda = a ||H||_F would be 0")
    if not bool(torch.isfinite(fro).all()):
        raise ValueError(f"H's Frobenius norm overflows {ar.acc} in some system")
    lam = a * fro**2 if broken == "fro_squared" else a * fro
    return chebyshev(
        H,
        q,
        L=fro + lam,
        mu=lam,
        iters=iters,
        contract=contract,
        shift=lam,
        broken=None if broken == "fro_squared" else broken,
    )


def kla(
    q,
    k,
    v,
    *,
    alpha,
    eta,
    eps: float = 1e-6,
    chunk_size: int = 64,
    normalize_queries: bool = True,
    contract="bfloat16/storage",
    broken=None,
):
    """KLA chunk by chunk (``solvers.kla_chunkwise``) in the references' arithmetic that covers
    the contract (``analysis.bounds.contract.arith_of``: stored bf16 intermediates); ``broken=
    "no_key_norm"`` uses beta = eta (the gated delta rule without KLA's 1/||k||^2)."""
    import solvers
    from analysis.bounds.contract import arith_of

    broken = _broken("kla", broken)
    c = _contract(contract)
    for name, x in (("q", q), ("k", k), ("v", v)):  # an integer input gave an integer result
        check.tensor(name, x)
    arith = arith_of(c)
    dt = arith.dtype
    coefficient = "gdn" if broken == "no_key_norm" else "kaczmarz"
    o, S = solvers.kla_chunkwise(
        q.to(dt),
        k.to(dt),
        v.to(dt),
        alpha=alpha,
        eta=eta,
        eps=eps,
        chunk_size=chunk_size,
        normalize_queries=normalize_queries,
        bf16_mode=arith.mode,
        coefficient=coefficient,
    )
    if broken == "scaled":
        o = o * 0.9
    out = c.output or q.dtype  # the contract's output dtype when it declares one
    return o.to(out), S.to(out)


def bind(fn, contract, broken=None):
    """``fn`` with its contract (and broken variant) fixed, named for reports."""
    c = _contract(contract)
    if getattr(fn, "__module__", None) == __name__ and fn.__name__ in _BROKEN_OF:
        # now, not at the first call: inside the harness that call's error would be a FAIL,
        # which is what a broken variant is expected to give
        _broken(fn.__name__, broken)
    g = functools.partial(fn, contract=contract, broken=broken)
    g.__module__ = __name__
    g.__qualname__ = f"{fn.__name__}[{c.name}{', ' + broken if broken else ''}]"
    return g


__all__ = [
    "BROKEN",
    "agd",
    "bind",
    "cg",
    "chebyshev",
    "gd",
    "gka_ridge",
    "kla",
    "round_significand",
]
