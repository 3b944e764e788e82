"""The op registry: every public op, recorded where it is defined.

    @op("norm", backward="layer_norm_backward")
    def layer_norm(x, scale=None, bias=None, *, ...): ...

A record says the op's family (the module name shared by ops/, cpu/, cuda/ and
testing/specs/), whether its eager CUDA calls replay per-signature plans (ops/_plan.py),
and the name of its backward. Everything that lists ops reads this table and nothing
else: nbdnn's exports and their plan wrapping, `nbdnn check` and the cross-check tests
(testing/specs/<family>.py), `nbdnn bench`, the PTX test and the backend-completeness
test. The families' modules are found by walking nbdnn/ops (`load()`), so adding a family
is adding its module."""
import dataclasses
import importlib
import pkgutil
from typing import Callable, Optional

from ..errors import BadParamError


@dataclasses.dataclass(frozen=True)
class OpRecord:
    name: str
    fn: Callable               # the front end as defined (validates, then dispatches)
    family: str                # ops/<family>.py, cpu/<family>.py, cuda/<family>
    planned: bool = True       # eager CUDA calls replay plans (not: find_conv_algorithm)
    backward: tuple = ()       # names of the ops that compute its gradients
    dispatches: tuple = ()     # the backend functions it calls: cpu/ and cuda/<family>.<name>
    doc: Optional[str] = None  # one line for `nbdnn check --ops` listings
    in_place: tuple = ()       # inputs out= may be (the very array): its kernels read each
    # element before they write it (elementwise and row-wise ops); out= overlapping any
    # input otherwise is refused (ops/_common.Call._apart)


OPS = {}  # name -> OpRecord, in definition order


def op(family, *, planned=True, backward=(), dispatches=None, in_place=()):
    """Register the decorated function as the public op of its name (returns it
    unchanged: calls inside ops/ stay unplanned). dispatches: the backend functions it
    runs when they are not named like the op (conv2d runs conv_forward); () for none.
    in_place: the inputs its out= may be."""
    backward = (backward,) if isinstance(backward, str) else tuple(backward)

    def register(fn):
        if fn.__name__ in OPS:
            raise RuntimeError(f"nbdnn op {fn.__name__!r} registered twice")
        doc = (fn.__doc__ or "").strip().split("\n")[0] or None
        names = (fn.__name__,) if dispatches is None else \
            (dispatches,) if isinstance(dispatches, str) else tuple(dispatches)
        OPS[fn.__name__] = OpRecord(fn.__name__, fn, family, planned, backward, names, doc,
                                    tuple(in_place))
        return fn
    return register


def load():
    """Import every family module under nbdnn/ops (each registers its ops); the table."""
    pkg = importlib.import_module("nbdnn.ops")
    for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not m.name.startswith("_") and m.name != "registry":
            importlib.import_module(f"nbdnn.ops.{m.name}")
    return OPS


BEGIN, END = "# ---- the ops (generated", "# ---- end of the ops"


def exports_source(records):
    """The block of nbdnn/__init__.py that exports the ops of `records` (name ->
    OpRecord): each family module imported by name, each op bound from it, wrapped in
    eager call plans where its record says planned. Explicit, so that a reader or an
    IDE follows nbdnn.conv2d to ops/conv.py; `python tools/generate.py` rewrites the block,
    tests/test_docs.py checks it is current."""
    fams = sorted({r.family for r in records.values()})
    lines = [BEGIN + " by `python tools/generate.py` from the op registry: each planned op",
             "# wrapped in eager call plans, ops/_plan.py; `op.unplanned` is the bare op)",
             *_wrapped("from .ops import (", [f"{f} as _{f}" for f in fams], ")")]
    for f in fams:
        for r in records.values():
            if r.family == f:
                ref = f"_{f}.{r.name}"
                lines.append(f"{r.name} = " + (f"_planned({ref})" if r.planned else ref))
    lines += _wrapped("_OPS = (", [f'"{r.name}"' for f in fams for r in records.values()
                                   if r.family == f], ")")
    return "\n".join(lines + [END]) + "\n"


def _wrapped(opening, items, closing, width=92):
    """`opening` items, ... `closing` as lines of at most width characters."""
    lines, line = [], opening
    for i, item in enumerate(items):
        piece = item + (closing if i == len(items) - 1 else ",")
        if len(line) + len(piece) + 1 > width and line.strip() != opening.strip():
            lines.append(line.rstrip())
            line = " " * len(opening) + piece
        else:
            line += ("" if line.endswith("(") else " ") + piece
    return lines + [line]


def families():
    """The families that have ops, in registry order."""
    return tuple(dict.fromkeys(r.family for r in OPS.values()))


def select(items, names):
    """The items (each with .name, .family and .ops: cross-check rows, bench cases) that
    `names` pick: a row name ("activation/relu"), an op ("conv2d", "softmax": all its
    rows), a family ("norm"), or a mode after the slash ("relu") where it names one
    family's rows. BadParamError for a name that picks nothing (it lists the choices)
    or a mode of several families. No names: every item."""
    if not names:
        return list(items)
    picked = []
    for o in names:
        hit = [t for t in items if t.name == o or t.name.startswith(o + "/")
               or t.family == o or o in t.ops]
        if not hit:
            hit = [t for t in items if "/" in t.name and o in t.name.split("/")[1:]]
            if len({t.family for t in hit}) > 1:
                raise BadParamError(f"{o!r} is a mode of several ops "
                                    f"({', '.join(t.name for t in hit)}): name one of them")
        if not hit:
            choices = sorted({t.name for t in items} | {t.family for t in items}
                             | {n for t in items for n in t.ops})
            raise BadParamError(f"no op, row or family named {o!r}; choose from "
                                f"{', '.join(choices)}")
        picked += [t for t in hit if t not in picked]
    return picked

