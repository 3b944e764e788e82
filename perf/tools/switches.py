"""Module switches set from a script's command line, so one device call can measure a
kernel that is still off by default (written, not yet run on an H200) both ways
without a commit in between:

    python perf/suites/resnet50.py --set nbdnn.cuda.conv.DATA_1X1_GEMM=0

Each NAME=VALUE is a module attribute's dotted path and a Python literal
(1/0/True/False, numbers, strings); the attribute must exist (a typo is an error, not
a silent no-op).
"""
import ast
import contextlib
import importlib


def add_argument(parser):
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                        help="set a module switch before running (repeatable)")


def apply(settings, quiet=False):
    """Set each "module.NAME=VALUE"; returns {path: value} as applied (printed unless
    quiet)."""
    done = {}
    for item in settings:
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
    """apply(settings) for the block, each attribute's old value restored after it, so
    one process times both sides of a switch (conv.py --against): one JIT, one warm-up,
    the peer timed once. Kernels built under a switch stay cached under their own
    names or keys."""
    old = {}
    for item in settings:
        path = item.partition("=")[0]
        module, _, name = path.rpartition(".")
        mod = importlib.import_module(module)
        old[path] = (mod, name, getattr(mod, name, None))
    apply(settings, quiet=True)
    try:
        yield
    finally:
        for mod, name, value in old.values():
            setattr(mod, name, value)
