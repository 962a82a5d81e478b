"""Rounding bounds of Spectral Koopman Attention readouts (Echo eq. (12)-(13), Appendix F steps
4-10), as computed by ``kernels.koopman_readout`` (explicit ``L^-1``, then products) and
``solvers.koopman_readout`` (triangular solves), for the kernel harness's ``koopman`` strategy
(analysis/testing/koopman_strategy.py).

The bound (:func:`readout_bound`) -- a proof, under stated hypotheses
---------------------------------------------------------------------
Per query, ``||y_kernel - y_reference|| <= B(contract) + B(float32)`` (plus the harness's
rounding of the returned y), ``B(c)`` a bound on the distance of a readout computed under c
from the exact readout ``y_q = eta c^K W A_w^K w_q`` of the rounded statistics (eq. (13) with
eq. (12)'s factor ``c = gamma / max(1, sigma)``, sigma the 6-step power estimate, all exact):
``W = C_v X^T``, ``w_q = X zq_q / m``, ``X = L^{-1}``, ``A_w = X M X^T`` (Appendix F steps 4-10).
It holds to all orders, not to first order: every step below bounds products of ``(1 + delta)``
factors exactly and every inverse by a Neumann series whose condition is checked per system;
where one fails the bound is ``inf`` and the run is INCONCLUSIVE, not PASS. All the norms it
needs are evaluated in float64 from the exact L, X, A_w (a posteriori in that sense: from the
inputs, never from the kernel's output), then inflated by ``1 + 1e-9`` for their own float64
rounding (relative ``r kappa(G~) 2^-53``, below 1e-11 on the drawn cases).

Hypotheses (what "computed under c" means). (H1) the factor satisfies Higham Thm 10.3,
``L^ L^T = G~ + dG``, ``|dG| <= th_{r+1} |L^||L^T|``; (H2) each triangular solve, and each
column of ``X^ = L^{-1}`` by substitution on I, satisfies Thm 8.5, ``(L^ + dL) x^ = b``,
``|dL| <= th_r |L^|``; (H3) each product, matvec and 2-norm of length n errs by at most
``th_n |a|^T |b|`` (Lemma 3.1 with eq. (3.4)), each scaling and stored value by one ``u``.
``th_n = (1 + u_o)^2 (1 + u)^n (1 + u_s) - 1``, u_o the contract's operand rounding of a
float32 value (tf32: 2^-10, truncation covered), u its accumulation (2^-23 where the products
run on the tensor cores, tf32 and tf32x3, which add with truncation; 2^-24 for "ieee" float32
products), u_s its stores; tf32x3 forms a product from three tf32 passes into one accumulator,
charged as ``theta_{4n}`` (3n additions, the split parts' magnitudes within (1 + 2^-11)^2). Every
division and square root, in H1-H3 alike, is charged the GPU's error, not one u: Triton lowers
the kernel's float32 ``/`` to ``div.full.f32`` ("maximum ulp error is 2", PTX ISA) and
``tl.sqrt`` to ``sqrt.approx.ftz.f32`` (3 ulps taken, conservatively: no PTX figure could be
established), and k ulps are at most ``2 k u / (1 - 2 k u)`` relative (u = 2^-24), so
``u_div = 4u / (1 - 4u)`` and ``u_sqrt = 6u / (1 - 6u)`` (``U_DIV``, ``U_SQRT``; derivation at
their definition). Charged: the factor's pivots ``sqrt(a_jj)`` and ``a_ij / l_jj`` (H1: Thm
10.3's ``gamma_{r+1}`` becomes ``(1 + u)^{r-1} max((1 + u_sqrt)^2, (1 + u_div)(1 + u))``), the
substitution's ``b_j / l_jj`` (H2: ``(1 + u)^{r-1} (1 + u_div)``), both with every factor
inverted (``v / (1 - v)``), as Lemma 8.4 moves them; the power iteration's norms and ``x /
||x||`` and the estimate's ``||A v||`` (step 4), ``gamma / max(sigma, 1)`` (``zeta``, also
where both factors are gamma: ``gamma / 1`` is exact only when correctly rounded) and the
queries' ``1 / m`` (``z * (1 / m)``: a division and a product). Correctly rounded arithmetic
(the interpreter's, torch's) errs by less, so the bound holds on the CPU and the GPU alike.
H1/H2 run
under ``factor_contract`` (default float32: the factorisation and substitution are scalar
recurrences, in ``kernels.koopman_readout`` as in ``solvers.koopman_readout``) and H3 under
the contract. ``solvers.koopman_readout`` (algorithm ``"solves"``) and the one-tile path of
``kernels.koopman_readout`` (``"inverse"``: Alg. 10.2 with Alg. 8.1 on I, then products)
satisfy them; the kernel's 2 x 2 blocked path (r = 33..64 under "ieee", 17..48 under tf32 /
tf32x3) forms ``L21 = G21 X11^T`` and ``X21`` by products, for which H1/H2 carry an extra
factor ``|| |X11||L11| ||`` not derived here: at those sizes the bound is a model of that path.

The steps (``eps``, ``rho``, ``phi`` checked ``< 1/2`` per system, else ``inf``):

1. Factor (H1): with ``d_i = sqrt(g_ii)``, ``|L^||L^T| <= d d^T / (1 - th)`` (Cauchy-Schwarz on
   the rows, ``||l^_i||^2 = g_ii + dg_ii``), so ``E = X dG X^T`` has ``||E||_F <= eps``; refined
   a posteriori with ``|L^| <= |L| (I + |Q - I|)``, ``L^ = L Q``, ``||Q - I||_F <= rho =
   eps / (1 - eps)`` (Sun's theorem, Higham Thm 10.8, for ``Q Q^T = I + E``, taken without its
   factor 2^{-1/2}), ``||Q^{-1}|| <= (1 - eps)^{-1/2}``.
2. Substitution (H2): ``x^ = L^{-1} b - L^{-1} r``, ``|r| <= th |L^||x^|``; with ``c2 =
   || |X||L| ||_2`` this gives ``||X^ L - I||_F <= phi`` (inverse) or ``||x^ - X b|| <= phi ||X b||``
   (solves), a Neumann-type fixed point valid while ``th c2^2 (1 + rho) / sqrt(1 - eps) < 1/2``.
3. Whitened operator: ``||A^_w - A_w||_F <= dw`` from ``(I + Phi) A_w (I + Phi)^T`` and
   ``th || |X||M||X|^T ||`` (inverse), or from ``Q^{-1} A_w Q^{-T}`` and the two solves'
   residuals (solves).
4. Eq. (12): every computed estimate lies in ``[lo, hi]``: ``hi = (||A_w|| + dw) (1 + ...)``;
   ``lo`` by tracking the computed power iterates against the exact ones for j steps
   (Dunkl-Williams, ``||x/|x| - y/|y||| <= 2 |x - y| / (|x| + |y|)``) and then using that an exact
   step never lowers ``||A v||`` (Cauchy-Schwarz), less each step's rounding; best j taken.
   So ``c^ = c (1 + z)``, ``|z| <= zeta``; ``zeta = 0`` when ``hi <= 1`` (both factors are
   gamma exactly: SKA's own statistics, docs/koopman.md). The factor scales y exactly, which
   gives the term ``((1 + zeta)^K - 1) ||y_q||``; the rest is taken at ``c (1 + zeta)``.
5. Readout: the chains ``F_k = F_{k-1} A'`` (inverse) or ``w_k = A' w_{k-1}``, ``z_f = L^ w_K``,
   ``y = eta B_v z_f`` (solves) with every error carried as ``(x + dx)(y + dy) - x y`` (all
   orders) and every rounding ``th || |x||y| ||`` evaluated on the exact factors plus their
   error bounds.

``B(c)`` is the larger of the two algorithms' bounds for the kernel (``algorithm="either"``,
any kernel of one of the two kinds), the ``"solves"`` bound for the float32 reference. The
first-order model that preceded it, ``(A(contract) + A(float32)) S_q`` with the allowance
``A(c) = 8 (K + 2) kappa(G~) (r u_acc + u)`` (docs/precision.md) and the partial-product size
``S_q`` (:func:`readout_terms`), is kept as :func:`model_bound` (``koopman_strategy(bound=
"model")``): a model of a backward-stable readout, not a theorem.

How tight, against the exact readout (float64) on the same statistics (docs/harness.md,
"Koopman readout"; tests/test_harness_koopman.py), on 250 drawn cases (seeds 0-4, 50 each):

* bound / ``||y||`` (kernel's bound plus reference's, ``||y||`` the system's largest query
  output), median / 90% / max: float32 0.0084 / 0.65 / 2.6, vacuous on 1.6% (4 cases, r = 64
  with M x 3, where the bracket of the power estimate leaves c a few percent of play; before
  the GPU's division and root were charged, 0.0069 / 0.60 / 2.3 and 2 cases: the bound grew by
  x 1.23 at the median case, x 4.3 at most, on the r = 1 cases, whose few products leave the
  divisions dominant, x 1.10 at r = 64); tf32 (u = 2^-10, the growth below 1.07)
  0.82 / 32 / 438, vacuous on 49% (5 of 73 cases with r <= 8, 78 of 92 with r = 64: the worst
  case of 2^-10 roundings in ``L^{-1} M L^{-T}``, ``th || |X||M||X|^T ||``, reaches ``||A_w||``).
  The model on the same cases: float32 0.0021 / 0.059 / 0.44, never vacuous; tf32 0.72 / 10 /
  57, vacuous on 38%. bf16 inputs: float32 0.0083 / 0.65 / 2.4, vacuous on 1.6% (was 0.0068 /
  0.60 / 2.2), tf32 0.81 / 32 / 439;
* measured / bound, never above 1: the float32 emulation of the kernel's algorithm against its
  ``"inverse"`` bound 9.2e-5 / 0.0047 / 0.053 (was 1.1e-4 / 0.0088 / 0.15: the small-r cases
  that came closest are those whose bound grew most), ``solvers.koopman_readout`` in float32
  against ``"solves"`` 1.2e-4 / 0.0054 / 0.061 (was 1.7e-4 / 0.020 / 0.27), the tf32 emulation
  (operands truncated, as Triton's tf32 dot does) 0.0057 / 0.23 / 0.53 (unchanged);
* ``kernels.koopman_readout`` through Triton's interpreter, 50 cases, seed 0, float32: at most
  0.021 of the bound before the division charge. On an H100 (Triton 3.6) it used at most 0.24
  (float32) and 0.48 (tf32) of the model; against the bound before the division charge (run
  35) 0.027 (float32 inputs) and 0.74 (bf16 inputs) under the float32 contract. The charge
  only raises the bound, so these are upper limits of the kernel's share of it (not re-run).

Outside the proof: the blocked path (r = 33-64 under ieee, 17-48 under tf32), where the bound
is a model (its divisions and square roots are the one-tile path's, charged alike); and
underflow (``sqrt.approx.ftz`` flushes a subnormal to 0), which the standard model excludes.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

import solvers
from analysis.bounds.kla_kernel import U_DOT
from analysis.precision import rounding_allowance
from solvers.contracts import parse
from solvers.koopman import POWER_ITERS

F64 = torch.float64

# ----------------------------------------------------------------- the GPU's division and square root
# The kernel's float32 divisions and square roots (kernels/koopman.py: the pivot sqrt(a_jj) and
# a_ij / l_jj of the factor, b_j / l_jj of the substitution, x / ||x|| of the power iteration,
# the estimate's ||A v||, gamma / max(sigma, 1) and 1 / m) are not correctly rounded on an
# NVIDIA GPU: Triton lowers ``/`` on float32 to ``div.full.f32`` and ``tl.sqrt`` to
# ``sqrt.approx.ftz.f32`` (PTX of both kernels compiled for sm_90, read back: Triton 3.6.0, as
# on the H100, and 3.9.0 alike; no other division, reciprocal or root in it). The PTX ISA states for div.full.f32 "The maximum ulp error is 2 across
# the full range of inputs"; for sqrt.approx.f32 it states no figure that we could establish,
# so the conservative value is taken: 3 ulps, the OpenCL bound for single-precision sqrt that
# NVIDIA cites for the same instruction (a smaller figure from the CUDA guide would tighten it).
#
# From k ulps to a relative error: a normal float32 z in [2^e, 2^(e+1)) has ulp(z) = 2^(e-23)
# <= 2^-23 |z| = 2 u |z| (u = 2^-24). With the ulp taken at the exact result x, |y - x| <= k
# ulp(x) <= 2 k u |x|; taken at the computed y instead, |y - x| <= 2 k u |y| <= 2 k u (|x| +
# |y - x|), so |y - x| <= 2 k u / (1 - 2 k u) |x|: the larger, charged below, covers both
# readings. A correctly rounded operation (the interpreter's IEEE arithmetic, torch's CPU and
# CUDA kernels, a trsm that multiplies by a rounded reciprocal: (1 + u)^2 - 1 < 4 u) errs by
# less, so one bound serves the CPU and the GPU. (ftz: a subnormal operand or result is flushed
# to 0; like the standard model, the proof assumes no underflow.)
U32 = 2.0**-24  # unit roundoff of float32
DIV_ULPS = 2  # div.full.f32, PTX ISA
SQRT_ULPS = 3  # sqrt.approx.f32: conservative (no stated PTX figure established)


def ulps_relative(k: float) -> float:
    """``2 k u / (1 - 2 k u)``, u = 2^-24: the relative error of a float32 result within k ulps
    of the exact one, whichever of the two results the ulp is taken at (derivation above)."""
    return 2 * k * U32 / (1 - 2 * k * U32)


U_DIV = ulps_relative(DIV_ULPS)  # 4u / (1 - 4u)
U_SQRT = ulps_relative(SQRT_ULPS)  # 6u / (1 - 6u)


def _inv(v):
    """``v / (1 - v)``: a bound on ``|1 / (1 + d) - 1|`` for ``|d| <= v < 1`` (a rounding factor
    that a backward-error recurrence moves to the other side, inverted)."""
    return v / (1 - v)


def _units(contract) -> SimpleNamespace:
    """The allowance's ``u_acc`` and ``u_store`` for a contract: its accumulation, and the
    larger of its stores and its operand rounding of a float32 value."""
    c = parse(contract)
    return SimpleNamespace(u_acc=c.u_acc, u_store=max(c.u_store, c.u_operand(2.0**-24)))


def _param(v, batch, device) -> torch.Tensor:
    return torch.broadcast_to(torch.as_tensor(v, dtype=F64, device=device), batch)


def readout_terms(G, M, Cv, zq, *, scale, K: int, eta, gamma, power_iters: int = POWER_ITERS):
    """``(S_q (*batch, Q), kappa(G~) (*batch))`` of the exact readout on these statistics
    (float64): ``S_q = |eta| max_k ||W A'^k|| max(||A'^{K-k} w_q||, ||A'|| ||A'^{K-k-1} w_q||)``
    with ``W = C_v L^{-T}``, ``w_q = L^{-1} zq_q / m`` (module docstring). A G~ that is not
    positive definite gives ``S_q = inf``."""
    G, M, Cv, zq = (x.to(F64) for x in (G, M, Cv, zq))
    batch, r = G.shape[:-2], G.shape[-1]
    L, info = torch.linalg.cholesky_ex(G)
    ok = info == 0
    eye = torch.eye(r, dtype=F64, device=G.device)
    L = torch.where(ok[..., None, None], L, eye)
    X = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False)
    A_w = X @ M @ X.mT
    sigma = solvers.power_sigma_max(A_w, iters=power_iters)
    A = (_param(gamma, batch, G.device) / sigma.clamp(min=1.0))[..., None, None] * A_w
    a = torch.linalg.matrix_norm(A, ord=2)
    m = _param(scale, batch, G.device)
    # left[k] = ||W A'^k||, right[j] = ||A'^j w_q|| (per query)
    WA, w = Cv @ X.mT, (zq @ X.mT) / m[..., None, None]
    left, right = [], []
    for _ in range(K + 1):
        left.append(torch.linalg.matrix_norm(WA, ord=2))
        right.append(torch.linalg.vector_norm(w, dim=-1))
        WA, w = WA @ A, w @ A.mT
    # every first-order error of the chain eta W A' ... A' w_q sits between two partial
    # products, with at most one factor A' in between replaced by its norm
    S = torch.stack(
        [
            left[k][..., None]
            * (
                right[K - k]
                if k == K
                else torch.maximum(right[K - k], a[..., None] * right[K - k - 1])
            )
            for k in range(K + 1)
        ]
    ).amax(0)
    S = _param(eta, batch, G.device).abs()[..., None] * S
    lam = torch.linalg.eigvalsh(G)
    kappa = torch.where(ok, lam[..., -1] / lam[..., 0], torch.full_like(lam[..., 0], math.inf))
    return torch.where(ok[..., None], S, torch.full_like(S, math.inf)), kappa


def model_bound(G, M, Cv, zq, *, scale, K: int, eta, gamma, contract) -> torch.Tensor:
    """Per query ``(*batch, Q)``: ``A(contract) S_q``, the first-order model bound (the
    strategy's bound before the proof, kept for comparison: ``koopman_strategy(bound="model")``) on the distance of a
    readout honouring ``contract`` from the exact readout of these statistics (module
    docstring; ``A(c) = rounding_allowance((K + 2) kappa(G~), r, c)``)."""
    S, kappa = readout_terms(G, M, Cv, zq, scale=scale, K=K, eta=eta, gamma=gamma)
    r = G.shape[-1]
    units = _units(contract)
    allowance = torch.tensor(
        [rounding_allowance((K + 2) * float(k), r, units) for k in kappa.reshape(-1).tolist()],
        dtype=F64,
        device=S.device,
    ).reshape(kappa.shape)
    return allowance[..., None] * S


# ----------------------------------------------------------------------------- the bound (a proof)


def _theta(n: int, u: float, u_o: float, u_s: float) -> float:
    """``theta_n = (1 + u_o)^2 (1 + u)^n (1 + u_s) - 1``: a dot product of length n whose two
    operands are rounded once (``u_o``), its products and n - 1 sums rounded in any order
    (``u``) and its result stored (``u_s``) is ``a^T b + e`` with ``|e| <= theta_n |a|^T |b|``
    (Higham Lemma 3.1 and eq. (3.4), products of ``1 + delta`` factors, no first-order
    truncation)."""
    return (1 + u_o) ** 2 * (1 + u) ** n * (1 + u_s) - 1


def _n2(A: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_norm(A, ord=2)


def _nF(A: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_norm(A, ord="fro")


def _vn(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def _mv(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (A @ v[..., None])[..., 0]


def _power_bracket(A_w, a_w, abs_aw, dw, dw2, th, u, u_div, u_sqrt, iters):
    """``(sigma, lo, hi)``: the exact estimate (``iters`` steps from the unit all-ones vector,
    float64) and an interval holding every estimate computed from a matrix within ``dw``
    (Frobenius; ``dw2`` in the 2-norm) of ``A_w`` with matvecs within ``th |A||v|``, square
    roots within ``u_sqrt``, divisions within ``u_div`` and the starting vector within u
    (module docstring, "The bound", step 4)."""
    r = A_w.shape[-1]
    nu_n = (1 + th) ** 0.5 * (1 + u_sqrt) - 1  # a computed 2-norm: sum of squares, then sqrt
    nu_u = (1 + u_div) / (1 - nu_n) - 1  # x / ||x|| entrywise, relative
    vn = 1 + nu_u  # ||v^|| for every computed unit vector
    big, ab = a_w + dw2, abs_aw + dw  # ||A^||_2, || |A^| ||_2
    rnd = th * ab * vn  # ||fl(A^ v^) - A^ v^||
    # upper end: ||fl(A^ v^)|| <= ||A^|| ||v^|| + rnd, then the norm's own rounding (and the
    # chain's cap below)
    hi = (big * vn + rnd) * (1 + nu_n)

    def half(e, pn):
        # Dunkl-Williams in an inner-product space: ||x/|x| - y/|y||| <= 2 |x - y| / (|x| + |y|)
        ok = 2 * pn > e
        return torch.where(ok, 2 * e / (2 * pn - e).clamp(min=1e-300) + nu_u, 2 + nu_u)

    def step_up(s):
        # one computed step from v^ with ||A^ v^|| >= s: ||A^ S(v^)|| >= ||A^ v^|| / ||v^||
        # (Cauchy-Schwarz, S the exact step), less the step's rounding times ||A^||
        pos = s > 0
        s = s.clamp(min=1e-300)
        eta1 = half(rnd, s)
        t = s / vn
        eta2 = half(big * eta1 + rnd, t)
        return torch.where(pos, (t - big * eta2).clamp(min=0), torch.zeros_like(s))

    v = torch.full(A_w.shape[:-1], 1 / math.sqrt(r), dtype=F64, device=A_w.device)
    # ||v^_0 - v_0||: v_0 = 1 / sqrt(r) formed in float64 on the host and rounded once
    ev = torch.full(A_w.shape[:-2], u, dtype=F64, device=A_w.device)
    starts = []
    for k in range(iters + 1):
        p = _mv(A_w, v)
        pn = _vn(p)
        # the computed ||A^ v^_k|| from the exact ||A v_k|| and the chain's ||v^_k - v_k||
        starts.append((pn - a_w * ev - dw2 * vn).clamp(min=0))
        if k == iters:
            break
        ev = half(a_w * ev + dw2 * vn + rnd, pn)
        u_ = p / pn.clamp(min=1e-300)[..., None]
        q = _mv(A_w.mT, u_)
        qn = _vn(q)
        ev = half(a_w * ev + dw2 * vn + rnd, qn)
        v = q / qn.clamp(min=1e-300)[..., None]
    sigma = pn
    # the chain also caps the estimate from above: ||A^ v^|| <= ||A v|| + ||A|| ev + ||dA|| ||v^||
    hi = torch.minimum(hi, (pn + a_w * ev + dw2 * vn + rnd) * (1 + nu_n))
    lo = torch.zeros_like(sigma)
    for j, s in enumerate(starts):  # chain to step j, then near-monotone steps to the end
        for _ in range(iters - j):
            s = step_up(s)
        lo = torch.maximum(lo, ((s - rnd) * (1 - nu_n)).clamp(min=0))
    return sigma, lo, hi


def readout_bound(
    G,
    M,
    Cv,
    zq,
    *,
    scale,
    K: int,
    eta,
    gamma,
    contract,
    algorithm: str = "either",
    factor_contract="float32",
    power_iters: int = POWER_ITERS,
    return_steps: bool = False,
):
    """Per query ``(*batch, Q)``: a bound on ``||y_computed - y||``, y the exact readout of these
    statistics, for a readout computed by ``algorithm`` with its products under ``contract`` and
    its factorisation and triangular inverse or solves under ``factor_contract`` (module
    docstring, "The bound"; ``inf`` where a condition of the proof fails: INCONCLUSIVE).

    ``algorithm``: ``"inverse"`` (``kernels.koopman_readout``: ``X = L^{-1}`` by substitution,
    ``F = eta C_v X^T A'^K``, ``y = F X z / m``), ``"solves"`` (``solvers.koopman_readout``:
    ``B_v`` by two solves, ``w_q`` by a solve, K matvecs, ``z_f = L w_f``), ``"either"`` (the
    larger of the two, for a kernel of unknown algorithm). ``return_steps``: also return the
    bounds of the steps, a dict of per-system tensors (``eps`` >= ||X (L^ L^T - G~) X^T||_F,
    ``phi`` >= ||X^ L - I||_F (inverse) or the solves' relative error, ``dw`` / ``dw2`` >=
    ||A^_w - A_w||_F / _2, every computed power estimate in ``[lo, hi]``, ``sigma`` the exact
    one, ``zeta`` >= |c^ / c - 1|, ``valid``; not for ``"either"``). The proof (Echo eq. (12)-(13),
    Appendix F steps 4-10; Higham Thms 10.3, 8.5, 10.8, Lemma 3.1) holds to all orders under the
    hypotheses H1-H3 of the module docstring; the per-system conditions it needs (``eps``,
    ``phi`` and the fixed points below 1/2) are checked, and a system that fails one gets
    ``inf``."""
    if algorithm not in ("inverse", "solves", "either"):
        raise ValueError(f"algorithm must be 'inverse', 'solves' or 'either', got {algorithm!r}")
    if algorithm == "either":
        if return_steps:
            raise ValueError("return_steps needs algorithm 'inverse' or 'solves'")
        kw = dict(scale=scale, K=K, eta=eta, gamma=gamma, contract=contract)
        kw.update(factor_contract=factor_contract, power_iters=power_iters)
        return torch.maximum(
            readout_bound(G, M, Cv, zq, algorithm="inverse", **kw),
            readout_bound(G, M, Cv, zq, algorithm="solves", **kw),
        )
    G, M, Cv, zq = (x.to(F64) for x in (G, M, Cv, zq))
    batch, r, dev = G.shape[:-2], G.shape[-1], G.device
    cp, cf = parse(contract), parse(factor_contract)
    u = max(cp.u_acc, cf.u_acc)  # elementwise operations (scalings, sums)
    # a division or square root: the GPU's (U_DIV, U_SQRT, module level), or one rounding of a
    # coarser accumulation where a contract has one (the references' modes, correctly rounded)
    u_div, u_sqrt = max(u, U_DIV), max(u, U_SQRT)
    # products and matvecs: a tf32 / tf32x3 / bf16 tl.dot runs on the tensor cores, whose float32
    # accumulation truncates (u_dot = 2^-23, as analysis.bounds.kla_kernel); "ieee" float32
    # products are CUDA-core FMAs, rounded to nearest
    u_prod = cp.u_acc if cp.operands in ("fp32", "fp64") else max(cp.u_acc, U_DOT)
    # tf32x3 forms each product from three tf32 passes (hi hi', hi lo', lo hi') into one float32
    # accumulator: 3n additions of terms whose magnitudes sum to at most (1 + 2^-11)^2 |a||b|,
    # within gamma_{4n} |a|^T |b| since gamma_{4n} >= (1 + 2^-11)^2 gamma_{3n}
    passes = 4 if cp.operands == "tf32x3" else 1
    th = _theta(passes * r, u_prod, cp.u_operand(2.0**-24), cp.u_store)
    uf_o, uf_s = cf.u_operand(2.0**-24), cf.u_store
    # factorisation and substitution: Lemma 8.4's terms with operands rounded and L, X stored.
    # Row j's recurrence puts its j - 1 sums' factors and its pivot's on the side of the
    # computed entry, inverted (hence _inv): the pivot's is one division (l_ij = s / l_jj,
    # x_j = s / l_jj) or a square root, squared (l_jj^2 = fl(sqrt(s))^2), so Higham's
    # gamma_{r+1} (Thm 10.3) and gamma_r (Thm 8.5) become, with the kernel's operations,
    # (1 + u)^{r-1} max((1 + u_sqrt)^2, (1 + u_div)(1 + u)) and (1 + u)^{r-1} (1 + u_div) (each
    # factor inverted), and (1 + u)^{r+1}, (1 + u)^r (inverted) where both are one rounding
    ua, ud, us = _inv(cf.u_acc), _inv(u_div), _inv(u_sqrt)
    pivot_chol = max((1 + us) ** 2, (1 + ud) * (1 + ua))
    th_chol = (1 + uf_o) ** 2 * (1 + ua) ** (r - 1) * pivot_chol * (1 + uf_s) ** 2 - 1
    th_sub = (1 + uf_o) ** 2 * (1 + ua) ** (r - 1) * (1 + ud) * (1 + uf_s) ** 2 - 1
    e1 = (1 + u) * (1 + cp.u_store) - 1  # one elementwise rounding (a scaling), stored
    e_div = (1 + u_div) * (1 + cp.u_store) - 1  # one division, stored
    L, info = torch.linalg.cholesky_ex(G)
    valid = info == 0
    eye = torch.eye(r, dtype=F64, device=dev)
    L = torch.where(valid[..., None, None], L, eye)
    X = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False)
    aX, aL = X.abs(), L.abs()
    nX = _n2(X)

    # step 1: L^ L^T = G + dG, |dG| <= th_chol |L^||L^T| (Higham Thm 10.3); in whitened
    # coordinates E = X dG X^T, ||E||_F <= eps. A priori (Cauchy-Schwarz, ||l^_i||^2 = g_ii +
    # dg_ii): |L^||L^T| <= d d^T / (1 - th_chol); then a posteriori, |L^| <= |L| (I + |Q - I|)
    # with L^ = L Q, ||Q - I||_F <= rho = eps / (1 - eps) (Sun's theorem, Higham Thm 10.8, for
    # Q Q^T = I + E), iterated: each pass keeps a valid bound (the map is increasing)
    tau = th_chol / (1 - th_chol)
    diag = torch.diagonal(G, dim1=-2, dim2=-1)
    d = diag.clamp(min=0).sqrt()
    eps = tau * torch.minimum(_vn(_mv(aX, d)) ** 2, diag.sum(-1) * nX**2)
    XL = aX @ aL
    c2, cF = _n2(XL), _nF(XL)
    m0 = _nF(XL @ XL.mT)  # || |X||L||L^T||X^T| ||_F
    for _ in range(3):
        # the refinement rests on ||Q - I|| <= eps / (1 - eps), valid only where eps < 1/2:
        # elsewhere eps stays the a-priori value (and the system is then not valid below)
        ok = eps < 0.5
        rho = eps.clamp(max=0.5) / (1 - eps.clamp(max=0.5))
        refined = th_chol * (m0 + (2 * rho + rho**2) * c2**2)
        eps = torch.where(ok, torch.minimum(eps, refined), eps)
    valid = valid & (eps < 0.5)
    eps = eps.clamp(max=0.5)
    rho = eps / (1 - eps)  # ||Q - I||_F
    q = (1 - eps) ** -0.5  # ||Q^{-1}||_2
    # step 2: substitution with L^ (Higham Thm 8.5): (L^ + dL) x = b, |dL| <= th_sub |L^|, so
    # x^ = L^{-1} b - L^{-1} r with |r| <= th_sub |L^||x^|; ||X |L^| v|| <= c2 (1 + rho) ||v||
    s = q * th_sub * c2 * (1 + rho)
    if algorithm == "inverse":  # Phi = X^ L - I, X^ = L^{-1} by substitution on I
        valid = valid & (s * c2 < 0.5)
        phi = (q * rho + s * cF) / (1 - s * c2).clamp(min=0.5)  # ||Phi||_F
    else:  # every solve, normwise: ||L^T x^ - b|| resp. ||x^ - X b|| <= phi ||X b||
        valid = valid & (s < 0.5)
        phi = (q * rho + s) / (1 - s).clamp(min=0.5)

    # step 3: the whitened operator, ||A^_w - A_w||_F <= dw
    A_w = X @ M @ X.mT
    a_w, a_wF, abs_aw = _n2(A_w), _nF(A_w), _n2(A_w.abs())
    g1 = q * rho  # ||Q^{-1} - I||_F
    if algorithm == "inverse":  # fl(fl(X^ M) X^T), X^ = (I + Phi) X
        XMX = aX @ M.abs() @ aX.mT
        dw = (2 * phi + phi**2) * a_w + th * (2 + th) * (1 + phi) ** 2 * _nF(XMX)
        # the same in the 2-norm (|| |B| ||_2 bounds ||B||_2), where a 2-norm suffices
        dw2 = (2 * phi + phi**2) * a_w + th * (2 + th) * (1 + phi) ** 2 * _n2(XMX)
    else:
        # Y^ = L^{-1} M - L^{-1} R1, Z^ = L^{-1} Y^T - L^{-1} R2, A^_w = Z^T:
        # A^_w = Q^{-1} A_w Q^{-T} - Q^{-1} X R1 X^T Q^{-T} - R2^T X^T Q^{-T}
        XM = X @ M
        t1 = (
            _nF(XL @ XM.abs() @ aX.mT)
            + c2 * rho * _nF(XM.abs() @ aX.mT)
            + c2 * (1 + rho) * phi * _nF(XM) * nX
        )  # >= || |X||L^||Y^||X^T| ||_F, Y^ within phi ||XM||_F of XM
        t2 = _nF(XL @ A_w.abs().mT) + c2 * rho * a_wF  # the part of || |X||L^||Z^| || at A_w
        k2 = th_sub * q * c2 * (1 + rho)
        valid = valid & (k2 < 0.5)
        dw = ((2 * g1 + g1**2) * a_w + q**2 * th_sub * t1 + q * th_sub * t2) / (1 - k2)
        dw2 = dw
    # steps 4-5: the power estimate (eq. (12)) and the factor gamma / max(1, sigma)
    sigma, lo, hi = _power_bracket(A_w, a_w, abs_aw, dw, dw2, th, u, u_div, u_sqrt, power_iters)
    Mx = sigma.clamp(min=1.0)
    c = _param(gamma, batch, dev) / Mx
    # c^ = gamma / max(sigma^, 1) (1 + d), |d| <= e_div: the kernel's division (div.full.f32)
    zeta = torch.maximum(
        (1 + e_div) * Mx / lo.clamp(min=1.0) - 1, 1 - (1 - e_div) * Mx / hi.clamp(min=1.0)
    )  # |c^ / c - 1|
    # hi <= 1: both factors are gamma / 1, exact where the division is correctly rounded, but
    # the GPU's division is only documented within 2 ulps, so its error is charged there too
    zeta = torch.where(hi <= 1.0, torch.full_like(zeta, e_div), zeta)
    # The computed factor c^ = c (1 + z), |z| <= zeta, scales y exactly: the readout with
    # A'' = c^ A_w is (1 + z)^K y. The chain below bounds the distance from that readout; its
    # exact norms are taken at c (1 + zeta) >= c^ (every one grows with the factor).
    cu = c * (1 + zeta)
    dA = cu * (dw + e1 * (a_wF + dw))  # ||A^ - c^ A_w||_F: A^_w's error, one rounding of c^ A^_w
    dA2 = cu * (dw2 + e1 * (abs_aw + dw))  # the same in the 2-norm (|E| <= e1 |A| entrywise)
    A = cu[..., None, None] * A_w
    a, absA = cu * a_w, cu * abs_aw

    # step 6 on: the queries and the readout
    m = _param(scale, batch, dev)
    w = (zq @ X.mT) / m[..., None, None]
    wn = _vn(w)
    zeta_q = _vn(zq.abs() @ aX.mT) / m[..., None]  # || |X| |z_q| || / m
    ez = (1 + u_div) * (1 + u) * (1 + cp.u_store) - 1  # z / m, or z * (1 / m) (the kernel's)
    W = Cv @ X.mT
    eta_ = _param(eta, batch, dev).abs()
    ph = phi[..., None]
    if algorithm == "inverse":
        e_w = ph * (wn + ez * zeta_q) + ez * zeta_q + th * (1 + ph) * (1 + ez) * zeta_q
        eF = phi * _n2(W) + th * (1 + phi) * _nF(Cv.abs() @ aX.mT)  # ||W^ - W||_F
        F = W
        for _ in range(K):  # F^_k = fl(F^_{k-1} A^)
            f = _nF(F.abs() @ A.abs()) + eF * (absA + dA) + _nF(F) * dA
            eF = eF * (a + dA2) + torch.minimum(_n2(F) * dA, _nF(F) * dA2) + th * f
            F = F @ A
        eF = eta_ * (eF + e1 * (_nF(F) + eF))  # times eta, one rounding
        F = eta_[..., None, None] * F
        wh = wn + e_w
        h = _vn(w.abs() @ F.abs().mT)  # || |eta F_K| |w_q| ||
        err = (
            eF[..., None] * wh
            + _n2(F)[..., None] * e_w
            + th * (h + eF[..., None] * wh + _nF(F)[..., None] * e_w)
        )
    else:
        # w^ = L^{-1} z^ - L^{-1} r, |r| <= th_sub |L^||w^|
        g0 = _vn(w.abs() @ XL.mT) + (c2 * rho)[..., None] * wn
        k1 = (q * th_sub * c2 * (1 + rho))[..., None]
        e = (g1[..., None] * (wn + ez * zeta_q) + ez * zeta_q + q[..., None] * th_sub * g0) / (
            1 - k1
        )  # ||w^_q - w_q||
        wk = w
        for _ in range(K):  # w^_k = fl(A^ w^_{k-1})
            nk = _vn(wk)
            f = _vn(wk.abs() @ A.abs().mT) + e * absA[..., None] + dA[..., None] * (nk + e)
            e = e * (a + dA2)[..., None] + dA2[..., None] * nk + th * f
            wk = wk @ A.mT
        nK, rh = _vn(wk), rho[..., None]
        # Y^ = L^{-1} C_v^T - L^{-1} R3, Z^ = L^{-T} Y^ - L^{-T} R4, B^_v = Z^T:
        # B^_v L = ((W - R3^T X^T) Q^{-T} - R4^T) Q^{-1}, W (I + E)^{-1} at R3 = R4 = 0
        nWF, B = _nF(W), W @ X
        t3 = (
            _nF(XL @ W.abs().mT) + c2 * rho * nWF + c2 * (1 + rho) * phi * nWF
        )  # >= || |X||L^||Y^| ||_F
        t4 = _nF(aL.mT @ B.abs().mT)  # || |L^T||B^T| ||_F
        k4 = q * th_sub * (1 + rho) * _n2(aL) * nX
        valid = valid & (k4 < 0.5)
        eV = (nWF * eps / (1 - eps) + q**2 * th_sub * t3 + q * th_sub * (1 + rho) * t4) / (
            1 - k4
        )  # ||B^_v L - W||_F
        nW = _n2(W)[..., None]
        # B^_v L^ w^_K - W w_K with B^_v L^ = (B^_v L) Q
        main = (eV[..., None] * (1 + rh) + nW * rh) * (nK + e) + nW * e
        Lw = wk @ L.mT
        # z^_f = fl(L^ w^_K) = L^ w^_K + e_f, |e_f| <= th |L^||w^_K|, |L^| <= |L|(I + |Q - I|)
        Xef = th * (_vn(wk.abs() @ XL.mT) + c2[..., None] * (e + rh * (nK + e)))
        Bef = (nW + eV[..., None]) * Xef  # ||B^_v e_f|| = ||(B^_v L) X e_f||
        d_zf = _n2(L)[..., None] * (rh * (nK + e) + e) + th * _n2(aL)[..., None] * (1 + rh) * (
            nK + e
        )  # ||z^_f - L w_K||
        prod = (
            _vn(Lw.abs() @ B.abs().mT)
            + _n2(B.abs())[..., None] * d_zf
            + eV[..., None] * nX[..., None] * (_vn(Lw) + d_zf)
        )  # || |B^_v| |z^_f| ||
        err = eta_[..., None] * ((1 + e1) * (main + Bef + th * prod) + e1 * _vn(wk @ W.mT))
    # the factor's own share, |(1 + z)^K - 1| ||y_q|| (y_q at c, not cu)
    y = _vn((w @ torch.linalg.matrix_power(c[..., None, None] * A_w, K).mT) @ W.mT)
    err = err + ((1 + zeta) ** K - 1)[..., None] * eta_[..., None] * y
    # the ingredients are float64 evaluations (relative error ~ r kappa 2^-53 << 1e-9)
    err = err * (1 + 1e-9)
    bound = torch.where(valid[..., None], err, torch.full_like(err, math.inf))
    if return_steps:
        steps = dict(eps=eps, phi=phi, dw=dw, dw2=dw2, lo=lo, hi=hi, sigma=sigma, zeta=zeta)
        return bound, steps | dict(valid=valid)
    return bound
