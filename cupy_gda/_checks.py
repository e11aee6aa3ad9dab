"""Argument checks shared by every path. They read shapes and dtypes only (NumPy and CuPy arrays
alike), so they cost no device work; the two checks that must read index data are separate."""
import numbers
from typing import NamedTuple

import numpy as np

MAX_DIM = 256                       # largest K the CUDA kernels are compiled for (V: any, in tiles)
GPU_DTYPES = ("float32", "float16", "bfloat16")
CPU_DTYPES = GPU_DTYPES + ("float64",)
INDEX_DTYPES = ("int32", "int64")


class Problem(NamedTuple):
    B: int
    T: int
    H: int
    K: int
    V: int
    N: int                  # number of sequences (B, or len(cu_seqlens) - 1)
    dtype: str              # q, k, v dtype name
    g_dtype: str            # gate / log_gate dtype name
    log_gate: bool

    @property
    def cpu_dtype(self):
        """Math dtype of the CPU paths: float64 for float64 inputs, else float32."""
        return np.dtype(np.float64 if self.dtype == "float64" else np.float32)


def _shape(fn, name, x, legend, want):
    got = tuple(x.shape)
    if got != tuple(want):
        raise ValueError(f"{fn}: {name} must have shape {legend} = {tuple(want)}, got {got}")


def _rank(fn, name, x, legend):
    nd = legend.count(",") + 1
    if x.ndim != nd:
        raise ValueError(f"{fn}: {name} must be {nd}-D {legend}, got shape {tuple(x.shape)}")


def _dtypes(fn, q, k, v, gate_name, g, cpu):
    allowed = CPU_DTYPES if cpu else GPU_DTYPES
    dt = q.dtype.name
    if dt not in allowed:
        where = "" if cpu else " on the GPU"
        raise TypeError(f"{fn}: q must have dtype {' or '.join(allowed)}{where}, got {dt}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype.name != dt:
            raise TypeError(f"{fn}: {name} must have q's dtype {dt}, got {x.dtype.name}")
    if g.dtype.name not in ("float32", dt):
        raise TypeError(f"{fn}: {gate_name} must have dtype float32 or q's dtype {dt}, "
                        f"got {g.dtype.name}")
    return dt


def _gate(fn, gate, log_gate):
    if (gate is None) == (log_gate is None):
        got = "both" if gate is not None else "neither"
        raise ValueError(f"{fn}: give exactly one of gate (multiplicative) or log_gate "
                         f"(log-space, as fla's g), got {got}")
    return ("gate", gate) if gate is not None else ("log_gate", log_gate)


def _dims(fn, K, V, cpu):
    for name, d, top in (("K", K, None if cpu else MAX_DIM), ("V", V, None)):
        if d < 1 or (top is not None and d > top):
            limit = "at least 1" if top is None else f"between 1 and {top} on the GPU"
            raise ValueError(f"{fn}: head dimension {name} must be {limit}, got {d}")


def _state(fn, name, x, want, cpu):
    _rank(fn, name, x, "[N, H, K, V]")
    _shape(fn, name, x, "[N, H, K, V]", want)
    ok = ("float32", "float64") if cpu else ("float32",)
    if x.dtype.name not in ok:
        raise TypeError(f"{fn}: {name} must have dtype {' or '.join(ok)}, got {x.dtype.name}")


def _index(fn, name, x, legend):
    if x.ndim != 1:
        raise ValueError(f"{fn}: {name} must be 1-D {legend}, got shape {tuple(x.shape)}")
    if x.dtype.name not in INDEX_DTYPES:
        raise TypeError(f"{fn}: {name} must have dtype int32 or int64, got {x.dtype.name}")


def check_scale(fn, scale):
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{fn}: scale must be a real number, got {type(scale).__name__}")
    return float(scale)


def _required(fn, **arrays):
    for name, x in arrays.items():
        if x is None:
            raise TypeError(f"{fn}: {name} must be an array (NumPy, CuPy, or a CUDA or CPU array "
                            f"that exports __dlpack__), got None")


def check_writeable(fn, name, x):
    if not getattr(x.flags, "writeable", True):         # CuPy arrays are always writeable
        raise ValueError(f"{fn}: {name} must be writeable (it receives results), got a read-only array")


def _byte_range(x):
    """[first, last] byte addresses an array's elements occupy (NumPy or CuPy), or None if empty."""
    if x.size == 0:
        return None
    start = x.data.ptr if hasattr(x.data, "ptr") else x.__array_interface__["data"][0]
    span = [s * (n - 1) for s, n in zip(x.strides, x.shape)]
    return (start + sum(d for d in span if d < 0),
            start + sum(d for d in span if d > 0) + x.itemsize - 1)


def check_no_overlap(fn, name, x, other_name, other):
    """``x`` (written by the call) and ``other`` (read or written by it) share no memory, by
    the address ranges they span (so two interleaved views count as overlapping too)."""
    if x is None or other is None:
        return
    a, b = _byte_range(x), _byte_range(other)
    if a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]:
        raise ValueError(f"{fn}: {name} must not overlap {other_name} in memory (both are "
                         f"written by the call), got arrays that share bytes")


def check_forward(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens, cpu):
    """Shapes and dtypes of a gated_attention call. Returns a Problem."""
    _required(fn, q=q, k=k, v=v)
    gate_name, g = _gate(fn, gate, log_gate)
    _rank(fn, "q", q, "[B, T, H, K]")
    B, T, H, K = q.shape
    _shape(fn, "k", k, "[B, T, H, K]", q.shape)
    _shape(fn, gate_name, g, "[B, T, H, K]", q.shape)
    _rank(fn, "v", v, "[B, T, H, V]")
    V = v.shape[3]
    _shape(fn, "v", v, "[B, T, H, V]", (B, T, H, V))
    _dims(fn, K, V, cpu)
    dt = _dtypes(fn, q, k, v, gate_name, g, cpu)
    N = B
    if cu_seqlens is not None:
        _index(fn, "cu_seqlens", cu_seqlens, "[N + 1]")
        if cu_seqlens.shape[0] < 2:
            raise ValueError(f"{fn}: cu_seqlens must hold at least 2 offsets [0, ..., T], "
                             f"got shape {tuple(cu_seqlens.shape)}")
        if B != 1:
            raise ValueError(f"{fn}: with cu_seqlens the batch size B must be 1 "
                             f"(sequences packed along T), got B = {B}")
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        _state(fn, "initial_state", initial_state, (N, H, K, V), cpu)
    return Problem(B, T, H, K, V, N, dt, g.dtype.name, log_gate is not None)


def check_backward(fn, q, k, v, gate, log_gate, do, initial_state, d_final_state, cu_seqlens, cpu):
    """Shapes and dtypes of a gated_attention_backward call: the forward's, and do (o's
    gradient: v's shape and dtype) and d_final_state (the final state's: [N, H, K, V]).
    Returns a Problem."""
    p = check_forward(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens, cpu)
    _required(fn, do=do)
    _rank(fn, "do", do, "[B, T, H, V]")
    _shape(fn, "do", do, "[B, T, H, V]", (p.B, p.T, p.H, p.V))
    if do.dtype.name != p.dtype:
        raise TypeError(f"{fn}: do must have q's dtype {p.dtype}, got {do.dtype.name}")
    if d_final_state is not None:
        _state(fn, "d_final_state", d_final_state, (p.N, p.H, p.K, p.V), cpu)
    return p


def check_step(fn, q, k, v, gate, log_gate, state, state_indices, cpu):
    """Shapes and dtypes of a gated_attention_step call. Returns a Problem with T = 1."""
    _required(fn, q=q, k=k, v=v)
    gate_name, g = _gate(fn, gate, log_gate)
    _rank(fn, "q", q, "[B, H, K]")
    B, H, K = q.shape
    _shape(fn, "k", k, "[B, H, K]", q.shape)
    _shape(fn, gate_name, g, "[B, H, K]", q.shape)
    _rank(fn, "v", v, "[B, H, V]")
    V = v.shape[2]
    _shape(fn, "v", v, "[B, H, V]", (B, H, V))
    _dims(fn, K, V, cpu)
    dt = _dtypes(fn, q, k, v, gate_name, g, cpu)
    if state is None:
        raise ValueError(f"{fn}: state [N, H, K, V] float32 is required (it is updated in place)")
    _rank(fn, "state", state, "[N, H, K, V]")
    N = state.shape[0]
    _state(fn, "state", state, (N, H, K, V), cpu)
    if state_indices is not None:
        _index(fn, "state_indices", state_indices, "[B]")
        _shape(fn, "state_indices", state_indices, "[B]", (B,))
    elif B > N:
        raise ValueError(f"{fn}: without state_indices, state needs at least B = {B} rows, "
                         f"got N = {N}")
    return Problem(B, 1, H, K, V, N, dt, g.dtype.name, log_gate is not None)


def check_cu_seqlens_values(fn, cu, T):
    """cu: host (NumPy) copy of cu_seqlens."""
    if cu[0] != 0:
        raise ValueError(f"{fn}: cu_seqlens must start at 0, got {int(cu[0])}")
    if np.any(np.diff(cu) < 0):
        i = int(np.argmax(np.diff(cu) < 0))
        raise ValueError(f"{fn}: cu_seqlens must be non-decreasing, got {int(cu[i])} then "
                         f"{int(cu[i + 1])} at positions {i}, {i + 1}")
    if cu[-1] != T:
        raise ValueError(f"{fn}: cu_seqlens must end at T = {T}, got {int(cu[-1])}")


def check_state_indices_values(fn, idx, N):
    """idx: host (NumPy) copy of state_indices."""
    bad = (idx < 0) | (idx >= N)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(f"{fn}: state_indices must lie in [0, N) = [0, {N}), "
                         f"got {int(idx[i])} at position {i}")
    uniq, counts = np.unique(idx, return_counts=True)
    if np.any(counts > 1):
        raise ValueError(f"{fn}: state_indices must not repeat (each state row is updated once), "
                         f"got {int(uniq[np.argmax(counts > 1)])} more than once")
