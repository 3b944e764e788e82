"""Recording an eager call for its plan, and the plan's generated replay function
(the why and when: nbdnn/ops/_plan.py).

A recording is the call's allocations (like which source, shape, dtype), its launches
(kernel, signature, grid, block, shared bytes, and per argument: a constant, an input
or allocation with a byte offset and an element count, or a fixed table) and how its
result maps to inputs and allocations. Two recordings of one signature compare equal
when the call did the same thing at different addresses.
"""
import math

import numpy as np

from . import SIMULATOR
from ._arrays import _allocate, _recording, dtype_of, flat, ptr, ptr_size


class _Recorder:
    """Kernel.launch, _arrays.empty and the host copies report here while a call is
    recorded (_recording.plan)."""

    def __init__(self, arrays):
        self.sources = [(x, lane[3], lane[2] * lane[1].itemsize, lane[1])
                        for x, lane in arrays]  # (array, address, bytes, dtype)
        self.n_inputs = len(arrays)
        self.objects = [x for x, _ in arrays]
        self.allocs, self.launches, self.fixed = [], [], {}
        # inputs that overlap without sharing a base (out= a shifted view of x) would
        # make an address's source ambiguous; such calls run in full
        self.ok, reach = True, (0, 0)  # (base, end) of the span reaching furthest
        for b, e in sorted((b, b + n) for _, b, n, _ in self.sources if n):
            if b < reach[1] and b != reach[0]:
                self.ok = False
            if e > reach[1]:
                reach = (b, e)

    def impure(self):
        """A host <-> device copy: a replay would not repeat it."""
        self.ok = False

    def alloc(self, like, shape, dtype, result):
        src = self._object(like)
        if src is None:
            self.ok = False
            return
        p, n = ptr_size(result)
        dt = np.dtype(dtype)
        self.allocs.append((src, tuple(shape), dt))
        self.sources.append((result, p, n * dt.itemsize, dt))
        self.objects.append(result)

    def launch(self, kernel, sig, grid, block, shmem, args, owners):
        if not self.ok:
            return
        t = tuple(self._arg(a) for a in args)
        self.launches.append((kernel, sig, grid, block, shmem, t))
        for o in owners:  # those behind fixed pointers (tables), not the call's arrays
            if o is not None and self._source(ptr_size(o)[0]) is None:
                self.fixed.setdefault(id(o), o)

    def _object(self, x):
        """("i", j) / ("a", j) for an input or allocation (by identity, else an input of
        the same type, which is what `empty` allocates like); None otherwise."""
        for j, o in enumerate(self.objects):
            if o is x:
                return self._name(j)
        for j, o in enumerate(self.objects[:self.n_inputs]):
            if type(o) is type(x):
                return self._name(j)
        return None

    def _name(self, j):
        return ("i", j) if j < self.n_inputs else ("a", j - self.n_inputs)

    def _arg(self, a):
        t = type(a)
        if t is tuple:
            p, n = a
            obj = None
        elif hasattr(a, "shape"):
            (p, n), obj = ptr_size(a), a
        else:
            if t is int and a > 65536 and self._source(a) is not None:
                self.ok = False  # an address passed as a number: not relocatable
            return "c", t, a
        j = self._source(p) if p else None
        if j is None:  # a cached table (or an empty array): fixed, kept alive
            if obj is None:
                return "f", p, n
            self.fixed.setdefault(id(obj), obj)
            return ("o", id(obj)) if SIMULATOR else ("f", p, n)
        x, base, _, dt = self.sources[j]
        off = p - base
        if SIMULATOR and (obj is None or dtype_of(obj) != dt or off % dt.itemsize):
            self.ok = False  # the simulator passes views: same dtype, whole elements
        return self._name(j) + (off, n)

    def _source(self, p):
        for j, (_, base, nbytes, _) in enumerate(self.sources):
            if base <= p < base + nbytes:
                return j
        return None

    def result(self, r):
        if r is None:
            return None
        if type(r) is tuple:
            return (tuple,) + tuple(self.result(e) for e in r)
        for j, o in enumerate(self.objects):
            if o is r:
                return self._name(j)
        self.ok = False
        return None


KEEP_WORKSPACE_BYTES = 1 << 20  # a plan keeps its call's workspaces up to this size


class Recording:
    """What a recorded call did; equal when two calls did the same. `kept`: the call's
    workspaces (allocations it did not return), when they total at most
    KEEP_WORKSPACE_BYTES: the plan's replays reuse them instead of allocating (~4.5 us
    each on the H200's host). Safe because replays, like the recorded call, launch on
    the legacy default stream, in order, and plans are per thread."""

    __slots__ = ("allocs", "launches", "result", "fixed", "kept")

    def __init__(self, rec, result):
        self.allocs, self.launches = tuple(rec.allocs), tuple(rec.launches)
        self.result, self.fixed = result, rec.fixed
        returned = {j for kind, j in _names_in(result) if kind == "a"}
        work = [m for m in range(len(self.allocs)) if m not in returned]
        size = sum(math.prod(shape) * dt.itemsize for _, shape, dt in
                   (self.allocs[m] for m in work))
        self.kept = {m: rec.objects[rec.n_inputs + m] for m in work} \
            if size <= KEEP_WORKSPACE_BYTES else {}

    def __eq__(self, other):
        return isinstance(other, Recording) and (self.allocs, self.launches, self.result) \
            == (other.allocs, other.launches, other.result)

    __hash__ = None


def record(fn, args, kw, arrays):
    """Run fn(*args, **kw) recording it: (result, Recording or None if unplannable)."""
    rec = _Recorder(arrays)
    _recording.plan = rec
    try:
        r = fn(*args, **kw)
    finally:
        _recording.plan = None
    res = rec.result(r)
    return r, (Recording(rec, res) if rec.ok else None)


def replay_function(recording):
    """A generated function run(arrays) -> result that does what the recording did, at
    the addresses of `arrays` ([(array, lane)], as ops._plan builds them)."""
    ns = {"empty": _allocate, "ptr": ptr, "_view": _view}  # (no recording in a replay)
    lines = ["def run(ins):"]
    inputs = sorted({a[1] for _, _, _, _, _, args in recording.launches for a in args
                     if a[0] == "i"} | {s[1] for s, _, _ in recording.allocs if s[0] == "i"}
                    | set(_inputs_of(recording.result)))
    for j in inputs:
        lines.append(f"    x{j}, l{j} = ins[{j}]")
        lines.append(f"    i{j} = l{j}[3]")
    for m, (src, shape, dt) in enumerate(recording.allocs):
        if m in recording.kept:
            ns[f"W{m}"] = w = recording.kept[m]
            lines.append(f"    a{m} = W{m}")
            if not SIMULATOR:
                lines.append(f"    q{m} = {ptr(w)}")
            continue
        ns[f"D{m}"] = dt
        lines.append(f"    a{m} = empty({_obj(src)}, {shape!r}, D{m})")
        if not SIMULATOR:
            lines.append(f"    q{m} = ptr(a{m})")
    for k, (kernel, sig, grid, block, shmem, args) in enumerate(recording.launches):
        ns[f"K{k}"], ns[f"S{k}"], ns[f"G{k}"], ns[f"B{k}"] = kernel, sig, grid, block
        vals = [_value(a, f"C{k}_{i}", ns, recording.fixed) for i, a in enumerate(args)]
        lines.append(f"    K{k}.launch(S{k}, G{k}, B{k}, 0, {', '.join(vals)}, shmem={shmem})")
    lines.append(f"    return {_result(recording.result)}")
    exec(compile("\n".join(lines) + "\n", "<nbdnn plan>", "exec"), ns)
    return ns["run"]


def _obj(src):
    return f"x{src[1]}" if src[0] == "i" else f"a{src[1]}"


def _value(a, name, ns, fixed):
    kind = a[0]
    if kind == "c":
        ns[name] = a[2]
        return name
    if kind == "f":
        return f"({a[1]}, {a[2]})"
    if kind == "o":
        ns[name] = fixed[a[1]]
        return name
    base = f"i{a[1]}" if kind == "i" else f"q{a[1]}"
    if SIMULATOR:
        return f"_view({_obj(a)}, {a[2]}, {a[3]})"
    return f"({base} + {a[2]}, {a[3]})"


def _names_in(r):
    """The ("i", j) / ("a", j) names a result template holds."""
    if r is None:
        return []
    if r[0] is tuple:
        return [n for e in r[1:] for n in _names_in(e)]
    return [r]


def _inputs_of(r):
    return [j for kind, j in _names_in(r) if kind == "i"]


def _result(r):
    if r is None:
        return "None"
    if r[0] is tuple:
        return "(" + "".join(_result(e) + ", " for e in r[1:]) + ")"
    return _obj(r)


def _view(x, off_bytes, n):
    """Simulator: the n elements of x from byte offset off_bytes, as a 1-D array."""
    v = flat(x)
    i = off_bytes // v.dtype.itemsize
    return v if i == 0 and n == v.size else v[i:i + n]
