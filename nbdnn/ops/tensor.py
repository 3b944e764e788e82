"""Tensor ops, cuDNN's cudnnAddTensor / OpTensor / ReduceTensor / ScaleTensor /
SetTensor / TransformTensor. The math is in nbdnn/cpu/tensor.py.

Choices (documented once here, repeated in each docstring):
- Broadcasting (add_tensor's A to C, op_tensor's B to A): every dim of the smaller
  operand is 1 or equal to the big one's; it may have fewer dims, aligned to the
  trailing dims as in NumPy (cuDNN requires equal ndim; that case is a subset).
- `out`: the result goes to `out` when given, else to a new array. Inputs are never
  modified unless passed as out= (add_tensor(a, c, out=c) is cuDNN's in-place form).
  beta != 0 reads `out`, so it needs out= (BadParamError otherwise).
- reduce_tensor keeps reduced dims as size 1 by default (keepdims=True, as cuDNN).
"""
import numbers

import numpy as np

from .._vocab import BF16_DTYPES, LAYOUT_COUNTERPART
from ..errors import BadParamError, ShapeError, fail
from .registry import op
from ._common import (Call, blend_params, choice, int_tuple, need_out, normalize_axis,
                      same_dtype, scalar)

OP_TENSOR_OPS = ("add", "mul", "div", "min", "max", "sqrt", "not", "finite")
UNARY_OPS = ("sqrt", "not", "finite")
REDUCE_OPS = ("add", "mul", "min", "max", "amax", "avg", "norm1", "norm2", "mul_no_zeros")
INDEX_OPS = ("min", "max", "amax")
MAX_DIMS = 8
LAYOUT_LETTERS = 6


def _ndim(op, name, shape):
    if len(shape) > MAX_DIMS:
        fail(ShapeError, op, f"{name}.ndim", f"<= {MAX_DIMS}", len(shape))


def broadcast_to(op, small_name, small, big_name, big):
    """Check `small` broadcasts to `big` (each trailing-aligned dim 1 or equal)."""
    if len(small) > len(big):
        fail(ShapeError, op, f"{small_name}.shape",
             f"at most {len(big)} dims to broadcast to {big_name}.shape {tuple(big)}",
             tuple(small))
    for k, (s, b) in enumerate(zip(small[::-1], big[::-1])):
        if s != 1 and s != b:
            fail(ShapeError, op, f"{small_name}.shape",
                 f"each dim 1 or equal to {big_name}.shape {tuple(big)} (trailing-aligned)",
                 tuple(small))


@op("tensor", in_place=("a", "c"))
def add_tensor(a, c, *, alpha=1.0, beta=1.0, out=None, backend=None, stream=None):
    """cudnnAddTensor: result = alpha * A + beta * C, A broadcast to C's shape.

    a: shape broadcastable to c.shape (per dim 1 or equal, trailing-aligned; e.g. a
    bias (1, C, 1, 1) or (C, 1, 1) for NCHW c). The result goes to `out` (or a new
    array); c is only modified when passed as out=c. With beta == 0, c is not read."""
    op = "add_tensor"
    k = Call(op, backend, stream, a=a, c=c, out=out)
    ashape, adtype = k.array("a", a, BF16_DTYPES)
    cshape, cdtype = k.array("c", c, BF16_DTYPES)
    same_dtype(op, ["c", "a"], [cdtype, adtype])
    _ndim(op, "c", cshape)
    broadcast_to(op, "a", ashape, "c", cshape)
    alpha, beta = blend_params(op, alpha, beta, c)  # beta scales c, given
    out = k.out(out, cshape, cdtype)
    return k.run("add_tensor", a, c, alpha=alpha, beta=beta, out=out)


@op("tensor", in_place=("a", "b"))
def op_tensor(op, a, b=None, *, alpha1=1.0, alpha2=1.0, beta=0.0, out=None,
              backend=None, stream=None):
    """cudnnOpTensor: out = f(alpha1 * A, alpha2 * B) + beta * out.

    f by `op`: add (x + y), mul (x * y), div (x / y, IEEE: x/0 is +-inf or NaN; not in
    cuDNN, here for optimizers such as Adam), min, max (NaN propagates), and the unary
    sqrt (sqrt(x), NaN below 0), not (1 - x, cuDNN's CUDNN_OP_TENSOR_NOT) and finite (x
    where it is finite, 0 for +-inf and NaN: torch.nan_to_num(x, 0, 0, 0); not in cuDNN,
    here for loss scaling, nbdnn.nn.LossScaler), which take no b. alpha1 applies
    before f (finite(0 * inf) is 0). b broadcasts to a (per dim 1 or equal,
    trailing-aligned)."""
    name = "op_tensor"
    choice(name, "op", op, OP_TENSOR_OPS)
    k = Call(name, backend, stream, a=a, b=b, out=out)
    ashape, adtype = k.array("a", a, BF16_DTYPES)
    _ndim(name, "a", ashape)
    if op in UNARY_OPS:
        if b is not None:
            fail(BadParamError, name, "b", f"None for the unary op {op!r}", "an array")
    else:
        if b is None:
            fail(BadParamError, name, "b", f"an array for the binary op {op!r}", None)
        bshape, bdtype = k.array("b", b, BF16_DTYPES)
        same_dtype(name, ["a", "b"], [adtype, bdtype])
        broadcast_to(name, "b", bshape, "a", ashape)
    alpha1, alpha2 = scalar(name, "alpha1", alpha1), scalar(name, "alpha2", alpha2)
    beta = scalar(name, "beta", beta)
    need_out(name, beta, out)
    out = k.out(out, ashape, adtype)
    return k.run("op_tensor", op, a, b, alpha1=alpha1, alpha2=alpha2, beta=beta, out=out)


def reduce_axes(op, axes, ndim):
    """Sorted tuple of distinct axes; None -> every axis."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, (numbers.Integral, np.integer)) and not isinstance(axes, bool):
        axes = (axes,)
    try:
        axes = tuple(axes)
    except TypeError:
        fail(BadParamError, op, "axes", "None, an int or a sequence of ints", repr(axes))
    norm = [normalize_axis(op, "axes", ax, ndim) for ax in axes]
    if len(set(norm)) != len(norm):
        fail(BadParamError, op, "axes", "distinct axes", repr(axes))
    return tuple(sorted(norm))


@op("tensor")
def reduce_tensor(x, op="add", axes=None, *, keepdims=True, return_indices=False,
                  alpha=1.0, beta=0.0, out=None, backend=None, stream=None):
    """cudnnReduceTensor: out = alpha * reduce_op(x over axes) + beta * out.

    op: add, mul, min, max, amax (max |x|), avg, norm1 (sum |x|), norm2
    (sqrt(sum x^2)), mul_no_zeros (product of the non-zero elements; 1 if none).
    axes: None (all), an int or a sequence. keepdims=True (cuDNN's convention) keeps
    reduced dims as size 1; False drops them. Accumulates in float32 (float64 for
    float64) in a fixed order: results are deterministic.
    return_indices (min, max, amax only): also return int64 indices of out's shape:
    the flat C-order position of the chosen element within its reduced block (the
    reduced axes in their original order), first occurrence on ties. NaN propagates
    (as NumPy): any NaN in a block gives NaN, and its index is the first NaN's.
    Returns out, or (out, indices)."""
    name = "reduce_tensor"
    choice(name, "op", op, REDUCE_OPS)
    k = Call(name, backend, stream, x=x, out=out)
    shape, dtype = k.array("x", x, BF16_DTYPES)
    _ndim(name, "x", shape)
    axes = reduce_axes(name, axes, len(shape))
    if any(shape[ax] == 0 for ax in axes):
        fail(ShapeError, name, "x.shape", "non-empty along the reduced axes", tuple(shape))
    if not isinstance(keepdims, (bool, np.bool_)):
        fail(BadParamError, name, "keepdims", "a bool", repr(keepdims))
    if return_indices and op not in INDEX_OPS:
        fail(BadParamError, name, "return_indices", f"False for op {op!r} (indices exist "
             f"for {', '.join(INDEX_OPS)})", return_indices)
    alpha, beta = blend_params(name, alpha, beta, out)
    oshape = tuple(1 if i in axes else n for i, n in enumerate(shape)) if keepdims else \
        tuple(n for i, n in enumerate(shape) if i not in axes)
    out = k.out(out, oshape, dtype)
    return k.run("reduce_tensor", x, op, axes, bool(keepdims), bool(return_indices),
                 alpha=alpha, beta=beta, out=out)


@op("tensor")
def cast_tensor(x, dtype, *, alpha=1.0, beta=0.0, out=None, backend=None, stream=None):
    """out = alpha * x + beta * out in another float dtype (float16, bfloat16, float32,
    float64): cudnnTransformTensor between data types, the same layout. Computed in
    float32 (float64 when either side is float64) and rounded once to nearest even at
    the store; float64 -> bfloat16 rounds through float32, as cvt.rn.bf16.f32 does.
    Mixed precision's conversions: float32 master weights to 16-bit copies, 16-bit
    gradients to float32 (alpha = 1 / loss scale)."""
    op = "cast_tensor"
    k = Call(op, backend, stream, x=x, out=out)
    shape, xdtype = k.array("x", x, BF16_DTYPES)
    if dtype is None:  # (np.dtype(None) is float64: no silent default)
        fail(BadParamError, op, "dtype", f"one of {', '.join(BF16_DTYPES)}", "None")
    try:  # (a name, a NumPy type, ml_dtypes.bfloat16)
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    choice(op, "dtype", name, BF16_DTYPES)
    dtype = name
    alpha, beta = blend_params(op, alpha, beta, out)
    out = k.out(out, shape, dtype)
    return k.run("cast_tensor", x, dtype, alpha=alpha, beta=beta, out=out)


@op("tensor", in_place=("x",))
def scale_tensor(x, alpha, *, out=None, backend=None, stream=None):
    """cudnnScaleTensor: y = alpha * x; in place with out=x."""
    op = "scale_tensor"
    k = Call(op, backend, stream, x=x, out=out)
    shape, dtype = k.array("x", x, BF16_DTYPES)
    alpha = scalar(op, "alpha", alpha)
    out = k.out(out, shape, dtype)
    return k.run("scale_tensor", x, alpha, out=out)


@op("tensor")
def set_tensor(x, value, *, backend=None, stream=None):
    """cudnnSetTensor: every element of x set to `value`, IN PLACE; returns x.

    x must be C-contiguous (a strided view is a BadParamError). value may be any real
    number, inf and NaN included; it is rounded to x's dtype."""
    op = "set_tensor"
    k = Call(op, backend, stream, x=x)
    shape, dtype = k.array("x", x, BF16_DTYPES)
    value = scalar(op, "value", value, finite=False)
    x = k.out(x, shape, dtype, name="x")
    return k.run("set_tensor", value, out=x)


LAYOUTS = LAYOUT_COUNTERPART


def _perm(op, ndim, layout_from, layout_to, perm):
    if perm is not None:
        if layout_from is not None or layout_to is not None:
            fail(BadParamError, op, "perm", "given without layout_from/layout_to", perm)
        p = int_tuple(op, "perm", perm, f"a permutation of range({ndim})")
        if sorted(p) != list(range(ndim)):
            fail(BadParamError, op, "perm", f"a permutation of range({ndim})", repr(perm))
        return p
    for pname, lay in (("layout_from", layout_from), ("layout_to", layout_to)):
        if not isinstance(lay, str) or len(set(lay)) != len(lay) or not lay.isalpha():
            fail(BadParamError, op, pname, "a layout string such as 'NCHW' or 'NHWC'",
                 repr(lay))
        if len(lay) != ndim:
            fail(ShapeError, op, pname, f"{ndim} letters for a {ndim}-D x", repr(lay))
    if sorted(layout_from) != sorted(layout_to):
        fail(BadParamError, op, "layout_to", f"a reordering of {layout_from!r}",
             repr(layout_to))
    return tuple(layout_from.index(ch) for ch in layout_to)


@op("tensor")
def transform_tensor(x, layout_from=None, layout_to=None, *, perm=None, alpha=1.0,
                     beta=0.0, out=None, backend=None, stream=None):
    """cudnnTransformTensor: out = alpha * transpose(x, perm) + beta * out, C-contiguous.

    Either layout_from/layout_to (e.g. "NCHW" -> "NHWC", "NCDHW" -> "NDHWC"; any two
    orderings of the same letters, one letter per dim) or perm=(0, 2, 3, 1): out's
    dim k is x's dim perm[k]. Up to 6 dims."""
    op = "transform_tensor"
    k = Call(op, backend, stream, x=x, out=out)
    shape, dtype = k.array("x", x, BF16_DTYPES)
    if len(shape) > 6:
        fail(ShapeError, op, "x.ndim", "<= 6", len(shape))
    p = _perm(op, len(shape), layout_from, layout_to, perm)
    alpha, beta = blend_params(op, alpha, beta, out)
    out = k.out(out, tuple(shape[i] for i in p), dtype)
    return k.run("transform_tensor", x, p, alpha=alpha, beta=beta, out=out)
