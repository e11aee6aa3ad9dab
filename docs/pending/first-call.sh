#!/usr/bin/env bash
# The next session's first device calls (perf-notes "v67-v70, still unmeasured"), in a tree of main
# with docs/pending/scan-dv-v67-v70.patch applied (`git am`) and main's files in .old (`git
# archive main | tar -x -C .old`); carry [".old", ".vendor"]; run from the tree's root:
#   bash docs/pending/first-call.sh compare   (timeout_s 290; it ends by 260 s)
#      v70 (this tree) against main (.old): GLA-1.3B bf16's forward + backward rows, the lean
#      backward's and the kept one's, twice, interleaved (scripts/device_run.sh compare); its
#      last line names the tree that won: new (v70) where its auto row is faster and within the
#      accuracy contract in every round, else old (main, whose suite is owed anyway);
#   bash docs/pending/first-call.sh suite new|old   (the next call, within the 30 s the machine
#      stays warm; timeout_s 600)
#      the whole GPU suite of that tree: its scripts/device_run.sh suite (its GPU tests; CI runs
#      the rest);
#   bash docs/pending/first-call.sh   (timeout_s 600): both in one call, as the split's two.
# Two calls, not one, since 2026-12-07 06:00 UTC: a machine taken back mid-call returns nothing,
# and a call's output is all that comes back (156 s of device time went so).
# (scripts/device_run.sh installs the tree and sets the environment in each phase.)
# A copy of what was lost with the sessions' untracked .devrun/ scripts; delete it with the
# patch once v70 lands or is dropped.
set -uo pipefail
what="${1:-both}"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tree="${2:-}"
if [ "$what" != suite ]; then
    IMPL=ours-auto-fwd+bwd,ours-keep-fwd+bwd timeout 220 bash scripts/device_run.sh v70 compare \
        main gla1.3b-bf16 2 | tee "$out/compare.txt"
    echo "compare done at $SECONDS s"
    tree=$(python3 - "$out" <<'PY'
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
print("new" if k in old and k in new and new[k][1] and new[k][0] < old[k][0] else "old")
PY
)
    echo "suite of: $tree"
    [ "$what" = compare ] && exit 0
fi
case "$tree" in new|old) ;; *) echo "suite of new or old, not '$tree'"; exit 2 ;; esac
label=v70
if [ "$tree" = old ]; then            # (main's tree installs itself and finds .vendor beside it)
    label=main
    ln -sfn "$PWD/.vendor" .old/.vendor
    cd .old
fi
SUITE_END=$((580 - SECONDS)) SUITE_WORKERS=14 SUITE_MARK="gpu and not whole_gpu and not clusters" \
    bash scripts/device_run.sh "$label" suite
