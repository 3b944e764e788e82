"""Every OpSpec row, every dtype: CUDA (device arrays, sometimes strided views, with and
without alpha/beta/out=) against the CPU reference run in float64.

The structural draws (shapes, parameters) come from a NumPy generator seeded by
hypothesis, so every example, the first (derandomised CI) one included, is a random
call rather than hypothesis's minimal one (size-1 tensors: a seeded off-by-one in a
pooling window passed them). test_extremes adds each row's two boundary calls: every
draw at its low end (size-1 and empty-ish geometry) and at its high end (the largest
shapes the row allows: tails past every tile and vector width)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from nbdnn.testing import DTYPES, SPECS, crosscheck
from conftest import BIG

BLENDS = [None, (0.5, 0.75, 7), (1.0, 0.0, 9)]  # (alpha, beta, seed of out's contents)


def _seeded(seed):
    rng = np.random.default_rng(seed)
    return lambda lo, hi: int(rng.integers(lo, hi + 1))


def _check(spec, dtype, draw, strided, blend):
    case = spec.make(draw, dtype, BIG)
    r = crosscheck(spec, case, dtype, strided=strided, blend=blend)
    assert r["ok"], f"{spec.name} {dtype} shapes {r['shapes']}: {r['msg']}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@given(data=st.data())
def test_crosscheck(spec, dtype, data):
    if dtype not in spec.dtypes:
        pytest.skip(f"{spec.name} does not take {dtype}")
    draw = _seeded(data.draw(st.integers(0, 2 ** 32 - 1), label="seed of the call"))
    strided = {0} if data.draw(st.booleans(), label="strided first input") else set()
    blend = data.draw(st.sampled_from(BLENDS), label="blend") if spec.blend else None
    _check(spec, dtype, draw, strided, blend)


@pytest.mark.parametrize("end", ["low", "high"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_extremes(spec, end):
    dtype = "float32" if "float32" in spec.dtypes else spec.dtypes[0]
    draw = (lambda lo, hi: lo) if end == "low" else (lambda lo, hi: hi)
    _check(spec, dtype, draw, {0} if end == "high" else set(),
           BLENDS[1] if spec.blend else None)


BOUNDARY = [(spec, name) for spec in SPECS for name in spec.boundary]


@pytest.mark.parametrize("spec,name", BOUNDARY, ids=[f"{s.name}: {n}" for s, n in BOUNDARY])
def test_boundary(spec, name):
    """The row's fixed calls at the edges of its geometry rules, in float32 against the
    float64 reference, with a blend where the row takes one."""
    case = spec.boundary[name]("float32")
    r = crosscheck(spec, case, "float32", blend=BLENDS[1] if spec.blend else None)
    assert r["ok"], f"{spec.name} ({name}) shapes {r['shapes']}: {r['msg']}"
