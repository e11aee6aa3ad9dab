"""Design check for a chunked backward (an experiment, not shipped code): the gradients of the GLA
recurrence a chunk of BT steps at a time, every decay a *product* of gates (never a quotient or
a difference of logs), the gate's own gradient included, so gates of exactly 0, negative, tiny
and above 1 stay exact, as in the reverse loop (reference.gated_attention_backward_ref).

Two passes over the chunks carry only boundary states: forward, S at each chunk's start (the
forward kernel's stage 5); backward, E = the gradient reaching the chunk's last state from
later steps (E = d_final_state at the end; after a chunk, E <- A_end E + (q A)^T (scale do),
A_t the chunk's gate products up to t). Given S0 (the chunk's start state) and E, everything
inside a chunk is independent of the other chunks, with

    P(a..b) = prod_{a <= r <= b} g_r  (1 when empty),  M[s, u] = scale * v_s . do_u,

    dq_t = scale * P(0..t) (S0 do_t) + sum_{s <= t} P(s+1..t) k_s M[s, t]
    dk_s = sum_{u >= s} P(s+1..u) q_u M[s, u] + P(s+1..C-1) (E v_s)
    dv_s = scale * sum_{u >= s} do_u (q_u P(s+1..u)) . k_s + E^T (P(s+1..C-1) k_s)
    dg_t = rowsum(dS_t (.) S_{t-1}) = T1 + T2 + T3 + T4:
      T1 = P(0..t-1) P(t+1..C-1) rowsum(E (.) S0)                     (every gate but t's)
      T2 = P(t+1..C-1) sum_{s < t} P(s+1..t-1) k_s (E v_s)           (a scan up the chunk)
      T3 = P(0..t-1) sum_{u >= t} P(t+1..u) q_u scale (S0 do_u)      (a scan down the chunk)
      T4 = sum_{s < t <= u} P(s+1..t-1) P(t+1..u) k_s q_u M[s, u]    (the products from s to u
                                                                       without step t)

The V-contractions (S0 do_t, E v_s, M, the boundary updates) are matmuls; the rest is gated
sums over one chunk. Here T4 is one einsum, O(C^3 K) a chunk; the shipped forms
(kernels/gda_chunk_bwd.cu, reference.gated_attention_backward_chunked) run it in O(C^2 K) as a
reverse scan of X_t[s] = sum_{u >= t} P(t+1..u) q_u M[s, u], which also gives dk's intra term
(X_t[t]); the forward's sub-blocks (products Q_j M_ji P_i between sub-blocks) would put its
cross-sub-block part on the tensor cores. No term divides by a gate, so a gate of 0 gives the
loop's finite gradients; fla's chunk mode takes dlog g from the identity dlog g_t = sum_{u >= t} (q_u dq_u -
k_u dk_u) instead, a difference of large sums, and has no dg for a multiplicative gate without
dividing by it.

See docs/perf-notes.md ("v18", "v19"); tests/test_chunk_design.py checks it against the reverse
loop.
"""
import numpy as np

from scripts.chunk_exact import _suffix_exclusive


def _pairs(gc):
    """[b, s, t, H, K]: P(s+1..t) for t >= s (1 at t = s), 0 for t < s."""
    C = gc.shape[1]
    s_i, t_i = np.arange(C)[:, None], np.arange(C)[None, :]
    later = (t_i > s_i)[None, :, :, None, None]
    upper = (t_i >= s_i)[None, :, :, None, None]
    return np.where(upper, np.cumprod(np.where(later, gc[:, None], 1), axis=2), 0)


def chunk_backward(q, k, v, g, do, h0=None, dht=None, scale=1.0, BT=64):
    """q, k, g [B, T, H, K]; v, do [B, T, H, V]; h0, dht [B, H, K, V] or None ->
    (dq, dk, dv, dg, dh0): dg of the multiplicative gate g (a log gate's: g dg, 0 where g is)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = q.dtype
    starts = list(range(0, T, BT))
    S = np.zeros((B, H, K, V), dt) if h0 is None else h0.astype(dt)
    S0s = []
    for c0 in starts:                     # the forward's chunk states (its stage 5)
        S0s.append(S)
        gc, kc, vc = (x[:, c0:c0 + BT] for x in (g, k, v))
        D = _suffix_exclusive(gc)
        S = np.cumprod(gc, axis=1)[:, -1, :, :, None] * S + np.einsum("bshk,bshv->bhkv", kc * D, vc)
    dq, dk, dg = (np.zeros((B, T, H, K), dt) for _ in range(3))
    dv = np.zeros((B, T, H, V), dt)
    E = np.zeros((B, H, K, V), dt) if dht is None else dht.astype(dt)
    for c0, S0 in zip(reversed(starts), reversed(S0s)):
        qc, kc, gc = (x[:, c0:c0 + BT] for x in (q, k, g))
        vc, doc = v[:, c0:c0 + BT], scale * do[:, c0:c0 + BT]
        C = qc.shape[1]
        A = np.cumprod(gc, axis=1)                                         # P(0..t)
        Aex = np.concatenate([np.ones_like(gc[:, :1]), A[:, :-1]], axis=1)  # P(0..t-1), a product
        Dx = _suffix_exclusive(gc)                                         # P(t+1..C-1)
        pair = _pairs(gc)                                                  # P(s+1..t)
        M = np.einsum("bshv,buhv->bhsu", vc, doc)
        S0do = np.einsum("bhkv,buhv->buhk", S0, doc)                       # S0 do_u (times scale)
        Ev = np.einsum("bhkv,bshv->bshk", E, vc)                           # E v_s
        sl = slice(c0, c0 + C)
        dq[:, sl] = A * S0do + np.einsum("bsthk,bshk,bhst->bthk", pair, kc, M)
        dk[:, sl] = np.einsum("bsuhk,buhk,bhsu->bshk", pair, qc, M) + Dx * Ev
        dv[:, sl] = (np.einsum("bsuhk,buhk,bshk,buhv->bshv", pair, qc, kc, doc)
                     + np.einsum("bhkv,bshk->bshv", E, Dx * kc))
        # the gate's: T1..T4 (module docstring); a shift by one step is "s < t" from "s <= t-1"
        T1 = Aex * Dx * np.einsum("bhkv,bhkv->bhk", E, S0)[:, None]
        Y2 = np.einsum("bsthk,bshk->bthk", pair, kc * Ev)                  # sum_{s <= t}
        R = np.concatenate([np.zeros_like(Y2[:, :1]), Y2[:, :-1]], axis=1)  # sum_{s < t}
        T3 = Aex * np.einsum("btuhk,buhk->bthk", pair, qc * S0do)
        Y4 = np.einsum("bsthk,bshk,bhsu->btuhk", pair, kc, M)             # sum_{s <= t}, per u
        Z = np.concatenate([np.zeros_like(Y4[:, :1]), Y4[:, :-1]], axis=1)  # sum_{s < t}
        T4 = np.einsum("btuhk,buhk,btuhk->bthk", pair, qc, Z)
        dg[:, sl] = T1 + Dx * R + T3 + T4
        E = A[:, -1, :, :, None] * E + np.einsum("buhk,buhv->bhkv", qc * A, doc)
    return dq, dk, dv, dg, E
