// bench_spin: holds the stream for ns nanoseconds, so that the host queues a timed call behind it
// and its launch time stays out of the device time (cupy_gda/bench.py CupyClock). Not part of
// the op; compiled by the one compile path (cupy_gda/_compile.py) with no header.
extern "C" __global__ void bench_spin(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
