"""Edge inputs on every method, on the CPU (NumPy) and on the GPU (CuPy), against the loop:
size-0 dimensions, gate products beyond float32's range (the chunked forms step such chunks:
the loop itself), inf and NaN that propagate as the loop says, and, on the GPU, sequence
segments whose gate product leaves float range (carried as m 2^e) or is not finite (the later
segments step the rows before them)."""
import numpy as np
import pytest

import cupy_gda
from cupy_gda import reference as R
from cupy_gda._interop import host_array
from conftest import to_backend

METHODS = ("auto", "chunk", "recurrent")


def _methods(q, k, v, g, backend, **kw):
    """(o, final state) of every method on the same float32 inputs, as NumPy arrays."""
    x = [to_backend(a, backend) for a in (q, k, v, g)]
    out = {}
    for m in METHODS:
        o, s = cupy_gda.gated_attention(*x, output_final_state=True, method=m, **kw)
        out[m] = host_array(o), host_array(s)
    return out


@pytest.mark.parametrize("shape", [(0, 5, 2, 4, 3), (2, 0, 2, 4, 3), (2, 5, 0, 4, 3)],
                         ids=["B0", "T0", "H0"])
def test_size_zero_dims_on_every_method(shape, backend):
    """A size-0 B, T or H gives empty results of the right shapes on every method (the CPU
    chunked path raised IndexError at B = 0)."""
    B, T, H, K, V = shape
    q = np.ones((B, T, H, K), np.float32)
    v = np.ones((B, T, H, V), np.float32)
    for m, (o, s) in _methods(q, q, v, q, backend).items():
        assert o.shape == (B, T, H, V) and o.dtype == np.float32, m
        assert s.shape == (B, H, K, V) and not s.any(), m
    if backend == "numpy":
        for fn in (R.gated_attention_ref, R.gated_attention_chunked, R.gated_attention_recurrent):
            o, s = fn(q, q, v, q, output_final_state=True)
            assert o.shape == (B, T, H, V) and s.shape == (B, H, K, V), fn.__name__


def test_gate_products_out_of_float32_range(backend):
    """Gates whose products in one chunk leave float32's range: the chunked form would make
    inf * 0 = NaN and spread it to every later chunk; every method gives the loop's finite
    result (the issue's example, then 40 and 300 steps of random inputs with huge gates)."""
    q = k = v = np.ones((1, 3, 1, 1), np.float32)
    g = np.array([1e20, 1e20, .5], np.float32).reshape(1, 3, 1, 1)
    for m, (o, _) in _methods(q, k, v, g, backend).items():
        np.testing.assert_allclose(o.ravel(), [1, 1e20, 5e19], rtol=1e-6, err_msg=m)
    rng = np.random.default_rng(11)
    for T, K, V in ((40, 4, 6), (300, 64, 64)):
        q, k = (rng.standard_normal((2, T, 3, K)).astype(np.float32) for _ in range(2))
        v = rng.standard_normal((2, T, 3, V)).astype(np.float32)
        g = rng.uniform(0.5, 1, q.shape).astype(np.float32)
        g[:, 7::9] = 1e20                 # products of 1e20s overflow; each step's stays finite
        g[:, 8::9] = 1e-25
        want, want_s = R.gated_attention_ref(q, k, v, g, output_final_state=True)
        loop32, _ = R.gated_attention_ref(q, k, v, g, output_final_state=True, dtype=np.float32)
        assert np.isfinite(loop32).all()
        bound = 2 * np.abs(loop32 - want).max() + 1e-6 * np.abs(want).max()
        for m, (o, s) in _methods(q, k, v, g, backend).items():
            assert np.isfinite(o).all() and np.isfinite(s).all(), (T, m)
            assert np.abs(o - want).max() <= bound, (T, m, np.abs(o - want).max(), bound)
        if backend == "numpy":
            o, _ = R.gated_attention_chunked(q, k, v, g, output_final_state=True, BT=16)
            assert np.isfinite(o).all() and np.abs(o - want).max() <= bound


def test_subnormal_results_are_kept(backend):
    """A state that decays into float32's subnormal range (1e-20 * 1e-19 = 1e-39) is kept, as
    the float32 loop keeps it, by every method, the decode step and the backward's dq: the GPU
    builds do not flush subnormals to 0 (CuPy's own compile adds -ftz=true; ours do not). To
    1e-2 relative, not exactly: the chunked kernels' tensor cores take a subnormal operand's
    split to 0.1 % (9.987e-40 for 1.0000002e-39 on the H200); a flushed result is off by 1."""
    q = v = np.ones((1, 3, 1, 1), np.float32)
    k = np.array([1, 0, 0], np.float32).reshape(1, 3, 1, 1)
    g = np.array([1, 1e-20, 1e-19], np.float32).reshape(1, 3, 1, 1)
    want = np.array([1, np.float32(1e-20), np.float32(1e-20) * np.float32(1e-19)], np.float32)
    assert 0 < want[2] < np.finfo(np.float32).tiny           # a subnormal
    runs = _methods(q, k, v, g, backend)
    got = {f"{m} o": o.ravel() for m, (o, _) in runs.items()}
    got.update({f"{m} state": s.ravel() for m, (_, s) in runs.items()})
    x = [to_backend(a, backend) for a in (q, k, v, g)]
    for m in METHODS:
        got[f"{m} dq"] = host_array(cupy_gda.gated_attention_backward(*x, do=x[0], method=m).dq).ravel()
    state = to_backend(np.full((1, 1, 1, 1), want[1]), backend)
    got["step o"] = host_array(cupy_gda.gated_attention_step(*(a[:, 2] for a in x), state=state)).ravel()
    got["step state"] = host_array(state).ravel()
    bad = {what: r[-1] for what, r in got.items()
           if not np.allclose(r, want[-len(r):], rtol=1e-2, atol=0)}
    assert not bad, f"want {want}; the last element of each wrong result: {bad}"


@pytest.mark.parametrize("where", ["k", "v", "q", "gate", "state"])
def test_inf_propagates_like_the_loop_on_every_method(where, backend):
    """Tiny gates and one inf (in k, v, q, a gate or the initial state): every method has the
    loop's inf and NaN elements (the chunked forms made NaN of most of the loop's infs), and
    its finite values."""
    rng = np.random.default_rng(12)
    q, k = (rng.standard_normal((1, 150, 1, 3)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((1, 150, 1, 4)).astype(np.float32)
    g = np.full(q.shape, 1e-30, np.float32)
    h0 = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    x = dict(k=k, v=v, q=q, gate=g)
    if where == "state":
        h0[0, 0, 1, 2] = np.inf
    else:
        x[where][0, 70, 0, 1] = np.inf
    want, _ = R.gated_attention_ref(q, k, v, g, initial_state=h0, output_final_state=True,
                                    dtype=np.float32)
    assert np.isinf(want).any() and np.isfinite(want).any()
    fin = np.isfinite(want)
    for m, (o, _) in _methods(q, k, v, g, backend, initial_state=to_backend(h0, backend)).items():
        np.testing.assert_array_equal(np.isnan(o), np.isnan(want), err_msg=m)
        np.testing.assert_array_equal(np.isinf(o), np.isinf(want), err_msg=m)
        np.testing.assert_allclose(o[fin], want[fin], rtol=1e-5, atol=1e-6, err_msg=m)


@pytest.mark.gpu
@pytest.mark.parametrize("family, split", [("chunk", (64, 4)), ("recurrent", 4)])
def test_segment_gate_product_beyond_float_range(family, split):
    """Forced segments: a zero state through the first half (k = 0) under gates of 1.3, whose
    product over a segment overflows float32, then gates of 0.5. The loop stays finite; a
    carry by that product as a float would be inf * 0 = NaN."""
    import cupy
    from cupy_gda import _checks, _launch, chunk, recurrent
    rng = np.random.default_rng(13)
    B, T, H, K, V = 1, 2048, 2, 64, 64
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) / 8 for _ in range(2))
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    k[:, :T // 2] = 0
    g = np.where(np.arange(T)[None, :, None, None] < T // 2, 1.3, 0.5).astype(np.float32)
    g = np.broadcast_to(g, q.shape).copy()
    want, want_s = R.gated_attention_ref(q, k, v, g, output_final_state=True)
    emu, emu_s = R.gated_attention_ref(q, k, v, g, output_final_state=True, dtype=np.float32)
    dev = [cupy.asarray(a) for a in (q, k, v, g)]
    p = _checks.check_forward("t", *dev, None, None, None, cpu=False)
    limits = _launch.device_limits()
    if family == "chunk":
        plan = chunk.ChunkPlan(p, False, chunk.config(p, *limits, BV=split[0], P=split[1]))
    else:
        plan = recurrent.RecurrentPlan(p, False, recurrent.custom(p, *limits, P=split))
    assert plan.state_launch is not None
    o, s = plan(*dev, 1.0, None, None, True, None)
    from cupy_gda._verify import compare
    for r in (compare("o", host_array(o), want, emu), compare("state", host_array(s), want_s, emu_s)):
        assert r.ok, f"{family} {r.name}: err {r.err:.3e} > bound {r.bound:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("K, dtype, cols", [
    (256, "float32", slice(128, 256)), (256, "float32", slice(0, 128)), (256, "float32", slice(100, 140)),
    (64, "float32", slice(16, 40)), (64, "bfloat16", slice(0, 64))],
    ids=["K256-tile1", "K256-tile0", "K256-both", "K64-copied", "K64-bf16"])
def test_chunk_steps_a_key_tile_out_of_range(K, dtype, cols):
    """Gates of 0, 2 and 4 in some columns of the second chunk only. K = 256 in two key tiles:
    the tiles out of the guard's range are stepped, the others take the tensor cores (a fast
    first tile leaves its scores for the last one's output). K = 64, one tile: float32 inputs go
    by cp.async into two sets (stage 3 finds the gates out of range after scaling q and k in
    place, so the chunk is loaded again while the next one's copies are in flight), bfloat16
    through registers (checked as they are loaded). Within the accuracy contract."""
    import cupy
    from cupy_gda import _verify
    from cupy_gda._verify import compare
    rng = np.random.default_rng(14)
    B, T, H, V = 2, 300, 2, 64
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) / 16 for _ in range(2))
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    g = rng.uniform(0.9, 1, (B, T, H, K)).astype(np.float32)
    g[:, 64:128, :, cols] = rng.choice(np.float32([0, 2, 4]), (B, 64, H, cols.stop - cols.start))
    h0 = rng.standard_normal((B, H, K, V)).astype(np.float32)
    q, k, v = (x.astype(_verify._dtype(dtype)) for x in (q, k, v))
    want = R.gated_attention_ref(q, k, v, g, initial_state=h0, output_final_state=True)
    emu = R.gated_attention_ref(q, k, v, g, initial_state=h0, output_final_state=True, dtype=np.float32)
    emu = (emu[0].astype(v.dtype), emu[1])          # o in the inputs' dtype, as the kernel's
    got = cupy_gda.gated_attention(*(cupy.asarray(x) for x in (q, k, v, g)), initial_state=cupy.asarray(h0),
                                   output_final_state=True, method="chunk")
    for name, a, w, e in zip(("o", "state"), got, want, emu):
        r = compare(name, host_array(a), w, e)
        assert r.ok, f"{name}: err {r.err:.3e} > bound {r.bound:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["k", "v", "gate-nan", "gate-inf"])
@pytest.mark.parametrize("family, K, dtype", [
    ("chunk", 64, "float32"), ("chunk", 128, "float32"), ("chunk", 32, "float32"), ("chunk", 48, "float32"),
    ("chunk", 64, "bfloat16"), ("recurrent", 64, "float32"), ("recurrent", 48, "bfloat16")])
def test_segments_carry_inf_and_nan_as_the_loop(family, K, dtype, where):
    """Forced segments (4; the chunk kernel's value tiles of 32): one inf in k or v, or an inf
    or NaN gate, inside the second segment, which the state pass runs. The chunk kernel steps
    that chunk (float32 inputs copied by cp.async, K a multiple of 4: stage 3 checks k and the
    gates in its scan's registers, v in its threads with no key column; bfloat16 inputs checked
    as they are loaded). An inf gate leaves the segment's gate product infinite, which the
    carry S = Γ S_prev + S_seg cannot pass on (the loop's inf takes the whole S's sign): the
    later segments' blocks step the sequence's rows before them from h0 instead. Every output
    has the loop's inf and NaN elements, and its finite values within the accuracy contract."""
    import cupy
    from cupy_gda import _checks, _launch, _verify, chunk, recurrent
    from cupy_gda._verify import compare
    rng = np.random.default_rng(15)
    B, T, H, V = 1, 1024, 2, 64
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) / 8 for _ in range(2))
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    g = rng.uniform(0.5, 1, (B, T, H, K)).astype(np.float32)
    x = dict(k=k, v=v, gate=g)
    x[where.split("-")[0]][0, 300, 1, 5] = np.nan if where == "gate-nan" else np.inf
    q, k, v = (a.astype(_verify._dtype(dtype)) for a in (q, k, v))
    want = R.gated_attention_ref(q, k, v, g, output_final_state=True)
    emu = R.gated_attention_ref(q, k, v, g, output_final_state=True, dtype=np.float32)
    emu = (emu[0].astype(v.dtype), emu[1])
    assert not np.isfinite(want[0][:, 300:, 1]).all() and np.isfinite(want[0][:, :300]).all()
    dev = [cupy.asarray(a) for a in (q, k, v, g)]
    p = _checks.check_forward("t", *dev, None, None, None, cpu=False)
    limits = _launch.device_limits()
    if family == "chunk":
        plan = chunk.ChunkPlan(p, False, chunk.config(p, *limits, BV=32, P=4))
    else:
        plan = recurrent.RecurrentPlan(p, False, recurrent.custom(p, *limits, P=4))
    assert plan.state_launch is not None
    got = plan(*dev, 1.0, None, None, True, None)
    for name, a, w, e in zip(("o", "state"), got, want, emu):
        a = host_array(a).astype(np.float64)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(w), err_msg=name)
        np.testing.assert_array_equal(np.isinf(a), np.isinf(w), err_msg=name)
        r = compare(name, a, w, e)
        assert r.ok, f"{name}: err {r.err:.3e} > bound {r.bound:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["chunk", "recurrent"])
def test_segments_carry_a_chunk_product_beyond_float_range(family):
    """Forced segments (4 of 256 steps; the recurrent kernel staging 64 steps a chunk): tiny
    states up to step 320 (k scaled by 1e-13), then gates of 4.5 over the 64 steps 320..383 with
    k = 0 there, then gates of 0.5. The loop stays finite (S grows by 2^139 from about 1e-12).
    The recurrent state pass multiplies a staged chunk's gates plainly, so its product of those
    64 (2^139) is inf, which the carry cannot pass on: the later segments' blocks step the rows
    before them from h0 instead. Within the accuracy contract."""
    import cupy
    from cupy_gda import _checks, _launch, chunk, recurrent
    from cupy_gda._verify import compare
    rng = np.random.default_rng(16)
    B, T, H, K, V = 1, 1024, 2, 32, 32
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    k[:, :320] *= 1e-13
    k[:, 320:384] = 0
    g = np.full((B, T, H, K), 0.5, np.float32)
    g[:, 320:384] = 4.5
    want = R.gated_attention_ref(q, k, v, g, output_final_state=True)
    emu = R.gated_attention_ref(q, k, v, g, output_final_state=True, dtype=np.float32)
    assert all(np.isfinite(w).all() for w in want) and np.abs(want[0]).max() > 1e25
    dev = [cupy.asarray(a) for a in (q, k, v, g)]
    p = _checks.check_forward("t", *dev, None, None, None, cpu=False)
    limits = _launch.device_limits()
    if family == "chunk":
        plan = chunk.ChunkPlan(p, False, chunk.config(p, *limits, P=4))
    else:
        plan = recurrent.RecurrentPlan(p, False, recurrent.custom(p, *limits, P=4, TC=64))
        assert plan.cfg.TC == 64
    assert plan.state_launch is not None
    for name, a, w, e in zip(("o", "state"), plan(*dev, 1.0, None, None, True, None), want, emu):
        r = compare(name, host_array(a), w, e)
        assert r.ok, f"{family} {name}: err {r.err:.3e} > bound {r.bound:.3e}"
