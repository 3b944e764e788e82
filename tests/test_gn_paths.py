"""Group and instance norm's channels-first fast path (_gn_planes: batch norm's plane
kernels over re-shaped views) against the CPU reference, forward and backward, with
and without scale/bias, in float16/32/64; rows and planes cut into several chunks
(shapes sized for the simulator's and the GPU's block counts: asserted); and the
shapes that must fall back to the general kernels."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import SIMULATOR
from nbdnn.cuda.runtime.memory import arrays as _arrays
from nbdnn.cuda.batch_norm import planes as _bn_planes
from nbdnn.cuda.norm import group_planes as _gn_planes
from nbdnn.cuda.runtime.memory.arrays import to_device

TOL = {np.float16: 2e-2, np.float32: 1e-4, np.float64: 1e-9}

# (shape, groups (None: instance norm), scale/bias, dtype, where: "sim"/"gpu" sized
# for that target's chunking, or "both")
CASES = [((2, 4, 4, 4), 2, True, np.float32, "both"),
         ((3, 6, 2, 2), 3, True, np.float16, "both"),
         ((2, 4, 4, 4), None, False, np.float64, "both"),
         ((1, 2, 16, 20), 1, True, np.float32, "sim"),
         ((2, 4, 64, 80), 2, True, np.float32, "gpu"),
         ((1, 2, 64, 96), None, True, np.float64, "gpu")]


def _run(x, dy, groups, s, b, **kw):
    if groups is None:
        y = nbdnn.instance_norm(x, s, b, **kw)
        return y, nbdnn.instance_norm_backward(dy, x, *y[1:], s, **kw)
    y = nbdnn.group_norm(x, groups, s, b, **kw)
    return y, nbdnn.group_norm_backward(dy, x, *y[1:], s, groups=groups, **kw)


@pytest.mark.parametrize("shape, groups, affine, dtype, where", CASES)
def test_fast_path_matches_reference(shape, groups, affine, dtype, where):
    if where != "both" and (where == "sim") != SIMULATOR:
        pytest.skip("sized for the other target's block counts")
    N, C = shape[:2]
    G = groups or C
    HW = int(np.prod(shape[2:]))
    assert _gn_planes.usable((N, C, G, HW, 0), True)
    if where != "both":  # rows (forward) and planes (backward) in several chunks
        assert _bn_planes.chunking(1, N * G, C // G * HW)[0] > 1
        assert _bn_planes.chunking(1, N * C, HW)[0] > 1
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape) * 3 + 50  # an offset mean: the statistics' shift
    dy = rng.standard_normal(shape)
    s, b = (rng.standard_normal(C), rng.standard_normal(C)) if affine else (None, None)
    want = _run(x, dy, groups, s, b)
    cast = (lambda a: None if a is None else a.astype(dtype))
    got = _run(cast(x), cast(dy), groups, cast(s), cast(b), backend="cuda")
    tol = TOL[dtype]
    for g, w in zip(got[0] + got[1], want[0] + want[1]):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=tol,
                                   atol=tol * max(1.0, np.abs(w).max()))


def test_fast_path_is_deterministic():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 4, 8)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    s = rng.standard_normal(4).astype(np.float32)
    a = _run(x, dy, 2, s, s, backend="cuda")
    b = _run(x, dy, 2, s, s, backend="cuda")
    for u, v in zip(a[0] + a[1], b[0] + b[1]):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("geo, aligned", [((2, 4, 2, 6, 0), True),   # planes of 6
                                          ((2, 4, 2, 8, 1), True),   # channels last
                                          ((2, 4, 2, 8, 0), False)])  # misaligned
def test_general_path_where_the_fast_one_does_not_apply(geo, aligned):
    assert not _gn_planes.usable(geo, aligned)


def test_misaligned_device_views_fall_back_and_match():
    """x, dy and the out= buffers as device views 4 bytes past an aligned start: the
    general kernels run (a 16-byte access there faults on a GPU) and agree."""
    rng = np.random.default_rng(5)
    shape = (2, 4, 8)

    def view(a):
        buf = to_device(np.concatenate([[0], a.ravel()]).astype(np.float32))
        return buf[1:].reshape(a.shape)
    x, dy = rng.standard_normal(shape) + 3, rng.standard_normal(shape)
    dx, y = view(np.zeros(shape)), view(np.zeros(shape))
    assert not _arrays.vector_aligned(view(x))
    want = _run(x, dy, 2, None, None)
    yy = nbdnn.group_norm(view(x), 2, out=y)
    got = nbdnn.group_norm_backward(view(dy), view(x), *yy[1:], groups=2,
                                    out=(dx, to_device(np.zeros(4, np.float32)),
                                         to_device(np.zeros(4, np.float32))))
    for g, w in zip(yy + got, want[0] + want[1]):
        np.testing.assert_allclose(g.copy_to_host(), w, rtol=1e-4,
                                   atol=1e-4 * max(1.0, np.abs(w).max()))
