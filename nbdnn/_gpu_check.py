"""Whether a GPU is there, asked of the CUDA driver directly (ctypes; no numba), and
the choice of numba's CUDA simulator that must be made before numba.cuda is first
imported (numba reads NUMBA_ENABLE_CUDASIM once, at that import). `import nbdnn` runs
it, so a script that imports numba.cuda after nbdnn gets the simulator on a machine
without a GPU as well; nbdnn/cuda/runtime/simulator.py reads the outcome."""
import ctypes
import os
import sys


def driver_status():
    """(ok, why): can the CUDA driver see at least one GPU?"""
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
    _ok, DRIVER_STATUS = driver_status()
    if not _ok:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
else:
    DRIVER_STATUS = "decided by NUMBA_ENABLE_CUDASIM / an earlier numba.cuda import"
