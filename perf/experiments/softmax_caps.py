"""Register cap of the forward 8-vector row kernel (32 values a lane): spills and speed
at the rows it serves (8192 rows of 1024-8192 floats), and the resources of every
softmax row kernel per dtype.

    PYTHONPATH=. python perf/experiments/softmax_caps.py
"""
import math

import numpy as np
import torch
from numba import cuda, float32

import nbdnn
from nbdnn.bench import copy_bandwidth, time_gpu
from nbdnn.cuda.runtime import launch as _launch
from nbdnn.cuda import softmax as S


def main():
    f = S.device_functions(np.float32)
    ns = dict(f, cuda=cuda, math=math, load4=S.load4, store4=S.store4, CT=float32,
              SHM=S.SHM, FAST=S.FAST, LOG=S.LOG)
    sig = "void(float32[::1], float32[::1], int64, int64, int64, int64, float32, float32, int64)"
    xs = {L: torch.randn(8192, L, device="cuda") for L in (1024, 4096, 8192)}
    for cap in (64, 80, 96, 128):
        k = _launch.Kernel(S._rows_kernel(8, False, ns), [sig], max_registers=cap)
        S._KERNELS["rows_fwd_v8", "float32"] = (k, sig)
        out = []
        for L, x in xs.items():
            y = torch.empty_like(x)
            t = time_gpu(lambda: nbdnn.softmax(x, -1, out=y))
            ok = torch.allclose(y, torch.softmax(x, -1), atol=1e-6)
            out.append(f"L={L} {8 * x.numel() / t / copy_bandwidth(4 * x.numel()) * 100:.0f}%"
                       f"{'' if ok else ' WRONG'}")
        print(f"cap {cap}: {k.resources(sig)} {', '.join(out)}", flush=True)
    S._KERNELS = S._build(fused_maxreg=S.FUSED_MAXREG)
    for (name, dtype), (k, sg) in S._KERNELS.items():
        if name.startswith(("rows_", "fused")):
            print(f"{name:16} {dtype:8} {k.resources(sg)}", flush=True)


if __name__ == "__main__":
    main()
