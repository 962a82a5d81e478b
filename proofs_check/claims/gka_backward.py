"""GKA backward pass: Lemma 1 and appendix eqs. (7)-(15), (26), (40)-(41), the chunkwise terms of
Sec. 4.2.2, the gate derivatives (16)-(24), Lemma 2 (and whether it extends), the reverse
Chebyshev iteration (44)-(54) / Algorithm 2, and Remark 2's stability conclusion.

Ground truth for every gradient is :func:`mpmath.diff` of the loss itself (``mpla.grad``): the
derivative of the forward computation, not a formula. The loss is ``sum_t <g_t, x_t>`` with
``x_t = (H_t + lambda_t I)^{-1} q_t`` (so that ``dL/dx_t = g_t``), or ``<g, xi_r>`` for
Algorithm 1.
"""

from __future__ import annotations

import math

import mpmath
import torch
from hypothesis import strategies as st

from analysis.testing.strategies.bf16 import bf16_vectors
from analysis.testing.strategies.ridge import (
    GKASequence,
    GKASystem,
    eigenvalue_bounds,
    gka_sequences,
    gka_systems,
)

from .. import mpla
from ..claim import ALL_PRECISIONS, EXTENSION, FAILS, MP, Measurement
from ..declare import Twin, for_paper
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
    rel64,
    worst,
)
from .gka import mp_chebyshev, mp_omega_star, mp_ridge, mp_states, mp_weights

# ------------------------------------------------------------------ the layer in mpmath


def mp_layer(keys, seq: GKASequence, with_H0: bool = False) -> dict:
    """States, ridge, solutions and implicit-differentiation quantities of the exact layer."""
    s = GKASequence(
        keys=tuple(tuple(k) for k in keys),
        log_gates=seq.log_gates,
        queries=seq.queries,
        cotangents=seq.cotangents,
        a=seq.a,
        H0_keys=seq.H0_keys,
    )
    H = mp_states(s, with_H0=with_H0)[1:]
    out = {"H": H, "x": [], "dq": [], "fro": [], "w": [], "A": []}
    for t, Ht in enumerate(H):
        A, lam, _, _ = mp_ridge(Ht, seq.a)
        x = mpla.solve(A, mpla.vec(seq.queries[t]))
        dq = mpla.solve(A, mpla.vec(seq.cotangents[t]))  # eq. (6)/(26), A symmetric
        fro = mpla.fro(Ht)
        out["A"].append(A)
        out["x"].append(x)
        out["dq"].append(dq)
        out["fro"].append(fro)
        out["w"].append(2 * mpf(seq.a) * mpla.dot(x, dq) / fro)  # Lemma 1's w_t
    return out


def mp_loss_grad_keys(seq: GKASequence) -> list:
    """dL/dk_i (i = 1..T) of L = sum_t <g_t, x_t> by mpmath.diff: the ground truth."""
    T, D = seq.T, seq.D

    def f(flat):
        keys = [flat[i * D : (i + 1) * D] for i in range(T)]
        lay = mp_layer(keys, seq)
        return mpmath.fsum(mpla.dot(mpla.vec(seq.cotangents[t]), lay["x"][t]) for t in range(T))

    flat = [x for k in seq.keys for x in k]
    d = mpla.grad(f, flat)
    return [mpla.vec(d[i * D : (i + 1) * D]) for i in range(T)]


def decay(seq: GKASequence, i: int, t: int, product: str = "(CH)") -> mpmath.mpf:
    """The weight of k_i k_i^T in H_t (0-based tokens): M_{i,t} = prod_{j=i+1}^{t} gamma_j for (CH);
    ``"printed (40)"``: prod_{j=i}^{t-1} gamma_j (appendix eqs. (32)-(41))."""
    g = seq.log_gates
    idx = range(i + 1, t + 1) if product == "(CH)" else range(i, t)
    return mpmath.exp(mpmath.fsum(mpf(g[j]) for j in idx))


def mp_dk_lemma1(seq: GKASequence, lay: dict, w_sign=-1, product="(CH)") -> list:
    """Lemma 1, eq. (7): dk_i = sum_{t>=i} M_{i,t} (-dq_t x_t^T - x_t dq_t^T + w_sign w_t H_t) k_i."""
    out = []
    for i in range(seq.T):
        k = mpla.vec(seq.keys[i])
        acc = mpla.zeros(seq.D)
        for t in range(i, seq.T):
            X = (
                -mpla.outer(lay["dq"][t], lay["x"][t])
                - mpla.outer(lay["x"][t], lay["dq"][t])
                + w_sign * lay["w"][t] * lay["H"][t]
            )
            acc += decay(seq, i, t, product) * (X * k)
        out.append(acc)
    return out


def _seq_tensors(seq: GKASequence, lay: dict):
    k = seq.tensor("keys")
    dq = torch.stack([mp_vector_tensor(v) for v in lay["dq"]])
    x = torch.stack([mp_vector_tensor(v) for v in lay["x"]])
    H = torch.stack([mp_matrix_tensor(v) for v in lay["H"]])
    w = torch.tensor([float(v) for v in lay["w"]], dtype=F64)
    fro = torch.tensor([float(v) for v in lay["fro"]], dtype=F64)
    return k, dq, x, H, w, fro


def _term_scale(seq: GKASequence, lay: dict) -> float:
    """Sum of the norms of the terms of eq. (7): the scale rounding errors are relative to."""
    s = 0.0
    for i in range(seq.T):
        nk = float(mpla.fro(mpla.vec(seq.keys[i])))
        for t in range(i, seq.T):
            s += (
                nk
                * float(decay(seq, i, t))
                * (
                    2 * float(mpla.fro(lay["dq"][t]) * mpla.fro(lay["x"][t]))
                    + abs(float(lay["w"][t])) * float(mpla.fro(lay["H"][t]))
                )
            )
    return s


def _kappa_bound(seq: GKASequence) -> float:
    return (seq.a + 1.0) / seq.a


def mp_dq(A, g):
    """Eq. (6)/(26): dq = (H + lambda I)^{-1} dx."""
    return mpla.solve(A, g)


def mp_dA(dq, x):
    """Eq. (12): the gradient w.r.t. the system matrix, -dq x^T."""
    return -mpla.outer(dq, x)


def mp_dH(dq, x, H, a, sign=-1):
    """Eq. (13): dH = -dq x^T + sign a (x^T dq) H / ||H||_F (printed sign -1)."""
    return -mpla.outer(dq, x) + sign * mpf(a) * mpla.dot(x, dq) * H / mpla.fro(H)


def mp_next_gate(seq: GKASequence, i: int):
    """gamma_{i+1}, the gate multiplying A_{i+1} in eq. (8) (0 past the last token)."""
    return mpmath.exp(mpf(seq.log_gates[i + 1])) if i + 1 < seq.T else mpf(0)


def mp_intra_b(seq: GKASequence, ws, zeta, i: int, C: int):
    """b_i = sum_{c=i}^{C} M_{i,c} w_c zeta_c, the coefficient of H_0 in B_i^intra (Sec. 4.2.2)."""
    return mpmath.fsum(decay(seq, i, c) * ws[c] * zeta[c] for c in range(i, C))


def _impl():
    return {
        "dk_mp": mp_dk_lemma1,
        "dq_mp": mp_dq,
        "dA_mp": mp_dA,
        "dH_mp": mp_dH,
        "next_gate_mp": mp_next_gate,
        "intra_b_mp": mp_intra_b,
        "dG_mp": _mp_dG_formula,
    }


def _impl_grad():
    impl = dict(_impl())
    impl["lemma1_dk"] = attr("solvers.gka_grad", "lemma1_dk")
    impl["appendix40_dk"] = attr("solvers.gka_grad", "appendix40_dk")
    impl["eq13_dH"] = attr("solvers.gka_grad", "eq13_dH")
    return impl


claim, erratum = for_paper("gka", implementation=_impl_grad)


_SEQ = lambda: gka_sequences(min_T=1, max_T=3, max_dim=2)  # noqa: E731
# one token decayed into a later one, gates not all equal: where a product off by one shows
_SEQ_EXAMPLE = GKASequence(
    keys=((1.0,), (1.0,)),
    log_gates=(-1.0, 0.0),
    queries=((1.0,), (1.0,)),
    cotangents=((1.0,), (1.0,)),
    a=0.5,
)


# ------------------------------------------------------------- Lemma 1 and eqs. (15), (40)


@formed
def _lemma1(w_sign, product, torch_fn):
    def check(seq: GKASequence, impl, prec) -> Measurement:
        with mpla.exact():
            lay = mp_layer(seq.keys, seq)
            truth = mp_loss_grad_keys(seq)
            if prec == MP:
                dk = impl["dk_mp"](seq, lay, w_sign=w_sign, product=product)
                return worst(exact_identity(dk[i], truth[i], f"dk_{i + 1}") for i in range(seq.T))
            scale = _term_scale(seq, lay)
        k, dq, x, H, w, fro = _seq_tensors(seq, lay)
        g = seq.tensor("log_gates")
        if torch_fn == "lemma1":
            dk = impl["lemma1_dk"](k, dq, x, H, w, gamma=torch.exp(g), w_sign=float(w_sign))
        else:
            dk = impl["appendix40_dk"](
                k,
                dq,
                x,
                H,
                fro,
                a=seq.a,
                g=g,
                product="printed" if product != "(CH)" else "corrected",
            )
        err = float(
            torch.linalg.vector_norm(dk - torch.stack([mp_vector_tensor(v) for v in truth]))
        )
        # inputs rounded once to float64 (x, dq carry kappa u), then sums of T terms of D-products
        return Measurement(
            err / scale if scale > 0 else err,
            allowance(_kappa_bound(seq), seq.D + seq.T, prec),
            "||dk - dk_true|| / sum of term norms",
        )

    return check


claim(
    "gka.lemma1",
    statement="""dk_i = sum_{t>=i} M_{i,t} (-dq_t x_t^T - x_t dq_t^T - w_t H_t) k_i with w_t = 2a x_t^T dq_t /
                   ||H_t||_F, for lambda_t = a ||H_t||_F and L = sum_t <g_t, x_t>.""",
    source="GKA Sec. 4.2.2, Lemma 1, eq. (7)",
    quantity="""mp: eq. (7) against mpmath.diff of the loss w.r.t. every key, held to 1e-30. float64:
                  solvers.gka_grad.lemma1_dk against the same, error / sum of term norms <= allowance.""",
    strategy=_SEQ,
    precisions=(MP, "float64"),
)(_lemma1(-1, "(CH)", "lemma1"))
erratum(
    Twin(
        "gka.eq15.printed",
        source="GKA App. D.2, eq. (15)",
        statement="""dk_i = sum_{t>=i} (zeta_t/zeta_i)(-dq_t x_t^T - x_t dq_t^T + w_t H_t) k_i ('which proves
                          Lemma 1').""",
        check=_lemma1(+1, "(CH)", "lemma1"),
        quantity="""mp: eq. (15) against mpmath.diff of the loss; float64: lemma1_dk(w_sign=+1).""",
        examples=(_SEQ_EXAMPLE,),
    ),
    Twin(
        "gka.eq15.corrected",
        source="GKA App. D.2, eq. (15) (corrected)",
        statement="""Eq. (15) with -w_t H_t, as in (7): (dH_t + dH_t^T) with dH_t of eq. (13) carries -2 a (x^T
                          dq) H_t/||H_t||_F.""",
        check=_lemma1(-1, "(CH)", "lemma1"),
        quantity="""as gka.lemma1""",
    ),
    strategy=_SEQ,
    precisions=(MP, "float64"),
)
erratum(
    Twin(
        "gka.eq40.printed",
        source="GKA App. D.2.1, eqs. (32)-(41)",
        statement="""dL/dk_l = -sum_{t>=l} (prod_{i=l}^{t-1} gamma_i)[<k_l,x_t> dq_t + <k_l,dq_t> x_t +
                          2a<x_t,dq_t>/||H_t||_F H_t k_l].""",
        check=_lemma1(-1, "printed (40)", "appendix40"),
        quantity="""mp: eq. (40) against mpmath.diff of the loss for the recurrence (CH); float64:
                         appendix40_dk(product='printed').""",
        examples=(_SEQ_EXAMPLE,),
        note="""(32) unrolls H_t = gamma_{t-1} H_{t-1} + k_t k_t^T; with (CH)'s H_t = gamma_t H_{t-1} + k_t
                     k_t^T the product is off by one token. They agree when all gates are equal.""",
    ),
    Twin(
        "gka.eq40.corrected",
        source="GKA App. D.2.1, eqs. (40)-(41) (corrected)",
        statement="""Eq. (40) with the decay prod_{i=l+1}^{t} gamma_i = M_{l,t} of (CH).""",
        check=_lemma1(-1, "(CH)", "appendix40"),
        quantity="""as gka.eq40.printed with product='corrected'""",
    ),
    strategy=_SEQ,
    precisions=(MP, "float64"),
)


# -------------------------------------------------------------- eqs. (6)/(26), (12), (13), (14)


def _single(seq: GKASequence):
    with mpla.exact():
        H = mp_states(seq)[1]
        q, g = mpla.vec(seq.queries[0]), mpla.vec(seq.cotangents[0])
    return H, q, g


def _check_eq26(seq, impl, prec) -> Measurement:
    H, q, g = _single(seq)
    with mpla.exact():
        A, _, _, _ = mp_ridge(H, seq.a)
        truth = mpla.grad(lambda qs: mpla.dot(g, mpla.solve(A, mpla.vec(qs))), list(q))
        return exact_identity(impl["dq_mp"](A, g), mpla.vec(truth), "dq")


def _check_eq12(seq, impl, prec) -> Measurement:
    H, q, g = _single(seq)
    with mpla.exact():
        A, _, _, _ = mp_ridge(H, seq.a)
        truth = mpla.matrix_grad(lambda M: mpla.dot(g, mpla.solve(M, q)), A)
        dq, x = mpla.solve(A, g), mpla.solve(A, q)
        return exact_identity(impl["dA_mp"](dq, x), truth, "d(H + lambda I)")


@formed
def _eq13(sign):
    def check(seq, impl, prec) -> Measurement:
        H, q, g = _single(seq)
        with mpla.exact():
            a = mpf(seq.a)

            def f(M):
                return mpla.dot(g, mpla.solve(M + a * mpla.fro(M) * mpla.eye(M.rows), q))

            truth = mpla.matrix_grad(f, H)
            A, _, _, _ = mp_ridge(H, seq.a)
            dq, x = mpla.solve(A, g), mpla.solve(A, q)
            if prec == MP:
                dH = impl["dH_mp"](dq, x, H, a, sign)
                return exact_identity(dH, truth, "dH")
            scale = float(mpla.fro(dq) * mpla.fro(x)) * (1 + seq.a)
        dH = impl["eq13_dH"](
            mp_matrix_tensor(H),
            mp_vector_tensor(x),
            mp_vector_tensor(dq),
            a=seq.a,
            sign=float(sign),
        )
        err = float(torch.linalg.matrix_norm(dH - mp_matrix_tensor(truth)))
        return Measurement(
            err / scale if scale > 0 else err,
            allowance(_kappa_bound(seq), seq.D, prec),
            "||dH - dH_true|| / (||dq|| ||x|| (1+a))",
        )

    return check


_SINGLE = lambda: gka_sequences(min_T=1, max_T=1, max_dim=3)  # noqa: E731
claim(
    "gka.eq26",
    statement="""dL/dq_t = (H_t + lambda_t I)^{-1} dL/dx_t.""",
    source="GKA Sec. 4.2.2 eq. (6); App. D.2.1 eqs. (25)-(26)",
    quantity="""mp: against mpmath.diff of <g, (H + lambda I)^{-1} q> w.r.t. q.""",
    strategy=_SINGLE,
)(_check_eq26)
claim(
    "gka.eq12",
    statement="""The gradient w.r.t. the system matrix H_t + lambda_t I is -dq_t x_t^T.""",
    source="GKA App. D.2, eq. (12)",
    quantity="""mp: against mpmath.diff w.r.t. every entry of the system matrix.""",
    strategy=_SINGLE,
)(_check_eq12)
claim(
    "gka.eq13",
    statement="""With lambda_t = a ||H_t||_F: dH_t = -dq_t x_t^T - a H_t/||H_t||_F (x_t^T dq_t) (vec form (31)).""",
    source="GKA App. D.2, eq. (13); App. D.2.1 eqs. (28)-(31)",
    quantity="""mp: against mpmath.diff w.r.t. every entry of H (lambda depending on H); float64:
                  solvers.gka_grad.eq13_dH.""",
    strategy=_SINGLE,
    precisions=(MP, "float64"),
)(_eq13(-1))


@claim("gka.eq14", source="GKA App. D.2, eq. (14)", strategy=_SEQ)
def _check_eq14(seq, impl, prec) -> Measurement:
    """dk_i = sum_{t>=i} (dH_t + dH_t^T) k_i zeta_t/zeta_i with dH_t of eq. (13).

    Measured: mp: against mpmath.diff of the loss w.r.t. every key.
    """
    with mpla.exact():
        lay = mp_layer(seq.keys, seq)
        truth = mp_loss_grad_keys(seq)
        parts = []
        for i in range(seq.T):
            k = mpla.vec(seq.keys[i])
            acc = mpla.zeros(seq.D)
            for t in range(i, seq.T):
                dH = impl["dH_mp"](
                    lay["dq"][t], lay["x"][t], lay["H"][t], mpf(seq.a), -1
                )  # eq. (13)
                acc += decay(seq, i, t) * ((dH + dH.T) * k)  # eq. (14)
            parts.append(exact_identity(acc, truth[i], f"dk_{i + 1}"))
        return worst(parts)


# -------------------------------------------------------- eqs. (8)-(10), Sec. 4.2.2 chunkwise terms


def _state_scale(seq: GKASequence) -> float:
    """||H_0||_F + sum_j ||k_j||^2 bounds ||H_c||_F for every c (gates <= 1): the size of every term."""
    H0 = seq.H0()
    return float(torch.linalg.matrix_norm(H0)) + float((seq.tensor("keys") ** 2).sum())


def _chunk_cases():
    """A chunk of C tokens with initial state H_0 and future tokens after it; w_t arbitrary scalars."""
    return gka_sequences(min_T=2, max_T=4, max_dim=2, with_H0=True)


def _ws(seq: GKASequence) -> list:
    return [mpf(c[0]) for c in seq.cotangents]


def _mp_B(seq: GKASequence, states, ws, i: int):
    """B_i = sum_{t>=i} M_{i,t} w_t H_t over the whole sequence (eq. (9)'s definition)."""
    acc = mpla.zeros(seq.D, seq.D)
    for t in range(i, seq.T):
        acc += decay(seq, i, t) * ws[t] * states[t + 1]
    return acc


@claim(
    "gka.eq8_9", source="GKA Sec. 4.2.2, eqs. (8)-(9)", strategy=_chunk_cases, implementation=_impl
)
def _check_eq8_9(seq, impl, prec) -> Measurement:
    """A_i = sum_{t>=i} M_{i,t} dq_t x_t^T and B_i = sum_{t>=i} M_{i,t} w_t H_t satisfy A_i = gamma_{i+1} A_{i+1} + dq_i
    x_i^T and B_i = gamma_{i+1} B_{i+1} + w_i H_i.

    Measured: mp: the recursions against the sums, held to 1e-30 (arbitrary rank-one dq_t x_t^T and scalars w_t).
    """
    with mpla.exact():
        states = mp_states(seq)
        ws = _ws(seq)
        X = [
            mpla.outer(mpla.vec(seq.queries[t]), mpla.vec(seq.cotangents[t])) for t in range(seq.T)
        ]  # dq_t x_t^T stand-ins
        parts = []
        A_next, B_next = mpla.zeros(seq.D, seq.D), mpla.zeros(seq.D, seq.D)
        for i in reversed(range(seq.T)):
            gamma_next = impl["next_gate_mp"](seq, i)
            A_i = gamma_next * A_next + X[i]  # eq. (8)
            B_i = gamma_next * B_next + ws[i] * states[i + 1]  # eq. (9)
            A_def = sum(
                (decay(seq, i, t) * X[t] for t in range(i, seq.T)), mpla.zeros(seq.D, seq.D)
            )
            parts += [
                exact_identity(A_i, A_def, f"A_{i + 1}"),
                exact_identity(B_i, _mp_B(seq, states, ws, i), f"B_{i + 1}"),
            ]
            A_next, B_next = A_i, B_i
        return worst(parts)


def _chunk_parts(seq: GKASequence):
    """Chunk = tokens 1..C (C = T - 1), the last token is the future token C+1."""
    C = seq.T - 1
    zeta, z = [], mpf(1)
    for g in seq.log_gates[:C]:
        z = z * mpmath.exp(mpf(g))
        zeta.append(z)
    return C, zeta


@claim(
    "gka.eq10",
    source="GKA Sec. 4.2.2, eq. (10) and the intra-chunk expansion",
    strategy=_chunk_cases,
    implementation=_impl,
)
def _check_eq10(seq, impl, prec) -> Measurement:
    """B_i = M_{i,C} gamma_{C+1} B_{C+1} + B_i^intra, and B_i^intra = b_i H_0 + sum_j (M diag(w) M^T)_{ij} k_j k_j^T
    with b_i = sum_c M_{i,c} w_c zeta_c.

    Measured: mp: both identities, held to 1e-30, for a chunk of T-1 tokens followed by one future token.
    """
    with mpla.exact():
        states, ws = mp_states(seq), _ws(seq)
        C, zeta = _chunk_parts(seq)
        gamma_next = mpmath.exp(mpf(seq.log_gates[C]))
        B_next = _mp_B(seq, states, ws, C)
        parts = []
        for i in range(C):
            intra = sum(
                (decay(seq, i, c) * ws[c] * states[c + 1] for c in range(i, C)),
                mpla.zeros(seq.D, seq.D),
            )
            parts.append(
                exact_identity(
                    decay(seq, i, C - 1) * gamma_next * B_next + intra,
                    _mp_B(seq, states, ws, i),
                    f"B_{i + 1}",
                )
            )
            # B_i^intra = b_i H_0 + sum_j (M diag(w) M^T)_{ij} k_j k_j^T (the unrolled form of Sec. 4.2.2)
            unrolled = impl["intra_b_mp"](seq, ws, zeta, i, C) * states[0]
            for j in range(C):
                mw = mpmath.fsum(
                    decay(seq, i, c) * ws[c] * decay(seq, j, c) for c in range(max(i, j), C)
                )
                kj = mpla.vec(seq.keys[j])
                unrolled += mw * mpla.outer(kj, kj)
            parts.append(exact_identity(unrolled, intra, f"B_{i + 1}^intra"))
        return worst(parts)


@formed
def _intra_matrix(form):
    def check(seq, impl, prec) -> Measurement:
        with mpla.exact():
            states, ws = mp_states(seq), _ws(seq)
            C, zeta = _chunk_parts(seq)
            KC = mpla.mat(seq.keys[:C]).T  # D x C, columns k_j
            b = [
                mpmath.fsum(decay(seq, i, c) * ws[c] * zeta[c] for c in range(i, C))
                for i in range(C)
            ]
            Mw = mpmath.matrix(C, C)
            for i in range(C):
                for j in range(C):
                    Mw[i, j] = mpmath.fsum(
                        decay(seq, i, c) * ws[c] * decay(seq, j, c) for c in range(max(i, j), C)
                    )
            diag_b = mpmath.diag(b)
            truth = mpmath.matrix(seq.D, C)
            for i in range(C):
                col = (
                    sum(
                        (decay(seq, i, c) * ws[c] * states[c + 1] for c in range(i, C)),
                        mpla.zeros(seq.D, seq.D),
                    )
                    * KC[:, i]
                )
                for d in range(seq.D):
                    truth[d, i] = col[d]
            gram_term = KC * mpla.hadamard(KC.T * KC, Mw)
            if prec == MP:
                if form == "printed":
                    if (
                        diag_b.cols != KC.rows
                    ):  # diag(b) K_C: (C x C)(D x C) is undefined unless C = D
                        return Measurement(
                            float("inf"),
                            float(mpla.exact_tol()),
                            f"diag(b) K_C undefined: C={C}, D={seq.D}",
                        )
                    claimed = states[0] * (diag_b * KC) + gram_term
                else:
                    claimed = states[0] * (KC * diag_b) + gram_term
                return exact_identity(claimed, truth, "[B_1^intra k_1, ..., B_C^intra k_C]")
        G = torch.cumsum(seq.tensor("log_gates")[:C], -1)
        w = torch.tensor([float(v) for v in ws[:C]], dtype=F64)
        got = impl["chunk_intra_Bk"](
            mp_matrix_tensor(states[0]), seq.tensor("keys")[:C], G, w
        )  # rows = tokens
        err = float((got.T - mp_matrix_tensor(truth)).abs().max())
        # every term is w_c M H_c k_i with decays <= 1: bounded by max|w| * state scale * max||k||
        scale = (
            float(w.abs().max())
            * _state_scale(seq)
            * float(torch.linalg.vector_norm(seq.tensor("keys"), dim=-1).max())
        )
        return Measurement(
            err / scale if scale > 0 else err,
            allowance(1.0, seq.D + seq.T, prec),
            "max entry error / term scale (no solve: kappa = 1)",
        )

    return check


def _impl_chunk():
    impl = dict(_impl())
    impl["chunk_intra_Bk"] = attr("solvers.gka_chunk", "chunk_intra_Bk")
    impl["chunkwise_Bk"] = attr("solvers.gka_chunk", "chunkwise_Bk")
    return impl


_INTRA_EXAMPLE = GKASequence(
    keys=((1.0, 0.0), (0.0, 1.0)),
    log_gates=(0.0, 0.0),
    queries=((0.0, 0.0), (0.0, 0.0)),
    cotangents=((1.0, 0.0), (1.0, 0.0)),
    a=0.01,
    H0_keys=((1.0, 0.0),),
)
erratum(
    Twin(
        "gka.intra_chunk.printed",
        source="GKA Sec. 4.2.2, 'Intra-chunk computation'",
        statement="""[B_1^intra k_1, ..., B_C^intra k_C] = H_0 (diag(b_1..b_C) K_C) + K_C ((K_C^T K_C) . M_w).""",
        quantity="""mp: the printed matrix expression against the columns B_i^intra k_i (inf where diag(b) K_C
                         is undefined).""",
        precisions=(MP,),
        examples=(_INTRA_EXAMPLE,),
    ),
    Twin(
        "gka.intra_chunk.corrected",
        source="GKA Sec. 4.2.2 (corrected)",
        statement="""[B_1^intra k_1, ..., B_C^intra k_C] = H_0 K_C diag(b) + K_C ((K_C^T K_C) . M_w).""",
        quantity="""mp: against the columns B_i^intra k_i, held to 1e-30; float64:
                         solvers.gka_chunk.chunk_intra_Bk.""",
        precisions=(MP, "float64"),
    ),
    check=_intra_matrix,
    strategy=_chunk_cases,
    implementation=_impl_chunk,
)


@formed
def _cross(form):
    def check(seq, impl, prec) -> Measurement:
        with mpla.exact():
            states, ws = mp_states(seq, with_H0=False), _ws(seq)
            s0 = GKASequence(
                keys=seq.keys,
                log_gates=seq.log_gates,
                queries=seq.queries,
                cotangents=seq.cotangents,
                a=seq.a,
            )
            C, zeta = _chunk_parts(seq)
            truth = [_mp_B(s0, states, ws, i) * mpla.vec(seq.keys[i]) for i in range(seq.T)]
            if prec == MP:
                gamma_next = mpmath.exp(mpf(seq.log_gates[C]))
                Bt_next = gamma_next * _mp_B(s0, states, ws, C)
                parts = []
                for i in range(C):
                    intra = sum(
                        (decay(s0, i, c) * ws[c] * states[c + 1] for c in range(i, C)),
                        mpla.zeros(seq.D, seq.D),
                    )
                    coef = zeta[-1] if form == "printed" else decay(s0, i, C - 1)
                    parts.append(
                        exact_identity(
                            (intra + coef * Bt_next) * mpla.vec(seq.keys[i]),
                            truth[i],
                            f"B_{i + 1} k_{i + 1}",
                        )
                    )
                return worst(parts)
        w = torch.tensor([float(v) for v in ws], dtype=F64)
        got = impl["chunkwise_Bk"](
            seq.tensor("keys"),
            w,
            g=seq.tensor("log_gates"),
            chunk_size=max(1, seq.T - 1),
            cross="printed" if form == "printed" else "corrected",
        )
        err = float((got - torch.stack([mp_vector_tensor(v) for v in truth])).abs().max())
        # sums over <= T tokens of terms w_c M H_c k_i, each bounded by max|w| * state scale * max||k||
        scale = (
            seq.T
            * float(w.abs().max())
            * _state_scale(seq)
            * float(torch.linalg.vector_norm(seq.tensor("keys"), dim=-1).max())
        )
        return Measurement(
            err / scale if scale > 0 else err,
            allowance(1.0, seq.D + seq.T, prec),
            "max entry error of B_i k_i / term scale",
        )

    return check


_CROSS_EXAMPLE = GKASequence(
    keys=((1.0,), (1.0,), (1.0,)),
    log_gates=(0.0, -1.0, 0.0),
    queries=((0.0,),) * 3,
    cotangents=((1.0,),) * 3,
    a=0.01,
)
erratum(
    Twin(
        "gka.cross_chunk.printed",
        source="GKA Sec. 4.2.2, 'Cross-chunk computation'",
        statement="""With Bt_{C+1} = gamma_{C+1} B_{C+1} carried by Bt_1 = zeta_C Bt_{C+1} + Bt_1^intra, the
                          cross-chunk contribution collected for every token i of the chunk is zeta_C Bt_{C+1} k_i.""",
        quantity="""mp and float64 (solvers.gka_chunk.chunkwise_Bk(cross='printed')): B_i k_i against the
                         definition.""",
        examples=(_CROSS_EXAMPLE,),
    ),
    Twin(
        "gka.cross_chunk.corrected",
        source="GKA Sec. 4.2.2, eq. (10) (corrected)",
        statement="""Token i of the chunk collects M_{i,C} Bt_{C+1} k_i (zeta_C/zeta_i, as eq. (10) says); the
                          recursion Bt_1 = zeta_C Bt_{C+1} + sum_{c=1}^{C} zeta_c w_c H_c (lower limit c = 1, not c = i)
                          is right.""",
        quantity="""mp and float64 (chunkwise_Bk(cross='corrected')): B_i k_i against the definition.""",
    ),
    check=_cross,
    strategy=lambda: gka_sequences(min_T=2, max_T=4, max_dim=2),
    precisions=(MP, "float64"),
    implementation=_impl_chunk,
)


# ------------------------------------------------------------------- gate derivatives (16)-(24)


def _mp_chunk_H(seq: GKASequence, G: list) -> list:
    """H_1..H_{C+1} by eq. (17): H_c = e^{G_c} H_0 + sum_{j<=c} e^{G_c - G_j} k_j k_j^T, G free variables."""
    H0 = mp_states(seq)[0]
    out = []
    for c in range(len(G)):
        Hc = mpmath.exp(G[c]) * H0
        for j in range(c + 1):
            kj = mpla.vec(seq.keys[j])
            Hc += mpmath.exp(G[c] - G[j]) * mpla.outer(kj, kj)
        out.append(Hc)
    return out


def _cotangent_mats(seq: GKASequence) -> list:
    return [mpla.outer(mpla.vec(seq.queries[c]), mpla.vec(seq.cotangents[c])) for c in range(seq.T)]


def _G0(seq: GKASequence) -> list:
    G, acc = [], mpf(0)
    for g in seq.log_gates:
        acc += mpf(g)
        G.append(acc)
    return G


def _mp_dG_formula(seq, G, dH, eq: str) -> list:
    """dG_1..dG_C by eq. (21) or (22) and dG_{C+1} by (23) (C = T - 1; dH[C] is the aggregated dH_{C+1})."""
    H0 = mp_states(seq)[0]
    C = seq.T - 1
    kk = [mpla.outer(mpla.vec(k), mpla.vec(k)) for k in seq.keys]
    e = mpmath.exp
    out = []
    for i in range(C):
        v = e(G[i]) * mpla.inner(dH[i], H0)
        hi = i + 1 if eq == "(22)" else i  # (22) adds j = i and c = i
        lo = i if eq == "(22)" else i + 1
        v += mpmath.fsum(e(G[i] - G[j]) * mpla.inner(dH[i], kk[j]) for j in range(hi))
        v -= mpmath.fsum(e(G[c] - G[i]) * mpla.inner(dH[c], kk[i]) for c in range(lo, C))
        v -= e(G[C] - G[i]) * mpla.inner(dH[C], kk[i])
        out.append(v)
    out.append(
        e(G[C]) * mpla.inner(dH[C], H0)
        + mpmath.fsum(e(G[C] - G[j]) * mpla.inner(dH[C], kk[j]) for j in range(C))
    )
    return out


@formed
def _gate_eq(eq):
    def check(seq, impl, prec) -> Measurement:
        with mpla.exact():
            G = _G0(seq)
            dH = _cotangent_mats(seq)
            truth = mpla.grad(
                lambda Gs: mpmath.fsum(
                    mpla.inner(W, Hc) for W, Hc in zip(dH, _mp_chunk_H(seq, Gs))
                ),
                G,
            )
            if prec == MP:
                got = impl["dG_mp"](seq, G, dH, eq)
                return worst(exact_identity(got[i], truth[i], f"dG_{i + 1}") for i in range(seq.T))
        C = seq.T - 1
        dG, dG_next = impl["chunk_dG"](
            mp_matrix_tensor(mp_states(seq)[0]),
            seq.tensor("keys"),
            torch.cumsum(seq.tensor("log_gates"), -1),
            torch.stack([mp_matrix_tensor(W) for W in dH[:C]]),
            mp_matrix_tensor(dH[C]),
        )
        got = torch.cat([dG, dG_next.reshape(1)])
        err = float((got - torch.tensor([float(v) for v in truth], dtype=F64)).abs().max())
        # each dG_i sums <= 2T inner products <dH_c, .> of matrices bounded by the state scale (decays <= 1)
        scale = 2 * seq.T * max(float(mpla.fro(W)) for W in dH) * _state_scale(seq)
        return Measurement(
            err / scale if scale > 0 else err,
            allowance(1.0, seq.D * seq.D + 2 * seq.T, prec),
            "max |dG_i error| / term scale",
        )

    return check


def _impl_gates():
    impl = dict(_impl())
    impl["chunk_dG"] = attr("solvers.gka_grad", "chunk_dG")
    impl["eq24_printed"] = attr("solvers.gka_grad", "eq24_printed")
    impl["eq24_corrected"] = attr("solvers.gka_grad", "eq24_corrected")
    return impl


_GATES = lambda: gka_sequences(min_T=2, max_T=4, max_dim=2, with_H0=True)  # noqa: E731
claim(
    "gka.eq16_21",
    statement="""With H_c = e^{G_c} H_0 + sum_{j<=c} e^{G_c - G_j} k_j k_j^T (17), the derivatives (18)-(19) give
                   dG_i = e^{G_i}<dH_i, H_0> + sum_{j<i} e^{G_i-G_j}<dH_i, k_jk_j^T> - sum_{c=i+1}^{C} e^{G_c-G_i}<dH_c,
                   k_ik_i^T> - e^{G_{C+1}-G_i}<dH_{C+1}, k_ik_i^T> (21).""",
    source="GKA App. D.2, eqs. (16)-(21)",
    quantity="""mp: eq. (21) (and (23) for G_{C+1}) against mpmath.diff of sum_c <dH_c, H_c(G)> w.r.t. each G_i.""",
    strategy=_GATES,
    implementation=_impl_gates,
)(_gate_eq("(21)"))
claim(
    "gka.eq22_23",
    statement="""Eq. (22) (adding and subtracting <dH_i, k_i k_i^T>) equals (21); dG_{C+1} = e^{G_{C+1}}<dH_{C+1},
                   H_0> + sum_{j<=C} e^{G_{C+1}-G_j}<dH_{C+1}, k_jk_j^T> (23).""",
    source="GKA App. D.2, eqs. (22)-(23)",
    quantity="""mp: against mpmath.diff; float64: solvers.gka_grad.chunk_dG against the same.""",
    strategy=_GATES,
    precisions=(MP, "float64"),
    implementation=_impl_gates,
)(_gate_eq("(22)"))


@formed
def _eq24(form):
    def check(seq, impl, prec) -> Measurement:
        # chunk = tokens 1..C, token C+1's aggregated cotangent dH_{C+1} = -(1/2) B_{C+1}
        C = seq.T - 1
        with mpla.exact():
            G = _G0(seq)
            H = _mp_chunk_H(seq, G)
            ws = _ws(seq)[:C]
            q = mpla.vec(seq.queries[C])
            B_next = mpla.outer(q, q) + mpla.eye(seq.D)  # any symmetric B_{C+1}
            W = [-ws[c] / 2 * H[c] for c in range(C)] + [
                -B_next / 2
            ]  # the -(1/2) w_t H_t part of dH_t (13)
            truth = mpla.grad(
                lambda Gs: mpmath.fsum(
                    mpla.inner(Wc, Hc) for Wc, Hc in zip(W, _mp_chunk_H(seq, Gs))
                ),
                G,
            )
        fn = impl["eq24_printed"] if form == "printed" else impl["eq24_corrected"]
        first, second = fn(
            mp_matrix_tensor(mp_states(seq)[0]),
            seq.tensor("keys")[:C],
            torch.cumsum(seq.tensor("log_gates"), -1),
            torch.tensor([float(v) for v in ws], dtype=F64),
            mp_matrix_tensor(B_next),
        )
        got = torch.cat([first, second.reshape(1)])
        t = torch.tensor([float(v) for v in truth], dtype=F64)
        # terms: w_c <H_c, H_c>, k^T B k, <Bt, H_0> with B a sum of <= T w_c H_c plus B_{C+1}
        sc = _state_scale(seq)
        scale = (
            2
            * seq.T
            * (
                float(torch.tensor([float(v) for v in ws]).abs().sum()) * sc
                + float(mpla.fro(B_next))
            )
            * sc
        )
        return Measurement(
            float((got - t).abs().max()) / scale,
            allowance(1.0, seq.D * seq.D + 2 * seq.T, prec),
            "max error of the w_t H_t part of dG_1..dG_{C+1} / term scale",
        )

    return check


_EQ24_EXAMPLE = GKASequence(
    keys=((1.0,), (1.0,)),
    log_gates=(0.0, 0.0),
    queries=((0.0,), (0.0,)),
    cotangents=((1.0,), (0.0,)),
    a=0.01,
    H0_keys=((1.0,),),
)
erratum(
    Twin(
        "gka.eq24.printed",
        source="GKA App. D.2, eq. (24)",
        statement="""The parts of dG_i and dG_{C+1} due to the term (1/2) w_t H_t of dH_t are (1/2)<w_i H_i,
                          H_i> - (1/2) k_i^T B_i k_i and (1/2) e^{G_C}<Bt_{C+1}, H_0> + (1/2) sum_j e^{G_C-G_j} k_j^T
                          Bt_{C+1} k_j.""",
        quantity="""float64: solvers.gka_grad.eq24_printed against mpmath.diff of the loss restricted to dH_t =
                         -(1/2) w_t H_t (the sign eq. (13) and the text's 'dH_t = -dq x^T - (1/2) w_t H_t' give it).""",
        examples=(_EQ24_EXAMPLE,),
    ),
    Twin(
        "gka.eq24.corrected",
        source="GKA App. D.2, eq. (24) (corrected)",
        statement="""Both parts of eq. (24) with the opposite sign: the term of dH_t is -(1/2) w_t H_t.""",
        quantity="""float64: solvers.gka_grad.eq24_corrected against mpmath.diff.""",
    ),
    check=_eq24,
    strategy=_GATES,
    precisions=("float64",),
    implementation=_impl_gates,
)


# ------------------------------------------------------- Chebyshev backward: eqs. (44)-(54), Lemma 2


def mp_adjoint(A, q, g, L, mu, r: int, step=None, rho2=None):
    """Eqs. (44)-(48): xi_i = A_i xi_{i-1} + b_i xi_{i-2} + c_i q with A_i = omega_i I - c_i A, b_i = -(omega_i - 1),
    c_i = 2 omega_i/(L+mu), c_0 = 2/(L+mu); d xi_{r-1} = A_r d xi_r, d xi_{i-2} = A_{i-1} d xi_{i-1} + b_i d xi_i;
    dq = sum_i c_i d xi_i; dH = -sum_{i>=1} c_i d xi_i xi_{i-1}^T. Returns (dq, dH, iterates, weights)."""
    if step is None:
        step = 2 / (L + mu)
    w = mp_weights(L, mu, r, rho2)
    xis = mp_chebyshev(A, q, L, mu, r, step=step, rho2=rho2)
    n = A.rows
    c = [step] + [w[i] * step for i in range(1, r + 1)]
    Ai = [None] + [w[i] * mpla.eye(n) - c[i] * A for i in range(1, r + 1)]
    b = [None] + [-(w[i] - 1) for i in range(1, r + 1)]
    lam = {r: g, r + 1: mpla.zeros(n)}
    if r >= 1:
        lam[r - 1] = Ai[r] * g
    for i in range(r, 1, -1):
        lam[i - 2] = Ai[i - 1] * lam[i - 1] + b[i] * lam[i]
    dq = sum((c[i] * lam[i] for i in range(r + 1)), mpla.zeros(n))
    dH = mpla.zeros(n, n)
    for i in range(1, r + 1):
        dH -= c[i] * mpla.outer(lam[i], xis[i - 1])
    return dq, dH, xis, w


def mp_algorithm2(
    A, q, g, L, mu, r: int, xi_r, xi_rm1, omega_r, *, eq50="printed", eq53="printed", eq54="printed"
):
    """GKA Algorithm 2 (eqs. (50)-(54)) in mpmath; each flag "printed" or "corrected":
    eq50 the sign of c_i q, eq53 the coefficient of d xi_0 (2 nu_0/(L+mu) vs c_0 = 2/(L+mu)), eq54 the i = 0 term."""
    n = A.rows
    rho2 = ((L - mu) / (L + mu)) ** 2
    two = 2 / (L + mu)
    nu = {r: omega_r, r + 1: mpf(0)}
    dxi = {r: g, r + 1: mpla.zeros(n)}
    xi = {r: xi_r, r - 1: xi_rm1}
    dq = two * nu[r] * g
    dH = -two * nu[r] * mpla.outer(g, xi_rm1)
    sign = 1 if eq50 == "printed" else -1
    for i in range(r, 0, -1):
        c = two * nu[i]
        xi[i - 2] = (
            -1 / (nu[i] - 1) * (xi[i] - (nu[i] * mpla.eye(n) - c * A) * xi[i - 1] + sign * c * q)
        )  # (50)
        dxi[i - 1] = (nu[i] * dxi[i] - c * (A * dxi[i])) - (nu[i + 1] - 1) * dxi[i + 1]  # (51)
        nu[i - 1] = 4 / rho2 * (1 - 1 / nu[i])  # (52)
        c_prev = two * nu[i - 1] if (i > 1 or eq53 == "printed") else two
        dq = dq + c_prev * dxi[i - 1]  # (53)
        if i > 1 or eq54 == "printed":
            dH = dH - c_prev * mpla.outer(dxi[i - 1], xi[i - 2])  # (54)
    return dq, dH


def mp_cg(A, q, r: int) -> mpmath.matrix:
    """Hestenes-Stiefel CG from 0 (as solvers.cg): the iterate after r steps."""
    x, res, p = mpla.zeros(q.rows), q, q
    rr = mpla.dot(res, res)
    for _ in range(r):
        Ap = A * p
        pAp = mpla.dot(p, Ap)
        if rr == 0 or pAp <= 0:
            break
        alpha = rr / pAp
        x, res = x + alpha * p, res - alpha * Ap
        rr_new = mpla.dot(res, res)
        p, rr = res + (rr_new / rr) * p, rr_new
    return x


def mp_reverse_weight(nu, rho2):
    """Eq. (47)/(52): nu_{i-1} = (4/rho^2)(1 - 1/nu_i)."""
    return 4 / rho2 * (1 - 1 / nu)


def mp_implicit_dq(A, g, L, mu, r):
    """Table 1: d q^ = CH(H + lambda I, d x^, r)."""
    return mp_chebyshev(A, g, L, mu, r)[-1]


def mp_implicit_dH(A, q, g, L, mu, r):
    """Table 1 / eq. (12) with the forward's output: -CH(A, g, r) xi_r^T."""
    return -mpla.outer(mp_chebyshev(A, g, L, mu, r)[-1], mp_chebyshev(A, q, L, mu, r)[-1])


def _ch_cases(min_r=0, max_r=6, a=(0.01, 0.02, 0.05, 0.1, 0.5), max_dim=3):
    @st.composite
    def build(draw):
        s = draw(gka_systems(max_dim=max_dim, max_keys=3, a=a))
        r = draw(st.integers(min_r, max_r))
        return s, r, draw(bf16_vectors(s.D, min_value=-2.0, max_value=2.0))

    return build()


def _reverse_digits(case) -> int:
    """Extra digits that running (47)/(49) backwards r steps needs: log10 of the growth A_r Gamma_r
    (analysis.references.chebyshev_backward), so that the exact checks keep 50 digits after the reversal."""
    from analysis.references import chebyshev_backward as cb
    from solvers import gka_ridge

    s, r, _ = case
    rs = gka_ridge(s.H(), s.a)
    L, mu = float(rs.L), float(rs.mu)
    if not L > mu:
        return 0
    growth = cb.reversal_amplification(L, mu, r) * cb.omega_recovery_amplification(L, mu, r)
    return int(math.log10(max(growth, 1.0))) + 10


def _mp_problem(case):
    s, r, g = case
    H = mpla.mat(s.keys).T * mpla.mat(s.keys)
    A, _, L, mu = mp_ridge(H, s.a)
    return A, mpla.vec(s.q), mpla.vec(g), L, mu, r


def _impl_ch():
    import solvers
    from analysis.references import chebyshev_backward as cb
    from analysis.references.iterative import working_constants

    return {
        "adjoint_mp": mp_adjoint,
        "algorithm2_mp": mp_algorithm2,
        "chebyshev_mp": mp_chebyshev,
        "cg_mp": mp_cg,
        "reverse_weight_mp": mp_reverse_weight,
        "implicit_dq_mp": mp_implicit_dq,
        "implicit_dH_mp": mp_implicit_dH,
        "chebyshev_backward": solvers.chebyshev_backward,
        "algorithm2_as_printed": solvers.algorithm2_as_printed,
        "gka_ridge": solvers.gka_ridge,
        "working_constants": working_constants,
        "reversal_amplification": cb.reversal_amplification,
        "omega_recovery_amplification": cb.omega_recovery_amplification,
        "implicit_dH_gap_bound": cb.implicit_dH_gap_bound,
    }


# their cases: (GKA system, r iterations, cotangent g = dL/dxi_r), named in counterexamples
chb_claim, chb_erratum = for_paper("gka", implementation=_impl_ch, case_fields=("system", "r", "g"))


def _loss_grads(impl, A, q, g, L, mu, r):
    """d<g, xi_r>/dq and d<g, xi_r>/dA by mpmath.diff of Algorithm 1 itself."""
    ch = impl["chebyshev_mp"]
    dq = mpla.vec(mpla.grad(lambda qs: mpla.dot(g, ch(A, mpla.vec(qs), L, mu, r)[-1]), list(q)))
    dA = mpla.matrix_grad(lambda M: mpla.dot(g, ch(M, q, L, mu, r)[-1]), A)
    return dq, dA


@chb_claim(
    "gka.eq44_48", source="GKA App. E.1, eqs. (44)-(46), (48)", strategy=lambda: _ch_cases(max_r=4)
)
def _check_eq44_48(case, impl, prec) -> Measurement:
    """Algorithm 1 is the recursion (44)-(45); its exact adjoint is (46): d xi_{r-1} = A_r d xi_r, d xi_{i-2} = A_{i-1}
    d xi_{i-1} + b_i d xi_i, with dq = sum_{i=0}^r c_i d xi_i and dH = -sum_{i>=1} c_i d xi_i xi_{i-1}^T (48).

    Measured: mp: the recursion against Algorithm 1's iterates and the adjoint against mpmath.diff of <g, xi_r>, held to
    1e-30.

    Note: Eq. (48) is printed as dH = -(2 omega_i/(L+mu)) dA_i with dA_i = d xi_i xi_{i-1}^T, with no sum over i; it is
    read (and checked) as the sum over i = 1..r of these contributions.
    """
    with mpla.exact():
        A, q, g, L, mu, r = _mp_problem(case)
        dq, dH, xis, w = impl["adjoint_mp"](A, q, g, L, mu, r)
        tdq, tdA = _loss_grads(impl, A, q, g, L, mu, r)
        step = 2 / (L + mu)
        parts = [exact_identity(dq, tdq, "dq (46)"), exact_identity(dH, tdA, "dH (48)")]
        prev, cur = mpla.zeros(A.rows), step * q
        for i in range(1, r + 1):  # (44)-(45) reproduce Algorithm 1's iterates
            c = w[i] * step
            prev, cur = cur, (w[i] * mpla.eye(A.rows) - c * A) * cur - (w[i] - 1) * prev + c * q
            parts.append(exact_identity(cur, xis[i], f"xi_{i} (44)"))
        return worst(parts)


@chb_claim(
    "gka.eq47",
    source="GKA App. E.1, eq. (47)",
    strategy=lambda: st.tuples(eigenvalue_bounds(), st.integers(0, 30)),
    case_fields=("(L, mu)", "r"),
)
def _check_eq47(case, impl, prec) -> Measurement:
    """nu_{i-1} = (4/rho^2)(1 - 1/nu_i) from nu_r = omega_r recovers omega_{r-1}, ..., omega_0; continued past i = 0 it
    increases to the other fixed point omega_2* = 2(1 + sqrt(1 - rho^2))/rho^2.

    Measured: mp: nu_i = omega_i exactly; 60 further steps increase and stay below omega_2* (a bounded monotone sequence
    converging to the only fixed point of the map above omega_0 = 2).
    """
    (L, mu), r = case
    rho = (L - mu) / (L + mu)
    # the reversed map multiplies errors by 4/(rho^2 omega^2) <= 4/(rho^2 omega_1*^2) per step: carry those digits
    growth = 4.0 / (rho * rho * float(mp_omega_star(mpf(rho * rho))) ** 2)
    with mpla.exact(), mpmath.workdps(mpmath.mp.dps + int(r * math.log10(max(growth, 1.0))) + 10):
        Lm, mum = mpf(L), mpf(mu)
        rho2 = ((Lm - mum) / (Lm + mum)) ** 2
        w = mp_weights(Lm, mum, r)
        w2 = 2 * (1 + mpmath.sqrt(1 - rho2)) / rho2
        nu, parts = w[r], []
        for i in range(r, 0, -1):  # (47) retraces the schedule
            nu = impl["reverse_weight_mp"](nu, rho2)
            parts.append(exact_identity(nu, w[i - 1], f"nu_{i - 1}"))
        for k in range(
            60
        ):  # continued past i = 0: increasing, below omega_2*, the only fixed point above omega_0
            nxt = impl["reverse_weight_mp"](nu, rho2)
            parts += [
                exact_inequality(nu, nxt, f"increasing at step {k}"),
                exact_inequality(nxt, w2, "below omega_2*"),
            ]
            nu = nxt
        parts.append(exact_identity(4 / rho2 * (1 - 1 / w2), w2, "omega_2* fixed"))
        return worst(parts)


@formed
def _eq49(form):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            A, q, g, L, mu, r = _mp_problem(case)
            xis = [mpla.zeros(A.rows)] + impl["chebyshev_mp"](
                A, q, L, mu, r
            )  # xi_{-1}, xi_0, ..., xi_r
            w = mp_weights(L, mu, r)
            step = 2 / (L + mu)
            parts = []
            sign = 1 if form == "printed" else -1
            for i in range(r, 0, -1):
                c, b = w[i] * step, -(w[i] - 1)
                Ai = w[i] * mpla.eye(A.rows) - c * A
                rebuilt = (
                    xis[i + 1] - Ai * xis[i] + sign * c * q
                ) / b  # (49): xi_{i-2} from xi_i, xi_{i-1}
                parts.append(exact_identity(rebuilt, xis[i - 1], f"xi_{i - 2}"))
            return worst(parts or [Measurement(0.0, 1.0, "r = 0")])

    return check


_CH_EXAMPLE = (GKASystem(keys=((1.0, 0.5), (0.0, 1.0)), q=(1.0, -1.0), a=0.5), 2, (1.0, 0.5))
chb_erratum(
    Twin(
        "gka.eq49.printed",
        source="GKA App. E.1, eq. (49) (and (50) of Algorithm 2)",
        statement="""xi_{i-2} = (1/b_i)(xi_i - A_i xi_{i-1} + c_i q): Algorithm 1 can be run backwards.""",
        quantity="""mp: the rebuilt xi_{i-2} against Algorithm 1's, held to 1e-30.""",
        examples=(_CH_EXAMPLE,),
    ),
    Twin(
        "gka.eq49.corrected",
        source="GKA App. E.1, eq. (49) (corrected)",
        statement="""xi_{i-2} = (1/b_i)(xi_i - A_i xi_{i-1} - c_i q) (solving (44) for xi_{i-2}).""",
        quantity="""mp: against Algorithm 1's iterates, held to 1e-30.""",
    ),
    check=_eq49,
    strategy=lambda: _ch_cases(min_r=1, max_r=4),
)


@formed
def _alg2(flags, torch_method=None):
    def check(case, impl, prec) -> Measurement:
        s, r, gv = case
        if prec == MP:
            with mpla.exact(), mpmath.workdps(mpmath.mp.dps + _reverse_digits(case)):
                A, q, g, L, mu, r = _mp_problem(case)
                dq_t, dH_t, xis, w = impl["adjoint_mp"](A, q, g, L, mu, r)
                eqs = {k: v for k, v in flags.items() if k.startswith("eq")}
                dq, dH = impl["algorithm2_mp"](A, q, g, L, mu, r, xis[-1], xis[-2], w[-1], **eqs)
                return worst([exact_identity(dq, dq_t, "dq"), exact_identity(dH, dH_t, "dH")])
        ar = arith(prec)
        rs = impl["gka_ridge"](s.H(ar.dtype), s.a)
        L, mu = float(rs.L), float(rs.mu)
        q, g = s.q_tensor(ar.dtype), torch.tensor(gv, dtype=F64).to(ar.dtype)
        if torch_method == "printed":
            dq, dH = impl["algorithm2_as_printed"](
                rs.A, q, g, L=L, mu=mu, iters=r, bf16_mode=ar.mode
            )
        else:
            dq, dH = impl["chebyshev_backward"](
                rs.A, q, g, L=L, mu=mu, iters=r, method=torch_method, bf16_mode=ar.mode
            )
        c = impl["working_constants"]("chebyshev", L, mu, ar)
        with mpla.exact():
            Am = mpla.mat(rs.A.to(F64).tolist())
            dq_t, dH_t, _, _ = impl["adjoint_mp"](
                Am,
                mpla.vec(q.to(F64).tolist()),
                mpla.vec(g.to(F64).tolist()),
                mpf(L),
                mpf(mu),
                r,
                step=mpf(float(c["step"])),
                rho2=mpf(float(c["rho2"])),
            )
            ev = mpla.eigvalsh(Am)
            kappa = float(max(mpf(L), ev[-1]) / min(mpf(mu), ev[0]))
        e_q = rel64(dq, mp_vector_tensor(dq_t))
        e_H = rel64(dH, mp_matrix_tensor(dH_t))
        amp = 1.0
        if flags.get("amplified"):
            # first-order growth of rounding errors: A_r in the rebuilt iterates (49), Gamma_r in the recovered weights (47)
            amp = impl["reversal_amplification"](L, mu, r) * impl["omega_recovery_amplification"](
                L, mu, r
            )
        bound = allowance(kappa, s.D, prec) * amp
        return worst([Measurement(e_q, bound, "dq"), Measurement(e_H, bound, "dH")])

    return check


_ALL_PRINTED = dict(eq50="printed", eq53="printed", eq54="printed")
_ALL_CORRECTED = dict(eq50="corrected", eq53="corrected", eq54="corrected")
chb_erratum(
    Twin(
        "gka.alg2.printed",
        source="GKA App. F, Algorithm 2 (eqs. (50)-(54))",
        statement="""Algorithm 2 returns the gradients dq, dH of Algorithm 1's output from xi_r, xi_{r-1},
                              omega_r alone.""",
        check=_alg2(_ALL_PRINTED, "printed"),
        quantity="""mp: Algorithm 2 as printed against the exact adjoint (46)-(48), held to 1e-30; float64:
                             solvers.algorithm2_as_printed against it, held to the forward's allowance.""",
        precisions=(MP, "float64"),
        examples=(_CH_EXAMPLE,),
    ),
    Twin(
        "gka.alg2.corrected",
        source="GKA App. F, Algorithm 2 (corrected)",
        statement="""Algorithm 2 with (50) subtracting c_i q, (53) using c_0 = 2/(L+mu) for d xi_0 (not 2
                              nu_0/(L+mu) = 4/(L+mu)), and no i = 0 term in (54) returns the exact gradient.""",
        check=_alg2(dict(_ALL_CORRECTED, amplified=True), "reverse"),
        quantity="""mp: against the exact adjoint, held to 1e-30; float64/float32:
                             solvers.chebyshev_backward(method='reverse') against the mp adjoint of the working loop, <=
                             allowance x A_r x Gamma_r (the amplification bounds of analysis.references.chebyshev_backward).""",
        precisions=(MP, "float64", "float32"),
    ),
    strategy=lambda: _ch_cases(min_r=1, max_r=4),
)
chb_claim(
    "gka.alg2.eq50.printed",
    statement="""Eq. (50) (the sign of c_i q) as printed, everything else corrected.""",
    source="GKA App. F, Algorithm 2, eq. (50) alone",
    quantity="""mp: dq, dH against the exact adjoint.""",
    strategy=lambda: _ch_cases(min_r=1, max_r=4),
    expected=FAILS,
    twin="gka.alg2.corrected",
    examples=(_CH_EXAMPLE,),
)(_alg2(dict(_ALL_CORRECTED, eq50="printed")))
chb_claim(
    "gka.alg2.eq53.printed",
    statement="""Eq. (53) as printed at i = 1 (d xi_0 weighted by 2 nu_0/(L+mu) with nu_0 from (52)),
                       everything else corrected.""",
    source="GKA App. F, Algorithm 2, eq. (53) alone",
    quantity="""mp: dq against the exact adjoint.""",
    strategy=lambda: _ch_cases(min_r=1, max_r=4),
    expected=FAILS,
    twin="gka.alg2.corrected",
    examples=(_CH_EXAMPLE,),
    note="""The initialisation nu_0 <- 1 would give c_0, but (52) overwrites nu_0 = omega_0 = 2 at i = 1 before
                  (53) uses it.""",
)(_alg2(dict(_ALL_CORRECTED, eq53="printed")))
chb_claim(
    "gka.alg2.eq54",
    statement="""Eq. (54)'s i = 1 step adds -2 nu_0/(L+mu) d xi_0 xi_{-1}^T; with (50) corrected the rebuilt
                       xi_{-1} is 0, so the term vanishes and (54) is right in exact arithmetic.""",
    source="GKA App. F, Algorithm 2, eq. (54) alone",
    quantity="""mp: dH with (54) as printed (others corrected) against the exact adjoint.""",
    strategy=lambda: _ch_cases(min_r=1, max_r=4),
)(_alg2(dict(_ALL_CORRECTED, eq54="printed")))


def _stability_cases():
    # the paper's setting: a in {0.02, 0.05, 0.1} (kappa <= 51, 21, 11: Remark 2's range kappa >= 10), r = 20 or 30
    return _ch_cases(min_r=20, max_r=30, a=(0.02, 0.05, 0.1), max_dim=4)


_STAB_EXAMPLES = (
    (GKASystem(keys=((1.0, 0.0),), q=(1.0, 1.0), a=0.1), 30, (1.0, -1.0)),  # rank one: kappa = 11
    (
        GKASystem(
            keys=((1.0, 0.0, 0.0), (0.0, 0.5, 0.0), (0.0, 0.0, 0.25)), q=(1.0, 1.0, 1.0), a=0.02
        ),
        30,
        (1.0, -1.0, 0.5),
    ),
)
chb_erratum(
    Twin(
        "gka.remark2.stability.printed",
        source="GKA App. E.1, Remark 2",
        statement="""Reversing the Chebyshev iteration by (49) 'can be done stably' (b_i is in [0.25, 1] for
                              kappa >= 10): the reverse-mode gradient is as accurate as the forward solve.""",
        check=_alg2({}, "reverse"),
        quantity="""solvers.chebyshev_backward(method='reverse') (corrected Algorithm 2) against the mp
                             adjoint of the working loop, held to the forward's rounding allowance c kappa (D u_acc +
                             u_store).""",
        examples=_STAB_EXAMPLES,
        note="""The reversed recurrence multiplies errors by (omega_i - 1)^(-1/2) -> R_a^-1 per step and the
                         reversed schedule (47) by ~R_a^-2 (omega_1* repels it): dividing by b_i is harmless, running
                         the recurrence backwards is not.""",
    ),
    Twin(
        "gka.remark2.stability.corrected",
        source="GKA App. E.1, Remark 2 (corrected)",
        statement="""The reverse-mode gradient's rounding error is the forward allowance amplified by A_r =
                              prod (omega_i - 1)^(-1/2) ~ R_a^-r (rebuilt iterates) times Gamma_r ~ R_a^-2r (recovered
                              weights).""",
        check=_alg2({"amplified": True}, "reverse"),
        quantity="""as the printed form, held to allowance x A_r x Gamma_r.""",
        loose=2.5e-7,
    ),
    strategy=_stability_cases,
    precisions=("float64", "float32", "bfloat16/storage"),
)


@chb_claim(
    "gka.lemma2",
    source="GKA Sec. 4.2.3, Lemma 2; App. E, eqs. (42)-(43)",
    strategy=lambda: _ch_cases(max_r=6),
    precisions=ALL_PRECISIONS,
)
def _check_lemma2(case, impl, prec) -> Measurement:
    """For Algorithm 1 (symmetric H), the gradient of q by autograd through the loop equals the implicit one of Table 1,
    CH(H, d xi_r, r): xi_r = p_r(H) q with p_r(H) symmetric.

    Measured: mp: mpmath.diff of <g, xi_r> w.r.t. q against CH(H, g, r), held to 1e-30. Working precisions:
    chebyshev_backward 'implicit' vs 'autograd', distance / ||dq|| <= 2 x allowance.
    """
    s, r, gv = case
    if prec == MP:
        with mpla.exact():
            A, q, g, L, mu, r = _mp_problem(case)
            dq_auto = mpla.vec(
                mpla.grad(
                    lambda qs: mpla.dot(g, impl["chebyshev_mp"](A, mpla.vec(qs), L, mu, r)[-1]),
                    list(q),
                )
            )
            dq_impl = impl["implicit_dq_mp"](A, g, L, mu, r)  # Table 1: CH(H, d xi, r)
            return exact_identity(dq_impl, dq_auto, f"r={r}")
    ar = arith(prec)
    rs = impl["gka_ridge"](s.H(ar.dtype), s.a)
    L, mu = float(rs.L), float(rs.mu)
    q, g = s.q_tensor(ar.dtype), torch.tensor(gv, dtype=F64).to(ar.dtype)
    kw = dict(L=L, mu=mu, iters=r, bf16_mode=ar.mode)
    dq_i, _ = impl["chebyshev_backward"](rs.A, q, g, method="implicit", **kw)
    dq_a, _ = impl["chebyshev_backward"](rs.A, q, g, method="autograd", **kw)
    c = impl["working_constants"]("chebyshev", L, mu, ar)
    with mpla.exact():
        Am = mpla.mat(rs.A.to(F64).tolist())
        dq_t, _, _, _ = impl["adjoint_mp"](
            Am,
            mpla.vec(q.to(F64).tolist()),
            mpla.vec(g.to(F64).tolist()),
            mpf(L),
            mpf(mu),
            r,
            step=mpf(float(c["step"])),
            rho2=mpf(float(c["rho2"])),
        )
        ev = mpla.eigvalsh(Am)
        kappa = float(max(mpf(L), ev[-1]) / min(mpf(mu), ev[0]))
    d = float(torch.linalg.vector_norm(dq_i.to(F64) - dq_a.to(F64)))
    n = float(torch.linalg.vector_norm(mp_vector_tensor(dq_t)))
    # each of the two is within the forward allowance of the exact (mp) value: their distance within twice it
    return Measurement(
        d / n if n > 0 else d, 2 * allowance(kappa, s.D, prec), f"r={r}, implicit vs autograd"
    )


@formed
def _lemma2_dH(kind):
    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            A, q, g, L, mu, r = _mp_problem(case)
            ch = impl["chebyshev_mp"]
            dH_impl = impl["implicit_dH_mp"](A, q, g, L, mu, r)  # Table 1 / eq. (12) with x = xi_r
            dH_loop = mpla.matrix_grad(lambda M: mpla.dot(g, ch(M, q, L, mu, r)[-1]), A)
            if kind == "equal":
                return exact_identity(dH_impl, dH_loop, f"r={r}")
            dH_star = -mpla.outer(mpla.solve(A, g), mpla.solve(A, q))
            if mpla.fro(dH_star) == 0:
                return Measurement(0.0, 1.0, "zero gradient")
            gap = mpla.fro(dH_impl - dH_loop) / mpla.fro(dH_star)
            return exact_inequality(
                gap,
                mpf(impl["implicit_dH_gap_bound"](float(L), float(mu), r)) * (1 + mpf(2) ** -40),
                f"r={r}",
            )

    return check


@formed
def _lemma2_cg(kind):
    def check(case, impl, prec) -> Measurement:
        s, r, gv = case
        with mpla.exact():
            A, q, g, L, mu, _ = _mp_problem(case)
            r = r if kind == "short" else A.rows
            cg = impl["cg_mp"]
            dq_auto = mpla.vec(mpla.grad(lambda qs: mpla.dot(g, cg(A, mpla.vec(qs), r)), list(q)))
            return exact_identity(cg(A, g, r), dq_auto, f"r={r}, D={A.rows}")

    return check


def _cg_cases():
    @st.composite
    def build(draw):
        s, _, g = draw(_ch_cases(max_r=0))
        if s.D < 2:
            s = type(s)(
                keys=tuple(k + (0.5,) for k in s.keys) + ((0.0, 1.0),), q=s.q + (1.0,), a=s.a
            )
            g = tuple(g) + (0.0,)
        return s, draw(st.integers(1, s.D - 1)), g

    return build()


_CG_EXAMPLE = (GKASystem(keys=((1.0, 0.0), (0.0, 2.0)), q=(1.0, 1.0), a=0.5), 1, (1.0, 0.0))
chb_claim(
    "gka.lemma2.dH",
    statement="""Does Lemma 2 extend to dH: is the implicit -dq x^T (x = xi_r) the gradient of the truncated
                       loop?""",
    source="GKA Lemma 2 / Table 1, extended to dH (question, not claimed)",
    quantity="""mp: -CH(H,g,r) xi_r^T against mpmath.diff of <g, xi_r> w.r.t. H, held to 1e-30.""",
    strategy=lambda: _ch_cases(max_r=4),
    expected=FAILS,
    form=EXTENSION,
    examples=(_CH_EXAMPLE,),
    note="""It does not: it is the exact solve's dH evaluated at xi_r.""",
)(_lemma2_dH("equal"))
chb_claim(
    "gka.lemma2.dH_gap",
    statement="""The implicit dH differs from the truncated loop's by at most eps_r (2 (r+1)^2 kappa/(kappa-1)
                       + 1 + eps_r) relative to ||H^{-1} g|| ||H^{-1} q||, eps_r = 1/T_{r+1}(1/rho)
                       (analysis.references.chebyshev_backward.implicit_dH_gap_bound).""",
    source="GKA Lemma 2 / Table 1, extended to dH (our bound)",
    quantity="""mp: ||dH_impl - dH_loop||_F / ||dH*||_F against the bound.""",
    strategy=lambda: _ch_cases(max_r=6),
    form=EXTENSION,
)(_lemma2_dH("gap"))
chb_claim(
    "gka.lemma2.cg",
    statement="""Does Lemma 2 hold for CG: is CG(H, g, r) the gradient of <g, CG(H, q, r)> w.r.t. q?""",
    source="GKA Lemma 2 / Table 1, extended to CG (question, not claimed)",
    quantity="""mp: against mpmath.diff through the CG recurrence, r < D, held to 1e-30.""",
    strategy=_cg_cases,
    expected=FAILS,
    form=EXTENSION,
    examples=(_CG_EXAMPLE,),
    note="""CG's coefficients depend on q (CG is not linear in q), so no.""",
)(_lemma2_cg("short"))
chb_claim(
    "gka.lemma2.cg_full",
    statement="""With r >= D steps CG is the exact solve in exact arithmetic, and then its implicit gradient is
                       exact.""",
    source="GKA Lemma 2 / Table 1, extended to CG (our statement)",
    quantity="""mp: CG(H, g, D) against mpmath.diff of <g, CG(H, q, D)>.""",
    strategy=_cg_cases,
    form=EXTENSION,
)(_lemma2_cg("full"))


@formed
def _alg2_inputs(form):
    """Algorithm 2's Input line lists H, d xi_r, L, mu, r and omega_r (with an empty slot); its body also reads q
    ((50) and the xi_{i-2} it rebuilds) and the forward's last iterates xi_r, xi_{r-1}. Measured on two problems that
    agree in every listed input but have q' = 2q (so the forward's iterates double): the relative change of dH.
    ``printed`` (the outputs are a function of the listed inputs): the change, held to 0; ``corrected`` (q and
    xi_r, xi_{r-1} are inputs too, so the outputs may depend on them): value 1 if the change is 0, held to 0."""

    def check(case, impl, prec) -> Measurement:
        with mpla.exact():
            A, q, g, L, mu, r = _mp_problem(case)
            outs = []
            for qq in (q, 2 * q):
                _, _, xis, w = impl["adjoint_mp"](A, qq, g, L, mu, r)
                outs.append(impl["algorithm2_mp"](A, qq, g, L, mu, r, xis[-1], xis[-2], w[-1]))
            change = mpla.fro(outs[1][1] - outs[0][1]) / (mpla.fro(outs[0][1]) + mpla.exact_tol())
            if form == "printed":
                return Measurement(
                    float(change),
                    float(mpla.exact_tol()),
                    "dH changes with q at equal listed inputs",
                )
            if mpla.fro(outs[0][1]) == 0:
                return Measurement(0.0, 1.0, "dH = 0 (q = 0 or d xi_r = 0): nothing can change")
            return Measurement(
                float(change == 0), 0.0, f"relative change of dH with q: {mpmath.nstr(change, 3)}"
            )

    return check


chb_erratum(
    Twin(
        "gka.alg2.inputs.printed",
        source="GKA App. F, Algorithm 2, line 1 (Input)",
        statement="""Algorithm 2 computes dq, dH from its listed inputs H, d xi_r, L, mu, r and the final
                              weight omega_r.""",
        quantity="""mp: two problems equal in every listed input with q' = 2q (and the forward iterates they
                             give): relative change of dH, held to 1e-30.""",
        examples=(_CH_EXAMPLE,),
        note="""The body reads q in (50) and xi_r, xi_{r-1} in the initialisation and at i = r; the input
                         line has an empty slot.""",
    ),
    Twin(
        "gka.alg2.inputs.corrected",
        source="GKA App. F, Algorithm 2, line 1 (corrected)",
        statement="""Inputs: H, q, d xi_r, L, mu, r, omega_r and the forward's xi_r, xi_{r-1}; dH does
                              depend on q.""",
        quantity="""mp: value 1 if dH does not change with q, held to 0.""",
    ),
    check=_alg2_inputs,
    strategy=lambda: _ch_cases(min_r=1, max_r=3),
)
