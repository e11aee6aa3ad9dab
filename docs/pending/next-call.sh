#!/usr/bin/env bash
# The next session's device calls (perf-notes "v71"), in a tree of main with
# docs/pending/scan-dv-prefetch-v71.patch applied (`git am`) and main's files in .old (`git
# archive main | tar -x -C .old`); carry [".old", ".vendor"]; run from the tree's root:
#   bash docs/pending/next-call.sh stages   (timeout_s 420; it ends by 400 s)
#      scan_dv's GPU tests in this tree, plainly and under memcheck (the prefetch's addresses);
#      then the backward's stages at GLA-1.3B bf16, twice, interleaved: v71 (this tree), v71
#      with --no-scan-dv-prefetch (scan_dv as main has it) and v71 with --scan-dv-wg (the lean
#      backward's S0 by scan_o's wgmma form, perf-notes "v67-v70 measured", Next 1);
#   bash docs/pending/next-call.sh compare   (the next call, within the 30 s the machine stays
#      warm; timeout_s 320): main's (.old) and v71's forward + backward rows at GLA-1.3B bf16,
#      interleaved, twice; its last line names the tree that won (as first-call.sh's did);
#   then, where v71 won, its whole GPU suite: `bash scripts/device_run.sh v71 suite` (carry
#      [".vendor"]; timeout_s 600), and land the patch; delete docs/pending either way;
#   where device time is left: `bash scripts/device_run.sh <c> ncu-scan-dv` (timeout_s 300),
#      where scan_dv's chunks' time goes (its stall reasons by SASS line).
set -uo pipefail
what="${1:-stages}"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "$what" = stages ]; then
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
    xd=()
    PYTHONPATH="$PWD/.vendor" python3 -c "import xdist" 2>/dev/null && xd=(-n 8)
    sel="gpu and ((kept_forward and scan_dv) or scan_dv_guard or (gemms_are_exact and planes-dv) \
or (backward_meets_the_contract and chunk and (K256 or varlen)))"     # (sanitize-wg's, less scan_o's)
    PYTHONPATH="$PWD/.vendor" timeout 150 python3 -m pytest -q -p no:cacheprovider \
        tests/test_backward.py -k "$sel" "${xd[@]}" > "$out/tests.txt" 2>&1
    echo "tests: $(tail -1 "$out/tests.txt") at $SECONDS s"
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q \
        -p no:cacheprovider tests/test_backward.py -k "$sel" > "$out/memcheck.txt" 2>&1
    echo "memcheck: rc $? $(grep -E 'ERROR SUMMARY|passed|failed' "$out/memcheck.txt" | tail -2 | tr '\n' ' ') at $SECONDS s"
    for round in 1 2; do
        for f in "" --no-scan-dv-prefetch --scan-dv-wg; do
            echo "== stages ${f:-v71} (round $round) at $SECONDS s" | tee -a "$out/stages.txt"
            timeout $((round == 1 ? 100 : 60)) python3 -m scripts.profile_chunk_bwd gla1.3b-bf16 \
                --stages $f 2>&1 | grep -v "^bench" | tee -a "$out/stages.txt" \
                | grep -E "^gla|BT64 planes scan_dv|backward from the kept"
            [ "$SECONDS" -gt 390 ] && break 2
        done
    done
    exit 0
fi
IMPL=ours-auto-fwd+bwd,ours-keep-fwd+bwd timeout 290 bash scripts/device_run.sh v71 compare \
    main gla1.3b-bf16 2 | tail -4
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def best(tag):     # impl -> (best ms, every row within the contract)
    r = {}
    for i in (1, 2):
        try:
            rows = json.load(open(f"{out}/bench-{tag}-{i}.json"))["rows"]
        except (OSError, ValueError):
            continue
        for x in rows:
            if x["family"] == "ours" and x["ms"]:
                ms, ok = r.get(x["impl"], (1e9, True))
                r[x["impl"]] = (min(ms, x["ms"]), ok and x.get("contract_ok") is not False)
    return r
old, new = best("old"), best("new")
k = "ours-auto-fwd+bwd"
print("won: " + ("new" if k in old and k in new and new[k][1] and new[k][0] < old[k][0] else "old"))
PY
