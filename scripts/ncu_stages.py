"""Instructions executed and stall samples of gda_chunk_fwd by stage, from ncu's source view of
one launch (scripts/profile_chunk.py --ncu; CPU only, reads the CSV):

    ncu -k gda_chunk_fwd --section SourceCounters --import-source yes -o rep \\
        python -m scripts.profile_chunk --ncu 8,4096,16,128,128 bfloat16
    ncu -i rep.ncu-rep --page source --print-source cuda,sass --csv > both.csv
    python -m scripts.ncu_stages both.csv 8,4096,16,128,128 bfloat16

The source lines are put in the kernel's numbered stages by its stage functions
(gda_chunk_load .. gda_chunk_update, with the helpers each calls); the mma.cuh helpers count
apart: the TF32/bf16 split, the mma, the fragment loaders (stage 4 and 5 operands), and so do
the guard (gda_tile_in_range and the max.NaN helpers that stage 1 and 3 call for it) and the
stepped chunks (gda_chunk_step). The source
text is rebuilt with _compile.source from the defines of the same shape on this machine's rule
(H200 limits), so the line numbers match the file profile_chunk.py compiled.
"""
import csv
import re
import sys
from pathlib import Path

from cupy_gda import _checks, _compile, chunk

# (pattern of a function's first line, category): the function's lines up to its closing "}"
SPANS = [(r"void gda_split\(", "split"), (r"void gda_split2\(", "split"),
         (r"void gda_mma\(", "mma"), (r"void gda_mma3\(", "mma"),
         (r"void gda_frag_a\(", "fragments"), (r"void gda_frag_b\(", "fragments"),
         (r"void gda_mma_tiles\(", "fragments"),
         (r"void gda_st\(", "1 load"), (r"gda_ld\(const E\* p\)", "1 load"),
         (r"void gda_stage\(", "1 load"), (r"void gda_stage_async\(", "1 load"),
         (r"void gda_copy_chunk\(", "1 load"), (r"bool gda_chunk_load\(", "1 load"),
         (r"void gda_cp16\(", "1 load"), (r"void gda_cp_commit\(", "1 load"),
         (r"void gda_cp_wait\(", "1 load"),
         (r"void gda_halve\(", "2 scores"), (r"void gda_diag\(", "2 scores"),
         (r"void gda_diag_store\(", "2 scores"), (r"void gda_chunk_scores\(", "2 scores"),
         (r"void gda_chunk_scores_store\(", "2 scores"), (r"bool gda_chunk_decays\(", "3 decays"),
         (r"void gda_scores_earlier\(", "4 output"), (r"void gda_chunk_scores_earlier\(", "4 output"),
         (r"void gda_chunk_output_keys\(", "4 output"), (r"void gda_chunk_output_values\(", "4 output"),
         (r"bool gda_chunk_update\(", "5 state"), (r"void gda_absmax\(float& m", "guard"),
         (r"void gda_absmax\(float \(&m\)", "guard"),
         (r"bool gda_absmax_in\(", "guard"),
         (r"bool gda_tile_in_range\(", "guard"), (r"bool gda_chunk_step\(", "stepped")]


def categories(lines):
    """Category of each 1-based source line."""
    cat = ["other"] * (len(lines) + 2)
    for first, name in SPANS:
        i = next(n for n, text in enumerate(lines) if re.search(first, text))
        j = next(n for n in range(i, len(lines)) if lines[n].startswith("}")
                 or lines[n].rstrip().endswith("}") and n == i)
        for n in range(i, j + 1):
            cat[n + 1] = name
    return cat


def main():
    path, shape, *rest = sys.argv[1:]
    dtype = rest[0] if rest else "float32"
    B, T, H, K, V = (int(x) for x in shape.split(","))
    p = _checks.Problem(B=B, T=T, H=H, K=K, V=V, N=B, dtype=dtype, g_dtype="float32", log_gate=False)
    defines = chunk.defines(p, chunk.config(p), False)
    cat = categories(_compile.source(chunk.FAMILY.kernel, defines, chunk.FAMILY.headers).split("\n"))
    ins, samples, file, width = {}, {}, None, None
    with open(path) as f:
        for row in csv.reader(f):
            if row and row[0] == "File Path":
                file = row[1]
                continue
            if row and row[0] == "Line No":
                width = len(row)
                continue
            if width is None or len(row) < 8 or not row[0].isdigit():
                continue
            row = row[:2] + row[len(row) - (width - 2):]   # source text with quotes splits a row
            c = cat[int(row[0])] if "gda_chunk_fwd" in Path(file).name else "library (libm, ...)"
            ins[c] = ins.get(c, 0) + (int(row[7]) if row[7] not in ("-", "") else 0)
            samples[c] = samples.get(c, 0) + (int(row[4]) if row[4] not in ("-", "") else 0)
    total, stalls = sum(ins.values()), sum(samples.values())
    print(f"{dtype}: {total / 1e6:.0f} M warp instructions executed")
    for c in sorted(ins, key=lambda c: -ins[c]):
        print(f"  {c:20s} {ins[c] / 1e6:8.1f} M  {100 * ins[c] / total:5.1f} %   "
              f"stall samples {100 * samples[c] / max(stalls, 1):5.1f} %")


if __name__ == "__main__":
    main()
