// gda_chunk_bwd: gated linear attention, backward, in chunks of BT steps (launcher
// cupy_gda/chunk_bwd.py).
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
// give the loop's gradients. The pipeline, one kernel a stage, on float32 rows [NB][BT][*]:
//   1. gda_chunk_bwd_pack:   per chunk, q A, k D, A_end and v, do as float32 rows (rows past the
//                            sequence: gate 1, q = k = v = do = 0, which changes nothing); the
//                            guard (below) on the inputs; with PLANES instead scale q A, k D,
//                            v, do as bfloat16 planes, the GEMMs' operands split once.
//   2. gda_chunk_bwd_local:  the local states (k D)^T v and scale (q A)^T do (GEMMs).
//   3. gda_chunk_bwd_states: per (sequence-head, key row), chunk by chunk: the local states
//                            become S0 (forward) and E (backward) in place, and rowsum(E (.) S0);
//                            d_initial_state; the guard on S0 and E.
//   2-3. gda_chunk_bwd_scan: (SCAN) the two as one, a block a tile of the state: the local states
//                            stay in registers (PLANES: its operands, pack's planes, by cp.async).
//   4. gda_chunk_bwd_rows:   M, scale do S0^T, v E^T (GEMMs; PLANES: v, do from the planes).
//   5. gda_chunk_bwd_scores: W of each chunk: its 16-step blocks before the diagonal on the
//                            tensor cores (keys anchored at each block), the diagonal blocks
//                            on the CUDA cores; with QK_BY_SCORES pack's planes of q A and k D
//                            too (then launched right after pack, before their readers).
//   6. gda_chunk_bwd_intra:  dq, dk, dg of each chunk, a thread per key column, the steps in
//                            reverse (X_t in registers, the chunk's k and g in shared memory).
//   7. gda_chunk_bwd_dv:     dv = (k D) E + scale W do (GEMMs; PLANES: k D, do from the planes),
//                            into [B, T, H, V].
//   8. gda_chunk_bwd_scan_o: (FWD, two terms) the scan's forward half and o as one kernel, the
//                            state on chip: in place of 2-3 and 7 in a forward that keeps nothing;
//                            (SCAN_O_WG, three terms) by wgmma, each chunk's S0 stored: with o in
//                            the forward that keeps its stages, without o in place of the
//                            scan's forward half in a backward with SCAN_DV.
//   9. gda_chunk_bwd_scan_dv: (SCAN_DV) the scan's backward half and dv as one kernel, E on chip
//                            for dv (and stored for rows): in place of the scan's backward half
//                            and 7, after 5.
// The GEMMs run on the tensor cores with split operands, exact to float32 (never plain TF32).
// The guard: the chunked form's products are bounded while |q|, |k|, |v|, |do| <= 2^20, |g| <=
//   2^(1/8) (a chunk's gate products within 2^8) and |S0|, |E| <= 2^40 (no sum above 2^120:
//   docs/perf-notes.md, v19). Outside it (NaN, inf, large gates or values) the kernels set
//   *flag, and the launcher's next launch, the reverse loop (gda_recurrent_bwd), runs only then
//   and overwrites every gradient: the loop's result, without a host sync.
//
// Layout: chunk b = nh * NC + j of NH sequence-heads: without cu_seqlens nh = n * H + h, j the
//   chunk c of sequence n (NC = chunks of T steps); with them nh = h and j runs over every
//   sequence's chunks in order (NC = their most, T / BT + N; gda_chunk_at). Its rows [b][BT][*]
//   in the float32 workspaces (each 16-byte aligned: the GEMMs load 4 floats at once).
// Required defines: K_DIM, V_DIM, IO_DTYPE, G_DTYPE, LOG_GATE, SEQ_INT64, BT (steps a chunk,
//   16..64, a multiple of 16), KT (key columns a block of gda_chunk_bwd_intra, a multiple of 32),
//   SCAN (1: stages 2 and 3 as one kernel, gda_chunk_bwd_scan, whose rowsum comes in one part a
//   tile of GN value columns; 0: local, then states), PLANES (1, with SCAN and bfloat16 inputs:
//   the GEMMs' operands split once by pack into planes, the scan's copied through a ring, 3
//   blocks an SM), SMEM_BYTES (the ring's dynamic shared memory, cupy_gda/chunk_bwd.py smem: 0
//   without PLANES), FWD (1: the forward from these stages, chunk_bwd.ForwardPlan: pack without
//   do, the scan's forward half storing the final state in dh0's place, scores, and dv's entry
//   computing o = (scale q A)^T S0 + scale W^T v into dv's place; needs PLANES), KEEP (1: the
//   backward from a ForwardPlan's kept stages, chunk_bwd.BackwardPlan.run(kept=): st, ae, ww
//   and the planes of q A, k D, v are the forward's, so pack writes do's plane alone and the
//   scan runs its backward half alone; scores is not launched; needs PLANES, not FWD), WGMMA
//   (1, built for sm_90a, BT = 64: dv's entry by wgmma, its operands in shared memory), TERMS
//   (the bfloat16 terms a float32 operand is split into: 3, exact to float32, or 2, the forward
//   (FWD) that keeps nothing for a backward, as gda_chunk_fwd's bfloat16 path: docs/perf-notes.md
//   v12 and v34), DV_TERMS (those of W, made by scores, and of dv's entry, the only stage that
//   reads it: TERMS, or 2 for half inputs, where dv's rounding is its error, v36, and o's in a
//   forward that keeps three for the backward, so that the W it keeps is the backward's own,
//   v37), ROWS_TERMS (those of S0 and E in rows' sd and ev: TERMS, or 2 in the backward of
//   half inputs, with fresh sums: v36), SCAN_O_WG (1, built for sm_90a: scan_o's products by
//   wgmma, v39; with three terms it stores each chunk's S0, and in a backward, with SCAN_DV,
//   it makes them alone, no o, in place of the scan: v41), SCAN_O_MC (1, with SCAN_O_WG in the
//   forward that keeps nothing: scan_o's blocks of a sequence-head, one a tile of FV value
//   columns, run as a cluster that shares each chunk's planes of q A and k D, each block copying
//   its part into every block's shared memory, one bulk copy multicast to the cluster, from
//   planes pack writes as they lie there: v42), VROWS (1, a forward that keeps nothing and
//   runs scan_o, V a multiple of 8: scan_o copies v's rows from v itself and checks them for
//   the guard, and pack writes no plane of v: v43; the build holds no scan and dv entry),
//   SCAN_O_PRODUCER (0, or 2 or 4 in a forward that keeps nothing, scan_o's mma.sync form
//   run on sm_90 on: that many warps more copy scan_o's operands: v49; with SCAN_O_WG and
//   VROWS scores then stores W as scan_o's wgmma form reads it, W_SPLIT below: v58),
//   SCAN_DV (1, built for sm_90a, a
//   backward with PLANES: the scan's backward half and dv's entry as one kernel by wgmma,
//   gda_chunk_bwd_scan_dv; the scan runs its forward half alone, and none where KEEP),
//   QK_BY_SCORES (1: scores writes pack's planes of scale q A and k D, TERMS of each, and A_end,
//   and checks q, k and g for the guard; pack, where launched, does v's and do's planes alone:
//   with VROWS, in a backward with SCAN_DV that keeps nothing, and in a forward that keeps its
//   stages by scan_o's wgmma form; scores runs before whatever reads the planes: v75), PANELS
//   (1, with QK_BY_SCORES in the forward that keeps its stages by scan_o's wgmma form and the
//   backward by scan_dv with scan_o's S0, and in the backward from the former's kept stages:
//   the planes of q A and k D in 64-key panels, PLANES_PANELS below, read by scan_o's wgmma form
//   and scan_dv alone: v75), ENTRIES
//   (the entries the build holds, bit i for entry i + 1 above: those its plans launch,
//   chunk_bwd.entries; the others are left out, so a launch of one fails when its plan is made).
//   Reference: cupy_gda.reference.gated_attention_backward_ref.
#if !defined(K_DIM) || !defined(V_DIM) || !defined(LOG_GATE) || !defined(SEQ_INT64) \
    || !defined(BT) || !defined(KT) || !defined(SCAN) || !defined(PLANES) || !defined(SMEM_BYTES) \
    || !defined(FWD) || !defined(KEEP) || !defined(WGMMA) || !defined(TERMS) || !defined(DV_TERMS) \
    || !defined(ROWS_TERMS) || !defined(SCAN_O_WG) || !defined(SCAN_O_MC) || !defined(SCAN_DV) \
    || !defined(VROWS) || !defined(QK_BY_SCORES) || !defined(PANELS) || !defined(ENTRIES)
#error "K_DIM, V_DIM, LOG_GATE, SEQ_INT64, BT, KT, SCAN, PLANES, SMEM_BYTES, FWD, KEEP, WGMMA, TERMS, DV_TERMS, ROWS_TERMS, SCAN_O_WG, SCAN_O_MC, SCAN_DV, VROWS, QK_BY_SCORES, PANELS and ENTRIES are required"
#endif
static_assert(BT % 16 == 0 && BT >= 16 && BT <= 64, "BT: 16..64, a multiple of 16");
static_assert(!PLANES || (SCAN && IO_DTYPE == 2), "PLANES: the fused scan's, bfloat16 inputs");
static_assert(!FWD || PLANES, "FWD: the forward from the planes");
static_assert(!KEEP || (PLANES && !FWD), "KEEP: the backward from the forward's planes");
static_assert(KT % 32 == 0 && KT <= 256, "KT: a multiple of 32, at most 256");
static_assert(TERMS == 3 || (TERMS == 2 && FWD && !WGMMA), "TERMS: 3, or 2 in the forward");
static_assert(DV_TERMS == TERMS || (DV_TERMS == 2 && IO_DTYPE != 0 && !WGMMA),
              "DV_TERMS: TERMS, or 2 for half inputs");
static_assert(ROWS_TERMS == TERMS || (ROWS_TERMS == 2 && IO_DTYPE != 0 && !FWD),
              "ROWS_TERMS: TERMS, or 2 where v and do are of a half dtype");
static_assert(!SCAN_O_WG || (PLANES && BT == 64 && !WGMMA && (FWD ? DV_TERMS == 2 : SCAN_DV && !KEEP)),
              "SCAN_O_WG: scan_o by wgmma, chunks of 64 steps, in a forward (W in two terms) or "
              "a backward from the planes with scan_dv");
static_assert(!SCAN_DV || (PLANES && !FWD && !WGMMA && BT == 64 && DV_TERMS == 2),
              "SCAN_DV: scan_dv, in a backward from the planes, chunks of 64 steps, dv in two terms");

#define GDA_HAS(i) ((ENTRIES >> (i)) & 1)     // entry i (1. pack .. 9. scan_dv, from 0) in the build
// (SCAN_O_MC: pack's planes of q A and k D lie as scan_o's shared memory holds them, which the
// scan and dv's entry would not read right, so the build holds neither)
static_assert(!SCAN_O_MC || (SCAN_O_WG && FWD && TERMS == 2 && !GDA_HAS(3) && !GDA_HAS(7)),
              "SCAN_O_MC: scan_o's wgmma form in a forward that keeps nothing, without the scan "
              "and dv's entry");
// (VROWS: pack writes no plane of v, which the scan and dv's entry read)
static_assert(!VROWS || (FWD && TERMS == 2 && V_DIM % 8 == 0 && !GDA_HAS(3) && !GDA_HAS(7)),
              "VROWS: scan_o in a forward that keeps nothing, V a multiple of 8, without the scan "
              "and dv's entry");
// (QK_BY_SCORES: pack's planes of q A and k D by scores, where scores runs before their readers
// and, in a backward, where it runs at all)
static_assert(VROWS ? QK_BY_SCORES
                    : !QK_BY_SCORES || (PLANES && GDA_HAS(5)
                                        && (FWD ? SCAN_O_WG && TERMS == 3 : SCAN_DV && !KEEP)),
              "QK_BY_SCORES: with VROWS, in a backward with scan_dv that keeps nothing, or in a "
              "forward that keeps its stages by scan_o's wgmma form");

#ifndef SCAN_O_PRODUCER
#define SCAN_O_PRODUCER 0
#endif
// (W_SPLIT: W's only reader is scan_o's wgmma form fed by its producer warpgroup, in a forward
// that keeps nothing: scores stores W as scale W's h, m planes in wgmma's B layout, as scan_o's
// shared memory holds them, and the producer copies them there as they lie, so that W is split
// once a chunk, not once a value tile, and not on the products' warps: v58)
#define W_SPLIT (VROWS && SCAN_O_WG && SCAN_O_PRODUCER && !SCAN_O_MC)
// (PLANES_PANELS, the same builds: scan_o's wgmma form fed by its producer, scores writing the
// planes; and PANELS' builds, v75) scores stores the planes of q A and k D as scan_o's (and
// scan_dv's) shared memory holds them, in
// FO_SW's 128-byte swizzle (gda_plane_at), so that each 64-key panel of a plane is BT rows of
// 128 bytes, contiguous, and the producer copies a chunk's planes as 2 KP / 64 bulk copies by
// one thread, not 16-byte cp.async by its 128 (v65: v50's bulk copies took 7 % off scan_o, but
// its rows of KP + 8 halves doubled scores' time; these rows are 128 bytes, as scores' stores
// already touch them. Measured: scores 3-5 % faster, scan_o the same, L2's rate into the SMs
// being its limit. v75: scores' time doubled by three terms of each plane in rows of KP
// halves, +0.29 ms at GLA-1.3B; where scan_o's wgmma form and scan_dv alone read them, PANELS,
// they copy them as they lie by 16-byte cp.async, gda_wg_copy_planes)
#define PLANES_PANELS (W_SPLIT || PANELS)
static_assert(!PANELS || (QK_BY_SCORES && !VROWS && SCAN_O_WG && TERMS == 3) || (KEEP && SCAN_DV),
              "PANELS: scores writes the planes (three terms) for scan_o's wgmma form, or a "
              "backward from its kept stages reads them by scan_dv");
// (W_SPLIT_DV: a backward from the planes with scan_dv, W's only reader there, in place of dv's
// entry; the one from a ForwardPlan's kept stages reads the forward's W, whose scan_o reads it
// whole) scores stores W as scan_dv's products read it, scale W's h, m planes in wgmma's B
// layout (element (t, u) = scale W[t][u]), and scan_dv's producer copies them as they lie, so
// that W is split once a chunk, not once a value tile, and not on the products' warps (v70:
// v58's step for scan_o)
#define W_SPLIT_DV (SCAN_DV && !KEEP)

#define GDA_BWD_VAL_MAX 0x1p20f         // the guard: |q|, |k|, |v|, |do| at most this,
#define GDA_BWD_GATE_MAX 1.09050773f    //   |g| at most 2^(1/8),
#define GDA_BWD_STATE_MAX 0x1p40f       //   |S0|, |E| at most this
#define NTP 128                         // threads of pack and states
#define NTS 128                         // threads of scores

// The GEMMs' operands with PLANES (bfloat16 inputs), split once, by pack, in place of qa, kd,
// vp, dp: q A scale and k D as TERMS bfloat16 planes (h, m, l: gda_split3), v and do as one
// (exact), each plane of chunk b [BT][KP or VP] at rows (b * planes + e) BT (the columns
// rounded up to whole tiles of the scan, 0 past K or V), in pl: q A scale, k D, v, do in turn.
#define PT 64                                   // the scan's tile (GM = GN, asserted below)
#define KP ((K_DIM + PT - 1) / PT * PT)         // columns of a plane of q A, k D
#define VP ((V_DIM + PT - 1) / PT * PT)         //   and of v, do
#define PA TERMS                                // planes of q A scale and of k D
#define PB 1                                    //   and of v and of do
static_assert(!PLANES_PANELS || (KP % 64 == 0 && !GDA_HAS(3) && !GDA_HAS(7)),
              "PLANES_PANELS: whole panels, read by no scan or dv entry");

#define GDA_CHUNK_BWD_PARAMS                                                                       \
    const io::t* __restrict__ q, const io::t* __restrict__ k, const io::t* __restrict__ v,       \
    const gt::t* __restrict__ g, const io::t* __restrict__ d_o, const float* __restrict__ h0,    \
    const float* __restrict__ dht, float* __restrict__ st, float* __restrict__ et,               \
    float* __restrict__ qa, float* __restrict__ kd, float* __restrict__ vp,                      \
    float* __restrict__ dp, float* __restrict__ ae, float* __restrict__ es,                      \
    float* __restrict__ mm, float* __restrict__ ww, float* __restrict__ sd,                      \
    float* __restrict__ ev, float2* __restrict__ ar, unsigned short* __restrict__ pl,            \
    int* __restrict__ flag,                                                                      \
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

// Sequence n's chunks j0 .. j1 - 1 of its sequence-head's NC (all of them without cu_seqlens)
__device__ __forceinline__ void gda_seq_chunks(const long long* coff, long long n, int NC, int& j0,
                                               int& j1) {
    j0 = coff ? (int)coff[n] : 0;
    j1 = coff ? (int)coff[n + 1] : NC;
}

// (x0, x1) as three bfloat16 pairs (x0 in the low halves) h + m + l, exactly (X: they are
// bfloat16 values, h alone)
template <bool X>
__device__ __forceinline__ void gda_split3(float x0, float x1, unsigned& h, unsigned& m, unsigned& l) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(x1), "f"(x0));
    if (X) return;
    const float r0 = x0 - __uint_as_float(h << 16), r1 = x1 - __uint_as_float(h & 0xffff0000u);
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(m) : "f"(r1), "f"(r0));
    const float s0 = r0 - __uint_as_float(m << 16), s1 = r1 - __uint_as_float(m & 0xffff0000u);
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(l) : "f"(s1), "f"(s0));
}

// Chunk b's planes in pl (PLANES; NB chunks): scale q A, k D (PA each), v, do (PB each)
struct gda_planes_at {
    unsigned short *q, *k, *v, *d;
    __device__ __forceinline__ gda_planes_at(unsigned short* pl, long long NB, long long b)
        : q(pl + b * PA * BT * KP), k(pl + (NB + b) * PA * BT * KP),
          v(pl + 2 * NB * PA * BT * KP + b * PB * BT * VP), d(v + NB * PB * BT * VP) {}
};

// The element (step t, key i) of a chunk's plane of q A (KD false) or of k D at p: [t][KP], or
// with SCAN_O_MC as scan_o's shared memory holds it with SCAN_O_WG (wgmma's core matrices of 8
// rows of 8 bfloat16, 128 contiguous bytes; q A K-major: core (t / 8, i / 8) of 8 t by 8 i; k D
// MN-major: core (i / 8, t / 8), the same), so that scan_o copies a chunk's planes as they lie;
// with PLANES_PANELS as FO_SW holds it: 64-key panel i / 64 of BT rows of 64 halves, row t's
// 8-key pieces at piece ^ t % 8 (gda_wg_copy_planes' order)
template <bool KD>
__device__ __forceinline__ unsigned short* gda_plane_at(unsigned short* p, int t, int i) {
    if (PLANES_PANELS) return p + i / 64 * (BT * 64) + t * 64 + ((i / 8 % 8) ^ (t % 8)) * 8 + i % 8;
    if (!SCAN_O_MC) return p + t * KP + i;
    return p + (KD ? i / 8 * 8 * BT + t / 8 * 64 : t / 8 * 8 * KP + i / 8 * 64) + t % 8 * 8 + i % 8;
}

// x into P planes at p, p + stride, ..: its gda_split3 terms h, m, l (P = 3), h, m (2) or h
// (1: x is a bfloat16 value)
template <int P>
__device__ __forceinline__ void gda_plane_put(unsigned short* p, long long stride, float x) {
    unsigned h, m, l;
    gda_split3<P == 1>(x, 0.f, h, m, l);
    p[0] = (unsigned short)h;
    if (P == 1) return;
    p[stride] = (unsigned short)m;
    if (P == 2) return;
    p[2 * stride] = (unsigned short)l;
}

// CW consecutive elements of a CODE-typed array from element e (a multiple of CW; CW = 1, 2 or
// 4) as floats: one 4-, 8- or 16-byte load
template <int CODE, int CW>
__device__ __forceinline__ void gda_load_cols(const typename gda_type<CODE>::t* p, long long e,
                                              float (&x)[CW]) {
    typedef gda_type<CODE> ty;
    if constexpr (CW == 1) {
        x[0] = ty::load(p[e]);
    } else if constexpr (CODE == 0) {
        gda_float_pack<CW> y;
        y.v = *reinterpret_cast<const typename gda_floats<CW>::t*>(p + e);
        #pragma unroll
        for (int c = 0; c < CW; ++c) x[c] = y.f[c];
    } else {
        unsigned u[CW / 2];
        if constexpr (CW == 2) {
            u[0] = *reinterpret_cast<const unsigned*>(p + e);
        } else {
            const uint2 w = *reinterpret_cast<const uint2*>(p + e);
            u[0] = w.x;
            u[1] = w.y;
        }
        #pragma unroll
        for (int c = 0; c < CW; ++c)
            x[c] = ty::load((unsigned short)(c % 2 ? u[c / 2] >> 16 : u[c / 2] & 0xffffu));
    }
}

// x[0..CW) into P planes at p, p + stride, .. (gda_plane_put's, column by column; CW >= 2: as
// bfloat16 pairs, stores of 4 or 8 bytes; p 2 CW-byte aligned, stride even)
template <int P, int CW>
__device__ __forceinline__ void gda_plane_put_cols(unsigned short* p, long long stride,
                                                   const float (&x)[CW]) {
    if constexpr (CW == 1) {
        gda_plane_put<P>(p, stride, x[0]);
    } else {
        unsigned w[3][CW / 2];                          // [term h, m, l][pair]
        #pragma unroll
        for (int c = 0; c < CW / 2; ++c)
            gda_split3<P == 1>(x[2 * c], x[2 * c + 1], w[0][c], w[1][c], w[2][c]);
        #pragma unroll
        for (int e = 0; e < P; ++e) {
            if constexpr (CW == 2) *reinterpret_cast<unsigned*>(p + e * stride) = w[e][0];
            else *reinterpret_cast<uint2*>(p + e * stride) = make_uint2(w[e][0], w[e][1]);
        }
    }
}

// x[0..CW) into the float32 array at c (4 CW-byte aligned): one store
template <int CW>
__device__ __forceinline__ void gda_store_cols(float* c, const float (&x)[CW]) {
    gda_float_pack<CW> y;
    #pragma unroll
    for (int i = 0; i < CW; ++i) y.f[i] = x[i];
    *reinterpret_cast<typename gda_floats<CW>::t*>(c) = y.v;
}

// Columns a thread of pack takes at a time: key columns (q, k, g) and value columns (v, do),
// with one load and one store an array and step (pairs where the dimension is even)
#ifndef PACK_CW
#define PACK_CW 2
#endif
#define CWK (K_DIM % PACK_CW == 0 ? PACK_CW : K_DIM % 2 == 0 ? 2 : 1)
#define CWV (V_DIM % PACK_CW == 0 ? PACK_CW : V_DIM % 2 == 0 ? 2 : 1)

// 1. Block (chunk b): a thread per CWK key columns (q A forward, k D backward), then per CWV
// value columns (each column's products and splits as one at a time: the same values). A_t and
// D_t by 16-step blocks: A_t = (the products of the whole blocks before t's) P(start of t's
// block..t), D_t = P(t+1..end of t's block) (those of the whole blocks after it, from the last
// down), each block's product in the order scores makes it, so that scores, which writes the
// planes itself where QK_BY_SCORES (gda_scores_planes), writes the same bits.
// (8 blocks an SM, at most 64 registers: with no minimum ptxas still kept to 64 at K = V = 192
// bfloat16 and spilled 16 bytes there; with the bound none of 72 builds of a sweep spills)
#if GDA_HAS(0)
extern "C" __global__ void __launch_bounds__(NTP, 8) gda_chunk_bwd_pack(GDA_CHUNK_BWD_PARAMS)
{
    const long long b = blockIdx.x;
    GDA_CHUNK;
    const gda_planes_at pc(pl, NH * NC, b);            // (PLANES: instead of qa, kd, vp, dp)
    bool ok = true;
    for (int i = threadIdx.x * CWK; i < (KEEP || QK_BY_SCORES ? 0 : PLANES ? KP : K_DIM);
         i += NTP * CWK) {                              // (KEEP: kept; QK_BY_SCORES: scores')
        const bool on = i < K_DIM;                      // (i >= K_DIM: the planes'
        float a[CWK], pre[CWK];                         //  zeros) A_t = pre a: q A, A_end
        #pragma unroll
        for (int c = 0; c < CWK; ++c) a[c] = 1.f, pre[c] = 1.f;
        #pragma unroll 4                                // (8 spilled 44 bytes at K = 32, BT
        for (int t = 0; t < BT; ++t) {                  //  = 32, with A_t as pre a)
            float qv[CWK], gv[CWK];
            if (on && t < ch.rows) {
                const long long e = ch.at(t, K_DIM, i);
                gda_load_cols<IO_DTYPE>(q, e, qv);
                gda_load_cols<G_DTYPE>(g, e, gv);
                #pragma unroll
                for (int c = 0; c < CWK; ++c) {
                    gv[c] = gda_gate_of(gv[c]);
                    ok &= gda_bwd_in(qv[c], GDA_BWD_VAL_MAX) & gda_bwd_in(gv[c], GDA_BWD_GATE_MAX);
                }
            } else {
                #pragma unroll
                for (int c = 0; c < CWK; ++c) qv[c] = 0.f, gv[c] = 1.f;
            }
            float x[CWK];
            #pragma unroll
            for (int c = 0; c < CWK; ++c) {
                a[c] *= gv[c];
                x[c] = qv[c] * (pre[c] * a[c]);
            }
            if (PLANES) {
                #pragma unroll
                for (int c = 0; c < CWK; ++c) x[c] *= scale;
                gda_plane_put_cols<PA>(gda_plane_at<false>(pc.q, t, i), BT * KP, x);
            } else if (on) {
                gda_store_cols(qa + (b * BT + t) * K_DIM + i, x);   // (PLANES: only sd's room)
            }
            if (t % 16 == 15) {                         // (a block's end)
                #pragma unroll
                for (int c = 0; c < CWK; ++c) pre[c] *= a[c], a[c] = 1.f;
            }
        }
        if (on) gda_store_cols(ae + b * K_DIM + i, pre);
        float d[CWK], suf[CWK];                         // D_t = d suf: k D
        #pragma unroll
        for (int c = 0; c < CWK; ++c) d[c] = 1.f, suf[c] = 1.f;
        #pragma unroll 8
        for (int t = BT - 1; t >= 0; --t) {
            float kv[CWK], gv[CWK];
            if (on && t < ch.rows) {
                const long long e = ch.at(t, K_DIM, i);
                gda_load_cols<IO_DTYPE>(k, e, kv);
                gda_load_cols<G_DTYPE>(g, e, gv);
                #pragma unroll
                for (int c = 0; c < CWK; ++c) {
                    gv[c] = gda_gate_of(gv[c]);
                    ok &= gda_bwd_in(kv[c], GDA_BWD_VAL_MAX);
                }
            } else {
                #pragma unroll
                for (int c = 0; c < CWK; ++c) kv[c] = 0.f, gv[c] = 1.f;
            }
            float x[CWK];
            #pragma unroll
            for (int c = 0; c < CWK; ++c) x[c] = kv[c] * (d[c] * suf[c]);
            if (PLANES) gda_plane_put_cols<PA>(gda_plane_at<true>(pc.k, t, i), BT * KP, x);
            else if (on) gda_store_cols(kd + (b * BT + t) * K_DIM + i, x);
            #pragma unroll
            for (int c = 0; c < CWK; ++c) d[c] *= gv[c];
            if (t % 16 == 0) {                          // (a block's start)
                #pragma unroll
                for (int c = 0; c < CWK; ++c) suf[c] *= d[c], d[c] = 1.f;
            }
        }
    }
    for (int j = threadIdx.x * CWV; j < (VROWS ? 0 : PLANES ? VP : V_DIM); j += NTP * CWV) {
        const bool on = j < V_DIM;
        #pragma unroll (PA == 2 ? 4 : PANELS && !KEEP ? 2 : 8)  // (two terms at 8: ptxas
                                                        //  spilled 4 bytes at K = 100, V = 72;
                                                        //  the backward's with PANELS at 4 and
                                                        //  8: 20 and 40 at K = 256, V = 72)
        for (int t = 0; t < BT; ++t) {
            float vv[CWV], dov[CWV];
            #pragma unroll
            for (int c = 0; c < CWV; ++c) vv[c] = 0.f, dov[c] = 0.f;
            if (on && t < ch.rows) {
                const long long e = ch.at(t, V_DIM, j);
                if (!KEEP) gda_load_cols<IO_DTYPE>(v, e, vv);      // (KEEP: v's plane kept)
                if (!FWD) gda_load_cols<IO_DTYPE>(d_o, e, dov);    // (FWD: no do)
                #pragma unroll
                for (int c = 0; c < CWV; ++c)
                    ok &= gda_bwd_in(vv[c], GDA_BWD_VAL_MAX) & gda_bwd_in(dov[c], GDA_BWD_VAL_MAX);
            }
            if (PLANES) {
                if (!KEEP) gda_plane_put_cols<PB>(pc.v + t * VP + j, BT * VP, vv);
                if (!FWD) gda_plane_put_cols<PB>(pc.d + t * VP + j, BT * VP, dov);
            } else if (on) {
                gda_store_cols(vp + (b * BT + t) * V_DIM + j, vv);
                gda_store_cols(dp + (b * BT + t) * V_DIM + j, dov);
            }
        }
    }
    if (!ok) *flag = 1;
}
#endif

// ---- The GEMMs (stages 2, 4, 7): C[b] = op(A[b]) op(B[b]) of each chunk b, summed over one or
// two terms, exact to float32 on the tensor cores (never plain TF32):
// - an operand x is split into three bfloat16 terms h + m + l that equal it exactly (x - h has
//   at most 16 significant bits, x - h - m at most 8), once an element, as it is staged in
//   shared memory;
// - a product is summed as the six terms down to 2^-16 of it (l h, m m, m h, h l, h m, h h);
//   the three left out (m l, l m, l l) are below 2^-23 of it (two terms, NT = 2: the forward of
//   TERMS = 2, dv's entry of DV_TERMS = 2: the three down to 2^-8, m h, h m, h h, each operand
//   without its l, as gda_chunk_fwd's bfloat16 path; the pairs of terms e_a + e_b <= NT - 1 in
//   either case);
// - a tensor core adds to its accumulator without rounding to nearest (it truncates), so every
//   k-step of 16 sums into a fresh accumulator that is then added to the float32 total: the
//   truncation is once a k-step, of that step's sum, not of the running total (with two terms,
//   where the result is rounded to a half dtype after, the forward's o: the products straight
//   into the total, whose truncations, 2^-23 of it each, are below the two terms' 2^-17 and the
//   rounding's 2^-9).
// A block: one GM x GN tile of C, 4 warps of 32 x 32 (2 x 4 mma tiles each), the inner
// dimension GK at a time, the next stage's loads in registers while this one is multiplied
// (docs/perf-notes.md, v20: a ring of cp.async copies, split from shared memory, measured
// slower). With PLANES an operand pack split comes as its planes (gda_plane_operand), and the
// scan copies them through a ring of its own (gda_scan_feed, gda_scan_mma: v23).
#define GM 64                                           // rows of C a block
#define GN 64                                           // columns of C a block
#define GK 32                                           // inner steps a stage (16 or 32)
#define NTG 128                                         // threads of the GEMM entries
#define GW (GM * (GK / 2 + 4))                          // words of one staged term of an operand
#define GDA_GEMM_SMEM (4 * 6 * GW)                      // bytes: the six staged terms
static_assert(GM == GN && GK / 2 * (GM + 8) <= GW && (GK == 16 || GK == 32), "GK: 16 or 32");
static_assert(BT <= GM, "a chunk's rows in one tile");

// A stage of an operand (GK inner steps of 64 outer ones, a row-major matrix, its inner (k)
// index along the rows where KROWS, else along the columns) in registers and in shared memory:
// NL loads of 4 elements a thread (KROWS: two rows of the same 4 columns at a time; else 4
// inner steps of one row), stored as words of two consecutive inner steps ([GK / 2][64 + 8] or
// [64][GK / 2 + 4]: the fragments' reads are free of bank conflicts), each term GW words on.
template <bool KROWS>
struct gda_stage {
    static constexpr int LD = KROWS ? GM + 8 : GK / 2 + 4, NL = GK / 8, C4 = GK / 4;
    // load l's row r and first column c of the stage of outer indices mn0.., inner k0..
    static __device__ __forceinline__ void from(int l, int mn0, int k0, int& r, int& c) {
        if (KROWS) {
            const int x = threadIdx.x + l / 2 * NTG;
            r = k0 + x / 16 * 2 + l % 2;
            c = mn0 + x % 16 * 4;
        } else {
            const int x = threadIdx.x + l * NTG;
            r = mn0 + x / C4;
            c = k0 + x % C4 * 4;
        }
    }
    // the first word of store u (KROWS: loads 2u, 2u + 1, 4 words; else load u, 2 words)
    static __device__ __forceinline__ int to(int u) {
        const int x = threadIdx.x + u * NTG;
        return KROWS ? x / 16 * LD + x % 16 * 4 : x / C4 * LD + x % C4 * 2;
    }
    // the word of outer index i, inner pair kp
    static __device__ __forceinline__ int at(int i, int kp) {
        return KROWS ? kp * LD + i : i * LD + kp;
    }
};

// An operand: a row-major ROWS x COLS float32 matrix (gda_stage's); X: exact in bfloat16 (v
// and do of bfloat16 inputs), one term. A stage is loaded into registers and split into NT
// terms of words (3, or 2: h, m).
template <int ROWS, int COLS, bool KROWS, bool X, int NT = TERMS>
struct gda_operand : gda_stage<KROWS> {
    typedef float elem;
    typedef gda_stage<KROWS> S;
    float4 buf[S::NL];

    __device__ __forceinline__ static float4 ld4(const float* src, int r, int c) {
        const float* p = src + r * COLS + c;
        if (COLS % 4 == 0)
            return r < ROWS && c < COLS ? *reinterpret_cast<const float4*>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
        const bool on = r < ROWS;
        return make_float4(on && c < COLS ? p[0] : 0.f, on && c + 1 < COLS ? p[1] : 0.f,
                           on && c + 2 < COLS ? p[2] : 0.f, on && c + 3 < COLS ? p[3] : 0.f);
    }
    // the stage of outer indices mn0.., inner k0.. into registers (0 outside the matrix)
    __device__ __forceinline__ void load(const float* src, int mn0, int k0) {
        #pragma unroll
        for (int l = 0; l < S::NL; ++l) {
            int r, c;
            S::from(l, mn0, k0, r, c);
            buf[l] = ld4(src, r, c);
        }
    }
    // the registers, times alpha (1 where X), split into the NT terms' words at t[0], t[GW],
    // t[2 GW] (X: the first only)
    __device__ __forceinline__ void store(unsigned* t, float alpha) const {
        if (KROWS) {
            #pragma unroll
            for (int u = 0; u < S::NL / 2; ++u) {
                const int at = S::to(u);
                const float4 a = buf[2 * u], b = buf[2 * u + 1];
                uint4 h, m, l;
                gda_split3<X>(alpha * a.x, alpha * b.x, h.x, m.x, l.x);
                gda_split3<X>(alpha * a.y, alpha * b.y, h.y, m.y, l.y);
                gda_split3<X>(alpha * a.z, alpha * b.z, h.z, m.z, l.z);
                gda_split3<X>(alpha * a.w, alpha * b.w, h.w, m.w, l.w);
                *reinterpret_cast<uint4*>(t + at) = h;
                if (!X) *reinterpret_cast<uint4*>(t + GW + at) = m;
                if (!X && NT == 3) *reinterpret_cast<uint4*>(t + 2 * GW + at) = l;
            }
        } else {
            #pragma unroll
            for (int u = 0; u < S::NL; ++u) {
                const int at = S::to(u);
                uint2 h, m, l;
                gda_split3<X>(alpha * buf[u].x, alpha * buf[u].y, h.x, m.x, l.x);
                gda_split3<X>(alpha * buf[u].z, alpha * buf[u].w, h.y, m.y, l.y);
                *reinterpret_cast<uint2*>(t + at) = h;
                if (!X) *reinterpret_cast<uint2*>(t + GW + at) = m;
                if (!X && NT == 3) *reinterpret_cast<uint2*>(t + 2 * GW + at) = l;
            }
        }
    }
};

// An operand as gda_operand's, from P bfloat16 planes (pack's, PLANES: the terms h, m, l as
// made, P = 3, or the one of an exact operand, P = 1) of a row-major ROWS x COLS matrix of row
// pitch PITCH (a multiple of 4, 0 past COLS), plane e at ROWS PITCH e: the stage's words
// copied into the same layout, not split (alpha must be 1)
template <int ROWS, int COLS, int PITCH, bool KROWS, int P>
struct gda_plane_operand : gda_stage<KROWS> {
    typedef unsigned short elem;
    typedef gda_stage<KROWS> S;
    static_assert(PITCH % 4 == 0 && PITCH >= COLS, "whole 4-element loads in the pitch");
    uint2 buf[S::NL][P];                                // 4 elements of each plane a load

    // the stage of outer indices mn0.., inner k0.. into registers (0 outside the matrix)
    __device__ __forceinline__ void load(const elem* src, int mn0, int k0) {
        #pragma unroll
        for (int l = 0; l < S::NL; ++l) {
            int r, c;
            S::from(l, mn0, k0, r, c);
            #pragma unroll
            for (int e = 0; e < P; ++e)
                buf[l][e] = r < ROWS && c < PITCH
                    ? *reinterpret_cast<const uint2*>(src + ((long long)e * ROWS + r) * PITCH + c)
                    : make_uint2(0u, 0u);
        }
    }
    // the registers' words at t[0], t[GW], t[2 GW] (plane e at t[e GW])
    __device__ __forceinline__ void store(unsigned* t, float) const {
        #pragma unroll
        for (int e = 0; e < P; ++e) {
            if (KROWS) {                                // words of rows r, r + 1 of a column
                #pragma unroll
                for (int u = 0; u < S::NL / 2; ++u) {
                    const uint2 a = buf[2 * u][e], b = buf[2 * u + 1][e];
                    *reinterpret_cast<uint4*>(t + e * GW + S::to(u)) = make_uint4(
                        __byte_perm(a.x, b.x, 0x5410), __byte_perm(a.x, b.x, 0x7632),
                        __byte_perm(a.y, b.y, 0x5410), __byte_perm(a.y, b.y, 0x7632));
                }
            } else {                                    // words of columns c, c + 1 of a row
                #pragma unroll
                for (int u = 0; u < S::NL; ++u)
                    *reinterpret_cast<uint2*>(t + e * GW + S::to(u)) = buf[u][e];
            }
        }
    }
};

// The live mma tiles of the warp at rows wm.., columns wn.. of the block's tile at (m0, n0) of
// an M x N output: mn of its 2 row tiles, nn of its 4 column tiles; false where it has none
template <int M, int N>
__device__ __forceinline__ bool gda_live_tiles(int m0, int n0, int wm, int wn, int& mn, int& nn) {
    mn = M - m0 - wm > 16 ? 2 : 1;
    nn = min(4, (N - n0 - wn + 7) / 8);
    return M - m0 - wm > 0 && nn > 0;
}

// x += d, a thread's part of a tile (a k-step's fresh sums into the total)
__device__ __forceinline__ void gda_tile_add(float (&x)[2][4][4], const float (&d)[2][4][4]) {
    #pragma unroll
    for (int i = 0; i < 2; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r) x[i][j][r] += d[i][j][r];
}

template <int M, int N, int KK, bool TA, bool TB, bool XA = false, bool XB = false,
          int NT = TERMS>
struct gda_gemm_ops {                                   // gda_gemm's operand types
    typedef gda_operand<TA ? KK : M, TA ? M : KK, TA, XA, NT> A;
    typedef gda_operand<TB ? N : KK, TB ? KK : N, !TB, XB, NT> B;
};

// gda_gemm with the first stage of its operands already in A and B (of types opa, opb: the
// stored operands of gda_gemm_ops or plane operands of the same layouts); while its last stage
// is multiplied, the first of the next product's (an, bn: the same shapes, the same tile; none
// where an is null) is loaded into them, so a chain of products (the scan's chunks) does not
// wait on its loads; NT: the terms of a float32 operand (opa's and opb's), 3 or 2; FR: fresh
// sums a k-step (else the products straight into acc: two terms, a result rounded to a half
// dtype after)
template <int M, int N, int KK, bool XA, bool XB, typename opa, typename opb, int RT = 2,
          int NT = TERMS, bool FR = NT == 3>
__device__ __forceinline__ void gda_gemm_chain(float (&acc)[2][4][4], opa& A, opb& B,
                                               const typename opa::elem* a,
                                               const typename opb::elem* b, float alpha, int m0,
                                               int n0, unsigned* sm, const typename opa::elem* an,
                                               const typename opb::elem* bn)
{
    const int lane = threadIdx.x % 32, wm = threadIdx.x / 64 * 32, wn = threadIdx.x / 32 % 2 * 32;
    const int g = lane / 4, t = lane % 4;
    int mn, nn;                                         // live mma tiles
    const bool live = gda_live_tiles<M, N>(m0, n0, wm, wn, mn, nn);
    unsigned* sb = sm + 3 * GW;
    for (int k0 = 0; k0 < KK; k0 += GK) {
        __syncthreads();                                // the last stage's fragments are read
        A.store(sm, alpha);
        B.store(sb, 1.f);
        __syncthreads();
        if (k0 + GK < KK) {
            A.load(a, m0, k0 + GK);
            B.load(b, n0, k0 + GK);
        } else if (an) {
            A.load(an, m0, 0);
            B.load(bn, n0, 0);
        }
        #pragma unroll (RT == 1 ? 1 : GK / 16)
        for (int ks = 0; ks < GK; ks += 16) {
            if (!live || k0 + ks >= KK) continue;       // (the same in the whole warp)
            const int kp = ks / 2 + t;
            unsigned fb[3][4][2];                       // B's fragments [term h, m, l][tile]
            #pragma unroll
            for (int e = 0; e < (XB ? 1 : NT); ++e)
                #pragma unroll
                for (int i = 0; i < 4; ++i)
                    #pragma unroll
                    for (int j = 0; j < 2; ++j) fb[e][i][j] = sb[e * GW + opb::at(wn + 8 * i + g, kp + 4 * j)];
            // RT row tiles a pass (RT = 1: 16 registers of fresh sums live, not 32), into this
            // k-step's fresh sums d: A's terms l, m, h in turn, each with the B terms down to
            // 2^-16 of the product: l h; m m, m h; h l, h m, h h (last: what the small terms
            // were added to is 2^-7 of it; NT = 2: m h; h m, h h)
            #pragma unroll
            for (int i0 = 0; i0 < 2; i0 += RT) {
                if (i0 >= mn) continue;                 // (the same in the whole warp)
                float d[RT][4][4] = {};
                #pragma unroll
                for (int ea = XA ? 0 : NT - 1; ea >= 0; --ea) {
                    unsigned fa[RT][4];
                    #pragma unroll
                    for (int i = 0; i < RT; ++i)
                        #pragma unroll
                        for (int j = 0; j < 4; ++j)
                            fa[i][j] = sm[ea * GW + opa::at(wm + 16 * (i0 + i) + g + 8 * (j & 1), kp + 4 * (j >> 1))];
                    #pragma unroll
                    for (int eb = XB ? 0 : NT - 1 - ea; eb >= 0; --eb)
                        #pragma unroll
                        for (int i = 0; i < RT; ++i)
                            #pragma unroll
                            for (int j = 0; j < 4; ++j)
                                if (i0 + i < mn && j < nn)
                                    gda_mma_bf16(FR ? d[i][j] : acc[i0 + i][j], fa[i], fb[eb][j]);
                }
                #pragma unroll
                for (int i = 0; i < RT; ++i)
                    #pragma unroll
                    for (int j = 0; j < 4; ++j)
                        #pragma unroll
                        for (int r = 0; r < 4; ++r)
                            if (FR) acc[i0 + i][j][r] += d[i][j][r];
            }
        }
    }
}

// acc (the thread's part of the block's tile at rows m0.., columns n0..) += op(A) op(B): op(A)
// M x KK (A stored KK x M where TA), op(B) KK x N (stored N x KK where TB), alpha scaling A
// (1 where XA); XA, XB: the operand is exact in bfloat16, one term (the products with its other
// terms, 0, left out); RT: the row tiles a pass of the k-step's products (1: fewer registers,
// the same sums). sm: GDA_GEMM_SMEM bytes. Every thread of the block calls it. (gda_gemm_of:
// with the operand types given, e.g. plane operands.)
template <int M, int N, int KK, bool XA, bool XB, typename opa, typename opb, int RT = 2,
          int NT = TERMS, bool FR = NT == 3>
__device__ __forceinline__ void gda_gemm_of(float (&acc)[2][4][4], const typename opa::elem* a,
                                            const typename opb::elem* b, float alpha, int m0,
                                            int n0, unsigned* sm)
{
    opa A;
    opb B;
    A.load(a, m0, 0);
    B.load(b, n0, 0);
    gda_gemm_chain<M, N, KK, XA, XB, opa, opb, RT, NT, FR>(acc, A, B, a, b, alpha, m0, n0, sm,
                                                          nullptr, nullptr);
}
template <int M, int N, int KK, bool TA, bool TB, bool XA = false, bool XB = false, int RT = 2,
          int NT = TERMS>
__device__ __forceinline__ void gda_gemm(float (&acc)[2][4][4], const float* a, const float* b,
                                         float alpha, int m0, int n0, unsigned* sm)
{
    typedef gda_gemm_ops<M, N, KK, TA, TB, XA, XB, NT> ops;
    gda_gemm_of<M, N, KK, XA, XB, typename ops::A, typename ops::B, RT, NT>(acc, a, b, alpha, m0,
                                                                            n0, sm);
}

// f(i, j, h, row, col) for each pair of the thread's accumulator elements acc[i][j][2 h],
// acc[i][j][2 h + 1]: elements (row, col) and (row, col + 1), col even, of the block's tile at
// rows m0.., columns n0..
template <typename F>
__device__ __forceinline__ void gda_gemm_frags(int m0, int n0, const F& f)
{
    const int lane = threadIdx.x % 32, wm = threadIdx.x / 64 * 32, wn = threadIdx.x / 32 % 2 * 32;
    #pragma unroll
    for (int i = 0; i < 2; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                f(i, j, h, m0 + wm + 16 * i + lane / 4 + 8 * h, n0 + wn + 8 * j + lane % 4 * 2);
}

// put(row, col, x0, x1) of the block's tile at rows m0.., columns n0.. (elements (row, col) and
// (row, col + 1), col even): the rows below M (columns past N are the functor's to drop)
template <int M, typename F>
__device__ __forceinline__ void gda_gemm_put(const float (&acc)[2][4][4], int m0, int n0, const F& put)
{
    gda_gemm_frags(m0, n0, [&](int i, int j, int h, int row, int col) {
        if (row < M) put(row, col, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
    });
}

// the tile times post into the row-major M x N matrix c
template <int M, int N>
__device__ __forceinline__ void gda_gemm_store(float* c, const float (&acc)[2][4][4], int m0, int n0,
                                               float post = 1.f)
{
    gda_gemm_put<M>(acc, m0, n0, [=](int row, int col, float x0, float x1) {
        float* p = c + (long long)row * N + col;
        if (N % 2 == 0) {
            if (col < N) *reinterpret_cast<float2*>(p) = make_float2(post * x0, post * x1);
        } else {
            if (col < N) p[0] = post * x0;
            if (col + 1 < N) p[1] = post * x1;
        }
    });
}

// acc = the tile at rows m0.., columns n0.. of the row-major M x N matrix c (0 outside it, or
// where c is null), in gda_gemm_put's layout: each thread reads back what it would store
template <int M, int N>
__device__ __forceinline__ void gda_gemm_get(float (&acc)[2][4][4], const float* c, int m0, int n0)
{
    gda_gemm_frags(m0, n0, [&](int i, int j, int h, int row, int col) {
        const float* p = c + (long long)row * N + col;
        const bool on = c != nullptr && row < M;
        if (N % 2 == 0 && on && col < N) {
            const float2 x = *reinterpret_cast<const float2*>(p);
            acc[i][j][2 * h] = x.x;
            acc[i][j][2 * h + 1] = x.y;
        } else {
            acc[i][j][2 * h] = on && col < N ? p[0] : 0.f;
            acc[i][j][2 * h + 1] = on && col + 1 < N ? p[1] : 0.f;
        }
    });
}

// x[i][h] = the thread's row m0 + wm + 16 i + lane / 4 + 8 h of the vector r (0 from M on)
template <int M>
__device__ __forceinline__ void gda_gemm_rows(float (&x)[2][2], const float* r, int m0)
{
    const int row = m0 + threadIdx.x / 64 * 32 + threadIdx.x % 32 / 4;
    #pragma unroll
    for (int i = 0; i < 2; ++i)
        #pragma unroll
        for (int h = 0; h < 2; ++h) x[i][h] = row + 16 * i + 8 * h < M ? r[row + 16 * i + 8 * h] : 0.f;
}

#define GDA_VX (IO_DTYPE == 2)                          // v, do (vp, dp) exact in bfloat16

#define GDA_TILES(n) (((n) + GN - 1) / GN)              // tiles of GN over n columns (GM rows)
#define ES_PARTS (SCAN ? GDA_TILES(V_DIM) : 1)          // parts of rowsum(E (.) S0) in es

// 2. The local states of chunk b: st = (k D)^T v (z = 0), et = scale (q A)^T do (z = 1).
// Block: (b, z, tile of K x V).
#if GDA_HAS(1)
extern "C" __global__ void __launch_bounds__(NTG) gda_chunk_bwd_local(GDA_CHUNK_BWD_PARAMS)
{
    __shared__ __align__(16) unsigned b_op[GDA_GEMM_SMEM / 4];
    constexpr int TN = GDA_TILES(V_DIM), TILES = GDA_TILES(K_DIM) * TN;
    const long long b = blockIdx.x / (2 * TILES);
    const int z = blockIdx.x / TILES % 2, tile = blockIdx.x % TILES;
    const int m0 = tile / TN * GM, n0 = tile % TN * GN;
    float acc[2][4][4] = {};
    gda_gemm<K_DIM, V_DIM, BT, true, false, false, GDA_VX>(acc, (z ? qa : kd) + b * BT * K_DIM,
                                            (z ? dp : vp) + b * BT * V_DIM, z ? scale : 1.f, m0, n0, b_op);
    gda_gemm_store<K_DIM, V_DIM>((z ? et : st) + b * K_DIM * V_DIM, acc, m0, n0);
}
#endif

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

// 3. Block: RB rows (sequence-head nh, key row i) of NTC threads, thread jt: the columns
// (jt + jj NTC) VW .. + VW - 1. st[b][i][:] holds (k D)^T v of chunk b and becomes S0 (the state
// before the chunk); et[b][i][:] holds scale (q A)^T do and becomes E; es[b][i] = rowsum(E (.)
// S0); dh0 = the gradient reaching each sequence's initial state. A row runs its sequences one
// after another (with cu_seqlens nh is the head, and sequence n its chunks coff[n] ..
// coff[n+1] - 1; else one, NC chunks), each forward then backward; the chunks go CU at a time,
// their loads issued together (the scan's chain is the FMA, not the loads). Every row of a
// block passes the same barriers (the chunk ranges are the same for every head).
#if GDA_HAS(2)
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
        int j0, j1;
        gda_seq_chunks(coff, n, NC, j0, j1);
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
#endif

// A chunk of the scan on the thread's part of the state x (S forward, E backward), stored
// before: the guard on each element, each(i, j, r) (the backward's rowsum), then x scaled by
// its row's A_end a
template <typename F>
__device__ __forceinline__ void gda_scan_step(float (&x)[2][4][4], const float (&a)[2][2], bool& ok,
                                              const F& each)
{
    #pragma unroll
    for (int i = 0; i < 2; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
                ok &= gda_bwd_in(x[i][j][r], GDA_BWD_STATE_MAX);
                each(i, j, r);
                x[i][j][r] *= a[i][r / 2];
            }
}

// The fused scan's ring: RING stages in flight, each SK steps of every plane of the block's tile
// (SK rows of GM columns of PA planes of A, of GN columns of PB planes of B; a row padded to RL
// halves, so that ldmatrix's 8 rows of 16 bytes fall in distinct banks), copied by cp.async.
#define SK (BT % 32 ? 16 : 32)                          // steps a stage
#define NSUB (BT / SK)                                  // stages a chunk
#define RING 3                                          // stages in flight
#define RL (PT + 8)                                     // halves a staged row
#define RING_STAGE (2 * (PA + PB) * SK * RL)            // bytes a stage
static_assert(PT == GM && PT == GN, "the planes' tiles are the GEMM tiles");
static_assert(SMEM_BYTES == (PLANES ? RING * RING_STAGE : 0),
              "SMEM_BYTES (cupy_gda/chunk_bwd.py smem) differs from this kernel's layout");

// The scan's stages in the order it takes them, a cursor: for each sequence of the block's
// sequence-head, its chunks forward (A: k D, B: v; but KEEP), then (but FWD) backward (A: q A
// scale, B: do), NSUB stages a chunk. issue() copies the cursor's stage (nothing once past the last) and moves on.
struct gda_scan_feed {
    const unsigned short *pq, *pk, *pv, *pd;
    const long long* coff;
    long long nh, n, nseq;
    int NC, m0, n0, j0, j1, c, sub, dir;                // dir: 1 forward, -1 backward, 0 done

    __device__ __forceinline__ void range() {          // sequence n's chunks (KEEP: backward
        gda_seq_chunks(coff, n, NC, j0, j1);            //  alone, from the last)
        c = KEEP ? j1 - 1 : j0;
        dir = KEEP ? -1 : 1;
    }
    __device__ __forceinline__ void issue(unsigned at) {
        if (dir != 0) {
            const long long b = nh * NC + c;
            const unsigned short* a = (dir > 0 ? pk : pq) + (b * PA * BT + sub * SK) * KP + m0;
            const unsigned short* bb = (dir > 0 ? pv : pd) + (b * PB * BT + sub * SK) * VP + n0;
            #pragma unroll
            for (int e = 0; e < PA + PB; ++e)           // plane e: SK rows of 8 copies of 16 bytes
                #pragma unroll
                for (int w = 0; w < SK * 8 / NTG; ++w) {
                    const int x = threadIdx.x + w * NTG, r = x / 8, c8 = x % 8 * 8;
                    gda_cp16_at(at + 2 * ((e * SK + r) * RL + c8),
                                e < PA ? a + ((long long)e * BT + r) * KP + c8
                                       : bb + ((long long)(e - PA) * BT + r) * VP + c8);
                }
            if (++sub == NSUB) {
                sub = 0;
                c += dir;
                if (dir > 0 && c == j1 && !FWD && !SCAN_DV) {
                    dir = -1;
                    c = j1 - 1;
                } else if ((dir > 0 && c == j1) || (dir < 0 && c < j0)) {
                    dir = 0;
                    if (++n < nseq) range();
                }
            }
        }
        gda_cp_commit();                                // (an empty group past the last)
    }
};
static_assert(SK * 8 % NTG == 0, "whole copies a thread");

// x += A B over the staged SK steps at shared address at (A: the tile's GM rows of (k D)^T or
// (q A scale)^T, B: its GN columns of v or do), the thread's part of the tile in the GEMM
// accumulators' layout: gda_gemm_chain's products in its order (each k-step into fresh sums;
// A's PA terms (l,) m, h times B's one), the fragments by ldmatrix from the planes
__device__ __forceinline__ void gda_scan_mma(float (&x)[2][4][4], unsigned at, int m0, int n0)
{
    const int lane = threadIdx.x % 32, wm = threadIdx.x / 64 * 32, wn = threadIdx.x / 32 % 2 * 32;
    int mn, nn;                                         // live mma tiles
    if (!gda_live_tiles<K_DIM, V_DIM>(m0, n0, wm, wn, mn, nn)) return;   // (the whole warp)
    const int q = lane / 8, r8 = lane % 8;
    #pragma unroll
    for (int ks = 0; ks < SK; ks += 16) {
        unsigned fb[4][2];                              // B's fragments [tile]
        #pragma unroll
        for (int p = 0; p < 2; ++p) {
            unsigned r[4];
            const int row = PA * SK + ks + q % 2 * 8 + r8;      // (B's plane after A's)
            gda_ldsm4_t(r, at + 2 * (row * RL + wn + 16 * p + q / 2 * 8));
            fb[2 * p][0] = r[0];
            fb[2 * p][1] = r[1];
            fb[2 * p + 1][0] = r[2];
            fb[2 * p + 1][1] = r[3];
        }
        float d[2][4][4] = {};
        #pragma unroll
        for (int ea = PA - 1; ea >= 0; --ea) {
            unsigned fa[2][4];
            #pragma unroll
            for (int i = 0; i < 2; ++i)
                gda_ldsm4_t(fa[i], at + 2 * ((ea * SK + ks + q / 2 * 8 + r8) * RL + wm + 16 * i
                                             + q % 2 * 8));
            #pragma unroll
            for (int i = 0; i < 2; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (i < mn && j < nn) gda_mma_bf16(d[i][j], fa[i], fb[j]);
        }
        gda_tile_add(x, d);
    }
}

// 2-3 fused (SCAN = 1; launched instead of local and states). Block: (sequence-head nh, a GM x
// GN tile of the K x V state at rows m0, columns n0), the state in the GEMM accumulators' layout,
// the chunks in order: forward, S is stored as chunk b's S0, scaled by A_end, and (k D)^T v is
// added to it; backward from the last chunk, E is stored as its E, the tile's part of
// rowsum(E (.) S0) goes to es[part n0 / GN] (intra adds the ES_PARTS parts), E is scaled by
// A_end and scale (q A)^T do is added. The products: PLANES, from pack's planes, RING - 1
// stages ahead through the ring (gda_scan_feed), one barrier a stage, 3 blocks an SM (168
// registers); else by gda_gemm_chain, split here, the next product's first stage loaded while
// this one's last is multiplied, 2 blocks an SM. The local states never go through memory,
// and one kernel replaces two (docs/perf-notes.md, v21, v23). (Summing into the state itself,
// not into a fresh tile added after, keeps 32 registers free: with both, ptxas spilled; and
// with no minimum of blocks ptxas kept it to 168 registers and spilled at K = V = 1.) Chunks
// past the last sequence's (cu_seqlens) get no S0 or E: rows, intra and dv skip every chunk
// of no rows.
// (FWD: 2 blocks an SM, as the forward half alone spilled 4-24 bytes at 168 registers; KEEP,
// the backward half alone, and SCAN_DV, the forward half alone, likewise)
#if GDA_HAS(3)
extern "C" __global__ void __launch_bounds__(NTG, PLANES && !FWD && !KEEP && !SCAN_DV ? 3 : 2)
gda_chunk_bwd_scan(GDA_CHUNK_BWD_PARAMS)
{
    extern __shared__ __align__(16) unsigned short b_ring[];    // PLANES: RING stages
    __shared__ __align__(16) unsigned b_op[PLANES ? 1 : GDA_GEMM_SMEM / 4];   // else the chain's
    __shared__ float b_red[2][GM];                      // the rowsum's halves (wn = 0, 32)
    constexpr int TN = GDA_TILES(V_DIM), TILES = GDA_TILES(K_DIM) * TN;
    const long long nh = blockIdx.x / TILES, NB = NH * NC;
    const int tile = blockIdx.x % TILES, m0 = tile / TN * GM, n0 = tile % TN * GN;
    const int lane = threadIdx.x % 32, wm = threadIdx.x / 64 * 32, wn = threadIdx.x / 32 % 2 * 32;
    const unsigned ring = gda_shared_at(b_ring);
    const gda_planes_at p0(pl, NB, 0);                 // (PLANES) the planes of chunk 0 on
    gda_scan_feed feed{p0.q, p0.k, p0.v, p0.d, coff, nh, 0, coff ? N : 1, NC, m0, n0};
    if constexpr (PLANES) {
        feed.range();
        #pragma unroll
        for (int s = 0; s < RING - 1; ++s) feed.issue(ring + s * RING_STAGE);
    }
    int taken = 0;                                      // stages taken
    const auto take = [&](float (&x)[2][4][4]) {        // the next stage's products into x
        gda_cp_wait<RING - 2>();                        // (its copies, this thread's)
        __syncthreads();                                // (everyone's; and the slot of the
        feed.issue(ring + (taken + RING - 1) % RING * RING_STAGE);   //  last stage is read)
        gda_scan_mma(x, ring + taken % RING * RING_STAGE, m0, n0);
        ++taken;
    };
    bool ok = true;
    const long long nseq = coff ? N : 1;
    for (long long sq = 0; sq < nseq; ++sq) {
        const long long n = coff ? sq : nh / H;
        int j0, j1;
        gda_seq_chunks(coff, n, NC, j0, j1);
        const long long srow = (n * H + (coff ? nh : nh % H)) * K_DIM;   // row 0 of h0, dht, dh0
        float x[2][4][4], a[2][2];                      // S, then E
        gda_gemm_get<K_DIM, V_DIM>(x, h0 ? h0 + srow * V_DIM : nullptr, m0, n0);
        typedef gda_gemm_ops<K_DIM, V_DIM, BT, true, false, false, GDA_VX> ops;
        typename ops::A A;                              // (not PLANES) the next product's first
        typename ops::B B;                              //   stage
        if constexpr (!PLANES) {
            A.load(kd + (nh * NC + j0) * BT * K_DIM, m0, 0);
            B.load(vp + (nh * NC + j0) * BT * V_DIM, n0, 0);
        }
        for (int c = j0; c < (KEEP ? j0 : j1); ++c) {   // forward: S0 of each chunk (KEEP: kept)
            const long long b = nh * NC + c;
            gda_gemm_rows<K_DIM>(a, ae + b * K_DIM, m0);
            gda_gemm_store<K_DIM, V_DIM>(st + b * K_DIM * V_DIM, x, m0, n0);
            gda_scan_step(x, a, ok, [](int, int, int) {});
            if constexpr (PLANES) {
                #pragma unroll 1
                for (int u = 0; u < NSUB; ++u) take(x);
            } else {
                const bool more = c + 1 < j1;           // (then the backward's first, the last)
                gda_gemm_chain<K_DIM, V_DIM, BT, false, GDA_VX>(
                    x, A, B, kd + b * BT * K_DIM, vp + b * BT * V_DIM, 1.f, m0, n0, b_op,
                    more ? kd + (b + 1) * BT * K_DIM : qa + b * BT * K_DIM,
                    more ? vp + (b + 1) * BT * V_DIM : dp + b * BT * V_DIM);
            }
        }
        if constexpr (!FWD && !SCAN_DV) {               // (FWD: S, the final state, to dh0;
                                                        //  SCAN_DV: scan_dv's half)
            gda_gemm_get<K_DIM, V_DIM>(x, dht ? dht + srow * V_DIM : nullptr, m0, n0);
            for (int c = j1 - 1; c >= j0; --c) {        // backward: E of each chunk, from the last
                const long long b = nh * NC + c;
                float s0[2][4][4], part[2][2] = {};     // S0: this thread's own stores
                gda_gemm_get<K_DIM, V_DIM>(s0, st + b * K_DIM * V_DIM, m0, n0);
                gda_gemm_rows<K_DIM>(a, ae + b * K_DIM, m0);
                gda_gemm_store<K_DIM, V_DIM>(et + b * K_DIM * V_DIM, x, m0, n0);
                gda_scan_step(x, a, ok, [&](int i, int j, int r) {
                    part[i][r / 2] = fmaf(x[i][j][r], s0[i][j][r], part[i][r / 2]);
                });
                // rowsum over the tile's columns: the quad's lanes, then the two warps of its rows
                #pragma unroll
                for (int i = 0; i < 2; ++i)
                    #pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float y = part[i][h];
                        y += __shfl_xor_sync(GDA_FULL_MASK, y, 1);
                        y += __shfl_xor_sync(GDA_FULL_MASK, y, 2);
                        if (lane % 4 == 0) b_red[wn / 32][wm + 16 * i + lane / 4 + 8 * h] = y;
                    }
                __syncthreads();                        // (b_red's next writes are past the
                const int row = m0 + threadIdx.x;       //  products' barriers)
                if (threadIdx.x < GM && row < K_DIM)
                    es[((long long)n0 / GN * NH * NC + b) * K_DIM + row] =
                        b_red[0][threadIdx.x] + b_red[1][threadIdx.x];
                if constexpr (PLANES) {
                    #pragma unroll 1
                    for (int u = 0; u < NSUB; ++u) take(x);
                } else {
                    const bool more = c > j0;
                    gda_gemm_chain<K_DIM, V_DIM, BT, false, GDA_VX>(
                        x, A, B, qa + b * BT * K_DIM, dp + b * BT * V_DIM, scale, m0, n0, b_op,
                        more ? qa + (b - 1) * BT * K_DIM : nullptr,
                        more ? dp + (b - 1) * BT * V_DIM : nullptr);
                }
            }
        }
        if (dh0 && !SCAN_DV)
            gda_gemm_store<K_DIM, V_DIM>(dh0 + srow * V_DIM, x, m0, n0);
    }
    if (!ok) *flag = 1;
}
#endif

// Stage 4's products of chunk b (z, the tile at column n0 as gda_chunk_bwd_rows's) from its rows
// of v and of do, rv and rd: operands of type RO, k along V (float32 rows, or PLANES' planes)
template <typename RO>
__device__ __forceinline__ void gda_rows_of(int z, long long b, int n0, const typename RO::elem* rv,
                                            const typename RO::elem* rd, const float* st,
                                            const float* et, float* mm, float* sd, float* ev,
                                            float scale, unsigned* sm)
{
    float acc[2][4][4] = {};
    if (z == 0) {
        gda_gemm_of<BT, BT, V_DIM, GDA_VX, GDA_VX, RO, RO>(acc, rv, rd, GDA_VX ? 1.f : scale, 0, n0,
                                                           sm);
        gda_gemm_store<BT, BT>(mm + b * BT * BT, acc, 0, n0, GDA_VX ? scale : 1.f);
    } else {                                            // (ROWS_TERMS of S0 or E, fresh sums)
        typedef typename gda_gemm_ops<BT, K_DIM, V_DIM, false, true, GDA_VX, false,
                                      ROWS_TERMS>::B SO;                        // S0 or E
        gda_gemm_of<BT, K_DIM, V_DIM, GDA_VX, false, RO, SO, 2, ROWS_TERMS, true>(
            acc, z == 1 ? rd : rv, (z == 1 ? st : et) + b * K_DIM * V_DIM,
            GDA_VX || z == 2 ? 1.f : scale, 0, n0, sm);
        gda_gemm_store<BT, K_DIM>((z == 1 ? sd : ev) + b * BT * K_DIM, acc, 0, n0,
                                  GDA_VX && z == 1 ? scale : 1.f);
    }
}

// 4. Chunk b's rows from V-contractions: M = scale v do^T (z = 0), sd = scale do S0^T (z = 1),
// ev = v E^T (z = 2). Block: (b, z, tile of K columns; M has one).
// (3 blocks an SM, 168 registers: at big128 fp32 2 blocks took 1.17x the time; but where V is
// not a multiple of GK, 168 registers spilled, and with no bound ptxas took 72 and spilled at
// K = V = 24 bf16 sm_90)
#if GDA_HAS(4)
extern "C" __global__ void __launch_bounds__(NTG, V_DIM % GK ? 2 : 3)
gda_chunk_bwd_rows(GDA_CHUNK_BWD_PARAMS)
{
    __shared__ __align__(16) unsigned b_op[GDA_GEMM_SMEM / 4];
    constexpr int TILES = GDA_TILES(K_DIM);
    const long long b = blockIdx.x / (3 * TILES);
    const int z = blockIdx.x / TILES % 3, n0 = blockIdx.x % TILES * GN;
    GDA_CHUNK;
    // (no row to take a gradient: see scan; M's one tile of columns)
    if (ch.rows == 0 || (z == 0 && n0 >= BT)) return;
    if constexpr (PLANES) {
        const gda_planes_at pc(pl, NH * NC, b);
        gda_rows_of<gda_plane_operand<BT, V_DIM, VP, false, PB>>(z, b, n0, pc.v, pc.d, st, et, mm,
                                                                 sd, ev, scale, b_op);
    } else {
        gda_rows_of<gda_operand<BT, V_DIM, false, GDA_VX>>(z, b, n0, vp + b * BT * V_DIM,
                                                           dp + b * BT * V_DIM, st, et, mm, sd, ev,
                                                           scale, b_op);
    }
}
#endif

#define KI 16                                           // key columns a step of scores
#define NBK (BT / 16)                                   // 16-step blocks a chunk
#define QP (BT + 2)                                     // a key column's steps in b_q, b_sp and
                                                        //   b_pr (padded: the loads' stores, the
                                                        //   split items' and the diagonal's reads
                                                        //   free of bank conflicts, the products'
                                                        //   stores 2-way; scripts/scores_banks.py)
#define KW (KI / 2 + 4)                                 // words a row of a split operand (padded:
                                                        //   the fragments' reads are free of
                                                        //   bank conflicts)
#define KAR (8 * NBK * (NBK - 1))                       // rows of the anchored keys (16 tau each)
#define NTILE (NBK * (NBK - 1))                         // the tensor cores' 16 x 8 tiles of W
#define DP (BT <= 16 ? 16 : BT <= 32 ? 8 : 4)           // threads a pair of columns of the
static_assert(KI % DP == 0 && DP * BT / 2 <= NTS, "the diagonal's threads");   //  diagonal
#define ND 17                                           // a pair's (s, u), s <= u: 17 of them

// f(slot, tau, sigma, jn) for each of a warp's 16 x 8 tiles of W before the diagonal blocks:
// the tiles (u's block tau, s's block sigma < tau, 8 columns jn) in order, tile n to warp n % 4
// in its slot n / 4 (the same in the whole warp)
template <typename F>
__device__ __forceinline__ void gda_score_tiles(int warp, const F& f)
{
    int tile = 0;
    #pragma unroll
    for (int tau = 1; tau < NBK; ++tau)
        #pragma unroll
        for (int sg = 0; sg < tau; ++sg)
            #pragma unroll
            for (int jn = 0; jn < 2; ++jn, ++tile)
                if (tile % 4 == warp) f(tile / 4, tau, sg, jn);
}

// (QK_BY_SCORES) pack's work in scores, an item (step t in 16-step block blk, keys i0 + ii and
// the next): scale q A and k D into their PA planes, A_t and D_t from the block products as pack
// makes them
// (pre: the blocks before, in order; suf: those after, from the last down; the same bits), and
// at t = 0 A_end into ae (the chunk's)
__device__ __forceinline__ void gda_scores_planes(
    const gda_planes_at& pc, float* ae, int i0, int ii, int t, int blk,
    const float2 (&kg)[KI][BT + 1], const float (&bq)[KI][QP], const float (&sp)[KI][QP],
    const float (&pr)[KI][QP], const float (&gb)[NBK][KI], float scale)
{
    float xq[2], xk[2];
    #pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int j = ii + c;
        float pre = 1.f, suf = 1.f;
        for (int z = 0; z < blk; ++z) pre *= pr[j][16 * z + 15];    // (blk: a constant here)
        for (int z = NBK - 1; z > blk; --z) suf *= gb[z][j];
        xq[c] = bq[j][t] * (pre * pr[j][t]);
        xq[c] *= scale;
        xk[c] = kg[j][t].x * (sp[j][t] * suf);
        if (t == 0 && i0 + j < K_DIM) {                 // (blk 0)
            #pragma unroll
            for (int z = 0; z < NBK; ++z) pre *= pr[j][16 * z + 15];
            ae[i0 + j] = pre;
        }
    }
    unsigned h, m, l;
    gda_split3<false>(xq[0], xq[1], h, m, l);
    unsigned* const pq = reinterpret_cast<unsigned*>(gda_plane_at<false>(pc.q, t, i0 + ii));
    pq[0] = h;
    pq[BT * KP / 2] = m;
    if (PA == 3) pq[BT * KP] = l;
    gda_split3<false>(xk[0], xk[1], h, m, l);
    unsigned* const pk = reinterpret_cast<unsigned*>(gda_plane_at<true>(pc.k, t, i0 + ii));
    pk[0] = h;
    pk[BT * KP / 2] = m;
    if (PA == 3) pk[BT * KP] = l;
}

// 5. Block (chunk b): W[b][s][u] = sum_i k_s[i] P(s+1..u)[i] q_u[i] for s <= u, 0 below, in
// 16-step blocks. s in a block sigma before u's block tau: P(s+1..u) = P(s+1..16 tau - 1)
// P(16 tau..u), so the tile is (keys anchored at tau) (q P(16 tau..u))^T, on the tensor cores
// (split operands, exact to float32; the anchored keys are k_s P(s+1..end of sigma) times the
// whole blocks between: products, never quotients). s and u in one block: thread (pair, part),
// part one of DP of a step's key columns, the pair columns u and 15 - u (u < 8) of a block: its
// j-th (s, u) from u down for u (s = u - j, j <= u), then from 15 - u down for 15 - u (s =
// 16 - j), each a running product from s = its column down: ND = 17, every s <= u once
// (where a thread a column took all 16 s, half of them 0 above the diagonal). The key columns
// in steps of KI. With QK_BY_SCORES (VROWS: a forward that keeps nothing and runs scan_o, v44,
// where pack is not launched; v75: a backward by scan_dv, a forward keeping its stages by
// scan_o's wgmma form, where pack does v's and do's planes alone) it does pack's work of q,
// k and g too: from the same loads,
// the guard on q, k and g, the planes of scale q A and k D (gda_scores_planes: pack's A_t and
// D_t from the same block products, the same bits) and A_end, over every key column of the
// planes (KP; the key steps past K's last write zeros only) and every chunk, those of no rows
// too (zeros, A_end 1: scan_o reads them). With W_SPLIT (v58) it writes W as scan_o's wgmma
// form reads it: scale W's h, m planes in wgmma's B layout (gda_wg_split_b), split from W's
// rows in shared memory, where the key steps' arrays were (v60; v58 wrote W, read it back and
// wrote it over itself).
// Its blocks an SM (the launch bounds) and the unroll of its diagonal's key columns: 4 and 2,
// 123 registers at GLA-1.3B's VROWS build; 5 and 1 fit 96 with no spill (5 and 2 spill 12
// bytes, 6 and 1 8), so SCORES_BLOCKS and SCORES_DIAG_UNROLL given override them for an A/B
// (scripts/profile_chunk_bwd.py --scores-blocks; perf-notes "v45")
#ifndef SCORES_BLOCKS
#define SCORES_BLOCKS 4
#endif
#ifndef SCORES_DIAG_UNROLL
#define SCORES_DIAG_UNROLL 2
#endif
// A key step's rows of q, k and g come by cp.async into a stage while the step before runs
// (SCORES_PF; v46: GLA-1.3B's lean scores 0.56 -> 0.35 ms on an H100), where q and k are of a
// 16-bit type (float32's stage, 12 KiB, would leave an A100 3 blocks an SM), each row's KI
// columns are whole 16-byte pieces of each (K a multiple of 8; the inputs 16-byte aligned,
// _api's ALIGN), the block has 4 an SM's 128 registers, and the gates are of a 16-bit type or,
// float32, in chunks of 64 with W in two terms on a Hopper GPU (elsewhere their 4 KiB stage
// spilled 4-24 bytes or, with W's three terms, overflowed the 48 KiB of static shared memory);
// elsewhere each step loads them itself. SCORES_PREFETCH 0 turns it off (profile_chunk_bwd
// --no-scores-prefetch's A/B)
#ifndef SCORES_PREFETCH
#define SCORES_PREFETCH 1
#endif
#if GDA_HAS(5)
constexpr bool SCORES_PF = SCORES_PREFETCH && sizeof(io::t) == 2 && K_DIM % 8 == 0
                           && SCORES_BLOCKS <= 4
                           && (sizeof(gt::t) == 2 || (BT == 64 && DV_TERMS == 2 && __CUDA_ARCH__ >= 900));
extern "C" __global__ void __launch_bounds__(NTS, SCORES_BLOCKS) gda_chunk_bwd_scores(GDA_CHUNK_BWD_PARAMS)
{
#if W_SPLIT || W_SPLIT_DV
    // (W_SPLIT, W_SPLIT_DV) the key steps' four arrays below in one, which holds W once they
    // are done (v60)
    constexpr int KG = 2 * KI * (BT + 1);               // (b_kg's floats)
    __shared__ __align__(16) float b_keys[KG + 3 * KI * QP];
    float2 (&b_kg)[KI][BT + 1] = *reinterpret_cast<float2 (*)[KI][BT + 1]>(b_keys);
    float (&b_q)[KI][QP] = *reinterpret_cast<float (*)[KI][QP]>(b_keys + KG);
    float (&b_sp)[KI][QP] = *reinterpret_cast<float (*)[KI][QP]>(b_keys + KG + KI * QP);
    float (&b_pr)[KI][QP] = *reinterpret_cast<float (*)[KI][QP]>(b_keys + KG + 2 * KI * QP);
#else
    __shared__ float2 b_kg[KI][BT + 1];                 // (k, g) by key column (padded: its
                                                        //   stores are by key column)
    __shared__ float b_q[KI][QP];                       // (by key column, as b_kg)
    __shared__ float b_sp[KI][QP];                      // P(s+1..end of s's block)
    __shared__ float b_pr[KI][QP];                      // P(start of u's block..u)
#endif
    __shared__ float b_gb[NBK][KI];                     // P(the whole block)
    // (W's terms are DV_TERMS: dv's entry, the only stage that reads W, o in the forward)
    __shared__ unsigned b_ka[DV_TERMS][KAR > 0 ? KAR : 1][KW];  // anchored keys, tau = 1..
                                                        //   from row 8 tau (tau - 1), terms h, m, l
    __shared__ unsigned b_qa[DV_TERMS][BT > 16 ? BT - 16 : 1][KW];  // q P(16 tau..u), row u - 16
    constexpr int PFR = SCORES_PF ? BT : 1;             // (SCORES_PF) the stage of a key step's
    __shared__ __align__(16) io::t r_q[PFR][KI];        //  rows of q, k and g, as the caller
    __shared__ __align__(16) io::t r_k[PFR][KI];        //  gave them
    __shared__ __align__(16) gt::t r_g[PFR][KI];
    const long long b = blockIdx.x;
    GDA_CHUNK;
    if (!QK_BY_SCORES && ch.rows == 0) return;          // (dv skips the chunk too)
    float mqk = 0.f, mg = 0.f;                          // (QK_BY_SCORES: the guard's running
                                                        //  max of |q|, |k| and of |g|; a NaN
                                                        //  stays)
    const gda_planes_at pc(pl, NH * NC, b);             // (QK_BY_SCORES: the planes it writes)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g8 = lane / 4, t4 = lane % 4;
    const int pair = threadIdx.x / DP, part = threadIdx.x % DP;  // the diagonal blocks' thread:
    const int s0 = pair / 8 * 16, u = pair % 8;         //  block s0's columns u and 15 - u
    float wd[ND];                                       // W of the j-th (s, u) (above): this
    #pragma unroll                                      //  part's
    for (int j = 0; j < ND; ++j) wd[j] = 0.f;
    float acc[NTILE > 0 ? (NTILE + 3) / 4 : 1][4] = {};  // tiles warp, warp + 4, ... (below)
    // (SCORES_PF) key step i0's rows of q, k and g into the stage, 16-byte pieces, zeros past
    // the chunk's rows or K (nothing read there), as one group of copies
    const auto prefetch = [&](int i0) {
        if constexpr (SCORES_PF) {
            constexpr int PI = 16 / sizeof(io::t), PG = 16 / sizeof(gt::t);   // a piece's
            for (int x = threadIdx.x; x < BT * KI / PI; x += NTS) {            //  elements
                const int t = x / (KI / PI), c = x % (KI / PI) * PI;
                const bool on = t < ch.rows && i0 + c < K_DIM;
                const long long e = on ? ch.at(t, K_DIM, i0 + c) : 0;
                gda_cp16_or_0(gda_shared_at(&r_q[t][c]), q + e, on);
                gda_cp16_or_0(gda_shared_at(&r_k[t][c]), k + e, on);
            }
            for (int x = threadIdx.x; x < BT * KI / PG; x += NTS) {
                const int t = x / (KI / PG), c = x % (KI / PG) * PG;
                const bool on = t < ch.rows && i0 + c < K_DIM;
                gda_cp16_or_0(gda_shared_at(&r_g[t][c]), g + (on ? ch.at(t, K_DIM, i0 + c) : 0),
                              on);
            }
            gda_cp_commit();
        }
    };
    if constexpr (SCORES_PF) prefetch(0);
    const long long e0 = ch.at(threadIdx.x / KI, K_DIM, threadIdx.x % KI);   // (the loads': a
    const long long de = (long long)(NTS / KI) * H * K_DIM;                  //  thread's first,
    for (int i0 = 0; i0 < K_DIM; i0 += KI) {                                 //  its rows' step)
        if constexpr (SCORES_PF) gda_cp_wait<0>();      // (this step's stage: the thread's own)
        __syncthreads();                                // the last step's reads are done (and
                                                        //  the stage's copies the block's)
        {                                               // a thread's column ii, its rows NTS /
            const int ii = threadIdx.x % KI, i = i0 + ii;   //  KI apart, their element e one
            long long e = e0 + i0;                          //  add apart (from memory 4 at once:
            #pragma unroll (SCORES_PF ? 8 : 4)              //  all 8 spilled on sm_80; from the
                                                            //  stage all 8: 4 spilled at GLA-1.3B)
            for (int t = threadIdx.x / KI; t < BT; t += NTS / KI, e += de) {
                float kv = 0.f, gv = 1.f, qv = 0.f;
                if (t < ch.rows && i < K_DIM) {
                    if constexpr (SCORES_PF) {
                        kv = io::load(r_k[t][ii]);
                        gv = gda_gate(r_g[t][ii]);
                        qv = io::load(r_q[t][ii]);
                    } else {
                        kv = io::load(k[e]);
                        gv = gda_gate(g[e]);
                        qv = io::load(q[e]);
                    }
                    if (QK_BY_SCORES) {
                        gda_absmax(mqk, qv);
                        gda_absmax(mqk, kv);
                        gda_absmax(mg, gv);
                    }
                }
                b_kg[ii][t] = make_float2(kv, gv);
                b_q[ii][t] = qv;
            }
        }
        __syncthreads();
        if constexpr (SCORES_PF)                        // the next step's rows while this one
            if (i0 + KI < K_DIM) prefetch(i0 + KI);     //  runs (the stage read: the barrier)
        static_assert(2 * KI * NBK <= NTS, "scores: a thread a column's products in a block");
        if (threadIdx.x < 2 * KI * NBK) {               // thread (column, block, its half): P(s+1..
            const int ii = threadIdx.x % KI, s0 = threadIdx.x / KI % NBK * 16;   //  end) and the
            float p = 1.f;                              //  block's product (the first KI NBK),
            if (threadIdx.x < KI * NBK) {               //  P(start..u) (the next: v51, its chain
                #pragma unroll                          //  beside the first's, not after it)
                for (int ss = 15; ss >= 0; --ss) {
                    b_sp[ii][s0 + ss] = p;
                    p *= b_kg[ii][s0 + ss].y;
                }
                b_gb[s0 / 16][ii] = p;
            } else {
                #pragma unroll
                for (int ss = 0; ss < 16; ++ss) {
                    p *= b_kg[ii][s0 + ss].y;
                    b_pr[ii][s0 + ss] = p;
                }
            }
        }
        __syncthreads();
        // the split operands, item (step t, pair of columns): the keys anchored at every block
        // after t's, and q P(start of t's block..t) (a thread's rows 16 apart from r0 < 16: t's
        // block is dr / 16, known once unrolled)
        static_assert(NTS / (KI / 2) == 16, "scores: a thread's split items a 16-step block apart");
        gda_grid_each<BT, KI / 2, NTS>([&](int r0, int dr, int ip) {
            const int t = r0 + dr, ii = 2 * ip, blk = dr / 16;
            float k0 = b_kg[ii][t].x * b_sp[ii][t], k1 = b_kg[ii + 1][t].x * b_sp[ii + 1][t];
            #pragma unroll
            for (int tau = 1; tau < NBK; ++tau) {
                if (tau > blk) {
                    const int row = 8 * tau * (tau - 1) + t;
                    unsigned h, m, l;
                    gda_split3<false>(k0, k1, h, m, l);
                    b_ka[0][row][ip] = h;
                    b_ka[1][row][ip] = m;
                    if (DV_TERMS == 3) b_ka[DV_TERMS - 1][row][ip] = l;
                    k0 *= b_gb[tau][ii];
                    k1 *= b_gb[tau][ii + 1];
                }
            }
            if (blk > 0) {
                const float q0 = b_q[ii][t] * b_pr[ii][t], q1 = b_q[ii + 1][t] * b_pr[ii + 1][t];
                unsigned h, m, l;
                gda_split3<false>(q0, q1, h, m, l);
                b_qa[0][t - 16][ip] = h;
                b_qa[1][t - 16][ip] = m;
                if (DV_TERMS == 3) b_qa[DV_TERMS - 1][t - 16][ip] = l;
            }
            if constexpr (QK_BY_SCORES)
                gda_scores_planes(pc, ae + b * K_DIM, i0, ii, t, blk, b_kg, b_q, b_sp, b_pr, b_gb,
                                  scale);
        });
        __syncthreads();
        // this warp's tiles: one m16n8k16 k-step, A's terms l, m, h each with B's down to 2^-16
        // of the product (DV_TERMS = 2: m, h, to 2^-8)
        gda_score_tiles(warp, [&](int slot, int tau, int sg, int jn) {
            const int ra = 8 * tau * (tau - 1) + 16 * sg + g8, rb = 16 * (tau - 1) + 8 * jn + g8;
            unsigned fb[DV_TERMS][2];
            #pragma unroll
            for (int e = 0; e < DV_TERMS; ++e) {
                fb[e][0] = b_qa[e][rb][t4];
                fb[e][1] = b_qa[e][rb][t4 + 4];
            }
            float d[4] = {};
            #pragma unroll
            for (int ea = DV_TERMS - 1; ea >= 0; --ea) {
                const unsigned fa[4] = {b_ka[ea][ra][t4], b_ka[ea][ra + 8][t4],
                                        b_ka[ea][ra][t4 + 4], b_ka[ea][ra + 8][t4 + 4]};
                #pragma unroll
                for (int eb = DV_TERMS - 1 - ea; eb >= 0; --eb) gda_mma_bf16(d, fa, fb[eb]);
            }
            #pragma unroll
            for (int r = 0; r < 4; ++r) acc[slot][r] += d[r];
        });
        // s and u in one block: this part's key columns, the pair's ND (s, u)
        if (s0 < BT) {                                  // (the same in the whole warp)
            #pragma unroll (SCORES_DIAG_UNROLL)
            for (int c = 0; c < KI / DP; ++c) {
                const int ii = part * (KI / DP) + c;
                const float qa = b_q[ii][s0 + u], qb = b_q[ii][s0 + 15 - u];
                const float2* const ka = &b_kg[ii][s0 + u];    // (s = u - j: ka[-j])
                const float2* const kb = &b_kg[ii][s0 + 16];   // (s = 16 - j: kb[-j])
                float p = 1.f;
                #pragma unroll
                for (int j = 0; j < ND; ++j) {
                    const bool first = j <= u;
                    const float2 kg = (first ? ka : kb)[-j];
                    p = j == u + 1 ? 1.f : p;                   // (15 - u's first)
                    wd[j] = fmaf(kg.x * p, first ? qa : qb, wd[j]);
                    p *= kg.y;
                }
            }
        }
    }
    if constexpr (QK_BY_SCORES)                         // the planes' key columns past the
        for (int i0 = (K_DIM + KI - 1) / KI * KI; i0 < KP; i0 += KI)   //  last step of keys: 0
            gda_grid_each<BT, KI / 2, NTS>([&](int r0, int dr, int ip) {
                const int t = r0 + dr, i = i0 + 2 * ip;
                unsigned* const pq = reinterpret_cast<unsigned*>(gda_plane_at<false>(pc.q, t, i));
                unsigned* const pk = reinterpret_cast<unsigned*>(gda_plane_at<true>(pc.k, t, i));
                pq[0] = pq[BT * KP / 2] = pk[0] = pk[BT * KP / 2] = 0u;
                if (PA == 3) pq[BT * KP] = pk[BT * KP] = 0u;
            });
#if W_SPLIT || W_SPLIT_DV
    // W [BT][WL] in shared memory (rows 16-byte aligned; the split's reads, 8 rows apart a
    // lane's 4, without bank conflicts), once every key step's reads are done
    constexpr int WL = BT + 4;
    static_assert(BT * WL <= KG + 3 * KI * QP, "W_SPLIT: W's stage within the key steps' arrays");
    float* const w = b_keys;
    __syncthreads();
#else
    constexpr int WL = BT;                              // (W's rows in global memory)
    float* const w = ww + b * BT * BT;
#endif
    #pragma unroll
    for (int o = 1; o < DP; o *= 2)                     // the parts' sums, in every part
        #pragma unroll
        for (int j = 0; j < ND; ++j) wd[j] += __shfl_xor_sync(GDA_FULL_MASK, wd[j], o);
    if (s0 < BT)                                        // part p stores the j-th p, p + DP, ...
        #pragma unroll
        for (int j = 0; j < ND; ++j)
            if (j % DP == part)
                w[(s0 + (j <= u ? u - j : 16 - j)) * WL + s0 + (j <= u ? u : 15 - u)] = wd[j];
    gda_score_tiles(warp, [&](int slot, int tau, int sg, int jn) {
        const int s = 16 * sg + g8, uc = 16 * tau + 8 * jn + 2 * t4;
        *reinterpret_cast<float2*>(w + s * WL + uc) = make_float2(acc[slot][0], acc[slot][1]);
        *reinterpret_cast<float2*>(w + (s + 8) * WL + uc) = make_float2(acc[slot][2], acc[slot][3]);
    });
    for (int x = threadIdx.x; x < BT * BT; x += NTS)    // below the diagonal (s > u): 0
        if (x / BT > x % BT) w[WL == BT ? x : x / BT * WL + x % BT] = 0.f;
#if W_SPLIT || W_SPLIT_DV
    // W as its reader splits it, into global memory (scale W's h, m planes), once all of it is
    // stored: element (r, c) = scale W[c][r] for scan_o's wgmma form (W_SPLIT: r the output's
    // step, c the input's), scale W[r][c] for scan_dv's (W_SPLIT_DV)
    __syncthreads();
    unsigned* const wp = reinterpret_cast<unsigned*>(ww + b * BT * BT);
    gda_wg_split_b<BT, BT, NTS, false>(
        [&](int r, int c) { return __fmul_rn(scale, W_SPLIT ? w[c * WL + r] : w[r * WL + c]); },
        wp, wp + BT * BT / 2, threadIdx.x);
#endif
    if (QK_BY_SCORES && !(mqk <= GDA_BWD_VAL_MAX && mg <= GDA_BWD_GATE_MAX)) *flag = 1;
}
#endif

// 6. Block (chunk b, key tile kt), thread: key column i. Load: the chunk's k, g of the column into
// shared memory, M into shared memory, and (Aex_t, R_t) forward into ar. Then the steps from the
// last down, two at a time (ta = tb + 1; BT is even, so a pair lies inside one 16-step block):
// X (over s, registers) <- q_ta M[s, ta] + g_{ta+1} X, then <- q_tb M[s, tb] + g_ta X, and the
// sums over s < tb with weights P(s+1..tb-1) k_s (a running product down from s = tb - 1) give
// dq's and dg's terms of both steps (ta's: its s = tb term, plus g_tb times the sum over s < tb).
// The blocks of s below the pair's block need no comparison with the steps.
#if GDA_HAS(6)
extern "C" __global__ void __launch_bounds__(KT) gda_chunk_bwd_intra(GDA_CHUNK_BWD_PARAMS)
{
    static_assert(BT % 2 == 0, "BT: even (the steps go in pairs)");
    __shared__ float2 b_m[BT][BT / 2];                  // (M[s][2j], M[s][2j + 1]) at [s][j]
    __shared__ float2 b_kg[BT][KT];
    const long long b = blockIdx.x / ((K_DIM + KT - 1) / KT);
    const int i = (int)(blockIdx.x % ((K_DIM + KT - 1) / KT)) * KT + threadIdx.x;
    const int ti = threadIdx.x;
    const bool col = i < K_DIM;
    GDA_CHUNK;
    if (ch.rows == 0) return;                           // (the whole block)
    const float2* m2 = reinterpret_cast<const float2*>(mm + b * BT * BT);
    #pragma unroll 8
    for (int x = threadIdx.x; x < BT * BT / 2; x += KT) b_m[x / (BT / 2)][x % (BT / 2)] = m2[x];
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
    float esum = 0.f;                                   // rowsum(E (.) S0), its parts in order
    #pragma unroll
    for (int pt = 0; pt < ES_PARTS; ++pt) esum += es[(pt * NH * NC + b) * K_DIM + i];
    float x[BT];
    #pragma unroll
    for (int s = 0; s < BT; ++s) x[s] = 0.f;
    float dx = 1.f, f = 0.f, gnext = 1.f;               // D_t, F_t, g_{t+1}
    // a step's values from global memory, loaded one pair ahead ([0]: ta, [1]: tb); q as read
    // (converted to float where used: a conversion right after the load would wait for it)
    io::t qn[2];
    float sdn[2], evn[2];
    float2 arn[2];
    auto fetch = [&](int t, int z) {
        const long long wt = w0 + (long long)t * K_DIM;
        qn[z] = t < ch.rows ? q[ch.at(t, K_DIM, i)] : io::t(0);
        sdn[z] = sd[wt];
        evn[z] = ev[wt];
        arn[z] = ar[wt];
    };
    // step t's gradients from its sums over s < t: aq (weights times M[s][t]) and t4 (times X_t)
    auto finish = [&](int t, float qt, float sdt, float evt, float2 arv, float2 kg, float mtt,
                      float xt, float aq, float t4) {
        const float aex = arv.x, r = arv.y, gt_ = kg.y;
        f = fmaf(gnext, f, qt * sdt);
        const float dqt = fmaf(aex * gt_, sdt, fmaf(kg.x, mtt, gt_ * aq));
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
    };
    fetch(BT - 1, 0);
    fetch(BT - 2, 1);
    for (int tb = BT - 2; tb >= 0; tb -= 2) {
        const int ta = tb + 1, j = tb >> 1, blk = tb >> 4;
        const float qa_ = io::load(qn[0]), sda = sdn[0], eva = evn[0];
        const float qb_ = io::load(qn[1]), sdb = sdn[1], evb = evn[1];
        const float2 ara = arn[0], arb = arn[1];
        if (tb > 0) {
            fetch(tb - 1, 0);
            fetch(tb - 2, 1);
        }
        const float2 kga = b_kg[ta][ti], kgb = b_kg[tb][ti];
        const float ga_next = gnext;                    // g_{ta+1}
        // xa, xb: X_ta[ta], X_tb[tb]; xab: X_ta[tb]; the sums over s < tb (p = 0 until s = tb - 1)
        float xa = 0.f, xb = 0.f, xab = 0.f, t4a = 0.f, t4b = 0.f, aqa = 0.f, aqb = 0.f, p = 0.f;
        #pragma unroll
        for (int sb = BT / 16 - 1; sb >= 0; --sb) {
            if (sb == blk) {                            // the pair's block
                #pragma unroll
                for (int s = sb * 16 + 15; s >= sb * 16; --s) {
                    const float2 m = b_m[s][j];         // (M[s][tb], M[s][ta])
                    const float2 ks = b_kg[s][ti];
                    x[s] = fmaf(ga_next, x[s], qa_ * m.y);
                    const float xs = x[s];
                    x[s] = fmaf(kga.y, x[s], qb_ * m.x);
                    xa = s == ta ? xs : xa;
                    xab = s == tb ? xs : xab;
                    xb = s == tb ? x[s] : xb;
                    const float wk = p * ks.x;
                    t4a = fmaf(wk, xs, t4a);
                    t4b = fmaf(wk, x[s], t4b);
                    aqa = fmaf(wk, m.y, aqa);
                    aqb = fmaf(wk, m.x, aqb);
                    p = s == tb ? 1.f : p * ks.y;
                }
            } else if (sb < blk) {                      // below it: every s < tb
                #pragma unroll
                for (int s = sb * 16 + 15; s >= sb * 16; --s) {
                    const float2 m = b_m[s][j];
                    const float2 ks = b_kg[s][ti];
                    x[s] = fmaf(ga_next, x[s], qa_ * m.y);
                    const float xs = x[s];
                    x[s] = fmaf(kga.y, x[s], qb_ * m.x);
                    const float wk = p * ks.x;
                    t4a = fmaf(wk, xs, t4a);
                    t4b = fmaf(wk, x[s], t4b);
                    aqa = fmaf(wk, m.y, aqa);
                    aqb = fmaf(wk, m.x, aqb);
                    p *= ks.y;
                }
            }
        }
        // ta's sums over s < ta: its s = tb term, then P(s+1..ta-1) = g_tb P(s+1..tb-1) below
        const float2 mtb = b_m[tb][j], mta = b_m[ta][j];
        finish(ta, qa_, sda, eva, ara, kga, mta.y, xa, fmaf(kgb.x, mtb.y, kgb.y * aqa),
               fmaf(kgb.x, xab, kgb.y * t4a));
        finish(tb, qb_, sdb, evb, arb, kgb, mtb.x, xb, aqb, t4b);
    }
}
#endif

#if WGMMA
// Stage 7 on Hopper (WGMMA, sm_90a; chunk_bwd.Config.WGMMA): dv's two GEMMs by wgmma, both
// operands in shared memory. The block, one warpgroup, takes its 64 x 64 tile of the output in
// stages of WS inner steps, each written into one of WRING slots as bfloat16 planes in wgmma's
// K-major layout without swizzle (core matrices of 8 outer indices x 8 inner steps, 128
// contiguous bytes; cores along the inner steps 128 bytes apart, along the outer WC): pack's
// planes copied as made (cp.async), a float32 operand split there (gda_split3) from registers
// loaded a stage ahead. Each k-step of 16 sums its products into fresh accumulators (A's terms
// l, m, h each with B's down to 2^-16 of the product, gda_gemm_chain's order), added to the
// total after it (one truncation a k-step, as gda_gemm_chain); a stage's products run while
// the next stage is written.
#define WS 32                                           // inner steps a stage
#define WC (WS / 8 * 128)                               // bytes between 8-row groups of cores
#define WTILE (64 * WS * 2)                             // bytes of a plane of a stage
#define WSLOT (6 * WTILE)                               // a slot: A's 3 planes, then B's 3
#define WRING 3                                         // slots of gda_wg_gemm
static_assert(BT == 64, "WGMMA: a chunk of 64 steps, wgmma's m64");
static_assert(WS * 8 % NTG == 0 && 64 * WS / 8 == 2 * NTG, "whole copies and units a thread");

// the byte offset of outer index o's 8 inner steps 8 kb .. 8 kb + 7 in a plane of a stage
__device__ __forceinline__ int gda_wg_at(int o, int kb) { return (o >> 3) * WC + kb * 128 + (o & 7) * 16; }

// A stage's operand (its outer indices 0..63, inner k0 .. k0 + WS - 1) in NP planes at dst:
// P bfloat16 planes (pack's) of ROWS rows of PITCH, the inner index along a row, by cp.async
template <int P, int ROWS, int PITCH>
struct gda_wg_planes {
    static constexpr int NP = P;
    static constexpr bool ASYNC = true;
    const unsigned short* src;                          // plane 0's first row
    __device__ __forceinline__ void load(int) {}
    __device__ __forceinline__ void put(unsigned char* dst, int k0, float) const {
        #pragma unroll
        for (int i = 0; i < P * 64 * WS / 8 / NTG; ++i) {
            const int x = threadIdx.x + i * NTG, e = x / (64 * WS / 8), o = x / (WS / 8) % 64;
            const int kb = x % (WS / 8);
            gda_cp16_at(gda_shared_at(dst + e * WTILE + gda_wg_at(o, kb)),
                        src + ((long long)e * ROWS + o) * PITCH + k0 + 8 * kb);
        }
    }
};

// a float32 operand, outer index o, inner k at src[o * LD + k] (KMAJOR) or src[k * LD + o],
// 0 from outer index omax and inner KMAX on, split into 3 planes (X: exact in bfloat16, 1); a
// thread's units: outer index o, 8 inner steps 8 kb..
template <int KMAX, int LD, bool KMAJOR, bool X>
struct gda_wg_split {
    static constexpr int NP = X ? 1 : 3;
    static constexpr bool ASYNC = false;
    const float* src;
    int omax;
    float x[2][8];
    __device__ __forceinline__ void load(int k0) {
        #pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int u = threadIdx.x + i * NTG, o = u % 64, k = k0 + u / 64 * 8;
            const bool on = o < omax;
            if (KMAJOR && LD % 4 == 0 && KMAX % 8 == 0) {
                #pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float4 f = on && k < KMAX
                        ? *reinterpret_cast<const float4*>(src + (long long)o * LD + k + 4 * c)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
                    x[i][4 * c] = f.x;
                    x[i][4 * c + 1] = f.y;
                    x[i][4 * c + 2] = f.z;
                    x[i][4 * c + 3] = f.w;
                }
            } else {
                #pragma unroll
                for (int j = 0; j < 8; ++j)
                    x[i][j] = on && k + j < KMAX
                        ? src[KMAJOR ? (long long)o * LD + k + j : (long long)(k + j) * LD + o] : 0.f;
            }
        }
    }
    __device__ __forceinline__ void put(unsigned char* dst, int, float alpha) const {
        #pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int u = threadIdx.x + i * NTG, at = gda_wg_at(u % 64, u / 64);
            unsigned h[4], m[4], l[4];
            #pragma unroll
            for (int c = 0; c < 4; ++c) gda_split3<X>(alpha * x[i][2 * c], alpha * x[i][2 * c + 1], h[c], m[c], l[c]);
            *reinterpret_cast<uint4*>(dst + at) = make_uint4(h[0], h[1], h[2], h[3]);
            if (!X) {
                *reinterpret_cast<uint4*>(dst + WTILE + at) = make_uint4(m[0], m[1], m[2], m[3]);
                *reinterpret_cast<uint4*>(dst + 2 * WTILE + at) = make_uint4(l[0], l[1], l[2], l[3]);
            }
        }
    }
};

// one bfloat16 plane (pack's v or do), outer index o, inner k at src[k * PITCH + o] (every
// index inside the plane): a thread's unit, outer indices 2 op, 2 op + 1, 8 inner steps 8 kb..
template <int PITCH>
struct gda_wg_plane_t {
    static constexpr int NP = 1;
    static constexpr bool ASYNC = false;
    const unsigned short* src;
    unsigned w[8];
    __device__ __forceinline__ void load(int k0) {
        const int op = threadIdx.x % 32, k = k0 + threadIdx.x / 32 * 8;
        #pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = *reinterpret_cast<const unsigned*>(src + (long long)(k + j) * PITCH + 2 * op);
    }
    __device__ __forceinline__ void put(unsigned char* dst, int, float) const {
        const int op = threadIdx.x % 32, kb = threadIdx.x / 32;
        unsigned lo[4], hi[4];
        #pragma unroll
        for (int c = 0; c < 4; ++c) {
            lo[c] = __byte_perm(w[2 * c], w[2 * c + 1], 0x5410);
            hi[c] = __byte_perm(w[2 * c], w[2 * c + 1], 0x7632);
        }
        *reinterpret_cast<uint4*>(dst + gda_wg_at(2 * op, kb)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        *reinterpret_cast<uint4*>(dst + gda_wg_at(2 * op + 1, kb)) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    }
};
static_assert(WS / 8 * 32 == NTG, "gda_wg_plane_t: a unit a thread");

// acc += each k-step's fresh sums d[ks], in order, once the stage's products are done
__device__ __forceinline__ void gda_wg_add(float (&acc)[8][4], float (&d)[WS / 16][8][4]) {
    gda_wg_wait<0>();
    #pragma unroll
    for (int ks = 0; ks < WS / 16; ++ks) {
        gda_wg_pin<8>(d[ks]);
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r) acc[j][r] += d[ks][j][r];
    }
}

// B of the first product with PLANES (S0 or E: float32, row-major KMAX x LD, LD a multiple of
// 4, the block's 64 columns from src, omax of them inside): copied by cp.async as it is (a
// stage: WS rows of 64 floats, WF bytes) and split in shared memory
#define WF (WS * 64 * 4)
template <int KMAX, int LD>
struct gda_wg_f32_async {
    const float* src;
    int omax;
    __device__ __forceinline__ void copy(unsigned stg, int k0) const {
        #pragma unroll
        for (int i = 0; i < WS * 16 / NTG; ++i) {
            const int x = threadIdx.x + i * NTG, r = x / 16, c = x % 16;
            const bool on = k0 + r < KMAX && 4 * c < omax;
            gda_cp16_or_0(stg + 4 * (r * 64 + 4 * c), src + (on ? (long long)(k0 + r) * LD + 4 * c : 0), on);
        }
    }
    __device__ __forceinline__ void put(unsigned char* dst, const float* stg) const {
        #pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int u = threadIdx.x + i * NTG, o = u % 64, kb = u / 64, at = gda_wg_at(o, kb);
            unsigned h[4], m[4], l[4];
            #pragma unroll
            for (int c = 0; c < 4; ++c)
                gda_split3<false>(stg[(8 * kb + 2 * c) * 64 + o], stg[(8 * kb + 2 * c + 1) * 64 + o], h[c], m[c], l[c]);
            *reinterpret_cast<uint4*>(dst + at) = make_uint4(h[0], h[1], h[2], h[3]);
            *reinterpret_cast<uint4*>(dst + WTILE + at) = make_uint4(m[0], m[1], m[2], m[3]);
            *reinterpret_cast<uint4*>(dst + 2 * WTILE + at) = make_uint4(l[0], l[1], l[2], l[3]);
        }
    }
};
static_assert(WS * 16 % NTG == 0, "gda_wg_f32_async: whole copies a thread");

// acc += A B over KK inner steps, A pack's planes (gda_wg_planes), B a float32 operand
// (gda_wg_f32_async), both copied WD stages ahead by cp.async (the bytes in flight that a
// stream of S0 or E from memory needs), B split a stage ahead. sm (WG_SMEM bytes): WD + 1
// slots of A's planes, 2 of B's, WD float32 stages of B.
#define WD 3                                            // stages copied ahead
#define WA (3 * WTILE)                                  // bytes of A's planes of a stage
#define WG_SMEM ((WD + 3) * WA + WD * WF)               // dv's shared memory (chunk_bwd.DV_SMEM)
static_assert(WG_SMEM >= WRING * WSLOT, "gda_wg_gemm's slots in dv's shared memory");
template <int KK, typename LA, typename LB>
__device__ __forceinline__ void gda_wg_gemm_async(float (&acc)[8][4], const LA& A, const LB& B,
                                                  unsigned char* sm)
{
    constexpr int S = (KK + WS - 1) / WS;
    static_assert(LA::ASYNC && LA::NP == 3, "A: pack's 3 planes");
    unsigned char* sb = sm + (WD + 1) * WA;             // B's planes, 2 slots
    const float* sf = reinterpret_cast<const float*>(sb + 2 * WA);    // B's float32 stages
    const unsigned base = gda_shared_at(sm), fbase = gda_shared_at(sf);
    #pragma unroll
    for (int s = 0; s < WD; ++s) {                      // stages 0 .. WD - 1 in flight
        if (s < S) {
            A.put(sm + s * WA, s * WS, 1.f);
            B.copy(fbase + s * WF, s * WS);
        }
        gda_cp_commit();
    }
    gda_cp_wait<WD - 2>();                              // stages 0 and 1 here
    __syncthreads();
    B.put(sb, sf);
    gda_proxy_fence();
    __syncthreads();
    float d[2][8][4] = {};
    #pragma unroll 1
    for (int s = 0; s < S; ++s) {
        const unsigned at = base + s % (WD + 1) * WA, bt = gda_shared_at(sb) + s % 2 * WA;
        gda_wg_fence();
        #pragma unroll
        for (int ks = 0; ks < WS / 16; ++ks) {
            #pragma unroll
            for (int ea = 2, n = 0; ea >= 0; --ea)
                #pragma unroll
                for (int eb = 2 - ea; eb >= 0; --eb, ++n)
                    gda_wgmma_ss(d[ks], gda_wg_desc(at + ea * WTILE + 256 * ks, WC),
                                 gda_wg_desc(bt + eb * WTILE + 256 * ks, WC), n);
        }
        gda_wg_commit();
        if (s + 1 < S) B.put(sb + (s + 1) % 2 * WA, sf + (s + 1) % WD * (WF / 4));
        if (s + WD < S) {                               // into the slots stage s - 1 had
            A.put(sm + (s + WD) % (WD + 1) * WA, (s + WD) * WS, 1.f);
            B.copy(fbase + (s + WD) % WD * WF, (s + WD) * WS);
        }
        gda_cp_commit();
        gda_wg_add(acc, d);
        gda_cp_wait<WD - 2>();                          // stage s + 2's copies
        gda_proxy_fence();
        __syncthreads();
    }
}

// acc += alpha A B over KK inner steps (A: 64 x KK, B: KK x 64 of the operands' types LA, LB),
// the thread's part of the block's tile in gda_wgmma_ss's layout; sm: WG_SMEM bytes, WRING
// slots. An operand staged in registers is loaded two stages ahead and written one ahead; one
// copied by cp.async (ASYNC) is copied two ahead.
template <int KK, typename LA, typename LB>
__device__ __forceinline__ void gda_wg_gemm(float (&acc)[8][4], LA& A, LB& B, float alpha,
                                            unsigned char* sm)
{
    constexpr int S = (KK + WS - 1) / WS;
    static_assert(!LB::ASYNC, "B: staged in registers");
    const unsigned base = gda_shared_at(sm);
    A.load(0);
    B.load(0);
    A.put(sm, 0, alpha);
    B.put(sm + 3 * WTILE, 0, 1.f);
    gda_cp_commit();
    if (S > 1) {
        if (LA::ASYNC) A.put(sm + WSLOT, WS, alpha);
        else A.load(WS);
        B.load(WS);
    }
    gda_cp_commit();                                    // (empty where A is not ASYNC)
    gda_cp_wait<1>();
    gda_proxy_fence();
    __syncthreads();
    float d[2][8][4] = {};
    #pragma unroll 1
    for (int s = 0; s < S; ++s) {
        const unsigned at = base + s % WRING * WSLOT;
        gda_wg_fence();
        #pragma unroll
        for (int ks = 0; ks < WS / 16; ++ks) {
            #pragma unroll
            for (int ea = LA::NP - 1, n = 0; ea >= 0; --ea)
                #pragma unroll
                for (int eb = min(LB::NP - 1, 2 - ea); eb >= 0; --eb, ++n)
                    gda_wgmma_ss(d[ks], gda_wg_desc(at + ea * WTILE + 256 * ks, WC),
                                 gda_wg_desc(at + (3 + eb) * WTILE + 256 * ks, WC), n);
        }
        gda_wg_commit();
        unsigned char* next = sm + (s + 1) % WRING * WSLOT;   // (read two stages ago)
        if (s + 1 < S) {
            if (!LA::ASYNC) A.put(next, (s + 1) * WS, alpha);
            B.put(next + 3 * WTILE, (s + 1) * WS, 1.f);
        }
        if (s + 2 < S) {
            if (LA::ASYNC) A.put(sm + (s + 2) % WRING * WSLOT, (s + 2) * WS, alpha);
            else A.load((s + 2) * WS);
            B.load((s + 2) * WS);
        }
        gda_cp_commit();
        gda_wg_add(acc, d);
        gda_cp_wait<1>();                               // the next stage's copies
        gda_proxy_fence();
        __syncthreads();
    }
}
#endif

// 7. dv of chunk b: (k D) E + scale W do, into [B, T, H, V] in v's dtype (FWD: o of chunk b,
// (scale q A)^T S0 + scale W^T v, into dv's place). Block: (b, tile of V).
// (3 blocks an SM, 168 registers: its GEMMs take a row tile a pass (DV_RT = 1), which keeps
// their fresh sums to 16 registers; with both tiles a pass ptxas spilled at 168 and 2 blocks an
// SM took 1.15-1.25x the time, docs/perf-notes.md v26; two terms, no fresh sums, from the
// planes: 4 an SM, 128 registers, v35; from float32 rows too on sm_90, where it took big128
// bf16's dv from 0.506 to 0.459 ms (v38), but not on sm_80, where ptxas spilled 24 bytes at K =
// 64; a DV_BLOCKS given overrides it, as v35's A/B did)
#define DV_RT 1
#ifndef DV_BLOCKS
#define DV_BLOCKS (WGMMA ? 2 : DV_TERMS == 2 && (PLANES || __CUDA_ARCH__ >= 900) ? 4 : 3)
#endif
#if GDA_HAS(7)
extern "C" __global__ void __launch_bounds__(NTG, DV_BLOCKS) gda_chunk_bwd_dv(GDA_CHUNK_BWD_PARAMS)
{
    const long long b = blockIdx.x / GDA_TILES(V_DIM);
    const int n0 = blockIdx.x % GDA_TILES(V_DIM) * GN;
    GDA_CHUNK;
    if (ch.rows == 0) return;
#if WGMMA
    extern __shared__ __align__(128) unsigned char w_op[];      // WG_SMEM bytes
    float acc[8][4] = {};
    const float* e = (FWD ? st : et) + b * K_DIM * V_DIM + n0;   // S0 (FWD) or E: B of the first
    typedef gda_wg_split<K_DIM, V_DIM, false, false> eo;
    if constexpr (PLANES) {                             // q A scale (FWD) or k D as made
        const gda_planes_at pc(pl, NH * NC, b);
        gda_wg_planes<PA, BT, KP> a1{FWD ? pc.q : pc.k};
        if constexpr (V_DIM % 4 == 0) {
            gda_wg_f32_async<K_DIM, V_DIM> b1{e, V_DIM - n0};
            gda_wg_gemm_async<KP>(acc, a1, b1, w_op);
        } else {
            eo b1{e, V_DIM - n0};
            gda_wg_gemm<KP>(acc, a1, b1, 1.f, w_op);
        }
        gda_wg_split<BT, BT, !FWD, false> a2{ww + b * BT * BT, BT};    // W^T (FWD) or W
        gda_wg_plane_t<VP> b2{(FWD ? pc.v : pc.d) + n0};
        gda_wg_gemm<BT>(acc, a2, b2, scale, w_op);
    } else {
        gda_wg_split<K_DIM, K_DIM, true, false> a1{kd + b * BT * K_DIM, BT};
        eo b1{e, V_DIM - n0};
        gda_wg_gemm<K_DIM>(acc, a1, b1, 1.f, w_op);
        gda_wg_split<BT, BT, true, false> a2{ww + b * BT * BT, BT};
        gda_wg_split<BT, V_DIM, false, GDA_VX> b2{dp + b * BT * V_DIM + n0, V_DIM - n0};
        gda_wg_gemm<BT>(acc, a2, b2, scale, w_op);
    }
    const int row = threadIdx.x / 32 * 16 + threadIdx.x % 32 / 4, col = n0 + threadIdx.x % 4 * 2;
    #pragma unroll
    for (int j = 0; j < 8; ++j)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            if (row + 8 * h < ch.rows) {
                const int c = col + 8 * j;
                if (c < V_DIM) dv[ch.at(row + 8 * h, V_DIM, c)] = io::store(acc[j][2 * h]);
                if (c + 1 < V_DIM) dv[ch.at(row + 8 * h, V_DIM, c + 1)] = io::store(acc[j][2 * h + 1]);
            }
#else
    __shared__ __align__(16) unsigned b_op[GDA_GEMM_SMEM / 4];
    float acc[2][4][4] = {};
    const float* e = et + b * K_DIM * V_DIM;
    constexpr int NT = DV_TERMS;                        // (the first NT of pack's planes)
    if constexpr (FWD) {                                // o = (scale q A)^T S0 + scale W^T v
        const gda_planes_at pc(pl, NH * NC, b);
        typedef gda_gemm_ops<BT, V_DIM, K_DIM, false, false, false, false, NT> qs;
        typedef gda_gemm_ops<BT, V_DIM, BT, true, false, false, GDA_VX, NT> wv;
        gda_gemm_of<BT, V_DIM, K_DIM, false, false, gda_plane_operand<BT, K_DIM, KP, false, NT>,
                    typename qs::B, DV_RT, NT>(acc, pc.q, st + b * K_DIM * V_DIM, 1.f, 0, n0, b_op);
        gda_gemm_of<BT, V_DIM, BT, false, GDA_VX, typename wv::A,
                    gda_plane_operand<BT, V_DIM, VP, true, PB>, DV_RT, NT>(
            acc, ww + b * BT * BT, pc.v, scale, 0, n0, b_op);
    } else if constexpr (PLANES) {                      // k D's terms and do as made
        const gda_planes_at pc(pl, NH * NC, b);
        typedef gda_gemm_ops<BT, V_DIM, K_DIM, false, false, false, false, NT> ke;
        typedef gda_gemm_ops<BT, V_DIM, BT, false, false, false, GDA_VX, NT> wd;
        gda_gemm_of<BT, V_DIM, K_DIM, false, false, gda_plane_operand<BT, K_DIM, KP, false, NT>,
                    typename ke::B, DV_RT, NT>(acc, pc.k, e, 1.f, 0, n0, b_op);
        gda_gemm_of<BT, V_DIM, BT, false, GDA_VX, typename wd::A,
                    gda_plane_operand<BT, V_DIM, VP, true, PB>, DV_RT, NT>(
            acc, ww + b * BT * BT, pc.d, scale, 0, n0, b_op);
    } else {
        gda_gemm<BT, V_DIM, K_DIM, false, false, false, false, DV_RT, NT>(
            acc, kd + b * BT * K_DIM, e, 1.f, 0, n0, b_op);
        gda_gemm<BT, V_DIM, BT, false, false, false, GDA_VX, DV_RT, NT>(
            acc, ww + b * BT * BT, dp + b * BT * V_DIM, scale, 0, n0, b_op);
    }
    gda_gemm_put<BT>(acc, 0, n0, [=](int t, int j, float x0, float x1) {
        if (t < ch.rows) {
            if (j < V_DIM) dv[ch.at(t, V_DIM, j)] = io::store(x0);
            if (j + 1 < V_DIM) dv[ch.at(t, V_DIM, j + 1)] = io::store(x1);
        }
    });
#endif
}
#endif

// 8. FWD with TERMS = 2 (a forward that keeps nothing): the scan's forward half and o (dv's
// entry) as one kernel, so no chunk's S0 goes through memory (docs/perf-notes.md, v38). Block:
// (sequence-head nh, FV value columns at n0), 8 warps holding the tile's state S^T (FV value
// rows x KP keys, float32) as mma accumulators: warp w its rows 16 (w % 4).., keys KH (w / 4)..,
// KH / 8 tiles, KH / 2 registers a thread. A chunk's operands come in two slots copied by
// cp.async, each while the other's products run (A: scale q A's two planes, v's plane of the
// block's columns, W; B: k D's two planes, A_end):
//   o^T = scale W^T v + S^T (scale q A)^T: W split here (scale W's h, m) against v's exact
//         plane, the key halves taking half of W's k-steps each; S^T split into h + m a k-step
//         at a time, an A fragment straight from the accumulators (the C layout is the A
//         layout), against q A's planes by ldmatrix (m h, h m, h h, as gda_gemm_chain's two
//         terms); the two key halves' sums meet in shared memory, and o goes out transposed, 8
//         value columns (16 bytes) a thread;
//   S^T = S^T diag(A_end) + v^T (k D): the guard on S0 first (as the scan's), then v exact
//         against k D's two planes, into fresh sums of 4 tiles added after.
// With SCAN_O_WG (sm_90a, v39) the same work, each key half a warpgroup, runs its products by
// wgmma: A (S^T's split, v^T) from registers as above, B from shared memory, where q A's and
// k D's planes land in wgmma's layouts without swizzle (core matrices of 8 rows of 16 bytes,
// 128 contiguous bytes; q A K-major: n the step, k the key; k D MN-major: n the key, k the
// step) and W is split into its h, m planes there (gda_wg_split_b) once a chunk (W_SPLIT, v58:
// scores split it, the producer copies its planes, the odd chunks' into W's room): o^T's
// products are one chain of m64n64k16 a warpgroup, v^T (k D) two of fresh sums (64 keys each).
// With SCAN_O_WG and three terms (v41) it also stores each chunk's S0 to st (from the
// accumulators, before the chunk's update), k D's three planes in the update (S0 exact to
// float32, as the scan's): in the forward that keeps its stages with o (from q A's h, m planes,
// W in two terms; the second key half's o^T through shared memory, the first's added there), and
// in a backward with SCAN_DV without o (slot A: v alone), in place of the scan's forward half;
// so the kept S0 and the backward's own are one code's, bit for bit.
// With SCAN_O_MC (v42; the wgmma form that keeps nothing) a sequence-head's TN = VP / FV blocks
// (2, 4 or 8) run as a cluster, so that a chunk's planes of q A and k D, the same for all of
// them, are read from L2 once, not TN times: pack writes them as they lie in shared memory
// (gda_plane_at), and each block's thread 0 copies its rank's TN-th of a chunk's into every
// block at once (cp.async.bulk multicast), each slot behind two mbarriers a block: full (its
// bytes landed) and empty (every block of the cluster done with its last chunk: TN arrivals).
// The same bytes land as without, and the same products run: o bit for bit the form's without.
// With SCAN_O_PRODUCER (v49; the mma.sync form on sm_90 on) SCAN_O_PRODUCER warps more (2 above
// 128 keys, 4 at 128 or fewer) copy each chunk's slots by cp.async, on mbarriers: full (its
// bytes landed: each producer thread's cp.async arrival and a plain one for its stores) and
// read (the 8 warps of the products done with it: 8 arrivals); those 8 warps issue no copies
// and meet on a named barrier of their own. The same products: o bit for bit the form's without.
// Launched (chunk_bwd.ForwardPlan) in place of the scan and dv where chunk_bwd.scan_o_fits:
// USE_SCAN_O, its shared memory (scan_o_smem, checked here) and its blocks fill the device;
// with SCAN_O_WG also by the ForwardPlan that keeps its stages and by BackwardPlan (before
// scores and scan_dv); in every other build its body is empty.
#define FV 64                                           // value columns a block
#define NTF 256                                         // threads: 4 row groups x 2 key halves
#define KH (KP / 2)                                     // key columns a warp
#define FVL (FV + 8)                                    // halves a staged row of v (padded:
#define FWL (BT + 4)                                    //   ldmatrix's 8 rows in distinct
#define FOL (BT + 8)                                    //   banks), floats of W, o^T's halves
                                                        //   (+ 8: gda_fo_halves' float2 rows)
#define FQS (KP * 16)                                   // (SCAN_O_WG, SCAN_DV) bytes between 8
#define FKS (BT * 16)                                   //   steps' cores of a K-major plane, 8
#define FPB (BT * KP * 2)                               //   keys' of an MN-major one; a plane
#if SCAN_O_WG
#define FO_O FWD                                        // o made (a forward; a backward: S0 alone)
#define FO_S0 (TERMS == 3)                              // each chunk's S0 stored (kept, or the backward's)
#define FO_HALVES (TERMS == 2 ? 2 : 1)                  // o^T's key halves in shared memory
#define FO_BYTES (FO_O * (2 * FPB + 4 * BT * BT + 4 * BT * FWL + 4 * FO_HALVES * FV * FOL) \
                  + TERMS * FPB + 2 * BT * FVL + 4 * KP + 1024)   // (+ the planes' alignment)
#else
#define FQL (KP + 8)                                    // halves a staged row of q A, k D
#define FO_BYTES (2 * (4 * BT * FQL + BT * FVL) + 4 * (BT * FWL + KP + 2 * FV * FOL))
#endif
// (SCAN_O_PRODUCER, sm_90: perf-notes v49; the wgmma form's too, not as clusters: v52)
// SCAN_O_PRODUCER warps more copy each chunk's operands into the slots by cp.async, on an
// mbarrier a slot full and one a slot read; the 8 warps of the products issue no copies
#define FO_PRODUCER (SCAN_O_PRODUCER && !SCAN_O_MC && __CUDA_ARCH__ >= 900)
#define FO_PT (FO_PRODUCER ? 32 * SCAN_O_PRODUCER : 0)  // the producer's threads
// (SCAN_O_WG, not as clusters) q A's and k D's planes in the 128-byte swizzle: a plane's 64-key
// panels of BT rows of 128 bytes, each row's 16-byte pieces at piece ^ row % 8, so that a
// 128-byte line of a plane's row lands in one row of shared memory (v52: wgmma's layout without
// a swizzle, each 16 bytes of a line 128 bytes or 1 KB from the next, cost the copies one L2
// sector and one shared wavefront a lane; the clusters' bulk copies keep pack's such layout)
#define FO_SW (SCAN_O_WG && !SCAN_O_MC)
// (the wgmma form with the producer: a warpgroup of it, 4 warps, its registers given to the
// products' two warpgroups, which hold S^T, o^T and a chain's sums in wgmma's accumulators:
// 168 a thread at 384 threads spilled; setmaxnreg, sm_90a; 56 for the producer spilled 8
// bytes at K = 100 once it copied in FO_SW's order)
#define FO_REGS_PRODUCER 64
#define FO_REGS_PRODUCTS 216
// (the wgmma form with the producer) a chunk's v and W read by the products once they are split
// into v^T's fragments and W's planes, the chunk's first step: the producer copies the next
// chunk's there while this chunk's o runs, behind a third mbarrier (read-vw), so that slot A's
// copy, which the state update covers, is q A's planes alone (v54: the products waited 11 % of
// their samples on slot A)
#define FO_EARLY (FO_PRODUCER && SCAN_O_WG)
#if SCAN_O_MC                                           // a cluster: a sequence-head's value tiles
#define GDA_SCAN_O_CLUSTER __cluster_dims__(VP / FV, 1, 1)
#else
#define GDA_SCAN_O_CLUSTER
#endif

__device__ __forceinline__ void gda_cp4_at(unsigned dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src) : "memory");
}

// scan_o's and scan_dv's cp.async of chunk b's A_end (K floats of ae) into sa (by NT threads,
// this one tid of them, as in each stage helper below)
template <int NT = NTF>
__device__ __forceinline__ void gda_stage_ae(float* sa, const float* ae, long long b, unsigned tid) {
    for (int i = tid; i < K_DIM; i += NT)
        gda_cp4_at(gda_shared_at(sa + i), ae + b * K_DIM + i);
}

// scan_o's and scan_dv's cp.async of chunk b's W (of ww) into sw (rows FWL apart)
template <int NT = NTF>
__device__ __forceinline__ void gda_stage_w(float* sw, const float* ww, long long b, unsigned tid) {
    const unsigned d = gda_shared_at(sw);
    const float* const w = ww + b * BT * BT;
    gda_grid_each_at<BT, BT / 4, NT>(tid, [&](int r0, int dr, int c) {
        gda_cp16_at(d + 4 * (r0 * FWL + 4 * c) + 4 * dr * FWL, w + r0 * BT + 4 * c + dr * BT);
    });
}

// (W_SPLIT, W_SPLIT_DV) scan_o's or scan_dv's producer's cp.async of chunk b's W as scores left
// it (scale W's h, m planes, gda_wg_split_b) into dst (a shared address), as it lies: 16 bytes
// a copy
template <int NT>
__device__ __forceinline__ void gda_stage_w_split(unsigned dst, const float* ww, long long b,
                                                  unsigned tid) {
    static_assert(BT * BT / 4 % NT == 0, "W's planes: as many 16-byte copies a thread");
    const float* const w = ww + b * BT * BT + 4 * tid;
    #pragma unroll
    for (int i = 0; i < BT * BT / 4 / NT; ++i)
        gda_cp16_at(dst + 16 * (tid + i * NT), w + 4 * i * NT);
}

// scan_o's and scan_dv's cp.async of a chunk's FV columns from n0 of a plane of v or do (src,
// rows VP apart) into dst (rows FVL apart) and (W) of its W (gda_stage_w)
template <bool W = true, int NT = NTF>
__device__ __forceinline__ void gda_stage_vw(unsigned short* dst, const unsigned short* src, int n0,
                                             float* sw, const float* ww, long long b, unsigned tid) {
    const unsigned d = gda_shared_at(dst);
    gda_grid_each_at<BT, FV / 8, NT>(tid, [&](int r0, int dr, int c) {
        gda_cp16_at(d + 2 * (r0 * FVL + 8 * c) + 2 * dr * FVL,
                    src + (long long)r0 * VP + n0 + 8 * c + dr * VP);
    });
    if constexpr (W) gda_stage_w<NT>(sw, ww, b, tid);
}

// (VROWS) scan_o's copy of a chunk's (cb's) rows of v, FV columns from n0, from v itself into dst
// (rows FVL apart), 0 past its rows and past V: by cp.async where v is 16-byte aligned (V is a
// multiple of 8, so every row is), else 8 loads and one store a thread an item
template <int NT = NTF>
__device__ __forceinline__ void gda_stage_v_rows(unsigned short* dst, const io::t* v,
                                                 const gda_chunk_at& cb, int n0, unsigned tid) {
    const unsigned d = gda_shared_at(dst);
    const bool aligned = (reinterpret_cast<unsigned long long>(v) & 15) == 0;
    gda_grid_each_at<BT, FV / 8, NT>(tid, [&](int r0, int dr, int c) {
        const int r = r0 + dr, col = n0 + 8 * c;
        const bool on = r < cb.rows && col < V_DIM;
        const io::t* const src = v + (on ? cb.at(r, V_DIM, col) : 0);
        if (aligned) {
            gda_cp16_or_0(d + 2 * (r * FVL + 8 * c), src, on);
        } else {
            unsigned y[4] = {};
            #pragma unroll
            for (int i = 0; i < 4 && on; ++i)
                y[i] = reinterpret_cast<const unsigned short*>(src)[2 * i]
                       | (unsigned)reinterpret_cast<const unsigned short*>(src)[2 * i + 1] << 16;
            *reinterpret_cast<uint4*>(dst + r * FVL + 8 * c) = make_uint4(y[0], y[1], y[2], y[3]);
        }
    });
}

// (VROWS) the guard's running max of |v| over a warp's fragments of v^T (m: two bfloat16, whose
// magnitudes' bits the masks keep; a NaN stays), k-steps sg with sg % 2 == kh (every k-step in
// the first half where there is one): the two halves' warps see every element of the chunk's
// rows once
__device__ __forceinline__ void gda_fv_absmax(unsigned& m, const unsigned (&fv)[NBK][4], int kh) {
    #pragma unroll
    for (int sg = 0; sg < NBK; ++sg) {
        if ((NBK == 1 ? 0 : sg % 2) != kh) continue;
        #pragma unroll
        for (int x = 0; x < 4; ++x)
            asm("max.NaN.bf16x2 %0, %0, %1;" : "+r"(m) : "r"(fv[sg][x] & 0x7fff7fffu));
    }
}

// o (scan_o) or dv (scan_dv) of a chunk's rows (ch) at value columns n0.. into out, from the
// sum of HALVES arrays of o^T [FV][FOL] at so (FV apart): 8 value columns (16 bytes) a thread,
// a warp's steps consecutive.
template <int HALVES>
__device__ __forceinline__ void gda_fo_store(const float* so, const gda_chunk_at& ch, int n0,
                                             io::t* out) {
    for (int x = threadIdx.x; x < BT * FV / 8; x += NTF) {
        const int t = x % BT, v8 = x / BT * 8;
        if (t >= ch.rows || n0 + v8 >= V_DIM) continue;
        unsigned short y[8];
        #pragma unroll
        for (int i = 0; i < 8; ++i)
            y[i] = io::store(HALVES == 2 ? so[(v8 + i) * FOL + t] + so[(FV + v8 + i) * FOL + t]
                                         : so[(v8 + i) * FOL + t]);
        io::t* dst = out + ch.at(t, V_DIM, n0 + v8);
        if (V_DIM % 8 == 0) {
            gda_st16(dst, y[0] | (unsigned)y[1] << 16, y[2] | (unsigned)y[3] << 16,
                     y[4] | (unsigned)y[5] << 16, y[6] | (unsigned)y[7] << 16);
        } else {
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                if (n0 + v8 + i < V_DIM) reinterpret_cast<unsigned short*>(dst)[i] = y[i];
        }
    }
}

// a warpgroup's o^T (scan_o) or dv^T (scan_dv), its sums o over its key half kh, into so
// ([FV][FOL] an array; the thread's rows row, row + 8): HALVES 2, each half its own array (FV
// apart); 1, the second half's, then the first adds its own in place, a barrier between (the
// block's, or NAMED: named barrier 1 of the NTF threads of the products; the caller's next
// barrier comes before so is read)
template <int HALVES, bool NAMED = false>
__device__ __forceinline__ void gda_fo_halves(float* so, const float (&o)[BT / 8][4], int kh, int row,
                                              int tq) {
    if (HALVES == 2 || kh == 1)
        #pragma unroll
        for (int j = 0; j < BT / 8; ++j) {
            float* p = so + ((HALVES == 2 ? kh * FV : 0) + row) * FOL + 8 * j + 2 * tq;
            *reinterpret_cast<float2*>(p) = make_float2(o[j][0], o[j][1]);
            *reinterpret_cast<float2*>(p + 8 * FOL) = make_float2(o[j][2], o[j][3]);
        }
    if constexpr (HALVES == 1) {
        if (NAMED) gda_bar_sync(1, NTF);
        else __syncthreads();
        if (kh == 0)
            #pragma unroll
            for (int j = 0; j < BT / 8; ++j) {
                float* p = so + row * FOL + 8 * j + 2 * tq;
                p[0] += o[j][0];
                p[1] += o[j][1];
                p[8 * FOL] += o[j][2];
                p[8 * FOL + 1] += o[j][3];
            }
    }
}

#if SCAN_O_WG || SCAN_DV
// The products by wgmma of scan_o (SCAN_O_WG) and scan_dv, a warpgroup's (its key half kh).
// o^T += W's k-steps of this half (A: f, the half's from f[kh NBK / 2]; B: W's h, m planes at
// w, K-major, 16 BT bytes between 8 rows' cores) + x^T P^T (A: the state x^T split into h + m
// a k-step, the C layout being the A layout; B: the K-major planes h, m at p, FQS between 8
// steps' cores, FPB apart; SW: in the 128-byte swizzle, panels of 64 keys BT rows of 128
// bytes each, p the half's first; m h, h m, h h): one chain, committed, waited for. x^T is
// split while W's products run (a second fence before its own: v59).
template <bool SW = false>
__device__ __forceinline__ void gda_wg_o(float (&o)[8][4], const float (&x)[KH / 8][4],
                                         const unsigned (&f)[NBK][4], int kh, unsigned w, unsigned p)
{
    unsigned aw[NBK / 2][4];                            // this half's of f (selected, not branched
    #pragma unroll                                      //  on: ptxas serializes a wgmma in a
    for (int i = 0; i < NBK / 2; ++i)                   //  branch it cannot prove uniform)
        #pragma unroll
        for (int r = 0; r < 4; ++r) aw[i][r] = kh ? f[NBK / 2 + i][r] : f[i][r];
    w += kh * NBK / 2 * 256;
    gda_wg_pin<8>(o);
    gda_wg_fence();
    #pragma unroll
    for (int i = 0; i < NBK / 2; ++i) {
        gda_wgmma_rs<0>(o, aw[i], gda_wg_desc(w + 2 * BT * BT + 256 * i, 16 * BT), 1);
        gda_wgmma_rs<0>(o, aw[i], gda_wg_desc(w + 256 * i, 16 * BT), 1);
    }
    unsigned ah[KH / 16][4], am[KH / 16][4];            // x^T's A fragments, every k-step
    #pragma unroll
    for (int kk = 0; kk < KH / 16; ++kk)
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            gda_split2<false>(x[2 * kk + i / 2][2 * (i % 2)], x[2 * kk + i / 2][2 * (i % 2) + 1],
                              ah[kk][i], am[kk][i]);
    gda_wg_fence();                                     // (ah, am written: before their products)
    const auto q = [&](int kk, int e) {                 // k-step kk of plane e (0: h, 1: m)
        return SW ? gda_wg_desc_sw(p + e * FPB + kk / 4 * BT * 128 + kk % 4 * 32, 1024)
                  : gda_wg_desc(p + e * FPB + 256 * kk, FQS);
    };
    #pragma unroll
    for (int kk = 0; kk < KH / 16; ++kk) {
        gda_wgmma_rs<0>(o, am[kk], q(kk, 0), 1);
        gda_wgmma_rs<0>(o, ah[kk], q(kk, 1), 1);
        gda_wgmma_rs<0>(o, ah[kk], q(kk, 0), 1);
    }
    gda_wg_commit();
    gda_wg_wait<0>();
    gda_wg_pin<8>(o);
}

// x^T += f^T B over k-steps sg0 .. sg1 - 1 (A: f[sg]; B: the P MN-major planes at base, FKS
// between 8 keys' cores, FPB apart, the small terms first; SW: in the 128-byte swizzle, as
// gda_wg_o's): a chain of fresh sums a 64 keys (KH / 64 of them in d, whatever d held: the
// first product does not add; one wgmma group each), each put into x as its group ends (the
// first while the second runs) as x = put(j, r, x, d) for x's element r of tile j; between()
// runs once all are issued, before the first wait (scan_o: the guard on S0 and o's store while
// the products run, v59)
template <int P, bool SW = false, typename B, typename U>
__device__ __forceinline__ void gda_wg_state(float (&x)[KH / 8][4], const unsigned (&f)[NBK][4],
                                             unsigned base, int sg0, int sg1, float (&d)[KH / 64][8][4],
                                             B between, U put)
{
    #pragma unroll
    for (int h = 0; h < KH / 64; ++h) gda_wg_pin<8>(d[h]);
    gda_wg_fence();
    #pragma unroll
    for (int h = 0; h < KH / 64; ++h) {
        #pragma unroll
        for (int sg = sg0; sg < sg1; ++sg)
            #pragma unroll
            for (int e = P - 1; e >= 0; --e)
                gda_wgmma_rs<1>(d[h], f[sg],
                                SW ? gda_wg_desc_sw(base + h * BT * 128 + e * FPB + sg * 2048, 1024)
                                   : gda_wg_desc(base + 8 * h * FKS + e * FPB + 256 * sg, FKS),
                                sg != sg0 || e != P - 1);
        gda_wg_commit();
    }
    between();
    #pragma unroll
    for (int h = 0; h < KH / 64; ++h) {
        if (h + 1 < KH / 64) gda_wg_wait<1>();          // (at most two chains: KH <= 128)
        else gda_wg_wait<0>();
        gda_wg_pin<8>(d[h]);
        #pragma unroll
        for (int i = 0; i < 8; ++i)
            #pragma unroll
            for (int r = 0; r < 4; ++r) x[8 * h + i][r] = put(8 * h + i, r, x[8 * h + i][r], d[h][i][r]);
    }
}
#endif

// cp.async of np planes [np * BT][KP] (halves) at src into FO_SW's layout at dst (scan_o's q A
// planes K-major for wgmma, k D's MN-major, scan_dv's the other way round: the same rows;
// SCAN_O_MC's lie as gda_plane_at's, copied as they are) by thread tid of NW warps: row r's 8
// keys from c8 (16 bytes) to
//   r / BT * FPB + c8 / 64 * BT * 128 + r % BT * 128 + (c8 / 8 % 8 ^ r % 8) * 16.
// Each 8 lanes a row's 128-byte line (into one row of shared memory, all 32 banks), a warp 4
// rows, a thread's rows of a plane r0 + d, with r0 < STEP = NW / LINES * 4 (4, or a multiple of
// 8, dividing BT) and d a multiple of STEP: so r % BT = r0 + d and r % 8 = r0 % 8 ^ d % 8 (d % 8
// is 0, or 4 where STEP is 4), and a thread's copies of a plane are two shared addresses and a
// global one, each plus constants (the copies' immediates): v57, where the division,
// remainders and 64-bit sums of each copy's addresses were 25 instructions a copy, most of the
// producer's. (The planes' loop is not unrolled, so that no copy's address is invariant over a
// block's chunks: hoisted out of them, the producer's 64 registers would not hold them all.)
// With PLANES_PANELS the planes lie so already: each copied as it lies, 16 bytes a thread in
// turn (v75).
template <int NW>
__device__ __forceinline__ void gda_wg_copy_planes(int tid, int np, unsigned dst, const unsigned short* src) {
    if constexpr (PLANES_PANELS) {
        static_assert(BT * KP / 8 % (32 * NW) == 0, "gda_wg_copy_planes: whole rounds of pieces");
        #pragma unroll 1
        for (int p = 0; p < np; ++p, dst += FPB, src += BT * KP)
            #pragma unroll
            for (int x = tid; x < BT * KP / 8; x += 32 * NW)
                gda_cp16_at(dst + 16 * x, src + 8 * x);
        return;
    }
    constexpr int LINES = KP / 64, STEP = NW / LINES * 4;   // a row's lines; rows between a thread's
    static_assert(KP % 64 == 0 && NW % LINES == 0 && BT % STEP == 0 && (STEP == 4 || STEP % 8 == 0),
                  "gda_wg_copy_planes: whole lines, rows 4 or a multiple of 8 apart");
    const int lane = tid % 32, w = tid / 32;
    const int c8 = (w % LINES * 8 + lane % 8) * 8, r0 = w / LINES * 4 + lane / 8;
    const unsigned sw = (c8 / 8 % 8 ^ r0 % 8) * 16;
    unsigned at = dst + c8 / 64 * BT * 128 + r0 * 128;  // (a plane's first row of the thread's)
    const unsigned short* s = src + r0 * KP + c8;
    #pragma unroll 1
    for (int p = 0; p < np; ++p, at += FPB, s += BT * KP) {
        const unsigned at0 = at + sw, at4 = at + (sw ^ 64);  // (rows r0 % 8 and r0 % 8 ^ 4)
        #pragma unroll
        for (int d = 0; d < BT; d += STEP)
            gda_cp16_at((d % 8 ? at4 : at0) + d * 128, s + d * KP);
    }
}

// f(j, r, key, col) for each of a thread's elements of S^T in scan_o, element r of tile j: S's
// (key, col) in [K][V] (key0, col0: the thread's first)
template <typename F>
__device__ __forceinline__ void gda_so_each(int key0, int col0, const F& f) {
    #pragma unroll
    for (int j = 0; j < KH / 8; ++j)
        #pragma unroll
        for (int r = 0; r < 4; ++r) f(j, r, key0 + 8 * j + (r & 1), col0 + 8 * (r >> 1));
}

// scan_o's S^T or scan_dv's E^T, the thread's elements x, from a state [K][V] at src (0 where
// src is null, and past K or V)
__device__ __forceinline__ void gda_so_get(float (&x)[KH / 8][4], const float* src, int key0, int col0) {
    gda_so_each(key0, col0, [&](int j, int r, int key, int col) {
        x[j][r] = src && key < K_DIM && col < V_DIM ? src[(long long)key * V_DIM + col] : 0.f;
    });
}

// the thread's elements x into a state [K][V] at dst (those inside K and V; KEYS false: every
// key is, K being KP)
template <bool KEYS = true>
__device__ __forceinline__ void gda_so_put(const float (&x)[KH / 8][4], float* dst, int key0, int col0) {
    gda_so_each(key0, col0, [&](int j, int r, int key, int col) {
        if ((!KEYS || key < K_DIM) && col < V_DIM) dst[(long long)key * V_DIM + col] = x[j][r];
    });
}

// the guard's running max of |x| over the thread's elements (m: checked against
// GDA_BWD_STATE_MAX once, at the end; a NaN stays), then x diag(a)
__device__ __forceinline__ void gda_so_decay(float (&x)[KH / 8][4], const float* a, int key0, float& m) {
    gda_so_each(key0, 0, [&](int j, int r, int key, int) {
        gda_absmax(m, x[j][r]);
        x[j][r] *= a[key];
    });
}

#if GDA_HAS(8)
extern "C" __global__ void __launch_bounds__(NTF + FO_PT, 1) GDA_SCAN_O_CLUSTER
gda_chunk_bwd_scan_o(GDA_CHUNK_BWD_PARAMS)
{
#if (FWD && TERMS == 2) || SCAN_O_WG
    static_assert(KH % 16 == 0 && KP <= 256, "scan_o: at most 256 keys, halves of whole k-steps");
    static_assert(FV == PT, "scan_o: a block a tile of v's plane");
    extern __shared__ __align__(16) unsigned char f_sm[];
#if SCAN_O_WG
    static_assert(KH % 64 == 0, "SCAN_O_WG: v^T (k D) in fresh sums of 64 keys");
    static_assert(!FO_S0 || K_DIM == KP, "SCAN_O_WG, three terms: whole key tiles (K = KP)");
    unsigned char* const sq = f_sm + ((0u - gda_shared_at(f_sm)) & 1023);   // scale q A's h, m [2][FPB]
                                                                         //  (1,024-byte aligned)
    unsigned char* const sk = sq + FO_O * 2 * FPB;                       // k D [TERMS][FPB]
    unsigned char* const sp = sk + TERMS * FPB;                          // scale W's h, m
    unsigned short* const sv = reinterpret_cast<unsigned short*>(sp + FO_O * 4 * BT * BT);  // v [BT][FVL]
#else
    unsigned short* const sq = reinterpret_cast<unsigned short*>(f_sm);  // scale q A [2][BT][FQL]
    unsigned short* const sk = sq + 2 * BT * FQL;                        // k D [2][BT][FQL]
    unsigned short* const sv = sk + 2 * BT * FQL;                        // v [BT][FVL]
    const unsigned sq_at = gda_shared_at(sq), sk_at = gda_shared_at(sk);  // (their addresses:
    const auto at_q = [&](int r, int c8) { return sq_at + 2 * (r * FQL + c8); };   //  one a
    const auto at_k = [&](int r, int c8) { return sk_at + 2 * (r * FQL + c8); };   //  thread
#endif                                                                   //  plus constants)
#if SCAN_O_WG
    float* const sw = reinterpret_cast<float*>(sv + BT * FVL);           // W [BT][FWL] (FO_O)
    float* const sa = sw + FO_O * BT * FWL;                              // A_end [KP]
    float* const so = sa + KP;                                   // o^T's halves [FO_HALVES][FV][FOL]
#else
    float* const sw = reinterpret_cast<float*>(sv + BT * FVL);           // W [BT][FWL]
    float* const sa = sw + BT * FWL;                                     // A_end [KP]
    float* const so = sa + KP;                                           // o^T's halves [2][FV][FOL]
#endif
    const unsigned sv_at = gda_shared_at(sv);
#if W_SPLIT
    // chunk c's W planes (scores', as they lie): in sp for an even c, in sw's room for an odd
    // one (17,408 bytes, 16-byte aligned), so that the producer copies the next chunk's while
    // this chunk's o reads its own; a chunk's o by wgmma is done before the next chunk starts
    static_assert(FO_PRODUCER && FO_O && FWL >= BT,
                  "W_SPLIT: scan_o's wgmma form with its producer warpgroup, o made");
    const auto wsplit = [&](long long c) { return gda_shared_at((c & 1) ? (void*)sw : (void*)sp); };
#endif
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < FO_BYTES) __trap();                       // (the launcher's scan_o_smem is wrong)
    constexpr int TN = VP / FV;
#if SCAN_O_MC
    // The cluster (the sequence-head's TN blocks) shares each chunk's planes of q A and k D:
    // each block's thread 0 copies its rank's part of them (pack wrote them as they lie here)
    // into every block's slot at once (one bulk copy multicast), after every block has read
    // the slot's last chunk (an arrival from each on its empty barrier); a block waits for a
    // chunk's whole planes on its full barrier (the parts' bytes land on it).
    static_assert(TN == 2 || TN == 4 || TN == 8, "SCAN_O_MC: clusters of 2, 4 or 8 value tiles");
    constexpr unsigned short MC_MASK = (1 << TN) - 1;
    constexpr unsigned MC_QB = 2 * FPB / TN, MC_KB = TERMS * FPB / TN;   // a rank's bytes of q A's,
    static_assert(MC_QB % 16 == 0 && MC_KB % 16 == 0, "SCAN_O_MC: parts of whole 16 bytes");  // k D's
    __shared__ __align__(8) unsigned long long f_bar[4];
    const unsigned bar_fa = gda_shared_at(f_bar), bar_fb = bar_fa + 8;   // full: slot A's, B's
    const unsigned bar_ea = bar_fa + 16, bar_eb = bar_fa + 24;           // empty: read by all
    const unsigned rank = gda_cluster_rank();
    unsigned ranks;
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(ranks));
    if (ranks != TN) __trap();                          // (launched without its cluster)
    if (threadIdx.x == 0) {
        gda_mbar_init(bar_fa, 1);
        gda_mbar_init(bar_fb, 1);
        gda_mbar_init(bar_ea, TN);
        gda_mbar_init(bar_eb, TN);
        gda_mbar_init_fence();
    }
    gda_cluster_sync();
    // thread 0: chunk c's part of this rank, part bytes of planes at src, into every block's dst
    // (all TN parts on the full barrier), once all have read chunk c - 1's (the empty barrier)
    const auto share = [&](long long c, unsigned empty, unsigned full, unsigned char* dst,
                           const unsigned short* src, unsigned part) {
        if (threadIdx.x != 0) return;
        if (c > 0) gda_mbar_wait(empty, (unsigned)(c - 1) & 1);
        gda_mbar_expect(full, TN * part);
        gda_bulk_multicast(gda_shared_at(dst) + rank * part,
                           reinterpret_cast<const unsigned char*>(src) + rank * part, part, full,
                           MC_MASK);
    };
#endif
    const long long nh = blockIdx.x / TN, NB = NH * NC;
    const int n0 = blockIdx.x % TN * FV;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g8 = lane / 4, tq = lane % 4;
    const int vr = warp % 4 * 16, kh = warp / 4, kb = kh * KH;
    const long long cend = coff ? coff[N] : NC;        // the sequence-head's chunks with rows
    for (int i = K_DIM + threadIdx.x; i < KP; i += NTF) sa[i] = 1.f;   // (keys past K: 0 stays 0)
#if FO_PRODUCER
    // full: slot A's (B's) bytes of a chunk landed (2 FO_PT arrivals: each producer thread's as
    // its cp.async land and once more for its plain stores; PLANES_PANELS: and the planes' bulk
    // copies' bytes);
    // read: slot A (B) of a chunk read by the 8 warps of the products (an arrival each)
    // (FO_EARLY) read-vw: a chunk's v and W in shared memory read (an arrival a warp)
    if (blockDim.x != NTF + FO_PT) __trap();            // (the launcher's threads are wrong)
    __shared__ __align__(8) unsigned long long f_bar[5];
    const unsigned bar_fa = gda_shared_at(f_bar), bar_fb = bar_fa + 8;
    const unsigned bar_ra = bar_fa + 16, bar_rb = bar_fa + 24, bar_rw = bar_fa + 32;
    if (threadIdx.x == 0) {
        gda_mbar_init(bar_fa, 2 * FO_PT);
        gda_mbar_init(bar_fb, 2 * FO_PT);
        gda_mbar_init(bar_ra, NTF / 32);
        gda_mbar_init(bar_rb, NTF / 32);
        gda_mbar_init(bar_rw, NTF / 32);
        gda_mbar_init_fence();
    }
    __syncthreads();
    if (warp >= NTF / 32) {                             // the producer: every chunk's slots
        const unsigned pt = threadIdx.x - NTF;
#if SCAN_O_WG
        static_assert(FO_PT == 128, "SCAN_O_WG's producer: one warpgroup (setmaxnreg's unit)");
        static_assert(2 * 128 * FO_REGS_PRODUCTS + 128 * FO_REGS_PRODUCER <= 65536, "registers");
        static_assert(FO_HALVES == 2, "SCAN_O_WG's producer: o^T's halves apart (no block barrier)");
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(FO_REGS_PRODUCER));
        // a chunk's two planes of q A (kd false) or k D at src into FO_SW's layout (rows r:
        // plane * BT + step; in gda_wg_copy_planes' order, as stage_planes copies them), their
        // bytes landing on bar; PLANES_PANELS: as they lie, a bulk copy a 64-key panel by the
        // producer's first thread, its bytes added to bar's phase (the arrivals as before)
        const auto planes = [&](bool kd, const unsigned short* src, unsigned bar) {
#if PLANES_PANELS
            if (pt == 0) {
                constexpr unsigned PANEL = BT * 128, NPAN = KP / 64;   // bytes, a plane's panels
                const unsigned dst = gda_shared_at(kd ? sk : sq);
                gda_mbar_tx(bar, 2 * NPAN * PANEL);
                #pragma unroll
                for (unsigned x = 0; x < 2 * NPAN; ++x)
                    gda_bulk_copy(dst + x / NPAN * FPB + x % NPAN * PANEL, src + x * (BT * 64),
                                  PANEL, bar);
            }
#else
            gda_wg_copy_planes<FO_PT / 32>(pt, 2, gda_shared_at(kd ? sk : sq), src);
#endif
        };
#else
        const auto planes = [&](bool kd, const unsigned short* src, unsigned) {   // (16 bytes a copy)
            const unsigned dst = kd ? at_k(0, 0) : at_q(0, 0);
            gda_grid_each_at<2 * BT, KP / 8, FO_PT, 8>(pt, [&](int r0, int dr, int c) {
                gda_cp16_at(dst + 2 * ((r0 + dr) * FQL + 8 * c), src + (long long)(r0 + dr) * KP + 8 * c);
            });
        };
#endif
        const auto filled = [&](unsigned bar) {         // (cp.async's landing, then the stores')
            gda_cp_arrive(bar);
            gda_mbar_arrive(bar);
        };
        const auto vw = [&](long long b) {              // chunk b's v and W (slot A's)
            if constexpr (VROWS)
                gda_stage_v_rows<FO_PT>(sv, v, gda_chunk_at(b, T, H, NC, cu_seqlens, coff, N), n0, pt);
            else
                gda_stage_vw<false, FO_PT>(sv, gda_planes_at(pl, NB, b).v, n0, sw, ww, b, pt);
#if W_SPLIT
            gda_stage_w_split<FO_PT>(wsplit(b - nh * NC), ww, b, pt);
#else
            gda_stage_w<FO_PT>(sw, ww, b, pt);
#endif
        };
        if (FO_EARLY && cend > 0) vw(nh * NC);          // (FO_EARLY: each next one's below)
        for (long long c = 0; c < cend; ++c) {
            const long long b = nh * NC + c;
            const gda_planes_at pc(pl, NB, b);
            if (c > 0) gda_mbar_wait<true>(bar_ra, (unsigned)(c - 1) & 1);
            planes(false, pc.q, bar_fa);                 // q A's two planes
            if (!FO_EARLY) vw(b);
            filled(bar_fa);                             // (FO_EARLY: v's and W's copies too,
            if (c > 0) gda_mbar_wait<true>(bar_rb, (unsigned)(c - 1) & 1);   // issued before)
            planes(true, pc.k, bar_fb);                  // k D's two planes
            gda_stage_ae<FO_PT>(sa, ae, b, pt);
            filled(bar_fb);
            if (FO_EARLY && c + 1 < cend) {              // the next chunk's v and W, once this
                gda_mbar_wait<true>(bar_rw, (unsigned)c & 1);   // one's are read
                vw(b + 1);
            }
        }
        gda_cp_wait<0>();
        return;
    }
#if SCAN_O_WG
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(FO_REGS_PRODUCTS));
#endif
#endif

#if !SCAN_O_MC && !FO_PRODUCER
    // the first np planes of q A (kd false) or k D of a chunk at src, into sq or sk (rows r:
    // plane * BT + step; with SCAN_O_WG in gda_wg_copy_planes' order)
    const auto stage_planes = [&](bool kd, const unsigned short* src, int np) {
#if SCAN_O_WG
        gda_wg_copy_planes<NTF / 32>(threadIdx.x, np, gda_shared_at(kd ? sk : sq), src);
#else
        gda_grid_each<2 * BT, KP / 8, NTF>([&](int r0, int dr, int c) {   // (np = TERMS = 2)
            gda_cp16_at((kd ? at_k(r0, 8 * c) : at_q(r0, 8 * c)) + 2 * dr * FQL,
                        src + (long long)r0 * KP + 8 * c + dr * KP);
        });
#endif
    };
#endif
#if !FO_PRODUCER
    const auto issue_a = [&](long long c) {             // slot A of chunk c (none past the last)
        if (c < cend) {
            const long long b = nh * NC + c;
            const gda_planes_at pc(pl, NB, b);
#if SCAN_O_MC
            share(c, bar_ea, bar_fa, sq, pc.q, MC_QB);  // (q A's h, m planes)
#elif SCAN_O_WG
            if constexpr (FO_O) stage_planes(false, pc.q, 2);   // (o from q A's h, m)
#else
            stage_planes(false, pc.q, 2);
#endif
            if constexpr (VROWS) {                      // v's rows from v, then W
                gda_stage_v_rows(sv, v, gda_chunk_at(b, T, H, NC, cu_seqlens, coff, N), n0, threadIdx.x);
                gda_stage_w(sw, ww, b, threadIdx.x);
            } else {                                    // v's plane, and W where o is made
                gda_stage_vw<FWD>(sv, pc.v, n0, sw, ww, b, threadIdx.x);     //  (FWD: FO_O's)
            }
        }
        gda_cp_commit();
    };
    const auto issue_b = [&](long long c) {             // slot B of chunk c
        if (c < cend) {
            const long long b = nh * NC + c;
            const gda_planes_at pc(pl, NB, b);
#if SCAN_O_MC
            share(c, bar_eb, bar_fb, sk, pc.k, MC_KB);  // (k D's planes)
#else
            stage_planes(true, pc.k, TERMS);
#endif
            gda_stage_ae(sa, ae, b, threadIdx.x);
        }
        gda_cp_commit();
    };
#endif
    float s[KH / 8][4];                                 // S^T: [key tile][C fragment]
    const int key0 = kb + 2 * tq, col0 = n0 + vr + g8;  // (gda_so_each's)
    long long n = coff ? 0 : nh / H;                    // the sequence, its chunks' end
    long long j1 = coff ? coff[1] : NC;
    const long long hh = coff ? nh : nh % H;
    const auto get_state = [&]() {                      // S^T of sequence n from h0 (0 without)
        gda_so_get(s, h0 ? h0 + (n * H + hh) * K_DIM * V_DIM : nullptr, key0, col0);
    };
    get_state();
#if !FO_PRODUCER
    issue_a(0);
    issue_b(0);
#endif
    float smax = 0.f;                                   // (the guard's: |S0|, and with
    unsigned vmax = 0;                                  //  VROWS |v| as two bfloat16)
    for (long long c = 0; c < cend; ++c) {
        const long long b = nh * NC + c;
        GDA_CHUNK;
#if FO_PRODUCER
        gda_mbar_wait<true>(bar_fa, (unsigned)c & 1);   // slot A filled by the producer
#else
        gda_cp_wait<1>();                               // slot A's copies (B's may be in flight)
#endif
#if SCAN_O_MC
        gda_mbar_wait(bar_fa, (unsigned)c & 1);         // (and the cluster's of q A's planes)
#endif
#if SCAN_O_WG
        if constexpr (FO_O) {
            gda_proxy_fence();                          // (read by wgmma; with the producer its
#if !FO_PRODUCER                                        //  copies, seen through the mbarrier)
            __syncthreads();
#endif
#if !W_SPLIT                                            // (W_SPLIT: split by scores)
            gda_wg_split_b<BT, BT, NTF, false>(
                [&](int u, int t) { return __fmul_rn(scale, sw[t * FWL + u]); },
                reinterpret_cast<unsigned*>(sp), reinterpret_cast<unsigned*>(sp + 2 * BT * BT),
                threadIdx.x);
            gda_proxy_fence();
#endif
        }
#endif
#if !FO_PRODUCER
        __syncthreads();
#elif SCAN_O_WG && !W_SPLIT
        gda_bar_sync(1, NTF);                           // (W's split planes, every compute warp's)
#endif
        unsigned fv[NBK][4];                           // v^T's A fragments, a k-step of steps each
        #pragma unroll
        for (int sg = 0; sg < NBK; ++sg)
            gda_ldsm4_t(fv[sg], sv_at + 2 * ((16 * sg + lane / 16 * 8 + lane % 8) * FVL
                                             + vr + lane / 8 % 2 * 8));
#if FO_EARLY
        __syncwarp();                                   // (v and W read: W's planes split
        if (lane == 0) gda_mbar_arrive(bar_rw);         //  before the named barrier above, or
#endif                                                  //  W_SPLIT's in the other buffer)
        if constexpr (VROWS) gda_fv_absmax(vmax, fv, kh);   // (the guard on v: pack's without)
#if SCAN_O_WG
        if constexpr (FO_S0)                            // S0, for the backward
            gda_so_put<K_DIM != KP>(s, st + b * K_DIM * V_DIM, key0, col0);
        if constexpr (FO_O) {                           // scale W^T v + S^T (scale q A)^T
            float o[BT / 8][4] = {};                    // o^T: [step tile][C fragment]
#if W_SPLIT
            const unsigned wp = wsplit(c);
#else
            const unsigned wp = gda_shared_at(sp);
#endif
            gda_wg_o<FO_SW>(o, s, fv, kh, wp, gda_shared_at(sq) + (FO_SW ? kb * BT * 2 : kb * 16));
            gda_fo_halves<FO_HALVES>(so, o, kh, vr + g8, tq);
        }
#if FO_PRODUCER
        __syncwarp();                                   // (slot A read: the warp's products done;
        if (lane == 0) gda_mbar_arrive(bar_ra);         //  o^T's halves meet before o's store)
#else
        __syncthreads();                                // (slot A read: the next chunk's copies)
#endif
#if SCAN_O_MC
        if (c + 1 < cend && threadIdx.x < TN) gda_mbar_arrive_at(bar_ea, threadIdx.x);
#endif
#if !FO_PRODUCER
        issue_a(c + 1);
#endif
#else
        float o[BT / 8][4] = {};                        // o^T: [step tile][C fragment]
        #pragma unroll
        for (int sg = 0; sg < NBK; ++sg) {             // scale W^T v: this half's k-steps, k-step
            if ((sg % 4 == 1 || sg % 4 == 2) != kh) continue;   //  sg's tiles 8 - 2 sg (NBK 4):
                                                        //  halves 0, 3 and 1, 2 take 10 each
            #pragma unroll
            for (int j = 0; j < BT / 8; ++j) {
                if (8 * j + 7 < 16 * sg) continue;      // (W[s][u] = 0 for s > u)
                const float* w = sw + (16 * sg + 2 * tq) * FWL + 8 * j + g8;
                unsigned bh[2], bm[2];
                gda_split2<false>(scale * w[0], scale * w[FWL], bh[0], bm[0]);
                gda_split2<false>(scale * w[8 * FWL], scale * w[9 * FWL], bh[1], bm[1]);
                gda_mma_bf16(o[j], fv[sg], bm);
                gda_mma_bf16(o[j], fv[sg], bh);
            }
        }
        #pragma unroll
        for (int kk = 0; kk < KH / 16; ++kk) {          // S^T (scale q A)^T, this half's keys
            unsigned ah[4], am[4];
            #pragma unroll
            for (int x = 0; x < 4; ++x)                 // a_x: rows g (x even) or g + 8, keys
                gda_split2<false>(s[2 * kk + x / 2][2 * (x % 2)],        //  16 kk + 8 (x / 2)..
                                  s[2 * kk + x / 2][2 * (x % 2) + 1], ah[x], am[x]);
            unsigned bh[BT / 8][2], bm[BT / 8][2];      // every step tile's B fragments,
            #pragma unroll                              //  then each product over every tile
            for (int jp = 0; jp < BT / 16; ++jp) {      //  (no two dependent products in a row)
                const int row = 16 * jp + lane / 16 * 8 + lane % 8, col = kb + 16 * kk + lane / 8 % 2 * 8;
                unsigned r[4];
                gda_ldsm4(r, at_q(row, col));
                bh[2 * jp][0] = r[0], bh[2 * jp][1] = r[1], bh[2 * jp + 1][0] = r[2], bh[2 * jp + 1][1] = r[3];
                gda_ldsm4(r, at_q(BT + row, col));
                bm[2 * jp][0] = r[0], bm[2 * jp][1] = r[1], bm[2 * jp + 1][0] = r[2], bm[2 * jp + 1][1] = r[3];
            }
            #pragma unroll
            for (int j = 0; j < BT / 8; ++j) gda_mma_bf16(o[j], am, bh[j]);
            #pragma unroll
            for (int j = 0; j < BT / 8; ++j) gda_mma_bf16(o[j], ah, bm[j]);
            #pragma unroll
            for (int j = 0; j < BT / 8; ++j) gda_mma_bf16(o[j], ah, bh[j]);
        }
        #pragma unroll
        for (int j = 0; j < BT / 8; ++j) {              // this half's o^T into shared memory
            float* p = so + (kh * FV + vr + g8) * FOL + 8 * j + 2 * tq;
            *reinterpret_cast<float2*>(p) = make_float2(o[j][0], o[j][1]);
            *reinterpret_cast<float2*>(p + 8 * FOL) = make_float2(o[j][2], o[j][3]);
        }
#if FO_PRODUCER
        gda_bar_sync(1, NTF);                           // (o^T's halves in; slot A read)
        if (lane == 0) gda_mbar_arrive(bar_ra);
#else
        __syncthreads();                                // (slot A read: the next chunk's copies)
        issue_a(c + 1);
#endif
        gda_fo_store<2>(so, ch, n0, dv);                // o
#endif
#if FO_PRODUCER
        gda_mbar_wait<true>(bar_fb, (unsigned)c & 1);   // slot B filled by the producer
#else
        gda_cp_wait<1>();                               // slot B's copies (A's next in flight)
#endif
#if SCAN_O_MC
        gda_mbar_wait(bar_fb, (unsigned)c & 1);         // (and the cluster's of k D's planes)
#endif
#if SCAN_O_WG
        gda_proxy_fence();
#endif
#if !FO_PRODUCER
        __syncthreads();
#endif
#if SCAN_O_WG
        // S0 diag(A_end) + v^T (k D), one rounding (S0's fused product with A_end: the
        // instruction NVVM made of the decay and the add where nothing stood between them): v^T
        // (k D) as fresh sums of 64 keys (the first product does not add); while they run, the
        // guard on S0, A_end of the thread's keys, and o's store (v59: the products wait for none)
        float d[KH / 64][8][4] = {};
        float ae[KH / 8][2];                            // A_end of keys key0 + 8 j + e
        gda_wg_state<TERMS, FO_SW>(s, fv, gda_shared_at(sk) + (FO_SW ? kb * BT * 2 : kb / 8 * FKS),
                                   0, NBK, d, [&] {
            gda_so_each(key0, 0, [&](int j, int r, int key, int) {
                gda_absmax(smax, s[j][r]);
                if (r < 2) ae[j][r] = sa[key];
            });
            if constexpr (FO_O) {
#if FO_PRODUCER
                gda_bar_sync(1, NTF);                   // (o^T's halves in)
#endif
                gda_fo_store<FO_HALVES>(so, ch, n0, dv);    // o
            }
        }, [&](int j, int r, float x, float y) { return __fmaf_rn(x, ae[j][r & 1], y); });
#else
        gda_so_decay(s, sa, key0, smax);                // the guard on S0, then S0 diag(A_end)
        #pragma unroll
        for (int j0 = 0; j0 < KH / 8; j0 += 4) {        // + v^T (k D), 4 tiles at a time
            float d[4][4] = {};
            #pragma unroll
            for (int sg = 0; sg < NBK; ++sg) {
                unsigned fh[4][2], fm[4][2];            // the 4 tiles' B fragments, then each
                #pragma unroll                          //  term over the 4
                for (int p = 0; p < 2; ++p) {
                    const int row = 16 * sg + lane / 8 % 2 * 8 + lane % 8;
                    const int col = kb + 8 * j0 + 16 * p + lane / 16 * 8;
                    unsigned r[4];
                    gda_ldsm4_t(r, at_k(row, col));
                    fh[2 * p][0] = r[0], fh[2 * p][1] = r[1], fh[2 * p + 1][0] = r[2], fh[2 * p + 1][1] = r[3];
                    gda_ldsm4_t(r, at_k(BT + row, col));
                    fm[2 * p][0] = r[0], fm[2 * p][1] = r[1], fm[2 * p + 1][0] = r[2], fm[2 * p + 1][1] = r[3];
                }
                #pragma unroll
                for (int i = 0; i < 4; ++i) gda_mma_bf16(d[i], fv[sg], fm[i]);
                #pragma unroll
                for (int i = 0; i < 4; ++i) gda_mma_bf16(d[i], fv[sg], fh[i]);
            }
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int r = 0; r < 4; ++r) s[j0 + i][r] += d[i][r];
        }
#endif
#if FO_PRODUCER
        gda_bar_sync(1, NTF);                           // (slot B read, o^T's store done)
        if (lane == 0) gda_mbar_arrive(bar_rb);
#else
        __syncthreads();                                // (slot B read: the next chunk's copies)
#endif
#if SCAN_O_MC
        if (c + 1 < cend && threadIdx.x < TN) gda_mbar_arrive_at(bar_eb, threadIdx.x);
#endif
#if !FO_PRODUCER
        issue_b(c + 1);
#endif
        if (c == j1 - 1) {                              // sequence n's last chunk: its final
            if (FWD && dh0)                             //  state (a forward's), then the next
                gda_so_put(s, dh0 + (n * H + hh) * K_DIM * V_DIM, key0, col0);   //  one's first
            if (coff && ++n < N) {
                j1 = coff[n + 1];
                get_state();
            }
        }
    }
    gda_cp_wait<0>();
#if SCAN_O_MC
    gda_cluster_sync();                                 // (no block leaves while another may
#endif                                                  //  still reach into its shared memory)
    const bool vin = (__uint_as_float(vmax << 16) <= GDA_BWD_VAL_MAX)
                     & (__uint_as_float(vmax & 0xffff0000u) <= GDA_BWD_VAL_MAX);
    if (!(smax <= GDA_BWD_STATE_MAX) || !vin) *flag = 1;     // (NaN fails)
#endif
}
#endif

// 9. SCAN_DV (sm_90a; a backward from the planes): the scan's backward half and dv's entry as
// one kernel, scan_o's mirror (docs/perf-notes.md, "The backward's E scan and dv as one kernel
// by wgmma"). Block: (sequence-head nh, FV value columns at n0), two warpgroups of the products,
// one a key half, holding E^T (FV value rows x KH keys a warpgroup) in wgmma accumulators as
// scan_o holds S^T, and a producer warpgroup (FD_PT threads, v68: scan_o's since v52); each
// sequence's chunks from its last, E from d_final_state (0 without), its last E (the gradient of
// the initial state) to dh0. A chunk b's operands come in two slots that the producer copies by
// cp.async, each while the other's products run (A: k D's h, m planes, K-major as scan_o's q A;
// do's plane of the block's columns; W. B: scale q A's TERMS planes, MN-major as scan_o's k D;
// A_end), each slot behind two mbarriers as scan_o's: full (its bytes landed: each producer
// thread's cp.async arrival and a plain one) and read (the products' 8 warps done with it: an
// arrival each); the products issue no copies and meet on named barrier 1 of their NTF
// threads. The planes lie in FO_SW's 128-byte swizzle, copied by gda_wg_copy_planes,
// 1,024-byte aligned (v67: v53's layout, which took scan_o's L2 from 94 % to 29 % busy):
//   E_b to et (rows reads it), then
//   dv^T = E_b^T (k D)^T + do^T (scale W)^T: scan_o's o with k D for q A, do for v, W^T for W
//          (DV_TERMS = 2: E^T's h + m a k-step against k D's planes, W split into h, m once a
//          chunk); the second warpgroup's sums into shared memory, the first's added there, dv
//          out as scan_o's o; then rowsum(E_b (.) S0) of the block's columns (S0 from st, each
//          thread its elements, loaded while slot B's copies land) into es's part of this tile;
//   E = E_b diag(A_end) + do^T (scale q A): the guard on E_b first, then q A's planes l, m, h
//          against do (exact) into fresh sums a k-step of 16 steps, added after (the scan's
//          gda_scan_mma order), 64 keys a chain.
// A chunk of no rows (packed sequences) has no W (scores skips it), so its dv^T is garbage, and
// not stored; its E update takes zero planes and A_end 1, as scan_o's chunks of no rows do.
// Launched (chunk_bwd.BackwardPlan) where Config.SCAN_DV, after scores: in place of the scan's
// backward half (which SCAN_DV leaves out of it) and of dv's entry. Its shared memory is
// chunk_bwd.scan_dv_smem (checked here); in every other build its body is empty.
#define FD_BYTES ((2 + TERMS) * FPB + 4 * BT * BT + 2 * BT * FVL + 4 * (BT * FWL + KP + FV * FOL + 4 * KP) \
                  + 1024)                       // (+ the planes' alignment)
#define FD_PT 128                               // the producer's threads (a warpgroup:
                                                //  setmaxnreg's unit; chunk_bwd.FD_PT)

// scan_dv's chunks in the order it takes them: each sequence's from its last (c < 0: past them)
struct gda_rev_chunks {
    const long long* coff;
    long long n, nseq;
    int NC, j0, j1, c;
    __device__ __forceinline__ gda_rev_chunks(const long long* coff_, long long nseq_, int NC_)
        : coff(coff_), n(0), nseq(nseq_), NC(NC_) { start(); }
    __device__ __forceinline__ void start() {
        gda_seq_chunks(coff, n, NC, j0, j1);
        c = j1 - 1;
    }
    __device__ __forceinline__ void next() {
        if (c > j0) --c;
        else if (++n < nseq) start();
        else c = -1;
    }
};

#if GDA_HAS(9)
extern "C" __global__ void __launch_bounds__(NTF + FD_PT, 1) gda_chunk_bwd_scan_dv(GDA_CHUNK_BWD_PARAMS)
{
#if SCAN_DV
    static_assert(KH % 64 == 0 && KP <= 256 && FV == PT, "scan_dv: key halves of 64 or 128");
    // (scan_o's register split: at 384 threads without setmaxnreg ptxas spilled 360 bytes)
    static_assert(2 * 128 * FO_REGS_PRODUCTS + FD_PT * FO_REGS_PRODUCER <= 65536, "registers");
    extern __shared__ __align__(16) unsigned char d_sm[];
    unsigned char* const sk = d_sm + ((0u - gda_shared_at(d_sm)) & 1023);   // k D's h, m [2][FPB]
                                                                         //  (1,024-byte aligned)
    unsigned char* const sq = sk + 2 * FPB;                              // scale q A [TERMS][FPB]
    unsigned char* const sp = sq + TERMS * FPB;                          // scale W's h, m
    unsigned short* const sdo = reinterpret_cast<unsigned short*>(sp + 4 * BT * BT);  // do [BT][FVL]
    float* const sw = reinterpret_cast<float*>(sdo + BT * FVL);          // W [BT][FWL]
    float* const sa = sw + BT * FWL;                                     // A_end [KP]
    float* const so = sa + KP;                                           // dv^T [FV][FOL]
    float* const sr = so + FV * FOL;                                     // rowsum [4 row groups][KP]
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < FD_BYTES) __trap();                       // (the launcher's scan_dv_smem is wrong)
    if (blockDim.x != NTF + FD_PT) __trap();            // (the launcher's threads are wrong)
    constexpr int TN = VP / FV;
    const long long nh = blockIdx.x / TN, NB = NH * NC;
    const int n0 = blockIdx.x % TN * FV;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g8 = lane / 4, tq = lane % 4;
    const int vr = warp % 4 * 16, kh = warp / 4, kb = kh * KH;
    for (int i = K_DIM + threadIdx.x; i < KP; i += NTF + FD_PT) sa[i] = 1.f;   // (keys past K:
                                                                               //  0 stays 0)
    // full: slot A's (B's) bytes of a chunk landed (2 FD_PT arrivals); read: slot A (B) of a
    // chunk read by the products' 8 warps (an arrival each)
    __shared__ __align__(8) unsigned long long d_bar[4];
    const unsigned bar_fa = gda_shared_at(d_bar), bar_fb = bar_fa + 8;
    const unsigned bar_ra = bar_fa + 16, bar_rb = bar_fa + 24;
    if (threadIdx.x == 0) {
        gda_mbar_init(bar_fa, 2 * FD_PT);
        gda_mbar_init(bar_fb, 2 * FD_PT);
        gda_mbar_init(bar_ra, NTF / 32);
        gda_mbar_init(bar_rb, NTF / 32);
        gda_mbar_init_fence();
    }
    __syncthreads();
    if (warp >= NTF / 32) {                             // the producer: every chunk's slots, in
        const unsigned pt = threadIdx.x - NTF;          //  the products' order
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(FO_REGS_PRODUCER));
        const auto filled = [&](unsigned bar) {         // (cp.async's landing, then its own)
            gda_cp_arrive(bar);
            gda_mbar_arrive(bar);
        };
        gda_rev_chunks u(coff, coff ? N : 1, NC);
        for (unsigned i = 0; u.c >= 0; ++i, u.next()) {
            const long long b = nh * NC + u.c;
            const gda_planes_at pc(pl, NB, b);
            if (i > 0) gda_mbar_wait<true>(bar_ra, (i - 1) & 1);
            gda_wg_copy_planes<FD_PT / 32>(pt, 2, gda_shared_at(sk), pc.k);   // k D's h, m
#if W_SPLIT_DV
            gda_stage_vw<false, FD_PT>(sdo, pc.d, n0, sw, ww, b, pt);          // do's, W's
            gda_stage_w_split<FD_PT>(gda_shared_at(sp), ww, b, pt);            //  split planes
#else
            gda_stage_vw<true, FD_PT>(sdo, pc.d, n0, sw, ww, b, pt);           // do's, W
#endif
            filled(bar_fa);
            if (i > 0) gda_mbar_wait<true>(bar_rb, (i - 1) & 1);
            gda_wg_copy_planes<FD_PT / 32>(pt, TERMS, gda_shared_at(sq), pc.q);   // scale q A's
            gda_stage_ae<FD_PT>(sa, ae, b, pt);
            filled(bar_fb);
        }
        gda_cp_wait<0>();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(FO_REGS_PRODUCTS));

    float s[KH / 8][4];                                 // E^T: [key tile][C fragment]
    const int key0 = kb + 2 * tq, col0 = n0 + vr + g8;  // (gda_so_each's)
    const long long hh = coff ? nh : nh % H;
    gda_rev_chunks cur(coff, coff ? N : 1, NC);
    const auto state_at = [&]() {                       // cur's sequence's [K][V] in dht, dh0
        return ((coff ? cur.n : nh / H) * H + hh) * K_DIM * V_DIM;
    };
    const auto get_e = [&]() {                          // E^T of cur's sequence from dht (0 without)
        gda_so_get(s, dht ? dht + state_at() : nullptr, key0, col0);
    };
    get_e();
    float smax = 0.f;                                   // (the guard's)
    for (unsigned i = 0; cur.c >= 0; ++i) {
        const long long b = nh * NC + cur.c;
        GDA_CHUNK;
        gda_mbar_wait<true>(bar_fa, i & 1);             // slot A filled by the producer
        gda_proxy_fence();                              // (its copies, read by wgmma)
#if !W_SPLIT_DV                                         // (W_SPLIT_DV: split by scores)
        gda_wg_split_b<BT, BT, NTF, false>([&](int t, int u) { return __fmul_rn(scale, sw[t * FWL + u]); },
                                           reinterpret_cast<unsigned*>(sp),
                                           reinterpret_cast<unsigned*>(sp + 2 * BT * BT), threadIdx.x);
        gda_proxy_fence();
        gda_bar_sync(1, NTF);                           // (W's split planes, every warp's)
#endif
        unsigned fd[NBK][4];                           // do^T's A fragments, a k-step of steps each
        #pragma unroll
        for (int sg = 0; sg < NBK; ++sg)
            gda_ldsm4_t(fd[sg], gda_shared_at(sdo + (16 * sg + lane / 16 * 8 + lane % 8) * FVL
                                              + vr + lane / 8 % 2 * 8));
        gda_so_put(s, et + b * K_DIM * V_DIM, key0, col0);   // E_b, for rows
        float o[BT / 8][4] = {};                        // dv^T: [step tile][C fragment]
        gda_wg_o<true>(o, s, fd, kh, gda_shared_at(sp), gda_shared_at(sk) + kb * BT * 2);  // do^T (scale W)^T
                                                        //  + E_b^T (k D)^T
        __syncwarp();                                   // (slot A read: do into fd, k D and W's
        if (lane == 0) gda_mbar_arrive(bar_ra);         //  planes by the waited chain, W before
                                                        //  the named barrier above)
        gda_fo_halves<1, true>(so, o, kh, vr + g8, tq);     // the second half's dv^T, then the first's
        gda_bar_sync(1, NTF);                           // (dv^T's sums in so)
        gda_fo_store<1>(so, ch, n0, dv);                // dv
        {                                               // rowsum(E_b (.) S0) (its loads in
            const float* s0 = st + b * K_DIM * V_DIM;   //  flight while slot B lands): the
            float part[KH / 8][2] = {};                 //  thread's two value rows a key, then
            gda_so_each(key0, col0, [&](int j, int r, int key, int col) {   //  its quad's 8
                const float x = key < K_DIM && col < V_DIM ? s0[(long long)key * V_DIM + col] : 0.f;
                part[j][r & 1] = fmaf(s[j][r], x, part[j][r & 1]);         //  lanes, into sr
            });
            #pragma unroll
            for (int j = 0; j < KH / 8; ++j)
                #pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float y = part[j][r];
                    y += __shfl_xor_sync(GDA_FULL_MASK, y, 4);
                    y += __shfl_xor_sync(GDA_FULL_MASK, y, 8);
                    y += __shfl_xor_sync(GDA_FULL_MASK, y, 16);
                    if (g8 == 0) sr[warp % 4 * KP + key0 + 8 * j + r] = y;
                }
        }
        gda_mbar_wait<true>(bar_fb, i & 1);             // slot B filled by the producer
        gda_proxy_fence();
        gda_bar_sync(1, NTF);                           // (sr's parts in; so read by dv's store)
        for (int x = threadIdx.x; x < K_DIM; x += NTF)  // this tile's part of rowsum(E S0)
            es[((long long)n0 / GN * NH * NC + b) * K_DIM + x] = sr[x] + sr[KP + x] + sr[2 * KP + x] + sr[3 * KP + x];
        gda_so_decay(s, sa, key0, smax);                // the guard on E_b, then E_b diag(A_end)
        float d[KH / 64][8][4] = {};                    // + do^T (scale q A): a k-step's planes
        #pragma unroll                                  //  l, m, h into fresh sums, added after
        for (int sg = 0; sg < NBK; ++sg)
            gda_wg_state<TERMS, true>(s, fd, gda_shared_at(sq) + kb * BT * 2, sg, sg + 1, d, [] {},
                                      [](int, int, float x, float y) { return x + y; });
        __syncwarp();                                   // (slot B read: A_end by the decay, q A
        if (lane == 0) gda_mbar_arrive(bar_rb);         //  by the waited chains; sr and so are
                                                        //  next written past the next chunk's
                                                        //  named barriers)
        if (cur.c == cur.j0 && dh0)                     // a sequence's first chunk: its E,
            gda_so_put(s, dh0 + state_at(), key0, col0);    //  the initial state's gradient
        cur.next();
        if (coff && cur.c >= 0 && cur.c == cur.j1 - 1) get_e();   // the next sequence's
    }
    if (!(smax <= GDA_BWD_STATE_MAX)) *flag = 1;    // (NaN fails)
#endif
}
#endif
