"""Launcher of gda_recurrent_bwd (kernels/gda_recurrent_bwd.cu): the gradients, one time step after
another (the reverse loop, states recomputed from one kept every TS steps); any K up to 256, any V.

Shapes -> tiles (the rule below) -> workspaces -> one launch, and a second that adds up the groups
of value tiles' partial sums where there is more than one group.
"""
from typing import NamedTuple

from cupy_gda._launch import (BACKWARD, BACKWARD_SUM, DTYPE_CODE, ITEMSIZE, Family, Launch, address,
                              cached, device_limits, empty, np_dtype, rounded)

FAMILY = Family("gda_recurrent_bwd", ("common.cuh",),
                {"gda_recurrent_bwd": BACKWARD, "gda_recurrent_bwd_sum": BACKWARD_SUM})

TS = 64                  # steps between the kept states where keeping one a chunk would take
KEPT_BYTES = 256 << 20   #   more than this (then S is computed a third time, span by span)
GROUPS = 8               # groups of value tiles a sequence-head, at most (their blocks run side
                         #   by side; each group's partial sums of dq, dk, dg take B*T*H*K*3 floats)
BLOCK_BYTES = 110 * 1024             # shared memory a block, at most (two blocks a SM)
THREADS = 256                        # threads a block, at most
PREFETCH = 8                         # q, k, g elements a thread prefetches a chunk, at most


class Config(NamedTuple):
    KT: int              # threads along K (32 or 64); each holds KG rows
    KG: int
    VT: int              # threads along V; each holds 4 columns (BV = 4 VT)
    TC: int              # steps a chunk (S_{t-1} of each kept in shared memory)
    TS: int = TS         # steps between kept states (TC: one a chunk)
    NG: int = 1          # groups of value tiles (a block each, per sequence-head)


def smem(K, KT, KG, VT, TC):
    """Dynamic shared memory bytes (the kernel checks it as SMEM_BYTES): S_{t-1} of TC steps, the
    partial sums of dv [TC][KT][BV] and of dq, dk, dg [TC][3][KP][VT], and the staged v, do
    [TC][BV] and q, k, g [TC][KP], float32."""
    KP, BV, NT = KG * KT, 4 * VT, KT * VT
    return 4 * (TC * KG * NT * 4 + TC * KT * BV + 2 * TC * BV + 3 * TC * KP + 3 * TC * KP * VT)


def tiles(K, V, smem_bytes=BLOCK_BYTES):
    """(KT, KG, VT, TC) for head dims K, V: 32 or 64 threads along K (each up to 4 rows), as
    many along V as make THREADS (no more than V's columns need, 4 a thread), and the most steps
    a chunk (32 down to 4) that fit ``smem_bytes`` and PREFETCH, halving the threads along V
    where even 4 do not."""
    KT = 32 if K <= 32 else 64
    KG = -(-K // KT)
    VT = THREADS // KT
    while VT > 1 and 4 * (VT // 2) >= V:
        VT //= 2
    while True:
        for TC in (32, 16, 8, 4):
            # registers: a thread prefetches TC * KP / NT = TC KG / VT elements of q, k and g
            # a chunk, at most PREFETCH
            if smem(K, KT, KG, VT, TC) <= smem_bytes and TC * KG <= PREFETCH * VT:
                return KT, KG, VT, TC
        if VT == 1:
            raise ValueError(f"gda_recurrent_bwd: no tiles fit {smem_bytes} bytes of shared "
                             f"memory at K = {K}")
        VT //= 2


def config(p, sms=132, smem_max=227 * 1024):
    """The Config of Problem ``p``: tiles() in BLOCK_BYTES (two blocks a SM), or in all of
    ``smem_max`` where the grid has at most a block a SM anyway (fewer, longer chunks: fewer
    barriers and loads in the dependent chain); groups(); a state kept every chunk where that
    takes at most KEPT_BYTES, else every TS steps."""
    NH = p.N * p.H
    KT, KG, VT, TC = tiles(p.K, p.V, min(BLOCK_BYTES, smem_max))
    NG = groups(-(-p.V // (4 * VT)), NH, sms)
    if NH * NG <= sms:
        KT, KG, VT, TC = tiles(p.K, p.V, smem_max)
        NG = groups(-(-p.V // (4 * VT)), NH, sms)
    cfg = Config(KT, KG, VT, TC, TC, NG)
    if 4 * workspace(p, cfg)[0] > KEPT_BYTES:
        cfg = cfg._replace(TS=max(TS, TC))
    return cfg


def defines(p, cfg, seq_int64):
    """The kernel's defines for Problem ``p`` and Config ``cfg``."""
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), SEQ_INT64=int(seq_int64), KT=cfg.KT, KG=cfg.KG,
                VT=cfg.VT, TC=cfg.TC, TS=cfg.TS,
                SMEM_BYTES=smem(p.K, cfg.KT, cfg.KG, cfg.VT, cfg.TC))


def groups(NV, NH, sms=132):
    """Groups of value tiles: a block a group and sequence-head runs the group's tiles one after
    another, adding up their sums over V in place; as many groups as give the NH sequence-heads
    two blocks a SM on ``sms`` SMs, at most GROUPS and NV."""
    return max(1, min(NV, GROUPS, 2 * sms // max(NH, 1)))


def workspace(p, cfg):
    """Floats of the three workspaces: the kept states (one per cfg.TS steps of each sequence,
    a slot more per sequence for where it starts), each block's states at its span's chunks,
    and each group's partial sums of dq, dk, dg (none with one value tile)."""
    NV = -(-p.V // (4 * cfg.VT))
    state = cfg.KG * cfg.KT * 4 * cfg.VT                   # a block's part of one state
    slots = p.B * p.T // cfg.TS + p.N + 1
    return (slots * p.H * cfg.NG * state, p.N * p.H * cfg.NG * (cfg.TS // cfg.TC) * state,
            3 * cfg.NG * p.B * p.T * p.H * p.K if NV > 1 else 0)


class BackwardPlan:
    """gda_recurrent_bwd compiled and sized for one Problem on the current device: a call
    allocates the gradients and one workspace (``workspace``) and launches once (twice with
    more than one group of value tiles), on the current stream, without a host sync."""

    def __init__(self, p, seq_int64, cfg=None):
        sms, smem_max = device_limits()
        self.cfg = cfg = cfg or config(p, sms, smem_max)
        d = defines(p, cfg, seq_int64)
        NV, NG = -(-p.V // (4 * cfg.VT)), cfg.NG
        self.grid = p.N * p.H * NG
        self.launch = Launch(FAMILY.function("gda_recurrent_bwd", d, d["SMEM_BYTES"]), BACKWARD,
                             self.grid, cfg.KT * cfg.VT, d["SMEM_BYTES"], T=p.T, H=p.H, NV=NV,
                             NG=NG)
        n = p.B * p.T * p.H * p.K
        self.sum = None
        if NG > 1 and n:
            self.sum = Launch(FAMILY.function("gda_recurrent_bwd_sum", d), BACKWARD_SUM,
                              min(-(-n // 256), 8 * sms), 256, 0, n=n)
        self.ws = workspace(p, cfg)
        self.p = p

    def scratch_bytes(self, with_h0):
        """The bytes a call allocates (``rounded``): the gradients (dinitial_state where
        ``with_h0``) and the workspace."""
        return rounded(*gradient_bytes(self.p, with_h0), 4 * sum(self.ws))

    def __call__(self, q, k, v, g, do, scale, h0, dht, cu_seqlens, out=None, ws=None, only_if=0):
        """(dq, dk, dv, dg, dh0): dg of g as given (log or multiplicative), dh0 only with h0;
        arrays are contiguous CuPy. ``out``: those five arrays to write instead (chunk_bwd's
        fall-back), ``ws`` a float32 workspace of at least sum(self.ws) floats to use, and
        ``only_if`` the address of a device int: the launches do nothing where it is 0."""
        p = self.p
        if out is None:
            dq, dk = (empty((p.B, p.T, p.H, p.K), np_dtype(p.dtype)) for _ in range(2))
            dv = empty((p.B, p.T, p.H, p.V), np_dtype(p.dtype))
            dg = empty((p.B, p.T, p.H, p.K), np_dtype(p.g_dtype))
            dh0 = empty((p.N, p.H, p.K, p.V), np_dtype("float32")) if h0 is not None else None
        else:
            dq, dk, dv, dg, dh0 = out
        if self.grid:
            if ws is None:                          # kept alive until both are queued
                ws = empty((sum(self.ws),), np_dtype("float32"))
            ws_h = ws.data.ptr
            ws_s = ws_h + 4 * self.ws[0]
            ws_p = ws_s + 4 * self.ws[1] if self.ws[2] else 0
            self.launch((q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, do.data.ptr, address(h0),
                         address(dht), address(cu_seqlens), ws_h, ws_s, ws_p, dq.data.ptr,
                         dk.data.ptr, dv.data.ptr, dg.data.ptr, address(dh0), only_if), scale)
            if self.sum is not None:
                self.sum((ws_p, g.data.ptr, dq.data.ptr, dk.data.ptr, dg.data.ptr, only_if),
                         self.cfg.NG)
        return dq, dk, dv, dg, dh0


def gradient_bytes(p, with_h0):
    """The bytes of the gradients of Problem ``p`` as the backward plans allocate them: dq, dk,
    dv, dg (and dh0, float32, where ``with_h0``)."""
    io, g = ITEMSIZE[p.dtype], ITEMSIZE[p.g_dtype]
    n = p.B * p.T * p.H
    return [n * p.K * io, n * p.K * io, n * p.V * io, n * p.K * g] + (
        [4 * p.N * p.H * p.K * p.V] if with_h0 else [])


def plan(p, seq_int64):
    """The memoised BackwardPlan of (Problem, cu_seqlens int64) on the current device."""
    return cached(BackwardPlan, p, seq_int64)
