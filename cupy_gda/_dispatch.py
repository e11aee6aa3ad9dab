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

# GPU crossovers of method="auto" (H200, scripts/crossover.py; numbers in docs/perf-notes.md,
# "Dispatch table"): the chunked kernel from (head dimension K, sequence-heads N*H, mean sequence
# length) on, rows tried in order; the recurrent kernel elsewhere. At K <= 32 the recurrent kernel
# won every measured shape (T up to 2048, N*H up to 128).
CHUNK_FROM = (
    (65, 64, 128),     # K 65..128: 1.2-1.7x faster at N*H >= 64, T >= 128; slower at N*H = 8
    (33, 128, 128),    # K 33..64: 1.1x faster at N*H = 128; slower at N*H <= 64
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
