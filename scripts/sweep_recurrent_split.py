"""Time gda_recurrent_fwd over its sequence segments P at a few shapes, with the chunked
kernel's own pick beside it: the data behind recurrent_split in cupy_gda/_gpu.py (see
docs/perf-notes.md). Median of CUDA-event times of the plan's call (state pass included).

    python3 scripts/sweep_recurrent_split.py [name ...]
"""
import sys

import cupy

import cupy_gda
from cupy_gda import _gpu, bench
from crossover import device_ms
from probe import sweep_shapes

SHAPES = {"seed": (2, 128, 4, 24, 24), "K24-NH4-T1000": (1, 1000, 4, 24, 24),
          "K24-NH32-T512": (4, 512, 8, 24, 24), "K24-NH8-T2048": (1, 2048, 8, 24, 24),
          "long24": (8, 4096, 16, 24, 24), "K64-NH8-T512": (1, 512, 8, 64, 64),
          "K64-NH32-T256": (2, 256, 16, 64, 64), "gla64": (4, 2048, 8, 64, 64),
          "K128-NH4-T256": (1, 256, 4, 128, 128), "K128-NH16-T512": (1, 512, 16, 128, 128)}
PS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def main():
    sms = _gpu.device_limits()[0]
    sync = cupy.cuda.Device().synchronize
    for name, (B, T, H, K, V), (q, k, v, g), p, want in sweep_shapes(SHAPES, sys.argv[1:]):
        o = cupy.empty_like(v)
        chunk = device_ms(lambda: cupy_gda.gated_attention(q, k, v, g, method="chunk", out=o))
        pick = _gpu.recurrent_split_for(p)
        blocks = B * H * -(-V // _gpu.recurrent_defines(p, False, sms)["BV"])
        rows = []
        for P in PS:
            if (P > 1 and T < 8 * P) or blocks * P > 8 * sms:
                continue
            plan = _gpu.RecurrentPlan(p, False, P)
            got, _ = plan(q, k, v, g, 1.0, None, None, False, None)
            err = float(cupy.abs(got - want).max())
            ms = device_ms(lambda: plan(q, k, v, g, 1.0, None, None, False, o))
            host = bench.host_times(lambda: plan(q, k, v, g, 1.0, None, None, False, o), sync, 1, 200)
            rows.append((ms, P, blocks * P, err, host[0]))
        print(f"{name} (B{B} T{T} H{H} K{K} V{V}): chunk {chunk:.4f} ms ({_gpu.chunk_split_for(p)});"
              f" recurrent_split picks P = {pick}", flush=True)
        for ms, P, nb, err, host in sorted(rows):
            mark = " <- pick" if P == pick else ""
            print(f"   {ms:9.4f} ms  P={P:2d}  {nb:5d} blocks ({nb / sms:.2f} a SM)  host {host:.4f} ms"
                  f" a call  max|diff| {err:.1e}{mark}", flush=True)


if __name__ == "__main__":
    main()
