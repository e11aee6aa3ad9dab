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
- :func:`gated_attention_recurrent` is the CPU path of method "recurrent" and "auto": the same
  loop, every sequence at once (the fastest CPU form measured: docs/perf-notes.md, "CPU paths").
- :func:`gated_attention_chunked` is the CPU path of method "chunk": the same function in chunks
  of ``BT`` steps, each in the five numbered stages of the GPU's chunked kernel
  (kernels/gda_chunk_fwd.cu): 1 load, 2 scores, 3 decays, 4 output, 5 state. Only products of
  gates are formed (never quotients or logs), so gates of exactly 0, negative or tiny gates stay
  exact; a chunk whose inputs are not all finite, or whose gate products leave the float range
  (a result that is not finite), is run by the loop instead, so every method gives the loop's
  result there.
- :func:`gated_attention_step_ref` is the one-token decode form (updates ``state`` in place).
- :func:`gated_attention_backward_ref` is the gradients' contract: the reverse loop, float64.
  :func:`gated_attention_backward_recurrent` is the same loop over every sequence at once,
  recomputing each chunk's states from its boundary state (memory O(N·H·K·V·T/C)).

Gradients: with G_t the whole gradient reaching S_t (G_T = scale·q_T do_Tᵀ + d_final_state,
G_t = scale·q_t do_tᵀ + diag(g_{t+1}) G_{t+1}): dq_t = scale·S_t do_t, dk_t = G_t v_t,
dv_t = G_tᵀ k_t, dgate_t = rowsum(G_t ⊙ S_{t-1}), dlog_gate_t = gate_t ⊙ dgate_t,
dinitial_state = diag(g_1) G_1. No division and no difference of logs, so gates of exactly 0
(log gate -inf: its gradient is exactly 0), negative, tiny or above 1 stay exact.

NaN and inf in the inputs propagate exactly as the arithmetic above says (a NaN in k_t poisons
S from step t on; a gate of 0 after it does *not* clear it, since 0 · NaN = NaN); NumPy's
floating-point warnings are not raised for them (they are results, not errors).
"""
from typing import NamedTuple, Optional

import numpy as np

from cupy_gda import _checks

__all__ = ["gated_attention_ref", "gated_attention_recurrent", "gated_attention_chunked",
           "gated_attention_step_ref", "gated_attention_backward_ref",
           "gated_attention_backward_recurrent", "Gradients"]
_QUIET = dict(over="ignore", under="ignore", invalid="ignore", divide="ignore")
STATE_BYTES = 1 << 20       # gated_attention_recurrent: the states of a group of sequences it
                            #   advances together (docs/perf-notes.md, "CPU paths")


def _segments(p, cu_seqlens):
    """(n, bos, eos) of each sequence in the flattened [B*T] row space."""
    if cu_seqlens is None:
        return [(n, n * p.T, (n + 1) * p.T) for n in range(p.B)]
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    return [(n, int(cu[n]), int(cu[n + 1])) for n in range(p.N)]


def _check_numpy(fn, scale, dtype, **arrays):
    """The reference's own arguments: NumPy arrays (or None), a real scale, a float dtype.
    Returns scale as a float."""
    for name, x in arrays.items():
        if x is not None and not isinstance(x, np.ndarray):
            raise TypeError(f"{fn}: {name} must be a NumPy array, got {type(x).__module__}."
                            f"{type(x).__name__} (cupy_gda.gated_attention takes the others)")
    if dtype is not None and np.dtype(dtype) not in (np.float32, np.float64):
        raise TypeError(f"{fn}: dtype must be float32 or float64 (the math's precision), "
                        f"got {np.dtype(dtype).name}")
    return _checks.check_scale(fn, scale)


def _prepare(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens, dtype, scale):
    """Validate, then return the problem, compute dtype, scale in it and [B*T, H, *] arrays."""
    scale = _check_numpy(fn, scale, dtype, q=q, k=k, v=v, gate=gate, log_gate=log_gate,
                         initial_state=initial_state, cu_seqlens=cu_seqlens)
    p = _checks.check_forward(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens, cpu=True)
    if p.N and cu_seqlens is not None:
        _checks.check_cu_seqlens_values(fn, np.asarray(cu_seqlens), p.T)
    dt = np.dtype(dtype) if dtype is not None else p.cpu_dtype
    rows = p.B * p.T

    def flat(x, d):
        return np.asarray(x).astype(dt, copy=False).reshape(rows, p.H, d)

    with np.errstate(**_QUIET):
        g = flat(gate, p.K) if gate is not None else np.exp(flat(log_gate, p.K))
    h0 = None if initial_state is None else np.asarray(initial_state).astype(dt)
    return p, dt, dt.type(scale), flat(q, p.K), flat(k, p.K), flat(v, p.V), g, h0


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
    p, dt, scale, q, k, v, g, h0 = _prepare(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens,
                                            dtype, scale)
    o = np.empty((p.B * p.T, p.H, p.V), dt)
    ht = np.zeros((p.N, p.H, p.K, p.V), dt)
    with np.errstate(**_QUIET):
        for n, bos, eos in _segments(p, cu_seqlens):
            S = np.zeros((p.H, p.K, p.V), dt) if h0 is None else h0[n].copy()
            for t in range(bos, eos):
                S = g[t][:, :, None] * S + k[t][:, :, None] * v[t][:, None, :]
                o[t] = scale * np.matmul(q[t][:, None, :], S)[:, 0, :]
            ht[n] = S
    return _finish(p, o, ht, output_final_state)


def gated_attention_recurrent(q, k, v, gate=None, *, log_gate=None, scale=1.0, initial_state=None,
                              output_final_state=False, cu_seqlens=None, method="auto",
                              dtype=None):
    """CPU path of method "recurrent" (and "auto"): gated_attention_ref's loop, advancing a group
    of sequences at each step at once (as many as keep their states within STATE_BYTES, which
    stay in the CPU's cache; the longest first, so that at step t the sequences longer than t
    are a prefix). The same operations per element as the contract.

    Math in float64 for float64 inputs, else float32 (``dtype`` overrides); output in ``dtype``.
    """
    fn = "gated_attention_recurrent"
    p, dt, scale, q, k, v, g, h0 = _prepare(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens,
                                            dtype, scale)
    o = np.empty((p.B * p.T, p.H, p.V), dt)
    ht = np.zeros((p.N, p.H, p.K, p.V), dt)
    per = max(1, STATE_BYTES // max(1, p.H * p.K * p.V * dt.itemsize))
    if cu_seqlens is None:                  # B sequences of T steps: time-major views, no copies
        x4 = [x.reshape(p.B, p.T, p.H, x.shape[-1]) for x in (q, k, v, g, o)]
        for i in range(0, p.B, per):
            ns = list(range(i, min(i + per, p.B)))
            S = np.zeros((len(ns), p.H, p.K, p.V), dt) if h0 is None else h0[ns].astype(dt)
            with np.errstate(**_QUIET):
                ob = _loop_core(*(x[i:i + per].swapaxes(0, 1) for x in x4[:4]), S, scale,
                                np.full(len(ns), p.T))
            x4[4][i:i + per] = ob.swapaxes(0, 1)
            ht[ns] = S
        return _finish(p, o, ht, output_final_state)
    for group, ns, lens, rows in _groups(p, cu_seqlens, per):
        S = np.zeros((len(ns), p.H, p.K, p.V), dt) if h0 is None else h0[ns].astype(dt)
        with np.errstate(**_QUIET):
            ob = _loop_core(q[rows], k[rows], v[rows], g[rows], S, scale, lens)
        for j, (n, bos, eos) in enumerate(group):
            o[bos:eos] = ob[:eos - bos, j]
        ht[ns] = S
    return _finish(p, o, ht, output_final_state)


def _groups(p, cu_seqlens, per):
    """The sequences in groups of ``per``, the longest first (so that at step t the sequences
    longer than t are a prefix): (group [(n, bos, eos)], ns, lens, rows [L, b]: each step's row
    of each sequence, time-major; past a sequence's end its last row, never used)."""
    segs = sorted(_segments(p, cu_seqlens), key=lambda s: s[1] - s[2])
    for i in range(0, len(segs), per):
        group = segs[i:i + per]
        lens = np.array([eos - bos for _, bos, eos in group])
        rows = (np.array([bos for _, bos, _ in group])[None, :]
                + np.minimum(np.arange(int(lens[0]))[:, None], lens[None, :] - 1))
        yield group, [n for n, _, _ in group], lens, rows


def _active(lens, L):
    """For each step t < L, how many of the sequences of lengths ``lens`` (non-increasing) run it."""
    return np.count_nonzero(np.asarray(lens)[None, :] > np.arange(L)[:, None], axis=1).tolist()


def _loop_core(q, k, v, g, S, scale, lens):
    """The loop over t of gated_attention_ref for b sequences at once, time-major: q, k, g
    [L, b, H, K]; v [L, b, H, V]; S [b, H, K, V] (updated in place); lens [b], non-increasing
    (sequence j runs steps t < lens[j]; its rows after are not written). Returns o [L, b, H, V]."""
    L, b = q.shape[:2]
    o = np.empty(v.shape, q.dtype)
    active = _active(lens, L)
    for t in range(L):
        m = active[t]
        qt, kt, vt, gt, ot = q[t], k[t], v[t], g[t], o[t]
        Sm = S
        if m < b:
            qt, kt, vt, gt, ot, Sm = qt[:m], kt[:m], vt[:m], gt[:m], ot[:m], S[:m]
        Sm *= gt[..., None]
        Sm += kt[..., None] * vt[..., None, :]
        np.matmul(qt[..., None, :], Sm, out=ot[..., None, :])
    o *= scale
    return o


def gated_attention_chunked(q, k, v, gate=None, *, log_gate=None, scale=1.0, initial_state=None,
                            output_final_state=False, cu_seqlens=None, method="auto",
                            dtype=None, BT=32):
    """CPU fast path: the recurrence in chunks of ``BT`` steps, five numbered stages per chunk.

    Math in float64 for float64 inputs, else float32 (``dtype`` overrides). Output in ``dtype``
    too; :func:`cupy_gda.gated_attention` casts it to v's dtype.
    """
    fn = "gated_attention_chunked"
    p, dt, scale, q, k, v, g, h0 = _prepare(fn, q, k, v, gate, log_gate, initial_state, cu_seqlens,
                                            dtype, scale)
    o = np.empty((p.B * p.T, p.H, p.V), dt)
    ht = np.zeros((p.N, p.H, p.K, p.V), dt)
    segs = _segments(p, cu_seqlens)
    if cu_seqlens is None:  # all sequences have length T: run them as one batch
        groups = [(list(range(p.B)), [s[1] for s in segs], p.T)]
    else:
        groups = [([n], [bos], eos - bos) for n, bos, eos in segs]
    for ns, starts, L in groups:
        if not ns:                                  # B = 0
            continue
        rows = np.asarray(starts, np.int64)[:, None] + np.arange(L)[None, :]   # [b, L]
        S = np.zeros((len(ns), p.H, p.K, p.V), dt) if h0 is None else h0[ns].astype(dt)
        with np.errstate(**_QUIET):
            ob, S = _chunked_core(q[rows], k[rows], v[rows], g[rows], S, scale, BT)
        o[rows] = ob
        ht[ns] = S
    return _finish(p, o, ht, output_final_state)


def _chunked_core(q, k, v, g, S, scale, BT):
    """q, k, g [b, L, H, K]; v [b, L, H, V]; S [b, H, K, V]. Returns (o, S at the end). A chunk
    with an input that is not finite, or with a result that is not (gate products out of the
    float range: inf * 0 is NaN where the loop stays finite), is run by the loop instead."""
    b, L, H, K = q.shape
    o = np.empty(v.shape, q.dtype)
    s_i, t_i = np.arange(BT)[:, None], np.arange(BT)[None, :]
    later, upper = t_i > s_i, t_i >= s_i                                   # [s, t] masks
    for c0 in range(0, L, BT):
        C = min(BT, L - c0)
        # 1. load the chunk
        qc, kc, vc, gc = (x[:, c0:c0 + C] for x in (q, k, v, g))
        if all(np.isfinite(x).all() for x in (qc, kc, vc, gc)):
            o_c, S_c = _chunk(qc, kc, vc, gc, S, later[:C, :C], upper[:C, :C])
            if np.isfinite(o_c).all() and np.isfinite(S_c).all():
                o[:, c0:c0 + C] = scale * o_c
                S = S_c
                continue
        o[:, c0:c0 + C] = _loop_core(*(x.swapaxes(0, 1) for x in (qc, kc, vc, gc)), S, scale,
                                     np.full(b, C)).swapaxes(0, 1)            # S in place
    return o, S


def _chunk(qc, kc, vc, gc, S, later, upper):
    """Stages 2-5 of one chunk of C steps (finite inputs): (o / scale [b, C, H, V], the state at
    the chunk's end); ``later``, ``upper``: the [s, t] masks t > s, t >= s."""
    # 2. scores: W[t, s] = sum_k q_t k_s D[s, t], D[s, t] = prod_{s < r <= t} g_r (0 for t < s)
    steps = np.where(later[:, :, None, None], gc[:, None], 1)          # [b, s, t, H, K]
    D = np.where(upper[:, :, None, None], np.cumprod(steps, axis=2), 0)
    W = np.einsum("bthk,bsthk,bshk->bhts", qc, D, kc)
    W = np.where(upper.T, W, 0)                # s > t: no term at all
    # 3. decays: A[t] = prod_{r <= t} g_r, and D[s, end] (the product after s to the end)
    A = np.cumprod(gc, axis=1)                                         # [b, t, H, K]
    # 4. output: o_t / scale = sum_{s <= t} W[t, s] v_s + (q_t ⊙ A_t)ᵀ S_{chunk start}
    o_c = np.einsum("bhts,bshv->bthv", W, vc)
    o_c += np.einsum("bthk,bhkv->bthv", qc * A, S)
    # 5. state: S = diag(A_end) S + sum_s diag(D[s, end]) k_s v_sᵀ
    S = A[:, -1, :, :, None] * S + np.einsum("bshk,bshv->bhkv", kc * D[:, :, -1], vc)
    return o_c, S


def gated_attention_step_ref(q, k, v, gate=None, *, log_gate=None, state, scale=1.0,
                             state_indices=None, dtype=np.float64):
    """One token per sequence. q, k, gate [B, H, K]; v [B, H, V]; state [N, H, K, V].

    Updates ``state`` (a NumPy array) in place at rows ``state_indices`` (default 0..B-1),
    computed in ``dtype``; returns o [B, H, V] in ``dtype``.
    """
    fn = "gated_attention_step_ref"
    scale = _check_numpy(fn, scale, dtype, q=q, k=k, v=v, gate=gate, log_gate=log_gate, state=state,
                         state_indices=state_indices)
    p = _checks.check_step(fn, q, k, v, gate, log_gate, state, state_indices, cpu=True)
    idx = np.arange(p.B) if state_indices is None else np.asarray(state_indices, np.int64)
    _checks.check_state_indices_values(fn, idx, p.N)
    dt = np.dtype(dtype)
    with np.errstate(**_QUIET):
        g = np.asarray(gate, dt) if gate is not None else np.exp(np.asarray(log_gate, dt))
        S = g[..., None] * state[idx].astype(dt) + np.asarray(k, dt)[..., None] * np.asarray(v, dt)[:, :, None, :]
        o = dt.type(scale) * np.matmul(np.asarray(q, dt)[:, :, None, :], S)[:, :, 0, :]
    state[idx] = S
    return o


class Gradients(NamedTuple):
    """The gradients of a gated_attention call's loss: of q, k, v, of the gate argument it was
    given (gate or log_gate) and of initial_state (None where it was not given)."""
    dq: object
    dk: object
    dv: object
    dgate: object
    dinitial_state: Optional[object]


def _prepare_backward(fn, q, k, v, gate, log_gate, do, initial_state, d_final_state, cu_seqlens,
                      dtype, scale):
    """_prepare's arrays, and do [B*T, H, V] and d_final_state (or None) in the math dtype."""
    scale = _check_numpy(fn, scale, dtype, q=q, k=k, v=v, gate=gate, log_gate=log_gate, do=do,
                         initial_state=initial_state, d_final_state=d_final_state,
                         cu_seqlens=cu_seqlens)
    _checks.check_backward(fn, q, k, v, gate, log_gate, do, initial_state, d_final_state,
                           cu_seqlens, cpu=True)
    p, dt, scale, q, k, v, g, h0 = _prepare(fn, q, k, v, gate, log_gate, initial_state,
                                            cu_seqlens, dtype, scale)
    do = np.asarray(do).astype(dt, copy=False).reshape(p.B * p.T, p.H, p.V)
    dht = None if d_final_state is None else np.asarray(d_final_state).astype(dt)
    return p, dt, scale, q, k, v, g, h0, do, dht


def _gradient_buffers(p, dt):
    """Zeroed dq, dk [B*T, H, K], dv [B*T, H, V], dgate [B*T, H, K], dinitial_state [N, H, K, V]."""
    rows = p.B * p.T
    return (np.zeros((rows, p.H, p.K), dt), np.zeros((rows, p.H, p.K), dt),
            np.zeros((rows, p.H, p.V), dt), np.zeros((rows, p.H, p.K), dt),
            np.zeros((p.N, p.H, p.K, p.V), dt))


def _gradients(p, dq, dk, dv, dg, g, log_gate, dh0, initial_state):
    """Gradients in [B, T, H, *]; dgate of log_gate is gate ⊙ dgate (exactly 0 where gate is)."""
    if log_gate is not None:
        with np.errstate(**_QUIET):
            dg = np.where(g == 0, 0, g * dg)    # (0 * inf is no gradient: the loop never used it)
    shape = (p.B, p.T, p.H)
    return Gradients(dq.reshape(*shape, p.K), dk.reshape(*shape, p.K), dv.reshape(*shape, p.V),
                     dg.reshape(*shape, p.K), None if initial_state is None else dh0)


def gated_attention_backward_ref(q, k, v, gate=None, *, do, log_gate=None, scale=1.0,
                                 initial_state=None, d_final_state=None, cu_seqlens=None,
                                 method="auto", dtype=np.float64):
    """The gradients' contract: the forward loop keeping every state, then the reverse loop
    (module docstring), in ``dtype`` (float64 by default; float32 gives the "same computation
    in float32 NumPy" of the accuracy bounds). ``do`` is o's gradient, ``d_final_state`` the
    final state's (if the loss used it). ``method`` is accepted and ignored.

    Returns :class:`Gradients` in ``dtype``; dgate is of whichever gate argument was passed.
    """
    fn = "gated_attention_backward_ref"
    p, dt, scale, q, k, v, g, h0, do, dht = _prepare_backward(
        fn, q, k, v, gate, log_gate, do, initial_state, d_final_state, cu_seqlens, dtype, scale)
    dq, dk, dv, dg, dh0 = _gradient_buffers(p, dt)
    with np.errstate(**_QUIET):
        for n, bos, eos in _segments(p, cu_seqlens):
            S = [np.zeros((p.H, p.K, p.V), dt) if h0 is None else h0[n].copy()]
            for t in range(bos, eos):
                S.append(g[t][:, :, None] * S[-1] + k[t][:, :, None] * v[t][:, None, :])
            G = np.zeros((p.H, p.K, p.V), dt) if dht is None else dht[n].copy()
            for t in range(eos - 1, bos - 1, -1):
                G = G + scale * q[t][:, :, None] * do[t][:, None, :]
                dq[t] = scale * np.matmul(S[t - bos + 1], do[t][:, :, None])[:, :, 0]
                dk[t] = np.matmul(G, v[t][:, :, None])[:, :, 0]
                dv[t] = np.matmul(k[t][:, None, :], G)[:, 0, :]
                dg[t] = (G * S[t - bos]).sum(axis=2)
                G = g[t][:, :, None] * G
            dh0[n] = G
    return _gradients(p, dq, dk, dv, dg, g, log_gate, dh0, initial_state)


def gated_attention_backward_recurrent(q, k, v, gate=None, *, do, log_gate=None, scale=1.0,
                                       initial_state=None, d_final_state=None, cu_seqlens=None,
                                       method="auto", dtype=None, BT=64):
    """CPU gradients: gated_attention_backward_ref's loops over a group of sequences at once
    (as gated_attention_recurrent groups them), keeping only the state at every ``BT``-th step
    and recomputing a chunk's states from it in the reverse pass (the same operations, so the
    same states). Extra memory: the boundary states, N·H·K·V·(T/BT + BT + 1) floats.

    Math in float64 for float64 inputs, else float32 (``dtype`` overrides); output in ``dtype``.
    """
    fn = "gated_attention_backward_recurrent"
    p, dt, scale, q, k, v, g, h0, do, dht = _prepare_backward(
        fn, q, k, v, gate, log_gate, do, initial_state, d_final_state, cu_seqlens, dtype, scale)
    per = max(1, STATE_BYTES // max(1, p.H * p.K * p.V * dt.itemsize))
    grads = _backward_groups(p, dt, cu_seqlens, per, (q, k, v, g, scale * do), h0, dht,
                             lambda *x: _backward_core(*x, BT))
    return _gradients(p, *grads[:4], g, log_gate, grads[4], initial_state)


def _backward_groups(p, dt, cu_seqlens, per, inputs, h0, dht, core):
    """dq, dk, dv, dg [B*T, H, *] and dh0 [N, H, K, V] of the CPU backwards: ``core(q, k, v, g,
    do, S, G, lens)`` (_backward_core's arguments and returns, time-major) on the sequences in
    groups of ``per`` (_groups); ``inputs`` (q, k, v, g, do times scale) as rows [B*T, H, *]."""
    dq, dk, dv, dg, dh0 = _gradient_buffers(p, dt)
    for group, ns, lens, rows in _groups(p, cu_seqlens, per):
        S = np.zeros((len(ns), p.H, p.K, p.V), dt) if h0 is None else h0[ns].astype(dt)
        G = np.zeros_like(S) if dht is None else dht[ns].astype(dt)
        with np.errstate(**_QUIET):
            grads = core(*(x[rows] for x in inputs), S, G, lens)
        for x, dx in zip(grads, (dq, dk, dv, dg)):
            for j, (n, bos, eos) in enumerate(group):
                dx[bos:eos] = x[:eos - bos, j]
        dh0[ns] = G                             # (an empty sequence's: d_final_state's, as S_T = S_0)
    return dq, dk, dv, dg, dh0


# The chunked backward's range (as kernels/gda_chunk_bwd.cu's guard): inside it every product of
# its form stays within float32's range; a group of sequences outside it runs the loop instead
CHUNK_BWD_VAL_MAX, CHUNK_BWD_GATE_MAX, CHUNK_BWD_STATE_MAX = 2.0 ** 20, 2.0 ** 0.125, 2.0 ** 40
CHUNK_BWD_BYTES = 64 << 20  # gated_attention_backward_chunked: a group's chunk states, at most


def chunk_bwd_steps(K, V):
    """gated_attention_backward_chunked's default chunk length: 16 steps where K V >= 65536, else
    8 (the work inside a chunk grows as BT^2 K, its Python loops as BT; docs/perf-notes.md, v19)."""
    return 16 if K * V >= 65536 else 8


def gated_attention_backward_chunked(q, k, v, gate=None, *, do, log_gate=None, scale=1.0,
                                     initial_state=None, d_final_state=None, cu_seqlens=None,
                                     method="auto", dtype=None, BT=None):
    """CPU gradients in chunks of ``BT`` steps, vectorised over every chunk of a group of
    sequences at once: gda_chunk_bwd's form (its header; scripts/chunk_backward_exact.py),
    every decay a product of gates, the matmuls by NumPy's BLAS, and Python loops only over the
    steps of one chunk and over the chunks of the boundary scans. Where a group's inputs or
    chunk states leave the form's range (CHUNK_BWD_*: NaN, inf, |gate| > 2^(1/8), ...), that
    group runs the reverse loop (_backward_core) instead: the loop's gradients either way.
    Extra memory: two chunk states a chunk, N·H·K·V·2T/BT floats, in groups of CHUNK_BWD_BYTES.

    Math in float64 for float64 inputs, else float32 (``dtype`` overrides); output in ``dtype``.
    """
    fn = "gated_attention_backward_chunked"
    p, dt, scale, q, k, v, g, h0, do, dht = _prepare_backward(
        fn, q, k, v, gate, log_gate, do, initial_state, d_final_state, cu_seqlens, dtype, scale)
    BT = BT or chunk_bwd_steps(p.K, p.V)
    NC = max(1, -(-max((e - b for _, b, e in _segments(p, cu_seqlens)), default=0) // BT))
    per = max(1, CHUNK_BWD_BYTES // max(1, 2 * NC * p.H * p.K * p.V * dt.itemsize))

    def core(*x):                               # the loop where the group is outside the range
        grads = _backward_chunks(*x, BT)
        return _backward_core(*x, BT) if grads is None else grads

    grads = _backward_groups(p, dt, cu_seqlens, per, (q, k, v, g, scale * do), h0, dht, core)
    return _gradients(p, *grads[:4], g, log_gate, grads[4], initial_state)


def _backward_chunks(q, k, v, g, do, S, G, lens, BT):
    """_backward_core's gradients by the chunked form, or None where the group is outside its
    range (S and G then as they were). Time-major in and out: q, k, g [L, b, H, K], v and do
    (times scale) [L, b, H, V]; S, G [b, H, K, V] (G becomes dinitial_state)."""
    L, b, H, K = q.shape
    if L == 0:
        return tuple(np.zeros(x.shape, q.dtype) for x in (q, k, v, g))
    live = (np.arange(L)[:, None] < np.asarray(lens)[None, :])[..., None, None]
    if not (np.all(np.abs(g) <= CHUNK_BWD_GATE_MAX)
            and all(np.all(np.abs(x) <= CHUNK_BWD_VAL_MAX) for x in (q, k, v, do))
            and np.all(np.abs(S) <= CHUNK_BWD_STATE_MAX)
            and np.all(np.abs(G) <= CHUNK_BWD_STATE_MAX)):
        return None
    NC = -(-L // BT)

    def chunked(x, fill):       # [L, b, H, D] -> [b, H, NC, BT, D], rows past a sequence: fill
        y = np.full((NC * BT, b, H, x.shape[-1]), fill, q.dtype)
        y[:L] = np.where(live, x, fill)
        return y.reshape(NC, BT, b, H, x.shape[-1]).transpose(2, 3, 0, 1, 4)

    qc, kc, gc, vc, dc = (chunked(x, f) for x, f in ((q, 0), (k, 0), (g, 1), (v, 0), (do, 0)))
    A = np.cumprod(gc, axis=3)                                          # P(0..t)
    Aex = np.concatenate([np.ones_like(A[..., :1, :]), A[..., :-1, :]], axis=3)   # P(0..t-1)
    D = np.ones_like(gc)                                                # P(t+1..BT-1)
    D[..., :-1, :] = np.cumprod(gc[..., :0:-1, :], axis=3)[..., ::-1, :]
    kD = kc * D
    st = np.matmul(kD.swapaxes(-1, -2), vc)                            # [b, H, NC, K, V] local
    et = np.matmul((qc * A).swapaxes(-1, -2), dc)
    ae = A[..., -1, :, None]
    E = G
    for c in range(NC):                                                # S0, E in place
        st[:, :, c], S = S, ae[:, :, c] * S + st[:, :, c]
    for c in range(NC - 1, -1, -1):
        et[:, :, c], E = E, ae[:, :, c] * E + et[:, :, c]
    if not all(np.all(np.abs(x) <= CHUNK_BWD_STATE_MAX) for x in (st, et)):
        return None
    G[...] = E
    es = (et * st).sum(axis=-1)                                         # rowsum(E S0) [b, H, NC, K]
    M = np.matmul(vc, dc.swapaxes(-1, -2))                              # (do carries scale)
    sd = np.matmul(dc, st.swapaxes(-1, -2))                             # S0 do_t
    ev = np.matmul(vc, et.swapaxes(-1, -2))                             # E v_s
    W = np.zeros(M.shape, q.dtype)                                      # W[s, u], s <= u
    for s_ in range(BT):
        P = np.concatenate([np.ones_like(gc[..., :1, :]),            # P(s+1..u), u >= s
                            np.cumprod(gc[..., s_ + 1:, :], axis=3)], axis=3)
        W[..., s_, s_:] = np.matmul(P * qc[..., s_:, :], kc[..., s_, :, None])[..., 0]
    dvc = np.matmul(kD, et) + np.matmul(W, dc)
    R = np.zeros_like(qc)                                               # R_t, forward
    for t in range(1, BT):
        R[..., t, :] = gc[..., t - 1, :] * R[..., t - 1, :] + kc[..., t - 1, :] * ev[..., t - 1, :]
    X = np.zeros_like(qc)                                               # X_t[s], s <= t
    dqc, dkc, dgc = (np.zeros_like(qc) for _ in range(3))
    F = np.zeros_like(qc[..., 0, :])
    for t in range(BT - 1, -1, -1):
        gnext = gc[..., t + 1, :] if t + 1 < BT else np.ones_like(F)
        qt, gt = qc[..., t, :], gc[..., t, :]
        F = qt * sd[..., t, :] + gnext * F
        X[..., :t + 1, :] = (gnext[..., None, :] * X[..., :t + 1, :]
                             + qt[..., None, :] * M[..., :t + 1, t, None])
        wk = kc[..., :t, :] * _decay_to(gc, t)                         # P(s+1..t-1) k_s, s < t
        t4 = (wk * X[..., :t, :]).sum(axis=-2)
        aq = (wk * M[..., :t, t, None]).sum(axis=-2)
        dqc[..., t, :] = (Aex[..., t, :] * gt * sd[..., t, :] + kc[..., t, :] * M[..., t, t, None]
                          + gt * aq)
        dkc[..., t, :] = D[..., t, :] * ev[..., t, :] + X[..., t, :]
        dgc[..., t, :] = (Aex[..., t, :] * D[..., t, :] * es + D[..., t, :] * R[..., t, :]
                          + Aex[..., t, :] * F + t4)

    def rows(x):                # [b, H, NC, BT, D] -> [L, b, H, D]
        return x.transpose(2, 3, 0, 1, 4).reshape(NC * BT, b, H, x.shape[-1])[:L]

    return rows(dqc), rows(dkc), rows(dvc), rows(dgc)


def _decay_to(gc, t):
    """P(s+1..t-1) for s < t over axis 3 of gc [..., BT, K]: [..., t, K] (1 at s = t - 1)."""
    out = np.ones_like(gc[..., :t, :])
    if t > 1:
        out[..., :t - 1, :] = np.cumprod(gc[..., t - 1:0:-1, :], axis=3)[..., ::-1, :]
    return out


def _backward_core(q, k, v, g, do, S, G, lens, BT):
    """The reverse loop for b sequences at once, time-major: q, k, g [L, b, H, K]; v and do
    (times scale) [L, b, H, V]; S, G [b, H, K, V]: the initial state and d_final_state (G
    becomes dinitial_state, in place); lens [b] non-increasing. Returns dq, dk, dv, dg
    [L, b, H, *]. dq_t = S_t do_t comes with the forward pass; the reverse pass needs S_{t-1}
    only, recomputed a chunk at a time into one buffer, every update in place."""
    L = q.shape[0]
    active = _active(lens, L)
    dq, dk, dg = (np.zeros(q.shape, q.dtype) for _ in range(3))
    dv = np.zeros(v.shape, q.dtype)
    kv = np.empty_like(S)                       # k_t v_tᵀ, q_t do_tᵀ, G ⊙ S (scratch)
    states = np.empty((min(BT, L) + 1,) + S.shape, S.dtype)     # S before step t of a chunk

    def step(dst, src, t, m):                   # dst = S after step t from src, first m sequences
        np.multiply(src[:m], g[t, :m, ..., None], out=dst[:m])
        np.multiply(k[t, :m, ..., None], v[t, :m, ..., None, :], out=kv[:m])
        dst[:m] += kv[:m]

    starts = list(range(0, L, BT))
    bound = []                                  # the state at each chunk's first step
    for c0 in starts:
        bound.append(S.copy())
        for t in range(c0, min(L, c0 + BT)):
            m = active[t]
            step(S, S, t, m)
            np.matmul(S[:m], do[t, :m, ..., None], out=dq[t, :m, ..., None])
    for c0, S0 in zip(reversed(starts), reversed(bound)):
        c1 = min(L, c0 + BT)
        states[0] = S0                          # the chunk's states (its last one is never
        for t in range(c0, c1 - 1):             #   read, nor a row past active[t])
            step(states[t - c0 + 1], states[t - c0], t, active[t])
        for t in range(c1 - 1, c0 - 1, -1):
            m = active[t]
            Gm, Sp = G[:m], states[t - c0][:m]
            np.multiply(q[t, :m, ..., None], do[t, :m, ..., None, :], out=kv[:m])
            Gm += kv[:m]
            np.matmul(Gm, v[t, :m, ..., None], out=dk[t, :m, ..., None])
            np.matmul(k[t, :m, ..., None, :], Gm, out=dv[t, :m, ..., None, :])
            np.multiply(Gm, Sp, out=kv[:m])
            kv[:m].sum(axis=-1, out=dg[t, :m])
            Gm *= g[t, :m, ..., None]
    return dq, dk, dv, dg
