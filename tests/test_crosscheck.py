"""Every OpSpec row, every dtype: CUDA (device arrays, sometimes strided views, with and
without alpha/beta/out=) against the CPU reference run in float64."""
import pytest
from hypothesis import given, strategies as st

from nbdnn.testing import DTYPES, SPECS, crosscheck
from conftest import BIG

BLENDS = [None, (0.5, 0.75, 7), (1.0, 0.0, 9)]  # (alpha, beta, seed of out's contents)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@given(data=st.data())
def test_crosscheck(spec, dtype, data):
    if dtype not in spec.dtypes:
        pytest.skip(f"{spec.name} does not take {dtype}")
    case = spec.make(lambda lo, hi: data.draw(st.integers(lo, hi)), dtype, BIG)
    strided = {0} if data.draw(st.booleans(), label="strided first input") else set()
    blend = data.draw(st.sampled_from(BLENDS), label="blend") if spec.blend else None
    r = crosscheck(spec, case, dtype, strided=strided, blend=blend)
    assert r["ok"], f"{spec.name} {dtype} shapes {r['shapes']}: {r['msg']}"
