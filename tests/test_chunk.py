"""The chunked tensor-core kernel (kernels/gda_chunk_fwd.cu, method="chunk") on the GPU: every
standard forward case it takes, chunk-boundary and varlen shapes, every gate regime (exact 0s,
1e-30, negative, above 1), half dtypes and log gates, each against the float64 loop under the
accuracy contract, with poisoned (NaN-filled) outputs."""
import numpy as np
import pytest

import cupy_gda
from cupy_gda import _verify
from cupy_gda._verify import Case, varlen_case

pytestmark = pytest.mark.gpu


def _forward(cases):
    return [c for c in cases if not c.step and not c.backward]


CASES = _forward(_verify.standard_cases())
CASES += [
    # across chunk (64) and sub-block (16) boundaries, partial last chunks
    Case(2, 15, 2, 32, 32), Case(2, 17, 2, 32, 32), Case(1, 127, 3, 64, 64),
    Case(2, 129, 2, 128, 128), Case(1, 1000, 2, 128, 128, gate="unif"),
    Case(1, 4096, 1, 64, 64),
    # value tiles: V over 64, odd V, V < 8
    Case(2, 200, 2, 64, 200), Case(2, 130, 2, 48, 7), Case(2, 100, 2, 128, 3),
    # K not a multiple of 16 or 32
    Case(2, 150, 2, 17, 24), Case(2, 150, 2, 100, 64), Case(2, 150, 2, 112, 40),
    # every gate regime across several chunks
    *(Case(2, 300, 2, 64, 64, gate=g) for g in _verify.GATES),
    *(Case(2, 300, 2, 128, 64, gate=g, log=True) for g in ("zeros", "tiny", "logsig")),
    Case(1, 200, 2, 128, 128, gate="grow"),
    # half dtypes over several chunks
    Case(2, 300, 2, 128, 128, dtype="bfloat16"), Case(2, 300, 2, 64, 64, dtype="float16", gate="zeros"),
    Case(2, 300, 2, 128, 128, dtype="bfloat16", log=True, init=False),
    # bfloat16 inputs take bf16 mma (operands split in two bf16 terms, v exact): every gate
    # regime, K and V off the tiles, chunk boundaries, value tiles over 64
    *(Case(2, 300, 2, 64, 64, dtype="bfloat16", gate=g) for g in _verify.GATES),
    Case(2, 129, 2, 17, 24, dtype="bfloat16"), Case(2, 150, 2, 100, 7, dtype="bfloat16", gate="neg"),
    Case(2, 200, 2, 40, 200, dtype="bfloat16", log=True), Case(1, 2000, 2, 128, 128, dtype="bfloat16", gate="unif"),
    # varlen: segments ending inside chunks and sub-blocks, empty ones
    varlen_case((1, 17, 64, 300, 65, 0, 129), K=64, V=64),
    varlen_case((200, 0, 3), K=128, V=128, gate="zeros", dtype="bfloat16"),
    # key tiles (K over 128): even and uneven splits, the last tile padded, every gate regime,
    # half dtypes and log gates, the register and cp.async loads, segments, varlen
    Case(2, 200, 2, 256, 64), Case(2, 150, 2, 129, 40), Case(2, 130, 2, 255, 24, dtype="float16"),
    Case(1, 300, 2, 200, 72, dtype="bfloat16", log=True), Case(2, 100, 3, 144, 9, init=False),
    *(Case(2, 200, 2, 256, 64, gate=g) for g in _verify.GATES),
    *(Case(2, 200, 2, 192, 64, dtype="bfloat16", gate=g) for g in ("zeros", "tiny", "neg", "grow", "big")),
    Case(1, 2000, 2, 256, 128, gate="unif"), Case(1, 1500, 1, 256, 64, dtype="bfloat16"),
    varlen_case((1, 17, 64, 300, 65, 0, 129), K=256, V=48),
    # any V: value tiles up to 1024 columns, odd V, with one and several key tiles
    Case(2, 130, 2, 256, 512), Case(2, 130, 2, 256, 512, dtype="bfloat16"), Case(2, 70, 2, 64, 1024),
    Case(1, 100, 2, 128, 1000, dtype="float16", log=True), Case(2, 70, 1, 24, 777),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_chunk_meets_accuracy_contract(case):
    for r in _verify.run_case(case, "cupy", seed=5, method="chunk"):
        assert r.ok, f"{case.id} {r.name}: err {r.err:.3e} > bound {r.bound:.3e} (max abs {r.max_abs:.3e})"


def _problem(c):
    """The Problem of forward Case ``c`` (its gate dtype aside: the tiles do not depend on it)."""
    from cupy_gda._checks import Problem
    T, N = (sum(c.lengths), len(c.lengths)) if c.lengths else (c.T, c.B)
    return Problem(c.B, T, c.H, c.K, c.V, N, c.dtype, "float32", c.log)


def _takes_wgmma(c):
    from cupy_gda import chunk
    cfg = chunk.config(_problem(c), 132, 227 * 1024, wgmma=True)
    return cfg is not None and cfg.WGMMA == 1


# the Hopper variant (WGMMA; off by default, chunk.USE_WGMMA): the cases above it takes on the
# H200 (key tiles a multiple of 64, value tiles of 16), and more at its edges: one and two m64
# row blocks, value tiles of 16 to 64, K padded inside a tile, every gate regime, half dtypes
WGMMA_CASES = list({c.id: c for c in CASES + [
    Case(2, 130, 2, 120, 48), Case(2, 200, 2, 50, 32, dtype="bfloat16"), Case(1, 3000, 1, 128, 64),
    *(Case(2, 200, 2, 128, 128, dtype="bfloat16", gate=g) for g in _verify.GATES),
] if _takes_wgmma(c)}.values())


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in WGMMA_CASES])
def test_chunk_wgmma_meets_accuracy_contract(case, monkeypatch):
    from cupy_gda import _api, _launch, chunk
    if not _launch.hopper():
        pytest.skip("the wgmma variant needs a Hopper GPU (compute capability 9.0)")
    monkeypatch.setattr(chunk, "USE_WGMMA", True)
    monkeypatch.setattr(_api, "_FAST", {})     # plans of these shapes that an earlier test kept
    for r in _verify.run_case(case, "cupy", seed=6, method="chunk"):
        assert r.ok, f"{case.id} {r.name}: err {r.err:.3e} > bound {r.bound:.3e} (max abs {r.max_abs:.3e})"
    p = _problem(case)
    used = [pl.cfg for key, pl in _launch._PLANS.items()
            if key[0] is chunk.ChunkPlan and key[-1] is True and key[2][:6] == p[:6]]
    assert used and all(cfg.WGMMA == 1 for cfg in used), used


def test_chunk_equals_recurrent_on_a_long_sequence():
    """Two GPU paths, same inputs, T = 8192 (128 chunks): they agree to float32 accuracy."""
    import cupy
    args = _verify.make_inputs(Case(2, 8192, 4, 128, 128), seed=1)
    dev = {k: cupy.asarray(v) for k, v in args.items()}
    oc, sc = cupy_gda.gated_attention(**dev, output_final_state=True, method="chunk")
    orr, sr = cupy_gda.gated_attention(**dev, output_final_state=True, method="recurrent")
    for a, b in ((oc, orr), (sc, sr)):
        a, b = cupy.asnumpy(a).astype(np.float64), cupy.asnumpy(b).astype(np.float64)
        rel = np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2))
        assert rel < 1e-5, rel


def test_auto_runs_chunk_on_long_sequences():
    from cupy_gda import _api
    import cupy
    args = _verify.make_inputs(Case(8, 256, 8, 128, 128, init=False), seed=2)
    dev = {k: cupy.asarray(v) for k, v in args.items()}
    _api._FAST.clear()
    cupy_gda.gated_attention(**dev)
    plans = [type(p).__name__ for p in _api._FAST.values()]
    assert plans == ["ChunkPlan"], plans
