"""Design check for the chunked tensor-core kernel (an experiment, not shipped code).

The GLA chunked forward written so that every step is a matmul (what the CUDA kernel would do
with mma) and every decay factor is a *product* of gates, never a quotient or a difference of
logs. So gates of exactly 0, negative gates, tiny gates and gates above 1 stay exact, which
fla's chunk mode (exp of differences of cumulative log-gates) does not manage for 0.

Chunks of BT steps, each split into sub-blocks of BS steps. For rows t of sub-block i and
columns s of an earlier sub-block j:

    prod_{s < r <= t} g_r  =  Q_j[s]  *  M_ji  *  P_i[t]

with P_i the prefix product inside sub-block i (up to t), Q_j the suffix product inside
sub-block j (after s) and M_ji the product of the whole sub-blocks between them. The diagonal
sub-blocks take their pairwise products directly (BS x BS x K, on the CUDA cores).

See docs/perf-notes.md; tests/test_chunk_design.py checks it against the float64 loop.

    python -m scripts.chunk_operand_rounding      # its error with tensor-core operand roundings
"""
import numpy as np


def chunk_forward(q, k, v, g, h0=None, BT=64, BS=16):
    """q, k, g [B, T, H, K]; v [B, T, H, V]; h0 [B, H, K, V] or None -> (o, S_final).
    The stages numbered as gda_chunk_fwd's (and reference.gated_attention_chunked's)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    S = np.zeros((B, H, K, V), q.dtype) if h0 is None else h0.astype(q.dtype)
    o = np.empty((B, T, H, V), q.dtype)
    for c0 in range(0, T, BT):
        # 1. load the chunk
        qc, kc, vc, gc = (x[:, c0:c0 + BT] for x in (q, k, v, g))
        C = qc.shape[1]
        subs = [(a, min(a + BS, C)) for a in range(0, C, BS)]
        # 2. scores of the diagonal sub-blocks: pairwise products prod_{s < r <= t} g_r, s <= t
        Wd = []
        for ai, ei in subs:
            gi, n = gc[:, ai:ei], ei - ai
            later = np.arange(n)[None, :] > np.arange(n)[:, None]          # [s, t]: t > s
            pair = np.cumprod(np.where(later[None, :, :, None, None], gi[:, None], 1), axis=2)
            W = np.einsum("bthk,bsthk,bshk->bhts", qc[:, ai:ei], pair, kc[:, ai:ei])
            Wd.append(np.where(np.tril(np.ones((n, n), bool)), W, 0))     # s <= t only
        # 3. decays: gate products over the chunk and over each sub-block
        A = np.cumprod(gc, axis=1)                                       # prod_{c0 <= r <= t}
        D = np.ones_like(gc)                                             # prod_{s < r <= end}
        D[:, :-1] = np.cumprod(gc[:, :0:-1], axis=1)[:, ::-1]
        P = np.concatenate([np.cumprod(gc[:, a:e], axis=1) for a, e in subs], axis=1)
        Q = np.concatenate([_suffix_exclusive(gc[:, a:e]) for a, e in subs], axis=1)
        G = [np.prod(gc[:, a:e], axis=1) for a, e in subs]               # [B, H, K] each
        # 4. output: (q_t * A_t) S, then per sub-block i the earlier sub-blocks' scores
        #    (q_i * P_i * M_ji)(k_j * Q_j)^T times v_j, and its own W_i v_i
        oc = np.einsum("bthk,bhkv->bthv", qc * A, S)
        for i, (ai, ei) in enumerate(subs):
            M = np.ones_like(G[0])
            for j in range(i - 1, -1, -1):
                aj, ej = subs[j]
                qt = qc[:, ai:ei] * P[:, ai:ei] * M[:, None]
                kt = kc[:, aj:ej] * Q[:, aj:ej]
                oc[:, ai:ei] += np.einsum("bthk,bshk,bshv->bthv", qt, kt, vc[:, aj:ej])
                M = M * G[j]
            oc[:, ai:ei] += np.einsum("bhts,bshv->bthv", Wd[i], vc[:, ai:ei])
        # 5. state: S = A_end * S + (k * D)^T v
        S = A[:, -1, :, :, None] * S + np.einsum("bshk,bshv->bhkv", kc * D, vc)
        o[:, c0:c0 + C] = oc
    return o, S


def _suffix_exclusive(x):
    """y[s] = prod_{s < r < len} x[r] along axis 1."""
    y = np.ones_like(x)
    y[:, :-1] = np.cumprod(x[:, :0:-1], axis=1)[:, ::-1]
    return y
