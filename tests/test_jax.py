"""Issue 15's JAX adapter (cupy_gda.jax): jax.grad of a loss through gated_attention, jitted and
eager, against jax.grad of the same loss through a lax.scan loop of the recurrence in float64, for
q, k, v, the gate (or log gate) and the initial state, with the final state in the loss; packed
sequences; the callback each platform lowers to. The CPU route (pure_callback) runs here, the GPU
route (buffer_callback) where CuPy and jax see a GPU."""
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import cupy_gda  # noqa: E402
import cupy_gda.jax as gda_jax  # noqa: E402
from cupy_gda import reference as R  # noqa: E402
from cupy_gda._verify import compare  # noqa: E402

PLATFORMS = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]
F32 = np.float32
NAMES = ("o", "final_state", "dq", "dk", "dv", "dgate", "dinitial_state")


def _x64():
    """float64 in jax inside a with-block only (jax.enable_x64 since 0.7; before it, in
    jax.experimental)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64
    return enable_x64()


def _device(platform):
    try:
        return jax.devices(platform)[0]
    except RuntimeError:
        pytest.skip(f"jax has no {platform} backend")


def _gate(regime, rng, shape):
    """exact 0s (log gate -inf), uniform, negative, above 1."""
    u = rng.uniform(0.3, 1, shape)
    if regime == "zeros":
        return np.where(rng.random(shape) < 0.3, 0.0, u)
    if regime == "neg":
        return rng.uniform(-1, 1, shape)
    if regime == "grow":
        return rng.uniform(1, 1.5, shape)
    return u


def _problem(regime, log, B=2, T=37, H=2, K=5, V=7, lens=None, dtype=np.float64, seed=0):
    """(q, k, v, g, h0), the loss weights (W of o, Wf of the final state) and cu_seqlens, every
    float rounded to ``dtype`` (so the float64 loop sees the inputs the adapter sees)."""
    rng = np.random.default_rng(seed)
    if lens is not None:
        B, T = 1, sum(lens)
    N = B if lens is None else len(lens)
    g = _gate(regime, rng, (B, T, H, K))
    if log:
        with np.errstate(divide="ignore"):
            g = np.log(g)
    args = (rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, K)),
            rng.standard_normal((B, T, H, V)), g, rng.standard_normal((N, H, K, V)))
    W, Wf = rng.standard_normal((B, T, H, V)), rng.standard_normal((N, H, K, V))
    cu = None if lens is None else np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    args, W, Wf = tuple(x.astype(dtype) for x in args), W.astype(dtype), Wf.astype(dtype)
    return args, W, Wf, cu


def _scan(q, k, v, g, h0, scale):
    """One batch of sequences, step by step."""
    def step(S, x):
        qt, kt, vt, gt = x
        S = gt[..., None] * S + kt[..., None] * vt[..., None, :]
        return S, scale * jnp.einsum("bhkv,bhk->bhv", S, qt)
    S, o = lax.scan(step, h0, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g)))
    return jnp.moveaxis(o, 0, 1), S


def _loop(q, k, v, g, h0, *, log, scale, cu=None):
    """The recurrence as a lax.scan loop, each packed sequence on its own; (o, final state)."""
    if log:
        g = jnp.exp(g)
    if h0 is None:
        h0 = jnp.zeros((q.shape[0] if cu is None else len(cu) - 1, q.shape[2], q.shape[3],
                        v.shape[3]), q.dtype)
    if cu is None:
        return _scan(q, k, v, g, h0, scale)
    runs = [_scan(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], h0[n:n + 1], scale)
            for n, (a, b) in enumerate(zip(cu[:-1], cu[1:]))]
    return jnp.concatenate([o for o, _ in runs], 1), jnp.concatenate([s for _, s in runs], 0)


def _adapter(q, k, v, g, h0, *, log, scale, cu=None):
    gk = dict(log_gate=g) if log else dict(gate=g)
    return gda_jax.gated_attention(q, k, v, **gk, scale=scale, initial_state=h0,
                                   output_final_state=True, cu_seqlens=cu)


def _values_and_grads(attn, args, W, Wf, device, jit=True, **kw):
    """(o, final state) and jax.grad of sum(o W) + sum(S_T Wf) in (q, k, v, g, h0), as NumPy."""
    def loss(*a):
        o, s = attn(*a, **kw)
        return (o * W).sum() + (s * Wf).sum()
    def fwd(*a):
        return attn(*a, **kw)
    grad = jax.grad(loss, argnums=range(5))
    if jit:
        fwd, grad = jax.jit(fwd), jax.jit(grad)
    args = jax.device_put(args, device)
    return [np.asarray(x) for x in (*fwd(*args), *grad(*args))]


def _assert_same(got, ref):
    """float64 adapter against the float64 loop: the same values to rounding, finite alike."""
    for name, a, b in zip(NAMES, got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert (np.isfinite(a) == np.isfinite(b)).all(), name
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12 * np.abs(b).max(), err_msg=name)


CASES = [pytest.param(r, log, id=f"{r}-{'log_gate' if log else 'gate'}")
         for r in ("unif", "zeros", "neg", "grow") for log in (False, True)
         if not (log and r == "neg")]           # (a log gate is a positive gate's log)


@pytest.mark.parametrize("regime, log", CASES)
def test_grad_of_jitted_loss_is_the_scan_loops(regime, log):
    """float64, jitted: values and every gradient equal the loop's; gates of exactly 0 (log
    gates of -inf) give finite gradients, the loop's."""
    cpu = _device("cpu")
    with _x64():
        args, W, Wf, _ = _problem(regime, log)
        kw = dict(log=log, scale=0.7)
        got = _values_and_grads(_adapter, args, W, Wf, cpu, **kw)
        ref = _values_and_grads(_loop, args, W, Wf, cpu, **kw)
    _assert_same(got, ref)
    if regime == "zeros":
        assert (args[3] == (-np.inf if log else 0)).any()
        assert all(np.isfinite(x).all() for x in got)


def test_eager_grad_without_initial_or_final_state():
    """Not jitted, o alone in the loss, no initial state: the gradients of q, k, v, the gate."""
    cpu = _device("cpu")
    with _x64():
        (q, k, v, g, _), W, _, _ = _problem("zeros", False, seed=1)
        args = jax.device_put((q, k, v, g), cpu)
        got = jax.grad(lambda *a: (gda_jax.gated_attention(*a) * W).sum(), argnums=range(4))(*args)
        ref = jax.grad(lambda *a: (_loop(*a, None, log=False, scale=1.0)[0] * W).sum(),
                       argnums=range(4))(*args)
        o = gda_jax.gated_attention(*args)
        o_ref = _loop(*args, None, log=False, scale=1.0)[0]
    assert isinstance(o, jax.Array) and o.dtype == jnp.float64
    _assert_same([np.asarray(x) for x in (o, *got)], [np.asarray(x) for x in (o_ref, *ref)])


def test_packed_sequences():
    """cu_seqlens (an empty sequence among them) as a jit argument: each sequence's values and
    gradients are its own loop's; cu_seqlens' own gradient is a float0 zero."""
    cpu = _device("cpu")
    with _x64():
        args, W, Wf, cu = _problem("neg", False, lens=(13, 0, 1, 30))
        got = _values_and_grads(_adapter, args, W, Wf, cpu, log=False, scale=1.0, cu=cu)
        ref = _values_and_grads(_loop, args, W, Wf, cpu, log=False, scale=1.0, cu=cu)

        def loss(q, cu):
            o, s = _adapter(q, *args[1:], log=False, scale=1.0, cu=cu)
            return (o * W).sum() + (s * Wf).sum()
        dq, dcu = jax.jit(jax.grad(loss, argnums=(0, 1), allow_int=True))(
            *jax.device_put((args[0], cu), cpu))          # (float64: the CPU path only)
    _assert_same(got, ref)
    np.testing.assert_array_equal(np.asarray(dq), got[2])
    assert dcu.dtype == jax.dtypes.float0 and dcu.shape == cu.shape


def _contract(name, got, ref, emu):
    r = compare(name, np.asarray(got, np.float64), ref, np.asarray(emu, np.float64))
    assert r.ok, f"{name}: err {r.err:.3e} > bound {r.bound:.3e}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("regime, log, lens", [
    pytest.param("unif", False, None, id="unif"),
    pytest.param("zeros", True, None, id="zeros-log_gate"),
    pytest.param("grow", False, None, id="grow"),
    pytest.param("neg", False, (13, 0, 1, 30), id="neg-varlen"),
])
def test_float32_meets_the_contract(platform, regime, log, lens):
    """float32 through the adapter (jitted) against the float64 loop: every value's and
    gradient's RMS error within twice the float32 loop's (the NumPy reference in float32 on the
    same inputs) + 1e-6 max|ref|, the accuracy contract of the forward and backward alike."""
    device = _device(platform)
    with _x64():
        args, W, Wf, cu = _problem(regime, log, T=70, lens=lens, dtype=np.float32, seed=2)
        got = _values_and_grads(_adapter, args, W, Wf, device, log=log, scale=0.5, cu=cu)
        wide = tuple(x.astype(np.float64) for x in (*args, W, Wf))
        ref = _values_and_grads(_loop, wide[:5], *wide[5:], _device("cpu"), log=log, scale=0.5,
                                cu=cu)
    q, k, v, g, h0 = args
    gk = dict(log_gate=g) if log else dict(gate=g)
    kw = dict(**gk, scale=0.5, initial_state=h0, cu_seqlens=cu, dtype=np.float32)
    emu = [*R.gated_attention_ref(q, k, v, **kw, output_final_state=True),
           *R.gated_attention_backward_ref(q, k, v, **kw, do=W, d_final_state=Wf)]
    for name, a, b, e in zip(NAMES, got, ref, emu):
        assert a.dtype == np.float32, name
        _contract(name, a, b, e)


def test_vmap_runs_each_element():
    cpu = _device("cpu")
    (q, k, v, g, _), _, _, _ = _problem("unif", False, dtype=np.float32)
    qs = jax.device_put(np.stack([q, 2 * q]), cpu)
    got = jax.jit(jax.vmap(lambda x: gda_jax.gated_attention(x, k, v, g)))(qs)
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(got[i]), cupy_gda.gated_attention(
            np.asarray(qs[i]), k, v, g))


def _custom_calls(platform):
    """(The custom calls, the text) of a jitted forward and backward lowered for ``platform``
    (lowering needs no device of it)."""
    (q, k, v, g, h0), _, _, _ = _problem("unif", False, dtype=np.float32)
    try:                # arrays on a device of the platform where there is one (a GPU host
        q, g, h0 = jax.device_put((q, g, h0), jax.devices(platform)[0])   # lowers for its own)
    except RuntimeError:
        pass

    def loss(q, g, h0):
        o, s = gda_jax.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)
        return o.sum() + s.sum()
    low = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(q, g, h0).lower(
        lowering_platforms=(platform,)).as_text()
    return re.findall(r"custom_call @(\w+)", low), low


def test_each_platform_lowers_to_its_callback():
    """GPU: two buffer callbacks (forward, backward) on XLA's buffers and stream, and no callback
    that copies through the host, each with a scratch output (bytes) for the core's workspaces;
    CPU: two pure callbacks into the NumPy path."""
    calls, text = _custom_calls("cuda")
    assert calls == ["xla_buffer_python_gpu_callback"] * 2
    scratch = [int(n) for n in re.findall(r"tensor<(\d+)xui8>", text)]
    assert len(scratch) == 2, text
    try:
        jax.devices("gpu")
    except RuntimeError:    # sized for a GPU only where jax has one
        assert scratch == [0, 0]
    assert _custom_calls("cpu")[0] == ["xla_ffi_python_cpu_callback"] * 2


# a change to valid arguments, the exception and words of its message
BAD = [
    pytest.param(dict(gate=None), ValueError, "give exactly one of gate", id="no-gate"),
    pytest.param(dict(log_gate=np.zeros((2, 37, 2, 5), F32)), ValueError,
                 "give exactly one of gate", id="both-gates"),
    pytest.param(dict(k=np.zeros((2, 37, 2, 4), F32)), ValueError,
                 r"k must have shape \[B, T, H, K\]", id="k-K4"),
    pytest.param(dict(initial_state=np.zeros((3, 2, 5, 7), F32)), ValueError,
                 "initial_state must have shape", id="initial_state-N3"),
    pytest.param(dict(cu_seqlens=np.array([0, 37])), ValueError, "B must be 1", id="cu-B2"),
    pytest.param(dict(scale=np.ones(1)), TypeError, "scale must be a real number",
                 id="scale-array"),
    pytest.param(dict(method="fast"), ValueError, "method must be one of", id="method-fast"),
]


@pytest.mark.parametrize("edit, exc, words", BAD)
def test_bad_arguments_raise_before_any_callback(edit, exc, words):
    """Shapes, dtypes, scale and method are checked when the call is traced."""
    (q, k, v, g, _), _, _, _ = _problem("unif", False, dtype=np.float32)
    kw = {**dict(k=k, v=v, gate=g), **edit}
    with pytest.raises(exc, match="^cupy_gda.jax.gated_attention: .*" + words):
        jax.jit(lambda q: gda_jax.gated_attention(q, **kw)).trace(q)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gpu_half_precision_is_the_cores(dtype):
    """bfloat16 / float16 inputs (a float32 log gate; V = 200: several value tiles, workspaces):
    the adapter's values and gradients are those of the core called on CuPy arrays."""
    import cupy
    gpu = _device("gpu")
    dt = jnp.dtype(dtype)
    args, W, Wf, _ = _problem("zeros", True, B=2, T=300, H=2, K=64, V=200, dtype=np.float32,
                              seed=3)
    args = (*(x.astype(dt) for x in args[:3]), *args[3:])
    W = W.astype(dt)
    got = _values_and_grads(_adapter, args, W, Wf, gpu, log=True, scale=0.125)
    q, k, v, g, h0 = (cupy.asarray(x) for x in args)
    kw = dict(log_gate=g, scale=0.125, initial_state=h0)
    want = [*cupy_gda.gated_attention(q, k, v, **kw, output_final_state=True),
            *cupy_gda.gated_attention_backward(q, k, v, **kw, do=cupy.asarray(W),
                                               d_final_state=cupy.asarray(Wf))]
    for name, a, b in zip(NAMES, got, want):
        b = cupy.asnumpy(b)
        assert a.dtype == b.dtype, name
        # (the same kernels on the same inputs: at most a rounding of the output dtype apart)
        eps = float(jnp.finfo(b.dtype).eps)
        a, b = a.astype(np.float64), b.astype(np.float64)
        np.testing.assert_allclose(a, b, rtol=2 * eps, atol=2 * eps * np.abs(b).max(),
                                   err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("planes", [False, True], ids=["segments", "planes"])
def test_gpu_workspaces_come_from_xla(planes):
    """A jitted training step whose forward and backward allocate workspaces (the chunked
    forward in sequence segments, or from the backward's planes with its fall-back's segments;
    the chunked backward) takes nothing from CuPy's pool: every allocation of the core inside
    the callbacks is cut from their scratch outputs; the values and gradients are the core's on
    CuPy arrays."""
    import cupy
    gpu = _device("gpu")
    B, H, K, V = (4, 4, 192, 192) if planes else (1, 2, 64, 64)
    args, W, Wf, _ = _problem("unif", False, B=B, T=2048, H=H, K=K, V=V, dtype=np.float32,
                              seed=4)
    if planes:              # bfloat16 q, k, v and o's weights (the gate, the states float32)
        args = (*(x.astype(jnp.bfloat16) for x in args[:3]), *args[3:])
        W = W.astype(jnp.bfloat16)
    q, k, v, g, h0, Wd, Wfd = jax.device_put((*args, W, Wf), gpu)

    def loss(q, k, v, g, h0):
        o, s = gda_jax.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)
        return (o * Wd).sum() + (s * Wfd).sum(), (o, s)
    step = jax.jit(jax.value_and_grad(loss, argnums=range(5), has_aux=True))
    jax.block_until_ready(step(q, k, v, g, h0))         # traced, the kernels built, run once
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()
    (_, (o, s)), grads = jax.block_until_ready(step(q, k, v, g, h0))
    assert pool.total_bytes() == 0
    from cupy_gda import _launch, chunk_bwd
    assert any(key[0] is chunk_bwd.ForwardPlan and key[2][:5] == (B, 2048, H, K, V)
               for key in _launch._PLANS) == planes
    q, k, v, g, h0 = (cupy.asarray(x) for x in args)
    want = [*cupy_gda.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True),
            *cupy_gda.gated_attention_backward(q, k, v, g, do=cupy.asarray(W), initial_state=h0,
                                               d_final_state=cupy.asarray(Wf))]
    for name, a, b in zip(NAMES, (o, s, *grads), want):     # (the same kernels and inputs)
        b = cupy.asnumpy(b)
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6, atol=1e-6 * np.abs(b).max(),
                                   err_msg=name)


@pytest.mark.gpu
def test_gpu_scratch_allocator_falls_back_to_the_pool():
    """_Scratch: allocations ALLOC-aligned inside the buffer while they fit, then CuPy's pool."""
    import cupy
    buf = cupy.empty(1000, np.uint8)
    base = buf.data.ptr
    with cupy.cuda.using_allocator(gda_jax._Scratch(cupy, buf, buf.device.id)):
        a = cupy.empty(100, np.float32)
        b = cupy.empty(200, np.float32)
    assert a.data.ptr % 256 == 0 and base <= a.data.ptr and a.data.ptr + 400 <= base + 1000
    assert not base <= b.data.ptr < base + 1000


def test_core_takes_cpu_bfloat16_arrays():
    """cupy_gda.gated_attention (the core, not the adapter) on CPU bfloat16 JAX arrays, which
    NumPy's DLPack import refuses: in through __array__, back as bfloat16 JAX arrays, the NumPy
    path's results."""
    import ml_dtypes
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal((1, 7, 2, 4)), rng.standard_normal((1, 7, 2, 4)),
          rng.standard_normal((1, 7, 2, 3)), rng.uniform(0.5, 1, (1, 7, 2, 4))]
    bf = [x.astype(ml_dtypes.bfloat16) for x in xs]
    o = cupy_gda.gated_attention(*(jax.device_put(jnp.asarray(x), jax.devices("cpu")[0])
                                   for x in bf))
    assert isinstance(o, jax.Array) and o.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(o).astype(np.float32),
                          cupy_gda.gated_attention(*bf).astype(np.float32))


_SHARDED = """
import sys
import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
import cupy_gda.jax as gda_jax
from cupy_gda import reference as R
from cupy_gda._verify import compare

shard_map = getattr(jax, "shard_map", None)
if shard_map is None:
    from jax.experimental.shard_map import shard_map
log = sys.argv[1] == "log"
packed = sys.argv[1] in ("packed", "past-packed")
past = sys.argv[1].startswith("past")
mesh = Mesh(np.array(jax.devices()), ("seq",))
rng = np.random.default_rng(3)
B, T, H, K, V = (1 if packed else 2), (256 if past else 24), 2, 5, 3
cu = np.array([0, 5, 5, 14, 24], np.int32) if packed else None     # boundaries in and on slices
if past:                # the second sequence from 10: gates of 8 over 54 steps of slice 0 (2^162)
    cu = np.array([0, 10, T], np.int32) if packed else None
N = len(cu) - 1 if packed else B
q = (rng.standard_normal((B, T, H, K)) / 2).astype(np.float32)
k = rng.standard_normal((B, T, H, K)).astype(np.float32)
v = rng.standard_normal((B, T, H, V)).astype(np.float32)
g = np.where(rng.random((B, T, H, K)) < 0.3, 0, rng.uniform(0.5, 1, (B, T, H, K))).astype(np.float32)
with np.errstate(divide="ignore"):
    gin = np.log(g) if log else g
h0 = rng.standard_normal((N, H, K, V)).astype(np.float32)
W = rng.standard_normal((B, T, H, V)).astype(np.float32)
Wf = rng.standard_normal((N, H, K, V)).astype(np.float32)
if past:    # as tests/test_distributed.py's _past_float_range: slice 0's gate product 8^64 = 2^192
    g[:, :64], g[:, 64:] = 8, 0.9
    tiny = np.float32(1e-30)
    k[:, :64] *= tiny
    h0, W, Wf = h0 * tiny, W * tiny, Wf * tiny

def body(q, k, v, g, h0, *cu):
    gate, log_gate = (None, g) if log else (g, None)
    return gda_jax.gated_attention(q, k, v, gate, log_gate=log_gate, scale=0.5, initial_state=h0,
                                   output_final_state=True, axis_name="seq",
                                   cu_seqlens=cu[0] if cu else None)

f = shard_map(body, mesh=mesh, in_specs=(P(None, "seq"),) * 4 + (P(),) * (2 if packed else 1),
              out_specs=(P(None, "seq"), P()), check_vma=False)

@jax.jit
def loss(q, k, v, g, h0):
    o, S = f(q, k, v, g, h0, *([cu] if packed else []))
    return (o * W).sum() + (S * Wf).sum(), (o, S)

(_, (o, S)), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)(q, k, v, gin, h0)
x64 = [a.astype(np.float64) for a in (q, k, v, gin)]
gk = dict(log_gate=x64[3]) if log else dict(gate=x64[3])
gk32 = dict(log_gate=gin) if log else dict(gate=gin)
with np.errstate(all="ignore"):
    ref = R.gated_attention_ref(*x64[:3], **gk, scale=0.5, initial_state=h0.astype(np.float64),
                                output_final_state=True, cu_seqlens=cu)
    emu = R.gated_attention_ref(q, k, v, **gk32, scale=0.5, initial_state=h0,
                                output_final_state=True, dtype=np.float32, cu_seqlens=cu)
    gref = R.gated_attention_backward_ref(*x64[:3], **gk, do=W.astype(np.float64), scale=0.5,
                                          initial_state=h0.astype(np.float64),
                                          d_final_state=Wf.astype(np.float64), cu_seqlens=cu)
    gemu = R.gated_attention_backward_ref(q, k, v, **gk32, do=W, scale=0.5, initial_state=h0,
                                          d_final_state=Wf, dtype=np.float32, cu_seqlens=cu)
checks = [("o", o, ref[0], emu[0]), ("final_state", S, ref[1], emu[1])]
checks += [(n, gr, r, e) for n, gr, r, e in zip(gref._fields, grads, gref, gemu)]
assert all(np.isfinite(e).all() for _, _, _, e in checks)
if past:
    assert np.abs(emu[1]).max() > 1e10 or np.abs(gemu.dk).max() > 1e10    # (far from 1)
for name, got, r, e in checks:
    c = compare(name, np.asarray(got), r, e)
    assert c.ok, f"{name}: err {c.err:.3e} > bound {c.bound:.3e}"
print("ok", len(jax.devices()), jax.devices()[0].platform)
"""


@pytest.mark.parametrize("reverse", [False, True])
def test_scaled_running_products_both_routes(reverse):
    """The gates' running products as m 2^e (the axis_name= front end's): the CPU's route (a
    lax.scan) and the GPU's (lax.associative_scan), both run here, equal the float64 products
    past float range (gates up to 8 over 70 steps: 2^210), zeros and an empty T included."""
    rng = np.random.default_rng(4)
    a = rng.uniform(0.5, 8, (2, 70, 3, 4)).astype(np.float32)
    a[0, 30, 1] = 0
    ref = np.cumprod(np.asarray(a, np.float64)[:, ::-1] if reverse else a.astype(np.float64),
                     axis=1)
    ref = ref[:, ::-1] if reverse else ref
    for route in (gda_jax._in_turn, gda_jax._by_tree):
        m, e = route(*jnp.frexp(jnp.asarray(a)), reverse)
        got = np.ldexp(np.asarray(m, np.float64), np.asarray(e))
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=0)
    assert gda_jax._scaled_cumprod(jnp.zeros((2, 0, 3, 4)), reverse)[0].shape == (2, 0, 3, 4)


@pytest.mark.parametrize("gate", ["gate_zeros", "log", "packed", "past", "past-packed"])
def test_across_devices_in_shard_map(tmp_path, gate):
    """gated_attention(axis_name=) inside shard_map over 4 CPU devices (a subprocess: the device
    count is fixed when jax starts): o, the final state and jax.grad of a loss using both, for
    q, k, v, the gate (exact zeros, or log gates of -inf) and the initial state, against the
    whole sequence's loops within the contract; packed sequences with boundaries inside and on
    the slices' edges and an empty one; gates of 8 whose product over a slice passes float
    range (2^192) where the loop stays finite ("past": the products kept as m 2^e, the
    correction's anchored at S_in's rows), dense and packed."""
    import os
    import subprocess
    import sys
    (tmp_path / "sharded.py").write_text(_SHARDED)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, str(tmp_path / "sharded.py"), gate], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok 4 cpu" in r.stdout, r.stdout + r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["gate_zeros", "past", "past-packed"])
def test_gpu_across_one_device_in_shard_map(tmp_path, gate):
    """The same on a mesh of one GPU (the axis of size 1: the kernels through buffer_callback,
    and the GPU's route of the gates' running products, lax.associative_scan, where the CPU's is
    a lax.scan): o, the final state and every gradient within the contract."""
    import os
    import subprocess
    import sys
    _device("gpu")
    (tmp_path / "sharded.py").write_text(_SHARDED)
    env = {k: x for k, x in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    r = subprocess.run([sys.executable, str(tmp_path / "sharded.py"), gate], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok 1 gpu" in r.stdout, r.stdout + r.stderr
