"""Prepare numba.cuda before its first import, and say whether kernels run on a GPU or
in numba's CUDA simulator.

- numpy 2.5 removed `np.row_stack`, which numba-cuda 0.30 still registers at import
  (NVIDIA/numba-cuda#907, won't fix): alias it to `np.vstack` when missing.
- With no usable CUDA driver or no GPU, and NUMBA_ENABLE_CUDASIM not set by the user,
  select the simulator before numba.cuda is first imported, so the same kernels run
  (slowly, in Python threads) on any machine. `SIMULATOR` says which.
- numba-cuda 0.30's simulator runs a block's threads while its launching thread polls
  them in a loop that never lets go of the GIL, so a thread woken from a barrier gets
  the GIL only at the poller's forced switch (every 5 ms): a kernel with many barriers
  took 5 s or 600 s by chance (test_attention_paths' tf32 case: 83-607 s, 5 s with
  this). Each poll of a thread first yields the GIL (`time.sleep(0)`).
- The choice itself is nbdnn/_gpu_check.py's, made when nbdnn is imported. When
  numba.cuda was imported before nbdnn (the simulator can no longer be chosen) and
  there is no GPU, `require_gpu()` raises a DeviceError that says how to get the
  simulator, instead of numba's CudaSupportError from inside a kernel launch.

Every module under nbdnn/cuda imports SIMULATOR from here (not from the package), so
that nbdnn/cuda/__init__.py imports nothing that imports it back.
"""
import numpy as np

from ..._gpu_check import DRIVER_STATUS, driver_status
from ...errors import DeviceError

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402,F401  (re-exported: nbdnn.cuda.cuda)
from numba.cuda.core import config as _config  # noqa: E402

SIMULATOR = bool(_config.ENABLE_CUDASIM)


def _yield_while_polling():
    """The simulator's poll of a block thread (BlockThread.is_alive) yields the GIL
    first (the module docstring); left as it is where numba-cuda's simulator differs."""
    import time
    from numba.cuda.simulator import kernel
    thread = getattr(kernel, "BlockThread", None)
    if thread is None or "is_alive" in vars(thread):
        return
    poll = thread.is_alive

    def is_alive(self):
        time.sleep(0)
        return poll(self)
    thread.is_alive = is_alive


if SIMULATOR:
    _yield_while_polling()
_usable = []  # [(ok, why)] of the driver, asked on the first CUDA call (not SIMULATOR)


def require_gpu(op):
    """Raise DeviceError for op when kernels can run neither on a GPU nor in the
    simulator (numba.cuda imported before nbdnn on a machine without a GPU)."""
    if SIMULATOR:
        return
    if not _usable:
        _usable.append(driver_status())
    ok, why = _usable[0]
    if not ok:
        raise DeviceError(
            f"{op}: the CUDA backend needs a GPU or numba's CUDA simulator, and there is "
            f"no GPU ({why}); numba.cuda was imported before nbdnn, too late for nbdnn to "
            "choose the simulator: set NUMBA_ENABLE_CUDASIM=1 before starting Python, or "
            "import nbdnn before numba.cuda")
