"""The forward from the backward's stages (chunk_bwd.ForwardPlan) against gda_chunk_fwd
(chunk.plan), bfloat16 inputs, over key and value widths and batch shapes: the measurements
behind _dispatch.planes_forward and chunk_bwd.SCAN_O_FROM (docs/perf-notes.md, v24, v45).

    python -m scripts.sweep_planes_forward
        A line a shape: the median device ms of gda_chunk_fwd, of the plan as chunk_bwd's rules
        build it ("planes": scan_o where SCAN_O_FROM lets it, else pack, the scan and dv's entry)
        and of the plan with scan_o at any number of blocks ("scan_o": SCAN_O_FROM 0; '-' where
        scan_o does not fit, '=' where the rule's plan runs it already), each plan's ratio to
        gda_chunk_fwd, scan_o's blocks an SM, which one method="auto" runs today
        (_dispatch.planes_forward: "planes" or "chunk_fwd"), the guard's flag and the largest
        difference of the plans' outputs from gda_chunk_fwd's.
    python -m scripts.sweep_planes_forward --long
        The same over long sequences of few sequence-heads (LONG), where the scan's blocks are
        fewer than the SMs and gda_chunk_fwd splits each sequence into segments: the shapes
        behind _dispatch.PLANES_FORWARD_CHAIN (the rule keeps them to gda_chunk_fwd from 4097
        rows a chain, not measured).
    python -m scripts.sweep_planes_forward --kv 128x128,128x256
        Only those key and value widths (of either list).
"""
import sys

import numpy as np

from cupy_gda import _verify
from scripts.profile_chunk_bwd import inputs, median_ms

KV = ((128, 128), (128, 256), (128, 512), (192, 192), (192, 512), (256, 256), (256, 512))
BTH = ((8, 4096, 4), (8, 4096, 16), (2, 4096, 4), (8, 1024, 4), (4, 512, 8), (1, 2048, 2))
LONG = (((128, 256), (256, 256), (256, 512)), ((1, 8192, 4), (1, 32768, 4), (2, 16384, 4),
                                                (1, 65536, 2)))


def lean_plan(p):
    """The ForwardPlan of Problem ``p`` with scan_o at any number of blocks (SCAN_O_FROM 0 while
    it is built)."""
    from cupy_gda import chunk_bwd
    scan_o_from, chunk_bwd.SCAN_O_FROM = chunk_bwd.SCAN_O_FROM, 0.0
    try:
        return chunk_bwd.ForwardPlan(p)
    finally:
        chunk_bwd.SCAN_O_FROM = scan_o_from


def main(argv=None):
    import cupy
    from cupy_gda import _dispatch, chunk, chunk_bwd
    from cupy_gda._checks import Problem
    sms = chunk_bwd.device_limits()[0]
    print(f"(SCAN_O_FROM {chunk_bwd.SCAN_O_FROM}, {sms} SMs)")
    print(f"{'B':>2s} {'T':>5s} {'H':>3s} {'K':>4s} {'V':>4s}  {'chunk_fwd':>9s} {'planes':>15s} "
          f"{'scan_o':>15s}  blocks/SM  auto       flag  max |diff|", flush=True)
    argv = sys.argv[1:] if argv is None else argv
    kv, bth = LONG if "--long" in argv else (KV, BTH)
    if "--kv" in argv:
        kv = tuple(tuple(int(n) for n in w.split("x"))
                   for w in argv[argv.index("--kv") + 1].split(","))
    for K, V in kv:
        for B, T, H in bth:
            args, _ = inputs(_verify.Case(B, T, H, K, V, dtype="bfloat16", init=False))
            p = Problem(B, T, H, K, V, B, "bfloat16", "float32", False)
            x = (*(args[n] for n in ("q", "k", "v", "gate")), 1.0, None, None, False, None)
            cf = chunk.plan(p, False)
            ref = cf(*x)[0].astype("float32")
            tc = median_ms(lambda: cf(*x))
            flag = cupy.zeros((1,), np.int32)
            diff = 0.0

            def timed(fp):
                nonlocal diff
                diff = max(diff, float(abs(fp(*x, flag=flag)[0].astype("float32") - ref).max()))
                tp = median_ms(lambda: fp(*x))
                return f"{tp:8.3f} ({tp / tc:4.2f})"
            fp = chunk_bwd.ForwardPlan(p)
            planes = timed(fp)
            if fp.scan_o:                               # (the rule's plan runs scan_o already)
                scan_o = "="
            else:
                lean = lean_plan(p)
                scan_o = timed(lean) if lean.scan_o else "-"
            blocks = B * H * chunk_bwd.tiles(V) / sms
            auto = "planes" if _dispatch.planes_forward(p) else "chunk_fwd"
            print(f"{B:2d} {T:5d} {H:3d} {K:4d} {V:4d}  {tc:9.3f} {planes} {scan_o:>15s}  "
                  f"{blocks:9.2f}  {auto:9s}  {int(flag[0]):4d}  {diff:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
