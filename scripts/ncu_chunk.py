"""Device probe for ncu's source view: one launch of gda_chunk_fwd at a named shape, compiled with
-lineinfo so that ncu maps its counters to kernels/gda_chunk_fwd.cu lines.

    ncu -k gda_chunk_fwd --section SourceCounters --import-source yes -o rep \\
        python3 scripts/ncu_chunk.py 8,4096,16,128,128 [bfloat16]
    ncu -i rep.ncu-rep --page source --print-source cuda --csv > lines.csv
"""
import sys

import cupy

from cupy_gda import _checks, _compile, _gpu
from probe import inputs


def main():
    B, T, H, K, V = (int(x) for x in sys.argv[1].split(","))
    dt = sys.argv[2] if len(sys.argv) > 2 else "float32"
    q, k, v, g = inputs(B, T, H, K, V, dtype=cupy.dtype(dt))
    o = cupy.empty_like(v)
    p = _checks.Problem(B=B, T=T, H=H, K=K, V=V, N=B, dtype=dt, g_dtype="float32", log_gate=False)
    pl = _gpu.ChunkPlan(p, False)
    d = _gpu.chunk_defines(p, False, _gpu.chunk_tiles(K, V, B * H))
    mod = cupy.RawModule(code=_compile.source("gda_chunk_fwd", d), options=_compile.OPTIONS + ("-lineinfo",))
    fn = mod.get_function("gda_chunk_fwd")
    fn.max_dynamic_shared_size_bytes = pl.smem
    NV = pl.grid[0] // (B * H)
    launch = _gpu.Launch(fn, pl.grid[0], pl.block[0], pl.smem, 8, _gpu.FWD_SCALARS, (T, H, NV))
    launch((q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, o.data.ptr, 0, 0, 0), 1.0)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
