"""The planes forward (chunk_bwd.ForwardPlan) or the chunked backward at one shape, a few calls,
with dv's entry by wgmma or by mma.sync (chunk_bwd.USE_WGMMA), for ncu on one of its launches
(docs/perf-notes.md, v28: the next step is this profile):

    ncu --clock-control none -k gda_chunk_bwd_dv --launch-skip 1 -c 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python -m scripts.ncu_dv 8,4096,4,256,512 bfloat16 --wgmma 1

Without a GPU it does nothing but parse its arguments (``--calls 0``).
"""
import argparse


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", help="B,T,H,K,V")
    ap.add_argument("dtype", nargs="?", default="bfloat16")
    ap.add_argument("--wgmma", type=int, choices=(0, 1), default=1, help="dv's entry by wgmma")
    ap.add_argument("--backward", action="store_true", help="the backward, not the forward")
    ap.add_argument("--calls", type=int, default=2, help="calls (ncu: skip the first launch)")
    a = ap.parse_args(argv)
    a.shape = tuple(int(x) for x in a.shape.split(","))
    if len(a.shape) != 5:
        ap.error(f"shape: B,T,H,K,V; got {a.shape}")
    return a


def main(argv=None):
    a = parse(argv)
    if a.calls == 0:
        return
    import numpy as np
    import cupy
    from cupy_gda import chunk_bwd
    from cupy_gda._checks import Problem
    B, T, H, K, V = a.shape
    chunk_bwd.USE_WGMMA = bool(a.wgmma)
    p = Problem(B, T, H, K, V, B, a.dtype, "float32", False)
    rng = np.random.default_rng(0)
    q, k = (cupy.asarray(rng.standard_normal((B, T, H, K)) / 16, np.float32).astype(a.dtype)
            for _ in range(2))
    v, do = (cupy.asarray(rng.standard_normal((B, T, H, V)), np.float32).astype(a.dtype)
             for _ in range(2))
    g = cupy.asarray(rng.uniform(0.97, 1.0, (B, T, H, K)), np.float32)
    if a.backward:
        plan = chunk_bwd.BackwardPlan(p)
        call = (q, k, v, g, do, 1.0, None, None)
    else:
        plan = chunk_bwd.ForwardPlan(p)
        call = (q, k, v, g, 1.0, None, None, False, None)
    for _ in range(a.calls):
        plan(*call)
    cupy.cuda.Device().synchronize()
    print(f"{a.calls} calls, {plan.cfg}")


if __name__ == "__main__":
    main()
