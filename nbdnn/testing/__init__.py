"""The cross-check harness (harness.py: Case, OpSpec, makers' helpers, tolerances,
compare, crosscheck) and its rows: SPECS, one OpSpec per op (and mode), collected from
testing/specs/<family>.py for every family in the op registry (nbdnn/ops/registry.py).

A row says how to draw a valid call of an op (shapes, parameters, inputs) and how close
the CUDA result must be to the CPU reference run in float64 on the same inputs.
tests/test_crosscheck.py draws rows with hypothesis; `nbdnn check` draws them with a
seeded NumPy generator; both end in `crosscheck()`.
"""
import importlib

from ..ops import registry as _registry
from .harness import (DTYPES, ELEMENTWISE_TOL, EPS, Case, OpSpec, assert_close,  # noqa: F401
                      compare, crosscheck, rand, reduction_tol, shape_nd)


def _collect():
    specs = []
    for family in _registry.families():
        try:
            mod = importlib.import_module(f"nbdnn.testing.specs.{family}")
        except ModuleNotFoundError as e:
            if e.name != f"nbdnn.testing.specs.{family}":
                raise
            continue  # tests/test_registry.py names the ops without rows
        specs += mod.SPECS
    return specs


SPECS = _collect()
