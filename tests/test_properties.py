"""Property-based tests (hypothesis) of the public forward on NumPy: drawn shapes (sizes 0 and 1,
odd K and V), dtypes, gate regimes (0, negative, tiny, 1, above 1, log gates with -inf), a NaN
or inf at a drawn place, strided views and cu_seqlens layouts (empty segments); every CPU
method against the loop. And drawn invalid arguments raise before any work, leaving the
caller's arrays as they were. The draws are derandomized, so CI runs the same examples."""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import cupy_gda  # noqa: E402
from cupy_gda import _verify, reference  # noqa: E402

METHODS = ("auto", "chunk", "recurrent")
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None)
DTYPES = ("float32", "float64", "float16", "bfloat16")


def _gate(regime, rng, shape):
    if regime == "unif":
        return rng.uniform(0, 1, shape)
    if regime == "zeros":
        return np.where(rng.random(shape) < 0.3, 0.0, rng.uniform(0.5, 1, shape))
    if regime == "ones":
        return np.ones(shape)
    if regime == "neg":
        return rng.uniform(-1, 1, shape)
    if regime == "tiny":
        return np.where(rng.random(shape) < 0.5, 1e-30, rng.uniform(0.5, 1, shape))
    return rng.uniform(1, 1.2, shape)                      # "grow": above 1


@st.composite
def problems(draw):
    """Keyword arguments of gated_attention on NumPy, and a description of the draw."""
    varlen = draw(st.booleans())
    H, K, V = draw(st.integers(0, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    if varlen:
        lens = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
        B, T = 1, sum(lens)
    else:
        lens = None
        B, T = draw(st.integers(0, 3)), draw(st.integers(0, 70))
    dtype = draw(st.sampled_from(DTYPES))
    regime = draw(st.sampled_from(("unif", "zeros", "ones", "neg", "tiny", "grow")))
    log = draw(st.booleans()) and regime not in ("neg",)    # a log gate is a positive gate's log
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    dt = _verify._dtype(dtype)
    stride = draw(st.sampled_from((1, 2)))                  # strided views of bigger arrays

    def arr(d, scale=1.0):
        x = (rng.standard_normal((B, T * stride, H, d)) * scale)[:, ::stride]
        return x.astype(dt)

    q, k, v = arr(K, K ** -0.5), arr(K, K ** -0.5), arr(V)
    g = _gate(regime, rng, (B, T, H, K))
    if regime == "tiny" or dtype == "float64":
        g_dt = np.float32 if dtype != "float64" else np.float64
    else:
        g_dt = dt
    poison = draw(st.sampled_from((None, "nan-k", "inf-v", "inf-q", "nan-gate")))
    if poison and q.size and v.size:
        t, h = draw(st.integers(0, T - 1)), draw(st.integers(0, H - 1))
        b = draw(st.integers(0, B - 1))
        name, bad = poison.split("-")[1], np.nan if poison.startswith("nan") else np.inf
        target = dict(k=k, v=v, q=q, gate=g)[name]
        target[b, t, h, 0] = bad
    kw = dict(q=q, k=k, v=v)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            kw["log_gate"] = np.log(g).astype(g_dt)
    else:
        kw["gate"] = g.astype(g_dt)
    N = len(lens) if varlen else B
    if draw(st.booleans()):
        kw["initial_state"] = rng.standard_normal((N, H, K, V)).astype(np.float32)
    if varlen:
        kw["cu_seqlens"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    kw["scale"] = draw(st.sampled_from((1.0, 0.5, -2.0)))
    return kw, f"B{B} T{T} H{H} K{K} V{V} {dtype} {regime} log={log} lens={lens} {poison} s{stride}"


def _check(name, got, emu, ref, ulps=0):
    """got (a method's result) against the loop in the same math precision ``emu`` and the
    float64 loop ``ref``: the same NaN and inf elements as ``emu``, and its finite elements
    within the accuracy contract of ``ref`` (2x emu's RMS error + 1e-6 max|ref|), plus ``ulps``
    float32 ulps of max|ref| (the chunked form: its sums run in another order than the loop's,
    and on a tensor of a few elements the loop's own error can be 0 by chance)."""
    got, emu, ref = (np.asarray(x, np.float64) for x in (got, emu, ref))
    assert got.shape == ref.shape, name
    np.testing.assert_array_equal(np.isnan(got), np.isnan(emu), err_msg=f"{name}: NaN elements")
    np.testing.assert_array_equal(np.isinf(got), np.isinf(emu), err_msg=f"{name}: inf elements")
    both = np.isfinite(emu) & np.isfinite(ref)
    if both.any():
        r = _verify.compare(name, got[both], ref[both], emu[both])
        bound = r.bound + ulps * np.finfo(np.float32).eps * float(np.abs(ref[both]).max())
        assert r.err <= bound, f"{name}: err {r.err:.3e} > bound {bound:.3e}"


@SETTINGS
@given(problems())
def test_every_cpu_method_is_the_loop(drawn):
    kw, what = drawn
    before = {k: v.copy() for k, v in kw.items() if isinstance(v, np.ndarray)}
    math = np.float64 if kw["q"].dtype == np.float64 else np.float32
    emu = reference.gated_attention_ref(**kw, output_final_state=True, dtype=math)
    ref = reference.gated_attention_ref(**kw, output_final_state=True)
    for m in METHODS:
        o, s = cupy_gda.gated_attention(**kw, output_final_state=True, method=m)
        assert o.dtype == kw["v"].dtype and o.shape == kw["v"].shape, (what, m)
        o_emu = emu[0].astype(kw["v"].dtype)
        ulps = 16 if m == "chunk" else 0
        _check(f"{what} {m} o", o, o_emu, ref[0], ulps)
        _check(f"{what} {m} state", s, emu[1], ref[1], ulps)
    for k, v in before.items():          # (bytes: NaN == NaN, and bfloat16 too)
        assert kw[k].tobytes() == v.tobytes(), f"{what}: {k} was modified"


# invalid arguments: each a change to valid ones, the exception and a word of its message
INVALID = [
    (lambda a: dict(k=a["k"][..., :-1]), ValueError, "k must"),
    (lambda a: dict(v=a["v"].astype(np.int32)), TypeError, "v must have q's dtype"),
    (lambda a: dict(log_gate=a["gate"]), ValueError, "exactly one of gate"),
    (lambda a: dict(gate=None), ValueError, "exactly one of gate"),
    (lambda a: dict(scale="2"), TypeError, "scale must be a real number"),
    (lambda a: dict(initial_state=np.zeros((a["q"].shape[0] + 1, a["q"].shape[2],
                                            a["q"].shape[3], a["v"].shape[3]), np.float32)),
     ValueError, "initial_state"),
    (lambda a: dict(method="fast"), ValueError, "method must be one of"),
    (lambda a: dict(q=a["q"][0]), ValueError, "q must be 4-D"),
    (lambda a: dict(cu_seqlens=np.array([0, 5], np.float32)), TypeError, "cu_seqlens"),
]


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 40), st.integers(1, 3), st.integers(1, 9),
       st.integers(1, 9), st.sampled_from(range(len(INVALID))), st.sampled_from(METHODS))
def test_invalid_arguments_raise_before_any_work(B, T, H, K, V, which, method):
    rng = np.random.default_rng(B * 1000 + T)
    a = dict(q=rng.standard_normal((B, T, H, K)).astype(np.float32),
             k=rng.standard_normal((B, T, H, K)).astype(np.float32),
             v=rng.standard_normal((B, T, H, V)).astype(np.float32),
             gate=rng.uniform(0, 1, (B, T, H, K)).astype(np.float32),
             method=method)
    edit, exc, words = INVALID[which]
    kw = {**a, **edit(a)}
    before = {k: v.copy() for k, v in kw.items() if isinstance(v, np.ndarray)}
    with pytest.raises(exc, match=words):
        cupy_gda.gated_attention(**kw)
    for k, v in before.items():
        assert kw[k].tobytes() == v.tobytes(), k
