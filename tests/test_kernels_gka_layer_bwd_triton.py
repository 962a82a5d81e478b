"""kernels/gka_layer_bwd_triton.py (the GKA layer's fused backward) against the PyTorch formulas it
fuses, kernels/gka_layer_bwd.py, evaluated in float64 on the same float32 values.

Bound ``ROUND``: each output is a sum of products of the inputs, so its float32 evaluation in any
order is within ``gamma_m(u_32)`` of the exact value times the same formulas on absolute values
(``implicit_backward(absolute=True)``, Higham eq. (3.5) applied term by term), with
m = T + 2D + 2C + 16 the longest chain of sums (as GRAD, analysis/testing/gka_gradient_harness.py)
plus ``4 (Lambda + 2)`` for the gates: every mask entry ``exp(G_c - G_i)`` is formed in float32
from a difference of size at most Lambda (the largest |G| in a chunk), relative error at most
``(Lambda + 2) u``, and at most two of them multiply in one term (``M diag(w) M^T``), counted
twice for margin. The end-to-end check of the layer's gradients against the float64 reference is
GRAD in tests/test_kernels_gka_layer.py.
"""

import math

import pytest
import torch
from kernel_support import DEVICE, needs_triton_device

from analysis.precision import gamma
from kernels import gka_layer_bwd_triton as fused
from kernels.gka_layer_bwd import (
    _carry_backwards,
    chunk_states_reference,
    chunked,
    implicit_backward,
    transposed_state_products,
)

pytestmark = needs_triton_device
F64 = torch.float64
U32 = 2.0**-24


def case(seed, *, N=2, T=48, D=8, Dv=6, C=16, gated=True, beta=True, layer=True):
    """Padded flat float32 rows as kernels.gka_layer's backward passes them (T a multiple of C,
    the last chunk's tail tokens zero as padding is), and float32 chunk-start states."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(N, T, D, generator=gen), dim=-1)
    x = torch.randn(N, T, D, generator=gen)
    dq = torch.randn(N, T, D, generator=gen)
    v = torch.randn(N, T, Dv, generator=gen) if layer else None
    dy = torch.randn(N, T, Dv, generator=gen) if layer else None
    pad = T - 5  # the last five tokens are padding: k = v = 0, dq = dy = 0
    for t in (k, x, dq) + ((v, dy) if layer else ()):
        t[:, pad:] = 0.0
    g = -0.4 * torch.rand(N, T, generator=gen) if gated else None
    G = None if g is None else torch.cumsum(g.reshape(N, T // C, C), -1).reshape(N, T)
    b = (0.2 + 1.5 * torch.rand(N, T, generator=gen)) if beta else None
    fro = 0.5 + torch.rand(N, T, generator=gen)
    G0 = torch.zeros(N, T) if G is None else G
    S, R = chunk_states_reference(
        chunked(k.double(), C),
        chunked(G0.double(), C),
        None if b is None else chunked(b.double(), C),
        None if v is None else chunked(v.double(), C),
    )
    S = S.float().contiguous()
    R = None if R is None else R.float().contiguous()
    return dict(k=k, x=x, dq=dq, v=v, dy=dy, G=G, beta=b, fro=fro, S=S, R=R, C=C)


def on_device(c):
    return {
        n: (t.to(DEVICE).contiguous() if isinstance(t, torch.Tensor) else t) for n, t in c.items()
    }


def reference(c, a, absolute=False):
    """implicit_backward in float64 on the case's values: (dk, dv, dbeta, dG), flat."""
    C = c["C"]
    f = (lambda t: t.double().abs()) if absolute else (lambda t: t.double())  # noqa: E731
    N, T, _ = c["k"].shape
    G0 = torch.zeros(N, T) if c["G"] is None else c["G"]
    dk, dv, dbeta, dG = implicit_backward(
        K=chunked(f(c["k"]), C),
        G=chunked(G0.double(), C),
        beta=None if c["beta"] is None else chunked(c["beta"].double(), C),
        X=chunked(f(c["x"]), C),
        dQ=chunked(f(c["dq"]), C),
        fro=chunked(c["fro"].double(), C),
        S=f(c["S"]),
        a=a,
        V=None if c["v"] is None else chunked(f(c["v"]), C),
        dY=None if c["dy"] is None else chunked(f(c["dy"]), C),
        R=None if c["R"] is None else f(c["R"]),
        absolute=absolute,
    )
    flat = lambda t: None if t is None else t.reshape(N, T, *t.shape[3:])  # noqa: E731
    return flat(dk), flat(dv), flat(dbeta), flat(dG)


def round_allowance(c) -> float:
    """gamma_m(u_32) of ROUND (module docstring)."""
    N, T, D = c["k"].shape
    lam = 0.0 if c["G"] is None else float(c["G"].abs().max())
    m = T + 2 * D + 2 * c["C"] + 16 + 4 * (math.ceil(lam) + 2)
    return gamma(m, U32)


def fused_grads(c, a, carried=None):
    d = on_device(c)
    out = fused.implicit_backward_fused(
        k=d["k"], x=d["x"], dq=d["dq"], fro=d["fro"], G=d["G"], beta=d["beta"], S=d["S"], a=a,
        C=d["C"], v=d["v"], dy=d["dy"], R=d["R"], carried=carried,
    )  # fmt: skip
    return [None if t is None else t.cpu().double() for t in out]


def excess(c, a, got):
    """max over outputs and entries of |fused - float64 formulas| / ROUND."""
    want, ab = reference(c, a), reference(c, a, absolute=True)
    g = round_allowance(c)
    worst = 0.0
    for name, x, w, b in zip(("dk", "dv", "dbeta", "dG"), got, want, ab):
        if w is None:
            assert x is None, name
            continue
        # the 1e-300 keeps exact zeros (padding) comparable without a division by zero
        worst = max(worst, float(((x - w).abs() / (g * b + 1e-300)).max()))
    return worst


@pytest.mark.parametrize(
    "gated, beta, layer, D, Dv, C",
    [
        (True, True, True, 8, 6, 16),
        (False, False, True, 8, 6, 16),
        (True, False, False, 5, 6, 16),
        (False, True, True, 20, 3, 32),
    ],
)
def test_fused_backward_is_the_pytorch_formulas(gated, beta, layer, D, Dv, C):
    a = 0.05
    c = case(
        1, T=2 * C + 16 if C == 16 else 2 * C, D=D, Dv=Dv, C=C, gated=gated, beta=beta, layer=layer
    )
    assert excess(c, a, fused_grads(c, a)) <= 1.0  # ROUND


def test_dx_is_the_transposed_state_products():
    c = case(2, T=48, D=8, Dv=6, C=16)
    d = on_device(c)
    got = fused.dx_from_dy(d["k"], d["v"], d["dy"], d["G"], d["beta"], d["R"], 16).cpu().double()
    C, N, T = 16, 2, 48
    args = lambda f: (  # noqa: E731
        chunked(f(c["dy"]), C),
        chunked(f(c["k"]), C),
        chunked(f(c["v"]), C),
        chunked(c["G"].double(), C),
        chunked(c["beta"].double(), C),
        f(c["R"]),
    )
    want = transposed_state_products(*args(lambda t: t.double())).reshape(N, T, -1)
    ab = transposed_state_products(*args(lambda t: t.double().abs())).reshape(N, T, -1)
    assert ((got - want).abs() <= round_allowance(c) * ab + 1e-300).all()  # ROUND


def test_carried_products_are_the_carry():
    """ksig, kqt, vq = K (P_end + P_end^T), K Q_end^T, V Q_end with P_end, Q_end the PyTorch carry
    of kernels/gka_layer_bwd.py (float64), within ROUND."""
    a, C = 0.05, 16
    c = case(3, T=64, D=8, Dv=6, C=C)
    d = on_device(c)
    got = fused.carried_products(
        k=d["k"], x=d["x"], dq=d["dq"], fro=d["fro"], G=d["G"], beta=d["beta"], S=d["S"], a=a,
        C=C, v=d["v"], dy=d["dy"],
    )  # fmt: skip
    got = [t.cpu().double() for t in got]

    def carries(absolute):
        f = (lambda t: t.double().abs()) if absolute else (lambda t: t.double())  # noqa: E731
        K, X, dQ = (chunked(f(c[n]), C) for n in ("k", "x", "dq"))
        V, dY = chunked(f(c["v"]), C), chunked(f(c["dy"]), C)
        G, beta, fro = (chunked(c[n].double(), C) for n in ("G", "beta", "fro"))
        zeta = torch.exp(G)
        w = 2 * a * (X * dQ).sum(-1) / fro
        M = torch.exp(G.unsqueeze(-2) - G.unsqueeze(-1)).triu()  # decay_mask
        b = (M @ (w * zeta).unsqueeze(-1)).squeeze(-1)
        s = (zeta * zeta * w).sum(-1)
        sgn = 1.0 if absolute else -1.0  # absolute: every term added (ROUND's magnitudes)
        dH = sgn * (
            0.5 * s[..., None, None] * f(c["S"])
            + K.transpose(-1, -2) @ (0.5 * (beta * b).unsqueeze(-1) * K)
            + (dQ * zeta.unsqueeze(-1)).transpose(-1, -2) @ X
        )
        P = _carry_backwards(dH, zeta[..., -1])
        Q = _carry_backwards((dY * zeta.unsqueeze(-1)).transpose(-1, -2) @ X, zeta[..., -1])
        flat = lambda t: t.reshape(2, 64, -1)  # noqa: E731
        return flat(K @ (P + P.transpose(-1, -2))), flat(K @ Q.transpose(-1, -2)), flat(V @ Q)

    want, ab = carries(False), carries(True)
    g = round_allowance(c)
    for name, x, w, b in zip(("ksig", "kqt", "vq"), got, want, ab):
        assert ((x - w).abs() <= g * b + 1e-300).all(), name  # ROUND
        assert torch.equal(x[:, -16:], torch.zeros_like(x[:, -16:]))  # nothing after the last chunk


def test_carried_products_from_the_wrong_chunk_fail():
    """ROUND catches carried products read one chunk late (each chunk gets the next one's)."""
    a, C = 0.05, 16
    c = case(4, T=64, D=8, Dv=6, C=C)
    d = on_device(c)
    good = fused.carried_products(
        k=d["k"], x=d["x"], dq=d["dq"], fro=d["fro"], G=d["G"], beta=d["beta"], S=d["S"], a=a,
        C=C, v=d["v"], dy=d["dy"],
    )  # fmt: skip
    assert excess(c, a, fused_grads(c, a, carried=good)) <= 1.0  # ROUND
    late = tuple(torch.roll(t, -C, dims=1) for t in good)
    assert excess(c, a, fused_grads(c, a, carried=late)) > 1.0
