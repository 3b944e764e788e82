"""GPU timing primitives for nbdnn.bench and perf/ (numba's events and
synchronisation; the L2-evicting memset before each timed run)."""
import statistics
import time

import numpy as np

from .simulator import SIMULATOR, cuda

FLUSH_BYTES = 256 << 20
_flush_state = []


def flush():
    """Enqueue a 256 MiB memset on the legacy default stream (~80 us on an H200)."""
    if not _flush_state:
        if SIMULATOR:
            _flush_state.append(None)
        else:
            from cuda.bindings import driver
            buf = cuda.device_array(FLUSH_BYTES // 4, dtype=np.uint32)
            ptr = int(buf.gpu_data.device_pointer)
            _flush_state.append(lambda: driver.cuMemsetD32Async(ptr, 0, FLUSH_BYTES // 4, 0))
            _flush_state.append(buf)  # keep it alive
    if _flush_state[0] is not None:
        _flush_state[0]()


def synchronize():
    cuda.synchronize()


def time_events(fn, *, warmup, reps, min_time, flush_first):
    """Median seconds of fn() between two CUDA events; reps grows until the runs cover
    at least min_time seconds (short kernels get many samples)."""
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    samples = []
    t_end = time.perf_counter() + min_time
    while len(samples) < reps or (time.perf_counter() < t_end and len(samples) < 2000):
        if flush_first:
            flush()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(cuda.event_elapsed_time(start, stop) / 1e3)
    return statistics.median(samples)


def copy_pair(n):
    """Two float32 device arrays of n elements and a function copying one to the other."""
    a = cuda.to_device(np.random.rand(n).astype(np.float32))
    b = cuda.device_array_like(a)
    return lambda: b.copy_to_device(a)
