"""Bounds for ``kernels.gka_layer`` against ``solvers.gka_layer`` in float64, and the gradient
strategy ``gka_layer_backward`` of ``analysis.testing.harness``.

Forward bound ``FWD`` (first order, evaluated on the float64 run): the kernel's Chebyshev step i
differs from GKA Algorithm 1 applied to its own stored iterates by a local error delta_i made of
(a) the product ``H_t xi`` through the chunk states and the masked chunk products, componentwise
``<= eps_H |H|~ |xi|`` with ``|H|~ = sum_j M_{j,t} beta_j |k_j| |k_j|^T``; (b) lambda_t and the step
2/(L+mu) from the kernel's eq. (5) norm, ``|fro^ - fro| <= dfro``; (c) the weights omega_i of the
float32 recurrence; (d) float32 elementwise operations. Then ``||x^ - x_r|| <= sum_j G_{r,j}
||delta_j||`` with the exact Chebyshev propagators G over the spectrum of A_t
(``analysis.bounds.running.propagation``), plus the output store. ``eps_H``: the state recurrence
(gamma_{C + 2 n_c + 2}(u) plus the gates' exp and chunk cumsum, ``((2C + 2) Lambda + 3) u`` per
chunk, Lambda = the largest sum |g| over a chunk), the chunk products (gamma_{2D + C + 4}(u)), and
in the ``bfloat16/operands`` contract 2 u_bf16 for the stored state and the rounded coefficient
keys plus 2 u_bf16 for the iterate and masked products as operands. ``dfro <= (gamma_{D+C+6}(u)
+ 2 eps_S + 2 eps_gate) ||H~_t||_F^2 / (2 fro) + u fro``.

FWD is first order and its product term ``eps_H |H|~ |xi|`` is a worst case over the signs of
every key in the state: at GKA's setting (D = 128, a = 0.02, r = 30, bf16) it is 2-3.5 times
``||x_t||`` (INCONCLUSIVE on 97-99% of the tokens). The forward's check there is the per-token
bound ``LTB``, ``analysis.bounds.gka_layer.layer_token_bound``: the contract running bound
(``analysis.bounds.contract.linear_bound``) on the same float64 system with the layer's product
error (the chunk state's actual bf16 rounding, normwise; the masked chunk product's rounding in
the range of H_t; float32 accumulation of the chunk's terms), median 2.3-3.3% of ``||x_t||``
there (docs/gka_layer.md, "Per-token bound"). FWD stays what GRAD is built on: with LTB's rho_x GRAD is
still INCONCLUSIVE in bf16, because rho_dq is dominated by the cotangent's own rounding
``eps_H |U|~ |dy|`` amplified by ``||p_r(A)|| <= 2/mu``.

Gradient bound ``GRAD`` (:func:`grad_bounds`): the kernel's implicit gradients (GKA Table 1,
Lemma 1, appendix D.2: x_t and dq_t as r-step solves treated as exact) against the same implicit
formulas in float64 at the float64 r-step iterates (``solvers.gka_grad.gka_implicit_grads(...,
iters=r)``). Each gradient is a sum of products of x, dq, the states and the inputs, so its error
is at most ``(2 rho_x + 2 rho_dq + eps_H + rho_fro + gamma_m(u)) G_abs`` to first order, with rho
the largest relative FWD bound of x and of dq over the tokens (dq is the same solve with the
cotangent ``dx = U^T dy``), G_abs the norm of the same chunked formulas on absolute values
(``kernels.gka_layer_bwd.implicit_backward(absolute=True)``) and m = T + 2D + 2C + 16 the longest
chain of sums. The factor 2 covers x and dq entering twice (w_t = 2a x.dq / fro and the rank-one
terms). Norm-wise over the whole case (docs/gradients.md, "The GKA layer").

Truncation (:func:`truncation_gap`): the implicit gradients are those of the exact solve,
evaluated at r-step iterates; autograd through the r-step loop (``solvers.gka_layer``,
``solver="chebyshev"``) differentiates the loop itself. By GKA Lemma 2 (appendix E, eq. (43):
``x_r = p_r(A) q`` with p_r(A) symmetric) the two dq agree exactly, and dv too (y is linear in v
at fixed x); dk, dg and dbeta differ by a truncation term with no bound derived here: it is
measured, both sides in float64, and reported beside the rounding verdict, never mixed into it.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
from hypothesis import strategies as st

import solvers
from analysis.bounds.running import _recurrence, propagation
from kernels.gka_layer_bwd import chunk_states_reference, chunked, implicit_backward, reverse_cumsum

from .harness import STRATEGIES, Case, Strategy

F64 = torch.float64
U32, UB, U64 = 2.0**-24, 2.0**-8, 2.0**-53
GRAD_OUTPUTS = ("dq", "dk", "dv", "dg", "dbeta")
# kernels.gka_layer's contract for each harness contract name (solvers.contracts)
KERNEL_CONTRACTS = {"float32": "float32/ieee", "bfloat16/operands": "bfloat16/operands"}


def gamma(n, u):
    """Higham's gamma_n = n u / (1 - n u) (Lemma 3.1)."""
    return n * u / (1 - n * u)


# ---------------------------------------------------------------------------------------
# FWD
# ---------------------------------------------------------------------------------------


def per_token(x64, a):
    """float64 H_t, U_t, |H|~_t, |U|~_t, ||H_t||_F token by token (CH). x64: dict of (N, T, .)
    tensors q, k, v and g, beta (or None)."""
    k, v, g, b = x64["k"], x64["v"], x64["g"], x64["beta"]
    N, T, D = k.shape
    H = torch.zeros(N, D, D, dtype=F64)
    U = torch.zeros(N, v.shape[-1], D, dtype=F64)
    Ha, Ua = H.clone(), U.clone()
    out = {n: [] for n in ("H", "U", "Ha", "Ua")}
    for t in range(T):
        gam = torch.ones(N, dtype=F64) if g is None else torch.exp(g[:, t])
        bet = torch.ones(N, dtype=F64) if b is None else b[:, t]
        kt, vt = k[:, t], v[:, t]
        outer = lambda p, r: p.unsqueeze(-1) * r.unsqueeze(-2)  # noqa: E731
        H = gam[:, None, None] * H + bet[:, None, None] * outer(kt, kt)
        U = gam[:, None, None] * U + bet[:, None, None] * outer(vt, kt)
        Ha = gam[:, None, None] * Ha + bet[:, None, None] * outer(kt.abs(), kt.abs())
        Ua = gam[:, None, None] * Ua + bet[:, None, None] * outer(vt.abs(), kt.abs())
        for n, m in (("H", H), ("U", U), ("Ha", Ha), ("Ua", Ua)):
            out[n].append(m)
    out = {n: torch.stack(m, 1) for n, m in out.items()}
    out["fro"] = torch.linalg.matrix_norm(out["H"])
    return out


def eps_model(contract, *, C, T, D, g64):
    """eps_S (state), eps_gate (per chunk) and eps_H (product H xi) of the module docstring."""
    nc = -(-T // C)
    lam_g = (
        0.0
        if g64 is None
        else float(
            torch.nn.functional.pad(g64.abs(), (0, nc * C - g64.shape[-1]))
            .reshape(g64.shape[0], nc, C)
            .sum(-1)
            .max()
        )
    )
    e_gate = ((2 * C + 2) * lam_g + 3) * U32
    e_S = (
        gamma(C + 2 * nc + 2, U32)
        + nc * e_gate
        + (2 * UB if contract == "bfloat16/operands" else 0.0)
    )
    e_H = (
        e_S
        + gamma(2 * D + C + 4, U32)
        + e_gate
        + (2 * UB if contract == "bfloat16/operands" else 0.0)
    )
    return e_S, e_gate, e_H


def fwd_bound(A, Habs, rhs, fro, *, a, iters, e_H, dfro, out_u, x_out):
    """Bound on ||x^_t - x_r,t|| per token (module docstring, FWD), ``(N, T)``; and x_r."""
    lam = a * fro
    L, mu = fro + lam, lam
    xr, info = solvers.chebyshev(A, rhs, L=L, mu=mu, iters=iters, return_info=True)
    xi = info.iterates  # (r+1, N, T, D)
    omega = info.omegas  # (N, T, r+1)
    s = 2.0 / (L + mu)
    rho2 = torch.tensor((1.0 / (1.0 + 2.0 * a)) ** 2, dtype=torch.float32)
    w_hat = solvers.omega_schedule(rho2, iters).to(F64)
    e_s = dfro / fro + 3 * U32
    dlam = a * dfro + U32 * lam
    Hm = A - lam[..., None, None] * torch.eye(A.shape[-1], dtype=F64)
    mv = lambda M, x: (M @ x.unsqueeze(-1)).squeeze(-1)  # noqa: E731
    deltas = [((e_s + U32) * s)[..., None] * rhs.abs()]
    for i in range(1, iters + 1):
        x1 = xi[i - 1]
        x2 = xi[i - 2] if i >= 2 else torch.zeros_like(x1)
        om = omega[..., i, None]
        sv = s[..., None]
        gi = mv(A, x1) - rhs
        dw = (w_hat[i] - omega[..., i]).abs()[..., None] + 4 * U32 * om
        d = (
            om * sv * (e_H * mv(Habs, x1.abs()) + dlam[..., None] * x1.abs())
            + om * sv * e_s[..., None] * gi.abs()
        )
        d = d + dw * (sv * gi.abs() + (x1 - x2).abs())
        d = d + gamma(2, U32) * om * sv * (mv(Hm, x1).abs() + lam[..., None] * x1.abs() + rhs.abs())
        d = d + gamma(5, U32) * (x1.abs() + om * sv * gi.abs() + (om - 1) * (x1 - x2).abs())
        deltas.append(d)
    norms = torch.stack([torch.linalg.vector_norm(d, dim=-1) for d in deltas])  # (r+1, N, T)
    rec = _recurrence("chebyshev", {"step": s}, fro.shape, iters, omega)
    G = propagation(rec, torch.linalg.eigvalsh(A))[iters]  # (r+1, N, T)
    bound = (G * norms).sum(0) + out_u * torch.linalg.vector_norm(x_out, dim=-1)
    return bound, xr


def dfro_bound(Habs, fro, e_S, e_gate, *, D, C):
    """Bound on the kernel's eq. (5) ||H_t||_F (module docstring)."""
    return (gamma(D + C + 6, U32) + 2 * e_S + 2 * e_gate) * torch.linalg.matrix_norm(Habs) ** 2 / (
        2 * fro
    ) + U32 * fro


# ---------------------------------------------------------------------------------------
# GRAD
# ---------------------------------------------------------------------------------------


def implicit64(x64, dy64, *, a, iters, C):
    """The implicit gradients in float64 at the float64 r-step iterates through the kernel's
    chunked formulas (kernels.gka_layer_bwd), plus the same formulas on absolute values
    (G_abs). Returns ``(val, abs, x_r, dq_r, per_token states, A)``."""
    N, T, D = x64["q"].shape
    Tp = -(-T // C) * C
    pad = lambda t: (
        None
        if t is None
        else torch.nn.functional.pad(t, (0, 0, 0, Tp - T) if t.ndim == 3 else (0, Tp - T))
    )  # noqa: E731
    st_ = per_token(x64, a)
    A = st_["H"] + (a * st_["fro"])[..., None, None] * torch.eye(D, dtype=F64)
    L, mu = st_["fro"] * (1 + a), a * st_["fro"]
    x = solvers.chebyshev(A, x64["q"], L=L, mu=mu, iters=iters)
    dx = (st_["U"].transpose(-1, -2) @ dy64.unsqueeze(-1)).squeeze(-1)
    dq = solvers.chebyshev(A, dx, L=L, mu=mu, iters=iters)
    K, V = chunked(pad(x64["k"]), C), chunked(pad(x64["v"]), C)
    G = (
        chunked(torch.cumsum(chunked(pad(x64["g"]), C), -1).reshape(N, Tp), C)
        if x64["g"] is not None
        else chunked(torch.zeros(N, Tp, dtype=F64), C)
    )
    beta = None if x64["beta"] is None else chunked(pad(x64["beta"]), C)
    fro = chunked(torch.nn.functional.pad(st_["fro"], (0, Tp - T), value=1.0), C)
    out = {}
    for absolute in (False, True):
        f = (lambda t: t.abs()) if absolute else (lambda t: t)
        S, R = chunk_states_reference(f(K), G, beta, f(V))
        dk, dv, dbeta, dG = implicit_backward(
            K=f(K),
            G=G,
            beta=beta,
            X=f(chunked(pad(x), C)),
            dQ=f(chunked(pad(dq), C)),
            fro=fro,
            S=S,
            a=a,
            V=f(V),
            dY=f(chunked(pad(dy64), C)),
            R=R,
            absolute=absolute,
        )
        flat = lambda t: t.reshape(N, Tp, *t.shape[3:])[:, :T]  # noqa: E731
        dGf = flat(dG)
        res = {"dq": f(dq), "dk": flat(dk), "dv": flat(dv)}
        if x64["g"] is not None:
            res["dg"] = dGf.abs().flip(-1).cumsum(-1).flip(-1) if absolute else reverse_cumsum(dGf)
        if x64["beta"] is not None:
            res["dbeta"] = flat(dbeta)
        out["abs" if absolute else "val"] = res
    return out["val"], out["abs"], x, dq, st_, A


def grad_relative(x64, dy64, *, a, iters, C, contract):
    """The relative factor ``2 rho_x + 2 rho_dq + eps_H + rho_fro + gamma_m(u)`` of GRAD (module
    docstring), and the float64 implicit gradients and G_abs of :func:`implicit64`."""
    N, T, D = x64["q"].shape
    val, ab, xr, dq, st_, A = implicit64(x64, dy64, a=a, iters=iters, C=C)
    e_S, e_gate, e_H = eps_model(contract, C=C, T=T, D=D, g64=x64["g"])
    dfro = dfro_bound(st_["Ha"], st_["fro"], e_S, e_gate, D=D, C=C)
    bx, _ = fwd_bound(
        A,
        st_["Ha"],
        x64["q"],
        st_["fro"],
        a=a,
        iters=iters,
        e_H=e_H,
        dfro=dfro,
        out_u=0.0,
        x_out=xr,
    )
    dx = (st_["U"].transpose(-1, -2) @ dy64.unsqueeze(-1)).squeeze(-1)
    dx_err = e_H * torch.linalg.vector_norm(
        (st_["Ua"].transpose(-1, -2) @ dy64.abs().unsqueeze(-1)).squeeze(-1), dim=-1
    )
    bdq, _ = fwd_bound(
        A, st_["Ha"], dx, st_["fro"], a=a, iters=iters, e_H=e_H, dfro=dfro, out_u=0.0, x_out=dq
    )
    bdq = (
        bdq + 2.0 / (a * st_["fro"]) * dx_err
    )  # ||p_r(A)|| <= 2 / mu on the cotangent's own rounding
    ratio = lambda b, x: float((b / torch.linalg.vector_norm(x, dim=-1).clamp_min(1e-300)).max())  # noqa: E731
    rel = (
        2 * ratio(bx, xr)
        + 2 * ratio(bdq, dq)
        + e_H
        + float((dfro / st_["fro"]).max())
        + gamma(T + 2 * D + 2 * C + 16, U32)
    )
    return rel, val, ab


def grad_bounds(x64, dy64, *, a, iters, C, contract):
    """GRAD: the norm-wise bound of each gradient of :data:`GRAD_OUTPUTS` present (module
    docstring), ``{name: float}``, and the float64 implicit gradients it bounds around."""
    rel, val, ab = grad_relative(x64, dy64, a=a, iters=iters, C=C, contract=contract)
    return {n: rel * float(torch.linalg.vector_norm(ab[n])) for n in val}, val


# ---------------------------------------------------------------------------------------
# gradient callables
# ---------------------------------------------------------------------------------------


def _gates(g, beta, gated):
    return (g, beta) if gated else (None, None)


def _five(grads: dict, like: dict) -> tuple:
    """(dq, dk, dv, dg, dbeta), zeros for an ungated case's dg and dbeta."""
    return tuple(
        grads[n] if grads.get(n) is not None else torch.zeros_like(like[n[1:]])
        for n in GRAD_OUTPUTS
    )


def gka_implicit_reference(q, k, v, g, beta, dy, *, a, iters, gated=True, **_):
    """The rounding reference: the implicit gradients of ``sum_t <dy_t, y_t>`` in float64 at the
    float64 r-step iterates, from the per-token formulas (``solvers.gka_grad``, independent of the
    kernel's chunked code). Returns (dq, dk, dv, dg, dbeta) in float64."""
    from solvers.gka_grad import gka_implicit_grads

    x = {n: t.to(F64) for n, t in dict(q=q, k=k, v=v, g=g, beta=beta).items()}
    gg, bb = _gates(x["g"], x["beta"], gated)
    r = gka_implicit_grads(x["q"], x["k"], x["v"], dy.to(F64), a=a, g=gg, beta=bb, iters=iters)
    return _five({"dq": r.dq, "dk": r.dk, "dv": r.dv, "dg": r.dg, "dbeta": r.dbeta}, x)


def truncated_loop_gradients(q, k, v, g, beta, dy, *, a, iters, gated=True, **_):
    """Autograd through ``solvers.gka_layer(solver="chebyshev", iters=r)`` in float64: the
    gradient of the truncated loop itself (not a rounding reference: module docstring)."""
    x = {
        n: t.detach().to(F64).requires_grad_(True)
        for n, t in dict(q=q, k=k, v=v, g=g, beta=beta).items()
    }
    gg, bb = _gates(x["g"], x["beta"], gated)
    with torch.enable_grad():
        y = solvers.gka_layer(
            x["q"], x["k"], x["v"], g=gg, beta=bb, a=a, solver="chebyshev", iters=iters
        )
        names = ["q", "k", "v"] + (["g", "beta"] if gated else [])
        got = torch.autograd.grad((y * dy.to(F64)).sum(), [x[n] for n in names])
    return _five({"d" + n: t for n, t in zip(names, got)}, x)


def _dq_without_solve(original):
    """solve_chunks that returns its right-hand side when called for dq (the backward's call: no U
    and no y_dtype, which every forward call passes), i.e. dq = dx without the second solve."""

    def solve(p, rhs, H0, U0, **kw):
        if U0 is None and "y_dtype" not in kw:
            return rhs.clone(), None, None
        return original(p, rhs, H0, U0, **kw)

    return solve


BROKEN_GKA_VARIANTS = {
    "dq_without_solve": "dq = dx = U^T dy, the second r-step solve of eq. (6) skipped",
    "dk_without_lambda": "the lambda_t = a ||H_t||_F path (w_t of Lemma 1) dropped from dk, dg and dbeta",
    "dg_sign": "dg with its sign flipped",
}


@contextlib.contextmanager
def broken_gka_backward(variant):
    """Run ``kernels.gka_layer``'s backward with one of :data:`BROKEN_GKA_VARIANTS` (to show the
    check catches it); ``None`` is the correct backward."""
    import importlib

    mod = importlib.import_module("kernels.gka_layer")
    if variant is None:
        yield
        return
    if variant not in BROKEN_GKA_VARIANTS:
        raise ValueError(
            f"broken_variant must be one of {sorted(BROKEN_GKA_VARIANTS)} or None, got {variant!r}"
        )
    if variant == "dq_without_solve":
        patch = mock.patch.object(mod, "solve_chunks", _dq_without_solve(mod.solve_chunks))
    elif variant == "dk_without_lambda":
        original = mod.implicit_backward
        patch = mock.patch.object(
            mod, "implicit_backward", lambda **kw: original(**{**kw, "a": 0.0})
        )
    else:
        patch = mock.patch.object(mod, "reverse_cumsum", lambda x: -reverse_cumsum(x))
    with patch:
        yield


def gka_kernel_variant(contract=None, broken_variant=None):
    """Gradient callable of ``kernels.gka_layer`` (autograd: the implicit backward) with the
    kernel contract fixed (None: by the input dtype) and optionally a broken backward."""
    if broken_variant is not None and broken_variant not in BROKEN_GKA_VARIANTS:
        raise ValueError(
            f"broken_variant must be one of {sorted(BROKEN_GKA_VARIANTS)} or None, got {broken_variant!r}"
        )

    def grads(q, k, v, g, beta, dy, *, a, iters, chunk_size, gated=True, **_):
        import kernels

        x = {
            n: t.detach().clone().requires_grad_(True)
            for n, t in dict(q=q, k=k, v=v, g=g, beta=beta).items()
        }
        gg, bb = _gates(x["g"], x["beta"], gated)
        names = ["q", "k", "v"] + (["g", "beta"] if gated else [])
        with broken_gka_backward(broken_variant):
            y = kernels.gka_layer(
                x["q"],
                x["k"],
                x["v"],
                gg,
                bb,
                a=a,
                iters=iters,
                chunk_size=chunk_size,
                contract=contract,
            )
            got = torch.autograd.grad((y * dy.to(y.dtype)).sum(), [x[n] for n in names])
        return _five({"d" + n: t for n, t in zip(names, got)}, x)

    grads.__qualname__ = (
        f"gka_kernel_variant(contract={contract!r}, broken_variant={broken_variant!r})"
    )
    grads.__svt_triton__ = True  # kernels.gka_layer is Triton (svt_pytest skips it on a bare CPU)
    return grads


gka_kernel_gradients = gka_kernel_variant()


# ---------------------------------------------------------------------------------------
# the strategy
# ---------------------------------------------------------------------------------------


def gka_grad_case(*, N, T, D, Dv, a, iters, C, gates, seed, device="cpu") -> Case:
    """One case of :func:`gka_layer_backward` (its label rebuilds it): q Gaussian, k unit rows, v
    Gaussian, g in [-0.4, 0] (``gates="weak"``) or [-3, 0] (``"strong"``), beta in [0.2, 1.7],
    dy Gaussian; ``gates="none"``: no decay and no input gate (g, beta ignored)."""
    gen = torch.Generator().manual_seed(seed)
    f = dict(dtype=F64, generator=gen)
    q = torch.randn(N, T, D, **f)
    k = torch.nn.functional.normalize(torch.randn(N, T, D, **f), dim=-1)
    v = torch.randn(N, T, Dv, **f)
    g = -torch.rand(N, T, **f) * (3.0 if gates == "strong" else 0.4)
    beta = 0.2 + 1.5 * torch.rand(N, T, **f)
    dy = torch.randn(N, T, Dv, **f)
    kw = dict(N=N, T=T, D=D, Dv=Dv, a=a, iters=iters, C=C, gates=gates, seed=seed)
    label = "gka_grad_case(" + ", ".join(f"{n}={x!r}" for n, x in kw.items()) + ")"
    inputs = {n: t.to(device) for n, t in dict(q=q, k=k, v=v, g=g, beta=beta, dy=dy).items()}
    return Case(
        inputs,
        {"a": a, "iters": iters, "chunk_size": C, "gated": gates != "none"},
        label,
        build="analysis.testing.gka_gradient_harness.gka_grad_case",
        build_kwargs={**kw, "device": str(device)},
    )


@st.composite
def _gka_case(draw, *, max_T, dims, chunk_size, gate_regimes, a_values, iters_values, device):
    C = chunk_size
    T = draw(
        st.sampled_from(sorted({1, C - 1, C, C + 3, 2 * C + 5, max_T} & set(range(1, max_T + 1))))
    )
    return gka_grad_case(
        N=draw(st.sampled_from((1, 2))),
        T=T,
        D=draw(st.sampled_from(dims)),
        Dv=draw(st.sampled_from(dims)),
        a=draw(st.sampled_from(a_values)),
        iters=draw(st.sampled_from(iters_values)),
        C=C,
        gates=draw(st.sampled_from(gate_regimes)),
        seed=draw(st.integers(0, 2**31 - 1)),
        device=device,
    )


def _gka_scales(case, rounded, contract):
    """GRAD (module docstring) on the rounded inputs, one norm-wise bound per output."""
    name = getattr(contract, "name", str(contract))
    if name not in KERNEL_CONTRACTS:
        raise ValueError(
            f"gka_layer_backward bounds the contracts {sorted(KERNEL_CONTRACTS)}, got {name!r}"
        )
    o = case.options
    x = {n: t.detach().cpu().to(F64) for n, t in rounded.items()}
    x64 = {
        "q": x["q"],
        "k": x["k"],
        "v": x["v"],
        "g": x["g"] if o["gated"] else None,
        "beta": x["beta"] if o["gated"] else None,
    }
    bounds, _ = grad_bounds(
        x64, x["dy"], a=o["a"], iters=o["iters"], C=o["chunk_size"], contract=KERNEL_CONTRACTS[name]
    )
    dev = rounded["q"].device
    return tuple(torch.tensor(bounds.get(n, 0.0), dtype=F64, device=dev) for n in GRAD_OUTPUTS)


def gka_layer_backward(
    max_T: int = 37,
    dims=(8,),
    chunk_size: int = 16,
    gates=("none", "weak", "strong"),
    a_values=(0.05, 0.2),
    iters_values=(4, 10),
    device="cpu",
    precision=None,  # the harness rounds the inputs to the check's precision
) -> Strategy:
    """GKA layer cases with a cotangent dy for gradient callables
    ``f(q, k, v, g, beta, dy, *, a, iters, chunk_size, gated) -> (dq, dk, dv, dg, dbeta)``.

    T around the chunk size (1, C - 1, C, C + 3, 2C + 5, max_T), N in {1, 2}, D and Dv from
    ``dims``, gate regimes from ``gates`` ("none", "weak", "strong"), a and r drawn from
    ``a_values`` and ``iters_values``. Bound: GRAD (module docstring), norm-wise per output and
    case; compare with :func:`gka_implicit_reference`."""
    bad = set(gates) - {"none", "weak", "strong"}
    if not gates or bad:
        raise ValueError(
            f"gates must be a non-empty subset of ('none', 'weak', 'strong'), got {gates!r}"
        )
    pos_int = lambda x: isinstance(x, int) and not isinstance(x, bool) and x > 0  # noqa: E731
    pos_num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0  # noqa: E731
    for name, val, ok in (
        ("dims", dims, pos_int),
        ("a_values", a_values, pos_num),
        ("iters_values", iters_values, pos_int),
    ):
        if isinstance(val, (str, int, float)) or not val or not all(ok(x) for x in val):
            raise ValueError(f"{name} must be a non-empty tuple of positive numbers, got {val!r}")
    for name, val in (("max_T", max_T), ("chunk_size", chunk_size)):
        if not pos_int(val):
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    cases = _gka_case(
        max_T=max_T,
        dims=tuple(dims),
        chunk_size=chunk_size,
        gate_regimes=tuple(gates),
        a_values=tuple(a_values),
        iters_values=tuple(iters_values),
        device=device,
    )
    return Strategy(
        "gka_layer_backward",
        cases,
        GRAD_OUTPUTS,
        (3, 3, 3, 2, 2),
        _gka_scales,
        doc="GKA layer + cotangent; bound: GRAD (implicit gradients at the r-step iterates, float64)",
    )


def truncation_gap(case: Case) -> dict:
    """The truncation part, measured on the case's float64 inputs: per output, ``gap = ||implicit
    - autograd(r-step loop)|| / ||autograd||`` with both sides in float64; ``rounding``, the
    float64 rounding of the two evaluations, ``2 (r + 1) gamma_m(u_64) ||G_abs|| / ||autograd||``;
    and ``bound``: the gap's bound, which is ``rounding`` for dq and dv (Lemma 2: they agree in
    exact arithmetic) and None for dk, dg, dbeta (no bound derived)."""
    x = {n: t.cpu().to(F64) for n, t in case.inputs.items()}
    o = case.options
    imp = gka_implicit_reference(*x.values(), a=o["a"], iters=o["iters"], gated=o["gated"])
    auto = truncated_loop_gradients(*x.values(), a=o["a"], iters=o["iters"], gated=o["gated"])
    x64 = {
        "q": x["q"],
        "k": x["k"],
        "v": x["v"],
        "g": x["g"] if o["gated"] else None,
        "beta": x["beta"] if o["gated"] else None,
    }
    _, ab, *_ = implicit64(x64, x["dy"], a=o["a"], iters=o["iters"], C=o["chunk_size"])
    N, T, D = x["q"].shape
    m = T + 2 * D + 2 * o["chunk_size"] + 16
    out = {}
    for name, i, a_ in zip(GRAD_OUTPUTS, imp, auto):
        size = float(torch.linalg.vector_norm(a_))
        if size == 0.0:
            continue
        gap = float(torch.linalg.vector_norm(i - a_)) / size
        rounding = (
            2 * (o["iters"] + 1) * gamma(m, U64) * float(torch.linalg.vector_norm(ab[name])) / size
        )
        out[name] = {
            "gap": gap,
            "rounding": rounding,
            "bound": rounding if name in ("dq", "dv") else None,
        }
    return out


STRATEGIES.setdefault("gka_layer_backward", gka_layer_backward)

__all__ = [
    "BROKEN_GKA_VARIANTS",
    "GRAD_OUTPUTS",
    "broken_gka_backward",
    "dfro_bound",
    "eps_model",
    "fwd_bound",
    "gka_grad_case",
    "gka_implicit_reference",
    "gka_kernel_gradients",
    "gka_kernel_variant",
    "gka_layer_backward",
    "grad_bounds",
    "grad_relative",
    "implicit64",
    "per_token",
    "truncated_loop_gradients",
    "truncation_gap",
]
