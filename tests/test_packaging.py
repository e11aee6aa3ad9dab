"""The wheel ships the kernels: build it from a copy of the tree, install it into a bare target
directory, and read a kernel's source from there (no GPU, no compiler needed).

The build runs on a copy so no build/ or *.egg-info is left in the repository.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

for _mod in ("setuptools", "wheel", "pip"):
    if importlib.util.find_spec(_mod) is None:
        pytest.skip(f"building a wheel needs {_mod} (pip install setuptools wheel)",
                    allow_module_level=True)

# what a clean checkout would not have, or the build writes
_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                 ".pytest_cache", ".baselines", ".whl", ".venv*", ".vendor", ".old*",
                                 ".devrun")


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_IGNORE)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--disable-pip-version-check", "-q", "-w", str(tmp / "dist"), str(src)])
    wheels = list((tmp / "dist").glob("cupy_gda-*.whl"))
    assert len(wheels) == 1, f"expected one cupy_gda wheel, got {wheels}"
    return wheels[0]


def _shipped_sources():
    """Package files of the source tree, as the wheel should name them."""
    kernels = sorted(f"cupy_gda/kernels/{p.name}" for p in (REPO / "kernels").iterdir()
                     if p.suffix in (".cu", ".cuh"))
    modules = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "cupy_gda").rglob("*.py"))
    return kernels, modules


def test_wheel_contains_kernels_and_modules(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels, modules = _shipped_sources()
    for want in ("cupy_gda/kernels/gda_recurrent_fwd.cu", "cupy_gda/kernels/gda_step.cu",
                 "cupy_gda/kernels/common.cuh", "cupy_gda/__init__.py", "cupy_gda/_compile.py",
                 "cupy_gda/_launch.py", "cupy_gda/chunk.py", "cupy_gda/recurrent.py",
                 "cupy_gda/step.py", "cupy_gda/reference.py", "cupy_gda/kernels/mma.cuh", *kernels, *modules):
        assert want in names, f"{wheel.name} lacks {want}; it has {sorted(names)}"
    stray = sorted(n for n in names if n.startswith(("tests/", "kernels/", "scripts/", "docs/")))
    assert not stray, f"{wheel.name} ships files outside the package: {stray}"


def test_wheel_kernels_match_the_tree(wheel):
    z = zipfile.ZipFile(wheel)
    kernels, _ = _shipped_sources()
    for name in kernels:
        assert z.read(name).decode() == (REPO / "kernels" / Path(name).name).read_text(), name


_PROBE = """
import json
from cupy_gda import _compile, bench, chunk
import cupy_gda
print(json.dumps(dict(
    package=cupy_gda.__file__,
    kernel_dir=str(_compile.KERNEL_DIR),
    source=_compile.source("gda_step", {"K_DIM": 24, "V_DIM": 24}),
    chunk_source=_compile.source(chunk.FAMILY.kernel, {}, chunk.FAMILY.headers),
    spin=_compile.source("bench_spin", {}, ()),
    shapes=list(bench.SHAPES),
)))
"""


def test_installed_wheel_reads_its_kernels(wheel, tmp_path):
    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
          "--disable-pip-version-check", "-q", "--target", str(site), str(wheel)])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = _run([sys.executable, "-c", _PROBE], cwd=work, env=env)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    site_real = site.resolve()
    assert Path(got["package"]).resolve().is_relative_to(site_real), (
        f"imported {got['package']}, not the wheel installed in {site}")
    kernel_dir = Path(got["kernel_dir"]).resolve()
    assert kernel_dir == site_real / "cupy_gda" / "kernels", got["kernel_dir"]
    text = got["source"]
    assert "#define K_DIM 24\n" in text and "#define V_DIM 24\n" in text, text[:200]
    assert (REPO / "kernels" / "common.cuh").read_text() in text
    assert (REPO / "kernels" / "gda_step.cu").read_text() in text
    # the chunked kernel with both its headers, and the benchmark's spin kernel (cupy-gda bench
    # reads nothing outside the package)
    for name in ("common.cuh", "mma.cuh", "gda_chunk_fwd.cu"):
        assert (REPO / "kernels" / name).read_text() in got["chunk_source"], name
    assert 'extern "C" __global__ void bench_spin' in got["spin"]
    assert "big128" in got["shapes"]
