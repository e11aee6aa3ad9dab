"""Issue 15: the gradients' reference (the reverse loop) against central finite differences of the
float64 forward; the CPU backward (the same loop over every sequence at once, states recomputed
per chunk) and the GPU kernel (gda_recurrent_bwd) through the public gated_attention_backward
against the reference, within the accuracy contract, for every gate the recurrence takes; their
arguments checked like the forward's."""
import numpy as np
import pytest

import cupy_gda
from cupy_gda import _verify, reference as R
from cupy_gda._verify import compare

# gate regimes: exact 0s and 1s, negative, tiny, above 1 (and, as log gates, -inf)
REGIMES = ("zeros", "ones", "neg", "tiny", "grow")


def _gate(regime, rng, shape):
    u = rng.uniform(0.3, 1, shape)
    if regime == "zeros":
        return np.where(rng.random(shape) < 0.3, 0.0, u)
    if regime == "ones":
        return np.where(rng.random(shape) < 0.5, 1.0, u)
    if regime == "neg":
        return rng.uniform(-1, 1, shape)
    if regime == "tiny":
        return np.where(rng.random(shape) < 0.3, 1e-30, u)
    return rng.uniform(1, 1.5, shape)


def _problem(rng, B, T, H, K, V, regime, init=True, lens=None):
    N = len(lens) if lens is not None else B
    if lens is not None:
        B, T = 1, sum(lens)
    kw = dict(q=rng.standard_normal((B, T, H, K)), k=rng.standard_normal((B, T, H, K)),
              v=rng.standard_normal((B, T, H, V)), gate=_gate(regime, rng, (B, T, H, K)))
    if init:
        kw["initial_state"] = rng.standard_normal((N, H, K, V))
    if lens is not None:
        kw["cu_seqlens"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return kw


def _loss(kw, W, Wf, scale):
    o, s = R.gated_attention_ref(**kw, scale=scale, output_final_state=True)
    return float((o * W).sum() + (s * Wf).sum())


def _fd_check(kw, scale, rng, names):
    """Every element of each input in ``names``: the reference's gradient against the central
    difference of the float64 loss sum(o W) + sum(S_T Wf)."""
    o, s = R.gated_attention_ref(**kw, scale=scale, output_final_state=True)
    W, Wf = rng.standard_normal(o.shape), rng.standard_normal(s.shape)
    grads = R.gated_attention_backward_ref(**kw, do=W, d_final_state=Wf, scale=scale)
    which = dict(q="dq", k="dk", v="dv", gate="dgate", log_gate="dgate",
                 initial_state="dinitial_state")
    for name in names:
        x, got = kw[name], getattr(grads, which[name])
        assert got.shape == x.shape and got.dtype == np.float64, name
        for i in np.ndindex(x.shape):
            if not np.isfinite(x[i]):               # a log gate of -inf: no gradient at all
                assert got[i] == 0, (name, i, got[i])
                continue
            h = 1e-6 * max(1.0, abs(x[i]))
            x0 = x[i]
            x[i] = x0 + h
            up = _loss(kw, W, Wf, scale)
            x[i] = x0 - h
            dn = _loss(kw, W, Wf, scale)
            x[i] = x0
            fd = (up - dn) / (2 * h)
            assert abs(got[i] - fd) <= 1e-6 * max(1.0, abs(fd)), (name, i, got[i], fd)


@pytest.mark.parametrize("regime", REGIMES)
def test_reference_gradients_are_the_finite_differences(regime):
    rng = np.random.default_rng(1)
    kw = _problem(rng, 2, 5, 2, 3, 2, regime)
    if regime == "tiny":             # (a difference step of 1e-6 at a gate of 1e-30 is not local)
        kw["gate"] = np.where(kw["gate"] < 1e-20, 0.5, kw["gate"])
    _fd_check(kw, 0.7, rng, ("q", "k", "v", "gate", "initial_state"))


def test_reference_gradients_of_log_gates_with_minus_inf():
    """log gates with -inf (gate 0): their gradient is exactly 0, every other one finite and the
    finite difference's."""
    rng = np.random.default_rng(2)
    kw = _problem(rng, 1, 6, 2, 3, 2, "zeros")
    with np.errstate(divide="ignore"):
        kw["log_gate"] = np.log(kw.pop("gate"))
    assert np.isinf(kw["log_gate"]).any()
    _fd_check(kw, 1.0, rng, ("q", "k", "log_gate", "initial_state"))


def test_reference_gradients_per_packed_sequence():
    """cu_seqlens (an empty sequence among them): each sequence's gradients are its own, the
    finite differences' too."""
    rng = np.random.default_rng(3)
    kw = _problem(rng, 1, 0, 1, 2, 3, "neg", lens=(3, 0, 4))
    _fd_check(kw, 1.0, rng, ("q", "k", "v", "gate", "initial_state"))
    alone = dict(q=kw["q"][:, 3:], k=kw["k"][:, 3:], v=kw["v"][:, 3:], gate=kw["gate"][:, 3:],
                 initial_state=kw["initial_state"][2:])
    do = rng.standard_normal(kw["v"].shape)
    both = R.gated_attention_backward_ref(**kw, do=do)
    one = R.gated_attention_backward_ref(**alone, do=do[:, 3:])
    np.testing.assert_array_equal(both.dq[:, 3:], one.dq)
    np.testing.assert_array_equal(both.dinitial_state[2:], one.dinitial_state)
    np.testing.assert_array_equal(both.dinitial_state[1], 0)     # empty, no d_final_state


def _contract(name, got, ref, emu):
    r = compare(name, np.asarray(got, np.float64), ref, np.asarray(emu, np.float64))
    assert r.ok, f"{name}: err {r.err:.3e} > bound {r.bound:.3e}"


@pytest.mark.parametrize("regime, log", [(r, log) for r in REGIMES + ("unif",)
                                         for log in (False, True) if not (log and r == "neg")],
                         ids=lambda x: str(x))      # (a log gate is a positive gate's log)
@pytest.mark.parametrize("lens", [None, (37, 0, 5, 64, 1)], ids=["batch", "varlen"])
def test_cpu_backward_meets_the_contract(regime, log, lens):
    """gated_attention_backward_recurrent (chunks of BT = 16 steps recomputed) in float32
    against the float64 reference, within 2x the float32 reference's error + 1e-6 max|ref|; in
    float64, the reference's own values."""
    rng = np.random.default_rng(4)
    kw = _problem(rng, 3, 50, 2, 5, 7, regime if regime != "unif" else "ones", lens=lens)
    if regime == "unif":
        kw["gate"] = rng.uniform(0, 1, kw["gate"].shape)
    if log:
        with np.errstate(divide="ignore"):
            kw["log_gate"] = np.log(kw.pop("gate"))
    do = rng.standard_normal(kw["v"].shape)
    dht = rng.standard_normal(kw["initial_state"].shape)
    ref = R.gated_attention_backward_ref(**kw, do=do, d_final_state=dht, scale=0.5)
    got64 = R.gated_attention_backward_recurrent(**kw, do=do, d_final_state=dht, scale=0.5, BT=16)
    f32 = {n: x.astype(np.float32) if n != "cu_seqlens" else x for n, x in kw.items()}
    do32, dht32 = do.astype(np.float32), dht.astype(np.float32)
    emu = R.gated_attention_backward_ref(**f32, do=do32, d_final_state=dht32, scale=0.5,
                                         dtype=np.float32)
    got = R.gated_attention_backward_recurrent(**f32, do=do32, d_final_state=dht32, scale=0.5,
                                               BT=16)
    for i, name in enumerate(R.Gradients._fields):
        np.testing.assert_allclose(got64[i], ref[i], rtol=1e-10, atol=1e-12, err_msg=name)
        assert got[i].dtype == np.float32, name
        _contract(name, got[i], ref[i], emu[i])


def test_gradients_of_a_zero_gate_are_finite():
    """A gate of exactly 0 (a reset): every gradient finite; the gate's own is generally not 0
    (it is rowsum(G ⊙ S_{t-1}), never recovered by dividing by the gate)."""
    rng = np.random.default_rng(5)
    kw = _problem(rng, 1, 8, 1, 3, 2, "unif")
    kw["gate"][:, 4] = 0.0
    do = rng.standard_normal(kw["v"].shape)
    for fn in (R.gated_attention_backward_ref, R.gated_attention_backward_recurrent):
        g = fn(**kw, do=do)
        for name, x in zip(g._fields, g):
            assert np.isfinite(x).all(), (fn.__name__, name)
        assert (g.dgate[:, 4] != 0).all(), fn.__name__


def test_no_initial_state_gives_no_gradient_for_it():
    rng = np.random.default_rng(6)
    kw = _problem(rng, 2, 4, 1, 2, 2, "unif", init=False)
    do = rng.standard_normal(kw["v"].shape)
    for fn in (R.gated_attention_backward_ref, R.gated_attention_backward_recurrent):
        assert fn(**kw, do=do).dinitial_state is None


@pytest.mark.parametrize("shape", [(0, 5, 2, 3, 2), (2, 0, 2, 3, 2), (2, 5, 0, 3, 2)],
                         ids=["B0", "T0", "H0"])
def test_size_zero_dims(shape):
    B, T, H, K, V = shape
    rng = np.random.default_rng(7)
    kw = _problem(rng, B, T, H, K, V, "unif")
    do = np.zeros((B, T, H, V))
    dht = rng.standard_normal(kw["initial_state"].shape)
    for fn in (R.gated_attention_backward_ref, R.gated_attention_backward_recurrent):
        g = fn(**kw, do=do, d_final_state=dht)
        assert g.dq.shape == (B, T, H, K) and g.dv.shape == (B, T, H, V), fn.__name__
        if T == 0:              # no steps: the final state is the initial one
            np.testing.assert_array_equal(g.dinitial_state, dht)


# a change to valid arguments, the exception and words of its message
BAD = [
    (lambda a: dict(do=None), TypeError, "do must be an array"),
    (lambda a: dict(do=a["do"][..., :-1]), ValueError, r"do must have shape \[B, T, H, V\]"),
    (lambda a: dict(do=a["do"].astype(np.float32)), TypeError, "do must have q's dtype"),
    (lambda a: dict(d_final_state=np.zeros((3, 1, 2, 2))), ValueError, "d_final_state must have"),
    (lambda a: dict(d_final_state=np.zeros((2, 1, 2, 2), np.int32)), TypeError,
     "d_final_state must have dtype"),
    (lambda a: dict(do=list(a["do"])), TypeError, "do must be a NumPy array"),
    (lambda a: dict(gate=None), ValueError, "exactly one of gate"),
]


@pytest.mark.parametrize("fn", [R.gated_attention_backward_ref,
                                R.gated_attention_backward_recurrent], ids=lambda f: f.__name__)
@pytest.mark.parametrize("which", range(len(BAD)))
def test_bad_arguments_raise_before_any_work(fn, which):
    rng = np.random.default_rng(8)
    a = _problem(rng, 2, 4, 1, 2, 2, "unif", init=False)
    a["do"] = rng.standard_normal(a["v"].shape)
    edit, exc, words = BAD[which]
    kw = {**a, **edit(a)}
    before = {n: x.copy() for n, x in kw.items() if isinstance(x, np.ndarray)}
    with pytest.raises(exc, match=words):
        fn(**kw)
    for n, x in before.items():
        assert kw[n].tobytes() == x.tobytes(), n


# ---- the public gated_attention_backward: NumPy (the CPU backward) and CuPy (gda_recurrent_bwd)

# beyond verify's sweep, for the GPU kernel's tiles and groups of them (recurrent_bwd.groups): K padded inside a thread row group (33, 200),
# V not a multiple of the value tile (5, 1000), several kept states (T > 64) and chunks, spans
# ending mid-chunk, float16 with a float32 gate, a log gate of -inf at K = 256
GPU_EXTRA = [
    _verify.Case(2, 300, 2, 33, 5, gate="big", backward=True),
    _verify.Case(1, 150, 2, 200, 1000, dtype="float16", log=True, backward=True),
    _verify.Case(3, 129, 2, 96, 48, gate="grow", init=False, backward=True),
    _verify.Case(2, 77, 3, 64, 64, dtype="float16", g_dtype="float32", gate="tiny", backward=True),
    _verify.Case(2, 64, 1, 256, 130, gate="zeros", log=True, backward=True),
    _verify.varlen_case((130, 0, 1, 64, 65), K=128, V=128, dtype="bfloat16", backward=True),
    _verify.Case(34, 70, 4, 64, 64, backward=True),     # one group of 4 value tiles (136 heads)
]


@pytest.mark.parametrize("case, method", [
    pytest.param(c, m, id=f"{m}-{c.id}") for c in _verify.backward_cases()
    for m in ("recurrent", "chunk")])
def test_public_backward_on_numpy_meets_the_contract(case, method):
    """The CPU backward by each method (the chunked one falling back to the loop where a group
    of sequences is out of its range) within the contract."""
    bad = [r for r in _verify.run_case(case, "numpy", method=method) if not r.ok]
    assert not bad, bad


@pytest.mark.parametrize("regime", REGIMES + ("unif",))
@pytest.mark.parametrize("BT", [8, 16, 32])
def test_cpu_chunked_backward_itself_is_the_loop(regime, BT):
    """The NumPy chunked form's own gradients (no fall-back: in range) for packed sequences with
    an empty one and partial chunks: float64 equal to the reference to rounding, float32 within
    the contract; out of range ('grow': gates above 2^(1/8)) _backward_chunks declines."""
    rng = np.random.default_rng(15)
    kw = _problem(rng, 1, 0, 2, 6, 5, regime, lens=(37, 0, 5, 64, 1))
    kw["do"] = rng.standard_normal(kw["v"].shape)
    kw["d_final_state"] = rng.standard_normal(kw["initial_state"].shape)
    ref = R.gated_attention_backward_ref(**kw)
    got = R.gated_attention_backward_chunked(**kw, BT=BT)
    for name, x, r in zip(ref._fields, got, ref):
        np.testing.assert_allclose(x, r, rtol=1e-9, atol=1e-9 * np.abs(r).max(), err_msg=name)
    f32 = {n: x if n == "cu_seqlens" else x.astype(np.float32) for n, x in kw.items()}
    emu = R.gated_attention_backward_ref(**f32, dtype=np.float32)
    got = R.gated_attention_backward_chunked(**f32, BT=BT)
    for name, x, r, e in zip(ref._fields, got, ref, emu):
        _contract(name, x, r, e)
    if regime == "grow":                    # (gates above 2^(1/8): that was the loop's)
        x = [kw[n][0][:, None] for n in ("q", "k", "v", "gate", "do")]    # [T, 1, H, *]
        S = np.zeros((1, 2, 6, 5))
        assert R._backward_chunks(*x, S, S.copy(), [x[0].shape[0]], BT) is None


@pytest.mark.gpu
@pytest.mark.parametrize("case, method", [
    pytest.param(c, m, id=f"{m}-{c.id}") for c in _verify.backward_cases() + GPU_EXTRA
    for m in ("recurrent", "chunk")])
def test_gpu_backward_meets_the_contract(case, method):
    """Every gradient (poisoned outputs: an unwritten element is NaN) within the contract, by
    each GPU method (the chunked one falling back to the loop where its guard is hit)."""
    bad = [r for r in _verify.run_case(case, "cupy", method=method) if not r.ok]
    assert not bad, bad


# the chunked backward without its fall-back: in range, its own gradients; out of range, the flag
CHUNK_OWN = [
    _verify.Case(2, 200, 3, 24, 24, gate="zeros", backward=True),
    _verify.Case(2, 130, 2, 64, 64, gate="neg", log=False, backward=True),
    _verify.Case(2, 129, 2, 100, 36, gate="tiny", dtype="float16", g_dtype="float32",
                 backward=True),
    _verify.Case(1, 300, 2, 256, 512, dtype="bfloat16", log=True, backward=True),
    _verify.Case(3, 64, 2, 5, 1000, gate="ones", init=False, backward=True),
    _verify.Case(1, 1, 1, 1, 1, backward=True),
    _verify.varlen_case((130, 0, 1, 64, 65), K=128, V=128, dtype="bfloat16", backward=True),
    _verify.varlen_case((1, 17, 64, 300, 0), K=40, V=24, log=True, backward=True),
    _verify.varlen_case((0,), K=8, V=8, backward=True),
]


# the boundary scan's forms (chunk_bwd.Config's SCAN, PLANES): two kernels, one, one from the
# planes (bfloat16 inputs)
SCANS = {"local-states": (False, False), "scan": (True, False), "planes": (True, True)}


def _need_hopper():
    """Skip, where the GPU is not a Hopper one (a wgmma kernel's test)."""
    from cupy_gda import _launch
    if not _launch.hopper():
        pytest.skip("a Hopper GPU's kernel (sm_90a's wgmma)")


@pytest.mark.gpu
@pytest.mark.parametrize("case, scan", [
    pytest.param(c, m, id=f"{c.id}-{m}") for c in CHUNK_OWN
    for m in (*SCANS, "planes-dv", "planes-dv-wg")
    if m in ("local-states", "scan") or c.dtype == "bfloat16" and (m != "planes-dv-wg" or c.K % 64 == 0)])
def test_gpu_chunked_backward_itself_meets_the_contract(case, scan):
    """The chunked form's own gradients (the reverse loop left out), with the guard not hit, with
    each form of the boundary scan (SCANS), and from the planes with the scan's backward half
    and dv as one kernel (planes-dv: SCAN_DV, chunks of 64 steps, a Hopper GPU), there with
    the S0 by scan_o's wgmma form too (planes-dv-wg: SCAN_O_WG, whole key tiles; the planes of
    q A and k D in panels, PANELS, as the plans take them there)."""
    if scan.startswith("planes-dv"):
        _need_hopper()
        _check_chunked_own(case, SCAN=True, PLANES=True, BT=64, SCAN_DV=True,
                           SCAN_O_WG=scan == "planes-dv-wg", PANELS=scan == "planes-dv-wg")
        return
    fused, planes = SCANS[scan]
    _check_chunked_own(case, SCAN=fused, PLANES=planes)


@pytest.mark.gpu
@pytest.mark.parametrize("what", ["DV_TERMS", "ROWS_TERMS"])
@pytest.mark.parametrize("case, scan", [
    pytest.param(c, m, id=f"{c.id}-{m}") for c in CHUNK_OWN if c.dtype != "float32"
    for m in ("scan", "planes") if m != "planes" or c.dtype == "bfloat16"])
def test_gpu_chunked_backward_in_three_terms_meets_the_contract(case, scan, what):
    """dv's entry, or rows' S0 and E, with their float32 operands in three bfloat16 terms, not
    the two of half inputs' default (Config.DV_TERMS or ROWS_TERMS = 3, as with
    chunk_bwd.DV_TWO_TERMS or ROWS_TWO_TERMS off; docs/perf-notes.md v36, v37), the other in two:
    every gradient within the contract (the defaults, both in two, are every other test's)."""
    fused, planes = SCANS[scan]
    _check_chunked_own(case, SCAN=fused, PLANES=planes, **{what: 3})


def _check_chunked_own(case, **cfg):
    """The chunked backward's own gradients (no fall-back) of Case ``case``, its Config (config's)
    with ``cfg`` replaced, against the references; the guard not hit."""
    import cupy
    from cupy_gda import chunk_bwd
    from cupy_gda._checks import check_backward
    args = _verify.make_inputs(case, 0)
    do, dht = _verify.backward_inputs(case, args, 0)
    ref, emu = _verify.backward_references(case, args, do, dht)
    dev = {n: cupy.asarray(x) for n, x in args.items()}
    g = dev.get("gate", dev.get("log_gate"))
    cu = dev.get("cu_seqlens")
    p = check_backward("t", dev["q"], dev["k"], dev["v"], dev.get("gate"), dev.get("log_gate"),
                       cupy.asarray(do), dev.get("initial_state"), cupy.asarray(dht), cu,
                       cpu=False)
    varlen = cu is not None
    plan = chunk_bwd.BackwardPlan(p, varlen, varlen and cu.dtype == np.int64,
                                  chunk_bwd.config(p, varlen)._replace(**cfg))
    grads, flag = plan.run(dev["q"], dev["k"], dev["v"], g, cupy.asarray(do), 1.0,
                           dev.get("initial_state"), cupy.asarray(dht), cu, fallback=False)
    assert int(flag[0]) == 0
    for name, x, r, e in zip(ref._fields, grads, ref, emu):
        if r is None:
            assert x is None
            continue
        res = compare(name, cupy.asnumpy(x), r, e)
        assert res.ok, res


# the forward from the backward's stages (chunk_bwd.ForwardPlan): bfloat16 inputs, whole and
# cut tiles, two key tiles, the gate kinds the guard keeps, bf16 gates, packed sequences, T = 1
FORWARD_FROM_PLANES = [
    _verify.Case(1, 300, 2, 256, 512, dtype="bfloat16", log=True),
    _verify.Case(2, 200, 3, 128, 128, dtype="bfloat16", gate="neg"),
    _verify.Case(2, 129, 2, 100, 72, dtype="bfloat16", gate="zeros", init=False),
    _verify.Case(1, 1, 1, 64, 64, dtype="bfloat16"),
    _verify.varlen_case((130, 0, 1, 64, 65), K=128, V=128, dtype="bfloat16"),
    *(_verify.Case(1, 150, 2, 192, 64, dtype="bfloat16", gate=g)
      for g in ("unif", "ones", "tiny")),
    _verify.Case(1, 100, 2, 256, 128, dtype="bfloat16", g_dtype="bfloat16", log=True),
    _verify.Case(2, 260, 2, 128, 256, dtype="bfloat16", gate="tiny"),
]


def _forward_plan_inputs(case, seed=0):
    """(Problem, ForwardPlan's call arguments but the flag, the float64 and float32 references)
    of forward Case ``case``; the final state asked for."""
    import cupy
    from cupy_gda._checks import check_forward
    args = _verify.make_inputs(case, seed)
    ref, emu = _verify.references(case, args)
    dev = {n: cupy.asarray(x) for n, x in args.items()}
    g, cu, h0 = dev.get("gate", dev.get("log_gate")), dev.get("cu_seqlens"), dev.get("initial_state")
    p = check_forward("t", dev["q"], dev["k"], dev["v"], dev.get("gate"), dev.get("log_gate"), h0,
                      cu, cpu=False)
    return p, (dev["q"], dev["k"], dev["v"], g, 1.0, h0, cu, True, None), ref, emu


def _chunks_of_64(monkeypatch, on, mc=False):
    """Where ``on``, every plan made after takes chunks of 64 steps (chunk_bwd.CHUNKS_64 at 0:
    the small cases here would take 32) and, on a Hopper GPU, scan_o's wgmma form where it can
    (USE_SCAN_O_WG on: SCAN_O_WG needs chunks of 64); ``mc``: and its clusters where it can
    (USE_SCAN_O_MC on: 2, 4 or 8 value tiles, v42)."""
    from cupy_gda import chunk_bwd
    if on:
        monkeypatch.setattr(chunk_bwd, "CHUNKS_64", 0)
        monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_WG", True)
        monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_MC", mc)


@pytest.mark.gpu
@pytest.mark.parametrize("keep, scan_o, bt64, mc", [
    (False, True, False, False), (False, True, True, False),
    pytest.param(False, True, True, True, marks=pytest.mark.clusters),
    (False, False, False, False), (True, False, False, False), (True, True, True, False)],
    ids=["terms2-scan_o", "terms2-scan_o-bt64", "terms2-scan_o-mc", "terms2", "keep-terms3",
         "keep-terms3-wg"])
@pytest.mark.parametrize("case", FORWARD_FROM_PLANES, ids=lambda c: c.id)
def test_gpu_forward_from_the_backward_stages(case, keep, scan_o, bt64, mc, monkeypatch):
    """chunk_bwd.ForwardPlan, the one that keeps none (operands in two bfloat16 terms), by
    scan_o (the scan and o as one kernel, where it fits: every case here on a Hopper GPU, its
    rule's minimum of blocks set aside; bt64: chunks of 64 steps, and there by wgmma at planes
    of 128 or 256 keys, SCAN_O_WG; mc: and as clusters sharing the planes at 2, 4 or 8 value
    tiles, SCAN_O_MC) and by the scan and dv's entry (USE_SCAN_O off), and the one
    that can keep its stages (three; keep-terms3-wg: with scan_dv on for its backward, by
    scan_o's wgmma form storing each S0 where K is whole key tiles of 128 or 256): o and the
    final state within the contract (poisoned outputs: the plan allocates them unwritten), the
    guard not hit (its fall-back not run)."""
    import cupy
    from cupy_gda import _launch, chunk_bwd
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O", scan_o)
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_DV", keep and bt64)
    monkeypatch.setattr(chunk_bwd, "SCAN_DV_FROM", 0)
    _chunks_of_64(monkeypatch, bt64, mc)
    p, call, ref, emu = _forward_plan_inputs(case)
    flag = cupy.full((1,), 7, np.int32)
    plan = chunk_bwd.ForwardPlan(p, call[6] is not None, False, keep)
    assert plan.cfg.TERMS == (3 if keep else 2)
    assert plan.cfg.BT == 64 or not bt64
    assert plan.cfg.SCAN_O_WG == (bt64 and _launch.hopper() and chunk_bwd.planes(p)[0] in (128, 256)
                                  and (not keep or p.K % 64 == 0))
    if scan_o and not keep and _launch.device_limits()[1] >= chunk_bwd.scan_o_smem(p, plan.cfg):
        assert plan.scan_o
    assert plan.scan_o == (scan_o and chunk_bwd.scan_o_fits(p, plan.cfg, call[6] is not None))
    assert plan.cfg.SCAN_O_MC == (mc and plan.scan_o and plan.cfg.SCAN_O_WG
                                  and chunk_bwd.tiles(p.V) in (2, 4, 8))
    o, ht = plan(*call, flag=flag)
    assert int(flag[0]) == 0
    for name, x, r, e in zip(("o", "state"), (o, ht), ref, emu):
        res = compare(name, cupy.asnumpy(x.astype(np.float32) if name == "o" else x), r, e)
        assert res.ok, res


@pytest.mark.gpu
@pytest.mark.clusters
@pytest.mark.parametrize("case", [c for c in FORWARD_FROM_PLANES
                                  if c.K > 64 and c.K != 192 and -(-c.V // 64) in (2, 4, 8)],
                         ids=lambda c: c.id)
def test_gpu_scan_o_clusters_are_bit_for_bit_its_wgmma_form(case, monkeypatch):
    """scan_o's wgmma form as clusters (SCAN_O_MC, v42: each chunk's planes copied once into
    the cluster's blocks, from planes pack wrote as they lie there) puts the same bytes in each
    block's shared memory as the form without (each block copying them from planes in rows),
    and runs the same products: o and the final state bit for bit the same (clusters of 8, 4
    and 2 value tiles, cut key and value tiles, packed sequences; a Hopper GPU)."""
    import cupy
    from cupy_gda import _launch, chunk_bwd
    if not _launch.hopper():
        pytest.skip("scan_o's wgmma form needs a Hopper GPU (sm_90a)")
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0)
    p, call, _, _ = _forward_plan_inputs(case)
    got = []
    for mc in (False, True):
        _chunks_of_64(monkeypatch, True, mc)
        plan = chunk_bwd.ForwardPlan(p, call[6] is not None, False)
        assert plan.scan_o and plan.cfg.SCAN_O_WG and plan.cfg.SCAN_O_MC == mc
        flag = cupy.zeros((1,), np.int32)
        got.append(plan(*call, flag=flag))
        assert int(flag[0]) == 0
    for x, y in zip(*got):
        assert cupy.array_equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("case, wg", [
    *((c, False) for c in FORWARD_FROM_PLANES),
    *((c, True) for c in FORWARD_FROM_PLANES if -(-c.K // 64) * 64 in (128, 256))],
    ids=lambda x: x.id if hasattr(x, "id") else ("mma", "wgmma")[x])
def test_gpu_scan_o_producer_is_bit_for_bit_scan_o(case, wg, monkeypatch):
    """scan_o fed by its producer warps (SCAN_O_PRODUCER: 2 or 4 warps more copy each chunk's
    operands, on mbarriers; perf-notes v49) runs the same products in the same order as scan_o
    without them: o and the final state bit for bit the same (every forward-from-the-planes
    case: cut tiles, packed sequences, v's rows from v and from its plane, 2 warps above 128
    keys and 4 at 128 or fewer; sm_90 on). wgmma: scan_o's wgmma form (chunks of 64; the
    cases whose planes are of 128 or 256 keys, planes_config's rule), with a warpgroup of
    producer warps whose registers setmaxnreg gives to the products (v52); where v's rows come
    from v (VROWS), W split by scores and copied as it lies, not split by scan_o (W_SPLIT, v58):
    the same words."""
    import cupy
    from cupy_gda import chunk_bwd
    if int(cupy.cuda.Device().compute_capability) < 90:
        pytest.skip("scan_o's producer warps need sm_90 (their mbarriers)")
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0)
    _chunks_of_64(monkeypatch, wg)
    p, call, _, _ = _forward_plan_inputs(case)
    got = []
    for on in (False, True):
        monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_PRODUCER", on)
        plan = chunk_bwd.ForwardPlan(p, call[6] is not None, False)
        assert plan.scan_o and plan.cfg.SCAN_O_WG == wg
        warps = chunk_bwd.scan_o_warps(p, plan.cfg) * on    # (scan_o: the last stage)
        assert plan.stages[-1].block == chunk_bwd.NTF + 32 * warps
        flag = cupy.zeros((1,), np.int32)
        got.append(plan(*call, flag=flag))
        assert int(flag[0]) == 0
    for x, y in zip(*got):
        assert cupy.array_equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("bt64", ["", "bt64", pytest.param("bt64-mc", marks=pytest.mark.clusters)],
                         ids=["bt-config", "bt64", "bt64-mc"])
@pytest.mark.parametrize("case", FORWARD_FROM_PLANES[:2], ids=lambda c: c.id)
def test_gpu_forward_from_planes_takes_the_scale(case, bt64, monkeypatch):
    """The forward that keeps nothing (scan_o where it fits, its rule's minimum of blocks set
    aside; by wgmma on a Hopper GPU with chunks of 64 steps; bt64-mc: and as clusters) at a
    scale other than 1, which pack bakes into q A's planes and scan_o (with W_SPLIT scores) into
    W as it splits it: o and the final state within the contract against the references at that
    scale."""
    import cupy
    from cupy_gda import chunk_bwd
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0)
    _chunks_of_64(monkeypatch, bool(bt64), bt64 == "bt64-mc")
    p, call, _, _ = _forward_plan_inputs(case)
    args = _verify.make_inputs(case, 0)
    scale = 0.37
    ref, emu = (R.gated_attention_ref(**args, scale=scale, output_final_state=True, dtype=dt)
                for dt in (np.float64, np.float32))
    emu = (emu[0].astype(args["q"].dtype), emu[1])
    flag = cupy.zeros((1,), np.int32)
    o, ht = chunk_bwd.ForwardPlan(p, call[6] is not None, False)(*call[:4], scale, *call[5:],
                                                                flag=flag)
    assert int(flag[0]) == 0
    for name, x, r, e in zip(("o", "state"), (o, ht), ref, emu):
        res = compare(name, cupy.asnumpy(x.astype(np.float32) if name == "o" else x), r, e)
        assert res.ok, res


@pytest.mark.gpu
@pytest.mark.parametrize("what", ["big-gate", "grow-gate", "nan-q", "large-k", "large-v", "nan-v",
                                  "large-state",
                                  "varlen-big-gate", "bt64-big-gate", "bt64-large-state",
                                  *(pytest.param(w, marks=pytest.mark.clusters)
                                    for w in ("bt64-mc-big-gate", "bt64-mc-large-state"))])
def test_gpu_forward_from_planes_guard_falls_back(what, monkeypatch):
    """Inputs or states outside the range the planes are exact in set the flag, and the chunk
    forward (the fall-back) then overwrites o and the final state: bit for bit its own result
    (NaN where it has NaN), within the contract where the inputs are finite. (scan_o's guard:
    its rule's minimum of blocks set aside; bt64: chunks of 64 steps at 128 keys, scan_o by
    wgmma on a Hopper GPU; bt64-mc: and as clusters of 2, at 128 value columns.)"""
    import cupy
    from cupy_gda import _launch, chunk, chunk_bwd
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0)
    bt64, mc = what.startswith("bt64"), what.startswith("bt64-mc")
    _chunks_of_64(monkeypatch, bt64, mc)
    what = what.removeprefix("bt64-").removeprefix("mc-")
    gate = {"big-gate": "big", "grow-gate": "grow", "varlen-big-gate": "big"}.get(what, "unif")
    case = (_verify.varlen_case((130, 0, 70), K=192, V=64, dtype="bfloat16", gate=gate)
            if what.startswith("varlen") else
            _verify.Case(2, 150, 2, 128 if bt64 else 192, 128 if mc else 64, dtype="bfloat16",
                         gate=gate))
    p, call, ref, emu = _forward_plan_inputs(case, seed=3)
    q, k, v, g, scale, h0, cu, _, _ = call
    if what == "nan-q":
        q[0, 7, 1, 0] = np.nan
    elif what == "large-k":                             # (VROWS: scores' guard; the last key
        k[1, 149, 0, 191] = 2.0 ** 21                   #  of the last row)
    elif what == "large-v":
        v[1, 3, 0, 0] = 2.0 ** 21
    elif what == "nan-v":                               # (scan_o's guard on v's rows: VROWS)
        v[1, 140, 1, 63] = np.nan
    elif what == "large-state":
        h0[1, 0, 5, 5] = 2.0 ** 41
    flag = cupy.zeros((1,), np.int32)
    plan = chunk_bwd.ForwardPlan(p, cu is not None, False)
    assert plan.cfg.SCAN_O_MC == (mc and _launch.hopper())
    o, ht = plan(*call, flag=flag)
    assert int(flag[0]) == 1
    o_cf, ht_cf = chunk.plan(p, False)(*call)
    for x, y in ((o, o_cf), (ht, ht_cf)):
        assert cupy.array_equal(x, y, equal_nan=True)
    if what in ("big-gate", "grow-gate", "varlen-big-gate"):
        for name, x, r, e in zip(("o", "state"), (o, ht), ref, emu):
            res = compare(name, cupy.asnumpy(x.astype(np.float32) if name == "o" else x), r, e)
            assert res.ok, res


@pytest.mark.gpu
@pytest.mark.parametrize("case", [FORWARD_FROM_PLANES[i] for i in (0, 2, 4)], ids=lambda c: c.id)
def test_gpu_forward_from_planes_reads_v_rows_at_any_alignment(case, monkeypatch):
    """scan_o copying v's rows from v itself (VROWS, v43) by 16-byte copies where v is 16-byte
    aligned and by 2-byte loads where it is not (v a contiguous view 2 bytes into its
    allocation): the same bytes in shared memory as the plan that reads pack's plane of v
    (USE_VROWS off; zeros past the rows and past V), and scores writing the planes of q A and k
    D as pack writes them (v44: the same block products; zeros past K, a sequence of no rows),
    so o and the final state bit for bit the same all three ways, and within the contract
    (whole and cut value and key tiles, packed sequences)."""
    import cupy
    from cupy_gda import chunk_bwd
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0)
    p, call, ref, emu = _forward_plan_inputs(case)
    v = call[2]
    buf = cupy.empty(v.size + 8, v.dtype)
    off = buf[1:v.size + 1].reshape(v.shape)            # (2 bytes past a 256-byte allocation)
    off[...] = v
    assert off.data.ptr % 16 == 2 and off.flags.c_contiguous
    got = []
    for vrows, vin in ((True, v), (True, off), (False, v)):
        monkeypatch.setattr(chunk_bwd, "USE_VROWS", vrows)
        plan = chunk_bwd.ForwardPlan(p, call[6] is not None, False)
        assert plan.scan_o and plan.cfg.VROWS == vrows
        flag = cupy.zeros((1,), np.int32)
        got.append(plan(*call[:2], vin, *call[3:], flag=flag))
        assert int(flag[0]) == 0
    for other in got[1:]:
        for x, y in zip(got[0], other):
            assert cupy.array_equal(x, y)
    for name, x, r, e in zip(("o", "state"), got[0], ref, emu):
        res = compare(name, cupy.asnumpy(x.astype(np.float32) if name == "o" else x), r, e)
        assert res.ok, res


# the backward from the forward's kept stages (BackwardPlan(keep=True)): whole and cut tiles, a
# scale, packed sequences, and gates out of the guard's range (the forward's flag carried)
KEPT_CASES = [
    (_verify.Case(1, 300, 2, 256, 512, dtype="bfloat16", log=True), 1.0),
    (_verify.Case(2, 129, 2, 100, 72, dtype="bfloat16", gate="zeros"), 0.5),
    (_verify.varlen_case((130, 0, 1, 64, 65), K=128, V=128, dtype="bfloat16", gate="neg"), 1.0),
    (_verify.Case(2, 150, 2, 192, 64, dtype="bfloat16", gate="big"), 1.0),
]


def _kept_inputs(case, scale, seed):
    """(Problem, varlen, ForwardPlan.run's arguments but the flag, BackwardPlan.run's) of Case
    ``case`` at ``scale``, the final state asked for; do and d_final_state random (``seed``)."""
    import cupy
    p, call, _, _ = _forward_plan_inputs(case)
    q, k, v, g, _, h0, cu, _, _ = call
    rng = np.random.default_rng(seed)
    do = cupy.asarray(rng.standard_normal(v.shape).astype(_verify._dtype(case.dtype)))
    dht = cupy.asarray(rng.standard_normal((p.N, p.H, p.K, p.V)).astype(np.float32))
    return (p, cu is not None, (q, k, v, g, scale, h0, cu, True, None),
            (q, k, v, g, do, scale, h0, dht, cu))


def _lean_config(p, varlen):
    """The Config of the BackwardPlan that keeps nothing, as BackwardPlan makes it, from
    planes_config (the planes at any size)."""
    from cupy_gda import chunk_bwd
    cfg = chunk_bwd.planes_config(p, varlen)
    so = chunk_bwd.use_scan_o_wg() and chunk_bwd.scan_o_s0(p, cfg, varlen)
    cfg = cfg._replace(SCAN_DV=chunk_bwd.scan_dv_fits(p, cfg, varlen), SCAN_O_WG=so)
    return cfg._replace(PANELS=chunk_bwd.panels(p, cfg))    # (the planes in panels, v75)


@pytest.mark.gpu
@pytest.mark.parametrize("scan_dv", ["", "scan_dv", "scan_dv-wg"])
@pytest.mark.parametrize("case, scale", KEPT_CASES, ids=lambda c: getattr(c, "id", str(c)))
def test_gpu_backward_from_the_kept_forward(case, scale, scan_dv, monkeypatch):
    """A ForwardPlan call's kept stages (S0, A_end, W, the planes) in place of the backward's
    own: the same products in the same order, so its gradients are bit for bit those of the
    backward from the planes (poisoned outputs), the guard's flag the forward's (and then both
    are the reverse loop's); scan_dv: both with chunks of 64 steps and, where it fits (a
    Hopper GPU, planes of 128 or 256 keys; its rule's minimum of blocks set aside), E and dv by
    scan_dv (USE_SCAN_DV on); scan_dv-wg: and the S0, kept or the backward's own, by scan_o's
    wgmma form where K is whole key tiles (USE_SCAN_O_WG on, v41)."""
    import cupy
    from cupy_gda import _launch, chunk_bwd
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_DV", bool(scan_dv))    # (on by default: v69)
    if scan_dv:
        monkeypatch.setattr(chunk_bwd, "SCAN_DV_FROM", 0)
        monkeypatch.setattr(chunk_bwd, "CHUNKS_64", 0)
        monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_WG", scan_dv == "scan_dv-wg")
    p, varlen, call, args = _kept_inputs(case, scale, 8)
    fwd_flag = cupy.zeros((1,), np.int32)
    _, _, kept = chunk_bwd.ForwardPlan(p, varlen, False, True).run(*call, flag=fwd_flag, keep=True)
    cfg = _lean_config(p, varlen)
    so = cfg.SCAN_O_WG
    assert cfg.SCAN_DV == (bool(scan_dv) and _launch.hopper() and chunk_bwd.planes(p)[0] in (128, 256))
    assert so == (cfg.SCAN_DV and scan_dv == "scan_dv-wg" and p.K % 64 == 0) == cfg.PANELS
    fplan = chunk_bwd.ForwardPlan(p, varlen, False, True)
    assert fplan.cfg.SCAN_O_WG == fplan.scan_o == fplan.cfg.PANELS == so
    want, wflag = chunk_bwd.BackwardPlan(p, varlen, False, cfg).run(*args)
    kplan = chunk_bwd.BackwardPlan(p, varlen, False, keep=True)
    assert kplan.cfg == cfg._replace(SCAN_O_WG=False)     # (no S0 of its own; the panels)
    got, gflag = kplan.run(*args, kept=kept)
    hit = int(case.gate == "big")
    assert int(fwd_flag[0]) == int(wflag[0]) == int(gflag[0]) == hit
    for name, a, b in zip(R.Gradients._fields, got, want):
        assert cupy.array_equal(a, b, equal_nan=True), name
    with pytest.raises(ValueError, match="kept stages of .* at scale"):
        chunk_bwd.plan(p, varlen, False, keep=True).run(*args[:5], 2 * scale, *args[6:], kept=kept)
    with pytest.raises(ValueError, match="keep=True takes kept="):
        chunk_bwd.plan(p, varlen, False).run(*args, kept=kept)


@pytest.mark.gpu
@pytest.mark.parametrize("case, scale", KEPT_CASES, ids=lambda c: getattr(c, "id", str(c)))
def test_gpu_planes_of_q_and_k_by_scores_are_pack_s(case, scale, monkeypatch):
    """scores writing the planes of q A and k D, A_end and the guard on q, k and g (QK_BY_SCORES,
    v75: in the backward by scan_dv that keeps nothing and the forward that keeps its stages by
    scan_o's wgmma form) gives every output bit for bit as pack writing them (USE_QK_BY_SCORES
    off): the lean backward's gradients and flag, the keeping forward's o, final state and
    flag, and the gradients from its kept stages (poisoned outputs); on a Hopper GPU, chunks of
    64, scan_dv and scan_o at any number of blocks (scan_dv where the planes are of 128 or 256
    keys, K = 100 too, there with the scan's S0 and its planes' keys past K; scan_o where K is
    whole key tiles, there the planes of q A and k D in panels, PANELS; K = 192 takes neither,
    and the same plans either way)."""
    import cupy
    from cupy_gda import chunk_bwd
    _need_hopper()
    monkeypatch.setattr(chunk_bwd, "SCAN_DV_FROM", 0)
    monkeypatch.setattr(chunk_bwd, "CHUNKS_64", 0)
    p, varlen, call, args = _kept_inputs(case, scale, 9)
    out = {}
    for qk in (False, True):
        monkeypatch.setattr(chunk_bwd, "USE_QK_BY_SCORES", qk)
        plan = chunk_bwd.BackwardPlan(p, varlen, False, _lean_config(p, varlen))
        fplan = chunk_bwd.ForwardPlan(p, varlen, False, True)
        dv = chunk_bwd.planes(p)[0] in (128, 256)      # (K = 100 too: the scan's S0)
        assert plan.cfg.SCAN_DV == dv and fplan.scan_o == (dv and p.K % 64 == 0)
        assert plan.cfg.PANELS == fplan.cfg.PANELS == (qk and fplan.scan_o)
        order = [e for _, e in chunk_bwd.backward_stages(plan.cfg)]
        assert (order[1] == "scores") == (qk and dv)
        assert chunk_bwd.qk_by_scores(fplan.cfg, fwd=True) == (qk and fplan.scan_o)
        fwd_flag = cupy.zeros((1,), np.int32)
        o, ht, kept = fplan.run(*call, flag=fwd_flag, keep=True)
        grads, flag = plan.run(*args)
        kgrads, kflag = chunk_bwd.BackwardPlan(p, varlen, False, keep=True).run(*args, kept=kept)
        out[qk] = [o, ht, fwd_flag, *grads, flag, *kgrads, kflag]
    for i, (a, b) in enumerate(zip(out[False], out[True])):
        assert (a is None) == (b is None), i
        assert a is None or cupy.array_equal(a, b, equal_nan=True), i


def test_keep_states_on_the_cpu_keeps_none():
    """keep_states: the CPU forward keeps nothing (None after o, and after the final state), the
    same o; the backward takes states=None, and refuses anything else before any work."""
    args = _verify.make_inputs(_verify.Case(2, 40, 2, 8, 6), 2)
    o = cupy_gda.gated_attention(**args)
    o1, st = cupy_gda.gated_attention(**args, keep_states=True)
    o2, ht, st2 = cupy_gda.gated_attention(**args, keep_states=True, output_final_state=True)
    assert st is None and st2 is None and ht.shape == args["initial_state"].shape
    assert np.array_equal(o, o1) and np.array_equal(o, o2)
    do = np.ones_like(args["v"])
    want = cupy_gda.gated_attention_backward(**args, do=do)
    got = cupy_gda.gated_attention_backward(**args, do=do, states=None)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    with pytest.raises(TypeError, match="states must be the ChunkStates of gated_attention"):
        cupy_gda.gated_attention_backward(**args, do=do, states=object())
    with pytest.raises(ValueError, match="states are a GPU forward's"):
        cupy_gda.gated_attention_backward(**args, do=do, states=cupy_gda.ChunkStates(None, None))


@pytest.mark.gpu
def test_gpu_keep_states_through_the_api():
    """gated_attention(keep_states=True) at a shape of the forward from the planes keeps its
    stages (their bytes: chunk_bwd.forward_bytes); o and the final state, and those of the call
    that keeps none (two bfloat16 terms an operand, not three), within the contract; the backward
    given them is bit for bit the planes backward's, and so is one given them rebuilt from their
    arrays (as the torch adapter carries them); another scale's backward refuses them, and arrays
    of other sizes; a shape of gda_chunk_fwd keeps none (gpu_kept_bytes says so beforehand)."""
    import cupy
    from cupy_gda import _api, _dispatch, chunk_bwd
    from cupy_gda._checks import check_forward
    case = _verify.Case(4, 2048, 4, 192, 192, dtype="bfloat16")
    args = _verify.make_inputs(case, 6)
    dev = {n: cupy.asarray(x) for n, x in args.items()}
    p = check_forward("t", dev["q"], dev["k"], dev["v"], dev["gate"], None,
                      dev["initial_state"], None, cpu=False)
    assert _dispatch.planes_forward(p)
    o, ht, states = cupy_gda.gated_attention(**dev, output_final_state=True, keep_states=True)
    assert isinstance(states, cupy_gda.ChunkStates) and states.nbytes == chunk_bwd.forward_bytes(p)
    assert _api.gpu_kept_bytes("t", p, "auto") == states.nbytes
    assert states.flag.dtype == np.int32 and states.flag.shape == (1,)
    o2, ht2 = cupy_gda.gated_attention(**dev, output_final_state=True)
    refs = _verify.references(case, args)
    for name, x, x2, r, e in zip(("o", "state"), (o, ht), (o2, ht2), *refs):
        for y in (x, x2):
            res = compare(name, cupy.asnumpy(y.astype(np.float32)), r, e)
            assert res.ok, res
    rng = np.random.default_rng(9)
    do = cupy.asarray(rng.standard_normal(dev["v"].shape).astype(_verify._dtype("bfloat16")))
    dht = cupy.asarray(rng.standard_normal(ht.shape).astype(np.float32))
    got = cupy_gda.gated_attention_backward(**dev, do=do, d_final_state=dht, states=states)
    want, _ = chunk_bwd.BackwardPlan(p, False, False, chunk_bwd.planes_config(p)).run(
        dev["q"], dev["k"], dev["v"], dev["gate"], do, 1.0, dev["initial_state"], dht)
    rebuilt = cupy_gda.gated_attention_backward(
        **dev, do=do, d_final_state=dht,
        states=cupy_gda.ChunkStates(states.workspace, states.flag))
    for name, a, b, c in zip(R.Gradients._fields, got, want, rebuilt):
        assert cupy.array_equal(a, b, equal_nan=True), name
        assert cupy.array_equal(c, b, equal_nan=True), name
    with pytest.raises(ValueError, match="states were kept by another call's forward"):
        cupy_gda.gated_attention_backward(**dev, do=do, scale=0.5, states=states)
    with pytest.raises(ValueError, match=r"states.workspace must be the float32 \["):
        cupy_gda.gated_attention_backward(**dev, do=do, states=cupy_gda.ChunkStates(
            states.workspace[:-1], states.flag))
    with pytest.raises(ValueError, match=r"states.flag must be the int32 \[1\]"):
        cupy_gda.gated_attention_backward(**dev, do=do, states=cupy_gda.ChunkStates(
            states.workspace, states.flag.astype(np.int64)))
    small = {n: cupy.asarray(x) for n, x in _verify.make_inputs(_verify.Case(2, 600, 2, 64, 64), 6).items()}
    assert cupy_gda.gated_attention(**small, keep_states=True)[1] is None
    ps = check_forward("t", small["q"], small["k"], small["v"], small["gate"], None, None, None,
                       cpu=False)
    assert _api.gpu_kept_bytes("t", ps, "auto") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [None, (2100, 0, 1, 6200)], ids=["dense", "varlen"])
def test_gpu_auto_forward_runs_from_the_planes(lens, monkeypatch):
    """gated_attention picks the forward from the planes by _dispatch.planes_forward (the fast
    path keeps it), with and without the final state and out; o, the state within the contract."""
    import cupy
    from cupy_gda import _api, _dispatch, chunk_bwd
    case = (_verify.Case(4, 2048, 4, 192, 192, dtype="bfloat16") if lens is None else
            _verify.varlen_case(lens, H=15, K=129, V=129, dtype="bfloat16"))
    p, _, ref, emu = _forward_plan_inputs(case, 4)      # (its references, computed once)
    dev = {n: cupy.asarray(x) for n, x in _verify.make_inputs(case, 4).items()}
    assert _dispatch.planes_forward(p, lens is not None)
    monkeypatch.setattr(_api, "_FAST", {})
    o, ht = cupy_gda.gated_attention(**dev, output_final_state=True)
    out = cupy.full(o.shape, np.nan, o.dtype)
    o2 = cupy_gda.gated_attention(**dev, out=out)
    assert o2 is out and cupy.array_equal(o2, o)
    if lens is None:
        assert [type(x) for x in _api._FAST.values()] == [chunk_bwd.ForwardPlan]
    for name, x, r, e in zip(("o", "state"), (o, ht), ref, emu):
        res = compare(name, cupy.asnumpy(x.astype(np.float32) if name == "o" else x), r, e)
        assert res.ok, res


def _planes(ws, plan):
    """The planes (PLANES: every GEMM's operands) as pack split them, summed (exactly, in
    float64): scale q A, k D, v, do, each [NB][BT][K or V] (with PANELS, q A's and k D's from
    their 64-key panels: row t's 8-key piece j at j ^ t % 8)."""
    import cupy
    from cupy_gda import chunk_bwd
    kp, vp = chunk_bwd.planes(plan.p)
    NB, C, K, V = plan.NB, plan.cfg.BT, plan.p.K, plan.p.V
    words = ws[plan.at["pl"]:plan.at["pl"] + plan.sizes["pl"]]
    x = cupy.asnumpy(words.view(np.uint16)).astype(np.uint32) << 16     # bfloat16 -> float32 bits
    x = x.view(np.float32).astype(np.float64)
    out, at = [], 0
    for i, (n, cols, width) in enumerate(((3, kp, K), (3, kp, K), (1, vp, V), (1, vp, V))):
        part = x[at:at + NB * n * C * cols].reshape(NB, n, C, cols)
        if i < 2 and plan.cfg.PANELS:               # [panel][t][piece ^ t % 8][8] -> [t][key]
            part = part.reshape(NB, n, cols // 64, C, 8, 8)
            t, j = np.arange(C)[:, None], np.arange(8)[None, :]
            part = part[:, :, :, t, j ^ t % 8].transpose(0, 1, 3, 2, 4, 5).reshape(NB, n, C, cols)
        out.append(part.sum(1)[:, :, :width])
        at += NB * n * C * cols
    return out


def _w_planes(ws, plan):
    """scale W as scores leaves it for scan_dv (W_SPLIT_DV, v70): its h, m bfloat16 planes in
    wgmma's B layout (gda_wg_split_b: element (t, u) in word 32 c + 4 (t % 8) + u / 2 % 4 of core
    c = t / 8 BT / 8 + u / 8, the low half for an even u), summed (exactly, in float64): [NB][BT][BT]."""
    import cupy
    NB, C = plan.NB, plan.cfg.BT
    words = ws[plan.at["ww"]:plan.at["ww"] + NB * C * C].view(np.uint32)
    words = cupy.asnumpy(words).reshape(NB, 2, C * C // 2)
    t, u = np.arange(C)[:, None], np.arange(C)[None, :]
    half = words[:, :, 32 * (t // 8 * (C // 8) + u // 8) + 4 * (t % 8) + u // 2 % 4] >> (16 * (u % 2))
    return ((half & 0xffff) << 16).astype(np.uint32).view(np.float32).astype(np.float64).sum(1)


def _chunk_rows(x, BT, fill=0):
    """[B, T, H, d] -> the chunks' rows [B H NC][BT][d] in float32 (rows past T: fill)."""
    B, T, H, d = x.shape
    NC = -(-T // BT)
    out = np.full((B, H, NC * BT, d), fill, np.float32)
    out[:, :, :T] = np.asarray(x, np.float32).transpose(0, 2, 1, 3)
    return out.reshape(B * H * NC, BT, d)


def _packed(q, k, g, scale, BT):
    """pack's scale q A and k D in float32, the kernel's products in its order (rows past T:
    gate 1): A_t = pre a, pre the products of the 16-step blocks before t's, a P(start of t's
    block..t); D_t = d suf, d P(t+1..end of t's block), suf those of the blocks after it (v44)."""
    q, k, g = _chunk_rows(q, BT), _chunk_rows(k, BT), _chunk_rows(g, BT, 1)
    qa, kd = np.empty_like(q), np.empty_like(k)
    one = np.ones_like(q[:, 0])
    a, pre = one, one
    for t in range(BT):
        a = a * g[:, t]
        qa[:, t] = np.float32(scale) * (q[:, t] * (pre * a))
        if t % 16 == 15:
            pre, a = pre * a, one
    d, suf = one, one
    for t in reversed(range(BT)):
        kd[:, t] = k[:, t] * (d * suf)
        d = d * g[:, t]
        if t % 16 == 0:
            suf, d = suf * d, one
    return qa, kd


def _check_scan(view, plan, kd, sqa, vp, dp, h0, dht):
    """The fused scan's S0 and E (st, et) against the float64 scan of the workspaces it read, each
    chunk adding (BT + 16) 2^-24 of the magnitudes' scan to the bound; es (its parts summed)
    against rowsum(E S0) of those very S0 and E. sqa here is scale q A (the scan's planes)."""
    from cupy_gda import chunk_bwd
    C, K, V, NC, NB = plan.cfg.BT, plan.p.K, plan.p.V, plan.NC, plan.NB
    ae = view("ae", K)
    s0, e = view("st", K, V), view("et", K, V)
    parts = chunk_bwd.tiles(V)                           # es: [parts][NB][K]
    es = view("es", parts, K).reshape(parts, NB, K).sum(0)
    u = 2.0 ** -24 * (C + 16)
    for nh, h in enumerate(h0.reshape(-1, K, V)):
        chunks = range(nh * NC, (nh + 1) * NC)
        s = h.astype(np.float64)
        m = np.abs(s)
        for n, b in enumerate(chunks):                   # S0 forward
            assert (np.abs(s0[b] - s) <= u * n * m + 1e-300).all(), ("S0", b)
            s = ae[b][:, None] * s + kd[b].T @ vp[b]
            m = np.abs(ae[b])[:, None] * m + np.abs(kd[b]).T @ np.abs(vp[b])
        e_ = dht.reshape(-1, K, V)[nh].astype(np.float64)
        m = np.abs(e_)
        for n, b in enumerate(reversed(chunks)):         # E backward
            assert (np.abs(e[b] - e_) <= u * n * m + 1e-300).all(), ("E", b)
            e_ = ae[b][:, None] * e_ + sqa[b].T @ dp[b]
            m = np.abs(ae[b])[:, None] * m + np.abs(sqa[b]).T @ np.abs(dp[b])
    want, mag = (e * s0).sum(-1), np.abs(e * s0).sum(-1)
    assert (np.abs(es - want) <= (V + 4) * 2.0 ** -24 * mag).all()


@pytest.mark.gpu
@pytest.mark.parametrize("B, T, H, K, V, BT, dtype, scan", [
    pytest.param(*shape, dtype, m, id=f"{name}{'-bf16' if dtype == 'bfloat16' else ''}-{m}")
    for name, shape in (("K100-V72-BT32", (2, 100, 3, 100, 72, 32)),
                        ("K5-V1-BT64", (1, 130, 2, 5, 1, 64)),
                        ("K128-V130-BT64", (1, 200, 2, 128, 130, 64)))
    for dtype in ("float32", "bfloat16") if dtype == "float32" or name != "K5-V1-BT64"
    for m in (*SCANS, "planes-dv", "planes-dv-wg") if m in SCANS and (m != "planes" or dtype == "bfloat16")
    or dtype == "bfloat16" and name == "K128-V130-BT64"])
def test_gpu_chunked_backward_gemms_are_exact_to_float32(B, T, H, K, V, BT, dtype, scan):
    """Each GEMM stage (2: local states, 4: M, scale do S0^T, v E^T, 7: dv) against float64
    products of the very workspaces it read: every element within float32's worst case for n
    terms, with room for the split's left-out terms and the tensor cores' truncation, (n + 12)
    2^-24 sum |a b|, where plain TF32 (or bf16) would be off by about 2^-11 / sqrt(n) (2^-8 /
    sqrt(n)) of it; tiles cut by K, V and the chunk's rows; values and scale that round in
    bf16 and TF32; bf16 inputs, whose v and do take one term. With the fused boundary scan
    (2-3), its S0, E and rowsum(E S0) against the float64 scan of the same workspaces, within
    (BT + 16) 2^-24 a chunk of its sums of magnitudes; from the planes, the planes exact;
    planes-dv (a Hopper GPU), E, rowsum and dv by scan_dv, dv in its two terms (2^-15 of its
    sum of magnitudes more: m m left out, each operand's h + m within 2^-17 of it), and
    planes-dv-wg, there with S0 by scan_o's wgmma form (fresh sums of a chunk's 64 steps)."""
    import cupy
    from cupy_gda import chunk_bwd
    from cupy_gda._checks import Problem
    rng = np.random.default_rng(20)
    p = Problem(B, T, H, K, V, B, dtype, "float32", False)
    two = scan.startswith("planes-dv")
    if two:
        _need_hopper()
    fused, planes = SCANS["planes" if two else scan]
    plan = chunk_bwd.BackwardPlan(p, cfg=chunk_bwd.Config(BT, 32 if K <= 32 else 64, fused, planes,
                                                          DV_TERMS=2 if two else 3, SCAN_DV=two,
                                                          SCAN_O_WG=scan == "planes-dv-wg",
                                                          PANELS=scan == "planes-dv-wg"))
    x = {n: cupy.asarray(rng.standard_normal((B, T, H, d)), np.float32).astype(dtype)
         for n, d in (("q", K), ("k", K), ("v", V), ("do", V))}
    g = cupy.asarray(rng.uniform(0.9, 1.0, (B, T, H, K)), np.float32)
    scale = np.float32(0.3)
    ws = cupy.full((plan.ws_floats,), np.nan, np.float32)
    NB, C = plan.NB, BT

    def view(name, *shape):
        return cupy.asnumpy(ws[plan.at[name]:plan.at[name] + NB * int(np.prod(shape))]).astype(
            np.float64).reshape(NB, *shape)

    def check(got, a, b):       # got = a @ b, batched
        want, mag = a @ b, np.abs(a) @ np.abs(b)
        assert np.isfinite(got).all()
        bad = np.abs(got - want) > (a.shape[-1] + 12) * 2.0 ** -24 * mag
        assert not bad.any(), (np.abs(got - want) / mag)[bad].max()

    h0, dht = (cupy.asarray(rng.standard_normal((B, H, K, V)), np.float32) for _ in range(2))
    args = (x["q"], x["k"], x["v"], g, x["do"], float(scale), h0, dht)
    plan.run(*args, fallback=False, stages=3 if fused else 2, ws=ws)
    if planes:      # the planes (the operands of every GEMM): pack's float32 values, exactly
        sqa, kd, vp, dp = _planes(ws, plan)
        host = {n: cupy.asnumpy(x[n].astype(np.float32)) for n in x}
        qa32, kd32 = _packed(host["q"], host["k"], cupy.asnumpy(g), scale, BT)
        for got, want in ((sqa, qa32), (kd, kd32), (vp, _chunk_rows(host["v"], BT)),
                          (dp, _chunk_rows(host["do"], BT))):
            assert np.array_equal(got, want)
        _check_scan(view, plan, kd, sqa, vp, dp, cupy.asnumpy(h0), cupy.asnumpy(dht))
    elif fused:
        kd, vp, dp = view("kd", C, K), view("vp", C, V), view("dp", C, V)
        _check_scan(view, plan, kd, float(scale) * view("qa", C, K), vp, dp, cupy.asnumpy(h0),
                    cupy.asnumpy(dht))
    else:
        kd, vp, dp = view("kd", C, K), view("vp", C, V), view("dp", C, V)
        check(view("st", K, V), kd.swapaxes(1, 2), vp)
        check(view("et", K, V), view("qa", C, K).swapaxes(1, 2), float(scale) * dp)
    plan.run(*args, fallback=False, stages=4, ws=ws)
    s0, e = view("st", K, V), view("et", K, V)
    sd = view("sd", C, K)                   # (before scores and intra overwrite nothing of it)
    check(view("mm", C, C), vp, float(scale) * dp.swapaxes(1, 2))
    check(sd, float(scale) * dp, s0.swapaxes(1, 2))
    check(view("ev", C, K), vp, e.swapaxes(1, 2))
    grads, _ = plan.run(*args, fallback=False, stages=7, ws=ws)
    # scale W: scores' float32 W times scale, or with scan_dv its split planes (v70)
    sww = _w_planes(ws, plan) if two else float(scale) * view("ww", C, C)
    want = kd @ e + sww @ dp
    mag = np.abs(kd) @ np.abs(e) + np.abs(sww) @ np.abs(dp)
    rows = want.reshape(B, H, -1, V)[:, :, :T].transpose(0, 2, 1, 3)      # chunk rows -> [B, T, H, V]
    rmag = mag.reshape(B, H, -1, V)[:, :, :T].transpose(0, 2, 1, 3)
    got = cupy.asnumpy(grads[2].astype(np.float32)).astype(np.float64)
    rounding = 2.0 ** -24 if dtype == "float32" else 2.0 ** -8      # dv in v's dtype
    bound = ((K + BT + 12) * 2.0 ** -24 + (2.0 ** -15 if two else 0)) * rmag + rounding * np.abs(rows)
    assert not (np.abs(got - rows) > bound).any()


# dv's wgmma entry (chunk_bwd.Config.WGMMA): the planes (the forward's o, the backward's dv and
# the backward from the kept stages; cut tiles, two key tiles, V not a multiple of 4) and the
# float32 rows of each dtype (K, V cut, V not a multiple of 4)
WGMMA_DV = [(1, 300, 2, 256, 512, "bfloat16", True), (2, 129, 2, 128, 192, "bfloat16", True),
            (2, 100, 2, 100, 72, "bfloat16", True), (1, 90, 2, 128, 66, "bfloat16", True),
            (1, 200, 2, 128, 130, "float32", False), (2, 100, 3, 100, 72, "float16", False),
            (1, 200, 2, 128, 130, "bfloat16", False)]


@pytest.mark.gpu
@pytest.mark.parametrize("B, T, H, K, V, dtype, planes", [
    pytest.param(*c, id="B{}-T{}-H{}-K{}-V{}-{}".format(*c[:6]) + ("-planes" if c[6] else ""))
    for c in WGMMA_DV])
def test_gpu_dv_by_wgmma_is_bit_for_bit_mma_sync(B, T, H, K, V, dtype, planes, monkeypatch):
    """dv's wgmma entry (Hopper) gives every output of its stage bit for bit as the mma.sync
    entry in three terms: the same split terms summed in the same order into fresh sums a
    k-step, then into the total; so it meets the contract wherever that entry does (the tests
    above). Poisoned outputs, chunks of 64 steps at any size (the wgmma entry's m64)."""
    import cupy
    from cupy_gda import _launch, chunk_bwd
    from cupy_gda._checks import Problem
    if not _launch.hopper():
        pytest.skip("dv's wgmma entry needs a Hopper GPU (compute capability 9.0)")
    monkeypatch.setattr(chunk_bwd, "CHUNKS_64", 0)
    monkeypatch.setattr(chunk_bwd, "DV_TWO_TERMS", False)  # (the wgmma entry's three terms)
    rng = np.random.default_rng(21)
    p = Problem(B, T, H, K, V, B, dtype, "float32", False)
    x = {n: cupy.asarray(rng.standard_normal((B, T, H, d)), np.float32).astype(dtype)
         for n, d in (("q", K), ("k", K), ("v", V), ("do", V))}
    g = cupy.asarray(rng.uniform(0.9, 1.0, (B, T, H, K)), np.float32)
    h0 = cupy.asarray(rng.standard_normal((B, H, K, V)), np.float32)
    args = (x["q"], x["k"], x["v"], g, x["do"], 0.3, h0, None)
    got = {}
    for wgmma in (False, True):
        monkeypatch.setattr(chunk_bwd, "USE_WGMMA", wgmma)
        cfg = chunk_bwd.Config(64, 64, planes, planes, wgmma)
        out = [chunk_bwd.BackwardPlan(p, cfg=cfg).run(*args, fallback=False)[0][2]]
        if planes:
            fp = chunk_bwd.ForwardPlan(p, keep=True)
            assert fp.cfg.WGMMA == wgmma and fp.cfg.BT == 64
            flag = cupy.zeros((1,), np.int32)
            o, _, kept = fp.run(*args[:4], 0.3, h0, None, False, None, flag=flag, keep=True)
            bk = chunk_bwd.BackwardPlan(p, keep=True)
            assert bk.cfg.WGMMA == wgmma
            out += [o, bk.run(*args, kept=kept, fallback=False)[0][2]]
            assert int(flag[0]) == 0
        got[wgmma] = [cupy.asnumpy(a.astype(np.float32)) for a in out]
    for name, a, b in zip(("dv", "o", "dv from the kept stages"), got[True], got[False]):
        assert not np.isnan(b).any(), name
        assert np.array_equal(a, b), (name, np.abs(a - b).max())


@pytest.mark.gpu
@pytest.mark.parametrize("what", ["big-gate", "nan-q", "inf-do", "large-v", "large-state"])
def test_gpu_chunked_backward_guard_flags_and_falls_back(what):
    """Inputs or states outside the range the chunked form is exact in set the flag, and the
    public call then gives the loop's gradients."""
    import cupy
    from cupy_gda import chunk_bwd
    from cupy_gda._checks import check_backward
    rng = np.random.default_rng(14)
    kw = _problem(rng, 2, 150, 2, 20, 12, "unif")
    kw["do"] = rng.standard_normal(kw["v"].shape)
    if what == "big-gate":
        kw["gate"][1, 100, 0, 3] = 1.5
    elif what == "nan-q":
        kw["q"][0, 7, 1, 0] = np.nan
    elif what == "inf-do":
        kw["do"][1, 149, 1, 11] = np.inf
    elif what == "large-v":
        kw["v"][0, 3, 0, 0] = 2.0 ** 21
    else:
        kw["initial_state"][1, 0, 5, 5] = 2.0 ** 41
    f32 = {n: x.astype(np.float32) for n, x in kw.items()}
    dev = {n: cupy.asarray(x) for n, x in f32.items()}
    p = check_backward("t", dev["q"], dev["k"], dev["v"], dev["gate"], None, dev["do"],
                       dev["initial_state"], None, None, cpu=False)
    _, flag = chunk_bwd.plan(p).run(dev["q"], dev["k"], dev["v"], dev["gate"], dev["do"], 1.0,
                                    dev["initial_state"], None, fallback=False)
    assert int(flag[0]) == 1
    got = cupy_gda.gated_attention_backward(**dev, method="chunk")
    ref = R.gated_attention_backward_ref(**f32)
    emu = R.gated_attention_backward_ref(**f32, dtype=np.float32)
    for name, x, r, e in zip(ref._fields, got, ref, emu):
        _contract(name, cupy.asnumpy(x), r, e)


@pytest.mark.gpu
@pytest.mark.parametrize("wg", [False, True], ids=["", "s0-wg"])
@pytest.mark.parametrize("what", ["large-dht", "big-gate", "nan-q", "large-k", "inf-do",
                                  "large-h0"])
def test_gpu_scan_dv_guard_flags_as_the_scan(what, wg):
    """A backward from the planes with scan_dv (SCAN_DV: chunks of 64, a Hopper GPU) sets the
    guard's flag where the one with the scan's backward half and dv's entry does (E past the
    range from d_final_state, which scan_dv guards; a gate, q or k past it, which pack does
    there and scores here, QK_BY_SCORES, v75; do past it, which pack does in both; S0
    past it from the initial state, which the scan guards, or with s0-wg scan_o's wgmma form
    that makes the S0 then, SCAN_O_WG), and the reverse loop then overwrites every gradient:
    the same arrays either way."""
    import cupy
    from cupy_gda import chunk_bwd
    from cupy_gda._checks import Problem
    _need_hopper()
    rng = np.random.default_rng(15)
    B, T, H, K, V = 2, 150, 2, 128, 64
    q, k, v, do = (cupy.asarray(rng.standard_normal((B, T, H, d)), np.float32).astype("bfloat16")
                   for d in (K, K, V, V))
    g = cupy.asarray(rng.uniform(0.9, 1.0, (B, T, H, K)), np.float32)
    dht = cupy.asarray(rng.standard_normal((B, H, K, V)), np.float32)
    h0 = cupy.asarray(rng.standard_normal((B, H, K, V)), np.float32) if what == "large-h0" else None
    if what == "large-dht":
        dht[1, 0, 5, 5] = 2.0 ** 41
    elif what == "large-h0":
        h0[0, 1, 100, 40] = 2.0 ** 41
    elif what == "big-gate":
        g[1, 100, 0, 3] = 1.5
    elif what == "nan-q":
        q[0, 70, 1, 33] = np.nan
    elif what == "large-k":
        k[1, 10, 0, K - 1] = 2.0 ** 21
    else:
        do[1, 149, 1, 11] = np.inf
    p = Problem(B, T, H, K, V, B, "bfloat16", "float32", False)
    args = (q, k, v, g, do, 1.0, h0, dht)
    got = []
    for dv in (False, True):
        plan = chunk_bwd.BackwardPlan(p, cfg=chunk_bwd.Config(64, 64, True, True, DV_TERMS=2,
                                                              SCAN_DV=dv, SCAN_O_WG=dv and wg,
                                                              PANELS=dv and wg))
        assert int(plan.run(*args, fallback=False)[1][0]) == 1
        got.append(plan(*args))
    for name, a, b in zip(R.Gradients._fields, *got):
        assert (a is None) == (b is None), name
        assert a is None or cupy.array_equal(a, b, equal_nan=True), name


def _gpu_problem(rng, B, T, H, K, V, regime="unif", init=True, lens=None):
    import cupy
    kw = _problem(rng, B, T, H, K, V, regime, init, lens)
    kw = {n: cupy.asarray(x.astype(np.float32) if x.dtype == np.float64 else x)
          for n, x in kw.items()}
    kw["do"] = cupy.asarray(rng.standard_normal(kw["v"].shape), np.float32)
    return kw


@pytest.mark.gpu
def test_gpu_backward_leaves_the_inputs_alone():
    import cupy
    rng = np.random.default_rng(9)
    kw = _gpu_problem(rng, 2, 70, 2, 24, 40, lens=None)
    kw["d_final_state"] = cupy.asarray(rng.standard_normal((2, 2, 24, 40)), np.float32)
    before = {n: cupy.asnumpy(x) for n, x in kw.items()}
    g = cupy_gda.gated_attention_backward(**kw)
    cupy.cuda.get_current_stream().synchronize()
    for n, x in before.items():
        assert cupy.asnumpy(kw[n]).tobytes() == x.tobytes(), n
    assert isinstance(g.dq, cupy.ndarray) and g.dinitial_state.dtype == np.float32


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 5, 2, 3, 2), (2, 0, 2, 3, 2), (2, 5, 0, 3, 2)],
                         ids=["B0", "T0", "H0"])
def test_gpu_size_zero_dims(shape):
    import cupy
    B, T, H, K, V = shape
    rng = np.random.default_rng(10)
    kw = _gpu_problem(rng, B, T, H, K, V)
    dht = cupy.asarray(rng.standard_normal(kw["initial_state"].shape), np.float32)
    g = cupy_gda.gated_attention_backward(**kw, d_final_state=dht)
    assert g.dq.shape == (B, T, H, K) and g.dv.shape == (B, T, H, V)
    assert g.dgate.shape == (B, T, H, K) and g.dinitial_state.shape == (B, H, K, V)
    if T == 0:                  # no steps: the final state is the initial one
        np.testing.assert_array_equal(cupy.asnumpy(g.dinitial_state), cupy.asnumpy(dht))


@pytest.mark.gpu
def test_gpu_non_finite_inputs_propagate_as_the_loop_says():
    """An inf in v and a NaN in q: the same NaN/inf pattern as the float64 loop's, and the
    finite elements within the contract."""
    import cupy
    rng = np.random.default_rng(11)
    kw = _problem(rng, 2, 40, 2, 20, 6, "unif")         # V = 6: a partial value tile
    kw["v"][0, 30, 1, 2] = np.inf
    kw["q"][1, 10, 0, 3] = np.nan
    f32 = {n: x.astype(np.float32) for n, x in kw.items()}
    do = rng.standard_normal(kw["v"].shape).astype(np.float32)
    ref = R.gated_attention_backward_ref(**f32, do=do)
    emu = R.gated_attention_backward_ref(**f32, do=do, dtype=np.float32)
    got = cupy_gda.gated_attention_backward(**{n: cupy.asarray(x) for n, x in f32.items()},
                                            do=cupy.asarray(do))
    for name, x, r, e in zip(ref._fields, got, ref, emu):
        _contract(name, cupy.asnumpy(x), r, e)


@pytest.mark.gpu
def test_gpu_backward_errors_name_the_argument():
    rng = np.random.default_rng(12)
    kw = _gpu_problem(rng, 1, 4, 1, 300, 2)
    with pytest.raises(ValueError, match="head dimension K must be between 1 and 256 on the GPU"):
        cupy_gda.gated_attention_backward(**kw)
    kw = _gpu_problem(rng, 1, 4, 1, 3, 2)
    with pytest.raises(ValueError, match="method must be one of 'auto', 'recurrent', 'chunk'"):
        cupy_gda.gated_attention_backward(**kw, method="fused")


@pytest.mark.gpu
@pytest.mark.parametrize("TC, lens", [(16, None), (8, (130, 0, 64, 1, 65)), (4, (3, 200))],
                         ids=["TC16", "TC8-varlen", "TC4-varlen"])
def test_gpu_backward_with_states_kept_every_span(TC, lens):
    """States kept every TS = 64 steps, so S runs through each span again to each chunk's start
    (recurrent_bwd.config picks this only past KEPT_BYTES, which test shapes never reach):
    partial spans and chunks, an empty sequence, the gradients within the contract."""
    import cupy
    from cupy_gda import recurrent_bwd
    from cupy_gda._checks import Problem
    rng = np.random.default_rng(13)
    kw = _problem(rng, 2, 300, 2, 20, 12, "unif", lens=lens)
    kw["do"] = rng.standard_normal(kw["v"].shape)
    kw["d_final_state"] = rng.standard_normal(kw["initial_state"].shape)
    f32 = {n: x if n == "cu_seqlens" else x.astype(np.float32) for n, x in kw.items()}
    B, T, H, K = f32["q"].shape
    p = Problem(B, T, H, K, 12, f32["initial_state"].shape[0], "float32", "float32", False)
    cfg = recurrent_bwd.config(p)._replace(TC=TC, TS=64)
    assert recurrent_bwd.smem(K, cfg.KT, cfg.KG, cfg.VT, TC) <= 227 * 1024
    plan = recurrent_bwd.BackwardPlan(p, lens is not None, cfg)     # (cu_seqlens int64)
    d = {n: cupy.asarray(x) for n, x in f32.items()}
    got = plan(d["q"], d["k"], d["v"], d["gate"], d["do"], 1.0, d["initial_state"],
               d["d_final_state"], d.get("cu_seqlens"))
    ref = R.gated_attention_backward_ref(**f32)
    emu = R.gated_attention_backward_ref(**f32, dtype=np.float32)
    for name, x, r, e in zip(ref._fields, got, ref, emu):
        _contract(name, cupy.asnumpy(x), r, e)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_inputs_off_a_16_byte_boundary(dtype):
    """Contiguous CuPy views that start one element past a 16-byte boundary (the chunked forward
    stages float32 inputs by cp.async, 16 bytes at once: a misaligned address) give what the same
    values in fresh arrays give, bit for bit, forward and backward (the API copies them)."""
    import cupy
    B, T, H, K, V = 2, 130, 2, 64, 64
    args = _verify.make_inputs(_verify.Case(B, T, H, K, V, dtype=dtype, init=False), 0, cupy)
    do = cupy.asarray(np.random.default_rng(1).standard_normal((B, T, H, V)), np.float32)
    do = do.astype(dtype)

    def shifted(x):                         # the same values at one element past the start
        y = cupy.empty(x.size + 8, x.dtype)[1:1 + x.size].reshape(x.shape)
        y[...] = x
        assert y.flags.c_contiguous and y.data.ptr % 16 != 0
        return y

    moved = {n: shifted(x) if n in ("q", "k", "v", "gate") else x for n, x in args.items()}
    want = cupy_gda.gated_attention(**args, method="chunk")
    for _ in range(2):                      # (the second call takes the API's fast path)
        assert (cupy_gda.gated_attention(**moved, method="chunk") == want).all()
    want = cupy_gda.gated_attention_backward(**args, do=do, method="chunk")
    got = cupy_gda.gated_attention_backward(**moved, do=shifted(do), method="chunk")
    for name, a, b in zip(want._fields, want, got):
        assert (a is None and b is None) or (a == b).all(), name
