"""Strided views made contiguous on the device: one gather kernel for any dtype.

Each output element is read once from its strided place and written once contiguously:
2 * n * itemsize bytes. Elements are moved as unsigned integers of their itemsize, so
one kernel per itemsize serves every dtype. Up to MAX_DIMS dims (leading dims padded
with size 1); negative strides work (the base pointer moves to the lowest address).

padded_rows: rows copied into rows of a wider pitch, the rest zero (the tensor-core GEMM's
operands whose rows are not 16-byte multiples: TMA strides by 16 bytes).
"""
import math

import numpy as np
from numba import cuda

from ..simulator import SIMULATOR
from .arrays import dtype_of, empty, flat, host_copy, ptr
from ..launch.kernel import Kernel, recording
from ....errors import NotSupportedError

MAX_DIMS = 6
BLOCK = 64 if SIMULATOR else 256  # (the simulator starts an OS thread a CUDA thread)
_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


@cuda.jit(device=True)
def strided_offset(i, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5):
    """sum_k coord_k(i) * t_k for flat C-order index i of shape (s0, ..., s5) (s0 is
    implied) and element strides t0..t5: the offset of element i in a strided view.
    Shared by the gather below and cuda/tensor/__init__.py's broadcast and transpose kernels."""
    r = i
    off = (r % s5) * t5
    r //= s5
    off += (r % s4) * t4
    r //= s4
    off += (r % s3) * t3
    r //= s3
    off += (r % s2) * t2
    r //= s2
    off += (r % s1) * t1
    r //= s1
    return off + r * t0


def strided_gather(src, dst, n, shift, s0, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5):
    # dst[i] = src[shift + sum_k coord_k(i) * t_k]; shape (s0..s5), element strides
    # (t0..t5); shift makes every offset >= 0 when some strides are negative
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    step = cuda.gridDim.x * cuda.blockDim.x
    while i < n:
        dst[i] = src[shift + strided_offset(i, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5)]
        i += step


_SIGS = {isz: f"void({t}[::1], {t}[::1], int64, {', '.join(['int64'] * 13)})"
         for isz, t in _UINT.items()}
_gather = Kernel(strided_gather, list(_SIGS.values()))


def strides_elems(x, itemsize):
    """Element strides of any device array kind."""
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        return tuple(x.stride())
    st = getattr(x, "strides", None)
    if st is None:
        st = x.__cuda_array_interface__.get("strides")
    return tuple(s // itemsize for s in st)


def contiguous(x, stream=0):
    """A C-contiguous copy of the device array x (same kind; numba for others)."""
    dtype = np.dtype(str(x.dtype).rpartition(".")[2])
    shape = tuple(int(s) for s in x.shape)
    out = empty(x, shape, dtype)
    n = math.prod(shape)
    if n == 0:
        return out
    strides = strides_elems(x, dtype.itemsize)
    # merge away size-1 dims; refuse more than MAX_DIMS real dims
    dims = [(s, t) for s, t in zip(shape, strides) if s != 1]
    if len(dims) > MAX_DIMS:
        raise NotSupportedError(f"contiguous: at most {MAX_DIMS} non-unit dims; got {shape}")
    dims = [(1, 0)] * (MAX_DIMS - len(dims)) + dims
    lo = sum((s - 1) * t for s, t in dims if t < 0)
    hi = sum((s - 1) * t for s, t in dims if t > 0)
    grid = min(-(-n // BLOCK), 65535 * 8)
    args = (n, -lo, *[s for s, _ in dims], *[t for _, t in dims])
    sig = _SIGS[dtype.itemsize]
    if SIMULATOR:  # no raw pointers: the kernel reads a copy of the span x covers
        host_copy()
        src = cuda.to_device(_span(x, shape, strides, hi - lo + 1, dtype))
        graph = recording()
        if graph is not None:  # (a replay copies the span again before the gather)
            graph.record_step(lambda: src.copy_to_device(_span(x, shape, strides, hi - lo + 1,
                                                               dtype)))
        _gather.launch(sig, grid, BLOCK, stream, src, out.view(_UINT[dtype.itemsize]), *args)
        return out
    base = ptr(x) + lo * dtype.itemsize  # the lowest address any element has
    _gather.launch(sig, grid, BLOCK, stream, (base, hi - lo + 1), out, *args, owners=(x,))
    return out


def padded_copy(src, dst, n, width, inner):
    # dst: (rows, width) C-order, src: (rows, inner): row r of src, then zeros. One thread
    # an element (2 n itemsize bytes: a warp reads and writes 32 neighbours)
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    step = cuda.gridDim.x * cuda.blockDim.x
    while i < n:
        r = i // width
        col = i - r * width
        if col < inner:
            dst[i] = src[r * inner + col]
        else:
            dst[i] = 0
        i += step


_PAD_SIGS = {isz: f"void({t}[::1], {t}[::1], int64, int64, int64)" for isz, t in _UINT.items()}
_padded = Kernel(padded_copy, list(_PAD_SIGS.values()))


def padded_rows(x, width, stream=0):
    """x (..., inner), C-contiguous -> a new (..., width) array of its kind, each row x's
    then zeros (width >= inner): rows a TMA map can stride over (16-byte row pitch)."""
    dtype = dtype_of(x)
    shape = tuple(int(s) for s in x.shape)
    inner = shape[-1]
    out = empty(x, shape[:-1] + (width,), dtype)
    n = math.prod(shape[:-1]) * width
    if n == 0:
        return out
    t = _UINT[dtype.itemsize]
    grid = min(-(-n // BLOCK), 65535 * 8)
    if SIMULATOR:
        _padded.launch(_PAD_SIGS[dtype.itemsize], grid, BLOCK, stream,
                       flat(x).view(t), flat(out).view(t), n, width, inner)
        return out
    _padded.launch(_PAD_SIGS[dtype.itemsize], grid, BLOCK, stream, (ptr(x), math.prod(shape)),
                   (ptr(out), n), n, width, inner, owners=(x, out))
    return out


def _span(x, shape, strides, count, dtype):
    """The simulator's stand-in for (lowest address, count): the `count` elements of
    memory from x's lowest-addressed element, as unsigned ints of its itemsize."""
    first = tuple(s - 1 if t < 0 else 0 for s, t in zip(shape, strides))
    start = x._ary[tuple(slice(c, c + 1) for c in first)]
    span = np.lib.stride_tricks.as_strided(start, shape=(count,), strides=(dtype.itemsize,))
    return np.ascontiguousarray(span).view(_UINT[dtype.itemsize])
