// gda_scan: a first-order linear scan in time, lane by lane (the K-vector scans of
// cupy_gda/distributed.py: running gate products, and the gradient terms' c and e):
//
//   e_t = a_t * e_{t-1} + z_t,   e before the first step = init      t = 0 .. T-1
//
// over [B, T, L] float32 arrays (L lanes a token, H K), z and init [B, L] optional (0 where
// null); ``reverse`` (a run-time flag) runs t = T-1 .. 0 instead. Each product and sum
// is rounded on its own (__fmul_rn, __fadd_rn: no fused multiply-add), as a float32 NumPy loop.
//
// Three entries, each block NT lanes of one row b; 1-D grids:
//   gda_scan_segments: block ((b * NSEG) + s) * NLB + lb: segment s (TS steps) from e = 0, its
//       product of a and its last e, into ws [B, NSEG, L, 2];
//   gda_scan_carry: block b * NLB + lb: each lane walks the segments in order, replacing each
//       pair by the e that enters the segment (e <- product * e + last);
//   gda_scan_apply: as segments, the segment again from the e entering it, writing every e.
// With one segment (T <= TS) the result is the loop's, bit for bit; with more, the e entering a
// segment is the same sum grouped by segments (a segment's gate product times the e before it).
//
// Tunable: NT (threads a block, a multiple of 32). Launcher: cupy_gda/scan.py. Reference:
// cupy_gda.scan.scan_ref.
#ifndef NT
#define NT 128
#endif
static_assert(NT % 32 == 0 && NT <= 1024, "NT must be a multiple of 32, at most 1024");

// every entry's parameters (_launch.SCAN)
#define GDA_SCAN_PARAMS                                                                        \
    const float* __restrict__ a, const float* __restrict__ z, const float* __restrict__ init,  \
    float* __restrict__ ws, float* __restrict__ e, long long T, long long L, int NSEG, int TS, \
    int reverse

// the element of step t (in scan order) of lane ``lane`` in row b
__device__ __forceinline__ long long gda_scan_at(long long b, long long t, long long T,
                                                 long long L, long long lane, int reverse) {
    return (b * T + (reverse ? T - 1 - t : t)) * L + lane;
}

// (row, segment, lane) of this thread; false past the last lane
__device__ __forceinline__ bool gda_scan_lane(long long L, int NSEG, long long& b, int& s,
                                              long long& lane) {
    const long long nlb = (L + NT - 1) / NT;
    const long long lb = blockIdx.x % nlb, rest = blockIdx.x / nlb;
    s = (int)(rest % NSEG);
    b = rest / NSEG;
    lane = lb * NT + threadIdx.x;
    return lane < L;
}

extern "C" __global__ void __launch_bounds__(NT)
gda_scan_segments(GDA_SCAN_PARAMS) {
    long long b, lane;
    int s;
    if (!gda_scan_lane(L, NSEG, b, s, lane)) return;
    const long long t0 = (long long)s * TS, t1 = min(t0 + TS, T);
    float prod = 1.f, x = 0.f;
    for (long long t = t0; t < t1; ++t) {
        const long long i = gda_scan_at(b, t, T, L, lane, reverse);
        const float at = a[i];
        prod = __fmul_rn(prod, at);
        x = __fadd_rn(__fmul_rn(at, x), z ? z[i] : 0.f);
    }
    float* w = ws + ((b * NSEG + s) * L + lane) * 2;
    w[0] = prod;
    w[1] = x;
}

extern "C" __global__ void __launch_bounds__(NT)
gda_scan_carry(GDA_SCAN_PARAMS) {
    const long long nlb = (L + NT - 1) / NT;
    const long long b = blockIdx.x / nlb, lane = (blockIdx.x % nlb) * NT + threadIdx.x;
    if (lane >= L) return;
    float x = init ? init[b * L + lane] : 0.f;
    for (int s = 0; s < NSEG; ++s) {
        float* w = ws + ((b * NSEG + s) * L + lane) * 2;
        const float prod = w[0], last = w[1];
        w[0] = x;                                   // the e entering segment s
        x = __fadd_rn(__fmul_rn(prod, x), last);
    }
}

extern "C" __global__ void __launch_bounds__(NT)
gda_scan_apply(GDA_SCAN_PARAMS) {
    long long b, lane;
    int s;
    if (!gda_scan_lane(L, NSEG, b, s, lane)) return;
    const long long t0 = (long long)s * TS, t1 = min(t0 + TS, T);
    float x = ws[((b * NSEG + s) * L + lane) * 2];
    for (long long t = t0; t < t1; ++t) {
        const long long i = gda_scan_at(b, t, T, L, lane, reverse);
        x = __fadd_rn(__fmul_rn(a[i], x), z ? z[i] : 0.f);
        e[i] = x;
    }
}
