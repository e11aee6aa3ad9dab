// Hopper warpgroup MMA helpers (wgmma, sm_90a): B operands split once into shared memory, the
// products of one k-step for a warpgroup. Prepended as text after mma.cuh to the kernels built
// with WGMMA = 1 (gda_chunk_fwd's Hopper variant; gda_chunk_bwd's dv entry, through
// gda_wgmma_ss: both operands from shared memory) or SCAN_O_WG = 1 or SCAN_DV = 1
// (gda_chunk_bwd's scan_o and scan_dv, through gda_wgmma_rs: A from registers); the launcher
// then compiles for sm_90a.
//
// A comes from registers in mma.cuh's fragments (each warp of the warpgroup its 16 rows of the
// 64; BF16 in the natural column order, see gda_wg_frag_a), B from shared memory through a
// matrix descriptor, the accumulators are the m16n8 fragments of the warp's rows: one m64n(8J)
// product over J value tiles of 8 columns leaves in d[j] exactly mma.cuh's accumulator of tile j.
//
// B layout (gda_wg_split_b): K-major without swizzle, in core matrices of 8 rows (n) by 16 bytes
// (4 TF32 or 8 BF16 along k), 128 contiguous bytes each; the cores of a row group follow each
// other along k (LBO = 128 bytes), row groups GDA_WG_SBO(KD) bytes apart. A split operand is
// two such arrays, hi then lo, and the same accuracy rules as mma.cuh hold: the products are
// lo*hi + hi*lo + hi*hi, the small terms first (no lo of an exact bf16 input).
#if (defined(WGMMA) && WGMMA) || (defined(SCAN_O_WG) && SCAN_O_WG) || (defined(SCAN_DV) && SCAN_DV)
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL) && defined(__CUDA_ARCH__)
#error "WGMMA, SCAN_O_WG and SCAN_DV = 1 need the sm_90a target (--gpu-architecture=sm_90a)"
#endif

#define GDA_WG_KC (16 / ((GDA_BF16) ? 2 : 4))  // k elements of a core matrix row (16 bytes)
#define GDA_WG_WORDS(KD) ((KD) * 4 / GDA_WG_KC)   // 4-byte words of a B row of KD k elements
#define GDA_WG_SBO(KD) (32 * GDA_WG_WORDS(KD))    // bytes between row groups of 8 (n)
#define GDA_WG_BYTES(N, KD) ((N) * 4 * GDA_WG_WORDS(KD))  // one array (hi or lo) of N rows

// Matrix descriptor of B at shared address addr (bytes): no swizzle, LBO 128, SBO sbo
__device__ __forceinline__ unsigned long long gda_wg_desc(unsigned addr, unsigned sbo) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)(128 >> 4) << 16)
         | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32);
}

// The same in the 128-byte swizzle (layout type 1): rows of 128 bytes (64 bfloat16 along k for
// a K-major B, along n for an MN-major one), 8-row atoms of 1,024 bytes (their base 1,024-byte
// aligned) whose 16-byte pieces lie at piece ^ row % 8; SBO sbo between atoms (8 rows of k for
// MN-major, of n for K-major); LBO unused where n (MN-major) or k (K-major) is within a row
__device__ __forceinline__ unsigned long long gda_wg_desc_sw(unsigned addr, unsigned sbo) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | (1ull << 16)
         | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

__device__ __forceinline__ unsigned gda_smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void gda_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void gda_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void gda_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// Ordinary stores to shared memory that wgmma reads next: each writer, before the barrier
__device__ __forceinline__ void gda_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Pins accumulators to this point of the program (no move of their reads or writes across)
template <int J> __device__ __forceinline__ void gda_wg_pin(float (*d)[4], int jn = J) {
    #pragma unroll
    for (int j = 0; j < J; ++j)
        if (j < jn)
            asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3]) :: "memory");
}

// d[j] += a b_j for the value tiles j < J of one k-step, as one m64n(8J) product: a the
// warpgroup's 64 x KSTEP A (this warp's fragment), b the KSTEP x 8J B at descriptor desc (the
// accumulator of m64nN is the m16n8 fragments of the warp's rows, tile after tile)
#if GDA_BF16
#define GDA_WG_K "16"
#define GDA_WG_TYPE "f32.bf16.bf16"
#define GDA_WG_TRANS_B ", 0"
#else
#define GDA_WG_K "8"
#define GDA_WG_TYPE "f32.tf32.tf32"
#define GDA_WG_TRANS_B ""
#endif
template <int J>
__device__ __forceinline__ void gda_wgmma(float (*d)[4], const unsigned (&a)[4], unsigned long long desc) {
    static_assert(J >= 1 && J <= 4, "m64n8 .. m64n32");
    if constexpr (J == 1) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k" GDA_WG_K "." GDA_WG_TYPE " "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1" GDA_WG_TRANS_B ";\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    } else if constexpr (J == 2) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k" GDA_WG_K "." GDA_WG_TYPE " "
                     "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1" GDA_WG_TRANS_B ";\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    } else if constexpr (J == 3) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n24k" GDA_WG_K "." GDA_WG_TYPE " "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, %16, p, 1, 1" GDA_WG_TRANS_B ";\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    } else if constexpr (J == 4) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k" GDA_WG_K "." GDA_WG_TYPE " "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1" GDA_WG_TRANS_B ";\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    }
}

// d[mb] += A_mb B over S k-steps for the m64 blocks mb < MB of rows: fa(s, mb, hi, lo) builds
// this warp's fragment of A_mb at k-step s (split), B is split at the shared addresses b_hi,
// b_lo (256 bytes, two cores along k, a k-step; row groups sbo bytes apart), no lo term where
// BX and BF16 (an exact bf16 input). The next k-step's fragments are built while this one's
// products run (two register sets; wait_group 1 frees the older).
template <int MB, int J, int S, bool BX, typename FA>
__device__ __forceinline__ void gda_wg_product(float (*d)[J][4], FA fa, unsigned b_hi, unsigned b_lo,
                                               unsigned sbo) {
    unsigned ah[2][MB][4], al[2][MB][4];
    #pragma unroll
    for (int mb = 0; mb < MB; ++mb) fa(0, mb, ah[0][mb], al[0][mb]);
    #pragma unroll
    for (int mb = 0; mb < MB; ++mb) gda_wg_pin<J>(d[mb]);
    #pragma unroll
    for (int s = 0; s < S; ++s) {
        gda_wg_fence();
        #pragma unroll
        for (int mb = 0; mb < MB; ++mb) gda_wgmma<J>(d[mb], al[s & 1][mb], gda_wg_desc(b_hi + 256 * s, sbo));
        if constexpr (!(BX && GDA_BF16))
            #pragma unroll
            for (int mb = 0; mb < MB; ++mb) gda_wgmma<J>(d[mb], ah[s & 1][mb], gda_wg_desc(b_lo + 256 * s, sbo));
        #pragma unroll
        for (int mb = 0; mb < MB; ++mb) gda_wgmma<J>(d[mb], ah[s & 1][mb], gda_wg_desc(b_hi + 256 * s, sbo));
        gda_wg_commit();
        if (s + 1 < S) {
            gda_wg_wait<1>();
            #pragma unroll
            for (int mb = 0; mb < MB; ++mb) fa(s + 1, mb, ah[(s + 1) & 1][mb], al[(s + 1) & 1][mb]);
        }
    }
    gda_wg_wait<0>();
    #pragma unroll
    for (int mb = 0; mb < MB; ++mb) gda_wg_pin<J>(d[mb]);
}

// A fragment of one k-step for wgmma: TF32 as mma.cuh's gda_frag_a; BF16 register j holds the
// columns c, c + 1 (c = 2t + 8 (j >> 1)) of row g + 8 (j & 1), the order B is stored in
template <typename F>
__device__ __forceinline__ void gda_wg_frag_a(F f, int lane, unsigned (&hi)[4], unsigned (&lo)[4]) {
#if GDA_BF16
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int r = g + 8 * (j & 1), c = 2 * t + 8 * (j >> 1);
        gda_split2<false>(f(r, c), f(r, c + 1), hi[j], lo[j]);
    }
#else
    gda_frag_a(f, lane, hi, lo);
#endif
}

// B [N][KD] (element (n, kk) = f(n, kk), fp32) split into hi and lo (no lo when EXACT and BF16:
// a bf16 input) at
// b_hi, b_lo in the layout above, by the NTHR threads tid: a warp writes one core matrix (its
// lanes: row lane / 4, word lane % 4) at a time
template <int N, int KD, int NTHR, bool EXACT, typename F>
__device__ __forceinline__ void gda_wg_split_b(F f, unsigned* b_hi, unsigned* b_lo, int tid) {
    constexpr int W = GDA_WG_WORDS(KD), CORES = (N / 8) * (W / 4);
    static_assert(N % 8 == 0 && KD % (2 * GDA_WG_KC) == 0, "B: whole core matrices, whole k-steps");
    const int lane = tid & 31, rn = lane >> 2, rw = lane & 3;
    #pragma unroll 2
    for (int c = tid >> 5; c < CORES; c += NTHR / 32) {
        const int n = 8 * (c / (W / 4)) + rn, w = 4 * (c % (W / 4)) + rw;
        unsigned hi, lo;
#if GDA_BF16
        gda_split2<EXACT>(f(n, 2 * w), f(n, 2 * w + 1), hi, lo);
#else
        gda_split(f(n, w), hi, lo);
#endif
        b_hi[32 * c + lane] = hi;
        if constexpr (!(EXACT && GDA_BF16)) b_lo[32 * c + lane] = lo;
    }
}

// the 32 accumulators of an m64n64 product (d[8][4]) as an asm statement's outputs
#define GDA_WG_D64(d) \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
    "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
    "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
    "+f"(d[7][2]), "+f"(d[7][3])

// d (fresh where add is 0, else d +) A B: one m64n64k16 product of bfloat16 operands, both in
// shared memory (descriptors da, db of K-major layouts, gda_wg_desc), the accumulators as
// gda_wgmma's (d[j]: mma.cuh's accumulator of value tile j of the warp's 16 rows)
__device__ __forceinline__ void gda_wgmma_ss(float (&d)[8][4], unsigned long long da,
                                             unsigned long long db, int add) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : GDA_WG_D64(d)
                 : "l"(da), "l"(db), "r"(add));
}

// d (fresh where add is 0, else d +) a B: one m64n64k16 product of bfloat16 operands, a this
// warp's A fragment in registers (mma.cuh's: its 16 rows of the 64), B at descriptor db
// (gda_wg_desc), K-major (TB = 0) or MN-major (TB = 1: a core matrix is 8 k of 8 n, 16 bytes a
// k; cores along k LBO apart, along n SBO), the accumulators as gda_wgmma_ss's
template <int TB>
__device__ __forceinline__ void gda_wgmma_rs(float (&d)[8][4], const unsigned (&a)[4],
                                             unsigned long long db, int add) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
                 : GDA_WG_D64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(add), "n"(TB));
}

// ---- Clusters (SCAN_O_MC): a chunk's operands copied once into every CTA of a cluster, on
// common.cuh's mbarriers.
// every thread of every CTA of the cluster (release, acquire at cluster scope)
__device__ __forceinline__ void gda_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                 ::: "memory");
}
__device__ __forceinline__ unsigned gda_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// one arrival on the mbarrier at bar's place in the cluster's CTA of rank ``rank`` (this one's
// reads before it ordered before what that CTA does after the phase: release, cluster scope)
__device__ __forceinline__ void gda_mbar_arrive_at(unsigned bar, unsigned rank) {
    asm volatile("{\n\t.reg .b32 at;\n\tmapa.shared::cluster.u32 at, %0, %1;\n\t"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [at];\n\t}"
                 :: "r"(bar), "r"(rank) : "memory");
}
// ``bytes`` (a multiple of 16) from global src (16-byte aligned) to this CTA's shared address dst
// (16-byte aligned), its mbarrier bar counting them as they land (complete_tx); one thread's
__device__ __forceinline__ void gda_bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// bytes more of copies for the current phase of this CTA's mbarrier bar to wait for, with no
// arrival (the phase's arrivals are counted as before)
__device__ __forceinline__ void gda_mbar_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(bytes)
                 : "memory");
}
// ``bytes`` (a multiple of 16) from global src (16-byte aligned) to the shared address dst of
// every CTA of the cluster in ``mask`` (bit r: rank r), each CTA's mbarrier at bar's place
// counting them as they land (complete_tx); issued by one thread
__device__ __forceinline__ void gda_bulk_multicast(unsigned dst, const void* src, unsigned bytes,
                                                   unsigned bar, unsigned short mask) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1], %2, [%3], %4;"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(mask) : "memory");
}
#endif
