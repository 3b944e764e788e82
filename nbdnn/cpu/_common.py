"""Helpers shared by the reference ops: compute dtype, cuDNN's alpha/beta blend."""
import numpy as np


def compute_dtype(dtype):
    """float64 stays float64; float16/float32 compute in float32 (as the GPU does)."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def blend(result, out, alpha, beta, dtype):
    """out = alpha * result + beta * out (out not read when beta == 0); returns out."""
    r = np.asarray(result)
    if alpha != 1:
        r = r * r.dtype.type(alpha)
    if beta != 0:
        r = r + r.dtype.type(beta) * out.astype(r.dtype)
    if out is None:
        return np.ascontiguousarray(r.astype(dtype, copy=False)).reshape(r.shape)
    out[...] = r
    return out
