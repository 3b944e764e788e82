"""Pool kernel paths on the CUDA backend (in the simulator without a GPU): the
compiled-geometry kernels (forward _pool_fast: 1-d and 2-d windows, several output rows
a thread, with every row count a thread can end on; backward pool/fast_bwd.py: argmax
and gather) over NaN rules, dilation, per-side padding, ceil mode, NHWC, alpha/beta,
and the general kernels they leave to (windows past MAX_TAPS, 3-d), against the CPU
reference."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime.memory import arrays as _arrays
from nbdnn.cuda.pool import fast as PF
from nbdnn.cuda.runtime.launch.kernel import launched


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
    # ceil mode with windows larger than the padded input (PyTorch gives an output)
    ("NCHW", (4, 3), 3, 0, 1, "avg", True, 3, 2),
    ("NHWC", 3, 2, 1, 2, "max", True, 2, 4),
    ("NCHW", 3, 2, 0, 1, "avg_exclude_pad", True, 2, 2),
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


@pytest.mark.parametrize("layout, kernel, stride, padding, dilation, mode, ceil, H, W", CASES)
def test_pool2d_backward_paths_match_reference(layout, kernel, stride, padding, dilation,
                                               mode, ceil, H, W):
    """Backward: the geometry-compiled argmax and gather up to MAX_TAPS taps, the
    general kernels past it; ties (values rounded to 0.5) go to the first maximum."""
    rng = np.random.default_rng(H * W + 1)
    shape = (2, 3, H, W) if layout == "NCHW" else (2, H, W, 3)
    x = np.round(rng.standard_normal(shape) * 2).astype(np.float32) / 2
    kw = dict(stride=stride, padding=padding, dilation=dilation, mode=mode, ceil_mode=ceil,
              layout=layout)
    dy = rng.standard_normal(np.shape(nbdnn.pool2d(x, kernel, **kw))).astype(np.float32)
    dx0 = rng.standard_normal(shape).astype(np.float32)
    ref = 1.5 * nbdnn.pool_backward(dy, x, kernel, **kw) - 0.5 * dx0
    out = _arrays.to_device(dx0)
    with launched() as names:
        nbdnn.pool_backward(_arrays.to_device(dy), _arrays.to_device(x), kernel, alpha=1.5,
                            beta=-0.5, out=out, **kw)
    fast = np.prod(kernel if isinstance(kernel, tuple) else (kernel, kernel)) <= PF.MAX_TAPS
    assert ("pool_bwd_fast" in names) == fast, names
    assert ("pool_argmax_fast" in names) == (fast and mode == "max"), names
    np.testing.assert_allclose(_arrays.to_host(out), ref, rtol=1e-6, atol=1e-6)


def test_pool3d_backward_general_kernels():
    x = np.round(np.random.default_rng(3).standard_normal((1, 2, 5, 6, 5)) * 2) / 2
    for mode in ("max", "avg"):
        dy = np.random.default_rng(4).standard_normal(
            np.shape(nbdnn.pool3d(x, 3, stride=2, padding=1, mode=mode)))
        ref = nbdnn.pool_backward(dy, x, 3, stride=2, padding=1, mode=mode)
        with launched() as names:
            got = nbdnn.pool_backward(_arrays.to_device(dy), _arrays.to_device(x), 3, stride=2,
                                      padding=1, mode=mode)
        assert not any("fast" in n for n in names), names
        np.testing.assert_allclose(_arrays.to_host(got), ref, rtol=1e-12)


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
        dy = np.arange(1, ref.size + 1, dtype=np.float32).reshape(ref.shape)
        kw = dict(stride=s, padding=p, nan_propagation=propagate)
        ref = nbdnn.pool_backward(dy, x, k, **kw)  # (which tap wins: NaN's or a number's)
        got = nbdnn.pool_backward(_arrays.to_device(dy), _arrays.to_device(x), k, **kw)
        np.testing.assert_array_equal(_arrays.to_host(got), ref)


def test_pool1d_and_float64_and_beta_blend():
    x = np.random.default_rng(1).standard_normal((2, 3, 13))
    ref, got = _run(x, 1, 3, stride=2, padding=1, mode="avg")
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    y0 = np.random.default_rng(2).standard_normal((2, 3, 7))
    ref = 0.5 * nbdnn.pool1d(x, 3, stride=2, padding=1) + 2.0 * y0
    out = _arrays.to_device(y0)
    nbdnn.pool1d(_arrays.to_device(x), 3, stride=2, padding=1, alpha=0.5, beta=2.0, out=out)
    np.testing.assert_allclose(_arrays.to_host(out), ref, rtol=1e-12)


@pytest.mark.parametrize("layout,mode", [("NCHW", "max"), ("NHWC", "avg")])
def test_general_kernels_forced_match_the_fast_ones(layout, mode):
    """pool.forced("general"): a 2-d window the fast kernels take runs the general forward
    and backward instead (no pool_fast kernel launched), with the reference's numbers;
    forcing "fast" where it cannot run (a 3-d window) is a NotSupportedError."""
    from nbdnn.cuda import pool as P
    from nbdnn.errors import NotSupportedError
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 6, 3) if layout == "NHWC" else (2, 3, 7, 6))
    kw = dict(stride=2, padding=1, mode=mode, layout=layout)
    ref = nbdnn.pool2d(x, 3, **kw)
    dy = rng.standard_normal(ref.shape)
    dref = nbdnn.pool_backward(dy, x, 3, **kw)
    with P.forced("general"), launched() as names:
        got = nbdnn.pool2d(_arrays.to_device(x), 3, **kw)
        dgot = nbdnn.pool_backward(_arrays.to_device(dy), _arrays.to_device(x), 3, **kw)
    assert not any("fast" in n for n in names), names
    np.testing.assert_allclose(_arrays.to_host(got), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_arrays.to_host(dgot), dref, rtol=1e-12, atol=1e-12)
    with launched() as names:
        nbdnn.pool2d(_arrays.to_device(x), 3, **kw)
    assert any("fast" in n for n in names), names
    x3 = _arrays.to_device(rng.standard_normal((1, 2, 3, 4, 4)))
    with P.forced("fast"), pytest.raises(NotSupportedError, match="variant 'fast'"):
        nbdnn.pool3d(x3, 2)
