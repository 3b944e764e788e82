"""Dropout on the GPU: one thread per Philox4x32-10 call (4 elements), the generator
and the element mapping of nbdnn/cpu/dropout.py, so the mask matches the CPU's bit for
bit. Traffic per float32 element: x read, y and mask written (9 B); backward reads dy
and mask, writes dx (9 B). Aligned tensors move x, y and dy as 16-byte vectors and the
mask as 4-byte words (measured the scalar form at 36-39% of copy, 0.47x
PyTorch's forward; the vector form is the activation kernels' shape, ~95% there). 10 rounds of 2 64-bit multiplies per 4 elements keep it
memory-bound. Words are held in uint64 (numba's mixed int64/uint64 arithmetic would
go to float64); a 32-bit word is masked after every add.
"""
import numpy as np
from numba import cuda, float32, float64, types

from .runtime.simulator import SIMULATOR
from .runtime.memory.arrays import dtype_name, empty, ptr, size, vector_aligned
from .runtime.device_code.intrinsics import array_type, load4, narrow, store4, widen
from .runtime.launch.kernel import Kernel
from .._philox import M0, M1, MASK32, W0, W1, keep_threshold

BLOCK = 64 if SIMULATOR else 256
GROUPS = 2  # backward: 4-element vectors a thread
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


_U32, _U64 = types.uint32, types.uint64


@cuda.jit(device=True)
def philox4x32_10_u32(c0, c1, c2, c3, k0, k1):
    """philox4x32_10 in 32-bit words (uint32 in, uint32 out): each round's two products
    are one 32 x 32 -> 64-bit multiply each (IMAD.WIDE.U32), the state 6 registers, not
    12: for kernels that draw inside a register-bound loop (the flash attention ones)."""
    for r in range(10):
        if r > 0:  # (64-bit sums truncated: one 32-bit add each, no overflow to trap)
            k0 = _U32(_U64(k0) + _W0)
            k1 = _U32(_U64(k1) + _W1)
        p0 = _M0 * _U64(c0)
        p1 = _M1 * _U64(c2)
        c0, c1, c2, c3 = _U32(_U32(p1 >> _S32) ^ c1 ^ k0), _U32(p1), \
            _U32(_U32(p0 >> _S32) ^ c3 ^ k1), _U32(p0)
    return c0, c1, c2, c3


def _kernels(CT, ZERO):
    """The kernels for compute type CT; ZERO is a stored zero (bfloat16: its bits, the
    uint16 0; other dtypes CT(0)). Loads widen, stores narrow
    (runtime/device_code/intrinsics.py)."""

    @cuda.jit(device=True)
    def keep4(w0, w1, w2, w3, thr):
        return w0 < thr, w1 < thr, w2 < thr, w3 < thr

    @cuda.jit(device=True)
    def draw(x, y, m, n, thr, scale, off_lo, off_hi, key_lo, key_hi, vec):
        # vec: x and y take 16-byte vectors, the mask 4-byte words (elements 4j..4j+3)
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while j * 4 < n:
            ju = np.uint64(j)
            w0, w1, w2, w3 = philox4x32_10(ju & _MASK, ju >> _S32, off_lo, off_hi,
                                           key_lo, key_hi)
            if vec != 0 and j * 4 + 4 <= n:
                k0, k1, k2, k3 = keep4(w0, w1, w2, w3, thr)
                a0, a1, a2, a3 = load4(x, j)
                store4(y, j, (narrow(widen(a0) * scale, y) if k0 else ZERO,
                              narrow(widen(a1) * scale, y) if k1 else ZERO,
                              narrow(widen(a2) * scale, y) if k2 else ZERO,
                              narrow(widen(a3) * scale, y) if k3 else ZERO))
                store4(m, j, (np.uint8(k0), np.uint8(k1), np.uint8(k2), np.uint8(k3)))
            else:
                for q in range(4):
                    i = j * 4 + q
                    if i < n:
                        w = w0 if q == 0 else (w1 if q == 1 else (w2 if q == 2 else w3))
                        keep = w < thr
                        m[i] = np.uint8(1) if keep else np.uint8(0)
                        y[i] = narrow(widen(x[i]) * scale, y) if keep else ZERO
            j += cuda.gridDim.x * cuda.blockDim.x

    def dropout_fwd(x, y, m, n, thr, scale, off_lo, off_hi, key_lo, key_hi, vec):
        draw(x, y, m, n, thr, scale, off_lo, off_hi, key_lo, key_hi, vec)

    def dropout_fwd_counter(x, y, m, n, thr, scale, counter, key_lo, key_hi, vec):
        off = counter[0]  # read at run time: a graph replay sees the advanced counter
        draw(x, y, m, n, thr, scale, off & _MASK, off >> _S32, key_lo, key_hi, vec)

    def dropout_bwd(dy, m, dx, n, scale, vec):
        # GROUPS vectors of 4 a thread (the activation kernels' shape), every load first
        j = (cuda.blockIdx.x * cuda.blockDim.x * GROUPS + cuda.threadIdx.x)
        while j * 4 < n:
            if vec != 0 and (j + (GROUPS - 1) * cuda.blockDim.x) * 4 + 4 <= n:
                d0 = load4(dy, j)
                k0 = load4(m, j)
                d1 = load4(dy, j + cuda.blockDim.x)
                k1 = load4(m, j + cuda.blockDim.x)
                store4(dx, j, masked4(d0, k0, scale, dx))
                store4(dx, j + cuda.blockDim.x, masked4(d1, k1, scale, dx))
            else:
                for g in range(GROUPS):
                    for i in range((j + g * cuda.blockDim.x) * 4,
                                   min((j + g * cuda.blockDim.x) * 4 + 4, n)):
                        dx[i] = narrow(widen(dy[i]) * scale, dx) if m[i] != 0 else ZERO
            j += cuda.gridDim.x * cuda.blockDim.x * GROUPS

    @cuda.jit(device=True)
    def masked4(d, k, scale, dx):
        return (narrow(widen(d[0]) * scale, dx) if k[0] != 0 else ZERO,
                narrow(widen(d[1]) * scale, dx) if k[1] != 0 else ZERO,
                narrow(widen(d[2]) * scale, dx) if k[2] != 0 else ZERO,
                narrow(widen(d[3]) * scale, dx) if k[3] != 0 else ZERO)

    return dropout_fwd, dropout_fwd_counter, dropout_bwd


def dropout_advance(counter, n):
    """counter[0] += n, one thread, after the mask kernel (same stream) read it."""
    if cuda.grid(1) == 0:
        counter[0] = counter[0] + np.uint64(n)


def _build():
    table = {}
    for t in ("float16", "bfloat16", "float32", "float64"):
        ct = "float64" if t == "float64" else "float32"
        CT = float64 if t == "float64" else float32
        bf16 = t == "bfloat16"
        fwd, fwd_counter, bwd = _kernels(CT, np.uint16(0) if bf16 else CT(0))
        a = f"{array_type(t)}[::1]"
        sf = (f"void({a}, {a}, uint8[::1], int64, uint64, {ct}, uint64, uint64, uint64, uint64, "
              "int64)")
        sc = (f"void({a}, {a}, uint8[::1], int64, uint64, {ct}, uint64[::1], uint64, uint64, "
              "int64)")
        sb = f"void({a}, uint8[::1], {a}, int64, {ct}, int64)"
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


def _vec(a, b, m):
    """1 when a and b take 16-byte vectors and the mask m 4-byte words."""
    return int(vector_aligned(a, b) and ptr(m) % 4 == 0)


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
                 _scale(p), *off, seed & MASK32, seed >> 32, _vec(x, y, m))
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
        k.launch(sig, _grid(-(-n // (4 * GROUPS))), BLOCK, stream, dy, m, dx, n, _scale(p),
                 _vec(dy, dx, m))
    return dx
