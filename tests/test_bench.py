"""``cupy-gda bench``: the arithmetic, parsing, table and JSON without a GPU; one short run on it."""
import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from click.testing import CliRunner

from cupy_gda import _dispatch, bench, cli, reference
from conftest import HAS_GPU


def invoke(*args):
    return CliRunner().invoke(cli.main, ["bench", *args])


# ------------------------------------------------------------------------------ shapes, bytes

def test_named_shapes():
    s = bench.SHAPES
    assert (s["seed"].B, s["seed"].T, s["seed"].H, s["seed"].K, s["seed"].V) == (2, 128, 4, 24, 24)
    assert s["big128-bf16"].dtype == "bfloat16" and s["big128"].dtype == "float32"
    assert s["decode"].step and (s["decode"].B, s["decode"].H, s["decode"].K) == (64, 32, 128)
    assert [s[n].T for n in bench.GROUPS["tsweep"]] == [1024 * 2 ** i for i in range(7)]
    assert all((s[n].B, s[n].H, s[n].K, s[n].V) == (1, 16, 128, 128) for n in bench.GROUPS["tsweep"])


@pytest.mark.parametrize("name, want", [
    # per token: q, k, g (float32) K each, v read and o written V each
    pytest.param("seed", 2 * 128 * 4 * (24 * 12 + 24 * 8), id="seed-fp32"),
    pytest.param("gla64", 4 * 2048 * 8 * (64 * 12 + 64 * 8), id="gla64-fp32"),
    # bf16: q, k, v, o 2 bytes; the gate stays float32
    pytest.param("big128-bf16", 8 * 4096 * 16 * (128 * (2 + 2 + 4) + 128 * (2 + 2)), id="bf16"),
    # decode: one token, plus the float32 state read once and written once
    pytest.param("decode", 64 * 32 * (128 * 12 + 128 * 8) + 2 * 64 * 32 * 128 * 128 * 4,
                 id="decode"),
])
def test_must_move_bytes(name, want):
    assert bench.must_move_bytes(bench.SHAPES[name]) == want


def test_decode_floor_matches_the_napkin_math():
    # GPU.md: reading + writing the decode state once takes 0.064 ms at 4.17 TB/s
    floor_ms = bench.must_move_bytes(bench.SHAPES["decode"]) / 4.17e12 * 1e3
    assert 0.064 <= floor_ms <= 0.067


def test_input_sets_rotate_below_three_l2():
    l2 = 60 << 20
    seed = bench.input_set_bytes(bench.SHAPES["seed"])
    assert seed == 2 * 128 * 4 * (24 * 12 + 24 * 4)
    assert bench.n_sets(seed, l2) == math.ceil(3 * l2 / seed)
    assert bench.n_sets(bench.input_set_bytes(bench.SHAPES["big128"]), l2) == 1
    assert bench.n_sets(bench.input_set_bytes(bench.SHAPES["decode"]), l2) == 2
    assert bench.n_sets(1, l2) == bench.MAX_SETS


def test_reps_fit_the_budget():
    assert bench.reps_for(100, 0.01, 5.0) == 100
    assert bench.reps_for(100, 2000.0, 5.0) == bench.MIN_REPS     # slow rows keep a minimum
    assert bench.reps_for(100, 100.0, 5.0) == 50
    assert bench.reps_for(3, 2000.0, 5.0) == 3                    # never more than asked


def test_stats_report_the_median():
    st = bench.stats([5.0, 1.0, 3.0, 2.0, 4.0])
    assert st == dict(ms=3.0, min_ms=1.0, p10_ms=pytest.approx(1.4), p90_ms=pytest.approx(4.6),
                      reps=5)


# ------------------------------------------------------------------------------------- parsing

def test_parse_shapes():
    assert [s.name for s in bench.parse_shapes("seed, gla64,seed")] == ["seed", "gla64"]
    assert [s.name for s in bench.parse_shapes("all")] == list(bench.SHAPES)
    assert [s.name for s in bench.parse_shapes("decode,tsweep")] == ["decode",
                                                                     *bench.GROUPS["tsweep"]]
    with pytest.raises(ValueError, match="unknown shape 'seeds'; choose from all, tsweep, seed"):
        bench.parse_shapes("seed,seeds")
    with pytest.raises(ValueError, match="no shape named"):
        bench.parse_shapes(" , ")


def test_parse_impls_and_selection():
    assert bench.parse_impls("ours, fla") == ("ours", "fla")
    with pytest.raises(ValueError, match="unknown implementation 'triton'"):
        bench.parse_impls("ours,triton")
    assert bench.selected("ours-auto (host)", ("ours",))
    assert bench.selected("ours-auto (host)", ("ours-auto",))
    assert not bench.selected("ours-recurrent", ("ours-auto",))
    assert bench.selected("fla-chunk_gla", ("fla",))
    assert not bench.selected("textbook", ("ours", "fla"))


def test_ours_rows_follow_the_gpu_methods(monkeypatch):
    seed = bench.SHAPES["seed"]
    units = [i for _, i in bench.plan([seed], ("ours", "textbook", "fla"), fla=True)]
    assert units == ["ours-auto", *(f"ours-{m}" for m in bench.gpu_methods()),
                     "ours-auto (host)", "textbook", *bench.FLA_IMPLS]
    # a GPU chunk family joins without a code change
    monkeypatch.setattr(_dispatch, "METHODS", {**_dispatch.METHODS, "chunk": ("cpu", "gpu")})
    units = [i for _, i in bench.plan([seed], ("ours",), fla=False)]
    assert "ours-chunk" in units and "ours-recurrent" in units
    assert bench.parse_impls("ours-chunk") == ("ours-chunk",)


def test_plan_of_decode_and_bf16():
    dec, bf = bench.SHAPES["decode"], bench.SHAPES["big128-bf16"]
    assert [i for _, i in bench.plan([dec], ("ours", "textbook", "fla"))] == [
        "ours-step", "ours-step (host)", "fla-fused_recurrent_gla"]
    assert [i for _, i in bench.plan([dec], ("ours",), fla=False)] == ["ours-step",
                                                                       "ours-step (host)"]
    # bf16: the textbook row is kept (it reports itself skipped: float32 only)
    assert "textbook" in [i for _, i in bench.plan([bf], ("textbook",))]


# ------------------------------------------------------------------------------ rows, speedup

def _row(impl, ms, shape="seed", **kw):
    kind = "floor" if impl == "floor" else "host" if impl.endswith("(host)") else "device"
    kw.setdefault("floor_ms", ms if impl == "floor" else 0.01)
    return bench.new_row(bench.SHAPES[shape], impl, kind=kind, ms=ms, **kw)


def test_speedup_is_against_the_best_other_family():
    rows = [_row("ours-auto", 1.0), _row("ours-recurrent", 1.0), _row("textbook", 4.0),
            _row("fla-chunk_gla", 0.5), _row("fla-fused_recurrent_gla", 2.0),
            _row("floor", 0.01), _row("ours-auto (host)", 0.002),
            _row("ours-auto", 0.1, shape="gla64"),
            _row("textbook", None, status="failed", note="differs")]
    bench.finish_rows(rows)
    sp = {(r["shape"], r["impl"], r["status"]): r["speedup"] for r in rows}
    assert sp[("seed", "ours-auto", "ok")] == pytest.approx(0.5)      # fla chunk is fastest
    assert sp[("seed", "ours-recurrent", "ok")] == pytest.approx(0.5)  # not vs ours-auto
    assert sp[("seed", "textbook", "ok")] == pytest.approx(0.5 / 4.0)
    assert sp[("seed", "fla-chunk_gla", "ok")] == pytest.approx(2.0)   # vs ours at 1.0
    assert sp[("seed", "fla-fused_recurrent_gla", "ok")] == pytest.approx(0.5)
    assert sp[("seed", "floor", "ok")] is None                         # floors and host rows
    assert sp[("seed", "ours-auto (host)", "ok")] is None              # are no competitors
    assert sp[("gla64", "ours-auto", "ok")] is None                    # nothing else at gla64
    assert sp[("seed", "textbook", "failed")] is None


def test_bandwidth_columns():
    r = _row("ours-auto", 2.0, floor_ms=0.5)
    bench.finish_rows([r])
    assert r["gbps"] == pytest.approx(r["bytes"] / 2e-3 / 1e9)
    assert r["pct_floor"] == pytest.approx(25.0)
    f = _row("floor", 0.5, floor_ms=0.5)
    bench.finish_rows([f])
    assert f["pct_floor"] == pytest.approx(100.0)


def test_rows_sort_by_shape_then_implementation():
    rows = [_row("floor", 0.01), _row("fla-chunk_gla", 1.0), _row("ours-auto", 1.0, shape="gla64"),
            _row("textbook", 1.0), _row("ours-auto (host)", 1.0), _row("ours-auto", 1.0)]
    got = [(r["shape"], r["impl"]) for r in bench.sort_rows(rows, ["seed", "gla64"])]
    assert got == [("seed", "ours-auto"), ("seed", "ours-auto (host)"), ("seed", "textbook"),
                   ("seed", "fla-chunk_gla"), ("seed", "floor"), ("gla64", "ours-auto")]


def test_json_row_schema():
    r = _row("ours-auto", 1.5, rel_err=float("nan"), contract_ok=True, extra_bytes=0)
    bench.finish_rows([r])
    j = bench.row_json(r)
    assert tuple(j) == bench.ROW_KEYS
    assert j["kind"] in bench.KINDS and j["status"] in bench.STATUSES
    assert j["rel_err"] is None                          # NaN is not JSON
    assert j["ms"] == 1.5 and j["family"] == "ours" and j["api"] == "forward"
    json.dumps(j, allow_nan=False)
    with pytest.raises(KeyError, match="not row keys"):
        bench.new_row(bench.SHAPES["seed"], "ours-auto", millis=1.0)


def test_failures_are_ours_only():
    rows = [_row("ours-auto", 1.0, contract_ok=True), _row("textbook", None, status="failed"),
            _row("fla-chunk_gla", 1.0, contract_ok=False)]
    assert bench.failures(rows) == []
    rows.append(_row("ours-recurrent", 1.0, contract_ok=False))
    rows.append(_row("ours-auto", None, shape="gla64", status="failed", note="boom"))
    assert [(r["shape"], r["impl"]) for r in bench.failures(rows)] == [
        ("seed", "ours-recurrent"), ("gla64", "ours-auto")]


# ---------------------------------------------------------------------------------- formatting

def test_table_is_fixed_width():
    rows = [_row("ours-auto", 0.00412, rel_err=1.2e-7, f32_rel_err=3.4e-7, contract_ok=True),
            _row("ours-auto (host)", 0.0093), _row("textbook", 0.17, rel_err_vs_ours=2e-7),
            _row("fla-chunk_gla", None, status="skipped", note="warm-up over 120 s"),
            _row("floor", 0.000118), _row("ours-auto", 412.5, shape="tsweep-64k")]
    bench.finish_rows(rows)
    lines = bench.format_table(rows).splitlines()
    head = lines[0].split(" | ")
    assert [h.strip() for h in head] == [c for c, _ in bench.COLUMNS]
    assert set(lines[1]) <= {"-", "+"}
    # every separator sits at the same column on every line
    seps = [i for i, ch in enumerate(lines[0]) if ch == "|"]
    for ln in lines[2:]:
        assert [i for i, ch in enumerate(ln) if ch == "|"] == seps, ln
    body = {(c[0].strip(), c[1].strip()): [x.strip() for x in c]
            for c in (ln.split(" | ") for ln in lines[2:])}
    ours = body[("seed", "ours-auto")]
    assert ours[2] == "0.004120" and ours[6] == "1.2e-07" and ours[8] == "ok"
    assert body[("tsweep-64k", "ours-auto")][2] == "412.5"
    skipped = body[("seed", "fla-chunk_gla")]
    assert skipped[2] == "-" and skipped[5] == "-" and skipped[-1] == "skipped: warm-up over 120 s"
    assert body[("seed", "floor")][4] == "100.0"


def test_header_line():
    h = dict(gpu="NVIDIA H200", cc="9.0", cuda_runtime="13.2", driver="13.0", cupy="14.2.0",
             cupy_gda="0.1.0", commit="abc1234", date="2026-12-01T10:00:00")
    assert bench.header_line(h) == ("# GPU NVIDIA H200 (cc 9.0), CUDA runtime 13.2, driver 13.0, "
                                    "CuPy 14.2.0, cupy_gda 0.1.0, commit abc1234, "
                                    "2026-12-01T10:00:00")


def test_commit_from_environment(monkeypatch):
    monkeypatch.setenv("CUPY_GDA_COMMIT", "feedbee")
    assert bench.git_commit() == "feedbee"
    monkeypatch.delenv("CUPY_GDA_COMMIT")
    assert bench.git_commit()                      # a hash, or 'unknown' outside a checkout


def test_worker_lines_skip_library_noise():
    text = ("some triton warning\n"
            f"{bench.WORKER_PREFIX}{json.dumps(dict(shape='seed', impl='fla-chunk_gla'))}\n"
            f"{bench.WORKER_PREFIX}{{not json\n")
    assert bench.parse_worker_lines(text) == [dict(shape="seed", impl="fla-chunk_gla")]


def test_plot(tmp_path):
    rows = [_row(impl, ms, shape=f"tsweep-{n}k") for n, base in ((1, 1.0), (2, 2.0), (4, 4.0))
            for impl, ms in (("ours-auto", base), ("textbook", 3 * base), ("floor", base / 10))]
    path = tmp_path / "t.png"
    msg = bench.plot(rows, str(path))
    if importlib.util.find_spec("matplotlib") is None:
        assert msg.startswith("matplotlib not importable") and not path.exists()
        return
    assert msg == f"plot written to {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bench.plot([_row("ours-auto", 1.0)], str(tmp_path / "none.png")).startswith("no timed")


def test_module_imports_no_cupy_at_top_level():
    # no device work at import: CuPy is imported inside the functions that run on the GPU
    tree = ast.parse(open(bench.__file__).read())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top for a in n.names] + [n.module or "" for n in top
                                                      if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] in ("cupy", "torch", "fla", "matplotlib")]


# ----------------------------------------------------------------------------------------- CLI

def test_cli_rejects_unknown_names():
    r = invoke("--shapes", "seed,nope")
    assert r.exit_code == 2 and "unknown shape 'nope'" in r.output
    r = invoke("--impl", "ours,nope")
    assert r.exit_code == 2 and "unknown implementation 'nope'" in r.output


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error; a GPU is present")
def test_cli_without_gpu_fails_cleanly():
    r = invoke("--shapes", "seed")
    assert r.exit_code == 1 and "no usable GPU" in r.output


# ------------------------------------------------------------------- fla's worker process

def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(bench.REPO_ROOT), env.get("PYTHONPATH"))
                                        if p)
    return env


def test_watchdog_reports_the_unit_and_ends_the_process():
    code = ("import time; from cupy_gda import bench; "
            "bench._watchdog(0.2, 'seed', 'fla-chunk_gla'); time.sleep(60)")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=_env())
    assert time.perf_counter() - t0 < 30
    assert r.returncode == bench.WORKER_TIMEOUT_RC, r.stderr
    (msg,) = bench.parse_worker_lines(r.stdout)
    assert msg["shape"] == "seed" and msg["impl"] == "fla-chunk_gla"
    assert msg["status"] == "skipped" and "--fla-timeout" in msg["note"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is importable")
def test_fla_rows_without_torch_leave_a_note():
    notes, steps = [], []
    job = dict(reps=5, budget_s=1.0, fla_timeout=30.0, seed=0, l2_bytes=60 << 20)
    rows = bench._fla_rows([(bench.SHAPES["seed"], "fla-chunk_gla")], job, {"seed": 1e-4}, {},
                           notes, steps.append)
    assert rows == [] and steps == []
    assert len(notes) == 1 and "not importable in the worker" in notes[0] and "torch" in notes[0]


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
              logaddexp=np.logaddexp, linalg=np.linalg, random=ns(default_rng=np.random.default_rng),
              get_default_memory_pool=lambda: ns(free_all_blocks=lambda: None),
              RawModule=lambda code, options=(): ns(get_function=_FakeKernel))


def test_whole_run_on_a_stand_in_cupy(monkeypatch, tmp_path):
    """Everything but the device: NumPy arrays take the API's CPU path, events read the host
    clock. Catches mistakes in the orchestration, the accuracy columns, the table and the JSON."""
    monkeypatch.setattr(bench, "_cupy", _fake_cupy)
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


def test_textbook_kernel_source_is_found():
    text = bench.TEXTBOOK_CU.read_text()
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
