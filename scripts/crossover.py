"""Device measurement behind _dispatch's table: median device time (CUDA events, 20 calls after a
warm-up) of method="chunk" and method="recurrent" over T at fixed B*H, per head dimension.
Prints one line per (K, B*H, T): both times and the faster method.

    python3 scripts/crossover.py [--quick]
"""
import sys

import cupy

import cupy_gda
from cupy_gda import bench
from probe import inputs

_CLOCK = []


def device_ms(fn, reps=20):
    """Median device time of ``fn``'s kernels: each call between two events, queued behind a
    spin kernel that outlasts the host's part of the call (as ``cupy-gda bench`` times), so a
    call whose host time exceeds its kernels' is not timed as host time."""
    if not _CLOCK:
        _CLOCK.append(bench._CupyClock())
    return bench.measure(_CLOCK[0], fn, reps, 5.0)["ms"]


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
