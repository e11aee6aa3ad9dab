// Shared helpers, prepended as text to every kernel (CuPy's disk cache does not see #includes;
// cupy_gda/_compile.py puts each family's headers before its .cu). No CUDA headers are needed:
// half and bfloat16 travel as 16-bit words, converted with PTX cvt (bf16 rounding needs sm_80+).
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

// The multiplicative gate from what the caller gave (exp of -inf is 0: a reset); gda_gate_of:
// from it already loaded as a float
__device__ __forceinline__ float gda_gate_of(float x) {
#if LOG_GATE
    return expf(x);
#else
    return x;
#endif
}
__device__ __forceinline__ float gda_gate(gt::t x) { return gda_gate_of(gt::load(x)); }

// The backward's gradient of the gate argument, from the multiplicative gate a and dL/da: itself,
// or for a log gate a * dL/da, exactly 0 where a is (the loop never used dL/da there: 0 * inf)
__device__ __forceinline__ float gda_gate_grad(float a, float d) {
#if LOG_GATE
    return a == 0.f ? 0.f : a * d;
#else
    return d;
#endif
}

#define GDA_FULL_MASK 0xffffffffu

// N floats as one aligned vector (16-byte accesses for N = 4), and as an array
template <int N> struct gda_floats;
template <> struct gda_floats<1> { typedef float t; };
template <> struct gda_floats<2> { typedef float2 t; };
template <> struct gda_floats<4> { typedef float4 t; };
template <int N> union gda_float_pack { typename gda_floats<N>::t v; float f[N]; };

// ---- The forward families (gda_recurrent_fwd, gda_chunk_fwd): one parameter list, declared
// in Python as cupy_gda/_launch.py FORWARD (a CPU test holds the two against the PTX).
// only_if (null, or a device flag): every entry does nothing where *only_if is 0 (the fall-back
// of chunk_bwd.ForwardPlan, the forward from gda_chunk_bwd's stages: only where its guard was hit).
#ifdef SEQ_INT64
#if SEQ_INT64
typedef long long seq_t;
#else
typedef int seq_t;
#endif
#define GDA_FORWARD_PARAMS                                                                         \
    const io::t* __restrict__ q, const io::t* __restrict__ k, const io::t* __restrict__ v,       \
    const gt::t* __restrict__ g, io::t* __restrict__ o, const float* __restrict__ h0,            \
    float* __restrict__ ht, const seq_t* __restrict__ cu_seqlens, float* __restrict__ ws_s,      \
    float* __restrict__ ws_d, const int* __restrict__ only_if, long long T, int H, int NV, int P, \
    float scale
#define GDA_FORWARD_ARGS q, k, v, g, o, h0, ht, cu_seqlens, ws_s, ws_d, only_if, T, H, NV, P, scale
#define GDA_FORWARD_ONLY_IF if (only_if && *only_if == 0) return
#endif

// Which inputs the forward kernels may stage by cp.async (ASYNC_COPY, chosen by the launchers'
// _launch.cp_async_inputs by the same rule): float32 as they are in memory, the multiplicative
// gate (no exp on the way), and rows of whole 16-byte packs
#define GDA_ASYNC_INPUTS (IO_DTYPE == 0 && G_DTYPE == 0 && !LOG_GATE && K_DIM % 4 == 0 && V_DIM % 4 == 0)

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

// Sequence segments (gda_recurrent_fwd, gda_chunk_fwd): segment p of P holds rows [s0, s1) of a
// sequence of len rows, whole units of `unit` rows a segment but the last (short or empty ones
// at the end).
__device__ __forceinline__ void gda_segment_rows(long long len, int P, int p, int unit,
                                                 long long& s0, long long& s1) {
    const long long per = ((len + unit - 1) / unit + P - 1) / P * unit;
    s0 = min(len, p * per);
    s1 = min(len, (p + 1) * per);
}

// x * 2^e (e an integer in a float), exact where the result is a normal float: four power-of-2
// factors (e clamped to +-400, beyond which no float x * 2^e is finite and nonzero), each in
// the float exponent range; the partial products lie between x and the result
__device__ __forceinline__ float gda_pow2_mul(float x, float e) {
    const int ei = max(-400, min(400, (int)e)), e1 = ei / 4, e4 = ei - 3 * e1;
    const float f1 = __int_as_float((e1 + 127) << 23);
    return x * f1 * f1 * f1 * __int_as_float((e4 + 127) << 23);
}

// One workspace entry's step of the carry below: 2^e (m s) + sj (m s + sj, fused, where e = 0)
__device__ __forceinline__ float gda_carry_step(float m, float e, float sj, float s) {
    return e == 0.f ? fmaf(m, s, sj) : gda_pow2_mul(m * s, e) + sj;
}

// Whether the carry through an entry whose gate product is m 2^e is the loop's: m is finite
// unless the segment holds an inf (or NaN) gate, or its product left float range where a state
// pass multiplies plainly. Otherwise 2^e (m S) + S_j is not the loop's result (the loop
// multiplies the whole S by the inf gate, and its inf takes the whole S's sign, not the
// parts'): each thread whose elements carry such an entry steps them through the sequence's
// rows before its segment from h0 instead (gda_chunk_fwd, gda_recurrent_fwd).
__device__ __forceinline__ bool gda_carried(float m) {
    return fabsf(m) <= 0x1.fffffep127f;        // (NaN fails)
}

// The segments' workspace, written by the state passes: entry w = (n * H + h) * (P - 1) + j holds
// segment j's end state S_j [K][V] at ws_s + w * K * V and its gate product d_j = m * 2^e [K] at
// ws_d + w * 2K (m [K], then e [K] as floats: a segment's product of any length keeps its range,
// see gda_scaled_mul). Element (row, col) of S carried from s through entries w_0 .. w_0 + p - 1:
// S = 2^e (m S) + S_j, the loop's value wherever the loop's is finite (d_j * S with d_j out of
// float range would be inf * 0 = NaN for a zero S) and every m is finite; exact becomes false
// where one is not (gda_carried).
__device__ __forceinline__ float gda_carry(const float* __restrict__ ws_s,
                                           const float* __restrict__ ws_d, long long w_0, int p,
                                           int K, int V, int row, int col, float s, bool& exact) {
    for (int j = 0; j < p; ++j) {
        const long long wj = (w_0 + j) * K + row, wd = (w_0 + j) * 2 * K + row;
        const float m = ws_d[wd];
        exact &= gda_carried(m);
        s = gda_carry_step(m, ws_d[wd + K], ws_s[wj * V + col], s);
    }
    return s;
}

// x as m * 2^d with m in [0.5, 1), d added to e (a float); 0, subnormals, inf and NaN as they are
__device__ __forceinline__ float gda_mantissa(float x, float& e) {
    const unsigned u = __float_as_uint(x), ex = (u >> 23) & 0xffu;
    if (ex == 0u || ex == 0xffu)
        return x;
    e += (float)((int)ex - 126);
    return __uint_as_float((u & 0x807fffffu) | (126u << 23));
}

// A gate product kept as m * 2^e (e a float, exact), times g: m stays within [2^-64, 2^64] (or
// 0, or not finite), so products of any length keep the loop's range; the multiply only, unless
// the product leaves that range (then m is first brought to [0.5, 1), where m * g is finite).
__device__ __forceinline__ void gda_scaled_mul(float& m, float& e, float g) {
    const float x = m * g;
    if (x == 0.f || (fabsf(x) >= 0x1p-64f && fabsf(x) <= 0x1p64f))
        m = x;
    else
        m = gda_mantissa(gda_mantissa(m, e) * g, e);
}

// Whether p is aligned for loads of 4 elements at once (16 bytes of float, 8 of a 16-bit type).
template <typename E> __device__ __forceinline__ bool gda_aligned(const E* p) {
    return (reinterpret_cast<unsigned long long>(p) & (4 * sizeof(E) - 1)) == 0;
}

// cp.async (sm_80+): 16 bytes from global to shared memory without registers; a thread's copies
// since its last commit form a group, and gda_cp_wait<N> waits until at most N of its groups
// are in flight (the copies are then visible to the thread; a barrier makes them the block's).
// (gda_cp16_at: the destination as a shared-memory address, gda_shared_at's)
__device__ __forceinline__ unsigned gda_shared_at(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void gda_cp16_at(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
// cp.async of 16 bytes, zeros where !on (nothing read)
__device__ __forceinline__ void gda_cp16_or_0(unsigned dst, const void* src, bool on) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(on ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void gda_cp16(float* dst, const float* src) {
    gda_cp16_at(gda_shared_at(dst), src);
}
__device__ __forceinline__ void gda_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void gda_cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// 16 bytes a, b, c, d to global memory at p (16-byte aligned) as one store (NVRTC split a uint4's
// store into four of 4 bytes, each its own sector write: perf-notes v47)
__device__ __forceinline__ void gda_st16(void* p, unsigned a, unsigned b, unsigned c, unsigned d) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}

// bar.sync on named barrier id (1..15) of n threads (whole warps): a part of the block alone
__device__ __forceinline__ void gda_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}

#if __CUDA_ARCH__ >= 900
// mbarriers (sm_90+): an mbarrier of this CTA at shared address bar; its phases
// complete one after another (parity 0, 1, 0, ..), each when its arrivals are in and the bytes
// it was told to expect have landed (a bulk copy's bytes count as they land: complete_tx).
__device__ __forceinline__ void gda_mbar_init(unsigned bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(arrivals) : "memory");
}
// (after the inits, before the block's or the cluster's barrier: the async proxy and the other
// CTAs see them initialised)
__device__ __forceinline__ void gda_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// one arrival on this CTA's mbarrier bar, which then also waits for bytes more of copies
__device__ __forceinline__ void gda_mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes)
                 : "memory");
}
// one arrival on this CTA's mbarrier bar (this thread's reads and writes before it released)
__device__ __forceinline__ void gda_mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
// one arrival on bar once every cp.async this thread issued before has landed (its count holds
// the arrival: noinc)
__device__ __forceinline__ void gda_cp_arrive(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}
// waits until the phase of parity ``parity`` of this CTA's mbarrier bar has completed (acquire,
// cluster scope: the arrivals' CTAs' writes and reads before them are ordered before what follows;
// CTA: where every arrival is this CTA's, without the L1 invalidation (CCTL.IVALL) the cluster
// scope costs each wait, v51). Each try suspends the thread until the phase completes or for
// at most GDA_MBAR_SUSPEND_NS (CUTLASS's 10 ms), not the system's own short limit: without the
// hint scan_o's products tried slot A's full barrier 125 times a warp a chunk, 13 % of its
// instructions, in the issue slots of the producer they waited for (v57)
#define GDA_MBAR_SUSPEND_NS 0x989680u
#define GDA_MBAR_TRY_WAIT(scope)                                                                \
    asm volatile("{\n\t.reg .pred p;\n\t"                                                        \
                 "mbarrier.try_wait.parity.acquire." scope ".shared::cta.b64 p, [%1], %2, %3;\n\t" \
                 "selp.u32 %0, 1, 0, p;\n\t}"                                                     \
                 : "=r"(done) : "r"(bar), "r"(parity), "r"(GDA_MBAR_SUSPEND_NS) : "memory")
template <bool CTA = false>
__device__ __forceinline__ void gda_mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        if constexpr (CTA)
            GDA_MBAR_TRY_WAIT("cta");
        else
            GDA_MBAR_TRY_WAIT("cluster");
    } while (!done);
}
#undef GDA_MBAR_TRY_WAIT
#undef GDA_MBAR_SUSPEND_NS
#endif

// f(r0, dr, c) for each item (row r0 + dr, column c) of a ROWS x COLS grid that thread tid of NT
// takes: the items r COLS + c from tid on, NT apart. Where COLS divides NT a thread keeps
// one column and its rows are NT / COLS apart: r0 its first, dr the same in every thread (a
// constant once unrolled: UNROLL rows at a time, all by default), so that its copies are one
// address plus constants.
template <int ROWS, int COLS, int NT, int UNROLL = ROWS, typename F>
__device__ __forceinline__ void gda_grid_each_at(unsigned tid, const F& f) {
    if constexpr (NT % COLS == 0) {
        constexpr int STEP = NT / COLS, FULL = ROWS / STEP;
        const int r0 = tid / COLS, c = tid % COLS;
        #pragma unroll (UNROLL)
        for (int i = 0; i < FULL; ++i) f(r0, i * STEP, c);
        if constexpr (ROWS % STEP != 0)
            if (r0 + FULL * STEP < ROWS) f(r0, FULL * STEP, c);
    } else {
        for (int x = tid; x < ROWS * COLS; x += NT) f(x / COLS, 0, x % COLS);
    }
}
// the same for this thread, threadIdx.x of NT
template <int ROWS, int COLS, int NT, int UNROLL = ROWS, typename F>
__device__ __forceinline__ void gda_grid_each(const F& f) {
    gda_grid_each_at<ROWS, COLS, NT, UNROLL>(threadIdx.x, f);
}

// m = max(m, |x|); a NaN propagates (max.NaN), so it fails the guard's range check that follows
__device__ __forceinline__ void gda_absmax(float& m, float x) {
    asm("max.NaN.f32 %0, %0, %1;" : "+f"(m) : "f"(fabsf(x)));
}
