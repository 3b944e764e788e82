"""Matrix multiply, the spec of nbdnn.matmul / matmul_backward.

    op(a): a (..., M, K), or a's last two axes swapped when trans_a (a: (..., K, M))
    op(b): b (..., K, N), or swapped when trans_b (b: (..., N, K))
    r = act(op(a) @ op(b) + bias)            bias: (N,) or None; act: an activation
    c = alpha * r + beta * c                 c: (batch..., M, N)

The leading (batch) axes broadcast as in NumPy. float16 inputs multiply in float32
(as the GPU accumulates), float32 in float32, float64 in float64 (BLAS).

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


def _sum_to(g, shape):
    """Sum g over the axes that broadcasting added or stretched to reach g.shape."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, n in enumerate(shape[:-2]) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def matmul(a, b, trans_a, trans_b, bias, activation, coef, *, alpha, beta, out,
           stream=None):
    ct = compute_dtype(a.dtype)
    r = np.matmul(_op(a, trans_a, ct), _op(b, trans_b, ct))
    if bias is not None:
        r = r + bias.astype(ct)
    if activation is not None:
        r = _act.forward(r, activation, ct(coef))
    return blend(r, out, alpha, beta, a.dtype)


def matmul_backward(dc, a, b, trans_a, trans_b, bias, *, alpha, beta, out, stream=None):
    """(da, db) or (da, db, dbias) when bias; out: None or a tuple of the same length."""
    ct = compute_dtype(a.dtype)
    g = dc.astype(ct, copy=False)
    opa, opb = _op(a, trans_a, ct), _op(b, trans_b, ct)
    dopa = np.matmul(g, np.swapaxes(opb, -1, -2))
    dopb = np.matmul(np.swapaxes(opa, -1, -2), g)
    da = _sum_to(np.swapaxes(dopa, -1, -2) if trans_a else dopa, a.shape)
    db = _sum_to(np.swapaxes(dopb, -1, -2) if trans_b else dopb, b.shape)
    grads = [da, db] + ([g.reshape(-1, g.shape[-1]).sum(axis=0)] if bias else [])
    outs = out if out is not None else (None,) * len(grads)
    return tuple(blend(r, o, alpha, beta, a.dtype) for r, o in zip(grads, outs))
