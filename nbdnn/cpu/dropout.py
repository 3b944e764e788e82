"""Dropout with a counter-based generator, the spec of nbdnn.dropout: the CPU and the
GPU draw the same mask bit for bit for the same (seed, offset).

    u[i]    = Philox4x32-10(counter = (j_lo, j_hi, offset_lo, offset_hi),
                            key = (seed_lo, seed_hi))[i % 4],   j = i // 4
    mask[i] = u[i] < floor((1 - p) * 2**32)       (uint8: 1 kept, 0 dropped)
    y[i]    = x[i] / (1 - p) if mask[i] else 0    (0 everywhere when p == 1)
    dx[i]   = dy[i] / (1 - p) if mask[i] else 0   (dropout_backward; any nonzero mask
                                                   byte keeps)
A dropped element is exactly 0, also where x is Inf or NaN (a select, not x * 0).

i runs over x in C order. p == 0 keeps everything (the threshold is 2**32), p == 1
drops everything. Philox4x32-10 and the threshold: nbdnn/_philox.py (shared with the
CUDA kernels).
"""
import numpy as np

from .._philox import MASK32, keep_threshold, philox4x32_10
from ._common import compute_dtype

def mask(n, p, seed, offset):
    """The uint8 keep mask of n elements."""
    j = np.arange(-(-n // 4), dtype=np.uint64)
    words = philox4x32_10(j & np.uint64(MASK32), j >> np.uint64(32),
                          offset & MASK32, offset >> 32, seed & MASK32, seed >> 32)
    u = np.stack(words, axis=1).reshape(-1)[:n]
    return (u < np.uint64(keep_threshold(p)) if p > 0 else np.ones(n, bool)).astype(np.uint8)


def _scaled(v, m, p):
    """v / (1 - p) where the mask keeps (any nonzero byte), exactly 0 where it drops:
    a dropped Inf or NaN gives 0 too (a select, not a product with 0), as the kernels'."""
    ct = compute_dtype(v.dtype)
    scale = ct(0) if p >= 1 else ct(1) / ct(1 - p)
    return np.where(m != 0, v.astype(ct) * scale, ct(0)).astype(v.dtype)


def dropout(x, p, seed, offset, *, out, stream=None):
    if isinstance(offset, np.ndarray):  # a counter: read it, then advance it by x.size
        offset, counter = int(offset[0]), offset
        counter[0] = (offset + x.size) % 2 ** 64
    m = mask(x.size, p, seed, offset).reshape(x.shape)
    y = _scaled(x, m, p)
    if out is not None:
        out[...] = y
        y = out
    return y, m


def dropout_backward(dy, m, p, *, out, stream=None):
    dx = _scaled(dy, m, p)
    if out is not None:
        out[...] = dx
        return out
    return dx
