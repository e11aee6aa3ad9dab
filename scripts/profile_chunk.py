"""Device probe: per-stage clock64 cycles of gda_chunk_fwd's block 0 (compiled with -DGDA_PROFILE,
which adds a barrier per stage), and the device time of each method, at the named shapes.

    python3 scripts/profile_chunk.py [--no-profile]
"""
import sys

import cupy

import cupy_gda
from cupy_gda import _checks, _compile, _gpu
from crossover import device_ms
from probe import inputs

SHAPES = [((8, 4096, 16, 128, 128), "float32"), ((8, 4096, 16, 128, 128), "bfloat16"),
          ((4, 2048, 8, 64, 64), "float32"), ((8, 4096, 16, 24, 24), "float32"),
          ((2, 128, 4, 24, 24), "float32")]


def main():
    for shp, dt in SHAPES:
        q, k, v, g = inputs(*shp, dtype=cupy.dtype(dt))
        o = cupy.empty_like(v)
        t = {m: device_ms(lambda m=m: cupy_gda.gated_attention(q, k, v, g, method=m, out=o), reps=10)
             for m in ("chunk", "recurrent")}
        print(shp, dt, " ".join(f"{m} {x:.4f} ms" for m, x in t.items()), flush=True)
        if "--no-profile" in sys.argv:
            continue
        B, T, H, K, V = shp
        p = _checks.Problem(B=B, T=T, H=H, K=K, V=V, N=B, dtype=dt, g_dtype="float32", log_gate=False)
        pl = _gpu.ChunkPlan(p, False)
        d = dict(_gpu.chunk_defines(p, False, _gpu.chunk_tiles(K, V, B * H)), GDA_PROFILE=1)
        fn = _compile.get_function("gda_chunk_fwd", d, pl.smem)
        NV = pl.grid[0] // (B * H)
        launch = _gpu.Launch(fn, pl.grid[0], pl.block[0], pl.smem, 8, _gpu.FWD_SCALARS, (T, H, NV))
        launch((q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, o.data.ptr, 0, 0, 0), 1.0)
        cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
