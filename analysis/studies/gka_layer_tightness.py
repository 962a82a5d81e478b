"""How large and how tight the GKA layer's per-token forward bound is (docs/gka_layer.md, "Per-token
bound").

``python -m analysis.studies.gka_layer_tightness [--T 256 512 1024] [--every 4] [--kernel] [--y]``
prints,
at GKA's setting (D = 128, a = 0.02, r = 30, L2-normalised bf16 keys and queries, no gates), for
every ``every``-th token from t = 0:

* ``LTB / ||x_t||`` (``analysis.bounds.gka_layer.layer_token_bound``, bfloat16/operands, x returned
  in bf16) at chunk 64 (the warp-group MMA kernel) and 32 (the Triton kernel's default), its
  quantiles and the share of tokens where it is below ``||x_t||`` (a check, not INCONCLUSIVE);
* the same for the first-order bound FWD of ``analysis.testing.gka_gradient_harness``;
* ``measured / LTB`` for the warp-group MMA kernel's arithmetic in plain torch
  (``kernels.gka_layer_wgmma.emulate_solve``), and with ``--kernel`` for ``kernels.gka_solve``
  (the Triton kernel: on a GPU, or on the CPU under TRITON_INTERPRET=1) at chunk 32;
* with ``--y``, the layer's output ``y_t = U_t x_t`` (Gaussian bf16 values): ``LTB-y / ||y_t||``
  (``analysis.bounds.gka_layer_output.layer_output_bound``) at chunk 64, its quantiles and share
  below ``||y_t||``, ``measured / LTB-y`` for the warp-group MMA arithmetic in plain torch
  (``kernels.gka_layer_wgmma.emulate_layer``), and with ``--kernel`` for ``kernels.gka_layer`` at
  chunk 32 (the Triton kernel) and, on a GPU, at its default (the warp-group MMA kernel where it
  applies, at chunk 64).
"""

from __future__ import annotations

import importlib

import torch

from analysis.argtypes import HelpFormatter, OneLineParser, positive_int
from analysis.bounds.gka_layer import layer_token_bound
from analysis.bounds.gka_layer_output import layer_output_bound
from analysis.testing.gka_gradient_harness import UB, dfro_bound, eps_model, fwd_bound

F64 = torch.float64
QUANTILES = (0.1, 0.5, 0.9, 1.0)


def unit_inputs(T: int, D: int, seed: int):
    """bf16 unit keys and queries ``(1, T, D)``."""
    gen = torch.Generator().manual_seed(seed)
    unit = lambda: torch.nn.functional.normalize(
        torch.randn(1, T, D, generator=gen, dtype=F64), dim=-1
    )  # noqa: E731
    return unit().to(torch.bfloat16), unit().to(torch.bfloat16)


def gaussian_values(T: int, D: int, seed: int) -> torch.Tensor:
    """bf16 values ``(1, T, D)`` with standard normal entries (their own generator: q and k stay
    those of :func:`unit_inputs`)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(1, T, D, generator=gen, dtype=F64).to(torch.bfloat16)


def fwd_relative(q, k, tokens, *, a: float, iters: int, C: int) -> torch.Tensor:
    """FWD / ||x_t|| at ``tokens`` (H_t and |H|~_t formed at those tokens only)."""
    q64, k64 = q.to(F64), k.to(F64)
    N, T, D = q64.shape
    H, Ha = torch.zeros(N, D, D, dtype=F64), torch.zeros(N, D, D, dtype=F64)
    Hs, Has = [], []
    want = set(tokens.tolist())
    for t in range(T):
        kt = k64[:, t]
        H = H + kt[:, :, None] * kt[:, None, :]
        Ha = Ha + kt.abs()[:, :, None] * kt.abs()[:, None, :]
        if t in want:
            Hs.append(H)
            Has.append(Ha)
    H, Ha = torch.stack(Hs, 1), torch.stack(Has, 1)
    fro = torch.linalg.matrix_norm(H)
    e_S, e_gate, e_H = eps_model("bfloat16/operands", C=C, T=T, D=D, g64=None)
    A = H + (a * fro)[..., None, None] * torch.eye(D, dtype=F64)
    bound, xr = fwd_bound(
        A,
        Ha,
        q64[:, tokens],
        fro,
        a=a,
        iters=iters,
        e_H=e_H,
        dfro=dfro_bound(Ha, fro, e_S, e_gate, D=D, C=C),
        out_u=0.0,
        x_out=q64[:, tokens],
    )
    # the output store at the float64 iterate (FWD adds it at the kernel's x)
    bound = bound + UB * torch.linalg.vector_norm(xr, dim=-1)
    return (bound / torch.linalg.vector_norm(xr, dim=-1))[0]


def quantile_line(t: torch.Tensor) -> str:
    """The QUANTILES of ``t``'s entries, four decimals each: one row of the studies' tables."""
    qs = torch.quantile(t.flatten().to(F64), torch.tensor(QUANTILES, dtype=F64))
    return " ".join(f"{float(v):.4f}" for v in qs)


def main(argv=None) -> int:
    ap = OneLineParser(
        prog="python -m analysis.studies.gka_layer_tightness",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--T", type=positive_int, nargs="+", default=[256, 512, 1024], help="tokens")
    ap.add_argument("--every", type=positive_int, default=4, help="bound every n-th token")
    ap.add_argument("--seed", type=int, default=0, help="seed of the keys and queries")
    ap.add_argument(
        "--kernel", action="store_true", help="also kernels.gka_solve (GPU or TRITON_INTERPRET=1)"
    )
    ap.add_argument("--y", action="store_true", help="also the layer output y_t = U_t x_t")
    args = ap.parse_args(argv)
    D, a, r = 128, 0.02, 30
    print(f"D={D} a={a} r={r} unit keys and queries in bf16, no gates, every {args.every}th token")
    print(f"quantiles {' '.join(str(p) for p in QUANTILES)}")
    for T in args.T:
        q, k = unit_inputs(T, D, args.seed)
        tokens = torch.arange(0, T, args.every)
        for C in (64, 32):
            b = layer_token_bound(
                q, k, a=a, iters=r, chunk_size=C, contract="bfloat16/operands", tokens=tokens
            )
            rel = b.relative[0]
            print(
                f"T={T:5d} C={C}  LTB/||x||  {quantile_line(rel)}  below ||x||: {float((rel < 1).double().mean()):.3f}"
            )
            if C == 64:
                x = emulate_x(q, k, a=a, iters=r)
                m = torch.linalg.vector_norm(x[:, tokens] - b.x, dim=-1) / b.bound
                print(
                    f"        warp-group MMA arithmetic (emulated): measured/LTB  {quantile_line(m)}"
                )
            elif args.kernel:
                import kernels

                dev = "cuda" if torch.cuda.is_available() else "cpu"
                x = kernels.gka_solve(q.to(dev), k.to(dev), a=a, iters=r, chunk_size=C)
                m = torch.linalg.vector_norm(x.cpu().to(F64)[:, tokens] - b.x, dim=-1) / b.bound
                print(
                    f"        Triton kernel (kernels.gka_solve): measured/LTB  {quantile_line(m)}"
                )
        f = fwd_relative(q, k, tokens, a=a, iters=r, C=64)
        print(
            f"T={T:5d} C=64  FWD/||x||  {quantile_line(f)}  below ||x||: {float((f < 1).double().mean()):.3f}"
        )
        if args.y:
            y_rows(q, k, gaussian_values(T, D, args.seed), tokens, a=a, iters=r, kernel=args.kernel)
    return 0


def _y_ratio(y, b) -> torch.Tensor:
    """measured / LTB-y at the bound's tokens, y ``(N, T, Dv)`` from a kernel (any device)."""
    y = y.detach().cpu().to(F64)[:, b.tokens]
    return (torch.linalg.vector_norm(y - b.y, dim=-1) / b.bound)[0]


def y_rows(q, k, v, tokens, *, a: float, iters: int, kernel: bool) -> None:
    """The ``--y`` rows of one T (module docstring)."""
    from kernels.gka_layer_wgmma import emulate_layer

    T = q.shape[1]
    bounds = {}
    for C in (64, 32) if kernel else (64,):
        bounds[C] = layer_output_bound(
            q, k, v, a=a, iters=iters, chunk_size=C, contract="bfloat16/operands", tokens=tokens
        )
    rel = bounds[64].relative[0]
    below = float((rel < 1).double().mean())
    print(f"T={T:5d} C=64  LTB-y/||y||  {quantile_line(rel)}  below ||y||: {below:.3f}")
    y, _ = emulate_layer(q, k, v, a=a, iters=iters)
    print(
        f"        warp-group MMA arithmetic (emulated): measured/LTB-y  {quantile_line(_y_ratio(y, bounds[64]))}"
    )
    if not kernel:
        return
    import kernels

    layer = importlib.import_module("kernels.gka_layer")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    qd, kd, vd = q.to(dev), k.to(dev), v.to(dev)
    y = kernels.gka_layer(qd, kd, vd, a=a, iters=iters, chunk_size=32)
    print(
        f"        Triton kernel (kernels.gka_layer, C=32): measured/LTB-y  {quantile_line(_y_ratio(y, bounds[32]))}"
    )
    if dev == "cuda":  # the default path: the warp-group MMA kernel where it applies
        which = layer.solve_kernel_for(qd, None, None, "bfloat16/operands", vd)
        C = 64 if which == "wgmma" else layer.DEFAULT_CHUNK["bfloat16/operands"]
        b = (
            bounds[C]
            if C in bounds
            else layer_output_bound(
                q, k, v, a=a, iters=iters, chunk_size=C, contract="bfloat16/operands", tokens=tokens
            )
        )
        y = kernels.gka_layer(qd, kd, vd, a=a, iters=iters)
        print(
            f"        {which} kernel (kernels.gka_layer, C={C}): measured/LTB-y  {quantile_line(_y_ratio(y, b))}"
        )


def emulate_x(q, k, *, a, iters):
    from kernels.gka_layer_wgmma import emulate_solve

    return emulate_solve(q, k, a=a, iters=iters).to(F64)


if __name__ == "__main__":
    raise SystemExit(main())
