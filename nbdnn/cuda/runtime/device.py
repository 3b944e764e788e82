"""Facts about the GPUs in use and which one a call runs on.

- SM count (grid sizing: split-K, persistent row kernels), name and compute capability
  (`nbdnn info`), synchronisation for callers above the backend that must not import
  numba (find_conv_algorithm's timing).
- Several devices: `count()` visible devices (asked once; 1 under the simulator),
  `current()` the device whose context is current on this thread, `of(x)` the device
  holding a CUDA array, `on(i)` a block whose launches and allocations go to device i
  (its primary context pushed, the caller's current device restored after). With one
  device every one of these is a constant: the single-GPU hot paths ask `count()` once
  and do nothing more. Kernels load per context (numba's dispatchers keep a module per
  context); nbdnn's cached device tables are keyed by `current()` (`key()`).
"""
import contextlib

from .simulator import SIMULATOR, cuda

_sm = {}  # device ordinal -> SM count
_count = []


def count():
    """Visible CUDA devices (1 under the simulator), asked once."""
    if not _count:
        _count.append(1 if SIMULATOR else len(cuda.gpus))
    return _count[0]


def current():
    """The ordinal of the device current on this thread (0 when there is one)."""
    if count() == 1:
        return 0
    return cuda.get_current_device().id


def key():
    """What a cache of device arrays adds to its key: the current device's ordinal
    (None with one device, so single-GPU keys stay as they were)."""
    return None if count() == 1 else current()


@contextlib.contextmanager
def on(ordinal):
    """Within: device `ordinal`'s primary context is current (kernel launches, numba's
    allocations, the legacy default stream); after: the caller's current device again."""
    if ordinal is None or count() == 1 or ordinal == current():
        yield
        return
    with cuda.gpus[ordinal]:
        yield


_of = {}  # array type -> fn(x) -> device ordinal


def of(x):
    """The ordinal of the device that holds CUDA array x."""
    t = type(x)
    f = _of.get(t)
    if f is None:
        f = _of[t] = _ordinal_of(t)
    return f(x)


def _ordinal_of(t):
    mod = t.__module__ or ""
    if SIMULATOR or count() == 1:
        return lambda x: 0
    if mod.startswith("torch"):
        return lambda x: x.get_device()
    if mod.startswith("cupy"):
        return lambda x: x.device.id
    return _pointer_ordinal  # numba device arrays, any __cuda_array_interface__ object


def _pointer_ordinal(x):
    """The device of x's memory, asked of the driver (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL):
    numba's arrays record the context current when they were made, which for a wrapped
    foreign pointer need not be the one holding it."""
    from cuda.bindings import driver as cu
    from .memory.arrays import ptr
    err, ordinal = cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr(x))
    if err != cu.CUresult.CUDA_SUCCESS:
        return current()  # (not device memory the driver knows: the caller's device)
    return int(ordinal)


def sm_count():
    """Streaming multiprocessors of the current device (2 under the simulator, so grid
    arithmetic that scales with it stays tiny)."""
    d = current()
    n = _sm.get(d)
    if n is None:
        n = _sm[d] = 2 if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT
    return n


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
