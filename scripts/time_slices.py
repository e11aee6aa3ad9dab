"""Time gda_slice's kernels alone (cupy_gda/slices.py): the products entering each segment
(prods + enter), gda_slice_out and gda_slice_in, on random float32 inputs at one shape. Medians
of CUDA-event times (dist_ranks.median_ms: 7 calls after a warm-up). Run from a tree's root
(an older tree's too: PYTHONPATH=<its root>) to compare kernels in one device call.

    python -m scripts.time_slices [LABEL] [B T H K V]
"""
import sys

import numpy as np

from scripts.dist_ranks import median_ms


def main(label="this tree", B=1, T=65536, H=16, K=128, V=128):
    import cupy
    from cupy_gda import slices
    B, T, H, K, V = (int(x) for x in (B, T, H, K, V))
    rng = cupy.random.default_rng(0)
    a = rng.uniform(0.9, 1.0, (B, T, H, K), dtype=np.float32)
    x = rng.standard_normal((B, T, H, K), dtype=np.float32)
    y = rng.standard_normal((B, T, H, V), dtype=np.float32)
    st = rng.standard_normal((B, H, K, V), dtype=np.float32)
    t = slices.terms(a, None, False, V)
    anchored = hasattr(t, "anchor")            # (trees before 2026-12-02's range mend: no anchor)
    st1 = t.anchor(st) if anchored else st
    out = x.copy()
    print(f"{label}: B{B} T{T} H{H} K{K} V{V}: "
          f"gda_slice_out {median_ms(lambda: t.out(y, x, st1, 1.0)):.3f} ms, "
          f"gda_slice_in {median_ms(lambda: t.into(out, y, x, st1, 1.0)):.3f} ms, "
          f"prods+enter{'+anchor' if anchored else ''} "
          f"{median_ms(lambda: _products(slices.terms(a, None, False, V), st, anchored)):.3f} ms")


def _products(t, st, anchored):
    return t.anchor(st) if anchored else t


if __name__ == "__main__":
    main(*sys.argv[1:])
