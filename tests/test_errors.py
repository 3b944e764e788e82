"""Bad input of every kind gives the documented NbdnnError subclass, and the message
names the op, the parameter, what was expected and what was given."""
import numpy as np
import pytest

import nbdnn

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("call, err, words", [
    (lambda b: nbdnn.activation(X.astype(np.int32), "relu", backend=b), nbdnn.DtypeError,
     ["activation", "x", "float32", "int32"]),
    (lambda b: nbdnn.activation(X, "relu6", backend=b), nbdnn.BadParamError,
     ["activation", "mode", "relu6"]),
    (lambda b: nbdnn.activation(X, "softplus", coef=0.0, backend=b), nbdnn.BadParamError,
     ["softplus", "coef"]),
    (lambda b: nbdnn.activation(X, "elu", coef=float("nan"), backend=b), nbdnn.BadParamError,
     ["coef", "finite"]),
    (lambda b: nbdnn.activation(X, "relu", out=np.empty((4, 3), np.float32), backend=b),
     nbdnn.ShapeError, ["out.shape", "(3, 4)", "(4, 3)"]),
    (lambda b: nbdnn.activation(X, "relu", out=np.empty((3, 4)), backend=b),
     nbdnn.DtypeError, ["out.dtype", "float32", "float64"]),
    (lambda b: nbdnn.activation(X, "relu", out=np.empty((3, 8), np.float32)[:, ::2], backend=b),
     nbdnn.BadParamError, ["out", "C-contiguous"]),
    (lambda b: nbdnn.activation([1.0, 2.0], "relu", backend=b), nbdnn.BadParamError,
     ["activation", "x", "list"]),
    (lambda b: nbdnn.activation(X, "relu", alpha="2", backend=b), nbdnn.BadParamError,
     ["alpha", "real number"]),
    (lambda b: nbdnn.activation_backward(X, X[:2], mode="relu", backend=b), nbdnn.ShapeError,
     ["activation_backward", "dy.shape", "(2, 4)", "(3, 4)"]),
    (lambda b: nbdnn.activation_backward(X, X.astype(np.float64), mode="relu", backend=b),
     nbdnn.DtypeError, ["activation_backward", "dtype"]),
    (lambda b: nbdnn.activation(X, "relu", backend="gpu"), nbdnn.BadParamError,
     ["backend", "'gpu'"]),
])
def test_bad_input(call, err, words, backend):
    with pytest.raises(err) as e:
        call(backend)
    for w in words:
        assert w in str(e.value), f"{w!r} not in {str(e.value)!r}"


def test_errors_are_standard_exceptions_too():
    assert issubclass(nbdnn.ShapeError, ValueError)
    assert issubclass(nbdnn.DtypeError, TypeError)
    assert issubclass(nbdnn.BadParamError, ValueError)


@pytest.mark.parametrize("mode", ["relu", "sigmoid", "gelu", "softplus", "elu", "tanh"])
def test_nan_and_inf_propagate_like_the_reference(mode):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0], np.float32)
    ref = nbdnn.activation(x, mode)
    gpu = nbdnn.activation(x, mode, backend="cuda")
    np.testing.assert_array_equal(np.isnan(gpu), np.isnan(ref))
    np.testing.assert_allclose(gpu[~np.isnan(ref)], ref[~np.isnan(ref)], rtol=1e-6)


@pytest.mark.parametrize("call", [
    lambda x: nbdnn.activation(x, beta=1.0),
    lambda x: nbdnn.activation_backward(x, x, beta=0.5),
    lambda x: nbdnn.softmax(x, beta=1.0),
    lambda x: nbdnn.pool2d(x, 2, beta=1.0),
    lambda x: nbdnn.batch_norm_infer(x, *[np.ones(2, np.float32)] * 4, beta=1.0),
    lambda x: nbdnn.matmul(x[0, 0], x[0, 0], beta=1.0),
    lambda x: nbdnn.conv2d(x, np.ones((2, 2, 1, 1), np.float32), beta=1.0),
    lambda x: nbdnn.conv_backward_data(x, np.ones((2, 2, 1, 1), np.float32), x.shape,
                                       beta=1.0),
], ids=["activation", "activation_backward", "softmax", "pool2d", "batch_norm_infer",
        "matmul", "conv2d", "conv_backward_data"])
def test_beta_without_out_is_an_error(call):
    """beta != 0 blends into out=, so it needs one (was: an AttributeError on the CPU and
    uninitialised memory blended in on the GPU)."""
    x = np.ones((1, 2, 4, 4), np.float32)
    with pytest.raises(nbdnn.BadParamError, match="beta"):
        call(x)
