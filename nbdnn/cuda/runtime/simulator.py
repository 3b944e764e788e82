"""Prepare numba.cuda before its first import, and say whether kernels run on a GPU or
in numba's CUDA simulator.

- numpy 2.5 removed `np.row_stack`, which numba-cuda 0.30 still registers at import
  (NVIDIA/numba-cuda#907, won't fix): alias it to `np.vstack` when missing.
- With no usable CUDA driver or no GPU, and NUMBA_ENABLE_CUDASIM not set by the user,
  select the simulator before numba.cuda is first imported, so the same kernels run
  (slowly, in Python threads) on any machine. `SIMULATOR` says which.
- When numba.cuda was imported before nbdnn (the simulator can no longer be chosen)
  and there is no GPU, `require_gpu()` raises a DeviceError that says how to get the
  simulator, instead of numba's CudaSupportError from inside a kernel launch.

Every module under nbdnn/cuda imports SIMULATOR from here (not from the package), so
that nbdnn/cuda/__init__.py imports nothing that imports it back.
"""
import ctypes
import os
import sys

import numpy as np

from ...errors import DeviceError

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack


def driver_status():
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


_CHOSEN_HERE = "numba.cuda" not in sys.modules and "NUMBA_ENABLE_CUDASIM" not in os.environ
if _CHOSEN_HERE:
    _ok, DRIVER_STATUS = driver_status()
    if not _ok:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
else:
    DRIVER_STATUS = "decided by NUMBA_ENABLE_CUDASIM / an earlier numba.cuda import"

from numba import cuda  # noqa: E402,F401  (re-exported: nbdnn.cuda.cuda)
from numba.cuda.core import config as _config  # noqa: E402

SIMULATOR = bool(_config.ENABLE_CUDASIM)
_usable = None  # GPU present (checked once, on the first CUDA call, when not SIMULATOR)


def require_gpu(op):
    """Raise DeviceError for op when kernels can run neither on a GPU nor in the
    simulator (numba.cuda imported before nbdnn on a machine without a GPU)."""
    global _usable
    if SIMULATOR or _usable:
        return
    if _usable is None:
        _usable, why = driver_status()
        if _usable:
            return
        raise DeviceError(
            f"{op}: the CUDA backend needs a GPU or numba's CUDA simulator, and there is "
            f"no GPU ({why}); numba.cuda was imported before nbdnn, too late for nbdnn to "
            "choose the simulator: set NUMBA_ENABLE_CUDASIM=1 before starting Python, or "
            "import nbdnn before numba.cuda")
