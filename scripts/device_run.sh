#!/usr/bin/env bash
# Device calls that check and measure everything, in two phases that each fit the device tool's
# 10-minute limit; everything lands in $OUT.
#   suite: install, the whole test suite, cupy-gda verify
#   bench: install, the benchmark (table shapes, with fla when its package folder is in
#          .baselines/), then the T sweep with a plot
# Usage (device tool, carry [".baselines"] for fla):
#   bash scripts/device_run.sh <commit> suite
#   bash scripts/device_run.sh <commit> bench [--no-fla]
set -uo pipefail
commit="${1:-unknown}"
phase="${2:-suite}"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUPY_GDA_COMMIT="$commit"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -3
if [ "$phase" = "suite" ]; then
    timeout 420 python3 -m pytest -q tests > "$out/pytest.txt" 2>&1; tail -3 "$out/pytest.txt"
    timeout 90 cupy-gda verify > "$out/verify.txt" 2>&1; tail -1 "$out/verify.txt"
    exit 0
fi
impl="ours,textbook,fla"
[ "${3:-}" = "--no-fla" ] && impl="ours,textbook"
PYTHONPATH=.baselines timeout 330 cupy-gda bench --impl "$impl" --fla-timeout 60 \
    --shapes seed,gla64,long24,big128,big128-bf16,decode --json "$out/bench.json" \
    > "$out/bench.txt" 2>&1
timeout 110 cupy-gda bench --impl ours --shapes tsweep --budget 1 --json "$out/tsweep.json" \
    --plot "$out/tsweep.png" > "$out/tsweep.txt" 2>&1
grep -v "^bench:" "$out/bench.txt" | head -60
grep -v "^bench:" "$out/tsweep.txt" | grep -E "^tsweep" | grep -v floor
