"""``cupy-gda``: a thin command line over the library.

    cupy-gda verify [-B 2 -T 63 ... --dtype bfloat16 --method chunk --cpu]   cases vs float64
    cupy-gda info                                                   versions, GPU, cache paths
    cupy-gda bench [--shapes all] [--impl ours] [--json F] [--cpu]  the kernels' timings
"""
import platform
import sys

import click

import cupy_gda
from cupy_gda import _compile, _dispatch, _interop, _launch, _verify

DTYPES = ("float32", "float16", "bfloat16", "float64")
WIDTH = 100                     # verify's lines fit this many columns


@click.group(invoke_without_command=True)
@click.version_option(cupy_gda.__version__, prog_name="cupy-gda")
@click.pass_context
def main(ctx):
    """CUDA kernels for gated linear attention, run through CuPy.

    Start with `cupy-gda verify` (checks the GPU path, or the CPU path without a GPU) and
    `cupy-gda info`.
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


# ---------------------------------------------------------------------------------------- verify

def _selected_cases(shape, quick, log=None):
    """The cases to run: one shape (forward + step) when any shape option is given, else the
    sweep (or with ``quick`` its first case of each API); ``log`` (not None) sets every case's
    log_gate flag."""
    cases = _verify.standard_cases()
    given = {k: v for k, v in shape.items() if v is not None}
    if given:
        # unset dims and flags come from the sweep's seed shape
        c = cases[0]._replace(**given)
        cases = [c, _verify.step_case(c.B, c.H, c.K, c.V, dtype=c.dtype, gate=c.gate, log=c.log)]
    elif quick:
        # the first case of each API (fwd, varlen, bwd, step): a smoke test in seconds
        firsts = {}
        for c in cases:
            firsts.setdefault(c.id.split("-", 1)[0], c)
        cases = list(firsts.values())
    return cases if log is None else [c._replace(log=log) for c in cases]


def _line(name, max_abs, rel_rms, err, bound, verdict):
    """A check's line, under its case's id: at most 56 columns."""
    return f"    {name:<6} {max_abs:>9}  {rel_rms:>9}  {err:>9}  {bound:>9}  {verdict}"


@main.command(short_help="Check random cases against the float64 NumPy reference.")
@click.option("-B", "B", type=click.IntRange(min=1), help="Batch size (single-shape mode).")
@click.option("-T", "T", type=click.IntRange(min=1), help="Sequence length (single-shape mode).")
@click.option("-H", "H", type=click.IntRange(min=1), help="Heads (single-shape mode).")
@click.option("-K", "K", type=click.IntRange(min=1), help="Key head dim (single-shape mode).")
@click.option("-V", "V", type=click.IntRange(min=1), help="Value head dim (single-shape mode).")
@click.option("--dtype", type=click.Choice(DTYPES),
              help="Dtype of q, k, v (single-shape mode; float64: the CPU path only, with --cpu "
              "where a GPU is).")
@click.option("--gate", type=click.Choice(list(_verify.GATES)),
              help="Gate distribution (single-shape mode).")
@click.option("--log-gate/--no-log-gate", "log", default=None,
              help="Pass log(gate) as log_gate, or the gate itself, in every case (default: as "
              "each case says).")
@click.option("--method", type=click.Choice(["auto", *_dispatch.METHODS]), default="auto",
              show_default=True, help="Kernel family for the forward cases.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--quick", is_flag=True, help="Only the first case of each API (fwd, varlen, bwd, "
              "step).")
@click.option("--max-t", "max_t", type=click.IntRange(min=1), metavar="N",
              help="Cut each sequence (varlen: segment) longer than about N steps, keeping its "
              "partial last chunk and the define sets and sequence segments of the kernels it "
              "runs (runs under compute-sanitizer).")
@click.option("--require-gpu", is_flag=True, help="Fail (exit 1) without a usable GPU instead of "
              "verifying the CPU path.")
@click.option("--cpu", is_flag=True, help="Verify the CPU (NumPy) path even where a GPU is.")
def verify(B, T, H, K, V, dtype, gate, log, method, seed, quick, max_t, require_gpu, cpu):
    """Check random cases against the float64 NumPy reference.

    Without shape options, runs the standard sweep (awkward T and head dims, gates, half dtypes,
    varlen, the gradients, step). Any of -B -T -H -K -V --dtype --gate selects one shape instead (the rest from
    the sweep's first case), run as a forward and a step case. Each case prints its id, then one
    line a checked tensor. Exits 1 on any failure.
    """
    ok, gpu = _interop.gpu_available()
    if require_gpu and cpu:
        raise click.UsageError("--require-gpu and --cpu contradict each other")
    if ok and not cpu:
        if dtype == "float64":
            raise click.UsageError("--dtype float64 runs on the CPU path only (the GPU kernels "
                                   "take float32, float16 and bfloat16): add --cpu")
        backend, where = "cupy", f"GPU: {gpu}"
    elif require_gpu:
        raise click.ClickException(f"no usable GPU: {gpu}")
    elif cpu:
        backend, where = "numpy", "CPU path (--cpu)"
    else:
        backend, where = "numpy", "no GPU"
        click.echo(f"no usable GPU: {gpu}\nverifying the CPU path instead")

    cases = _selected_cases(dict(B=B, T=T, H=H, K=K, V=V, dtype=dtype, gate=gate), quick, log)
    if max_t:
        # the tiles are the GPU's own where it runs, else the default GPU's (H200)
        limits = _launch.device_limits() if backend == "cupy" else _verify.H200
        cases = [_verify.shortened(c, max_t, limits) for c in cases]
    # lines are collected and printed after the bar, so the bar (on stderr) never splits them
    lines = [_line("tensor", "max_abs", "rel_rms", "err", "bound", "result")]
    checks = failed = 0
    bar = click.progressbar(cases, label="verify", file=sys.stderr,
                            item_show_func=lambda c: c.id if c else None)
    with bar:
        for case in bar:
            try:
                results = _verify.run_case(case, backend=backend, seed=seed, method=method)
            except Exception as e:  # noqa: BLE001 - a crashing case is a failed check, not the end
                msg = str(e).splitlines()[0] if str(e) else ""
                lines += [case.id, f"    error  {type(e).__name__}: {msg}"[:WIDTH - 6] + "  FAIL"]
                checks, failed = checks + 1, failed + 1
                continue
            lines.append(case.id)
            for r in results:
                lines.append(_line(r.name, f"{r.max_abs:.2e}", f"{r.rel_rms:.2e}", f"{r.err:.2e}",
                                   f"{r.bound:.2e}", "PASS" if r.ok else "FAIL"))
                checks += 1
                failed += not r.ok
    click.echo("\n".join(lines))
    click.echo(f"verify: {len(cases)} cases, {checks} checks, {failed} failed "
               f"({where}, backend {backend})")
    if failed:
        sys.exit(1)


# ------------------------------------------------------------------------------------------ info

def _probe(fn):
    """fn() as text, or a one-line reason why it could not be read (never raises)."""
    try:
        return str(fn())
    except Exception as e:  # noqa: BLE001 - a machine without a GPU fails in many ways
        msg = str(e).splitlines()[0] if str(e) else ""
        return f"unavailable ({type(e).__name__}: {msg})" if msg else f"unavailable ({type(e).__name__})"


def _cuda_version(v):
    # CUDA encodes versions as 1000 * major + 10 * minor
    return f"{v // 1000}.{v % 1000 // 10} ({v})" if v else "none (0: no CUDA driver found)"


def _cupy():
    import cupy
    return cupy


@main.command(short_help="Versions, GPU and cache paths.")
def info():
    """Versions, GPU and cache paths (each field says why where it cannot be read)."""
    import numpy
    ok, gpu = _interop.gpu_available()
    fields = [
        ("cupy_gda", cupy_gda.__version__),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("NumPy", numpy.__version__),
        ("CuPy", _probe(lambda: _cupy().__version__)),
        ("CUDA runtime", _probe(lambda: _cuda_version(_cupy().cuda.runtime.runtimeGetVersion()))),
        ("CUDA driver", _probe(lambda: _cuda_version(_cupy().cuda.runtime.driverGetVersion()))),
        ("NVRTC", _probe(lambda: "%d.%d" % _cupy().cuda.nvrtc.getVersion())),
        ("GPU", gpu if ok else f"none ({gpu})"),
        ("compute capability",
         _probe(lambda: f"sm_{_cupy().cuda.Device(0).compute_capability}") if ok else "n/a (no GPU)"),
        # where the kernels' builds are kept (in CuPy's cache folder, CUPY_CACHE_DIR)
        ("kernel cache", _compile.cache_dir()),
        ("kernels", str(_compile.KERNEL_DIR)),
    ]
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        click.echo(f"{k + ':':<{width + 1}} {v}")


# ----------------------------------------------------------------------------------------- bench

from cupy_gda import bench as _bench  # noqa: E402 - the bench command's library side


@main.command(short_help="Time the GPU kernels at named shapes, against the copy floor.")
@click.option("--shapes", "shapes_text", metavar="NAMES",
              help="Comma-separated shapes, or 'all' (the default; with --quick: "
              f"{','.join(_bench.QUICK_SHAPES)}), 'tsweep'. Shapes: {', '.join(_bench.SHAPES)}.")
@click.option("--impl", "impl_text", metavar="NAMES", help="Comma-separated families (ours, and "
              "those scripts/baselines.py adds: textbook, fla) or implementation names (ours-auto, "
              "ours-<method>, ours-step, ...); default: every family present (its forward rows). "
              "Forward+backward rows (one forward call, then the backward; extra memory of both) "
              f"only by name ({_bench.OURS_FWD_BWD}, fla-chunk_gla-{_bench.FWD_BWD}, ...) or all "
              f"of them by '{_bench.FWD_BWD}'.")
@click.option("--reps", type=click.IntRange(min=1),
              help=f"Timed calls per row; the median is reported (default {_bench.DEFAULT_REPS}, "
              f"--quick {_bench.QUICK_REPS}).")
@click.option("--budget", type=click.FloatRange(min=0), default=_bench.DEFAULT_BUDGET_S,
              show_default=True, help="Seconds of timed calls per row at most; slow rows get "
              f"fewer calls, never fewer than {_bench.MIN_REPS}.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write the header and rows as JSON to this file.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG of time vs T (log-log) of the tsweep shapes (needs matplotlib).")
@click.option("--quick", is_flag=True, help="A few shapes and fewer calls: a smoke run.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--cpu", is_flag=True, help="Time the CPU (NumPy) path instead: cpu-auto, "
              f"cpu-recurrent, cpu-chunk (decode: cpu-step), T cut to {_bench.CPU_T_MAX}; default "
              f"shapes {','.join(_bench.CPU_SHAPES)}. Needs no GPU.")
def bench(shapes_text, impl_text, reps, budget, json_path, plot_path, quick, seed, cpu):
    """Time our kernels (and any registered baseline) at named shapes, against the copy floor.

    Prints a header line (GPU, CUDA, CuPy, commit), then one row per shape and implementation:
    shape | impl | ms | GB/s | % of floor | speedup | accuracy | extra. ms is the median of
    CUDA-event times; speedup is the fastest other family's time over this row's; extra is the
    device memory a call takes beyond its inputs and outputs (the peak of CuPy's memory pool
    during one call, minus the arrays it returns). `--impl fwd+bwd`: rows that time a forward
    then a backward call with a random gradient of o (the gradients checked). `python -m
    scripts.baselines` (from a checkout) adds the textbook kernel's and fla's rows. Exits 1 if
    an ours row fails or breaks the accuracy contract.
    """
    default = _bench.CPU_SHAPES if cpu else _bench.QUICK_SHAPES if quick else ("all",)
    try:
        shapes = _bench.parse_shapes(shapes_text or ",".join(default))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--shapes") from None
    if reps is None:
        reps = _bench.QUICK_REPS if quick else _bench.DEFAULT_REPS
    if cpu:
        n = sum(len(_bench.cpu_impls(s)) for s in shapes)
        result = _with_progress("bench --cpu", n, lambda on_step, on_row: _bench.run_cpu(
            shapes, reps, budget, seed, on_step=on_step, on_row=on_row))
        _report(result, [_bench.cpu_header_line(result["header"])],
                _bench.format_table(result["rows"]), [f"# {n}" for n in result["notes"]], json_path)
        _exit_on_failures(result["rows"])
        return
    families = ["ours", *_bench.BASELINES]
    try:
        selectors = _bench.parse_impls(impl_text or ",".join(families))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--impl") from None
    ok, gpu = _interop.gpu_available()
    if not ok:
        raise click.ClickException(f"no usable GPU: {gpu}. bench times the GPU kernels; "
                                   f"`cupy-gda bench --cpu` times the CPU path and `cupy-gda "
                                   f"verify` checks it")

    notes, present = [], []
    for name, b in _bench.BASELINES.items():
        usable, why = b.available()
        if usable:
            present.append(b)
        elif any(_bench.selected(n, selectors) for n in b.names):
            notes.append(f"{name}: {why}; no {name} rows")
    units = _bench.plan(shapes, selectors, present)
    if not units:
        why = "".join(f" ({n})" for n in notes)
        raise click.ClickException(f"nothing to run: no implementation in --impl "
                                   f"{impl_text or 'all'} applies to --shapes "
                                   f"{shapes_text or 'all'}{why}")
    result = _with_progress("bench", len(units), lambda on_step, on_row: _bench.run(
        units, reps=reps, budget_s=budget, seed=seed, on_step=on_step, on_row=on_row))
    result["notes"] += notes
    _report(result, [_bench.header_line(result["header"])], _bench.format_table(result["rows"]),
            _bench.summary_lines(result), json_path)
    if plot_path:
        click.echo(f"# {_bench.plot(result['rows'], plot_path)}")
    _exit_on_failures(result["rows"])


def _with_progress(label, n, run):
    """run(on_step, on_row) with a progress bar of n steps on a terminal, else (a log, e.g. a
    remote run) one stderr line per step as it starts and one per row as it is done (its median
    ms, or why none), so a run cut off shows where and keeps what it measured."""
    if sys.stderr.isatty():
        with click.progressbar(length=n, label=label, file=sys.stderr,
                               item_show_func=lambda s: s) as bar:
            return run(lambda step: bar.update(1, step), lambda row: None)
    return run(lambda step: click.echo(f"bench: {step}", err=True),
               lambda row: click.echo(f"bench: {_row_line(row)}", err=True))


def _row_line(row):
    """'shape impl: 1.234 ms' of a done row, or its status and note where it has no time."""
    head = f"{row['shape']} {row['impl']}: "
    if row.get("status", "ok") == "ok" and row.get("ms") is not None:
        return head + f"{row['ms']:.4g} ms"
    note = f" ({row['note']})" if row.get("note") else ""
    return head + (row.get("status") or "failed") + note


def _report(result, head, table, tail, json_path):
    """The header lines, the table and the lines after it; the JSON where asked."""
    for line in [*head, table, *tail]:
        click.echo(line)
    if json_path:
        _bench.write_json(result, json_path)
        click.echo(f"# rows written to {json_path}")


def _exit_on_failures(rows):
    bad = _bench.failures(rows)
    if bad:
        click.echo("# FAIL: " + ", ".join(f"{r['shape']} {r['impl']}" for r in bad))
        sys.exit(1)

