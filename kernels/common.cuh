// Shared helpers, prepended as text to every kernel (CuPy's disk cache does not see #includes).
// No CUDA headers are needed: half and bfloat16 travel as 16-bit words, converted with PTX cvt
// (bf16 rounding needs sm_80+).
//
// Type codes for the defines IO_DTYPE (q, k, v, o) and G_DTYPE (gate / log_gate):
//   0 = float32, 1 = float16, 2 = bfloat16
#ifndef IO_DTYPE
#error "IO_DTYPE (0 float32, 1 float16, 2 bfloat16) is required"
#endif
#ifndef G_DTYPE
#error "G_DTYPE (0 float32, 1 float16, 2 bfloat16) is required"
#endif

template <int CODE> struct gda_type;
template <> struct gda_type<0> {
    typedef float t;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float x) { return x; }
};
template <> struct gda_type<1> {
    typedef unsigned short t;
    static __device__ __forceinline__ float load(unsigned short h) {
        float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
    }
};
template <> struct gda_type<2> {
    typedef unsigned short t;
    static __device__ __forceinline__ float load(unsigned short h) {
        return __uint_as_float(((unsigned int)h) << 16);
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
    }
};
typedef gda_type<IO_DTYPE> io;
typedef gda_type<G_DTYPE> gt;

// The multiplicative gate from what the caller gave (exp of -inf is 0: a reset).
__device__ __forceinline__ float gda_gate(gt::t x) {
#if LOG_GATE
    return expf(gt::load(x));
#else
    return gt::load(x);
#endif
}

#define GDA_FULL_MASK 0xffffffffu

// Rows [bos, eos) of sequence n in the [B*T, ...] tensors: cu_seqlens clamped to [0, T] (unchecked
// offsets must not reach outside the tensors), or n*T .. n*T + T without it.
template <typename S>
__device__ __forceinline__ void gda_seq_rows(const S* cu_seqlens, long long n, long long T,
                                             long long& bos, long long& eos) {
    if (cu_seqlens) {
        bos = min(max((long long)cu_seqlens[n], 0LL), T);
        eos = min(max((long long)cu_seqlens[n + 1], bos), T);
    } else { bos = n * T; eos = bos + T; }
}
