"""KLA chunkwise forward (issue 7): kernels.kla_chunkwise against flash-linear-attention's
chunk_gated_delta_rule at B=4, T=4096, H=16, d_k=d_v=128, bf16 and fp32.

Loaded by benchmarks/bench.py (``SUITES``); alone:

    PYTHONPATH=. python3 benchmarks/bench_kla.py

fla computes KLA when given the Kaczmarz coefficient ``beta = eta / (||k||^2 + eps)``,
``g = log alpha``, queries divided by their norms and ``scale = 1`` (tests/fla_adapter.py;
checked on the CPU against fla's own PyTorch references ``naive_recurrent_gated_delta_rule``
and ``naive_chunk_gated_delta_rule``: float32 agreement, docs/kernels.md). Target: our kernel,
which computes beta and the query norms itself, no slower than 1.15x fla given beta and the
normalised queries ("fla, inputs prepared"); the row "fla + preparation" times the preparation
too. Accuracy: relative error of o against a float64 ``solvers.kla_chunkwise`` on a slice
(batch 0, heads 0-1, the first 512 tokens: causal, so the slice's outputs are exact there).
First calls compile (fla autotunes for minutes): each variant is warmed on a small shape with
the same autotuning keys, and the suite starts no new measurement after ``BUDGET_S`` (the
variants in order of interest: bf16, then float32 with tf32x3 products, then "ieee").
"""

from __future__ import annotations

import sys
import time

import torch

B, T, H, D = 4, 4096, 16, 128
EPS = 1e-6
SLICE_T, SLICE_H = 512, 2
BUDGET_S = 150.0


def _bench(fn, rep=100) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def _inputs(Bn, Tn, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(Bn, Tn, H, D, generator=g, device="cuda").to(dtype)
    k = torch.randn(Bn, Tn, H, D, generator=g, device="cuda").to(dtype)
    v = torch.randn(Bn, Tn, H, D, generator=g, device="cuda").to(dtype)
    alpha = (0.9 + 0.1 * torch.rand(Bn, Tn, H, generator=g, device="cuda")).to(dtype).float()
    eta = (0.2 + 0.8 * torch.rand(Bn, Tn, H, generator=g, device="cuda")).to(dtype).float()
    return q, k, v, alpha, eta


def _fla_prepared(q, k, alpha, eta):
    """fla's arguments for KLA (tests/fla_adapter.py): normalised queries, g, Kaczmarz beta."""
    beta = (eta / (k.float().pow(2).sum(-1) + EPS)).to(q.dtype)
    qn = (q.float() / q.float().norm(dim=-1, keepdim=True)).to(q.dtype)
    return qn, torch.log(alpha), beta


def _reference_slice(q, k, v, alpha, eta):
    import solvers

    s = (slice(0, 1), slice(0, SLICE_T), slice(0, SLICE_H))
    o, _ = solvers.kla_chunkwise(q[s].double(), k[s].double(), v[s].double(), alpha=alpha[s].double(),
                                 eta=eta[s].double(), eps=EPS, chunk_size=64)
    return o


def _rel_err(o, ref) -> float:
    o = o[:1, :SLICE_T, :SLICE_H].double()
    return float(((o - ref).norm(dim=-1) / ref.norm(dim=-1)).median())


def suite(results: list, ceil: dict, quick: bool) -> None:
    import kernels

    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - report, do not crash the suite
        chunk_gated_delta_rule = None
        results.append({"suite": "kla", "op": "fla.chunk_gated_delta_rule", "error": f"not importable: {e!r}"[:300]})
    t_start = time.time()
    io_bytes = lambda dt: (4 * B * T * H * D + 2 * B * T * H) * torch.tensor([], dtype=dt).element_size()  # noqa: E731
    variants = [(torch.bfloat16, "bf16"), (torch.float32, "tf32x3"), (torch.float32, "ieee")]
    if quick:
        variants = variants[:2]
    fla_ms = {}
    for dtype, precision in variants:
        name = str(dtype).replace("torch.", "")
        if time.time() - t_start > BUDGET_S:
            results.append({"suite": "kla", "op": f"kernels.kla_chunkwise {precision}", "dtype": name,
                            "error": "skipped: suite time budget spent"})
            continue
        small = _inputs(1, 256, dtype, seed=1)
        q, k, v, alpha, eta = _inputs(B, T, dtype)
        ref = _reference_slice(q, k, v, alpha, eta)
        roof_ms = io_bytes(dtype) / ceil["copy_bytes_per_s"] * 1e3
        shape = {"B": B, "T": T, "H": H, "D": D, "dtype": name}

        def record(op, fn, warm, extra=None):
            if time.time() - t_start > BUDGET_S:
                results.append({"suite": "kla", "op": op, **shape, "error": "skipped: suite time budget spent"})
                return {}
            try:
                warm()
                out = fn()
                torch.cuda.synchronize()
                err = _rel_err(out[0], ref)
                ms = _bench(fn)
            except Exception as e:  # noqa: BLE001
                results.append({"suite": "kla", "op": op, **shape, "error": repr(e)[:300]})
                print(f"  {op:44s} {name:9s} FAILED {e!r:.160}", file=sys.stderr)
                return {}
            row = {"suite": "kla", "op": op, **shape, "ms": ms, "rel_err_vs_fp64_slice": err, "roofline_ms": roof_ms,
                   "fraction_of_roofline": roof_ms / ms, **(extra or {})}
            results.append(row)
            print(f"  {op:44s} {name:9s} {ms:9.3f} ms  err {err:.2e}  roof {roof_ms / ms:5.1%}", file=sys.stderr)
            return row

        ours = lambda x, p=precision: kernels.kla_chunkwise(*x[:3], alpha=x[3], eta=x[4], eps=EPS, chunk_size=64,  # noqa: E731
                                                             input_precision=p)
        row = record(f"kernels.kla_chunkwise {precision}", lambda: ours((q, k, v, alpha, eta)), lambda: ours(small),
                     {"precision": precision})
        if chunk_gated_delta_rule is not None and name not in fla_ms:
            prepared = _fla_prepared(q, k, alpha, eta)
            small_prepared = _fla_prepared(small[0], small[1], small[3], small[4])

            def fla(x, qn, g, beta):
                return chunk_gated_delta_rule(qn, x[1], x[2], g=g, beta=beta, scale=1.0, output_final_state=True)

            fla_ms[name] = record("fla.chunk_gated_delta_rule (inputs prepared)", lambda: fla((q, k, v), *prepared),
                                  lambda: fla(small, *small_prepared)).get("ms")
            record("fla.chunk_gated_delta_rule + preparation",
                   lambda: fla((q, k, v), *_fla_prepared(q, k, alpha, eta)), lambda: None)
        if row.get("ms") and fla_ms.get(name):
            row["vs_fla"] = row["ms"] / fla_ms[name]  # target (issue 7): <= 1.15 in bf16
        del q, k, v, alpha, eta
        torch.cuda.empty_cache()


SUITES = {"kla": suite}


if __name__ == "__main__":
    rows: list = []
    sys.path.insert(0, "benchmarks")
    from bench import measure_ceilings

    suite(rows, measure_ceilings(), quick="--quick" in sys.argv)
    for r in rows:
        print(r)
