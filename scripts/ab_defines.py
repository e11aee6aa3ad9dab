"""A/B of a kernel family's compile defines: device ms of gated_attention(method=FAMILY) at the
benchmark's shapes (cupy_gda.bench.SHAPES), once per value of one define, every other define as
the launcher picks it, with the largest difference from the first variant's output.

    python3 scripts/ab_defines.py chunk PREFETCH=0,1 big128 big128-bf16 tsweep-4k
    python3 scripts/ab_defines.py recurrent TC=16,32 seed long24
"""
import sys

import cupy

import cupy_gda
from cupy_gda import _gpu
from cupy_gda.bench import SHAPES, _cast_io
from crossover import device_ms
from probe import inputs

DEFINES = {"chunk": "chunk_defines", "recurrent": "recurrent_defines"}
RULES = {family: getattr(_gpu, attr) for family, attr in DEFINES.items()}   # the launcher's own


def _force(family, name, value):
    """Patch the family's defines so that ``name`` is ``value`` (None: as the launcher picks)."""
    attr, rule = DEFINES[family], RULES[family]

    def forced(*a, **kw):
        d = rule(*a, **kw)
        if value is not None:
            d[name] = value
        return d
    setattr(_gpu, attr, rule if value is None else forced)
    _gpu._PLANS.clear()
    cupy_gda._api._FAST.clear()


def main():
    family, spec, *names = sys.argv[1:]
    name, values = spec.split("=")
    values = [int(x) for x in values.split(",")]
    print(f"{family}: {name} = " + " / ".join(str(v) for v in values) + "  (device ms, max |diff|)",
          flush=True)
    for shape in names:
        s = SHAPES[shape]
        q, k, v, g = inputs(s.B, s.T, s.H, s.K, s.V)
        q, k, v = (_cast_io(x, s.dtype) for x in (q, k, v))
        o = cupy.empty_like(v)
        ms, outs = [], []
        for value in values:
            _force(family, name, value)
            outs.append(cupy_gda.gated_attention(q, k, v, g, method=family).astype(cupy.float32))
            ms.append(device_ms(lambda: cupy_gda.gated_attention(q, k, v, g, method=family, out=o)))
        _force(family, name, None)
        diff = max(float(cupy.abs(x - outs[0]).max()) for x in outs)
        print(f"  {shape:12s} " + " / ".join(f"{m:.4f}" for m in ms) + f"   {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
