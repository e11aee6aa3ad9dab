#!/usr/bin/env bash
# Device calls that check and measure everything, in phases that each fit the device tool's
# 10-minute limit; everything lands in $OUT.
#   Every suite phase runs every test, the kernel builds marked full_compile too (a -m of its
#   own in place of setup.cfg's default, which deselects them).
#   suite:   install, the whole test suite in pytest-xdist's workers (SUITE_WORKERS, 6) within
#            one call, the clusters tests (a hang cut at 150 s) and the whole_gpu test alone
#            before them (SUITE_MARK: the rest's -m, e.g. "gpu and not whole_gpu and not
#            clusters" where the CPU tests and the compile tests ran on a CPU machine after the
#            same change), then cupy-gda verify, then (carry [".old"] too) the forward's stages of
#            .old's tree and this one where time is left (STAGES, gla1.3b-bf16); all of it within
#            SUITE_END s of the phase's start (580; less where the call ran something first).
#            The property tests (tests/test_properties.py: their GPU draws compile some 70
#            kernels) need hypothesis and the workers pytest-xdist, which the device may lack:
#            carry [".vendor"] from scripts/vendor_tests.sh. Without pytest-xdist the suite runs
#            in one process, cut at the call's cap: then suite-a and suite-b, in two calls, run
#            it all
#   suite-a, suite-b: install, the test suite in two halves that each fit one call (a: the
#            files in SUITE_A; b: every other file, so a new one is never left out), then (b)
#            cupy-gda verify
#   bench:   install, the benchmark of ours and the textbook kernel (table shapes), then the T
#            sweep with a plot
#   fla:     install, fla's rows of the same shapes (needs its package folder in .baselines/;
#            its autotuning at a new shape can take minutes, so it runs apart and cannot cost ours)
#   sanitize-bwd: install, the backward's own GPU tests once (the kernel cache), then under
#            memcheck, racecheck, synccheck and initcheck (each within the call's time left)
#   sanitize-wg: the same (memcheck, racecheck, synccheck) for the wgmma forms' tests: scan_o
#            as clusters against its wgmma form, the kept backward by scan_dv and scan_o's S0,
#            scan_dv in the lean backward (its default since v69)
#   sanitize-producer: the same (memcheck, racecheck, synccheck, initcheck) for scan_o's
#            producer warps' tests (v49; with SCAN_O_BULK's on a tree that has them), then
#            racecheck over scripts/racecheck_mbar_probe.py (a ring of mbarriers right by
#            construction: racecheck reports its slots' writes and reads as races, v50)
#   sanitize-dist: the same for gda_scan and gda_slice (tests/test_scan.py, test_slices.py) and
#            the distributed GPU tests over simulated ranks
#   sanitize: install, compute-sanitizer's memcheck, racecheck and synccheck over `cupy-gda
#            verify --max-t 64` with each forward family (every define set of its sweep, state
#            passes included, in fewer steps; the step kernel with each), memcheck over
#            tests/test_edges.py (forced segments, stepped chunks) and a few forced splits of
#            tests/test_segments.py, memcheck and racecheck over a few cases of the Hopper wgmma
#            variant (tests/test_chunk.py); each run within its cap and what is left of the
#            call's first 530 s (a run cut off says so in its rc, 124; one not begun, "skipped")
#   bwd:     install, the backward's GPU tests, then `python -m scripts.profile_chunk_bwd
#            [NAMES] --stages` (the chunked backward's launches timed, against the reverse loop)
#   terms:   install, the GPU tests of the backward's products in two bfloat16 terms and in
#            three, then the stages with two (the default) and three (profile_chunk_bwd [NAMES
#            (gla1.3b-bf16,big128-bf16)] --stages [--three-terms])
#   scan-o:  install, scripts/wgmma_probe.py (one wgmma a B layout scan_o's wgmma form reads,
#            against NumPy), the forward-from-the-planes GPU tests (scan_o by mma.sync and, chunks of
#            64 on a Hopper GPU, by wgmma), then `profile_chunk_bwd --scan-o-sweep` (both forms
#            against the scan and dv's entry over B, H and K) and the forward's stages of
#            [NAMES (gla1.3b-bf16,gla340m-bf16,big128-bf16)] with scan_o by wgmma (--scan-o-wg)
#   qk-ab:   install, the backward's GPU tests of the paths where scores writes the planes of
#            q A and k D (QK_BY_SCORES, v75: scan_dv, the kept forward, the planes, the guard),
#            then the stages of [NAMES (gla1.3b-bf16)] with it and without (--no-qk-by-scores)
#   scan-dv: install, the backward's GPU tests of gda_chunk_bwd_scan_dv (planes-dv, scan_dv) and
#            of scan_o's S0 by wgmma (planes-dv-wg, scan_dv-wg, s0-wg, keep-terms3-wg), then
#            `profile_chunk_bwd [NAMES (gla1.3b-bf16)] --stages` with --scan-dv-wg, --scan-dv and
#            neither
#   wg:      (after a suite that ran the wgmma forms' tests) install, scripts/wgmma_probe.py, then
#            the stages of every wgmma form in one call: the forward's of [NAMES
#            (gla1.3b-bf16,gla340m-bf16,big128-bf16)] with --scan-o-wg (v39: at K = 128 too,
#            where the dispatch keeps gda_chunk_fwd) and with --scan-o-mc (v42: as clusters
#            sharing the planes), then the backward and kept forward +
#            backward of GLA-1.3B and GLA-340M with --scan-dv-wg --planes (v40, v41; the planes
#            at K = 128 too) and with neither
#   fwd-ab:  install, the forward's stages of [NAMES (gla1.3b-bf16)] with gda_chunk_bwd built at
#            each of scores' launch bounds and diagonal unrolls (--scores-blocks 4,2 the default,
#            5,1, 6,1, 4,1), in turn, twice; then GLA-340M's and big128's bfloat16 forward from
#            the planes with scan_o at any number of blocks (profile_chunk_bwd --forward
#            --planes) against gda_chunk_fwd (perf-notes v44's cheap experiment)
#   prefetch-ab: install, the forward's stages of [NAMES (gla1.3b-bf16,gla340m-bf16)] with
#            scores' stage of q, k and g (v46) and without (--no-scores-prefetch), twice in turn,
#            then GLA-1.3B's backward stages each way
#   planes-rule: install, scripts/sweep_planes_forward.py (gda_chunk_fwd, the forward from the
#            planes as the rules build it and with scan_o at any number of blocks, over K, V and
#            batch shapes; which one auto runs), then `profile_chunk_bwd --scan-o-sweep`: the data
#            for _dispatch.planes_forward's K > 128 and chunk_bwd.SCAN_O_FROM (perf-notes v45)
#   producer-ab: install, scan_o's producer-warp test, then the forward's stages of [NAMES
#            (gla1.3b-bf16,gla340m-bf16)] with it and without it (--no-scan-o-producer), twice
#   ncu-scan-o: install, ncu of one scan_o launch (the lean forward's second) at GLA-1.3B bf16
#            for each form of [FORMS ("wg mma"): wg by wgmma (--scan-o-wg), mma by mma.sync]:
#            its stages uninstrumented, the sections' details page and the SASS source page
#            summed by scripts/ncu_sass.py (v52: the copies' L2 sectors and shared wavefronts)
#   ncu-scan-dv: install, the same for one scan_dv launch (the lean backward's) at GLA-1.3B
#            bf16 [with profile_chunk_bwd's FLAG, e.g. --scan-dv-wg, or one a pending patch
#            adds]: where its chunks' time goes (v72: 11.5 us a chunk against scan_o's 3.6)
#   ncu-bwd: install, ncu of one launch of each of the lean backward's [KERNELS ("scores rows
#            intra")] at GLA-1.3B bf16 [with FLAG, e.g. --no-qk-by-scores: pack writes the
#            planes of q A and k D, as before v75], the sections' details page and the SASS
#            source page summed by scripts/ncu_sass.py, each kernel's
#   wg-producer: install, the producer tests (mma.sync and wgmma forms), then the forward's
#            stages of [NAMES (gla1.3b-bf16,gla340m-bf16)] by mma.sync, by wgmma with its
#            producer warpgroup (v52) and by wgmma without, twice in turn, then scan_o's sweep
#   planes-long: install, scripts/sweep_planes_forward.py --long (long sequences of few
#            sequence-heads: the shapes behind _dispatch.PLANES_FORWARD_CHAIN, v46)
#   forms:   install, the bench's model rows [SHAPES (gla1.3b-bf16,gla340m-bf16,big128-bf16)]
#            (forward, forward + backward, kept) with every opt-in Hopper form on (USE_SCAN_O_WG,
#            USE_SCAN_O_MC, USE_SCAN_DV), then with the defaults
#   models-fla: (carry [".baselines"]) install, ours and fla's forward at issue 13's model rows
#            [SHAPES (gla1.3b-bf16,gla340m-bf16,big128-bf16,gla1.3b,big128)] in one run
#   fwdbwd-fla: (carry [".baselines"]) install, ours and fla's forward + backward rows at one
#            shape in one run (SHAPE, default gla1.3b-bf16), fla's autotune given 480 s
#   compare: `cupy-gda bench --shapes SHAPES --impl ours` of an older tree (its files in .old/,
#            e.g. `git archive <commit> | tar -x -C .old`) and of this one, in one run, ROUNDS
#            times each, interleaved (old, new, old, new, ...), and the ratios of the best times
#            (IMPL: --impl's value in place of ours, e.g. ours-auto-fwd+bwd,ours-keep-fwd+bwd
#            for the forward + backward rows)
#   sass:    install, the forward's GPU tests (forward_from), the forward's stages of [NAMES
#            (gla1.3b-bf16)] (profile_chunk_bwd --forward --stages) of this tree and of .old's
#            (carry [".old"], as compare's) interleaved, every build's SASS (cuobjdump), and ncu's
#            source view (SASS, executed instructions and stall samples a line) of one launch
#            each of scan_o and scores
#   l2-rate: install, scripts/l2_rate.py (the L2's rate into the SMs by cp.async, cp.async.bulk and
#            clusters of 2 multicasting: whether L2's rate binds scan_o, perf-notes v63 and v64),
#            then the forward's stages of [NAMES (gla1.3b-bf16)] beside it
#   scores-parts: install, scripts/scores_parts.py [NAMES (gla1.3b-bf16,big128-bf16)]: the
#            forward's stages with parts of scores left out (its diagonal, tiles, split, planes),
#            each in a process of its own (wrong results on purpose; scores' times are the point)
#   dist2:   (nvidia-h200-x2) install, the distributed and scan GPU tests (the two-process
#            ones need the second GPU), then scripts/dist_ranks.py over 2 ranks at B1 T512K H16
#            K=V=128 against one GPU, CuPy's NCCL and torch.distributed, fp32 and bf16
# Usage (device tool; carry [".vendor"] for suite and suite-a, [".baselines"] for fla, [".old"]
# for compare):
#   bash scripts/device_run.sh <commit> suite|suite-a|suite-b|sanitize|sanitize-bwd|sanitize-wg|sanitize-producer|sanitize-dist|bench|fla|dist2
#   bash scripts/device_run.sh <commit> bwd [NAMES (all)]
#   bash scripts/device_run.sh <commit> terms [NAMES (gla1.3b-bf16,big128-bf16)]
#   bash scripts/device_run.sh <commit> qk-ab [NAMES (gla1.3b-bf16)]
#   bash scripts/device_run.sh <commit> ncu-bwd ["KERNELS" ("scores rows intra")] [FLAG]
#   bash scripts/device_run.sh <commit> fwdbwd-fla [SHAPE (gla1.3b-bf16)]
#   bash scripts/device_run.sh <commit> models-fla [SHAPES]
#   bash scripts/device_run.sh <commit> scan-o [NAMES (gla1.3b-bf16,gla340m-bf16,big128-bf16)]
#   bash scripts/device_run.sh <commit> scan-dv [NAMES (gla1.3b-bf16)]
#   bash scripts/device_run.sh <commit> wg [NAMES (gla1.3b-bf16,gla340m-bf16,big128-bf16)]
#   bash scripts/device_run.sh <commit> forms [SHAPES (gla1.3b-bf16,gla340m-bf16,big128-bf16)]
#   bash scripts/device_run.sh <commit> sass [NAMES (gla1.3b-bf16)]
#   bash scripts/device_run.sh <commit> fwd-ab [NAMES (gla1.3b-bf16)]
#   bash scripts/device_run.sh <commit> prefetch-ab [NAMES (gla1.3b-bf16,gla340m-bf16)]
#   bash scripts/device_run.sh <commit> planes-rule
#   bash scripts/device_run.sh <commit> producer-ab [NAMES (gla1.3b-bf16,gla340m-bf16)]
#   bash scripts/device_run.sh <commit> ncu-scan-o [FORMS ("wg mma")]
#   bash scripts/device_run.sh <commit> ncu-scan-dv [FLAG]
#   bash scripts/device_run.sh <commit> wg-producer [NAMES (gla1.3b-bf16,gla340m-bf16)]
#   bash scripts/device_run.sh <commit> planes-long
#   bash scripts/device_run.sh <commit> l2-rate [NAMES (gla1.3b-bf16)]
#   bash scripts/device_run.sh <commit> scores-parts [NAMES (gla1.3b-bf16,big128-bf16)]
#   bash scripts/device_run.sh <commit> compare <old commit> [SHAPES (all)] [ROUNDS (1)]
set -uo pipefail
commit="${1:-unknown}"
phase="${2:-suite}"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
# (JAX allocating as it goes, not 75 % of the GPU at first use: CuPy shares it)
export PYTHONUNBUFFERED=1 CUPY_GDA_COMMIT="$commit" XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -3
# hypothesis (and pytest-xdist) from .vendor where hypothesis imports from there (built for this
# Python), else the device's own, if any; the line says which, as without one the property
# tests skip
if [ -d .vendor ] && PYTHONPATH="$PWD/.vendor" python3 -c "import hypothesis" 2>/dev/null; then
    export PYTHONPATH="$PWD/.vendor${PYTHONPATH:+:$PYTHONPATH}"
fi
echo "hypothesis: $(python3 -c 'import hypothesis as h; print(h.__version__, "at", h.__file__)' 2>&1 | tail -1)"
# the forward's stages (profile_chunk_bwd NAMES --forward --stages) of this tree (new) or
# .old's (old), within SECS s, appended to FILE: run in the tree's own folder (python -m puts the
# working folder first on the path) with its own kernel cache
forward_stages() {
    local tree="$1" secs="$2" file="$3" names="$4" path=$PWD
    [ "$tree" = old ] && path=$PWD/.old
    echo "== $tree"
    (cd "$path" && CUPY_CACHE_DIR=/tmp/cache-$tree timeout "$secs" \
        python3 -m scripts.profile_chunk_bwd "$names" --forward --stages) \
        2>&1 | tee -a "$file" | grep -v "^bench"
}
# the forward's stages of NAMES with each of FLAGS in turn (a string of flags each; "": none,
# its lines labelled LABEL), twice, into FILE
forward_ab() {
    local file="$1" names="$2" label="$3"
    shift 3
    for round in 1 2; do
        for f in "$@"; do
            echo "== forward ${f:-$label} (round $round)" | tee -a "$file"
            timeout 80 python3 -m scripts.profile_chunk_bwd "$names" --forward --stages $f 2>&1 \
                | tee -a "$file" | grep -v "^bench"
        done
    done
}
# scan_o's producer tests (tests/test_backward.py -k producer: bit for bit scan_o without its
# producer warps), a hang cut at CAP s, and their line; where they failed the call ends (a wrong
# or hung producer is not timed: its stages would only hang or mislead)
producer_tests() {
    timeout -k 10 "$1" python3 -m pytest -q -p no:cacheprovider tests/test_backward.py \
        -k producer > "$out/pytest-producer.txt" 2>&1
    local rc=$?
    echo "pytest: rc $rc $(tail -1 "$out/pytest-producer.txt")"
    [ "$rc" = 0 ] || exit 1
}
if [ "$phase" = "suite" ]; then
    end=${SUITE_END:-580}    # s since the phase began: the call's 600 s less slack
    pytest=(python3 -m pytest -q -p no:cacheprovider tests)
    # the tests that launch thread-block clusters (scan_o's SCAN_O_MC) first, alone, within 150
    # s: a cluster's barrier never completing would hang them, and the suite after them leaves
    # them out
    timeout -k 10 150 "${pytest[@]}" -m clusters > "$out/pytest-clusters.txt" 2>&1
    echo "clusters: rc $? $(tail -1 "$out/pytest-clusters.txt")"
    if python3 -c "import xdist" 2>/dev/null; then
        workers="${SUITE_WORKERS:-6}"
        echo "pytest-xdist $(python3 -c 'import xdist; print(xdist.__version__)'): $workers workers"
        # first, alone: no other process's memory pool beside its tensors
        timeout -k 10 90 "${pytest[@]}" -m whole_gpu > "$out/pytest-alone.txt" 2>&1
        echo "whole_gpu: $(tail -1 "$out/pytest-alone.txt")"
        # --dist worksteal: the tests dealt out evenly in runs, and a worker down to its last
        # test takes half of the longest queue left, so the long ones of one file (the property
        # tests' GPU draws, test_compile.py's NVRTC compiles) spread over the workers, where
        # loadfile would leave the longest file to one; loadgroup's marks are lost on pytest
        # 9.2's node ids (pytest-xdist issue 1386)
        timeout -k 10 $((end - 60 - SECONDS)) "${pytest[@]}" --durations=15 -n "$workers" \
            --dist worksteal -m "${SUITE_MARK:-not whole_gpu and not clusters}" \
            > "$out/pytest.txt" 2>&1
    else
        echo "pytest-xdist: none (carry [\".vendor\"] of scripts/vendor_tests.sh); the suite in" \
            "one process, cut at the call's cap (suite-a and suite-b run it all in two calls)"
        timeout -k 10 $((end - 60 - SECONDS)) "${pytest[@]}" -m "not clusters" --durations=15 \
            > "$out/pytest.txt" 2>&1
    fi
    tail -3 "$out/pytest.txt"
    left=$((end - SECONDS))
    timeout $((left < 90 ? left : 90)) cupy-gda verify > "$out/verify.txt" 2>&1
    tail -1 "$out/verify.txt"
    # then, where .old is carried (as sass's) and time is left, the forward's stages of both
    # trees (old, new) at STAGES (gla1.3b-bf16)
    if [ -d .old/cupy_gda ]; then
        for t in old new; do
            left=$((end - SECONDS))
            [ "$left" -lt 30 ] && break
            forward_stages "$t" $((left / 2)) "$out/ab-stages.txt" "${STAGES:-gla1.3b-bf16}"
        done
    fi
    exit 0
fi
SUITE_A="dispatch interop packaging reference scripts segments validation chunk edges properties"
if [ "$phase" = "suite-a" ]; then
    timeout 540 python3 -m pytest -q $(for f in $SUITE_A; do echo "tests/test_$f.py"; done) \
        > "$out/pytest-a.txt" 2>&1; tail -3 "$out/pytest-a.txt"
    exit 0
fi
if [ "$phase" = "suite-b" ]; then
    timeout -k 10 90 python3 -m pytest -q -m clusters tests > "$out/pytest-clusters.txt" 2>&1
    echo "clusters: rc $? $(tail -1 "$out/pytest-clusters.txt")"      # (alone: as suite's)
    timeout 380 python3 -m pytest -q -m "not clusters" tests \
        $(for f in $SUITE_A; do echo "--ignore=tests/test_$f.py"; done) \
        > "$out/pytest-b.txt" 2>&1; tail -3 "$out/pytest-b.txt"
    timeout 90 cupy-gda verify > "$out/verify.txt" 2>&1; tail -1 "$out/verify.txt"
    exit 0
fi
if [ "$phase" = "sanitize" ] || [ "${phase#sanitize-}" != "$phase" ]; then   # (every sanitize-*:
    # sanitize-wg's was left out of the list this replaced, and ran the bench instead)
    # CuPy's memory pool off, so memcheck sees each array's own bounds rather than the pool's
    nopool="import cupy, sys; cupy.cuda.set_allocator(None)"
    verify=(python3 -c "$nopool; from cupy_gda.cli import main; main()" verify --max-t 64)
    pytest=(python3 -c "$nopool; import pytest; sys.exit(pytest.main())" -q -p no:cacheprovider)
    # only our kernels (gda_*) instrumented, not CuPy's copies and fills, where the option exists
    only=()
    compute-sanitizer --kernel-name kns=gda_ true > /dev/null 2>&1 && only=(--kernel-name kns=gda_)
    echo "compute-sanitizer: $(compute-sanitizer --version 2>&1 | grep -i version | head -1); ${only[*]:-every kernel}"
    end=${SAN_END:-530}      # s since the call began: the call's 600 s less transfers and slack
    #                          (SAN_END: less, where the call runs something after)
    said='ERROR SUMMARY|RACECHECK SUMMARY|^verify: |[0-9]+ (passed|failed|skipped|error)|Error: '
    # san TOOL TARGET CAP COMMAND...: COMMAND under TOOL for at most CAP s; one line, and its
    # log appended to $out/sanitize-TOOL.txt (one file a tool: the call brings back 8 files)
    san() {
        local tool="$1" target="$2" cap="$3" left=$((end - SECONDS)) t0=$SECONDS rc f
        shift 3
        if [ "$left" -lt 20 ]; then echo "$tool $target: skipped, no time left"; return; fi
        f="$(mktemp)"
        timeout -k 10 $((left < cap ? left : cap)) compute-sanitizer --tool "$tool" \
            --error-exitcode 3 "${only[@]}" "$@" > "$f" 2>&1
        rc=$?
        echo "$tool $target: rc $rc in $((SECONDS - t0)) s | $(grep -E "$said" "$f" | tail -3 | tr '\n' ' ')"
        { echo "== $tool $target: rc $rc"; cat "$f"; } >> "$out/sanitize-$tool.txt"
        rm -f "$f"
    }
    # san_tests TARGET SEL TOOL...: tests/test_backward.py's tests that -k SEL picks, once plainly
    # first (the kernel cache: compiles under the sanitizers are slow; in xd's workers where
    # set), then under each TOOL, each the time left's share
    xd=()
    san_tests() {
        local target="$1" sel="$2" n=$(($# - 2)) tool
        shift 2
        timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_backward.py -k "$sel" \
            "${xd[@]}" > "$out/sanitize-plain.txt" 2>&1
        echo "plain: $(tail -1 "$out/sanitize-plain.txt") in $SECONDS s"
        for tool in "$@"; do
            san "$tool" "$target" $(((end - SECONDS) / n)) "${pytest[@]}" tests/test_backward.py -k "$sel"
            n=$((n - 1))
        done
    }
    if [ "$phase" = "sanitize-bwd" ]; then
        # the backward families' own tests: the chunked one's every scan form (the planes' ring
        # too) and GEMM stage, its contract cases, a few of the reverse loop's, the forward from
        # its stages (ForwardPlan) and that forward's fall-back
        python3 -c "import xdist" 2>/dev/null && xd=(-n 8)
        san_tests backward "gpu and (chunked_backward or gemms or (contract and chunk and \
(K24-V24 or K256 or K1-V7 or K5-V1 or varlen)) or (contract and recurrent and (K24-V24 or K256 \
or varlen)) or forward_from_the_backward_stages or forward_from_planes_guard)" \
            memcheck racecheck synccheck initcheck
        exit 0
    fi
    if [ "$phase" = "sanitize-wg" ]; then
        # the wgmma forms' own tests: scan_o as clusters bit for bit its wgmma form (v39 and
        # v42, every cluster size), the kept backward by scan_dv and scan_o's S0 (v40, v41), and
        # scan_dv as the backward runs it by default since v69 (its producer warpgroup, v68; W
        # split by scores, v70): its GEMM test's planes-dv, its guard, the chunked contract cases
        san_tests wgmma-forms "gpu and (bit_for_bit_its_wgmma or (kept_forward and scan_dv) or \
scan_dv_guard or (gemms_are_exact and planes-dv) or (backward_meets_the_contract and chunk and \
(K256 or varlen)))" memcheck racecheck synccheck
        exit 0
    fi
    if [ "$phase" = "sanitize-producer" ]; then
        # scan_o's producer warps (v49; and SCAN_O_BULK's bulk copies and clusters where the
        # tree has them, branch next/v51): their bit-for-bit tests, every forward-from-the-planes
        # case
        san_tests producer "gpu and (scan_o_producer or scan_o_bulk)" \
            memcheck racecheck synccheck initcheck
        # racecheck on a ring of mbarriers right by construction: what it reports there is the
        # tool's (v50: it does not model their ordering, and reports scan_o's producer form so)
        for m in "" --stores; do
            san racecheck "probe${m:+-stores}" 60 python3 -m scripts.racecheck_mbar_probe $m
        done
        exit 0
    fi
    if [ "$phase" = "sanitize-dist" ]; then
        # the distributed path's families, gda_scan and gda_slice: their own tests (every case),
        # then the distributed GPU tests over simulated ranks (one GPU, packed and dense); one
        # plain run first fills the kernel cache
        files=(tests/test_scan.py tests/test_slices.py)
        dist=(tests/test_distributed.py -k gpu_ranks_are_the_whole_sequence)
        timeout 100 python3 -m pytest -q -p no:cacheprovider "${files[@]}" > "$out/sanitize-plain.txt" 2>&1
        timeout 100 python3 -m pytest -q -p no:cacheprovider "${dist[@]}" >> "$out/sanitize-plain.txt" 2>&1
        echo "plain: $(grep -E "passed|failed" "$out/sanitize-plain.txt" | tr '\n' ' ') in $SECONDS s"
        n=4
        for tool in memcheck racecheck synccheck initcheck; do
            cap=$(((end - SECONDS) / n))
            san "$tool" scan+slice $((cap * 2 / 3)) "${pytest[@]}" "${files[@]}"
            san "$tool" distributed $((cap / 3)) "${pytest[@]}" "${dist[@]}"
            n=$((n - 1))
        done
        exit 0
    fi
    for tool in memcheck racecheck synccheck; do
        for method in chunk recurrent; do
            san "$tool" "verify-$method" 150 "${verify[@]}" --method "$method"
        done
    done
    san memcheck test_edges 90 "${pytest[@]}" tests/test_edges.py
    # forced splits: the chunk kernel's value tiles of 8 in 3 segments and varlen (an empty
    # sequence) in 3; the recurrent one's a step a segment, K = 256, and varlen with sequences
    # shorter than the segments
    san memcheck test_segments 90 "${pytest[@]}" tests/test_segments.py -k \
        "BV8-P3 or L1_17_64_300_65_0_129_700 or P128 or L1_17_64_300_0_3 or K256-V256"
    # the wgmma variant: value tiles of 32, K padded inside a tile, bfloat16 in segments, two
    # key tiles under the 'big' gates, varlen with an empty sequence, float16 with K = 255
    for tool in memcheck racecheck; do
        san "$tool" wgmma 90 "${pytest[@]}" tests/test_chunk.py -k "wgmma and (K64-V1024 or \
K120-V48 or K50-V32 or K256-V64-float32-gate_big or L200_0_3 or K255-V24)"
    done
    exit 0
fi
if [ "$phase" = "compare" ]; then
    old="${3:-old}" cmp_shapes="${4:-all}" rounds="${5:-1}"
    for round in $(seq "$rounds"); do
        (cd .old && PYTHONPATH=. python3 -c "import cupy_gda; print('old tree:', cupy_gda.__file__)" && \
         CUPY_GDA_COMMIT="$old" PYTHONPATH=. timeout 260 python3 -m cupy_gda bench \
            --shapes "$cmp_shapes" --impl "${IMPL:-ours}" --json "$out/bench-old-$round.json" \
            > "$out/bench-old-$round.txt" 2>&1)
        timeout 260 cupy-gda bench --shapes "$cmp_shapes" --impl "${IMPL:-ours}" --json "$out/bench-new-$round.json" \
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
if [ "$phase" = "bwd" ]; then
    # the backward's GPU tests (in pytest-xdist's workers where it imports), then its stages
    xd=()
    python3 -c "import xdist" 2>/dev/null && xd=(-n 8)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_backward.py -k gpu "${xd[@]}" \
        > "$out/pytest-bwd.txt" 2>&1
    tail -3 "$out/pytest-bwd.txt"
    timeout $((560 - SECONDS)) python3 -m scripts.profile_chunk_bwd "${3:-}" --stages \
        > "$out/bwd-stages.txt" 2>&1
    cat "$out/bwd-stages.txt"
    exit 0
fi
# test_backward.py's tests matching -k $1 (into pytest-$2.txt), then profile_chunk_bwd's stages
# of shapes $3 with each flag of the rest (one call each, into bwd-stages<flag>.txt)
tests_then_stages() {
    local k="$1" name="$2" names="$3"
    shift 3
    local xd=()
    python3 -c "import xdist" 2>/dev/null && xd=(-n 8)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_backward.py -k "$k" \
        "${xd[@]}" > "$out/pytest-$name.txt" 2>&1
    tail -3 "$out/pytest-$name.txt"
    for flag in "$@"; do
        timeout $(((560 - SECONDS) / 2)) python3 -m scripts.profile_chunk_bwd "$names" --stages \
            $flag > "$out/bwd-stages$flag.txt" 2>&1
        cat "$out/bwd-stages$flag.txt"
    done
}
if [ "$phase" = "qk-ab" ]; then
    tests_then_stages "scan_dv or kept or planes or by_scores" qk "${3:-gla1.3b-bf16}" "" \
        --no-qk-by-scores
    exit 0
fi
if [ "$phase" = "terms" ]; then
    # the backward's products in two terms (chunk_bwd.DV_TWO_TERMS, ROWS_TWO_TERMS; perf-notes
    # v36, v37) or three: their GPU tests, then the stages with and without them
    tests_then_stages terms_meet terms "${3:-gla1.3b-bf16,big128-bf16}" "" --three-terms
    exit 0
fi
if [ "$phase" = "fwd-ab" ]; then
    # the forward's A/Bs of perf-notes v45: scores' blocks an SM and its diagonal's unroll
    # (SCORES_BLOCKS, SCORES_DIAG_UNROLL), the forward's stages of [NAMES (gla1.3b-bf16)] built
    # with each, in turn, twice; then the forward from the planes at K = 128 with scan_o at any
    # number of blocks (--planes) against gda_chunk_fwd
    for round in 1 2; do
        for sb in 4,2 5,1 6,1 4,1; do
            echo "== scores $sb (round $round)" | tee -a "$out/scores-blocks.txt"
            timeout 100 python3 -m scripts.profile_chunk_bwd "${3:-gla1.3b-bf16}" --forward \
                --stages "--scores-blocks=$sb" 2>&1 | tee -a "$out/scores-blocks.txt" | grep -v "^bench"
        done
    done
    timeout $((570 - SECONDS)) python3 -m scripts.profile_chunk_bwd gla340m-bf16,big128-bf16 \
        --forward --planes --stages 2>&1 | tee "$out/k128-planes.txt" | grep -v "^bench"
    exit 0
fi
if [ "$phase" = "prefetch-ab" ]; then
    # scores' stage of q, k and g (perf-notes v46; on by default since, so the suite runs it):
    # the forward's stages of [NAMES (gla1.3b-bf16,gla340m-bf16)] with and without it, twice in
    # turn (each line's largest |o - o of gda_chunk_fwd| the check that it reads the same
    # values), then GLA-1.3B's backward stages each way (its gradients' differences likewise)
    forward_ab "$out/prefetch-ab.txt" "${3:-gla1.3b-bf16,gla340m-bf16}" stage "" --no-scores-prefetch
    for pf in "" --no-scores-prefetch; do
        echo "== backward ${pf:-stage}" | tee -a "$out/prefetch-ab.txt"
        timeout $(((570 - SECONDS) / 2)) python3 -m scripts.profile_chunk_bwd gla1.3b-bf16 \
            --stages $pf 2>&1 | tee -a "$out/prefetch-ab.txt" | grep -v "^bench"
    done
    exit 0
fi
if [ "$phase" = "producer-ab" ]; then
    # scan_o fed by its producer warps (SCAN_O_PRODUCER, on by default: perf-notes v49): its
    # GPU test first (bit for bit scan_o without them, every forward-from-the-planes case; a
    # hang is cut at 150 s), then the forward's stages of [NAMES (gla1.3b-bf16,gla340m-bf16)]
    # with them and without them, twice in turn, where the test passed
    producer_tests 150
    forward_ab "$out/producer-ab.txt" "${3:-gla1.3b-bf16,gla340m-bf16}" with "" --no-scan-o-producer
    exit 0
fi
# the sections every ncu call below collects
ncu_sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats
              --section SchedulerStats --section Occupancy --section LaunchStats
              --section SourceCounters --section MemoryWorkloadAnalysis --section InstructionStats)
# ncu_launch KERNEL LABEL ARGS...: ncu of one KERNEL launch (the second) in `profile_chunk_bwd
# ARGS`, whose stages run uninstrumented first; the sections' details page and the SASS source
# page summed by scripts/ncu_sass.py, each LABEL's (ncu_report)
ncu_launch() {
    local kernel="$1" label="$2"
    shift 2
    timeout 80 python3 -m scripts.profile_chunk_bwd "$@" 2>&1 | grep -v "^bench" > "$out/stages-$label.txt"
    head -3 "$out/stages-$label.txt"
    timeout 150 ncu -k "regex:$kernel\$" -s 1 -c 1 "${ncu_sections[@]}" -o "$out/$label" \
        python3 -m scripts.profile_chunk_bwd "$@" > /dev/null 2>&1
    echo "ncu $label: rc $?"
    ncu_report "$label"
}
# ncu's report $out/LABEL.ncu-rep as its details page and its SASS source page (kept gzipped and
# summed by scripts/ncu_sass.py), the report itself removed, and the lines that say most
ncu_report() {
    local label="$1"
    ncu -i "$out/$label.ncu-rep" --page details > "$out/details-$label.txt" 2>&1
    ncu -i "$out/$label.ncu-rep" --page source --print-source sass --csv 2>/dev/null \
        | gzip > "$out/sass-$label.csv.gz"
    rm -f "$out/$label.ncu-rep"
    grep -E "Duration|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|Registers Per" \
        "$out/details-$label.txt"
    python3 -m scripts.ncu_sass "$out/sass-$label.csv.gz" 12 | head -8
}
if [ "$phase" = "ncu-scan-o" ]; then
    for form in ${3:-wg mma}; do
        flag=()
        [ "$form" = wg ] && flag=(--scan-o-wg)
        [ "$form" = mma ] && flag=(--no-scan-o-wg)     # (the default takes wgmma: v53, v56)
        ncu_launch gda_chunk_bwd_scan_o "$form" gla1.3b-bf16 --forward --stages "${flag[@]}"
    done
    exit 0
fi
if [ "$phase" = "ncu-scan-dv" ]; then
    # the lean backward's second scan_dv launch (profile_chunk_bwd's first backwards are the
    # chunked method's), with [FLAG: profile_chunk_bwd's, e.g. --scan-dv-wg]
    ncu_launch gda_chunk_bwd_scan_dv "scan_dv${3:-}" gla1.3b-bf16 --stages ${3:-}
    exit 0
fi
if [ "$phase" = "ncu-bwd" ]; then
    # the lean backward's launches at GLA-1.3B bf16 that no profile has looked into (v75: scores
    # with the planes of q A and k D 0.51 ms against 0.27 without; rows 1.19, some 0.86 at the
    # DRAM's rate; intra 0.87): ncu of the second launch of each of [KERNELS ("scores rows
    # intra")] in three backwards that run nothing else first, [FLAG --no-qk-by-scores: pack
    # writes the planes] (perf-notes v75, "Next")
    cat > /tmp/bwd3.py <<'PY'
import sys
import cupy
from cupy_gda import _verify, chunk_bwd
from cupy_gda._checks import Problem
from scripts.profile_chunk_bwd import inputs
chunk_bwd.USE_QK_BY_SCORES = "--no-qk-by-scores" not in sys.argv
args, do = inputs(_verify.Case(8, 4096, 4, 256, 512, dtype="bfloat16", init=False))
plan = chunk_bwd.plan(Problem(8, 4096, 4, 256, 512, 8, "bfloat16", "float32", False))
for _ in range(3):
    plan.run(args["q"], args["k"], args["v"], args["gate"], do, 1.0, None, None)
cupy.cuda.runtime.deviceSynchronize()
PY
    for kernel in ${3:-scores rows intra}; do
        label="$kernel${4:-}"
        timeout 150 ncu -k "regex:gda_chunk_bwd_$kernel\$" -s 1 -c 1 "${ncu_sections[@]}" \
            -o "$out/$label" env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 /tmp/bwd3.py \
            ${4:-} > "$out/ncu-$label.log" 2>&1
        echo "ncu $label: rc $?"
        ncu_report "$label"
    done
    exit 0
fi
if [ "$phase" = "wg-producer" ]; then
    # scan_o's wgmma form fed by a warpgroup of producer warps (v52, branch next/v52-wg-producer):
    # the producer tests (bit for bit scan_o without them, by mma.sync and by wgmma; a hang cut
    # at 200 s), then, where they passed, the forward's stages of [NAMES (gla1.3b-bf16,
    # gla340m-bf16)] by mma.sync (--no-scan-o-wg: the default takes wgmma at 128 and 256 keys), by
    # wgmma with the producer and by wgmma without, twice in turn (forward_ab), and scan_o's
    # sweep (every form beside the scan and dv's entry)
    producer_tests 200
    forward_ab "$out/wg-producer.txt" "${3:-gla1.3b-bf16,gla340m-bf16}" default \
        --no-scan-o-wg --scan-o-wg "--scan-o-wg --no-scan-o-producer"
    timeout $((560 - SECONDS)) python3 -m scripts.profile_chunk_bwd --scan-o-sweep 2>&1 \
        | grep -v "^bench" | tee "$out/scan-o-sweep.txt"
    exit 0
fi
if [ "$phase" = "planes-long" ]; then
    timeout 560 python3 -m scripts.sweep_planes_forward --long 2>&1 | tee "$out/sweep-planes-long.txt"
    exit 0
fi
if [ "$phase" = "planes-rule" ]; then
    # the rules that pick the forward from the planes (_dispatch.planes_forward: K > 128 today)
    # and scan_o in it (chunk_bwd.SCAN_O_FROM), after v43-v45 made that forward faster (perf-notes
    # v45: 0.89x gda_chunk_fwd at GLA-340M, 1.22x at big128): the sweep over K, V and batch
    # shapes with the plan as the rules build it and with scan_o at any number of blocks, then
    # scan_o's sweep over its blocks an SM
    timeout 400 python3 -m scripts.sweep_planes_forward 2>&1 | tee "$out/sweep-planes-forward.txt"
    timeout $((570 - SECONDS)) python3 -m scripts.profile_chunk_bwd --scan-o-sweep 2>&1 \
        | tee "$out/scan-o-sweep.txt"
    exit 0
fi
shapes="seed,gla64,long24,big128,big128-bf16,decode,few24,few64"
if [ "$phase" = "dist2" ]; then
    export NCCL_NVLS_ENABLE=0             # (NVLink multicast off: KINDS.md)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_distributed.py \
        tests/test_scan.py -m gpu -rs > "$out/pytest-dist.txt" 2>&1
    tail -3 "$out/pytest-dist.txt"
    for front in cupy torch; do
        for dt in float32 bfloat16; do
            timeout 75 python3 -m scripts.dist_ranks --ranks 2 --front "$front" --dtype "$dt" \
                --T 524288 > "$out/dist-$front-$dt.txt" 2>&1
            echo "== $front $dt (rc $?)"
            grep -E "^rank|fwd|ratio" "$out/dist-$front-$dt.txt"
        done
    done
    exit 0
fi
if [ "$phase" = "scan-o" ]; then
    # scan_o's two forms (perf-notes v38, v39): their tests, the sweep that places SCAN_O_FROM,
    # and the forward's stages with the wgmma form
    timeout 120 python3 -m scripts.wgmma_probe > "$out/wgmma-probe.txt" 2>&1
    cat "$out/wgmma-probe.txt"
    xd=()
    python3 -c "import xdist" 2>/dev/null && xd=(-n 8)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_backward.py \
        -k forward_from "${xd[@]}" > "$out/pytest-scan-o.txt" 2>&1
    tail -3 "$out/pytest-scan-o.txt"
    timeout $(((560 - SECONDS) / 2)) python3 -m scripts.profile_chunk_bwd --scan-o-sweep \
        > "$out/scan-o-sweep.txt" 2>&1
    cat "$out/scan-o-sweep.txt"
    timeout $((560 - SECONDS)) python3 -m scripts.profile_chunk_bwd \
        "${3:-gla1.3b-bf16,gla340m-bf16,big128-bf16}" --forward --stages --scan-o-wg \
        > "$out/scan-o-forward.txt" 2>&1
    cat "$out/scan-o-forward.txt"
    exit 0
fi
if [ "$phase" = "scan-dv" ]; then
    # the backward's E scan and dv as one kernel (perf-notes v40), and with it the S0 by scan_o's
    # wgmma form (v41): their tests, then the stages with both, with scan_dv alone and without
    tests_then_stages "planes-dv or scan_dv or terms3-wg" scan-dv "${3:-gla1.3b-bf16}" \
        --scan-dv-wg --scan-dv ""
    exit 0
fi
if [ "$phase" = "wg" ]; then
    # every wgmma form's stages beside the defaults in one call (perf-notes v39-v41): the probe
    # first (which B layout reads as NumPy does), the forward's, then the backward's
    timeout 120 python3 -m scripts.wgmma_probe > "$out/wgmma-probe.txt" 2>&1
    cat "$out/wgmma-probe.txt"
    for run in wg mc; do            # (mc: scan_o's wgmma form as clusters, v42)
        share=4
        [ "$run" = mc ] && share=3
        timeout $(((560 - SECONDS) / share)) python3 -m scripts.profile_chunk_bwd \
            "${3:-gla1.3b-bf16,gla340m-bf16,big128-bf16}" --forward --stages --scan-o-$run \
            > "$out/wg-forward-$run.txt" 2>&1
        cat "$out/wg-forward-$run.txt"
    done
    for run in wg defaults; do
        flags=()
        [ "$run" = wg ] && flags=(--scan-dv-wg --planes)
        timeout $(((560 - SECONDS) / 2)) python3 -m scripts.profile_chunk_bwd \
            gla1.3b-bf16,gla340m-bf16 --stages "${flags[@]}" > "$out/wg-bwd-$run.txt" 2>&1
        cat "$out/wg-bwd-$run.txt"
    done
    exit 0
fi
if [ "$phase" = "sass" ]; then
    # where the lean forward's instructions go, this tree against an older one (carry [".old"],
    # `git archive <commit> | tar -x -C .old`, as compare's) where there is one: the forward's
    # tests, the stages' times of both trees interleaved (old, new, old, new), the SASS of every
    # build each compiled (its own kernel cache), and ncu's per-instruction counts of scan_o's and
    # scores' launches (this tree)
    names="${3:-gla1.3b-bf16}"
    xd=()
    python3 -c "import xdist" 2>/dev/null && xd=(-n 8)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_backward.py -k forward_from \
        "${xd[@]}" > "$out/pytest-forward.txt" 2>&1
    tail -2 "$out/pytest-forward.txt"
    trees=(new)
    [ -d .old/cupy_gda ] && trees=(old new old new)
    for t in "${trees[@]}"; do
        forward_stages "$t" 100 "$out/sass-stages.txt" "$names"
    done
    for t in old new; do
        for f in $(find /tmp/cache-$t -name "*.cubin" 2>/dev/null); do
            echo "### $t $f"
            # (nvdisasm reads NVRTC's bare cubins; cuobjdump found "no device code" in them)
            nvdisasm -c -g "$f" 2>/dev/null || cuobjdump -sass "$f"
        done
    done > "$out/sass.txt" 2>&1
    gzip -f "$out/sass.txt"
    CUPY_CACHE_DIR=/tmp/cache-new timeout $((540 - SECONDS)) ncu -k regex:"gda_chunk_bwd_(scan_o|scores)" \
        -c 2 --section SourceCounters --section WarpStateStats --section SchedulerStats \
        --import-source yes -o "$out/src" python3 -m scripts.profile_chunk_bwd "$names" --forward \
        > "$out/ncu-log.txt" 2>&1
    tail -3 "$out/ncu-log.txt"
    ncu -i "$out/src.ncu-rep" --page source --print-source sass --csv > "$out/src.csv" 2>&1
    ncu -i "$out/src.ncu-rep" --page details > "$out/src-details.txt" 2>&1
    gzip -f "$out/src.csv"
    rm -f "$out/src.ncu-rep"
    ls -la "$out"
    exit 0
fi
if [ "$phase" = "forms" ]; then
    # the model rows (bench: ours, forward, forward + backward, kept) with every opt-in Hopper
    # form on (scan_o by wgmma as clusters, scan_dv, scan_o's S0: v39-v42), then with the
    # defaults, in one call: the A/B that decides whether they go on
    on="from cupy_gda import chunk_bwd as c; c.USE_SCAN_O_WG = c.USE_SCAN_O_MC = c.USE_SCAN_DV = True"
    share=2
    for run in forms defaults; do
        [ "$run" = defaults ] && on="pass" && share=1
        timeout $(((560 - SECONDS) / share)) python3 -c "$on; from cupy_gda.cli import main; main()" \
            bench --shapes "${3:-gla1.3b-bf16,gla340m-bf16,big128-bf16}" --budget 2 \
            --impl ours-auto,ours-auto-fwd+bwd,ours-keep-fwd+bwd --json "$out/forms-$run.json" \
            > "$out/forms-$run.txt" 2>&1
        cat "$out/forms-$run.txt"
    done
    exit 0
fi
if [ "$phase" = "l2-rate" ]; then
    # the L2's ceiling beside scan_o's own rate (2.57 GB into its SMs at GLA-1.3B bf16)
    timeout 240 python3 -m scripts.l2_rate > "$out/l2-rate.txt" 2>&1
    echo "l2_rate: rc $?"
    cat "$out/l2-rate.txt"
    timeout 200 python3 -m scripts.profile_chunk_bwd "${3:-gla1.3b-bf16}" --forward --stages \
        > "$out/stages.txt" 2>&1
    grep -v "^bench" "$out/stages.txt" | head -20
    exit 0
fi
if [ "$phase" = "scores-parts" ]; then
    timeout 540 python3 -m scripts.scores_parts "${3:-gla1.3b-bf16,big128-bf16}" \
        > "$out/scores-parts.txt" 2>&1
    echo "scores_parts: rc $?"
    grep -E "^==|gda_chunk_bwd_scores|from the planes " "$out/scores-parts.txt" | cut -c1-120
    exit 0
fi
# ours and fla's rows of IMPL at SHAPES in one run (fla's autotune given FLA_S s a shape), into
# NAME.txt and NAME.json; each row is logged as it is done, so a run cut off keeps the rows it has
beside_fla() {
    local name="$1" impl="$2" shapes="$3" fla_s="$4"
    PYTHONPATH=.baselines timeout 560 python3 -m scripts.baselines --budget 2 \
        --fla-timeout "$fla_s" --impl "$impl" --shapes "$shapes" --json "$out/$name.json" \
        > "$out/$name.txt" 2>&1
    grep -v "^bench: [^:]*$" "$out/$name.txt" | head -40
}
if [ "$phase" = "fwdbwd-fla" ]; then
    # forward + backward at one shape (SHAPE, default gla1.3b-bf16): fla's autotune takes
    # minutes a shape on a fresh machine (perf-notes v37), so one a call
    beside_fla fwdbwd-fla ours-auto,ours-auto-fwd+bwd,ours-keep-fwd+bwd,fla-chunk_gla-fwd+bwd \
        "${3:-gla1.3b-bf16}" 480
    exit 0
fi
if [ "$phase" = "models-fla" ]; then
    # issue 13's model rows, the forward (SHAPES; fla's autotune some 200 s in all on a fresh
    # machine)
    beside_fla models-fla ours-auto,fla-chunk_gla \
        "${3:-gla1.3b-bf16,gla340m-bf16,big128-bf16,gla1.3b,big128}" 240
    exit 0
fi
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
