"""Bad dropout calls raise the documented NbdnnError subclass."""
import numpy as np
import pytest

import nbdnn
from nbdnn import BadParamError, DtypeError, ShapeError

X = np.ones((2, 3), np.float32)
M = np.ones((2, 3), np.uint8)


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.dropout(X, 1.5, seed=0), BadParamError, "p"),
    (lambda: nbdnn.dropout(X, -0.1, seed=0), BadParamError, "p"),
    (lambda: nbdnn.dropout(X, float("nan"), seed=0), BadParamError, "p"),
    (lambda: nbdnn.dropout(X, 0.5, seed=-1), BadParamError, "seed"),
    (lambda: nbdnn.dropout(X, 0.5, seed=2 ** 64), BadParamError, "seed"),
    (lambda: nbdnn.dropout(X, 0.5, seed=1.0), BadParamError, "seed"),
    (lambda: nbdnn.dropout(X, 0.5, seed=0, offset=-3), BadParamError, "offset"),
    (lambda: nbdnn.dropout(X, 0.5, seed=0, offset=1.5), BadParamError, "offset"),
    (lambda: nbdnn.dropout(X, 0.5, seed=0, offset=np.zeros(1, np.int64)), DtypeError,
     "offset"),
    (lambda: nbdnn.dropout(X, 0.5, seed=0, offset=np.zeros(2, np.uint64)), ShapeError,
     "offset.shape"),
    (lambda: nbdnn.dropout(X.astype(np.int32), 0.5, seed=0), DtypeError, "x"),
    (lambda: nbdnn.dropout(X, 0.5, seed=0, out=np.ones(6, np.float32)), ShapeError,
     "out.shape"),
    (lambda: nbdnn.dropout_backward(X, M.astype(np.float32), 0.5), DtypeError, "mask.dtype"),
    (lambda: nbdnn.dropout_backward(X, np.ones((3, 2), np.uint8), 0.5), ShapeError,
     "mask.shape"),
])
def test_bad_dropout_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)
