"""Where a converted ResNet-50's eager training step spends its time, beside native
PyTorch's in the same process: run AX measured nbdnn.torch's bf16 channels-last step
at 62.6 ms against native's 23.8, while nbdnn.nn's own step on the same kernels runs
at 0.57x of PyTorch's, so a part of the gap is not the kernels. One eager step of each
model under torch.profiler (CPU and CUDA activity: CUPTI records every kernel of the
process, numba's launches included, and the CUDA runtime and driver calls) after
warm-up, then per model:

  step     host ms from the step's start to the synchronize after it;
  GPU      kernels' summed time, and busy: the union of kernel and copy intervals over
           the span from the first one's start to the last one's end (busy well below
           the span: the GPU waited for the host, or for a synchronous call);
  split    kernel time of numba's kernels (nbdnn's: numba's "[abi:" tags in the
           demangled name; run BB: "cudapy" is not in it, every kernel counted as
           PyTorch's) against PyTorch's (its optimizer, autocast casts, residual adds,
           loss); the profiler's user ranges on the GPU timeline (record_function:
           Optimizer.zero_grad...) are left out of kernel time, which they overlap;
  calls    the runtime and driver calls that block the host or the device (stream,
           context and event synchronizes, synchronous copies, cuMemAlloc and
           cuMemFree) by name and count; and launches by API;
  top      the largest kernels by summed time;
  numba    what nbdnn asked of numba's driver layer in the step, counted in Python (the
           profiler may not see driver calls): host-to-device and device-to-host copies,
           stream, event and context synchronizes, allocations, flushes of its pending
           frees (cuMemFree, which synchronizes), and the TMA maps encoded (each new
           address: an encode and a copy that waits until it lands). In a steady eager
           step all of these should be 0: each one stalls the host or the GPU.

    PYTHONPATH=. python perf/experiments/torch_step_profile.py [--config bf16-cl]
        [--batch 32] [--top 25] [--device cpu]   (cpu: a dry run of the script)
"""
import argparse
import collections
import contextlib
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import nbdnn.torch as nt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suites"))
from torch_models import CONFIGS, step_fn  # noqa: E402  (perf/suites/torch_models.py)

BLOCKING = ("Synchronize", "cudaMemcpy", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemAlloc",
            "cuMemFree", "cudaMalloc", "cudaFree", "cuMemHostAlloc", "cudaHostAlloc")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def blocking(name):
    """Whether a runtime or driver call blocks the host (a synchronize, a copy that is
    not Async, an allocation or free through the driver)."""
    return any(b in name for b in BLOCKING) and "Async" not in name


def union_us(intervals):
    """The total length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


@contextlib.contextmanager
def numba_calls():
    """Counts of numba driver-layer calls (and TMA map encodes) made within."""
    from numba.cuda.cudadrv import driver as drv
    from nbdnn.cuda.tensorcore import tensormap
    counts = collections.Counter()
    patched = []
    for where, name in ((None, "host_to_device"), (None, "device_to_host"),
                        ("Stream", "synchronize"), ("Event", "synchronize"),
                        ("Context", "synchronize"), ("Context", "memalloc"),
                        ("_PendingDeallocs", "clear")):
        owner = drv if where is None else getattr(drv, where, None)
        real = getattr(owner, name, None)
        if real is None:  # (numba's simulator: none of these)
            continue

        def counted(*a, _real=real, _key=f"{getattr(owner, '__name__', '')}.{name}", **k):
            if _key.endswith("clear") and not a[0]._cons:
                return _real(*a, **k)  # (an empty queue frees nothing)
            counts[_key] += 1
            return _real(*a, **k)
        setattr(owner, name, counted)
        patched.append((owner, name, real))
    encoders = (tensormap._encoded, tensormap._encoded_im2col)
    misses = [f.cache_info().misses for f in encoders]
    try:
        yield counts
    finally:
        for owner, name, real in patched:
            setattr(owner, name, real)
        counts["tensor maps encoded"] = sum(f.cache_info().misses - m
                                            for f, m in zip(encoders, misses))


def report(name, prof, wall_ms, top, device):
    kernels, spans, calls, nbdnn_us = {}, [], {}, 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            if getattr(e, "is_user_annotation", False):
                continue
            us = e.device_time if hasattr(e, "device_time") else e.cuda_time
            n, c = kernels.get(e.name, (0, 0.0))
            kernels[e.name] = (n + 1, c + us)
            spans.append((e.time_range.start, e.time_range.end))
            if "[abi:" in e.name or "cudapy" in e.name:
                nbdnn_us += us
        elif blocking(e.name) or e.name in LAUNCHES:
            n, c = calls.get(e.name, (0, 0.0))
            calls[e.name] = (n + 1, c + e.cpu_time_total)
    total = sum(c for _, c in kernels.values())
    print(f"=== {name}: step {wall_ms:.2f} ms on the host", flush=True)
    if device == "cuda":
        span = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e3 if spans else 0.0
        busy = union_us(spans) / 1e3
        print(f"GPU: kernels {total / 1e3:.2f} ms in {sum(n for n, _ in kernels.values())} "
              f"launches; busy {busy:.2f} ms of a {span:.2f} ms span "
              f"({100 * busy / max(span, 1e-9):.0f}%)")
        print(f"split: nbdnn (numba) kernels {nbdnn_us / 1e3:.2f} ms, the rest "
              f"{(total - nbdnn_us) / 1e3:.2f} ms")
    for c, (n, us) in sorted(calls.items(), key=lambda kv: -kv[1][1]):
        print(f"call {c:28} {n:6}x {us / 1e3:8.3f} ms host{'  BLOCKS' if blocking(c) else ''}")
    for k, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{us / 1e3:8.3f} ms {100 * us / max(total, 1e-9):5.1f}% {n:4}x  {k[:100]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="bf16-cl", choices=sorted(CONFIGS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--warm", type=int, default=5, help="eager steps before the profiled one")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = p.parse_args()
    import torchvision
    dev = a.device
    bf16, last = CONFIGS[a.config]
    fmt = torch.channels_last if last else torch.contiguous_format
    torch.manual_seed(0)
    native = torchvision.models.resnet50().to(dev).to(memory_format=fmt).train()
    ours, _ = nt.convert(native)
    x = torch.randn(a.batch, 3, 224, 224, device=dev).contiguous(memory_format=fmt)
    labels = torch.randint(0, 1000, (a.batch,), device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    for name, model in (("native", native), ("nbdnn.torch", ours)):
        step = step_fn(model, x, labels, bf16 and dev == "cuda")
        for i in range(a.warm):  # (the first compiles every kernel; the 4th of a call
            # signature on replays its eager plan)
            t0 = time.perf_counter()
            step()
            sync()
            print(f"{name} warm-up step {i}: {time.perf_counter() - t0:.2f} s",
                  file=sys.stderr, flush=True)
        with numba_calls() as counts:
            t0 = time.perf_counter()
            step()
            sync()
            unprofiled = (time.perf_counter() - t0) * 1e3
        print(f"=== {name}: unprofiled step {unprofiled:.2f} ms; numba driver-layer calls: "
              f"{dict(counts) or 'none'}", flush=True)
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            step()
            sync()
            wall = (time.perf_counter() - t0) * 1e3
        report(f"{name} ResNet-50 {a.config} B {a.batch} eager step", prof, wall, a.top, dev)


if __name__ == "__main__":
    main()
