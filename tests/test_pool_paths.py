"""Pool forward kernel paths on the CUDA backend (in the simulator without a GPU): the
compiled-geometry kernel (_pool_fast: 1-d and 2-d windows, several output rows a
thread) with every row count a thread can end on, NaN rules, dilation, per-side
padding, ceil mode, NHWC, alpha/beta, and the general kernel it leaves to (windows past
MAX_TAPS), against the CPU reference."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime import arrays as _arrays
from nbdnn.cuda.pool import fast as PF


def _run(x, nd, kernel, **kw):
    ref = getattr(nbdnn, f"pool{nd}d")(x, kernel, **kw)
    got = getattr(nbdnn, f"pool{nd}d")(_arrays.to_device(x), kernel, **kw)
    return ref, _arrays.to_host(got)


def test_rows_per_thread():
    assert PF.rows_per_thread(3, 3, 2, 1, 56) == PF.RPT
    assert PF.rows_per_thread(3, 3, 2, 1, 3) == 3            # fewer rows than RPT
    assert PF.rows_per_thread(7, 7, 1, 1, 50) == 1           # 7x7: 10 rows x 7 > MAX_LOADS
    assert PF.usable(2, (8, 8), 10, 10) and not PF.usable(2, (9, 8), 10, 10)
    assert not PF.usable(3, (1, 2, 2), 10, 10)


CASES = [
    # (layout, kernel, stride, padding, dilation, mode, ceil_mode, H, W)
    ("NCHW", 3, 2, 1, 1, "max", False, 9, 11),     # 5 output rows: RPT groups of 4 + 1
    ("NCHW", 3, 2, 1, 1, "avg", True, 10, 7),
    ("NCHW", 2, 2, 0, 1, "avg_exclude_pad", False, 8, 8),
    ("NCHW", (3, 2), (1, 2), ((1, 0), (0, 1)), 1, "avg", False, 6, 7),  # per-side padding
    ("NCHW", 3, 1, 2, 2, "max", False, 7, 6),      # dilation 2, padding 2
    ("NHWC", 3, 2, 1, 1, "max", True, 9, 9),
    ("NHWC", 2, 1, 1, 1, "avg", False, 5, 6),
    ("NCHW", 9, 1, 0, 1, "max", False, 10, 10),    # 81 taps: the general kernel
]


@pytest.mark.parametrize("layout, kernel, stride, padding, dilation, mode, ceil, H, W", CASES)
def test_pool2d_paths_match_reference(layout, kernel, stride, padding, dilation, mode, ceil,
                                      H, W):
    rng = np.random.default_rng(H * W)
    shape = (2, 3, H, W) if layout == "NCHW" else (2, H, W, 3)
    x = rng.standard_normal(shape).astype(np.float32)
    kw = dict(stride=stride, padding=padding, dilation=dilation, mode=mode, ceil_mode=ceil,
              layout=layout, alpha=1.5, beta=0.0)
    ref, got = _run(x, 2, kernel, **kw)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("propagate", [True, False])
def test_max_pool_nan_rules(propagate):
    """A window of NaNs and -inf: NaN when propagating, else the largest number (-inf),
    and NaN only where a window holds nothing but NaNs."""
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)
    x[0, 0, :3, :3] = np.nan
    x[0, 1, 0, 0] = np.nan
    x[0, 1, 0, 1:3] = -np.inf
    x[0, 1, 1:3, :3] = -np.inf
    for k, s, p in ((3, 2, 1), (2, 2, 0), (3, 1, 0)):
        ref, got = _run(x, 2, k, stride=s, padding=p, nan_propagation=propagate)
        np.testing.assert_array_equal(got, ref)


def test_pool1d_and_float64_and_beta_blend():
    x = np.random.default_rng(1).standard_normal((2, 3, 13))
    ref, got = _run(x, 1, 3, stride=2, padding=1, mode="avg")
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    y0 = np.random.default_rng(2).standard_normal((2, 3, 7))
    ref = 0.5 * nbdnn.pool1d(x, 3, stride=2, padding=1) + 2.0 * y0
    out = _arrays.to_device(y0)
    nbdnn.pool1d(_arrays.to_device(x), 3, stride=2, padding=1, alpha=0.5, beta=2.0, out=out)
    np.testing.assert_allclose(_arrays.to_host(out), ref, rtol=1e-12)
