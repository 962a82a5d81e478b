"""Echo / Spectral Koopman Attention: Appendices A-E, I, J (propositions, theorems, corollaries,
remarks with numbers) and the main-text statements they support (Secs. 3.2-3.6, 6.1).

Exact checks use small bf16-representable sequences (keys z_t in R^r, values v_t in R^P, a query
q, ridge eps) and the statistics of Appendix I.1: G = sum k_t k_t^T, G~ = G + eps I,
C_v = sum v_t k_t^T, M = sum_{t<T} k_{t+1} k_t^T, G~ = L L^T.
"""

from __future__ import annotations

import mpmath
import torch
from hypothesis import strategies as st

from analysis.testing.strategies.bf16 import bf16_floats, bf16_matrices, bf16_vectors

from .. import mpla
from ..claim import ALL_PRECISIONS, EXTENSION, FAILS, MP, WORKING, Measurement
from ..declare import Twin, for_paper, not_checkable
from ._common import (
    F64,
    allowance,
    arith,
    attr,
    exact_identity,
    exact_inequality,
    formed,
    mp_matrix_tensor,
    mp_vector_tensor,
    mpf,
    worst,
)

_ENTRY = dict(min_value=-2.0, max_value=2.0)
EPS_CHOICES = (2.0**-10, 0.125, 1.0)  # the paper's 1e-3 is ~2^-10


def _seq_cases(*, min_T: int = 1, max_T: int = 5, max_r: int = 3, max_P: int = 3):
    @st.composite
    def build(draw):
        T, r, P = (
            draw(st.integers(min_T, max_T)),
            draw(st.integers(1, max_r)),
            draw(st.integers(1, max_P)),
        )
        return {
            "Z": tuple(draw(bf16_vectors(r, **_ENTRY)) for _ in range(T)),
            "V": tuple(draw(bf16_vectors(P, **_ENTRY)) for _ in range(T)),
            "q": draw(bf16_vectors(r, **_ENTRY)),
            "eps": draw(st.sampled_from(EPS_CHOICES)),
        }

    return build()


def mp_stats(case) -> dict:
    """Appendix I.1's statistics (eqs. (54)-(57)) and the Cholesky factor of G~."""
    Z = [mpla.vec(z) for z in case["Z"]]
    V = [mpla.vec(v) for v in case["V"]]
    r, P = Z[0].rows, V[0].rows
    G, M, Cv = mpla.zeros(r, r), mpla.zeros(r, r), mpla.zeros(P, r)
    for t in range(len(Z)):
        G += mpla.outer(Z[t], Z[t])
        Cv += mpla.outer(V[t], Z[t])
        if t > 0:
            M += mpla.outer(Z[t], Z[t - 1])
    Gt = G + mpf(case["eps"]) * mpla.eye(r)
    L = mpla.cholesky(Gt)
    return {
        "G": G,
        "Gt": Gt,
        "M": M,
        "Cv": Cv,
        "L": L,
        "Li": mpla.inv(L),
        "q": mpla.vec(case["q"]),
        "Z": Z,
        "V": V,
    }


def mp_whitened(s):
    """Eq. (22): A_w = L^{-1} M L^{-T}."""
    return s["Li"] * s["M"] * s["Li"].T


def mp_ska(s, A_hat, K: int, eta=1):
    """Eq. (13) / App. F steps 8-10: w_q = L^{-1} q, w_f = A^K w_q, z_f = L w_f, y = eta B_v z_f."""
    w = s["Li"] * s["q"]
    for _ in range(K):
        w = A_hat * w
    Bv = s["Cv"] * mpla.inv(s["Gt"])
    return eta * Bv * (s["L"] * w)


def mp_ridge_estimator(M, G, eps):
    """Prop. A.2: A_eps = M (G + eps I)^{-1}."""
    return M * mpla.inv(G + mpf(eps) * mpla.eye(G.rows))


def mp_invariant_lift(z):
    """Eq. (28): psi_inv(z)_j = |z_j|^2."""
    return abs(z) ** 2


def mp_c1_bound(EM, EG, A, Gt, Gh):
    """Eq. (33): ||E_M|| ||G^~^{-1}|| + ||A|| ||G~^{-1}|| ||E_G|| ||G^~^{-1}|| ||G~||."""
    n2 = mpla.norm2
    return n2(EM) * n2(mpla.inv(Gh)) + n2(A) * n2(mpla.inv(Gt)) * n2(EG) * n2(mpla.inv(Gh)) * n2(Gt)


def mp_c4_bound(kV, EM, EG, A, Gt, lmin, lmin_h):
    """Eq. (45): kappa(V) (||E_M||/lambda_min(G^~) + ||A|| ||G~|| ||E_G|| / (lambda_min(G~) lambda_min(G^~)))."""
    n2 = mpla.norm2
    return kV * (n2(EM) / lmin_h + n2(A) * n2(Gt) * n2(EG) / (lmin * lmin_h))


def mp_spectral_normalize(Aw):
    """Prop. D.2: A^_w = A_w / max(1, sigma_max(A_w)) with the exact sigma_max."""
    return Aw / max(mpf(1), mpla.norm2(Aw))


def mp_sequence_max(Z):
    """Eq. (3): m = max(max_t ||z_t||, 1e-6)."""
    return max([mpla.fro(z) for z in Z] + [mpf("1e-6")])


def _impl():
    return {
        "stats_mp": mp_stats,
        "whitened_mp": mp_whitened,
        "ska_mp": mp_ska,
        "ridge_estimator_mp": mp_ridge_estimator,
        "koopman_estimator_mp": lambda M, G: M * mpla.inv(G),
        "invariant_lift_mp": mp_invariant_lift,
        "c1_bound_mp": mp_c1_bound,
        "bauer_fike_bound_mp": lambda kV, nE: kV * nE,
        "c4_bound_mp": mp_c4_bound,
        "power_filter_mp": lambda lam, K: lam**K,
        "spectral_normalize_mp": mp_spectral_normalize,
        "sequence_max_mp": mp_sequence_max,
        "chunk_stats_mp": mp_chunk_stats,
        "ridge_readout_mp": lambda s: s["Cv"] * mpla.inv(s["Gt"]),
        "linear_attention_mp": lambda s: s["Cv"],
        "a_star_mp": lambda lmin, lmax: 2 * lmin * lmax / (lmin + lmax),
        "softmax_rule_mp": mp_softmax_rule,
        "state_components": lambda r, P: (r * r, r * r, P * r, r, 1),
        "lm_head_grad_mp": lambda GL, W: GL * W,
        "attention_jacobian_mp": lambda V, S, K, dk: V.T * S * K / mpmath.sqrt(dk),
        "ska_jacobian_mp": lambda eta, Bv, L, Apow, Li: eta * Bv * L * Apow * Li,
        "kmlp_jacobian_mp": lambda Wr, R, D, Wl: Wr * R * D * Wl,
        "spectral_norm_mp": mpla.norm2,
        "rescale_mp": mp_rescale,
    }


def _impl_solvers():
    impl = dict(_impl())
    for name in (
        "koopman_statistics",
        "chunk_causal_statistics",
        "ridge_readout",
        "spectral_normalize",
        "value_map",
        "whitened_operator",
    ):
        impl[name] = attr("solvers.koopman", name)
    impl["power_ratio_bound"] = attr("analysis.references.koopman", "power_ratio_bound")
    impl["statistics_bound"] = attr("analysis.references.koopman", "statistics_bound")
    return impl


def _stored_zv(case, ar):
    """The case's tokens Z and values V, rounded once to the working dtype."""
    return torch.tensor(case["Z"], dtype=F64).to(ar.dtype), torch.tensor(case["V"], dtype=F64).to(
        ar.dtype
    )


claim, erratum = for_paper("echo", implementation=_impl)


# ------------------------------------------------------------------------- Appendix A


def _lag_stats(case):
    """Prop. A.1's G = sum_{t<T} z_t z_t^T, M = sum_{t<T} z_{t+1} z_t^T (eq. (16))."""
    Z = [mpla.vec(z) for z in case["Z"]]
    r = Z[0].rows
    G, M = mpla.zeros(r, r), mpla.zeros(r, r)
    for t in range(len(Z) - 1):
        G += mpla.outer(Z[t], Z[t])
        M += mpla.outer(Z[t + 1], Z[t])
    return Z, G, M


@formed
def _a1(form):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            Z, G, M = _lag_stats(case)
            if mpmath.det(G) == 0:
                return Measurement(0.0, 1.0, "G singular (the proposition assumes it invertible)")
            # the estimator of Prop. A.1, or eq. (19)'s M^T G^{-1}
            A = impl["koopman_estimator_mp"](M, G) if form == "statement" else M.T * mpla.inv(G)

            def obj(Am):
                return mpmath.fsum(
                    mpla.dot(Z[t + 1] - Am * Z[t], Z[t + 1] - Am * Z[t]) for t in range(len(Z) - 1)
                )

            g = mpla.matrix_grad(obj, A)
            return Measurement(
                float(mpla.fro(g)), float(mpla.exact_tol() * (mpla.fro(M) + 1)), "||grad O(A)||"
            )

    return check


_A1_EXAMPLE = {
    "Z": ((1.0, 0.0), (1.0, 1.0), (0.0, 1.0)),
    "V": ((0.0,),) * 3,
    "q": (0.0, 0.0),
    "eps": 1.0,
}  # M not symmetric
claim(
    "echo.a1",
    statement="""For G = sum_{t<T} z_t z_t^T invertible, A* = M G^{-1} minimises sum_t ||z_{t+1} - A z_t||^2 (M =
                   sum z_{t+1} z_t^T).""",
    source="Echo App. A.1, Proposition A.1",
    quantity="""mp: the gradient of the objective at M G^{-1} (mpmath.diff), held to 1e-30.""",
    strategy=lambda: _seq_cases(min_T=2, max_T=5, max_r=2),
)(_a1("statement"))
claim(
    "echo.a1.eq19.printed",
    statement="""Setting the derivative to zero gives -2 M^T + 2 A G = 0, i.e. A = M^T G^{-1} (the proof's step).""",
    source="Echo App. A.1, eq. (19)",
    quantity="""mp: the gradient of the objective at M^T G^{-1}.""",
    strategy=lambda: _seq_cases(min_T=2, max_T=5, max_r=2),
    expected=FAILS,
    twin="echo.a1",
    examples=(_A1_EXAMPLE,),
    note="""The derivative of -2 tr(A sum z_t z_{t+1}^T) is -2M, not -2M^T; transposing A = M^T G^{-1} gives A^T =
              G^{-1} M, not A = M G^{-1}. The statement is right, only this step is wrong.""",
)(_a1("eq19"))


@claim(
    "echo.a1.remark1",
    source="Echo App. A.1, Remark 1",
    strategy=lambda: _seq_cases(min_T=2, max_T=5, max_r=2),
)
def _check_a1_remark(case, impl, prec) -> Measurement:
    """Replacing the lagged M by G gives A = I whatever the data.

    Measured: mp: G G^{-1} against I.
    """
    with mpla.exact():
        _, G, _ = _lag_stats(case)
        if mpmath.det(G) == 0:
            return Measurement(0.0, 1.0, "G singular")
        return exact_identity(impl["koopman_estimator_mp"](G, G), mpla.eye(G.rows), "G G^{-1} = I")


@claim(
    "echo.a2",
    source="Echo App. A.2, Proposition A.2, eq. (21)",
    strategy=lambda: _seq_cases(min_T=2, max_T=5, max_r=3),
)
def _check_a2(case, impl, prec) -> Measurement:
    """A_eps = M G~^{-1} = M V diag(1/(sigma_j + eps)) V^T, so directions with sigma_j << eps are shrunk to 0: ||A_eps
    v_j|| <= sqrt(sigma_j sum ||z_{t+1}||^2)/(sigma_j + eps) -> 0 as sigma_j -> 0.

    Measured: mp: eq. (21) held to 1e-30, and the shrinkage bound per eigendirection.
    """
    with mpla.exact():
        Z, G, M = _lag_stats(case)
        eps = mpf(case["eps"])
        A_eps = impl["ridge_estimator_mp"](M, G, eps)
        ev, Vm = mpla.eigh(G)
        parts = [
            exact_identity(
                A_eps, M * Vm * mpmath.diag([1 / (s + eps) for s in ev]) * Vm.T, "eq. (21)"
            )
        ]
        sq = mpmath.fsum(mpla.dot(z, z) for z in Z[1:])
        for j, s in enumerate(
            ev
        ):  # shrinkage: ||A_eps v_j|| <= sqrt(sigma_j sum ||z_{t+1}||^2) / (sigma_j + eps)
            vj = Vm[:, j]
            parts.append(
                exact_inequality(
                    mpla.fro(A_eps * vj), mpmath.sqrt(max(s, 0) * sq) / (s + eps), f"direction {j}"
                )
            )
        return worst(parts)


@claim(
    "echo.a3",
    source="Echo App. A.3, Proposition A.3; App. I.3, Proposition I.4",
    strategy=_seq_cases,
)
def _check_a3(case, impl, prec) -> Measurement:
    """A_w = L^{-1} M L^{-T} = L^{-1} A_eps L: the whitened operator is similar to A_eps = M G~^{-1} (same eigenvalues).

    Measured: mp: the similarity identity, held to 1e-30.
    """
    with mpla.exact():
        s = impl["stats_mp"](case)
        A_eps = s["M"] * mpla.inv(s["Gt"])
        return exact_identity(
            s["Li"] * A_eps * s["L"], impl["whitened_mp"](s), "L^{-1} A_eps L = A_w"
        )


@formed
def _remark2(form):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            s = impl["stats_mp"](case)
            A_eps = s["M"] * mpla.inv(s["Gt"])
            naive = mpla.inv(s["Gt"]) * s["M"]
            sim = exact_identity(
                mpla.inv(s["Gt"]) * A_eps * s["Gt"], naive, "G~^{-1} A_eps G~ = G~^{-1} M"
            )
            if form == "corrected":
                return sim
            # printed: 'not similar in general': a case where the similarity identity holds refutes it
            return Measurement(float(sim.ok), 0.0, "G~^{-1} M is similar to A_eps (by G~)")

    return check


erratum(
    Twin(
        "echo.a3.remark2.printed",
        source="Echo App. A.3, Remark 2",
        statement="""The naive product G~^{-1} M is not similar to A_eps in general and can have a different
                          eigenspectrum.""",
        quantity="""mp: value 1 when G~^{-1} M = G~^{-1} A_eps G~ (a similarity) on the case, held to 0.""",
        examples=(_A1_EXAMPLE,),
    ),
    Twin(
        "echo.a3.remark2.corrected",
        source="Echo App. A.3, Remark 2 (corrected)",
        statement="""G~^{-1} M = G~^{-1} (M G~^{-1}) G~ is always similar to A_eps (XY and YX share
                          eigenvalues); whitening matters for conditioning, not for the spectrum.""",
        quantity="""mp: the similarity identity, held to 1e-30.""",
    ),
    check=_remark2,
    strategy=_seq_cases,
)


@claim(
    "echo.a4",
    source="Echo App. A.4, Lemma A.4; App. I.2, Lemma I.1; App. F step 4",
    strategy=_seq_cases,
    precisions=ALL_PRECISIONS,
    implementation=_impl_solvers,
)
def _check_gram_pd(case, impl, prec) -> Measurement:
    """G~ = G + eps I is symmetric positive definite with lambda_min(G~) >= eps, so its Cholesky factor exists.

    Measured: mp: lambda_min(G~) against eps. Working precisions: solvers.koopman.koopman_statistics' stored G~ (scale
    1) has lambda_min >= eps - theta ||G~|_abs||_F (theta = analysis.references.koopman.statistics_bound).
    """
    if prec == MP:
        with mpla.exact():
            s = impl["stats_mp"](case)
            return exact_inequality(
                mpf(case["eps"]), mpla.eigvalsh(s["Gt"])[0], "lambda_min(G~) >= eps"
            )
    ar = arith(prec)
    z, v = _stored_zv(case, ar)
    st_ = impl["koopman_statistics"](z, v, eps=case["eps"], scale=1.0, bf16_mode=ar.mode)
    G = st_.G.to(F64)
    lam = float(torch.linalg.eigvalsh(G)[0])
    # stored G~ = exact G~ + dG with |dG| <= theta |G~|_abs (statistics_bound, T additions): Weyl moves lambda_min by <= ||dG||
    theta = impl["statistics_bound"](len(case["Z"]) + 1, ar, len(case["q"]))
    absG = sum(torch.outer(x, x).abs() for x in torch.tensor(case["Z"], dtype=F64)) + case[
        "eps"
    ] * torch.eye(len(case["q"]), dtype=F64)
    slack = theta * float(torch.linalg.matrix_norm(absG)) + 8 * len(case["q"]) * 2.0**-53 * float(
        torch.linalg.matrix_norm(G)
    )
    return Measurement(case["eps"] - lam, slack, "eps - lambda_min(stored G~)")


# ------------------------------------------------------------------------- Appendix B


def _complex_cases():
    @st.composite
    def build(draw):
        n = draw(st.integers(1, 3))
        T = draw(st.integers(1, 3))
        return {
            "re": draw(bf16_matrices(T, n, **_ENTRY)),
            "im": draw(bf16_matrices(T, n, **_ENTRY)),
            "theta": draw(bf16_matrices(T, n, min_value=-8.0, max_value=8.0)),
        }

    return build()


@claim(
    "echo.b",
    source="Echo App. B, Prop. B.1, Thm. B.2, Cor. B.3, eqs. (30)-(32)",
    strategy=_complex_cases,
)
def _check_cg_lift(case, impl, prec) -> Measurement:
    """|z e^{i theta}|^2 = |z|^2 and (z e^{i theta})^2 = z^2 e^{2 i theta}; the invariant lift psi_inv(k)_j = |k_j|^2
    and its Gram matrix do not depend on the phases; the harmonic channel rotates by 2 theta (eq. (32)).

    Measured: mp: each identity (complex arithmetic at 50 digits), held to 1e-30.
    """
    with mpla.exact():
        parts = []
        lifts, lifts_rot = [], []
        for t in range(len(case["re"])):
            row, row_rot = [], []
            for j in range(len(case["re"][t])):
                z = mpmath.mpc(case["re"][t][j], case["im"][t][j])
                th = mpf(case["theta"][t][j])
                zr = z * mpmath.exp(1j * th)
                parts.append(
                    exact_identity(abs(zr) ** 2, abs(z) ** 2, "|z e^{i theta}|^2 = |z|^2 (B.1 (1))")
                )
                h, hr = z**2, zr**2
                parts.append(
                    exact_identity(
                        abs(hr - h * mpmath.exp(2j * th)),
                        mpf(0),
                        "(z e^{i theta})^2 = z^2 e^{2 i theta}",
                    )
                )
                rot = mpmath.matrix(
                    [
                        [mpmath.cos(2 * th), -mpmath.sin(2 * th)],
                        [mpmath.sin(2 * th), mpmath.cos(2 * th)],
                    ]
                )
                parts.append(
                    exact_identity(
                        mpmath.matrix([hr.real, hr.imag]),
                        rot * mpmath.matrix([h.real, h.imag]),
                        "eq. (32)",
                    )
                )
                row.append(impl["invariant_lift_mp"](z))
                row_rot.append(impl["invariant_lift_mp"](zr))
            lifts.append(mpla.vec(row))
            lifts_rot.append(mpla.vec(row_rot))
        Gm = sum((mpla.outer(x, x) for x in lifts), mpla.zeros(lifts[0].rows, lifts[0].rows))
        Gr = sum((mpla.outer(x, x) for x in lifts_rot), mpla.zeros(lifts[0].rows, lifts[0].rows))
        parts.append(exact_identity(Gr, Gm, "Gram of psi_inv independent of theta (B.2, B.3)"))
        return worst(parts)


# ------------------------------------------------------------------------- Appendix C


def _pert_cases():
    @st.composite
    def build(draw):
        c = draw(_seq_cases(min_T=2, max_T=4, max_r=3, max_P=1))
        r = len(c["q"])
        small = dict(min_value=-0.25, max_value=0.25)
        EG = draw(bf16_matrices(r, r, **small))
        EG = tuple(
            tuple((EG[i][j] + EG[j][i]) / 2 for j in range(r)) for i in range(r)
        )  # symmetric, as an empirical Gram error
        return dict(c, EM=draw(bf16_matrices(r, r, **small)), EG=EG)

    return build()


def _perturbed(case, impl):
    s = impl["stats_mp"](case)
    EM, EG = mpla.mat(case["EM"]), mpla.mat(case["EG"])
    Gh = s["Gt"] + EG
    return s, EM, EG, Gh


@claim(
    "echo.c1",
    source="Echo App. C.1, Theorem C.1, eqs. (33)-(42); Corollary C.2",
    strategy=_pert_cases,
)
def _check_c1(case, impl, prec) -> Measurement:
    """||A^ - A|| <= ||E_M|| ||G^~^{-1}|| + ||A|| ||G~^{-1}|| ||E_G|| ||G^~^{-1}|| ||G~|| for A = M G~^{-1}, A^ = (M +
    E_M)(G~ + E_G)^{-1}; with the resolvent identity (37) and eq. (41) exact.

    Measured: mp: (37) and (41) held to 1e-30; ||A^ - A||_2 against the bound (33).

    Note: Loose by kappa(G~) in the second term: the proof's ||M G~^{-1} E_G G^~^{-1}|| <= ||A|| ||E_G|| ||G^~^{-1}||
    already bounds it; multiplying by ||G~^{-1}|| ||G~|| >= 1 only widens it.
    """
    with mpla.exact():
        s, EM, EG, Gh = _perturbed(case, impl)
        if mpla.eigvalsh(Gh)[0] <= 0:
            return Measurement(0.0, 1.0, "perturbed Gram not invertible")
        A = s["M"] * mpla.inv(s["Gt"])
        Ah = (s["M"] + EM) * mpla.inv(Gh)
        parts = [
            exact_identity(
                mpla.inv(Gh) - mpla.inv(s["Gt"]),
                -mpla.inv(s["Gt"]) * EG * mpla.inv(Gh),
                "resolvent (37)",
            ),
            exact_identity(
                Ah - A,
                EM * mpla.inv(Gh) - s["M"] * mpla.inv(s["Gt"]) * EG * mpla.inv(Gh),
                "eq. (41)",
            ),
        ]
        bound = impl["c1_bound_mp"](EM, EG, A, s["Gt"], Gh)
        parts.append(exact_inequality(mpla.norm2(Ah - A), bound, "eq. (33)"))
        return worst(parts)


@claim(
    "echo.c3",
    source="Echo App. C.2, Theorem C.3 (Bauer-Fike), eqs. (43)-(44)",
    strategy=_pert_cases,
)
def _check_bauer_fike(case, impl, prec) -> Measurement:
    """For diagonalizable A = V Lambda V^{-1}, every eigenvalue of A + E is within kappa(V) ||E|| of an eigenvalue of A.

    Measured: mp: for every eigenvalue of A + E_M (A = M G~^{-1}), the distance to A's spectrum against kappa(V)
    ||E_M||.
    """
    with mpla.exact():
        s, EM, _, _ = _perturbed(case, impl)
        A = s["M"] * mpla.inv(s["Gt"])
        E, V = mpmath.eig(A)
        if abs(mpmath.det(V)) < mpf(10) ** -20:
            return Measurement(0.0, 1.0, "A not (numerically) diagonalizable")
        kV = (
            mpla.norm2(V) * mpla.norm2(mpmath.inverse(V))
            if all(abs(x.imag) == 0 for x in V)
            else _cond_complex(V)
        )
        Ah = A + EM
        parts = []
        for lh in mpla.eigvals(Ah):
            d = min(abs(lh - l) for l in E)
            parts.append(
                exact_inequality(
                    d, impl["bauer_fike_bound_mp"](kV, mpla.norm2(EM)), "min_j |lambda^ - lambda_j|"
                )
            )
        return worst(parts)


def _cond_complex(V) -> mpmath.mpf:
    """2-norm condition number of a complex matrix via the Hermitian V^H V."""

    def n2(X):
        H = X.H * X
        return mpmath.sqrt(max(abs(e) for e in mpla.eigvals(H)))

    return n2(V) * n2(mpmath.inverse(V))


@claim("echo.c4", source="Echo App. C.2, Corollary C.4, eq. (45)", strategy=_pert_cases)
def _check_c4(case, impl, prec) -> Measurement:
    """Every eigenvalue of A^ lies within kappa(V_{A_w}) (||E_M||/lambda_min(G^~) + ||A|| ||G~|| ||E_G|| /
    (lambda_min(G~) lambda_min(G^~))) of the spectrum of A (read as Bauer-Fike's 'for every eigenvalue').

    Measured: mp: the largest distance from an eigenvalue of A^ to A's spectrum against the bound.

    Note: Bauer-Fike on A = M G~^{-1} needs kappa of A's eigenvectors, L V_{A_w}, not of A_w's: kappa(L V_{A_w}) <=
    sqrt(kappa(G~)) kappa(V_{A_w}). The printed bound survives the search because the second term carries an extra
    kappa(G~); the proof as written does not justify it. 'min_j |lambda^_j - lambda_j|' read literally (one pair) is
    weaker.
    """
    with mpla.exact():
        s, EM, EG, Gh = _perturbed(case, impl)
        if mpla.eigvalsh(Gh)[0] <= 0:
            return Measurement(0.0, 1.0, "perturbed Gram not invertible")
        Aw = impl["whitened_mp"](s)
        E, V = mpmath.eig(Aw)
        if abs(mpmath.det(V)) < mpf(10) ** -20:
            return Measurement(0.0, 1.0, "A_w not (numerically) diagonalizable")
        A = s["M"] * mpla.inv(s["Gt"])
        Ah = (s["M"] + EM) * mpla.inv(Gh)
        lmin, lmin_h = mpla.eigvalsh(s["Gt"])[0], mpla.eigvalsh(Gh)[0]
        bound = impl["c4_bound_mp"](_cond_complex(V), EM, EG, A, s["Gt"], lmin, lmin_h)
        parts = []
        for lh in mpla.eigvals(Ah):
            parts.append(
                exact_inequality(
                    min(abs(lh - l) for l in E), bound, "eigenvalue of A^ vs spectrum of A"
                )
            )
        return worst(parts)


@claim("echo.c5", source="Echo App. C.3, Proposition C.5, eqs. (46)-(47)", strategy=_complex_cases)
def _check_c5(case, impl, prec) -> Measurement:
    """With phase increments i.i.d. uniform on [0, 2 pi), E[e^{i(theta_{t+1} - theta_t)}] = 0, so E[M_raw] = 0 while
    E[G_raw] > 0; the invariant lift's M_inv = sum |k~_{t+1}|^2 |k~_t|^2 does not depend on the phases.

    Measured: mp: the expectation as an integral (mpmath.quad), and M_inv under random phases, held to 1e-30.
    """
    with mpla.exact():
        mean = mpmath.quad(lambda th: mpmath.exp(1j * th), [0, 2 * mpmath.pi]) / (2 * mpmath.pi)
        parts = [
            Measurement(
                float(abs(mean)), float(mpla.exact_tol()), "E[e^{i dtheta}] for uniform dtheta"
            )
        ]
        # the invariant lift removes the phase: M_inv = sum |k~_{t+1}|^2 |k~_t|^2 whatever the phases
        k = [mpmath.mpc(a, b) for a, b in zip(case["re"][0], case["im"][0])]
        th = [mpf(x) for x in case["theta"][0]]
        rot = [kk * mpmath.exp(1j * t) for kk, t in zip(k, th)]
        lift = impl["invariant_lift_mp"]
        m_inv = mpmath.fsum(lift(k[t + 1]) * lift(k[t]) for t in range(len(k) - 1))
        m_rot = mpmath.fsum(lift(rot[t + 1]) * lift(rot[t]) for t in range(len(k) - 1))
        parts.append(exact_identity(m_rot, m_inv, "M_inv phase-free"))
        return worst(parts)


# ------------------------------------------------------------------------- Appendix D


D1_TABLE = {
    2: {0.95: "0.902", 0.90: "0.810", 0.70: "0.490", 0.50: "0.250", 0.30: "0.090"},
    4: {0.95: "0.815", 0.90: "0.656", 0.70: "0.240", 0.50: "0.063", 0.30: "0.008"},
}


@claim(
    "echo.d1.table",
    source="Echo App. D.1, Proposition D.1 (tables for K = 2, 4); Sec. 6.1",
    strategy=lambda: st.just(None),
)
def _check_d1_table(case, impl, prec) -> Measurement:
    """|lambda|^K for |lambda| in {0.95, 0.9, 0.7, 0.5, 0.3}: 0.902, 0.810, 0.490, 0.250, 0.090 (K = 2) and 0.815,
    0.656, 0.240, 0.063, 0.008 (K = 4); so K = 2 keeps 81% at 0.9 and 9% at 0.3 (Sec. 6.1).

    Measured: mp: |exact - printed| in units of half the last printed digit (<= 1). Ties (0.9025, 0.0625) pass either
    way.
    """
    with mpla.exact():
        parts = []
        for K, rows in D1_TABLE.items():
            for lam, printed in rows.items():
                val = impl["power_filter_mp"](mpmath.mpf(str(lam)), K)
                parts.append(
                    Measurement(
                        float(abs(val - mpmath.mpf(printed)) / (mpf(10) ** -3 / 2)),
                        1.0,
                        f"{lam}^{K} = {mpmath.nstr(val, 6)} printed {printed}",
                    )
                )
        return worst(parts)


@formed
def _remark3(form):
    def check(lam, impl, prec) -> Measurement:
        with mpla.exact():
            lam = mpf(lam)
            threshold = mpf("0.85") if form == "printed" else mpf("0.5") ** (mpf(1) / 4)
            retains = lam**4 > mpf("0.5")
            # 'only modes with |lambda| >= threshold retain more than 50%': retaining implies lambda >= threshold
            return Measurement(
                float(retains and lam < threshold),
                0.0,
                f"|lambda| = {mpmath.nstr(lam, 6)}, |lambda|^4 = {mpmath.nstr(lam**4, 4)}",
            )

    return check


erratum(
    Twin(
        "echo.d1.remark3.printed",
        source="Echo App. D.1, Remark 3",
        statement="""At K = 4 only modes with |lambda| >= 0.85 retain more than 50% (and at K = 2, |lambda| >=
                          0.7 keeps >= 49%).""",
        quantity="""mp: value 1 for a |lambda| < 0.85 with |lambda|^4 > 0.5, held to 0.""",
        examples=(0.84375,),
    ),
    Twin(
        "echo.d1.remark3.corrected",
        source="Echo App. D.1, Remark 3 (corrected)",
        statement="""At K = 4 exactly the modes with |lambda| > 0.5^(1/4) = 0.8409 retain more than 50% (0.7^2 =
                          0.49 at K = 2 is right).""",
        quantity="""mp: value 1 for a |lambda| below 0.8409 retaining more than 50%, held to 0.""",
    ),
    check=_remark3,
    strategy=lambda: bf16_floats(0.5, 1.0, allow_zero=False),
    case_fields=("|lambda|",),
)


@claim(
    "echo.d2_d3",
    source="Echo App. D.2-D.3, Propositions D.2-D.3, eqs. (48)-(50)",
    strategy=lambda: st.tuples(_seq_cases(min_T=2), st.sampled_from((1.0, 1.25, 1.5))),
    precisions=ALL_PRECISIONS,
    implementation=_impl_solvers,
)
def _check_d2_d3(case, impl, prec) -> Measurement:
    """A^_w = A_w / max(1, sigma_max(A_w)) has ||A^_w^K|| <= 1; with gamma in [1, 1.5], ||(gamma A^_w)^K|| <= 1.5^K (=
    2.25 at K = 2).

    Measured: mp (exact sigma_max): the norms for K = 1..4. Working precisions:
    solvers.koopman.spectral_normalize(sigma='exact') has norm <= gamma (1 + allowance(1, 2)).
    """
    s_case, gamma = case
    if prec == MP:
        with mpla.exact():
            s = impl["stats_mp"](s_case)
            A_hat = impl["spectral_normalize_mp"](impl["whitened_mp"](s))
            parts = []
            P = mpla.eye(A_hat.rows)
            for K in range(1, 5):
                P = P * A_hat
                parts.append(exact_inequality(mpla.norm2(P), 1, f"||A^^{K}|| <= 1 (D.2)"))
                parts.append(
                    exact_inequality(
                        mpla.norm2(mpf(gamma) ** K * P),
                        mpf("1.5") ** K,
                        f"||(gamma A^)^{K}|| <= 1.5^{K} (D.3)",
                    )
                )
            return worst(parts)
    ar = arith(prec)
    with mpla.exact():
        s = impl["stats_mp"](s_case)
        Aw = mp_matrix_tensor(impl["whitened_mp"](s)).to(ar.dtype)
    A1 = impl["spectral_normalize"](Aw, gamma=gamma, sigma="exact", bf16_mode=ar.mode)
    n = float(torch.linalg.matrix_norm(A1.to(F64), ord=2))
    # rounding of the factor gamma / max(sigma, 1) and of the product: a few u_store (+ the float64 SVD)
    return Measurement(
        n, gamma * (1 + allowance(1.0, 2, prec)), "||gamma A_w / max(sigma_exact, 1)||_2"
    )


@formed
def _power(form):
    def check(case, impl, prec) -> Measurement:
        M = torch.tensor(case["A"], dtype=F64)
        A1 = impl["spectral_normalize"](M, gamma=1.0, sigma="power", bf16_mode="storage")
        n = float(torch.linalg.matrix_norm(A1, ord=2))
        if form == "printed":
            return Measurement(
                n, 1.0 + 8 * 2.0**-53, "||A_w / max(1, sigma_power)||_2 (D.2's <= 1)"
            )
        with mpla.exact():
            bound = impl["power_ratio_bound"](mpla.mat(case["A"]))
        return Measurement(
            n, bound * (1 + 16 * 2.0**-53), "against sqrt(1 + tan^2 theta_0 (s2/s1)^(4k))"
        )

    return check


def _power_cases():
    return st.builds(lambda A: {"A": A}, bf16_matrices(3, 3, min_value=-4.0, max_value=4.0))


erratum(
    Twin(
        "echo.f6.power.printed",
        source="Echo App. F step 6 with Props. D.2-D.3 (6 power iterations)",
        statement="""With sigma_max estimated by 6 power iterations (App. F step 6), A^_w = A_w / max(1, sigma)
                          satisfies ||A^_w|| <= 1 (Prop. D.2 as cited by the pipeline).""",
        quantity="""float64: ||A_w / max(1, sigma_power)||_2 from
                         solvers.koopman.spectral_normalize(sigma='power') against 1.""",
        examples=({"A": ((1.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 0.0, 4.0))},),
        note="""Power iteration under-estimates sigma_max (from below), so the 'normalised' operator can exceed
                     1.""",
    ),
    Twin(
        "echo.f6.power.corrected",
        source="Echo App. F step 6 (corrected bound)",
        statement="""With k power steps from v_0, ||A_w / max(1, sigma_power)|| <= sqrt(1 + tan^2 theta_0
                          (s_2/s_1)^(4k)) (analysis.references.koopman.power_ratio_bound); D.2 holds with the exact sigma_max.""",
        quantity="""float64: the norm against that bound.""",
    ),
    check=_power,
    strategy=_power_cases,
    precisions=("float64",),
    implementation=_impl_solvers,
)


# ------------------------------------------------------------------------- Appendix E, Sec. 3.2.2


@claim(
    "echo.e1",
    source="Echo App. E, Proposition E.1, eq. (51); Sec. 3.2.1 eq. (3)",
    strategy=_seq_cases,
    precisions=ALL_PRECISIONS,
    implementation=_impl_solvers,
)
def _check_e1(case, impl, prec) -> Measurement:
    """After sequence-max normalisation ||z_bar_t|| <= 1 and G_bar = sum z_bar z_bar^T has ||G_bar||_F, tr, lambda_max
    <= T.

    Measured: mp: each inequality. Working precisions: solvers.koopman.koopman_statistics (eps = 0) ||G_bar||_F <= T (1
    + theta), theta the statistics' rounding bound.
    """
    T = len(case["Z"])
    if prec == MP:
        with mpla.exact():
            Z = [mpla.vec(z) for z in case["Z"]]
            m = impl["sequence_max_mp"](Z)
            Gb = sum((mpla.outer(z / m, z / m) for z in Z), mpla.zeros(Z[0].rows, Z[0].rows))
            parts = [exact_inequality(mpla.fro(z / m), 1, "||z_bar|| <= 1") for z in Z]
            parts += [
                exact_inequality(mpla.fro(Gb), T, "||G_bar||_F <= T"),
                exact_inequality(mpmath.fsum(Gb[i, i] for i in range(Gb.rows)), T, "tr <= T"),
                exact_inequality(mpla.eigvalsh(Gb)[-1], T, "lambda_max <= T"),
            ]
            return worst(parts)
    ar = arith(prec)
    z, v = _stored_zv(case, ar)
    st_ = impl["koopman_statistics"](z, v, eps=0.0, bf16_mode=ar.mode)
    G = st_.G.to(F64)
    theta = impl["statistics_bound"](T + 1, ar, len(case["q"]))
    return Measurement(
        float(torch.linalg.matrix_norm(G)), T * (1 + theta), "||G_bar||_F (stored, eps = 0)"
    )


@claim(
    "echo.s322.conditioning",
    source="Echo Sec. 3.2.2 ('the perturbation bound (Theorem C.1) tightens as lambda_min(G~) grows')",
    strategy=lambda: _seq_cases(min_T=2),
)
def _check_conditioning(case, impl, prec) -> Measurement:
    """Longer sequences produce better-conditioned estimates through lambda_min(G~): lambda_min(G~) is non-decreasing in
    T (a PSD term z_t z_t^T is added, Weyl), so ||G~^{-1}|| = 1/lambda_min(G~) never grows.

    Measured: mp: lambda_min(G~) of each prefix against that of the next.

    Note: The sentence names lambda_min(G~) as the mechanism; it does not say that the condition number of G~ falls (it
    can grow: keys (1, 0), (1, 0), eps = 1 give kappa 2 then 3), nor that the whole bound (33) does: at fixed
    perturbations ||A|| and ||G~|| can grow with T and with them the bound (echo.s322.c1_growth).
    """
    with mpla.exact():
        mins = []
        for T in range(1, len(case["Z"]) + 1):
            s = impl["stats_mp"](dict(case, Z=case["Z"][:T], V=case["V"][:T]))
            mins.append(mpla.eigvalsh(s["Gt"])[0])
        parts = [
            exact_inequality(lo0, lo1, f"lambda_min(G~_{T}) <= lambda_min(G~_{T + 1})")
            for T, (lo0, lo1) in enumerate(zip(mins, mins[1:]), start=1)
        ]
        return worst(parts or [Measurement(0.0, 1.0, "one token")])


@claim(
    "echo.s322.c1_growth",
    source="Echo Sec. 3.2.2 with Thm. C.1, eq. (33) (question, not claimed)",
    strategy=_pert_cases,
    expected=FAILS,
    form=EXTENSION,
    examples=(
        {
            "Z": ((1.0, 0.0),) * 8,
            "V": ((0.0,),) * 8,
            "q": (0.0, 0.0),
            "eps": 1.0,
            "EM": ((1e-3, 1e-3), (1e-3, 1e-3)),
            "EG": ((1e-3, 0.0), (0.0, 1e-3)),
        },
    ),
)
def _check_c1_growth(case, impl, prec) -> Measurement:
    """Does Theorem C.1's bound (33) never grow as tokens are added (the perturbations E_M, E_G fixed)?

    Measured: mp: the bound (33) of each prefix (T >= 2) against that of the one before.

    Note: It can grow: keys (1, 0) repeated, eps = 1, E_G = 1e-3 I, E_M = 1e-3 (every entry): lambda_min(G~) stays 1
    but ||A|| = 1/3, 1/2, 7/9 and the bound is 3.00e-3, 4.00e-3, 8.99e-3 at T = 2, 3, 8; what never grows is the factor
    ||G~^{-1}|| (echo.s322.conditioning).
    """
    with mpla.exact():
        EM, EG = mpla.mat(case["EM"]), mpla.mat(case["EG"])
        bounds = []
        for T in range(2, len(case["Z"]) + 1):
            s = impl["stats_mp"](dict(case, Z=case["Z"][:T], V=case["V"][:T]))
            Gh = s["Gt"] + EG
            if mpla.eigvalsh(Gh)[0] <= 0:
                bounds.append(None)
                continue
            A = s["M"] * mpla.inv(s["Gt"])
            bounds.append(impl["c1_bound_mp"](EM, EG, A, s["Gt"], Gh))
        parts = [
            exact_inequality(
                b1, b0, f"bound (33) at T = {T + 1} ({mpmath.nstr(b1, 3)}) <= at T = {T}"
            )
            for T, (b0, b1) in enumerate(zip(bounds, bounds[1:]), start=2)
            if b0 is not None and b1 is not None
        ]
        return worst(parts or [Measurement(0.0, 1.0, "fewer than two prefixes with a lag pair")])


def _stats_rounding():
    """The stored G~ against the exact one, relative to || |G~|_abs ||_F, held to statistics_bound's theta."""

    def check(case, impl, prec) -> Measurement:
        ar = arith(prec)
        z = torch.tensor(case["Z"], dtype=F64)
        st_ = impl["koopman_statistics"](
            z.to(ar.dtype),
            torch.tensor(case["V"], dtype=F64).to(ar.dtype),
            eps=case["eps"],
            scale=1.0,
            bf16_mode=ar.mode,
        )
        with mpla.exact():
            exact_G = mp_matrix_tensor(impl["stats_mp"](case)["Gt"])
        err = float(torch.linalg.matrix_norm(st_.G.to(F64) - exact_G))
        absn = float(
            torch.linalg.matrix_norm(
                sum(torch.outer(x, x).abs() for x in z)
                + case["eps"] * torch.eye(z.shape[1], dtype=F64)
            )
        )
        theta = impl["statistics_bound"](z.shape[0] + 1, ar, z.shape[1])
        return Measurement(
            err / absn if absn > 0 else err, theta, "||G~_stored - G~||_F / || |G~|_abs ||_F"
        )

    return check


_STATS_EXAMPLES = (
    {"Z": ((1.0, 0.00390625), (1.0, 0.0)), "V": ((0.0,), (0.0,)), "q": (0.0, 0.0), "eps": 2.0**-10},
    {"Z": ((1.0,), (0.031494140625,)), "V": ((0.0,), (0.0,)), "q": (0.0,), "eps": 2.0**-10},
)
claim(
    "echo.s322.exact_stats",
    source="Echo Sec. 3.2.2 ('an exact sufficient statistic'), Sec. 3.2.3 (FP32 accumulation)",
    statement="""The statistics are exact sufficient statistics (nothing is lost to compression; the paper claims no
                      floating-point exactness); accumulated in a working precision, each entry of G~ is within theta
                      |G~|_abs of the exact one, theta ~ (T + 3) u (analysis.references.koopman.statistics_bound).""",
    quantity="""working precisions: ||G~_stored - G~||_F / || |G~|_abs ||_F from solvers.koopman.koopman_statistics
                     against theta.""",
    note="""'Exact regardless of how many tokens contributed to them' means sufficient (the next paragraph: 'not a lossy
                 bottleneck but an exact sufficient statistic'); each stored entry carries the rounding of a T-term sum
                 (keys 1, 0.031494140625, eps = 2^-10: G~ is off by 6.0e-8 in float32, one rounding).""",
    strategy=_seq_cases,
    precisions=WORKING,
    implementation=_impl_solvers,
    examples=_STATS_EXAMPLES,
)(_stats_rounding())


def mp_chunk_stats(c, S: int, ch: int):
    """Eqs. (7)-(10) for chunk ch: per-chunk sums of the earlier chunks (exclusive prefix) plus the
    boundary transitions z^_{i,0} z^_{i-1,-1}^T."""
    Z = [mpla.vec(z) for z in c["Z"]]
    V = [mpla.vec(v) for v in c["V"]]
    T, r, P = len(Z), Z[0].rows, V[0].rows
    G, M, Cv = mpf(c["eps"]) * mpla.eye(r), mpla.zeros(r, r), mpla.zeros(P, r)
    for i in range(ch):
        for t in range(i * S, min((i + 1) * S, T)):
            G += mpla.outer(Z[t], Z[t])
            Cv += mpla.outer(V[t], Z[t])
            if t > i * S:
                M += mpla.outer(Z[t], Z[t - 1])
        if i >= 1:
            M += mpla.outer(Z[i * S], Z[i * S - 1])
    return G, M, Cv


def mp_softmax_rule(beta, q):
    """The two-token softmax retrieval of Prop. I.13's proof: f(q) = 1/(1 + e^{-2 beta q})."""
    return 1 / (1 + mpmath.exp(-2 * mpf(beta) * q))


def _chunk_case():
    return st.tuples(_seq_cases(min_T=2, max_T=6, max_r=2, max_P=2), st.integers(1, 3))


@claim(
    "echo.eq7_10",
    source="Echo Sec. 3.2.2, eqs. (7)-(10) (chunk-causal mode)",
    strategy=_chunk_case,
    precisions=ALL_PRECISIONS,
    implementation=_impl_solvers,
)
def _check_chunk_causal(case, impl, prec) -> Measurement:
    """The per-chunk sums with an exclusive prefix and the boundary terms z^_{i,0} z^_{i-1,-1}^T give, for chunk c,
    exactly the prefix-mode statistics of the tokens before it.

    Measured: mp: eqs. (7)-(10) against the prefix statistics, held to 1e-30. Working precisions:
    solvers.koopman.chunk_causal_statistics against koopman_statistics on the prefix, within 2 theta.
    """
    c, S = case
    T = len(c["Z"])
    n_chunks = -(-T // S)
    if prec == MP:
        with mpla.exact():
            r, P = len(c["q"]), len(c["V"][0])
            parts = []
            for ch in range(n_chunks):
                G, M, Cv = impl["chunk_stats_mp"](c, S, ch)
                pre = impl["stats_mp"](
                    dict(
                        c, Z=c["Z"][: ch * S] or ((0.0,) * r,), V=c["V"][: ch * S] or ((0.0,) * P,)
                    )
                )
                parts += [
                    exact_identity(G, pre["Gt"], f"G^({ch})"),
                    exact_identity(M, pre["M"], f"M^({ch})"),
                    exact_identity(Cv, pre["Cv"], f"Cv^({ch})"),
                ]
            return worst(parts)
    ar = arith(prec)
    z, v = _stored_zv(c, ar)
    st_ = impl["chunk_causal_statistics"](
        z, v, chunk_size=S, eps=c["eps"], scale=1.0, bf16_mode=ar.mode
    )
    errs = []
    for ch in range(n_chunks):
        ref = (
            impl["koopman_statistics"](
                z[: ch * S], v[: ch * S], eps=c["eps"], scale=1.0, bf16_mode=ar.mode
            )
            if ch
            else None
        )
        for name in ("G", "M", "Cv"):
            got = getattr(st_, name)[ch].to(F64)
            want = (
                getattr(ref, name).to(F64)
                if ref is not None
                else (
                    c["eps"] * torch.eye(z.shape[1], dtype=F64)
                    if name == "G"
                    else torch.zeros_like(got)
                )
            )
            errs.append(float((got - want).abs().max()))
    absn = (
        float(sum(torch.outer(x, x).abs().sum() for x in torch.tensor(c["Z"], dtype=F64)))
        + c["eps"]
        + float(
            torch.tensor(c["V"], dtype=F64).abs().sum()
            * torch.tensor(c["Z"], dtype=F64).abs().sum()
        )
    )
    theta = impl["statistics_bound"](T + 1, ar, z.shape[1])
    # both sides round the same exact sums, each within theta of the absolute terms
    return Measurement(
        max(errs) / absn if absn > 0 else max(errs), 2 * theta, "chunk-causal vs prefix statistics"
    )


# ------------------------------------------------------------------ main text: eq. (11), gradient flow, Koopman MLP


@formed
def _eq11(form):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            s = impl["stats_mp"](case)
            Aw = impl["whitened_mp"](s)
            A11 = s["M"] * mpla.inv(s["Gt"])  # eq. (11)
            if form == "printed":
                return exact_identity(A11, Aw, "eq. (11)'s A_w vs eq. (22)'s")
            return worst([exact_identity(s["Li"] * A11 * s["L"], Aw, "similar (Prop. A.3)")])

    return check


_EQ11_EXAMPLE = {"Z": ((1.0, 0.0), (1.0, 1.0)), "V": ((1.0,), (0.0,)), "q": (1.0, 0.0), "eps": 1.0}
erratum(
    Twin(
        "echo.eq11.printed",
        source="Echo Sec. 3.2.3, eq. (11) vs eq. (22) / App. F step 5",
        statement="""A_w = M G^{-1} (eq. (11)), the operator normalised by eq. (12) and applied to the whitened
                          query in eq. (13).""",
        quantity="""mp: eq. (11)'s M G~^{-1} against the whitened L^{-1} M L^{-T} of eq. (22) that the pipeline
                         uses.""",
        examples=(_EQ11_EXAMPLE,),
    ),
    Twin(
        "echo.eq11.corrected",
        source="Echo Sec. 3.2.3, eq. (11) (corrected)",
        statement="""Eq. (11) defines A_eps = M G~^{-1}; the operator of eqs. (12)-(13) is its whitened similar
                          A_w = L^{-1} A_eps L.""",
        quantity="""mp: L^{-1} (M G~^{-1}) L against L^{-1} M L^{-T}.""",
    ),
    check=_eq11,
    strategy=lambda: _seq_cases(min_T=2),
)


@formed
def _gradflow(form):
    def check(case, impl, prec) -> Measurement:
        c, K = case
        with mpla.exact():
            s = impl["stats_mp"](c)
            Aw = impl["whitened_mp"](s)
            A_hat = Aw / max(mpf(1), mpla.norm2(Aw))
            Bv = s["Cv"] * mpla.inv(s["Gt"])
            J = Bv * s["L"] * (A_hat**K if K else mpla.eye(Aw.rows)) * s["Li"]
            r, P = Aw.rows, Bv.rows
            sv = mpla.singular_values(J) if P >= r else mpla.singular_values(J.T)
            rank_deficient = min(sv) <= mpf(10) ** -25 * (max(sv) + 1)
            if form == "printed":  # 'a product of full-rank matrices by construction'
                return Measurement(
                    float(rank_deficient or P < r), 0.0, f"sigma_min(J) = {mpmath.nstr(min(sv), 3)}"
                )
            # J.5: P >= r, rank(C_v) = r and A^ invertible imply rank r
            cv_sv = mpla.singular_values(s["Cv"]) if P >= r else [mpf(0)]
            hyp = (
                P >= r
                and min(cv_sv) > mpf(10) ** -25
                and (K == 0 or min(mpla.singular_values(A_hat)) > mpf(10) ** -25)
            )
            return Measurement(
                float(hyp and rank_deficient), 0.0, "J.5's hypotheses hold but J is rank deficient"
            )

    return check


_GF_EXAMPLE = ({"Z": ((1.0,),), "V": ((1.0,),), "q": (1.0,), "eps": 1.0}, 2)
erratum(
    Twin(
        "echo.s323.jacobian_full_rank.printed",
        source="Echo Sec. 3.2.3, 'Gradient flow'",
        statement="""J_SKA = B_v L A_w^K L^{-1} is a product of full-rank matrices by construction (full rank
                          r).""",
        quantity="""mp: value 1 when J has a zero singular value (or P < r), held to 0.""",
        examples=(_GF_EXAMPLE,),
        note="""One token gives M = 0, A_w = 0 and J = 0 for K >= 1; App. J.3 itself says the unconditional
                     statement is false.""",
    ),
    Twin(
        "echo.s323.jacobian_full_rank.corrected",
        source="Echo App. J.3, Proposition J.5",
        statement="""If P >= r, rank(C_v) = r and A^_w is invertible then rank(J_SKA) = r.""",
        quantity="""mp: value 1 when the hypotheses hold and J is rank deficient, held to 0.""",
    ),
    check=_gradflow,
    strategy=lambda: st.tuples(_seq_cases(), st.integers(0, 3)),
    case_fields=("sequence", "K"),
)


def _rot_cases():
    return st.lists(
        st.tuples(bf16_floats(-1.0, 1.0), bf16_floats(-1.0, 1.0)).filter(
            lambda p: p[0] ** 2 + p[1] ** 2 <= 1.0
        ),
        min_size=1,
        max_size=3,
    )


@formed
def _koopman_mlp(form):
    def check(pairs, impl, prec) -> Measurement:
        with mpla.exact():
            n = 2 * len(pairs)
            R = mpla.zeros(n, n)
            for i, (g, w) in enumerate(pairs):
                R[2 * i, 2 * i], R[2 * i, 2 * i + 1] = mpf(g), mpf(w)
                R[2 * i + 1, 2 * i], R[2 * i + 1, 2 * i + 1] = -mpf(w), mpf(g)
            sv = mpla.singular_values(R)
            if form == "printed":  # 'R is orthogonal: sigma_min = sigma_max = 1'
                return worst(
                    [
                        exact_identity(sv[0], mpf(1), "sigma_max = 1"),
                        exact_identity(sv[-1], mpf(1), "sigma_min = 1"),
                    ]
                )
            rho = [mpmath.sqrt(mpf(g) ** 2 + mpf(w) ** 2) for g, w in pairs]
            parts = [exact_identity(sv[0], max(rho), "||R|| = max rho_i")]
            for i, (g, w) in enumerate(pairs):
                Ri = mpmath.matrix([[mpf(g), mpf(w)], [-mpf(w), mpf(g)]])
                parts.append(
                    exact_identity(Ri.T * Ri, rho[i] ** 2 * mpla.eye(2), f"R_{i}^T R_{i} = rho^2 I")
                )
            return worst(parts)

    return check


erratum(
    Twin(
        "echo.s33.rotation.printed",
        source="Echo Sec. 3.3, 'Gradient preservation'",
        statement="""The block-diagonal matrix R of eq. (14) is orthogonal: ||R||_2 = 1, sigma_min(R) =
                          sigma_max(R) = 1 (with |lambda_i| <= 1 clamped, as the same section prescribes).""",
        quantity="""mp: sigma_max and sigma_min of R against 1.""",
        examples=([(0.5, 0.0)],),
    ),
    Twin(
        "echo.s33.rotation.corrected",
        source="Echo App. J.4, Proposition J.7",
        statement="""Each block is rho_i times a rotation (R_i^T R_i = rho_i^2 I), so ||R||_2 = max_i rho_i <=
                          1; R is orthogonal only when every rho_i = 1.""",
        quantity="""mp: both identities, held to 1e-30.""",
    ),
    check=_koopman_mlp,
    strategy=_rot_cases,
    case_fields=("blocks (gamma_i, omega_i)",),
)


# ------------------------------------------------------------------------- Appendix I


def _ridge_loss(s, B):
    return (
        mpmath.fsum(mpla.dot(v - B * z, v - B * z) for v, z in zip(s["V"], s["Z"]))
        + mpf(s["eps"]) * mpla.fro(B) ** 2
    )


@claim(
    "echo.i2_i3", source="Echo App. I.2, Propositions I.2-I.3, eqs. (63)-(75)", strategy=_seq_cases
)
def _check_i2_i3(case, impl, prec) -> Measurement:
    """B* = C_v G~^{-1} is the unique minimiser of L(B) = sum ||v_t - B k_t||^2 + eps ||B||_F^2, and L(B) - L(B*) = ||(B
    - B*) G~^{1/2}||_F^2 for every B.

    Measured: mp: the gradient at B* (mpmath.diff) and the excess-risk identity at B* + 1 q^T, held to 1e-30.
    """
    with mpla.exact():
        s = dict(impl["stats_mp"](case), eps=case["eps"])
        Bs = impl["ridge_readout_mp"](s)
        g = mpla.matrix_grad(lambda B: _ridge_loss(s, B), Bs)
        parts = [
            Measurement(
                float(mpla.fro(g)),
                float(mpla.exact_tol() * (mpla.fro(s["Cv"]) + 1)),
                "grad L(B*) (I.2)",
            )
        ]
        B = Bs + mpla.outer(mpla.vec([1] * Bs.rows), s["q"])  # another B
        E, Q = mpla.eigh(s["Gt"])
        half = Q * mpmath.diag([mpmath.sqrt(e) for e in E]) * Q.T
        parts.append(
            exact_identity(
                _ridge_loss(s, B) - _ridge_loss(s, Bs),
                mpla.fro((B - Bs) * half) ** 2,
                "excess risk (I.3)",
            )
        )
        return worst(parts)


@claim(
    "echo.i5",
    source="Echo App. I.4, Proposition I.5, eqs. (79)-(81); Sec. 3.2.3",
    strategy=_seq_cases,
)
def _check_i5(case, impl, prec) -> Measurement:
    """Linear attention C_v q is the prediction after one gradient step of size 1/2 on L(B) from B = 0.

    Measured: mp: (0 - grad L(0)/2) q against C_v q, the gradient by mpmath.diff.
    """
    with mpla.exact():
        s = dict(impl["stats_mp"](case), eps=case["eps"])
        B0 = mpla.zeros(s["Cv"].rows, s["Cv"].cols)
        g = mpla.matrix_grad(lambda B: _ridge_loss(s, B), B0)
        B1 = B0 - g / 2
        return exact_identity(
            B1 * s["q"], impl["linear_attention_mp"](s) * s["q"], "one GD step, alpha = 1/2"
        )


@claim("echo.i6", source="Echo App. I.4, Theorem I.6, eqs. (82)-(88)", strategy=_seq_cases)
def _check_i6(case, impl, prec) -> Measurement:
    """min_{a>0} ||y_lin(q) - a y_ridge(q)|| <= ||C_v|| (kappa - 1)/(kappa + 1) ||q||, the operator-norm factor min_a
    ||I - a G~^{-1}|| = (kappa - 1)/(kappa + 1) attained at a* = 2 lambda_min lambda_max/(lambda_min + lambda_max); G~ =
    c I gives equality with a = c.

    Measured: mp: the minimal operator norm and its minimiser (against four other a), the bound at a*.
    """
    with mpla.exact():
        s = impl["stats_mp"](case)
        ev = mpla.eigvalsh(s["Gt"])
        lmin, lmax = ev[0], ev[-1]
        kappa = lmax / lmin
        a_star = impl["a_star_mp"](lmin, lmax)
        Gi = mpla.inv(s["Gt"])
        I = mpla.eye(Gi.rows)
        op = mpla.norm2(I - a_star * Gi)
        parts = [
            exact_identity(
                op, (kappa - 1) / (kappa + 1), "||I - a* G~^{-1}|| = (kappa-1)/(kappa+1)"
            )
        ]
        for a in (
            a_star * mpf("0.9"),
            a_star * mpf("1.1"),
            lmin,
            lmax,
        ):  # a* minimises the operator norm
            parts.append(exact_inequality(op, mpla.norm2(I - a * Gi), "a* is the minimiser"))
        lin, ridge = s["Cv"] * s["q"], s["Cv"] * Gi * s["q"]
        parts.append(
            exact_inequality(
                mpla.fro(lin - a_star * ridge),
                mpla.norm2(s["Cv"]) * (kappa - 1) / (kappa + 1) * mpla.fro(s["q"]),
                "the bound at a*",
            )
        )
        return worst(parts)


@formed
def _regime(form):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            s = impl["stats_mp"](case)
            ev, Q = mpla.eigh(s["Gt"])
            kappa = ev[-1] / ev[0]
            if form == "printed":
                # 'unavoidable error proportional to (kappa-1)/(kappa+1)': a lower bound for every q. Take q = an eigenvector:
                q = Q[:, 0]
                err = mpla.fro(
                    s["Cv"] * q - ev[0] * (s["Cv"] * mpla.inv(s["Gt"]) * q)
                )  # a = lambda: exact
                floor = (kappa - 1) / (kappa + 1) * mpla.norm2(s["Cv"]) * mpla.fro(q)
                if floor == 0:
                    return Measurement(0.0, 1.0, "kappa = 1 or C_v = 0: nothing to refute")
                return Measurement(
                    float(floor - err), 0.0, "error for an eigenvector query vs the claimed floor"
                )
            Gi = mpla.inv(s["Gt"])
            a_star = 2 * ev[0] * ev[-1] / (ev[0] + ev[-1])
            return exact_identity(
                mpla.norm2(mpla.eye(Gi.rows) - a_star * Gi),
                (kappa - 1) / (kappa + 1),
                "minimax value",
            )

    return check


_REGIME_EXAMPLE = {"Z": ((1.0, 0.0),), "V": ((1.0,),), "q": (1.0, 0.0), "eps": 1.0}
erratum(
    Twin(
        "echo.i10.regime.printed",
        source="Echo App. I.10, 'Regime summary' (second point)",
        statement="""When the key Gram is anisotropic, linear attention has an unavoidable error proportional to
                          (kappa - 1)/(kappa + 1).""",
        quantity="""mp: for q an eigenvector of G~ (and a = its eigenvalue) the error against
                         (kappa-1)/(kappa+1) ||C_v|| ||q||; value = floor - error, held to 0 (a lower bound must not
                         exceed the error).""",
        examples=(_REGIME_EXAMPLE,),
    ),
    Twin(
        "echo.i10.regime.corrected",
        source="Echo App. I.4/I.10 (corrected)",
        statement="""(kappa - 1)/(kappa + 1) is the minimax value min_a max_q of the relative error (with C_v =
                          I), an upper bound for each q (Thm. I.6), not an unavoidable error: eigenvector queries are
                          retrieved exactly.""",
        quantity="""mp: min_a ||I - a G~^{-1}||_2 = (kappa-1)/(kappa+1).""",
    ),
    check=_regime,
    strategy=_seq_cases,
)


@claim(
    "echo.i7_i10",
    source="Echo App. I.5-I.6, Propositions I.7, I.8, I.10, Corollary I.9; App. F steps 7-10",
    strategy=lambda: st.tuples(_seq_cases(), st.integers(0, 3)),
    precisions=ALL_PRECISIONS,
    implementation=_impl_solvers,
)
def _check_i7_i9(case, impl, prec) -> Measurement:
    """The two triangular solves give B_v = C_v G~^{-1}; the SKA output is eta C_v G~^{-1} Phi_K q with Phi_K = L A^^K
    L^{-1}; K = 0 gives eta y_ridge; y/eta - y_ridge = B*(Phi_K - I) q and L(B* Phi_K) - L(B*) = ||B*(Phi_K - I)
    G~^{1/2}||_F^2.

    Measured: mp: each identity, held to 1e-30. Working precisions: solvers.koopman.ridge_readout against C_v G~^{-1} q,
    error / (||C_v|| ||q|| / lambda_min) <= allowance(kappa(G~), r + T) + kappa theta.
    """
    c, K = case
    if prec == MP:
        with mpla.exact():
            s = impl["stats_mp"](c)
            Y = mpla.solve(s["L"], s["Cv"].T)  # (89)
            Z = mpla.solve(s["L"].T, Y)  # (90)
            Bs = s["Cv"] * mpla.inv(s["Gt"])
            Aw = impl["whitened_mp"](s)
            A_hat = Aw / max(mpf(1), mpla.norm2(Aw))
            Phi = s["L"] * (A_hat**K if K else mpla.eye(Aw.rows)) * s["Li"]
            y = impl["ska_mp"](s, A_hat, K, eta=mpf("1.5"))
            parts = [
                exact_identity(Z.T, Bs, "B_v = Z^T = C_v G~^{-1} (I.7)"),
                exact_identity(
                    y, mpf("1.5") * Bs * Phi * s["q"], "y = eta C_v G~^{-1} Phi_K q (I.8)"
                ),
                exact_identity(
                    y - mpf("1.5") * Bs * s["q"],
                    mpf("1.5") * Bs * (Phi - mpla.eye(Aw.rows)) * s["q"],
                    "I.10 (1)",
                ),
            ]
            if K == 0:
                parts.append(
                    exact_identity(y, mpf("1.5") * Bs * s["q"], "K = 0: eta y_ridge (I.9)")
                )
            BK = Bs * Phi
            E, Q = mpla.eigh(s["Gt"])
            half = Q * mpmath.diag([mpmath.sqrt(e) for e in E]) * Q.T
            sd = dict(s, eps=c["eps"])
            parts.append(
                exact_identity(
                    _ridge_loss(sd, BK) - _ridge_loss(sd, Bs),
                    mpla.fro(Bs * (Phi - mpla.eye(Aw.rows)) * half) ** 2,
                    "I.10 (2)",
                )
            )
            return worst(parts)
    ar = arith(prec)
    z, v = _stored_zv(c, ar)
    with mpla.exact():
        s = impl["stats_mp"](c)
        ev = mpla.eigvalsh(s["Gt"])
        truth = s["Cv"] * mpla.inv(s["Gt"]) * s["q"]
        scale = float(mpla.norm2(s["Cv"]) * mpla.fro(s["q"]) / ev[0]) + 1e-300
        kappa = float(ev[-1] / ev[0])
    theta = impl["statistics_bound"](z.shape[0] + 1, ar, z.shape[1])
    bound = allowance(kappa, z.shape[1] + z.shape[0], prec) + kappa * theta
    if (
        bound >= 1.0
    ):  # kappa(G~) u >~ 1: rounding may make the stored G~ indefinite; no accuracy is claimed
        return Measurement(0.0, 1.0, f"kappa(G~) = {kappa:.3g}: the allowance does not apply")
    st_ = impl["koopman_statistics"](z, v, eps=c["eps"], scale=1.0, bf16_mode=ar.mode)
    y = impl["ridge_readout"](st_, torch.tensor([c["q"]], dtype=F64).to(ar.dtype))[0].to(F64)
    err = float(torch.linalg.vector_norm(y - mp_vector_tensor(truth)))
    # statistics rounding (theta) plus the Cholesky solves (allowance with kappa(G~)), relative to ||C_v|| ||q|| / lambda_min
    return Measurement(err / scale, bound, "ridge readout")


def _normal_cases():
    @st.composite
    def build(draw):
        c = draw(_seq_cases(min_T=1, max_T=4, max_r=3))
        r = len(c["q"])
        delta = draw(st.sampled_from((0.0, 0.0625, 0.25)))
        rho = draw(st.sampled_from((0.0, 0.25, 0.5, 0.9375)))
        n_pers = draw(st.integers(0, r))
        lams = [
            draw(bf16_floats(1.0 - delta, 1.0 + delta, allow_zero=False)) for _ in range(n_pers)
        ]
        lams += [draw(bf16_floats(-rho, rho)) for _ in range(r - n_pers)]
        basis = draw(
            bf16_matrices(r, r, **_ENTRY).filter(
                lambda B: abs(torch.linalg.det(torch.tensor(B, dtype=F64))) > 0.1
            )
        )
        return dict(
            c,
            lams=tuple(lams),
            n_pers=n_pers,
            delta=delta,
            rho=rho,
            basis=basis,
            K=draw(st.integers(0, 3)),
        )

    return build()


@claim(
    "echo.i11_i12",
    source="Echo App. I.7, Theorem I.11 and Corollary I.12, eqs. (100)-(104)",
    strategy=_normal_cases,
)
def _check_i11(case, impl, prec) -> Measurement:
    """For normal A^ with eigenvalues |1 - lambda| <= delta (persistent) or |lambda| <= rho < 1 (transient): ||y/eta -
    C_v L^{-T} q_pers|| <= ||C_v L^{-T}|| (((1+delta)^K - 1)||q_pers|| + rho^K ||q_trans||), and at K = 0 the error is
    <= ||C_v L^{-T}|| ||q_trans||.

    Measured: mp: both inequalities for symmetric A^ = Q diag(lambda) Q^T built to the hypotheses.

    Note: The corollary's comparison ('strictly smaller upper bound whenever ...') is the algebra of the two bounds.
    """
    with mpla.exact():
        s = impl["stats_mp"](case)
        Qm, _ = mpmath.qr(
            mpla.mat(case["basis"])
        )  # orthonormal eigenvectors: A^ symmetric, hence normal
        lams = [mpf(l) for l in case["lams"]]
        A_hat = Qm * mpmath.diag(lams) * Qm.T
        K, n_p = case["K"], case["n_pers"]
        qw = s["Li"] * s["q"]
        coef = Qm.T * qw
        q_p = sum((coef[i] * Qm[:, i] for i in range(n_p)), mpla.zeros(qw.rows))
        q_t = qw - q_p
        CL = s["Cv"] * s["Li"].T
        y = impl["ska_mp"](s, A_hat, K)
        lhs = mpla.fro(y - CL * q_p)
        d, rho = mpf(case["delta"]), mpf(case["rho"])
        rhs = mpla.norm2(CL) * (((1 + d) ** K - 1) * mpla.fro(q_p) + rho**K * mpla.fro(q_t))
        y0 = impl["ska_mp"](s, A_hat, 0)
        parts = [
            exact_inequality(lhs, rhs, "Theorem I.11"),
            exact_inequality(
                mpla.fro(y0 - CL * q_p), mpla.norm2(CL) * mpla.fro(q_t), "Corollary I.12 (K = 0)"
            ),
        ]
        return worst(parts)


@claim(
    "echo.i13",
    source="Echo App. I.8, Proposition I.13",
    strategy=lambda: st.tuples(
        bf16_floats(2.0**-4, 4.0, allow_zero=False), bf16_floats(-2.0, 2.0), bf16_floats(-2.0, 2.0)
    ),
)
def _check_i13(case, impl, prec) -> Measurement:
    """A fixed-statistic SKA head is linear in q; the two-token softmax rule f(q) = 1/(1 + e^{-2 beta q}) is not (f'' !=
    0 away from 0), so it cannot be represented by any SKA head.

    Measured: mp: f'' at two points (mpmath.diff); value 1 if it vanishes at a nonzero point.
    """
    beta, q1, q2 = case
    with mpla.exact():
        f = lambda q: impl["softmax_rule_mp"](beta, q)  # noqa: E731
        s2 = abs(mpmath.diff(f, mpf(q1), 2)) + abs(mpmath.diff(f, mpf(q2), 2))
        # nonlinear: f'' is not identically 0 (it vanishes only at q = 0)
        nonlinear = s2 > mpf(10) ** -40 or (q1 == 0 and q2 == 0)
        return Measurement(float(not nonlinear), 0.0, f"|f''| = {mpmath.nstr(s2, 3)}")


@claim(
    "echo.i14",
    source="Echo App. I.9, Proposition I.14; Sec. 3.5",
    strategy=lambda: st.tuples(st.integers(1, 128), st.integers(1, 128), st.integers(1, 10**6)),
)
def _check_i14(case, impl, prec) -> Measurement:
    """SKA stores 2r^2 + Pr + r + 1 floats per head, an explicit cache T(r + P); SKA is smaller exactly when T > (2r^2 +
    Pr + r + 1)/(r + P).

    Measured: exact integer arithmetic: the comparison and the crossover agree (value 1 if not).
    """
    r, P, T = case
    ska = sum(impl["state_components"](r, P))  # G, M, C_v, the previous key, the max norm
    cache = T * (r + P)
    crossover = mpmath.mpf(2 * r * r + P * r + r + 1) / (r + P)
    consistent = (ska < cache) == (T > crossover) and ska == 2 * r * r + P * r + r + 1
    return Measurement(
        float(not consistent), 0.0, f"r={r}, P={P}, T={T}: SKA {ska} vs cache {cache}"
    )


# ------------------------------------------------------------------------- Appendix J


@claim(
    "echo.j1",
    source="Echo App. J.1, Proposition J.1",
    strategy=lambda: st.tuples(bf16_matrices(3, 4, **_ENTRY), bf16_matrices(4, 2, **_ENTRY)),
)
def _check_j1(case, impl, prec) -> Measurement:
    """The hidden-state gradient G_H = G_L W after the LM head has rank <= rank(W) <= D.

    Measured: mp: numerical ranks (singular values > 1e-30).
    """
    GL, W = case
    with mpla.exact():
        GH = impl["lm_head_grad_mp"](mpla.mat(GL), mpla.mat(W))
        rank = lambda X: sum(
            1 for s in mpla.singular_values(X if X.rows >= X.cols else X.T) if s > mpf(10) ** -30
        )  # noqa: E731
        D = len(W[0])
        return worst(
            [
                exact_inequality(rank(GH), rank(mpla.mat(W)), "rank G_H <= rank W"),
                exact_inequality(rank(mpla.mat(W)), D, "<= D"),
            ]
        )


def _attn_cases():
    @st.composite
    def build(draw):
        T, r, P = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
        return {
            "K": draw(bf16_matrices(T, r, **_ENTRY)),
            "V": draw(bf16_matrices(T, P, **_ENTRY)),
            "q": draw(bf16_vectors(r, min_value=-4.0, max_value=4.0)),
        }

    return build()


def _softmax_parts(case):
    K, V, q = mpla.mat(case["K"]), mpla.mat(case["V"]), mpla.vec(case["q"])
    dk = K.cols
    logits = K * q / mpmath.sqrt(dk)
    mx = max(logits)
    e = [mpmath.exp(x - mx) for x in logits]
    alpha = mpla.vec([x / mpmath.fsum(e) for x in e])
    S = mpmath.diag(list(alpha)) - mpla.outer(alpha, alpha)
    return K, V, q, dk, alpha, S


@claim(
    "echo.j2_j3",
    source="Echo App. J.2, Proposition J.2 (eqs. (105)-(113)) and Corollary J.3",
    strategy=_attn_cases,
)
def _check_j2_j3(case, impl, prec) -> Measurement:
    """J_attn = V^T (Diag(alpha) - alpha alpha^T) K / sqrt(d_k); rank <= min(P, r, T-1); ||J|| <= ||V|| ||K|| / (2
    sqrt(d_k)); ||S|| <= 2(1 - max alpha), so J -> 0 as attention saturates.

    Measured: mp: the Jacobian against mpmath.diff, numerical rank, and the three norm bounds.
    """
    with mpla.exact():
        K, V, q, dk, alpha, S = _softmax_parts(case)

        def y(qs):
            l = K * mpla.vec(qs) / mpmath.sqrt(dk)
            mx = max(l)
            e = [mpmath.exp(x - mx) for x in l]
            a = mpla.vec([x / mpmath.fsum(e) for x in e])
            return V.T * a

        J = impl["attention_jacobian_mp"](V, S, K, dk)
        cols = [mpla.vec(mpla.grad(lambda qs, p=p: y(qs)[p], list(q))) for p in range(V.cols)]
        Jd = mpmath.matrix([[cols[p][j] for j in range(q.rows)] for p in range(V.cols)])
        T, r, P = K.rows, K.cols, V.cols
        sv = mpla.singular_values(J if J.rows >= J.cols else J.T)
        rank = sum(1 for s_ in sv if s_ > mpf(10) ** -30 * (max(sv) + 1))
        m = max(alpha)
        nV, nK = mpla.norm2(V), mpla.norm2(K)
        return worst(
            [
                exact_identity(J, Jd, "J_attn = V^T S K / sqrt(d_k) (J.2)"),
                exact_inequality(rank, min(P, r, T - 1), "rank <= min(P, r, T-1) (108)"),
                exact_inequality(
                    mpla.norm2(J),
                    nV * nK / (2 * mpmath.sqrt(dk)),
                    "||J|| <= ||V|| ||K|| / (2 sqrt d_k) (109)",
                ),
                exact_inequality(mpla.norm2(S), 2 * (1 - m), "||S|| <= 2 (1 - max alpha) (J.3)"),
                exact_inequality(
                    mpla.norm2(J), 2 * (1 - m) * nV * nK / mpmath.sqrt(dk), "J.3 bound"
                ),
            ]
        )


@claim(
    "echo.j4_j6",
    source="Echo App. J.3, Propositions J.4-J.6",
    strategy=lambda: st.tuples(_seq_cases(), st.integers(0, 3), st.sampled_from((1.0, 1.5, 2.5))),
)
def _check_j4_j6(case, impl, prec) -> Measurement:
    """J_SKA = eta B_v L A^^K L^{-1}; ||J|| <= eta ||B_v|| gamma^K sqrt((||G|| + eps)/eps) when ||A^|| <= gamma; under
    J.5's hypotheses sigma_min(J) >= eta sigma_min(B_v) nu^K sqrt(eps/(||G|| + eps)).

    Measured: mp: the Jacobian against mpmath.diff and both singular-value bounds.
    """
    c, K, eta = case
    with mpla.exact():
        s = impl["stats_mp"](c)
        Aw = impl["whitened_mp"](s)
        gamma = max(mpf(1), mpla.norm2(Aw))
        A_hat = Aw / gamma * mpf("1.5")  # ||A^|| <= 1.5 = gamma of J.4
        Bv = s["Cv"] * mpla.inv(s["Gt"])
        Phi = s["L"] * (A_hat**K if K else mpla.eye(Aw.rows)) * s["Li"]
        J = impl["ska_jacobian_mp"](
            mpf(eta), Bv, s["L"], A_hat**K if K else mpla.eye(Aw.rows), s["Li"]
        )
        Jd = mpmath.matrix(
            [
                [
                    x
                    for x in mpla.grad(
                        lambda qs, p=p: (mpf(eta) * Bv * Phi * mpla.vec(qs))[p], list(s["q"])
                    )
                ]
                for p in range(Bv.rows)
            ]
        )
        nG, eps = mpla.norm2(s["G"]), mpf(c["eps"])
        parts = [
            exact_identity(J, Jd, "J_SKA (J.4)"),
            exact_inequality(
                mpla.norm2(J),
                mpf(eta) * mpla.norm2(Bv) * mpla.norm2(A_hat) ** K * mpmath.sqrt((nG + eps) / eps),
                "J.4 bound",
            ),
        ]
        P, r = Bv.rows, Bv.cols
        if P >= r:
            sB, sA = mpla.sigma_min(Bv), mpla.singular_values(A_hat)[-1]
            tiny = (
                mpf(10) ** -25
            )  # J.5's hypotheses: rank(C_v) = r and A^ invertible (50-digit SVD noise is ~1e-50)
            if sB > tiny * (mpla.norm2(Bv) + 1) and (K == 0 or sA > tiny):
                parts.append(
                    exact_inequality(
                        mpf(eta) * sB * sA**K * mpmath.sqrt(eps / (nG + eps)),
                        mpla.sigma_min(J),
                        "J.6",
                    )
                )
        return worst(parts)


@claim(
    "echo.j7_j8",
    source="Echo App. J.4, Propositions J.7-J.8",
    strategy=lambda: st.tuples(
        _rot_cases(),
        bf16_matrices(6, 2, **_ENTRY),
        bf16_matrices(2, 6, **_ENTRY),
        bf16_vectors(2, **_ENTRY),
    ),
)
def _check_j7_j8(case, impl, prec) -> Measurement:
    """J_KMLP = W_read R D_SiLU(a) W_lift and ||J_KMLP|| <= c_SiLU ||W_read|| ||W_lift||, c_SiLU = sup |SiLU'| (=
    1.0998).

    Measured: mp: the Jacobian against mpmath.diff and the norm bound (c_SiLU computed as the maximum of SiLU').
    """
    pairs, W_lift, W_read, h = case
    with mpla.exact():
        n = 2 * len(pairs)
        R = mpla.zeros(n, n)
        for i, (g, w) in enumerate(pairs):
            R[2 * i, 2 * i], R[2 * i, 2 * i + 1], R[2 * i + 1, 2 * i], R[2 * i + 1, 2 * i + 1] = (
                mpf(g),
                mpf(w),
                -mpf(w),
                mpf(g),
            )
        Wl, Wr, hv = mpla.mat(W_lift)[:n, :], mpla.mat(W_read)[:, :n], mpla.vec(h)
        silu = lambda x: x / (1 + mpmath.exp(-x))  # noqa: E731
        dsilu = lambda x: mpmath.diff(silu, x)  # noqa: E731

        def f(hs):
            a = Wl * mpla.vec(hs)
            return Wr * (R * mpla.vec([silu(x) for x in a]))

        a = Wl * hv
        J = impl["kmlp_jacobian_mp"](Wr, R, mpmath.diag([dsilu(x) for x in a]), Wl)
        Jd = mpmath.matrix(
            [[x for x in mpla.grad(lambda hs, p=p: f(hs)[p], list(hv))] for p in range(Wr.rows)]
        )
        # c_SiLU = sup |SiLU'| = SiLU'(x0) at the root x0 of SiLU'' (about 2.3994)
        x0 = mpmath.findroot(lambda x: mpmath.diff(silu, x, 2), 2.4)
        c = dsilu(x0)
        return worst(
            [
                exact_identity(J, Jd, "J_KMLP (J.8)"),
                exact_inequality(
                    mpla.norm2(J),
                    c * mpla.norm2(Wr) * mpla.norm2(Wl),
                    f"J.8 bound, c_SiLU = {mpmath.nstr(c, 6)}",
                ),
            ]
        )


@claim(
    "echo.j9",
    source="Echo App. J.5, Theorem J.9",
    strategy=lambda: st.tuples(
        st.lists(bf16_matrices(2, 2, **_ENTRY), min_size=1, max_size=4), bf16_vectors(2, **_ENTRY)
    ),
)
def _check_j9(case, impl, prec) -> Measurement:
    """||g_l|| <= (prod_j ||J_j||) ||g_head|| for g_l = J_{l+1}^T ... J_m^T g_head (the three corollary bounds follow by
    substituting Props. J.2, J.3, J.4, J.8, each checked above).

    Measured: mp: the product bound for random square Jacobians.
    """
    mats, g = case
    with mpla.exact():
        Js = [mpla.mat(m) for m in mats]
        x = mpla.vec(g)
        for J in reversed(Js):  # g_l = J_{l+1}^T ... J_m^T g_head
            x = J.T * x
        bound = mpla.fro(mpla.vec(g))
        for J in Js:
            bound *= impl["spectral_norm_mp"](J)
        return exact_inequality(mpla.fro(x), bound, "||g_l|| <= prod ||J_j|| ||g_head||")


not_checkable(
    "echo.experiments",
    paper="echo",
    source="Echo Secs. 4-5, Tables 2-4, Figs. 1-6, App. G-H",
    text="""
    Retrieval accuracies, perplexities and benchmark scores.

    Why: Training runs; the reported numbers' arithmetic is checked by echo reported-number claims.""",
)
not_checkable(
    "echo.s323.attention_solves_ridge",
    paper="echo",
    source="Echo Sec. 3.2.3, Sec. 6.1 (Goel et al.)",
    text="""
    Softmax attention trained to convergence implicitly solves the ridge objective.

    Why: A cited theorem about training dynamics of another model.""",
)
not_checkable(
    "echo.s323.rank_compression",
    paper="echo",
    source="Echo Sec. 3.2.3, 'Gradient flow'",
    text="""
    Softmax layers compress gradients by an entropy-dependent effective rank that compounds across depth.

    Why: Qualitative (cites Godey and Artzi); its precise content is Props. J.1-J.3 and J.9, checked.""",
)


# --------------------------------------------------------- Sec. 3.2.1 footnote 1, Sec. 3.2.3 estimator


def mp_rescale(s, rho, eps, rule):
    """Statistics re-expressed for keys scaled by rho = m_old/m_new: 'printed' multiplies every statistic
    by rho^2 (footnote 1); 'corrected' scales the data part of G~ and M by rho^2 and C_v by rho."""
    I = mpla.eye(s["Gt"].rows)
    if rule == "printed":
        return rho**2 * s["Gt"], rho**2 * s["M"], rho**2 * s["Cv"]
    return eps * I + rho**2 * (s["Gt"] - eps * I), rho**2 * s["M"], rho * s["Cv"]


@formed
def _footnote(form):
    def check(case, impl, prec) -> Measurement:
        c, factor = case
        with mpla.exact():
            rho = 1 / mpf(factor)  # m_new = factor m_old
            s = impl["stats_mp"](c)
            G, M, Cv = impl["rescale_mp"](s, rho, mpf(c["eps"]), form)
            fresh = impl["stats_mp"](
                dict(c, Z=tuple(tuple(x * float(rho) for x in z) for z in c["Z"]))
            )
            return worst(
                [
                    exact_identity(G, fresh["Gt"], "G~"),
                    exact_identity(M, fresh["M"], "M"),
                    exact_identity(Cv, fresh["Cv"], "C_v"),
                ]
            )

    return check


_FOOT_EXAMPLE = ({"Z": ((1.0,),), "V": ((1.0,),), "q": (0.0,), "eps": 1.0}, 2.0)
erratum(
    Twin(
        "echo.s321.footnote1.printed",
        source="Echo Sec. 3.2.1, footnote 1",
        statement="""When the frozen normaliser changes from m_old to m_new, rescaling all statistics by
                          (m_old/m_new)^2 gives those of the renormalised keys.""",
        quantity="""mp: the rescaled G~, M, C_v against statistics recomputed from keys scaled by m_old/m_new
                         (factor a power of 2).""",
        examples=(_FOOT_EXAMPLE,),
    ),
    Twin(
        "echo.s321.footnote1.corrected",
        source="Echo Sec. 3.2.1, footnote 1 (corrected)",
        statement="""G~ <- eps I + rho^2 (G~ - eps I), M <- rho^2 M, C_v <- rho C_v with rho = m_old/m_new (C_v
                          is linear in the keys; eps I is not data).""",
        quantity="""mp: against recomputed statistics, held to 1e-30.""",
    ),
    check=_footnote,
    strategy=lambda: st.tuples(_seq_cases(), st.sampled_from((0.5, 2.0, 4.0))),
    case_fields=("sequence", "m_new/m_old"),
)


@formed
def _layer_estimator(form):
    def check(c, impl, prec) -> Measurement:
        with mpla.exact():
            s = impl["stats_mp"](c)
            A = impl["koopman_estimator_mp"](
                s["M"], s["Gt"]
            )  # the layer's M G~^{-1}, G~ of eq. (4)
            Z, eps = s["Z"], mpf(c["eps"])

            def obj(Am):
                o = mpmath.fsum(
                    mpla.dot(Z[t + 1] - Am * Z[t], Z[t + 1] - Am * Z[t]) for t in range(len(Z) - 1)
                )
                if form == "corrected":  # the last key regressed onto 0
                    o += mpla.dot(Am * Z[-1], Am * Z[-1])
                return o + eps * mpla.fro(Am) ** 2

            g = mpla.matrix_grad(obj, A)
            return Measurement(
                float(mpla.fro(g)),
                float(mpla.exact_tol() * (mpla.fro(s["M"]) + 1)),
                "||grad|| at M G~^{-1}",
            )

    return check


_LAYER_EXAMPLE = {"Z": ((1.0,), (1.0,)), "V": ((0.0,), (0.0,)), "q": (0.0,), "eps": 1.0}
erratum(
    Twin(
        "echo.s323.layer_estimator.printed",
        source="Echo Sec. 3.2.3 with eq. (4) and Prop. A.1/A.2 (as the abstract's 'fits' and Sec. 2.3 suggest)",
        statement="""The layer's A = M G~^{-1}, with G~ of eq. (4) (sum over all T tokens), is the ridge Koopman
                          estimator of Props. A.1-A.2: the minimiser of sum_{t<T} ||z_{t+1} - A z_t||^2 + eps ||A||_F^2.""",
        quantity="""mp: the gradient of that objective at M G~^{-1}.""",
        examples=(_LAYER_EXAMPLE,),
        note="""The paper does not identify the two: SKA 'adapts the same least-squares estimation structure' (Sec.
                     2.3) and 'fits a whitened Koopman operator' (abstract); Props. A.2-A.3 and C.1 hold for any M, G.
                     Prop. A.1's G sums t = 1..T-1 (eq. (16)); eqs. (4) and (53) include the last token (the Gram
                     matrix is shared with B_v), so the layer's operator minimises the objective with ||A z_T||^2 added
                     and differs from A.1's estimator by O(r/T): 31% at T = 64, 0.6% at T = 1024 (r = 48).""",
    ),
    Twin(
        "echo.s323.layer_estimator.corrected",
        source="Echo Sec. 3.2.3 (corrected)",
        statement="""M G~^{-1} minimises sum_{t<T} ||z_{t+1} - A z_t||^2 + ||A z_T||^2 + eps ||A||_F^2 (the last
                          key regressed onto 0).""",
        quantity="""mp: the gradient of that objective at M G~^{-1}, held to 1e-30.""",
    ),
    check=_layer_estimator,
    strategy=lambda: _seq_cases(min_T=2),
)


# ------------------------------------------------------------------- chunk-causal mode and the sequence max


def _chunk_causal_impl():
    impl = dict(_impl())
    for name in ("chunk_causal_statistics", "koopman_readout", "sequence_max_scale"):
        impl[name] = attr("solvers.koopman", name)
    return impl


def _late_token_cases():
    """A sequence of 3 chunks (S = 4, r = 2, P = 2, AR(1)-like keys from a seed) and the factor its last key is scaled by."""
    return st.tuples(st.integers(0, 2**16), st.sampled_from((2.0, 10.0)))


@formed
def _chunk_causal(form):
    """Eqs. (7)-(10) estimate chunk c's operator 'from strictly preceding chunks'. ``printed``: keys divided by eq. (3)'s
    m = max_{s<=T} ||z_s|| (a max over the whole sequence); ``corrected``: by a scale fixed before the sequence (here the
    first chunk's max, as a decoder would freeze it). Measured: the change of chunks 0-1's outputs when only the last
    token (chunk 2) changes, held to 0 (the outputs must be bitwise the same)."""

    def check(case, impl, prec) -> Measurement:
        seed, factor = case
        g = torch.Generator().manual_seed(seed)
        T, S = 12, 4
        e = torch.randn(T, 2, generator=g, dtype=F64)
        z = e.clone()
        for t in range(1, T):
            z[t] = 0.8 * z[t - 1] + e[t]
        v = torch.randn(T, 2, generator=g, dtype=F64)
        zq = torch.randn(3, 2, 2, generator=g, dtype=F64)
        late = z.clone()
        late[-1] = factor * late[-1]
        scale = None if form == "printed" else impl["sequence_max_scale"](z[:S])
        outs = [
            impl["koopman_readout"](
                impl["chunk_causal_statistics"](x, v, chunk_size=S, scale=scale), zq
            )
            for x in (z, late)
        ]
        change = float((outs[0][:2] - outs[1][:2]).abs().max())
        return Measurement(
            change, 0.0, f"max change of chunks 0-1 when token {T - 1} is scaled by {factor:g}"
        )

    return check


erratum(
    Twin(
        "echo.chunk_causal.printed",
        source="Echo Sec. 3.2.1 chunk-causal mode, eqs. (3), (7)-(10)",
        statement="""In chunk-causal mode chunk c's outputs depend only on strictly preceding chunks, with keys
                          normalised by eq. (3)'s m = max_{s<=T} ||z_s||.""",
        quantity="""float64: max change of chunks 0-1's outputs (solvers.koopman, S = 4, T = 12) when only the
                         last key is scaled, held to 0.""",
        examples=((0, 10.0),),
        note="""The max in eq. (3) runs over the whole sequence: a larger later key rescales every earlier
                     chunk's statistics.""",
    ),
    Twin(
        "echo.chunk_causal.corrected",
        source="Echo Sec. 3.2.1 chunk-causal mode (corrected)",
        statement="""With a scale fixed before the sequence (a frozen or running scale instead of the sequence
                          max), chunks before a changed token are bitwise unchanged.""",
        quantity="""float64: the same change with scale = the first chunk's max, held to 0.""",
    ),
    check=_chunk_causal,
    strategy=_late_token_cases,
    precisions=("float64",),
    implementation=_chunk_causal_impl,
    case_fields=("seed", "last key factor"),
)
