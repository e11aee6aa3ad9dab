#!/usr/bin/env bash
# Device calls that check and measure everything, in phases that each fit the device tool's
# 10-minute limit; everything lands in $OUT.
#   suite-a, suite-b: install, the test suite in two halves that each fit one call (a: the
#            files in SUITE_A; b: every other file, so a new one is never left out), then (b)
#            cupy-gda verify
#   bench:   install, the benchmark of ours and the textbook kernel (table shapes), then the T
#            sweep with a plot
#   fla:     install, fla's rows of the same shapes (needs its package folder in .baselines/;
#            its autotuning at a new shape can take minutes, so it runs apart and cannot cost ours)
#   sanitize: install, compute-sanitizer's memcheck, racecheck and synccheck over `cupy-gda
#            verify` with each forward family (every define set of its sweep; the step kernel
#            with each), and memcheck over tests/test_edges.py (forced segments, stepped chunks)
#   compare: `cupy-gda bench --shapes SHAPES --impl ours` of an older tree (its files in .old/,
#            e.g. `git archive <commit> | tar -x -C .old`) and of this one, in one run, ROUNDS
#            times each, interleaved (old, new, old, new, ...), and the ratios of the best times
# Usage (device tool; carry [".baselines"] for fla, [".old"] for compare):
#   bash scripts/device_run.sh <commit> suite-a|suite-b|sanitize|bench|fla
#   bash scripts/device_run.sh <commit> compare <old commit> [SHAPES (all)] [ROUNDS (1)]
set -uo pipefail
commit="${1:-unknown}"
phase="${2:-suite}"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUPY_GDA_COMMIT="$commit"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -3
SUITE_A="dispatch interop packaging reference scripts segments validation chunk edges"
if [ "$phase" = "suite-a" ]; then
    timeout 540 python3 -m pytest -q $(for f in $SUITE_A; do echo "tests/test_$f.py"; done) \
        > "$out/pytest-a.txt" 2>&1; tail -3 "$out/pytest-a.txt"
    exit 0
fi
if [ "$phase" = "suite-b" ]; then
    timeout 450 python3 -m pytest -q tests $(for f in $SUITE_A; do echo "--ignore=tests/test_$f.py"; done) \
        > "$out/pytest-b.txt" 2>&1; tail -3 "$out/pytest-b.txt"
    timeout 90 cupy-gda verify > "$out/verify.txt" 2>&1; tail -1 "$out/verify.txt"
    exit 0
fi
if [ "$phase" = "sanitize" ]; then
    for tool in memcheck racecheck synccheck; do
        for method in chunk recurrent; do
            f="$out/sanitize-$tool-$method.txt"
            timeout 170 compute-sanitizer --tool "$tool" --error-exitcode 3 cupy-gda verify --method "$method" \
                > "$f" 2>&1
            echo "$tool $method: rc $? | $(grep -E 'ERROR SUMMARY|cases,' "$f" | tr '\n' ' ')"
        done
    done
    f="$out/sanitize-memcheck-edges.txt"
    timeout 170 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -p no:cacheprovider \
        tests/test_edges.py > "$f" 2>&1
    echo "memcheck test_edges: rc $? | $(grep -E 'ERROR SUMMARY|passed|failed' "$f" | tr '\n' ' ')"
    exit 0
fi
if [ "$phase" = "compare" ]; then
    old="${3:-old}" cmp_shapes="${4:-all}" rounds="${5:-1}"
    for round in $(seq "$rounds"); do
        (cd .old && PYTHONPATH=. python3 -c "import cupy_gda; print('old tree:', cupy_gda.__file__)" && \
         CUPY_GDA_COMMIT="$old" PYTHONPATH=. timeout 260 python3 -m cupy_gda bench \
            --shapes "$cmp_shapes" --impl ours --json "$out/bench-old-$round.json" > "$out/bench-old-$round.txt" 2>&1)
        timeout 260 cupy-gda bench --shapes "$cmp_shapes" --impl ours --json "$out/bench-new-$round.json" \
            > "$out/bench-new-$round.txt" 2>&1
    done
    python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def rows(tag):
    r = {}
    for i in range(1, 10):
        try:
            data = json.load(open(f"{out}/bench-{tag}-{i}.json"))
        except (OSError, ValueError):
            continue
        for x in data["rows"]:
            if x["family"] == "ours" and x["ms"]:
                r.setdefault((x["shape"], x["impl"]), []).append(x["ms"])
    return r
old, new = rows("old"), rows("new")
print(f"{'shape':12s} {'impl':22s} {'old ms':>18s} {'new ms':>18s} {'new/old (best)':>16s}")
for key in old:
    if key in new:
        o, n = old[key], new[key]
        print(f"{key[0]:12s} {key[1]:22s} {' '.join(f'{x:.4f}' for x in o):>18s} "
              f"{' '.join(f'{x:.4f}' for x in n):>18s} {min(n) / min(o):16.3f}")
PY
    exit 0
fi
shapes="seed,gla64,long24,big128,big128-bf16,decode,few24,few64"
if [ "$phase" = "fla" ]; then
    PYTHONPATH=.baselines timeout 540 python3 -m scripts.baselines --impl fla --fla-timeout 60 \
        --shapes "$shapes" --json "$out/bench-fla.json" > "$out/bench-fla.txt" 2>&1
    grep -v "^bench:" "$out/bench-fla.txt" | head -40
    exit 0
fi
timeout 300 python3 -m scripts.baselines --impl ours,textbook --shapes "$shapes" \
    --json "$out/bench.json" > "$out/bench.txt" 2>&1
timeout 150 cupy-gda bench --impl ours --shapes tsweep --budget 1 --json "$out/tsweep.json" \
    --plot "$out/tsweep.png" > "$out/tsweep.txt" 2>&1
grep -v "^bench:" "$out/bench.txt" | head -60
grep -v "^bench:" "$out/tsweep.txt" | grep -E "^tsweep" | grep -v floor
