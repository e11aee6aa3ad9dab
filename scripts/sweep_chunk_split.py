"""Time gda_chunk_fwd over its splits (BV value columns a block, P sequence segments) at a few
shapes, with the recurrent kernel beside it: the data behind chunk_split in cupy_gda/_gpu.py
(see docs/perf-notes.md). Median of CUDA-event times of the plan's call (state pass included).

    python3 scripts/sweep_chunk_split.py [name ...]
"""
import sys

import cupy

import cupy_gda
from cupy_gda import _gpu
from crossover import device_ms
from probe import sweep_shapes

SHAPES = {"gla64": (4, 2048, 8, 64, 64), "long24": (8, 4096, 16, 24, 24),
          "K64-NH64-T2048": (4, 2048, 16, 64, 64), "K64-NH16-T512": (2, 512, 8, 64, 64),
          "K128-NH8-T2048": (1, 2048, 8, 128, 128), "tsweep-4k": (1, 4096, 16, 128, 128),
          "tsweep-16k": (1, 16384, 16, 128, 128), "big128": (8, 4096, 16, 128, 128)}


def main():
    sms = _gpu.device_limits()[0]
    for name, (B, T, H, K, V), (q, k, v, g), p, want in sweep_shapes(SHAPES, sys.argv[1:]):
        rec = device_ms(lambda: cupy_gda.gated_attention(q, k, v, g, method="recurrent"))
        pick = _gpu.chunk_split_for(p)
        rows = []
        for BV in (64, 32, 16):
            if BV > -(-V // 8) * 8 and BV != 64:
                continue
            bv = min(BV, -(-V // 8) * 8)
            for P in (1, 2, 3, 4, 6, 8):
                if B * H * -(-V // bv) * P > 2 * sms or (P > 1 and T < 128 * P):
                    continue
                plan = _gpu.ChunkPlan(p, False, (bv, P))
                o, _ = plan(q, k, v, g, 1.0, None, None, False, None)
                err = float(cupy.abs(o - want).max())
                ms = device_ms(lambda: plan(q, k, v, g, 1.0, None, None, False, None))
                rows.append((ms, bv, P, B * H * -(-V // bv) * P, err))
        print(f"{name} (B{B} T{T} H{H} K{K} V{V}): recurrent {rec:.4f} ms; chunk_split picks "
              f"(BV, P) = {pick}", flush=True)
        for ms, bv, P, blocks, err in sorted(rows):
            mark = " <- pick" if (bv, P) == pick else ""
            print(f"   {ms:9.4f} ms  BV={bv:2d} P={P}  {blocks:4d} blocks  max|diff| {err:.1e}{mark}",
                  flush=True)


if __name__ == "__main__":
    main()
