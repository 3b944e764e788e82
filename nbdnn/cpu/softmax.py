"""Softmax over one axis and its gradient, the spec of nbdnn.softmax.

With x reduced along `axis` (length L), m = max_k x_k:

algo       y_i                                       dx_i (given dy and the y above)
fast       exp(x_i) / sum_k exp(x_k)                 y_i * (dy_i - sum_k dy_k y_k)
accurate   exp(x_i - m) / sum_k exp(x_k - m)         y_i * (dy_i - sum_k dy_k y_k)
log        x_i - m - log(sum_k exp(x_k - m))         dy_i - exp(y_i) * sum_k dy_k

"fast" is cuDNN's CUDNN_SOFTMAX_FAST: it overflows once exp(x) does (|x| > ~88 in
float32); "accurate" and "log" are finite for any finite x. Non-finite inputs follow
the formulas: a NaN or a +inf anywhere in a row makes the whole row NaN (accurate/log:
inf - inf); a row of only -inf is NaN; -inf elements next to finite ones give 0
(log: -inf). Blend: out = alpha * result + beta * out (out not read when beta == 0).

Arithmetic in float32 for float16/float32 inputs and float64 for float64.
"""
import numpy as np

from ._common import blend, compute_dtype


def forward(x, axis, algo):
    """softmax / log-softmax of x (float32 or float64) along axis."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if x.size == 0:
            return x.copy()
        if algo == "fast":
            e = np.exp(x)
            return e / e.sum(axis=axis, keepdims=True)
        z = x - x.max(axis=axis, keepdims=True)
        if algo == "log":
            return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))
        e = np.exp(z)
        return e / e.sum(axis=axis, keepdims=True)


def backward(dy, y, axis, algo):
    """dx from dy and the forward output y (log-softmax output for "log")."""
    with np.errstate(over="ignore", invalid="ignore"):
        if algo == "log":
            return dy - np.exp(y) * dy.sum(axis=axis, keepdims=True)
        return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


def softmax(x, axis, algo, *, alpha, beta, out, stream=None):
    """y = alpha * softmax(x, axis) + beta * out."""
    ct = compute_dtype(x.dtype)
    return blend(forward(x.astype(ct, copy=False), axis, algo), out, alpha, beta, x.dtype)


def softmax_backward(dy, y, axis, algo, *, alpha, beta, out, stream=None):
    """dx = alpha * softmax'(dy, y) + beta * out."""
    ct = compute_dtype(y.dtype)
    r = backward(dy.astype(ct, copy=False), y.astype(ct, copy=False), axis, algo)
    return blend(r, out, alpha, beta, y.dtype)
