"""The one dispatch point: which kernel family runs a gated_attention call.

``method="auto"`` picks by the table below; a named family runs as asked. Plain Python, so the
table is unit-tested without a GPU.
"""
# family -> where it exists
METHODS = {
    "recurrent": ("cpu", "gpu"),   # GPU: kernels/gda_recurrent_fwd.cu; CPU: the loop reference
    "chunk": ("cpu", "gpu"),       # GPU: kernels/gda_chunk_fwd.cu (K <= 128);
}                                  # CPU: reference.gated_attention_chunked (numbered einsum steps)

CHUNK_MAX_K = 128       # gda_chunk_fwd: one scan thread per key column and direction (256 threads)

# GPU crossovers of method="auto" (H200, scripts/crossover.py --quick with the kernels of v11:
# both families in sequence segments, the recurrent one staged by cp.async with tiles by the
# grid; the numbers are in docs/perf-notes.md, "Dispatch table"): rows (K_min, NH_min, L_min)
# tried in order; the chunked kernel where K >= K_min, N*H >= NH_min and the mean sequence
# length is >= L_min; the recurrent kernel elsewhere, so always at K <= 32.
CHUNK_FROM = (
    (65, 32, 128),      # K 65..128, N*H >= 32: 1.5-2.6x faster at every T measured
    (33, 64, 128),      # K 33..128, N*H >= 64: 1.0-2.0x
    (65, 16, 256),      # K 65..128, N*H >= 16, T >= 256: 1.1-1.9x (at K <= 64 the recurrent
                        #   kernel now wins N*H 16..63 at T = 256 by 10-28 %)
    (33, 1, 512),       # K 33..128, T >= 512: 1.0-1.9x
)


def mean_len(p):
    """Mean sequence length: T, or the packed tokens over the sequences for varlen."""
    return p.B * p.T / max(p.N, 1)


def pick(fn, method, p, gpu):
    """The family for Problem ``p`` on the GPU (``gpu``) or the CPU; errors for unknown names
    and for shapes the named family cannot take."""
    where = "gpu" if gpu else "cpu"
    if method == "auto":
        if not gpu:
            return "chunk"
        nh, L = p.N * p.H, mean_len(p)
        wins = p.K <= CHUNK_MAX_K and any(p.K >= k0 and nh >= nh0 and L >= l0
                                          for k0, nh0, l0 in CHUNK_FROM)
        return "chunk" if wins else "recurrent"
    if not isinstance(method, str) or method not in METHODS:
        names = ", ".join(repr(m) for m in ("auto", *METHODS))
        raise ValueError(f"{fn}: method must be one of {names}, got {method!r}")
    if where not in METHODS[method]:
        here = ", ".join(repr(m) for m in ("auto", *METHODS) if m == "auto" or where in METHODS[m])
        raise ValueError(f"{fn}: method {method!r} has no {where.upper()} implementation; "
                         f"{where.upper()} methods are {here}")
    if gpu and method == "chunk" and p.K > CHUNK_MAX_K:
        raise ValueError(f"{fn}: method 'chunk' on the GPU takes a head dimension K of at most "
                         f"{CHUNK_MAX_K}, got K={p.K}; use method='recurrent' or 'auto'")
    return method
