"""A differential check of fla's gated delta-rule backward on Hopper (its "#640" guard).

fla's ``chunk_gated_delta_rule`` refuses its gated backward on Hopper with Triton in
[3.4, 3.7.1): the guard says ``chunk_bwd_dqkwg`` gives wrong results there. fla's own account
places the fault at a key block of 64 (``BK = min(next_pow2(d_k), 128)`` on Hopper, so
d_k = 64), and it shows in dg and dbeta. This script bypasses the guard and runs the same
problem twice through fla:

* as given, d_k = 64 (key block 64);
* with q and k zero-padded to d_k = 128 (key block 128) and the padding cut off the gradients.

In exact arithmetic the two are the same computation (zero key columns add exact zeros to every
product and leave the state's extra rows zero), so a correct kernel gives gradients of the same
accuracy both ways. Both are compared with float64 autograd through the token-by-token
recurrence (``solvers.kla_recurrent``) on the same bf16-rounded inputs. The criterion is the
ratio of the two relative errors per gradient: it needs no rounding bound, and a ratio far above
1 at d_k = 64 (with the padded run at the level of the other gradients) is the fault.

    python benchmarks/fla_640_repro.py --seeds 8 --out DIR        # on a Hopper GPU with fla-core
    TRITON_INTERPRET=1 python benchmarks/fla_640_repro.py --stand-in --seeds 1 --T 16
        # a CPU test of this script: our kernel stands in for fla
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time

import torch
import torch.nn.functional as F

from analysis.argtypes import OneLineParser, positive_int
from analysis.testing.gradient_harness import (
    fla_gdn_forward,
    gradients_of,
    kla_kernel_forward,
    recurrent_forward,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fla_640_kernels as fk  # noqa: E402  (a sibling module; benchmarks/ is not a package)

NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
PATHS = ("fla", "fla_padded", "ours")  # fla as given, q and k zero-padded, our kernel


GATES = {"strong": (-10.0, -9.5), "weak": (-0.02, 0.0)}
BETAS = {"mid": None, "small": (0.0, 0.05), "large": (1.9, 2.0)}
STATES = {"none": (False, False), "h0": (True, False), "dht": (False, True), "both": (True, True)}


def inputs(B, T, H, d, seed, device, gates, states="none", beta="mid", dtype=torch.bfloat16):
    """q, k (unit rows), v, a cotangent do and beta in ``dtype``; g (float32) uniform in
    [-10, -9.5] ("strong"), [-0.02, 0] ("weak") or either per token ("mixed"); beta
    sigmoid(N(0, 1)) ("mid"), U[0, 0.05] ("small") or U[1.9, 2] ("large"); the initial state
    and the final-state cotangent N(0, 1), rounded to ``dtype`` and held in float32 (so a
    kernel storing them in ``dtype`` sees the same values), where ``states`` names them
    (``STATES``), zero otherwise."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    u = lambda lo, hi, *s: lo + (hi - lo) * torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q = F.normalize(r(B, T, H, d), dim=-1)
    k = F.normalize(r(B, T, H, d), dim=-1)
    v = r(B, T, H, d)
    if gates == "mixed":
        g = torch.where(
            torch.rand(B, T, H, generator=gen) < 0.5,
            u(*GATES["strong"], B, T, H),
            u(*GATES["weak"], B, T, H),
        )
    else:
        g = u(*GATES[gates], B, T, H)
    b = torch.sigmoid(r(B, T, H)) if BETAS[beta] is None else u(*BETAS[beta], B, T, H)
    do = r(B, T, H, d)
    cast = lambda x: x.to(dtype).to(device)  # noqa: E731
    with_h0, with_dht = STATES[states]
    h0 = r(B, H, d, d).to(dtype).float() if with_h0 else torch.zeros(B, H, d, d)
    dht = r(B, H, d, d).to(dtype).float() if with_dht else torch.zeros(B, H, d, d)
    return dict(
        q=cast(q),
        k=cast(k),
        v=cast(v),
        g=g.float().to(device),
        beta=cast(b),
        h0=h0.to(device),
        do=cast(do),
        dht=dht.to(device),
    )


def padded(x, width):
    return F.pad(x, (0, width - x.shape[-1]))


def run(kernel_forward, case, pad_to=None):
    """Gradients (dq, dk, dv, dg, dbeta, dh0) of the kernel, with q, k (and h0's key rows) padded
    to ``pad_to`` and the padding cut off again."""
    q, k, h0, dht = case["q"], case["k"], case["h0"], case["dht"]
    d = q.shape[-1]
    if pad_to:
        q, k = padded(q, pad_to), padded(k, pad_to)
        h0 = F.pad(h0, (0, 0, 0, pad_to - d))
        dht = F.pad(dht, (0, 0, 0, pad_to - d))
    grads = gradients_of(kernel_forward)(
        q, k, case["v"], case["g"], case["beta"], h0, case["do"], dht
    )
    dq, dk, dv, dg, dbeta, dh0 = grads
    return dq[..., :d], dk[..., :d], dv, dg, dbeta, dh0[..., :d, :]


def reference(case, scale=1.0):
    """Float64 autograd through the token recurrence on the case's (rounded) values; the query
    multiplied by ``scale`` inside the graph, as fla's ``scale`` does."""
    c64 = {n: x.double() for n, x in case.items()}

    def forward(q, k, v, **kw):
        return recurrent_forward(q * scale, k, v, **kw)

    return gradients_of(forward)(
        c64["q"], c64["k"], c64["v"], c64["g"], c64["beta"], c64["h0"], c64["do"], c64["dht"]
    )


def fla_scaled(scale):
    """fla's ``chunk_gated_delta_rule`` with a query scale (``fla_gdn_forward`` has scale 1)."""

    def forward(q, k, v, *, g, beta, initial_state, **_):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return chunk_gated_delta_rule(
            q,
            k,
            v,
            g.float(),
            beta.to(q.dtype),
            scale=scale,
            initial_state=initial_state.float(),
            output_final_state=True,
        )

    return forward


def fla_test_case(B, T, H, d, seed, device, dtype, normalizer=10.0):
    """The inputs of fla's own ``test_chunk`` for the gated delta rule (the configuration its
    issue #640 reports failing on Hopper: B, T, H, D = 2, 1500, 4, 128, scale 0.1, gates
    logsigmoid(U[0, 1)) / 10, float16): q, k, v uniform in [0, 1) with q and k normalised,
    beta sigmoid(U[0, 1)), zero initial state, cotangents uniform in [0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    cast = lambda x: x.to(dtype).to(device)  # noqa: E731
    return dict(
        q=cast(F.normalize(rand(B, T, H, d), dim=-1)),
        k=cast(F.normalize(rand(B, T, H, d), dim=-1)),
        v=cast(rand(B, T, H, d)),
        g=(F.logsigmoid(rand(B, T, H)) / normalizer).float().to(device),
        beta=cast(torch.sigmoid(rand(B, T, H))),
        h0=torch.zeros(B, H, d, d, device=device),
        do=cast(rand(B, T, H, d)),
        dht=rand(B, H, d, d).to(dtype).float().to(device),
    )


def strategy_case(label, device, dtype=torch.bfloat16):
    """Rebuild a ``kla_backward`` strategy case (analysis.testing.gradient_harness) from its
    label, for GDN cases without packed sequences or positive inputs: the same generator, the
    same draws in the same order, every input rounded to ``dtype`` as the harness rounds."""
    fields = dict(re.findall(r"(\w+)=(\S+)", label.replace("B,T,H,HV=", "shape=")))
    B, T, H, HV = (int(x) for x in fields["shape"].strip("()").split(","))
    d_k, d_v, seed = int(fields["d_k"]), int(fields["d_v"]), int(fields["seed"])
    if "positive" in label or fields.get("mode") != "gdn" or fields["cu_seqlens"] != "None":
        raise ValueError(
            f"strategy_case rebuilds GDN cases without packing or positive inputs: {label!r}"
        )
    gen = torch.Generator().manual_seed(seed)
    f64 = dict(dtype=torch.float64, generator=gen)
    k = F.normalize(torch.randn(B, T, H, d_k, **f64), dim=-1)
    q = F.normalize(torch.randn(B, T, H, d_k, **f64), dim=-1)
    v = torch.randn(B, T, HV, d_v, **f64)
    u = torch.rand(B, T, HV, **f64)
    weak, strong = -0.02 * u, -10.0 + 0.5 * u
    # the strategy builds every regime's array before choosing one: the "mixed" draw is
    # consumed whatever the regime
    mixed = torch.where(torch.rand(B, T, HV, **f64) < 0.5, weak, strong)
    g = {"weak": weak, "strong": strong, "mixed": mixed}[fields["gates"]]
    w = torch.rand(B, T, HV, **f64)
    small, large = 0.02 * w, 1.95 + 0.05 * w
    mixed = torch.where(torch.rand(B, T, HV, **f64) < 0.5, small, large)
    beta = {"small": small, "large": large, "mixed": mixed}[fields["beta"]]
    zeros = torch.zeros(B, HV, d_k, d_v, dtype=torch.float64)
    h0 = torch.randn(B, HV, d_k, d_v, **f64) if fields["h0"] == "random" else zeros
    do = torch.randn(B, T, HV, d_v, **f64)
    dht = torch.randn(B, HV, d_k, d_v, **f64) if fields["dht"] == "random" else zeros
    r = lambda x: x.to(dtype).to(device)  # noqa: E731
    held = lambda x: x.to(dtype).float().to(device)  # noqa: E731
    return dict(
        q=r(q), k=r(k), v=r(v), g=held(g), beta=r(beta), h0=held(h0), do=r(do), dht=held(dht)
    )


def _query_scaled(forward, scale):
    def scaled(q, k, v, **kw):
        return forward((q * scale).to(q.dtype), k, v, **kw)

    return scaled


def problems(args, device, dtype):
    """(description, case, scale) for every problem the options ask for, in the order run."""
    if args.strategy_case:
        for label in args.strategy_case:
            meta = {"strategy_case": label, "dtype": args.dtype}
            yield meta, strategy_case(label, device, dtype), 1.0
        return
    if args.fla_test:
        for seed in range(args.seeds):
            for T in args.T:
                meta = {"fla_test": True, "T": T, "seed": seed, "B": args.B, "H": args.H}
                meta |= {"d": args.D, "dtype": args.dtype}
                case = fla_test_case(args.B, T, args.H, args.D, seed, device, dtype)
                yield meta, case, 0.1
        return
    grid = [(g, st, T) for g in args.gates for st in args.states for T in args.T]
    for seed in range(args.seeds):
        for gates, states, T in grid:
            beta = ("mid", "small", "large")[seed % 3]
            meta = {"gates": gates, "states": states, "beta": beta, "T": T, "seed": seed}
            meta |= {"B": args.B, "H": args.H, "d": args.D, "dtype": args.dtype}
            case = inputs(args.B, T, args.H, args.D, seed, device, gates, states, beta, dtype)
            yield meta, case, 1.0


def relative(a, ref):
    n = ref.norm().item()
    return (a.double() - ref).norm().item() / n if n > 0 else float("nan")


# ---------------------------------------------------------------------------------------
# the two suspect kernels, captured in a real backward and checked against their arithmetic
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def captured_kernels(calls: list):
    """Record every call of fla's ``chunk_bwd_dqkwg`` and ``prepare_wy_repr_bwd`` made by the
    gated delta rule's backward: ``(name, keyword operands, outputs)``, cloned at return (fla
    adds into dg afterwards)."""
    import fla.ops.gated_delta_rule.chunk as gdr

    originals = {
        "chunk_bwd_dqkwg": gdr.chunk_bwd_dqkwg,
        "prepare_wy_repr_bwd": gdr.prepare_wy_repr_bwd,
    }

    def recorder(name):
        def call(**kw):
            out = originals[name](**kw)
            keep = {n: x.detach().clone() if torch.is_tensor(x) else x for n, x in kw.items()}
            calls.append(
                (name, keep, tuple(None if x is None else x.detach().clone() for x in out))
            )
            return out

        return call

    for name in originals:
        setattr(gdr, name, recorder(name))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(gdr, name, fn)


def _autotuner(kernel):
    from triton.runtime.autotuner import Autotuner

    while not isinstance(kernel, Autotuner):
        kernel = kernel.fn
    return kernel


@contextlib.contextmanager
def forced_config(kernel, config):
    """Run ``kernel`` (an fla autotuned Triton kernel) with one configuration."""
    at = _autotuner(kernel)
    configs = at.configs
    at.configs = [config]
    try:
        yield
    finally:
        at.configs = configs


def _emulated(name, kw, **opts):
    if name == "chunk_bwd_dqkwg":
        return fk.emulate_dqkwg(
            kw["q"],
            kw["k"],
            kw["v"],
            kw["g"],
            kw["h"],
            kw["do"],
            kw["dh"],
            kw["dv"],
            kw["scale"],
            **opts,
        )
    opts.pop("hdh_sum", None)
    return fk.emulate_wy_bwd(
        kw["k"], kw["v"], kw["beta"], kw["g"], kw["A"], kw["dw"], kw["du"], **opts
    )


OUTPUT_NAMES = {
    "chunk_bwd_dqkwg": ("dq", "dk", "dw", "dg"),
    "prepare_wy_repr_bwd": ("dk", "dv", "dbeta", "dg"),
}


def _state_sum_kernel():
    """A Triton kernel that sums ``h o dh`` over each state block exactly as
    ``chunk_bwd_dqkwg`` does (``b_dg_last += tl.sum(b_h * b_dh)``: the product and the sum in
    the input dtype, the V blocks added in float32), one program per key block and state."""
    import triton
    import triton.language as tl

    @triton.jit
    def state_sum(
        h, dh, out, N, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr
    ):
        i_k, i_n = tl.program_id(0), tl.program_id(1).to(tl.int64)
        h += i_n * K * V
        dh += i_n * K * V
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        acc = tl.zeros([1], dtype=tl.float32)
        for i_v in range(tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_h = (o_v < V)[:, None] & m_k[None, :]
            b_h = tl.load(h + o_v[:, None] + o_k[None, :] * V, mask=m_h, other=0.0)
            b_dh = tl.load(dh + o_v[:, None] + o_k[None, :] * V, mask=m_h, other=0.0)
            acc += tl.sum(b_h * b_dh)
        tl.store(out + i_k * N + i_n + tl.arange(0, 1), acc)

    return state_sum


def state_sum_as_kernel(num_warps, tiling=128):
    """``hdh_sum`` for ``fla_640_kernels.emulate_dqkwg``: the kernel's own reduction of
    ``h o dh`` (:func:`_state_sum_kernel`, at fla's key and value blocks for Hopper,
    ``min(next_pow2(d), tiling)``, and the configuration's warp count), returned as float64."""
    import triton

    kernel = _state_sum_kernel()

    def from_stored(h, dh):
        """h, dh: (B, NT, H, K, V) as fla stored them (the kernel reads their dtype)."""
        B, NT, H, K, V = h.shape
        BK = min(max(triton.next_power_of_2(K), 16), tiling)
        BV = min(max(triton.next_power_of_2(V), 16), tiling)
        NK, N = triton.cdiv(K, BK), B * NT * H
        out = torch.empty(NK * N, dtype=torch.float32, device=h.device)
        hc, dhc = h.contiguous(), dh.contiguous()
        kernel[(NK, N)](hc, dhc, out, N, K=K, V=V, BK=BK, BV=BV, num_warps=num_warps)
        return out.reshape(NK, B, NT, H).sum(0).double()

    return from_stored


def _num_warps(config) -> int:
    return int(re.search(r"num_warps: (\d+)", str(config)).group(1))


def _dqkwg_with_replica(kw, num_warps):
    """The round-to-nearest emulation of ``chunk_bwd_dqkwg`` with the state sum computed by
    the kernel's own reduction (:func:`state_sum_as_kernel`) at ``num_warps``."""
    stored = state_sum_as_kernel(num_warps)(kw["h"], kw["dh"])

    def hdh_sum(h, dh):
        # the emulation chunks h as (B, NT, H, K, V): the same layout as stored
        return stored.to(h.device)

    return _emulated("chunk_bwd_dqkwg", kw, hdh_sum=hdh_sum)


def check_kernels(calls, every_config=False, dump=0) -> dict:
    """Faithfulness (``fla_640_kernels.faithfulness``) of each captured call, with the
    configuration fla's autotuner chose and, with ``every_config``, re-run in each of the
    kernel's autotuning configurations on the same operands. Each run's ratios are given under
    the round-to-nearest bound (``autotuned``, ``configs``) and the tensor-core one (``tc``,
    ``configs_tc``); for ``chunk_bwd_dqkwg``'s dg also with the state sum from the kernel's own
    reduction at the run's warp count (``dg_replica``), and with ``dump``, up to that many
    elements of dg over the round-to-nearest bound per run (``fla_640_kernels.exceeding_dg``)."""
    import fla.ops.common.chunk_o as chunk_o
    import fla.ops.gated_delta_rule.wy_fast as wy_fast

    kernels = {
        "chunk_bwd_dqkwg": (chunk_o.chunk_bwd_kernel_dqkwg, chunk_o.chunk_bwd_dqkwg),
        "prepare_wy_repr_bwd": (wy_fast.prepare_wy_repr_bwd_kernel, wy_fast.prepare_wy_repr_bwd),
    }
    res = {}
    for name, kw, out in calls:
        kernel, wrapper = kernels[name]
        judge = _Judge(name, kw, dump)
        best = _autotuner(kernel).best_config
        first = judge(out, best)
        entry = {"autotuned": first.pop("rn"), "tc": first.pop("tc"), "config": str(best)}
        entry |= first
        if every_config:
            entry["configs"], entry["configs_tc"] = {}, {}
            for cfg in list(_autotuner(kernel).configs):
                try:
                    with forced_config(kernel, cfg):
                        again = wrapper(**kw)
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: not run
                    entry.setdefault("not_run", {})[str(cfg)] = f"{type(e).__name__}: {e}"[:200]
                    continue
                found = judge(again, cfg)
                entry["configs"][str(cfg)] = {o: r["ratio"] for o, r in found.pop("rn").items()}
                entry["configs_tc"][str(cfg)] = found.pop("tc")
                for extra, value in found.items():
                    entry.setdefault(f"configs_{extra}", {})[str(cfg)] = value
        res[name] = entry
    return res


class _Judge:
    """One captured call's emulations (round to nearest, tensor core, and for
    ``chunk_bwd_dqkwg`` the kernel's own state sum per warp count), and the verdict on a run."""

    def __init__(self, name, kw, dump):
        self.name, self.kw, self.dump = name, kw, dump
        self.rn = _emulated(name, kw)
        self.tc = _emulated(name, kw, accumulation="tc")
        self.replicas = {}

    def __call__(self, outputs, config) -> dict:
        got = dict(zip(OUTPUT_NAMES[self.name], outputs))
        found = {
            "rn": fk.faithfulness(got, self.rn),
            "tc": {o: r["ratio"] for o, r in fk.faithfulness(got, self.tc).items()},
        }
        if self.name != "chunk_bwd_dqkwg":
            return found
        rep = None
        try:
            warps = _num_warps(config)
            if warps not in self.replicas:
                self.replicas[warps] = _dqkwg_with_replica(self.kw, warps)
            rep = self.replicas[warps]
            found["dg_replica"] = {
                "rn": fk.ratios(got["dg"], *rep["dg"]).max().item(),
                "tc": fk.ratios(got["dg"], rep["dg"][0], self.tc["dg"][1]).max().item(),
                "over_rn": int((fk.ratios(got["dg"], *rep["dg"]) > 1).sum()),
            }
        except Exception as e:  # noqa: BLE001 - the replica is an extra; the check stands
            found["dg_replica"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        if self.dump:
            unit = fk.UNIT[self.kw["q"].dtype]
            found["dg_exceeding"] = fk.exceeding_dg(
                got["dg"], self.rn, self.tc, unit, replica=rep, limit=self.dump
            )
        return found


def _reverse_cumsum(x, BT=64):
    """Chunk-local reverse cumulative sum over the time axis (dim 1)."""
    c = fk._chunks(x, BT)
    return fk._unchunk(c.flip(-1).cumsum(-1).flip(-1), x.shape[1])


def dg_anatomy(calls, fla_dg, ref_dg) -> dict:
    """Where fla's dg error comes from. fla sums two kernels' gradients w.r.t. the chunk-local
    cumulative gate and takes their reverse cumulative sum over the chunk. ``emulated``: that
    sum from the float64 recomputation on the operands fla stored (its distance to the
    float64 reference is the error inherited from the stored operands, before either kernel
    rounds anything); ``kappa_terms`` = ||revcumsum(sum of |terms|)|| / ||dg|| and
    ``kappa_cumsum`` = ||revcumsum(|dg_c|)|| / ||dg||: how much larger dg's summands are than
    dg (relative errors in the summands are amplified by up to these factors)."""
    emus = {name: _emulated(name, kw) for name, kw, _ in calls}
    dgc = emus["chunk_bwd_dqkwg"]["dg"][0] + emus["prepare_wy_repr_bwd"]["dg"][0]
    terms = (
        emus["chunk_bwd_dqkwg"]["dg_summands"][0] + emus["prepare_wy_repr_bwd"]["dg_summands"][0]
    )
    emulated = _reverse_cumsum(dgc)
    kernel_dgc = sum(out[3].double() for name, _, out in calls)
    n = ref_dg.norm().item()
    return {
        "dg_norm": n,
        "emulated_vs_reference": (emulated - ref_dg).norm().item() / n,
        "fla_vs_emulated": (fla_dg.double() - emulated).norm().item() / n,
        "fla_vs_its_kernels": (fla_dg.double() - _reverse_cumsum(kernel_dgc)).norm().item() / n,
        "kappa_terms": _reverse_cumsum(terms).norm().item() / n,
        "kappa_cumsum": _reverse_cumsum(dgc.abs()).norm().item() / n,
    }


def exact_operands(case, scale=1.0, BT=64):
    """The operands fla's two suspect kernels receive, in exact (float64) arithmetic, for a
    sequence of one chunk (T <= 64): the chunk-local cumulative gate ``G`` (base 2), the WY
    blocks ``A = (I + strictly_lower(beta k k^T o exp(g_t - g_s)))^-1``, ``w = A (k beta e^g)``,
    ``u = A (v beta)``, ``v_new = u - w h0``, the state adjoint ``dh = dht`` and
    ``dv = dv_local + (k o exp(g_L - g)) dht`` with ``dv_local_s = sum_{t >= s} scale
    (q_t . k_s) exp(g_t - g_s) do_t``. Returns ``(dqkwg keywords, wy keywords)``."""
    c = {n: x.double() for n, x in case.items()}
    q, k, v, beta, do = c["q"], c["k"], c["v"], c["beta"], c["do"]
    B, T, H, K = q.shape
    if T > BT:
        raise ValueError(f"exact_operands covers one chunk (T <= {BT}), got T = {T}")
    gl = c["g"].cumsum(1)  # natural log, (B, T, H)
    hd = lambda x: x.transpose(1, 2)  # noqa: E731  (B, H, T, ...)
    qh, kh, vh, doh, bh, gh = hd(q), hd(k), hd(v), hd(do), hd(beta), hd(gl)
    gap = gh[..., :, None] - gh[..., None, :]
    i = torch.arange(T, device=q.device)
    strict, causal = i[:, None] > i[None, :], i[:, None] >= i[None, :]
    decay = lambda mask: torch.where(mask, gap, torch.full_like(gap, -torch.inf)).exp()  # noqa: E731
    Lm = bh[..., None] * (kh @ kh.transpose(-1, -2)) * decay(strict)
    A = torch.linalg.inv(torch.eye(T, dtype=q.dtype, device=q.device) + Lm)
    w = A @ (kh * (bh * gh.exp())[..., None])
    u = A @ (vh * bh[..., None])
    h0, dht = c["h0"], c["dht"]  # (B, H, K, V)
    v_new = u - w @ h0
    P = scale * (qh @ kh.transpose(-1, -2)) * decay(causal)
    dv = P.transpose(-1, -2) @ doh + (kh * (gh[..., -1:] - gh).exp()[..., None]) @ dht
    back = lambda x: x.transpose(1, 2)  # noqa: E731
    G = gl / math.log(2.0)
    Ap = torch.zeros(B, H, T, BT, dtype=q.dtype, device=q.device)
    Ap[..., :T] = A
    dqkwg = dict(q=q, k=k, v=back(v_new), g=G, h=h0[:, None], do=do, dh=dht[:, None], dv=back(dv))
    wy = dict(
        k=k, v=v, beta=beta, g=G, A=back(Ap), dw=back(-(dv @ h0.transpose(-1, -2))), du=back(dv)
    )
    return dqkwg | {"scale": scale}, wy


def _exact_gate_gradients(case, scale=1.0):
    """The two kernels' gate gradients summed (``dgc``) and the sum of their summands' magnitudes
    (``terms``), both in exact (float64) arithmetic on :func:`exact_operands` (one chunk)."""
    kw1, kw2 = exact_operands(case, scale)
    e1, e2 = fk.emulate_dqkwg(**kw1), fk.emulate_wy_bwd(**kw2)
    return e1["dg"][0] + e2["dg"][0], e1["dg_summands"][0] + e2["dg_summands"][0]


def exact_anatomy(case, scale=1.0) -> dict:
    """fla's decomposition of dg in exact arithmetic (one chunk): the reverse cumulative sum of
    the two kernels' gate gradients (``dg_from_decomposition``, which must equal the float64
    reference: a check of the decomposition), and how much larger dg's summands are than dg
    (``kappa_terms``, ``kappa_cumsum`` as in :func:`dg_anatomy`)."""
    dgc, terms = _exact_gate_gradients(case, scale)
    dg = _reverse_cumsum(dgc)
    ref = reference(case, scale)[3]
    n = ref.norm().item()
    return {
        "dg_norm": n,
        "decomposition_vs_reference": (dg - ref).norm().item() / n,
        "kappa_terms": _reverse_cumsum(terms).norm().item() / n,
        "kappa_cumsum": _reverse_cumsum(dgc.abs()).norm().item() / n,
    }


def simulated_dg(case, scale=1.0, dtype=torch.bfloat16) -> dict:
    """fla's dg in float32 without a GPU (one chunk): the exact operands stored in ``dtype`` as
    fla stores them (the gate in float32), both kernels' steps run in float32 by
    ``fla_640_kernels`` (round to nearest), the reverse cumulative sum in float32. Returns the
    norm-wise relative error against the float64 reference, the largest per-token relative
    error and the per-token amplification ``revcumsum(sum of |terms|)_t / |dg_t|``."""
    kw1, kw2 = exact_operands(case, scale)
    stored = lambda x: x.to(dtype) if torch.is_tensor(x) else x  # noqa: E731
    for kw in (kw1, kw2):
        for n in kw:
            kw[n] = kw[n].float() if n == "g" else stored(kw[n])
    f32 = dict(work=torch.float32)
    dgc = fk.emulate_dqkwg(**kw1, **f32)["dg"][0] + fk.emulate_wy_bwd(**kw2, **f32)["dg"][0]
    dg = _reverse_cumsum(dgc)
    exact = _reverse_cumsum(_exact_gate_gradients(case, scale)[1])  # revcumsum(sum of |terms|)
    ref = reference(case, scale)[3]
    nonzero = ref.abs().flatten() > 0  # dg_t = 0 exactly where S_{t-1} = 0 (t = 0, h0 = 0)
    per_token = ((dg.double() - ref).abs() / ref.abs()).flatten()[nonzero]
    kappa_t = (exact / ref.abs()).flatten()[nonzero]
    worst = int(per_token.argmax())
    return {
        "normwise": (dg.double() - ref).norm().item() / ref.norm().item(),
        "median_per_token": per_token.median().item(),
        "largest_per_token": per_token[worst].item(),
        "kappa_at_that_token": kappa_t[worst].item(),
        "tokens_over_0.1": int((per_token > 0.1).sum()),
        "tokens": per_token.numel(),
        "median_kappa_t": kappa_t.median().item(),
    }


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=positive_int, default=8, help="problems per class (default 8)")
    ap.add_argument(
        "--T",
        type=positive_int,
        nargs="+",
        default=[64, 130],
        help="sequence lengths (default 64 130)",
    )
    ap.add_argument("--B", type=positive_int, default=2)
    ap.add_argument("--H", type=positive_int, default=4)
    ap.add_argument(
        "--gates",
        nargs="+",
        default=["strong", "weak", "mixed"],
        choices=("strong", "weak", "mixed"),
    )
    ap.add_argument(
        "--states",
        nargs="+",
        default=list(STATES),
        choices=list(STATES),
        help="which of the initial state (h0) and final-state cotangent (dht) are random (default all four)",
    )
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument(
        "--D", type=positive_int, default=64, help="head dimension d_k = d_v (default 64)"
    )
    ap.add_argument(
        "--fla-test",
        action="store_true",
        help="fla's own test inputs (positive, scale 0.1, weak logsigmoid gates) at --B --T --H --D",
    )
    ap.add_argument(
        "--strategy-case",
        nargs="+",
        default=None,
        metavar="LABEL",
        help="rebuild kla_backward strategy cases from their labels instead of the grid",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="stop drawing problems after this many seconds (0: none)",
    )
    ap.add_argument("--no-pad", action="store_true", help="skip the run zero-padded to d_k = 128")
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="capture fla's two suspect kernels and check each against its arithmetic",
    )
    ap.add_argument(
        "--every-config",
        action="store_true",
        help="with --kernels: re-run both in every autotuning configuration",
    )
    ap.add_argument(
        "--dump",
        type=int,
        default=0,
        help="with --kernels: record up to this many elements of dg over the bound per run",
    )
    ap.add_argument(
        "--ours", action="store_true", help="our kernel on the same problems, for scale"
    )
    ap.add_argument(
        "--stand-in",
        action="store_true",
        help="our kernel in fla's place (a CPU test of the script)",
    )
    ap.add_argument(
        "--cpu-anatomy",
        action="store_true",
        help="no fla, no GPU: fla's dg decomposition in exact arithmetic and in float32 "
        "(one chunk, T <= 64)",
    )
    ap.add_argument("--out", default=None, help="folder for fla-640[-TAG].json")
    ap.add_argument("--tag", default="", help="suffix of the JSON file's name")
    args = ap.parse_args(argv)
    if not args.budget >= 0:  # NaN too
        ap.error(f"argument --budget: expected seconds >= 0, got {args.budget}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    t_start = time.time()

    def stand_in(q, k, v, *, g, beta, initial_state, **kw):
        return kla_kernel_forward(
            q, k, v, g=g, beta=beta, initial_state=initial_state.to(q.dtype), chunk_size=16, **kw
        )

    def ours(q, k, v, *, g, beta, initial_state, **kw):
        return kla_kernel_forward(
            q, k, v, g=g, beta=beta, initial_state=initial_state.to(q.dtype), chunk_size=64, **kw
        )

    if args.cpu_anatomy:
        for meta, case, scale in problems(args, "cpu", dtype):
            exact, sim = exact_anatomy(case, scale), simulated_dg(case, scale, dtype)
            print(_describe(meta))
            print("  exact:  " + ", ".join(f"{k} {v:.3g}" for k, v in exact.items()))
            print("  float32: " + ", ".join(f"{k} {v:.3g}" for k, v in sim.items()), flush=True)
        return 0
    if args.stand_in:
        forward = stand_in
        args.kernels = False
    else:
        try:
            import fla.ops.common.chunk_o as chunk_o
        except ImportError as e:
            ap.error(f"fla-core is needed for this run (or --stand-in / --cpu-anatomy): {e}")
        chunk_o.TRITON_ABOVE_3_7_1 = True  # bypass the guard (its only condition)
        forward = fla_gdn_forward
    rows = []
    out_path = f"{args.out}/fla-640{'-' + args.tag if args.tag else ''}.json" if args.out else None
    for meta, case, scale in problems(args, device, dtype):
        if args.budget and time.time() - t_start > args.budget:
            break
        t0 = time.time()
        fwd = forward
        if scale != 1.0:  # the stand-in scales the (rounded) query itself
            fwd = fla_scaled(scale) if not args.stand_in else _query_scaled(forward, scale)
        ref = reference(case, scale)
        calls = []
        if args.kernels:
            with captured_kernels(calls):
                given = run(fwd, case)
        else:
            given = run(fwd, case)
        row = dict(meta)
        for name, a, r in zip(NAMES, given, ref):
            row[name] = {"fla": relative(a, r)}
        if not args.no_pad:
            for name, b, r in zip(NAMES, run(fwd, case, pad_to=2 * args.D), ref):
                row[name]["fla_padded"] = relative(b, r)
        if args.ours:
            for name, c, r in zip(NAMES, run(ours, case), ref):
                row[name]["ours"] = relative(c, r)
        if calls:
            row["kernels"] = check_kernels(calls, every_config=args.every_config, dump=args.dump)
            row["dg_anatomy"] = dg_anatomy(calls, given[3], ref[3])
        row["seconds"] = time.time() - t0
        rows.append(row)
        print(_line(row), flush=True)
        if out_path:
            with open(out_path, "w") as f:
                json.dump(
                    {
                        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                        "stand_in": args.stand_in,
                        "rows": rows,
                        "summary": summary(rows),
                    },
                    f,
                )
    s = summary(rows)
    print(f"{s['problems']} problems; largest distance to float64 per gradient and path:")
    for key, w in s["largest_relative"].items():
        print(f"  {key}: {w['value']:.3g}  {w['case']}")
    if s["worst_kernel_ratio"]:
        print(f"{s['kernel_checks']} kernel checks; worst ratio {s['worst_kernel_ratio']}")
        print(f"tensor-core bound: worst ratio {s['worst_kernel_ratio_tc']}")
        print(f"dg over the round-to-nearest bound: {s['dg_exceeding']}")
        print(f"dg anatomy (largest inherited error): {s['dg_anatomy_worst']}", flush=True)
    return 0


def _line(row) -> str:
    """One problem: each gradient's distance to float64 (key block 64 / padded 128 / ours),
    the per-kernel worst ratio and the dg anatomy."""

    def fmt(name):
        r = row[name]
        return f"{name} " + "/".join(f"{r[k]:.2e}" for k in PATHS if k in r)

    text = f"{_describe(row)}: " + "  ".join(fmt(n) for n in NAMES)
    if "kernels" in row:
        worst, tc = _worst_kernel_ratio(row), _worst_kernel_ratio(row, "tc")
        ex = _exceeding_summary([row])
        a = row["dg_anatomy"]
        text += (
            f"  | kernels: worst ratio {worst[0]:.3g} ({worst[1]}), tensor-core {tc[0]:.3g}"
            f" ({tc[1]}), dg with the kernel's state sum {ex['worst_dg_replica_rn']}"
            f" (tc {ex['worst_dg_replica_tc']}), over: {ex['exceeding_dumped']} dumped,"
            f" {ex['exceeding_on_last_rows']} on last rows,"
            f" largest {ex['largest_state_units']} u_in sum|h dh|"
            f"  | dg: emulated {a['emulated_vs_reference']:.2e}, fla-emulated {a['fla_vs_emulated']:.1e},"
            f" kappa_terms {a['kappa_terms']:.3g}, kappa_cumsum {a['kappa_cumsum']:.3g}"
        )
    return text + f"  ({row['seconds']:.1f} s)"


def _describe(row) -> str:
    keys = ("dtype", "strategy_case", "fla_test", "gates", "states", "beta", "T", "seed")
    return " ".join(f"{k}={row[k]}" for k in keys if k in row)


def _worst_kernel_ratio(row, model="rn"):
    """The largest ratio over the row's kernel runs and outputs, under the round-to-nearest
    bound (``model="rn"``) or the tensor-core one (``"tc"``), and where."""
    worst = (0.0, "")
    for kname, entry in row.get("kernels", {}).items():
        if model == "rn":
            runs = {"autotuned": {o: r["ratio"] for o, r in entry["autotuned"].items()}}
            runs.update(entry.get("configs", {}))
        else:
            runs = {"autotuned": entry["tc"]} | entry.get("configs_tc", {})
        for cfg, outs in runs.items():
            for out, ratio in outs.items():
                if ratio > worst[0]:
                    worst = (ratio, f"{kname} {out} {cfg}")
    return worst


def _dg_runs(row, key):
    """``chunk_bwd_dqkwg``'s per-run extras (``dg_replica``, ``dg_exceeding``), every run."""
    entry = row.get("kernels", {}).get("chunk_bwd_dqkwg", {})
    runs = [entry[key]] if key in entry else []
    return runs + list(entry.get(f"configs_{key}", {}).values())


def _exceeding_summary(rows) -> dict:
    """Over every run: the worst dg ratio with the kernel's own state sum (round to nearest and
    tensor core), and the dumped elements of dg over the round-to-nearest bound: how many, how
    many on a chunk's last row, the worst ratio under the tensor-core bound and with the
    kernel's own state sum, and the largest distance in units of the input dtype's rounding of
    the state term."""
    rep = [r for row in rows for r in _dg_runs(row, "dg_replica") if "rn" in r]
    errors = {r["error"] for row in rows for r in _dg_runs(row, "dg_replica") if "error" in r}
    ex = [e for row in rows for run in _dg_runs(row, "dg_exceeding") for e in run]
    units = [
        abs(e["diff_in_unit_state_magnitudes"]) for e in ex if e["diff_in_unit_state_magnitudes"]
    ]
    return {
        "replica_runs": len(rep),
        "replica_errors": sorted(errors),
        "worst_dg_replica_rn": max((r["rn"] for r in rep), default=None),
        "worst_dg_replica_tc": max((r["tc"] for r in rep), default=None),
        "exceeding_dumped": len(ex),
        "exceeding_on_last_rows": sum(e["last_row_of_chunk"] for e in ex),
        "worst_exceeding_ratio_rn": max((e["ratio_rn"] for e in ex), default=None),
        "worst_exceeding_ratio_tc": max((e["ratio_tc"] for e in ex), default=None),
        "worst_exceeding_ratio_rn_replica": max(
            (e.get("ratio_rn_replica", float("nan")) for e in ex), default=None
        ),
        "largest_state_units": max(units, default=None),
    }


def summary(rows) -> dict:
    """Problem count, the largest distance to float64 per gradient and path, and the worst
    per-kernel ratio (over 1: a kernel did not do its own arithmetic) under the
    round-to-nearest and the tensor-core bounds, and :func:`_exceeding_summary`."""
    s = {
        "problems": len(rows),
        "largest_relative": {},
        "kernel_checks": 0,
        "worst_kernel_ratio": None,
    }
    for name in NAMES:
        for path in PATHS:
            vals = [(r[name][path], r) for r in rows if path in r[name]]
            if vals:
                v, r = max(vals, key=lambda x: x[0])
                s["largest_relative"][f"{name} {path}"] = {
                    "value": v,
                    "case": _describe(r),
                }
    checked = [r for r in rows if "kernels" in r]
    if checked:
        s["kernel_checks"] = sum(
            1 + len(e.get("configs", {})) for r in checked for e in r["kernels"].values()
        )
        for key, model in (("worst_kernel_ratio", "rn"), ("worst_kernel_ratio_tc", "tc")):
            worst = max(checked, key=lambda r: _worst_kernel_ratio(r, model)[0])
            ratio, where = _worst_kernel_ratio(worst, model)
            s[key] = {"ratio": ratio, "where": where, "case": _describe(worst)}
        s["dg_anatomy_worst"] = max(
            (r["dg_anatomy"] | {"case": _describe(r)} for r in checked),
            key=lambda a: a["emulated_vs_reference"],
        )
        s["dg_exceeding"] = _exceeding_summary(checked)
    return s


if __name__ == "__main__":
    raise SystemExit(main())
