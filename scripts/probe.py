"""Device probe: per-call times of back-to-back calls, a host profile of one call, and one call
of a given shape for ncu (`python3 probe.py one 8,4096,16,24,24`)."""
import cProfile
import pstats
import sys

import cupy
import numpy as np

import cupy_gda


def inputs(B, T, H, K, V, dtype=cupy.float32):
    rng = cupy.random.default_rng(0)
    q = (rng.standard_normal((B, T, H, K), dtype=cupy.float32) / K ** 0.5).astype(dtype)
    k = (rng.standard_normal((B, T, H, K), dtype=cupy.float32) / K ** 0.5).astype(dtype)
    v = rng.standard_normal((B, T, H, V), dtype=cupy.float32).astype(dtype)
    x = rng.standard_normal((B, T, H, K), dtype=cupy.float32)
    g = cupy.exp(-cupy.logaddexp(0, -x) / 16)
    return q, k, v, g


def sweep_shapes(shapes, names):
    """For each of ``names`` (all of ``shapes`` if empty), a dict of ``shapes``: the name, its
    (B, T, H, K, V), inputs() of it, its float32 Problem (for plans built with a forced split)
    and the recurrent kernel's output (what every variant is compared with)."""
    from cupy_gda import _checks
    for name in names or list(shapes):
        B, T, H, K, V = shapes[name]
        p = _checks.Problem(B=B, T=T, H=H, K=K, V=V, N=B, dtype="float32", g_dtype="float32",
                            log_gate=False)
        q, k, v, g = inputs(B, T, H, K, V)
        yield name, shapes[name], (q, k, v, g), p, cupy_gda.gated_attention(q, k, v, g, method="recurrent")


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "time"
    SHAPES = [(2, 128, 4, 24, 24), (4, 2048, 8, 64, 64), (8, 4096, 16, 24, 24),
              (8, 4096, 16, 128, 128)]
    if which == "time":
        for shp in SHAPES:
            q, k, v, g = inputs(*shp)
            o = cupy_gda.gated_attention(q, k, v, g)
            n = 200 if shp[1] < 1000 else 5
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            ts = []
            for rep in range(5):
                e0.record()
                for _ in range(n):
                    cupy_gda.gated_attention(q, k, v, g, out=o)
                e1.record(); e1.synchronize()
                ts.append(cupy.cuda.get_elapsed_time(e0, e1) / n)
            print(shp, "per-call (back-to-back, host-bound if small) ms", np.median(ts), flush=True)
    if which == "prof":
        q, k, v, g = inputs(*SHAPES[0])
        for _ in range(10):
            cupy_gda.gated_attention(q, k, v, g)
        cupy.cuda.Device().synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(1000):
            cupy_gda.gated_attention(q, k, v, g)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    if which == "one":
        shp = tuple(int(x) for x in sys.argv[2].split(","))
        q, k, v, g = inputs(*shp)
        o = cupy_gda.gated_attention(q, k, v, g)
        cupy.cuda.Device().synchronize()
        o = cupy_gda.gated_attention(q, k, v, g)
        cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
