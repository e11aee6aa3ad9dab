"""Random cases checked against the float64 reference, shared by ``cupy-gda verify`` and the tests.

Accuracy contract: err(path) <= 2 * err(emulation) + 1e-6 * max|ref|, where err is the RMS of the
difference to the float64 loop reference on the same (rounded) inputs, and the emulation is the
same loop in float32 NumPy (for half dtypes: float32 math, output rounded to the half dtype).
"""
from typing import NamedTuple, Optional, Tuple

import numpy as np

from cupy_gda import reference

ATOL = 1e-6           # times max|ref|


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# The gate regimes: each draws float32 gates of ``shape`` from ``rng`` (a NumPy or CuPy
# Generator; ``xp`` its array module)
def _gate_unif(rng, shape, xp=np):
    return rng.random(shape, dtype=np.float32)


def _gate_logsig(rng, shape, xp=np):
    x = rng.standard_normal(shape, dtype=np.float32)
    return xp.exp(-xp.logaddexp(np.float32(0), -x) / np.float32(16))      # exp(logsigmoid(x) / 16)


def _gate_zeros(rng, shape, xp=np):
    g = rng.random(shape, dtype=np.float32)
    return xp.where(rng.random(shape, dtype=np.float32) < 0.1, np.float32(0), g)


def _gate_ones(rng, shape, xp=np):
    return xp.ones(shape, np.float32)


def _gate_tiny(rng, shape, xp=np):
    g = rng.random(shape, dtype=np.float32)
    return xp.where(rng.random(shape, dtype=np.float32) < 0.5, np.float32(1e-30), g)


def _gate_neg(rng, shape, xp=np):
    return np.float32(2) * rng.random(shape, dtype=np.float32) - np.float32(1)


def _gate_grow(rng, shape, xp=np):
    return np.float32(0.9) + np.float32(0.2) * rng.random(shape, dtype=np.float32)   # above 1 half the time


def _gate_big(rng, shape, xp=np):
    g = xp.where(rng.random(shape, dtype=np.float32) < 0.5, np.float32(2), np.float32(4))
    return xp.where(rng.random(shape, dtype=np.float32) < 0.3, np.float32(0), g)   # resets


GATES = {"unif": _gate_unif, "logsig": _gate_logsig, "zeros": _gate_zeros, "ones": _gate_ones,
         "tiny": _gate_tiny, "neg": _gate_neg, "grow": _gate_grow, "big": _gate_big}


class Case(NamedTuple):
    B: int
    T: int
    H: int
    K: int
    V: int
    dtype: str = "float32"
    gate: str = "logsig"
    log: bool = False                       # pass log(gate) as log_gate
    lengths: Optional[Tuple[int, ...]] = None   # varlen: packed segment lengths (B = 1)
    init: bool = True                       # random initial state
    step: bool = False                      # gated_attention_step (T = 1 tokens)
    indices: bool = True                    # step: N = B + 3 state rows, state_indices a random
                                            #   choice of B of them; else N = B, no indices
    g_dtype: Optional[str] = None           # the gate's dtype: q's for half dtypes (float32 for
                                            #   tiny gates: 1e-30 is 0 in float16), else float32
    backward: bool = False                  # gated_attention_backward (do, d_final_state drawn)

    @property
    def id(self):
        api = "step" if self.step else "varlen" if self.lengths else "fwd"
        api = "bwd-" + api if self.backward else api
        dims = f"B{self.B}-T{self.T}-H{self.H}-K{self.K}-V{self.V}"
        lens = "-L" + "_".join(map(str, self.lengths)) if self.lengths else ""
        gate = ("log_" if self.log else "gate_") + self.gate
        gdt = f"-g_{self.g_dtype}" if self.g_dtype else ""
        idx = "" if self.indices or not self.step else "-noidx"
        return f"{api}-{dims}{lens}-{self.dtype}-{gate}{gdt}{'' if self.init else '-noinit'}{idx}"


def varlen_case(lengths, H=4, K=24, V=24, **kw):
    return Case(1, sum(lengths), H, K, V, lengths=tuple(lengths), **kw)


def step_case(B, H, K, V, **kw):
    return Case(B, 1, H, K, V, step=True, **kw)


def standard_cases():
    """The sweep of ``cupy-gda verify``: the seed shape first, then the awkward ones."""
    cs = [Case(2, 128, 4, 24, 24)]
    cs += [Case(2, T, 4, 24, 24) for T in (1, 63, 64, 65, 1000)]
    cs += [Case(2, 65, 2, d, d) for d in (1, 8, 40, 64, 96, 128, 160, 256)]
    cs += [Case(2, 65, 4, 32, 48), Case(2, 65, 4, 128, 64), Case(2, 40, 3, 5, 1), Case(2, 40, 3, 1, 7)]
    cs += [Case(2, 128, 4, 24, 24, gate=g) for g in GATES if g != "logsig"]
    cs += [Case(2, 128, 4, 24, 24, gate=g, log=True) for g in ("logsig", "zeros", "tiny")]
    cs += [Case(2, 128, 4, 24, 24, init=False)]
    cs += [Case(2, 128, 4, 64, 64, dtype=dt, gate=g) for dt in ("float16", "bfloat16")
           for g in ("logsig", "neg")]
    cs += [Case(2, 65, 2, 100, 100, dtype=dt, log=True) for dt in ("float16", "bfloat16")]
    cs += [varlen_case((1, 17, 64, 300)), varlen_case((1, 17, 64, 300), dtype="bfloat16"),
           varlen_case((0, 5, 0, 40), init=False)]
    # model shapes: GLA-1.3B's heads (K = 256 in key tiles, V = 512), V = 1024
    cs += [Case(2, 130, 2, 256, 512), Case(2, 130, 2, 256, 512, dtype="bfloat16"),
           Case(2, 70, 2, 64, 1024), Case(1, 200, 2, 200, 1000, dtype="float16", log=True)]
    cs += backward_cases()
    cs += [step_case(8, 4, 24, 24), step_case(64, 4, 128, 128), step_case(5, 3, 100, 36),
           step_case(4, 2, 256, 256, gate="zeros"), step_case(8, 4, 64, 64, dtype="bfloat16"),
           step_case(8, 4, 24, 24, dtype="float16", gate="logsig", log=True),
           step_case(4, 2, 256, 512), step_case(4, 2, 64, 1024, dtype="bfloat16")]
    return cs


def backward_cases():
    """The gradients' part of the sweep: T across the kept states (every 64 steps), head dims of
    each tile layout (odd, K > V, K = 256 with V = 512, V = 1024), every gate regime, log gates
    with 0s, half dtypes, packed sequences with empty ones."""
    b = dict(backward=True)
    cs = [Case(2, T, 4, 24, 24, **b) for T in (1, 63, 65, 200)]
    cs += [Case(2, 65, 2, K, V, **b) for K, V in ((1, 7), (5, 1), (40, 40), (64, 64), (100, 100),
                                                  (128, 64), (160, 160), (256, 256))]
    cs += [Case(2, 70, 2, 256, 512, **b), Case(1, 70, 2, 64, 1024, dtype="bfloat16", **b)]
    cs += [Case(2, 128, 4, 24, 24, gate=g, **b) for g in GATES if g != "logsig"]
    cs += [Case(2, 128, 4, 24, 24, gate=g, log=True, **b) for g in ("logsig", "zeros")]
    cs += [Case(2, 128, 4, 64, 64, dtype=dt, gate="neg", **b) for dt in ("float16", "bfloat16")]
    cs += [Case(2, 65, 2, 100, 100, dtype="bfloat16", log=True, **b)]
    cs += [varlen_case((1, 17, 64, 300), **b), varlen_case((0, 5, 0, 40), init=False, **b)]
    return cs


def gate_dtype(case):
    """The gate's dtype name: case.g_dtype, else q's for half dtypes (float32 for tiny gates:
    1e-30 is 0 in float16), else float32."""
    return case.g_dtype or (case.dtype if case.dtype != "float32" and case.gate != "tiny"
                            else "float32")


H200 = (132, 227 * 1024)      # (SMs, opt-in shared memory bytes a block): the tiles' default GPU


def kernel_defines(case, limits=H200):
    """What a forward case compiles on a GPU of ``limits`` (SMs, opt-in shared memory bytes a
    block): for each family (chunk, recurrent), its defines and whether it runs in sequence
    segments (their state pass first), or None where it cannot run the case."""
    from cupy_gda import chunk, recurrent
    from cupy_gda._checks import Problem
    T, N = (sum(case.lengths), len(case.lengths)) if case.lengths else (case.T, case.B)
    p = Problem(case.B, T, case.H, case.K, case.V, N, case.dtype, gate_dtype(case), case.log)
    out = []
    for family in (chunk, recurrent):
        cfg = family.config(p, *limits)
        out.append(None if cfg is None else (family.defines(p, cfg, False), cfg.P > 1))
    return out


def _cut(n, m):
    """Length n cut to n mod 64 plus m (a multiple of 64), in at least two chunks; n if not
    shorter."""
    t = n % 64 + m + (64 if n % 64 + m <= 64 else 0)
    return min(n, t)


def shortened(case, max_t, limits=H200):
    """``case`` with each sequence (varlen: each segment) longer than about ``max_t`` steps cut
    to its length mod 64 plus m, in at least two chunks of 64 steps: m the first of max_t in
    whole chunks, twice that, four times, ... at which both families compile the same defines
    and run in sequence segments or not as at the case's own lengths (kernel_defines). So the
    partial last chunk and the carry from chunk to chunk stay. The case itself where no shorter
    length keeps them, and for step cases. For runs under compute-sanitizer: every define set
    of the sweep, in fewer steps."""
    if case.step:
        return case
    want, lens = kernel_defines(case, limits), case.lengths or (case.T,)
    m = max(1, -(-max_t // 64)) * 64
    while True:
        cut = tuple(_cut(n, m) for n in lens)
        if cut == lens:
            return case
        c = case._replace(T=sum(cut), lengths=cut) if case.lengths else case._replace(T=cut[0])
        if kernel_defines(c, limits) == want:
            return c
        m *= 2


def make_inputs(case, seed=0, xp=np):
    """The case's arguments as arrays of ``xp`` (NumPy, or CuPy: drawn on the device), from
    ``seed`` (an int, or a Generator of ``xp`` to draw on from): q, k ~ N(0, 1/K), v ~ N(0, 1)
    and the gate regime, drawn in float32 and rounded to case.dtype; the initial state (the
    state and state_indices for step cases) and cu_seqlens as the case says."""
    rng = seed if hasattr(seed, "standard_normal") else xp.random.default_rng(seed)
    c = case
    lead = (c.B, c.H) if c.step else (c.B, c.T, c.H)
    dt = _dtype(c.dtype)
    scale = np.float32(c.K ** -0.5)
    q = rng.standard_normal(lead + (c.K,), dtype=np.float32) * scale
    k = rng.standard_normal(lead + (c.K,), dtype=np.float32) * scale
    v = rng.standard_normal(lead + (c.V,), dtype=np.float32)
    g = GATES[c.gate](rng, lead + (c.K,), xp)
    if c.log:
        with np.errstate(divide="ignore"):
            g = xp.log(g)
    g_dt = gate_dtype(c)
    args = dict(q=_cast(q, dt, xp), k=_cast(k, dt, xp), v=_cast(v, dt, xp))
    args["log_gate" if c.log else "gate"] = _cast(g, _dtype(g_dt), xp)
    N = c.B + 3 if c.step and c.indices else len(c.lengths) if c.lengths else c.B
    if c.step or c.init:
        key = "state" if c.step else "initial_state"
        args[key] = rng.standard_normal((N, c.H, c.K, c.V), dtype=np.float32)
    if c.lengths:
        args["cu_seqlens"] = xp.asarray(np.concatenate([[0], np.cumsum(c.lengths)]).astype(np.int32))
    if c.step and c.indices:
        args["state_indices"] = xp.argsort(rng.random(N))[:c.B].astype(np.int64)
    return args


def _cast(x, dtype, xp):
    """x (float32) in ``dtype``; half dtypes through the host, as NumPy rounds them."""
    if x.dtype == dtype:
        return x
    if xp is np:
        return x.astype(dtype)
    return xp.asarray(xp.asnumpy(x).astype(dtype))


def _f64(x):
    return np.asarray(x).astype(np.float64)


def rms(x):
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


class Result(NamedTuple):
    name: str            # "o" or "state"
    max_abs: float
    rel_rms: float
    err: float           # RMS error of the path
    bound: float         # 2 * RMS error of the emulation + ATOL * max|ref|
    ok: bool


def compare(name, got, ref, emu):
    """The path's ``got`` against the float64 ``ref`` and the emulation ``emu``: the same
    elements finite (NaN and inf alike), and the RMS error over the finite ones within the
    bound (the emulation's, over the elements finite in both)."""
    got, ref, emu = _f64(got), _f64(ref), _f64(emu)
    fin = np.isfinite(ref)
    with np.errstate(invalid="ignore"):
        e = np.where(fin & np.isfinite(emu), emu - ref, 0.0)
        bound = 2 * rms(e) + ATOL * (float(np.max(np.abs(ref[fin]))) if fin.any() else 0.0)
        if got.shape != ref.shape:
            return Result(name, np.inf, np.inf, np.inf, bound, False)
        if not (np.isfinite(got) == fin).all():
            return Result(name, np.inf, np.inf, np.inf, bound, False)
        diff = np.where(fin, got - ref, 0.0)
    err = rms(diff)
    rr = err / max(rms(np.where(np.isfinite(ref), ref, 0.0)), 1e-300)
    return Result(name, float(np.max(np.abs(diff))) if diff.size else 0.0, rr, err, bound,
                  bool(err <= bound))


def references(case, args):
    """(ref, emu) pairs of (o, state) for the case: float64 loop, and the low-precision emulation."""
    dt = _dtype(case.dtype)
    if case.step:
        out = {}
        for label, mdt in (("ref", np.float64), ("emu", np.float32)):
            st = args["state"].astype(mdt)
            kw = {k: v for k, v in args.items() if k != "state"}
            o = reference.gated_attention_step_ref(**kw, state=st, dtype=mdt)
            out[label] = (o, st)
    else:
        out = {}
        for label, mdt in (("ref", np.float64), ("emu", np.float32)):
            o, st = reference.gated_attention_ref(**args, output_final_state=True, dtype=mdt)
            out[label] = (o, st)
    o_emu = out["emu"][0].astype(dt) if case.dtype != "float32" else out["emu"][0]
    return out["ref"], (o_emu, out["emu"][1])


def backward_inputs(case, args, seed=0):
    """(do, d_final_state) for a backward case: N(0, 1), do in q's dtype, the state's float32."""
    rng = np.random.default_rng([seed, 1])
    N = len(case.lengths) if case.lengths else case.B
    do = rng.standard_normal(args["v"].shape, dtype=np.float32).astype(_dtype(case.dtype))
    return do, rng.standard_normal((N, case.H, case.K, case.V), dtype=np.float32)


def backward_references(case, args, do, dht):
    """(ref, emu) Gradients: the reverse loop in float64, and in float32 NumPy (for half dtypes
    each gradient then rounded to its argument's dtype), as the CPU backward runs it (the
    reference's operations, every sequence at once)."""
    grads = [reference.gated_attention_backward_recurrent(**args, do=do, d_final_state=dht,
                                                          dtype=mdt)
             for mdt in (np.float64, np.float32)]
    emu = grads[1]
    if case.dtype != "float32":
        dt, g_dt = _dtype(case.dtype), _dtype(gate_dtype(case))
        emu = emu._replace(dq=emu.dq.astype(dt), dk=emu.dk.astype(dt), dv=emu.dv.astype(dt),
                           dgate=emu.dgate.astype(g_dt))
    return grads[0], emu


def gradient_dtypes(args):
    """The dtypes of a backward's Gradients for its arguments ``args`` (a dict of arrays): dq, dk
    in q's, dv in v's, dgate in the gate argument's, dinitial_state float32 (float64 for float64
    inputs)."""
    g = args["gate"] if args.get("gate") is not None else args["log_gate"]
    state = np.dtype(np.float64 if args["q"].dtype == np.float64 else np.float32)
    return (args["q"].dtype, args["q"].dtype, args["v"].dtype, g.dtype, state)


def backward_method(method, backend):
    """The backward's method for a run of ``method`` (the forward's) on ``backend``: the same
    family where it has a backward there, else "auto"."""
    from cupy_gda import _dispatch
    where = "gpu" if backend == "cupy" else "cpu"
    return method if where in _dispatch.BACKWARD_METHODS.get(method, ()) else "auto"


def _run_backward(case, args, to_dev, to_host, seed, method):
    import cupy_gda
    do, dht = backward_inputs(case, args, seed)
    ref, emu = backward_references(case, args, do, dht)
    got = cupy_gda.gated_attention_backward(**{k: to_dev(v) for k, v in args.items()},
                                            do=to_dev(do), d_final_state=to_dev(dht),
                                            method=method)
    want = dict(zip(ref._fields, gradient_dtypes(args)))
    out = []
    for name, x, r, e in zip(ref._fields, got, ref, emu):
        if r is None or x is None:
            out.append(Result(name, 0.0, 0.0, 0.0, 0.0, x is None and r is None))
        elif x.dtype != want[name]:
            out.append(Result(f"{name} dtype", np.inf, np.inf, np.inf, 0.0, False))
        else:
            out.append(compare(name, to_host(x), r, e))
    return out


def run_case(case, backend="numpy", seed=0, method="auto"):
    """Run the public API on ``backend`` ("numpy" or "cupy") and compare; returns [Result].
    ``method``: the forward's (a backward case runs backward_method's)."""
    import cupy_gda
    args = make_inputs(case, seed)
    if backend == "cupy":
        import cupy
        to_dev, to_host = cupy.asarray, cupy.asnumpy
    else:
        to_dev, to_host = np.copy, np.asarray
    if case.backward:
        return _run_backward(case, args, to_dev, to_host, seed,
                             backward_method(method, backend))
    dev = {k: to_dev(v) for k, v in args.items()}
    (o_ref, s_ref), (o_emu, s_emu) = references(case, args)
    if case.step:
        o = cupy_gda.gated_attention_step(**dev)
        s = dev["state"]
        rows = args.get("state_indices", np.arange(case.B))
        s_host = to_host(s)
        untouched = np.setdiff1d(np.arange(s_host.shape[0]), rows)
        if not np.array_equal(s_host[untouched], args["state"][untouched]):
            return [Result("untouched rows", np.inf, np.inf, np.inf, 0.0, False)]
        s_host, s_ref, s_emu = s_host[rows], s_ref[rows], s_emu[rows]
    else:
        o, s = cupy_gda.gated_attention(**dev, output_final_state=True, method=method)
        s_host = to_host(s)
    o = to_host(o)
    if o.dtype != args["v"].dtype:
        return [Result("o dtype", np.inf, np.inf, np.inf, 0.0, False)]
    return [compare("o", o, o_ref, o_emu), compare("state", s_host, s_ref, s_emu)]
