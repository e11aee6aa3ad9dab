"""Launcher of gda_scan (kernels/gda_scan.cu): e_t = a_t e_{t-1} + z_t in time, lane by lane,
forward or reversed; the K-vector scans of cupy_gda/distributed.py. scan_ref beside it is the
NumPy loop it must match (bit for bit where T fits one segment).
"""
import numpy as np

from cupy_gda._launch import SCAN, Family, Launch, address, cached, empty

ENTRIES = ("gda_scan_segments", "gda_scan_carry", "gda_scan_apply")
FAMILY = Family("gda_scan", (), {e: SCAN for e in ENTRIES})
NT = 128                # threads (lanes) a block
TS = 256                # steps a segment


def scan_ref(a, z=None, init=None, reverse=False):
    """The loop: [B, T, *L] arrays a, z (None: 0), init [B, *L] (None: 0); e in a's dtype."""
    e = np.empty_like(a)
    x = np.zeros(a.shape[:1] + a.shape[2:], a.dtype) if init is None else np.array(init, a.dtype)
    steps = range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1])
    with np.errstate(all="ignore"):          # (inf and NaN as the loop makes them)
        for t in steps:
            x = a[:, t] * x + (0 if z is None else z[:, t])
            e[:, t] = x
    return e


class ScanPlan:
    """gda_scan compiled and sized for [B, T, L] on the current device: a call queues the three
    launches (no host sync)."""

    def __init__(self, B, T, L):
        self.B, self.T, self.L = B, T, L
        self.NSEG = max(1, -(-T // TS))
        nlb = -(-L // NT)
        d = dict(NT=NT)
        grids = {"gda_scan_segments": B * self.NSEG * nlb, "gda_scan_carry": B * nlb,
                 "gda_scan_apply": B * self.NSEG * nlb}
        self.launches = [Launch(FAMILY.function(e, d), SCAN, grids[e], NT, 0, T=T, L=L,
                                NSEG=self.NSEG, TS=TS) for e in ENTRIES]
        self.ws_floats = B * self.NSEG * L * 2

    def __call__(self, a, z=None, init=None, reverse=False, out=None):
        """e [B, T, L] float32 (into ``out`` where given); a, z float32 C-contiguous [B, T, L],
        init [B, L]."""
        e = out if out is not None else empty((self.B, self.T, self.L), np.float32)
        if e.size:
            ws = empty((self.ws_floats,), np.float32)      # alive until the launches are queued
            ptrs = (a.data.ptr, address(z), address(init), ws.data.ptr, e.data.ptr)
            for launch in self.launches:
                launch(ptrs, int(reverse))
        return e


def plan(B, T, L):
    """The memoised ScanPlan of [B, T, L] on the current device."""
    return cached(ScanPlan, B, T, L)


def scan(a, z=None, init=None, reverse=False):
    """e_t = a_t e_{t-1} + z_t over axis 1 of [B, T, ...] arrays (reversed: from the end),
    init [B, ...] (None: 0): NumPy arrays by scan_ref, CuPy arrays (computed in float32) by
    gda_scan."""
    if isinstance(a, np.ndarray):
        return scan_ref(a, z, init, reverse)
    import cupy
    B, T = a.shape[:2]
    L = int(np.prod(a.shape[2:]))

    def flat(x, shape):
        return None if x is None else cupy.ascontiguousarray(x, np.float32).reshape(shape)

    e = plan(B, T, L)(flat(a, (B, T, L)), flat(z, (B, T, L)), flat(init, (B, L)), reverse)
    return e.reshape(a.shape)
