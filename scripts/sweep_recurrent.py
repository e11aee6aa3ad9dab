"""Time gda_recurrent_fwd over its tiles (R rows per lane, KT*BV threads a block, TC steps
staged) at a few shapes: the data behind the tile rule in cupy_gda/_gpu.py (see
docs/perf-notes.md). Device time of the gated_attention call (crossover.device_ms: each call
queued behind a spin kernel, so host time is excluded).

    python3 scripts/sweep_recurrent.py [name ...]
"""
import itertools
import sys

import cupy

import cupy_gda
from cupy_gda import _compile, _gpu
from crossover import device_ms
from probe import inputs

SHAPES = {"seed": (2, 128, 4, 24, 24), "few24": (1, 2048, 8, 24, 24), "gla64": (4, 2048, 8, 64, 64),
          "long24": (8, 4096, 16, 24, 24), "tsweep-4k": (1, 4096, 16, 128, 128)}


def _use(tiles):
    _gpu.recurrent_tiles = lambda K, V, t=tiles: t
    _gpu._PLANS.clear()
    cupy_gda._api._FAST.clear()


def main():
    default = _gpu.recurrent_tiles
    for name in sys.argv[1:] or list(SHAPES):
        B, T, H, K, V = SHAPES[name]
        q, k, v, g = inputs(B, T, H, K, V)
        o = cupy.empty_like(v)
        want = cupy_gda.gated_attention(q, k, v, g, method="recurrent")
        best = default(K, V)
        rows = []
        for R, threads, TC in itertools.product((1, 2, 4), (64, 128, 256), (16, 32, 64)):
            KT = min(32, _gpu._pow2_at_least(-(-K // R)))
            if -(-K // (R * KT)) * R > 8 or threads < KT:
                continue
            BV = max(32 // KT, threads // KT)
            if TC * BV * (KT + 1) * 4 > 48 * 1024:
                continue
            _use((R, KT, BV, TC))
            try:
                got = cupy_gda.gated_attention(q, k, v, g, method="recurrent")
            except _compile.KernelCompileError:
                continue
            err = float(cupy.abs(got - want).max())
            ms = device_ms(lambda: cupy_gda.gated_attention(q, k, v, g, method="recurrent", out=o))
            rows.append((ms, R, KT, BV, TC, err))
        _use(best)
        _gpu.recurrent_tiles = default
        print(f"{name} (B{B} T{T} H{H} K{K} V{V}); rule picks (R, KT, BV, TC) = {best}", flush=True)
        for ms, R, KT, BV, TC, err in sorted(rows)[:8]:
            mark = " <- rule" if (R, KT, BV, TC) == best else ""
            print(f"   {ms:9.4f} ms  R={R} KT={KT:2d} BV={BV:3d} TC={TC:2d}  max|diff| {err:.1e}{mark}",
                  flush=True)
        rule = [r for r in rows if r[1:5] == best]
        if rule and rule[0] not in sorted(rows)[:8]:
            print(f"   {rule[0][0]:9.4f} ms  the rule's pick", flush=True)


if __name__ == "__main__":
    main()
