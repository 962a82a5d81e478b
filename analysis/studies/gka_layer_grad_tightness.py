"""How large and how tight the per-token bound on the GKA layer's gradient dq is (LTB-dq,
``analysis.bounds.gka_layer_grad``; docs/gka_layer.md, "Gradients: rounding").

``python -m analysis.studies.gka_layer_grad_tightness [--T 128 256] [--every 4] [--kernel]``
prints, at GKA's setting (D = Dv = 128, a = 0.02, r = 30, L2-normalised bf16 keys and queries,
Gaussian bf16 values and cotangent dy, no gates), for every ``every``-th token from t = 0:

* ``LTB-dq / ||dq_t||`` for the Triton path (the backward's chunk 32, float32 states) and the
  warp-group MMA path (the dq solve in chunks of 64 on bf16 states), its quantiles and the share
  of tokens where it is below ``||dq_t||`` (conclusive);
* ``measured / LTB-dq`` for the warp-group MMA path's arithmetic in plain torch
  (:func:`emulate_dq`: the backward's float32 cotangent, then
  ``kernels.gka_layer_wgmma.emulate_solve`` on it), and with ``--kernel`` for
  ``kernels.gka_layer``'s backward at chunk 32 (the Triton kernels: on a GPU, or on the CPU under
  TRITON_INTERPRET=1);
* with ``--dv``, whether the per-token bounds of x (LTB) and dq (LTB-dq) can make dv and dk
  conclusive (:func:`dv_dk_worst_case`): a lower bound on the worst error of ``dv_i``, ``dk_i``
  they allow, over ``||dv_i||``, ``||dk_i||`` (above 1: any bound that knows only those norms is
  INCONCLUSIVE), and ``|x_t . k_i| / ||x_t||`` (i <= t), the size of what dv is made of.
"""

from __future__ import annotations

import torch

from analysis.argtypes import HelpFormatter, OneLineParser, positive_int
from analysis.bounds.gka_layer_grad import layer_dq_bound
from analysis.studies.gka_layer_tightness import QUANTILES, quantile_line

F64 = torch.float64


def gka_inputs(T: int, D: int, seed: int):
    """bf16 ``(1, T, D)`` unit queries and keys, Gaussian values and cotangent."""
    gen = torch.Generator().manual_seed(seed)
    unit = lambda: torch.nn.functional.normalize(  # noqa: E731
        torch.randn(1, T, D, generator=gen, dtype=F64), dim=-1
    )
    q, k = unit(), unit()
    v, dy = (torch.randn(1, T, D, generator=gen, dtype=F64) for _ in range(2))
    return tuple(t.to(torch.bfloat16) for t in (q, k, v, dy))


def emulate_dq(k, v, dy, *, a: float, iters: int, C: int = 32) -> torch.Tensor:
    """dq of ``kernels.gka_layer``'s backward where the forward ran on the warp-group MMA kernel
    (no gates), in plain torch: the cotangent ``dx = U_t^T dy_t`` in float32 from the backward's
    float32 value states at chunk C (``kernels.gka_layer_bwd``: ``chunk_states_reference``,
    ``transposed_state_products``), then ``kernels.gka_layer_wgmma.emulate_solve`` on it (chunks
    of 64, bf16 states, the float32 right-hand side unrounded: ``RHS_F32``); returned in bf16."""
    from kernels.gka_layer_bwd import chunk_states_reference, transposed_state_products
    from kernels.gka_layer_wgmma import emulate_solve

    N, T, D = k.shape
    Tp = max(C, -(-T // C) * C)
    chunks = lambda t: torch.nn.functional.pad(t.float(), (0, 0, 0, Tp - T)).reshape(  # noqa: E731
        N, Tp // C, C, t.shape[-1]
    )
    K, V, dY = chunks(k), chunks(v), chunks(dy)
    G = torch.zeros(N, Tp // C, C)
    _, U = chunk_states_reference(K, G, None, V)
    dx = transposed_state_products(dY, K, V, G, None, U).reshape(N, Tp, D)[:, :T]
    return emulate_solve(dx.contiguous(), k, a=a, iters=iters)


def kernel_dq(q, k, v, dy, *, a: float, iters: int, C: int = 32) -> torch.Tensor:
    """dq of ``kernels.gka_layer``'s backward at chunk C (Triton; on the CPU under the
    interpreter)."""
    import kernels

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    qq = q.to(dev).requires_grad_(True)
    y = kernels.gka_layer(qq, k.to(dev), v.to(dev), a=a, iters=iters, chunk_size=C)
    (dq,) = torch.autograd.grad((y * dy.to(dev)).sum(), [qq])
    return dq.cpu()


def _ascent(mats, radii, u0, steps: int = 30) -> float:
    """A lower bound on ``max_{||u|| = 1} sum_m sum_t radii_m[t] ||mats_m[t]^T u||`` (a convex
    function of u): the largest value met by the fixed-point ascent ``u <- grad / ||grad||`` from
    u0 (every u it visits gives a value the maximum is at least)."""
    u, best = u0 / u0.norm(), 0.0
    for _ in range(steps):
        grad, val = torch.zeros_like(u), 0.0
        for M, rho in zip(mats, radii):
            w = torch.einsum("tij,i->tj", M, u)
            n = w.norm(dim=-1).clamp_min(1e-300)
            val += float((n * rho).sum())
            grad += torch.einsum("tij,tj->i", M, w * (rho / n)[:, None])
        best, u = max(best, val), grad / grad.norm()
    return best


def dk_jacobians(K, V, dY, x, dq, H, s, i: int):
    """``(J, Kq)`` ``(T - i, D, D)``: the derivatives of ``dk_i`` (Lemma 1, no gates, beta = 1)
    with respect to ``x_t`` and ``dq_t`` for ``t >= i`` (:func:`dv_dk_worst_case`). K, x, dq
    ``(T, D)``, V, dY ``(T, Dv)``, H ``(T, D, D)`` the states H_t, s ``(T,)`` = ``2a / ||H_t||_F``."""
    ki, t = K[i], slice(i, K.shape[0])
    eye = torch.eye(K.shape[1], dtype=K.dtype)
    c, Hk = dY[t] @ V[i] - dq[t] @ ki, H[t] @ ki
    sH = s[t][:, None, None] * Hk[:, :, None]
    J = c[:, None, None] * eye - dq[t][:, :, None] * ki - sH * dq[t][:, None, :]
    Kq = -(x[t] @ ki)[:, None, None] * eye - x[t][:, :, None] * ki - sH * x[t][:, None, :]
    return J, Kq


def dv_dk_worst_case(q, k, v, dy, *, a: float, iters: int, C: int = 32, every: int = 4):
    """What per-token bounds on x and dq can give dv and dk (Lemma 1, no gates, beta = 1), at
    tokens ``0, every, ...``: ``(wv, wk, cos)``, a lower bound on the worst first-order error of
    ``dv_i`` and ``dk_i`` over all x and dq errors ``||e_t|| <= LTB_t``, ``||f_t|| <= LTB-dq_t``,
    relative to ``||dv_i||``, ``||dk_i||`` (any bound that knows no more than those norms is at least
    that large: above 1 it is INCONCLUSIVE), and ``|x_t . k_i| / ||x_t||`` for ``i <= t``.

    ``dv_i = sum_{t >= i} dy_t (x_t . k_i)``: its error is ``sum_t J_t e_t``, ``J_t = dy_t k_i^T``;
    ``dk_i = (P_i + P_i^T) k_i + Q_i^T v_i`` with ``sum_{t >= i} [x_t (dy_t . v_i) - x_t (dq_t . k_i)
    - dq_t (x_t . k_i) - w_t H_t k_i]``, ``w_t = 2 a x_t . dq_t / ||H_t||_F``: ``J_t = c_t I -
    dq_t k_i^T - s_t H_t k_i dq_t^T`` on e_t (``c_t = dy_t . v_i - dq_t . k_i``, ``s_t = 2a /
    ||H_t||_F``) and ``K_t = -(x_t . k_i) I - x_t k_i^T - s_t H_t k_i x_t^T`` on f_t. The worst
    case is ``max_u sum_t LTB_t ||J_t^T u|| + LTB-dq_t ||K_t^T u||`` over unit u (each e_t, f_t
    along ``J_t^T u``, ``K_t^T u``), bounded below by :func:`_ascent` from u = the gradient's
    direction. (Second-order terms ``e_t f_t`` are ~ LTB LTB-dq, the float32 arithmetic only
    adds.)"""
    from analysis.bounds.gka_layer import layer_token_bound
    from analysis.testing.gka_gradient_harness import gka_implicit_reference

    T = q.shape[1]
    kw = dict(a=a, iters=iters, chunk_size=C, contract="bfloat16/operands")
    ltb = layer_token_bound(q, k, **kw)
    bq = layer_dq_bound(k, v, dy, **kw)
    E, F, x, dq = ltb.bound[0], bq.bound[0], ltb.x[0], bq.dq[0]
    z, o = torch.zeros(1, T, dtype=F64), torch.ones(1, T, dtype=F64)
    wide = [t.to(F64) for t in (q, k, v)]
    ref = gka_implicit_reference(*wide, z, o, dy.to(F64), a=a, iters=iters, gated=False)
    dk, dv = ref[1][0], ref[2][0]
    K, V, dY = k.to(F64)[0], v.to(F64)[0], dy.to(F64)[0]
    H = torch.cumsum(K[:, :, None] * K[:, None, :], 0)
    s = 2 * a / torch.linalg.matrix_norm(H)
    wv, wk = [], []
    for i in range(0, T, every):
        ki, t = K[i], slice(i, T)
        Jv = dY[t][:, :, None] * ki[None, None, :]
        wv.append(_ascent([Jv], [E[t]], dv[i]) / float(dv[i].norm()))
        J, Kq = dk_jacobians(K, V, dY, x, dq, H, s, i)
        wk.append(_ascent([J, Kq], [E[t], F[t]], dk[i]) / float(dk[i].norm()))
    cos = ((x / x.norm(dim=-1, keepdim=True)) @ K.T).abs()[torch.tril(torch.ones(T, T)) > 0]
    return torch.tensor(wv, dtype=F64), torch.tensor(wk, dtype=F64), cos


def _measured(dq, b) -> torch.Tensor:
    return torch.linalg.vector_norm(dq.to(F64)[:, b.tokens] - b.dq, dim=-1) / b.bound


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--T", type=positive_int, nargs="+", default=[128])
    parser.add_argument("--every", type=positive_int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kernel", action="store_true")
    parser.add_argument("--dv", action="store_true")
    args = parser.parse_args(argv)
    D, a, r = 128, 0.02, 30
    print(
        f"D={D} a={a} r={r} unit keys and queries, Gaussian v and dy, bf16, no gates, every "
        f"{args.every}th token"
    )
    print("quantiles " + " ".join(str(q) for q in QUANTILES))
    for T in args.T:
        q, k, v, dy = gka_inputs(T, D, args.seed)
        tokens = torch.arange(0, T, args.every)
        kw = dict(a=a, iters=r, chunk_size=32, contract="bfloat16/operands", tokens=tokens)
        for path, C in (("wgmma", 64), ("triton", 32)):
            b = layer_dq_bound(k, v, dy, dq_kernel=path, **kw)
            rel = b.relative
            below = float((rel < 1).double().mean())
            print(
                f"T={T:5d} C={C:<3d} LTB-dq/||dq||  {quantile_line(rel)}  below ||dq||: {below:.3f}"
            )
            print(f"        dx error bound/||dx||  {quantile_line(b.dx_error / b.dx.norm(dim=-1))}")
            if path == "wgmma":
                m = _measured(emulate_dq(k, v, dy, a=a, iters=r), b)
                print(
                    f"        warp-group MMA arithmetic (emulated): measured/LTB-dq  {quantile_line(m)}"
                )
            elif args.kernel:
                m = _measured(kernel_dq(q, k, v, dy, a=a, iters=r), b)
                print(
                    f"        Triton kernel (kernels.gka_layer): measured/LTB-dq  {quantile_line(m)}"
                )
        if args.dv:
            wv, wk, cos = dv_dk_worst_case(q, k, v, dy, a=a, iters=r, every=args.every)
            for name, w in (("dv", wv), ("dk", wk)):
                below = float((w < 1).double().mean())
                print(
                    f"T={T:5d} {name}: worst case/||{name}_i|| >= {quantile_line(w)}  below: {below:.3f}"
                )
            print(f"        |x_t . k_i| / ||x_t||, i <= t  {quantile_line(cos)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
