"""gda_scan (cupy_gda/scan.py): e_t = a_t e_{t-1} + z_t in time, lane by lane. The CPU loop
(scan_ref) against closed forms; on the GPU the kernel against the loop: bit for bit within one
segment, within the accuracy contract (the float64 loop, the float32 loop's error) across
segments, forward and reversed, with and without z and init, outputs poisoned (NaN) first."""
import numpy as np
import pytest

from cupy_gda import _launch, scan
from cupy_gda._verify import compare


def _arrays(B, T, L, regime, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 1.0, (B, T, L))
    if regime == "zeros":
        a = np.where(rng.random(a.shape) < 0.2, 0.0, a)
    elif regime == "neg":
        a = rng.uniform(-1.1, 1.1, a.shape)
    elif regime == "big":
        a = rng.uniform(1.0, 1.01, a.shape)
    z = rng.standard_normal((B, T, L))
    init = rng.standard_normal((B, L))
    return a, z, init


def test_scan_ref_is_the_closed_forms():
    a, z, init = _arrays(2, 9, 3, "zeros", 0)
    assert np.array_equal(scan.scan_ref(a, None, np.ones((2, 3))), np.cumprod(a, axis=1))
    rev = scan.scan_ref(a, None, np.ones((2, 3)), reverse=True)
    assert np.array_equal(rev, np.cumprod(a[:, ::-1], axis=1)[:, ::-1])
    e = scan.scan_ref(a, z, init)
    want = np.empty_like(a)
    x = init
    for t in range(9):
        x = a[:, t] * x + z[:, t]
        want[:, t] = x
    assert np.array_equal(e, want)
    assert np.array_equal(scan.scan_ref(a, z, None), scan.scan_ref(a, z, np.zeros((2, 3))))
    assert scan.scan(a[:, :0], z[:, :0]).shape == (2, 0, 3)


# (B, T, L, regime): one segment (T <= scan.TS), several with a short last one, lanes not a
# multiple of the block's, every gate regime, empty
CASES = [
    pytest.param((2, 200, 40, "unif"), id="one_segment-B2-T200-L40"),
    pytest.param((1, 1000, 300, "zeros"), id="segments-T1000-L300-gate_zeros"),
    pytest.param((3, 700, 128, "neg"), id="segments-B3-T700-L128-gate_neg"),
    pytest.param((1, 4097, 64, "big"), id="segments-T4097-L64-gate_big"),
    pytest.param((2, 0, 8, "unif"), id="T0"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reversed"])
def test_gpu_scan_is_the_loop(case, reverse, monkeypatch):
    import cupy
    monkeypatch.setattr(_launch, "POISON", True)
    B, T, L, regime = case
    a, z, init = _arrays(B, T, L, regime, seed=T + L)
    a32, z32, i32 = (x.astype(np.float32) for x in (a, z, init))
    for zz, ii in ((z32, i32), (None, i32), (z32, None)):
        got = cupy.asnumpy(scan.scan(cupy.asarray(a32), None if zz is None else cupy.asarray(zz),
                                     None if ii is None else cupy.asarray(ii), reverse))
        emu = scan.scan_ref(a32, zz, ii, reverse)
        assert got.dtype == np.float32 and got.shape == (B, T, L)
        if T <= scan.TS:
            assert np.array_equal(got, emu)         # one segment: the loop, bit for bit
        else:
            ref = scan.scan_ref(a, None if zz is None else z, None if ii is None else init,
                                reverse)
            r = compare("e", got, ref, emu)
            assert r.ok, f"err {r.err:.3e} > bound {r.bound:.3e}"
