"""Instructions executed and stall samples of gda_chunk_fwd by stage, from ncu's source view of
one launch (scripts/ncu_chunk.py; CPU only, reads the CSV):

    ncu -k gda_chunk_fwd --section SourceCounters --import-source yes -o rep \\
        python3 scripts/ncu_chunk.py 8,4096,16,128,128 bfloat16
    ncu -i rep.ncu-rep --page source --print-source cuda,sass --csv > both.csv
    python3 scripts/ncu_stages.py both.csv bfloat16 [K V BV DBUF]

The kernel's source lines are put in the numbered stages by its markers ("// 1. stage the
chunk" .. "// 5. state"); inlined helpers count apart: the TF32/bf16 split, the mma, the
fragment loaders (stage 4 and 5 operands), gda_stage, gda_stage_async and the cp.async helpers
(load), gda_diag (diagonal). The
source text is rebuilt with _compile.source from the same defines, so the line numbers match
the file ncu_chunk.py compiled.
"""
import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cupy_gda import _compile, _gpu  # noqa: E402

# (pattern of the first line, category, pattern of the last line (from the first on) or None:
# the function's closing "}")
SPANS = [(r"void gda_split\(", "split", None), (r"void gda_split2\(", "split", None),
         (r"void gda_mma\(", "mma", None), (r"void gda_mma3\(", "mma", None),
         (r"void gda_frag_a\(", "fragments", None), (r"void gda_frag_b\(", "fragments", None),
         (r"void gda_mma_tiles\(", "fragments", None), (r"void gda_st\(", "1 load", None),
         (r"void gda_stage\(", "1 load", None), (r"void gda_stage_async\(", "1 load", None),
         (r"void gda_cp16\(", "1 load", None), (r"void gda_cp_commit\(", "1 load", r"gda_cp_commit"),
         (r"void gda_cp_wait\(", "1 load", None), (r"void gda_halve\(", "2 diagonal", None),
         (r"void gda_diag\(", "2 diagonal", None),
         (r"// 1\. stage the chunk", "1 load", r"GDA_PROF\(1\)"),
         (r"// 2\. diagonal sub-block", "2 diagonal", r"GDA_PROF\(2\)"),
         (r"// 3\. gate scans", "3 scan", r"GDA_PROF\(3\)"),
         (r"// 4\. output rows", "4 output", r"GDA_PROF\(4\)"),
         (r"// 5\. state: S = diag", "5 state", r"GDA_PROF\(5\)")]


def categories(lines):
    """Category of each 1-based source line."""
    cat = ["other"] * (len(lines) + 2)
    for first, name, last in SPANS:
        i = next(n for n, text in enumerate(lines) if re.search(first, text))
        j = next(n for n in range(i + (last is None), len(lines))
                 if (lines[n].startswith("}") if last is None else re.search(last, lines[n])))
        for n in range(i, j + 1):
            cat[n + 1] = name
    return cat


def main():
    path, dtype, *rest = sys.argv[1:]
    K, V, BV, DBUF = (int(x) for x in rest) if rest else (128, 128, 64, 0)
    defines = dict(K_DIM=K, V_DIM=V, IO_DTYPE=_gpu.DTYPE_CODE[dtype], G_DTYPE=0, LOG_GATE=0,
                   SEQ_INT64=0, BV=BV, DBUF=DBUF)
    cat = categories(_compile.source("gda_chunk_fwd", defines).split("\n"))
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
