"""Bad pooling calls raise the documented NbdnnError subclass naming the parameter."""
import numpy as np
import pytest

import nbdnn
from nbdnn import BadParamError, DtypeError, ShapeError

X = np.ones((1, 2, 5, 5), np.float32)
DY = np.ones((1, 2, 2, 2), np.float32)


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.pool2d(X, 6), ShapeError, "kernel"),                 # window > input
    (lambda: nbdnn.pool2d(X, 3, dilation=3), ShapeError, "kernel"),     # dilated window
    (lambda: nbdnn.pool2d(X, 2, stride=0), BadParamError, "stride"),
    (lambda: nbdnn.pool2d(X, 0), BadParamError, "kernel"),
    (lambda: nbdnn.pool2d(X, (2, 2, 2)), BadParamError, "kernel"),
    (lambda: nbdnn.pool2d(X, 2, padding=-1), BadParamError, "padding"),
    (lambda: nbdnn.pool2d(X, 2, mode="median"), BadParamError, "mode"),
    (lambda: nbdnn.pool2d(X, 2, ceil_mode=1), BadParamError, "ceil_mode"),
    (lambda: nbdnn.pool2d(X, 2, nan_propagation="yes"), BadParamError, "nan_propagation"),
    (lambda: nbdnn.pool2d(X, 2, layout="NCW"), BadParamError, "layout"),
    (lambda: nbdnn.pool2d(X[0], 2), ShapeError, "x.ndim"),
    (lambda: nbdnn.pool2d(X.astype(np.int32), 2), DtypeError, "x"),
    (lambda: nbdnn.pool2d(X, 2, out=np.ones((1, 2, 3, 3), np.float32)), ShapeError,
     "out.shape"),
    (lambda: nbdnn.pool_backward(DY, X, 2, stride=1), ShapeError, "dy.shape"),
    (lambda: nbdnn.pool_backward(DY.astype(np.float64), X, 2), DtypeError, "dy"),
    (lambda: nbdnn.pool_backward(DY, X[0, 0], 2), ShapeError, "x.ndim"),
    (lambda: nbdnn.pool2d(X, 2, divisor=3), BadParamError, "divisor"),  # (mode max)
    (lambda: nbdnn.pool2d(X, 2, mode="avg", divisor=0), BadParamError, "divisor"),
    (lambda: nbdnn.pool2d(X, 2, mode="avg", divisor=2.0), BadParamError, "divisor"),
    (lambda: nbdnn.pool2d(X, 2, mode="avg", divisor=True), BadParamError, "divisor"),
    (lambda: nbdnn.pool_backward(DY, X, 2, mode="avg", divisor=0), BadParamError, "divisor"),
    (lambda: nbdnn.pool_indices(X, 6), ShapeError, "kernel"),
    (lambda: nbdnn.pool_indices(X[0, 0], 2), ShapeError, "x.ndim"),
    (lambda: nbdnn.pool_indices(X.astype(np.int32), 2), DtypeError, "x"),
    (lambda: nbdnn.pool_indices(X, 2, out=np.ones((1, 2, 2, 2), np.float32)), DtypeError,
     "out.dtype"),
    (lambda: nbdnn.pool_indices(X, 2, mode="avg"), TypeError, "mode"),  # (max only)
])
def test_bad_pool_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)


def test_empty_batch_gives_an_empty_output():
    y = nbdnn.pool2d(np.ones((0, 2, 4, 4), np.float32), 2)
    assert y.shape == (0, 2, 2, 2)
