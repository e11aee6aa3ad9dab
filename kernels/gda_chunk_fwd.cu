// gda_chunk_fwd: gated linear attention, forward, in chunks of BT = 64 steps on the tensor cores.
//
//   S_t = diag(g_t) S_{t-1} + k_t v_t^T,   o_t = scale * S_t^T q_t        (S: [K, V], fp32)
//
// Per chunk, the numbered stages of the chunked form (cupy_gda.reference.gated_attention_chunked
// and docs/perf-notes.md number them the same way), each a __device__ function below:
//   1. load:    q, k, g, v of the chunk into shared memory as fp32 (rows past the sequence:
//               gate 1, q = k = v = 0, which leaves S exactly unchanged).
//   2. scores:  W[t][s] = sum_k q_t k_s prod_{s<r<=t} g_r, s <= t, of the diagonal sub-blocks
//               (BS = 16 steps), on the CUDA cores: one lane per column carrying the running
//               products, the K-sum by a transposed shuffle reduction; the warps of a pair take
//               the even and the odd rows t. (The other scores come in 4 from 3's products.)
//   3. decays:  gate products, one thread per column. Warps 0-3 from the chunk end: k*D (D:
//               product after s to the chunk end), A_end, and for each anchor a = 16, 32, 48
//               the anchored keys kA_a[s] = k_s prod_{s<r<a} g_r; warps 4-7 from the start: q*P
//               (P: prefix product inside the sub-block) and B_i, the product of the sub-blocks
//               before i, so that q*A = q*P*B_i (A: prefix product over the chunk).
//   4. output:  rows of sub-block i: o = scale ((q*P*B_i) S + ((q*P)_i kA_{16i}^T) v_{<16i}
//               + W_i v_i), on the tensor cores; staged through shared memory for coalesced
//               16-byte stores.
//   5. state:   S = diag(A_end) S + (k*D)^T v (tensor cores), in place in shared memory.
// Every decay factor is a product of gates, never a quotient or a difference of logs, so gates
// of 0, tiny, negative or above 1 stay exact (fla's chunk mode divides).
// The guard: stages 2-5 run while the chunk's inputs and S are in range (|q|, |k|, |v|, |S| <=
// GDA_VAL_MAX = 2^24, |g| <= GDA_GATE_MAX = sqrt 2: then no product or sum of the chunked form
// exceeds 2^118 (gate products of BT steps 2^32, sums of 256 key columns and BT steps), so
// nothing can overflow, or form inf * 0, where the loop does not); a chunk outside it (NaN,
// inf, large gates: their products over 64 steps leave float range) is stepped on the CUDA
// cores instead, the loop itself, so every method gives the loop's result there. Inputs loaded
// through registers are checked there; cp.async copies by stage 3 (which reads q, k and the
// gates once each) and S by stage 5, as they are in registers. The verdict (__syncthreads_or)
// is stage 3's barrier: stage 2's scores wait in registers for it (one key tile: in b_w, which
// a stepped chunk overwrites), and a chunk that fails it is loaded again (stage 3 has scaled q
// and k in place) before it is stepped.
// Key tiles: every term above is a sum over the key columns and S's rows are independent, so
// K > KT runs stages 1-5 once per tile of KT columns (q, k, g of the tile staged; v once, with
// the first): the tiles add their scores (2, 4b) into the scores tile and their (q*A) S into
// the warps' output sums (in shared memory between tiles); 4c, 4d follow the last tile. One tile (KT = K padded to 16)
// for K <= 128, the chunk then running exactly as without tiles.
//
// Grid (1-D): one block per (sequence n, head h, segment p of the sequence, tile of BV value
//   columns), block id (((n * H) + h) * P + p) * NV + iv. Block: 8 warps, sequential over the
//   chunks of its segment, the state S [KR, BV] in shared memory (fp32). The pair of warps i and
//   7 - i owns the output rows of sub-block i, each warp half of the value columns (warp w runs
//   on scheduler w % 4, which so holds sub-blocks i and 3 - i: later sub-blocks have more stage-4
//   work); in stage 5 each warp owns one value half of MR row tiles of 16.
// Segments: with P > 1, gda_chunk_state first runs segments 0..P-2 from S = 0 (stages 1, 3 and
//   5 only) and leaves each one's S and gate product in a workspace; then gda_chunk_fwd's block
//   for segment p starts from h0 carried through those of segments 0..p-1, so the sequence's
//   chunks run P at a time. The workspace is (P - 1) * (K * V + 2 K) floats per sequence-head
//   (the gate products as m 2^e: common.cuh gda_carry), every element written by
//   gda_chunk_state before gda_chunk_fwd reads it. Where an entry's m is not finite (an inf or
//   NaN gate: common.cuh gda_carried) each thread steps its elements of S through the sequence's
//   rows before its segment from h0 instead, on the CUDA cores (rare, slow, the loop's result).
// Loads: with ASYNC_COPY (float32 inputs, multiplicative gate, K and V multiples of 4) and
//   16-byte aligned pointers, stage 1 copies by cp.async (with DBUF, into the other of two sets
//   while this chunk is computed); otherwise through registers (converted, exp of log gates).
//   -DGDA_PROFILE prints block 0's and the last block's cycles per stage and of the prologue
//   (the carry) (scripts/profile_chunk.py).
// Precision: every matmul splits its operands (kernels/mma.cuh): 3xTF32 for float32 and float16
//   inputs, bf16 mma with bf16 terms for bfloat16 inputs; no plain TF32 anywhere.
// WGMMA (the Hopper variant, built for sm_90a; kernels/wgmma.cuh): 4a and 5 by warpgroup MMA,
//   their B operands (S^T of the key tile, v^T) split once a chunk into a scratch over the
//   gates and kA (both dead by then: 4b runs before 4a), their A operands from registers as
//   before; the same splits and products, so the same accuracy. Warp w & 3 of warpgroup w >> 2
//   owns sub-block w & 3 (the pair is w and w ^ 4) and value half w >> 2 in stages 4 and 5.
// Sequences: rows [bos, eos) of the [B*T, H, *] tensors; cu_seqlens (varlen, B = 1, offsets
//   clamped to [0, T]) or bos = n*T. No host syncs, no atomics.
//
// Required defines: K_DIM (1..256), V_DIM (any), IO_DTYPE, G_DTYPE, LOG_GATE, SEQ_INT64,
//   ASYNC_COPY (1 exactly where GDA_ASYNC_INPUTS), SMEM_BYTES (the launcher's dynamic shared
//   memory, checked against the layout below), ENTRIES (bit 0: gda_chunk_fwd, bit 1:
//   gda_chunk_state, which only a plan of sequence segments launches; an entry left out is not
//   in the module, its compile half the build's). Tunable: BV (a multiple of 8, at most 64), KT
//   (key columns a tile: a multiple of 16, at most 128; default K padded to 16), DBUF
//   (ASYNC_COPY and one key tile only), WGMMA (KT a multiple of 64, BV of 16, no DBUF) and
//   with it WG_4A (0: stage 5 only by wgmma).
// Launcher: cupy_gda/chunk.py. Reference: cupy_gda.reference.gated_attention_ref (and
//   gated_attention_chunked, the same stages in NumPy).
#if !defined(K_DIM) || !defined(V_DIM) || !defined(LOG_GATE) || !defined(SEQ_INT64) \
    || !defined(ASYNC_COPY) || !defined(SMEM_BYTES) || !defined(ENTRIES)
#error "K_DIM, V_DIM, LOG_GATE, SEQ_INT64, ASYNC_COPY, SMEM_BYTES and ENTRIES are required"
#endif
#ifndef BV
#define BV 64
#endif
#ifndef WGMMA
#define WGMMA 0                                // Hopper variant (sm_90a): 4a and 5 by wgmma
#endif
#ifndef WG_4A
#define WG_4A 1                                // WGMMA: 4a by wgmma too (0: stage 5 only)
#endif
#ifndef DBUF
#define DBUF 0                                 // two sets of staged inputs: the next chunk's
#endif                                         //   copies in flight during this one (cp.async)
#define BT 64                                  // steps per chunk
#define BS 16                                  // steps per sub-block (one warp pair's output rows)
#define NW 8                                   // warps: a pair per sub-block
#define NT (NW * 32)
#ifndef KT
#define KT (((K_DIM) + 15) / 16 * 16)          // key columns a tile: K padded to the m16 / k8 tiles
#endif
#define NKT (((K_DIM) + KT - 1) / KT)          // key tiles, each a pass of stages 1-5 over the chunk
#define KP KT                                  // a tile's (padded) key columns
#define KLOAD (NKT == 1 && !WGMMA ? K_DIM : KT)  // key columns stage 1 writes (the rest once, 0)
#define KR (NKT * KT)                          // state rows (K padded to whole tiles)
#define QS (KP + 4)                            // row strides (floats) that keep the fragment
#define KS (KP + 8)                            //   loads free of bank conflicts
#define VS (BV + 8)
#define WS (BT + 4)
#define MT (KP / 16)                           // state row tiles
#define NTV (BV / 8)                           // value column tiles
#define NTH ((NTV + 1) / 2)                    // value column tiles of one warp (its half)
#define EVEN (NTV % 2 == 0)                    // both halves NTH tiles wide (else the second is short)
#define MR ((MT + NW / 2 - 1) / (NW / 2))      // stage 5 row tiles per warp
#define KJ ((KP + 31) / 32)                    // columns per lane in stage 2
#define LB 4                                   // stage 1: loads of each tensor in flight a thread
#define GDA_VAL_MAX 0x1p24f                    // the guard: |q|, |k|, |v|, |S| at most this, and
#define GDA_GATE_MAX 1.41421356f               //   |g| at most this (64 gates: at most 2^32)
#define V_IN_3 (2 * KP < NT)                   // stage 3's threads with no column check v
#define KD_APART (!WGMMA)                      // the state pass: k*D into kA's room (stage 3)
#define KW ((KP + 31) / 32 * 32)               // threads of the warps with a key column
#define SP (NKT > 1 ? 1 : 4 * KW < NT ? 4 : 2 * KW < NT ? 2 : 1)  // the state pass's k scan:
                                               //   parts of BT / SP rows (one key tile: registers)
static_assert(K_DIM >= 1 && K_DIM <= 256, "K_DIM must be 1..256");
static_assert(KT % 16 == 0 && KT <= NT / 2, "KT must be a multiple of 16, at most 128 (one scan thread per column and direction)");
static_assert(NKT == 1 || KT < K_DIM, "KT must cover K_DIM in whole tiles");
static_assert(NKT == 1 || !DBUF, "DBUF needs a single key tile (the next chunk's copies go into the other set)");
static_assert(BS == 16 && BT == 4 * BS, "stage 2's reduction and the anchors assume BS = 16, BT = 64");
static_assert(BV <= BT, "o is staged in the rows of the scores tile");
static_assert(NW == 2 * (BT / BS), "a pair of warps per sub-block ((w & 3) ^ 3 (w >> 2), w >> 2)");
static_assert(BV % 8 == 0 && BV >= 8 && BV <= 64, "BV must be a multiple of 8, at most 64");
static_assert(ASYNC_COPY == GDA_ASYNC_INPUTS, "ASYNC_COPY must be 1 exactly for float32 inputs, a "
              "multiplicative float32 gate and K, V multiples of 4 (cupy_gda/_launch.py cp_async_inputs)");
static_assert(!DBUF || ASYNC_COPY, "DBUF needs the cp.async path (float32, multiplicative gate, K and V multiples of 4)");
static_assert(!WGMMA || (KT % 64 == 0 && BV % 16 == 0 && !DBUF),
              "WGMMA needs KT a multiple of 64 (stage 5's m64 blocks), BV of 16 (a warpgroup's half) and no DBUF");

// Shared memory layout (floats), in this order; with DBUF the set q, g, k, v twice. WGMMA: the
// gates last in the set, so that with kA after them they make the scratch SM_X of the split B
// operands (free once stage 3 has run and 4b has read kA).
#if WGMMA
#define SM_Q 0                                 // [BT][QS]  q, then q*P
#define SM_K (SM_Q + BT * QS)                  // [BT][KS]  k, then k*D
#define SM_V (SM_K + BT * KS)                  // [BT][VS]
#define SM_A (SM_V + BT * VS)                  // [BT][QS]  gates
#define SM_SET (SM_A + BT * QS)                // one set of staged inputs
#else
#define SM_Q 0                                 // [BT][QS]  q, then q*P
#define SM_A (SM_Q + BT * QS)                  // [BT][QS]  gates
#define SM_K (SM_A + BT * QS)                  // [BT][KS]  k, then k*D
#define SM_V (SM_K + BT * KS)                  // [BT][VS]
#define SM_SET (SM_V + BT * VS)                // one set of staged inputs
#endif
#define SM_KA (SM_SET * (1 + DBUF))            // [96][QS]  kA for anchors 16 (rows 0..15),
                                               //           32 (16..47), 48 (48..95)
                                               //           (a stepped chunk: o's partial sums)
#define SM_S (SM_KA + 96 * QS)                 // [KR][VS]  S at the chunk start, every key tile
#define SM_W (SM_S + KR * VS)                  // [BT][WS]  scores of the sub-block rows
#define SM_E (SM_W + BT * WS)                  // [KP]      A_end: the chunk's gate product
#define SM_B (SM_E + KP)                       // [4][KP]   B_i: product of sub-blocks 0..i-1
#define SM_O (SM_B + 4 * KP)                   // [BT][VS]  o's sums between key tiles (NKT > 1)
#define SM_FLOATS (SM_O + (NKT > 1 ? BT * VS : 0))
static_assert(2 * NT <= 96 * QS, "a stepped chunk's partial sums of o fit in kA");
static_assert(BT * KS <= 96 * QS, "the state pass's k*D fits in kA's room (KD_APART)");
static_assert(SMEM_BYTES == SM_FLOATS * 4,
              "SMEM_BYTES (cupy_gda/chunk.py smem) differs from this kernel's layout");
#if WGMMA
#define SM_X SM_A                              // [BT + 96][QS]: S^T of the tile (4a) or v^T (5), hi then lo
static_assert(2 * GDA_WG_BYTES(BV, KP) <= 4 * (BT + 96) * QS && 2 * GDA_WG_BYTES(BV, BT) <= 4 * (BT + 96) * QS,
              "the split B operands fit in the gates and kA");
#endif

// Named barrier of the two warps (64 threads) of one sub-block; id 0 is __syncthreads
__device__ __forceinline__ void gda_pair_sync(int id) {
    asm volatile("bar.sync %0, 64;" :: "r"(id) : "memory");
}

// A warp's roles: the pair of warps w and 7 - w owns the output rows of sub-block i_s (stage 2:
// the even and the odd rows; stage 4: a value half each)
struct gda_chunk_warp {
    int w, lane, lg, lt;                       // warp, lane; fragment row group, thread in group
    int half, i_s, r0;                         // value half (stage 2: row parity), sub-block, its first row
    int nb, nn;                                // this warp's first value tile, and how many
};

__device__ __forceinline__ gda_chunk_warp gda_chunk_roles(int tid) {
    gda_chunk_warp r;
    r.w = tid >> 5;
    r.lane = tid & 31;
    r.lg = r.lane >> 2;
    r.lt = r.lane & 3;
    r.half = r.w >> 2;
    r.i_s = WGMMA ? r.w & 3 : (r.w & 3) ^ (3 * r.half);   // 0 1 2 3 3 2 1 0 (WGMMA: warp w & 3
                                               //   of a warpgroup has rows 16 (w & 3) of its m64)
    r.r0 = BS * r.i_s;
    r.nb = NTH * r.half;
    r.nn = EVEN ? NTH : NTV - r.nb < NTH ? NTV - r.nb : NTH;   // 0 only when NTV = 1
    return r;
}

// Packs of 4 elements for 16-byte (float) or 8-byte (16-bit) loads.
template <int SIZE> struct gda_vec4;
template <> struct gda_vec4<4> { typedef float4 t; };
template <> struct gda_vec4<2> { typedef uint2 t; };
template <typename E, int W> union gda_pack { E e[W]; };
template <typename E> union gda_pack<E, 4> { typename gda_vec4<sizeof(E)>::t v; E e[4]; };

template <typename E, int W> __device__ __forceinline__ gda_pack<E, W> gda_ld(const E* p) {
    gda_pack<E, W> r;
    if constexpr (W == 4) r.v = *reinterpret_cast<const typename gda_vec4<sizeof(E)>::t*>(p);
    else r.e[0] = *p;
    return r;
}

// A pack of o to global memory at p in one store: 16 bytes of float by gda_st16 (NVRTC split the
// float4 store into four of 4 bytes, each its own sector write: perf-notes v47, v48), 8 of a
// 16-bit type as one uint2 (which it keeps whole)
template <typename E> __device__ __forceinline__ void gda_st_out(E* p, const gda_pack<E, 4>& x) {
    if constexpr (sizeof(E) == 4)
        gda_st16(p, __float_as_uint(x.e[0]), __float_as_uint(x.e[1]), __float_as_uint(x.e[2]),
                 __float_as_uint(x.e[3]));
    else
        *reinterpret_cast<uint2*>(p) = x.v;
}

// A pack to shared memory: one 16-byte store for 4 floats (the row strides keep packs aligned;
// 4 scalar stores a lane 16 bytes apart would be 4-way bank conflicts)
template <int W> __device__ __forceinline__ void gda_st(float* p, const gda_pack<float, W>& x) {
    if constexpr (W == 4) *reinterpret_cast<float4*>(p) = x.v;
    else p[0] = x.e[0];
}

// Stage 1 through registers (half inputs, log gates, unaligned pointers) into the set at b_set:
// q (when Q), k, g in packs of W (PR packs a row, key columns c < nk of the tile), v (when
// load_v) in packs of WV (PRV a row, tile columns c < nc), rows t < n of the chunk starting at
// row r0 (the rest: q = k = v = 0, gate 1), converted to fp32. Up to LB loads of each tensor in
// flight per thread, every tensor's issued before the first store. The guard's share, on the
// values in registers: the maxima of |q|, |k|, |v| into mv, of |g| into mg.
template <int PR, int W, int PRV, int WV, bool Q>
__device__ __forceinline__ void gda_stage(const io::t* __restrict__ q, const io::t* __restrict__ k,
                                          const gt::t* __restrict__ g, const io::t* __restrict__ v,
                                          float* b_q, float* b_k, float* b_a, float* b_v,
                                          long long r0, long long n, long long sk, long long sv,
                                          long long colk, long long colv, int nk, int nc, bool load_v,
                                          int tid, float& mv, float& mg) {
    constexpr int NP = BT * PR, EP = (NP + NT - 1) / NT, LK = EP < LB ? EP : LB;
    constexpr int NPV = BT * PRV, EPV = (NPV + NT - 1) / NT, LV = EPV < LB ? EPV : LB;
    constexpr int RK = (EP + LK - 1) / LK, RV = (EPV + LV - 1) / LV, ROUNDS = RK > RV ? RK : RV;
    #pragma unroll 1
    for (int i0 = 0; i0 < ROUNDS; ++i0) {
        gda_pack<io::t, W> rq[LK], rk[LK];
        gda_pack<gt::t, W> rg[LK];
        gda_pack<io::t, WV> rv[LV];
        #pragma unroll
        for (int j = 0; j < LK; ++j) {
            const int e = tid + (i0 * LK + j) * NT, t = e / PR, c = e % PR;
            if (i0 * LK + j < EP && e < NP && t < n && W * c < nk) {
                const long long off = (r0 + t) * sk + colk + W * c;
                if (Q) rq[j] = gda_ld<io::t, W>(q + off);
                rk[j] = gda_ld<io::t, W>(k + off);
                rg[j] = gda_ld<gt::t, W>(g + off);
            }
        }
        #pragma unroll
        for (int j = 0; j < LV; ++j) {
            const int e = tid + (i0 * LV + j) * NT, t = e / PRV, c = e % PRV;
            if (load_v && i0 * LV + j < EPV && e < NPV && t < n && WV * c < nc)
                rv[j] = gda_ld<io::t, WV>(v + (r0 + t) * sv + colv + WV * c);
        }
        #pragma unroll
        for (int j = 0; j < LK; ++j) {
            const int e = tid + (i0 * LK + j) * NT, t = e / PR, c = e % PR;
            if (i0 * LK + j < EP && e < NP) {
                const bool m = t < n && W * c < nk;
                gda_pack<float, W> fq, fk, fa;
                #pragma unroll
                for (int i = 0; i < W; ++i) {
                    fq.e[i] = m ? io::load(rq[j].e[i]) : 0.f;
                    fk.e[i] = m ? io::load(rk[j].e[i]) : 0.f;
                    fa.e[i] = m ? gda_gate(rg[j].e[i]) : 1.f;
                    if (Q) gda_absmax(mv, fq.e[i]);
                    gda_absmax(mv, fk.e[i]);
                    gda_absmax(mg, fa.e[i]);
                }
                if (Q) gda_st(b_q + t * QS + W * c, fq);
                gda_st(b_k + t * KS + W * c, fk);
                gda_st(b_a + t * QS + W * c, fa);
            }
        }
        #pragma unroll
        for (int j = 0; j < LV; ++j) {
            const int e = tid + (i0 * LV + j) * NT, t = e / PRV, c = e % PRV;
            if (load_v && i0 * LV + j < EPV && e < NPV) {
                const bool m = t < n && WV * c < nc;
                gda_pack<float, WV> fv;
                #pragma unroll
                for (int i = 0; i < WV; ++i) {
                    fv.e[i] = m ? io::load(rv[j].e[i]) : 0.f;
                    gda_absmax(mv, fv.e[i]);
                }
                gda_st(b_v + t * VS + WV * c, fv);
            }
        }
    }
}

#if ASYNC_COPY
// Stage 1 for float32 q (when Q), k, g (multiplicative) and v (when load_v), 16-byte aligned,
// into the set at b_set: asynchronous 16-byte copies, all in flight at once, committed as one
// group (the caller waits); rows t >= n, key columns c >= nk and value columns past V written
// directly (0, gate 1).
template <bool Q>
__device__ __forceinline__ void gda_stage_async(const float* __restrict__ q, const float* __restrict__ k,
                                                const float* __restrict__ g, const float* __restrict__ v,
                                                float* b_q, float* b_k, float* b_a, float* b_v,
                                                long long r0, long long n, long long sk, long long sv,
                                                long long colk, long long colv, int nk, int nc,
                                                bool load_v, int tid) {
    constexpr int PK = KLOAD / 4, PV = BV / 4;
    #pragma unroll 1
    for (int e = tid; e < BT * PK; e += NT) {
        const int t = e / PK, c = 4 * (e % PK);
        if (t < n && c < nk) {
            const long long off = (r0 + t) * sk + colk + c;
            if (Q) gda_cp16(b_q + t * QS + c, q + off);
            gda_cp16(b_k + t * KS + c, k + off);
            gda_cp16(b_a + t * QS + c, g + off);
        } else {
            if (Q) *reinterpret_cast<float4*>(b_q + t * QS + c) = make_float4(0.f, 0.f, 0.f, 0.f);
            *reinterpret_cast<float4*>(b_k + t * KS + c) = make_float4(0.f, 0.f, 0.f, 0.f);
            *reinterpret_cast<float4*>(b_a + t * QS + c) = make_float4(1.f, 1.f, 1.f, 1.f);
        }
    }
    #pragma unroll 1
    for (int e = load_v ? tid : BT * PV; e < BT * PV; e += NT) {
        const int t = e / PV, c = 4 * (e % PV);
        if (t < n && c < nc) gda_cp16(b_v + t * VS + c, v + (r0 + t) * sv + colv + c);
        else *reinterpret_cast<float4*>(b_v + t * VS + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    gda_cp_commit();
}

// The same into the set at b_sm + at, for the chunk at row t1 of the segment (rows up to s1)
template <bool Q>
__device__ __forceinline__ void gda_copy_chunk(const float* __restrict__ q, const float* __restrict__ k,
                                               const float* __restrict__ g, const float* __restrict__ v,
                                               float* b_sm, int at, long long t1, long long s1,
                                               long long bos, long long sk, long long sv, long long colk,
                                               long long colv, int nk, int nc, bool load_v, int tid) {
    gda_stage_async<Q>(q, k, g, v, b_sm + at + SM_Q, b_sm + at + SM_K, b_sm + at + SM_A, b_sm + at + SM_V,
                       bos + t1, s1 - t1, sk, sv, colk, colv, nk, nc, load_v, tid);
}
#endif

// 1. load key tile kt of the chunk at row t0 of the segment (rows up to s1) into the set at
//    b_sm + set: by cp.async where ASYNC_COPY and the pointers allow (with DBUF the copies were
//    issued a chunk ago; the next chunk's are issued into the other set now), else through
//    registers in 16- or 8-byte packs where K (V) and the pointers allow, else single elements.
//    Rows from bos, head i_h, key columns from kt * KT, value columns from v0; v only with the
//    first key tile (it stays for the others). The state pass (STATE) loads no q. Returns
//    whether it checked the guard's range of what it loaded itself (through registers: then
//    in_range holds this thread's verdict on q, k, g and v). With again (the guard failed after
//    stage 3 scaled q and k in place): the tile's q, k and gates once more, synchronously, no v.
template <bool STATE>
__device__ __forceinline__ bool gda_chunk_load(const io::t* __restrict__ q, const io::t* __restrict__ k,
                                               const gt::t* __restrict__ g, const io::t* __restrict__ v,
                                               float* b_sm, int set, float* b_q, float* b_k, float* b_a,
                                               float* b_v, long long t0, long long s1,
                                               long long bos, long long sk, long long sv, int i_h,
                                               int v0, int kt, bool vec_qkg, bool vec_v, int tid,
                                               bool again, bool& in_range) {
    const long long colk = (long long)i_h * K_DIM + kt * KT, colv = (long long)i_h * V_DIM + v0;
    const int nk = NKT == 1 ? K_DIM : K_DIM - kt * KT < KT ? K_DIM - kt * KT : KT;
    const bool load_v = kt == 0 && !again;
#if ASYNC_COPY
    if (vec_qkg && vec_v) {                     // float32 as is: copies that bypass registers
        if (!DBUF || again) {
            gda_copy_chunk<!STATE>(q, k, g, v, b_sm, set, t0, s1, bos, sk, sv, colk, colv, nk, V_DIM - v0,
                                   load_v, tid);
            gda_cp_wait<0>();
        } else if (t0 + BT < s1) {              // this chunk's copies were issued a chunk ago
            gda_copy_chunk<!STATE>(q, k, g, v, b_sm, SM_SET - set, t0 + BT, s1, bos, sk, sv, colk, colv,
                                   nk, V_DIM - v0, true, tid);
            gda_cp_wait<1>();
        } else {
            gda_cp_wait<0>();
        }
        return false;
    }
#endif
    {
        float mv = 0.f, mg = 0.f;
#define GDA_STAGE(W, WV) gda_stage<KLOAD / (W), W, BV / (WV), WV, !STATE>(                         \
            q, k, g, v, b_q, b_k, b_a, b_v, bos + t0, s1 - t0, sk, sv, colk, colv, nk, V_DIM - v0,    \
            load_v, tid, mv, mg)
        constexpr int PK4 = K_DIM % 4 == 0 ? 4 : 1, PV4 = V_DIM % 4 == 0 ? 4 : 1;
        if (vec_qkg) {
            if (vec_v) GDA_STAGE(PK4, PV4);
            else GDA_STAGE(PK4, 1);
        } else {
            if (vec_v) GDA_STAGE(1, PV4);
            else GDA_STAGE(1, 1);
        }
#undef GDA_STAGE
        in_range = (mv <= GDA_VAL_MAX) & (mg <= GDA_GATE_MAX);     // (NaN fails)
        return true;
    }
}

// One exchange of the transposed warp sum: lanes with bit O keep the upper N of their 2N
// partials, the others the lower N, each adding its partner's copy of the kept ones.
template <int N, int O>
__device__ __forceinline__ void gda_halve(float (&x)[BS], int lane) {
    const bool up = lane & O;
    #pragma unroll
    for (int s = 0; s < N; ++s) {
        const float send = up ? x[s] : x[s + N];
        const float keep = up ? x[s + N] : x[s];
        x[s] = keep + __shfl_xor_sync(GDA_FULL_MASK, send, O);
    }
}

// Stage 2 for the rows t = PAR, PAR + 2, ... of the sub-block at row r0:
// W[t][s] = sum_k q_t k_s prod_{s<r<=t} g_r, s <= t, over the tile's key columns, into b_res
// (row t's at t / 2, in the lanes with bit 0 clear; gda_diag_store stores them). Lane l carries
// columns l + 32j and their running products, advanced two rows at a time by g_{t-1} g_t; the
// K-sum is a transposed shuffle reduction.
template <int PAR>
__device__ __forceinline__ void gda_diag(const float* b_q, const float* b_k, const float* b_a,
                                         int r0, int lane, float (&b_res)[BS / 2]) {
    float b_pr[KJ][BS];                         // running k_s prod_{s<r<=t} g_r, per column
    #pragma unroll
    for (int t = PAR; t < BS; t += 2) {
        float b_part[BS];
        #pragma unroll
        for (int s = 0; s < BS; ++s) b_part[s] = 0.f;
        #pragma unroll
        for (int j = 0; j < KJ; ++j) {
            const int kk = lane + 32 * j;
            if (kk < KP) {
                if (t >= 1) {
                    const float fg = b_a[(r0 + t) * QS + kk];
                    if (t >= 2) {
                        const float g2 = b_a[(r0 + t - 1) * QS + kk] * fg;
                        #pragma unroll
                        for (int s = 0; s < t - 1; ++s) b_pr[j][s] *= g2;
                    }
                    b_pr[j][t - 1] = b_k[(r0 + t - 1) * KS + kk] * fg;
                }
                b_pr[j][t] = b_k[(r0 + t) * KS + kk];
                const float fq = b_q[(r0 + t) * QS + kk];
                #pragma unroll
                for (int s = 0; s <= t; ++s) b_part[s] = fmaf(fq, b_pr[j][s], b_part[s]);
            }
        }
        // sum the BS partials over the 32 lanes: halve the set at each exchange; lane l ends
        // with value (l >> 1) & 15
        gda_halve<8, 16>(b_part, lane);
        gda_halve<4, 8>(b_part, lane);
        gda_halve<2, 4>(b_part, lane);
        gda_halve<1, 2>(b_part, lane);
        b_res[t / 2] = b_part[0] + __shfl_xor_sync(GDA_FULL_MASK, b_part[0], 1);
    }
}

// Stage 2's sums b_res of the rows of parity PAR into b_w (added to it with acc: the key tiles
// after the first)
template <int PAR>
__device__ __forceinline__ void gda_diag_store(float* b_w, int r0, int lane, bool acc,
                                               const float (&b_res)[BS / 2]) {
    if ((lane & 1) == 0)
        #pragma unroll
        for (int t = PAR; t < BS; t += 2) {
            float* const w = b_w + (r0 + t) * WS + r0 + (lane >> 1);
            *w = acc ? *w + b_res[t / 2] : b_res[t / 2];
        }
}

// 2. scores of the warp's diagonal sub-block, the rows t of its parity (raw q, k and gates),
//    of the key tile into b_res, held there until the guard's verdict
__device__ __forceinline__ void gda_chunk_scores(const float* b_q, const float* b_k, const float* b_a,
                                                 const gda_chunk_warp& wp, float (&b_res)[BS / 2]) {
    if (wp.half) gda_diag<1>(b_q, b_k, b_a, wp.r0, wp.lane, b_res);
    else gda_diag<0>(b_q, b_k, b_a, wp.r0, wp.lane, b_res);
}

// 2'. the scores b_res of key tile kt into b_w (the tiles after the first add theirs)
__device__ __forceinline__ void gda_chunk_scores_store(float* b_w, const gda_chunk_warp& wp, int kt,
                                                       const float (&b_res)[BS / 2]) {
    if (wp.half) gda_diag_store<1>(b_w, wp.r0, wp.lane, kt > 0, b_res);
    else gda_diag_store<0>(b_w, wp.r0, wp.lane, kt > 0, b_res);
}

// m[i] = max(m[i], |x_i|) for the 4 elements of x (4 independent chains)
__device__ __forceinline__ void gda_absmax(float (&m)[4], float4 x) {
    gda_absmax(m[0], x.x); gda_absmax(m[1], x.y); gda_absmax(m[2], x.z); gda_absmax(m[3], x.w);
}

// Whether max.NaN(m) <= bound (NaN fails)
__device__ __forceinline__ bool gda_absmax_in(const float (&m)[4], float bound) {
    return (m[0] <= bound) & (m[1] <= bound) & (m[2] <= bound) & (m[3] <= bound);
}

// The guard's share of thread i of N in a staged tile of BT rows, C columns (a multiple of 4,
// at most 4 N) and row stride RS: every |x| at most bound. Thread (row group j, 4 columns c)
// reads rows j, j + R, ... (fully unrolled, constant offsets), 4 independent chains of max.NaN.
template <int N, int C, int RS>
__device__ __forceinline__ bool gda_tile_in_range(const float* b, int i, float bound) {
    constexpr int PC = C / 4, R = N / PC;
    static_assert(C % 4 == 0 && R >= 1, "a row of the tile is at most N float4s");
    float m[4] = {0.f, 0.f, 0.f, 0.f};
    const int j = i / PC, c = 4 * (i % PC);
    if (j < R)
        #pragma unroll
        for (int r = 0; r < (BT + R - 1) / R; ++r) {
            const int t = j + r * R;
            if (BT % R == 0 || t < BT)
                gda_absmax(m, *reinterpret_cast<const float4*>(b + t * RS + c));
        }
    return gda_absmax_in(m, bound);
}

// 3. decays of the key tile, one thread per column: from the end (threads 0..KP-1: k*D, the
//    anchored keys kA (not in the state pass), A_end into b_e), from the start (threads
//    NT/2 ..: q*P in place, B_i into b_b); both read the gates, they write disjoint tiles. k*D
//    goes in place, or with KD_APART (the state pass, which has no kA) into kA's room at k's
//    stride, so that k stays as loaded. A sub-block's 16 rows are loaded into registers before
//    its first store: the stores may alias the next loads for the compiler, which would
//    otherwise wait on each. The scan from the end is a chain of BT products a column; in the
//    state pass (KD_APART), where threads are free (SP > 1), it runs in SP parts of the rows,
//    each multiplied by the later parts' products after a barrier. With KD_APART the threads
//    kk < KP (part 0) also return in (dm_t, de_t) the segment's gate product (dm, de) times the
//    chunk's (the caller keeps it if the chunk is not stepped).
//    Returns the thread's share of the guard (true where it has none): q, k and the gates by
//    the threads that hold them in registers for their scan, before they scale them (k by its
//    scan's threads; q and the gates by the threads NT/2.., or by the k scan's threads in the
//    state pass, which has no q), and with check_v, v by the threads with no column (V_IN_3;
//    with KD_APART the whole warps from SP KW on). Shared memory's bandwidth is the scans' limit
//    here: a check that reads again what a scan holds in registers costs more than it saves.
template <bool STATE>
__device__ __forceinline__ bool gda_chunk_decays(float* b_q, float* b_k, const float* b_a, const float* b_v,
                                                 float* b_ka, float* b_e, float* b_b, int tid, bool check_v,
                                                 float& dm_t, float& de_t) {
    constexpr bool APART = STATE && KD_APART;
    float mv = 0.f, mg = 0.f;                   // running max |q| or |k|, |g| (max.NaN)
    if constexpr (APART && SP > 1) {
        // the state pass: k*D into kA's room, k kept. Thread part * KW + kk scans column kk over
        // the part's BT / SP rows from their end (SP parts: a chain SP times shorter); the later
        // parts' gate products come through b_b (a barrier of the block) and multiply its suffix
        // products; part 0 keeps the chunk's product. The threads from SP KW on check v.
        constexpr int R = BT / SP;
        const int part = tid / KW, kk = tid % KW;
        bool v_ok = true;
        float fk[R], dl[R], d = 1.f;            // k, suffix products inside the part
        if (part >= SP) {
            if (check_v)
                v_ok = gda_tile_in_range<NT - SP * KW, BV, VS>(b_v, tid - SP * KW, GDA_VAL_MAX);
        } else if (kk < KP) {
            float fg[R];
            #pragma unroll
            for (int i = 0; i < R; ++i) { fk[i] = b_k[(part * R + i) * KS + kk]; fg[i] = b_a[(part * R + i) * QS + kk]; }
            #pragma unroll
            for (int i = 0; i < R; ++i) { gda_absmax(mv, fk[i]); gda_absmax(mg, fg[i]); }
            #pragma unroll
            for (int i = R - 1; i >= 0; --i) { dl[i] = d; d *= fg[i]; }
            if (part > 0) b_b[(part - 1) * KP + kk] = d;
        }
        __syncthreads();                        // (the caller's fast: the same in every thread)
        if (part < SP && kk < KP) {
            float later = 1.f;                  // the product of the later parts' gates
            #pragma unroll
            for (int j = SP - 1; j > 0; --j)
                if (j > part) later *= b_b[(j - 1) * KP + kk];
            #pragma unroll
            for (int i = 0; i < R; ++i) b_ka[(part * R + i) * KS + kk] = fk[i] * (dl[i] * later);
            if (part == 0) {
                d *= later;
                b_e[kk] = d;
                gda_scaled_mul(dm_t, de_t, d);
            }
        }
        return v_ok & (mv <= GDA_VAL_MAX) & (mg <= GDA_GATE_MAX);      // (NaN fails)
    }
    if (tid < KP) {
        const int kk = tid;
        float* const b_kd = APART ? b_ka : b_k;
        float d = 1.f, e1 = 1.f, e2 = 1.f, e3 = 1.f;     // suffix products (to end, to anchors)
        #pragma unroll
        for (int sb = BT - BS; sb >= 0; sb -= BS) {
            float fk[BS], fg[BS];
            #pragma unroll
            for (int i = 0; i < BS; ++i) { fk[i] = b_k[(sb + i) * KS + kk]; fg[i] = b_a[(sb + i) * QS + kk]; }
            #pragma unroll
            for (int i = 0; i < BS; ++i) {
                gda_absmax(mv, fk[i]);
                if (APART) gda_absmax(mg, fg[i]);
            }
            #pragma unroll
            for (int i = BS - 1; i >= 0; --i) {
                const int s = sb + i;
                b_kd[s * KS + kk] = fk[i] * d;
                if constexpr (!STATE) {
                    if (s < 16) b_ka[s * QS + kk] = fk[i] * e1;
                    if (s < 32) b_ka[(16 + s) * QS + kk] = fk[i] * e2;
                    if (s < 48) b_ka[(48 + s) * QS + kk] = fk[i] * e3;
                }
                d *= fg[i];
                if (s < 16) e1 *= fg[i];
                if (s < 32) e2 *= fg[i];
                if (s < 48) e3 *= fg[i];
            }
        }
        b_e[kk] = d;
        if (APART) gda_scaled_mul(dm_t, de_t, d);
    } else if constexpr (APART) {
        if (tid >= KW && check_v)               // (whole warps: no scan lane waits on them)
            return gda_tile_in_range<NT - KW, BV, VS>(b_v, tid - KW, GDA_VAL_MAX);
    } else if (STATE && tid >= NT / 2 && tid < NT / 2 + KP) {
        #pragma unroll 16
        for (int t = 0; t < BT; ++t) gda_absmax(mg, b_a[t * QS + tid - NT / 2]);
    } else if (tid >= NT / 2 && tid < NT / 2 + KP) {
        const int kk = tid - NT / 2;
        float a = 1.f;                                    // prefix over the chunk
        #pragma unroll
        for (int tb = 0; tb < BT; tb += BS) {
            float fq[BS], fg[BS];
            #pragma unroll
            for (int i = 0; i < BS; ++i) { fq[i] = b_q[(tb + i) * QS + kk]; fg[i] = b_a[(tb + i) * QS + kk]; }
            #pragma unroll
            for (int i = 0; i < BS; ++i) { gda_absmax(mv, fq[i]); gda_absmax(mg, fg[i]); }
            b_b[(tb / BS) * KP + kk] = a;
            float p = 1.f;                                // prefix inside the sub-block
            #pragma unroll
            for (int i = 0; i < BS; ++i) {
                p *= fg[i];
                b_q[(tb + i) * QS + kk] = fq[i] * p;
            }
            a *= p;
        }
    } else if constexpr (V_IN_3) {              // threads KP.. and NT/2 + KP..: v
        if (check_v)
            return gda_tile_in_range<NT - 2 * KP, BV, VS>(b_v, tid < NT / 2 ? tid - KP : tid - 2 * KP,
                                                          GDA_VAL_MAX);
    }
    return (mv <= GDA_VAL_MAX) & (mg <= GDA_GATE_MAX);        // (NaN fails)
}

// 4b. scores of the rows 16 NS.. (sub-block NS) against the earlier sub-blocks: (q*P)
//     kA_{16 NS}^T, columns 0..16 NS - 1, in 2 NS tiles of 8, NS of them by each warp of the
//     pair, into b_w (the key tiles after the first add theirs). NS a constant: the loads and
//     products of the k-step loop unconditional (a runtime count made them branches there)
template <int NS>
__device__ __forceinline__ void gda_scores_earlier(const float* b_q, const float* b_ka, float* b_w,
                                                   const gda_chunk_warp& wp, int kt) {
    constexpr int R0 = BS * NS;
    const int lane = wp.lane, lg = wp.lg, lt = wp.lt;
    const float* ka = b_ka + (NS == 1 ? 0 : NS == 2 ? 16 : 48) * QS;
    const int c0 = NS * wp.half;                // this warp's first score tile
    float b_c[NS][4];
    #pragma unroll
    for (int n = 0; n < NS; ++n)
        #pragma unroll
        for (int r = 0; r < 4; ++r) b_c[n][r] = 0.f;
    #pragma unroll 2
    for (int kb = 0; kb < KP; kb += KSTEP) {
        unsigned ah[4], al[4], bh[NS][2], bl[NS][2];
        const float* pq = b_q + R0 * QS + kb;
        gda_frag_a([&](int r, int c) { return pq[r * QS + c]; }, lane, ah, al);
        #pragma unroll
        for (int n = 0; n < NS; ++n) {
            const float* pk = ka + 8 * (c0 + n) * QS + kb;        // kA^T
            gda_frag_b([&](int kk, int m) { return pk[m * QS + kk]; }, lane, bh[n], bl[n]);
        }
        gda_mma3<NS>(b_c, ah, al, bh, bl);
    }
    #pragma unroll
    for (int n = 0; n < NS; ++n)
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            float* const w = b_w + (R0 + lg + 8 * (r >> 1)) * WS + 8 * (c0 + n) + 2 * lt + (r & 1);
            *w = kt > 0 ? *w + b_c[n][r] : b_c[n][r];
        }
}

//     by the warp's sub-block i_s (warp-uniform; none for the first)
__device__ __forceinline__ void gda_chunk_scores_earlier(const float* b_q, const float* b_ka, float* b_w,
                                                         const gda_chunk_warp& wp, int kt) {
    if (wp.i_s == 1) gda_scores_earlier<1>(b_q, b_ka, b_w, wp, kt);
    else if (wp.i_s == 2) gda_scores_earlier<2>(b_q, b_ka, b_w, wp, kt);
    else if (wp.i_s == 3) gda_scores_earlier<3>(b_q, b_ka, b_w, wp, kt);
}

// The offset in shared memory of element r of this warp's output tile n (rows r0.., columns
// from 8 nb) in a [BT][stride] array
__device__ __forceinline__ int gda_o_at(const gda_chunk_warp& wp, int n, int r, int stride) {
    return (wp.r0 + wp.lg + 8 * (r >> 1)) * stride + 8 * (wp.nb + n) + 2 * wp.lt + (r & 1);
}

// 4. output rows r0..r0+15 of the chunk, value tiles nb..nb+nn-1 of this warp, in two parts.
//    The key tile's part (4a, 4b), once per key tile kt: b_o (this warp's accumulators: 0 at
//    the first tile, else the sums the earlier tiles left in b_os; left there again but after
//    the last tile, so they hold no registers across the other stages) += (q*A) S of the
//    tile's rows of S (b_s), and its scores against the earlier sub-blocks into b_w (4b).
//    WGMMA: 4b first, then S^T of the tile split once into the scratch b_x (over kA), and 4a
//    by each warpgroup on its value half; called by every thread (it has barriers).
__device__ __forceinline__ void gda_chunk_output_keys(const float* b_q, const float* b_ka,
                                                      const float* b_s, float* b_w, const float* b_b,
                                                      float* b_os, float* b_x, const gda_chunk_warp& wp,
                                                      float (&b_o)[NTH][4], int kt) {
    const int lane = wp.lane, i_s = wp.i_s, r0 = wp.r0, nb = wp.nb;
    #pragma unroll
    for (int n = 0; n < NTH; ++n)
        #pragma unroll
        for (int r = 0; r < 4; ++r) b_o[n][r] = kt == 0 ? 0.f : b_os[gda_o_at(wp, n, r, VS)];
#if WGMMA && WG_4A
    gda_chunk_scores_earlier(b_q, b_ka, b_w, wp, kt);
    __syncthreads();                            // kA is read: the scratch is free
    unsigned* const x_hi = reinterpret_cast<unsigned*>(b_x);
    unsigned* const x_lo = x_hi + GDA_WG_BYTES(BV, KP) / 4;
    gda_wg_split_b<BV, KP, NT, false>([&](int n, int kk) { return b_s[kk * VS + n]; }, x_hi, x_lo,
                                      32 * wp.w + lane);
    gda_proxy_fence();
    __syncthreads();
    // 4a. (q*A) S: A = q*A = (q*P) B_i formed at the fragment load, B = S^T from the scratch
    const float* pq = b_q + r0 * QS;
    const float* pb = b_b + i_s * KP;
    const unsigned a_hi = gda_smem_addr(x_hi) + nb * GDA_WG_SBO(KP);
    gda_wg_product<1, NTH, KP / KSTEP, false>(
        &b_o, [&](int s, int, unsigned (&ah)[4], unsigned (&al)[4]) {
            gda_wg_frag_a([&](int r, int c) { return pq[r * QS + KSTEP * s + c] * pb[KSTEP * s + c]; }, lane, ah, al);
        }, a_hi, a_hi + GDA_WG_BYTES(BV, KP), GDA_WG_SBO(KP));
#else
    // 4a. (q*A) S, q*A = (q*P) B_i formed at the fragment load
    #pragma unroll 2
    for (int kb = 0; kb < KP; kb += KSTEP) {
        unsigned ah[4], al[4];
        const float* pq = b_q + r0 * QS + kb;
        const float* pb = b_b + i_s * KP + kb;
        gda_frag_a([&](int r, int c) { return pq[r * QS + c] * pb[c]; }, lane, ah, al);
        gda_mma_tiles<NTH>(b_o, ah, al, b_s + kb * VS + 8 * nb, VS, wp.nn, lane);
    }
    gda_chunk_scores_earlier(b_q, b_ka, b_w, wp, kt);
#endif
    if (kt < NKT - 1)
        #pragma unroll
        for (int n = 0; n < NTH; ++n)
            #pragma unroll
            for (int r = 0; r < 4; ++r) b_os[gda_o_at(wp, n, r, VS)] = b_o[n][r];
}

//    The values' part (4c, 4d), after the last key tile's: b_o += scores v (when w_live: some
//    key tile took the fast path), then o scaled into o (rows t0 + r0.. up to s1 from bos,
//    head i_h, columns from v0)
__device__ __forceinline__ void gda_chunk_output_values(const float* b_v, float* b_w, bool w_live,
                                                        const gda_chunk_warp& wp, float (&b_o)[NTH][4],
                                                        io::t* __restrict__ o, bool vec_o, long long t0,
                                                        long long s1, long long bos, long long sv,
                                                        int i_h, int v0, float scale) {
    const int lane = wp.lane, i_s = wp.i_s, r0 = wp.r0, nb = wp.nb, nn = wp.nn;
    gda_pair_sync(1 + i_s);             // the pair's scores are in b_w
    // 4c. + scores v over the steps 0..r0+15 (tensor cores; the scores above the diagonal are
    //     exact zeros and v is finite: the guard), unless no key tile's scores are in b_w
    if (w_live)
        #pragma unroll
        for (int kb = 0; kb < BT; kb += KSTEP)
            if (kb < r0 + BS) {
                unsigned ah[4], al[4];
                const float* pw = b_w + r0 * WS + kb;
                gda_frag_a([&](int r, int c) { return pw[r * WS + c]; }, lane, ah, al);
                gda_mma_tiles<NTH, true>(b_o, ah, al, b_v + kb * VS + 8 * nb, VS, nn, lane);
            }
    // 4d. o through this warp's columns of the sub-block's rows of b_w (free once both
    //     warps are past 4c), then coalesced stores
    gda_pair_sync(1 + i_s);
    #pragma unroll
    for (int n = 0; n < NTH; ++n)
        if (n < nn)
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                b_w[gda_o_at(wp, n, r, WS)] = b_o[n][r] * scale;
    __syncwarp();
    const int cn = 8 * nn;                      // this warp's columns: 8nb .. 8nb+cn-1
#if V_DIM % 4 == 0
    if (vec_o) {
        #pragma unroll 2
        for (int e = lane; e < BS * (2 * NTH); e += 32) {
            const int t = e / (2 * NTH), c = 4 * (e % (2 * NTH));
            if (c < cn && t0 + r0 + t < s1 && v0 + 8 * nb + c < V_DIM) {
                gda_pack<io::t, 4> pk;
                #pragma unroll
                for (int i = 0; i < 4; ++i) pk.e[i] = io::store(b_w[(r0 + t) * WS + 8 * nb + c + i]);
                gda_st_out(o + (bos + t0 + r0 + t) * sv + (long long)i_h * V_DIM + v0 + 8 * nb + c, pk);
            }
        }
    } else
#endif
    {
        for (int e = lane; e < BS * 8 * NTH; e += 32) {
            const int t = e / (8 * NTH), c = e % (8 * NTH);
            if (c < cn && t0 + r0 + t < s1 && v0 + 8 * nb + c < V_DIM)
                o[(bos + t0 + r0 + t) * sv + (long long)i_h * V_DIM + v0 + 8 * nb + c]
                    = io::store(b_w[(r0 + t) * WS + 8 * nb + c]);
        }
    }
}

#if WGMMA
// 5. state of the key tile (b_s: its rows of S): S = diag(A_end) S + (k*D)^T v, by wgmma: v^T
//    split once into the scratch b_x (free: stage 4 is done, or stage 3 in the state pass),
//    then warpgroup g the value half g of every m64 block mb of rows, warp w & 3 its rows
//    64 mb + 16 (w & 3) (tile element r at row + lg + 8*(r>>1), column 8n + 2*lt + (r&1)),
//    each warp reading and writing only its own elements of S; called by every thread. Returns
//    whether this thread's elements of S end within GDA_VAL_MAX (the next chunk's guard)
__device__ __forceinline__ bool gda_chunk_update(float* b_s, const float* b_k, const float* b_v,
                                                 const float* b_e, float* b_x, const gda_chunk_warp& wp) {
    constexpr int MB = KP / 64;
    const int w = wp.w, lane = wp.lane, lg = wp.lg, lt = wp.lt, n5 = NTH * (w >> 2);
    unsigned* const x_hi = reinterpret_cast<unsigned*>(b_x);
    unsigned* const x_lo = x_hi + GDA_WG_BYTES(BV, BT) / 4;
    gda_wg_split_b<BV, BT, NT, true>([&](int n, int t) { return b_v[t * VS + n]; }, x_hi, x_lo, 32 * w + lane);
    gda_proxy_fence();
    float b_sr[MB][NTH][4];
    #pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
        const int m0 = 64 * mb + 16 * (w & 3);
        const float e0 = b_e[m0 + lg], e8 = b_e[m0 + lg + 8];
        #pragma unroll
        for (int n = 0; n < NTH; ++n)
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                b_sr[mb][n][r] = (r < 2 ? e0 : e8)
                    * b_s[(m0 + lg + 8 * (r >> 1)) * VS + 8 * (n5 + n) + 2 * lt + (r & 1)];
    }
    __syncthreads();                            // the split v is in the scratch
    const unsigned v_hi = gda_smem_addr(x_hi) + n5 * GDA_WG_SBO(BT);
    gda_wg_product<MB, NTH, BT / KSTEP, true>(
        b_sr, [&](int s, int mb, unsigned (&ah)[4], unsigned (&al)[4]) {
            const float* pk = b_k + KSTEP * s * KS + 64 * mb + 16 * (w & 3);     // (k*D)^T
            gda_wg_frag_a([&](int r, int c) { return pk[c * KS + r]; }, lane, ah, al);
        }, v_hi, v_hi + GDA_WG_BYTES(BV, BT), GDA_WG_SBO(BT));
    bool ok = true;
    #pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
        const int m0 = 64 * mb + 16 * (w & 3);
        #pragma unroll
        for (int n = 0; n < NTH; ++n)
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
                b_s[(m0 + lg + 8 * (r >> 1)) * VS + 8 * (n5 + n) + 2 * lt + (r & 1)] = b_sr[mb][n][r];
                ok &= fabsf(b_sr[mb][n][r]) <= GDA_VAL_MAX;
            }
    }
    return ok;
}
#else
// 5. state of the key tile (b_s: its rows of S): S = diag(A_end) S + (k*D)^T v; warp w owns
//    value half w & 1 of the row tiles
//    m = w / 2 + (NW / 2) i (tile element r at row 16m + lg + 8*(r>>1), column
//    8n + 2*lt + (r&1)), each warp reading and writing only its own tiles of S. Returns whether
//    this thread's elements of S end within GDA_VAL_MAX (the next chunk's guard)
__device__ __forceinline__ bool gda_chunk_update(float* b_s, const float* b_k, const float* b_v,
                                                 const float* b_e, const gda_chunk_warp& wp) {
    const int w = wp.w, lane = wp.lane, lg = wp.lg, lt = wp.lt;
    const int n5 = NTH * (w & 1), nn5 = EVEN ? NTH : NTV - n5 < NTH ? NTV - n5 : NTH;
    float b_sr[MR][NTH][4];
    #pragma unroll
    for (int i = 0; i < MR; ++i) {
        const int m0 = 16 * ((w >> 1) + (NW / 2) * i);
        if (MT % (NW / 2) == 0 || m0 < KP) {
            const float e0 = b_e[m0 + lg], e8 = b_e[m0 + lg + 8];
            #pragma unroll
            for (int n = 0; n < NTH; ++n)
                if (n < nn5)
                    #pragma unroll
                    for (int r = 0; r < 4; ++r)
                        b_sr[i][n][r] = (r < 2 ? e0 : e8)
                            * b_s[(m0 + lg + 8 * (r >> 1)) * VS + 8 * (n5 + n) + 2 * lt + (r & 1)];
        }
    }
    #pragma unroll 2
    for (int kb = 0; kb < BT; kb += KSTEP) {
        unsigned bh[NTH][2], bl[NTH][2];
        #pragma unroll
        for (int n = 0; n < NTH; ++n)
            if (n < nn5) {
                const float* pv = b_v + kb * VS + 8 * (n5 + n);
                gda_frag_b<true>([&](int kk, int c) { return pv[kk * VS + c]; }, lane, bh[n], bl[n]);
            }
        #pragma unroll
        for (int i = 0; i < MR; ++i) {
            const int m0 = 16 * ((w >> 1) + (NW / 2) * i);
            if (MT % (NW / 2) == 0 || m0 < KP) {
                unsigned ah[4], al[4];
                const float* pk = b_k + kb * KS + m0;            // (k*D)^T
                gda_frag_a([&](int r, int c) { return pk[c * KS + r]; }, lane, ah, al);
                gda_mma3<NTH, true>(b_sr[i], ah, al, bh, bl, nn5);
            }
        }
    }
    bool ok = true;
    #pragma unroll
    for (int i = 0; i < MR; ++i) {
        const int m0 = 16 * ((w >> 1) + (NW / 2) * i);
        if (MT % (NW / 2) == 0 || m0 < KP)
            #pragma unroll
            for (int n = 0; n < NTH; ++n)
                if (n < nn5)
                    #pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        b_s[(m0 + lg + 8 * (r >> 1)) * VS + 8 * (n5 + n) + 2 * lt + (r & 1)] = b_sr[i][n][r];
                        ok &= fabsf(b_sr[i][n][r]) <= GDA_VAL_MAX;
                    }
    }
    return ok;
}

#endif

// Key tile kt of a chunk that fails the guard, stepped: the loop itself over its BT steps,
// S_t = diag(g_t) S_{t-1} + k_t v_t^T on the tile's rows of S (b_st, in place) and o_t's partial
// sums q_t^T S_t over them, in fp32 on the CUDA cores from the raw staged inputs (stage 1's), so
// every gate, NaN and inf acts as in the loop. Thread (j, c): value column c < BV, rows j,
// j + RG, ...; o_t[c]'s RG partial sums meet in b_red (two buffers: one barrier a step), and the
// thread with j = 0 adds them in order into b_ob[t * os + c] (written at the first key tile).
// STATE: no o; threads kk < KP carry the column's gate product dm[kt] 2^de[kt]. Returns whether
// this thread's elements of S end within GDA_VAL_MAX (the next chunk's guard).
template <bool STATE>
__device__ __forceinline__ bool gda_chunk_step(const float* b_q, const float* b_k, const float* b_a,
                                               const float* b_v, float* b_st, float* b_red, float* b_ob,
                                               int os, float (&dm)[NKT], float (&de)[NKT], int kt, int tid) {
    constexpr int CP = BV <= 8 ? 8 : BV <= 16 ? 16 : BV <= 32 ? 32 : 64;   // BV up to a power of 2
    constexpr int RG = NT / CP;                                              // row groups
    const int c = tid % CP, j = tid / CP;
    const int nr = K_DIM - kt * KT < KP ? K_DIM - kt * KT : KP;   // rows in K (the rest: k = 0,
                                                                  //   so 0 * inf in S; not used)
    #pragma unroll 1
    for (int t = 0; t < BT; ++t) {
        float acc = 0.f;
        if (c < BV) {
            const float vt = b_v[t * VS + c];
            #pragma unroll 4
            for (int r = j; r < nr; r += RG) {
                const float x = fmaf(b_a[t * QS + r], b_st[r * VS + c], b_k[t * KS + r] * vt);
                b_st[r * VS + c] = x;
                if (!STATE) acc = fmaf(b_q[t * QS + r], x, acc);
            }
        }
        if constexpr (!STATE) {
            float* const red = b_red + (t & 1) * NT;        // [RG][CP]
            red[tid] = acc;
            __syncthreads();
            if (j == 0 && c < BV) {
                float sum = 0.f;
                for (int i = 0; i < RG; ++i) sum += red[i * CP + c];
                b_ob[t * os + c] = kt == 0 ? sum : b_ob[t * os + c] + sum;
            }
        }
    }
    if (STATE && tid < KP)
        #pragma unroll
        for (int i = 0; i < NKT; ++i)            // (registers: no dynamically indexed array)
            if (i == kt)
                #pragma unroll 1
                for (int t = 0; t < BT; ++t) gda_scaled_mul(dm[i], de[i], b_a[t * QS + tid]);
    bool ok = true;
    if (c < BV)
        for (int r = j; r < nr; r += RG) ok &= fabsf(b_st[r * VS + c]) <= GDA_VAL_MAX;
    return ok;
}

// The chunk loop of one block over segment i_p of its sequence (rows [s0, s1): P segments of
// whole chunks, the last one short or empty), each chunk a pass of the stages per key tile
// (the tiles' scores and 4a sums add up; 4c, 4d after the last tile). STATE (gda_chunk_state,
// segments 0..P-2): stages 1 (k, g, v), 3 (k*D, A_end) and 5 only, from S = 0; it writes the
// segment's S and its gate product to ws_s, ws_d. Otherwise (gda_chunk_fwd): every stage, from
// S = h0 carried through the earlier segments' entries (S = diag(ws_d[j]) S + ws_s[j], j < i_p).
template <bool STATE>
__device__ __forceinline__ void gda_chunk(GDA_FORWARD_PARAMS)
{
    extern __shared__ float4 gda_smem[];
#ifdef GDA_PROFILE
    const long long prof_0 = clock64();        // the prologue's cycles: the carry above all
#endif
    float* const b_sm = reinterpret_cast<float*>(gda_smem);
    float* const b_ka = b_sm + SM_KA;
    float* const b_s = b_sm + SM_S;
    float* const b_w = b_sm + SM_W;
    float* const b_e = b_sm + SM_E;
    float* const b_b = b_sm + SM_B;
#if WGMMA
    float* const b_x = b_sm + SM_X;
#else
    float* const b_x = nullptr;
#endif

    constexpr bool APART = STATE && KD_APART;  // k*D in kA's room: k stays, no reload
    const long long i_b = blockIdx.x;
    const int NP = STATE ? P - 1 : P;          // segments in this grid
    const int i_v = (int)(i_b % NV), i_p = (int)((i_b / NV) % NP), i_h = (int)((i_b / NV / NP) % H);
    const long long i_n = i_b / NV / NP / H;
    const int tid = threadIdx.x;
    const gda_chunk_warp wp = gda_chunk_roles(tid);
    const int v0 = i_v * BV;
    long long bos, eos;
    gda_seq_rows(cu_seqlens, i_n, T, bos, eos);
    const long long len = eos - bos;
    long long s0, s1;                          // the segment's rows: whole chunks
    gda_segment_rows(len, P, i_p, BT, s0, s1);
    const long long w_0 = (i_n * H + i_h) * (P - 1);                          // workspace entry of
                                                                              //   segment 0
    const long long sk = (long long)H * K_DIM, sv = (long long)H * V_DIM;
    const long long o_h = ((i_n * H + i_h) * (long long)K_DIM) * V_DIM + v0;   // state [n, h, 0, v0]

    const bool vec_qkg = gda_aligned<io::t>(q) && gda_aligned<io::t>(k) && gda_aligned<gt::t>(g);
    const bool vec_v = gda_aligned<io::t>(v);

    // S [KR][BV] lives in shared memory (b_s): read by stage 4, updated in place by stage 5. It
    // starts as h0 (or 0) carried through the earlier segments' entries (common.cuh gda_carry):
    // for CB of the thread's EPT elements at a time (up to 8), the loads of JB entries first,
    // all in flight, then their steps in order (an element at a time through every entry, the
    // loads were a chain, each waiting on the one before)
    constexpr int EPT = (KR * BV + NT - 1) / NT, CB = EPT < 8 ? EPT : 8;
    constexpr int JB = 8 / CB < 4 ? 8 / CB : 4;
    const auto s_from_h0 = [&]() {
        #pragma unroll 8
        for (int i = 0; i < EPT; ++i) {
            const int e = tid + i * NT, row = e / BV, col = e % BV;
            if (e < KR * BV)
                b_s[row * VS + col] = !STATE && h0 && row < K_DIM && v0 + col < V_DIM
                                      ? h0[o_h + (long long)row * V_DIM + col] : 0.f;
        }
    };
    s_from_h0();
#if ASYNC_COPY
    // with DBUF the first chunk's copies go out before the carry below, whose loads they overlap
    // (set 0's columns 0..K_DIM-1; the padding below writes only the columns past them)
    if (DBUF && vec_qkg && vec_v && s0 < s1)
        gda_copy_chunk<!STATE>(q, k, g, v, b_sm, 0, s0, s1, bos, sk, sv, (long long)i_h * K_DIM,
                               (long long)i_h * V_DIM + v0, K_DIM, V_DIM - v0, true, tid);
#endif
    bool exact = true;                         // every entry carried (gda_carried)
    for (int j0 = 0; j0 < (STATE ? 0 : i_p); j0 += JB) {
        #pragma unroll 1
        for (int i0 = 0; i0 < EPT; i0 += CB) {
            float m[JB][CB], ex[JB][CB], sj[JB][CB];
            #pragma unroll
            for (int jj = 0; jj < JB; ++jj)
                #pragma unroll
                for (int u = 0; u < CB; ++u) {
                    const int e = tid + (i0 + u) * NT, row = e / BV, col = e % BV;
                    const long long w = w_0 + j0 + jj;
                    const bool in = j0 + jj < i_p && i0 + u < EPT && e < KR * BV && row < K_DIM
                                    && v0 + col < V_DIM;
                    m[jj][u] = in ? ws_d[w * 2 * K_DIM + row] : 1.f;
                    ex[jj][u] = in ? ws_d[w * 2 * K_DIM + K_DIM + row] : 0.f;
                    sj[jj][u] = in ? ws_s[(w * K_DIM + row) * V_DIM + v0 + col] : 0.f;
                }
            #pragma unroll
            for (int u = 0; u < CB; ++u) {
                const int e = tid + (i0 + u) * NT;
                if (i0 + u < EPT && e < KR * BV) {
                    float* const x = b_s + (e / BV) * VS + e % BV;
                    float sx = *x;
                    #pragma unroll
                    for (int jj = 0; jj < JB; ++jj)
                        if (j0 + jj < i_p) {
                            exact &= gda_carried(m[jj][u]);
                            sx = gda_carry_step(m[jj][u], ex[jj][u], sj[jj][u], sx);
                        }
                    *x = sx;
                }
            }
        }
    }
    // an entry that cannot be carried (rare): this thread's elements from h0 through the
    // sequence's rows before the segment instead, the loop's own steps on the CUDA cores (no
    // barrier: each thread its own elements; the chunk loop's first barrier is before S is read)
    if (!STATE && !exact) {
        s_from_h0();
        for (long long t = 0; t < s0; ++t) {
            const long long rk = (bos + t) * sk + (long long)i_h * K_DIM;
            const long long rv = (bos + t) * sv + (long long)i_h * V_DIM + v0;
            #pragma unroll 4
            for (int i = 0; i < EPT; ++i) {
                const int e = tid + i * NT, row = e / BV, col = e % BV;
                if (e < KR * BV && row < K_DIM && v0 + col < V_DIM) {
                    float* const x = b_s + row * VS + col;
                    *x = fmaf(gda_gate(g[rk + row]), *x, io::load(k[rk + row]) * io::load(v[rv + col]));
                }
            }
        }
    }

    bool s_ok = true;                          // this thread's elements of S within GDA_VAL_MAX
    #pragma unroll 8
    for (int i = 0; i < EPT; ++i) {
        const int e = tid + i * NT;
        if (e < KR * BV) s_ok &= fabsf(b_s[(e / BV) * VS + e % BV]) <= GDA_VAL_MAX;
    }
    float dm[NKT], de[NKT];                    // thread kk < KP: the segment's gate product of
    #pragma unroll                             //   column kt * KT + kk, dm 2^de (gda_scaled_mul)
    for (int kt = 0; kt < NKT; ++kt) { dm[kt] = 1.f; de[kt] = 0.f; }

    // padding columns K_DIM..KP-1 of a single key tile: q = k = 0 (the gate there is never used
    // but must be finite); stage 1 writes only the first K_DIM columns, and stage 3 keeps these
    // at 0 (with more tiles or WGMMA, whose scratch overwrites the gates, stage 1 writes the
    // padding: KLOAD = KP)
#if KLOAD < KP
    for (int e = tid; e < (1 + DBUF) * BT * (KP - K_DIM); e += NT) {
        const int set = e / (BT * (KP - K_DIM)) * SM_SET, r = e % (BT * (KP - K_DIM));
        const int t = r / (KP - K_DIM), kk = K_DIM + r % (KP - K_DIM);
        b_sm[set + SM_Q + t * QS + kk] = 0.f; b_sm[set + SM_K + t * KS + kk] = 0.f;
        b_sm[set + SM_A + t * QS + kk] = 1.f;
    }
#endif
    const bool vec_o = gda_aligned<io::t>(o);
#ifdef GDA_PROFILE
    long long prof[6] = {0, 0, 0, 0, 0, 0}, prof_t = clock64();
    const long long prof_pro = prof_t - prof_0;
#define GDA_PROF(i) do { __syncthreads(); const long long c_ = clock64(); prof[i] += c_ - prof_t; prof_t = c_; } while (0)
#else
#define GDA_PROF(i) do { } while (0)
#endif

    // this chunk's set of staged inputs: DBUF alternates between two, the next chunk's copies
    // going to the other one while this one is computed
    int set = 0;
    for (long long t0 = s0; t0 < s1; t0 += BT) {
        float* const b_q = b_sm + set + SM_Q;
        float* const b_a = b_sm + set + SM_A;
        float* const b_k = b_sm + set + SM_K;
        float* const b_v = b_sm + set + SM_V;
        bool fast = true, w_live = false;      // this key tile's path; whether b_w holds scores
        bool s_next = true;                    // s_ok at the next chunk
        #pragma unroll
        for (int kt = 0; kt < NKT; ++kt) {
            float* const b_st = b_s + kt * KT * VS;     // the key tile's rows of S
            GDA_PROF(0);
            bool in_range;                      // the inputs' verdict, where the load checked them
            const bool checked = gda_chunk_load<STATE>(q, k, g, v, b_sm, set, b_q, b_k, b_a, b_v, t0,
                                                       s1, bos, sk, sv, i_h, v0, kt, vec_qkg, vec_v,
                                                       tid, false, in_range);
            __syncthreads();
            GDA_PROF(1);
            // the guard: the fast path while inputs and S are in range (v checked with the
            // first tile; once a tile is stepped, so are the chunk's later ones, so b_w holds
            // exactly the scores of the tiles before). Inputs loaded through registers were
            // checked there; copied ones by stage 3 (q, k, g: it reads each once; v too where
            // it has threads with no column, else here). The verdict is stage 3's barrier;
            // stage 2's scores wait for it in registers (with one key tile they go to b_w at
            // once: a stepped chunk overwrites them there). Where it fails, stage 3 has scaled
            // q and k in place: they are loaded again (again) before the tile is stepped.
            float b_res[BS / 2];
            bool again = false;
            float dm_t = 1.f, de_t = 0.f;       // APART: the segment's gate product with this
            #pragma unroll                      //   chunk's (stage 3 multiplies)
            for (int j = 0; j < NKT; ++j)       // (registers: no dynamically indexed array)
                if (APART && j == kt) { dm_t = dm[j]; de_t = de[j]; }
            if (fast) {                         // (the same in every thread)
                bool ok = s_ok && (checked ? in_range
                                           : V_IN_3 || APART || kt > 0
                                             || gda_tile_in_range<NT, BV, VS>(b_v, tid, GDA_VAL_MAX));
                if constexpr (!STATE) {
                    gda_chunk_scores(b_q, b_k, b_a, wp, b_res);
                    if constexpr (NKT == 1)     // (a stepped chunk's o sums overwrite them there)
                        gda_chunk_scores_store(b_w, wp, kt, b_res);
                    __syncthreads();            // stage 2's reads are done: stage 3 writes in place
                }
                GDA_PROF(2);
                const bool read_ok = gda_chunk_decays<STATE>(b_q, b_k, b_a, b_v, b_ka, b_e, b_b, tid,
                                                             !checked && kt == 0, dm_t, de_t);
                ok = ok && (checked || read_ok);
                fast = !__syncthreads_or(!ok);
                again = !fast && !APART;
            }
            w_live |= fast;
            GDA_PROF(3);
            float b_o[NTH][4];                  // this warp's output tiles (stage 4)
            // o's sums of the stepped tiles: between tiles where the fast ones leave theirs
            // (NKT > 1), else in b_w (no tile's scores there)
            float* const b_ob = NKT > 1 ? b_sm + SM_O : b_w;
            constexpr int OS = NKT > 1 ? VS : WS;
            if (fast) {
                if constexpr (!STATE) {
                    if constexpr (NKT > 1)
                        gda_chunk_scores_store(b_w, wp, kt, b_res);
                    gda_chunk_output_keys(b_q, b_ka, b_st, b_w, b_b, b_sm + SM_O, b_x, wp, b_o, kt);
                } else if (tid < KP) {
                    #pragma unroll
                    for (int j = 0; j < NKT; ++j)       // (registers: no dynamically indexed array)
                        if (j == kt) {
                            if (APART) { dm[j] = dm_t; de[j] = de_t; }
                            else gda_scaled_mul(dm[j], de[j], b_e[tid]);
                        }
                }
            } else {
                if (again) {                    // q and k as loaded (the gates are unchanged)
#if ASYNC_COPY
                    const long long colk = (long long)i_h * K_DIM + kt * KT;
                    const int nk = NKT == 1 ? K_DIM : K_DIM - kt * KT < KT ? K_DIM - kt * KT : KT;
                    #pragma unroll 1
                    for (int e = tid; e < BT * nk; e += NT) {
                        const int t = e / nk, kk = e % nk;
                        const bool in = t0 + t < s1;
                        const long long off = (bos + t0 + t) * sk + colk + kk;
                        b_q[t * QS + kk] = in ? io::load(q[off]) : 0.f;
                        b_k[t * KS + kk] = in ? io::load(k[off]) : 0.f;
                    }
#else
                    gda_chunk_load<STATE>(q, k, g, v, b_sm, set, b_q, b_k, b_a, b_v, t0, s1, bos, sk, sv,
                                          i_h, v0, kt, vec_qkg, vec_v, tid, true, in_range);
#endif
                    __syncthreads();
                }
                s_next &= gda_chunk_step<STATE>(b_q, b_k, b_a, b_v, b_st, b_ka, b_ob, OS, dm, de, kt, tid);
                __syncthreads();
                if (!STATE && kt == NKT - 1)
                    #pragma unroll
                    for (int n = 0; n < NTH; ++n)
                        #pragma unroll
                        for (int r = 0; r < 4; ++r) b_o[n][r] = b_ob[gda_o_at(wp, n, r, OS)];
            }
            if (!STATE && kt == NKT - 1)
                gda_chunk_output_values(b_v, b_w, w_live, wp, b_o, o, vec_o, t0, s1, bos, sv, i_h, v0, scale);
            if (!STATE)
                __syncthreads();                // stage 4's reads of S are done: stage 5 writes the
                                                //   tile's S in place (every key tile, not only the last)
            GDA_PROF(4);
            if (fast) {
#if WGMMA
                s_next &= gda_chunk_update(b_st, b_k, b_v, b_e, b_x, wp);
#else
                s_next &= gda_chunk_update(b_st, APART ? b_ka : b_k, b_v, b_e, wp);
#endif
                __syncthreads();                // this tile's shared reads are done
            }
            GDA_PROF(5);
        }
        s_ok = s_next;
        if (DBUF) set = SM_SET - set;
    }
#ifdef GDA_PROFILE
    if ((blockIdx.x == 0 || blockIdx.x == gridDim.x - 1) && tid == 0)
        printf("%s block %d cycles: prologue %lld load %lld scores %lld decays %lld output %lld state %lld"
               "  (clock64, %lld chunks)\n", STATE ? "gda_chunk_state" : "gda_chunk_fwd", (int)blockIdx.x,
               prof_pro, prof[0] + prof[1], prof[2], prof[3], prof[4], prof[5], (s1 - s0 + BT - 1) / BT);
#endif

    // the segment's S: to the workspace (state pass), or to ht (the last segment's full pass)
    float* const dst = STATE ? ws_s + (w_0 + i_p) * K_DIM * V_DIM + v0 : ht && i_p == P - 1 ? ht + o_h : nullptr;
    if (STATE && i_v == 0 && tid < KP)
        #pragma unroll
        for (int kt = 0; kt < NKT; ++kt)
            if (kt * KT + tid < K_DIM) {
                ws_d[(w_0 + i_p) * 2 * K_DIM + kt * KT + tid] = dm[kt];
                ws_d[(w_0 + i_p) * 2 * K_DIM + K_DIM + kt * KT + tid] = de[kt];
            }
    if (dst) {
        __syncthreads();                        // (no chunks: b_s was written by other threads)
        for (int e = tid; e < KR * BV; e += NT) {
            const int row = e / BV, col = e % BV;
            if (row < K_DIM && v0 + col < V_DIM) dst[(long long)row * V_DIM + col] = b_s[row * VS + col];
        }
    }
}

// Grid: one block per (sequence n, head h, segment p < P, value tile iv), block id
// (((n * H) + h) * P + p) * NV + iv. With P = 1: the whole sequence, no workspace.
#if ENTRIES & 1
extern "C" __global__ void __launch_bounds__(NT, 1) gda_chunk_fwd(GDA_FORWARD_PARAMS) {
    GDA_FORWARD_ONLY_IF;
    gda_chunk<false>(GDA_FORWARD_ARGS);
}
#endif

// Grid: the same for the segments p < P - 1 (P >= 2), launched before gda_chunk_fwd on the
// same stream; q, o, h0 and ht are not read.
#if ENTRIES & 2
extern "C" __global__ void __launch_bounds__(NT, 1) gda_chunk_state(GDA_FORWARD_PARAMS) {
    GDA_FORWARD_ONLY_IF;
    gda_chunk<true>(GDA_FORWARD_ARGS);
}
#endif
