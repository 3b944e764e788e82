"""The CPU reference of softmax / log-softmax and their gradient against independent
truth: a naive per-row loop with math.exp, finite differences of a scalar loss in
float64, and identities."""
import math
from itertools import product

import numpy as np
import pytest

import nbdnn

RNG = np.random.default_rng(99)
X3 = RNG.standard_normal((2, 3, 4)) * 2
X4 = RNG.standard_normal((2, 3, 2, 3)) * 2
CASES = [(X3, 0), (X3, 1), (X3, 2), (X3, -1), (X4, 1), (X4, 3), (X4, -2)]
IDS = [f"{x.ndim}d-axis{a}" for x, a in CASES]


def _rows(shape, axis):
    """For each row along `axis`: the list of its full indices."""
    axis %= len(shape)
    others = [range(n) if i != axis else [None] for i, n in enumerate(shape)]
    for base in product(*others):
        yield [base[:axis] + (k,) + base[axis + 1:] for k in range(shape[axis])]


def _naive(x, axis, algo):
    y = np.empty_like(x)
    for row in _rows(x.shape, axis):
        v = [float(x[i]) for i in row]
        m = 0.0 if algo == "fast" else max(v)
        e = [math.exp(t - m) for t in v]
        s = sum(e)
        for i, t, ei in zip(row, v, e):
            y[i] = t - m - math.log(s) if algo == "log" else ei / s
    return y


@pytest.mark.parametrize("algo", ["fast", "accurate", "log"])
@pytest.mark.parametrize("x, axis", CASES, ids=IDS)
def test_softmax_matches_naive_loop(x, axis, algo):
    got = nbdnn.softmax(x, axis, algo=algo)
    assert got.shape == x.shape and got.dtype == np.float64
    np.testing.assert_allclose(got, _naive(x, axis, algo), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("x, axis", CASES, ids=IDS)
def test_softmax_identities(x, axis):
    y = nbdnn.softmax(x, axis)
    assert (y > 0).all()
    np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-14)
    for row in _rows(x.shape, axis):  # each row sums to 1, checked by the loop too
        assert abs(sum(float(y[i]) for i in row) - 1.0) < 1e-14
    np.testing.assert_allclose(nbdnn.softmax(x, axis, algo="log"), np.log(y), rtol=1e-13,
                               atol=1e-14)
    np.testing.assert_allclose(nbdnn.softmax(x, axis, algo="fast"), y, rtol=1e-14)
    # shift invariance along the axis
    shift = np.take(x, [0], axis=axis) * 3.0
    np.testing.assert_allclose(nbdnn.softmax(x + shift, axis), y, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_inputs_stay_finite(dtype):
    x = np.array([[1e4, 0.0, -1e4], [-1e4, -1e4, -1e4 + 1], [1e4, 1e4, 1e4]], dtype)
    y = nbdnn.softmax(x, -1)
    lg = nbdnn.softmax(x, -1, algo="log")
    assert y.dtype == dtype and np.isfinite(y).all() and np.isfinite(lg).all()
    e = math.exp(-1)
    np.testing.assert_allclose(y, [[1, 0, 0], [e / (2 * e + 1)] * 2 + [1 / (2 * e + 1)],
                                   [1 / 3] * 3], rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(lg, [[0, -1e4, -2e4],
                                    [-1 - math.log(2 * e + 1)] * 2 + [-math.log(2 * e + 1)],
                                    [-math.log(3)] * 3], rtol=1e-6)
    dy = np.ones_like(x)
    assert np.isfinite(nbdnn.softmax_backward(dy, y, -1)).all()
    assert np.isfinite(nbdnn.softmax_backward(dy, lg, -1, algo="log")).all()
    assert np.isnan(nbdnn.softmax(x, -1, algo="fast")[0, 0])  # documented: inf / inf


def test_non_finite_inputs_follow_the_formulas():
    inf, nan = math.inf, math.nan
    x = np.array([[nan, 0.0, 1.0], [inf, 0.0, 1.0], [-inf, -inf, -inf], [-inf, 0.0, 0.0]])
    for algo in ("accurate", "log"):
        y = nbdnn.softmax(x, 1, algo=algo)
        assert np.isnan(y[:3]).all()
        want = [-inf, -math.log(2), -math.log(2)] if algo == "log" else [0.0, 0.5, 0.5]
        np.testing.assert_allclose(y[3], want, rtol=1e-15)


def _fd_grad(f, x, h=1e-6):
    g = np.empty_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (f(xp) - f(xm)) / (2 * h)
    return g


@pytest.mark.parametrize("algo", ["fast", "accurate", "log"])
@pytest.mark.parametrize("x, axis", CASES[:5], ids=IDS[:5])
def test_softmax_backward_matches_finite_differences(x, axis, algo):
    w = RNG.standard_normal(x.shape)
    loss = lambda z: float((w * nbdnn.softmax(z, axis, algo=algo)).sum())  # noqa: E731
    y = nbdnn.softmax(x, axis, algo=algo)  # log: y is the log-softmax output
    dx = nbdnn.softmax_backward(w, y, axis, algo=algo)
    assert dx.shape == x.shape and dx.dtype == np.float64
    np.testing.assert_allclose(dx, _fd_grad(loss, x), rtol=1e-6, atol=1e-8)
    if algo != "log":  # gradient of a softmax sums to 0 along the axis
        np.testing.assert_allclose(dx.sum(axis=axis), 0.0, atol=1e-14)


def test_softmax_backward_matches_naive_loop():
    x, axis = X4, 2
    dy = RNG.standard_normal(x.shape)
    y, lg = nbdnn.softmax(x, axis), nbdnn.softmax(x, axis, algo="log")
    want, want_log = np.empty_like(x), np.empty_like(x)
    for row in _rows(x.shape, axis):
        s = sum(float(dy[i] * y[i]) for i in row)
        sd = sum(float(dy[i]) for i in row)
        for i in row:
            want[i] = y[i] * (dy[i] - s)
            want_log[i] = dy[i] - math.exp(lg[i]) * sd
    np.testing.assert_allclose(nbdnn.softmax_backward(dy, y, axis), want, rtol=1e-13,
                               atol=1e-15)
    np.testing.assert_allclose(nbdnn.softmax_backward(dy, lg, axis, algo="log"), want_log,
                               rtol=1e-13, atol=1e-15)


def test_alpha_beta_blend_and_out():
    x = X3
    y = nbdnn.softmax(x, 2)
    out = RNG.standard_normal(x.shape)
    want = 2.0 * y - 0.5 * out
    assert nbdnn.softmax(x, 2, alpha=2.0, beta=-0.5, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-14)
    dy = RNG.standard_normal(x.shape)
    dx = nbdnn.softmax_backward(dy, y, 2)
    out = RNG.standard_normal(x.shape)
    want = 0.5 * dx + 3.0 * out
    assert nbdnn.softmax_backward(dy, y, 2, alpha=0.5, beta=3.0, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-14)
    nan_out = np.full_like(x, np.nan)  # beta == 0: out written, never read
    np.testing.assert_allclose(nbdnn.softmax(x, 2, out=nan_out), y)


def test_default_axis_is_channel():
    x = X4
    np.testing.assert_allclose(nbdnn.softmax(x), _naive(x, 1, "accurate"), rtol=1e-13)
