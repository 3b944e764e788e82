"""Recording an eager call for its plan, and the plan's generated replay function
(the why and when: nbdnn/ops/_plan.py).

A recording is the call's allocations (like which source, shape, dtype), its launches
(kernel, signature, grid, block, shared bytes, and per argument: a constant, an input
or allocation with a byte offset and an element count, a fixed table, or a number
derived from an input's or allocation's address) and how its result maps to inputs
and allocations. Two recordings of one signature compare equal when the call did the
same thing at different addresses.

Derived numbers: a TMA tensor map holds its tensor's address, and a kernel takes the
map's device address as a plain integer. The code that makes one says so while a call
is recorded (`derive(value, address, rule)`, value == rule[0](address, *rule[1:])); a
replay calls the rule at the new address (tensormap.py: ~1 us, its caches). Before this,
such calls were refused plans (the tensor-core convolution, ~20-200 us of host
time a call more), or, where nothing refused them (the flash attention kernels), a
plan could replay the recorded maps at new addresses.
"""
import math
import threading

import numpy as np

from ..simulator import SIMULATOR
from ..memory.arrays import allocate, capture_state, dtype_of, facts, flat, ptr, ptr_size
from ..launch.codegen import compile_source
from ..device import key as device_key


class _Recorder:
    """Kernel.launch, _arrays.empty and the host copies report here while a call is
    recorded (capture_state.plan)."""

    def __init__(self, arrays):
        self.sources = []  # (array, address, bytes, NumPy dtype)
        for x, _ in arrays:
            _, dt, n, p = facts(x)
            self.sources.append((x, p, n * dt.itemsize, dt))
        self.n_inputs = len(arrays)
        self.objects = [x for x, _ in arrays]
        self.allocs, self.launches, self.fixed = [], [], {}
        self.derived = {}  # value -> (address, rule): derive()
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

    def derive(self, value, address, rule):
        """The integer `value` passed to a launch is rule[0](address, *rule[1:]) for the
        device address `address` (rule: hashable, compared between recordings)."""
        self.derived[value] = (address, rule)

    def alloc(self, like, shape, dtype, result):
        src = self._object(like)
        if src is None:
            self.ok = False
            return
        p, n = ptr_size(result)
        dt = np.dtype(dtype)
        source = self.objects[src[1] + (0 if src[0] == "i" else self.n_inputs)]
        # a torch tensor of the same dtype: x.new_empty(shape) parses one argument
        same = type(source).__module__.startswith("torch") and dtype_of(source) == dt
        self.allocs.append((src, tuple(shape), dt, same))
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
            if t is int and a in self.derived:
                return self._derived(a)
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

    def _derived(self, value):
        """("m", source name, byte offset, rule) of a derived number (a map over a fixed
        table is not relocated: refused)."""
        address, rule = self.derived[value]
        j = self._source(address)
        if j is None:
            self.ok = False
            return "c", int, value
        return "m", self._name(j), address - self.sources[j][1], rule

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


class Recording:
    """What a recorded call did; equal when two calls did the same. `workspaces`: the
    call's allocations that it did not return, {index: the recorded array}. A replay
    does not allocate them (~2-4 us each on the H200's host): on the GPU they live in
    the thread's plan workspace (_Workspace), under the simulator the plan keeps the
    recorded arrays. Safe because replays, like the recorded call, launch on the
    legacy default stream, in order, and plans are per thread."""

    __slots__ = ("allocs", "launches", "result", "fixed", "workspaces")

    def __init__(self, rec, result):
        self.allocs, self.launches = tuple(rec.allocs), tuple(rec.launches)
        self.result, self.fixed = result, rec.fixed
        returned = {j for kind, j in _names_in(result) if kind == "a"}
        self.workspaces = {m: rec.objects[rec.n_inputs + m] for m in range(len(self.allocs))
                           if m not in returned}

    def __eq__(self, other):
        return isinstance(other, Recording) and (self.allocs, self.launches, self.result) \
            == (other.allocs, other.launches, other.result)

    __hash__ = None


def record(fn, args, kw, arrays):
    """Run fn(*args, **kw) recording it: (result, Recording or None if unplannable)."""
    rec = _Recorder(arrays)
    capture_state.plan = rec
    try:
        r = fn(*args, **kw)
    finally:
        capture_state.plan = None
    res = rec.result(r)
    return r, (Recording(rec, res) if rec.ok else None)


class _Workspace(threading.local):
    """One device buffer a thread (and device) for every plan's workspaces. A plan's
    replay runs its kernels on the device's legacy default stream after every earlier
    call's, so all plans of a thread on one device can place their workspaces at the
    same addresses. A plan bakes the buffer's address in and keeps the buffer; a larger
    need gets a new buffer, at least twice the size (what old plans keep stays under the
    newest's size). clear() drops them."""

    def __init__(self):
        self.release()

    def release(self):
        self.buffers = {}  # device key (device.key()) -> (buffer, bytes)

    @property
    def nbytes(self):
        """The current device's buffer size (0: none yet)."""
        return self.buffers.get(device_key(), (None, 0))[1]

    def get(self, like, nbytes):
        d = device_key()
        buffer, have = self.buffers.get(d, (None, 0))
        if nbytes > have or buffer is None:  # (a call whose workspaces are all empty,
            # a zero-row norm's, still gets a buffer: its address is baked in)
            have = max(nbytes, 2 * have, _ALIGN)
            buffer = allocate(like, (have,), np.uint8)
            self.buffers[d] = buffer, have
        return buffer


workspace = _Workspace()
_ALIGN = 256  # bytes between workspaces in the buffer (cudaMalloc's alignment)


def replay_function(recording):
    """A generated function run(arrays) -> result that does what the recording did, at
    the addresses of `arrays` ([(array, facts)], as ops._plan builds them): it allocates
    the call's results, writes the new addresses into the plan's LaunchTable and
    issues all its launches in one @njit call (the simulator: Kernel.launch each)."""
    ns = {"empty": allocate, "ptr": ptr, "_view": _view}  # (no recording in a replay)
    lines = ["def run(ins):"]
    inputs = sorted({a[1] for _, _, _, _, _, args in recording.launches for a in args
                     if a[0] == "i"} | {s[1] for s, _, _, _ in recording.allocs if s[0] == "i"}
                    | {a[1][1] for _, _, _, _, _, args in recording.launches for a in args
                       if a[0] == "m" and a[1][0] == "i"}
                    | set(_inputs_of(recording.result)))
    for j in inputs:
        lines.append(f"    x{j}, f{j} = ins[{j}]")
    if SIMULATOR:
        _simulated_launches(recording, ns, lines)
    else:
        _table_launches(recording, ns, lines)
    lines.append(f"    return {_result(recording.result)}")
    return compile_source("run", "\n".join(lines) + "\n", ns, about={
        "what": "an eager call plan's replay (ops/_plan.py)"}, transient=True)


def _allocations(recording, ns, lines, address):
    """Lines that allocate the call's results (its workspaces: W{m}, set by the
    caller); address(m) -> a line recording allocation m's address, or None."""
    for m, (src, shape, dt, same) in enumerate(recording.allocs):
        if m in recording.workspaces:
            lines.append(f"    a{m} = W{m}")
            continue
        if same and not SIMULATOR and not (src[0] == "a" and src[1] in recording.workspaces):
            # (like a workspace: on the GPU that is the thread's uint8 buffer)
            lines.append(f"    a{m} = {_obj(src)}.new_empty({shape!r})")
        else:
            ns[f"D{m}"] = dt
            lines.append(f"    a{m} = empty({_obj(src)}, {shape!r}, D{m})")
        line = address(m)
        if line:
            lines.append(line)


def _table_launches(recording, ns, lines):
    """The launches as one LaunchTable: each input or allocation a launch reads gets a
    base slot, which the replay fills (a workspace's here, once: its place in the
    thread's workspace buffer)."""
    from ..launch.kernel import LaunchTable, Patch
    bases = {}
    for _, _, _, _, _, args in recording.launches:
        for a in args:
            if a[0] in ("i", "a"):
                bases.setdefault(a[:2], len(bases))
            elif a[0] == "m":  # (a derived number's source: its address in M too)
                bases.setdefault(a[1], len(bases))
    launches = [(kernel, sig, grid, block, shmem,
                 [Patch(bases[a[:2]], a[2], a[3]) if a[0] in ("i", "a") else
                  (a[1], a[2]) if a[0] == "f" else 0 if a[0] == "m" else a[2] for a in args])
                for kernel, sig, grid, block, shmem, args in recording.launches]
    table = LaunchTable(launches, len(bases))
    ns["M"], ns["T"], ns["F"] = table.m, _launch_table(), table.failed
    b0 = table.bases
    for (kind, j), b in bases.items():
        if kind == "i":
            lines.append(f"    M[{b0 + b}] = f{j}[3]")
    if recording.workspaces:
        offsets, end = _packed(recording)
        buf = workspace.get(next(iter(recording.workspaces.values())), end)
        address = ptr(buf)
        for m in offsets:
            ns[f"W{m}"] = buf  # (the plan keeps it; a later allocation may be like it)
            if ("a", m) in bases:
                table.m[b0 + bases["a", m]] = address + offsets[m]
        recording.workspaces = dict.fromkeys(offsets)  # not the recorded arrays

    def address(m):  # (a torch tensor's data_ptr() directly)
        if ("a", m) not in bases:
            return None
        get = f"a{m}.data_ptr()" if recording.allocs[m][3] else f"ptr(a{m})"
        return f"    M[{b0 + bases['a', m]}] = {get}"
    _allocations(recording, ns, lines, address)
    for k, (kernel, sig, _, _, _, args) in enumerate(recording.launches):
        for i, a in enumerate(args):
            if a[0] == "m":  # the parameter's slot: its launch's start + 10 (the record)
                slot = int(table.m[table.m[3] + k]) + 10 + kernel.compile(sig).param_slots[i]
                ns[f"R{k}_{i}"], ns[f"A{k}_{i}"] = a[3][0], a[3][1:]
                lines.append(f"    M[{slot}] = R{k}_{i}(M[{b0 + bases[a[1]]}] + {a[2]}, "
                             f"*A{k}_{i})")
    lines.append("    e = T(M)")
    lines.append("    if e:")
    lines.append("        F(e)")


def _packed(recording):
    """({workspace: byte offset}, bytes): the call's workspaces in one buffer, first fit;
    two whose uses (first to last launch naming them, in launch order: replays run on
    one stream) do not overlap may share bytes (a call that chunks its work allocates
    per chunk what the next chunk can reuse: the float32 attention backward in
    3xtf32 asked 43 GB side by side). One that no launch names keeps its own bytes."""
    span, whole = {}, (0, len(recording.launches))
    for i, (*_, args) in enumerate(recording.launches):
        for a in args:
            if a[0] == "a" and a[1] in recording.workspaces:
                lo, hi = span.get(a[1], (i, i))
                span[a[1]] = (min(lo, i), max(hi, i))
    placed, offsets, end = [], {}, 0
    for m in recording.workspaces:
        _, shape, dt, _ = recording.allocs[m]
        size = -(-math.prod(shape) * dt.itemsize // _ALIGN) * _ALIGN
        lo, hi = span.get(m, whole)
        at = 0
        for o, n, first, last in sorted(placed):  # (by offset: `at` only rises)
            if first <= hi and lo <= last and o < at + size and at < o + n:
                at = o + n
        placed.append((at, size, lo, hi))
        offsets[m], end = at, max(end, at + size)
    return offsets, end


def _launch_table():
    from ..launch import kernel as _launch
    _launch.bind_driver()
    return _launch.launch_table


def _simulated_launches(recording, ns, lines):
    for m, w in recording.workspaces.items():
        ns[f"W{m}"] = w  # the recorded arrays: the simulator's views keep their dtype
    _allocations(recording, ns, lines, lambda m: None)
    for k, (kernel, sig, grid, block, shmem, args) in enumerate(recording.launches):
        ns[f"K{k}"], ns[f"S{k}"], ns[f"G{k}"], ns[f"B{k}"] = kernel, sig, grid, block
        vals = [_value(a, f"C{k}_{i}", ns, recording.fixed) for i, a in enumerate(args)]
        lines.append(f"    K{k}.launch(S{k}, G{k}, B{k}, 0, {', '.join(vals)}, shmem={shmem})")


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
    if kind == "m":
        ns[name], ns[name + "a"] = a[3][0], a[3][1:]
        return f"{name}(ptr({_obj(a[1])}) + {a[2]}, *{name}a)"
    return f"_view({_obj(a)}, {a[2]}, {a[3]})"


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
