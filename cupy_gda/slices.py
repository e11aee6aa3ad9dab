"""Launcher of gda_slice (kernels/gda_slice.cu): the terms a slice of a sequence gets from a
state carried across its edge, on the tensor cores (cupy_gda/distributed.py).

``terms(a, count, reverse)`` makes the gates' running products in one scan order and returns
an object whose ``out`` and ``into`` add the two products with a state: for CuPy arrays a
Terms (the kernels; no host sync), for NumPy arrays a TermsRef, the same in NumPy (the CPU path,
and the form the kernels are tested against). ``gate_terms`` likewise.
"""
import numpy as np

from cupy_gda._launch import SLICE, Family, Launch, address, cached, empty

ENTRIES = ("gda_slice_prods", "gda_slice_enter", "gda_slice_out", "gda_slice_in")
FAMILY = Family("gda_slice", ("common.cuh", "mma.cuh"), {e: SLICE for e in ENTRIES})
DEFINES = dict(IO_DTYPE=0, G_DTYPE=0)        # (common.cuh's; the tensor cores' TF32 path)
BT, TS, NT = 64, 256, 128                    # the kernel's sub-tile, segment, threads
LD, LDS = 68, 72                             # its tiles' row strides


def smem_out(K):
    """gda_slice_out's shared memory bytes: x and the gates [BT][LD], the lanes' products
    [NKC BT], St's key chunks [BT][LDS] (all NKC of them where K <= 4 BT, else one)."""
    NKC = -(-K // BT)
    return 4 * (2 * BT * LD + NKC * BT + (NKC if NKC <= 4 else 1) * BT * LDS)


def smem_in(V):
    """gda_slice_in's: the gates and y's chunk [BT][LD], the lanes' products [BT], St's value
    chunks [BT][LD] (all NVC where V <= 4 BT, else one)."""
    NVC = -(-V // BT)
    return 4 * (2 * BT * LD + BT + (NVC if NVC <= 4 else 1) * BT * LD)


class SlicePlan:
    """gda_slice sized for [B, T, H, K] gates and V values, in scan order ``reverse``."""

    def __init__(self, B, T, H, K, V, reverse):
        self.NSEG = max(1, -(-T // TS))
        self.B, self.T, self.H, self.K, self.V = B, T, H, K, V
        sizes = dict(T=T, B=B, H=H, K=K, V=V, NSEG=self.NSEG, reverse=int(reverse))
        grids = {"gda_slice_prods": B * self.NSEG * H, "gda_slice_enter": -(-B * H * K // NT),
                 "gda_slice_out": B * H * self.NSEG * -(-V // BT),
                 "gda_slice_in": B * H * self.NSEG * -(-K // BT)}
        smem = {"gda_slice_out": smem_out(K), "gda_slice_in": smem_in(V)}
        self.launch = {e: Launch(FAMILY.function(e, DEFINES, smem.get(e, 0)), SLICE, grids[e], NT,
                                 smem.get(e, 0), **sizes) for e in ENTRIES}


class Terms:
    """The products entering each segment of one scan order (``ws`` [B, NSEG, H, K]) and over
    all the counted steps (``tot`` [B, H, K]), for the products with a state below."""

    def __init__(self, a, count, reverse, V):
        B, T, H, K = a.shape
        self.plan = cached(SlicePlan, B, T, H, K, V, bool(reverse))
        self.a, self.count = _aligned(a), count
        self.ws = empty((B, self.plan.NSEG, H, K), np.float32)
        self.tot = empty((B, H, K), np.float32)
        if a.size:
            self._run("gda_slice_prods")
            self._run("gda_slice_enter", tot=self.tot)
        else:
            self.tot.fill(1)

    def _run(self, entry, x=None, st=None, y=None, w=None, z=None, out=None, pr=None, tot=None,
             scale=1.0):
        ptrs = (address(x), self.a.data.ptr, address(st), address(y), address(w), address(z),
                address(out), address(pr), self.ws.data.ptr, address(tot), address(self.count))
        self.plan.launch[entry](ptrs, scale)

    def out(self, y, x, st, scale):
        """y [B, T, H, V] += scale (x . P)^T St at the counted steps (in place); x [B, T, H, K],
        St [B, H, K, V]."""
        if y.size and x.size:
            self._run("gda_slice_out", x=_aligned(x), st=_aligned(st), y=y, scale=scale)
        return y

    def into(self, out, y, w, st, scale, products=False):
        """X = St y_t; out [B, T, H, K] += scale P . X at the counted steps (in place); returns
        z = scale w . X there, 0 elsewhere (and with ``products``, (z, P): P at the counted
        steps, 0 elsewhere)."""
        z = empty(out.shape, np.float32)
        pr = empty(out.shape, np.float32) if products else None
        if out.size:
            self._run("gda_slice_in", st=_aligned(st), y=_aligned(y), w=w, z=z, out=out, pr=pr,
                      scale=scale)
        return (z, pr) if products else z


def _aligned(x):
    """x, or a copy where its address is not 16-byte aligned: the kernels stage x, the gates,
    y and St by 16-byte cp.async where a row is whole packs of 4 (a view into a larger array
    may start anywhere)."""
    return x if x.data.ptr % 16 == 0 else x.copy()


def shift(xp, x, step, fill):
    """x_{t - step} along axis 1, T (step 1: the previous token's, -1: the next's), ``fill``
    past the edge; one pass (only the edge row is filled)."""
    out = xp.empty_like(x)
    if step > 0:
        out[:, step:] = x[:, :-step]
        out[:, :step] = fill
    else:
        out[:, :step] = x[:, -step:]
        out[:, step:] = fill
    return out


def terms(a, count=None, reverse=False, V=1):
    """The running products of gates a [B, T, H, K] (float32 C-contiguous CuPy: a Terms; NumPy:
    a TermsRef) over the first ``count[b]`` steps (an int64 [B] array of the same library, or
    None: all T) in scan order (``reverse``: from the end, products exclusive), for states of V
    values."""
    if isinstance(a, np.ndarray):
        return TermsRef(a, count, reverse)
    return Terms(a, count, reverse, V)


class TermsRef:
    """Terms in NumPy: ``P`` [B, T, H, K] the products at each token (0 past the counted
    steps), ``tot`` [B, H, K] the product over them; ``out`` and ``into`` as Terms'."""

    def __init__(self, a, count=None, reverse=False):
        self.on = _counted(a.shape, count, reverse)            # [B, T, 1, 1]
        x = np.where(self.on, a, 1).astype(a.dtype)
        if reverse:
            x = x[:, ::-1]
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            c = np.cumprod(x, axis=1)                          # (the loop's products, in order)
        self.tot = c[:, -1] if a.shape[1] else np.ones(a.shape[:1] + a.shape[2:], a.dtype)
        if reverse:                                           # exclusive, back in token order
            c = shift(np, c, 1, 1)[:, ::-1]
        self.P = np.where(self.on, c, 0).astype(a.dtype)

    def out(self, y, x, st, scale):
        with np.errstate(over="ignore", invalid="ignore"):
            y += scale * np.einsum("bthk,bhkv->bthv", np.where(self.on, x * self.P, 0), st)
        return y

    def into(self, out, y, w, st, scale, products=False):
        with np.errstate(over="ignore", invalid="ignore"):
            X = np.einsum("bhkv,bthv->bthk", st, y)
            out += np.where(self.on, scale * self.P * X, 0)
            z = np.where(self.on, scale * w * X, 0).astype(out.dtype)
        return (z, self.P) if products else z


def products_ref(a, count=None, reverse=False):
    """(P, tot) of TermsRef: the NumPy form of the kernel's running products."""
    t = TermsRef(a, count, reverse)
    return t.P, t.tot


def out_ref(y, x, a, st, count=None, reverse=False, scale=1.0):
    """NumPy form of Terms.out (returns the new y; y is not changed)."""
    return TermsRef(a, count, reverse).out(np.array(y), x, st, scale)


def into_ref(out, y, w, a, st, count=None, reverse=False, scale=1.0):
    """NumPy form of Terms.into: (the new out, z); out is not changed."""
    new = np.array(out)
    return new, TermsRef(a, count, reverse).into(new, y, w, st, scale)


def _counted(shape, count, reverse):
    B, T = shape[:2]
    j = np.arange(T)[None, :]
    n = np.full((B, 1), T) if count is None else np.clip(np.asarray(count), 0, T)[:, None]
    if reverse:
        j = T - 1 - j
    return (j < n)[:, :, None, None]


_GATE_TERMS = None


def gate_terms(da, G, R, c, e, m_in, m_out, ini, cross):
    """da [B, T, H, K] += m_in G_{t-1} c_t + m_out R_t e'_t + m_in m_out R_t G_{t-1} cross in
    place (cupy_gda/distributed.py's gate terms, one pass on the GPU): G the running product
    from the slice's start (inclusive: G_{t-1} is 1 at the start), R from after t to its end,
    e'_t = e_{t-1} (0 at the start) + ini; the masks [1, T, 1, 1] (or numbers), ini and cross
    broadcast to [B, T, H, K]."""
    if isinstance(da, np.ndarray):
        Gp, ep = shift(np, G, 1, 1), shift(np, e, 1, 0) + ini
        with np.errstate(over="ignore", invalid="ignore"):
            da += m_in * Gp * c + m_out * R * ep + m_in * m_out * R * Gp * cross
        return da
    global _GATE_TERMS
    import cupy
    if _GATE_TERMS is None:
        _GATE_TERMS = cupy.ElementwiseKernel(
            "raw float32 G, float32 R, float32 c, raw float32 e, float32 mi, float32 mo, "
            "float32 ini, float32 cross, int64 HK, int64 T", "float32 da", """
            const long long t = (i / HK) % T;
            const float gp = t > 0 ? G[i - HK] : 1.f;
            const float ep = (t > 0 ? e[i - HK] : 0.f) + ini;
            da += mi * gp * c + mo * R * ep + mi * mo * R * gp * cross;
            """, "gda_slice_gate_terms")
    B, T, H, K = da.shape
    f = [np.float32(x) if np.isscalar(x) else x for x in (m_in, m_out, ini, cross)]
    _GATE_TERMS(G, R, c, e, *f, H * K, T, da)
    return da
