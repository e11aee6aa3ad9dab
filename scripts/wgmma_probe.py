"""One wgmma of kernels/wgmma.cuh's gda_wgmma_rs on the device against NumPy: the layouts scan_o's
wgmma form (SCAN_O_WG, docs/perf-notes.md v39) rests on, each alone, so that a failure of its
tests says which one is wrong.

    python -m scripts.wgmma_probe          (a Hopper GPU)

A warpgroup computes D = A B, A (64 x 16) from registers in mma.cuh's fragment layout, B (16 x
64) from shared memory without swizzle in three layouts: K-major (q A's in scan_o: core (n / 8,
k / 8) at n / 8 * SBO + k / 8 * 128), MN-major as scan_o reads k D (core (n / 8, k / 8) at n / 8 *
SBO + k / 8 * LBO, LBO = 128: CUTLASS's make_gmma_desc<Major::MN> for INTERLEAVE), and the same
bytes with LBO and SBO swapped (the other reading of PTX's text). Small integers: every sum is
exact, so each line is "exact" or the count of wrong elements.

Then the cluster protocol of scan_o's SCAN_O_MC (v42), alone: clusters of 8 CTAs (compile-time
dims, launched as CuPy launches any kernel); each round every CTA's thread 0 waits on its empty
barrier (every CTA done with the last round's buffer), tells its full barrier the round's bytes
and copies its eighth of the round's buffer into all 8 CTAs (one bulk copy multicast); every
thread waits on the full barrier, the CTA copies the buffer out, and 8 threads arrive on each
CTA's empty barrier. A line: exact, or the count of wrong words; a hang is cut by the caller's
timeout. With --compile-only: NVRTC's build for sm_90a alone (no GPU).
"""
import os
import sys
import tempfile

import numpy as np

from cupy_gda import _compile

PROBE = r"""
// B: 16 x 64 bfloat16 [k][n]; A: 64 x 16 [m][k]; out: 3 x 64 x 64 float32 [m][n]
extern "C" __global__ void __launch_bounds__(128) gda_wgmma_probe(
    const unsigned short* a, const unsigned short* b, float* out)
{
    __shared__ __align__(128) unsigned short sb[2][16 * 64];    // K-major, MN-major
    const int tid = threadIdx.x, lane = tid % 32, w = tid / 32, g = lane / 4, t = lane % 4;
    for (int x = tid; x < 16 * 64; x += 128) {
        const int k = x / 64, n = x % 64;
        sb[0][(n / 8 * 256 + k / 8 * 128 + n % 8 * 16 + k % 8 * 2) / 2] = b[x];  // K-major, SBO 256
        sb[1][(n / 8 * 256 + k / 8 * 128 + k % 8 * 16 + n % 8 * 2) / 2] = b[x];  // MN-major, SBO 256
    }
    gda_proxy_fence();
    __syncthreads();
    unsigned fa[4];                                     // rows 16 w + g (+ 8), columns 2 t (+ 8)
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int r = 16 * w + g + 8 * (j & 1), c = 2 * t + 8 * (j >> 1);
        fa[j] = a[r * 16 + c] | (unsigned)a[r * 16 + c + 1] << 16;
    }
    const unsigned base = gda_smem_addr(sb);
    #pragma unroll
    for (int v = 0; v < 3; ++v) {
        float d[8][4] = {};
        gda_wg_pin<8>(d);
        gda_wg_fence();
        if (v == 0) gda_wgmma_rs<0>(d, fa, gda_wg_desc(base, 256), 1);
        else if (v == 1) gda_wgmma_rs<1>(d, fa, gda_wg_desc(base + 2048, 256), 1);
        else gda_wgmma_rs<1>(d, fa, gda_wg_desc_lbo(base + 2048, 256, 128), 1);   // swapped
        gda_wg_commit();
        gda_wg_wait<0>();
        gda_wg_pin<8>(d);
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                out[(v * 64 + 16 * w + g + 8 * (r >> 1)) * 64 + 8 * j + 2 * t + (r & 1)] = d[j][r];
    }
}
"""
CLUSTER = r"""
#define CL 8                                            // CTAs a cluster
#define PART 2048                                       // bytes a CTA copies into all, a round
#define ROUNDS 5
// src: [ROUNDS][CL * PART] bytes; out: [gridDim.x][ROUNDS][CL * PART / 4] floats
extern "C" __global__ void __launch_bounds__(256) __cluster_dims__(CL, 1, 1) gda_cluster_probe(
    const unsigned char* src, float* out)
{
    __shared__ __align__(128) unsigned char buf[CL * PART];
    __shared__ __align__(8) unsigned long long bar[2];          // full, empty
    const unsigned full = gda_smem_addr(&bar[0]), empty = gda_smem_addr(&bar[1]);
    const unsigned rank = gda_cluster_rank();
    if (threadIdx.x == 0) {
        gda_mbar_init(full, 1);
        gda_mbar_init(empty, CL);
        gda_mbar_init_fence();
    }
    gda_cluster_sync();
    for (int c = 0; c < ROUNDS; ++c) {
        if (threadIdx.x == 0) {
            if (c > 0) gda_mbar_wait(empty, (c - 1) & 1);
            gda_mbar_expect(full, CL * PART);
            gda_bulk_multicast(gda_smem_addr(buf) + rank * PART, src + (c * CL + rank) * PART, PART,
                               full, (1 << CL) - 1);
        }
        gda_mbar_wait(full, c & 1);
        const float* b = reinterpret_cast<const float*>(buf);
        for (int i = threadIdx.x; i < CL * PART / 4; i += 256)
            out[((long long)blockIdx.x * ROUNDS + c) * (CL * PART / 4) + i] = b[i];
        __syncthreads();
        if (c + 1 < ROUNDS && threadIdx.x < CL) gda_mbar_arrive_at(empty, threadIdx.x);
    }
    gda_cluster_sync();
}
"""
CL, PART, ROUNDS = 8, 2048, 5
# (a descriptor with LBO given, for the swapped reading: SBO 128, LBO 256)
DESC = r"""
__device__ __forceinline__ unsigned long long gda_wg_desc_lbo(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
         | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32);
}
"""
DEFINES = {"IO_DTYPE": 2, "G_DTYPE": 0, "LOG_GATE": 0, "SCAN_O_WG": 1}
FORMS = ("K-major", "MN-major (LBO 128 along k, SBO along n)", "MN-major, LBO and SBO swapped")


def build():
    """(cubin, log) of the probe for sm_90a."""
    pre = "".join(f"#define {k} {v}\n" for k, v in DEFINES.items())
    text = pre + "".join(_compile._read(h) + "\n" for h in ("common.cuh", "mma.cuh", "wgmma.cuh"))
    text += DESC + PROBE + CLUSTER
    log, cubin, _ = _compile._nvrtc("gda_wgmma_probe", DEFINES, text,
                                    _compile._options(("--gpu-architecture=sm_90a",), "sm_90a"))
    return cubin, log


def bf16(x):
    """float32 values exact in bfloat16 -> their bit patterns (uint16)."""
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def main(argv):
    cubin, log = build()
    print(f"built for sm_90a: {len(cubin)} bytes"
          + ("; serialized" if "serialized" in log else ""), flush=True)
    if "--compile-only" in argv:
        return
    import cupy
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (64, 16)).astype(np.float32)
    b = rng.integers(-4, 5, (16, 64)).astype(np.float32)
    want = a @ b
    src = rng.standard_normal(ROUNDS * CL * PART // 4).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        module = cupy.RawModule(path=path)
        out = cupy.full((3, 64, 64), np.nan, np.float32)
        module.get_function("gda_wgmma_probe")((1,), (128,), (cupy.asarray(bf16(a)),
                                                              cupy.asarray(bf16(b)), out))
        got = cupy.asnumpy(out)
        out = cupy.full((2 * CL, ROUNDS, CL * PART // 4), np.nan, np.float32)   # two clusters
        module.get_function("gda_cluster_probe")((2 * CL,), (256,), (cupy.asarray(src), out))
        bad_mc = int((cupy.asnumpy(out) != src.reshape(1, ROUNDS, -1)).sum())
    for form, x in zip(FORMS, got):
        bad = int((x != want).sum())
        print(f"{form:45s} {'exact' if bad == 0 else f'{bad} of 4096 elements wrong'}", flush=True)
    print(f"{'multicast in clusters of 8, 5 rounds':45s} "
          f"{'exact' if bad_mc == 0 else f'{bad_mc} of {out.size} words wrong'}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
