"""Issue 15: the PyTorch adapter (cupy_gda.torch). Its gradients against torch's autograd
through a plain float64 loop over t (every gate regime, log gates of -inf, initial and final
states in the loss, packed sequences), within the accuracy contract; torch.library.opcheck of
both custom ops; a torch.compile(fullgraph=True) training step against eager; on the GPU also
CUDA-graph capture of forward + backward, and every CuPy allocation taken from torch's
caching allocator."""
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cupy_gda  # noqa: E402 - after the skip
import cupy_gda.torch as gda_torch  # noqa: E402
from cupy_gda._verify import compare  # noqa: E402

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def _loop(q, k, v, g, h0, scale, cu):
    """(o, final state): the recurrence as a plain loop over t in torch, which autograd
    differentiates (the gradients' reference)."""
    B, T, H, K = q.shape
    V = v.shape[3]
    N = B if cu is None else len(cu) - 1
    outs, finals = [], []
    for n in range(N):
        b, t0, t1 = (n, 0, T) if cu is None else (0, int(cu[n]), int(cu[n + 1]))
        S = h0[n] if h0 is not None else q.new_zeros(H, K, V)
        o = []
        for t in range(t0, t1):
            S = g[b, t, :, :, None] * S + k[b, t, :, :, None] * v[b, t, :, None, :]
            o.append(scale * torch.einsum("hk,hkv->hv", q[b, t], S))
        outs.append(torch.stack(o) if o else v.new_zeros(0, H, V))
        finals.append(S)
    o = torch.stack(outs) if cu is None else torch.cat(outs)[None]
    return o, torch.stack(finals)


def _gate(regime, rng, shape):
    u = rng.uniform(0.3, 1, shape)
    if regime == "zeros":                   # exact resets (log gate -inf)
        return np.where(rng.random(shape) < 0.3, 0.0, u)
    if regime == "neg":
        return rng.uniform(-1, 1, shape)
    return u


def _inputs(B, T, H, K, V, regime, lens, init, seed):
    """Float64 NumPy inputs (q, k, v, gate, initial state or None) and cu_seqlens or None."""
    rng = np.random.default_rng(seed)
    N = B if lens is None else len(lens)
    if lens is not None:
        B, T = 1, sum(lens)
    xs = [rng.standard_normal((B, T, H, K)) / K ** 0.5, rng.standard_normal((B, T, H, K)),
          rng.standard_normal((B, T, H, V)), _gate(regime, rng, (B, T, H, K)),
          rng.standard_normal((N, H, K, V)) if init else None]
    cu = None if lens is None else np.concatenate([[0], np.cumsum(lens)])
    return xs, cu


def _leaves(xs, dtype, device, log):
    """Leaf tensors requiring grad; the gate as its log when ``log``."""
    out = []
    for i, x in enumerate(xs):
        if x is None:
            out.append(None)
            continue
        if i == 3 and log:
            with np.errstate(divide="ignore"):
                x = np.log(x)
        out.append(torch.tensor(x, dtype=dtype, device=device, requires_grad=True))
    return out


def _loss_terms(o, S, W, Wf, final):
    return (o * W).sum() + ((S * Wf).sum() if final else 0)


def _reference(xs, cu, log, scale, final, dtype, W, Wf):
    """The loop's (o, S, gradients of the given inputs) on CPU in ``dtype``."""
    leaves = _leaves(xs, dtype, "cpu", log)
    q, k, v, g, h0 = leaves
    o, S = _loop(q, k, v, g.exp() if log else g, h0, scale, cu)
    given = [x for x in leaves if x is not None]
    grads = torch.autograd.grad(_loss_terms(o, S, W.to(dtype), Wf.to(dtype), final), given)
    return [o, S, *grads]


def _adapter(xs, cu, log, scale, final, device, W, Wf):
    """The adapter's (o, S, gradients of the given inputs) in float32 on ``device``."""
    q, k, v, g, h0 = _leaves(xs, torch.float32, device, log)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    gate, log_gate = (None, g) if log else (g, None)
    o, S = gda_torch.gated_attention(q, k, v, gate, log_gate=log_gate, scale=scale,
                                     initial_state=h0, output_final_state=True, cu_seqlens=cu_t)
    assert o.dtype == torch.float32 and S.dtype == torch.float32 and o.device.type == device
    given = [x for x in (q, k, v, g, h0) if x is not None]
    grads = torch.autograd.grad(_loss_terms(o, S, W.to(device), Wf.to(device), final), given)
    return [o, S, *grads]


def _check_contract(names, got, ref, emu):
    for name, x, r, e in zip(names, got, ref, emu):
        x = x.detach().cpu().double().numpy()
        assert np.isfinite(x).all(), name
        res = compare(name, x, r.detach().numpy(), e.detach().numpy())
        assert res.ok, f"{name}: err {res.err:.3e} > bound {res.bound:.3e}"


# (B, T, H, K, V, gate regime, log gate, packed lengths, initial state, final state in the loss)
CASES = [
    pytest.param((2, 33, 2, 5, 7, "unif", False, None, True, True),
                 id="B2-T33-H2-K5-V7-gate_unif-init-final"),
    pytest.param((2, 33, 2, 5, 7, "zeros", False, None, True, True),
                 id="B2-T33-H2-K5-V7-gate_zeros-init-final"),
    pytest.param((2, 33, 2, 5, 7, "zeros", True, None, True, True),
                 id="B2-T33-H2-K5-V7-log_gate_-inf-init-final"),
    pytest.param((2, 20, 3, 8, 4, "neg", False, None, False, False),
                 id="B2-T20-H3-K8-V4-gate_neg"),
    pytest.param((1, 0, 2, 6, 9, "zeros", True, (9, 0, 17), True, True),
                 id="varlen-9-0-17-H2-K6-V9-log_gate_-inf-init-final"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_gradients_are_the_loops(case, device):
    """o, the final state and every gradient (q, k, v, the gate given, the initial state) in
    float32 against the float64 loop through torch's autograd, within the contract: at most
    twice the error of the same loop in float32, plus 1e-6·max|ref|; finite where gates are 0
    (log gates -inf)."""
    B, T, H, K, V, regime, log, lens, init, final = case
    xs, cu = _inputs(B, T, H, K, V, regime, lens, init, seed=1)
    rng = np.random.default_rng(2)
    W = torch.tensor(rng.standard_normal(xs[2].shape))
    Wf = torch.tensor(rng.standard_normal((len(lens) if lens else B, H, K, V)))
    ref = _reference(xs, cu, log, 0.5, final, torch.float64, W, Wf)
    emu = _reference(xs, cu, log, 0.5, final, torch.float32, W, Wf)
    got = _adapter(xs, cu, log, 0.5, final, device, W, Wf)
    names = ["o", "final_state"] + [n for n, x in zip(("dq", "dk", "dv", "dgate", "dh0"), xs)
                                     if x is not None]
    _check_contract(names, got, ref, emu)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("used", ["o", "final_state"])
def test_one_output_alone_in_the_loss(used, device):
    """The other output's gradient is None to the op (no d_final_state; do of zeros)."""
    xs, _ = _inputs(2, 17, 2, 4, 6, "unif", None, True, seed=3)
    q, k, v, g, h0 = _leaves(xs, torch.float32, device, log=False)
    o, S = gda_torch.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)
    got = torch.autograd.grad((o if used == "o" else S).square().sum(), (q, k, v, g, h0))
    rq, rk, rv, rg, rh0 = _leaves(xs, torch.float64, "cpu", log=False)
    ro, rS = _loop(rq, rk, rv, rg, rh0, 1.0, None)
    ref = torch.autograd.grad((ro if used == "o" else rS).square().sum(), (rq, rk, rv, rg, rh0),
                              materialize_grads=True)       # (S_T does not depend on q)
    for name, x, r in zip(("dq", "dk", "dv", "dgate", "dh0"), got, ref):
        torch.testing.assert_close(x.cpu().double(), r, rtol=1e-4, atol=1e-5, msg=name)


def test_float64_gradcheck():
    """On the CPU float64 inputs run in float64: torch's finite differences agree."""
    xs, cu = _inputs(1, 0, 2, 3, 2, "zeros", (4, 0, 3), True, seed=4)
    q, k, v, g, h0 = _leaves(xs, torch.float64, "cpu", log=False)
    cu = torch.tensor(cu)

    def f(q, k, v, g, h0):
        return gda_torch.gated_attention(q, k, v, g, scale=0.7, initial_state=h0,
                                         output_final_state=True, cu_seqlens=cu)

    assert torch.autograd.gradcheck(f, (q, k, v, g, h0))
    lg = torch.nn.functional.logsigmoid(torch.randn(q.shape, dtype=torch.float64))
    lg.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, lg: gda_torch.gated_attention(
        q, k, v, log_gate=lg, initial_state=h0, cu_seqlens=cu), (q, lg))


def test_errors_are_the_cores():
    xs, _ = _inputs(1, 4, 1, 3, 2, "unif", None, False, seed=5)
    q, k, v, g, _ = _leaves(xs, torch.float32, "cpu", log=False)
    with pytest.raises(ValueError, match=r"k must have shape \[B, T, H, K\]"):
        gda_torch.gated_attention(q, k[..., :2], v, g)
    with pytest.raises(ValueError, match="exactly one of gate"):
        gda_torch.gated_attention(q, k, v)


def _opcheck_args(device):
    """Sample arguments of both ops: packed sequences with a gate and both states; batch rows
    with a log gate and neither."""
    xs, cu = _inputs(1, 0, 2, 4, 6, "zeros", (5, 0, 7), True, seed=6)
    q, k, v, g, h0 = _leaves(xs, torch.float32, device, log=False)
    cu = torch.tensor(cu, dtype=torch.int32, device=device)
    lg = torch.log(g.detach() + 0.1).requires_grad_(True)
    do = torch.randn(v.shape, device=device)
    dht = torch.randn(h0.shape, device=device)
    forward = [(q, k, v, g, None, 0.5, h0, True, cu, "auto", True, False),
               (q, k, v, None, lg, 1.0, None, False, None, "chunk", True, True)]
    plain = [x.detach() for x in (q, k, v, g, lg, h0)]
    backward = [(*plain[:4], None, do, 0.5, plain[5], dht, cu),
                (*plain[:3], None, plain[4], do, 1.0, None, None, None)]
    return forward, backward


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    forward, backward = _opcheck_args(device)
    for args in forward:
        torch.library.opcheck(torch.ops.cupy_gda.gated_attention.default, args)
    for args in backward:
        torch.library.opcheck(torch.ops.cupy_gda.gated_attention_backward.default, args)


def _loss_fn(W, Wf):
    def loss(q, k, v, log_gate, h0):
        o, S = gda_torch.gated_attention(q, k, v, log_gate=log_gate, scale=0.5,
                                         initial_state=h0, output_final_state=True)
        return (o * W).sum() + (S * Wf).sum()
    return loss


def _compiled_matches_eager(device, backend):
    """A training step: the loss compiled whole (fullgraph: a graph break raises), then
    loss.backward() through the compiled graph, on two sequence lengths (the second traced
    with dynamic shapes): the loss and every gradient those of the same step run eagerly."""
    torch._dynamo.reset()
    for T in (24, 40):
        xs, _ = _inputs(2, T, 2, 8, 8, "zeros", None, True, seed=T)
        rng = np.random.default_rng(7)
        W = torch.tensor(rng.standard_normal((2, T, 2, 8)), dtype=torch.float32, device=device)
        Wf = torch.tensor(rng.standard_normal((2, 2, 8, 8)), dtype=torch.float32, device=device)
        loss = _loss_fn(W, Wf)
        compiled = torch.compile(loss, fullgraph=True, backend=backend)
        eager_in = _leaves(xs, torch.float32, device, log=True)
        comp_in = _leaves(xs, torch.float32, device, log=True)
        want, got = loss(*eager_in), compiled(*comp_in)
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want)
        for name, a, b in zip(("q", "k", "v", "log_gate", "h0"), comp_in, eager_in):
            assert a.grad is not None and torch.isfinite(a.grad).all(), name
            torch.testing.assert_close(a.grad, b.grad, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_training_step(device):
    _compiled_matches_eager(device, "aot_eager")


# ---- GPU only

@pytest.mark.gpu
def test_compiled_training_step_inductor():
    """The default backend: the ops as fallback kernels between Triton's (which builds its
    launcher with a C compiler)."""
    pytest.importorskip("triton")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("Triton needs a C compiler (cc or gcc): none on PATH")
    _compiled_matches_eager("cuda", "inductor")


@pytest.mark.gpu
def test_cupy_allocates_only_from_torch():
    """With CuPy's own allocator refusing, both ops still run (their outputs, workspaces and
    copies all come from torch's caching allocator, which counts the outputs); autograd then
    gives finite gradients. (The backward op is called directly: autograd runs it on a thread
    of its own, where this thread's CuPy allocator does not apply.)"""
    import cupy

    def refuse(size):
        raise AssertionError(f"CuPy's own allocator was asked for {size} bytes")

    # B1 T2048 H8 K24: the forward splits the sequences into segments, with a workspace
    xs, _ = _inputs(1, 2048, 8, 24, 24, "unif", None, True, seed=8)
    q, k, v, g, h0 = _leaves(xs, torch.float32, "cuda", log=False)
    do, dht = torch.randn(v.shape, device="cuda"), torch.randn(h0.shape, device="cuda")
    backward_args = (*(x.detach() for x in (q, k, v, g)), None, do, 1.0, h0.detach(), dht, None)
    gda_torch.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)  # compiles
    torch.ops.cupy_gda.gated_attention_backward(*backward_args)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with cupy.cuda.using_allocator(refuse):
        o, S = gda_torch.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)
        assert torch.cuda.memory_allocated() - before >= o.nbytes + S.nbytes
        before = torch.cuda.memory_allocated()
        grads = torch.ops.cupy_gda.gated_attention_backward(*backward_args)
        assert torch.cuda.memory_allocated() - before >= sum(x.nbytes for x in grads)
    grads = torch.autograd.grad((o * do).sum() + (S * dht).sum(), (q, k, v, g, h0))
    for x, r in zip(grads, (q, k, v, g, h0)):
        assert x.shape == r.shape and torch.isfinite(x).all()


@pytest.mark.gpu
def test_cuda_graph_capture_of_forward_and_backward():
    """Forward and backward captured once in a torch.cuda.CUDAGraph (after a warm-up on a side
    stream), replayed with new input values copied in: the loop's results on those values."""
    B, T, H, K, V = 2, 40, 2, 16, 12
    xs, _ = _inputs(B, T, H, K, V, "zeros", None, True, seed=9)
    static = _leaves(xs, torch.float32, "cuda", log=False)
    rng = np.random.default_rng(10)
    W = torch.tensor(rng.standard_normal((B, T, H, V)))
    Wf = torch.tensor(rng.standard_normal((B, H, K, V)))
    Wc, Wfc = W.float().cuda(), Wf.float().cuda()

    def train_step():
        o, S = gda_torch.gated_attention(*static[:4], initial_state=static[4], scale=0.5,
                                         output_final_state=True)
        grads = torch.autograd.grad(_loss_terms(o, S, Wc, Wfc, True), static)
        return [o, S, *grads]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):              # compiles the kernels, fills the plan caches
            train_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = train_step()
    names = ["o", "final_state", "dq", "dk", "dv", "dgate", "dh0"]
    for seed in (11, 12):
        new, _ = _inputs(B, T, H, K, V, "zeros", None, True, seed=seed)
        with torch.no_grad():
            for x, n in zip(static, new):
                x.copy_(torch.tensor(n, dtype=torch.float32))
        graph.replay()
        torch.cuda.synchronize()
        ref = _reference(new, None, False, 0.5, True, torch.float64, W, Wf)
        emu = _reference(new, None, False, 0.5, True, torch.float32, W, Wf)
        _check_contract(names, outs, ref, emu)


@pytest.mark.gpu
def test_keep_states_holds_them_to_the_backward():
    """keep_states=True at a shape whose GPU forward runs from the planes and keeps its chunk
    states (B4 T2048 H4 K=V=192 bf16): the forward op returns their workspace (the size its
    fake gives: opcheck's fake-tensor test), autograd holds it to the backward, and the gradients are bit for bit
    the core's backward given the same states; the same compiled whole (fullgraph)."""
    import cupy
    from cupy_gda import _api, _checks, chunk_bwd
    xs, _ = _inputs(4, 2048, 4, 192, 192, "unif", None, True, seed=13)
    rng = np.random.default_rng(14)
    W = torch.tensor(rng.standard_normal((4, 2048, 4, 192)), dtype=torch.bfloat16, device="cuda")
    Wf = torch.tensor(rng.standard_normal((4, 4, 192, 192)), dtype=torch.float32, device="cuda")

    def leaves():
        return [torch.tensor(x, dtype=torch.bfloat16 if i < 4 else torch.float32, device="cuda",
                             requires_grad=True) for i, x in enumerate(xs)]

    def step(fn, xs):
        o, S = fn(*xs)
        return [o, S, *torch.autograd.grad((o * W).sum() + (S * Wf).sum(), xs)]

    def attention(q, k, v, g, h0):
        return gda_torch.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True,
                                         keep_states=True)

    x = leaves()
    plain = [t.detach() for t in x]
    args = (*plain[:4], None, 1.0, plain[4], True, None, "auto", True, True)
    o, S, ws, flag = torch.ops.cupy_gda.gated_attention.default(*args)
    p = _checks.Problem(4, 2048, 4, 192, 192, 4, "bfloat16", "bfloat16", False)
    assert ws.numel() * 4 == chunk_bwd.forward_bytes(p) == _api.gpu_kept_bytes("t", p, "auto") > 0
    assert flag.shape == (1,) and flag.dtype == torch.int32
    # (not test_aot_dispatch_dynamic: it compares every output's values, and the workspace
    # holds room that no forward stage writes, do's plane, which the backward's pack fills:
    # whatever the allocator left there)
    torch.library.opcheck(torch.ops.cupy_gda.gated_attention.default, args, test_utils=(
        "test_schema", "test_autograd_registration", "test_faketensor"))
    want = cupy_gda.gated_attention_backward(
        *plain[:4], do=W, initial_state=plain[4], d_final_state=Wf,
        states=cupy_gda.ChunkStates(ws, flag))
    got = step(attention, x)
    assert torch.equal(got[0], o) and torch.equal(got[1], S)
    for name, a, b in zip(("dq", "dk", "dv", "dgate", "dh0"), got[2:], want):
        assert torch.equal(a, b), name
    compiled = step(torch.compile(attention, fullgraph=True, backend="aot_eager"), leaves())
    for name, a, b in zip(("o", "S", "dq", "dk", "dv", "dgate", "dh0"), compiled, got):
        assert torch.equal(a, b), name
    cupy.cuda.Device().synchronize()


def test_cpu_bfloat16_tensors_through_the_core():
    """bfloat16 CPU tensors, which NumPy's DLPack import refuses, go in as views of their memory
    and come back as bfloat16 tensors: the NumPy path's results on the same values."""
    import ml_dtypes
    rng = np.random.default_rng(11)
    q, k = (torch.tensor(rng.standard_normal((1, 9, 2, 4)), dtype=torch.bfloat16) for _ in "qk")
    v = torch.tensor(rng.standard_normal((1, 9, 2, 3)), dtype=torch.bfloat16)
    g = torch.tensor(rng.uniform(0.5, 1, (1, 9, 2, 4)), dtype=torch.bfloat16)
    o, S = cupy_gda.gated_attention(q, k, v, g, output_final_state=True)
    grads = cupy_gda.gated_attention_backward(q, k, v, g, do=v)
    as_np = [x.float().numpy().astype(ml_dtypes.bfloat16) for x in (q, k, v, g)]
    o_np, S_np = cupy_gda.gated_attention(*as_np, output_final_state=True)
    g_np = cupy_gda.gated_attention_backward(*as_np, do=as_np[2])
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert np.array_equal(o.float().numpy(), o_np.astype(np.float32))
    assert np.array_equal(S.numpy(), S_np)
    for a, b in zip(grads[:4], g_np[:4]):
        assert a.dtype == torch.bfloat16
        assert np.array_equal(a.float().numpy(), b.astype(np.float32))
