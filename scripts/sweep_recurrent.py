"""Time gda_recurrent_fwd over its tiles (R rows per lane, KT*BV threads a block, TC steps
staged) and its staging (A: cp.async into two sets where the rule allows it; otherwise through
registers) at a few shapes: the data behind the tile rule in cupy_gda/_gpu.py (see
docs/perf-notes.md). Device time of the gated_attention call (crossover.device_ms: each call
queued behind a spin kernel, so host time is excluded).

    python3 scripts/sweep_recurrent.py [--top N] [name ...]
    python3 scripts/sweep_recurrent.py --grid small|large   # a few candidates over a grid of shapes
"""
import itertools
import sys

import cupy

import cupy_gda
from cupy_gda import _compile, _gpu
from crossover import device_ms
from probe import inputs, sweep_shapes

SHAPES = {"seed": (2, 128, 4, 24, 24), "few24": (1, 2048, 8, 24, 24), "gla64": (4, 2048, 8, 64, 64),
          "long24": (8, 4096, 16, 24, 24), "tsweep-4k": (1, 4096, 16, 128, 128),
          "few64": (1, 512, 8, 64, 64), "K128-NH8-T512": (1, 512, 8, 128, 128)}
RULE = _gpu.recurrent_tiles, _gpu.recurrent_async


def _use(tiles, staging):
    """Force the tiles, and the rule's staging (staging 1) or the register path (0); tiles None:
    the rule's own again."""
    _gpu.recurrent_tiles = RULE[0] if tiles is None else (lambda *a, t=tiles, **kw: t)
    _gpu.recurrent_async = RULE[1] if staging else (lambda p, t: 0)
    _gpu._PLANS.clear()
    cupy_gda._api._FAST.clear()


def _tiles(K, R, threads, TC):
    KT = min(32, _gpu._pow2_at_least(-(-K // R)))
    return R, KT, max(32 // KT, threads // KT), TC


# --grid: (R, threads, TC) candidates, and the shapes K x (B, H) x T; "small": K <= 32, "large":
# K = 64, 128 where method="auto" runs the recurrent kernel (few heads, short sequences)
GRIDS = {
    "small": (((2, 128, 32), (2, 128, 64), (1, 128, 32), (1, 128, 64), (4, 64, 32), (4, 64, 64),
               (4, 128, 64), (2, 64, 32)),
              ((16, 24, 32), ((1, 4), (2, 4), (1, 16), (4, 16), (8, 16), (16, 16)), (128, 512, 2048, 4096))),
    "large": (((4, 256, 16), (4, 256, 32), (4, 256, 64), (4, 128, 32), (2, 256, 32), (4, 512, 32)),
              ((64, 128), ((1, 4), (1, 8), (1, 16), (4, 8)), (128, 256, 512))),
}


def grid(which):
    """Device ms of each candidate (staged by cp.async where the rule allows) at every shape of
    GRIDS[which], with the rule's own pick and segments."""
    cands, (Ks, BHs, Ts) = GRIDS[which]
    print("K B H T | rule(tiles, P) | " + " ".join(f"R{r}/{n}/{tc}" for r, n, tc in cands)
          + " | rule ms", flush=True)
    for K, (B, H), T in itertools.product(Ks, BHs, Ts):
        q, k, v, g = inputs(B, T, H, K, K)
        o = cupy.empty_like(v)
        call = lambda: cupy_gda.gated_attention(q, k, v, g, method="recurrent", out=o)  # noqa: E731
        rule = RULE[0](K, K, B * H, T, staged=True)
        P = _gpu.recurrent_split(K, K, B * H, T, staged=True)
        rule_ms = device_ms(call)
        ms = []
        for R, n, TC in cands:
            t = _tiles(K, R, n, TC)
            if TC * t[2] * (t[1] + 1) * 4 > 48 * 1024:     # partial sums over the static 48 KB
                ms.append(float("nan"))
                continue
            _use(t, 1)
            ms.append(device_ms(call))
        _use(None, 1)
        best = min((i for i in range(len(ms)) if ms[i] == ms[i]), key=ms.__getitem__)
        print(f"{K} {B} {H} {T} | {rule} P={P} | "
              + " ".join(f"{m:.4f}{'*' if i == best else ''}" for i, m in enumerate(ms))
              + f" | {rule_ms:.4f}", flush=True)


def main():
    args = sys.argv[1:]
    if args[:1] == ["--grid"]:
        return grid(args[1])
    top = 8
    if args[:1] == ["--top"]:
        top, args = int(args[1]), args[2:]
    default = RULE[0]
    for name, (B, T, H, K, V), (q, k, v, g), p, want in sweep_shapes(SHAPES, args):
        o = cupy.empty_like(v)
        best = default(K, V, B * H, T, staged=True)
        rows = []
        for R, threads, TC, A in itertools.product((1, 2, 4), (64, 128, 256), (16, 32, 64), (1, 0)):
            R, KT, BV, TC = _tiles(K, R, threads, TC)
            if -(-K // (R * KT)) * R > 8 or threads < KT:
                continue
            if TC * BV * (KT + 1) * 4 > 48 * 1024:
                continue
            if A and not RULE[1](p, (R, KT, BV, TC)):
                continue                        # the register path, timed with A = 0
            _use((R, KT, BV, TC), A)
            try:
                got = cupy_gda.gated_attention(q, k, v, g, method="recurrent")
            except _compile.KernelCompileError:
                continue
            err = float(cupy.abs(got - want).max())
            ms = device_ms(lambda: cupy_gda.gated_attention(q, k, v, g, method="recurrent", out=o))
            rows.append((ms, R, KT, BV, TC, "A" if A else "reg", err))
        _use(None, 1)
        print(f"{name} (B{B} T{T} H{H} K{K} V{V}); rule picks (R, KT, BV, TC) = {best}", flush=True)
        rows.sort()
        for ms, R, KT, BV, TC, staged, err in rows[:top]:
            mark = " <- rule" if (R, KT, BV, TC) == best else ""
            print(f"   {ms:9.4f} ms  R={R} KT={KT:2d} BV={BV:3d} TC={TC:2d} {staged:>3}  "
                  f"max|diff| {err:.1e}{mark}", flush=True)
        for r in rows[top:]:
            if r[1:5] == best:
                print(f"   {r[0]:9.4f} ms  the rule's tiles, {r[5]}", flush=True)


if __name__ == "__main__":
    main()
