"""Shared test setup: the `gpu` marker skips with a reason where CuPy has no GPU, every
internally allocated GPU output starts NaN-filled (poisoned) so unwritten elements show, and
test_compile.py's NVRTC compiles start in the background as soon as the tests are collected."""
import pytest

from cupy_gda._interop import gpu_available

HAS_GPU, GPU_WHY = gpu_available()


def _starts_compiles(item):
    return hasattr(getattr(item, "module", None), "start_compiles")


def pytest_collection_modifyitems(config, items):
    # the modules whose compiles start_compiles runs in the background go last (stable order)
    items.sort(key=_starts_compiles)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {GPU_WHY}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start test_compile.py's NVRTC compiles (a process a core) as soon as the tests are
    collected, so they overlap the single-threaded tests, which run before its tests."""
    if session.config.option.collectonly:
        return
    for module in dict.fromkeys(item.module for item in session.items if _starts_compiles(item)):
        module.start_compiles(session)


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
