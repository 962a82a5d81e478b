"""GKA (Gated KalmaNet), forward pass and solver: eq. (4), eq. (5), Algorithm 1, Lemmas 3-4,
Remark 1, and the regression facts of Secs. 2-4 (GKA main text; appendix D.1).

Exact checks evaluate the paper's formulas in mpmath (``*_mp`` entries of the implementation
mapping, written here from the equations); working-precision checks run the references of
``solvers`` and hold them to the precision model's allowance.
"""

from __future__ import annotations

import math

import mpmath
import torch
from hypothesis import strategies as st

from analysis.testing.strategies.bf16 import bf16_floats, bf16_matrices, bf16_vectors
from analysis.testing.strategies.ridge import (
    GKASequence,
    GKASystem,
    eigenvalue_bounds,
    gka_sequences,
    gka_systems,
)

from .. import mpla
from ..claim import ALL_PRECISIONS, MP, Measurement
from ..declare import Twin, for_paper, not_checkable
from ._common import (
    F64,
    allowance,
    arith,
    attr,
    exact_identity,
    exact_inequality,
    formed,
    mpf,
    worst,
)

# ----------------------------------------------------------------------------- mp formulas


def mp_states(seq: GKASequence, with_H0: bool = True) -> list:
    """``[H_0, H_1, ..., H_T]`` by the recurrence H_t = gamma_t H_{t-1} + k_t k_t^T (eq. (CH))."""
    D = seq.D
    H = mpla.zeros(D, D)
    if with_H0:
        for k in seq.H0_keys:
            kv = mpla.vec(k)
            H += mpla.outer(kv, kv)
    out = [H]
    for k, g in zip(seq.keys, seq.log_gates):
        kv = mpla.vec(k)
        H = mpmath.exp(mpf(g)) * H + mpla.outer(kv, kv)
        out.append(H)
    return out


def mp_ridge(H, a):
    """GKA eq. (4): lambda = a ||H||_F, A = H + lambda I, L = ||H||_F + lambda, mu = lambda."""
    fro = mpla.fro(H)
    lam = mpf(a) * fro
    return H + lam * mpla.eye(H.rows), lam, fro + lam, lam


def mp_weights(L, mu, r: int, rho2=None) -> list:
    """omega_0 = 2, omega_i = 4 / (4 - rho^2 omega_{i-1}) (Algorithm 1, weight schedule), in mpmath.

    Independent of ``solvers.omega_schedule`` on purpose: the claims hold the implementation
    (``impl["chebyshev_weights"]``) to this transcription of the paper."""
    if rho2 is None:
        rho2 = ((L - mu) / (L + mu)) ** 2
    w = [mpf(2)]
    for _ in range(r):
        w.append(4 / (4 - rho2 * w[-1]))
    return w


def mp_omega_star(rho2):
    """Lemma 3: omega_1* = 2 (1 - sqrt(1 - rho^2)) / rho^2 (1 at rho = 0)."""
    return 2 * (1 - mpmath.sqrt(1 - rho2)) / rho2 if rho2 != 0 else mpf(1)


def mp_lemma4_rate(kappa):
    """Lemma 4: R = (kappa - 1)/(kappa + 1) * (sqrt(kappa) - 1)/(sqrt(kappa) + 1)."""
    s = mpmath.sqrt(kappa)
    return (kappa - 1) / (kappa + 1) * (s - 1) / (s + 1)


def mp_chebyshev(A, q, L, mu, r: int, step=None, rho2=None) -> list:
    """GKA Algorithm 1 in mpmath: iterates xi_0..xi_r (constants exact unless given)."""
    if step is None:
        step = 2 / (L + mu)
    w = mp_weights(L, mu, r, rho2)
    prev, xi = mpla.zeros(q.rows), step * q
    out = [xi]
    for i in range(1, r + 1):
        new = xi - w[i] * step * (A * xi - q)  # (grad descent)
        new = new + (w[i] - 1) * (xi - prev)  # (momentum)
        prev, xi = xi, new
        out.append(xi)
    return out


def mp_chebyshev_closed_form(A, q, L, mu, r: int):
    """xi_r = p_r(A) q with residual polynomial 1 - lam p_r(lam) = T_{r+1}((L+mu-2lam)/(L-mu)) / T_{r+1}(1/rho)."""
    ev, Q = mpla.eigh(A)
    rho = (L - mu) / (L + mu)
    out = mpla.zeros(q.rows)
    for j, lam in enumerate(ev):
        u = Q[:, j]
        if rho == 0:
            p = (1 - 0) / lam if r >= 0 and L == lam else (1 - (1 - 2 * lam / (L + mu))) / lam
        else:
            res = mpmath.chebyt(r + 1, (L + mu - 2 * lam) / (L - mu)) / mpmath.chebyt(
                r + 1, 1 / rho
            )
            p = (1 - res) / lam
        out += p * mpla.dot(u, q) * u
    return out


def mp_frobenius_terms(H0, K, zeta) -> list:
    """GKA eq. (5) as printed: ||H_c||_F^2 = zeta_c^2 ||H_0||^2 + 2 zeta_c sum_j M_{j,c} k_j^T H_0 k_j
    + column-sum(((G_C . G_C) M) . M)_c with K_C = [k_1..k_C] (D x C), G_C = K_C^T K_C."""
    C = len(zeta)
    KC = mpla.mat(K).T if not isinstance(K, mpmath.matrix) else K.T
    G = KC.T * KC
    M = mpmath.matrix(C, C)
    for j in range(C):
        for c in range(j, C):
            M[j, c] = zeta[c] / zeta[j]
    third = mpla.hadamard(mpla.hadamard(G, G) * M, M)
    out = []
    for c in range(C):
        t1 = zeta[c] ** 2 * mpla.fro(H0) ** 2
        t2 = 2 * zeta[c] * mpmath.fsum(M[j, c] * (KC[:, j].T * H0 * KC[:, j])[0] for j in range(C))
        t3 = mpmath.fsum(third[i, c] for i in range(C))
        out.append(t1 + t2 + t3)
    return out


def _impl():
    import solvers
    from analysis.bounds import iterative as bounds

    return {
        "ridge_mp": mp_ridge,
        "weights_mp": mp_weights,
        "omega_star_mp": mp_omega_star,
        "lemma4_rate_mp": mp_lemma4_rate,
        "chebyshev_mp": mp_chebyshev,
        "frobenius_terms_mp": mp_frobenius_terms,
        "kf_update_mp": mp_kf_update,
        "attention_mp": mp_attention,
        "gka_ridge": solvers.gka_ridge,
        "chebyshev": solvers.chebyshev,
        "chebyshev_weights": solvers.chebyshev_weights,
        "omega_star": bounds.omega_star,
    }


def _impl_chunk():
    impl = dict(_impl())
    impl["chunkwise_frobenius"] = attr("solvers.gka_chunk", "chunkwise_frobenius")
    return impl


claim, erratum = for_paper("gka", implementation=_impl)


# ----------------------------------------------------------------------------- eq. (4)


@claim(
    "gka.eq4",
    source="GKA Sec. 4.1, eq. (4)",
    strategy=lambda: gka_systems(max_dim=4, max_keys=4),
    precisions=(MP, "float64", "float32", "bfloat16/storage"),
)
def _check_eq4(case: GKASystem, impl, prec) -> Measurement:
    """With lambda = a ||H||_F, every eigenvalue of H + lambda I lies in [mu, L] = [lambda, ||H||_F + lambda], so kappa
    <= (a+1)/a; attained by rank-one H.

    Measured: mp: kappa(H + lambda I) against (a+1)/a, lambda_max against L, mu against lambda_min. Working precisions:
    solvers.gka_ridge's stored A has its spectrum in [mu, L] up to u_store ||A||_F (Weyl).
    """
    a = case.a
    if prec == MP:
        with mpla.exact():
            A, lam, L, mu = impl["ridge_mp"](mpla.mat(case.keys).T * mpla.mat(case.keys), a)
            ev = mpla.eigvalsh(A)
            kappa_bound = (mpf(a) + 1) / mpf(a)
            return worst(
                [
                    exact_inequality(ev[-1] / ev[0], kappa_bound, "kappa_t vs (a+1)/a"),
                    exact_inequality(ev[-1], L, "lambda_max vs L"),
                    exact_inequality(mu, ev[0], "mu vs lambda_min"),
                ]
            )
    ar = arith(prec)
    rs = impl["gka_ridge"](case.H(ar.dtype), a)
    A = rs.A.to(F64)
    ev = torch.linalg.eigvalsh(A)
    fro = float(torch.linalg.matrix_norm(A))
    out_of = max(float(ev[-1] - rs.L), float(rs.mu - ev[0])) / fro
    # Weyl: rounding A's entries (|dA_ij| <= u |A_ij|) moves eigenvalues by <= ||dA||_F <= u ||A||_F;
    # float64 eigvalsh adds ~ D 2^-53 ||A||.
    return Measurement(
        out_of, ar.u_store + 8 * case.D * 2.0**-53, "spectrum of stored A outside [mu, L]"
    )


# ----------------------------------------------------------------------------- eq. (5)


@claim(
    "gka.eq5",
    source="GKA Sec. 4.2.1, eq. (5)",
    strategy=lambda: gka_sequences(max_T=4, max_dim=3, with_H0=True),
    precisions=ALL_PRECISIONS,
    implementation=_impl_chunk,
)
def _check_eq5(seq: GKASequence, impl, prec) -> Measurement:
    """Within a chunk, ||H_c||_F^2 = zeta_c^2 ||H_0||_F^2 + 2 zeta_c sum_j M_{j,c} k_j^T H_0 k_j + column-sum(((G_C .
    G_C) M) . M)_c, with M_{j,c} = zeta_c/zeta_j and G_C = K_C^T K_C.

    Measured: mp: the three-term formula against ||H_c||_F^2 from the recurrence. Working precisions:
    solvers.gka_chunk.chunkwise_frobenius against the exact norms, relative error <= allowance(kappa=1, n=D+T).
    """
    if prec == MP:
        with mpla.exact():
            states = mp_states(seq)
            zeta, z = [], mpf(1)
            for g in seq.log_gates:
                z = z * mpmath.exp(mpf(g))
                zeta.append(z)
            terms = impl["frobenius_terms_mp"](states[0], mpla.mat(seq.keys), zeta)
            return worst(
                exact_identity(terms[c], mpla.fro(states[c + 1]) ** 2, f"c={c + 1}")
                for c in range(seq.T)
            )
    ar = arith(prec)
    chunk = max(1, seq.T // 2)
    norms = impl["chunkwise_frobenius"](
        seq.tensor("keys", ar.dtype),
        g=seq.tensor("log_gates", ar.dtype),
        chunk_size=chunk,
        bf16_mode=ar.mode,
    ).to(F64)
    with mpla.exact():
        exact = [mpla.fro(H) for H in mp_states(seq, with_H0=False)[1:]]
    err = max(abs(float(n) - float(e)) / float(e) for n, e in zip(norms, exact))
    # All three terms are sums of nonnegative products (no cancellation), over D + T factors:
    # the allowance with kappa = 1 and n = D + T bounds the relative error of ||H_t||_F.
    return Measurement(err, allowance(1.0, seq.D + seq.T, prec), f"chunk size {chunk}")


# ------------------------------------------------------------ Sec. 4.2.1: chunkwise matvec


@formed
def _chunk_matvec(form):
    def check(seq: GKASequence, impl, prec) -> Measurement:
        with mpla.exact():
            H0 = mp_states(seq)[0]
            k, xi = mpla.vec(seq.keys[0]), mpla.vec(seq.queries[0])
            gamma = mpmath.exp(mpf(seq.log_gates[0]))
            truth = (gamma * H0 + mpla.outer(k, k)) * xi
            if form == "printed":
                claimed = H0 * xi + gamma * k * mpla.dot(k, xi)
            else:
                claimed = gamma * (H0 * xi) + k * mpla.dot(k, xi)
            return exact_identity(claimed, truth, "H_[t]+1 xi")

    return check


erratum(
    Twin(
        "gka.chunk_matvec.printed",
        source="GKA Sec. 4.2.1, 'H_[t]+1 xi via H_[t] xi + gamma_1 k k^T xi'",
        statement="""The matvec with H_{[t]+1} is H_{[t]} xi + gamma_1 k_{[t]+1} k_{[t]+1}^T xi.""",
        examples=(
            GKASequence(
                keys=((0.0,),),
                log_gates=(-1.0,),
                queries=((1.0,),),
                cotangents=((0.0,),),
                a=0.01,
                H0_keys=((1.0,),),
            ),
        ),
    ),
    Twin(
        "gka.chunk_matvec.corrected",
        source="GKA Sec. 4.2.1 (corrected)",
        statement="""H_{[t]+1} xi = gamma_1 H_{[t]} xi + k_{[t]+1} (k_{[t]+1}^T xi): the gate multiplies the
                          state, not the new key.""",
    ),
    check=_chunk_matvec,
    strategy=lambda: gka_sequences(max_T=1, max_dim=3, with_H0=True),
    quantity="""mp: relative difference from (gamma_1 H_[t] + k k^T) xi, held to 1e-30.""",
)


# ----------------------------------------------------------------- Sec. 2: GDN as one GD step


def _gdn_cases():
    @st.composite
    def build(draw):
        D = draw(st.integers(1, 3))
        S = draw(bf16_matrices(D, D, min_value=-2.0, max_value=2.0))
        k = draw(bf16_vectors(D, min_value=-2.0, max_value=2.0))
        v = draw(bf16_vectors(D, min_value=-2.0, max_value=2.0))
        gamma = draw(bf16_floats(2.0**-4, 1.0, allow_zero=False))
        beta = draw(bf16_floats(2.0**-4, 1.0, allow_zero=False))
        return {"S": S, "k": k, "v": v, "gamma": gamma, "beta": beta}

    return build()


@formed
def _gdn(form):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            S, k, v = mpla.mat(case["S"]), mpla.vec(case["k"]), mpla.vec(case["v"])
            gamma, beta = mpf(case["gamma"]), mpf(case["beta"])
            gdn = gamma * S * (mpla.eye(S.rows) - beta * mpla.outer(k, k)) + beta * mpla.outer(v, k)
            S0 = gamma * S
            # gradient of ||S k - v||^2 (printed objective (2)) or of (1/2)||S k - v||^2 (corrected)
            factor = 2 if form == "printed" else 1
            step = S0 - beta * factor * mpla.outer(S0 * k - v, k)
            return exact_identity(step, gdn, "GD step vs (GDN)")

    return check


_GDN_EXAMPLE = {"S": ((1.0,),), "k": (1.0,), "v": (0.0,), "gamma": 1.0, "beta": 1.0}
erratum(
    Twin(
        "gka.gdn_step.printed",
        source="GKA Sec. 2, (GDN) and eq. (2)",
        statement="""(GDN) is one gradient-descent step with step size beta_t, from gamma_t S_{t-1}, on min_S
                          ||S k_t - v_t||_2^2.""",
        examples=(_GDN_EXAMPLE,),
    ),
    Twin(
        "gka.gdn_step.corrected",
        source="GKA Sec. 2, (GDN) (corrected)",
        statement="""(GDN) is one GD step with step beta_t on (1/2)||S k_t - v_t||^2 (equivalently step beta_t/2
                          on eq. (2)).""",
    ),
    check=_gdn,
    strategy=_gdn_cases,
    quantity="""mp: relative difference between that GD step and the (GDN) update, held to 1e-30.""",
)


# ------------------------------------------------------------------- Sec. 3.1: (KF) solves (3)


def mp_kf_update(S, Phi, k, v, eta):
    """One step of (KF) and the Woodbury update of Phi (the Hessian inverse of eq. (3))."""
    denom = 1 / eta + (k.T * Phi * k)[0]
    return S - (S * k - v) * (k.T * Phi) / denom, Phi - (Phi * k) * (k.T * Phi) / denom


def mp_attention(keys, values, q):
    """(Attn): y = sum_i c_i v_i with c = softmax(k_i^T q / sqrt(D))."""
    w = [mpmath.exp(mpla.dot(k, q) / mpmath.sqrt(q.rows)) for k in keys]
    return sum((wi * v for wi, v in zip(w, values)), mpla.zeros(values[0].rows)) / mpmath.fsum(w)


@claim(
    "gka.kf",
    source="GKA Sec. 3.1, eq. (3) and (KF)",
    strategy=lambda: gka_sequences(max_T=4, max_dim=3),
)
def _check_kf(seq: GKASequence, impl, prec) -> Measurement:
    """The Kalman-filter recursion (KF), with Phi updated by Woodbury from Phi_0 = I/lambda, yields the weighted ridge
    minimiser S_t = (sum eta_i v_i k_i^T)(sum eta_i k_i k_i^T + lambda I)^{-1} of eq. (3) at every t.

    Measured: mp: relative difference between the recursion's S_t and the closed form, held to 1e-30 (eta_i = exp(g_i),
    lambda = a).
    """
    with mpla.exact():
        D, lam = seq.D, mpf(seq.a)
        S, Phi = mpla.zeros(D, D), mpla.eye(D) / lam
        U, Hs = mpla.zeros(D, D), lam * mpla.eye(D)
        out = []
        for t in range(seq.T):
            k, v = mpla.vec(seq.keys[t]), mpla.vec(seq.queries[t])
            eta = mpmath.exp(mpf(seq.log_gates[t]))
            S, Phi = impl["kf_update_mp"](S, Phi, k, v, eta)  # (KF), Woodbury
            U += eta * mpla.outer(v, k)
            Hs += eta * mpla.outer(k, k)
            out.append(exact_identity(S, U * mpla.inv(Hs), f"t={t + 1}"))  # argmin of (3)
        return worst(out)


@claim(
    "gka.attn_regression",
    source="GKA Sec. 2, (Attn) and eq. (1)",
    strategy=lambda: gka_sequences(max_T=4, max_dim=3, gated=False),
)
def _check_attention_nw(seq: GKASequence, impl, prec) -> Measurement:
    """Softmax attention's output y_t is the minimiser of sum_i exp(k_i^T q_t / sqrt(D)) ||v - v_i||^2.

    Measured: mp: the gradient of eq. (1) at y_t (as sum_i w_i y = sum_i w_i v_i), held to 1e-30.
    """
    with mpla.exact():
        q = mpla.vec(seq.cotangents[0])
        D = seq.D
        w = [mpmath.exp(mpla.dot(mpla.vec(k), q) / mpmath.sqrt(D)) for k in seq.keys]
        vs = [mpla.vec(v) for v in seq.queries]
        y = impl["attention_mp"]([mpla.vec(k) for k in seq.keys], vs, q)  # (Attn)
        # stationarity of eq. (1): sum_i w_i (y - v_i) = 0
        return exact_identity(
            mpmath.fsum(w) * y,
            sum((wi * v for wi, v in zip(w, vs)), mpla.zeros(D)),
            "grad of (1) at y",
        )


# ------------------------------------------------------------------------- Algorithm 1


def _alg1_cases():
    return st.tuples(gka_systems(max_dim=4, max_keys=4), st.integers(0, 8))


@claim(
    "gka.alg1", source="GKA Sec. 4.1, Algorithm 1", strategy=_alg1_cases, precisions=ALL_PRECISIONS
)
def _check_alg1(case, impl, prec) -> Measurement:
    """Algorithm 1 computes the Chebyshev iterate: xi_r = p_r(H) q with residual polynomial 1 - lam p_r(lam) =
    T_{r+1}((L + mu - 2 lam)/(L - mu)) / T_{r+1}(1/rho).

    Measured: mp: Algorithm 1 against the closed form in H's eigenbasis, held to 1e-30. Working precisions:
    solvers.chebyshev against the mp replay with the same rounded constants, ||xi_hat - xi_mp|| / ||x*|| <=
    allowance(kappa, D).
    """
    sysc, r = case
    if prec == MP:
        with mpla.exact():
            H = mpla.mat(sysc.keys).T * mpla.mat(sysc.keys)
            A, lam, L, mu = impl["ridge_mp"](H, sysc.a)
            q = mpla.vec(sysc.q)
            xi = impl["chebyshev_mp"](A, q, L, mu, r)[-1]
            return exact_identity(xi, mp_chebyshev_closed_form(A, q, L, mu, r), f"r={r}")
    gt = attr("analysis.references.iterative", "working_constants")
    ar = arith(prec)
    rs = impl["gka_ridge"](sysc.H(ar.dtype), sysc.a)
    L, mu = float(rs.L), float(rs.mu)
    q = sysc.q_tensor(ar.dtype)
    xi = impl["chebyshev"](rs.A, q, L=L, mu=mu, iters=r, bf16_mode=ar.mode).to(F64)
    c = gt("chebyshev", L, mu, ar)
    with mpla.exact():
        A = mpla.mat(rs.A.to(F64).tolist())
        qm = mpla.vec(q.to(F64).tolist())
        x_mp = mp_chebyshev(
            A, qm, mpf(L), mpf(mu), r, step=mpf(float(c["step"])), rho2=mpf(float(c["rho2"]))
        )[-1]
        x_star = mpla.solve(A, qm)
        ev = mpla.eigvalsh(A)
        kappa = float(max(mpf(L), ev[-1]) / min(mpf(mu), ev[0]))
        err = (
            float(mpla.fro(mpla.vec(xi.tolist()) - x_mp) / mpla.fro(x_star))
            if mpla.fro(x_star) > 0
            else 0.0
        )
    # the precision model's rounding allowance (docs/precision.md), kappa widened to the stored spectrum
    return Measurement(err, allowance(kappa, sysc.D, prec), f"r={r}")


@claim(
    "gka.alg1.rate",
    source="GKA Sec. 4.1 / App. D.1 (Chebyshev optimality, ref. [47])",
    strategy=_alg1_cases,
)
def _check_alg1_rate(case, impl, prec) -> Measurement:
    """With the spectrum in [mu, L], Algorithm 1's error satisfies ||xi_r - x*|| <= ||x*|| / T_{r+1}(1/rho) <= 2
    R_a^{r+1} ||x*||: the rate that makes CH the optimal first-order method.

    Measured: mp: ||xi_r - x*|| / ||x*|| against 1/T_{r+1}(1/rho).

    Note: Attained (r = 0 and q along an extreme eigenvector), so not loose.
    """
    sysc, r = case
    with mpla.exact():
        H = mpla.mat(sysc.keys).T * mpla.mat(sysc.keys)
        A, lam, L, mu = impl["ridge_mp"](H, sysc.a)
        q = mpla.vec(sysc.q)
        if mpla.fro(q) == 0:
            return Measurement(0.0, 1.0, "q = 0")
        xi = impl["chebyshev_mp"](A, q, L, mu, r)[-1]
        x = mpla.solve(A, q)
        rho = (L - mu) / (L + mu)
        bound = 1 / mpmath.chebyt(r + 1, 1 / rho) if rho > 0 else mpf(0)
        return exact_inequality(mpla.fro(xi - x) / mpla.fro(x), bound, f"r={r}")


@claim(
    "gka.d1.gd_rate",
    source="GKA App. D.1, 'CH in detail'",
    strategy=lambda: gka_systems(max_dim=4, max_keys=4),
)
def _check_gd_rate(case, impl, prec) -> Measurement:
    """rho = (L - mu)/(L + mu) is the contraction factor of gradient descent with step 2/(L + mu) on eq. (11).

    Measured: mp: ||I - 2 A/(L + mu)||_2 against rho for the GKA ridge system A.
    """
    sysc = case
    with mpla.exact():
        H = mpla.mat(sysc.keys).T * mpla.mat(sysc.keys)
        A, lam, L, mu = impl["ridge_mp"](H, sysc.a)
        rho = (L - mu) / (L + mu)
        return exact_inequality(
            mpla.norm2(mpla.eye(A.rows) - 2 / (L + mu) * A), rho, "||I - 2A/(L+mu)||"
        )


# ------------------------------------------------------------------------- Lemma 3, Lemma 4


def _schedule_cases(min_kappa=1.0 + 2**-6):
    return st.tuples(eigenvalue_bounds(min_kappa=min_kappa), st.integers(0, 60))


def _mp_schedule(impl, L, mu, r):
    """Exactly (inside ``mpla.exact()``): rho^2, the weights omega_0..omega_r and omega_1* of
    L, mu (floats or mpf)."""
    Lm, mum = mpf(L), mpf(mu)
    rho2 = ((Lm - mum) / (Lm + mum)) ** 2
    return rho2, impl["weights_mp"](Lm, mum, r), impl["omega_star_mp"](rho2)


def _working_schedule(impl, L, mu, r, prec):
    """The weights as the working solver computes them (compute dtype: fp32 in bf16 storage mode),
    its u_acc, and omega_1* (exact, as a float) of the rounded rho^2 the schedule used."""
    ar = arith(prec)
    w = impl["chebyshev_weights"](L, mu, r, dtype=ar.compute).to(F64).tolist()
    rho2 = float(ar.scalar(((L - mu) / (L + mu)) ** 2).to(F64))
    with mpla.exact():
        ws = float(impl["omega_star_mp"](mpf(rho2)))
    return w, ar.u_acc, ws


@claim(
    "gka.lemma3",
    source="GKA App. D.1, Lemma 3",
    strategy=_schedule_cases,
    precisions=ALL_PRECISIONS,
)
def _check_lemma3(case, impl, prec) -> Measurement:
    """For L > mu > 0 and any r: 2 = omega_0 >= omega_1 >= ... >= omega_r >= omega_1* > 1 with omega_1* = 2(1 - sqrt(1 -
    rho^2))/rho^2; hence 4 - rho^2 omega_i lies in [2, 4].

    Measured: mp: every inequality, held exactly (1e-30). Working precisions: the schedule solvers.chebyshev_weights
    computes (compute dtype) is non-increasing and >= omega_1*(rounded rho^2) up to 3u omega <= 6u, and never exceeds 2.

    Note: The proof's 'g(omega_i) <= 0' should read g(omega_{i-1}) <= 0 (typo; the statement is unaffected). Its step
    'omega_0 = 2 lies in the interval (omega_1*, omega_2*) where g(omega) decreases' is wrong as worded: g'(omega) =
    2 rho^2 omega - 4 vanishes at 2/rho^2, strictly inside the interval (rho = 0.9: roots 1.393 and 3.545, vertex
    2.469), so g decreases only on its left part; the step needs 'g < 0 there' (omega_1 - omega_0 = g(omega_0)/(4 -
    rho^2 omega_0)), which holds between the roots, and the lemma follows. At L = mu, omega_i = 1 for i >= 1 and
    omega_1* is a 0/0: the lemma needs L > mu, as its proof assumes.
    """
    (L, mu), r = case
    if prec == MP:
        with mpla.exact():
            rho2, w, ws = _mp_schedule(impl, L, mu, r)
            parts = [
                exact_inequality(w[i], w[i - 1], f"omega_{i} <= omega_{i - 1}")
                for i in range(1, r + 1)
            ]
            parts += [
                exact_inequality(ws, w[-1], "omega_r >= omega_1*"),
                exact_inequality(1, ws, "omega_1* > 1 (>=)"),
            ]
            parts += [
                exact_inequality(abs(4 - rho2 * wi - 3), 1, "4 - rho^2 omega in [2, 4]") for wi in w
            ]
            return worst(parts)
    w, u, ws = _working_schedule(impl, L, mu, r, prec)
    # each omega_i is a division of a rounded difference of a rounded product: relative error <= 3u,
    # so monotonicity and omega_i >= omega_1* can fail by at most 3u omega (<= 6u).
    parts = [
        Measurement(w[i] - w[i - 1], 6 * u, f"omega_{i} <= omega_{i - 1}") for i in range(1, r + 1)
    ]
    parts += [
        Measurement(ws - min(w), 6 * u, "omega >= omega_1*"),
        Measurement(max(w) - 2.0, 0.0, "omega <= 2"),
    ]
    return worst(parts)


@claim(
    "gka.lemma4",
    source="GKA App. D.1, Lemma 4",
    strategy=_schedule_cases,
    precisions=ALL_PRECISIONS,
)
def _check_lemma4(case, impl, prec) -> Measurement:
    """omega_i - omega_1* <= R^i (omega_0 - omega_1*) with R = (kappa-1)/(kappa+1) (sqrt kappa - 1)/(sqrt kappa + 1).

    Measured: mp: the gap against R^i (2 - omega_1*) at every i <= r. Working precisions: the computed schedule's gap
    against R^i (2 - omega_1*) + 6u/(1 - R) (per-step rounding 3u omega, contracted by R).

    Note: Tight at i = 1 as kappa -> infinity (ratio 0.93 at kappa = 51, 0.9996 at 1e4), loose for large i: the
    asymptotic rate is the map's derivative at omega_1*, rho^2 omega_1*^2/4 = R_a^2 < R; e.g. 0.569 vs R = 0.725 at
    kappa = 51, so R^i overestimates the gap by a factor growing like (R/R_a^2)^i. In strict bf16 the schedule stalls
    1.5 ulp above omega_1* (1.578 vs 1.569 at kappa = 51): exact Lemma 4 fails there, the rounding-aware form holds.
    """
    (L, mu), r = case
    if prec == MP:
        with mpla.exact():
            _, w, ws = _mp_schedule(impl, L, mu, r)
            R = impl["lemma4_rate_mp"](mpf(L) / mpf(mu))
            return worst(
                [exact_inequality(w[i] - ws, R**i * (w[0] - ws), f"i={i}") for i in range(1, r + 1)]
                or [Measurement(0.0, 1.0, "r = 0")]
            )
    w, u, ws = _working_schedule(impl, L, mu, r, prec)
    with mpla.exact():
        R = float(impl["lemma4_rate_mp"](mpf(L) / mpf(mu)))
    # Lemma 4's proof shows the schedule's map contracts by <= R per step; a rounding of <= 3u omega <= 6u
    # per step then adds at most 6u / (1 - R) to the gap (geometric sum).
    slack = 6 * u / (1 - R) if R < 1 else math.inf
    parts = [Measurement(w[i] - ws, R**i * (2.0 - ws) + slack, f"i={i}") for i in range(1, r + 1)]
    return worst(parts or [Measurement(0.0, 1.0, "r = 0")])


# ----------------------------------------------------------------------------- Remark 1

REMARK1_PRINTED = {  # exponent: (printed R^i, printed R_a^i); i = 1 are R and R_a themselves
    1: ("0.7253", "0.7543"),
    5: ("0.2", "0.244"),
    10: ("0.04", "0.0597"),
    20: ("0.0016", "0.0036"),
    30: ("6e-5", "0.0002"),
}


def _half_unit(printed: str) -> mpmath.mpf:
    """Half a unit in the last printed digit of a decimal string such as '0.0597' or '6e-5'."""
    mant, _, exp = printed.partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return mpf(10) ** (-decimals + (int(exp) if exp else 0)) / 2


@formed
def _remark1(form):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            kappa = mpf(51)
            R = impl["lemma4_rate_mp"](kappa)
            Ra = (mpmath.sqrt(kappa) - 1) / (mpmath.sqrt(kappa) + 1)
            table = dict(REMARK1_PRINTED)
            if form == "corrected":
                table[30] = ("6.5e-5", "0.0002")
            parts = []
            for i, (pr, pra) in table.items():
                for name, base, printed in (("R", R, pr), ("R_a", Ra, pra)):
                    val = base**i
                    parts.append(
                        Measurement(
                            float(abs(val - mpmath.mpf(printed)) / _half_unit(printed)),
                            1.0,
                            f"{name}^{i} = {mpmath.nstr(val, 4)} printed {printed}",
                        )
                    )
            return worst(parts)

    return check


erratum(
    Twin(
        "gka.remark1.values.printed",
        source="GKA App. D.1, Remark 1 (kappa = 51)",
        statement="""At kappa = 51: R ~ 0.7253, R^5 ~ 0.2, R^10 ~ 0.04, R^20 ~ 0.0016, R^30 ~ 6e-5; R_a ~
                          0.7543, R_a^5 ~ 0.244, R_a^10 ~ 0.0597, R_a^20 ~ 0.0036, R_a^30 ~ 0.0002.""",
        quantity="""mp: |exact - printed| in units of half the last printed digit (<= 1: correctly rounded).""",
        examples=(None,),
    ),
    Twin(
        "gka.remark1.values.corrected",
        source="GKA App. D.1, Remark 1 (corrected)",
        statement="""The same table with R^30 ~ 6.5e-5 (exact 6.547e-5; the printed 6e-5 is truncated, not
                          rounded).""",
        quantity="""mp: |exact - printed| in units of half the last printed digit.""",
    ),
    check=_remark1,
    strategy=lambda: st.just(None),
)


@claim(
    "gka.remark1.bf16_20",
    source="GKA App. D.1, Remark 1, last sentence",
    strategy=lambda: st.just(None),
    loose=0.0014,
)
def _check_remark1_20(case, impl, prec) -> Measurement:
    """With kappa = 51 the weight schedule converges to omega_1* within bfloat16 precision in at most 20 iterations.

    Measured: mp: (omega_20 - omega_1*)/omega_1* against bf16's unit roundoff 2^-8.

    Note: It is within 2^-8 (relative) from iteration 9 on; Lemma 4's bound guarantees it from 14. (Computed in strict
    bf16 the schedule stalls at 1.578 > omega_1* = 1.569.)
    """
    with mpla.exact():
        _, w, ws = _mp_schedule(impl, mpf("1.02"), mpf("0.02"), 20)
        first = next(i for i, wi in enumerate(w) if (wi - ws) <= ws * mpf(2) ** -8)
        return Measurement(
            float((w[20] - ws) / ws), 2.0**-8, f"within bf16's u from iteration {first}"
        )


@claim("gka.remark1.faster", source="GKA App. D.1, Remark 1", strategy=lambda: eigenvalue_bounds())
def _check_remark1_faster(case, impl, prec) -> Measurement:
    """The weights converge faster than the iterates: R = rho R_a < R_a.

    Measured: mp: R against R_a for kappa in (1, 1e4].
    """
    L, mu = case
    with mpla.exact():
        kappa = mpf(L) / mpf(mu)
        Ra = (mpmath.sqrt(kappa) - 1) / (mpmath.sqrt(kappa) + 1)
        return exact_inequality(impl["lemma4_rate_mp"](kappa), Ra, "R <= R_a")


# ----------------------------------------------------------------------------- Remark 2 (range of b_i)


@claim("gka.remark2.b_range", source="GKA App. E.1, Remark 2", strategy=_schedule_cases)
def _check_remark2_range(case, impl, prec) -> Measurement:
    """The divisor of eq. (49) satisfies 1 >= -b_i = omega_i - 1 >= omega_1* - 1 (by Lemma 3).

    Measured: mp: max_i (omega_i - 1) against 1 and min_i against omega_1* - 1.
    """
    (L, mu), r = case
    with mpla.exact():
        _, w, ws = _mp_schedule(impl, L, mu, max(r, 1))
        neg_b = [wi - 1 for wi in w[1:]]
        return worst(
            [
                exact_inequality(max(neg_b), 1, "-b_i <= 1"),
                exact_inequality(ws - 1, min(neg_b), "-b_i >= omega_1* - 1"),
            ]
        )


@claim(
    "gka.remark2.quarter",
    source="GKA App. E.1, Remark 2",
    strategy=lambda: _schedule_cases(min_kappa=10.0),
    loose=0.926,
)
def _check_remark2_quarter(case, impl, prec) -> Measurement:
    """For kappa >= 10, -b_i = omega_i - 1 lies in [0.25, 1].

    Measured: mp: 0.25 against min_i (omega_i - 1) for kappa in [10, 1e4].

    Note: Worst at kappa = 10: omega_1* - 1 = R_a^2 = 0.2699, so the constant 0.25 is loose by 1.08x.
    """
    (L, mu), r = case
    with mpla.exact():
        w = impl["weights_mp"](mpf(L), mpf(mu), max(r, 1))
        return exact_inequality(mpf("0.25"), min(wi - 1 for wi in w[1:]), "-b_i >= 0.25")


@claim(
    "gka.remark2.omega_star_increasing",
    source="GKA App. E.1, Remark 2",
    strategy=lambda: st.tuples(eigenvalue_bounds(), eigenvalue_bounds()),
)
def _check_omega_star_increasing(case, impl, prec) -> Measurement:
    """omega_1* is an increasing function of rho, hence of kappa.

    Measured: mp: omega_1*(rho_lo) <= omega_1*(rho_hi) for random pairs.
    """
    (L1, mu1), (L2, mu2) = case
    with mpla.exact():
        r1 = ((mpf(L1) - mpf(mu1)) / (mpf(L1) + mpf(mu1))) ** 2
        r2 = ((mpf(L2) - mpf(mu2)) / (mpf(L2) + mpf(mu2))) ** 2
        lo, hi = sorted((r1, r2))
        if lo == hi:
            return Measurement(0.0, 1.0, "equal rho")
        return exact_inequality(
            impl["omega_star_mp"](lo), impl["omega_star_mp"](hi), "omega_1*(rho) increasing"
        )


not_checkable(
    "gka.remark1.first_order_limit",
    paper="gka",
    source="GKA App. D.1, Remark 1",
    text="""
    First-order methods converge at most at rate R_a.

    Why: A lower bound over all first-order methods (Nesterov's theorem); no finite computation checks it.""",
)
not_checkable(
    "gka.remark2.cg_divisor",
    paper="gka",
    source="GKA App. E.1, Remark 2 / Fig. 5b",
    text="""
    Reversing CG divides by quantities as small as 1e-3 or as large as 1e10.

    Why: An empirical figure of the authors' runs; the figures module reproduces our own version
    (analysis/figures/gka_fig5.py), not theirs.""",
)
not_checkable(
    "gka.fig1",
    paper="gka",
    source="GKA Sec. 4.2.3, Fig. 1",
    text="""
    CG converges fastest in a few iterations, CH reaches CG's accuracy at iteration 10 and attains the smallest
    error; CH's gradients match the exact solver to 1e-6.

    Why: Empirical on the authors' 5-layer LLaMA; regenerated at small scale by analysis/figures/gka_fig1a.py.""",
)
not_checkable(
    "gka.experiments",
    paper="gka",
    source="GKA Secs. 5-6, App. F-N",
    text="""
    Benchmark results (MQAR, LM-Harness, RULER/HELMET, ImageNet, throughput).

    Why: Training runs; table arithmetic is checked in gka reported-number claims.""",
)
