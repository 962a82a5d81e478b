"""solvers.kla: tokenwise vs chunkwise, mpmath replays, the paper's claims, WY, bad input.

Bounds (analysis.bounds.kaczmarz, derivations in docs/kla.md):
* tokenwise rounding: running bound ``E_t = G_t E_{t-1} + gamma_{d_k+5} m_t + (u_acc+u_store)||S_t||``,
  G_t the token map's norm (<= 1 for KLA);
* chunkwise rounding: componentwise perturbation of L, R and the decay ratios, forward
  substitution (Higham Thm. 8.5), pushed through ``|(I + L)^{-1}|`` -- "C u growth";
* tokenwise vs chunkwise: both bounds added (each is a bound on the distance to the exact
  values);
* the paper's statements (Thm. 1, Props. 1-6, App. B, Table 6) on tensors of any size are the
  catalogue's own checks (proofs_check.claims.kla), each held to its bound (exact identities to
  1e-30 relative at 50 digits); gaps must be <= 1e-40 relative (double-double readout resolves
  ~1e-32, so 1e-28 where results come back as tensors); the printed forms that fail must fail by
  more than 1e-2.
"""

import importlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from analysis.bounds.kaczmarz import gamma, kla_chunkwise_bound, kla_tokenwise_bound
from analysis.precision import PRECISIONS
from analysis.references.kaczmarz import mp_kla, working_scalar
from analysis.testing.strategies import kla_case, kla_cases
from proofs_check.claims import kla as claims
from solvers import (
    forward_substitution,
    kaczmarz_coefficient,
    kla_chunk_outputs,
    kla_chunk_system,
    kla_chunkwise,
    kla_recurrent,
    wy_representation,
)

kla_mod = importlib.import_module("solvers.kla")
F64 = torch.float64
IDS = lambda a: a.label  # noqa: E731


def _bounds(case, arith, chunk_size=None):
    x = case.rounded(arith.dtype)
    kw = dict(
        alpha=x["alpha"],
        eta=x["eta"],
        eps=working_scalar(case.eps, arith),
        initial_state=x["initial_state"],
        coefficient=case.coefficient,
        arith=arith,
    )
    if chunk_size is None:
        return kla_tokenwise_bound(x["q"], x["k"], x["v"], **kw)
    return kla_chunkwise_bound(x["q"], x["k"], x["v"], chunk_size=chunk_size, **kw)


def tok_vs_chunk_excess(case, arith) -> float:
    """max over tokens of ``||o_tok - o_chunk|| / (B_tok + B_chunk)`` (and the same for S_T):
    <= 1 when both forms are within their rounding bounds of the exact values."""
    x = case.rounded(arith.dtype)
    kw = case.kwargs(arith.dtype, arith.mode)
    o1, S1 = kla_recurrent(x["q"], x["k"], x["v"], **kw)
    o2, S2 = kla_chunkwise(x["q"], x["k"], x["v"], chunk_size=case.chunk_size, **kw)
    Bt, BSt = _bounds(case, arith)
    Bc, BSc = _bounds(case, arith, case.chunk_size)
    d_o = (o1.to(F64) - o2.to(F64)).norm(dim=-1)
    d_S = (S1.to(F64) - S2.to(F64)).flatten(-2).norm(dim=-1)
    ratio = torch.cat([(d_o / (Bt + Bc)).flatten(), (d_S / (BSt + BSc)).flatten()])
    return float(torch.nan_to_num(ratio, nan=0.0).max()) if ratio.numel() else 0.0


def vs_mp_excess(case, arith, chunked: bool) -> float:
    """max ``||o^ - o_mp|| / B`` over tokens and ``||S^_T - S_mp|| / B_S``; <= 1 expected."""
    x = case.rounded(arith.dtype)
    kw = case.kwargs(arith.dtype, arith.mode)
    if chunked:
        o, S = kla_chunkwise(x["q"], x["k"], x["v"], chunk_size=case.chunk_size, **kw)
    else:
        o, S = kla_recurrent(x["q"], x["k"], x["v"], **kw)
    om, Sm = mp_kla(
        x["q"],
        x["k"],
        x["v"],
        alpha=x["alpha"],
        eta=x["eta"],
        eps=working_scalar(case.eps, arith),
        initial_state=x["initial_state"],
        coefficient=case.coefficient,
    )
    B, BS = _bounds(case, arith, case.chunk_size if chunked else None)
    err_o, err_S = om.distance(o), Sm.difference(S).flatten(-2).norm(dim=-1)
    return float(torch.cat([(err_o / B).flatten(), (err_S / BS).flatten()]).max())


# ----------------------------------------------------------------------------- tokenwise vs chunkwise


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
@given(case=kla_cases(coefficients=("kaczmarz", "gdn")))
def test_tokenwise_and_chunkwise_agree_to_rounding(arith, case):
    assert tok_vs_chunk_excess(case, arith) <= 1.0


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
def test_tokenwise_and_chunkwise_agree_on_hard_sizes(arith):
    # T % C != 0, d_k != d_v, per-channel decay, near-zero keys with eps = 0.
    for case in (
        kla_case(13, d_k=7, d_v=3, chunk_size=5, seed=1),
        kla_case(13, d_k=3, d_v=7, chunk_size=4, per_channel=True, seed=2),
        kla_case(11, d_k=5, d_v=2, chunk_size=3, near_zero_keys=3, zero_keys=1, eps=0.0, seed=3),
    ):
        assert tok_vs_chunk_excess(case, arith) <= 1.0


# ----------------------------------------------------------------------------- mpmath replays

MP_CASES = {
    "per-head": kla_case(16, d_k=6, d_v=4, chunk_size=5, seed=11),
    "per-channel": kla_case(16, d_k=5, d_v=3, chunk_size=4, per_channel=True, seed=12),
    "tiny-keys-eps0": kla_case(
        12,
        d_k=4,
        d_v=5,
        key_norms=(0.01, 10.0),
        near_zero_keys=3,
        zero_keys=1,
        eps=0.0,
        chunk_size=5,
        seed=13,
    ),
    "gdn": kla_case(
        14, d_k=6, d_v=4, key_norms=(1.0, 1.0), coefficient="gdn", chunk_size=6, seed=14
    ),
}


@pytest.mark.parametrize("chunked", [False, True], ids=["tokenwise", "chunkwise"])
@pytest.mark.parametrize("name", list(MP_CASES))
@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
def test_rounding_within_bound_vs_mp_replay(arith, name, chunked):
    assert vs_mp_excess(MP_CASES[name], arith, chunked) <= 1.0


@given(case=kla_cases(max_T=10, max_d=5))
def test_float64_matches_mp_replay_property(case):
    assert vs_mp_excess(case, PRECISIONS[0], chunked=False) <= 1.0
    assert vs_mp_excess(case, PRECISIONS[0], chunked=True) <= 1.0


def test_mp_chunkwise_replay_equals_tokenwise():
    # The reference's chunkwise replay (Props. 3-4, with the 1/||q|| readout) against its tokenwise
    # one at 50 digits, per head and per channel, several chunks; double-double readout: ~1e-32.
    for case in (MP_CASES["per-head"], MP_CASES["per-channel"]):
        args = dict(alpha=case.alpha, eta=case.eta, eps=case.eps, initial_state=case.initial_state)
        o_tok, _ = mp_kla(case.q, case.k, case.v, **args)
        o_chk, _ = mp_kla(case.q, case.k, case.v, chunk_size=case.chunk_size, **args)
        diff = (o_tok.hi - o_chk.hi) + (o_tok.lo - o_chk.lo)
        assert float(diff.norm(dim=-1).max() / o_tok.norm().max()) <= 1e-28


# ----------------------------------------------------------------------------- broken variants


def test_broken_missing_key_normalisation_fails_mp_check(monkeypatch):
    monkeypatch.setattr(kla_mod, "_beta", lambda k, v, eta, eps, coefficient, ar: ar.up(eta))
    assert vs_mp_excess(MP_CASES["per-head"], PRECISIONS[0], chunked=False) > 1.0


def test_broken_decay_after_write_fails_mp_check(monkeypatch):
    # S_t = D (S_{t-1} + beta k e^T): decay applied to the written state instead of before.
    original = kla_mod._decay_state
    calls = {"n": 0}

    def late(a, S):
        calls["n"] += 1
        return S if calls["n"] % 2 else original(a, S)

    monkeypatch.setattr(kla_mod, "_decay_state", late)
    assert vs_mp_excess(MP_CASES["per-head"], PRECISIONS[0], chunked=False) > 1.0


def test_broken_decay_off_by_one_fails_tok_vs_chunk(monkeypatch):
    # gamma_i = alpha_1 ... alpha_{i-1}: the cumulative decay shifted by one token.
    original = kla_mod._ChunkDecay.of.__func__

    def shifted(cls, alpha, per_channel, ar):
        d = original(cls, alpha, per_channel, ar)
        ax = -2 if per_channel else -1
        g = torch.cat(
            [torch.zeros_like(d.g.narrow(ax, 0, 1)), d.g.narrow(ax, 0, d.g.shape[ax] - 1)], ax
        )
        return cls(g, per_channel)

    monkeypatch.setattr(kla_mod._ChunkDecay, "of", classmethod(shifted))
    assert (
        tok_vs_chunk_excess(kla_case(13, d_k=5, d_v=4, chunk_size=4, seed=21), PRECISIONS[0]) > 1.0
    )


def test_broken_transposed_mask_fails_tok_vs_chunk(monkeypatch):
    original = kla_mod._ChunkDecay.pairwise

    def transposed(self, strict):
        r = original(self, strict)
        return r.transpose(-3, -2) if self.per_channel else r.transpose(-2, -1)

    monkeypatch.setattr(kla_mod._ChunkDecay, "pairwise", transposed)
    assert (
        tok_vs_chunk_excess(kla_case(13, d_k=5, d_v=4, chunk_size=4, seed=22), PRECISIONS[0]) > 1.0
    )


def test_broken_missing_query_normalisation_in_chunks_fails(monkeypatch):
    # Algorithm 1 line 7 as printed (no 1/||q_i||) disagrees with line 6 of the left panel.
    original = kla_mod._chunk_outputs
    monkeypatch.setattr(
        kla_mod,
        "_chunk_outputs",
        lambda Q, K, U, d, S0, normalize, ar: original(Q, K, U, d, S0, False, ar),
    )
    assert tok_vs_chunk_excess(kla_case(9, chunk_size=4, seed=23), PRECISIONS[0]) > 1.0


# ----------------------------------------------------------------------------- claims (mpmath)


def _token(seed, d_k=5, d_v=3, key_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    S = torch.randn(d_k, d_v, generator=g, dtype=F64)
    k = torch.randn(d_k, generator=g, dtype=F64) * key_scale
    v = torch.randn(d_v, generator=g, dtype=F64)
    return S, k, v


def _all_hold(measurements: dict):
    for claim_id, m in measurements.items():
        assert m.ok, (claim_id, m)


@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 6),
    st.integers(1, 6),
    st.floats(-3, 2),
    st.floats(0.05, 1.0),
)
def test_theorem1_holds(seed, d_k, d_v, log_key, alpha):
    # key norms over five decades, d_k, d_v up to 6: the catalogue's checks, each to its own bound
    S, k, v = _token(seed, d_k, d_v, 10.0**log_key)
    _all_hold(claims.theorem1(S, alpha, k, v))


@given(st.integers(0, 2**31 - 1), st.floats(0.05, 1.0), st.sampled_from((0.0, 1e-6, 0.5)))
def test_proposition1_holds_where_mu_is_defined(seed, eta, eps):
    S, k, v = _token(seed)
    r = claims.proposition1(S, 0.9, k, v, eta=eta, eps=eps)
    assert r["kla.prop1"].ok, r
    assert r["kla.prop1.printed"].ok == (eta != 1.0 or eps != 0.0), (
        r
    )  # mu = 1/0 only at eta = 1, eps = 0


def test_proposition1_printed_range_includes_undefined_mu():
    # Printed: "for any eta in (0, 1] and eps >= 0"; at eta = 1, eps = 0, mu = 1/0 (docs/errata.md).
    S, k, v = _token(1)
    assert claims.proposition1(S, 0.9, k, v, eta=1.0, eps=0.0)["kla.prop1.printed"].value == float(
        "inf"
    )


@given(
    st.integers(0, 2**31 - 1),
    st.floats(0.01, 1.0),
    st.sampled_from((0.0, 1e-6, 0.5)),
    st.floats(-3, 2),
)
def test_proposition2_identity_and_contraction(seed, eta, eps, log_key):
    S, k, v = _token(seed, key_scale=10.0**log_key)
    # k != 0, e != 0: eq. (5), the printed range and strict contraction, and the corrected range all hold
    _all_hold(claims.proposition2(S, 0.8, k, v, eta=eta, eps=eps))


def test_proposition2_printed_fails_for_zero_key_and_zero_residual():
    S, _, v = _token(2)
    zero_key = claims.proposition2(S, 0.8, torch.zeros(5, dtype=F64), v, eta=0.5, eps=1e-6)
    assert (
        not zero_key["kla.prop2.printed"].ok
        and zero_key["kla.prop2"].ok
        and zero_key["kla.prop2.range"].ok
    )
    assert "factor = 1" in zero_key["kla.prop2.printed"].detail
    # e_t = 0 exactly (integer data, alpha = 1): ||e+|| = ||e|| = 0, the strict "<" of the proof fails
    S_int = torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 1.0]], dtype=F64)
    k_int = torch.tensor([2.0, -1.0, 1.0], dtype=F64)
    solved = claims.proposition2(S_int, 1.0, k_int, S_int.T @ k_int, eta=0.5, eps=0.0)
    assert (
        not solved["kla.prop2.printed"].ok
        and solved["kla.prop2"].ok
        and solved["kla.prop2.range"].ok
    )


def test_chunk_readout_printed_fails_corrected_holds():
    # Algorithm 1, line 7 against line 6 on one 10-token chunk with ||q|| in [0.3, 3]
    case = kla_case(10, d_k=4, d_v=3, chunk_size=4, query_norms=(0.3, 3.0), seed=31)
    head = lambda x: x[0, :, 0]  # noqa: E731  (batch 0, head 0)
    chunk = claims.sequence_case(
        head(case.k),
        head(case.v),
        q=head(case.q),
        alpha=head(case.alpha),
        eta=head(case.eta),
        eps=case.eps,
        S0=case.initial_state[0, 0],
    )
    assert claims.measure("kla.alg1.panels.printed", chunk).value > 1e-2
    assert claims.measure("kla.alg1.panels.corrected", chunk).value <= 1e-40


def _chunk(seed, C=6, d_k=4, d_v=4):
    g = torch.Generator().manual_seed(seed)
    K = torch.randn(C, d_k, generator=g, dtype=F64)
    V = torch.randn(C, d_v, generator=g, dtype=F64)
    alpha = 0.5 + 0.5 * torch.rand(C, generator=g, dtype=F64)
    beta = 1.0 / (K * K).sum(-1) * torch.rand(C, generator=g, dtype=F64)
    return K, V, alpha, beta


@pytest.mark.parametrize("seed", [0, 1])
def test_proposition5_printed_fails_corrected_holds(seed):
    K, _, alpha, beta = _chunk(seed)
    assert claims.proposition5_gap(K, beta, alpha, form="printed") > 1e-2
    assert claims.proposition5_gap(K, beta, alpha, form="printed_b1") > 1e-2
    assert claims.proposition5_gap(K, beta, alpha, form="corrected") <= 1e-40


def test_proposition5_printed_holds_without_decay():
    # With alpha = 1 every reading coincides: the error is in the decay bookkeeping only.
    K, _, _, beta = _chunk(2)
    ones = torch.ones(K.shape[0], dtype=F64)
    for form in claims.PROP5_FORMS:
        assert claims.proposition5_gap(K, beta, ones, form=form) <= 1e-40


@pytest.mark.parametrize("seed", [0, 1])
def test_proposition6_printed_definition_fails_b1_reading_holds(seed):
    K, V, alpha, beta = _chunk(seed)
    assert claims.proposition6_gap(K, V, beta, alpha, form="printed") > 1e-2
    assert claims.proposition6_gap(K, V, beta, alpha, form="corrected") <= 1e-40


def test_state_split_printed_fails_corrected_holds():
    K, V, alpha, beta = _chunk(3)
    S0 = torch.randn(4, 4, generator=torch.Generator().manual_seed(9), dtype=F64)
    assert claims.state_split_gap(S0, K, V, beta, alpha, form="printed") > 1e-2
    assert claims.state_split_gap(S0, K, V, beta, alpha, form="corrected") <= 1e-40
    K, V, alpha, beta = _chunk(3, d_v=2)  # P_i R_0 is undefined for d_k != d_v
    assert claims.state_split_gap(S0[:, :2], K, V, beta, alpha, form="printed") == float("inf")


def test_claims_on_tensors_name_the_bad_argument():
    K, V, alpha, beta = _chunk(5)
    with pytest.raises(ValueError, match="beta must have shape"):
        claims.proposition5_gap(K, beta[:-1], alpha)
    with pytest.raises(ValueError, match="form must be one of"):
        claims.proposition5_gap(K, beta, alpha, form="reprinted")
    with pytest.raises(ValueError, match="exactly one of beta and eta"):
        claims.sequence_case(K, V, alpha=alpha)
    with pytest.raises(ValueError, match="claim_id"):
        claims.measure("kla.prop7", claims.sequence_case(K, V, alpha=alpha, beta=beta))
    with pytest.raises(ValueError, match="zero key"):
        claims.proposition5_gap(torch.zeros_like(K), beta, alpha)


def test_table6_printed_fails_corrected_holds():
    K, V, alpha, beta = _chunk(4, C=5)
    Q = torch.randn(5, 4, generator=torch.Generator().manual_seed(5), dtype=F64)
    assert claims.table6_gap(Q, K, V, beta, alpha, form="printed") > 1e-2
    assert claims.table6_gap(Q, K, V, beta, alpha, form="corrected") <= 1e-40


# ----------------------------------------------------------------------------- WY auxiliaries


def wy_backward_excess(K, V, beta, alpha, arith) -> float:
    """Residual of the computed W, U in the *corrected* recurrences (19), (21), written here
    independently in float64, over its bound: substitution's backward error gamma_C |L| |W|
    (Higham Thm. 8.5) plus forming L and the right-hand side (gamma_{d_k+3} and the decay
    ratios' 3u|g| + u sum|g|), plus storing each row (u_store |W_i|)."""
    Kd, Vd, bd, ad = (t.to(arith.dtype) for t in (K, V, beta, alpha))
    W, U = wy_representation(Kd, Vd, bd, ad, bf16_mode=arith.mode)
    K64, V64, b64 = Kd.to(F64), Vd.to(F64), bd.to(F64)
    g = torch.cumsum(torch.log(ad.to(F64)), 0)
    C, d_k = K.shape
    worst = 0.0
    for X, rhs in ((W.to(F64), torch.exp(g)[:, None] * K64), (U.to(F64), V64)):
        for i in range(C):
            coeff = (
                torch.stack([torch.exp(g[i] - g[r]) * (K64[r] @ K64[i]) for r in range(i)])
                if i
                else torch.zeros(0, dtype=F64)
            )
            coeff_abs = (
                torch.stack(
                    [torch.exp(g[i] - g[r]) * (K64[r].abs() @ K64[i].abs()) for r in range(i)]
                )
                if i
                else torch.zeros(0, dtype=F64)
            )
            resid = X[i] - b64[i] * (rhs[i] - coeff @ X[:i])
            e_ratio = arith.u_acc * (4 * float(g.abs().sum()) + 3)
            n = C + d_k + 4
            bound = (float(gamma(n, arith.u_acc)) + e_ratio) * b64[i] * (
                rhs[i].abs() + coeff_abs @ X[:i].abs()
            ) + arith.u_store * X[i].abs()
            worst = max(worst, float((resid.abs() / bound.clamp_min(1e-300)).max()))
    return worst


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
def test_wy_auxiliaries_satisfy_corrected_recurrences(arith):
    K, V, alpha, beta = _chunk(6, C=7, d_k=5, d_v=3)
    assert wy_backward_excess(K, V, beta, alpha, arith) <= 1.0


def test_broken_printed_wy_lead_term_fails(monkeypatch):
    # eq. (19) as printed: the lead term gamma_{i->i} k_i (= k_i under App. B.1's reading).
    monkeypatch.setattr(kla_mod._ChunkDecay, "gamma", lambda self: torch.ones_like(self.g))
    K, V, alpha, beta = _chunk(6, C=7, d_k=5, d_v=3)
    assert wy_backward_excess(K, V, beta, alpha, PRECISIONS[0]) > 1.0


def test_wy_u_is_the_prop3_solution_from_zero_state():
    # u of Prop. 6 and U of Prop. 3 with S_0 = 0 are the same triangular solve (bitwise).
    K, V, alpha, beta = _chunk(7, C=6, d_k=4, d_v=3)
    _, U = wy_representation(K, V, beta, alpha)
    L, R = kla_chunk_system(K, V, beta, alpha, torch.zeros(4, 3, dtype=F64))
    assert torch.equal(U, forward_substitution(L, R))
    O, S_out = kla_chunk_outputs(
        torch.randn(6, 4, dtype=F64), K, U, alpha, torch.zeros(4, 3, dtype=F64)
    )
    assert O.shape == (6, 3) and S_out.shape == (4, 3)
    bf = torch.bfloat16  # the public parts compose to the internal bf16 storage path, bitwise
    _, U_bf = wy_representation(K.to(bf), V.to(bf), beta.to(bf), alpha.to(bf))
    L_bf, R_bf = kla_chunk_system(
        K.to(bf), V.to(bf), beta.to(bf), alpha.to(bf), torch.zeros(4, 3, dtype=bf)
    )
    assert R_bf.dtype == torch.float32 and torch.equal(
        U_bf, forward_substitution(L_bf, R_bf, dtype=bf)
    )


# ----------------------------------------------------------------------------- switches and decay kinds


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
def test_gdn_and_kla_coincide_for_unit_keys_and_zero_eps(arith):
    # Keys with entries +-1/2 in d_k = 4 have ||k||^2 = 1 exactly, so beta_KLA = eta / 1 = beta_GDN
    # in every precision: the two switches give bitwise equal results.
    g = torch.Generator().manual_seed(0)
    case = kla_case(9, d_k=4, d_v=3, eps=0.0, seed=40)
    signs = torch.randint(0, 2, case.k.shape, generator=g).to(F64) - 0.5
    x = case.rounded(arith.dtype)
    k = signs.to(arith.dtype)
    kw = dict(
        alpha=x["alpha"],
        eta=x["eta"],
        eps=0.0,
        initial_state=x["initial_state"],
        bf16_mode=arith.mode,
    )
    for f in (kla_recurrent, lambda *a, **k_: kla_chunkwise(*a, chunk_size=4, **k_)):
        o1, S1 = f(x["q"], k, x["v"], coefficient="kaczmarz", **kw)
        o2, S2 = f(x["q"], k, x["v"], coefficient="gdn", **kw)
        assert torch.equal(o1, o2) and torch.equal(S1, S2)


def test_gdn_switch_changes_the_coefficient():
    case = kla_case(8, key_norms=(2.0, 3.0), seed=41)
    kw = case.kwargs(F64)
    o_kla, _ = kla_recurrent(case.q, case.k, case.v, **kw)
    o_gdn, _ = kla_recurrent(case.q, case.k, case.v, **{**kw, "coefficient": "gdn"})
    assert float((o_kla - o_gdn).norm()) > 0.1 * float(o_kla.norm())
    beta = kaczmarz_coefficient(case.k, case.eta, eps=case.eps)
    # both sides round a sum of d_k squares, the eps and the division in float64: each is within
    # gamma_{d_k+2} of the exact value (Higham eq. (3.5)), so they differ by at most twice that
    u, n = 2.0**-53, case.k.shape[-1] + 2
    assert torch.allclose(
        beta, case.eta / ((case.k**2).sum(-1) + case.eps), rtol=2 * n * u / (1 - n * u), atol=0
    )


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
def test_constant_per_channel_decay_equals_per_head(arith):
    case = kla_case(11, d_k=5, d_v=3, chunk_size=4, seed=42)
    x = case.rounded(arith.dtype)
    kw = dict(eta=x["eta"], eps=case.eps, initial_state=x["initial_state"], bf16_mode=arith.mode)
    a_head = x["alpha"]
    a_chan = a_head.unsqueeze(-1).expand(*a_head.shape, 5)
    o1, S1 = kla_recurrent(x["q"], x["k"], x["v"], alpha=a_head, **kw)
    o2, S2 = kla_recurrent(x["q"], x["k"], x["v"], alpha=a_chan, **kw)
    assert torch.equal(o1, o2) and torch.equal(
        S1, S2
    )  # Diag(alpha 1) S and alpha S: the same products
    # chunkwise: per channel sums the decayed Gram differently; both within their rounding bound
    o3, _ = kla_chunkwise(x["q"], x["k"], x["v"], alpha=a_chan, chunk_size=4, **kw)
    Bt, _ = _bounds(case, arith)
    Bc, _ = _bounds(kla_case(11, d_k=5, d_v=3, chunk_size=4, seed=42), arith, 4)
    assert bool(((o1.to(F64) - o3.to(F64)).norm(dim=-1) <= Bt + 2 * Bc).all())


def test_normalize_queries_false_reads_unnormalised():
    case = kla_case(7, seed=43)
    kw = case.kwargs(F64)
    o, _ = kla_recurrent(case.q, case.k, case.v, **kw)
    o_raw, _ = kla_recurrent(case.q, case.k, case.v, normalize_queries=False, **kw)
    qn = case.q.norm(dim=-1, keepdim=True)
    g = gamma(2 * 6 + 3, 2.0**-53)  # gamma_{2 d_k + 3}(u_64) relative, d_k = 6
    assert torch.allclose(o_raw, o * qn, rtol=g, atol=g * float(o_raw.abs().max()))


# ----------------------------------------------------------------------------- bad input and edge cases


def _small():
    c = kla_case(5, B=2, H=2, d_k=3, d_v=2, seed=50)
    return c.q, c.k, c.v, dict(alpha=c.alpha, eta=c.eta, initial_state=c.initial_state)


def test_zero_key_with_value_and_eps0_is_an_error():
    q, k, v, kw = _small()
    k = k.clone()
    k[1, 3, 0] = 0.0
    with pytest.raises(
        ValueError,
        match=r"k has a zero key with a nonzero value at head 0, token 3, batch index \(1,\)",
    ):
        kla_recurrent(q, k, v, eps=0.0, **kw)
    with pytest.raises(ValueError, match="zero key"):
        kla_chunkwise(q, k, v, eps=0.0, chunk_size=2, **kw)
    kla_recurrent(q, k, v, eps=1e-6, **kw)  # eps > 0: a zero write
    kla_recurrent(q, k, v, eps=0.0, coefficient="gdn", **kw)  # GDN never divides


def test_zero_key_with_zero_value_is_skipped():
    q, k, v, kw = _small()
    k, v = k.clone(), v.clone()
    k[:, 2], v[:, 2] = 0.0, 0.0
    _, S_before = kla_recurrent(
        q[:, :2],
        k[:, :2],
        v[:, :2],
        eps=0.0,
        **{**kw, "alpha": kw["alpha"][:, :2], "eta": kw["eta"][:, :2]},
    )
    _, S_after = kla_recurrent(
        q[:, :3],
        k[:, :3],
        v[:, :3],
        eps=0.0,
        **{**kw, "alpha": kw["alpha"][:, :3], "eta": kw["eta"][:, :3]},
    )
    assert torch.equal(S_after, kw["alpha"][:, 2, :, None, None] * S_before)  # only the decay


@pytest.mark.parametrize(
    "change, exc, match",
    [
        (dict(alpha=0.0), ValueError, r"alpha must lie in \(0.0, 1.0\]"),
        (dict(alpha=1.5), ValueError, "alpha must lie"),
        (dict(eta=-0.1), ValueError, "eta must lie"),
        (dict(eps=-1e-6), ValueError, "eps"),
        (dict(coefficient="delta"), ValueError, "coefficient"),
        (dict(bf16_mode="loose"), ValueError, "bf16_mode"),
        (dict(alpha=torch.ones(3, 3)), ValueError, "alpha has shape"),
        (
            dict(initial_state=torch.zeros(2, 2, 3, 3, dtype=F64)),
            ValueError,
            "initial_state must be",
        ),
        (
            dict(initial_state=torch.zeros(2, 2, 3, 2, dtype=torch.float32)),
            TypeError,
            "initial_state",
        ),
        (
            dict(initial_state=torch.zeros(3, 2, 2, 3, 2, dtype=F64)),
            ValueError,
            "initial_state has batch shape",
        ),
        (dict(normalize_queries=1), TypeError, "normalize_queries"),
        (dict(eta=float("nan")), ValueError, "eta has 1 non-finite"),
        (
            dict(alpha=torch.full((5, 2), float("inf"), dtype=F64)),
            ValueError,
            "alpha has 10 non-finite",
        ),
        (dict(eta=torch.ones(5, 2, dtype=torch.int64)), TypeError, "eta must be a floating tensor"),
    ],
)
def test_bad_options(change, exc, match):
    q, k, v, kw = _small()
    with pytest.raises(exc, match=match):
        kla_recurrent(q, k, v, **{**kw, **change})


@pytest.mark.parametrize("C", [0, -1])
def test_chunk_size_below_one_is_rejected(C):
    q, k, v, kw = _small()
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        kla_chunkwise(q, k, v, chunk_size=C, **kw)


def test_bad_shapes_and_values():
    q, k, v, kw = _small()
    with pytest.raises(ValueError, match="same shape"):
        kla_recurrent(q[..., :2], k, v, **kw)
    with pytest.raises(ValueError, match="v must be"):
        kla_recurrent(q, k, v[:, :4], **kw)
    with pytest.raises(TypeError, match="dtype"):
        kla_recurrent(q, k, v.float(), **kw)
    bad = k.clone()
    bad[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="k has 1 non-finite"):
        kla_recurrent(q, bad, v, **kw)
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        kla_recurrent(q[0, 0], k[0, 0], v[0, 0], **kw)


def test_zero_query_needs_normalize_false():
    q, k, v, kw = _small()
    q = q.clone()
    q[0, 1, 1] = 0.0
    with pytest.raises(ValueError, match=r"q has a query of norm 0.*head 1, token 1"):
        kla_recurrent(q, k, v, **kw)
    o, _ = kla_recurrent(q, k, v, normalize_queries=False, **kw)
    assert torch.isfinite(o).all() and float(o[0, 1, 1].abs().max()) == 0.0


def test_inputs_not_modified():
    q, k, v, kw = _small()
    tensors = [q, k, v, kw["alpha"], kw["eta"], kw["initial_state"]]
    copies = [t.clone() for t in tensors]
    kla_recurrent(q, k, v, **kw)
    kla_chunkwise(q, k, v, chunk_size=2, **kw)
    for t, c in zip(tensors, copies):
        assert torch.equal(t, c)


def test_empty_sequence_and_batch():
    q, k, v, kw = _small()
    for f in (kla_recurrent, lambda *a, **k_: kla_chunkwise(*a, chunk_size=3, **k_)):
        o, S = f(q[:, :0], k[:, :0], v[:, :0], **{**kw, "alpha": 0.9, "eta": 0.5})
        assert o.shape == (2, 0, 2, 2) and torch.equal(S, kw["initial_state"])
        o, S = f(q[:0], k[:0], v[:0], alpha=0.9, eta=0.5)
        assert o.shape == (0, 5, 2, 2) and S.shape == (0, 2, 3, 2)


@pytest.mark.parametrize("arith", PRECISIONS, ids=IDS)
def test_dtype_preserved(arith):
    c = kla_case(6, seed=51)
    x = c.rounded(arith.dtype)
    o, S = kla_chunkwise(x["q"], x["k"], x["v"], chunk_size=4, **c.kwargs(arith.dtype, arith.mode))
    assert o.dtype == arith.dtype and S.dtype == arith.dtype
    assert (
        kla_recurrent(
            x["q"], x["k"], x["v"], return_final_state=False, **c.kwargs(arith.dtype, arith.mode)
        ).dtype
        == arith.dtype
    )
