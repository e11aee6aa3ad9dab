"""Bad input: a clear error before anything runs, and nothing the caller owns modified.

Each row calls the public API with one thing wrong and asserts
- the exception type and the message: ``"<fn>: <argument> <expected> ... <received>"``;
- that no compute path was entered: the GPU launch plans (``recurrent.plan``, ``chunk.plan``,
  ``step.plan``, ``_compile.get_function``) and the CPU paths (``reference.*``) are replaced by
  traps;
- that every array the caller passed (inputs, state, a NaN-poisoned ``out``, the whole buffer
  behind a strided view) is byte-for-byte what it was, and ``out`` still all NaN.

Rows run on NumPy and, where a GPU is, on CuPy. Inputs valid on NumPy but not on the GPU
(float64, K or V above 256, method="chunk", a non-contiguous out) have their own tables, checked
both ways; mixing NumPy with CuPy needs a GPU.
"""
import copy
import re

import numpy as np
import pytest
from conftest import to_backend

import cupy_gda
from cupy_gda import _compile, chunk, recurrent, reference, step

B, T, H, K, V = 2, 5, 2, 4, 3
N = 3                       # state rows of the step calls (> B, so state_indices matter)
F32 = np.float32
FWD, STEP = "gated_attention", "gated_attention_step"
NOT_ARRAY = "must be an array (NumPy, CuPy, or a CUDA or CPU array that exports __dlpack__)"
ONE_LIB = "all arrays must come from one library on one device"
ONE_GATE = "give exactly one of gate (multiplicative) or log_gate (log-space, as fla's g)"
CPU_DT = "float32 or float16 or bfloat16 or float64"
GPU_DT = "float32 or float16 or bfloat16 on the GPU"


# ---------------------------------------------------------------------------------------------
# inputs


def _rand(*shape, dtype=F32):
    return np.random.default_rng(sum(shape) + len(shape)).standard_normal(shape).astype(dtype)


def _full(fill, *shape, dtype=F32):
    return np.full(shape, fill, dtype)


def _forward_args():
    return dict(q=_rand(B, T, H, K), k=_rand(B, T, H, K) * 0.5, v=_rand(B, T, H, V),
                gate=np.random.default_rng(1).uniform(0.5, 1, (B, T, H, K)).astype(F32),
                initial_state=_rand(B, H, K, V), out=_full(np.nan, B, T, H, V),
                output_final_state=True)


def _step_args():
    return dict(q=_rand(B, H, K), k=_rand(B, H, K) * 0.5, v=_rand(B, H, V),
                gate=np.random.default_rng(2).uniform(0.5, 1, (B, H, K)).astype(F32),
                state=_rand(N, H, K, V), state_indices=np.array([2, 0], np.int64),
                out=_full(np.nan, B, H, V))


def _packed(a, cu, batch=1, rows=None, dtype=np.int32):
    """Forward args packed for cu_seqlens (B = 1); the state has len(cu) - 1 rows unless given."""
    n = len(cu) - 1 if rows is None else rows
    return dict(q=a["q"][:batch], k=a["k"][:batch], v=a["v"][:batch], gate=a["gate"][:batch],
                out=a["out"][:batch], initial_state=_rand(max(n, 0), H, K, V),
                cu_seqlens=np.array(cu, dtype))


def _as(dtype, *names):
    """Edit: the named arrays cast to dtype."""
    return lambda a: {n: a[n].astype(dtype) for n in names}


class _Keep:
    """An argument passed as it is (a NumPy array stays NumPy on the CuPy backend)."""
    def __init__(self, x):
        self.x = x


class _Strided:
    """A non-contiguous view parent[index], made on the backend; the caller owns all of parent."""
    def __init__(self, parent, index):
        self.parent, self.index = parent, index


class _Fortran:
    """x in Fortran (column-major) order on the backend."""
    def __init__(self, x):
        self.x = x


class _OtherCPUArray:
    """A CPU array of some library other than NumPy: it exports DLPack and nothing else."""
    def __init__(self, a):
        self._a = np.ascontiguousarray(a)

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class _ROCmArray:
    """Exports DLPack from a device that is neither CUDA nor the CPU (kDLROCM = 10)."""
    def __dlpack__(self, **kwargs):
        raise AssertionError("the data of an unsupported device must not be read")

    def __dlpack_device__(self):
        return (10, 0)


OTHER = _OtherCPUArray.__module__.split(".")[0]       # the library name the API reports for it


def _materialize(args, backend):
    """(call kwargs, owned): NumPy arrays moved to the backend, and every array the caller owns
    (a strided view also contributes its whole parent buffer)."""
    call, owned = {}, {}
    for name, x in args.items():
        if isinstance(x, _Keep):
            x = x.x
        elif isinstance(x, _Strided):
            parent = to_backend(x.parent, backend)
            owned[f"{name} (whole buffer)"] = parent
            x = parent[x.index]
        elif isinstance(x, _Fortran):
            x = to_backend(x.x, backend)
            x = np.asfortranarray(x) if backend == "numpy" else _cupy().asfortranarray(x)
        elif isinstance(x, np.ndarray):
            x = to_backend(x, backend)
        call[name] = x
        owned[name] = x
    return call, owned


def _cupy():
    import cupy
    return cupy


def _host(x):
    """A host copy of an array the caller passed, or None for what holds no data of its own."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if type(x).__module__.split(".")[0] == "cupy":
        return x.get()
    if isinstance(x, _OtherCPUArray):
        return np.array(x._a)
    if isinstance(x, (list, tuple)):
        return copy.deepcopy(x)
    return None


def _snapshot(owned):
    return {name: _host(x) for name, x in owned.items()}


def _assert_untouched(owned, before):
    for name, was in before.items():
        if was is None:
            continue
        now = _host(owned[name])
        if isinstance(was, np.ndarray):
            assert (now.dtype, now.shape) == (was.dtype, was.shape), name
            assert now.tobytes() == was.tobytes(), f"{name} was modified by a call that raised"
            if name.startswith("out") and was.dtype.kind == "f":
                assert np.isnan(now).all(), f"{name} is no longer all NaN"
        else:
            assert now == was, f"{name} was modified by a call that raised"


def _forbid_compute(monkeypatch):
    """Replace every compute entry point by a trap; returns the list of trapped calls."""
    calls = []

    def trap(name):
        def run(*args, **kwargs):
            calls.append(name)
            pytest.fail(f"{name} ran although the arguments are invalid")
        return run

    for mod, name in ((recurrent, "plan"), (chunk, "plan"), (step, "plan"), (_compile, "get_function"),
                      (reference, "gated_attention_ref"), (reference, "gated_attention_chunked"),
                      (reference, "gated_attention_step_ref")):
        monkeypatch.setattr(mod, name, trap(f"{mod.__name__}.{name}"))
    return calls


def _pattern(fn, msg, backend):
    """The message regex: '^fn: ' then the literal parts of msg, in order."""
    parts = msg[backend] if isinstance(msg, dict) else msg
    return "^" + re.escape(f"{fn}: ") + ".*".join(re.escape(p) for p in parts)


def _check_raises(api, fn, base, edit, exc, msg, backend, monkeypatch):
    args = {**base, **edit(base)}
    call, owned = _materialize(args, backend)
    before = _snapshot(owned)
    calls = _forbid_compute(monkeypatch)
    with pytest.raises(exc, match=_pattern(fn, msg, backend)):
        api(**call)
    assert calls == []
    _assert_untouched(owned, before)


# ---------------------------------------------------------------------------------------------
# gated_attention

FORWARD_ERRORS = [
    # rank and shape
    pytest.param(lambda a: dict(q=a["q"][0]), ValueError,
                 ("q must be 4-D [B, T, H, K]", "got shape (5, 2, 4)"), id="q-rank3"),
    pytest.param(lambda a: dict(q=a["q"][None]), ValueError,
                 ("q must be 4-D [B, T, H, K]", "got shape (1, 2, 5, 2, 4)"), id="q-rank5"),
    pytest.param(lambda a: dict(k=a["k"][:, :4]), ValueError,
                 ("k must have shape [B, T, H, K] = (2, 5, 2, 4)", "got (2, 4, 2, 4)"), id="k-T4-vs-T5"),
    pytest.param(lambda a: dict(k=_rand(B, T, H, 5)), ValueError,
                 ("k must have shape [B, T, H, K] = (2, 5, 2, 4)", "got (2, 5, 2, 5)"), id="k-K5-vs-q-K4"),
    pytest.param(lambda a: dict(k=a["k"][0]), ValueError,
                 ("k must have shape [B, T, H, K] = (2, 5, 2, 4)", "got (5, 2, 4)"), id="k-rank3"),
    pytest.param(lambda a: dict(gate=a["gate"][:, :, :1]), ValueError,
                 ("gate must have shape [B, T, H, K] = (2, 5, 2, 4)", "got (2, 5, 1, 4)"), id="gate-H1"),
    pytest.param(lambda a: dict(gate=None, log_gate=np.log(a["gate"][..., :3])), ValueError,
                 ("log_gate must have shape [B, T, H, K] = (2, 5, 2, 4)", "got (2, 5, 2, 3)"),
                 id="log_gate-K3"),
    pytest.param(lambda a: dict(v=a["v"][0]), ValueError,
                 ("v must be 4-D [B, T, H, V]", "got shape (5, 2, 3)"), id="v-rank3"),
    pytest.param(lambda a: dict(v=a["v"][:1]), ValueError,
                 ("v must have shape [B, T, H, V] = (2, 5, 2, 3)", "got (1, 5, 2, 3)"), id="v-B1-vs-B2"),
    pytest.param(lambda a: dict(v=a["v"][:, :, :1]), ValueError,
                 ("v must have shape [B, T, H, V] = (2, 5, 2, 3)", "got (2, 5, 1, 3)"),
                 id="v-H1-vs-H2"),
    pytest.param(lambda a: dict(initial_state=a["initial_state"][0]), ValueError,
                 ("initial_state must be 4-D [N, H, K, V]", "got shape (2, 4, 3)"), id="state-rank3"),
    pytest.param(lambda a: dict(initial_state=a["initial_state"][:1]), ValueError,
                 ("initial_state must have shape [N, H, K, V] = (2, 2, 4, 3)", "got (1, 2, 4, 3)"),
                 id="state-N1-vs-B2"),
    pytest.param(lambda a: dict(initial_state=_rand(B, H, 5, V)), ValueError,
                 ("initial_state must have shape [N, H, K, V] = (2, 2, 4, 3)", "got (2, 2, 5, 3)"),
                 id="state-K5-vs-K4"),
    pytest.param(lambda a: dict(initial_state=_rand(B, H, K, 4)), ValueError,
                 ("initial_state must have shape [N, H, K, V] = (2, 2, 4, 3)", "got (2, 2, 4, 4)"),
                 id="state-V4-vs-V3"),
    pytest.param(lambda a: dict(q=a["q"][..., :0], k=a["k"][..., :0], gate=a["gate"][..., :0]), ValueError,
                 {"numpy": ("head dimension K must be at least 1", "got 0"),
                  "cupy": ("head dimension K must be between 1 and 256", "got 0")}, id="K0"),
    pytest.param(lambda a: dict(v=a["v"][..., :0], initial_state=a["initial_state"][..., :0],
                                out=a["out"][..., :0]), ValueError,
                 {"numpy": ("head dimension V must be at least 1", "got 0"),
                  "cupy": ("head dimension V must be at least 1", "got 0")}, id="V0"),
    # dtypes
    pytest.param(_as(np.int32, "q"), TypeError,
                 {"numpy": (f"q must have dtype {CPU_DT}", "got int32"),
                  "cupy": (f"q must have dtype {GPU_DT}", "got int32")}, id="q-int32"),
    pytest.param(_as(np.int64, "q", "k", "v"), TypeError,
                 {"numpy": (f"q must have dtype {CPU_DT}", "got int64"),
                  "cupy": (f"q must have dtype {GPU_DT}", "got int64")}, id="qkv-int64"),
    pytest.param(_as(np.complex64, "q"), TypeError,
                 {"numpy": (f"q must have dtype {CPU_DT}", "got complex64"),
                  "cupy": (f"q must have dtype {GPU_DT}", "got complex64")}, id="q-complex64"),
    pytest.param(_as(np.complex128, "q", "k", "v", "gate"), TypeError,
                 {"numpy": (f"q must have dtype {CPU_DT}", "got complex128"),
                  "cupy": (f"q must have dtype {GPU_DT}", "got complex128")}, id="all-complex128"),
    pytest.param(_as(np.float16, "k"), TypeError,
                 ("k must have q's dtype float32", "got float16"), id="k-float16-vs-q-float32"),
    pytest.param(_as(np.float16, "q"), TypeError,
                 ("k must have q's dtype float16", "got float32"), id="q-float16-vs-k-float32"),
    pytest.param(_as(np.int32, "v"), TypeError,
                 ("v must have q's dtype float32", "got int32"), id="v-int32"),
    pytest.param(_as(np.complex64, "v"), TypeError,
                 ("v must have q's dtype float32", "got complex64"), id="v-complex64"),
    pytest.param(_as(np.int32, "gate"), TypeError,
                 ("gate must have dtype float32 or q's dtype float32", "got int32"), id="gate-int32"),
    pytest.param(_as(np.float64, "gate"), TypeError,
                 ("gate must have dtype float32 or q's dtype float32", "got float64"),
                 id="gate-float64-vs-q-float32"),
    pytest.param(_as(np.float16, "gate"), TypeError,
                 ("gate must have dtype float32 or q's dtype float32", "got float16"),
                 id="gate-float16-vs-q-float32"),
    pytest.param(lambda a: dict(gate=None, log_gate=np.log(a["gate"]).astype(np.complex64)), TypeError,
                 ("log_gate must have dtype float32 or q's dtype float32", "got complex64"),
                 id="log_gate-complex64"),
    pytest.param(_as(np.float16, "initial_state"), TypeError,
                 {"numpy": ("initial_state must have dtype float32 or float64", "got float16"),
                  "cupy": ("initial_state must have dtype float32", "got float16")}, id="state-float16"),
    pytest.param(_as(np.int32, "initial_state"), TypeError,
                 {"numpy": ("initial_state must have dtype float32 or float64", "got int32"),
                  "cupy": ("initial_state must have dtype float32", "got int32")}, id="state-int32"),
    pytest.param(_as(np.complex64, "initial_state"), TypeError,
                 {"numpy": ("initial_state must have dtype float32 or float64", "got complex64"),
                  "cupy": ("initial_state must have dtype float32", "got complex64")},
                 id="state-complex64"),
    # gate / log_gate
    pytest.param(lambda a: dict(log_gate=np.log(a["gate"])), ValueError, (ONE_GATE, "got both"),
                 id="gate-and-log_gate"),
    pytest.param(lambda a: dict(gate=None), ValueError, (ONE_GATE, "got neither"), id="no-gate"),
    # cu_seqlens
    pytest.param(lambda a: _packed(a, [1, 3, 5]), ValueError,
                 ("cu_seqlens must start at 0", "got 1"), id="cu-starts-at-1"),
    pytest.param(lambda a: _packed(a, [0, 4, 2, 5]), ValueError,
                 ("cu_seqlens must be non-decreasing", "got 4 then 2 at positions 1, 2"),
                 id="cu-decreasing"),
    pytest.param(lambda a: _packed(a, [0, -1, 5], dtype=np.int64), ValueError,
                 ("cu_seqlens must be non-decreasing", "got 0 then -1 at positions 0, 1"),
                 id="cu-negative-int64"),
    pytest.param(lambda a: _packed(a, [0, 2, 4]), ValueError,
                 ("cu_seqlens must end at T = 5", "got 4"), id="cu-ends-at-4-of-T5"),
    pytest.param(lambda a: _packed(a, [0, 2, 6]), ValueError,
                 ("cu_seqlens must end at T = 5", "got 6"), id="cu-ends-at-6-of-T5"),
    pytest.param(lambda a: _packed(a, [0, 2, 5], batch=2), ValueError,
                 ("with cu_seqlens the batch size B must be 1", "got B = 2"), id="cu-with-B2"),
    pytest.param(lambda a: {**_packed(a, [0, 2, 5]), "cu_seqlens": np.array([[0, 2, 5]], np.int32)},
                 ValueError, ("cu_seqlens must be 1-D [N + 1]", "got shape (1, 3)"), id="cu-2d"),
    pytest.param(lambda a: _packed(a, [0], rows=1), ValueError,
                 ("cu_seqlens must hold at least 2 offsets [0, ..., T]", "got shape (1,)"),
                 id="cu-one-offset"),
    pytest.param(lambda a: _packed(a, [0, 2, 5], dtype=np.float32), TypeError,
                 ("cu_seqlens must have dtype int32 or int64", "got float32"), id="cu-float32"),
    pytest.param(lambda a: _packed(a, [0, 2, 5], dtype=np.uint32), TypeError,
                 ("cu_seqlens must have dtype int32 or int64", "got uint32"), id="cu-uint32"),
    pytest.param(lambda a: _packed(a, [0, 2, 5], rows=3), ValueError,
                 ("initial_state must have shape [N, H, K, V] = (2, 2, 4, 3)", "got (3, 2, 4, 3)"),
                 id="cu-N2-state-N3"),
    pytest.param(lambda a: {**_packed(a, [0, 2, 5]), "cu_seqlens": [0, 2, 5]}, TypeError,
                 ("cu_seqlens " + NOT_ARRAY, "got builtins.list"), id="cu-list"),
    # method
    pytest.param(lambda a: dict(method="fused"), ValueError,
                 ("method must be one of 'auto', 'recurrent', 'chunk'", "got 'fused'"), id="method-fused"),
    pytest.param(lambda a: dict(method="Recurrent"), ValueError,
                 ("method must be one of 'auto', 'recurrent', 'chunk'", "got 'Recurrent'"),
                 id="method-wrong-case"),
    pytest.param(lambda a: dict(method=None), ValueError,
                 ("method must be one of 'auto', 'recurrent', 'chunk'", "got None"), id="method-None"),
    pytest.param(lambda a: dict(method=["recurrent"]), ValueError,
                 ("method must be one of 'auto', 'recurrent', 'chunk'", "got ['recurrent']"),
                 id="method-list"),
    # scale
    pytest.param(lambda a: dict(scale=0.5j), TypeError, ("scale must be a real number", "got complex"),
                 id="scale-complex"),
    pytest.param(lambda a: dict(scale=np.complex64(0.5)), TypeError,
                 ("scale must be a real number", "got complex64"), id="scale-numpy-complex64"),
    pytest.param(lambda a: dict(scale="0.5"), TypeError, ("scale must be a real number", "got str"),
                 id="scale-str"),
    pytest.param(lambda a: dict(scale=None), TypeError, ("scale must be a real number", "got NoneType"),
                 id="scale-None"),
    pytest.param(lambda a: dict(scale=True), TypeError, ("scale must be a real number", "got bool"),
                 id="scale-bool"),
    # not arrays
    pytest.param(lambda a: dict(q=a["q"].tolist()), TypeError, ("q " + NOT_ARRAY, "got builtins.list"),
                 id="q-list"),
    pytest.param(lambda a: dict(k=tuple(a["k"].tolist())), TypeError,
                 ("k " + NOT_ARRAY, "got builtins.tuple"), id="k-tuple"),
    pytest.param(lambda a: dict(v=a["v"].tolist()), TypeError, ("v " + NOT_ARRAY, "got builtins.list"),
                 id="v-list"),
    pytest.param(lambda a: dict(gate=0.9), TypeError, ("gate " + NOT_ARRAY, "got builtins.float"),
                 id="gate-float"),
    pytest.param(lambda a: dict(gate=None, log_gate=np.log(a["gate"]).tolist()), TypeError,
                 ("log_gate " + NOT_ARRAY, "got builtins.list"), id="log_gate-list"),
    pytest.param(lambda a: dict(initial_state=a["initial_state"].tolist()), TypeError,
                 ("initial_state " + NOT_ARRAY, "got builtins.list"), id="state-list"),
    pytest.param(lambda a: dict(out=a["out"].tolist()), TypeError, ("out " + NOT_ARRAY, "got builtins.list"),
                 id="out-list"),
    pytest.param(lambda a: dict(q=np.float32(1.0)), TypeError, ("q " + NOT_ARRAY, "got numpy.float32"),
                 id="q-numpy-scalar"),
    pytest.param(lambda a: dict(q=_ROCmArray()), TypeError,
                 ("q " + NOT_ARRAY, "got ", "_ROCmArray"), id="q-dlpack-from-rocm"),
    pytest.param(lambda a: dict(q=None), TypeError, ("q " + NOT_ARRAY, "None"), id="q-None"),
    pytest.param(lambda a: dict(v=None), TypeError, ("v " + NOT_ARRAY, "None"), id="v-None"),
    # out
    pytest.param(lambda a: dict(out=_full(np.nan, B, T, H, 4)), ValueError,
                 ("out must have shape [B, T, H, V] = (2, 5, 2, 3)", "got (2, 5, 2, 4)"), id="out-V4-vs-V3"),
    pytest.param(lambda a: dict(out=_full(np.nan, B, T, H * V)), ValueError,
                 ("out must have shape [B, T, H, V] = (2, 5, 2, 3)", "got (2, 5, 6)"), id="out-rank3"),
    pytest.param(lambda a: dict(out=_full(np.nan, B, 1, H, V)), ValueError,
                 ("out must have shape [B, T, H, V] = (2, 5, 2, 3)", "got (2, 1, 2, 3)"), id="out-T1"),
    pytest.param(lambda a: dict(out=_full(np.nan, B, T, H, V, dtype=np.float16)), TypeError,
                 ("out must have v's dtype float32", "got float16"), id="out-float16"),
    pytest.param(lambda a: dict(out=_full(np.nan, B, T, H, V, dtype=np.float64)), TypeError,
                 ("out must have v's dtype float32", "got float64"), id="out-float64"),
    pytest.param(lambda a: dict(out=_full(-7, B, T, H, V, dtype=np.int32)), TypeError,
                 ("out must have v's dtype float32", "got int32"), id="out-int32"),
    # another library's array (CPU, through DLPack) among the backend's
    pytest.param(lambda a: dict(k=_OtherCPUArray(a["k"])), ValueError,
                 {"numpy": (ONE_LIB, f"q is a numpy array on cpu, k is a {OTHER} array on cpu"),
                  "cupy": (ONE_LIB, f"q is a cupy array on cuda:0, k is a {OTHER} array on cpu")},
                 id="k-other-cpu-library"),
    pytest.param(lambda a: dict(out=_OtherCPUArray(a["out"])), ValueError,
                 {"numpy": (ONE_LIB, f"q is a numpy array on cpu, out is a {OTHER} array on cpu"),
                  "cupy": (ONE_LIB, f"q is a cupy array on cuda:0, out is a {OTHER} array on cpu")},
                 id="out-other-cpu-library"),
]


@pytest.mark.parametrize("edit, exc, msg", FORWARD_ERRORS)
def test_forward_rejects(edit, exc, msg, backend, monkeypatch):
    _check_raises(cupy_gda.gated_attention, FWD, _forward_args(), edit, exc, msg, backend, monkeypatch)


# valid on NumPy, an error on the GPU
FORWARD_GPU_ONLY = [
    pytest.param(lambda a: {**_as(np.float64, "q", "k", "v")(a),
                            "out": _full(np.nan, B, T, H, V, dtype=np.float64)},
                 TypeError, (f"q must have dtype {GPU_DT}", "got float64"), id="qkv-float64"),
    pytest.param(_as(np.float64, "initial_state"), TypeError,
                 ("initial_state must have dtype float32", "got float64"), id="state-float64"),
    pytest.param(lambda a: dict(q=_rand(B, T, H, 300), k=_rand(B, T, H, 300) * 0.05,
                                gate=_full(0.9, B, T, H, 300), initial_state=_rand(B, H, 300, V)),
                 ValueError, ("head dimension K must be between 1 and 256", "got 300"), id="K300"),
    pytest.param(lambda a: dict(out=_Strided(_full(np.nan, B, T, H, 2 * V), np.s_[..., ::2])), ValueError,
                 ("out must be C-contiguous",), id="out-strided"),
]


@pytest.mark.parametrize("edit, exc, msg", FORWARD_GPU_ONLY)
def test_forward_gpu_only_limits(edit, exc, msg, backend, monkeypatch):
    base = _forward_args()
    if backend == "cupy":
        _check_raises(cupy_gda.gated_attention, FWD, base, edit, exc, msg, backend, monkeypatch)
        return
    call, owned = _materialize({**base, **edit(base)}, backend)
    parent = owned.get("out (whole buffer)")
    o, s = cupy_gda.gated_attention(**call)
    assert o is call["out"] and o.dtype == call["v"].dtype
    want_o, want_s = reference.gated_attention_ref(
        *(call[n] for n in ("q", "k", "v", "gate")), initial_state=call["initial_state"],
        output_final_state=True)
    np.testing.assert_allclose(o, want_o, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s, want_s, rtol=1e-4, atol=1e-5)
    if parent is not None:                    # columns between the strided view's stay untouched
        assert np.isnan(parent[..., 1::2]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("numpy_names, first, second", [
    pytest.param(("q",), "q is a numpy array on cpu", "k is a cupy array on cuda:0", id="numpy-q"),
    pytest.param(("k",), "q is a cupy array on cuda:0", "k is a numpy array on cpu", id="numpy-k"),
    pytest.param(("gate",), "q is a cupy array on cuda:0", "gate is a numpy array on cpu", id="numpy-gate"),
    pytest.param(("initial_state",), "q is a cupy array on cuda:0", "initial_state is a numpy array on cpu",
                 id="numpy-initial_state"),
    pytest.param(("out",), "q is a cupy array on cuda:0", "out is a numpy array on cpu", id="numpy-out"),
    pytest.param(("q", "k", "v", "gate"), "q is a numpy array on cpu",
                 "initial_state is a cupy array on cuda:0", id="numpy-inputs-cupy-state"),
])
def test_forward_mixed_numpy_cupy(numpy_names, first, second, monkeypatch):
    edit = lambda a: {n: _Keep(a[n]) for n in numpy_names}  # noqa: E731
    _check_raises(cupy_gda.gated_attention, FWD, _forward_args(), edit, ValueError,
                  (ONE_LIB, f"{first}, {second}"), "cupy", monkeypatch)


@pytest.mark.gpu
def test_forward_mixed_numpy_cupy_cu_seqlens(monkeypatch):
    cu = _Keep(np.array([0, 2, 5], np.int32))
    edit = lambda a: {**_packed(a, [0, 2, 5]), "cu_seqlens": cu}  # noqa: E731
    _check_raises(cupy_gda.gated_attention, FWD, _forward_args(), edit, ValueError,
                  (ONE_LIB, "q is a cupy array on cuda:0, cu_seqlens is a numpy array on cpu"),
                  "cupy", monkeypatch)


def _on_device_1(x):
    import cupy
    with cupy.cuda.Device(1):
        return cupy.asarray(x)


@pytest.mark.gpu
def test_forward_arrays_on_two_devices(monkeypatch):
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    edit = lambda a: dict(k=_Keep(_on_device_1(a["k"])))  # noqa: E731
    _check_raises(cupy_gda.gated_attention, FWD, _forward_args(), edit, ValueError,
                  (ONE_LIB, "q is a cupy array on cuda:0, k is a cupy array on cuda:1"), "cupy", monkeypatch)


@pytest.mark.parametrize("edit, msg", [
    pytest.param(lambda a: _packed(a, [1, 3, 5]), ("cu_seqlens must start at 0", "got 1"),
                 id="cu-starts-at-1"),
    pytest.param(lambda a: _packed(a, [0, 2, 4]), ("cu_seqlens must end at T = 5", "got 4"),
                 id="cu-ends-at-4"),
])
def test_forward_cpu_checks_cu_seqlens_even_without_check_indices(edit, msg, monkeypatch):
    """check_indices=False only skips the GPU's device sync; the CPU path always checks."""
    base = _forward_args()
    edit_unchecked = lambda a: {**edit(a), "check_indices": False}  # noqa: E731
    _check_raises(cupy_gda.gated_attention, FWD, base, edit_unchecked, ValueError, msg, "numpy", monkeypatch)


# ---------------------------------------------------------------------------------------------
# gated_attention_step

STEP_ERRORS = [
    # rank and shape
    pytest.param(lambda a: dict(q=a["q"][:, None]), ValueError,
                 ("q must be 3-D [B, H, K]", "got shape (2, 1, 2, 4)"), id="q-rank4"),
    pytest.param(lambda a: dict(q=a["q"][0]), ValueError,
                 ("q must be 3-D [B, H, K]", "got shape (2, 4)"), id="q-rank2"),
    pytest.param(lambda a: dict(k=_rand(B, H, 5)), ValueError,
                 ("k must have shape [B, H, K] = (2, 2, 4)", "got (2, 2, 5)"), id="k-K5-vs-q-K4"),
    pytest.param(lambda a: dict(k=a["k"][:1]), ValueError,
                 ("k must have shape [B, H, K] = (2, 2, 4)", "got (1, 2, 4)"), id="k-B1-vs-B2"),
    pytest.param(lambda a: dict(gate=a["gate"][:, :1]), ValueError,
                 ("gate must have shape [B, H, K] = (2, 2, 4)", "got (2, 1, 4)"), id="gate-H1"),
    pytest.param(lambda a: dict(gate=None, log_gate=np.log(a["gate"][..., :3])), ValueError,
                 ("log_gate must have shape [B, H, K] = (2, 2, 4)", "got (2, 2, 3)"), id="log_gate-K3"),
    pytest.param(lambda a: dict(v=a["v"][:, None]), ValueError,
                 ("v must be 3-D [B, H, V]", "got shape (2, 1, 2, 3)"), id="v-rank4"),
    pytest.param(lambda a: dict(v=a["v"][:1]), ValueError,
                 ("v must have shape [B, H, V] = (2, 2, 3)", "got (1, 2, 3)"), id="v-B1-vs-B2"),
    pytest.param(lambda a: dict(state=a["state"][0]), ValueError,
                 ("state must be 4-D [N, H, K, V]", "got shape (2, 4, 3)"), id="state-rank3"),
    pytest.param(lambda a: dict(state=_rand(N, H, 5, V)), ValueError,
                 ("state must have shape [N, H, K, V] = (3, 2, 4, 3)", "got (3, 2, 5, 3)"),
                 id="state-K5-vs-K4"),
    pytest.param(lambda a: dict(state=_rand(N, H, K, 4)), ValueError,
                 ("state must have shape [N, H, K, V] = (3, 2, 4, 3)", "got (3, 2, 4, 4)"),
                 id="state-V4-vs-V3"),
    pytest.param(lambda a: dict(state=_rand(N, 1, K, V)), ValueError,
                 ("state must have shape [N, H, K, V] = (3, 2, 4, 3)", "got (3, 1, 4, 3)"),
                 id="state-H1-vs-H2"),
    pytest.param(lambda a: dict(state=None), ValueError,
                 ("state [N, H, K, V] float32 is required (it is updated in place)",), id="state-None"),
    pytest.param(lambda a: dict(state=a["state"][:1], state_indices=None), ValueError,
                 ("without state_indices, state needs at least B = 2 rows", "got N = 1"),
                 id="state-1-row-for-B2"),
    pytest.param(lambda a: dict(q=a["q"][..., :0], k=a["k"][..., :0], gate=a["gate"][..., :0]), ValueError,
                 {"numpy": ("head dimension K must be at least 1", "got 0"),
                  "cupy": ("head dimension K must be between 1 and 256", "got 0")}, id="K0"),
    pytest.param(lambda a: dict(v=a["v"][..., :0], state=a["state"][..., :0], out=a["out"][..., :0]),
                 ValueError, {"numpy": ("head dimension V must be at least 1", "got 0"),
                              "cupy": ("head dimension V must be at least 1", "got 0")}, id="V0"),
    # dtypes
    pytest.param(_as(np.int32, "q"), TypeError,
                 {"numpy": (f"q must have dtype {CPU_DT}", "got int32"),
                  "cupy": (f"q must have dtype {GPU_DT}", "got int32")}, id="q-int32"),
    pytest.param(_as(np.complex64, "q", "k", "v"), TypeError,
                 {"numpy": (f"q must have dtype {CPU_DT}", "got complex64"),
                  "cupy": (f"q must have dtype {GPU_DT}", "got complex64")}, id="qkv-complex64"),
    pytest.param(_as(np.float16, "k"), TypeError,
                 ("k must have q's dtype float32", "got float16"), id="k-float16-vs-q-float32"),
    pytest.param(_as(np.int64, "v"), TypeError, ("v must have q's dtype float32", "got int64"), id="v-int64"),
    pytest.param(_as(np.int32, "gate"), TypeError,
                 ("gate must have dtype float32 or q's dtype float32", "got int32"), id="gate-int32"),
    pytest.param(lambda a: dict(gate=None, log_gate=np.log(a["gate"]).astype(np.complex64)), TypeError,
                 ("log_gate must have dtype float32 or q's dtype float32", "got complex64"),
                 id="log_gate-complex64"),
    pytest.param(_as(np.float16, "state"), TypeError,
                 {"numpy": ("state must have dtype float32 or float64", "got float16"),
                  "cupy": ("state must have dtype float32", "got float16")}, id="state-float16"),
    pytest.param(_as(np.int32, "state"), TypeError,
                 {"numpy": ("state must have dtype float32 or float64", "got int32"),
                  "cupy": ("state must have dtype float32", "got int32")}, id="state-int32"),
    # gate / log_gate
    pytest.param(lambda a: dict(log_gate=np.log(a["gate"])), ValueError, (ONE_GATE, "got both"),
                 id="gate-and-log_gate"),
    pytest.param(lambda a: dict(gate=None), ValueError, (ONE_GATE, "got neither"), id="no-gate"),
    # a state that cannot be updated in place
    pytest.param(lambda a: dict(state=_Strided(_rand(N, H, K, 2 * V), np.s_[..., ::2])), ValueError,
                 ("state must be C-contiguous (it is updated in place)",), id="state-strided"),
    pytest.param(lambda a: dict(state=_Fortran(a["state"])), ValueError,
                 ("state must be C-contiguous (it is updated in place)",), id="state-fortran-order"),
    # state_indices
    pytest.param(lambda a: dict(state_indices=np.array([2, 3], np.int64)), ValueError,
                 ("state_indices must lie in [0, N) = [0, 3)", "got 3 at position 1"), id="idx-3-of-N3"),
    pytest.param(lambda a: dict(state_indices=np.array([-1, 0], np.int32)), ValueError,
                 ("state_indices must lie in [0, N) = [0, 3)", "got -1 at position 0"),
                 id="idx-negative-int32"),
    pytest.param(lambda a: dict(state_indices=np.array([0, 2**40], np.int64)), ValueError,
                 ("state_indices must lie in [0, N) = [0, 3)", f"got {2**40} at position 1"),
                 id="idx-2pow40"),
    pytest.param(lambda a: dict(state_indices=np.array([1, 1], np.int64)), ValueError,
                 ("state_indices must not repeat (each state row is updated once)", "got 1 more than once"),
                 id="idx-duplicate"),
    pytest.param(lambda a: dict(state_indices=np.array([0, 0], np.int32)), ValueError,
                 ("state_indices must not repeat (each state row is updated once)", "got 0 more than once"),
                 id="idx-duplicate-int32"),
    pytest.param(lambda a: dict(state_indices=np.array([0, 1, 2], np.int64)), ValueError,
                 ("state_indices must have shape [B] = (2,)", "got (3,)"), id="idx-len3-vs-B2"),
    pytest.param(lambda a: dict(state_indices=np.array([[0, 1]], np.int64)), ValueError,
                 ("state_indices must be 1-D [B]", "got shape (1, 2)"), id="idx-2d"),
    pytest.param(lambda a: dict(state_indices=np.array([0.0, 1.0], F32)), TypeError,
                 ("state_indices must have dtype int32 or int64", "got float32"), id="idx-float32"),
    pytest.param(lambda a: dict(state_indices=np.array([True, False])), TypeError,
                 ("state_indices must have dtype int32 or int64", "got bool"), id="idx-bool"),
    pytest.param(lambda a: dict(state_indices=[2, 0]), TypeError,
                 ("state_indices " + NOT_ARRAY, "got builtins.list"), id="idx-list"),
    # scale
    pytest.param(lambda a: dict(scale=1 + 0j), TypeError, ("scale must be a real number", "got complex"),
                 id="scale-complex"),
    pytest.param(lambda a: dict(scale="1"), TypeError, ("scale must be a real number", "got str"),
                 id="scale-str"),
    # not arrays
    pytest.param(lambda a: dict(q=a["q"].tolist()), TypeError, ("q " + NOT_ARRAY, "got builtins.list"),
                 id="q-list"),
    pytest.param(lambda a: dict(gate=0.9), TypeError, ("gate " + NOT_ARRAY, "got builtins.float"),
                 id="gate-float"),
    pytest.param(lambda a: dict(state=a["state"].tolist()), TypeError,
                 ("state " + NOT_ARRAY, "got builtins.list"), id="state-list"),
    pytest.param(lambda a: dict(out=a["out"].tolist()), TypeError, ("out " + NOT_ARRAY, "got builtins.list"),
                 id="out-list"),
    pytest.param(lambda a: dict(q=None), TypeError, ("q " + NOT_ARRAY, "None"), id="q-None"),
    # out
    pytest.param(lambda a: dict(out=_full(np.nan, B, H, 4)), ValueError,
                 ("out must have shape [B, H, V] = (2, 2, 3)", "got (2, 2, 4)"), id="out-V4-vs-V3"),
    pytest.param(lambda a: dict(out=_full(np.nan, B, 1, H, V)), ValueError,
                 ("out must have shape [B, H, V] = (2, 2, 3)", "got (2, 1, 2, 3)"), id="out-rank4"),
    pytest.param(lambda a: dict(out=_full(np.nan, B, H, V, dtype=np.float16)), TypeError,
                 ("out must have v's dtype float32", "got float16"), id="out-float16"),
    pytest.param(lambda a: dict(out=_full(-7, B, H, V, dtype=np.int32)), TypeError,
                 ("out must have v's dtype float32", "got int32"), id="out-int32"),
    # another library's array (CPU, through DLPack) among the backend's
    pytest.param(lambda a: dict(state=_OtherCPUArray(a["state"])), ValueError,
                 {"numpy": (ONE_LIB, f"q is a numpy array on cpu, state is a {OTHER} array on cpu"),
                  "cupy": (ONE_LIB, f"q is a cupy array on cuda:0, state is a {OTHER} array on cpu")},
                 id="state-other-cpu-library"),
]


@pytest.mark.parametrize("edit, exc, msg", STEP_ERRORS)
def test_step_rejects(edit, exc, msg, backend, monkeypatch):
    _check_raises(cupy_gda.gated_attention_step, STEP, _step_args(), edit, exc, msg, backend, monkeypatch)


@pytest.mark.parametrize("where", ["state-rows", "offset"])
def test_step_rejects_out_overlapping_state(where, backend):
    """out sharing memory with state (which the call updates in place): a ValueError before any
    work, state as it was (the CPU path wrote o over the updated state rows)."""
    state = to_backend(_rand(N, H, K, V).astype(np.float32), backend)
    before = state.copy()
    flat = state.reshape(-1)
    at = 0 if where == "state-rows" else 5          # (offset: across rows of state, unaligned)
    out = flat[at:at + B * H * V].reshape(B, H, V)
    a = {name: to_backend(x, backend) for name, x in _step_args().items() if name not in ("state", "out")}
    with pytest.raises(ValueError, match=re.escape("gated_attention_step: out must not overlap state")):
        cupy_gda.gated_attention_step(**a, state=state, out=out)
    assert bool((state == before).all())


# valid on NumPy, an error on the GPU
STEP_GPU_ONLY = [
    pytest.param(lambda a: {**_as(np.float64, "q", "k", "v")(a),
                            "out": _full(np.nan, B, H, V, dtype=np.float64)},
                 TypeError, (f"q must have dtype {GPU_DT}", "got float64"), id="qkv-float64"),
    pytest.param(_as(np.float64, "state"), TypeError, ("state must have dtype float32", "got float64"),
                 id="state-float64"),
    pytest.param(lambda a: dict(q=_rand(B, H, 300), k=_rand(B, H, 300) * 0.05, gate=_full(0.9, B, H, 300),
                                state=_rand(N, H, 300, V)),
                 ValueError, ("head dimension K must be between 1 and 256", "got 300"), id="K300"),
    pytest.param(lambda a: dict(out=_Strided(_full(np.nan, B, H, 2 * V), np.s_[..., ::2])), ValueError,
                 ("out must be C-contiguous",), id="out-strided"),
]


@pytest.mark.parametrize("edit, exc, msg", STEP_GPU_ONLY)
def test_step_gpu_only_limits(edit, exc, msg, backend, monkeypatch):
    base = _step_args()
    if backend == "cupy":
        _check_raises(cupy_gda.gated_attention_step, STEP, base, edit, exc, msg, backend, monkeypatch)
        return
    call, owned = _materialize({**base, **edit(base)}, backend)
    parent = owned.get("out (whole buffer)")
    before = call["state"].copy()
    want_state = before.copy()
    want_o = reference.gated_attention_step_ref(
        *(call[n] for n in ("q", "k", "v", "gate")), state=want_state, state_indices=call["state_indices"])
    o = cupy_gda.gated_attention_step(**call)
    assert o is call["out"] and o.dtype == call["v"].dtype
    np.testing.assert_allclose(o, want_o, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(call["state"], want_state, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(call["state"][1], before[1])      # row 1 is not in state_indices
    if parent is not None:                    # columns between the strided view's stay untouched
        assert np.isnan(parent[..., 1::2]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("numpy_names, first, second", [
    pytest.param(("state",), "q is a cupy array on cuda:0", "state is a numpy array on cpu",
                 id="numpy-state"),
    pytest.param(("q", "k", "v", "gate"), "q is a numpy array on cpu", "state is a cupy array on cuda:0",
                 id="numpy-inputs-cupy-state"),
    pytest.param(("state_indices",), "q is a cupy array on cuda:0", "state_indices is a numpy array on cpu",
                 id="numpy-state_indices"),
    pytest.param(("out",), "q is a cupy array on cuda:0", "out is a numpy array on cpu", id="numpy-out"),
    pytest.param(("v",), "q is a cupy array on cuda:0", "v is a numpy array on cpu", id="numpy-v"),
])
def test_step_mixed_numpy_cupy(numpy_names, first, second, monkeypatch):
    edit = lambda a: {n: _Keep(a[n]) for n in numpy_names}  # noqa: E731
    _check_raises(cupy_gda.gated_attention_step, STEP, _step_args(), edit, ValueError,
                  (ONE_LIB, f"{first}, {second}"), "cupy", monkeypatch)


@pytest.mark.gpu
def test_step_state_on_another_device(monkeypatch):
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    edit = lambda a: dict(state=_Keep(_on_device_1(a["state"])))  # noqa: E731
    _check_raises(cupy_gda.gated_attention_step, STEP, _step_args(), edit, ValueError,
                  (ONE_LIB, "q is a cupy array on cuda:0, state is a cupy array on cuda:1"), "cupy",
                  monkeypatch)


@pytest.mark.parametrize("idx, msg", [
    pytest.param([2, 3], ("state_indices must lie in [0, N) = [0, 3)", "got 3 at position 1"),
                 id="idx-3-of-N3"),
    pytest.param([1, 1], ("state_indices must not repeat", "got 1 more than once"), id="idx-duplicate"),
])
def test_step_cpu_checks_indices_even_without_check_indices(idx, msg, monkeypatch):
    """check_indices=False only skips the GPU's device sync; the CPU path always checks."""
    edit = lambda a: dict(state_indices=np.array(idx, np.int64), check_indices=False)  # noqa: E731
    _check_raises(cupy_gda.gated_attention_step, STEP, _step_args(), edit, ValueError, msg, "numpy",
                  monkeypatch)


def test_step_jax_arrays_point_to_functional_form(monkeypatch):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    a = _step_args()
    call = {n: jnp.asarray(a[n]) for n in ("q", "k", "v", "gate", "state", "state_indices")}
    before = {n: np.asarray(x).copy() for n, x in call.items()}
    calls = _forbid_compute(monkeypatch)
    with pytest.raises(TypeError, match=_pattern(STEP, (
            "JAX arrays are immutable, so state cannot be updated in place; use the functional form ",
            "o, state = gated_attention(q[:, None], k[:, None], v[:, None], gate[:, None], "
            "initial_state=state, output_final_state=True)"), "numpy")):
        cupy_gda.gated_attention_step(**call)
    assert calls == []
    for n, x in call.items():
        np.testing.assert_array_equal(np.asarray(x), before[n])


def test_read_only_out_and_state_rejected_before_compute(monkeypatch):
    """NumPy arrays can be read-only; a result destination that is gets a clear error."""
    rng = np.random.default_rng(0)
    q, k, g = (rng.standard_normal((2, 5, 2, 4)).astype(F32) for _ in range(3))
    v = rng.standard_normal((2, 5, 2, 3)).astype(F32)
    out = np.full((2, 5, 2, 3), np.nan, F32)
    out.flags.writeable = False
    calls = _forbid_compute(monkeypatch)
    with pytest.raises(ValueError, match=r"^gated_attention: out must be writeable"):
        cupy_gda.gated_attention(q, k, v, g, out=out)
    state = np.zeros((2, 2, 4, 3), F32)
    state.flags.writeable = False
    with pytest.raises(ValueError, match=r"^gated_attention_step: state must be writeable"):
        cupy_gda.gated_attention_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], state=state)
    assert calls == [] and np.isnan(out).all() and not state.any()
