"""GPU launches: tile choice, compile defines and launch arguments of each kernel family.

Everything here that does not touch a device (tile choice, defines) is plain Python, so it is
unit-tested without a GPU.
"""
import ctypes
import threading

import numpy as np

from cupy_gda import _compile, _dispatch

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2}
POISON = False           # tests set this: internally allocated outputs start as NaN
UNROLL = 4               # steps of gda_recurrent_fwd's time loop unrolled (scripts/sweep_recurrent.py)


def _pow2_at_least(n):
    p = 1
    while p < n:
        p *= 2
    return p


def _round_up(n, m):
    return -(-n // m) * m


def _lanes(K, V, R, threads):
    """(KT, BV): KT lanes a value column hold its K rows, R a lane; blocks of about ``threads``."""
    KT = min(32, _pow2_at_least(-(-K // R)))
    cols = 32 // KT                                     # columns one warp covers
    return KT, min(_round_up(V, cols), max(cols, threads // KT))


def _register_tc(K, R, KT, BV):
    """TC of the register-staged kernel: up to 32 steps, at most 8 prefetched q/k/g and 8 v
    elements a thread (registers), one set in 100 KB."""
    TC = 32
    while TC > 1 and (TC * K > 8 * KT * BV or TC > 8 * KT      # prefetch: EK, EV <= 8
                      or recurrent_smem(K, R, KT, BV, TC) > 100 * 1024):
        TC //= 2
    return TC


SEGMENT_STEPS = 64       # gda_recurrent_fwd's sequence segments: at least this many steps each
RECURRENT_WARPS = 12     # and blocks of at most this many warps a SM in all (at least one block)
THREAD_REGS = 128        # registers a thread of gda_recurrent_fwd takes, about (of 65536 a SM)


def _segments(K, V, KT, BV, NH, L, itemsize, sms):
    """recurrent_split for given lanes (KT, BV)."""
    blocks = NH * -(-V // BV)
    per_sm = max(1, RECURRENT_WARPS // (KT * BV // 32))
    P = min(per_sm * sms // max(blocks, 1), int(L) // SEGMENT_STEPS,
            1 + int(L) * itemsize // (4 * (V + 1)))
    return P if P >= 3 else 1


def recurrent_tiles(K, V, NH=None, L=None, itemsize=4, sms=132, smem_max=227 * 1024, staged=False):
    """(R, KT, BV, TC) for gda_recurrent_fwd, by the sweeps in docs/perf-notes.md
    (scripts/sweep_recurrent.py on the H200, 2026-11-30).

    Without the grid (``NH`` sequence-heads of mean length ``L``), or where the inputs are not
    ``staged`` by cp.async (recurrent_async: float32, multiplicative gate, K and V multiples of 4),
    the grid-free rule: R state rows a lane 4 for K >= 64 (fewest instructions per element), else
    2; KT lanes a column hold the K rows; blocks of 256 threads for K >= 64, else 128; TC by
    _register_tc. Staged, the rule depends on W, the warps a SM of that rule's grid in its
    segments (recurrent_split):
    - K <= 32, W < 1, or W < 2 with segments of <= 128 steps (the GPU mostly idle: a step's
      latency is the time): R = 1, TC = 64.
    - K <= 32, W >= 16, or segments of >= 256 steps that stay so in R = 4's own segments (or
      were segments already) (work, not latency): R = 4 in blocks of 64 threads, or of 128 with
      TC = 64 where K > 16, V % 16 == 0 and W >= 12.
    - K 33..64, W < 6: R = 2 (KT = 32: twice the warps).
    TC staged: the largest of that (else 32) down to 1 with two sets in 100 KB, the partial sums
    in the static 48 KB, both in ``smem_max`` bytes (a block's opt-in limit), and the blocks a SM
    needs (at most the registers' 512 / threads) in one SM (smem_max + 1 KB, 1 KB a block)."""
    R, threads = (4, 256) if K >= 64 else (2, 128)
    KT, BV = _lanes(K, V, R, threads)
    if NH is None or not staged or K % 4 or V % 4:
        return R, KT, BV, _register_tc(K, R, KT, BV)
    P = _segments(K, V, KT, BV, NH, L, itemsize, sms)
    W = NH * P * -(-V // BV) * KT * BV / 32 / sms
    TC = 32
    if K <= 32 and (W < 1 or W < 2 and int(L) // P <= 128):
        R, threads, TC = 1, 128, 64
    elif K <= 32 and (W >= 16 or int(L) // P >= 256 and (
            P > 1 or int(L) // _segments(K, V, *_lanes(K, V, 4, 64), NH, L, itemsize, sms) >= 256)):
        R, threads = 4, 64
        if K > 16 and V % 16 == 0 and W >= 12:
            threads, TC = 128, 64
    elif 32 < K <= 64 and W < 6:
        R = 2
    KT, BV = _lanes(K, V, R, threads)
    P = _segments(K, V, KT, BV, NH, L, itemsize, sms)
    need = min(-(-NH * P * -(-V // BV) // sms), max(1, 65536 // (THREAD_REGS * KT * BV)))
    if BV % 4:                                          # no cp.async: the register rule's TC
        return R, KT, BV, _register_tc(K, R, KT, BV)
    while TC > 1 and (recurrent_smem(K, R, KT, BV, TC, 1) > 100 * 1024
                      or TC * BV * (KT + 1) * 4 > 48 * 1024
                      or recurrent_smem(K, R, KT, BV, TC, 1) + TC * BV * (KT + 1) * 4 > smem_max
                      or need * (recurrent_smem(K, R, KT, BV, TC, 1) + TC * BV * (KT + 1) * 4 + 1024)
                      > smem_max + 1024):
        TC //= 2
    return R, KT, BV, TC


def recurrent_split(K, V, NH, L, itemsize=4, sms=132, smem_max=227 * 1024, staged=False):
    """P, the sequence segments of gda_recurrent_fwd (scripts/sweep_recurrent_split.py, H200).

    A block's time is the latency of its dependent steps, so where the grid (N*H*V/BV blocks)
    leaves the SMs idle, each sequence runs in P segments at once after a state pass over the
    first P - 1 (S and gate products only). As many as make max(1, RECURRENT_WARPS // warps a
    block) blocks a SM (more only queue behind each other), with at least SEGMENT_STEPS steps of
    the mean length ``L`` each and a workspace, (P - 1) K (V + 1) floats per sequence-head, no
    larger than q (``itemsize`` bytes an element). Never 2: two segments run as many dependent
    steps as one (half in the state pass, half in the full pass), plus a launch. The lanes are
    recurrent_tiles' for the same arguments."""
    R, KT, BV, TC = recurrent_tiles(K, V, NH, L, itemsize, sms, smem_max, staged)
    return _segments(K, V, KT, BV, NH, L, itemsize, sms)


def recurrent_smem(K, R, KT, BV, TC, dbuf=0):
    """Dynamic shared memory bytes of gda_recurrent_fwd (mirrors the kernel's layout; ``dbuf``:
    two sets of staged inputs)."""
    KP = _round_up(K, R * KT)
    return (1 + dbuf) * (3 * TC * KP + TC * BV) * 4   # plus TC * BV * (KT + 1) floats static


def recurrent_staged(p):
    """Whether Problem ``p``'s inputs allow gda_recurrent_fwd's cp.async staging: float32, a
    multiplicative float32 gate, K and V multiples of 4 (recurrent_async adds the tiles' terms)."""
    return (p.dtype == "float32" and p.g_dtype == "float32" and not p.log_gate
            and p.K % 4 == 0 and p.V % 4 == 0)


def recurrent_async(p, tiles):
    """1 where gda_recurrent_fwd stages by cp.async into two sets (ASYNC_COPY): recurrent_staged,
    BV a multiple of 4, and two sets in 100 KB."""
    R, KT, BV, TC = tiles
    return int(recurrent_staged(p) and BV % 4 == 0
               and recurrent_smem(p.K, R, KT, BV, TC, 1) <= 100 * 1024)


CHUNK_BVS = (64, 32, 16, 8)
CHUNK_THREADS = 256      # gda_chunk_fwd's NT: 8 warps, a pair per sub-block


def chunk_smem(K, BV, dbuf=0):
    """Dynamic shared memory bytes of gda_chunk_fwd (mirrors the kernel's SM_* layout; ``dbuf``:
    two sets of staged q, g, k, v)."""
    KP = _round_up(K, 16)
    QS, KS, VS, WS, BT = KP + 4, KP + 8, BV + 8, 68, 64
    return 4 * ((1 + dbuf) * (2 * BT * QS + BT * KS + BT * VS) + 96 * QS + KP * VS + BT * WS + 5 * KP)


def chunk_dbuf(p, BV, smem_max):
    """1 where gda_chunk_fwd double-buffers its staged inputs: the cp.async path (float32,
    multiplicative gate, K and V multiples of 4) and room for two sets in ``smem_max`` bytes."""
    return int(p.dtype == "float32" and p.g_dtype == "float32" and not p.log_gate
               and p.K % 4 == 0 and p.V % 4 == 0 and chunk_smem(p.K, BV, 1) <= smem_max)


SEGMENT_CHUNKS = 2       # gda_chunk_fwd's sequence segments: at least this many chunks each


def chunk_split(K, V, NH, L, itemsize=4, sms=132, smem_max=227 * 1024):
    """(BV, P) for gda_chunk_fwd, or None when K is over CHUNK_MAX_K or nothing fits.

    BV: the widest value tile (at most 64, a multiple of 8) that fits in ``smem_max`` bytes of
    shared memory. P: sequence segments (chunks of one sequence run P at a time, after a state
    pass over the first P - 1), as many as fill the ``sms`` SMs once with one block each, with
    at least SEGMENT_CHUNKS chunks of the mean length ``L`` each and a workspace, (P - 1) K (V + 1)
    floats per sequence-head, no larger than q (``itemsize`` bytes an element). Only then, while
    the grid has fewer than 3/4 of a block per SM, narrower value tiles (each recomputes the
    chunk's scores, so narrower costs work where a segment costs only its state pass)."""
    if K > _dispatch.CHUNK_MAX_K:
        return None
    fits = [b for b in CHUNK_BVS if chunk_smem(K, b) <= smem_max]
    if not fits:
        return None
    L = int(L)
    BV = min(fits[0], _round_up(V, 8))
    blocks = NH * -(-V // BV)
    P = max(1, min(sms // blocks, -(-L // 64) // SEGMENT_CHUNKS, 1 + L * itemsize // (4 * (V + 1))))
    while BV > 16 and NH * -(-V // BV) * P < 0.75 * sms:
        BV = max(16, _round_up(BV // 2, 8))
    return BV, P


def step_tiles(K, V, align):
    """(KW, VEC) for gda_step: VEC*4-byte state accesses where V and the state's address
    alignment ``align`` (bytes, a power of 2 up to 16) allow."""
    VEC = next(n for n in (4, 2, 1) if V % n == 0 and align % (4 * n) == 0)
    KW = 4 if K <= 32 else 8 if K <= 128 else 16
    return KW, VEC


def alignment(ptr):
    """The largest power of 2 up to 16 that divides ``ptr``."""
    return next(a for a in (16, 8, 4, 2, 1) if ptr % a == 0)


def recurrent_defines(p, seq_int64, sms=132, smem_max=227 * 1024):
    """gda_recurrent_fwd's defines for Problem ``p`` on a GPU of ``sms`` SMs and ``smem_max``
    bytes of opt-in shared memory a block."""
    R, KT, BV, TC = tiles = recurrent_tiles(p.K, p.V, p.N * p.H, _dispatch.mean_len(p),
                                            _ITEMSIZE[p.dtype], sms, smem_max, recurrent_staged(p))
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), SEQ_INT64=int(seq_int64), R=R, KT=KT, BV=BV, TC=TC,
                UNROLL=UNROLL, ASYNC_COPY=recurrent_async(p, tiles))


def recurrent_split_for(p):
    """recurrent_split for Problem ``p`` on the current device."""
    return recurrent_split(p.K, p.V, p.N * p.H, _dispatch.mean_len(p), _ITEMSIZE[p.dtype],
                           *device_limits(), recurrent_staged(p))


def chunk_split_for(p):
    """chunk_split for Problem ``p`` on the current device."""
    return chunk_split(p.K, p.V, p.N * p.H, _dispatch.mean_len(p), _ITEMSIZE[p.dtype], *device_limits())


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def chunk_defines(p, seq_int64, BV, dbuf=0):
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), SEQ_INT64=int(seq_int64), BV=BV, DBUF=dbuf)


def step_defines(p, idx_int64, align):
    KW, VEC = step_tiles(p.K, p.V, align)
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), IDX_INT64=int(idx_int64), KW=KW, VEC=VEC)


def chunk_fits(p):
    """Whether gda_chunk_fwd can run Problem ``p`` on the current device."""
    return chunk_split_for(p) is not None


def device_limits():
    """(SM count, opt-in shared memory bytes per block) of the current device."""
    import cupy
    dev = cupy.cuda.Device()
    lim = _LIMITS.get(dev.id)
    if lim is None:
        a = dev.attributes
        lim = _LIMITS[dev.id] = (a["MultiProcessorCount"], a["MaxSharedMemoryPerBlockOptin"])
    return lim


_LIMITS = {}


def empty(shape, dtype):
    import cupy
    x = cupy.ndarray(shape, dtype)
    if POISON:
        x.fill(np.nan)
    return x


def _ptr(x):
    return 0 if x is None else x.data.ptr


class Launch:
    """One kernel's launches through the driver (cuLaunchKernel) with a parameter buffer built
    once: a call writes the pointer arguments into it and launches on the current stream, where
    CuPy would pack every argument again (about 1 µs each). ``npointers`` pointer parameters
    come first, then scalars of the ctypes ``types``, their values fixed per plan (``sizes``)
    except the last one, passed per call."""

    def __init__(self, fn, grid, block, smem, npointers, types, sizes):
        from cupy.cuda import driver, get_current_stream
        self._launch, self._stream = driver.launchKernel, get_current_stream
        self.fn = fn                       # a cupy.RawKernel; keeps the module loaded
        self.ptr, self.grid, self.block, self.smem = fn.kernel.ptr, grid, block, smem
        self.ptrs = (ctypes.c_uint64 * npointers)()
        self.scalars = [t(x) for t, x in zip(types, sizes)] + [types[-1]()]
        addrs = [ctypes.addressof(self.ptrs) + 8 * i for i in range(npointers)]
        addrs += [ctypes.addressof(x) for x in self.scalars]
        self.params = (ctypes.c_void_p * len(addrs))(*addrs)
        self.lock = threading.Lock()       # one buffer: concurrent callers take turns

    def __call__(self, ptrs, last):
        stream = self._stream().ptr
        with self.lock:
            self.ptrs[:] = ptrs
            self.scalars[-1].value = last
            self._launch(self.ptr, self.grid, 1, 1, self.block, 1, 1, self.smem, stream,
                         ctypes.addressof(self.params), 0)


# the kernels' scalar parameters after their pointers: T, H, NV, P, scale after q, k, v, g, o,
# h0, ht, cu_seqlens, ws_s, ws_d (gda_recurrent_fwd and gda_chunk_fwd, and their state passes);
# H, N, NV, scale after q, k, v, g, o, state, state_indices (gda_step)
FWD_SCALARS = (ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_float)
STEP_SCALARS = (ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.c_float)


class _SegmentedPlan:
    """A forward kernel family in P sequence segments: with P > 1 a call allocates the workspace
    ((P - 1)(K V + K) floats a sequence-head) and launches the state pass first, on the same
    stream; with P = 1, one launch."""

    def _setup(self, p, kernel, defines, smem, NV, P, threads):
        self.defines, self.smem = defines, smem
        self.grid, self.block = (p.N * p.H * P * NV,), (threads,)
        sizes = (p.T, p.H, NV, P)
        fn = _compile.get_function(kernel, defines, smem)
        self.launch = Launch(fn, self.grid[0], threads, smem, 10, FWD_SCALARS, sizes)
        self.state_launch = self.ws_sizes = None
        if P > 1:
            state = kernel.replace("_fwd", "_state")
            fs = _compile.get_function(kernel, defines, smem, entry=state)
            self.state_launch = Launch(fs, p.N * p.H * (P - 1) * NV, threads, smem, 10,
                                       FWD_SCALARS, sizes)
            self.ws_sizes = (p.N * p.H * (P - 1) * p.K * p.V, p.N * p.H * (P - 1) * p.K)
        self.o_shape, self.o_dtype = (p.B, p.T, p.H, p.V), _np_dtype(p.dtype)
        self.ht_shape = (p.N, p.H, p.K, p.V)

    def __call__(self, q, k, v, g, scale, h0, cu_seqlens, want_final, out):
        """o [B, T, H, V] (and the final state); arrays are contiguous CuPy."""
        o = out if out is not None else empty(self.o_shape, self.o_dtype)
        ht = empty(self.ht_shape, np.float32) if want_final else None
        if self.grid[0]:
            ws = ws_s = ws_d = 0
            if self.state_launch is not None:       # kept alive (ws) until both are queued
                ws = empty((sum(self.ws_sizes),), np.float32)
                ws_s = ws.data.ptr
                ws_d = ws_s + 4 * self.ws_sizes[0]
            ptrs = (q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, o.data.ptr, _ptr(h0), _ptr(ht),
                    _ptr(cu_seqlens), ws_s, ws_d)
            if ws_s:
                self.state_launch(ptrs, scale)
            self.launch(ptrs, scale)
        return o, ht


class RecurrentPlan(_SegmentedPlan):
    """gda_recurrent_fwd compiled and sized for one Problem on the current device: a call costs
    one allocation per output (and the workspace) and one launch (two with segments).
    ``segments`` (P) overrides recurrent_split's choice."""

    def __init__(self, p, seq_int64, segments=None):
        d = recurrent_defines(p, seq_int64, *device_limits())
        P = segments or recurrent_split_for(p)
        smem = recurrent_smem(p.K, d["R"], d["KT"], d["BV"], d["TC"], d["ASYNC_COPY"])
        self.split = (d["BV"], P)
        self._setup(p, "gda_recurrent_fwd", d, smem, -(-p.V // d["BV"]), P, d["KT"] * d["BV"])


class ChunkPlan(_SegmentedPlan):
    """gda_chunk_fwd compiled and sized for one Problem on the current device (K <= 128);
    the same call as RecurrentPlan. ``split`` (BV, P) overrides chunk_split's choice."""

    def __init__(self, p, seq_int64, split=None):
        split = split or chunk_split_for(p)
        if split is None:
            raise ValueError(f"gated_attention: method 'chunk' needs {chunk_smem(p.K, 8)} bytes "
                             f"of shared memory per block at K={p.K}; this GPU has "
                             f"{device_limits()[1]}: use method='recurrent' or 'auto'")
        BV, P = self.split = split
        dbuf = chunk_dbuf(p, BV, device_limits()[1])
        d = chunk_defines(p, seq_int64, BV, dbuf)
        self._setup(p, "gda_chunk_fwd", d, chunk_smem(p.K, BV, dbuf), -(-p.V // BV), P,
                    CHUNK_THREADS)


class StepPlan:
    """gda_step compiled and sized for one Problem on the current device."""

    def __init__(self, p, idx_int64, align):
        d = step_defines(p, idx_int64, align)
        NV = -(-p.V // (32 * d["VEC"]))
        self.grid, self.block = (p.B * p.H * NV,), (d["KW"] * 32,)
        fn = _compile.get_function("gda_step", d)
        self.launch = Launch(fn, self.grid[0], self.block[0], 0, 7, STEP_SCALARS, (p.H, p.N, NV))
        self.o_shape, self.o_dtype = (p.B, p.H, p.V), _np_dtype(p.dtype)

    def __call__(self, q, k, v, g, state, scale, state_indices, out):
        """o [B, H, V]; ``state`` is updated in place."""
        o = out if out is not None else empty(self.o_shape, self.o_dtype)
        if self.grid[0]:
            self.launch((q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, o.data.ptr, state.data.ptr,
                         _ptr(state_indices)), scale)
        return o


def _np_dtype(name):
    import cupy
    return cupy.dtype(name)


_PLANS = {}


def current_device():
    import cupy
    return cupy.cuda.runtime.getDevice()


def plan(kind, *key):
    """The memoised RecurrentPlan / ChunkPlan / StepPlan for (Problem, flags) on the current
    device."""
    full = (kind, current_device()) + key
    pl = _PLANS.get(full)
    if pl is None:
        pl = _PLANS[full] = _KINDS[kind](*key)
    return pl


_KINDS = {"recurrent": RecurrentPlan, "chunk": ChunkPlan, "step": StepPlan}
