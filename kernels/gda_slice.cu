// gda_slice: the terms a slice of a sequence gets from a state carried across its edge: the
// corrections of cupy_gda/distributed.py on the tensor cores. For one row b and head h, in scan
// order (step j is token t = j forward, t = T-1-j reversed), over the first n steps (n =
// count[b], or T without count), with P_j the gates' running product in scan order:
//
//   forward:  P_j = a_0 ... a_j                 (G_t: the slice's start to t, inclusive)
//   reversed: P_j = a_{T-1} ... a_{t+1}         (R_t: after t to the slice's end, exclusive)
//
//   gda_slice_out:  y_t[v] += scale sum_k x_t[k] P_t[k] St[k, v]          (o, and dv)
//   gda_slice_in:   X_t[k] = sum_v St[k, v] y_t[v]
//                   out_t[k] += scale P_t[k] X_t[k],  z_t[k] = scale w_t[k] X_t[k]   (dq, dk)
//                   and P_t[k] itself into pr where given (the backward's gate terms)
//
// (z_t and P_t = 0 at steps j >= n, which feed a scan; nothing else is written there.) q-like arrays
// [B, T, H, K], v-like [B, T, H, V], St [B, H, K, V], all float32 and contiguous. Products of
// any length keep their range as m 2^e (common.cuh gda_scaled_mul; e a float), and the running
// products the corrections multiply by start from sigma[b, h, k] = 2^E0, the size of St's row
// (the launcher divides St's row by it, exactly): sigma P_t is then the size of the part of the
// loop's state that St carries, in range wherever the loop's state is, though P_t alone may
// pass 2^128 or 2^-149 (cupy_gda/slices.py anchor). The workspace ws is [3][B, NSEG, H, K]:
//   gda_slice_prods: block (b, s, h): each lane k's product over segment s as m 2^e -> ws[0], ws[1]
//   gda_slice_enter: thread (b, h, k): walks the segments. Without x: tot [2][B, H, K] <- the
//                    product over all n steps (m, then e). With x (E0 [B, H, K], as floats; -1000
//                    for a row of zeros, so sigma = 0): ws[2] <- sigma times the product entering
//                    each segment, a float
// then gda_slice_out (block (b, h, s, value tile)) and gda_slice_in (block (b, h, s, key tile))
// walk their segment in sub-tiles of BT steps from ws[2]: the tile's inputs staged in shared
// memory, the running products by BT threads (one a lane, in scan order), then the product on
// the tensor cores, each operand split hi + lo (mma.cuh: fp32 accuracy, no plain TF32), 4 warps
// of 16 steps each. (P_t above is sigma P_t there: pr gets it so.)
//
// No shape defines: K, V, T, H are run-time (tiles of 64 cover any). Needs IO_DTYPE = G_DTYPE
// = 0 for common.cuh and mma.cuh (the tensor cores' TF32 path). Launcher: cupy_gda/slices.py;
// reference: the einsums of cupy_gda/distributed.py (its NumPy path).
#define BT 64                      // steps a sub-tile, a tile's lanes (keys or values)
#define TS 256                     // steps a segment
#define NT 128                     // threads: 4 warps of 16 steps
#define LD 68                      // row stride of the [BT][.] tiles (bank-conflict-free frags)
#define LDS 72                     // and of St's [keys][values] tile in gda_slice_out
static_assert(TS % BT == 0 && NT == 2 * BT, "a segment of whole sub-tiles; two threads a lane");

// every entry's parameters (_launch.SLICE)
#define GDA_SLICE_PARAMS                                                                        \
    const float* __restrict__ x, const float* __restrict__ a, const float* __restrict__ st,    \
    float* __restrict__ y, const float* __restrict__ w, float* __restrict__ z,                  \
    float* __restrict__ out, float* __restrict__ pr, float* __restrict__ ws,                    \
    float* __restrict__ tot, const long long* __restrict__ count, long long T, int B, int H, int K, int V, int NSEG,     \
    int reverse, float scale

// token of step j
__device__ __forceinline__ long long gda_slice_token(long long j, long long T, int reverse) {
    return reverse ? T - 1 - j : j;
}

// steps of row b in the terms
__device__ __forceinline__ long long gda_slice_steps(const long long* count, long long b,
                                                     long long T) {
    return count ? min(max(count[b], 0LL), T) : T;
}

extern "C" __global__ void __launch_bounds__(NT)
gda_slice_prods(GDA_SLICE_PARAMS) {
    const long long h = blockIdx.x % H, s = (blockIdx.x / H) % NSEG, b = blockIdx.x / H / NSEG;
    const long long n = gda_slice_steps(count, b, T), j0 = s * TS, j1 = min(j0 + TS, n);
    const long long plane = (long long)B * NSEG * H * K;
    for (int k = threadIdx.x; k < K; k += NT) {
        float m = 1.f, e = 0.f;
        for (long long j = j0; j < j1; ++j)
            gda_scaled_mul(m, e, a[((b * T + gda_slice_token(j, T, reverse)) * H + h) * K + k]);
        ws[((b * NSEG + s) * H + h) * K + k] = m;
        ws[plane + ((b * NSEG + s) * H + h) * K + k] = e;
    }
}

extern "C" __global__ void __launch_bounds__(NT)
gda_slice_enter(GDA_SLICE_PARAMS) {
    const long long lane = (long long)blockIdx.x * NT + threadIdx.x;   // (b * H + h) * K + k
    const long long HK = (long long)H * K, b = lane / HK, hk = lane % HK;
    if (b >= B) return;
    const long long plane = (long long)B * NSEG * HK;
    float m = 1.f, e = x ? x[lane] : 0.f;
    const bool zero = x && e < -999.f;                      // St's row is 0: sigma = 0
    for (int s = 0; s < NSEG; ++s) {
        const long long at = (b * NSEG + s) * HK + hk;
        if (x) ws[2 * plane + at] = zero ? 0.f : gda_pow2_mul(m, e);
        gda_scaled_mul(m, e, ws[at]);
        e += ws[plane + at];
    }
    if (!x) {
        tot[lane] = m;
        tot[B * HK + lane] = e;
    }
}

// ---- the sub-tiles' stages (gda_slice_out, gda_slice_in)

// 1. tile [BT][ld] <- BT rows by columns c0 .. c0 + BT - 1 of a row-major array of C columns:
// row r at src + at(r) (a negative at: a row of zeros), 0 past column C; by cp.async (16 bytes
// at a time where C % 4 == 0, else 4), no registers held: the caller waits (gda_slice_landed)
template <typename At>
__device__ __forceinline__ void gda_slice_rows(float* tile, int ld, const float* __restrict__ src,
                                               At at, int C, int c0) {
    if (C % 4 == 0) {
        #pragma unroll 4
        for (int u = threadIdx.x; u < BT * BT / 4; u += NT) {
            const int r = u / (BT / 4), c = 4 * (u % (BT / 4));
            const long long o = at(r);
            const bool ok = o >= 0 && c0 + c < C;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                         :: "r"(gda_shared_at(tile + r * ld + c)), "l"(ok ? src + o + c0 + c : src),
                            "r"(ok ? 16 : 0) : "memory");
        }
    } else {
        #pragma unroll 4
        for (int u = threadIdx.x; u < BT * BT; u += NT) {
            const int r = u / BT, c = u % BT;
            const long long o = at(r);
            const bool ok = o >= 0 && c0 + c < C;
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                         :: "r"(gda_shared_at(tile + r * ld + c)), "l"(ok ? src + o + c0 + c : src),
                            "r"(ok ? 4 : 0) : "memory");
        }
    }
}

// the thread's copies landed (a barrier then makes them the block's)
__device__ __forceinline__ void gda_slice_landed() {
    gda_cp_commit();
    gda_cp_wait<0>();
}

// 1a. the steps j0 .. j0 + BT - 1 of row b, head h of a [B, T, H, C] array (0 past step n)
__device__ __forceinline__ void gda_slice_stage(float* tile, const float* __restrict__ src,
                                                long long b, long long h, long long T, int H,
                                                int C, long long j0, long long n, int c0,
                                                int reverse) {
    gda_slice_rows(tile, LD, src, [&](int r) {
        const long long j = j0 + r;
        return j < n ? ((b * T + gda_slice_token(j, T, reverse)) * H + h) * C : -1LL;
    }, C, c0);
}

// 1b. St's keys r0 .. r0 + BT - 1 (St [K][V] of row b, head h: bh = b H + h; 0 past K)
__device__ __forceinline__ void gda_slice_state(float* tile, int ld, const float* __restrict__ st,
                                                long long bh, int K, int V, int r0, int c0) {
    gda_slice_rows(tile, ld, st, [&](int r) {
        return r0 + r < K ? (bh * K + r0 + r) * V : -1LL;
    }, V, c0);
}

// 4. the tile's rows out to a row-major array of C columns (row r at dst + at(r), skipped where
// at(r) < 0; columns c0 ..  below C), every load of the thread before its first store:
//   GDA_ADD:    dst += tile
//   GDA_SCALED: dst = scale w . tile where on(r), else 0 (w at the same offsets as dst)
//   GDA_COPY:   dst = tile where on(r), else 0
enum { GDA_ADD, GDA_SCALED, GDA_COPY };
template <int MODE, typename At, typename On>
__device__ __forceinline__ void gda_slice_put(const float* tile, float* __restrict__ dst,
                                              const float* __restrict__ w, At at, On on, int C,
                                              int c0, float scale) {
    constexpr int PER = BT * BT / NT;                   // elements a thread: 8 packs of 4
    float e[PER];
    if (MODE != GDA_COPY) {
        #pragma unroll
        for (int i = 0; i < PER / 4; ++i) {
            const int u = threadIdx.x + i * NT, r = u / (BT / 4), c = 4 * (u % (BT / 4));
            const long long o = at(r);
            #pragma unroll
            for (int q = 0; q < 4; ++q) {
                const bool ok = o >= 0 && c0 + c + q < C && (MODE == GDA_ADD || on(r));
                e[4 * i + q] = ok ? (MODE == GDA_ADD ? dst : w)[o + c0 + c + q] : 0.f;
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < PER / 4; ++i) {
        const int u = threadIdx.x + i * NT, r = u / (BT / 4), c = 4 * (u % (BT / 4));
        const long long o = at(r);
        #pragma unroll
        for (int q = 0; q < 4; ++q)
            if (o >= 0 && c0 + c + q < C) {
                float v;
                if (MODE == GDA_ADD) v = e[4 * i + q] + tile[r * LD + c + q];
                else if (MODE == GDA_SCALED) v = on(r) ? scale * e[4 * i + q] * tile[r * LD + c + q] : 0.f;
                else v = on(r) ? tile[r * LD + c + q] : 0.f;
                dst[o + c0 + c + q] = v;
            }
    }
}

// d (the warp's 16 steps by 8 columns of each of the 8 tiles) * f(row, column) into tile
template <typename F>
__device__ __forceinline__ void gda_slice_park(float* tile, const float (*d)[4], F f) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    #pragma unroll
    for (int nt = 0; nt < 8; ++nt)
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = 16 * warp + g + 8 * (i / 2), c = 8 * nt + 2 * tq + i % 2;
            tile[r * LD + c] = d[nt][i] * f(r, c);
        }
}

// 2. the running products of lane tid (< BT) over the sub-tile's steps, from and back into p:
// the gate tile g's column becomes P (0 at steps past n), and the column of x (where given)
// is multiplied by it
__device__ __forceinline__ float gda_slice_products(float* g, float* x, float p, long long j0,
                                                    long long n, int reverse) {
    const int l = threadIdx.x;
    #pragma unroll 8
    for (int r = 0; r < BT; ++r) {
        float at = g[r * LD + l], pj = 0.f;
        if (j0 + r < n) {
            if (reverse) { pj = p; p *= at; }
            else { p *= at; pj = p; }
        }
        g[r * LD + l] = pj;
        if (x) x[r * LD + l] = j0 + r < n ? x[r * LD + l] * pj : 0.f;
    }
    return p;
}

// 3. d[nt] (steps 16 warp .. +15 by columns 8 nt .. 8 nt + 7) += A B over BT columns of A
// (A: tile ``at`` [BT][LD], rows the steps), B's element (kk, nn) at b[kk * ldk + nn * ldn]
template <int NN>
__device__ __forceinline__ void gda_slice_mma(float (*d)[4], const float* at, const float* b,
                                              int ldk, int ldn) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    #pragma unroll 1                               // (unrolled: spills on sm_80 and sm_90)
    for (int k0 = 0; k0 < BT; k0 += KSTEP) {
        unsigned ah[4], al[4];
        gda_frag_a([&](int r, int c) { return at[(16 * warp + r) * LD + k0 + c]; }, lane, ah, al);
        #pragma unroll
        for (int n0 = 0; n0 < NN; n0 += GDA_MMA_GROUP) {
            unsigned bh[GDA_MMA_GROUP][2], bl[GDA_MMA_GROUP][2];
            #pragma unroll
            for (int j = 0; j < GDA_MMA_GROUP; ++j) {
                const float* p = b + (k0 * ldk) + 8 * (n0 + j) * ldn;
                gda_frag_b([&](int kk, int nn) { return p[kk * ldk + nn * ldn]; }, lane, bh[j], bl[j]);
            }
            gda_mma3<GDA_MMA_GROUP>(d + n0, ah, al, bh, bl);
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, 3)
gda_slice_out(GDA_SLICE_PARAMS) {
    extern __shared__ float smem[];
    const int NVT = (V + BT - 1) / BT, NKC = (K + BT - 1) / BT;
    const bool resident = NKC <= 4;                     // St's key chunks staged once (K <= 256)
    const long long vt = blockIdx.x % NVT, s = (blockIdx.x / NVT) % NSEG;
    const long long h = (blockIdx.x / NVT / NSEG) % H, b = blockIdx.x / NVT / NSEG / H;
    const long long n = gda_slice_steps(count, b, T), j0 = s * TS;
    if (j0 >= n) return;
    float* xs = smem;                                   // [BT][LD]: x, then x . P
    float* gs = xs + BT * LD;                           // [BT][LD]: the gates, then P
    float* ps = gs + BT * LD;                           // [NKC * BT]: each lane's product
    float* ss = ps + NKC * BT;                          // [NKC or 1][BT][LDS]: St's chunks
    for (int k = threadIdx.x; k < NKC * BT; k += NT)
        ps[k] = k < K ? ws[2LL * B * NSEG * H * K + ((b * NSEG + s) * H + h) * K + k] : 0.f;
    if (resident)
        for (int c = 0; c < NKC; ++c)
            gda_slice_state(ss + c * BT * LDS, LDS, st, b * H + h, K, V, c * BT, vt * BT);
    for (long long js = j0; js < min(j0 + TS, n); js += BT) {
        float d[8][4] = {};
        for (int c = 0; c < NKC; ++c) {
            __syncthreads();                            // the tiles' last readers are done
            gda_slice_stage(xs, x, b, h, T, H, K, js, n, c * BT, reverse);
            gda_slice_stage(gs, a, b, h, T, H, K, js, n, c * BT, reverse);
            if (!resident)
                gda_slice_state(ss, LDS, st, b * H + h, K, V, c * BT, vt * BT);
            gda_slice_landed();
            __syncthreads();
            if (threadIdx.x < BT)
                ps[c * BT + threadIdx.x] = gda_slice_products(gs, xs, ps[c * BT + threadIdx.x], js, n, reverse);
            __syncthreads();
            gda_slice_mma<8>(d, xs, ss + (resident ? c * BT * LDS : 0), LDS, 1);
        }
        // 4. y += scale d at the steps before n (parked in xs, then whole rows)
        __syncthreads();
        gda_slice_park(xs, d, [&](int, int) { return scale; });
        __syncthreads();
        const long long jl = js;
        gda_slice_put<GDA_ADD>(xs, y, nullptr, [&](int r) {
            const long long j = jl + r;
            return j < n ? ((b * T + gda_slice_token(j, T, reverse)) * H + h) * V : -1LL;
        }, [](int) { return true; }, V, vt * BT, 1.f);
    }
}

extern "C" __global__ void __launch_bounds__(NT, 3)
gda_slice_in(GDA_SLICE_PARAMS) {
    extern __shared__ float smem[];
    const int NKT = (K + BT - 1) / BT, NVC = (V + BT - 1) / BT;
    const bool resident = NVC <= 4;                     // St's value chunks staged once (V <= 256)
    const long long kt = blockIdx.x % NKT, s = (blockIdx.x / NKT) % NSEG;
    const long long h = (blockIdx.x / NKT / NSEG) % H, b = blockIdx.x / NKT / NSEG / H;
    const long long n = gda_slice_steps(count, b, T), j0 = s * TS;
    float* gs = smem;                                   // [BT][LD]: the gates, then P
    float* ys = gs + BT * LD;                           // [BT][LD]: y's value chunk
    float* ps = ys + BT * LD;                           // [BT]: each lane's product
    float* ss = ps + BT;                                // [NVC or 1][BT][LD]: St's chunks,
                                                        //   keys by values
    if (threadIdx.x < BT) {
        const long long k = kt * BT + threadIdx.x;
        ps[threadIdx.x] = j0 < n && k < K ? ws[2LL * B * NSEG * H * K + ((b * NSEG + s) * H + h) * K + k] : 0.f;
    }
    if (resident && j0 < n)
        for (int c = 0; c < NVC; ++c)
            gda_slice_state(ss + c * BT * LD, LD, st, b * H + h, K, V, kt * BT, c * BT);
    for (long long js = j0; js < min(j0 + TS, T); js += BT) {
        float d[8][4] = {};
        if (js < n) {
            __syncthreads();
            gda_slice_stage(gs, a, b, h, T, H, K, js, n, kt * BT, reverse);
            gda_slice_landed();
            __syncthreads();
            if (threadIdx.x < BT)
                ps[threadIdx.x] = gda_slice_products(gs, nullptr, ps[threadIdx.x], js, n, reverse);
            for (int c = 0; c < NVC; ++c) {
                __syncthreads();
                gda_slice_stage(ys, y, b, h, T, H, V, js, n, c * BT, reverse);
                if (!resident)
                    gda_slice_state(ss, LD, st, b * H + h, K, V, kt * BT, c * BT);
                gda_slice_landed();
                __syncthreads();
                // B (kk: value, nn: key) = St[key][value]
                gda_slice_mma<8>(d, ys, ss + (resident ? c * BT * LD : 0), 1, LD);
            }
        }
        // 4. out += scale P X and z = scale w X at the steps before n; z = 0 after (scale P X
        // parked in gs, X in ys, then whole rows); P itself into pr where given (0 after n)
        const long long jl = js;
        auto row = [&](long long j) { return ((b * T + gda_slice_token(j, T, reverse)) * H + h) * K; };
        auto upto_T = [&](int r) { return jl + r < T ? row(jl + r) : -1LL; };
        auto before_n = [&](int r) { return jl + r < n; };
        if (js < n) {
            __syncthreads();
            if (pr) {
                gda_slice_put<GDA_COPY>(gs, pr, nullptr, upto_T, before_n, K, kt * BT, 1.f);
                __syncthreads();                        // read before parked over
            }
            gda_slice_park(gs, d, [&](int r, int c) { return scale * gs[r * LD + c]; });
            gda_slice_park(ys, d, [](int, int) { return 1.f; });
            __syncthreads();
        } else if (pr) {
            gda_slice_put<GDA_COPY>(gs, pr, nullptr, upto_T, before_n, K, kt * BT, 1.f);
        }
        gda_slice_put<GDA_ADD>(gs, out, nullptr, [&](int r) { return before_n(r) ? row(jl + r) : -1LL; },
                               [](int) { return true; }, K, kt * BT, 1.f);
        gda_slice_put<GDA_SCALED>(ys, z, w, upto_T, before_n, K, kt * BT, scale);
    }
}
