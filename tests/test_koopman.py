"""solvers.koopman (Echo / Spectral Koopman Attention, section 3.2, Appendix F) in every precision.

Bounds named at each assertion:
* statistics: recursive summation (Higham Lemma 3.1 / eq. (4.4)) with the normalisation
  roundings, ``analysis.references.koopman.statistics_bound``;
* readout: rounding relative to the a-priori output scale S (``koopman_mp.readout_scale``) held
  to the project's allowance ``c kappa (n u_acc + u_store)`` (``analysis.precision``) with
  ``kappa = (K + 2) kappa(G~)``: K + 1 factors G~^{-1} in ``eta C G~^{-1} (M G~^{-1})^K z^q`` plus
  the whitening of the query (docs/koopman.md); truncation (power iteration vs exact sigma) by
  ``koopman_mp.power_ratio_bound``;
* ``||A_w||_2 <= 1 - eps / lambda_max(G~)`` (docs/koopman.md; our statement, not the paper's).
The errata checks (docs/errata.md, "Echo / Spectral Koopman Attention") keep the printed form
(asserted to fail) and the corrected one (asserted to hold).
"""

import math

import mpmath
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from koopman_support import ar1_data

import solvers.koopman as sk
from analysis.precision import PRECISIONS, allowance_applies, gamma, rounding_allowance
from analysis.references import koopman as km
from analysis.references.mp import to_mp
from solvers import (
    CholeskyError,
    JitterWarning,
    KoopmanStatistics,
    KoopmanStream,
    Status,
    cholesky,
    chunk_causal_statistics,
    koopman_readout,
    koopman_statistics,
    linear_attention_readout,
    power_sigma_max,
    ridge_readout,
    sequence_max_scale,
    spectral_normalize,
    value_map,
    whitened_operator,
)

F64 = torch.float64
IDS = [a.label for a in PRECISIONS]
U64 = 2.0**-53


def _cast(ar, *xs):
    return tuple(x.to(ar.dtype) for x in xs)


def _within(hat, exact, absolute, theta):
    """|hat - exact| <= theta * absolute, entrywise."""
    return bool(((hat.to(F64) - exact).abs() <= theta * absolute).all())


def _mp_stats_tensors(z, v, mask=None, scale=None, eps=1e-3):
    """Exact statistics (batched over one leading dim or none) as float64 tensors of the mp values."""
    if z.ndim == 2:
        s = km.statistics(z, v, mask=mask, eps=eps, scale=scale)
        conv = lambda A: torch.tensor(
            [[float(A[i, j]) for j in range(A.cols)] for i in range(A.rows)], dtype=F64
        )  # noqa: E731
        return conv(s.G), conv(s.M), conv(s.Cv)
    out = [
        _mp_stats_tensors(
            z[b],
            v[b],
            None if mask is None else mask[b],
            None if scale is None else float(torch.as_tensor(scale).reshape(-1)[b]),
            eps,
        )
        for b in range(z.shape[0])
    ]
    return tuple(torch.stack([o[k] for o in out]) for k in range(3))


# ============================================================== statistics


@pytest.mark.parametrize("ar", PRECISIONS, ids=IDS)
@pytest.mark.parametrize("masked", [False, True], ids=["prefix", "masked"])
def test_statistics_against_mpmath(ar, masked):
    T, r = 20, 5
    z, v, _ = _cast(ar, *ar1_data(T=T, r=r, batch=(2,), seed=1))
    mask = (torch.arange(T) % 5 != 2).expand(2, T).clone() if masked else None
    mask_arg = None if mask is None else mask
    s = koopman_statistics(z, v, mask=mask_arg, bf16_mode=ar.mode)
    exact = _mp_stats_tensors(z, v, mask)
    absolute = km.absolute_statistics(z, v, mask)
    theta = km.statistics_bound(T, ar, r)
    for hat, ex, ab in zip((s.G, s.M, s.Cv), exact, absolute):
        assert hat.dtype == ar.dtype
        assert _within(hat, ex, ab, theta)  # recursive summation bound, Higham Lemma 3.1


def test_masked_contiguous_block_equals_prefix_of_the_block():
    """A mask selecting positions [a, b) gives the prefix statistics of z[a:b] (eq. (53))."""
    z, v, _ = ar1_data(T=30, seed=2)
    m = sequence_max_scale(z)
    a, b = 7, 19
    mask = (torch.arange(30) >= a) & (torch.arange(30) < b)
    strict = PRECISIONS[3]
    zs, vs = _cast(strict, z, v)
    masked = koopman_statistics(zs, vs, mask=mask, scale=m, bf16_mode="strict")
    block = koopman_statistics(zs[a:b], vs[a:b], scale=m, bf16_mode="strict")
    for x, y in ((masked.G, block.G), (masked.M, block.M), (masked.Cv, block.Cv)):
        assert torch.equal(
            x, y
        )  # strict bf16 adds exact zeros for masked tokens: same sums bit for bit
    masked64 = koopman_statistics(z, v, mask=mask, scale=m)
    block64 = koopman_statistics(z[a:b], v[a:b], scale=m)
    Gab, Mab, _ = km.absolute_statistics(z, v, mask, scale=m)
    theta = 2 * km.statistics_bound(30, PRECISIONS[0], 6)  # both sums within theta of the exact one
    assert _within(masked64.M, block64.M.to(F64), Mab, theta)
    assert _within(masked64.G, block64.G.to(F64), Gab, theta)


def _masked_M_ignoring_predecessor(z, mask, m):
    """Broken eq. (53): pairs counted when m_t = 1, whatever m_{t-1}."""
    zh = z / m
    w = mask.to(F64)[1:, None]
    return (zh[1:] * w).mT @ zh[:-1]


def test_broken_mask_on_one_side_only_fails_the_block_property():
    z, v, _ = ar1_data(T=30, seed=2)
    m = sequence_max_scale(z)
    mask = (torch.arange(30) >= 7) & (torch.arange(30) < 19)
    block = koopman_statistics(z[7:19], v[7:19], scale=m)
    broken = _masked_M_ignoring_predecessor(z, mask, m)
    assert (
        broken - block.M
    ).abs().max() > 1e-3  # includes the pair (z_7, z_6) across the mask edge


def test_mask_checks():
    z, v, _ = ar1_data(T=8, batch=(3,))
    with pytest.raises(ValueError, match="mask must have shape"):
        koopman_statistics(z, v, mask=torch.ones(8, 3, dtype=torch.bool))  # transposed (T, B)
    with pytest.raises(ValueError, match="only 0 and 1"):
        koopman_statistics(z, v, mask=torch.full((3, 8), 0.5))
    with pytest.raises(TypeError, match="mask must be a torch.Tensor"):
        koopman_statistics(z, v, mask=[1] * 8)
    s01 = koopman_statistics(z, v, mask=torch.ones(3, 8))
    s = koopman_statistics(z, v)
    assert torch.equal(s01.G, s.G) and torch.equal(s01.M, s.M)


@pytest.mark.parametrize("ar", PRECISIONS, ids=IDS)
def test_mask_selecting_nothing_gives_zero_readouts(ar):
    z, v, zq = _cast(ar, *ar1_data(T=10, batch=(2,)))
    none = torch.zeros(2, 10, dtype=torch.bool)
    s = koopman_statistics(z, v, mask=none, bf16_mode=ar.mode)
    eye = torch.eye(6, dtype=F64)
    assert torch.equal(s.G.to(F64), (ar.store(ar.scalar(1e-3)).to(F64) * eye).expand(2, 6, 6))
    assert not s.M.any() and not s.Cv.any()
    for y in (koopman_readout(s, zq), ridge_readout(s, zq), linear_attention_readout(s, zq)):
        assert y.shape == (2, 4, 3) and not y.any()


def test_mask_selecting_nothing_with_eps_zero_is_jittered_and_reported():
    z, v, zq = ar1_data(T=10)
    s = koopman_statistics(z, v, mask=torch.zeros(10, dtype=torch.bool), eps=0.0)
    y, info = koopman_readout(s, zq, return_info=True)
    assert info.status == Status.JITTERED and not y.any()
    with pytest.warns(JitterWarning):
        koopman_readout(s, zq)


def test_rank_larger_than_the_data_with_eps_zero():
    """T = 3 keys in r = 6 dimensions, eps = 0: G is singular (Prop. A.1 needs G invertible)."""
    g = torch.Generator().manual_seed(3)
    z = torch.zeros(3, 6, dtype=F64)
    z[:, :3] = torch.randn(3, 3, generator=g, dtype=F64)  # exact zeros: pivots 4..6 are exactly 0
    v = torch.randn(3, 2, generator=g, dtype=F64)
    zq = torch.randn(2, 6, generator=g, dtype=F64)
    s = koopman_statistics(z, v, eps=0.0)
    y, info = koopman_readout(s, zq, return_info=True)
    assert info.status == Status.JITTERED and info.factor.failed_column.item() == 3
    assert torch.isfinite(y).all()
    # generic (rotated) rank-deficient data: the zero pivots are rounding noise of either sign;
    # whatever the status, the info exposes the numerical singularity
    Q = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=F64))[0]
    s2 = koopman_statistics(z @ Q, v, eps=0.0)
    _, info2 = koopman_readout(s2, zq @ Q, return_info=True)
    if info2.status == Status.COMPLETED:
        assert float(info2.factor.pivot_ratio) < 1e3 * U64  # pivot at rounding level: singular
    else:
        assert info2.status in (Status.JITTERED, Status.BREAKDOWN)


def test_sequence_max_scale_and_floor():
    z = torch.tensor([[3.0, 4.0], [0.0, 1.0]], dtype=F64)
    assert float(sequence_max_scale(z)) == 5.0
    assert float(sequence_max_scale(torch.zeros(4, 2))) == 1e-6  # clamp of section 3.2.1
    assert float(sequence_max_scale(torch.zeros(0, 2))) == 1e-6


# ============================================================== streaming


@pytest.mark.parametrize("ar", PRECISIONS, ids=IDS)
def test_stream_matches_batch(ar):
    T, r = 18, 6
    z, v, _ = _cast(ar, *ar1_data(T=T, r=r, batch=(2,), seed=4))
    mask = torch.rand(2, T, generator=torch.Generator().manual_seed(0)) > 0.25
    m = sequence_max_scale(z)
    stream = KoopmanStream(r, 3, scale=m, dtype=ar.dtype, bf16_mode=ar.mode, batch_shape=(2,))
    for t in range(T):
        stream.update(z[:, t], v[:, t], mask=mask[:, t])
    got = stream.statistics()
    ref = koopman_statistics(z, v, mask=mask, scale=m, bf16_mode=ar.mode)
    assert stream.tokens == T
    if ar.strict:
        for x, y in ((got.G, ref.G), (got.M, ref.M), (got.Cv, ref.Cv)):
            assert torch.equal(x, y)  # same summation order by construction
    else:
        absolute = km.absolute_statistics(z, v, mask, scale=m)
        theta = 2 * km.statistics_bound(T, ar, r)  # both within theta of the exact sums
        for x, y, ab in zip((got.G, got.M, got.Cv), (ref.G, ref.M, ref.Cv), absolute):
            assert _within(x, y.to(F64), ab, theta)


class _StaleStream(KoopmanStream):
    """Broken stream: forgets to move z_{t-1} forward (M pairs every token with the first)."""

    def update(self, z_t, v_t, *, mask=None):
        first = self.z_prev.clone() if self.tokens else None
        super().update(z_t, v_t, mask=mask)
        if first is not None:
            self.z_prev = first


def test_broken_stream_fails_batch_agreement():
    z, v, _ = ar1_data(T=12, seed=5)
    m = sequence_max_scale(z)
    ref = koopman_statistics(z, v, scale=m)
    bad = _StaleStream(6, 3, scale=m, dtype=F64)
    for t in range(12):
        bad.update(z[t], v[t])
    assert (bad.statistics().M - ref.M).abs().max() > 1e-2


@pytest.mark.parametrize("ar", PRECISIONS, ids=IDS)
def test_prefill_then_decode_freezes_the_scale(ar):
    z, v, _ = _cast(ar, *ar1_data(T=20, seed=6))
    z = z.clone()
    z[15:] = z[15:] * 3  # decode tokens larger than every prefill token
    stream = KoopmanStream.prefill(z[:12], v[:12], bf16_mode=ar.mode)
    assert float(stream.scale) == float(sequence_max_scale(z[:12]))
    for t in range(12, 20):
        stream.update(z[t], v[t])
    frozen = koopman_statistics(z, v, scale=stream.scale, bf16_mode=ar.mode)
    got = stream.statistics()
    if ar.strict:
        assert torch.equal(got.M, frozen.M) and torch.equal(got.G, frozen.G)
    else:
        absolute = km.absolute_statistics(z, v, scale=stream.scale)
        assert _within(got.M, frozen.M.to(F64), absolute[1], 2 * km.statistics_bound(20, ar, 6))
    refreshed = koopman_statistics(z, v, bf16_mode=ar.mode)  # m recomputed over all 20 tokens
    assert (got.G.to(F64) - refreshed.G.to(F64)).abs().max() > 0.1


def test_stream_state_has_the_printed_size():
    """Section 3.5: ``2 r^2 + P r + r + 1`` floats per head (G, M, C_v, z_{t-1}, m)."""
    r, P = 5, 4
    s = KoopmanStream(r, P, scale=1.0)
    held = s.G.numel() + s.M.numel() + s.Cv.numel() + s.z_prev.numel() + s.scale.numel()
    assert held == 2 * r * r + P * r + r + 1


# ============================================================== chunk-causal mode


@pytest.mark.parametrize("ar", PRECISIONS, ids=IDS)
def test_chunk_causal_equals_prefix_of_earlier_chunks(ar):
    T, S, r = 29, 8, 5  # T not a multiple of S
    z, v, _ = _cast(ar, *ar1_data(T=T, r=r, batch=(2,), seed=7))
    ch = chunk_causal_statistics(z, v, chunk_size=S, bf16_mode=ar.mode)
    C = math.ceil(T / S)
    assert ch.G.shape == (2, C, r, r) and ch.Cv.shape == (2, C, 3, r) and ch.scale.shape == (2, C)
    m = sequence_max_scale(z)
    absolute = km.absolute_statistics(z, v, scale=m)
    # chunk sums then the exclusive prefix (<= T + C additions) vs prefix mode (T additions)
    theta = km.statistics_bound(T + C, ar, r) + km.statistics_bound(T, ar, r)
    for c in range(C):
        pre = koopman_statistics(z[:, : c * S], v[:, : c * S], scale=m, bf16_mode=ar.mode)
        for x, y, ab in zip(
            (ch.G[:, c], ch.M[:, c], ch.Cv[:, c]), (pre.G, pre.M, pre.Cv), absolute
        ):
            assert _within(x, y.to(F64), ab, theta)


def test_chunk_zero_sees_nothing():
    z, v, zq = ar1_data(T=16)
    ch = chunk_causal_statistics(z, v, chunk_size=4)
    assert not ch.M[0].any() and not ch.Cv[0].any()
    y = koopman_readout(ch, zq.expand(4, 4, 6))
    assert (
        y.shape == (4, 4, 3) and not y[0].any() and bool(y[1:].abs().sum(dim=(-1, -2)).gt(0).all())
    )


def test_broken_chunks_without_boundary_transitions_fail():
    """Eq. (9) without its second sum misses the pairs (z_{i,0}, z_{i-1,-1})."""
    z, v, _ = ar1_data(T=24, seed=8)
    S, m = 6, sequence_max_scale(z)
    per_chunk = [
        koopman_statistics(z[i * S : (i + 1) * S], v[i * S : (i + 1) * S], scale=m)
        for i in range(3)
    ]
    broken_M3 = sum(p.M for p in per_chunk)
    true_M3 = koopman_statistics(z[: 3 * S], v[: 3 * S], scale=m).M
    assert (broken_M3 - true_M3).abs().max() > 1e-2


# ============================================================== operators


def test_whitened_operator_formula_and_similarity():
    """A_w = L^{-1} M L^{-T} (eq. (22)) and L A_w L^{-1} = M G~^{-1} (Prop. A.3)."""
    z, v, _ = ar1_data(T=30, r=6, batch=(3,), seed=9)
    s = koopman_statistics(z, v)
    L = cholesky(s.G)
    A = whitened_operator(s.M, L)
    Li = torch.linalg.solve_triangular(L, torch.eye(6, dtype=F64), upper=False)
    ref = Li @ s.M @ Li.mT
    kappa = float(torch.linalg.cond(s.G).max())
    tol = rounding_allowance(kappa, 6, PRECISIONS[0])  # c kappa (n u + u), two substitutions
    assert float((A - ref).abs().max() / ref.abs().max()) <= tol
    sim = L @ A @ Li
    A_eps = s.M @ torch.linalg.inv(s.G)
    assert float((sim - A_eps).abs().max() / A_eps.abs().max()) <= 2 * tol
    swapped = Li.mT @ s.M @ Li  # broken: L^{-T} and L^{-1} exchanged
    assert float((L @ swapped @ Li - A_eps).abs().max() / A_eps.abs().max()) > 1e-2


def test_value_map_is_the_ridge_minimiser():
    """B_v = C_v G~^{-1} (Prop. I.7) and the gradient of the ridge objective vanishes (Prop. I.2)."""
    z, v, _ = ar1_data(T=25, seed=10)
    s = koopman_statistics(z, v)
    Bv = value_map(s.Cv, cholesky(s.G))
    zh = z / sequence_max_scale(z)
    grad = -2 * v.mT @ zh + 2 * Bv @ (zh.mT @ zh + 1e-3 * torch.eye(6, dtype=F64))
    kappa = float(torch.linalg.cond(s.G))
    # forward error of a backward-stable solve: c kappa (n u + u) relative to ||C_v||
    assert float(grad.abs().max() / s.Cv.abs().max()) <= 2 * rounding_allowance(
        kappa, 25, PRECISIONS[0]
    )


def _sigma_max(A):
    return torch.linalg.matrix_norm(A.to(F64), ord=2)


@given(
    seed=st.integers(0, 2**16),
    T=st.integers(1, 40),
    r=st.integers(1, 7),
    dyn=st.sampled_from([0.0, 0.9, 1.0, 1.1]),
    mode=st.sampled_from(["prefix", "masked", "chunk"]),
)
def test_whitened_operator_norm_below_one(seed, T, r, dyn, mode):
    """||A_w||_2 <= 1 - eps / lambda_max(G~) in every mode: A_w = (L^{-1} Z_+)(L^{-1} Z_-)^T and
    ||L^{-1} Z_pm||^2 <= ||I - eps G~^{-1}||. Hence eq. (12) never rescales the whitened operator."""
    z, v, _ = ar1_data(T=T, r=r, seed=seed, dyn=dyn)
    if mode == "chunk":
        s = chunk_causal_statistics(z, v, chunk_size=max(1, T // 3))
    else:
        mask = (
            (torch.rand(T, generator=torch.Generator().manual_seed(seed)) > 0.3)
            if mode == "masked"
            else None
        )
        s = koopman_statistics(z, v, mask=mask)
    A = whitened_operator(s.M, cholesky(s.G))
    lam_max = torch.linalg.eigvalsh(s.G).amax(-1)
    kappa = float(torch.linalg.cond(s.G).max())
    slack = rounding_allowance(
        kappa, max(T, r), PRECISIONS[0]
    )  # float64 statistics, solves and SVD
    assert bool((_sigma_max(A) <= 1 - 1e-3 / lam_max + slack).all())


@given(
    seed=st.integers(0, 2**16),
    T=st.integers(0, 12),
    r=st.integers(1, 6),
    eps=st.sampled_from([1e-3, 1e-1]),
)
def test_props_a2_a4_ridge_shrinkage_and_positive_definiteness(seed, T, r, eps):
    """Lemma A.4: lambda_min(G~) >= eps; Prop. A.2: M G~^{-1} = M V diag(1/(sigma_j + eps)) V^T."""
    z, v, _ = ar1_data(T=T, r=r, seed=seed)
    s = koopman_statistics(z, v, eps=eps)
    lam = torch.linalg.eigvalsh(s.G)
    tol = rounding_allowance(1.0, max(T, r), PRECISIONS[0]) * float(
        lam.max()
    )  # float64 sums + eigvalsh
    assert float(lam.min()) >= eps - tol
    G = s.G - eps * torch.eye(r, dtype=F64)
    sig, V = torch.linalg.eigh(G)
    shrunk = s.M @ V @ torch.diag(1 / (sig + eps)) @ V.mT
    direct = s.M @ torch.linalg.inv(s.G)
    kappa = float(torch.linalg.cond(s.G))
    assert float((shrunk - direct).abs().max()) <= rounding_allowance(
        kappa, r, PRECISIONS[0]
    ) * max(float(direct.abs().max()), 1e-300)


def test_printed_eq11_operator_can_exceed_one():
    """Eq. (11) names M G^{-1} 'A_w'; unlike L^{-1} M L^{-T} its norm is not bounded by 1."""
    z, v, _ = ar1_data(T=30, seed=0)
    s = koopman_statistics(z, v)
    A_eps = s.M @ torch.linalg.inv(s.G)
    A_w = whitened_operator(s.M, cholesky(s.G))
    assert float(_sigma_max(A_eps)) > 1.1 and float(_sigma_max(A_w)) < 1  # 1.149 vs 0.98


# ============================================================== spectral normalisation


@given(
    seed=st.integers(0, 2**16),
    r=st.integers(1, 8),
    scale=st.floats(0.1, 10.0),
    gamma=st.floats(1.0, 1.5),
    K=st.integers(1, 4),
)
def test_exact_normalisation_is_contractive(seed, r, scale, gamma, K):
    """Props. D.2 / D.3 with the exact sigma_max: ||A'|| <= gamma, ||A'^K|| <= gamma^K."""
    A = scale * torch.randn(r, r, generator=torch.Generator().manual_seed(seed), dtype=F64)
    Ap = spectral_normalize(A, gamma=gamma, sigma="exact")
    slack = 4 * U64 * r  # the float64 SVD and the scaling
    assert float(_sigma_max(Ap)) <= gamma * (1 + slack)
    assert float(_sigma_max(torch.linalg.matrix_power(Ap, K))) <= gamma**K * (1 + K * slack)


@given(seed=st.integers(0, 2**16), r=st.integers(2, 8), iters=st.integers(0, 8))
def test_power_iteration_underestimates_within_its_bound(seed, r, iters):
    """sigma_power <= sigma_max <= sigma_power * sqrt(1 + tan^2 theta_0 (s2/s1)^{4k}) (float64)."""
    A = torch.randn(r, r, generator=torch.Generator().manual_seed(seed), dtype=F64)
    est = float(power_sigma_max(A, iters=iters))
    exact = float(_sigma_max(A))
    with mpmath.workdps(30):
        ratio = km.power_ratio_bound(to_mp(A), iters)
    slack = 8 * r * U64  # float64 products and norms of the replay
    assert est <= exact * (1 + slack)
    assert exact <= est * ratio * (1 + slack)


def test_power_estimate_increases_with_iterations():
    """The Rayleigh quotient of A^T A along power iterates is non-decreasing."""
    A = torch.randn(6, 6, generator=torch.Generator().manual_seed(1), dtype=F64)
    est = [float(power_sigma_max(A, iters=k)) for k in range(8)]
    # estimate k + 1 is the exact step from the computed v_k, up to that step's rounding: v moves by
    # gamma_{2n+4} (two n-term products, norms, divisions), the estimate by sigma_max times it;
    # each estimate ||A v|| itself gamma_{n+1}: est_{k+1} >= est_k (1 - 2 gamma_{n+1} -
    # (sigma / est_k) gamma_{2n+4}), <= 42u here (the old 1e-14 = 90u)
    n, sigma = A.shape[-1], float(_sigma_max(A))
    for a, b in zip(est, est[1:]):
        assert b >= a * (1 - 2 * gamma(n + 1, U64) - sigma / a * gamma(2 * n + 4, U64))


def test_printed_d2_d3_fail_with_the_six_step_power_estimate():
    """Appendix F step 6 cites Props. D.2/D.3 for a 6-step power estimate; they need the exact sigma."""
    A = torch.diag(torch.tensor([2.0, 1.9], dtype=F64))
    hat = spectral_normalize(A, sigma="power")
    # docs/errata.md's 1.0112, to half a unit of its last digit; printed D.2: <= 1, fails
    assert float(_sigma_max(hat)) == pytest.approx(1.0112, abs=0.5e-4)
    Ap = spectral_normalize(A, gamma=1.5, sigma="power")
    assert float(_sigma_max(Ap @ Ap)) > 2.30  # printed D.3: ||A'^2|| <= 2.25, fails (2.3007)
    with mpmath.workdps(30):
        ratio = km.power_ratio_bound(to_mp(A), 6)
    # corrected: ||A'^K|| <= (gamma sqrt(1 + tan^2 theta_0 (s2/s1)^24))^K, for the exact power
    # iterate. Float64: the 6 steps each move v by gamma_{2n+4} and the estimate by sigma/sigma_hat
    # (<= 1.0112) times that, twice over for K = 2; A' = fl(gamma/sigma_hat A) 2u, A'A' n gamma_n
    # (normwise), the SVD p(n) u = 2u (LAPACK, p(n) = n): 107u = 1.2e-14 relative
    n = A.shape[-1]
    ratio_hat = float(_sigma_max(A)) / float(power_sigma_max(A))
    slack = 2 * ratio_hat * gamma(6 * (2 * n + 4), U64) + 6 * U64 + n * gamma(n, U64)
    assert float(_sigma_max(Ap @ Ap)) <= (1.5 * ratio) ** 2 * (1 + slack)
    # exact sigma: the SVD (p(n) u) rounded once (u), the factor and the scaling (2u), the
    # measuring SVD (p(n) u): gamma_{2n+3}
    exact = float(_sigma_max(spectral_normalize(A, gamma=1.5, sigma="exact")))
    assert exact <= 1.5 * (1 + gamma(2 * n + 3, U64))


def test_broken_missing_normalisation_fails_contractivity():
    A = 3 * torch.eye(3, dtype=F64)
    # exact sigma: gamma_{2n+3} as in test_printed_d2_d3_fail_with_the_six_step_power_estimate
    assert float(_sigma_max(spectral_normalize(A, sigma="exact"))) <= 1 + gamma(2 * 3 + 3, U64)
    assert float(_sigma_max(1.0 * A)) > 1  # A' = gamma A without the division


def test_gamma_range_and_sigma_option():
    A = torch.eye(2)
    for bad in (0.9, 1.6):
        with pytest.raises(ValueError, match=r"gamma must lie in \[1.0, 1.5\]"):
            spectral_normalize(A, gamma=bad)
    with pytest.raises(ValueError, match="sigma must be"):
        spectral_normalize(A, sigma="svd")
    assert torch.equal(power_sigma_max(torch.zeros(3, 3)), torch.tensor(0.0))  # no 0/0


# ============================================================== readout vs mpmath


def _readout_errors(ar, z, v, zq, *, K=2, eta=1.5, gamma=1.2, ref=None):
    s = koopman_statistics(z, v, bf16_mode=ar.mode)
    y, info = koopman_readout(s, zq, K=K, eta=eta, gamma=gamma, return_info=True)
    ref = ref or km.readout(km.statistics(z, v), zq, v, K=K, eta=eta, gamma=gamma)
    rounding = float((y.to(F64) - ref.y_power).norm(dim=-1).max()) / ref.scale
    truncation = float((ref.y_power - ref.y_exact).norm(dim=-1).max()) / ref.scale
    return y, info, ref, rounding, truncation


@pytest.mark.parametrize("ar", PRECISIONS, ids=IDS)
@pytest.mark.parametrize(
    "T, r, dyn", [(24, 6, 0.8), (64, 4, 0.0)], ids=["ar1-kappa25", "iid-kappa3"]
)
def test_readout_against_mpmath(ar, T, r, dyn):
    K = 2
    z, v, zq = _cast(ar, *ar1_data(T=T, r=r, seed=11, dyn=dyn))
    y, info, ref, rounding, truncation = _readout_errors(ar, z, v, zq, K=K)
    assert info.status == Status.COMPLETED and y.dtype == ar.dtype and y.shape == (4, 3)
    # truncation: sigma_max(A_w) < 1, so both normalisations are the identity and agree exactly;
    # in general |(max(1,s)/max(1,s_power))^K - 1| <= power_ratio_bound^K - 1
    assert ref.sigma_exact < 1 and truncation <= ref.power_bound**K - 1
    allowance = rounding_allowance(
        (K + 2) * ref.kappa, max(T, r), ar
    )  # c kappa (n u_acc + u_store)
    if allowance_applies((K + 2) * ref.kappa, max(T, r), ar):
        assert rounding <= allowance
    assert bool(torch.isfinite(y).all())


@given(
    seed=st.integers(0, 2**16),
    T=st.integers(4, 16),
    r=st.integers(1, 5),
    K=st.integers(0, 3),
    eta=st.floats(0.25, 2.0),
    sign=st.sampled_from([-1.0, 1.0]),
    gamma=st.floats(1.0, 1.5),
)
def test_property_readout_float32_against_mpmath(seed, T, r, K, eta, sign, gamma):
    eta = sign * eta
    ar = PRECISIONS[1]
    z, v, zq = _cast(ar, *ar1_data(T=T, r=r, Q=2, seed=seed))
    _, info, ref, rounding, _ = _readout_errors(ar, z, v, zq, K=K, eta=eta, gamma=gamma)
    assert info.status == Status.COMPLETED
    kappa = (K + 2) * ref.kappa
    if allowance_applies(kappa, max(T, r), ar):
        assert rounding <= rounding_allowance(kappa, max(T, r), ar)  # c kappa (n u_acc + u_store)


def _swapped_whitening(M, L, **_):
    """Broken step 5: L^{-T} M L^{-1} instead of L^{-1} M L^{-T}."""
    Li = torch.linalg.inv(L)
    return Li.mT @ M @ Li


@pytest.mark.parametrize(
    "variant", ["swapped L^-T and L^-1", "transposed M", "query not normalised", "K off by one"]
)
def test_broken_readouts_fail_against_mpmath(monkeypatch, variant):
    ar = PRECISIONS[0]
    z, v, zq = ar1_data(T=24, seed=12)
    ref = km.readout(km.statistics(z, v), zq, v, K=2, eta=1.5, gamma=1.2)
    allowance = rounding_allowance(4 * ref.kappa, 24, ar)  # c (K+2) kappa (n u_acc + u_store)
    assert _readout_errors(ar, z, v, zq, ref=ref)[3] <= allowance
    true_whiten = sk.whitened_operator
    if variant == "swapped L^-T and L^-1":
        monkeypatch.setattr(sk, "whitened_operator", _swapped_whitening)
    elif variant == "transposed M":
        monkeypatch.setattr(sk, "whitened_operator", lambda M, L, **kw: true_whiten(M.mT, L, **kw))
    elif variant == "query not normalised":
        monkeypatch.setattr(KoopmanStatistics, "normalize", lambda self, q: q)
    if variant == "K off by one":
        y = koopman_readout(koopman_statistics(z, v), zq, K=3, eta=1.5, gamma=1.2)
        err = float((y - ref.y_power).norm(dim=-1).max()) / ref.scale
    else:
        err = _readout_errors(ar, z, v, zq, ref=ref)[3]
    assert err > 1e6 * allowance


# ============================================================== identities between readouts


def test_readout_equals_prop_i8_formula_and_k0_is_ridge():
    z, v, zq = ar1_data(T=30, batch=(2,), seed=14)
    s = koopman_statistics(z, v)
    y = koopman_readout(s, zq, K=2, eta=1.5, gamma=1.3, sigma="exact")
    qh = zq / sequence_max_scale(z)[:, None, None]
    L = torch.linalg.cholesky(s.G)
    Li = torch.linalg.inv(L)
    Aw = Li @ s.M @ Li.mT
    Ap = 1.3 * Aw / torch.clamp(_sigma_max(Aw), min=1.0)[:, None, None]
    Phi = L @ Ap @ Ap @ Li
    formula = 1.5 * (s.Cv @ torch.linalg.inv(s.G) @ Phi @ qh.mT).mT  # Prop. I.8
    kappa = float(torch.linalg.cond(s.G).max())
    tol = rounding_allowance(4 * kappa, 30, PRECISIONS[0])  # both evaluations, (K+2) kappa
    scale = formula.abs().max()
    assert float((y - formula).abs().max() / scale) <= tol
    y0 = koopman_readout(s, zq, K=0, eta=1.5)
    ridge = ridge_readout(s, zq)
    assert float((y0 - 1.5 * ridge).abs().max() / ridge.abs().max()) <= tol  # Cor. I.9
    direct = (s.Cv @ torch.linalg.solve(s.G, qh.mT)).mT  # eq. (59)
    assert float((ridge - direct).abs().max() / direct.abs().max()) <= tol
    lin = linear_attention_readout(s, zq)
    # eq. (58): the same r-term sums in another order (gamma_r each) on queries divided by the
    # same scale (u each): |lin - C_v q| <= (2 gamma_r + 2u) |C_v| |q|, componentwise
    r = qh.shape[-1]
    bound = (2 * gamma(r, U64) + 2 * U64) * (s.Cv.abs() @ qh.abs().mT).mT
    assert bool(((lin - (s.Cv @ qh.mT).mT).abs() <= bound).all())  # eq. (58)
    # the check can fail: the readout of the unnormalised queries (scale m != 1)
    assert not bool(((lin - (s.Cv @ zq.mT).mT).abs() <= bound).all())


# ============================================================== bad input


def test_readout_bad_input():
    z, v, zq = ar1_data(T=8)
    s = koopman_statistics(z, v)
    with pytest.raises(ValueError, match=r"zq must have shape \(\*batch, Q, 6\)"):
        koopman_readout(s, zq[:, :5])
    with pytest.raises(ValueError, match="batch"):
        koopman_readout(s, zq.expand(2, 4, 6))
    with pytest.raises(ValueError, match="K must be >= 0"):
        koopman_readout(s, zq, K=-1)
    with pytest.raises(TypeError, match="K must be an int"):
        koopman_readout(s, zq, K=2.0)
    with pytest.raises(TypeError, match="stats must be KoopmanStatistics"):
        koopman_readout((s.G, s.M, s.Cv), zq)
    with pytest.raises(TypeError, match="dtype"):
        koopman_readout(s, zq.float())
    with pytest.raises(ValueError, match="non-finite"):
        koopman_readout(s, zq * float("inf"))
    with pytest.raises(ValueError, match="eta has 1 non-finite"):
        koopman_readout(s, zq, eta=float("nan"))


def test_statistics_bad_input():
    z, v, _ = ar1_data(T=8)
    with pytest.raises(ValueError, match="v has 7 positions"):
        koopman_statistics(z, v[:7])
    with pytest.raises(ValueError, match="z has 1 non-finite"):
        zb = z.clone()
        zb[0, 0] = float("nan")
        koopman_statistics(zb, v)
    with pytest.raises(ValueError, match="eps must be a finite float >= 0"):
        koopman_statistics(z, v, eps=-1e-3)
    with pytest.raises(ValueError, match="scale must be > 0"):
        koopman_statistics(z, v, scale=0.0)
    with pytest.raises(TypeError, match="must share|dtype"):
        koopman_statistics(z, v.float())
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        chunk_causal_statistics(z, v, chunk_size=0)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        koopman_statistics(z[0], v)


def test_stream_bad_input():
    stream = KoopmanStream(4, 2, scale=1.0, dtype=F64, batch_shape=(3,))
    with pytest.raises(TypeError, match="like the stream"):
        stream.update(torch.ones(3, 4), torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"z_t must be \(\.\.\., 4\)"):
        stream.update(torch.ones(3, 5, dtype=F64), torch.ones(3, 2, dtype=F64))
    with pytest.raises(ValueError, match="do not broadcast"):
        stream.update(torch.ones(2, 4, dtype=F64), torch.ones(2, 2, dtype=F64))
    with pytest.raises(ValueError, match="scale must be > 0"):
        KoopmanStream(4, 2, scale=-1.0)
    with pytest.raises(ValueError, match="non-finite"):
        stream.update(torch.full((3, 4), float("nan"), dtype=F64), torch.ones(3, 2, dtype=F64))
    assert stream.tokens == 0 and not stream.M.any()


def test_breakdown_raises_without_info_and_is_a_status_with_it():
    r = 3
    G = -torch.eye(r, dtype=F64).expand(2, r, r).clone()
    G[0] = torch.eye(r, dtype=F64)
    s = KoopmanStatistics(
        G,
        torch.zeros(2, r, r, dtype=F64),
        torch.ones(2, 2, r, dtype=F64),
        torch.ones(2, dtype=F64),
        1e-3,
    )
    zq = torch.ones(2, 1, r, dtype=F64)
    with pytest.raises(CholeskyError, match="1 system"):
        koopman_readout(s, zq)
    y, info = koopman_readout(s, zq, return_info=True)
    assert info.system_status.tolist() == [Status.COMPLETED, Status.BREAKDOWN]
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all()


def test_inputs_are_not_modified_and_empty_batches_work():
    z, v, zq = ar1_data(T=10, batch=(2,))
    mask = torch.ones(2, 10, dtype=torch.bool)
    copies = [x.clone() for x in (z, v, zq, mask)]
    s = koopman_statistics(z, v, mask=mask)
    sc = [x.clone() for x in (s.G, s.M, s.Cv, s.scale)]
    koopman_readout(s, zq)
    ridge_readout(s, zq)
    stream = KoopmanStream.prefill(z, v)
    stream.update(z[:, 0], v[:, 0])
    chunk_causal_statistics(z, v, chunk_size=3)
    for a, b in zip((z, v, zq, mask, s.G, s.M, s.Cv, s.scale), copies + sc):
        assert torch.equal(a, b)
    e = koopman_statistics(torch.zeros(0, 5, 3), torch.zeros(0, 5, 2))
    assert e.G.shape == (0, 3, 3) and koopman_readout(e, torch.zeros(0, 1, 3)).shape == (0, 1, 2)
    t0 = koopman_statistics(torch.zeros(0, 3, dtype=F64), torch.zeros(0, 2, dtype=F64))
    assert torch.equal(t0.G, 1e-3 * torch.eye(3, dtype=F64))
    c0 = chunk_causal_statistics(
        torch.zeros(0, 3, dtype=F64), torch.zeros(0, 2, dtype=F64), chunk_size=4
    )
    assert c0.G.shape == (0, 3, 3) and c0.Cv.shape == (0, 2, 3) and c0.scale.shape == (0,)


# ============================================================== errata (docs/errata.md)


def test_erratum_footnote_rescaling():
    """Footnote 1 (section 3.2.1): 'rescale all statistics by (m_old/m_new)^2' is wrong for C_v
    (linear in z^) and for eps I; the corrected :meth:`KoopmanStream.rescale` matches a recompute."""
    z, v, _ = ar1_data(T=16, seed=15)
    m_old = float(sequence_max_scale(z))
    m_new = 2.5 * m_old
    stream = KoopmanStream.prefill(z, v, scale=m_old)
    rho2 = (m_old / m_new) ** 2
    old = stream.statistics()
    printed = (old.G * rho2, old.M * rho2, old.Cv * rho2)
    ref = koopman_statistics(z, v, scale=m_new)
    assert (printed[2] - ref.Cv).abs().max() > 0.1 and (printed[0] - ref.G).abs().max() > 1e-4
    stream.rescale(m_new)
    new = stream.statistics()
    # both within the summation bound of the exact sums (the rescaling adds <= 4 roundings)
    theta = km.statistics_bound(16 + 4, PRECISIONS[0], 6) + km.statistics_bound(
        16, PRECISIONS[0], 6
    )
    for x, y, ab in zip(
        (new.G, new.M, new.Cv), (ref.G, ref.M, ref.Cv), km.absolute_statistics(z, v, scale=m_new)
    ):
        assert _within(x, y, ab, theta)


def test_erratum_prop_a1_proof_stationary_point():
    """Prop. A.1's eq. (19) says A = M^T G^{-1}; the stationary point is A = M G^{-1} (the statement)."""
    z, _, _ = ar1_data(T=40, r=4, seed=16)
    G = z[:-1].mT @ z[:-1]
    M = z[1:].mT @ z[:-1]

    def grad(A):  # d/dA sum ||z_{t+1} - A z_t||^2
        return -2 * M + 2 * A @ G

    stated = M @ torch.linalg.inv(G)
    printed_19 = M.mT @ torch.linalg.inv(G)
    # grad(M X) = 2 M (X G - I) for the computed inverse X: ||X G - I|| within the allowance
    # c kappa (n u + u) (Higham Sec. 14.1's residual bound, in docs/precision.md's form): 2 A ||M||_2
    # = 1e-13 here (measured 3.8e-16 max|M|; the old 1e-10 max|M| was 950 times it)
    allow = rounding_allowance(float(torch.linalg.cond(G)), G.shape[-1], PRECISIONS[0])
    tol = 2 * allow * float(torch.linalg.matrix_norm(M, ord=2))
    assert float(grad(stated).abs().max()) <= tol
    assert float(grad(printed_19).abs().max()) > 1e-2 * float(M.abs().max())


def test_erratum_layer_gram_includes_the_last_token():
    """Eqs. (4)/(53) sum G over all T tokens; Prop. A.1's estimator sums to T-1. The layer's
    M G~^{-1} minimises sum ||z_{t+1} - A z_t||^2 + ||A z_T||^2 + eps ||A||_F^2 instead."""
    z, v, _ = ar1_data(T=12, r=4, seed=17)
    s = koopman_statistics(z, v)
    A_layer = s.M @ torch.linalg.inv(s.G)
    zh = z / sequence_max_scale(z)
    eps = 1e-3
    Gm = zh[:-1].mT @ zh[:-1] + eps * torch.eye(4, dtype=F64)
    A_ls = s.M @ torch.linalg.inv(Gm)  # ridge version of eq. (15)

    def grad_printed(A):  # eq. (15) + eps ||A||_F^2
        return -2 * s.M + 2 * A @ Gm

    def grad_corrected(A):  # ... + ||A z_T||^2
        return grad_printed(A) + 2 * A @ torch.outer(zh[-1], zh[-1])

    assert float(grad_printed(A_layer).abs().max()) > 1e-3
    # grad_corrected(A) = 2 (A G_layer - M) + 2 A (G_here - G_layer): the computed inverse's
    # residual (2 A ||M||_2, as in test_erratum_prop_a1_proof_stationary_point) and the two sums
    # forming G (T + 1 terms each: 2 gamma_{T+1} (||z^||_F^2 + eps r) apart), times ||A||_2
    allow = rounding_allowance(float(torch.linalg.cond(s.G)), 4, PRECISIONS[0])
    forming = 2 * gamma(zh.shape[0] + 1, U64) * (float(zh.norm() ** 2) + eps * 4)
    n2 = lambda X: float(torch.linalg.matrix_norm(X, ord=2))  # noqa: E731
    tol = 2 * allow * n2(s.M) + 2 * n2(A_layer) * forming
    assert float(grad_corrected(A_layer).abs().max()) <= tol
    assert float((A_layer - A_ls).norm() / A_ls.norm()) > 1e-2


@given(seed=st.integers(0, 2**16), r=st.integers(2, 6))
def test_erratum_remark2_spectra_are_equal(seed, r):
    """Remark 2: 'G~^{-1} M ... can have a different eigenspectrum' from M G~^{-1}. It cannot:
    XY and YX share eigenvalues; checked through tr((.)^k), k = 1..r (Newton's identities)."""
    z, v, _ = ar1_data(T=3 * r, r=r, seed=seed)
    s = koopman_statistics(z, v)
    Gi = torch.linalg.inv(s.G)
    X, Y = s.M @ Gi, Gi @ s.M
    kappa = float(torch.linalg.cond(s.G))
    for k in range(1, r + 1):
        tx = torch.trace(torch.linalg.matrix_power(X, k))
        ty = torch.trace(torch.linalg.matrix_power(Y, k))
        scale = (
            float(torch.linalg.matrix_norm(X, ord=2) ** k + torch.linalg.matrix_norm(Y, ord=2) ** k)
            * r
        )
        assert float((tx - ty).abs()) <= k * rounding_allowance(kappa, r, PRECISIONS[0]) * scale


def test_erratum_remark3_energy_and_threshold():
    """Remark 3: |lambda|^K is the amplitude kept; the energy kept is |lambda|^{2K}. At K = 2 a mode
    with |lambda| = 0.7 keeps 49% amplitude but 24% energy; at K = 4 the 50% amplitude
    threshold is 0.5^{1/4} = 0.841, not 0.85."""
    A = torch.diag(torch.tensor([0.7, 0.3], dtype=F64))
    w = torch.tensor([1.0, 0.0], dtype=F64)
    out = torch.linalg.matrix_power(A, 2) @ w
    # fl(0.7)^2 (2u), the product (u) and 0.49's own rounding (u): gamma_4; the norm of a vector
    # with one nonzero entry is exact (sqrt(x^2) = |x|); squared again: gamma_8
    assert float(out.norm()) == pytest.approx(0.49, rel=gamma(4, U64), abs=0)
    assert float(out.norm() ** 2) == pytest.approx(
        0.2401, rel=gamma(8, U64), abs=0
    )  # printed: 'at least 49% of their energy'
    assert _rounds_to(0.5**0.25, 0.8409, 4, roundings=2)
    for lam, printed in ((0.95, 0.902), (0.9, 0.81), (0.7, 0.49), (0.5, 0.25), (0.3, 0.09)):
        assert _rounds_to(lam**2, printed, 3, roundings=4)  # D.1 table, K = 2
    for lam, printed in ((0.95, 0.815), (0.9, 0.656), (0.7, 0.240), (0.5, 0.063), (0.3, 0.008)):
        assert _rounds_to(lam**4, printed, 3, roundings=6)  # K = 4 (0.0625 printed 0.063: half-way)
    # the check can fail: |lambda|^2 is not the K = 4 column (0.9^2 = 0.81 vs 0.656)
    assert not _rounds_to(0.9**2, 0.656, 3, roundings=4)


def _rounds_to(x: float, printed: float, decimals: int, *, roundings: int) -> bool:
    """x within half a unit of the printed last decimal: h = 0.5 10^-decimals, up to float64
    (u = 2^-53): x carries ``roundings`` u relative (lam's representation K u and pow's 1 ulp),
    the printed value and h u each, the difference u: |x - p| <= h (1 + 2u) + (roundings |x| + |p|) u
    (1 + u). The half-way case 0.0625 vs 0.063 needs the |p| u term (0.063's own rounding)."""
    h = 0.5 * 10.0**-decimals
    return abs(x - printed) <= h * (1 + 2 * U64) + (roundings * abs(x) + abs(printed)) * U64 * (
        1 + U64
    )


def test_erratum_state_size_of_the_50m_model():
    """Section 3.5: '~77 KB in FP32' for the 50M model (r = 56, P = 448/7 = 64, 7 heads, 4 SKA
    layers). The printed formula 2 r^2 + P r + r + 1 gives 9913 floats per head: 1.11 MB."""
    r, P, heads, layers = 56, 448 // 7, 7, 4
    per_head = 2 * r * r + P * r + r + 1
    total_bytes = per_head * heads * layers * 4
    assert per_head == 9913 and total_bytes == 1_110_256
    assert total_bytes > 14 * 77_000


def test_loose_c1_bound_overestimates_by_kappa():
    """Theorem C.1 holds but carries a spurious factor kappa(G~): from eq. (41),
    ||A^ - A|| <= ||E_M|| ||G^~^{-1}|| + ||A|| ||E_G|| ||G^~^{-1}||."""
    z, v, _ = ar1_data(T=30, r=5, seed=18)
    s = koopman_statistics(z, v)
    g = torch.Generator().manual_seed(1)
    E_G = 1e-4 * torch.randn(5, 5, generator=g, dtype=F64)
    E_G = E_G + E_G.mT
    E_M = 1e-4 * torch.randn(5, 5, generator=g, dtype=F64)
    n2 = lambda X: float(torch.linalg.matrix_norm(X, ord=2))  # noqa: E731
    A = s.M @ torch.linalg.inv(s.G)
    Gh = s.G + E_G
    Ah = (s.M + E_M) @ torch.linalg.inv(Gh)
    err = n2(Ah - A)
    printed = n2(E_M) * n2(torch.linalg.inv(Gh)) + n2(A) * n2(torch.linalg.inv(s.G)) * n2(E_G) * n2(
        torch.linalg.inv(Gh)
    ) * n2(s.G)
    tight = n2(E_M) * n2(torch.linalg.inv(Gh)) + n2(A) * n2(E_G) * n2(torch.linalg.inv(Gh))
    kappa = float(torch.linalg.cond(s.G))
    # float64: A and A^ each within the allowance c kappa (n u + u) of their exact values (the
    # inverse), and tight's own evaluation (norms, inverse) the same relative: measured
    # err / tight = 0.26, the slack 7e-14 relative
    allow = rounding_allowance(max(kappa, float(torch.linalg.cond(Gh))), 5, PRECISIONS[0])
    assert err <= tight * (1 + allow) + allow * (n2(A) + n2(Ah)) and tight <= printed
    assert printed / tight > 0.5 * kappa > 5


def test_c5_phase_noise_attenuates_the_raw_operator():
    """Prop. C.5: with i.i.d. uniform phase increments |M_raw| / G_raw -> 0 (like T^{-1/2}); the
    invariant lift |k|^2 keeps it O(1). Real 2-vectors (Re, Im) for k, r = 1 for |k|^2."""
    g = torch.Generator().manual_seed(2)
    ratios = {}
    for T in (100, 1600):
        mag = 1 + 0.5 * torch.rand(T, generator=g, dtype=F64)
        theta = 2 * math.pi * torch.rand(T, generator=g, dtype=F64).cumsum(0)
        k = torch.stack([mag * torch.cos(theta), mag * torch.sin(theta)], dim=-1)
        raw = koopman_statistics(k, torch.zeros(T, 1, dtype=F64), eps=0.0)
        inv = koopman_statistics((mag**2)[:, None], torch.zeros(T, 1, dtype=F64), eps=0.0)
        ratios[T] = (
            float(torch.linalg.matrix_norm(raw.M @ torch.linalg.inv(raw.G), ord=2)),
            float(inv.M / inv.G),
        )
    assert ratios[1600][0] < 0.5 * ratios[100][0] and ratios[1600][0] < 0.1
    assert ratios[1600][1] > 0.8


def test_e1_gram_bound_holds_at_prefill_not_at_frozen_decode():
    """Prop. E.1: with m = max ||z_s||, ||G||_F, tr G, lambda_max(G) <= T. Decoding freezes m, so a
    later token with ||z|| > m breaks the bound (the proposition assumes m over all tokens)."""
    z, v, _ = ar1_data(T=6, r=3, seed=19)
    s = koopman_statistics(z, v, eps=0.0)
    assert float(torch.trace(s.G)) <= 6 and float(torch.linalg.matrix_norm(s.G)) <= 6
    stream = KoopmanStream.prefill(z, v, eps=0.0)
    stream.update(10 * stream.scale * z[0] / z[0].norm(), v[0])  # ||z^|| = 10 > 1
    G = stream.statistics().G
    assert float(torch.linalg.eigvalsh(G).max()) > 7  # T = 7 tokens


def test_erratum_chunk_causal_mode_leaks_the_future_through_m():
    """Eqs. (7)-(10) estimate chunk c's operator 'from strictly preceding chunks', but eq. (3)'s
    m = max_{s<=T} ||z_s|| is taken over the whole sequence: a later token changes earlier
    outputs. With a scale that does not depend on later tokens (``scale=``) the mode is causal."""
    z, v, zq = ar1_data(T=24, seed=20)
    late = z.clone()
    late[-1] = 10 * late[-1]  # only the last token (chunk 3) changes
    queries = zq.expand(4, 4, 6)
    printed = [
        koopman_readout(chunk_causal_statistics(x, v, chunk_size=6), queries) for x in (z, late)
    ]
    assert float((printed[0][1] - printed[1][1]).abs().max()) > 1e-3  # chunk 1 output moved
    m = float(sequence_max_scale(z[:6]))  # e.g. frozen after the first chunk
    fixed = [
        koopman_readout(chunk_causal_statistics(x, v, chunk_size=6, scale=m), queries)
        for x in (z, late)
    ]
    assert torch.equal(fixed[0][:3], fixed[1][:3])  # chunks 0-2 cannot see token 23
