"""N-d pooling (1-D, 2-D, 3-D), the spec of nbdnn.pool1d/2d/3d and pool_backward.

x (N, C, *S) channels-first or (N, *S, C) channels-last; y the same layout with P.
Per spatial axis, with window k, stride s, dilation d and pre/post padding:

    output p's window reads i = p*s - pre + j*d, j = 0..k-1
    P = floor((S + pre + post - d*(k-1) - 1) / s) + 1
    ceil_mode: ceil(...) + 1, less one when the last window would start past the
    input and its pre-padding (PyTorch's rule), so every window starts inside.

Modes (cuDNN's names):
- "max": the largest input element in the window; padding never wins (a window with
  no input element gives -inf). nan_propagation=True: a NaN in the window gives NaN;
  False: NaNs are skipped (an all-NaN window still gives NaN).
- "avg" (CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING): the sum over the window's
  input elements / the number of its positions inside the padded input (the overhang
  of ceil mode is not counted).
- "avg_exclude_pad": the sum / the number of input elements (0 for none).
- either average with a divisor (PyTorch's divisor_override): the sum / the divisor.
Global average pooling is a window the size of the input.

Indices (max): each window's first maximal element in window order (the one max
returns) as its flat index in the (n, c) plane, row-major over the spatial axes; -1
for a window with no input element.

Backward (dy = dL/dy): avg sends dy[p] / count (or / the divisor) to each input element of window p;
max sends dy[p] to the first maximal element of window p in window order (row-major
over the window's axes; with propagation a NaN is maximal), deterministic. Each result
is blended: alpha * value + beta * out.
"""
import numpy as np

from ._common import blend, compute_dtype
from .conv import to_channels_first, to_channels_last, windows



def _padded(x, K, stride, dilation, pads, P, fill):
    """x padded with `fill` on each spatial axis, plus the ceil-mode overhang."""
    widths = [(0, 0), (0, 0)]
    for S, k, s, d, (pre, post), p in zip(x.shape[2:], K, stride, dilation, pads, P):
        need = (p - 1) * s + d * (k - 1) + 1
        widths.append((pre, max(post, need - S - pre)))
    return np.pad(x, widths, constant_values=fill), widths


def _win(xp, K, stride, dilation, P):
    """(N, C, *P, *K) windows; ceil mode's rule can leave fewer outputs than the padded
    length holds."""
    return windows(xp, K, stride, dilation)[(slice(None),) * 2 + tuple(slice(p) for p in P)]


def _masks(x_shape, K, stride, dilation, pads, P):
    """(input mask, padded-extent mask) windows, each (1, 1, *P, *K) of bool."""
    ones = np.ones((1, 1) + tuple(x_shape[2:]), dtype=np.int8)
    inside, widths = _padded(ones, K, stride, dilation, pads, P, 0)
    extent = np.zeros_like(inside)
    core = tuple(slice(None) for _ in range(2)) + tuple(
        slice(0, w[0] + S + pads[i][1]) for i, (w, S) in enumerate(zip(widths[2:], x_shape[2:])))
    extent[core] = 1
    return (_win(inside, K, stride, dilation, P).astype(bool),
            _win(extent, K, stride, dilation, P).astype(bool))


def _window_max(win, valid, propagate):
    """(max, first maximal flat index, has an element); win and valid are
    (N, C, *P, *K): the window axes are the trailing half of the spatial ones."""
    nd = (win.ndim - 2) // 2
    taps = int(np.prod(win.shape[2 + nd:]))
    flat = win.reshape(win.shape[:2 + nd] + (taps,))
    ok = np.broadcast_to(valid.reshape(valid.shape[:2 + nd] + (taps,)), flat.shape)
    nan = np.isnan(flat) & ok
    real = ok & ~nan
    m = np.where(real, flat, -np.inf).max(axis=-1)
    any_nan, any_real = nan.any(axis=-1), real.any(axis=-1)
    m = np.where(any_nan & (propagate | ~any_real), np.nan, m)
    hit = np.where(np.isnan(m)[..., None], nan, real & (flat == m[..., None]))
    return m, hit.argmax(axis=-1), ok.any(axis=-1)


def _forward_values(x, K, stride, dilation, pads, P, mode, propagate, ct, divisor=0):
    xp, _ = _padded(x.astype(ct), K, stride, dilation, pads, P, 0)
    win = _win(xp, K, stride, dilation, P)
    inside, extent = _masks(x.shape, K, stride, dilation, pads, P)
    axes = tuple(range(win.ndim - len(K), win.ndim))
    if mode == "max":
        return _window_max(win, inside, propagate)[0].astype(ct)
    total = np.where(inside, win, 0).sum(axis=axes)
    if divisor:
        return (total / divisor).astype(ct)
    count = (inside if mode == "avg_exclude_pad" else extent).sum(axis=axes)
    return np.where(count > 0, total / np.maximum(count, 1), 0).astype(ct)


def pool_forward(x, K, stride, pads, dilation, mode, ceil_mode, propagate, last, P, *,
                 alpha, beta, out, stream=None, divisor=0):
    ct = compute_dtype(x.dtype)
    y = _forward_values(to_channels_first(np.asarray(x), last), K, stride, dilation, pads, P, mode,
                        propagate, ct, divisor)
    return blend(to_channels_last(y, last), out, alpha, beta, x.dtype)


def pool_backward(dy, x, K, stride, pads, dilation, mode, ceil_mode, propagate, last, P, *,
                  alpha, beta, out, stream=None, divisor=0):
    ct = compute_dtype(x.dtype)
    xf, g = to_channels_first(np.asarray(x), last).astype(ct), to_channels_first(np.asarray(dy), last).astype(ct)
    xp, widths = _padded(xf, K, stride, dilation, pads, P, 0)
    inside, extent = _masks(xf.shape, K, stride, dilation, pads, P)
    nd = len(K)
    axes = tuple(range(2 + nd, 2 + 2 * nd))
    if mode == "max":
        _, idx, has = _window_max(_win(xp, K, stride, dilation, P), inside, propagate)
        g = np.where(has, g, 0)
    elif divisor:
        g = g / divisor
    else:
        count = (inside if mode == "avg_exclude_pad" else extent).sum(axis=axes)
        g = np.where(count > 0, g / np.maximum(count, 1), 0)
    dxp = np.zeros_like(xp)
    for j, taps in enumerate(np.ndindex(*K)):  # each window position, vectorised
        sl = (slice(None), slice(None)) + tuple(
            slice(t * d, t * d + (p - 1) * s + 1, s)
            for t, d, p, s in zip(taps, dilation, P, stride))
        tap_in = inside[(Ellipsis,) + taps]
        share = np.where(idx == j, g, 0) if mode == "max" else g
        dxp[sl] += np.where(tap_in, share, 0)
    core = (slice(None), slice(None)) + tuple(
        slice(w[0], w[0] + S) for w, S in zip(widths[2:], xf.shape[2:]))
    return blend(to_channels_last(dxp[core], last), out, alpha, beta, x.dtype)


def pool_indices(x, K, stride, pads, dilation, mode, ceil_mode, propagate, last, P, *, out,
                 stream=None):
    xf = to_channels_first(np.asarray(x), last).astype(compute_dtype(x.dtype))
    xp, _ = _padded(xf, K, stride, dilation, pads, P, 0)
    inside, _ = _masks(xf.shape, K, stride, dilation, pads, P)
    _, tap, has = _window_max(_win(xp, K, stride, dilation, P), inside, propagate)
    flat = np.zeros(tap.shape, np.int64)
    taps = np.unravel_index(tap, K)  # each window's tap, per axis
    for a, (S, k, s, d, (pre, _), p) in enumerate(zip(xf.shape[2:], K, stride, dilation,
                                                     pads, P)):
        start = (np.arange(p) * s - pre).reshape((p,) + (1,) * (len(K) - 1 - a))
        flat = flat * S + start + taps[a] * d  # (input position on axis a)
    flat = np.where(has, flat, -1)
    flat = np.ascontiguousarray(to_channels_last(flat, last))
    if out is None:
        return flat
    out[...] = flat
    return out
