"""Eager call plans: an nbdnn call on CUDA arrays replayed from a recording of itself,
without its Python front end (validation, shape inference, algorithm choice, argument
marshalling: 10-50 us of host time for a conv, a batch norm or a pool).

Like a cuDNN plan, a plan belongs to a call's signature: the op; each array's kind,
shape, dtype, 16-byte alignment and which arrays share an address; every other
argument's type and value; and the process state a call reads (the math mode,
nbdnn/_math_mode.py). A replay must answer exactly as the full call would, refusals
included: arrays that overlap without sharing a start are never planned (the full
path checks them each time), and neither is anything the signature cannot describe. Everything an nbdnn op does on the GPU for a signature is
a fixed sequence of kernel launches, allocations of results and workspaces (by
`cuda.runtime.arrays.empty`) and cached index tables; only the addresses change between
calls. (The same premise as nbdnn.cuda.Graph, whose capture bakes in all of it.)

A signature's calls on one thread:
  1st  runs as usual (JIT, index tables, caches);
  2nd  runs as usual while its launches and allocations are recorded: every array
       argument of a launch becomes (source, byte offset, count), the source an input
       array or an allocation of the call; an address in neither is a fixed table, kept
       alive by the plan; a number made from an array's address (a TMA map's device
       address) the rule that makes it again (cuda/runtime/capture/plan_record.py); the
       result maps to inputs and allocations by identity;
  3rd  is recorded again and must give the same recording, or the signature is never
       planned (host state that changes between calls, e.g. an op reading a counter);
  4th+ replays the plan: one generated function allocates the results, writes the
       new addresses into the plan's launch table and issues all its launches from
       one @njit call (cuda.runtime.launch.LaunchTable); workspaces are not allocated: they
       sit in one buffer a thread that all its plans share.
Not planned: calls inside a Graph capture or given a stream; calls with NumPy
arrays, strided views or arguments of other types; calls whose arrays overlap at
different addresses; calls whose recording copied between host and device or had
arguments it cannot relocate.
Plans are per thread (their workspace buffer is the thread's; launches go to the
legacy default stream, in order, as the eager call's do). A plan replays the kernels its
signature chose: after changing something outside the arguments that steers dispatch
(a module-level limit, a forced variant), call `clear()`.
"""
import functools
import os
import sys

import numpy as np

from .. import arrays as _arrays, backend as _backend
from .._math_mode import get_math

capture_state = _arrays.capture_state  # thread-local: .graph (a Graph), .plan (a _Recorder)
_SCALARS = frozenset((int, float, bool, str, complex, type(None)))
_NEVER = "never"
MAX_PLANS = 4096  # signatures a thread remembers (_forget)
ENABLED = True  # False: every call runs in full (perf/suites/latency.py's comparison)


class _NoPlan(Exception):
    pass


def planned(fn):
    """fn (a public op) with eager call plans for its CUDA calls (fn itself when the
    environment sets NBDNN_PLANS=0)."""
    if os.environ.get("NBDNN_PLANS", "1") == "0":
        return fn

    @functools.wraps(fn)
    def call(*args, **kw):
        if args and _arrays.array_kinds.get(type(args[0])) == "cpu":  # NumPy: the reference
            return fn(*args, **kw)  # (~1 us less than _signature's _NoPlan)
        tls = capture_state.__dict__
        if tls.get("graph") is not None or tls.get("plan") is not None or \
                kw.get("stream") is not None or not ENABLED or tls.get("watch") is not None \
                or tls.get("forced") or _arrays.dry_launches:  # (a forced kernel
            # variant: state no key holds; a dry run launches nothing to record)
            return fn(*args, **kw)
        try:
            key, arrays = _signature(fn, args, kw)
        except _NoPlan:
            key = None
        if key is None:  # (outside the except: an op's own error chains to nothing)
            return fn(*args, **kw)
        if _backend.several_devices():  # a plan per device, for calls on the current
            # one (the full path takes other calls to their arrays' device)
            key = _on_current_device(key, arrays)
            if key is None:
                return fn(*args, **kw)
        plans = tls.get("plans")
        if plans is None:
            plans = tls["plans"] = {}
        p = plans.get(key)
        if p.__class__ is Plan:
            return p.run(arrays)
        return _learn(plans, key, p, fn, args, kw, arrays)
    call.unplanned = fn
    call.__kwdefaults__ = fn.__kwdefaults__  # call has no keyword-only parameters: inert
    return call


def _signature(fn, args, kw):
    """(hashable key, [(array, facts)]) of a call; _NoPlan when it cannot be planned.
    Flat: a scalar adds its type and value, an array its type, shape, dtype and
    address mod 16; when arrays share an address, which ones do ends the key. (The
    array branch is written out in both loops: this runs on every eager call.)"""
    arrays = []
    parts = [fn]
    for v in args:
        t = type(v)
        facts_of = _facts.get(t)
        if facts_of is not None:
            f = facts_of(v)
            if f is None:  # a strided view: its gather copy is not planned
                raise _NoPlan
            arrays.append((v, f))
            parts += (t, f[0], f[1], f[3] & 15)
        elif t in _SCALARS:
            parts += (t, v)
        else:
            _add(v, t, parts, arrays)
    if kw:
        for k, v in kw.items():
            t = type(v)
            facts_of = _facts.get(t)
            if facts_of is not None:
                f = facts_of(v)
                if f is None:
                    raise _NoPlan
                arrays.append((v, f))
                parts += (k, t, f[0], f[1], f[3] & 15)
            elif t in _SCALARS:
                parts += (k, t, v)
            else:
                parts.append(k)
                _add(v, t, parts, arrays)
    n = len(arrays)
    if n > 1:
        shared = _shared_memory(arrays)
        if shared is not None:
            parts.append(shared)
    elif not n:
        raise _NoPlan
    parts.append(get_math())  # (process state: the math mode steers matmul/conv/attention)
    return tuple(parts), arrays


def _on_current_device(key, arrays):
    """key with the current device's ordinal added, or None when an array lives on
    another device."""
    device = _backend.cuda_runtime("device")
    here = device.current()
    if any(device.of(a) != here for a, _ in arrays):
        return None
    return key + (here,)


def _shared_memory(arrays):
    """None when the arrays' bytes lie apart (the common case); when some start at one
    address (out= exactly an input), each array's first predecessor at its address,
    else -1, which then ends the key; _NoPlan when two overlap without sharing a start
    (out= a shifted view of an input): the full path refuses that call, or handles it,
    every time, so no plan learnt from arrays apart can answer it. (f: shape, dtype,
    bytes, address; ~0.3 us for two arrays, sorted spans for more.)"""
    if len(arrays) == 2:
        (_, f), (_, g) = arrays
        if f[3] < g[3] + g[2] and g[3] < f[3] + f[2]:  # (empty arrays never overlap)
            if f[3] != g[3]:
                raise _NoPlan
            return (0, 0)
        return None
    reach, shared = (0, 0), False  # (base, end) of the span reaching furthest so far
    for base, end in sorted((f[3], f[3] + f[2]) for _, f in arrays if f[2]):
        if base < reach[1]:
            if base != reach[0]:
                raise _NoPlan
            shared = True
        if end > reach[1]:
            reach = (base, end)
    if not shared:
        return None
    first = {}
    return tuple(first.setdefault(f[3], j) if f[2] else -1
                 for j, (_, f) in enumerate(arrays))


# CUDA array type -> fn(x) -> (shape, dtype, count or None, address), None if strided
# (cuda.runtime.arrays.plan_facts chooses it; filled on first sight)
_facts = {}


def _add(v, t, parts, arrays):
    """An argument the loops did not place: a tuple or list (recursively), a CUDA array
    (of a type not seen yet, or inside a tuple), a NumPy scalar; _NoPlan for anything
    else. (Scalars and tuples are told apart before arrays.kind(), which costs ~1 us
    for a type that is no array: a conv's stride, padding and dilation hold eight.)"""
    if t in _SCALARS:
        parts += (t, v)
    elif t is tuple or t is list:
        sub = [t]
        for e in v:
            te = type(e)
            if te in _SCALARS:
                sub += (te, e)
            else:
                _add(e, te, sub, arrays)
        parts.append(tuple(sub))
    elif t in _facts or (_arrays.array_kinds.get(t) or _arrays.kind(v)) == "cuda":
        facts_of = _facts.get(t)
        if facts_of is None:
            facts_of = _facts[t] = _backend.cuda_runtime("arrays").plan_facts(t)
        f = facts_of(v)
        if f is None:
            raise _NoPlan
        arrays.append((v, f))
        parts += (t, f[0], f[1], f[3] & 15)
    elif isinstance(v, np.generic):
        parts += (t, v)
    else:
        raise _NoPlan


def _learn(plans, key, state, fn, args, kw, arrays):
    """Calls 1-3 of a signature (the module's docstring)."""
    if state is None or state is _NEVER:
        if state is None:
            if len(plans) >= MAX_PLANS:
                _forget(plans)
            plans[key] = 1
        return fn(*args, **kw)
    result, recording = _backend.cuda_runtime("plan_record").record(fn, args, kw, arrays)
    if recording is None:
        plans[key] = _NEVER
    elif state == 1:
        plans[key] = recording
    else:
        plans[key] = Plan(recording) if recording == state else _NEVER
    return result


def _forget(plans):
    """Make room: drop the signatures still learning or never planned (calls whose
    scalars change every time, e.g. an advancing dropout offset, leave many), and
    everything when plans alone fill the table."""
    for k in [k for k, v in plans.items() if v.__class__ is not Plan]:
        del plans[k]
    if len(plans) >= MAX_PLANS // 2:
        plans.clear()


class Plan:
    """A signature's recording turned into one straight-line replay function."""

    __slots__ = ("run", "recording")

    def __init__(self, recording):
        self.recording = recording
        self.run = _backend.cuda_runtime("plan_record").replay_function(recording)


def plans_of_this_thread():
    """{signature: Plan | state} of the calling thread (tests, diagnostics)."""
    return capture_state.__dict__.setdefault("plans", {})


def clear():
    """Forget this thread's plans (after changing a setting that steers dispatch) and
    release its workspace buffer (what the plans keep goes with them)."""
    capture_state.__dict__.pop("plans", None)
    record = sys.modules.get("nbdnn.cuda.runtime.capture.plan_record")
    if record is not None:
        record.workspace.release()
