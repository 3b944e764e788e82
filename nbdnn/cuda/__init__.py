"""The CUDA backend: numba.cuda kernels, one module per op family.

Importing this package prepares numba.cuda:
- numpy 2.5 removed `np.row_stack`, which numba-cuda 0.30 still registers at import
  (NVIDIA/numba-cuda#907, won't fix): alias it to `np.vstack` when missing.
- With no usable CUDA driver or no GPU, and NUMBA_ENABLE_CUDASIM not set by the user,
  select numba's CUDA simulator before numba.cuda is first imported, so the same
  kernels run (slowly, in Python threads) on any machine. `SIMULATOR` says which.
"""
import ctypes
import os
import sys

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack


def _driver_status():
    """(ok, why): can the CUDA driver see at least one GPU? Uses libcuda directly so
    that no numba state is touched."""
    try:
        lib = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    except OSError:
        return False, "no CUDA driver (libcuda) found"
    rc = lib.cuInit(0)
    if rc != 0:
        return False, f"cuInit failed (CUresult {rc})"
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0 or count.value == 0:
        return False, "the CUDA driver sees no GPU"
    return True, "CUDA driver and GPU found"


if "numba.cuda" not in sys.modules and "NUMBA_ENABLE_CUDASIM" not in os.environ:
    _ok, DRIVER_STATUS = _driver_status()
    if not _ok:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
else:
    DRIVER_STATUS = "decided by NUMBA_ENABLE_CUDASIM / an earlier numba.cuda import"

from numba import cuda  # noqa: E402

from numba.cuda.core import config as _config  # noqa: E402

SIMULATOR = bool(_config.ENABLE_CUDASIM)

from .graph import Graph  # noqa: E402,F401  (nbdnn.cuda.Graph)
