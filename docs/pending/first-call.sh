#!/usr/bin/env bash
# The next session's first device call (perf-notes "v67-v70, still unmeasured"), in a tree of main
# with docs/pending/scan-dv-v67-v70.patch applied (`git am`) and main's files in .old (`git
# archive main | tar -x -C .old`); carry [".old", ".vendor"]; run `bash
# docs/pending/first-call.sh` from the tree's root (the device tool's 600 s; it ends by 580 s):
#   1. v70 (this tree) against main (.old): GLA-1.3B bf16's forward + backward rows, the lean
#      backward's and the kept one's, twice, interleaved (scripts/device_run.sh compare);
#   2. the whole GPU suite of the tree that won (v70's where its auto row is faster and within
#      the accuracy contract in every round, else main's, which is owed anyway): that tree's
#      scripts/device_run.sh suite in the call's time left (its GPU tests; CI runs the rest).
# A copy of what was lost with the sessions' untracked .devrun/ scripts; delete it with the
# patch once v70 lands or is dropped.
set -uo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
IMPL=ours-auto-fwd+bwd,ours-keep-fwd+bwd timeout 240 bash scripts/device_run.sh v70 compare main \
    gla1.3b-bf16 2 | tee "$out/compare.txt"
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
label=v70
if [ "$tree" = old ]; then            # (main's tree installs itself and finds .vendor beside it)
    label=main
    ln -sfn "$PWD/.vendor" .old/.vendor
    cd .old
fi
SUITE_END=$((580 - SECONDS)) SUITE_WORKERS=14 SUITE_MARK="gpu and not whole_gpu and not clusters" \
    bash scripts/device_run.sh "$label" suite
