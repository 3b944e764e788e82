"""Kernel variants a family declares, and forcing one: `forced(family, name, names)` makes
this thread's calls of that family run the variant `name` (a test or a benchmark
measuring one path where the choice would pick another). A family reads its forced
variant with `forced_variant(family)`; `choose` runs the table's choice and raises
NotSupportedError where a forced variant cannot take a call. Eager call plans neither replay nor record while any variant is
forced (ops/_plan.py): a plan's key does not hold the choice."""
import contextlib
import dataclasses
from typing import Callable

from ...arrays import capture_state
from ...errors import NotSupportedError


@dataclasses.dataclass(frozen=True)
class Variant:
    """A way to run a call: usable(call) says whether its kernels can take it (their
    limits), wanted(call) whether it is the better choice there (measured rules; always,
    when None), run(call) launches them. A family's table lists them in order of
    preference: the first usable and wanted one runs a call; a forced one runs wherever
    it is usable."""
    name: str
    usable: Callable
    run: Callable
    doc: str
    wanted: Callable = None


@contextlib.contextmanager
def forced(family, name, names):
    """Inside (this thread): `family`'s calls run its variant `name`, one of `names`
    (a ValueError listing them otherwise)."""
    if name not in names:
        raise ValueError(f"no {family} variant {name!r}: {sorted(names)}")
    stack = capture_state.__dict__.setdefault("forced", [])
    stack.append((family, name))
    try:
        yield
    finally:
        stack.pop()


def forced_variant(family):
    """The variant forced on `family` in this thread (the innermost), or None."""
    for fam, name in reversed(capture_state.__dict__.get("forced") or ()):
        if fam == family:
            return name
    return None


@contextlib.contextmanager
def chosen():
    """Inside (this thread): `with chosen() as got:` appends (family, name) for every
    variant `choose` runs to the list got (a test's or a tool's check that a forced
    variant did run, as launch.kernel.launched() lists kernels)."""
    stack = capture_state.__dict__.setdefault("chosen", [])
    got = []
    stack.append(got)
    try:
        yield got
    finally:
        stack.remove(got)


def _record(family, variant):
    for got in capture_state.__dict__.get("chosen") or ():
        got.append((family, variant.name))
    return variant


def names(*tables):
    """Every variant name of the tables."""
    return {v.name for table in tables for v in table}


def choose(family, op, table, call):
    """The variant of `table` that runs `call`: the forced one where the table has it
    (NotSupportedError naming `op` where it cannot take the call), else the first usable
    and wanted one."""
    name = forced_variant(family)
    if name is not None:
        want = next((v for v in table if v.name == name), None)
        if want is not None:
            if not want.usable(call):
                raise NotSupportedError(f"{op}: variant {want.name!r} (forced) cannot run "
                                        "this call")
            return _record(family, want)
    for v in table:
        if v.usable(call) and (v.wanted is None or v.wanted(call)):
            return _record(family, v)
    raise AssertionError(f"{op}: no {family} variant takes this call")  # (a table's last
    # variant takes every call its front end lets through)
