"""Every function the front end dispatches to exists in both backends, with the same
name: adding an op means writing it in nbdnn/cpu and nbdnn/cuda."""
import importlib
import inspect
import pkgutil
import re

import pytest

import nbdnn.ops

FAMILIES = [m.name for m in pkgutil.iter_modules(nbdnn.ops.__path__) if not m.name.startswith("_")]


@pytest.mark.parametrize("family", FAMILIES)
def test_backends_have_every_dispatched_function(family):
    src = inspect.getsource(importlib.import_module(f"nbdnn.ops.{family}"))
    names = set(re.findall(r"\.run\(\s*\"(\w+)\"", src))
    assert names, f"nbdnn.ops.{family} dispatches nothing?"
    for backend in ("cpu", "cuda"):
        mod = importlib.import_module(f"nbdnn.{backend}.{family}")
        missing = sorted(n for n in names if not callable(getattr(mod, n, None)))
        assert not missing, f"nbdnn.{backend}.{family} lacks {missing}"
