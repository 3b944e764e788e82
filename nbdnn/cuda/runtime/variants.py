"""Kernel variants a family declares, and forcing one: `forced(family, name, names)` makes
this thread's calls of that family run the variant `name` (a test or a benchmark
measuring one path where the choice would pick another). A family reads its forced
variant with `forced_variant(family)` and raises NotSupportedError where that variant
cannot take a call. Eager call plans neither replay nor record while any variant is
forced (ops/_plan.py): a plan's key does not hold the choice."""
import contextlib
import dataclasses
from typing import Callable

from ...arrays import capture_state


@dataclasses.dataclass(frozen=True)
class Variant:
    """A way to run a call: usable(call) says whether its kernels take it (their limits
    and where it is the better choice), run(call) launches them. A family's table lists
    them in order of preference: the first usable one runs a call."""
    name: str
    usable: Callable
    run: Callable
    doc: str


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
