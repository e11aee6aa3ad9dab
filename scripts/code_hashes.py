"""Whether a change to the kernels' sources changes their code, without a GPU (CPU only, NVRTC):
a hash of each of tests/test_compile.py's builds, every ELF section of its cubin but .strtab
(whose symbol names NVRTC draws afresh each compile: two builds of the same source differ
there alone). A refactor or a comment whose builds all hash the same before and after runs the
same code, so it needs no GPU suite of its own (v54: gda_mbar_wait's two scopes in one asm, 54
sm_90 gda_chunk_bwd builds the same). Not every build is deterministic: gda_chunk_fwd's sm_90a
wgmma builds (5 of the 315 on 2026-12-07) compile to a different .text from one compile of the
same source to the next (45,498 of 247,936 bytes at K = V = 128 bf16, the same length), so a
difference there says nothing; hash such a build a few times in each tree (the values the two
trees share) or leave it to the GPU suite.

    python -m scripts.code_hashes OUT.json [PREFIX]       # in each tree (a build id's prefix,
    python -m scripts.code_hashes --compare OLD.json NEW.json   #  e.g. gda_chunk_bwd-sm_90)

Run the first in each tree's own folder (the old one from `git archive`), then --compare: it
prints each build whose code differs and exits 1 if any does or if the two hold other builds.
"""
import hashlib
import json
import struct
import sys


def sections(elf):
    """{name: bytes} of the sections of a 64-bit little-endian ELF (NOBITS ones empty)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx][4]
    out = {}
    for name, kind, _, _, off, size, *_ in heads:
        key = elf[names + name:elf.index(b"\0", names + name)].decode()
        out[key] = b"" if kind == 8 else elf[off:off + size]
    return out


def code_hash(cubin):
    """sha256 over every section of ``cubin`` but .strtab, by name."""
    return hashlib.sha256(b"".join(name.encode() + body for name, body in
                                   sorted(sections(bytes(cubin)).items())
                                   if name != ".strtab")).hexdigest()


def hashes(prefix=""):
    """{build id: code_hash} of this tree's test_compile builds whose ids start with prefix."""
    sys.path.insert(0, "tests")
    import test_compile
    out = {}
    for case in test_compile.CASES:
        kernel, arch, items = case.values
        if case.id.startswith(prefix):
            out[case.id] = code_hash(test_compile._build(kernel, items, arch)[0])
    return out


def compare(old, new):
    """The ids whose code differs between two hash maps, and those in one only."""
    return ([i for i in old if i in new and old[i] != new[i]],
            sorted(set(old) ^ set(new)))


def main(argv):
    if argv[:1] == ["--compare"] and len(argv) == 3:
        old, new = (json.load(open(f)) for f in argv[1:])
        differ, apart = compare(old, new)
        for i in differ:
            print(f"differs: {i}")
        for i in apart:
            print(f"in one only: {i}")
        print(f"{len(old) - len(differ) - len(set(old) - set(new))} of {len(old)} builds the same code")
        return 1 if differ or apart else 0
    if len(argv) in (1, 2) and not argv[0].startswith("-"):
        out = hashes(argv[1] if len(argv) == 2 else "")
        json.dump(out, open(argv[0], "w"), indent=1, sort_keys=True)
        print(f"{len(out)} builds hashed into {argv[0]}")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
