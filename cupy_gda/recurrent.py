"""Launcher of gda_recurrent_fwd (kernels/gda_recurrent_fwd.cu): one time step after another,
the state in registers; any K and V.

Shapes -> tiles (the rule below, once per call signature) -> grid -> launch. The measurements
behind the rule are in docs/perf-notes.md ("gda_recurrent_fwd versions"; scripts/sweep.py
re-runs them).
"""
import functools
from typing import NamedTuple

from cupy_gda._launch import (DTYPE_CODE, FORWARD, ITEMSIZE, Family, SegmentedPlan, cached, cp_async_inputs,
                              device_limits, mean_len, segments)

FAMILY = Family("gda_recurrent_fwd", ("common.cuh",),
                {"gda_recurrent_fwd": FORWARD, "gda_recurrent_state": FORWARD})

SEGMENT_STEPS = 64       # sequence segments of at least this many steps each
SEGMENT_WARPS = 12       # and blocks of at most this many warps a SM in all (at least one block)
THREAD_REGS = 128        # registers a thread takes, about (of 65536 a SM)
STAGE_BYTES = 100 * 1024             # staged inputs, one or two sets, at most
PARTIAL_BYTES = 48 * 1024            # the static partial sums of o, at most


class Config(NamedTuple):
    R: int               # state rows a lane (1, 2 or 4)
    KT: int              # lanes a value column (a power of 2 up to 32)
    BV: int              # value columns a block (KT * BV threads)
    TC: int              # steps staged a chunk
    P: int               # sequence segments (state pass first where P > 1)
    ASYNC_COPY: int      # inputs staged by cp.async into two sets


def lanes(K, V, R, threads):
    """(KT, BV): KT lanes a value column hold its K rows, R a lane; blocks of about ``threads``."""
    KT = 1
    while KT < 32 and KT * R < K:                       # a power of 2, at most 32
        KT *= 2
    cols = 32 // KT                                     # columns one warp covers
    return KT, min(-(-V // cols) * cols, max(cols, threads // KT))


def smem(K, R, KT, BV, TC, dbuf=0):
    """Dynamic shared memory bytes (the kernel checks it against its layout as SMEM_BYTES):
    ``1 + dbuf`` sets of q, k, g [TC][KP] and v [TC][BV], fp32."""
    KP = -(-K // (R * KT)) * R * KT
    return (1 + dbuf) * (3 * TC * KP + TC * BV) * 4


def _partials(KT, BV, TC):
    """Static shared memory bytes of the partial sums of o: [TC][BV][KT + 1] floats."""
    return TC * BV * (KT + 1) * 4


def _split(K, V, KT, BV, NH, L, itemsize, sms):
    """Segments for lanes (KT, BV); never 2: two segments run as many dependent steps as one
    (half in the state pass, half in the full pass), plus a launch."""
    P = segments(NH * -(-V // BV), max(1, SEGMENT_WARPS // (KT * BV // 32)), sms, int(L),
                 SEGMENT_STEPS, L, itemsize, V)
    return P if P >= 3 else 1


def rows(K, V, NH=None, L=None, itemsize=4, sms=132, staged=False):
    """(R, threads, TC_max). Without the grid (``NH`` sequence-heads of mean length ``L``), or
    where the inputs are not ``staged`` by cp.async (_launch.cp_async_inputs): R = 4 for K >= 64
    (fewest instructions per element) in blocks of 256 threads, else R = 2 in 128. Staged, by W,
    the warps a SM of that rule's grid in its segments:
    - K <= 32, W < 1, or W < 2 with segments of <= 128 steps (the GPU mostly idle: a step's
      latency is the time): R = 1, TC up to 64.
    - K <= 32, W >= 16, or segments of >= 256 steps that stay so in R = 4's own segments (or
      were segments already) (work, not latency): R = 4 in blocks of 64 threads, or of 128 with
      TC up to 64 where K > 16, V % 16 == 0 and W >= 12.
    - K 33..64, W < 6: R = 2 (KT = 32: twice the warps)."""
    R, threads = (4, 256) if K >= 64 else (2, 128)
    if NH is None or not staged:
        return R, threads, 32
    KT, BV = lanes(K, V, R, threads)
    P = _split(K, V, KT, BV, NH, L, itemsize, sms)
    W = NH * P * -(-V // BV) * KT * BV / 32 / sms
    steps = int(L) // P
    if K <= 32 and (W < 1 or W < 2 and steps <= 128):
        return 1, 128, 64
    if K <= 32 and (W >= 16 or steps >= 256 and (
            P > 1 or int(L) // _split(K, V, *lanes(K, V, 4, 64), NH, L, itemsize, sms) >= 256)):
        return (4, 128, 64) if K > 16 and V % 16 == 0 and W >= 12 else (4, 64, 32)
    if 32 < K <= 64 and W < 6:
        return 2, threads, 32
    return R, threads, 32


def stage_steps(K, R, KT, BV, TC_max=32, NH=None, P=1, V=None, sms=132, smem_max=227 * 1024,
                staged=False):
    """TC, the steps staged a chunk: the largest power of 2 up to TC_max that fits.
    Through registers (not staged, or BV not a multiple of 4): at most 8 prefetched q/k/g and
    8 v elements a thread, one set in STAGE_BYTES. Staged by cp.async: two sets in STAGE_BYTES,
    the partial sums in PARTIAL_BYTES, both in ``smem_max`` bytes (a block's opt-in limit), and
    the blocks a SM needs (at most the registers' 65536 / THREAD_REGS / threads) in one SM
    (smem_max + 1 KB, 1 KB a block)."""
    TC = TC_max
    if not staged or BV % 4:
        TC = min(TC, 32)
        while TC > 1 and (TC * K > 8 * KT * BV or TC > 8 * KT
                          or smem(K, R, KT, BV, TC) > STAGE_BYTES):
            TC //= 2
        return TC
    need = min(-(-NH * P * -(-V // BV) // sms), max(1, 65536 // (THREAD_REGS * KT * BV)))
    while TC > 1:
        two, part = smem(K, R, KT, BV, TC, 1), _partials(KT, BV, TC)
        if (two <= STAGE_BYTES and part <= PARTIAL_BYTES and two + part <= smem_max
                and need * (two + part + 1024) <= smem_max + 1024):
            break
        TC //= 2
    return TC


def tiles(K, V, NH=None, L=None, itemsize=4, sms=132, smem_max=227 * 1024, staged=False):
    """(R, KT, BV, TC, P): the rule on numbers (``NH`` sequence-heads of mean length ``L``,
    ``itemsize`` bytes an input element, a GPU of ``sms`` SMs and ``smem_max`` bytes of opt-in
    shared memory a block; ``staged``: the inputs go by cp.async, _launch.cp_async_inputs)."""
    R, threads, TC_max = rows(K, V, NH, L, itemsize, sms, staged)
    KT, BV = lanes(K, V, R, threads)
    P = 1 if NH is None else _split(K, V, KT, BV, NH, L, itemsize, sms)
    TC = stage_steps(K, R, KT, BV, TC_max, NH, P, V, sms, smem_max, staged and NH is not None)
    return R, KT, BV, TC, P


@functools.lru_cache(maxsize=None)
def config(p, sms=132, smem_max=227 * 1024):
    """The Config of Problem ``p`` on a GPU of ``sms`` SMs and ``smem_max`` bytes of opt-in
    shared memory a block (memoised: the rule runs once per signature)."""
    staged = cp_async_inputs(p)
    R, KT, BV, TC, P = tiles(p.K, p.V, p.N * p.H, mean_len(p), ITEMSIZE[p.dtype], sms, smem_max,
                             staged)
    return Config(R, KT, BV, TC, P, async_copy(p, R, KT, BV, TC))


def async_copy(p, R, KT, BV, TC):
    """1 where the inputs go by cp.async into two sets: cp_async_inputs, BV a multiple of 4, and
    two sets in STAGE_BYTES."""
    return int(cp_async_inputs(p) and BV % 4 == 0 and smem(p.K, R, KT, BV, TC, 1) <= STAGE_BYTES)


def custom(p, sms=132, smem_max=227 * 1024, R=None, threads=None, TC=None, P=None, ASYNC_COPY=None):
    """config() with choices fixed (for sweeps): R and threads a block (then the lanes follow),
    TC, P, ASYNC_COPY (only 0, or 1 where async_copy allows); the rest as the rule takes it."""
    c = config(p, sms, smem_max)
    if R is not None or threads is not None:
        R = c.R if R is None else R
        KT, BV = lanes(p.K, p.V, R, threads or c.KT * c.BV)
        c = c._replace(R=R, KT=KT, BV=BV)
        if P is None:
            P = _split(p.K, p.V, KT, BV, p.N * p.H, mean_len(p), ITEMSIZE[p.dtype], sms)
    c = c._replace(TC=c.TC if TC is None else TC, P=c.P if P is None else P)
    allowed = async_copy(p, c.R, c.KT, c.BV, c.TC)
    return c._replace(ASYNC_COPY=allowed if ASYNC_COPY is None else min(ASYNC_COPY, allowed))


def defines(p, cfg, seq_int64):
    """The kernel's defines for Problem ``p`` and Config ``cfg``."""
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), SEQ_INT64=int(seq_int64), R=cfg.R, KT=cfg.KT, BV=cfg.BV,
                TC=cfg.TC, ASYNC_COPY=cfg.ASYNC_COPY,
                SMEM_BYTES=smem(p.K, cfg.R, cfg.KT, cfg.BV, cfg.TC, cfg.ASYNC_COPY))


class RecurrentPlan(SegmentedPlan):
    """gda_recurrent_fwd compiled and sized for one Problem on the current device: a call costs
    one allocation per output (and the workspace) and one launch (two with segments). ``cfg``
    (a Config, e.g. from custom()) overrides the rule; ``extra`` adds compile defines."""
    family, entry, state_entry = FAMILY, "gda_recurrent_fwd", "gda_recurrent_state"

    def __init__(self, p, seq_int64, cfg=None, extra=None):
        self.cfg = cfg = cfg or config(p, *device_limits())
        d = dict(defines(p, cfg, seq_int64), **(extra or {}))
        self._setup(p, d, d["SMEM_BYTES"], -(-p.V // cfg.BV), cfg.P, cfg.KT * cfg.BV)


def plan(p, seq_int64):
    """The memoised RecurrentPlan of (Problem, cu_seqlens int64) on the current device."""
    return cached(RecurrentPlan, p, seq_int64)
