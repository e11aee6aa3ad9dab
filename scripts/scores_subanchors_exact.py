"""Design check for the next form of gda_chunk_bwd_scores (an experiment, not shipped code): W
of a chunk with its diagonal 16-step blocks anchored once more, at sub-blocks of SUB steps, so
that the tensor cores take all of W but SUB x SUB triangles, every decay still a *product* of
gates (gates of 0, negative, tiny and above 1 stay exact). docs/perf-notes.md, v43, "Next".

Per chunk of C steps and K key columns, with P(a..b) = prod_{a <= r <= b} g_r (1 when empty),

    W[s, u] = sum_i k_s[i] P(s+1..u)[i] q_u[i]   (s <= u; 0 below the diagonal).

Today (kernels/gda_chunk_bwd.cu, stage 5) the blocks of BS = 16 steps before the diagonal go to
the tensor cores with the keys anchored at u's block start b: (k_s P(s+1..b-1)) . (q_u P(b..u)),
and the BS x BS diagonal blocks run on the CUDA cores (a running product from s = u down, over
all BS steps of s: half of them add zeros). Anchored the same way at u's sub-block start c
inside a diagonal block, the sub-blocks of s before u's take (k_s P(s+1..c-1)) . (q_u P(c..u)):
matmuls of anchored operands again (for each sub-block c of a block, the block's rows s < c
against c's SUB columns), and only the SUB x SUB triangles stay scalar. The scalar work falls
from BS (BS + 1) / 2 pairs a block and column to BS / SUB * SUB (SUB + 1) / 2 (136 -> 40 at BS =
16, SUB = 4). tests/test_chunk_design.py checks scores_subanchored against scores_direct for
every gate regime.
"""
import numpy as np

from scripts.intra_blocks_exact import _prod


def scores_direct(q, k, g):
    """W [C, C] by its defining sum: q, k, g [C, K]."""
    C = q.shape[0]
    W = np.zeros((C, C), q.dtype)
    for u in range(C):
        for s in range(u + 1):
            W[s, u] = np.sum(k[s] * _prod(g, s + 1, u) * q[u])
    return W


def _anchored(q, k, g, rows, cols, c):
    """W[rows, cols] for rows all before anchor c <= every column: one matmul of the keys
    anchored at c, k_s P(s+1..c-1), and the queries from c, q_u P(c..u)."""
    ka = np.stack([k[s] * _prod(g, s + 1, c - 1) for s in rows])
    qa = np.stack([q[u] * _prod(g, c, u) for u in cols])
    return ka @ qa.T


def scores_subanchored(q, k, g, BS=16, SUB=4):
    """W as scores_direct's: blocks of BS steps before the diagonal anchored at u's block, the
    sub-blocks of SUB steps before the diagonal inside a block at u's sub-block, the SUB x SUB
    triangles by running products (C a multiple of BS, BS of SUB)."""
    C = q.shape[0]
    assert C % BS == 0 and BS % SUB == 0
    W = np.zeros((C, C), q.dtype)
    for b in range(BS, C, BS):                      # today's tensor-core tiles
        W[:b, b:b + BS] = _anchored(q, k, g, range(b), range(b, b + BS), b)
    for b in range(0, C, BS):                       # inside each diagonal block
        for c in range(b + SUB, b + BS, SUB):       #  its sub-blocks before the diagonal
            W[b:c, c:c + SUB] = _anchored(q, k, g, range(b, c), range(c, c + SUB), c)
        for c in range(b, b + BS, SUB):             #  the SUB x SUB triangles
            for u in range(c, c + SUB):
                p = np.ones(q.shape[1], q.dtype)    # P(s+1..u), s from u down
                for s in range(u, c - 1, -1):
                    W[s, u] = np.sum(k[s] * p * q[u])
                    p = p * g[s]
    return W


def scalar_pairs(C, BS=16, SUB=None):
    """(s, u) pairs a key column that run on the CUDA cores: every diagonal block's BS (BS + 1)
    / 2 today, its SUB x SUB triangles' with the sub-anchors."""
    n = SUB or BS
    return C // n * n * (n + 1) // 2
