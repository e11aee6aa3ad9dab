"""Where a call runs: the arrays decide.

- NumPy arrays: the CPU path; results are NumPy arrays.
- CuPy arrays: the GPU kernels on CuPy's current stream, on the arrays' device.
- Any other array exporting ``__dlpack__`` from a CUDA device (PyTorch, JAX, ...): taken in
  zero-copy through DLPack, run on the GPU, handed back as that framework's array type. For
  PyTorch the kernels run on torch's current stream (so no synchronisation is needed either way);
  for other frameworks the DLPack stream handshake orders the work.
- A framework's CPU array (``__dlpack_device__`` of kDLCPU): through NumPy, then back.
"""
import contextlib
import sys

import numpy as np

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_MANAGED = 1, 2, 13


def _library(x):
    lib = type(x).__module__.split(".")[0]
    return "jax" if lib == "jaxlib" else lib


def _where(fn, name, x):
    """(library, device) of one argument; device is 'cpu' or a CUDA ordinal."""
    if isinstance(x, np.ndarray):
        return "numpy", "cpu"
    lib = _library(x)
    if lib == "cupy":
        return "cupy", x.device.id
    dl = getattr(x, "__dlpack_device__", None)
    if dl is not None and hasattr(x, "__dlpack__"):
        dev_type, dev_id = dl()
        if dev_type in (_KDL_CUDA, _KDL_CUDA_MANAGED):
            return lib, int(dev_id)
        if dev_type == _KDL_CPU:
            return lib, "cpu"
    raise TypeError(f"{fn}: {name} must be an array (NumPy, CuPy, or a CUDA or CPU array that "
                    f"exports __dlpack__), got {type(x).__module__}.{type(x).__qualname__}")


def _describe(lib, dev):
    return f"a {lib} array on {'cpu' if dev == 'cpu' else f'cuda:{dev}'}"


class _StreamHandle:
    """An object speaking the CUDA stream protocol (for cupy.cuda.Stream.from_external)."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return 0, self.ptr


def _external_stream(cupy, ptr, device):
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:                   # CuPy >= 14
        return from_external(_StreamHandle(ptr))
    return cupy.cuda.ExternalStream(ptr, device)


class Bridge:
    """The library and device of a call's arrays, with the conversions in and out."""

    def __init__(self, fn, args):
        first = None
        for name, x in args.items():
            if x is None:
                continue
            w = _where(fn, name, x)
            if first is None:
                first = (name, w)
            elif w != first[1]:
                raise ValueError(f"{fn}: all arrays must come from one library on one device; "
                                 f"{first[0]} is {_describe(*first[1])}, {name} is {_describe(*w)}")
        self.lib, self.device = first[1] if first else ("numpy", "cpu")
        self.gpu = self.device != "cpu"
        self._stream = None
        if self.lib == "torch" and self.gpu:
            import torch
            self._stream = torch.cuda.current_stream(self.device).cuda_stream

    def context(self):
        """Device (and for PyTorch, stream) context in which kernels are launched."""
        if not self.gpu:
            return contextlib.nullcontext()
        import cupy
        stack = contextlib.ExitStack()
        stack.enter_context(cupy.cuda.Device(self.device))
        if self._stream is not None:
            stack.enter_context(_external_stream(cupy, self._stream, self.device))
        return stack

    def native(self, x):
        """x as a NumPy (CPU) or CuPy (GPU) array, without copying. Call inside context()."""
        if x is None or self.lib in ("numpy", "cupy"):
            return x
        if self.gpu:
            import cupy
            return cupy.from_dlpack(x)
        if "bfloat16" in str(getattr(x, "dtype", "")):
            return _cpu_bfloat16(self.lib, x)
        return np.from_dlpack(x)

    def back(self, y):
        """A result as the caller's array type. Call inside context()."""
        if y is None or self.lib in ("numpy", "cupy"):
            return y
        cpu_bf16 = not self.gpu and y.dtype.name == "bfloat16"     # (DLPack has none for NumPy)
        if self.lib == "torch":
            import torch
            if cpu_bf16:                    # the same memory, as int16 then bfloat16
                return torch.from_numpy(np.ascontiguousarray(y).view(np.int16)).view(torch.bfloat16)
            return torch.from_dlpack(y)
        if self.lib == "jax":
            import jax.dlpack
            import jax.numpy as jnp
            return jnp.asarray(y) if cpu_bf16 else jax.dlpack.from_dlpack(y)
        import importlib
        from_dlpack = getattr(importlib.import_module(self.lib), "from_dlpack", None)
        return from_dlpack(y) if from_dlpack is not None else y


def _cpu_bfloat16(lib, x):
    """A framework's CPU bfloat16 array as NumPy's (ml_dtypes) bfloat16, which NumPy's DLPack
    import does not take: a torch tensor through an int16 view of the same memory, others
    (JAX) through __array__."""
    import ml_dtypes
    if lib == "torch":
        import torch
        return np.from_dlpack(x.view(torch.int16)).view(ml_dtypes.bfloat16)
    return np.asarray(x)


def host_array(x):
    """A NumPy copy of a CuPy array (one device sync), or a NumPy array as it is."""
    return x.get() if hasattr(x, "get") else np.asarray(x)


DRIVER_LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


def driver_installed():
    """Whether the NVIDIA driver's library (DRIVER_LIBRARY) loads on this machine."""
    import ctypes
    try:
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        return False
    return True


def gpu_available():
    """(True, description) where CuPy can run kernels on a GPU, else (False, why not). Without
    an NVIDIA driver at all, CUDA's own error reads "CUDA driver version is insufficient", which
    would send a user to upgrade a driver they do not have: that case is named as what it is."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - any import failure means no GPU path
        return False, f"CuPy does not import ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        if not driver_installed():
            return False, f"no NVIDIA driver found: {DRIVER_LIBRARY} is not installed, so no GPU here"
        return False, f"no usable CUDA driver or device ({type(e).__name__}: {e})"
    if n < 1:
        return False, "no CUDA device"
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return True, name.decode() if isinstance(name, bytes) else str(name)
