"""The convolution reference (nbdnn/cpu/conv.py) against naive loops and finite
differences in float64: every geometry parameter, both modes, both layouts, 1-3 d."""
import numpy as np
import pytest

import nbdnn

RNG = np.random.default_rng(3)
CONV = {1: nbdnn.conv1d, 2: nbdnn.conv2d, 3: nbdnn.conv3d}


def _naive(x, w, stride, pads, dilation, groups, mode):
    """Channels-first loops straight from the definition."""
    N, C = x.shape[:2]
    K, Cg = w.shape[:2]
    S, R = x.shape[2:], w.shape[2:]
    if mode == "convolution":
        w = np.flip(w, axis=tuple(range(2, w.ndim)))
    P = tuple((s + a + b - d * (r - 1) - 1) // st + 1
              for s, (a, b), d, r, st in zip(S, pads, dilation, R, stride))
    y = np.zeros((N, K) + P)
    for n, k in np.ndindex(N, K):
        g = k // (K // groups)
        for p in np.ndindex(*P):
            acc = 0.0
            for c in range(Cg):
                for r in np.ndindex(*R):
                    pos = [pi * st + ri * d - a for pi, st, ri, d, (a, _) in
                           zip(p, stride, r, dilation, pads)]
                    if all(0 <= q < s for q, s in zip(pos, S)):
                        acc += x[(n, g * Cg + c) + tuple(pos)] * w[(k, c) + r]
            y[(n, k) + p] = acc
    return y


CASES = [  # nd, x shape (N, C, *S), K, R, stride, padding, dilation, groups, mode
    (2, (2, 4, 6, 5), 6, (3, 2), (1, 1), 1, (1, 1), 1, "cross_correlation"),
    (2, (1, 4, 7, 7), 4, (3, 3), (2, 1), ((1, 0), (2, 1)), (2, 1), 2, "convolution"),
    (2, (1, 3, 5, 6), 6, (3, 3), 1, 1, 1, 3, "cross_correlation"),      # depthwise x2
    (1, (2, 3, 9), 2, (4,), (2,), ((3, 1),), (2,), 1, "convolution"),
    (3, (1, 2, 4, 5, 3), 2, (2, 3, 1), (1, 2, 1), 1, (1, 1, 2), 2, "cross_correlation"),
]


def padding_pairs(padding, nd):
    if isinstance(padding, int):
        return ((padding, padding),) * nd
    return tuple(p if isinstance(p, tuple) else (p, p) for p in padding)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_forward_matches_naive_loops(case, layout):
    nd, xs, K, R, stride, padding, dilation, groups, mode = case
    x = RNG.standard_normal(xs)
    w = RNG.standard_normal((K, xs[1] // groups) + R)
    ref = _naive(x, w, stride if isinstance(stride, tuple) else (stride,) * nd,
                 padding_pairs(padding, nd), dilation if isinstance(dilation, tuple) else (dilation,) * nd,
                 groups, mode)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode,
              layout=layout)
    if layout == "NHWC":
        y = CONV[nd](np.moveaxis(x, 1, -1), np.moveaxis(w, 1, -1), **kw)
        y = np.moveaxis(y, -1, 1)
    else:
        y = CONV[nd](x, w, **kw)
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


def test_fused_epilogue():
    x, w = RNG.standard_normal((2, 3, 5, 5)), RNG.standard_normal((4, 3, 3, 3))
    bias, z = RNG.standard_normal(4), RNG.standard_normal((2, 4, 3, 3))
    conv = nbdnn.conv2d(x, w)
    y = nbdnn.conv2d(x, w, bias, residual=z, activation="relu", alpha=0.5, alpha2=2.0)
    np.testing.assert_allclose(y, np.maximum(0.5 * conv + 2 * z + bias[:, None, None], 0),
                               rtol=1e-13)
    out = z.copy()
    nbdnn.conv2d(x, w, alpha=2.0, beta=-1.0, out=out)
    np.testing.assert_allclose(out, 2 * conv - z, rtol=1e-13)


@pytest.mark.parametrize("case", CASES)
def test_backward_matches_finite_differences(case):
    nd, xs, K, R, stride, padding, dilation, groups, mode = case
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode)
    x = RNG.standard_normal(xs)
    w = RNG.standard_normal((K, xs[1] // groups) + R)
    g = RNG.standard_normal(CONV[nd](x, w, **kw).shape)
    dx = nbdnn.conv_backward_data(g, w, x.shape, **kw)
    dw = nbdnn.conv_backward_filter(g, x, w.shape, **kw)
    db = nbdnn.conv_backward_bias(g)
    np.testing.assert_allclose(db, g.sum(axis=(0,) + tuple(range(2, g.ndim))), rtol=1e-12)
    h = 1e-6
    for v, grad, loss in ((x, dx, lambda v: np.sum(g * CONV[nd](v, w, **kw))),
                          (w, dw, lambda v: np.sum(g * CONV[nd](x, v, **kw)))):
        num = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            vp, vm = v.copy(), v.copy()
            vp[idx] += h
            vm[idx] -= h
            num[idx] = (loss(vp) - loss(vm)) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_residual_is_added_with_weight_one(backend):
    """act(conv + bias + z), as batch_norm_infer adds its residual; alpha2 scales z;
    beta (which blends out) together with a residual is refused."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    b, z = rng.standard_normal(4), rng.standard_normal((2, 4, 4, 4))
    plain = nbdnn.conv2d(x, w, b)
    got = nbdnn.conv2d(x, w, b, residual=z, activation="relu", backend=backend)
    np.testing.assert_allclose(got, np.maximum(plain + z, 0), rtol=1e-12, atol=1e-12)
    got = nbdnn.conv2d(x, w, b, residual=z, alpha2=-0.5, backend=backend)
    np.testing.assert_allclose(got, plain - 0.5 * z, rtol=1e-12, atol=1e-12)
    with pytest.raises(nbdnn.NotSupportedError, match="residual"):
        nbdnn.conv2d(x, w, b, residual=z, beta=1.0, out=np.zeros_like(z), backend=backend)
    with pytest.raises(nbdnn.BadParamError, match="alpha2"):
        nbdnn.conv2d(x, w, b, alpha2=2.0, backend=backend)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_tf32_math_modes(backend):
    """float32's math modes (nbdnn/_math_mode.py) in the forward and both gradients:
    "tf32" equals the float64 convolution of TF32-rounded operands (to float32
    accumulation), "3xtf32" the float64 one of the operands as given (to float32
    accuracy, where TF32's rounding is ~1e-3 off); math_mode() sets it for calls
    without math=; a forced algorithm that does not run it is refused, and
    find_conv_algorithm offers "gemm" alone. cuda: im2col and the GEMM over
    tf32_parts' operands (on the H200: the tensor cores)."""
    from nbdnn.cpu.matmul import tf32
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    kw = dict(padding=1, stride=(2, 1), groups=2)
    dy = rng.standard_normal(nbdnn.conv2d(x, w, **kw).shape).astype(np.float32)
    ops = {"forward": (lambda a, b, **k: nbdnn.conv2d(a, b, **kw, **k), x, w),
           "data": (lambda a, b, **k: nbdnn.conv_backward_data(a, b, x.shape, **kw, **k),
                    dy, w),
           "filter": (lambda a, b, **k: nbdnn.conv_backward_filter(a, b, w.shape, **kw, **k),
                      dy, x)}
    for name, (f, a, b) in ops.items():
        exact = f(a.astype(np.float64), b.astype(np.float64))
        rounded = f(tf32(a).astype(np.float64), tf32(b).astype(np.float64))
        scale = np.abs(exact).max()
        got = f(a, b, math="tf32", backend=backend)
        assert np.abs(got - rounded).max() < 1e-5 * scale, name
        assert np.abs(rounded - exact).max() > 1e-4 * scale, name  # (not the ieee product)
        assert np.abs(f(a, b, math="3xtf32", backend=backend) - exact).max() < 1e-5 * scale
        if name == "forward":
            with nbdnn.math_mode("tf32"):
                np.testing.assert_array_equal(f(a, b, backend=backend), got)
    with pytest.raises(nbdnn.BadParamError, match="algo"):
        nbdnn.conv2d(x, w, math="tf32", algo="direct", backend=backend, **kw)
    if backend == "cpu":
        found = nbdnn.find_conv_algorithm(x, w, reps=1, math="3xtf32", **kw)
        assert [r["algo"] for r in found] == ["gemm"]
