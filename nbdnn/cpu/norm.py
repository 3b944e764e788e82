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
import numpy as np

from ._common import compute_dtype


def _rows(x, ndim):
    lead = x.shape[:x.ndim - ndim]
    return x.reshape((int(np.prod(lead, dtype=np.int64)), -1)), lead


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
