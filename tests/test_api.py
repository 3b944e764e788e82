"""The calling convention: where a call runs, what comes back, out=/alpha/beta,
streams, and the errors every op shares."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import SIMULATOR
from nbdnn.cuda.runtime.memory import arrays as _arrays
from numba import cuda


def test_numpy_runs_on_cpu_and_returns_numpy():
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    y = nbdnn.activation(x, "relu")
    assert isinstance(y, np.ndarray) and y.dtype == np.float32


def test_forced_cuda_takes_and_returns_numpy():
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    y = nbdnn.activation(x, "tanh", backend="cuda")
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, np.tanh(x), rtol=1e-6)
    out = np.zeros_like(x)
    assert nbdnn.activation(x, "tanh", backend="cuda", out=out) is out
    np.testing.assert_allclose(out, np.tanh(x), rtol=1e-6)


def test_env_backend_moves_numpy_calls(monkeypatch):
    monkeypatch.setenv("NBDNN_BACKEND", "cuda")
    x = np.linspace(-1, 1, 5)
    np.testing.assert_allclose(nbdnn.activation(x, "sigmoid"), 1 / (1 + np.exp(-x)))
    monkeypatch.setenv("NBDNN_BACKEND", "tpu")
    with pytest.raises(nbdnn.BadParamError, match="NBDNN_BACKEND"):
        nbdnn.activation(x, "relu")


def test_device_arrays_stay_on_device():
    x = cuda.to_device(np.linspace(-1, 1, 9, dtype=np.float32))
    y = nbdnn.activation(x, "relu")
    assert _arrays.is_device(y)
    np.testing.assert_array_equal(y.copy_to_host(), np.maximum(x.copy_to_host(), 0))


def test_mixed_host_and_device_is_an_error():
    x = cuda.to_device(np.ones(4, np.float32))
    with pytest.raises(nbdnn.DeviceError, match="dy"):
        nbdnn.activation_backward(np.ones(4, np.float32), x, mode="relu")


def test_device_array_on_cpu_backend_is_an_error():
    with pytest.raises(nbdnn.DeviceError):
        nbdnn.activation(cuda.to_device(np.ones(4, np.float32)), "relu", backend="cpu")


def test_strided_device_input():
    h = np.arange(24, dtype=np.float32).reshape(4, 6) - 10
    x = cuda.to_device(h)[:, ::3]
    y = nbdnn.activation(x, "relu")
    np.testing.assert_array_equal(_arrays.to_host(y), np.maximum(h[:, ::3], 0))


def test_stream_argument():
    s = cuda.stream()
    x = cuda.to_device(np.linspace(-1, 1, 8, dtype=np.float32))
    y = nbdnn.activation(x, "relu", stream=s)
    s.synchronize()
    np.testing.assert_array_equal(y.copy_to_host(), np.maximum(x.copy_to_host(), 0))


def test_empty_tensors():
    x = np.zeros((0, 3), np.float32)
    assert nbdnn.activation(x, "relu").shape == (0, 3)
    assert nbdnn.activation(x, "relu", backend="cuda").shape == (0, 3)


@pytest.mark.skipif(SIMULATOR, reason="torch/cupy arrays need a real GPU")
def test_torch_and_cupy_zero_copy():
    torch = pytest.importorskip("torch")
    t = torch.linspace(-1, 1, 1000, device="cuda")
    y = nbdnn.activation(t, "relu")
    assert isinstance(y, torch.Tensor) and y.device == t.device
    assert torch.equal(y, torch.relu(t))
    out = torch.empty_like(t)
    assert nbdnn.activation(t, "relu", out=out) is out
    cupy = pytest.importorskip("cupy")
    c = cupy.linspace(-1, 1, 1000, dtype=cupy.float32)
    yc = nbdnn.activation(c, "relu")
    assert isinstance(yc, cupy.ndarray)
    assert bool((yc == cupy.maximum(c, 0)).all())
