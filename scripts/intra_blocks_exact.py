"""Design check for the next form of gda_chunk_bwd_intra (an experiment, not shipped code): its
O(C^2 K) scalar sums over one chunk in sub-blocks of SB steps, the parts that cross a sub-block
boundary as matmuls of anchored operands (tensor-core shaped), every decay a *product* of gates,
so gates of 0, negative, tiny and above 1 stay exact.

Per key column, with P(a..b) = prod_{a <= r <= b} g_r (1 when empty) inside the chunk and M the
chunk's scale v do^T, intra computes (kernels/gda_chunk_bwd.cu, stage 6):

    DQ_t = sum_{s <= t} P(s+1..t) k_s M[s, t]                      (dq's intra term)
    DK_t = X_t[t],  X_t[s] = sum_{u >= t} P(t+1..u) q_u M[s, u]    (dk's intra term)
    T4_t = sum_{s < t <= u} P(s+1..t-1) P(t+1..u) k_s q_u M[s, u]  (dg's intra term)

today as one reverse scan of X over the whole chunk (~C^2/2 steps a column). In sub-blocks
[b, e] of SB steps, with keys anchored at a block's start and queries at the next one's,

    Ka_s = k_s P(s+1..b-1) (s < b),   Qn_u = q_u P(e+1..u) (u > e),
    XB[s] = sum_{u > e} M[s, u] Qn_u  (s <= e),   Z[t] = sum_{s < b} M[s, t] Ka_s  (b <= t <= e),
    C = sum_{s < b} Ka_s XB[s],

(matmuls of M with the anchored operands, and a dot) each block needs only SB-step scans:
    X_t[s], s in the block: the scan started from XB (X_e[s] = q_e M[s, e] + XB[s]);
    DK_t = X_t[t];  DQ_t = (the block's s <= t) + P(b..t) Z[t];
    T4_t = (the block's s < t, weights P(s+1..t-1) k_s, times X_t[s])
           + P(b..t-1) (Y_t + P(t+1..e) C),   Y_t = sum_{t <= u <= e} P(t+1..u) q_u Z[u].
So the scalar work falls from ~C^2/2 to ~C SB/2 steps a column (4x at C = 64, SB = 16), and the
rest is tensor-core work. tests/test_chunk_design.py checks intra_blocks against intra_direct
(the sums as written above) for every gate regime. docs/perf-notes.md, v22.
"""
import numpy as np


def _prod(g, a, b):
    """P(a..b) over the rows of g [C, K] (ones where a > b)."""
    return np.prod(g[a:b + 1], axis=0) if a <= b else np.ones(g.shape[1], g.dtype)


def intra_direct(q, k, g, M):
    """(DQ, DK, T4), each [C, K], by their defining sums: q, k, g [C, K], M [C, C]."""
    C, K = q.shape
    P = np.zeros((C + 1, C, K), q.dtype)            # P[a, b] = P(a..b) for a <= b + 1, else 0
    for a in range(C + 1):
        if a < C:
            P[a, a:] = np.cumprod(g[a:], axis=0)
        if a > 0:
            P[a, a - 1] = 1
    s, t = np.arange(C)[:, None], np.arange(C)[None, :]
    up = P[1:]                                      # up[s, t] = P(s+1..t): 1 at t = s, 0 below
    low = np.where((s < t)[:, :, None], P[1:][:, np.maximum(t - 1, 0)[0]], 0)  # P(s+1..t-1), s < t
    DQ = np.einsum("stk,sk,st->tk", up, k, M)
    DK = np.einsum("tuk,uk,tu->tk", up, q, M)
    T4 = np.einsum("stk,sk,su,tuk,uk->tk", low, k, M, up, q)
    return DQ, DK, T4


def intra_blocks(q, k, g, M, SB=16):
    """(DQ, DK, T4) as intra_direct's, in sub-blocks of SB steps (C a multiple of SB)."""
    C, K = q.shape
    assert C % SB == 0
    DQ, DK, T4 = (np.zeros((C, K), q.dtype) for _ in range(3))
    for b in range(0, C, SB):
        e = b + SB - 1
        Ka = np.stack([k[s] * _prod(g, s + 1, b - 1) for s in range(b)]) if b else None
        Qn = np.stack([q[u] * _prod(g, e + 1, u) for u in range(e + 1, C)]) if e + 1 < C else None
        # the matmuls (and the dot): tensor-core shaped, per block
        XB = M[:e + 1, e + 1:] @ Qn if Qn is not None else np.zeros((e + 1, K), q.dtype)
        Z = M[:b, b:e + 1].T @ Ka if b else np.zeros((SB, K), q.dtype)
        Cb = (Ka * XB[:b]).sum(axis=0) if b else np.zeros(K, q.dtype)
        # the SB-step scans, from the block's last step down
        x = XB[b:e + 1].copy()                      # X_{t+1}[s] times g_{t+1}: at t = e, XB
        y = np.zeros(K, q.dtype)                    # Y_{t+1}
        gnext = np.ones(K, q.dtype)                 # g_{t+1} inside the block (1 at t = e)
        for t in range(e, b - 1, -1):
            x = q[t] * M[b:e + 1, t][:, None] + gnext * x          # X_t[s], s in b..e
            y = q[t] * Z[t - b] + gnext * y                        # Y_t
            DK[t] = x[t - b]
            DQ[t] = _prod(g, b, t) * Z[t - b]
            for s in range(b, t + 1):
                DQ[t] += _prod(g, s + 1, t) * k[s] * M[s, t]
            T4[t] = _prod(g, b, t - 1) * (y + _prod(g, t + 1, e) * Cb)
            for s in range(b, t):
                T4[t] += _prod(g, s + 1, t - 1) * k[s] * x[s - b]
            gnext = g[t]
    return DQ, DK, T4
