"""Activation forward and backward: one elementwise kernel per (mode, direction, dtype).

Traffic per element (float32): forward reads x and writes y (8 B; +4 B when beta != 0
reads y); backward reads dy and x and writes dx (12 B). A few flops per element, so
both are bound by memory bandwidth (H200: ~4 TB/s copy). Each thread moves GROUPS
vectors of 4 elements with 16-byte loads/stores (`load4`/`store4`): with one scalar
per thread a 1 GiB ReLU reached 61% of copy bandwidth, with 4 scalars 92%; the
vector accesses halve the instruction count again. Unaligned views (pointer not a
multiple of 16 B) and the tail take the scalar path inside the same kernel.

Arithmetic runs in float32 for float16/float32 storage and float64 for float64. The
formulas are written to stay finite for |x| up to 1e4 and beyond (sigmoid by the sign
of x, softplus as max(z, 0) + log1p(exp(-|z|)), gelu_tanh's derivative saturated past
|x| > 10) and to propagate NaN as the CPU reference does (`0 if x < 0 else x`).
"""
import math

import numpy as np
from numba import cuda, float32, float64

from ._intrinsics import load4, store4, vector_alignment
from ._launch import Kernel
from ._arrays import dtype_name, empty, ptr, size

MODES = ("relu", "leaky_relu", "clipped_relu", "elu", "sigmoid", "tanh", "swish",
         "gelu", "gelu_tanh", "softplus", "identity")
DTYPES = ("float16", "float32", "float64")
BLOCK = 256
GROUPS = 2  # 4-element vectors per thread


def _device_functions(t):
    """mode -> (forward(x, c), derivative(x, c)) device functions in compute type t."""
    zero, one, half = t(0), t(1), t(0.5)
    inv_sqrt2, inv_sqrt_2pi = t(1 / math.sqrt(2)), t(1 / math.sqrt(2 * math.pi))
    k_tanh, k_cubic, k_cubic3 = t(math.sqrt(2 / math.pi)), t(0.044715), t(3 * 0.044715)
    ten = t(10)
    dev = cuda.jit(device=True)

    @dev
    def sigmoid(x):
        e = math.exp(-abs(x))
        s = one / (one + e)
        return s if x >= zero else e * s

    fns = {
        "identity": (lambda x, c: x, lambda x, c: one),
        "relu": (lambda x, c: zero if x < zero else x,
                 lambda x, c: zero if x <= zero else one),
        "leaky_relu": (lambda x, c: x * c if x < zero else x,
                       lambda x, c: one if x > zero else c),
        "clipped_relu": (lambda x, c: zero if x < zero else (c if x > c else x),
                         lambda x, c: one if (x > zero and x < c) else zero),
        "elu": (lambda x, c: x if x > zero else c * math.expm1(x),
                lambda x, c: one if x > zero else c * math.exp(x)),
        "sigmoid": (lambda x, c: sigmoid(x),
                    lambda x, c: sigmoid(x) * (one - sigmoid(x))),
        "tanh": (lambda x, c: math.tanh(x),
                 lambda x, c: one - math.tanh(x) * math.tanh(x)),
        "swish": (lambda x, c: x * sigmoid(c * x),
                  lambda x, c: sigmoid(c * x) * (one + c * x * (one - sigmoid(c * x)))),
        "gelu": (lambda x, c: half * x * (one + math.erf(x * inv_sqrt2)),
                 lambda x, c: (half * (one + math.erf(x * inv_sqrt2))
                               + x * inv_sqrt_2pi * math.exp(-half * x * x))),
        "gelu_tanh": (
            lambda x, c: half * x * (one + math.tanh(k_tanh * (x + k_cubic * x * x * x))),
            lambda x, c: ((one if x > zero else zero) if abs(x) > ten else
                          _gelu_tanh_grad(x, half, one, k_tanh, k_cubic, k_cubic3))),
        "softplus": (lambda x, c: ((c * x if c * x > zero else zero)
                                   + math.log1p(math.exp(-abs(c * x)))) / c,
                     lambda x, c: sigmoid(c * x)),
    }
    return {m: (dev(f), dev(d)) for m, (f, d) in fns.items()}


def _gelu_tanh_grad(x, half, one, k, k3, k33):
    th = math.tanh(k * (x + k3 * x * x * x))
    return half * (one + th) + half * x * (one - th * th) * k * (one + k33 * x * x)


_gelu_tanh_grad = cuda.jit(device=True)(_gelu_tanh_grad)


def _forward_kernel(f, ct):
    # x, y: (n,) flat; y = alpha * f(x) + beta * y
    def activation_forward(x, y, n, alpha, beta, coef, aligned):
        g0 = cuda.blockIdx.x * (GROUPS * BLOCK) + cuda.threadIdx.x
        for j in range(GROUPS):
            g = g0 + j * BLOCK
            i = g * 4
            if aligned != 0 and i + 4 <= n:
                a0, a1, a2, a3 = load4(x, g)
                r0, r1, r2 = alpha * f(ct(a0), coef), alpha * f(ct(a1), coef), alpha * f(ct(a2), coef)
                r3 = alpha * f(ct(a3), coef)
                if beta != 0:
                    b0, b1, b2, b3 = load4(y, g)
                    r0, r1, r2, r3 = (r0 + beta * ct(b0), r1 + beta * ct(b1),
                                      r2 + beta * ct(b2), r3 + beta * ct(b3))
                store4(y, g, (r0, r1, r2, r3))
            else:
                for e in range(i, min(i + 4, n)):
                    r = alpha * f(ct(x[e]), coef)
                    if beta != 0:
                        r += beta * ct(y[e])
                    y[e] = r
    return activation_forward


def _backward_kernel(d, ct):
    # dy, x, dx: (n,) flat; dx = alpha * dy * f'(x) + beta * dx
    def activation_backward(dy, x, dx, n, alpha, beta, coef, aligned):
        g0 = cuda.blockIdx.x * (GROUPS * BLOCK) + cuda.threadIdx.x
        for j in range(GROUPS):
            g = g0 + j * BLOCK
            i = g * 4
            if aligned != 0 and i + 4 <= n:
                a0, a1, a2, a3 = load4(x, g)
                d0, d1, d2, d3 = load4(dy, g)
                r0 = alpha * ct(d0) * d(ct(a0), coef)
                r1 = alpha * ct(d1) * d(ct(a1), coef)
                r2 = alpha * ct(d2) * d(ct(a2), coef)
                r3 = alpha * ct(d3) * d(ct(a3), coef)
                if beta != 0:
                    b0, b1, b2, b3 = load4(dx, g)
                    r0, r1, r2, r3 = (r0 + beta * ct(b0), r1 + beta * ct(b1),
                                      r2 + beta * ct(b2), r3 + beta * ct(b3))
                store4(dx, g, (r0, r1, r2, r3))
            else:
                for e in range(i, min(i + 4, n)):
                    r = alpha * ct(dy[e]) * d(ct(x[e]), coef)
                    if beta != 0:
                        r += beta * ct(dx[e])
                    dx[e] = r
    return activation_backward


def _compute_type(dtype):
    return "float64" if dtype == "float64" else "float32"


def _build():
    fwd, bwd = {}, {}
    for ct_name, ct, npt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        fns = _device_functions(npt)
        dts = [d for d in DTYPES if _compute_type(d) == ct_name]
        for mode, (f, d) in fns.items():
            fsigs = [f"void({t}[::1], {t}[::1], int64, {ct_name}, {ct_name}, {ct_name}, int64)"
                     for t in dts]
            bsigs = [f"void({t}[::1], {t}[::1], {t}[::1], int64, {ct_name}, {ct_name}, "
                     f"{ct_name}, int64)" for t in dts]
            for t, fs, bs in zip(dts, fsigs, bsigs):
                fwd[mode, t] = (Kernel(_forward_kernel(f, ct), [fs]), fs)
                bwd[mode, t] = (Kernel(_backward_kernel(d, ct), [bs]), bs)
    return fwd, bwd


_FORWARD, _BACKWARD = _build()


def _grid(n):
    return max(1, -(-n // (4 * GROUPS * BLOCK)))


def _aligned(itemsize, *arrays):
    a = vector_alignment(itemsize)
    return int(all(ptr(x) % a == 0 for x in arrays))


def activation(x, mode, coef, *, alpha, beta, out, stream):
    """y = alpha * act(x) + beta * out; x contiguous (ops made it so)."""
    dtype = dtype_name(x)
    kernel, sig = _FORWARD[mode, dtype]
    y = out if out is not None else empty(x, x.shape, dtype)
    n = size(x)
    if n:
        kernel.launch(sig, _grid(n), BLOCK, stream, x, y, n, alpha, beta, coef,
                      _aligned(np.dtype(dtype).itemsize, x, y))
    return y


def activation_backward(dy, x, mode, coef, *, alpha, beta, out, stream):
    """dx = alpha * dy * act'(x) + beta * out."""
    dtype = dtype_name(x)
    kernel, sig = _BACKWARD[mode, dtype]
    dx = out if out is not None else empty(x, x.shape, dtype)
    n = size(x)
    if n:
        kernel.launch(sig, _grid(n), BLOCK, stream, dy, x, dx, n, alpha, beta, coef,
                      _aligned(np.dtype(dtype).itemsize, dy, x, dx))
    return dx
