"""A kernel's SASS source page from ncu, summed (CPU only, reads the CSV): its stall reasons,
its shared-memory wavefronts and their excess over the ideal (bank conflicts), the
instructions with the most excess, the L2 sectors and shared wavefronts a cp.async takes, its
opcode mix and the instructions with the most stall samples. NVRTC's sources are not on ncu's
disk, so the CUDA page is empty; this reads the SASS one (perf-notes v51):

    ncu -k regex:"gda_chunk_bwd_(scan_o|scores)" -c 2 --section SourceCounters \\
        --section WarpStateStats -o rep python3 ...
    ncu -i rep.ncu-rep --page source --print-source sass --csv | gzip > src-sass.csv.gz
    python -m scripts.ncu_sass src-sass.csv.gz [TOP (25)]
"""
import collections
import csv
import gzip
import sys

SHARED, EXCESS = "L1 Wavefronts Shared", "L1 Wavefronts Shared Excessive"
SECTORS = "L2 Theoretical Sectors Global"
SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(lines):
    """{kernel name: [one dict per SASS instruction, by column name]} of the page's CSV lines."""
    out, name, head = collections.defaultdict(list), None, None
    for row in csv.reader(lines):
        if row and row[0] == "Kernel Name":
            name = row[1]
        elif row and row[0] == "Address":
            head = row
        elif head and len(row) == len(head):
            out[name].append(dict(zip(head, row)))
    return out


def number(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def opcode(source):
    """The instruction's opcode without its predicate and modifiers ('@!P0 LDS.64 ..' -> LDS)."""
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else ""


def summary(name, ins, top=25):
    """The lines of one kernel's summary."""
    lines = [f"== {name}: {len(ins)} instructions"]
    stalls = collections.Counter()
    for d in ins:
        for col, x in d.items():
            if col.startswith("stall_") and "Not Issued" not in col:
                stalls[col[6:]] += number(x)
    total = sum(stalls.values()) or 1
    lines.append(" stalls: " + ", ".join(f"{s} {n / total:.0%}" for s, n in stalls.most_common(9)))
    waves, excess = (sum(number(d.get(c, "0")) for d in ins) for c in (SHARED, EXCESS))
    lines.append(f" shared wavefronts {waves:.3g}, excess {excess:.3g}")
    copies = [d for d in ins if opcode(d["Source"]) == "LDGSTS"]
    n = sum(number(d["Instructions Executed"]) for d in copies)
    if n:                                               # (cp.async: what each costs, v52, v53)
        per = {c: sum(number(d.get(c, "0")) for d in copies) / n
               for c in (SECTORS, SECTORS + " Ideal", SHARED, SHARED + " Ideal")}
        lines.append(f" cp.async: {n:.3g} executed, a warp's each {per[SECTORS]:.1f} L2 sectors "
                     f"(ideal {per[SECTORS + ' Ideal']:.1f}), {per[SHARED]:.1f} shared wavefronts "
                     f"(ideal {per[SHARED + ' Ideal']:.1f})")
    for i in sorted(range(len(ins)), key=lambda i: -number(ins[i].get(EXCESS, "0")))[:top]:
        d = ins[i]
        if number(d.get(EXCESS, "0")):
            lines.append(f"  {i:5d} {number(d[EXCESS]):10.0f} of {number(d[SHARED]):10.0f}  "
                         f"{d['Source'].strip()[:70]}")
    ops = collections.Counter()
    for d in ins:
        ops[opcode(d["Source"])] += number(d["Instructions Executed"])
    n = sum(ops.values()) or 1
    lines.append(" ops: " + ", ".join(f"{o} {c / n:.1%}" for o, c in ops.most_common(22)))
    samples = sum(number(d.get(SAMPLES, "0")) for d in ins) or 1
    lines.append(" most sampled:")
    for i in sorted(sorted(range(len(ins)), key=lambda i: -number(ins[i].get(SAMPLES, "0")))[:top]):
        d = ins[i]
        why = sorted(((number(x), c[6:]) for c, x in d.items()
                      if c.startswith("stall_") and "Not Issued" not in c), reverse=True)[:2]
        lines.append(f"  {i:5d} {number(d.get(SAMPLES, '0')) / samples:6.1%} executed "
                     f"{d['Instructions Executed']:>9s}  {d['Source'].strip()[:60]:60s} "
                     + ", ".join(f"{c} {x:.0f}" for x, c in why))
    return lines


def main():
    path, *rest = sys.argv[1:]
    top = int(rest[0]) if rest else 25
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for name, ins in kernels(f).items():
            print("\n".join(summary(name, ins, top)))


if __name__ == "__main__":
    main()
