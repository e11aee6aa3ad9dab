"""What compute-sanitizer's racecheck says of a producer/consumer ring on mbarriers that is
correct by construction, as scan_o's producer warps use them (v49): one producer warp fills two
slots of shared memory (by cp.async, or by plain stores with --stores) and arrives on the slot's
full barrier (cp.async.mbarrier.arrive.noinc, then mbarrier.arrive); two consumer warps wait on
it (try_wait.acquire), read the slot, meet on named barrier 1 and arrive on its empty barrier
(a lane each), which the producer waits on before it fills the slot again. The sums it prints
are checked against NumPy. Run under racecheck (device_run.sh's sanitize-producer phase):
    compute-sanitizer --tool racecheck python -m scripts.racecheck_mbar_probe [--stores]
With racecheck of CUDA 13.0 (2025.3.1) every slot write is reported as racing every read
(perf-notes v50): the ordering through mbarriers is not modelled, so such reports in scan_o's
producer form are no evidence of a race there."""
import sys

import numpy as np

from cupy_gda import _compile

SRC = r'''
extern "C" __global__ void gda_probe_ring(const float* __restrict__ src, float* out, int iters, int stores) {
    __shared__ __align__(16) float buf[2][256];
    __shared__ __align__(8) unsigned long long bars[4];
    const unsigned full = gda_shared_at(bars), empty = full + 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; ++s) {
            gda_mbar_init(full + 8 * s, 2 * 32);        // each producer lane's two arrivals
            gda_mbar_init(empty + 8 * s, 2);            // a consumer warp's one
        }
        gda_mbar_init_fence();
    }
    __syncthreads();
    if (warp == 2) {                                    // the producer
        for (int it = 0; it < iters; ++it) {
            const int s = it & 1;
            if (it >= 2) gda_mbar_wait(empty + 8 * s, (unsigned)(it / 2 - 1) & 1);
            const float* g = src + it * 256 + lane * 8;
            if (stores) {
                for (int j = 0; j < 8; ++j) buf[s][lane * 8 + j] = g[j];
            } else {
                gda_cp16_at(gda_shared_at(&buf[s][lane * 8]), g);
                gda_cp16_at(gda_shared_at(&buf[s][lane * 8 + 4]), g + 4);
            }
            gda_cp_arrive(full + 8 * s);
            gda_mbar_arrive(full + 8 * s);
        }
        gda_cp_wait<0>();
        return;
    }
    float acc = 0.f;                                    // the consumers
    for (int it = 0; it < iters; ++it) {
        const int s = it & 1;
        gda_mbar_wait(full + 8 * s, (unsigned)(it / 2) & 1);
        for (int j = 0; j < 4; ++j) acc += buf[s][(threadIdx.x * 4 + j + it) % 256];
        gda_bar_sync(1, 64);
        if (lane == 0) gda_mbar_arrive(empty + 8 * s);
    }
    out[threadIdx.x] = acc;
}
'''


def main(argv=None):
    import cupy
    stores = "--stores" in (sys.argv[1:] if argv is None else argv)
    iters = 64
    text = "#define IO_DTYPE 0\n#define G_DTYPE 0\n" + _compile._read("common.cuh") + SRC
    mod = cupy.RawModule(code=text, options=("-std=c++17", "--gpu-architecture=sm_90"))
    src = cupy.arange(iters * 256, dtype=np.float32) % 7
    out = cupy.zeros(64, np.float32)
    mod.get_function("gda_probe_ring")((1,), (96,), (src, out, np.int32(iters), np.int32(stores)))
    h = cupy.asnumpy(src).reshape(iters, 256)
    want = [sum(h[it][(t * 4 + j + it) % 256] for it in range(iters) for j in range(4))
            for t in range(64)]
    ok = np.array_equal(cupy.asnumpy(out), np.float32(want))
    print(f"ring by {'stores' if stores else 'cp.async'}: {'right' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
