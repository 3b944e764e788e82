"""N-d convolution (1-D, 2-D, 3-D), the spec of nbdnn.conv1d/2d/3d and their backward.

Channels-first (layout "NCHW"): x (N, C, *S), w (K, C/g, *R), y (N, K, *P).
Channels-last ("NHWC"):          x (N, *S, C), w (K, *R, C/g), y (N, *P, K).
With groups g, output channel k reads input channels [k // (K/g) * C/g, ... + C/g).

    y[n, k, p] = act(alpha * sum_{c, r} x_pad[n, c, p*stride + r*dilation] * w'[k, c, r]
                     + beta * z[n, k, p] + bias[k])
    P = (S + pad_pre + pad_post - dilation*(R - 1) - 1) // stride + 1

x_pad is x with pad_pre / pad_post zeros on each spatial axis; w' = w for mode
"cross_correlation" (what deep-learning frameworks call convolution) and w flipped on
every spatial axis for mode "convolution" (cuDNN's CUDNN_CONVOLUTION); z = residual
when given, else out (the blend with the previous output), as in cuDNN's
ConvolutionBiasActivationForward. act and bias are optional.

Backward (dy = dL/d(conv), i.e. before bias/activation/alpha):
    dx = conv_backward_data:   dx_pad[n, c, p*stride + r*dilation] += w'[k, c, r] dy[n, k, p]
    dw = conv_backward_filter: dw'[k, c, r] = sum_{n, p} dy[n, k, p] x_pad[n, c, p*stride + r*dilation]
    db = conv_backward_bias:   db[k] = sum_{n, p} dy[n, k, p]
each blended: result = alpha * gradient + beta * out.

Non-finite values follow the formulas under IEEE arithmetic, and every GPU algorithm
gives the same answer (tests/test_conv_nonfinite.py): x_pad's padding is zeros that
take part in the products, so in forward and backward filter a non-finite weight or
gradient that meets padding gives nan (0 * inf); backward data sums only the terms
that exist (dx_pad's padding is cropped, and a dy position outside P is no term), so a
non-finite weight reaches only the inputs its taps touch.

float32's math mode (nbdnn/_math_mode.py) decides what the products of the two
operands (x and w; dy and w for data; dy and x for the filter) are, as in matmul
(nbdnn/cpu/matmul.py): "tf32" convolves tf32(a) with tf32(b), "3xtf32" sums
hi(a)*hi(b) + hi(a)*lo(b) + lo(a)*hi(b); the padding's zeros are exact in either.

im2col through `sliding_window_view` and a BLAS contraction per group; the backward
data pass loops over the R taps only (vectorised over everything else).
"""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import activation as _act
from ._common import blend, compute_dtype
from .matmul import tf32


def to_channels_first(x, last):  # channels-last -> channels-first view
    return np.moveaxis(x, -1, 1) if last else x


def to_channels_last(y, last):
    return np.moveaxis(y, 1, -1) if last else y


def _filters(w, mode, last, ct):
    """w as (K, C/g, *R) in the compute dtype, flipped for mode "convolution"."""
    w = to_channels_first(w, last).astype(ct, copy=False)
    if mode == "convolution":
        w = np.flip(w, axis=tuple(range(2, w.ndim)))
    return w


def windows(xp, R, stride, dilation):
    """(N, C, *P, *R) view: xp[n, c, p*stride + r*dilation]."""
    nd = len(R)
    ext = tuple((r - 1) * d + 1 for r, d in zip(R, dilation))
    v = sliding_window_view(xp, ext, axis=tuple(range(2, 2 + nd)))
    sl = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride) + \
        tuple(slice(None, None, d) for d in dilation)
    return v[sl]


def _pad(x, pads):
    return np.pad(x, ((0, 0), (0, 0)) + tuple(pads))


def _in_mode(product, a, b, math):
    """product(a, b) of float32 operands under the math mode (matmul's _product)."""
    if a.dtype != np.float32 or math == "ieee":
        return product(a, b)
    ah, bh = tf32(a), tf32(b)
    if math == "tf32":
        return product(ah, bh)
    al, bl = tf32(a - ah), tf32(b - bh)
    return product(ah, bh) + (product(ah, bl) + product(al, bh))


def _grouped(v, groups):
    """(N, C, ...) -> (N, g, C/g, ...)"""
    return v.reshape((v.shape[0], groups, v.shape[1] // groups) + v.shape[2:])


def conv_forward(x, w, bias, residual, stride, pads, dilation, groups, mode, last,
                 activation, coef, algo="auto", math="ieee", *, alpha, beta, out,
                 stream=None):
    """algo: the GPU's choice; every algorithm computes the formula above."""
    ct = compute_dtype(x.dtype)
    xf = to_channels_first(x, last).astype(ct, copy=False)
    wf = _filters(w, mode, last, ct)
    nd = xf.ndim - 2
    R = wf.shape[2:]
    sp, tap = "pqr"[:nd], "uvw"[:nd]

    def product(xf, wf):
        cols = _grouped(windows(_pad(xf, pads), R, stride, dilation), groups)
        wg = _grouped(wf.reshape((1,) + wf.shape), groups)[0]      # (g, K/g, C/g, *R)
        return np.einsum(f"ngc{sp}{tap},gkc{tap}->ngk{sp}", cols, wg, optimize=True)
    y = _in_mode(product, xf, wf, math)
    y = y.reshape((y.shape[0], y.shape[1] * y.shape[2]) + y.shape[3:])  # (N, K, *P)
    if alpha != 1:
        y = y * ct(alpha)
    z = residual if residual is not None else out
    if beta != 0:
        y = y + ct(beta) * to_channels_first(z, last).astype(ct)
    if bias is not None:
        y = y + bias.astype(ct).reshape((1, -1) + (1,) * nd)
    if activation is not None:
        y = _act.forward(y, activation, ct(coef))
    return blend(to_channels_last(y, last), out, 1.0, 0.0, x.dtype)


def conv_backward_data(dy, w, x_shape, stride, pads, dilation, groups, mode, last,
                       algo="auto", math="ieee", *, alpha, beta, out, stream=None):
    ct = compute_dtype(dy.dtype)
    g = to_channels_first(dy, last).astype(ct, copy=False)                      # (N, K, *P)
    wf = _filters(w, mode, last, ct)                                 # (K, C/g, *R)
    xs = to_channels_first(np.empty(x_shape, dtype=np.bool_), last).shape        # (N, C, *S)
    nd = len(xs) - 2
    R, P = wf.shape[2:], g.shape[2:]
    padded = tuple(s + a + b for s, (a, b) in zip(xs[2:], pads))
    sp = "pqr"[:nd]

    def product(g, wf):
        dxp = np.zeros((xs[0], xs[1]) + padded, dtype=ct)
        gg = _grouped(g, groups)                                     # (N, g, K/g, *P)
        wg = _grouped(wf.reshape((1,) + wf.shape), groups)[0]        # (g, K/g, C/g, *R)
        for r in np.ndindex(*R):
            contrib = np.einsum(f"ngk{sp},gkc->ngc{sp}", gg, wg[(Ellipsis,) + r],
                                optimize=True)
            idx = tuple(slice(ri * d, ri * d + (p - 1) * s + 1, s)
                        for ri, d, p, s in zip(r, dilation, P, stride))
            dxp[(slice(None), slice(None)) + idx] += contrib.reshape(dxp.shape[:2] + P)
        return dxp
    dxp = _in_mode(product, g, wf, math)
    crop = tuple(slice(a, a + s) for (a, _), s in zip(pads, xs[2:]))
    dx = dxp[(slice(None), slice(None)) + crop]
    return blend(to_channels_last(dx, last), out, alpha, beta, dy.dtype)


def conv_backward_filter(dy, x, w_shape, stride, pads, dilation, groups, mode, last,
                         algo="auto", math="ieee", *, alpha, beta, out, stream=None):
    ct = compute_dtype(dy.dtype)
    g = to_channels_first(dy, last).astype(ct, copy=False)
    xf = to_channels_first(x, last).astype(ct, copy=False)
    nd = xf.ndim - 2
    R = to_channels_first(np.empty(w_shape, dtype=np.bool_), last).shape[2:]
    sp, tap = "pqr"[:nd], "uvw"[:nd]

    def product(g, xf):
        cols = _grouped(windows(_pad(xf, pads), R, stride, dilation), groups)
        return np.einsum(f"ngk{sp},ngc{sp}{tap}->gkc{tap}", _grouped(g, groups), cols,
                         optimize=True)
    dw = _in_mode(product, g, xf, math)
    dw = dw.reshape((-1,) + dw.shape[2:])                            # (K, C/g, *R)
    if mode == "convolution":
        dw = np.flip(dw, axis=tuple(range(2, dw.ndim)))
    return blend(to_channels_last(dw, last), out, alpha, beta, dy.dtype)


def conv_backward_bias(dy, last, *, alpha, beta, out, stream=None):
    ct = compute_dtype(dy.dtype)
    g = to_channels_first(dy, last).astype(ct, copy=False)
    db = g.sum(axis=(0,) + tuple(range(2, g.ndim)))
    return blend(db, out, alpha, beta, dy.dtype)
