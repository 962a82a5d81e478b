"""GPU benchmark suite (issue 7): every kernel against exact solvers, PyTorch and peers.

One run on one GPU, everything side by side:

    PYTHONPATH=. python3 benchmarks/bench.py --out OUT_DIR [--only cheb,cg,...] [--quick]

Each timing is the median of ``triton.testing.do_bench`` (CUDA events, warm-up first); each
comes with the accuracy it reached (relative error against a float64 solve of the same
inputs on a subsample of systems), so speed is never bought with silent error. The roofline
is measured in the same run: device-to-device copy bandwidth and dense matmul throughput.
Results: ``OUT_DIR/bench.json`` (raw) and ``OUT_DIR/bench.md`` (tables).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

D = 128
SUBSAMPLE = 2048  # systems checked against the float64 solve for each accuracy figure


def _bench(fn, *, warmup=25, rep=100) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


# ---------------------------------------------------------------------------------------
# ceilings measured in this run
# ---------------------------------------------------------------------------------------


def measure_ceilings() -> dict:
    n = 1 << 30  # 1 GiB copy: far beyond L2
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t_copy = _bench(lambda: dst.copy_(src))
    bw = 2 * n / (t_copy * 1e-3)  # bytes read + written per second
    out = {"copy_bytes_per_s": bw}
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32_ieee")):
        m = 8192
        a = torch.randn(m, m, device="cuda", dtype=dt)
        b = torch.randn(m, m, device="cuda", dtype=dt)
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        t = _bench(lambda: a @ b, rep=50)
        torch.backends.cuda.matmul.allow_tf32 = prev
        out[f"matmul_{name}_flops_per_s"] = 2 * m**3 / (t * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------
# problems: GKA appendix-F systems generated on the device
# ---------------------------------------------------------------------------------------


def ridge_problems(N: int, a: float = 0.02, seed: int = 0, T: int = 2048):
    """N = B*T*H Fig.-1a systems (normalised cumulative key covariances + a I), on the GPU.

    Generated in float32 in chunks of T tokens (as the paper's snippet does in its dtype);
    spectrum in [a, 1 + a], so L = 1 + a, mu = a, kappa <= (1 + a)/a.
    """
    g = torch.Generator(device="cuda").manual_seed(seed)
    chunks = []
    eye = torch.eye(D, device="cuda")
    done = 0
    while done < N:
        t = min(T, N - done)
        k = torch.randn(t, D, device="cuda", generator=g)
        k = k / k.norm(dim=-1, keepdim=True)
        kk = torch.einsum("ti,tj->tij", k, k).cumsum(0)
        kk = kk / torch.linalg.matrix_norm(kk)[:, None, None]
        chunks.append(kk + a * eye)
        done += t
    A = torch.cat(chunks)
    q = torch.randn(N, D, device="cuda", generator=g)
    q = q / q.norm(dim=-1, keepdim=True)
    return A, q, 1.0 + a, a


def rel_error(x, x_ref) -> float:
    x = x[: x_ref.shape[0]].double()
    return float(((x - x_ref).norm(dim=-1) / x_ref.norm(dim=-1)).median())


# ---------------------------------------------------------------------------------------
# suites
# ---------------------------------------------------------------------------------------


def suite_forward(results, ceil, sizes, quick):
    import solvers

    try:
        import kernels
    except Exception as e:  # noqa: BLE001 - report, do not crash the whole suite
        kernels = None
        print(f"kernels not importable: {e}", file=sys.stderr)
    for N in sizes:
        A32, q32, L, mu = ridge_problems(N)
        x_ref = torch.linalg.solve(A32[:SUBSAMPLE].double(), q32[:SUBSAMPLE].double())
        for dt in (torch.float32, torch.bfloat16):
            A, q = A32.to(dt), q32.to(dt)
            name = str(dt).replace("torch.", "")
            bytes_once = A.numel() * A.element_size() + 2 * q.numel() * q.element_size()
            roof_ms = bytes_once / ceil["copy_bytes_per_s"] * 1e3

            def rec(op, fn, iters=None, flops=None):
                try:
                    out = fn()
                    torch.cuda.synchronize()
                    err = rel_error(out, x_ref)
                    ms = _bench(fn)
                except Exception as e:  # noqa: BLE001
                    results.append(
                        {
                            "suite": "forward",
                            "op": op,
                            "N": N,
                            "dtype": name,
                            "error": repr(e)[:300],
                        }
                    )
                    print(f"  {op:38s} N={N:7d} {name:9s} FAILED {e!r:.120}", file=sys.stderr)
                    return
                row = {
                    "suite": "forward",
                    "op": op,
                    "N": N,
                    "dtype": name,
                    "iters": iters,
                    "ms": ms,
                    "rel_err_vs_fp64_solve": err,
                    "roofline_ms": roof_ms,
                    "fraction_of_roofline": roof_ms / ms,
                }
                if flops:
                    row["tflops"] = flops / (ms * 1e-3) / 1e12
                results.append(row)
                print(
                    f"  {op:38s} N={N:7d} {name:9s} {ms:9.3f} ms  err {err:.2e}  roof {roof_ms / ms:5.1%}",
                    file=sys.stderr,
                )

            if dt == torch.float32:
                rec("torch.linalg.solve", lambda: torch.linalg.solve(A, q))
                rec(
                    "torch cholesky+cholesky_solve",
                    lambda: torch.cholesky_solve(q.unsqueeze(-1), torch.linalg.cholesky(A)).squeeze(
                        -1
                    ),
                )
            for r in (10, 30):
                fl = 2 * D * D * N * r
                rec(
                    f"solvers.chebyshev eager r={r}",
                    lambda r=r: solvers.chebyshev(A, q, L=L, mu=mu, iters=r),
                    r,
                    fl,
                )
                # Compiling costs ~a minute per shape: only the configuration the target names.
                if not quick and r == 30 and N == max(sizes):
                    comp = torch.compile(
                        lambda A, q, r=r: solvers.chebyshev(A, q, L=L, mu=mu, iters=r)
                    )
                    rec(f"solvers.chebyshev compiled r={r}", lambda comp=comp: comp(A, q), r, fl)
                if kernels is not None and hasattr(kernels, "chebyshev"):
                    rec(
                        f"kernels.chebyshev r={r}",
                        lambda r=r: kernels.chebyshev(A, q, L=L, mu=mu, iters=r),
                        r,
                        fl,
                    )
            if kernels is not None:
                for op in ("cg", "gd", "agd"):
                    if not hasattr(kernels, op):
                        continue
                    kw = {} if op == "cg" else {"L": L, "mu": mu}
                    rec(
                        f"kernels.{op} r=30",
                        lambda op=op, kw=kw: getattr(kernels, op)(A, q, iters=30, **kw),
                        30,
                    )
                    rec(
                        f"solvers.{op} eager r=30",
                        lambda op=op, kw=kw: getattr(solvers, op)(A, q, iters=30, **kw),
                        30,
                    )
            del A, q
        del A32, q32
        torch.cuda.empty_cache()


def suite_backward(results, ceil, N, quick):
    import solvers

    try:
        import kernels
    except Exception:  # noqa: BLE001
        kernels = None
    A32, q32, L, mu = ridge_problems(N)
    g32 = torch.randn_like(q32)
    for dt in (torch.float32, torch.bfloat16):
        name = str(dt).replace("torch.", "")
        A, q, g = A32.to(dt), q32.to(dt), g32.to(dt)
        x = solvers.chebyshev(A.double()[:256], q.double()[:256], L=L, mu=mu, iters=30)
        ref = solvers.chebyshev_backward(
            A.double()[:256],
            q.double()[:256],
            g.double()[:256],
            L=L,
            mu=mu,
            iters=30,
            method="autograd",
        )
        del x

        def rec(op, fn):
            try:
                dq, dH = fn()
                torch.cuda.synchronize()
                err_q = float((dq[:256].double() - ref[0]).norm() / ref[0].norm())
                err_H = float((dH[:256].double() - ref[1]).norm() / ref[1].norm())
                ms = _bench(fn, rep=50)
            except Exception as e:  # noqa: BLE001
                results.append(
                    {"suite": "backward", "op": op, "N": N, "dtype": name, "error": repr(e)[:300]}
                )
                print(f"  {op:38s} {name:9s} FAILED {e!r:.120}", file=sys.stderr)
                return
            results.append(
                {
                    "suite": "backward",
                    "op": op,
                    "N": N,
                    "dtype": name,
                    "ms": ms,
                    "rel_err_dq_vs_fp64_autograd": err_q,
                    "rel_err_dH_vs_fp64_autograd": err_H,
                }
            )
            print(
                f"  {op:38s} {name:9s} {ms:9.3f} ms  dq {err_q:.2e} dH {err_H:.2e}", file=sys.stderr
            )

        for method in ("autograd", "implicit", "reverse_stored_omega"):
            rec(
                f"solvers.chebyshev_backward {method}",
                lambda m=method: solvers.chebyshev_backward(
                    A, q, g, L=L, mu=mu, iters=30, method=m
                ),
            )
        if kernels is not None and hasattr(kernels, "chebyshev_backward"):
            for method in ("implicit", "reverse_stored_omega"):
                rec(
                    f"kernels.chebyshev_backward {method}",
                    lambda m=method: kernels.chebyshev_backward(
                        A, q, g, L=L, mu=mu, iters=30, method=m
                    ),
                )
    del A32, q32, g32
    torch.cuda.empty_cache()


def environment() -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name,
        "sms": p.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


EXTRA_SUITES = {}  # name -> callable(results, ceil, quick); filled by benchmarks/bench_*.py modules


def _load_extra_suites():
    here = Path(__file__).parent
    sys.path.insert(0, str(here))
    for f in sorted(here.glob("bench_*.py")):
        mod = __import__(f.stem)
        EXTRA_SUITES.update(getattr(mod, "SUITES", {}))


def write_markdown(res: dict, path: Path) -> None:
    lines = [
        f"Machine: {res['env']['gpu']} ({res['env']['sms']} SMs), torch {res['env']['torch']}, "
        f"triton {res['env']['triton']}, CUDA {res['env']['cuda']}; {res['env']['date']}",
        "",
        f"Copy bandwidth (read+write): {res['ceilings']['copy_bytes_per_s'] / 1e12:.2f} TB/s; "
        f"bf16 matmul {res['ceilings']['matmul_bf16_flops_per_s'] / 1e12:.0f} TFLOP/s; "
        f"fp32 (ieee) matmul {res['ceilings']['matmul_fp32_ieee_flops_per_s'] / 1e12:.0f} TFLOP/s",
        "",
    ]
    by_suite = {}
    for r in res["rows"]:
        by_suite.setdefault(r["suite"], []).append(r)
    for suite, rows in by_suite.items():
        keys = [k for k in rows[0] if k != "suite"]
        for r in rows:
            keys += [k for k in r if k not in keys and k != "suite"]
        lines += [f"### {suite}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for r in rows:
            cells = []
            for k in keys:
                v = r.get(k, "")
                cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    _load_extra_suites()  # before the parser, so that --help lists every suite
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("reports/bench"))
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated suites: forward,backward," + ",".join(EXTRA_SUITES),
    )
    ap.add_argument("--quick", action="store_true", help="N=16384 only, no torch.compile")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU", file=sys.stderr)
        return 2
    only = set(filter(None, args.only.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(f"env: {env}", file=sys.stderr)
    ceil = measure_ceilings()
    print(f"ceilings: {ceil}", file=sys.stderr)
    rows: list = []
    sizes = [16384] if args.quick else [16384, 131072]
    t0 = time.time()
    if not only or "forward" in only:
        suite_forward(rows, ceil, sizes, args.quick)
    if not only or "backward" in only:
        suite_backward(rows, ceil, 16384, args.quick)
    for name, fn in EXTRA_SUITES.items():
        if not only or name in only:
            try:
                fn(rows, ceil, args.quick)
            except Exception as e:  # noqa: BLE001
                rows.append({"suite": name, "error": repr(e)[:300]})
                print(f"suite {name} FAILED: {e!r}", file=sys.stderr)
    res = {"env": env, "ceilings": ceil, "rows": rows, "wall_s": time.time() - t0}
    (args.out / "bench.json").write_text(json.dumps(res, indent=1, default=float))
    write_markdown(res, args.out / "bench.md")
    print((args.out / "bench.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
