"""Cross-channel LRN on the GPU; the formulas are in nbdnn/cpu/lrn.py.

A thread an element, in memory order. Forward sums x^2 over its channel window (n
reads of neighbours, from L1). Backward in two kernels: the first writes each
element's term t_j = dy_j x_j s_j^(-beta-1) to a workspace (x's size, the compute
dtype), the second sums the n terms of the channels whose window holds the element
and forms dx: 2 powers and 2n + 4 reads an element, where one kernel recomputing every
s_j took n + 1 powers and n^2 reads (5 ms for 256 MiB on the H200, 4% of copy).
Channels are HW apart (NCHW) or adjacent (NHWC); below 2**31 elements the channel is
split off by multiply-highs (_stencil.magic) instead of 64-bit divisions. Gathers
only: deterministic.

Verified on the H200 (crosscheck, PyTorch comparisons, determinism).
Measured: the forward at 12% of copy (1.97x PyTorch's) and the
one-kernel backward at 4%; the two-kernel backward and the multiply-high split are
not yet measured.
"""
import math

import numpy as np
from numba import cuda, float32, float64

from .runtime.memory.arrays import dtype_name, empty
from .runtime.launch.grid import launch
from .runtime.device_code.intrinsics import array_type, narrow, widen
from .runtime.launch.kernel import Kernel
from .runtime.device_code.stencil import div, magic_args
from .._vocab import BF16_DTYPES as DTYPES


def _kernels(CT):
    @cuda.jit(device=True)
    def scale(x, base, c, C, cs, n, alpha, k):
        """s_c of the element whose channel-0 offset is base."""
        q = CT(0)
        for j in range(max(0, c - n // 2), min(C, c + (n - 1) // 2 + 1)):
            v = widen(x[base + j * cs])
            q += v * v
        return k + alpha / CT(n) * q

    @cuda.jit(device=True)
    def place(i, C, HW, last, mg):
        """(channel, channel-0 offset, channel stride) of element i; mg = (small, m_HW,
        s_HW, m_C, s_C): small selects the multiply-high split."""
        small, m_hw, s_hw, m_c, s_c = mg
        if last:
            c = i - div(i, m_c, s_c) * C if small else i % C
            return c, i - c, 1
        if small:
            q = div(i, m_hw, s_hw)
            c = q - div(q, m_c, s_c) * C
        else:
            c = (i // HW) % C
        return c, i - c * HW, HW

    def lrn_fwd(x, y, N, C, HW, last, n, alpha, beta, k, small, m_hw, s_hw, m_c, s_c):
        mg = (small, m_hw, s_hw, m_c, s_c)
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < N * C * HW:
            c, base, cs = place(i, C, HW, last, mg)
            y[i] = narrow(widen(x[i]) * math.pow(scale(x, base, c, C, cs, n, alpha, k), -beta), y)
            i += cuda.gridDim.x * cuda.blockDim.x

    def lrn_bwd_terms(dy, x, t, N, C, HW, last, n, alpha, beta, k, small, m_hw, s_hw, m_c,
                      s_c):
        # t_i = dy_i x_i s_i^(-beta-1)
        mg = (small, m_hw, s_hw, m_c, s_c)
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < N * C * HW:
            c, base, cs = place(i, C, HW, last, mg)
            s = scale(x, base, c, C, cs, n, alpha, k)
            t[i] = widen(dy[i]) * widen(x[i]) * math.pow(s, -beta - CT(1))
            i += cuda.gridDim.x * cuda.blockDim.x

    def lrn_bwd(dy, x, t, dx, N, C, HW, last, n, alpha, beta, k, small, m_hw, s_hw, m_c,
                s_c):
        # dx_i = dy_i s_i^-beta - 2 alpha beta / n x_i sum_{j: i's channel in window(j)} t_j
        mg = (small, m_hw, s_hw, m_c, s_c)
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < N * C * HW:
            c, base, cs = place(i, C, HW, last, mg)
            acc = CT(0)
            for j in range(max(0, c - (n - 1) // 2), min(C, c + n // 2 + 1)):
                acc += t[base + j * cs]
            s = scale(x, base, c, C, cs, n, alpha, k)
            dx[i] = narrow(widen(dy[i]) * math.pow(s, -beta) - CT(2) * alpha * beta / CT(n) *
                           widen(x[i]) * acc, dx)
            i += cuda.gridDim.x * cuda.blockDim.x

    return {"fwd": lrn_fwd, "bwd_terms": lrn_bwd_terms, "bwd": lrn_bwd}


def _build():
    table = {}
    for ct, CT in (("float32", float32), ("float64", float64)):
        ks = _kernels(CT)
        for t in (d for d in DTYPES if (d == "float64") == (ct == "float64")):
            a, w = f"{array_type(t)}[::1]", f"{ct}[::1]"
            tail = f"int64, int64, int64, int64, int64, {ct}, {ct}, {ct}, " + \
                ", ".join(["int64"] * 5) + ")"
            sigs = {"fwd": f"void({a}, {a}, " + tail,
                    "bwd_terms": f"void({a}, {a}, {w}, " + tail,
                    "bwd": f"void({a}, {a}, {w}, {a}, " + tail}
            for name, sig in sigs.items():
                table[name, t] = (Kernel(ks[name], [sig]), sig)
    return table


_KERNELS = _build()


def _geo(x, last):
    """(N, C, HW, last) and the channel split's (small, m_HW, s_HW, m_C, s_C)."""
    shape = tuple(int(s) for s in x.shape)
    C = shape[-1] if last else shape[1]
    total = int(np.prod(shape))
    HW = total // max(1, shape[0] * C)
    small = int(0 < total < 2 ** 31)
    split = (small,) + (magic_args(max(1, HW), max(1, C)) if small else (0, 0, 0, 0))
    return (shape[0], C, HW, int(last)), split


def lrn(x, n, alpha, beta, k, last, *, out, stream):
    y = out if out is not None else empty(x, x.shape, dtype_name(x))
    geo, split = _geo(x, last)
    launch(_KERNELS, "fwd", dtype_name(x), int(np.prod(x.shape)), stream, x, y, *geo, n, alpha,
           beta, k, *split)
    return y


def lrn_backward(dy, x, n, alpha, beta, k, last, *, out, stream):
    dtype = dtype_name(x)
    dx = out if out is not None else empty(x, x.shape, dtype)
    geo, split = _geo(x, last)
    total = int(np.prod(x.shape))
    t = empty(x, (max(1, total),), "float64" if dtype == "float64" else "float32")
    for name, arrays in (("bwd_terms", (dy, x, t)), ("bwd", (dy, x, t, dx))):
        launch(_KERNELS, name, dtype, total, stream, *arrays, *geo, n, alpha, beta, k, *split)
    return dx
