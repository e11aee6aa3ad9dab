"""Launcher of gda_step (kernels/gda_step.cu): one token per sequence, the state updated in place
(decode). Bandwidth-bound: each state element is read and written once.
"""
from cupy_gda._launch import DTYPE_CODE, STEP, Family, Launch, address, cached, empty, np_dtype

FAMILY = Family("gda_step", ("common.cuh",), {"gda_step": STEP})


def tiles(K, V, align):
    """(KW, VEC): KW warps a block (more for larger K, so each holds at most 16 rows), VEC*4-byte
    state accesses where V and the state's address alignment ``align`` (bytes, a power of 2 up
    to 16) allow."""
    VEC = next(n for n in (4, 2, 1) if V % n == 0 and align % (4 * n) == 0)
    KW = 4 if K <= 32 else 8 if K <= 128 else 16
    return KW, VEC


def alignment(ptr):
    """The largest power of 2 up to 16 that divides ``ptr``."""
    return next(a for a in (16, 8, 4, 2, 1) if ptr % a == 0)


def defines(p, idx_int64, align):
    KW, VEC = tiles(p.K, p.V, align)
    return dict(K_DIM=p.K, V_DIM=p.V, IO_DTYPE=DTYPE_CODE[p.dtype], G_DTYPE=DTYPE_CODE[p.g_dtype],
                LOG_GATE=int(p.log_gate), IDX_INT64=int(idx_int64), KW=KW, VEC=VEC)


class StepPlan:
    """gda_step compiled and sized for one Problem on the current device."""

    def __init__(self, p, idx_int64, align):
        d = defines(p, idx_int64, align)
        NV = -(-p.V // (32 * d["VEC"]))
        self.grid, self.block = (p.B * p.H * NV,), (d["KW"] * 32,)
        self.launch = Launch(FAMILY.function("gda_step", d), STEP, self.grid[0], self.block[0], 0,
                             H=p.H, N=p.N, NV=NV)
        self.o_shape, self.o_dtype = (p.B, p.H, p.V), np_dtype(p.dtype)

    def __call__(self, q, k, v, g, state, scale, state_indices, out):
        """o [B, H, V]; ``state`` is updated in place."""
        o = out if out is not None else empty(self.o_shape, self.o_dtype)
        if self.grid[0]:
            self.launch((q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, o.data.ptr, state.data.ptr,
                         address(state_indices)), scale)
        return o


def plan(p, idx_int64, align):
    """The memoised StepPlan of (Problem, state_indices int64, state alignment) on the current
    device."""
    return cached(StepPlan, p, idx_int64, align)
