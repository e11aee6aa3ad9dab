// gda_recurrent_bwd: gated linear attention, backward, one time step after another.
//
//   forward:  S_t = diag(g_t) S_{t-1} + k_t v_t^T,   o_t = scale * S_t^T q_t
//   backward (do = o's gradient, dS_t the whole gradient reaching S_t, dS_T += d_final_state):
//     dS_t = scale * q_t do_t^T + diag(g_{t+1}) dS_{t+1}
//     dq_t = scale * S_t do_t    dk_t = dS_t v_t    dv_t = dS_t^T k_t
//     dg_t = rowsum(dS_t (.) S_{t-1})    (d log g_t = g_t dg_t: exactly 0 where g_t is)
//     d_initial_state = diag(g_1) dS_1
//   Every product as the loop has it: no division by a gate and no difference of cumulative
//   log gates, so gates of 0, negative, tiny or above 1 stay exact.
//
// Grid (1-D): one block per (sequence n, head h, group ig of value tiles), block id
//   (n * H + h) * NG + ig; the block runs the tiles ig, ig + NG, ... of BV value columns one
//   after another, each over its sequence twice:
//   1. forward, S only (k, g, v staged), leaving S at every TS-th step in ws_h;
//   2. backward over those spans, last first: S again through the span, leaving it at every
//      TC-th step in ws_s (the block's own scratch; nothing to do where TS = TC); then over
//      the span's chunks of TC steps, last first: S through the chunk once more, each S_{t-1}
//      kept in shared memory and dq_t summed on the way, then the steps in reverse: dS, dk_t,
//      dv_t, dg_t.
//   So S is computed three times (twice with TS = TC) and extra memory is one state every TS
//   steps (ws_h), plus TS / TC states a block (ws_s). A thread reads back only what it wrote
//   itself there, so the layout is the block's own ([slot][h][group][thread] float4s,
//   coalesced) and needs no barrier. One loop runs the chunks in that order (visit()), so
//   the next chunk's loads are issued into registers before this one is computed.
// Block: NT = KT * VT threads; thread (kt = tid / VT, vt = tid % VT) holds S and dS at rows
//   kt + KT * i (i < KG) and the 4 value columns v0 + 4 vt .. v0 + 4 vt + 3 (BV = 4 VT), so
//   sums over V (dq, dk, dg) are 4 terms in a thread and VT partial sums in shared memory, and
//   the sum over K (dv) KG terms in a thread and KT partial sums; both added up once a chunk,
//   coalesced. Rows past K (k = q = 0, g = 1) and columns past V (v = do = 0) keep zeros, but
//   an inf elsewhere can make them NaN (0 * inf), so they are left out of every sum.
// Sums over V across value tiles: with NV = 1 the block writes dq, dk, dg itself; otherwise a
//   group's tiles add theirs up in ws_p [NG][3][B*T][H][K] (float32; each thread its own
//   elements, in place), and the group's last tile writes them (NG = 1) or
//   gda_recurrent_bwd_sum adds up the groups'.
// only_if (null, or a device flag): the kernels do nothing where *only_if is 0 (gda_chunk_bwd's
//   fall-back, queued after it and run only where its guard was hit: no host sync).
// Sequences: rows [bos, eos) of the [B*T, H, *] tensors (cu_seqlens, or n*T); a sequence's
//   span j has slot bos / TS + n + j of ws_h (slots never overlap between sequences).
//
// Required defines: K_DIM, V_DIM (1..256), IO_DTYPE, G_DTYPE, LOG_GATE, SEQ_INT64, KT (32 or
//   64), KG, VT (power of 2, KT * VT <= 1024), TC (steps a chunk), TS (a multiple of TC),
//   SMEM_BYTES. Launcher: cupy_gda/recurrent_bwd.py.
//   Reference: cupy_gda.reference.gated_attention_backward_ref.
#if !defined(K_DIM) || !defined(V_DIM) || !defined(LOG_GATE) || !defined(SEQ_INT64) \
    || !defined(KT) || !defined(KG) || !defined(VT) || !defined(TC) || !defined(TS) \
    || !defined(SMEM_BYTES)
#error "K_DIM, V_DIM, LOG_GATE, SEQ_INT64, KT, KG, VT, TC, TS and SMEM_BYTES are required"
#endif
#define KP (KG * KT)                    // K padded to the threads' rows
#define BV (4 * VT)                     // value columns a block
#define NT (KT * VT)                    // threads a block
#define SUB (TS / TC)                   // chunks a span
#define EK ((TC * KP + NT - 1) / NT)    // q, k, g elements a thread stages a chunk
#define EV ((TC * BV + NT - 1) / NT)    // v, do elements
static_assert(KT % 32 == 0 && (VT & (VT - 1)) == 0 && NT <= 1024, "KT * VT threads, KT % 32 == 0");
static_assert(TS % TC == 0, "TS must be a multiple of TC");
static_assert(KP >= K_DIM && KP - KT < K_DIM, "KG * KT must be K padded by less than KT rows");

// shared memory, in floats: the float4 arrays first (16-byte aligned)
#define SM_HIST 0                                   // [TC][KG][NT] float4: S_{t-1} of each step
#define SM_PV (SM_HIST + TC * KG * NT * 4)          // [TC][KT][BV] partial sums of dv
#define SM_V (SM_PV + TC * KT * BV)                 // [TC][BV] v
#define SM_DO (SM_V + TC * BV)                      // [TC][BV] scale * do
#define SM_Q (SM_DO + TC * BV)                      // [TC][KP] q
#define SM_K (SM_Q + TC * KP)                       // [TC][KP] k
#define SM_G (SM_K + TC * KP)                       // [TC][KP] the multiplicative gate
#define SM_PK (SM_G + TC * KP)                      // [TC][3][KP][VT] partial sums of dq, dk, dg
#define SM_FLOATS (SM_PK + TC * 3 * KP * VT)
static_assert(SMEM_BYTES == SM_FLOATS * 4, "SMEM_BYTES (cupy_gda/recurrent_bwd.py smem) differs");

#define GDA_BACKWARD_PARAMS                                                                        \
    const io::t* __restrict__ q, const io::t* __restrict__ k, const io::t* __restrict__ v,       \
    const gt::t* __restrict__ g, const io::t* __restrict__ d_o, const float* __restrict__ h0,    \
    const float* __restrict__ dht, const seq_t* __restrict__ cu_seqlens,                         \
    float4* __restrict__ ws_h, float4* __restrict__ ws_s, float* __restrict__ ws_p,              \
    io::t* __restrict__ dq, io::t* __restrict__ dk, io::t* __restrict__ dv,                      \
    gt::t* __restrict__ dg, float* __restrict__ dh0, const int* __restrict__ only_if,           \
    long long T, int H, int NV, int NG, float scale

__device__ __forceinline__ float gda_dot4(float4 a, float4 b) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, a.x * b.x)));
}

// a + x * b, elementwise
__device__ __forceinline__ float4 gda_fma4(float x, float4 b, float4 a) {
    return make_float4(fmaf(x, b.x, a.x), fmaf(x, b.y, a.y), fmaf(x, b.z, a.z), fmaf(x, b.w, a.w));
}

// S = g S + k v^T for one row: the loop's step
__device__ __forceinline__ float4 gda_step4(float gg, float4 s, float kk, float4 vv) {
    return make_float4(fmaf(gg, s.x, kk * vv.x), fmaf(gg, s.y, kk * vv.y),
                       fmaf(gg, s.z, kk * vv.z), fmaf(gg, s.w, kk * vv.w));
}

// The columns of a thread that lie inside V zeroed out of a float4 (columns past V: NaN-safe)
__device__ __forceinline__ float4 gda_cols(float4 x, int col) {
#if V_DIM % BV
    if (col + 3 >= V_DIM) {
        x.y = col + 1 < V_DIM ? x.y : 0.f;
        x.z = col + 2 < V_DIM ? x.z : 0.f;
        x.w = col + 3 < V_DIM ? x.w : 0.f;
        x.x = col < V_DIM ? x.x : 0.f;
    }
#endif
    return x;
}

// 4 columns of a state row from col on, 0 past V; and back
__device__ __forceinline__ float4 gda_row_load(const float* row, int col) {
    return make_float4(col < V_DIM ? row[col] : 0.f, col + 1 < V_DIM ? row[col + 1] : 0.f,
                       col + 2 < V_DIM ? row[col + 2] : 0.f, col + 3 < V_DIM ? row[col + 3] : 0.f);
}
__device__ __forceinline__ void gda_row_store(float* row, int col, float4 x) {
    if (col < V_DIM) row[col] = x.x;
    if (col + 1 < V_DIM) row[col + 1] = x.y;
    if (col + 2 < V_DIM) row[col + 2] = x.z;
    if (col + 3 < V_DIM) row[col + 3] = x.w;
}

extern "C" __global__ void __launch_bounds__(NT, 1) gda_recurrent_bwd(GDA_BACKWARD_PARAMS)
{
    extern __shared__ float4 gda_smem[];
    float* const b_sm = reinterpret_cast<float*>(gda_smem);
    float4* const b_hist = gda_smem;
    float4* const b_pv = reinterpret_cast<float4*>(b_sm + SM_PV);
    const float4* const b_v = reinterpret_cast<const float4*>(b_sm + SM_V);
    const float4* const b_do = reinterpret_cast<const float4*>(b_sm + SM_DO);
    float* const b_q = b_sm + SM_Q;
    float* const b_k = b_sm + SM_K;
    float* const b_g = b_sm + SM_G;
    float* const b_pk = b_sm + SM_PK;

    if (only_if && *only_if == 0) return;       // (gda_chunk_bwd's fall-back: only where flagged)
    const long long i_b = blockIdx.x;
    const int i_g = (int)(i_b % NG), i_h = (int)((i_b / NG) % H);
    const long long i_n = i_b / NG / H;
    const int tid = threadIdx.x, vt = tid % VT, kt = tid / VT;
    long long bos, eos;
    gda_seq_rows(cu_seqlens, i_n, T, bos, eos);
    const long long len = eos - bos;
    const long long sk = (long long)H * K_DIM, sv = (long long)H * V_DIM;   // row strides
    const long long rows = cu_seqlens ? T : (long long)(gridDim.x / (H * NG)) * T;   // B*T
    const long long state0 = ((i_n * H + i_h) * (long long)K_DIM) * V_DIM;   // h0, dht, dh0
    const long long slot0 = bos / TS + i_n;                 // this sequence's first slot
    int v0 = 0, col = 0;                                    // the value tile's, the thread's

    // Inputs go global -> registers (one visit ahead: the loads fly while the last chunk is
    // computed) -> shared memory as float32. Rows [t0, t0 + TC) of the sequence; steps past the
    // end: k = q = v = do = 0, gate 1 (S and dS stay exactly as they are); q_do: q and do too.
    io::t r_q[EK], r_k[EK], r_v[EV], r_do[EV];
    gt::t r_g[EK];
    auto fetch = [&](long long t0, bool q_do) {
        #pragma unroll
        for (int j = 0; j < EK; ++j) {
            const int e = tid + j * NT, u = e / KP, kk = e % KP;
            if (e < TC * KP && t0 + u < len && kk < K_DIM) {
                const long long off = (bos + t0 + u) * sk + (long long)i_h * K_DIM + kk;
                r_k[j] = k[off];
                r_g[j] = g[off];
                if (q_do) r_q[j] = q[off];
            }
        }
        #pragma unroll
        for (int j = 0; j < EV; ++j) {
            const int e = tid + j * NT, u = e / BV, cc = e % BV;
            if (e < TC * BV && t0 + u < len && v0 + cc < V_DIM) {
                const long long off = (bos + t0 + u) * sv + (long long)i_h * V_DIM + v0 + cc;
                r_v[j] = v[off];
                if (q_do) r_do[j] = d_o[off];
            }
        }
    };
    auto put = [&](long long t0, bool q_do) {               // the same masks as fetch
        #pragma unroll
        for (int j = 0; j < EK; ++j) {
            const int e = tid + j * NT, u = e / KP, kk = e % KP;
            if (e < TC * KP) {
                const bool m = t0 + u < len && kk < K_DIM;
                b_k[e] = m ? io::load(r_k[j]) : 0.f;
                b_g[e] = m ? gda_gate(r_g[j]) : 1.f;
                if (q_do) b_q[e] = m ? io::load(r_q[j]) : 0.f;
            }
        }
        float* const b_vf = b_sm + SM_V;
        float* const b_dof = b_sm + SM_DO;
        #pragma unroll
        for (int j = 0; j < EV; ++j) {
            const int e = tid + j * NT, u = e / BV, cc = e % BV;
            if (e < TC * BV) {
                const bool m = t0 + u < len && v0 + cc < V_DIM;
                b_vf[e] = m ? io::load(r_v[j]) : 0.f;
                if (q_do) b_dof[e] = m ? scale * io::load(r_do[j]) : 0.f;
            }
        }
    };
    // The chunks a tile stages, in order: 1. every chunk, first to last (S only, kept every TS
    // steps); 2. each span of TS steps from the last: its chunks but the last (S only, kept at
    // each chunk's start), then all of them last first (q and do too: the gradients).
    const long long nch = (len + TC - 1) / TC;
    const long long s_last = (len - 1) / TS;                                // (len > 0)
    const long long nc_last = (len - s_last * TS + TC - 1) / TC;
    const long long visits = len > 0 ? nch + 2 * nc_last - 1 + s_last * (2 * SUB - 1) : 0;
    // visit i: its first step, kind (0, 1: S only in pass 1, 2; 2: gradients), span and chunk
    // c of nc in the span
    auto visit = [&](long long i, long long& t0, int& kind, long long& span, int& c, int& nc) {
        if (i < nch) {
            t0 = i * TC;
            kind = 0;
            return;
        }
        long long j = i - nch;
        span = s_last;
        nc = (int)nc_last;
        if (j >= 2 * nc_last - 1) {
            j -= 2 * nc_last - 1;
            span = s_last - 1 - j / (2 * SUB - 1);
            j %= 2 * SUB - 1;
            nc = SUB;
        }
        kind = j < nc - 1 ? 1 : 2;
        c = (int)(kind == 1 ? j : 2 * nc - 2 - j);
        t0 = span * TS + c * TC;
    };
    auto fetch_visit = [&](long long i) {
        long long t0, span;
        int kind, c, nc;
        visit(i, t0, kind, span, c, nc);
        fetch(t0, kind == 2);
    };
    auto at_h = [&](long long span, int i) {                // S at the span's first step
        return ws_h + (((slot0 + span) * H + i_h) * NG + i_g) * (KG * NT) + i * NT + tid;
    };
    auto at_s = [&](int c, int i) {                         // S at the chunk's first step
        return ws_s + (i_b * SUB + c) * (KG * NT) + i * NT + tid;
    };

    for (int i_v = i_g; i_v < NV; i_v += NG) {              // the block's value tiles
        v0 = i_v * BV;
        col = v0 + 4 * vt;
        // this tile's sums over V: written (the only tile), into ws_p (the group's first), added
        // to ws_p (a later one), or added to ws_p and written (the last of the only group)
        const int sums = NV == 1 ? 0 : i_v == i_g ? 1 : i_v + NG < NV || NG > 1 ? 2 : 3;
        float4 S[KG], dS[KG];                               // S from h0, dS from d_final_state
        #pragma unroll
        for (int i = 0; i < KG; ++i) {
            const int kk = kt + KT * i;
            const long long row = state0 + (long long)kk * V_DIM;
            S[i] = h0 && kk < K_DIM ? gda_row_load(h0 + row, col) : make_float4(0.f, 0.f, 0.f, 0.f);
            dS[i] = dht && kk < K_DIM ? gda_row_load(dht + row, col) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        if (visits) fetch_visit(0);
        for (long long i = 0; i < visits; ++i) {
            long long t0, span;
            int kind, c, nc;
            visit(i, t0, kind, span, c, nc);
            // S at the chunk's start: kept (pass 1), or from where it was kept
            if (kind == 0 && t0 % TS == 0) {
                #pragma unroll
                for (int i = 0; i < KG; ++i) *at_h(t0 / TS, i) = S[i];
            } else if (kind == 1) {
                #pragma unroll
                for (int i = 0; i < KG; ++i) {
                    if (c == 0) S[i] = *at_h(span, i);
                    *at_s(c, i) = S[i];
                }
            } else if (kind == 2 && (c < nc - 1 || nc == 1)) {   // (else: as the last advance left it)
                #pragma unroll
                for (int i = 0; i < KG; ++i) S[i] = c < nc - 1 ? *at_s(c, i) : *at_h(span, i);
            }
            __syncthreads();                                // the last chunk's reads are done
            put(t0, kind == 2);
            __syncthreads();
            if (i + 1 < visits) fetch_visit(i + 1);         // in flight while this one computes
            if (kind < 2) {                                 // S through the chunk
                #pragma unroll 4
                for (int u = 0; u < TC; ++u) {
                    const float4 vv = b_v[u * VT + vt];
                    #pragma unroll
                    for (int i = 0; i < KG; ++i) {
                        const int r = u * KP + kt + KT * i;
                        S[i] = gda_step4(b_g[r], S[i], b_k[r], vv);
                    }
                }
                continue;
            }
            // 2a. S through the chunk: S_{t-1} kept, dq_t = S_t (scale do_t), over V
            #pragma unroll 2
            for (int u = 0; u < TC; ++u) {
                const float4 vv = b_v[u * VT + vt], dd = b_do[u * VT + vt];
                #pragma unroll
                for (int i = 0; i < KG; ++i) {
                    const int kk = kt + KT * i, r = u * KP + kk;
                    b_hist[(u * KG + i) * NT + tid] = S[i];
                    S[i] = gda_step4(b_g[r], S[i], b_k[r], vv);
                    b_pk[((u * 3 + 0) * KP + kk) * VT + vt] = gda_dot4(gda_cols(S[i], col), dd);
                }
            }
            // 2b. the steps in reverse: dS_t, then its products, then diag(g_t) dS_t
            #pragma unroll 2
            for (int u = TC - 1; u >= 0; --u) {
                const float4 vv = b_v[u * VT + vt], dd = b_do[u * VT + vt];
                float4 pv = make_float4(0.f, 0.f, 0.f, 0.f);
                #pragma unroll
                for (int i = 0; i < KG; ++i) {
                    const int kk = kt + KT * i, r = u * KP + kk;
                    dS[i] = gda_fma4(b_q[r], dd, dS[i]);
                    const float4 d = gda_cols(dS[i], col);
                    b_pk[((u * 3 + 1) * KP + kk) * VT + vt] = gda_dot4(d, vv);
                    b_pk[((u * 3 + 2) * KP + kk) * VT + vt] =
                        gda_dot4(d, gda_cols(b_hist[(u * KG + i) * NT + tid], col));
                    if (KP == K_DIM || kk < K_DIM) pv = gda_fma4(b_k[r], dS[i], pv);
                    const float gg = b_g[r];
                    dS[i] = make_float4(gg * dS[i].x, gg * dS[i].y, gg * dS[i].z, gg * dS[i].w);
                }
                b_pv[(u * KT + kt) * VT + vt] = pv;
            }
            __syncthreads();
            // 2c. the chunk's sums: dv over K (KT partial sums), dq, dk, dg over V (VT)
            const float* const pvf = reinterpret_cast<const float*>(b_pv);
            for (int e = tid; e < TC * BV; e += NT) {
                const int u = e / BV, cc = e % BV;
                if (t0 + u < len && v0 + cc < V_DIM) {
                    float s = 0.f;
                    #pragma unroll 8
                    for (int j = 0; j < KT; ++j) s += pvf[(u * KT + j) * BV + cc];
                    dv[(bos + t0 + u) * sv + (long long)i_h * V_DIM + v0 + cc] = io::store(s);
                }
            }
            // (a thread adds the same elements in every tile: its own writes, no barrier)
            for (int e = tid; e < TC * 3 * KP; e += NT) {
                const int u = e / (3 * KP), m = e / KP % 3, kk = e % KP;
                if (t0 + u >= len || kk >= K_DIM) continue;
                float s = 0.f;
                #pragma unroll
                for (int j = 0; j < VT; ++j) s += b_pk[e * VT + j];
                const long long at = (bos + t0 + u) * sk + (long long)i_h * K_DIM + kk;
                float* const part = ws_p + (i_g * 3LL + m) * rows * sk + at;
                if (sums == 1) { *part = s; continue; }
                if (sums >= 2) s += *part;
                if (sums == 2) { *part = s; continue; }
                if (m == 0) {
                    dq[at] = io::store(s);
                } else if (m == 1) {
                    dk[at] = io::store(s);
                } else {
                    dg[at] = gt::store(gda_gate_grad(b_g[u * KP + kk], s));
                }
            }
        }

        // d_initial_state = diag(g_1) dS_1 (dS as the last step left it); d_final_state's for
        // an empty sequence
        if (dh0)
            #pragma unroll
            for (int i = 0; i < KG; ++i) {
                const int kk = kt + KT * i;
                if (kk < K_DIM) gda_row_store(dh0 + state0 + (long long)kk * V_DIM, col, dS[i]);
            }
    }
}

// With NG > 1 groups of value tiles: dq, dk, dg from their partial sums ws_p [NG][3][n] (n =
// B*T*H*K elements, in the [B*T, H, K] order of q), the log gate's as g dg (exactly 0 where g is)
extern "C" __global__ void gda_recurrent_bwd_sum(const float* __restrict__ ws_p,
                                                 const gt::t* __restrict__ g, io::t* __restrict__ dq,
                                                 io::t* __restrict__ dk, gt::t* __restrict__ dg,
                                                 const int* __restrict__ only_if, long long n, int NG)
{
    if (only_if && *only_if == 0) return;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x) {
        float s[3] = {0.f, 0.f, 0.f};
        for (int ig = 0; ig < NG; ++ig)
            #pragma unroll
            for (int m = 0; m < 3; ++m) s[m] += ws_p[(ig * 3LL + m) * n + e];
        dq[e] = io::store(s[0]);
        dk[e] = io::store(s[1]);
        dg[e] = gt::store(gda_gate_grad(LOG_GATE ? gda_gate(g[e]) : 1.f, s[2]));
    }
}
