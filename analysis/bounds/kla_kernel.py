"""Rounding bound of the KLA chunkwise kernel (``kernels.kla_chunkwise``) in its precision model.

The kernel does not run ``solvers.kla_chunkwise``'s algorithm: it inverts each chunk's unit lower
triangular matrix ``I + L`` (by substitution on 16 x 16 diagonal blocks and block forward
substitution, in float32) instead of substituting the right-hand side, applies the decays to
products rather than operands, and -- in the ``"bf16"``/``"tf32"`` models -- rounds the operands
of its GEMMs. So ``analysis.bounds.kaczmarz.kla_chunkwise_bound`` does not bound it; this
module does, step by step in the kernel's order (kernels/kla.py), with the same technique:

* every computed quantity ``x`` carries a componentwise bound ``E_x >= |x^ - x|``, evaluated in
  float64 along the exact trajectory and propagated to first order (products, sums, exp);
* rounding units: ``u = 2^-24`` for float32 elementwise operations and sums; ``u_dot = 2^-23``
  for the float32 accumulation inside ``tl.dot`` (tensor cores add with truncation, Fasi et al.
  2021, so twice u); ``u_op`` for each operand a GEMM rounds (:data:`OPERAND_ROUNDING`: bf16
  2^-8, tf32 2^-10 (truncation), tf32x3 2^-19 (the split's remainder and the dropped lo x lo
  product), ieee 0); the inputs q, k, v only when their dtype does not fit the operand format
  (float32 inputs in the bf16 / tf32 models);
* an inner product of n terms: ``|fl(a^T b) - a^T b| <= gamma_n |a|^T |b|`` (Higham Lemma 3.1),
  operand roundings adding ``(u_a + u_b) |a|^T |b|``; a sum in any order: ``gamma_{n-1}``;
  ``exp`` and ``log`` accurate to 2u (one ulp); the diagonal blocks of the inverse by
  substitution: ``(I + N) X^ = I + R``, ``|R| <= gamma_16 |N| |X^|`` (Higham Thm. 8.5 on the
  columns of I), so ``|X^ - X| <= |X| E_N |X| + gamma_16 |X| |N| |X|``;
* the state error of earlier chunks travels through the exact token maps, of norm
  ``G_t <= max(alpha_t) max(1, |1 - beta_t ||k_t||^2|)`` (as in analysis.bounds.kaczmarz);
  the error made within a chunk is the Frobenius norm of its componentwise bound.

The stored result's rounding (to ``out_dtype``) is not included: a caller adds
``u(out) ||o||`` (analysis.testing.harness does the same).
"""

from __future__ import annotations

import numbers

import torch

from analysis.precision import gamma
from solvers.kla import check_arguments

F64 = torch.float64
U = 2.0**-24
U_DOT = 2.0**-23
SUB = 16  # edge of the diagonal blocks the kernel inverts by substitution
# Relative rounding of one GEMM operand in each model (kernels/kla.py, "Precision model").
OPERAND_ROUNDING = {"ieee": 0.0, "tf32x3": 2.0**-19, "tf32": 2.0**-10, "bf16": 2.0**-8}


def _mm(A, EA, B, EB, n: int, opA: float, opB: float):
    """``A @ B`` as a tl.dot with operands rounded by opA, opB: value and error bound."""
    aA, aB = A.abs(), B.abs()
    return A @ B, aA @ EB + EA @ aB + (gamma(n, U_DOT) + opA + opB) * (aA @ aB)


def _exp(x, Ex):
    """``exp`` of a computed x with error Ex: value and error (exp accurate to 2u)."""
    y = torch.exp(x)
    return y, y * (torch.expm1(Ex) * (1 + 2 * U) + 2 * U)


def _input_rounding(precision: str, input_dtype: torch.dtype) -> float:
    """The operand rounding of the inputs q, k, v: none when they already fit the format."""
    if precision == "ieee" or input_dtype == torch.bfloat16:
        return 0.0
    return OPERAND_ROUNDING[precision]


def _padded(x, C: int, dim: int, value: float = 0.0):
    n = x.shape[dim]
    if n == C:
        return x
    shape = list(x.shape)
    shape[dim] = C - n
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim)


def _inverse_bound(L, EL, NB: int):
    """The chunk's ``(I + L)^{-1}`` as the kernel computes it (kernels.kla.prepare_kernel):
    exact value and componentwise error bound, both ``(..., C, C)``."""
    C = L.shape[-1]
    eye = torch.eye(C, dtype=F64, device=L.device)
    X = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
    EX = torch.zeros_like(X)
    blk = lambda M, i, j: M[..., i * SUB : (i + 1) * SUB, j * SUB : (j + 1) * SUB]  # noqa: E731
    for i in range(NB):
        Xi, Ni = blk(X, i, i), blk(L, i, i)
        aX = Xi.abs()
        EX[..., i * SUB : (i + 1) * SUB, i * SUB : (i + 1) * SUB] = aX @ blk(EL, i, i) @ aX + gamma(
            SUB, U
        ) * (aX @ Ni.abs() @ aX)
    for i in range(1, NB):
        for j in range(i - 1, -1, -1):
            # X_ij = -X_ii sum_{j<=m<i} L_im X_mj: each product a 16-term dot, then nm - 1 additions
            Z = sum(blk(L, i, m) @ blk(X, m, j) for m in range(j, i))
            nm = i - j
            EZ = sum(
                blk(L, i, m).abs() @ blk(EX, m, j) + blk(EL, i, m) @ blk(X, m, j).abs()
                for m in range(j, i)
            )
            EZ = EZ + gamma(SUB + nm, U_DOT) * sum(
                blk(L, i, m).abs() @ blk(X, m, j).abs() for m in range(j, i)
            )
            Xii = blk(X, i, i)
            E = Xii.abs() @ EZ + blk(EX, i, i) @ Z.abs() + gamma(SUB, U_DOT) * (Xii.abs() @ Z.abs())
            EX[..., i * SUB : (i + 1) * SUB, j * SUB : (j + 1) * SUB] = E
    return X, EX


def kla_kernel_bound(
    q,
    k,
    v,
    *,
    alpha,
    eta,
    eps: float = 1e-6,
    chunk_size: int = 64,
    initial_state=None,
    coefficient: str = "kaczmarz",
    normalize_queries: bool = True,
    input_precision: str,
    input_dtype: torch.dtype,
):
    """Bounds on ``||o^_t - o_t||_2`` ``(..., T, H)`` and ``||S^_T - S_T||_F`` ``(..., H)`` for
    ``kernels.kla_chunkwise`` with ``input_precision`` on inputs of ``input_dtype`` (q, k, v,
    alpha, eta, initial_state as the kernel received them, any float dtype), exact values in
    float64. See the module docstring for the model; chunk_size 16, 32 or 64."""
    if (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, numbers.Integral)
        or chunk_size not in (16, 32, 64)
    ):
        raise ValueError(f"chunk_size must be 16, 32 or 64, got {chunk_size!r}")
    if not isinstance(input_precision, str) or input_precision not in OPERAND_ROUNDING:
        raise ValueError(
            f"input_precision must be one of {tuple(OPERAND_ROUNDING)}, got {input_precision!r}"
        )
    if not isinstance(input_dtype, torch.dtype) or not input_dtype.is_floating_point:
        raise TypeError(f"input_dtype must be a floating torch.dtype, got {input_dtype!r}")
    eps = check_arguments(
        q, k, v, alpha, eta, eps, initial_state, coefficient, normalize_queries, zero_queries=True
    )
    C = chunk_size
    NB = C // SUB
    u_op = OPERAND_ROUNDING[input_precision]
    u_in = _input_rounding(input_precision, input_dtype)
    *lead, T, H, d_k = k.shape
    dev = k.device
    d_v = v.shape[-1]
    qh, kh, vh = (x.to(F64).movedim(-3, -2) for x in (q, k, v))  # (..., H, T, d)
    per_channel = isinstance(alpha, torch.Tensor) and alpha.ndim == k.ndim
    al = torch.as_tensor(alpha, dtype=F64, device=dev)
    al = (
        al.expand(*k.shape).movedim(-3, -2)
        if per_channel
        else al.expand(*k.shape[:-1]).movedim(-2, -1)
    )
    et = torch.as_tensor(eta, dtype=F64, device=dev).expand(*k.shape[:-1]).movedim(-2, -1)
    S = (
        torch.zeros(*lead, H, d_k, d_v, dtype=F64, device=dev)
        if initial_state is None
        else initial_state.to(F64).expand(*lead, H, d_k, d_v).clone()
    )
    # beta (Kaczmarz eq. (3)) as the kernel forms it: n = sum k^2, den = n + eps, eta / den
    n = (kh * kh).sum(-1)
    if coefficient == "gdn":
        beta, Ebeta = et, torch.zeros_like(et)
    else:
        den = n + eps
        live = den > 0
        beta = torch.where(
            live, et / torch.where(live, den, torch.ones_like(den)), torch.zeros_like(den)
        )
        Eden = gamma(d_k, U) * n + U * den
        Ebeta = torch.where(
            live,
            beta * (Eden / torch.where(live, den, torch.ones_like(den)) + U),
            torch.zeros_like(den),
        )
    a_max = al.amax(-1) if per_channel else al
    growth = a_max * torch.clamp((1 - beta * n).abs(), min=1.0)
    E = torch.zeros(*lead, H, dtype=F64, device=dev)
    bounds = []
    for start in range(0, T, C):
        sl = slice(start, min(start + C, T))
        Ce = sl.stop - sl.start
        K, Q, V = (_padded(x[..., sl, :], C, -2) for x in (kh, qh, vh))
        B, EB = _padded(beta[..., sl], C, -1), _padded(Ebeta[..., sl], C, -1)
        la = torch.log(al[..., sl, :] if per_channel else al[..., sl])
        g = torch.cumsum(la, -2 if per_channel else -1)
        Eg = (2 * U + gamma(C, U)) * g.abs()  # log to 2u, then a sum of <= C terms in any order
        g, Eg = (_padded(x, C, -2 if per_channel else -1, 0.0) for x in (g, Eg))
        if Ce < C:  # padded tokens repeat the last g (decay 1)
            idx = (slice(None),) * (g.ndim - (2 if per_channel else 1)) + (slice(Ce, C),)
            g[idx] = g.select(-2 if per_channel else -1, Ce - 1).unsqueeze(
                -2 if per_channel else -1
            )
            Eg[idx] = Eg.select(-2 if per_channel else -1, Ce - 1).unsqueeze(
                -2 if per_channel else -1
            )
        lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=dev))
        strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=dev), -1)
        # decay ratios exp(g_i - g_j), j <= i: (..., C, C) or (..., C, C, d_k)
        if per_channel:
            d = g.unsqueeze(-2) - g.unsqueeze(-3)
            Ed = Eg.unsqueeze(-2) + Eg.unsqueeze(-3) + U * d.abs()
            m3 = lower.unsqueeze(-1)
            r, Er = _exp(
                torch.where(m3, d, torch.zeros_like(d)), torch.where(m3, Ed, torch.zeros_like(Ed))
            )
            r, Er = (
                torch.where(m3, r, torch.zeros_like(r)),
                torch.where(m3, Er, torch.zeros_like(Er)),
            )
        else:
            d = g.unsqueeze(-1) - g.unsqueeze(-2)
            Ed = Eg.unsqueeze(-1) + Eg.unsqueeze(-2) + U * d.abs()
            r, Er = _exp(
                torch.where(lower, d, torch.zeros_like(d)),
                torch.where(lower, Ed, torch.zeros_like(Ed)),
            )
            r, Er = (
                torch.where(lower, r, torch.zeros_like(r)),
                torch.where(lower, Er, torch.zeros_like(Er)),
            )
        gam, Egam = _exp(g, Eg)

        def decayed(X, Y, mask):
            """``sum_c x_ic y_jc r_ij(c)`` as the kernel forms it (masked): value, error."""
            if per_channel:  # channel loop: (x*y)*exp, summed over d_k in float32
                t = X.unsqueeze(-2) * Y.unsqueeze(-3)
                val = (t * r).sum(-1)
                err = (t.abs() * (gamma(d_k + 2, U) * r + Er)).sum(-1)
            else:  # tl.dot, then exp(g_i - g_j) times it
                G = X @ Y.transpose(-1, -2)
                EG = (gamma(d_k, U_DOT) + 2 * u_in) * (X.abs() @ Y.abs().transpose(-1, -2))
                val = r * G
                err = r * EG + Er * G.abs() + U * val.abs()
            z = torch.zeros_like(val)
            return torch.where(mask, val, z), torch.where(mask, err, z)

        M, EM = decayed(K, K, strict)
        L = B.unsqueeze(-1) * M
        EL = B.unsqueeze(-1) * EM + EB.unsqueeze(-1) * M.abs() + U * L.abs()
        X, EX = _inverse_bound(L, EL, NB)
        Xp = X * B.unsqueeze(-2)  # X' = X diag(beta), stored as a GEMM operand
        EXp = EX * B.unsqueeze(-2) + X.abs() * EB.unsqueeze(-2) + (U + u_op) * Xp.abs()
        Pm, EP = decayed(Q, K, lower)
        EP = EP + u_op * Pm.abs()

        # recurrence: the state S (exact, float64) is a GEMM operand (u_op)
        if per_channel:
            KG = K * gam
            EKG = K.abs() * Egam + U * KG.abs()
            Y, EY = _mm(KG, EKG, S, torch.zeros_like(S), d_k, u_op, u_op)
            QG = Q * gam
            EQG = Q.abs() * Egam + U * QG.abs()
            Z, EZ = _mm(QG, EQG, S, torch.zeros_like(S), d_k, u_op, u_op)
        else:
            KS, EKS = _mm(K, torch.zeros_like(K), S, torch.zeros_like(S), d_k, u_in, u_op)
            Y = gam.unsqueeze(-1) * KS
            EY = gam.unsqueeze(-1) * EKS + Egam.unsqueeze(-1) * KS.abs() + U * Y.abs()
            QS, EQS = _mm(Q, torch.zeros_like(Q), S, torch.zeros_like(S), d_k, u_in, u_op)
            Z = gam.unsqueeze(-1) * QS
            EZ = gam.unsqueeze(-1) * EQS + Egam.unsqueeze(-1) * QS.abs() + U * Z.abs()
        R = V - Y
        ER = EY + U * R.abs()
        Uc, EU = _mm(Xp, EXp, R, ER, C, 0.0, u_op)
        PU, EPU = _mm(Pm, EP, Uc, EU, C, 0.0, u_op)
        On = Z + PU
        EOn = EZ + EPU + U * On.abs()
        qn = Q.norm(dim=-1)
        if normalize_queries:
            safe = torch.where(qn > 0, qn, torch.ones_like(qn)).unsqueeze(-1)
            O = On / safe
            rel_qn = gamma(d_k, U) / 2 + U
            EO = EOn / safe + (rel_qn + U) * O.abs()
            nu = qn
        else:
            EO = EOn
            nu = torch.ones_like(qn)
        G_i = torch.cumprod(_padded(growth[..., sl], C, -1, 1.0), -1)
        B_o = EO.norm(dim=-1) + G_i * E.unsqueeze(-1) * qn / torch.where(
            nu > 0, nu, torch.ones_like(nu)
        )
        bounds.append(B_o[..., :Ce])

        # state update S_C = gamma_C S + (decayed K)^T U (rows beyond the chunk's end are zero)
        row = -3 if per_channel else -2  # the i of r_ij(c)
        r_end, Er_end = r.select(row, C - 1), Er.select(row, C - 1)  # (..., C) or (..., C, d_k)
        valid = (torch.arange(C, device=dev) < Ce).to(F64)
        g_C, Eg_C = _exp(
            g.select(-2 if per_channel else -1, C - 1), Eg.select(-2 if per_channel else -1, C - 1)
        )
        if per_channel:
            KR = K * r_end * valid.unsqueeze(-1)
            EKR = K.abs() * Er_end * valid.unsqueeze(-1) + U * KR.abs()
            KW, EKW = _mm(KR.transpose(-1, -2), EKR.transpose(-1, -2), Uc, EU, C, u_op, u_op)
            decayed_S = g_C.unsqueeze(-1) * S
            Edecayed = (Eg_C.unsqueeze(-1) + U * g_C.unsqueeze(-1)) * S.abs()
        else:
            rv = r_end * valid
            W = Uc * rv.unsqueeze(-1)
            EW = EU * rv.unsqueeze(-1) + Uc.abs() * (Er_end * valid).unsqueeze(-1) + U * W.abs()
            KW, EKW = _mm(
                K.transpose(-1, -2), torch.zeros_like(K.transpose(-1, -2)), W, EW, C, u_in, u_op
            )
            decayed_S = g_C[..., None, None] * S
            Edecayed = (Eg_C[..., None, None] + U * g_C[..., None, None]) * S.abs()
        S_new = decayed_S + KW
        ES = Edecayed + EKW + U * S_new.abs()
        E = ES.flatten(-2).norm(dim=-1) + G_i[..., Ce - 1] * E
        S = S_new
    B_o = (
        torch.cat(bounds, -1).movedim(-1, -2)
        if bounds
        else torch.zeros(*lead, 0, H, dtype=F64, device=dev)
    )
    # A first-order term that overflowed float64 (inf - inf, 0 * inf) is NaN: no bound, i.e.
    # inf -- never a NaN, which no `error > bound` comparison flags.
    inf = float("inf")
    return (
        torch.nan_to_num(B_o, nan=inf, posinf=inf),
        torch.nan_to_num(E, nan=inf, posinf=inf),
    )
