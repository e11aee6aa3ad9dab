"""gda_convert (cupy_gda/convert.py): float16 and bfloat16 to float32 and back, against NumPy's
astype (ml_dtypes for bfloat16: round to nearest even), bit for bit but for NaN payloads: every
length around the 8 elements a thread, views off the 16-byte boundary (one element at a time),
non-contiguous arrays (astype), and the values that test a rounding: ties, subnormals,
overflow, inf and NaN. Outputs start poisoned (NaN), so an unwritten element shows."""
import ml_dtypes
import numpy as np
import pytest

from cupy_gda import _launch, convert

HALVES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _values(n, dtype, seed):
    """float32 values that test float32 -> dtype: normal, ties of dtype's last bit, subnormal in
    dtype, beyond its range, inf, NaN, signed zeros."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    info = ml_dtypes.finfo(dtype) if dtype is ml_dtypes.bfloat16 else np.finfo(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(np.float32).max,
                        float(info.smallest_subnormal) * 1.5, float(info.tiny) / 3], np.float32)
    # ties: a half value plus half its last place, exactly representable in float32
    h = rng.standard_normal(n).astype(dtype)
    ties = (h.astype(np.float32) * (1 + float(info.eps) / 2)).astype(np.float32)
    pool = np.concatenate([x, special, ties])
    return rng.permutation(pool)[:n] if n <= pool.size else np.resize(pool, n)


def _same(got, want):
    """Equal values, NaN where NaN, bit for bit elsewhere."""
    g, w = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan)
    bits = {2: np.uint16, 4: np.uint32}
    assert got.dtype == want.dtype
    assert np.array_equal(got.view(bits[got.itemsize])[~nan], want.view(bits[want.itemsize])[~nan])


def test_numpy_arrays_take_astype():
    x = np.arange(5, dtype=np.float32)
    assert convert.as_float32(x) is x and convert.as_dtype(x, np.float32) is x
    h = convert.as_dtype(x, np.float16)
    assert h.dtype == np.float16 and np.array_equal(convert.as_float32(h), x)
    b = convert.as_dtype(x, ml_dtypes.bfloat16)
    assert b.dtype == ml_dtypes.bfloat16 and np.array_equal(convert.as_float32(b), x)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(HALVES))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 4096 + 5, 1_000_003])
@pytest.mark.parametrize("layout", ["fresh", "off16", "strided"])
def test_gpu_convert_is_astype(name, n, layout, monkeypatch):
    import cupy
    monkeypatch.setattr(_launch, "POISON", True)
    dtype = HALVES[name]
    x32 = _values(n, dtype, seed=n)
    with np.errstate(over="ignore"):            # (beyond the half's range: inf, as meant)
        x16 = x32.astype(dtype)

    def on_gpu(a):
        if layout == "fresh":
            return cupy.asarray(a)
        if layout == "off16":           # a view one element past a 16-byte boundary
            buf = cupy.empty(a.size + 1, a.dtype)
            v = buf[1:]
            v[...] = cupy.asarray(a)
            assert v.data.ptr % 16 != 0
            return v
        buf = cupy.empty(2 * a.size, a.dtype)     # every other element
        v = buf[::2]
        v[...] = cupy.asarray(a)
        return v

    up = convert.as_float32(on_gpu(x16))
    assert up.dtype == np.float32 and up.shape == (n,)
    _same(cupy.asnumpy(up), x16.astype(np.float32))
    down = convert.as_dtype(on_gpu(x32), dtype)
    assert down.dtype == dtype and down.shape == (n,)
    _same(cupy.asnumpy(down), x16)


@pytest.mark.gpu
def test_gpu_convert_keeps_shape_and_identity():
    import cupy
    x = cupy.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert convert.as_float32(x) is x and convert.as_dtype(x, np.float32) is x
    b = convert.as_dtype(x, ml_dtypes.bfloat16)
    assert b.shape == (2, 3, 4) and b.dtype == ml_dtypes.bfloat16
    assert cupy.array_equal(convert.as_float32(b), x)
