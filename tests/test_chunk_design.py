"""The product-only chunked designs, checked against the float64 loop references on every gate
regime, gates above 1 too: the forward (scripts/chunk_exact.py) that the tensor-core kernel
follows, the backward (scripts/chunk_backward_exact.py) a chunked backward kernel would, the
sub-block form of that backward's intra-chunk sums (scripts/intra_blocks_exact.py), and the
scores' W with its diagonal blocks anchored at sub-blocks (scripts/scores_subanchors_exact.py);
and one address map, scan_o's copies of the planes into wgmma's swizzled layout."""
import numpy as np
import pytest

from cupy_gda._verify import GATES
from cupy_gda.reference import gated_attention_backward_ref, gated_attention_ref
from scripts.chunk_backward_exact import chunk_backward
from scripts.chunk_exact import chunk_forward
from scripts.intra_blocks_exact import intra_blocks, intra_direct
from scripts.scores_subanchors_exact import scalar_pairs, scores_direct, scores_subanchored
from scripts.scores_diagonal_pairs import diagonal_pairs

REGIMES = dict(GATES, above1=lambda rng, shape: rng.uniform(0.6, 1.4, shape))


@pytest.mark.parametrize("gate", list(REGIMES))
@pytest.mark.parametrize("T, BT, BS", [
    pytest.param(1, 64, 16, id="T1"), pytest.param(63, 64, 16, id="T63"),
    pytest.param(64, 64, 16, id="T64"), pytest.param(200, 64, 16, id="T200"),
    pytest.param(130, 32, 8, id="T130-BT32-BS8"),
])
def test_chunk_design_equals_loop(T, BT, BS, gate):
    rng = np.random.default_rng(T + BT)
    B, H, K, V = 2, 2, 6, 5
    q, k = rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    g = REGIMES[gate](rng, q.shape).astype(np.float64)          # float64 math throughout
    h0 = rng.standard_normal((B, H, K, V)).astype(np.float32)   # states are float32
    o, S = chunk_forward(q, k, v, g, h0.astype(np.float64), BT=BT, BS=BS)
    o_ref, S_ref = gated_attention_ref(q, k, v, g, initial_state=h0, output_final_state=True)
    np.testing.assert_allclose(o, o_ref, rtol=1e-10, atol=1e-11 * max(1, np.abs(o_ref).max()))
    np.testing.assert_allclose(S, S_ref, rtol=1e-10, atol=1e-11 * max(1, np.abs(S_ref).max()))


def test_exact_zero_gate_resets_inside_a_chunk():
    """A gate of exactly 0 at step 37 leaves no trace of steps before it (no 0/0, no inf)."""
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((1, 64, 1, 4)), rng.standard_normal((1, 64, 1, 4))
    v = rng.standard_normal((1, 64, 1, 3))
    g = rng.uniform(0, 1, q.shape)
    g[0, 37] = 0.0
    o, _ = chunk_forward(q, k, v, g)
    o_tail, _ = chunk_forward(q[:, 37:], k[:, 37:], v[:, 37:], g[:, 37:])
    assert np.isfinite(o).all()
    np.testing.assert_allclose(o[:, 37:], o_tail, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("gate", ["logsig", "zeros", "grow"])
def test_half_input_operand_design_meets_contract(gate):
    """The design for bfloat16 inputs in docs/perf-notes.md (scripts/chunk_operand_rounding.py):
    bf16 tensor-core products with the operands that are not inputs split into two bf16 terms
    (v exact) meet the accuracy contract for o and for the final state, as 3xTF32 does; one bf16
    rounding of the state's operands does not."""
    from scripts.chunk_operand_rounding import run
    from cupy_gda._verify import Case
    case = Case(1, 512, 1, 128, 128, dtype="bfloat16", gate=gate)
    got = {name: (o, s) for name, o, s in run(case, seed=3, schemes=(
        ("tf32x3", "tf32x3"), ("bf16x2", "bf16x2"), ("bf16", "bf16")))}
    assert max(got["tf32x3/tf32x3"]) <= 1, got
    assert max(got["bf16x2/bf16x2"]) <= 1, got
    assert got["bf16/bf16"][1] > 1, got       # the state needs the split


@pytest.mark.parametrize("gate", ["logsig", "grow"])
def test_half_input_backward_design_meets_contract(gate):
    """The backward's products for bfloat16 inputs (scripts/chunk_backward_rounding.py,
    docs/perf-notes.md "v36"): dv's two products with their float32 operands split in two
    bfloat16 terms, not three, leave every gradient as the shipped split does (dv rounds to
    bfloat16 after); so do rows' (scale do S0^T, v E^T) within the contract; the shipped split
    meets it."""
    from scripts.chunk_backward_rounding import SPECS, run
    from cupy_gda._verify import Case
    case = Case(1, 128, 1, 16, 16, dtype="bfloat16", gate=gate, g_dtype="float32")
    names = ("shipped (x3 x3 x3)", "dv x2", "rows, dv x2")
    got = run(case, seed=5, specs={n: SPECS[n] for n in names})
    assert all(max(x) <= 1 for x in got.values()), got
    assert np.allclose(got["dv x2"], got["shipped (x3 x3 x3)"], rtol=0.02, atol=1e-3), got


@pytest.mark.parametrize("gate", list(REGIMES))
@pytest.mark.parametrize("T, BT", [pytest.param(1, 64, id="T1"), pytest.param(63, 64, id="T63"),
                                   pytest.param(130, 32, id="T130-BT32")])
def test_chunk_backward_design_equals_reverse_loop(T, BT, gate):
    """scripts/chunk_backward_exact.py (products only, the gate's gradient included) against the
    float64 reverse loop, with an initial state and a final-state gradient."""
    rng = np.random.default_rng(T + BT + 1)
    B, H, K, V = 2, 2, 5, 4
    q, k = rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, K))
    v, do = rng.standard_normal((B, T, H, V)), rng.standard_normal((B, T, H, V))
    g = REGIMES[gate](rng, q.shape).astype(np.float64)
    h0, dht = rng.standard_normal((B, H, K, V)), rng.standard_normal((B, H, K, V))
    got = chunk_backward(q, k, v, g, do, h0, dht, scale=0.7, BT=BT)
    ref = gated_attention_backward_ref(q, k, v, g, do=do, initial_state=h0, d_final_state=dht,
                                       scale=0.7)
    for name, x, r in zip(ref._fields, got, ref):
        np.testing.assert_allclose(x, r, rtol=1e-9, atol=1e-10 * max(1, np.abs(r).max()),
                                   err_msg=name)


def test_chunk_backward_design_zero_gate_gradients_are_the_loops():
    """Gates of exactly 0 inside chunks: every gradient finite and the loop's, the gate's own
    nonzero there (no division by the gate recovers it)."""
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((1, 100, 1, 4)), rng.standard_normal((1, 100, 1, 4))
    v, do = rng.standard_normal((1, 100, 1, 3)), rng.standard_normal((1, 100, 1, 3))
    g = rng.uniform(0, 1, q.shape)
    g[0, [0, 37, 63, 64, 99]] = 0.0
    got = chunk_backward(q, k, v, g, do)
    ref = gated_attention_backward_ref(q, k, v, g, do=do)
    for name, x, r in zip(ref._fields, got, ref):
        if r is None:
            continue
        assert np.isfinite(x).all(), name
        np.testing.assert_allclose(x, r, rtol=1e-10, atol=1e-12, err_msg=name)
    assert (got[3][0, [37, 63, 64]] != 0).all()


@pytest.mark.parametrize("gate", ["logsig", "unif", "zeros", "tiny", "neg"])
def test_chunk_backward_design_meets_contract_in_float32(gate):
    """In float32, each gradient's RMS error against the float64 reverse loop is within the
    contract: at most twice the float32 reverse loop's, plus 1e-6 max|ref|."""
    from cupy_gda._verify import compare
    rng = np.random.default_rng(4)
    shape = (2, 300, 2, 16)
    q, k = (rng.standard_normal(shape, dtype=np.float32) / 4 for _ in range(2))
    v, do = (rng.standard_normal(shape[:3] + (12,), dtype=np.float32) for _ in range(2))
    g = REGIMES[gate](rng, shape).astype(np.float32)
    h0, dht = (rng.standard_normal((2, 2, 16, 12), dtype=np.float32) for _ in range(2))
    got = chunk_backward(q, k, v, g, do, h0, dht)
    ref = gated_attention_backward_ref(q, k, v, g, do=do, initial_state=h0, d_final_state=dht)
    emu = gated_attention_backward_ref(q, k, v, g, do=do, initial_state=h0, d_final_state=dht,
                                       dtype=np.float32)
    for name, x, r, e in zip(ref._fields, got, ref, emu):
        assert x.dtype == np.float32, name
        res = compare(name, x, r, e)
        assert res.ok, res


@pytest.mark.parametrize("gate", list(REGIMES))
@pytest.mark.parametrize("C, SB", [pytest.param(64, 16, id="C64"), pytest.param(32, 16, id="C32"),
                                   pytest.param(48, 8, id="C48-SB8")])
def test_intra_sub_blocks_equal_the_sums(C, SB, gate):
    """intra's sums (dq's, dk's, dg's intra-chunk terms) in sub-blocks, the crossing parts as
    matmuls of anchored keys and queries, equal their defining sums in float64, gates of 0, tiny,
    negative and above 1 included (every decay a product: no 0/0, no inf)."""
    rng = np.random.default_rng(C + SB)
    q, k = rng.standard_normal((C, 3)), rng.standard_normal((C, 3))
    M = rng.standard_normal((C, C))
    g = REGIMES[gate](rng, q.shape).astype(np.float64)
    got, want = intra_blocks(q, k, g, M, SB), intra_direct(q, k, g, M)
    for name, a, b in zip(("DQ", "DK", "T4"), got, want):
        assert np.isfinite(a).all(), name
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12 * max(1, np.abs(b).max()),
                                   err_msg=name)


@pytest.mark.parametrize("gate", list(REGIMES))
@pytest.mark.parametrize("C, BS, SUB", [pytest.param(64, 16, 4, id="C64"),
                                        pytest.param(32, 16, 4, id="C32"),
                                        pytest.param(64, 16, 8, id="C64-SUB8")])
def test_scores_sub_anchors_equal_the_sums(C, BS, SUB, gate):
    """The scores' W with the diagonal blocks' sub-blocks before the diagonal as matmuls of keys
    and queries anchored at each sub-block (the tensor cores' share), only SUB x SUB triangles
    by running products, equals its defining sum in float64, gates of 0, tiny, negative and
    above 1 included (every decay a product), and leaves the CUDA cores 40 of a block's 136
    pairs at SUB = 4."""
    rng = np.random.default_rng(C + SUB)
    q, k = rng.standard_normal((C, 3)), rng.standard_normal((C, 3))
    g = REGIMES[gate](rng, q.shape).astype(np.float64)
    got, want = scores_subanchored(q, k, g, BS, SUB), scores_direct(q, k, g)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12 * max(1, np.abs(want).max()))
    assert (got[np.tril_indices(C, -1)] == 0).all()
    assert (scalar_pairs(64, 16), scalar_pairs(64, 16, 4)) == (4 * 136, 4 * 40)


@pytest.mark.parametrize("gate", list(REGIMES))
@pytest.mark.parametrize("C, DP", [pytest.param(64, 4, id="C64"), pytest.param(48, 4, id="C48"),
                                   pytest.param(32, 8, id="C32"), pytest.param(16, 16, id="C16")])
def test_scores_diagonal_pairs_take_every_pair_once(C, DP, gate):
    """scores' diagonal blocks as its threads take them (v45: a thread two columns u and 15 - u
    of a block, 17 (s, u) from each column down, s <= u only): every (s, u) of a diagonal block
    with s <= u written by one thread once, equal to the defining sum in float64 for every gate
    regime, 0 below the diagonal, the blocks above left to the tensor cores' tiles (chunks of
    16 to 64 steps, the kernel's DP threads a pair)."""
    rng = np.random.default_rng(C + DP)
    q, k = rng.standard_normal((C, 32)), rng.standard_normal((C, 32))
    g = REGIMES[gate](rng, q.shape).astype(np.float64)
    got, writes = diagonal_pairs(q, k, g, DP)
    want = scores_direct(q, k, g)
    blocks = np.kron(np.eye(C // 16, dtype=bool), np.ones((16, 16), bool))
    upper = np.triu(np.ones((C, C), bool))
    assert (writes[blocks & upper] == 1).all() and (writes[~(blocks & upper)] == 0).all()
    np.testing.assert_allclose(got[blocks], want[blocks], rtol=1e-11,
                               atol=1e-12 * max(1, np.abs(want).max()))
    assert (got[~upper] == 0).all() and np.isnan(got[upper & ~blocks]).all()


def _wg_copy_planes(KP, NW, NP, BT=64):
    """kernels/gda_chunk_bwd.cu's gda_wg_copy_planes as its NW warps' threads run it: each
    16-byte copy's (shared byte offset, offset in the planes in halves), in order."""
    LINES, FPB = KP // 64, BT * KP * 2
    STEP = NW // LINES * 4
    copies = []
    for tid in range(32 * NW):
        lane, w = tid % 32, tid // 32
        c8, r0 = (w % LINES * 8 + lane % 8) * 8, w // LINES * 4 + lane // 8
        sw = (c8 // 8 % 8 ^ r0 % 8) * 16
        at, s = c8 // 64 * BT * 128 + r0 * 128, r0 * KP + c8
        for _ in range(NP):
            at0, at4 = at + sw, at + (sw ^ 64)
            copies += [((at4 if d % 8 else at0) + d * 128, s + d * KP) for d in range(0, BT, STEP)]
            at, s = at + FPB, s + BT * KP
    return copies


@pytest.mark.parametrize("NP", [1, 2, 3])
@pytest.mark.parametrize("KP, NW", [(256, 4), (128, 4), (256, 8), (128, 8)])
def test_wg_copy_planes_fill_the_swizzled_layout(KP, NW, NP):
    """scan_o's copies of q A's and k D's planes (v57: a thread's rows r0 + d from two shared
    addresses and one global plus constants; the producer's 4 warps and the 8 without it, 128
    and 256 keys, 1 to 3 planes): every 16 bytes of the planes, row r's 8 keys from c8, copied
    once, to r / BT * FPB + c8 / 64 * BT * 128 + r % BT * 128 + (c8 / 8 % 8 ^ r % 8) * 16,
    FO_SW's 128-byte swizzle (wgmma's layout). (Rows 4 apart, 256 keys by 4 warps, are the
    ones whose swizzle takes two values a thread.)"""
    BT = 64
    copies = _wg_copy_planes(KP, NW, NP, BT)
    want = {(r // BT * BT * KP * 2 + c8 // 64 * BT * 128 + r % BT * 128
             + (c8 // 8 % 8 ^ r % 8) * 16, r * KP + c8)
            for r in range(NP * BT) for c8 in range(0, KP, 8)}
    assert len(copies) == len(want) and set(copies) == want
