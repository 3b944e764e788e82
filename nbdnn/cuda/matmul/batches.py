"""The batch-broadcast table of the GEMM kernels: for each index z of the broadcast
batch shape, where the matrices of a and b that it multiplies start (NumPy's
broadcasting rules), as one device array [a_0, b_0, a_1, b_1, ...] cached per layout (and device).
The SIMT kernel reads element offsets (int64), the tensor-core kernel matrix indices
into its 3-d tensor maps (int32)."""
import math

import numpy as np

from ..runtime.memory.arrays import to_device
from ..runtime.device import key as device_key

_cache = {}


def table(a_batch, b_batch, batch, a_step=1, b_step=1, dtype=np.int64):
    """Device [a start, b start] per batch index: matrix index times a_step / b_step
    (the matrices' element counts for offsets, 1 for indices)."""
    key = (a_batch, b_batch, batch, a_step, b_step, np.dtype(dtype).name, device_key())
    t = _cache.get(key)
    if t is None:
        n = math.prod(batch)
        ia = np.broadcast_to(np.arange(math.prod(a_batch)).reshape(a_batch), batch).ravel()
        ib = np.broadcast_to(np.arange(math.prod(b_batch)).reshape(b_batch), batch).ravel()
        host = np.zeros(2 * max(n, 1), dtype=dtype)
        host[0::2][:n], host[1::2][:n] = ia * a_step, ib * b_step
        if len(_cache) > 256:
            _cache.clear()
        t = _cache[key] = to_device(host)
    return t
