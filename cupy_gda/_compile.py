"""The one compile path: headers + kernel file + sorted defines -> source text -> NVRTC -> module.

Every build goes through NVRTC here, with OPTIONS: at run time for the current device (a cubin,
kept on disk under CuPy's cache folder, keyed by the text, the options, the target and NVRTC's
version; loaded with ``cupy.RawModule(path=...)``, memoised per device), and without a GPU, by
:func:`compile_cubin`, for an explicit architecture (the compile tests and CI). Not through
``cupy.RawModule(code=...)``: CuPy appends ``-ftz=true`` to every such build, and NVRTC takes
the last, so every kernel would flush subnormal results to 0 where the float32 loop keeps them
(a gate product of 1e-39, say). A kernel's headers (``kernels/*.cuh``, prepended as text in
order, so that the key sees them) and its extra NVRTC options (an ``sm_90a`` target, say) come
from its launcher (``_launch.Family``).
"""
import functools
import hashlib
import os
import re
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# installed: cupy_gda/kernels (setup.cfg maps the top-level kernels/ there); source tree: ../kernels
KERNEL_DIR = next(p for p in (_HERE / "kernels", _HERE.parent / "kernels") if (p / "common.cuh").is_file())
# every kernel's: no fast math (expf and division stay IEEE), subnormals kept as IEEE has them
OPTIONS = ("-std=c++17", "-ftz=false")
_TARGET = "--gpu-architecture="
CACHE_FORMAT = 1        # bump when what a cached file holds changes
HEADERS = ("common.cuh",)


class KernelCompileError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def _read(name):
    return (KERNEL_DIR / name).read_text()


def source(kernel, defines, headers=HEADERS):
    """Source text of kernels/<kernel>.cu with a #define preamble and ``headers`` prepended."""
    pre = "".join(f"#define {k} {v}\n" for k, v in sorted(defines.items()))
    return f"// {kernel}.cu\n{pre}" + "".join(_read(h) + "\n" for h in headers) + _read(kernel + ".cu")


def _describe(kernel, defines):
    return f"kernels/{kernel}.cu with " + " ".join(f"-D{k}={v}" for k, v in sorted(defines.items()))


_memo = None


def get_function(kernel, defines, *, entry=None, headers=HEADERS, options=(), smem=0):
    """The compiled entry point ``entry`` (default: ``kernel``) of kernels/<kernel>.cu, with
    ``headers`` prepended and ``options`` added to OPTIONS, for the current device (memoised per
    device), allowed ``smem`` bytes of dynamic shared memory."""
    global _memo
    if _memo is None:
        import cupy
        _memo = cupy.memoize(for_each_device=True)(_load)
    fn = _memo(kernel, tuple(sorted(defines.items())), entry or kernel, tuple(headers), tuple(options))
    if smem and fn.max_dynamic_shared_size_bytes < smem:   # the default leaves 48 KB - static
        fn.max_dynamic_shared_size_bytes = smem
    return fn


def _load(kernel, items, entry, headers, options):
    return _module(kernel, items, headers, options).get_function(entry)


@functools.lru_cache(maxsize=None)
def _module_memo():
    import cupy
    return cupy.memoize(for_each_device=True)(_compile_module)


def _module(kernel, items, headers, options):
    return _module_memo()(kernel, items, headers, options)


def _compile_module(kernel, items, headers, options):
    import cupy
    path = _cached_binary(kernel, dict(items), headers, options, _device_target())
    return cupy.RawModule(path=str(path))


def _device_target():
    """The current device's NVRTC target: its SASS where this NVRTC knows the architecture, else
    PTX of the newest one it knows (the driver compiles that for the device)."""
    import cupy
    from cupy_backends.cuda.libs import nvrtc
    cc = int(cupy.cuda.Device().compute_capability)
    known = nvrtc.getSupportedArchs()
    return f"sm_{cc}" if cc in known else f"compute_{max(a for a in known if a <= cc)}"


def cache_dir():
    """Where run-time builds are kept: cupy_gda/ in CuPy's kernel cache (CUPY_CACHE_DIR)."""
    root = os.environ.get("CUPY_CACHE_DIR", os.path.expanduser("~/.cupy/kernel_cache"))
    return os.path.join(root, "cupy_gda")


def _cached_binary(kernel, defines, headers, options, arch):
    """The path of the build of ``kernel`` for ``arch``: compiled once, then read from disk (where
    the cache folder cannot be written, a folder of this process's in the temporary one)."""
    from cupy_backends.cuda.libs import nvrtc
    text = source(kernel, defines, headers)
    opts = _options(options, arch)
    key = repr((CACHE_FORMAT, nvrtc.getVersion(), opts, text)).encode()
    ext = ".ptx" if arch.startswith("compute_") else ".cubin"
    name = hashlib.sha256(key).hexdigest() + ext
    for folder in (cache_dir(), _private):
        if folder and os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    _, cubin, ptx = _nvrtc(kernel, defines, text, opts)
    binary = ptx if ext == ".ptx" else cubin
    try:
        return _write(cache_dir(), name, binary)
    except OSError:
        return _write(_private_dir(), name, binary)


def _write(folder, name, data):
    """folder/name <- data, whole (others may write it too: a temporary file, then a rename)."""
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=os.path.splitext(name)[1])
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(folder, name))
    return os.path.join(folder, name)


_private = None         # this process's folder for builds the cache folder cannot take


def _private_dir():
    global _private
    if _private is None:
        _private = tempfile.mkdtemp(prefix="cupy_gda_kernels_")
    return _private


def _options(options, arch):
    """OPTIONS, the family's ``options``, and the target ``arch`` unless they name their own."""
    opts = list(OPTIONS + tuple(options))
    return opts if any(o.startswith(_TARGET) for o in opts) else opts + [_TARGET + arch]


def _nvrtc(kernel, defines, text, opts):
    """(log, cubin, PTX) of NVRTC's build of ``text``; KernelCompileError naming the file and
    the defines where it fails."""
    from cupy_backends.cuda.libs import nvrtc
    prog = nvrtc.createProgram(text, f"{kernel}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            target = next(o for o in opts if o.startswith(_TARGET))[len(_TARGET):]
            raise KernelCompileError(f"compiling {_describe(kernel, defines)} for {target} "
                                     f"failed: {e}\n{nvrtc.getProgramLog(prog)}") from None
        log = nvrtc.getProgramLog(prog)
        cubin = b"" if any(o.startswith(_TARGET + "compute_") for o in opts) else nvrtc.getCUBIN(prog)
        return log, cubin, nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)


_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_ENTRY = re.compile(r"Compiling entry function '(\w+)'")


def compile_cubin(kernel, defines, arch="sm_90", headers=HEADERS, options=()):
    """Compile through NVRTC for ``arch`` without a GPU. Returns (cubin bytes, resource dict)
    with keys registers, stack, spill_stores, spill_loads (from ptxas -v; the largest over the
    file's entry points), functions (entry name -> its own such dict), params (entry name -> the
    PTX types of its parameters, in order), the log and the PTX text."""
    opts = _options(options, arch) + ["--ptxas-options=-v"]
    # a unique device variable, so that the PTX differs too: a cache of ptxas results keyed by
    # the PTX hands back a binary without the ptxas report (seen on the H200 machine: empty logs
    # when the same kernels were compiled a second time, even with a unique comment line)
    text = source(kernel, defines, headers) + f"\n__device__ int gda_offline_compile_{time.time_ns()} = 1;\n"
    log, cubin, ptx = _nvrtc(kernel, defines, text, opts)
    functions = {m.group(1): _usage(part) for m, part in _entries(log)}
    res = {key: _worst(u[key] for u in functions.values())
           for key in ("registers", "stack", "spill_stores", "spill_loads")}
    ptx = ptx.decode(errors="replace") if isinstance(ptx, bytes) else ptx
    res.update(functions=functions, params=ptx_params(ptx), log=log, ptx=ptx)
    return cubin, res


_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)")
_PTX_PARAM = re.compile(r"\.param\s+\.(\w+)")


def ptx_params(ptx):
    """{entry: (PTX type of each parameter, in order)} of a PTX text (e.g. ('u64', 'u32', 'f32'))."""
    text = ptx.decode() if isinstance(ptx, bytes) else ptx
    return {m.group(1): tuple(_PTX_PARAM.findall(m.group(2))) for m in _PTX_ENTRY.finditer(text)}


def _entries(log):
    """(match, text) of each entry function's part of a ptxas -v log."""
    ms = list(_ENTRY.finditer(log))
    return [(m, log[m.end():ms[i + 1].start() if i + 1 < len(ms) else len(log)])
            for i, m in enumerate(ms)]


def _usage(text):
    stack, regs = _STACK.search(text), _REGS.search(text)
    return {"registers": int(regs.group(1)) if regs else None,
            "stack": int(stack.group(1)) if stack else None,
            "spill_stores": int(stack.group(2)) if stack else None,
            "spill_loads": int(stack.group(3)) if stack else None}


def _worst(values):
    values = list(values)
    return None if not values or None in values else max(values)
