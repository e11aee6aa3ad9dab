"""Time gda_recurrent_fwd over its tiles (R rows per lane, BV columns, TC steps) at a few shapes:
the data behind the tile rule in cupy_gda/_gpu.py (see docs/perf-notes.md)."""
import itertools

import cupy
import numpy as np

import cupy_gda
from cupy_gda import _gpu
from probe import inputs

SHAPES = {"seed": (2, 128, 4, 24, 24), "gla64": (4, 2048, 8, 64, 64),
          "long24": (8, 4096, 16, 24, 24), "tsweep-4k": (1, 4096, 16, 128, 128)}


def time_ms(f, reps=20):
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    f()
    ts = []
    for _ in range(reps):
        e0.record(); f(); e1.record(); e1.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(e0, e1))
    return float(np.median(ts))


default = _gpu.recurrent_tiles
for name, (B, T, H, K, V) in SHAPES.items():
    q, k, v, g = inputs(B, T, H, K, V)
    want = cupy_gda.gated_attention(q, k, v, g)
    best = default(K, V, B * H)
    rows = []
    for R, bv_threads, U in itertools.product((1, 2, 4), (64, 128, 256), (2, 4, 8)):
        KT = min(32, _gpu._pow2_at_least(-(-K // R)))
        if -(-K // (R * KT)) * R > 8 or bv_threads < KT:
            continue
        BV = max(32 // KT, bv_threads // KT)
        TC = 32
        while TC > 1 and (TC * K > 8 * KT * BV or TC > 8 * KT):
            TC //= 2
        _gpu.recurrent_tiles = lambda *a, t=(R, KT, BV, TC): t
        _gpu.UNROLL = U
        _gpu._PLANS.clear()
        cupy_gda._api._FAST.clear()
        o = cupy_gda.gated_attention(q, k, v, g)
        err = float(cupy.abs(o - want).max())
        ms = time_ms(lambda: cupy_gda.gated_attention(q, k, v, g))
        rows.append((ms, R, KT, BV, TC, U, err))
    _gpu.recurrent_tiles = default
    _gpu._PLANS.clear()
    cupy_gda._api._FAST.clear()
    print(f"{name} (B{B} T{T} H{H} K{K} V{V}); rule picks (R, KT, BV, TC) = {best}")
    for ms, R, KT, BV, TC, U, err in sorted(rows)[:8]:
        print(f"   {ms:9.4f} ms  R={R} KT={KT:2d} BV={BV:3d} TC={TC:2d} UNROLL={U}  max|diff| {err:.1e}")
    _gpu.UNROLL = 4
