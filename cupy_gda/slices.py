"""Launcher of gda_slice (kernels/gda_slice.cu): the terms a slice of a sequence gets from a
state carried across its edge, on the tensor cores (cupy_gda/distributed.py).

``terms(a, count, reverse)`` makes the gates' products in one scan order and returns an object
whose ``anchor`` takes the state, and whose ``out`` and ``into`` then add the two products with
it: for CuPy arrays a Terms (the kernels; no host sync), for NumPy arrays a TermsRef, the same
in NumPy (the CPU path, and the form the kernels are tested against). ``gate_terms`` likewise.

Range: a product over the whole slice (``tot_m 2^tot_e``) is kept as a mantissa and a power of
2, and the running products start from sigma = 2^E0, the size of the state's row (``anchor``
divides the row by it, exactly): sigma P_t is the size of the part of the loop's state that the
state carries, in float range wherever the loop's state is, where P_t alone may pass 2^128 (gates
above 1) or underflow. So the products that ``into`` returns are sigma P, and its z is the
plain z over sigma; their product is the plain one.
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
    """A scan order's products: each segment's as m 2^e (``ws`` [3, B, NSEG, H, K]: m, e, then
    what ``anchor`` makes, sigma times the product entering each segment) and the product over
    all the counted steps as ``tot_m`` 2^``tot_e`` [B, H, K]; then the products with a state."""

    def __init__(self, a, count, reverse, V):
        B, T, H, K = a.shape
        self.plan = cached(SlicePlan, B, T, H, K, V, bool(reverse))
        self.a, self.count = _aligned(a), count
        self.ws = empty((3, B, self.plan.NSEG, H, K), np.float32)
        tot = empty((2, B, H, K), np.float32)
        if a.size:
            self._run("gda_slice_prods")
            self._run("gda_slice_enter", tot=tot)
        else:
            tot[0].fill(1)
            tot[1].fill(0)
        self.tot_m, self.tot_e = tot
        self.sigma = None

    def _run(self, entry, x=None, st=None, y=None, w=None, z=None, out=None, pr=None, tot=None,
             scale=1.0):
        ptrs = (address(x), self.a.data.ptr, address(st), address(y), address(w), address(z),
                address(out), address(pr), self.ws.data.ptr, address(tot), address(self.count))
        self.plan.launch[entry](ptrs, scale)

    def anchor(self, st):
        """St [B, H, K, V] with each row divided by its size sigma [B, H, K] (kept as
        ``sigma``), which the running products then start from; ``out`` and ``into`` take
        the returned St."""
        import cupy
        st1, self.sigma, e0 = _anchor(cupy, st)
        if self.a.size:
            self._run("gda_slice_enter", x=e0)
        return st1

    def _anchored(self):
        if self.sigma is None:
            raise RuntimeError("gda_slice: anchor(St) must come before out and into")

    def out(self, y, x, st, scale):
        """y [B, T, H, V] += scale (x . sigma P)^T St at the counted steps (in place); x
        [B, T, H, K], St [B, H, K, V] as ``anchor`` returned it."""
        self._anchored()
        if y.size and x.size:
            self._run("gda_slice_out", x=_aligned(x), st=_aligned(st), y=y, scale=scale)
        return y

    def into(self, out, y, w, st, scale, products=False):
        """X = St y_t (St as ``anchor`` returned it); out [B, T, H, K] += scale sigma P . X at
        the counted steps (in place); returns z = scale w . X there, 0 elsewhere (and with
        ``products``, (z, sigma P): sigma P at the counted steps, 0 elsewhere)."""
        self._anchored()
        z = empty(out.shape, np.float32)
        pr = empty(out.shape, np.float32) if products else None
        if out.size:
            self._run("gda_slice_in", st=_aligned(st), y=_aligned(y), w=w, z=z, out=out, pr=pr,
                      scale=scale)
        return (z, pr) if products else z


def _anchor(xp, st):
    """(St with each row [..., K, :] divided by sigma, sigma [..., K], E0 as float32): sigma =
    2^E0 at most the row's largest magnitude and more than half of it (power-of-2 scalings,
    exact), 0 (E0 = -1000 for the kernel) for a row of zeros; a row holding inf or NaN: 1/2."""
    if st.shape[-1] == 0:
        zero = xp.zeros(st.shape[:-1], st.dtype)
        return st, zero, xp.full(st.shape[:-1], -1000, np.float32)
    mx = xp.abs(st).max(axis=-1)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        e = xp.frexp(mx)[1] - 1
        st1 = xp.ldexp(st, -e[..., None]).astype(st.dtype)
        sigma = xp.where(mx == 0, 0, xp.ldexp(xp.ones(mx.shape, st.dtype), e)).astype(st.dtype)
    return st1, sigma, xp.where(mx == 0, -1000, e).astype(np.float32)


def scaled_product(x, axis=1):
    """The product of x [B, T, ...] (NumPy) along ``axis`` as (m, e) in x's dtype, m 2^e: m in
    [0.5, 1) (or 0, inf, NaN), e a float; the mantissas multiplied in float64, 512 at a time
    (products of any length keep their range)."""
    m, e = np.frexp(np.moveaxis(x, axis, 0).astype(np.float64))
    M = np.ones(m.shape[1:])
    E = e.sum(axis=0, dtype=np.float64)
    for i in range(0, m.shape[0], 512):
        M, de = np.frexp(M * np.prod(m[i:i + 512], axis=0))
        E += de
    return M.astype(x.dtype), E.astype(x.dtype)


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
    """Terms in NumPy: ``tot_m`` 2^``tot_e`` [B, H, K] the product over the counted steps;
    after ``anchor``, ``P`` [B, T, H, K] sigma times the products at each token (0 past the
    counted steps); ``out`` and ``into`` as Terms'."""

    def __init__(self, a, count=None, reverse=False):
        self.on = _counted(a.shape, count, reverse)            # [B, T, 1, 1]
        self.reverse = reverse
        x = np.where(self.on, a, 1).astype(a.dtype)
        self.x = x[:, ::-1] if reverse else x                 # (scan order)
        self.tot_m, self.tot_e = scaled_product(self.x)
        self.P = self.sigma = None

    def anchor(self, st):
        st1, self.sigma, _ = _anchor(np, st)
        x = np.array(self.x)
        if x.shape[1]:
            x[:, 0] *= self.sigma
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            c = np.cumprod(x, axis=1)                          # (the loop's products, in order)
        if self.reverse:                                       # exclusive, back in token order
            c = shift(np, c, 1, self.sigma[:, None])[:, ::-1]
        self.P = np.where(self.on, c, 0).astype(self.x.dtype)
        return st1

    def _anchored(self):
        if self.P is None:
            raise RuntimeError("TermsRef: anchor(St) must come before out and into")

    def out(self, y, x, st, scale):
        self._anchored()
        with np.errstate(over="ignore", invalid="ignore"):
            y += scale * np.einsum("bthk,bhkv->bthv", np.where(self.on, x * self.P, 0), st)
        return y

    def into(self, out, y, w, st, scale, products=False):
        self._anchored()
        with np.errstate(over="ignore", invalid="ignore"):
            X = np.einsum("bhkv,bthv->bthk", st, y)
            out += np.where(self.on, scale * self.P * X, 0)
            z = np.where(self.on, scale * w * X, 0).astype(out.dtype)
        return (z, self.P) if products else z


def products_ref(a, count=None, reverse=False, st=None):
    """(P, tot) of TermsRef anchored at St (None: sigma = 1), tot = tot_m 2^tot_e as a plain
    float: the NumPy form of the kernel's running products."""
    t = TermsRef(a, count, reverse)
    t.anchor(np.ones(a.shape[:1] + a.shape[2:] + (1,), a.dtype) if st is None else st)
    with np.errstate(over="ignore", under="ignore"):
        return t.P, np.ldexp(t.tot_m, t.tot_e.astype(np.int64)).astype(a.dtype)


def out_ref(y, x, a, st, count=None, reverse=False, scale=1.0):
    """NumPy form of Terms.out on the plain St (returns the new y; y is not changed)."""
    t = TermsRef(a, count, reverse)
    return t.out(np.array(y), x, t.anchor(st), scale)


def into_ref(out, y, w, a, st, count=None, reverse=False, scale=1.0):
    """NumPy form of Terms.into on the plain St: (the new out, z) with z the plain one (the
    anchored z times sigma); out is not changed."""
    new = np.array(out)
    t = TermsRef(a, count, reverse)
    z = t.into(new, y, w, t.anchor(st), scale)
    with np.errstate(over="ignore", invalid="ignore"):
        return new, z * t.sigma[:, None]


def _counted(shape, count, reverse):
    B, T = shape[:2]
    j = np.arange(T)[None, :]
    n = np.full((B, 1), T) if count is None else np.clip(np.asarray(count), 0, T)[:, None]
    if reverse:
        j = T - 1 - j
    return (j < n)[:, :, None, None]


_GATE_TERMS = None


def gate_terms(da, G, R, c, e, m_in, m_out, ini, cross, sigma):
    """da [B, T, H, K] += m_in G_{t-1} c_t + m_out R_t e'_t + m_in m_out R_t G_{t-1} cross in
    place (cupy_gda/distributed.py's gate terms, one pass on the GPU): G the running product
    from the slice's start (inclusive: G_{t-1} is sigma [B, H, K] at the start, G being the
    anchored products, Terms.into's), R from after t to its end, e'_t = e_{t-1} (0 at the start)
    + ini; the masks [1, T, 1, 1] (or numbers), ini and cross broadcast to [B, T, H, K]."""
    if isinstance(da, np.ndarray):
        Gp, ep = shift(np, G, 1, sigma[:, None]), shift(np, e, 1, 0) + ini
        with np.errstate(over="ignore", invalid="ignore"):
            da += m_in * Gp * c + m_out * R * ep + m_in * m_out * R * Gp * cross
        return da
    global _GATE_TERMS
    import cupy
    if _GATE_TERMS is None:
        _GATE_TERMS = cupy.ElementwiseKernel(
            "raw float32 G, float32 R, float32 c, raw float32 e, float32 mi, float32 mo, "
            "float32 ini, float32 cross, raw float32 sigma, int64 HK, int64 T", "float32 da", """
            const long long t = (i / HK) % T;
            const float gp = t > 0 ? G[i - HK] : sigma[i / (HK * T) * HK + i % HK];
            const float ep = (t > 0 ? e[i - HK] : 0.f) + ini;
            da += mi * gp * c + mo * R * ep + mi * mo * R * gp * cross;
            """, "gda_slice_gate_terms")
    B, T, H, K = da.shape
    f = [np.float32(x) if np.isscalar(x) else x for x in (m_in, m_out, ini, cross)]
    _GATE_TERMS(G, R, c, e, *f, cupy.ascontiguousarray(sigma, np.float32), H * K, T, da)
    return da
