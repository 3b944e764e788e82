"""Bad matmul calls raise the documented NbdnnError subclass, naming the parameter."""
import ml_dtypes
import numpy as np
import pytest

import nbdnn
from nbdnn import BadParamError, DtypeError, ShapeError

F32 = np.float32
BF16 = ml_dtypes.bfloat16
A, B = np.ones((3, 4), F32), np.ones((4, 5), F32)


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.matmul(np.ones(4, F32), B), ShapeError, "a.ndim"),
    (lambda: nbdnn.matmul(A, np.ones((3, 5), F32)), ShapeError, "b.shape"),
    (lambda: nbdnn.matmul(A, B, trans_a=True), ShapeError, "b.shape"),
    (lambda: nbdnn.matmul(np.ones((2, 3, 4), F32), np.ones((3, 4, 5), F32)), ShapeError,
     "batch axes"),
    (lambda: nbdnn.matmul(A, B.astype(np.float64)), DtypeError, "b.dtype"),
    (lambda: nbdnn.matmul(A.astype(BF16), B.astype(np.float16)), DtypeError, "b.dtype"),
    (lambda: nbdnn.matmul(A.astype(BF16), B.astype(BF16), bias=np.ones(5, F32)), DtypeError,
     "bias.dtype"),
    (lambda: nbdnn.matmul(A.astype(np.int32), B), DtypeError, "a"),
    (lambda: nbdnn.matmul(A, B, bias=np.ones(4, F32)), ShapeError, "bias.shape"),
    (lambda: nbdnn.matmul(A, B, bias=np.ones(5, np.float64)), DtypeError, "bias.dtype"),
    (lambda: nbdnn.matmul(A, B, activation="swishy"), BadParamError, "activation"),
    (lambda: nbdnn.matmul(A, B, trans_a=1), BadParamError, "trans_a"),
    (lambda: nbdnn.matmul(A, B, out=np.ones((3, 4), F32)), ShapeError, "out.shape"),
    (lambda: nbdnn.matmul_backward(np.ones((3, 4), F32), A, B), ShapeError, "dc.shape"),
    (lambda: nbdnn.matmul_backward(np.ones((3, 5), F32), A, B, out=(A,)), BadParamError,
     "out"),
    (lambda: nbdnn.matmul_backward(np.ones((3, 5), F32), A, B,
                                   out=(np.ones((4, 3), F32), B)), ShapeError, "out[0]"),
])
def test_bad_matmul_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)


def test_empty_operands_give_bias_and_zeros():
    a, b = np.ones((2, 0), F32), np.ones((0, 3), F32)
    bias = np.arange(3, dtype=F32)
    np.testing.assert_array_equal(nbdnn.matmul(a, b, bias=bias), np.tile(bias, (2, 1)))
    np.testing.assert_array_equal(nbdnn.matmul(a, b, bias=bias, backend="cuda"),
                                  np.tile(bias, (2, 1)))


def test_bfloat16_backward_sums_broadcast_batches_and_bias():
    """bfloat16 gradients that reduce_tensor sums (dbias, batch axes broadcast along
    both operands) run on CUDA and agree with the CPU reference (the per-matrix
    products round to bfloat16 before the sum, as float16's do: a few ulps)."""
    rng = np.random.default_rng(4)
    a, b = (rng.uniform(-1, 1, s).astype(BF16) for s in ((2, 1, 3, 4), (3, 4, 5)))
    dc = rng.uniform(-1, 1, (2, 3, 3, 5)).astype(BF16)
    want = nbdnn.matmul_backward(dc, a, b, bias=True)
    got = nbdnn.matmul_backward(dc, a, b, bias=True, backend="cuda")
    for g, w in zip(got, want):
        assert g.dtype == BF16 and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), atol=0.06,
                                   rtol=2 ** -6)
