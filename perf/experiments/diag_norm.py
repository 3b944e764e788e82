"""Where the time of the pool and norm bench rows goes (H200): for each case the bench's
flushed event time, the per-call time of 20 calls back to back, the host time of one
call, and the GPU kernels PyTorch's profiler (CUPTI) sees, with their durations.
A row whose host time exceeds its kernel time is launch-bound, not bandwidth-bound.

    PYTHONPATH=. python perf/experiments/diag_norm.py [case-substring ...]
"""
import statistics
import sys
import time

import numpy as np
import torch

from nbdnn.bench import time_gpu
from nbdnn.bench.cases_norm import _bn_cases, _pool_cases, _row_norm_cases


def back_to_back(fn, calls=20):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3 / calls


def host_time(fn, calls=50):
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def kernels(fn):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        if ev.device_time_total > 0:
            rows.append((ev.key[:48], ev.count // 5, ev.device_time_total / ev.count))
    return sorted(rows, key=lambda r: -r[1] * r[2])


def main(subs):
    n = 1 << 28
    rng = np.random.default_rng(0)
    host = {"x": rng.standard_normal(n, dtype=np.float32),
            "dy": rng.standard_normal(n, dtype=np.float32)}
    dev = {k: torch.from_numpy(v).cuda() for k, v in host.items()}
    dev["y"] = torch.empty_like(dev["x"])
    for label, _, shape, _, nbytes, make, *_ in _pool_cases(n) + _bn_cases(n) + \
            _row_norm_cases(n):
        if subs and not any(s in label for s in subs):
            continue
        fns = make(dev, host)
        for who in ("gpu", "torch"):
            fn = fns.get(who)
            if fn is None:
                continue
            t = time_gpu(fn)
            print(f"{label:28s} {who:5s} flushed {t * 1e3:7.3f} ms  back-to-back "
                  f"{back_to_back(fn) * 1e3:7.3f} ms  host {host_time(fn) * 1e6:6.0f} us  "
                  f"{nbytes / t / 1e9:6.0f} GB/s", flush=True)
            for name, count, us in kernels(fn):
                print(f"    {count:2d} x {us:8.1f} us  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
