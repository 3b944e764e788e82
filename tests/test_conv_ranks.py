"""Channels-last 1-d and 3-d convolutions in every dtype and math mode, forward and both
gradients, CUDA (the simulator without a GPU) against the float64 reference. These
ranks reach kernels written for 2-d problems (im2col by words, col2im by rows or
quads, the tensor-core paths), which may take them only when the depth axis is
trivial (ConvGeometry.planar): a 3-d input of one plane with depth padding has
several output planes, and the 2-d kernels read past their arrays there. The random
rows (tests/test_crosscheck.py) rarely draw these corners; this sweep always runs
them (nbdnn/testing/specs/conv.py's RANKS)."""
import pytest

from nbdnn._vocab import BF16_DTYPES, MATH_MODES
from nbdnn.testing import SPECS, crosscheck
from nbdnn.testing.specs.conv import RANKS, rank_case

ROWS = {"forward": "conv", "data": "conv_backward_data", "filter": "conv_backward_filter"}
SPEC = {s.name: s for s in SPECS}
MODES = [(d, m) for d in BF16_DTYPES for m in (MATH_MODES if d == "float32" else ("ieee",))]


@pytest.mark.parametrize("dtype,mode", MODES, ids=[f"{d}-{m}" for d, m in MODES])
@pytest.mark.parametrize("which", list(ROWS))
@pytest.mark.parametrize("name", list(RANKS))
def test_channels_last_1d_and_3d(name, which, dtype, mode):
    spec = SPEC[ROWS[which]]
    for algo in ("auto", "gemm") if mode != "ieee" else ("auto", "gemm", "direct"):
        case = rank_case(name, which, dtype, mode, algo)
        r = crosscheck(spec, case, dtype)
        assert r["ok"], f"{which} {name} {dtype} {mode} algo {algo}: {r['msg']}"
