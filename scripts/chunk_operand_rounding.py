"""Design check for half-input tensor-core paths (an experiment, not shipped code): the error of
the chunked forward when the operands of each matmul are rounded as a tensor-core path would
round them, against the accuracy contract of cupy_gda (relative to the float64 loop: at most 2x
the error of the float32-math emulation with o rounded to the input dtype, plus 1e-6 max|ref|).

The algorithm is scripts/chunk_exact.py's (every decay a product of gates) in float32
arithmetic; only the operands of its matmuls are rounded, per product:
    out  (q*A) S and the scores' products, whose result goes to o only;
    state (k*D)^T v, which carries into the final state (compared at float32 accuracy).
Roundings: "f32" none; "tf32x3" a = hi + lo in TF32, hi*hi + hi*lo + lo*hi (what gda_chunk_fwd
does); "bf16" one bf16 rounding of each operand; "bf16x2" the operand that is not exact in bf16
split into two bf16 terms (v and the inputs are exact), both split when neither is;
"bf16x3" three bf16 terms (hi, mid, lo), the six products down to 2^-24.

    python -m scripts.chunk_operand_rounding
"""
import itertools

import numpy as np

from cupy_gda import _verify
from cupy_gda._verify import Case
from scripts.chunk_exact import _suffix_exclusive

try:
    import ml_dtypes
    BF16 = ml_dtypes.bfloat16
except ImportError:          # pragma: no cover - the venv has it (CuPy's bfloat16)
    BF16 = None


def _bf16(x):
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def _tf32(x):
    """Round to TF32 (10 mantissa bits), to nearest even."""
    b = np.asarray(x, np.float32).view(np.uint32)
    r = (b + 0x0FFF + ((b >> 13) & 1)) & np.uint32(0xFFFFE000)
    return np.where(np.isfinite(x), r.view(np.float32), x)


def _terms(x, rnd, n):
    """x as n terms of the rounding rnd, largest first."""
    out, rest = [], np.asarray(x, np.float32)
    for _ in range(n):
        t = rnd(rest)
        out.append(t)
        rest = (rest - t).astype(np.float32)
    return out


def matmul(a, b, spec, a_exact=False, b_exact=False):
    """einsum-free matmul of the last two axes, a [.., m, k] @ b [.., k, n], float32 accumulation,
    operands rounded per spec."""
    mm = lambda x, y: np.matmul(x.astype(np.float32), y.astype(np.float32))  # noqa: E731
    if spec == "f32":
        return mm(a, b)
    if spec == "tf32x3":
        ah, al = _terms(a, _tf32, 2)
        bh, bl = _terms(b, _tf32, 2)
        return mm(al, bh) + mm(ah, bl) + mm(ah, bh)
    if spec == "bf16":
        return mm(_bf16(a), _bf16(b))
    n = {"bf16x2": 2, "bf16x3": 3}[spec]
    at = [a.astype(np.float32)] if a_exact else _terms(a, _bf16, n)
    bt = [b.astype(np.float32)] if b_exact else _terms(b, _bf16, n)
    acc = np.zeros(a.shape[:-1] + b.shape[-1:], np.float32)
    for (i, x), (j, y) in itertools.product(enumerate(at), enumerate(bt)):
        if i + j < n:        # the terms down to the last one's order
            acc = acc + mm(x, y)
    return acc


def chunk_forward(q, k, v, g, h0, out_spec, state_spec, v_exact, BT=64, BS=16):
    """scripts/chunk_exact.py's algorithm (its stages in its order of sums), float32, matmul operands rounded: q, k, g [T, K],
    v [T, V] of one sequence-head; ``v_exact``: v needs no split (bf16 inputs). Returns (o, S)."""
    T, K = q.shape
    S = h0.astype(np.float32)
    o = np.empty((T, v.shape[1]), np.float32)
    for c0 in range(0, T, BT):
        qc, kc, vc, gc = (x[c0:c0 + BT].astype(np.float32) for x in (q, k, v, g))
        C = qc.shape[0]
        A = np.cumprod(gc, axis=0)
        D = np.ones_like(gc)
        D[:-1] = np.cumprod(gc[:0:-1], axis=0)[::-1]
        subs = [(a, min(a + BS, C)) for a in range(0, C, BS)]
        P = np.concatenate([np.cumprod(gc[a:e], axis=0) for a, e in subs])
        Q = np.concatenate([_suffix_exclusive(gc[None, a:e])[0] for a, e in subs])
        G = [np.prod(gc[a:e], axis=0) for a, e in subs]
        oc = matmul(qc * A, S, out_spec)                                      # (q*A) S
        for i, (ai, ei) in enumerate(subs):
            M = np.ones_like(G[0])
            for j in range(i - 1, -1, -1):
                aj, ej = subs[j]
                qt = qc[ai:ei] * P[ai:ei] * M
                kt = kc[aj:ej] * Q[aj:ej]
                w = matmul(qt, kt.T, out_spec)                                # scores
                oc[ai:ei] += matmul(w, vc[aj:ej], out_spec, b_exact=v_exact)  # scores v
                M = M * G[j]
            gi, n = gc[ai:ei], ei - ai
            later = np.arange(n)[None, :] > np.arange(n)[:, None]
            pair = np.cumprod(np.where(later[:, :, None], gi[None], 1), axis=1)   # [s, t, K]
            W = np.einsum("tk,stk,sk->ts", qc[ai:ei], pair, kc[ai:ei]).astype(np.float32)
            W = np.where(np.tril(np.ones((n, n), bool)), W, 0).astype(np.float32)  # fp32, exact
            oc[ai:ei] += matmul(W, vc[ai:ei], out_spec, b_exact=v_exact)      # diagonal W v
        S = A[-1][:, None] * S + matmul((kc * D).T, vc, state_spec, b_exact=v_exact)
        o[c0:c0 + C] = oc
    return o, S


SCHEMES = (("f32", "f32"), ("tf32x3", "tf32x3"), ("bf16", "tf32x3"), ("bf16x2", "tf32x3"),
           ("bf16x3", "tf32x3"), ("bf16x2", "bf16x2"), ("bf16", "bf16x3"), ("bf16", "bf16x2"),
           ("bf16", "bf16"))


def run(case, seed=0, schemes=SCHEMES):
    """(scheme, o err / bound, state err / bound) for each of ``schemes`` on one sequence-head."""
    args = _verify.make_inputs(case, seed)
    (o_ref, s_ref), (o_emu, s_emu) = _verify.references(case, args)
    q, k, v = (args[n][0, :, 0].astype(np.float32) for n in ("q", "k", "v"))
    g = args["gate"][0, :, 0].astype(np.float32)
    h0 = args["initial_state"][0, 0]
    rows = []
    for out_spec, state_spec in schemes:
        o, S = chunk_forward(q, k, v, g, h0, out_spec, state_spec, case.dtype == "bfloat16")
        o = o.astype(BF16 if case.dtype == "bfloat16" else np.float32)
        ro = _verify.compare("o", o, o_ref[0, :, 0], o_emu[0, :, 0])
        rs = _verify.compare("state", S, s_ref[0, 0], s_emu[0, 0])
        rows.append((f"{out_spec}/{state_spec}", ro.err / ro.bound, rs.err / rs.bound))
    return rows


def main():
    for dtype, gate, T in (("bfloat16", "logsig", 512), ("bfloat16", "logsig", 4096),
                           ("bfloat16", "unif", 512), ("bfloat16", "zeros", 512),
                           ("bfloat16", "grow", 512), ("float32", "logsig", 512),
                           ("float32", "unif", 512)):
        case = Case(1, T, 1, 128, 128, dtype=dtype, gate=gate)
        print(f"{case.id}: error / bound (<= 1 meets the contract), o then the final state")
        for name, ro, rs in run(case):
            print(f"   out/state {name:16s} o {ro:7.3f}   state {rs:9.3f}")


if __name__ == "__main__":
    main()
