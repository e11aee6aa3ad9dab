// gda_recurrent_fwd: gated linear attention, forward, one time step after another.
//
//   S_t = diag(g_t) S_{t-1} + k_t v_t^T,   o_t = scale * S_t^T q_t        (S: [K, V], fp32)
//
// Grid (1-D): one block per (sequence n, head h, segment p of the sequence, tile of BV value
//   columns), block id (((n * H) + h) * P + p) * NV + iv. With P > 1 segments (few
//   sequence-heads: the grid would leave SMs idle, and a block's time is its steps' latency),
//   gda_recurrent_state first runs segments 0..P-2 from S = 0, S and the gate product only (no
//   q, no o), and leaves each one's S and gate product in a workspace laid out as
//   gda_chunk_fwd's; then gda_recurrent_fwd's block for segment p starts from h0 carried
//   through segments 0..p-1 (S = diag(d_j) S + S_j: products, no division, so gates of 0,
//   negative or above 1 stay exact; d_j kept as m * 2^e, brought back to [0.5, 1) every TC
//   steps, so no length of segment overflows it). Where an entry's m is not finite (an inf or
//   NaN gate, or TC gates with a product above 2^127: common.cuh gda_carried) the thread
//   steps its rows of S through the sequence's rows before its segment from h0 instead (rare,
//   slow, the loop's result).
//   Two launches on one stream, no flags, no host syncs.
//   Block: BV columns x KT lanes, lane = c * KT + kt. The lane holds
//   S[k][v0 + c] in registers for the rows k = i_g*R*KT + R*kt + j (j < R, i_g < KG): R
//   consecutive rows, so each step's q, k, g for them are single R*4-byte shared loads.
//   R = 4 for large problems (fewest instructions per element); R = 1 or 2 where the problem
//   is small, since then a step's latency, not the instruction count, sets the time.
// o_t's sum over K: each lane stores its partial sum in shared memory (one store per step, no
//   shuffles on the way), and the partials are summed once per chunk, coalesced.
// Time goes in chunks of TC steps staged in shared memory as fp32 (q, k, the multiplicative
//   gate, v). With ASYNC_COPY (float32 inputs, multiplicative gate, K, V and BV multiples of 4)
//   the next chunk is copied by 16-byte cp.async into the second of two sets while this one is
//   computed (nothing held in registers); otherwise it is loaded into registers and converted
//   (half inputs, exp of log gates). Steps past a sequence's end are padded with gate 1 and
//   k = v = q = 0, which leaves S exactly unchanged; rows past K likewise stay 0.
// Sequences: rows [bos, eos) of the [B*T, H, *] tensors; cu_seqlens (varlen, B = 1, offsets
//   clamped to [0, T]) or bos = n*T. Segment p: rows [p*L, (p+1)*L) of its sequence, clamped,
//   L = ceil(len / P) (the last ones may be short or empty).
// Shared memory: (3*TC*KP + TC*BV) floats dynamic (twice that with ASYNC_COPY; the launcher
//   passes the bytes as SMEM_BYTES, checked here), TC*BV*(KT+1) floats static.
//
// Required defines: K_DIM, V_DIM (1..256), IO_DTYPE, G_DTYPE, LOG_GATE, SEQ_INT64 (cu_seqlens
//   int64 vs int32), ASYNC_COPY (0, or 1 where GDA_ASYNC_INPUTS and BV % 4 == 0), SMEM_BYTES.
//   Tunable: R (1, 2 or 4), KT (power of 2 <= 32), BV (KT*BV a multiple of 32), TC, UNROLL.
// Launcher: cupy_gda/recurrent.py. Reference: cupy_gda.reference.gated_attention_ref.
#if !defined(K_DIM) || !defined(V_DIM) || !defined(LOG_GATE) || !defined(SEQ_INT64) \
    || !defined(ASYNC_COPY) || !defined(SMEM_BYTES)
#error "K_DIM, V_DIM, LOG_GATE, SEQ_INT64, ASYNC_COPY and SMEM_BYTES are required"
#endif
#ifndef KT
#define KT 8
#endif
#ifndef BV
#define BV 32
#endif
#ifndef TC
#define TC 32
#endif
#ifndef UNROLL
#define UNROLL 4                               // steps of the time loop unrolled
#endif
#define GDA_STR(x) #x
#define GDA_UNROLL(n) _Pragma(GDA_STR(unroll n))
#ifndef R
#define R 4
#endif
#define KG ((K_DIM + R * KT - 1) / (R * KT))  // groups of R rows per lane
#define KP (KG * R * KT)                       // K padded to the lanes
#define NT (KT * BV)                           // threads per block
#define KT1 (KT + 1)                           // padded row of partial sums (no bank conflicts)
#define EK ((TC * K_DIM + NT - 1) / NT)        // q/k/g elements per thread per chunk
#define EV ((TC * BV + NT - 1) / NT)           // v elements per thread per chunk
static_assert((KT & (KT - 1)) == 0 && KT <= 32, "KT must be a power of 2, at most 32");
static_assert(R == 1 || R == 2 || R == 4, "R must be 1, 2 or 4");

static_assert(NT % 32 == 0 && NT <= 1024, "KT * BV must be a multiple of 32, at most 1024");
static_assert(TC * BV * KT1 * 4 <= 48 * 1024, "partial sums exceed 48 KB of static shared memory");
static_assert(!ASYNC_COPY || (GDA_ASYNC_INPUTS && BV % 4 == 0),
              "ASYNC_COPY needs float32 inputs, a multiplicative gate and K, V, BV multiples of 4");
#define SET (3 * TC * KP + TC * BV)            // floats of one set of staged inputs
static_assert(SMEM_BYTES == (1 + ASYNC_COPY) * SET * 4,
              "SMEM_BYTES (cupy_gda/recurrent.py smem) differs from this kernel's layout");

// The time loop of one block over segment i_p of its sequence. STATE (gda_recurrent_state,
// segments 0..P-2): S from 0 and the gate product only, written to ws_s, ws_d. Otherwise
// (gda_recurrent_fwd): o, from S = h0 carried through the earlier segments' entries.
template <bool STATE>
__device__ __forceinline__ void gda_recurrent(GDA_FORWARD_PARAMS)
{
    // The partial sums live in their own (static) array, so the compiler knows the stores to
    // them never alias the staged inputs and can hoist the next steps' loads above them.
    __shared__ float b_p[TC * BV * KT1];                 // [TC][BV][KT1] partial sums of o
    extern __shared__ float4 gda_smem[];
    float* const b_sm = reinterpret_cast<float*>(gda_smem);   // one or two sets of:
    float* b_q = b_sm;                                   // [TC][KP]
    float* b_k = b_q + TC * KP;                          // [TC][KP]
    float* b_g = b_k + TC * KP;                          // [TC][KP]
    float* b_v = b_g + TC * KP;                          // [TC][BV]

    const long long i_b = blockIdx.x;
    const int NP = STATE ? P - 1 : P;          // segments in this grid
    const int i_v = (int)(i_b % NV), i_p = (int)((i_b / NV) % NP), i_h = (int)((i_b / NV / NP) % H);
    const long long i_n = i_b / NV / NP / H;
    const int tid = threadIdx.x, kt = tid % KT, c = tid / KT;
    const int v0 = i_v * BV;
    long long bos, eos;
    gda_seq_rows(cu_seqlens, i_n, T, bos, eos);
    long long s0, s1;                                                  // the segment's rows
    gda_segment_rows(eos - bos, P, i_p, 1, s0, s1);
    bos += s0;
    const long long len = s1 - s0;
    const long long w_0 = (i_n * H + i_h) * (P - 1);                   // workspace entry of segment 0

#if KP > K_DIM
    for (int e = tid; e < (1 + ASYNC_COPY) * TC * (KP - K_DIM); e += NT) {
        const int set = e / (TC * (KP - K_DIM)) * SET, r = e % (TC * (KP - K_DIM));
        const int t = r / (KP - K_DIM), kk = K_DIM + r % (KP - K_DIM);
        b_q[set + t * KP + kk] = 0.f; b_k[set + t * KP + kk] = 0.f; b_g[set + t * KP + kk] = 1.f;
    }
#endif

    float b_s[R * KG];                         // S rows of this lane
    float b_d[R * KG];                         // STATE: their gate product b_d 2^e (the lanes of
    __shared__ float b_de[STATE ? KP : 1];     //   column 0 keep e in b_de)
    const long long o_s = ((i_n * H + i_h) * (long long)K_DIM) * V_DIM + v0 + c;
    const bool col = v0 + c < V_DIM;
    const auto row_of = [&](int i) {          // the row of S in b_s[i] (k of the header)
        return (i / R) * R * KT + R * kt + i % R;
    };
    const auto s_from_h0 = [&](int kk) {     // S at row kk of this lane's column: h0 or 0
        return !STATE && h0 && kk < K_DIM && col ? h0[o_s + (long long)kk * V_DIM] : 0.f;
    };
    bool exact = true;                         // every entry carried (common.cuh gda_carried)
    #pragma unroll
    for (int i = 0; i < R * KG; ++i) {
        const int kk = row_of(i);
        float s = s_from_h0(kk);
        if (!STATE && kk < K_DIM && col)
            s = gda_carry(ws_s, ws_d, w_0, i_p, K_DIM, V_DIM, kk, v0 + c, s, exact);
        b_s[i] = s;
        b_d[i] = 1.f;
        if (STATE && c == 0) b_de[kk] = 0.f;
    }
    // an entry that cannot be carried (rare): this thread's S from h0 through the sequence's
    // rows before the segment instead, the loop's steps (no barrier: S is the thread's own)
    if (!STATE && !exact) {
        #pragma unroll
        for (int i = 0; i < R * KG; ++i)
            b_s[i] = s_from_h0(row_of(i));
        for (long long t = 0; t < s0; ++t) {
            const long long r = bos - s0 + t, rk = r * H * K_DIM + (long long)i_h * K_DIM;
            const float vt = col ? io::load(v[r * H * V_DIM + (long long)i_h * V_DIM + v0 + c]) : 0.f;
            #pragma unroll
            for (int i = 0; i < R * KG; ++i) {
                const int kk = row_of(i);
                if (kk < K_DIM && col) b_s[i] = fmaf(gda_gate(g[rk + kk]), b_s[i], io::load(k[rk + kk]) * vt);
            }
        }
    }

    const long long sk = (long long)H * K_DIM, sv = (long long)H * V_DIM;   // row strides
#if ASYNC_COPY
    // chunk t1's 16-byte copies into set `at`, committed as one group (the caller waits); steps
    // past the segment and columns past V written directly (0, gate 1)
    auto copy = [&](long long t1, int at) {
        constexpr int PK = K_DIM / 4, PV = BV / 4;
        const long long colk = (long long)i_h * K_DIM, colv = (long long)i_h * V_DIM + v0;
        #pragma unroll 2
        for (int e = tid; e < TC * PK; e += NT) {
            const int t = e / PK, kk = 4 * (e % PK), d = at + t * KP + kk;
            if (t1 + t < len) {
                const long long off = (bos + t1 + t) * sk + colk + kk;
                if (!STATE) gda_cp16(b_q + d, q + off);
                gda_cp16(b_k + d, k + off);
                gda_cp16(b_g + d, g + off);
            } else {
                if (!STATE) *reinterpret_cast<float4*>(b_q + d) = make_float4(0.f, 0.f, 0.f, 0.f);
                *reinterpret_cast<float4*>(b_k + d) = make_float4(0.f, 0.f, 0.f, 0.f);
                *reinterpret_cast<float4*>(b_g + d) = make_float4(1.f, 1.f, 1.f, 1.f);
            }
        }
        for (int e = tid; e < TC * PV; e += NT) {
            const int t = e / PV, cc = 4 * (e % PV), d = at + t * BV + cc;
            if (t1 + t < len && v0 + cc < V_DIM) gda_cp16(b_v + d, v + (bos + t1 + t) * sv + colv + cc);
            else *reinterpret_cast<float4*>(b_v + d) = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        gda_cp_commit();
    };
    // the same, synchronously, for pointers that are not 16-byte aligned
    auto copy_sync = [&](long long t1, int at) {
        for (int e = tid; e < TC * K_DIM; e += NT) {
            const int t = e / K_DIM, kk = e % K_DIM, d = at + t * KP + kk;
            const bool m = t1 + t < len;
            const long long off = (bos + t1 + t) * sk + (long long)i_h * K_DIM + kk;
            if (!STATE) b_q[d] = m ? q[off] : 0.f;
            b_k[d] = m ? k[off] : 0.f;
            b_g[d] = m ? g[off] : 1.f;
        }
        for (int e = tid; e < TC * BV; e += NT) {
            const int t = e / BV, cc = e % BV;
            b_v[at + e] = t1 + t < len && v0 + cc < V_DIM ? v[(bos + t1 + t) * sv + (long long)i_h * V_DIM + v0 + cc] : 0.f;
        }
    };
    const bool vec = (STATE || gda_aligned(q)) && gda_aligned(k) && gda_aligned(g) && gda_aligned(v);
#else
    // register prefetch of one chunk
    io::t r_q[EK], r_k[EK], r_v[EV];
    gt::t r_g[EK];
    auto load = [&](long long t0) {
        #pragma unroll
        for (int j = 0; j < EK; ++j) {
            const int e = tid + j * NT, t = e / K_DIM, kk = e % K_DIM;
            if (e < TC * K_DIM && t0 + t < len) {
                const long long off = (bos + t0 + t) * sk + (long long)i_h * K_DIM + kk;
                if (!STATE) r_q[j] = q[off];
                r_k[j] = k[off]; r_g[j] = g[off];
            }
        }
        #pragma unroll
        for (int j = 0; j < EV; ++j) {
            const int e = tid + j * NT, t = e / BV, cc = e % BV;
            if (e < TC * BV && t0 + t < len && v0 + cc < V_DIM)
                r_v[j] = v[(bos + t0 + t) * sv + (long long)i_h * V_DIM + v0 + cc];
        }
    };
    auto stage = [&](long long t0) {          // the same masks as load(t0)
        #pragma unroll
        for (int j = 0; j < EK; ++j) {
            const int e = tid + j * NT, t = e / K_DIM, kk = e % K_DIM;
            if (e < TC * K_DIM) {
                const bool m = t0 + t < len;
                if (!STATE) b_q[t * KP + kk] = m ? io::load(r_q[j]) : 0.f;
                b_k[t * KP + kk] = m ? io::load(r_k[j]) : 0.f;
                b_g[t * KP + kk] = m ? gda_gate(r_g[j]) : 1.f;
            }
        }
        #pragma unroll
        for (int j = 0; j < EV; ++j) {
            const int e = tid + j * NT, t = e / BV, cc = e % BV;
            if (e < TC * BV) b_v[e] = (t0 + t < len && v0 + cc < V_DIM) ? io::load(r_v[j]) : 0.f;
        }
    };

#endif

#if ASYNC_COPY
    if (vec && len > 0) copy(0, 0);
#else
    load(0);
#endif
    for (long long t0 = 0; t0 < len; t0 += TC) {
        __syncthreads();                        // previous chunk's b_* reads are done
#if ASYNC_COPY
        const int set = (int)((t0 / TC) & 1) * SET;        // this chunk's set
        if (!vec) {
            copy_sync(t0, set);
        } else if (t0 + TC < len) {             // this chunk's copies were issued a chunk ago
            copy(t0 + TC, SET - set);
            gda_cp_wait<1>();
        } else {
            gda_cp_wait<0>();
        }
        __syncthreads();
        const float* const b_q = b_sm + set;
        const float* const b_k = b_q + TC * KP;
        const float* const b_g = b_k + TC * KP;
        const float* const b_v = b_g + TC * KP;
#else
        stage(t0);
        __syncthreads();
        if (t0 + TC < len) load(t0 + TC);       // in flight while this chunk is computed
#endif
        GDA_UNROLL(UNROLL)
        for (int t = 0; t < TC; ++t) {
            const float b_vt = b_v[t * BV + c];
            float b_ot = 0.f;
            #pragma unroll
            for (int i_g = 0; i_g < KG; ++i_g) {
                const int kk = i_g * R * KT + R * kt;
                gda_float_pack<R> b_qt, b_kt, b_gt;
                if (!STATE) b_qt.v = *reinterpret_cast<const gda_floats<R>::t*>(b_q + t * KP + kk);
                b_kt.v = *reinterpret_cast<const gda_floats<R>::t*>(b_k + t * KP + kk);
                b_gt.v = *reinterpret_cast<const gda_floats<R>::t*>(b_g + t * KP + kk);
                #pragma unroll
                for (int j = 0; j < R; ++j) {
                    float& s = b_s[R * i_g + j];
                    s = fmaf(b_gt.f[j], s, b_kt.f[j] * b_vt);
                    if constexpr (STATE) b_d[R * i_g + j] *= b_gt.f[j];
                    // (rows past K: k = 0, so an inf in v makes their S NaN; left out of o)
                    if (!STATE && (KP == K_DIM || i_g < KG - 1 || kk + j < K_DIM))
                        b_ot = fmaf(s, b_qt.f[j], b_ot);
                }
            }
            if (!STATE) b_p[(t * BV + c) * KT1 + kt] = b_ot;
        }
        if constexpr (STATE) {
            // column 0's lanes bring the gate product to [0.5, 1) once a chunk, its power of 2
            // to e (exact): only a product of TC gates above 2^127 (gates averaging over
            // 2^(127/TC)) leaves float range
            if (c == 0)
                #pragma unroll
                for (int i = 0; i < R * KG; ++i) b_d[i] = gda_mantissa(b_d[i], b_de[row_of(i)]);
            continue;                           // no o: the next chunk's first barrier suffices
        }
        __syncthreads();
        for (int e = tid; e < TC * BV; e += NT) {
            const int t = e / BV, cc = e % BV;
            if (t0 + t < len && v0 + cc < V_DIM) {
                float b_ot = 0.f;
                #pragma unroll
                for (int j = 0; j < KT; ++j) b_ot += b_p[e * KT1 + j];
                o[(bos + t0 + t) * sv + (long long)i_h * V_DIM + v0 + cc] = io::store(b_ot * scale);
            }
        }
    }

    // the segment's S: to the workspace (state pass), or to ht (the last segment's full pass);
    // the gate product from the lanes of column 0 of value tile 0
    float* const dst = STATE ? ws_s + (w_0 + i_p) * K_DIM * V_DIM + v0 + c
                             : ht && i_p == P - 1 ? ht + o_s : nullptr;
    if (dst) {                                 // (never null in the state pass)
        #pragma unroll
        for (int i = 0; i < R * KG; ++i) {
            const int kk = row_of(i);
            if (kk < K_DIM && col) dst[(long long)kk * V_DIM] = b_s[i];
            if (STATE && kk < K_DIM && i_v == 0 && c == 0) {
                ws_d[(w_0 + i_p) * 2 * K_DIM + kk] = b_d[i];
                ws_d[(w_0 + i_p) * 2 * K_DIM + K_DIM + kk] = b_de[kk];
            }
        }
    }
}

// Grid: one block per (sequence n, head h, segment p < P, value tile iv), block id
// (((n * H) + h) * P + p) * NV + iv. With P = 1: the whole sequence, no workspace.
extern "C" __global__ void __launch_bounds__(NT, 1) gda_recurrent_fwd(GDA_FORWARD_PARAMS) {
    GDA_FORWARD_ONLY_IF;
    gda_recurrent<false>(GDA_FORWARD_ARGS);
}

// Grid: the same for the segments p < P - 1 (P >= 2), launched before gda_recurrent_fwd on the
// same stream; q, o, h0 and ht are not read. At most 128 registers where a lane holds at most 4
// rows, as the full pass takes there: its gate products would otherwise cost it half its blocks
// a SM (with 8 rows, K > 128, the cap spills).
#define STATE_BLOCKS (R * KG <= 4 && 512 / NT > 1 ? 512 / NT : 1)
extern "C" __global__ void __launch_bounds__(NT, STATE_BLOCKS) gda_recurrent_state(GDA_FORWARD_PARAMS) {
    GDA_FORWARD_ONLY_IF;
    gda_recurrent<true>(GDA_FORWARD_ARGS);
}
