"""Sequence segments of both forward families on the GPU: a state pass (gda_recurrent_state,
gda_chunk_state) over segments 0..P-2 from S = 0, then the full pass of every segment from the
carried states. Forced splits against the float64 loop under the accuracy contract: empty and
one-step segments, segments longer than short varlen sequences, every gate regime (exact 0s,
1e-30, negative, above 1), half dtypes, log gates, no initial state. The workspace is poisoned
(NaN-filled) like every internal allocation, so an element read before it is written shows."""
import pytest

import cupy_gda
from cupy_gda import _verify
from cupy_gda._verify import Case, varlen_case

pytestmark = pytest.mark.gpu

# gda_chunk_fwd, forced to (BV, P): empty last segments, a chunk a segment, narrower value tiles
CHUNK_CASES = [
    (Case(2, 1000, 2, 64, 64), (64, 2)), (Case(2, 1000, 2, 64, 64), (64, 5)),
    (Case(1, 1024, 2, 64, 64), (64, 16)), (Case(2, 700, 3, 128, 128), (64, 3)),
    (Case(2, 300, 2, 48, 7), (8, 3)), (Case(2, 520, 2, 64, 64), (16, 4)),
    (Case(2, 600, 2, 17, 24, init=False), (24, 4)),
    *((Case(2, 520, 2, 64, 64, gate=g), (64, 4)) for g in _verify.GATES if g != "logsig"),
    (Case(2, 520, 2, 128, 64, gate="zeros", log=True), (64, 3)),
    (Case(2, 520, 2, 128, 128, dtype="bfloat16", log=True), (64, 3)),
    (Case(2, 520, 2, 64, 64, dtype="float16", gate="tiny"), (32, 4)),
    (varlen_case((1, 17, 64, 300, 65, 0, 129, 700), K=64, V=64), (64, 3)),
    (varlen_case((0, 640, 3), K=128, V=128, gate="zeros", dtype="bfloat16"), (64, 6)),
]

# gda_recurrent_fwd, forced to P: a step a segment, more segments than steps (empty ones), K
# padded to the lanes, several value tiles, K = 256
RECURRENT_CASES = [
    (Case(2, 128, 4, 24, 24), 4), (Case(2, 128, 4, 24, 24), 8), (Case(2, 128, 4, 24, 24), 128),
    (Case(2, 50, 2, 24, 24), 64), (Case(2, 300, 2, 100, 40), 3), (Case(2, 40, 3, 5, 1), 6),
    (Case(2, 300, 2, 64, 64), 7), (Case(2, 200, 2, 256, 256), 3), (Case(1, 4096, 2, 128, 128), 16),
    (Case(2, 300, 2, 24, 24, init=False), 5),
    *((Case(2, 200, 2, 24, 24, gate=g), 5) for g in _verify.GATES if g != "logsig"),
    (Case(2, 200, 2, 64, 64, gate="zeros", log=True), 4),
    (Case(2, 200, 2, 128, 128, dtype="bfloat16", log=True), 3),
    (Case(2, 200, 2, 64, 64, dtype="float16", gate="tiny"), 4),
    (varlen_case((1, 17, 64, 300, 0, 3)), 4),
    (varlen_case((0, 140, 3), K=64, V=64, gate="zeros", dtype="bfloat16"), 6),
]


def _run(case, family, split, seed=7):
    """The case through a plan of ``family`` with a forced split, against the references."""
    import cupy
    from cupy_gda import _checks, _launch, chunk, recurrent
    args = _verify.make_inputs(case, seed)
    (o_ref, s_ref), (o_emu, s_emu) = _verify.references(case, args)
    dev = {k: cupy.asarray(x) for k, x in args.items()}
    gate, log_gate = dev.get("gate"), dev.get("log_gate")
    h0, cu = dev.get("initial_state"), dev.get("cu_seqlens")
    p = _checks.check_forward("t", dev["q"], dev["k"], dev["v"], gate, log_gate, h0, cu, cpu=False)
    limits = _launch.device_limits()
    if family == "chunk":
        BV, P = split
        plan = chunk.ChunkPlan(p, False, chunk.config(p, *limits, BV=BV, P=P))
    else:
        P = split
        plan = recurrent.RecurrentPlan(p, False, recurrent.custom(p, *limits, P=P))
    assert plan.cfg.P == P and (plan.state_launch is not None) == (P > 1)
    g = gate if gate is not None else log_gate
    o, s = plan(dev["q"], dev["k"], dev["v"], g, 1.0, h0, cu, True, None)
    return [_verify.compare("o", cupy.asnumpy(o), o_ref, o_emu),
            _verify.compare("state", cupy.asnumpy(s), s_ref, s_emu)]


@pytest.mark.parametrize("case, family, split", [
    *(pytest.param(c, "chunk", s, id=f"chunk-{c.id}-BV{s[0]}-P{s[1]}") for c, s in CHUNK_CASES),
    *(pytest.param(c, "recurrent", P, id=f"recurrent-{c.id}-P{P}") for c, P in RECURRENT_CASES),
])
def test_segments_meet_accuracy_contract(case, family, split):
    for r in _run(case, family, split):
        assert r.ok, f"{case.id} {split} {r.name}: err {r.err:.3e} > bound {r.bound:.3e}"


@pytest.mark.parametrize("case, method", [
    pytest.param(Case(4, 2048, 8, 64, 64, init=False), "chunk", id="gla64-chunk"),
    pytest.param(Case(1, 2048, 8, 24, 24, init=False), "recurrent", id="K24-NH8-T2048-recurrent"),
])
def test_auto_splits_few_sequences_into_segments(case, method):
    """Few sequence-heads take segments on a GPU of 64+ SMs, with the workspace of the state
    pass as the only extra memory, within the size of q."""
    import cupy
    from cupy_gda import _api, _launch
    args = _verify.make_inputs(case, seed=3)
    dev = {k: cupy.asarray(v) for k, v in args.items()}
    _api._FAST.clear()
    o = cupy_gda.gated_attention(**dev, method=method)
    (plan,) = _api._FAST.values()
    if _launch.device_limits()[0] >= 64:
        assert plan.cfg.P > 1 and plan.state_launch is not None, plan.cfg
    assert sum(plan.ws_sizes or (0,)) * 4 <= dev["q"].nbytes
    (o_ref, _), (o_emu, _) = _verify.references(case, args)
    r = _verify.compare("o", cupy.asnumpy(o), o_ref, o_emu)
    assert r.ok, f"err {r.err:.3e} > bound {r.bound:.3e}"
