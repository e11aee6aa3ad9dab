"""scripts/baselines.py: the textbook kernel's and fla's rows in `cupy-gda bench`'s table (its
registry, fla's worker protocol, a whole run on a stand-in CuPy, one short run on the GPU)."""
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from click.testing import CliRunner

from cupy_gda import bench, cli, reference
from scripts import baselines


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    monkeypatch.setattr(bench, "BASELINES", {"textbook": baselines.TEXTBOOK, "fla": baselines.FLA})


def invoke(*args):
    return CliRunner().invoke(cli.main, ["bench", *args])


def _row(impl, ms, shape="seed", **kw):
    kind = "floor" if impl == "floor" else "host" if impl.endswith("(host)") else "device"
    kw.setdefault("floor_ms", ms if impl == "floor" else 0.01)
    return bench.new_row(bench.SHAPES[shape], impl, kind=kind, ms=ms, **kw)


def test_units_of_every_family():
    seed, dec, bf = bench.SHAPES["seed"], bench.SHAPES["decode"], bench.SHAPES["big128-bf16"]
    units = [i for _, i in bench.plan([seed], ("ours", "textbook", "fla"))]
    assert units == ["ours-auto", *(f"ours-{m}" for m in bench.gpu_methods()),
                     "ours-auto (host)", "textbook", *baselines.FLA_FORWARD]
    assert [i for _, i in bench.plan([dec], ("ours", "textbook", "fla"))] == [
        "ours-step", "ours-step (host)", "fla-fused_recurrent_gla"]
    assert [i for _, i in bench.plan([dec], ("ours",), ())] == ["ours-step", "ours-step (host)"]
    # bf16: the textbook row is kept (it reports itself skipped: float32 only)
    assert "textbook" in [i for _, i in bench.plan([bf], ("textbook",))]


def test_units_of_the_fwd_bwd_rows():
    seed, dec = bench.SHAPES["seed"], bench.SHAPES["decode"]
    assert [i for _, i in bench.plan([seed, dec], ("fwd+bwd",))] == [
        "ours-auto-fwd+bwd", "fla-chunk_gla-fwd+bwd", "fla-fused_recurrent_gla-fwd+bwd"]
    assert not [i for _, i in bench.plan([seed], ("ours", "textbook", "fla")) if "fwd+bwd" in i]
    assert [i for _, i in bench.plan([seed], ("fla", "fla-chunk_gla-fwd+bwd"))] == [
        *baselines.FLA_FORWARD, "fla-chunk_gla-fwd+bwd"]
    assert bench.parse_impls("fla-fused_recurrent_gla-fwd+bwd, fwd+bwd") == (
        "fla-fused_recurrent_gla-fwd+bwd", "fwd+bwd")


def test_parse_impls_knows_the_baselines():
    assert bench.parse_impls("ours, fla") == ("ours", "fla")
    assert bench.selected("fla-chunk_gla", ("fla",))
    assert not bench.selected("textbook", ("ours", "fla"))


def test_rows_sort_by_shape_then_implementation():
    rows = [_row("floor", 0.01), _row("fla-chunk_gla", 1.0), _row("ours-auto", 1.0, shape="gla64"),
            _row("textbook", 1.0), _row("ours-auto (host)", 1.0), _row("ours-auto", 1.0)]
    got = [(r["shape"], r["impl"]) for r in bench.sort_rows(rows, ["seed", "gla64"])]
    assert got == [("seed", "ours-auto"), ("seed", "ours-auto (host)"), ("seed", "textbook"),
                   ("seed", "fla-chunk_gla"), ("seed", "floor"), ("gla64", "ours-auto")]


def test_fwd_bwd_rows_sort_after_every_forward_row():
    rows = [_row("fla-chunk_gla-fwd+bwd", 2.0), _row("ours-auto-fwd+bwd", 3.0), _row("floor", 0.01),
            _row("fla-chunk_gla", 1.0), _row("textbook", 1.0), _row("ours-auto", 1.0)]
    got = [r["impl"] for r in bench.sort_rows(rows, ["seed"])]
    assert got == ["ours-auto", "textbook", "fla-chunk_gla", "floor", "ours-auto-fwd+bwd",
                   "fla-chunk_gla-fwd+bwd"]


def test_worker_lines_skip_library_noise():
    text = ("some triton warning\n"
            f"{baselines.WORKER_PREFIX}{json.dumps(dict(shape='seed', impl='fla-chunk_gla'))}\n"
            f"{baselines.WORKER_PREFIX}{{not json\n")
    assert baselines.parse_worker_lines(text) == [dict(shape="seed", impl="fla-chunk_gla")]


# ------------------------------------------------------------------- fla's worker process

def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(baselines.ROOT), env.get("PYTHONPATH"))
                                        if p)
    return env


def test_watchdog_reports_the_unit_and_ends_the_process():
    code = ("import time; from scripts import baselines; "
            "baselines._watchdog(0.2, 'seed', 'fla-chunk_gla'); time.sleep(60)")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=_env(), cwd=str(baselines.ROOT))
    assert time.perf_counter() - t0 < 30
    assert r.returncode == baselines.WORKER_TIMEOUT_RC, r.stderr
    (msg,) = baselines.parse_worker_lines(r.stdout)
    assert msg["shape"] == "seed" and msg["impl"] == "fla-chunk_gla"
    assert msg["status"] == "skipped" and "--fla-timeout" in msg["note"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is importable")
def test_fla_rows_without_torch_leave_a_note():
    notes, steps = [], []
    job = dict(reps=5, budget_s=1.0, seed=0, l2_bytes=60 << 20, floors={"seed": 1e-4}, refs={},
               notes=notes, on_step=steps.append)
    rows = baselines.fla_rows([(bench.SHAPES["seed"], "fla-chunk_gla")], job, timeout=30.0)
    assert rows == [] and steps == []
    assert len(notes) == 1 and "not importable in the worker" in notes[0] and "torch" in notes[0]


def test_fla_timeout_option_reaches_the_rows(monkeypatch):
    """python -m scripts.baselines --fla-timeout S: the rest goes to cupy-gda bench."""
    got = {}
    monkeypatch.setattr(cli, "main", lambda args, prog_name: got.update(args=args))
    baselines.main(["--shapes", "seed", "--fla-timeout", "7", "--impl", "fla"])
    assert got["args"] == ["bench", "--shapes", "seed", "--impl", "fla"]
    assert bench.BASELINES["fla"].rows.keywords == {"timeout": 7.0}


# --------------------------------------------- the whole run, on a stand-in CuPy made of NumPy

class _FakeEvent:
    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


class _FakeHookBase:
    active = []

    def __enter__(self):
        self.active.append(self)
        return self

    def __exit__(self, *exc):
        self.active.remove(self)


class _FakeKernel:
    max_dynamic_shared_size_bytes = 0

    def __init__(self, name):
        self.name = name

    def __call__(self, grid, block, args, shared_mem=0):
        if self.name == "textbook_gda":             # the textbook's math, on the host
            q, k, v, g, o, T, H, scale = args
            o[...] = reference.gated_attention_ref(q, k, v, g, dtype=np.float32) * scale


def _fake_empty(shape, dtype):
    x = np.empty(shape, dtype)
    for h in _FakeHookBase.active:
        h.malloc_postprocess(device_id=0, size=x.nbytes, mem_size=x.nbytes, mem_ptr=id(x),
                             pmem_id=0)
    return x


def _fake_cupy():
    ns = types.SimpleNamespace
    device = ns(id=0, compute_capability="90", synchronize=lambda: None)
    props = dict(name=b"Stand-in GPU", l2CacheSize=1 << 20, multiProcessorCount=132,
                 sharedMemPerBlockOptin=232448)
    runtime = ns(getDeviceProperties=lambda d: props, runtimeGetVersion=lambda: 13020,
                 driverGetVersion=lambda: 13000)
    cuda = ns(Event=_FakeEvent, Device=lambda *a: device, MemoryHook=_FakeHookBase,
              get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3, runtime=runtime,
              get_current_stream=lambda: ns(ptr=0, synchronize=lambda: None))
    return ns(__version__="stand-in", float32=np.float32, float64=np.float64, cuda=cuda,
              asnumpy=np.asarray, asarray=np.asarray, empty=_fake_empty, abs=np.abs, exp=np.exp,
              logaddexp=np.logaddexp, log=np.log, where=np.where, ones=np.ones, argsort=np.argsort,
              linalg=np.linalg, random=ns(default_rng=np.random.default_rng),
              get_default_memory_pool=lambda: ns(free_all_blocks=lambda: None),
              RawModule=lambda code, options=(): ns(get_function=_FakeKernel))


def test_whole_run_on_a_stand_in_cupy(monkeypatch, tmp_path):
    """Everything but the device: NumPy arrays take the API's CPU path, events read the host
    clock. Catches mistakes in the orchestration, the accuracy columns, the table and the JSON."""
    monkeypatch.setattr(bench, "_cupy", _fake_cupy)
    monkeypatch.setattr(bench._compile, "get_function", lambda name, *a, **kw: _FakeKernel(name))
    monkeypatch.setattr(bench, "measure_copy", lambda clock, seed=0: dict(
        bytes=1 << 30, gbps=4170.0, ms=0.515, min_ms=0.51, p10_ms=0.51, p90_ms=0.52, reps=20))
    monkeypatch.setattr(bench, "HOST_CALLS", 3)
    monkeypatch.setattr(cli._interop, "gpu_available", lambda: (True, "stand-in"))
    for name, shp in (("seed", bench.Shape("seed", 2, 40, 4, 24, 24, host=True)),
                      ("decode", bench.Shape("decode", 4, 1, 3, 16, 16, step=True, host=True)),
                      ("big128-bf16", bench.Shape("big128-bf16", 1, 30, 2, 16, 16,
                                                  dtype="bfloat16")),
                      ("tsweep-1k", bench.Shape("tsweep-1k", 1, 20, 2, 8, 8)),
                      ("tsweep-2k", bench.Shape("tsweep-2k", 1, 40, 2, 8, 8))):
        monkeypatch.setitem(bench.SHAPES, name, shp)
    path = tmp_path / "rows.json"
    r = invoke("--shapes", "seed,decode,big128-bf16,tsweep-1k,tsweep-2k", "--reps", "5",
               "--impl", "ours,textbook", "--json", str(path), "--plot", str(tmp_path / "t.png"))
    assert r.exit_code == 0, r.output
    assert "# GPU Stand-in GPU (cc 9.0), CUDA runtime 13.2, driver 13.0, CuPy stand-in" in r.output
    # a log line per row as it is done (stderr, not a terminal): a run cut off keeps its rows
    assert re.search(r"^bench: seed ours-auto: [0-9.e+-]+ ms$", r.stderr, re.M), r.stderr
    assert re.search(r"^bench: seed textbook: [0-9.e+-]+ ms$", r.stderr, re.M), r.stderr
    assert re.search(r"^bench: big128-bf16 textbook: skipped \(.+\)$", r.stderr, re.M), r.stderr
    data = json.loads(path.read_text())
    rows = {(x["shape"], x["impl"]): x for x in data["rows"]}
    for key in (("seed", "ours-auto"), ("seed", "ours-recurrent"), ("seed", "textbook"),
                ("decode", "ours-step"), ("big128-bf16", "ours-auto"), ("tsweep-2k", "textbook")):
        x = rows[key]
        assert x["status"] == "ok" and x["ms"] > 0 and x["reps"] == 5, x
        assert x["contract_ok"] is True and x["extra_bytes"] == 0, x
        assert x["rel_err"] < (1e-2 if key[0] == "big128-bf16" else 1e-5), x
    assert rows[("big128-bf16", "textbook")]["status"] == "skipped"
    assert rows[("seed", "textbook")]["rel_err_vs_ours"] < 1e-5
    assert rows[("seed", "ours-auto (host)")]["kind"] == "host"
    assert rows[("decode", "ours-step (host)")]["speedup"] is None
    assert rows[("seed", "floor")]["pct_floor"] == pytest.approx(100.0)
    assert [s["shape"] for s in data["shapes"]] == ["seed", "decode", "big128-bf16", "tsweep-1k",
                                                     "tsweep-2k"]
    assert data["shapes"][0]["n_sets"] == bench.n_sets(bench.input_set_bytes(
        bench.SHAPES["seed"]), 1 << 20)


def test_fwd_bwd_run_on_a_stand_in_cupy(monkeypatch, tmp_path):
    """--impl fwd+bwd: ours' forward+backward row (the CPU API on the stand-in's NumPy arrays),
    its gradients checked, its floor over both calls' bytes; fla's rows only where fla imports."""
    monkeypatch.setattr(bench, "_cupy", _fake_cupy)
    monkeypatch.setattr(bench._compile, "get_function", lambda name, *a, **kw: _FakeKernel(name))
    monkeypatch.setattr(bench, "measure_copy", lambda clock, seed=0: dict(
        bytes=1 << 30, gbps=4170.0, ms=0.515, min_ms=0.51, p10_ms=0.51, p90_ms=0.52, reps=20))
    monkeypatch.setattr(cli._interop, "gpu_available", lambda: (True, "stand-in"))
    monkeypatch.setitem(bench.BASELINES, "fla", baselines.FLA._replace(
        available=lambda: (False, "no fla here")))
    for name, shp in (("seed", bench.Shape("seed", 2, 40, 4, 24, 24, host=True)),
                      ("big128-bf16", bench.Shape("big128-bf16", 1, 30, 2, 16, 16,
                                                  dtype="bfloat16"))):
        monkeypatch.setitem(bench.SHAPES, name, shp)
    path = tmp_path / "rows.json"
    r = invoke("--shapes", "seed,big128-bf16,decode", "--reps", "5", "--impl", "fwd+bwd",
               "--json", str(path))
    assert r.exit_code == 0, r.output
    assert "# fla: no fla here; no fla rows" in r.output and "# fwd+bwd rows: " in r.output
    data = json.loads(path.read_text())
    assert [s["shape"] for s in data["shapes"]] == ["seed", "big128-bf16"]   # no decode backward
    rows = {(x["shape"], x["impl"]): x for x in data["rows"]}
    assert sorted(rows) == sorted((s, i) for s in ("seed", "big128-bf16")
                                  for i in ("floor", "ours-auto-fwd+bwd"))
    for shape in ("seed", "big128-bf16"):
        x, floor = rows[(shape, "ours-auto-fwd+bwd")], rows[(shape, "floor")]
        assert x["status"] == "ok" and x["api"] == "fwd+bwd" and x["reps"] == 5, x
        assert x["contract_ok"] is True and x["extra_bytes"] == 0, x
        assert x["rel_err"] < (1e-2 if shape == "big128-bf16" else 1e-5), x
        s = bench.SHAPES[shape]
        assert x["bytes"] == bench.must_move_bytes(s, backward=True)
        assert x["floor_ms"] == pytest.approx(floor["floor_ms"] * x["bytes"] / floor["bytes"])


def _torch_gla(q, k, v, g=None, gk=None, scale=1.0, initial_state=None,
               output_final_state=False):
    """A stand-in for fla's GLA ops (log gates g or gk): the loop over t, in torch."""
    import torch
    lg = g if g is not None else gk
    S = torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    out = []
    for t in range(q.shape[1]):
        S = lg[:, t].exp()[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(scale * (q[:, t, :, :, None] * S).sum(-2))
    return torch.stack(out, 1), None


@pytest.mark.parametrize("impl", ["fla-chunk_gla-fwd+bwd", "fla-fused_recurrent_gla-fwd+bwd"])
def test_fla_fwd_bwd_through_autograd(monkeypatch, impl):
    """The worker's forward+backward (on CPU torch, a stand-in op for fla's): the gradients from
    torch.autograd.grad, dgate = dlog_gate / gate, the same as ours and the reference's."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(bench, "_cupy", _fake_cupy)
    shape = bench.Shape("x", 2, 20, 3, 8, 6)
    (s,) = bench.make_sets(shape, 1, backward=True)
    t = {n: torch.from_numpy(x) for n, x in s.items()}
    t["lg"] = torch.log(t["gate"])
    fwd = baselines._fla_forward(shape, bench.forward_of(impl), _torch_gla)
    one = baselines._fla_fwd_bwd(fwd, torch)
    with torch.no_grad():                       # as in the worker
        out = one(t)
        vs, slices = baselines._fla_check_fwd_bwd(shape, one, t, s, torch)
    assert [tuple(x.shape) for x in out] == [(2, 20, 3, 6), (2, 20, 3, 8), (2, 20, 3, 8),
                                             (2, 20, 3, 6), (2, 20, 3, 8)]
    assert all(x.grad is None for x in t.values())      # the inputs gain no .grad
    assert vs < 1e-5
    assert sorted(slices) == sorted(bench.GRADS)
    acc = bench.accuracy(bench.reference_slices(shape, s), slices)
    assert acc["rel_err"] < 1e-5, acc


def test_textbook_kernel_source_is_found():
    text = baselines.TEXTBOOK_CU.read_text()
    assert 'extern "C" __global__' in text and "textbook_gda(" in text
    assert text.count("__syncthreads()") == 3


@pytest.mark.gpu
def test_bench_seed_on_gpu(tmp_path):
    path = tmp_path / "rows.json"
    r = invoke("--shapes", "seed", "--reps", "5", "--impl", "ours,textbook", "--json", str(path))
    assert r.exit_code == 0, r.output
    assert any(ln.startswith("# GPU ") for ln in r.output.splitlines())
    data = json.loads(path.read_text())
    rows = {(x["shape"], x["impl"]): x for x in data["rows"]}
    for impl in ("ours-auto", "ours-recurrent", "textbook"):
        x = rows[("seed", impl)]
        assert x["status"] == "ok", (impl, x["status"], x.get("note"))
        assert x["ms"] is not None and math.isfinite(x["ms"]) and x["ms"] > 0
        assert x["reps"] == 5 and x["gbps"] > 0
    assert rows[("seed", "ours-auto")]["contract_ok"] is True
    assert rows[("seed", "textbook")]["rel_err_vs_ours"] < 1e-5
    assert rows[("seed", "ours-auto (host)")]["kind"] == "host"
    assert rows[("seed", "floor")]["ms"] > 0 and data["copy"]["gbps"] > 100
    assert data["shapes"][0]["extra_bytes"]["ours-auto"] >= 0
    table = [ln for ln in r.output.splitlines() if ln.startswith("seed ")]
    assert any(" ours-auto " in ln for ln in table) and any(" textbook " in ln for ln in table)
