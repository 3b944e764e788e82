"""Operands for float32's TF32 math modes (nbdnn/ops/math_mode.py) on the CUDA cores.

"tf32" multiplies TF32-rounded copies of A and B; "3xtf32" multiplies
[hi(A), hi(A), lo(A)] by [hi(B); lo(B); hi(B)] concatenated along K, one GEMM over 3K
whose sum is hi*hi + hi*lo + lo*hi, the same three products the tensor cores sum (in
another order: both are float32 accumulations of the same terms). The GEMM, its
split-K and its epilogue run unchanged. Until the tensor-core GEMM takes these modes
(issue 23) this is how they run: correct, at CUDA-core speed.

The kernel reads x as (outer, K, inner), K the reduction axis (A (M, K): outer = batch
x M, inner = 1; A^T stored (K, M): inner = M), and writes (outer, P K, inner): part j
of the new K axis is lo(x) where bit j of `code` is set, else hi(x). Traffic: 4 bytes
read and 4 P written an element.
"""
import math

from numba import cuda

from ..runtime.grid import BLOCK
from ..runtime.intrinsics import round_tf32
from ..runtime.launch import Kernel
from ..runtime.arrays import empty

PARTS = {"tf32": ((1, 0), (1, 0)), "3xtf32": ((3, 0b100), (3, 0b010))}  # (P, code): A, B


def tf32_parts(x, out, n, K, inner, P, code):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    step = cuda.gridDim.x * cuda.blockDim.x
    Ki = K * inner
    while i < n:
        o = i // Ki
        r = i - o * Ki
        v = x[i]
        hi = round_tf32(v)
        lo = round_tf32(v - hi)
        dst = o * P * Ki + r
        for j in range(P):
            out[dst + j * Ki] = lo if (code >> j) & 1 else hi
        i += step


_kernel = Kernel(tf32_parts, ["void(float32[::1], float32[::1], int64, int64, int64, int64, "
                              "int64)"])


def operand(x, k_axis_last, which, mode, stream):
    """x (..., R, C) float32 rewritten for `mode`: the reduction axis is the last when
    k_axis_last, else the one before; which: 0 for A's parts, 1 for B's."""
    P, code = PARTS[mode][which]
    shape = tuple(int(s) for s in x.shape)
    K = shape[-1] if k_axis_last else shape[-2]
    inner = 1 if k_axis_last else shape[-1]
    n = math.prod(shape)
    new = shape[:-1] + (P * K,) if k_axis_last else shape[:-2] + (P * K, shape[-1])
    out = empty(x, new, "float32")
    if n:
        _kernel.launch(_kernel.sigs[0], min(-(-n // BLOCK), 65535 * 8), BLOCK, stream,
                       x.reshape(n), out.reshape(n * P), n, K, inner, P, code)
    return out
