"""Diagnostics for kernel tuning on a GPU (one call, many variants): registers and
spills of the kernels a bench touched, softmax row-kernel configurations, activation
unroll depth. Prints a table per experiment.

    PYTHONPATH=. python perf/experiments/diagnose.py [timing] [softmax] [softmax_long] [activation] [reduce]
"""
import math
import sys

import numpy as np
import torch

import nbdnn
from nbdnn.bench import time_gpu, copy_bandwidth
from nbdnn.cuda.runtime import launch as _launch
from nbdnn.cuda import softmax as S, activation as A
from numba import cuda, float32


def softmax_variants():
    """Every forward/backward path forced at 8192 rows (`_kernel`), and the fused
    kernel's block size; % of copy of the same size, x torch in the same run."""
    rows = 8192
    for L in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
        x = torch.randn(rows, L, device="cuda")
        y, dy, dx = torch.empty_like(x), torch.randn_like(x), torch.empty_like(x)
        bw = copy_bandwidth(4 * rows * L)
        tf = time_gpu(lambda: torch.softmax(x, -1))
        ref = torch.softmax(x, -1)
        tb = time_gpu(lambda: torch.ops.aten._softmax_backward_data(dy, ref, -1, x.dtype))
        print(f"L={L}: torch fwd {tf*1e3:.3f} ms ({8*rows*L/tf/bw*100:.0f}%), "
              f"bwd {tb*1e3:.3f} ms ({12*rows*L/tb/bw*100:.0f}%)", flush=True)
        for kern in (None, "rows", "fused", "long"):
            blocks = (256, 512, 1024) if kern == "fused" else (0,)
            for blk in blocks:
                saved_block = S.FUSED_BLOCK
                if blk:
                    S.FUSED_BLOCK = {False: blk, True: blk}
                for bwd in (False, True):
                    try:
                        if bwd:
                            fn = lambda: nbdnn.softmax_backward(dy, ref, -1, out=dx, _kernel=kern)
                        else:
                            fn = lambda: nbdnn.softmax(x, -1, out=y, _kernel=kern)
                        fn()
                        ok = torch.allclose(dx, torch.ops.aten._softmax_backward_data(
                            dy, ref, -1, x.dtype), atol=1e-5) if bwd else \
                            torch.allclose(y, ref, atol=1e-6)
                        t = time_gpu(fn)
                        nb, tt = (12, tb) if bwd else (8, tf)
                        print(f"   {'bwd' if bwd else 'fwd'} {str(kern):6} block {blk:5}: "
                              f"{t*1e3:.3f} ms {nb*rows*L/t/bw*100:4.0f}% copy "
                              f"{tt/t:5.2f}x torch ok={ok}", flush=True)
                    except Exception as e:  # noqa: BLE001
                        print(f"   {kern} bwd={bwd}: {type(e).__name__}: {str(e)[:100]}")
                S.FUSED_BLOCK = saved_block
        del x, y, dy, dx, ref
        torch.cuda.empty_cache()


def softmax_long_variants(fused=True, lengths=(8192, 16384, 32768, 65536)):
    """The fused kernel's knobs (block, register cap, cache-hinted second pass) and a
    16-vector register row, on 8192 rows of 8k-64k floats."""
    rows = 8192
    f = S.device_functions(np.float32)
    ns = dict(f, cuda=cuda, math=math, load4=S.load4, store4=S.store4, CT=float32,
              SHM=S.SHM, FAST=S.FAST, LOG=S.LOG)
    sig = "void(float32[::1], float32[::1], int64, int64, int64, int64, float32, float32, int64)"
    for L in lengths:
        x = torch.randn(rows, L, device="cuda")
        y, dy, dx = torch.empty_like(x), torch.randn_like(x), torch.empty_like(x)
        ref = torch.softmax(x, -1)
        dref = torch.ops.aten._softmax_backward_data(dy, ref, -1, x.dtype)
        bw = copy_bandwidth(4 * rows * L)
        tf = time_gpu(lambda: torch.softmax(x, -1))
        print(f"L={L}: torch fwd {tf*1e3:.3f} ms", flush=True)
        for streaming in (False, True) if fused else ():
            for maxreg in (None, 32):
                S._KERNELS = S._build(streaming=streaming, fused_maxreg=maxreg)
                saved_block = S.FUSED_BLOCK
                for blk in (512, 1024):
                    S.FUSED_BLOCK = {False: blk, True: blk}
                    res = S._KERNELS["fused", "float32"]
                    out = []
                    for bwd in (False, True):
                        fn = (lambda: nbdnn.softmax_backward(dy, ref, -1, out=dx, _kernel="fused")) \
                            if bwd else (lambda: nbdnn.softmax(x, -1, out=y, _kernel="fused"))
                        fn()
                        ok = torch.allclose(dx, dref, atol=1e-5) if bwd else torch.allclose(y, ref, atol=1e-6)
                        t = time_gpu(fn)
                        out.append(f"{'bwd' if bwd else 'fwd'} {(12 if bwd else 8)*rows*L/t/bw*100:4.0f}%"
                                   f"{'' if ok else ' WRONG'}")
                    print(f"   fused streaming={streaming!s:5} maxreg={maxreg!s:4} block={blk:4}: "
                          f"{', '.join(out)}  {res[0].resources(res[1])}", flush=True)
                S.FUSED_BLOCK = saved_block
        S._KERNELS = S._build(fused_maxreg=S.FUSED_MAXREG)
        V = 16
        G = L // (4 * V)
        if G <= 1024:
            for maxreg in (128, 64):
                k = _launch.Kernel(S._rows_kernel(V, False, ns), [sig], max_registers=maxreg)
                saved = S._KERNELS["rows_fwd_v8", "float32"], S.rows_config
                S._KERNELS["rows_fwd_v8", "float32"] = (k, sig)
                S.rows_config = lambda L_, b, blk: (8, G)
                try:
                    nbdnn.softmax(x, -1, out=y, _kernel="rows")
                    ok = torch.allclose(y, ref, atol=1e-6)
                    t = time_gpu(lambda: nbdnn.softmax(x, -1, out=y, _kernel="rows"))
                    print(f"   rows V=16 G={G} maxreg={maxreg}: fwd {8*rows*L/t/bw*100:.0f}% "
                          f"ok={ok} {k.resources(sig)}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"   rows V=16 G={G} maxreg={maxreg}: {type(e).__name__} {str(e)[:80]}")
                S._KERNELS["rows_fwd_v8", "float32"], S.rows_config = saved
        del x, y, dy, dx, ref, dref
        torch.cuda.empty_cache()


def softmax_resources():
    """Registers and spills of every softmax row kernel a dtype uses past 1024."""
    for dt in (torch.float16, torch.float32, torch.float64):
        for L in (2048, 16384, 32768):
            x = torch.randn(264, L, device="cuda", dtype=dt)
            nbdnn.softmax(x, -1)
            nbdnn.softmax_backward(x, x, -1)
    for (name, dtype), (k, sig) in sorted(S._KERNELS.items()):
        if sig in k._launchers:
            print(f"{name:16} {dtype:8} {k.resources(sig)}")


def timing_method():
    """The same kernels timed with and without the L2 flush before each run."""
    x = torch.randn(8192, 32768, device="cuda")
    s = torch.randn(8192, 1024, device="cuda")
    sy = torch.empty_like(s)
    # (fn, bytes moved, bytes of the tensor: the copy measured against)
    cases = {"reduce add all 1 GiB": (lambda: nbdnn.reduce_tensor(x, "add"), 4 * x.numel()),
             "reduce max last 1 GiB": (lambda: nbdnn.reduce_tensor(x, "max", (1,)), 4 * x.numel()),
             "torch sum 1 GiB": (lambda: x.sum(), 4 * x.numel()),
             "softmax 8192x1024": (lambda: nbdnn.softmax(s, -1, out=sy), 8 * s.numel()),
             "torch softmax 8192x1024": (lambda: torch.softmax(s, -1), 8 * s.numel())}
    for name, (fn, nbytes) in cases.items():
        bw = copy_bandwidth(4 * (s if "softmax" in name else x).numel())
        for flush in (False, True):
            t = time_gpu(fn, flush=flush)
            print(f"{name:26} flush={flush!s:5}: {t*1e3:.4f} ms {nbytes/t/bw*100:.0f}% copy",
                  flush=True)


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
    what = sys.argv[1:] or ["softmax", "activation", "reduce", "timing"]
    if "timing" in what:
        timing_method()
    if "softmax_resources" in what:
        softmax_resources()
    if "reduce" in what:
        reduce_resources()
    if "softmax" in what:
        softmax_variants()
    if "softmax_long" in what:
        softmax_long_variants()
    if "softmax_rows" in what:  # the 16-vector register rows only
        softmax_long_variants(fused=False, lengths=(16384, 32768))
    if "activation" in what:
        activation_variants()
