#!/usr/bin/env bash
# Device calls that check and measure everything, in phases that each fit the device tool's
# 10-minute limit; everything lands in $OUT.
#   suite: install, the whole test suite, cupy-gda verify
#   bench: install, the benchmark of ours and the textbook kernel (table shapes), then the T
#          sweep with a plot
#   fla:   install, fla's rows of the same shapes (needs its package folder in .baselines/; its
#          autotuning at a new shape can take minutes, so it runs apart and cannot cost ours)
# Usage (device tool, carry [".baselines"] for fla):
#   bash scripts/device_run.sh <commit> suite|bench|fla
set -uo pipefail
commit="${1:-unknown}"
phase="${2:-suite}"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUPY_GDA_COMMIT="$commit"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -3
if [ "$phase" = "suite" ]; then
    timeout 500 python3 -m pytest -q tests > "$out/pytest.txt" 2>&1; tail -3 "$out/pytest.txt"
    timeout 90 cupy-gda verify > "$out/verify.txt" 2>&1; tail -1 "$out/verify.txt"
    exit 0
fi
shapes="seed,gla64,long24,big128,big128-bf16,decode,few24,few64"
if [ "$phase" = "fla" ]; then
    PYTHONPATH=.baselines timeout 540 cupy-gda bench --impl fla --fla-timeout 60 --shapes "$shapes" \
        --json "$out/bench-fla.json" > "$out/bench-fla.txt" 2>&1
    grep -v "^bench:" "$out/bench-fla.txt" | head -40
    exit 0
fi
timeout 300 cupy-gda bench --impl ours,textbook --shapes "$shapes" --json "$out/bench.json" \
    > "$out/bench.txt" 2>&1
timeout 150 cupy-gda bench --impl ours --shapes tsweep --budget 1 --json "$out/tsweep.json" \
    --plot "$out/tsweep.png" > "$out/tsweep.txt" 2>&1
grep -v "^bench:" "$out/bench.txt" | head -60
grep -v "^bench:" "$out/tsweep.txt" | grep -E "^tsweep" | grep -v floor
