"""The LRN reference (nbdnn/cpu/lrn.py) against naive loops over the channel window
(odd and even n, both layouts), its backward against finite differences, and
PyTorch's LocalResponseNorm where it is installed."""
import numpy as np
import pytest

import nbdnn


def naive_lrn(x, n, alpha, beta, k):
    C = x.shape[1]
    y = np.empty_like(x)
    for c in range(C):
        lo, hi = max(0, c - n // 2), min(C, c + (n - 1) // 2 + 1)
        s = k + alpha / n * (x[:, lo:hi] ** 2).sum(axis=1)
        y[:, c] = x[:, c] * s ** -beta
    return y


@pytest.mark.parametrize("n", [1, 2, 5, 6])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_forward_matches_naive_loops(n, layout):
    x = np.random.default_rng(n).standard_normal((2, 7, 3, 2))
    want = naive_lrn(x, n, 0.7, 0.75, 1.5)
    if layout == "NHWC":
        got = np.moveaxis(nbdnn.lrn(np.moveaxis(x, 1, -1).copy(), n, 0.7, 0.75, 1.5,
                                    layout="NHWC"), -1, 1)
    else:
        got = nbdnn.lrn(x, n, 0.7, 0.75, 1.5)
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("n", [3, 4])
def test_backward_is_the_derivative(n):
    rng = np.random.default_rng(7)
    x, dy = rng.standard_normal((2, 6, 3)), rng.standard_normal((2, 6, 3))
    dx = nbdnn.lrn_backward(dy, x, n, 0.9, 0.6, 1.2)
    for i in [(0, 0, 1), (1, 3, 2), (0, 5, 0)]:
        xp, xm = x.copy(), x.copy()
        xp[i] += 1e-6
        xm[i] -= 1e-6
        num = ((nbdnn.lrn(xp, n, 0.9, 0.6, 1.2) - nbdnn.lrn(xm, n, 0.9, 0.6, 1.2)) * dy).sum()
        assert abs(num / 2e-6 - dx[i]) < 1e-6


def test_against_pytorch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(8).standard_normal((2, 9, 4, 4))
    for n in (5, 4):
        want = torch.nn.LocalResponseNorm(n, 0.3, 0.75, 2.0)(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(nbdnn.lrn(x, n, 0.3, 0.75, 2.0), want, rtol=1e-12)


@pytest.mark.parametrize("shape, last, n", [((2, 7, 3, 5), False, 5), ((2, 3, 4, 7), True, 5),
                                            ((3, 6, 4), False, 4), ((2, 3, 2), False, 7),
                                            ((1, 2, 9), True, 3)])
def test_cuda_matches_reference(shape, last, n):
    """Both kernels of the CUDA backward (terms, then the window sums) and the forward,
    channels first and last, even and odd windows, windows wider than C, against the
    float64 reference."""
    rng = np.random.default_rng(sum(shape) + n)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    kw = dict(n=n, alpha=0.3, beta=0.75, k=1.5, layout="NHWC" if last else "NCHW")
    want = nbdnn.lrn(x, **kw), nbdnn.lrn_backward(dy, x, **kw)
    got = (nbdnn.lrn(x.astype(np.float32), backend="cuda", **kw),
           nbdnn.lrn_backward(dy.astype(np.float32), x.astype(np.float32), backend="cuda", **kw))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
