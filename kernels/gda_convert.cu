// gda_convert: float16 or bfloat16 (IO_DTYPE) to float32 and back, element by element over n
// contiguous elements: the float32 copies cupy_gda/distributed.py takes of half inputs for its
// corrections, and its half results. CuPy's astype moves one 2-byte element a thread and runs
// at about a third of the copy rate on the H200 (0.63 ms for 134 M elements: too few bytes in
// flight); here a thread moves 8, by 16-byte loads and stores where VEC (both arrays 16-byte
// aligned: the launcher's check), else one at a time. Back to half: round to nearest even
// (common.cuh's io::store), as CuPy's and NumPy's astype.
//
// Required defines: IO_DTYPE (1 or 2), G_DTYPE (common.cuh; unused), VEC (0 or 1).
// Launcher: cupy_gda/convert.py; reference: astype.
#if IO_DTYPE == 0
#error "gda_convert converts float16 or bfloat16 (IO_DTYPE 1 or 2)"
#endif
#ifndef VEC
#error "VEC (1: both arrays 16-byte aligned) is required"
#endif
#define NT 256                     // threads a block
#define PER 8                      // elements a thread

// every entry's parameters (_launch.CONVERT): x [n] in, y [n] out
#define GDA_CONVERT_PARAMS(IN, OUT) \
    const IN* __restrict__ x, OUT* __restrict__ y, long long n

// the first of this thread's PER elements, and whether all PER are inside n and VEC
__device__ __forceinline__ long long gda_convert_first(long long n, bool& whole) {
    const long long i = ((long long)blockIdx.x * NT + threadIdx.x) * PER;
    whole = VEC && i + PER <= n;
    return i;
}

extern "C" __global__ void __launch_bounds__(NT)
gda_convert_up(GDA_CONVERT_PARAMS(io::t, float)) {
    bool whole;
    const long long i = gda_convert_first(n, whole);
    if (whole) {
        const uint4 p = *reinterpret_cast<const uint4*>(x + i);
        const unsigned w[4] = {p.x, p.y, p.z, p.w};
        gda_float_pack<4> f[2];
        #pragma unroll
        for (int j = 0; j < PER; ++j)
            f[j / 4].f[j % 4] = io::load((io::t)(w[j / 2] >> (16 * (j % 2))));
        reinterpret_cast<float4*>(y + i)[0] = f[0].v;
        reinterpret_cast<float4*>(y + i)[1] = f[1].v;
    } else {
        for (long long j = i; j < n && j < i + PER; ++j)
            y[j] = io::load(x[j]);
    }
}

extern "C" __global__ void __launch_bounds__(NT)
gda_convert_down(GDA_CONVERT_PARAMS(float, io::t)) {
    bool whole;
    const long long i = gda_convert_first(n, whole);
    if (whole) {
        gda_float_pack<4> f[2];
        f[0].v = reinterpret_cast<const float4*>(x + i)[0];
        f[1].v = reinterpret_cast<const float4*>(x + i)[1];
        unsigned w[4];
        #pragma unroll
        for (int j = 0; j < PER / 2; ++j)
            w[j] = (unsigned)io::store(f[j / 2].f[2 * (j % 2)])
                 | ((unsigned)io::store(f[j / 2].f[2 * (j % 2) + 1]) << 16);
        *reinterpret_cast<uint4*>(y + i) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
        for (long long j = i; j < n && j < i + PER; ++j)
            y[j] = io::store(x[j]);
    }
}
