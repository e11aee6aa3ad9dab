"""Wall time of the CPU (NumPy) forms of the recurrence: the data behind the CPU row of
_dispatch (``CPU_AUTO``) and reference.STATE_BYTES (docs/perf-notes.md, "CPU paths").

    python -m scripts.cpu_paths [--reps N] [--bench-t T]

Per shape, the median of N calls (default 5) of: ``loop`` (reference.gated_attention_ref in
float32, the contract's loop, one sequence at a time), ``recurrent`` (gated_attention_recurrent:
the same loop over a group of sequences at once; method "recurrent" and "auto") and ``chunk``
(gated_attention_chunked, method "chunk"), and recurrent's ratio to the loop. Shapes: the forward
cases of ``cupy-gda verify`` (its inputs: _verify.make_inputs), then the benchmark shapes with T
cut to --bench-t (default 256: whole-T rows take minutes on a CPU).
"""
import argparse
import sys

import numpy as np

from cupy_gda import _verify, bench, reference

FORMS = {
    "loop": lambda a: reference.gated_attention_ref(**a, dtype=np.float32),
    "recurrent": lambda a: reference.gated_attention_recurrent(**a),
    "chunk": lambda a: reference.gated_attention_chunked(**a),
}


def cases(bench_t):
    """(label, Case): verify's forward cases, then the bench's forward shapes at T <= bench_t."""
    out = [(c.id, c) for c in _verify.standard_cases() if not c.step]
    for s in bench.SHAPES.values():
        if not s.step:
            c = s.case._replace(T=min(s.T, bench_t))
            out.append((f"{s.name} (T={c.T})", c))
    return out


def median_s(fn, reps):
    """The median wall seconds of ``reps`` calls after a warm-up one (bench.host_times)."""
    return float(np.median(bench.host_times(fn, lambda: None, reps, 1))) / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m scripts.cpu_paths", description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bench-t", type=int, default=256)
    a = ap.parse_args(argv)
    print(f"{'shape':64s} {'loop s':>9s} {'recurrent':>9s} {'chunk':>9s} {'rec/loop':>8s}", flush=True)
    for label, case in cases(a.bench_t):
        args = _verify.make_inputs(case, 0)
        args.pop("state", None)
        t = {name: median_s(lambda: f(args), a.reps) for name, f in FORMS.items()}
        print(f"{label:64s} {t['loop']:9.4f} {t['recurrent']:9.4f} {t['chunk']:9.4f} "
              f"{t['recurrent'] / t['loop']:8.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
