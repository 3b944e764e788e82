"""Matrix multiply, the spec of nbdnn.matmul / matmul_backward.

    op(a): a (..., M, K), or a's last two axes swapped when trans_a (a: (..., K, M))
    op(b): b (..., K, N), or swapped when trans_b (b: (..., N, K))
    r = act(op(a) @ op(b) + bias)            bias: (N,) or None; act: an activation
    c = alpha * r + beta * c                 c: (batch..., M, N)

The leading (batch) axes broadcast as in NumPy. float16 inputs multiply in float32
(as the GPU accumulates), float32 in float32, float64 in float64 (BLAS).

float32's math mode (nbdnn/_math_mode.py) decides what a product of float32
operands x @ y is:
    "ieee"    x @ y
    "tf32"    tf32(x) @ tf32(y)                 tf32: round to 10 mantissa bits, to
                                                nearest, ties to even (as TMA does)
    "3xtf32"  hi(x) @ hi(y) + hi(x) @ lo(y) + lo(x) @ hi(y),
              hi = tf32(v), lo = tf32(v - hi)   (v - hi is exact in float32)
every sum in float32. Other dtypes ignore the mode.

Backward, given dc = dL/d(op(a) @ op(b) + bias) (for a fused activation, apply
activation_backward to the output gradient first):
    d op(a) = dc @ op(b)^T,   d op(b) = op(a)^T @ dc,   dbias = sum of dc over all
    axes but the last; da, db are transposed back when trans_a / trans_b and summed over
    the batch axes that a or b were broadcast along, so they have a's and b's shapes.
"""
import numpy as np

from . import activation as _act
from ._common import blend, compute_dtype


def _op(x, trans, ct):
    x = x.astype(ct, copy=False)
    return np.swapaxes(x, -1, -2) if trans else x


def tf32(x):
    """float32 x rounded to TF32 (10 mantissa bits, to nearest, ties to even) as
    float32; NaN and infinities kept, a value that rounds past the largest float
    becomes inf. The rounding Hopper's TMA applies to a TFLOAT32 tensor map."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = ((u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) &
         np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(x), r, x).astype(np.float32)


def product(x, y, math):
    """x @ y under float32's math mode (x, y already in the compute dtype)."""
    if x.dtype != np.float32 or math == "ieee":
        return np.matmul(x, y)
    xh, yh = tf32(x), tf32(y)
    if math == "tf32":
        return np.matmul(xh, yh)
    xl, yl = tf32(x - xh), tf32(y - yh)
    return np.matmul(xh, yh) + (np.matmul(xh, yl) + np.matmul(xl, yh))


def _sum_to(g, shape):
    """Sum g over the axes that broadcasting added or stretched to reach g.shape."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, n in enumerate(shape[:-2]) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def matmul(a, b, trans_a, trans_b, bias, activation, coef, math="ieee", *, alpha, beta,
           out, stream=None):
    ct = compute_dtype(a.dtype)
    r = product(_op(a, trans_a, ct), _op(b, trans_b, ct), math)
    if bias is not None:
        r = r + bias.astype(ct)
    if activation is not None:
        r = _act.forward(r, activation, ct(coef))
    return blend(r, out, alpha, beta, a.dtype)


def matmul_backward(dc, a, b, trans_a, trans_b, bias, math="ieee", *, alpha, beta, out,
                    stream=None):
    """(da, db) or (da, db, dbias) when bias; out: None or a tuple of the same length."""
    ct = compute_dtype(a.dtype)
    g = dc.astype(ct, copy=False)
    opa, opb = _op(a, trans_a, ct), _op(b, trans_b, ct)
    dopa = product(g, np.swapaxes(opb, -1, -2), math)
    dopb = product(np.swapaxes(opa, -1, -2), g, math)
    da = _sum_to(np.swapaxes(dopa, -1, -2) if trans_a else dopa, a.shape)
    db = _sum_to(np.swapaxes(dopb, -1, -2) if trans_b else dopb, b.shape)
    grads = [da, db] + ([g.reshape(-1, g.shape[-1]).sum(axis=0)] if bias else [])
    outs = out if out is not None else (None,) * len(grads)
    return tuple(blend(r, o, alpha, beta, a.dtype) for r, o in zip(grads, outs))
