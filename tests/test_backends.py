"""The op registry holds every public op, and every backend function an op dispatches
to exists in both backends under the same name: adding an op means writing it in
nbdnn/ops, nbdnn/cpu and nbdnn/cuda (and a spec row, tests/test_crosscheck.py)."""
import importlib

import pytest

import nbdnn
from nbdnn.ops.registry import OPS
from nbdnn.testing import SPECS


@pytest.mark.parametrize("name", sorted(OPS))
def test_backends_have_every_dispatched_function(name):
    rec = OPS[name]
    for backend in ("cpu", "cuda"):
        mod = importlib.import_module(f"nbdnn.{backend}.{rec.family}")
        missing = sorted(n for n in rec.dispatches if not callable(getattr(mod, n, None)))
        assert not missing, f"{name}: nbdnn.{backend}.{rec.family} lacks {missing}"


def test_the_exports_are_the_registry():
    public = {n for n in dir(nbdnn) if callable(getattr(nbdnn, n)) and not n.startswith("_")
              and not isinstance(getattr(nbdnn, n), type)}
    assert public == set(OPS)
    assert set(nbdnn.__all__) >= set(OPS)
    for n, rec in OPS.items():
        fn = getattr(nbdnn, n)
        assert (getattr(fn, "unplanned", fn) is rec.fn) and (hasattr(fn, "unplanned") ==
                                                              (rec.planned and fn is not rec.fn))


def test_every_backward_is_an_op_and_every_op_has_a_row():
    for rec in OPS.values():
        assert all(b in OPS for b in rec.backward), rec
    checked = {n for s in SPECS for n in s.ops}
    assert checked <= set(OPS), checked - set(OPS)
    no_row = [n for n, rec in OPS.items() if rec.dispatches and n not in checked]
    assert not no_row, f"ops without a cross-check row: {no_row}"
