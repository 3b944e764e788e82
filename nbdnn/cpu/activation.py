"""Activation functions and their derivatives, the spec of nbdnn.activation.

mode          y = f(x)                                  f'(x)                   coef
relu          max(x, 0)                                 [x > 0]                 -
leaky_relu    x if x >= 0 else c*x                      1 if x > 0 else c       slope (0.01)
clipped_relu  min(max(x, 0), c)                         [0 < x < c]             ceiling (6)
elu           x if x > 0 else c*(exp(x) - 1)            1 if x > 0 else c*e^x   alpha (1)
sigmoid       1 / (1 + exp(-x))                         s(1 - s)                -
tanh          tanh(x)                                   1 - tanh(x)^2           -
swish         x * sigmoid(c*x)                          s + c*x*s*(1 - s)       beta (1)
gelu          x * Phi(x) = x/2 (1 + erf(x/sqrt 2))      Phi(x) + x*phi(x)       -
gelu_tanh     x/2 (1 + tanh(k(x + 0.044715 x^3)))      (see _gelu_tanh_grad)   -
softplus      log(1 + exp(c*x)) / c                     sigmoid(c*x)            beta (1)
identity      x                                         1                       -
clamp         min(max(x, -c), c)                        [-c < x < c]            bound (1)
hardswish     x * min(max(x + 3, 0), 6) / 6             0 to -3, 1 from 3,      -
                                                        x/3 + 1/2 between
hardsigmoid   min(max(x + 3, 0), 6) / 6                 1/6 if -3 < x < 3       -

Stable forms: sigmoid by the sign of x, softplus as (max(z,0) + log1p(exp(-|z|)))/c,
gelu_tanh's derivative set to its limit (1 or 0) for |x| > 10. NaN propagates through
f; relu/clipped_relu/leaky_relu/clamp pass NaN through as PyTorch does. clamp is
PyTorch's hardtanh(x, -c, c) (its default: c = 1). hardswish and hardsigmoid are
PyTorch's (MobileNetV3's), their derivatives at the kinks as its backward takes them:
hardswish's 0 at -3 and 1 at 3 (x/3 + 1/2 strictly between), hardsigmoid's 0 at +-3.
"""
import math

import numpy as np
from scipy.special import erf

from ._common import blend, compute_dtype

K_TANH, K_CUBIC = math.sqrt(2 / math.pi), 0.044715


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    s = 1 / (1 + e)
    return np.where(x >= 0, s, e * s)


def _gelu_tanh_grad(x):
    with np.errstate(over="ignore", invalid="ignore"):
        th = np.tanh(K_TANH * (x + K_CUBIC * x ** 3))
        d = 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * K_TANH * (1 + 3 * K_CUBIC * x * x)
    return np.where(np.abs(x) > 10, (x > 0).astype(x.dtype), d)


def forward(x, mode, c):
    """f(x) elementwise in x's dtype (float32 or float64)."""
    one = x.dtype.type(1)
    with np.errstate(over="ignore", invalid="ignore"):
        if mode == "identity":
            return x.copy()
        if mode == "relu":
            return np.where(x < 0, 0, x).astype(x.dtype)
        if mode == "leaky_relu":
            return np.where(x < 0, x * c, x)
        if mode == "clipped_relu":
            return np.where(x < 0, 0, np.where(x > c, c, x)).astype(x.dtype)
        if mode == "clamp":
            return np.where(x < -c, -c, np.where(x > c, c, x)).astype(x.dtype)
        if mode == "elu":
            return np.where(x > 0, x, c * np.expm1(x))
        if mode == "sigmoid":
            return _sigmoid(x)
        if mode == "tanh":
            return np.tanh(x)
        if mode == "swish":
            return x * _sigmoid(c * x)
        if mode == "gelu":
            return 0.5 * x * (one + erf(x / x.dtype.type(math.sqrt(2))))
        if mode == "gelu_tanh":
            return 0.5 * x * (one + np.tanh(K_TANH * (x + K_CUBIC * x ** 3)))
        if mode == "softplus":
            z = c * x
            return (np.where(z < 0, 0, z) + np.log1p(np.exp(-np.abs(z)))) / c
        if mode in ("hardswish", "hardsigmoid"):
            six = x.dtype.type(6)
            r6 = np.where(x + 3 < 0, 0, np.where(x + 3 > six, six, x + 3)).astype(x.dtype)
            return x * r6 / six if mode == "hardswish" else r6 / six
    raise ValueError(mode)


def derivative(x, mode, c):
    """f'(x) elementwise."""
    with np.errstate(over="ignore", invalid="ignore"):
        if mode == "identity":
            return np.ones_like(x)
        if mode == "relu":
            return (~(x <= 0)).astype(x.dtype)
        if mode == "leaky_relu":
            return np.where(x > 0, 1, c).astype(x.dtype)
        if mode == "clipped_relu":
            return ((x > 0) & (x < c)).astype(x.dtype)
        if mode == "clamp":
            return ((x > -c) & (x < c)).astype(x.dtype)
        if mode == "elu":
            return np.where(x > 0, 1, c * np.exp(x)).astype(x.dtype)
        if mode == "sigmoid":
            s = _sigmoid(x)
            return s * (1 - s)
        if mode == "tanh":
            return 1 - np.tanh(x) ** 2
        if mode == "swish":
            s = _sigmoid(c * x)
            return s * (1 + c * x * (1 - s))
        if mode == "gelu":
            return (0.5 * (1 + erf(x / math.sqrt(2)))
                    + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)).astype(x.dtype)
        if mode == "gelu_tanh":
            return _gelu_tanh_grad(x)
        if mode == "softplus":
            return _sigmoid(c * x)
        if mode == "hardswish":
            return np.where(x <= -3, 0, np.where(x < 3, x / 3 + 0.5, 1)).astype(x.dtype)
        if mode == "hardsigmoid":
            return np.where((x > -3) & (x < 3), 1 / 6, 0).astype(x.dtype)
    raise ValueError(mode)


def activation(x, mode, coef, *, alpha, beta, out, stream=None):
    """y = alpha * f(x) + beta * out."""
    ct = compute_dtype(x.dtype)
    xc = x.astype(ct, copy=False)
    return blend(forward(xc, mode, ct(coef)), out, alpha, beta, x.dtype)


def activation_backward(dy, x, mode, coef, *, alpha, beta, out, stream=None):
    """dx = alpha * dy * f'(x) + beta * out."""
    ct = compute_dtype(x.dtype)
    xc = x.astype(ct, copy=False)
    return blend(dy.astype(ct) * derivative(xc, mode, ct(coef)), out, alpha, beta, x.dtype)
