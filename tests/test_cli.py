"""The ``cupy-gda`` command line, through click's CliRunner (and once through ``python -m``)."""
import subprocess
import sys

import pytest
from click.testing import CliRunner

import cupy_gda
from cupy_gda import _compile, _interop, _verify, cli
from conftest import HAS_GPU, run_case

SMALL = ["-B", "1", "-T", "8", "-H", "2", "-K", "4", "-V", "3"]
SMALL_IDS = ["fwd-B1-T8-H2-K4-V3-float32-gate_logsig", "step-B1-T1-H2-K4-V3-float32-gate_logsig"]


def invoke(*args):
    return CliRunner().invoke(cli.main, list(args))


def result_lines(output, verdict):
    """verify's check lines that end in ``verdict``, each with its case's id (the line above the
    case's checks) in front: "<case id> <tensor> <max_abs> ... <verdict>"."""
    out, case = [], None
    for ln in output.splitlines():
        if ln and not ln.startswith(" ") and not ln.startswith("verify:"):
            case = ln
        elif ln.endswith(verdict) and ln.startswith("    "):
            out.append(f"{case} {ln.strip()}")
    return out


def test_info_prints_versions_and_paths():
    r = invoke("info")
    assert r.exit_code == 0, r.output
    fields = dict(ln.split(":", 1) for ln in r.output.splitlines())
    assert fields["cupy_gda"].strip() == cupy_gda.__version__
    assert fields["kernels"].strip() == str(_compile.KERNEL_DIR)
    for key in ("Python", "NumPy", "CuPy", "CUDA runtime", "CUDA driver", "NVRTC", "GPU",
                "compute capability", "kernel cache"):
        assert fields[key].strip(), key
    if not HAS_GPU:
        assert fields["GPU"].strip().startswith("none (")
        assert fields["compute capability"].strip() == "n/a (no GPU)"


def test_info_survives_broken_cupy(monkeypatch):
    # every CuPy probe fails: each field says why, and the command still exits 0
    def broken():
        raise ImportError("libcuda.so.1: cannot open shared object file")
    monkeypatch.setattr(cli, "_cupy", broken)
    monkeypatch.setattr(cli._interop, "gpu_available", lambda: (False, "CuPy does not import"))
    r = invoke("info")
    assert r.exit_code == 0, r.output
    for key in ("CuPy", "CUDA runtime", "CUDA driver", "NVRTC"):
        assert f"{key}:" in r.output
    assert r.output.count("unavailable (ImportError: libcuda.so.1") == 4


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU fallback; a GPU is present")
def test_verify_single_shape_without_gpu():
    r = invoke("verify", *SMALL)
    assert r.exit_code == 0, r.output
    assert r.output.count("no usable GPU:") == 1
    assert "verifying the CPU path instead" in r.output
    passed = result_lines(r.output, "PASS")
    assert [ln.split()[:2] for ln in passed] == [[i, t] for i in SMALL_IDS for t in ("o", "state")]
    assert not result_lines(r.output, "FAIL")
    assert "verify: 2 cases, 4 checks, 0 failed (no GPU, backend numpy)" in r.output


def test_verify_default_sweep(monkeypatch):
    # without a GPU, the NumPy runs test_api's test_case_meets_accuracy_contract made of the
    # same cases (each computed once a session, whichever test comes first)
    monkeypatch.setattr(_verify, "run_case", run_case)
    cases = _verify.standard_cases()
    checks = sum(5 if c.backward else 2 for c in cases)     # dq dk dv dgate dinitial_state
    r = invoke("verify")
    assert r.exit_code == 0, r.output
    assert len(result_lines(r.output, "PASS")) == checks
    assert f"verify: {len(cases)} cases, {checks} checks, 0 failed" in r.output
    assert cases[0].id in r.output and cases[-1].id in r.output


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error; a GPU is present")
def test_verify_require_gpu_fails_without_gpu():
    r = invoke("verify", "--require-gpu", *SMALL)
    assert r.exit_code == 1
    assert "no usable GPU:" in r.output
    assert not result_lines(r.output, "PASS")


def test_verify_failure_exits_1(monkeypatch):
    bad = _verify.Result("o", 1.5, 0.25, 0.5, 1e-6, False)
    good = _verify.Result("state", 1e-7, 1e-8, 1e-8, 1e-6, True)
    monkeypatch.setattr(_verify, "run_case", lambda case, **kw: [bad, good])
    r = invoke("verify", *SMALL)
    assert r.exit_code == 1, r.output
    fails = result_lines(r.output, "FAIL")
    assert [ln.split() for ln in fails] == [
        [i, "o", "1.50e+00", "2.50e-01", "5.00e-01", "1.00e-06", "FAIL"] for i in SMALL_IDS]
    assert len(result_lines(r.output, "PASS")) == 2
    assert "verify: 2 cases, 4 checks, 2 failed" in r.output


def test_verify_crashing_case_is_a_failure(monkeypatch):
    def crash(case, **kw):
        if case.step:
            raise RuntimeError("kernel launch failed\nsecond line")
        return [_verify.Result("o", 0.0, 0.0, 0.0, 1e-6, True)]
    monkeypatch.setattr(_verify, "run_case", crash)
    r = invoke("verify", *SMALL)
    assert r.exit_code == 1, r.output
    assert [ln.split()[:2] for ln in result_lines(r.output, "FAIL")] == [[SMALL_IDS[1], "error"]]
    assert "RuntimeError: kernel launch failed" in r.output and "second line" not in r.output
    assert "verify: 2 cases, 2 checks, 1 failed" in r.output


def test_verify_options_reach_the_cases(monkeypatch):
    seen = []
    monkeypatch.setattr(_verify, "run_case",
                        lambda case, **kw: seen.append((case, kw)) or [])
    r = invoke("verify", "-T", "63", "-K", "100", "--dtype", "bfloat16", "--gate", "tiny",
               "--log-gate", "--seed", "7", "--method", "recurrent")
    assert r.exit_code == 0, r.output
    (fwd, kw), (step, kw_step) = seen
    # unset dims come from the sweep's seed shape (B2, H4, V24)
    assert fwd == _verify.Case(2, 63, 4, 100, 24, dtype="bfloat16", gate="tiny", log=True)
    assert step == _verify.step_case(2, 4, 100, 24, dtype="bfloat16", gate="tiny", log=True)
    assert kw["seed"] == kw_step["seed"] == 7 and kw["method"] == "recurrent"
    assert kw["backend"] == ("cupy" if HAS_GPU else "numpy")


def test_verify_quick_runs_one_case_per_api(monkeypatch):
    seen = []
    monkeypatch.setattr(_verify, "run_case", lambda case, **kw: seen.append(case) or [])
    r = invoke("verify", "--quick")
    assert r.exit_code == 0, r.output
    assert [c.id.split("-")[0] for c in seen] == ["fwd", "varlen", "bwd", "step"]
    assert seen[0] == _verify.standard_cases()[0]


def test_verify_max_t_keeps_each_cases_kernels(monkeypatch):
    """--max-t N (runs under compute-sanitizer): each sequence (varlen: segment) longer than
    about N steps is cut, keeping its length mod 64 (the partial last chunk), two chunks at
    least, and both families' defines and sequence segments (on the CPU path those of the
    default GPU); nothing else of a case changes."""
    seen = []
    monkeypatch.setattr(_verify, "run_case", lambda case, **kw: seen.append(case) or [])
    r = invoke("verify", "--max-t", "64", "--cpu")
    assert r.exit_code == 0, r.output
    sweep = _verify.standard_cases()
    assert len(seen) == len(sweep)
    cut = {}
    for c, s in zip(sweep, seen):
        assert s._replace(T=c.T, lengths=c.lengths) == c
        assert _verify.kernel_defines(s) == _verify.kernel_defines(c), c.id
        for n, m in zip(c.lengths or (c.T,), s.lengths or (s.T,)):
            assert m == n or (m < n and m % 64 == n % 64 and m > 64), (c.id, n, m)
        if s != c:
            cut[c.id] = s.lengths or s.T
    assert cut.items() >= {
        "fwd-B2-T1000-H4-K24-V24-float32-gate_logsig": 296,
        "varlen-B1-T382-H4-K24-V24-L1_17_64_300-float32-gate_logsig": (1, 17, 64, 108),
        "varlen-B1-T382-H4-K24-V24-L1_17_64_300-bfloat16-gate_logsig": (1, 17, 64, 108),
        "fwd-B2-T130-H2-K256-V512-float32-gate_logsig": 66,
        "fwd-B2-T130-H2-K256-V512-bfloat16-gate_logsig": 66,
        "fwd-B1-T200-H2-K200-V1000-float16-log_logsig": 72}.items()
    long = next(s for s in seen if s.id == "fwd-B2-T296-H4-K24-V24-float32-gate_logsig")
    assert all(segments for _, segments in _verify.kernel_defines(long))   # state passes stay


def test_verify_max_t_runs_the_cut_cases():
    r = invoke("verify", "--quick", "--max-t", "64", "--cpu")
    assert r.exit_code == 0, r.output
    ids = [ln.split()[0] for ln in result_lines(r.output, "PASS")]
    assert ids == [i for i, n in (("fwd-B2-T128-H4-K24-V24-float32-gate_logsig", 2),
                                  ("varlen-B1-T190-H4-K24-V24-L1_17_64_108-float32-gate_logsig", 2),
                                  ("bwd-fwd-B2-T1-H4-K24-V24-float32-gate_logsig", 5),
                                  ("step-B8-T1-H4-K24-V24-float32-gate_logsig", 2)) for _ in range(n)]
    assert "verify: 4 cases, 11 checks, 0 failed (CPU path (--cpu), backend numpy)" in r.output


def test_verify_rejects_bad_options():
    r = invoke("verify", "-K", "0")
    assert r.exit_code == 2 and "-K" in r.output
    r = invoke("verify", "--dtype", "int8")
    assert r.exit_code == 2 and "int8" in r.output
    r = invoke("verify", "--cpu", "--require-gpu")
    assert r.exit_code == 2 and "contradict" in r.output
    r = invoke("verify", "--max-t", "0")
    assert r.exit_code == 2 and "--max-t" in r.output


def test_bare_command_prints_help():
    r = invoke()
    assert r.exit_code == 0 and "Usage:" in r.output and "cupy-gda verify" in r.output


def test_help_summaries_are_whole():
    """Each command's one-line summary in `cupy-gda --help` is a whole sentence, not cut."""
    r = invoke("--help")
    summaries = [ln for ln in r.output.splitlines()
                 if ln.startswith("  ") and not ln.strip().startswith("-")]
    assert {ln.split()[0] for ln in summaries} >= {"bench", "info", "verify"}, r.output
    assert all(ln.rstrip().endswith(".") and not ln.rstrip().endswith("...") for ln in summaries
               if ln.split()[0] in ("bench", "info", "verify")), r.output


def test_verify_lines_fit_100_columns():
    r = invoke("verify", "--quick")
    assert r.exit_code == 0, r.output
    assert max(len(ln) for ln in r.output.splitlines()) <= cli.WIDTH, r.output


@pytest.mark.parametrize("flag, want", [("--no-log-gate", False), ("--log-gate", True)])
def test_verify_log_gate_flag_sets_every_case(flag, want, monkeypatch):
    """--log-gate / --no-log-gate alone runs the whole sweep with that gate form (before,
    --no-log-gate, the default's value, silently switched to one shape)."""
    seen = []
    monkeypatch.setattr(_verify, "run_case", lambda case, **kw: seen.append(case) or [])
    r = invoke("verify", flag)
    assert r.exit_code == 0, r.output
    assert ([c._replace(log=False) for c in seen]
            == [c._replace(log=False) for c in _verify.standard_cases()])
    assert {c.log for c in seen} == {want}


def test_verify_float64_on_the_cpu_path(monkeypatch):
    """float64 is a CPU dtype: it runs there (--cpu where a GPU is), and a GPU run of it is a
    usage error that says to add --cpu."""
    r = invoke("verify", *SMALL, "--dtype", "float64", "--cpu")
    assert r.exit_code == 0, r.output
    assert "verify: 2 cases, 4 checks, 0 failed (CPU path (--cpu), backend numpy)" in r.output
    monkeypatch.setattr(_interop, "gpu_available", lambda: (True, "a GPU"))
    backends = []
    monkeypatch.setattr(_verify, "run_case",
                        lambda case, backend, **kw: backends.append(backend) or [])
    r = invoke("verify", *SMALL, "--dtype", "float64")
    assert r.exit_code == 2 and "float64 runs on the CPU path only" in r.output
    assert "add --cpu" in r.output
    assert invoke("verify", *SMALL, "--cpu").exit_code == 0 and backends == ["numpy", "numpy"]


def test_bench_without_gpu_points_to_verify(monkeypatch):
    monkeypatch.setattr(_interop, "gpu_available", lambda: (False, "no NVIDIA driver found"))
    r = invoke("bench", "--shapes", "seed")
    assert r.exit_code == 1 and "no usable GPU: no NVIDIA driver found" in r.output
    assert "cupy-gda verify" in r.output


def test_python_dash_m():
    p = subprocess.run([sys.executable, "-m", "cupy_gda", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"cupy-gda, version {cupy_gda.__version__}"


@pytest.mark.gpu
def test_verify_gpu_single_shape():
    r = invoke("verify", "--require-gpu", *SMALL)
    assert r.exit_code == 0, r.output
    assert "no usable GPU" not in r.output
    assert len(result_lines(r.output, "PASS")) == 4
    assert "verify: 2 cases, 4 checks, 0 failed (GPU: " in r.output
    assert r.output.rstrip().endswith("backend cupy)")


@pytest.mark.parametrize("installed", [False, True], ids=["no-driver", "driver"])
def test_no_driver_is_named_as_such(installed, monkeypatch):
    """Without an NVIDIA driver CUDA reports "driver version is insufficient", which sends users
    to upgrade a driver they do not have; gpu_available (behind every no-GPU message: verify,
    info, the tests' skip reasons) says there is no driver instead."""
    cupy = pytest.importorskip("cupy")

    def no_device():
        raise cupy.cuda.runtime.CUDARuntimeError(35)     # cudaErrorInsufficientDriver

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", no_device)
    monkeypatch.setattr(_interop, "driver_installed", lambda: installed)
    ok, why = _interop.gpu_available()
    assert not ok
    if installed:
        assert why.startswith("no usable CUDA driver or device") and "insufficient" in why, why
    else:
        assert why.startswith("no NVIDIA driver found: libcuda.so.1 is not installed"), why
        assert "insufficient" not in why, why


def test_bench_cpu_rows(tmp_path):
    """bench --cpu times the CPU path without a GPU: every CPU method at a forward shape, forward
    and forward+backward (the gradients checked), the step at decode, each within the accuracy
    contract, as host rows in the table and the JSON."""
    import json
    path = tmp_path / "cpu.json"
    r = invoke("bench", "--cpu", "--shapes", "seed,decode", "--reps", "2", "--budget", "0",
               "--json", str(path))
    assert r.exit_code == 0, r.output
    assert "\n# CPU " in r.output           # (the progress lines go to stderr, mixed in here)
    rows = json.loads(path.read_text())["rows"]
    assert [(x["shape"], x["impl"]) for x in rows] == [
        ("seed", "cpu-auto"), ("seed", "cpu-recurrent"), ("seed", "cpu-chunk"),
        ("seed", "cpu-auto-fwd+bwd"), ("seed", "cpu-recurrent-fwd+bwd"),
        ("seed", "cpu-chunk-fwd+bwd"), ("decode", "cpu-step")]
    for x in rows:
        assert x["family"] == "cpu" and x["kind"] == "host" and x["status"] == "ok", x
        assert x["api"] == ("fwd+bwd" if x["impl"].endswith("fwd+bwd") else
                            "step" if x["shape"] == "decode" else "forward"), x
        assert x["ms"] > 0 and x["reps"] >= 2 and x["contract_ok"] is True, x
        assert f"{x['shape']:<6} | {x['impl']}" in r.output
