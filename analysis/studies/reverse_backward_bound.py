"""Size of the reverse backward methods' running bound (docs/harness.md, ``spd_backward``).

``python -m analysis.studies.reverse_backward_bound [--D 16] [--iters 30] [--systems 8]`` prints,
per contract and kappa, the median over systems of ``bound / ||dq||`` and ``bound / ||dH||``
(``analysis.bounds.reverse_backward.reverse_backward_bound``, method ``reverse_stored_omega``,
the kernel's contract alone; the harness adds the float32 reference's bound), the former
a-priori allowance's ``/ ||dH||`` for comparison, and the largest iteration count at which the
median case is still conclusive (bound < the exact output's norm) for dq and dH.

Systems: H with spectrum log-uniform in [1/kappa, 1] (both ends attained) and random
eigenvectors, rounded to bf16 for the bf16 contracts (float32 otherwise), Gaussian q and
cotangent, L and mu the rounded matrix's extreme eigenvalues (``L >= 1.5 mu``).
"""

from __future__ import annotations

import statistics

import torch

from analysis.argtypes import HelpFormatter, OneLineParser, positive_int
from analysis.bounds.reverse_backward import reverse_backward_bound
from analysis.testing import harness
from analysis.testing.strategies.spd import log_uniform_spd

CONTRACTS = ("float32", "tf32", "bfloat16/operands", "bfloat16/storage")
KAPPAS = (16.0, 51.0, 100.0)


def reverse_system(D, kappa, seed, precision, loose=1.0):
    """A rounded SPD system (float64 copies of the values a kernel receives: H log-uniform in
    [1/kappa, 1], Gaussian q), a Gaussian cotangent g, and L, mu enclosing the rounded spectrum,
    widened by ``loose`` (``L >= 1.5 mu``, as the strategy draws them)."""
    gen = torch.Generator().manual_seed(seed)
    H = log_uniform_spd(D, 1, kappa, 1.0, gen)[0]
    q = torch.randn(D, generator=gen, dtype=torch.float64)
    g = torch.randn(D, generator=gen, dtype=torch.float64)
    H, q, g = (t.to(precision).to(torch.float64) for t in (H, q, g))
    ev = torch.linalg.eigvalsh(H)
    mu = float(ev[0]) / loose
    return H, q, g, max(float(ev[-1]) * loose, 1.5 * mu), mu


# ---------------------------------------------------------------- the former allowance
# The harness's a-priori allowance for the reverse methods before their running bound, kept here
# only to print beside it: the contract's allowance times the rebuilt iterates' growth and the
# adjoint's size (a house model, not a derived bound).


def _omegas64(L, mu, iters, shape, device):
    L = torch.broadcast_to(torch.as_tensor(L, dtype=torch.float64, device=device), shape)
    mu = torch.broadcast_to(torch.as_tensor(mu, dtype=torch.float64, device=device), shape)
    rho2 = ((L - mu) / (L + mu)) ** 2
    w = [torch.full_like(rho2, 2.0)]
    for _ in range(iters):
        w.append(4.0 / (4.0 - rho2 * w[-1]))
    return L, mu, torch.stack(w, -1)


def _reverse_growth(L, mu, iters: int, shape, device="cpu") -> torch.Tensor:
    """How much the rebuilt iterates of the reverse methods can amplify a rounding error, per
    system (float64): GKA eq. (49) runs Algorithm 1's three-term recurrence backwards; on
    [mu, L] its characteristic roots are complex with modulus sqrt(omega_i - 1) < 1, so
    backwards an error grows by ``(omega_i - 1)^(-1/2)`` per step (GKA Remark 2), times at most
    r as the roots coalesce: ``R = r prod_{i=2..r} (omega_i - 1)^(-1/2)``."""
    L, mu, w = _omegas64(L, mu, iters, shape, device)
    growth = torch.full(shape, float(max(iters, 1)), dtype=torch.float64, device=device)
    if iters >= 2:
        growth = growth * torch.prod((w[..., 2:] - 1.0) ** -0.5, dim=-1)
    return growth


def _adjoint_sum(H, q, g, L, mu, iters: int) -> torch.Tensor:
    """``sum_{i=1..r} c_i ||lambda_i|| max_j ||xi_j||`` in float64 (GKA eq. (46), (48)): the
    size of the terms dH = -sum c_i lambda_i xi_{i-1}^T adds up, before cancellation."""
    shape = H.shape[:-2]
    L, mu, w = _omegas64(L, mu, iters, shape, H.device)
    step = (2.0 / (L + mu)).unsqueeze(-1)
    xi_prev, xi = torch.zeros_like(q), step * q
    xi_max = xi.norm(dim=-1)
    for i in range(1, iters + 1):
        wi = w[..., i].unsqueeze(-1)
        xi_new = (
            xi - wi * step * ((H @ xi.unsqueeze(-1)).squeeze(-1) - q) + (wi - 1.0) * (xi - xi_prev)
        )
        xi_prev, xi = xi, xi_new
        xi_max = torch.maximum(xi_max, xi.norm(dim=-1))
    total = torch.zeros(shape, dtype=torch.float64, device=H.device)
    lam, lam_next = g, torch.zeros_like(g)
    for i in range(iters, 0, -1):
        wi = w[..., i].unsqueeze(-1)
        c = wi * step
        total = total + (c * lam).norm(dim=-1)
        b_next = -(w[..., i + 1].unsqueeze(-1) - 1.0) if i < iters else torch.zeros_like(wi)
        lam_prev = (
            wi * lam - c * (H.transpose(-1, -2) @ lam.unsqueeze(-1)).squeeze(-1) + b_next * lam_next
        )
        lam_next, lam = lam, lam_prev
    return total * xi_max


def former_allowance(H, q, g, L, mu, iters, contract):
    """The former allowance on ``||dH_hat - dH||`` (method \"reverse_stored_omega\")."""
    a = harness.allowances(L / mu, H.shape[-1], contract)
    return a * _reverse_growth(L, mu, iters, ()) * 2.0 * _adjoint_sum(H, q, g, L, mu, iters)


def ratios(contract, kappa, D, iters, systems, method="reverse_stored_omega"):
    """Median ``bound/||dq||``, ``bound/||dH||`` and the former allowance's ``/||dH||``."""
    prec = torch.bfloat16 if contract.startswith("bfloat16") else torch.float32
    rq, rH, rA = [], [], []
    for s in range(systems):
        H, q, g, L, mu = reverse_system(D, kappa, 100 + s, prec)
        b = reverse_backward_bound(
            H, q, g, L=L, mu=mu, iters=iters, method=method, contract=contract
        )
        rq.append(float(b.dq / b.dq_exact.norm()))
        rH.append(float(b.dH / b.dH_exact.norm()) if iters else 0.0)
        old = former_allowance(H, q, g, L, mu, iters, contract)
        rA.append(float(old / b.dH_exact.norm()) if iters else 0.0)
    return statistics.median(rq), statistics.median(rH), statistics.median(rA)


def last_conclusive(contract, kappa, D, systems, max_iters=50, method="reverse_stored_omega"):
    """The largest r <= max_iters up to which the median dq / dH bound stays below the output."""
    last = {"dq": 0, "dH": 0}
    live = {"dq": True, "dH": True}
    for r in range(1, max_iters + 1):
        q, h, _ = ratios(contract, kappa, D, r, systems, method)
        for name, v in (("dq", q), ("dH", h)):
            live[name] = live[name] and v < 1.0
            if live[name]:
                last[name] = r
        if not any(live.values()):
            break
    return last


def main(argv=None):
    p = OneLineParser(
        prog="python -m analysis.studies.reverse_backward_bound",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
    )
    p.add_argument("--D", type=positive_int, default=16, help="system size")
    p.add_argument("--iters", type=positive_int, default=30, help="Chebyshev steps r")
    p.add_argument("--systems", type=positive_int, default=8, help="systems per median")
    p.add_argument("--conclusive", action="store_true", help="also search the last conclusive r")
    p.add_argument(
        "--method", default="reverse_stored_omega", choices=("reverse", "reverse_stored_omega")
    )
    a = p.parse_args(argv)
    print(f"D={a.D} r={a.iters} systems={a.systems} method={a.method} (median)")
    print(
        f"{'contract':18s} {'kappa':>6s} {'bound/|dq|':>11s} {'bound/|dH|':>11s} {'former/|dH|':>12s}"
    )
    for c in CONTRACTS:
        for k in KAPPAS:
            q, h, o = ratios(c, k, a.D, a.iters, a.systems, a.method)
            line = f"{c:18s} {k:6.0f} {q:11.3g} {h:11.3g} {o:12.3g}"
            if a.conclusive:
                lc = last_conclusive(c, k, a.D, max(1, a.systems // 2), method=a.method)
                line += f"   conclusive to r = {lc['dq']} (dq), {lc['dH']} (dH)"
            print(line)


if __name__ == "__main__":
    main()
