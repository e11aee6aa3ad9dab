"""JAX adapter (issue 15): :func:`gated_attention` as a ``jax.custom_vjp`` function, eager or
inside ``jax.jit``, with gradients for q, k, v, the gate given and initial_state. Imported only
explicitly (``import cupy_gda.jax``): the core never imports JAX.

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
written once more). Workspaces (the forward's segment states, the backward's kept or chunk
states and partial sums) and those copies' sources come from CuPy's memory pool on XLA's
stream, not from XLA's allocator: JAX preallocates 75 % of GPU memory by default, which leaves
CuPy the rest; set XLA_PYTHON_CLIENT_PREALLOCATE=false (or a lower
XLA_PYTHON_CLIENT_MEM_FRACTION) for large problems. Taking them as extra outputs instead (what
the issue asks) needs the launchers to take every output and workspace as arguments and to say
the workspace sizes before the call; they allocate inside so far.

cu_seqlens' values are not checked on the GPU (that would cost a host sync): as with
``check_indices=False``, offsets out of order are clamped and nothing outside the arrays is read
or written. The CPU route checks them; a bad one raises inside the callback (a JaxRuntimeError).

Eager calls run through an internal ``jax.jit`` (compiled once per shape), so that the branch
is the arrays' device's. Under ``jax.vmap`` the callbacks run once per element.

Versions: jax >= 0.6.1 (buffer_callback with ExecutionContext.stream; the same API through 0.11).
tests/test_jax.py checks the CPU route and both lowerings without a GPU (jax 0.10.2), and the GPU
route in its gpu-marked tests.
"""
from functools import partial
from math import prod
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import cupy_gda
from cupy_gda import _checks, _dispatch
from cupy_gda._interop import _external_stream

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


def gated_attention(q, k, v, gate=None, *, log_gate=None, scale=1.0, initial_state=None,
                    output_final_state=False, cu_seqlens=None, method="auto"):
    """:func:`cupy_gda.gated_attention` on JAX arrays, differentiable: ``jax.grad`` gives the
    gradients of q, k, v, the gate argument given (gate or log_gate) and initial_state, through
    :func:`cupy_gda.gated_attention_backward`; cu_seqlens (integers) gets a float0 zero.

    Args as in :func:`cupy_gda.gated_attention` (scale, output_final_state and method are static
    Python values). Shapes and dtypes are checked when traced (the GPU's narrower limits, K at
    most 256 and no float64, when it runs). Returns o [B, T, H, V], or (o, final_state).
    """
    q, k, v, gate, log_gate, h0, cu = (None if x is None else jnp.asarray(x) for x in (
        q, k, v, gate, log_gate, initial_state, cu_seqlens))
    p = _checks.check_forward(FN, q, k, v, gate, log_gate, h0, cu, cpu=True)
    _dispatch.pick(FN, method, p, False)            # the method's name
    static = _Static(log_gate is not None, _checks.check_scale(FN, scale),
                     bool(output_final_state), method)
    g = gate if gate is not None else log_gate
    return _jitted(static, q, k, v, g, h0, cu)


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
    grads = _run(partial(_backward_host, static), shapes, q, k, v, g, h0, cu, do, dht)
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
    r = _run(partial(_forward_host, static), shapes, q, k, v, g, h0, cu)
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


def _run(host_fn, shapes, *args):
    """``host_fn(outs, *arrays)`` on the platform the call is compiled for; returns its results
    as JAX arrays of ``shapes``."""
    return lax.platform_dependent(*args, cpu=partial(_on_cpu, host_fn, shapes),
                                  cuda=partial(_on_gpu, host_fn, shapes))


def _on_cpu(host_fn, shapes, *args):
    return jax.pure_callback(partial(host_fn, None), tuple(shapes), *args,
                             vmap_method="sequential")


def _on_gpu(host_fn, shapes, *args):
    def callback(ctx, outs, *bufs):
        import cupy
        device = outs[0].__dlpack_device__()[1]
        with cupy.cuda.Device(device), _external_stream(cupy, ctx.stream, device):
            outs = [_cupy_view(cupy, b, device) for b in outs]
            got = host_fn(outs, *(None if b is None else _cupy_view(cupy, b, device)
                                  for b in bufs))
            for dst, src in zip(outs, got):
                if src is not dst and src.nbytes:   # (o is written in place, by out=)
                    dst.data.copy_from_device_async(src.data, src.nbytes)   # on XLA's stream
    return buffer_callback(callback, tuple(shapes), vmap_method="sequential")(*args)


def _cupy_view(cupy, buf, device):
    """A CuPy array over an XLA buffer, valid during the callback. The address comes from
    __cuda_array_interface__, the dtype from the buffer (its typestr for bfloat16 is '<V2')."""
    dtype = np.dtype(buf.dtype)
    n = prod(buf.shape) * dtype.itemsize
    if n == 0:                                  # (an empty buffer may have no address)
        return cupy.empty(buf.shape, dtype)
    mem = cupy.cuda.UnownedMemory(buf.__cuda_array_interface__["data"][0], n, buf, device)
    return cupy.ndarray(buf.shape, dtype, cupy.cuda.MemoryPointer(mem, 0))
