"""Time cupy_gda.distributed on one GPU, one NCCL rank, against the single-GPU call at the same
shape: what the local pass, the exchange, the combine and the corrections cost beside the
kernels (a 2-GPU host times the split itself). Medians of CUDA-event times.

    python -m scripts.time_distributed [B T H K V dtype] [--profile]

--profile: then each distributed call once under torch.profiler (CUPTI sees every kernel of the
process, CuPy's included): the kernels by device time, the table that says where the path's own
time goes.
"""
import sys

import numpy as np

import cupy_gda
from cupy_gda import _verify, distributed
from scripts.dist_ranks import median_ms


def main(B=1, T=65536, H=16, K=128, V=128, dtype="float32", profile=False):
    import cupy
    from cupy.cuda import nccl
    case = _verify.Case(int(B), int(T), int(H), int(K), int(V), dtype=dtype)
    x = {n: cupy.asarray(a) for n, a in _verify.make_inputs(case, 0).items() if a is not None}
    x.pop("initial_state", None)
    do = cupy.asarray(np.random.default_rng(1).standard_normal(x["v"].shape).astype(x["v"].dtype))
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    rows = [("single fwd", lambda: cupy_gda.gated_attention(**x)),
            ("one rank fwd", lambda: distributed.gated_attention(**x, comm=comm)),
            ("single bwd", lambda: cupy_gda.gated_attention_backward(**x, do=do)),
            ("one rank bwd", lambda: distributed.gated_attention_backward(**x, comm=comm, do=do)),
            ("bwd from kept", lambda: distributed.gated_attention_backward(**x, comm=comm, do=do,
                                                                           states=kept))]
    _, kept = distributed.gated_attention(**x, comm=comm, keep_states=True)
    print(f"B{B} T{T} H{H} K{K} V{V} {dtype}")
    for name, fn in rows:
        print(f"  {name:14s} {median_ms(fn):9.3f} ms")
    if profile:
        import torch
        from torch.profiler import ProfilerActivity
        for name, fn in rows[1::2] + rows[4:]:
            with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                cupy.cuda.Device().synchronize()
            print(f"{name}: kernels by device time")
            print(prof.key_averages().table(sort_by="device_time_total", row_limit=25,
                                            max_name_column_width=70))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--profile"]
    main(*args, profile="--profile" in sys.argv[1:])
