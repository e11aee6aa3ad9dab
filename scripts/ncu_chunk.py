"""Device probe for ncu's source view: one call of gda_chunk_fwd (and gda_chunk_state where the
shape takes segments) at a named shape, compiled by nvcc with -lineinfo from a source file kept
in .ncu/ (CuPy compiles from a temporary file that is gone before ncu imports it), so that ncu
maps its counters to the lines of that file (kernels/gda_chunk_fwd.cu after the define preamble
and common.cuh).

    ncu -k gda_chunk_fwd --section SourceCounters --import-source yes -o rep \\
        python3 scripts/ncu_chunk.py 8,4096,16,128,128 [bfloat16]
    ncu -i rep.ncu-rep --page source --print-source cuda,sass --csv > both.csv
    python3 scripts/ncu_stages.py both.csv bfloat16       # instructions by stage (the same dtype)
"""
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import cupy

from cupy_gda import _compile
from probe import inputs
from profile_chunk import launch_variant

KEPT = Path(__file__).resolve().parent.parent / ".ncu"     # sources and cubins for ncu (ignored)


def main():
    B, T, H, K, V = (int(x) for x in sys.argv[1].split(","))
    dt = sys.argv[2] if len(sys.argv) > 2 else "float32"
    q, k, v, g = inputs(B, T, H, K, V, dtype=cupy.dtype(dt))
    o = cupy.empty_like(v)

    def build(defines, smem, entry):
        text = _compile.source("gda_chunk_fwd", defines)
        stem = KEPT / f"gda_chunk_fwd-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
        if not stem.with_suffix(".cubin").is_file():
            KEPT.mkdir(exist_ok=True)
            stem.with_suffix(".cu").write_text(text)
            major, minor = cupy.cuda.Device().compute_capability
            subprocess.run([shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc", "-cubin", "-lineinfo",
                            f"-arch=sm_{major}{minor}", *_compile.OPTIONS, "-o", str(stem.with_suffix(".cubin")),
                            str(stem.with_suffix(".cu"))], check=True)
        fn = cupy.RawModule(path=str(stem.with_suffix(".cubin"))).get_function(entry)
        fn.max_dynamic_shared_size_bytes = smem
        return fn

    launch_variant((B, T, H, K, V), dt, (q, k, v, g, o), build)


if __name__ == "__main__":
    main()
