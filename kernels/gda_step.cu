// gda_step: gated linear attention, one token per sequence, state updated in place (decode).
//
//   S = diag(g) S + k v^T,  o = scale * S^T q       state row n = state_indices[b] (or b)
//
// Bandwidth-bound: each state element is read once and written once, in VEC-wide (16-byte for
// VEC = 4) accesses. Grid (1-D): one block per (b, h, tile of 32*VEC value columns), block id
//   ((b * H) + h) * NV + iv. Block: KW warps x 32 lanes; lane l holds columns v0 + VEC*l + e,
//   warp w the rows k = w + j*KW, j < KPW (all rows' loads issued before the first use).
//   The K-sum of o goes through shared memory across the KW warps.
// A row index outside [0, N) (possible only when the caller skipped the host check) touches
//   no state and yields NaN outputs.
//
// Required defines: K_DIM, V_DIM (1..256), IO_DTYPE, G_DTYPE, LOG_GATE, IDX_INT64.
//   Tunable: KW (warps), VEC (1, 2 or 4; V_DIM % VEC == 0 and a VEC*4-byte aligned state).
// Launcher: cupy_gda/step.py. Reference: cupy_gda.reference.gated_attention_step_ref.
#if !defined(K_DIM) || !defined(V_DIM) || !defined(LOG_GATE) || !defined(IDX_INT64)
#error "K_DIM, V_DIM, LOG_GATE and IDX_INT64 are required"
#endif
#ifndef KW
#define KW 8
#endif
#ifndef VEC
#define VEC 4
#endif
#define NT (KW * 32)
#define BVS (32 * VEC)                         // value columns per block
#define KPW ((K_DIM + KW - 1) / KW)            // state rows per warp
static_assert(VEC == 1 || VEC == 2 || VEC == 4, "VEC must be 1, 2 or 4");
static_assert(V_DIM % VEC == 0, "V_DIM must be a multiple of VEC");

#if IDX_INT64
typedef long long idx_t;
#else
typedef int idx_t;
#endif

typedef gda_floats<VEC>::t vec_t;

extern "C" __global__ void __launch_bounds__(NT)
gda_step(const io::t* __restrict__ q, const io::t* __restrict__ k, const io::t* __restrict__ v,
         const gt::t* __restrict__ g, io::t* __restrict__ o, float* __restrict__ state,
         const idx_t* __restrict__ state_indices, int H, long long N, int NV, float scale)
{
    __shared__ float b_q[K_DIM], b_k[K_DIM], b_g[K_DIM];
    __shared__ float b_o[KW][BVS];

    const long long i_b = blockIdx.x;
    const int i_v = (int)(i_b % NV), i_h = (int)((i_b / NV) % H);
    const long long i_bh = i_b / NV;                  // b * H + h
    const long long i_n = state_indices ? (long long)state_indices[i_bh / H] : i_bh / H;
    const int tid = threadIdx.x, w = tid / 32, l = tid % 32;
    const int col = i_v * BVS + l * VEC;
    const bool live = col < V_DIM, valid = i_n >= 0 && i_n < N;

    for (int kk = tid; kk < K_DIM; kk += NT) {
        const long long off = i_bh * K_DIM + kk;
        b_q[kk] = io::load(q[off]); b_k[kk] = io::load(k[off]); b_g[kk] = gda_gate(g[off]);
    }
    float b_v[VEC];
    #pragma unroll
    for (int e = 0; e < VEC; ++e) b_v[e] = live ? io::load(v[i_bh * V_DIM + col + e]) : 0.f;
    __syncthreads();

    float b_ot[VEC] = {};
    if (live && valid) {
        vec_t* p_s = reinterpret_cast<vec_t*>(state + ((i_n * H + i_h) * K_DIM) * V_DIM + col);
        gda_float_pack<VEC> b_s[KPW];
        #pragma unroll
        for (int j = 0; j < KPW; ++j) {
            const int kk = w + j * KW;
            if (kk < K_DIM) b_s[j].v = p_s[(long long)kk * (V_DIM / VEC)];
        }
        #pragma unroll
        for (int j = 0; j < KPW; ++j) {
            const int kk = w + j * KW;
            if (kk < K_DIM) {
                #pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    b_s[j].f[e] = fmaf(b_g[kk], b_s[j].f[e], b_k[kk] * b_v[e]);
                    b_ot[e] = fmaf(b_s[j].f[e], b_q[kk], b_ot[e]);
                }
                p_s[(long long)kk * (V_DIM / VEC)] = b_s[j].v;
            }
        }
    }
    #pragma unroll
    for (int e = 0; e < VEC; ++e) b_o[w][l * VEC + e] = b_ot[e];
    __syncthreads();
    for (int cc = tid; cc < BVS; cc += NT) {
        const int vv = i_v * BVS + cc;
        if (vv < V_DIM) {
            float s = 0.f;
            #pragma unroll
            for (int ww = 0; ww < KW; ++ww) s += b_o[ww][cc];
            o[i_bh * V_DIM + vv] = io::store(valid ? s * scale : __int_as_float(0x7fc00000));
        }
    }
}
