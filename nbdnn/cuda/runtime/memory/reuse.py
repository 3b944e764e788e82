"""Memory reuse for a captured graph: the buffers a recorded sequence of calls
allocates share one arena wherever their lifetimes do not overlap, as PyTorch's
allocator reuses what a backward pass frees.

A Graph keeps every array its kernels touch alive (graph.py), so a captured training
step holds every activation, gradient and workspace of the step at once (ResNet-50's
bf16 step at batch 32: ~5 GB in use, where PyTorch's eager step peaks at 1.7).
What can share: an array allocated by the step whose last kernel has run. When is
that? Only a run of the same calls can say, so reuse takes two passes over calls that
allocate and launch the same way each time (a training step after its first, which
creates the optimizer's state):

1. `Trace`: the calls run eagerly under a recorder that stands where a Graph's would
   (so eager call plans stand aside and every launch reports its arrays, the same
   launches a capture would record). Every array `arrays.empty` allocates is noted in
   order with its size, kept alive for the trace (so no two share an address), and
   every launch marks the allocations its arrays and owners fall in: each allocation
   gets the interval [the launch after its allocation, its last launch].
2. `Trace.plan(keep)`: the allocations replayed in order through a best-fit allocator
   over one arena, each freed after its last launch; `keep` (the results the caller
   reads after a replay) never freed. The arena's size is the peak of that replay.
3. `Arena`: during the Graph's capture `arrays.empty` hands out views of the arena at
   the planned offsets, checking each allocation against the trace's; every launch
   is checked to touch only allocations inside their intervals; the kernels' names
   must repeat the trace's. A divergence is an NbdnnError: the calls did not repeat.

What it rests on: a launch names every array its kernel touches, in its arguments or
its `owners` (launch.Kernel.launch), the arrays read through a tensor map or a raw
pointer included (the GEMM's a and b and the convolution's x and w,
named as owners: only their maps name them); a graph keeps the same arrays alive.

The arrays a replay leaves readable are `keep`'s; every other array the calls
allocated shares its memory with others (a layer's saved activation, for one, holds
whatever the arena's later users wrote there). The arena is of the kind of array
(torch, numba, CuPy) that holds most of the traced bytes; allocations of another kind
are allocated as usual and kept, as without reuse.
"""
import bisect
import heapq

from .arrays import allocate, ptr, span
from ....errors import NbdnnError

ALIGN = 256  # bytes: an arena offset's alignment (TMA wants 16, vector loads 16)


def _nbytes(shape, dtype):
    import numpy as np
    n = 1
    for s in shape:
        n *= int(s)
    return n * (2 if str(dtype) == "bfloat16" else np.dtype(dtype).itemsize)


def _kind(like):
    return (type(like).__module__ or "").partition(".")[0]


class Trace:
    """The allocations and launches of one eager run of the calls (module docstring,
    step 1). Set as this thread's recording while the calls run (`with trace:`)."""

    def __init__(self):
        self.entries = []   # [shape, dtype, kind, nbytes, first launch, last launch]
        self.arrays = []    # the allocations themselves, alive until the plan is made
        self.names = []     # the launched kernels' names, in order
        self._starts, self._order = [], []  # entries' addresses sorted, their indices
        self.launches = 0

    @property
    def nbytes(self):
        """What the traced run allocated, each allocation rounded up to ALIGN bytes."""
        return sum(-(-e[3] // ALIGN) * ALIGN for e in self.entries)

    # -- the recorder interface (launch.Kernel.launch calls it, as it calls a Graph's) --
    def record(self, launcher, grid, block, shmem, params):
        self.names.append(launcher.name)

    def record_simulated(self, dispatcher, grid, block, shmem, args):
        self.names.append(dispatcher.py_func.__name__)

    def record_step(self, fn):
        pass  # (the simulator's host steps: a trace replays nothing)

    def keep(self, args, owners):
        """A launch ran over these arrays (those given as (pointer, count) among owners)."""
        for a in args:
            if hasattr(a, "shape"):
                self._touch(a)
        for a in owners:
            if hasattr(a, "shape"):
                self._touch(a)
        self.launches += 1

    def _touch(self, a):
        lo, hi = span(a)
        if hi <= lo:
            return
        i = max(bisect.bisect_right(self._starts, lo) - 1, 0)  # (the traced allocations
        while i < len(self._starts) and self._starts[i] < hi:  # are disjoint: all alive)
            e = self.entries[self._order[i]]
            if self._starts[i] + e[3] > lo:  # overlaps
                e[5] = self.launches
            i += 1

    # -- the allocator hook (arrays.empty) --
    def allocate(self, like, shape, dtype):
        a = allocate(like, shape, dtype)
        nbytes = _nbytes(shape, dtype)
        self.entries.append([tuple(shape), str(dtype), _kind(like), nbytes, self.launches,
                             self.launches - 1])
        self.arrays.append(a)
        if nbytes:
            p = ptr(a)
            j = bisect.bisect_right(self._starts, p)
            self._starts.insert(j, p)
            self._order.insert(j, len(self.entries) - 1)
        return a

    def __enter__(self):
        from ..launch.kernel import capture_state
        if capture_state.__dict__.get("graph") is not None:
            raise NbdnnError("reuse.Trace: this thread is recording a graph already")
        capture_state.graph, capture_state.alloc = self, self.allocate
        return self

    def __exit__(self, *exc):
        from ..launch.kernel import capture_state
        capture_state.graph = capture_state.alloc = None

    def plan(self, keep=()):
        """The Arena for a capture of the same calls; `keep`: the arrays the caller
        reads after a replay (results), never shared. Frees the traced arrays."""
        kept = [span(a) for a in keep if hasattr(a, "shape")]
        by_kind = {}  # the arena's kind: the one holding the most traced bytes
        for e in self.entries:
            by_kind[e[2]] = by_kind.get(e[2], 0) + e[3]
        kind = max(by_kind, key=by_kind.get) if by_kind else None
        live = []  # (last launch, offset, size) of placed entries, a heap by last launch
        free, top, offsets = [], 0, []  # free blocks [(offset, size)] by offset; arena end
        lasts = [e[5] for e in self.entries]  # (kept ones: never freed)
        for i, (shape, dtype, k, nbytes, first, last) in enumerate(self.entries):
            if not nbytes or k != kind:
                offsets.append(None)
                continue
            p = ptr(self.arrays[i])
            if any(lo < p + nbytes and p < hi for lo, hi in kept):
                last = float("inf")
            while live and live[0][0] < first:  # their last launch ran before this one's
                _, off, size = heapq.heappop(live)
                _release(free, off, size)
            size = -(-nbytes // ALIGN) * ALIGN
            fits = [(s, o) for o, s in free if s >= size]
            if fits:
                s, o = min(fits)
                free.remove((o, s))
                if s > size:
                    bisect.insort(free, (o + size, s - size))
            else:
                o, top = top, top + size
            offsets.append(o)
            lasts[i] = last
            heapq.heappush(live, (last, o, size))
        placed = [(e[0], e[1], e[2], e[4], last, o)
                  for e, o, last in zip(self.entries, offsets, lasts)]
        self.arrays = []
        return Arena(placed, top, list(self.names))


def _release(free, off, size):
    """Return a block to the free list (sorted by offset), merged with its neighbours."""
    j = bisect.bisect_left(free, (off, 0))
    if j < len(free) and free[j][0] == off + size:
        size += free.pop(j)[1]
    if j > 0 and free[j - 1][0] + free[j - 1][1] == off:
        o, s = free.pop(j - 1)
        off, size = o, s + size
    bisect.insort(free, (off, size))


class Arena:
    """One allocation holding the planned buffers (Trace.plan), handed out in the
    traced order during a capture, each launch checked against the plan."""

    def __init__(self, placed, nbytes, names):
        self.placed, self.nbytes, self.names = placed, nbytes, names
        self.buffer, self._next, self.launches = None, 0, 0
        self._views = []  # (start, end, first, last) of the handed-out arena views
        self._ids = {}    # id(view) -> (view, first, last)
        self._by_base = {}  # start -> [(end, first, last)]: a reshaped view's quick check

    def allocate(self, like, shape, dtype):
        if self._next >= len(self.placed):
            raise NbdnnError("graph capture with buffer reuse: the calls allocated more "
                             "than their traced run did (they do not repeat; reuse=False)")
        want_shape, want_dtype, kind, first, last, off = self.placed[self._next]
        self._next += 1
        if (tuple(int(s) for s in shape), str(dtype)) != (want_shape, want_dtype):
            raise NbdnnError(f"graph capture with buffer reuse: allocation {self._next - 1} "
                             f"is {tuple(shape)} {dtype}, the traced run's was {want_shape} "
                             f"{want_dtype} (the calls do not repeat; reuse=False)")
        if off is None or _kind(like) != kind:
            return allocate(like, shape, dtype)
        if self.buffer is None:
            self.buffer = allocate(like, (max(self.nbytes, ALIGN),), "uint8")
        nbytes = _nbytes(shape, dtype)
        view = _view(self.buffer, off, nbytes, shape, dtype)
        base = ptr(self.buffer) + off
        self._views.append((base, base + nbytes, first, last))
        self._by_base.setdefault(base, []).append((base + nbytes, first, last))
        self._ids[id(view)] = (view, first, last)  # (the view held: its id stays its own)
        return view

    # -- the check, from the capturing Graph's keep --
    def check(self, args, owners):
        """A launch's arrays: an arena view by identity inside its interval; any other
        array in the arena (a reshape of one) inside the interval of a view it lies in
        (two buffers that share memory have the same range: identity tells them apart
        where it can)."""
        n = self.launches
        for a in list(args) + list(owners):
            if not hasattr(a, "shape"):
                continue
            own = self._ids.get(id(a))
            if own is not None:
                if not own[1] <= n <= own[2]:
                    self._outside()
                continue
            lo, hi = span(a)
            if hi > lo and not self._inside(lo, hi):
                self._outside()
        self.launches += 1

    def _outside(self):
        raise NbdnnError(f"graph capture with buffer reuse: launch {self.launches} reads an "
                         "arena buffer outside its traced lifetime (the calls do not "
                         "repeat; reuse=False)")

    def _inside(self, lo, hi):
        if self.buffer is None:
            return True
        b = ptr(self.buffer)
        if hi <= b or lo >= b + self.nbytes:
            return True  # not the arena's
        n = self.launches
        if any(hi <= e and f <= n <= last for e, f, last in self._by_base.get(lo, ())):
            return True
        return any(s <= lo and hi <= e and f <= n <= last for s, e, f, last in self._views)

    def finish(self, names):
        """After the capture: every traced allocation made, the same kernels."""
        if self._next != len(self.placed) or list(names) != self.names:
            raise NbdnnError("graph capture with buffer reuse: the captured calls differ "
                             "from the traced run's (reuse=False)")


def _view(buf, off, nbytes, shape, dtype):
    """shape-dtype view of nbytes of the uint8 arena buffer at byte offset off."""
    part = buf[off:off + nbytes]
    if _kind(buf) == "torch":
        from .arrays import TO_TORCH, torch_dtype
        dt = TO_TORCH.get(dtype) or torch_dtype(dtype)
        return part.view(dt).view(tuple(shape))
    import numpy as np
    return part.view(np.dtype(str(dtype))).reshape(tuple(shape))
