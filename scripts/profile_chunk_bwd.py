"""gda_chunk_bwd by stage, on the device, beside the reverse loop (docs/perf-notes.md v19-v21).

    python -m scripts.profile_chunk_bwd [NAMES] [--stages]
        NAMES: comma-separated names of SHAPES (all by default), on the benchmark's inputs. A
        line a shape: the median device ms (as the benchmark times a call) of the forward, of the
        backward by the reverse loop and by the chunked form at its chunk length, at the other one
        (32 <-> 64) and with the boundary scan the other way (SCAN), the chunked form's
        workspace, the guard's flag, and each gradient's largest difference between the two
        methods relative to its largest element (and between the two ways of the scan).
        --stages: then each launch of the chunked backward, both ways of the scan and at the
        other chunk length, its median ms over 3 calls (CUDA events around it).
        --three-terms: with chunk_bwd.DV_TWO_TERMS and ROWS_TWO_TERMS off (dv's entry, the
        scores' W and rows' S0, E in three bfloat16 terms for half inputs, not two; perf-notes
        v36, v37), in a process of its own (the plans are memoised with the defaults).
        --forward: only the forward's lines (the plans from the planes against gda_chunk_fwd,
        bfloat16 shapes), with --stages their launches.
        --scores-blocks=N,U: every gda_chunk_bwd build with SCORES_BLOCKS N and
        SCORES_DIAG_UNROLL U (scores' blocks an SM and its diagonal's unroll; 4,2 by default).
        --no-scores-prefetch: every gda_chunk_bwd build with SCORES_PREFETCH 0 (scores loads a
        key step's q, k and g itself, not from the stage copied while the step before ran: v46).
        --no-scan-o: with chunk_bwd.USE_SCAN_O off (the forward that keeps nothing from the
        scan and dv's entry, not gda_chunk_bwd_scan_o: v38), likewise.
        --no-qk-by-scores: with chunk_bwd.USE_QK_BY_SCORES off (pack, not scores, writes the
        planes of q A and k D in the backward by scan_dv and the forward that keeps its stages:
        v75's A/B).
        --no-scan-o-producer: with chunk_bwd.USE_SCAN_O_PRODUCER off (scan_o's mma.sync form
        with no warps that only copy: the A/B of v49).
        --no-scan-o-wg: with chunk_bwd.SCAN_O_WG_KEYS empty (the forward that keeps nothing runs
        scan_o by mma.sync at 128 and 256 keys too, where it takes wgmma by default: v53, v56).
        --scan-o-wg: with chunk_bwd.USE_SCAN_O_WG on (scan_o's products by wgmma on a Hopper
        GPU, where its chunks are of 64 steps and its planes of 128 or 256 keys: v39).
        --scan-o-mc: with USE_SCAN_O_WG and USE_SCAN_O_MC on (scan_o's wgmma form as clusters
        of a sequence-head's 2, 4 or 8 value tiles sharing each chunk's planes: v42).
        --scan-dv: with chunk_bwd.USE_SCAN_DV on (a backward from the planes, and the one from
        the kept forward, by gda_chunk_bwd_scan_dv where scan_dv_fits: v40).
        --scan-dv-wg: with USE_SCAN_DV and USE_SCAN_O_WG on (and there the S0 of the backward
        from the planes and of the keeping forward by scan_o's wgmma form: v41).
        --planes: every backward of bfloat16 inputs with whole tiles of K and V (K over 64) from
        the planes, where chunk_bwd.config's rule would not take them (GLA-340M, big128: the
        data for a rule with scan_dv and scan_o's S0, which replace the planes' scan), and
        scan_o and scan_dv at any number of blocks (SCAN_O_FROM, SCAN_DV_FROM 0).
    python -m scripts.profile_chunk_bwd --scan-o-sweep
        the forward that keeps nothing with scan_o (SCAN_O_FROM 0) by mma.sync, by wgmma (a
        Hopper GPU, where SCAN_O_WG can be), by wgmma as clusters (where SCAN_O_MC can be) and
        with the scan and dv's entry, over SWEEP's bfloat16 shapes (few blocks to many), to
        place SCAN_O_FROM.
    python -m scripts.profile_chunk_bwd --varlen
        the packed batches of VARLEN instead (cu_seqlens, initial states): chunk against loop.
"""
import functools
import sys
from collections import defaultdict

import numpy as np

from cupy_gda import _verify, bench

SHAPES = {"seed": (2, 128, 4, 24, 24, "float32"), "gla64": (4, 2048, 8, 64, 64, "float32"),
          "long24": (8, 4096, 16, 24, 24, "float32"), "big128": (8, 4096, 16, 128, 128, "float32"),
          "big128-bf16": (8, 4096, 16, 128, 128, "bfloat16"),
          "gla1.3b-bf16": (8, 4096, 4, 256, 512, "bfloat16"),
          "gla340m-bf16": (8, 4096, 4, 128, 256, "bfloat16"),
          "big64": (8, 4096, 16, 64, 64, "float32"), "big96": (8, 4096, 16, 96, 96, "float32"),
          "T256-64": (4, 256, 8, 64, 64, "float32"), "T512-24": (2, 512, 4, 24, 24, "float32"),
          "T1024-128": (2, 1024, 4, 128, 128, "float32")}
# (B, T, H, K, V) of --scan-o-sweep: scan_o's blocks (B H tiles of 64 value columns) from 0.24
# to 3.9 an SM of 132 (under chunk_bwd.CHUNKS_64 chunks of 64 steps, B < 4 here, the chunks
# are of 32: no wgmma form there)
SWEEP = [(1, 4096, 4, 256, 512), (2, 4096, 4, 256, 512), (4, 4096, 4, 256, 512),
         (6, 4096, 4, 256, 512), (8, 4096, 4, 256, 512), (16, 4096, 4, 256, 512),
         (4, 4096, 8, 192, 384), (8, 4096, 4, 128, 256), (16, 4096, 4, 128, 256),
         (8, 4096, 16, 128, 128)]
# (name, sequence lengths, H, K, V, dtype): one packed batch each, with initial states
VARLEN = [("varlen-big128", (4096,) * 8, 16, 128, 128, "float32"),
          ("varlen-mixed-gla1.3b", (3000, 0, 5000, 17, 8000, 2367, 1, 4000), 4, 256, 512, "bfloat16"),
          ("varlen-short", (300, 200, 700, 50, 800) * 8, 8, 64, 64, "float32")]


@functools.lru_cache(maxsize=None)
def _clock():
    return bench.CupyClock()


def median_ms(f, reps=10):
    """Median device ms of f(), as the benchmark times a call (bench.measure)."""
    return bench.measure(_clock(), f, reps, 60.0)["ms"]


def inputs(case):
    """The benchmark's inputs of a Case (float32 gates) on the GPU, with a do of q's dtype."""
    import cupy
    args = _verify.make_inputs(case._replace(g_dtype="float32"), 0, cupy)
    do, _ = _verify.backward_inputs(case, args)
    return args, cupy.asarray(do)


def differences(a, b):
    """Each gradient's max |a - b| / max |a|, as 'name=x.xe-xx' words."""
    import cupy as cp
    out = []
    for name, x, y in zip(a._fields, a, b):
        if x is not None:
            x, y = x.astype(cp.float32), y.astype(cp.float32)
            out.append(f"{name}={float(cp.abs(x - y).max() / cp.abs(x).max()):.1e}")
    return " ".join(out)


def stage_times(call, rounds=3):
    """{entry point: median ms} of each launch of call() (by _launch.Launch), over rounds calls."""
    import cupy as cp
    from cupy_gda import _launch
    events = defaultdict(list)
    launch = _launch.Launch.__call__

    def timed(self, *args):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        launch(self, *args)
        e1.record()
        events[self.fn.name].append((e0, e1))

    _launch.Launch.__call__ = timed
    try:
        for _ in range(rounds):
            call()
        cp.cuda.Device().synchronize()
    finally:
        _launch.Launch.__call__ = launch
    return {name: float(np.median([cp.cuda.get_elapsed_time(*e) for e in evs]))
            for name, evs in events.items()}


def forward_lines(name, stages):
    """The forward's lines of shape_line: ForwardPlan (two terms, and the kept form) against
    gda_chunk_fwd, with their launches where ``stages``."""
    import cupy
    from cupy_gda import chunk, chunk_bwd
    from cupy_gda._checks import Problem
    B, T, H, K, V, dtype = SHAPES[name]
    args, _ = inputs(_verify.Case(B, T, H, K, V, dtype=dtype, init=False))
    q, k, v, g = (args[n] for n in ("q", "k", "v", "gate"))
    p = Problem(B, T, H, K, V, B, dtype, "float32", False)
    fp, cf = chunk_bwd.ForwardPlan(p), chunk.plan(p, False)
    fk = chunk_bwd.ForwardPlan(p, keep=True)
    flag = cupy.zeros((1,), np.int32)
    x = (q, k, v, g, 1.0, None, None, False, None)
    o_fp, o_cf, o_fk = fp(*x, flag=flag)[0], cf(*x)[0], fk(*x)[0]

    def dmax(a, b):
        return float(abs(a.astype("float32") - b.astype("float32")).max())
    print(f"{name:13s} gda_chunk_fwd {median_ms(lambda: cf(*x)):8.3f}  from the planes "
          f"{median_ms(lambda: fp(*x)):8.3f} (scan_o {int(fp.scan_o)}; the kept form "
          f"{median_ms(lambda: fk(*x)):8.3f}) ms  flag {int(flag[0])}  max |o - o_chunk| "
          f"{dmax(o_fp, o_cf):.1e} (the kept form {dmax(o_fk, o_cf):.1e})  ws "
          f"{fp.ws_floats * 4 / 2**20:.0f} MiB (kept {fk.ws_floats * 4 / 2**20:.0f})", flush=True)
    if stages:
        for what, pl in (("two terms", fp), ("kept form", fk)):
            for entry, ms in stage_times(lambda: pl(*x)).items():
                print(f"    forward from the planes, {what:11s}  {entry:40s} {ms:8.3f} ms")
    return p, x, fp, fk


def shape_line(name, stages):
    import cupy_gda
    from cupy_gda import chunk_bwd
    from cupy_gda._checks import Problem
    B, T, H, K, V, dtype = SHAPES[name]
    args, do = inputs(_verify.Case(B, T, H, K, V, dtype=dtype, init=False))
    q, k, v, g = (args[n] for n in ("q", "k", "v", "gate"))
    n = 5 if B * T > 8000 else 10

    def backward(method):
        return cupy_gda.gated_attention_backward(**args, do=do, method=method)

    fwd = median_ms(lambda: cupy_gda.gated_attention(**args))     # (by the dispatch rule)
    rec, chk = (median_ms(lambda: backward(m), n) for m in ("recurrent", "chunk"))
    p = Problem(B, T, H, K, V, B, dtype, "float32", False)
    plan = chunk_bwd.plan(p)
    _, flag = plan.run(q, k, v, g, do, 1.0, None, None, fallback=False)
    # the other chunk length, and the other boundary scan: from the planes -> the fused one
    # without; else fused <-> not (neither by scan_dv nor scan_o's S0, which need chunks of 64
    # from the planes)
    plain = plan.cfg._replace(SCAN_DV=False, SCAN_O_WG=False, PANELS=False)
    other = chunk_bwd.BackwardPlan(p, cfg=plain._replace(BT=96 - plan.cfg.BT))
    flip = chunk_bwd.BackwardPlan(p, cfg=plain._replace(PLANES=False)
                                  if plan.cfg.PLANES else plain._replace(SCAN=not plan.cfg.SCAN))

    def form(cfg):
        return (("planes" + (" scan_dv" if cfg.SCAN_DV else "") + (" s0-wg" if cfg.SCAN_O_WG else ""))
                if cfg.PLANES else f"scan {int(cfg.SCAN)}")

    def by(pl):                                             # the backward by another plan
        return pl(q, k, v, g, do, 1.0, None, None)

    alt, fl = (median_ms(lambda: by(pl), n) for pl in (other, flip))
    print(f"{name:13s} fwd {fwd:8.3f}  bwd rec {rec:8.3f}  chunk {chk:8.3f} (BT{other.cfg.BT} "
          f"{alt:8.3f}, {form(flip.cfg)} {fl:8.3f}) ms  fwd+bwd(chunk) {fwd + chk:8.3f}  "
          f"ws {plan.ws_floats * 4 / 2**20:.0f} MiB  flag {int(flag[0])}  "
          f"{differences(backward('recurrent'), backward('chunk'))}  {form(flip.cfg)}: "
          f"{differences(backward('chunk'), by(flip))}", flush=True)
    if dtype == "bfloat16":     # the forward from the planes (two terms; the kept form's
        # planes in three, its W and o in DV_TERMS) against gda_chunk_fwd
        _, x, fp, fk = forward_lines(name, stages)
        # the backward from the kept form's stages (three terms; W and o in DV_TERMS, v37)
        bk = chunk_bwd.plan(p, False, False, keep=True)
        kept = fk.run(*x, keep=True)[2]
        b_args = (q, k, v, g, do, 1.0, None, None)

        def both():                                         # the forward keeping, its backward
            bk.run(*b_args, kept=fk.run(*x, keep=True)[2])
        print(f"{name:13s} bwd from the kept forward {median_ms(lambda: bk.run(*b_args, kept=kept)):8.3f}"
              f"  fwd (keeping) + it {median_ms(both, n):8.3f} ms  kept ws "
              f"{kept.ws.nbytes / 2**20:.0f} MiB  {differences(backward('chunk'), bk.run(*b_args, kept=kept)[0])}",
              flush=True)
        if stages:
            for entry, ms in stage_times(lambda: bk.run(*b_args, kept=kept)).items():
                print(f"    backward from the kept   {entry:40s} {ms:8.3f} ms")
    if stages:
        ways = ((plan, lambda: backward("chunk")), (flip, lambda: by(flip)),
                (other, lambda: by(other)))
        for pl, call in ways:
            what = f"BT{pl.cfg.BT} {form(pl.cfg)}"
            for entry, ms in stage_times(call).items():
                print(f"    {what}  {entry:40s} {ms:8.3f} ms")


def varlen_line(name, lens, H, K, V, dtype):
    import cupy_gda
    from cupy_gda import chunk_bwd
    from cupy_gda._checks import Problem
    args, do = inputs(_verify.varlen_case(lens, H=H, K=K, V=V, dtype=dtype))
    T = sum(lens)

    def backward(method):
        return cupy_gda.gated_attention_backward(**args, do=do, method=method)

    rec, chk = (median_ms(lambda: backward(m), 5) for m in ("recurrent", "chunk"))
    p = Problem(1, T, H, K, V, len(lens), dtype, "float32", False)
    _, flag = chunk_bwd.plan(p, True, False).run(
        *(args[n] for n in ("q", "k", "v", "gate")), do, 1.0, args["initial_state"], None,
        args["cu_seqlens"], fallback=False)
    print(f"{name:22s} T {T:6d} N {len(lens):3d}  bwd rec {rec:8.3f}  chunk {chk:8.3f} ms  "
          f"flag {int(flag[0])}  {differences(backward('recurrent'), backward('chunk'))}", flush=True)


def scan_o_sweep():
    """A line a SWEEP shape: the forward that keeps nothing by scan_o with mma.sync, with wgmma
    (where SCAN_O_WG can be: else '-'), with wgmma as clusters (where SCAN_O_MC can be: else
    '-') and by the scan and dv's entry (plans built apart, SCAN_O_FROM 0), median ms, each
    scan_o's ratio to the pair, scan_o's blocks an SM, and the largest difference of the wgmma
    forms' o from the mma.sync form's."""
    import cupy
    from cupy_gda import chunk_bwd
    from cupy_gda._checks import Problem
    chunk_bwd.SCAN_O_FROM = 0.0
    chunk_bwd.SCAN_O_WG_KEYS = ()       # (the "mma" and "pair" forms without wgmma: v53's rule off)
    sms = chunk_bwd.device_limits()[0]
    forms = {"mma": (True, False, False), "wgmma": (True, True, False), "mc": (True, True, True),
             "pair": (False, False, False)}
    for B, T, H, K, V in SWEEP:
        args, _ = inputs(_verify.Case(B, T, H, K, V, dtype="bfloat16", init=False))
        x = tuple(args[n] for n in ("q", "k", "v", "gate")) + (1.0, None, None, False, None)
        p = Problem(B, T, H, K, V, B, "bfloat16", "float32", False)
        ms, out = {}, {}
        for form, (use, wg, mc) in forms.items():
            chunk_bwd.USE_SCAN_O, chunk_bwd.USE_SCAN_O_WG, chunk_bwd.USE_SCAN_O_MC = use, wg, mc
            fp = chunk_bwd.ForwardPlan(p)
            assert fp.scan_o == use
            if wg and not fp.cfg.SCAN_O_WG or mc and not fp.cfg.SCAN_O_MC:
                continue
            out[form] = fp(*x)[0].astype(cupy.float32)
            ms[form] = median_ms(lambda: fp(*x))
        chunk_bwd.USE_SCAN_O, chunk_bwd.USE_SCAN_O_WG, chunk_bwd.USE_SCAN_O_MC = True, False, False
        blocks = B * H * chunk_bwd.tiles(V) / sms
        wg = {f: (f"{ms[f]:8.3f} ({ms[f] / ms['pair']:.3f}, |o - o_mma| "
                  f"{float(abs(out[f] - out['mma']).max()):.1e})" if f in ms else "       -")
              for f in ("wgmma", "mc")}
        print(f"B {B:2d} T {T:5d} H {H:2d} K {K:3d} V {V:3d}  blocks/SM {blocks:5.2f}  scan_o mma "
              f"{ms['mma']:8.3f} ({ms['mma'] / ms['pair']:.3f})  wgmma {wg['wgmma']}  clusters "
              f"{wg['mc']}  scan + dv {ms['pair']:8.3f} ms", flush=True)


def main(argv):
    if "--three-terms" in argv:
        from cupy_gda import chunk_bwd
        chunk_bwd.DV_TWO_TERMS = chunk_bwd.ROWS_TWO_TERMS = False
        print("(chunk_bwd.DV_TWO_TERMS and ROWS_TWO_TERMS off)", flush=True)
    if "--scan-dv" in argv:
        from cupy_gda import chunk_bwd
        chunk_bwd.USE_SCAN_DV = True
        print("(chunk_bwd.USE_SCAN_DV on)", flush=True)
    if "--no-scan-o-wg" in argv:
        from cupy_gda import chunk_bwd
        chunk_bwd.SCAN_O_WG_KEYS = ()
        print("(chunk_bwd.SCAN_O_WG_KEYS empty)", flush=True)
    if "--scan-o-wg" in argv or "--scan-dv-wg" in argv or "--scan-o-mc" in argv:
        from cupy_gda import chunk_bwd
        chunk_bwd.USE_SCAN_O_WG = True
        print("(chunk_bwd.USE_SCAN_O_WG on)", flush=True)
    if "--scan-o-mc" in argv:
        from cupy_gda import chunk_bwd
        chunk_bwd.USE_SCAN_O_MC = True
        print("(chunk_bwd.USE_SCAN_O_MC on)", flush=True)
    if "--scan-dv-wg" in argv:
        from cupy_gda import chunk_bwd
        chunk_bwd.USE_SCAN_DV = True
        print("(chunk_bwd.USE_SCAN_DV on)", flush=True)
    if "--planes" in argv:
        from cupy_gda import chunk_bwd
        rule = chunk_bwd.config

        def planes_always(p, varlen=False, sms=132, wgmma=False):
            cfg = rule(p, varlen, sms, wgmma)
            whole = p.K % chunk_bwd.GT == 0 and p.K > chunk_bwd.GT and p.V % chunk_bwd.GT == 0
            return cfg._replace(SCAN=True, PLANES=True) if p.dtype == "bfloat16" and whole else cfg
        chunk_bwd.config = planes_always
        chunk_bwd.SCAN_O_FROM = chunk_bwd.SCAN_DV_FROM = 0.0
        print("(chunk_bwd.config: the planes wherever they can be; SCAN_O_FROM, SCAN_DV_FROM 0)",
              flush=True)
    extra = {}
    sb = [a for a in argv if a.startswith("--scores-blocks=")]
    if sb:                      # scores' launch bounds and diagonal unroll (v45's A/B)
        nb, du = (int(x) for x in sb[-1].split("=")[1].split(","))
        extra.update(SCORES_BLOCKS=nb, SCORES_DIAG_UNROLL=du)
    if "--no-scores-prefetch" in argv:      # scores' loads without the stage (v46's A/B)
        extra.update(SCORES_PREFETCH=0)
    if extra:
        from cupy_gda import chunk_bwd
        base = chunk_bwd.defines

        def extra_defines(*args, **kwargs):
            return dict(base(*args, **kwargs), **extra)
        chunk_bwd.defines = extra_defines
        print("(gda_chunk_bwd built with " + " ".join(f"{k}={v}" for k, v in extra.items()) + ")",
              flush=True)
    if "--no-scan-o-producer" in argv:  # scan_o with no producer warps (v49's A/B)
        from cupy_gda import chunk_bwd
        chunk_bwd.USE_SCAN_O_PRODUCER = False
        print("(chunk_bwd.USE_SCAN_O_PRODUCER off)", flush=True)
    if "--no-scan-o" in argv:
        from cupy_gda import chunk_bwd
        chunk_bwd.USE_SCAN_O = False
        print("(chunk_bwd.USE_SCAN_O off)", flush=True)
    if "--no-qk-by-scores" in argv:     # pack writes the planes of q A and k D (v75's A/B)
        from cupy_gda import chunk_bwd
        chunk_bwd.USE_QK_BY_SCORES = False
        print("(chunk_bwd.USE_QK_BY_SCORES off)", flush=True)
    if "--scan-o-sweep" in argv:
        scan_o_sweep()
        return
    if "--varlen" in argv:
        for case in VARLEN:
            varlen_line(*case)
        return
    names = [a for a in argv if not a.startswith("--")]
    names = names[0].split(",") if names else list(SHAPES)
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"profile_chunk_bwd: unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    for name in names:
        if "--forward" in argv:
            forward_lines(name, "--stages" in argv)
        else:
            shape_line(name, "--stages" in argv)


if __name__ == "__main__":
    main(sys.argv[1:])
