"""``cupy-gda bench``: the arithmetic, parsing, table and JSON without a GPU; one short run on it.
The baselines that scripts/baselines.py adds are tested in tests/test_baselines.py."""
import ast
import importlib.util
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from cupy_gda import _dispatch, _verify, bench, cli
from conftest import HAS_GPU


@pytest.fixture(autouse=True)
def _no_baselines(monkeypatch):
    """The package's bench alone (tests/test_baselines.py adds scripts/baselines.py's)."""
    monkeypatch.setattr(bench, "BASELINES", {})


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


@pytest.mark.parametrize("name, fwd, bwd", [
    # the backward reads q, k, g and v, do, writes dq, dk, dg (float32) and dv
    pytest.param("seed", 24 * 12 + 24 * 8, 2 * 24 * 12 + 3 * 24 * 4, id="seed-fp32"),
    pytest.param("big128-bf16", 128 * 8 + 128 * 4, 2 * 128 * 8 + 3 * 128 * 2, id="bf16"),
])
def test_must_move_bytes_of_fwd_bwd(name, fwd, bwd):
    s = bench.SHAPES[name]
    tokens = s.B * s.T * s.H
    assert bench.must_move_bytes(s, backward=True) == tokens * (fwd + bwd)
    # the floor at the copy rate of the shape's (forward) floor
    assert bench.floor_for(s, "ours-auto-fwd+bwd", 2.0) == pytest.approx(2.0 * (fwd + bwd) / fwd)
    assert bench.floor_for(s, "ours-auto", 2.0) == 2.0


def test_the_issue_shapes_are_named():
    """Issue 15's fwd+bwd shapes: seed, gla64, long24, big128 (fp32, bf16), GLA-1.3B bf16."""
    got = {n: tuple(bench.SHAPES[n])[1:7] for n in ("seed", "gla64", "long24", "big128",
                                                    "big128-bf16", "gla1.3b-bf16")}
    assert got == {"seed": (2, 128, 4, 24, 24, "float32"), "gla64": (4, 2048, 8, 64, 64, "float32"),
                   "long24": (8, 4096, 16, 24, 24, "float32"),
                   "big128": (8, 4096, 16, 128, 128, "float32"),
                   "big128-bf16": (8, 4096, 16, 128, 128, "bfloat16"),
                   "gla1.3b-bf16": (8, 4096, 4, 256, 512, "bfloat16")}


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
    assert [s.name for s in bench.parse_shapes("models")][:3] == ["gla1.3b-bf16", "gla1.3b", "gla340m-bf16"]
    with pytest.raises(ValueError, match="unknown shape 'seeds'; choose from all, tsweep, models, seed"):
        bench.parse_shapes("seed,seeds")
    with pytest.raises(ValueError, match="no shape named"):
        bench.parse_shapes(" , ")


def test_parse_impls_and_selection():
    assert bench.parse_impls("ours, ours-auto") == ("ours", "ours-auto")
    with pytest.raises(ValueError, match="unknown implementation 'triton'"):
        bench.parse_impls("ours,triton")
    with pytest.raises(ValueError, match="unknown implementation 'fla'"):     # none registered
        bench.parse_impls("ours,fla")
    assert bench.selected("ours-auto (host)", ("ours",))
    assert bench.selected("ours-auto (host)", ("ours-auto",))
    assert not bench.selected("ours-recurrent", ("ours-auto",))


def test_ours_rows_follow_the_gpu_methods(monkeypatch):
    seed = bench.SHAPES["seed"]
    units = [i for _, i in bench.plan([seed], ("ours",))]
    assert units == ["ours-auto", *(f"ours-{m}" for m in bench.gpu_methods()), "ours-auto (host)"]
    # a GPU family joins without a code change
    monkeypatch.setattr(_dispatch, "METHODS", {**_dispatch.METHODS, "fused": ("gpu",)})
    units = [i for _, i in bench.plan([seed], ("ours",))]
    assert "ours-fused" in units and "ours-recurrent" in units
    assert bench.parse_impls("ours-fused") == ("ours-fused",)


def test_fwd_bwd_rows_only_when_named():
    seed, dec = bench.SHAPES["seed"], bench.SHAPES["decode"]
    assert "ours-auto-fwd+bwd" not in [i for _, i in bench.plan([seed], ("ours",))]
    assert not bench.selected("ours-auto-fwd+bwd", ("ours", "ours-auto"))
    for sel in ("fwd+bwd", "ours-auto-fwd+bwd"):
        assert bench.parse_impls(sel) == (sel,)
        assert [i for _, i in bench.plan([seed, dec], (sel,))] == ["ours-auto-fwd+bwd"]
    assert [i for _, i in bench.plan([seed], ("ours-auto", "fwd+bwd"))] == [
        "ours-auto", "ours-auto (host)", "ours-auto-fwd+bwd"]
    keep = "ours-keep-fwd+bwd"
    assert [i for _, i in bench.plan([seed, dec], ("fwd+bwd", keep))] == [
        "ours-auto-fwd+bwd", keep]
    assert bench.parse_impls(keep) == (keep,) and bench.is_fwd_bwd(keep)
    assert bench.is_fwd_bwd("fla-chunk_gla-fwd+bwd") and not bench.is_fwd_bwd("ours-auto")
    assert bench.forward_of("fla-chunk_gla-fwd+bwd") == "fla-chunk_gla"
    assert bench.forward_of("ours-auto (host)") == "ours-auto (host)"


def test_plan_of_decode():
    dec = bench.SHAPES["decode"]
    assert [i for _, i in bench.plan([dec], ("ours",))] == ["ours-step", "ours-step (host)"]


def test_shapes_draw_the_benchmark_inputs():
    """One make_inputs serves the bench: float32 logsig gates, no initial state; decode: a state
    of B rows, no state_indices."""
    for name in ("seed", "big128-bf16", "decode"):
        c = bench.SHAPES[name].case
        assert (c.gate, c.g_dtype, c.init, c.indices) == ("logsig", "float32", False, False)
    got = _verify.make_inputs(bench.SHAPES["decode"]._replace(B=2, H=3, K=4, V=5).case, 0)
    assert sorted(got) == ["gate", "k", "q", "state", "v"] and got["state"].shape == (2, 3, 4, 5)
    got = _verify.make_inputs(bench.Shape("x", 1, 7, 2, 4, 4, dtype="bfloat16").case, 0)
    assert sorted(got) == ["gate", "k", "q", "v"] and got["gate"].dtype == np.float32
    assert got["q"].dtype.name == "bfloat16"


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


def test_fwd_bwd_rows_compete_with_fwd_bwd_rows():
    rows = [_row("ours-auto", 1.0), _row("fla-chunk_gla", 0.5),
            _row("ours-auto-fwd+bwd", 4.0), _row("fla-chunk_gla-fwd+bwd", 2.0)]
    bench.finish_rows(rows)
    sp = {r["impl"]: r["speedup"] for r in rows}
    assert sp["ours-auto"] == pytest.approx(0.5) and sp["fla-chunk_gla"] == pytest.approx(2.0)
    assert sp["ours-auto-fwd+bwd"] == pytest.approx(0.5)       # not vs a forward row
    assert sp["fla-chunk_gla-fwd+bwd"] == pytest.approx(2.0)
    assert [r["api"] for r in rows] == ["forward", "forward", "fwd+bwd", "fwd+bwd"]
    assert rows[2]["bytes"] == bench.must_move_bytes(bench.SHAPES["seed"], backward=True)


def test_fwd_bwd_rows_sort_after_the_forward_rows():
    rows = [_row("ours-auto-fwd+bwd", 3.0), _row("floor", 0.01), _row("ours-auto (host)", 1.0),
            _row("ours-auto", 1.0), _row("ours-auto-fwd+bwd", 3.0, shape="gla64"),
            _row("ours-auto", 1.0, shape="gla64")]
    got = [(r["shape"], r["impl"]) for r in bench.sort_rows(rows, ["seed", "gla64"])]
    assert got == [("seed", "ours-auto"), ("seed", "ours-auto (host)"), ("seed", "floor"),
                   ("seed", "ours-auto-fwd+bwd"), ("gla64", "ours-auto"),
                   ("gla64", "ours-auto-fwd+bwd")]


def test_bandwidth_columns():
    r = _row("ours-auto", 2.0, floor_ms=0.5)
    bench.finish_rows([r])
    assert r["gbps"] == pytest.approx(r["bytes"] / 2e-3 / 1e9)
    assert r["pct_floor"] == pytest.approx(25.0)
    f = _row("floor", 0.5, floor_ms=0.5)
    bench.finish_rows([f])
    assert f["pct_floor"] == pytest.approx(100.0)


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


def test_json_of_a_fwd_bwd_row():
    seed = bench.SHAPES["seed"]
    r = _row("ours-auto-fwd+bwd", 2.0, floor_ms=bench.floor_for(seed, "ours-auto-fwd+bwd", 0.01),
             rel_err=3e-7, contract_ok=True, extra_bytes=123456)
    bench.finish_rows([r])
    j = json.loads(json.dumps(bench.row_json(r)))
    assert tuple(j) == bench.ROW_KEYS
    assert (j["api"], j["family"], j["extra_bytes"]) == ("fwd+bwd", "ours", 123456)
    assert j["bytes"] == bench.must_move_bytes(seed, backward=True)
    assert j["pct_floor"] == pytest.approx(100 * j["floor_ms"] / 2.0)
    assert j["gbps"] == pytest.approx(j["bytes"] / 2e-3 / 1e9)


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


def test_extra_column_and_the_fwd_bwd_legend():
    rows = [_row("ours-auto", 1.0, extra_bytes=0, note="a"), _row("floor", 0.5, note="b"),
            _row("ours-auto-fwd+bwd", 3.0, extra_bytes=5 << 20, contract_ok=True, note="c")]
    bench.finish_rows(rows)
    lines = bench.format_table(rows).splitlines()
    col = [c for c, _ in bench.COLUMNS].index("extra")
    body = {c[1].strip(): c[col].strip() for c in (ln.split(" | ") for ln in lines[2:])}
    assert body == {"ours-auto": "0 B", "floor": "-", "ours-auto-fwd+bwd": "5.0 MiB"}
    seed = bench.SHAPES["seed"]
    result = dict(copy=dict(bytes=1 << 30, ms=0.5, reps=20, gbps=4000.0, empty_kernel_ms=0.002),
                  shapes=[dict(shape="seed", legend=seed.legend, bytes=1000, floor_ms=0.5,
                               n_sets=3)], rows=rows, notes=[])
    legend = [ln for ln in bench.summary_lines(result) if ln.startswith("# fwd+bwd rows:")]
    assert len(legend) == 1 and "the worst gradient's" in legend[0]
    assert any(ln.startswith("# extra: ") for ln in bench.summary_lines(result))
    result["rows"] = rows[:2]
    assert not [ln for ln in bench.summary_lines(result) if ln.startswith("# fwd+bwd")]


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


# ------------------------------------------------------------------- fwd+bwd accuracy, on the CPU

def test_fwd_bwd_sets_keep_the_forward_inputs(monkeypatch):
    monkeypatch.setattr(bench, "_cupy", lambda: np)               # the sets drawn on the host
    shape = bench.Shape("x", 2, 20, 3, 8, 6, dtype="bfloat16")
    plain, with_do = bench.make_sets(shape, 2), bench.make_sets(shape, 2, backward=True)
    for a, b in zip(plain, with_do):
        assert sorted(b) == ["do", "gate", "k", "q", "v"]
        assert all(np.array_equal(a[n], b[n]) for n in a)
        assert b["do"].dtype == b["v"].dtype and b["do"].shape == b["v"].shape
    assert not np.array_equal(with_do[0]["do"], with_do[1]["do"])


def test_fwd_bwd_accuracy_on_the_cpu(monkeypatch):
    """The gradients' check, with the CPU backward as ours: within the contract on the slice;
    past REF_T_MAX on backward_cut's call, as the whole call's gradients of a prefix are not the
    prefix's (dk, dv, dgate depend on the steps after it)."""
    monkeypatch.setattr(bench, "_cupy", lambda: np)
    monkeypatch.setattr(bench, "REF_T_MAX", 24)
    shape = bench.Shape("x", 2, 40, 3, 8, 6)
    (s,) = bench.make_sets(shape, 1, backward=True)
    refs = bench.reference_slices(shape, s)
    assert set(refs["ref"]) == set(refs["emu"]) == {"o", *bench.GRADS}
    assert refs["ref"]["dk"].shape == (1, 24, 2, 8) and refs["ref"]["dv"].shape == (1, 24, 2, 6)
    cut = bench.backward_cut(shape, s)
    assert cut["q"].shape == (1, 24, 2, 8) and cut["do"].shape == (1, 24, 2, 6)
    got = bench.gradient_slices(shape, bench.call_ours_fwd_bwd(shape, cut)[1])
    acc = bench.accuracy(refs, got)
    assert acc["contract_ok"] is True and acc["rel_err"] < 1e-5, acc
    whole = bench.gradient_slices(shape, bench.call_ours_fwd_bwd(shape, s)[1])
    assert bench.accuracy(refs, whole)["contract_ok"] is False
    monkeypatch.setattr(bench, "REF_T_MAX", 40)                 # the slice keeps all of T
    assert bench.backward_cut(shape, s) is s


# ----------------------------------------------------------------------------------------- CLI

def test_cli_rejects_unknown_names():
    r = invoke("--shapes", "seed,nope")
    assert r.exit_code == 2 and "unknown shape 'nope'" in r.output
    r = invoke("--impl", "ours,nope")
    assert r.exit_code == 2 and "unknown implementation 'nope'" in r.output
    assert "fwd+bwd" in r.output and "ours-auto-fwd+bwd" in r.output


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error; a GPU is present")
def test_cli_without_gpu_fails_cleanly():
    r = invoke("--shapes", "seed")
    assert r.exit_code == 1 and "no usable GPU" in r.output




@pytest.mark.gpu
def test_fwd_bwd_row_on_gpu(tmp_path):
    """A forward+backward row at the seed shape: timed, gradients within the contract, its extra
    memory at least the backward's workspace."""
    from cupy_gda import recurrent_bwd
    from cupy_gda._checks import Problem
    path = tmp_path / "rows.json"
    r = invoke("--shapes", "seed", "--reps", "5", "--impl", "ours-auto,ours-auto-fwd+bwd",
               "--json", str(path))
    assert r.exit_code == 0, r.output
    rows = {x["impl"]: x for x in json.loads(path.read_text())["rows"]}
    x = rows["ours-auto-fwd+bwd"]
    assert x["status"] == "ok" and x["contract_ok"] is True and x["api"] == "fwd+bwd", x
    assert x["reps"] == 5 and x["ms"] > 0 and x["rel_err"] < 1e-5
    assert x["floor_ms"] > rows["floor"]["floor_ms"]
    seed = bench.SHAPES["seed"]
    p = Problem(seed.B, seed.T, seed.H, seed.K, seed.V, seed.B, "float32", "float32", False)
    assert x["extra_bytes"] >= 4 * sum(recurrent_bwd.plan(p, False).ws)
    assert any(ln.startswith("seed ") and " ours-auto-fwd+bwd " in ln
               for ln in r.output.splitlines())
