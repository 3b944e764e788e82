"""Diagnostics for kernel tuning on a GPU (one call, many variants): registers and
spills of the kernels a bench touched, softmax row-kernel configurations, activation
unroll depth. Prints a table per experiment.

    PYTHONPATH=. python perf/diagnose.py [softmax] [activation] [reduce]
"""
import math
import sys

import numpy as np
import torch

import nbdnn
from nbdnn.bench import time_gpu, copy_bandwidth
from nbdnn.cuda import _launch, softmax as S, activation as A
from numba import cuda, float32


def softmax_variants():
    rows = 8192
    f = S.device_functions(np.float32)
    ns = dict(f, cuda=cuda, math=math, load4=S.load4, store4=S.store4, CT=float32, SHM=S.SHM,
              FAST=S.FAST, LOG=S.LOG)
    sig = "void(float32[::1], float32[::1], int64, int64, int64, int64, float32, float32, int64)"
    orig_cfg = S._rows_config
    for L in (1024, 4096, 8192, 32768):
        x = torch.randn(rows, L, device="cuda")
        y = torch.empty_like(x)
        bw = copy_bandwidth(4 * rows * L)
        tt = time_gpu(lambda: torch.softmax(x, -1))
        V0, G0 = orig_cfg(L, False, False)
        print(f"L={L}: default V={V0} G={G0}; torch {tt*1e3:.3f} ms ({8*rows*L/tt/bw*100:.0f}% copy)")
        for V in (1, 2, 4, 8):
            G = L // (4 * V)
            if G < 32 or G > 1024:
                continue
            for maxreg in (None, 64, 128, 255):
                opts = {} if maxreg is None else {"max_registers": maxreg}
                k = _launch.Kernel(S._rows_kernel(V, False, ns), [sig], **opts)
                try:
                    res = k.resources(sig)
                except Exception as e:  # noqa: BLE001
                    print("   V", V, "maxreg", maxreg, "compile failed", e)
                    continue
                S._KERNELS[f"rows_fwd_v{V}", "float32"] = (k, sig)
                S._rows_config = lambda L_, b, blk, V=V, G=G: (V, G)
                try:
                    t = time_gpu(lambda: nbdnn.softmax(x, -1, out=y))
                    ok = torch.allclose(y, torch.softmax(x, -1), atol=1e-6)
                    print(f"   V={V} G={G} maxreg={maxreg}: {t*1e3:.3f} ms "
                          f"{8*rows*L/t/bw*100:.0f}% copy, {tt/t:.2f}x torch, {res}, ok={ok}")
                except Exception as e:  # noqa: BLE001
                    print(f"   V={V} G={G} maxreg={maxreg}: failed {type(e).__name__}: {str(e)[:120]}")
        S._rows_config = orig_cfg


def activation_variants():
    n = 1 << 28
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    bw = copy_bandwidth(4 * n)
    for groups in (2, 4, 8):
        for block in (128, 256, 512):
            A.GROUPS, A.BLOCK = groups, block
            A._SOURCES = {d: A._kernel_source(d) for d in (False, True)}
            A._FORWARD, A._BACKWARD = A._build()
            t = time_gpu(lambda: nbdnn.activation(x, "relu", out=y))
            print(f"relu GROUPS={groups} BLOCK={block}: {8*n/t/bw*100:.1f}% copy")


def reduce_resources():
    x = torch.randn(8192, 32768, device="cuda")
    for op in ("add", "max", "norm2"):
        for axes in (None, (1,)):
            nbdnn.reduce_tensor(x, op, axes)
    for k in _launch.REGISTRY:
        for sig in k._launchers:
            print(k.name, k.resources(sig))


if __name__ == "__main__":
    what = sys.argv[1:] or ["softmax", "activation", "reduce"]
    if "reduce" in what:
        reduce_resources()
    if "softmax" in what:
        softmax_variants()
    if "activation" in what:
        activation_variants()
