"""PyTorch adapter: :func:`gated_attention` as a differentiable ``torch.library`` custom op.

    import cupy_gda.torch
    o, S = cupy_gda.torch.gated_attention(q, k, v, log_gate=g, initial_state=h0,
                                          output_final_state=True)
    ((o * W).sum() + S.square().sum()).backward()     # dq, dk, dv, dlog_gate, dinitial_state

Two ``torch.library`` custom ops (torch >= 2.4), each with a fake (shapes only) so that
``torch.compile(fullgraph=True)`` traces them: ``cupy_gda::gated_attention`` (the forward) and
``cupy_gda::gated_attention_backward`` (which the forward's autograd formula calls; no second
derivative). CUDA tensors run on torch's current stream, and every array CuPy allocates inside
(outputs, workspaces, contiguous copies) comes from torch's caching allocator on that stream, so
``torch.cuda.memory_allocated`` counts it and CUDA-graph capture puts it in the graph's pool.
CPU tensors run the NumPy path. With ``process_group=`` one sequence is split across the
group's ranks (cupy_gda.distributed), differentiable across them through an autograd.Function.

Imported only explicitly (``import cupy_gda.torch``): the core never imports torch.
"""
import contextlib
import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

import cupy_gda

__all__ = ["gated_attention"]


def gated_attention(q, k, v, gate=None, *, log_gate=None, scale=1.0, initial_state=None,
                    output_final_state=False, cu_seqlens=None, method="auto",
                    check_indices=True, keep_states=False, process_group=None):
    """:func:`cupy_gda.gated_attention` on torch tensors, differentiable in q, k, v, the gate
    argument given (gate or log_gate) and initial_state. Same arguments (no ``out=``) and
    returns: o [B, T, H, V] of v's dtype, or (o, final_state [N, H, K, V] float32; float64
    for float64 CPU inputs). check_indices: as in cupy_gda.gated_attention (pass False inside
    CUDA-graph capture with cu_seqlens); the backward never re-checks the forward's offsets.
    keep_states: the forward's cupy_gda.ChunkStates (where the GPU forward keeps any: see
    cupy_gda.gated_attention) are held for the backward, which then skips recomputing them
    (GLA-1.3B bf16: 1.7 GiB held from the forward to the backward for 1.6 ms less backward;
    docs/perf-notes.md, v25); elsewhere it changes nothing.

    process_group: a torch.distributed group over which one sequence is split
    (cupy_gda.distributed): q, k, v and the gate are this rank's slice [B, T_r, H, *], cu_seqlens
    and initial_state the whole call's, the same on every rank (NCCL for CUDA tensors, gloo for
    CPU ones). Autograd runs across the ranks: every rank calls backward (each a collective).
    The final state is the whole sequence's on every rank, and its gradient the sum of the
    ranks' (an all-reduce in the backward); initial_state's gradient is the whole loss's on
    every rank (what averaging a replicated parameter's gradients over the ranks, as DDP does,
    keeps). An autograd.Function (not a custom op: torch.compile breaks the graph there);
    method, check_indices and keep_states do not apply."""
    if process_group is not None:
        if keep_states or method != "auto":
            raise ValueError(f"{FN}: with process_group, method must be 'auto' and keep_states "
                             f"False, got {method!r} and {keep_states!r}")
        o, ht = _Distributed.apply(q, k, v, gate if gate is not None else log_gate,
                                   initial_state, cu_seqlens, log_gate is not None, scale,
                                   output_final_state, process_group)
        return (o, ht) if output_final_state else o
    o, ht, _, _ = _forward_op(q, k, v, gate, log_gate, scale, initial_state, output_final_state,
                              cu_seqlens, method, check_indices, keep_states)
    return (o, ht) if output_final_state else o


# ---- CuPy's allocations from torch's caching allocator

def _malloc(size, device):
    # torch's current stream is the one the Bridge launches on: the block is ordered on it
    return torch.cuda.caching_allocator_alloc(size, device, torch.cuda.current_stream(device))


def _free(ptr, device):
    torch.cuda.caching_allocator_delete(ptr)


@functools.lru_cache(maxsize=None)
def _allocator():
    import cupy
    return cupy.cuda.memory.PythonFunctionAllocator(_malloc, _free)


def _memory(x):
    """The context of a call on x: for CUDA tensors, CuPy allocating from torch."""
    if not x.is_cuda:
        return contextlib.nullcontext()
    import cupy
    return cupy.cuda.using_allocator(_allocator().malloc)


def _plain(x):
    # a tensor that requires grad refuses __dlpack__; below autograd its grad is ours to give
    return None if x is None else x.detach()


def _state_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32   # float64: CPU only


def _none_as_empty(x, like, dtype=None):
    # custom ops return a fixed list of tensors: an absent one is an empty tensor
    return like.new_empty(0, dtype=dtype or _state_dtype(like)) if x is None else x


def _empty_as_none(x):
    return None if x is None or x.numel() == 0 else x


def _kept_floats(q, v, gate, log_gate, cu_seqlens, method, keep_states):
    """The float32 elements of the ChunkStates' workspace that a forward on tensors of these
    shapes and dtypes keeps (cupy_gda._api.gpu_kept_bytes on q's GPU; 0 on the CPU)."""
    if not keep_states or q.device.type != "cuda":
        return 0
    import cupy
    from cupy_gda import _api, _checks
    B, T, H, K = (int(n) for n in q.shape)
    N = B if cu_seqlens is None else int(cu_seqlens.shape[0]) - 1
    g = gate if gate is not None else log_gate
    p = _checks.Problem(B, T, H, K, int(v.shape[3]), N, _name(q.dtype), _name(g.dtype),
                        log_gate is not None)
    with cupy.cuda.Device(q.device.index):
        return _api.gpu_kept_bytes(FN, p, method, cu_seqlens is not None) // 4


def _name(dtype):
    return str(dtype).rsplit(".", 1)[-1]          # torch.bfloat16 -> bfloat16, as NumPy's


# ---- the forward op

FN = "cupy_gda.torch.gated_attention"


@torch.library.custom_op("cupy_gda::gated_attention", mutates_args=())
def _forward_op(q: Tensor, k: Tensor, v: Tensor, gate: Optional[Tensor],
                log_gate: Optional[Tensor], scale: float, initial_state: Optional[Tensor],
                output_final_state: bool, cu_seqlens: Optional[Tensor], method: str,
                check_indices: bool, keep_states: bool
                ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(o, final state, the kept ChunkStates' workspace and flag); the state empty unless
    output_final_state, the workspace and flag empty where the call keeps none."""
    with _memory(q):
        r = cupy_gda.gated_attention(
            *map(_plain, (q, k, v, gate)), log_gate=_plain(log_gate), scale=scale,
            initial_state=_plain(initial_state), output_final_state=output_final_state,
            cu_seqlens=cu_seqlens, method=method, check_indices=check_indices,
            keep_states=keep_states)
    r = r if isinstance(r, tuple) else (r,)         # o [, final state] [, ChunkStates or None]
    ht = r[1] if output_final_state else None
    states = r[-1] if keep_states else None
    ws, flag = (None, None) if states is None else (states.workspace, states.flag)
    return (r[0], _none_as_empty(ht, q), _none_as_empty(ws, q, torch.float32),
            _none_as_empty(flag, q, torch.int32))


@_forward_op.register_fake
def _forward_fake(q, k, v, gate, log_gate, scale, initial_state, output_final_state,
                  cu_seqlens, method, check_indices, keep_states):
    B, T, H, K = q.shape
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    state_shape = (N, H, K, v.shape[3]) if output_final_state else (0,)
    floats = _kept_floats(q, v, gate, log_gate, cu_seqlens, method, keep_states)
    return (v.new_empty(v.shape), q.new_empty(state_shape, dtype=_state_dtype(q)),
            q.new_empty((floats,), dtype=torch.float32),
            q.new_empty((1 if floats else 0,), dtype=torch.int32))


def _setup_context(ctx, inputs, output):
    q, k, v, gate, log_gate, scale, initial_state, output_final_state, cu_seqlens = inputs[:9]
    _, _, ws, flag = output
    ctx.mark_non_differentiable(ws, flag)
    ctx.save_for_backward(q, k, v, gate, log_gate, initial_state, cu_seqlens, ws, flag)
    ctx.scale = scale
    ctx.output_final_state = output_final_state
    ctx.set_materialize_grads(False)     # an unused output's gradient comes as None


def _backward(ctx, do, d_final_state, _dws, _dflag):
    q, k, v, gate, log_gate, initial_state, cu_seqlens, ws, flag = ctx.saved_tensors
    if do is None:                       # the loss used only the final state
        do = v.new_zeros(v.shape)
    if not ctx.output_final_state:       # (the empty placeholder's gradient)
        d_final_state = None
    dq, dk, dv, dg, dh0 = _backward_op(q, k, v, gate, log_gate, do, ctx.scale, initial_state,
                                       d_final_state, cu_seqlens, _empty_as_none(ws),
                                       _empty_as_none(flag))
    return (dq, dk, dv, dg if gate is not None else None, dg if log_gate is not None else None,
            None, dh0 if initial_state is not None else None, None, None, None, None, None)


_forward_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the backward op

@torch.library.custom_op("cupy_gda::gated_attention_backward", mutates_args=())
def _backward_op(q: Tensor, k: Tensor, v: Tensor, gate: Optional[Tensor],
                 log_gate: Optional[Tensor], do: Tensor, scale: float,
                 initial_state: Optional[Tensor], d_final_state: Optional[Tensor],
                 cu_seqlens: Optional[Tensor], kept_workspace: Optional[Tensor] = None,
                 kept_flag: Optional[Tensor] = None
                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dgate of the gate given, dinitial_state: empty without initial_state);
    kept_workspace and kept_flag: the forward op's (keep_states), or None."""
    states = (None if kept_workspace is None
              else cupy_gda.ChunkStates(_plain(kept_workspace), _plain(kept_flag)))
    with _memory(q):
        # check_indices=False: these are the forward's offsets (checked there unless the caller
        # said not to), unchanged since (autograd's saved-tensor version check); a check here
        # would sync, which CUDA-graph capture forbids
        r = cupy_gda.gated_attention_backward(
            *map(_plain, (q, k, v, gate)), do=_plain(do), log_gate=_plain(log_gate),
            scale=scale, initial_state=_plain(initial_state),
            d_final_state=_plain(d_final_state), cu_seqlens=cu_seqlens, check_indices=False,
            states=states)
    return r.dq, r.dk, r.dv, r.dgate, _none_as_empty(r.dinitial_state, q)


@_backward_op.register_fake
def _backward_fake(q, k, v, gate, log_gate, do, scale, initial_state, d_final_state, cu_seqlens,
                   kept_workspace=None, kept_flag=None):
    g = gate if gate is not None else log_gate
    h0_shape = (0,) if initial_state is None else initial_state.shape
    return (q.new_empty(q.shape), q.new_empty(q.shape), v.new_empty(v.shape),
            g.new_empty(g.shape), q.new_empty(h0_shape, dtype=_state_dtype(q)))


# ---- across ranks (cupy_gda.distributed)

class _Distributed(torch.autograd.Function):
    """cupy_gda.distributed's forward and backward as one autograd node a rank."""

    @staticmethod
    def forward(ctx, q, k, v, g, initial_state, cu_seqlens, log, scale, final, group):
        from cupy_gda import distributed
        gate, log_gate = (None, g) if log else (g, None)
        with _memory(q):
            o, ht, s_in = distributed.gated_attention(
                *map(_plain, (q, k, v, gate)), comm=group, log_gate=_plain(log_gate),
                scale=scale, initial_state=_plain(initial_state), output_final_state=True,
                cu_seqlens=cu_seqlens, keep_states=True)
        ctx.save_for_backward(q, k, v, g, initial_state, cu_seqlens)
        ctx.s_in = s_in        # the states entering this slice: the backward needs no forward
        ctx.log, ctx.scale, ctx.final, ctx.group = log, scale, final, group
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, d_final_state):
        import torch.distributed as dist
        from cupy_gda import distributed
        q, k, v, g, initial_state, cu_seqlens = ctx.saved_tensors
        if do is None:
            do = v.new_zeros(v.shape)
        dht = None
        if ctx.final:            # each rank's loss used the same final state: theirs summed
            N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
            dht = (q.new_zeros((N, q.shape[2], q.shape[3], v.shape[3]), dtype=_state_dtype(q))
                   if d_final_state is None else d_final_state.contiguous().clone())
            dist.all_reduce(dht, group=ctx.group)
        gate, log_gate = (None, g) if ctx.log else (g, None)
        with _memory(q):
            r = distributed.gated_attention_backward(
                *map(_plain, (q, k, v, gate)), comm=ctx.group, do=_plain(do),
                log_gate=_plain(log_gate), scale=ctx.scale, initial_state=_plain(initial_state),
                d_final_state=dht, cu_seqlens=cu_seqlens, states=ctx.s_in)
        return (r.dq, r.dk, r.dv, r.dgate, r.dinitial_state, None, None, None, None, None)
