"""Philox4x32-10, the counter-based generator both backends draw dropout masks from
(Random123's; Salmon et al., SC'11): its constants, the keep threshold and the NumPy
form the CPU reference runs (the CUDA kernels write the same rounds as device code,
nbdnn/cuda/dropout.py). One place, so the two cannot drift; checked against the
known-answer vectors in tests/test_reference_dropout.py."""
import numpy as np

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
