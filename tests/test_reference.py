"""The CPU reference against independent truth: scalar `math` formulas in loops,
finite-difference gradients in float64, identities."""
import math

import numpy as np
import pytest

import nbdnn
from nbdnn.ops.activation import MODES, DEFAULT_COEF


def _naive(mode, x, c):
    """One scalar of each activation, written the textbook way with math.*."""
    if mode == "relu":
        return max(x, 0.0)
    if mode == "leaky_relu":
        return x if x >= 0 else c * x
    if mode == "clipped_relu":
        return min(max(x, 0.0), c)
    if mode == "clamp":
        return min(max(x, -c), c)
    if mode == "elu":
        return x if x > 0 else c * (math.exp(x) - 1)
    if mode == "sigmoid":
        return 1 / (1 + math.exp(-x))
    if mode == "tanh":
        return math.tanh(x)
    if mode == "swish":
        return x / (1 + math.exp(-c * x))
    if mode == "gelu":
        return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))
    if mode == "gelu_tanh":
        return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if mode == "softplus":
        return math.log(1 + math.exp(c * x)) / c
    if mode == "hardswish":
        return x * min(max(x + 3, 0.0), 6.0) / 6
    if mode == "hardsigmoid":
        return min(max(x + 3, 0.0), 6.0) / 6
    return x


X = np.linspace(-7.3, 7.1, 97)


@pytest.mark.parametrize("mode", MODES)
def test_activation_matches_naive_loop(mode):
    c = DEFAULT_COEF.get(mode, 0.0)
    got = nbdnn.activation(X, mode)
    want = np.array([_naive(mode, float(v), c) for v in X])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_activation_backward_matches_finite_differences(mode):
    c = {"leaky_relu": 0.3, "clipped_relu": 2.5, "elu": 0.7, "swish": 1.3,
         "softplus": 2.0, "clamp": 2.5}.get(mode)
    x = X[np.abs(X) > 1e-3]  # away from the kinks at 0 (and +-2.5: clipped_relu, clamp)
    x = x[np.abs(np.abs(x) - 2.5) > 1e-3]
    dy = np.cos(x)
    h = 1e-6
    fd = (nbdnn.activation(x + h, mode, coef=c) - nbdnn.activation(x - h, mode, coef=c)) / (2 * h)
    got = nbdnn.activation_backward(dy, x, mode=mode, coef=c)
    np.testing.assert_allclose(got, dy * fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", ["sigmoid", "softplus", "elu", "swish", "gelu", "gelu_tanh",
                                  "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activation_is_finite_at_large_inputs(mode, dtype):
    x = np.array([-1e4, -100.0, 100.0, 1e4], dtype)
    assert np.isfinite(nbdnn.activation(x, mode)).all()
    assert np.isfinite(nbdnn.activation_backward(np.ones_like(x), x, mode=mode)).all()
    want = {"sigmoid": [0, 0, 1, 1], "softplus": [0, 0, 100, 1e4], "tanh": [-1, -1, 1, 1]}
    if mode in want:
        np.testing.assert_allclose(nbdnn.activation(x, mode), want[mode], rtol=1e-6, atol=1e-30)


def test_alpha_beta_blend_and_out():
    x = np.linspace(-2, 2, 11)
    out = np.full_like(x, 3.0)
    y = nbdnn.activation(x, "relu", alpha=2.0, beta=0.5, out=out)
    assert y is out
    np.testing.assert_allclose(y, 2 * np.maximum(x, 0) + 1.5)
    nan_out = np.full_like(x, np.nan)  # beta == 0: out is written, never read
    np.testing.assert_allclose(nbdnn.activation(x, "relu", out=nan_out), np.maximum(x, 0))
