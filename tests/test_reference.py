"""The NumPy paths: the loop reference against hand-worked cases, and the chunked CPU
implementation against the loop (float64, so they agree to rounding)."""
import numpy as np
import pytest

from cupy_gda import reference as R
from cupy_gda._verify import GATES


def _rand(shape, rng):
    return rng.standard_normal(shape)


def test_T1_is_one_outer_product():
    rng = np.random.default_rng(1)
    q, k, g = (_rand((2, 1, 3, 5), rng) for _ in range(3))
    v = _rand((2, 1, 3, 4), rng)
    o = R.gated_attention_ref(q, k, v, g, scale=0.5)
    want = 0.5 * np.einsum("bthk,bthk->bth", q, k)[..., None] * v
    np.testing.assert_allclose(o, want, rtol=1e-13, atol=1e-15)


def test_K1_V1_scalar_recurrence():
    q = np.array([1.0, 2.0, -1.0]).reshape(1, 3, 1, 1)
    k = np.array([1.0, 1.0, 2.0]).reshape(1, 3, 1, 1)
    v = np.array([3.0, -1.0, 0.5]).reshape(1, 3, 1, 1)
    g = np.array([0.5, 0.5, -2.0]).reshape(1, 3, 1, 1)
    # S = 3; S = 0.5*3 - 1 = 0.5; S = -2*0.5 + 1 = 0  -> o = q*S = 3, 1, 0
    o, S = R.gated_attention_ref(q, k, v, g, output_final_state=True)
    np.testing.assert_array_equal(o.ravel(), [3.0, 1.0, 0.0])
    np.testing.assert_array_equal(S.ravel(), [0.0])


def test_gate_zero_forgets_everything_before():
    rng = np.random.default_rng(2)
    q, k = _rand((1, 6, 2, 4), rng), _rand((1, 6, 2, 4), rng)
    v = _rand((1, 6, 2, 3), rng)
    h0 = rng.standard_normal((1, 2, 4, 3)).astype(np.float32)
    o = R.gated_attention_ref(q, k, v, np.zeros_like(q), initial_state=h0)
    want = np.einsum("bthk,bthk->bth", q, k)[..., None] * v
    np.testing.assert_allclose(o, want, rtol=1e-13, atol=1e-15)


def test_gate_one_is_causal_linear_attention():
    rng = np.random.default_rng(3)
    q, k = _rand((2, 7, 2, 4), rng), _rand((2, 7, 2, 4), rng)
    v = _rand((2, 7, 2, 5), rng)
    o = R.gated_attention_ref(q, k, v, np.ones_like(q))
    A = np.tril(np.einsum("bthk,bshk->bhts", q, k))
    np.testing.assert_allclose(o, np.einsum("bhts,bshv->bthv", A, v), rtol=1e-12, atol=1e-13)


def test_log_gate_equals_gate():
    rng = np.random.default_rng(4)
    q, k, v = (_rand((1, 9, 2, 3), rng) for _ in range(3))
    g = rng.uniform(0, 1, q.shape)
    g[0, 4] = 0.0
    with np.errstate(divide="ignore"):
        lg = np.log(g)
    np.testing.assert_allclose(R.gated_attention_ref(q, k, v, log_gate=lg),
                               R.gated_attention_ref(q, k, v, g), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("B,T,H,K,V,BT", [
    pytest.param(2, 63, 3, 5, 7, 16, id="B2-T63-H3-K5-V7-BT16"),
    pytest.param(1, 64, 2, 24, 24, 32, id="B1-T64-H2-K24-V24-BT32"),
    pytest.param(2, 1, 1, 8, 3, 32, id="B2-T1-H1-K8-V3-BT32"),
    pytest.param(1, 100, 1, 1, 1, 7, id="B1-T100-H1-K1-V1-BT7"),
])
def test_chunked_equals_loop(B, T, H, K, V, BT, gate):
    rng = np.random.default_rng(5)
    q, k = _rand((B, T, H, K), rng), _rand((B, T, H, K), rng)
    v = _rand((B, T, H, V), rng)
    g = GATES[gate](rng, q.shape)
    h0 = rng.standard_normal((B, H, K, V)).astype(np.float32)
    o1, s1 = R.gated_attention_ref(q, k, v, g, initial_state=h0, output_final_state=True, scale=0.3)
    o2, s2 = R.gated_attention_chunked(q, k, v, g, initial_state=h0, output_final_state=True,
                                       scale=0.3, BT=BT)
    scale = max(1.0, np.abs(o1).max())
    np.testing.assert_allclose(o2, o1, rtol=1e-11, atol=1e-12 * scale)
    np.testing.assert_allclose(s2, s1, rtol=1e-11, atol=1e-12 * max(1.0, np.abs(s1).max()))


def test_chunked_varlen_equals_separate_runs():
    rng = np.random.default_rng(6)
    lens = [1, 17, 0, 64, 30]
    T = sum(lens)
    q, k = _rand((1, T, 2, 6), rng), _rand((1, T, 2, 6), rng)
    v = _rand((1, T, 2, 5), rng)
    g = rng.uniform(-1, 1, q.shape)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    h0 = rng.standard_normal((len(lens), 2, 6, 5)).astype(np.float32)
    for fn in (R.gated_attention_ref, R.gated_attention_chunked):
        o, s = fn(q, k, v, g, initial_state=h0, cu_seqlens=cu, output_final_state=True)
        for n in range(len(lens)):
            a, b = cu[n], cu[n + 1]
            on, sn = R.gated_attention_ref(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b],
                                           initial_state=h0[n:n + 1], output_final_state=True)
            np.testing.assert_allclose(o[:, a:b], on, rtol=1e-11, atol=1e-12)
            np.testing.assert_allclose(s[n:n + 1], sn, rtol=1e-11, atol=1e-12)


def test_float32_mode_computes_in_float32():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 50, 2, 8)) for _ in range(3))
    g = rng.uniform(0, 1, q.shape)
    o64 = R.gated_attention_ref(q, k, v, g)
    o32 = R.gated_attention_ref(q, k, v, g, dtype=np.float32)
    assert o32.dtype == np.float32 and o64.dtype == np.float64
    err = np.abs(o32 - o64).max() / np.abs(o64).max()
    assert 1e-9 < err < 1e-5          # float32 rounding, not float64, not garbage


def test_nan_propagates_like_the_recurrence():
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 10, 1, 3)) for _ in range(3))
    g = np.zeros_like(q)             # a reset every step ...
    k[0, 4, 0, 0] = np.nan           # ... cannot clear a NaN (0 * NaN = NaN)
    for fn in (R.gated_attention_ref, R.gated_attention_chunked):
        o = fn(q, k, v, g)
        assert np.isfinite(o[0, :4]).all() and np.isnan(o[0, 4:]).all()


def test_step_ref_updates_only_indexed_rows():
    rng = np.random.default_rng(9)
    q, k, g = (rng.standard_normal((3, 2, 4)) for _ in range(3))
    v = rng.standard_normal((3, 2, 5))
    state = rng.standard_normal((6, 2, 4, 5)).astype(np.float32)
    before = state.copy()
    idx = np.array([4, 0, 2])
    o = R.gated_attention_step_ref(q, k, v, g, state=state, state_indices=idx)
    o2, s2 = R.gated_attention_ref(q[:, None], k[:, None], v[:, None], g[:, None],
                                   initial_state=before[idx], output_final_state=True)
    np.testing.assert_allclose(o, o2[:, 0], rtol=1e-12)
    np.testing.assert_allclose(state[idx], s2.astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(state[[1, 3, 5]], before[[1, 3, 5]])


# ---- issue 14: every CPU method gives the loop's result for every input the loop takes

@pytest.mark.parametrize("lens", [None, (5, 0, 17, 64, 1, 33)], ids=["batch", "varlen"])
def test_recurrent_equals_loop(lens):
    """The CPU loop over every sequence at once (method "recurrent" and "auto") is the
    contract's loop: sequences of different lengths, empty ones, an initial state."""
    rng = np.random.default_rng(10)
    B, T = (3, 40) if lens is None else (1, sum(lens))
    N = B if lens is None else len(lens)
    q, k, g = (_rand((B, T, 2, 5), rng) for _ in range(3))
    v = _rand((B, T, 2, 7), rng)
    h0 = rng.standard_normal((N, 2, 5, 7))
    cu = None if lens is None else np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    o1, s1 = R.gated_attention_ref(q, k, v, g, initial_state=h0, cu_seqlens=cu, scale=0.7,
                                   output_final_state=True)
    o2, s2 = R.gated_attention_recurrent(q, k, v, g, initial_state=h0, cu_seqlens=cu, scale=0.7,
                                         output_final_state=True)
    assert o2.dtype == s2.dtype == np.float64
    np.testing.assert_allclose(o2, o1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s2, s1, rtol=1e-12, atol=1e-12)


def test_no_floating_point_warnings_for_valid_inputs():
    """Overflow, NaN and inf in the inputs are results, not errors: no RuntimeWarning leaks
    from any CPU method or reference function."""
    import warnings
    import cupy_gda
    q = k = v = np.ones((1, 3, 1, 1), np.float32)
    g = np.array([1e20, 1e20, .5], np.float32).reshape(1, 3, 1, 1)
    kinf = k.copy()
    kinf[0, 1] = np.inf
    lg = np.array([100.0, -np.inf, 0.0], np.float32).reshape(1, 3, 1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kk in (k, kinf):
            for m in ("auto", "chunk", "recurrent"):
                for gate in (g, np.zeros_like(g)):
                    cupy_gda.gated_attention(q, kk, v, gate, output_final_state=True, method=m)
                cupy_gda.gated_attention(q, kk, v, log_gate=lg, method=m)
            for fn in (R.gated_attention_ref, R.gated_attention_chunked, R.gated_attention_recurrent):
                fn(q, kk, v, g)
                fn(q, kk, v, log_gate=lg)
        state = np.full((1, 1, 1, 1), 3e38, np.float32)
        cupy_gda.gated_attention_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], state=state)
        R.gated_attention_step_ref(q[:, 0], kinf[:, 0], v[:, 0], log_gate=lg[:, 0], state=state)


@pytest.mark.parametrize("fn", [R.gated_attention_ref, R.gated_attention_chunked,
                                R.gated_attention_recurrent], ids=lambda f: f.__name__)
@pytest.mark.parametrize("change, exc, words", [
    pytest.param(dict(q=[[[[1.0]]]]), TypeError, ("q must be a NumPy array", "builtins.list"), id="q-list"),
    pytest.param(dict(initial_state=[[[[0.0]]]]), TypeError, ("initial_state must be a NumPy array",),
                 id="state-list"),
    pytest.param(dict(scale=None), TypeError, ("scale must be a real number", "NoneType"), id="scale-None"),
    pytest.param(dict(scale="2"), TypeError, ("scale must be a real number", "str"), id="scale-str"),
    pytest.param(dict(scale=np.ones(3)), TypeError, ("scale must be a real number", "ndarray"),
                 id="scale-array"),
    pytest.param(dict(dtype=np.int32), TypeError, ("dtype must be float32 or float64", "int32"),
                 id="dtype-int32"),
])
def test_reference_functions_validate(fn, change, exc, words):
    """The NumPy functions check their arguments like the public ones (before, a list raised
    AttributeError, scale=None gave all-NaN output, scale='2' and dtype=int32 were taken)."""
    x = np.ones((1, 2, 1, 1))
    args = dict(q=x, k=x, v=x, gate=x, initial_state=None, scale=1.0, dtype=np.float64)
    args.update(change)
    with pytest.raises(exc) as e:
        fn(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("gate"), **args)
    assert all(w in str(e.value) for w in words) and fn.__name__ in str(e.value), str(e.value)


@pytest.mark.parametrize("change, words", [
    pytest.param(dict(scale=None), ("scale must be a real number",), id="scale-None"),
    pytest.param(dict(q=[[[1.0]]]), ("q must be a NumPy array",), id="q-list"),
    pytest.param(dict(dtype="int32"), ("dtype must be float32 or float64",), id="dtype-int32"),
])
def test_step_ref_validates_and_leaves_state(change, words):
    x = np.ones((1, 1, 1))
    state = np.full((1, 1, 1, 1), 2.0, np.float32)
    args = dict(q=x, k=x, v=x, gate=x, state=state, scale=1.0, dtype=np.float64)
    args.update(change)
    with pytest.raises(TypeError) as e:
        R.gated_attention_step_ref(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("gate"), **args)
    assert all(w in str(e.value) for w in words), str(e.value)
    assert state.ravel().tolist() == [2.0]
