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


def launch_variant(shp, dt, arrays, build, split=None):
    """One call of the ChunkPlan for shape ``shp`` (B, T, H, K, V) on this device (or with
    ``split`` (BV, P)), its entry points swapped for the RawKernels that ``build(defines, smem,
    entry)`` returns from the plan's defines; ``arrays``: q, k, v, g, o."""
    B, T, H, K, V = shp
    p = _checks.Problem(B=B, T=T, H=H, K=K, V=V, N=B, dtype=dt, g_dtype="float32", log_gate=False)
    pl = _gpu.ChunkPlan(p, False, split)
    for launch, entry in ((pl.launch, "gda_chunk_fwd"), (pl.state_launch, "gda_chunk_state")):
        if launch is not None:
            launch.fn = build(pl.defines, pl.smem, entry)
            launch.ptr = launch.fn.kernel.ptr
    q, k, v, g, o = arrays
    pl(q, k, v, g, 1.0, None, None, False, o)
    cupy.cuda.Device().synchronize()


def main():
    for shp, dt in SHAPES:
        q, k, v, g = inputs(*shp, dtype=cupy.dtype(dt))
        o = cupy.empty_like(v)
        t = {m: device_ms(lambda m=m: cupy_gda.gated_attention(q, k, v, g, method=m, out=o), reps=10)
             for m in ("chunk", "recurrent")}
        print(shp, dt, " ".join(f"{m} {x:.4f} ms" for m, x in t.items()), flush=True)
        if "--no-profile" in sys.argv:
            continue
        launch_variant(shp, dt, (q, k, v, g, o), lambda d, smem, entry: _compile.get_function(
            "gda_chunk_fwd", dict(d, GDA_PROFILE=1), smem, entry))


if __name__ == "__main__":
    main()
