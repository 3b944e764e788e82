"""Cross-channel LRN on the GPU; the formulas are in nbdnn/cpu/lrn.py.

A thread an element, in memory order. Forward sums x^2 over its channel window (n
reads of neighbours, from L1); backward sums dy_j x_j s_j^(-beta-1) over the channels
j whose window holds it, recomputing each s_j (n^2 reads, L1-resident for n = 5).
Channels are HW apart (NCHW) or adjacent (NHWC). Gathers only: deterministic.

Verified on the H200 (crosscheck, PyTorch comparisons, determinism; perf/RESULTS.md
runs G-I). Speed not yet measured.
"""
import math

import numpy as np
from numba import cuda, float32, float64

from ._arrays import dtype_name, empty
from ._conv_index import launch
from ._launch import Kernel

DTYPES = ("float16", "float32", "float64")


def _kernels(CT):
    @cuda.jit(device=True)
    def scale(x, base, c, C, cs, n, alpha, k):
        """s_c of the element whose channel-0 offset is base."""
        q = CT(0)
        for j in range(max(0, c - n // 2), min(C, c + (n - 1) // 2 + 1)):
            v = CT(x[base + j * cs])
            q += v * v
        return k + alpha / CT(n) * q

    @cuda.jit(device=True)
    def place(i, C, HW, last):
        """(channel, channel-0 offset, channel stride) of element i."""
        if last:
            c = i % C
            return c, i - c, 1
        c = (i // HW) % C
        return c, i - c * HW, HW

    def lrn_fwd(x, y, N, C, HW, last, n, alpha, beta, k):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < N * C * HW:
            c, base, cs = place(i, C, HW, last)
            y[i] = CT(x[i]) * math.pow(scale(x, base, c, C, cs, n, alpha, k), -beta)
            i += cuda.gridDim.x * cuda.blockDim.x

    def lrn_bwd(dy, x, dx, N, C, HW, last, n, alpha, beta, k):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < N * C * HW:
            c, base, cs = place(i, C, HW, last)
            t = CT(0)
            for j in range(max(0, c - (n - 1) // 2), min(C, c + n // 2 + 1)):
                o = base + j * cs
                t += CT(dy[o]) * CT(x[o]) * math.pow(scale(x, base, j, C, cs, n, alpha, k),
                                                     -beta - CT(1))
            s = scale(x, base, c, C, cs, n, alpha, k)
            dx[i] = CT(dy[i]) * math.pow(s, -beta) - CT(2) * alpha * beta / CT(n) * CT(x[i]) * t
            i += cuda.gridDim.x * cuda.blockDim.x

    return {"fwd": lrn_fwd, "bwd": lrn_bwd}


def _build():
    table = {}
    for ct, CT in (("float32", float32), ("float64", float64)):
        ks = _kernels(CT)
        for t in (d for d in DTYPES if (d == "float64") == (ct == "float64")):
            a = f"{t}[::1]"
            tail = f"int64, int64, int64, int64, int64, {ct}, {ct}, {ct})"
            sigs = {"fwd": f"void({a}, {a}, " + tail, "bwd": f"void({a}, {a}, {a}, " + tail}
            for name, sig in sigs.items():
                table[name, t] = (Kernel(ks[name], [sig]), sig)
    return table


_KERNELS = _build()


def _geo(x, last):
    shape = tuple(int(s) for s in x.shape)
    C = shape[-1] if last else shape[1]
    return shape[0], C, int(np.prod(shape)) // max(1, shape[0] * C), int(last)


def lrn(x, n, alpha, beta, k, last, *, out, stream):
    y = out if out is not None else empty(x, x.shape, dtype_name(x))
    geo = _geo(x, last)
    launch(_KERNELS, "fwd", dtype_name(x), int(np.prod(x.shape)), stream, x, y, *geo, n, alpha,
           beta, k)
    return y


def lrn_backward(dy, x, n, alpha, beta, k, last, *, out, stream):
    dx = out if out is not None else empty(x, x.shape, dtype_name(x))
    geo = _geo(x, last)
    launch(_KERNELS, "bwd", dtype_name(x), int(np.prod(x.shape)), stream, dy, x, dx, *geo, n,
           alpha, beta, k)
    return dx
