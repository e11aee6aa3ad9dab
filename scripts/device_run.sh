#!/usr/bin/env bash
# One device call that checks and measures everything (fits the device tool's 10-minute limit):
#   install, the whole test suite, cupy-gda verify, the benchmark (table shapes with fla when its
#   package folder is in .baselines/, then the T sweep with a plot). Everything lands in $OUT.
# Usage (device tool, carry [".baselines"]): bash scripts/device_run.sh <commit> [--no-fla]
set -uo pipefail
commit="${1:-unknown}"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUPY_GDA_COMMIT="$commit"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -3
timeout 240 python3 -m pytest -q tests > "$out/pytest.txt" 2>&1; tail -1 "$out/pytest.txt"
timeout 60 cupy-gda verify > "$out/verify.txt" 2>&1; tail -1 "$out/verify.txt"
impl="ours,textbook,fla"
[ "${2:-}" = "--no-fla" ] && impl="ours,textbook"
PYTHONPATH=.baselines timeout 300 cupy-gda bench --impl "$impl" --fla-timeout 60 \
    --shapes seed,gla64,long24,big128,big128-bf16,decode --json "$out/bench.json" \
    > "$out/bench.txt" 2>&1
timeout 120 cupy-gda bench --impl ours --shapes tsweep --budget 2 --json "$out/tsweep.json" \
    --plot "$out/tsweep.png" > "$out/tsweep.txt" 2>&1
grep -v "^bench:" "$out/bench.txt" | head -45
grep -v "^bench:" "$out/tsweep.txt" | grep -E "^tsweep" | grep -v floor
