"""Review findings on kernels.kla_chunkwise and its autograd path (kernels.kla_backward): the
grad path checks its arguments as the no-grad path and the reference do, empty inputs have a
backward, ||k||^2 overflow and a NaN initial state with T = 0 are named, d_k = 0 / d_v = 0
give the reference's results. Tiny sizes: each call is a few interpreted programs at most."""

import pytest
import torch
from kernel_support import DEVICE, needs_triton_device

import kernels
import solvers

pytestmark = needs_triton_device
KW = dict(alpha=0.9, eta=1.0, chunk_size=16)


def _qkv(B=1, T=8, H=1, d_k=4, d_v=3, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(B, T, H, d, generator=g).to(DEVICE) for d in (d_k, d_k, d_v)]
    return [t.requires_grad_(requires_grad) for t in x]


def _error(fn):
    with pytest.raises((TypeError, ValueError)) as e:
        fn()
    return type(e.value), str(e.value)


def _gradients(fn, B, T, H):
    """Gradients of o.sum() + S.sum() in q, k, v, alpha and a broadcast initial state."""
    q, k, v = _qkv(B, T, H, requires_grad=True)
    alpha = torch.full((B, T, H), 0.9, device=DEVICE, requires_grad=True)
    S0 = torch.randn(1, H, 4, 3, device=DEVICE, requires_grad=True)
    o, S = fn(q, k, v, alpha=alpha, eta=1.0, initial_state=S0, chunk_size=16)
    (o.sum() + S.sum()).backward()
    # the reference leaves an input that no operation used without a gradient: zero
    return [torch.zeros_like(t) if t.grad is None else t.grad for t in (q, k, v, alpha, S0)]


@pytest.mark.parametrize("B,T,H", [(1, 0, 1), (0, 8, 1), (1, 8, 0)])
def test_backward_of_empty_inputs_is_the_references(B, T, H):
    # was: RuntimeError "cannot reshape tensor of 0 elements" in the backward. With T = 0 the
    # final state is the initial one, so dS_0 = dS_T = 1; every other gradient is zero.
    ref = _gradients(solvers.kla_chunkwise, B, T, H)
    for fn in (kernels.kla_chunkwise, kernels.kla_chunkwise_trainable):
        for got, want in zip(_gradients(fn, B, T, H), ref):
            assert got.shape == want.shape and torch.equal(got, want)


def test_grad_path_raises_the_no_grad_and_reference_errors():
    # was: RuntimeError / AttributeError from inside the backward module, or nothing at all
    q, k, v = _qkv()
    bad = [
        dict(k=torch.randn(2, 8, 1, 4, device=DEVICE)),
        dict(v=torch.randn(2, 8, 1, 3, device=DEVICE)),
        dict(k=[[1.0]]),
        dict(initial_state=[[1.0]]),
        dict(initial_state=torch.randn(3, 1, 4, 3, device=DEVICE)),
        dict(alpha=True),
        dict(alpha="0.9"),
        dict(alpha=None),
        dict(chunk_size=16.0),
    ]
    for change in bad:
        args = {"q": q, "k": k, "v": v, **KW, **change}
        ref = _error(lambda: solvers.kla_chunkwise(**args))
        no_grad = _error(lambda: kernels.kla_chunkwise(**args))
        grad = _error(lambda: kernels.kla_chunkwise(**{**args, "q": q.clone().requires_grad_()}))
        assert grad == no_grad == ref, change


def test_grad_path_honours_check_inputs_and_return_final_state():
    q, k, v = _qkv()
    qg = q.clone().requires_grad_()
    for value in ("bogus", None):  # was: accepted with grad
        with pytest.raises(TypeError, match="check_inputs must be"):
            kernels.kla_chunkwise(qg, k, v, check_inputs=value, **KW)
    with pytest.raises(TypeError, match="return_final_state must be a bool"):  # was: accepted
        kernels.kla_chunkwise(qg, k, v, return_final_state=1, **KW)
    nan_v = v.clone()
    nan_v[0, 1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="v has 1 non-finite"):
        kernels.kla_chunkwise(qg, k, nan_v, **KW)
    # was: raised at once; False returns unchecked, a DeferredChecks raises at verify()
    o, _ = kernels.kla_chunkwise(qg, k, nan_v, check_inputs=False, **KW)
    assert o.requires_grad
    checks = kernels.DeferredChecks()
    kernels.kla_chunkwise(qg, k, nan_v, check_inputs=checks, **KW)
    with pytest.raises(ValueError, match="v has 1 non-finite"):
        checks.verify()
    alpha = torch.full((1, 8, 1), float("nan"), device=DEVICE, requires_grad=True)
    checks = kernels.DeferredChecks()  # a NaN gate too: recorded, not raised at the call
    kernels.kla_chunkwise(q, k, v, alpha=alpha, eta=1.0, chunk_size=16, check_inputs=checks)
    with pytest.raises(ValueError, match="alpha has 8 non-finite"):
        checks.verify()


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the interpreter's k k^T
def test_overflowing_key_norm_is_named():
    # was: beta = eta / inf = 0, the token silently skipped and a finite result
    q, k, v = _qkv()
    k[0, 2, 0, 0] = 1e20
    message = r"\|\|k_t\|\|\^2 overflows in torch.float32: rescale k"
    with pytest.raises(ValueError, match=message):
        solvers.kla_chunkwise(q, k, v, **KW)
    with pytest.raises(ValueError, match=message):
        kernels.kla_chunkwise(q, k, v, **KW)
    checks = kernels.DeferredChecks()
    kernels.kla_chunkwise(q, k, v, check_inputs=checks, **KW)
    with pytest.raises(ValueError, match=message):
        checks.verify()
    o, S = kernels.kla_chunkwise(q, k, v, check_inputs=False, **KW)  # unchecked: never silent
    assert not torch.isfinite(o).all() and not torch.isfinite(S).all()
    with pytest.raises(ValueError, match=message):  # and with gradients
        kernels.kla_chunkwise(q.clone().requires_grad_(), k, v, **KW)


def test_nonfinite_initial_state_is_named_without_tokens():
    # was: T = 0 returned the NaN state; an empty batch with a broadcast state likewise
    S0 = torch.full((1, 1, 4, 3), float("nan"), device=DEVICE)
    for B, T in ((1, 0), (0, 8)):
        q, k, v = _qkv(B=B, T=T)
        ref = _error(lambda: solvers.kla_chunkwise(q, k, v, initial_state=S0, **KW))
        assert ref == (ValueError, "initial_state has 12 non-finite entries (NaN or Inf)")
        assert _error(lambda: kernels.kla_chunkwise(q, k, v, initial_state=S0, **KW)) == ref
        checks = kernels.DeferredChecks()
        kernels.kla_chunkwise(q, k, v, initial_state=S0, check_inputs=checks, **KW)
        assert _error(checks.verify) == ref


def test_empty_feature_dimensions_give_the_references_results():
    # was: ValueError "k must have a feature dimension >= 1"
    for d_k, d_v in ((0, 3), (4, 0), (0, 0)):
        q, k, v = _qkv(d_k=d_k, d_v=d_v)
        S0 = torch.randn(1, 1, d_k, d_v, device=DEVICE)
        kw = dict(KW, initial_state=S0, normalize_queries=False)
        ro, rS = solvers.kla_chunkwise(q, k, v, **kw)
        o, S = kernels.kla_chunkwise(q, k, v, **kw)
        assert torch.equal(o, ro) and torch.equal(S, rS)
        x = [t.clone().requires_grad_() for t in (q, k, v, S0)]  # and zero gradients
        o, S = kernels.kla_chunkwise(*x[:3], **{**kw, "initial_state": x[3]})
        (o.sum() + S.sum()).backward()
        assert all(t.grad is not None and not t.grad.any() for t in x)
    # the values the reference checks are still checked, with no kernel launched to flag them
    q, k, v = _qkv(d_v=0)
    for kw in (dict(alpha=torch.full((8, 1), 1.5, device=DEVICE)), dict(eps=0.0)):
        kw = {**KW, **kw}
        k[0, 3, 0] = 1e-30  # ||k||^2 underflows: refused with eps = 0
        ref = _error(lambda: solvers.kla_chunkwise(q, k, v, **kw))
        got = _error(lambda: kernels.kla_chunkwise(q, k, v, **kw))
        assert got[0] is ref[0] and got[1].split(" at ")[0] == ref[1].split(" at ")[0]
    k[0, 3, 0] = 1e20
    assert _error(lambda: kernels.kla_chunkwise(q, k, v, **KW)) == _error(
        lambda: solvers.kla_chunkwise(q, k, v, **KW)
    )
    # d_k = 0 with normalised queries: o_t = 0 / ||q_t|| = 0 / 0. The reference returns NaN
    # (its zero-query check skips an empty q); the kernel raises the error that its docstring
    # promises for a zero query, and returns the reference's NaN when unchecked
    q, k, v = _qkv(d_k=0)
    with pytest.raises(ValueError, match="query of norm 0"):
        kernels.kla_chunkwise(q, k, v, **KW)
    assert torch.isnan(kernels.kla_chunkwise(q, k, v, check_inputs=False, **KW)[0]).all()
    # return_final_state: the reference accepts any truthy value but documents no such thing;
    # the kernel keeps its strict bool, with gradients too
    q, k, v = _qkv()
    for x in (q, q.clone().requires_grad_()):
        with pytest.raises(TypeError, match="return_final_state must be a bool"):
            kernels.kla_chunkwise(x, k, v, return_final_state=1, **KW)


def test_inputs_are_not_modified_on_the_new_paths():
    q, k, v = _qkv(T=0)
    S0 = torch.randn(1, 1, 4, 3, device=DEVICE, requires_grad=True)
    before = [t.detach().clone() for t in (q, k, v, S0)]
    o, S = kernels.kla_chunkwise(q, k, v, initial_state=S0, **KW)
    S.sum().backward()
    assert all(torch.equal(a.detach(), b) for a, b in zip((q, k, v, S0), before))
    assert S.data_ptr() != S0.data_ptr()
