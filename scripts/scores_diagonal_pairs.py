"""Design check for gda_chunk_bwd_scores' diagonal blocks (v45; an experiment's check, not
shipped code): the kernel's threads as they take the 16 x 16 diagonal blocks of a chunk's W, in
NumPy, so that the index algebra is checked on the CPU.

Thread x of NT takes the pair of columns u and 15 - u (u < 8) of block s0 (pair x / DP: s0 =
pair / 8 * 16, u = pair % 8) and part x % DP of each step's KI key columns. Its j-th (s, u) of
ND = 17: for j <= u, s = u - j of column u; after, s = 16 - j of column 15 - u; each column a
running product from s = the column down (P(s+1..u), reset to 1 at the second column's first).
So every (s, u) with s <= u of a block is one thread's once, and no thread takes an s above its
u, where a thread a column took all 16 s, half of them 0 (perf-notes v45)."""
import numpy as np

ND = 17


def diagonal_pairs(q, k, g, DP, NT=128, KI=16):
    """W's diagonal 16-step blocks of a chunk (q, k, g [C, K]; K a multiple of KI) as the
    kernel's threads sum them, float64; NaN where no thread wrote (above the diagonal blocks),
    0 below the diagonal (the kernel's last loop); also each element's count of writers."""
    C, K = q.shape
    W = np.full((C, C), np.nan)
    W[np.tril_indices(C, -1)] = 0.0
    writes = np.zeros((C, C), int)
    wd = {}                                             # (pair, j): the parts' sum
    for x in range(NT):
        pair, part = x // DP, x % DP
        s0, u = pair // 8 * 16, pair % 8
        if s0 >= C:
            continue
        for i0 in range(0, K, KI):
            for c in range(KI // DP):
                ii = i0 + part * (KI // DP) + c
                qa, qb = q[s0 + u, ii], q[s0 + 15 - u, ii]
                p = 1.0
                for j in range(ND):
                    first = j <= u
                    s = s0 + (u - j if first else 16 - j)
                    p = 1.0 if j == u + 1 else p
                    wd[pair, j] = wd.get((pair, j), 0.0) + k[s, ii] * p * (qa if first else qb)
                    p *= g[s, ii]
    for (pair, j), val in wd.items():
        s0, u = pair // 8 * 16, pair % 8
        s, col = s0 + (u - j if j <= u else 16 - j), s0 + (u if j <= u else 15 - u)
        W[s, col] = val
        writes[s, col] += 1
    return W, writes
