"""Device probe for ncu's source view: one call of gda_chunk_fwd (and gda_chunk_state where the
shape takes segments) at a named shape, compiled with -lineinfo so that ncu maps its counters to
kernels/gda_chunk_fwd.cu lines.

    ncu -k gda_chunk_fwd --section SourceCounters --import-source yes -o rep \\
        python3 scripts/ncu_chunk.py 8,4096,16,128,128 [bfloat16]
    ncu -i rep.ncu-rep --page source --print-source cuda --csv > lines.csv
"""
import sys

import cupy

from cupy_gda import _compile
from probe import inputs
from profile_chunk import launch_variant


def main():
    B, T, H, K, V = (int(x) for x in sys.argv[1].split(","))
    dt = sys.argv[2] if len(sys.argv) > 2 else "float32"
    q, k, v, g = inputs(B, T, H, K, V, dtype=cupy.dtype(dt))
    o = cupy.empty_like(v)

    def build(defines, smem, entry):
        mod = cupy.RawModule(code=_compile.source("gda_chunk_fwd", defines),
                             options=_compile.OPTIONS + ("-lineinfo",))
        fn = mod.get_function(entry)
        fn.max_dynamic_shared_size_bytes = smem
        return fn

    launch_variant((B, T, H, K, V), dt, (q, k, v, g, o), build)


if __name__ == "__main__":
    main()
