"""Launcher of gda_convert (kernels/gda_convert.cu): float16 and bfloat16 CuPy arrays to float32
and back, 8 elements a thread (CuPy's astype of 2-byte elements runs at about a third of the
copy rate). ``as_float32`` and ``as_dtype`` take any array: NumPy arrays, float32 or float64
arrays and non-contiguous ones go through astype (the reference the kernels are tested against).
"""
import numpy as np

from cupy_gda._launch import CONVERT, DTYPE_CODE, Family, Launch, address, cached, empty

ENTRIES = ("gda_convert_up", "gda_convert_down")
FAMILY = Family("gda_convert", ("common.cuh",), {e: CONVERT for e in ENTRIES})
NT, PER = 256, 8                  # the kernel's threads a block, elements a thread


def defines(dtype, vec):
    """The build for half ``dtype`` ('float16' or 'bfloat16'), 16-byte accesses or not."""
    return dict(IO_DTYPE=DTYPE_CODE[dtype], G_DTYPE=0, VEC=int(vec))


class ConvertPlan:
    """gda_convert_up or _down (``entry``) over n elements of half ``dtype``: a call queues one
    launch."""

    def __init__(self, entry, dtype, n, vec):
        grid = max(1, -(-n // (NT * PER)))
        self.launch = Launch(FAMILY.function(entry, defines(dtype, vec)), CONVERT, grid, NT, 0)

    def __call__(self, x, y):
        if x.size:
            self.launch((address(x), address(y)), x.size)
        return y


def _fast(x):
    """Whether gda_convert takes x: a C-contiguous CuPy array."""
    if isinstance(x, np.ndarray):
        return False
    import cupy
    return isinstance(x, cupy.ndarray) and x.flags.c_contiguous


def _run(entry, x, y, half):
    vec = x.data.ptr % 16 == 0 and y.data.ptr % 16 == 0
    return cached(ConvertPlan, entry, half, x.size, vec)(x, y)


def as_float32(x):
    """x as float32: x itself where it is float32, a new contiguous array otherwise (a contiguous
    float16 or bfloat16 CuPy array by gda_convert_up)."""
    if x.dtype == np.float32:
        return x
    if x.dtype.name in ("float16", "bfloat16") and _fast(x):
        return _run("gda_convert_up", x, empty(x.shape, np.float32), x.dtype.name)
    return x.astype(np.float32)


def as_dtype(x, dtype):
    """x (float32) as ``dtype``: x itself where it is, rounded to nearest even otherwise (into a
    new array; a contiguous float32 CuPy array to float16 or bfloat16 by gda_convert_down)."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.dtype == np.float32 and dtype.name in ("float16", "bfloat16") and _fast(x):
        return _run("gda_convert_down", x, empty(x.shape, dtype), dtype.name)
    return x.astype(dtype)
