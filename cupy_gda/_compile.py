"""The one compile path: headers + kernel file + sorted defines -> source text -> module.

At run time the module comes from ``cupy.RawModule`` (NVRTC, for the current device, memoised per
device; CuPy also caches the binary on disk, keyed by the text). Without a GPU, :func:`compile_cubin`
runs the same text through NVRTC for an explicit architecture (used by the compile tests and CI).
A kernel's headers (``kernels/*.cuh``, prepended as text in order: CuPy's disk cache does not see
``#include``d files) and its extra NVRTC options (an ``sm_90a`` target, say) come from its
launcher (``_launch.Family``).
"""
import functools
import re
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# installed: cupy_gda/kernels (setup.cfg maps the top-level kernels/ there); source tree: ../kernels
KERNEL_DIR = next(p for p in (_HERE / "kernels", _HERE.parent / "kernels") if (p / "common.cuh").is_file())
OPTIONS = ("-std=c++17",)       # every kernel's; no fast math: expf and division stay IEEE
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
    defines = dict(items)
    try:
        mod = cupy.RawModule(code=source(kernel, defines, headers), options=OPTIONS + options)
        mod.compile()
        return mod
    except cupy.cuda.compiler.CompileException as e:
        raise KernelCompileError(f"compiling {_describe(kernel, defines)} failed:\n{e}") from None


_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_ENTRY = re.compile(r"Compiling entry function '(\w+)'")


def compile_cubin(kernel, defines, arch="sm_90", headers=HEADERS, options=()):
    """Compile through NVRTC for ``arch`` without a GPU. Returns (cubin bytes, resource dict)
    with keys registers, stack, spill_stores, spill_loads (from ptxas -v; the largest over the
    file's entry points), functions (entry name -> its own such dict), params (entry name -> the
    PTX types of its parameters, in order), the log and the PTX text."""
    from cupy_backends.cuda.libs import nvrtc
    opts = list(OPTIONS + tuple(options)) + [f"--gpu-architecture={arch}", "--ptxas-options=-v"]
    # a unique device variable, so that the PTX differs too: a cache of ptxas results keyed by
    # the PTX hands back a binary without the ptxas report (seen on the H200 machine: empty logs
    # when the same kernels were compiled a second time, even with a unique comment line)
    text = source(kernel, defines, headers) + f"\n__device__ int gda_offline_compile_{time.time_ns()} = 1;\n"
    prog = nvrtc.createProgram(text, f"{kernel}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            raise KernelCompileError(f"compiling {_describe(kernel, defines)} for {arch} failed: "
                                     f"{e}\n{nvrtc.getProgramLog(prog)}") from None
        log = nvrtc.getProgramLog(prog)
        cubin = nvrtc.getCUBIN(prog)
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
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
