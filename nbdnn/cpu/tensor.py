"""Tensor ops, the spec of nbdnn's add_tensor, op_tensor, reduce_tensor, scale_tensor,
set_tensor and transform_tensor. Arithmetic in float32 for float16/float32 inputs,
float64 for float64 (compute_dtype); results rounded once to the input dtype.

add_tensor      out = alpha * A + beta * C          A broadcast to C (C not read if beta == 0)
op_tensor       out = f(alpha1 * A, alpha2 * B) + beta * out
                f: add x+y, mul x*y, div x/y, min, max (NaN propagates), sqrt(x), not 1-x
reduce_tensor   out = alpha * R(x over axes) + beta * out
                R: add sum x, mul prod x, min, max, amax max|x|, avg sum x / n,
                norm1 sum |x|, norm2 sqrt(sum x^2), mul_no_zeros prod_{x != 0} x
                (1 when all are 0); n = elements per reduced block.
                indices (min/max/amax): flat C-order position within the reduced
                block, first occurrence on ties; NaN wins (first NaN), as np.argmax.
scale_tensor    out = alpha * x
set_tensor      x[...] = value  (in place)
transform_tensor out = alpha * transpose(x, perm) + beta * out
"""
import math

import numpy as np

from ._common import blend, compute_dtype


def _bcast(a, ndim):
    """a with leading size-1 dims up to ndim (NumPy's trailing alignment)."""
    return a.reshape((1,) * (ndim - a.ndim) + a.shape)


def _store(r, out, dtype):
    if out is None:
        return np.array(np.asarray(r).astype(dtype), order="C")  # keeps 0-d shape
    out[...] = r
    return out


def add_tensor(a, c, *, alpha, beta, out, stream=None):
    """out = alpha * A + beta * C, A broadcast to C; C is not read when beta == 0."""
    ct = compute_dtype(c.dtype)
    r = ct(alpha) * _bcast(a, c.ndim).astype(ct)
    r = np.broadcast_to(r, c.shape)
    if beta != 0:
        r = r + ct(beta) * c.astype(ct)
    return _store(r, out, c.dtype)


def _op(op, x, y):
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op == "add":
            return x + y
        if op == "mul":
            return x * y
        if op == "div":
            return x / y
        if op == "min":
            return np.minimum(x, y)
        if op == "max":
            return np.maximum(x, y)
        if op == "sqrt":
            return np.sqrt(x)
        if op == "not":
            return x.dtype.type(1) - x
        if op == "finite":
            return np.where(np.isfinite(x), x, x.dtype.type(0))
    raise ValueError(op)


def op_tensor(op, a, b, *, alpha1, alpha2, beta, out, stream=None):
    """out = f(alpha1 * A, alpha2 * B) + beta * out (B broadcast to A)."""
    ct = compute_dtype(a.dtype)
    with np.errstate(invalid="ignore", over="ignore"):  # (0 * inf: NaN, as on the GPU)
        x = ct(alpha1) * a.astype(ct)
        y = None if b is None else ct(alpha2) * _bcast(b, a.ndim).astype(ct)
    r = np.broadcast_to(_op(op, x, y), a.shape)
    return blend(r, out, 1.0, beta, a.dtype)


def _blocks(x, axes):
    """x as (kept..., n): the reduced axes (in order) flattened last."""
    kept = [i for i in range(x.ndim) if i not in axes]
    xt = np.transpose(x, kept + list(axes))
    return xt.reshape(xt.shape[:len(kept)] + (math.prod(xt.shape[len(kept):]),))


def _arg(v, op):
    """First-occurrence argmin/argmax along the last axis; NaN wins (first NaN)."""
    return np.argmin(v, axis=-1) if op == "min" else np.argmax(v, axis=-1)


def reduce_values(x, op, axes):
    """(values of shape kept-dims, indices or None) in x's dtype (the compute type)."""
    v = _blocks(x, axes)
    n = v.shape[-1]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if op in ("min", "max", "amax"):
            w = np.abs(v) if op == "amax" else v
            idx = _arg(w, "min" if op == "min" else "max")
            return np.take_along_axis(w, idx[..., None], -1)[..., 0], idx.astype(np.int64)
        if op == "add":
            r = v.sum(-1)
        elif op == "avg":
            r = v.sum(-1) / x.dtype.type(n)
        elif op == "norm1":
            r = np.abs(v).sum(-1)
        elif op == "norm2":
            r = np.sqrt((v * v).sum(-1))
        elif op == "mul":
            r = v.prod(-1)
        elif op == "mul_no_zeros":
            r = np.where(v == 0, x.dtype.type(1), v).prod(-1)
        else:
            raise ValueError(op)
    return r, None


def reduce_tensor(x, op, axes, keepdims, return_indices, *, alpha, beta, out, stream=None):
    """out = alpha * R(x over axes) + beta * out; (out, indices) with return_indices."""
    ct = compute_dtype(x.dtype)
    r, idx = reduce_values(x.astype(ct), op, axes)
    oshape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims \
        else tuple(n for i, n in enumerate(x.shape) if i not in axes)
    res = blend(np.reshape(r, oshape), out, alpha, beta, x.dtype)  # out itself when given
    if return_indices:
        return res, np.array(np.reshape(idx, oshape), dtype=np.int64)
    return res


def scale_tensor(x, alpha, *, out, stream=None):
    """out = alpha * x."""
    ct = compute_dtype(x.dtype)
    return _store(ct(alpha) * x.astype(ct), out, x.dtype)


def set_tensor(value, *, out, stream=None):
    """out[...] = value, in place; returns out."""
    out[...] = value
    return out


def cast_tensor(x, dtype, *, alpha, beta, out, stream=None):
    """out = alpha * x + beta * out in `dtype`: computed in float32 (float64 when either
    side is float64), rounded once; float64 -> bfloat16 through float32 (the GPU's
    cvt.rn.bf16.f32)."""
    ct = np.float64 if np.float64 in (np.dtype(x.dtype), np.dtype(dtype)) else np.float32
    r = np.asarray(x).astype(ct)
    if alpha != 1:
        r = r * ct(alpha)
    if beta != 0:
        r = r + ct(beta) * out.astype(ct)
    if str(dtype) == "bfloat16" and ct is np.float64:
        r = r.astype(np.float32)
    r = np.asarray(r.astype(dtype), order="C")  # (ascontiguousarray makes 0-d 1-d)
    if out is None:
        return r
    out[...] = r
    return out


def transform_tensor(x, perm, *, alpha, beta, out, stream=None):
    """out = alpha * transpose(x, perm) + beta * out."""
    ct = compute_dtype(x.dtype)
    return blend(np.transpose(x.astype(ct), perm), out, alpha, beta, x.dtype)
