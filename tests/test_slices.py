"""gda_slice (cupy_gda/slices.py): the terms a slice of a sequence gets from a state carried
across its edge. On the CPU, the NumPy forms against a plain loop; on the GPU the kernels
against those forms in float64, within the accuracy contract (the float32 forms' error),
forward and reversed, over all steps or the first few (none, some, past T: clamped), every gate
regime, outputs poisoned (NaN) first so that an unwritten element shows."""
import numpy as np
import pytest

from cupy_gda import _launch, slices
from cupy_gda._verify import compare


def _inputs(B, T, H, K, V, regime, seed):
    rng = np.random.default_rng(seed)
    # (products over 700 steps stay normal floats; "tiny" takes them through the subnormals)
    a = rng.uniform(0.8, 1.0, (B, T, H, K))
    if regime == "zeros":
        a = np.where(rng.random(a.shape) < 0.1, 0.0, a)
    elif regime == "neg":
        a = rng.uniform(-1.05, 1.05, a.shape)
    elif regime == "big":
        a = rng.uniform(1.0, 1.01, a.shape)
    elif regime == "tiny":
        a = rng.uniform(0.0, 1e-3, a.shape)
    n = lambda *s: rng.standard_normal(s)      # noqa: E731
    st = n(B, H, K, V)
    if regime == "past":
        # products past float32's range both ways: gates of 8 over the first and the last 60
        # steps, 1/8 between (the running products reach 2^180 from either end, and pass
        # 2^-149 in the middle), St 2^-100 times, so St's part stays within 2^80
        j = np.arange(T)[None, :, None, None]
        a = np.where((j < 60) | (j >= T - 60), 8.0, 0.125) * np.ones(a.shape)
        st = st * 2.0 ** -100
    return dict(x=n(B, T, H, K), a=a, st=st, y=n(B, T, H, V), w=n(B, T, H, K),
                out=n(B, T, H, K))


def test_forms_are_the_loop():
    B, T, H, K, V = 2, 9, 2, 3, 4
    d = _inputs(B, T, H, K, V, "zeros", 0)
    count = np.array([5, 20])
    for reverse in (False, True):
        P, tot = slices.products_ref(d["a"], count, reverse)
        y = slices.out_ref(d["y"], d["x"], d["a"], d["st"], count, reverse, 0.5)
        out, z = slices.into_ref(d["out"], d["y"], d["w"], d["a"], d["st"], count, reverse, 0.5)
        for b in range(B):
            p = np.ones((H, K))
            for j in range(T):
                t = T - 1 - j if reverse else j
                on = j < min(count[b], T)
                pj = p.copy()
                if on:
                    p = p * d["a"][b, t]
                pj = (pj if reverse else p) if on else 0 * p
                assert np.allclose(P[b, t], pj)
                X = np.einsum("hkv,hv->hk", d["st"][b], d["y"][b, t])
                want_y = d["y"][b, t] + (0.5 * np.einsum("hk,hkv->hv", d["x"][b, t] * pj,
                                                         d["st"][b]) if on else 0)
                assert np.allclose(y[b, t], want_y)
                assert np.allclose(out[b, t], d["out"][b, t] + (0.5 * pj * X if on else 0))
                assert np.allclose(z[b, t], 0.5 * d["w"][b, t] * X if on else 0)
            assert np.allclose(tot[b], p)


def test_forms_keep_their_range_past_float32():
    """The float32 forms where the products pass 2^128 and 2^-149 (St's part within range):
    tot as m 2^e and the anchored running products give the float64 forms' y, out and z."""
    d = _inputs(1, 257, 2, 8, 5, "past", 3)
    d32 = {n: x.astype(np.float32) for n, x in d.items()}
    for reverse in (False, True):
        want = [slices.out_ref(d["y"], d["x"], d["a"], d["st"], None, reverse, 0.5),
                *slices.into_ref(d["out"], d["y"], d["w"], d["a"], d["st"], None, reverse, 0.5)]
        got = [slices.out_ref(d32["y"], d32["x"], d32["a"], d32["st"], None, reverse, 0.5),
               *slices.into_ref(d32["out"], d32["y"], d32["w"], d32["a"], d32["st"], None,
                                reverse, 0.5)]
        for g, w in zip(got, want):
            assert np.isfinite(g).all() and np.allclose(g, w, rtol=1e-4, atol=1e-4 * abs(w).max())
        t = slices.TermsRef(d32["a"], None, reverse)
        assert np.allclose(np.ldexp(t.tot_m.astype(np.float64), t.tot_e.astype(int)),
                           np.prod(d["a"], axis=1), rtol=1e-5)


# (B, T, H, K, V, gate regime): one step; K and V off the tiles of 64; two or three segments
# (slices.TS); St's key chunks staged once (K <= 256) or again each sub-tile (K = 300), and its
# value chunks likewise (V = 512); GLA-1.3B's widths; empty
CASES = [
    pytest.param((1, 1, 1, 1, 1, "unif"), id="B1-T1-H1-K1-V1"),
    pytest.param((2, 63, 2, 24, 7, "zeros"), id="B2-T63-H2-K24-V7-gate_zeros"),
    pytest.param((1, 300, 2, 64, 64, "neg"), id="B1-T300-H2-K64-V64-gate_neg"),
    pytest.param((2, 257, 2, 128, 128, "big"), id="B2-T257-H2-K128-V128-gate_big"),
    pytest.param((1, 700, 1, 100, 130, "tiny"), id="B1-T700-H1-K100-V130-gate_tiny"),
    pytest.param((1, 520, 1, 256, 512, "unif"), id="B1-T520-H1-K256-V512"),
    pytest.param((1, 130, 1, 300, 72, "unif"), id="B1-T130-H1-K300-V72"),
    pytest.param((2, 0, 2, 8, 8, "unif"), id="T0"),
    pytest.param((2, 257, 2, 72, 40, "past"), id="B2-T257-H2-K72-V40-past_float_range"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reversed"])
@pytest.mark.parametrize("counted", ["all", "some"])
def test_gpu_terms_are_their_forms(case, reverse, counted, monkeypatch):
    import cupy
    monkeypatch.setattr(_launch, "POISON", True)
    B, T, H, K, V, regime = case
    d = _inputs(B, T, H, K, V, regime, seed=T + K + V)
    # some: none of row 0's steps, about two thirds of row 1's; and past T (clamped)
    count = None if counted == "all" else np.array([0, 2 * T // 3 + 1] if B > 1 else [T + 5])
    d32 = {n: x.astype(np.float32) for n, x in d.items()}
    g = {n: cupy.asarray(x) for n, x in d32.items()}
    t = slices.terms(g["a"], None if count is None else cupy.asarray(count, np.int64), reverse, V)
    scale = 0.75
    st1 = t.anchor(g["st"])                     # (the running products start from sigma)
    got_y = cupy.asnumpy(t.out(g["y"], g["x"], st1, scale))
    got_out = g["out"]
    got_z, got_P = t.into(got_out, cupy.asarray(d32["y"]), g["w"], st1, scale, products=True)
    sigma = cupy.asnumpy(t.sigma)[:, None]
    with np.errstate(over="ignore", under="ignore"):
        tot = np.ldexp(cupy.asnumpy(t.tot_m), cupy.asnumpy(t.tot_e).astype(int))
    got = dict(tot=tot, y=got_y, out=cupy.asnumpy(got_out), z=cupy.asnumpy(got_z) * sigma,
               P=cupy.asnumpy(got_P))
    forms = {}
    for label, src in (("ref", d), ("emu", d32)):
        P, tot = slices.products_ref(src["a"], count, reverse, src["st"])
        y = slices.out_ref(src["y"], src["x"], src["a"], src["st"], count, reverse, scale)
        out, z = slices.into_ref(src["out"], src["y"], src["w"], src["a"], src["st"], count,
                                 reverse, scale)
        forms[label] = dict(tot=tot, y=y, out=out, z=z, P=P)
    # without products=True the same z (and no P written anywhere else: out is its own array)
    z_only = cupy.asnumpy(t.into(cupy.asarray(d32["out"]), cupy.asarray(d32["y"]), g["w"], st1,
                                 scale))
    assert np.array_equal(z_only * sigma, got["z"], equal_nan=True)
    for name in ("tot", "y", "out", "z", "P"):
        assert got[name].dtype == np.float32 and got[name].shape == forms["ref"][name].shape
        r = compare(name, got[name], forms["ref"][name], forms["emu"][name])
        assert r.ok, f"{name}: err {r.err:.3e} > bound {r.bound:.3e}"


@pytest.mark.gpu
def test_gpu_terms_take_views_at_any_address():
    # inputs 4 bytes past a 16-byte boundary (views into larger arrays): the same results, bit
    # for bit, as from fresh arrays (the kernels' 16-byte copies need aligned rows)
    import cupy
    B, T, H, K, V = 1, 300, 2, 64, 64
    d = {n: cupy.asarray(x.astype(np.float32)) for n, x in _inputs(B, T, H, K, V, "unif", 5).items()}

    def shifted(x):
        buf = cupy.empty(x.size + 1, x.dtype)
        v = buf[1:].reshape(x.shape)
        v[...] = x
        assert v.data.ptr % 16 == 4
        return v

    got = []
    for f in (lambda x: x, shifted):
        t = slices.terms(f(d["a"]), None, True, V)
        st1 = t.anchor(f(d["st"]))
        st1 = shifted(st1) if f is shifted else st1
        y = t.out(d["y"].copy(), f(d["x"]), st1, 0.5)
        z, P = t.into(d["out"].copy(), f(d["y"]), f(d["w"]), st1, 0.5, products=True)
        got.append([cupy.asnumpy(r) for r in (t.tot_m, t.tot_e, y, z, P)])
    for fresh, view in zip(*got):
        assert np.array_equal(fresh, view, equal_nan=True)
