"""Shared test setup: the `gpu` marker skips with a reason where CuPy has no GPU, every
internally allocated GPU output starts NaN-filled (poisoned) so unwritten elements show,
test_compile.py's NVRTC compiles start in the background as soon as the tests are collected
(not under pytest-xdist: there its workers share them out), CuPy's memory pools are emptied
after each module (pytest-xdist's workers share the GPU), and verify's NumPy runs and the
backward's references are made once a session."""
import os
import sys

import numpy as np
import pytest

# JAX (test_jax.py, test_interop.py) would take 75 % of the GPU at first use, in every
# pytest-xdist worker, leaving CuPy's tests short: it allocates as it goes instead
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from cupy_gda import _verify
from cupy_gda._interop import gpu_available

HAS_GPU, GPU_WHY = gpu_available()


def _starts_compiles(item):
    return hasattr(getattr(item, "module", None), "start_compiles")


def _xdist_worker(config):
    return hasattr(config, "workerinput")


def _build_order(item):
    return item.module.build_order(item) if _starts_compiles(item) else ()


def pytest_collection_modifyitems(config, items):
    # the modules whose compiles start_compiles runs in the background go last (stable order),
    # their tests in the order their builds start (build_order), so that they pass one by one
    # as the builds finish rather than all at once after the last; under pytest-xdist, which
    # runs no such pool, first: the longest tests, dealt out before the short ones so that no
    # worker is left with a run of them at the end
    items.sort(key=lambda item: (_starts_compiles(item) != _xdist_worker(config), _build_order(item)))
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {GPU_WHY}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start test_compile.py's NVRTC compiles (a process a core) as soon as the tests are
    collected, so they overlap the single-threaded tests, which run before its tests. Not in a
    pytest-xdist worker, which collects every test but runs those it is given: a pool in each
    would compile every kernel once a worker; the workers' tests compile their own instead."""
    if session.config.option.collectonly or _xdist_worker(session.config):
        return
    for module in dict.fromkeys(item.module for item in session.items if _starts_compiles(item)):
        module.start_compiles(session)


@pytest.fixture(autouse=True, scope="module")
def _free_gpu_pools():
    """Give back the GPU memory CuPy's pools keep cached after each module: under pytest-xdist
    what one worker keeps, another worker's large test cannot have."""
    yield
    cupy = sys.modules.get("cupy")       # not imported: nothing cached
    if HAS_GPU and cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


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


_run_case = _verify.run_case        # the real one: tests monkeypatch _verify.run_case
_numpy_runs = {}
_backward_references = _verify.backward_references
_backward_refs = {}


def _shared_backward_references(case, args, do, dht):
    """_verify.backward_references (the float64 and float32 reverse loops), once a session for
    the same case and the same input bytes: test_api's NumPy runs of verify's backward cases and
    test_backward's by each method (the same inputs, seed 0) share them."""
    import hashlib
    arrays = (*sorted(args.items()), ("do", do), ("dht", dht))
    if not all(x is None or isinstance(x, np.ndarray) for _, x in arrays):
        return _backward_references(case, args, do, dht)      # (NumPy inputs only)
    digest = hashlib.sha1()
    for name, x in arrays:
        digest.update(f"{name} {None if x is None else (x.dtype, x.shape)}".encode())
        if x is not None:
            digest.update(np.ascontiguousarray(x).tobytes())
    key = (case, digest.hexdigest())
    if key not in _backward_refs:
        _backward_refs[key] = _backward_references(case, args, do, dht)
    return _backward_refs[key]


_verify.backward_references = _shared_backward_references


def run_case(case, backend="numpy", seed=0, method="auto"):
    """_verify.run_case, each NumPy run once a session: test_api's runs of verify's sweep and
    test_cli's `cupy-gda verify` without a GPU (the same cases, seed and method) share them."""
    if backend != "numpy":
        return _run_case(case, backend, seed, method)
    key = (case, seed, method)
    if key not in _numpy_runs:
        _numpy_runs[key] = _run_case(case, backend, seed, method)
    return list(_numpy_runs[key])
