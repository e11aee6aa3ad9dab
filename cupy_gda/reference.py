"""NumPy implementations of the gated linear-attention recurrence. Imports no CuPy.

For each sequence n (batch row, or packed segment of ``cu_seqlens``) and head h, t = 1..T::

    S_t = diag(g_t) · S_{t-1} + k_t v_tᵀ        S_0 = initial_state[n, h] or 0     (S is [K, V])
    o_t = scale · S_tᵀ q_t

Shape legend::

    q, k, gate / log_gate   [B, T, H, K]
    v, o                    [B, T, H, V]
    initial / final state   [N, H, K, V]     N = B, or len(cu_seqlens) - 1 (then B = 1)

``gate`` is multiplicative (any real value: 0 is a reset, negative flips the state's sign);
``log_gate`` is fla's ``g`` (gate = exp(log_gate), -inf means 0).

- :func:`gated_attention_ref` is the contract: a plain loop over t, float64 by default.
- :func:`gated_attention_chunked` is the CPU fast path: the same function in chunks of ``BT``
  steps, each in the five numbered stages of the GPU's chunked kernel (kernels/gda_chunk_fwd.cu):
  1 load, 2 scores, 3 decays, 4 output, 5 state. Only products of gates are formed (never
  quotients or logs), so gates of exactly 0, negative or tiny gates stay exact.
- :func:`gated_attention_step_ref` is the one-token decode form (updates ``state`` in place).

NaN and inf in the inputs propagate exactly as the arithmetic above says (a NaN in k_t poisons
S from step t on; a gate of 0 after it does *not* clear it, since 0 · NaN = NaN).
"""
import numpy as np

from cupy_gda import _checks

__all__ = ["gated_attention_ref", "gated_attention_chunked", "gated_attention_step_ref"]


def _segments(p, cu_seqlens):
    """(n, bos, eos) of each sequence in the flattened [B*T] row space."""
    if cu_seqlens is None:
        return [(n, n * p.T, (n + 1) * p.T) for n in range(p.B)]
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    return [(n, int(cu[n]), int(cu[n + 1])) for n in range(p.N)]


def _prepare(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens, dtype):
    """Validate, then return the problem and [B*T, H, *] arrays in the compute dtype."""
    p = _checks.check_forward(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens, cpu=True)
    if p.N and cu_seqlens is not None:
        _checks.check_cu_seqlens_values(fn, np.asarray(cu_seqlens), p.T)
    dt = np.dtype(dtype) if dtype is not None else p.cpu_dtype
    rows = p.B * p.T

    def flat(x, d):
        return np.asarray(x).astype(dt, copy=False).reshape(rows, p.H, d)

    g = flat(gate, p.K) if gate is not None else np.exp(flat(log_gate, p.K))
    h0 = None if initial_state is None else np.asarray(initial_state).astype(dt)
    return p, dt, flat(q, p.K), flat(k, p.K), flat(v, p.V), g, h0


def _finish(p, o, ht, output_final_state):
    o = o.reshape(p.B, p.T, p.H, p.V)
    return (o, ht) if output_final_state else o


def gated_attention_ref(q, k, v, gate=None, *, log_gate=None, scale=1.0, initial_state=None,
                        output_final_state=False, cu_seqlens=None, method="auto",
                        dtype=np.float64):
    """The contract: a plain loop over t in ``dtype`` (float64 by default; float32 gives the
    "same computation in float32 NumPy" that accuracy bounds are measured against).

    Same signature as :func:`cupy_gda.gated_attention` (``method`` is accepted and ignored).
    Returns o [B, T, H, V] (and the final state [N, H, K, V]) in ``dtype``.
    """
    fn = "gated_attention_ref"
    p, dt, q, k, v, g, h0 = _prepare(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens, dtype)
    scale = dt.type(scale)
    o = np.empty((p.B * p.T, p.H, p.V), dt)
    ht = np.zeros((p.N, p.H, p.K, p.V), dt)
    for n, bos, eos in _segments(p, cu_seqlens):
        S = np.zeros((p.H, p.K, p.V), dt) if h0 is None else h0[n].copy()
        for t in range(bos, eos):
            S = g[t][:, :, None] * S + k[t][:, :, None] * v[t][:, None, :]
            o[t] = scale * np.matmul(q[t][:, None, :], S)[:, 0, :]
        ht[n] = S
    return _finish(p, o, ht, output_final_state)


def gated_attention_chunked(q, k, v, gate=None, *, log_gate=None, scale=1.0, initial_state=None,
                            output_final_state=False, cu_seqlens=None, method="auto",
                            dtype=None, BT=32):
    """CPU fast path: the recurrence in chunks of ``BT`` steps, five numbered stages per chunk.

    Math in float64 for float64 inputs, else float32 (``dtype`` overrides). Output in ``dtype``
    too; :func:`cupy_gda.gated_attention` casts it to v's dtype.
    """
    fn = "gated_attention_chunked"
    p, dt, q, k, v, g, h0 = _prepare(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens, dtype)
    o = np.empty((p.B * p.T, p.H, p.V), dt)
    ht = np.zeros((p.N, p.H, p.K, p.V), dt)
    segs = _segments(p, cu_seqlens)
    if cu_seqlens is None:  # all sequences have length T: run them as one batch
        groups = [(list(range(p.B)), [s[1] for s in segs], p.T)]
    else:
        groups = [([n], [bos], eos - bos) for n, bos, eos in segs]
    for ns, starts, L in groups:
        rows = np.asarray(starts)[:, None] + np.arange(L)[None, :]          # [b, L]
        S = np.zeros((len(ns), p.H, p.K, p.V), dt) if h0 is None else h0[ns].copy()
        ob, S = _chunked_core(q[rows], k[rows], v[rows], g[rows], S, dt.type(scale), BT)
        o[rows] = ob
        ht[ns] = S
    return _finish(p, o, ht, output_final_state)


def _chunked_core(q, k, v, g, S, scale, BT):
    """q, k, g [b, L, H, K]; v [b, L, H, V]; S [b, H, K, V] (updated). Returns (o, S)."""
    b, L, H, K = q.shape
    o = np.empty(v.shape, q.dtype)
    s_i, t_i = np.arange(BT)[:, None], np.arange(BT)[None, :]
    later, upper = t_i > s_i, t_i >= s_i                                   # [s, t] masks
    for c0 in range(0, L, BT):
        C = min(BT, L - c0)
        # 1. load the chunk
        qc, kc, vc, gc = (x[:, c0:c0 + C] for x in (q, k, v, g))
        # 2. scores: W[t, s] = sum_k q_t k_s D[s, t], D[s, t] = prod_{s < r <= t} g_r (0 for t < s)
        steps = np.where(later[:C, :C, None, None], gc[:, None], 1)       # [b, s, t, H, K]
        D = np.where(upper[:C, :C, None, None], np.cumprod(steps, axis=2), 0)
        W = np.einsum("bthk,bsthk,bshk->bhts", qc, D, kc)
        W = np.where(upper[:C, :C].T, W, 0)        # s > t: no term at all (0 * NaN is NaN)
        # 3. decays: A[t] = prod_{r <= t} g_r, and D[s, end] (the product after s to the end)
        A = np.cumprod(gc, axis=1)                                         # [b, t, H, K]
        # 4. output: o_t = scale (sum_{s <= t} W[t, s] v_s + (q_t ⊙ A_t)ᵀ S_{chunk start})
        if np.isfinite(vc).all():
            o_c = np.einsum("bhts,bshv->bthv", W, vc)
        else:   # a non-finite v_s must not reach o_t, t < s, through W's zeros (0 * NaN)
            o_c = np.stack([np.einsum("bhs,bshv->bhv", W[:, :, t, :t + 1], vc[:, :t + 1])
                            for t in range(C)], axis=1)
        o_c += np.einsum("bthk,bhkv->bthv", qc * A, S)
        o[:, c0:c0 + C] = scale * o_c
        # 5. state: S = diag(A_end) S + sum_s diag(D[s, end]) k_s v_sᵀ
        S = A[:, -1, :, :, None] * S + np.einsum("bshk,bshv->bhkv", kc * D[:, :, -1], vc)
    return o, S


def gated_attention_step_ref(q, k, v, gate=None, *, log_gate=None, state, scale=1.0,
                             state_indices=None, dtype=np.float64):
    """One token per sequence. q, k, gate [B, H, K]; v [B, H, V]; state [N, H, K, V].

    Updates ``state`` (a NumPy array) in place at rows ``state_indices`` (default 0..B-1),
    computed in ``dtype``; returns o [B, H, V] in ``dtype``.
    """
    fn = "gated_attention_step_ref"
    p = _checks.check_step(fn, q, k, v, gate, log_gate, state, state_indices, cpu=True)
    idx = np.arange(p.B) if state_indices is None else np.asarray(state_indices, np.int64)
    _checks.check_state_indices_values(fn, idx, p.N)
    dt = np.dtype(dtype)
    g = np.asarray(gate, dt) if gate is not None else np.exp(np.asarray(log_gate, dt))
    S = g[..., None] * state[idx].astype(dt) + np.asarray(k, dt)[..., None] * np.asarray(v, dt)[:, :, None, :]
    o = dt.type(scale) * np.matmul(np.asarray(q, dt)[:, :, None, :], S)[:, :, 0, :]
    state[idx] = S
    return o
