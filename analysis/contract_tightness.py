"""How large and how tight the contract running bounds are (docs/harness.md, "Non-vacuity").

``python -m analysis.contract_tightness [--D 128] [--iters 30] [--systems 32]`` prints, per
problem family and contract, ``bound / ||x||`` and ``measured / bound`` for the plain-torch
emulation of the contract (``kernels.emulate``) on bf16 inputs, where *measured* is the
emulation's distance to the exact (float64) run of the same algorithm, result kept in float32:

* ``gka_ridge``: GKA's ridge form at a = 0.02 (kappa <= 51), H with spectrum log-uniform in
  [1e-4, 1] times a scale, unit q (``kernels.harness.gka_ridge_case``);
* ``spd``: Chebyshev on SPD H with spectrum log-uniform in [1/51, 1], both ends attained, and
  L, mu the ends (``kernels.harness.spd_case``): the worst case for the bound, which grows
  with the responses at the ends of [mu, L].
"""

from __future__ import annotations

import argparse

import torch

from .contract_bounds import linear_bound

CONTRACTS = ("float32", "tf32", "bfloat16/operands", "bfloat16/storage")


def _problem(family: str, D: int, n: int, iters: int, seed: int):
    from kernels import harness

    if family == "gka_ridge":
        c = harness.gka_ridge_case(D, (n,), a=0.02, iters=iters, kappa_h=1e4, seed=seed)
        H, q = (c.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
        fro = torch.linalg.matrix_norm(H)
        lam = 0.02 * fro
        return H, q, dict(L=fro + lam, mu=lam, shift=lam), dict(a=0.02)
    c = harness.spd_case(D, (n,), 51.0, iters=iters, seed=seed)
    H, q = (c.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
    return H, q, dict(L=c.options["L"], mu=c.options["mu"]), dict(L=c.options["L"], mu=c.options["mu"])


def tightness(family: str, contract: str, *, D: int = 128, iters: int = 30, systems: int = 32, seed: int = 0) -> dict:
    """Quantiles of ``bound/||x||`` and ``measured/bound`` over ``systems`` systems."""
    from kernels import emulate

    H, q, bound_kw, call_kw = _problem(family, D, systems, iters, seed)
    run = linear_bound("chebyshev", H, q, iters=iters, contract=contract, **bound_kw)
    fn = emulate.gka_ridge if family == "gka_ridge" else emulate.chebyshev
    x = fn(H.float(), q.float(), iters=iters, contract=contract, **call_kw).double()
    measured = (x - run.x[-1]).norm(dim=-1) / run.bound[-1]
    rel = run.relative

    def q_(t):
        return {k: float(t.quantile(p)) for k, p in (("min", 0.0), ("median", 0.5), ("p90", 0.9), ("max", 1.0))}

    return {"bound_over_x": q_(rel), "measured_over_bound": q_(measured)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.contract_tightness", description=__doc__.splitlines()[0])
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--systems", type=int, default=32)
    args = ap.parse_args(argv)
    print(f"D={args.D} r={args.iters} systems={args.systems} bf16 inputs")
    print(f"{'family':10s} {'contract':18s} {'bound/||x|| median (max)':>26s} {'measured/bound median (max)':>29s}")
    for fam in ("gka_ridge", "spd"):
        for c in CONTRACTS:
            t = tightness(fam, c, D=args.D, iters=args.iters, systems=args.systems)
            b, m = t["bound_over_x"], t["measured_over_bound"]
            print(f"{fam:10s} {c:18s} {b['median']:>17.4f} ({b['max']:.4f}) {m['median']:>20.3f} ({m['max']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
