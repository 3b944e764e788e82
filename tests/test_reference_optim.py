"""nbdnn.sgd_update's reference (nbdnn/cpu/optim.py): PyTorch's SGD step for step
(momentum, weight decay; float64), the mixed-precision parts (a float32 master behind a
16-bit parameter, a loss scaler's inv_scale and keep), and its errors."""
import numpy as np
import pytest

import nbdnn


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-2)])
def test_sgd_update_is_pytorchs_sgd(momentum, weight_decay):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((5, 7))
    grads = [rng.standard_normal((5, 7)) for _ in range(4)]
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.SGD([p], lr=0.1, momentum=momentum, weight_decay=weight_decay)
    w, v = w0.copy(), np.zeros_like(w0)
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
        nbdnn.sgd_update(w, g, v if momentum else None, lr=0.1, momentum=momentum,
                         weight_decay=weight_decay)
        np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-14, atol=1e-15)


def test_master_weights_inv_scale_and_keep():
    rng = np.random.default_rng(1)
    w = rng.standard_normal(64).astype(np.float32)
    g = rng.standard_normal(64).astype(np.float16)
    g[3], g[9] = np.inf, np.nan
    param, v = w.astype(np.float16), np.zeros(64, np.float32)
    inv, one = np.array([0.25], np.float32), np.array([1.0], np.float32)
    before = (w.copy(), v.copy(), param.copy())
    out = nbdnn.sgd_update(w, g, v, param, inv, np.array([0.0], np.float32), lr=0.5,
                           momentum=0.9)
    for a, b in zip(out, before):  # a skipped step: nothing changes, bit for bit
        assert a.tobytes() == b.tobytes()
    nbdnn.sgd_update(w, g, v, param, inv, one, lr=0.5, momentum=0.9)
    d = np.where(np.isfinite(g), g.astype(np.float32) * np.float32(0.25), 0)
    np.testing.assert_array_equal(v, d)
    np.testing.assert_array_equal(w, before[0] - np.float32(0.5) * d)  # (non-finite: 0)
    np.testing.assert_array_equal(param, w.astype(np.float16))


def test_sgd_update_errors():
    w, g = np.zeros(4, np.float32), np.zeros(4, np.float32)
    with pytest.raises(nbdnn.DtypeError, match="sgd_update: grad.dtype"):
        nbdnn.sgd_update(w, g.astype(np.float64), lr=0.1)
    with pytest.raises(nbdnn.DtypeError, match="sgd_update: w"):
        nbdnn.sgd_update(w.astype(np.float16), g.astype(np.float16), lr=0.1)
    with pytest.raises(nbdnn.ShapeError, match="sgd_update"):
        nbdnn.sgd_update(w, g[:3], lr=0.1)
    with pytest.raises(nbdnn.ShapeError, match="sgd_update: keep.shape"):
        nbdnn.sgd_update(w, g, keep=np.ones(2, np.float32), lr=0.1)
    with pytest.raises(nbdnn.BadParamError, match="sgd_update: lr"):
        nbdnn.sgd_update(w, g, lr=float("nan"))
    with pytest.raises(nbdnn.BadParamError, match="sgd_update: velocity"):
        nbdnn.sgd_update(w, g, np.zeros(8, np.float32)[::2], lr=0.1, momentum=0.9)
