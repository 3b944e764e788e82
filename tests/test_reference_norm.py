"""layer_norm / rms_norm reference: definitions, stability at mean 1e4, finite
differences; and bad calls."""
import numpy as np
import pytest

import nbdnn
from nbdnn import BadParamError, DtypeError, ShapeError

RNG = np.random.default_rng(5)


def test_layer_norm_matches_definition_over_trailing_axes():
    x, s, b = RNG.standard_normal((3, 4, 5)), RNG.standard_normal((4, 5)), RNG.standard_normal((4, 5))
    y, mean, invstd = nbdnn.layer_norm(x, s, b, ndim=2)
    m = x.mean(axis=(1, 2), keepdims=True)
    ref = (x - m) / np.sqrt(x.var(axis=(1, 2), keepdims=True) + 1e-5) * s + b
    np.testing.assert_allclose(y, ref, rtol=1e-13, atol=1e-13)
    assert mean.shape == invstd.shape == (3,)


def test_rms_norm_matches_definition():
    x, s = RNG.standard_normal((6, 7)), RNG.standard_normal(7)
    y, inv = nbdnn.rms_norm(x, s, eps=1e-3)
    np.testing.assert_allclose(y, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-3) * s,
                               rtol=1e-13)
    np.testing.assert_allclose(inv, 1 / np.sqrt((x * x).mean(-1) + 1e-3), rtol=1e-13)


def test_float32_statistics_stay_accurate_at_mean_1e4():
    x = (1e4 + RNG.standard_normal((4, 4096))).astype(np.float32)
    y, mean, invstd = nbdnn.layer_norm(x)
    ref = nbdnn.layer_norm(x.astype(np.float64))
    np.testing.assert_allclose(invstd, ref[2], rtol=1e-4)
    np.testing.assert_allclose(y, ref[0], atol=2e-3)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_backward_matches_finite_differences(name):
    fwd, bwd = getattr(nbdnn, name), getattr(nbdnn, name + "_backward")
    x, s, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal(4), RNG.standard_normal(4)
    dy = RNG.standard_normal(x.shape)
    out = fwd(x, s, b)
    dx, ds, db = bwd(dy, x, *out[1:], s)
    h = 1e-6
    for v, grad, f in ((x, dx, lambda v: fwd(v, s, b)[0]), (s, ds, lambda v: fwd(x, v, b)[0]),
                       (b, db, lambda v: fwd(x, s, v)[0])):
        num = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            vp, vm = v.copy(), v.copy()
            vp[idx] += h
            vm[idx] -= h
            num[idx] = (np.sum(dy * f(vp)) - np.sum(dy * f(vm))) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-7)


X = np.ones((2, 3), np.float32)


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.layer_norm(X, ndim=3), BadParamError, "ndim"),
    (lambda: nbdnn.layer_norm(X, eps=0.0), BadParamError, "eps"),
    (lambda: nbdnn.layer_norm(np.ones((2, 0), np.float32)), ShapeError, "x.shape"),
    (lambda: nbdnn.layer_norm(X, np.ones(2, np.float32)), ShapeError, "scale.shape"),
    (lambda: nbdnn.rms_norm(X, None, np.ones(3, np.float64)), DtypeError, "bias.dtype"),
    (lambda: nbdnn.layer_norm_backward(X, X, np.ones(2, np.float64), np.ones(2, np.float32)),
     DtypeError, "mean.dtype"),
    (lambda: nbdnn.rms_norm_backward(X, X, np.ones(3, np.float32)), ShapeError, "invrms.shape"),
    (lambda: nbdnn.rms_norm_backward(X, X, np.ones(2, np.float32), out=(X,)), BadParamError,
     "out"),
])
def test_bad_norm_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)


def test_group_norm_matches_definition_and_instance_norm():
    x = RNG.standard_normal((2, 6, 3, 4))
    s, b = RNG.standard_normal(6), RNG.standard_normal(6)
    y, mean, invstd = nbdnn.group_norm(x, 3, s, b)
    xg = x.reshape(2, 3, -1)
    ref = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5))
    ref = ref.reshape(x.shape) * s[:, None, None] + b[:, None, None]
    np.testing.assert_allclose(y, ref, rtol=1e-13, atol=1e-13)
    assert mean.shape == invstd.shape == (2, 3)
    yi = nbdnn.instance_norm(x)[0]
    np.testing.assert_allclose(yi, nbdnn.group_norm(x, 6)[0], rtol=0)
    yl = nbdnn.group_norm(np.moveaxis(x, 1, -1).copy(), 3, s, b, layout="NHWC")[0]
    np.testing.assert_allclose(np.moveaxis(yl, -1, 1), y, rtol=1e-13)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_group_norm_backward_matches_finite_differences(layout):
    x = RNG.standard_normal((2, 4, 3) if layout == "NCHW" else (2, 3, 4))
    s, b = RNG.standard_normal(4), RNG.standard_normal(4)
    dy = RNG.standard_normal(x.shape)
    f = lambda x_, s_, b_: nbdnn.group_norm(x_, 2, s_, b_, layout=layout)[0]  # noqa: E731
    _, mean, invstd = nbdnn.group_norm(x, 2, s, b, layout=layout)
    grads = nbdnn.group_norm_backward(dy, x, mean, invstd, s, groups=2, layout=layout)
    h = 1e-6
    for k, v in enumerate((x, s, b)):
        num = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            args = [x, s, b]
            vp, vm = v.copy(), v.copy()
            vp[idx] += h
            vm[idx] -= h
            num[idx] = (np.sum(dy * f(*args[:k], vp, *args[k + 1:]))
                        - np.sum(dy * f(*args[:k], vm, *args[k + 1:]))) / (2 * h)
        np.testing.assert_allclose(grads[k], num, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.group_norm(np.ones((2, 6, 3), np.float32), 4), ShapeError, "groups"),
    (lambda: nbdnn.group_norm(np.ones(6, np.float32), 2), ShapeError, "x.ndim"),
    (lambda: nbdnn.group_norm(np.ones((2, 6), np.float32), 2, layout="HWCN"), BadParamError,
     "layout"),
    (lambda: nbdnn.instance_norm(np.ones((2, 3, 4), np.float32), np.ones(4, np.float32)),
     ShapeError, "scale.shape"),
    (lambda: nbdnn.group_norm_backward(np.ones((2, 6), np.float32), np.ones((2, 6), np.float32),
                                       np.ones((2, 3), np.float32), np.ones((2, 2), np.float32),
                                       groups=3), ShapeError, "invstd.shape"),
])
def test_bad_group_norm_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)
