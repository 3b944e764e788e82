"""Module switches and forced kernel variants set from a script's command line, so one
device call can measure a kernel both ways without a commit in between:

    python perf/suites/resnet50.py --set conv:as_forward
    python perf/suites/gemm.py --set nbdnn.cuda.matmul.tensor_core_gemm.split_k.NARROW=0

FAMILY:VARIANT forces a family's variant (nbdnn.cuda.FAMILY.forced(VARIANT): its calls
run that variant, an error where it cannot take one). NAME=VALUE is a module
attribute's dotted path and a Python literal (1/0/True/False, numbers, strings); the
attribute must exist (a typo is an error, not a silent no-op).
"""
import ast
import contextlib
import importlib


def add_argument(parser):
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                        help="set a module switch before running (repeatable)")


_FORCED = contextlib.ExitStack()  # the variants apply() forces, for the process


def _forced(item):
    """The context forcing "FAMILY:VARIANT" (runtime/variants.py), or None for a switch."""
    if "=" in item or ":" not in item:
        return None
    family, _, name = item.partition(":")
    return importlib.import_module(f"nbdnn.cuda.{family}").forced(name)


def apply(settings, quiet=False):
    """Set each "module.NAME=VALUE" and force each "FAMILY:VARIANT"; returns {item:
    value} as applied (printed unless quiet)."""
    done = {}
    for item in settings:
        force = _forced(item)
        if force is not None:
            _FORCED.enter_context(force)
            done[item] = True
            continue
        path, _, text = item.partition("=")
        module, _, name = path.rpartition(".")
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            raise SystemExit(f"--set {item}: {module} has no attribute {name}")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        setattr(mod, name, value)
        done[path] = value
    if done and not quiet:
        print("switches:", ", ".join(f"{k}={v!r}" for k, v in done.items()), flush=True)
    return done


@contextlib.contextmanager
def applied(settings):
    """apply(settings) for the block: the variants forced inside it only, each
    attribute's old value restored after it, so one process times both sides (conv.py
    --against): one JIT, one warm-up, the peer timed once. Kernels built under a
    switch stay cached under their own names or keys."""
    switches = [item for item in settings if _forced(item) is None]
    old = {}
    for item in switches:
        module, _, name = item.partition("=")[0].rpartition(".")
        mod = importlib.import_module(module)
        old[item] = (mod, name, getattr(mod, name, None))
    with contextlib.ExitStack() as stack:
        for item in settings:
            force = _forced(item)
            if force is not None:
                stack.enter_context(force)
        apply(switches, quiet=True)
        try:
            yield
        finally:
            for mod, name, value in old.values():
                setattr(mod, name, value)
