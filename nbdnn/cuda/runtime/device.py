"""Facts about the GPU in use, asked once: SM count (grid sizing: split-K, persistent
row kernels), name and compute capability (`nbdnn info`), and synchronisation for
callers above the backend that must not import numba (find_conv_algorithm's timing)."""
from .simulator import SIMULATOR, cuda

_sm = []


def sm_count():
    """Streaming multiprocessors of the current device (2 under the simulator, so grid
    arithmetic that scales with it stays tiny)."""
    if not _sm:
        _sm.append(2 if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return _sm[0]


def synchronize():
    cuda.synchronize()


def describe():
    """(name, (major, minor), SM count) of the current device; None under the simulator."""
    if SIMULATOR:
        return None
    d = cuda.get_current_device()
    name = d.name.decode() if isinstance(d.name, bytes) else d.name
    return name, tuple(d.compute_capability), d.MULTIPROCESSOR_COUNT


def numba_version():
    import numba
    return numba.__version__
