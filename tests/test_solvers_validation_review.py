"""Review findings on input validation in the reference solvers: each bad input gets a clear
TypeError/ValueError naming the argument (not a traceback from inside torch, not a silent NaN,
inf or 0), results never alias the caller's tensors, and siblings accept the same things."""

import pytest
import torch

import solvers as S
from analysis.precision import gamma

F64 = torch.float64


# ----------------------------------------------------------------------------- Koopman: sigma_max


@pytest.mark.parametrize(
    "value,dtype", [(1e30, torch.float32), (1e-30, torch.float32), (1e300, F64), (1e-300, F64)]
)
def test_power_sigma_max_is_right_for_huge_and_tiny_A(value, dtype):
    """The power iteration overflowed or underflowed (1e30 in float32 gave sigma = 0, true 3e30)."""
    A = torch.full((3, 3), value, dtype=dtype)
    # A = a J is rank one: sigma_max = 3a (power_ratio_bound = 1, no iteration error), so only
    # rounding separates the estimate from it (Higham's gamma_n, u of the dtype; the scaling by
    # powers of two is exact). Every v_k is c (1, 1, 1): the last normalisation c = y / ||y||,
    # a 3-term dot, sqrt and division (5); the last A v, a 3-term dot (3); its norm, a 3-term
    # dot and sqrt (4); 3a formed in float64 (1, u_64 <= u): gamma_13
    sigma, rel = 3 * float(A[0, 0]), gamma(13, S.unit_roundoff(dtype))
    assert float(S.power_sigma_max(A)) == pytest.approx(sigma, rel=rel, abs=0)
    v0 = torch.tensor([1.0, 0.0, 0.0], dtype=dtype)  # A v0 = a (1, 1, 1), exact: the same c 1
    assert float(S.power_sigma_max(A, v0=v0)) == pytest.approx(sigma, rel=rel, abs=0)
    # the scaling is by a power of two, exact: a well-scaled A gives the bits it gave before
    B = torch.randn(5, 5, generator=torch.Generator().manual_seed(0), dtype=dtype)
    assert torch.equal(S.power_sigma_max(B * 2.0**-40) * 2.0**40, S.power_sigma_max(B))


def test_spectral_normalize_keeps_its_promise_for_huge_A():
    A = torch.full((3, 3), 1e30)
    out = S.spectral_normalize(A, gamma=1.2)
    # ||A'|| <= gamma for rank-one A (power_ratio_bound = 1), up to rounding in float32 (u =
    # 2^-24): the estimate sigma (gamma_12, test above), gamma stored (1), gamma / sigma (1),
    # A * factor (1): gamma_15; and the float64 SVD that measures it, within p(3) u_64 ||A'||
    # (LAPACK Users' Guide 4.9, p(3) taken as 3)
    bound = 1.2 * (1 + gamma(15, 2.0**-24)) * (1 + gamma(3, 2.0**-53))
    assert float(torch.linalg.matrix_norm(out.double(), ord=2)) <= bound
    with pytest.raises(ValueError, match="^A has sigma_max .* overflows"):
        S.spectral_normalize(torch.full((3, 3), 3e38))  # gamma / sigma would make A' = 0


def test_zero_v0_is_refused():
    with pytest.raises(ValueError, match="^v0 must be nonzero"):
        S.power_sigma_max(torch.eye(3), v0=torch.zeros(3))
    with pytest.raises(ValueError, match="^v0 must be nonzero"):
        S.spectral_normalize(
            torch.eye(3).expand(2, 3, 3), v0=torch.tensor([[1.0, 0, 0], [0, 0, 0]])
        )


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(iters=-1), ValueError, "^iters must be >= 0"),
        (dict(iters=True), TypeError, "^iters must be an int"),
        (dict(v0="junk"), TypeError, "^v0 must be a torch.Tensor"),
        (dict(v0=torch.ones(4)), ValueError, "^v0 has last dimension 4"),
        (dict(v0=torch.ones(2, 3)), ValueError, "^v0 has batch shape"),
    ],
)
def test_spectral_normalize_checks_every_option_whatever_sigma(kwargs, exc, match):
    kwargs.setdefault("sigma", "exact")
    with pytest.raises(exc, match=match):
        S.spectral_normalize(torch.eye(3), **kwargs)


# ----------------------------------------------------------------------------- KLA chunk helpers


def _chunk(C=4, d_k=3, d_v=2, dtype=F64):
    g = torch.Generator().manual_seed(3)
    k = torch.randn(C, d_k, generator=g, dtype=dtype)
    v = torch.randn(C, d_v, generator=g, dtype=dtype)
    return k, v, torch.full((C,), 0.5, dtype=dtype), torch.full((C,), 0.9, dtype=dtype)


def test_chunk_system_initial_state_none_is_zeros():
    k, v, beta, alpha = _chunk()
    L, R = S.kla_chunk_system(k, v, beta, alpha, None)
    L0, R0 = S.kla_chunk_system(k, v, beta, alpha, torch.zeros(3, 2, dtype=F64))
    assert torch.equal(L, L0) and torch.equal(R, R0)
    O, S_out = S.kla_chunk_outputs(k, k, S.forward_substitution(L, R), alpha, None)
    assert O.shape == (4, 2) and S_out.shape == (3, 2)


def test_chunk_helpers_check_shapes():
    k, v, beta, alpha = _chunk()
    U = torch.randn(4, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"^initial_state must be \(\.\.\., d_k, d_v\)"):
        S.kla_chunk_system(k, v, beta, alpha, torch.zeros(2, 2, dtype=F64))
    with pytest.raises(ValueError, match="^batch shapes of k and v do not broadcast"):
        S.kla_chunk_system(k.expand(2, 4, 3), v.expand(3, 4, 2), beta, alpha, None)
    with pytest.raises(ValueError, match="^q has 3 rows but k has 4"):
        S.kla_chunk_outputs(k[:3], k, U, alpha, None)
    with pytest.raises(ValueError, match="^U has 3 rows but k has 4"):
        S.kla_chunk_outputs(k, k, U[:3], alpha, None)
    with pytest.raises(ValueError, match=r"^initial_state must be \(\.\.\., d_k, d_v\)"):
        S.kla_chunk_outputs(k, k, U, alpha, torch.zeros(3, 5, dtype=F64))
    with pytest.raises(TypeError, match="^U must be a torch.Tensor"):
        S.kla_chunk_outputs(k, k, [[0.0]], alpha, None)
    bad = U.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match="^U has 1 non-finite"):
        S.kla_chunk_outputs(k, k, bad, alpha, None)  # was a silent NaN output
    with pytest.raises(TypeError, match="^W must be a torch.Tensor"):
        S.wy_matrices(k, None, U, alpha)
    with pytest.raises(ValueError, match="^W has 2 rows but k has 4"):
        S.wy_matrices(k, k[:2], U, alpha)
    with pytest.raises(TypeError, match="^v must be a torch.Tensor"):
        S.wy_representation(k, None, beta, alpha)


def test_chunk_helpers_refuse_mixed_dtypes():
    k, v, beta, alpha = _chunk()
    S0 = torch.zeros(3, 2, dtype=F64)
    for args, name in (
        ((k, v.float(), beta, alpha, S0), "v"),
        ((k, v, beta.float(), alpha, S0), "beta"),
        ((k, v, beta, alpha, S0.float()), "initial_state"),
    ):
        with pytest.raises(TypeError, match=f"^{name} has dtype torch.float32"):
            S.kla_chunk_system(*args)
    with pytest.raises(TypeError, match="^L has dtype torch.float32 but R has torch.float64"):
        S.forward_substitution(torch.zeros(4, 4), v)
    with pytest.raises(TypeError, match="^q has dtype torch.float32"):
        S.kla_chunk_outputs(k.float(), k, v, alpha, S0)
    # the compute dtype that kaczmarz_coefficient / forward_substitution return stays accepted
    kb, vb, _, ab = _chunk(dtype=torch.bfloat16)
    L, R = S.kla_chunk_system(kb, vb, S.kaczmarz_coefficient(kb, 0.5), ab, None)
    assert S.kla_chunk_outputs(kb, kb, S.forward_substitution(L, R), ab, None)[0].dtype == kb.dtype


def test_chunk_outputs_zero_query_is_refused_like_kla_recurrent():
    k, v, beta, alpha = _chunk()
    q = k.clone()
    q[2] = 0.0
    with pytest.raises(ValueError, match=r"^q has a query of norm 0 .*row 2"):
        S.kla_chunk_outputs(q, k, v, alpha, None)
    O, _ = S.kla_chunk_outputs(q, k, v, alpha, None, normalize_queries=False)
    assert bool(torch.isfinite(O).all())


def test_empty_chunk_gives_empty_results_everywhere():
    k, v, beta, alpha = (x[:0] for x in _chunk())
    S0 = torch.randn(3, 2, dtype=F64)
    L, R = S.kla_chunk_system(k, v, beta, alpha, S0)
    U = S.forward_substitution(L, R)
    assert L.shape == (0, 0) and U.shape == (0, 2) and U is not R
    O, S_out = S.kla_chunk_outputs(k, k, U, alpha, S0)
    assert O.shape == (0, 2) and torch.equal(S_out, S0)
    S_out.add_(1.0)  # a copy: the caller's S0 is untouched
    assert not torch.equal(S_out, S0)
    W, U2 = S.wy_representation(k, v, beta, alpha)
    P, H = S.wy_matrices(k, W, U2, alpha)
    assert P.shape == (0, 3, 3) and H.shape == (0, 3, 2)


@pytest.mark.parametrize("fn", [S.kla_recurrent, S.kla_chunkwise])
def test_kla_with_no_tokens_returns_a_copy_of_the_initial_state(fn):
    q = torch.randn(0, 1, 3, dtype=F64)
    S0 = torch.randn(1, 3, 2, dtype=F64)
    _, S_T = fn(q, q, torch.randn(0, 1, 2, dtype=F64), alpha=0.9, eta=0.5, initial_state=S0)
    assert torch.equal(S_T, S0) and S_T.data_ptr() != S0.data_ptr()


# ----------------------------------------------------------------------------- GKA gradients


def _gka(T=3, D=3, Dv=2, dtype=F64):
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(T, D, generator=g, dtype=dtype) for _ in range(2))
    v, dy = (torch.randn(T, Dv, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v, dy


@pytest.mark.parametrize("fn", [S.gka_implicit_grads, S.gka_autograd_grads])
def test_gka_gradients_need_dy_of_exactly_ys_shape(fn):
    q, k, v, dy = _gka()
    with pytest.raises(ValueError, match=r"^dy must have y's shape"):
        fn(q, k, v, dy.expand(2, 3, 2), a=0.1)  # was doubled gradients / RuntimeError
    with pytest.raises(ValueError, match=r"^dy must end in \(T, Dv\)"):
        fn(q, k, v, dy[:1], a=0.1)  # was silently broadcast / RuntimeError
    with pytest.raises(TypeError, match="^k has dtype torch.float32 but q has torch.float64"):
        fn(q, k.float(), v, dy, a=0.1)


@pytest.mark.parametrize("fn", [S.gka_implicit_grads, S.gka_autograd_grads])
def test_gka_gradients_refuse_a_that_the_working_precision_rounds_to_zero(fn):
    q, k, v, dy = _gka(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^a = 1e-300 rounds to 0.0 in float32"):
        fn(q, k, v, dy, a=1e-300)  # was NaN (implicit) or zero (autograd) gradients


# ----------------------------------------------------------------------------- GKA chunkwise


def test_chunkwise_Bk_names_ws_batch():
    k = torch.randn(4, 3, dtype=F64)
    w = torch.randn(4, dtype=F64)
    with pytest.raises(ValueError, match=r"^w has batch shape \(2,\)"):
        S.chunkwise_Bk(k, w.expand(2, 4), chunk_size=2)
    assert S.chunkwise_Bk(k.expand(2, 4, 3), w, chunk_size=2).shape == (2, 4, 3)


def test_chunkwise_frobenius_overflow_is_named():
    k = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)) * 1e19
    with pytest.raises(ValueError, match=r"^\|\|H_t\|\|_F is not finite at token t = 1"):
        S.chunkwise_frobenius(k, chunk_size=2)
    assert torch.equal(S.chunkwise_frobenius(torch.zeros(4, 3), chunk_size=2), torch.zeros(4))


# ----------------------------------------------------------------------------- Koopman stream


def test_stream_mask_is_checked_like_koopman_statistics():
    stream = S.KoopmanStream(3, 2, scale=1.0, batch_shape=(2,))
    G = stream.G.clone()
    with pytest.raises(ValueError, match="^mask must be boolean or hold only 0 and 1"):
        stream.update(torch.ones(3), torch.ones(2), mask=torch.tensor(0.5))
    with pytest.raises(ValueError, match=r"^mask must have the stream's batch shape \(2,\)"):
        stream.update(torch.ones(3), torch.ones(2), mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="^mask must be a torch.Tensor"):
        stream.update(torch.ones(3), torch.ones(2), mask=True)
    assert torch.equal(stream.G, G) and stream.tokens == 0
    stream.update(torch.ones(3), torch.ones(2), mask=torch.tensor([1, 0]))


def test_stream_supports_r_zero_like_koopman_statistics():
    z, v = torch.randn(4, 0), torch.randn(4, 2)
    ref = S.koopman_statistics(z, v)
    stream = S.KoopmanStream.prefill(z, v)
    stream.update(torch.ones(0), torch.ones(2))
    st = stream.statistics()
    assert st.G.shape == ref.G.shape == (0, 0) and st.Cv.shape == ref.Cv.shape == (2, 0)
    assert S.KoopmanStream(0, 2, scale=1.0).statistics().M.shape == (0, 0)


@pytest.mark.parametrize("scale", [1e-40, 1e-20])
def test_koopman_scale_that_overflows_is_named(scale):
    g = torch.Generator().manual_seed(0)
    z, v = torch.randn(5, 3, generator=g), torch.randn(5, 2, generator=g)
    with pytest.raises(ValueError, match="scale"):
        S.koopman_statistics(z, v, scale=scale)  # was inf G, refused later as "G"
    with pytest.raises(ValueError, match="scale"):
        S.chunk_causal_statistics(z, v, scale=scale, chunk_size=2)
    with pytest.raises(ValueError, match="scale"):
        S.KoopmanStream.prefill(z, v, scale=scale)
    with pytest.raises(ValueError, match="^scale .* rounds to 0 or inf in torch.float32"):
        S.KoopmanStream(3, 2, scale=1e-46)


# ----------------------------------------------------------------------------- gates and ridge


def test_cumulative_log_decay_checks_dim_and_sign():
    g = -torch.rand(3, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"^dim must lie in \[-2, 1\]"):
        S.cumulative_log_decay(g, dim=5)
    with pytest.raises(TypeError, match="^dim must be an int"):
        S.cumulative_log_decay(g, dim=1.0)
    with pytest.raises(
        ValueError, match=r"^log_gates = log gamma must be <= 0 \(gamma in \[0, 1\]\)"
    ):
        S.cumulative_log_decay(-g)
    assert S.cumulative_log_decay(g, dim=0).shape == (3, 4)


def test_balanced_gate_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="^a must be a float, got str"):
        S.BalancedGate(a="1")
    with pytest.raises(TypeError, match="^b must be a float, got NoneType"):
        S.BalancedGate(b=None)


def test_fig1a_problems_names_seed():
    with pytest.raises(TypeError, match="^seed must be an int, got str"):
        S.fig1a_problems(seed="x")
    assert S.fig1a_problems(B=1, T=2, heads=1, D=2, seed=-1).A.shape == (1, 2, 1, 2, 2)
