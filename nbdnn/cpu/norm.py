"""Layer and RMS normalisation over the trailing `ndim` axes, the spec of
nbdnn.layer_norm / rms_norm and their backward passes. x viewed as (rows, L).

layer_norm:  mean = sum x / L,  var = sum (x - mean)^2 / L   (biased, two-pass: exact
             for mean 1e4 and std 1 in float32),  invstd = 1 / sqrt(var + eps)
             y = (x - mean) * invstd * scale + bias
rms_norm:    invrms = 1 / sqrt(sum x^2 / L + eps),  y = x * invrms * scale + bias
scale and bias (shape x.shape[-ndim:]) are optional (1 and 0). The saved statistics
(rows' shape x.shape[:-ndim]) are float32 (float64 for float64 inputs).

Backward, with xhat = (x - mean) * invstd (layer) or x * invrms (rms), g = dy * scale:
    layer: dx = invstd * (g - mean(g) - xhat * mean(g * xhat))
    rms:   dx = invrms * (g - xhat * mean(g * xhat))
    dscale = sum over rows of dy * xhat,  dbias = sum over rows of dy
(means over the L normalised elements of a row).
"""
import math

import numpy as np

from ._common import compute_dtype


def _rows(x, ndim):
    lead = x.shape[:x.ndim - ndim]
    return x.reshape((math.prod(lead), math.prod(x.shape[x.ndim - ndim:]))), lead


def _affine(xhat, scale, bias, ct, shape):
    y = xhat
    if scale is not None:
        y = y * scale.astype(ct).reshape(-1)
    if bias is not None:
        y = y + bias.astype(ct).reshape(-1)
    return y.reshape(shape)


def _put(y, out, dtype):
    if out is not None:
        out[...] = y
        return out
    return y.astype(dtype)


def layer_norm(x, scale, bias, ndim, eps, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xr, lead = _rows(x.astype(ct), ndim)
    mean = xr.mean(axis=1, keepdims=True)
    d = xr - mean
    invstd = 1 / np.sqrt((d * d).mean(axis=1, keepdims=True) + ct(eps))
    y = _affine(d * invstd, scale, bias, ct, x.shape)
    return _put(y, out, x.dtype), mean.reshape(lead), invstd.reshape(lead)


def rms_norm(x, scale, bias, ndim, eps, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xr, lead = _rows(x.astype(ct), ndim)
    invrms = 1 / np.sqrt((xr * xr).mean(axis=1, keepdims=True) + ct(eps))
    y = _affine(xr * invrms, scale, bias, ct, x.shape)
    return _put(y, out, x.dtype), invrms.reshape(lead)


def layer_norm_backward(dy, x, mean, invstd, scale, ndim, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xr, _ = _rows(x.astype(ct), ndim)
    dyr, _ = _rows(dy.astype(ct), ndim)
    inv = invstd.astype(ct).reshape(-1, 1)
    xhat = (xr - mean.astype(ct).reshape(-1, 1)) * inv
    return _into(_backward_nd(dyr, xhat, inv, scale, True, ct, x, ndim), out)


def rms_norm_backward(dy, x, invrms, scale, ndim, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xr, _ = _rows(x.astype(ct), ndim)
    dyr, _ = _rows(dy.astype(ct), ndim)
    inv = invrms.astype(ct).reshape(-1, 1)
    return _into(_backward_nd(dyr, xr * inv, inv, scale, False, ct, x, ndim), out)


def _into(results, outs):
    if outs is None:
        return results
    for r, o in zip(results, outs):
        o[...] = r
    return tuple(outs)


def _backward_nd(dyr, xhat, inv, scale, centred, ct, x, ndim):
    g = dyr * scale.astype(ct).reshape(-1) if scale is not None else dyr
    dx = g - xhat * (g * xhat).mean(axis=1, keepdims=True)
    if centred:
        dx = dx - g.mean(axis=1, keepdims=True)
    tail = x.shape[x.ndim - ndim:]
    return ((dx * inv).reshape(x.shape).astype(x.dtype),
            (dyr * xhat).sum(axis=0).reshape(tail).astype(x.dtype),
            dyr.sum(axis=0).reshape(tail).astype(x.dtype))


# ---- group_norm (instance_norm is group_norm with a group a channel) -------------------
#   x (N, C, *S) (NCHW) or (N, *S, C) (NHWC), normalised over each (n, group of C/G
#   channels, all of S); scale and bias per channel (C,); statistics (N, G).

def _first(x, last):
    return np.moveaxis(x, -1, 1) if last else x


def _channel_shape(xf):
    return (1, xf.shape[1]) + (1,) * (xf.ndim - 2)


def group_norm(x, groups, scale, bias, eps, last, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xf = _first(x.astype(ct), last)
    N = xf.shape[0]
    xg = xf.reshape(N, groups, xf.size // max(1, N * groups))
    mean = xg.mean(axis=2, keepdims=True)
    d = xg - mean
    invstd = 1 / np.sqrt((d * d).mean(axis=2, keepdims=True) + ct(eps))
    y = (d * invstd).reshape(xf.shape)
    if scale is not None:
        y = y * scale.astype(ct).reshape(_channel_shape(xf))
    if bias is not None:
        y = y + bias.astype(ct).reshape(_channel_shape(xf))
    y = np.moveaxis(y, 1, -1) if last else y
    return _put(y, out, x.dtype), mean.reshape(N, groups), invstd.reshape(N, groups)


def group_norm_backward(dy, x, mean, invstd, scale, groups, last, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xf, dyf = _first(x.astype(ct), last), _first(dy.astype(ct), last)
    N = xf.shape[0]
    inv = invstd.astype(ct)[..., None]
    xh = (xf.reshape(N, groups, xf.size // max(1, N * groups)) - mean.astype(ct)[..., None]) * inv
    g = dyf * scale.astype(ct).reshape(_channel_shape(xf)) if scale is not None else dyf
    gg = g.reshape(N, groups, g.size // max(1, N * groups))
    dx = inv * (gg - gg.mean(axis=2, keepdims=True) - xh * (gg * xh).mean(axis=2, keepdims=True))
    dx = dx.reshape(xf.shape)
    axes = (0,) + tuple(range(2, xf.ndim))
    dscale = (dyf * xh.reshape(xf.shape)).sum(axis=axes)
    dx = np.moveaxis(dx, 1, -1) if last else dx
    return _into((dx.astype(x.dtype), dscale.astype(x.dtype),
                  dyf.sum(axis=axes).astype(x.dtype)), out)
