"""Bad batch-norm and LRN calls raise the documented NbdnnError subclass naming the
parameter."""
import numpy as np
import pytest

import nbdnn
from nbdnn import BadParamError, DtypeError, ShapeError

X = np.ones((2, 3, 4), np.float32)
P = np.ones(3, np.float32)
S = np.ones(3, np.float32)
X16 = X.astype(np.float16)


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.batch_norm_train(X, P, P, eps=0.0), BadParamError, "eps"),
    (lambda: nbdnn.batch_norm_train(X, P, P, eps=-1e-5), BadParamError, "eps"),
    (lambda: nbdnn.batch_norm_train(X, P, P, momentum=1.5), BadParamError, "momentum"),
    (lambda: nbdnn.batch_norm_train(X, P, P, momentum=-0.1), BadParamError, "momentum"),
    (lambda: nbdnn.batch_norm_train(X, np.ones(4, np.float32)), ShapeError, "scale.shape"),
    (lambda: nbdnn.batch_norm_train(X, P.astype(np.float64)), DtypeError, "scale"),
    (lambda: nbdnn.batch_norm_train(X, P, P, np.ones(3, np.float16)), DtypeError,
     "running_mean.dtype"),
    (lambda: nbdnn.batch_norm_train(X, P, P, np.ones(4, np.float32)), ShapeError,
     "running_mean.shape"),
    (lambda: nbdnn.batch_norm_train(X, mode="per_channel"), BadParamError, "mode"),
    (lambda: nbdnn.batch_norm_train(X, layout="NCDHW"), BadParamError, "layout"),
    (lambda: nbdnn.batch_norm_train(X[0, 0]), ShapeError, "x.ndim"),
    (lambda: nbdnn.batch_norm_train(X[:0]), ShapeError, "x.shape"),
    (lambda: nbdnn.batch_norm_train(X, residual=np.ones((2, 3), np.float32)), ShapeError,
     "residual"),
    (lambda: nbdnn.batch_norm_train(X, activation="softmax"), BadParamError, "activation"),
    (lambda: nbdnn.batch_norm_infer(X, P, P, S, S.astype(np.float64)), DtypeError, "var.dtype"),
    (lambda: nbdnn.batch_norm_infer(X, P, P, S, np.ones(2, np.float32)), ShapeError,
     "var.shape"),
    (lambda: nbdnn.batch_norm_backward(X, X, P, S, S, out=(X,)), BadParamError, "out"),
    (lambda: nbdnn.batch_norm_backward(X[:1], X, P, S, S), ShapeError, "dy"),
    (lambda: nbdnn.batch_norm_train(X, P, P, mode="per_activation"), ShapeError, "scale.shape"),
    # parameters: x's dtype, or float32 beside 16-bit x, one dtype for both
    (lambda: nbdnn.batch_norm_train(X, P.astype(np.float16)), DtypeError, "float32 like x"),
    (lambda: nbdnn.batch_norm_train(X16, P.astype(np.float64)), DtypeError,
     "float16 like x or float32"),
    (lambda: nbdnn.batch_norm_train(X16, P, P.astype(np.float16)), DtypeError, "bias.dtype"),
    (lambda: nbdnn.batch_norm_infer(X16, None, P.astype(np.float16) * 0, S, S, out=X16[:1]),
     ShapeError, "out"),
    (lambda: nbdnn.batch_norm_backward(X16, X16, P, S, S, out=(X16.copy(),
                                                               P.astype(np.float16), P.copy())),
     DtypeError, "out[1]"),
])
def test_bad_batch_norm_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.lrn(X, 0), BadParamError, "n"),
    (lambda: nbdnn.lrn(X, 17), BadParamError, "n"),
    (lambda: nbdnn.lrn(X, 5, beta=0.0), BadParamError, "beta"),
    (lambda: nbdnn.lrn(X, 5, k=0.0), BadParamError, "k"),
    (lambda: nbdnn.lrn(X, 5, layout="NCW"), BadParamError, "layout"),
    (lambda: nbdnn.lrn(X[0], 5), ShapeError, "x.ndim"),
    (lambda: nbdnn.lrn_backward(X[:1], X), ShapeError, "dy"),
    (lambda: nbdnn.lrn_backward(X.astype(np.float64), X), DtypeError, "dy"),
])
def test_bad_lrn_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)
