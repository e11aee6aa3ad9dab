// gda_recurrent_fwd: gated linear attention, forward, one time step after another.
//
//   S_t = diag(g_t) S_{t-1} + k_t v_t^T,   o_t = scale * S_t^T q_t        (S: [K, V], fp32)
//
// Grid (1-D): one block per (sequence n, head h, tile of BV value columns), block id
//   ((n * H) + h) * NV + iv. Block: BV columns x KT lanes, lane = c * KT + kt; the lane holds
//   S[kt + i*KT][v0 + c] for i < KPT in registers. o_t's sum over K is a shuffle across the KT
//   lanes of a column, off the critical path (the next step's update does not wait for it).
// Time goes in chunks of TC steps staged in shared memory as fp32 (q, k, the multiplicative
//   gate, v); the next chunk is loaded into registers while this one is computed, and o is
//   staged in shared memory and written back coalesced. Steps past a sequence's end are padded
//   with gate 1 and k = v = q = 0, which leaves S exactly unchanged.
// Sequences: rows [bos, eos) of the [B*T, H, *] tensors; cu_seqlens (varlen) or bos = n*T.
//
// Required defines: K_DIM, V_DIM (1..256), IO_DTYPE, G_DTYPE, LOG_GATE, SEQ_INT64 (cu_seqlens
//   int64 vs int32). Tunable: KT (power of 2 <= 32), BV (KT*BV a multiple of 32), TC.
// Reference: cupy_gda.reference.gated_attention_ref.
#if !defined(K_DIM) || !defined(V_DIM) || !defined(LOG_GATE) || !defined(SEQ_INT64)
#error "K_DIM, V_DIM, LOG_GATE and SEQ_INT64 are required"
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
#define KPT ((K_DIM + KT - 1) / KT)           // state rows per lane
#define KP (KPT * KT)                          // K padded to the lanes
#define NT (KT * BV)                           // threads per block
#define EK ((TC * K_DIM + NT - 1) / NT)        // q/k/g elements per thread per chunk
#define EV ((TC * BV + NT - 1) / NT)           // v elements per thread per chunk
static_assert((KT & (KT - 1)) == 0 && KT <= 32, "KT must be a power of 2, at most 32");
static_assert(NT % 32 == 0 && NT <= 1024, "KT * BV must be a multiple of 32, at most 1024");
static_assert((3 * TC * KP + 2 * TC * BV) * 4 <= 48 * 1024, "staging tiles exceed 48 KB");

#if SEQ_INT64
typedef long long seq_t;
#else
typedef int seq_t;
#endif

extern "C" __global__ void __launch_bounds__(NT)
gda_recurrent_fwd(const io::t* __restrict__ q, const io::t* __restrict__ k,
                  const io::t* __restrict__ v, const gt::t* __restrict__ g,
                  io::t* __restrict__ o, const float* __restrict__ h0, float* __restrict__ ht,
                  const seq_t* __restrict__ cu_seqlens, long long T, int H, int NV, float scale)
{
    __shared__ float b_q[TC][KP], b_k[TC][KP], b_g[TC][KP];
    __shared__ float b_v[TC][BV], b_o[TC][BV];

    const long long i_b = blockIdx.x;
    const int i_v = (int)(i_b % NV), i_h = (int)((i_b / NV) % H);
    const long long i_n = i_b / NV / H;
    const int tid = threadIdx.x, kt = tid % KT, c = tid / KT;
    const int v0 = i_v * BV;
    long long bos, eos;
    if (cu_seqlens) { bos = cu_seqlens[i_n]; eos = cu_seqlens[i_n + 1]; }
    else { bos = i_n * T; eos = bos + T; }
    const long long len = eos > bos ? eos - bos : 0;

#if KP > K_DIM
    // padding of K (rows KP > K_DIM) is written once: gate 1, q = k = 0 keeps those rows at 0
    for (int e = tid; e < TC * (KP - K_DIM); e += NT) {
        const int t = e / (KP - K_DIM), kk = K_DIM + e % (KP - K_DIM);
        b_q[t][kk] = 0.f; b_k[t][kk] = 0.f; b_g[t][kk] = 1.f;
    }
#endif

    float b_s[KPT];
    const long long o_s = ((i_n * H + i_h) * (long long)K_DIM) * V_DIM + v0 + c;
    #pragma unroll
    for (int i = 0; i < KPT; ++i) {
        const int kk = kt + i * KT;
        b_s[i] = (h0 && kk < K_DIM && v0 + c < V_DIM) ? h0[o_s + (long long)kk * V_DIM] : 0.f;
    }

    // register prefetch of one chunk; row stride of q/k/g is H*K, of v/o H*V
    const long long sk = (long long)H * K_DIM, sv = (long long)H * V_DIM;
    io::t r_q[EK], r_k[EK], r_v[EV];
    gt::t r_g[EK];
    bool m_k[EK], m_v[EV];
    auto load = [&](long long t0) {
        #pragma unroll
        for (int j = 0; j < EK; ++j) {
            const int e = tid + j * NT, t = e / K_DIM, kk = e % K_DIM;
            m_k[j] = e < TC * K_DIM && t0 + t < len;
            if (m_k[j]) {
                const long long off = (bos + t0 + t) * sk + (long long)i_h * K_DIM + kk;
                r_q[j] = q[off]; r_k[j] = k[off]; r_g[j] = g[off];
            }
        }
        #pragma unroll
        for (int j = 0; j < EV; ++j) {
            const int e = tid + j * NT, t = e / BV, cc = e % BV;
            m_v[j] = e < TC * BV && t0 + t < len && v0 + cc < V_DIM;
            if (m_v[j]) r_v[j] = v[(bos + t0 + t) * sv + (long long)i_h * V_DIM + v0 + cc];
        }
    };
    auto stage = [&]() {
        #pragma unroll
        for (int j = 0; j < EK; ++j) {
            const int e = tid + j * NT, t = e / K_DIM, kk = e % K_DIM;
            if (e < TC * K_DIM) {
                b_q[t][kk] = m_k[j] ? io::load(r_q[j]) : 0.f;
                b_k[t][kk] = m_k[j] ? io::load(r_k[j]) : 0.f;
                b_g[t][kk] = m_k[j] ? gda_gate(r_g[j]) : 1.f;
            }
        }
        #pragma unroll
        for (int j = 0; j < EV; ++j) {
            const int e = tid + j * NT;
            if (e < TC * BV) b_v[e / BV][e % BV] = m_v[j] ? io::load(r_v[j]) : 0.f;
        }
    };

    load(0);
    for (long long t0 = 0; t0 < len; t0 += TC) {
        __syncthreads();                        // previous chunk's b_* reads are done
        stage();
        __syncthreads();
        if (t0 + TC < len) load(t0 + TC);       // in flight while this chunk is computed
        #pragma unroll 4
        for (int t = 0; t < TC; ++t) {
            const float b_vt = b_v[t][c];
            float b_ot = 0.f;
            #pragma unroll
            for (int i = 0; i < KPT; ++i) {
                const int kk = kt + i * KT;
                b_s[i] = fmaf(b_g[t][kk], b_s[i], b_k[t][kk] * b_vt);
                b_ot = fmaf(b_s[i], b_q[t][kk], b_ot);
            }
            #pragma unroll
            for (int m = KT / 2; m > 0; m >>= 1) b_ot += __shfl_xor_sync(GDA_FULL_MASK, b_ot, m);
            if (kt == 0) b_o[t][c] = b_ot * scale;
        }
        __syncthreads();
        for (int e = tid; e < TC * BV; e += NT) {
            const int t = e / BV, cc = e % BV;
            if (t0 + t < len && v0 + cc < V_DIM)
                o[(bos + t0 + t) * sv + (long long)i_h * V_DIM + v0 + cc] = io::store(b_o[t][cc]);
        }
    }

    if (ht) {
        #pragma unroll
        for (int i = 0; i < KPT; ++i) {
            const int kk = kt + i * KT;
            if (kk < K_DIM && v0 + c < V_DIM) ht[o_s + (long long)kk * V_DIM] = b_s[i];
        }
    }
}
