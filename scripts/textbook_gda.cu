// textbook_gda: gated linear attention, forward, written the way a textbook would. A baseline
// for the bench table (scripts/baselines.py); never shipped, never tuned.
//
//   S_t = diag(g_t) S_{t-1} + k_t v_t^T,   o_t = scale * S_t^T q_t        (S: [K, V], fp32)
//
// Grid (1-D): one block per (b, h), block id b * H + h; S_0 = 0. Block: NT threads. The whole
//   state S[K][V] lives in (dynamic) shared memory. Each step t, three phases, three barriers:
//     1. the threads load q_t, k_t, g_t (K each) and v_t (V) from global memory into shared;
//     2. every thread updates its share of S (elements tid, tid + NT, ...);
//     3. thread j < V sums o_t[j] = scale * sum_k q_t[k] S[k][j] and writes it to global memory.
//   The third barrier keeps the next step's loads from overwriting q_t while phase 3 reads it.
// Layout: q, k, g [B, T, H, K] and v, o [B, T, H, V], float32, contiguous; the gate is
//   multiplicative. Shared memory: (K*V + 3*K + V) floats (the launcher opts in above 48 KB).
//
// Required defines: K_DIM, V_DIM. Tunable: NT (threads per block, a multiple of 32).
// Reference: cupy_gda.reference.gated_attention_ref (scripts/baselines.py checks it against ours
//   first).
#if !defined(K_DIM) || !defined(V_DIM)
#error "K_DIM and V_DIM are required"
#endif
#ifndef NT
#define NT 128
#endif
static_assert(K_DIM >= 1 && V_DIM >= 1, "K_DIM and V_DIM must be positive");
static_assert(NT % 32 == 0 && NT >= 32 && NT <= 1024, "NT must be a multiple of 32, at most 1024");

extern "C" __global__ void __launch_bounds__(NT)
textbook_gda(const float* __restrict__ q, const float* __restrict__ k,
             const float* __restrict__ v, const float* __restrict__ g,
             float* __restrict__ o, long long T, int H, float scale)
{
    extern __shared__ float smem[];
    float* S = smem;                        // [K_DIM][V_DIM]
    float* b_q = S + K_DIM * V_DIM;         // [K_DIM]
    float* b_k = b_q + K_DIM;               // [K_DIM]
    float* b_g = b_k + K_DIM;               // [K_DIM]
    float* b_v = b_g + K_DIM;               // [V_DIM]

    const long long i_bh = blockIdx.x;
    const long long i_b = i_bh / H;
    const int i_h = (int)(i_bh % H);
    const int tid = threadIdx.x;

    for (int e = tid; e < K_DIM * V_DIM; e += NT) S[e] = 0.f;

    for (long long t = 0; t < T; ++t) {
        const long long row = (i_b * T + t) * H + i_h;      // row of the [B*T*H, *] views
        // 1. load this step's inputs
        for (int i = tid; i < K_DIM; i += NT) {
            b_q[i] = q[row * K_DIM + i];
            b_k[i] = k[row * K_DIM + i];
            b_g[i] = g[row * K_DIM + i];
        }
        for (int j = tid; j < V_DIM; j += NT) b_v[j] = v[row * V_DIM + j];
        __syncthreads();
        // 2. S = diag(g_t) S + k_t v_t^T
        for (int e = tid; e < K_DIM * V_DIM; e += NT) {
            const int i = e / V_DIM, j = e % V_DIM;
            S[e] = b_g[i] * S[e] + b_k[i] * b_v[j];
        }
        __syncthreads();
        // 3. o_t = scale * S^T q_t
        for (int j = tid; j < V_DIM; j += NT) {
            float acc = 0.f;
            for (int i = 0; i < K_DIM; ++i) acc += b_q[i] * S[i * V_DIM + j];
            o[row * V_DIM + j] = scale * acc;
        }
        __syncthreads();
    }
}
