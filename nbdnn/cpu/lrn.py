"""Cross-channel local response normalisation, the spec of nbdnn.lrn / lrn_backward
(cuDNN's LRN_CROSS_CHANNEL_DIM1; PyTorch's LocalResponseNorm).

x (N, C, *S) channels-first or (N, *S, C) channels-last; for channel c the window is
the channels c - n//2 ... c + (n-1)//2 that exist (for odd n, cuDNN's symmetric
window):
    s_c = k + alpha/n * sum_{c' in window(c)} x_c'^2,     y_c = x_c * s_c^-beta
Backward:
    dx_c = dy_c * s_c^-beta - 2*alpha*beta/n * x_c * sum_{j: c in window(j)} dy_j x_j s_j^(-beta-1)
Defaults as cuDNN's: n = 5, alpha = 1e-4, beta = 0.75, k = 2.
"""
import numpy as np

from ._common import blend, compute_dtype
from .conv import to_channels_first, to_channels_last


def _window_sum(v, n):
    """sum over each channel's window of v (channels on axis 1): n shifted slices of the
    padded array added (a running-sum difference would let an Inf or NaN in one
    channel reach channels whose window does not hold it: Inf - Inf)."""
    C = v.shape[1]
    pad = [(0, 0)] * v.ndim
    pad[1] = (n // 2, (n - 1) // 2)
    p = np.pad(v, pad)
    return sum(p[:, j:j + C] for j in range(n))


def _reverse_window_sum(v, n):
    """sum over the channels j whose window holds c: j in [c - (n-1)//2, c + n//2]."""
    return np.flip(_window_sum(np.flip(v, axis=1), n), axis=1) if n % 2 == 0 else \
        _window_sum(v, n)


def _scale(x, n, alpha, k, ct):
    return ct(k) + ct(alpha) / ct(n) * _window_sum(x * x, n)


def lrn(x, n, alpha, beta, k, last, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xf = to_channels_first(np.asarray(x), last).astype(ct)
    y = xf * _scale(xf, n, alpha, k, ct) ** ct(-beta)
    return blend(to_channels_last(y, last), out, 1.0, 0.0, x.dtype)


def lrn_backward(dy, x, n, alpha, beta, k, last, *, out, stream=None):
    ct = compute_dtype(x.dtype)
    xf = to_channels_first(np.asarray(x), last).astype(ct)
    g = to_channels_first(np.asarray(dy), last).astype(ct)
    s = _scale(xf, n, alpha, k, ct)
    t = _reverse_window_sum(g * xf * s ** ct(-beta - 1), n)
    dx = g * s ** ct(-beta) - ct(2 * alpha * beta / n) * xf * t
    return blend(to_channels_last(dx, last), out, 1.0, 0.0, x.dtype)
