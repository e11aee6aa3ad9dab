"""Property-based tests (hypothesis) of the public forward and backward, on NumPy and on the GPU:
drawn shapes (sizes 0 and 1, odd K and V; on the GPU also the key and value tiles' sizes, long
sequences in segments, many heads), dtypes, gate regimes (0, negative, tiny, 1, above 1, 2 and 4
with resets, log gates with -inf), a NaN or inf at a drawn place, strided views and cu_seqlens
layouts (empty segments); every method against the loop, the gradients against the reverse
loop. And drawn invalid arguments raise before any work, leaving the caller's arrays as they
were. The draws are derandomized, so CI runs the same examples."""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings, strategies as st  # noqa: E402

import cupy_gda  # noqa: E402
from cupy_gda import _checks, _dispatch, _verify, reference  # noqa: E402

METHODS = ("auto", "chunk", "recurrent")
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None)
DTYPES = ("float32", "float64", "float16", "bfloat16")
REGIMES = ("unif", "zeros", "ones", "neg", "tiny", "grow", "big")

# The GPU test compiles a kernel for each new (K, V, dtype, gate dtype, log gate, family, tiles):
# a few seconds each, so K and V come in a few pairs that reach the tile paths, each in two of
# the dtypes, GPU_EXAMPLES draws each: K in one key tile (rounded up to 16 or not) and in two,
# value tiles of 8 and 16 columns, and with 64 heads 24, 32 and 64, K = 256 with V = 512
# (GLA-1.3B's heads). No shrinking: a shrink step can compile kernels too; a failing draw is
# reported as drawn.
GPU_KV = ((1, 1, ("float32", "float16")), (5, 3, ("float16", "bfloat16")),
          (9, 7, ("bfloat16", "float32")), (24, 24, ("float32", "float16")),
          (64, 64, ("float32", "bfloat16")), (128, 200, ("bfloat16", "float32")),
          (200, 24, ("float16", "float32")), (256, 512, ("float32", "bfloat16")))
GPU_EXAMPLES = 9
GPU_SETTINGS = settings(max_examples=GPU_EXAMPLES, deadline=None, derandomize=True, database=None,
                        phases=(Phase.explicit, Phase.generate),
                        suppress_health_check=(HealthCheck.too_slow,))
SMALL_KV = 64 * 64          # K V at most this: room for long sequences or many heads
# a draw's size: ranges of B, H, T and of a varlen segment's length. "long" (sequence segments;
# "auto" takes the chunked kernel at K >= 33 from T = 512) and "wide" (64 heads: wider value
# tiles; "auto" takes the chunked kernel at K >= 33 from T = 128) on the GPU where K V is small
SIZES = {"short": ((0, 3), (0, 3), (0, 70), (0, 40)),
         "long": ((1, 3), (1, 3), (512, 640), (0, 640)),
         "wide": ((1, 2), (64, 64), (0, 160), (0, 40))}


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
    if regime == "big":                 # products beyond float32's range in a chunk; resets
        return np.where(rng.random(shape) < 0.3, 0.0, rng.choice([2.0, 4.0], shape))
    return rng.uniform(1, 1.2, shape)                      # "grow": above 1


@st.composite
def problems(draw, gpu=None):
    """Keyword arguments of gated_attention on NumPy, and a description of the draw. With
    ``gpu`` = (K, V, dtypes), an entry of GPU_KV: B and H of at least 1 (size 0 compiles a
    kernel and tests little: test_edges has it), and where K V is small, also the long and wide
    SIZES."""
    varlen = draw(st.booleans())
    if gpu:
        K, V, dtypes = gpu
        size = draw(st.sampled_from(tuple(SIZES) if K * V <= SMALL_KV else ("short",)))
    else:
        K, V, dtypes, size = draw(st.integers(1, 9)), draw(st.integers(1, 9)), DTYPES, "short"
    (B0, B1), (H0, H1), (T0, T1), (L0, L1) = SIZES[size]
    least = 1 if gpu else 0
    H = draw(st.integers(max(H0, least), H1))
    if varlen:
        lens = draw(st.lists(st.integers(L0, L1), min_size=1, max_size=3 if size == "long" else 4))
        B, T = 1, sum(lens)
    else:
        lens = None
        B, T = draw(st.integers(max(B0, least), B1)), draw(st.integers(T0, T1))
    dtype = draw(st.sampled_from(dtypes))
    regime = draw(st.sampled_from(REGIMES))
    log = draw(st.booleans()) and regime not in ("neg",)    # a log gate is a positive gate's log
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    dt = _verify._dtype(dtype)
    stride = draw(st.sampled_from((1, 2)))                  # strided views of bigger arrays

    def arr(d, scale=1.0):
        x = (rng.standard_normal((B, T * stride, H, d)) * scale).astype(dt)
        return x[:, ::stride]                               # (astype first: it would copy)

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
    if varlen:      # int32 on the GPU: int64 is another compile of each kernel (test_api has it)
        cu = np.concatenate([[0], np.cumsum(lens)])
        kw["cu_seqlens"] = cu.astype(np.int32 if gpu else np.int64)
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


def _check_results(what, o, s, v, emu, ref, ulps):
    """A method's o (v's dtype and shape) and final state against the loops' (emu: in the same
    math precision; ref: float64), by _check with ``ulps``."""
    assert o.dtype == v.dtype and o.shape == v.shape, what
    with np.errstate(over="ignore"):                # (float16 o beyond its range: inf)
        o_emu = emu[0].astype(v.dtype)
    _check(f"{what} o", o, o_emu, ref[0], ulps)
    _check(f"{what} state", s, emu[1], ref[1], ulps)


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
        _check_results(f"{what} {m}", o, s, kw["v"], emu, ref, 16 if m == "chunk" else 0)
    for k, v in before.items():          # (bytes: NaN == NaN, and bfloat16 too)
        assert kw[k].tobytes() == v.tobytes(), f"{what}: {k} was modified"


def _on_gpu(x):
    """A NumPy argument on the GPU; a strided view ``base[::s0, ::s1, ...]`` stays one, of the
    base's copy (so the call sees the caller's strides, and the test can check the whole base)."""
    import cupy
    if not isinstance(x, np.ndarray):
        return x
    if x.base is None or x.flags.c_contiguous:
        return cupy.asarray(x)
    steps = tuple(slice(None, None, a // b) for a, b in zip(x.strides, x.base.strides))
    y = cupy.asarray(x.base)[steps]
    assert y.shape == x.shape and y.strides == x.strides, (x.shape, x.strides, x.base.shape)
    return y


def _family(kw, method):
    """The kernel family that runs ``method`` on the GPU for these CuPy arguments."""
    p = _checks.check_forward("t", kw["q"], kw["k"], kw["v"], kw.get("gate"), kw.get("log_gate"),
                              kw.get("initial_state"), kw.get("cu_seqlens"), cpu=False)
    return _dispatch.pick("t", method, p, gpu=True)


@pytest.mark.gpu
@pytest.mark.parametrize("gpu", GPU_KV, ids=[f"K{K}-V{V}" for K, V, _ in GPU_KV])
@GPU_SETTINGS
@given(data=st.data())
def test_every_gpu_method_is_the_loop(gpu, data):
    """As the CPU test, on CuPy arrays (internal outputs NaN-filled by conftest): every GPU
    method against the loop, the chunked kernel with the CPU chunked form's allowance, and the
    caller's arrays (strided views: their whole bigger arrays) byte for byte as they were."""
    import cupy
    kw, what = data.draw(problems(gpu), label="problem")
    dev = {k: _on_gpu(x) for k, x in kw.items()}
    whole = {k: x if x.base is None else x.base for k, x in dev.items() if isinstance(x, cupy.ndarray)}
    before = {k: cupy.asnumpy(x) for k, x in whole.items()}
    emu = reference.gated_attention_ref(**kw, output_final_state=True, dtype=np.float32)
    ref = reference.gated_attention_ref(**kw, output_final_state=True)
    for m in METHODS:
        o, s = cupy_gda.gated_attention(**dev, output_final_state=True, method=m)
        assert isinstance(o, cupy.ndarray) and isinstance(s, cupy.ndarray), (what, m)
        assert s.dtype == np.float32, (what, m)
        _check_results(f"{what} {m}", cupy.asnumpy(o), cupy.asnumpy(s), kw["v"], emu, ref,
                       16 if _family(dev, m) == "chunk" else 0)
    for k, x in before.items():
        assert cupy.asnumpy(whole[k]).tobytes() == x.tobytes(), f"{what}: {k} was modified"


def _with_gradients(kw, draw):
    """The problem's arguments with a drawn do (v's dtype) and, sometimes, d_final_state."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 31 - 1)))
    kw = dict(kw, do=rng.standard_normal(kw["v"].shape).astype(kw["v"].dtype))
    if draw(st.booleans()):
        N = kw["cu_seqlens"].shape[0] - 1 if "cu_seqlens" in kw else kw["q"].shape[0]
        H, K, V = kw["q"].shape[2], kw["q"].shape[3], kw["v"].shape[3]
        kw["d_final_state"] = rng.standard_normal((N, H, K, V)).astype(np.float32)
    return kw


def _check_gradients(what, got, kw, emu, ref):
    """Each gradient (in its argument's dtype; dinitial_state float32, or float64 for float64
    inputs) against the reverse loop's (emu in the same math precision, rounded to that dtype;
    ref float64) by _check; dinitial_state None exactly where initial_state is."""
    dtypes = _verify.gradient_dtypes(kw)
    for name, x, e, r, dt in zip(reference.Gradients._fields, got, emu, ref, dtypes):
        if r is None:
            assert x is None, f"{what} {name}"
            continue
        assert x.dtype == dt, f"{what} {name}: dtype {x.dtype}, not {dt}"
        with np.errstate(over="ignore"):        # (float16 beyond its range: inf)
            _check(f"{what} {name}", x, e.astype(dt), r)


@SETTINGS
@given(st.data())
def test_cpu_gradients_are_the_reverse_loop(data):
    """gated_attention_backward on NumPy by each method against the reverse loop, and the
    caller's arrays as they were."""
    kw, what = data.draw(problems(), label="problem")
    kw = _with_gradients(kw, data.draw)
    method = data.draw(st.sampled_from(["auto", "recurrent", "chunk"]), label="method")
    before = {k: v.copy() for k, v in kw.items() if isinstance(v, np.ndarray)}
    math = np.float64 if kw["q"].dtype == np.float64 else np.float32
    emu = reference.gated_attention_backward_ref(**kw, dtype=math)
    ref = reference.gated_attention_backward_ref(**kw)
    got = cupy_gda.gated_attention_backward(**kw, method=method)
    _check_gradients(f"{what} {method}", got, kw, emu, ref)
    for k, v in before.items():
        assert kw[k].tobytes() == v.tobytes(), f"{what}: {k} was modified"


# the backward kernel's draws: one K in a thread row group of 32 rows, K = V = 24, K in two row
# groups of 64 with V over several value tiles, K = 256 with V = 512
GPU_BWD_KV = tuple(x for x in GPU_KV if x[:2] in ((5, 3), (24, 24), (128, 200), (256, 512)))


@pytest.mark.gpu
@pytest.mark.parametrize("gpu", GPU_BWD_KV, ids=[f"K{K}-V{V}" for K, V, _ in GPU_BWD_KV])
@GPU_SETTINGS
@given(data=st.data())
def test_gpu_gradients_are_the_reverse_loop(gpu, data):
    """As the CPU test, on CuPy arrays (internal outputs NaN-filled): gda_recurrent_bwd against
    the reverse loop, the caller's arrays (strided views: their whole bigger arrays) as they
    were."""
    import cupy
    kw, what = data.draw(problems(gpu), label="problem")
    kw = _with_gradients(kw, data.draw)
    dev = {k: _on_gpu(x) for k, x in kw.items()}
    whole = {k: x if x.base is None else x.base for k, x in dev.items() if isinstance(x, cupy.ndarray)}
    before = {k: cupy.asnumpy(x) for k, x in whole.items()}
    emu = reference.gated_attention_backward_ref(**kw, dtype=np.float32)
    ref = reference.gated_attention_backward_ref(**kw)
    got = cupy_gda.gated_attention_backward(**dev)
    assert all(x is None or isinstance(x, cupy.ndarray) for x in got), what
    _check_gradients(what, [None if x is None else cupy.asnumpy(x) for x in got], kw, emu, ref)
    for k, x in before.items():
        assert cupy.asnumpy(whole[k]).tobytes() == x.tobytes(), f"{what}: {k} was modified"


# invalid arguments: each a change to valid ones (``a``, arrays of the array module ``xp``), the
# exception and a word of its message
INVALID = [
    (lambda a, xp: dict(k=a["k"][..., :-1]), ValueError, "k must"),
    (lambda a, xp: dict(v=a["v"].astype(np.int32)), TypeError, "v must have q's dtype"),
    (lambda a, xp: dict(log_gate=a["gate"]), ValueError, "exactly one of gate"),
    (lambda a, xp: dict(gate=None), ValueError, "exactly one of gate"),
    (lambda a, xp: dict(scale="2"), TypeError, "scale must be a real number"),
    (lambda a, xp: dict(initial_state=xp.zeros((a["q"].shape[0] + 1, a["q"].shape[2],
                                                a["q"].shape[3], a["v"].shape[3]), np.float32)),
     ValueError, "initial_state"),
    (lambda a, xp: dict(method="fast"), ValueError, "method must be one of"),
    (lambda a, xp: dict(q=a["q"][0]), ValueError, "q must be 4-D"),
    (lambda a, xp: dict(cu_seqlens=xp.array([0, 5], np.float32)), TypeError, "cu_seqlens"),
]
INVALID_DRAWS = (st.integers(1, 3), st.integers(1, 40), st.integers(1, 3), st.integers(1, 9),
                 st.integers(1, 9), st.sampled_from(range(len(INVALID))), st.sampled_from(METHODS))


def _valid(B, T, H, K, V, method):
    rng = np.random.default_rng(B * 1000 + T)
    return dict(q=rng.standard_normal((B, T, H, K)).astype(np.float32),
                k=rng.standard_normal((B, T, H, K)).astype(np.float32),
                v=rng.standard_normal((B, T, H, V)).astype(np.float32),
                gate=rng.uniform(0, 1, (B, T, H, K)).astype(np.float32),
                method=method)


@SETTINGS
@given(*INVALID_DRAWS)
def test_invalid_arguments_raise_before_any_work(B, T, H, K, V, which, method):
    a = _valid(B, T, H, K, V, method)
    edit, exc, words = INVALID[which]
    kw = {**a, **edit(a, np)}
    before = {k: v.copy() for k, v in kw.items() if isinstance(v, np.ndarray)}
    with pytest.raises(exc, match=words):
        cupy_gda.gated_attention(**kw)
    for k, v in before.items():
        assert kw[k].tobytes() == v.tobytes(), k


@pytest.mark.gpu
@SETTINGS
@given(*INVALID_DRAWS)
def test_invalid_gpu_arguments_raise_before_any_work(B, T, H, K, V, which, method):
    """The same on CuPy arrays: the error comes before a kernel is compiled or launched (no
    new plan) and the caller's arrays are as they were."""
    import cupy
    from cupy_gda import _api, _launch
    a = {k: cupy.asarray(x) if isinstance(x, np.ndarray) else x
         for k, x in _valid(B, T, H, K, V, method).items()}
    edit, exc, words = INVALID[which]
    kw = {**a, **edit(a, cupy)}
    before = {k: cupy.asnumpy(x) for k, x in kw.items() if isinstance(x, cupy.ndarray)}
    plans, fast = set(_launch._PLANS), set(_api._FAST)
    with pytest.raises(exc, match=words):
        cupy_gda.gated_attention(**kw)
    assert set(_launch._PLANS) == plans and set(_api._FAST) == fast
    for k, x in before.items():
        assert cupy.asnumpy(kw[k]).tobytes() == x.tobytes(), k
