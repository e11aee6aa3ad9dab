"""A model of gda_chunk_bwd_scores' shared-memory wavefronts a key step a block (BT 64, KI 16,
128 threads, W in two terms; CPU only): for each access, the lanes' word addresses a warp
instruction touches, and the wavefronts that takes (the most distinct words in one bank; 8-byte
accesses a half-warp at a time). It placed v51's layout of b_q, b_sp and b_pr (by key column,
rows of BT + 2: 1536 wavefronts against 1728 with rows of steps, KI + 1 floats each; ncu not
run after it, scores 0-1.5 % faster) and showed what no padding of those layouts fixes
(perf-notes v51):

    python -m scripts.scores_banks           # the kernel's layout and the one before v51
"""
BT, KI, NTS, NBK, DT = 64, 16, 128, 4, 2


def waves(addrs, width=1):
    """Wavefronts of one warp instruction: addrs, the 32 lanes' first words; width words each."""
    per, total = 32 // width, 0
    for g in range(0, 32, per):
        banks = {}
        for a in addrs[g:g + per]:
            for w in range(width):
                banks.setdefault((a + w) % 32, set()).add(a + w)
        total += max((len(s) for s in banks.values()), default=0)
    return total


class Layout:
    """by_column: b_q, b_sp, b_pr as [KI][BT + pad] (v51), else [BT][KI + pad] (before);
    kw: words a row of the split operands b_ka, b_qa; kg_pad: b_kg's [KI][BT + kg_pad] float2."""

    def __init__(self, by_column=True, pad=2, kw=12, kg_pad=1):
        self.by_column, self.pad, self.kw, self.kg_pad = by_column, pad, kw, kg_pad

    def q(self, t, i):                  # b_q, b_sp and b_pr alike
        return i * (BT + self.pad) + t if self.by_column else t * (KI + self.pad) + i

    def kg(self, i, t):
        return 2 * (i * (BT + self.kg_pad) + t)


def wavefronts(lay):
    """{access: wavefronts a key step a block} under Layout lay."""
    tot = {}

    def add(name, n):
        tot[name] = tot.get(name, 0) + n
    warps = [[w * 32 + ln for ln in range(32)] for w in range(NTS // 32)]
    for lanes in warps:                 # the loads: thread x column x % KI, rows 8 apart
        for p in range(BT // (NTS // KI)):
            rows = [x // KI + NTS // KI * p for x in lanes]
            add("loads: b_q stores", waves([lay.q(t, x % KI) for x, t in zip(lanes, rows)]))
            add("loads: b_kg stores", waves([lay.kg(x % KI, t) for x, t in zip(lanes, rows)], 2))
    for lanes in warps[:2]:             # the products: thread (column, block), 16 steps each
        for ss in range(16):
            add("products: b_kg.y reads", 2 * waves([lay.kg(x % KI, x // KI * 16 + ss) + 1
                                                     for x in lanes]))
            add("products: b_sp, b_pr stores", 2 * waves([lay.q(x // KI * 16 + ss, x % KI)
                                                          for x in lanes]))
    for lanes in warps:                 # the split items: rows tid / 8 (+ 16 a block), pairs tid % 8
        for blk in range(NBK):
            ts, ips = [x // 8 % 16 + 16 * blk for x in lanes], [x % 8 for x in lanes]
            for c in range(2):
                ii = [2 * ip + c for ip in ips]
                add("items: b_kg.x reads", 2 * waves([lay.kg(i, t) for i, t in zip(ii, ts)]))
                add("items: b_sp, b_q, b_pr reads", 6 * waves([lay.q(t, i) for i, t in zip(ii, ts)]))
            taus = sum(1 for tau in range(1, NBK) if tau > blk)
            add("items: b_ka stores", DT * taus * waves([t * lay.kw + ip for t, ip in zip(ts, ips)]))
            if blk:
                add("items: b_qa stores", DT * waves([(t - 16) * lay.kw + ip for t, ip in zip(ts, ips)]))
    g8, t4 = [ln // 4 for ln in range(32)], [ln % 4 for ln in range(32)]
    add("tiles: fragment reads", NBK * (NBK - 1) * 6 * DT
        * waves([g * lay.kw + t for g, t in zip(g8, t4)]))
    for lanes in warps:                 # the diagonal: thread (pair, part), columns part * 4 + c
        pair, part = [x // 4 for x in lanes], [x % 4 for x in lanes]
        s0, u = [p // 8 * 16 for p in pair], [p % 8 for p in pair]
        for c in range(KI // 4):
            ii = [pt * 4 + c for pt in part]
            add("diagonal: b_q reads", waves([lay.q(a + b, i) for a, b, i in zip(s0, u, ii)])
                + waves([lay.q(a + 15 - b, i) for a, b, i in zip(s0, u, ii)]))
            for j in range(17):
                add("diagonal: b_kg reads", waves([lay.kg(i, a + (b - j if j <= b else 16 - j))
                                                   for a, b, i in zip(s0, u, ii)], 2))
    return tot


def main():
    for name, lay in (("v51: by key column, rows of BT + 2", Layout()),
                      ("before: by step, rows of KI + 1", Layout(by_column=False, pad=1))):
        tot = wavefronts(lay)
        print(f"{name}: {sum(tot.values())} wavefronts a key step a block")
        for access, n in tot.items():
            print(f"    {access:32s} {n:5d}")


if __name__ == "__main__":
    main()
