"""Other implementations in the bench table: `cupy-gda bench` with two more families.

- ``textbook``: scripts/textbook_gda.cu (one block per (b, h), S in shared memory, three
  barriers per step), float32 forward shapes only, checked against ours before it is timed.
- ``fla-chunk_gla`` and ``fla-fused_recurrent_gla`` when ``torch`` and ``fla`` import (never a
  dependency: clone github.com/fla-org/flash-linear-attention and put the folder that holds
  its ``fla/`` package on PYTHONPATH; the project's device runs use an ignored ``.baselines/``
  folder at the repository root, which a fresh clone does not have). They run in a child
  process, so that a Triton autotune running past ``--fla-timeout`` can be stopped without
  stopping the benchmark.
- ``fla-chunk_gla-fwd+bwd`` and ``fla-fused_recurrent_gla-fwd+bwd`` (as ours-auto-fwd+bwd:
  only by name or ``--impl fwd+bwd``): the op with q, k, v, log(gate) requiring grad, then
  ``torch.autograd.grad(o, ..., do)`` (the gradients returned, never accumulated in ``.grad``),
  timed together; dgate = dlog_gate / gate; extra memory from torch's allocator peak.

    python -m scripts.baselines [--fla-timeout 120] [cupy-gda bench options]
    PYTHONPATH=.baselines python -m scripts.baselines --impl ours,fla --shapes big128
    PYTHONPATH=.baselines python -m scripts.baselines --impl fwd+bwd --shapes big128

Run from the repository root. Importing this module registers both families with
cupy_gda.bench and touches no GPU.
"""
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from cupy_gda import bench
from cupy_gda.bench import Baseline, Rotor, new_row

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TEXTBOOK_CU = HERE / "textbook_gda.cu"
TEXTBOOK_TOL = 1e-4             # max |textbook - ours| / max |ours|
FLA_FORWARD = ("fla-chunk_gla", "fla-fused_recurrent_gla")
FLA_IMPLS = FLA_FORWARD + tuple(f"{n}-{bench.FWD_BWD}" for n in FLA_FORWARD)    # every fla row
FLA_TIMEOUT = 120.0             # seconds an fla warm-up (Triton autotune) may take (--fla-timeout)
WORKER_PREFIX = "@@cupy_gda.bench "
WORKER_TIMEOUT_RC = 3


# ------------------------------------------------------------------------------------ textbook

_textbooks = {}


def _textbook(K, V):
    """(kernel, threads, dynamic shared bytes) of textbook_gda.cu for K, V."""
    cp = bench._cupy()
    dev = cp.cuda.Device().id
    key = (id(cp), dev, K, V)          # the tests swap in a stand-in CuPy: never mix the two
    if key not in _textbooks:
        nt = min(1024, -(-V // 32) * 32)
        smem = (K * V + 3 * K + V) * 4
        optin = int(cp.cuda.runtime.getDeviceProperties(dev).get("sharedMemPerBlockOptin", 0))
        if optin and smem > optin:
            raise ValueError(f"textbook kernel: a {K}x{V} state needs {smem} B of shared "
                             f"memory, the device allows at most {optin}")
        pre = f"#define K_DIM {K}\n#define V_DIM {V}\n#define NT {nt}\n"
        fn = cp.RawModule(code=pre + TEXTBOOK_CU.read_text(),
                          options=("-std=c++17",)).get_function("textbook_gda")
        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
        _textbooks[key] = (fn, nt, smem)
    return _textbooks[key]


def textbook_row(shape, job):
    """The textbook kernel's row at one shape: checked against ours, then timed."""
    floor_ms = job["floors"][shape.name]
    if shape.dtype != "float32":
        return new_row(shape, "textbook", status="skipped", floor_ms=floor_ms,
                       note="the textbook kernel is float32 only")
    cp = bench._cupy()
    fn, nt, smem = _textbook(shape.K, shape.V)
    sets = bench.make_sets(shape, bench.n_sets(bench.input_set_bytes(shape), job["l2_bytes"]),
                           job["seed"])

    def launch(s):
        o = cp.empty((shape.B, shape.T, shape.H, shape.V), cp.float32)
        fn((shape.B * shape.H,), (nt,), (s["q"], s["k"], s["v"], s["gate"], o, np.int64(shape.T),
                                          np.int32(shape.H), np.float32(1.0)), shared_mem=smem)
        return o

    o, ours = launch(sets[0]), bench.call_ours(shape, sets[0])
    worst = float(cp.abs(o - ours).max()) / max(float(cp.abs(ours).max()), 1e-30)
    acc = bench.accuracy(job["refs"][shape.name], bench.output_slices(shape, o))
    vs = bench.rel_rms_device(o, ours)
    if not worst < TEXTBOOK_TOL:
        return new_row(shape, "textbook", status="failed", floor_ms=floor_ms, rel_err_vs_ours=vs,
                       note=f"differs from ours: max|diff|/max|ours| = {worst:.1e} > "
                            f"{TEXTBOOK_TOL:.0e}, not timed", **acc)
    extra = bench.peak_extra(lambda: launch(sets[0]))
    rot = Rotor(sets)
    tm = bench.measure(job["clock"], lambda: launch(rot()), job["reps"], job["budget_s"])
    return new_row(shape, "textbook", floor_ms=floor_ms, rel_err_vs_ours=vs, extra_bytes=extra,
                   **tm, **acc)


def textbook_rows(units, job):
    rows = []
    for shape, impl in units:
        job["on_step"](f"{shape.name} {impl}")
        try:
            rows.append(textbook_row(shape, job))
        except Exception as e:  # noqa: BLE001 - a failing row is reported, the run goes on
            rows.append(new_row(shape, impl, status="failed", floor_ms=job["floors"][shape.name],
                                note=bench._err(e)))
        job.get("on_row", _ignore)(rows[-1])
    return rows


TEXTBOOK = Baseline("textbook", ("textbook",), lambda shape, name: not shape.step, textbook_rows)


# ----------------------------------------------------------------- fla, in a child process

def _ignore(row):
    """on_row where a job has none (the tests' jobs)."""


def fla_available():
    """(True, '') when torch and fla can be found (not imported here), else (False, why)."""
    import importlib.util
    missing = []
    for mod in ("torch", "fla"):
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(mod)
    if missing:
        return False, (f"{' and '.join(missing)} not importable (fla: clone "
                       f"github.com/fla-org/flash-linear-attention and put the folder holding "
                       f"its fla/ package on PYTHONPATH)")
    return True, ""


def _fla_applies(shape, name):
    return name == "fla-fused_recurrent_gla" or not shape.step


def parse_worker_lines(text):
    """The JSON messages in a worker's stdout (other lines, e.g. library warnings, skipped)."""
    out = []
    for line in text.splitlines():
        if line.startswith(WORKER_PREFIX):
            try:
                out.append(json.loads(line[len(WORKER_PREFIX):]))
            except json.JSONDecodeError:
                continue
    return out


def fla_rows(units, job, timeout=FLA_TIMEOUT):
    """Rows of the fla units, timed by fla_worker in child processes: one child runs the units
    in order; when one stops it (a warm-up past --fla-timeout, or a crash), the unit it was on
    is reported and a new child takes the rest."""
    pending = [(s.name, impl) for s, impl in units]
    shapes = {s.name: s for s, _ in units}
    results, on_step, on_row = {}, job["on_step"], job.get("on_row", _ignore)
    unavailable = None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="cupy_gda_bench_") as tmp:
        while pending and unavailable is None:
            job_path = Path(tmp) / "job.json"
            job_path.write_text(json.dumps(dict(
                reps=job["reps"], budget_s=job["budget_s"], seed=job["seed"], fla_timeout=timeout,
                l2_bytes=job["l2_bytes"], outdir=tmp,
                items=[(n, i, list(shapes[n])) for n, i in pending])))
            err_path = Path(tmp) / "stderr.txt"
            backstop = len(pending) * (timeout + 3 * job["budget_s"] + 120) + 120
            with open(err_path, "w") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-c", "import sys; from scripts.baselines import fla_worker; "
                     "fla_worker(sys.argv[1])", str(job_path)],
                    stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=str(ROOT))
                killer = threading.Timer(backstop, proc.kill)
                killer.start()
                try:
                    for line in proc.stdout:
                        for msg in parse_worker_lines(line):
                            if "unavailable" in msg:
                                unavailable = msg["unavailable"]
                                continue
                            key = (msg.get("shape"), msg.get("impl"))
                            results[key] = msg
                            on_step(f"{key[0]} {key[1]}")
                            on_row(dict(msg, status=msg.get("status", "failed")))
                finally:
                    rc = proc.wait()
                    killer.cancel()
            progressed = any(u in results for u in pending)
            pending = [u for u in pending if u not in results]
            if rc == WORKER_TIMEOUT_RC and progressed:
                continue                    # the watchdog reported its unit; a new child goes on
            if pending and unavailable is None:
                tail = [ln for ln in err_path.read_text(errors="replace").splitlines() if ln.strip()]
                first = pending.pop(0)
                why = f"fla worker exited with code {rc}" + (f": {tail[-1][:200]}" if tail else "")
                results[first] = dict(shape=first[0], impl=first[1], status="failed", note=why)
                on_step(f"{first[0]} {first[1]}")
                on_row(results[first])
        if unavailable is not None:
            job["notes"].append(f"fla: not importable in the worker ({unavailable}); no fla rows")
            return []
        rows = []
        for shape, impl in units:
            msg = results[(shape.name, impl)]
            kw = {k: msg.get(k) for k in ("ms", "min_ms", "p10_ms", "p90_ms", "reps",
                                          "rel_err_vs_ours", "extra_bytes")}
            floor = job["floors"].get(shape.name)
            r = new_row(shape, impl, status=msg.get("status", "failed"), note=msg.get("note", ""),
                        floor_ms=floor and bench.floor_for(shape, impl, floor), **kw)
            path = msg.get("slices")
            if r["status"] == "ok" and path and Path(path).is_file():
                with np.load(path) as z:
                    r.update(bench.accuracy(job["refs"][shape.name], {k: z[k] for k in z.files}))
            rows.append(r)
    return rows


FLA = Baseline("fla", FLA_IMPLS, _fla_applies, fla_rows, fla_available)


def _emit(msg):
    sys.stdout.write(WORKER_PREFIX + json.dumps(bench._clean(msg)) + "\n")
    sys.stdout.flush()


def _watchdog(seconds, shape, impl):
    """Ends this process (after reporting the unit as skipped) unless cancelled in time."""
    def fire():
        msg = dict(shape=shape, impl=impl, status="skipped",
                   note=f"warm-up (autotune) took over {seconds:g} s (--fla-timeout)")
        os.write(1, (WORKER_PREFIX + json.dumps(msg) + "\n").encode())
        os._exit(WORKER_TIMEOUT_RC)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


class TorchClock:
    """Events, spin and sync on torch's current stream (fla's kernels run there)."""

    def __init__(self, torch):
        self._t = torch
        # torch's default stream is CuPy's (the legacy default stream): CuPy's spin will do
        self._cupy_spin = None if hasattr(torch.cuda, "_sleep") else bench.CupyClock()

    def event(self):
        return self._t.cuda.Event(enable_timing=True)

    def elapsed_ms(self, a, b):
        return a.elapsed_time(b)

    def sync(self):
        self._t.cuda.synchronize()

    def spin(self, ns):
        if self._cupy_spin is not None:
            self._cupy_spin.spin(ns)
        else:
            self._t.cuda._sleep(int(2 * ns))     # cycles; the SM clock is <= 2 GHz, so >= ns


def _to_torch(torch, x):
    """A CuPy array as a torch tensor, zero-copy (bfloat16 through a uint16 view if need be)."""
    try:
        return torch.from_dlpack(x)
    except Exception:  # noqa: BLE001 - only the bfloat16 fallback below is known
        if x.dtype.name == "bfloat16":
            return torch.from_dlpack(x.view(np.uint16)).view(torch.bfloat16)
        raise


def _rel_rms_torch(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def fla_worker(job_path):
    """Child process: time fla's kernels on the units of the job file, one JSON line each."""
    job = json.loads(Path(job_path).read_text())
    try:
        import torch
        from fla.ops.gla import chunk_gla, fused_recurrent_gla
    except Exception as e:  # noqa: BLE001 - whatever stops the import, fla is unavailable
        _emit({"unavailable": bench._err(e)})
        return
    cp = bench._cupy()
    fns = {"fla-chunk_gla": chunk_gla, "fla-fused_recurrent_gla": fused_recurrent_gla}
    backward = {n for n, impl, _ in job["items"] if bench.is_fwd_bwd(impl)}     # shapes with do
    clock = TorchClock(torch)
    current, inp = None, None
    with torch.no_grad():
        for name, impl, fields in job["items"]:
            shape = bench.Shape(*fields)
            try:
                if current != name:
                    current, inp = None, None
                    cp.get_default_memory_pool().free_all_blocks()
                    torch.cuda.empty_cache()
                    inp = _fla_inputs(shape, job, torch, name in backward)
                    current = name
                res = _fla_unit(shape, impl, fns[bench.forward_of(impl)], inp, job, clock, torch)
            except Exception as e:  # noqa: BLE001 - a failing unit is reported, the rest run
                res = dict(status="failed", note=bench._err(e))
            _emit(dict(shape=name, impl=impl, **res))


def _fla_inputs(shape, job, torch, backward=False):
    """The bench's input sets (same seed, same sets; ``backward``: with do), with torch views
    and fla's log-gates."""
    sets = bench.make_sets(shape, bench.n_sets(bench.input_set_bytes(shape), job["l2_bytes"]),
                           job["seed"], backward)
    tsets = []
    for s in sets:
        t = {n: _to_torch(torch, x) for n, x in s.items()}
        t["lg"] = torch.log(t["gate"])               # fla's gates are log-space
        if shape.step:
            for n in ("q", "k", "v", "lg"):
                t[n + "1"] = t[n].unsqueeze(1)        # [B, 1, H, *]: T = 1
        tsets.append(t)
    torch.cuda.synchronize()
    return dict(sets=sets, tsets=tsets)


def _fla_forward(shape, impl, fn):
    """fla's forward call on a torch input set: (o, final state or None)."""
    if shape.step:
        def one(t):
            return fn(t["q1"], t["k1"], t["v1"], gk=t["lg1"], scale=1.0, initial_state=t["state"],
                      output_final_state=True)
    elif impl == "fla-chunk_gla":
        def one(t):
            return fn(t["q"], t["k"], t["v"], g=t["lg"], scale=1.0, initial_state=None,
                      output_final_state=False)
    else:
        def one(t):
            return fn(t["q"], t["k"], t["v"], gk=t["lg"], scale=1.0, initial_state=None,
                      output_final_state=False)
    return one


def _fla_fwd_bwd(fwd, torch):
    """fwd then its gradients with the set's do: (o, dq, dk, dv, dlog_gate). The inputs become
    leaves that require grad for the call (views: no copy); the gradients are returned, never
    accumulated."""
    def one(t):
        with torch.enable_grad():
            leaves = [t[n].detach().requires_grad_() for n in ("q", "k", "v", "lg")]
            o, _ = fwd(dict(t, q=leaves[0], k=leaves[1], v=leaves[2], lg=leaves[3]))
            return (o, *torch.autograd.grad(o, leaves, t["do"]))
    return one


def _fla_check_forward(shape, one, t0, s0, torch):
    """(vs ours over the whole output, the reference slices) of fla's forward on set 0."""
    cp = bench._cupy()
    Ts, Hs = bench._slice_dims(shape)
    o, ht = one(t0)
    if shape.step:
        st = s0["state"].copy()
        ours_o = bench.call_ours(shape, s0, state=st)
        cp.cuda.Device().synchronize()
        fo = o[:, 0]
        vs = max(_rel_rms_torch(fo, _to_torch(torch, ours_o)),
                 _rel_rms_torch(ht, _to_torch(torch, st)))
        return vs, dict(o=fo[0:1, :Hs].float().cpu().numpy(),
                        state=ht[0:1, :Hs].float().cpu().numpy())
    ours_o = bench.call_ours(shape, s0)
    cp.cuda.Device().synchronize()
    return (_rel_rms_torch(o, _to_torch(torch, ours_o)),
            dict(o=o[0:1, :Ts, :Hs].float().cpu().numpy()))


def _fla_check_fwd_bwd(shape, one, t0, s0, torch):
    """As _fla_check_forward for the gradients (the worst one; dgate = dlog_gate / gate): vs
    ours over the whole call, the reference slices of bench.backward_cut's call."""
    cp = bench._cupy()
    Ts, Hs = bench._slice_dims(shape)

    def grads(t):
        _, dq, dk, dv, dlg = one(t)
        return dq, dk, dv, dlg / t["gate"]

    ours = bench.call_ours_fwd_bwd(shape, s0)[1]
    cp.cuda.Device().synchronize()
    vs = max(_rel_rms_torch(a, _to_torch(torch, b)) for a, b in zip(grads(t0), ours))
    cut = grads(bench.backward_cut(shape, t0))
    return vs, {n: x[0:1, :Ts, :Hs].float().cpu().numpy() for n, x in zip(bench.GRADS, cut)}


def _fla_unit(shape, impl, fn, inp, job, clock, torch):
    one = _fla_forward(shape, bench.forward_of(impl), fn)
    check = _fla_check_forward
    if bench.is_fwd_bwd(impl):
        one, check = _fla_fwd_bwd(one, torch), _fla_check_fwd_bwd
    t0, s0 = inp["tsets"][0], inp["sets"][0]

    # warm-up: the first call at a new shape autotunes; bounded by the watchdog
    start = time.perf_counter()
    dog = _watchdog(job["fla_timeout"], shape.name, impl)
    try:
        one(t0)
        torch.cuda.synchronize()
    finally:
        dog.cancel()
    warm_s = time.perf_counter() - start

    # accuracy: vs ours over the whole output, and the reference slice (compared by the parent)
    vs, slices = check(shape, one, t0, s0, torch)
    path = Path(job["outdir"]) / f"{shape.name}__{impl}.npz"
    np.savez(path, **slices)

    # extra device memory: torch's allocator peak during one call, beyond what it returns
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = one(t0)
    torch.cuda.synchronize()
    returned = sum(x.numel() * x.element_size() for x in out if x is not None)
    extra = max(0, torch.cuda.max_memory_allocated() - before - returned)
    del out

    rot = Rotor(inp["tsets"])
    tm = bench.measure(clock, lambda: one(rot()), job["reps"], job["budget_s"])
    return dict(status="ok", note=f"warm-up {warm_s:.1f} s", rel_err_vs_ours=vs,
                extra_bytes=int(extra), slices=str(path), **tm)


bench.register(TEXTBOOK)
bench.register(FLA)


def main(argv=None):
    """`cupy-gda bench` with the textbook and fla families; --fla-timeout S bounds fla's warm-up."""
    from cupy_gda.cli import main as cli_main
    args = list(sys.argv[1:] if argv is None else argv)
    if "--fla-timeout" in args:
        i = args.index("--fla-timeout")
        bench.register(FLA._replace(rows=functools.partial(fla_rows, timeout=float(args[i + 1]))))
        del args[i:i + 2]
    cli_main(["bench", *args], prog_name="python -m scripts.baselines")


if __name__ == "__main__":
    main()
