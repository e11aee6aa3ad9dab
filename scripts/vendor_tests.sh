#!/usr/bin/env bash
# Vendors what the device's test runs need beyond its own Python packages into .vendor/ for the
# device machine, which has no package registry: hypothesis (the property tests) and pytest-xdist
# (the suite phase's workers), with their runtime dependencies except pytest, which the device
# has (a second copy first on the path would shadow its own). scripts/device_run.sh puts .vendor
# first on PYTHONPATH where these import from it there, and the device call carries it (carry
# [".vendor"]). The same versions as here, so the property tests' derandomized draws are the
# ones run here.
# A pure-Python package is copied from this environment's site-packages (install pytest-xdist
# here first: pip install pytest-xdist). One with compiled extension modules (hypothesis itself
# since it has hypothesis/_native, built for one Python version) is fetched instead as its wheel
# of the same version for the device's Python (pip download from the package index) and
# unpacked. Every package gets a line saying which.
# .vendor/ goes into .git/info/exclude: it travels only when carried and is never committed.
# Usage: bash scripts/vendor_tests.sh [DEVICE_PYTHON (3.12)]   (PYTHON: this side's python)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
device_py="${1:-3.12}"
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF "/.vendor/" "$exclude" 2>/dev/null || echo "/.vendor/" >> "$exclude"
rm -rf .vendor
mkdir .vendor
"${PYTHON:-python3}" - "$device_py" <<'PY'
import importlib.metadata as md
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:                     # pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement

device_py = sys.argv[1]
# the device's side of each requirement's marker (e.g. exceptiongroup: python_version < "3.11")
device = dict(python_version=device_py, python_full_version=f"{device_py}.0", extra="",
              sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
              implementation_name="cpython", platform_python_implementation="CPython")
# manylinux tags a device wheel may carry (pip matches each exactly)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
dest = pathlib.Path(".vendor")
# pytest counts as done: the device runs the tests with its own
todo, done = ["hypothesis", "pytest-xdist"], {"pytest"}
while todo:
    dist = md.distribution(todo.pop())
    name = dist.metadata["Name"]
    if name.lower() in done:
        continue
    done.add(name.lower())
    for r in dist.requires or []:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate(device):
            todo.append(req.name)
    files = [f for f in dist.files or []
             if not str(f).startswith("..") and "__pycache__" not in f.parts]   # no scripts, caches
    compiled = [str(f) for f in files if f.suffix in (".so", ".pyd")]
    if not compiled:
        for f in files:
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(dist.locate_file(f), dest / f)
        print(f"{name} {dist.version}: pure Python, copied from {dist.locate_file('')}")
        continue
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", device_py, "--implementation", "cp", "-d", tmp,
               f"{name}=={dist.version}"]
        for p in PLATFORMS:
            cmd[-1:-1] = ["--platform", p]
        subprocess.run(cmd, check=True)
        wheel = next(pathlib.Path(tmp).glob("*.whl"))
        zipfile.ZipFile(wheel).extractall(dest)
    built = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.suffix in (".so", ".pyd"))
    print(f"{name} {dist.version}: compiled here ({', '.join(compiled)}); unpacked {wheel.name} "
          f"for Python {device_py} ({', '.join(built)})")
PY
du -sh .vendor | sed 's/\t/ /; s/$/ (carry [".vendor"])/'
