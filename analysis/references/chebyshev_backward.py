"""Ground truth, bounds and the stability study of the Chebyshev backward pass (GKA App. E.1).

* :func:`spd_problem`: a test system with a known spectrum, stored in the working dtype, and
  the exact eigenvalue bounds L, mu *of the stored matrix* (so rounding H cannot push its
  spectrum outside [mu, L]).
* :func:`mp_adjoint`: GKA Algorithm 1 and its exact adjoint (eqs. (44)-(48)) replayed in
  mpmath on the inputs as stored: the gradient of the truncated loop without rounding.
* Bounds: :func:`reversal_amplification` (A_r, the growth of rounding errors in the
  reversed recurrence (49)), :func:`omega_recovery_amplification` (Gamma_r, the growth in the
  reversed schedule (47)), :func:`implicit_dH_gap_bound` (how far the implicit dH of GKA
  Table 1 is from the truncated loop's dH in exact arithmetic).
* :func:`stability_table` and the CLI ``python -m analysis.references.chebyshev_backward --table`` /
  ``--errata`` (the numbers of docs/chebyshev_backward.md and docs/errata.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mpmath
import torch

import solvers
from analysis.argtypes import OneLineParser
from analysis.precision import PRECISIONS, Arith
from analysis.references import mp
from solvers import validation as _v

METHODS = ("autograd", "implicit", "reverse", "reverse_stored_omega")
KAPPAS = (10.0, 51.0, 1e3)
ITERS = (5, 10, 20, 30, 50)


@dataclass
class Problem:
    """``H xi = q`` with cotangent ``g``, all stored in ``dtype``; L, mu bound H's spectrum."""

    H: torch.Tensor
    q: torch.Tensor
    g: torch.Tensor
    L: float
    mu: float

    @property
    def kappa(self) -> float:
        return self.L / self.mu


def _spectrum(L, mu, iters) -> int:
    """``L >= mu > 0`` finite reals and ``iters`` an int >= 0 (as solvers.chebyshev takes them)."""
    L, mu = _v.real("L", L), _v.real("mu", mu)
    _v.spectrum_bounds(
        torch.tensor(float(L), dtype=torch.float64), torch.tensor(float(mu), dtype=torch.float64)
    )
    return _v.count("iters", iters)


def spd_problem(D: int, kappa: float, dtype: torch.dtype, seed: int = 0) -> Problem:
    """Eigenvalues geometrically spaced in [1/kappa, 1] (both ends hit), random eigenvectors.

    H is rounded to ``dtype`` entrywise (it stays symmetric); L and mu are the extreme
    eigenvalues of the *stored* H computed in float64, widened by 4 float64 ulps so that the
    stored spectrum lies in [mu, L]. Raises ValueError if rounding made H indefinite (bf16 with
    kappa u_store >~ 1).
    """
    D, kappa = _v.count("D", D, minimum=1), _v.real("kappa", kappa, low=1.0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))
    ev = torch.logspace(-math.log10(kappa), 0.0, D, dtype=torch.float64)
    H = (Q * ev) @ Q.T
    H = ((H + H.T) / 2).to(dtype)  # exactly symmetric in float64, and rounding keeps it so
    q = torch.randn(D, generator=gen, dtype=torch.float64).to(dtype)
    g = torch.randn(D, generator=gen, dtype=torch.float64).to(dtype)
    lam = torch.linalg.eigvalsh(H.to(torch.float64))
    mu, L = float(lam[0]) * (1 - 2**-50), float(lam[-1]) * (1 + 2**-50)
    if mu <= 0:
        raise ValueError(f"H rounded to {dtype} is not positive definite (kappa = {kappa})")
    return Problem(H, q, g, L, mu)


@dataclass
class MpAdjoint:
    """The truncated loop and its exact gradient in mpmath (columns; ``dH`` is D x D)."""

    x: mpmath.matrix
    dq: mpmath.matrix
    dH: mpmath.matrix
    iterates: list
    omegas: list

    def tensors(self):
        """``(x, dq, dH)`` as float64 tensors (each rounded once)."""
        return (
            mp.to_tensor(self.x, vector=True),
            mp.to_tensor(self.dq, vector=True),
            mp.to_tensor(self.dH),
        )


def mp_adjoint(
    H: torch.Tensor,
    q: torch.Tensor,
    g: torch.Tensor,
    L: float,
    mu: float,
    iters: int,
    dps: int = mp.DPS,
) -> MpAdjoint:
    """GKA Algorithm 1 and the exact reverse-mode adjoint (46), (48) at ``dps`` digits.

    xi_i = A_i xi_{i-1} + b_i xi_{i-2} + c_i q (eq. (44)); lambda_r = g,
    lambda_{i-1} = A_i^T lambda_i + b_{i+1} lambda_{i+1}; dq = sum_i c_i lambda_i with
    c_0 = 2/(L+mu); dH = -sum_{i>=1} c_i lambda_i xi_{i-1}^T. One system (no batch). The weights
    are typed out in mpmath on purpose, independent of ``solvers.omega_schedule`` (an exact reference).
    """
    # L < mu, mu <= 0 or iters < 0 silently replayed another (or no) loop, NaN gave NaN, and a
    # size mismatch raised mpmath's error
    iters, dps = _spectrum(L, mu, iters), _v.count("dps", dps, minimum=1)
    H = _v.square_matrix("H", H)
    if H.ndim != 2 or H.shape[-1] == 0:
        raise ValueError(f"H must be one D x D matrix with D >= 1, got shape {tuple(H.shape)}")
    for name, x in (("q", q), ("g", g)):
        x = _v.tensor(name, x, min_ndim=1)
        if tuple(x.shape) != (H.shape[-1],):
            raise ValueError(f"{name} must have shape ({H.shape[-1]},), got {tuple(x.shape)}")
    with mp.precision(dps):
        Hm, qm, gm = mp.to_mp(H), mp.to_mp(q), mp.to_mp(g)
        Lm, mum = mpmath.mpf(L), mpmath.mpf(mu)
        step = 2 / (Lm + mum)
        rho2 = ((Lm - mum) / (Lm + mum)) ** 2
        D = Hm.rows
        omegas = [mpmath.mpf(2)]
        xis = [mpmath.matrix(D, 1), step * qm]  # xi_{-1}, xi_0
        for _ in range(iters):
            w = 4 / (4 - rho2 * omegas[-1])
            omegas.append(w)
            c = w * step
            xis.append(w * xis[-1] - c * (Hm * xis[-1]) - (w - 1) * xis[-2] + c * qm)
        lam, lam_next = gm, mpmath.matrix(D, 1)
        dq, dH = mpmath.matrix(D, 1), mpmath.matrix(D, D)
        for i in range(iters, 0, -1):
            w = omegas[i]
            c = w * step
            dq += c * lam
            dH -= c * (lam * xis[i].T)  # xis[i] is xi_{i-1} (xis[0] is xi_{-1})
            b_next = -(omegas[i + 1] - 1) if i < iters else 0
            lam, lam_next = w * lam - c * (Hm.T * lam) + b_next * lam_next, lam
        dq += step * lam
        return MpAdjoint(xis[-1], dq, dH, xis[1:], omegas)


def _weights64(L: float, mu: float, iters: int) -> torch.Tensor:
    return solvers.chebyshev_weights(L, mu, iters)


def reversal_amplification(L: float, mu: float, iters: int) -> float:
    """A_r = prod_{i=2..r} (omega_i - 1)^(-1/2): growth of rounding errors rebuilt by eq. (49).

    The step (xi_{i-1}, xi_{i-2}) -> (xi_i, xi_{i-1}) of (44) is, on each eigenvector of H, a
    2x2 matrix with determinant omega_i - 1 whose two eigenvalues have equal modulus
    sqrt(omega_i - 1) for every eigenvalue in [mu, L] (|1 - 2 lambda/(L+mu)| <= rho and
    omega_i^2 rho^2 <= 4 (omega_i - 1), i.e. the roots are complex or double). Running it
    backwards multiplies an error by (omega_i - 1)^(-1/2) per step; omega_i - 1 -> R_a^2 (Lemma
    3's omega_1* - 1 = R_a^2), so A_r ~ R_a^(-r). Step i = 1 is not inverted (xi_{-1} = 0).
    """
    om = _weights64(L, mu, iters)
    return float(torch.prod((om[2:] - 1.0) ** -0.5)) if iters >= 2 else 1.0


def omega_recovery_amplification(L: float, mu: float, iters: int) -> float:
    """Gamma_r = sum_{k=1..r} prod_{i=2..k} 4/(rho^2 omega_i^2): growth of rounding in (47)/(52).

    The reversed schedule nu_{i-1} = 4/rho^2 (1 - 1/nu_i) has derivative 4/(rho^2 nu^2); at the
    forward's fixed point omega_1* it equals omega_2*/omega_1* = R_a^-2 > 1, so omega_1* repels
    the reversed map. A rounding error made at level k (in the forward's omega_k or the reverse
    step that computes nu_k) reaches nu_1 multiplied by prod_{i=2..k} 4/(rho^2 omega_i^2); summing
    over k gives Gamma_r ~ R_a^(-2r), and ``|nu_1 - omega_1| <~ c u_acc Gamma_r omega_1``. Once
    u_acc Gamma_r >~ 1 the recovered weights carry no information.
    """
    om = _weights64(L, mu, iters)
    rho2 = ((L - mu) / (L + mu)) ** 2
    if iters < 1:
        return 0.0
    growth = torch.cumprod(4.0 / (rho2 * om[2:] ** 2), dim=0)
    return float(1.0 + growth.sum())


def truncation_eps(L: float, mu: float, iters: int) -> float:
    """epsilon_r = 1 / T_{r+1}(1/rho): the residual polynomial of xi_r is bounded by it on [mu, L]."""
    iters = _spectrum(L, mu, iters)  # iters = -1 gave 1, mu = 0 gave 1, L < mu math's error
    rho = (L - mu) / (L + mu)
    return 0.0 if rho == 0 else 1.0 / math.cosh((iters + 1) * math.acosh(1.0 / rho))


def implicit_dH_gap_bound(L: float, mu: float, iters: int) -> float:
    """Bound on ``||dH_implicit - dH_exact_loop||_F / ||dH*||_F`` in exact arithmetic.

    dH* = -H^-1 g (H^-1 q)^T. In H's eigenbasis the truncated loop's dH has entries
    p_r[l_k, l_l] g_k q_l (divided differences of xi_r = p_r(H) q) and the implicit one
    -p_r(l_k) p_r(l_l) g_k q_l; with p_r(l) = (1 - R(l))/l the difference is
    -R[l_k,l_l]/l_k - R_k/(l_k l_l) + R_k R_l/(l_k l_l), and |R| <= eps_r,
    |R'| <= 2 (r+1)^2 eps_r/(L - mu) (Markov, attained by the Chebyshev residual). Relative to
    |1/(l_k l_l)| that is at most eps_r (2 (r+1)^2 kappa/(kappa - 1) + 1 + eps_r).
    """
    eps = truncation_eps(L, mu, iters)
    if eps == 0:  # L = mu: the loop is exact from step 0 (was 0 * x / 0, ZeroDivisionError)
        return 0.0
    kappa = L / mu
    return eps * (2 * (iters + 1) ** 2 * kappa / (kappa - 1) + 1 + eps)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64 (Frobenius for matrices)."""
    a, b = _v.floating("a", a, min_ndim=0, finite_values=False), _v.floating("b", b, min_ndim=0)
    if a.shape != b.shape:  # broadcasting compared other entries silently
        raise ValueError(
            f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
    nb = torch.linalg.vector_norm(b64)
    if nb == 0:
        raise ValueError("b is zero: the relative error is undefined")  # was inf or NaN
    return float(torch.linalg.vector_norm(a64 - b64) / nb)


@dataclass
class StabilityCell:
    """One (precision, kappa, r, method): errors against the mpmath gradient of the loop."""

    precision: str
    kappa: float
    iters: int
    method: str
    dq_error: float
    dH_error: float
    xi0_error: float  # rebuilt xi_0 vs the forward's, relative (reverse methods; NaN otherwise)
    nu1_error: float  # recovered nu_1 vs omega_1, relative ("reverse"; NaN otherwise)


def measure(arith: Arith, kappa: float, iters: int, D: int = 8, seed: int = 0) -> list:
    """Every method on one problem in one precision, against :func:`mp_adjoint`."""
    pb = spd_problem(D, kappa, arith.dtype, seed)
    _, dq_mp, dH_mp = mp_adjoint(pb.H, pb.q, pb.g, pb.L, pb.mu, iters).tensors()
    _, fwd = solvers.chebyshev(
        pb.H, pb.q, L=pb.L, mu=pb.mu, iters=iters, bf16_mode=arith.mode, return_info=True
    )
    cells = []
    for method in METHODS:
        dq, dH, info = solvers.chebyshev_backward(
            pb.H,
            pb.q,
            pb.g,
            L=pb.L,
            mu=pb.mu,
            iters=iters,
            method=method,
            bf16_mode=arith.mode,
            return_info=True,
        )
        xi0 = nu1 = float("nan")
        if method.startswith("reverse"):
            xi0 = rel(info.iterates[0], fwd.iterates[0])
            nu1 = (
                abs(float(info.omegas[1]) - float(fwd.omegas[1])) / float(fwd.omegas[1])
                if iters >= 1
                else 0.0
            )
        cells.append(
            StabilityCell(
                arith.label, kappa, iters, method, rel(dq, dq_mp), rel(dH, dH_mp), xi0, nu1
            )
        )
    return cells


def stability_table(kappas=KAPPAS, iters=ITERS, precisions=PRECISIONS, D: int = 8) -> list:
    # checked up front: the ValueError caught below is for H rounded indefinite, and would
    # otherwise swallow a bad kappa, r or D into an empty table
    kappas, iters = (
        [_v.real("kappa", k, low=1.0) for k in kappas],
        [_v.count("iters", r) for r in iters],
    )
    _v.count("D", D, minimum=1)
    cells = []
    for ar in precisions:
        for kappa in kappas:
            for r in iters:
                try:
                    cells += measure(ar, kappa, r, D)
                except ValueError:
                    continue  # H not SPD once rounded (bf16, kappa u_store >~ 1)
    return cells


def _fmt(x: float) -> str:
    return "nan" if x != x else f"{x:.0e}".replace("e-0", "e-").replace("e+0", "e+")


def table_markdown(cells: list) -> str:
    """One block per precision: rows (kappa, method), columns r, cells ``dq err / dH err``;
    extra rows give the rebuilt xi_0 error (reverse_stored_omega) and the recovered nu_1 error."""
    out = []
    iters = sorted({c.iters for c in cells})
    for prec in dict.fromkeys(c.precision for c in cells):
        out += [
            f"\n**{prec}** (relative errors vs the mpmath gradient of the loop; `dq / dH`)\n",
            "| kappa | method | " + " | ".join(f"r={r}" for r in iters) + " |",
            "| --- | --- | " + " | ".join("---" for _ in iters) + " |",
        ]
        mine = [c for c in cells if c.precision == prec]
        for kappa in dict.fromkeys(c.kappa for c in mine):
            at = {(c.method, c.iters): c for c in mine if c.kappa == kappa}
            for method in METHODS:
                row = [
                    f"{_fmt(at[m, r].dq_error)} / {_fmt(at[m, r].dH_error)}"
                    if (m := method, r) in at
                    else "-"
                    for r in iters
                ]
                out.append(f"| {kappa:g} | {method} | " + " | ".join(row) + " |")
            out.append(
                f"| {kappa:g} | rebuilt xi_0 | "
                + " | ".join(
                    _fmt(at["reverse_stored_omega", r].xi0_error)
                    if ("reverse_stored_omega", r) in at
                    else "-"
                    for r in iters
                )
                + " |"
            )
            out.append(
                f"| {kappa:g} | recovered nu_1 | "
                + " | ".join(
                    _fmt(at["reverse", r].nu1_error) if ("reverse", r) in at else "-" for r in iters
                )
                + " |"
            )
    return "\n".join(out)


def errata_demo(D: int = 8) -> str:
    """The numbers of the GKA Algorithm 2 errata (docs/errata.md), against :func:`mp_adjoint`."""
    lines = [
        "GKA Algorithm 2 as printed vs the exact gradient of Algorithm 1 (mpmath, 50 digits), float64, D = 8:"
    ]
    for kappa, r in ((10.0, 5), (51.0, 30)):
        pb = spd_problem(D, kappa, torch.float64)
        _, dq_mp, dH_mp = mp_adjoint(pb.H, pb.q, pb.g, pb.L, pb.mu, r).tensors()
        for corr in ((), ("q_sign",), ("c0",), ("q_sign", "c0")):
            dq, dH = solvers.algorithm2_as_printed(
                pb.H, pb.q, pb.g, L=pb.L, mu=pb.mu, iters=r, corrections=corr
            )
            label = "printed" if not corr else "printed + " + " + ".join(corr)
            lines.append(
                f"  kappa={kappa:g} r={r:2d} {label:28s} rel err dq {rel(dq, dq_mp):.2e}  dH {rel(dH, dH_mp):.2e}"
            )
    lines.append(
        "Stability of the reversal (Remark 2), kappa = 51, r = 30 (GKA's a = 0.02, 30 iterations):"
    )
    for ar in PRECISIONS:
        for c in measure(ar, 51.0, 30, D):
            lines.append(
                f"  {c.precision:17s} {c.method:21s} dq {c.dq_error:.1e}  dH {c.dH_error:.1e}"
                + (f"  rebuilt xi_0 {c.xi0_error:.1e}" if c.method.startswith("reverse") else "")
            )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = OneLineParser(
        prog="python -m analysis.references.chebyshev_backward", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--errata", action="store_true", help="print the numbers of the GKA Algorithm 2 errata"
    )
    parser.add_argument("--table", action="store_true", help="print the stability table (markdown)")
    args = parser.parse_args(argv)
    if args.errata or not args.table:
        print(errata_demo())
    if args.table:
        print(table_markdown(stability_table()))


if __name__ == "__main__":
    main()
