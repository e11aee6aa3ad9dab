// Tensor-core helpers (mma.sync, sm_80+): operand splits, fragment loads, the products of one
// k-step. Prepended as text after common.cuh to the kernels that take them (gda_chunk_fwd;
// gda_chunk_bwd's GEMMs take gda_mma_bf16).
//
// Float32 accuracy from low-precision operands: every operand that is not exact in the mma's
// input type is split a = hi + lo and a product is summed as lo*hi + hi*lo + hi*hi (fp32
// accumulation, the small terms first); no plain TF32 anywhere.
//   TF32 (float32 and float16 inputs): k-steps of 8, mma.m16n8k8, one element a register.
//   BF16 (bfloat16 inputs): k-steps of 16, mma.m16n8k16, two elements a register; an operand
//     that is a bfloat16 input is exact in one term, so its products are lo*v + hi*v.
// scripts/chunk_operand_rounding.py shows both within the accuracy contract (bf16: o at 0.50
// of the bound, the final state at up to 0.48). Within a k-step the columns are permuted the
// same way in A and B (a sum over k does not care): the BF16 register j of a thread holds the
// columns t + 8j' and t + 8j' + 4, those of two TF32 k-steps, so both read the same addresses.
//
// Needs IO_DTYPE (common.cuh).
#define GDA_BF16 (IO_DTYPE == 2)
#if GDA_BF16
#define KSTEP 16
#else
#define KSTEP 8
#endif
#define GDA_MMA_GROUP 4                        // value tiles per group of independent mma

// a = hi + lo, both TF32 (hi: round to nearest; lo: the rounded remainder). sm_90 converts with
// one instruction in round-to-nearest-even (F2FP); sm_80 has only ties-away, which ptxas expands
// to four (a finite test, add, select, mask)
#if __CUDA_ARCH__ >= 900
#define GDA_TF32 "cvt.rn.tf32.f32"
#else
#define GDA_TF32 "cvt.rna.tf32.f32"
#endif
__device__ __forceinline__ void gda_split(float x, unsigned& hi, unsigned& lo) {
    asm(GDA_TF32 " %0, %1;" : "=r"(hi) : "f"(x));
    asm(GDA_TF32 " %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
}

// (x0, x1) as bf16 pairs (x0 in the low half): hi rounded to nearest even, lo the rounded
// remainders (not formed when EXACT: the operand is a bf16 input)
template <bool EXACT>
__device__ __forceinline__ void gda_split2(float x0, float x1, unsigned& hi, unsigned& lo) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x1), "f"(x0));
    if constexpr (!EXACT) {
        const float r0 = x0 - __uint_as_float(hi << 16), r1 = x1 - __uint_as_float(hi & 0xffff0000u);
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(r1), "f"(r0));
    }
}

// d += a b over one k-step of the type named (TF32: 8, bf16: 16), whatever IO_DTYPE is
__device__ __forceinline__ void gda_mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void gda_mma_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 matrices of 16-bit elements from shared memory, transposed (ldmatrix .trans): lane
// L gives the address (gda_shared_at) of row L % 8 of matrix L / 8, 16 bytes, and r[i] gets
// elements (2 (L % 4), L / 4) and (2 (L % 4) + 1, L / 4) of matrix i, the low half first: an
// mma fragment's pair of consecutive k from a matrix stored k-major
__device__ __forceinline__ void gda_ldsm4_t(unsigned (&r)[4], unsigned at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
}

// The same, not transposed (ldmatrix): r[i] gets elements (L / 4, 2 (L % 4)) and (L / 4, 2 (L %
// 4) + 1) of matrix i: an mma fragment's pair of consecutive k from a matrix stored k-minor
__device__ __forceinline__ void gda_ldsm4(unsigned (&r)[4], unsigned at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
}

// d += a b over one k-step
__device__ __forceinline__ void gda_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if GDA_BF16
    gda_mma_bf16(d, a, b);
#else
    gda_mma_tf32(d, a, b);
#endif
}

// d[j] += a * b[j], j < J (those with j < jn), over one k-step: the small terms first, each pass
// over all J tiles, so that consecutive mma are independent (an mma waits for its accumulator's
// last). BX: b is exact (a bf16 input, BF16 only): no hi*lo term, bl unused.
template <int J, bool BX = false>
__device__ __forceinline__ void gda_mma3(float (*d)[4], const unsigned (&ah)[4], const unsigned (&al)[4],
                                         const unsigned (&bh)[J][2], const unsigned (&bl)[J][2], int jn = J) {
    #pragma unroll
    for (int j = 0; j < J; ++j) if (j < jn) gda_mma(d[j], al, bh[j]);
    if constexpr (!(GDA_BF16 && BX)) {
        #pragma unroll
        for (int j = 0; j < J; ++j) if (j < jn) gda_mma(d[j], ah, bl[j]);
    }
    #pragma unroll
    for (int j = 0; j < J; ++j) if (j < jn) gda_mma(d[j], ah, bh[j]);
}

// A fragment of one k-step (16 rows): element (r, c) is f(r, c), r < 16, c < KSTEP.
// TF32: register j holds (g + 8 (j & 1), t + 4 (j >> 1)); BF16: (g + 8 (j & 1), t + 8 (j >> 1))
// and the same row 4 columns on (g = lane / 4, t = lane % 4).
template <bool EXACT = false, typename F>
__device__ __forceinline__ void gda_frag_a(F f, int lane, unsigned (&hi)[4], unsigned (&lo)[4]) {
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int r = g + 8 * (j & 1), c = t + KSTEP / 2 * (j >> 1);
#if GDA_BF16
        gda_split2<EXACT>(f(r, c), f(r, c + 4), hi[j], lo[j]);
#else
        gda_split(f(r, c), hi[j], lo[j]);
#endif
    }
}

// B fragment of one k-step (8 columns): element (kk, n) is f(kk, n). TF32: register j holds
// (t + 4 j, g); BF16: (t + 8 j, g) and 4 rows on.
template <bool EXACT = false, typename F>
__device__ __forceinline__ void gda_frag_b(F f, int lane, unsigned (&hi)[2], unsigned (&lo)[2]) {
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int kk = t + KSTEP / 2 * j;
#if GDA_BF16
        gda_split2<EXACT>(f(kk, g), f(kk + 4, g), hi[j], lo[j]);
#else
        gda_split(f(kk, g), hi[j], lo[j]);
#endif
    }
}

// d[n] += a * B_n for the value tiles n < nn (at most NN) of one 16-row band over one k-step: B_n
// is the fragment at b + 8 * n (row-major, stride ld; BX: exact, a bf16 input), loaded in groups
// of GDA_MMA_GROUP so that the mma of a group are independent
template <int NN, bool BX = false>
__device__ __forceinline__ void gda_mma_tiles(float (*d)[4], const unsigned (&ah)[4], const unsigned (&al)[4],
                                              const float* b, int ld, int nn, int lane) {
    constexpr int G = GDA_MMA_GROUP < NN ? GDA_MMA_GROUP : NN;
    #pragma unroll
    for (int n0 = 0; n0 < NN; n0 += G) {
        unsigned bh[G][2], bl[G][2];
        #pragma unroll
        for (int j = 0; j < G; ++j)
            if (n0 + j < nn) {
                const float* p = b + 8 * (n0 + j);
                gda_frag_b<BX>([&](int kk, int n) { return p[kk * ld + n]; }, lane, bh[j], bl[j]);
            }
        gda_mma3<G, BX>(d + n0, ah, al, bh, bl, nn - n0);
    }
}
