// gda_chunk_bwd: gated linear attention, backward, in chunks of BT steps (the kernels around
// cuBLAS's float32 GEMMs; launcher cupy_gda/chunk_bwd.py, which lists the whole pipeline).
//
//   forward:  S_t = diag(g_t) S_{t-1} + k_t v_t^T,   o_t = scale * S_t^T q_t
//   backward: dS_t = scale * q_t do_t^T + diag(g_{t+1}) dS_{t+1}   (dS_T += d_final_state)
//             dq_t = scale * S_t do_t,  dk_t = dS_t v_t,  dv_t = dS_t^T k_t,
//             dg_t = rowsum(dS_t (.) S_{t-1})                      (d log g_t = g_t dg_t)
//
// Per chunk of BT steps, with S0 the state before it, E the gradient reaching its last state
// from later steps, P(a..b) = prod_{a <= r <= b} g_r (1 when empty) inside the chunk,
// A_t = P(0..t), Aex_t = P(0..t-1), D_t = P(t+1..BT-1) and M[s, u] = scale v_s . do_u
// (scripts/chunk_backward_exact.py checks every line against the reverse loop):
//   dq_t = A_t (scale S0 do_t) + sum_{s <= t} P(s+1..t) k_s M[s, t]
//   dk_t = sum_{u >= t} P(t+1..u) q_u M[t, u] + D_t (E v_t)
//   dv_s = scale sum_{u >= s} W[s, u] do_u + E^T (D_s k_s),  W[s, u] = sum_i k_s P(s+1..u) q_u
//   dg_t = Aex_t D_t rowsum(E (.) S0) + D_t R_t + Aex_t F_t + sum_{s < t} P(s+1..t-1) k_s X_t[s]
//     R_t = sum_{s < t} P(s+1..t-1) k_s (E v_s),  F_t = sum_{u >= t} P(t+1..u) q_u (scale S0 do_u),
//     X_t[s] = sum_{u >= t} P(t+1..u) q_u M[s, u]          (so dk's first term is X_t[t])
// Every decay is a product of gates (never a quotient or a difference of logs), so gates of 0
// give the loop's gradients. The matmuls (M, scale S0 do, E v, the local states and dv) run in
// cuBLAS float32 (no TF32); these kernels do the rest:
//   gda_chunk_bwd_pack:   per chunk, q A, k D, A_end and v, do as float32 rows [NB][BT][*] (rows
//                         past the sequence: gate 1, q = k = v = do = 0, which changes nothing);
//                         the guard (below) on the inputs.
//   gda_chunk_bwd_states: per (sequence-head, key row), chunk by chunk: the local states (k D)^T v
//                         and scale (q A)^T do become S0 (forward) and E (backward) in place, and
//                         rowsum(E (.) S0); d_initial_state; the guard on S0 and E.
//   gda_chunk_bwd_scores: W of each chunk, a thread per column u.
//   gda_chunk_bwd_intra:  dq, dk, dg of each chunk, a thread per key column, the steps in reverse
//                         (X_t in registers, the chunk's k and g in shared memory).
//   gda_chunk_bwd_dv:     dv from its float32 rows to [B, T, H, V] in v's dtype.
// The guard: the chunked form's products are bounded while |q|, |k|, |v|, |do| <= 2^20, |g| <=
//   2^(1/8) (a chunk's gate products within 2^8) and |S0|, |E| <= 2^40 (no sum above 2^120:
//   docs/perf-notes.md, v19). Outside it (NaN, inf, large gates or values) the kernels set
//   *flag, and the launcher's next launch, the reverse loop (gda_recurrent_bwd), runs only then
//   and overwrites every gradient: the loop's result, without a host sync.
//
// Layout: chunk b = nh * NC + j of NH sequence-heads: without cu_seqlens nh = n * H + h, j the
//   chunk c of sequence n (NC = chunks of T steps); with them nh = h and j runs over every
//   sequence's chunks in order (NC = their most, T / BT + N; gda_chunk_at). Its rows [b][BT][*]
//   in the float32 workspaces.
// Required defines: K_DIM, V_DIM, IO_DTYPE, G_DTYPE, LOG_GATE, SEQ_INT64, BT (steps a chunk,
//   16..64, a multiple of 16), KT (key columns a block of gda_chunk_bwd_intra, a multiple of 32).
//   Reference: cupy_gda.reference.gated_attention_backward_ref.
#if !defined(K_DIM) || !defined(V_DIM) || !defined(LOG_GATE) || !defined(SEQ_INT64) \
    || !defined(BT) || !defined(KT)
#error "K_DIM, V_DIM, LOG_GATE, SEQ_INT64, BT and KT are required"
#endif
static_assert(BT % 16 == 0 && BT >= 16 && BT <= 64, "BT: 16..64, a multiple of 16");
static_assert(KT % 32 == 0 && KT <= 256, "KT: a multiple of 32, at most 256");

#define GDA_BWD_VAL_MAX 0x1p20f         // the guard: |q|, |k|, |v|, |do| at most this,
#define GDA_BWD_GATE_MAX 1.09050773f    //   |g| at most 2^(1/8),
#define GDA_BWD_STATE_MAX 0x1p40f       //   |S0|, |E| at most this
#define NTP 128                         // threads of pack, states, dv
#define NTS BT                          // threads of scores (one a column u)

#define GDA_CHUNK_BWD_PARAMS                                                                       \
    const io::t* __restrict__ q, const io::t* __restrict__ k, const io::t* __restrict__ v,       \
    const gt::t* __restrict__ g, const io::t* __restrict__ d_o, const float* __restrict__ h0,    \
    const float* __restrict__ dht, float* __restrict__ st, float* __restrict__ et,               \
    float* __restrict__ qa, float* __restrict__ kd, float* __restrict__ vp,                      \
    float* __restrict__ dp, float* __restrict__ ae, float* __restrict__ es,                      \
    const float* __restrict__ mm, float* __restrict__ ww, const float* __restrict__ sd,          \
    const float* __restrict__ ev, float2* __restrict__ ar, int* __restrict__ flag,               \
    io::t* __restrict__ dq, io::t* __restrict__ dk, io::t* __restrict__ dv,                      \
    gt::t* __restrict__ dg, float* __restrict__ dh0, const seq_t* __restrict__ cu_seqlens,       \
    const long long* __restrict__ coff, long long T, long long NH, long long N, int H, int NC,   \
    float scale

// |x| <= bound (NaN: false)
__device__ __forceinline__ bool gda_bwd_in(float x, float bound) { return fabsf(x) <= bound; }

// Chunk b's place: element (r, col) of its rows in a [B*T, H, dim] tensor, and its rows inside
// the sequence (the rest of its BT rows are padding). Without cu_seqlens, b = (n * H + h) * NC
// + c; with them, b = h * NC + j, j the chunk in the packed order of every sequence's chunks:
// sequence n has chunks coff[n] .. coff[n+1] - 1 (at least one, so an empty sequence has one
// of no rows), and chunks from coff[N] on have no rows.
struct gda_chunk_at {
    long long row0;                     // (sequence row of its first step) * H + h
    int rows, H;
    __device__ __forceinline__ gda_chunk_at(long long b, long long T, int H_, int NC,
                                            const seq_t* cu_seqlens, const long long* coff,
                                            long long N) : H(H_) {
        const long long nh = b / NC, j = b % NC;
        long long n = nh / H, c = j, h = nh % H;
        if (coff) {
            long long lo = 0, hi = N;                   // the last n < N with coff[n] <= j
            while (hi - lo > 1) {
                const long long mid = (lo + hi) / 2;
                if (coff[mid] <= j) lo = mid; else hi = mid;
            }
            n = lo;
            c = j - coff[n];
            h = nh;
        }
        long long bos, eos;
        gda_seq_rows(cu_seqlens, n, T, bos, eos);
        row0 = (bos + c * BT) * H + h;
        rows = (int)max(0LL, min((long long)BT, eos - bos - c * BT));
    }
    __device__ __forceinline__ long long at(int r, int dim, int col) const {
        return (row0 + (long long)r * H) * dim + col;
    }
};

#define GDA_CHUNK gda_chunk_at ch(b, T, H, NC, cu_seqlens, coff, N)

extern "C" __global__ void __launch_bounds__(NTP) gda_chunk_bwd_pack(GDA_CHUNK_BWD_PARAMS)
{
    const long long b = blockIdx.x;
    GDA_CHUNK;
    bool ok = true;
    for (int i = threadIdx.x; i < K_DIM; i += NTP) {
        float a = 1.f;                                  // A_t: q A, A_end
        #pragma unroll 8
        for (int t = 0; t < BT; ++t) {
            float qv = 0.f, gv = 1.f;
            if (t < ch.rows) {
                const long long e = ch.at(t, K_DIM, i);
                qv = io::load(q[e]);
                gv = gda_gate(g[e]);
                ok &= gda_bwd_in(qv, GDA_BWD_VAL_MAX) & gda_bwd_in(gv, GDA_BWD_GATE_MAX);
            }
            a *= gv;
            qa[(b * BT + t) * K_DIM + i] = qv * a;
        }
        ae[b * K_DIM + i] = a;
        float d = 1.f;                                  // D_t: k D
        #pragma unroll 8
        for (int t = BT - 1; t >= 0; --t) {
            float kv = 0.f, gv = 1.f;
            if (t < ch.rows) {
                const long long e = ch.at(t, K_DIM, i);
                kv = io::load(k[e]);
                gv = gda_gate(g[e]);
                ok &= gda_bwd_in(kv, GDA_BWD_VAL_MAX);
            }
            kd[(b * BT + t) * K_DIM + i] = kv * d;
            d *= gv;
        }
    }
    for (int j = threadIdx.x; j < V_DIM; j += NTP)
        #pragma unroll 8
        for (int t = 0; t < BT; ++t) {
            float vv = 0.f, dov = 0.f;
            if (t < ch.rows) {
                const long long e = ch.at(t, V_DIM, j);
                vv = io::load(v[e]);
                dov = io::load(d_o[e]);
                ok &= gda_bwd_in(vv, GDA_BWD_VAL_MAX) & gda_bwd_in(dov, GDA_BWD_VAL_MAX);
            }
            vp[(b * BT + t) * V_DIM + j] = vv;
            dp[(b * BT + t) * V_DIM + j] = dov;
        }
    if (!ok) *flag = 1;
}

#define VW (V_DIM % 4 == 0 ? 4 : 1)                     // value columns a load of states
#define NTC (V_DIM / VW >= 128 ? 128 : (V_DIM / VW + 31) / 32 * 32)  // threads a key row
#define RB (NTP / NTC)                                  // key rows a block of states
#define VJ ((V_DIM / VW + NTC - 1) / NTC)               // loads a thread, a row of states
#define CU (VJ * VW >= 8 ? 4 : 8)                       // chunks a group of states (loads first)
typedef gda_float_pack<VW> vpack;

// Row x (VW floats at st + x) as a pack; 0 where `on` is false
__device__ __forceinline__ vpack gda_ld(const float* p, long long x, bool on) {
    vpack r;
    if (on) r.v = *reinterpret_cast<const typename gda_floats<VW>::t*>(p + x);
    else
        #pragma unroll
        for (int w = 0; w < VW; ++w) r.f[w] = 0.f;
    return r;
}

// Block: RB rows (sequence-head nh, key row i) of NTC threads, thread jt: the columns
// (jt + jj NTC) VW .. + VW - 1. st[b][i][:] holds (k D)^T v of chunk b and becomes S0 (the state
// before the chunk); et[b][i][:] holds scale (q A)^T do and becomes E; es[b][i] = rowsum(E (.)
// S0); dh0 = the gradient reaching each sequence's initial state. A row runs its sequences one
// after another (with cu_seqlens nh is the head, and sequence n its chunks coff[n] ..
// coff[n+1] - 1; else one, NC chunks), each forward then backward; the chunks go CU at a time,
// their loads issued together (the scan's chain is the FMA, not the loads). Every row of a
// block passes the same barriers (the chunk ranges are the same for every head).
extern "C" __global__ void __launch_bounds__(NTP) gda_chunk_bwd_states(GDA_CHUNK_BWD_PARAMS)
{
    __shared__ float b_red[CU][NTP / 32];
    const int r = threadIdx.x / NTC, jt = threadIdx.x % NTC;
    const long long row = (long long)blockIdx.x * RB + r;         // (nh, i) of [NH, K]
    const bool live = row < NH * K_DIM;                            // (the last block's rows)
    const long long nh = live ? row / K_DIM : 0;
    const int i = live ? (int)(row % K_DIM) : 0;
    bool ok = true;
    const long long nseq = coff ? N : 1;
    for (long long sq = 0; sq < nseq; ++sq) {
        const long long n = coff ? sq : nh / H;
        const int j0 = coff ? (int)coff[n] : 0, j1 = coff ? (int)coff[n + 1] : NC;
        const long long srow = (n * H + (coff ? nh : nh % H)) * K_DIM + i;   // of h0, dht, dh0
        float s[VJ][VW], e[VJ][VW];
        #pragma unroll
        for (int jj = 0; jj < VJ; ++jj)
            #pragma unroll
            for (int w = 0; w < VW; ++w) {
                const int j = (jt + jj * NTC) * VW + w;
                s[jj][w] = h0 && live && j < V_DIM ? h0[srow * V_DIM + j] : 0.f;
                e[jj][w] = dht && live && j < V_DIM ? dht[srow * V_DIM + j] : 0.f;
            }
        for (int c0 = j0; live && c0 < j1; c0 += CU) {   // forward: S0 of each chunk
            float a[CU];
            vpack l[CU][VJ];
            #pragma unroll
            for (int u = 0; u < CU; ++u) {
                const long long b = nh * NC + min(c0 + u, j1 - 1);
                a[u] = ae[b * K_DIM + i];
                #pragma unroll
                for (int jj = 0; jj < VJ; ++jj) {
                    const int j = (jt + jj * NTC) * VW;
                    l[u][jj] = gda_ld(st, (b * K_DIM + i) * V_DIM + j, j < V_DIM);
                }
            }
            #pragma unroll
            for (int u = 0; u < CU; ++u) {
                if (c0 + u < j1) {
                    const long long b = nh * NC + c0 + u;
                    #pragma unroll
                    for (int jj = 0; jj < VJ; ++jj) {
                        const int j = (jt + jj * NTC) * VW;
                        if (j < V_DIM) {
                            vpack o;
                            #pragma unroll
                            for (int w = 0; w < VW; ++w) {
                                o.f[w] = s[jj][w];
                                ok &= gda_bwd_in(s[jj][w], GDA_BWD_STATE_MAX);
                                s[jj][w] = fmaf(a[u], s[jj][w], l[u][jj].f[w]);
                            }
                            *reinterpret_cast<typename gda_floats<VW>::t*>(
                                st + (b * K_DIM + i) * V_DIM + j) = o.v;
                        }
                    }
                }
            }
        }
        for (int c1 = j1 - 1; c1 >= j0; c1 -= CU) {     // backward: E of each chunk, from the last
            float a[CU], part[CU];
            vpack l[CU][VJ], s0[CU][VJ];
            #pragma unroll
            for (int u = 0; u < CU; ++u) {
                const long long b = nh * NC + max(c1 - u, j0);
                a[u] = live ? ae[b * K_DIM + i] : 0.f;
                #pragma unroll
                for (int jj = 0; jj < VJ; ++jj) {
                    const int j = (jt + jj * NTC) * VW;
                    const long long x = (b * K_DIM + i) * V_DIM + j;
                    l[u][jj] = gda_ld(et, x, live && j < V_DIM);
                    s0[u][jj] = gda_ld(st, x, live && j < V_DIM);
                }
            }
            #pragma unroll
            for (int u = 0; u < CU; ++u) {
                part[u] = 0.f;
                if (live && c1 - u >= j0) {
                    const long long b = nh * NC + c1 - u;
                    #pragma unroll
                    for (int jj = 0; jj < VJ; ++jj) {
                        const int j = (jt + jj * NTC) * VW;
                        if (j < V_DIM) {
                            vpack o;
                            #pragma unroll
                            for (int w = 0; w < VW; ++w) {
                                o.f[w] = e[jj][w];
                                ok &= gda_bwd_in(e[jj][w], GDA_BWD_STATE_MAX);
                                part[u] = fmaf(e[jj][w], s0[u][jj].f[w], part[u]);
                                e[jj][w] = fmaf(a[u], e[jj][w], l[u][jj].f[w]);
                            }
                            *reinterpret_cast<typename gda_floats<VW>::t*>(
                                et + (b * K_DIM + i) * V_DIM + j) = o.v;
                        }
                    }
                }
            }
            // rowsum over the row's NTC threads: its warps' shuffle sums, then across them
            #pragma unroll
            for (int u = 0; u < CU; ++u) {
                #pragma unroll
                for (int o = 16; o > 0; o >>= 1) part[u] += __shfl_xor_sync(GDA_FULL_MASK, part[u], o);
                if (threadIdx.x % 32 == 0) b_red[u][threadIdx.x / 32] = part[u];
            }
            __syncthreads();
            if (live && jt < CU && c1 - jt >= j0) {
                float sum = 0.f;
                #pragma unroll
                for (int w = 0; w < NTC / 32; ++w) sum += b_red[jt][r * (NTC / 32) + w];
                es[(nh * NC + c1 - jt) * K_DIM + i] = sum;
            }
            __syncthreads();                             // b_red is rewritten by the next group
        }
        if (dh0 && live)
            #pragma unroll
            for (int jj = 0; jj < VJ; ++jj)
                #pragma unroll
                for (int w = 0; w < VW; ++w) {
                    const int j = (jt + jj * NTC) * VW + w;
                    if (j < V_DIM) dh0[srow * V_DIM + j] = e[jj][w];
                }
    }
    if (!ok) *flag = 1;
}

#define KI 32                                           // key columns a step of scores

// Block (chunk b), thread u: W[b][s][u] = sum_i k_s[i] P(s+1..u)[i] q_u[i] for s <= u, 0 below
// (the running product p = P(s+1..u) from s = u down; 0 above u, so those terms add nothing).
extern "C" __global__ void __launch_bounds__(NTS) gda_chunk_bwd_scores(GDA_CHUNK_BWD_PARAMS)
{
    __shared__ float2 b_kg[KI][BT + 1];                 // (k, g) of KI key columns (padded:
                                                        //   its stores are by key column)
    __shared__ float b_q[BT][KI + 1];
    const long long b = blockIdx.x;
    GDA_CHUNK;
    const int u = threadIdx.x;
    float w[BT];
    #pragma unroll
    for (int s = 0; s < BT; ++s) w[s] = 0.f;
    for (int i0 = 0; i0 < K_DIM; i0 += KI) {
        __syncthreads();                                // the last step's reads are done
        for (int x = threadIdx.x; x < KI * BT; x += NTS) {
            const int t = x / KI, ii = x % KI, i = i0 + ii;
            float kv = 0.f, gv = 1.f, qv = 0.f;
            if (t < ch.rows && i < K_DIM) {
                const long long e = ch.at(t, K_DIM, i);
                kv = io::load(k[e]);
                gv = gda_gate(g[e]);
                qv = io::load(q[e]);
            }
            b_kg[ii][t] = make_float2(kv, gv);
            b_q[t][ii] = qv;
        }
        __syncthreads();
        const int u_last = u | 31;                      // the warp's last column: no s above it
        #pragma unroll 2
        for (int ii = 0; ii < KI; ++ii) {
            const float qu = b_q[u][ii];
            float p = 0.f;
            #pragma unroll
            for (int sb = BT / 16 - 1; sb >= 0; --sb) {
                if (sb * 16 <= u_last) {
                    #pragma unroll
                    for (int s = sb * 16 + 15; s >= sb * 16; --s) {
                        const float2 kg = b_kg[ii][s];
                        p = s == u ? 1.f : p;
                        w[s] = fmaf(kg.x * p, qu, w[s]);
                        p *= kg.y;
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int s = 0; s < BT; ++s) ww[(b * BT + s) * BT + u] = w[s];
}

// Block (chunk b, key tile kt), thread: key column i. Load: the chunk's k, g of the column into
// shared memory, M into shared memory, and (Aex_t, R_t) forward into ar. Then t from the last
// step down: X (over s <= t, registers) <- q_t M[s, t] + g_{t+1} X, and the sums over s < t with
// weights P(s+1..t-1) k_s (a running product down from s = t - 1) give dq's and dg's terms.
extern "C" __global__ void __launch_bounds__(KT) gda_chunk_bwd_intra(GDA_CHUNK_BWD_PARAMS)
{
    __shared__ float b_m[BT][BT];
    __shared__ float2 b_kg[BT][KT];
    const long long b = blockIdx.x / ((K_DIM + KT - 1) / KT);
    const int i = (int)(blockIdx.x % ((K_DIM + KT - 1) / KT)) * KT + threadIdx.x;
    const int ti = threadIdx.x;
    const bool col = i < K_DIM;
    GDA_CHUNK;
    #pragma unroll 8
    for (int x = threadIdx.x; x < BT * BT; x += KT) b_m[x / BT][x % BT] = mm[b * BT * BT + x];
    const long long w0 = b * BT * K_DIM + i;            // (t, i) of the [b][BT][K] workspaces
    #pragma unroll 8
    for (int t = 0; t < BT; ++t) {
        float kv = 0.f, gv = 1.f;
        if (col && t < ch.rows) {
            const long long e = ch.at(t, K_DIM, i);
            kv = io::load(k[e]);
            gv = gda_gate(g[e]);
        }
        b_kg[t][ti] = make_float2(kv, gv);
    }
    if (col) {                                          // (Aex_t, R_t), forward
        float aex = 1.f, r = 0.f;
        #pragma unroll 8
        for (int t = 0; t < BT; ++t) {
            const float2 kg = b_kg[t][ti];
            const float evt = ev[w0 + (long long)t * K_DIM];
            ar[w0 + (long long)t * K_DIM] = make_float2(aex, r);
            r = fmaf(kg.y, r, kg.x * evt);
            aex *= kg.y;
        }
    }
    __syncthreads();
    if (!col) return;
    const float esum = es[b * K_DIM + i];
    float x[BT];
    #pragma unroll
    for (int s = 0; s < BT; ++s) x[s] = 0.f;
    float dx = 1.f, f = 0.f, gnext = 1.f;               // D_t, F_t, g_{t+1}
    // step t's values from global memory, loaded one step ahead
    float qn = 0.f, sdn, evn;
    float2 arn;
    auto fetch = [&](int t) {
        const long long wt = w0 + (long long)t * K_DIM;
        qn = t < ch.rows ? io::load(q[ch.at(t, K_DIM, i)]) : 0.f;
        sdn = sd[wt];
        evn = ev[wt];
        arn = ar[wt];
    };
    fetch(BT - 1);
    for (int t = BT - 1; t >= 0; --t) {
        const float qt = qn, sdt = sdn, evt = evn, aex = arn.x, r = arn.y;
        if (t > 0) fetch(t - 1);
        const float2 kg = b_kg[t][ti];
        f = fmaf(gnext, f, qt * sdt);
        // X_t[s] for s <= t, and the sums over s < t weighted by P(s+1..t-1) k_s (p = 0 until
        // s = t - 1, so s >= t adds nothing; X past t is never read again): 16 steps a block,
        // whole blocks past t skipped (t is the same in the whole warp)
        float xt = 0.f, t4 = 0.f, aq = 0.f, p = 0.f;
        #pragma unroll
        for (int sb = BT / 16 - 1; sb >= 0; --sb) {
            if (sb * 16 <= t) {
                #pragma unroll
                for (int s = sb * 16 + 15; s >= sb * 16; --s) {
                    const float m = b_m[s][t];
                    const float2 ks = b_kg[s][ti];
                    x[s] = fmaf(gnext, x[s], qt * m);
                    xt = s == t ? x[s] : xt;
                    const float wk = p * ks.x;
                    t4 = fmaf(wk, x[s], t4);
                    aq = fmaf(wk, m, aq);
                    p = s == t ? 1.f : p * ks.y;
                }
            }
        }
        const float gt_ = kg.y;
        const float dqt = fmaf(aex * gt_, sdt, fmaf(kg.x, b_m[t][t], gt_ * aq));
        const float dkt = fmaf(dx, evt, xt);
        const float dgt = fmaf(aex * dx, esum, fmaf(dx, r, fmaf(aex, f, t4)));
        if (t < ch.rows) {
            const long long e = ch.at(t, K_DIM, i);
            dq[e] = io::store(dqt);
            dk[e] = io::store(dkt);
            dg[e] = gt::store(gda_gate_grad(gt_, dgt));
        }
        dx *= gt_;
        gnext = gt_;
    }
}

// dv from its float32 rows [b][BT][V] (vp, after cuBLAS) into [B, T, H, V]
extern "C" __global__ void __launch_bounds__(NTP) gda_chunk_bwd_dv(GDA_CHUNK_BWD_PARAMS)
{
    const long long b = blockIdx.x;
    GDA_CHUNK;
    for (int t = 0; t < ch.rows; ++t)
        for (int j = threadIdx.x; j < V_DIM; j += NTP)
            dv[ch.at(t, V_DIM, j)] = io::store(vp[(b * BT + t) * V_DIM + j]);
}
