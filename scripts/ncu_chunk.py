"""Device probe for ncu's source view: one launch of gda_chunk_fwd at a named shape, compiled with
-lineinfo so that ncu maps its counters to kernels/gda_chunk_fwd.cu lines.

    ncu -k gda_chunk_fwd --section SourceCounters --import-source yes -o rep \\
        python3 scripts/ncu_chunk.py 8,4096,16,128,128 [bfloat16]
    ncu -i rep.ncu-rep --page source --print-source cuda --csv > lines.csv
"""
import sys

import cupy
import numpy as np

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
    fn(pl.grid, pl.block, (q, k, v, g, o, _gpu.NULL, _gpu.NULL, _gpu.NULL, *pl.sizes, np.float32(1.0)),
       shared_mem=pl.smem)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
