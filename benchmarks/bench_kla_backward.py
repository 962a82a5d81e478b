"""KLA / GDN backward on the GPU: validation, timing against flash-linear-attention, and the
search for a wrong gradient in fla's gated backward with its Hopper guard bypassed.

    PYTHONPATH=. python3 benchmarks/bench_kla_backward.py --out DIR --part PART [--budget S]

Each part runs in its own process (a CUDA error in one cannot poison another), appends to
``DIR/kla-backward-gpu.log`` and writes ``DIR/kla-backward-PART.json``:

* ``matrix`` (CPU, TRITON_INTERPRET=1 HYPOTHESIS_PROFILE=ci): the strategy on the correct
   backwards and the broken variants (docs/gradients.md's tables);
0. ``smoke``: forward and backward of ``kernels.kla_chunkwise_trainable`` at a few small
   shapes, step by step with a synchronisation after each (run it with
   CUDA_LAUNCH_BLOCKING=1), so a failing launch is named;

1. ``validation``: the gradient strategy ``kla_backward`` (analysis.testing.gradient_harness) on
   ``kernels.kla_chunkwise_trainable`` at d in {64, 128}, C = 64, bf16 (model
   bfloat16/storage) and float32 (model float32) inputs, KLA and GDN modes;
2. ``timing_ours`` / ``timing_fla``: timing at each of ``SIZES`` ((B, T, H, d) = (4, 4096, 16,
   128) and (1, 1024, 16, 128)), bf16: the backward alone (the forward's graph kept), ours in
   GDN and KLA mode and fla's ``chunk_gated_delta_rule`` (GDN, scale 1): GPU time
   (torch.profiler, sum of the kernels' device times per call) and wall time (median, p10-p90
   of synchronised calls);
3. ``search``: the same strategy on fla's ``chunk_gated_delta_rule`` backward with the guard
   of its issue #640 bypassed (module flag ``fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1``),
   at the timing's H and d (fla compiles and autotunes per H and d), packed sequences
   included, random cases until the budget is spent; every case's label rebuilds it (its seed);
4. ``fla``: ``timing_fla`` then ``search`` in one process (the search reuses fla's binaries);
* ``gka`` (CPU or GPU): the ``gka_layer_backward`` strategy (analysis.testing.gka_gradient_harness) on
  ``kernels.gka_layer``'s implicit backward and its broken variants, and the truncation gap.

``--tiny`` replaces the sizes by (1, 40, 2, 16) and fla by our kernel, to test the script on a
CPU under TRITON_INTERPRET=1 (benchmarks/gpu_grad_run.sh with TINY=1).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings

import torch

# (B, T, H, D): the target size and a smaller one with the same H and D (fla compiles and
# autotunes per H and D, not per B or T, so the second size and the search reuse its binaries)
SIZES = ((4, 4096, 16, 128), (1, 1024, 16, 128))


def _percentiles(xs):
    xs = sorted(xs)
    pick = lambda p: xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]  # noqa: E731
    return {
        "median_ms": statistics.median(xs),
        "p10_ms": pick(0.1),
        "p90_ms": pick(0.9),
        "n": len(xs),
    }


def _gpu_ms(fn, reps=5) -> float:
    """Sum of the device times of every kernel launched, per call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            total += getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
    return total / reps / 1000.0


_DEVICE = (
    "cuda" if torch.cuda.is_available() else "cpu"
)  # cpu: TRITON_INTERPRET=1, to test this script


def _sync():
    if _DEVICE == "cuda":
        torch.cuda.synchronize()


def _wall(fn, reps=20):
    out = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        out.append(1000.0 * (time.perf_counter() - t0))
    return _percentiles(out)


def _timing_inputs(B, T, H, D, seed=0):
    g = torch.Generator(device=_DEVICE).manual_seed(seed)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    dev = dict(generator=g, device=_DEVICE)
    q = unit(torch.randn(B, T, H, D, **dev)).bfloat16()
    k = unit(torch.randn(B, T, H, D, **dev)).bfloat16()
    v = torch.randn(B, T, H, D, **dev).bfloat16()
    gl = torch.nn.functional.logsigmoid(3.0 + torch.randn(B, T, H, **dev)).bfloat16().float()
    beta = torch.rand(B, T, H, **dev).bfloat16()
    do = torch.randn(B, T, H, D, **dev).bfloat16()
    return q, k, v, gl, beta, do


def timing(log, which: str, sizes=SIZES) -> list:
    """The backward alone (the forward's graph kept) at each size: GPU time and wall time."""
    from kernels import kla_chunkwise_trainable

    rows = []
    if which == "fla":
        import fla.ops.common.chunk_o as chunk_o

        chunk_o.TRITON_ABOVE_3_7_1 = (
            True  # its backward refuses to run on Hopper with Triton 3.6 otherwise
        )
    for size in sizes:
        q, k, v, gl, beta, do = _timing_inputs(*size)

        def ours(mode):
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v, gl, beta)]
            o, _ = kla_chunkwise_trainable(
                *leaves[:3],
                alpha=torch.exp(leaves[3]),
                eta=leaves[4].float(),
                chunk_size=64,
                coefficient="kaczmarz" if mode == "kla" else "gdn",
                normalize_queries=mode == "kla",
            )
            return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)

        def fla():
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule

            leaves = [x.clone().requires_grad_(True) for x in (q, k, v, gl, beta)]
            o, _ = chunk_gated_delta_rule(*leaves, scale=1.0, output_final_state=False)
            return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)

        variants = {
            "ours": (("ours, GDN", lambda: ours("gdn")), ("ours, KLA", lambda: ours("kla"))),
            "fla": (("fla chunk_gated_delta_rule (GDN), guard #640 bypassed", fla),),
        }[which]
        for name, make in variants:
            try:
                t0 = time.time()
                fn = make()
                fn()  # compile / autotune
                _sync()
                compile_s = time.time() - t0
                row = {
                    "op": name,
                    "shape": list(size),
                    "dtype": "bfloat16",
                    "compile_s": compile_s,
                    "gpu_ms": _gpu_ms(fn) if _DEVICE == "cuda" else None,
                    "wall": _wall(fn, reps=20 if _DEVICE == "cuda" else 2),
                }
            except Exception as e:  # noqa: BLE001 - report and go on
                row = {"op": name, "shape": list(size), "error": f"{type(e).__name__}: {e}"[:400]}
            log(json.dumps(row))
            rows.append(row)
            if _DEVICE == "cuda":
                torch.cuda.empty_cache()
    return rows


def validation(log, examples: int) -> list:
    from analysis.testing import harness
    from analysis.testing.gradient_harness import (
        inconclusive,
        kla_backward,
        kla_kernel_gradients,
        reference_gradients,
        with_gate_dtype,
    )

    rows = []
    for precision, model, gate in (
        ("bfloat16", "bfloat16/storage", torch.bfloat16),
        ("float32", "float32", None),
    ):
        t0 = time.time()
        strat = kla_backward(
            max_T=300, dims=(64, 128), chunk_size=64, gate_dtype=gate, device="cuda"
        )
        rep = harness.check(
            kla_kernel_gradients,
            with_gate_dtype(reference_gradients, gate),
            strat,
            precision=precision,
            model=model,
            examples=examples,
            device="cuda",
        )
        rows.append(_summary(rep, precision, model, time.time() - t0, inconclusive))
        log(str(rep))
        log(json.dumps(rows[-1]))
    return rows


def _summary(rep, precision, model, seconds, inconclusive) -> dict:
    worst = {}
    for f in rep.history:
        w = worst.setdefault(f.output, {"ratio": 0.0, "n": 0, "inconclusive": 0})
        w["ratio"] = max(w["ratio"], f.ratio)
        w["n"] += 1
    for f in inconclusive(rep):
        worst[f.output]["inconclusive"] += 1
    return {
        "precision": precision,
        "model": model,
        "examples": rep.examples,
        "passed": rep.passed,
        "failure": str(rep.failure) if rep.failure else None,
        "error": rep.error,
        "worst_by_output": worst,
        "seconds": seconds,
    }


def _record_relative(worst: dict, found, label: str) -> None:
    """Keep, per output, the largest error / ||reference|| seen so far and its case."""
    for f in found:
        if f.reference_norm and math.isfinite(f.reference_norm):
            rel = f.error / f.reference_norm
            if rel > worst.get(f.output, {}).get("relative", -1.0):
                worst[f.output] = {"relative": rel, "case": label}


def search_fla(
    log, deadline: float, out_path: str, tiny: bool = False, dims=(128,), heads=(16,)
) -> dict:
    """Random cases of the strategy on fla until the deadline; every finding logged, the
    summary rewritten to ``out_path`` after every case (a killed run keeps what it found).

    Shapes: by default H = HV = 16 and d_k = d_v = 128, the timing's (fla autotunes per H, HV,
    K, V, so these reuse its binaries); ``dims``/``heads`` choose others (d_k = 64 is the head
    dimension at which fla's Hopper guard reports its gated dk/dg fault: its key block is then 64
    wide); T, B, packed sequences, gates, beta, initial state and the final-state cotangent vary.
    Beside the verdicts it records, per output, the largest relative distance to the float32
    reference (error / ||reference||): a measured number, not a verdict, which shows a gross
    fault even where the bf16 bound is vacuous. ``tiny``: H = 2, d = 16, T <= 40 and our kernel in fla's place
    (TRITON_INTERPRET=1, to test this script on a CPU)."""
    from analysis.testing import harness
    from analysis.testing.gradient_harness import (
        fla_gdn_gradients,
        kla_backward,
        kla_kernel_gradients,
        reference_gradients,
    )
    from solvers import Arith

    if tiny:
        kernel, shape = kla_kernel_gradients, dict(max_T=40, dims=(16,), heads=(2,), chunk_size=16)
    else:
        import fla.ops.common.chunk_o as chunk_o

        chunk_o.TRITON_ABOVE_3_7_1 = True  # bypass the #640 guard (its only condition)
        kernel, shape = (
            fla_gdn_gradients,
            dict(max_T=260, dims=tuple(dims), heads=tuple(heads), chunk_size=64),
        )
    strat = kla_backward(
        modes=("gdn",), gva=False, varlen=True, positive_inputs=True, device=_DEVICE, **shape
    )
    model = Arith(torch.bfloat16)
    out = {
        "kernel": harness._name(kernel),
        "shapes": {k: list(v) if isinstance(v, tuple) else v for k, v in shape.items()},
        "cases": 0,
        "failures": [],
        "worst": None,
        "worst_conclusive": None,
        "inconclusive_findings": 0,
        "findings": 0,
        "labels": [],
        "worst_relative": {},
    }
    warnings.simplefilter("ignore")
    while time.time() < deadline:
        t_case = time.time()
        case = strat.cases.example()
        try:
            found = harness.run_case(
                kernel,
                reference_gradients,
                strat,
                case,
                precision=torch.bfloat16,
                model=model,
                device=torch.device(_DEVICE),
            )
        except Exception as e:  # noqa: BLE001 - a crash is a finding
            out["failures"].append({"case": case.label, "error": f"{type(e).__name__}: {e}"[:300]})
            log(f"CRASH {case.label}: {e}")
            continue
        out["cases"] += 1
        out["findings"] += len(found)
        out["inconclusive_findings"] += sum(f.vacuous for f in found)
        _record_relative(out["worst_relative"], found, case.label)
        if (
            not tiny
        ):  # our kernel on the same case, for scale: the level a correct bf16 backward reaches
            try:
                ours = harness.run_case(
                    kla_kernel_gradients,
                    reference_gradients,
                    strat,
                    case,
                    precision=torch.bfloat16,
                    model=model,
                    device=torch.device(_DEVICE),
                )
                _record_relative(out.setdefault("ours_worst_relative", {}), ours, case.label)
            except Exception as e:  # noqa: BLE001 - context only; the search goes on
                log(f"ours failed on {case.label}: {e}"[:300])
        worst = max(found, key=lambda f: f.ratio)
        out["labels"].append(f"{worst.ratio:.3g} {worst.output} {case.label}")
        entry = lambda f: {
            "ratio": f.ratio,
            "output": f.output,
            "error": f.error,
            "bound": f.bound,  # noqa: E731
            "reference_norm": f.reference_norm,
            "vacuous": f.vacuous,
            "case": case.label,
        }
        if out["worst"] is None or worst.ratio > out["worst"]["ratio"]:
            out["worst"] = entry(worst)
        conclusive = [f for f in found if not f.vacuous]
        if conclusive:
            wc = max(conclusive, key=lambda f: f.ratio)
            if out["worst_conclusive"] is None or wc.ratio > out["worst_conclusive"]["ratio"]:
                out["worst_conclusive"] = entry(wc)
        bad = [f for f in found if f.failed]
        if bad:
            out["failures"].append({"case": case.label, "findings": [str(f) for f in bad]})
            log(f"FAIL {case.label}: " + "; ".join(f"{f.output} ratio {f.ratio:.3g}" for f in bad))
        else:
            log(
                f"ok   worst {worst.output} ratio {worst.ratio:.3g}{' (vacuous bound)' if worst.vacuous else ''}  "
                f"{case.label}  ({time.time() - t_case:.1f} s)"
            )
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1)
    return out


def gka_matrix(log, examples: int = 12) -> dict:
    """The ``gka_layer_backward`` strategy (analysis.testing.gka_gradient_harness) on ``kernels.gka_layer``'s
    implicit backward and its broken variants (float32 inputs, contract float32/ieee), and the
    truncation gap on fixed cases over the gate regimes, a and r (docs/gradients.md, "The GKA layer")."""
    import collections

    from analysis.testing import harness
    from analysis.testing.gka_gradient_harness import (
        BROKEN_GKA_VARIANTS,
        gka_grad_case,
        gka_implicit_reference,
        gka_kernel_variant,
        gka_layer_backward,
        truncation_gap,
    )

    draws = {
        None: {},
        "dq_without_solve": {},
        "dk_without_lambda": {"gates": ("none", "weak"), "a_values": (0.2, 0.5)},
        "dg_sign": {"gates": ("weak",), "a_values": (0.2, 0.5), "max_T": 5},
    }
    rows = []
    for variant in [None, *BROKEN_GKA_VARIANTS]:
        rep = harness.check(
            gka_kernel_variant(broken_variant=variant),
            gka_implicit_reference,
            gka_layer_backward(device=_DEVICE, **draws[variant]),
            precision="float32",
            model="float32",
            examples=examples,
            device=_DEVICE,
            shrink=False,
            seed=0,
        )  # seeded: the same cases every run
        worst = collections.defaultdict(float)
        tight = collections.defaultdict(list)
        for f in rep.history:
            worst[f.output] = max(worst[f.output], f.ratio)
            if f.reference_norm > 0:
                tight[f.output].append(f.bound / f.reference_norm)
        row = {
            "backward": variant or "implicit (correct)",
            "verdict": rep.verdict,
            "cases": rep.examples,
            "failure": None if rep.failure is None else str(rep.failure),
            "error": rep.error,
            "worst_ratio": {k: float(f"{v:.3g}") for k, v in worst.items()},
            "bound_over_reference": {
                k: [float(f"{min(v):.3g}"), float(f"{max(v):.3g}")] for k, v in tight.items()
            },
            "inconclusive": dict(collections.Counter(f.output for f in rep.history if f.vacuous)),
        }
        log(json.dumps(row))
        rows.append(row)
    gaps = []  # fixed cases over the regimes: gates, a (kappa <= (1 + a) / a) and r
    for gates in ("none", "weak", "strong"):
        for a in (0.05, 0.2):
            for iters in (4, 10, 30):
                case = gka_grad_case(
                    N=1, T=37, D=8, Dv=8, a=a, iters=iters, C=16, gates=gates, seed=1
                )
                gap = {"case": case.label, **truncation_gap(case)}
                log(json.dumps(gap))
                gaps.append(gap)
    return {"matrix": rows, "truncation": gaps}


def matrix(log) -> list:
    """The strategy on the CPU (run under TRITON_INTERPRET=1): the correct backwards (Triton
    and plain torch adjoints) and the broken variants, float32 and bf16 inputs, with the
    worst ratio and the inconclusive count per output (docs/gradients.md's tables)."""
    import collections

    from analysis.testing import harness
    from analysis.testing.gradient_harness import (
        inconclusive,
        kla_backward,
        kla_kernel_variant,
        reference_gradients,
        with_gate_dtype,
    )
    from kernels.kla_backward import BROKEN_VARIANTS

    rows = []
    settings = {"float32": ("float32", None), "bfloat16": ("bfloat16/storage", torch.bfloat16)}
    for prec, (model, gate) in settings.items():
        runs = [
            ("triton", kla_kernel_variant(adjoint="triton"), 30),
            ("torch", kla_kernel_variant(adjoint="torch"), 12),
        ]
        runs += [
            (v, kla_kernel_variant(adjoint="torch", broken_variant=v), 30) for v in BROKEN_VARIANTS
        ]
        for name, kernel, examples in runs:
            rep = harness.check(
                kernel,
                with_gate_dtype(reference_gradients, gate),
                kla_backward(gate_dtype=gate),
                precision=prec,
                model=model,
                examples=examples,
                device="cpu",
                shrink=False,
            )
            worst = collections.defaultdict(float)
            for f in rep.history:
                worst[f.output] = max(worst[f.output], f.ratio)
            row = {
                "precision": prec,
                "backward": name,
                "passed": rep.passed,
                "cases": rep.examples,
                "failure": None if rep.failure is None else str(rep.failure),
                "error": rep.error,
                "worst": {k: round(v, 4) for k, v in worst.items()},
                "inconclusive": dict(collections.Counter(f.output for f in inconclusive(rep))),
            }
            log(json.dumps(row))
            rows.append(row)
    return rows


def smoke(log) -> list:
    """Small shapes, one step at a time, synchronised: which launch fails, if one does."""
    from kernels import kla_chunkwise, kla_chunkwise_trainable

    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for T_, dk, dv in ((1, 64, 64), (133, 128, 64), (200, 128, 128)):
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k = (
                torch.randn(1, T_, 2, dk, generator=g, device="cuda").to(dtype) for _ in range(2)
            )
            v = torch.randn(1, T_, 2, dv, generator=g, device="cuda").to(dtype)
            alpha = 0.5 + 0.5 * torch.rand(1, T_, 2, generator=g, device="cuda")
            eta = torch.rand(1, T_, 2, generator=g, device="cuda")
            h0 = torch.randn(1, 2, dk, dv, generator=g, device="cuda").to(dtype)
            row = {"dtype": str(dtype), "shape": [T_, dk, dv]}
            step = "forward"
            try:
                kla_chunkwise(q, k, v, alpha=alpha, eta=eta, initial_state=h0)
                torch.cuda.synchronize()
                step = "backward"
                x = [t.clone().requires_grad_(True) for t in (q, k, v, alpha, eta, h0)]
                o, S = kla_chunkwise_trainable(*x[:3], alpha=x[3], eta=x[4], initial_state=x[5])
                (o.float().square().sum() + S.float().sum()).backward()
                torch.cuda.synchronize()
                row["ok"] = all(bool(torch.isfinite(t.grad).all()) for t in x)
            except Exception as e:  # noqa: BLE001 - the finding
                import traceback

                row["error"] = f"{step}: {type(e).__name__}: {e}"[:300]
                row["traceback"] = traceback.format_exc()[-1500:]
                log(json.dumps(row))
                rows.append(row)
                return rows
            log(json.dumps(row))
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument(
        "--part",
        choices=(
            "matrix",
            "gka",
            "smoke",
            "validation",
            "timing_ours",
            "timing_fla",
            "search",
            "fla",
        ),
        required=True,
    )
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="tiny sizes, fla replaced by ours (a CPU test of this script)",
    )
    ap.add_argument("--budget", type=float, default=100.0, help="seconds for the search")
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument(
        "--dims", type=int, nargs="+", default=[128], help="head dims the search draws (d_k = d_v)"
    )
    ap.add_argument(
        "--heads", type=int, nargs="+", default=[16], help="head counts the search draws"
    )
    args = ap.parse_args(argv)
    t_start = time.time()
    logf = open(f"{args.out}/kla-backward-gpu.log", "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    import triton

    device = (
        torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (Triton interpreter)"
    )
    head = {
        "part": args.part,
        "device": device,
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    try:
        import fla

        head["fla"] = getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        head["fla"] = f"not importable: {e!r}"[:200]
    log(json.dumps(head))
    sizes = ((1, 40, 2, 16),) if args.tiny else SIZES

    def search():
        return search_fla(
            log,
            t_start + args.budget,
            f"{args.out}/kla-backward-search-partial.json",
            tiny=args.tiny,
            dims=args.dims,
            heads=args.heads,
        )

    parts = {
        "matrix": lambda: matrix(log),
        "smoke": lambda: smoke(log),
        "validation": lambda: validation(log, args.examples),
        "timing_ours": lambda: timing(log, "ours", sizes),
        "timing_fla": lambda: timing(log, "fla", sizes),
        "search": search,
        "gka": lambda: gka_matrix(log, args.examples),
        "fla": lambda: {
            "timing": timing(log, "ours" if args.tiny else "fla", sizes),
            "search": search(),
        },
    }
    try:
        result = parts[args.part]()
    except Exception as e:  # noqa: BLE001
        result = {"error": f"{type(e).__name__}: {e}"[:400]}
        log(f"{args.part} failed: {result['error']}")
    with open(f"{args.out}/kla-backward-{args.part}.json", "w") as f:
        json.dump({**head, "result": result, "seconds": time.time() - t_start}, f, indent=1)
    log(f"{args.part} done in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
