"""Device time of the forward kernel families over shapes, configurations and compile defines:
the data behind each launcher's tile rule and _dispatch's table (docs/perf-notes.md).

    python -m scripts.sweep [--family recurrent|chunk|both] [--shapes NAMES] [--shape B,T,H,K,V]
                            [--grid SPEC] [--host] [--reps N] [NAME=v1,v2 ...]

Shapes: bench shape names (--shapes seed,gla64), ad-hoc ones (--shape 1,2048,8,24,24[,dtype],
repeatable), or --grid "K=24,64 BH=1x8,4x16 T=128,512", the product of its axes (V = K). Each NAME=values
override makes variants (their product): a field of the family's Config (recurrent: R, threads,
TC, P, ASYNC_COPY through recurrent.custom; chunk: BV, P, wgmma (0: the sm_80 variant on a
Hopper GPU) through chunk.config), else a compile
define (e.g. UNROLL=2,4). Without overrides each family runs as its launcher plans it.

One line per (shape, family, variant): the median device ms (CUDA events, each call queued
behind a spin kernel, as `cupy-gda bench` times), the max |difference| from the recurrent
kernel's output, the variant's Config, and '<- rule' where it is the launcher's own choice;
--host adds the host ms per call of back-to-back calls. Examples:

    python -m scripts.sweep --family both --grid "K=24,64,128 BH=1x8,1x16,4x8,4x16,8x16 T=128,256,512,1024,2048"
    python -m scripts.sweep --family recurrent --shapes seed,few24 R=1,2,4 threads=64,128 TC=32,64
    python -m scripts.sweep --family chunk --shapes gla64 BV=64,32,16 P=1,2,4,8
    python -m scripts.sweep --family chunk --shapes big128,gla1.3b-bf16 wgmma=0,1
"""
import argparse
import itertools
import sys

import numpy as np

from cupy_gda import _checks, _launch, _verify, bench, chunk, recurrent

CONFIG_FIELDS = {"recurrent": ("R", "threads", "TC", "P", "ASYNC_COPY"), "chunk": ("BV", "P", "wgmma")}


def parse_shapes(names, specs=()):
    """[(label, B, T, H, K, V, dtype)] of comma-separated bench shape names and of
    'B,T,H,K,V[,dtype]' specs."""
    out = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        s = bench.SHAPES[name]
        out.append((s.name, s.B, s.T, s.H, s.K, s.V, s.dtype))
    for spec in specs:
        f = spec.split(",")
        out.append((spec, *map(int, f[:5]), f[5] if len(f) > 5 else "float32"))
    return out


def parse_grid(text):
    """The shapes of a grid spec 'K=24,64 BH=1x8,4x16 T=128,512' (V = K, float32)."""
    axes = dict(part.split("=") for part in text.split())
    Ks = [int(x) for x in axes["K"].split(",")]
    BHs = [tuple(map(int, x.split("x"))) for x in axes["BH"].split(",")]
    Ts = [int(x) for x in axes["T"].split(",")]
    return [(f"{B},{T},{H},{K},{K}", B, T, H, K, K, "float32")
            for K, (B, H), T in itertools.product(Ks, BHs, Ts)]


def parse_overrides(args):
    """{NAME: [values]} of NAME=v1,v2 arguments (ints)."""
    return {name: [int(x) for x in values.split(",")]
            for name, values in (a.split("=", 1) for a in args)}


def variants(overrides):
    """Each combination of the override values, as a dict (one empty dict without overrides)."""
    names = list(overrides)
    return [dict(zip(names, vals)) for vals in itertools.product(*(overrides[n] for n in names))]


def build(family, p, variant, limits):
    """(plan, Config, is the rule's) of one variant: Config fields to the family's rule, the
    rest compile defines."""
    fields = {k: v for k, v in variant.items() if k in CONFIG_FIELDS[family]}
    extra = {k: v for k, v in variant.items() if k not in CONFIG_FIELDS[family]}
    if family == "recurrent":
        rule = recurrent.config(p, *limits)
        cfg = recurrent.custom(p, *limits, **fields)
        return recurrent.RecurrentPlan(p, False, cfg, extra), cfg, cfg == rule and not extra
    hopper = chunk.USE_WGMMA and _launch.hopper()
    fields.setdefault("wgmma", hopper)
    rule = chunk.config(p, *limits, wgmma=hopper)
    cfg = chunk.config(p, *limits, **fields)
    if cfg is None:
        return None, None, False
    return chunk.ChunkPlan(p, False, cfg, extra), cfg, cfg == rule and not extra


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m scripts.sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=("recurrent", "chunk", "both"), default="both")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--grid")
    ap.add_argument("--host", action="store_true", help="also the host ms per call")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("overrides", nargs="*", metavar="NAME=v1,v2")
    a = ap.parse_args(argv)
    import cupy
    shapes = parse_shapes(a.shapes, a.shape) + (parse_grid(a.grid) if a.grid else [])
    if not shapes:
        shapes = parse_shapes("seed,gla64,long24,big128,few24,few64")
    families = ("recurrent", "chunk") if a.family == "both" else (a.family,)
    over = parse_overrides(a.overrides)
    limits = _launch.device_limits()
    clock = bench.CupyClock()
    print(f"shape | family | ms{' | host ms' if a.host else ''} | max|diff| | config", flush=True)
    for label, B, T, H, K, V, dtype in shapes:
        case = _verify.Case(B, T, H, K, V, dtype=dtype, init=False, g_dtype="float32")
        x = _verify.make_inputs(case, 0, cupy)
        p = _checks.check_forward("sweep", x["q"], x["k"], x["v"], x["gate"], None, None, None, cpu=False)
        o = cupy.empty_like(x["v"])
        args = (x["q"], x["k"], x["v"], x["gate"], 1.0, None, None, False, o)
        want = recurrent.RecurrentPlan(p, False)(*args[:-1], None)[0].astype(np.float32)
        for family in families:
            for var in variants(over):
                print(f"{label} | {family} {var or ''} | {row(family, p, var, limits, args, want, clock, a)}",
                      flush=True)


def row(family, p, var, limits, args, want, clock, a):
    """The rest of one variant's line (or why it did not run)."""
    import cupy
    try:
        plan, cfg, is_rule = build(family, p, var, limits)
        if plan is None:
            return "not run (no config)"
        diff = float(cupy.abs(plan(*args)[0].astype(np.float32) - want).max())
        ms = bench.measure(clock, lambda: plan(*args), a.reps, 5.0)["ms"]
        host = ""
        if a.host:
            sync = cupy.cuda.get_current_stream().synchronize
            host = f" | {np.median(bench.host_times(lambda: plan(*args), sync, 5, 200)):.4f}"
    except Exception as e:  # noqa: BLE001 - a variant that does not compile or launch is a line
        return f"failed: {bench._err(e)}"
    return f"{ms:.4f}{host} | {diff:.1e} | {tuple(cfg)}{' <- rule' if is_rule else ''}"


if __name__ == "__main__":
    sys.exit(main())
