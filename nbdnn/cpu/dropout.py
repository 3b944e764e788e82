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
drops everything. Philox4x32-10 is Random123's (Salmon et al., SC'11), checked against
its known-answer vectors in tests/test_reference_dropout.py.
"""
import numpy as np

from ._common import compute_dtype

M0, M1 = 0xD2511F53, 0xCD9E8D57      # multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85      # key increments (golden ratio, sqrt(3) - 1)
MASK32 = 0xFFFFFFFF


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Ten Philox rounds over uint64 arrays (or ints) holding 32-bit words; returns
    the four output words."""
    u = np.uint64
    c0, c1, c2, c3 = (np.asarray(c, dtype=u) for c in (c0, c1, c2, c3))
    k0, k1 = u(k0), u(k1)
    for r in range(10):
        if r:
            k0, k1 = (k0 + u(W0)) & u(MASK32), (k1 + u(W1)) & u(MASK32)
        p0, p1 = u(M0) * c0, u(M1) * c2
        c0, c1, c2, c3 = ((p1 >> u(32)) ^ c1 ^ k0, p1 & u(MASK32),
                          (p0 >> u(32)) ^ c3 ^ k1, p0 & u(MASK32))
    return c0, c1, c2, c3


def keep_threshold(p):
    """Words below this keep their element (an int in [0, 2**32])."""
    return int(np.floor((1.0 - p) * 2.0 ** 32))


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
