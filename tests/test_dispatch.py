"""CPU unit tests of the dispatch table (_dispatch.pick) and of each launcher's tile rule
(recurrent.py, chunk.py, step.py).

The tile invariants mirror the static_asserts of kernels/*.cu, checked here for every K, V in
1..256 so a bad choice shows without a GPU or a compiler.
"""
import functools
import re

import pytest

from cupy_gda import _compile, _dispatch, _launch, chunk, chunk_bwd, recurrent, step
from cupy_gda._checks import MAX_DIM, Problem

FN = "gated_attention"
H200 = (132, 227 * 1024)        # (SM count, opt-in shared memory bytes a block)
P = Problem(B=2, T=63, H=4, K=24, V=24, N=2, dtype="float32", g_dtype="float32", log_gate=False)


def _p(T=63, K=24, B=2, N=None, H=4):
    return P._replace(T=T, K=K, V=K, B=B, N=B if N is None else N, H=H)


@pytest.mark.parametrize("p, gpu, want", [
    pytest.param(P, True, "recurrent", id="gpu-seed"),
    pytest.param(_p(T=4096, K=24, B=8, H=16), True, "recurrent", id="gpu-long24"),
    pytest.param(_p(T=4096, K=128, B=8, H=16), True, "chunk", id="gpu-big128"),
    pytest.param(_p(T=127, K=128, B=8, H=16), True, "recurrent", id="gpu-K128-below-T128"),
    pytest.param(_p(T=128, K=128, B=8, H=8), True, "chunk", id="gpu-K128-NH64-T128"),
    pytest.param(_p(T=4096, K=128, B=1, H=16), True, "chunk", id="gpu-K128-NH16-segments"),
    pytest.param(_p(T=256, K=128, B=1, H=8), True, "recurrent", id="gpu-K128-NH8-T256"),
    pytest.param(_p(T=512, K=128, B=1, H=8), True, "chunk", id="gpu-K128-NH8-T512"),
    pytest.param(_p(T=4096, K=129, B=8, H=16), True, "chunk", id="gpu-K129"),
    pytest.param(_p(T=2048, K=64, B=4, H=8), True, "chunk", id="gpu-gla64-NH32"),
    pytest.param(_p(T=512, K=64, B=4, H=16), True, "chunk", id="gpu-K64-NH64-T512"),
    pytest.param(_p(T=128, K=64, B=4, H=16), True, "chunk", id="gpu-K64-NH64-T128"),
    pytest.param(_p(T=128, K=64, B=2, H=16), True, "recurrent", id="gpu-K64-NH32-T128"),
    pytest.param(_p(T=256, K=64, B=1, H=16), True, "recurrent", id="gpu-K64-NH16-T256"),
    pytest.param(_p(T=256, K=64, B=4, H=8), True, "recurrent", id="gpu-K64-NH32-T256"),
    pytest.param(_p(T=512, K=64, B=1, H=16), True, "chunk", id="gpu-K64-NH16-T512"),
    pytest.param(_p(T=256, K=128, B=1, H=16), True, "chunk", id="gpu-K128-NH16-T256"),
    pytest.param(_p(T=256, K=64, B=1, H=8), True, "recurrent", id="gpu-K64-NH8-T256"),
    pytest.param(_p(T=1024, K=64, B=4, H=16), True, "chunk", id="gpu-K64-NH64-T1024"),
    pytest.param(_p(T=2048, K=24, B=1, H=8), True, "recurrent", id="gpu-K24-NH8-T2048-segments"),
    pytest.param(_p(T=65536, K=32, B=1, H=16), True, "recurrent", id="gpu-K32-NH16-T64K"),
    pytest.param(_p(T=512, K=24, B=1, H=8), True, "recurrent", id="gpu-K24-NH8-T512"),
    pytest.param(_p(T=2048, K=24, B=4, H=16), True, "recurrent", id="gpu-K24-NH64-T2048"),
    pytest.param(_p(T=2048, K=64, B=8, H=16), True, "chunk", id="gpu-K64-NH128"),
    pytest.param(_p(T=2048, K=32, B=8, H=16), True, "recurrent", id="gpu-K32-NH128"),
    pytest.param(_p(T=4096, K=128, B=1, N=64, H=16), True, "recurrent", id="gpu-varlen-short-segments"),
    pytest.param(_p(T=4096, K=128, B=1, N=8, H=16), True, "chunk", id="gpu-varlen-long-segments"),
    pytest.param(P, False, "recurrent", id="cpu"),
    pytest.param(_p(T=4096, K=256), False, "recurrent", id="cpu-long-K256"),
])
def test_auto_picks(p, gpu, want):
    assert _dispatch.pick(FN, "auto", p, gpu, H200) == want


@pytest.mark.parametrize("p", [
    pytest.param(_p(T=4096, K=128, B=8, H=16), id="big128"),
    pytest.param(_p(T=2048, K=64, B=4, H=8), id="gla64"),
])
def test_auto_falls_back_where_chunk_does_not_fit(p):
    """A GPU with too little shared memory for gda_chunk_fwd (K = 128 needs more than 99 KB):
    auto runs the recurrent kernel, and a named 'chunk' says what it needs."""
    small = (84, 60 * 1024)
    assert _dispatch.pick(FN, "auto", p, True, small) == "recurrent"
    with pytest.raises(ValueError, match=rf"^{FN}: method 'chunk' on the GPU needs \d+ bytes of "
                                         rf"shared memory per block at K={p.K}; this GPU has 61440; "
                                         rf"use method='recurrent' or 'auto'$"):
        _dispatch.pick(FN, "chunk", p, True, small)


@pytest.mark.parametrize("gpu", [pytest.param(True, id="on_gpu"), pytest.param(False, id="on_cpu")])
def test_auto_picks_a_method_of_that_side(gpu):
    m = _dispatch.pick(FN, "auto", P, gpu, H200)
    assert ("gpu" if gpu else "cpu") in _dispatch.METHODS[m]


def _named(where):
    return [pytest.param(m, id=f"{m}-{where}") for m, sides in _dispatch.METHODS.items()
            if where in sides]


@pytest.mark.parametrize("method", _named("gpu"))
def test_named_gpu_method_runs_as_asked(method):
    assert _dispatch.pick(FN, method, P, True, H200) == method


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
        _dispatch.pick(FN, method, P, gpu, H200)
    msg = str(e.value)
    assert msg.startswith(f"{FN}: method must be one of"), msg
    for name in ("auto", *_dispatch.METHODS):
        assert repr(name) in msg, msg
    assert f"got {method!r}" in msg, msg


@pytest.mark.parametrize("K", [pytest.param(129, id="K129"), pytest.param(256, id="K256")])
def test_chunk_on_the_gpu_takes_K_up_to_256(K):
    """Key tiles: K 129..256 run the chunked kernel when named, and by auto where it wins."""
    assert _dispatch.pick(FN, "chunk", _p(K=K), True, H200) == "chunk"
    assert _dispatch.pick(FN, "auto", _p(K=K, B=8, H=4, T=4096, N=8), True, H200) == "chunk"


def test_chunk_over_MAX_K_names_the_limit():
    with pytest.raises(ValueError) as e:
        _dispatch.pick(FN, "chunk", _p(K=257), True, H200)
    assert str(e.value) == (f"{FN}: method 'chunk' on the GPU takes a head dimension K of at most "
                            f"256, got K=257; use method='recurrent' or 'auto'")
    assert _dispatch.pick(FN, "auto", _p(K=257), True, H200) == "recurrent"
    assert _dispatch.pick(FN, "chunk", _p(K=257), False) == "chunk"      # the CPU has no limit


def test_every_method_runs_on_both_sides():
    assert all(set(sides) == {"cpu", "gpu"} for sides in _dispatch.METHODS.values())


DIMS = range(1, MAX_DIM + 1)
# dynamic shared memory a block may opt into on every sm_80+ GPU (99 KB on sm_86 / sm_89)
SMEM_MAX = 99 * 1024


# N*H sequence-heads: gda_chunk_fwd splits the sequences into segments, then narrows its value
# tiles, when the grid is small (132 SMs); mean sequence lengths L and element sizes bound the
# segments
NHS = (1, 8, 98, 99, 264, 4096)
LENS = ((1, 4), (64, 4), (200, 2), (1537.5, 4), (2048, 4), (2048, 2), (65536, 4))   # varlen: a mean
# (SM count, opt-in shared memory): H100/H200, A100, sm_86/89
DEVICES = ((132, 227 * 1024), (108, 163 * 1024), (84, 99 * 1024))

# The split tests run every V but only the K at both ends of each class of K that the rules
# treat alike (every K of the product takes a minute): the chunk's key tiles pad K to 16 or
# split it evenly rounded up to 16, so they change only between 16 m and 16 m + 1; the recurrent
# rule's K thresholds (16, 32, 64) and lanes (a power of 2 times R rows) change only at powers
# of 2, and staged inputs take multiples of 4. test_split_rules_read_K_by_class checks this
# over every K.
CHUNK_KS = [k for m in range(MAX_DIM // 16) for k in (16 * m + 1, 16 * m + 16)]
RECURRENT_KS = {staged: sorted({k for j in range(9) for k in (2**j - step, 2**j, 2**j + step)
                                if 1 <= k <= MAX_DIM and k % step == 0})
                for staged, step in ((False, 1), (True, 4))}


def _chunk_class(K):
    return -(-K // 16) * 16


def _recurrent_class(K, staged):
    """K itself where a power of 2, else the last K (multiple of 4 where staged) before the next."""
    top = 1 << (K - 1).bit_length()
    return K if top == K else top - (4 if staged else 1)


@pytest.mark.parametrize("sms, smem_max", [pytest.param(*d, id=f"SM{d[0]}") for d in DEVICES])
def test_split_rules_read_K_by_class(sms, smem_max):
    """The premise of CHUNK_KS and RECURRENT_KS, over every K: its key tiles, and over a sample of
    the other arguments the chunk's split and the recurrent tiles and segments (all but TC, which
    the split tests do not read), are those of the end of its class."""
    sample = [(V, NH, L, size) for V in (1, 7, 24, 100, 129, 256) for NH in (8, 99, 4096)
              for L, size in LENS]

    def chunk_rule(K):
        return ([chunk.key_tile(K, BV, smem_max) for BV in range(8, 65, 8)]
                + [chunk.split(K, V, NH, L, size, sms, smem_max) for V, NH, L, size in sample])

    def recurrent_rule(K, staged):
        tiles = [recurrent.tiles(K, V, NH, L, size, sms, staged=staged)
                 for V, NH, L, size in sample if not staged or V % 4 == 0]
        return [t[:3] + t[4:] for t in tiles]

    ends = {K: chunk_rule(K) for K in CHUNK_KS}
    bad = [f"chunk K={K}" for K in DIMS if chunk_rule(K) != ends[_chunk_class(K)]]
    for staged in (False, True):
        ends = {}
        for K in DIMS:
            if staged and K % 4:
                continue
            end = _recurrent_class(K, staged)
            if end not in ends:
                ends[end] = recurrent_rule(end, staged)
            if recurrent_rule(K, staged) != ends[end]:
                bad.append(f"recurrent K={K} staged={staged}")
    assert not bad, f"{len(bad)} K read apart from the end of their class: " + "; ".join(bad[:10])


def _recurrent_violations(K, V, NH=None, L=None, sms=132, smem_max=SMEM_MAX, staged=False):
    R, KT, BV, TC, _ = recurrent.tiles(K, V, NH, L, 4, sms, smem_max, staged)
    bad = []
    if R not in (1, 2, 4) or -(-K // (R * KT)) * R > 8:
        bad.append(f"R={R}: not 1, 2 or 4, or more than 8 state rows a lane")
    if KT < 1 or KT > 32 or KT & (KT - 1):
        bad.append(f"KT={KT} is not a power of 2 at most 32")
    if BV < 1 or (KT * BV) % 32 or KT * BV > 1024:
        bad.append(f"KT*BV={KT}*{BV} is not a multiple of 32 at most 1024")
    if TC < 1:
        bad.append(f"TC={TC} < 1")
    if TC * BV * (KT + 1) * 4 > 48 * 1024:
        bad.append("partial sums over 48 KB of static shared memory")
    p = Problem(B=1, T=1, H=1, K=K, V=V, N=1, dtype="float32", g_dtype="float32", log_gate=False)
    dbuf = recurrent.async_copy(p, R, KT, BV, TC) if staged else 0
    smem = recurrent.smem(K, R, KT, BV, TC, dbuf)     # the launch's dynamic shared memory
    if smem + TC * BV * (KT + 1) * 4 > smem_max:
        bad.append(f"shared memory {smem} dynamic + static > {smem_max}")
    if not dbuf and (TC * K > 8 * KT * BV or TC > 8 * KT):     # EK, EV <= 8
        bad.append("more than 8 prefetched elements a thread (registers)")
    where = f"K={K} V={V} NH={NH} L={L} sms={sms} staged={staged}"
    return [f"{where} (R, KT, BV, TC)=({R}, {KT}, {BV}, {TC}): {b}" for b in bad]


def test_recurrent_tiles_all_dims():
    """The grid-free rule (a single set of staged inputs in the 99 KB every sm_80+ GPU has)."""
    bad = [b for K in DIMS for V in DIMS for b in _recurrent_violations(K, V)]
    assert not bad, f"{len(bad)} violations, first: " + "; ".join(bad[:10])


@pytest.mark.parametrize("sms, smem_max", [pytest.param(*d, id=f"SM{d[0]}") for d in DEVICES])
def test_recurrent_tiles_staged_all_dims(sms, smem_max):
    """The grid's rule for cp.async-staged inputs, over grids from idle to full: K and V in
    1..256 multiples of 4 (what cp.async needs, _launch.cp_async_inputs)."""
    grids = ((1, 64), (8, 128), (8, 4096), (64, 512), (128, 4096), (4096, 64))
    bad = [b for K in range(4, MAX_DIM + 1, 4) for V in range(4, MAX_DIM + 1, 4) for NH, L in grids
           for b in _recurrent_violations(K, V, NH, L, sms, smem_max, staged=True)]
    assert not bad, f"{len(bad)} violations, first: " + "; ".join(bad[:10])


@pytest.mark.parametrize("K, V, B, T, H, staged, want", [
    pytest.param(24, 24, 2, 128, 4, True, (1, 32, 4, 64), id="seed-idle-one-row-a-lane"),
    pytest.param(24, 24, 2, 128, 4, False, (2, 16, 8, 32), id="seed-bf16-grid-free"),
    pytest.param(24, 24, 8, 4096, 16, True, (4, 8, 8, 32), id="long24-four-rows"),
    pytest.param(32, 32, 8, 4096, 16, True, (4, 8, 16, 64), id="K32-full-128-threads"),
    pytest.param(24, 24, 1, 2048, 8, True, (2, 16, 8, 32), id="few24-short-segments"),
    pytest.param(64, 64, 1, 128, 16, True, (2, 32, 8, 32), id="K64-few-warps-two-rows"),
    pytest.param(64, 64, 4, 2048, 8, True, (4, 16, 16, 32), id="gla64"),
    pytest.param(128, 128, 1, 512, 8, True, (4, 32, 8, 32), id="K128-one-block-a-SM"),
    pytest.param(128, 128, 1, 256, 16, True, (4, 32, 8, 16), id="K128-two-blocks-a-SM"),
])
def test_recurrent_tiles_h200(K, V, B, T, H, staged, want):
    assert recurrent.tiles(K, V, B * H, T, staged=staged)[:4] == want


def test_recurrent_async_only_where_the_kernel_allows():
    """ASYNC_COPY (cp.async into two sets) exactly where the kernel's static_assert allows it and
    two sets fit in 100 KB; every float32 K, V multiple of 4 gets it, others the register path."""
    bad = []
    for K in DIMS:
        for V in DIMS:
            for dt, gdt, log_gate in (("float32", "float32", False), ("float32", "float32", True),
                                      ("bfloat16", "float32", False), ("float32", "float16", False)):
                p = Problem(B=1, T=1, H=1, K=K, V=V, N=1, dtype=dt, g_dtype=gdt, log_gate=log_gate)
                staged = _launch.cp_async_inputs(p)
                tiles = recurrent.tiles(K, V, 8, 4096, staged=staged)[:4]
                got = recurrent.async_copy(p, *tiles)
                want = int(K % 4 == 0 and V % 4 == 0 and tiles[2] % 4 == 0
                           and dt == gdt == "float32" and not log_gate)
                smem = recurrent.smem(K, *tiles, got)
                if got != want or smem > 100 * 1024:
                    bad.append(f"K={K} V={V} {dt}/{gdt} log={log_gate}: {got} (want {want}), {smem} B")
    assert not bad, f"{len(bad)} violations, first: " + "; ".join(bad[:10])


def _key_tile_violations(K, BV, smem_max):
    KT = chunk.key_tile(K, BV, smem_max)
    bad = []
    if chunk.smem(K, BV, 0, KT) > smem_max:
        bad.append(f"shared memory over {smem_max}")
    if (KT % 16 or KT > chunk.MAX_KT or (K > chunk.MAX_KT and KT < chunk.MIN_KT)
            or (K <= chunk.MAX_KT) != (KT >= K) or -(-K // KT) * KT - K >= KT):
        bad.append(f"not K in whole tiles of a multiple of 16 up to {chunk.MAX_KT}")
    return [f"K={K} BV={BV} smem_max={smem_max} key tile {KT}: {b}" for b in bad]


@pytest.mark.parametrize("smem_max", [pytest.param(d[1], id=f"SM{d[0]}") for d in DEVICES])
def test_chunk_key_tiles_all_dims(smem_max):
    """Every K and every value tile split may pick (a multiple of 8 up to 64) that has a key tile:
    K in whole tiles that fit (that split picks only those: test_chunk_split_all_dims)."""
    bad = [b for K in DIMS for BV in range(8, 65, 8) if chunk.key_tile(K, BV, smem_max)
           for b in _key_tile_violations(K, BV, smem_max)]
    assert not bad, f"{len(bad)} violations, first: " + "; ".join(bad[:10])


def _chunk_violations(K, V, NH, L, itemsize, sms, smem_max):
    split = chunk.split(K, V, NH, L, itemsize, sms, smem_max)
    if split is None:
        return [] if K > chunk.MAX_K or not chunk.key_tile(K, 8, smem_max) else [
            f"K={K} V={V} NH={NH} L={L} itemsize={itemsize} smem_max={smem_max}: refused "
            f"although BV=8 fits"]
    BV, P = split
    NV = -(-V // BV)
    bad = [] if type(BV) is int and type(P) is int else ["BV and P are not ints"]
    L = int(L)
    if BV % 8 or not 8 <= BV <= 64:
        bad.append("BV is not a multiple of 8 in 8..64")
    if BV > -(-V // 8) * 8:
        bad.append("BV is wider than V rounded up to 8")
    if chunk.key_tile(K, BV, smem_max) is None:
        bad.append("no key tile fits")
    if P < 1 or (P > 1 and -(-L // 64) < P * chunk.SEGMENT_CHUNKS):
        bad.append(f"P={P} segments of {-(-L // 64)} chunks")
    if (P - 1) * (K * V + 2 * K) * 4 > L * K * itemsize:
        bad.append("the workspace is larger than q")
    if P > 1 and NH * -(-V // 64) * P > sms:
        bad.append("segments make more than one block per SM at BV=64")
    if P > 1 and BV < min(64, -(-V // 8) * 8) and NH * NV * P // 2 >= 0.75 * sms:
        bad.append("value tiles narrowed although the segments fill the GPU")
    if not bad:             # the message only where something failed: most of the test's time
        return []
    where = f"K={K} V={V} NH={NH} L={L} itemsize={itemsize} smem_max={smem_max} split={split}"
    return [f"{where}: {b}" for b in bad]


@pytest.mark.parametrize("sms, smem_max", [pytest.param(*d, id=f"SM{d[0]}") for d in DEVICES])
@pytest.mark.parametrize("NH", [pytest.param(nh, id=f"NH{nh}") for nh in NHS])
def test_chunk_split_all_dims(NH, sms, smem_max):
    """Every V, and K by class (CHUNK_KS; the key tiles of every K: test_chunk_key_tiles_all_dims)."""
    bad = [b for K in CHUNK_KS for V in DIMS for L, size in LENS
           for b in _chunk_violations(K, V, NH, L, size, sms, smem_max)]
    assert not bad, f"{len(bad)} violations, first: " + "; ".join(bad[:10])


@pytest.mark.parametrize("K, V, NH, L, want", [
    pytest.param(128, 128, 128, 4096, (64, 1), id="big128"),
    pytest.param(64, 64, 32, 2048, (64, 4), id="gla64-segments"),
    pytest.param(64, 64, 32, 128, (16, 1), id="gla64-T128-narrower"),
    pytest.param(24, 24, 128, 4096, (24, 1), id="long24"),
    pytest.param(128, 128, 16, 65536, (64, 4), id="tsweep-B1-H16"),
    pytest.param(128, 256, 8, 64, (16, 1), id="K128-V256-NH8-one-chunk"),
    pytest.param(128, 256, 8, 1024, (64, 4), id="K128-V256-NH8-T1024"),
])
def test_chunk_split_h200(K, V, NH, L, want):
    assert chunk.split(K, V, NH, L) == want


@pytest.mark.parametrize("K, BV, smem_max, want", [
    pytest.param(128, 64, 227 * 1024, 128, id="K128-one-tile"),
    pytest.param(100, 64, 227 * 1024, 112, id="K100-one-tile-padded"),
    pytest.param(256, 64, 227 * 1024, 64, id="K256-BV64-four-tiles"),
    pytest.param(256, 32, 227 * 1024, 96, id="K256-BV32-three-tiles"),
    pytest.param(129, 64, 227 * 1024, 80, id="K129-two-uneven-tiles"),
    pytest.param(255, 64, 227 * 1024, 64, id="K255-last-tile-padded"),
    pytest.param(256, 64, 163 * 1024, None, id="K256-A100-BV64-none"),
    pytest.param(256, 32, 163 * 1024, 64, id="K256-A100-BV32"),
    pytest.param(257, 8, 227 * 1024, None, id="over-MAX_K"),
])
def test_chunk_key_tile(K, BV, smem_max, want):
    assert chunk.key_tile(K, BV, smem_max) == want


def test_chunk_config_gla_1_3b():
    """GLA-1.3B's heads (K 256, V 512, 32 sequence-heads): value tiles of 64 in key tiles, no
    double buffer (one key tile only); the grid fills the H200 (8 value tiles x 32 = 256
    blocks); the shared memory is the kernel's layout with o's sums between key tiles."""
    p = Problem(B=8, T=4096, H=4, K=256, V=512, N=8, dtype="float32", g_dtype="float32", log_gate=False)
    cfg = chunk.config(p, 132, 227 * 1024)
    assert cfg == chunk.Config(BV=64, P=1, DBUF=0, ASYNC_COPY=1, KT=64), cfg
    assert chunk.defines(p, cfg, False)["SMEM_BYTES"] == 4 * (
        (2 * 64 * 68 + 64 * 72 + 64 * 72) + 96 * 68 + 256 * 72 + 64 * 68 + 5 * 64 + 64 * 72)


@pytest.mark.parametrize("K, V, dtype, log_gate, smem_max, want", [
    pytest.param(64, 64, "float32", False, 227 * 1024, 1, id="gla64"),
    pytest.param(128, 128, "float32", False, 227 * 1024, 0, id="K128-no-room"),
    pytest.param(64, 64, "bfloat16", False, 227 * 1024, 0, id="bf16-no-cp.async"),
    pytest.param(64, 64, "float32", True, 227 * 1024, 0, id="log-gate"),
    pytest.param(64, 66, "float32", False, 227 * 1024, 0, id="V-not-multiple-of-4"),
    pytest.param(64, 64, "float32", False, 163 * 1024, 0, id="A100"),
])
def test_chunk_double_buffer(K, V, dtype, log_gate, smem_max, want):
    p = Problem(B=1, T=64, H=1, K=K, V=V, N=1, dtype=dtype, g_dtype="float32" if dtype == "float32"
                else dtype, log_gate=log_gate)
    cfg = chunk.config(p, 132, smem_max, BV=64, P=1)
    assert cfg.DBUF == want and cfg.ASYNC_COPY == (dtype == "float32" and not log_gate and V % 4 == 0)
    assert chunk.smem(K, 64, want) <= smem_max


@pytest.mark.parametrize("K, tiles", [
    pytest.param(64, [64], id="K64"),
    pytest.param(130, [80, 48, 48, 32], id="K130"),
    pytest.param(256, [128, 96, 64, 64, 48, 48, 32], id="K256"),
])
def test_chunk_refusal_names_the_least_shared_memory(K, tiles):
    """Where no tile fits, the refusal names the least that any key tile the rule tries needs
    (with the narrowest value tile); with that many bytes the kernel runs."""
    assert chunk._tiles(K) == tiles
    p = Problem(B=1, T=64, H=1, K=K, V=64, N=1, dtype="float32", g_dtype="float32", log_gate=False)
    need = min(chunk.smem(K, 8, 0, KT) for KT in tiles)
    assert chunk.config(p, 132, need - 4) is None
    assert chunk.refusal(p, 132, need - 4) == (
        f"needs {need} bytes of shared memory per block at K={K}; this GPU has {need - 4}")
    assert chunk.config(p, 132, need) is not None and chunk.refusal(p, 132, need) is None


@pytest.mark.parametrize("K, V, dtype, H, wgmma, want", [
    pytest.param(256, 512, "bfloat16", 4, True, 1, id="gla1.3b-bf16"),
    pytest.param(128, 128, "float32", 16, True, 1, id="big128"),
    pytest.param(64, 64, "float32", 8, True, 1, id="gla64-no-dbuf"),
    pytest.param(120, 48, "float32", 2, True, 1, id="K-padded-in-the-tile"),
    pytest.param(100, 64, "float32", 16, True, 0, id="KT112"),
    pytest.param(256, 7, "float32", 16, True, 0, id="BV8"),
    pytest.param(24, 24, "float32", 16, True, 0, id="KT32"),
    pytest.param(128, 128, "float32", 16, False, 0, id="not-hopper"),
])
def test_chunk_wgmma_variant_where_its_tiles_fit(K, V, dtype, H, wgmma, want):
    """The Hopper variant runs where asked for (a Hopper GPU and chunk.USE_WGMMA) and its tiles
    fit (key tiles of whole m64 blocks, each warpgroup a value half of whole 8-column tiles),
    with one set of staged inputs; its build targets sm_90a, the other's does not."""
    p = Problem(B=8, T=4096, H=H, K=K, V=V, N=8, dtype=dtype, g_dtype=dtype, log_gate=False)
    cfg = chunk.config(p, 132, 227 * 1024, wgmma=wgmma)
    assert cfg.WGMMA == want == chunk.wgmma_fits(cfg.BV, cfg.KT) * wgmma, cfg
    assert not (cfg.WGMMA and cfg.DBUF), cfg
    d = chunk.defines(p, cfg, False)
    assert d["WGMMA"] == want
    assert ("--gpu-architecture=sm_90a" in chunk.FAMILY.compile_options(d)) == bool(want)


def _step_violations(K, V, align):
    KW, VEC = step.tiles(K, V, align)
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
    assert step.tiles(128, V, 16)[1] == want


def _recurrent_split_violations(K, V, NH, L, itemsize, sms, staged):
    R, KT, BV, TC, P = recurrent.tiles(K, V, NH, L, itemsize, sms, staged=staged)
    warps = NH * -(-V // BV) * KT * BV // 32
    bad = [] if type(P) is int and P >= 1 else ["P is not an int >= 1"]
    if P > 1 and int(L) < P * recurrent.SEGMENT_STEPS:
        bad.append(f"segments shorter than {recurrent.SEGMENT_STEPS} steps")
    if (P - 1) * (K * V + 2 * K) * 4 > int(L) * K * itemsize:
        bad.append("the workspace is larger than q")
    if P > 1 and warps * P > max(recurrent.SEGMENT_WARPS, KT * BV // 32) * sms:
        bad.append(f"more than {recurrent.SEGMENT_WARPS} warps (or one block) a SM")
    if P == 2:
        bad.append("two segments")
    if not bad:
        return []
    where = f"K={K} V={V} NH={NH} L={L} itemsize={itemsize} sms={sms} staged={staged} P={P}"
    return [f"{where}: {b}" for b in bad]


@pytest.mark.parametrize("sms", [pytest.param(d[0], id=f"SM{d[0]}") for d in DEVICES])
@pytest.mark.parametrize("NH", [pytest.param(nh, id=f"NH{nh}") for nh in NHS])
def test_recurrent_split_all_dims(NH, sms):
    """Every V, and K by class (RECURRENT_KS)."""
    bad = [b for staged in (False, True) for K in RECURRENT_KS[staged] for V in DIMS
           if not staged or V % 4 == 0 for L, size in LENS
           for b in _recurrent_split_violations(K, V, NH, L, size, sms, staged)]
    assert not bad, f"{len(bad)} violations, first: " + "; ".join(bad[:10])


@pytest.mark.parametrize("K, V, NH, L, want", [
    pytest.param(24, 24, 8, 128, 1, id="seed-two-would-not-pay"),
    pytest.param(24, 24, 8, 2048, 16, id="K24-NH8-T2048"),
    pytest.param(24, 24, 4, 1000, 15, id="K24-NH4-T1000-by-length"),
    pytest.param(24, 24, 32, 512, 4, id="K24-NH32-T512"),
    pytest.param(64, 64, 8, 512, 4, id="K64-NH8-T512"),
    pytest.param(24, 24, 128, 4096, 1, id="long24"),
    pytest.param(64, 64, 32, 2048, 1, id="gla64-grid-full"),
    pytest.param(128, 128, 4, 256, 1, id="K128-NH4-T256-two"),
    pytest.param(24, 24, 1, 64, 1, id="one-segment-of-steps"),
])
def test_recurrent_split_h200(K, V, NH, L, want):
    assert recurrent.tiles(K, V, NH, L)[4] == want


@pytest.mark.parametrize("K, V", [
    pytest.param(24, 24, id="K24-V24"),
    pytest.param(32, 48, id="K32-V48"),
    pytest.param(128, 64, id="K128-V64"),
    pytest.param(5, 1, id="K5-V1"),
])
def test_defines_carry_the_tiles_and_problem(K, V):
    p = Problem(B=1, T=1, H=1, K=K, V=V, N=1, dtype="bfloat16", g_dtype="float32", log_gate=True)
    cfg = recurrent.config(p)
    d = recurrent.defines(p, cfg, seq_int64=True)
    assert (d["R"], d["KT"], d["BV"], d["TC"]) == recurrent.tiles(K, V, 1, 1)[:4]
    assert (d["K_DIM"], d["V_DIM"], d["IO_DTYPE"], d["G_DTYPE"], d["LOG_GATE"], d["SEQ_INT64"]) == (
        K, V, 2, 0, 1, 1)
    assert d["ASYNC_COPY"] == 0 and d["SMEM_BYTES"] == recurrent.smem(K, *cfg[:4])
    d = step.defines(p, idx_int64=False, align=16)
    assert (d["KW"], d["VEC"]) == step.tiles(K, V, 16)
    assert (d["K_DIM"], d["V_DIM"], d["IO_DTYPE"], d["G_DTYPE"], d["LOG_GATE"], d["IDX_INT64"]) == (
        K, V, 2, 0, 1, 0)


@pytest.mark.parametrize("ptr, want", [
    pytest.param(0x7f0000000000, 16, id="16"), pytest.param(0x7f0000000008, 8, id="8"),
    pytest.param(0x7f0000000004, 4, id="4"), pytest.param(0x7f0000000002, 2, id="2"),
])
def test_alignment(ptr, want):
    assert step.alignment(ptr) == want


def test_launch_parameter_buffer():
    """Launch's cuLaunchKernel parameter array points at the pointers, then the plan's sizes,
    then the per-call scalar, each of its ctypes width (read back without a GPU)."""
    import ctypes
    import types
    fn = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=1234))
    fwd = (ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_float)
    la = _launch.Launch(fn, _launch.FORWARD, 7, 256, 1024, P=3, NV=2, H=16, T=4096)
    assert la.names == ("q", "k", "v", "g", "o", "h0", "ht", "cu_seqlens", "ws_s", "ws_d",
                        "only_if")
    la.ptrs[:] = tuple(range(1000, 1011))
    la.scalars[-1].value = 0.5
    got = [ctypes.c_uint64.from_address(la.params[i]).value for i in range(11)]
    got += [t.from_address(la.params[11 + i]).value for i, t in enumerate(fwd)]
    assert got == list(range(1000, 1011)) + [4096, 16, 2, 3, 0.5]
    assert (la.ptr, la.grid, la.block, la.smem) == (1234, 7, 256, 1024)
    st = _launch.Launch(fn, _launch.STEP, 1, 32, 0, H=32, N=64, NV=1)
    assert [t.from_address(st.params[7 + i]).value
            for i, t in enumerate((ctypes.c_int32, ctypes.c_int64, ctypes.c_int32))] == [32, 64, 1]


@pytest.mark.parametrize("sizes", [
    pytest.param(dict(T=1, H=1, NV=1), id="missing-P"),
    pytest.param(dict(T=1, H=1, NV=1, P=1, scale=1.0), id="the-per-call-scalar"),
    pytest.param(dict(T=1, H=1, NV=1, P=1, Q=1), id="unknown"),
])
def test_launch_takes_exactly_the_declared_sizes(sizes):
    import types
    fn = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=1))
    with pytest.raises(TypeError, match="takes the pointers first and every scalar but the last"):
        _launch.Launch(fn, _launch.FORWARD, 1, 32, 0, **sizes)


# ---- the backward (gated_attention_backward): _dispatch.pick_backward, chunk_bwd's rules

@pytest.mark.parametrize("p, want, cpu", [
    pytest.param(P, "recurrent", "recurrent", id="seed-T63"),
    pytest.param(_p(T=511, K=64, B=4, H=8), "recurrent", "chunk", id="T511-K64"),
    pytest.param(_p(T=512, K=24, B=2, H=4), "chunk", "recurrent", id="T512-K24"),
    pytest.param(_p(T=4096, K=128, B=8, H=16), "chunk", "chunk", id="big128"),
    pytest.param(_p(T=31, K=128, B=8, H=16), "recurrent", "recurrent", id="T31-K128"),
    pytest.param(P._replace(T=4096, K=64, V=64, B=1, N=8, H=4), "chunk", "chunk",
                 id="varlen-512"),
    pytest.param(P._replace(T=4095, K=64, V=64, B=1, N=8, H=4), "recurrent", "chunk",
                 id="varlen-below-512"),
])
def test_backward_auto_picks(p, want, cpu):
    assert _dispatch.pick_backward("f", "auto", p, True) == want
    assert _dispatch.pick_backward("f", "auto", p, False) == cpu


def test_backward_named_methods():
    assert _dispatch.pick_backward("f", "chunk", P, True) == "chunk"
    assert _dispatch.pick_backward("f", "recurrent", P, True) == "recurrent"
    assert _dispatch.pick_backward("f", "chunk", P, False) == "chunk"
    assert _dispatch.pick_backward("f", "recurrent", P, False) == "recurrent"
    with pytest.raises(ValueError, match="method must be one of 'auto', 'recurrent', 'chunk'"):
        _dispatch.pick_backward("f", "fused", P, True)


_BF16 = dict(dtype="bfloat16")


def _bf16(T, K, V, B, H):
    """A Problem of bfloat16 inputs (_p's, with V of its own)."""
    return _p(T=T, K=K, B=B, H=H)._replace(V=V, **_BF16)


_PLANES_RULE = [  # bfloat16, dense: (T, K, V, B, H, from the planes, id)
    (2047, 256, 512, 8, 4, True, "T2047"),
    (511, 256, 512, 8, 4, False, "T511"),
    # K = 128 (gda_chunk_fwd's keys in one tile): where V >= 512, or scan_o runs with
    # PLANES_FORWARD_SCAN_O blocks an SM and V >= 192 or T >= 1024
    (4096, 128, 256, 8, 4, True, "gla-340m-bf16-scan_o"),
    (4096, 128, 256, 2, 4, False, "K128-V256-32-blocks"),
    (4096, 128, 128, 8, 4, True, "K128-V128-64-blocks"),
    (1024, 128, 128, 8, 4, True, "K128-V128-T1024"),
    (1023, 128, 128, 8, 4, False, "K128-V128-T1023"),
    (512, 128, 128, 4, 8, False, "K128-V128-T512"),
    (4096, 128, 128, 2, 4, False, "K128-V128-16-blocks"),
    (4096, 128, 192, 2, 4, False, "K128-V192-24-blocks"),
    (2048, 128, 512, 1, 2, True, "K128-V512-two-heads"),
    (4096, 64, 512, 8, 4, False, "K64"),
    # fewer scan blocks than SMs: chains of at most PLANES_FORWARD_CHAIN rows
    (4096, 256, 512, 1, 4, True, "B1-H4-T4096"),
    (4097, 256, 512, 1, 4, False, "B1-H4-T4097"),
    (32768, 256, 512, 1, 8, True, "B1-H8-T32K-256-blocks"),
    # K > 128: V >= 512, scan_o and V >= 192, or a scan block for every other SM
    (2048, 129, 129, 4, 4, True, "K129-V129-144-blocks"),
    (2048, 192, 192, 2, 4, True, "K192-V192-72-blocks"),
    (2048, 192, 192, 1, 2, False, "K192-V192-18-blocks"),
]


_PLANES_RULE_PACKED = [  # bfloat16, K = 256, cu_seqlens: (T, V, N, H, from the planes, id)
    (8192, 512, 4, 5, True, "varlen-H5"),
    (8192, 256, 4, 1, False, "varlen-H1-V256-16-blocks"),
    (4096, 512, 4, 2, True, "varlen-H2-4096-rows"),
    (8192, 512, 8, 2, False, "varlen-H2-8192-rows-64-blocks"),
    (2047, 512, 4, 5, False, "varlen-below-512"),
]


@pytest.mark.parametrize("p, varlen, want", [
    pytest.param(P._replace(T=4096, K=256, V=512, B=8, N=8, H=4, **_BF16), False, True,
                 id="gla-1.3b-bf16"),
    pytest.param(P._replace(T=4096, K=256, V=512, B=8, N=8, H=16, **_BF16), False, True,
                 id="gla-1.3b-bf16-H16"),
    pytest.param(P._replace(T=4096, K=256, V=512, B=8, N=8, H=4), False, False, id="gla-1.3b-fp32"),
    pytest.param(P._replace(T=4096, K=256, V=512, B=8, N=8, H=4, dtype="float16"), False, False,
                 id="gla-1.3b-fp16"),
    pytest.param(_p(T=4096, K=128, B=8, H=16)._replace(**_BF16), False, True, id="big128-bf16"),
    *(pytest.param(_bf16(T, K, V, B, H), False, want, id=i)
      for T, K, V, B, H, want, i in _PLANES_RULE),
    # packed: one chain a head (H of them), the sequences' chunks in turn
    *(pytest.param(P._replace(T=T, K=256, V=V, B=1, N=N, H=H, **_BF16), True, want, id=i)
      for T, V, N, H, want, i in _PLANES_RULE_PACKED),
    # the workspace over PLANES_FORWARD_MAX_BYTES: 0.53 GiB at GLA-1.3B (the planes; 1.7 GiB
    # kept, with every chunk's state: test_kept_workspace_within_the_rule)
    pytest.param(P._replace(T=8192, K=256, V=512, B=8, N=8, H=4, **_BF16), False, True,
                 id="gla-1.3b-T8192"),
    pytest.param(P._replace(T=4096 * 7, K=256, V=512, B=8, N=8, H=4, **_BF16), False, True,
                 id="gla-1.3b-T28672"),
    pytest.param(P._replace(T=4096 * 8, K=256, V=512, B=8, N=8, H=4, **_BF16), False, False,
                 id="gla-1.3b-T32768"),
    pytest.param(P._replace(T=1 << 20, K=256, V=512, B=1, N=1, H=4, **_BF16), False, False,
                 id="prefill-1M"),
])
def test_forward_from_the_planes_where_the_rule_says(p, varlen, want):
    """_dispatch.planes_forward on a Hopper GPU's 132 SMs: bfloat16 inputs, K at least
    chunk.MAX_KT, mean sequence length at least PLANES_FORWARD_FROM, a workspace within
    PLANES_FORWARD_MAX_BYTES, and V >= 512, or scan_o (SCAN_O_FROM blocks an SM) with
    PLANES_FORWARD_SCAN_O blocks an SM and V >= 192 or T >= 1024, or K over chunk.MAX_KT
    (gda_chunk_fwd's key tiles) with a scan block (a state tile of a chain) for every other SM
    (v46's and v50's sweeps); with fewer scan blocks than SMs, chains of at most
    PLANES_FORWARD_CHAIN rows."""
    assert _dispatch.planes_forward(p, varlen, (132, 227 * 1024)) == want
    assert _dispatch.pick("f", "auto", p, True, (132, 227 * 1024)) == "chunk"


@pytest.mark.parametrize("T, H, want", [
    pytest.param(4096, 4, True, id="gla-1.3b-bf16"),
    pytest.param(8192, 4, True, id="T8192"),        # 3.4 GiB kept
    pytest.param(12288, 4, False, id="T12288"),     # 5.1 GiB kept, 1.6 not
    pytest.param(4096, 16, False, id="H16"),        # 6.8 GiB kept, 2.1 not
])
def test_kept_workspace_within_the_rule(T, H, want):
    """A forward that keeps its stages for the backward (keep_states) runs from the planes only
    where the workspace it keeps, every chunk's state too (chunk_bwd.forward_bytes), is within
    PLANES_FORWARD_MAX_BYTES; one that keeps nothing counts its own, the planes, and runs from
    them at each of these shapes."""
    p = P._replace(T=T, K=256, V=512, B=8, N=8, H=H, **_BF16)
    limits = (132, 227 * 1024)
    kept, lean = (chunk_bwd.forward_bytes(p, keep=x, limits=limits) for x in (True, False))
    assert (kept <= _dispatch.PLANES_FORWARD_MAX_BYTES) == want and lean < kept / 3
    assert _dispatch.planes_forward(p, False, limits, keep=True) == want
    assert _dispatch.planes_forward(p, False, limits)


@pytest.mark.parametrize("p, want", [
    pytest.param(_p(T=4096, K=128, B=8, H=16), (64, 64, True, False), id="big128"),
    # 512 scan blocks: 2 waves at 2 an SM or at 3 (each slower): not the planes scan
    pytest.param(_p(T=4096, K=128, B=8, H=16)._replace(**_BF16), (64, 64, True, False),
                 id="big128-bf16"),
    pytest.param(P._replace(T=4096, K=256, V=512, B=8, N=8, H=4), (64, 64, True, False),
                 id="gla-1.3b"),
    # 1024 scan blocks: 3 waves at 3 an SM, 4 at 2: the planes scan
    pytest.param(P._replace(T=4096, K=256, V=512, B=8, N=8, H=4, **_BF16), (64, 64, True, True),
                 id="gla-1.3b-bf16"),
    pytest.param(_p(T=4096, K=64, B=16, H=16)._replace(**_BF16), (64, 64, True, False),
                 id="K64-bf16"),
    pytest.param(_p(T=1024, K=128, B=2, H=4), (32, 64, False, False), id="few-chunks"),
    pytest.param(_p(T=4096, K=24, B=8, H=16), (32, 32, False, False), id="long24"),
    pytest.param(_p(T=2048, K=64, B=4, H=8), (64, 64, False, False), id="gla64"),
    pytest.param(_p(T=1024, K=64, B=4, H=8), (32, 64, False, False), id="gla64-T1024"),
    pytest.param(_p(T=4096, K=48, B=8, H=16), (32, 64, False, False), id="K48"),
])
def test_chunk_backward_config(p, want, monkeypatch):
    # (a GPU other than Hopper's: there a backward from the planes would take scan_dv, v69)
    monkeypatch.setattr(chunk_bwd, "hopper", lambda: False)
    # dv's entry and rows' S0 and E in two terms for half inputs, three for float32 ones
    t = 2 if p.dtype == "bfloat16" else 3
    assert tuple(chunk_bwd.config(p)) == want + (False, 3, t, t, False, False, False, False, False)
    # on a Hopper GPU dv's wgmma entry (three terms), where the chunks are of 64 steps (m64)
    wg = want[0] == 64
    assert tuple(chunk_bwd.config(p, wgmma=True)) == want + (wg, 3, 3 if wg else t, t, False, False,
                                                             False, False, False)
    # the forward from the planes: three terms where it keeps them for the backward, else two
    # and no wgmma
    keep, lean = (chunk_bwd.planes_config(p, wgmma=True, keep=x) for x in (True, False))
    assert keep == chunk_bwd.config(p, wgmma=True)._replace(SCAN=True, PLANES=True)
    assert lean == keep._replace(TERMS=2, WGMMA=False)
    assert chunk_bwd.defines(p, lean, fwd=True)["DV_TERMS"] == 2
    # scan_o by wgmma (on a Hopper GPU) where it keeps nothing, its chunks are of 64 steps and
    # its planes of 128 or 256 keys
    wg = chunk_bwd.planes_config(p, keep=False, scan_o_wg=True)
    assert wg == chunk_bwd.planes_config(p, keep=False)._replace(
        SCAN_O_WG=want[0] == 64 and chunk_bwd.planes(p)[0] in (128, 256))
    assert chunk_bwd.planes_config(p, keep=True, scan_o_wg=True) == chunk_bwd.planes_config(p)
    assert chunk_bwd.defines(p, wg, fwd=True)["SCAN_O_WG"] == int(wg.SCAN_O_WG)


@pytest.mark.parametrize("K, V, want", [(256, 512, True), (256, 64, True), (128, 256, True),
                                        (192, 384, False), (100, 72, True), (64, 64, False)])
def test_lean_forward_takes_scan_o_by_wgmma_at_128_and_256_keys(K, V, want, monkeypatch):
    """Without USE_SCAN_O_WG, a ForwardPlan that keeps nothing takes scan_o's wgmma form on a
    Hopper GPU where its chunks are of 64 steps and its planes of 128 or 256 keys
    (SCAN_O_WG_KEYS: faster there than mma.sync, v53 at 256 keys, v56 at 128; K = 192's planes
    of 192 keys and K = 64's of 64 have no wgmma form); never on another GPU, nor one that
    keeps its stages (its S0 stay by mma.sync), nor with SCAN_O_WG_KEYS empty."""
    p = _p(T=4096, K=K, B=8, H=4)._replace(V=V, **_BF16)
    assert chunk_bwd.config(p).BT == 64
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_WG", False)      # (on since v72)
    for hopper in (True, False):
        monkeypatch.setattr(chunk_bwd, "hopper", lambda: hopper)
        assert chunk_bwd.forward_config(p).SCAN_O_WG == (want and hopper)
        assert not chunk_bwd.forward_config(p, keep=True).SCAN_O_WG
        assert chunk_bwd.forward_config(p) == chunk_bwd.planes_config(p, keep=False,
                                                                      scan_o_wg=want and hopper)
    monkeypatch.setattr(chunk_bwd, "hopper", lambda: True)
    monkeypatch.setattr(chunk_bwd, "SCAN_O_WG_KEYS", ())
    assert not chunk_bwd.forward_config(p).SCAN_O_WG
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_WG", True)       # (every form that can)
    assert chunk_bwd.forward_config(p).SCAN_O_WG == (chunk_bwd.planes(p)[0] in (128, 256))


def test_chunk_backward_two_terms_for_half_inputs(monkeypatch):
    """dv's entry (DV_TERMS) and rows' S0 and E (ROWS_TERMS) in two terms for half inputs (dv's
    not with wgmma), three for float32 ones and wherever DV_TWO_TERMS, ROWS_TWO_TERMS are off;
    a forward's rows entry takes TERMS, its W and o the fewer of TERMS and DV_TERMS."""
    half, f32 = (_p(T=4096, K=128, B=8, H=16)._replace(**kw) for kw in (_BF16, {}))
    def terms(cfg):
        return cfg.DV_TERMS, cfg.ROWS_TERMS
    assert terms(chunk_bwd.config(half)) == (2, 2) and terms(chunk_bwd.config(f32)) == (3, 3)
    assert terms(chunk_bwd.config(half, wgmma=True)) == (3, 2)
    assert terms(chunk_bwd.planes_config(half)) == (2, 2)     # (a backward taking kept stages)
    # a forward keeping three terms makes W (scores) and o (dv's entry) in the backward's two,
    # so that the W it keeps is the backward's; rows' entry, not launched, takes TERMS
    d = chunk_bwd.defines(half, chunk_bwd.planes_config(half), fwd=True)
    assert (d["TERMS"], d["DV_TERMS"], d["ROWS_TERMS"]) == (3, 2, 3)
    d = chunk_bwd.defines(half, chunk_bwd.planes_config(half, wgmma=True), fwd=True)
    assert (d["TERMS"], d["DV_TERMS"], d["WGMMA"]) == (3, 3, 1)
    monkeypatch.setattr(chunk_bwd, "DV_TWO_TERMS", False)
    monkeypatch.setattr(chunk_bwd, "ROWS_TWO_TERMS", False)
    assert (chunk_bwd.config(half).DV_TERMS, chunk_bwd.config(half).ROWS_TERMS) == (3, 3)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_chunk_backward_workspace_sizes(varlen):
    p = P._replace(T=100, K=5, V=7, B=2, N=2, H=3)
    if varlen:              # 5 sequences packed in 100 rows: H heads of 100 / 32 + 5 chunks
        p = p._replace(B=1, N=5)
    ws = chunk_bwd.workspace(p, chunk_bwd.Config(32, 32), varlen)
    NB = 3 * (4 + 5) if varlen else 2 * 3 * 4          # ceil(100 / 32) = 4
    assert chunk_bwd.chunks(p, 32, varlen) == ((3, 9) if varlen else (6, 4))
    assert ws["st"] == ws["et"] == NB * 5 * 7 and ws["mm"] == ws["ww"] == NB * 32 * 32
    assert ws["qa"] == ws["kd"] == ws["ev"] == NB * 32 * 5 and ws["ar"] == 2 * NB * 32 * 5
    assert ws["vp"] == ws["dp"] == NB * 32 * 7 and ws["ae"] == ws["es"] == NB * 5
    # the forward from the planes (ForwardPlan): S0, A_end, W and the planes only
    fw = chunk_bwd.workspace(p, chunk_bwd.Config(32, 32, True, True), varlen, fwd=True)
    kp, vp = chunk_bwd.planes(p)
    assert {n for n, x in fw.items() if x} == {"st", "ae", "ww", "pl"}
    assert (fw["st"], fw["ae"], fw["ww"], fw["pl"]) == (NB * 5 * 7, NB * 5, NB * 32 * 32,
                                                        NB * 32 * (3 * kp + vp))
    # one that keeps none: two planes of q A and of k D (TERMS), the same otherwise
    lean = chunk_bwd.workspace(p, chunk_bwd.Config(32, 32, True, True, TERMS=2), varlen, fwd=True)
    assert lean == dict(fw, pl=NB * 32 * (2 * kp + vp))
    # and with scan_o (the scan and o as one kernel): no chunk's S0
    so = chunk_bwd.workspace(p, chunk_bwd.Config(32, 32, True, True, TERMS=2), varlen, fwd=True,
                             scan_o=True)
    assert so == dict(lean, st=0)
    assert (chunk_bwd.smem(chunk_bwd.Config(64, 64, True, True, TERMS=2)) * 4
            == chunk_bwd.smem(chunk_bwd.Config(64, 64, True, True)) * 3)
    # the backward from them (keep): the backward's own, the forward's (KEPT) none
    bw = chunk_bwd.workspace(p, chunk_bwd.Config(32, 32, True, True), varlen)
    kw = chunk_bwd.workspace(p, chunk_bwd.Config(32, 32, True, True), varlen, keep=True)
    assert {n for n, x in kw.items() if x} == {n for n, x in bw.items() if x} - set(chunk_bwd.KEPT)
    assert all(kw[n] == bw[n] for n in kw if n not in chunk_bwd.KEPT)


@pytest.mark.parametrize("lens", [(100,), (0, 5, 0, 95), (31, 33, 1, 35), (64, 0, 36)])
def test_chunk_backward_varlen_chunks_fit(lens):
    """Each sequence's chunks, at least one (an empty sequence's has no rows), fit chunks()'s
    count for the packed length, for every chunk length."""
    for BT in (32, 64):
        p = P._replace(T=sum(lens), B=1, N=len(lens))
        need = sum(max(1, -(-n // BT)) for n in lens)
        assert need <= chunk_bwd.chunks(p, BT, True)[1]


def test_chunk_backward_workspaces_are_aligned():
    """Each workspace starts 256-byte aligned (the GEMM entries load 4 floats at once, whatever
    the sizes before it), none overlaps the next, and sd shares qa's room."""
    sizes = chunk_bwd.workspace(P._replace(T=100, K=5, V=7, B=1, N=1, H=1), chunk_bwd.Config(32, 32))
    at, total = chunk_bwd.layout(sizes)
    names = list(sizes)
    assert all(at[n] % 64 == 0 for n in at) and at["sd"] == at["qa"]
    assert all(at[a] + sizes[a] <= at[b] for a, b in zip(names, names[1:]))
    assert at[names[-1]] + sizes[names[-1]] <= total < at[names[-1]] + sizes[names[-1]] + 64


@functools.lru_cache(maxsize=None)
def _kernel_defines():
    """gda_chunk_bwd.cu's #defines: {name: [its texts, in the file's order]} (lines joined where
    they end in a backslash, comments dropped), read once."""
    text = (_compile.KERNEL_DIR / "gda_chunk_bwd.cu").read_text().replace("\\\n", " ")
    defs = {}
    for m in re.finditer(r"^#define (\w+) ([^\n]*?)\s*(?://[^\n]*)?$", text, re.M):
        defs.setdefault(m.group(1), []).append(m.group(2))
    return defs


def test_chunk_backward_launcher_sizes_are_the_kernels():
    """The threads and GEMM tile that chunk_bwd launches with are the kernel's own #defines (a
    mismatch would leave tiles unwritten or write past them)."""
    defined = {n: int(t[-1]) for n, t in _kernel_defines().items() if t[-1].isdigit()}
    assert (defined["NTP"], defined["NTG"]) == (chunk_bwd.NTP, chunk_bwd.NTG)
    assert (defined["RING"], defined["PT"], defined["GM"]) == (chunk_bwd.RING, chunk_bwd.GT,
                                                               chunk_bwd.GT)
    assert defined["GM"] == defined["GN"] == chunk_bwd.GT


def _kernel_bytes(name, which=0, **given):
    """gda_chunk_bwd.cu's macro ``name`` (its ``which``-th #define where it has several: FO_BYTES's
    first is SCAN_O_WG's, its second the mma.sync form's) as the kernel computes it from the
    defines ``given`` (K_DIM, BT, TERMS, FWD) and the file's own #defines, C's ?: and integer
    division read as Python's"""
    defs = _kernel_defines()

    def value(n, which=0):
        if n in given:
            return given[n]
        expr = re.sub(r"\(([^()?]+)\?([^():]+):([^()]+)\)", r"((\2) if (\1) else (\3))", defs[n][which])
        names = set(re.findall(r"[A-Za-z_]\w*", expr)) - {"if", "else"}
        return eval(expr.replace("/", "//"), {}, {x: value(x) for x in names})
    return value(name, which)


def test_launchers_shared_memory_is_the_kernels():
    """scan_o_smem and scan_dv_smem give the bytes that scan_o and scan_dv check against their
    FO_BYTES and FD_BYTES (a block traps where it has fewer: a launcher left behind by a change of
    the kernel's layout fails on the GPU, so the two are held together here), over chunks, key
    widths, terms and forms."""
    for K, BT in ((256, 64), (100, 64), (256, 32), (128, 64), (24, 32)):
        p = P._replace(B=2, N=2, T=512, H=2, K=K, V=512, dtype="bfloat16")
        for keep in (False, True):
            cfg = chunk_bwd.planes_config(p, keep=keep)._replace(BT=BT)
            d = dict(K_DIM=K, BT=BT, TERMS=cfg.TERMS)
            if cfg.TERMS == 2:                          # (the mma.sync form: a lean forward)
                assert chunk_bwd.scan_o_smem(p, cfg) == _kernel_bytes("FO_BYTES", 1, FWD=1, **d)
            for fwd in (True, False):                   # (the wgmma form: either)
                wg = cfg._replace(SCAN_O_WG=True)
                assert chunk_bwd.scan_o_smem(p, wg, fwd=fwd) == _kernel_bytes("FO_BYTES", 0, FWD=int(fwd), **d)
            assert chunk_bwd.scan_dv_smem(p, cfg) == _kernel_bytes("FD_BYTES", FWD=0, **d)


def test_scan_o_fits_where_its_shared_memory_and_blocks_do(monkeypatch):
    """A ForwardPlan runs scan_o (the scan and o as one kernel) where it keeps nothing (two
    terms), K is at most 256, its two slots of a chunk's operands fit the device's opt-in
    shared memory (at GLA-1.3B's K = 256 with chunks of 64, 195 KiB, within a Hopper GPU's 227
    KiB and not an A100's 163: the kernel's FO_BYTES, which it checks when it runs) and its
    blocks, a sequence-head's 64 value columns each, number SCAN_O_FROM an SM."""
    p = P._replace(B=8, N=8, T=4096, H=4, K=256, V=512, dtype="bfloat16")     # GLA-1.3B
    lean = chunk_bwd.planes_config(p, keep=False)._replace(BT=64)
    assert chunk_bwd.scan_o_smem(p, lean) == 199680
    assert chunk_bwd.scan_o_smem(p, lean._replace(BT=32)) == 98304
    assert chunk_bwd.scan_o_smem(p._replace(K=100), lean) == 133632     # K rounded up to 128
    # by wgmma (SCAN_O_WG): q A's and k D's planes unpadded (1,024-byte aligned), W's two
    # bfloat16 planes: 208 KiB
    assert chunk_bwd.scan_o_smem(p, lean._replace(SCAN_O_WG=True)) == 212992
    hopper, a100 = 232448, 166912                           # their opt-in bytes a block
    for smem, K, cfg, want in [(hopper, 256, lean, True), (hopper, 256, lean._replace(TERMS=3), False),
                               (hopper, 320, lean, False), (a100, 256, lean, False),
                               (a100, 256, lean._replace(BT=32), True), (a100, 128, lean, True)]:
        monkeypatch.setattr(chunk_bwd, "device_limits", lambda: (132, smem))
        assert chunk_bwd.scan_o_fits(p._replace(K=K), cfg) == want, (smem, K, cfg)
    monkeypatch.setattr(chunk_bwd, "device_limits", lambda: (132, hopper))
    assert chunk_bwd.scan_o_fits(p, lean)                   # 32 sequence-heads x 8: 256 blocks
    # at K > 128 from 0.3 blocks an SM (SCAN_O_FROM times SCAN_O_WIDE), at K <= 128 from 0.2
    assert chunk_bwd.scan_o_fits(p._replace(B=2, N=2), lean)            # 64 blocks
    assert not chunk_bwd.scan_o_fits(p._replace(B=1, N=1), lean)        # 32 (0.24 an SM)
    assert chunk_bwd.scan_o_fits(p._replace(B=1, N=1, K=128), lean)     # 32 at K = 128
    assert not chunk_bwd.scan_o_fits(p._replace(B=1, N=1, H=2), lean)   # 16
    assert chunk_bwd.scan_o_fits(p._replace(B=1, N=1, H=4, V=1024), lean)   # 64 again
    assert chunk_bwd.scan_o_fits(p._replace(B=1, N=5, H=8), lean, True)     # packed: H of them
    assert not chunk_bwd.scan_o_fits(p._replace(B=1, N=5), lean, True)
    assert chunk_bwd.scan_o_fits(p._replace(B=1, N=1, H=2), lean, limits=(48, hopper))
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0.05)
    assert chunk_bwd.scan_o_fits(p._replace(B=1, N=1, H=2), lean)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O", False)
    assert not chunk_bwd.scan_o_fits(p, lean)


def test_scan_dv_fits_a_hopper_backward_from_the_planes(monkeypatch):
    """A backward runs scan_dv (its E scan and dv as one wgmma kernel) where USE_SCAN_DV is on,
    the GPU is a Hopper one, the operands are the planes, chunks of 64 steps, planes of 128 or
    256 keys, dv in two terms and not by dv's wgmma entry, its shared memory (the kernel's
    FD_BYTES) fits (226 KiB at GLA-1.3B's K = 256, three planes of q A) and its blocks, a
    sequence-head's 64 value columns each, number SCAN_DV_FROM an SM."""
    p = P._replace(B=8, N=8, T=4096, H=4, K=256, V=512, dtype="bfloat16")     # GLA-1.3B
    cfg = chunk_bwd.planes_config(p)
    assert (cfg.BT, cfg.PLANES, cfg.TERMS, cfg.DV_TERMS, cfg.SCAN_DV) == (64, True, 3, 2, False)
    assert chunk_bwd.scan_dv_smem(p, cfg) == 231424
    assert chunk_bwd.scan_dv_smem(p._replace(K=100), cfg) == 146944     # K rounded up to 128
    monkeypatch.setattr(chunk_bwd, "device_limits", lambda: (132, 232448))
    monkeypatch.setattr(chunk_bwd, "hopper", lambda: True)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_DV", False)
    assert not chunk_bwd.scan_dv_fits(p, cfg)                            # (USE_SCAN_DV off)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_DV", True)
    assert chunk_bwd.scan_dv_fits(p, cfg)
    for other in (cfg._replace(BT=32), cfg._replace(PLANES=False), cfg._replace(DV_TERMS=3),
                  cfg._replace(WGMMA=True)):
        assert not chunk_bwd.scan_dv_fits(p, other), other
    assert not chunk_bwd.scan_dv_fits(p._replace(K=192), cfg)           # planes of 192 keys
    assert chunk_bwd.scan_dv_fits(p._replace(K=128), cfg)
    assert not chunk_bwd.scan_dv_fits(p._replace(H=2), cfg)             # 128 blocks
    assert not chunk_bwd.scan_dv_fits(p._replace(B=1, N=5), cfg, True)  # packed: H of them
    monkeypatch.setattr(chunk_bwd, "SCAN_DV_FROM", 0.5)
    assert chunk_bwd.scan_dv_fits(p._replace(H=2), cfg)
    monkeypatch.setattr(chunk_bwd, "device_limits", lambda: (108, 166912))   # an A100's
    assert not chunk_bwd.scan_dv_fits(p, cfg)
    monkeypatch.setattr(chunk_bwd, "device_limits", lambda: (132, 232448))
    monkeypatch.setattr(chunk_bwd, "hopper", lambda: False)
    assert not chunk_bwd.scan_dv_fits(p, cfg)
    # the forward's builds never take it (a define of the backward's alone)
    assert chunk_bwd.defines(p, cfg._replace(SCAN_DV=True), fwd=True)["SCAN_DV"] == 0
    assert chunk_bwd.defines(p, cfg._replace(SCAN_DV=True))["SCAN_DV"] == 1


def test_scan_o_makes_the_s0_of_a_backward_with_scan_dv(monkeypatch):
    """With USE_SCAN_O_WG (v41) a backward that runs scan_dv takes its S0 from scan_o's wgmma
    form without o (in place of the scan's forward half), and the forward that keeps its stages
    for it runs scan_o's wgmma form storing each S0 (three terms, one half of o^T in shared
    memory: 222 KiB at K = 256), so that the kept S0 are the backward's own: both where
    scan_dv_fits and K is whole key tiles (scan_o_s0), neither elsewhere."""
    p = P._replace(B=8, N=8, T=4096, H=4, K=256, V=512, dtype="bfloat16")     # GLA-1.3B
    keep = chunk_bwd.planes_config(p)
    assert chunk_bwd.scan_o_smem(p, keep._replace(SCAN_O_WG=True)) == 227328
    assert chunk_bwd.scan_o_smem(p, keep._replace(SCAN_O_WG=True), fwd=False) == 109568
    assert chunk_bwd.scan_o_smem(p._replace(K=128), keep._replace(SCAN_O_WG=True)) == 144896
    assert chunk_bwd.scan_o_smem(p._replace(K=128), keep._replace(SCAN_O_WG=True), fwd=False) == 59904
    monkeypatch.setattr(chunk_bwd, "device_limits", lambda: (132, 232448))
    monkeypatch.setattr(chunk_bwd, "hopper", lambda: True)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_DV", False)
    assert not chunk_bwd.scan_o_s0(p, keep)                           # (USE_SCAN_DV off)
    assert chunk_bwd.planes_config(p, scan_o_wg=True) == keep
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_DV", True)
    assert chunk_bwd.scan_o_s0(p, keep) and chunk_bwd.scan_o_s0(p._replace(K=128), keep)
    assert chunk_bwd.scan_dv_fits(p._replace(K=100), keep)            # scan_dv, but cut key
    assert not chunk_bwd.scan_o_s0(p._replace(K=100), keep)           # tiles: the scan's S0
    assert not chunk_bwd.scan_o_s0(p._replace(H=2), keep)             # 128 blocks: no scan_dv
    wg = chunk_bwd.planes_config(p, scan_o_wg=True)
    assert wg == keep._replace(SCAN_O_WG=True)
    assert chunk_bwd.planes_config(p._replace(K=100), scan_o_wg=True).SCAN_O_WG is False
    # the keeping forward runs scan_o where (and only where) it has SCAN_O_WG, whatever
    # USE_SCAN_O and SCAN_O_FROM say (they rule the forward that keeps nothing)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O", False)
    assert chunk_bwd.scan_o_fits(p, wg) and not chunk_bwd.scan_o_fits(p, keep)
    d = chunk_bwd.defines(p, wg, fwd=True)
    assert (d["SCAN_O_WG"], d["TERMS"], d["DV_TERMS"], d["SCAN_DV"]) == (1, 3, 2, 0)
    d = chunk_bwd.defines(p, wg._replace(SCAN_DV=True))                # the backward's build
    assert (d["SCAN_O_WG"], d["SCAN_DV"], d["KEEP"], d["FWD"]) == (1, 1, 0, 0)


def _fake_launches(monkeypatch, scan_dv, scan_o_wg):
    """chunk_bwd's plans made without a GPU: a Hopper GPU's limits, each Launch a record of
    (entry, grid, block, shared memory bytes) and each build's defines in ``built``, the
    fall-back plans stubs; USE_SCAN_DV and USE_SCAN_O_WG as given."""
    from types import SimpleNamespace
    from cupy_gda import recurrent_bwd
    built = {}

    def function(entry, defines, smem=0):           # (an entry left out of the build: none)
        assert defines["ENTRIES"] >> chunk_bwd.ENTRIES.index(entry) & 1, (entry, defines)
        built[entry] = defines
        return entry
    monkeypatch.setattr(chunk_bwd, "FAMILY", SimpleNamespace(function=function))
    monkeypatch.setattr(chunk_bwd, "Launch",
                        lambda fn, params, grid, block, smem, **sizes: (fn, grid, block, smem))
    monkeypatch.setattr(chunk_bwd, "device_limits", lambda: (132, 232448))
    monkeypatch.setattr(chunk_bwd, "hopper", lambda: True)
    monkeypatch.setattr(chunk_bwd, "capability", lambda: 90)
    monkeypatch.setattr(recurrent_bwd, "plan", lambda p, i64: SimpleNamespace(ws=(0,)))
    monkeypatch.setattr(chunk, "plan", lambda p, i64: None)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_DV", scan_dv)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_WG", scan_o_wg)
    return built


def test_hopper_defaults_take_the_s0_from_scan_o_where_scan_dv_runs(monkeypatch):
    """By default (USE_SCAN_DV since v69, USE_SCAN_O_WG since v72) a Hopper GPU's backward at
    GLA-1.3B bf16 runs scan_dv with its S0 from scan_o's wgmma form, and the forward that keeps
    its stages for it stores them from the same kernel; in both scores writes the planes of q A
    and k D (USE_QK_BY_SCORES since v75), before scan_o reads them; GLA-340M's (128 blocks,
    under one an SM: no planes in its backward) runs neither."""
    assert chunk_bwd.USE_SCAN_DV and chunk_bwd.USE_SCAN_O_WG and chunk_bwd.USE_QK_BY_SCORES
    built = _fake_launches(monkeypatch, chunk_bwd.USE_SCAN_DV, chunk_bwd.USE_SCAN_O_WG)
    p = Problem(B=8, T=4096, H=4, K=256, V=512, N=8, dtype="bfloat16", g_dtype="float32",
                log_gate=False)
    plan = chunk_bwd.BackwardPlan(p)
    assert plan.cfg.SCAN_DV and plan.cfg.SCAN_O_WG
    assert [e for _, e in chunk_bwd.backward_stages(plan.cfg)][:4] == [
        "pack", "scores", "scan_o", "scan_dv"]
    assert built["gda_chunk_bwd_scores"]["QK_BY_SCORES"] == 1
    assert chunk_bwd.ForwardPlan(p, keep=True).cfg.SCAN_O_WG
    d = built["gda_chunk_bwd_scores"]                   # (the keeping forward's build)
    assert d["QK_BY_SCORES"] == 1 and d["FWD"] == 1
    small = chunk_bwd.BackwardPlan(p._replace(K=128, V=256))
    assert not small.cfg.SCAN_DV and not small.cfg.SCAN_O_WG


@pytest.mark.parametrize("scan_dv, scan_o_wg", [(False, False), (True, False), (True, True),
                                                (False, True)])
def test_chunk_backward_plans_launch_their_stages_in_order(monkeypatch, scan_dv, scan_o_wg):
    """At GLA-1.3B's shape on a Hopper GPU (no GPU needed: the launches recorded), each plan of
    the planes queues its stages in order with the grid, threads and shared memory of its
    kernels: by default the scan, scores and dv's entry; with scan_dv (v40) the scan's forward
    half, scores, then scan_dv (none of dv's entry; the kept backward no scan); with scan_o's
    wgmma form too (v41) the backward's S0 by scan_o without o, and the forward that keeps its
    stages by scan_o storing them; scan_o's wgmma form alone changes the lean forward only,
    which takes it at 256 keys without USE_SCAN_O_WG too (SCAN_O_WG_KEYS, v53, v56). With
    scan_dv, and in the forward that keeps its stages by scan_o, scores writes the planes of q
    A and k D (QK_BY_SCORES, v75; a backward's scores then right after pack, numbered 1), and
    with USE_QK_BY_SCORES off pack does, as before."""
    p = Problem(B=8, T=4096, H=4, K=256, V=512, N=8, dtype="bfloat16", g_dtype="float32",
                log_gate=False)
    built = _fake_launches(monkeypatch, scan_dv, scan_o_wg)
    NH, NB, TV = 32, 32 * 64, 8                         # sequence-heads, chunks, value tiles
    dv, wg = scan_dv, scan_dv and scan_o_wg

    def entries(stages):
        return [(n, e[0][14:], e[1], e[2], e[3]) for n, e in stages]

    scan = (3, "scan", NH * 4 * TV, 128, chunk_bwd.smem(chunk_bwd.planes_config(p)))
    s0 = (3, "scan_o", NH * TV, 256, 109568) if wg else scan
    want = ([(1, "pack", NB, 128, 0), (1, "scores", NB, 128, 0), s0,
             (3, "scan_dv", NH * TV, 384, 231424), (4, "rows", NB * 3 * 4, 128, 0),
             (6, "intra", NB * 4, 64, 0)] if dv else
            [(1, "pack", NB, 128, 0), scan, (4, "rows", NB * 3 * 4, 128, 0),
             (5, "scores", NB, 128, 0), (6, "intra", NB * 4, 64, 0), (7, "dv", NB * TV, 128, 0)])
    plan = chunk_bwd.BackwardPlan(p)
    assert (plan.cfg.PLANES, plan.cfg.SCAN_DV, plan.cfg.SCAN_O_WG) == (True, dv, wg)
    assert entries(plan.stages) == want
    assert built["gda_chunk_bwd_pack"]["QK_BY_SCORES"] == dv
    assert plan.cfg.PANELS == wg                        # (the planes in panels: scan_o's S0)
    if dv:                                              # (pack's planes of q A and k D by pack)
        monkeypatch.setattr(chunk_bwd, "USE_QK_BY_SCORES", False)
        old = entries(chunk_bwd.BackwardPlan(p).stages)
        assert old == [want[0], want[2], (5, *want[1][1:]), *want[3:]]
        assert built["gda_chunk_bwd_pack"]["QK_BY_SCORES"] == 0
        monkeypatch.setattr(chunk_bwd, "USE_QK_BY_SCORES", True)
    assert (built["gda_chunk_bwd_pack"]["SCAN_DV"], built["gda_chunk_bwd_pack"]["SCAN_O_WG"]) == (
        dv, wg)
    assert plan.sizes["st"] == NB * 256 * 512           # (every S0, whichever kernel makes them)
    kplan = chunk_bwd.BackwardPlan(p, keep=True)        # from the kept forward: no scores, and
    gone = ("scores", "scan", "scan_o") if dv else ("scores",)   # the scan for E alone (none
    assert entries(kplan.stages) == [w for w in want if w[1] not in gone]   # with scan_dv)
    assert (kplan.cfg.SCAN_DV, kplan.cfg.SCAN_O_WG, kplan.cfg.PANELS) == (dv, False, wg)
    assert built["gda_chunk_bwd_pack"]["KEEP"] == 1
    fk = chunk_bwd.ForwardPlan(p, keep=True)            # the forward that keeps its stages
    assert fk.scan_o == fk.cfg.SCAN_O_WG == fk.cfg.PANELS == wg
    assert built["gda_chunk_bwd_pack"]["QK_BY_SCORES"] == wg
    assert [e[1:] for e in entries([(0, s) for s in fk.stages])] == (
        [("pack", NB, 128, 0), ("scores", NB, 128, 0), ("scan_o", NH * TV, 256, 227328)] if wg else
        [("pack", NB, 128, 0), scan[1:], ("scores", NB, 128, 0), ("dv", NB * TV, 128, 0)])
    assert built["gda_chunk_bwd_pack"]["SCAN_O_WG"] == wg and fk.sizes["st"] == NB * 256 * 512
    assert all(fk.at[n] == kplan.kept_at[n] for n in chunk_bwd.KEPT)   # (where its backward reads)
    fp = chunk_bwd.ForwardPlan(p)                       # the lean forward: scan_o, by wgmma
    assert [e[1:] for e in entries([(0, s) for s in fp.stages])] == [  # (at 256 keys with
        ("scores", NB, 128, 0),                         # USE_SCAN_O_WG off too: SCAN_O_WG_KEYS;
        ("scan_o", NH * TV, 256 + 128, 212992)]         # VROWS: scores writes the planes; a
    assert fp.sizes["st"] == 0 and fp.cfg.SCAN_O_WG     # warpgroup of producer warps)
    monkeypatch.setattr(chunk_bwd, "SCAN_O_WG_KEYS", ())
    fp = chunk_bwd.ForwardPlan(p)                       # by mma.sync (2 producer warps) only
    assert fp.cfg.SCAN_O_WG == scan_o_wg and fp.stages[-1][1:] == (   # with USE_SCAN_O_WG off
        (NH * TV, 256 + 128, 212992) if scan_o_wg else (NH * TV, 256 + 64, 199680))


@pytest.mark.parametrize("V, K, mc", [(512, 256, True), (256, 128, True), (128, 128, True),
                                      (64, 256, False), (1024, 256, False), (192, 256, False)])
def test_lean_forward_runs_scan_o_as_clusters_where_it_can(monkeypatch, V, K, mc):
    """With USE_SCAN_O_MC (v42) the forward that keeps nothing runs scan_o's wgmma form as
    clusters of a sequence-head's value tiles where they are 2, 4 or 8 (V = 128 .. 512; not 1,
    not 3, not 16): its build then holds scores and scan_o alone (scores writes the planes as
    scan_o's shared memory holds them, which the scan and dv's entry would not read right; as
    without clusters, where scan_o reads v's rows from v and scores writes the planes, pack not
    launched: VROWS, every V here), with
    scan_o's launch as before (a block a sequence-head's tile, one cluster the tiles). Off without
    scan_o's wgmma form, in the forward that keeps its stages, and where USE_SCAN_O_MC is off."""
    p = Problem(B=8, T=4096, H=4, K=K, V=V, N=8, dtype="bfloat16", g_dtype="float32",
                log_gate=False)
    built = _fake_launches(monkeypatch, False, True)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_MC", True)
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0)    # (GLA-340M's 128 blocks: under 1 an SM)
    fp = chunk_bwd.ForwardPlan(p)
    NH, TV = 32, chunk_bwd.tiles(V)
    assert fp.scan_o and fp.cfg.SCAN_O_WG and fp.cfg.SCAN_O_MC == mc
    d = built["gda_chunk_bwd_scan_o"]
    assert d["SCAN_O_MC"] == int(mc) and built["gda_chunk_bwd_scores"] is d
    assert "gda_chunk_bwd_pack" not in built
    held = {e for i, e in enumerate(chunk_bwd.ENTRIES) if d["ENTRIES"] >> i & 1}
    assert fp.cfg.VROWS and d["VROWS"] == 1
    assert held == {"gda_chunk_bwd_" + e for e in ("scores", "scan_o")}
    assert [s[0] for s in fp.stages] == ["gda_chunk_bwd_" + e for e in ("scores", "scan_o")]
    assert fp.stages[1][1:3] == (NH * TV, 256 if mc else 256 + 128)   # (no cluster: producer warps)
    assert chunk_bwd.scan_o_mc(p, fp.cfg._replace(SCAN_O_MC=False)) == mc
    fk = chunk_bwd.ForwardPlan(p, keep=True)            # (the one that keeps: never)
    assert not fk.cfg.SCAN_O_MC and built["gda_chunk_bwd_pack"]["SCAN_O_MC"] == 0
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_MC", False)
    assert not chunk_bwd.ForwardPlan(p._replace(B=7)).cfg.SCAN_O_MC
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_MC", True)
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O_WG", False)
    monkeypatch.setattr(chunk_bwd, "SCAN_O_WG_KEYS", ())     # (the lean forward's rule, v53)
    assert not chunk_bwd.ForwardPlan(p._replace(B=6)).cfg.SCAN_O_MC


@pytest.mark.parametrize("V, vrows", [(512, True), (72, True), (8, True), (65, False), (100, False)])
def test_lean_forward_reads_v_rows_where_it_runs_scan_o(monkeypatch, V, vrows):
    """The forward that keeps nothing, where it runs scan_o and V is a multiple of 8, has
    scan_o copy v's rows from v itself (VROWS, v43) and scores write the planes of q A and k D
    (v44): it launches scores and scan_o, its build holds them alone (no plane of v, which the
    scan and dv's entry read; no pack) and its defines say
    VROWS. Not where V is not a multiple of 8 (scan_o's copies are of 16 bytes), not where the
    plan runs the scan and dv's entry, not in the forward that keeps its stages (the backward
    reads v's plane), not with USE_VROWS off; the workspace is the same either way."""
    p = Problem(B=8, T=4096, H=4, K=256, V=V, N=8, dtype="bfloat16", g_dtype="float32",
                log_gate=False)
    built = _fake_launches(monkeypatch, False, False)
    monkeypatch.setattr(chunk_bwd, "SCAN_O_FROM", 0)
    fp = chunk_bwd.ForwardPlan(p)
    d = built["gda_chunk_bwd_scan_o"]
    held = {e for i, e in enumerate(chunk_bwd.ENTRIES) if d["ENTRIES"] >> i & 1}
    assert fp.scan_o and fp.cfg.VROWS == vrows and d["VROWS"] == int(vrows)
    stages = ("scores", "scan_o") if vrows else ("pack", "scores", "scan_o")
    assert held == {"gda_chunk_bwd_" + e for e in (stages if vrows else
                                                   (*stages, "scan", "dv"))}
    assert [s[0] for s in fp.stages] == ["gda_chunk_bwd_" + e for e in stages]
    assert built["gda_chunk_bwd_scores"] is d and ("gda_chunk_bwd_pack" in built) != vrows
    assert chunk_bwd.scan_o_vrows(p, fp.cfg) == vrows
    fk = chunk_bwd.ForwardPlan(p, keep=True)            # (the one that keeps: never)
    assert not fk.cfg.VROWS and built["gda_chunk_bwd_pack"]["VROWS"] == 0
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O", False)     # (the scan and dv's entry: never)
    fs = chunk_bwd.ForwardPlan(p._replace(B=7))
    assert not fs.scan_o and not fs.cfg.VROWS and built["gda_chunk_bwd_pack"]["VROWS"] == 0
    monkeypatch.setattr(chunk_bwd, "USE_SCAN_O", True)
    monkeypatch.setattr(chunk_bwd, "USE_VROWS", False)
    fo = chunk_bwd.ForwardPlan(p)
    assert fo.scan_o and not fo.cfg.VROWS and built["gda_chunk_bwd_scan_o"]["VROWS"] == 0
    assert fo.sizes == fp.sizes
