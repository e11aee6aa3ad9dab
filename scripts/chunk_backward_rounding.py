"""Design check for the chunked backward's tensor-core products (an experiment, not shipped code):
which of them may split their float32 operands in two bfloat16 terms, not three, for bfloat16
inputs, within the accuracy contract (each gradient's error against the float64 loop at most 2x
the float32 loop's, its output rounded to its dtype, plus 1e-6 max|ref|).

scripts/chunk_backward_exact.py's algorithm, one sequence-head, in float32; the products that
gda_chunk_bwd runs on the tensor cores get their operands rounded (scripts/chunk_operand_rounding
.matmul: "bf16x3" the shipped split, "bf16x2" two terms), by group:
    state  (k D)^T v and (q A)^T scale do: the chunk states S0 and E (the scan)
    rows   scale do S0^T and v E^T (dq, dk, and the gate's T3, T2)
    dv     (k D) E and W^T scale do (dv alone)
M = scale v do^T is exact in any form (bfloat16 inputs); W and the intra-chunk sums stay float32
(their tensor-core blocks are not modelled). dq, dk, dv are rounded to bfloat16 at the end, dg
(float32 gates) and dh0 stay float32.

    python -m scripts.chunk_backward_rounding
"""
import numpy as np

from cupy_gda import _verify
from cupy_gda._verify import Case
from scripts.chunk_backward_exact import _pairs
from scripts.chunk_exact import _suffix_exclusive
from scripts.chunk_operand_rounding import BF16, matmul


def chunk_backward(q, k, v, g, do, h0, dht, spec, scale=1.0, BT=64):
    """q, k, g [T, K]; v, do [T, V]; h0, dht [K, V] -> (dq, dk, dv, dg, dh0) in float32, the
    products of each group rounded per ``spec`` {group: rounding}; v and do exact."""
    f32 = np.float32
    q, k, g, v, do = (x.astype(f32) for x in (q, k, g, v, do))
    T, K = q.shape
    starts = list(range(0, T, BT))
    S, S0s = h0.astype(f32), []
    for c0 in starts:
        gc, kc, vc = (x[None, c0:c0 + BT, None] for x in (g, k, v))   # [1, C, 1, *]
        D = _suffix_exclusive(gc)[0, :, 0]
        S0s.append(S)
        S = np.prod(gc[0, :, 0], axis=0)[:, None] * S + matmul((kc[0, :, 0] * D).T, vc[0, :, 0],
                                                              spec["state"], b_exact=True)
    dq, dk, dg = (np.zeros((T, K), f32) for _ in range(3))
    dv = np.zeros_like(v)
    E = dht.astype(f32)
    for c0, S0 in zip(reversed(starts), reversed(S0s)):
        qc, kc, gc = (x[c0:c0 + BT] for x in (q, k, g))
        vc, doc = v[c0:c0 + BT], (scale * do[c0:c0 + BT]).astype(f32)
        C = qc.shape[0]
        A = np.cumprod(gc, axis=0)
        Aex = np.concatenate([np.ones_like(gc[:1]), A[:-1]])
        Dx = _suffix_exclusive(gc[None, :, None])[0, :, 0]
        pair = _pairs(gc[None, :, None])[0, :, :, 0]                   # [s, t, K]: P(s+1..t)
        M = (vc @ doc.T).astype(f32)                                   # [s, u], exact products
        S0do = matmul(doc, S0.T, spec["rows"], a_exact=True)           # [u, K]
        Ev = matmul(vc, E.T, spec["rows"], a_exact=True)               # [s, K]
        W = np.einsum("suk,uk,sk->su", pair, qc, kc).astype(f32)       # [s, u], s <= u
        sl = slice(c0, c0 + C)
        dq[sl] = A * S0do + np.einsum("stk,sk,st->tk", pair, kc, M)
        dk[sl] = np.einsum("suk,uk,su->sk", pair, qc, M) + Dx * Ev
        dv[sl] = (matmul(Dx * kc, E, spec["dv"]) + matmul(W, doc, spec["dv"], b_exact=True))
        T1 = Aex * Dx * np.einsum("kv,kv->k", E, S0)[None]
        Y2 = np.einsum("stk,sk->tk", pair, kc * Ev)
        R = np.concatenate([np.zeros_like(Y2[:1]), Y2[:-1]])
        T3 = Aex * np.einsum("tuk,uk->tk", pair, qc * S0do)
        Y4 = np.einsum("stk,sk,su->tuk", pair, kc, M)
        Z = np.concatenate([np.zeros_like(Y4[:1]), Y4[:-1]])
        T4 = np.einsum("tuk,uk,tuk->tk", pair, qc, Z)
        dg[sl] = T1 + Dx * R + T3 + T4
        E = A[-1][:, None] * E + matmul((qc * A).T, doc, spec["state"], b_exact=True)
    return dq, dk, dv, dg, E


SPECS = {"shipped (x3 x3 x3)": dict(state="bf16x3", rows="bf16x3", dv="bf16x3"),
         "dv x2": dict(state="bf16x3", rows="bf16x3", dv="bf16x2"),
         "rows x2": dict(state="bf16x3", rows="bf16x2", dv="bf16x3"),
         "rows, dv x2": dict(state="bf16x3", rows="bf16x2", dv="bf16x2"),
         "state x2": dict(state="bf16x2", rows="bf16x3", dv="bf16x3"),
         "all x2": dict(state="bf16x2", rows="bf16x2", dv="bf16x2")}
NAMES = ("dq", "dk", "dv", "dgate", "dinitial_state")


def run(case, seed=0, specs=SPECS):
    """{spec name: [err / bound of each gradient]} on the first sequence-head of ``case``."""
    args = _verify.make_inputs(case, seed)
    do, dht = _verify.backward_inputs(case, args, seed)
    ref, emu = _verify.backward_references(case, args, do, dht)
    q, k, v, g, d = (np.asarray(x[0, :, 0], np.float32)
                     for x in (args["q"], args["k"], args["v"], args["gate"], do))
    out = {}
    for name, spec in specs.items():
        got = chunk_backward(q, k, v, g, d, args["initial_state"][0, 0], dht[0, 0], spec)
        got = [x.astype(BF16).astype(np.float32) if i < 3 else x for i, x in enumerate(got)]
        rows = []
        for i, (n, x) in enumerate(zip(NAMES, got)):
            r, e = (np.asarray(getattr(y, n)) for y in (ref, emu))
            r, e = (y[0, 0] if i == 4 else y[0, :, 0] for y in (r, e))
            c = _verify.compare(n, x, r, e)
            rows.append(c.err / c.bound)
        out[name] = rows
    return out


def main():
    for gate, T in (("logsig", 512), ("logsig", 2048), ("unif", 512), ("zeros", 512),
                    ("grow", 512), ("tiny", 512), ("ones", 512)):
        case = Case(1, T, 1, 64, 64, dtype="bfloat16", gate=gate, g_dtype="float32")
        print(f"{case.id}: error / bound of {', '.join(NAMES)} (<= 1 meets the contract)",
              flush=True)
        for name, rows in run(case).items():
            print(f"   {name:20s} " + "  ".join(f"{x:7.3f}" for x in rows), flush=True)


if __name__ == "__main__":
    main()
