"""Launcher of gda_chunk_bwd (kernels/gda_chunk_bwd.cu): the gradients in chunks of BT steps,
the matmuls on the tensor cores with split operands (exact to float32, never plain TF32), exact
for every gate (the guarded fall back to the reverse loop, recurrent_bwd, on the GPU itself). Any
K and V, sequences of T steps or packed ones (cu_seqlens: each sequence's chunks in order, their
offsets counted on the GPU).

The pipeline of one call, all on the current stream, no host sync (NB chunks, chunks()):
  1. pack       q A, k D, A_end, v, do as float32 rows [NB][BT][*]; the guard on the inputs;
                with PLANES instead scale q A, k D, v, do split into bfloat16 planes (the
                GEMMs' operands, split once)
  2. local      st = (k D)^T v, et = scale (q A)^T do                     (local states, GEMMs)
  3. states     st -> S0, et -> E chunk by chunk; rowsum(E S0); d_initial_state; the guard
     (2-3. scan: the two as one kernel where there are enough state tiles; config(); with
      PLANES its operands, the planes, copied by cp.async through a ring of RING stages)
  4. rows       M = scale v do^T, sd = scale do S0^T, ev = v E^T          (GEMMs)
  5. scores     W (gated q.k scores of each chunk)
  6. intra      dq, dk, dg
  7. dv         (k D) E + scale W do (GEMMs), into [B, T, H, V]; on a Hopper GPU with
                USE_WGMMA (off: no faster, v28) by wgmma, bit for bit the same
     (3 and 7 of a backward from the planes: scan_dv, E on chip for dv, after 5, where
      scan_dv_fits; the scan then runs its forward half alone, or scan_o its wgmma form without
      o where USE_SCAN_O_WG, and none where S0 is kept)
  8. the reverse loop (gda_recurrent_bwd), run only where the guard was hit, over everything

ForwardPlan is the forward from stages 1, 2-3 (the scan's forward half), 5 and 7 (o in dv's
place), built with FWD for bfloat16 inputs, its fall-back gda_chunk_fwd (chunk.ChunkPlan) run
only where the guard was hit; _dispatch.planes_forward says where it runs. One that keeps
nothing runs 2-3 and 7 as one kernel where it fits (8. scan_o: the state in registers, no
chunk's S0 through memory; its products by wgmma on a Hopper GPU with USE_SCAN_O_WG, v39); one
that keeps its stages runs scan_o's wgmma form, storing each S0, where its backward runs scan_dv
and scan_o's S0 (v41). With USE_SCAN_O_MC the wgmma form of the one that keeps nothing runs a
sequence-head's blocks as a cluster that shares each chunk's planes (SCAN_O_MC, v42). One that
keeps nothing and runs scan_o copies v's rows from v itself, where V is a multiple of 8, and
pack writes no plane of v (VROWS, v43); there scores does what pack did of q, k and g from its
own loads, and pack is not launched (v44). Likewise, in the backward by scan_dv that keeps
nothing and in the forward that keeps its stages by scan_o's wgmma form, scores writes the
planes of q A and k D (three terms) and pack those of v and do alone (QK_BY_SCORES, v75).
"""
from typing import NamedTuple

import numpy as np

from cupy_gda import chunk, recurrent_bwd
from cupy_gda._launch import (CHUNK_BACKWARD, DTYPE_CODE, PTR, Family, Launch, address, cached,
                              capability, device_limits, empty, hopper, np_dtype, rounded)

ENTRIES = ("gda_chunk_bwd_pack", "gda_chunk_bwd_local", "gda_chunk_bwd_states",
           "gda_chunk_bwd_scan", "gda_chunk_bwd_rows", "gda_chunk_bwd_scores",
           "gda_chunk_bwd_intra", "gda_chunk_bwd_dv", "gda_chunk_bwd_scan_o",
           "gda_chunk_bwd_scan_dv")
FAMILY = Family("gda_chunk_bwd", ("common.cuh", "mma.cuh", "wgmma.cuh"),
                {e: CHUNK_BACKWARD for e in ENTRIES})

CHUNKS_64 = 1024         # chunks of 64 steps from which config picks them
SCAN_FROM = 256          # state tiles (sequence-heads x GT x GT tiles of K x V) from which the
                         # boundary scan runs as one kernel (config)
NTP = 128                # the kernel's threads of pack and states
NTS = 128                # and of scores
NTG, GT = 128, 64        # the GEMM entries' threads and output tile (GT x GT)
ALIGN = 64               # floats: each workspace starts 256-byte aligned (the GEMMs load float4)
SMALL = 12               # arrays of N + 1 int64 at most that chunk_offsets allocates
RING = 3                 # the scan's stages in flight
SLOWER_AT_3 = 1.19       # a planes scan block's time at 3 blocks an SM over its time at 2 (v23)
USE_WGMMA = False        # dv's entry by wgmma on Hopper (chunks of 64 steps): off, slower (v28)
DV_TWO_TERMS = True      # the backward's dv entry in two terms for half inputs (v36: within the
                         # contract; v37: GLA-1.3B bf16's dv 1.06 -> 0.68 ms)
ROWS_TWO_TERMS = True    # rows' S0 and E in two terms for half inputs (v36: dgate within a
                         # quarter of its bound; v37: rows 1.35 -> 1.13 ms)
DV_SMEM = 98304          # its dynamic shared memory bytes (the kernel's WG_SMEM)
USE_SCAN_O = True        # a ForwardPlan that keeps nothing runs the scan and o as one kernel
                         # (gda_chunk_bwd_scan_o) where it fits (scan_o_fits; v38)
NTF, FV = 256, 64        # scan_o's threads and value columns a block
FD_PT = 128              # scan_dv's producer warpgroup's threads, beside NTF (the kernel's; v68)
USE_SCAN_O_WG = True     # scan_o's products by wgmma on a Hopper GPU (Config.SCAN_O_WG; v39) in
                         # every form that can: where scan_dv runs, the lean backward's S0 (no
                         # o) and the keeping forward's (each S0 stored; scan_o_s0). Off before
                         # v72, slower then (v39-v42, v52); on since v72 (an H100, GLA-1.3B bf16:
                         # the backward's S0 0.54 ms against the scan's 0.96, the keeping
                         # forward 1.50 against 2.31). SCAN_O_WG_KEYS rules the lean forward
SCAN_O_WG_KEYS = (128, 256)  # without USE_SCAN_O_WG, a ForwardPlan that keeps nothing takes
                         # scan_o's wgmma form on a Hopper GPU where its planes are of these keys
                         # (v53, H100: the planes in the 128-byte swizzle, fed by a producer
                         # warpgroup; GLA-1.3B bf16's scan_o 0.717-0.725 ms against mma.sync's
                         # 0.751-0.767, 0.668-0.692 after v54; at 128 keys 3-5 % slower than
                         # mma.sync in v53, 1-5 % faster after v54: v56)
USE_SCAN_O_MC = False    # with SCAN_O_WG, a ForwardPlan that keeps nothing runs a sequence-head's
                         # scan_o blocks as a cluster sharing each chunk's planes of q A and k D
                         # (Config.SCAN_O_MC, scan_o_mc; v42): off, right but slower (clusters
                         # of 8 leave SMs idle, and pack's stores of the planes cost more)
USE_SCAN_DV = True       # a backward from the planes on a Hopper GPU runs the scan's backward
                         # half and dv as one wgmma kernel (Config.SCAN_DV, scan_dv_fits): on
                         # since v69, its planes in the 128-byte swizzle (v67) and fed by a
                         # producer warpgroup (v68); off before, slower (v40: the backward 6.8
                         # ms against 6.0 with scan_o's S0)
USE_SCAN_O_PRODUCER = True  # scan_o (sm_90 on) fed by warps more that copy each chunk's
                         # operands (SCAN_O_PRODUCER, scan_o_warps of them; v49): by mma.sync,
                         # and by wgmma (SCAN_O_WG) where not as clusters (v52)
USE_VROWS = True         # a ForwardPlan that keeps nothing and runs scan_o reads v's rows from v
                         # itself (Config.VROWS, scan_o_vrows; v43): pack then neither reads v nor
                         # writes its plane (a third of its bytes at GLA-1.3B), scan_o checks v;
                         # and scores writes the planes of q A and k D, pack not launched (v44)
USE_QK_BY_SCORES = True  # scores writes pack's planes of q A and k D (three terms) and A_end
                         # from its own loads of q, k and g (QK_BY_SCORES, qk_by_scores; v75) in
                         # the backward by scan_dv that keeps nothing and in the forward that
                         # keeps its stages by scan_o's wgmma form: pack then reads and writes
                         # v's and do's alone (at GLA-1.3B bf16 0.5 of its 1.2 GB; measured, the
                         # lean backward 0.6 % faster: scores' stores of the planes cost 0.24 ms)
SCAN_DV_FROM = 1.0       # scan_dv's blocks an SM from which it runs (its blocks are scan_o's:
                         # SCAN_O_FROM's reason; not measured)
SCAN_O_FROM = 0.2        # scan_o's blocks (sequence-heads x tiles of FV value columns) an SM
                         # from which it runs (times SCAN_O_WIDE at K > 128): each runs a
                         # sequence-head's chunks in turn, so fewer leave SMs idle, where the
                         # scan's 4x as many blocks (at K = 256) and dv's entry's do not. v50's
                         # sweep (an H100, bfloat16, scan_o with its producer warps): the forward
                         # with scan_o took 0.71x the time of the one without at 0.48 an SM (K =
                         # 256, V = 512), 0.62-0.73x at K = 128, V = 128, 0.92x at 0.24 (K = 128,
                         # V = 256), 1.14x at 0.12 (K = 256) and 0.99-1.12x at 0.12 and under (K
                         # = 128); v46's, before the producer warps, 1.33-1.79x at 0.24 and under
SCAN_O_WIDE = 1.5        # SCAN_O_FROM's factor at K > 128 (0.3 an SM): v51 (an H100, K = 256,
                         # V = 512, B1 T4096): the forward with scan_o took 1.13x the time of
                         # the one without at 0.24 an SM (H4: 0.521 ms against 0.459), 0.89x at
                         # 0.30 (H5), 0.82x at 0.36 (H6), 0.71x at 0.48 (B2 H4)


class Config(NamedTuple):
    BT: int              # steps a chunk
    KT: int              # key columns a block of intra (its shared memory: BT^2 + 2 BT KT floats)
    SCAN: bool = False   # stages 2 and 3 as one kernel (gda_chunk_bwd_scan), a block a state tile
    PLANES: bool = False  # the GEMMs' operands split once by pack (bfloat16 inputs), the scan's
                          # copied through a ring, 3 blocks an SM
    WGMMA: bool = False  # dv's entry by wgmma (sm_90a; chunks of 64 steps)
    TERMS: int = 3       # bfloat16 terms of a float32 operand: 3 (exact to float32), or 2 (a
                         # ForwardPlan that keeps nothing: bfloat16 inputs' contract, v34)
    DV_TERMS: int = 3    # those of dv's entry: TERMS, or 2 in a backward of half inputs
                         # (DV_TWO_TERMS; dv's rounding is its error, v36)
    ROWS_TERMS: int = 3  # those of S0 and E in rows' products: TERMS, or 2 in a backward of half
                         # inputs (ROWS_TWO_TERMS, v36)
    SCAN_O_WG: bool = False  # scan_o's products by wgmma (sm_90a; chunks of 64, planes of 128 or
                             # 256 keys: planes_config): in a forward that keeps nothing, and
                             # with SCAN_DV (v41) in the forward that keeps its stages (each S0
                             # stored) and in the backward (S0 alone, no o, for the scan)
    SCAN_DV: bool = False    # a backward's E scan and dv as one kernel, scan_dv (sm_90a;
                             # scan_dv_fits)
    SCAN_O_MC: bool = False  # with SCAN_O_WG in a ForwardPlan that keeps nothing and runs scan_o:
                             # a sequence-head's blocks a cluster, each chunk's planes of q A and
                             # k D copied once into all of them, pack writing them as they lie
                             # there (scan_o_mc; the build then holds no scan and dv entry)
    VROWS: bool = False      # a ForwardPlan that keeps nothing and runs scan_o: scan_o copies
                             # v's rows from v itself and checks them for the guard, scores
                             # writes the planes of q A and k D and checks q, k, g, and pack is
                             # not launched (scan_o_vrows; the build holds scores and scan_o)
    PANELS: bool = False     # the planes of q A and k D in 64-key panels of BT rows of 128
                             # bytes, as scan_o's wgmma form and scan_dv hold them (their only
                             # readers here): scores writes them faster than rows (0.51 against
                             # 0.55 ms at GLA-1.3B) and they copy them as they lie (panels(); v75)


def config(p, varlen=False, sms=132, wgmma=False):
    """Chunks of 64 steps where K >= 64 and there are at least CHUNKS_64 of them (the chunk
    states and local-state GEMMs shrink with BT); else of 32 (the work inside a chunk, O(BT^2 K),
    shrinks, and more chunks fill the GPU): measured in docs/perf-notes.md, v19 and v22. The fused
    boundary scan where its blocks, one a state tile running every chunk in turn, number at
    least SCAN_FROM (fewer, each runs a long chain: v21). The scan from pack's planes (PLANES)
    where its blocks, 3 an SM (of ``sms``), fit 168 registers (bfloat16 inputs, whole tiles,
    more than one of K: elsewhere ptxas spilled) and the waves that leaves, each SLOWER_AT_3
    longer, take less time than 2 an SM's: each block is one long chain, so a last wave part
    full costs a whole one (v23: where 2 an SM was the better, at big128, pack's writes of the
    planes cost more than the scan saved). ``wgmma`` (a Hopper GPU): dv's entry by wgmma where
    the chunks are of 64 steps (its m64)."""
    bt = 64 if p.K >= 64 and p.H * -(-p.B * p.T // 64) >= CHUNKS_64 else 32
    n = chunks(p, bt, varlen)[0] * tiles(p.K) * tiles(p.V)
    planes = (n >= SCAN_FROM and p.dtype == "bfloat16" and p.K % GT == 0 and p.K > GT
              and p.V % GT == 0 and SLOWER_AT_3 * -(-n // (3 * sms)) < -(-n // (2 * sms)))
    wg = wgmma and bt == 64
    half = p.dtype != "float32"
    return Config(bt, 32 if p.K <= 32 else 64, n >= SCAN_FROM, planes, wg,
                  DV_TERMS=2 if DV_TWO_TERMS and half and not wg else 3,
                  ROWS_TERMS=2 if ROWS_TWO_TERMS and half else 3)


def chunks(p, BT, varlen):
    """(NH, NC): NH sequence-heads of NC chunks each. Without cu_seqlens N H of ceil(T / BT);
    with them H (one a head) of every sequence's chunks in order, at most T / BT + N (a chunk
    more than its steps fill per sequence: an empty one has one, of no rows)."""
    if varlen:
        return p.H, -(-p.T // BT) + p.N
    return p.N * p.H, -(-p.T // BT)


def backward_stages(cfg, keep=False):
    """(stage number, entry) of a BackwardPlan of Config ``cfg`` (``keep``: from a ForwardPlan's
    kept stages), in the order it launches them: run(stages=n) runs those numbered n or less.
    With SCAN_DV, E and dv come by scan_dv, numbered 3 though it runs after W (5): stages 3
    and 4 then hold E, S0 and rows' products, and dv, made from a W not yet written, is right
    only from 5 on (from 1 where scores writes the planes of q A and k D, qk_by_scores: it then
    runs right after pack, numbered 1 as pack's work); the scan runs its forward half alone, or
    scan_o its S0 where SCAN_O_WG, and none where the S0 are kept. KEEP launches no scores (W
    kept)."""
    if cfg.SCAN_DV:
        s0 = (3, "scan_o" if cfg.SCAN_O_WG else "scan")
        boundary = ([] if keep else [(1, "scores"), s0] if qk_by_scores(cfg)
                    else [s0, (5, "scores")]) + [(3, "scan_dv")]
    elif cfg.SCAN:
        boundary = [(3, "scan")]
    else:
        boundary = [(2, "local"), (3, "states")]
    return ([(1, "pack")] + boundary + [(4, "rows")]
            + ([] if keep or cfg.SCAN_DV else [(5, "scores")]) + [(6, "intra")]
            + ([] if cfg.SCAN_DV else [(7, "dv")]))


def forward_stages(scan_o, vrows=False):
    """The entries of a ForwardPlan, in order: with ``scan_o`` pack, scores (W) and scan_o (S0 on
    chip, and o), and with ``vrows`` (VROWS) scores and scan_o, scores writing pack's planes;
    else pack, the scan's forward half (S0), scores and dv's entry (o)."""
    if not scan_o:
        return ("pack", "scan", "scores", "dv")
    return ("scores", "scan_o") if vrows else ("pack", "scores", "scan_o")


def qk_by_scores(cfg, fwd=False, keep=False):
    """Whether scores writes pack's planes of q A and k D, A_end and the guard on q, k and g
    (QK_BY_SCORES) in the build of Config ``cfg`` (a forward's where ``fwd``, a backward from
    kept stages where ``keep``): in a forward with VROWS (v44), and with USE_QK_BY_SCORES in one
    that keeps its stages by scan_o's wgmma form (three terms, SCAN_O_WG: scores runs before
    scan_o there) and in a backward by scan_dv that keeps nothing (v75: scores then runs right
    after pack, before the S0's scan)."""
    if fwd:
        return cfg.VROWS or (USE_QK_BY_SCORES and cfg.TERMS == 3 and cfg.SCAN_O_WG)
    return USE_QK_BY_SCORES and cfg.SCAN_DV and not keep


def panels(p, cfg, fwd=False, keep=False):
    """Whether the planes of q A and k D lie in 64-key panels (Config.PANELS, v75) in a plan of
    Config ``cfg`` for Problem ``p`` on the current device (a ForwardPlan's where ``fwd``, a
    BackwardPlan's from kept stages where ``keep``): where scores writes them (qk_by_scores) and
    scan_o's wgmma form and scan_dv alone read them, the forward that keeps its stages by
    scan_o's wgmma form and the backward by scan_dv with scan_o's S0; and in a backward from the
    former's kept stages, which it runs where the lean backward would take scan_o's S0
    (BackwardPlan's rule: USE_SCAN_O_WG, whole key tiles, scan_dv)."""
    if keep:
        return (USE_QK_BY_SCORES and cfg.SCAN_DV and use_scan_o_wg() and p.K % GT == 0)
    return qk_by_scores(cfg, fwd) and not cfg.VROWS and cfg.SCAN_O_WG and cfg.TERMS == 3


def entries(cfg, fwd=False, keep=False):
    """The build's ENTRIES (bit i: ENTRIES[i]): the entries its plans launch, the others left
    out of it (its compile a third faster at K = 256; a launch of one left out fails when the
    plan is made). A forward that keeps nothing may run either form (scan_o_fits is the
    device's); one that keeps its stages runs scan_o where it has SCAN_O_WG."""
    if fwd:                                     # (SCAN_O_MC, VROWS: one form, scan_o's)
        names = (set(forward_stages(cfg.SCAN_O_WG or cfg.VROWS, cfg.VROWS))
                 if cfg.TERMS == 3 or cfg.SCAN_O_MC or cfg.VROWS
                 else set(forward_stages(True)) | set(forward_stages(False)))
    else:
        names = {e for _, e in backward_stages(cfg, keep)}
    return sum(1 << i for i, e in enumerate(ENTRIES) if e.removeprefix("gda_chunk_bwd_") in names)


def defines(p, cfg, seq_int64=False, fwd=False, keep=False):
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), SEQ_INT64=int(seq_int64), BT=cfg.BT, KT=cfg.KT,
                SCAN=int(cfg.SCAN), PLANES=int(cfg.PLANES), SMEM_BYTES=smem(cfg), FWD=int(fwd),
                KEEP=int(keep), WGMMA=int(cfg.WGMMA), TERMS=cfg.TERMS,
                DV_TERMS=min(cfg.TERMS, cfg.DV_TERMS) if fwd else cfg.DV_TERMS,
                ROWS_TERMS=cfg.TERMS if fwd else cfg.ROWS_TERMS, SCAN_O_WG=int(cfg.SCAN_O_WG),
                SCAN_O_MC=int(cfg.SCAN_O_MC and fwd), SCAN_DV=int(cfg.SCAN_DV and not fwd),
                VROWS=int(cfg.VROWS and fwd), QK_BY_SCORES=int(qk_by_scores(cfg, fwd, keep)),
                PANELS=int(cfg.PANELS),
                ENTRIES=entries(cfg, fwd, keep),
                SCAN_O_PRODUCER=scan_o_warps(p, cfg) if USE_SCAN_O_PRODUCER and fwd
                                and cfg.TERMS == 2 and not cfg.SCAN_O_MC else 0)


def planes_config(p, varlen=False, wgmma=False, keep=True, scan_o_wg=False):
    """The Config of ForwardPlan, and of a BackwardPlan that takes its kept stages: config's
    chunk length, the fused scan from the planes; a ForwardPlan that keeps none (not ``keep``)
    splits its operands in two terms, not three (TERMS), and takes no wgmma in dv's entry, but
    with ``scan_o_wg`` (a Hopper GPU) in scan_o's products where its chunks are of 64 steps
    and its planes of 128 or 256 keys (SCAN_O_WG: a warpgroup a key half, of 64 or 128). One
    that keeps (``keep``) takes scan_o by wgmma (``scan_o_wg``) where its backward's S0 come
    from the same kernel (scan_o_s0, v41). In defines a
    forward's rows entry takes TERMS and its dv entry (o) and scores (W) the fewer of TERMS and
    DV_TERMS: so the W a forward keeps is the one its backward would make (v37)."""
    cfg = config(p, varlen, wgmma=wgmma)._replace(SCAN=True, PLANES=True)
    wg = scan_o_wg and cfg.BT == 64 and planes(p)[0] in (128, 256)
    if keep:
        return cfg._replace(SCAN_O_WG=wg and scan_o_s0(p, cfg, varlen))
    return cfg._replace(TERMS=2, WGMMA=False, SCAN_O_WG=wg)


def use_wgmma():
    """Whether the plans take dv's wgmma entry: USE_WGMMA, on a Hopper GPU."""
    return USE_WGMMA and hopper()


def use_scan_o_wg():
    """Whether a ForwardPlan's scan_o takes wgmma where it can: USE_SCAN_O_WG, on a Hopper GPU."""
    return USE_SCAN_O_WG and hopper()


def planes(p):
    """(KP, VP): the columns of a plane of q A, k D and of v, do (K and V rounded up to whole
    GEMM tiles)."""
    return tiles(p.K) * GT, tiles(p.V) * GT


def smem(cfg):
    """The planes scan's dynamic shared memory bytes (the kernel checks it as SMEM_BYTES): RING
    stages of the TERMS + 1 planes' steps (16 or 32) of a GT-wide tile, rows padded by 8
    bfloat16; 0 without PLANES."""
    if not cfg.PLANES:
        return 0
    sk = 16 if cfg.BT % 32 else 32
    return RING * 2 * (cfg.TERMS + 1) * sk * (GT + 8)


def scan_o_smem(p, cfg, fwd=True):
    """scan_o's dynamic shared memory bytes (the kernel's FO_BYTES, which it checks): two slots
    of a chunk's operands (scale q A's and k D's two planes of BT rows of KP + 8 bfloat16, v's
    plane of FV + 8 columns, W's BT x BT + 4 floats, A_end's KP) and o^T's two key halves (FV
    rows of BT + 8 floats each: 199,680 bytes at K = 256); with SCAN_O_WG the planes of q A, k D
    unpadded (wgmma's layouts, 1,024-byte aligned: 1,024 bytes more), k D's TERMS of them, and
    W's h, m planes (BT x BT bfloat16 each), and with three terms one half of o^T (227,328
    bytes at K = 256); in a backward (not ``fwd``) only k D's planes, v's and A_end (109,568
    bytes at K = 256)."""
    kp, bt = planes(p)[0], cfg.BT
    if cfg.SCAN_O_WG:
        o = 2 * 2 * bt * kp + 4 * bt * bt + 4 * bt * (bt + 4) + 4 * (4 - cfg.TERMS) * FV * (bt + 8)
        return 2 * cfg.TERMS * bt * kp + 2 * bt * (FV + 8) + 4 * kp + 1024 + (o if fwd else 0)
    f32 = 4 * (bt * (bt + 4) + kp + 2 * FV * (bt + 8)) + 2 * bt * (FV + 8)
    return 8 * bt * (kp + 8) + f32


def scan_o_fits(p, cfg, varlen=False, limits=None):
    """Whether a ForwardPlan of Config ``cfg`` (for Problem ``p``, packed where ``varlen``) runs
    scan_o on a GPU of ``limits`` ((SM count, opt-in shared memory bytes a block): the current
    one's where None): USE_SCAN_O, one that keeps nothing (two terms), at most 256 keys (its
    state is KP / 2 registers a thread), its shared memory within the opt-in limit (at K = 256
    and chunks of 64, 195 KiB: a Hopper GPU's 227, not an A100's 163) and SCAN_O_FROM blocks an
    SM (SCAN_O_WIDE times that at K > 128). One that keeps its stages (three terms) runs it
    where planes_config gave it SCAN_O_WG: then always, as its backward's S0 come from scan_o
    too (v41)."""
    if cfg.TERMS == 3:
        return cfg.SCAN_O_WG
    sms, smem = limits or device_limits()
    return (USE_SCAN_O and cfg.TERMS == 2 and planes(p)[0] <= 256 and scan_o_smem(p, cfg) <= smem
            and chunks(p, cfg.BT, varlen)[0] * tiles(p.V)
            >= SCAN_O_FROM * (SCAN_O_WIDE if p.K > 128 else 1) * sms)


def forward_config(p, varlen=False, keep=False, limits=None):
    """The Config a ForwardPlan of Problem ``p`` (packed where ``varlen``; keeping its stages
    where ``keep``) starts from on the current device: planes_config with its wgmma forms
    (scan_o's: USE_SCAN_O_WG, or one that keeps nothing at SCAN_O_WG_KEYS, on a Hopper GPU).
    With ``limits`` (a GPU's, not asked) not SCAN_O_WG_KEYS' form: where it would run, on a
    Hopper GPU, mma.sync's fits as well (scan_o_smem 199,680 and 212,992 bytes at 256 keys)."""
    wg = limits is None and (use_scan_o_wg()
                             or (not keep and planes(p)[0] in SCAN_O_WG_KEYS and hopper()))
    return planes_config(p, varlen, use_wgmma(), keep, wg)


def scan_o_runs(p, varlen=False, limits=None):
    """Whether a ForwardPlan that keeps nothing, for Problem ``p`` (packed where ``varlen``),
    runs scan_o on a GPU of ``limits`` (scan_o_fits' of its Config)."""
    return scan_o_fits(p, forward_config(p, varlen, limits=limits), varlen, limits)


def scan_o_mc(p, cfg):
    """Whether a ForwardPlan of Config ``cfg`` for Problem ``p`` that runs scan_o runs it as
    clusters (SCAN_O_MC, v42): USE_SCAN_O_MC, scan_o's wgmma form (SCAN_O_WG, on a Hopper GPU) in
    one that keeps nothing (two terms), and 2, 4 or 8 value tiles of FV (a cluster of a
    sequence-head's blocks: at most 8 CTAs, and parts of the planes of whole 16 bytes)."""
    return USE_SCAN_O_MC and cfg.SCAN_O_WG and cfg.TERMS == 2 and tiles(p.V) in (2, 4, 8)


def scan_o_vrows(p, cfg):
    """Whether a ForwardPlan of Config ``cfg`` for Problem ``p`` that runs scan_o reads v's rows
    from v itself (VROWS, v43): USE_VROWS, one that keeps nothing (two terms: one that keeps its
    stages keeps v's plane for the backward), V a multiple of 8 (scan_o's copies of 16 bytes)."""
    return USE_VROWS and cfg.TERMS == 2 and p.V % 8 == 0


def scan_o_warps(p, cfg=None):
    """The producer warps of scan_o (SCAN_O_PRODUCER) at p's keys: 2 above 128 keys, 4 at 128
    or fewer (v49, H100: GLA-1.3B's scan_o 0.86 ms without, 0.75-0.76 with 2, 0.76-0.77 with 4;
    GLA-340M's 0.294, 0.287-0.290, 0.262-0.266); by wgmma (Config ``cfg``'s SCAN_O_WG), 4: a
    warpgroup, whose registers setmaxnreg gives to the products (v52)."""
    return 4 if cfg is not None and cfg.SCAN_O_WG else 2 if p.K > 128 else 4


def scan_o_producer(d):
    """The producer warps with which the build of defines ``d`` runs scan_o (NTF + 32 times as
    many threads): SCAN_O_PRODUCER, on a GPU of compute capability 9.0 or more (the kernel's
    own test); else 0."""
    return d["SCAN_O_PRODUCER"] if d["SCAN_O_PRODUCER"] and capability() >= 90 else 0


def scan_dv_smem(p, cfg):
    """scan_dv's dynamic shared memory bytes (the kernel's FD_BYTES, which it checks): k D's two
    planes and scale q A's TERMS (BT x KP bfloat16 each, in the 128-byte swizzle, 1,024-byte
    aligned: 1,024 bytes more, v67), W's two split planes and its float32 rows (BT x BT + 4),
    do's plane of FV + 8 columns, A_end's KP floats, dv^T's second half (FV rows of BT + 8
    floats) and the rowsum's four row groups of KP floats: 231,424 bytes at K = 256 (a Hopper
    GPU's 227 KiB, with 1 to spare)."""
    kp, bt = planes(p)[0], cfg.BT
    return ((2 + cfg.TERMS) * bt * kp * 2 + 4 * bt * bt + 2 * bt * (FV + 8)
            + 4 * (bt * (bt + 4) + kp + FV * (bt + 8) + 4 * kp) + 1024)


def scan_dv_fits(p, cfg, varlen=False):
    """Whether a backward of Config ``cfg`` (for Problem ``p``, packed where ``varlen``) runs
    scan_dv: USE_SCAN_DV on a Hopper GPU, from the planes (PLANES) with chunks of 64 steps,
    planes of 128 or 256 keys, dv in two terms, no wgmma dv entry, its shared memory within the
    device's opt-in limit and SCAN_DV_FROM blocks an SM."""
    if not (USE_SCAN_DV and hopper()):
        return False
    sms, smem = device_limits()
    return (cfg.PLANES and cfg.BT == 64 and not cfg.WGMMA
            and cfg.DV_TERMS == 2 and planes(p)[0] in (128, 256) and scan_dv_smem(p, cfg) <= smem
            and chunks(p, cfg.BT, varlen)[0] * tiles(p.V) >= SCAN_DV_FROM * sms)


def scan_o_s0(p, cfg, varlen=False):
    """Whether the S0 of a backward of Config ``cfg`` that runs scan_dv, and those of the forward
    that keeps its stages for it, can come from scan_o's wgmma form (v41; USE_SCAN_O_WG decides
    whether they do): where scan_dv_fits and K is whole key tiles (KP; at K = 100 the kept
    forward's build spilled 20 bytes at 255 registers)."""
    return p.K % GT == 0 and scan_dv_fits(p, cfg, varlen)


def dv_smem(cfg):
    """dv's dynamic shared memory bytes: DV_SMEM with WGMMA, else 0 (static)."""
    return DV_SMEM if cfg.WGMMA else 0


def workspace(p, cfg, varlen=False, fwd=False, keep=False, scan_o=False):
    """{name: floats} of the float32 workspaces, in order (the kernel's parameter names); qa's
    room is reused by sd, written after qa's last read (the planes scan reads no qa: its room is
    sd's only). es holds rowsum(E S0) in one part a state tile's columns where the scan is fused
    (intra adds them). With PLANES pl holds the bfloat16 planes (TERMS of scale q A, TERMS of
    k D, 1 of v, 1 of do a chunk, planes()) that every GEMM stage reads instead of kd, vp and dp
    (none).
    ``fwd`` (ForwardPlan): st, ae, ww and the planes only (with ``scan_o`` no st: no chunk's S0
    goes through memory); ``keep`` (a backward from them): all but those (KEPT)."""
    NH, NC = chunks(p, cfg.BT, varlen)
    NB = NH * NC
    C, K, V = cfg.BT, p.K, p.V
    parts = tiles(V) if cfg.SCAN else 1
    kp, vp = planes(p)
    rows = 0 if cfg.PLANES else 1                  # kd, vp, dp: the planes instead
    bwd = 0 if fwd else 1                          # the backward's own
    fw = 0 if keep else 1                          # the forward's (KEPT)
    return dict(st=(0 if scan_o else fw) * NB * K * V, et=bwd * NB * K * V, qa=bwd * NB * C * K,
                kd=rows * NB * C * K, vp=rows * NB * C * V, dp=rows * NB * C * V, ae=fw * NB * K,
                es=bwd * parts * NB * K, mm=bwd * NB * C * C, ww=fw * NB * C * C,
                ev=bwd * NB * C * K, ar=bwd * 2 * NB * C * K,
                pl=fw * NB * C * (cfg.TERMS * kp + vp) if cfg.PLANES else 0)


def layout(sizes):
    """({name: float offset} in one workspace, its floats): each workspace ALIGN-aligned, sd in
    qa's room."""
    at, base = {}, 0
    for name, n in sizes.items():
        at[name] = base
        base += -(-n // ALIGN) * ALIGN
    at["sd"] = at["qa"]
    return at, base


def forward_bytes(p, varlen=False, keep=True, limits=None):
    """The bytes of the workspace a ForwardPlan made with ``keep`` holds for Problem ``p``
    (packed where ``varlen``): each chunk's S0 (float32) and the planes, O(T H K V / BT) (one
    that keeps none holds less: two planes of q A and k D, not three, and no S0 where scan_o
    runs on a GPU of ``limits``, scan_o_fits')."""
    if keep:
        return 4 * layout(workspace(p, planes_config(p, varlen), varlen, fwd=True))[1]
    cfg = forward_config(p, varlen, limits=limits)
    scan_o = scan_o_fits(p, cfg, varlen, limits)
    return 4 * layout(workspace(p, cfg, varlen, fwd=True, scan_o=scan_o))[1]


KEPT = ("st", "ae", "ww", "pl")  # the workspaces a backward takes from a ForwardPlan's (keep=)


class Kept(NamedTuple):
    """A ForwardPlan call's stages kept for the backward (ForwardPlan.run(keep=True)): its
    workspace (each chunk's S0, A_end, W, the planes of scale q A, k D and v), the guard's flag,
    and what they were made for (a BackwardPlan(keep=True) checks it)."""
    ws: object           # the float32 workspace (CuPy, forward_bytes), ForwardPlan.at's layout
    flag: object         # the forward's guard flag (a device int32; 1: the planes are not valid)
    scale: float         # the scale baked into the planes of q A
    key: tuple           # (Problem, varlen, BT)


def tiles(n):
    """The GEMM entries' output tiles over n columns (or rows)."""
    return -(-n // GT)


POINTERS = tuple(name for name, kind in CHUNK_BACKWARD if kind == PTR)   # the entries' pointers


def pointers(ws, at, **arrays):
    """The entries' pointer arguments, in CHUNK_BACKWARD's order: each workspace of ``at``
    ({name: float offset}) in ``ws`` (float32 CuPy), each of ``arrays`` (CuPy or None, or a
    device address) by its parameter name; 0 for the rest (what a stage set does not use)."""
    got = {name: ws.data.ptr + 4 * x for name, x in at.items()}
    got.update((name, x if isinstance(x, int) else address(x)) for name, x in arrays.items())
    unknown = set(got) - set(POINTERS)
    assert not unknown, unknown
    return tuple(got.get(name, 0) for name in POINTERS)


def chunk_offsets(p, BT, cu_seqlens):
    """[N + 1] int64 on the GPU: sequence n's chunks of BT steps start at coff[n] (each at
    least one: ceil(len / BT), clamped like gda_seq_rows)."""
    import cupy
    cu = cu_seqlens.astype(np.int64)
    bos = cupy.clip(cu[:-1], 0, p.T)
    eos = cupy.minimum(cupy.maximum(cu[1:], bos), p.T)
    coff = cupy.zeros((p.N + 1,), np.int64)
    cupy.cumsum(cupy.maximum((eos - bos + BT - 1) // BT, 1), out=coff[1:])
    return coff


class BackwardPlan:
    """gda_chunk_bwd compiled and sized for one Problem (``varlen``: with cu_seqlens, of int64
    where ``seq_int64``) on the current device, with the reverse loop's plan as its guarded
    fall-back: a call allocates the gradients and one workspace (the larger of the two
    families') and queues every launch without a host sync."""

    def __init__(self, p, varlen=False, seq_int64=False, cfg=None, keep=False):
        if keep or cfg is None:                 # (a cfg given: as given)
            cfg = (planes_config(p, varlen, use_wgmma()) if keep
                   else config(p, varlen, device_limits()[0], use_wgmma()))
            so = not keep and use_scan_o_wg() and scan_o_s0(p, cfg, varlen)   # (S0 by scan_o, v41)
            cfg = cfg._replace(SCAN_DV=scan_dv_fits(p, cfg, varlen), SCAN_O_WG=so)
            cfg = cfg._replace(PANELS=panels(p, cfg, keep=keep))
        self.p, self.varlen = p, varlen
        self.cfg = cfg
        self.keep = keep
        C, K, V = self.cfg.BT, p.K, p.V
        NH, self.NC = chunks(p, C, varlen)
        NB = self.NB = NH * self.NC if p.N else 0
        d = defines(p, self.cfg, seq_int64, keep=keep)
        n_kt = -(-K // self.cfg.KT)

        vecs = V // 4 if V % 4 == 0 else V                               # (states) loads a
        rows = NTP // (128 if vecs >= 128 else -(-vecs // 32) * 32)      #  key row, rows a block
        tk, tv = tiles(K), tiles(V)
        shape = {"pack": (NB, NTP, 0), "local": (NB * 2 * tk * tv, NTG, 0),   # grid, threads,
                 "states": (-(-NH * K // rows), NTP, 0),                      #  dynamic shared
                 "scan": (NH * tk * tv, NTG, d["SMEM_BYTES"]),                #  memory
                 "scan_o": (NH * tv, NTF, scan_o_smem(p, self.cfg, fwd=False)),
                 "scan_dv": (NH * tv, NTF + FD_PT, scan_dv_smem(p, self.cfg)),
                 "rows": (NB * 3 * tk, NTG, 0), "scores": (NB, NTS, 0),
                 "intra": (NB * n_kt, self.cfg.KT, 0),
                 "dv": (NB * tv, NTG, dv_smem(self.cfg))}
        self.stages = [(n, Launch(FAMILY.function("gda_chunk_bwd_" + e, d, shape[e][2]),
                                  CHUNK_BACKWARD, *shape[e], T=p.T, NH=NH, N=p.N, H=p.H,
                                  NC=self.NC))
                       for n, e in backward_stages(self.cfg, keep)]
        self.sizes = workspace(p, self.cfg, varlen, keep=keep)
        self.loop = recurrent_bwd.plan(p, seq_int64)
        self.at, floats = layout(self.sizes)
        # (keep) KEPT's offsets in a Kept's workspace: ForwardPlan's layout
        self.kept_at = layout(workspace(p, self.cfg, varlen, fwd=True))[0] if keep else None
        self.ws_floats = max(floats, sum(self.loop.ws))

    def scratch_bytes(self, with_h0):
        """The bytes a call allocates (``rounded``): the gradients (dinitial_state where
        ``with_h0``), the guard's flag and the workspace; with cu_seqlens the chunk offsets and
        the temporaries that count them (SMALL of N + 1 int64 each)."""
        p = self.p
        small = [8 * (p.N + 1)] * SMALL if self.varlen else []
        return rounded(*recurrent_bwd.gradient_bytes(p, with_h0), 4, 4 * self.ws_floats, *small)

    def __call__(self, q, k, v, g, do, scale, h0, dht, cu_seqlens=None):
        """(dq, dk, dv, dg, dh0) as recurrent_bwd.BackwardPlan's; arrays are contiguous CuPy."""
        return self.run(q, k, v, g, do, scale, h0, dht, cu_seqlens)[0]

    def run(self, q, k, v, g, do, scale, h0, dht, cu_seqlens=None, fallback=True, stages=7,
            ws=None, kept=None):
        """(gradients, the guard's flag: a device int, 1 where it was hit). ``kept`` (a plan made
        with keep=True): the Kept of the ForwardPlan call on the same inputs, whose st, ae, ww and
        planes this call takes instead of making them (its flag starts as the forward's). Tests:
        ``fallback=False`` leaves out the reverse loop (the chunked form's own results),
        ``stages`` runs the launches of that stage's number or less (with SCAN_DV, E and dv's
        scan_dv is numbered 3 but needs W, stage 5: its E from 3 on, its dv from 5), and ``ws``
        (float32, at least ws_floats) is the workspace to use."""
        import cupy
        p = self.p
        if self.keep != (kept is not None):
            raise ValueError("chunk_bwd: a plan made with keep=True takes kept=, and only it")
        if kept is not None and (kept.key != (p, self.varlen, self.cfg.BT) or kept.scale != scale):
            raise ValueError(f"chunk_bwd: kept stages of {kept.key} at scale {kept.scale}, for a "
                             f"backward of {(p, self.varlen, self.cfg.BT)} at scale {scale}")
        dq, dk = (empty((p.B, p.T, p.H, p.K), np_dtype(p.dtype)) for _ in range(2))
        dv = empty((p.B, p.T, p.H, p.V), np_dtype(p.dtype))
        dg = empty((p.B, p.T, p.H, p.K), np_dtype(p.g_dtype))
        dh0 = empty((p.N, p.H, p.K, p.V), np_dtype("float32")) if h0 is not None else None
        grads = (dq, dk, dv, dg, dh0)
        flag = kept.flag.copy() if kept is not None else cupy.zeros((1,), np.int32)
        if self.NB == 0:
            return self.loop(q, k, v, g, do, scale, h0, dht, cu_seqlens, out=grads), flag
        coff = chunk_offsets(p, self.cfg.BT, cu_seqlens) if self.varlen else None
        if ws is None:
            ws = empty((self.ws_floats,), np_dtype("float32"))   # kept alive until all are queued
        kept_ptrs = ({name: kept.ws.data.ptr + 4 * self.kept_at[name] for name in KEPT}
                     if kept is not None else {})
        ptrs = pointers(ws, self.at, q=q, k=k, v=v, g=g, do=do, h0=h0, dht=dht, flag=flag,
                        dq=dq, dk=dk, dv=dv, dg=dg, dh0=dh0, cu_seqlens=cu_seqlens, coff=coff,
                        **kept_ptrs)
        for n, stage in self.stages:                                        # 1 .. 7
            if n <= stages:
                stage(ptrs, scale)
        if fallback:                                                        # 8
            self.loop(q, k, v, g, do, scale, h0, dht, cu_seqlens, out=grads, ws=ws,
                      only_if=flag.data.ptr)
        return grads, flag


class ForwardPlan:
    """The forward from this family's stages (FWD; bfloat16 inputs, PLANES; docs/perf-notes.md,
    v24): pack (scale q A, k D and v as planes), the scan's forward half (each chunk's S0, and
    the final state in dh0's place), scores (W) and dv's entry computing o = (scale q A)^T S0 +
    scale W^T v; in one that keeps nothing, where scan_o_fits, pack, scores and scan_o, which
    does the scan's and dv's work with the state on chip (v38; with scan_o_mc its blocks as
    clusters that share each chunk's planes, v42; with VROWS, v43 and v44, scores and scan_o, v's
    rows from v and scores writing the planes of q A and k D), and likewise in one that keeps its
    stages where planes_config gave it SCAN_O_WG (scan_o then stores each S0, v41). The
    guard's fall-back is the chunk forward (chunk.ChunkPlan), launched after them and run only
    where the guard was hit (only_if): it overwrites o and the final state, so every input is
    exact, without a host sync. The same call as chunk.ChunkPlan's. A plan made with ``keep``
    can keep its stages for the backward (run(keep=True)), and splits each float32 operand in
    three bfloat16 terms (exact to float32, as the backward needs), but makes W and o in
    DV_TERMS, as the backward makes W (v37); one without keeps none and splits them in two (the
    contract of bfloat16 inputs, as gda_chunk_fwd's bfloat16 path; docs/perf-notes.md, v34)."""

    def __init__(self, p, varlen=False, seq_int64=False, keep=False):
        self.p, self.varlen = p, varlen
        cfg = forward_config(p, varlen, keep)
        self.scan_o = scan_o_fits(p, cfg, varlen)          # (the scan and o as one kernel)
        self.cfg = cfg._replace(SCAN_O_MC=self.scan_o and scan_o_mc(p, cfg),
                                VROWS=self.scan_o and scan_o_vrows(p, cfg))
        self.cfg = self.cfg._replace(PANELS=panels(p, self.cfg, fwd=True))
        NH, self.NC = chunks(p, self.cfg.BT, varlen)
        self.NB = NH * self.NC if p.N else 0
        d = defines(p, self.cfg, seq_int64, fwd=True)
        tv = tiles(p.V)
        shape = {"pack": (self.NB, NTP, 0), "scores": (self.NB, NTS, 0),
                 "scan_o": (NH * tv, NTF + 32 * scan_o_producer(d), scan_o_smem(p, self.cfg)),
                 "scan": (NH * tiles(p.K) * tv, NTG, d["SMEM_BYTES"]),
                 "dv": (self.NB * tv, NTG, dv_smem(self.cfg))}
        self.stages = [Launch(FAMILY.function("gda_chunk_bwd_" + e, d, shape[e][2]), CHUNK_BACKWARD,
                              *shape[e], T=p.T, NH=NH, N=p.N, H=p.H, NC=self.NC)
                       for e in forward_stages(self.scan_o, self.cfg.VROWS)]
        self.sizes = workspace(p, self.cfg, varlen, fwd=True,  # (one that keeps: every S0)
                               scan_o=self.scan_o and self.cfg.TERMS == 2)
        self.at, self.ws_floats = layout(self.sizes)
        self.fallback = chunk.plan(p, seq_int64)

    def scratch_bytes(self, want_final):
        """The bytes a call with ``out`` given allocates (``rounded``): the final state where
        ``want_final``, the guard's flag, the workspace, the fall-back's workspace (it allocates
        it whether it runs or not) and with cu_seqlens the chunk offsets and their temporaries
        (BackwardPlan.scratch_bytes)."""
        small = [8 * (self.p.N + 1)] * SMALL if self.varlen else []
        return (self.fallback.scratch_bytes(want_final)
                + rounded(4, 4 * self.ws_floats, *small))

    def __call__(self, q, k, v, g, scale, h0, cu_seqlens, want_final, out, flag=None):
        """o [B, T, H, V] (and the final state); arrays are contiguous CuPy. ``flag`` (tests): a
        device int32 that receives the guard's flag (1 where it was hit)."""
        return self.run(q, k, v, g, scale, h0, cu_seqlens, want_final, out, flag)[:2]

    def run(self, q, k, v, g, scale, h0, cu_seqlens, want_final, out, flag=None, keep=False):
        """(o, the final state or None, Kept or None): as a call, and with ``keep`` (a plan made
        with keep=True) the stages a BackwardPlan(keep=True) takes (this call's workspace, held
        by the Kept; None where there is nothing to chunk)."""
        import cupy
        p = self.p
        if keep and self.cfg.TERMS != 3:
            raise ValueError("chunk_bwd: run(keep=True) needs a ForwardPlan made with keep=True")
        if flag is None:
            flag = cupy.zeros((1,), np.int32)
        else:
            flag.fill(0)
        if self.NB == 0:                        # nothing to chunk: the chunk forward, as it is
            return (*self.fallback(q, k, v, g, scale, h0, cu_seqlens, want_final, out), None)
        o = out if out is not None else empty((p.B, p.T, p.H, p.V), np_dtype(p.dtype))
        ht = empty((p.N, p.H, p.K, p.V), np_dtype("float32")) if want_final else None
        coff = chunk_offsets(p, self.cfg.BT, cu_seqlens) if self.varlen else None
        ws = empty((self.ws_floats,), np_dtype("float32"))   # kept alive until all are queued
        # (FWD: dv's entry writes o in dv's place, the final state in dh0's)
        ptrs = pointers(ws, self.at, q=q, k=k, v=v, g=g, h0=h0, flag=flag, dv=o, dh0=ht,
                        cu_seqlens=cu_seqlens, coff=coff)
        for stage in self.stages:
            stage(ptrs, scale)
        self.fallback(q, k, v, g, scale, h0, cu_seqlens, want_final, o, only_if=flag.data.ptr,
                      ht=ht)
        kept = Kept(ws, flag, scale, (p, self.varlen, self.cfg.BT)) if keep else None
        return o, ht, kept


def plan(p, varlen=False, seq_int64=False, keep=False):
    """The memoised BackwardPlan of Problem ``p`` (with cu_seqlens where ``varlen``, of int64
    where ``seq_int64``; from a ForwardPlan's kept stages where ``keep``) on the current
    device."""
    return cached(BackwardPlan, p, varlen, seq_int64, None, keep)


def forward_plan(p, varlen=False, seq_int64=False, keep=False):
    """The memoised ForwardPlan of Problem ``p``, as plan() (one that can keep its stages where
    ``keep``)."""
    return cached(ForwardPlan, p, varlen, seq_int64, keep)
