"""cupy_gda.distributed over R processes, one a GPU (or over gloo on the CPU), against the single
call on the whole sequence: checked (--check: every output and gradient of each slice against
the single call's, relative RMS) and timed (medians of CUDA-event times; the ranks meet at a
barrier before each call), the backward also from the forward's kept incoming states, the
exchange timed alone (one all-gather of the forward's pairs).

    python -m scripts.dist_ranks --ranks 2 --front cupy --T 524288            (NCCL; GPUs 0, 1)
    python -m scripts.dist_ranks --ranks 2 --front torch --T 524288           (torch.distributed)
    python -m scripts.dist_ranks --ranks 3 --front torch --cpu --T 60 --check (gloo, no GPU)

Options: --B --T --H --K --V --dtype (float32, bfloat16) --ranks --front --cpu --check --reps.
The parent starts the R workers (this module with --worker RANK), NCCL's NVLink multicast off
(NCCL_NVLS_ENABLE=0), and prints their lines, rank 0's report last. Each worker builds the whole
sequence from one seed (the same on every rank) and runs its own slice (T split evenly; the
last slice takes the rest); with --check each also runs the single call on the whole sequence.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m scripts.dist_ranks")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--front", choices=("cupy", "torch"), default="cupy")
    ap.add_argument("--cpu", action="store_true", help="torch front over gloo, no GPU")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    for n, d in (("B", 1), ("T", 524288), ("H", 16), ("K", 128), ("V", 128)):
        ap.add_argument(f"--{n}", type=int, default=d)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.cpu and a.front != "torch":
        ap.error("--cpu runs the torch front (gloo)")
    return a


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.worker is not None:
        return worker(a)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
        args = [a2 for a2 in (sys.argv[1:] if argv is None else argv)]
        procs = [subprocess.Popen([sys.executable, "-m", "scripts.dist_ranks", *args,
                                   "--worker", str(r), "--dir", d], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(a.ranks)]
        outs = [p.communicate()[0] for p in procs]
    for r in reversed(range(a.ranks)):
        print(outs[r].rstrip())
    bad = [r for r, p in enumerate(procs) if p.returncode]
    if bad:
        print(f"dist_ranks: ranks {bad} failed")
        return 1
    return 0


# ---------------------------------------------------------------------------------- a worker

def worker(a):
    import numpy as np
    import cupy_gda
    from cupy_gda import distributed
    r, R = a.worker, a.ranks
    gpu = not a.cpu
    if a.front == "cupy":
        import cupy as xp
        from cupy.cuda import nccl
        xp.cuda.Device(r).use()
        comm = nccl.NcclCommunicator(R, _nccl_id(a.dir, r, nccl), r)

        def barrier():
            x = xp.zeros((1,), xp.float32)
            comm.allReduce(x.data.ptr, x.data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                           xp.cuda.get_current_stream().ptr)
            xp.cuda.get_current_stream().synchronize()
    else:
        import torch
        import torch.distributed as dist
        if gpu:
            torch.cuda.set_device(r)
        dist.init_process_group("nccl" if gpu else "gloo", init_method=f"file://{a.dir}/pg",
                                rank=r, world_size=R)
        comm = dist.group.WORLD

        def barrier():
            dist.barrier()
            if gpu:
                torch.cuda.synchronize()
    x, do, dht = _inputs(a, gpu)
    lo, hi = _bounds(a.T, R, r)
    mine = {n: v[:, lo:hi] for n, v in x.items() if n != "initial_state"}
    mine["initial_state"] = x["initial_state"]
    do_r, dht_r = do[:, lo:hi], dht
    if a.front == "torch":
        mine = {n: _torch(v, gpu) for n, v in mine.items()}
        do_r, dht_r = _torch(do_r, gpu), _torch(dht_r, gpu)

    def fwd(**kw):
        return distributed.gated_attention(**mine, comm=comm, output_final_state=True, **kw)

    def bwd(**kw):
        return distributed.gated_attention_backward(**mine, comm=comm, do=do_r,
                                                    d_final_state=dht_r, **kw)
    lines = [f"rank {r}: slice [{lo}, {hi}) of T = {a.T}, {a.front}{' (gloo, CPU)' if a.cpu else ''}"]
    if a.check:
        o, ht = fwd()
        grads = bwd()
        want_o, want_ht = cupy_gda.gated_attention(**x, output_final_state=True)
        want = cupy_gda.gated_attention_backward(**x, do=do, d_final_state=dht)
        worst = 0.0
        for name, got, ref in (("o", o, want_o[:, lo:hi]), ("final_state", ht, want_ht),
                               *((n, g, w if n == "dinitial_state" else w[:, lo:hi])
                                 for n, g, w in zip(want._fields, grads, want))):
            d = _rel(np, _host(got), _host(ref))
            worst = max(worst, d)
            lines.append(f"  check {name:15s} rel. RMS difference to the single call {d:.2e}")
        tol = 1e-4 if a.dtype == "float32" else 2e-2
        lines.append(f"  check {'ok' if worst <= tol else 'FAILED'} (worst {worst:.2e}, "
                     f"tolerance {tol:g})")
        if worst > tol:
            print("\n".join(lines))
            return 1
    times = {"fwd": median_ms(fwd, barrier, a.reps, gpu), "bwd": median_ms(bwd, barrier, a.reps, gpu)}
    kept = fwd(keep_states=True)[2]
    times["bwd from kept states"] = median_ms(lambda: bwd(states=kept), barrier, a.reps, gpu)
    payload = _payload(a, gpu)
    times["exchange"] = median_ms(lambda: _exchange(distributed, comm, payload, a), barrier,
                                a.reps, gpu)
    lines.append("  " + "  ".join(f"{n} {ms:.3f} ms" for n, ms in times.items()))
    if r == 0:                # (the others wait at the last barrier)
        single = {"fwd": median_ms(lambda: cupy_gda.gated_attention(**x, output_final_state=True),
                                 lambda: None, a.reps, gpu),
                  "bwd": median_ms(lambda: cupy_gda.gated_attention_backward(
                      **x, do=do, d_final_state=dht), lambda: None, a.reps, gpu)}
        lines.append("  one device, the whole sequence: " + "  ".join(
            f"{n} {ms:.3f} ms" for n, ms in single.items()))
        lines.append("  ratio (rank 0 / one device): " + "  ".join(
            f"{n} {times[n] / single[n]:.3f}" for n in single)
            + f"  bwd from kept states {times['bwd from kept states'] / single['bwd']:.3f}")
    barrier()                 # no rank leaves (and closes its connections) while one still runs
    if a.front == "torch":
        dist.destroy_process_group()
    print("\n".join(lines))
    return 0


def _nccl_id(d, r, nccl):
    """NCCL's id through a file in ``d``: rank 0 writes it whole (a rename), the others wait."""
    import json
    path = os.path.join(d, "nccl-id")
    if r == 0:
        with open(path + ".tmp", "w") as f:
            json.dump(list(nccl.get_unique_id()), f)
        os.replace(path + ".tmp", path)
    while not os.path.exists(path):
        time.sleep(0.05)
    with open(path) as f:
        return tuple(json.load(f))


def _inputs(a, gpu):
    """The whole sequence (the same on every rank: one seed), do and d_final_state; bfloat16
    q, k, v and do where --dtype says (made through torch on the GPU)."""
    import numpy as np
    if gpu:
        import cupy as xp
    else:
        xp = np
    rs = xp.random.RandomState(0)

    def normal(*shape):
        return rs.standard_normal(shape).astype(np.float32)

    B, T, H, K, V = a.B, a.T, a.H, a.K, a.V
    x = dict(q=normal(B, T, H, K) / np.float32(K ** 0.5), k=normal(B, T, H, K),
             v=normal(B, T, H, V),
             gate=xp.exp(-xp.logaddexp(0, -normal(B, T, H, K)) / 16).astype(np.float32),
             initial_state=normal(B, H, K, V))
    do, dht = normal(B, T, H, V), normal(B, H, K, V)
    if a.dtype == "bfloat16":
        x["q"], x["k"], x["v"], do = (_bfloat16(y, gpu) for y in (x["q"], x["k"], x["v"], do))
    return x, do, dht


def _bfloat16(x, gpu):
    if gpu:
        import cupy
        import torch
        return cupy.from_dlpack(torch.from_dlpack(x).to(torch.bfloat16))
    import ml_dtypes
    return x.astype(ml_dtypes.bfloat16)


def _bounds(T, R, r):
    n = T // R
    return r * n, (T if r == R - 1 else (r + 1) * n)


def _torch(x, gpu):
    import torch
    if x is None:
        return None
    if gpu:
        return torch.from_dlpack(x)
    import numpy as np
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(x.astype(np.float32))).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x))


def _host(x):
    import numpy as np
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    elif hasattr(x, "get"):
        x = x.get()
    return np.asarray(x, np.float64)


def _rel(np, got, ref):
    return float(np.sqrt(np.mean((got - ref) ** 2)) / max(np.sqrt(np.mean(ref ** 2)), 1e-30))


def median_ms(fn, barrier=lambda: None, reps=7, gpu=True):
    """Median ms of ``reps`` calls (after one warm-up), the ranks aligned before each."""
    import statistics
    fn()
    times = []
    for _ in range(reps):
        barrier()
        if gpu:
            import cupy
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(cupy.cuda.get_elapsed_time(s, e))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _payload(a, gpu):
    """An array of the forward's pairs' size: B H K (V + 1) float32."""
    if gpu:
        import cupy as xp
    else:
        import numpy as xp
    return xp.zeros((a.B, a.H, a.K, a.V + 1), xp.float32)


def _exchange(distributed, comm, payload, a):
    if a.front == "cupy":
        return distributed._Nccl(comm).allgather(payload)
    return distributed._Torch(comm).allgather(payload)


if __name__ == "__main__":
    sys.exit(main())
