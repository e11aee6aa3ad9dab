"""The forward from the backward's stages (chunk_bwd.ForwardPlan) against gda_chunk_fwd
(chunk.plan), bfloat16 inputs, over key and value widths and batch shapes: the measurements
behind _dispatch.planes_forward (docs/perf-notes.md, v24).

    python -m scripts.sweep_planes_forward
        A line a shape: the median device ms of each (as the benchmark times a call), their ratio,
        the guard's flag and the largest difference of the two outputs.
"""
import numpy as np

from cupy_gda import _verify
from scripts.profile_chunk_bwd import inputs, median_ms

KV = ((128, 128), (128, 256), (128, 512), (192, 192), (192, 512), (256, 256), (256, 512))
BTH = ((8, 4096, 4), (2, 4096, 4), (8, 1024, 4), (4, 512, 8), (1, 2048, 2))


def main():
    import cupy
    from cupy_gda import chunk, chunk_bwd
    from cupy_gda._checks import Problem
    print(f"{'B':>2s} {'T':>5s} {'H':>3s} {'K':>4s} {'V':>4s}  {'chunk_fwd':>9s} {'planes':>9s}  "
          f"planes/chunk_fwd  flag  max |diff|", flush=True)
    for K, V in KV:
        for B, T, H in BTH:
            args, _ = inputs(_verify.Case(B, T, H, K, V, dtype="bfloat16", init=False))
            p = Problem(B, T, H, K, V, B, "bfloat16", "float32", False)
            fp, cf = chunk_bwd.ForwardPlan(p), chunk.plan(p, False)
            flag = cupy.zeros((1,), np.int32)
            x = (*(args[n] for n in ("q", "k", "v", "gate")), 1.0, None, None, False, None)
            diff = float(abs(fp(*x, flag=flag)[0].astype("float32")
                             - cf(*x)[0].astype("float32")).max())
            tc, tp = median_ms(lambda: cf(*x)), median_ms(lambda: fp(*x))
            print(f"{B:2d} {T:5d} {H:3d} {K:4d} {V:4d}  {tc:9.3f} {tp:9.3f}  {tp / tc:16.2f}  "
                  f"{int(flag[0]):4d}  {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
