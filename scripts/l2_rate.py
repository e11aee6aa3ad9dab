"""How fast the L2 feeds the SMs, as scan_o's producer copies (perf-notes v63, v64): a block an
SM copies pieces of PIECE bytes of a working set into a ring of R slots in shared memory, over
and over, and nothing else. The working set fits the L2 (some MB) or does not (1 GiB: DRAM).
Three ways to copy:
    cp      128 threads, cp.async of 16 bytes each (scan_o's producer warps), the ring's depth
            in commit groups
    bulk    one thread, cp.async.bulk of a whole piece, a full mbarrier a slot
    mc2     clusters of 2: each block copies half of every piece by cp.async.bulk multicast into
            both (v64's plan), so each piece is read from L2 once for two SMs; a slot is filled
            again once both blocks have waited on it (their lockstep, as v64 would have)
``share`` G: G consecutive blocks read the same pieces at about the same time (8: GLA-1.3B's
value tiles reading one chunk's planes); mc2's pair is its own sharing.

    python -m scripts.l2_rate [--compile-only] [--reps N]

Prints, per row, the median ms of N launches (15; CUDA events, as the benchmark times a call:
bench.measure), two rates (bytes into the SMs a second, and bytes read from the L2 or beyond a
second: for mc2 half the first) and whether every block's ring holds what it copied. scan_o at
GLA-1.3B bf16 took 2.57 GB into its SMs in 0.47 ms on an H100, 5.5 TB/s (perf-notes, "scan_o's
time after v60"): a ceiling near that says L2's rate binds it.
"""
import os
import sys
import tempfile

import numpy as np

from cupy_gda import _compile, bench

PIECE = 8192
SRC = r"""
// piece i of block b: G blocks read each piece, their group the (b / G)-th of gridDim.x / G
__device__ __forceinline__ long long gda_l2_piece(int i, int share, long long npieces) {
    const long long groups = gridDim.x / share;
    return ((long long)(blockIdx.x / share) + (long long)i * groups) % npieces;
}

extern "C" __global__ void __launch_bounds__(128) gda_l2_cp(
    const unsigned char* __restrict__ src, long long npieces, int iters, int share, int slots,
    unsigned* out)
{
    extern __shared__ __align__(128) unsigned char ring[];
    for (int i = 0; i < iters; ++i) {
        const unsigned char* g = src + gda_l2_piece(i, share, npieces) * PIECE;
        const unsigned dst = gda_shared_at(ring + (i % slots) * PIECE);
        #pragma unroll
        for (int j = 0; j < PIECE / (128 * 16); ++j) {
            const int at = (j * 128 + threadIdx.x) * 16;
            gda_cp16_at(dst + at, reinterpret_cast<const float*>(g + at));
        }
        gda_cp_commit();
        // at most slots - 1 groups left in flight before the next fill of this ring
        if (slots <= 4) gda_cp_wait<3>(); else if (slots <= 8) gda_cp_wait<7>(); else gda_cp_wait<15>();
    }
    gda_cp_wait<0>();
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = reinterpret_cast<const unsigned*>(ring)[0];
}

extern "C" __global__ void __launch_bounds__(128) gda_l2_bulk(
    const unsigned char* __restrict__ src, long long npieces, int iters, int share, int slots,
    unsigned* out)
{
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ __align__(8) unsigned long long bars[16];
    const unsigned full = gda_shared_at(bars);
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; ++s) gda_mbar_init(full + 8 * s, 1);
        gda_mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 0; i < iters; ++i) {
            const int s = i % slots;
            if (i >= slots) gda_mbar_wait<true>(full + 8 * s, (unsigned)(i / slots - 1) & 1);
            gda_mbar_expect(full + 8 * s, PIECE);
            gda_bulk_copy(gda_shared_at(ring + s * PIECE), src + gda_l2_piece(i, share, npieces) * PIECE,
                          PIECE, full + 8 * s);
        }
        for (int i = iters > slots ? iters - slots : 0; i < iters; ++i)
            gda_mbar_wait<true>(full + 8 * (i % slots), (unsigned)(i / slots) & 1);
        out[blockIdx.x] = reinterpret_cast<const unsigned*>(ring)[0];
    }
}

extern "C" __global__ void __launch_bounds__(128) __cluster_dims__(2, 1, 1) gda_l2_mc2(
    const unsigned char* __restrict__ src, long long npieces, int iters, int share, int slots,
    unsigned* out)
{
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ __align__(8) unsigned long long bars[32];     // full[16], empty[16]
    const unsigned full = gda_shared_at(bars), empty = full + 8 * 16;
    const unsigned rank = gda_cluster_rank();
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; ++s) {
            gda_mbar_init(full + 8 * s, 1);
            gda_mbar_init(empty + 8 * s, 2);                  // both blocks have waited on it
        }
        gda_mbar_init_fence();
    }
    gda_cluster_sync();
    if (threadIdx.x == 0) {
        for (int i = 0; i < iters; ++i) {
            const int s = i % slots;
            if (i >= slots) {
                gda_mbar_wait(full + 8 * s, (unsigned)(i / slots - 1) & 1);   // this block's copy in
                gda_mbar_arrive_at(empty + 8 * s, 0);
                gda_mbar_arrive_at(empty + 8 * s, 1);
                gda_mbar_wait(empty + 8 * s, (unsigned)(i / slots - 1) & 1);  // and the other's
            }
            gda_mbar_expect(full + 8 * s, PIECE);
            const long long p = gda_l2_piece(i, 2, npieces);           // (the pair's piece)
            gda_bulk_multicast(gda_shared_at(ring + s * PIECE) + rank * (PIECE / 2),
                               src + p * PIECE + rank * (PIECE / 2), PIECE / 2, full + 8 * s, 3);
        }
        for (int i = iters > slots ? iters - slots : 0; i < iters; ++i)
            gda_mbar_wait(full + 8 * (i % slots), (unsigned)(i / slots) & 1);
        out[blockIdx.x] = reinterpret_cast<const unsigned*>(ring)[0];
    }
    __syncwarp();
    gda_cluster_sync();                                       // no block leaves while copies land
}
"""
DEFINES = {"IO_DTYPE": 2, "G_DTYPE": 0, "LOG_GATE": 0, "SCAN_O_WG": 1,   # (wgmma.cuh's cluster helpers)
           "PIECE": PIECE}
MODES = ("cp", "bulk", "mc2")


def build():
    """(cubin, log) of the probe for sm_90a."""
    pre = "".join(f"#define {k} {v}\n" for k, v in DEFINES.items())
    text = pre + "".join(_compile._read(h) + "\n" for h in ("common.cuh", "mma.cuh", "wgmma.cuh")) + SRC
    log, cubin, _ = _compile._nvrtc("gda_l2_rate", DEFINES, text,
                                    _compile._options(("--gpu-architecture=sm_90a",), "sm_90a"))
    return cubin, log


def first_words(mode, blocks, iters, share, slots, npieces):
    """What each block's ring holds in its first word after a launch: slot 0's last fill's
    piece's first word (the source is arange, 4 bytes a word)."""
    last = (iters - 1) // slots * slots
    group = 2 if mode == "mc2" else share
    b = np.arange(blocks)
    return ((b // group + last * (blocks // group)) % npieces * (PIECE // 4)).astype(np.uint32)


def main(argv):
    cubin, _ = build()
    print(f"built for sm_90a: {len(cubin)} bytes", flush=True)
    if "--compile-only" in argv:
        return 0
    import cupy
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 15
    clock = bench.CupyClock()
    dev = cupy.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    l2 = dev.attributes["L2CacheSize"]
    print(f"GPU {cupy.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, {sms} SMs, "
          f"L2 {l2 / 2**20:.0f} MiB; a block an SM, pieces of {PIECE} bytes; median of {reps}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "l2_rate.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        module = cupy.RawModule(path=path)
        big = cupy.arange(2**30 // 4, dtype=np.uint32)           # 1 GiB
        out = cupy.zeros(sms, np.uint32)
        blocks = sms - sms % 8
        iters = int(2e9 / (blocks * PIECE))                        # ~2 GB into the SMs a launch
        print(f"{'mode':5s} {'set MiB':>8s} {'share':>5s} {'slots':>5s} {'ms':>8s} "
              f"{'into SMs TB/s':>14s} {'from L2 TB/s':>13s}  copies", flush=True)
        wrong = 0
        for mode in MODES:
            fn = module.get_function("gda_l2_" + mode)
            for mib in (8, 24, 40, 1024):
                npieces = mib * 2**20 // PIECE
                for share in ((2,) if mode == "mc2" else (1, 8)):
                    for slots in (4, 8, 16):
                        fn.max_dynamic_shared_size_bytes = slots * PIECE

                        def launch():
                            fn((blocks,), (128,), (big, np.int64(npieces), np.int32(iters),
                                                   np.int32(share), np.int32(slots), out),
                               shared_mem=slots * PIECE)
                        out.fill(0xFFFFFFFF)
                        ms = bench.measure(clock, launch, reps, 10.0)["ms"]
                        into = blocks * iters * PIECE / (ms * 1e-3) / 1e12
                        reads = into / 2 if mode == "mc2" else into
                        right = np.array_equal(cupy.asnumpy(out[:blocks]), first_words(
                            mode, blocks, iters, share, slots, npieces))
                        wrong += not right
                        print(f"{mode:5s} {mib:8d} {share:5d} {slots:5d} {ms:8.3f} {into:14.2f} "
                              f"{reads:13.2f}  {'right' if right else 'WRONG'}", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
