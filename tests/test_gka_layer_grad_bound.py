"""LTB-dq (analysis.bounds.gka_layer_grad): the per-token bound on ``kernels.gka_layer``'s
gradient dq against the float64 implicit dq ``p_r(A_t) dx_t`` from the same inputs and cotangent
(GKA eq. (6), Lemma 2), derived in the module docstring. Every assertion on a kernel's error
names the bound it is held to; broken variants (lambda from ``||H_t||_F^2`` in the dq solve, the
cotangent from the previous chunk's value state, dq scaled by 0.9, half the dq solve's steps)
exceed it.
"""

import contextlib
import importlib
import math

import pytest
import torch
from kernel_support import DEVICE, needs_triton_device

import kernels
from analysis.bounds.contract import linear_bound
from analysis.bounds.gka_layer_grad import cotangent_bound, layer_dq_bound
from analysis.precision import gamma
from analysis.studies.gka_layer_grad_tightness import emulate_dq, gka_inputs
from analysis.testing.gka_gradient_harness import gka_implicit_reference
from kernels.gka_layer_bwd import chunked, transposed_state_products

pytestmark = needs_triton_device
mod = importlib.import_module("kernels.gka_layer")
F64 = torch.float64


def make_case(seed, *, N=1, T=48, D=16, Dv=8, gates="none", dtype=torch.bfloat16):
    """q Gaussian, unit keys, Gaussian values and cotangent dy; gates ``"none"``, ``"weak"`` (g in
    [-0.4, 0], beta in [0.2, 1.7]) or ``"strong"`` (g in [-3, 0])."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(N, T, D, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(N, T, D, generator=gen), dim=-1)
    v = torch.randn(N, T, Dv, generator=gen)
    dy = torch.randn(N, T, Dv, generator=gen)
    g = beta = None
    if gates != "none":
        g = -(torch.rand(N, T, generator=gen) * (3.0 if gates == "strong" else 0.4))
        beta = 0.2 + 1.5 * torch.rand(N, T, generator=gen)
    cast = lambda t: None if t is None else t.to(dtype).to(DEVICE)  # noqa: E731
    return {n: cast(t) for n, t in dict(q=q, k=k, v=v, g=g, beta=beta, dy=dy).items()}


def kernel_dq(x, *, a, iters, C, contract=None, broken=None):
    """dq of ``kernels.gka_layer``'s backward (``C=None``: its default chunk, the warp-group MMA
    forward and dq solve where they apply); ``broken``: a context manager entered for the
    backward alone (the forward's x stays right)."""
    qq = x["q"].detach().clone().requires_grad_(True)
    y = kernels.gka_layer(
        qq, x["k"], x["v"], x["g"], x["beta"], a=a, iters=iters, chunk_size=C, contract=contract
    )
    with broken if broken is not None else contextlib.nullcontext():
        (dq,) = torch.autograd.grad((y * x["dy"]).sum(), [qq])
    return dq.detach().cpu().to(F64)


def dq_bound(x, *, a, iters, C, contract, tokens=None, dq_kernel="triton"):
    return layer_dq_bound(
        x["k"],
        x["v"],
        x["dy"],
        x["g"],
        x["beta"],
        a=a,
        iters=iters,
        chunk_size=C,
        contract=contract,
        tokens=tokens,
        out_dtype=x["q"].dtype,
        dq_kernel=dq_kernel,
    )


def ratio(dq, b):
    """||dq_kernel,t - dq_t|| / LTB-dq_t at the bound's tokens."""
    dq = dq[:, b.tokens]
    if not torch.isfinite(dq).all():
        return torch.full_like(b.bound, math.inf)
    return torch.linalg.vector_norm(dq - b.dq, dim=-1) / b.bound


def contract_of(dtype):
    return "bfloat16/operands" if dtype == torch.bfloat16 else "float32/ieee"


# ------------------------------------------------------------------------- the reference


U64 = 2.0**-53  # float64's unit roundoff


def _chain(n, exponent_error=0.0):
    """A float64 value through ``n`` roundings (Higham 2002 Lemma 3.1, gamma_n(u64); an ``exp``
    counted as two: within one ulp) whose decay factor ``exp(G)`` was taken at an exponent within
    ``exponent_error`` of G: relative error ``exp(exponent_error) (1 + gamma_n) - 1``."""
    return math.exp(exponent_error) * (1 + gamma(n, U64)) - 1


@pytest.mark.parametrize("gates", ["none", "weak"])
def test_reference_is_the_implicit_dq(gates):
    """The bound's reference dq is ``solvers.gka_implicit_grads``' float64 dq (eq. (6) at the
    r-step iterates), and its dx the per-token ``U_t^T dy_t``, to float64 rounding, each within a
    bound derived below from the data (F64-DX, F64-DQ); dx from U_{t-1} and dq one step short are
    beyond them by many orders of magnitude."""
    C, a, r = 16, 0.05, 10
    x = make_case(1, T=40, D=8, Dv=6, gates=gates, dtype=torch.float32)
    x64 = {n: None if t is None else t.cpu().to(F64) for n, t in x.items()}
    _, T, D = x64["q"].shape
    Dv, nc = x64["v"].shape[-1], -(-T // C)
    gg = torch.zeros(1, T, dtype=F64) if x64["g"] is None else x64["g"]
    bb = torch.ones(1, T, dtype=F64) if x64["beta"] is None else x64["beta"]
    b = dq_bound(x, a=a, iters=r, C=C, contract="float32/ieee")
    ref = gka_implicit_reference(
        x64["q"], x64["k"], x64["v"], gg, bb, x64["dy"], a=a, iters=r, gated=gates != "none"
    )[0]
    # U_t = gamma_t U_{t-1} + beta_t v_t k_t^T (CH), H_t likewise; |U|_t, |H|_t from |v|, |k|
    # (decays and beta are positive): the sums of the terms' magnitudes
    U, Ua, H, Ha = (torch.zeros(*s, dtype=F64) for s in ((Dv, D), (Dv, D), (D, D), (D, D)))
    dx, dxa, Hs, Has, dx_prev = [], [], [], [], []
    for t in range(T):
        dec, kk, vv, dyt = torch.exp(gg[0, t]), x64["k"][0, t], x64["v"][0, t], x64["dy"][0, t]
        dx_prev.append(U.T @ dyt)  # broken: the previous token's state
        U = dec * U + bb[0, t] * torch.outer(vv, kk)
        Ua = dec * Ua + bb[0, t] * torch.outer(vv.abs(), kk.abs())
        H = dec * H + bb[0, t] * torch.outer(kk, kk)
        Ha = dec * Ha + bb[0, t] * torch.outer(kk.abs(), kk.abs())
        dx.append(U.T @ dyt), dxa.append(Ua.T @ dyt.abs()), Hs.append(H), Has.append(Ha)
    dx, dxa, Hs, Has, dx_prev = map(torch.stack, (dx, dxa, Hs, Has, dx_prev))

    # F64-DX. Every computation of dx_t here is a sum of the terms decay beta (v_j . dy_t) k_j,
    # each through a chain of roundings (Lemma 3.1, any summation order: eq. (3.4)), so
    # ``|dx_hat - dx| <= eps |U|_t^T |dy_t|`` componentwise. The recurrence (this test's, and
    # run_layer's, which gka_implicit_grads uses): per token exp(g) (2), the product and the sum
    # (2), beta v k^T (2 once), the dot with dy (Dv): eps_rec = gamma_{4T+Dv+2}. The chunked form
    # (cotangent_bound): the chunk-local cumsum G within gamma_C sum|g| (Higham eq. (4.4)), so an
    # exponent G_c - G_j off by (2 gamma_C + u) sum|g| over the chunks a term crosses; roundings:
    # coef = exp(.) beta, coef k, the chunk's C-term product into the state (C + 4), per chunk
    # crossed exp, product, sum (4 nc), then zeta (dy . R) and the final sum (Dv + 4):
    # eps_ch = exp(e_G) (1 + gamma_{C+Dv+4nc+8}) - 1 (the in-chunk term needs fewer).
    e_G = (2 * gamma(C, U64) + U64) * float(gg.abs().sum())
    eps_rec, eps_ch = _chain(4 * T + Dv + 2), _chain(C + Dv + 4 * nc + 8, e_G)
    tol_dx = (eps_rec + eps_ch) * float(dxa.norm())
    err_dx = float((b.dx[0] - dx).norm())
    print(
        f"F64-DX ({gates}): measured {err_dx:.3e} / tolerance {tol_dx:.3e} = {err_dx / tol_dx:.3g}"
    )
    assert err_dx <= tol_dx, (err_dx, tol_dx)  # F64-DX
    off = float((b.dx[0] - dx_prev).norm())
    assert off > 1e3 * tol_dx, (off, tol_dx)  # U_{t-1}^T dy_t: caught (not a tolerance)

    # F64-DQ. Both dq are r-step float64 Chebyshev runs on (H_t, dx_t, lambda_t = a ||H_t||_F),
    # each with its own H_t, dx_t and ||H_t||_F: per token
    #   ||dq_b - dq_ref|| <= 2 E_t + (2 / lambda_t) (||dx_b - dx|| + ||dx_ref - dx||),
    # E_t linear_bound's running bound under the float64 contract on this test's (H_t, dx_t) (the
    # same propagation through the exact Chebyshev responses LTB uses), with the runs' H_t within
    # 2 eps_H |H|_t of this one (H_error, with gamma_{D+2} for the product and shift) and their
    # ||H_t||_F relatively within 2 eps_H || |H|_t ||_F / ||H_t||_F + 2 gamma_{D^2+2}
    # (param_rel_error; shift_error a ||H_t||_F times it); the right-hand sides' differences
    # (F64-DX, per token) propagate through p_r(A_t), ||p_r(A_t)|| <= 2 / lambda_t (|1 - tau_r| <= 2
    # on [mu, L] = [a fro, (1 + a) fro], which holds A_t's spectrum, lambda_min(A_t) >= lambda_t).
    eps_H = max(_chain(4 * T + 2), _chain(C + 4 * nc + 8, e_G))
    fro, fro_abs = torch.linalg.matrix_norm(Hs), torch.linalg.matrix_norm(Has)
    lam = a * fro
    prel = float((2 * eps_H * fro_abs / fro).max()) + 2 * gamma(D * D + 2, U64)
    g_prod = gamma(D + 2, U64)
    H_error = (
        g_prod * (Hs.abs() + lam[:, None, None] * torch.eye(D, dtype=F64))
        + (1 + g_prod) * 2 * eps_H * Has
    )
    run = linear_bound(
        "chebyshev",
        Hs,
        dx,
        L=(1 + a) * fro,
        mu=lam,
        iters=r,
        contract="float64",
        shift=lam,
        shift_error=a * fro * prel,
        param_rel_error=prel,
        H_error=H_error,
    )
    rhs = (eps_ch + eps_rec + 2 * eps_rec) * dxa.norm(dim=-1)  # b's dx, the reference's dx
    tol_dq = 2 * run.bound[-1] + 2 / lam * rhs
    err_dq = (b.dq[0] - ref[0]).norm(dim=-1)
    worst = float((err_dq / tol_dq).max())
    print(
        f"F64-DQ ({gates}): measured / tolerance max {worst:.3g} (tolerance / ||dq_t|| max "
        f"{float((tol_dq / ref[0].norm(dim=-1)).max()):.3g})"
    )
    assert bool((err_dq <= tol_dq).all()), worst  # F64-DQ
    short = gka_implicit_reference(
        x64["q"], x64["k"], x64["v"], gg, bb, x64["dy"], a=a, iters=r - 1, gated=gates != "none"
    )[0]
    # one step short: caught on every token (not a tolerance)
    assert bool(((b.dq[0] - short[0]).norm(dim=-1) > 1e3 * tol_dq).all())
    with pytest.raises(ValueError, match="dq_kernel"):
        dq_bound(x, a=a, iters=r, C=C, contract="float32/ieee", dq_kernel="cuda")


def _kernel_cotangent(x, C, contract, shift=False):
    """The backward's float32 dx as the kernel forms it (its states kernel, then PyTorch);
    ``shift``: each chunk from the previous chunk's value state (broken)."""
    p = mod.prepare(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.05, C)
    _, U0 = mod.chunk_states(p, torch.float32, mod.CONTRACTS[contract], with_u=True)
    if shift:
        U0 = torch.cat([torch.zeros_like(U0[:, :1]), U0[:, :-1]], 1)
    K, G = chunked(p.k.float(), C), chunked(p.gates(), C)
    beta = None if p.beta is None else chunked(p.beta.float(), C)
    dY = chunked(mod._pad(x["dy"].float(), p.q.shape[1]), C)
    dx = transposed_state_products(dY, K, chunked(p.v.float(), C), G, beta, U0)
    return dx.reshape(dx.shape[0], -1, dx.shape[-1])[:, : p.T].cpu().to(F64)


@pytest.mark.parametrize(
    "dtype, gates", [(torch.bfloat16, "none"), (torch.bfloat16, "weak"), (torch.float32, "strong")]
)
def test_cotangent_within_its_bound(dtype, gates):
    """The kernel's float32 dx within E_dx (module docstring, 1.) on every token, E_dx below
    1e-2 ||dx_t||; the previous chunk's value state beyond it on every token of a later chunk
    (under strong decay on the first token of each, where the state has not decayed yet)."""
    C = 16
    x = make_case(2, T=50, gates=gates, dtype=dtype)
    contract = contract_of(dtype)
    dx, err = cotangent_bound(
        x["k"], x["v"], x["dy"], x["g"], x["beta"], chunk_size=C, contract=contract
    )
    e = torch.linalg.vector_norm(_kernel_cotangent(x, C, contract) - dx, dim=-1)
    assert bool((e <= err).all()), float((e / err).max())  # E_dx
    # not a tolerance: the bound is informative, under 1% of ||dx|| (measured 0.02-0.08%)
    assert float((err / dx.norm(dim=-1)).max()) < 1e-2
    e = torch.linalg.vector_norm(_kernel_cotangent(x, C, contract, shift=True) - dx, dim=-1)
    later = slice(C, None, C if gates == "strong" else 1)  # strong decay: only a chunk's start
    assert bool((e[:, later] > err[:, later]).all())  # sees the state (zeta_t e^-1.5 a token)


# ------------------------------------------------------------- the kernel within LTB-dq


@pytest.mark.parametrize(
    "dtype, gates, T, D, Dv, C",
    [
        (torch.bfloat16, "none", 64, 16, 16, 16),
        (torch.bfloat16, "weak", 70, 16, 8, 32),
        (torch.bfloat16, "strong", 40, 32, 16, 16),
        (torch.float32, "none", 48, 16, 8, 16),
        (torch.float32, "weak", 70, 32, 16, 32),
    ],
)
def test_dq_within_bound(dtype, gates, T, D, Dv, C):
    """Every token's dq within LTB-dq (Triton kernels under the interpreter, the backward's
    float32 states), and LTB-dq below ||dq_t|| on every token (conclusive)."""
    a, r = 0.05, 10
    x = make_case(3, T=T, D=D, Dv=Dv, gates=gates, dtype=dtype)
    contract = contract_of(dtype)
    b = dq_bound(x, a=a, iters=r, C=C, contract=contract)
    m = ratio(kernel_dq(x, a=a, iters=r, C=C), b)
    assert bool((m <= 1.0).all()), float(m.max())  # LTB-dq
    assert bool((m > 0).any())  # the kernel differs from float64: the check measured something
    assert bool((b.relative < 1.0).all()), float(b.relative.max())  # LTB-dq is not vacuous
    if dtype == torch.bfloat16 and gates != "strong":
        assert float(b.relative.median()) < 0.1  # not a tolerance: informative (docs: 2.8%)


# --------------------------------------------------------------------- broken variants


@contextlib.contextmanager
def _patched(name, value):
    original = getattr(mod, name)
    setattr(mod, name, value(original) if callable(value) else value)
    try:
        yield
    finally:
        setattr(mod, name, original)


def _previous_chunk_cotangent(original):
    def shifted(dY, K, V, G, beta, R):  # chunk n from the value state of chunk n - 1
        return original(dY, K, V, G, beta, torch.cat([torch.zeros_like(R[:, :1]), R[:, :-1]], 1))

    return shifted


def _scaled_dq(original):
    return lambda *args, **kw: 0.9 * original(*args, **kw)


def _half_the_steps(original):
    return lambda p, dx2, H0, *, iters, **kw: original(p, dx2, H0, iters=iters // 2, **kw)


PREVIOUS = "dx from the previous chunk's value state"
BROKEN = {
    "lambda from ||H||_F^2": lambda: _patched("_FRO_SQRT", False),
    PREVIOUS: lambda: _patched("transposed_state_products", _previous_chunk_cotangent),
    "dq scaled by 0.9": lambda: _patched("_cotangent_solve", _scaled_dq),
    "half the steps": lambda: _patched("_cotangent_solve", _half_the_steps),
}


@pytest.mark.parametrize("variant", list(BROKEN))
def test_broken_variants_exceed_the_bound(variant):
    """bf16 operands, D = 16, a = 0.05, r = 8: the right backward within LTB-dq, each broken one
    beyond it on every token where it changes dq by more than LTB-dq allows: half the steps
    (r = 4) on every token; lambda from ||H_t||_F^2 on every token but t = 0 (where the two are
    equal: unit keys); the 0.9 scale on every token where LTB-dq < 0.1 ||dq_t|| (all but t = 0,
    where LTB-dq is 0.17 ||dq_0||); the previous chunk's value state on every token from the
    second chunk on (the first has no state)."""
    a, r, C = 0.05, 8, 16
    x = make_case(4, T=64, D=16, Dv=16)
    b = dq_bound(x, a=a, iters=r, C=C, contract="bfloat16/operands")
    assert bool((ratio(kernel_dq(x, a=a, iters=r, C=C), b) <= 1.0).all())  # LTB-dq
    m = ratio(kernel_dq(x, a=a, iters=r, C=C, broken=BROKEN[variant]()), b)
    if variant.startswith("dx from"):
        m = m[:, C:]
    elif variant.startswith("lambda"):
        m = m[:, 1:]  # t = 0: ||H_0||_F = ||k_0||^2 = 1 = ||H_0||_F^2, the same lambda
    elif variant.startswith("dq scaled"):
        # not a tolerance: a 10% error is within reach of the check on almost every token
        assert float((b.relative < 0.1).double().mean()) > 0.95
        m = m[b.relative < 0.1]  # an error of 0.1 ||dq_t||: caught where LTB-dq is below it
    assert bool((m > 1.0).all()), (variant, float(m.min()))


# ----------------------------------------------------------------- GKA's setting, D = 128


def test_gka_setting_d128():
    """D = Dv = 128, a = 0.02, r = 30, unit keys and queries, Gaussian v and dy, bf16: the torch
    emulation of the warp-group MMA path (the dq solve in chunks of 64 on bf16 states) and the
    Triton kernels (chunk 32, float32 states) within LTB-dq on every sampled token; LTB-dq below
    ||dq_t|| on every token and below 5% of it at the median (the old GRAD: 9.8 ||dq||); lambda
    from ||H_t||_F^2 in the dq solve beyond it on every token from t = 6 on, dq scaled by 0.9 on
    every token, the previous chunk's value state on every token of the second chunk."""
    a, r, T = 0.02, 30, 64
    q, k, v, dy = gka_inputs(T, 128, 5)
    x = {"q": q.to(DEVICE), "k": k.to(DEVICE), "v": v.to(DEVICE), "g": None, "beta": None}
    x["dy"] = dy.to(DEVICE)
    tokens = torch.arange(1, T, 5)
    bw = dq_bound(
        x, a=a, iters=r, C=32, contract="bfloat16/operands", tokens=tokens, dq_kernel="wgmma"
    )
    assert bool((bw.relative < 1.0).all()) and float(bw.relative.median()) < 0.05
    assert bool((ratio(emulate_dq(k, v, dy, a=a, iters=r).to(F64), bw) <= 1.0).all())  # LTB-dq
    bt = dq_bound(x, a=a, iters=r, C=32, contract="bfloat16/operands", tokens=tokens)
    assert bool((bt.relative < 1.0).all()) and float(bt.relative.median()) < 0.05
    assert bool((ratio(kernel_dq(x, a=a, iters=r, C=32), bt) <= 1.0).all())  # LTB-dq
    m = ratio(kernel_dq(x, a=a, iters=r, C=32, broken=BROKEN["lambda from ||H||_F^2"]()), bt)
    # t = 1: ||H_1||_F ~ 1.4, the two lambdas within 1.5x of each other (error / LTB-dq 0.1)
    assert bool((m[:, 1:] > 1.0).all()), float(m[:, 1:].min())
    m = ratio(kernel_dq(x, a=a, iters=r, C=32, broken=BROKEN["dq scaled by 0.9"]()), bt)
    assert bool((m > 1.0).all()), float(m.min())
    m = ratio(kernel_dq(x, a=a, iters=r, C=32, broken=BROKEN[PREVIOUS]()), bt)
    assert bool((m[:, tokens >= 32] > 1.0).all())  # the second chunk, from a zero state


def test_half_the_steps_d128():
    """Half the dq solve's steps at D = 128, a = 0.02: beyond LTB-dq on every sampled token at
    r = 16 (error / LTB-dq 1.95-3.8); at r = 30 it is not caught (0.17-0.47): the 15 missing steps
    move dq by less than the bf16 operand rounding LTB-dq must allow, as for x (LTB)."""
    a, r, T = 0.02, 16, 64
    q, k, v, dy = gka_inputs(T, 128, 5)
    x = {"q": q.to(DEVICE), "k": k.to(DEVICE), "v": v.to(DEVICE), "g": None, "beta": None}
    x["dy"] = dy.to(DEVICE)
    b = dq_bound(x, a=a, iters=r, C=32, contract="bfloat16/operands", tokens=torch.arange(1, T, 5))
    assert bool((ratio(kernel_dq(x, a=a, iters=r, C=32), b) <= 1.0).all())  # LTB-dq
    m = ratio(kernel_dq(x, a=a, iters=r, C=32, broken=BROKEN["half the steps"]()), b)
    assert bool((m > 1.0).all()), float(m.min())


def test_bad_arguments():
    x = make_case(6, T=8, D=4, Dv=4, dtype=torch.float32)
    with pytest.raises(ValueError, match="contract"):
        dq_bound(x, a=0.05, iters=4, C=16, contract="float32/tf32x3")
    with pytest.raises(ValueError, match="tokens"):
        dq_bound(x, a=0.05, iters=4, C=16, contract="float32/ieee", tokens=[8])
    with pytest.raises(ValueError, match="dy"):
        cotangent_bound(x["k"], x["v"], x["dy"][:, :4], chunk_size=16, contract="float32/ieee")


def test_dy_must_be_float32_representable():
    """The backward takes the cotangent as float32 and LTB-dq assumes it exact there: a float64 dy
    that float32 would round is refused, naming dy (layer_dq_bound and cotangent_bound); the same
    values rounded to float32 (what the kernel receives) are accepted, in any dtype."""
    x = make_case(6, T=8, D=4, Dv=4, dtype=torch.float32)
    kw = dict(a=0.05, iters=4, chunk_size=16, contract="float32/ieee", out_dtype=torch.float32)
    fine = x["dy"].cpu().to(F64)  # float32 values widened: exact
    b = layer_dq_bound(x["k"], x["v"], fine, **kw)
    assert torch.equal(b.dq, layer_dq_bound(x["k"], x["v"], x["dy"], **kw).dq)
    off = fine.clone()
    off[0, 3, 1] += 2.0**-40 * off[0, 3, 1].abs()  # below float32's spacing: rounded away
    for call in (
        lambda: layer_dq_bound(x["k"], x["v"], off, **kw),
        lambda: cotangent_bound(x["k"], x["v"], off, chunk_size=16, contract="float32/ieee"),
    ):
        with pytest.raises(ValueError, match="dy must be representable in float32"):
            call()
    big = fine.clone()
    big[0, 0, 0] = 1e39  # beyond float32's range
    with pytest.raises(ValueError, match="dy must be representable in float32"):
        layer_dq_bound(x["k"], x["v"], big, **kw)


def test_layer_token_bound_options():
    """layer_token_bound's options for the dq solve: ``rhs_error`` zero adds nothing and a
    positive one raises the bound on every token (none is ignored), a bad shape is named;
    ``float32_states`` changes eq. (5)'s part only under bf16 operands."""
    from analysis.bounds.gka_layer import layer_token_bound

    x = make_case(7, T=40, D=8, Dv=8, gates="weak")
    kw = dict(a=0.05, iters=6, chunk_size=16, contract="bfloat16/operands")
    base = layer_token_bound(x["q"], x["k"], x["g"], x["beta"], **kw).bound
    zero = layer_token_bound(
        x["q"], x["k"], x["g"], x["beta"], rhs_error=torch.zeros(1, 40), **kw
    ).bound
    assert torch.equal(zero, base)
    more = layer_token_bound(
        x["q"], x["k"], x["g"], x["beta"], rhs_error=torch.full((1, 40), 1e-3), **kw
    ).bound
    assert bool((more > base).all())
    f32 = layer_token_bound(x["q"], x["k"], x["g"], x["beta"], float32_states=True, **kw).bound
    # float32 states move the bound, and only by their state terms (a sanity check of the
    # option, not a tolerance: measured within a few percent)
    assert not torch.equal(f32, base) and bool((f32 < 1.5 * base).all())
    with pytest.raises(ValueError, match="rhs_error"):
        layer_token_bound(x["q"], x["k"], x["g"], x["beta"], rhs_error=torch.zeros(40), **kw)


def test_dk_jacobians_are_the_implicit_backwards():
    """The derivatives of dk_i in x_t and dq_t that the dv/dk worst case uses
    (analysis.studies.gka_layer_grad_tightness.dk_jacobians) are those of
    kernels.gka_layer_bwd.implicit_backward (Lemma 1). At fixed dq, dk_i is affine in x_t (and at
    fixed x affine in dq_t: ``w_t = 2a x_t . dq_t / ||H_t||_F`` and every other term hold x and dq
    once each), so ``dk(x + d) - dk(x) = J d`` exactly for any d, a unit-sized one here: the check's
    only error is float64 rounding (FD-F64). Without the w_t H_t k_i term the Jacobian is beyond
    it."""
    from analysis.studies.gka_layer_grad_tightness import dk_jacobians
    from kernels.gka_layer_bwd import chunk_states_reference, implicit_backward

    gen = torch.Generator().manual_seed(8)
    C, D, Dv, a = 16, 6, 5, 0.05
    rn = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    K = torch.nn.functional.normalize(rn(1, 1, C, D), dim=-1)
    V, dY, X, dQ = rn(1, 1, C, Dv), rn(1, 1, C, Dv), rn(1, 1, C, D), rn(1, 1, C, D)
    G = torch.zeros(1, 1, C, dtype=F64)
    H = torch.cumsum(K[0, 0, :, :, None] * K[0, 0, :, None, :], 0)
    fro = torch.linalg.matrix_norm(H)
    S, R = chunk_states_reference(K, G, None, V)

    def dk(X, dQ, absolute=False):
        f = (lambda t: t.abs()) if absolute else (lambda t: t)  # noqa: E731
        out = implicit_backward(
            K=f(K), G=G, beta=None, X=f(X), dQ=f(dQ), fro=fro[None, None], S=f(S), a=a,
            V=f(V), dY=f(dY), R=f(R), absolute=absolute,
        )  # fmt: skip
        return out[0][0, 0]

    i, s = 3, 2 * a / fro
    J, Kq = dk_jacobians(K[0, 0], V[0, 0], dY[0, 0], X[0, 0], dQ[0, 0], H, s, i)
    # the same Jacobians on magnitudes (J = c I - dq k^T - s H k dq^T, c = dy . v - dq . k, with
    # -|dq| every term adds; Kq likewise with -|x|)
    Ka, Va, dYa = K[0, 0].abs(), V[0, 0].abs(), dY[0, 0].abs()
    Ja = dk_jacobians(Ka, Va, dYa, X[0, 0], -dQ[0, 0].abs(), H.abs(), s, i)[0]
    Kqa = dk_jacobians(Ka, Va, dYa, -X[0, 0].abs(), dQ[0, 0], H.abs(), s, i)[1]
    # FD-F64: each evaluation of dk_i within gamma_m(u64) of the magnitudes' dk (implicit_backward
    # with absolute=True), m = T + 2D + 2C + 16 the longest chain of the chunked formulas (GRAD,
    # analysis.testing.gka_gradient_harness; T = C here), and one more for the difference; J d
    # (J's entries: two dot products, a difference, s H k's products and the three terms' sums,
    # then the product with d, and d = fl(x + e) - x's own rounding) within gamma_{2D+Dv+7}(u64)
    # |J| |d|
    m = C + 2 * D + 2 * C + 16
    e = rn(D)
    broken = J + (s[i:, None, None] * (H[i:] @ K[0, 0, i])[:, :, None]) * dQ[0, 0, i:][:, None, :]
    for t in (i, 9, C - 1):
        for M, Ma, which in ((J, Ja, "x"), (Kq, Kqa, "dq")):
            X2, dQ2 = X.clone(), dQ.clone()
            (X2 if which == "x" else dQ2)[0, 0, t] += e
            d = (X2 - X if which == "x" else dQ2 - dQ)[0, 0, t]
            diff = dk(X2, dQ2)[i] - dk(X, dQ)[i]
            tol = gamma(m + 1, U64) * (
                float(dk(X2, dQ2, True)[i].norm()) + float(dk(X, dQ, True)[i].norm())
            ) + gamma(2 * D + Dv + 7, U64) * float((Ma[t - i] @ d.abs()).norm())
            err = float((diff - M[t - i] @ d).norm())
            print(
                f"FD-F64 t={t} d{which}: measured {err:.3e} / tolerance {tol:.3e} = {err / tol:.3g}"
            )
            assert err <= tol, (t, which, err, tol)  # FD-F64
            if which == "x":  # without the w_t H_t k_i term: caught (not a tolerance)
                assert float((diff - broken[t - i] @ d).norm()) > 1e3 * tol


@pytest.mark.gpu
def test_gpu_ltb_dq_gka_setting_t2048():
    """LTB-dq at GKA's setting on the GPU: one sequence of T = 2048 tokens, D = Dv = 128,
    a = 0.02, r = 30, unit bf16 queries and keys, Gaussian values and cotangent, every 16th
    token. ``kernels.gka_layer``'s backward at its default (the dq solve on the warp-group MMA
    kernel on Hopper) and at chunk 32 (the Triton solve) within LTB-dq on every sampled token,
    LTB-dq below ||dq_t|| on every one, and dq scaled by 0.9 beyond it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    a, r, T = 0.02, 30, 2048
    q, k, v, dy = gka_inputs(T, 128, 6)
    x = {"q": q.cuda(), "k": k.cuda(), "v": v.cuda(), "g": None, "beta": None, "dy": dy.cuda()}
    tokens = torch.arange(0, T, 16)
    wg = mod.solve_kernel_for(x["q"], None, None, "bfloat16/operands", x["v"]) == "wgmma"
    qs = lambda t: [
        round(float(v), 4)
        for v in torch.quantile(t.flatten(), torch.tensor([0.1, 0.5, 0.9, 1.0], dtype=F64))
    ]  # noqa: E731
    runs = {
        "default": (
            lambda **kw: kernel_dq(x, a=a, iters=r, C=None, **kw),
            dq_bound(
                x,
                a=a,
                iters=r,
                C=32,
                contract="bfloat16/operands",
                tokens=tokens,
                dq_kernel="wgmma" if wg else "triton",
            ),
        ),
        "triton_c32": (
            lambda **kw: kernel_dq(x, a=a, iters=r, C=32, **kw),
            dq_bound(x, a=a, iters=r, C=32, contract="bfloat16/operands", tokens=tokens),
        ),
    }
    for name, (run, b) in runs.items():
        print(
            name,
            "wgmma" if (wg and name == "default") else "triton",
            "LTB-dq/||dq|| q10 q50 q90 max",
            qs(b.relative),
        )
        assert bool((b.relative < 1.0).all())  # a check on every sampled token
        m = ratio(run(), b)
        print(name, "measured/LTB-dq q10 q50 q90 max", qs(m))
        assert bool((m <= 1.0).all()), (name, float(m.max()))  # LTB-dq
        m = ratio(run(broken=BROKEN["dq scaled by 0.9"]()), b)
        assert bool((m > 1.0).any()), name


def test_backward_products_are_ieee_whatever_the_callers_tf32_setting(monkeypatch):
    """LTB-dq has the backward's PyTorch float32 products in float32; a caller's
    ``set_float32_matmul_precision("high")`` (TF32 in cuBLAS: operands rounded to tf32, beyond
    the bound by up to 3x on the cotangent) must not reach them. The backward runs them under
    "highest" and gives the caller's setting back."""
    seen = []
    original = mod.transposed_state_products

    def recording(*args):
        seen.append(torch.get_float32_matmul_precision())
        return original(*args)

    monkeypatch.setattr(mod, "transposed_state_products", recording)
    x = make_case(3, T=20, D=8, Dv=4)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        kernel_dq(x, a=0.05, iters=4, C=16)
        assert torch.get_float32_matmul_precision() == "high"  # given back
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen == ["highest"], seen
