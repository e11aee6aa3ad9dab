"""The public functions: argument checks, then the one dispatch point, then a kernel."""
import numpy as np

from cupy_gda import (_checks, _dispatch, chunk, chunk_bwd, recurrent, recurrent_bwd, reference,
                      step)
from cupy_gda._interop import Bridge, host_array


_FAMILIES = {"recurrent": recurrent, "chunk": chunk}    # the GPU launchers of _dispatch's names

try:
    from cupy import ndarray as _cupy_ndarray
    from cupy.cuda.runtime import getDevice as _current_device
except Exception:  # noqa: BLE001 - without CuPy there is no GPU path and no fast path
    _cupy_ndarray = _current_device = None

# Host-side fast path: a call whose CuPy arguments have the signature of an earlier, checked
# call (shapes, dtypes, strides, device, flags) goes straight to that call's launch plan.
_FAST = {}


def _sig(x):
    """What a plan depends on in one argument, or None if it is not a CuPy array."""
    if x is None:
        return ()
    if type(x) is not _cupy_ndarray:
        return None
    return x.shape, x.dtype, x.strides, x.data.device_id, x.data.ptr % ALIGN == 0


def _fast_key(*parts):
    return None if None in parts else parts


ALIGN = 16      # bytes: the kernels may load 16 at once from an input (cp.async of float32 rows)


def _ready(x):
    return x.flags.c_contiguous and x.data.ptr % ALIGN == 0


def _contiguous(xs):
    """Each CuPy array C-contiguous and ALIGN-aligned: copied where it is not (a contiguous view
    that starts inside an element group, say)."""
    import cupy
    return [x if x is None or _ready(x) else cupy.array(x, order="C") for x in xs]


def _all_contiguous(xs):
    return all(x is None or _ready(x) for x in xs)


def _check_out(fn, out, shape, dtype, gpu):
    if out is None:
        return
    legend = "[B, T, H, V]" if len(shape) == 4 else "[B, H, V]"
    _checks._shape(fn, "out", out, legend, shape)
    if out.dtype != dtype:
        raise TypeError(f"{fn}: out must have v's dtype {dtype.name}, got {out.dtype.name}")
    if gpu and not out.flags.c_contiguous:
        raise ValueError(f"{fn}: out must be C-contiguous")
    _checks.check_writeable(fn, "out", out)


class ChunkStates:
    """What ``gated_attention(..., keep_states=True)`` keeps on the GPU for the backward of the
    same call (``gated_attention_backward(..., states=)``): each chunk's state and the chunked
    form's operands, in one float32 ``workspace`` (``nbytes`` of device memory, held while this
    object lives), and the ``flag`` of the forward's guard (int32 [1]), as arrays of the call's
    framework. The backward then skips recomputing them (docs/perf-notes.md, v24: 4.75 against
    6.37 ms at GLA-1.3B bf16, 1.7 GiB held). Valid for the backward of exactly that call's
    inputs: the backward checks the shapes, dtypes and scale, not the values.

    ``ChunkStates(workspace, flag)`` rebuilds one from its two arrays, as an adapter carries
    them through a framework's autograd (cupy_gda.torch); the backward then checks their sizes
    against the call, and the caller vouches that they are that call's forward's."""
    __slots__ = ("workspace", "flag", "made_for")

    def __init__(self, workspace, flag, made_for=None):
        self.workspace, self.flag = workspace, flag
        self.made_for = made_for          # (chunk_bwd.Kept.key, scale), where the core made it

    @property
    def nbytes(self):
        return self.workspace.nbytes


def gated_attention(q, k, v, gate=None, *, log_gate=None, scale=1.0, initial_state=None,
                    output_final_state=False, cu_seqlens=None, method="auto", out=None,
                    check_indices=True, keep_states=False):
    """Gated linear attention over a whole sequence (the GLA forward pass).

    For each sequence n and head h, t = 1..T::

        S_t = diag(g_t) · S_{t-1} + k_t v_tᵀ      S_0 = initial_state[n, h] or 0
        o_t = scale · S_tᵀ q_t

    Args:
        q, k: [B, T, H, K] float32, float16 or bfloat16 (float64 too for NumPy).
        v: [B, T, H, V], q's dtype.
        gate: [B, T, H, K] multiplicative gate, any real value; float32 or q's dtype.
        log_gate: instead of gate, its log (fla's ``g``; -inf means gate 0). Exactly one is given.
        scale: output scale (1.0 by default; fla's default is K ** -0.5).
        initial_state: [N, H, K, V] float32, N = B (or len(cu_seqlens) - 1).
        output_final_state: also return the final state [N, H, K, V] float32.
        cu_seqlens: [N + 1] int32/int64 offsets of packed sequences (B must be 1).
        method: "auto" (by the measured table in _dispatch), or a kernel family: "recurrent"
            (GPU and CPU) or "chunk" (GPU for K <= chunk.MAX_K = 256, and CPU).
        out: optional [B, T, H, V] array of v's dtype that receives o (on the GPU C-contiguous;
            one that does not start on a 16-byte boundary gets o by a copy after the kernels).
        check_indices: check cu_seqlens' values (one device sync on the GPU); pass False when
            capturing the call in a CUDA graph.
        keep_states: also return a ChunkStates for gated_attention_backward(states=), or None
            where the call did not run the chunked form that keeps them (the CPU, and GPU calls
            outside _dispatch.planes_forward's rule): training steps that hold the memory
            between the forward and the backward skip recomputing them there.

    Returns o [B, T, H, V] of v's dtype, or (o, final_state), each with the ChunkStates (or
    None) after it where keep_states. NumPy in, NumPy out (math in
    float64 for float64 inputs, else float32); CuPy in, CuPy out; a framework's CUDA array in
    (PyTorch, JAX, ...), the same framework's array out, computed on the GPU.
    """
    g = gate if gate is not None else log_gate
    if cu_seqlens is None and out is None and type(q) is _cupy_ndarray and not keep_states:
        key = _fast_key(_sig(q), _sig(k), _sig(v), _sig(g), gate is None, _sig(initial_state),
                        bool(output_final_state), method, _current_device())
        plan = _FAST.get(key)
        if plan is not None and type(scale) in (float, int):
            o, ht = plan(q, k, v, g, scale, initial_state, None, output_final_state, None)
            return (o, ht) if output_final_state else o
    else:
        key = None
    fn = "gated_attention"
    br = Bridge(fn, dict(q=q, k=k, v=v, gate=gate, log_gate=log_gate, initial_state=initial_state,
                         cu_seqlens=cu_seqlens, out=out))
    with br.context():
        q, k, v, gate, log_gate, h0, cu, out = (br.native(x) for x in (
            q, k, v, gate, log_gate, initial_state, cu_seqlens, out))
        p = _checks.check_forward(fn, q, k, v, gate, log_gate, h0, cu, cpu=not br.gpu)
        scale = _checks.check_scale(fn, scale)
        m = _dispatch.pick(fn, method, p, br.gpu)
        _check_out(fn, out, (p.B, p.T, p.H, p.V), v.dtype, br.gpu)
        if cu is not None and (check_indices or not br.gpu):
            _checks.check_cu_seqlens_values(fn, host_array(cu), p.T)
        if br.gpu:
            g = gate if gate is not None else log_gate
            cached = (key is not None and key[-1] == q.data.device_id
                      and _all_contiguous((q, k, v, g, h0)))
            q, k, v, g, h0, cu = _contiguous((q, k, v, g, h0, cu))
            # an out that starts inside a 16-byte group (a C-contiguous view at an odd offset)
            # takes o from a buffer of our own (copied into it below, as the CPU's always is):
            # the kernels store o 16 bytes at a time
            dst, out = (out, None) if out is not None and not _ready(out) else (None, out)
            plan = _forward_plan(m, p, cu is not None, cu is not None and cu.dtype == np.int64,
                                 bool(keep_states))
            if keep_states and isinstance(plan, chunk_bwd.ForwardPlan):
                o, ht, kept = plan.run(q, k, v, g, scale, h0, cu, output_final_state, out,
                                       keep=True)
                states = (None if kept is None else ChunkStates(
                    br.back(kept.ws), br.back(kept.flag), (kept.key, kept.scale)))
            else:
                o, ht = plan(q, k, v, g, scale, h0, cu, output_final_state, out)
                states = None
            if cached:
                _FAST[key] = plan
        else:
            states = None
            cpu_fn = (reference.gated_attention_chunked if m == "chunk"
                      else reference.gated_attention_recurrent)
            o, ht = cpu_fn(q, k, v, gate, log_gate=log_gate, scale=scale, initial_state=h0,
                           output_final_state=True, cu_seqlens=cu, dtype=p.cpu_dtype)
            with np.errstate(over="ignore"):        # (beyond float16's range: inf, as on the GPU)
                o = o.astype(v.dtype, copy=False)
            ht = ht.astype(p.cpu_dtype, copy=False)
            dst = out
        if dst is not None:                             # (o into the caller's out)
            dst[...] = o
            o = dst
        r = (br.back(o), br.back(ht)) if output_final_state else (br.back(o),)
        if keep_states:
            return (*r, states)
        return r if output_final_state else r[0]


def gated_attention_backward(q, k, v, gate=None, *, do, log_gate=None, scale=1.0,
                             initial_state=None, d_final_state=None, cu_seqlens=None,
                             method="auto", check_indices=True, states=None):
    """The gradients of a gated_attention call's loss (the GLA backward pass).

    With dS_t the whole gradient reaching S_t (dS_T also gets ``d_final_state``)::

        dS_t = scale · q_t do_tᵀ + diag(g_{t+1}) · dS_{t+1}
        dq_t = scale · S_t do_t    dk_t = dS_t v_t    dv_t = dS_tᵀ k_t
        dgate_t = rowsum(dS_t ⊙ S_{t-1})           (dlog_gate_t = gate_t ⊙ dgate_t)
        dinitial_state = diag(g_1) · dS_1

    each as the reverse loop computes it: no division by a gate, so gates of 0 (log gates of
    -inf), negative, tiny or above 1 give exact, finite gradients.

    Args:
        q, k, v, gate / log_gate, scale, initial_state, cu_seqlens: the forward call's.
        do: [B, T, H, V] the gradient of o, v's dtype.
        d_final_state: [N, H, K, V] the gradient of the final state (if the loss used it).
        method: "auto" (by _dispatch.pick_backward's measured rule), "recurrent" (the reverse
            loop, the states recomputed from kept ones; on the GPU one a chunk of up to 32
            steps, or one every 64 steps where that would take over recurrent_bwd.KEPT_BYTES)
            or "chunk" (the states kept at each chunk's start and the chunked form's products
            of gates; GPU: chunks of 32 or 64 steps, the matmuls on the tensor cores exact
            to float32 (split operands, never TF32); CPU: chunks of 8 or 16 steps,
            vectorised over every chunk). Where the inputs or states
            leave the range the chunked products are exact in, the reverse loop runs instead
            (on the GPU, decided there without a sync).
        check_indices: as in gated_attention.
        states: the ChunkStates of this call's forward (gated_attention(keep_states=True)), or
            None. Where the chunked backward runs it takes them instead of recomputing them
            (the same gradients, bit for bit); elsewhere they are not needed.

    Returns :class:`Gradients` (dq, dk, dv, dgate, dinitial_state): dq, dk, dv in q's dtype,
    dgate of whichever gate argument was given in its dtype, dinitial_state (None without an
    initial state) float32 (float64 for float64 NumPy inputs). Math in float32 (float64 for
    float64 NumPy inputs). Arrays as in gated_attention: NumPy in, NumPy out; CuPy in, CuPy out;
    a framework's CUDA array in, the same framework's out.
    """
    fn = "gated_attention_backward"
    kept_arrays = ({"states.workspace": states.workspace, "states.flag": states.flag}
                   if isinstance(states, ChunkStates) else {})
    br = Bridge(fn, dict(q=q, k=k, v=v, gate=gate, log_gate=log_gate, do=do,
                         initial_state=initial_state, d_final_state=d_final_state,
                         cu_seqlens=cu_seqlens, **kept_arrays))
    with br.context():
        q, k, v, gate, log_gate, do, h0, dht, cu = (br.native(x) for x in (
            q, k, v, gate, log_gate, do, initial_state, d_final_state, cu_seqlens))
        p = _checks.check_backward(fn, q, k, v, gate, log_gate, do, h0, dht, cu, cpu=not br.gpu)
        scale = _checks.check_scale(fn, scale)
        m = _dispatch.pick_backward(fn, method, p, br.gpu)
        kept = _kept(fn, states, p, cu is not None, scale, br)   # (used where m is chunk)
        if cu is not None and (check_indices or not br.gpu):
            _checks.check_cu_seqlens_values(fn, host_array(cu), p.T)
        g = gate if gate is not None else log_gate
        if br.gpu:
            q, k, v, g, do, h0, dht, cu = _contiguous((q, k, v, g, do, h0, dht, cu))
            seq_int64 = cu is not None and cu.dtype == np.int64
            if kept is not None and m == "chunk":
                plan = chunk_bwd.plan(p, cu is not None, seq_int64, keep=True)
                grads = plan.run(q, k, v, g, do, scale, h0, dht, cu, kept=kept)[0]
            else:
                plan = _backward_plan(m, p, cu is not None, seq_int64)
                grads = plan(q, k, v, g, do, scale, h0, dht, cu)
        else:
            cpu_fn = (reference.gated_attention_backward_chunked if m == "chunk"
                      else reference.gated_attention_backward_recurrent)
            r = cpu_fn(q, k, v, gate, do=do, log_gate=log_gate, scale=scale, initial_state=h0,
                       d_final_state=dht, cu_seqlens=cu, dtype=p.cpu_dtype)
            with np.errstate(over="ignore"):        # (beyond float16's range: inf, as on the GPU)
                grads = (r.dq.astype(q.dtype, copy=False), r.dk.astype(q.dtype, copy=False),
                         r.dv.astype(q.dtype, copy=False), r.dgate.astype(g.dtype, copy=False),
                         None if h0 is None else r.dinitial_state.astype(p.cpu_dtype, copy=False))
        return reference.Gradients(*(br.back(x) for x in grads))


def _kept(fn, states, p, varlen, scale, br):
    """The chunk_bwd.Kept of ``states`` (a ChunkStates or None) for the chunked backward of
    Problem ``p`` (inside ``br``'s context); errors name the argument: not a ChunkStates, a CPU
    call, another call's, or arrays of other sizes than this call's forward keeps."""
    if states is None:
        return None
    if not isinstance(states, ChunkStates):
        raise TypeError(f"{fn}: states must be the ChunkStates of gated_attention(..., "
                        f"keep_states=True) or None, got {type(states).__name__}")
    if not br.gpu:
        raise ValueError(f"{fn}: states are a GPU forward's; the CPU backward takes none")
    key = (p, varlen, chunk_bwd.planes_config(p, varlen).BT)
    if states.made_for is not None and states.made_for != (key, scale):
        (kp, _, _), ks = states.made_for
        raise ValueError(f"{fn}: states were kept by another call's forward (shapes and dtypes "
                         f"{kp}, scale {ks}); this call has {p}, scale {scale}")
    ws, flag = br.native(states.workspace), br.native(states.flag)
    floats = chunk_bwd.forward_bytes(p, varlen) // 4
    for name, x, dtype, n in (("workspace", ws, np.float32, floats), ("flag", flag, np.int32, 1)):
        if x.dtype != dtype or x.shape != (n,) or not x.flags.c_contiguous:
            raise ValueError(f"{fn}: states.{name} must be the {np.dtype(dtype).name} [{n}] "
                             f"array this call's forward keeps, got {x.dtype.name} "
                             f"{list(x.shape)}")
    return chunk_bwd.Kept(ws, flag, scale, key)


def gpu_kept_bytes(fn, p, method, varlen=False):
    """The bytes of the ChunkStates' workspace that a GPU forward on Problem ``p`` keeps with
    keep_states=True: chunk_bwd.forward_bytes where it runs chunk_bwd.ForwardPlan (as
    _forward_plan; the rule's shapes all have chunks), else 0 (it keeps none). For the current
    device (the rule counts its SMs)."""
    if (_dispatch.pick(fn, method, p, True) != "chunk"
            or not _dispatch.planes_forward(p, varlen, keep=True)):
        return 0
    return chunk_bwd.forward_bytes(p, varlen)


def _forward_plan(m, p, varlen, seq_int64, keep=False):
    """The GPU plan of forward method ``m`` (_dispatch.pick's) for Problem ``p``: "chunk" from
    the backward family's stages (chunk_bwd.ForwardPlan; one that keeps them where ``keep``)
    where _dispatch.planes_forward says."""
    if m == "chunk" and _dispatch.planes_forward(p, varlen, keep=keep):
        return chunk_bwd.forward_plan(p, varlen, seq_int64, keep)
    return _FAMILIES[m].plan(p, seq_int64)


def _backward_plan(m, p, varlen, seq_int64):
    """The GPU plan of backward method ``m`` (_dispatch.pick_backward's) for Problem ``p``."""
    return (chunk_bwd.plan(p, varlen, seq_int64) if m == "chunk"
            else recurrent_bwd.plan(p, seq_int64))


def gpu_scratch_bytes(fn, p, method, backward, *, final=False, initial_state=False,
                      seq_int64=False, varlen=False):
    """The device memory, in bytes, that one GPU call on Problem ``p`` allocates beyond its
    inputs and the forward's ``out``: the arrays it returns and its workspaces (each rounded up
    to _launch.ALLOC bytes), by the method ``method`` picks (the backward's where ``backward``),
    with the final state where ``final``, a dinitial_state where ``initial_state``, cu_seqlens
    where ``varlen`` (int64 where ``seq_int64``). The JAX adapter gives a call this much of
    XLA's memory (cupy_gda.jax). For the current device; builds (compiles) the call's plan."""
    if backward:
        m = _dispatch.pick_backward(fn, method, p, True)
        return _backward_plan(m, p, varlen, seq_int64).scratch_bytes(initial_state)
    m = _dispatch.pick(fn, method, p, True)
    return _forward_plan(m, p, varlen, seq_int64).scratch_bytes(final)


def gated_attention_step(q, k, v, gate=None, *, log_gate=None, state, scale=1.0,
                         state_indices=None, out=None, check_indices=True):
    """One decoding step: one token per sequence, the state updated in place.

    Args:
        q, k, gate (or log_gate): [B, H, K]; v: [B, H, V] (dtypes as in gated_attention).
        state: [N, H, K, V] float32, C-contiguous; rows ``state_indices`` are updated in place,
            the others are untouched.
        state_indices: [B] int32/int64 rows of ``state`` (default 0..B-1); no duplicates.
        out: optional [B, H, V] array of v's dtype that receives o.
        check_indices: check state_indices' range and uniqueness (one device sync on the GPU);
            pass False when capturing the call in a CUDA graph. Unchecked rows outside [0, N)
            touch no state and give NaN outputs.

    Returns o [B, H, V] of v's dtype. Equal to gated_attention on T = 1 with
    initial_state=state[state_indices]. JAX arrays are immutable: use that functional form.
    """
    g = gate if gate is not None else log_gate
    if out is None and type(q) is _cupy_ndarray and (state_indices is None or not check_indices):
        key = _fast_key(_sig(q), _sig(k), _sig(v), _sig(g), gate is None, _sig(state),
                        state.data.ptr % 16 if type(state) is _cupy_ndarray else None,
                        _sig(state_indices), _current_device())
        plan = _FAST.get(key)
        if plan is not None and type(scale) in (float, int):
            return plan(q, k, v, g, state, scale, state_indices, None)
    else:
        key = None
    fn = "gated_attention_step"
    br = Bridge(fn, dict(q=q, k=k, v=v, gate=gate, log_gate=log_gate, state=state,
                         state_indices=state_indices, out=out))
    if br.lib == "jax":
        raise TypeError(f"{fn}: JAX arrays are immutable, so state cannot be updated in place; use "
                        f"the functional form o, state = gated_attention(q[:, None], k[:, None], "
                        f"v[:, None], gate[:, None], initial_state=state, output_final_state=True)")
    with br.context():
        q, k, v, gate, log_gate, state, idx, out = (br.native(x) for x in (
            q, k, v, gate, log_gate, state, state_indices, out))
        p = _checks.check_step(fn, q, k, v, gate, log_gate, state, idx, cpu=not br.gpu)
        scale = _checks.check_scale(fn, scale)
        if not state.flags.c_contiguous:
            raise ValueError(f"{fn}: state must be C-contiguous (it is updated in place)")
        _checks.check_writeable(fn, "state", state)
        _check_out(fn, out, (p.B, p.H, p.V), v.dtype, br.gpu)
        _checks.check_no_overlap(fn, "out", out, "state", state)
        if idx is not None and (check_indices or not br.gpu):
            _checks.check_state_indices_values(fn, host_array(idx).astype(np.int64), p.N)
        if br.gpu:
            g = gate if gate is not None else log_gate
            cached = (key is not None and key[-1] == q.data.device_id
                      and _all_contiguous((q, k, v, g, idx)))
            q, k, v, g, idx = _contiguous((q, k, v, g, idx))
            plan = step.plan(p, idx is not None and idx.dtype == np.int64,
                             step.alignment(state.data.ptr))
            o = plan(q, k, v, g, state, scale, idx, out)
            if cached:
                _FAST[key] = plan
        else:
            o = reference.gated_attention_step_ref(q, k, v, gate, log_gate=log_gate, state=state,
                                                   scale=scale, state_indices=idx,
                                                   dtype=p.cpu_dtype).astype(v.dtype, copy=False)
            if out is not None:
                out[...] = o
                o = out
        return br.back(o)
