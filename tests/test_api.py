"""Every public path on the case list, on NumPy always and on CuPy where a GPU is, checked
against the float64 loop reference under the accuracy contract (outputs poisoned with NaN)."""
import numpy as np
import pytest
from conftest import run_case, to_backend

import cupy_gda
from cupy_gda import _verify
from cupy_gda._verify import Case, step_case, varlen_case
from cupy_gda.reference import gated_attention_ref

CASES = [pytest.param(c, id=c.id) for c in _verify.standard_cases()]
EXTRA = [
    Case(2, 1000, 4, 24, 24, gate="zeros"), Case(2, 300, 2, 64, 64, gate="neg"),
    Case(2, 64, 4, 24, 24, dtype="float16", gate="tiny"),
    Case(1, 33, 2, 200, 3), Case(1, 33, 2, 3, 200), Case(3, 65, 5, 17, 33, log=True),
    varlen_case((64, 64, 1, 1), K=128, V=64), varlen_case((300,), gate="ones"),
    step_case(3, 2, 1, 1), step_case(16, 2, 160, 160, gate="neg"), step_case(2, 1, 7, 9),
]
CASES += [pytest.param(c, id=c.id) for c in EXTRA]


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


@pytest.mark.parametrize("case", CASES)
def test_case_meets_accuracy_contract(case, backend):
    results = run_case(case, backend)     # verify's seed: the CLI's sweep (test_cli) shares the runs
    for r in results:
        assert r.ok, f"{case.id} {r.name}: err {r.err:.3e} > bound {r.bound:.3e} (max abs {r.max_abs:.3e})"


@pytest.mark.parametrize("method", ["chunk", "recurrent"])
def test_cpu_methods_agree(method):
    for case in (Case(2, 130, 3, 24, 40, gate="zeros"), varlen_case((5, 0, 70), K=8, V=8)):
        for r in _verify.run_case(case, "numpy", seed=3, method=method):
            assert r.ok, (case.id, r)


def _inputs(B, T, H, K, V, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, T, H, K)) / np.sqrt(K)).astype(dtype)
    k = (rng.standard_normal((B, T, H, K)) / np.sqrt(K)).astype(dtype)
    v = rng.standard_normal((B, T, H, V)).astype(dtype)
    g = rng.uniform(0.5, 1, (B, T, H, K)).astype(np.float32)
    return q, k, v, g


def test_varlen_equals_separate_calls(backend):
    lens = [1, 17, 64, 300, 0, 5]
    H, K, V = 2, 24, 40
    q, k, v, g = _inputs(1, sum(lens), H, K, V, 1)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    h0 = np.random.default_rng(2).standard_normal((len(lens), H, K, V)).astype(np.float32)
    X = [to_backend(x, backend) for x in (q, k, v, g, h0, cu)]
    o, s = cupy_gda.gated_attention(*X[:4], initial_state=X[4], cu_seqlens=X[5], output_final_state=True)
    o, s = _host(o), _host(s)
    for n in range(len(lens)):
        a, b = cu[n], cu[n + 1]
        Y = [to_backend(np.ascontiguousarray(x[:, a:b]), backend) for x in (q, k, v, g)]
        on, sn = cupy_gda.gated_attention(*Y, initial_state=to_backend(h0[n:n + 1], backend),
                                          output_final_state=True)
        np.testing.assert_allclose(o[:, a:b], _host(on), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s[n:n + 1], _host(sn), rtol=1e-5, atol=1e-6)


def test_step_equals_T1_call(backend):
    B, H, K, V = 5, 3, 24, 36
    q, k, v, g = (x[:, 0] for x in _inputs(B, 1, H, K, V, 3))
    state = np.random.default_rng(4).standard_normal((B + 2, H, K, V)).astype(np.float32)
    idx = np.array([6, 0, 3, 1, 5], np.int32)
    h0 = state[idx].copy()
    st = to_backend(state.copy(), backend)
    o = cupy_gda.gated_attention_step(*(to_backend(x, backend) for x in (q, k, v, g)), state=st,
                                      state_indices=to_backend(idx, backend))
    o1, s1 = cupy_gda.gated_attention(*(to_backend(x[:, None], backend) for x in (q, k, v, g)),
                                      initial_state=to_backend(h0, backend), output_final_state=True)
    np.testing.assert_allclose(_host(o), _host(o1)[:, 0], rtol=1e-5, atol=1e-6)
    st = _host(st)
    np.testing.assert_allclose(st[idx], _host(s1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(st[[2, 4]], state[[2, 4]])


def test_n_steps_equal_one_call(backend):
    B, T, H, K, V = 3, 20, 2, 64, 64
    q, k, v, g = _inputs(B, T, H, K, V, 5)
    X = [to_backend(x, backend) for x in (q, k, v, g)]
    o, s = cupy_gda.gated_attention(*X, output_final_state=True)
    state = to_backend(np.zeros((B, H, K, V), np.float32), backend)
    steps = [_host(cupy_gda.gated_attention_step(*(to_backend(np.ascontiguousarray(x[:, t]), backend)
                                                   for x in (q, k, v, g)), state=state))
             for t in range(T)]
    np.testing.assert_allclose(np.stack(steps, 1), _host(o), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_host(state), _host(s), rtol=1e-5, atol=1e-5)


def test_out_argument_receives_o(backend):
    q, k, v, g = _inputs(2, 33, 2, 8, 12, 6)
    out = to_backend(np.full((2, 33, 2, 12), np.nan, np.float32), backend)
    X = [to_backend(x, backend) for x in (q, k, v, g)]
    o = cupy_gda.gated_attention(*X, out=out)
    assert o is out
    np.testing.assert_allclose(_host(out), gated_attention_ref(q, k, v, g), rtol=1e-4, atol=1e-5)


def test_non_contiguous_inputs(backend):
    q, k, v, g = _inputs(2, 40, 3, 16, 16, 7)
    # [B, H, T, K] storage viewed as [B, T, H, K]: strided, not contiguous
    X = [to_backend(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), backend).transpose(0, 2, 1, 3)
         for x in (q, k, v, g)]
    assert not X[0].flags.c_contiguous
    o = cupy_gda.gated_attention(*X)
    assert o.flags.c_contiguous
    np.testing.assert_allclose(_host(o), gated_attention_ref(q, k, v, g), rtol=1e-4, atol=1e-5)


def test_empty_sequence_returns_initial_state(backend):
    q, k, v, g = _inputs(2, 0, 2, 4, 3, 8)
    h0 = np.random.default_rng(9).standard_normal((2, 2, 4, 3)).astype(np.float32)
    o, s = cupy_gda.gated_attention(*(to_backend(x, backend) for x in (q, k, v, g)),
                                    initial_state=to_backend(h0, backend), output_final_state=True)
    assert o.shape == (2, 0, 2, 3)
    np.testing.assert_array_equal(_host(s), h0)


def test_many_sequences_and_heads(backend):
    """B·H = 65,536 blocks' worth of (b, h) pairs with tiny dims: 1-D grid, no axis limit."""
    B, T, H, K, V = 256, 3, 256, 2, 3
    q, k, v, g = _inputs(B, T, H, K, V, 10)
    o = cupy_gda.gated_attention(*(to_backend(x, backend) for x in (q, k, v, g)))
    np.testing.assert_allclose(_host(o), gated_attention_ref(q, k, v, g), rtol=1e-4, atol=1e-5)
    state = to_backend(np.zeros((B, H, K, V), np.float32), backend)
    o1 = cupy_gda.gated_attention_step(*(to_backend(np.ascontiguousarray(x[:, 0]), backend)
                                         for x in (q, k, v, g)), state=state)
    np.testing.assert_allclose(_host(o1), _host(o)[:, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.whole_gpu      # 4.3 GB tensors, 8.6 GB draws: not beside other workers' pools
def test_tensors_over_2_31_elements():
    """64-bit offsets: q, k, v, gate and o of 2^31 + 2^20 float16 elements each; the last
    sequences (whose offsets pass 2^31) are checked against the reference."""
    import cupy
    B, T, H, K, V = 2**14 + 2**3, 2, 256, 256, 256
    assert B * T * H * K > 2**31
    rng = cupy.random.default_rng(0)
    q = (rng.standard_normal((B, T, H, K), dtype=cupy.float32) * 0.06).astype(cupy.float16)
    k = (rng.standard_normal((B, T, H, K), dtype=cupy.float32) * 0.06).astype(cupy.float16)
    v = rng.standard_normal((B, T, H, V), dtype=cupy.float32).astype(cupy.float16)
    g = rng.uniform(0.5, 1.0, (B, T, H, K), dtype=cupy.float32).astype(cupy.float16)
    o = cupy_gda.gated_attention(q, k, v, g)
    tail = slice(B - 3, B)
    want = gated_attention_ref(*(x[tail].get() for x in (q, k, v, g)))
    got = o[tail].get().astype(np.float64)
    rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
    assert rel < 2e-3, rel
    del q, k, v, g, o
    cupy.get_default_memory_pool().free_all_blocks()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # inf - inf
@pytest.mark.parametrize("bad", [pytest.param(np.nan, id="nan"), pytest.param(np.inf, id="inf")])
@pytest.mark.parametrize("method, dtype", [("chunk", "float32"), ("chunk", "bfloat16"),
                                           ("recurrent", "float32")])
def test_bad_value_in_v_reaches_only_later_steps(method, dtype, bad, backend):
    """A NaN or inf in v_s (mid sub-block, mid chunk) leaves every o_t, t < s, finite and makes
    o_t's column non-finite from s on, exactly as the recurrence does (no 0 * NaN leaks);
    bfloat16 inputs run the chunked kernel's bf16 mma."""
    B, T, H, K, V, s, c = 2, 200, 2, 64, 32, 70, 5
    q, k, v, g = _inputs(B, T, H, K, V, 12, _verify._dtype(dtype))
    v[1, s, 0, c] = bad
    o = _host(cupy_gda.gated_attention(*(to_backend(x, backend) for x in (q, k, v, g)),
                                       method=method))
    assert np.isfinite(o[:, :s]).all() and np.isfinite(o[0]).all() and np.isfinite(o[1, :, 1]).all()
    assert not np.isfinite(o[1, s:, 0, c]).any()
    others = np.delete(o[1, :, 0], c, axis=-1)
    assert np.isfinite(others).all()


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 2, 3], ids=lambda e: f"{e}-elements")   # (2-12 bytes)
@pytest.mark.parametrize("method, shape, dtype", [
    # (K = 128, V = 512, 12 sequence-heads: the forward from the planes with scan_o on an H100
    # or H200, 96 value-tile blocks for 132 SMs, whose o leaves 16 bytes a store)
    pytest.param("auto", (4, 512, 3, 128, 512), "bfloat16", id="planes-bf16"),
    pytest.param("chunk", (2, 130, 2, 64, 64), "float32", id="chunk-fp32"),
    pytest.param("recurrent", (2, 70, 2, 24, 40), "float16", id="recurrent-fp16"),
])
def test_out_not_16_byte_aligned(method, shape, dtype, offset):
    """An out that is C-contiguous but starts inside a 16-byte group (a view at an odd offset)
    receives exactly the o of a call without it, and not one element of its buffer beside it
    is written (a NaN pattern there stays, bit for bit): o comes through a buffer of the call's
    own."""
    import cupy
    q, k, v, g = (to_backend(x, "cupy") for x in _inputs(*shape, 13, _verify._dtype(dtype)))
    want = cupy_gda.gated_attention(q, k, v, g, method=method)
    bits = np.uint32 if want.dtype.itemsize == 4 else np.uint16
    nan = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}[dtype]
    flat = cupy.full(want.size + 2 * offset, nan, bits)
    out = flat[offset:offset + want.size].view(want.dtype).reshape(want.shape)
    assert out.flags.c_contiguous and out.data.ptr % 16
    o = cupy_gda.gated_attention(q, k, v, g, method=method, out=out)
    assert o is out
    assert bool((out.view(bits) == want.view(bits)).all())
    assert bool((flat[:offset] == nan).all()) and bool((flat[offset + want.size:] == nan).all())


@pytest.mark.gpu
@pytest.mark.parametrize("method, case", [
    pytest.param("chunk", Case(2, 300, 2, 64, 64), id="chunk-K64-double-buffered"),
    pytest.param("chunk", Case(2, 300, 2, 128, 64), id="chunk-K128"),
    pytest.param("chunk", Case(1, 700, 2, 32, 32), id="chunk-K32-segments"),
    pytest.param("recurrent", Case(2, 300, 2, 24, 24), id="recurrent-K24"),
    pytest.param("recurrent", Case(1, 2048, 2, 64, 64), id="recurrent-K64-segments"),
])
def test_inputs_not_16_byte_aligned(method, case):
    """q, k, v, gate 4 bytes past a 16-byte boundary: the kernels stage them through registers
    or plain loads (no cp.async, whose 16-byte copies need alignment), with the same result."""
    import cupy
    args = _verify.make_inputs(case, seed=11)
    (o_ref, s_ref), (o_emu, s_emu) = _verify.references(case, args)
    dev = {}
    for name, x in args.items():
        if name in ("q", "k", "v", "gate"):
            flat = cupy.empty(x.size + 1, x.dtype)
            dev[name] = flat[1:].reshape(x.shape)
            dev[name][...] = cupy.asarray(x)
            assert dev[name].data.ptr % 16 and dev[name].flags.c_contiguous
        else:
            dev[name] = cupy.asarray(x)
    o, s = cupy_gda.gated_attention(**dev, output_final_state=True, method=method)
    for r in (_verify.compare("o", cupy.asnumpy(o), o_ref, o_emu),
              _verify.compare("state", cupy.asnumpy(s), s_ref, s_emu)):
        assert r.ok, f"{r.name}: err {r.err:.3e} > bound {r.bound:.3e}"
