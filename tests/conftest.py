"""Shared test setup: the `gpu` marker skips with a reason where CuPy has no GPU, and every
internally allocated GPU output starts NaN-filled (poisoned) so unwritten elements show."""
import pytest

from cupy_gda._interop import gpu_available

HAS_GPU, GPU_WHY = gpu_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {GPU_WHY}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _poison_outputs(monkeypatch):
    from cupy_gda import _launch
    monkeypatch.setattr(_launch, "POISON", True)


# the array library a test runs on: NumPy always, CuPy where a GPU is
BACKENDS = [pytest.param("numpy", id="numpy"), pytest.param("cupy", id="cupy", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def to_backend(x, backend):
    """A NumPy array (or None) on the test's backend."""
    if x is None or backend == "numpy":
        return x
    import cupy
    return cupy.asarray(x)
