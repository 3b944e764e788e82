"""Batch normalisation, the spec of nbdnn.batch_norm_train / _infer / _backward.

x is viewed as (N, C, L): mode "spatial" normalises each channel over N and the
spatial positions (C channels, L = H*W...; NHWC is transposed to this view);
"per_activation" normalises each element of an image over N (C = the image's size in
memory order, L = 1). Parameters and statistics have shape (C,) for spatial and
x.shape[1:] for per_activation.

Training (cuDNN's BatchNormalizationForwardTraining, with BN_ADD_ACTIVATION fused):
    mean = mean(x),  var = mean((x - mean)^2)        (biased; shifted two-pass; an Inf
                                                      input: mean Inf, var NaN)
    invstd = 1 / sqrt(var + eps),  xhat = (x - mean) * invstd
    y = act(scale * xhat + bias + z),   z = residual (optional), act optional
    running_mean = (1 - momentum) * running_mean + momentum * mean
    running_var  = (1 - momentum) * running_var + momentum * var * M / (M - 1)
with M = N*L the count a statistic averages (for M = 1 the biased var, 0, is used).
Statistics and running statistics are kept in the compute dtype (float32 for float16
and float32 inputs, float64 for float64), as layer_norm's are. scale and bias have x's
dtype or, beside 16-bit x, float32 (cuDNN's); dscale and dbias come back in theirs.
Inference: the same y with mean and var given (running statistics).
Backward, with dyh = dy * act'(scale * xhat + bias + z):
    dbias = sum(dyh), dscale = sum(dyh * xhat)
    dx = scale * invstd / M * (M * dyh - dbias - xhat * dscale),  dz = dyh
"""
import math

import numpy as np

from . import activation as _act
from ._common import blend, compute_dtype


def view(x, mode, last):
    """x as (N, C, L) (a view for NCHW/per_activation, moved axes for NHWC) and the
    function mapping such an array back to x's shape and layout."""
    shape = x.shape
    if mode == "per_activation":
        return x.reshape(shape[0], math.prod(shape[1:]), 1), lambda v: v.reshape(shape)
    if last:
        v = np.moveaxis(x.reshape(shape[0], math.prod(shape[1:-1]), shape[-1]), -1, 1)
        return v, lambda u: np.moveaxis(u, 1, -1).reshape(shape)
    return x.reshape(shape[0], shape[1], math.prod(shape[2:])), lambda v: v.reshape(shape)


def _col(p, C, ct, default):
    return (np.full(C, default, ct) if p is None else np.asarray(p, ct).reshape(C))[:, None]


def _apply(xv, mean, invstd, scale, bias, zv, act, coef, ct):
    """(pre-activation, xhat) in the (N, C, L) view."""
    C = xv.shape[1]
    xhat = (xv - np.asarray(mean, ct).reshape(C)[:, None]) * \
        np.asarray(invstd, ct).reshape(C)[:, None]
    pre = _col(scale, C, ct, 1) * xhat + _col(bias, C, ct, 0)
    if zv is not None:
        pre = pre + zv
    return pre, xhat


def _output(pre, act, coef, ct):
    return pre if act is None else _act.forward(pre, act, ct(coef))


def batch_norm_train(x, scale, bias, running_mean, running_var, residual, momentum, eps,
                     mode, last, act, coef, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xv, back = view(np.asarray(x).astype(ct), mode, last)
    N, C, L = xv.shape
    mean = xv.mean(axis=(0, 2))
    var = ((xv - mean[:, None]) ** 2).mean(axis=(0, 2))
    # a channel holding an Inf has mean Inf (+Inf with -Inf: NaN) and variance NaN, as
    # PyTorch's batch_norm and group_norm's reference give them; the kernels' shifted,
    # Chan-merged statistics keep that on every path (nbdnn/cuda/batch_norm/sums.py)
    invstd = 1 / np.sqrt(var + ct(eps))
    zv = None if residual is None else view(np.asarray(residual).astype(ct), mode, last)[0]
    pre, _ = _apply(xv, mean, invstd, scale, bias, zv, act, coef, ct)
    pshape = tuple(x.shape[1:]) if mode == "per_activation" else (C,)
    M = N * L
    m = ct(momentum)
    for run, stat in ((running_mean, mean), (running_var, var * (M / (M - 1) if M > 1 else 1))):
        if run is not None:
            run[...] = ((1 - m) * run.astype(ct) + m * stat.reshape(run.shape)).astype(run.dtype)
    y = blend(back(_output(pre, act, coef, ct)), out, 1.0, 0.0, x.dtype)
    return y, mean.reshape(pshape).astype(ct), invstd.reshape(pshape).astype(ct)


def batch_norm_infer(x, scale, bias, mean, var, residual, eps, mode, last, act, coef, *,
                     alpha, beta, out, stream=None):
    ct = compute_dtype(x.dtype)
    xv, back = view(np.asarray(x).astype(ct), mode, last)
    invstd = 1 / np.sqrt(np.asarray(var, ct).reshape(-1) + ct(eps))
    zv = None if residual is None else view(np.asarray(residual).astype(ct), mode, last)[0]
    pre, _ = _apply(xv, np.asarray(mean, ct).reshape(-1), invstd, scale, bias, zv, act, coef,
                    ct)
    return blend(back(_output(pre, act, coef, ct)), out, alpha, beta, x.dtype)


def batch_norm_backward(dy, x, scale, bias, mean, invstd, residual, mode, last, act, coef, *,
                        out, stream=None):
    ct = compute_dtype(x.dtype)
    xv, back = view(np.asarray(x).astype(ct), mode, last)
    dyv = view(np.asarray(dy).astype(ct), mode, last)[0]
    N, C, L = xv.shape
    zv = None if residual is None else view(np.asarray(residual).astype(ct), mode, last)[0]
    pre, xhat = _apply(xv, mean, invstd, scale, bias, zv, act, coef, ct)
    dyh = dyv if act is None else dyv * _act.derivative(pre, act, ct(coef))
    dbias, dscale = dyh.sum(axis=(0, 2)), (dyh * xhat).sum(axis=(0, 2))
    M = N * L
    k = _col(scale, C, ct, 1) * np.asarray(invstd, ct).reshape(C)[:, None] / ct(M)
    dx = k * (ct(M) * dyh - dbias[:, None] - xhat * dscale[:, None])
    pshape = tuple(x.shape[1:]) if mode == "per_activation" else (C,)
    res = [back(dx), dscale.reshape(pshape), dbias.reshape(pshape)]
    pdt = next((np.asarray(p).dtype for p in (scale, bias) if p is not None), x.dtype)
    dtypes = [x.dtype, pdt, pdt]
    if residual is not None:
        res.append(back(dyh))
        dtypes.append(x.dtype)
    outs = out or (None,) * len(res)
    return tuple(blend(r, o, 1.0, 0.0, d) for r, o, d in zip(res, outs, dtypes))
