"""``cupy-gda bench``: our kernels at named shapes, against the copy floor.

Rows per shape (``--impl`` selects by family or by name):

- ``ours-auto`` and ``ours-<m>`` for each family of ``_dispatch.METHODS`` with a GPU kernel
  (found at run time); ``ours-step`` (``gated_attention_step``, state updated in place) for
  ``decode``. ``... (host)`` rows (seed, decode): host wall time per call of back-to-back calls.
- ``cpu-auto``, ``cpu-recurrent``, ``cpu-chunk`` (decode: ``cpu-step``), with ``--cpu``: the
  public API on NumPy inputs, host wall time per call, T cut to CPU_T_MAX (run_cpu; no GPU).
- ``ours-auto-fwd+bwd`` (only when named, or with the selector ``fwd+bwd``): a forward call
  then gated_attention_backward with a random ``do``, as one training step runs them; rel_err is
  the worst of dq, dk, dv, dgate (the float64 reverse loop on the forward rows' slice).
  ``ours-keep-fwd+bwd``: the same with the forward's ChunkStates kept for the backward
  (keep_states=True, states=; where the forward keeps none, the same calls as ours-auto's).
- ``floor``: the bytes that must move (q, k, v, g read once, o written once; decode: + the state
  read and written once) over the device-to-device copy bandwidth measured in the same run;
  fwd+bwd rows add the backward's bytes at the same rate (must_move_bytes).
- ``extra``: the device memory one call takes beyond its inputs and the arrays it returns (fwd+bwd:
  o and the gradients): the peak of CuPy's memory pool during the call minus the returned bytes
  (peak_extra; fla's rows: torch's allocator peak, the same way).
- Other implementations feed the same table through BASELINES: ``scripts/baselines.py``
  registers the textbook kernel and fla's (``python -m scripts.baselines`` takes the same
  options as ``cupy-gda bench``). The package never imports them.

Timing: CUDA events around each call, each call queued behind a short spin kernel so that the
host's launch time stays out of the device time; warm-up first (it compiles); the median of many
calls is reported (min, p10, p90 in the JSON). Inputs: _verify.make_inputs of the shape's case
(q, k ~ N(0, 1/K), v ~ N(0, 1), gate = exp(logsigmoid(x) / 16), x ~ N(0, 1), float32 gate),
drawn on the device; below ~3x the L2 size an input set is repeated and the calls rotate among
the copies, so repeated calls do not time the L2.

Importing this module touches no GPU (CuPy is imported inside the functions that need it).
"""
import gc
import json
import math
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

import cupy_gda
from cupy_gda import _compile, _dispatch, _verify, reference
from cupy_gda._interop import host_array

REPO_ROOT = Path(__file__).resolve().parent.parent       # a checkout's root (git_commit)

DEFAULT_REPS = 100
QUICK_REPS = 20
MIN_REPS = 5                    # a row's budget never cuts it below this many timed calls
DEFAULT_BUDGET_S = 5.0          # seconds of timed calls per row, at most (beyond MIN_REPS)
COPY_BYTES = 1 << 30            # the copy that measures the bandwidth ceiling
COPY_REPS = 20
L2_DEFAULT = 60 << 20           # when the device does not say
ROTATE_L2 = 3                   # rotate input sets until they span this many L2 sizes
MAX_SETS = 4096
REF_T_MAX = 4096                # the NumPy references run on T <= this ...
REF_HEADS = 2                   # ... of the first sequence's first heads
HOST_CALLS = 200                # calls per batch of a host-time row
HOST_BATCHES = 20
SPIN_MIN_NS, SPIN_MAX_NS = 50_000, 10_000_000
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


# ------------------------------------------------------------------------------------ shapes

class Shape(NamedTuple):
    name: str
    B: int
    T: int
    H: int
    K: int
    V: int
    dtype: str = "float32"      # q, k, v and o; the gate is float32 always
    step: bool = False          # decode: gated_attention_step, one token, state [B, H, K, V]
    host: bool = False          # also time the whole Python call from the host

    @property
    def legend(self):
        dims = f"B{self.B} H{self.H}" if self.step else f"B{self.B} T{self.T} H{self.H}"
        return f"{dims} K{self.K} V{self.V} {self.dtype}{' step' if self.step else ''}"

    @property
    def case(self):
        """The inputs' _verify.Case: float32 logsig gates, no initial state, a decode state of B
        rows without state_indices."""
        return _verify.Case(self.B, self.T, self.H, self.K, self.V, dtype=self.dtype, gate="logsig",
                            init=False, step=self.step, indices=False, g_dtype="float32")


def _all_shapes():
    s = [Shape("seed", 2, 128, 4, 24, 24, host=True),
         Shape("gla64", 4, 2048, 8, 64, 64),
         Shape("long24", 8, 4096, 16, 24, 24),
         Shape("big128", 8, 4096, 16, 128, 128),
         Shape("big128-bf16", 8, 4096, 16, 128, 128, dtype="bfloat16"),
         Shape("decode", 64, 1, 32, 128, 128, step=True, host=True),
         # one sequence, few heads (a prompt being served): the grid alone leaves SMs idle
         Shape("few24", 1, 2048, 8, 24, 24), Shape("few64", 1, 512, 8, 64, 64)]
    s += [Shape(f"tsweep-{n}k", 1, n * 1024, 16, 128, 128) for n in (1, 2, 4, 8, 16, 32, 64)]
    # the shapes of GLA models (fla's GLA layer: 4 heads, K = hidden/2/4, V = hidden/4); HGRN2-1.3B
    # is big128's
    s += [Shape("gla1.3b-bf16", 8, 4096, 4, 256, 512, dtype="bfloat16"),
          Shape("gla1.3b", 8, 4096, 4, 256, 512),
          Shape("gla340m-bf16", 8, 4096, 4, 128, 256, dtype="bfloat16")]
    return {x.name: x for x in s}


SHAPES = _all_shapes()
GROUPS = {"all": tuple(SHAPES), "tsweep": tuple(n for n in SHAPES if n.startswith("tsweep-")),
          "models": ("gla1.3b-bf16", "gla1.3b", "gla340m-bf16", "big128", "big128-bf16")}
QUICK_SHAPES = ("seed", "gla64", "big128", "decode")


def parse_shapes(text):
    """Shapes named in a comma-separated list (names, or the groups 'all' and 'tsweep'), in the
    order given, each once. ValueError names the choices."""
    names = []
    for part in text.split(","):
        p = part.strip()
        if not p:
            continue
        if p in GROUPS:
            names += GROUPS[p]
        elif p in SHAPES:
            names.append(p)
        else:
            raise ValueError(f"unknown shape {p!r}; choose from {', '.join([*GROUPS, *SHAPES])}")
    if not names:
        raise ValueError("no shape named")
    return [SHAPES[n] for n in dict.fromkeys(names)]


def must_move_bytes(shape, backward=False):
    """Bytes every implementation must move: q, k, g (float32), v read once, o written once;
    decode adds the float32 state, read once and written once; ``backward`` (a forward and a
    backward call) adds the backward's: q, k, g, v, do read once, dq, dk, dg (float32), dv
    written once."""
    io = ITEMSIZE[shape.dtype]
    tokens = shape.B * shape.H * (1 if shape.step else shape.T)
    n = tokens * (shape.K * (2 * io + 4) + 2 * shape.V * io)
    if shape.step:
        n += 2 * shape.B * shape.H * shape.K * shape.V * 4
    if backward:
        n += tokens * (2 * shape.K * (2 * io + 4) + 3 * shape.V * io)
    return n


def floor_for(shape, impl, floor_ms):
    """A row's floor from its shape's (the forward's bytes at the copy rate): the same rate
    over the bytes the row's call must move."""
    return floor_ms * must_move_bytes(shape, is_fwd_bwd(impl)) / must_move_bytes(shape)


def input_set_bytes(shape):
    """Bytes of one input set: q, k, g, v (decode: + the state)."""
    io = ITEMSIZE[shape.dtype]
    tokens = shape.B * shape.H * (1 if shape.step else shape.T)
    n = tokens * (shape.K * (2 * io + 4) + shape.V * io)
    if shape.step:
        n += shape.B * shape.H * shape.K * shape.V * 4
    return n


def n_sets(set_bytes, l2_bytes):
    """Input sets to rotate among: enough to span ROTATE_L2 L2 sizes, 1 for large sets."""
    return int(min(MAX_SETS, max(1, math.ceil(ROTATE_L2 * l2_bytes / max(set_bytes, 1)))))


# ------------------------------------------------------------------------------ implementations

HOST = " (host)"
FWD_BWD = "fwd+bwd"     # the api of forward+backward rows, and the --impl selector of them all


def is_fwd_bwd(impl):
    """Whether a row times a forward and a backward call: its name is '<forward impl>-fwd+bwd'."""
    return impl.endswith("-" + FWD_BWD)


def forward_of(impl):
    """The forward implementation of a row ('ours-auto' of 'ours-auto-fwd+bwd'; else impl)."""
    return impl.removesuffix("-" + FWD_BWD)


OURS_FWD_BWD = "ours-auto-" + FWD_BWD
OURS_KEEP_FWD_BWD = "ours-keep-" + FWD_BWD   # auto, the forward's chunk states kept


class Baseline(NamedTuple):
    """Rows of another implementation in the same table (scripts/baselines.py registers the
    textbook kernel and fla): ``family`` its name or name prefix, ``names`` the implementations
    it provides, ``applies(shape, name)`` whether that row exists at a shape, ``rows(units, job)``
    the rows of its (Shape, name) units after ours (``job``: a dict of reps, budget_s, seed,
    l2_bytes, clock, floors and refs by shape name, notes, on_step, on_row: run()'s), and
    ``available()`` (True, '') or (False, why not)."""
    family: str
    names: tuple
    applies: Callable
    rows: Callable
    available: Callable = lambda: (True, "")


BASELINES = {}


def register(baseline):
    """Add a Baseline's rows to every later run (and its names to --impl)."""
    BASELINES[baseline.family] = baseline


def gpu_methods():
    """The kernel families with a GPU implementation, in _dispatch.METHODS order."""
    return [m for m, where in _dispatch.METHODS.items() if "gpu" in where]


def _ours_names():
    return ["ours-auto", *(f"ours-{m}" for m in gpu_methods()), "ours-step", OURS_FWD_BWD,
            OURS_KEEP_FWD_BWD]


def impl_names():
    """Every implementation a row can name (host rows add ' (host)' to an ours name)."""
    return _ours_names() + [n for b in BASELINES.values() for n in b.names]


def family(impl):
    """'ours', a baseline's family or 'floor': speedups compare a row with other families."""
    return impl.split(" ")[0].split("-")[0]


def parse_impls(text):
    """Selectors from a comma-separated list of families, implementation names or 'fwd+bwd'."""
    sel = [s.strip() for s in text.split(",") if s.strip()]
    known = impl_names()
    choices = list(dict.fromkeys(family(n) for n in known)) + [FWD_BWD]
    for s in sel:
        if s not in known and s not in choices:
            raise ValueError(f"unknown implementation {s!r}; choose from "
                             f"{', '.join(choices + known)}")
    if not sel:
        raise ValueError("no implementation named")
    return tuple(dict.fromkeys(sel))


def selected(impl, selectors):
    """Whether a selector names the row: its name or family; fwd+bwd rows only by name or by
    'fwd+bwd' (a family selects its forward rows, as before they existed), ours-keep-fwd+bwd
    only by name."""
    base = impl[:-len(HOST)] if impl.endswith(HOST) else impl
    if base == OURS_KEEP_FWD_BWD:        # (by name alone: most shapes keep no states)
        return base in selectors
    if is_fwd_bwd(base):
        return base in selectors or FWD_BWD in selectors
    return any(s == base or s == family(base) for s in selectors)


def plan(shapes, selectors, baselines=None):
    """The (shape, impl) units to run, in order: ours, then each of ``baselines`` (the
    registered ones by default) where it applies."""
    baselines = BASELINES.values() if baselines is None else baselines
    units = []
    for s in shapes:
        if s.step:
            cands = ["ours-step"] + (["ours-step" + HOST] if s.host else [])
        else:
            cands = ["ours-auto", *(f"ours-{m}" for m in gpu_methods())]
            cands += ["ours-auto" + HOST] if s.host else []
            cands += [OURS_FWD_BWD, OURS_KEEP_FWD_BWD]
        cands += [n for b in baselines for n in b.names if b.applies(s, n)]
        units += [(s, i) for i in cands if selected(i, selectors)]
    return units


def _impl_rank(impl):
    order = [*_ours_names(), "ours-auto" + HOST, "ours-step" + HOST, *CPU_IMPLS, *CPU_FWD_BWD,
             "cpu-step",
             *(n for b in BASELINES.values() for n in b.names), "floor"]
    return order.index(impl) if impl in order else len(order)


# ---------------------------------------------------------------------------------------- rows

ROW_KEYS = ("shape", "impl", "family", "kind", "status", "note", "api", "B", "T", "H", "K", "V",
            "dtype", "ms", "min_ms", "p10_ms", "p90_ms", "reps", "bytes", "floor_ms", "gbps",
            "pct_floor", "speedup", "rel_err", "f32_rel_err", "err", "bound", "contract_ok",
            "rel_err_vs_ours", "extra_bytes")
KINDS = ("device", "host", "floor")       # device-event time, host wall time, the copy floor
STATUSES = ("ok", "skipped", "failed")


def new_row(shape, impl, kind="device", **kw):
    r = dict.fromkeys(ROW_KEYS)
    bwd = is_fwd_bwd(impl)
    r.update(shape=shape.name, impl=impl, family=family(impl), kind=kind, status="ok", note="",
             api="step" if shape.step else FWD_BWD if bwd else "forward", B=shape.B, T=shape.T,
             H=shape.H, K=shape.K, V=shape.V, dtype=shape.dtype,
             bytes=must_move_bytes(shape, bwd))
    unknown = set(kw) - set(ROW_KEYS)
    if unknown:
        raise KeyError(f"not row keys: {sorted(unknown)}")
    r.update(kw)
    return r


def _pos(x):
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def finish_rows(rows):
    """Fill GB/s, % of floor and speedup in place; returns rows. GB/s = must-move bytes / ms;
    % of floor = floor_ms / ms; speedup = the fastest device-timed row of *another* family
    (ours, or a baseline's) at the same shape and api (forward, step, fwd+bwd) over this row's
    ms (host and floor rows: none)."""
    for r in rows:
        ok = r["status"] == "ok" and _pos(r["ms"])
        r["gbps"] = r["bytes"] / (r["ms"] * 1e-3) / 1e9 if ok and r["bytes"] else None
        r["pct_floor"] = 100.0 * r["floor_ms"] / r["ms"] if ok and _pos(r["floor_ms"]) else None
        r["speedup"] = None
    timed = [r for r in rows if r["kind"] == "device" and r["status"] == "ok" and _pos(r["ms"])]
    for r in timed:
        others = [o["ms"] for o in timed if o["shape"] == r["shape"] and o["api"] == r["api"]
                  and o["family"] != r["family"]]
        if others:
            r["speedup"] = min(others) / r["ms"]
    return rows


def sort_rows(rows, shape_order):
    """By shape, then the forward rows (and the floor) before the fwd+bwd rows, then impl."""
    idx = {n: i for i, n in enumerate(shape_order)}
    return sorted(rows, key=lambda r: (idx.get(r["shape"], len(idx)), r["api"] == FWD_BWD,
                                       _impl_rank(r["impl"])))


def _clean(x):
    """JSON-safe: NumPy scalars to Python, non-finite floats to None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def row_json(r):
    return _clean({k: r[k] for k in ROW_KEYS})


def to_json(result):
    return _clean({"header": result["header"], "copy": result["copy"], "shapes": result["shapes"],
                   "rows": [row_json(r) for r in result["rows"]], "notes": result["notes"]})


def write_json(result, path):
    with open(path, "w") as f:
        json.dump(to_json(result), f, indent=1, allow_nan=False)
        f.write("\n")


# ----------------------------------------------------------------------------------- formatting

COLUMNS = (("shape", "<"), ("impl", "<"), ("ms", ">"), ("GB/s", ">"), ("% of floor", ">"),
           ("speedup", ">"), ("rel_err", ">"), ("f32_err", ">"), ("contract", "<"),
           ("vs_ours", ">"), ("extra", ">"), ("note", "<"))


def _fmt_ms(x):
    if x is None:
        return "-"
    return (f"{x:.6f}" if x < 0.01 else f"{x:.4f}" if x < 1 else f"{x:.3f}" if x < 100
            else f"{x:.1f}")


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _cells(r):
    note = r["note"] if r["status"] == "ok" else f"{r['status']}: {r['note']}"
    contract = {True: "ok", False: "FAIL", None: "-"}[r["contract_ok"]]
    gbps = r["gbps"]
    return [r["shape"], r["impl"], _fmt_ms(r["ms"]),
            "-" if gbps is None else f"{gbps:.0f}" if gbps >= 10 else f"{gbps:.2f}",
            _fmt(r["pct_floor"], ".1f"), _fmt(r["speedup"], ".2f") + ("x" if r["speedup"] else ""),
            _fmt(r["rel_err"], ".1e"), _fmt(r["f32_rel_err"], ".1e"), contract,
            _fmt(r["rel_err_vs_ours"], ".1e"), _fmt_bytes(r["extra_bytes"]), note]


def format_table(rows):
    """Fixed-width table: shape | impl | ms | GB/s | % of floor | speedup | accuracy | extra |
    note."""
    heads = [c for c, _ in COLUMNS]
    body = [_cells(r) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(heads, *body)]

    def line(cells):
        return " | ".join(f"{c:{a}{w}}" for c, (_, a), w in zip(cells, COLUMNS, widths)).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(heads), rule] + [line(c) for c in body])


def header_line(h):
    return (f"# GPU {h['gpu']} (cc {h['cc']}), CUDA runtime {h['cuda_runtime']}, driver "
            f"{h['driver']}, CuPy {h['cupy']}, cupy_gda {h['cupy_gda']}, commit {h['commit']}, "
            f"{h['date']}")


def _fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def summary_lines(result):
    """Lines after the table: the copy, per shape the floor, the legend."""
    c = result["copy"]
    out = [f"# copy: {_fmt_bytes(c['bytes'])} device-to-device, median {c['ms']:.3f} ms of "
           f"{c['reps']} = {c['gbps']:.0f} GB/s (bytes read + written); floor = must-move bytes "
           f"at that rate; an empty kernel times {_fmt_ms(c.get('empty_kernel_ms'))} ms "
           f"between two events (the resolution of the ms column)"]
    for s in result["shapes"]:
        out.append(f"# {s['shape']} ({s['legend']}): must move {s['bytes'] / 1e6:.2f} MB, floor "
                   f"{_fmt_ms(s['floor_ms'])} ms; {s['n_sets']} input set(s) rotated")
    out.append("# ms: median of per-call CUDA-event times (each call queued behind a spin kernel, "
               "so host launch time is excluded); '(host)' rows: host wall time per call, "
               f"{HOST_CALLS} back-to-back calls and one sync")
    out.append("# speedup: fastest row of another family (ours / a baseline's) over this row; "
               "rel_err: relative RMS error vs the float64 NumPy loop on the first sequence, "
               f"first {REF_HEADS} heads, T <= {REF_T_MAX} (f32_err: the float32 NumPy loop's); "
               "contract: err <= 2 f32 err + 1e-6 max|ref|; vs_ours: relative RMS difference "
               "to ours-auto (decode: ours-step) over the whole output")
    out.append("# extra: device memory one call takes beyond its inputs and the arrays it returns "
               "(the peak of CuPy's pool during the call, fla's rows torch's allocator's, minus "
               "the returned bytes)")
    if any(r["api"] == FWD_BWD for r in result["rows"]):
        out.append(f"# {FWD_BWD} rows: one forward call, then the backward with a random do "
                   "(fla: torch.autograd.grad through its op), returning o and dq, dk, dv, dgate "
                   "(fla: dlog_gate / gate); floor and GB/s over both calls' must-move bytes; "
                   "rel_err, vs_ours: the worst gradient's; speedup against other fwd+bwd rows")
    return out + [f"# {n}" for n in result["notes"]]


def plot(rows, path):
    """Log-log time vs T of the tsweep shapes, one line per implementation. Returns a message."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return f"matplotlib not importable: no plot written to {path}"
    lines = {}
    for r in rows:
        if (r["shape"].startswith("tsweep-") and r["status"] == "ok" and _pos(r["ms"])
                and r["kind"] in ("device", "floor")):
            lines.setdefault(r["impl"], []).append((r["T"], r["ms"]))
    if not lines:
        return f"no timed tsweep rows: no plot written to {path}"
    fig = Figure(figsize=(7.5, 5.0))
    ax = fig.add_subplot()
    for impl, pts in lines.items():
        pts.sort()
        ax.loglog([p[0] for p in pts], [p[1] for p in pts], "--" if impl == "floor" else "-o",
                  label=impl, markersize=4)
    r0 = next(r for r in rows if r["shape"].startswith("tsweep-"))
    ax.set_xlabel(f"T (B={r0['B']}, H={r0['H']}, K={r0['K']}, V={r0['V']}, {r0['dtype']})")
    ax.set_ylabel("ms (median)")
    ax.set_title("gated attention forward: time vs T")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"plot written to {path}"


# ------------------------------------------------------------------------------- the device side

def _cupy():
    import cupy
    return cupy


def _err(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200]}" if msg else type(e).__name__


def git_commit():
    """CUPY_GDA_COMMIT if set, else the checkout's short hash (+'-dirty'), else 'unknown'."""
    env = os.environ.get("CUPY_GDA_COMMIT")
    if env:
        return env
    try:
        def git(*a):
            return subprocess.run(["git", "-C", str(REPO_ROOT), *a], capture_output=True,
                                  text=True, timeout=10)
        r = git("rev-parse", "--short", "HEAD")
        if r.returncode != 0 or not r.stdout.strip():
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return r.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cuda_version(v):
    return f"{v // 1000}.{v % 1000 // 10}"


def header_info():
    cp = _cupy()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    cc = str(dev.compute_capability)
    return dict(gpu=name.decode() if isinstance(name, bytes) else str(name),
                cc=f"{cc[:-1]}.{cc[-1]}", cuda_runtime=_cuda_version(cp.cuda.runtime.runtimeGetVersion()),
                driver=_cuda_version(cp.cuda.runtime.driverGetVersion()), cupy=cp.__version__,
                cupy_gda=cupy_gda.__version__, commit=git_commit(),
                date=datetime.now().isoformat(timespec="seconds"),
                l2_bytes=int(props.get("l2CacheSize") or L2_DEFAULT),
                sms=int(props.get("multiProcessorCount") or 0))


class CupyClock:
    """Events, spin and sync on CuPy's current stream; the spin kernel is kernels/bench_spin.cu."""

    def __init__(self):
        self._cp = _cupy()
        self._spin = _compile.get_function("bench_spin", {}, headers=())

    def event(self):
        return self._cp.cuda.Event()

    def elapsed_ms(self, a, b):
        return self._cp.cuda.get_elapsed_time(a, b)

    def sync(self):
        self._cp.cuda.get_current_stream().synchronize()

    def spin(self, ns):
        self._spin((1,), (1,), (np.uint64(ns),))


class Rotor:
    """Cycles through the input sets, one per call."""

    def __init__(self, sets):
        self.sets, self.i = sets, 0

    def __call__(self):
        s = self.sets[self.i % len(self.sets)]
        self.i += 1
        return s


def stats(ms):
    a = np.asarray(ms, dtype=np.float64)
    return dict(ms=float(np.median(a)), min_ms=float(a.min()), p10_ms=float(np.percentile(a, 10)),
                p90_ms=float(np.percentile(a, 90)), reps=int(a.size))


def reps_for(reps, est_ms, budget_s):
    """reps, cut to fit budget_s at est_ms a call, but never below MIN_REPS (or reps if fewer)."""
    fit = int(budget_s * 1e3 / max(est_ms, 1e-3))
    return max(min(reps, MIN_REPS), min(reps, fit))


def spin_ns_for(host_s):
    return int(min(SPIN_MAX_NS, max(SPIN_MIN_NS, 3 * host_s * 1e9 + 20_000)))


def measure(clock, call, reps, budget_s):
    """Warm up (compiles), estimate, then time calls: each call between two events, queued
    behind a spin that outlasts the host's launch time. Returns stats()."""
    call()
    clock.sync()
    host, dev = [], []
    for _ in range(3):
        a, b = clock.event(), clock.event()
        clock.sync()
        a.record()
        t0 = time.perf_counter()
        call()
        host.append(time.perf_counter() - t0)
        b.record()
        b.synchronize()
        dev.append(clock.elapsed_ms(a, b))
    spin = spin_ns_for(float(np.median(host)))
    n = reps_for(reps, float(np.median(dev)) + spin * 1e-6, budget_s)
    starts = [clock.event() for _ in range(n)]
    ends = [clock.event() for _ in range(n)]
    clock.sync()
    for a, b in zip(starts, ends):
        clock.spin(spin)
        a.record()
        call()
        b.record()
    ends[-1].synchronize()
    return stats([clock.elapsed_ms(a, b) for a, b in zip(starts, ends)])


def host_times(call, sync, batches, per_batch):
    """Host wall ms per call: batches of back-to-back calls, one sync at the end of each."""
    call()
    sync()
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            call()
        sync()
        out.append((time.perf_counter() - t0) / per_batch * 1e3)
    return out


def _peak_hook():
    cp = _cupy()

    class PeakHook(cp.cuda.MemoryHook):
        """Peak bytes handed out by CuPy's memory pool while registered."""
        name = "cupy_gda_bench_peak"

        def __init__(self):
            self.live, self.cur, self.peak = {}, 0, 0

        def malloc_postprocess(self, **kw):
            self.live[kw["mem_ptr"]] = kw["size"]
            self.cur += kw["size"]
            self.peak = max(self.peak, self.cur)

        def free_postprocess(self, **kw):
            self.cur -= self.live.pop(kw["mem_ptr"], 0)

    return PeakHook()


def _nbytes(out):
    if out is None:
        return 0
    if isinstance(out, (tuple, list)):
        return sum(_nbytes(x) for x in out)
    return int(out.nbytes)


def peak_extra(call):
    """Bytes CuPy's pool hands out during one call beyond the arrays the call returns."""
    cp = _cupy()
    hook = _peak_hook()
    cp.cuda.Device().synchronize()
    with hook:
        out = call()
        cp.cuda.Device().synchronize()
    return max(0, hook.peak - _nbytes(out))


def measure_copy(clock, nbytes=COPY_BYTES, reps=COPY_REPS, seed=0):
    """Device-to-device copy bandwidth, bytes read + written over the median time."""
    cp = _cupy()
    src = cp.random.default_rng(seed + 12345).standard_normal(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    rt = cp.cuda.runtime

    def call():
        rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, rt.memcpyDeviceToDevice,
                       cp.cuda.get_current_stream().ptr)

    st = measure(clock, call, reps, budget_s=60.0)
    return dict(bytes=int(nbytes), gbps=2 * nbytes / (st["ms"] * 1e-3) / 1e9, **st)


def make_sets(shape, count, seed=0, backward=False):
    """count input sets of the shape (_verify.make_inputs of its case, on the device, drawn one
    after another from one generator); ``backward``: each with a 'do' ~ N(0, 1) in q's dtype,
    drawn after all the sets, so the inputs are the same with or without it."""
    cp = _cupy()
    rng = cp.random.default_rng(seed)
    sets = [_verify.make_inputs(shape.case, rng, cp) for _ in range(count)]
    for s in sets if backward else ():
        do = rng.standard_normal(s["v"].shape, dtype=np.float32)
        s["do"] = _verify._cast(do, _verify._dtype(shape.dtype), cp)
    return sets


def call_ours(shape, s, method="auto", state=None):
    """Our public API on input set ``s`` (decode: on ``state``, else the set's own)."""
    if shape.step:
        return cupy_gda.gated_attention_step(s["q"], s["k"], s["v"], s["gate"],
                                             state=s["state"] if state is None else state)
    return cupy_gda.gated_attention(s["q"], s["k"], s["v"], s["gate"], method=method)


GRADS = ("dq", "dk", "dv", "dgate")     # the gradients a fwd+bwd row checks


def call_ours_fwd_bwd(shape, s, method="auto", keep=False):
    """(o, Gradients): our forward on input set ``s``, then our backward with its 'do', both by
    ``method``; with ``keep`` the forward's ChunkStates handed to the backward."""
    states = None
    if keep:
        o, states = cupy_gda.gated_attention(s["q"], s["k"], s["v"], s["gate"], method=method,
                                             keep_states=True)
    else:
        o = call_ours(shape, s, method)
    return o, cupy_gda.gated_attention_backward(s["q"], s["k"], s["v"], s["gate"], do=s["do"],
                                                method=method, states=states)


def _slice_dims(shape):
    return min(REF_T_MAX, shape.T), min(REF_HEADS, shape.H)


def _cut(shape, x):
    """The reference slice of a [B, T, H, *] array, on the host."""
    Ts, Hs = _slice_dims(shape)
    return host_array(x[0, :Ts])[None, :, :Hs]


def backward_cut(shape, s):
    """The input set whose gradients the fwd+bwd rows check: ``s`` where the reference slice
    keeps all of T (the call timed), else every array of it cut to the slice (the gradients of
    a prefix depend on the steps after it, so the whole call's are not the prefix's)."""
    Ts, Hs = _slice_dims(shape)
    return s if Ts == shape.T else {n: x[:1, :Ts, :Hs] for n, x in s.items()}


def gradient_slices(shape, grads):
    """The reference slice of dq, dk, dv, dgate (of a backward_cut set), on the host."""
    return {n: _cut(shape, x) for n, x in zip(GRADS, grads)}


def reference_slices(shape, s):
    """{'ref': {...}, 'emu': {...}}: the float64 and float32 NumPy loops on the first sequence's
    first heads (T cut to REF_T_MAX) of input set s; 'o', for decode 'state', and where s has a
    'do' the gradients of GRADS (the reverse loop, _verify.backward_references). For half
    dtypes the float32 outputs are rounded to their dtypes (the emulation of _verify)."""
    out = {}
    if shape.step:
        Hs = _slice_dims(shape)[1]
        h = {n: host_array(s[n][0])[None, :Hs] for n in ("q", "k", "v", "gate", "state")}
        for label, dt in (("ref", np.float64), ("emu", np.float32)):
            st = h["state"].astype(dt)
            o = reference.gated_attention_step_ref(h["q"], h["k"], h["v"], h["gate"], state=st,
                                                   dtype=dt)
            out[label] = dict(o=o, state=st)
    else:
        h = {n: _cut(shape, x) for n, x in s.items()}
        args = {n: h[n] for n in ("q", "k", "v", "gate")}
        for label, dt in (("ref", np.float64), ("emu", np.float32)):
            out[label] = dict(o=reference.gated_attention_ref(**args, dtype=dt))
        if "do" in h:
            grads = _verify.backward_references(shape.case, args, h["do"], None)
            for label, g in zip(("ref", "emu"), grads):
                out[label].update(zip(GRADS, g))
    if shape.dtype != "float32":
        out["emu"]["o"] = out["emu"]["o"].astype(_verify._dtype(shape.dtype))
    return out


def output_slices(shape, o, state=None):
    """The same slice of an output (and decode's state) as reference_slices, on the host."""
    if shape.step:
        Hs = _slice_dims(shape)[1]
        got = dict(o=host_array(o[0])[None, :Hs])
        if state is not None:
            got["state"] = host_array(state[0])[None, :Hs]
        return got
    return dict(o=_cut(shape, o))



def accuracy(refs, got):
    """rel_err, f32_rel_err, err, bound, contract_ok over the tensors of got (the worst one)."""
    worst, ok = None, True
    for name, x in got.items():
        ref, emu = refs["ref"][name], refs["emu"][name]
        r = _verify.compare(name, x, ref, emu)
        ref64 = _verify._f64(ref)
        f32 = _verify.rms(_verify._f64(emu) - ref64) / max(_verify.rms(ref64), 1e-300)
        ok = ok and r.ok
        if worst is None or not r.rel_rms <= worst[0].rel_rms:
            worst = (r, f32)
    if worst is None:
        return {}
    r, f32 = worst
    return dict(rel_err=r.rel_rms, f32_rel_err=f32, err=r.err, bound=r.bound, contract_ok=bool(ok))


def rel_rms_device(a, b):
    """The relative RMS difference of two device arrays, ||a - b|| / ||b||."""
    cp = _cupy()
    a, b = a.astype(cp.float64), b.astype(cp.float64)
    return float(cp.linalg.norm(a - b) / max(float(cp.linalg.norm(b)), 1e-300))

def _run_shape(shape, impls, floor_ms, clock, l2, reps, budget_s, seed, on_step, on_row,
               backward):
    """Rows of one shape (ours, host rows, and its floor) and its reference slices (with
    ``backward``, a fwd+bwd row of some family at the shape: the gradients' too)."""
    count = n_sets(input_set_bytes(shape), l2)
    sets = make_sets(shape, count, seed, backward)
    s0 = sets[0]
    state0 = s0["state"].copy() if shape.step else None
    refs = reference_slices(shape, s0)
    rows = [new_row(shape, "floor", kind="floor", ms=floor_ms, floor_ms=floor_ms)]

    def ours(impl):
        keep = impl == OURS_KEEP_FWD_BWD
        method = "auto" if keep else forward_of(impl)[len("ours-"):]
        fwd_bwd = is_fwd_bwd(impl)

        def call(s):
            if fwd_bwd:
                return call_ours_fwd_bwd(shape, s, method, keep)
            return call_ours(shape, s, method)

        if fwd_bwd:
            acc = accuracy(refs, gradient_slices(shape, call(backward_cut(shape, s0))[1]))
            extra = peak_extra(lambda: call(s0))
        elif shape.step:                  # on a copy of set 0's state as it was drawn
            state = state0.copy()
            o = call_ours(shape, s0, state=state)
            acc = accuracy(refs, output_slices(shape, o, state))
            extra = peak_extra(lambda: call_ours(shape, s0, state=state))
        else:
            acc = accuracy(refs, output_slices(shape, call(s0)))
            extra = peak_extra(lambda: call(s0))
        rot = Rotor(sets)
        tm = measure(clock, lambda: call(rot()), reps, budget_s)
        return new_row(shape, impl, floor_ms=floor_for(shape, impl, floor_ms), extra_bytes=extra,
                       **tm, **acc)

    def host(impl):
        method = impl[len("ours-"):-len(HOST)]
        rot = Rotor(sets)
        ms = host_times(lambda: call_ours(shape, rot(), method), clock.sync,
                        max(MIN_REPS, min(reps, HOST_BATCHES)), HOST_CALLS)
        return new_row(shape, impl, kind="host", floor_ms=floor_ms, **stats(ms),
                       note="host wall time per call")

    for impl in impls:
        on_step(f"{shape.name} {impl}")
        kind = "host" if impl.endswith(HOST) else "device"
        try:
            r = host(impl) if kind == "host" else ours(impl)
        except Exception as e:  # noqa: BLE001 - a failing row is reported, the run goes on
            r = new_row(shape, impl, kind=kind, status="failed",
                        floor_ms=floor_for(shape, impl, floor_ms), note=_err(e))
        rows.append(r)
        on_row(r)
    info = dict(shape=shape.name, legend=shape.legend, B=shape.B, T=shape.T, H=shape.H,
                K=shape.K, V=shape.V, dtype=shape.dtype, api="step" if shape.step else "forward",
                bytes=must_move_bytes(shape), floor_ms=floor_ms, n_sets=count,
                set_bytes=input_set_bytes(shape), extra_bytes={})
    return rows, info, refs


def run(units, reps=DEFAULT_REPS, budget_s=DEFAULT_BUDGET_S, seed=0, on_step=None,
        on_row=None):
    """Time every (shape, impl) unit of plan(): ours shape by shape, then each registered
    baseline's units. ``on_step(label)`` as a unit starts, ``on_row(row)`` as its row is done
    (a baseline's: at least shape, impl, status, ms, note), so a run cut short still shows what
    it measured. Returns dict(header, copy, shapes, rows, notes)."""
    cp = _cupy()
    on_step = on_step or (lambda label: None)
    on_row = on_row or (lambda row: None)
    header = header_info()
    clock = CupyClock()
    copy = measure_copy(clock, seed=seed)
    # the resolution of the ms column: an empty kernel between two events
    copy["empty_kernel_ms"] = measure(clock, lambda: clock.spin(0), COPY_REPS, 10.0)["ms"]
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    shapes = list(dict.fromkeys(s for s, _ in units))
    theirs = {n: b for b in BASELINES.values() for n in b.names}
    rows, infos, refs, notes = [], [], {}, []
    for shape in shapes:
        impls = [i for s, i in units if s == shape and i not in theirs]
        backward = any(is_fwd_bwd(i) for s, i in units if s == shape)
        floor_ms = must_move_bytes(shape) / (copy["gbps"] * 1e9) * 1e3
        r, info, refs[shape.name] = _run_shape(shape, impls, floor_ms, clock, header["l2_bytes"],
                                               reps, budget_s, seed, on_step, on_row, backward)
        rows += r
        infos.append(info)
        gc.collect()
        pool.free_all_blocks()          # this shape's input sets went with _run_shape
    job = dict(reps=reps, budget_s=budget_s, seed=seed, l2_bytes=header["l2_bytes"], clock=clock,
               floors={i["shape"]: i["floor_ms"] for i in infos}, refs=refs, notes=notes,
               on_step=on_step, on_row=on_row)
    for b in BASELINES.values():
        mine = [(s, i) for s, i in units if theirs.get(i) is b]
        if mine:
            rows += b.rows(mine, job)
            gc.collect()
            pool.free_all_blocks()
    for info in infos:
        info["extra_bytes"] = {r["impl"]: r["extra_bytes"] for r in rows
                               if r["shape"] == info["shape"] and r["extra_bytes"] is not None}
    rows = sort_rows(finish_rows(rows), [s.name for s in shapes])
    return dict(header=header, copy=copy, shapes=infos, rows=rows, notes=notes)


# -------------------------------------------------------------------------------- the CPU side

CPU_T_MAX = 256                 # CPU rows cut T to this: whole-T rows take minutes on a CPU
CPU_SHAPES = ("seed", "gla64", "long24", "few24", "few64", "big128", "gla1.3b", "decode")
CPU_IMPLS = ("cpu-auto", "cpu-recurrent", "cpu-chunk")     # forward; decode: cpu-step
# forward+backward: the same method for both calls (auto: each call's own pick)
CPU_FWD_BWD = tuple(f"{i}-{FWD_BWD}" for i in CPU_IMPLS)


def cpu_header_info():
    import platform
    return dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
                numpy=np.__version__, cupy_gda=cupy_gda.__version__, commit=git_commit(),
                date=datetime.now().isoformat(timespec="seconds"))


def cpu_header_line(h):
    return (f"# CPU {h['cpu']} ({h['cores']} cores), NumPy {h['numpy']}, cupy_gda "
            f"{h['cupy_gda']}, commit {h['commit']}, {h['date']}")


def run_cpu(shapes, reps=DEFAULT_REPS, budget_s=DEFAULT_BUDGET_S, seed=0, t_max=CPU_T_MAX,
            on_step=None, on_row=None):
    """The CPU rows (NumPy inputs, the public API): per forward shape cpu-auto, cpu-recurrent
    and cpu-chunk (``method=``) and the same three as forward+backward rows (a forward call
    then a backward call by that method, with a random gradient of o; the gradients checked),
    for decode cpu-step; T cut to ``t_max``. ms: the median of host wall times per call (at
    least MIN_REPS calls, at most ``reps`` or ``budget_s`` seconds); accuracy as the device
    rows'; ``on_step``, ``on_row`` as run()'s. Returns dict(header, copy (None), shapes ([]),
    rows, notes), as run()."""
    on_step = on_step or (lambda label: None)
    on_row = on_row or (lambda row: None)
    rows = []
    for shape in shapes:
        s = shape if shape.step else shape._replace(T=min(shape.T, t_max))
        x = _verify.make_inputs(s.case, seed)
        if not s.step:
            x["do"] = _verify.backward_inputs(s.case, x, seed)[0]
        refs = reference_slices(s, x)
        note = f"T cut to {s.T} of {shape.T}" if s.T != shape.T else ""
        for impl in cpu_impls(s):
            on_step(f"{s.name} {impl}")
            method = forward_of(impl)[len("cpu-"):]
            try:
                if is_fwd_bwd(impl):
                    def call():
                        return call_ours_fwd_bwd(s, x, method)
                    acc = accuracy(refs, gradient_slices(s, call()[1]))
                elif s.step:
                    state = x["state"].copy()
                    o = cupy_gda.gated_attention_step(x["q"], x["k"], x["v"], x["gate"],
                                                      state=state)
                    acc = accuracy(refs, output_slices(s, o, state))

                    def call():
                        return cupy_gda.gated_attention_step(x["q"], x["k"], x["v"], x["gate"],
                                                             state=state)
                else:
                    def call():
                        return cupy_gda.gated_attention(x["q"], x["k"], x["v"], x["gate"],
                                                        method=method)
                    acc = accuracy(refs, output_slices(s, call()))
                t0 = time.perf_counter()
                call()
                n = reps_for(reps, (time.perf_counter() - t0) * 1e3, budget_s)
                ms = host_times(call, lambda: None, n, 1)
                r = new_row(s, impl, kind="host", **stats(ms), **acc, note=note)
            except Exception as e:  # noqa: BLE001 - a failing row is reported, the run goes on
                r = new_row(s, impl, kind="host", status="failed", note=_err(e))
            rows.append(r)
            on_row(r)
    rows = sort_rows(finish_rows(rows), [s.name for s in shapes])
    return dict(header=cpu_header_info(), copy=None, shapes=[], rows=rows,
                notes=[f"CPU rows: host wall time per call of the public API on NumPy inputs "
                       f"(median), T cut to {t_max}; GB/s over the must-move bytes of the cut "
                       f"shape; fwd+bwd rows: a forward call, then the backward by the same "
                       f"method with a random do (rel_err: the worst gradient's)"])


def cpu_impls(shape):
    """The CPU rows of a shape: cpu-step at decode, else the forward and forward+backward ones."""
    return ("cpu-step",) if shape.step else CPU_IMPLS + CPU_FWD_BWD


def failures(rows):
    """Ours rows (GPU or CPU) that failed to run or broke the accuracy contract."""
    return [r for r in rows if r["family"] in ("ours", "cpu")
            and (r["status"] == "failed" or r["contract_ok"] is False)]
