"""Launcher of gda_chunk_bwd (kernels/gda_chunk_bwd.cu): the gradients in chunks of BT steps, the
matmuls in cuBLAS float32 (no TF32), exact for every gate (the guarded fall back to the reverse
loop, recurrent_bwd, on the GPU itself). Sequences of T steps (no cu_seqlens), any K and V.

The pipeline of one call, all on the current stream, no host sync (NB = N H NC chunks):
  1. pack       q A, k D, A_end, v, do as float32 rows [NB][BT][*]; the guard on the inputs
  2. GEMMs      st = (k D)^T v, et = scale (q A)^T do                     (local states)
  3. states     st -> S0, et -> E chunk by chunk; rowsum(E S0); d_initial_state; the guard
  4. GEMMs      M = scale v do^T, sd = scale do S0^T, ev = v E^T
  5. scores     W (gated q.k scores of each chunk)
  6. intra      dq, dk, dg
  7. GEMMs      dv rows = (k D) E + scale W do;  dv: the rows to [B, T, H, V]
  8. the reverse loop (gda_recurrent_bwd), run only where the guard was hit, over everything
"""
import threading
from typing import NamedTuple

import numpy as np

from cupy_gda import recurrent_bwd
from cupy_gda._launch import (CHUNK_BACKWARD, DTYPE_CODE, Family, Launch, address, cached, empty,
                              np_dtype)

ENTRIES = ("gda_chunk_bwd_pack", "gda_chunk_bwd_states", "gda_chunk_bwd_scores",
           "gda_chunk_bwd_intra", "gda_chunk_bwd_dv")
FAMILY = Family("gda_chunk_bwd", ("common.cuh",), {e: CHUNK_BACKWARD for e in ENTRIES})

CHUNKS_64 = 1024         # chunks of 64 steps from which config picks them
NTP = 128                # the kernel's threads of pack, states and dv


class Config(NamedTuple):
    BT: int              # steps a chunk
    KT: int              # key columns a block of intra (its shared memory: BT^2 + 2 BT KT floats)


def config(p):
    """Chunks of 64 steps where K >= 128 and there are at least CHUNKS_64 of them (the chunk
    states and local-state GEMMs shrink with BT); else of 32 (the work inside a chunk, O(BT^2 K),
    shrinks, and more chunks fill the GPU): measured in docs/perf-notes.md, v19."""
    bt = 64 if p.K >= 128 and p.N * p.H * -(-p.T // 64) >= CHUNKS_64 else 32
    return Config(bt, 32 if p.K <= 32 else 64)


def refusal(p, varlen):
    """Why the chunked backward cannot run Problem ``p`` (completes "method 'chunk' ..."), or
    None."""
    if varlen:
        return "takes no cu_seqlens yet (the recurrent backward does)"
    return None


def defines(p, cfg):
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), BT=cfg.BT, KT=cfg.KT)


def workspace(p, cfg):
    """{name: floats} of the float32 workspaces, in order (the kernel's parameter names); qa's
    room is reused by sd and vp's by dv's rows, each written after the other's last read."""
    NB = p.N * p.H * -(-p.T // cfg.BT)
    C, K, V = cfg.BT, p.K, p.V
    return dict(st=NB * K * V, et=NB * K * V, qa=NB * C * K, kd=NB * C * K, vp=NB * C * V,
                dp=NB * C * V, ae=NB * K, es=NB * K, mm=NB * C * C, ww=NB * C * C, ev=NB * C * K,
                ar=2 * NB * C * K)


_TLS = threading.local()


def _cublas():
    """This thread's cuBLAS handle for the current device, its own (so no caller's math mode
    applies): CUBLAS_DEFAULT_MATH, under which sgemm never uses TF32."""
    from cupy.cuda import runtime
    from cupy_backends.cuda.libs import cublas
    handles = getattr(_TLS, "handles", None)
    if handles is None:
        handles = _TLS.handles = {}
    dev = runtime.getDevice()
    h = handles.get(dev)
    if h is None:
        h = handles[dev] = cublas.create()
        cublas.setMathMode(h, 0)            # CUBLAS_DEFAULT_MATH
    return cublas, h


class Gemm:
    """Row-major batched C[b] = alpha op(A[b]) op(B[b]) + beta C[b] over NB batches: op(A) is
    m x k (A stored k x m where ta), op(B) k x n (stored n x k where tb); cuBLAS sees the
    column-major transpose, C^T = op(B)^T op(A)^T."""

    def __init__(self, NB, m, n, k, ta=False, tb=False):
        self.NB, self.m, self.n, self.k, self.ta, self.tb = NB, m, n, k, ta, tb

    def __call__(self, c, a, b, alpha=1.0, beta=0.0):
        cublas, h = _cublas()
        from cupy.cuda import get_current_stream
        cublas.setStream(h, get_current_stream().ptr)
        m, n, k = self.m, self.n, self.k
        ab = np.array([alpha, beta], np.float32)
        lda, ldb = (m if self.ta else k), (k if self.tb else n)
        cublas.sgemmStridedBatched(
            h, int(self.tb), int(self.ta), n, m, k, ab.ctypes.data, b, ldb, k * n, a, lda, m * k,
            ab.ctypes.data + 4, c, n, m * n, self.NB)


class BackwardPlan:
    """gda_chunk_bwd compiled and sized for one Problem (no cu_seqlens) on the current device,
    with the reverse loop's plan as its guarded fall-back: a call allocates the gradients and one
    workspace (the larger of the two families') and queues every launch without a host sync."""

    def __init__(self, p, cfg=None):
        self.p, self.cfg = p, cfg or config(p)
        C, K, V = self.cfg.BT, p.K, p.V
        self.NC = -(-p.T // C)
        NB = self.NB = p.N * p.H * self.NC
        d = defines(p, self.cfg)
        n_kt = -(-K // self.cfg.KT)

        def launch(entry, grid, block):
            return Launch(FAMILY.function(entry, d), CHUNK_BACKWARD, grid, block, 0, T=p.T,
                          NH=p.N * p.H, H=p.H, NC=self.NC)

        self.pack = launch("gda_chunk_bwd_pack", NB, NTP)
        vecs = V // 4 if V % 4 == 0 else V                           # loads a key row
        rows = NTP // (128 if vecs >= 128 else -(-vecs // 32) * 32)  # key rows a block
        self.states = launch("gda_chunk_bwd_states", -(-p.N * p.H * K // rows), NTP)
        self.scores = launch("gda_chunk_bwd_scores", NB, C)
        self.intra = launch("gda_chunk_bwd_intra", NB * n_kt, self.cfg.KT)
        self.dv = launch("gda_chunk_bwd_dv", NB, NTP)
        self.local = Gemm(NB, K, V, C, ta=True)          # (k D)^T v, (q A)^T do
        self.scores_m = Gemm(NB, C, C, V, tb=True)       # v do^T
        self.rows_k = Gemm(NB, C, K, V, tb=True)         # do S0^T, v E^T
        self.dv_inter = Gemm(NB, C, V, K)                # (k D) E
        self.dv_intra = Gemm(NB, C, V, C)                # W do
        self.sizes = workspace(p, self.cfg)
        self.loop = recurrent_bwd.plan(p, False)
        self.ws_floats = max(sum(self.sizes.values()), sum(self.loop.ws))

    def __call__(self, q, k, v, g, do, scale, h0, dht):
        """(dq, dk, dv, dg, dh0) as recurrent_bwd.BackwardPlan's; arrays are contiguous CuPy."""
        return self.run(q, k, v, g, do, scale, h0, dht)[0]

    def run(self, q, k, v, g, do, scale, h0, dht, fallback=True):
        """(gradients, the guard's flag: a device int, 1 where it was hit); ``fallback=False``
        leaves out the reverse loop (tests: the chunked form's own results)."""
        import cupy
        p = self.p
        dq, dk = (empty((p.B, p.T, p.H, p.K), np_dtype(p.dtype)) for _ in range(2))
        dv = empty((p.B, p.T, p.H, p.V), np_dtype(p.dtype))
        dg = empty((p.B, p.T, p.H, p.K), np_dtype(p.g_dtype))
        dh0 = empty((p.N, p.H, p.K, p.V), np_dtype("float32")) if h0 is not None else None
        grads = (dq, dk, dv, dg, dh0)
        flag = cupy.zeros((1,), np.int32)
        if self.NB == 0:
            return self.loop(q, k, v, g, do, scale, h0, dht, None, out=grads), flag
        ws = empty((self.ws_floats,), np_dtype("float32"))   # kept alive until all are queued
        at, base = {}, ws.data.ptr
        for name, n in self.sizes.items():
            at[name] = base
            base += 4 * n
        at["sd"], dvp = at["qa"], at["vp"]
        ptrs = (q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, do.data.ptr, address(h0),
                address(dht), at["st"], at["et"], at["qa"], at["kd"], at["vp"], at["dp"],
                at["ae"], at["es"], at["mm"], at["ww"], at["sd"], at["ev"], at["ar"],
                flag.data.ptr, dq.data.ptr, dk.data.ptr, dv.data.ptr, dg.data.ptr, address(dh0))
        self.pack(ptrs, scale)                                              # 1
        self.local(at["st"], at["kd"], at["vp"])                           # 2
        self.local(at["et"], at["qa"], at["dp"], alpha=scale)
        self.states(ptrs, scale)                                            # 3
        self.scores_m(at["mm"], at["vp"], at["dp"], alpha=scale)           # 4
        self.rows_k(at["sd"], at["dp"], at["st"], alpha=scale)
        self.rows_k(at["ev"], at["vp"], at["et"])
        self.scores(ptrs, scale)                                            # 5
        self.intra(ptrs, scale)                                             # 6
        self.dv_inter(dvp, at["kd"], at["et"])                              # 7
        self.dv_intra(dvp, at["ww"], at["dp"], alpha=scale, beta=1.0)
        self.dv(ptrs, scale)
        if fallback:                                                        # 8
            self.loop(q, k, v, g, do, scale, h0, dht, None, out=grads, ws=ws,
                      only_if=flag.data.ptr)
        return grads, flag


def plan(p):
    """The memoised BackwardPlan of Problem ``p`` on the current device."""
    return cached(BackwardPlan, p)
