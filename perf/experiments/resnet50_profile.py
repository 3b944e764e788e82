"""Where nbdnn's ResNet-50 bf16 training step (batch 32, channels-last, SGD with float32
masters) spends its GPU time: one eager step under torch.profiler (CUPTI records every
kernel of the process, numba's launches included), after warm-up, kernels summed by
name, the largest first, with their share of the step.

    PYTHONPATH=. python perf/experiments/resnet50_profile.py [--batch 32] [--top 30]
        [--set MODULE.NAME=VALUE ...]   (perf/tools/switches.py)
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from nbdnn import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import switches  # noqa: E402  (perf/tools/switches.py)

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--top", type=int, default=30)
switches.add_argument(p)
a = p.parse_args()
switches.apply(a.set)
model = nn.resnet50(layout="NHWC").to("cuda")
rng = np.random.default_rng(0)
x = torch.from_numpy(rng.standard_normal((a.batch, 224, 224, 3), np.float32)).cuda().bfloat16()
t = torch.from_numpy(np.eye(1000, dtype=np.float32)[rng.integers(0, 1000, a.batch)]).cuda()
steps = model.plan(a.batch, (224, 224, 3), loss=nn.CrossEntropyLoss(),
                   optimizer=nn.SGD(model, 0.01, momentum=0.9), precision="bf16", graph=False)
for i in range(3):  # (the first compiles every kernel: progress on stderr)
    t0 = time.perf_counter()
    steps.step(x, t)
    torch.cuda.synchronize()
    print(f"warm-up step {i}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    steps.step(x, t)
    torch.cuda.synchronize()
rows = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        us = e.device_time if hasattr(e, "device_time") else e.cuda_time
        n, c = rows.get(e.name, (0, 0.0))
        rows[e.name] = (n + 1, c + us)
total = sum(c for _, c in rows.values())
print(f"GPU kernel time of one eager step: {total / 1e3:.2f} ms in "
      f"{sum(n for n, _ in rows.values())} kernels")
for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:a.top]:
    print(f"{us / 1e3:8.3f} ms {100 * us / total:5.1f}% {n:4}x  {name[:90]}")
