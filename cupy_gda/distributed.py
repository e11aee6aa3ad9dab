"""Sequence parallelism (issue 16): one sequence split over ranks, in rank order.

Each rank holds a contiguous slice ``[B, T_r, H, *]`` of the sequence and calls these functions
with its slice and a communicator (SPMD). The recurrence splits exactly, as a scan over pairs:

1. local: the rank runs its slice from a zero state (a sequence that starts in the slice, from
   its initial state) with the single-GPU kernels, and takes each sequence piece's gate product
   ``P`` (the product of its gates) and final state;
2. exchange: one all-gather of those pairs (the backward adds each piece's gradient at its start);
3. combine: every rank folds the pairs in rank order, S <- P . S + S_r (the product reset to 0
   at the rank where a sequence starts), which gives the state entering its slice, ``S_in``, and
   the whole sequence's final state; the backward folds the gradients the other way;
4. correct: the tokens of a sequence that began on an earlier rank get the incoming state's
   part, o_t += scale (q_t . G_t)^T S_in with G_t the gate product from the slice's start to t
   (the backward: the same for dq, and the terms of the gradient D entering the slice's end for
   dk, dv and the gate; docs/distributed.md has the algebra).

Every product is a running product of the gates in time order (no division, no differences of
log gates), kept in range (a piece's product as m 2^e in the exchange and the fold; the running
products anchored at the state's rows, slices.py), so gates of 0, negative, tiny or above 1 give
what the loop gives wherever it is finite (an inf gate aside: docs/distributed.md). The
corrections and the products they need are gda_slice's (cupy_gda/slices.py, on the tensor
cores; on the CPU its NumPy form), the gradient's scans in time gda_scan's (cupy_gda/scan.py; on
the CPU the loop).

Communicators (``comm``): :class:`SimulatedGroup`'s ranks for NumPy arrays (threads in one
process, so that CPU tests run the same combine code as the GPU); a
``cupy.cuda.nccl.NcclCommunicator`` for CuPy arrays; a ``torch.distributed`` process group for
PyTorch tensors (NCCL for CUDA tensors, gloo for CPU ones). The exchange runs on the arrays'
stream (CuPy's current one, or torch's).

cu_seqlens is global: the same [N + 1] offsets on every rank, into the whole sequence of
sum(T_r) tokens; with it one more all-gather, of each rank's T_r (an int64 each), comes first.
initial_state [N, H, K, V] is passed the same on every rank (the rank where a sequence starts
reads its row); the final state and dinitial_state returned are the whole call's, on every rank.
The arguments besides the slices (scale, cu_seqlens, initial_state, d_final_state, whether a
final state is asked for, B, H, K, V and the dtypes) must agree across the ranks: each rank
checks its own call before the exchange, but not the others' (that would take another).
"""
import threading

import numpy as np

import cupy_gda
from cupy_gda import _checks, convert, slices
from cupy_gda._interop import Bridge, host_array
from cupy_gda.scan import scan

__all__ = ["gated_attention", "gated_attention_backward", "SimulatedGroup"]


# ------------------------------------------------------------------------------ communicators

class SimulatedGroup:
    """``size`` ranks in one process, for NumPy arrays: ``group.rank(r)`` is rank r's
    communicator, to be used from one thread per rank (``group.run(fn)`` runs ``fn(comm)`` on
    every rank's thread and returns the results in rank order, re-raising the first error). A
    rank that raises breaks the group's barrier, so the others raise too instead of waiting."""

    def __init__(self, size, timeout=60.0):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"SimulatedGroup: size must be a positive int, got {size!r}")
        self.size = size
        self._slots = [None] * size
        self._barrier = threading.Barrier(size, timeout=timeout)

    def rank(self, r):
        return SimulatedRank(self, r)

    def run(self, fn):
        results, errors = [None] * self.size, [None] * self.size

        def body(r):
            try:
                results[r] = fn(self.rank(r))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors[r] = e
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._barrier.reset()
        first = next((e for e in errors if e is not None
                      and not isinstance(e, threading.BrokenBarrierError)), None)
        first = first or next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return results


class SimulatedRank:
    """One rank of a SimulatedGroup (``rank``, ``size``, ``allgather``)."""

    def __init__(self, group, rank):
        self.group, self.rank, self.size = group, rank, group.size

    def allgather(self, x):
        """[size, *x.shape]: every rank's x, in rank order (NumPy, or CuPy arrays of one GPU)."""
        xp = _array_module(x)
        g = self.group
        g._slots[self.rank] = xp.array(x, copy=True)
        g._barrier.wait()
        out = xp.stack(g._slots)
        g._barrier.wait()                 # every rank has read before any writes again
        return out


def _array_module(x):
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


class _Nccl:
    """A cupy.cuda.nccl.NcclCommunicator's all-gather on CuPy's current stream."""

    def __init__(self, comm):
        self.comm, self.rank, self.size = comm, comm.rank_id(), comm.size()

    def allgather(self, x):
        import cupy
        from cupy.cuda import nccl
        types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                 np.dtype(np.int64): nccl.NCCL_INT64}
        x = cupy.ascontiguousarray(x)
        out = cupy.empty((self.size, *x.shape), x.dtype)
        self.comm.allGather(x.data.ptr, out.data.ptr, x.size, types[x.dtype],
                            cupy.cuda.get_current_stream().ptr)
        return out


class _Torch:
    """A torch.distributed process group's all-gather: of CuPy arrays (CUDA tensors' calls; on
    torch's current stream, the Bridge's) or NumPy arrays (CPU tensors' calls, e.g. gloo)."""

    def __init__(self, group):
        import torch.distributed as dist
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        # (all_gather_single from torch 2.13, all_gather_into_tensor before)
        self._gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def allgather(self, x):
        import torch
        gpu = not isinstance(x, np.ndarray)
        if gpu:
            import cupy
            t = torch.from_dlpack(cupy.ascontiguousarray(x))
        else:
            t = torch.from_numpy(np.ascontiguousarray(x))
        out = t.new_empty((self.size * t.numel(),))
        self._gather(out, t.reshape(-1), group=self.group)
        out = out.reshape((self.size, *t.shape))
        if gpu:
            return cupy.from_dlpack(out)
        return out.numpy()


def _communicator(fn, comm, br):
    """The exchange of ``comm`` for a call whose arrays are ``br``'s; a TypeError names what
    each kind of array takes."""
    want = {"numpy": "a cupy_gda.distributed.SimulatedGroup rank",
            "cupy": "a cupy.cuda.nccl.NcclCommunicator (or a SimulatedGroup rank: threads on "
                    "one GPU)",
            "torch": "a torch.distributed process group"}
    lib = br.lib
    if lib in ("numpy", "cupy") and isinstance(comm, SimulatedRank):
        return comm
    if lib == "cupy" and type(comm).__name__ == "NcclCommunicator":
        return _Nccl(comm)
    if lib == "torch" and type(comm).__module__.startswith("torch.distributed"):
        return _Torch(comm)
    raise TypeError(f"{fn}: comm must be "
                    f"{want.get(lib, 'one of ' + '; '.join(f'{v} for {k}' for k, v in want.items()))}"
                    f" for {lib} arrays, got {type(comm).__module__}.{type(comm).__qualname__}")


# ------------------------------------------------------------------------------ the slice

class _Slice:
    """This rank's place in the sequence: its pieces of each sequence (local offsets), which
    sequences start and end on which rank, and the token masks of the pieces that continue a
    sequence from an earlier rank (``cont_in``) or into a later one (``cont_out``)."""

    def __init__(self, xp, c, p, cu, lens=None, index_dtype=np.int64):
        self.R, self.r, self.T = c.size, c.rank, p.T
        self.packed = cu is not None
        if not self.packed:       # every sequence over every slice: no rank owns a start or end
            self.cu = None
            self.own_start = self.own_end = xp.zeros((self.R, p.N), bool)
            self.cont_in = self.cont_out = None
            self.first = self.last = None
            return
        ends = xp.cumsum(lens)                  # lens: every rank's T_r (lengths())
        starts = ends - lens
        self.total = ends[-1]
        cu = cu.astype(index_dtype)
        at = starts[self.r]
        self.cu = (xp.clip(cu - at, 0, p.T)).astype(index_dtype)   # the pieces in this slice

        def rank_of(x):       # the rank holding token x; x = T_total: the last rank
            inside = (starts[:, None] <= x[None]) & (x[None] < ends[:, None])
            return xp.where(x == self.total, self.R - 1, xp.argmax(inside, axis=0))

        empty = cu[1:] == cu[:-1]
        start_rank = rank_of(cu[:-1])
        end_rank = xp.where(empty, start_rank, rank_of(xp.maximum(cu[1:] - 1, 0)))
        ranks = xp.arange(self.R)[:, None]
        self.own_start, self.own_end = ranks == start_rank[None], ranks == end_rank[None]
        self.first = self.last = self.cont_in = self.cont_out = None    # (no tokens here)
        if p.T:
            t = xp.arange(p.T)
            seq = xp.minimum(xp.searchsorted(self.cu[1:], t, side="right"), p.N - 1)
            self.first, self.last = seq[:1], seq[-1:]
            self.cont_in = ~self.own_start[self.r][seq]
            self.cont_out = ~self.own_end[self.r][seq]

    @staticmethod
    def lengths(xp, c, p, packed):
        """Every rank's T_r [R] (int64; an all-gather), where ``packed``, else None."""
        # (a fill kernel, not a host-to-device copy, which CUDA-graph capture would refuse)
        return c.allgather(xp.full((1,), p.T, np.int64))[:, 0] if packed else None

    def local_rows(self, xp, x, owned):
        """x [N, ...] where this rank owns the row (``owned``: own_start or own_end), else 0;
        dense: zeros (the combine carries x)."""
        if x is None:
            return None
        keep = owned[self.r].reshape((-1,) + (1,) * (x.ndim - 1))
        return xp.where(keep, x, 0).astype(x.dtype)

    def rows(self, xp, x, which):
        """The row of x [N, ...] of the first or last piece's sequence ([1, ...]); dense: x."""
        return x if not self.packed else xp.take(x, which, axis=0)

    def mask(self, xp, m, dtype):
        """A token mask [T] as a factor [1, T, 1, 1]; dense: 1 (every token continues)."""
        return 1 if m is None else m.astype(dtype)[None, :, None, None]


def _slice(fn, xp, c, p, cu, gpu):
    """This rank's _Slice; cu_seqlens' values checked against sum(T_r) first (on the host: the
    CPU path; the GPU's offsets are clamped, as with check_indices=False)."""
    lens = _Slice.lengths(xp, c, p, cu is not None)
    if cu is not None and not gpu:
        _checks.check_cu_seqlens_values(fn, host_array(cu), int(lens.sum()))
    return _Slice(xp, c, p, cu, lens)


# ------------------------------------------------------------------------------ in time

class _Ends:
    """The gates' products at the slice's two ends (slices.terms: gda_slice on the GPU, its
    NumPy form on the CPU): ``fwd`` over the first sequence piece from the slice's start,
    ``rev`` (where ``rev``, or packed) backwards over the last from its end (without cu_seqlens
    both the whole slice); and each sequence piece's product [N, H, K] as Pm 2^Pe (any length
    keeps its range): the first's and the last's (those of the pieces in between, each owning
    both its ends, count in neither fold: 1). A first piece whose sequence starts here has a
    zero entering state, and a last one ending here a zero entering gradient, so their terms
    add 0."""

    def __init__(self, xp, sl, a, V, rev):
        T = a.shape[1]
        first = last = None
        if sl.packed:                                               # [1] int64: the lengths
            first = xp.take(sl.cu, sl.first + 1)
            last = T - xp.take(sl.cu, sl.last)
        self.fwd = slices.terms(a, first, False, V)
        self.rev = slices.terms(a, last, True, V) if rev or sl.packed else None
        if not sl.packed:
            self.Pm, self.Pe = self.fwd.tot_m, self.fwd.tot_e
        else:
            n = xp.arange(sl.cu.shape[0] - 1)[:, None, None]
            self.Pm, self.Pe = (xp.where(n == sl.first, f, xp.where(n == sl.last, r, one))
                                .astype(a.dtype)
                                for f, r, one in ((self.fwd.tot_m, self.rev.tot_m, 1),
                                                  (self.fwd.tot_e, self.rev.tot_e, 0)))

    @staticmethod
    def none(xp, p, dt):
        """(Pm, Pe) of an empty slice: 1 = 1 2^0 for every sequence."""
        return xp.ones((p.N, p.H, p.K), dt), xp.zeros((p.N, p.H, p.K), dt)


def _pieces(xp, sl, G, Rin, one=1):
    """Each sequence piece's gate product [N, H, K] from the running products over the slice,
    G_t = a_0 ... a_t and Rin_t = a_t ... a_{T-1} (the JAX front end's form of _Ends.P): the
    first piece's from G, any other's from Rin (a piece inside the slice owns both ends, so
    both folds reset its P), ``one`` for an empty piece (1; 0 where G and Rin are the
    exponents of products kept as m 2^e)."""
    B, T, H, K = G.shape
    if not sl.packed:
        return G[:, -1] if T else xp.full((B, H, K), one, G.dtype)
    st, en = sl.cu[:-1], sl.cu[1:]
    if not T:
        return xp.full((st.shape[0], H, K), one, G.dtype)
    first = xp.take(G[0], xp.clip(en - 1, 0, T - 1), axis=0)
    other = xp.take(Rin[0], xp.clip(st, 0, T - 1), axis=0)
    keep = (en == st)[:, None, None]
    return xp.where(keep, one, xp.where((st == 0)[:, None, None], first, other)).astype(G.dtype)


# ------------------------------------------------------------------------------ the API

def _prepare(fn, br, q, k, v, gate, log_gate, h0, cu, scale, comm, floats):
    """Checks, then (xp, comm, Problem, compute dtype, the arrays ``floats`` in it, a = the
    gates in it)."""
    p = _checks.check_forward(fn, q, k, v, gate, log_gate, h0, cu, cpu=not br.gpu)
    scale = _checks.check_scale(fn, scale)
    c = _communicator(fn, comm, br)
    if br.gpu:
        import cupy as xp
        dt = np.dtype(np.float32)
    else:
        xp = np
        dt = np.dtype(p.cpu_dtype)
    g = gate if gate is not None else log_gate
    f = [None if x is None else _in(xp, x, dt) for x in floats]
    a = _in(xp, g, dt)
    if log_gate is not None:
        with np.errstate(under="ignore"):
            a = xp.exp(a)
    return xp, c, p, scale, dt, f, a


def _in(xp, x, dt):
    """x in the compute dtype ``dt``, C-contiguous (itself where it is already: nothing writes
    into it; half CuPy arrays to float32 by gda_convert, which CuPy's astype runs at a third of
    the copy rate)."""
    y = convert.as_float32(x) if dt == np.float32 else x.astype(dt, copy=False)
    return xp.ascontiguousarray(y)


def _fold(xp, pairs, start, reset, ranks, ldexp=None):
    """The scan over ranks, in the order ``ranks``, of (Pm, Pe, S) triples [R, N, H, K(, V)]
    (the product P = Pm 2^Pe; Pe None: 0): x <- P_r . x + S_r from ``start`` [N, H, K, V], with
    P_r taken as 0 for the sequences where ``reset[r]`` (the forward: the rank where a sequence
    starts; the backward, its ranks reversed: where it ends). P . x as 2^(Pe + d) (m . x), m 2^d
    = Pm with m in [0.5, 1): a product past float range gives the loop's x wherever that is in
    range. ``ldexp`` (xp.ldexp where None) takes the powers of 2. Returns (x entering each rank,
    x leaving it: lists in rank order; the last x)."""
    Pm, Pe, S = pairs
    ldexp = ldexp or xp.ldexp
    x = start
    entering, leaving = [None] * len(Pm), [None] * len(Pm)
    with np.errstate(all="ignore"):           # (inf and NaN are not errors: NumPy stays quiet)
        for r in ranks:
            entering[r] = x
            reset_r = reset[r][:, None, None]
            keep = xp.where(reset_r, 0, Pm[r])
            if Pe is None:
                x = keep[..., None] * x + S[r]
            else:
                m, d = xp.frexp(keep)
                e = xp.where(reset_r, 0, Pe[r]).astype(np.int32) + d
                x = ldexp(m[..., None] * x, e[..., None]) + S[r]
                x = x.astype(S.dtype, copy=False)
            leaving[r] = x
    return entering, leaving, x


def gated_attention(q, k, v, gate=None, *, comm, log_gate=None, scale=1.0, initial_state=None,
                    output_final_state=False, cu_seqlens=None, keep_states=False):
    """:func:`cupy_gda.gated_attention` over a sequence split across ranks: this rank's slice
    q, k, gate (or log_gate) [B, T_r, H, K], v [B, T_r, H, V] (T_r may be 0), and ``comm``
    (see the module). Returns this slice's o [B, T_r, H, V] in v's dtype, or (o, the whole
    sequence's final state [N, H, K, V], the same on every rank); with ``keep_states`` also
    the states entering this rank's slice [N, H, K, V] (float32; float64 for float64 NumPy
    inputs), which gated_attention_backward(states=) takes instead of recomputing them: its
    local forward pass is skipped and its exchange halves."""
    fn = "cupy_gda.distributed.gated_attention"
    br = Bridge(fn, dict(q=q, k=k, v=v, gate=gate, log_gate=log_gate, initial_state=initial_state,
                         cu_seqlens=cu_seqlens))
    with br.context():
        q, k, v, gate, log_gate, h0, cu = (br.native(x) for x in (
            q, k, v, gate, log_gate, initial_state, cu_seqlens))
        xp, c, p, scale, dt, (qf,), a = _prepare(fn, br, q, k, v, gate, log_gate, h0, cu, scale,
                                                 comm, (q,))
        sl = _slice(fn, xp, c, p, cu, br.gpu)
        h0f = None if h0 is None else h0.astype(dt, copy=False)
        # 1. local: this slice from zero (a sequence starting here, from its initial state), on
        # the inputs as they are (bfloat16 runs its own kernels: o rounds once more where the
        # correction adds to it, the math stays float32), o then in dt for the correction
        o, S = cupy_gda.gated_attention(q, k, v, gate, log_gate=log_gate, scale=scale,
                                        initial_state=sl.local_rows(xp, h0f, sl.own_start),
                                        output_final_state=True, cu_seqlens=sl.cu,
                                        check_indices=False)
        o = _in(xp, o, dt)
        ends = _Ends(xp, sl, a, p.V, False) if p.T else None
        Pm, Pe = (ends.Pm, ends.Pe) if p.T else _Ends.none(xp, p, dt)
        # 2. exchange, 3. combine
        V = p.V
        got = c.allgather(xp.concatenate([Pm[..., None], Pe[..., None], S.astype(dt)], axis=-1))
        start = (xp.zeros((p.N, p.H, p.K, V), dt) if sl.packed or h0f is None else h0f)
        entering, _, final = _fold(xp, (got[..., 0], got[..., 1], got[..., 2:]), start,
                                   sl.own_start, range(sl.R))
        s_in = entering[sl.r]
        # 4. correct the tokens whose sequence began before this slice (the products anchored
        # at S_in's rows: their range is the state's)
        if p.T:                             # (in place: o is the local pass's)
            st = ends.fwd.anchor(xp.ascontiguousarray(sl.rows(xp, s_in, sl.first)))
            ends.fwd.out(o, qf, st, scale)
        with np.errstate(over="ignore"):
            o = convert.as_dtype(o, v.dtype)
        # (the states in dt: float32, or float64 for float64 NumPy inputs)
        r = (br.back(o),) + ((br.back(final.astype(dt, copy=False)),) if output_final_state
                             else ())
        if keep_states:
            r += (br.back(s_in.astype(dt, copy=False)),)
        return r if len(r) > 1 else r[0]


def gated_attention_backward(q, k, v, gate=None, *, comm, do, log_gate=None, scale=1.0,
                             initial_state=None, d_final_state=None, cu_seqlens=None,
                             states=None):
    """:func:`cupy_gda.gated_attention_backward` over a sequence split across ranks (as
    :func:`gated_attention`): this slice's do [B, T_r, H, V]; d_final_state [N, H, K, V] the
    whole final state's gradient, the same on every rank; ``states`` the states entering this
    slice as this rank's forward kept them (gated_attention(keep_states=True)), or None (they
    are recomputed). Returns Gradients: this slice's dq, dk, dv and dgate (of the gate argument
    given), and dinitial_state (the whole call's, the same on every rank; None without an
    initial state)."""
    fn = "cupy_gda.distributed.gated_attention_backward"
    br = Bridge(fn, dict(q=q, k=k, v=v, gate=gate, log_gate=log_gate, do=do,
                         initial_state=initial_state, d_final_state=d_final_state,
                         cu_seqlens=cu_seqlens, states=states))
    with br.context():
        q, k, v, gate, log_gate, do, h0, dht, cu, kept = (br.native(x) for x in (
            q, k, v, gate, log_gate, do, initial_state, d_final_state, cu_seqlens, states))
        _checks.check_backward(fn, q, k, v, gate, log_gate, do, h0, dht, cu, cpu=not br.gpu)
        xp, c, p, scale, dt, (qf, kf, vf, dof), a = _prepare(
            fn, br, q, k, v, gate, log_gate, h0, cu, scale, comm, (q, k, v, do))
        if kept is not None:         # (what this rank's forward kept: gated_attention's)
            _checks._state(fn, "states", kept, (p.N, p.H, p.K, p.V), not br.gpu)
        sl = _slice(fn, xp, c, p, cu, br.gpu)
        N, H, K, V = p.N, p.H, p.K, p.V
        zero_state = xp.zeros((N, H, K, V), dt)
        h0f = zero_state if h0 is None else h0.astype(dt, copy=False)
        dhtf = zero_state if dht is None else dht.astype(dt, copy=False)
        # 1. local: the slice's states from zero, its gradients with none entering its end
        h0_loc = sl.local_rows(xp, h0f, sl.own_start) if sl.packed else zero_state
        dht_loc = sl.local_rows(xp, dhtf, sl.own_end) if sl.packed else zero_state
        # (on q, k, v and do as they are, the gates a: bfloat16 runs its own kernels, and dq,
        # dk, dv round once more where the corrections add to them; da is a's, in dt)
        if kept is None:
            _, S = cupy_gda.gated_attention(q, k, v, a, scale=scale, initial_state=h0_loc,
                                            output_final_state=True, cu_seqlens=sl.cu,
                                            check_indices=False)
        grads = cupy_gda.gated_attention_backward(q, k, v, a, do=do, scale=scale,
                                                  initial_state=h0_loc, d_final_state=dht_loc,
                                                  cu_seqlens=sl.cu, check_indices=False)
        dq, dk, dv = (_in(xp, g, dt) for g in grads[:3])
        da, dstart = grads[3:]
        ends = _Ends(xp, sl, a, p.V, True) if p.T else None
        Pm, Pe = (ends.Pm, ends.Pe) if p.T else _Ends.none(xp, p, dt)
        # 2. exchange: each piece's (P, gradient at its start, and S unless the forward's
        # incoming states are kept)
        parts = ([Pm[..., None], Pe[..., None], dstart.astype(dt)]
                 + ([] if kept is not None else [S.astype(dt)]))
        got = c.allgather(xp.concatenate(parts, -1))
        Pr, Dr = (got[..., 0], got[..., 1]), got[..., 2:V + 2]
        # 3. combine: the state entering this slice, the gradient entering its end, dh0
        if kept is not None:
            s_in = kept.astype(dt, copy=False)
        else:
            entering, _, _ = _fold(xp, (*Pr, got[..., V + 2:]), zero_state if sl.packed else h0f,
                                   sl.own_start, range(sl.R))
            s_in = entering[sl.r]
        # (the gradients the other way; dh0: a sequence's leaving the rank where it starts)
        d_entering, d_leaving, dh0 = _fold(xp, (*Pr, Dr), zero_state if sl.packed else dhtf,
                                           sl.own_end, reversed(range(sl.R)))
        d_in = d_entering[sl.r]
        if sl.packed:
            dh0 = zero_state
            for r in range(sl.R):
                dh0 = xp.where(sl.own_start[r][:, None, None, None], d_leaving[r], dh0)
        # 4. correct: the incoming state's and the entering gradient's terms
        if p.T:
            dq, dk, dv, da = _correct(xp, sl, scale, qf, kf, vf, dof, a, ends, s_in, d_in,
                                      h0_loc, dht_loc, (dq, dk, dv, da))
        if log_gate is not None:
            da = da * a                           # d/dlog a = a . d/da
        with np.errstate(over="ignore"):
            out = (convert.as_dtype(dq, q.dtype), convert.as_dtype(dk, q.dtype),
                   convert.as_dtype(dv, q.dtype),
                   convert.as_dtype(da, (gate if gate is not None else log_gate).dtype),
                   None if h0 is None else dh0.astype(dt, copy=False))
        return cupy_gda.Gradients(*(br.back(x) for x in out))


def _correct(xp, sl, scale, q, k, v, do, a, ends, s_in, d_in, h0_loc, dht_loc, grads):
    """The gradients' terms from S_in (the state entering the slice, for the first piece's
    tokens where its sequence began earlier) and D (the gradient entering the slice's end, for
    the last piece's tokens where its sequence goes on), docs/distributed.md:

        dq_t += scale G_t . (S_in do_t)                 dk_t += R_t . (D v_t)
        dv_t += D^T (R_t . k_t)
        da_t += G_{t-1} . c_t + R_t . e_{t-1} + R_t . G_{t-1} . rowsum(D . S_in)

    with G_t the gates' product over the slice up to t, R_t over t+1 to its end, c the reverse
    scan of scale q . (S_in do) (and the first piece's own final-state gradient at its end), e
    the forward scan of k . (D v) (from the last piece's own initial state at its start). The
    first three in place, by ``ends`` (an _Ends: gda_slice on the GPU)."""
    dq, dk, dv, da = grads
    dt = q.dtype
    S0, D = sl.rows(xp, s_in, sl.first), sl.rows(xp, d_in, sl.last)     # [B or 1, H, K, V]
    # anchored (slices.py): S0's rows over sigma and G times sigma, D's rows over tau and R
    # times tau, so c, e and the products below are the plain ones over sigma or tau, and
    # every term (a product of the two) the plain one
    S0 = ends.fwd.anchor(xp.ascontiguousarray(S0))
    D = ends.rev.anchor(xp.ascontiguousarray(D))
    m_in, m_out = sl.mask(xp, sl.cont_in, dt), sl.mask(xp, sl.cont_out, dt)
    if sl.packed:
        nxt, prv = slices.shift(xp, m_in, -1, 0), slices.shift(xp, m_out, 1, 0)
        end_in, start_out = m_in * (1 - nxt), m_out * (1 - prv)    # the pieces' edge tokens
        fin = xp.einsum("bhkv,bhkv->bhk", sl.rows(xp, dht_loc, sl.first), S0)[:, None]
        ini = xp.einsum("bhkv,bhkv->bhk", D, sl.rows(xp, h0_loc, sl.last))[:, None]
    else:                       # one piece each, the whole slice; no own initial or final state
        nxt = prv = 1
        end_in = start_out = fin = ini = 0
    # y (for c) = m_in scale q . (S_in do), z (for e) = m_out k . (D v); G over the first
    # piece, R over the last
    y, G = ends.fwd.into(dq, do, q, S0, scale, products=True)
    z, R = ends.rev.into(dk, v, k, D, 1.0, products=True)
    ends.rev.out(dv, k, D, 1.0)
    if sl.packed:
        y, z = y + end_in * fin, z + start_out * a * ini
    # c_t = y_t + a_{t+1} c_{t+1} (reversed), cut where the first piece ends; e over the last
    a_next = slices.shift(xp, a, -1, 0)
    c = scan(a_next * nxt if sl.packed else a_next, y, reverse=True)
    e = scan(a * m_out * prv if sl.packed else a, z)
    cross = xp.einsum("bhkv,bhkv->bhk", D, S0)[:, None]
    slices.gate_terms(da, G, R, c, e, m_in, m_out, start_out * ini, cross, ends.fwd.sigma)
    return dq, dk, dv, da
