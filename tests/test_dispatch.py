"""CPU unit tests of the dispatch table (_dispatch.pick) and of the GPU tile choice (_gpu.*_tiles).

The tile invariants mirror the static_asserts of kernels/*.cu, checked here for every K, V in
1..256 so a bad choice shows without a GPU or a compiler.
"""
import pytest

from cupy_gda import _dispatch, _gpu
from cupy_gda._checks import MAX_DIM, Problem

FN = "gated_attention"
P = Problem(B=2, T=63, H=4, K=24, V=24, N=2, dtype="float32", g_dtype="float32", log_gate=False)


@pytest.mark.parametrize("gpu, want", [
    pytest.param(True, "recurrent", id="on_gpu"),
    pytest.param(False, "chunk", id="on_cpu"),
])
def test_auto_picks(gpu, want):
    assert _dispatch.pick(FN, "auto", P, gpu) == want


@pytest.mark.parametrize("gpu", [pytest.param(True, id="on_gpu"), pytest.param(False, id="on_cpu")])
def test_auto_picks_a_method_of_that_side(gpu):
    m = _dispatch.pick(FN, "auto", P, gpu)
    assert ("gpu" if gpu else "cpu") in _dispatch.METHODS[m]


def _named(where):
    return [pytest.param(m, id=f"{m}-{where}") for m, sides in _dispatch.METHODS.items()
            if where in sides]


@pytest.mark.parametrize("method", _named("gpu"))
def test_named_gpu_method_runs_as_asked(method):
    assert _dispatch.pick(FN, method, P, True) == method


@pytest.mark.parametrize("method", _named("cpu"))
def test_named_cpu_method_runs_as_asked(method):
    assert _dispatch.pick(FN, method, P, False) == method


@pytest.mark.parametrize("method", [
    pytest.param("fused", id="fused"),
    pytest.param("Recurrent", id="wrong-case"),
    pytest.param("", id="empty"),
    pytest.param(None, id="None"),
])
@pytest.mark.parametrize("gpu", [pytest.param(True, id="on_gpu"), pytest.param(False, id="on_cpu")])
def test_unknown_method_lists_the_names(method, gpu):
    with pytest.raises(ValueError) as e:
        _dispatch.pick(FN, method, P, gpu)
    msg = str(e.value)
    assert msg.startswith(f"{FN}: method must be one of"), msg
    for name in ("auto", *_dispatch.METHODS):
        assert repr(name) in msg, msg
    assert f"got {method!r}" in msg, msg


@pytest.mark.parametrize("method", [
    pytest.param(m, id=m) for m, sides in _dispatch.METHODS.items() if "gpu" not in sides])
def test_cpu_only_method_on_the_gpu_raises(method):
    with pytest.raises(ValueError) as e:
        _dispatch.pick(FN, method, P, True)
    msg = str(e.value)
    assert msg.startswith(f"{FN}: method {method!r} has no GPU implementation"), msg
    for name, sides in _dispatch.METHODS.items():       # the message lists what the GPU has
        assert (repr(name) in msg) == (name == method or "gpu" in sides), msg


def test_there_is_a_cpu_only_method():
    # keeps test_cpu_only_method_on_the_gpu_raises from going empty without notice
    assert any("gpu" not in sides for sides in _dispatch.METHODS.values())


DIMS = range(1, MAX_DIM + 1)
# N*H sequence-heads: gda_recurrent_fwd narrows its blocks below 2 per SM (132 SMs on an H200)
NHS = (1, 8, 263, 264, 4096)
# dynamic shared memory a block may opt into on every sm_80+ GPU (99 KB on sm_86 / sm_89)
SMEM_MAX = 99 * 1024


def _recurrent_violations(K, V, NH):
    R, KT, BV, TC = _gpu.recurrent_tiles(K, V, NH)
    bad = []
    if R not in (1, 2, 4) or -(-K // (R * KT)) * R > 8:
        bad.append(f"R={R}: not 1, 2 or 4, or more than 8 state rows a lane")
    if KT < 1 or KT > 32 or KT & (KT - 1):
        bad.append(f"KT={KT} is not a power of 2 at most 32")
    if BV < 1 or (KT * BV) % 32 or KT * BV > 1024:
        bad.append(f"KT*BV={KT}*{BV} is not a multiple of 32 at most 1024")
    if TC < 1:
        bad.append(f"TC={TC} < 1")
    smem = _gpu.recurrent_smem(K, R, KT, BV, TC)   # the launch's dynamic shared memory
    if smem > SMEM_MAX:
        bad.append(f"dynamic shared memory {smem} bytes > {SMEM_MAX}")
    return [f"K={K} V={V} NH={NH} (R, KT, BV, TC)=({R}, {KT}, {BV}, {TC}): {b}" for b in bad]


@pytest.mark.parametrize("NH", [pytest.param(nh, id=f"NH{nh}") for nh in NHS])
def test_recurrent_tiles_all_dims(NH):
    bad = [b for K in DIMS for V in DIMS for b in _recurrent_violations(K, V, NH)]
    assert not bad, f"{len(bad)} violations, first: " + "; ".join(bad[:10])


def _step_violations(K, V, align):
    KW, VEC = _gpu.step_tiles(K, V, align)
    bad = []
    if VEC not in (1, 2, 4) or V % VEC:
        bad.append(f"VEC={VEC} is not 1, 2 or 4 dividing V")
    if align % (4 * VEC):
        bad.append(f"{4 * VEC}-byte accesses on a state {align}-byte aligned")
    if KW < 1 or KW * 32 > 1024:
        bad.append(f"KW={KW}: {KW * 32} threads")
    smem = (3 * K + KW * 32 * VEC) * 4             # b_q, b_k, b_g and b_o of gda_step
    if smem > 48 * 1024:
        bad.append(f"shared memory {smem} bytes > 48 KiB")
    return [f"K={K} V={V} align={align} (KW, VEC)=({KW}, {VEC}): {b}" for b in bad]


@pytest.mark.parametrize("align", [pytest.param(a, id=f"align{a}") for a in (16, 8, 4)])
def test_step_tiles_all_dims(align):
    bad = [b for K in DIMS for V in DIMS for b in _step_violations(K, V, align)]
    assert not bad, f"{len(bad)} violations, first: " + "; ".join(bad[:10])


@pytest.mark.parametrize("V, want", [
    pytest.param(64, 4, id="V64"),
    pytest.param(24, 4, id="V24"),
    pytest.param(6, 2, id="V6"),
    pytest.param(5, 1, id="V5"),
])
def test_step_uses_16_byte_accesses_where_allowed(V, want):
    assert _gpu.step_tiles(128, V, 16)[1] == want


@pytest.mark.parametrize("K, V", [
    pytest.param(24, 24, id="K24-V24"),
    pytest.param(32, 48, id="K32-V48"),
    pytest.param(128, 64, id="K128-V64"),
    pytest.param(5, 1, id="K5-V1"),
])
def test_defines_carry_the_tiles_and_problem(K, V):
    p = Problem(B=1, T=1, H=1, K=K, V=V, N=1, dtype="bfloat16", g_dtype="float32", log_gate=True)
    d = _gpu.recurrent_defines(p, seq_int64=True)
    assert (d["R"], d["KT"], d["BV"], d["TC"]) == _gpu.recurrent_tiles(K, V, p.N * p.H)
    assert (d["K_DIM"], d["V_DIM"], d["IO_DTYPE"], d["G_DTYPE"], d["LOG_GATE"], d["SEQ_INT64"]) == (
        K, V, 2, 0, 1, 1)
    d = _gpu.step_defines(p, idx_int64=False, align=16)
    assert (d["KW"], d["VEC"]) == _gpu.step_tiles(K, V, 16)
    assert (d["K_DIM"], d["V_DIM"], d["IO_DTYPE"], d["G_DTYPE"], d["LOG_GATE"], d["IDX_INT64"]) == (
        K, V, 2, 0, 1, 0)


@pytest.mark.parametrize("ptr, want", [
    pytest.param(0x7f0000000000, 16, id="16"), pytest.param(0x7f0000000008, 8, id="8"),
    pytest.param(0x7f0000000004, 4, id="4"), pytest.param(0x7f0000000002, 2, id="2"),
])
def test_alignment(ptr, want):
    assert _gpu.alignment(ptr) == want
