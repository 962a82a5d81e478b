"""How large each substantive or numerical erratum is at the paper's own sizes.

``python -m proofs_check.magnitudes [NAME ...]`` prints, per erratum, the relative error of the
printed formula against the corrected one on data of the paper's sizes (float64 unless the
erratum is about rounding): GKA D = 128 heads, r = 30 Chebyshev iterations, a = 0.02 (kappa <= 51),
chunks of 64; KLA chunks of 64, d_k = d_v = 128; SKA r = 48, P = 64, chunks S = 64. The
catalogue's ``magnitude`` fields (``proofs_check.errata``) quote these numbers. Data are seeded
random draws (unit-norm keys where the paper normalises them), so each number is one draw, not
a worst case; the comment of each function says what the number means.
"""

from __future__ import annotations

import math
import sys

import torch

from analysis.argtypes import OneLineParser

F64 = torch.float64
GKA_D, GKA_R, GKA_A, CHUNK = 128, 30, 0.02, 64
SKA_R, SKA_P, SKA_S = 48, 64, 64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm((a - b).to(F64)) / torch.linalg.vector_norm(b.to(F64)))


def _unit_keys(T: int, D: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, D, generator=g, dtype=F64)
    return k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)


def _gka_states(k: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """H_t = gamma_t H_{t-1} + k_t k_t^T (CH), every t."""
    T, D = k.shape
    H, out = torch.zeros(D, D, dtype=F64), []
    for t in range(T):
        H = gamma[t] * H + torch.outer(k[t], k[t])
        out.append(H)
    return torch.stack(out)


def gka_chunk_matvec() -> dict:
    """Sec. 4.2.1: H_{[t]+1} xi printed (H xi + gamma_1 k k^T xi) vs (CH), chunk state after 64 tokens."""
    from solvers.gka_chunk import first_step_matvec

    out = {}
    for gam in (0.9, 0.99):
        k = _unit_keys(CHUNK + 1, GKA_D, 0)
        H0 = _gka_states(k[:-1], torch.full((CHUNK,), gam, dtype=F64))[-1]
        xi = torch.randn(GKA_D, generator=torch.Generator().manual_seed(1), dtype=F64)
        p = first_step_matvec(H0, k[-1], gam, xi, form="printed")
        c = first_step_matvec(H0, k[-1], gam, xi, form="corrected")
        out[f"gamma={gam}"] = _rel(p, c)
    return out


def _gka_layer_grads(T: int, gam_lo: float, seed: int = 0):
    """x_t, dq_t, H_t, ||H_t||_F, w_t of the GKA layer with lambda_t = a ||H_t||_F (exact solves)."""
    g = torch.Generator().manual_seed(seed)
    k = _unit_keys(T, GKA_D, seed)
    q = _unit_keys(T, GKA_D, seed + 1)
    gamma = gam_lo + (1 - gam_lo) * torch.rand(T, generator=g, dtype=F64)
    H = _gka_states(k, gamma)
    fro = torch.linalg.matrix_norm(H)
    A = H + (GKA_A * fro)[:, None, None] * torch.eye(GKA_D, dtype=F64)
    x = torch.linalg.solve(A, q)
    dx = torch.randn(T, GKA_D, generator=g, dtype=F64)
    dq = torch.linalg.solve(A, dx)
    w = 2 * GKA_A * (x * dq).sum(-1) / fro
    return k, gamma, H, fro, x, dq, w


def _gka_gap(printed_and_corrected) -> dict:
    """Relative error printed vs corrected on the GKA layer's gradients (T = 256, D = 128), gates in [lo, 1]."""
    out = {}
    for lo in (0.9, 0.99):
        p, c = printed_and_corrected(*_gka_layer_grads(256, lo))
        out[f"gates in [{lo}, 1]"] = _rel(p, c)
    return out


def gka_eq15() -> dict:
    """App. D.2 eq. (15) (+ w_t H_t) vs Lemma 1 (7) (- w_t H_t): relative error of dk."""
    from solvers.gka_grad import lemma1_dk

    def forms(k, gamma, H, fro, x, dq, w):
        shifted = torch.cat([gamma[1:], gamma.new_ones(1)])  # M_{i,t} = gamma_{i+1} .. gamma_t
        return [lemma1_dk(k, dq, x, H, w, gamma=shifted, w_sign=s) for s in (+1.0, -1.0)]

    return _gka_gap(forms)


def gka_eq40() -> dict:
    """App. D.2.1 eq. (40): printed gate product prod_{i=l}^{t-1} vs M_{l,t}: relative error of dk."""
    from solvers.gka_grad import appendix40_dk

    def forms(k, gamma, H, fro, x, dq, w):
        return [
            appendix40_dk(k, dq, x, H, fro, a=GKA_A, g=torch.log(gamma), product=f)
            for f in ("printed", "corrected")
        ]

    return _gka_gap(forms)


def gka_cross_chunk() -> dict:
    """Sec. 4.2.2: cross-chunk coefficient zeta_C (printed) vs M_{i,C}: relative error of B_i k_i, chunks of 64."""
    from solvers.gka_chunk import chunkwise_Bk

    def forms(k, gamma, H, fro, x, dq, w):
        return [
            chunkwise_Bk(k, w, g=torch.log(gamma), chunk_size=CHUNK, cross=f)
            for f in ("printed", "corrected")
        ]

    return _gka_gap(forms)


def gka_algorithm2() -> dict:
    """Algorithm 2 as printed, each erratum alone, D = 128, kappa = 51, r = 30 (and r = 0), float64,
    against autograd through Algorithm 1 (float64): relative errors of dq and dH."""
    import solvers
    from analysis.references.chebyshev_backward import rel, spd_problem

    pb = spd_problem(GKA_D, 51.0, F64)
    ref_dq, ref_dH = solvers.chebyshev_backward(
        pb.H, pb.q, pb.g, L=pb.L, mu=pb.mu, iters=GKA_R, method="autograd"
    )
    out = {}
    for corr, name in (
        ((), "printed"),
        (("c0",), "eq. (50) alone (q sign)"),
        (("q_sign",), "eq. (53) alone (c_0)"),
    ):
        dq, dH = solvers.algorithm2_as_printed(
            pb.H, pb.q, pb.g, L=pb.L, mu=pb.mu, iters=GKA_R, corrections=corr
        )
        out[name] = f"dq {rel(dq, ref_dq):.2e}, dH {rel(dH, ref_dH):.2e}"
    # r = 0: (53) alone doubles dq exactly (relative error 1)
    ref0, _ = solvers.chebyshev_backward(
        pb.H, pb.q, pb.g, L=pb.L, mu=pb.mu, iters=0, method="autograd"
    )
    dq0, _ = solvers.algorithm2_as_printed(
        pb.H, pb.q, pb.g, L=pb.L, mu=pb.mu, iters=0, corrections=("q_sign",)
    )
    out["eq. (53) alone (c_0), r = 0"] = f"dq {rel(dq0, ref0):.2e}"
    return out


def gka_remark2() -> dict:
    """Remark 2: the corrected Algorithm 2 (reverse) in each precision at D = 128, kappa = 51, r = 30,
    against the mpmath gradient of the loop; autograd through the loop for comparison."""
    from analysis.precision import PRECISIONS
    from analysis.references.chebyshev_backward import measure

    out = {}
    for ar in PRECISIONS:
        if ar.label == "float64":
            continue
        for c in measure(ar, 51.0, GKA_R, D=GKA_D):
            if c.method in ("reverse", "autograd"):
                out[f"{ar.label} {c.method}"] = f"dq {c.dq_error:.1e}, dH {c.dH_error:.1e}"
    return out


def kla_prop5() -> dict:
    """Prop. 5 (19) as printed (gamma_{i->i} k_i, App. B's gamma_{j->i}) vs the product P_C, C = 64, d_k = 128,
    unit keys, eta = 1, eps = 0 (beta = 1/||k||^2 = 1), decays alpha in [lo, 1]."""
    out = {}
    C, d = CHUNK, 128
    for lo in (0.9, 0.99):
        g = torch.Generator().manual_seed(0)
        k = _unit_keys(C, d, 0)
        alpha = lo + (1 - lo) * torch.rand(C, generator=g, dtype=F64)
        beta = torch.full((C,), 0.5, dtype=F64)  # eta = 1/2: with beta = 1 P is singular
        gam = torch.cumprod(alpha, 0)
        P_true = torch.eye(d, dtype=F64)
        W = []
        for i in range(C):
            P_true = (
                alpha[i] * (torch.eye(d, dtype=F64) - beta[i] * torch.outer(k[i], k[i])) @ P_true
            )
            # printed (19): lead term gamma_{i->i} k_i = alpha_i k_i, gamma_{r->i} = gamma_i / gamma_{r-1}
            gri = [gam[i] / (gam[r - 1] if r > 0 else 1.0) for r in range(i + 1)]
            s = sum((W[r] * (k[r] @ k[i]) * gri[r] for r in range(i)), torch.zeros(d, dtype=F64))
            W.append(beta[i] * (alpha[i] * k[i] - s))
        gri = [gam[-1] / (gam[r - 1] if r > 0 else 1.0) for r in range(C)]
        P_printed = gam[-1] * torch.eye(d, dtype=F64) - sum(
            gri[r] * torch.outer(k[r], W[r]) for r in range(C)
        )
        out[f"alpha in [{lo}, 1]"] = _rel(P_printed, P_true)
    return out


def kla_table6() -> dict:
    """Table 6 (recurrent form without beta_j) vs the recurrence, T = 64, d = 128: keys N(0, 1/d)
    (not normalised: KLA's beta = eta/(||k||^2 + eps) exists to handle their norms), eta in (0, 1)."""
    T, d = CHUNK, 128
    g = torch.Generator().manual_seed(0)
    k = torch.randn(T, d, generator=g, dtype=F64) / math.sqrt(d)
    v = torch.randn(T, d, generator=g, dtype=F64)
    q = torch.randn(d, generator=g, dtype=F64)
    eta = torch.sigmoid(torch.randn(T, generator=g, dtype=F64))
    alpha = 0.9 + 0.1 * torch.rand(T, generator=g, dtype=F64)
    beta = eta / ((k * k).sum(-1) + 1e-6)
    S = torch.zeros(d, d, dtype=F64)
    F = [alpha[s] * (torch.eye(d, dtype=F64) - beta[s] * torch.outer(k[s], k[s])) for s in range(T)]
    for s in range(T):
        S = F[s] @ S + beta[s] * torch.outer(k[s], v[s])
    o_true = S.T @ q
    o_printed = torch.zeros(d, dtype=F64)
    prod = torch.eye(d, dtype=F64)
    for j in reversed(range(T)):  # prod = F_T ... F_{j+1}
        o_printed += (q @ (prod @ k[j])) * v[j]
        prod = prod @ F[j]
    return {"o_T relative error": _rel(o_printed, o_true)}


def echo_footnote1() -> dict:
    """Footnote 1: rescaling C_v by (m_old/m_new)^2 instead of m_old/m_new at every new running max,
    T = 2048 Gaussian keys r = 48, values P = 64: relative error of the streamed C_v at the end."""
    T = 2048
    g = torch.Generator().manual_seed(0)
    z = torch.randn(T, SKA_R, generator=g, dtype=F64)
    v = torch.randn(T, SKA_P, generator=g, dtype=F64)
    norms = torch.linalg.vector_norm(z, dim=-1)
    m, Cv_printed = float(norms[0]), torch.zeros(SKA_P, SKA_R, dtype=F64)
    events = 0
    for t in range(T):
        if norms[t] > m:
            rho = m / float(norms[t])
            Cv_printed = rho**2 * Cv_printed
            m, events = float(norms[t]), events + 1
        Cv_printed += torch.outer(v[t], z[t] / m)
    Cv_true = v.T @ (z / m)
    return {
        "C_v relative error": _rel(Cv_printed, Cv_true),
        "running-max updates": events,
        "m_final / m_first": m / float(norms[0]),
    }


def echo_layer_estimator() -> dict:
    """Eqs. (4)/(53) vs Prop. A.1: M G~^{-1} with z_T in G vs without, r = 48, AR(1) keys, eps = 1e-3."""
    out = {}
    for T in (64, 256, 1024):
        g = torch.Generator().manual_seed(0)
        e = torch.randn(T, SKA_R, generator=g, dtype=F64)
        z = e.clone()
        for t in range(1, T):
            z[t] = 0.8 * z[t - 1] + e[t]
        z = z / torch.linalg.vector_norm(z, dim=-1).max()
        M = z[1:].T @ z[:-1]
        eye = 1e-3 * torch.eye(SKA_R, dtype=F64)
        A_layer = M @ torch.linalg.inv(z.T @ z + eye)
        A_ls = M @ torch.linalg.inv(z[:-1].T @ z[:-1] + eye)
        out[f"T={T}"] = _rel(A_layer, A_ls)
    return out


def _ar1_keys(T: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(T, SKA_R, generator=g, dtype=F64)
    z = e.clone()
    for t in range(1, T):
        z[t] = 0.8 * z[t - 1] + e[t]
    return z


def echo_chunk_causal() -> dict:
    """Chunk-causal mode (eqs. (3), (7)-(10)), T = 1024, S = 64, r = 48, P = 64, AR(1) keys: relative change of
    chunk 1's and chunk 15's outputs when only the last key is multiplied by 10 (or 2)."""
    from solvers.koopman import chunk_causal_statistics, koopman_readout

    T = 1024
    z = _ar1_keys(T)
    g = torch.Generator().manual_seed(1)
    v = torch.randn(T, SKA_P, generator=g, dtype=F64)
    zq = torch.randn(4, SKA_R, generator=g, dtype=F64)
    C = T // SKA_S
    queries = zq.expand(C, 4, SKA_R)
    base = koopman_readout(chunk_causal_statistics(z, v, chunk_size=SKA_S), queries)
    out = {}
    for factor in (10.0, 2.0):
        late = z.clone()
        late[-1] = factor * late[-1]
        moved = koopman_readout(chunk_causal_statistics(late, v, chunk_size=SKA_S), queries)
        for c in (1, C - 1):
            out[f"last key x{factor:g}, chunk {c}"] = _rel(moved[c], base[c])
    return out


def echo_eq11() -> dict:
    """Eq. (11)'s A = M G~^{-1} used in eqs. (12)-(13) (normalised, applied to the whitened query) vs the whitened
    A_w = L^{-1} M L^{-T} of eq. (22) / App. F, r = 48, T = 1024 AR(1) keys, K = 2, exact sigma: readout difference."""
    T, K, eps = 1024, 2, 1e-3
    z = _ar1_keys(T)
    z = z / torch.linalg.vector_norm(z, dim=-1).max()
    g = torch.Generator().manual_seed(1)
    v = torch.randn(T, SKA_P, generator=g, dtype=F64)
    zq = torch.randn(SKA_R, 16, generator=g, dtype=F64)
    G = z.T @ z + eps * torch.eye(SKA_R, dtype=F64)
    M, Cv = z[1:].T @ z[:-1], v.T @ z
    L = torch.linalg.cholesky(G)
    Linv = torch.linalg.inv(L)
    ops = {"eq. (11)": M @ torch.linalg.inv(G), "eq. (22)": Linv @ M @ Linv.T}
    ys, norms = {}, {}
    for name, A in ops.items():
        s = float(torch.linalg.matrix_norm(A, ord=2))
        An = A / max(1.0, s)
        ys[name] = Cv @ torch.linalg.inv(G) @ L @ torch.linalg.matrix_power(An, K) @ Linv @ zq
        norms[name] = s
    out = {
        "||A|| eq. (11)": norms["eq. (11)"],
        "||A_w|| eq. (22)": norms["eq. (22)"],
        "readout relative difference": _rel(ys["eq. (11)"], ys["eq. (22)"]),
    }
    out.update(_random_operator_norms())
    return out


def _random_operator_norms(n: int = 2000) -> dict:
    """Remark 4's 'sigma_max >> 1' against both operators: over n random SKA statistics (eqs. (3)-(6): T in [2, 64],
    r in [2, 16], AR(1) keys with a random coefficient in [-0.99, 0.99], divided by the sequence max, eps = 1e-3),
    the largest ||L^{-1} M L^{-T}|| (<= 1 - eps/lambda_max(G~) < 1) and the largest ||M G~^{-1}||."""
    g = torch.Generator().manual_seed(0)
    worst_w, worst_11 = 0.0, 0.0
    for _ in range(n):
        T = int(torch.randint(2, 65, (1,), generator=g))
        r = int(torch.randint(2, 17, (1,), generator=g))
        c = float(torch.rand(1, generator=g, dtype=F64)) * 1.98 - 0.99
        e = torch.randn(T, r, generator=g, dtype=F64)
        z = e.clone()
        for t in range(1, T):
            z[t] = c * z[t - 1] + e[t]
        z = z / torch.linalg.vector_norm(z, dim=-1).max()
        G = z.T @ z + 1e-3 * torch.eye(r, dtype=F64)
        M = z[1:].T @ z[:-1]
        Linv = torch.linalg.inv(torch.linalg.cholesky(G))
        worst_w = max(worst_w, float(torch.linalg.matrix_norm(Linv @ M @ Linv.T, ord=2)))
        worst_11 = max(worst_11, float(torch.linalg.matrix_norm(M @ torch.linalg.inv(G), ord=2)))
    return {
        f"max ||A_w|| = ||L^-1 M L^-T|| over {n} random statistics": f"{worst_w:.4f}",
        f"max ||M G~^-1|| over {n} random statistics": f"{worst_11:.3g}",
    }


def echo_complexity() -> dict:
    """Sec. 3.6 / Table 1: the cost of eqs. (7)-(10), T r^2 + ceil(T/S) r^3, when T doubles, and the printed O(T r^2/S
    + r^3)'s T-term against the statistics cost T r^2 alone (r = 48, S = 64)."""
    out = {}
    for T in (2048, 65536):
        actual = T * SKA_R**2 + math.ceil(T / SKA_S) * SKA_R**3
        doubled = 2 * T * SKA_R**2 + math.ceil(2 * T / SKA_S) * SKA_R**3
        out[f"T={T}"] = f"cost(2T) / cost(T) = {doubled / actual:.3g}"
    out["statistics cost T r^2 / printed T-term T r^2/S"] = f"{SKA_S} (= S)"
    return out


def gates_scale() -> dict:
    """Gradient scale |phi'|/phi^2 of phi = 1 - 1/(z^2 + 1) (a = b = 1) at the proposal's alpha = 0.99 and 0.5."""
    out = {}
    for alpha in (0.5, 0.9, 0.99):
        z = math.sqrt(1 / (1 - alpha) - 1)
        phi, dphi = alpha, 2 * z / (z * z + 1) ** 2
        out[f"alpha={alpha} (z={z:.3g})"] = (
            f"|phi'|/phi^2 = {dphi / phi**2:.3g}, printed 2|z| = {2 * z:.3g}"
        )
    return out


def gka_eq24() -> dict:
    """App. D.2 eq. (24) as printed vs the parts of dG due to the -(1/2) w_t H_t term of dH_t, computed by
    eqs. (22)-(23) (solvers.gka_grad.chunk_dG) for one chunk of 64 tokens, D = 128, after 64 tokens of state,
    gates in [0.9, 1], B_{C+1} from the next chunk: relative error of the parts (printed and corrected)."""
    from solvers.gka_grad import chunk_dG, eq24_corrected, eq24_printed

    C = CHUNK
    k, gamma, H, fro, x, dq, w = _gka_layer_grads(2 * C + 1, 0.9)
    H0, K = H[C - 1], k[C:]  # state before the chunk; keys k_1..k_{C+1}
    G = torch.cumsum(torch.log(gamma[C:]), 0)  # G_1..G_{C+1}
    Hc = H[C : 2 * C]  # H_1..H_C
    B_next = (w[2 * C][None, None] * H[2 * C]).to(F64)  # B_{C+1} = w_{C+1} H_{C+1} (last token)
    truth = chunk_dG(H0, K, G, -0.5 * w[C : 2 * C, None, None] * Hc, -0.5 * B_next)
    t = torch.cat([truth[0], truth[1].reshape(1)])
    out = {}
    for name, fn in (("printed", eq24_printed), ("corrected", eq24_corrected)):
        first, second = fn(H0, K[:C], G, w[C : 2 * C], B_next)
        out[f"{name}: relative error of the w_t H_t parts of dG_1..dG_C+1"] = _rel(
            torch.cat([first, second.reshape(1)]), t
        )
    return out


def echo_rotation() -> dict:
    """Sec. 3.3's R (eq. (14)) at d_k = 2048 (1024 blocks rho_i times a rotation), every modulus 1 but one at
    0.5: its singular values (printed: all 1) and the gradient kept through that mode."""
    n = 1024
    g = torch.Generator().manual_seed(0)
    theta = 2 * math.pi * torch.rand(n, generator=g, dtype=F64)
    rho = torch.ones(n, dtype=F64)
    rho[0] = 0.5
    blocks = [
        r * torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=F64)
        for r, a in zip(rho.tolist(), theta.tolist())
    ]
    R = torch.block_diag(*blocks)
    sv = torch.linalg.svdvals(R)
    grad = torch.zeros(2 * n, dtype=F64)
    grad[:2] = 1.0  # a gradient in the mode with |lambda| = 0.5
    return {
        "sigma_max(R)": float(sv.max()),
        "sigma_min(R) (printed 1)": float(sv.min()),
        "||R^T g|| / ||g|| in that mode": float(torch.linalg.vector_norm(R.T @ grad) / grad.norm()),
    }


def echo_state_size() -> dict:
    """Secs. 3.5, 6.2: the SKA state 2r^2 + Pr + r + 1 floats per head in FP32 (r = 56, P = 64), against the
    printed ~77 KB (read as KiB)."""
    r, P = 56, 64
    per_head = 2 * r * r + P * r + r + 1
    out = {"floats per head": f"{per_head}"}
    for model, heads, layers in (("50M", 7, 4), ("180M", 12, 2)):
        nbytes = per_head * 4 * heads * layers
        out[f"{model} ({heads} heads x {layers} layers)"] = (
            f"{nbytes:,} B = {nbytes / 1024:.0f} KiB = {nbytes / 2**20:.2f} MiB, "
            f"{nbytes / (77 * 1024):.1f}x the printed 77 KB"
        )
    return out


def echo_f6_power() -> dict:
    """App. F step 6 / eq. (12) with 6 power steps: ||A^|| for SKA's own whitened A_w (r = 48, T = 1024 AR(1)
    keys, eps = 1e-3: never rescaled, the setting) and for diag(2, 1.9) from (1, 1)/sqrt 2 (outside it)."""
    from solvers.koopman import spectral_normalize

    T, eps = 1024, 1e-3
    z = _ar1_keys(T)
    z = z / torch.linalg.vector_norm(z, dim=-1).max()
    G = z.T @ z + eps * torch.eye(SKA_R, dtype=F64)
    Linv = torch.linalg.inv(torch.linalg.cholesky(G))
    Aw = Linv @ (z[1:].T @ z[:-1]) @ Linv.T
    general = torch.diag(torch.tensor([2.0, 1.9], dtype=F64))
    v0 = torch.tensor([1.0, 1.0], dtype=F64) / math.sqrt(2)
    return {
        "SKA's A_w: ||A_w||": float(torch.linalg.matrix_norm(Aw, ord=2)),
        "SKA's A_w: ||A^_w|| (6 power steps)": float(
            torch.linalg.matrix_norm(spectral_normalize(Aw), ord=2)
        ),
        "diag(2, 1.9): ||A^|| (6 power steps, printed <= 1)": float(
            torch.linalg.matrix_norm(spectral_normalize(general, v0=v0), ord=2)
        ),
    }


def echo_flops() -> dict:
    """Sec. 3.6: Koopman MLP / SwiGLU FLOPs per token at d = 768 (d_k = d_ff = 2048), printed 'identical' (1)."""
    d = 768
    dk = -(-d * 8 // (3 * 64)) * 64
    swiglu = 2 * 3 * d * dk
    koopman = 2 * 2 * d * dk + 6 * (dk // 2)
    return {
        "FLOPs per token": f"Koopman MLP {koopman:,}, SwiGLU {swiglu:,}",
        "ratio (printed 1)": koopman / swiglu,
    }


def echo_remark3() -> dict:
    """Remark 3 at K = 4: the |lambda| above which a mode keeps more than 50% (amplitude |lambda|^4), printed 0.85."""
    return {
        "50% amplitude threshold 0.5^(1/4) (printed 0.85)": 0.5**0.25,
        "50% energy threshold 0.5^(1/8)": 0.5**0.125,
    }


def echo_hellaswag() -> dict:
    """Sec. 5.3's HellaSwag score against Table 4's."""
    return {"Echo-180M HellaSwag": "text 44.0, Table 4 44.3 (0.3 points)"}


def kla_alg1_panels() -> dict:
    """Algorithm 1, right panel line 7 (o_t = S_t^T q_t) vs left line 6 (S_t^T q_t/||q_t||), chunks of 64,
    T = 64, d_k = d_v = 128: unit queries (Sec. 3.3's setting) and N(0, 1) queries (outside it)."""
    from solvers.kla import kla_chunkwise

    T, d = CHUNK, 128
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, T, 1, d, generator=g, dtype=F64) / math.sqrt(d)
    v = torch.randn(1, T, 1, d, generator=g, dtype=F64)
    alpha = 0.9 + 0.1 * torch.rand(1, T, 1, generator=g, dtype=F64)
    eta = torch.sigmoid(torch.randn(1, T, 1, generator=g, dtype=F64))
    q = torch.randn(1, T, 1, d, generator=g, dtype=F64)
    out = {}
    for name, qq in (("unit queries", q / q.norm(dim=-1, keepdim=True)), ("N(0, 1) queries", q)):
        line6, _ = kla_chunkwise(qq, k, v, alpha=alpha, eta=eta, chunk_size=CHUNK)
        line7, _ = kla_chunkwise(
            qq, k, v, alpha=alpha, eta=eta, chunk_size=CHUNK, normalize_queries=False
        )
        out[f"{name}: line 7 vs line 6 relative error"] = _rel(line7, line6)
    return out


def gka_remark1_r30() -> dict:
    """Remark 1 at kappa = 51: R^30 (printed 6e-5), R = (kappa-1)/(kappa+1) (sqrt kappa-1)/(sqrt kappa+1), in mpmath."""
    import mpmath

    with mpmath.workdps(50):
        k = mpmath.mpf(51)
        R = (k - 1) / (k + 1) * (mpmath.sqrt(k) - 1) / (mpmath.sqrt(k) + 1)
        r30 = float(R**30)
    return {"R^30 (printed 6e-5)": r30, "printed / exact": 6e-5 / r30}


def gka_bf16_eps() -> dict:
    """Sec. 3.2: bfloat16's machine epsilon (printed ~0.007) and eps kappa at kappa = 500 (printed 3.5)."""
    eps = 2.0**-7
    return {
        "bf16 epsilon 2^-7 (printed 0.007)": eps,
        "eps kappa at kappa = 500 (printed 3.5)": 500 * eps,
    }


def gates_softplus() -> dict:
    """Baseline 3: 1 - exp(-softplus(z)) against sigma(z), exactly (mpmath, 50 digits, z in [-40, 40]) and as
    printed in float64 (solvers.gates.SoftplusGate.printed_value): where the subtraction leaves no correct digit."""
    import mpmath

    from solvers.gates import GATES

    with mpmath.workdps(50):
        gap = max(
            abs(1 - mpmath.exp(-mpmath.log1p(mpmath.exp(z))) - 1 / (1 + mpmath.exp(-z)))
            for z in (mpmath.mpf(i) / 4 for i in range(-160, 161))
        )
    z = torch.linspace(-45.0, 0.0, 4501, dtype=F64)
    printed = GATES["softplus"].printed_value(z)
    sigma = GATES["sigmoid"].value(z)
    rel = ((printed - sigma).abs() / sigma).nan_to_num(nan=math.inf)
    lost = z[rel >= 1.0]
    return {
        "max |1 - exp(-softplus(z)) - sigma(z)|, exact": float(gap),
        "float64 as printed: relative error at z = -30": float(rel[z == -30.0][0]),
        "float64 as printed: no correct digit from z": float(lost.max()),
    }


def gates_sigmoid_ratio() -> dict:
    """'Effect on optimization': sigma'(0) / sigma'(z) at alpha = 0.99 (z = logit 0.99) and at z = 4.6 (printed 100x)."""

    def dsig(z: float) -> float:
        s = 1 / (1 + math.exp(-z))
        return s * (1 - s)

    return {
        "sigma'(0) / sigma'(logit 0.99) (printed 100)": f"{dsig(0.0) / dsig(math.log(99.0)):.2f}",
        "sigma'(0) / sigma'(4.6)": f"{dsig(0.0) / dsig(4.6):.2f}",
    }


def gates_log_domain() -> dict:
    """Log-space decay of the balanced gate at a = b = 1: log phi(0) (solvers.gates.BalancedGate), the cumulative
    G_c = sum log phi over gates z = (1, 0, 2) as the proposal sums it, and log(1 - 1/(z^2 + 1)) evaluated as printed
    in float32 and bfloat16 (every operation rounded): the largest |z| where it is -inf, and the share of N(0, 1)
    pre-activations inside that band."""
    from solvers.gates import BalancedGate

    gate = BalancedGate()
    logs = gate.log_value(torch.tensor([1.0, 0.0, 2.0], dtype=F64))
    G = torch.cumsum(logs, 0)
    out = {
        "log phi(0)": float(logs[1]),
        "G_1, G_2, G_3": ", ".join(f"{float(x):.3g}" for x in G),
        "G_3 - G_2": float(G[2] - G[1]),
    }
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        z = torch.logspace(-8, 0, 200001, dtype=F64)
        zz = z.to(dtype)
        printed = torch.log(1 - 1 / (zz * zz + 1))
        band = float(zz[printed == -math.inf].to(F64).max())
        share = math.erf(band / math.sqrt(2))
        out[f"{name}: log phi as printed is -inf for |z| <="] = (
            f"{band:.3g} ({share:.2g} of N(0, 1) pre-activations)"
        )
    return out


def gates_stablessm_range() -> dict:
    """Background: the lower end 1 - 1/b of f*(w) = 1 - 1/(a w^2 + b)'s range (at w = 0), printed inside (-1, 1)."""
    return {f"b = {b:g}": f"f*(0) = {1 - 1 / b:g}" for b in (1.0, 0.75, 0.5, 0.25)}


MAGNITUDES = {
    f.__name__: f
    for f in (
        gka_chunk_matvec,
        gka_eq15,
        gka_eq40,
        gka_cross_chunk,
        gka_algorithm2,
        gka_remark2,
        kla_prop5,
        kla_table6,
        echo_footnote1,
        echo_layer_estimator,
        echo_chunk_causal,
        echo_eq11,
        echo_complexity,
        gates_scale,
        gka_eq24,
        echo_rotation,
        echo_state_size,
        gates_softplus,
        gates_sigmoid_ratio,
        gates_log_domain,
        kla_alg1_panels,
        echo_f6_power,
        gates_stablessm_range,
        echo_flops,
        gka_remark1_r30,
        gka_bf16_eps,
        echo_remark3,
        echo_hellaswag,
    )
}


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m proofs_check.magnitudes", description=__doc__.splitlines()[0])
    p.add_argument(
        "names", nargs="*", metavar="NAME", help=f"some of {sorted(MAGNITUDES)} (default: all)"
    )
    args = p.parse_args(argv)
    bad = [n for n in args.names if n not in MAGNITUDES]
    if bad:
        p.exit(
            2,
            f"{p.prog}: error: unknown magnitude(s) {bad}; expected some of {sorted(MAGNITUDES)}\n",
        )
    for name in args.names or MAGNITUDES:
        for key, value in MAGNITUDES[name]().items():
            print(
                f"{name}: {key}: {value:.3g}"
                if isinstance(value, float)
                else f"{name}: {key}: {value}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    from proofs_check.pipe import run_quietly

    sys.exit(run_quietly(main, sys.argv[1:]))
