"""Launcher of gda_chunk_fwd (kernels/gda_chunk_fwd.cu): chunks of 64 steps on the tensor cores,
K <= MAX_K (above MAX_KT in key tiles), any V (in value tiles); on a Hopper GPU the wgmma variant
(sm_90a) where the tiles allow it (``wgmma_fits``) and USE_WGMMA is set.

Shapes -> tiles (the rule below, once per call signature) -> grid -> launch. The measurements
behind the rule are in docs/perf-notes.md ("gda_chunk_fwd"; scripts/sweep.py re-runs them).
"""
import functools
from typing import NamedTuple

from cupy_gda._launch import (DTYPE_CODE, FORWARD, ITEMSIZE, Family, SegmentedPlan, cached,
                              cp_async_inputs, device_limits, hopper, mean_len, segments)

FAMILY = Family("gda_chunk_fwd", ("common.cuh", "mma.cuh", "wgmma.cuh"),
                {"gda_chunk_fwd": FORWARD, "gda_chunk_state": FORWARD})

MAX_K = 256              # the kernel's static_assert
MAX_KT = 128             # key columns a tile: one scan thread per column and direction
MIN_KT = 32              # and at least (narrower tiles repeat a pass of the stages too often)
THREADS = 256            # the kernel's NT: 8 warps, a pair per sub-block
BT = 64                  # steps a chunk
BVS = (64, 32, 16, 8)    # value tiles, widest first
SEGMENT_CHUNKS = 2       # sequence segments of at least this many chunks each
USE_WGMMA = False        # the Hopper variant where it fits: off by default, as it measured slower
                         #   than the sm_80 variant on the H200 (docs/perf-notes.md v15); read
                         #   when a call signature's plan is made (set it before the first call)


class Config(NamedTuple):
    BV: int              # value columns a block
    P: int               # sequence segments (state pass first where P > 1)
    DBUF: int            # two sets of staged inputs (cp.async, one key tile only)
    ASYNC_COPY: int      # inputs staged by cp.async (cp_async_inputs)
    KT: int              # key columns a tile (K rounded up to 16: one tile)
    WGMMA: int = 0       # stages 4a and 5 by wgmma (sm_90a), B operands split once a chunk


def _pad(K):
    return -(-K // 16) * 16


def smem(K, BV, dbuf=0, KT=None):
    """Dynamic shared memory bytes (the kernel checks it against its SM_* layout as SMEM_BYTES):
    ``1 + dbuf`` sets of q, g [BT][KT+4], k [BT][KT+8], v [BT][BV+8]; kA [96][KT+4],
    S [KR][BV+8], scores [BT][BT+4], A_end and B_i [5][KT], with key tiles o's sums [BT][BV+8];
    fp32, KT key columns a tile (K rounded up to 16 by default), KR = KT times the tiles."""
    KT = KT or _pad(K)
    NKT = -(-K // KT)
    QS, KS, VS, WS = KT + 4, KT + 8, BV + 8, BT + 4
    return 4 * ((1 + dbuf) * (2 * BT * QS + BT * KS + BT * VS) + 96 * QS + NKT * KT * VS + BT * WS
                + 5 * KT + (BT * VS if NKT > 1 else 0))


def _tiles(K):
    """The key tiles key_tile may pick for K, widest first: K rounded up to 16 where K <= MAX_KT,
    else the even splits into 2, 3, ... tiles (rounded up to 16, at least MIN_KT)."""
    if K <= MAX_KT:
        return [_pad(K)]
    return [KT for KT in (_pad(-(-K // n)) for n in range(2, -(-K // MIN_KT) + 1)) if KT >= MIN_KT]


@functools.lru_cache(maxsize=None)
def key_tile(K, BV, smem_max=227 * 1024):
    """KT for value tiles of BV, or None: the widest of _tiles(K) that fits in ``smem_max``
    bytes; fewer, wider tiles repeat less of the per-tile work (a pass of the stages and their
    barriers)."""
    if K > MAX_K:
        return None
    return next((KT for KT in _tiles(K) if smem(K, BV, 0, KT) <= smem_max), None)


def split(K, V, NH, L, itemsize=4, sms=132, smem_max=227 * 1024):
    """(BV, P), or None when K is over MAX_K or nothing fits in ``smem_max`` bytes.

    BV: the widest value tile that fits. P: sequence segments, as many as fill the ``sms`` SMs
    once with one block each, with at least SEGMENT_CHUNKS chunks of the mean length ``L`` each
    and a workspace no larger than q (``itemsize`` bytes an element). Only then, while the grid
    has fewer than 3/4 of a block per SM, narrower value tiles (each recomputes the chunk's
    scores, so narrower costs work where a segment costs only its state pass)."""
    fits = [b for b in BVS if key_tile(K, b, smem_max)]
    if not fits:
        return None
    BV = min(fits[0], -(-V // 8) * 8)
    P = segments(NH * -(-V // BV), 1, sms, -(-int(L) // BT), SEGMENT_CHUNKS, L, itemsize, V)
    while BV > 16 and NH * -(-V // BV) * P < 0.75 * sms:
        BV = max(16, -(-(BV // 2) // 8) * 8)
    return BV, P


def wgmma_fits(BV, KT):
    """Whether the wgmma variant takes tiles of BV value and KT key columns: each warpgroup a
    value half of whole 8-column tiles, stage 5's rows in m64 blocks."""
    return BV % 16 == 0 and KT % 64 == 0


@functools.lru_cache(maxsize=None)
def config(p, sms=132, smem_max=227 * 1024, BV=None, P=None, KT=None, wgmma=False):
    """The Config of Problem ``p`` on a GPU of ``sms`` SMs and ``smem_max`` bytes of opt-in
    shared memory a block, or None where the kernel cannot run it (memoised: the rule runs once
    per signature). ``BV``, ``P``, ``KT`` fix the split (sweeps). ``wgmma``: a Hopper GPU, the
    wgmma variant where the tiles fit it (then one set of staged inputs); else two sets (DBUF)
    where they go by cp.async, the keys are one tile and they fit."""
    if BV is None or P is None:
        s = split(p.K, p.V, p.N * p.H, mean_len(p), ITEMSIZE[p.dtype], sms, smem_max)
        if s is None:
            return None
        BV, P = BV or s[0], P or s[1]
    KT = KT or key_tile(p.K, BV, smem_max) or _pad(min(p.K, MAX_KT))
    staged = int(cp_async_inputs(p))
    wg = bool(wgmma) and wgmma_fits(BV, KT)
    dbuf = staged and not wg and KT >= p.K and smem(p.K, BV, 1, KT) <= smem_max
    return Config(BV, P, int(dbuf), staged, KT, int(wg))


def refusal(p, sms, smem_max):
    """Why the kernel cannot run Problem ``p`` on this GPU (completes "method 'chunk' on the GPU
    ..."), or None."""
    if p.K > MAX_K:
        return f"takes a head dimension K of at most {MAX_K}, got K={p.K}"
    if config(p, sms, smem_max) is None:
        need = min(smem(p.K, BVS[-1], 0, KT) for KT in _tiles(p.K))
        return f"needs {need} bytes of shared memory per block at K={p.K}; this GPU has {smem_max}"
    return None


def defines(p, cfg, seq_int64):
    """The kernel's defines for Problem ``p`` and Config ``cfg``: its entries (ENTRIES) those
    its plan launches, gda_chunk_fwd and, in sequence segments (P > 1), gda_chunk_state."""
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), SEQ_INT64=int(seq_int64), BV=cfg.BV, DBUF=cfg.DBUF,
                KT=cfg.KT, ASYNC_COPY=cfg.ASYNC_COPY, WGMMA=cfg.WGMMA,
                SMEM_BYTES=smem(p.K, cfg.BV, cfg.DBUF, cfg.KT), ENTRIES=1 | (cfg.P > 1) << 1)


class ChunkPlan(SegmentedPlan):
    """gda_chunk_fwd compiled and sized for one Problem on the current device; the same call as
    RecurrentPlan. ``cfg`` (a Config) overrides the rule (``wgmma``: whether it may pick the
    Hopper variant); ``extra`` adds compile defines."""
    family, entry, state_entry = FAMILY, "gda_chunk_fwd", "gda_chunk_state"

    def __init__(self, p, seq_int64, cfg=None, extra=None, wgmma=False):
        self.cfg = cfg = cfg or config(p, *device_limits(), wgmma=wgmma)
        d = dict(defines(p, cfg, seq_int64), **(extra or {}))
        self._setup(p, d, d["SMEM_BYTES"], -(-p.V // cfg.BV), cfg.P, THREADS)


def plan(p, seq_int64):
    """The memoised ChunkPlan of (Problem, cu_seqlens int64) on the current device (the wgmma
    variant on a Hopper GPU while USE_WGMMA)."""
    return cached(ChunkPlan, p, seq_int64, None, None, USE_WGMMA and hopper())
