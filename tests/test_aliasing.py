"""out= that shares memory with an input never gives a silent wrong answer: every op
(one row each from the registry's cross-check rows) either computes the right result
in place (the inputs its registry record names, OpRecord.in_place: elementwise and
row-wise kernels) or raises BadParamError; an out= that partly overlaps an input is always an
error. Both backends, same rule (the simulator on a machine without a GPU)."""
import inspect

import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
from nbdnn.ops.registry import OPS
from nbdnn.testing import SPECS, compare

# one row per op; set_tensor and sgd_update write their inputs (no out=)
ROWS = list({s.ops[0]: s for s in SPECS if s.ops[0] not in ("set_tensor", "sgd_update")}
            .values())


def _case(spec):
    rng = np.random.default_rng(7)
    draw = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    dtype = "float32" if "float32" in spec.dtypes else spec.dtypes[0]
    for _ in range(20):  # a case whose first output has an input's shape, when one can
        case = spec.make(draw, dtype, False)
        first = spec.fn(*case.args, **case.kwargs)
        first = first[0] if isinstance(first, tuple) else first
        if any(isinstance(a, np.ndarray) and a.shape == first.shape and a.dtype == first.dtype
               and a.size > 1 for a in case.args):
            break
    return case, dtype


def _outs(spec, result, alias):
    """out= for a call whose result is `result`: alias in the first place, fresh arrays
    (of the backend's kind) in the others. Forward ops take out= for their first result
    alone (their statistics and masks are always new); backward ops (an op's declared
    backward) one per result."""
    if not isinstance(result, tuple) or not any(spec.ops[0] in r.backward
                                                for r in OPS.values()):
        return alias
    fresh = [np.zeros(r.shape, r.dtype) for r in result[1:]]
    if not isinstance(alias, np.ndarray):
        fresh = [to_device(f) for f in fresh]
    return (alias, *fresh)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("spec", ROWS, ids=lambda s: s.ops[0])
def test_out_aliasing_an_input_is_right_or_refused(spec, backend):
    case, dtype = _case(spec)
    expected = spec.fn(*case.args, **case.kwargs)
    exp0 = expected[0] if isinstance(expected, tuple) else expected
    atol, rtol = spec.tolerance(dtype, case)
    put = (lambda a: a.copy()) if backend == "cpu" else to_device
    get = (lambda a: a) if backend == "cpu" else to_host
    tried = 0
    for i, a in enumerate(case.args):
        if not (isinstance(a, np.ndarray) and a.shape == exp0.shape and a.dtype == exp0.dtype):
            continue
        args = [put(b) if isinstance(b, np.ndarray) else b for b in case.args]
        tried += 1
        try:
            got = spec.fn(*args, **case.kwargs, out=_outs(spec, expected, args[i]))
        except nbdnn.BadParamError as e:
            assert "overlap" in str(e), e
            name = list(inspect.signature(spec.fn).parameters)[i]
            assert name not in OPS[spec.ops[0]].in_place, \
                f"out= as {name}, declared in place, refused: {e}"
            continue
        got0 = got[0] if isinstance(got, tuple) else got
        ok, _, _, _, msg = compare(get(got0), exp0, max(atol, 1e-5), max(rtol, 1e-5))
        assert ok, f"out= input {i} accepted but wrong: {msg}"
    # an out= one element off an input: always refused
    a = next((b for b in case.args if isinstance(b, np.ndarray) and b.size > 1), None)
    if a is None or exp0.size < 1:
        return
    n = max(a.size, exp0.size) + 1
    buf = put(np.zeros(2 * n, exp0.dtype)) if a.dtype == exp0.dtype else None
    if buf is None:
        return
    args = list(case.args)
    k = next(j for j, b in enumerate(case.args) if b is a)
    host_in = np.zeros(2 * n, a.dtype)
    host_in[:a.size] = a.ravel()
    shared = put(host_in) if backend == "cpu" else to_device(host_in)
    args = [put(b) if isinstance(b, np.ndarray) else b for b in case.args]
    args[k] = shared[:a.size].reshape(a.shape)
    out = shared[1:1 + exp0.size].reshape(exp0.shape)
    with pytest.raises(nbdnn.BadParamError, match="overlap"):
        spec.fn(*args, **case.kwargs, out=_outs(spec, expected, out))


def test_in_place_names_are_the_ops_inputs():
    """Each record's in_place names parameters of its op (a misspelt name would let
    nothing through, silently)."""
    for rec in OPS.values():
        params = inspect.signature(rec.fn).parameters
        assert set(rec.in_place) <= set(params), (rec.name, rec.in_place)
