"""Framework arrays in, the same framework's arrays out (GPU): zero-copy through DLPack, type
round trip, and ordering on the producer's current stream."""
import numpy as np
import pytest

import cupy_gda
from cupy_gda._interop import Bridge
from cupy_gda.reference import gated_attention_ref

pytestmark = pytest.mark.gpu


def _inputs(B=2, T=50, H=3, K=24, V=40, seed=0):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, T, H, K)) / np.sqrt(K)).astype(np.float32)
    k = (rng.standard_normal((B, T, H, K)) / np.sqrt(K)).astype(np.float32)
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    g = rng.uniform(0.5, 1, (B, T, H, K)).astype(np.float32)
    return q, k, v, g


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


@pytest.fixture
def jax():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    return jax


def test_torch_zero_copy_in(torch):
    x = torch.randn(2, 5, 3, 4, device="cuda")
    br = Bridge("t", {"q": x})
    with br.context():
        y = br.native(x)
    assert y.data.ptr == x.data_ptr()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_round_trip(torch, dtype):
    q, k, v, g = _inputs()
    tdt = getattr(torch, dtype)
    X = [torch.from_numpy(x).cuda().to(tdt) for x in (q, k, v)] + [torch.from_numpy(g).cuda()]
    h0 = torch.randn(2, 3, 24, 40, device="cuda")
    o, s = cupy_gda.gated_attention(*X, initial_state=h0, output_final_state=True)
    assert isinstance(o, torch.Tensor) and isinstance(s, torch.Tensor)
    assert o.dtype == tdt and s.dtype == torch.float32 and o.device == X[0].device
    want = gated_attention_ref(*(x.float().cpu().numpy() for x in X),
                               initial_state=h0.cpu().numpy())
    rel = np.linalg.norm(o.float().cpu().numpy() - want) / np.linalg.norm(want)
    assert rel < {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}[dtype]


def test_torch_non_default_stream(torch):
    """Inputs written on a busy side stream must be seen: the kernel runs on torch's current
    stream, after the writes, and its output is ready on that stream."""
    q, k, v, g = _inputs(T=200)
    want = gated_attention_ref(q, k, v, g)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        X = [torch.zeros(x.shape, device="cuda") for x in (q, k, v, g)]
        src = [torch.from_numpy(x).cuda() for x in (q, k, v, g)]
        side.wait_stream(torch.cuda.default_stream())
        torch.cuda._sleep(50_000_000)          # ~25 ms of GPU time before the inputs land
        for dst, s in zip(X, src):
            dst.copy_(s)
        o = cupy_gda.gated_attention(*X)
        o = o * 1.0                           # consumed on the side stream
    side.synchronize()
    np.testing.assert_allclose(o.cpu().numpy(), want, rtol=1e-4, atol=1e-5)


def test_torch_step_updates_state_in_place(torch):
    B, H, K, V = 4, 2, 16, 16
    rng = np.random.default_rng(1)
    q, k, v = (torch.from_numpy(rng.standard_normal((B, H, d)).astype(np.float32)).cuda()
               for d in (K, K, V))
    g = torch.rand(B, H, K, device="cuda")
    state = torch.randn(B + 1, H, K, V, device="cuda")
    before = state.clone()
    idx = torch.tensor([3, 0, 4, 1], device="cuda")
    o = cupy_gda.gated_attention_step(q, k, v, g, state=state, state_indices=idx)
    assert isinstance(o, torch.Tensor)
    S = g[..., None] * before[idx] + k[..., None] * v[:, :, None, :]
    torch.testing.assert_close(state[idx], S)
    torch.testing.assert_close(state[2], before[2], rtol=0, atol=0)
    torch.testing.assert_close(o, torch.einsum("bhk,bhkv->bhv", q, S), rtol=1e-5, atol=1e-5)


def test_jax_round_trip(jax):
    import jax.numpy as jnp
    q, k, v, g = _inputs()
    X = [jnp.asarray(x) for x in (q, k, v, g)]
    o, s = cupy_gda.gated_attention(*X, output_final_state=True)
    assert isinstance(o, jax.Array) and isinstance(s, jax.Array)
    np.testing.assert_allclose(np.asarray(o), gated_attention_ref(q, k, v, g), rtol=1e-4, atol=1e-5)


def test_jax_step_points_to_functional_form(jax):
    import jax.numpy as jnp
    x = jnp.ones((2, 1, 4))
    with pytest.raises(TypeError, match="immutable.*initial_state=state, output_final_state=True"):
        cupy_gda.gated_attention_step(x, x, x, x, state=jnp.zeros((2, 1, 4, 4)))


def test_cupy_on_current_stream():
    import cupy
    q, k, v, g = _inputs()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        X = [cupy.asarray(x) for x in (q, k, v, g)]
        o = cupy_gda.gated_attention(*X)
        s.synchronize()
    np.testing.assert_allclose(o.get(), gated_attention_ref(q, k, v, g), rtol=1e-4, atol=1e-5)
