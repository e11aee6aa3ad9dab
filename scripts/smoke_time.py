"""Quick device timing of the public calls at a few shapes (median of CUDA-event timings)."""
import sys

import cupy
import numpy as np
from cupyx.profiler import benchmark

import cupy_gda

SHAPES = [(2, 128, 4, 24, 24), (4, 2048, 8, 64, 64), (8, 4096, 16, 24, 24), (8, 4096, 16, 128, 128)]


def inputs(B, T, H, K, V, dtype=cupy.float32):
    rng = cupy.random.default_rng(0)
    q = (rng.standard_normal((B, T, H, K), dtype=cupy.float32) / K ** 0.5).astype(dtype)
    k = (rng.standard_normal((B, T, H, K), dtype=cupy.float32) / K ** 0.5).astype(dtype)
    v = rng.standard_normal((B, T, H, V), dtype=cupy.float32).astype(dtype)
    x = rng.standard_normal((B, T, H, K), dtype=cupy.float32)
    g = cupy.exp(-cupy.logaddexp(0, -x) / 16)
    return q, k, v, g


for shp in SHAPES:
    q, k, v, g = inputs(*shp)
    r = benchmark(cupy_gda.gated_attention, (q, k, v, g), n_repeat=30, n_warmup=3)
    print(f"{shp} fwd gpu median {np.median(r.gpu_times) * 1e3:.4f} ms  cpu median {np.median(r.cpu_times) * 1e3:.4f} ms", flush=True)
B, H, K, V = 64, 32, 128, 128
rng = cupy.random.default_rng(1)
q, k, g = (rng.random((B, H, K), dtype=cupy.float32) for _ in range(3))
v = rng.random((B, H, V), dtype=cupy.float32)
state = rng.random((B, H, K, V), dtype=cupy.float32)
r = benchmark(lambda: cupy_gda.gated_attention_step(q, k, v, g, state=state), (), n_repeat=50, n_warmup=3)
print(f"decode {B},{H},{K},{V} gpu median {np.median(r.gpu_times) * 1e3:.4f} ms cpu {np.median(r.cpu_times) * 1e3:.4f} ms")
