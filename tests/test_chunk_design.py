"""The product-only chunked design (scripts/chunk_exact.py) that the tensor-core kernel
follows, checked against the float64 loop reference on every gate regime, gates above 1 too."""
import numpy as np
import pytest

from cupy_gda._verify import GATES
from cupy_gda.reference import gated_attention_ref
from scripts.chunk_exact import chunk_forward

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
