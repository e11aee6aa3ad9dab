"""Device measurement behind _dispatch's table: median device time (CUDA events, 20 calls after a
warm-up) of method="chunk" and method="recurrent" over T at fixed B*H, per head dimension.
Prints one line per (K, B*H, T): both times and the faster method.

    python3 scripts/crossover.py [--quick]
"""
import sys

import cupy
import numpy as np

import cupy_gda
from probe import inputs


def device_ms(fn, reps=20):
    fn()
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    ts = []
    for _ in range(reps):
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(e0, e1))
    return float(np.median(ts))


def main():
    quick = "--quick" in sys.argv
    Ts = (64, 128, 256, 512, 1024, 2048, 4096) if not quick else (128, 256, 512, 1024, 2048)
    print(f"{'K':>4} {'B':>3} {'H':>3} {'T':>6} {'chunk ms':>9} {'recur ms':>9}  faster")
    for K in (24, 64, 128):
        for B, H in ((1, 8), (1, 16), (4, 8), (4, 16), (8, 16)):
            for T in Ts:
                q, k, v, g = inputs(B, T, H, K, K)
                o = cupy.empty_like(v)
                t = {m: device_ms(lambda m=m: cupy_gda.gated_attention(q, k, v, g, method=m, out=o))
                     for m in ("chunk", "recurrent")}
                best = min(t, key=t.get)
                print(f"{K:>4} {B:>3} {H:>3} {T:>6} {t['chunk']:>9.4f} {t['recurrent']:>9.4f}  {best}",
                      flush=True)


if __name__ == "__main__":
    main()
