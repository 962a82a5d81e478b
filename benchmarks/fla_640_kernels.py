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

The formulas are those of the kernels' steps (fla-core 0.6.0, ``fla/ops/common/chunk_o.py`` and
``fla/ops/gated_delta_rule/wy_fast.py``); the gate ``g`` is fla's chunk-local cumulative log
gate in base 2 (``exp2(g)``), and one head of values per head of keys (H = HV).
"""

from __future__ import annotations

import math

import torch

U32 = 2.0**-24
TINY = 2.0**-126  # float32 flush to zero: the absolute error of an underflowing exp2
UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def gamma(n: int) -> float:
    """Higham's gamma_n(u_32) = n u / (1 - n u)."""
    return n * U32 / (1.0 - n * U32)


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


def emulate_dqkwg(q, k, v, g, h, do, dh, dv, scale, BT=64, work=torch.float64, broken=False):
    """``chunk_bwd_dqkwg`` (gated, with dw) recomputed in ``work`` precision; returns
    ``{name: (value, E)}`` for dq, dk, dw (as the kernel stores it: ``-dv h^T``) and dg, and
    ``dg_summands`` (the sum of the magnitudes of dg's terms, row by row).

    Per chunk, with rows t and the chunk's last valid row L:
    ``dq = exp2(g_t) scale do h^T + R(ds) k``, ``dk = exp2(g_L - g_t) v dh^T + R(ds)^T q``,
    ``ds_ts = [t >= s] exp2(g_t - g_s) scale (do v^T)_ts``, ``dw = -R(dv) R(h)^T``,
    ``dg_t = <dq_t, q_t> - <dk_t, k_t> + [t = L] (exp2(g_L) <h, dh> + sum_t <dk0_t, k_t>)``
    with ``dk0`` the first term of dk. ``v`` is fla's ``v_new``; h, dh (B, NT, H, K, V).
    ``broken=True`` leaves ``R(ds)`` untransposed in dk (a wrong product of the kind fla's
    Hopper fault makes), for the tests that show the check catches it."""
    R = _Rounding(q.dtype)
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
    dq0 = (doc @ tr(rh)) * eg[..., None] * scale
    dq0_abs = (a(doc) @ tr(a(rh))) * eg[..., None] * scale
    E_dq0 = (gamma(V + 2) + rel_g) * dq0_abs + TINY * (a(doc) @ tr(a(rh))) * scale
    ew, rel_w = _exp2(gl[..., None] - gc, True)
    ew = torch.where(valid, ew, torch.zeros_like(ew))
    dk0_raw, dk0_rawabs = vc @ tr(rdh), a(vc) @ tr(a(rdh))
    dk0 = dk0_raw * ew[..., None]
    E_dk0 = (gamma(V + 2) + rel_w)[..., None] * dk0_rawabs * ew[..., None] + TINY * dk0_rawabs
    dw = R(dvc) @ tr(rh)
    E_dw = gamma(V + 2) * (a(R(dvc)) @ tr(a(rh)))

    egl, _ = _exp2(gl, False)
    hdh, hdh_abs = (hh * dhh).sum((-1, -2)), (a(hh) * a(dhh)).sum((-1, -2))
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
    ds_raw, ds_rawabs = doc @ tr(vc), a(doc) @ tr(a(vc))
    ds = ds_raw * es * scale
    E_ds = ((gamma(V + 2) + rel_s) * ds_rawabs * es + TINY * ds_rawabs * causal) * scale
    rds = R(ds)
    D_ds = R.spread(ds, E_ds)

    dq = dq0 + rds @ kc
    dk = dk0 + (rds if broken else tr(rds)) @ qc
    E_dq = E_dq0 + D_ds @ a(kc) + gamma(BT + 2) * (a(rds) @ a(kc) + a(dq0))
    E_dk = E_dk0 + tr(D_ds) @ a(qc) + gamma(BT + 2) * (tr(a(rds)) @ a(qc) + a(dk0))
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
    return {n: (_unchunk(x, T), _unchunk(e, T)) for n, (x, e) in out.items()}


def emulate_wy_bwd(k, v, beta, g, A, dw, du, BT=64, work=torch.float64, broken=False):
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
    reports wrong at a chunk of 64), for the tests."""
    R = _Rounding(k.dtype)
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
    dA1 = dwc @ tr(rkbg) + duc @ tr(rvb)
    E_dA1 = (
        a(dwc) @ tr(D_kbg)
        + a(duc) @ tr(D_vb)
        + gamma(K + V + 2) * (a(dwc) @ tr(a(rkbg)) + a(duc) @ tr(a(rvb)))
    )
    i = torch.arange(BT, device=k.device)
    strict = (i[:, None] > i[None, :]) & valid[..., :, None] & valid[..., None, :]
    zero = torch.zeros_like(dA1)
    dA1, E_dA1 = torch.where(strict, dA1, zero), torch.where(strict, E_dA1, zero)
    r1, D1 = R(dA1), R.spread(dA1, E_dA1)
    dA2 = r1 @ At
    E_dA2 = D1 @ a(At) + gamma(BT + 2) * (a(r1) @ a(At))
    r2, D2 = R(dA2), R.spread(dA2, E_dA2)
    dA3 = At @ r2
    E_dA3 = a(At) @ D2 + gamma(BT + 2) * (a(At) @ a(r2))
    dgap = gc[..., :, None] - gc[..., None, :]
    es, rel_s = _exp2(torch.where(strict, dgap, torch.zeros_like(dgap)), True)
    dA3e = torch.where(strict, -dA3 * es, zero)
    E_dA3e = torch.where(
        strict, E_dA3 * es + (rel_s + U32) * a(dA3) * es + TINY * (a(dA3) + E_dA3), zero
    )
    dA4, D4 = R(dA3e), R.spread(dA3e, E_dA3e)

    dkbg = At @ dwc
    E_dkbg = gamma(BT + 2) * (a(At) @ a(dwc))
    p1 = dkbg * (e * bc)[..., None]
    E_p1 = (E_dkbg + (3 * U32 + rel_e) * a(dkbg)) * (e * bc)[..., None] + TINY * a(
        dkbg * bc[..., None]
    )
    rp1, D_p1 = R(p1), R.spread(p1, E_p1)
    dvb = At @ duc
    E_dvb = gamma(BT + 2) * (a(At) @ a(duc))
    dv = dvb * bc[..., None]
    E_dv = (E_dvb + U32 * a(dvb)) * a(bc)[..., None]

    kb = kc * bc[..., None]
    rkb, D_kb = R(kb), R.spread(kb, U32 * a(kb))
    dkb = dA4 @ kc
    E_dkb = D4 @ a(kc) + gamma(BT + 2) * (a(dA4) @ a(kc))
    t2 = (dA4 if broken else tr(dA4)) @ rkb
    E_t2 = tr(D4) @ a(rkb) + tr(a(dA4)) @ D_kb + gamma(BT + 2) * (tr(a(dA4)) @ a(rkb))
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

    Akk = (kc @ tr(kc)) * bc[..., None]
    E_Akk = (gamma(K + 2) + U32) * (a(kc) @ tr(a(kc))) * a(bc)[..., None]
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


def faithfulness(kernel_out, emulated) -> dict:
    """Per output: ``ratio`` = max over elements of ``|kernel - emulation| / allowed``, where
    ``allowed`` is E for a float32 output (plus its own rounding) and the half-width of
    ``[R(x - E), R(x + E)]`` around x for an output stored in the input dtype; the number of
    elements over 1; and ``|kernel - emulation| / |emulation|`` (norms) for scale."""
    res = {}
    for name, got in kernel_out.items():
        x, E = emulated[name]
        store = got.dtype
        diff = (got.to(x.dtype) - x).abs()
        if store == torch.float32:
            allowed = E + U32 * x.abs()
        else:
            R = _Rounding(store)
            allowed = torch.maximum((R(x + E) - x).abs(), (x - R(x - E)).abs())
        ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / allowed.clamp_min(1e-300))
        n = x.norm().item()
        res[name] = {
            "ratio": ratio.max().item(),
            "over": int((ratio > 1).sum().item()),
            "elements": ratio.numel(),
            "relative": (diff.norm().item() / n) if n > 0 else float("nan"),
        }
    return res
