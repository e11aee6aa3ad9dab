"""The one dispatch point: which kernel family runs a gated_attention call.

``method="auto"`` picks by the table below; a named family runs as asked, or the call ends in
a ValueError that names the limit. Plain Python, so the table is unit-tested without a GPU.
"""
from cupy_gda import chunk, chunk_bwd
from cupy_gda._launch import device_limits, mean_len

# family -> where it exists
METHODS = {
    "recurrent": ("cpu", "gpu"),   # GPU: cupy_gda/recurrent.py; CPU: the loop,
                                   #   reference.gated_attention_recurrent
    "chunk": ("cpu", "gpu"),       # GPU: cupy_gda/chunk.py (K <= chunk.MAX_K);
}                                  # CPU: reference.gated_attention_chunked (numbered steps)

# the backward's families (gated_attention_backward)
BACKWARD_METHODS = {
    "recurrent": ("cpu", "gpu"),   # GPU: cupy_gda/recurrent_bwd.py; CPU:
                                   #   reference.gated_attention_backward_recurrent
    "chunk": ("cpu", "gpu"),       # GPU: cupy_gda/chunk_bwd.py; CPU:
}                                  #   reference.gated_attention_backward_chunked
# GPU: method="auto" runs the chunked backward where the mean sequence length is at least this;
# the reverse loop below it (docs/perf-notes.md, v19)
BACKWARD_CHUNK_FROM = 512
# CPU: method="auto" runs the chunked backward from this mean sequence length where K V is at
# least CPU_BACKWARD_CHUNK_KV, the loop elsewhere (2-core x86, NumPy: 1.3-2.2x faster from
# K = V = 64 at every length measured from 63; slower or level at K = V = 24; v19)
CPU_BACKWARD_CHUNK_FROM, CPU_BACKWARD_CHUNK_KV = 32, 4096

# CPU: method="auto" runs the loop (reference.gated_attention_recurrent): it measured faster than
# the chunked NumPy form at every shape tried (docs/perf-notes.md, "CPU paths")
CPU_AUTO = "recurrent"

# GPU crossovers of method="auto" (H200, scripts/sweep.py with the kernels of v11: both
# families in sequence segments, the recurrent one staged by cp.async with tiles by the grid;
# the numbers are in docs/perf-notes.md, "Dispatch table"): rows (K_min, NH_min, L_min) tried in
# order; the chunked kernel where K >= K_min, N*H >= NH_min and the mean sequence length is
# >= L_min; the recurrent kernel elsewhere, so always at K <= 32.
CHUNK_FROM = (
    (65, 32, 128),      # K 65..128, N*H >= 32: 1.5-2.6x faster at every T measured
    (33, 64, 128),      # K 33..128, N*H >= 64: 1.0-2.0x
    (65, 16, 256),      # K 65..128, N*H >= 16, T >= 256: 1.1-1.9x (at K <= 64 the recurrent
                        #   kernel now wins N*H 16..63 at T = 256 by 10-28 %)
    (33, 1, 512),       # K 33..128, T >= 512: 1.0-1.9x
)


# GPU, "chunk": bfloat16 inputs run as the backward family's stages (chunk_bwd.ForwardPlan, the
# GEMMs' operands split once into planes) where the mean sequence length is at least
# PLANES_FORWARD_FROM, K at least chunk.MAX_KT and the call's workspace (the one that keeps the
# stages where it keeps them) within PLANES_FORWARD_MAX_BYTES, and then where V >= 512, or scan_o
# runs (chunk_bwd.scan_o_runs: SCAN_O_FROM blocks an SM) with PLANES_FORWARD_SCAN_O blocks an SM
# and V >= 192 or the mean length at least 1024, or K > chunk.MAX_KT (gda_chunk_fwd tiles its
# keys) with the scan's blocks (a state tile of a chain each) at least half the SMs; where those
# blocks are fewer than the SMs, only for chains of at most PLANES_FORWARD_CHAIN rows (T, or with
# cu_seqlens every sequence's rows: a chain runs a head's chunks in turn, where gda_chunk_fwd
# splits a long sequence in segments over the idle SMs; longer ones not measured).
# docs/perf-notes.md, v50's rule (scripts/sweep_planes_forward.py on an H100 after v49's producer
# warps, K = 128 and V 128..256, K = 256 and V = 512, T 512..4096, 4..128 sequence-heads): the
# planes with scan_o took 0.77x gda_chunk_fwd's time at big128 (B8 T4096 H16 K = V = 128),
# 0.77x at B8 T4096 H4 and 0.95x at T = 1024 (0.48 scan_o blocks an SM), 1.07x at T = 512 (left
# to gda_chunk_fwd), 0.55-0.81x at V = 256 from 0.97 blocks an SM, 1.19x at 0.24 (left); v46's
# (35 shapes, K 128..256, V 128..512, scan_o by SCAN_O_FROM 0.7) picked 26 at 0.42-0.98x. The
# workspace holds the planes and, kept, every chunk's state (1.7 GiB at GLA-1.3B kept, 0.53
# not; O(T H K V / 64)): above PLANES_FORWARD_MAX_BYTES the call keeps to gda_chunk_fwd, whose
# workspace stays within q's size (a million-token prefill fits).
PLANES_FORWARD_FROM = 512
PLANES_FORWARD_SCAN_O = 0.45
PLANES_FORWARD_CHAIN = 4096
PLANES_FORWARD_MAX_BYTES = 4 << 30


def planes_forward(p, varlen=False, limits=None, keep=False):
    """Whether the chunked forward of Problem ``p`` (packed where ``varlen``; one that keeps its
    stages for the backward where ``keep``) runs as chunk_bwd.ForwardPlan on a GPU of ``limits``
    ((SM count, opt-in shared memory bytes a block): the current one's where None)."""
    if p.dtype != "bfloat16" or p.K < chunk.MAX_KT or mean_len(p) < PLANES_FORWARD_FROM:
        return False
    limits = limits or device_limits()
    if chunk_bwd.forward_bytes(p, varlen, keep, limits) > PLANES_FORWARD_MAX_BYTES:
        return False
    NH = chunk_bwd.chunks(p, 64, varlen)[0]         # the scan's chains: N H, or H where packed
    blocks = NH * chunk_bwd.tiles(p.K) * chunk_bwd.tiles(p.V)      # (its blocks)
    if blocks < limits[0] and p.T > PLANES_FORWARD_CHAIN:
        return False
    scan_o = (chunk_bwd.scan_o_runs(p, varlen, limits)
              and NH * chunk_bwd.tiles(p.V) >= PLANES_FORWARD_SCAN_O * limits[0])
    return (p.V >= 512 or (scan_o and (p.V >= 192 or mean_len(p) >= 1024))
            or (p.K > chunk.MAX_KT and 2 * blocks >= limits[0]))


def _chunk_wins(p):
    nh, L = p.N * p.H, mean_len(p)
    return any(p.K >= k0 and nh >= nh0 and L >= l0 for k0, nh0, l0 in CHUNK_FROM)


def _check_method(fn, method, methods, where, what=""):
    if method != "auto" and (not isinstance(method, str) or method not in methods):
        names = ", ".join(repr(m) for m in ("auto", *methods))
        raise ValueError(f"{fn}: method must be one of {names}{what}, got {method!r}")
    if method != "auto" and where not in methods[method]:
        here = ", ".join(repr(m) for m in ("auto", *methods) if m == "auto" or where in methods[m])
        raise ValueError(f"{fn}: method {method!r} has no {where.upper()} implementation; "
                         f"{where.upper()} methods are {here}")


def pick_backward(fn, method, p, gpu):
    """The family of a gated_attention_backward call of Problem ``p`` on the GPU (``gpu``) or the
    CPU: a named one as asked (both run every Problem the checks let through), else by the
    measured rules above; errors as pick's."""
    _check_method(fn, method, BACKWARD_METHODS, "gpu" if gpu else "cpu")
    if method != "auto":
        return method
    if gpu:
        wins = mean_len(p) >= BACKWARD_CHUNK_FROM
    else:
        wins = mean_len(p) >= CPU_BACKWARD_CHUNK_FROM and p.K * p.V >= CPU_BACKWARD_CHUNK_KV
    return "chunk" if wins else "recurrent"


def pick(fn, method, p, gpu, limits=None):
    """The family for Problem ``p`` on the GPU (``gpu``; ``limits``: its (SM count, opt-in shared
    memory bytes a block), the current device's if None) or the CPU; errors for unknown names
    and for shapes the named family cannot take there."""
    _check_method(fn, method, METHODS, "gpu" if gpu else "cpu")
    if not gpu:
        return CPU_AUTO if method == "auto" else method
    if method == "recurrent":
        return method
    limits = limits or device_limits()
    if method == "auto":
        return "chunk" if _chunk_wins(p) and chunk.refusal(p, *limits) is None else "recurrent"
    why = chunk.refusal(p, *limits)
    if why is None:
        return "chunk"
    raise ValueError(f"{fn}: method 'chunk' on the GPU {why}; use method='recurrent' or 'auto'")
