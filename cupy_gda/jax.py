"""JAX adapter (issue 15): :func:`gated_attention` as a ``jax.custom_vjp`` function, eager or
inside ``jax.jit``, with gradients for q, k, v, the gate given and initial_state. Imported only
explicitly (``import cupy_gda.jax``): the core never imports JAX. With ``axis_name=``, inside
``jax.shard_map``, one sequence is split along T over that mesh axis (issue 16).

Route, by the platform XLA compiles for (``lax.platform_dependent``: only that branch is lowered):

- GPU: ``jax.experimental.buffer_callback``. XLA hands the callback its device buffers and its
  stream; the buffers are viewed as CuPy arrays (no copy) and the kernels are queued on that
  stream, so there is no host round trip and no sync: the call is ordered with the XLA ops
  around it like any op on the stream.
- CPU: ``jax.pure_callback`` into the NumPy path (the loop over every sequence at once).

What a GPU call costs beyond its kernels: one Python callback per forward and per backward, run
by the host thread that queues XLA's work (the core's checks and launch; not measured yet: the
core's fast path, ~13 µs a call, is skipped by ``out=``). o is written in place (``out=``); the
final state and the backward's gradients are copied into XLA's buffers (their bytes read and
written once more). Workspaces come from XLA: each callback has one more output, a scratch
buffer of the bytes the core says that call allocates (``_api.gpu_scratch_bytes``: the
forward's segment states, the backward's kept or chunk states and partial sums, and the arrays
the core returns, the sources of those copies), sized when the call is traced (on a host whose
jax has a GPU, for CuPy's current device: that builds the kernels then), and every CuPy
allocation inside the callback is cut from it, 256-byte aligned. Should a call need more (a
GPU of other limits than the one traced for), the rest comes from CuPy's memory pool on XLA's
stream.

cu_seqlens' values are not checked on the GPU (that would cost a host sync): as with
``check_indices=False``, offsets out of order are clamped and nothing outside the arrays is read
or written. The CPU route checks them; a bad one raises inside the callback (a JaxRuntimeError).

Eager calls run through an internal ``jax.jit`` (compiled once per shape), so that the branch
is the arrays' device's. Under ``jax.vmap`` the callbacks run once per element.

Versions: jax >= 0.6.1 (buffer_callback with ExecutionContext.stream; the same API through 0.11).
tests/test_jax.py checks the CPU route and both lowerings without a GPU (jax 0.10.2), and the GPU
route in its gpu-marked tests.
"""
from functools import lru_cache, partial
from math import prod
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import cupy_gda
from cupy_gda import _api, _checks, _dispatch
from cupy_gda._interop import _external_stream
from cupy_gda._launch import ALLOC

try:
    from jax.experimental.buffer_callback import buffer_callback
except ImportError as e:                    # jax < 0.6.1
    raise ImportError(f"cupy_gda.jax needs jax >= 0.6.1 (jax.experimental.buffer_callback), "
                      f"got jax {jax.__version__}") from e

FN = "cupy_gda.jax.gated_attention"


class _Static(NamedTuple):
    """What a call's trace depends on besides the arrays (custom_vjp's nondiff argument)."""
    log_gate: bool
    scale: float
    final: bool
    method: str
    scratch: tuple = (0, 0)     # bytes of XLA's memory the GPU forward, backward allocate from


def gated_attention(q, k, v, gate=None, *, log_gate=None, scale=1.0, initial_state=None,
                    output_final_state=False, cu_seqlens=None, method="auto", axis_name=None):
    """:func:`cupy_gda.gated_attention` on JAX arrays, differentiable: ``jax.grad`` gives the
    gradients of q, k, v, the gate argument given (gate or log_gate) and initial_state, through
    :func:`cupy_gda.gated_attention_backward`; cu_seqlens (integers) gets a float0 zero.

    Args as in :func:`cupy_gda.gated_attention` (scale, output_final_state and method are static
    Python values). Shapes and dtypes are checked when traced (the GPU's narrower limits, K at
    most 256 and no float64, when it runs). Returns o [B, T, H, V], or (o, final_state).

    axis_name: inside ``jax.shard_map`` over that mesh axis, one sequence split along T across
    its devices (docs/distributed.md): q, k, v and the gate are this device's slice, in axis
    order; initial_state and the final state are the whole sequence's (replicated: out_specs
    P() for the final state, with check_vma=False, as JAX cannot see through the callbacks that
    it is). Each device runs its slice with the kernels in float32, the slices' gate products
    and final states are all-gathered, and the incoming state's part is added by an einsum at
    float32 precision (HIGHEST); JAX differentiates the fold and the correction, the kernels'
    backward the rest. cu_seqlens as in cupy_gda.distributed (global offsets).
    """
    if axis_name is not None:
        return _across(q, k, v, gate, log_gate, scale, initial_state, output_final_state,
                       cu_seqlens, method, axis_name)
    q, k, v, gate, log_gate, h0, cu = (None if x is None else jnp.asarray(x) for x in (
        q, k, v, gate, log_gate, initial_state, cu_seqlens))
    p = _checks.check_forward(FN, q, k, v, gate, log_gate, h0, cu, cpu=True)
    _dispatch.pick(FN, method, p, False)            # the method's name
    static = _Static(log_gate is not None, _checks.check_scale(FN, scale),
                     bool(output_final_state), method)
    g = gate if gate is not None else log_gate
    static = static._replace(scratch=_scratch(static, q, k, v, gate, log_gate, h0, cu))
    return _jitted(static, q, k, v, g, h0, cu)


class _Axis:
    """A shard_map axis as distributed._Slice's communicator: its size (static), this device's
    index (traced) and lax.all_gather."""

    def __init__(self, axis_name):
        self.axis_name = axis_name
        self.size = lax.psum(1, axis_name)            # (a Python int: the axis' size)
        self.rank = lax.axis_index(axis_name)

    def allgather(self, x):
        return lax.all_gather(x, self.axis_name)


def _pow2(n):
    """2^n, float32, exactly, for integers n in [-126, 127] (the bits of the power)."""
    return lax.bitcast_convert_type((jnp.clip(n, -126, 127) + 127) << 23, jnp.float32)


def _ldexp(x, n):
    """x 2^n (n int32, broadcast) as two exact powers of 2 (|n| up to 252 each within range):
    jnp.ldexp's derivative is NaN where x is 0 and 2^n past float range, and where it takes x
    as it is (0, inf) its derivative is 1, not 2^n."""
    n = jnp.clip(n, -252, 254)
    half = n // 2
    return x * _pow2(half) * _pow2(n - half)


def _times(x, y):
    """(m, e) pairs' product, renormalised: m in [0.5, 1) (0, inf, NaN as they are)."""
    m, d = jnp.frexp(x[0] * y[0])
    return m, x[1] + y[1] + d


def _in_turn(m, e, reverse):
    """_scaled_cumprod by lax.scan, a step at a time."""
    def step(c, x):
        c = _times(c, x)
        return c, c
    rest = m.shape[:1] + m.shape[2:]
    one = (jnp.ones(rest, m.dtype), jnp.zeros(rest, e.dtype))
    _, (m, e) = lax.scan(step, one, (jnp.moveaxis(m, 1, 0), jnp.moveaxis(e, 1, 0)),
                         reverse=reverse)
    return jnp.moveaxis(m, 0, 1), jnp.moveaxis(e, 0, 1)


def _by_tree(m, e, reverse):
    """_scaled_cumprod by lax.associative_scan (log-depth)."""
    return lax.associative_scan(_times, (m, e), reverse=reverse, axis=1)


def _scaled_cumprod(a, reverse=False):
    """The running products of a [B, T, ...] along T (``reverse``: from the end, inclusive) as
    (m, e), m 2^e, m in [0.5, 1) (0, inf, NaN as they are), e int32: any length keeps its range
    (mantissa products renormalised by frexp; differentiable in m). On the CPU a step at a time
    (lax.scan): XLA:CPU (jax 0.11.2) crashed compiling the derivative of an associative scan of
    64 steps (lax.cumprod's too); elsewhere lax.associative_scan."""
    m, e = jnp.frexp(a)
    return lax.platform_dependent(m, e, cpu=partial(_in_turn, reverse=reverse),
                                  default=partial(_by_tree, reverse=reverse))


def _across(q, k, v, gate, log_gate, scale, initial_state, output_final_state, cu_seqlens,
            method, axis_name):
    """gated_attention(axis_name=) inside shard_map, as cupy_gda.distributed's forward: the
    local pass (this adapter's op: from a zero state, or a sequence's initial state where it
    starts in the slice), the running gate products as m 2^e (_scaled_cumprod), an all-gather
    of the pieces' (gate product, final state), the fold in axis order (reset where a sequence
    starts), and o_t += scale (q_t . sigma G_t)^T (S_in / sigma) on the first piece's tokens,
    sigma = 2^E the size of S_in's row (as slices.Terms.anchor): sigma G_t is the size of the
    part of the loop's state that S_in carries, in range wherever that is, where G_t alone may
    pass 2^128 (gates above 1) or underflow. A row of zeros takes sigma = 2^-max e_t (sigma G_t
    <= 1), so the derivative for S_in stays the loop's."""
    from cupy_gda import distributed
    q, k, v, h0, cu = (None if x is None else jnp.asarray(x) for x in (
        q, k, v, initial_state, cu_seqlens))
    g = jnp.asarray(gate if gate is not None else log_gate)
    p = _checks.check_forward(FN, q, k, v, g if gate is not None else None,
                              g if gate is None else None, h0, cu, cpu=True)
    f32 = jnp.float64 if q.dtype == jnp.float64 else jnp.float32     # (float64: the CPU's)
    a = (g if gate is not None else jnp.exp(g)).astype(f32)
    qf = q.astype(f32)
    h0 = None if h0 is None else h0.astype(f32)
    axis = _Axis(axis_name)
    lens = None if cu is None else jnp.full((axis.size,), p.T, cu.dtype)   # (equal slices)
    sl = distributed._Slice(jnp, axis, p, cu, lens, index_dtype=None if cu is None else cu.dtype)
    o, S = gated_attention(qf, k.astype(f32), v.astype(f32), a, scale=scale,
                           initial_state=sl.local_rows(jnp, h0, sl.own_start) if cu is not None
                           else None, output_final_state=True, cu_seqlens=sl.cu, method=method)
    Gm, Ge = _scaled_cumprod(a)                        # the gates' running products
    Rm, Re = _scaled_cumprod(a, reverse=True) if cu is not None else (None, None)
    Pm, Pe = distributed._pieces(jnp, sl, Gm, Rm), distributed._pieces(jnp, sl, Ge, Re, one=0)
    Pm, Pe, Sg = (axis.allgather(x) for x in (Pm, Pe, S))
    start = jnp.zeros(S.shape, f32) if h0 is None or cu is not None else h0
    entering, _, x = distributed._fold(jnp, (Pm, Pe, Sg), start, sl.own_start, range(sl.R),
                                       ldexp=_ldexp)
    s_in = sl.rows(jnp, jnp.stack(entering)[axis.rank], sl.first)   # (rank: traced)
    on = True if sl.cont_in is None else sl.cont_in[None, :, None, None]   # the first piece's
    mx = lax.stop_gradient(jnp.abs(s_in).max(axis=-1))
    top = lax.stop_gradient(jnp.where(on, Ge, 0).max(axis=1, initial=0))
    E = jnp.where(mx == 0, -top, jnp.frexp(mx)[1] - 1)          # sigma = 2^E
    sG = _ldexp(jnp.where(on, Gm, 0), jnp.where(on, Ge + E[:, None], 0))
    o = o + scale * jnp.einsum("bthk,bhkv->bthv", qf * sG, _ldexp(s_in, -E[..., None]),
                               precision=lax.Precision.HIGHEST)
    o = o.astype(v.dtype)
    return (o, x) if output_final_state else o


def _scratch(static, q, k, v, gate, log_gate, h0, cu):
    """(forward, backward) bytes of the GPU calls' scratch outputs (_api.gpu_scratch_bytes on
    CuPy's current device); (0, 0) where jax has no GPU or the GPU cannot take the call (its
    callback then raises the core's error)."""
    if not _jax_has_gpu():
        return 0, 0
    try:
        p = _checks.check_forward(FN, q, k, v, gate, log_gate, h0, cu, cpu=False)
        kw = dict(seq_int64=cu is not None and cu.dtype == np.int64, varlen=cu is not None)
        return (_api.gpu_scratch_bytes(FN, p, static.method, False, final=static.final, **kw),
                _api.gpu_scratch_bytes(FN, p, static.method, True, initial_state=h0 is not None,
                                       **kw))
    except (ValueError, TypeError, ImportError):
        return 0, 0


@lru_cache(maxsize=None)
def _jax_has_gpu():
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static, q, k, v, g, h0, cu):
    return _forward(static, q, k, v, g, h0, cu)


def _attention_fwd(static, q, k, v, g, h0, cu):
    # the states are recomputed by the backward: the inputs are all it keeps
    return _forward(static, q, k, v, g, h0, cu), (q, k, v, g, h0, cu)


def _attention_bwd(static, res, ct):
    q, k, v, g, h0, cu = res
    do, dht = ct if static.final else (ct, None)
    shapes = [_like(q), _like(k), _like(v), _like(g)]
    if h0 is not None:
        shapes.append(_state(q, h0.shape))
    grads = _run(partial(_backward_host, static), shapes, static.scratch[1], q, k, v, g, h0, cu,
                 do, dht)
    dh0 = grads[4].astype(h0.dtype) if h0 is not None else None
    dcu = np.zeros(cu.shape, jax.dtypes.float0) if cu is not None else None
    return (*grads[:4], dh0, dcu)


_attention.defvjp(_attention_fwd, _attention_bwd)

# Called eagerly, platform_dependent would take the default device's branch even for arrays on
# another one; under jit it takes that of the device the call is compiled for.
_jitted = jax.jit(_attention, static_argnums=0)


def _like(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _state(q, shape):
    """A state [N, H, K, V] as the core returns it: float64 for float64 inputs (CPU only), else
    float32."""
    return jax.ShapeDtypeStruct(shape, np.float64 if q.dtype == np.float64 else np.float32)


def _forward(static, q, k, v, g, h0, cu):
    B, T, H, K = q.shape
    N = B if cu is None else cu.shape[0] - 1
    shapes = [_like(v)]
    if static.final:
        shapes.append(_state(q, (N, H, K, v.shape[3])))
    r = _run(partial(_forward_host, static), shapes, static.scratch[0], q, k, v, g, h0, cu)
    return tuple(r) if static.final else r[0]


def _forward_host(static, outs, q, k, v, g, h0, cu):
    """The core's forward on NumPy or CuPy arrays; ``outs`` (GPU): XLA's output buffers."""
    gate, log_gate = (None, g) if static.log_gate else (g, None)
    r = cupy_gda.gated_attention(q, k, v, gate, log_gate=log_gate, scale=static.scale,
                                 initial_state=h0, output_final_state=static.final,
                                 cu_seqlens=cu, method=static.method,
                                 out=None if outs is None else outs[0], check_indices=False)
    return r if static.final else (r,)


def _backward_host(static, outs, q, k, v, g, h0, cu, do, dht):
    gate, log_gate = (None, g) if static.log_gate else (g, None)
    r = cupy_gda.gated_attention_backward(q, k, v, gate, do=do, log_gate=log_gate,
                                          scale=static.scale, initial_state=h0,
                                          d_final_state=dht, cu_seqlens=cu, check_indices=False)
    return r[:4] if h0 is None else r


def _run(host_fn, shapes, scratch, *args):
    """``host_fn(outs, *arrays)`` on the platform the call is compiled for; returns its results
    as JAX arrays of ``shapes`` (on the GPU with a scratch output of ``scratch`` bytes beside
    them, for the core's allocations)."""
    return lax.platform_dependent(*args, cpu=partial(_on_cpu, host_fn, shapes),
                                  cuda=partial(_on_gpu, host_fn, shapes, scratch))


def _on_cpu(host_fn, shapes, *args):
    return jax.pure_callback(partial(host_fn, None), tuple(shapes), *args,
                             vmap_method="sequential")


def _on_gpu(host_fn, shapes, scratch, *args):
    def callback(ctx, outs, *bufs):
        import cupy
        device = outs[0].__dlpack_device__()[1]
        outs, buf = outs[:-1], outs[-1]
        with cupy.cuda.Device(device), _external_stream(cupy, ctx.stream, device), \
                cupy.cuda.using_allocator(_Scratch(cupy, buf, device)):
            outs = [_cupy_view(cupy, b, device) for b in outs]
            got = host_fn(outs, *(None if b is None else _cupy_view(cupy, b, device)
                                  for b in bufs))
            for dst, src in zip(outs, got):
                if src is not dst and src.nbytes:   # (o is written in place, by out=)
                    dst.data.copy_from_device_async(src.data, src.nbytes)   # on XLA's stream
    shapes = (*shapes, jax.ShapeDtypeStruct((scratch,), np.uint8))
    return buffer_callback(callback, shapes, vmap_method="sequential")(*args)[:-1]


class _Scratch:
    """CuPy's allocator inside a GPU callback: each allocation cut from ``buf`` (the callback's
    scratch output), ALLOC-aligned, while it lasts, then from CuPy's pool. Nothing is freed: the
    buffer is XLA's, and it is held until XLA's work on the stream is done with it."""

    def __init__(self, cupy, buf, device):
        self.cupy, self.buf, self.device = cupy, buf, device
        n = prod(buf.shape)
        self.at = self.end = 0
        if n:
            base = buf.__cuda_array_interface__["data"][0]
            self.at, self.end = -(-base // ALLOC) * ALLOC, base + n

    def __call__(self, size):
        need = -(-size // ALLOC) * ALLOC
        if size and self.at + need <= self.end:
            mem = self.cupy.cuda.UnownedMemory(self.at, size, self.buf, self.device)
            self.at += need
            return self.cupy.cuda.MemoryPointer(mem, 0)
        return self.cupy.get_default_memory_pool().malloc(size)


def _cupy_view(cupy, buf, device):
    """A CuPy array over an XLA buffer, valid during the callback. The address comes from
    __cuda_array_interface__, the dtype from the buffer (its typestr for bfloat16 is '<V2')."""
    dtype = np.dtype(buf.dtype)
    n = prod(buf.shape) * dtype.itemsize
    if n == 0:                                  # (an empty buffer may have no address)
        return cupy.empty(buf.shape, dtype)
    mem = cupy.cuda.UnownedMemory(buf.__cuda_array_interface__["data"][0], n, buf, device)
    return cupy.ndarray(buf.shape, dtype, cupy.cuda.MemoryPointer(mem, 0))
