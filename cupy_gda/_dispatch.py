"""The one dispatch point: which kernel family runs a gated_attention call.

``method="auto"`` picks by the table below; a named family runs as asked. Plain Python, so the
table is unit-tested without a GPU.
"""
# family -> where it exists
METHODS = {
    "recurrent": ("cpu", "gpu"),   # GPU: kernels/gda_recurrent_fwd.cu; CPU: the loop reference
    "chunk": ("cpu",),             # CPU: reference.gated_attention_chunked (numbered einsum steps)
}


def pick(fn, method, p, gpu):
    """The family for Problem ``p`` on the GPU (``gpu``) or the CPU; errors for unknown names."""
    where = "gpu" if gpu else "cpu"
    if method == "auto":
        return "recurrent" if gpu else "chunk"
    if not isinstance(method, str) or method not in METHODS:
        names = ", ".join(repr(m) for m in ("auto", *METHODS))
        raise ValueError(f"{fn}: method must be one of {names}, got {method!r}")
    if where not in METHODS[method]:
        here = ", ".join(repr(m) for m in ("auto", *METHODS) if m == "auto" or where in METHODS[m])
        raise ValueError(f"{fn}: method {method!r} has no {where.upper()} implementation; "
                         f"{where.upper()} methods are {here}")
    return method
