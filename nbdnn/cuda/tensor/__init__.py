"""Tensor ops on the GPU. Kernels and their traffic (n elements, s = itemsize):

- `_ew_<op>_<ct>`: out = f(alpha1*a, alpha2*b) + beta*out for op_tensor, add_tensor
  (a := C, b := A broadcast, alpha1 := beta, alpha2 := alpha; op "rhs" when beta == 0
  so C is not read) and scale_tensor (unary "copy"). Reads a and b, writes out:
  3ns B (2ns unary, +ns with beta != 0), 1-2 flops: memory bound. Same-shape operands
  move 4 elements per 16-byte vector access, GROUPS vectors per thread; broadcast b is
  gathered per element (6-D index arithmetic on merged dims).
- `_fill_<dtype>`: set_tensor, writes ns B with store4.
- `_transform_<ct>`: out[i] = alpha*x[perm offset(i)] + beta*out[i]: reads ns B
  gathered (coalesced writes, strided reads), writes ns B. A swap of two axes with
  alpha 1, beta 0 runs `_transpose_tiles_<dtype>` instead (cuda/tensor/transpose.py:
  both sides coalesced through shared-memory tiles).
- `reduce_rows_*` (cuda/tensor/reduce.py): rows of a (rows, L) view, TPR threads per row,
  16-byte loads, 2 vectors in flight per thread per iteration, warp-shuffle tree.
  Few long rows (all-axes reduce) split into S chunks: pass 1 writes (rows, S)
  partials with indices, pass 2 reduces them: reads ns B + tiny, deterministic.
- `reduce_cols_*`: (outer, R, inner) views, threads along inner (coalesced, 4
  columns per thread with load4), each summing R rows in order; R split the same way
  when outer*inner is small. Axes that are neither leading, trailing nor one block
  are moved last by `_transform` first (2ns B extra).
"""
import math

import numpy as np
from numba import cuda, float32, float64

from ..runtime.memory.arrays import dtype_name, empty, ptr, size
from ..runtime.device_code.intrinsics import (array_type, load4, narrow, narrow4, store4,
    vector_alignment, widen)
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from ..runtime.memory.strided import strided_offset
from . import reduce as _reduce, transpose as _transpose
from ...errors import NotSupportedError

BLOCK = 64 if SIMULATOR else 256  # (the simulator starts an OS thread a CUDA thread)
GROUPS = 2      # 4-element vectors per thread in the elementwise kernels
NDIMS = 6       # gather kernels index up to 6 (merged) dims
EW_OPS = ("add", "mul", "div", "min", "max", "sqrt", "not", "finite", "copy", "rhs")
UNARY = ("sqrt", "not", "finite", "copy")
# transform_into's swaps of two axes (NCHW <-> NHWC, matrices, filters' channels around
# their taps) through shared-memory tiles (transpose.py); False: the gather kernel.
# Measured (H200): its tests passed, memcheck and racecheck clean, and
# it moved 318-475 GB/s where the gather moved 173-211 (1.8-2.3x; NCHW <-> NHWC and
# ResNet-50's filters, docs/decisions.md "transpose_ab"; PyTorch's copy 352-729).
TILED_TRANSPOSE = True


def _ew_functions(npt):
    """op -> f(x, y) in compute type npt; min/max propagate NaN like np.minimum."""
    one, zero, nan = npt(1), npt(0), npt(np.nan)
    dev = cuda.jit(device=True)
    fns = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y,
           "div": lambda x, y: x / y,  # IEEE: kernels compile with numba's numpy error model
           "min": lambda x, y: x if (x != x or x < y) else y,
           "max": lambda x, y: x if (x != x or x > y) else y,
           "sqrt": lambda x, y: nan if x < zero else math.sqrt(x), "not": lambda x, y: one - x,
           "finite": lambda x, y: x if x - x == zero else zero,  # (inf - inf, NaN: NaN)
           "copy": lambda x, y: x, "rhs": lambda x, y: y}
    return {k: dev(f) for k, f in fns.items()}


def _ew_kernel(f, ct, unary, ZS):
    """ZS is a stored zero (bfloat16: its bits, the uint16 0; else ct(0)); loads widen,
    stores narrow (runtime/device_code/intrinsics.py)."""
    zero = ct(0)

    # a, y: (n,) flat; b: (n,) when bfull else broadcast through strides t0..t5 of the
    # merged 6-D shape s0..s5 (t = 0 on broadcast dims). y = f(al1*a, al2*b) + beta*y
    def op_tensor_ew(a, b, y, n, al1, al2, beta, aligned, bfull,
                     s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5):
        g0 = cuda.blockIdx.x * (GROUPS * BLOCK) + cuda.threadIdx.x
        for j in range(GROUPS):
            g = g0 + j * BLOCK
            i = g * 4
            if aligned != 0 and bfull != 0 and i + 4 <= n:
                a0, a1, a2, a3 = load4(a, g)
                if unary:
                    b0, b1, b2, b3 = ZS, ZS, ZS, ZS
                else:
                    b0, b1, b2, b3 = load4(b, g)
                r0 = f(al1 * widen(a0), al2 * widen(b0))
                r1 = f(al1 * widen(a1), al2 * widen(b1))
                r2 = f(al1 * widen(a2), al2 * widen(b2))
                r3 = f(al1 * widen(a3), al2 * widen(b3))
                if beta != 0:
                    c0, c1, c2, c3 = load4(y, g)
                    r0, r1, r2, r3 = (r0 + beta * widen(c0), r1 + beta * widen(c1),
                                      r2 + beta * widen(c2), r3 + beta * widen(c3))
                store4(y, g, narrow4((r0, r1, r2, r3), y))
            else:
                for e in range(i, min(i + 4, n)):
                    bv = zero
                    if not unary:
                        if bfull != 0:
                            bv = widen(b[e])
                        else:
                            bv = widen(b[strided_offset(e, s1, s2, s3, s4, s5, t0, t1, t2,
                                                     t3, t4, t5)])
                    v = f(al1 * widen(a[e]), al2 * bv)
                    if beta != 0:
                        v += beta * widen(y[e])
                    y[e] = narrow(v, y)
    return op_tensor_ew


def _fill_kernel():
    # y: (n,) flat; every element := value (rounded to y's dtype on store)
    def fill(y, n, value, aligned):
        g0 = cuda.blockIdx.x * (GROUPS * BLOCK) + cuda.threadIdx.x
        v = narrow(value, y)
        for j in range(GROUPS):
            g = g0 + j * BLOCK
            i = g * 4
            if aligned != 0 and i + 4 <= n:
                store4(y, g, (v, v, v, v))
            else:
                for e in range(i, min(i + 4, n)):
                    y[e] = v
    return fill


def _transform_kernel():
    # y[i] = alpha * x[sum_k coord_k(i) * t_k] + beta * y[i]; y's shape (s0..s5) is
    # x's permuted, t_k x's element stride along y's dim k
    def transform(x, y, n, alpha, beta, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        step = cuda.gridDim.x * cuda.blockDim.x
        while i < n:
            v = alpha * widen(x[strided_offset(i, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5)])
            if beta != 0:
                v += beta * widen(y[i])
            y[i] = narrow(v, y)
            i += step
    return transform


def _build():
    ew, fill, tr = {}, {}, {}
    idx6 = ", ".join(["int64"] * 11)
    # flavours: (kernel suffix, compute type, its NumPy type, dtypes, stored zero);
    # bfloat16 arrays are passed as their uint16 bits
    flavours = [("float32", float32, np.float32, ("float16", "float32"), float32(0)),
                ("float64", float64, np.float64, ("float64",), float64(0)),
                ("bfloat16", float32, np.float32, ("bfloat16",), np.uint16(0))]
    for name, ct, npt, dts, ZS in flavours:
        ctn = np.dtype(npt).name
        arg = {t: array_type(t) for t in dts}
        fns = _ew_functions(npt)
        for op in EW_OPS:
            sigs = {t: f"void({arg[t]}[::1], {arg[t]}[::1], {arg[t]}[::1], int64, {ctn}, "
                       f"{ctn}, {ctn}, int64, int64, {idx6})" for t in dts}
            k = Kernel(_ew_kernel(fns[op], ct, op in UNARY, ZS), list(sigs.values()))
            k.name = f"_ew_{op}_{name}"
            ew.update({(op, t): (k, s) for t, s in sigs.items()})
        sigs = {t: f"void({arg[t]}[::1], {arg[t]}[::1], int64, {ctn}, {ctn}, {idx6})"
                for t in dts}
        k = Kernel(_transform_kernel(), list(sigs.values()))
        k.name = f"_transform_{name}"
        tr.update({t: (k, s) for t, s in sigs.items()})
        for t in dts:
            s = f"void({arg[t]}[::1], int64, {ctn}, int64)"
            fill[t] = (Kernel(_fill_kernel(), [s]), s)
            fill[t][0].name = f"_fill_{t}"
    return ew, fill, tr


def _build_cast():
    """(source dtype, destination dtype) -> the transform kernel compiled for that pair
    (a flat copy: identity perm), computing in float32, float64 when either is."""
    cast = {}
    idx6 = ", ".join(["int64"] * 11)
    dts = ("float16", "float32", "float64", "bfloat16")
    for ct in ("float32", "float64"):
        sigs = {(a, b): f"void({array_type(a)}[::1], {array_type(b)}[::1], int64, {ct}, "
                        f"{ct}, {idx6})"
                for a in dts for b in dts
                if a != b and (ct == "float64") == ("float64" in (a, b))}
        k = Kernel(_transform_kernel(), list(sigs.values()))
        k.name = f"_cast_{ct}"
        cast.update({p: (k, s) for p, s in sigs.items()})
    return cast


_EW, _FILL, _TRANSFORM = _build()
_CAST = _build_cast()


def _aligned(itemsize, *arrays):
    a = vector_alignment(itemsize)
    return int(all(ptr(x) % a == 0 for x in arrays))


def _ew_grid(n):
    return max(1, -(-n // (4 * GROUPS * BLOCK)))


def merge_dims(shape, strides):
    """Drop size-1 dims and merge neighbours that are contiguous in `strides`;
    returns (shape, strides) padded in front to NDIMS. NotSupportedError past NDIMS."""
    dims = []
    for n, t in zip(shape, strides):
        if n == 1:
            continue
        if dims and dims[-1][1] == t * n:
            dims[-1] = (dims[-1][0] * n, t)
        else:
            dims.append((n, t))
    if len(dims) > NDIMS:
        raise NotSupportedError(f"tensor ops: at most {NDIMS} dims after merging; got "
                                f"shape {tuple(shape)}")
    dims = [(1, 0)] * (NDIMS - len(dims)) + dims
    return [n for n, _ in dims], [t for _, t in dims]


def _bcast_strides(bshape, shape):
    """Element strides of a C-contiguous b broadcast (trailing-aligned) to shape."""
    bshape = (1,) * (len(shape) - len(bshape)) + tuple(bshape)
    st, acc = [], 1
    for n in reversed(bshape):
        st.append(acc if n != 1 else 0)
        acc *= n
    return st[::-1]


def _elementwise(op, a, b, y, al1, al2, beta, stream):
    dtype = dtype_name(a)
    kernel, sig = _EW[op, dtype]
    n = size(a)
    if n == 0:
        return y
    shape = tuple(int(s) for s in a.shape)
    bfull = int(b is None or size(b) == n)
    if b is None:
        b = a
    s, t = merge_dims(shape, _bcast_strides(tuple(b.shape), shape)) if not bfull else \
        ([1] * NDIMS, [0] * NDIMS)
    al = _aligned(np.dtype(dtype).itemsize, a, b, y)
    kernel.launch(sig, _ew_grid(n), BLOCK, stream, a, b, y, n, al1, al2, beta, al, bfull,
                  *s[1:], *t)
    return y


def add_tensor(a, c, *, alpha, beta, out, stream):
    """out = alpha * A + beta * C (A broadcast to C)."""
    y = out if out is not None else empty(c, c.shape, dtype_name(c))
    return _elementwise("add" if beta != 0 else "rhs", c, a, y, beta, alpha, 0.0, stream)


def op_tensor(op, a, b, *, alpha1, alpha2, beta, out, stream):
    """out = f(alpha1 * A, alpha2 * B) + beta * out."""
    y = out if out is not None else empty(a, a.shape, dtype_name(a))
    return _elementwise(op, a, b, y, alpha1, alpha2, beta, stream)


def scale_tensor(x, alpha, *, out, stream):
    """out = alpha * x (in place when out is x)."""
    y = out if out is not None else empty(x, x.shape, dtype_name(x))
    return _elementwise("copy", x, None, y, alpha, 0.0, 0.0, stream)


def set_tensor(value, *, out, stream):
    """out[...] = value in place."""
    dtype = dtype_name(out)
    kernel, sig = _FILL[dtype]
    n = size(out)
    if n:
        kernel.launch(sig, _ew_grid(n), BLOCK, stream, out, n, value,
                      _aligned(np.dtype(dtype).itemsize, out))
    return out


def transform_into(x, shape, perm, y, alpha, beta, stream):
    """y (flat, C-contiguous) = alpha * transpose(x viewed as `shape`, perm) + beta*y."""
    dtype = dtype_name(x)
    kernel, sig = _TRANSFORM[dtype]
    n = size(x)
    if n == 0:
        return y
    if TILED_TRANSPOSE and (alpha, beta) == (1, 0):  # (a swap of two axes: transpose.py)
        dims = _transpose.reduced(shape, perm)
        if _transpose.usable(dtype, dims, alpha, beta):
            return _transpose.transpose(x, y, dims, stream)
    xst, acc = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        xst[k] = acc
        acc *= shape[k]
    s, t = merge_dims([shape[p] for p in perm], [xst[p] for p in perm])
    grid = min(-(-n // BLOCK), 65535 * 8)
    kernel.launch(sig, grid, BLOCK, stream, x, y, n, alpha, beta, *s[1:], *t)
    return y


def cast_tensor(x, dtype, *, alpha, beta, out, stream):
    """out = alpha * x + beta * out in `dtype` (the transform kernel for the dtype pair;
    its gather is a flat copy here). Reads n s_x B, writes n s_out B."""
    src = dtype_name(x)
    y = out if out is not None else empty(x, tuple(x.shape), dtype)
    n = size(x)
    if src == dtype:
        return _elementwise("copy", x, None, y, alpha, 0.0, beta, stream)
    kernel, sig = _CAST[src, dtype]
    if n:
        s, t = merge_dims([n], [1])
        kernel.launch(sig, min(-(-n // BLOCK), 65535 * 8), BLOCK, stream, x, y, n, alpha,
                      beta, *s[1:], *t)
    return y


def transform_tensor(x, perm, *, alpha, beta, out, stream):
    """out = alpha * transpose(x, perm) + beta * out."""
    shape = tuple(int(s) for s in x.shape)
    y = out if out is not None else empty(x, [shape[p] for p in perm], dtype_name(x))
    return transform_into(x, shape, perm, y, alpha, beta, stream)


def reduce_tensor(x, op, axes, keepdims, return_indices, *, alpha, beta, out, stream):
    """out = alpha * R(x over axes) + beta * out (see nbdnn/cuda/tensor/reduce.py)."""
    shape = tuple(int(s) for s in x.shape)
    dtype = dtype_name(x)
    oshape = tuple(1 if i in axes else n for i, n in enumerate(shape)) if keepdims else \
        tuple(n for i, n in enumerate(shape) if i not in axes)
    y = out if out is not None else empty(x, oshape, dtype)
    yi = empty(x, oshape, np.int64) if return_indices else None
    if math.prod(oshape):
        _reduce.reduce(x, shape, dtype, op, axes, y, yi, alpha, beta, stream,
                       transform_into)
    return (y, yi) if return_indices else y
