"""transform_tensor's swaps of two axes through shared-memory tiles
(nbdnn/cuda/tensor/transpose.py) against NumPy's transpose: the permutations it takes
(NCHW <-> NHWC, a matrix, a filter's channels around its taps), sides that are not
multiples of the tile, every dtype, the grid rows' loop; what it leaves to the gather
kernel (alpha / beta, narrow sides, other permutations) still right."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import SIMULATOR
from nbdnn.cuda.runtime.launch.kernel import launched
from nbdnn.cuda.tensor import transpose as TT

DTYPES = ["float16", "float32", "float64"] + ([] if SIMULATOR else ["bfloat16"])


@pytest.fixture(autouse=True)
def _tiled(monkeypatch):
    """tensor.TILED_TRANSPOSE on (off by default until it has run on a GPU)."""
    from nbdnn.cuda import tensor
    monkeypatch.setattr(tensor, "TILED_TRANSPOSE", True)
# (x shape, perm, (B, A, M, C) as transpose.reduced finds them)
CASES = [((2, 17, 4, 5), (0, 2, 3, 1), (2, 17, 1, 20)),     # NCHW -> NHWC
         ((2, 4, 5, 17), (0, 3, 1, 2), (2, 20, 1, 17)),     # NHWC -> NCHW
         ((33, 40), (1, 0), (1, 33, 1, 40)),                # a matrix
         ((2, 20, 3, 18), (0, 3, 2, 1), (2, 20, 3, 18)),    # (G, K/g, taps, C/g) filter
         ((1, 16, 1, 3, 1, 24), (0, 5, 2, 3, 4, 1), (1, 16, 3, 24))]  # size-1 axes


def _numpy(shape, dtype, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if dtype == "bfloat16":
        import ml_dtypes
        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_tiled_transpose_matches_numpy(case, dtype):
    shape, perm, dims = case
    assert TT.reduced(shape, perm) == dims
    x = _numpy(shape, dtype)
    with launched() as names:
        y = nbdnn.transform_tensor(x, perm=perm, backend="cuda")
    assert names == [f"_transpose_tiles_{dtype}"], names
    np.testing.assert_array_equal(np.asarray(y), np.transpose(x, perm))  # a copy: exact


def test_grid_rows_loop(monkeypatch):
    """More (b, m) pairs than grid rows: each block walks several."""
    monkeypatch.setattr(TT, "MAX_GRID_Y", 2)
    x = _numpy((5, 20, 3, 18), "float32", 1)
    y = nbdnn.transform_tensor(x, perm=(0, 3, 2, 1), backend="cuda")
    np.testing.assert_array_equal(np.asarray(y), np.transpose(x, (0, 3, 2, 1)))


@pytest.mark.parametrize("shape, perm", [((40, 8), (1, 0)),             # a side under 16
                                         ((16, 17, 18), (1, 0, 2)),      # last axis stays
                                         ((16, 17, 18), (2, 1, 0)),      # a reversal: a swap
                                         ((4, 16, 5, 17), (3, 2, 1, 0))])  # not one swap
def test_other_permutations(shape, perm):
    x = _numpy(shape, "float32", 2)
    with launched() as names:
        y = nbdnn.transform_tensor(x, perm=perm, backend="cuda")
    tiled = TT.usable("float32", TT.reduced(shape, perm), 1.0, 0.0)
    assert (names == ["_transpose_tiles_float32"]) == tiled, names
    np.testing.assert_array_equal(np.asarray(y), np.transpose(x, perm))
    assert tiled == (perm == (2, 1, 0))  # (16, 17, 18) reversed: the swap of 0 and 2


def test_alpha_beta_take_the_gather_kernel():
    x = _numpy((20, 24), "float32", 3)
    out = _numpy((24, 20), "float32", 4)
    with launched() as names:
        y = nbdnn.transform_tensor(x, perm=(1, 0), alpha=2.0, beta=0.5, out=out.copy(),
                                   backend="cuda")
    assert not any(n.startswith("_transpose_tiles") for n in names), names
    np.testing.assert_allclose(np.asarray(y), 2 * x.T + 0.5 * out, rtol=1e-6)
