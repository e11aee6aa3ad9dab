"""Where gda_chunk_bwd_scores' time goes, by leaving parts of it out (an ablation: the results
are wrong on purpose; only the times mean anything). Each variant builds gda_chunk_bwd from
kernels/gda_chunk_bwd.cu with some of scores' parts switched off by an edit of the source text
(EDITS: each must match exactly once, so a change of the kernel fails here loudly, not
silently), in a process of its own, and prints the forward's stages
(scripts/profile_chunk_bwd.py NAMES --forward --stages): scores' own line is the measurement.

    python -m scripts.scores_parts [NAMES (gla1.3b-bf16,big128-bf16)] [--variants a,b,..]

Variants (VARIANTS): as is; no diagonal (the 16 x 16 diagonal blocks' running products on the
CUDA cores: what sub-anchors would take most of, perf-notes v43's "Next"); no tiles (the
blocks before the diagonal on the tensor cores); no split (the anchored keys' and queries'
bfloat16 terms for those tiles); no planes (VROWS, QK_BY_SCORES: pack's planes of q A and k
D, written by scores); and the loads alone (all four off: the loads, the block products, W's
stores and split). scores' time less a variant's is that part's share, where the parts do not
overlap.
"""
import functools
import subprocess
import sys

from cupy_gda import _compile

KERNEL = "gda_chunk_bwd.cu"
EDITS = {
    "diagonal": [("        if (s0 < BT) {                                  // (the same in the whole warp)",
                  "        if (false) {")],
    "tiles": [("        gda_score_tiles(warp, [&](int slot, int tau, int sg, int jn) {\n"
               "            const int ra",
               "        if (false) gda_score_tiles(warp, [&](int slot, int tau, int sg, int jn) {\n"
               "            const int ra")],
    "split": [("                if (tau > blk) {", "                if (false && tau > blk) {"),
              ("            if (blk > 0) {\n                const float q0",
               "            if (false && blk > 0) {\n                const float q0")],
    "planes": [("            if constexpr (QK_BY_SCORES)\n                gda_scores_planes(pc,",
                "            if constexpr (false)\n                gda_scores_planes(pc,")],
}
VARIANTS = {"as-is": (), "no-diagonal": ("diagonal",), "no-tiles": ("tiles",),
            "no-split": ("split",), "no-planes": ("planes",),
            "loads-alone": ("diagonal", "tiles", "split", "planes")}


def edited(text, parts):
    """The kernel's text with the EDITS of ``parts`` made; ValueError where one does not match
    exactly once."""
    for part in parts:
        for old, new in EDITS[part]:
            if text.count(old) != 1:
                raise ValueError(f"scores_parts: the edit '{part}' matches {text.count(old)} times "
                                 f"in kernels/{KERNEL} (1 expected): {old.strip()[:60]!r}")
            text = text.replace(old, new)
    return text


def edited_reader(read, parts):
    """_compile._read's stand-in: ``read`` with the EDITS of ``parts`` made to the kernel."""
    return functools.lru_cache(maxsize=None)(
        lambda name: edited(read(name), parts) if name == KERNEL else read(name))


def child(variant, names):
    """In this process: gda_chunk_bwd built with ``variant``'s edits, then the forward's stages."""
    _compile._read = edited_reader(_compile._read, VARIANTS[variant])
    from scripts import profile_chunk_bwd
    profile_chunk_bwd.main([names, "--forward", "--stages"])


def main(argv):
    names = next((a for a in argv if not a.startswith("--")), "gla1.3b-bf16,big128-bf16")
    chosen = (argv[argv.index("--variants") + 1].split(",") if "--variants" in argv
              else list(VARIANTS))
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"scores_parts: unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    text = _compile._read(KERNEL)
    for v in chosen:                                # every edit matches before any GPU work
        edited(text, VARIANTS[v])
    rc = 0
    for v in chosen:
        print(f"== {v}", flush=True)
        run = subprocess.run([sys.executable, "-c", f"from scripts import scores_parts as s; "
                              f"s.child({v!r}, {names!r})"], capture_output=True, text=True)
        lines = [ln for ln in run.stdout.splitlines() if not ln.startswith("bench")]
        print("\n".join(lines), flush=True)
        if run.returncode:
            rc = run.returncode
            print(run.stderr[-2000:], flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
