"""GPU launches: tile choice, compile defines and launch arguments of each kernel family.

Everything here that does not touch a device (tile choice, defines) is plain Python, so it is
unit-tested without a GPU.
"""
import numpy as np

from cupy_gda import _compile

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2}
SMEM_STATIC = 48 * 1024
NULL = np.uint64(0)      # a null pointer argument
POISON = False           # tests set this: internally allocated outputs start as NaN


def _pow2_at_least(n):
    p = 1
    while p < n:
        p *= 2
    return p


def _round_up(n, m):
    return -(-n // m) * m


def recurrent_tiles(K, V):
    """(KT, BV, TC) for gda_recurrent_fwd: at most 4 state rows per lane, <= 256 threads,
    staging tiles within the 48 KB of static shared memory."""
    KT = min(32, _pow2_at_least(-(-K // 4)))
    cols = 32 // KT                                     # columns one warp covers
    BV = min(_round_up(V, cols), 256 // KT)
    KP = _round_up(K, KT)
    TC = 32
    while (3 * TC * KP + 2 * TC * BV) * 4 > SMEM_STATIC:
        TC //= 2
    return KT, BV, TC


def step_tiles(K, V, aligned16):
    """(KW, VEC) for gda_step: 16-byte state accesses where V and the state's address allow."""
    VEC = 4 if V % 4 == 0 and aligned16 else 2 if V % 2 == 0 else 1
    KW = 4 if K <= 32 else 8 if K <= 128 else 16
    return KW, VEC


def recurrent_defines(p, seq_int64):
    KT, BV, TC = recurrent_tiles(p.K, p.V)
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), SEQ_INT64=int(seq_int64), KT=KT, BV=BV, TC=TC)


def step_defines(p, idx_int64, aligned16):
    KW, VEC = step_tiles(p.K, p.V, aligned16)
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), IDX_INT64=int(idx_int64), KW=KW, VEC=VEC)


def empty(shape, dtype):
    import cupy
    x = cupy.empty(shape, dtype)
    if POISON:
        x.fill(np.nan)
    return x


def _ptr(x):
    return NULL if x is None else x


def recurrent_forward(p, q, k, v, g, scale, h0, cu_seqlens, want_final, out):
    """o [B, T, H, V] (and the final state) by gda_recurrent_fwd; arrays are contiguous CuPy."""
    d = recurrent_defines(p, cu_seqlens is not None and cu_seqlens.dtype == np.int64)
    o = out if out is not None else empty((p.B, p.T, p.H, p.V), v.dtype)
    ht = empty((p.N, p.H, p.K, p.V), np.float32) if want_final else None
    NV = -(-p.V // d["BV"])
    grid = p.N * p.H * NV
    if grid:
        fn = _compile.get_function("gda_recurrent_fwd", d)
        fn((grid,), (d["KT"] * d["BV"],),
           (q, k, v, g, o, _ptr(h0), _ptr(ht), _ptr(cu_seqlens), np.int64(p.T), np.int32(p.H),
            np.int32(NV), np.float32(scale)))
    return o, ht


def step(p, q, k, v, g, state, scale, state_indices, out):
    """o [B, H, V] by gda_step; ``state`` is updated in place."""
    aligned16 = state.data.ptr % 16 == 0
    d = step_defines(p, state_indices is not None and state_indices.dtype == np.int64, aligned16)
    o = out if out is not None else empty((p.B, p.H, p.V), v.dtype)
    NV = -(-p.V // (32 * d["VEC"]))
    grid = p.B * p.H * NV
    if grid:
        fn = _compile.get_function("gda_step", d)
        fn((grid,), (d["KW"] * 32,),
           (q, k, v, g, o, state, _ptr(state_indices), np.int32(p.H), np.int64(p.N),
            np.int32(NV), np.float32(scale)))
    return o
