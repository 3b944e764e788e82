"""Timers for `nbdnn bench` and perf/: GPU time from CUDA events after warm-up, the
median of many runs, each after an L2-evicting memset (nbdnn/cuda/runtime/timing.py;
the package docstring says why); host time from perf_counter; a captured graph's
replay for the GPU's time alone; the device copy bandwidth every row is set against."""
import statistics
import time


def torch_or_none():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def torch_f():
    torch = torch_or_none()
    return torch.nn.functional if torch is not None else None


def _gpu():
    from ..cuda.runtime import timing
    return timing


def time_gpu(fn, *, warmup=3, reps=25, min_time=0.2, flush=True):
    """Median seconds of fn() on the GPU, timed with CUDA events; reps grows until the
    runs cover at least min_time seconds (short kernels get many samples). flush:
    write a 256 MiB buffer before each run (module docstring)."""
    return _gpu().time_events(fn, warmup=warmup, reps=reps, min_time=min_time,
                              flush_first=flush)


def time_cpu(fn, *, warmup=1, reps=5, min_time=0.2):
    """Median wall seconds of fn() on the host."""
    for _ in range(warmup):
        fn()
    samples = []
    t_end = time.perf_counter() + min_time
    while len(samples) < reps or (time.perf_counter() < t_end and len(samples) < 200):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def host_cost(fn, *, calls=2000, warmup=200):
    """Median host seconds of one call (no synchronisation: the launch cost as the
    caller's thread sees it). Synchronises every 100 calls so the queue never fills."""
    sync = _gpu().synchronize
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for i in range(calls):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
        if i % 100 == 99:
            sync()
    sync()
    return statistics.median(samples)


def host_costs(fns, *, rounds=40, calls=50, warmup=200, sync=None):
    """Host seconds of one call of each of fns, measured in alternation: each round
    times `calls` calls of every fn in turn (one timer pair a batch, then a
    synchronisation). Returns (per fn: the median over rounds; per fn after the first:
    the median over rounds of its excess over fns[0] in the same round). On a shared,
    loaded host the load drifts: an excess taken within a round cancels the drift that
    separate medians (host_cost) carry into their difference."""
    sync = sync or _gpu().synchronize
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync()
    per = [[] for _ in fns]
    for _ in range(rounds):
        for fn, samples in zip(fns, per):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t) / calls)
            sync()
    excess = [statistics.median(b - a for a, b in zip(per[0], p)) for p in per[1:]]
    return [statistics.median(p) for p in per], excess


_copy_cache = {}


def copy_bandwidth(nbytes):
    """Device-to-device copy bandwidth (bytes read + written per second) for a buffer
    of nbytes, measured now (cached per size within a run)."""
    if nbytes in _copy_cache:
        return _copy_cache[nbytes]
    n = max(1, nbytes // 4)
    torch = torch_or_none()
    if torch is not None:
        a = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
        b = torch.empty_like(a)
        t = time_gpu(lambda: b.copy_(a))
    else:
        t = time_gpu(_gpu().copy_pair(n))
    _copy_cache[nbytes] = bw = 2 * 4 * n / t
    return bw


def graph_replay(fn):
    """fn's nbdnn calls captured into an nbdnn.cuda.Graph (the capture runs them once):
    the replay, whose time is the GPU's work without the host's."""
    from ..cuda import Graph
    g = Graph()
    with g.capture():
        fn()
    return g.replay


def time_graph(fn, **kw):
    """time_gpu of fn's nbdnn calls replayed from a captured graph (kw: time_gpu's)."""
    return time_gpu(graph_replay(fn), **kw)


def graph_or_none(fn):
    from ..errors import NbdnnError
    try:
        return graph_replay(fn)
    except NbdnnError:  # e.g. a call that copies from the host: time it eagerly
        return None


