"""Per-kernel checks of fla's gated delta-rule backward: each suspect kernel against its own
arithmetic, on the operands it was given.

fla's Hopper guard ("#640") names ``chunk_bwd_dqkwg``; its pull request #826 places the fault in
the transpose of a product result fed to ``tl.dot`` (``tl.trans(b_ds)``), and its issue #984
reports the same pattern wrong in the (ungated) delta rule's ``prepare_wy_repr_bwd`` at a chunk
of 64. Both kernels of the gated rule are checked here:

* ``chunk_bwd_dqkwg`` -> dq, dk, dw, dg (the gradient w.r.t. the chunk-local cumulative gate);
* ``prepare_wy_repr_bwd`` -> dk, dv, dbeta, dg.

:func:`emulate_dqkwg` and :func:`emulate_wy_bwd` recompute each output in float64 from the
operands the kernel received (as stored, bf16 or fp16), rounding to the input dtype exactly
where the kernel converts before a product, and carry a componentwise bound ``E`` on how far a
float32 execution of the same steps may be from that float64 value: ``gamma_n(u_32)`` per
accumulated product, ``6 u_32`` plus ``u_32 |x| ln 2`` per ``exp2(x)`` of a float32 difference,
``2^-126`` absolute per ``exp2`` (flush to zero), and, at every conversion to the input dtype,
the interval ``[R(x - E), R(x + E)]`` the rounded value must lie in (rounding is monotone), so a
value near a rounding boundary may round either way. :func:`faithfulness` returns, per output,
the largest ``|kernel - emulation| / allowed`` over the elements: at most 1 when the kernel did
its arithmetic (with any accumulation order); a wrong product gives ratios in the thousands.

The bound on the tensor-core products is a switch (:func:`dot_error`): round-to-nearest
float32 accumulation (``"rn"``) or the tensor-core block-FMA model with truncation (``"tc"``),
emulated in plain torch by :func:`tc_matmul`. ``chunk_bwd_dqkwg`` sums ``h o dh`` in the input
dtype (bf16 products, a bf16 ``tl.sum``), which no a-priori bound covers at these sizes; the
emulation takes that sum as an argument (``hdh_sum``: :func:`input_dtype_sum` models it, and on
the GPU a replica of the kernel's line supplies it).

The formulas are those of the kernels' steps (fla-core 0.6.0, ``fla/ops/common/chunk_o.py`` and
``fla/ops/gated_delta_rule/wy_fast.py``); the gate ``g`` is fla's chunk-local cumulative log
gate in base 2 (``exp2(g)``), and one head of values per head of keys (H = HV).
"""

from __future__ import annotations

import math

import torch

from analysis import precision

U32 = 2.0**-24
TINY = 2.0**-126  # float32 flush to zero: the absolute error of an underflowing exp2
UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def gamma(n: int) -> float:
    """Higham's gamma_n at float32's unit roundoff (``analysis.precision.gamma``)."""
    return precision.gamma(n, U32)


ACCUMULATIONS = ("rn", "tc")


def dot_error(n: int, extra: int, accumulation: str = "rn", block: int = 1) -> float:
    """Relative error bound of an ``n``-term product of the input dtype accumulated in float32,
    followed by ``extra`` round-to-nearest float32 operations, as a multiple of the sum of the
    terms' magnitudes.

    * ``"rn"``: round-to-nearest accumulation in any order, ``gamma_{n + extra}(u_32)``
      (Higham, Accuracy and Stability, eq. (3.5)).
    * ``"tc"``: a tensor-core block FMA (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior
      of NVIDIA tensor cores", PeerJ CS 7:e330, 2021: products exact, the ``b`` products of a
      block and the accumulator aligned to the largest exponent with the bits below its last
      significant bit dropped, no guard bits, the result truncated to float32). One block
      step then errs by at most ``b`` alignment losses below ``2 u_32 M`` (``M`` its largest
      addend) and one truncation below ``2 u_32 |sum|``: ``theta = 2 u_32 (b + 1 + 2 u_32 b)``
      times the sum of the step's magnitudes (accumulator included), and by induction over the
      ``ceil(n / b)`` steps the bound is ``(1 + theta)^ceil(n / b) - 1``. It is largest at
      ``b = 1`` (about ``4 n u_32``; ``2 n u_32 (1 + 1/b)`` in general), so ``block=1`` holds
      whatever the hardware's block size, extra alignment bits and carry bits (more bits only
      shrink the losses), and for round-to-nearest too."""
    if accumulation == "rn":
        return gamma(n + extra)
    if accumulation != "tc":
        raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {accumulation!r}")
    theta = 2 * U32 * (block + 1 + 2 * U32 * block)
    tc = (1 + theta) ** math.ceil(n / block) - 1
    return (1 + tc) * (1 + gamma(extra)) - 1


def _matmul(a, b, acc=None):
    """``acc + a @ b`` in the operands' precision (the emulation's default product)."""
    return a @ b if acc is None else acc + a @ b


def _truncate_to_float32(x):
    """Round toward zero to 24 significant bits (float32's significand), exactly, in float64."""
    m, e = torch.frexp(x)  # x = m 2^e, 0.5 <= |m| < 1
    return torch.ldexp(torch.trunc(torch.ldexp(m, torch.full_like(e, 24))), e - 24)


def tc_matmul(a, b, acc=None, block: int = 16):
    """``acc + a @ b`` as the tensor-core model of :func:`dot_error` ("tc") computes it, in plain
    torch: products exact (in float64: the operands are bf16 or fp16 values), then per block of
    ``block`` products along the inner dimension, the block and the accumulator aligned to the
    largest exponent with the lower bits dropped (toward zero), summed, and the sum truncated to
    float32. Returns float32 (the accumulator is float32)."""
    a64, b64 = a.double(), b.double()
    c = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float64, device=a.device)
    c = c + (acc.float().double() if acc is not None else 0.0)
    for lo in range(0, a.shape[-1], block):
        p = a64[..., :, lo : lo + block, None] * b64[..., None, lo : lo + block, :]
        terms = torch.cat([c[..., :, None, :], p], dim=-2)
        top = terms.abs().amax(dim=-2, keepdim=True)
        _, e = torch.frexp(top)
        quantum = torch.ldexp(torch.ones_like(top), e - 24)  # float32 ulp at the top exponent
        aligned = torch.trunc(terms / quantum) * quantum
        c = _truncate_to_float32(aligned.sum(dim=-2))
    return c.float()


def _block_sum(h, dh):
    """``sum(h o dh)`` over each (K, V) state block, in the operands' precision."""
    return (h * dh).sum((-1, -2))


def input_dtype_sum(dtype, per_thread: int):
    """``sum(h o dh)`` as a Triton kernel computes ``tl.sum(b_h * b_dh)`` on operands of
    ``dtype`` (bf16 or fp16): each product rounded to ``dtype`` and the sum carried out in
    ``dtype`` (Triton keeps a 16-bit float's sum in its type), here in one plausible order:
    ``per_thread`` consecutive terms added one after another, then those partial sums pairwise.
    The kernel's own order depends on its layout and warp count; this is a model of its size,
    not of its bits."""

    def total(h, dh):
        R = _Rounding(dtype)
        p = R(h * dh).flatten(-2)
        n = p.shape[-1]
        p = p.reshape(*p.shape[:-1], n // per_thread, per_thread)
        acc = p[..., 0]
        for j in range(1, per_thread):
            acc = R(acc + p[..., j])
        while acc.shape[-1] > 1:
            acc = R(acc[..., 0::2] + acc[..., 1::2])
        return acc[..., 0]

    return total


def _chunks(x, BT):
    """(B, T, H, ...) -> (B, NT, H, BT, ...), zero rows past T."""
    B, T = x.shape[:2]
    NT = -(-T // BT)
    x = torch.nn.functional.pad(x, (0,) * (2 * (x.dim() - 2)) + (0, NT * BT - T))
    x = x.reshape(B, NT, BT, *x.shape[2:])
    return x.transpose(2, 3)


def _unchunk(x, T):
    """(B, NT, H, BT, ...) -> (B, T, H, ...)."""
    x = x.transpose(2, 3)
    B, NT, BT = x.shape[:3]
    return x.reshape(B, NT * BT, *x.shape[3:])[:, :T]


def _last_rows(T, BT, NT, device):
    """Index of each chunk's last valid row (within the chunk), and the valid-row mask."""
    rows = torch.arange(NT * BT, device=device).reshape(NT, BT)
    valid = rows < T
    last = (torch.clamp(torch.arange(1, NT + 1, device=device) * BT, max=T) - 1) % BT
    return last, valid


class _Rounding:
    """Conversions to the input dtype and the interval a float32 execution may land in."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, x):
        return x.to(self.dtype).to(x.dtype)

    def spread(self, x, E):
        """Largest distance between R(x) and R(y) over |y - x| <= E."""
        r = self(x)
        return torch.maximum((self(x + E) - r).abs(), (r - self(x - E)).abs())


def _exp2(arg, difference: bool):
    """exp2 as float32 computes it (flushed below 2^-126) and its relative error bound."""
    e = torch.exp2(arg)
    e = torch.where(e < TINY, torch.zeros_like(e), e)
    rel = 6 * U32 + (U32 * arg.abs() * math.log(2.0) if difference else 0.0)
    return e, rel


def emulate_dqkwg(
    q,
    k,
    v,
    g,
    h,
    do,
    dh,
    dv,
    scale,
    BT=64,
    work=torch.float64,
    broken=False,
    accumulation="rn",
    matmul=None,
    hdh_sum=None,
):
    """``chunk_bwd_dqkwg`` (gated, with dw) recomputed in ``work`` precision; returns
    ``{name: (value, E)}`` for dq, dk, dw (as the kernel stores it: ``-dv h^T``) and dg, and
    ``dg_summands`` (the sum of the magnitudes of dg's terms, row by row).

    Per chunk, with rows t and the chunk's last valid row L:
    ``dq = exp2(g_t) scale do h^T + R(ds) k``, ``dk = exp2(g_L - g_t) v dh^T + R(ds)^T q``,
    ``ds_ts = [t >= s] exp2(g_t - g_s) scale (do v^T)_ts``, ``dw = -R(dv) R(h)^T``,
    ``dg_t = <dq_t, q_t> - <dk_t, k_t> + [t = L] (exp2(g_L) <h, dh> + sum_t <dk0_t, k_t>)``
    with ``dk0`` the first term of dk. ``v`` is fla's ``v_new``; h, dh (B, NT, H, K, V).
    ``broken=True`` leaves ``R(ds)`` untransposed in dk (a wrong product of the kind fla's
    Hopper fault makes), for the tests that show the check catches it.

    ``accumulation`` ("rn" or "tc") is the error model of the tensor-core products
    (:func:`dot_error`). ``matmul(a, b, acc)`` computes those products (default exact in
    ``work``; :func:`tc_matmul` for a tensor-core emulation) and ``hdh_sum(h, dh)`` the sum of
    ``h o dh`` over each state block (default exact in ``work``; the kernel multiplies and sums in
    the input dtype: :func:`input_dtype_sum`). ``dg_hdh`` is that term, ``exp2(g_L) <h, dh>``, on
    each chunk's last row, and its magnitude ``exp2(g_L) sum |h o dh|``."""
    R = _Rounding(q.dtype)
    mm = matmul or _matmul
    dot = lambda n: dot_error(n, 2, accumulation)  # noqa: E731
    T = q.shape[1]
    f = lambda x: _chunks(x.to(work), BT)  # noqa: E731
    qc, kc, vc, doc, dvc = f(q), f(k), f(v), f(do), f(dv)
    gc = f(g)
    hh, dhh = h.to(work), dh.to(work)
    rh, rdh = R(hh), R(dhh)
    NT = qc.shape[1]
    V, K = vc.shape[-1], qc.shape[-1]
    last, valid = _last_rows(T, BT, NT, q.device)
    valid = valid[None, :, None, :]  # (1, NT, 1, BT)
    gl = gc.gather(-1, last[None, :, None, None].expand(*gc.shape[:3], 1)).squeeze(-1)
    a = lambda x: x.abs()  # noqa: E731
    tr = lambda x: x.transpose(-1, -2)  # noqa: E731

    eg, rel_g = _exp2(gc, False)
    dq0 = mm(doc, tr(rh)) * eg[..., None] * scale
    dq0_abs = (a(doc) @ tr(a(rh))) * eg[..., None] * scale
    E_dq0 = (dot(V) + rel_g) * dq0_abs + TINY * (a(doc) @ tr(a(rh))) * scale
    ew, rel_w = _exp2(gl[..., None] - gc, True)
    ew = torch.where(valid, ew, torch.zeros_like(ew))
    dk0_raw, dk0_rawabs = mm(vc, tr(rdh)), a(vc) @ tr(a(rdh))
    dk0 = dk0_raw * ew[..., None]
    E_dk0 = (dot(V) + rel_w)[..., None] * dk0_rawabs * ew[..., None] + TINY * dk0_rawabs
    dw = mm(R(dvc), tr(rh))
    E_dw = dot(V) * (a(R(dvc)) @ tr(a(rh)))

    egl, _ = _exp2(gl, False)
    hdh = (hdh_sum or _block_sum)(hh, dhh)
    hdh_abs = (a(hh) * a(dhh)).sum((-1, -2))
    dglast = hdh * egl + (dk0 * kc).sum((-1, -2))
    E_dglast = (
        (gamma(K * V + 2) + 6 * U32) * hdh_abs * egl
        + TINY * hdh_abs
        + (E_dk0 * a(kc)).sum((-1, -2))
        + gamma(BT * K + 2) * ((a(dk0) * a(kc)).sum((-1, -2)) + hdh_abs * egl)
    )

    i = torch.arange(BT, device=q.device)
    causal = (i[:, None] >= i[None, :]) & valid[..., :, None] & valid[..., None, :]
    dgap = gc[..., :, None] - gc[..., None, :]
    es, rel_s = _exp2(torch.where(causal, dgap, torch.zeros_like(dgap)), True)
    es = torch.where(causal, es, torch.zeros_like(es))
    ds_raw, ds_rawabs = mm(doc, tr(vc)), a(doc) @ tr(a(vc))
    ds = ds_raw * es * scale
    E_ds = ((dot(V) + rel_s) * ds_rawabs * es + TINY * ds_rawabs * causal) * scale
    rds = R(ds)
    D_ds = R.spread(ds, E_ds)

    dq = mm(rds, kc, dq0)
    dk = mm(rds if broken else tr(rds), qc, dk0)
    E_dq = E_dq0 + D_ds @ a(kc) + dot(BT) * (a(rds) @ a(kc) + a(dq0))
    E_dk = E_dk0 + tr(D_ds) @ a(qc) + dot(BT) * (tr(a(rds)) @ a(qc) + a(dk0))
    onlast = torch.nn.functional.one_hot(last, BT).to(work)[None, :, None, :]
    dg = (dq * qc).sum(-1) - (dk * kc).sum(-1) + onlast * dglast[..., None]
    E_dg = (
        (E_dq * a(qc)).sum(-1)
        + (E_dk * a(kc)).sum(-1)
        + gamma(K + 3)
        * ((a(dq) * a(qc)).sum(-1) + (a(dk) * a(kc)).sum(-1) + a(onlast * dglast[..., None]))
        + onlast * E_dglast[..., None]
    )
    summands = (a(dq) * a(qc)).sum(-1) + (a(dk) * a(kc)).sum(-1)
    summands = summands + onlast * (hdh_abs * egl + (a(dk0) * a(kc)).sum((-1, -2)))[..., None]
    out = {"dq": (dq, E_dq), "dk": (dk, E_dk), "dw": (-dw, E_dw), "dg": (dg, E_dg)}
    out["dg_summands"] = (summands, torch.zeros_like(summands))
    out["dg_hdh"] = (onlast * (hdh * egl)[..., None], onlast * (hdh_abs * egl)[..., None])
    return {n: (_unchunk(x, T), _unchunk(e, T)) for n, (x, e) in out.items()}


def emulate_wy_bwd(
    k,
    v,
    beta,
    g,
    A,
    dw,
    du,
    BT=64,
    work=torch.float64,
    broken=False,
    accumulation="rn",
    matmul=None,
):
    """``prepare_wy_repr_bwd`` (gated) recomputed in ``work`` precision; returns
    ``{name: (value, E)}`` for dk, dv, dbeta and dg (and ``dg_summands``). ``A`` is stored (B, T, H, BT): the kernel
    reads its transpose, ``At``. Per chunk, with ``e = exp2(g)``, ``kbg = k beta e``:
    ``dA = [t > s] At R(R(dw R(kbg)^T + du R(v beta)^T) At) exp2(g_t - g_s)`` rounded, negated,
    ``dkbg = At dw``, ``dv = beta At du``,
    ``dk = R(dkbg e beta) + beta (dA k) + dA^T R(k beta)``,
    ``dbeta = <dkbg, k e> + <At du, v> + <dA k, k>``,
    ``dg = <dkbg, kbg> + rowsum(dA o (k k^T beta)) - colsum(dA o (k k^T beta))``
    (``dA`` here the rounded, negated, masked block; ``beta`` on the row index).
    ``broken=True`` drops the transpose of ``dA^T R(k beta)`` (the product fla's issue #984
    reports wrong at a chunk of 64), for the tests. ``accumulation`` and ``matmul`` as in
    :func:`emulate_dqkwg`."""
    R = _Rounding(k.dtype)
    mm = matmul or _matmul
    dot = lambda n: dot_error(n, 2, accumulation)  # noqa: E731
    T = k.shape[1]
    f = lambda x: _chunks(x.to(work), BT)  # noqa: E731
    kc, vc, dwc, duc, Ac = f(k), f(v), f(dw), f(du), f(A)
    bc, gc = f(beta), f(g)
    NT = kc.shape[1]
    K, V = kc.shape[-1], vc.shape[-1]
    _, valid = _last_rows(T, BT, NT, k.device)
    valid = valid[None, :, None, :]
    a = lambda x: x.abs()  # noqa: E731
    tr = lambda x: x.transpose(-1, -2)  # noqa: E731
    At = tr(Ac)  # b_A[a, t] = A[t, a]

    e, rel_e = _exp2(gc, False)
    e = torch.where(valid, e, torch.zeros_like(e))
    kbg = kc * (bc * e)[..., None]
    E_kbg = (3 * U32 + rel_e) * a(kbg) + TINY * a(kc * bc[..., None])
    rkbg, D_kbg = R(kbg), R.spread(kbg, E_kbg)
    vb = vc * bc[..., None]
    rvb, D_vb = R(vb), R.spread(vb, U32 * a(vb))
    dA1 = mm(duc, tr(rvb), mm(dwc, tr(rkbg)))
    E_dA1 = (
        a(dwc) @ tr(D_kbg)
        + a(duc) @ tr(D_vb)
        + dot(K + V) * (a(dwc) @ tr(a(rkbg)) + a(duc) @ tr(a(rvb)))
    )
    i = torch.arange(BT, device=k.device)
    strict = (i[:, None] > i[None, :]) & valid[..., :, None] & valid[..., None, :]
    zero = torch.zeros_like(dA1)
    dA1, E_dA1 = torch.where(strict, dA1, zero), torch.where(strict, E_dA1, zero)
    r1, D1 = R(dA1), R.spread(dA1, E_dA1)
    dA2 = mm(r1, At)
    E_dA2 = D1 @ a(At) + dot(BT) * (a(r1) @ a(At))
    r2, D2 = R(dA2), R.spread(dA2, E_dA2)
    dA3 = mm(At, r2)
    E_dA3 = a(At) @ D2 + dot(BT) * (a(At) @ a(r2))
    dgap = gc[..., :, None] - gc[..., None, :]
    es, rel_s = _exp2(torch.where(strict, dgap, torch.zeros_like(dgap)), True)
    dA3e = torch.where(strict, -dA3 * es, zero)
    E_dA3e = torch.where(
        strict, E_dA3 * es + (rel_s + U32) * a(dA3) * es + TINY * (a(dA3) + E_dA3), zero
    )
    dA4, D4 = R(dA3e), R.spread(dA3e, E_dA3e)

    dkbg = mm(At, dwc)
    E_dkbg = dot(BT) * (a(At) @ a(dwc))
    p1 = dkbg * (e * bc)[..., None]
    E_p1 = (E_dkbg + (3 * U32 + rel_e) * a(dkbg)) * (e * bc)[..., None] + TINY * a(
        dkbg * bc[..., None]
    )
    rp1, D_p1 = R(p1), R.spread(p1, E_p1)
    dvb = mm(At, duc)
    E_dvb = dot(BT) * (a(At) @ a(duc))
    dv = dvb * bc[..., None]
    E_dv = (E_dvb + U32 * a(dvb)) * a(bc)[..., None]

    kb = kc * bc[..., None]
    rkb, D_kb = R(kb), R.spread(kb, U32 * a(kb))
    dkb = mm(dA4, kc)
    E_dkb = D4 @ a(kc) + dot(BT) * (a(dA4) @ a(kc))
    t2 = mm(dA4 if broken else tr(dA4), rkb)
    E_t2 = tr(D4) @ a(rkb) + tr(a(dA4)) @ D_kb + dot(BT) * (tr(a(dA4)) @ a(rkb))
    dk = dkb * bc[..., None] + t2 + rp1
    E_dk = (
        (E_dkb + U32 * a(dkb)) * a(bc)[..., None]
        + E_t2
        + D_p1
        + 2 * U32 * (a(dkb * bc[..., None]) + a(t2) + a(rp1))
    )

    s1 = (dkbg * kc * e[..., None]).sum(-1)
    s2 = (dvb * vc).sum(-1)
    s3 = (dkb * kc).sum(-1)
    db = s1 + s2 + s3
    E_db = (
        ((E_dkbg + (2 * U32 + rel_e) * a(dkbg)) * a(kc) * e[..., None]).sum(-1)
        + TINY * (a(dkbg) * a(kc)).sum(-1)
        + (E_dvb * a(vc)).sum(-1)
        + (E_dkb * a(kc)).sum(-1)
        + gamma(2 * K + V + 3)
        * (
            (a(dkbg) * a(kc) * e[..., None]).sum(-1)
            + (a(dvb) * a(vc)).sum(-1)
            + (a(dkb) * a(kc)).sum(-1)
        )
    )

    Akk = mm(kc, tr(kc)) * bc[..., None]
    E_Akk = (dot(K) + U32) * (a(kc) @ tr(a(kc))) * a(bc)[..., None]
    AdA = dA4 * Akk
    E_AdA = D4 * (a(Akk) + E_Akk) + a(dA4) * E_Akk
    s0 = (dkbg * kbg).sum(-1)
    dg = s0 + AdA.sum(-1) - AdA.sum(-2)
    E_dg = (
        (E_dkbg * a(kbg) + a(dkbg) * E_kbg).sum(-1)
        + E_AdA.sum(-1)
        + E_AdA.sum(-2)
        + gamma(K + BT + 3) * ((a(dkbg) * a(kbg)).sum(-1) + a(AdA).sum(-1) + a(AdA).sum(-2))
    )
    out = {"dk": (dk, E_dk), "dv": (dv, E_dv), "dbeta": (db, E_db), "dg": (dg, E_dg)}
    summands = (a(dkbg) * a(kbg)).sum(-1) + a(AdA).sum(-1) + a(AdA).sum(-2)
    out["dg_summands"] = (summands, torch.zeros_like(summands))
    return {n: (_unchunk(x, T), _unchunk(er, T)) for n, (x, er) in out.items()}


def allowance(store, x, E):
    """How far a kernel output stored in ``store`` may be from the emulation ``x`` when the
    float32 execution is within ``E`` of it: ``E`` plus the output's own rounding for float32,
    the half-width of ``[R(x - E), R(x + E)]`` around x for the input dtype."""
    if store == torch.float32:
        return E + U32 * x.abs()
    R = _Rounding(store)
    return torch.maximum((R(x + E) - x).abs(), (x - R(x - E)).abs())


def ratios(got, x, E):
    """``|kernel - emulation| / allowance`` per element (0 where they agree exactly)."""
    diff = (got.to(x.dtype) - x).abs()
    return torch.where(
        diff == 0, torch.zeros_like(diff), diff / allowance(got.dtype, x, E).clamp_min(1e-300)
    )


def faithfulness(kernel_out, emulated) -> dict:
    """Per output: ``ratio`` = max over elements of ``|kernel - emulation| / allowed``, where
    ``allowed`` is :func:`allowance`; the number of elements over 1; and
    ``|kernel - emulation| / |emulation|`` (norms) for scale."""
    res = {}
    for name, got in kernel_out.items():
        x, E = emulated[name]
        diff = (got.to(x.dtype) - x).abs()
        ratio = ratios(got, x, E)
        n = x.norm().item()
        res[name] = {
            "ratio": ratio.max().item(),
            "over": int((ratio > 1).sum().item()),
            "elements": ratio.numel(),
            "relative": (diff.norm().item() / n) if n > 0 else float("nan"),
        }
    return res


def exceeding_dg(got, rn, tc, unit, replica=None, BT=64, limit=20) -> list:
    """The elements of ``chunk_bwd_dqkwg``'s dg over the round-to-nearest bound, each with what
    tells a rounding from a wrong result: its indices (batch, token, head) and row in its chunk,
    the kernel's value, the float64 emulation, the allowance under round-to-nearest and under
    the tensor-core model, the sum of the magnitudes of dg's terms there, the state term
    ``exp2(g_L) <h, dh>`` (last rows only) and its magnitude ``exp2(g_L) sum |h o dh|``, and
    the distance in units of ``unit`` (the input dtype's unit roundoff) times that magnitude:
    the size of the error a sum of ``h o dh`` carried out in the input dtype leaves.
    ``rn``/``tc``: the emulations' ``{name: (value, E)}``; ``replica``: the round-to-nearest
    emulation with the state sum the kernel's own reduction gives (``ratio_rn_replica``)."""
    x, E_rn = rn["dg"]
    E_tc = tc["dg"][1]
    r_rn, r_tc = ratios(got, x, E_rn), ratios(got, x, E_tc)
    terms = rn["dg_summands"][0]
    hdh, hdh_abs = rn["dg_hdh"]
    rows = []
    for idx in (r_rn > 1).nonzero().tolist()[:limit]:
        i = tuple(idx)
        diff = got[i].item() - x[i].item()
        size = hdh_abs[i].item()
        rows.append(
            {
                "b,t,h": list(i),
                "row_in_chunk": i[1] % BT,
                "last_row_of_chunk": i[1] % BT == BT - 1 or i[1] == x.shape[1] - 1,
                "kernel": got[i].item(),
                "float64": x[i].item(),
                "allowed_rn": allowance(got.dtype, x, E_rn)[i].item(),
                "allowed_tc": allowance(got.dtype, x, E_tc)[i].item(),
                "ratio_rn": r_rn[i].item(),
                "ratio_tc": r_tc[i].item(),
                "terms_magnitude": terms[i].item(),
                "state_term": hdh[i].item(),
                "state_term_magnitude": size,
                "diff_in_unit_state_magnitudes": diff / (unit * size) if size > 0 else None,
            }
        )
        if replica is not None:
            rows[-1]["ratio_rn_replica"] = ratios(got, *replica["dg"])[i].item()
    return rows
