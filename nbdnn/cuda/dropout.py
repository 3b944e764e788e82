"""Dropout on the GPU: one thread per Philox4x32-10 call (4 elements), the generator
and the element mapping of nbdnn/cpu/dropout.py, so the mask matches the CPU's bit for
bit. Traffic per float32 element: x read, y and mask written (9 B); backward reads dy
and mask, writes dx (9 B). 10 rounds of 2 64-bit multiplies per 4 elements keep it
memory-bound. Words are held in uint64 (numba's mixed int64/uint64 arithmetic would
go to float64); a 32-bit word is masked after every add.
"""
import numpy as np
from numba import cuda, float32, float64

from . import SIMULATOR
from ._arrays import dtype_name, empty, size
from ._launch import Kernel
from ..cpu.dropout import M0, M1, MASK32, W0, W1, keep_threshold

BLOCK = 64 if SIMULATOR else 256
MAX_BLOCKS = 2 ** 31 - 1
_M0, _M1, _W0, _W1 = np.uint64(M0), np.uint64(M1), np.uint64(W0), np.uint64(W1)
_MASK, _S32 = np.uint64(MASK32), np.uint64(32)


@cuda.jit(device=True)
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    for r in range(10):
        if r > 0:
            k0 = (k0 + _W0) & _MASK
            k1 = (k1 + _W1) & _MASK
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (p1 >> _S32) ^ c1 ^ k0, p1 & _MASK, (p0 >> _S32) ^ c3 ^ k1, p0 & _MASK
    return c0, c1, c2, c3


def _kernels(CT):
    ZERO = CT(0)

    @cuda.jit(device=True)
    def draw(x, y, m, n, thr, scale, off_lo, off_hi, key_lo, key_hi):
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while j * 4 < n:
            ju = np.uint64(j)
            w0, w1, w2, w3 = philox4x32_10(ju & _MASK, ju >> _S32, off_lo, off_hi,
                                           key_lo, key_hi)
            for q in range(4):
                i = j * 4 + q
                if i < n:
                    w = w0 if q == 0 else (w1 if q == 1 else (w2 if q == 2 else w3))
                    keep = w < thr
                    m[i] = np.uint8(1) if keep else np.uint8(0)
                    y[i] = CT(x[i]) * scale if keep else ZERO
            j += cuda.gridDim.x * cuda.blockDim.x

    def dropout_fwd(x, y, m, n, thr, scale, off_lo, off_hi, key_lo, key_hi):
        draw(x, y, m, n, thr, scale, off_lo, off_hi, key_lo, key_hi)

    def dropout_fwd_counter(x, y, m, n, thr, scale, counter, key_lo, key_hi):
        off = counter[0]  # read at run time: a graph replay sees the advanced counter
        draw(x, y, m, n, thr, scale, off & _MASK, off >> _S32, key_lo, key_hi)

    def dropout_bwd(dy, m, dx, n, scale):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < n:
            dx[i] = CT(dy[i]) * scale if m[i] != 0 else ZERO
            i += cuda.gridDim.x * cuda.blockDim.x

    return dropout_fwd, dropout_fwd_counter, dropout_bwd


def dropout_advance(counter, n):
    """counter[0] += n, one thread, after the mask kernel (same stream) read it."""
    if cuda.grid(1) == 0:
        counter[0] = counter[0] + np.uint64(n)


def _build():
    table = {}
    for t in ("float16", "float32", "float64"):
        ct = "float64" if t == "float64" else "float32"
        fwd, fwd_counter, bwd = _kernels(float64 if t == "float64" else float32)
        a = f"{t}[::1]"
        sf = f"void({a}, {a}, uint8[::1], int64, uint64, {ct}, uint64, uint64, uint64, uint64)"
        sc = f"void({a}, {a}, uint8[::1], int64, uint64, {ct}, uint64[::1], uint64, uint64)"
        sb = f"void({a}, uint8[::1], {a}, int64, {ct})"
        table["fwd", t] = (Kernel(fwd, [sf]), sf)
        table["fwd_counter", t] = (Kernel(fwd_counter, [sc]), sc)
        table["bwd", t] = (Kernel(bwd, [sb]), sb)
    sa = "void(uint64[::1], uint64)"
    table["advance"] = (Kernel(dropout_advance, [sa]), sa)
    return table


_KERNELS = _build()


def _scale(p):
    return 0.0 if p >= 1 else 1.0 / (1.0 - p)


def _grid(n):
    return max(1, min(-(-n // BLOCK), MAX_BLOCKS))


def dropout(x, p, seed, offset, *, out, stream):
    dtype = dtype_name(x)
    y = out if out is not None else empty(x, x.shape, dtype)
    m = empty(x, x.shape, "uint8")
    n = size(x)
    counter = not isinstance(offset, int)
    if n:
        k, sig = _KERNELS["fwd_counter" if counter else "fwd", dtype]
        off = (offset,) if counter else (offset & MASK32, offset >> 32)
        # p == 0 keeps all: 2**32 exceeds every word (a uint64 holds it)
        k.launch(sig, _grid(-(-n // 4)), BLOCK, stream, x, y, m, n, keep_threshold(p),
                 _scale(p), *off, seed & MASK32, seed >> 32)
    if counter:
        k, sig = _KERNELS["advance"]
        k.launch(sig, 1, 1, stream, offset, n)
    return y, m


def dropout_backward(dy, m, p, *, out, stream):
    dtype = dtype_name(dy)
    dx = out if out is not None else empty(dy, dy.shape, dtype)
    n = size(dy)
    if n:
        k, sig = _KERNELS["bwd", dtype]
        k.launch(sig, _grid(n), BLOCK, stream, dy, m, dx, n, _scale(p))
    return dx
