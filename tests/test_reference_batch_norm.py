"""The batch-norm reference (nbdnn/cpu/batch_norm.py): its statistics against NumPy's
in float64, float32 accuracy at mean 1e4 / std 1, a batch of one per channel, the
running-statistics update, backward against finite differences, the CUDA backend's
in-place running statistics, and PyTorch's batch_norm where it is installed."""
import numpy as np
import pytest

import nbdnn


def _fd(f, x, i, eps=1e-6):
    xp, xm = x.copy(), x.copy()
    xp[i] += eps
    xm[i] -= eps
    return (f(xp) - f(xm)) / (2 * eps)


def test_statistics_and_running_update_match_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 5, 2))
    rm, rv = np.zeros(3), np.ones(3)
    y, mean, invstd = nbdnn.batch_norm_train(x, None, None, rm, rv, momentum=0.25)
    want_mean, want_var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(mean, want_mean, rtol=1e-14)
    np.testing.assert_allclose(invstd, 1 / np.sqrt(want_var + 1e-5), rtol=1e-14)
    np.testing.assert_allclose(rm, 0.25 * want_mean, rtol=1e-14)
    np.testing.assert_allclose(rv, 0.75 + 0.25 * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-14)
    np.testing.assert_allclose(y, (x - want_mean[:, None, None]) *
                               (1 / np.sqrt(want_var + 1e-5))[:, None, None], rtol=1e-12)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_large_mean_keeps_float32_accuracy(backend):
    x = (1e4 + np.random.default_rng(1).standard_normal((64, 2, 16))).astype(np.float32)
    _, mean, invstd = nbdnn.batch_norm_train(x, backend=backend)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(invstd, 1 / np.sqrt(x64.var(axis=(0, 2)) + 1e-5), rtol=1e-4)
    np.testing.assert_allclose(mean, x64.mean(axis=(0, 2)), rtol=1e-6)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_batch_of_one_per_channel(backend):
    x = np.array([[1.5], [-2.0]]).reshape(1, 2, 1)
    rm, rv = np.zeros(2), np.ones(2)
    y, mean, invstd = nbdnn.batch_norm_train(x, None, None, rm, rv, backend=backend)
    np.testing.assert_array_equal(y, 0)
    np.testing.assert_allclose(mean, [1.5, -2.0])
    np.testing.assert_allclose(rv, 0.9)  # M = 1: the biased variance, 0, enters


@pytest.mark.parametrize("mode", ["spatial", "per_activation"])
@pytest.mark.parametrize("act", [None, "elu"])
def test_backward_is_the_derivative(mode, act):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 2, 4))
    ps = (2,) if mode == "spatial" else (2, 4)
    scale, bias, z = rng.standard_normal(ps), rng.standard_normal(ps), rng.standard_normal(x.shape)
    dy = rng.standard_normal(x.shape)
    kw = dict(mode=mode, activation=act)

    def loss(x_, scale_=scale, bias_=bias, z_=z):
        return (nbdnn.batch_norm_train(x_, scale_, bias_, residual=z_, **kw)[0] * dy).sum()
    _, mean, invstd = nbdnn.batch_norm_train(x, scale, bias, residual=z, **kw)
    dx, dscale, dbias, dz = nbdnn.batch_norm_backward(dy, x, scale, mean, invstd, bias=bias,
                                                      residual=z, **kw)
    for i in [(0, 1, 2), (2, 0, 3)]:
        assert abs(_fd(loss, x, i) - dx[i]) < 1e-6
        assert abs(_fd(lambda z_: loss(x, z_=z_), z, i) - dz[i]) < 1e-6
    j = (1,) if mode == "spatial" else (1, 3)
    assert abs(_fd(lambda s: loss(x, scale_=s), scale, j) - dscale[j]) < 1e-6
    assert abs(_fd(lambda b: loss(x, bias_=b), bias, j) - dbias[j]) < 1e-6


def test_against_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((4, 3, 5, 5)), rng.standard_normal(3), rng.standard_normal(3)
    rm, rv = np.zeros(3), np.ones(3)
    trm, trv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    want = torch.nn.functional.batch_norm(torch.from_numpy(x), trm, trv, torch.from_numpy(w),
                                          torch.from_numpy(b), training=True, momentum=0.1)
    y, _, _ = nbdnn.batch_norm_train(x, w, b, rm, rv, momentum=0.1)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rm, trm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(rv, trv.numpy(), rtol=1e-12)
