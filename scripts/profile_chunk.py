"""gda_chunk_fwd by stage, on the device.

    python -m scripts.profile_chunk [--no-profile]
        per-stage clock64 cycles of block 0 and of the last block, and their prologue's (the
        segments' carry), compiled with -DGDA_PROFILE (which adds a barrier per stage), and the
        device ms of each method, at the shapes below
    PYTHONPATH=<tree> python scripts/profile_chunk.py --time[-recurrent] B,T,H,K,V[,dtype] ...
        the median device ms of gda_chunk_fwd's plan (state pass and forward; with
        --time-recurrent, gda_recurrent_fwd's) at each shape, each of 100 calls between two CUDA
        events and queued behind a spin kernel (bench.measure: the host's launch time is left
        out, which at the small rows moved the plain events' medians by 5-15 % between runs);
        it uses only the plans, check_forward, make_inputs and bench's clock, so that with
        PYTHONPATH set to an older tree's folder (git archive <commit> cupy_gda kernels) it times
        that tree's kernel (run as a file: python -m would put this checkout's cupy_gda first);
        run the trees in turn, interleaved
    ncu -k gda_chunk_fwd --section SourceCounters --import-source yes -o rep \\
        python -m scripts.profile_chunk --ncu 8,4096,16,128,128 [bfloat16]
        one call, compiled by nvcc with -lineinfo from a source kept in .ncu/ (CuPy compiles
        from a temporary file that is gone before ncu imports it), so that ncu maps its
        counters to the lines of that file; then
    ncu -i rep.ncu-rep --page source --print-source cuda,sass --csv > both.csv
    python -m scripts.ncu_stages both.csv 8,4096,16,128,128 [bfloat16]
"""
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from cupy_gda import _checks, _compile, _verify, bench, chunk
from cupy_gda._launch import Family

KEPT = Path(__file__).resolve().parent.parent / ".ncu"     # sources and cubins for ncu (ignored)
SHAPES = [((8, 4096, 16, 128, 128), "float32"), ((8, 4096, 16, 128, 128), "bfloat16"),
          ((4, 2048, 8, 64, 64), "float32"), ((8, 4096, 16, 24, 24), "float32"),
          ((2, 128, 4, 24, 24), "float32")]


def problem(shape, dtype):
    """The bench inputs (CuPy) of (B, T, H, K, V) in dtype, their Problem, and an output array."""
    import cupy
    x = _verify.make_inputs(_verify.Case(*shape, dtype=dtype, init=False, g_dtype="float32"), 0, cupy)
    p = _checks.check_forward("profile", x["q"], x["k"], x["v"], x["gate"], None, None, None, cpu=False)
    return x, p, cupy.empty_like(x["v"])


class KeptFamily(Family):
    """gda_chunk_fwd built by nvcc -lineinfo from a source kept in .ncu/ (for ncu's source view)."""

    def function(self, entry, defines, smem=0):
        import cupy
        text = _compile.source(self.kernel, defines, self.headers)
        stem = KEPT / f"{self.kernel}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
        if not stem.with_suffix(".cubin").is_file():
            KEPT.mkdir(exist_ok=True)
            stem.with_suffix(".cu").write_text(text)
            major, minor = cupy.cuda.Device().compute_capability
            subprocess.run([shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc", "-cubin", "-lineinfo",
                            f"-arch=sm_{major}{minor}", *_compile.OPTIONS, *self.options, "-o",
                            str(stem.with_suffix(".cubin")), str(stem.with_suffix(".cu"))], check=True)
        fn = cupy.RawModule(path=str(stem.with_suffix(".cubin"))).get_function(entry)
        fn.max_dynamic_shared_size_bytes = smem
        return fn


class KeptPlan(chunk.ChunkPlan):
    family = KeptFamily(*chunk.FAMILY)


def one_call(plan, x, o):
    import cupy
    plan(x["q"], x["k"], x["v"], x["gate"], 1.0, None, None, False, o)
    cupy.cuda.Device().synchronize()


def plan_ms(plan, x, o, reps=100):
    """Median device ms of reps calls of the plan, each between two CUDA events behind a spin."""
    return bench.measure(bench.CupyClock(), lambda: plan(x["q"], x["k"], x["v"], x["gate"], 1.0, None,
                                                         None, False, o), reps, 1.0)["ms"]


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["--time"], ["--time-recurrent"]):
        from cupy_gda import recurrent
        Plan = chunk.ChunkPlan if args[0] == "--time" else recurrent.RecurrentPlan
        print("tree:", Path(chunk.__file__).resolve().parent.parent, flush=True)
        for spec in args[1:]:
            f = spec.split(",")
            x, p, o = problem(tuple(int(v) for v in f[:5]), f[5] if len(f) > 5 else "float32")
            plan = Plan(p, False)
            print(spec, plan.cfg, f"{plan_ms(plan, x, o):.4f} ms", flush=True)
        return
    if args[:1] == ["--ncu"]:
        x, p, o = problem(tuple(int(v) for v in args[1].split(",")), args[2] if len(args) > 2 else "float32")
        one_call(KeptPlan(p, False), x, o)
        return
    clock = bench.CupyClock()
    for shape, dtype in SHAPES:
        x, p, o = problem(shape, dtype)
        t = {m: bench.measure(clock, lambda m=m: bench.call_ours(
                 bench.Shape("", *shape, dtype=dtype), x, m), 10, 5.0)["ms"]
             for m in ("chunk", "recurrent")}
        print(shape, dtype, " ".join(f"{m} {ms:.4f} ms" for m, ms in t.items()), flush=True)
        if "--no-profile" not in args:
            one_call(chunk.ChunkPlan(p, False, extra={"GDA_PROFILE": 1}), x, o)


if __name__ == "__main__":
    main()
