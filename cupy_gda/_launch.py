"""What every launcher shares: the kernels' declared parameter lists, the launch through the
driver, sequence-segmented plans, the device's limits and the plan cache.

Everything here that does not touch a device is plain Python, so it is unit-tested without a
GPU. The launchers (one module a kernel family: recurrent.py, chunk.py, step.py) go shapes ->
allocate -> grid -> launch with these.
"""
import ctypes
import threading
from typing import NamedTuple

import numpy as np

from cupy_gda import _compile

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2}     # IO_DTYPE / G_DTYPE (common.cuh)
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
POISON = False           # tests set this: internally allocated outputs start as NaN

# ---- kernel parameters, declared once (a CPU test holds each list against the .entry
# parameters of the PTX that NVRTC emits for every define set a launcher produces)
PTR, I32, I64, F32 = "ptr", "i32", "i64", "f32"
PTX_TYPES = {PTR: "u64", I64: "u64", I32: "u32", F32: "f32"}
_CTYPES = {I32: ctypes.c_int32, I64: ctypes.c_int64, F32: ctypes.c_float}

# GDA_FORWARD_PARAMS (common.cuh): gda_recurrent_fwd, gda_chunk_fwd and their state passes
FORWARD = (("q", PTR), ("k", PTR), ("v", PTR), ("g", PTR), ("o", PTR), ("h0", PTR), ("ht", PTR),
           ("cu_seqlens", PTR), ("ws_s", PTR), ("ws_d", PTR), ("only_if", PTR),
           ("T", I64), ("H", I32), ("NV", I32), ("P", I32), ("scale", F32))
# gda_recurrent_bwd (its GDA_BACKWARD_PARAMS) and gda_recurrent_bwd_sum
BACKWARD = (("q", PTR), ("k", PTR), ("v", PTR), ("g", PTR), ("do", PTR), ("h0", PTR), ("dht", PTR),
            ("cu_seqlens", PTR), ("ws_h", PTR), ("ws_s", PTR), ("ws_p", PTR), ("dq", PTR),
            ("dk", PTR), ("dv", PTR), ("dg", PTR), ("dh0", PTR), ("only_if", PTR),
            ("T", I64), ("H", I32), ("NV", I32), ("NG", I32), ("scale", F32))
BACKWARD_SUM = (("ws_p", PTR), ("g", PTR), ("dq", PTR), ("dk", PTR), ("dg", PTR),
                ("only_if", PTR), ("n", I64), ("NG", I32))
# every entry of gda_chunk_bwd (its GDA_CHUNK_BWD_PARAMS)
CHUNK_BACKWARD = tuple((n, PTR) for n in (
    "q", "k", "v", "g", "do", "h0", "dht", "st", "et", "qa", "kd", "vp", "dp", "ae", "es", "mm",
    "ww", "sd", "ev", "ar", "pl", "flag", "dq", "dk", "dv", "dg", "dh0", "cu_seqlens", "coff")) + (
    ("T", I64), ("NH", I64), ("N", I64), ("H", I32), ("NC", I32), ("scale", F32))
# every entry of gda_scan
SCAN = (("a", PTR), ("z", PTR), ("init", PTR), ("ws", PTR), ("e", PTR),
        ("T", I64), ("L", I64), ("NSEG", I32), ("TS", I32), ("reverse", I32))
# every entry of gda_slice
SLICE = tuple((n, PTR) for n in ("x", "a", "st", "y", "w", "z", "out", "pr", "ws", "tot",
                                 "count")) + (
    ("T", I64), ("B", I32), ("H", I32), ("K", I32), ("V", I32), ("NSEG", I32), ("reverse", I32),
    ("scale", F32))
# every entry of gda_convert
CONVERT = (("x", PTR), ("y", PTR), ("n", I64))
# gda_step
STEP = (("q", PTR), ("k", PTR), ("v", PTR), ("g", PTR), ("o", PTR), ("state", PTR),
        ("state_indices", PTR), ("H", I32), ("N", I64), ("NV", I32), ("scale", F32))


# a define that makes a variant for one architecture's own instructions -> the NVRTC target
ARCH_DEFINES = {"WGMMA": "--gpu-architecture=sm_90a",     # Hopper's warpgroup MMA
                "SCAN_O_WG": "--gpu-architecture=sm_90a", "SCAN_DV": "--gpu-architecture=sm_90a"}


class Family(NamedTuple):
    """A kernel family: kernels/<kernel>.cu, the headers prepended to it (in order), extra NVRTC
    options, and its entry points with their parameter lists."""
    kernel: str
    headers: tuple
    entries: dict
    options: tuple = ()

    def compile_options(self, defines):
        """The family's options and the target that ``defines`` needs (ARCH_DEFINES)."""
        return self.options + tuple(o for d, o in ARCH_DEFINES.items() if defines.get(d))

    def function(self, entry, defines, smem=0):
        """The compiled entry point for the current device (memoised), allowed ``smem`` bytes."""
        return _compile.get_function(self.kernel, defines, entry=entry, headers=self.headers,
                                     options=self.compile_options(defines), smem=smem)

    def cubin(self, defines, arch):
        """compile_cubin of the family's source for ``arch`` (no GPU needed)."""
        return _compile.compile_cubin(self.kernel, defines, arch, self.headers,
                                      self.compile_options(defines))


class Launch:
    """One entry point's launches through the driver (cuLaunchKernel) with a parameter buffer
    built once, where CuPy would pack every argument again (about 1 µs each). Its parameter list
    ``params`` has the pointers first; the scalars but the last are fixed per plan, by name
    (``sizes``); a call passes the pointers, in the declared order, and the last scalar."""

    def __init__(self, fn, params, grid, block, smem, **sizes):
        from cupy.cuda import driver, get_current_stream
        self._launch, self._stream = driver.launchKernel, get_current_stream
        self.fn = fn                       # a cupy.RawKernel; keeps the module loaded
        self.ptr, self.grid, self.block, self.smem = fn.kernel.ptr, grid, block, smem
        npointers = sum(kind == PTR for _, kind in params)
        scalars = params[npointers:]
        if any(kind == PTR for _, kind in scalars) or set(sizes) != {n for n, _ in scalars[:-1]}:
            raise TypeError(f"Launch: {[n for n, _ in params]} takes the pointers first and every "
                            f"scalar but the last by name; got sizes {sorted(sizes)}")
        self.names = tuple(n for n, _ in params[:npointers])    # what a call passes, in order
        self.ptrs = (ctypes.c_uint64 * npointers)()
        self.scalars = [_CTYPES[kind](sizes.get(name, 0)) for name, kind in scalars]
        addrs = [ctypes.addressof(self.ptrs) + 8 * i for i in range(npointers)]
        addrs += [ctypes.addressof(x) for x in self.scalars]
        self.params = (ctypes.c_void_p * len(addrs))(*addrs)
        self.lock = threading.Lock()       # one buffer: concurrent callers take turns

    def __call__(self, ptrs, last):
        stream = self._stream().ptr
        with self.lock:
            self.ptrs[:] = ptrs
            self.scalars[-1].value = last
            self._launch(self.ptr, self.grid, 1, 1, self.block, 1, 1, self.smem, stream,
                         ctypes.addressof(self.params), 0)


def cp_async_inputs(p):
    """Whether Problem ``p``'s inputs may be staged by cp.async as they are in memory (the
    kernels' GDA_ASYNC_INPUTS): float32, a multiplicative float32 gate, K and V multiples of 4."""
    return (p.dtype == "float32" and p.g_dtype == "float32" and not p.log_gate
            and p.K % 4 == 0 and p.V % 4 == 0)


def mean_len(p):
    """Mean sequence length: T, or the packed tokens over the sequences for varlen."""
    return p.B * p.T / max(p.N, 1)


def segments(blocks, per_sm, sms, units, min_units, L, itemsize, V):
    """Sequence segments P of a forward family: as many as make ``per_sm`` of its ``blocks`` a SM
    on ``sms`` SMs, with at least ``min_units`` of the ``units`` of the mean length ``L`` each,
    and a workspace, (P - 1) K (V + 2) floats a sequence-head, no larger than q (``itemsize``
    bytes an element); at least 1."""
    return max(1, min(per_sm * sms // max(blocks, 1), units // min_units,
                      1 + int(L) * itemsize // (4 * (V + 2))))


ALLOC = 256              # bytes: the unit the JAX adapter hands out its scratch in (cupy_gda.jax)


def rounded(*sizes):
    """The bytes of allocations of ``sizes`` bytes each, each rounded up to ALLOC."""
    return sum(-(-n // ALLOC) * ALLOC for n in sizes)


def empty(shape, dtype):
    import cupy
    x = cupy.ndarray(shape, dtype)
    if POISON:
        x.fill(np.nan)
    return x


def address(x):
    """The device address of a CuPy array, 0 for None."""
    return 0 if x is None else x.data.ptr


class SegmentedPlan:
    """A forward family in P sequence segments: with P > 1 a call allocates the workspace
    ((P - 1)(K V + 2K) floats a sequence-head: each segment's S and its gate product, as m 2^e)
    and launches the state pass first, on the same stream; with P = 1, one launch. The subclass
    names its two entries (``family``, ``entry``, ``state_entry``) and calls _setup with its
    defines and sizes."""

    def _setup(self, p, defines, smem, NV, P, threads):
        self.grid, self.block = (p.N * p.H * P * NV,), (threads,)
        sizes = dict(T=p.T, H=p.H, NV=NV, P=P)
        fam = self.family
        self.launch = Launch(fam.function(self.entry, defines, smem), fam.entries[self.entry],
                             self.grid[0], threads, smem, **sizes)
        self.state_launch = self.ws_sizes = None
        if P > 1:
            self.state_launch = Launch(fam.function(self.state_entry, defines, smem),
                                       fam.entries[self.state_entry], p.N * p.H * (P - 1) * NV,
                                       threads, smem, **sizes)
            self.ws_sizes = (p.N * p.H * (P - 1) * p.K * p.V, p.N * p.H * (P - 1) * 2 * p.K)
        self.o_shape, self.o_dtype = (p.B, p.T, p.H, p.V), np_dtype(p.dtype)
        self.ht_shape = (p.N, p.H, p.K, p.V)

    def scratch_bytes(self, want_final):
        """The bytes a call with ``out`` given allocates (``rounded``): the final state where
        ``want_final``, the workspace where P > 1."""
        sizes = [4 * int(np.prod(self.ht_shape))] if want_final else []
        if self.state_launch is not None:
            sizes.append(4 * sum(self.ws_sizes))
        return rounded(*sizes)

    def __call__(self, q, k, v, g, scale, h0, cu_seqlens, want_final, out, only_if=0, ht=None):
        """o [B, T, H, V] (and the final state); arrays are contiguous CuPy. As a fall-back
        (chunk_bwd.ForwardPlan): ``only_if`` the address of a device int, where the launches do
        nothing while it is 0, and ``ht`` the final state's array to write."""
        o = out if out is not None else empty(self.o_shape, self.o_dtype)
        if want_final and ht is None:
            ht = empty(self.ht_shape, np.float32)
        if self.grid[0]:
            ws = ws_s = ws_d = 0
            if self.state_launch is not None:       # kept alive (ws) until both are queued
                ws = empty((sum(self.ws_sizes),), np.float32)
                ws_s = ws.data.ptr
                ws_d = ws_s + 4 * self.ws_sizes[0]
            ptrs = (q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, o.data.ptr, address(h0), address(ht),
                    address(cu_seqlens), ws_s, ws_d, only_if)
            if ws_s:
                self.state_launch(ptrs, scale)
            self.launch(ptrs, scale)
        return o, ht


def np_dtype(name):
    import cupy
    return cupy.dtype(name)


def current_device():
    import cupy
    return cupy.cuda.runtime.getDevice()


def capability():
    """The current device's compute capability as a number (90 for 9.0)."""
    import cupy
    dev = cupy.cuda.Device()
    c = _CAPABILITY.get(dev.id)
    if c is None:
        c = _CAPABILITY[dev.id] = int(dev.compute_capability)
    return c


def hopper():
    """Whether the current device is a Hopper GPU (compute capability 9.0: sm_90a's wgmma)."""
    return capability() == 90


def device_limits():
    """(SM count, opt-in shared memory bytes per block) of the current device."""
    import cupy
    dev = cupy.cuda.Device()
    lim = _LIMITS.get(dev.id)
    if lim is None:
        a = dev.attributes
        lim = _LIMITS[dev.id] = (a["MultiProcessorCount"], a["MaxSharedMemoryPerBlockOptin"])
    return lim


_LIMITS = {}
_CAPABILITY = {}
_PLANS = {}


def cached(make, *key):
    """``make(*key)`` memoised per current device: a plan is built once per call signature."""
    full = (make, current_device()) + key
    pl = _PLANS.get(full)
    if pl is None:
        pl = _PLANS[full] = make(*key)
    return pl
